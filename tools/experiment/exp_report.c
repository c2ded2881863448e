/* The experiment report: results.csv, summary.md, the progress line of a
 * cell, and the report directory (exp_svg.c draws the plots). See
 * exp_report.h. */
#define _GNU_SOURCE
#include "exp_report.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "exp_util.h"
#include "plot.h"
#include "loadgen/metric.h"
#include "loadgen/report.h"
#include "tandem_err.h"

/* A live cell whose workers' steps ended later than this share of their
 * modelled time did not keep the model's time: marked not valid. */
#define EXP_OVERRUN_VALID 0.02

static void csv_field(FILE *f, const char *s)
{
    if (strpbrk(s, ",\"\n\r")) {
        fputc('"', f);
        for (const char *c = s; *c; c++) {
            if (*c == '"') {
                fputc('"', f);
            }
            fputc(*c, f);
        }
        fputc('"', f);
    } else {
        fputs(s, f);
    }
}

/* "timeout:2;http_503:1" */
static void failures_text(const struct lg_summary *s, char *out, size_t cap, const char *sep,
                          const char *kv)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < s->n_failure_kinds && n < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s%s%s%lld", i ? sep : "", s->failures[i].key, kv,
                         (long long)s->failures[i].count);
        if (w < 0) {
            break;
        }
        n += (size_t)w;
    }
}

/* results.csv's columns that come from the cell, not from the summary, at
 * their ranks lg_csv_cell_rank[] among the CSV ranks of lg_metrics
 * (loadgen/metric.h, where a new one takes its enum value and rank). */
struct exp_csv_col {
    const char *name;
    int prec;
    double (*get)(const struct exp_cell *c);
};

static double cell_sent_rate(const struct exp_cell *c)
{
    return c->sent_rate;
}

static double cell_host_busy(const struct exp_cell *c)
{
    return c->host.host_busy;
}

static double cell_cluster_cpu(const struct exp_cell *c)
{
    return c->host.wall_s > 0 ? c->host.cluster_cpu_s / c->host.wall_s : NAN;
}

static double cell_runner_cpu(const struct exp_cell *c)
{
    return c->host.wall_s > 0 ? c->host.loadgen_cpu_s / c->host.wall_s : NAN;
}

static double cell_load1_start(const struct exp_cell *c)
{
    return c->host.load1_start;
}

static double cell_load1_end(const struct exp_cell *c)
{
    return c->host.load1_end;
}

static const struct exp_csv_col cell_cols[LG_CSV_CELL_COUNT] = {
    [LG_CSV_SENT_RATE] = {.name = "sent_rate", .prec = 4, .get = cell_sent_rate},
    [LG_CSV_HOST_BUSY] = {.name = "host_busy", .prec = 3, .get = cell_host_busy},
    [LG_CSV_CLUSTER_CPU] = {.name = "cluster_cpu_cores", .prec = 3, .get = cell_cluster_cpu},
    [LG_CSV_RUNNER_CPU] = {.name = "runner_cpu_cores", .prec = 3, .get = cell_runner_cpu},
    [LG_CSV_LOAD1_START] = {.name = "load1_start", .prec = 2, .get = cell_load1_start},
    [LG_CSV_LOAD1_END] = {.name = "load1_end", .prec = 2, .get = cell_load1_end},
};

static const struct exp_csv_col *cell_col_at(int rank)
{
    for (size_t i = 0; i < LG_CSV_CELL_COUNT; i++) {
        if (lg_csv_cell_rank[i] == rank) {
            return &cell_cols[i];
        }
    }
    return NULL;
}

static int csv_last_rank(void)
{
    int last = lg_metric_last(LG_OUT_CSV);
    for (size_t i = 0; i < LG_CSV_CELL_COUNT; i++) {
        last = lg_csv_cell_rank[i] > last ? lg_csv_cell_rank[i] : last;
    }
    return last;
}

/* "ttft_p50_ms", "ttft_mean_ms" */
static void stat_name(char *out, size_t cap, const char *prefix, double stat, const char *pre,
                      const char *post)
{
    char w[32];
    if (stat == LG_STAT_MEAN) {
        snprintf(w, sizeof(w), "mean");
    } else {
        w[0] = 'p';
        lg_percentile_word(stat, w + 1, sizeof(w) - 1);
    }
    snprintf(out, cap, "%s%s%s%s", prefix, pre, w, post);
}

/* The header names of the columns at CSV rank r (with their leading commas)
 * into f; returns how many. */
static int csv_names(FILE *f, int r)
{
    const struct lg_metric *m = lg_metric_at(LG_OUT_CSV, r);
    const struct exp_csv_col *cc = cell_col_at(r);
    if (cc != NULL) {
        fprintf(f, ",%s", cc->name);
        return 1;
    }
    if (m == NULL) {
        return 0;
    }
    const struct lg_col *c = &m->at[LG_OUT_CSV];
    if (m->kind != LG_KIND_DIST) {
        fprintf(f, ",%s", c->name);
        return 1;
    }
    for (int k = 0; k < c->n_stats; k++) {
        char name[64];
        stat_name(name, sizeof(name), c->name, c->stats[k], "_", "_ms");
        fprintf(f, ",%s", name);
    }
    return c->n_stats;
}

/* The values of the columns at CSV rank r of cell c, each after a comma. */
static void csv_values(FILE *f, const struct exp_cell *c, int r)
{
    const struct lg_metric *m = lg_metric_at(LG_OUT_CSV, r);
    const struct exp_csv_col *cc = cell_col_at(r);
    const struct lg_summary *s = &c->s;
    char b[64];
    if (cc != NULL) {
        fprintf(f, ",%s", exp_fmt(b, sizeof(b), cc->get(c), cc->prec, ""));
    } else if (m != NULL && m->kind == LG_KIND_COUNT) {
        fprintf(f, ",%lld", (long long)m->get(s));
    } else if (m != NULL && m->kind != LG_KIND_DIST) {
        fprintf(f, ",%s", exp_fmt(b, sizeof(b), m->get(s), m->at[LG_OUT_CSV].prec, ""));
    } else if (m != NULL) {
        const struct lg_col *col = &m->at[LG_OUT_CSV];
        for (int k = 0; k < col->n_stats; k++) {
            double v = lg_dist_stat(s, m->dist(s), col->stats[k]);
            fprintf(f, ",%s", exp_fmt(b, sizeof(b), v, col->prec, ""));
        }
    }
}

int exp_write_csv(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n)
{
    int last = csv_last_rank(), n_cols = 1; /* failures */
    fputs("config,cluster,routing,set,rate,seed,time_scale,status", f);
    for (int r = 1; r <= last; r++) {
        n_cols += csv_names(f, r);
    }
    fputs(",failures", f);
    for (int k = 0; k < e->n_extra_slos; k++) {
        fprintf(f, ",goodput_slo%d", k + 2);
    }
    fputc('\n', f);
    for (size_t i = 0; i < n; i++) {
        const struct exp_cell *c = &cells[i];
        const struct exp_config *cfg = &e->configs[c->config];
        const struct lg_summary *s = &c->s;
        char rw[32], set[256] = "", b[64];
        exp_rate_word(e->rates[c->rate], rw, sizeof(rw));
        if (cfg->set_key) {
            snprintf(set, sizeof(set), "%s=%s", cfg->set_key, cfg->set_value);
        }
        csv_field(f, cfg->label);
        fputc(',', f);
        csv_field(f, exp_base_name(cfg->cluster_path));
        fputc(',', f);
        csv_field(f, cfg->routing_path ? exp_base_name(cfg->routing_path) : "");
        fputc(',', f);
        csv_field(f, set);
        fprintf(f, ",%s,%llu,%g,", rw, (unsigned long long)c->seed, c->time_scale);
        if (!c->ok) {
            char st[300];
            exp_sfmt(st, sizeof(st), "not run: %s", c->error);
            csv_field(f, st);
            for (int k = 0; k < n_cols + e->n_extra_slos; k++) {
                fputc(',', f);
            }
            fputc('\n', f);
            continue;
        }
        fputs("ok", f);
        for (int r = 1; r <= last; r++) {
            csv_values(f, c, r);
        }
        fputc(',', f);
        char fl[512];
        failures_text(s, fl, sizeof(fl), ";", ":");
        csv_field(f, fl);
        for (int k = 0; k < e->n_extra_slos; k++) {
            fprintf(f, ",%s", exp_fmt(b, sizeof(b), c->extra_goodput[k], 4, ""));
        }
        fputc('\n', f);
    }
    return ferror(f) ? TANDEM_EIO : 0;
}

/* stats.csv's metrics: mean and 95% half-width over a group's seeds. */
struct stats_col {
    const char *name;
    int prec;
    double (*get)(const struct exp_cell *c, const void *arg);
    double pct; /* the percentile of a distribution getter */
};

static double st_goodput(const struct exp_cell *c, const void *arg)
{
    (void)arg;
    return c->s.request_goodput;
}

static double st_throughput(const struct exp_cell *c, const void *arg)
{
    (void)arg;
    return c->s.request_throughput;
}

static double st_attainment(const struct exp_cell *c, const void *arg)
{
    (void)arg;
    return c->s.slo_attainment;
}

static double st_ttft(const struct exp_cell *c, const void *arg)
{
    return lg_dist_stat(&c->s, &c->s.ttft, *(const double *)arg);
}

static double st_tpot(const struct exp_cell *c, const void *arg)
{
    return lg_dist_stat(&c->s, &c->s.tpot, *(const double *)arg);
}

static const struct stats_col stats_cols[] = {
    {"request_goodput", 4, st_goodput, 0},   {"request_throughput", 4, st_throughput, 0},
    {"ttft_p50_ms", 3, st_ttft, 50},         {"ttft_p99_ms", 3, st_ttft, 99},
    {"tpot_p50_ms", 3, st_tpot, 50},         {"tpot_p99_ms", 3, st_tpot, 99},
    {"slo_attainment", 4, st_attainment, 0},
};

int exp_write_stats_csv(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n)
{
    size_t nc = sizeof(stats_cols) / sizeof(stats_cols[0]);
    fputs("config,rate,seeds", f);
    for (size_t k = 0; k < nc; k++) {
        fprintf(f, ",%s_mean,%s_ci95", stats_cols[k].name, stats_cols[k].name);
    }
    fputc('\n', f);
    for (size_t i = 0; i < n; i++) {
        const struct exp_cell *c = &cells[i];
        if (exp_cell_find(cells, n, c->config, c->rate) != c) {
            continue; /* not the first of its group */
        }
        const struct exp_cell *g[EXP_MAX_SEEDS];
        int ng = exp_cells_group(cells, n, c->config, c->rate, g, EXP_MAX_SEEDS);
        char rw[32], b1[64], b2[64];
        exp_rate_word(e->rates[c->rate], rw, sizeof(rw));
        csv_field(f, e->configs[c->config].label);
        fprintf(f, ",%s,%d", rw, ng);
        for (size_t k = 0; k < nc; k++) {
            struct exp_ci v = exp_group_ci(g, ng, stats_cols[k].get, &stats_cols[k].pct);
            fprintf(f, ",%s,%s", exp_fmt(b1, sizeof(b1), v.mean, stats_cols[k].prec, ""),
                    exp_fmt(b2, sizeof(b2), v.half, stats_cols[k].prec, ""));
        }
        fputc('\n', f);
    }
    return ferror(f) ? TANDEM_EIO : 0;
}

/* Markdown cell text: '|' would end the cell. */
static void md_text(FILE *f, const char *s)
{
    for (const char *c = s; *c; c++) {
        if (*c == '|') {
            fputs("\\|", f);
        } else if (*c == '\n') {
            fputc(' ', f);
        } else {
            fputc(*c, f);
        }
    }
}

/* "TTFT <= 500 ms, TPOT <= 50 ms" */
static void slo_words(const struct lg_slo *slo, char *out, size_t cap)
{
    size_t len = 0;
    const char *names[] = {"TTFT", "TPOT", "E2EL"};
    double v[] = {slo->ttft_ms, slo->tpot_ms, slo->e2el_ms};
    out[0] = '\0';
    for (int i = 0; i < 3; i++) {
        if (v[i] >= 0 && len < cap) {
            int w =
                snprintf(out + len, cap - len, "%s%s <= %g ms", len ? ", " : "", names[i], v[i]);
            len += w > 0 ? (size_t)w : 0;
        }
    }
}

void exp_slo_text(const struct exp_cell *cells, size_t n, char *out, size_t cap)
{
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (cells[i].ok) {
            slo_words(&cells[i].s.slo, out, cap);
            return;
        }
    }
}

/* What a pivot shows of a cell: goodput under the main SLOs (throughput
 * without SLOs), under extra SLO set k >= 0, or SLO attainment. */
#define PIVOT_MAIN   (-1)
#define PIVOT_ATTAIN (-2)

static double pivot_get(const struct exp_cell *c, const void *arg)
{
    int k = *(const int *)arg;
    return k == PIVOT_ATTAIN ? c->s.slo_attainment * 100.0
           : k < 0           ? exp_goodput_or_throughput(&c->s)
                             : c->extra_goodput[k];
}

/* Whether some configuration ran more than one seed at some rate. */
static int report_multi(const struct exp_cell *cells, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (cells[i].ok && cells[i].seed_k > 0) {
            return 1;
        }
    }
    return 0;
}

/* The group's mean and interval of get; NaN mean when nothing ran. */
static struct exp_ci group_ci(const struct exp_cell *cells, size_t n, int ci, int ri,
                              double (*get)(const struct exp_cell *c, const void *arg),
                              const void *arg)
{
    const struct exp_cell *g[EXP_MAX_SEEDS];
    int ng = exp_cells_group(cells, n, ci, ri, g, EXP_MAX_SEEDS);
    return exp_group_ci(g, ng, get, arg);
}

/* "1.50 ± 0.02" (prec decimals), "1.50" without an interval, none when
 * there is no mean. */
static const char *ci_text(char *buf, size_t cap, const struct exp_ci *v, int prec,
                           const char *none)
{
    if (!isfinite(v->mean)) {
        snprintf(buf, cap, "%s", none);
    } else if (isfinite(v->half)) {
        snprintf(buf, cap, "%.*f ± %.*f", prec, v->mean, prec, v->half);
    } else {
        snprintf(buf, cap, "%.*f", prec, v->mean);
    }
    return buf;
}

/* One row per rate, one column per configuration: goodput under the main
 * SLOs (k = PIVOT_MAIN; throughput without SLOs), under extra SLO set k, or
 * SLO attainment (PIVOT_ATTAIN, in %), and the best configuration with its
 * margin over the second. With seeds (multi), each value is mean ±
 * half-width, the best is bold, and when its interval overlaps the
 * runner-up's both read "(tie)". */
static void pivot(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n, int k,
                  int multi)
{
    char b1[96], b2[128];
    int prec = k == PIVOT_ATTAIN ? 1 : 2;
    fprintf(f, "| rate |");
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (exp_cells_have_config(cells, n, ci)) {
            fprintf(f, " %s |", e->configs[ci].label);
        }
    }
    fprintf(f, " best |\n|---:|");
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (exp_cells_have_config(cells, n, ci)) {
            fprintf(f, "---:|");
        }
    }
    fprintf(f, "---|\n");
    for (int ri = 0; ri < e->n_rates; ri++) {
        if (!exp_cells_have_rate(cells, n, ri)) {
            continue;
        }
        char rw[32];
        exp_rate_word(e->rates[ri], rw, sizeof(rw));
        fprintf(f, "| %s |", rw);
        int best = -1, second = -1;
        double bv = -1, sv = -1;
        struct exp_ci v[EXP_MAX_CONFIGS];
        for (int ci = 0; ci < e->n_configs; ci++) {
            v[ci] = group_ci(cells, n, ci, ri, pivot_get, &k);
            double x = v[ci].mean;
            if (!exp_cells_have_config(cells, n, ci) || !isfinite(x)) {
                continue;
            }
            if (x > bv) {
                second = best;
                sv = bv;
                best = ci;
                bv = x;
            } else if (x > sv) {
                second = ci;
                sv = x;
            }
        }
        int tie = multi && second >= 0 && exp_ci_overlap(&v[best], &v[second]);
        for (int ci = 0; ci < e->n_configs; ci++) {
            if (!exp_cells_have_config(cells, n, ci)) {
                continue;
            }
            if (!multi) {
                fprintf(f, " %s |", exp_fmt(b1, sizeof(b1), v[ci].mean, prec, "-"));
                continue;
            }
            ci_text(b1, sizeof(b1), &v[ci], prec, "-");
            if (tie && (ci == best || ci == second)) {
                snprintf(b2, sizeof(b2), "%s (tie)", b1);
            } else if (ci == best && second >= 0) {
                snprintf(b2, sizeof(b2), "**%s**", b1);
            } else {
                snprintf(b2, sizeof(b2), "%s", b1);
            }
            fprintf(f, " %s |", b2);
        }
        if (best < 0) {
            fprintf(f, " - |\n");
        } else if (second < 0) {
            fprintf(f, " %s |\n", e->configs[best].label);
        } else if (tie) {
            fprintf(f, " tie: %s, %s (intervals overlap) |\n", e->configs[best].label,
                    e->configs[second].label);
        } else if (multi && sv > 0 && (bv / sv - 1.0) * 100.0 < 0.05) {
            fprintf(f, " %s (+<0.1%% over %s) |\n", e->configs[best].label,
                    e->configs[second].label);
        } else if (bv == sv || (sv > 0 && (bv / sv - 1.0) * 100.0 < 0.05)) {
            fprintf(f, " tie |\n"); /* what "+0.0%" would say */
        } else if (sv > 0) {
            fprintf(f, " %s (+%.1f%% over %s) |\n", e->configs[best].label, (bv / sv - 1.0) * 100.0,
                    e->configs[second].label);
        } else {
            fprintf(f, " %s (others 0) |\n", e->configs[best].label);
        }
    }
}

static int max_ncpu(const struct exp_cell *cells, size_t n)
{
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        m = cells[i].host.ncpu > m ? cells[i].host.ncpu : m;
    }
    return m;
}

/* The Results table's metric headers, in lg_metrics' markdown order, each
 * " name |"; returns how many columns. */
static int md_names(FILE *f)
{
    int last = lg_metric_last(LG_OUT_MD), cols = 0;
    for (int r = 1; r <= last; r++) {
        const struct lg_metric *m = lg_metric_at(LG_OUT_MD, r);
        const struct lg_col *c = m ? &m->at[LG_OUT_MD] : NULL;
        if (c == NULL) {
            continue;
        }
        if (m->kind != LG_KIND_DIST) {
            fprintf(f, " %s |", c->name);
            cols++;
            continue;
        }
        for (int k = 0; k < c->n_stats; k++) {
            char name[64];
            stat_name(name, sizeof(name), c->name, c->stats[k], " ", "");
            fprintf(f, " %s |", name);
            cols++;
        }
    }
    return cols;
}

/* One value of the Results table ("v | "): a ratio in percent, "-" (a
 * ratio: its text) when undefined. */
static void md_value(FILE *f, const struct lg_metric *m, double v, int prec)
{
    char b[64];
    if (m->kind == LG_KIND_RATIO && isfinite(v)) {
        fprintf(f, "%.*f%% | ", prec, v * 100.0);
    } else if (m->kind == LG_KIND_RATIO && m->none != NULL) {
        fprintf(f, "%s | ", m->none);
    } else {
        fprintf(f, "%s | ", exp_fmt(b, sizeof(b), v, prec, "-"));
    }
}

static void md_values(FILE *f, const struct lg_summary *s)
{
    int last = lg_metric_last(LG_OUT_MD);
    for (int r = 1; r <= last; r++) {
        const struct lg_metric *m = lg_metric_at(LG_OUT_MD, r);
        const struct lg_col *c = m ? &m->at[LG_OUT_MD] : NULL;
        if (c == NULL) {
            continue;
        }
        if (m->kind != LG_KIND_DIST) {
            md_value(f, m, m->get(s), c->prec);
            continue;
        }
        for (int k = 0; k < c->n_stats; k++) {
            md_value(f, m, lg_dist_stat(s, m->dist(s), c->stats[k]), c->prec);
        }
    }
}

/* The value of the Results table's column (metric m, stat k) of one cell. */
struct md_col {
    const struct lg_metric *m;
    double stat; /* LG_STAT_MEAN, a percentile, or NAN: not a distribution */
};

static double md_col_get(const struct exp_cell *c, const void *arg)
{
    const struct md_col *col = arg;
    return isnan(col->stat) ? col->m->get(&c->s)
                            : lg_dist_stat(&c->s, col->m->dist(&c->s), col->stat);
}

/* One value of the Results table over seeds: "mean ± half | ". */
static void md_ci_value(FILE *f, const struct lg_metric *m, const struct exp_ci *v, int prec)
{
    char b[96];
    if (m->kind == LG_KIND_RATIO && isfinite(v->mean)) {
        struct exp_ci pct = {.mean = v->mean * 100.0, .half = v->half * 100.0, .n = v->n};
        fprintf(f, "%s%% | ", ci_text(b, sizeof(b), &pct, prec, "-"));
    } else if (m->kind == LG_KIND_RATIO && m->none != NULL) {
        fprintf(f, "%s | ", m->none);
    } else {
        fprintf(f, "%s | ", ci_text(b, sizeof(b), v, prec, "-"));
    }
}

/* The Results table's values of a group of seeds (mean ± half-width). */
static void md_values_group(FILE *f, const struct exp_cell *const *g, int ng)
{
    int last = lg_metric_last(LG_OUT_MD);
    for (int r = 1; r <= last; r++) {
        const struct lg_metric *m = lg_metric_at(LG_OUT_MD, r);
        const struct lg_col *c = m ? &m->at[LG_OUT_MD] : NULL;
        if (c == NULL) {
            continue;
        }
        int n_stats = m->kind == LG_KIND_DIST ? c->n_stats : 1;
        for (int k = 0; k < n_stats; k++) {
            struct md_col col = {.m = m, .stat = m->kind == LG_KIND_DIST ? c->stats[k] : NAN};
            struct exp_ci v = exp_group_ci(g, ng, md_col_get, &col);
            md_ci_value(f, m, &v, c->prec);
        }
    }
}

/* The Results rows with seeds: one per configuration and rate, in the
 * cells' order, each value mean ± half-width; failures summed. */
static void md_rows_multi(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                          int md_cols)
{
    for (size_t i = 0; i < n; i++) {
        const struct exp_cell *c = &cells[i];
        if (exp_cell_find(cells, n, c->config, c->rate) != c) {
            continue; /* not the first of its group */
        }
        const struct exp_cell *g[EXP_MAX_SEEDS];
        int ng = exp_cells_group(cells, n, c->config, c->rate, g, EXP_MAX_SEEDS);
        char rw[32];
        exp_rate_word(e->rates[c->rate], rw, sizeof(rw));
        fprintf(f, "| %s | %s | ", e->configs[c->config].label, rw);
        if (ng == 0) {
            for (int k = 0; k < md_cols; k++) {
                fprintf(f, "- | ");
            }
            fprintf(f, "not run: ");
            md_text(f, c->error);
            fprintf(f, " |\n");
            continue;
        }
        md_values_group(f, g, ng);
        long long failed = 0;
        for (int k = 0; k < ng; k++) {
            failed += (long long)g[k]->s.failed;
        }
        fprintf(f, "%lld over %d seeds |\n", failed, ng);
    }
}

/* The goodput search's section. */
static void md_search(FILE *f, const struct exp_file *e, const struct exp_search_row *rows, int n)
{
    const struct search_rate_opts *o = &e->goodput_search;
    fprintf(f,
            "\n## Per-GPU goodput (goodput search)\n\nDistServe's metric: the highest rate at "
            "which at least %g%% of the requests meet every SLO, divided by the cluster's GPUs; "
            "searched per seed between %g and %g req/s to %g req/s (the rate found is the last "
            "one seen to pass), mean ± half-width of the 95%% interval over the seeds.\n\n"
            "| config | GPUs | rate (req/s) | per-GPU goodput (req/s/GPU) | probes | |\n"
            "|---|---:|---:|---:|---:|---|\n",
            o->attainment * 100.0, o->min_rate, o->max_rate, o->resolution);
    for (int i = 0; i < n; i++) {
        const struct exp_search_row *r = &rows[i];
        if (!r->done) {
            continue;
        }
        fprintf(f, "| %s | ", e->configs[r->config].label);
        if (!r->ok) {
            fprintf(f, "- | - | - | - | failed: ");
            md_text(f, r->error);
            fprintf(f, " |\n");
            continue;
        }
        char b1[96], b2[96];
        fprintf(f, "%d | %s | %s | %d | ", r->r.gpus, ci_text(b1, sizeof(b1), &r->r.ci, 2, "-"),
                ci_text(b2, sizeof(b2), &r->r.per_gpu, 3, "-"), r->r.probes);
        if (r->r.below_min) {
            fprintf(f, "%d of %d seeds miss even at min_rate%s", r->r.below_min, r->r.n,
                    r->r.at_max ? "; " : "");
        }
        if (r->r.at_max) {
            fprintf(f, "%d of %d seeds still pass at max_rate", r->r.at_max, r->r.n);
        }
        fprintf(f, " |\n");
    }
}

/* The P:D search's section. */
static void md_pd_search(FILE *f, const struct exp_file *e, const struct exp_searches *s)
{
    const struct search_pd_opts *o = &e->pd_search;
    const struct search_rate_opts *r = &e->goodput_search;
    fprintf(f,
            "\n## P:D search\n\nEvery split of %d GPUs into prefill and decode instances of "
            "%s's pools",
            o->gpus, e->configs[e->pd_search_config].label);
    if (e->pd_search_colocated >= 0) {
        fprintf(f, ", and colocated instances of %s's pool as the baseline",
                e->configs[e->pd_search_colocated].label);
    }
    fprintf(f,
            ", each given the goodput search (at least %g%% of the requests inside every SLO, "
            "%g..%g req/s to %g, %d seeds); per-GPU goodput as mean ± half-width of the 95%% "
            "interval, best first.\n\n",
            r->attainment * 100.0, r->min_rate, r->max_rate, r->resolution, exp_seeds(e));
    if (s->pd_error) {
        fprintf(f, "The search failed: ");
        md_text(f, s->pd_error);
        fprintf(f, "\n");
        return;
    }
    search_pd_print(f, s->pd, s->n_pd, o);
}

/* The plots, embedded so that the report reads as a page (PNG copies are
 * beside them when rsvg-convert is installed), and the per-cell files. */
static void md_plots(FILE *f, int attainment)
{
    fprintf(f, "\n## Plots\n\n![goodput against rate](goodput.svg)\n\n"
               "![TTFT CDF per rate](ttft_cdf.svg)\n\n![TPOT CDF per rate](tpot_cdf.svg)\n");
    if (attainment) {
        fprintf(f, "\n![SLO attainment against rate](attainment.svg)\n\n"
                   "![SLO attainment against SLO scale](slo_scale.svg)\n");
    }
    fprintf(f, "\nPer cell: cells/*.json (vLLM's keys), requests/*.csv.\n");
}

static int markdown(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                    const char *const *meta, int n_meta, const struct exp_searches *searches);

int exp_write_markdown(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                       const char *const *meta, int n_meta)
{
    return markdown(f, e, cells, n, meta, n_meta, NULL);
}

static int markdown(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                    const char *const *meta, int n_meta, const struct exp_searches *searches)
{
    int multi = report_multi(cells, n);
    char b1[64], b2[64], slo[160];
    exp_slo_text(cells, n, slo, sizeof(slo));
    int has_slo = slo[0] != '\0';
    fprintf(f, "# Experiment %s\n\n", e->name);
    if (e->description) {
        fprintf(f, "%s\n\n", e->description);
    }
    for (int i = 0; i < n_meta; i++) {
        fprintf(f, "- %s\n", meta[i]);
    }
    int measured = !e->offline; /* offline: nothing of the host was measured */
    if (measured) {
        fprintf(f, "- Times are modelled: wall seconds divided by the cluster's time_scale (1 for "
                   "tiny clusters).\n");
    } else {
        fprintf(f, "- Times are modelled seconds of the simulation.\n");
    }
    if (has_slo) {
        fprintf(f,
                "- SLOs: %s. Goodput = completed requests meeting every SLO / duration "
                "(req/s).\n",
                slo);
    } else {
        fprintf(f, "- No SLOs given: the goodput columns show the request throughput.\n");
    }
    fprintf(f, "- Restart: %s.\n",
            e->restart == EXP_RESTART_PER_RATE
                ? "a fresh cluster per cell, the same seed at every rate"
                : "one cluster per configuration; rate i uses seed + i, so no prompt is "
                  "repeated on a cluster");
    if (multi) {
        fprintf(f,
                "- Seeds: each cell ran with %d seeds (seed k = the cell's seed + 1000 k); values "
                "are mean ± half-width of the 95%% confidence interval (Student t, n - 1 degrees "
                "of freedom). The best configuration per rate is bold; when its interval overlaps "
                "the runner-up's, both read \"(tie)\". Per seed: results.csv; per cell: "
                "stats.csv.\n",
                exp_seeds(e));
    }
    fprintf(f, "- Workload (tandem bench flags):");
    for (int i = 0; i < e->bench_argc; i++) {
        fprintf(f, " `%s`", e->bench_argv[i]);
    }
    fprintf(f, "%s\n\n", e->bench_argc ? "" : " (defaults)");

    fprintf(f, "## Configurations\n\n| config | cluster | routing | set | time scale |\n"
               "|---|---|---|---|---:|\n");
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (!exp_cells_have_config(cells, n, ci)) {
            continue;
        }
        const struct exp_config *cfg = &e->configs[ci];
        double ts = NAN;
        for (size_t i = 0; i < n; i++) {
            if (cells[i].config == ci) {
                ts = cells[i].time_scale;
                break;
            }
        }
        fprintf(f, "| %s | %s | %s | ", cfg->label, exp_base_name(cfg->cluster_path),
                cfg->routing_path ? exp_base_name(cfg->routing_path) : "(the cluster's)");
        if (cfg->set_key) {
            fprintf(f, "%s = %s", cfg->set_key, cfg->set_value);
        }
        fprintf(f, " | %g |\n", ts);
    }

    fprintf(f, "\n## Results\n\nRates, goodput and throughput in requests per second; "
               "latencies in ms (p50 / p90 / p99).\n\n"
               "| config | rate |");
    int md_cols = md_names(f);
    fprintf(f, " failures |\n|---|---:|");
    for (int k = 0; k < md_cols; k++) {
        fprintf(f, "---:|");
    }
    fprintf(f, "---|\n");
    if (multi) {
        md_rows_multi(f, e, cells, n, md_cols);
    }
    for (size_t i = 0; i < n && !multi; i++) {
        const struct exp_cell *c = &cells[i];
        const struct lg_summary *s = &c->s;
        char rw[32];
        exp_rate_word(e->rates[c->rate], rw, sizeof(rw));
        fprintf(f, "| %s | %s | ", e->configs[c->config].label, rw);
        if (!c->ok) {
            for (int k = 0; k < md_cols; k++) {
                fprintf(f, "- | ");
            }
            fprintf(f, "not run: ");
            md_text(f, c->error);
            fprintf(f, " |\n");
            continue;
        }
        md_values(f, s);
        char fl[512];
        failures_text(s, fl, sizeof(fl), ", ", " ");
        if (s->failed > 0) {
            fprintf(f, "%lld (", (long long)s->failed);
            md_text(f, fl);
            fprintf(f, ") |\n");
        } else {
            fprintf(f, "0 |\n");
        }
    }

    fprintf(f, "\n## %s by rate\n\n", has_slo ? "Goodput" : "Throughput");
    pivot(f, e, cells, n, PIVOT_MAIN, multi);
    if (multi && has_slo) {
        fprintf(f, "\n## SLO attainment by rate\n\nShare of requests (%%) meeting every SLO "
                   "(failed requests miss). Plots: attainment.svg (against rate), slo_scale.svg "
                   "(against SLO scale).\n\n");
        pivot(f, e, cells, n, PIVOT_ATTAIN, multi);
    }
    for (int k = 0; k < e->n_extra_slos; k++) {
        char t[160];
        slo_words(&e->extra_slos[k], t, sizeof(t));
        fprintf(f,
                "\n## Goodput by rate, %s\n\nThe same requests under another SLO set "
                "(extra_slos).\n\n",
                t);
        pivot(f, e, cells, n, k, multi);
    }
    if (searches != NULL && searches->n_goodput > 0) {
        md_search(f, e, searches->goodput, searches->n_goodput);
    }
    if (searches != NULL && (searches->n_pd > 0 || searches->pd_error)) {
        md_pd_search(f, e, searches);
    }

    if (!measured) {
        md_plots(f, multi && has_slo);
        return ferror(f) ? TANDEM_EIO : 0;
    }
    fprintf(f,
            "\n## Machine\n\nSent rate = measured requests / time of the last send "
            "(modelled req/s): below the rate means the load generator fell behind. Client "
            "lag = send time - scheduled arrival. CPU in cores (wall), over the measured run; "
            "host busy = share of the machine's CPUs busy (%d CPUs), whatever runs on "
            "them.\n\n"
            "| config | rate | sent rate | client lag p99 (ms) | cluster CPU | runner CPU | "
            "host busy | load1 start / end | step overrun | valid |\n"
            "|---|---:|---:|---:|---:|---:|---:|---|---:|---|\n",
            max_ncpu(cells, n));
    for (size_t i = 0; i < n; i++) {
        const struct exp_cell *c = &cells[i];
        char rw[32];
        exp_rate_word(e->rates[c->rate], rw, sizeof(rw));
        fprintf(f, "| %s | %s | ", e->configs[c->config].label, rw);
        if (!c->ok) {
            fprintf(f, "- | - | - | - | - | - | - | - |\n");
            continue;
        }
        const struct exp_host *h = &c->host;
        fprintf(f, "%s | %s | ", exp_fmt(b1, sizeof(b1), c->sent_rate, 2, "-"),
                exp_fmt(b2, sizeof(b2), lg_dist_stat(&c->s, &c->s.queue, 99), 1, "-"));
        fprintf(
            f, "%s | %s | ",
            exp_fmt(b1, sizeof(b1), h->wall_s > 0 ? h->cluster_cpu_s / h->wall_s : NAN, 2, "-"),
            exp_fmt(b2, sizeof(b2), h->wall_s > 0 ? h->loadgen_cpu_s / h->wall_s : NAN, 2, "-"));
        if (isfinite(h->host_busy)) {
            fprintf(f, "%.0f%% | ", h->host_busy * 100.0);
        } else {
            fprintf(f, "- | ");
        }
        fprintf(f, "%s / %s | ", exp_fmt(b1, sizeof(b1), h->load1_start, 2, "-"),
                exp_fmt(b2, sizeof(b2), h->load1_end, 2, "-"));
        if (isfinite(h->step_overrun)) {
            fprintf(f, "%.1f%% | %s |\n", h->step_overrun * 100.0,
                    h->step_overrun > EXP_OVERRUN_VALID ? "no" : "yes");
        } else {
            fprintf(f, "- | - |\n");
        }
    }
    fprintf(f,
            "\nStep overrun = how late the workers' sim steps ended, over the cell, as a share of "
            "their modelled time (tandem:step_overrun_seconds / tandem:step_modelled_seconds). "
            "Above %g%% the host did not keep the model's time, so the cell's latencies measure "
            "the host as much as the model: valid = no, do not compare them. \"-\": no timed "
            "steps (tiny workers, time_scale 0) or not measured.\n",
            EXP_OVERRUN_VALID * 100.0);
    md_plots(f, multi && has_slo);
    return ferror(f) ? TANDEM_EIO : 0;
}

void exp_print_cell(FILE *f, const struct exp_file *e, const struct exp_cell *c)
{
    char rw[32], b1[32], b2[32], b3[32], lab[EXP_LABEL_MAX + 16];
    exp_rate_word(e->rates[c->rate], rw, sizeof(rw));
    exp_sfmt(lab, sizeof(lab), "%s", e->configs[c->config].label);
    if (c->seed_k > 0) {
        exp_sfmt(lab, sizeof(lab), "%s (seed %d)", e->configs[c->config].label, c->seed_k);
    }
    if (!c->ok) {
        fprintf(f, "[exp]   %s @ %s: not run: %s\n", lab, rw, c->error);
        return;
    }
    const struct lg_summary *s = &c->s;
    fprintf(f,
            "[exp]   %s @ %s req/s: %lld ok, %lld failed, %s %s req/s, TTFT p90 %s ms, TPOT "
            "p90 %s ms",
            lab, rw, (long long)s->completed, (long long)s->failed,
            s->has_goodput ? "goodput" : "throughput",
            exp_fmt(b1, sizeof(b1), exp_goodput_or_throughput(s), 2, "-"),
            exp_fmt(b2, sizeof(b2), lg_dist_stat(s, &s->ttft, 90), 1, "-"),
            exp_fmt(b3, sizeof(b3), lg_dist_stat(s, &s->tpot, 90), 1, "-"));
    if (isfinite(c->host.host_busy)) { /* not measured offline */
        fprintf(f, ", host busy %.0f%%, load %.2f", c->host.host_busy * 100, c->host.load1_end);
    }
    if (isfinite(c->host.step_overrun)) {
        fprintf(f, ", step overrun %.1f%%", c->host.step_overrun * 100);
    }
    fprintf(f, "\n");
}

/* ------------------------------------------------------------------ */
/* The report directory                                                */
/* ------------------------------------------------------------------ */

/* What every writer of the report directory gets. */
struct report_in {
    const struct exp_file *e;
    const struct exp_cell *cells;
    size_t n;
    const char *const *meta;
    int n_meta;
    const struct exp_searches *searches;
};

typedef int (*writer_fn)(FILE *f, const struct report_in *in, int arg);

static int w_csv(FILE *f, const struct report_in *in, int arg)
{
    (void)arg;
    return exp_write_csv(f, in->e, in->cells, in->n);
}

static int w_stats(FILE *f, const struct report_in *in, int arg)
{
    (void)arg;
    return exp_write_stats_csv(f, in->e, in->cells, in->n);
}

static int w_md(FILE *f, const struct report_in *in, int arg)
{
    (void)arg;
    return markdown(f, in->e, in->cells, in->n, in->meta, in->n_meta, in->searches);
}

static int w_goodput(FILE *f, const struct report_in *in, int arg)
{
    (void)arg;
    return exp_write_svg_goodput(f, in->e, in->cells, in->n);
}

static int w_cdf(FILE *f, const struct report_in *in, int arg)
{
    return exp_write_svg_cdf(f, in->e, in->cells, in->n, arg);
}

static int w_attainment(FILE *f, const struct report_in *in, int arg)
{
    (void)arg;
    return exp_write_svg_attainment(f, in->e, in->cells, in->n);
}

static int w_slo_scale(FILE *f, const struct report_in *in, int arg)
{
    (void)arg;
    return exp_write_svg_slo_scale(f, in->e, in->cells, in->n);
}

int exp_write_report(const char *dir, const struct exp_file *e, const struct exp_cell *cells,
                     size_t n, const char *const *meta, int n_meta, char *err, size_t errlen)
{
    return exp_write_report_search(dir, e, cells, n, meta, n_meta, NULL, err, errlen);
}

int exp_write_report_search(const char *dir, const struct exp_file *e, const struct exp_cell *cells,
                            size_t n, const char *const *meta, int n_meta,
                            const struct exp_searches *searches, char *err, size_t errlen)
{
    const struct report_in in = {
        .e = e, .cells = cells, .n = n, .meta = meta, .n_meta = n_meta, .searches = searches};
    static const struct {
        const char *name;
        writer_fn fn;
        int arg;
    } files[] = {
        {"summary.md", w_md, 0},
        {"results.csv", w_csv, 0},
        {"goodput.svg", w_goodput, 0},
        {"ttft_cdf.svg", w_cdf, 0},
        {"tpot_cdf.svg", w_cdf, 1},
        {"stats.csv", w_stats, 0},
        {"attainment.svg", w_attainment, 0},
        {"slo_scale.svg", w_slo_scale, 0},
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[PATH_MAX + 32], tmp[PATH_MAX + 40];
        exp_sfmt(path, sizeof(path), "%s/%s", dir, files[i].name);
        exp_sfmt(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (!f) {
            exp_sfmt(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
            return TANDEM_EIO;
        }
        int rc = files[i].fn(f, &in, files[i].arg);
        if (fclose(f) != 0 || rc != 0 || rename(tmp, path) != 0) {
            exp_sfmt(err, errlen, "cannot write %s", path);
            unlink(tmp);
            return TANDEM_EIO;
        }
        size_t l = strlen(path);
        if (l > 4 && strcmp(path + l - 4, ".svg") == 0 && plot_png(path) < 0) {
            exp_sfmt(err, errlen, "rsvg-convert could not turn %s into PNG", path);
            return TANDEM_EIO;
        }
    }
    return 0;
}
