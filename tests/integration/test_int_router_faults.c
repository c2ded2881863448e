/* Integration: tandem-router under failures, with real workers on loopback.
 *   - a decode worker killed before its first token: retried on the other,
 *     the client sees a normal answer equal to the engine's;
 *   - a prefill worker killed during a remote prefill: the same;
 *   - a decode worker killed mid-stream: recovered on the other with the
 *     tokens already sent, no duplicate or missing token (logprobs of every
 *     position equal the engine's, in order);
 *   - a client that disconnects mid-stream: within 1 s no worker holds a KV
 *     block for it;
 *   - every worker busy: the request waits in the router's queue and is
 *     served; with no queue (--max-pending 0) it gets 429 and Retry-After;
 *   - a restarted router: the workers announce themselves again within 2 s
 *     and new requests succeed;
 *   - a stopped worker is unhealthy after missed heartbeats, a killed one at
 *     once;
 *   - the per-request deadline ends a generation (504, or "abort"). */
#include <CUnit/Basic.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "rt_client.h"

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
    return rtc_wait_healthy(c->port, n_p + n_d, 10000) == n_p + n_d ? 0 : -1;
}

static void cluster_stop(struct cluster *c)
{
    EXPECT_EQ(h_stop(&c->router, SIGTERM, 5000), 0);
    for (int i = 0; i < c->n_d; i++) {
        h_stop(&c->d[i], SIGTERM, 5000);
    }
    for (int i = 0; i < c->n_p; i++) {
        h_stop(&c->p[i], SIGTERM, 5000);
    }
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
    struct h_proc *victim = busy_worker(&c, role, 5000);
    CU_ASSERT_FATAL(victim != NULL);
    /* Nothing streamed yet: the router sends the headers with the first
     * token. */
    EXPECT_EQ(rtc_fill(&conn, 0), -1);
    printf("\n  killing %s %s before its first token\n", role, victim->id);
    h_stop(victim, SIGKILL, 5000);
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, 30000), 200);
    struct streamed *s = calloc(1, sizeof(*s));
    parse_stream(r.body, s);
    EXPECT_STR(s->text, want);
    EXPECT_EQ(s->n_lp, MT);
    CU_ASSERT(same_floats(s->lp, want_lp, MT));
    EXPECT_EQ(s->usage_tokens, MT);
    EXPECT_STR(s->finish, "length");
    EXPECT_EQ(s->done, 1);
    EXPECT_EQ(router_metric(&c, reason_series), 1);
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
    double deadline = h_ms() + 20000;
    while (count_in(&conn, "data: ") < 10 && h_ms() < deadline) {
        rtc_fill(&conn, 100);
    }
    struct h_proc *victim = busy_worker(&c, "decode", 2000);
    CU_ASSERT_FATAL(victim != NULL);
    int before = count_in(&conn, "data: ");
    h_stop(victim, SIGKILL, 5000);
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, 30000), 200);
    struct streamed *s = calloc(1, sizeof(*s));
    parse_stream(r.body, s);
    printf("\n  killed %s after %d events; %d tokens in all\n", victim->id, before, s->n_lp);
    EXPECT_STR(s->text, want);
    EXPECT_EQ(s->n_lp, MT);
    CU_ASSERT(same_floats(s->lp, want_lp, MT));
    EXPECT_EQ(s->usage_tokens, MT);
    EXPECT_STR(s->finish, "length");
    EXPECT_EQ(s->done, 1);
    EXPECT_EQ(router_metric(&c, "tandem:router_retries_total{reason=\"recovery\"}"), 1);
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
    double deadline = h_ms() + 20000;
    while (count_in(&conn, "data: ") < 5 && h_ms() < deadline) {
        rtc_fill(&conn, 100);
    }
    CU_ASSERT(count_in(&conn, "data: ") >= 5);
    struct h_proc *d = busy_worker(&c, "decode", 2000);
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT(h_proc_metric(d, "tandem:kv_blocks{state=\"used\"}") > 0);
    double t0 = h_ms();
    rtc_close(&conn);
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(h_wait_used(&c.d[i], 0, 1000), 0);
        EXPECT_EQ(h_wait_used(&c.p[i], 0, 1000), 0);
    }
    double dt = h_ms() - t0;
    printf("\n  blocks released %.0f ms after the disconnect\n", dt);
    CU_ASSERT(dt < 1000);
    EXPECT_EQ(router_metric(&c, "tandem:router_requests_total{code=\"499\"}"), 1);
    EXPECT_EQ(router_metric(&c, "vllm:num_requests_running{model_name=\"tiny\"}"), 0);
    cluster_stop(&c);
}

/* ---- Busy workers, the pending queue, 429 --------------------------------- */

static void test_busy_queue_and_429(void)
{
    /* One running request per worker and no waiting room: a third request
     * gets Busy from both and waits in the router until one finishes. */
    const char *wargs[] = {"--max-running", "1", "--max-waiting", "0", NULL};
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 0, 2, NULL, wargs) == 0);
    uint32_t prompt[64];
    h_prompt(prompt, 64, 61, 3, 259);
    struct rtc_conn conns[3];
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_FATAL(send_stream(&conns[i], c.port, prompt, 64, 60) == 0);
        h_sleep_ms(20);
    }
    for (int i = 0; i < 3; i++) {
        struct rtc_resp r;
        EXPECT_EQ(rtc_read(&conns[i], &r, 30000), 200);
        struct streamed *s = calloc(1, sizeof(*s));
        parse_stream(r.body, s);
        EXPECT_EQ(s->n_lp, 60);
        EXPECT_EQ(s->done, 1);
        free(s);
        rtc_resp_free(&r);
        rtc_close(&conns[i]);
    }
    CU_ASSERT(router_metric(&c, "tandem:router_retries_total{reason=\"busy\"}") >= 2);
    cluster_stop(&c);

    /* No queue: the third request is refused at once. */
    const char *rargs[] = {"--max-pending", "0", NULL};
    CU_ASSERT_FATAL(cluster_start(&c, 0, 2, rargs, wargs) == 0);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_FATAL(send_stream(&conns[i], c.port, prompt, 64, 200) == 0);
    }
    /* Both workers took one. */
    double deadline = h_ms() + 10000;
    while ((count_in(&conns[0], "data: ") == 0 || count_in(&conns[1], "data: ") == 0) &&
           h_ms() < deadline) {
        rtc_fill(&conns[0], 10);
        rtc_fill(&conns[1], 10);
    }
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
        EXPECT_EQ(rtc_read(&conns[i], &r, 30000), 200);
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
    EXPECT_EQ(h_stop(&c.router, SIGTERM, 5000), 0);
    CU_ASSERT_FATAL(start_router(&c, NULL, 1) == 0);
    double t0 = h_ms();
    int healthy = rtc_wait_healthy(c.port, 4, 2000);
    double dt = h_ms() - t0;
    printf("\n  %d workers back %.0f ms after the new router started\n", healthy, dt);
    EXPECT_EQ(healthy, 4);
    CU_ASSERT(dt <= 2000);
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", req, &r), 200);
    json_t *j = json_loads(r.body, 0, NULL);
    EXPECT_EQ(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")),
              4);
    json_decref(j);
    rtc_resp_free(&r);
    cluster_stop(&c);
}

/* ---- Missed heartbeats --------------------------------------------------- */

/* A stopped worker (SIGSTOP) keeps its connection but sends no heartbeat:
 * unhealthy after --heartbeat-timeout-ms, requests go to the other one; it
 * rejoins by itself once it runs again. A killed one is unhealthy at once. */
static void test_heartbeat_timeout(void)
{
    const char *rargs[] = {"--heartbeat-timeout-ms", "600", NULL};
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 0, 2, rargs, NULL) == 0);
    double t0 = h_ms();
    kill(c.d[0].pid, SIGSTOP);
    int healthy = 2;
    while (healthy != 1 && h_ms() - t0 < 5000) {
        healthy = rtc_wait_healthy(c.port, 2, 0);
        h_sleep_ms(20);
    }
    double dt = h_ms() - t0;
    printf("\n  stopped worker unhealthy after %.0f ms (timeout 600 ms)\n", dt);
    EXPECT_EQ(healthy, 1);
    /* The last heartbeat came up to one period (250 ms) before the stop. */
    CU_ASSERT(dt >= 600 - 250 - 50 && dt < 3000); /* generous: a shared machine */
    struct rtc_resp r;
    for (int i = 0; i < 3; i++) {
        EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"hb\",\"max_tokens\":2}", &r),
                  200);
        rtc_resp_free(&r);
    }
    kill(c.d[0].pid, SIGCONT);
    t0 = h_ms();
    EXPECT_EQ(rtc_wait_healthy(c.port, 2, 2000), 2);
    printf("  back after %.0f ms\n", h_ms() - t0);
    cluster_stop(&c);
}

/* Killed: the link drops and the endpoint is unhealthy at once, long before
 * a heartbeat timeout (10 s here, so only the link can tell the router). */
static void test_link_loss(void)
{
    const char *rargs[] = {"--heartbeat-timeout-ms", "10000", NULL};
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, 0, 2, rargs, NULL) == 0);
    EXPECT_EQ(rtc_wait_healthy(c.port, 2, 2000), 2);
    h_stop(&c.d[1], SIGKILL, 5000);
    double t0 = h_ms();
    int healthy = 2;
    while (healthy != 1 && h_ms() - t0 < 8000) {
        healthy = rtc_wait_healthy(c.port, 2, 0);
        h_sleep_ms(5);
    }
    EXPECT_EQ(healthy, 1);
    double dt = h_ms() - t0;
    printf("\n  killed worker unhealthy after %.0f ms (heartbeat timeout 10 s)\n", dt);
    CU_ASSERT(dt < 5000);
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
    CU_ASSERT(dt >= 650 && dt < 2500);
    json_t *j = json_loads(r.body, 0, NULL);
    EXPECT_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "timeout");
    json_decref(j);
    rtc_resp_free(&r);
    EXPECT_EQ(h_wait_used(&c.d[0], 0, 1000), 0);
    uint32_t prompt[20];
    h_prompt(prompt, 20, 71, 3, 259);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(send_stream(&conn, c.port, prompt, 20, 3000) == 0);
    EXPECT_EQ(rtc_read(&conn, &r, 10000), 200);
    struct streamed *s = calloc(1, sizeof(*s));
    parse_stream(r.body, s);
    EXPECT_STR(s->finish, "abort");
    EXPECT_EQ(s->done, 1);
    CU_ASSERT(s->n_lp > 0 && s->n_lp < 3000);
    free(s);
    rtc_resp_free(&r);
    rtc_close(&conn);
    EXPECT_EQ(h_wait_used(&c.d[0], 0, 1000), 0);
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
