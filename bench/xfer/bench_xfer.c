/* bench_xfer: KV transfer between real tandem-prefill and tandem-decode
 * processes (docs/performance.md, "## KV transfer (workers)").
 *
 * Sections (--sections, comma-separated; default all):
 *   tiny     P -> D throughput of tiny-model KV (128 KiB blocks at f32) for a
 *            long prompt whose blocks P already holds in its prefix cache, so
 *            that every block leaves in one burst after one small chunk; D's
 *            pool fits one prompt and two prompts alternate, so every block
 *            crosses. Against raw NNG PUSH/PULL of the same message size and
 *            count, measured right after in the same run, with glibc's
 *            default allocator settings and with the workers' (tune_malloc);
 *   sim      the same for sim payloads (--sim-model, --sim-payloads) at time
 *            scale 0 (no modelled sleep, no link model);
 *   overlap  a cold multi-chunk tiny prompt: time from P's last chunk
 *            computed to D holding every block, against the time the worker
 *            path takes to ship one chunk's blocks on their own.
 *
 * Worker-path time = from P's on_blocks_ready for the chunk (computed, before
 * the first frame is built) to D installing the last block, from the
 * monotonic timestamps both workers log at debug level (module "xfer");
 * bytes = D's tandem:kv_bytes_received_total delta. Raw = from the first
 * nng_sendmsg (alloc + copy of the payload from distinct sources, as P does)
 * to the receiver's last nng_recvmsg, between two child processes (this
 * executable re-run with --raw-send / --raw-recv), after a warm-up batch on
 * the same connection. CPU = on-CPU time of every thread of P and D over
 * the request, and of the raw pair over the timed batch (schedstat).
 *
 * TANDEM_BIN_DIR selects the worker binaries (default: this executable's
 * directory); XB_KEEP_LOGS=1 keeps the workers' logs.
 *
 *   cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release && cmake --build build-rel
 *   ./build-rel/bin/bench_xfer [--runs 5] [--sections tiny,sim,overlap]
 *       [--transports ipc,tcp] [--tokens 3000] [--sim-model llama-3-70b]
 *       [--sim-payloads full,1/4,1/16,1/64] [--overlap-tokens 2048]
 *
 * Each figure is the median over --runs; the transports alternate within a
 * run so the two are measured side by side. */
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/transport/tcp/tcp.h>

#include "bench_util.h"
#include "xb.h"

extern char **environ;

#define MAX_RUNS   32
#define MAX_CHUNKS 512
#define RAW_BUF    256 /* NNG buffers, as the workers' peer and data sockets */
#define FRAME_HDR  64  /* frame prefix + envelope + KV header, rounded up */
#define TOK_LO     3
#define TOK_HI     259

struct opts {
    int runs;
    int tokens;
    int overlap_tokens;
    char sections[128];
    char transports[64];
    char sim_model[64];
    char sim_payloads[128];
};

static uint64_t next_id = 1000;

static int has_word(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += n) {
        if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ',')) {
            return 1;
        }
    }
    return 0;
}

/* ---- Raw NNG PUSH/PULL -------------------------------------------------- */

static double now_s(void)
{
    return ctl_now();
}

/* The allocator settings the workers use (worker_main): freed message
 * memory stays in the heap instead of going back to the kernel and being
 * faulted in again on the next burst. */
static void malloc_tuned(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

/* The receiver (child): listens on url, prints "READY <url>", receives
 * count messages (warm-up), prints "WARM", receives count more (the timed
 * batch), prints the monotonic times of its first and last message and
 * waits for EOF on stdin (so that the parent can read its CPU time). */
static int raw_recv(const char *url, size_t size, int count)
{
    nng_socket s;
    nng_listener l;
    if (nng_pull0_open(&s) != 0 || nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0) != 0 ||
        nng_socket_set_int(s, NNG_OPT_RECVBUF, RAW_BUF) != 0 ||
        nng_listener_create(&l, s, url) != 0 || nng_listener_start(l, 0) != 0) {
        fprintf(stderr, "raw-recv: cannot listen on %s\n", url);
        return 1;
    }
    if (strncmp(url, "tcp://", 6) == 0) {
        int port = 0;
        nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port);
        printf("READY tcp://127.0.0.1:%d\n", port);
    } else {
        printf("READY %s\n", url);
    }
    fflush(stdout);
    double t_first = 0, t_last = 0;
    for (int i = 0; i < 2 * count; i++) {
        nng_msg *m;
        int rv = nng_recvmsg(s, &m, 0);
        if (rv != 0) {
            fprintf(stderr, "raw-recv: %s\n", nng_strerror(rv));
            return 1;
        }
        t_last = now_s();
        if (i == count) {
            t_first = t_last;
        }
        if (nng_msg_len(m) != size) {
            fprintf(stderr, "raw-recv: message of %zu bytes, expected %zu\n", nng_msg_len(m), size);
            return 1;
        }
        nng_msg_free(m);
        if (i == count - 1) {
            printf("WARM\n");
            fflush(stdout);
        }
    }
    printf("%.9f %.9f\n", t_first, t_last);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    nng_close(s);
    return 0;
}

/* Message i is a copy of src[i * size ..]: distinct sources, as P copies
 * distinct pool blocks (one hot buffer would be an unfair L2/L3 hit). */
static int send_batch(nng_socket s, const uint8_t *src, size_t size, int count)
{
    for (int i = 0; i < count; i++) {
        nng_msg *m;
        if (nng_msg_alloc(&m, size) != 0) {
            return -1;
        }
        memcpy(nng_msg_body(m), src + (size_t)i * size, size);
        int rv = nng_sendmsg(s, m, 0);
        if (rv != 0) {
            nng_msg_free(m);
            fprintf(stderr, "raw-send: %s\n", nng_strerror(rv));
            return -1;
        }
    }
    return 0;
}

/* The sender (child): dials url, sends a warm-up batch of count messages
 * of size bytes (alloc + copy of the payload, as P frames a block), waits
 * for a byte on stdin (the receiver has drained the warm-up), prints the
 * monotonic time and sends the timed batch; then waits for EOF on stdin
 * before closing (a close could drop what NNG still buffers). */
static int raw_send(const char *url, size_t size, int count)
{
    nng_socket s;
    size_t total = size * (size_t)count;
    uint8_t *src = malloc(total);
    if (src == NULL) {
        return 1;
    }
    for (size_t i = 0; i < total; i++) {
        src[i] = (uint8_t)(i * 131u + 7u);
    }
    if (nng_push0_open(&s) != 0 || nng_socket_set_int(s, NNG_OPT_SENDBUF, RAW_BUF) != 0 ||
        nng_dial(s, url, NULL, 0) != 0) {
        fprintf(stderr, "raw-send: cannot dial %s\n", url);
        return 1;
    }
    if (send_batch(s, src, size, count) != 0) {
        return 1;
    }
    char c;
    if (read(0, &c, 1) != 1) {
        return 1;
    }
    printf("%.9f\n", now_s());
    fflush(stdout);
    if (send_batch(s, src, size, count) != 0) {
        return 1;
    }
    while (read(0, &c, 1) > 0) {
    }
    nng_close(s);
    free(src);
    return 0;
}

/* Starts this executable with argv; its stdout (and stdin, when in_fd is
 * not NULL) are pipes. Returns the pid or -1. */
static pid_t spawn_self(char *const *argv, FILE **out, int *in_fd)
{
    int o[2], i[2] = {-1, -1};
    if (pipe(o) != 0) {
        return -1;
    }
    if (in_fd != NULL && pipe(i) != 0) {
        close(o[0]);
        close(o[1]);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, o[1], 1);
    posix_spawn_file_actions_addclose(&fa, o[0]);
    if (in_fd != NULL) {
        posix_spawn_file_actions_adddup2(&fa, i[0], 0);
        posix_spawn_file_actions_addclose(&fa, i[1]);
    }
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(o[1]);
    if (in_fd != NULL) {
        close(i[0]);
    }
    if (rc != 0) {
        close(o[0]);
        if (in_fd != NULL) {
            close(i[1]);
        }
        return -1;
    }
    *out = fdopen(o[0], "r");
    if (in_fd != NULL) {
        *in_fd = i[1];
    }
    return pid;
}

static void reap(pid_t pid, int kill_it)
{
    if (pid <= 0) {
        return;
    }
    if (kill_it) {
        kill(pid, SIGKILL);
    }
    int status;
    waitpid(pid, &status, 0);
}

/* Raw PUSH/PULL throughput of count messages of size bytes over transport
 * ("ipc" or "tcp") between two child processes, in GB/s (1e9 bytes); with
 * tuned, both use the workers' allocator settings. Returns 0 or -1. */
static int raw_run(const char *transport, size_t size, int count, int tuned, double *gbps,
                   double *cpu_s)
{
    static int serial;
    char url[H_URL_MAX];
    if (strcmp(transport, "ipc") == 0) {
        char name[32];
        snprintf(name, sizeof(name), "raw-%d", serial++);
        h_ipc_url(url, sizeof(url), name);
    } else {
        snprintf(url, sizeof(url), "tcp://127.0.0.1:0");
    }
    char size_s[32], count_s[32];
    snprintf(size_s, sizeof(size_s), "%zu", size);
    snprintf(count_s, sizeof(count_s), "%d", count);
    const char *mode = tuned ? "tuned" : "default";
    char *const rargv[] = {"bench_xfer", "--raw-recv", url, size_s, count_s, (char *)mode, NULL};
    FILE *rout = NULL, *sout = NULL;
    int sin = -1, rin = -1, ok = 0;
    pid_t spid = -1;
    pid_t rpid = spawn_self(rargv, &rout, &rin);
    uint64_t c0 = 0;
    char line[H_URL_MAX + 16];
    double t0 = 0, t_first = 0, t_last = 0;
    if (rpid < 0 || rout == NULL || fgets(line, sizeof(line), rout) == NULL ||
        strncmp(line, "READY ", 6) != 0) {
        goto out;
    }
    line[strcspn(line, "\n")] = '\0';
    char *const sargv[] = {"bench_xfer", "--raw-send", line + 6, size_s,
                           count_s,      (char *)mode, NULL};
    spid = spawn_self(sargv, &sout, &sin);
    if (spid < 0 || sout == NULL || fgets(line, sizeof(line), rout) == NULL ||
        strncmp(line, "WARM", 4) != 0) {
        goto out;
    }
    c0 = xb_cpu_ns(spid) + xb_cpu_ns(rpid);
    if (write(sin, "g", 1) != 1 || fgets(line, sizeof(line), sout) == NULL ||
        sscanf(line, "%lf", &t0) != 1) {
        goto out;
    }
    if (fgets(line, sizeof(line), rout) == NULL ||
        sscanf(line, "%lf %lf", &t_first, &t_last) != 2) {
        goto out;
    }
    *cpu_s = (double)(xb_cpu_ns(spid) + xb_cpu_ns(rpid) - c0) * 1e-9;
    *gbps = (double)size * count / (t_last - t0) / 1e9;
    ok = 1;
out:
    if (sin >= 0) {
        close(sin);
    }
    if (rin >= 0) {
        close(rin);
    }
    reap(spid, !ok);
    reap(rpid, !ok);
    if (sout != NULL) {
        fclose(sout);
    }
    if (rout != NULL) {
        fclose(rout);
    }
    if (!ok) {
        fprintf(stderr, "raw: %s run of %d x %zu bytes failed\n", transport, count, size);
    }
    return ok ? 0 : -1;
}

/* ---- Worker path -------------------------------------------------------- */

struct xfer {
    double gbps;
    double secs;    /* P chunk ready -> D last block installed */
    double cpu_s;   /* CPU of P and D (every thread) over the whole request */
    double frame_s; /* P building and queueing the frames */
    double first_s; /* P chunk ready -> D first block installed */
    double job_s;   /* D's tandem:kv_transfer_seconds (PrefillJob sent -> installed) */
    double bytes;
    int blocks;
    int chunks;
};

/* Runs prompt on D (prefilled by P) for one token and measures the transfer
 * of its last chunk's blocks. Returns 0 or -1. */
static int measure(struct xb_worker *P, struct xb_worker *D, const uint32_t *prompt, int n,
                   struct xfer *x)
{
    uint64_t id = next_id++;
    double b0 = h_proc_metric(&D->p, "tandem:kv_bytes_received_total");
    double j0 = h_proc_metric(&D->p, "tandem:kv_transfer_seconds_sum");
    struct ctl_stream st;
    uint64_t c0 = xb_cpu_ns(P->p.pid) + xb_cpu_ns(D->p.pid);
    int rc = xb_request(D, id, prompt, n, 1, P->p.kv, &st);
    x->cpu_s = (double)(xb_cpu_ns(P->p.pid) + xb_cpu_ns(D->p.pid) - c0) * 1e-9;
    ctl_stream_fini(&st);
    if (rc != 0) {
        return -1;
    }
    static struct xb_chunk ch[MAX_CHUNKS];
    int nc = xb_p_chunks(P->log, id, ch, MAX_CHUNKS);
    double t_first, t_last;
    int nb;
    if (nc == 0 || xb_d_installed(D->log, id, &t_first, &t_last, &nb) != 0) {
        fprintf(stderr, "no xfer timestamps for request %" PRIu64 " (logs %s, %s)\n", id, P->log,
                D->log);
        return -1;
    }
    const struct xb_chunk *last = &ch[nc - 1];
    x->bytes = h_proc_metric(&D->p, "tandem:kv_bytes_received_total") - b0;
    x->job_s = h_proc_metric(&D->p, "tandem:kv_transfer_seconds_sum") - j0;
    x->secs = t_last - last->t_ready;
    x->frame_s = last->t_framed - last->t_ready;
    x->first_s = t_first - ch[0].t_ready;
    x->blocks = nb;
    x->chunks = nc;
    x->gbps = x->bytes / x->secs / 1e9;
    return 0;
}

static const char *kv_url(const char *transport, const char *name, char *buf, size_t cap)
{
    if (strcmp(transport, "ipc") == 0) {
        h_ipc_url(buf, cap, name);
    } else {
        snprintf(buf, cap, "tcp://127.0.0.1:0");
    }
    return buf;
}

static void print_load(const char *when)
{
    char load[96];
    bench_loadavg(load, sizeof(load));
    printf("# %s: %s\n", when, load);
    fflush(stdout);
}

/* Decode workers (one per transport) that all run with extra flags. */
struct dset {
    int n;
    char names[2][8];
    struct xb_worker d[2];
};

static int start_decoders(struct dset *ds, const struct opts *o, const char *tag,
                          const char *const *extra)
{
    memset(ds, 0, sizeof(*ds));
    const char *ts[2] = {"ipc", "tcp"};
    for (int i = 0; i < 2; i++) {
        if (!has_word(o->transports, ts[i])) {
            continue;
        }
        char url[H_URL_MAX], name[64];
        snprintf(name, sizeof(name), "%s-d-%s", tag, ts[i]);
        kv_url(ts[i], name, url, sizeof(url));
        const char *args[32] = {"--kv", url, "--log-level", "debug"};
        int k = 4;
        for (int j = 0; extra[j] != NULL && k < 31; j++) {
            args[k++] = extra[j];
        }
        args[k] = NULL;
        if (xb_spawn(&ds->d[ds->n], "tandem-decode", args, name, 1) != 0) {
            return -1;
        }
        snprintf(ds->names[ds->n], sizeof(ds->names[0]), "%s", ts[i]);
        ds->n++;
    }
    return ds->n > 0 ? 0 : -1;
}

static void stop_decoders(struct dset *ds)
{
    for (int i = 0; i < ds->n; i++) {
        xb_stop(&ds->d[i]);
    }
}

/* Per transport results of one configuration. */
struct series {
    double raw[MAX_RUNS];  /* raw NNG, glibc's default allocator settings */
    double rawt[MAX_RUNS]; /* raw NNG, the workers' allocator settings */
    double wk[MAX_RUNS], ratio[MAX_RUNS], ratiot[MAX_RUNS], secs[MAX_RUNS], frame[MAX_RUNS],
        first[MAX_RUNS], job[MAX_RUNS];
    double cpu_wk[MAX_RUNS], cpu_raw[MAX_RUNS]; /* CPU ms: P + D, sender + receiver (tuned) */
    int n;
    double bytes;
    int blocks;
};

static void print_runs(const char *what, const double *v, int n)
{
    printf("#   %s:", what);
    for (int i = 0; i < n; i++) {
        printf(" %.2f", v[i]);
    }
    printf("\n");
}

static void report(const char *label, const char *transport, struct series *s)
{
    if (s->n == 0) {
        printf("| %s | %s | (no runs) |\n", label, transport);
        return;
    }
    print_runs("worker / raw (default malloc)", s->ratio, s->n);
    print_runs("worker / raw (tuned malloc)", s->ratiot, s->n);
    printf("| %s | %s | %d x %.0f B = %.1f MiB | %.2f | %.2f | %.2f | %.2f | **%.2f** | %.2f ms | "
           "%.2f ms | %.2f ms | %.2f ms | %.1f / %.1f ms |\n",
           label, transport, s->blocks, s->bytes / s->blocks, s->bytes / (1 << 20),
           bench_median(s->raw, s->n), bench_median(s->rawt, s->n), bench_median(s->wk, s->n),
           bench_median(s->ratio, s->n), bench_median(s->ratiot, s->n),
           1e3 * bench_median(s->secs, s->n), 1e3 * bench_median(s->frame, s->n),
           1e3 * bench_median(s->first, s->n), 1e3 * bench_median(s->job, s->n),
           bench_median(s->cpu_wk, s->n), bench_median(s->cpu_raw, s->n));
    fflush(stdout);
}

static void header(void)
{
    printf("| KV | transport | blocks x bytes | raw GB/s (default malloc) | raw GB/s (tuned) | "
           "worker GB/s | worker / raw default | worker / raw tuned | worker time | P framing | "
           "to 1st installed | D kv_transfer_seconds | CPU: P+D request / raw pair |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

/* runs x (for each transport: the worker path, then both raw variants).
 * Prompt r % 2 of the two that P holds; D's pool fits one prompt, so the
 * other one is never in D's cache (every block crosses). */
static int measure_runs(const struct opts *o, struct xb_worker *P, struct dset *ds,
                        uint32_t *const *prompts, int n_prompt, struct series *out)
{
    for (int r = 0; r < o->runs; r++) {
        for (int t = 0; t < ds->n; t++) {
            struct series *s = &out[t];
            struct xfer x;
            if (measure(P, &ds->d[t], prompts[r % 2], n_prompt, &x) != 0) {
                return -1;
            }
            size_t frame = (size_t)(x.bytes / x.blocks) + FRAME_HDR;
            double raw, rawt, c_def, c_tuned;
            /* Alternate which raw variant goes first. */
            int tf = r % 2;
            if (raw_run(ds->names[t], frame, x.blocks, tf, tf ? &rawt : &raw,
                        tf ? &c_tuned : &c_def) != 0 ||
                raw_run(ds->names[t], frame, x.blocks, !tf, tf ? &raw : &rawt,
                        tf ? &c_def : &c_tuned) != 0) {
                return -1;
            }
            s->cpu_wk[s->n] = 1e3 * x.cpu_s;
            s->cpu_raw[s->n] = 1e3 * c_tuned;
            s->raw[s->n] = raw;
            s->rawt[s->n] = rawt;
            s->wk[s->n] = x.gbps;
            s->ratio[s->n] = x.gbps / raw;
            s->ratiot[s->n] = x.gbps / rawt;
            s->secs[s->n] = x.secs;
            s->frame[s->n] = x.frame_s;
            s->first[s->n] = x.first_s;
            s->job[s->n] = x.job_s;
            s->bytes = x.bytes;
            s->blocks = x.blocks;
            s->n++;
            if (x.chunks != 1) {
                printf("# note: request took %d chunks at P (expected 1)\n", x.chunks);
            }
        }
    }
    return 0;
}

static uint32_t **make_prompts(int count, int n, uint64_t seed)
{
    uint32_t **p = calloc((size_t)count, sizeof(*p));
    for (int i = 0; p != NULL && i < count; i++) {
        p[i] = malloc((size_t)n * sizeof(**p));
        if (p[i] == NULL) {
            return NULL;
        }
        h_prompt(p[i], n, seed + (uint64_t)i, TOK_LO, TOK_HI);
    }
    return p;
}

static void free_prompts(uint32_t **p, int count)
{
    for (int i = 0; p != NULL && i < count; i++) {
        free(p[i]);
    }
    free(p);
}

/* Untimed: a short request (connects the data links both ways), then both
 * prompts, if any (P computes them once and holds them; D's pool pages get
 * faulted in). */
static int warm_decoder(struct xb_worker *P, struct xb_worker *D, uint32_t *const *prompts, int n,
                        uint64_t seed)
{
    uint32_t small[64];
    h_prompt(small, 64, seed, TOK_LO, TOK_HI);
    struct ctl_stream st;
    int rc = xb_request(D, next_id++, small, 64, 1, P->p.kv, &st);
    ctl_stream_fini(&st);
    for (int i = 0; rc == 0 && prompts != NULL && i < 2; i++) {
        rc = xb_request(D, next_id++, prompts[i], n, 1, P->p.kv, &st);
        ctl_stream_fini(&st);
    }
    return rc;
}

/* One throughput configuration: P with pargs, a D per transport with
 * dextra, two n-token prompts whose blocks P holds. D's pool is exactly one
 * prompt's blocks, so consecutive requests alternate between the two and
 * each evicts the other from D entirely. */
static int run_config(const struct opts *o, const char *label, const char *tag,
                      const char *const *pargs, const char *const *dextra, int n, uint64_t seed)
{
    uint32_t **prompts = make_prompts(2, n, seed);
    if (prompts == NULL) {
        return -1;
    }
    struct xb_worker P;
    struct dset ds;
    int rc = -1;
    char ptag[80];
    snprintf(ptag, sizeof(ptag), "%s-p", tag);
    if (xb_spawn(&P, "tandem-prefill", pargs, ptag, 0) != 0) {
        goto out_prompts;
    }
    if (start_decoders(&ds, o, tag, dextra) != 0) {
        goto out_d;
    }
    double t = now_s();
    for (int i = 0; i < ds.n; i++) {
        if (warm_decoder(&P, &ds.d[i], prompts, n, seed + 77 + (uint64_t)i) != 0) {
            goto out_d;
        }
    }
    printf("# %s: warm-up (P computes both prompts once) %.1f s\n", label, now_s() - t);
    static struct series s[2];
    memset(s, 0, sizeof(s));
    if (measure_runs(o, &P, &ds, prompts, n, s) != 0) {
        goto out_d;
    }
    for (int i = 0; i < ds.n; i++) {
        report(label, ds.names[i], &s[i]);
    }
    rc = 0;
out_d:
    stop_decoders(&ds);
    xb_stop(&P);
out_prompts:
    free_prompts(prompts, 2);
    return rc;
}

static int section_tiny(const struct opts *o)
{
    int n = o->tokens;
    int blocks = (n + 15) / 16;
    char pblocks[32], dblocks[32];
    snprintf(pblocks, sizeof(pblocks), "%d", 3 * blocks + 64);
    /* Room for the prompt and the first token, no more (run_config). */
    snprintf(dblocks, sizeof(dblocks), "%d", n / 16 + 1);
    const char *pargs[] = {
        "--kv", "tcp://127.0.0.1:0", "--kv-blocks", pblocks, "--log-level", "debug", NULL};
    const char *dextra[] = {"--kv-blocks", dblocks, NULL};
    printf("\n## tiny: %d-token prompt (%d blocks), P holds it in its prefix cache\n", n, blocks);
    print_load("start");
    header();
    int rc = run_config(o, "tiny f32", "tiny", pargs, dextra, n, 5000);
    print_load("end");
    return rc;
}

static int section_sim_one(const struct opts *o, const char *payload)
{
    /* Full 70B blocks are 5 MiB: 64 of them (1016 tokens) make 320 MiB;
     * smaller payloads ship 256 blocks (4088 tokens). The partial last block
     * leaves D room for the first token in a pool of exactly the prompt. */
    int blocks = strcmp(payload, "full") == 0 ? 64 : 256;
    int n = 16 * blocks - 8;
    char pblocks[32], dblocks[32];
    snprintf(pblocks, sizeof(pblocks), "%d", 2 * blocks + 16);
    snprintf(dblocks, sizeof(dblocks), "%d", blocks);
    /* tp 4: the 70B weights do not fit one GPU; blocks are whole-model
     * blocks either way. */
#define SIM_FLAGS(kvb)                                                                             \
    "--backend", "sim", "--model", o->sim_model, "--tp", "4", "--payload", payload,                \
        "--time-scale", "0", "--token-budget", "8192", "--max-prefill-chunk", "8192",              \
        "--kv-blocks", kvb
    const char *pargs[] = {"--kv",  "tcp://127.0.0.1:0", "--log-level",
                           "debug", SIM_FLAGS(pblocks),  NULL};
    const char *dextra[] = {SIM_FLAGS(dblocks), NULL};
#undef SIM_FLAGS
    char tag[64], label[128];
    snprintf(tag, sizeof(tag), "sim-%s", payload);
    for (char *c = tag; *c; c++) {
        if (*c == '/') {
            *c = '_';
        }
    }
    snprintf(label, sizeof(label), "sim %s bf16, payload %s", o->sim_model, payload);
    return run_config(o, label, tag, pargs, dextra, n, 9000);
}

static int section_sim(const struct opts *o)
{
    printf("\n## sim: %s at time scale 0, one chunk per request\n", o->sim_model);
    print_load("start");
    header();
    char list[128];
    snprintf(list, sizeof(list), "%s", o->sim_payloads);
    char *save = NULL;
    for (char *p = strtok_r(list, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
        if (section_sim_one(o, p) != 0) {
            return -1;
        }
    }
    print_load("end");
    return 0;
}

static int section_overlap(const struct opts *o)
{
    int n = o->overlap_tokens;
    int chunk = 128; /* the tiny default token budget = max prefill chunk */
    int blocks = (n + 15) / 16;
    int count = 2 * o->runs + 1; /* a cold prompt per run and transport, one to warm up */
    uint32_t **cold = make_prompts(count, n, 13000);
    uint32_t **one = make_prompts(o->runs, chunk, 17000);
    if (cold == NULL || one == NULL) {
        return -1;
    }
    char dblocks[32];
    snprintf(dblocks, sizeof(dblocks), "%d", blocks + 16);
    struct xb_worker P, W;
    struct dset ds;
    int rc = -1;
    const char *pargs[] = {"--kv", "tcp://127.0.0.1:0", "--log-level", "debug", NULL};
    const char *wargs[] = {"--kv", "tcp://127.0.0.1:0", NULL};
    const char *dextra[] = {"--kv-blocks", dblocks, NULL};
    printf("\n## overlap: cold %d-token prompt, %d-token chunks (%d blocks each)\n", n, chunk,
           chunk / 16);
    print_load("start");
    if (xb_spawn(&P, "tandem-prefill", pargs, "ov-p", 0) != 0) {
        goto out_prompts;
    }
    if (xb_spawn(&W, "tandem-decode", wargs, "ov-warm", 1) != 0) {
        goto out_p;
    }
    if (start_decoders(&ds, o, "ov", dextra) != 0) {
        goto out_d;
    }
    for (int i = 0; i < ds.n; i++) {
        if (warm_decoder(&P, &ds.d[i], NULL, n, 55 + (uint64_t)i) != 0) {
            goto out_d;
        }
    }
    double tail[2][MAX_RUNS], ship[2][MAX_RUNS], ratio[2][MAX_RUNS], prefill[2][MAX_RUNS],
        lag[2][MAX_RUNS];
    int nr = 0;
    for (int r = 0; r < o->runs; r++) {
        for (int t = 0; t < ds.n; t++) {
            struct xb_worker *D = &ds.d[t];
            /* One chunk on its own: P holds it (warmed through W), so its
             * 8 blocks leave in one burst after a small recompute. */
            struct ctl_stream st;
            if (t == 0) {
                int e = xb_request(&W, next_id++, one[r], chunk, 1, P.p.kv, &st);
                ctl_stream_fini(&st);
                if (e != 0) {
                    goto out_d;
                }
            }
            struct xfer a, b;
            if (measure(&P, D, one[r], chunk, &a) != 0) {
                goto out_d;
            }
            uint64_t id = next_id;
            if (measure(&P, D, cold[1 + 2 * r + t], n, &b) != 0) {
                goto out_d;
            }
            static struct xb_chunk ch[MAX_CHUNKS];
            int nc = xb_p_chunks(P.log, id, ch, MAX_CHUNKS);
            tail[t][r] = b.secs;
            ship[t][r] = a.secs;
            ratio[t][r] = b.secs / a.secs;
            prefill[t][r] = ch[nc - 1].t_ready - ch[0].t_ready;
            lag[t][r] = b.first_s;
            if (b.chunks != blocks * 16 / chunk || ch[nc - 1].end - ch[nc - 1].first != a.blocks) {
                printf("# note: %d chunks, last of %d blocks; the one-chunk request shipped %d\n",
                       b.chunks, ch[nc - 1].end - ch[nc - 1].first, a.blocks);
            }
        }
        nr++;
    }
    printf("| transport | P prefill (first to last chunk) | P first chunk -> D first block | "
           "last chunk -> D holds all | one chunk alone | tail / one chunk |\n");
    printf("|---|---|---|---|---|---|\n");
    for (int t = 0; t < ds.n; t++) {
        double rmax = 0;
        for (int r = 0; r < nr; r++) {
            rmax = ratio[t][r] > rmax ? ratio[t][r] : rmax;
        }
        printf("| %s | %.0f ms | %.2f ms | %.2f ms | %.2f ms | **%.2f** (max %.2f) |\n",
               ds.names[t], 1e3 * bench_median(prefill[t], nr), 1e3 * bench_median(lag[t], nr),
               1e3 * bench_median(tail[t], nr), 1e3 * bench_median(ship[t], nr),
               bench_median(ratio[t], nr), rmax);
        printf("#   runs: tail/chunk");
        for (int r = 0; r < nr; r++) {
            printf(" %.2f", ratio[t][r]);
        }
        printf("\n");
    }
    print_load("end");
    rc = 0;
out_d:
    stop_decoders(&ds);
    xb_stop(&W);
out_p:
    xb_stop(&P);
out_prompts:
    free_prompts(cold, count);
    free_prompts(one, o->runs);
    return rc;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_xfer [--runs N] [--sections tiny,sim,overlap] [--transports ipc,tcp]\n"
            "                  [--tokens N] [--sim-model NAME] [--sim-payloads full,1/4,...]\n"
            "                  [--overlap-tokens N]\n");
}

int main(int argc, char **argv)
{
    if (argc == 6 && (strcmp(argv[1], "--raw-recv") == 0 || strcmp(argv[1], "--raw-send") == 0)) {
        if (strcmp(argv[5], "tuned") == 0) {
            malloc_tuned();
        }
        size_t size = (size_t)strtoull(argv[3], NULL, 10);
        int count = atoi(argv[4]);
        return argv[1][6] == 'r' ? raw_recv(argv[2], size, count) : raw_send(argv[2], size, count);
    }
    struct opts o = {.runs = 5, .tokens = 3000, .overlap_tokens = 2048};
    snprintf(o.sections, sizeof(o.sections), "tiny,sim,overlap");
    snprintf(o.transports, sizeof(o.transports), "ipc,tcp");
    snprintf(o.sim_model, sizeof(o.sim_model), "llama-3-70b");
    snprintf(o.sim_payloads, sizeof(o.sim_payloads), "full,1/4,1/16,1/64");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            usage();
            return 2;
        }
        i++;
        if (strcmp(a, "--runs") == 0) {
            o.runs = atoi(v);
        } else if (strcmp(a, "--tokens") == 0) {
            o.tokens = atoi(v);
        } else if (strcmp(a, "--overlap-tokens") == 0) {
            o.overlap_tokens = atoi(v);
        } else if (strcmp(a, "--sections") == 0) {
            snprintf(o.sections, sizeof(o.sections), "%s", v);
        } else if (strcmp(a, "--transports") == 0) {
            snprintf(o.transports, sizeof(o.transports), "%s", v);
        } else if (strcmp(a, "--sim-model") == 0) {
            snprintf(o.sim_model, sizeof(o.sim_model), "%s", v);
        } else if (strcmp(a, "--sim-payloads") == 0) {
            snprintf(o.sim_payloads, sizeof(o.sim_payloads), "%s", v);
        } else {
            usage();
            return 2;
        }
    }
    if (o.runs < 1 || o.runs > MAX_RUNS || o.tokens < 32 || o.overlap_tokens < 256) {
        usage();
        return 2;
    }
    xb_init();
    printf("# bench_xfer: %d runs, medians; worker time = P chunk computed -> D last block "
           "installed\n",
           o.runs);
    int rc = 0;
    if (rc == 0 && has_word(o.sections, "tiny")) {
        rc = section_tiny(&o);
    }
    if (rc == 0 && has_word(o.sections, "sim")) {
        rc = section_sim(&o);
    }
    if (rc == 0 && has_word(o.sections, "overlap")) {
        rc = section_overlap(&o);
    }
    h_cleanup_all();
    nng_fini();
    return rc == 0 ? 0 : 1;
}
