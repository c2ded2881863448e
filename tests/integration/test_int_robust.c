/* Integration: hostile and broken peers. Garbage, truncated, oversized,
 * wrong-version and misdirected messages on every socket of both workers
 * (control link, data link, metrics HTTP) are refused and counted
 * (tandem:messages_rejected_total{link,reason}, tandem:kv_frames_rejected_total
 * {reason}, tandem:http_errors_total), and the workers still serve normal
 * requests afterwards. The test also plays a prefill worker that sends bad KV
 * frames (wrong hash, size, dtype, index, token count, duplicates, unknown
 * request) and a decode worker that receives P's frames, checking each
 * refusal and that a request fails only when it can no longer complete. */
#include <CUnit/Basic.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block_hash.h"
#include "ctl.h"
#include "expect.h"
#include "harness.h"
#include "tandem_err.h"

/* Every wait's overall timeout: only a hang reaches it. */
#define TIMEOUT_MS 30000
/* A clean stop may take longer than the workers' stop watchdog (10 s,
 * worker/worker.c), which ends a stop that hangs with status 70 (a
 * failure). */
#define STOP_MS     20000
#define BLOCK_BYTES 131072u /* tiny, f32, 16 tokens */

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

static double rejected(const struct h_proc *p, const char *link)
{
    char prefix[128];
    snprintf(prefix, sizeof(prefix), "tandem:messages_rejected_total{link=\"%s\"", link);
    return h_proc_metric_sum(p, prefix);
}

/* tandem:kv_frames_rejected_total{reason}, or NAN when p does not export it
 * (it exports every reason from its start, at 0). */
static double frames_rejected(const struct h_proc *p, const char *reason)
{
    char series[128];
    snprintf(series, sizeof(series), "tandem:kv_frames_rejected_total{reason=\"%s\"}", reason);
    return h_proc_metric(p, series);
}

/* Waits until rejected(p, link) reaches want. Returns the last value (NAN:
 * no such series). */
static double wait_rejected(const struct h_proc *p, const char *link, double want)
{
    double v = NAN;
    for (double end = h_ms() + TIMEOUT_MS; h_ms() < end; h_sleep_ms(10)) {
        v = rejected(p, link);
        if (isnan(v) || v >= want) {
            break;
        }
    }
    return v;
}

static double wait_frames_rejected(const struct h_proc *p, const char *reason, double want)
{
    double v = NAN;
    for (double end = h_ms() + TIMEOUT_MS; h_ms() < end; h_sleep_ms(10)) {
        v = frames_rejected(p, reason);
        if (isnan(v) || v >= want) {
            break;
        }
    }
    return v;
}

static void send_raw(nng_socket s, const void *data, size_t len)
{
    nng_msg *m;
    CU_ASSERT_FATAL(nng_msg_alloc(&m, len) == 0);
    if (len > 0) {
        memcpy(nng_msg_body(m), data, len);
    }
    CU_ASSERT_EQUAL(nng_sendmsg(s, m, 0), 0);
}

/* Packs env with protobuf-c directly (no validation: we want bad ones). */
static size_t pack_unchecked(const Tandem__Envelope *env, uint8_t **out)
{
    size_t n = tandem__envelope__get_packed_size(env);
    *out = malloc(n + 1);
    tandem__envelope__pack(env, *out);
    return n;
}

/* A data-link frame around raw envelope bytes. */
static size_t frame_raw(const uint8_t *env, size_t n, const void *payload, size_t plen,
                        uint8_t **out)
{
    *out = malloc(4 + n + plen + 1);
    (*out)[0] = (uint8_t)n;
    (*out)[1] = (uint8_t)(n >> 8);
    (*out)[2] = (uint8_t)(n >> 16);
    (*out)[3] = (uint8_t)(n >> 24);
    memcpy(*out + 4, env, n);
    if (plen > 0) {
        memcpy(*out + 4 + n, payload, plen);
    }
    return 4 + n + plen;
}

static void fill_garbage(uint8_t *b, size_t n, uint64_t seed)
{
    uint32_t t[64];
    for (size_t i = 0; i < n; i += 64) {
        h_prompt(t, 64, seed + i, 0, 256);
        for (size_t j = 0; j < 64 && i + j < n; j++) {
            b[i + j] = (uint8_t)t[j];
        }
    }
}

/* A normal request through d (and p when given) completes. */
static void serves(const struct h_proc *d, const struct h_proc *p)
{
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d->control, 0) == 0);
    uint32_t prompt[70];
    h_prompt(prompt, 70, 99, 3, 259);
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = 70;
    job.max_tokens = 5;
    job.ignore_eos = 1;
    job.prefill_address = p ? p->kv : NULL;
    struct ctl_stream st;
    CU_ASSERT_EQUAL(ctl_run(s, next_id++, &job, TIMEOUT_MS, &st), 0);
    CU_ASSERT_EQUAL(st.n_tokens, 5);
    CU_ASSERT_EQUAL(st.finish_reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT_EQUAL(st.bad, 0);
    ctl_stream_fini(&st);
    h_nng_close(s);
}

/* ---- Every rejection counter from the start ------------------------------ */

/* A fresh worker exports each known reason of its rejection counters at 0
 * (worker/wk_metrics.c), so a check that one is 0 fails if it is gone. */
static void test_series_from_start(void)
{
    const char *frame_reasons[] = {"unknown_request", "block_index", "duplicate", "token_count",
                                   "dtype",           "layers",      "size",      "hash",
                                   "checksum"};
    const char *links[] = {"control", "data"};
    const char *reasons[] = {"EPROTO", "EVERSION",        "ETOOBIG",  "ETRUNCATED",
                             "auth",   "unexpected_kind", "duplicate"};
    struct h_proc w[2];
    CU_ASSERT_FATAL(spawn(&w[0], "tandem-prefill", NULL) == 0);
    CU_ASSERT_FATAL(spawn(&w[1], "tandem-decode", NULL) == 0);
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < sizeof(frame_reasons) / sizeof(frame_reasons[0]); i++) {
            EXPECT_EQ(frames_rejected(&w[k], frame_reasons[i]), 0);
        }
        for (int l = 0; l < 2; l++) {
            EXPECT_EQ(rejected(&w[k], links[l]), 0);
            for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++) {
                char series[128];
                snprintf(series, sizeof(series),
                         "tandem:messages_rejected_total{link=\"%s\",reason=\"%s\"}", links[l],
                         reasons[i]);
                EXPECT_EQ(h_proc_metric(&w[k], series), 0);
            }
        }
        const char *data_only[] = {"ECHECKSUM", "unknown_request", "bad_address"};
        for (size_t i = 0; i < sizeof(data_only) / sizeof(data_only[0]); i++) {
            char series[128];
            snprintf(series, sizeof(series),
                     "tandem:messages_rejected_total{link=\"data\",reason=\"%s\"}", data_only[i]);
            EXPECT_EQ(h_proc_metric(&w[k], series), 0);
        }
    }
    EXPECT_EQ(h_stop(&w[0], SIGTERM, STOP_MS), 0);
    EXPECT_EQ(h_stop(&w[1], SIGTERM, STOP_MS), 0);
}

/* ---- Control link ------------------------------------------------------- */

/* Sends 8 bad messages on the control link of w; all must be counted. */
static void hammer_control(const struct h_proc *w)
{
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, w->control, 0) == 0);
    double before = rejected(w, "control");
    uint8_t junk[300];
    fill_garbage(junk, sizeof(junk), 5);
    send_raw(s, junk, sizeof(junk)); /* garbage */
    send_raw(s, junk, 0);            /* empty */

    uint32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    nng_msg *good;
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = 8;
    CU_ASSERT_FATAL(ctl_job_msg(77, &job, &good) == 0);
    send_raw(s, nng_msg_body(good), nng_msg_len(good) / 2); /* truncated */
    nng_msg_free(good);

    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    sp.top_p = 1;
    Tandem__DecodeJob dj = TANDEM__DECODE_JOB__INIT;
    dj.n_prompt_token_ids = 8;
    dj.prompt_token_ids = prompt;
    dj.max_tokens = 4;
    dj.sampling = &sp;
    dj.prefill_address = "";
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__DECODE_JOB, 78, &dj);
    env.version = 2; /* wrong version */
    uint8_t *buf;
    size_t n = pack_unchecked(&env, &buf);
    send_raw(s, buf, n);
    free(buf);

    env.version = WIRE_VERSION; /* oversized: 131073 prompt tokens */
    static uint32_t huge[WIRE_MAX_TOKENS + 1];
    dj.n_prompt_token_ids = WIRE_MAX_TOKENS + 1;
    dj.prompt_token_ids = huge;
    n = pack_unchecked(&env, &buf);
    send_raw(s, buf, n);
    free(buf);
    dj.n_prompt_token_ids = 8;
    dj.prompt_token_ids = prompt;

    sp.top_p = 0; /* out of range */
    n = pack_unchecked(&env, &buf);
    send_raw(s, buf, n);
    free(buf);
    sp.top_p = 1;

    /* A kind the router never sends to a worker. */
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.worker_id = "me";
    Tandem__Envelope henv;
    wire_env_init(&henv, TANDEM__ENVELOPE__KIND__HEARTBEAT, 0, &hb);
    CU_ASSERT_EQUAL(wire_send(s, &henv, 0), 0);

    /* A KV frame has no business on a control link. */
    Tandem__KvFrameHeader kh = TANDEM__KV_FRAME_HEADER__INIT;
    kh.layer_count = 1;
    kh.token_count = 1;
    kh.dtype = TANDEM__KV_DTYPE__KV_DTYPE_F32;
    Tandem__Envelope kenv;
    wire_env_init(&kenv, TANDEM__ENVELOPE__KIND__KV_FRAME, 5, &kh);
    n = pack_unchecked(&kenv, &buf);
    send_raw(s, buf, n);
    free(buf);

    double after = wait_rejected(w, "control", before + 8);
    EXPECT_EQ(after - before, 8);
    /* The wrong version was answered: ERROR{EVERSION}, request id 0. */
    int version_errors = 0;
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 50);
    for (double end = h_ms() + TIMEOUT_MS; h_ms() < end && version_errors == 0;) {
        Tandem__Envelope *m;
        if (wire_recv(s, 0, &m) == 0) {
            version_errors += m->kind == TANDEM__ENVELOPE__KIND__ERROR && m->request_id == 0 &&
                              m->error->code == TANDEM_EVERSION;
            wire_free(m);
        }
    }
    EXPECT_EQ(version_errors, 1);
    printf("\n  %s control link: %.0f bad messages refused and counted\n", w->role, after - before);

    /* Over NNG's receive limit: NNG drops the connection before we see it
     * (not counted by us); the router's dialer reconnects. */
    size_t big = WIRE_MAX_MSG_BYTES + 4096;
    uint8_t *b = calloc(1, big);
    send_raw(s, b, big);
    free(b);
    h_sleep_ms(100); /* let the send finish before closing (NNG can stall a close otherwise) */
    h_nng_close(s);
}

static void test_control_link(void)
{
    struct h_proc p, d;
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", NULL) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    hammer_control(&d);
    hammer_control(&p);
    serves(&d, &p);
    serves(&d, NULL);
    CU_ASSERT_EQUAL(h_kv_invariant(&p, NULL), 0);
    CU_ASSERT_EQUAL(h_kv_invariant(&d, NULL), 0);
    EXPECT_EQ(h_stop(&p, SIGTERM, STOP_MS), 0);
    EXPECT_EQ(h_stop(&d, SIGTERM, STOP_MS), 0);
}

/* ---- Data link: garbage ------------------------------------------------- */

static int push_to(nng_socket *s, const char *url)
{
    if (nng_push0_open(s) != 0) {
        return -1;
    }
    nng_socket_set_ms(*s, NNG_OPT_SENDTIMEO, TIMEOUT_MS);
    return nng_dial(*s, url, NULL, 0);
}

/* Sends 9 bad frames to w's data address; all must be counted. */
static void hammer_data(const struct h_proc *w)
{
    nng_socket s;
    CU_ASSERT_FATAL(push_to(&s, w->kv) == 0);
    double before = rejected(w, "data");
    double cks = frames_rejected(w, "checksum");
    uint8_t junk[300];
    fill_garbage(junk, sizeof(junk), 9);
    send_raw(s, junk, sizeof(junk)); /* garbage (a huge length prefix) */
    send_raw(s, junk, 3);            /* shorter than the prefix */

    /* A valid frame, cut short. */
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__CANCEL, 5, &c);
    uint8_t *e, *f;
    size_t en = pack_unchecked(&env, &e);
    size_t fn = frame_raw(e, en, NULL, 0, &f);
    send_raw(s, f, fn - 1);
    free(f);
    free(e);

    /* Wrong version. */
    env.version = 9;
    en = pack_unchecked(&env, &e);
    fn = frame_raw(e, en, NULL, 0, &f);
    send_raw(s, f, fn);
    free(f);
    free(e);
    env.version = WIRE_VERSION;

    /* Oversized payload_length field. */
    Tandem__KvFrameHeader kh = TANDEM__KV_FRAME_HEADER__INIT;
    kh.layer_count = 8;
    kh.token_count = 16;
    kh.dtype = TANDEM__KV_DTYPE__KV_DTYPE_F32;
    kh.payload_length = (uint64_t)WIRE_MAX_KV_PAYLOAD_BYTES + 1;
    Tandem__Envelope kenv;
    wire_env_init(&kenv, TANDEM__ENVELOPE__KIND__KV_FRAME, 5, &kh);
    en = pack_unchecked(&kenv, &e);
    fn = frame_raw(e, en, NULL, 0, &f);
    send_raw(s, f, fn);
    free(f);
    free(e);

    /* Payload that does not match its checksum. */
    static uint8_t payload[BLOCK_BYTES];
    kh.payload_length = BLOCK_BYTES;
    kh.checksum = 12345;
    en = pack_unchecked(&kenv, &e);
    fn = frame_raw(e, en, payload, BLOCK_BYTES, &f);
    send_raw(s, f, fn);
    free(f);
    free(e);

    /* Payload longer than the header says. */
    kh.payload_length = 10;
    en = pack_unchecked(&kenv, &e);
    fn = frame_raw(e, en, payload, 20, &f);
    send_raw(s, f, fn);
    free(f);
    free(e);

    /* A decode job on a data link, and a heartbeat: wrong kinds. */
    uint32_t prompt[4] = {5, 6, 7, 8};
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = 4;
    nng_msg *m;
    CU_ASSERT_FATAL(ctl_job_msg(6, &job, &m) == 0);
    Tandem__Envelope *dj;
    CU_ASSERT_FATAL(wire_unpack(nng_msg_body(m), nng_msg_len(m), &dj) == 0);
    nng_msg_free(m);
    CU_ASSERT_EQUAL(wire_frame_send(s, dj, NULL, 0, 0), 0);
    wire_free(dj);
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.worker_id = "me";
    Tandem__Envelope henv;
    wire_env_init(&henv, TANDEM__ENVELOPE__KIND__HEARTBEAT, 0, &hb);
    CU_ASSERT_EQUAL(wire_frame_send(s, &henv, NULL, 0, 0), 0);

    double after = wait_rejected(w, "data", before + 9);
    EXPECT_EQ(after - before, 9);
    EXPECT_EQ(frames_rejected(w, "checksum") - cks, 1);
    printf("\n  %s data link: %.0f bad frames refused and counted\n", w->role, after - before);
    h_nng_close(s);
}

static void test_data_link_and_http(void)
{
    struct h_proc p, d;
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", NULL) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    hammer_data(&d);
    hammer_data(&p);

    /* HTTP: garbage and an oversized header are answered 4xx and counted;
     * the port still serves. */
    struct h_proc *both[] = {&p, &d};
    for (int i = 0; i < 2; i++) {
        double e0 = h_proc_metric(both[i], "tandem:http_errors_total");
        const char junk[] = "\x01\x02 garbage \xff\r\n\r\n";
        EXPECT_EQ(h_http_raw(both[i]->metrics_port, junk, sizeof(junk) - 1, TIMEOUT_MS), 400);
        size_t n = 40000;
        char *big = malloc(n);
        memset(big, 'a', n);
        memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
        memcpy(big + n - 4, "\r\n\r\n", 4);
        int st = h_http_raw(both[i]->metrics_port, big, n, TIMEOUT_MS);
        EXPECT_EQ(st, 431);
        free(big);
        EXPECT_EQ(h_proc_metric(both[i], "tandem:http_errors_total") - e0, 2);
        char *body;
        CU_ASSERT_EQUAL(h_http_get(both[i]->metrics_port, "/health", &body), 200);
        free(body);
    }

    serves(&d, &p);
    CU_ASSERT_EQUAL(h_kv_invariant(&p, NULL), 0);
    CU_ASSERT_EQUAL(h_kv_invariant(&d, NULL), 0);
    EXPECT_EQ(h_stop(&p, SIGTERM, STOP_MS), 0);
    EXPECT_EQ(h_stop(&d, SIGTERM, STOP_MS), 0);
}

/* ---- The test as a prefill worker: bad frames to D ---------------------- */

struct fake_p {
    nng_socket pull; /* our data listener: D sends PrefillJob here */
    char url[H_URL_MAX];
    nng_socket push; /* to D's data address */
};

static void fake_p_open(struct fake_p *f, const char *name)
{
    h_ipc_url(f->url, sizeof(f->url), name);
    CU_ASSERT_FATAL(nng_pull0_open(&f->pull) == 0);
    CU_ASSERT_FATAL(wire_socket_setup(f->pull, WIRE_LINK_DATA) == 0);
    nng_socket_set_ms(f->pull, NNG_OPT_RECVTIMEO, TIMEOUT_MS);
    CU_ASSERT_FATAL(nng_listen(f->pull, f->url, NULL, 0) == 0);
    f->push.id = 0;
}

/* Receives D's PrefillJob for id (and dials D the first time). */
static Tandem__Envelope *fake_p_job(struct fake_p *f)
{
    struct wire_frame fr;
    if (wire_frame_recv(f->pull, 0, &fr) != 0) {
        return NULL;
    }
    Tandem__Envelope *env = fr.env;
    fr.env = NULL;
    wire_frame_fini(&fr);
    if (env->kind != TANDEM__ENVELOPE__KIND__PREFILL_JOB) {
        wire_free(env);
        return NULL;
    }
    if (f->push.id == 0) {
        CU_ASSERT_FATAL(push_to(&f->push, env->prefill_job->decode_kv_address) == 0);
    }
    return env;
}

static void send_block(struct fake_p *f, uint64_t id, uint32_t idx, uint64_t hash, uint32_t tc,
                       int dtype, uint32_t layers, size_t len)
{
    static uint8_t payload[2 * BLOCK_BYTES];
    Tandem__KvFrameHeader kh = TANDEM__KV_FRAME_HEADER__INIT;
    kh.block_index = idx;
    kh.block_hash = hash;
    kh.layer_count = layers;
    kh.token_count = tc;
    kh.dtype = (Tandem__KvDtype)dtype;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__KV_FRAME, id, &kh);
    CU_ASSERT_EQUAL(wire_frame_send(f->push, &env, payload, len, 0), 0);
}

static void send_done(struct fake_p *f, uint64_t id, uint32_t first_token, uint32_t sent)
{
    Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
    d.first_token = first_token;
    d.blocks_sent = sent;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__PREFILL_DONE, id, &d);
    CU_ASSERT_EQUAL(wire_frame_send(f->push, &env, NULL, 0, 0), 0);
}

static void test_bad_frames_to_decode(void)
{
    struct h_proc d;
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    struct fake_p f;
    fake_p_open(&f, "fake-p");
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);

    /* 40 tokens: blocks 0, 1 full, block 2 partial (8 tokens). */
    uint32_t prompt[40];
    h_prompt(prompt, 40, 123, 3, 259);
    uint64_t root = bh_root("tiny"), h[2];
    bh_hash_prompt(root, prompt, 40, 16, h);
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = 40;
    job.max_tokens = 3;
    job.ignore_eos = 1;
    job.prefill_address = f.url;

    uint64_t id = next_id++;
    CU_ASSERT_FATAL(ctl_send_job(s, id, &job, 0) == 0);
    Tandem__Envelope *pj = fake_p_job(&f);
    CU_ASSERT_FATAL(pj != NULL);
    CU_ASSERT_EQUAL(pj->request_id, id);
    CU_ASSERT_EQUAL(pj->prefill_job->skip_blocks, 0);
    CU_ASSERT_EQUAL(pj->prefill_job->n_prompt_token_ids, 40);
    CU_ASSERT(pj->prefill_job->sampling->optional_seed_case ==
              TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED);
    wire_free(pj);

    const int F32 = TANDEM__KV_DTYPE__KV_DTYPE_F32;
    send_block(&f, id, 0, h[0] ^ 1, 16, F32, 8, BLOCK_BYTES);                        /* hash */
    send_block(&f, id, 0, h[0], 16, F32, 8, BLOCK_BYTES - 4);                        /* size */
    send_block(&f, id, 0, h[0], 16, TANDEM__KV_DTYPE__KV_DTYPE_F16, 8, BLOCK_BYTES); /* dtype */
    send_block(&f, id, 3, h[0], 16, F32, 8, BLOCK_BYTES);        /* block_index */
    send_block(&f, id, 0, h[0], 15, F32, 8, BLOCK_BYTES);        /* token_count */
    send_block(&f, id, 0, h[0], 16, F32, 4, BLOCK_BYTES);        /* layers */
    send_block(&f, id + 1000, 0, h[0], 16, F32, 8, BLOCK_BYTES); /* unknown_request */
    send_block(&f, id, 0, h[0], 16, F32, 8, BLOCK_BYTES);        /* good */
    send_block(&f, id, 0, h[0], 16, F32, 8, BLOCK_BYTES);        /* duplicate */
    send_block(&f, id, 2, 4, 8, F32, 8, BLOCK_BYTES);            /* hash (partial: must be 0) */
    send_block(&f, id, 1, h[1], 16, F32, 8, BLOCK_BYTES);        /* good */
    send_block(&f, id, 2, 0, 8, F32, 8, BLOCK_BYTES);            /* good (partial) */
    send_done(&f, id, 42, 3);
    struct ctl_stream st;
    ctl_stream_init(&st, id);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 100);
    for (double end = h_ms() + TIMEOUT_MS; !st.done && h_ms() < end;) {
        Tandem__Envelope *env;
        if (wire_recv(s, 0, &env) == 0) {
            ctl_stream_feed(&st, env);
            wire_free(env);
        }
    }
    /* Every bad frame dropped, the good ones installed: the request runs
     * (on garbage KV, but from our first token). */
    CU_ASSERT_EQUAL(st.finish_reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT_EQUAL_FATAL(st.n_tokens, 3);
    CU_ASSERT_EQUAL(st.tokens[0], 42);
    ctl_stream_fini(&st);
    const char *reasons[] = {"hash",        "size",   "dtype",           "block_index",
                             "token_count", "layers", "unknown_request", "duplicate"};
    const double want[] = {2, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 8; i++) {
        double v = wait_frames_rejected(&d, reasons[i], want[i]);
        CU_ASSERT_EQUAL(v, want[i]);
        if (v != want[i]) {
            fprintf(stderr, "\n  kv_frames_rejected_total{reason=\"%s\"} = %g, want %g\n",
                    reasons[i], v, want[i]);
        }
    }
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_frames_installed_total"), 3);

    /* A block that never arrives: at PrefillDone the request cannot complete
     * and fails cleanly. */
    id = next_id++;
    CU_ASSERT_FATAL(ctl_send_job(s, id, &job, 0) == 0);
    pj = fake_p_job(&f);
    CU_ASSERT_FATAL(pj != NULL);
    /* D already holds blocks 0 and 1 (the first request committed them). */
    CU_ASSERT_EQUAL(pj->prefill_job->skip_blocks, 2);
    wire_free(pj);
    send_block(&f, id, 2, 1, 8, F32, 8, BLOCK_BYTES); /* refused */
    send_done(&f, id, 42, 1);
    ctl_stream_init(&st, id);
    for (double end = h_ms() + TIMEOUT_MS; !st.done && h_ms() < end;) {
        Tandem__Envelope *env;
        if (wire_recv(s, 0, &env) == 0) {
            ctl_stream_feed(&st, env);
            wire_free(env);
        }
    }
    CU_ASSERT_EQUAL(st.error_code, TANDEM_EPROTO);
    CU_ASSERT_EQUAL(st.finish_reason, TANDEM__FINISH__REASON__ERROR);
    CU_ASSERT_EQUAL(st.n_tokens, 0);
    ctl_stream_fini(&st);

    /* An Error from P fails the request; a Busy from P becomes Busy. */
    for (int k = 0; k < 2; k++) {
        id = next_id++;
        CU_ASSERT_FATAL(ctl_send_job(s, id, &job, 0) == 0);
        pj = fake_p_job(&f);
        CU_ASSERT_FATAL(pj != NULL);
        wire_free(pj);
        Tandem__Error e = TANDEM__ERROR__INIT;
        e.code = TANDEM_EIO;
        e.message = "disk on fire";
        Tandem__Busy b = TANDEM__BUSY__INIT;
        b.reason = TANDEM__BUSY__REASON__TOO_MANY_SEQS;
        b.detail = "full";
        Tandem__Envelope env;
        if (k == 0) {
            wire_env_init(&env, TANDEM__ENVELOPE__KIND__ERROR, id, &e);
        } else {
            wire_env_init(&env, TANDEM__ENVELOPE__KIND__BUSY, id, &b);
        }
        CU_ASSERT_EQUAL(wire_frame_send(f.push, &env, NULL, 0, 0), 0);
        ctl_stream_init(&st, id);
        for (double end = h_ms() + TIMEOUT_MS; !st.done && h_ms() < end;) {
            Tandem__Envelope *m;
            if (wire_recv(s, 0, &m) == 0) {
                ctl_stream_feed(&st, m);
                wire_free(m);
            }
        }
        if (k == 0) {
            CU_ASSERT_EQUAL(st.error_code, TANDEM_EIO);
            CU_ASSERT(strstr(st.error, "disk on fire") != NULL);
            CU_ASSERT_EQUAL(st.finish_reason, TANDEM__FINISH__REASON__ERROR);
        } else {
            CU_ASSERT_EQUAL(st.busy, 1);
            CU_ASSERT_EQUAL(st.busy_reason, TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE);
        }
        ctl_stream_fini(&st);
    }

    double used = -1;
    CU_ASSERT_EQUAL(h_kv_invariant(&d, &used), 0);
    CU_ASSERT_EQUAL(used, 0);
    h_nng_close(s); /* PAIR0: one router at a time */
    serves(&d, NULL);
    h_nng_close(f.pull);
    h_nng_close(f.push);
    EXPECT_EQ(h_stop(&d, SIGTERM, STOP_MS), 0);
}

/* ---- The test as a decode worker: P's side of the protocol -------------- */

static void test_prefill_protocol(void)
{
    struct h_proc p;
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", NULL) == 0);
    char url[H_URL_MAX];
    h_ipc_url(url, sizeof(url), "fake-d");
    nng_socket pull, push;
    CU_ASSERT_FATAL(nng_pull0_open(&pull) == 0);
    CU_ASSERT_FATAL(wire_socket_setup(pull, WIRE_LINK_DATA) == 0);
    nng_socket_set_ms(pull, NNG_OPT_RECVTIMEO, TIMEOUT_MS);
    CU_ASSERT_FATAL(nng_listen(pull, url, NULL, 0) == 0);
    CU_ASSERT_FATAL(push_to(&push, p.kv) == 0);

    uint32_t prompt[50];
    h_prompt(prompt, 50, 321, 3, 259);
    uint64_t root = bh_root("tiny"), h[3];
    bh_hash_prompt(root, prompt, 50, 16, h);
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    sp.top_p = 1;
    sp.logprobs = 3;
    sp.optional_seed_case = TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED;
    Tandem__PrefillJob pj = TANDEM__PREFILL_JOB__INIT;
    pj.n_prompt_token_ids = 50;
    pj.prompt_token_ids = prompt;
    pj.skip_blocks = 1;
    pj.decode_kv_address = url;
    pj.sampling = &sp;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__PREFILL_JOB, 500, &pj);
    CU_ASSERT_EQUAL(wire_frame_send(push, &env, NULL, 0, 0), 0);
    /* Blocks 1, 2 (full) and 3 (2 tokens), in order, then PrefillDone. */
    for (uint32_t idx = 1; idx <= 3; idx++) {
        struct wire_frame fr;
        CU_ASSERT_FATAL(wire_frame_recv(pull, 0, &fr) == 0);
        CU_ASSERT_EQUAL(fr.env->kind, TANDEM__ENVELOPE__KIND__KV_FRAME);
        CU_ASSERT_EQUAL(fr.env->request_id, 500);
        const Tandem__KvFrameHeader *kh = fr.env->kv_frame;
        CU_ASSERT_EQUAL(kh->block_index, idx);
        CU_ASSERT_EQUAL(kh->token_count, idx < 3 ? 16u : 2u);
        CU_ASSERT_EQUAL(kh->block_hash, idx < 3 ? h[idx] : 0);
        CU_ASSERT_EQUAL(kh->dtype, TANDEM__KV_DTYPE__KV_DTYPE_F32);
        CU_ASSERT_EQUAL(kh->layer_count, 8);
        CU_ASSERT_EQUAL(fr.payload_len, BLOCK_BYTES);
        wire_frame_fini(&fr);
    }
    struct wire_frame fr;
    CU_ASSERT_FATAL(wire_frame_recv(pull, 0, &fr) == 0);
    CU_ASSERT_EQUAL_FATAL(fr.env->kind, TANDEM__ENVELOPE__KIND__PREFILL_DONE);
    CU_ASSERT_EQUAL(fr.env->prefill_done->blocks_sent, 3);
    CU_ASSERT_FATAL(fr.env->prefill_done->first_top_logprobs != NULL);
    CU_ASSERT_EQUAL(fr.env->prefill_done->first_top_logprobs->n_token_ids, 3);
    CU_ASSERT_EQUAL(fr.env->prefill_done->first_top_logprobs->token_ids[0],
                    fr.env->prefill_done->first_token);
    wire_frame_fini(&fr);

    /* Bad jobs: tokens outside the vocabulary, skip beyond the full blocks,
     * a duplicate live id: Errors back on the data link. */
    prompt[3] = 100000;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__PREFILL_JOB, 501, &pj);
    CU_ASSERT_EQUAL(wire_frame_send(push, &env, NULL, 0, 0), 0);
    CU_ASSERT_FATAL(wire_frame_recv(pull, 0, &fr) == 0);
    CU_ASSERT_EQUAL(fr.env->kind, TANDEM__ENVELOPE__KIND__ERROR);
    CU_ASSERT_EQUAL(fr.env->request_id, 501);
    CU_ASSERT_EQUAL(fr.env->error->code, TANDEM_EINVAL);
    wire_frame_fini(&fr);
    prompt[3] = 7;
    pj.skip_blocks = 4;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__PREFILL_JOB, 502, &pj);
    CU_ASSERT_EQUAL(wire_frame_send(push, &env, NULL, 0, 0), 0);
    CU_ASSERT_FATAL(wire_frame_recv(pull, 0, &fr) == 0);
    CU_ASSERT_EQUAL(fr.env->kind, TANDEM__ENVELOPE__KIND__ERROR);
    CU_ASSERT_EQUAL(fr.env->error->code, TANDEM_ERANGE);
    wire_frame_fini(&fr);

    /* A PrefillJob whose decode address is not a URL: refused, counted. */
    double before = rejected(&p, "data");
    pj.skip_blocks = 0;
    pj.decode_kv_address = "nope://x";
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__PREFILL_JOB, 503, &pj);
    CU_ASSERT_EQUAL(wire_frame_send(push, &env, NULL, 0, 0), 0);
    CU_ASSERT_EQUAL(wait_rejected(&p, "data", before + 1) - before, 1);

    double used = -1;
    CU_ASSERT_EQUAL(h_kv_invariant(&p, &used), 0);
    CU_ASSERT_EQUAL(used, 0);
    h_nng_close(pull);
    h_nng_close(push);
    EXPECT_EQ(h_stop(&p, SIGTERM, STOP_MS), 0);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("robust", NULL, NULL, NULL, teardown);
    CU_add_test(s, "series_from_start", test_series_from_start);
    CU_add_test(s, "control_link", test_control_link);
    CU_add_test(s, "data_link_and_http", test_data_link_and_http);
    CU_add_test(s, "bad_frames_to_decode", test_bad_frames_to_decode);
    CU_add_test(s, "prefill_protocol", test_prefill_protocol);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
