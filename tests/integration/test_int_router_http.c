/* Integration: the router's HTTP edge cases, against the real tandem-router
 * with a colocated sim worker (zero modelled time): a short completion split
 * at every byte boundary on one keep-alive connection, pipelined requests
 * answered in order (a stream among them), bad chunked bodies (400),
 * oversized headers (431) and bodies (413), a slow client (408, closed).
 * After each, the router keeps serving; at the end both processes must exit
 * 0 on SIGTERM. Waits are for the event, with a timeout that only catches
 * hangs. */
#include <CUnit/Basic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "rt_client.h"

#define REQUEST_TIMEOUT_MS 500
#define MAX_BODY           65536
#define HANG_MS            30000 /* a wait for an event longer than this is a hang */

static struct h_proc router, worker;
static int port;

static int setup(void)
{
    char announce[H_URL_MAX];
    h_ipc_url(announce, sizeof(announce), "http-announce");
    const char *rargs[] = {
        "--announce",           announce, "--model",    "llama-3-8b", "--log-level", "error",
        "--request-timeout-ms", "500",    "--max-body", "65536",      NULL};
    if (rtc_spawn_router(&router, rargs, &port) != 0) {
        return 1;
    }
    const char *wargs[] = {"--colocated", "--backend",    "sim",   "--model",
                           "llama-3-8b",  "--time-scale", "0",     "--router",
                           announce,      "--log-level",  "error", NULL};
    if (h_spawn(&worker, "tandem-decode", wargs, 20000) != 0) {
        return 1;
    }
    return rtc_wait_healthy(port, 1, HANG_MS) == 1 ? 0 : 1;
}

static int teardown(void)
{
    h_cleanup_all();
    return 0;
}

static int completion_tokens(const char *body)
{
    const char *p = body ? strstr(body, "\"completion_tokens\":") : NULL;
    return p ? atoi(p + 20) : -1;
}

/* The router still answers a normal completion. */
static void expect_serving(void)
{
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(port, "/v1/completions", "{\"prompt\":\"ok\",\"max_tokens\":3}", &r), 200);
    EXPECT_EQ(completion_tokens(r.body), 3);
    rtc_resp_free(&r);
}

/* Sends raw on a new connection and reads one response. */
static int raw_status(const char *raw, size_t len, int *closed, double *ms)
{
    struct rtc_conn c;
    if (rtc_connect(&c, port) != 0) {
        return -1;
    }
    double t0 = h_ms();
    rtc_send(&c, raw, len);
    struct rtc_resp r;
    int st = rtc_read(&c, &r, HANG_MS);
    if (ms != NULL) {
        *ms = h_ms() - t0;
    }
    if (closed != NULL) {
        /* After an error response the server closes: EOF follows. */
        *closed = rtc_fill(&c, HANG_MS) == 0;
    }
    rtc_resp_free(&r);
    rtc_close(&c);
    return st;
}

static void test_split_every_byte(void)
{
    const char *body = "{\"prompt\":\"split\",\"max_tokens\":2}";
    char req[512];
    int len = snprintf(req, sizeof(req),
                       "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                       strlen(body), body);
    struct rtc_conn c;
    CU_ASSERT_FATAL(rtc_connect(&c, port) == 0);
    int ok = 0;
    for (int k = 1; k < len; k++) {
        rtc_send(&c, req, (size_t)k);
        h_sleep_ms(1);
        rtc_send(&c, req + k, (size_t)(len - k));
        struct rtc_resp r;
        int st = rtc_read(&c, &r, HANG_MS);
        if (st == 200 && completion_tokens(r.body) == 2 && !r.closed) {
            ok++;
        } else {
            fprintf(stderr, "\nsplit at %d: %d %s\n", k, st, r.body ? r.body : "");
        }
        rtc_resp_free(&r);
    }
    rtc_close(&c);
    EXPECT_EQ(ok, len - 1);
    printf("\n  %d split points, one keep-alive connection\n", len - 1);
}

static void test_pipelined(void)
{
    const char *a = "{\"prompt\":\"a\",\"max_tokens\":5,\"stream\":true}";
    const char *b = "{\"prompt\":\"b\",\"max_tokens\":1}";
    char req[2048];
    int len = snprintf(req, sizeof(req),
                       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s"
                       "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s"
                       "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
                       strlen(a), a, strlen(b), b);
    struct rtc_conn c;
    CU_ASSERT_FATAL(rtc_connect(&c, port) == 0);
    rtc_send(&c, req, (size_t)len);
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&c, &r, HANG_MS), 200);
    CU_ASSERT(strstr(r.headers, "text/event-stream") != NULL);
    CU_ASSERT(strstr(r.body, "data: [DONE]") != NULL);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_read(&c, &r, HANG_MS), 200);
    CU_ASSERT(strncmp(r.body, "{\"status\":\"ok\"", 14) == 0);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_read(&c, &r, HANG_MS), 200);
    EXPECT_EQ(completion_tokens(r.body), 1);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_read(&c, &r, HANG_MS), 200);
    CU_ASSERT(strstr(r.body, "\"object\":\"list\"") != NULL);
    rtc_resp_free(&r);
    rtc_close(&c);
}

static void test_chunked_bodies(void)
{
    const char *good = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n"
                       "a\r\n{\"prompt\":\r\n17\r\n\"chunked\",\"max_tokens\":\r\n2\r\n4}\r\n"
                       "0\r\n\r\n";
    struct rtc_conn c;
    CU_ASSERT_FATAL(rtc_connect(&c, port) == 0);
    rtc_send(&c, good, strlen(good));
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&c, &r, HANG_MS), 200);
    EXPECT_EQ(completion_tokens(r.body), 4);
    rtc_resp_free(&r);
    rtc_close(&c);
    const char *bad[] = {
        /* not a hex size */
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        "zz\r\n{}\r\n0\r\n\r\n",
        /* data longer than its size */
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        "2\r\n{\"prompt\":1}\r\n0\r\n\r\n",
        /* both framings */
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int closed = 0;
        EXPECT_EQ(raw_status(bad[i], strlen(bad[i]), &closed, NULL), 400);
        EXPECT_EQ(closed, 1);
    }
    expect_serving();
}

static void test_oversized(void)
{
    /* 20 KiB of headers: 431. */
    size_t cap = 32768;
    char *req = malloc(cap);
    size_t len = (size_t)snprintf(req, cap, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + len, 'a', 20480);
    len += 20480;
    len += (size_t)snprintf(req + len, cap - len, "\r\n\r\n");
    int closed = 0;
    EXPECT_EQ(raw_status(req, len, &closed, NULL), 431);
    EXPECT_EQ(closed, 1);
    /* A declared body over --max-body: 413 at the headers. */
    len = (size_t)snprintf(req, cap,
                           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",
                           MAX_BODY + 1);
    EXPECT_EQ(raw_status(req, len, &closed, NULL), 413);
    EXPECT_EQ(closed, 1);
    free(req);
    /* A chunked body that grows past it: 413. */
    size_t big = (size_t)MAX_BODY + 4096;
    req = malloc(big + 512);
    len = (size_t)snprintf(req, 512,
                           "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           "Transfer-Encoding: chunked\r\n\r\n%zx\r\n",
                           big);
    memset(req + len, ' ', big);
    len += big;
    len += (size_t)snprintf(req + len, 512, "\r\n0\r\n\r\n");
    EXPECT_EQ(raw_status(req, len, &closed, NULL), 413);
    free(req);
    expect_serving();
}

static void test_slow_client(void)
{
    const char *partial = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{";
    int closed = 0;
    double ms = 0;
    EXPECT_EQ(raw_status(partial, strlen(partial), &closed, &ms), 408);
    EXPECT_EQ(closed, 1);
    printf("\n  408 after %.0f ms (request timeout %d ms)\n", ms, REQUEST_TIMEOUT_MS);
    /* Not before the timeout. This cannot flake: our clock starts before the
     * first byte is sent, the router's timer when it has read it; only its
     * loop's cached time (updated just before the read) could start it
     * early, by far less than the 50 ms allowed. */
    CU_ASSERT(ms >= REQUEST_TIMEOUT_MS - 50);
    expect_serving();
    struct rtc_resp r;
    EXPECT_EQ(rtc_get(port, "/metrics", &r), 200);
    CU_ASSERT(h_metric(r.body, "tandem:router_requests_total{code=\"200\"}") > 0);
    rtc_resp_free(&r);
}

/* Last: the router and the worker stop cleanly (0 after SIGTERM; under ASan a
 * leak report makes it 1). */
static void test_clean_exit(void)
{
    EXPECT_EQ(h_stop(&router, SIGTERM, 10000), 0);
    EXPECT_EQ(h_stop(&worker, SIGTERM, 15000), 0);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("router_http", setup, teardown);
    CU_add_test(s, "split_every_byte", test_split_every_byte);
    CU_add_test(s, "pipelined", test_pipelined);
    CU_add_test(s, "chunked_bodies", test_chunked_bodies);
    CU_add_test(s, "oversized", test_oversized);
    CU_add_test(s, "slow_client", test_slow_client);
    CU_add_test(s, "clean_exit", test_clean_exit);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
