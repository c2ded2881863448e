/* The client-side bench metrics, described once: one row of lg_metrics per
 * number the summary (summary.h) yields, saying how every writer shows it:
 * the vLLM-layout text table and the --json keys of `tandem bench`
 * (report.c), and the experiment report's results.csv and summary.md
 * (experiment/exp_report.c). Adding a metric is a field in struct lg_summary, its
 * computation in lg_summary_compute, and one row here.
 *
 * Each writer lists the rows that name it in the order of their rank for
 * that writer (lg_metric_at), within the row's section; the ranks keep the
 * orders vLLM's table and result file (and our earlier reports) have, which
 * differ. test_bench_metrics checks that no two rows share a writer's rank.
 *
 * Static data and pure functions; any thread. */
#ifndef TANDEM_LG_METRIC_H
#define TANDEM_LG_METRIC_H

#include <stddef.h>

#include "summary.h"

/* The writers. */
enum lg_out {
    LG_OUT_TEXT = 0, /* lg_report_print: the vLLM-layout table */
    LG_OUT_JSON,     /* lg_report_json: --json, --save-result, the cells JSON */
    LG_OUT_CSV,      /* exp_write_csv: results.csv */
    LG_OUT_MD,       /* exp_write_markdown: summary.md's Results table */
    LG_OUT_COUNT
};

enum lg_metric_kind {
    LG_KIND_COUNT, /* an integer: JSON integer, text "%lld" unless prec says */
    LG_KIND_REAL,  /* JSON real; NaN (undefined) is null, or a blank cell */
    LG_KIND_RATIO, /* a fraction: the text and markdown show it x 100 with % */
    LG_KIND_DIST,  /* a distribution (struct lg_dist) in ms */
};

/* Where the text table and the JSON object put a row. The text prints
 * RESULT, DIST, SLO (with --goodput) then CACHE; the JSON RESULT, DIST, its
 * run keys, CACHE, its slo object, then SLO. */
enum lg_section { LG_SEC_RESULT, LG_SEC_DIST, LG_SEC_SLO, LG_SEC_CACHE };

/* Text rank taken by the run's configured concurrency and rate, which come
 * from the report info, not the summary (vLLM prints them there). */
#define LG_TEXT_RANK_RUN 3

#define LG_MAX_STATS 4
#define LG_STAT_MEAN (-1.0) /* in lg_col.stats: the mean instead of a percentile */

/* How one writer shows a row. rank 0: the writer leaves it out. */
struct lg_col {
    int rank;
    const char *name; /* text label, CSV column, markdown header; dists: prefix */
    int prec;         /* decimals (text: -1 for an integer count) */
    /* Dists in CSV and markdown: the statistics, one column each. */
    int n_stats;
    double stats[LG_MAX_STATS];
};

struct lg_metric {
    const char *key; /* JSON key; dists: the X of mean_X_ms, --percentile-metrics */
    const char *unit;
    enum lg_metric_kind kind;
    enum lg_section section;
    int needs_slo;    /* defined only with --goodput: text omits it, JSON null */
    const char *none; /* text for NaN in the text table (NULL: "nan") */
    /* Scalars: the value (NaN when undefined). */
    double (*get)(const struct lg_summary *s);
    /* Dists: the distribution, its --percentile-metrics bit and text title. */
    const struct lg_dist *(*dist)(const struct lg_summary *s);
    unsigned mask;
    const char *title;
    struct lg_col at[LG_OUT_COUNT];
};

extern const struct lg_metric lg_metrics[];
extern const size_t lg_n_metrics;

/* results.csv's columns that come from the experiment cell, not from the
 * summary (exp_report.c's cell_cols, indexed by this enum). They sit among the
 * rows' CSV ranks at lg_csv_cell_rank[]; a row of lg_metrics must not take
 * one of these ranks (test_bench_metrics checks). */
enum lg_csv_cell {
    LG_CSV_SENT_RATE = 0,
    LG_CSV_HOST_BUSY,
    LG_CSV_CLUSTER_CPU,
    LG_CSV_RUNNER_CPU,
    LG_CSV_LOAD1_START,
    LG_CSV_LOAD1_END,
    LG_CSV_CELL_COUNT
};
extern const int lg_csv_cell_rank[LG_CSV_CELL_COUNT];

/* The row a writer shows at rank, or NULL. */
const struct lg_metric *lg_metric_at(enum lg_out out, int rank);
/* The highest rank any row has for out. */
int lg_metric_last(enum lg_out out);
/* The row with this JSON key, or NULL. */
const struct lg_metric *lg_metric_find(const char *key);

/* Statistic stat (LG_STAT_MEAN or a percentile) of distribution d of s; a
 * percentile the summary was not computed with is NaN. */
double lg_dist_stat(const struct lg_summary *s, const struct lg_dist *d, double stat);

#endif
