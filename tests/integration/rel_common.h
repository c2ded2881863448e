/* Shared by the reliability tests (test_rel_faults.c, test_rel_load.c,
 * test_rel_security.c; docs/reliability.md): a router + prefill + decode
 * cluster on loopback through the harness, a batched reference engine with
 * seeded sampling, an SSE stream parser, and a streaming load driver that
 * runs many concurrent client connections from one poll loop so a test can
 * inject faults between its steps. Header-only (static inline) because
 * each test file is its own executable. */
#ifndef TANDEM_REL_COMMON_H
#define TANDEM_REL_COMMON_H

#include <CUnit/Basic.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "rt_client.h"

/* ---- Cluster ------------------------------------------------------------ */

/* Every wait's overall timeout: longer than anything a loaded 2-core machine
 * makes an event take, so only a hang reaches it. No check bounds how long
 * something takes (bench/ measures that). */
#define REL_HANG_MS 30000

struct rel_cluster {
    struct h_proc router, p[2], d[2];
    int n_p, n_d;
    int port;
    char announce[H_URL_MAX];
    char port_s[16];
    const char *rargs[24]; /* router flags kept for restarts (NULL-terminated) */
};

/* deploy/routing/<name> in the source tree (TANDEM_SOURCE_DIR, set by ctest). */
static inline const char *rel_routing(const char *name)
{
    static char path[512];
    const char *src = getenv("TANDEM_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/deploy/routing/%s", src ? src : ".", name);
    return path;
}

/* Starts (or restarts, fixed_port = 1: on c->port) the router with the
 * flags kept in c->rargs. */
static inline int rel_start_router(struct rel_cluster *c, int fixed_port)
{
    const char *args[40];
    int n = 0;
    args[n++] = "--announce";
    args[n++] = c->announce;
    args[n++] = "--log-level";
    args[n++] = "error";
    /* Other tests beside this one on 2 cores can delay a heartbeat by
     * seconds (rt_cluster.h: 15 s, as there); tests that want it short pass
     * their own (later flags win). */
    args[n++] = "--heartbeat-timeout-ms";
    args[n++] = "15000";
    for (int i = 0; c->rargs[i] && n < 36; i++) {
        args[n++] = c->rargs[i];
    }
    if (fixed_port) {
        args[n++] = "--port";
        args[n++] = c->port_s;
        args[n] = NULL;
        return h_spawn(&c->router, "tandem-router", args, REL_HANG_MS);
    }
    args[n] = NULL;
    int rc = rtc_spawn_router(&c->router, args, &c->port);
    snprintf(c->port_s, sizeof(c->port_s), "%d", c->port);
    return rc;
}

/* Router + n_p prefill + n_d decode workers (tiny), announcing over ipc;
 * returns 0 once every worker is healthy in the router. */
static inline int rel_cluster_start(struct rel_cluster *c, int n_p, int n_d,
                                    const char *const *router_args, const char *const *worker_args)
{
    memset(c, 0, sizeof(*c));
    h_ipc_url(c->announce, sizeof(c->announce), "rel-announce");
    for (int i = 0; router_args && router_args[i] && i < 23; i++) {
        c->rargs[i] = router_args[i];
    }
    if (rel_start_router(c, 0) != 0) {
        return -1;
    }
    const char *w[32];
    int n = 0;
    w[n++] = "--router";
    w[n++] = c->announce;
    w[n++] = "--log-level";
    w[n++] = "error";
    for (int i = 0; worker_args && worker_args[i] && n < 31; i++) {
        w[n++] = worker_args[i];
    }
    w[n] = NULL;
    for (int i = 0; i < n_p; i++) {
        if (h_spawn(&c->p[i], "tandem-prefill", w, REL_HANG_MS) != 0) {
            return -1;
        }
        c->n_p++;
    }
    for (int i = 0; i < n_d; i++) {
        if (h_spawn(&c->d[i], "tandem-decode", w, REL_HANG_MS) != 0) {
            return -1;
        }
        c->n_d++;
    }
    return rtc_wait_healthy(c->port, n_p + n_d, REL_HANG_MS) == n_p + n_d ? 0 : -1;
}

/* h_stop(p, sig, timeout_ms); with REL_GDB set, a process still running 3 s
 * after the signal gets its threads' backtraces written to
 * /tmp/rel-gdb-<pid>.txt (debugging shutdown hangs). */
static inline int rel_stop(struct h_proc *p, int sig, int timeout_ms)
{
    if (getenv("REL_GDB") != NULL && p->pid > 0) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd),
                 "(sleep 3; kill -0 %d 2>/dev/null && gdb -p %d -batch -ex 'thread apply all bt' "
                 "> /tmp/rel-gdb-%d.txt 2>&1) &",
                 (int)p->pid, (int)p->pid, (int)p->pid);
        if (system(cmd) != 0) {
            fprintf(stderr, "cannot start gdb\n");
        }
    }
    return h_stop(p, sig, timeout_ms);
}

/* Time a clean stop may take: above the stop watchdogs (router 3 s,
 * workers 10 s: router/main.c, worker/worker.c), which end a stop that hangs
 * with status 70 (a failure: REL_EXPECT_CLEAN_STOP wants 0). A process still
 * running after this is killed, and h_stop then returns 128 + SIGKILL. */
#define REL_STOP_MS 20000

/* Stops p with SIGTERM; the test fails unless it exits with status 0 (under
 * ASan a leak report or a sanitizer error makes it non-zero, 1 with the
 * asan stage's options; a hang ends in 128 + SIGKILL). */
#define REL_EXPECT_CLEAN_STOP(p) EXPECT_EQ(rel_stop((p), SIGTERM, REL_STOP_MS), 0)

/* Stops every process of c still running (router first), each expected to
 * exit with status 0. */
static inline void rel_cluster_stop(struct rel_cluster *c)
{
    if (c->router.pid > 0) {
        REL_EXPECT_CLEAN_STOP(&c->router);
    }
    for (int i = 0; i < c->n_d; i++) {
        if (c->d[i].pid > 0) {
            REL_EXPECT_CLEAN_STOP(&c->d[i]);
        }
    }
    for (int i = 0; i < c->n_p; i++) {
        if (c->p[i].pid > 0) {
            REL_EXPECT_CLEAN_STOP(&c->p[i]);
        }
    }
}

static inline struct h_proc *rel_worker(struct rel_cluster *c, const char *id)
{
    struct h_proc *all[] = {&c->p[0], &c->p[1], &c->d[0], &c->d[1]};
    for (int k = 0; k < 4; k++) {
        if (all[k]->pid > 0 && strcmp(all[k]->id, id) == 0) {
            return all[k];
        }
    }
    return NULL;
}

/* The live worker of role ("decode"/"prefill") with the most requests in
 * flight in the router's view (at least one), or NULL after timeout_ms. */
static inline struct h_proc *rel_busy_worker(struct rel_cluster *c, const char *role,
                                             int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    do {
        struct rtc_resp r;
        struct h_proc *best = NULL;
        json_int_t best_n = 0;
        if (rtc_get(c->port, "/v1/cluster", &r) == 200) {
            json_t *j = json_loads(r.body, JSON_ALLOW_NUL, NULL);
            json_t *eps = json_object_get(j, "endpoints");
            for (size_t i = 0; i < json_array_size(eps); i++) {
                json_t *e = json_array_get(eps, i);
                const char *id = json_string_value(json_object_get(e, "id"));
                const char *er = json_string_value(json_object_get(e, "role"));
                json_int_t n =
                    json_integer_value(json_object_get(json_object_get(e, "inflight"), "requests"));
                struct h_proc *p = id ? rel_worker(c, id) : NULL;
                if (p != NULL && er != NULL && strcmp(er, role) == 0 && n > best_n &&
                    json_is_true(json_object_get(e, "healthy"))) {
                    best = p;
                    best_n = n;
                }
            }
            json_decref(j);
        }
        rtc_resp_free(&r);
        if (best != NULL) {
            return best;
        }
        h_sleep_ms(5);
    } while (h_ms() < deadline);
    return NULL;
}

/* One series of the router's /metrics, or NAN when the scrape fails or the
 * series is missing (said on stderr): a missing series never reads as 0. */
static inline double rel_router_metric(const struct rel_cluster *c, const char *series)
{
    struct rtc_resp r;
    double v = NAN;
    int st = rtc_get(c->port, "/metrics", &r);
    if (st == 200) {
        v = h_metric(r.body, series);
        if (isnan(v)) {
            fprintf(stderr, "\nrouter /metrics: no series %s\n", series);
        }
    } else {
        fprintf(stderr, "\nrouter /metrics: status %d\n", st);
    }
    rtc_resp_free(&r);
    return v;
}

/* Every live worker: the KV invariant holds and no block is used within
 * timeout_ms. Returns the milliseconds it took, or -1. */
static inline double rel_wait_all_free(struct rel_cluster *c, int timeout_ms)
{
    double t0 = h_ms();
    struct h_proc *all[] = {&c->p[0], &c->p[1], &c->d[0], &c->d[1]};
    for (int k = 0; k < 4; k++) {
        if (all[k]->pid <= 0) {
            continue;
        }
        int left = timeout_ms - (int)(h_ms() - t0);
        double used = h_wait_used(all[k], 0, left > 0 ? left : 0);
        if (used != 0) {
            fprintf(stderr, "\n%s still holds %.0f KV blocks after %d ms\n", all[k]->id, used,
                    timeout_ms);
            return -1;
        }
        if (h_kv_invariant(all[k], NULL) != 0) {
            return -1;
        }
    }
    return h_ms() - t0;
}

/* ---- Reference engine --------------------------------------------------- */

/* One completion request of a workload and its expected output. */
struct rel_req {
    uint32_t *prompt; /* (n_prompt) owned */
    int n_prompt;
    int max_tokens;
    float temperature; /* 0: greedy */
    float top_p;
    uint64_t seed;      /* sent when temperature > 0 */
    uint32_t *want_ids; /* (max_tokens) owned */
    float *want_lp;     /* (max_tokens) owned */
    char *want_text;    /* owned */
};

/* ids decoded as the router does (decode_text), with every NUL byte written
 * as 0x01: jansson cannot hold NUL in object keys (top_logprobs), so streams
 * are parsed with \u0000 read as \u0001 (rel_parse_stream). New string. */
static inline char *rel_decode_text(const uint32_t *ids, int n, uint32_t prev)
{
    struct tokenizer *tok;
    tok_create_bytes(&tok);
    struct oa_textdec dec;
    oa_textdec_init(&dec, tok, prev, NULL, NULL, 0);
    size_t cap = (size_t)(n + 1) * OA_TEXTDEC_OUT_MAX, len = 0;
    char *text = malloc(cap + 1);
    for (int i = 0; i < n; i++) {
        len += (size_t)oa_textdec_push(&dec, ids[i], text + len, cap - len);
    }
    len += (size_t)oa_textdec_flush(&dec, text + len, cap - len);
    for (size_t i = 0; i < len; i++) {
        text[i] = text[i] == '\0' ? '\1' : text[i];
    }
    text[len] = '\0';
    tok_destroy(tok);
    return text;
}

/* Runs every request through the single-process engine (h_reference_run)
 * and fills want_ids, want_lp and want_text. Returns 0 or an error code. */
static inline int rel_reference(struct rel_req *reqs, int n)
{
    struct h_ref_req *rr = calloc((size_t)n, sizeof(*rr));
    if (rr == NULL) {
        return TANDEM_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        struct rel_req *q = &reqs[i];
        q->want_ids = calloc((size_t)q->max_tokens, sizeof(*q->want_ids));
        q->want_lp = calloc((size_t)q->max_tokens, sizeof(*q->want_lp));
        rr[i] = (struct h_ref_req){.prompt = q->prompt,
                                   .n_prompt = q->n_prompt,
                                   .max_tokens = q->max_tokens,
                                   .temperature = q->temperature,
                                   .top_p = q->top_p,
                                   .seed = q->seed,
                                   .ids = q->want_ids,
                                   .lps = q->want_lp};
    }
    int rc = h_reference_run(rr, n);
    free(rr);
    for (int i = 0; rc == 0 && i < n; i++) {
        struct rel_req *q = &reqs[i];
        q->want_text = rel_decode_text(q->want_ids, q->max_tokens, q->prompt[q->n_prompt - 1]);
    }
    return rc;
}

/* A workload of n distinct prompts of [min_len, max_len] tokens and
 * max_tokens outputs; every seeded_every-th one (0: none) samples with
 * temperature 0.8, top_p 0.95 and its own seed. */
static inline struct rel_req *rel_workload(int n, uint64_t seed, int min_len, int max_len,
                                           int max_tokens, int seeded_every)
{
    struct rel_req *reqs = calloc((size_t)n, sizeof(*reqs));
    for (int i = 0; i < n; i++) {
        struct rel_req *q = &reqs[i];
        uint32_t len;
        h_prompt(&len, 1, seed * 1000 + (uint64_t)i, 0, (uint32_t)(max_len - min_len + 1));
        q->n_prompt = min_len + (int)len;
        q->prompt = malloc((size_t)q->n_prompt * sizeof(*q->prompt));
        h_prompt(q->prompt, q->n_prompt, seed * 7919 + (uint64_t)i, 3, 259);
        q->max_tokens = max_tokens;
        if (seeded_every > 0 && i % seeded_every == seeded_every - 1) {
            q->temperature = 0.8f;
            q->top_p = 0.95f;
            q->seed = seed * 31 + (uint64_t)i + 1;
        }
    }
    return reqs;
}

static inline void rel_workload_free(struct rel_req *reqs, int n)
{
    for (int i = 0; reqs && i < n; i++) {
        free(reqs[i].prompt);
        free(reqs[i].want_ids);
        free(reqs[i].want_lp);
        free(reqs[i].want_text);
    }
    free(reqs);
}

/* The request's HTTP bytes (streaming completion with per-token logprobs,
 * ignore_eos, usage, Connection: close). Returns a new string. */
static inline char *rel_request_bytes(const struct rel_req *q, size_t *len)
{
    size_t cap = (size_t)q->n_prompt * 12 + 1024;
    char *body = malloc(cap);
    size_t n = (size_t)snprintf(body, cap, "{\"prompt\":[");
    for (int i = 0; i < q->n_prompt; i++) {
        n += (size_t)snprintf(body + n, cap - n, "%s%u", i ? "," : "", q->prompt[i]);
    }
    if (q->temperature > 0) {
        n += (size_t)snprintf(
            body + n, cap - n, "],\"temperature\":%.9g,\"top_p\":%.9g,\"seed\":%llu,",
            (double)q->temperature, (double)q->top_p, (unsigned long long)q->seed);
    } else {
        n += (size_t)snprintf(body + n, cap - n, "],\"temperature\":0,");
    }
    n += (size_t)snprintf(body + n, cap - n,
                          "\"max_tokens\":%d,\"ignore_eos\":true,\"logprobs\":0,\"stream\":true,"
                          "\"stream_options\":{\"include_usage\":true}}",
                          q->max_tokens);
    char *req = malloc(n + 256);
    int h = snprintf(req, 256,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     n);
    memcpy(req + h, body, n);
    free(body);
    *len = (size_t)h + n;
    return req;
}

/* ---- SSE streams -------------------------------------------------------- */

struct rel_stream {
    char *text; /* owned, concatenated */
    float lp[4096];
    int n_lp;
    int usage_tokens;
    char finish[32];
    int done;      /* data: [DONE] seen */
    int n_events;  /* data: events (incl. [DONE]) */
    int has_error; /* an error object in the stream */
};

/* Parses every complete SSE event of body (NUL-terminated). */
static inline void rel_parse_stream(const char *body, struct rel_stream *s)
{
    free(s->text);
    memset(s, 0, sizeof(*s));
    s->usage_tokens = -1;
    size_t cap = 1024, len = 0;
    s->text = malloc(cap);
    s->text[0] = '\0';
    for (int i = 0; body != NULL; i++) {
        char *ev = rtc_sse_event(body, i);
        if (ev == NULL) {
            break;
        }
        s->n_events++;
        if (strcmp(ev, "[DONE]") == 0) {
            s->done = 1;
            free(ev);
            continue;
        }
        for (char *z = ev; (z = strstr(z, "\\u0000")) != NULL; z += 6) {
            z[5] = '1';
        }
        json_t *j = json_loads(ev, JSON_ALLOW_NUL, NULL);
        if (j == NULL) {
            fprintf(stderr, "\nunparsable SSE event: %.200s\n", ev);
        }
        free(ev);
        if (j == NULL) {
            continue; /* an incomplete last event */
        }
        if (json_object_get(j, "error") != NULL) {
            s->has_error = 1;
        }
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *t = json_object_get(ch, "text");
        size_t tl = json_string_length(t);
        if (tl > 0) {
            if (len + tl + 1 > cap) {
                cap = 2 * (len + tl + 1);
                s->text = realloc(s->text, cap);
            }
            memcpy(s->text + len, json_string_value(t), tl);
            len += tl;
            s->text[len] = '\0';
        }
        json_t *lps = json_object_get(json_object_get(ch, "logprobs"), "token_logprobs");
        for (size_t k = 0; k < json_array_size(lps) && s->n_lp < 4096; k++) {
            s->lp[s->n_lp++] = (float)json_number_value(json_array_get(lps, k));
        }
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f != NULL) {
            snprintf(s->finish, sizeof(s->finish), "%s", f);
        }
        json_t *u = json_object_get(json_object_get(j, "usage"), "completion_tokens");
        if (json_is_integer(u)) {
            s->usage_tokens = (int)json_integer_value(u);
        }
        json_decref(j);
    }
}

static inline void rel_stream_fini(struct rel_stream *s)
{
    free(s->text);
    s->text = NULL;
}

/* Whether a finished stream is exactly q's expected completion (text,
 * every logprob, usage, finish "length", [DONE]); prints what differs. */
static inline int rel_stream_matches(const struct rel_stream *s, const struct rel_req *q, int index)
{
    int ok = s->text != NULL && q->want_text != NULL && strcmp(s->text, q->want_text) == 0;
    if (!ok) {
        fprintf(stderr, "\nrequest %d: text differs\n  got  [%s]\n  want [%s]\n", index,
                s->text ? s->text : "(null)", q->want_text ? q->want_text : "(null)");
    }
    if (s->n_lp != q->max_tokens) {
        fprintf(stderr, "\nrequest %d: %d tokens, want %d\n", index, s->n_lp, q->max_tokens);
        ok = 0;
    }
    for (int i = 0; ok && i < s->n_lp; i++) {
        if (s->lp[i] != q->want_lp[i]) {
            fprintf(stderr, "\nrequest %d: logprob %d: got %.9g, want %.9g\n", index, i,
                    (double)s->lp[i], (double)q->want_lp[i]);
            ok = 0;
        }
    }
    if (s->usage_tokens != q->max_tokens || strcmp(s->finish, "length") != 0 || !s->done) {
        fprintf(stderr, "\nrequest %d: usage %d, finish '%s', done %d\n", index, s->usage_tokens,
                s->finish, s->done);
        ok = 0;
    }
    return ok;
}

/* ---- Load driver -------------------------------------------------------- */

enum rel_state { REL_IDLE = 0, REL_READING, REL_DONE };

struct rel_client {
    struct rtc_conn conn;
    enum rel_state state;
    int status; /* HTTP status once done; -1: no complete response */
    int eof;    /* the connection ended */
    char *body; /* de-chunked body once done (owned) */
    double t_start, t_end;
    int first_seen; /* any response byte received */
};

/* Runs reqs[0..n) with at most conc connections at a time, in order, at
 * most rate requests per second when rate is set. A test calls
 * rel_drive_step repeatedly and may set hold to stop new requests from
 * starting (running ones go on). */
struct rel_driver {
    struct rel_req *reqs;
    struct rel_client *cl; /* (n) */
    int n, conc, port;
    int next, active, done;
    int hold;
    double rate;    /* > 0: request i starts no earlier than i / rate s after the first */
    double t_first; /* h_ms() of the first start */
    int timeout_ms; /* a request not done within this long counts as hung */
    int hung;
};

static inline void rel_driver_init(struct rel_driver *dr, struct rel_req *reqs, int n, int conc,
                                   int port)
{
    memset(dr, 0, sizeof(*dr));
    dr->reqs = reqs;
    dr->n = n;
    dr->conc = conc;
    dr->port = port;
    dr->timeout_ms = 60000;
    dr->cl = calloc((size_t)n, sizeof(*dr->cl));
    for (int i = 0; i < n; i++) {
        dr->cl[i].conn.fd = -1;
        dr->cl[i].status = -1;
    }
}

static inline void rel_driver_fini(struct rel_driver *dr)
{
    for (int i = 0; i < dr->n; i++) {
        rtc_close(&dr->cl[i].conn);
        free(dr->cl[i].body);
    }
    free(dr->cl);
    dr->cl = NULL;
}

static inline void rel_client_finish(struct rel_driver *dr, int i)
{
    struct rel_client *c = &dr->cl[i];
    struct rtc_resp r;
    memset(&r, 0, sizeof(r));
    r.status = -1;
    if (rtc_parse(&c->conn, &r, 0) == 1) {
        c->status = r.status;
        c->body = r.body;
        r.body = NULL;
    }
    rtc_resp_free(&r);
    c->state = REL_DONE;
    c->t_end = h_ms();
    rtc_close(&c->conn);
    dr->active--;
    dr->done++;
}

/* Starts what may start, then waits up to wait_ms for input and reads it.
 * Returns the number of requests not yet done. */
static inline int rel_drive_step(struct rel_driver *dr, int wait_ms)
{
    while (!dr->hold && dr->next < dr->n && dr->active < dr->conc) {
        if (dr->rate > 0 && dr->next > 0 && h_ms() < dr->t_first + dr->next * 1e3 / dr->rate) {
            break;
        }
        if (dr->next == 0) {
            dr->t_first = h_ms();
        }
        int i = dr->next++;
        struct rel_client *c = &dr->cl[i];
        size_t len;
        char *bytes = rel_request_bytes(&dr->reqs[i], &len);
        c->t_start = h_ms();
        c->state = REL_READING;
        dr->active++;
        if (rtc_connect(&c->conn, dr->port) != 0 || rtc_send(&c->conn, bytes, len) != 0) {
            c->conn.eof = 1;
        }
        free(bytes);
    }
    struct pollfd pfd[256];
    int idx[256], np = 0;
    for (int i = 0; i < dr->n && np < 256; i++) {
        struct rel_client *c = &dr->cl[i];
        if (c->state != REL_READING) {
            continue;
        }
        if (c->conn.eof || c->conn.fd < 0) {
            rel_client_finish(dr, i);
            continue;
        }
        if (h_ms() - c->t_start > dr->timeout_ms) {
            fprintf(stderr, "\nrequest %d hung for %d ms\n", i, dr->timeout_ms);
            dr->hung++;
            rel_client_finish(dr, i);
            continue;
        }
        pfd[np] = (struct pollfd){c->conn.fd, POLLIN, 0};
        idx[np++] = i;
    }
    if (np > 0 && poll(pfd, (nfds_t)np, wait_ms) > 0) {
        for (int k = 0; k < np; k++) {
            if (pfd[k].revents != 0) {
                struct rel_client *c = &dr->cl[idx[k]];
                if (rtc_fill(&c->conn, 0) > 0) {
                    c->first_seen = 1;
                }
                if (c->conn.eof) {
                    rel_client_finish(dr, idx[k]);
                }
            }
        }
    } else if (np == 0 && wait_ms > 0) {
        h_sleep_ms(wait_ms < 5 ? wait_ms : 5);
    }
    return dr->n - dr->done;
}

/* Tokens streamed so far to running client i (from its SSE events). */
static inline int rel_client_tokens(const struct rel_driver *dr, int i)
{
    const struct rel_client *c = &dr->cl[i];
    if (c->state != REL_READING || c->conn.len == 0) {
        return 0;
    }
    int n = 0;
    const char *p = c->conn.buf;
    while ((p = strstr(p, "\"token_logprobs\":[")) != NULL) {
        p += 18;
        if (*p != ']') {
            n++;
        }
        for (; *p && *p != ']'; p++) {
            n += *p == ',';
        }
    }
    return n;
}

/* Runs until every request is done (or total_ms passes). */
static inline void rel_drive_all(struct rel_driver *dr, int total_ms)
{
    double deadline = h_ms() + total_ms;
    while (rel_drive_step(dr, 20) > 0 && h_ms() < deadline) {
    }
}

/* Checks every request of the driver: 200 and identical to the reference.
 * Returns the number that did not match. */
static inline int rel_check_all(struct rel_driver *dr)
{
    int bad = 0;
    for (int i = 0; i < dr->n; i++) {
        struct rel_client *c = &dr->cl[i];
        struct rel_stream s = {0};
        if (c->state != REL_DONE || c->status != 200) {
            fprintf(stderr, "\nrequest %d: state %d, status %d\n", i, (int)c->state, c->status);
            bad++;
            continue;
        }
        rel_parse_stream(c->body, &s);
        if (!rel_stream_matches(&s, &dr->reqs[i], i)) {
            if (getenv("REL_DEBUG") != NULL) {
                char fn[64];
                snprintf(fn, sizeof(fn), "/tmp/rel-body-%d.txt", i);
                FILE *fp = fopen(fn, "w");
                if (fp) {
                    fputs(c->body, fp);
                    fclose(fp);
                }
                fprintf(stderr, "want ids:");
                for (int k = 0; k < dr->reqs[i].max_tokens; k++) {
                    fprintf(stderr, " %u", dr->reqs[i].want_ids[k]);
                }
                fprintf(stderr, "\n");
            }
            bad++;
        }
        rel_stream_fini(&s);
    }
    return bad;
}

#endif
