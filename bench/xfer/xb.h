/* Shared helpers of the KV transfer benchmarks (bench_xfer, bench_ttft):
 * real tandem-prefill / tandem-decode processes started through the
 * integration harness (tests/integration/harness.h) with their stderr in a
 * log file, the transfer timestamps the workers log at debug level (module
 * "xfer": P per chunk, D at the first and last block installed). Medians and
 * the load average come from bench_util.h.
 *
 * Threading: main thread only. */
#ifndef TANDEM_XB_H
#define TANDEM_XB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nng/nng.h>

#include "ctl.h"
#include "harness.h"

#define XB_PATH_MAX 512

/* One worker process, its log, and (decode workers) a control link. */
struct xb_worker {
    struct h_proc p;
    char log[XB_PATH_MAX]; /* its stderr */
    nng_socket ctl;
    int has_ctl;
};

/* Sets TANDEM_BIN_DIR to this executable's directory unless it is set, and
 * installs the harness's clean-up hooks. */
void xb_init(void);

/* Starts binary (tandem-prefill or tandem-decode) with args (NULL-terminated)
 * and its stderr appended to <h_tmpdir>/<name>.log; with dial, also opens a
 * control link (ctl_dial). Returns 0, or -1 (message on stderr; nothing left
 * running). */
int xb_spawn(struct xb_worker *w, const char *binary, const char *const *args, const char *name,
             int dial);

/* Closes the link, stops the process (SIGTERM) and removes its log. */
void xb_stop(struct xb_worker *w);

/* Runs one request on w's control link: greedy, ignore_eos, max_tokens,
 * prefilled by prefill_kv (NULL: locally). *st is the caller's
 * (ctl_stream_fini). Returns 0 when it finished with reason LENGTH and no
 * error, else -1 (message on stderr). */
int xb_request(struct xb_worker *w, uint64_t id, const uint32_t *prompt, int n, int max_tokens,
               const char *prefill_kv, struct ctl_stream *st);

/* One chunk as P logged it: blocks [first, end) ready (computed) at t_ready,
 * n_framed frames handed to the send queue by t_framed (CLOCK_MONOTONIC s). */
struct xb_chunk {
    int first, end;
    double t_ready;
    int n_framed;
    double t_framed;
};

/* P's chunks of request id from P's log, in order, up to cap. Returns the
 * count (0 when none: was the worker started with --log-level debug?). */
int xb_p_chunks(const char *log, uint64_t id, struct xb_chunk *out, int cap);

/* D's first and last block installed for request id (CLOCK_MONOTONIC s), and
 * the block count. Returns 0, or -1 when D's log does not have both. */
int xb_d_installed(const char *log, uint64_t id, double *t_first, double *t_last, int *n_blocks);

/* CPU time of every thread of process pid so far, in ns (the first field
 * of /proc/<pid>/task/<tid>/schedstat, summed), or 0. Threads that already
 * exited are not counted. */
uint64_t xb_cpu_ns(pid_t pid);

#endif
