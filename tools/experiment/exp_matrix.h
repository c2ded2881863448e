/* The experiment matrix and its runners.
 *
 * exp_matrix_run walks the matrix configurations x rates (cells, exp_cell.h)
 * in the order restart: asks for, gives each cell its seed, and hands the
 * running itself to a runner through struct exp_runner_ops: the live runner (exp_live.h) starts the
 * configuration's cluster with `tandem up` and sends it real requests; a runner that simulates the
 * cluster in modelled time plugs in the same way, and everything after the requests (summary,
 * goodput under every SLO set, distributions, the cell's JSON and request CSV, the progress line,
 * the report after every cell) is this module's, the same for every runner.
 *
 * Time: every time in a cell is in modelled seconds; a runner converts its
 * own clock (the live runner divides wall times by the time_scale).
 *
 * Cache state: with restart per-config (the default) a configuration's
 * cluster is started once and serves its rates in order, rate i with seed +
 * i: the same requests in every configuration at a given rate, never a
 * request already served by the same cluster. With restart per-rate every
 * cell gets a fresh cluster and the same seed, and the configurations take
 * turns at each rate (side by side in time).
 *
 * Seeds: with n_seeds > 1 each cell runs n_seeds times, run k with
 * exp_seed_of(the cell's seed, k), right after one another (per-config: on
 * the same cluster; per-rate: each on a fresh one, the configurations taking
 * turns at each rate and seed). Run k > 0 names its files and cluster
 * "<label>-r<rate>-s<k>"; run 0 keeps the names of a single-seed run. Warm-ups use the load
 * generator's warm-up seed (never the measured prompts).
 *
 * Threads: one. exp_matrix_run blocks its thread for the whole matrix and
 * installs SIGINT/SIGTERM handlers that only raise the stop flag
 * (exp_stop_requested). */
#ifndef TANDEM_EXP_MATRIX_H
#define TANDEM_EXP_MATRIX_H

#include <jansson.h>
#include <stddef.h>

#include "bench_options.h"
#include "exp_cell.h"
#include "exp_file.h"
#include "loadgen/run.h"

/* What a runner is asked to start: configuration `config` of e, for the
 * cells that follow until stop(). */
struct exp_start {
    const struct exp_file *e;
    int config;               /* index into e->configs */
    const char *cluster_file; /* the derived cluster file (exp_prepare) */
    double time_scale;        /* its wall seconds per modelled second (exp_prepare) */
    const char *name;         /* names this cluster's files: the label, or "<label>-r<rate>"
                                 with restart per-rate */
};

/* What a runner hands back for one cell. */
struct exp_run_out {
    struct lg_run_result res; /* the measured requests, every time in modelled seconds;
                                 freed by the matrix (lg_run_result_free) */
    char base_url[256];       /* what was measured, for the JSON's base_url ("" none) */
    json_t *extra;            /* NULL, or keys of the runner's own for the cell JSON's
                                 "experiment" object (live: up_log, wall_request_rate);
                                 freed by the matrix */
};

/* A runner: how the cells of a configuration are run. A runner is one file
 * with a `const struct exp_runner_ops` and a state struct of its own (r,
 * the caller's, passed back to every call); exp_live.c is the live one. The
 * matrix owns the order, the seeds, the cells and the report; the runner
 * owns its cluster. Per operation:
 *
 * start (required): brings configuration s->config up before its first cell
 *   (restart per-config) or before every cell (per-rate). Returns 0 when the
 *   cells can run; TANDEM_ECANCELLED when a stop signal cut it short (the
 *   matrix ends there); another negative code when it failed: err says why
 *   (the matrix prints it), note what every cell of this start reports as
 *   "not run" (both truncated to fit). May print progress lines ("[exp] ...")
 *   to stderr.
 * settle (optional, NULL: none): pauses s seconds (exp_file.settle_s) after a
 *   successful start and before every cell, returning early on a stop
 *   signal. The live runner sleeps so the cluster settles between cells.
 * run (required): runs one cell. cfg is the experiment's bench flags in
 *   modelled time with request_rate the cell's rate (requests per modelled
 *   second, INFINITY allowed), workload.seed the cell's seed and progress as
 *   asked; cfg's host, port and path name the live target. c has config,
 *   rate, seed and time_scale set. Returns 0 with:
 *     - out->res: every measured request (struct lg_record), n, duration_s,
 *       model, and the run's counts (warm-ups, not_sent, interrupted when a
 *       stop signal cut the run short, trace_count; http stays 0 without
 *       HTTP); every time in modelled seconds;
 *     - out->base_url, out->extra as described there;
 *     - c->host (struct exp_host: NaN and 0 when not measured).
 *   Or a negative code with the message in err and *out left zeroed:
 *   TANDEM_ECANCELLED when a stop signal interrupted it. The runner fills
 *   nothing else of c: its summary, sent_rate, extra_goodput, distributions,
 *   JSON, files (cells/, requests/), ok and error come from out->res, here,
 *   the same for every runner.
 * stop (required): ends what start brought up, quietly; called once after
 *   every successful start, also when the matrix ends early. */
struct exp_runner_ops {
    const char *name;
    int (*start)(void *r, const struct exp_start *s, char *err, size_t errlen, char *note,
                 size_t notelen);
    void (*settle)(void *r, double s);
    int (*run)(void *r, const struct lg_run_config *cfg, struct exp_cell *c,
               struct exp_run_out *out, char *err, size_t errlen);
    void (*stop)(void *r);
};

/* One run of the matrix. */
struct exp_matrix {
    const struct exp_file *e;
    const struct bench_options *bo; /* exp_bench_options */
    const int *configs;             /* (n_configs) indices into e->configs, in order */
    int n_configs;
    const char *const *cluster_files; /* (e->n_configs) derived files (exp_prepare) */
    const double *time_scales;        /* (e->n_configs) (exp_prepare) */
    const char *out_dir;              /* exists with cells/ and requests/ in it */
    int progress;                     /* the load generator's progress line */
    const char *const *meta;          /* (n_meta) the report's run facts */
    int n_meta;
    int n_seeds;            /* runs per cell, seeds exp_seed_of(seed, k); 0 means 1 */
    struct exp_cell *cells; /* (n_configs * e->n_rates * n_seeds) zeroed; filled
                               configuration-major, then rate, then seed */
    struct exp_cell *view;  /* (as many) scratch for the report */
};

/* Runs the matrix with runner ops/r: each cell is filled, printed to stderr
 * and the report rewritten in out_dir after it (exp_write_report), so an
 * interrupted experiment leaves a report of what ran. Returns 0 when every
 * cell ran, 1 when a start, a cell or a report write failed; *interrupted
 * is set when a stop signal ended it early. The caller writes the final
 * report and frees the cells (exp_cell_fini). */
int exp_matrix_run(const struct exp_matrix *m, const struct exp_runner_ops *ops, void *r,
                   int *interrupted);

/* (Re)installs the SIGINT/SIGTERM handlers that raise the stop flag; a
 * runner whose work takes SIGINT over (lg_run does) calls it afterwards. A
 * SIGTERM is passed on as a SIGINT to the process, which a run in progress
 * listens for. */
void exp_catch_signals(void);
/* Whether a stop signal arrived (async-signal-safe read). */
int exp_stop_requested(void);

#endif
