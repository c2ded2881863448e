/* common/ctl: DecodeJob/Cancel messages from the plain struct, the stream
 * assembler's rules (order, gaps, duplicates, the end), and ctl_run_many
 * against a fake worker over inproc://. */
#include <CUnit/Basic.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <string.h>

#include "ctl.h"
#include "tandem_err.h"

static Tandem__Envelope *decode(nng_msg *m)
{
    Tandem__Envelope *env = NULL;
    CU_ASSERT_EQUAL(wire_unpack(nng_msg_body(m), nng_msg_len(m), &env), 0);
    nng_msg_free(m);
    return env;
}

static void test_job_msg(void)
{
    uint32_t prompt[3] = {5, 6, 7}, gen[2] = {8, 9}, stop[2] = {2, 11};
    struct ctl_job j;
    ctl_job_init(&j);
    CU_ASSERT_EQUAL(j.max_tokens, 16);
    CU_ASSERT_EQUAL(j.top_p, 1.0f);
    j.prompt = prompt;
    j.n_prompt = 3;
    j.generated = gen;
    j.n_generated = 2;
    j.max_tokens = 10;
    j.temperature = 0.5f;
    j.top_p = 0.9f;
    j.top_k = 40;
    j.has_seed = 1;
    j.seed = 1234567890123ULL;
    j.stop_ids = stop;
    j.n_stop = 2;
    j.logprobs = 3;
    j.prompt_logprobs = 1;
    j.ignore_eos = 1;
    j.hold_tokens = 1;
    j.prefill_address = "ipc:///tmp/p.ipc";
    nng_msg *m;
    CU_ASSERT_FATAL(ctl_job_msg(77, &j, &m) == 0);
    Tandem__Envelope *env = decode(m);
    CU_ASSERT_FATAL(env != NULL);
    CU_ASSERT_EQUAL(env->kind, TANDEM__ENVELOPE__KIND__DECODE_JOB);
    CU_ASSERT_EQUAL(env->request_id, 77);
    const Tandem__DecodeJob *d = env->decode_job;
    CU_ASSERT_EQUAL(d->n_prompt_token_ids, 3);
    CU_ASSERT_EQUAL(d->prompt_token_ids[2], 7);
    CU_ASSERT_EQUAL(d->n_generated_token_ids, 2);
    CU_ASSERT_EQUAL(d->generated_token_ids[1], 9);
    CU_ASSERT_EQUAL(d->max_tokens, 10);
    CU_ASSERT_STRING_EQUAL(d->prefill_address, "ipc:///tmp/p.ipc");
    CU_ASSERT_EQUAL(d->sampling->temperature, 0.5f);
    CU_ASSERT_EQUAL(d->sampling->top_p, 0.9f);
    CU_ASSERT_EQUAL(d->sampling->top_k, 40);
    CU_ASSERT_EQUAL(d->sampling->optional_seed_case, TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED);
    CU_ASSERT_EQUAL(d->sampling->seed, 1234567890123ULL);
    CU_ASSERT_EQUAL(d->sampling->n_stop_token_ids, 2);
    CU_ASSERT_EQUAL(d->sampling->stop_token_ids[1], 11);
    CU_ASSERT_EQUAL(d->sampling->logprobs, 3);
    CU_ASSERT(d->sampling->prompt_logprobs);
    CU_ASSERT(d->sampling->ignore_eos);
    CU_ASSERT(d->hold_tokens);
    wire_free(env);

    /* Defaults: no seed, local prefill. */
    ctl_job_init(&j);
    j.prompt = prompt;
    j.n_prompt = 3;
    CU_ASSERT_FATAL(ctl_job_msg(78, &j, &m) == 0);
    env = decode(m);
    CU_ASSERT_FATAL(env != NULL);
    CU_ASSERT_EQUAL(env->decode_job->sampling->optional_seed_case,
                    TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED__NOT_SET);
    CU_ASSERT_STRING_EQUAL(env->decode_job->prefill_address, "");
    CU_ASSERT_FALSE(env->decode_job->hold_tokens);
    wire_free(env);

    /* What the wire refuses is refused here, before sending. */
    j.top_p = 0;
    CU_ASSERT_EQUAL(ctl_job_msg(79, &j, &m), TANDEM_ERANGE);
    j.top_p = 1;
    j.n_prompt = 0;
    CU_ASSERT_EQUAL(ctl_job_msg(79, &j, &m), TANDEM_EPROTO);
    j.n_prompt = 3;
    CU_ASSERT_EQUAL(ctl_job_msg(0, &j, &m), TANDEM_EPROTO); /* request id 0 */
    CU_ASSERT_EQUAL(ctl_job_msg(79, NULL, &m), TANDEM_EINVAL);

    CU_ASSERT_FATAL(ctl_cancel_msg(80, &m) == 0);
    env = decode(m);
    CU_ASSERT_FATAL(env != NULL);
    CU_ASSERT_EQUAL(env->kind, TANDEM__ENVELOPE__KIND__CANCEL);
    CU_ASSERT_EQUAL(env->request_id, 80);
    wire_free(env);
}

/* ---- Envelope builders (borrowed storage: static per call site) -------- */

static Tandem__Envelope env_;
static Tandem__TokenChunk chunk_;
static uint32_t toks_[16];
static float lps_[16];
static Tandem__TopLogprobs top_[16], *topp_[16];
static uint32_t topid_[16];
static float toplp_[16];

static const Tandem__Envelope *chunk(uint64_t id, uint32_t first, int n, int with_top)
{
    tandem__token_chunk__init(&chunk_);
    for (int i = 0; i < n; i++) {
        toks_[i] = 100 + first + (uint32_t)i;
        lps_[i] = -0.5f * (float)(first + (uint32_t)i);
        tandem__top_logprobs__init(&top_[i]);
        topid_[i] = toks_[i];
        toplp_[i] = lps_[i];
        top_[i].n_token_ids = top_[i].n_logprobs = 1;
        top_[i].token_ids = &topid_[i];
        top_[i].logprobs = &toplp_[i];
        topp_[i] = &top_[i];
    }
    chunk_.first_index = first;
    chunk_.n_token_ids = (size_t)n;
    chunk_.token_ids = toks_;
    chunk_.n_logprobs = (size_t)n;
    chunk_.logprobs = lps_;
    if (with_top) {
        chunk_.n_top_logprobs = (size_t)n;
        chunk_.top_logprobs = topp_;
    }
    wire_env_init(&env_, TANDEM__ENVELOPE__KIND__TOKEN_CHUNK, id, &chunk_);
    return &env_;
}

static const Tandem__Envelope *finish(uint64_t id, Tandem__Finish__Reason reason)
{
    static Tandem__Usage u;
    static Tandem__Finish f;
    tandem__usage__init(&u);
    u.prompt_tokens = 3;
    u.completion_tokens = 5;
    u.cached_tokens = 2;
    tandem__finish__init(&f);
    f.reason = reason;
    f.usage = &u;
    wire_env_init(&env_, TANDEM__ENVELOPE__KIND__FINISH, id, &f);
    return &env_;
}

static const Tandem__Envelope *plp(uint64_t id, uint32_t first, int n)
{
    static Tandem__PromptLogprobs p;
    tandem__prompt_logprobs__init(&p);
    for (int i = 0; i < n; i++) {
        lps_[i] = -(float)(first + (uint32_t)i);
    }
    p.first_index = first;
    p.n_logprobs = (size_t)n;
    p.logprobs = lps_;
    wire_env_init(&env_, TANDEM__ENVELOPE__KIND__PROMPT_LOGPROBS, id, &p);
    return &env_;
}

static void test_stream_rules(void)
{
    struct ctl_stream s;
    ctl_stream_init(&s, 9);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(9, 0, 3, 1)), 0);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(9, 3, 2, 0)), 0);
    CU_ASSERT_EQUAL(s.n_tokens, 5);
    CU_ASSERT_EQUAL(s.first_index, 0);
    CU_ASSERT_EQUAL(s.tokens[4], 104);
    CU_ASSERT_EQUAL(s.logprobs[2], -1.0f);
    CU_ASSERT_EQUAL(s.n_top[1], 1);
    CU_ASSERT_EQUAL(s.top[1 * CTL_MAX_TOP].token, 101);
    CU_ASSERT_EQUAL(s.n_top[3], 0); /* that chunk had no alternatives */
    CU_ASSERT(s.t_first > 0);
    /* A duplicate and a gap are protocol violations, and ignored. */
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(9, 3, 2, 0)), TANDEM_EPROTO);
    CU_ASSERT(strstr(s.bad_detail, "duplicate") != NULL);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(9, 7, 1, 0)), TANDEM_EPROTO);
    CU_ASSERT(strstr(s.bad_detail, "gap") != NULL);
    CU_ASSERT_EQUAL(s.bad, 2);
    CU_ASSERT_EQUAL(s.n_tokens, 5);
    /* Not ours: another id, or worker-scoped. */
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(10, 5, 1, 0)), TANDEM_ENOENT);
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.worker_id = "w";
    Tandem__Envelope henv;
    wire_env_init(&henv, TANDEM__ENVELOPE__KIND__HEARTBEAT, 0, &hb);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, &henv), TANDEM_ENOENT);
    /* Error then Finish(ERROR). */
    Tandem__Error e = TANDEM__ERROR__INIT;
    e.code = TANDEM_ECLOSED;
    e.message = "prefill worker went away";
    Tandem__Envelope eenv;
    wire_env_init(&eenv, TANDEM__ENVELOPE__KIND__ERROR, 9, &e);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, &eenv), 0);
    CU_ASSERT_EQUAL(s.error_code, TANDEM_ECLOSED);
    CU_ASSERT_STRING_EQUAL(s.error, "prefill worker went away");
    CU_ASSERT_FALSE(s.done);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, finish(9, TANDEM__FINISH__REASON__ERROR)), 1);
    CU_ASSERT(s.done);
    CU_ASSERT_EQUAL(s.finish_reason, TANDEM__FINISH__REASON__ERROR);
    CU_ASSERT_EQUAL(s.prompt_tokens, 3);
    CU_ASSERT_EQUAL(s.completion_tokens, 5);
    CU_ASSERT_EQUAL(s.cached_tokens, 2);
    /* Nothing may follow the end. */
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(9, 5, 1, 0)), TANDEM_EPROTO);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, finish(9, TANDEM__FINISH__REASON__STOP)), TANDEM_EPROTO);
    CU_ASSERT_EQUAL(s.bad, 4);
    CU_ASSERT_EQUAL(s.finish_reason, TANDEM__FINISH__REASON__ERROR);
    ctl_stream_fini(&s);
    CU_ASSERT_EQUAL(s.id, 9);
    CU_ASSERT_EQUAL(s.n_tokens, 0);
    CU_ASSERT_PTR_NULL(s.tokens);

    /* A recovered request starts where the router's tokens stopped. */
    ctl_stream_init(&s, 11);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(11, 5, 1, 0)), 0);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(11, 6, 2, 0)), 0);
    CU_ASSERT_EQUAL(s.first_index, 5);
    CU_ASSERT_EQUAL(s.n_tokens, 3);
    CU_ASSERT_EQUAL(s.tokens[0], 105);
    ctl_stream_fini(&s);

    /* Busy ends the stream without a Finish. */
    ctl_stream_init(&s, 12);
    Tandem__Busy b = TANDEM__BUSY__INIT;
    b.reason = TANDEM__BUSY__REASON__NO_KV_BLOCKS;
    b.detail = "full";
    Tandem__Envelope benv;
    wire_env_init(&benv, TANDEM__ENVELOPE__KIND__BUSY, 12, &b);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, &benv), 1);
    CU_ASSERT(s.done && s.busy);
    CU_ASSERT_EQUAL(s.busy_reason, TANDEM__BUSY__REASON__NO_KV_BLOCKS);
    CU_ASSERT_EQUAL(s.finish_reason, 0);
    ctl_stream_fini(&s);

    /* A held request's last tokens come inside its Finish: taken first, by
     * the same rules as a TokenChunk. */
    ctl_stream_init(&s, 14);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(14, 0, 1, 0)), 0);
    Tandem__TokenChunk *last = chunk(14, 1, 3, 1)->token_chunk; /* chunk_, kept */
    const Tandem__Envelope *fe = finish(14, TANDEM__FINISH__REASON__LENGTH);
    fe->finish->last_tokens = last;
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, fe), 1);
    CU_ASSERT(s.done);
    CU_ASSERT_EQUAL(s.finish_reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT_EQUAL_FATAL(s.n_tokens, 4);
    CU_ASSERT_EQUAL(s.tokens[3], 103);
    CU_ASSERT_EQUAL(s.top[2 * CTL_MAX_TOP].token, 102);
    ctl_stream_fini(&s);
    /* ... and a gap there is a violation, and the Finish is not taken. */
    ctl_stream_init(&s, 15);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(15, 0, 1, 0)), 0);
    last = chunk(15, 2, 1, 0)->token_chunk;
    fe = finish(15, TANDEM__FINISH__REASON__LENGTH);
    fe->finish->last_tokens = last;
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, fe), TANDEM_EPROTO);
    CU_ASSERT_FALSE(s.done);
    CU_ASSERT_EQUAL(s.n_tokens, 1);
    fe->finish->last_tokens = NULL;
    ctl_stream_fini(&s);

    /* Prompt logprobs: positions from 1, contiguous. */
    ctl_stream_init(&s, 13);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, plp(13, 1, 3)), 0);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, plp(13, 4, 2)), 0);
    CU_ASSERT_EQUAL(s.n_prompt_logprobs, 5);
    CU_ASSERT_EQUAL(s.prompt_logprobs[4], -5.0f);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, plp(13, 4, 1)), TANDEM_EPROTO);
    /* A kind a worker never sends for a request. */
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    Tandem__Envelope cenv;
    wire_env_init(&cenv, TANDEM__ENVELOPE__KIND__CANCEL, 13, &c);
    CU_ASSERT_EQUAL(ctl_stream_feed(&s, &cenv), TANDEM_EPROTO);
    CU_ASSERT_EQUAL(s.bad, 2);
    ctl_stream_fini(&s);

    /* Long streams grow. */
    ctl_stream_init(&s, 14);
    for (uint32_t i = 0; i < 1000; i++) {
        CU_ASSERT_EQUAL(ctl_stream_feed(&s, chunk(14, i, 1, 1)), 0);
    }
    CU_ASSERT_EQUAL(s.n_tokens, 1000);
    CU_ASSERT_EQUAL(s.tokens[999], 1099);
    ctl_stream_fini(&s);
}

/* ---- ctl_run_many against a fake worker over inproc ---------------------- */

struct fake {
    nng_socket sock;
    int jobs;
    int cancels;
};

/* Answers every job with its prompt length as tokens (in two chunks), a
 * heartbeat in between, and a Finish; ignores job 666 (never answered). */
static void *fake_worker(void *arg)
{
    struct fake *f = arg;
    for (;;) {
        Tandem__Envelope *env;
        int rc = wire_recv(f->sock, 0, &env);
        if (rc == TANDEM_ECLOSED) {
            return NULL;
        }
        if (rc != 0) {
            continue;
        }
        if (env->kind == TANDEM__ENVELOPE__KIND__CANCEL) {
            f->cancels++;
            wire_free(env);
            continue;
        }
        f->jobs++;
        uint64_t id = env->request_id;
        int n = (int)env->decode_job->n_prompt_token_ids;
        wire_free(env);
        if (id == 666) {
            continue;
        }
        wire_send(f->sock, chunk(id, 0, n / 2, 0), 0);
        Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
        hb.worker_id = "fake";
        Tandem__Envelope henv;
        wire_env_init(&henv, TANDEM__ENVELOPE__KIND__HEARTBEAT, 0, &hb);
        wire_send(f->sock, &henv, 0);
        wire_send(f->sock, chunk(id, (uint32_t)(n / 2), n - n / 2, 0), 0);
        wire_send(f->sock, finish(id, TANDEM__FINISH__REASON__LENGTH), 0);
    }
}

static void count_other(void *arg, nng_socket s, const Tandem__Envelope *env)
{
    (void)s;
    if (env->kind == TANDEM__ENVELOPE__KIND__HEARTBEAT) {
        (*(int *)arg)++;
    }
}

static void test_run_many(void)
{
    struct fake f = {0};
    CU_ASSERT_FATAL(nng_pair0_open(&f.sock) == 0);
    CU_ASSERT_FATAL(nng_listen(f.sock, "inproc://ctl-test", NULL, 0) == 0);
    pthread_t th;
    CU_ASSERT_FATAL(pthread_create(&th, NULL, fake_worker, &f) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, "inproc://ctl-test", NNG_FLAG_NONBLOCK) == 0);

    uint32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct ctl_job jobs[3];
    struct ctl_item items[3];
    for (int i = 0; i < 3; i++) {
        ctl_job_init(&jobs[i]);
        jobs[i].prompt = prompt;
        jobs[i].n_prompt = 2 + 3 * i; /* 2, 5, 8 tokens back */
        items[i] = (struct ctl_item){.sock = s, .id = 100 + (uint64_t)i, .job = &jobs[i]};
    }
    int heartbeats = 0;
    CU_ASSERT_EQUAL(ctl_run_many(items, 3, 5000, count_other, &heartbeats), 0);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT(items[i].stream.done);
        CU_ASSERT_EQUAL(items[i].stream.bad, 0);
        CU_ASSERT_EQUAL(items[i].stream.n_tokens, 2 + 3 * i);
        CU_ASSERT_EQUAL(items[i].stream.finish_reason, TANDEM__FINISH__REASON__LENGTH);
        ctl_stream_fini(&items[i].stream);
    }
    CU_ASSERT_EQUAL(heartbeats, 3);

    struct ctl_stream st;
    CU_ASSERT_EQUAL(ctl_run(s, 200, &jobs[1], 5000, &st), 0);
    CU_ASSERT_EQUAL(st.n_tokens, 5);
    ctl_stream_fini(&st);

    /* Never answered: a timeout, with what arrived (nothing). */
    CU_ASSERT_EQUAL(ctl_run(s, 666, &jobs[0], 200, &st), TANDEM_ETIMEOUT);
    CU_ASSERT_FALSE(st.done);
    ctl_stream_fini(&st);
    CU_ASSERT_EQUAL(ctl_send_cancel(s, 666, 0), 0);

    /* A job the wire refuses is not sent. */
    jobs[2].top_p = 2.0f;
    CU_ASSERT_EQUAL(ctl_run(s, 300, &jobs[2], 200, &st), TANDEM_ERANGE);
    ctl_stream_fini(&st);

    nng_msleep(100); /* let the fake worker see the cancel */
    nng_close(s);
    nng_close(f.sock);
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(f.jobs, 5);
    CU_ASSERT_EQUAL(f.cancels, 1);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("ctl", NULL, NULL);
    CU_add_test(s, "job_msg", test_job_msg);
    CU_add_test(s, "stream_rules", test_stream_rules);
    CU_add_test(s, "run_many", test_run_many);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    nng_fini(); /* NNG's threads, so valgrind sees nothing left */
    return failed ? 1 : 0;
}
