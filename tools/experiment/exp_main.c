/* `tandem bench --experiment FILE`: flags, the plan, and the matrix run
 * live (exp_live.h); the final report. See exp_main.h. */
#define _GNU_SOURCE
#include "exp_main.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_options.h"
#include "exp_cell.h"
#include "exp_derive.h"
#include "exp_file.h"
#include "exp_live.h"
#include "exp_offline.h"
#include "exp_matrix.h"
#include "exp_report.h"
#include "exp_util.h"
#include "flags.h"
#include "search.h"
#include "tandem_err.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

static const char *const restart_choices[] = {"file", "per-config", "per-rate", NULL};

static void usage(FILE *f, const struct flag *flags, size_t n)
{
    flags_usage(f,
                "tandem bench --experiment FILE [--out DIR] [flags]\n\n"
                "Runs an experiment file: every configuration (cluster file x routing, each\n"
                "started with `tandem up`) at every request rate with the same workload and\n"
                "seed, then writes a report directory: summary.md, results.csv, cells/*.json,\n"
                "requests/*.csv, goodput.svg, ttft_cdf.svg, tpot_cdf.svg. Times are modelled\n"
                "seconds (wall / the sim's time_scale). See docs/experiments.md.",
                flags, n);
}

static int parse_rates_flag(const char *s, struct exp_file *e, char *err, size_t errlen)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", s);
    e->n_rates = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        double r;
        if (e->n_rates == EXP_MAX_RATES || exp_rate_parse(t, &r) != 0) {
            exp_sfmt(err, errlen, "--rates: '%s' is not a positive number or inf", t);
            return TANDEM_EINVAL;
        }
        for (int i = 0; i < e->n_rates; i++) {
            if (e->rates[i] == r) {
                exp_sfmt(err, errlen, "--rates: %s is listed twice", t);
                return TANDEM_EINVAL;
            }
        }
        e->rates[e->n_rates++] = r;
    }
    if (e->n_rates == 0) {
        exp_sfmt(err, errlen, "--rates: no rate given");
        return TANDEM_EINVAL;
    }
    qsort(e->rates, (size_t)e->n_rates, sizeof(double), exp_cmp_double);
    return 0;
}

/* Marks the configurations named in a comma list. */
static int parse_only(const char *s, const struct exp_file *e, int *sel, char *err, size_t errlen)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), "%s", s);
    for (int i = 0; i < e->n_configs; i++) {
        sel[i] = 0;
    }
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < e->n_configs; i++) {
            if (strcmp(e->configs[i].label, t) == 0) {
                sel[i] = found = 1;
            }
        }
        if (!found) {
            size_t n = (size_t)exp_sfmt(err, errlen, "--only: no configuration '%s' (have:", t);
            for (int i = 0; i < e->n_configs && n < errlen; i++) {
                n += (size_t)snprintf(err + n, errlen - n, " %s", e->configs[i].label);
            }
            if (n < errlen) {
                snprintf(err + n, errlen - n, ")");
            }
            return TANDEM_EINVAL;
        }
    }
    return 0;
}

/* Meta lines of the report. */
struct meta {
    char lines[8][1024];
    const char *ptr[8];
    int n;
};

__attribute__((format(printf, 2, 3))) static void meta_add(struct meta *m, const char *fmt_, ...)
{
    if (m->n == 8) {
        return;
    }
    va_list ap;
    va_start(ap, fmt_);
    vsnprintf(m->lines[m->n], sizeof(m->lines[0]), fmt_, ap);
    va_end(ap);
    m->ptr[m->n] = m->lines[m->n];
    m->n++;
}

static void load_text(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        double a = 0, b = 0, c = 0;
        if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) {
            snprintf(out, cap, "%.2f, %.2f, %.2f", a, b, c);
        }
        fclose(f);
    }
}

/* The `tandem` binary to start clusters with. */
static void self_binary(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    out[n > 0 ? n : 0] = '\0';
}

/* The runtime of one experiment: what exp_main prepares for the matrix. */
struct exp_run {
    struct bench_options bo;
    const char *out_dir;
    int sel_idx[EXP_MAX_CONFIGS]; /* the configurations to run, in order */
    int n_sel;
    char cluster_files[EXP_MAX_CONFIGS][PATH_MAX];
    const char *cluster_ptrs[EXP_MAX_CONFIGS];
    double time_scales[EXP_MAX_CONFIGS];
};

/* Creates the report directory and its parts, and writes and validates
 * every derived cluster before anything starts. Returns 0, or the exit code
 * (message printed). */
static int prepare(const struct exp_file *e, struct exp_run *x)
{
    char sub[PATH_MAX + 16], err[EXP_ERR_MAX];
    const char *subs[] = {"", "/cells", "/requests", "/runs", "/logs"};
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        exp_sfmt(sub, sizeof(sub), "%s%s", x->out_dir, subs[i]);
        if (exp_mkdir_p(sub) != 0) {
            fprintf(stderr, "tandem bench: cannot create %s: %s\n", sub, strerror(errno));
            return 1;
        }
    }
    /* The selected configurations, then pd_search's bases (even when
     * --only leaves them out of the matrix). */
    int extra[2] = {e->has_pd_search ? e->pd_search_config : -1,
                    e->has_pd_search ? e->pd_search_colocated : -1};
    for (int k = 0; k < x->n_sel + 2; k++) {
        int i = k < x->n_sel ? x->sel_idx[k] : extra[k - x->n_sel];
        if (i < 0 || x->cluster_ptrs[i] != NULL) {
            continue;
        }
        if (exp_prepare(e, i, x->out_dir, x->cluster_files[i], sizeof(x->cluster_files[i]),
                        &x->time_scales[i], err, sizeof(err)) != 0) {
            fprintf(stderr, "tandem bench: %s\n", err);
            return 2;
        }
        x->cluster_ptrs[i] = x->cluster_files[i];
    }
    return 0;
}

/* The plan: configurations, their commands and how long they send. */
static void print_plan(const struct exp_file *e, const struct exp_run *x, const char *bin)
{
    double per_cell = x->bo.run.duration_s > 0 ? x->bo.run.duration_s : NAN;
    fprintf(stderr, "[exp] %s: %d configurations x %d rates x %d seeds, restart %s; report in %s\n",
            e->name, x->n_sel, e->n_rates, exp_seeds(e),
            e->restart == EXP_RESTART_PER_RATE ? "per rate" : "per configuration", x->out_dir);
    for (int k = 0; k < x->n_sel; k++) {
        int i = x->sel_idx[k];
        fprintf(stderr, "[exp]   %-28s %s up -c %s --port 0 (time_scale %g)\n", e->configs[i].label,
                bin, x->cluster_files[i], x->time_scales[i]);
        double est = 0;
        for (int r = 0; r < e->n_rates; r++) {
            double cell = isfinite(per_cell) ? per_cell
                          : isinf(e->rates[r]) || x->bo.run.num_prompts < 0
                              ? 0
                              : (double)x->bo.run.num_prompts / e->rates[r];
            est += cell * x->time_scales[i] * exp_seeds(e);
        }
        fprintf(stderr, "[exp]   %-28s sending for about %.0f s (wall) in all\n", "", est);
    }
}

/* Runs the matrix, live or offline, and writes the final report; returns
 * the exit code. An offline report says nothing of the day or the machine,
 * so the same inputs give the same bytes. */
/* goodput_search: per selected configuration, the rate search on its
 * derived cluster (offline), into rows (x->n_sel). Returns 0 or 1 (a
 * configuration could not be searched: its row says why). */
static int goodput_search(const struct exp_file *e, const struct exp_run *x,
                          struct exp_search_row *rows)
{
    struct search_rate_opts o = e->goodput_search;
    o.seeds = exp_seeds(e);
    struct sm_options so;
    sm_options_default(&so);
    int rc = 0;
    for (int k = 0; k < x->n_sel && !exp_stop_requested(); k++) {
        int i = x->sel_idx[k];
        struct exp_search_row *row = &rows[k];
        row->config = i;
        row->done = 1;
        struct cluster *c = NULL;
        fprintf(stderr, "[exp] %s: goodput search, %d seeds\n", e->configs[i].label, o.seeds);
        int r = cluster_load(&c, x->cluster_files[i], row->error, sizeof(row->error));
        if (r == 0) {
            r = search_rate(c, &so, &x->bo.run, &x->bo.summary.slo, &o, stderr, &row->r, row->error,
                            sizeof(row->error));
        }
        cluster_free(c);
        row->ok = r == 0;
        if (r != 0) {
            fprintf(stderr, "[exp] %s: goodput search failed: %s\n", e->configs[i].label,
                    row->error);
            rc = 1;
        }
    }
    return rc;
}

/* pd_search: the P:D search from the two derived clusters. Returns 0, or 1
 * with *why set (the report says it). */
static int pd_search(const struct exp_file *e, const struct exp_run *x, struct search_pd_row **rows,
                     int *n, char *why, size_t whylen)
{
    struct search_pd_opts o = e->pd_search;
    o.rate = e->goodput_search;
    o.rate.seeds = exp_seeds(e);
    struct sm_options so;
    sm_options_default(&so);
    struct cluster *pd = NULL, *colo = NULL;
    fprintf(stderr, "[exp] P:D search: %d GPUs, %d seeds per configuration\n", o.gpus,
            o.rate.seeds);
    int rc = cluster_load(&pd, x->cluster_files[e->pd_search_config], why, whylen);
    if (rc == 0 && e->pd_search_colocated >= 0) {
        rc = cluster_load(&colo, x->cluster_files[e->pd_search_colocated], why, whylen);
    }
    if (rc == 0) {
        rc = search_pd(pd, colo, &so, &x->bo.run, &x->bo.summary.slo, &o, stderr, rows, n, why,
                       whylen);
    }
    cluster_free(pd);
    cluster_free(colo);
    if (rc != 0) {
        fprintf(stderr, "[exp] P:D search failed: %s\n", why);
        return 1;
    }
    return 0;
}

static int run_matrix(const struct exp_file *e, struct exp_run *x, const char *bin, int offline,
                      int progress, int argc, char **argv, time_t t0, const struct tm *tm)
{
    size_t n_cells = (size_t)x->n_sel * (size_t)e->n_rates * (size_t)exp_seeds(e);
    struct exp_cell *cells = calloc(n_cells, sizeof(*cells));
    struct exp_cell *view = calloc(n_cells, sizeof(*view));
    if (!cells || !view) {
        free(cells);
        free(view);
        return 1;
    }
    struct meta meta = {.n = 0};
    char cmd[900] = "", load[64], date[64], err[EXP_ERR_MAX];
    size_t cl = 0;
    cl += (size_t)snprintf(cmd, sizeof(cmd), "tandem");
    for (int i = 0; i < argc && cl < sizeof(cmd); i++) {
        cl += (size_t)snprintf(cmd + cl, sizeof(cmd) - cl, " %s", argv[i]);
    }
    load_text(load, sizeof(load));
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S %z", tm);
    meta_add(&meta, "Command: `%s`", cmd);
    if (offline) {
        meta_add(&meta, "Offline: every cell simulated in modelled time by tandem simulate's "
                        "model (docs/simulate.md), no process started");
    } else {
        meta_add(&meta, "Started %s on %ld CPUs; load average at the start: %s", date,
                 sysconf(_SC_NPROCESSORS_ONLN), load);
    }
    struct exp_matrix m = {
        .e = e,
        .bo = &x->bo,
        .configs = x->sel_idx,
        .n_configs = x->n_sel,
        .cluster_files = x->cluster_ptrs,
        .time_scales = x->time_scales,
        .out_dir = x->out_dir,
        .progress = progress,
        .n_seeds = exp_seeds(e),
        .meta = meta.ptr,
        .n_meta = meta.n,
        .cells = cells,
        .view = view,
    };
    struct exp_live live = {.bin = bin, .out_dir = x->out_dir};
    struct exp_offline off = {.c = NULL};
    sm_options_default(&off.opt);
    int interrupted = 0;
    int exit_code = offline ? exp_matrix_run(&m, &exp_offline_ops, &off, &interrupted)
                            : exp_matrix_run(&m, &exp_live_ops, &live, &interrupted);
    load_text(load, sizeof(load));
    time_t t1 = time(NULL);
    if (!offline) {
        meta_add(&meta, "Took %.0f s; load average at the end: %s%s", difftime(t1, t0), load,
                 interrupted ? " (interrupted: partial results)" : "");
    } else if (interrupted) {
        meta_add(&meta, "Interrupted: partial results");
    }
    struct exp_search_row *search = NULL;
    int n_search = 0;
    if (offline && e->has_goodput_search && !interrupted) {
        search = calloc((size_t)x->n_sel, sizeof(*search));
        n_search = search ? x->n_sel : 0;
        if (!search || goodput_search(e, x, search) != 0) {
            exit_code = 1;
        }
        interrupted = exp_stop_requested();
    }
    struct search_pd_row *pd_rows = NULL;
    char pd_why[EXP_ERR_MAX] = "";
    struct exp_searches searches = {.goodput = search, .n_goodput = n_search};
    if (offline && e->has_pd_search && !interrupted) {
        if (pd_search(e, x, &pd_rows, &searches.n_pd, pd_why, sizeof(pd_why)) != 0) {
            exit_code = 1;
            searches.pd_error = pd_why;
        }
        searches.pd = pd_rows;
        interrupted = exp_stop_requested();
    }
    size_t nv = exp_cells_done(cells, n_cells, view);
    if (exp_write_report_search(x->out_dir, e, view, nv, meta.ptr, meta.n, &searches, err,
                                sizeof(err)) != 0) {
        fprintf(stderr, "tandem bench: %s\n", err);
        exit_code = 1;
    }
    fprintf(stderr, "[exp] report: %s/summary.md\n", x->out_dir);
    printf("%s/summary.md\n", x->out_dir);
    if (interrupted) {
        exit_code = 130;
    }
    for (size_t i = 0; i < n_cells; i++) {
        exp_cell_fini(&cells[i]);
    }
    free(search);
    free(pd_rows);
    free(cells);
    free(view);
    return exit_code;
}

int exp_main(int argc, char **argv)
{
    const char *file = NULL, *out = NULL, *only = NULL, *rates = NULL, *bin = NULL;
    int dry_run = 0, restart = 0, offline = 0, progress = isatty(STDERR_FILENO),
        disable_progress = 0, seeds = 0;
    const struct flag flags[] = {
        {"experiment", FLAG_STR, &file, "experiment file (YAML)", 0, 0, NULL},
        {"out", FLAG_STR, &out,
         "report directory (default: run/experiments/<name>-<YYYYmmdd-HHMMSS>)", 0, 0, NULL},
        {"dry-run", FLAG_BOOL, &dry_run,
         "validate, write the derived cluster files, print the plan; start nothing", 0, 0, NULL},
        {"only", FLAG_STR, &only, "run only these configurations (comma-separated labels)", 0, 0,
         NULL},
        {"rates", FLAG_STR, &rates, "replace the file's rates (comma-separated)", 0, 0, NULL},
        {"restart", FLAG_CHOICE, &restart, "file (the file's restart:), per-config or per-rate", 0,
         0, restart_choices},
        {"offline", FLAG_BOOL, &offline,
         "run every cell offline with tandem simulate's model (sim pools only; docs/simulate.md)",
         0, 0, NULL},
        {"seeds", FLAG_INT, &seeds,
         "runs per cell (replaces the file's seeds:; default 5 offline, 3 live)", 0, 0, NULL},
        {"tandem-bin", FLAG_STR, &bin, "the tandem binary that runs `up` (default: this one)", 0, 0,
         NULL},
        {"progress", FLAG_BOOL, &progress, "show the load generator's progress line", 0, 0, NULL},
        {"disable-progress", FLAG_BOOL, &disable_progress, "never show it", 0, 0, NULL},
    };
    char err[EXP_ERR_MAX] = "";
    int rc = flags_parse(flags, FLAGS_COUNT(flags), argc, argv, 1, NULL, err, sizeof(err));
    if (rc == FLAGS_HELP) {
        usage(stdout, flags, FLAGS_COUNT(flags));
        return 0;
    }
    if (rc == FLAGS_VERSION) {
        printf("tandem %s\n", TANDEM_VERSION);
        return 0;
    }
    if (rc != FLAGS_OK) {
        fprintf(stderr, "tandem bench: %s\n", err);
        return 2;
    }
    if (!file) {
        fprintf(stderr, "tandem bench: --experiment FILE is required with the experiment flags\n");
        return 2;
    }
    struct exp_file *e = NULL;
    rc = exp_load(&e, file, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tandem bench: %s\n", err);
        return 2;
    }
    e->offline = offline;
    if (seeds != 0 && (seeds < 1 || seeds > EXP_MAX_SEEDS)) {
        fprintf(stderr, "tandem bench: --seeds: %d is not in [1, %d]\n", seeds, EXP_MAX_SEEDS);
        exp_free(e);
        return 2;
    }
    e->seeds = seeds ? seeds : e->seeds;
    if (e->has_goodput_search && !offline) {
        fprintf(stderr, "[exp] %s:%d: goodput_search runs offline only (--offline): skipped\n",
                file, e->goodput_search_line);
    }
    if (e->has_pd_search && !offline) {
        fprintf(stderr, "[exp] %s:%d: pd_search runs offline only (--offline): skipped\n", file,
                e->pd_search_line);
    }
    if (restart > 0) {
        e->restart = restart == 1 ? EXP_RESTART_PER_CONFIG : EXP_RESTART_PER_RATE;
    }
    int sel[EXP_MAX_CONFIGS];
    for (int i = 0; i < e->n_configs; i++) {
        sel[i] = 1;
    }
    if ((rates && parse_rates_flag(rates, e, err, sizeof(err)) != 0) ||
        (only && parse_only(only, e, sel, err, sizeof(err)) != 0)) {
        fprintf(stderr, "tandem bench: %s\n", err);
        exp_free(e);
        return 2;
    }
    struct exp_run *x = calloc(1, sizeof(*x));
    if (!x) {
        exp_free(e);
        return 1;
    }
    if (exp_bench_options(e, &x->bo, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem bench: %s: %s\n", file, err);
        bench_options_fini(&x->bo);
        free(x);
        exp_free(e);
        return 2;
    }
    for (int i = 0; i < e->n_configs; i++) {
        if (sel[i]) {
            x->sel_idx[x->n_sel++] = i;
        }
    }
    char outbuf[PATH_MAX], binbuf[PATH_MAX], when[64];
    time_t t0 = time(NULL);
    struct tm tm;
    localtime_r(&t0, &tm);
    strftime(when, sizeof(when), "%Y%m%d-%H%M%S", &tm);
    if (!out) {
        exp_sfmt(outbuf, sizeof(outbuf), "run/experiments/%s-%s", e->name, when);
        out = outbuf;
    }
    x->out_dir = out;
    if (!bin) {
        self_binary(binbuf, sizeof(binbuf));
        bin = binbuf;
    }
    int exit_code = prepare(e, x);
    if (exit_code == 0) {
        print_plan(e, x, bin);
        if (dry_run) {
            fprintf(stderr, "[exp] dry run: nothing started\n");
        } else {
            exit_code =
                run_matrix(e, x, bin, offline, progress && !disable_progress, argc, argv, t0, &tm);
        }
    }
    bench_options_fini(&x->bo);
    free(x);
    exp_free(e);
    return exit_code;
}
