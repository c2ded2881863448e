/* The live runner of the experiment matrix (exp_matrix.h): every
 * configuration is a real cluster, `tandem up -c <derived file> --port 0`
 * as a child process in its own process group, ready when its log shows
 * the READY line; each cell is one run of the load generator (loadgen/run.h)
 * against it, in wall time: the rate, duration, timeouts and trace times are
 * multiplied by the configuration's time_scale on the way in, every measured
 * time divided by it on the way out. The host's CPU use over each cell is
 * sampled from /proc, and the workers' step overrun read from their
 * /metrics before and after it (exp_scrape.h), into struct exp_host.
 *
 * Files, under out_dir: logs/<name>.up.log (tandem up's output) and
 * runs/<name>/ (its run directory), <name> from struct exp_start.
 *
 * Threads: the caller's only; start and stop wait on the child (at most
 * up_timeout + 15 s and 15 s), run blocks for the cell. */
#ifndef TANDEM_EXP_LIVE_H
#define TANDEM_EXP_LIVE_H

#include <limits.h>
#include <sys/types.h>

#include "exp_matrix.h"

/* The live runner's state: bin and out_dir set by the caller (both must
 * outlive it), the rest zero before the first start and the runner's. */
struct exp_live {
    const char *bin;     /* the tandem binary that runs `up` */
    const char *out_dir; /* the report directory (logs/ and runs/ exist) */
    /* The cluster of the last start. */
    pid_t pid; /* tandem up; 0: none running */
    char host[128];
    int port;
    char log_path[PATH_MAX];
    double up_s; /* seconds from start to READY */
};

/* Its operations, for exp_matrix_run with r = a struct exp_live. */
extern const struct exp_runner_ops exp_live_ops;

#endif
