/* Integration: cancels and failures during a disaggregated request.
 *  - cancel while queued (on P, and on D), while P prefills (before any frame
 *    reached D), while frames are transferring, and while D decodes: the
 *    request ends CANCELLED and both workers end with zero blocks in use;
 *  - P killed (SIGKILL) mid-transfer: D fails the request (Error ECLOSED,
 *    Finish ERROR) and releases its blocks;
 *  - a prefill address where nobody listens: the transfer timeout fails it;
 *  - D killed mid-transfer: P cancels the prefill and releases its blocks;
 *  - the router going away cancels D's requests; SIGTERM ends them with ABORT.
 * After every test the KV invariant holds on every live worker. */
#include <CUnit/Basic.h>
#include <math.h>
#include <nng/nng.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "harness.h"
#include "tandem_err.h"

/* A wait longer than this is a hang. Not 30 s: a 2500-token tiny prefill
 * took that long in a CI run at load average 14 (cancel_queued). */
#define TIMEOUT_MS 120000

static uint64_t next_id = 1;

static void teardown(void)
{
    h_cleanup_all();
}

static int spawn(struct h_proc *p, const char *bin, const char *const *args)
{
    const char *a[40];
    int n = 0;
    for (int i = 0; args && args[i]; i++) {
        a[n++] = args[i];
    }
    a[n++] = "--log-level";
    a[n++] = "error";
    a[n] = NULL;
    return h_spawn(p, bin, a, 20000);
}

/* Streams the test is following, so that a pump for one does not drop the
 * chunks of another. */
static struct ctl_stream *followed[4];

static void follow(struct ctl_stream *a, struct ctl_stream *b)
{
    followed[0] = a;
    followed[1] = b;
}

/* Receives on s, feeding every followed stream, until pred(st) holds or
 * timeout. Returns 1 when pred held. */
static int pump(nng_socket s, struct ctl_stream *st, int (*pred)(const struct ctl_stream *),
                int timeout_ms)
{
    double end = h_ms() + timeout_ms;
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 20);
    while (!pred(st)) {
        if (h_ms() >= end) {
            return 0;
        }
        Tandem__Envelope *env;
        if (wire_recv(s, 0, &env) == 0) {
            if (ctl_stream_feed(st, env) == TANDEM_ENOENT) {
                for (int i = 0; i < 4; i++) {
                    if (followed[i] != NULL && followed[i] != st) {
                        ctl_stream_feed(followed[i], env);
                    }
                }
            }
            wire_free(env);
        }
    }
    return 1;
}

static int is_done(const struct ctl_stream *st)
{
    return st->done;
}

static int has_token(const struct ctl_stream *st)
{
    return st->n_tokens > 0 || st->done;
}

/* Polls a metric of p until it is >= v. Returns the last value. */
static double wait_metric(const struct h_proc *p, const char *series, double v, int timeout_ms)
{
    double end = h_ms() + timeout_ms, x = NAN;
    while (h_ms() < end) {
        x = h_proc_metric(p, series);
        if (x >= v) {
            break;
        }
        h_sleep_ms(10);
    }
    return x;
}

static void job_for(struct ctl_job *job, const uint32_t *prompt, int n, int max_tokens,
                    const char *paddr)
{
    ctl_job_init(job);
    job->prompt = prompt;
    job->n_prompt = n;
    job->max_tokens = (uint32_t)max_tokens;
    job->ignore_eos = 1;
    job->prefill_address = paddr;
}

/* Cancels id and waits for its Finish(CANCELLED). */
static void cancel_and_check(nng_socket s, struct ctl_stream *st)
{
    CU_ASSERT_EQUAL(ctl_send_cancel(s, st->id, 0), 0);
    CU_ASSERT(pump(s, st, is_done, TIMEOUT_MS));
    CU_ASSERT_EQUAL(st->finish_reason, TANDEM__FINISH__REASON__CANCELLED);
    CU_ASSERT_EQUAL(st->bad, 0);
}

static void check_zero(const struct h_proc *p)
{
    CU_ASSERT_EQUAL(h_wait_used(p, 0, TIMEOUT_MS), 0);
    CU_ASSERT_EQUAL(h_kv_invariant(p, NULL), 0);
}

static const char *const used_series = "tandem:kv_blocks{state=\"used\"}";
static const char *const running_series = "vllm:num_requests_running{model_name=\"tiny\"}";
static const char *const waiting_series = "vllm:num_requests_waiting{model_name=\"tiny\"}";

/* ---- Cancel at every stage ---------------------------------------------- */

static void test_cancel_queued(void)
{
    /* P runs one prefill at a time; D decodes one sequence at a time. */
    struct h_proc p, d;
    const char *pargs[] = {"--max-running", "1", NULL};
    const char *dargs[] = {"--max-running", "1", NULL};
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", pargs) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", dargs) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    static uint32_t long_prompt[2500], short_prompt[300];
    h_prompt(long_prompt, 2500, 1, 3, 259);
    h_prompt(short_prompt, 300, 2, 3, 259);

    /* Queued on P: A prefills, B waits in P's queue. */
    struct ctl_job a, b;
    job_for(&a, long_prompt, 2500, 4, p.kv);
    job_for(&b, short_prompt, 300, 4, p.kv);
    struct ctl_stream sa, sb;
    ctl_stream_init(&sa, next_id++);
    ctl_stream_init(&sb, next_id++);
    follow(&sa, &sb);
    CU_ASSERT_FATAL(ctl_send_job(s, sa.id, &a, 0) == 0);
    CU_ASSERT_FATAL(ctl_send_job(s, sb.id, &b, 0) == 0);
    /* Until P has taken A into its batch both wait (a scrape can land between
     * the jobs' arrival and P's next step): wait for 1 running, 1 waiting. */
    double pw = NAN, pr = NAN;
    for (double end = h_ms() + TIMEOUT_MS; h_ms() < end; h_sleep_ms(10)) {
        pw = h_proc_metric(&p, waiting_series);
        pr = h_proc_metric(&p, running_series);
        if (pw == 1 && pr == 1) {
            break;
        }
    }
    if (pw != 1 || pr != 1) {
        printf("\n  P waiting %g, running %g\n", pw, pr);
    }
    CU_ASSERT(pw == 1 && pr == 1);
    CU_ASSERT(h_proc_metric(&d, used_series) > 0); /* D reserved blocks for both */
    cancel_and_check(s, &sb);
    CU_ASSERT(pump(s, &sa, is_done, TIMEOUT_MS));
    CU_ASSERT_EQUAL(sa.n_tokens, 4);
    CU_ASSERT_EQUAL(h_proc_metric(&p, waiting_series), 0);
    check_zero(&p);
    check_zero(&d);
    ctl_stream_fini(&sa);
    ctl_stream_fini(&sb);

    /* Queued on D: A decodes (max running 1), B waits in D's scheduler. */
    job_for(&a, short_prompt, 300, 3000, p.kv);
    job_for(&b, short_prompt, 200, 4, NULL);
    ctl_stream_init(&sa, next_id++);
    ctl_stream_init(&sb, next_id++);
    follow(&sa, &sb);
    CU_ASSERT_FATAL(ctl_send_job(s, sa.id, &a, 0) == 0);
    CU_ASSERT(pump(s, &sa, has_token, TIMEOUT_MS));
    CU_ASSERT_FATAL(ctl_send_job(s, sb.id, &b, 0) == 0);
    CU_ASSERT(wait_metric(&d, waiting_series, 1, TIMEOUT_MS) == 1);
    cancel_and_check(s, &sb);
    CU_ASSERT_EQUAL(sb.n_tokens, 0);
    cancel_and_check(s, &sa);
    check_zero(&p);
    check_zero(&d);
    follow(NULL, NULL);
    ctl_stream_fini(&sa);
    ctl_stream_fini(&sb);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 10000), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

static void test_cancel_prefilling(void)
{
    /* The whole 2000-token prompt is one chunk (a long step: docs/performance.md,
     * "A 2000-token prompt in one chunk"): nothing
     * reaches D until P's step ends, so the cancel lands while P computes. */
    struct h_proc p, d;
    const char *pargs[] = {"--token-budget", "2000", "--max-prefill-chunk", "2000", NULL};
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", pargs) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    static uint32_t prompt[2000];
    h_prompt(prompt, 2000, 3, 3, 259);
    struct ctl_job a;
    job_for(&a, prompt, 2000, 4, p.kv);
    struct ctl_stream sa;
    ctl_stream_init(&sa, next_id++);
    CU_ASSERT_FATAL(ctl_send_job(s, sa.id, &a, 0) == 0);
    h_sleep_ms(300);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_bytes_received_total"), 0);
    CU_ASSERT(h_proc_metric(&d, used_series) >= 125); /* D's reservation */
    cancel_and_check(s, &sa);
    /* D released at once; P finishes its step, ships into the void (D drops
     * the late frames as unknown) and releases too. */
    check_zero(&d);
    CU_ASSERT_EQUAL(h_wait_used(&p, 0, 60000), 0); /* slow in sanitizer builds */
    CU_ASSERT_EQUAL(h_kv_invariant(&p, NULL), 0);
    CU_ASSERT(wait_metric(&d, "tandem:kv_frames_rejected_total{reason=\"unknown_request\"}", 1,
                          30000) >= 1);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_frames_installed_total"), 0);
    ctl_stream_fini(&sa);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 10000), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

static void test_cancel_transferring(void)
{
    struct h_proc p, d;
    const char *args[] = {"--token-budget", "128", NULL};
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", args) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    static uint32_t prompt[3000];
    h_prompt(prompt, 3000, 4, 3, 259);
    struct ctl_job a;
    job_for(&a, prompt, 3000, 4, p.kv);
    struct ctl_stream sa;
    ctl_stream_init(&sa, next_id++);
    CU_ASSERT_FATAL(ctl_send_job(s, sa.id, &a, 0) == 0);
    /* Frames are flowing (128-token chunks, 8 blocks each). */
    CU_ASSERT(wait_metric(&d, "tandem:kv_frames_installed_total", 16, TIMEOUT_MS) >= 16);
    CU_ASSERT(h_proc_metric(&d, "tandem:kv_frames_installed_total") < 188);
    CU_ASSERT(h_proc_metric(&p, running_series) == 1);
    cancel_and_check(s, &sa);
    check_zero(&d);
    check_zero(&p);
    /* P stopped: it did not ship the whole prompt. */
    h_sleep_ms(300);
    CU_ASSERT(h_proc_metric(&p, "tandem:kv_frames_sent_total") < 188);
    CU_ASSERT_EQUAL(h_proc_metric(&p, running_series), 0);
    ctl_stream_fini(&sa);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 10000), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

static void test_cancel_decoding(void)
{
    struct h_proc p, d;
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", NULL) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    static uint32_t prompt[500];
    h_prompt(prompt, 500, 5, 3, 259);
    struct ctl_job a;
    job_for(&a, prompt, 500, 3000, p.kv);
    struct ctl_stream sa;
    ctl_stream_init(&sa, next_id++);
    CU_ASSERT_FATAL(ctl_send_job(s, sa.id, &a, 0) == 0);
    CU_ASSERT(pump(s, &sa, has_token, TIMEOUT_MS));
    CU_ASSERT(h_proc_metric(&d, running_series) == 1);
    cancel_and_check(s, &sa);
    CU_ASSERT(sa.n_tokens >= 1 && sa.n_tokens < 3000);
    CU_ASSERT_EQUAL(sa.completion_tokens, (uint32_t)sa.n_tokens);
    check_zero(&d);
    check_zero(&p);
    ctl_stream_fini(&sa);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 10000), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

/* ---- Peers vanishing ---------------------------------------------------- */

static void test_kill_prefill_mid_transfer(void)
{
    struct h_proc p, d;
    const char *args[] = {"--token-budget", "128", NULL};
    /* D's transfer timeout is far beyond the test's waits: whatever ends the
     * transfer in time is the pipe event (and the error says ECLOSED, not
     * ETIMEOUT). */
    const char *dargs[] = {"--transfer-timeout-ms", "3600000", NULL};
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", args) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", dargs) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    static uint32_t prompt[3000];
    h_prompt(prompt, 3000, 6, 3, 259);
    struct ctl_job a;
    job_for(&a, prompt, 3000, 4, p.kv);
    struct ctl_stream sa;
    ctl_stream_init(&sa, next_id++);
    CU_ASSERT_FATAL(ctl_send_job(s, sa.id, &a, 0) == 0);
    CU_ASSERT(wait_metric(&d, "tandem:kv_frames_installed_total", 8, TIMEOUT_MS) >= 8);
    double t0 = h_ms();
    CU_ASSERT_EQUAL(h_stop(&p, SIGKILL, 10000), 128 + SIGKILL);
    CU_ASSERT(pump(s, &sa, is_done, TIMEOUT_MS));
    printf("\n  D failed the request %.0f ms after P was killed\n", h_ms() - t0);
    CU_ASSERT_EQUAL(sa.error_code, TANDEM_ECLOSED);
    CU_ASSERT_EQUAL(sa.finish_reason, TANDEM__FINISH__REASON__ERROR);
    CU_ASSERT_EQUAL(sa.n_tokens, 0);
    check_zero(&d);
    ctl_stream_fini(&sa);

    /* A job naming the dead P is answered Busy at once, not after the
     * transfer timeout (an hour here, far past ctl_run's TIMEOUT_MS, and it
     * would end the job with an error), so the router can pick another. */
    job_for(&a, prompt, 100, 4, p.kv);
    t0 = h_ms();
    CU_ASSERT_EQUAL(ctl_run(s, next_id++, &a, TIMEOUT_MS, &sa), 0);
    printf("  a job naming the dead P was answered Busy in %.0f ms\n", h_ms() - t0);
    CU_ASSERT_EQUAL(sa.error_code, 0);
    CU_ASSERT_EQUAL(sa.busy, 1);
    CU_ASSERT_EQUAL(sa.busy_reason, TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE);
    ctl_stream_fini(&sa);
    check_zero(&d);

    /* D still serves, locally and through a new P. */
    struct h_proc p2;
    CU_ASSERT_FATAL(spawn(&p2, "tandem-prefill", NULL) == 0);
    job_for(&a, prompt, 100, 4, p2.kv);
    CU_ASSERT_EQUAL(ctl_run(s, next_id++, &a, TIMEOUT_MS, &sa), 0);
    CU_ASSERT_EQUAL(sa.n_tokens, 4);
    CU_ASSERT_EQUAL(sa.finish_reason, TANDEM__FINISH__REASON__LENGTH);
    ctl_stream_fini(&sa);
    check_zero(&d);
    check_zero(&p2);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&p2, SIGTERM, 10000), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

static void test_prefill_unreachable_times_out(void)
{
    struct h_proc d;
    const char *args[] = {"--transfer-timeout-ms", "500", NULL};
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", args) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    uint32_t prompt[100];
    h_prompt(prompt, 100, 7, 3, 259);
    char nowhere[H_URL_MAX];
    h_ipc_url(nowhere, sizeof(nowhere), "nobody-listens");
    struct ctl_job a;
    job_for(&a, prompt, 100, 4, nowhere);
    struct ctl_stream sa;
    double t0 = h_ms();
    CU_ASSERT_EQUAL(ctl_run(s, next_id++, &a, TIMEOUT_MS, &sa), 0);
    double dt = h_ms() - t0;
    printf("\n  the 500 ms transfer timeout failed the request after %.0f ms\n", dt);
    /* The timeout fires once D's loop clock has advanced more than 500 ms
     * past the job's arrival, which is after t0: never sooner, except for
     * the clock's millisecond granularity, which 490 leaves room for. */
    CU_ASSERT(dt >= 490);
    CU_ASSERT_EQUAL(sa.error_code, TANDEM_ETIMEOUT);
    CU_ASSERT_EQUAL(sa.finish_reason, TANDEM__FINISH__REASON__ERROR);
    ctl_stream_fini(&sa);
    check_zero(&d);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

static void test_kill_decode_mid_transfer(void)
{
    struct h_proc p, d;
    const char *args[] = {"--token-budget", "128", NULL};
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", args) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    static uint32_t prompt[3000];
    h_prompt(prompt, 3000, 8, 3, 259);
    struct ctl_job a;
    job_for(&a, prompt, 3000, 4, p.kv);
    CU_ASSERT_FATAL(ctl_send_job(s, next_id++, &a, 0) == 0);
    CU_ASSERT(wait_metric(&p, "tandem:kv_frames_sent_total", 8, TIMEOUT_MS) >= 8);
    CU_ASSERT_EQUAL(h_stop(&d, SIGKILL, 10000), 128 + SIGKILL);
    check_zero(&p);
    CU_ASSERT(wait_metric(&p,
                          "vllm:request_success_total{finished_reason=\"cancelled\","
                          "model_name=\"tiny\"}",
                          1, TIMEOUT_MS) == 1);
    CU_ASSERT(h_proc_metric(&p, "tandem:kv_frames_sent_total") < 188);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 10000), 0);
}

/* ---- Router gone, shutdown ---------------------------------------------- */

static void test_router_gone_and_sigterm(void)
{
    struct h_proc p, d;
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", NULL) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    uint32_t prompt[200];
    h_prompt(prompt, 200, 9, 3, 259);
    struct ctl_job a, b;
    job_for(&a, prompt, 200, 3000, p.kv);
    job_for(&b, prompt, 150, 3000, NULL);
    struct ctl_stream sa;
    ctl_stream_init(&sa, next_id++);
    CU_ASSERT_FATAL(ctl_send_job(s, sa.id, &a, 0) == 0);
    CU_ASSERT_FATAL(ctl_send_job(s, next_id++, &b, 0) == 0);
    CU_ASSERT(pump(s, &sa, has_token, TIMEOUT_MS));
    CU_ASSERT(wait_metric(&d, running_series, 2, TIMEOUT_MS) == 2);
    h_nng_close(s); /* the router goes away: D cancels what it ran for it */
    check_zero(&d);
    CU_ASSERT_EQUAL(h_proc_metric(&d, running_series), 0);
    ctl_stream_fini(&sa);

    /* SIGTERM while decoding: Finish(ABORT), exit 0. */
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    ctl_stream_init(&sa, next_id++);
    CU_ASSERT_FATAL(ctl_send_job(s, sa.id, &a, 0) == 0);
    CU_ASSERT(pump(s, &sa, has_token, TIMEOUT_MS));
    kill(d.pid, SIGTERM);
    CU_ASSERT(pump(s, &sa, is_done, TIMEOUT_MS));
    CU_ASSERT_EQUAL(sa.finish_reason, TANDEM__FINISH__REASON__ABORT);
    int code = h_stop(&d, SIGTERM, 10000);
    if (code != 0) {
        printf("\n  decode worker exit code %d after SIGTERM\n", code);
    }
    CU_ASSERT_EQUAL(code, 0);
    ctl_stream_fini(&sa);
    h_nng_close(s);
    check_zero(&p);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 10000), 0);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("transfer", NULL, NULL, NULL, teardown);
    CU_add_test(s, "cancel_queued", test_cancel_queued);
    CU_add_test(s, "cancel_prefilling", test_cancel_prefilling);
    CU_add_test(s, "cancel_transferring", test_cancel_transferring);
    CU_add_test(s, "cancel_decoding", test_cancel_decoding);
    CU_add_test(s, "kill_prefill_mid_transfer", test_kill_prefill_mid_transfer);
    CU_add_test(s, "prefill_unreachable_times_out", test_prefill_unreachable_times_out);
    CU_add_test(s, "kill_decode_mid_transfer", test_kill_decode_mid_transfer);
    CU_add_test(s, "router_gone_and_sigterm", test_router_gone_and_sigterm);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
