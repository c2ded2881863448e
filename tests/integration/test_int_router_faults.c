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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "rt_cluster.h"

static void teardown(void)
{
    h_cleanup_all();
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
    /* A small token budget makes the 600-token prefill take many steps. */
    const char *wargs[] = {"--token-budget", "32", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, n_p, 2, NULL, wargs) == 0);
    enum { N = 600, MT = 8 };
    static uint32_t prompt[N];
    h_prompt(prompt, N, 31, 3, 259);
    float want_lp[MT];
    char *want = reference_text(prompt, N, MT, want_lp);
    CU_ASSERT_FATAL(want != NULL);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(rtc_send_completion(&conn, c.port, prompt, N, MT, 1) == 0);
    struct h_proc *victim = rtc_busy_worker(&c, role, RTC_HANG_MS);
    CU_ASSERT_FATAL(victim != NULL);
    /* Nothing streamed yet: the router sends the headers with the first
     * token. */
    EXPECT_EQ(rtc_fill(&conn, 0), -1);
    printf("\n  killing %s %s before its first token\n", role, victim->id);
    rtc_kill(victim);
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, RTC_HANG_MS), 200);
    struct rtc_answer *s = calloc(1, sizeof(*s));
    rtc_answer_parse(r.body, 1, s);
    EXPECT_STR(s->text, want);
    EXPECT_EQ(s->n_lp, MT);
    CU_ASSERT(same_floats(s->lp, want_lp, MT));
    EXPECT_EQ(s->completion_tokens, MT);
    EXPECT_STR(s->finish, "length");
    EXPECT_EQ(s->done, 1);
    EXPECT_NUM(rtc_metric(c.port, reason_series), 1);
    free(s);
    rtc_resp_free(&r);
    rtc_close(&conn);
    free(want);
    rtc_cluster_stop(&c);
}

static void test_decode_killed_before_first_token(void)
{
    /* No prefill worker: the decode worker prefills. */
    killed_before_first("decode", 0, "tandem:router_retries_total{reason=\"failure\"}");
}

static void test_prefill_killed_before_first_token(void)
{
    /* 600 uncached tokens: the default routing prefills remotely. */
    killed_before_first("prefill", 2, "tandem:router_retries_total{reason=\"failure\"}");
}

/* ---- Killed mid-stream -------------------------------------------------- */

static void test_decode_killed_mid_stream(void)
{
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 2, 2, NULL, NULL) == 0);
    enum { N = 300, MT = 150 };
    uint32_t prompt[N];
    h_prompt(prompt, N, 41, 3, 259);
    float want_lp[MT];
    char *want = reference_text(prompt, N, MT, want_lp);
    CU_ASSERT_FATAL(want != NULL);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(rtc_send_completion(&conn, c.port, prompt, N, MT, 1) == 0);
    /* Wait for about 10 tokens (one event each, the first with the role). */
    CU_ASSERT_FATAL(rtc_wait_events(&conn, 10));
    struct h_proc *victim = rtc_busy_worker(&c, "decode", RTC_HANG_MS);
    CU_ASSERT_FATAL(victim != NULL);
    int before = rtc_count_in(&conn, "data: ");
    rtc_kill(victim);
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, RTC_HANG_MS), 200);
    struct rtc_answer *s = calloc(1, sizeof(*s));
    rtc_answer_parse(r.body, 1, s);
    printf("\n  killed %s after %d events; %d tokens in all\n", victim->id, before, s->n_lp);
    EXPECT_STR(s->text, want);
    EXPECT_EQ(s->n_lp, MT);
    CU_ASSERT(same_floats(s->lp, want_lp, MT));
    EXPECT_EQ(s->completion_tokens, MT);
    EXPECT_STR(s->finish, "length");
    EXPECT_EQ(s->done, 1);
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_retries_total{reason=\"recovery\"}"), 1);
    free(s);
    rtc_resp_free(&r);
    rtc_close(&conn);
    free(want);
    rtc_cluster_stop(&c);
}

/* ---- Client disconnect -------------------------------------------------- */

static void test_client_disconnect(void)
{
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 2, 2, NULL, NULL) == 0);
    uint32_t prompt[300];
    h_prompt(prompt, 300, 51, 3, 259);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(rtc_send_completion(&conn, c.port, prompt, 300, 3000, 1) == 0);
    CU_ASSERT(rtc_wait_events(&conn, 5));
    struct h_proc *d = rtc_busy_worker(&c, "decode", RTC_HANG_MS);
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT(h_proc_metric(d, "tandem:kv_blocks{state=\"used\"}") > 0);
    double t0 = h_ms();
    rtc_close(&conn);
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(h_wait_used(&c.d[i], 0, RTC_HANG_MS), 0);
        EXPECT_EQ(h_wait_used(&c.p[i], 0, RTC_HANG_MS), 0);
    }
    printf("\n  blocks released %.0f ms after the disconnect\n", h_ms() - t0);
    /* Freed because the router cancelled it, not because its 3000 tokens
     * ran out meanwhile. */
    double cancelled =
        h_proc_metric_sum(d, "vllm:request_success_total{finished_reason=\"cancelled\"");
    double length = h_proc_metric_sum(d, "vllm:request_success_total{finished_reason=\"length\"");
    /* One cancel, the disconnect's; a loaded machine can add one per retry (a worker that
     * missed its heartbeats: its attempt is cancelled and the request placed again, maybe on d). */
    double retries = rtc_metric(c.port, "tandem:router_retries_total{reason=\"failure\"}") +
                     rtc_metric(c.port, "tandem:router_retries_total{reason=\"recovery\"}");
    if (retries > 0) {
        printf("  %.0f retries (a loaded machine), %.0f cancels on %s\n", retries, cancelled,
               d->id);
    }
    CU_ASSERT(cancelled >= 1 && cancelled <= 1 + retries);
    CU_ASSERT(!(length > 0));
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_requests_total{code=\"499\"}"), 1);
    EXPECT_NUM(rtc_metric(c.port, "vllm:num_requests_running{model_name=\"tiny\"}"), 0);
    rtc_cluster_stop(&c);
}

/* ---- Busy workers, the pending queue, 429 --------------------------------- */

/* Waits until each of conns[0..n) has received a streamed event (its worker
 * took it and is generating). Returns 1, or 0 after RTC_HANG_MS. */
static int all_streaming(struct rtc_conn *conns, int n)
{
    double deadline = h_ms() + RTC_HANG_MS;
    for (;;) {
        int streaming = 0;
        for (int i = 0; i < n; i++) {
            streaming += rtc_count_in(&conns[i], "data: ") > 0;
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
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 2, NULL, wargs) == 0);
    uint32_t prompt[64];
    h_prompt(prompt, 64, 61, 3, 259);
    struct rtc_conn conns[3];
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_FATAL(rtc_send_completion(&conns[i], c.port, prompt, 64, 400, 1) == 0);
    }
    CU_ASSERT_FATAL(all_streaming(conns, 2));
    CU_ASSERT_FATAL(rtc_send_completion(&conns[2], c.port, prompt, 64, 60, 1) == 0);
    /* It is queued: the router's pending queue holds it. */
    double deadline = h_ms() + RTC_HANG_MS;
    double waiting = 0;
    while ((waiting = rtc_metric(c.port, "vllm:num_requests_waiting{model_name=\"tiny\"}")) != 1 &&
           h_ms() < deadline) {
        h_sleep_ms(5);
    }
    EXPECT_NUM(waiting, 1);
    const int want_tokens[3] = {400, 400, 60};
    for (int i = 0; i < 3; i++) {
        struct rtc_resp r;
        EXPECT_EQ(rtc_read(&conns[i], &r, RTC_HANG_MS), 200);
        struct rtc_answer *s = calloc(1, sizeof(*s));
        rtc_answer_parse(r.body, 1, s);
        EXPECT_EQ(s->n_lp, want_tokens[i]);
        EXPECT_EQ(s->done, 1);
        free(s);
        rtc_resp_free(&r);
        rtc_close(&conns[i]);
    }
    CU_ASSERT(rtc_metric(c.port, "tandem:router_retries_total{reason=\"busy\"}") >= 2);
    EXPECT_NUM(rtc_metric(c.port, "vllm:num_requests_waiting{model_name=\"tiny\"}"), 0);
    rtc_cluster_stop(&c);

    /* No queue: with both workers generating, a third request is refused
     * at once. */
    const char *rargs[] = {"--max-pending", "0", NULL};
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 2, rargs, wargs) == 0);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_FATAL(rtc_send_completion(&conns[i], c.port, prompt, 64, 400, 1) == 0);
    }
    CU_ASSERT_FATAL(all_streaming(conns, 2));
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}", &r), 429);
    char retry[16];
    rtc_header(r.headers, "Retry-After", retry, sizeof(retry));
    EXPECT_STR(retry, "1");
    json_t *j = json_loads(r.body, JSON_ALLOW_NUL, NULL);
    EXPECT_STR(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
               "rate_limit_error");
    EXPECT_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
               "rate_limit_exceeded");
    json_decref(j);
    rtc_resp_free(&r);
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(rtc_read(&conns[i], &r, RTC_HANG_MS), 200);
        rtc_resp_free(&r);
        rtc_close(&conns[i]);
    }
    /* /health answered throughout. */
    EXPECT_EQ(rtc_get(c.port, "/health", &r), 200);
    rtc_resp_free(&r);
    rtc_cluster_stop(&c);
}

/* ---- Restarted router --------------------------------------------------- */

static void test_router_restart(void)
{
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 2, 2, NULL, NULL) == 0);
    struct rtc_resp r;
    const char *req = "{\"prompt\":\"restart\",\"max_tokens\":4}";
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", req, &r), 200);
    rtc_resp_free(&r);
    EXPECT_EQ(h_stop(&c.router, SIGTERM, 10000), 0);
    CU_ASSERT_FATAL(rtc_router_restart(&c, NULL, NULL) == 0);
    double t0 = h_ms();
    int healthy = rtc_wait_healthy(c.port, 4, RTC_HANG_MS);
    printf("\n  %d workers back %.0f ms after the new router started\n", healthy, h_ms() - t0);
    EXPECT_EQ(healthy, 4);
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", req, &r), 200);
    json_t *j = json_loads(r.body, JSON_ALLOW_NUL, NULL); /* the text may hold "\u0000" */
    EXPECT_EQ(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")),
              4);
    json_decref(j);
    rtc_resp_free(&r);
    rtc_cluster_stop(&c);
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

static struct ep_state endpoint_state(struct rtc_cluster *c, const char *id)
{
    struct ep_state st = {.healthy = -1, .hb_ms_ago = -1};
    json_t *j = rtc_get_json(c->port, "/v1/cluster");
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
    return st;
}

/* Polls until the endpoint's health is want (RTC_HANG_MS at most); returns the
 * snapshot that showed it (or the last one). */
static struct ep_state wait_health(struct rtc_cluster *c, const char *id, int want)
{
    double deadline = h_ms() + RTC_HANG_MS;
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
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 2, rargs, NULL) == 0);
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
    rtc_cluster_stop(&c);
}

/* Killed: the link drops and the endpoint is unhealthy at once. The
 * heartbeat timeout is an hour, so within the wait only the link can tell
 * the router. */
static void test_link_loss(void)
{
    const char *rargs[] = {"--heartbeat-timeout-ms", "3600000", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 2, rargs, NULL) == 0);
    char id[128];
    snprintf(id, sizeof(id), "%s", c.d[1].id);
    rtc_kill(&c.d[1]);
    double t0 = h_ms();
    struct ep_state st = wait_health(&c, id, 0);
    printf("\n  killed worker unhealthy after %.0f ms (heartbeat timeout 1 h)\n", h_ms() - t0);
    EXPECT_EQ(st.healthy, 0);
    EXPECT_STR(st.link, "down");
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"hb\",\"max_tokens\":2}", &r), 200);
    rtc_resp_free(&r);
    rtc_cluster_stop(&c);
}

/* ---- The per-request deadline ------------------------------------------ */

/* A generation still running at --deadline-ms ends: 504 before its stream
 * started, a last chunk with finish_reason "abort" after; the worker is
 * cancelled. */
static void test_deadline(void)
{
    const char *rargs[] = {"--deadline-ms", "700", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 1, rargs, NULL) == 0);
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
    json_t *j = json_loads(r.body, JSON_ALLOW_NUL, NULL);
    EXPECT_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "timeout");
    json_decref(j);
    rtc_resp_free(&r);
    EXPECT_EQ(h_wait_used(&c.d[0], 0, RTC_HANG_MS), 0);
    /* The router cancelled it on the worker (it did not run its 3000). */
    const char *cancelled = "vllm:request_success_total{finished_reason=\"cancelled\"";
    EXPECT_NUM(h_proc_metric_sum(&c.d[0], cancelled), 1);
    uint32_t prompt[20];
    h_prompt(prompt, 20, 71, 3, 259);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(rtc_send_completion(&conn, c.port, prompt, 20, 3000, 1) == 0);
    EXPECT_EQ(rtc_read(&conn, &r, RTC_HANG_MS), 200);
    struct rtc_answer *s = calloc(1, sizeof(*s));
    rtc_answer_parse(r.body, 1, s);
    EXPECT_STR(s->finish, "abort");
    EXPECT_EQ(s->done, 1);
    CU_ASSERT(s->n_lp > 0 && s->n_lp < 3000);
    free(s);
    rtc_resp_free(&r);
    rtc_close(&conn);
    EXPECT_EQ(h_wait_used(&c.d[0], 0, RTC_HANG_MS), 0);
    EXPECT_NUM(h_proc_metric_sum(&c.d[0], cancelled), 2);
    rtc_cluster_stop(&c);
}

/* ---- Stop ------------------------------------------------------------------ */

/* Reads c until EOF (RTC_HANG_MS at most); returns 1 at EOF. */
static int read_to_eof(struct rtc_conn *c)
{
    double deadline = h_ms() + RTC_HANG_MS;
    while (!c->eof && h_ms() < deadline) {
        rtc_fill(c, 100);
    }
    return c->eof;
}

/* Reads a whole streamed answer (status 200, the chunked end) into a, then
 * EOF, and closes s. */
static void read_whole_stream(struct rtc_conn *s, struct rtc_answer *a)
{
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(s, &r, RTC_HANG_MS), 200);
    rtc_answer_parse(r.body, 1, a);
    rtc_resp_free(&r);
    CU_ASSERT(read_to_eof(s));
    rtc_close(s);
}

/* A stopping router drains (--shutdown-drain-ms): at SIGTERM an idle
 * keep-alive client gets its EOF at once, while the router still runs (it is
 * draining a stream); new connections are refused; the stream in flight
 * runs to its end (every token, [DONE]) and its connection then closes; the
 * router exits 0. With --shutdown-drain-ms 0 a stream in flight ends at once
 * as a whole HTTP response (its chunked end, not a cut), then EOF. */
static void test_stop_drains(void)
{
    const char *rargs[] = {"--shutdown-drain-ms", "60000", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 1, 1, rargs, NULL) == 0);
    struct rtc_conn idle, s;
    struct rtc_resp r;
    CU_ASSERT_FATAL(rtc_connect(&idle, c.port) == 0);
    const char *health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    CU_ASSERT_FATAL(rtc_send(&idle, health, strlen(health)) == 0);
    EXPECT_EQ(rtc_read(&idle, &r, RTC_HANG_MS), 200);
    EXPECT_EQ(r.closed, 0); /* kept alive */
    rtc_resp_free(&r);
    uint32_t prompt[32];
    h_prompt(prompt, 32, 71, 3, 259);
    /* In flight at the SIGTERM (under ASan 1500 tokens took over RTC_HANG_MS). */
    const int max_tokens = 400;
    CU_ASSERT_FATAL(rtc_send_completion(&s, c.port, prompt, 32, max_tokens, 1) == 0);
    CU_ASSERT_FATAL(rtc_wait_events(&s, 3));

    CU_ASSERT_FATAL(kill(c.router.pid, SIGTERM) == 0);
    CU_ASSERT(read_to_eof(&idle));
    int status;
    EXPECT_EQ(waitpid(c.router.pid, &status, WNOHANG), 0); /* still draining */
    struct rtc_conn late;
    EXPECT_EQ(rtc_connect(&late, c.port), -1); /* not accepting */
    rtc_close(&idle);

    struct rtc_answer *a = calloc(1, sizeof(*a));
    read_whole_stream(&s, a);
    EXPECT_EQ(a->n_lp, max_tokens);
    EXPECT_EQ(a->done, 1);
    EXPECT_STR(a->finish, "length");
    EXPECT_EQ(h_stop(&c.router, SIGTERM, 10000), 0);
    rtc_cluster_stop(&c);

    const char *now[] = {"--shutdown-drain-ms", "0", NULL};
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 1, 1, now, NULL) == 0);
    CU_ASSERT_FATAL(rtc_send_completion(&s, c.port, prompt, 32, 3000, 1) == 0);
    CU_ASSERT_FATAL(rtc_wait_events(&s, 3));
    CU_ASSERT_FATAL(kill(c.router.pid, SIGTERM) == 0);
    memset(a, 0, sizeof(*a));
    read_whole_stream(&s, a); /* whole: chunked to its end */
    printf("\n  --shutdown-drain-ms 0: the stream ended after %d of 3000 tokens\n", a->n_lp);
    CU_ASSERT(a->n_lp < 3000);
    free(a);
    EXPECT_EQ(h_stop(&c.router, SIGTERM, 10000), 0);
    rtc_cluster_stop(&c);
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
    CU_add_test(s, "stop_drains", test_stop_drains);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
