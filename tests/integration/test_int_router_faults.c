/* Integration: tandem-router under failures, with real workers on loopback.
 *   - a decode worker killed before its first token: retried on the other,
 *     the client sees a normal answer equal to the engine's;
 *   - a prefill worker killed during a remote prefill: the same;
 *   - a decode worker killed mid-stream: recovered on the other with the
 *     tokens already sent, no duplicate or missing token (logprobs of every
 *     position equal the engine's, in order);
 *   - a client that disconnects mid-stream: no worker holds a KV block for
 *     it afterwards;
 *   - every worker busy: the request waits in the router's queue and is
 *     served; with no queue (--max-pending 0) it gets 429 and Retry-After;
 *   - a restarted router: the workers announce themselves again and new
 *     requests succeed;
 *   - a stopped worker is unhealthy once its heartbeats are older than the
 *     timeout, a killed one when its link drops;
 *   - the per-request deadline ends a generation (504, or "abort").
 * Every process must exit as expected: 0 after SIGTERM, 137 after the
 * test's SIGKILL. Waits are for the event itself; their timeouts (30 s)
 * only catch hangs. How long the events take is measured and printed, not
 * asserted (a shared machine decides that). */
#include <CUnit/Basic.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "rt_client.h"

#define HANG_MS 30000 /* how long a wait for an event may take before it is a hang */

static void teardown(void)
{
    h_cleanup_all();
}

/* ---- Cluster ------------------------------------------------------------ */

struct cluster {
    struct h_proc router, p[2], d[2];
    int n_p, n_d;
    int port;
    char announce[H_URL_MAX];
    char port_s[16];
};

static int start_router(struct cluster *c, const char *const *extra, int fixed_port)
{
    const char *args[32];
    int n = 0;
    args[n++] = "--announce";
    args[n++] = c->announce;
    args[n++] = "--log-level";
    args[n++] = "error";
    /* Other tests running beside this one on 2 cores can delay a worker's
     * heartbeat by seconds; only the heartbeat test wants it short (its
     * flag comes later and wins). */
    args[n++] = "--heartbeat-timeout-ms";
    args[n++] = "5000";
    for (int i = 0; extra && extra[i]; i++) {
        args[n++] = extra[i];
    }
    if (fixed_port) {
        args[n++] = "--port";
        args[n++] = c->port_s;
        args[n] = NULL;
        return h_spawn(&c->router, "tandem-router", args, 20000);
    }
    args[n] = NULL;
    int rc = rtc_spawn_router(&c->router, args, &c->port);
    snprintf(c->port_s, sizeof(c->port_s), "%d", c->port);
    return rc;
}

static int cluster_start(struct cluster *c, int n_p, int n_d, const char *const *router_args,
                         const char *const *worker_args)
{
    memset(c, 0, sizeof(*c));
    h_ipc_url(c->announce, sizeof(c->announce), "faults-announce");
    if (start_router(c, router_args, 0) != 0) {
        return -1;
    }
    const char *w[24];
    int n = 0;
    w[n++] = "--router";
    w[n++] = c->announce;
    w[n++] = "--log-level";
    w[n++] = "error";
    for (int i = 0; worker_args && worker_args[i]; i++) {
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
    return rtc_wait_healthy(c->port, n_p + n_d, HANG_MS) == n_p + n_d ? 0 : -1;
}

/* Stops what still runs: each must exit 0 on SIGTERM (under ASan a leak
 * report makes it 1). A worker the test killed was checked there (137).
 * The timeouts leave room for the stop watchdogs (3 s in the router, 10 s in
 * a worker), which end a stop stuck in NNG's close with status 0. */
static void cluster_stop(struct cluster *c)
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

/* SIGKILL, on purpose: the exit status must say so. */
static void kill_worker(struct h_proc *p)
{
    EXPECT_EQ(h_stop(p, SIGKILL, 10000), 128 + SIGKILL);
}

/* The worker process of role ("decode" or "prefill") that the router has a
 * request in flight on, or NULL. */
static struct h_proc *busy_worker(struct cluster *c, const char *role, int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    while (h_ms() < deadline) {
        struct rtc_resp r;
        if (rtc_get(c->port, "/v1/cluster", &r) == 200) {
            json_t *j = json_loads(r.body, 0, NULL);
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
                struct h_proc *all[] = {&c->p[0], &c->p[1], &c->d[0], &c->d[1]};
                for (int k = 0; k < 4; k++) {
                    if (all[k]->pid > 0 && strcmp(all[k]->id, id) == 0) {
                        json_decref(j);
                        rtc_resp_free(&r);
                        return all[k];
                    }
                }
            }
            json_decref(j);
        }
        rtc_resp_free(&r);
        h_sleep_ms(5);
    }
    return NULL;
}

/* One series of the router's /metrics, or NAN when the scrape failed or the
 * series is missing (which fails any comparison with it). */
static double router_metric(struct cluster *c, const char *series)
{
    struct rtc_resp r;
    double v = NAN;
    if (rtc_get(c->port, "/metrics", &r) == 200) {
        v = h_metric(r.body, series);
    }
    rtc_resp_free(&r);
    return v;
}

static char *ids_json(const uint32_t *ids, int n)
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

/* Sends a streaming completion request on a new connection (not read). */
static int send_stream(struct rtc_conn *conn, int port, const uint32_t *prompt, int n,
                       int max_tokens)
{
    if (rtc_connect(conn, port) != 0) {
        return -1;
    }
    char *ids = ids_json(prompt, n);
    size_t cap = strlen(ids) + 512;
    char *body = malloc(cap);
    int blen = snprintf(body, cap,
                        "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
                        "\"logprobs\":0,\"stream\":true,\"stream_options\":{\"include_usage\":"
                        "true}}",
                        ids, max_tokens);
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

/* Occurrences of needle in the connection's buffer. */
static int count_in(const struct rtc_conn *c, const char *needle)
{
    int n = 0;
    for (const char *p = c->buf; p && c->len > 0 && (p = strstr(p, needle)) != NULL; p++) {
        n++;
    }
    return n;
}

/* Parses a finished stream: the concatenated text, every token's logprob in
 * order, the usage chunk's completion_tokens, the finish reason. */
struct streamed {
    char text[65536];
    float lp[4096];
    int n_lp;
    int usage_tokens;
    char finish[32];
    int done;
};

static void parse_stream(const char *body, struct streamed *s)
{
    memset(s, 0, sizeof(*s));
    s->usage_tokens = -1;
    size_t len = 0;
    for (int i = 0; body != NULL; i++) {
        char *ev = rtc_sse_event(body, i);
        if (ev == NULL) {
            break;
        }
        if (strcmp(ev, "[DONE]") == 0) {
            s->done = 1;
            free(ev);
            continue;
        }
        json_t *j = json_loads(ev, 0, NULL);
        free(ev);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *t = json_string_value(json_object_get(ch, "text"));
        if (t != NULL && len + strlen(t) < sizeof(s->text)) {
            memcpy(s->text + len, t, strlen(t));
            len += strlen(t);
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
    s->text[len] = '\0';
}

static int same_floats(const float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++) {
        if (a[i] != b[i]) {
            fprintf(stderr, "\nlogprob %d: got %.9g, want %.9g\n", i, a[i], b[i]);
            return 0;
        }
    }
    return 1;
}

/* ---- Killed before the first token -------------------------------------- */

/* Kills the worker of role holding a long streaming request before its
 * first token; the answer must be complete and equal the engine's. */
static void killed_before_first(const char *role, int n_p, const char *reason_series)
{
    /* A small token budget makes the 1200-token prefill take many steps. */
    const char *wargs[] = {"--token-budget", "32", NULL};
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, n_p, 2, NULL, wargs) == 0);
    enum { N = 1200, MT = 8 };
    static uint32_t prompt[N];
    h_prompt(prompt, N, 31, 3, 259);
    float want_lp[MT];
    char *want = reference_text(prompt, N, MT, want_lp);
    CU_ASSERT_FATAL(want != NULL);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(send_stream(&conn, c.port, prompt, N, MT) == 0);
    struct h_proc *victim = busy_worker(&c, role, HANG_MS);
    CU_ASSERT_FATAL(victim != NULL);
    /* Nothing streamed yet: the router sends the headers with the first
     * token. */
    EXPECT_EQ(rtc_fill(&conn, 0), -1);
    printf("\n  killing %s %s before its first token\n", role, victim->id);
    kill_worker(victim);
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, HANG_MS), 200);
    struct streamed *s = calloc(1, sizeof(*s));
    parse_stream(r.body, s);
    EXPECT_STR(s->text, want);
    EXPECT_EQ(s->n_lp, MT);
    CU_ASSERT(same_floats(s->lp, want_lp, MT));
    EXPECT_EQ(s->usage_tokens, MT);
    EXPECT_STR(s->finish, "length");
    EXPECT_EQ(s->done, 1);
    EXPECT_NUM(router_metric(&c, reason_series), 1);
    free(s);
    rtc_resp_free(&r);
    rtc_close(&conn);
    free(want);
    cluster_stop(&c);
}

static void test_decode_killed_before_first_token(void)
{
    /* No prefill worker: the decode worker prefills. */
    killed_before_first("decode", 0, "tandem:router_retries_total{reason=\"failure\"}");
}

static void test_prefill_killed_before_first_token(void)
{
    /* 1200 uncached tokens: the default routing prefills remotely. */
    killed_before_first("prefill", 2, "tandem:router_retries_total{reason=\"failure\"}");
}

/* ---- Killed mid-stream -------------------------------------------------- */

static void test_decode_killed_mid_stream(void)
{
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 2, 2, NULL, NULL) == 0);
    enum { N = 300, MT = 150 };
    uint32_t prompt[N];
    h_prompt(prompt, N, 41, 3, 259);
    float want_lp[MT];
    char *want = reference_text(prompt, N, MT, want_lp);
    CU_ASSERT_FATAL(want != NULL);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(send_stream(&conn, c.port, prompt, N, MT) == 0);
    /* Wait for about 10 tokens (one event each, the first with the role). */
    double deadline = h_ms() + HANG_MS;
    while (count_in(&conn, "data: ") < 10 && h_ms() < deadline) {
        rtc_fill(&conn, 100);
    }
    CU_ASSERT_FATAL(count_in(&conn, "data: ") >= 10);
    struct h_proc *victim = busy_worker(&c, "decode", HANG_MS);
    CU_ASSERT_FATAL(victim != NULL);
    int before = count_in(&conn, "data: ");
    kill_worker(victim);
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, HANG_MS), 200);
    struct streamed *s = calloc(1, sizeof(*s));
    parse_stream(r.body, s);
    printf("\n  killed %s after %d events; %d tokens in all\n", victim->id, before, s->n_lp);
    EXPECT_STR(s->text, want);
    EXPECT_EQ(s->n_lp, MT);
    CU_ASSERT(same_floats(s->lp, want_lp, MT));
    EXPECT_EQ(s->usage_tokens, MT);
    EXPECT_STR(s->finish, "length");
    EXPECT_EQ(s->done, 1);
    EXPECT_NUM(router_metric(&c, "tandem:router_retries_total{reason=\"recovery\"}"), 1);
    free(s);
    rtc_resp_free(&r);
    rtc_close(&conn);
    free(want);
    cluster_stop(&c);
}

/* ---- Client disconnect -------------------------------------------------- */

static void test_client_disconnect(void)
{
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 2, 2, NULL, NULL) == 0);
    uint32_t prompt[300];
    h_prompt(prompt, 300, 51, 3, 259);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(send_stream(&conn, c.port, prompt, 300, 3000) == 0);
    double deadline = h_ms() + HANG_MS;
    while (count_in(&conn, "data: ") < 5 && h_ms() < deadline) {
        rtc_fill(&conn, 100);
    }
    CU_ASSERT(count_in(&conn, "data: ") >= 5);
    struct h_proc *d = busy_worker(&c, "decode", HANG_MS);
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT(h_proc_metric(d, "tandem:kv_blocks{state=\"used\"}") > 0);
    double t0 = h_ms();
    rtc_close(&conn);
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(h_wait_used(&c.d[i], 0, HANG_MS), 0);
        EXPECT_EQ(h_wait_used(&c.p[i], 0, HANG_MS), 0);
    }
    printf("\n  blocks released %.0f ms after the disconnect\n", h_ms() - t0);
    /* Freed because the router cancelled it, not because its 3000 tokens
     * ran out meanwhile. */
    double cancelled =
        h_proc_metric_sum(d, "vllm:request_success_total{finished_reason=\"cancelled\"");
    double length = h_proc_metric_sum(d, "vllm:request_success_total{finished_reason=\"length\"");
    EXPECT_NUM(cancelled, 1);
    CU_ASSERT(!(length > 0));
    EXPECT_NUM(router_metric(&c, "tandem:router_requests_total{code=\"499\"}"), 1);
    EXPECT_NUM(router_metric(&c, "vllm:num_requests_running{model_name=\"tiny\"}"), 0);
    cluster_stop(&c);
}

/* ---- Busy workers, the pending queue, 429 --------------------------------- */

/* Waits until each of conns[0..n) has received a streamed event (its worker
 * took it and is generating). Returns 1, or 0 after HANG_MS. */
static int all_streaming(struct rtc_conn *conns, int n)
{
    double deadline = h_ms() + HANG_MS;
    for (;;) {
        int streaming = 0;
        for (int i = 0; i < n; i++) {
            streaming += count_in(&conns[i], "data: ") > 0;
        }
        if (streaming == n) {
            return 1;
        }
        if (h_ms() >= deadline) {
            return 0;
        }
        for (int i = 0; i < n; i++) {
            rtc_fill(&conns[i], 10);
        }
    }
}

static void test_busy_queue_and_429(void)
{
    /* One running request per worker and no waiting room: with both
     * workers generating, a third request gets Busy from both and waits in
     * the router until one finishes. The first two are long (400 tokens) so
     * that they still run when the third is decided. */
    const char *wargs[] = {"--max-running", "1", "--max-waiting", "0", NULL};
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 0, 2, NULL, wargs) == 0);
    uint32_t prompt[64];
    h_prompt(prompt, 64, 61, 3, 259);
    struct rtc_conn conns[3];
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_FATAL(send_stream(&conns[i], c.port, prompt, 64, 400) == 0);
    }
    CU_ASSERT_FATAL(all_streaming(conns, 2));
    CU_ASSERT_FATAL(send_stream(&conns[2], c.port, prompt, 64, 60) == 0);
    /* It is queued: the router's pending queue holds it. */
    double deadline = h_ms() + HANG_MS;
    double waiting = 0;
    while ((waiting = router_metric(&c, "vllm:num_requests_waiting{model_name=\"tiny\"}")) != 1 &&
           h_ms() < deadline) {
        h_sleep_ms(5);
    }
    EXPECT_NUM(waiting, 1);
    const int want_tokens[3] = {400, 400, 60};
    for (int i = 0; i < 3; i++) {
        struct rtc_resp r;
        EXPECT_EQ(rtc_read(&conns[i], &r, HANG_MS), 200);
        struct streamed *s = calloc(1, sizeof(*s));
        parse_stream(r.body, s);
        EXPECT_EQ(s->n_lp, want_tokens[i]);
        EXPECT_EQ(s->done, 1);
        free(s);
        rtc_resp_free(&r);
        rtc_close(&conns[i]);
    }
    CU_ASSERT(router_metric(&c, "tandem:router_retries_total{reason=\"busy\"}") >= 2);
    EXPECT_NUM(router_metric(&c, "vllm:num_requests_waiting{model_name=\"tiny\"}"), 0);
    cluster_stop(&c);

    /* No queue: with both workers generating, a third request is refused
     * at once. */
    const char *rargs[] = {"--max-pending", "0", NULL};
    CU_ASSERT_FATAL(cluster_start(&c, 0, 2, rargs, wargs) == 0);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_FATAL(send_stream(&conns[i], c.port, prompt, 64, 400) == 0);
    }
    CU_ASSERT_FATAL(all_streaming(conns, 2));
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}", &r), 429);
    char retry[16];
    rtc_header(r.headers, "Retry-After", retry, sizeof(retry));
    EXPECT_STR(retry, "1");
    json_t *j = json_loads(r.body, 0, NULL);
    EXPECT_STR(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
               "rate_limit_error");
    EXPECT_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
               "rate_limit_exceeded");
    json_decref(j);
    rtc_resp_free(&r);
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(rtc_read(&conns[i], &r, HANG_MS), 200);
        rtc_resp_free(&r);
        rtc_close(&conns[i]);
    }
    /* /health answered throughout. */
    EXPECT_EQ(rtc_get(c.port, "/health", &r), 200);
    rtc_resp_free(&r);
    cluster_stop(&c);
}

/* ---- Restarted router --------------------------------------------------- */

static void test_router_restart(void)
{
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 2, 2, NULL, NULL) == 0);
    struct rtc_resp r;
    const char *req = "{\"prompt\":\"restart\",\"max_tokens\":4}";
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", req, &r), 200);
    rtc_resp_free(&r);
    EXPECT_EQ(h_stop(&c.router, SIGTERM, 10000), 0);
    CU_ASSERT_FATAL(start_router(&c, NULL, 1) == 0);
    double t0 = h_ms();
    int healthy = rtc_wait_healthy(c.port, 4, HANG_MS);
    printf("\n  %d workers back %.0f ms after the new router started\n", healthy, h_ms() - t0);
    EXPECT_EQ(healthy, 4);
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", req, &r), 200);
    json_t *j = json_loads(r.body, 0, NULL);
    EXPECT_EQ(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")),
              4);
    json_decref(j);
    rtc_resp_free(&r);
    cluster_stop(&c);
}

/* ---- Missed heartbeats --------------------------------------------------- */

/* What /v1/cluster says of the endpoint with this id, from one snapshot:
 * healthy (0/1, -1 if absent), its link ("up"/"down") and how long ago its
 * last heartbeat arrived. */
struct ep_state {
    int healthy;
    char link[8];
    long long hb_ms_ago;
};

static struct ep_state endpoint_state(struct cluster *c, const char *id)
{
    struct ep_state st = {.healthy = -1, .hb_ms_ago = -1};
    struct rtc_resp r;
    if (rtc_get(c->port, "/v1/cluster", &r) == 200) {
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *eps = json_object_get(j, "endpoints");
        for (size_t i = 0; i < json_array_size(eps); i++) {
            json_t *e = json_array_get(eps, i);
            const char *eid = json_string_value(json_object_get(e, "id"));
            if (eid != NULL && strcmp(eid, id) == 0) {
                st.healthy = json_is_true(json_object_get(e, "healthy"));
                const char *l = json_string_value(json_object_get(e, "link"));
                snprintf(st.link, sizeof(st.link), "%s", l ? l : "");
                st.hb_ms_ago = json_integer_value(json_object_get(e, "last_heartbeat_ms_ago"));
            }
        }
        json_decref(j);
    }
    rtc_resp_free(&r);
    return st;
}

/* Polls until the endpoint's health is want (HANG_MS at most); returns the
 * snapshot that showed it (or the last one). */
static struct ep_state wait_health(struct cluster *c, const char *id, int want)
{
    double deadline = h_ms() + HANG_MS;
    struct ep_state st = endpoint_state(c, id);
    while (st.healthy != want && h_ms() < deadline) {
        h_sleep_ms(10);
        st = endpoint_state(c, id);
    }
    return st;
}

/* A stopped worker (SIGSTOP) keeps its connection but sends no heartbeat:
 * unhealthy once its last heartbeat is older than --heartbeat-timeout-ms,
 * requests go to the other one; it rejoins by itself once it runs again. A
 * killed one is unhealthy when its link drops. */
static void test_heartbeat_timeout(void)
{
    /* Long enough that the running worker's heartbeats (every 250 ms) are
     * never that late on a loaded machine; nothing here waits for it but
     * the stopped one. */
    const char *rargs[] = {"--heartbeat-timeout-ms", "2000", NULL};
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 0, 2, rargs, NULL) == 0);
    double t0 = h_ms();
    kill(c.d[0].pid, SIGSTOP);
    struct ep_state st = wait_health(&c, c.d[0].id, 0);
    printf("\n  stopped worker unhealthy after %.0f ms (timeout 2000 ms), its last heartbeat "
           "%lld ms ago\n",
           h_ms() - t0, st.hb_ms_ago);
    EXPECT_EQ(st.healthy, 0);
    /* Declared for the missed heartbeats, not earlier, and not for its link:
     * one snapshot of the router's own clock. */
    CU_ASSERT(st.hb_ms_ago >= 2000);
    EXPECT_STR(st.link, "up");
    struct rtc_resp r;
    for (int i = 0; i < 3; i++) {
        EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"hb\",\"max_tokens\":2}", &r),
                  200);
        rtc_resp_free(&r);
    }
    /* None of them went to the stopped worker. */
    EXPECT_NUM(h_proc_metric_sum(&c.d[1], "vllm:request_success_total"), 3);
    kill(c.d[0].pid, SIGCONT);
    t0 = h_ms();
    EXPECT_EQ(wait_health(&c, c.d[0].id, 1).healthy, 1);
    printf("  back after %.0f ms\n", h_ms() - t0);
    cluster_stop(&c);
}

/* Killed: the link drops and the endpoint is unhealthy at once. The
 * heartbeat timeout is an hour, so within the wait only the link can tell
 * the router. */
static void test_link_loss(void)
{
    const char *rargs[] = {"--heartbeat-timeout-ms", "3600000", NULL};
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 0, 2, rargs, NULL) == 0);
    char id[128];
    snprintf(id, sizeof(id), "%s", c.d[1].id);
    kill_worker(&c.d[1]);
    double t0 = h_ms();
    struct ep_state st = wait_health(&c, id, 0);
    printf("\n  killed worker unhealthy after %.0f ms (heartbeat timeout 1 h)\n", h_ms() - t0);
    EXPECT_EQ(st.healthy, 0);
    EXPECT_STR(st.link, "down");
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"hb\",\"max_tokens\":2}", &r), 200);
    rtc_resp_free(&r);
    cluster_stop(&c);
}

/* ---- The per-request deadline ------------------------------------------ */

/* A generation still running at --deadline-ms ends: 504 before its stream
 * started, a last chunk with finish_reason "abort" after; the worker is
 * cancelled. */
static void test_deadline(void)
{
    const char *rargs[] = {"--deadline-ms", "700", NULL};
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 0, 1, rargs, NULL) == 0);
    struct rtc_resp r;
    double t0 = h_ms();
    EXPECT_EQ(rtc_post(c.port, "/v1/completions",
                       "{\"prompt\":\"long\",\"max_tokens\":3000,\"ignore_eos\":true}", &r),
              504);
    double dt = h_ms() - t0;
    printf("\n  504 after %.0f ms (deadline 700 ms)\n", dt);
    /* Not before the deadline. This cannot flake: our clock starts before
     * the request is sent, the router's when it has read it; only its loop's
     * cached time (updated just before the read) could make it early, by far
     * less than the 100 ms allowed. */
    CU_ASSERT(dt >= 600);
    json_t *j = json_loads(r.body, 0, NULL);
    EXPECT_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "timeout");
    json_decref(j);
    rtc_resp_free(&r);
    EXPECT_EQ(h_wait_used(&c.d[0], 0, HANG_MS), 0);
    /* The router cancelled it on the worker (it did not run its 3000). */
    const char *cancelled = "vllm:request_success_total{finished_reason=\"cancelled\"";
    EXPECT_NUM(h_proc_metric_sum(&c.d[0], cancelled), 1);
    uint32_t prompt[20];
    h_prompt(prompt, 20, 71, 3, 259);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(send_stream(&conn, c.port, prompt, 20, 3000) == 0);
    EXPECT_EQ(rtc_read(&conn, &r, HANG_MS), 200);
    struct streamed *s = calloc(1, sizeof(*s));
    parse_stream(r.body, s);
    EXPECT_STR(s->finish, "abort");
    EXPECT_EQ(s->done, 1);
    CU_ASSERT(s->n_lp > 0 && s->n_lp < 3000);
    free(s);
    rtc_resp_free(&r);
    rtc_close(&conn);
    EXPECT_EQ(h_wait_used(&c.d[0], 0, HANG_MS), 0);
    EXPECT_NUM(h_proc_metric_sum(&c.d[0], cancelled), 2);
    cluster_stop(&c);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("router_faults", NULL, NULL, NULL, teardown);
    CU_add_test(s, "decode_killed_before_first_token", test_decode_killed_before_first_token);
    CU_add_test(s, "prefill_killed_before_first_token", test_prefill_killed_before_first_token);
    CU_add_test(s, "decode_killed_mid_stream", test_decode_killed_mid_stream);
    CU_add_test(s, "client_disconnect", test_client_disconnect);
    CU_add_test(s, "busy_queue_and_429", test_busy_queue_and_429);
    CU_add_test(s, "router_restart", test_router_restart);
    CU_add_test(s, "heartbeat_timeout", test_heartbeat_timeout);
    CU_add_test(s, "link_loss", test_link_loss);
    CU_add_test(s, "deadline", test_deadline);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
