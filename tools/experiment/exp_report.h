/* The experiment report: a directory with summary.md, results.csv and SVG
 * plots (goodput against rate, TTFT and TPOT CDFs), written from the cells
 * alone, so any runner's cells give the same report. Deterministic: the same
 * cells and meta lines give the same bytes (tests pin them). Every time is
 * in modelled seconds.
 *
 * Writers take n cells of experiment e, in the order given (the matrix's
 * configuration-major order), and return 0 or TANDEM_EIO (f in error).
 * Any thread; f is the caller's. */
#ifndef TANDEM_EXP_REPORT_H
#define TANDEM_EXP_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "exp_cell.h"
#include "exp_file.h"

/* results.csv: one header line, one line per cell in the order given. */
int exp_write_csv(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n);
/* summary.md: title, run facts (meta lines, each written as given), the
 * SLOs, the results table, goodput by rate (one column per configuration,
 * the best marked), and the machine table. */
int exp_write_markdown(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                       const char *const *meta, int n_meta);
/* goodput.svg: goodput (request throughput when no SLO is set) against the
 * rate, one polyline per configuration (exp_svg.c). */
int exp_write_svg_goodput(FILE *f, const struct exp_file *e, const struct exp_cell *cells,
                          size_t n);
/* A CDF per rate (one panel each), one line per configuration, of TTFT
 * (metric 0) or TPOT (metric 1), log x axis when the values span more than
 * a factor of 20 (exp_svg.c). */
int exp_write_svg_cdf(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                      int metric);

/* Seeds: cells of one configuration at one rate with different seed_k are
 * one group. A report whose groups all have one cell reads as before; with
 * more, summary.md shows every headline metric as "mean ± half-width" of its
 * 95% interval (exp_stats.h), marks the best configuration per rate in bold
 * unless its interval overlaps the runner-up's (both then read "tie"), adds
 * SLO attainment by rate, and the plots draw the mean with interval bars.
 * results.csv keeps one line per cell (per seed); stats.csv has one line per
 * group with the mean and half-width of each headline metric. */

/* stats.csv: config, rate, seeds, then <metric>_mean and <metric>_ci95 for
 * goodput, throughput, TTFT/TPOT p50 and p99 (ms) and SLO attainment. */
int exp_write_stats_csv(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n);
/* attainment.svg: SLO attainment against rate, the mean per configuration
 * with interval bars (exp_svg.c). */
int exp_write_svg_attainment(FILE *f, const struct exp_file *e, const struct exp_cell *cells,
                             size_t n);
/* slo_scale.svg: SLO attainment against SLO scale (every SLO multiplied by
 * s in [0.4, 2]), one panel per rate, from the cells' per-request outcomes:
 * the mean over seeds, with the interval as a band (exp_svg.c). */
int exp_write_svg_slo_scale(FILE *f, const struct exp_file *e, const struct exp_cell *cells,
                            size_t n);

/* What the goodput search (goodput_search:) found for one configuration. */
struct exp_search_row {
    int config; /* index into e->configs */
    int done;   /* searched (0: not reached) */
    int ok;     /* 0: the search failed, error says why */
    char error[256];
    struct search_rate_result r;
};

/* Writes summary.md (the plots embedded), results.csv, stats.csv,
 * goodput.svg, ttft_cdf.svg, tpot_cdf.svg, attainment.svg and slo_scale.svg
 * into dir (which exists), each through a temporary file renamed into place,
 * and a PNG beside each SVG when rsvg-convert (librsvg2-bin) is installed.
 * 0 or TANDEM_EIO (message in err). */
int exp_write_report(const char *dir, const struct exp_file *e, const struct exp_cell *cells,
                     size_t n, const char *const *meta, int n_meta, char *err, size_t errlen);
/* What the searches after the matrix found (offline), for summary.md. */
struct exp_searches {
    const struct exp_search_row *goodput; /* (n_goodput) goodput_search:, per configuration */
    int n_goodput;
    const struct search_pd_row *pd; /* (n_pd) pd_search:, best first (search_pd) */
    int n_pd;
    const char *pd_error; /* not NULL: pd_search: failed, this says why */
};

/* Same, with the searches' results (NULL: none) as sections of summary.md:
 * "Per-GPU goodput" (per configuration the rate found and the per-GPU
 * goodput, mean ± half-width over the seeds) and "P:D search" (the table
 * of search_pd_print). */
int exp_write_report_search(const char *dir, const struct exp_file *e, const struct exp_cell *cells,
                            size_t n, const char *const *meta, int n_meta,
                            const struct exp_searches *searches, char *err, size_t errlen);

/* The SLOs of the first cell that ran, as words ("TTFT <= 500 ms, TPOT <=
 * 50 ms"), into out; "" when none is set. */
void exp_slo_text(const struct exp_cell *cells, size_t n, char *out, size_t cap);

/* The progress line of a cell that is done ("[exp]   <label> @ <rate> ...":
 * counts, goodput, TTFT and TPOT p90, host busy and load; or why it did not
 * run) to f. */
void exp_print_cell(FILE *f, const struct exp_file *e, const struct exp_cell *c);

#endif
