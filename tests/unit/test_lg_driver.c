/* The load generator's driver (loadgen/driver.c) under a fake host: a
 * virtual clock and a scripted server, no sockets, no libuv. Each request's
 * reply is a script of times relative to its send (status with the first
 * token, one SSE event per token, the end), so every time in a record is
 * known exactly. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen/arrivals.h"
#include "loadgen/driver.h"
#include "tandem_err.h"

/* Failures print both sides and the caller's line. */
static void expect_eq(long long got, long long want, const char *what, int line)
{
    if (got != want) {
        fprintf(stderr, "\n%s:%d: %s == %lld, want %lld\n", __FILE__, line, what, got, want);
    }
    CU_assertImplementation(got == want, (unsigned)line, what, __FILE__, "", CU_FALSE);
}

static void expect_near(double got, double want, const char *what, int line)
{
    int ok = fabs(got - want) <= 1e-9;
    if (!ok) {
        fprintf(stderr, "\n%s:%d: %s == %.12g, want %.12g\n", __FILE__, line, what, got, want);
    }
    CU_assertImplementation(ok, (unsigned)line, what, __FILE__, "", CU_FALSE);
}

#define EXPECT_EQ(a, b)   expect_eq((long long)(a), (long long)(b), #a, __LINE__)
#define EXPECT_NEAR(a, b) expect_near((a), (b), #a, __LINE__)

#define MAX_REQ   512
#define MAX_TOKEN 8

/* What the fake server does with one request. */
enum script { OK, HTTP_503, TIMEOUT, NO_SEND, ERROR_EVENT };

struct sreq {
    struct lg_req *q;
    int live;
    enum script script;
    double t_send;
    int next; /* next step: 0 status + first token, 1..n-1 tokens, n the end */
};

struct fake {
    double now, wake;
    struct lg_driver *d;
    struct lg_run_config cfg;
    int ended;
    /* the server: ttft, then token gaps itl[0..n_tokens-2] */
    double ttft, itl[MAX_TOKEN];
    int n_tokens;
    enum script scripts[MAX_REQ]; /* by send order */
    struct sreq reqs[MAX_REQ];
    int n_sent, in_flight, peak_in_flight;
    double sent_at[MAX_REQ];
    double interrupt_at; /* call lg_driver_interrupt then */
};

static double f_now(void *arg)
{
    return ((struct fake *)arg)->now;
}

static void f_wake_at(void *arg, double t)
{
    ((struct fake *)arg)->wake = t;
}

static int f_send(void *arg, struct lg_req *q, const char *path, const char *body, size_t len,
                  double timeout_s)
{
    struct fake *f = arg;
    CU_ASSERT_STRING_EQUAL(path, "/v1/completions");
    CU_ASSERT(len > 0 && body[0] == '{');
    int i = f->n_sent++;
    CU_ASSERT_FATAL(i < MAX_REQ);
    f->sent_at[i] = f->now;
    if (f->scripts[i] == NO_SEND) {
        return TANDEM_EIO;
    }
    f->reqs[i] = (struct sreq){.q = q, .live = 1, .script = f->scripts[i], .t_send = f->now};
    lg_driver_set_host(q, &f->reqs[i]);
    if (++f->in_flight > f->peak_in_flight) {
        f->peak_in_flight = f->in_flight;
    }
    return 0;
}

static const char *f_send_error(void *arg)
{
    return "connect: connection refused";
}

static void end_req(struct fake *f, struct sreq *r, int err, enum lg_fail why, const char *msg)
{
    r->live = 0;
    f->in_flight--;
    lg_driver_done(r->q, err, why, msg);
}

static void f_cancel(void *arg, struct lg_req *q)
{
    end_req(arg, lg_driver_host(q), TANDEM_ECANCELLED, LG_FAIL_CANCELLED, "cancelled");
}

static void f_ended(void *arg)
{
    struct fake *f = arg;
    CU_ASSERT_EQUAL(f->ended, 0);
    CU_ASSERT_EQUAL(f->in_flight, 0);
    f->ended = 1;
}

static const struct lg_driver_ops fake_ops = {
    .now = f_now,
    .wake_at = f_wake_at,
    .send = f_send,
    .send_error = f_send_error,
    .cancel = f_cancel,
    .ended = f_ended,
};

/* When r's next step is due. */
static double step_time(const struct fake *f, const struct sreq *r)
{
    double t = r->t_send + f->ttft;
    for (int k = 0; k < r->next && k < f->n_tokens - 1; k++) {
        t += f->itl[k];
    }
    return t;
}

static void token(struct sreq *r, int k)
{
    char data[128];
    int n = snprintf(data, sizeof(data), "{\"choices\":[{\"index\":0,\"text\":\"t%d\"}]}", k);
    CU_ASSERT_EQUAL(lg_driver_event(r->q, "message", data, (size_t)n), 0);
}

/* Runs r's next step at f->now. */
static void step(struct fake *f, struct sreq *r)
{
    int k = r->next++;
    if (r->script == HTTP_503) {
        CU_ASSERT_EQUAL(lg_driver_status(r->q, 503, "application/json"), 0);
        const char *b = "{\"error\":{\"message\":\"overloaded\"}}";
        CU_ASSERT_EQUAL(lg_driver_body(r->q, b, strlen(b)), 0);
        end_req(f, r, 0, LG_FAIL_NONE, NULL);
        return;
    }
    if (k == 0) {
        CU_ASSERT_EQUAL(lg_driver_status(r->q, 200, "text/event-stream"), 1);
    }
    if (r->script == TIMEOUT && k == 1) {
        end_req(f, r, TANDEM_ETIMEOUT, LG_FAIL_TIMEOUT, "request timed out");
        return;
    }
    if (r->script == ERROR_EVENT) {
        const char *e = "{\"error\":{\"message\":\"boom\"}}";
        int rc = lg_driver_event(r->q, "error", e, strlen(e));
        CU_ASSERT(rc < 0);
        end_req(f, r, rc, LG_FAIL_BAD_STREAM, "host message");
        return;
    }
    if (k < f->n_tokens) {
        token(r, k);
    }
    if (k == f->n_tokens - 1) {
        char u[128];
        int n =
            snprintf(u, sizeof(u),
                     "{\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":%d}}",
                     f->n_tokens);
        CU_ASSERT_EQUAL(lg_driver_event(r->q, "message", u, (size_t)n), 0);
        CU_ASSERT_EQUAL(lg_driver_event(r->q, "message", "[DONE]", 6), 0);
        end_req(f, r, 0, LG_FAIL_NONE, NULL);
    }
}

/* Runs the event loop until the driver ends: the earliest of the wake, the
 * interrupt and the server's steps (ties: server first, by send order). */
static void run(struct fake *f, const char *model)
{
    lg_driver_start(f->d, model);
    for (int steps = 0; !f->ended; steps++) {
        CU_ASSERT_FATAL(steps < 100000); /* a driver that never ends */
        double t = f->wake;
        struct sreq *next = NULL;
        for (int i = 0; i < f->n_sent; i++) {
            if (f->reqs[i].live && step_time(f, &f->reqs[i]) <= t) {
                if (next == NULL || step_time(f, &f->reqs[i]) < step_time(f, next)) {
                    next = &f->reqs[i];
                }
            }
        }
        if (next != NULL) {
            t = step_time(f, next);
        }
        int intr = f->interrupt_at >= 0 && f->interrupt_at <= t;
        if (intr) {
            t = f->interrupt_at;
            next = NULL;
        }
        CU_ASSERT_FATAL(isfinite(t));
        CU_ASSERT_FATAL(t >= f->now);
        f->now = t;
        if (intr) {
            f->interrupt_at = -1;
            lg_driver_interrupt(f->d);
        } else if (next != NULL) {
            step(f, next);
        } else {
            f->wake = INFINITY;
            lg_driver_wake(f->d);
        }
    }
}

/* A fake with a 4-token server (ttft 0.25, gaps 0.1, 0.3, 0.05), clock at 5. */
static void fake_init(struct fake *f)
{
    memset(f, 0, sizeof(*f));
    f->now = 5.0;
    f->wake = INFINITY;
    f->interrupt_at = -1;
    f->ttft = 0.25;
    f->n_tokens = 4;
    f->itl[0] = 0.1;
    f->itl[1] = 0.3;
    f->itl[2] = 0.05;
    lg_run_config_default(&f->cfg);
    f->cfg.workload.random_input_len = 16;
    f->cfg.workload.random_output_len = 4;
}

static void fake_create(struct fake *f)
{
    char err[256] = "";
    int rc = lg_driver_create(&f->d, &f->cfg, &fake_ops, f, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "\nlg_driver_create: %s\n", err);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
}

static void fake_finish(struct fake *f, struct lg_run_result *res)
{
    char err[256] = "";
    CU_ASSERT_EQUAL(f->ended, 1);
    CU_ASSERT_EQUAL(lg_driver_finish(f->d, res, err, sizeof(err)), 0);
    lg_driver_destroy(f->d);
    f->d = NULL;
}

/* Creates the driver for f->cfg, runs it to its end and finishes it. */
static void run_ok(struct fake *f, struct lg_run_result *res)
{
    fake_create(f);
    run(f, "m");
    fake_finish(f, res);
}

static void test_open_loop_poisson(void)
{
    struct fake f;
    fake_init(&f);
    f.cfg.num_prompts = 40;
    f.cfg.request_rate = 8.0;
    f.cfg.workload.seed = 11;
    struct lg_run_result res;
    run_ok(&f, &res);
    double want[40];
    CU_ASSERT_EQUAL_FATAL(lg_arrivals_fill(8.0, 1.0, 11, 1, 40, want), 0);
    EXPECT_EQ(res.n, 40);
    EXPECT_EQ(f.n_sent, 40);
    for (size_t i = 0; i < res.n && i < 40; i++) {
        EXPECT_EQ(res.records[i].index, (long long)i);
        EXPECT_NEAR(res.records[i].arrival_s, want[i]);
        EXPECT_NEAR(res.records[i].start_s, want[i]); /* open loop: no client queueing */
        EXPECT_NEAR(f.sent_at[i], 5.0 + want[i]);
        CU_ASSERT_TRUE(res.records[i].ok);
    }
    /* The last response: the last arrival plus the reply's 0.7 s. */
    EXPECT_NEAR(res.duration_s, want[39] + 0.7);
    CU_ASSERT_STRING_EQUAL(res.model, "m");
    EXPECT_EQ(res.not_sent, 0);
    lg_run_result_free(&res);
}

static void test_max_concurrency(void)
{
    struct fake f;
    fake_init(&f);
    f.cfg.num_prompts = 20;
    f.cfg.max_concurrency = 3; /* infinite rate: a closed loop */
    f.cfg.num_warmups = 5;
    struct lg_run_result res;
    run_ok(&f, &res);
    EXPECT_EQ(f.peak_in_flight, 3);
    EXPECT_EQ(f.n_sent, 25);
    EXPECT_EQ(res.warmups_ok, 5);
    EXPECT_EQ(res.n, 20);
    /* Warm-ups: 3 then 2 (1.4 s); then request i starts as i - 3 ends. */
    for (size_t i = 0; i < res.n; i++) {
        EXPECT_NEAR(res.records[i].arrival_s, 0);
        EXPECT_NEAR(res.records[i].start_s, 0.7 * (double)(i / 3));
    }
    EXPECT_NEAR(f.sent_at[5], 5.0 + 1.4);
    EXPECT_NEAR(res.duration_s, 0.7 * 7);
    lg_run_result_free(&res);
}

static void test_sse_timing(void)
{
    struct fake f;
    fake_init(&f);
    f.cfg.num_prompts = 1;
    struct lg_run_result res;
    run_ok(&f, &res);
    EXPECT_EQ(res.n, 1);
    const struct lg_record *r = &res.records[0];
    CU_ASSERT_TRUE(r->ok);
    EXPECT_EQ(r->http_status, 200);
    EXPECT_EQ(r->n_chunks, 4);
    EXPECT_EQ(r->n_itl, 3);
    EXPECT_NEAR(r->ttft_s, 0.25);
    EXPECT_NEAR(r->itl_s[0], 0.1);
    EXPECT_NEAR(r->itl_s[1], 0.3);
    EXPECT_NEAR(r->itl_s[2], 0.05);
    EXPECT_NEAR(r->e2el_s, 0.7);
    EXPECT_NEAR(lg_tpot_s(r), (0.7 - 0.25) / 3);
    EXPECT_EQ(r->output_tokens, 4);
    CU_ASSERT_TRUE(r->usage_output);
    EXPECT_EQ(r->prompt_tokens, 9);
    CU_ASSERT_TRUE(r->done_marker);
    lg_run_result_free(&res);
}

static void test_duration(void)
{
    /* Unbounded Poisson for 2 s: exactly the arrivals before 2 s go out. */
    struct fake f;
    fake_init(&f);
    f.cfg.num_prompts = -1;
    f.cfg.duration_s = 2.0;
    f.cfg.request_rate = 10.0;
    f.cfg.workload.seed = 3;
    struct lg_run_result res;
    run_ok(&f, &res);
    struct lg_arrivals a;
    lg_arrivals_init(&a, 10.0, 1.0, 3);
    int want = 0;
    double last = 0;
    for (double t = lg_arrivals_next(&a); t < 2.0; t = lg_arrivals_next(&a)) {
        want++;
        last = t;
    }
    CU_ASSERT(want > 5);
    EXPECT_EQ(res.n, want);
    for (int i = 0; i < f.n_sent; i++) {
        CU_ASSERT(f.sent_at[i] < 5.0 + 2.0);
    }
    EXPECT_NEAR(res.duration_s, last + 0.7); /* those in flight finish */
    EXPECT_EQ(res.not_sent, 0);              /* arrivals past the end are not scheduled */
    lg_run_result_free(&res);

    /* A closed loop of one, 0.7 s a request, for 1.5 s: sent at 0, 0.7 and
     * 1.4; the one queued at the end counts as not sent. */
    fake_init(&f);
    f.cfg.num_prompts = 10;
    f.cfg.duration_s = 1.5;
    f.cfg.max_concurrency = 1;
    run_ok(&f, &res);
    EXPECT_EQ(res.n, 3);
    EXPECT_EQ(res.not_sent, 1);
    EXPECT_NEAR(res.duration_s, 2.1);
    lg_run_result_free(&res);
}

static void test_multi_turn(void)
{
    struct fake f;
    fake_init(&f);
    f.cfg.workload.dataset = LG_DATASET_MULTI_TURN;
    f.cfg.workload.mt_turns = 3;
    f.cfg.workload.mt_input_len = 8;
    f.cfg.workload.mt_output_len = 4;
    f.cfg.think_time_s = 0.5;
    f.cfg.num_prompts = 6; /* 2 sessions */
    f.cfg.request_rate = 2.0;
    struct lg_run_result res;
    run_ok(&f, &res);
    EXPECT_EQ(res.n, 6);
    for (size_t i = 0; i < res.n; i++) {
        const struct lg_record *r = &res.records[i];
        CU_ASSERT_TRUE(r->ok);
        EXPECT_EQ(r->session, (long long)(i / 3));
        EXPECT_EQ(r->turn, (long long)(i % 3));
        if (r->turn > 0) {
            const struct lg_record *prev = r - 1;
            double due = prev->start_s + prev->e2el_s + 0.5;
            EXPECT_NEAR(r->arrival_s, due);
            EXPECT_NEAR(r->start_s, due);
        }
    }
    lg_run_result_free(&res);
}

static void test_failures(void)
{
    struct fake f;
    fake_init(&f);
    f.cfg.num_prompts = 5;
    f.scripts[0] = HTTP_503;
    f.scripts[1] = TIMEOUT;
    f.scripts[2] = NO_SEND;
    f.scripts[3] = ERROR_EVENT;
    f.scripts[4] = OK;
    struct lg_run_result res;
    run_ok(&f, &res);
    EXPECT_EQ(res.n, 5);
    static const struct {
        enum lg_fail reason;
        int status;
        const char *error;
    } want[] = {
        {LG_FAIL_HTTP, 503, "HTTP 503: overloaded"},
        {LG_FAIL_TIMEOUT, 200, "request timed out"},
        {LG_FAIL_CONNECT, 0, "connect: connection refused"},
        {LG_FAIL_STREAM_ERROR, 200, "error event: {\"error\":{\"message\":\"boom\"}}"},
        {LG_FAIL_NONE, 200, NULL},
    };
    for (size_t i = 0; i < res.n; i++) {
        const struct lg_record *r = &res.records[i];
        EXPECT_EQ(r->ok, want[i].reason == LG_FAIL_NONE);
        EXPECT_EQ(r->reason, want[i].reason);
        EXPECT_EQ(r->http_status, want[i].status);
        if (want[i].error != NULL) {
            CU_ASSERT_PTR_NOT_NULL_FATAL(r->error);
            CU_ASSERT_STRING_EQUAL(r->error, want[i].error);
        }
    }
    EXPECT_EQ(res.records[1].n_chunks, 1); /* the timeout came after one token */
    lg_run_result_free(&res);
}

static void test_interrupt(void)
{
    /* 1 req/s evenly (arrivals at 1, 2, 3, ... s), 1.05 s a request; SIGINT
     * at 2.5 s: request 0 is done, 1 is in flight, 2 is queued for 3 s. */
    struct fake f;
    fake_init(&f);
    f.cfg.num_prompts = 10;
    f.cfg.request_rate = 1.0;
    f.cfg.burstiness = INFINITY;
    f.interrupt_at = 5.0 + 2.5;
    f.ttft = 0.6; /* 0.6 + 0.45: each request takes 1.05 s */
    struct lg_run_result res;
    run_ok(&f, &res);
    CU_ASSERT_TRUE(res.interrupted);
    EXPECT_EQ(res.n, 2); /* sent at 1 (done at 2.05) and 2 (in flight) */
    CU_ASSERT_TRUE(res.records[0].ok);
    EXPECT_EQ(res.records[1].reason, LG_FAIL_CANCELLED);
    EXPECT_EQ(res.not_sent, 1); /* the next arrival was queued */
    EXPECT_NEAR(res.duration_s, 2.5);
    lg_run_result_free(&res);

    /* During the warm-ups: the run fails. */
    fake_init(&f);
    f.cfg.num_prompts = 10;
    f.cfg.num_warmups = 2;
    f.interrupt_at = 5.1;
    fake_create(&f);
    run(&f, "m");
    char err[256] = "";
    CU_ASSERT_EQUAL(lg_driver_finish(f.d, &res, err, sizeof(err)), TANDEM_ECANCELLED);
    CU_ASSERT_STRING_EQUAL(err, "interrupted");
    lg_driver_destroy(f.d);
}

static void test_bad_config(void)
{
    struct fake f;
    fake_init(&f);
    f.cfg.request_rate = 0;
    char err[256] = "";
    CU_ASSERT_EQUAL(lg_driver_create(&f.d, &f.cfg, &fake_ops, &f, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(err, "--request-rate and --burstiness must be > 0");
    CU_ASSERT_PTR_NULL(f.d);
}

static const struct {
    const char *name;
    CU_TestFunc fn;
} tests[] = {
    {"open_loop_poisson", test_open_loop_poisson},
    {"max_concurrency", test_max_concurrency},
    {"sse_timing", test_sse_timing},
    {"duration", test_duration},
    {"multi_turn", test_multi_turn},
    {"failures", test_failures},
    {"interrupt", test_interrupt},
    {"bad_config", test_bad_config},
};

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 2;
    }
    CU_pSuite suite = CU_add_suite("lg_driver", NULL, NULL);
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        CU_add_test(suite, tests[i].name, tests[i].fn);
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    int bad = CU_basic_run_tests() != CUE_SUCCESS || CU_get_number_of_failures() > 0;
    CU_cleanup_registry();
    return bad;
}
