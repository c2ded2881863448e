/* A router with tiny prefill and decode workers that announce themselves,
 * for the router's end-to-end tests that start one cluster per test
 * (test_int_router.c, test_int_router_faults.c, test_int_router_dispatch.c,
 * test_int_router_limits.c): start, stop with every exit status checked, a
 * router restarted on its port, a deliberate kill, the worker holding a
 * request, a router metric, /v1/decisions, and streamed completions parsed
 * into text, per-token logprobs, usage and finish reason. Header-only (static
 * inline) like rt_client.h, because each test file is its own executable. */
#ifndef TANDEM_RT_CLUSTER_H
#define TANDEM_RT_CLUSTER_H

#include <jansson.h>
#include <math.h>
#include <signal.h>

#include "expect.h"
#include "rt_client.h"

#define RTC_MAX_ROLE 3     /* workers of one role */
#define RTC_HANG_MS  30000 /* a wait for an event longer than this is a hang */

struct rtc_cluster {
    struct h_proc router, p[RTC_MAX_ROLE], d[RTC_MAX_ROLE];
    int n_p, n_d;
    int port;
    char announce[H_URL_MAX];
};

/* The router's flags for cluster c: announce on c->announce, log level
 * error, a heartbeat timeout of 15 s (a tiny worker sends its heartbeat between steps, and
 * under a sanitizer with other tests beside it a step can take seconds: at 5 s a loaded CI
 * machine saw live workers declared lost and requests retried; a later
 * --heartbeat-timeout-ms in router_args wins), the routing
 * file deploy/routing/<routing> (path[512] holds its path) unless routing is
 * NULL, then router_args (NULL-terminated, or NULL). args holds at least 40
 * (42 when --port follows); returns how many were written (args[n] is NULL). */
static inline int rtc_router_argv(const struct rtc_cluster *c, const char *routing,
                                  const char *const *router_args, const char **args, char *path)
{
    int n = 0;
    args[n++] = "--announce";
    args[n++] = c->announce;
    args[n++] = "--log-level";
    args[n++] = "error";
    args[n++] = "--heartbeat-timeout-ms";
    args[n++] = "15000";
    if (routing != NULL) {
        const char *src = getenv("TANDEM_SOURCE_DIR");
        snprintf(path, 512, "%s/deploy/routing/%s", src ? src : ".", routing);
        args[n++] = "--routing";
        args[n++] = path;
    }
    for (int i = 0; router_args && router_args[i] && n < 38; i++) {
        args[n++] = router_args[i];
    }
    args[n] = NULL;
    return n;
}

/* Starts a router (routing: a file in deploy/routing/, or NULL for the
 * default; router_args and worker_args NULL-terminated extra flags, or NULL;
 * flags as rtc_router_argv) and n_p prefill + n_d decode workers announcing
 * to it, and waits until all are healthy. Returns 0 or -1 (message on
 * stderr; the harness kills what started). */
static inline int rtc_cluster_start(struct rtc_cluster *c, const char *routing, int n_p, int n_d,
                                    const char *const *router_args, const char *const *worker_args)
{
    memset(c, 0, sizeof(*c));
    if (n_p > RTC_MAX_ROLE || n_d > RTC_MAX_ROLE) {
        return -1;
    }
    h_ipc_url(c->announce, sizeof(c->announce), "cluster-announce");
    char path[512];
    const char *args[40];
    rtc_router_argv(c, routing, router_args, args, path);
    if (rtc_spawn_router(&c->router, args, &c->port) != 0) {
        return -1;
    }
    const char *w[24];
    int n = 0;
    w[n++] = "--router";
    w[n++] = c->announce;
    w[n++] = "--log-level";
    w[n++] = "error";
    for (int i = 0; worker_args && worker_args[i] && n < 22; i++) {
        w[n++] = worker_args[i];
    }
    w[n] = NULL;
    for (int i = 0; i < n_p; i++) {
        if (h_spawn(&c->p[i], "tandem-prefill", w, 20000) != 0) {
            return -1;
        }
        c->n_p++;
    }
    for (int i = 0; i < n_d; i++) {
        if (h_spawn(&c->d[i], "tandem-decode", w, 20000) != 0) {
            return -1;
        }
        c->n_d++;
    }
    int healthy = rtc_wait_healthy(c->port, n_p + n_d, RTC_HANG_MS);
    if (healthy != n_p + n_d) {
        fprintf(stderr, "cluster: %d of %d endpoints healthy\n", healthy, n_p + n_d);
        return -1;
    }
    return 0;
}

/* Stops what still runs: each process must exit 0 on SIGTERM (under ASan a
 * leak report makes it 1). A worker the test killed was checked there. The
 * timeouts leave room for the stop watchdogs (3 s in the router, 10 s in a
 * worker), which end a stop that hangs with status 70 (a failure). */
static inline void rtc_cluster_stop(struct rtc_cluster *c)
{
    EXPECT_EQ(h_stop(&c->router, SIGTERM, 10000), 0);
    for (int i = 0; i < c->n_d; i++) {
        if (c->d[i].pid > 0) {
            EXPECT_EQ(h_stop(&c->d[i], SIGTERM, 15000), 0);
        }
    }
    for (int i = 0; i < c->n_p; i++) {
        if (c->p[i].pid > 0) {
            EXPECT_EQ(h_stop(&c->p[i], SIGTERM, 15000), 0);
        }
    }
}

/* Starts the router of c again, on c->port (c->router must have exited),
 * with the flags of rtc_router_argv; the workers announce themselves to it
 * again. Returns 0 or -1. */
static inline int rtc_router_restart(struct rtc_cluster *c, const char *routing,
                                     const char *const *router_args)
{
    char path[512], port_s[16];
    const char *args[42];
    int n = rtc_router_argv(c, routing, router_args, args, path);
    snprintf(port_s, sizeof(port_s), "%d", c->port);
    args[n++] = "--port";
    args[n++] = port_s;
    args[n] = NULL;
    return h_spawn(&c->router, "tandem-router", args, 20000);
}

/* SIGKILL on purpose: the exit status must say so. */
static inline void rtc_kill(struct h_proc *p)
{
    EXPECT_EQ(h_stop(p, SIGKILL, 10000), 128 + SIGKILL);
}

/* GET path parsed as JSON (new reference), or NULL. */
static inline json_t *rtc_get_json(int port, const char *path)
{
    struct rtc_resp r;
    json_t *j = NULL;
    if (rtc_get(port, path, &r) == 200) {
        j = json_loads(r.body, JSON_ALLOW_NUL, NULL);
    }
    rtc_resp_free(&r);
    return j;
}

/* One series of the router's /metrics, or NAN (failed scrape, missing
 * series: fails any comparison). */
static inline double rtc_metric(int port, const char *series)
{
    struct rtc_resp r;
    double v = NAN;
    if (rtc_get(port, "/metrics", &r) == 200) {
        v = h_metric(r.body, series);
    }
    rtc_resp_free(&r);
    return v;
}

/* The live worker of role ("decode", "prefill") the router has a request in
 * flight on (/v1/cluster), polled for up to timeout_ms; NULL if none. */
static inline struct h_proc *rtc_busy_worker(struct rtc_cluster *c, const char *role,
                                             int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    for (;;) {
        json_t *j = rtc_get_json(c->port, "/v1/cluster");
        json_t *eps = json_object_get(j, "endpoints");
        for (size_t i = 0; i < json_array_size(eps); i++) {
            json_t *e = json_array_get(eps, i);
            const char *id = json_string_value(json_object_get(e, "id"));
            const char *er = json_string_value(json_object_get(e, "role"));
            json_int_t inflight =
                json_integer_value(json_object_get(json_object_get(e, "inflight"), "requests"));
            if (id == NULL || er == NULL || strcmp(er, role) != 0 || inflight <= 0) {
                continue;
            }
            struct h_proc *all[2 * RTC_MAX_ROLE];
            for (int k = 0; k < RTC_MAX_ROLE; k++) {
                all[k] = &c->p[k];
                all[RTC_MAX_ROLE + k] = &c->d[k];
            }
            for (int k = 0; k < 2 * RTC_MAX_ROLE; k++) {
                if (all[k]->pid > 0 && strcmp(all[k]->id, id) == 0) {
                    json_decref(j);
                    return all[k];
                }
            }
        }
        json_decref(j);
        if (h_ms() >= deadline) {
            return NULL;
        }
        h_sleep_ms(5);
    }
}

/* "[1,2,3]" (new string). */
static inline char *rtc_ids_json(const uint32_t *ids, int n)
{
    char *s = malloc((size_t)n * 12 + 3);
    size_t len = 0;
    s[len++] = '[';
    for (int i = 0; i < n; i++) {
        len += (size_t)sprintf(s + len, "%s%u", i ? "," : "", ids[i]);
    }
    s[len++] = ']';
    s[len] = '\0';
    return s;
}

/* Sends a greedy completion of a token-id prompt (ignore_eos, logprobs 0 so
 * every token's logprob comes back; streamed with usage when stream) on a
 * new connection, without reading the answer. Returns 0 or -1. */
static inline int rtc_send_completion(struct rtc_conn *conn, int port, const uint32_t *prompt,
                                      int n, int max_tokens, int stream)
{
    if (rtc_connect(conn, port) != 0) {
        return -1;
    }
    char *ids = rtc_ids_json(prompt, n);
    size_t cap = strlen(ids) + 512;
    char *body = malloc(cap);
    int blen =
        snprintf(body, cap,
                 "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
                 "\"logprobs\":0%s}",
                 ids, max_tokens,
                 stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
    char head[256];
    int hlen = snprintf(head, sizeof(head),
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                        "Content-Length: %d\r\n\r\n",
                        blen);
    int rc = rtc_send(conn, head, (size_t)hlen);
    if (rc == 0) {
        rc = rtc_send(conn, body, (size_t)blen);
    }
    free(body);
    free(ids);
    return rc;
}

/* Occurrences of needle in what the connection received so far. */
static inline int rtc_count_in(const struct rtc_conn *c, const char *needle)
{
    int n = 0;
    for (const char *p = c->buf; p && c->len > 0 && (p = strstr(p, needle)) != NULL; p++) {
        n++;
    }
    return n;
}

/* Reads the connection until it holds at least n SSE events, or RTC_HANG_MS
 * pass with no byte arriving (like rtc_read, a hang rather than a slow
 * stream). Returns 1 when it does. */
static inline int rtc_wait_events(struct rtc_conn *c, int n)
{
    double deadline = h_ms() + RTC_HANG_MS;
    while (rtc_count_in(c, "data: ") < n && !c->eof && h_ms() < deadline) {
        if (rtc_fill(c, 100) > 0) {
            deadline = h_ms() + RTC_HANG_MS;
        }
    }
    return rtc_count_in(c, "data: ") >= n;
}

/* A completion's answer, streamed (SSE events) or not (one JSON object):
 * the text concatenated (a chat chunk's delta.content; 64 KiB at most),
 * every token's logprob in order, usage, the finish reason and how many
 * [DONE] events ended it. */
struct rtc_answer {
    char text[65536];
    float lp[4096];
    int n_lp;
    int prompt_tokens, completion_tokens; /* -1: no usage seen */
    char finish[32];
    int done; /* [DONE] events */
    int usage_chunks;
};

static inline void rtc_answer_add(struct rtc_answer *a, json_t *j, size_t *len)
{
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *t = json_string_value(json_object_get(ch, "text"));
    if (t == NULL) { /* a chat chunk */
        t = json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
    }
    if (t != NULL && *len + strlen(t) < sizeof(a->text)) {
        memcpy(a->text + *len, t, strlen(t));
        *len += strlen(t);
    }
    json_t *lps = json_object_get(json_object_get(ch, "logprobs"), "token_logprobs");
    for (size_t k = 0; k < json_array_size(lps) && a->n_lp < 4096; k++) {
        a->lp[a->n_lp++] = (float)json_number_value(json_array_get(lps, k));
    }
    const char *f = json_string_value(json_object_get(ch, "finish_reason"));
    if (f != NULL) {
        snprintf(a->finish, sizeof(a->finish), "%s", f);
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        a->usage_chunks++;
        a->prompt_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
        a->completion_tokens = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    }
}

static inline void rtc_answer_parse(const char *body, int stream, struct rtc_answer *a)
{
    memset(a, 0, sizeof(*a));
    a->prompt_tokens = a->completion_tokens = -1;
    size_t len = 0;
    if (!stream) {
        json_t *j = json_loads(body ? body : "", JSON_ALLOW_NUL, NULL);
        rtc_answer_add(a, j, &len);
        json_decref(j);
    }
    for (int i = 0; stream && body != NULL; i++) {
        char *ev = rtc_sse_event(body, i);
        if (ev == NULL) {
            break;
        }
        if (strcmp(ev, "[DONE]") == 0) {
            a->done++;
        } else {
            json_t *j = json_loads(ev, JSON_ALLOW_NUL, NULL);
            rtc_answer_add(a, j, &len);
            json_decref(j);
        }
        free(ev);
    }
    a->text[len] = '\0';
}

#endif
