/* Integration: the limits of the router's HTTP front that live in the router
 * process (docs/reliability.md "Limits", router --help), one test each, over
 * real HTTP against tandem-router: the value at the limit is served, one
 * past it refused with the documented status and body, and the router goes
 * on serving. Header block (16 KiB, 431) and URL (414), body (--max-body,
 * 413, Content-Length and chunked), JSON nesting (2048, 400), the context
 * (from the workers' Hello, 400 context_length_exceeded), pipelining (16
 * waiting: reading pauses, nothing refused), open connections
 * (--max-connections, 503), the request timeout (--request-timeout-ms, 408)
 * and the keep-alive idle timeout (--idle-timeout-ms), the pending queue
 * (--max-pending, 429 with Retry-After). Limits of the pure modules are
 * tested beside them (test_http, test_openai); docs/reliability.md "Input
 * limits and their tests" lists which test holds each. Every process must
 * exit 0 on SIGTERM. */
#include <CUnit/Basic.h>

#include "rt_cluster.h"

#define MAX_BODY 65536

static void teardown(void)
{
    h_cleanup_all();
}

/* ---- A router with a colocated sim worker (zero modelled time) ----------- */

struct simc {
    struct h_proc router, worker;
    int port;
};

static int simc_start(struct simc *s, const char *const *extra)
{
    char announce[H_URL_MAX];
    h_ipc_url(announce, sizeof(announce), "limits-announce");
    char body_s[16];
    snprintf(body_s, sizeof(body_s), "%d", MAX_BODY);
    const char *args[24] = {"--announce",  announce, "--model",    "llama-3-8b",
                            "--log-level", "error",  "--max-body", body_s};
    int n = 8;
    for (int i = 0; extra && extra[i] && n < 23; i++) {
        args[n++] = extra[i];
    }
    args[n] = NULL;
    if (rtc_spawn_router(&s->router, args, &s->port) != 0) {
        return -1;
    }
    const char *wargs[] = {"--colocated", "--backend",    "sim",   "--model",
                           "llama-3-8b",  "--time-scale", "0",     "--router",
                           announce,      "--log-level",  "error", NULL};
    if (h_spawn(&s->worker, "tandem-decode", wargs, 20000) != 0) {
        return -1;
    }
    return rtc_wait_healthy(s->port, 1, RTC_HANG_MS) == 1 ? 0 : -1;
}

static void simc_stop(struct simc *s)
{
    EXPECT_EQ(h_stop(&s->router, SIGTERM, 10000), 0);
    EXPECT_EQ(h_stop(&s->worker, SIGTERM, 15000), 0);
}

/* A router without workers (its HTTP limits need none). */
static int bare_start(struct h_proc *r, int *port, const char *const *extra)
{
    const char *args[16] = {"--announce", "none", "--log-level", "error"};
    int n = 4;
    for (int i = 0; extra && extra[i] && n < 15; i++) {
        args[n++] = extra[i];
    }
    args[n] = NULL;
    return rtc_spawn_router(r, args, port);
}

/* Sends raw (len bytes) on a new connection, reads one response into *r
 * (the caller frees it) and, when closed is not NULL, waits to see whether
 * the router closes the connection after it (for a refusal: a kept-alive
 * connection would hold the wait for RTC_HANG_MS). Returns the status, or
 * -1. */
static int raw_exchange(int port, const char *raw, size_t len, struct rtc_resp *r, int *closed)
{
    struct rtc_conn c;
    memset(r, 0, sizeof(*r));
    r->status = -1;
    if (rtc_connect(&c, port) != 0) {
        return -1;
    }
    int st = -1;
    if (rtc_send(&c, raw, len) == 0) {
        st = rtc_read(&c, r, RTC_HANG_MS);
    }
    if (closed != NULL) {
        *closed = st > 0 && rtc_fill(&c, RTC_HANG_MS) == 0;
    }
    rtc_close(&c);
    return st;
}

/* The router's own error body for an HTTP-level refusal (common/http.c). */
static void expect_http_error(const struct rtc_resp *r, int status, const char *message)
{
    char want[256];
    snprintf(want, sizeof(want),
             "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":%d}}", message,
             status >= 500 ? "server_error" : "invalid_request_error", status);
    EXPECT_STR(r->body, want);
}

/* The router still answers a completion. */
static void expect_serving(int port)
{
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(port, "/v1/completions", "{\"prompt\":\"ok\",\"max_tokens\":2}", &r), 200);
    CU_ASSERT(r.body != NULL && strstr(r.body, "\"completion_tokens\":2") != NULL);
    rtc_resp_free(&r);
}

/* ---- Header block and URL: 16 KiB ---------------------------------------- */

/* The block counts the URL and, per header field, name + value + 6 (": ",
 * CRLF and the server's separators): "GET /health" with Host and X-Pad is
 * 7 + (4 + 1 + 6) + (5 + pad + 6). */
static void test_header_block(void)
{
    struct simc s;
    CU_ASSERT_FATAL(simc_start(&s, NULL) == 0);
    static char req[20000];
    for (int over = 0; over <= 1; over++) {
        int pad = 16384 - 29 + over;
        int n = snprintf(req, sizeof(req), "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ");
        memset(req + n, 'p', (size_t)pad);
        n += pad;
        n += snprintf(req + n, sizeof(req) - (size_t)n, "\r\n\r\n");
        struct rtc_resp r;
        int closed = 0;
        EXPECT_EQ(raw_exchange(s.port, req, (size_t)n, &r, over ? &closed : NULL),
                  over ? 431 : 200);
        if (over) {
            expect_http_error(&r, 431, "request header fields too large");
            EXPECT_EQ(closed, 1);
        } else {
            CU_ASSERT(r.body != NULL && strncmp(r.body, "{\"status\":\"ok\"", 14) == 0);
        }
        rtc_resp_free(&r);
    }
    /* The URL alone (no header field): 16384 bytes are served, 16385 are
     * 414. The router routes on the path, so a long query is fine. */
    for (int over = 0; over <= 1; over++) {
        int n = snprintf(req, sizeof(req), "GET /health?");
        int q = 16384 - 8 + over;
        memset(req + n, 'q', (size_t)q);
        n += q;
        n += snprintf(req + n, sizeof(req) - (size_t)n, " HTTP/1.1\r\n\r\n");
        struct rtc_resp r;
        int closed = 0;
        EXPECT_EQ(raw_exchange(s.port, req, (size_t)n, &r, over ? &closed : NULL),
                  over ? 414 : 200);
        if (over) {
            expect_http_error(&r, 414, "request URI too long");
            EXPECT_EQ(closed, 1);
        }
        rtc_resp_free(&r);
    }
    expect_serving(s.port);
    simc_stop(&s);
}

/* ---- Body: --max-body ------------------------------------------------------ */

/* A completion body of exactly len bytes (JSON, padded with spaces). */
static char *body_of(size_t len)
{
    char *b = malloc(len + 1);
    const char *json = "{\"prompt\":\"big\",\"max_tokens\":2}";
    memset(b, ' ', len);
    memcpy(b, json, strlen(json));
    b[len] = '\0';
    return b;
}

static void test_body(void)
{
    struct simc s;
    CU_ASSERT_FATAL(simc_start(&s, NULL) == 0);
    static char req[2 * MAX_BODY];
    for (int over = 0; over <= 1; over++) {
        size_t len = (size_t)MAX_BODY + (size_t)over;
        char *body = body_of(len);
        /* Content-Length: refused at the headers. */
        int n = snprintf(req, sizeof(req),
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n",
                         len);
        memcpy(req + n, body, len);
        struct rtc_resp r;
        int closed = 0;
        EXPECT_EQ(raw_exchange(s.port, req, (size_t)n + len, &r, over ? &closed : NULL),
                  over ? 413 : 200);
        if (over) {
            expect_http_error(&r, 413, "request body too large");
            EXPECT_EQ(closed, 1);
        } else {
            CU_ASSERT(r.body != NULL && strstr(r.body, "\"completion_tokens\":2") != NULL);
        }
        rtc_resp_free(&r);
        /* Chunked: the decoded total counts (two chunks). */
        size_t half = len / 2;
        n = snprintf(req, sizeof(req),
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     "\r\n%zx\r\n",
                     half);
        memcpy(req + n, body, half);
        n += (int)half;
        n += snprintf(req + n, sizeof(req) - (size_t)n, "\r\n%zx\r\n", len - half);
        memcpy(req + n, body + half, len - half);
        n += (int)(len - half);
        n += snprintf(req + n, sizeof(req) - (size_t)n, "\r\n0\r\n\r\n");
        EXPECT_EQ(raw_exchange(s.port, req, (size_t)n, &r, over ? &closed : NULL),
                  over ? 413 : 200);
        if (over) {
            expect_http_error(&r, 413, "request body too large");
            EXPECT_EQ(closed, 1);
        }
        rtc_resp_free(&r);
        free(body);
    }
    expect_serving(s.port);
    simc_stop(&s);
}

/* ---- JSON nesting: 2048 levels --------------------------------------------- */

static void test_json_depth(void)
{
    struct simc s;
    CU_ASSERT_FATAL(simc_start(&s, NULL) == 0);
    for (int over = 0; over <= 1; over++) {
        /* The body object is level 1; an ignored field nests the rest. */
        int depth = 2048 + over;
        char *body = malloc(2 * (size_t)depth + 64);
        int n = sprintf(body, "{\"prompt\":\"deep\",\"max_tokens\":2,\"nest\":");
        for (int i = 0; i < depth - 1; i++) {
            body[n++] = '[';
        }
        int col = n; /* the column of the last '[' (of level depth) */
        for (int i = 0; i < depth - 1; i++) {
            body[n++] = ']';
        }
        body[n++] = '}';
        body[n] = '\0';
        struct rtc_resp r;
        EXPECT_EQ(rtc_post(s.port, "/v1/completions", body, &r), over ? 400 : 200);
        if (over) {
            json_t *doc = json_loads(r.body ? r.body : "", JSON_ALLOW_NUL, NULL);
            json_t *e = json_object_get(doc, "error");
            char want[256];
            snprintf(want, sizeof(want),
                     "We could not parse the JSON body of your request: maximum parsing depth "
                     "reached near '[' (line 1, column %d).",
                     col);
            EXPECT_STR(json_string_value(json_object_get(e, "message")), want);
            EXPECT_STR(json_string_value(json_object_get(e, "type")), "invalid_request_error");
            EXPECT_STR(json_string_value(json_object_get(e, "code")), "invalid_json");
            json_decref(doc);
        }
        rtc_resp_free(&r);
        free(body);
    }
    expect_serving(s.port);
    simc_stop(&s);
}

/* ---- The context: the workers' max_context ------------------------------- */

/* Without --max-context the router takes the context its decode workers
 * announce: prompt + max_tokens may fill it exactly, not one token more. */
static void test_context(void)
{
    struct simc s;
    CU_ASSERT_FATAL(simc_start(&s, NULL) == 0);
    json_t *cl = rtc_get_json(s.port, "/v1/cluster");
    int announced = (int)json_integer_value(
        json_object_get(json_array_get(json_object_get(cl, "endpoints"), 0), "max_context"));
    json_decref(cl);
    json_t *models = rtc_get_json(s.port, "/v1/models");
    int ctx = (int)json_integer_value(
        json_object_get(json_array_get(json_object_get(models, "data"), 0), "max_model_len"));
    json_decref(models);
    printf("\n  context %d (the worker announced %d)\n", ctx, announced);
    EXPECT_EQ(ctx, announced);
    CU_ASSERT_FATAL(ctx > 8 && ctx <= 16384);
    uint32_t *prompt = malloc(sizeof(uint32_t) * (size_t)ctx);
    h_prompt(prompt, ctx, 7, 3, 259);
    for (int over = 0; over <= 1; over++) {
        int n = ctx - 4 + over;
        char *ids = rtc_ids_json(prompt, n);
        char *body = malloc(strlen(ids) + 64);
        sprintf(body, "{\"prompt\":%s,\"max_tokens\":4}", ids);
        struct rtc_resp r;
        EXPECT_EQ(rtc_post(s.port, "/v1/completions", body, &r), over ? 400 : 200);
        json_t *doc = json_loads(r.body ? r.body : "", JSON_ALLOW_NUL, NULL);
        if (over) {
            json_t *e = json_object_get(doc, "error");
            char want[256];
            snprintf(want, sizeof(want),
                     "This model's maximum context length is %d tokens. However, you requested "
                     "%d tokens (%d in the messages, 4 in the completion). Please reduce the "
                     "length of the messages or completion.",
                     ctx, ctx + 1, n);
            EXPECT_STR(json_string_value(json_object_get(e, "message")), want);
            EXPECT_STR(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
            EXPECT_STR(json_string_value(json_object_get(e, "param")), "prompt");
        } else {
            json_t *u = json_object_get(doc, "usage");
            EXPECT_EQ(json_integer_value(json_object_get(u, "prompt_tokens")), n);
            EXPECT_EQ(json_integer_value(json_object_get(u, "completion_tokens")), 4);
        }
        json_decref(doc);
        rtc_resp_free(&r);
        free(body);
        free(ids);
    }
    free(prompt);
    simc_stop(&s);
}

/* ---- Pipelining: 16 waiting, then reading pauses ---------------------------- */

/* More requests than may wait on a connection: nothing is refused, every
 * one is answered, in order. */
static void test_pipelined(void)
{
    struct simc s;
    CU_ASSERT_FATAL(simc_start(&s, NULL) == 0);
    enum { N = 40 };
    static char reqs[N * 160];
    size_t len = 0;
    const char *body = "{\"prompt\":\"p\",\"max_tokens\":1}";
    for (int i = 0; i < N; i++) {
        len += (size_t)sprintf(reqs + len,
                               i % 2 ? "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                     : "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                       "Content-Length: %zu\r\n\r\n%s",
                               strlen(body), body);
    }
    struct rtc_conn c;
    CU_ASSERT_FATAL(rtc_connect(&c, s.port) == 0);
    EXPECT_EQ(rtc_send(&c, reqs, len), 0);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        struct rtc_resp r;
        int st = rtc_read(&c, &r, RTC_HANG_MS);
        const char *want = i % 2 ? "{\"status\":\"ok\"" : "{\"id\":\"cmpl-";
        ok += st == 200 && r.body != NULL && strncmp(r.body, want, strlen(want)) == 0;
        rtc_resp_free(&r);
    }
    rtc_close(&c);
    EXPECT_EQ(ok, N);
    simc_stop(&s);
}

/* ---- Open connections: --max-connections ---------------------------------- */

static void test_max_connections(void)
{
    struct h_proc router;
    int port = 0;
    const char *args[] = {"--max-connections", "4", NULL};
    CU_ASSERT_FATAL(bare_start(&router, &port, args) == 0);
    /* 4 open connections, each served (keep-alive, they stay open). */
    struct rtc_conn held[4];
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_FATAL(rtc_connect(&held[i], port) == 0);
        EXPECT_EQ(rtc_send(&held[i], get, strlen(get)), 0);
        struct rtc_resp r;
        EXPECT_EQ(rtc_read(&held[i], &r, RTC_HANG_MS), 200);
        EXPECT_EQ(r.closed, 0);
        rtc_resp_free(&r);
    }
    /* The 5th: 503, then closed. */
    struct rtc_resp r;
    int closed = 0;
    EXPECT_EQ(raw_exchange(port, get, strlen(get), &r, &closed), 503);
    expect_http_error(&r, 503, "too many connections");
    char retry[16];
    rtc_header(r.headers, "Retry-After", retry, sizeof(retry));
    EXPECT_STR(retry, "1");
    EXPECT_EQ(closed, 1);
    rtc_resp_free(&r);
    /* One closes: a new connection is served again once the router has
     * seen it go. */
    rtc_close(&held[0]);
    double deadline = h_ms() + RTC_HANG_MS;
    int st;
    while ((st = rtc_get(port, "/health", &r)) != 200 && h_ms() < deadline) {
        rtc_resp_free(&r);
        h_sleep_ms(10);
    }
    rtc_resp_free(&r);
    EXPECT_EQ(st, 200);
    for (int i = 1; i < 4; i++) {
        rtc_close(&held[i]);
    }
    EXPECT_EQ(h_stop(&router, SIGTERM, 10000), 0);
}

/* ---- Time: --request-timeout-ms and --idle-timeout-ms ---------------------- */

#define REQUEST_TIMEOUT_MS 2000
#define IDLE_TIMEOUT_MS    1000

static void test_request_and_idle_timeouts(void)
{
    struct h_proc router;
    int port = 0;
    char rt[16], it[16];
    snprintf(rt, sizeof(rt), "%d", REQUEST_TIMEOUT_MS);
    snprintf(it, sizeof(it), "%d", IDLE_TIMEOUT_MS);
    const char *args[] = {"--request-timeout-ms", rt, "--idle-timeout-ms", it, NULL};
    CU_ASSERT_FATAL(bare_start(&router, &port, args) == 0);
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

    /* Within the request timeout: a request in two parts is served. (The
     * parts are sent back to back; a stall of the whole 2 s between them
     * would be needed to miss.) */
    struct rtc_conn c;
    CU_ASSERT_FATAL(rtc_connect(&c, port) == 0);
    EXPECT_EQ(rtc_send(&c, get, 10), 0);
    EXPECT_EQ(rtc_send(&c, get + 10, strlen(get) - 10), 0);
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&c, &r, RTC_HANG_MS), 200);
    rtc_resp_free(&r);
    rtc_close(&c);
    /* Past it: a request that never ends is 408, then closed. */
    struct rtc_conn slow;
    CU_ASSERT_FATAL(rtc_connect(&slow, port) == 0);
    double t0 = h_ms();
    EXPECT_EQ(rtc_send(&slow, get, 10), 0);
    EXPECT_EQ(rtc_read(&slow, &r, RTC_HANG_MS), 408);
    double ms = h_ms() - t0;
    expect_http_error(&r, 408, "request not received in time");
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_fill(&slow, RTC_HANG_MS), 0);
    rtc_close(&slow);
    printf("\n  408 after %.0f ms (request timeout %d ms)\n", ms, REQUEST_TIMEOUT_MS);
    /* Not before the timeout. This cannot flake: our clock starts before the
     * first byte is sent, the router's timer when it has read it; only its
     * loop's cached time (updated just before the read) could start it
     * early, by far less than the 50 ms allowed. */
    CU_ASSERT(ms >= REQUEST_TIMEOUT_MS - 50);

    /* Keep-alive: the next request right after an answer is served on the
     * same connection (well within the idle timeout). */
    CU_ASSERT_FATAL(rtc_connect(&c, port) == 0);
    EXPECT_EQ(rtc_send(&c, get, strlen(get)), 0);
    EXPECT_EQ(rtc_read(&c, &r, RTC_HANG_MS), 200);
    EXPECT_EQ(r.closed, 0);
    rtc_resp_free(&r);
    t0 = h_ms();
    EXPECT_EQ(rtc_send(&c, get, strlen(get)), 0);
    EXPECT_EQ(rtc_read(&c, &r, RTC_HANG_MS), 200);
    EXPECT_EQ(r.closed, 0);
    rtc_resp_free(&r);
    /* Then idle: closed without a byte. */
    EXPECT_EQ(rtc_fill(&c, RTC_HANG_MS), 0);
    EXPECT_EQ(c.len, 0);
    ms = h_ms() - t0;
    printf("  idle connection closed %.0f ms after its last request (idle timeout %d ms)\n", ms,
           IDLE_TIMEOUT_MS);
    /* Not before the timeout: t0 is before the last request was sent, and
     * the idle clock starts only once it is answered; as above, only the
     * loop's cached time could start it early. */
    CU_ASSERT(ms >= IDLE_TIMEOUT_MS - 50);
    rtc_close(&c);
    EXPECT_EQ(h_stop(&router, SIGTERM, 10000), 0);
}

/* ---- The pending queue: --max-pending -------------------------------------- */

/* One tiny decode worker that runs one request and queues none. With A
 * generating, B gets Busy and waits in the router's queue (1 = the limit);
 * C finds the queue full: 429 with Retry-After. Then A and B complete. */
static void test_max_pending(void)
{
    const char *rargs[] = {"--max-pending", "1", NULL};
    const char *wargs[] = {"--max-running", "1", "--max-waiting", "0", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 1, rargs, wargs) == 0);
    uint32_t prompt[32];
    h_prompt(prompt, 32, 5, 3, 259);
    struct rtc_conn a, b;
    CU_ASSERT_FATAL(rtc_send_completion(&a, c.port, prompt, 32, 400, 1) == 0);
    CU_ASSERT_FATAL(rtc_wait_events(&a, 1));
    CU_ASSERT_FATAL(rtc_send_completion(&b, c.port, prompt, 32, 4, 0) == 0);
    const char *waiting = "vllm:num_requests_waiting{model_name=\"tiny\"}";
    double deadline = h_ms() + RTC_HANG_MS;
    while (!(rtc_metric(c.port, waiting) == 1) && h_ms() < deadline) {
        h_sleep_ms(5);
    }
    EXPECT_NUM(rtc_metric(c.port, waiting), 1);
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"c\",\"max_tokens\":2}", &r), 429);
    char retry[16];
    rtc_header(r.headers, "Retry-After", retry, sizeof(retry));
    EXPECT_STR(retry, "1");
    json_t *doc = json_loads(r.body ? r.body : "", JSON_ALLOW_NUL, NULL);
    json_t *e = json_object_get(doc, "error");
    EXPECT_STR(json_string_value(json_object_get(e, "type")), "rate_limit_error");
    EXPECT_STR(json_string_value(json_object_get(e, "code")), "rate_limit_exceeded");
    EXPECT_STR(json_string_value(json_object_get(e, "message")),
               "The server is saturated: too many requests are pending. Retry after 1 s.");
    json_decref(doc);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_read(&a, &r, RTC_HANG_MS), 200);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_read(&b, &r, RTC_HANG_MS), 200);
    CU_ASSERT(r.body != NULL && strstr(r.body, "\"completion_tokens\":4") != NULL);
    rtc_resp_free(&r);
    rtc_close(&a);
    rtc_close(&b);
    EXPECT_NUM(rtc_metric(c.port, waiting), 0);
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_requests_total{code=\"429\"}"), 1);
    rtc_cluster_stop(&c);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("router_limits", NULL, NULL, NULL, teardown);
    CU_add_test(s, "header_block", test_header_block);
    CU_add_test(s, "body", test_body);
    CU_add_test(s, "json_depth", test_json_depth);
    CU_add_test(s, "context", test_context);
    CU_add_test(s, "pipelined", test_pipelined);
    CU_add_test(s, "max_connections", test_max_connections);
    CU_add_test(s, "request_and_idle_timeouts", test_request_and_idle_timeouts);
    CU_add_test(s, "max_pending", test_max_pending);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
