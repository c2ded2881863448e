/* The offline runner of the experiment matrix (exp_matrix.h): every cell is
 * a run of the offline simulator (simulate/simulate.h) on the
 * configuration's derived cluster file, in modelled time, in this process:
 * `tandem bench --experiment FILE --offline`. No process starts, nothing is
 * slept, and the report is the live one's (the host columns are empty: no
 * CPU was measured).
 *
 * Every cell starts from a fresh simulated cluster (caches cold), with
 * restart per-config as with per-rate: live, a per-config cluster carries
 * its prefix caches from one rate to the next.
 *
 * Threads: the caller's only; run blocks for the cell's simulation. */
#ifndef TANDEM_EXP_OFFLINE_H
#define TANDEM_EXP_OFFLINE_H

#include "exp_matrix.h"
#include "simulate.h"

/* The offline runner's state: opt set by the caller, the rest zero. */
struct exp_offline {
    struct sm_options opt;
    struct cluster *c; /* the configuration of the last start */
};

/* Its operations, for exp_matrix_run with r = a struct exp_offline. */
extern const struct exp_runner_ops exp_offline_ops;

#endif
