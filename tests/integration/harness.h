/* Process harness for the integration tests: spawns tandem-prefill and
 * tandem-decode from TANDEM_BIN_DIR (posix_spawn), reads their READY line,
 * scrapes /metrics over HTTP, and always cleans up: every child is killed and
 * reaped and every ipc file and temporary directory removed, at the end of
 * each test (h_cleanup_all from the suite's teardown), at exit, and on a fatal
 * signal (SIGSEGV, SIGABRT, SIGTERM, SIGINT, SIGALRM), so a failed assertion
 * or a crash never leaves a worker behind. */
#ifndef TANDEM_HARNESS_H
#define TANDEM_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nng/nng.h>

#include "ctl.h"

#define H_MAX_PROCS 16
#define H_URL_MAX   300

struct h_proc {
    pid_t pid; /* 0 once reaped */
    char id[128];
    char role[32];
    char control[H_URL_MAX];
    char kv[H_URL_MAX];
    char metrics[64]; /* "127.0.0.1:port" */
    int metrics_port;
    int exit_status; /* waitpid status once reaped */
};

/* Installs the signal handlers and atexit hook (idempotent). */
void h_init(void);

/* A per-process temporary directory (created on first use, removed by
 * h_cleanup_all... at exit). */
const char *h_tmpdir(void);

/* Writes "ipc://<tmpdir>/<name>.ipc" to out; the file is unlinked at cleanup. */
void h_ipc_url(char *out, size_t cap, const char *name);

/* Starts TANDEM_BIN_DIR/binary with args (NULL-terminated, not including
 * argv[0]) and waits up to timeout_ms for its READY line, which fills *p.
 * stderr is inherited; TANDEM_IT_LOG=debug (or info, ...) appends
 * --log-level to every worker's flags for debugging. Returns 0, or -1 (message on stderr; the
 * child, if any, is killed). */
int h_spawn(struct h_proc *p, const char *binary, const char *const *args, int timeout_ms);

/* Runs binary with args to completion (stdout/stderr to /dev/null unless
 * keep_output) and returns its exit code, or -1. For flag tests. */
int h_run(const char *binary, const char *const *args, int timeout_ms, int keep_output);

/* Sends sig and waits up to timeout_ms for the exit (then SIGKILL). Returns
 * the exit code (0..255; WATCHDOG_EXIT, 70, when the stop watchdog ended it: a
 * stop that hung, which every clean-stop check rejects by expecting 0; h_stop
 * then says so on stderr),
 * 128 + signal when killed by one, -1 on error. */
int h_stop(struct h_proc *p, int sig, int timeout_ms);

/* Kills (SIGKILL) and reaps every child still running, unlinks the ipc
 * files. Safe to call any time. */
void h_cleanup_all(void);

/* GET path on 127.0.0.1:port. *body is malloc'd (NUL-terminated; caller
 * frees). Returns the HTTP status, or -1. */
int h_http_get(int port, const char *path, char **body);
/* Sends raw bytes to 127.0.0.1:port and reads the answer until EOF or
 * timeout_ms; returns the HTTP status parsed from it, or -1. */
int h_http_raw(int port, const void *data, size_t len, int timeout_ms);

/* Value of the sample whose name+labels are exactly series (e.g.
 * "tandem:kv_blocks{state=\"used\"}") in a Prometheus text body, or NAN
 * when there is no such sample (or body is NULL). A missing series is NAN,
 * never 0, so a check that a counter is 0 fails when the counter is gone:
 * a process exports every series a test reads from its start. */
double h_metric(const char *body, const char *series);
/* Sum of every sample whose name+labels start with prefix (e.g.
 * "tandem:messages_rejected_total{link=\"data\"" for all its reasons), or
 * NAN when no sample matches (as h_metric). */
double h_metric_sum(const char *body, const char *prefix);
/* Scrapes p and sums as h_metric_sum; NAN when the scrape fails or no
 * sample matches (said on stderr). */
double h_proc_metric_sum(const struct h_proc *p, const char *prefix);

/* Scrapes p and returns one series as h_metric; NAN when the scrape fails or
 * the series is missing (said on stderr). */
double h_proc_metric(const struct h_proc *p, const char *series);

/* Scrapes p and checks tandem:kv_blocks free + used + cached_idle ==
 * tandem:kv_capacity_blocks. Returns 0 and the used count in *used (if not
 * NULL), or -1 (message on stderr). */
int h_kv_invariant(const struct h_proc *p, double *used);

/* Polls p's used blocks until they reach want or timeout_ms passes; returns
 * the last value seen (NAN if scraping failed). */
double h_wait_used(const struct h_proc *p, double want, int timeout_ms);

/* Deterministic pseudo-random prompt of n token ids in [lo, hi). */
void h_prompt(uint32_t *out, int n, uint64_t seed, uint32_t lo, uint32_t hi);

/* One request for the single-process engine (h_reference_run): the prompt,
 * max_tokens, sampling (temperature 0: greedy; else top_p and seed as the
 * OpenAI request gives them), and where its ids go (max_tokens of them) and
 * their logprobs (NULL: not wanted). */
struct h_ref_req {
    const uint32_t *prompt;
    int n_prompt;
    int max_tokens;
    float temperature, top_p;
    uint64_t seed;
    uint32_t *ids;
    float *lps;
    /* Prompt logprobs, when plp is not NULL: plp[i] of prompt position
     * i + 1 (n_prompt - 1 of them) and, when plp_top is not NULL, its
     * prompt_top (0..CTL_MAX_TOP) alternatives at plp_top[i * CTL_MAX_TOP]. */
    int prompt_top;
    float *plp;
    struct ctl_top *plp_top;
};

/* The single-process engine: runs every request with ignore_eos on the
 * default tiny preset (block size 16, f32 KV), batched in one scheduler. The
 * kernels are batch invariant, so this is what any worker produces. Returns
 * 0 or a TANDEM_E* code. */
int h_reference_run(struct h_ref_req *reqs, int n);

/* h_reference_run greedily: runs prompts[i] (lens[i] tokens) greedily with
 * ignore_eos for max_tokens tokens each on the default tiny preset (block
 * size 16, f32 KV), batched in one scheduler, and writes the generated ids to
 * out[i * max_tokens ..]. Returns 0 or a TANDEM_E* code. */
int h_reference(const uint32_t *const *prompts, const int *lens, int n, int max_tokens,
                uint32_t *out);

/* Milliseconds since an arbitrary start (monotonic). */
double h_ms(void);
void h_sleep_ms(int ms);

/* nng_close(s), given up on after 5 s: Debian's NNG 1.5 can deadlock in a
 * close while pipes come and go (nanomsg/nng#1543, #1813; router/main.c and
 * common/watchdog.h meet the same), and a test must not hang on it. The close
 * runs on a thread of its own; a blocked one is reported on stderr and left
 * behind (the process exits without waiting for it). Returns 0, or -1 when
 * the close was abandoned. */
int h_nng_close(nng_socket s);

#endif
