/* bench_handoff: how long the KV of one prompt takes to land on a decode
 * worker that is busy decoding other requests, against the same worker idle
 * (docs/performance.md, "### KV hand-off to a busy decode worker").
 *
 * Real tandem-prefill and tandem-decode processes, sim backend at time scale
 * 1 (every step sleeps its modelled time), by default experiment 1a's
 * instances: llama-3-70b on h100-sxm, TP 4, ib-400g link, BF16 KV, over
 * loopback TCP. Each run sends D, on its control link:
 *   idle  one request prefilled by P (--tokens, 4 output tokens);
 *   busy  --busy requests prefilled locally (64-token prompts, long
 *         outputs), and once each of them streams tokens (D is decoding), the
 *         same kind of request as idle; then the background ones are
 *         cancelled.
 * Figures per request, from the send of its DecodeJob: P computed the
 * prompt's KV (the sim computes at once, then sleeps the modelled prefill
 * time, ~85 ms here, before the frames leave), D's first and last KV block
 * installed (the workers' debug "xfer" timestamps), the first token at the
 * client; and D's tandem:kv_transfer_seconds for it (PrefillJob sent ->
 * every block installed, from /metrics).
 *
 * --before DIR also runs the worker binaries in DIR (a build of an earlier
 * commit) as a second pair of processes, measured in the same runs with the
 * setups taking turns, so the two are compared side by side under the same
 * machine load.
 *
 *   ./build/bin/bench_handoff [--runs 5] [--tokens 1024] [--busy 8]
 *       [--model llama-3-70b] [--tp 4] [--gpu h100-sxm] [--link ib-400g]
 *       [--transport tcp|ipc] [--before DIR]
 *
 * TANDEM_BIN_DIR selects the binaries measured as "after" (default: this
 * executable's directory); XB_KEEP_LOGS=1 keeps the workers' logs. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "tandem_err.h"
#include "xb.h"

#define MAX_RUNS     32
#define MAX_BUSY     64
#define BUSY_PROMPT  64
#define BUSY_OUTPUT  4000 /* longer than any measurement: cancelled after it */
#define MEASURED_OUT 4
#define RECV_TIMEO   100 /* ms per nng_recvmsg while waiting */

struct opts {
    int runs, tokens, busy;
    const char *model, *tp, *gpu, *link, *transport, *before;
};

/* One pair of processes: P and D from one binary directory. */
struct setup {
    const char *label;
    char bin_dir[XB_PATH_MAX];
    struct xb_worker P, D;
    int up;
};

/* One measured request; times in seconds from the send, NAN when absent. */
struct sample {
    double p_last, d_first, d_last, ttft, kv_transfer;
    int blocks;
};

static uint64_t next_id = 1;

/* Receives on s and feeds the streams until done(arg) or timeout_ms. */
static int pump(nng_socket s, struct ctl_stream *st, int n, int (*done)(struct ctl_stream *, int),
                int timeout_ms)
{
    double deadline = ctl_now() + timeout_ms / 1e3;
    while (!done(st, n)) {
        if (ctl_now() > deadline) {
            return TANDEM_ETIMEOUT;
        }
        nng_msg *msg;
        int rv = nng_recvmsg(s, &msg, 0);
        if (rv == NNG_ETIMEDOUT) {
            continue;
        }
        if (rv != 0) {
            return TANDEM_ENNG;
        }
        Tandem__Envelope *env;
        if (wire_unpack(nng_msg_body(msg), nng_msg_len(msg), &env) == 0) {
            for (int i = 0; i < n; i++) {
                if (ctl_stream_feed(&st[i], env) != TANDEM_ENOENT) {
                    break;
                }
            }
            wire_free(env);
        }
        nng_msg_free(msg);
    }
    return 0;
}

static int all_done(struct ctl_stream *st, int n)
{
    for (int i = 0; i < n; i++) {
        if (!st[i].done) {
            return 0;
        }
    }
    return 1;
}

/* Every background request is decoding: two tokens or more each. */
static int all_decoding(struct ctl_stream *st, int n)
{
    for (int i = 0; i < n; i++) {
        if (st[i].done || st[i].n_tokens < 2) {
            return st[i].done; /* one that ended early does not hold the wait */
        }
    }
    return 1;
}

static int measured_done(struct ctl_stream *st, int n)
{
    (void)n;
    return st[0].done;
}

static double transfer_metric(struct xb_worker *D, double *count)
{
    *count = h_proc_metric(&D->p, "tandem:kv_transfer_seconds_count");
    return h_proc_metric(&D->p, "tandem:kv_transfer_seconds_sum");
}

/* One measurement on setup x with n_busy requests decoding on D. */
static int measure(struct setup *x, const struct opts *o, int n_busy, uint64_t seed,
                   struct sample *out)
{
    static uint32_t busy_prompt[MAX_BUSY][BUSY_PROMPT];
    static struct ctl_stream bg[MAX_BUSY];
    struct ctl_job bj;
    ctl_job_init(&bj);
    bj.n_prompt = BUSY_PROMPT;
    bj.max_tokens = BUSY_OUTPUT;
    bj.ignore_eos = 1;
    nng_socket s = x->D.ctl;
    int rc = 0;
    for (int i = 0; i < n_busy; i++) {
        h_prompt(busy_prompt[i], BUSY_PROMPT, seed * 1000 + (uint64_t)i, 3, 30000);
        bj.prompt = busy_prompt[i];
        ctl_stream_init(&bg[i], next_id);
        if (rc == 0) {
            rc = ctl_send_job(s, next_id, &bj, 0);
        }
        next_id++;
    }
    if (rc == 0 && n_busy > 0) {
        rc = pump(s, bg, n_busy, all_decoding, 30000);
    }

    uint32_t *prompt = malloc((size_t)o->tokens * sizeof(*prompt));
    struct ctl_stream st;
    uint64_t id = next_id++;
    ctl_stream_init(&st, id);
    double c0 = 0, s0 = transfer_metric(&x->D, &c0);
    double t0 = ctl_now();
    if (rc == 0 && prompt != NULL) {
        h_prompt(prompt, o->tokens, seed, 3, 30000);
        struct ctl_job job;
        ctl_job_init(&job);
        job.prompt = prompt;
        job.n_prompt = o->tokens;
        job.max_tokens = MEASURED_OUT;
        job.ignore_eos = 1;
        job.prefill_address = x->P.p.kv;
        rc = ctl_send_job(s, id, &job, 0);
        if (rc == 0) {
            rc = pump(s, &st, 1, measured_done, 60000);
        }
    } else if (rc == 0) {
        rc = TANDEM_ENOMEM;
    }
    if (rc == 0 && (st.finish_reason != TANDEM__FINISH__REASON__LENGTH || st.error_code != 0 ||
                    st.n_tokens != MEASURED_OUT)) {
        fprintf(stderr, "bench_handoff: %s: request %" PRIu64 " finished %d with %d tokens (%s)\n",
                x->label, id, st.finish_reason, st.n_tokens, st.error);
        rc = TANDEM_EPROTO;
    }
    out->ttft = st.t_first > 0 ? st.t_first - t0 : NAN;
    double c1 = 0, s1 = transfer_metric(&x->D, &c1);
    out->kv_transfer = c1 - c0 == 1 ? s1 - s0 : NAN;
    ctl_stream_fini(&st);
    free(prompt);

    for (int i = 0; i < n_busy; i++) {
        if (!bg[i].done) {
            ctl_send_cancel(s, bg[i].id, 0);
        }
    }
    if (n_busy > 0 && pump(s, bg, n_busy, all_done, 30000) != 0 && rc == 0) {
        fprintf(stderr, "bench_handoff: %s: background requests did not end\n", x->label);
        rc = TANDEM_ETIMEOUT;
    }
    for (int i = 0; i < n_busy; i++) {
        ctl_stream_fini(&bg[i]);
    }
    if (rc != 0) {
        return rc;
    }

    static struct xb_chunk ch[64];
    int nc = xb_p_chunks(x->P.log, id, ch, 64);
    out->p_last = nc > 0 ? ch[nc - 1].t_ready - t0 : NAN;
    double d_first, d_last;
    if (xb_d_installed(x->D.log, id, &d_first, &d_last, &out->blocks) == 0) {
        out->d_first = d_first - t0;
        out->d_last = d_last - t0;
    } else {
        out->d_first = out->d_last = NAN;
        out->blocks = 0;
    }
    return 0;
}

static int start_setup(struct setup *x, const struct opts *o)
{
    char kv_p[H_URL_MAX], kv_d[H_URL_MAX], name_p[64], name_d[64];
    snprintf(name_p, sizeof(name_p), "handoff-%s-p", x->label);
    snprintf(name_d, sizeof(name_d), "handoff-%s-d", x->label);
    if (strcmp(o->transport, "ipc") == 0) {
        h_ipc_url(kv_p, sizeof(kv_p), name_p);
        h_ipc_url(kv_d, sizeof(kv_d), name_d);
    } else {
        snprintf(kv_p, sizeof(kv_p), "tcp://127.0.0.1:0");
        snprintf(kv_d, sizeof(kv_d), "tcp://127.0.0.1:0");
    }
    /* Experiment 1a's pools (deploy/clusters/sim-llama3-70b-h100-4p4d.yaml). */
    const char *pargs[] = {"--backend",  "sim",   "--model",        o->model,
                           "--gpu",      o->gpu,  "--tp",           o->tp,
                           "--link",     o->link, "--time-scale",   "1",
                           "--kv-dtype", "bf16",  "--token-budget", "8192",
                           "--kv",       kv_p,    "--log-level",    "debug",
                           NULL};
    const char *dargs[] = {
        "--backend",     "sim",    "--model", o->model,       "--gpu",       o->gpu,       "--tp",
        o->tp,           "--link", o->link,   "--time-scale", "1",           "--kv-dtype", "bf16",
        "--max-running", "256",    "--kv",    kv_d,           "--log-level", "debug",      NULL};
    setenv("TANDEM_BIN_DIR", x->bin_dir, 1);
    if (xb_spawn(&x->P, "tandem-prefill", pargs, name_p, 0) != 0) {
        return -1;
    }
    if (xb_spawn(&x->D, "tandem-decode", dargs, name_d, 1) != 0) {
        xb_stop(&x->P);
        return -1;
    }
    nng_socket_set_ms(x->D.ctl, NNG_OPT_RECVTIMEO, RECV_TIMEO);
    x->up = 1;
    /* Untimed: D and P dial each other's data links. */
    struct sample s;
    if (measure(x, o, 0, 1, &s) != 0) {
        return -1;
    }
    return 0;
}

static void stop_setup(struct setup *x)
{
    if (x->up) {
        xb_stop(&x->D);
        xb_stop(&x->P);
        x->up = 0;
    }
}

static void print_load(const char *when)
{
    char load[96];
    bench_loadavg(load, sizeof(load));
    printf("# %s: %s\n", when, load);
    fflush(stdout);
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.runs = 5,
                       .tokens = 1024,
                       .busy = 8,
                       .model = "llama-3-70b",
                       .tp = "4",
                       .gpu = "h100-sxm",
                       .link = "ib-400g",
                       .transport = "tcp"};
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) {
            return -1;
        }
        const char *a = argv[i], *v = argv[i + 1];
        if (strcmp(a, "--runs") == 0) {
            o->runs = atoi(v);
        } else if (strcmp(a, "--tokens") == 0) {
            o->tokens = atoi(v);
        } else if (strcmp(a, "--busy") == 0) {
            o->busy = atoi(v);
        } else if (strcmp(a, "--model") == 0) {
            o->model = v;
        } else if (strcmp(a, "--tp") == 0) {
            o->tp = v;
        } else if (strcmp(a, "--gpu") == 0) {
            o->gpu = v;
        } else if (strcmp(a, "--link") == 0) {
            o->link = v;
        } else if (strcmp(a, "--transport") == 0) {
            o->transport = v;
        } else if (strcmp(a, "--before") == 0) {
            o->before = v;
        } else {
            return -1;
        }
    }
    if (o->runs < 1 || o->runs > MAX_RUNS || o->tokens < 16 || o->busy < 1 || o->busy > MAX_BUSY ||
        (strcmp(o->transport, "tcp") != 0 && strcmp(o->transport, "ipc") != 0)) {
        return -1;
    }
    return 0;
}

/* "median (min-max)" of v[0..n) in ms. */
static void fmt_ms(char *out, size_t cap, double *v, int n)
{
    double lo = INFINITY, hi = -INFINITY;
    int k = 0;
    double tmp[MAX_RUNS];
    for (int i = 0; i < n; i++) {
        if (!isnan(v[i])) {
            tmp[k++] = v[i];
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
        }
    }
    if (k == 0) {
        snprintf(out, cap, "-");
        return;
    }
    snprintf(out, cap, "%.0f (%.0f-%.0f)", 1e3 * bench_median(tmp, k), 1e3 * lo, 1e3 * hi);
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: bench_handoff [--runs N] [--tokens N] [--busy N] [--model M] "
                        "[--tp N] [--gpu G] [--link L] [--transport tcp|ipc] [--before DIR]\n");
        return 2;
    }
    xb_init();
    struct setup setups[2];
    memset(setups, 0, sizeof(setups));
    int n_setups = 0;
    if (o.before != NULL) {
        setups[n_setups].label = "before";
        snprintf(setups[n_setups].bin_dir, XB_PATH_MAX, "%s", o.before);
        n_setups++;
    }
    setups[n_setups].label = o.before != NULL ? "after" : "this";
    const char *bin = getenv("TANDEM_BIN_DIR");
    snprintf(setups[n_setups].bin_dir, XB_PATH_MAX, "%s", bin != NULL ? bin : ".");
    n_setups++;

    printf("# bench_handoff: sim %s on %s TP %s (%s link), time scale 1, %d-token prompt "
           "P->D over %s; busy = %d requests decoding on D; %d runs\n",
           o.model, o.gpu, o.tp, o.link, o.tokens, o.transport, o.busy, o.runs);
    for (int k = 0; k < n_setups; k++) {
        printf("# %s: %s\n", setups[k].label, setups[k].bin_dir);
    }
    print_load("start");
    int rc = 1;
    for (int k = 0; k < n_setups; k++) {
        if (start_setup(&setups[k], &o) != 0) {
            goto out;
        }
    }
    /* [setup][idle 0 / busy 1][run] */
    static struct sample sm[2][2][MAX_RUNS];
    for (int r = 0; r < o.runs; r++) {
        for (int j = 0; j < n_setups; j++) {
            int k = (j + r) % n_setups; /* take turns going first */
            for (int busy = 0; busy < 2; busy++) {
                struct sample *s = &sm[k][busy][r];
                if (measure(&setups[k], &o, busy ? o.busy : 0,
                            100 + 2 * (uint64_t)r + (uint64_t)busy, s) != 0) {
                    goto out;
                }
                printf(
                    "#   run %d %s %s: D holds every block at %.0f ms (first at %.0f, P computed "
                    "at %.0f), %d blocks, kv_transfer %.0f ms, TTFT %.0f ms\n",
                    r, setups[k].label, busy ? "busy" : "idle", 1e3 * s->d_last, 1e3 * s->d_first,
                    1e3 * s->p_last, s->blocks, 1e3 * s->kv_transfer, 1e3 * s->ttft);
                fflush(stdout);
            }
        }
    }
    printf("\nmedian (min-max) over %d runs, ms from the DecodeJob's send:\n\n", o.runs);
    printf("| binaries | D | P computed the prompt | D: first block installed | D: every "
           "block installed | kv_transfer_seconds | TTFT |\n|---|---|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < n_setups; k++) {
        for (int busy = 0; busy < 2; busy++) {
            double v[5][MAX_RUNS];
            for (int r = 0; r < o.runs; r++) {
                struct sample *s = &sm[k][busy][r];
                v[0][r] = s->p_last;
                v[1][r] = s->d_first;
                v[2][r] = s->d_last;
                v[3][r] = s->kv_transfer;
                v[4][r] = s->ttft;
            }
            char f[5][64];
            for (int i = 0; i < 5; i++) {
                fmt_ms(f[i], sizeof(f[i]), v[i], o.runs);
            }
            printf("| %s | %s | %s | %s | %s | %s | %s |\n", setups[k].label,
                   busy ? "busy" : "idle", f[0], f[1], f[2], f[3], f[4]);
        }
    }
    print_load("end");
    rc = 0;
out:
    for (int k = 0; k < n_setups; k++) {
        stop_setup(&setups[k]);
    }
    h_cleanup_all();
    nng_fini();
    return rc;
}
