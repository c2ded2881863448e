/* Searches on the offline simulator (simulate/simulate.h):
 *
 * - the rate search behind DistServe's per-GPU goodput: the highest request
 *   rate at which at least a share `attainment` (0.9) of the requests meet
 *   every SLO (TTFT and TPOT), divided by the cluster's GPUs (instances x
 *   TP, as sm_stats.gpus counts them). Per seed, a bracketing bisection
 *   over [min_rate, max_rate] down to `resolution`; the seeds' rates give a
 *   mean with its 95% interval (exp_stats.h). Used by `tandem bench
 *   --experiment FILE --offline` (goodput_search:) and by the P:D search;
 * - the P:D search of `tandem simulate --search pd`: every split of a GPU
 *   budget N into P prefill and D decode instances (P x tp_p + D x tp_d = N,
 *   TP per phase from a list), plus colocated instances of the same N GPUs
 *   (N / tp of them per TP of the list) as the baseline, each from a base
 *   cluster file's pools, each given the rate search.
 *
 * Attainment is measured as lg_summary's slo_attainment (failed requests
 * are misses). The search assumes it falls with the rate; with one seed per
 * probe it can be noisy near the threshold, so the result is the last rate
 * seen to pass below the first seen to fail (within resolution).
 *
 * Threads: the caller's only; every call blocks for its simulations.
 * Errors: a negative project code with a message in err. */
#ifndef TANDEM_SEARCH_H
#define TANDEM_SEARCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cluster.h"
#include "experiment/exp_stats.h"
#include "loadgen/run.h"
#include "simulate.h"

#define SEARCH_MAX_TP 8

/* The rate search's settings (experiment key goodput_search:, and the
 * --attainment/--min-rate/--max-rate/--resolution flags of --search pd). */
struct search_rate_opts {
    double attainment; /* (0, 1]; default 0.9 */
    double min_rate;   /* requests per modelled second, > 0 */
    double max_rate;   /* > min_rate */
    double resolution; /* > 0: bisection stops when the bracket is this narrow */
    int seeds;         /* 1..EXP_MAX_SEEDS; seed k is exp_seed_of(run's seed, k) */
};

/* Defaults: attainment 0.9, rates 0.25..64, resolution 0.25, 5 seeds. */
void search_rate_opts_default(struct search_rate_opts *o);

/* Checks o: 0, or TANDEM_EINVAL with a message naming the bad value. */
int search_rate_opts_check(const struct search_rate_opts *o, char *err, size_t errlen);

/* What one rate search found. */
struct search_rate_result {
    double rate[EXP_MAX_SEEDS]; /* per seed: the rate found; 0 when even min_rate fails */
    int n;                      /* seeds searched */
    struct exp_ci ci;           /* of rate[] */
    struct exp_ci per_gpu;      /* of rate[] / gpus */
    int gpus;                   /* the cluster's GPUs */
    int below_min;              /* seeds where min_rate already missed the attainment */
    int at_max;                 /* seeds where max_rate still met it (rate = max_rate) */
    int probes;                 /* simulations run */
};

/* The highest rate meeting o->attainment of cluster c under the workload
 * run (its request_rate and seed are replaced) and the SLOs slo, per seed.
 * so: the simulator's options (NULL: defaults). progress (NULL: quiet)
 * gets a line per seed. 0, or sm_run's error (TANDEM_ECONFIG /
 * TANDEM_EINVAL when the cluster cannot run: a TP the model refuses, KV
 * that does not fit), TANDEM_EINVAL when slo sets no SLO. */
int search_rate(const struct cluster *c, const struct sm_options *so,
                const struct lg_run_config *run, const struct lg_slo *slo,
                const struct search_rate_opts *o, FILE *progress, struct search_rate_result *out,
                char *err, size_t errlen);

/* The P:D search's settings. */
struct search_pd_opts {
    int gpus;               /* the budget N, >= 2 */
    int tps[SEARCH_MAX_TP]; /* TP degrees to try per phase; n_tps 0: the base pools' own */
    int n_tps;
    struct search_rate_opts rate;
};

/* One configuration of the P:D search. */
struct search_pd_row {
    int colocated;       /* 1: `prefill` colocated instances of TP tp_prefill */
    int prefill, decode; /* instances */
    int tp_prefill, tp_decode;
    char label[48]; /* "3P1D tp1/tp1", "colocated x4 tp1" */
    int ok;         /* 0: could not run (error says why) */
    char error[256];
    struct search_rate_result r;
};

/* Parses "1,2,4,8" into o->tps (each 1..64, no repeats, at most
 * SEARCH_MAX_TP). 0 or TANDEM_EINVAL with a message. */
int search_parse_tps(const char *s, struct search_pd_opts *o, char *err, size_t errlen);

/* Runs the P:D search: the splits of o->gpus over pd_base's prefill and
 * decode pools (which must both exist) and, when colo_base is not NULL (a
 * cluster with a colocated pool), the colocated baseline. Every other
 * setting of the base files is kept. On 0, *rows (caller frees) holds
 * *n_rows configurations, sorted by per-GPU goodput (best first; rows that
 * could not run last). TANDEM_EINVAL when no split fits the budget
 * (message says which TPs were tried), or when no configuration could run
 * at all (the first error); TANDEM_ENOMEM. */
int search_pd(const struct cluster *pd_base, const struct cluster *colo_base,
              const struct sm_options *so, const struct lg_run_config *run,
              const struct lg_slo *slo, const struct search_pd_opts *o, FILE *progress,
              struct search_pd_row **rows, int *n_rows, char *err, size_t errlen);

/* The result table (markdown): configuration, instances, per-GPU goodput
 * (mean +- half-width), the rate; the best marked with its margin over the
 * runner-up, or as a tie when their intervals overlap. */
void search_pd_print(FILE *f, const struct search_pd_row *rows, int n_rows,
                     const struct search_pd_opts *o);

#endif
