/* The cells of an experiment: one configuration at one rate each, with
 * everything the report shows of it (summary, goodput under every SLO set,
 * distributions, host measurements, the cell's JSON), in modelled time.
 * The matrix (exp_matrix.h) fills them, the report (exp_report.h) reads
 * them. Pure, any thread; a cell owns its arrays and JSON (exp_cell_fini). */
#ifndef TANDEM_EXP_CELL_H
#define TANDEM_EXP_CELL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "exp_file.h"
#include "exp_stats.h"
#include "loadgen/summary.h"

/* Host measurements over one cell: the live runner's. A runner that does
 * not measure the host sets the doubles to NaN (the report shows "-") and
 * ncpu to 0; a cell that did not run keeps them 0. */
struct exp_host {
    double host_busy;     /* share of all CPUs busy over the cell, [0, 1]; NaN unknown */
    double cluster_cpu_s; /* CPU seconds of tandem up and its processes (wall) */
    double loadgen_cpu_s; /* CPU seconds of the runner itself (wall) */
    double wall_s;        /* wall seconds of the cell's measured run */
    double load1_start;   /* /proc/loadavg 1-minute value at the start, at the end */
    double load1_end;
    int ncpu;
    /* The workers' sim steps over the cell: how late their ends fired as a
     * share of their modelled time (tandem:step_overrun_seconds over
     * tandem:step_modelled_seconds, exp_scrape.h); NaN when no step was
     * timed (tiny, time_scale 0) or it was not measured. */
    double step_overrun;
};

/* One cell of the matrix: a configuration at a rate. Everything in
 * modelled time. */
struct exp_cell {
    int config; /* index into exp_file.configs */
    int rate;   /* index into exp_file.rates */
    int seed_k; /* which of the cell's seeds (0..exp_seeds - 1): seed = exp_seed_of(first, k) */
    int done;   /* the runner got to this cell */
    int ok;     /* 0: not run (the cluster failed to start); error says why */
    char error[256];
    uint64_t seed;
    double time_scale;
    struct lg_summary s;
    double sent_rate;                   /* measured requests / last send time (modelled req/s) */
    double extra_goodput[EXP_MAX_SLOS]; /* under exp_file.extra_slos */
    double *ttft_ms;                    /* (n_ttft) completed requests' TTFT, sorted; owned */
    size_t n_ttft;
    double *tpot_ms; /* (n_tpot) completed requests with > 1 output token, sorted; owned */
    size_t n_tpot;
    struct exp_req *reqs; /* (n_reqs) every measured request's outcome, in order; owned */
    size_t n_reqs;
    struct exp_host host;
    json_t *json; /* the cell's JSON (lg_report_json + "experiment"); owned, may be NULL */
};

/* Frees what a cell owns. */
void exp_cell_fini(struct exp_cell *c);

/* Fills the cell's distributions from records (already in modelled time):
 * TTFT of completed requests, TPOT (lg_tpot_s) of completed ones with more
 * than one output token, both sorted, in ms; and every request's outcome
 * (reqs, for attainment against SLO scale).
 * 0 or TANDEM_ENOMEM. */
int exp_cell_distributions(struct exp_cell *c, const struct lg_record *recs, size_t n);

/* The cell of configuration ci at rate ri among cells[0..n), or NULL. */
const struct exp_cell *exp_cell_find(const struct exp_cell *cells, size_t n, int ci, int ri);
/* The cells of configuration ci at rate ri that ran (ok), one per seed, in
 * order, into out (at most cap); returns how many. */
int exp_cells_group(const struct exp_cell *cells, size_t n, int ci, int ri,
                    const struct exp_cell **out, int cap);
/* The mean and 95% interval of get(cell) over the group's cells (NaN
 * values skipped). */
struct exp_ci exp_group_ci(const struct exp_cell *const *group, int n,
                           double (*get)(const struct exp_cell *c, const void *arg),
                           const void *arg);
/* Whether some cell of cells[0..n) is of configuration ci, of rate ri. */
int exp_cells_have_config(const struct exp_cell *cells, size_t n, int ci);
int exp_cells_have_rate(const struct exp_cell *cells, size_t n, int ri);
/* Shallow copies of the cells of cells[0..n) that are done, in order, into
 * view (n entries); returns how many. view owns nothing. */
size_t exp_cells_done(const struct exp_cell *cells, size_t n, struct exp_cell *view);

#endif
