/* Integration: the router's dispatch failure handling (router/dispatch.c,
 * docs/architecture.md "Failures"), each path reached on purpose with a real
 * router and real workers:
 *   - out of retries: a request lost on --retries + 1 workers in a row is
 *     answered 503 "The request failed on N workers (last: ...)" in OpenAI's
 *     error shape before its stream started, and its stream ends with
 *     finish_reason "abort" after (the tokens sent are the engine's);
 *   - a remote-prefill request lost before its first token (its decode
 *     worker killed, or its prefill worker) is retried with BOTH its
 *     decode and its prefill endpoint excluded, though one of them is alive
 *     and healthy: the retry's decision (/v1/decisions) picks another P and
 *     another D and never even scores the excluded ones;
 *   - a worker lost after it sent the last token: the request is complete
 *     (max_tokens reached), so it finishes with "length", exactly once, and
 *     nothing is retried; one token short, the same loss is recovered on
 *     another worker. A real worker sends its last tokens and its Finish in
 *     one callback (decode_worker/decode.c on_finish), so no signal can land
 *     between the two: here the test plays that worker over the control
 *     protocol (Hello, DecodeJobs in, TokenChunks out, then its link drops)
 *     beside a real decode worker that would take any retry.
 * Every process must exit as expected (0 after SIGTERM, 137 after SIGKILL). */
#include <CUnit/Basic.h>
#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>

#include "rt_cluster.h"
#include "wire.h"

static void teardown(void)
{
    h_cleanup_all();
}

/* The error object of a JSON error body (borrowed from *doc, which the
 * caller frees). */
static json_t *error_of(const char *body, json_t **doc)
{
    *doc = json_loads(body ? body : "", JSON_ALLOW_NUL, NULL);
    return json_object_get(*doc, "error");
}

static const char *str_of(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* ---- Out of retries ------------------------------------------------------- */

/* --retries 2, three decode workers, each killed in turn while it holds the
 * request. Not streamed: nothing reaches the client before the end, so the
 * answer is the 503 whether a loss came before or after the first token. */
static void test_out_of_retries_503(void)
{
    const char *rargs[] = {"--retries", "2", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 3, rargs, NULL) == 0);
    uint32_t prompt[40];
    h_prompt(prompt, 40, 81, 3, 259);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(rtc_send_completion(&conn, c.port, prompt, 40, 3000, 0) == 0);
    char last[128] = "";
    for (int k = 0; k < 3; k++) {
        /* A killed worker is reaped, so this finds the attempt after it. */
        struct h_proc *v = rtc_busy_worker(&c, "decode", RTC_HANG_MS);
        CU_ASSERT_FATAL(v != NULL);
        snprintf(last, sizeof(last), "%s", v->id);
        rtc_kill(v);
    }
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, RTC_HANG_MS), 503);
    json_t *doc;
    json_t *e = error_of(r.body, &doc);
    char want[256];
    snprintf(want, sizeof(want),
             "The request failed on 3 workers (last: endpoint lost on %s); try again later.", last);
    EXPECT_STR(str_of(e, "message"), want);
    EXPECT_STR(str_of(e, "type"), "server_error");
    EXPECT_STR(str_of(e, "code"), "service_unavailable");
    CU_ASSERT(json_is_null(json_object_get(e, "param")));
    json_decref(doc);
    rtc_resp_free(&r);
    rtc_close(&conn);
    /* Two retries (a loss after a token is a recovery), then given up. */
    double failure = rtc_metric(c.port, "tandem:router_retries_total{reason=\"failure\"}");
    double recovery = rtc_metric(c.port, "tandem:router_retries_total{reason=\"recovery\"}");
    EXPECT_NUM(failure + recovery, 2);
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_requests_total{code=\"503\"}"), 1);
    EXPECT_NUM(rtc_metric(c.port, "vllm:num_requests_running{model_name=\"tiny\"}"), 0);
    rtc_cluster_stop(&c);
}

/* --retries 1, two decode workers, each killed while the stream runs: the
 * first loss is recovered (the stream goes on), the second ends it with
 * finish_reason "abort", usage and [DONE]; every token sent is the
 * engine's. */
static void test_out_of_retries_stream_abort(void)
{
    const char *rargs[] = {"--retries", "1", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 2, rargs, NULL) == 0);
    uint32_t prompt[40];
    h_prompt(prompt, 40, 82, 3, 259);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(rtc_send_completion(&conn, c.port, prompt, 40, 3000, 1) == 0);
    for (int k = 0; k < 2; k++) {
        /* Tokens flow (again, after the first loss) before each kill. */
        CU_ASSERT_FATAL(rtc_wait_events(&conn, rtc_count_in(&conn, "data: ") + 5));
        struct h_proc *v = rtc_busy_worker(&c, "decode", RTC_HANG_MS);
        CU_ASSERT_FATAL(v != NULL);
        rtc_kill(v);
    }
    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, RTC_HANG_MS), 200);
    struct rtc_answer *a = calloc(1, sizeof(*a));
    rtc_answer_parse(r.body, 1, a);
    printf("\n  stream aborted after %d tokens\n", a->n_lp);
    EXPECT_STR(a->finish, "abort");
    EXPECT_EQ(a->done, 1);
    EXPECT_EQ(a->usage_chunks, 1);
    EXPECT_EQ(a->completion_tokens, a->n_lp);
    CU_ASSERT(a->n_lp >= 10 && a->n_lp < 3000);
    if (a->n_lp > 0 && a->n_lp < 3000) {
        float *want_lp = calloc((size_t)a->n_lp, sizeof(*want_lp));
        char *want = reference_text(prompt, 40, a->n_lp, want_lp);
        EXPECT_STR(a->text, want);
        int same = 0;
        for (int i = 0; i < a->n_lp; i++) {
            same += a->lp[i] == want_lp[i];
        }
        EXPECT_EQ(same, a->n_lp);
        free(want);
        free(want_lp);
    }
    free(a);
    rtc_resp_free(&r);
    rtc_close(&conn);
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_retries_total{reason=\"recovery\"}"), 1);
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_retries_total{reason=\"failure\"}"), 0);
    rtc_cluster_stop(&c);
}

/* ---- A loss before the first token excludes both P and D ------------------ */

/* Does any profile run of decision dec score endpoint id? */
static int scored(json_t *dec, const char *id)
{
    json_t *runs = json_object_get(dec, "runs");
    for (size_t i = 0; i < json_array_size(runs); i++) {
        json_t *cands = json_object_get(json_array_get(runs, i), "candidates");
        for (size_t k = 0; k < json_array_size(cands); k++) {
            const char *e = str_of(json_array_get(cands, k), "endpoint");
            if (e != NULL && strcmp(e, id) == 0) {
                return 1;
            }
        }
    }
    return 0;
}

static int healthy(struct rtc_cluster *c, const char *id)
{
    json_t *j = rtc_get_json(c->port, "/v1/cluster");
    json_t *eps = json_object_get(j, "endpoints");
    int h = 0;
    for (size_t i = 0; i < json_array_size(eps); i++) {
        json_t *e = json_array_get(eps, i);
        if (str_of(e, "id") != NULL && strcmp(str_of(e, "id"), id) == 0) {
            h = json_is_true(json_object_get(e, "healthy"));
        }
    }
    json_decref(j);
    return h;
}

/* Every request prefills remotely (pd-always); a small token budget makes
 * the 1200-token prefill take many steps. The worker of kill_role holding
 * the request is killed before its first token; the other one of the pair
 * stays alive and healthy, and still the retry avoids it. */
static void excluded_after_loss(const char *kill_role)
{
    const char *wargs[] = {"--token-budget", "32", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, "pd-always.yaml", 2, 2, NULL, wargs) == 0);
    enum { N = 1200, MT = 8 };
    static uint32_t prompt[N];
    h_prompt(prompt, N, strcmp(kill_role, "decode") == 0 ? 91 : 92, 3, 259);
    float want_lp[MT];
    char *want = reference_text(prompt, N, MT, want_lp);
    CU_ASSERT_FATAL(want != NULL);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(rtc_send_completion(&conn, c.port, prompt, N, MT, 1) == 0);
    struct h_proc *p = rtc_busy_worker(&c, "prefill", RTC_HANG_MS);
    struct h_proc *d = rtc_busy_worker(&c, "decode", RTC_HANG_MS);
    CU_ASSERT_FATAL(p != NULL && d != NULL);
    char p_id[128], d_id[128];
    snprintf(p_id, sizeof(p_id), "%s", p->id);
    snprintf(d_id, sizeof(d_id), "%s", d->id);
    /* Nothing streamed yet: the router sends the headers with the first
     * token. */
    EXPECT_EQ(rtc_fill(&conn, 0), -1);
    struct h_proc *victim = strcmp(kill_role, "decode") == 0 ? d : p;
    const char *alive = strcmp(kill_role, "decode") == 0 ? p_id : d_id;
    printf("\n  P %s, D %s: killing %s\n", p_id, d_id, victim->id);
    rtc_kill(victim);

    struct rtc_resp r;
    EXPECT_EQ(rtc_read(&conn, &r, RTC_HANG_MS), 200);
    struct rtc_answer *a = calloc(1, sizeof(*a));
    rtc_answer_parse(r.body, 1, a);
    EXPECT_STR(a->text, want);
    EXPECT_EQ(a->n_lp, MT);
    int same = 0;
    for (int i = 0; i < MT && i < a->n_lp; i++) {
        same += a->lp[i] == want_lp[i];
    }
    EXPECT_EQ(same, MT);
    EXPECT_STR(a->finish, "length");
    EXPECT_EQ(a->done, 1);
    free(a);
    rtc_resp_free(&r);
    rtc_close(&conn);
    free(want);

    /* Newest first: the retry, then the first attempt. */
    json_t *j = rtc_get_json(c.port, "/v1/decisions");
    json_t *decs = json_object_get(j, "decisions");
    EXPECT_EQ(json_array_size(decs), 2);
    json_t *retry = json_array_get(decs, 0), *first = json_array_get(decs, 1);
    EXPECT_STR(str_of(first, "decode"), d_id);
    EXPECT_STR(str_of(first, "prefill"), p_id);
    EXPECT_STR(str_of(retry, "pd"), "remote");
    const char *rd = str_of(retry, "decode"), *rp = str_of(retry, "prefill");
    printf("  retried on P %s, D %s\n", rp ? rp : "(none)", rd ? rd : "(none)");
    CU_ASSERT(rd != NULL && strcmp(rd, d_id) != 0);
    CU_ASSERT(rp != NULL && strcmp(rp, p_id) != 0);
    /* Excluded, not merely outscored: neither is a candidate of the retry. */
    CU_ASSERT(!scored(retry, d_id));
    CU_ASSERT(!scored(retry, p_id));
    CU_ASSERT(scored(first, d_id) && scored(first, p_id));
    json_decref(j);
    /* The survivor of the pair is alive and healthy: only the exclusion
     * kept the retry off it. */
    EXPECT_EQ(healthy(&c, alive), 1);
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_retries_total{reason=\"failure\"}"), 1);
    rtc_cluster_stop(&c);
}

static void test_decode_lost_excludes_p_and_d(void)
{
    excluded_after_loss("decode");
}

static void test_prefill_lost_excludes_p_and_d(void)
{
    excluded_after_loss("prefill");
}

/* ---- A loss after the last token ------------------------------------------ */

/* The test's side of a decode worker's control link: a PAIR0 listener the
 * router dials (--workers). */
struct fake_worker {
    nng_socket s;
    char url[H_URL_MAX];
};

static int fake_open(struct fake_worker *f)
{
    h_ipc_url(f->url, sizeof(f->url), "fake-worker");
    if (nng_pair0_open(&f->s) != 0) {
        return -1;
    }
    wire_socket_setup(f->s, WIRE_LINK_CONTROL);
    nng_socket_set_ms(f->s, NNG_OPT_SENDTIMEO, RTC_HANG_MS);
    nng_socket_set_ms(f->s, NNG_OPT_RECVTIMEO, RTC_HANG_MS);
    return nng_listen(f->s, f->url, NULL, 0) == 0 ? 0 : -1;
}

/* The Hello of a tiny decode worker (no cluster secret). Blocks until the
 * router's dial has connected. */
static int fake_hello(struct fake_worker *f)
{
    Tandem__WorkerHello h;
    tandem__worker_hello__init(&h);
    h.worker_id = "fake-decode";
    h.role = TANDEM__WORKER_HELLO__ROLE__DECODE;
    h.control_address = f->url;
    h.kv_address = "ipc:///nonexistent/fake-decode-kv";
    h.metrics_address = "";
    h.model = "tiny";
    h.block_size = 16;
    h.kv_dtype = TANDEM__KV_DTYPE__KV_DTYPE_F32;
    h.kv_blocks_total = 2048;
    h.max_running_seqs = 8;
    h.max_context = 4096;
    h.incarnation = 1;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    return wire_send(f->s, &env, 0);
}

/* The next DecodeJob (wire_free it), skipping anything else; NULL after
 * RTC_HANG_MS. */
static Tandem__Envelope *fake_next_job(struct fake_worker *f)
{
    for (;;) {
        Tandem__Envelope *env = NULL;
        if (wire_recv(f->s, 0, &env) != 0) {
            return NULL;
        }
        if (env->kind == TANDEM__ENVELOPE__KIND__DECODE_JOB) {
            return env;
        }
        wire_free(env);
    }
}

static int fake_tokens(struct fake_worker *f, uint64_t id, int first, const uint32_t *ids,
                       const float *lps, int n)
{
    Tandem__TokenChunk tc = TANDEM__TOKEN_CHUNK__INIT;
    tc.first_index = (uint32_t)first;
    tc.n_token_ids = (size_t)n;
    tc.token_ids = (uint32_t *)ids;
    tc.n_logprobs = (size_t)n;
    tc.logprobs = (float *)lps;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__TOKEN_CHUNK, id, &tc);
    return wire_send(f->s, &env, 0);
}

/* Byte-level token ids of s. */
static int byte_ids(const char *s, uint32_t *out)
{
    int n = 0;
    for (; s[n] != '\0'; n++) {
        out[n] = (uint32_t)(unsigned char)s[n] + TOK_BYTE_BASE;
    }
    return n;
}

/* Three requests of max_tokens 4 on the fake worker: A (not streamed) and B
 * (streamed, its 4 tokens in two chunks) get all 4 tokens, C (streamed) 3;
 * then the fake's link drops without a Finish. A and B are complete: they
 * end with "length" and are not retried; C is recovered on the real decode
 * worker, which computes its 4th token. */
static void test_lost_after_last_token(void)
{
    struct fake_worker f;
    CU_ASSERT_FATAL(fake_open(&f) == 0);
    const char *rargs[] = {"--workers", f.url, "--heartbeat-timeout-ms", "3600000", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 0, rargs, NULL) == 0);
    CU_ASSERT_FATAL(fake_hello(&f) == 0);
    CU_ASSERT_FATAL(rtc_wait_healthy(c.port, 1, RTC_HANG_MS) == 1);

    enum { MT = 4 };
    /* Prompts of 20, 21 and 22 tokens tell the jobs apart. */
    static const int plen[3] = {20, 21, 22};
    static const int stream[3] = {0, 1, 1};
    uint32_t prompt[3][22];
    struct rtc_conn conn[3];
    for (int i = 0; i < 3; i++) {
        h_prompt(prompt[i], plen[i], 101 + (uint64_t)i, 3, 259);
        CU_ASSERT_FATAL(rtc_send_completion(&conn[i], c.port, prompt[i], plen[i], MT, stream[i]) ==
                        0);
    }
    uint64_t wire_id[3] = {0};
    for (int k = 0; k < 3; k++) {
        Tandem__Envelope *env = fake_next_job(&f);
        CU_ASSERT_FATAL(env != NULL);
        int n = (int)env->decode_job->n_prompt_token_ids;
        EXPECT_EQ(env->decode_job->max_tokens, MT);
        EXPECT_EQ(env->decode_job->n_generated_token_ids, 0);
        for (int i = 0; i < 3; i++) {
            if (n == plen[i]) {
                wire_id[i] = env->request_id;
            }
        }
        wire_free(env);
    }
    CU_ASSERT_FATAL(wire_id[0] != 0 && wire_id[1] != 0 && wire_id[2] != 0);

    /* The real decode worker that would take any retry. */
    const char *wargs[] = {"--router", c.announce, "--log-level", "error", NULL};
    CU_ASSERT_FATAL(h_spawn(&c.d[0], "tandem-decode", wargs, 20000) == 0);
    c.n_d = 1;
    CU_ASSERT_FATAL(rtc_wait_healthy(c.port, 2, RTC_HANG_MS) == 2);

    uint32_t tok[3][MT];
    const float lps[MT] = {-0.5f, -1.25f, -2.0f, -0.125f};
    byte_ids("Done", tok[0]);
    byte_ids("Fine", tok[1]);
    byte_ids("abc", tok[2]);
    EXPECT_EQ(fake_tokens(&f, wire_id[0], 0, tok[0], lps, MT), 0);
    EXPECT_EQ(fake_tokens(&f, wire_id[1], 0, tok[1], lps, 2), 0);
    EXPECT_EQ(fake_tokens(&f, wire_id[1], 2, tok[1] + 2, lps + 2, 2), 0);
    EXPECT_EQ(fake_tokens(&f, wire_id[2], 0, tok[2], lps, 3), 0);
    /* The router has taken every token before the link drops: B's and C's
     * reached their clients, and A's (one chunk) gave it a first token. */
    CU_ASSERT_FATAL(rtc_wait_events(&conn[1], 2));
    CU_ASSERT_FATAL(rtc_wait_events(&conn[2], 1));
    double deadline = h_ms() + RTC_HANG_MS;
    const char *ttft = "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"}";
    while (!(rtc_metric(c.port, ttft) == 3) && h_ms() < deadline) {
        h_sleep_ms(5);
    }
    EXPECT_NUM(rtc_metric(c.port, ttft), 3);
    EXPECT_EQ(h_nng_close(f.s), 0);

    /* C's 4th token: what the engine samples after prompt + "abc". */
    uint32_t cont[22 + 3], next_id;
    float next_lp;
    memcpy(cont, prompt[2], sizeof(uint32_t) * 22);
    memcpy(cont + 22, tok[2], sizeof(uint32_t) * 3);
    CU_ASSERT_FATAL(ref_run(cont, 25, 1, &next_id, &next_lp) == 0);
    tok[2][3] = next_id;
    const float want_lp[3][MT] = {
        {lps[0], lps[1], lps[2], lps[3]},
        {lps[0], lps[1], lps[2], lps[3]},
        {lps[0], lps[1], lps[2], next_lp},
    };
    for (int i = 0; i < 3; i++) {
        struct rtc_resp r;
        EXPECT_EQ(rtc_read(&conn[i], &r, RTC_HANG_MS), 200);
        struct rtc_answer *a = calloc(1, sizeof(*a));
        rtc_answer_parse(r.body, stream[i], a);
        char *want = decode_text(tok[i], MT, prompt[i][plen[i] - 1]);
        EXPECT_STR(a->text, want);
        free(want);
        /* Every token exactly once, in order. */
        EXPECT_EQ(a->n_lp, MT);
        int same = 0;
        for (int k = 0; k < MT && k < a->n_lp; k++) {
            same += a->lp[k] == want_lp[i][k];
        }
        EXPECT_EQ(same, MT);
        EXPECT_STR(a->finish, "length");
        EXPECT_EQ(a->completion_tokens, MT);
        EXPECT_EQ(a->prompt_tokens, plen[i]);
        EXPECT_EQ(a->done, stream[i]);
        EXPECT_EQ(a->usage_chunks, 1);
        free(a);
        rtc_resp_free(&r);
        rtc_close(&conn[i]);
    }
    /* Only C was sent again, and only it reached the real worker. */
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_retries_total{reason=\"recovery\"}"), 1);
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_retries_total{reason=\"failure\"}"), 0);
    EXPECT_NUM(rtc_metric(c.port, "tandem:router_requests_total{code=\"200\"}"), 3);
    EXPECT_NUM(h_proc_metric_sum(&c.d[0], "vllm:request_success_total"), 1);
    rtc_cluster_stop(&c);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s =
        CU_add_suite_with_setup_and_teardown("router_dispatch", NULL, NULL, NULL, teardown);
    CU_add_test(s, "out_of_retries_503", test_out_of_retries_503);
    CU_add_test(s, "out_of_retries_stream_abort", test_out_of_retries_stream_abort);
    CU_add_test(s, "decode_lost_excludes_p_and_d", test_decode_lost_excludes_p_and_d);
    CU_add_test(s, "prefill_lost_excludes_p_and_d", test_prefill_lost_excludes_p_and_d);
    CU_add_test(s, "lost_after_last_token", test_lost_after_last_token);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
