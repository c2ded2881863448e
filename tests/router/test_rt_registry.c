/* The router's registry (router/registry.h) on a real libuv loop, with fake
 * workers: PAIR0 sockets on inproc:// that the registry dials, driven by
 * hand (Hello, heartbeats, KV events, request messages, link loss), and an
 * announcement pushed to its PULL0 socket. Checks registration, refusal of a
 * mismatched model, load, the precise prefix index (and its reset on a
 * KvEvents.seq gap), health on missed heartbeats and on link loss, and what
 * reaches the dispatcher's callbacks. */
#include <CUnit/Basic.h>
#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>
#include <nng/protocol/pipeline0/push.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../integration/expect.h"
#include "auth.h"
#include "ctl.h"
#include "log.h"
#include "pipeline.h"
#include "registry.h"
#include "tandem_err.h"
#include "wire.h"

static const char *const yaml = "apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
                                "kind: EndpointPickerConfig\n"
                                "plugins:\n"
                                "- type: decode-filter\n"
                                "- type: prefix-cache-scorer\n"
                                "  parameters: {mode: precise, blockSize: 16}\n"
                                "schedulingProfiles:\n"
                                "- name: default\n"
                                "  plugins:\n"
                                "  - pluginRef: decode-filter\n"
                                "  - pluginRef: prefix-cache-scorer\n";

struct seen {
    int ups, downs, messages;
    int last_up, last_down, last_msg_ep;
    uint64_t last_msg_id;
    int last_msg_kind;
    int unsent, last_unsent_rc;
    uint64_t unsent_ids[256];
};

static uv_loop_t loop;
static struct rt_pipeline *pl;
static struct rt_registry reg;
static struct seen seen;
static int reg_closed;

static void on_message(void *arg, int ep, const Tandem__Envelope *env)
{
    struct seen *s = arg;
    s->messages++;
    s->last_msg_ep = ep;
    s->last_msg_id = env->request_id;
    s->last_msg_kind = env->kind;
}

static void on_down(void *arg, int ep)
{
    struct seen *s = arg;
    s->downs++;
    s->last_down = ep;
}

static void on_up(void *arg, int ep)
{
    struct seen *s = arg;
    s->ups++;
    s->last_up = ep;
}

static void on_unsent(void *arg, int ep, uint64_t id, int rc)
{
    struct seen *s = arg;
    (void)ep;
    if (s->unsent < 256) {
        s->unsent_ids[s->unsent] = id;
    }
    s->unsent++;
    s->last_unsent_rc = rc;
}

static void on_reg_closed(struct rt_registry *r)
{
    (void)r;
    reg_closed = 1;
}

/* Runs the loop until *flag changes from start or ms pass. */
static void run_until(const int *flag, int start, int ms)
{
    uint64_t end = uv_now(&loop) + (uint64_t)ms;
    while (*flag == start && uv_now(&loop) < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_sleep(1);
        uv_update_time(&loop);
    }
}

static void run_for(int ms)
{
    uint64_t end = uv_now(&loop) + (uint64_t)ms;
    while (uv_now(&loop) < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_sleep(1);
        uv_update_time(&loop);
    }
}

/* Runs the loop until the precise index predicts want cached tokens for
 * hashes (the KV event was applied), or 2 s pass; returns the prediction. */
static int predicted(const uint64_t *hashes);
static int run_until_predicted(const uint64_t *hashes, int want)
{
    uint64_t end = uv_now(&loop) + 2000;
    int p;
    while ((p = predicted(hashes)) != want && uv_now(&loop) < end) {
        run_for(2);
    }
    return p;
}

static int setup(void)
{
    log_init("test", LOG_LEVEL_ERROR);
    char err[RT_ERR_MAX];
    struct rt_pipeline_opts po = {.seed = 1};
    if (rt_pipeline_parse(&pl, yaml, "test.yaml", &po, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uv_loop_init(&loop);
    struct rt_registry_opts ro = {.model = "tiny",
                                  .block_size = 16,
                                  .vocab_size = 512,
                                  .heartbeat_timeout_ms = 300,
                                  .forget_ms = 60000};
    struct rt_registry_cbs cbs = {
        .on_message = on_message, .on_down = on_down, .on_up = on_up, .on_unsent = on_unsent};
    if (rt_registry_init(&reg, &loop, pl, &ro, &cbs, &seen) != 0) {
        return 1;
    }
    return rt_registry_listen(&reg, "inproc://announce") == 0 ? 0 : 1;
}

static int teardown(void)
{
    rt_registry_close(&reg, on_reg_closed);
    run_until(&reg_closed, 0, 2000);
    uv_loop_close(&loop);
    rt_pipeline_destroy(pl);
    return reg_closed ? 0 : 1;
}

/* ---- Fake workers ------------------------------------------------------- */

static nng_socket fake_listen(const char *url)
{
    nng_socket s;
    nng_pair0_open(&s);
    wire_socket_setup(s, WIRE_LINK_CONTROL);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 2000);
    nng_listen(s, url, NULL, 0);
    return s;
}

static void fill_hello(Tandem__WorkerHello *h, const char *id, const char *ctl, const char *model,
                       uint64_t incarnation)
{
    tandem__worker_hello__init(h);
    h->worker_id = (char *)id;
    h->role = TANDEM__WORKER_HELLO__ROLE__DECODE;
    h->control_address = (char *)ctl;
    h->kv_address = "inproc://kv";
    h->metrics_address = "127.0.0.1:1";
    h->model = (char *)model;
    h->block_size = 16;
    h->kv_dtype = TANDEM__KV_DTYPE__KV_DTYPE_F32;
    h->kv_blocks_total = 100;
    h->max_running_seqs = 8;
    h->max_context = 2048;
    h->vocab_size = 512;
    h->incarnation = incarnation;
}

static int send_hello(nng_socket s, const char *id, const char *ctl, const char *model,
                      uint64_t incarnation)
{
    Tandem__WorkerHello h;
    fill_hello(&h, id, ctl, model, incarnation);
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    return wire_send(s, &env, 0);
}

static int send_heartbeat(nng_socket s, const char *id, uint32_t waiting)
{
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.worker_id = (char *)id;
    hb.waiting = waiting;
    hb.running = 2;
    hb.kv_blocks_used = 25;
    hb.kv_blocks_total = 100;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HEARTBEAT, 0, &hb);
    return wire_send(s, &env, 0);
}

static int send_stored(nng_socket s, const char *id, uint64_t seq, uint64_t *hashes, int n)
{
    Tandem__KvEvent ev = TANDEM__KV_EVENT__INIT;
    ev.kind = TANDEM__KV_EVENT__KIND__STORED;
    ev.n_block_hashes = (size_t)n;
    ev.block_hashes = hashes;
    Tandem__KvEvent *evs[] = {&ev};
    Tandem__KvEvents ke = TANDEM__KV_EVENTS__INIT;
    ke.worker_id = (char *)id;
    ke.seq = seq;
    ke.n_events = 1;
    ke.events = evs;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__KV_EVENTS, 0, &ke);
    return wire_send(s, &env, 0);
}

/* Predicted cached tokens for a 4-block prompt with these hashes. */
static int predicted(const uint64_t *hashes)
{
    uint32_t tokens[65] = {0};
    struct rt_request rq = {.id = 1,
                            .tokens = tokens,
                            .n_tokens = 65,
                            .block_hashes = hashes,
                            .n_blocks = 4,
                            .max_tokens = 1};
    const struct rt_decision *d;
    if (rt_pipeline_decide(pl, &rq, &d) != 0) {
        return -2;
    }
    int p = d->predicted_cached_decode;
    struct rt_ticket t = d->ticket;
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    return p;
}

/* ---- Tests -------------------------------------------------------------- */

static const struct rt_link *link_of(const char *url)
{
    for (const struct rt_link *l = reg.links; l != NULL; l = l->next) {
        if (strcmp(l->addr, url) == 0) {
            return l;
        }
    }
    CU_FAIL_FATAL("no link to that address");
    return NULL;
}

/* A worker's link from Hello to restart on url: on NNG (inproc://) or on
 * uvsp (ipc://), which the registry picks by the address. */
static void lifecycle(const char *url, const char *id, int native)
{
    nng_socket w = fake_listen(url);
    memset(&seen, 0, sizeof(seen));
    int links = reg.n_links;
    EXPECT_EQ(rt_registry_dial(&reg, url, 1), 0);
    EXPECT_EQ(rt_registry_dial(&reg, url, 1), 0); /* no second link */
    EXPECT_EQ(reg.n_links, links + 1);
    /* Nothing is registered before Hello. */
    run_for(50);
    EXPECT_EQ(rt_pipeline_endpoint_find(pl, id), TANDEM_ENOENT);
    EXPECT_EQ(send_hello(w, id, url, "tiny", 1000), 0);
    run_until(&seen.ups, 0, 2000);
    int ep = rt_pipeline_endpoint_find(pl, id);
    CU_ASSERT_FATAL(ep >= 0);
    EXPECT_EQ(seen.last_up, ep);
    const struct rt_endpoint *e = rt_pipeline_endpoint(pl, ep);
    EXPECT_EQ(e->healthy, 1);
    EXPECT_EQ(e->role, RT_ROLE_DECODE);
    CU_ASSERT_STRING_EQUAL(e->data_addr, "inproc://kv");
    EXPECT_EQ(e->max_context, 2048);
    EXPECT_EQ(rt_registry_max_context(&reg), 2048);
    CU_ASSERT_FATAL(rt_registry_link(&reg, ep) != NULL);
    EXPECT_EQ(rt_registry_link(&reg, ep)->native, native);

    /* Load. */
    EXPECT_EQ(send_heartbeat(w, id, 7), 0);
    for (int i = 0; i < 200 && e->load.waiting != 7; i++) {
        run_for(2);
    }
    EXPECT_EQ(e->load.waiting, 7);
    EXPECT_EQ(e->load.kv_blocks_used, 25);

    /* KV events feed the precise index. */
    uint64_t hashes[4] = {11, 22, 33, 44};
    EXPECT_EQ(predicted(hashes), 0);
    EXPECT_EQ(send_stored(w, id, 5, hashes, 3), 0);
    EXPECT_EQ(run_until_predicted(hashes, 48), 48);
    /* seq 6 follows 5: applied. */
    EXPECT_EQ(send_stored(w, id, 6, hashes + 3, 1), 0);
    /* all 4 blocks; the 65th token is computed */
    EXPECT_EQ(run_until_predicted(hashes, 64), 64);
    /* A gap (8 after 6) resets the endpoint's index before applying. */
    uint64_t other = 99;
    EXPECT_EQ(send_stored(w, id, 8, &other, 1), 0);
    EXPECT_EQ(run_until_predicted(hashes, 0), 0);
    EXPECT_EQ(rt_registry_link(&reg, ep)->kv.gaps, 1);

    /* Request-scoped messages go to the dispatcher. */
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    Tandem__Busy b = TANDEM__BUSY__INIT;
    b.reason = TANDEM__BUSY__REASON__NO_KV_BLOCKS;
    b.detail = "full";
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__BUSY, 77, &b);
    EXPECT_EQ(wire_send(w, &env, 0), 0);
    run_until(&seen.messages, 0, 2000);
    EXPECT_EQ(seen.messages, 1);
    EXPECT_EQ(seen.last_msg_ep, ep);
    EXPECT_EQ(seen.last_msg_id, 77);
    EXPECT_EQ(seen.last_msg_kind, TANDEM__ENVELOPE__KIND__BUSY);
    /* And the registry can send to it. */
    nng_msg *msg;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__CANCEL, 78, &c);
    wire_pack_msg(&env, &msg);
    EXPECT_EQ(rt_registry_send(&reg, ep, msg), 0);
    Tandem__Envelope *got = NULL;
    nng_socket_set_ms(w, NNG_OPT_RECVTIMEO, 2000);
    EXPECT_EQ(wire_recv(w, 0, &got), 0);
    if (got != NULL) {
        EXPECT_EQ(got->request_id, 78);
        EXPECT_EQ(got->kind, TANDEM__ENVELOPE__KIND__CANCEL);
    }
    wire_free(got);

    /* No heartbeat for 300 ms: unhealthy, the dispatcher is told; the next
     * heartbeat brings it back. */
    int downs = seen.downs;
    run_until(&seen.downs, downs, 2000);
    EXPECT_EQ(seen.downs, downs + 1);
    EXPECT_EQ(seen.last_down, ep);
    EXPECT_EQ(e->healthy, 0);
    int ups = seen.ups;
    EXPECT_EQ(send_heartbeat(w, id, 0), 0);
    run_until(&seen.ups, ups, 2000);
    EXPECT_EQ(e->healthy, 1);

    /* The link drops: unhealthy at once. */
    downs = seen.downs;
    nng_close(w);
    run_until(&seen.downs, downs, 2000);
    EXPECT_EQ(seen.downs, downs + 1);
    EXPECT_EQ(e->healthy, 0);
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__CANCEL, 79, &c);
    wire_pack_msg(&env, &msg);
    EXPECT_EQ(rt_registry_send(&reg, ep, msg), TANDEM_ENOENT); /* consumed */
    EXPECT_EQ(rt_registry_max_context(&reg), 0);

    /* The worker restarts at the same address with a new incarnation: the
     * link redials, the endpoint is registered afresh (new slot generation,
     * empty index). */
    uint32_t gen = e->gen;
    w = fake_listen(url);
    ups = seen.ups;
    /* uvsp dials from the loop (NNG from its own threads): the worker's
     * blocking send below waits for a pipe. */
    const struct rt_link *l = link_of(url);
    for (uint64_t end = uv_now(&loop) + 3000; l->pipes == 0 && uv_now(&loop) < end;) {
        run_for(2);
    }
    EXPECT_EQ(l->pipes, 1);
    EXPECT_EQ(send_hello(w, id, url, "tiny", 2000), 0);
    run_until(&seen.ups, ups, 3000);
    ep = rt_pipeline_endpoint_find(pl, id);
    CU_ASSERT_FATAL(ep >= 0);
    e = rt_pipeline_endpoint(pl, ep);
    EXPECT_EQ(e->healthy, 1);
    CU_ASSERT(e->gen != gen);
    nng_close(w);
    run_for(50);
}

static void test_lifecycle(void)
{
    lifecycle("inproc://w1", "w-1", 0);
}

static void test_lifecycle_ipc(void)
{
    char url[128];
    snprintf(url, sizeof(url), "ipc:///tmp/tandem-test-registry-%ld.ipc", (long)getpid());
    lifecycle(url, "w-ipc", 1);
    unlink(url + 6);
}

/* A DecodeJob message for request id. */
static nng_msg *job_msg(uint64_t id)
{
    static const uint32_t prompt[3] = {5, 6, 7};
    struct ctl_job j;
    ctl_job_init(&j);
    j.prompt = prompt;
    j.n_prompt = 3;
    nng_msg *m = NULL;
    CU_ASSERT_FATAL(ctl_job_msg(id, &j, &m) == 0);
    return m;
}

static nng_msg *cancel_msg(uint64_t id)
{
    nng_msg *m = NULL;
    CU_ASSERT_FATAL(ctl_cancel_msg(id, &m) == 0);
    return m;
}

/* Registers a fake worker at url (control_batches as given); its endpoint. */
static int register_fake(nng_socket *w, const char *url, const char *id, int batches)
{
    *w = fake_listen(url);
    EXPECT_EQ(rt_registry_dial(&reg, url, 1), 0);
    Tandem__WorkerHello h;
    fill_hello(&h, id, url, "tiny", 1);
    h.control_batches = batches;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    int ups = seen.ups;
    EXPECT_EQ(wire_send(*w, &env, 0), 0);
    run_until(&seen.ups, ups, 2000);
    return rt_pipeline_endpoint_find(pl, id);
}

/* Every envelope the fake worker has received so far, batches taken apart:
 * (request id, kind) pairs into ids/kinds; returns how many, *msgs the NNG
 * messages they came in. */
static int drain(nng_socket w, uint64_t *ids, int *kinds, int cap, int *msgs)
{
    int n = 0;
    *msgs = 0;
    Tandem__Envelope *env = NULL;
    nng_socket_set_ms(w, NNG_OPT_RECVTIMEO, 100);
    while (wire_recv(w, 0, &env) == 0) {
        (*msgs)++;
        if (env->kind == TANDEM__ENVELOPE__KIND__BATCH) {
            for (size_t i = 0; i < env->batch->n_envelopes; i++) {
                Tandem__Envelope *item = NULL;
                CU_ASSERT_FATAL(wire_unpack_item(env, i, &item) == 0);
                if (n < cap) {
                    ids[n] = item->request_id;
                    kinds[n] = item->kind;
                }
                n++;
                wire_free(item);
            }
        } else {
            if (n < cap) {
                ids[n] = env->request_id;
                kinds[n] = env->kind;
            }
            n++;
        }
        wire_free(env);
    }
    return n;
}

/* To a worker that takes batches, the jobs and cancels of one loop turn leave
 * as one BATCH, in order; to one that does not, each alone. A batch NNG
 * cannot take is reported job by job, and no job is both delivered and
 * reported. */
static void test_batches(void)
{
    memset(&seen, 0, sizeof(seen));
    nng_socket wb, wp;
    int eb = register_fake(&wb, "inproc://wb", "w-batch", 1);
    int ep = register_fake(&wp, "inproc://wp", "w-plain", 0);
    CU_ASSERT_FATAL(eb >= 0 && ep >= 0);
    EXPECT_EQ(rt_registry_send_job(&reg, eb, 101, job_msg(101)), 0);
    EXPECT_EQ(rt_registry_send(&reg, eb, cancel_msg(100)), 0);
    EXPECT_EQ(rt_registry_send_job(&reg, eb, 102, job_msg(102)), 0);
    EXPECT_EQ(rt_registry_send_job(&reg, ep, 201, job_msg(201)), 0);
    EXPECT_EQ(rt_registry_send_job(&reg, ep, 202, job_msg(202)), 0);
    run_for(50);
    uint64_t ids[300];
    int kinds[300], msgs;
    EXPECT_EQ(drain(wb, ids, kinds, 300, &msgs), 3);
    EXPECT_EQ(msgs, 1);
    EXPECT_EQ(ids[0], 101);
    EXPECT_EQ(kinds[0], TANDEM__ENVELOPE__KIND__DECODE_JOB);
    EXPECT_EQ(ids[1], 100);
    EXPECT_EQ(kinds[1], TANDEM__ENVELOPE__KIND__CANCEL);
    EXPECT_EQ(ids[2], 102);
    EXPECT_EQ(drain(wp, ids, kinds, 300, &msgs), 2);
    EXPECT_EQ(msgs, 2);
    EXPECT_EQ(seen.unsent, 0);

    /* The batching worker stops reading: once NNG's buffers are full (one
     * message each way here), the turn's batch is refused and each job in it
     * reported. */
    CU_ASSERT_FATAL(nng_socket_set_int(rt_registry_link(&reg, eb)->u.sock, NNG_OPT_SENDBUF, 1) ==
                    0);
    CU_ASSERT_FATAL(nng_socket_set_int(wb, NNG_OPT_RECVBUF, 1) == 0);
    uint64_t next = 1000;
    for (int turn = 0; turn < 200 && seen.unsent == 0; turn++) {
        for (int k = 0; k < 2; k++, next++) {
            EXPECT_EQ(rt_registry_send_job(&reg, eb, next, job_msg(next)), 0);
        }
        run_for(2);
    }
    CU_ASSERT_FATAL(seen.unsent > 0);
    EXPECT_EQ(seen.last_unsent_rc, TANDEM_ETIMEOUT);
    EXPECT_EQ(seen.unsent % 2, 0); /* a whole turn's batch */
    int n = drain(wb, ids, kinds, 300, &msgs);
    printf("\n  %llu jobs: %d delivered in %d messages, %d reported unsent\n",
           (unsigned long long)(next - 1000), n, msgs, seen.unsent);
    /* Delivered and unsent: every job once. */
    EXPECT_EQ(n + seen.unsent, (int)(next - 1000));
    for (int i = 0; i < n && i < 300; i++) {
        EXPECT_EQ(ids[i], 1000 + (uint64_t)i);
    }
    for (int i = 0; i < seen.unsent && i < 256; i++) {
        EXPECT_EQ(seen.unsent_ids[i], 1000 + (uint64_t)(n + i));
    }
    nng_close(wb);
    nng_close(wp);
    run_for(50);
}

/* With a cluster secret, on a uvsp link (ipc://, where dropping a pipe is
 * immediate): a worker's BATCH whose first Hello is refused (wrong proof)
 * ends there. The refusal drops the pipe, so a second Hello in the same
 * batch, even with the right proof, must not register the worker on the
 * closed pipe. */
static void reg2_closed(struct rt_registry *r)
{
    (void)r;
    reg_closed++;
}

static void test_refused_hello_ends_batch(void)
{
    struct auth_key key;
    auth_key_init(&key, "0123456789abcdef0123456789abcdef", 32);
    struct rt_registry reg2;
    struct rt_registry_opts ro = {.model = "tiny",
                                  .block_size = 16,
                                  .vocab_size = 512,
                                  .heartbeat_timeout_ms = 60000,
                                  .forget_ms = 60000,
                                  .secret = &key};
    struct rt_registry_cbs cbs = {
        .on_message = on_message, .on_down = on_down, .on_up = on_up, .on_unsent = on_unsent};
    CU_ASSERT_FATAL(rt_registry_init(&reg2, &loop, pl, &ro, &cbs, &seen) == 0);
    char url[128];
    snprintf(url, sizeof(url), "ipc:///tmp/tandem-test-registry-auth-%ld.ipc", (long)getpid());
    nng_socket w = fake_listen(url);
    nng_socket_set_ms(w, NNG_OPT_RECVTIMEO, 5);
    EXPECT_EQ(rt_registry_dial(&reg2, url, 1), 0);
    /* The router's challenge. */
    Tandem__Envelope *env = NULL;
    for (uint64_t end = uv_now(&loop) + 3000; env == NULL && uv_now(&loop) < end;) {
        run_for(5);
        if (wire_recv(w, 0, &env) != 0) {
            env = NULL;
        }
    }
    CU_ASSERT_FATAL(env != NULL && env->kind == TANDEM__ENVELOPE__KIND__AUTH &&
                    env->auth->nonce.len == AUTH_NONCE_BYTES);
    uint8_t nonce[AUTH_NONCE_BYTES], bad[AUTH_TAG_BYTES] = {0}, good[AUTH_TAG_BYTES];
    memcpy(nonce, env->auth->nonce.data, sizeof(nonce));
    wire_free(env);
    auth_hello_proof(&key, nonce, sizeof(nonce), "w-auth", 1, good);

    Tandem__WorkerHello h;
    Tandem__Envelope env_hello;
    fill_hello(&h, "w-auth", url, "tiny", 1);
    h.auth_proof.len = AUTH_TAG_BYTES;
    nng_msg *items[2], *batch;
    h.auth_proof.data = bad;
    wire_env_init(&env_hello, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    CU_ASSERT_FATAL(wire_pack_msg(&env_hello, &items[0]) == 0);
    h.auth_proof.data = good;
    CU_ASSERT_FATAL(wire_pack_msg(&env_hello, &items[1]) == 0);
    CU_ASSERT_FATAL(wire_batch_pack_msg(items, 2, &batch) == 0);
    nng_msg_free(items[0]);
    nng_msg_free(items[1]);
    uint64_t refused = reg2.n_auth_failures;
    EXPECT_EQ(nng_sendmsg(w, batch, 0), 0);
    for (uint64_t end = uv_now(&loop) + 3000;
         reg2.n_auth_failures == refused && uv_now(&loop) < end;) {
        run_for(5);
    }
    run_for(100);
    EXPECT_EQ(reg2.n_auth_failures, refused + 1);
    EXPECT_EQ(rt_pipeline_endpoint_find(pl, "w-auth"), TANDEM_ENOENT);

    int closed = reg_closed;
    rt_registry_close(&reg2, reg2_closed);
    run_until(&reg_closed, closed, 2000);
    EXPECT_EQ(reg_closed, closed + 1);
    nng_close(w);
    unlink(url + 6);
    auth_key_wipe(&key);
}

/* Last: the registry closes with a turn's Cancel queued for a batching
 * worker (a router that stops ends its requests): it still leaves. The
 * router leaves its sockets open at exit (uvnng_set_exiting), so does this. */
static void test_close_sends_queued(void)
{
    memset(&seen, 0, sizeof(seen));
    nng_socket w;
    int ep = register_fake(&w, "inproc://wclose", "w-close", 1);
    CU_ASSERT_FATAL(ep >= 0);
    EXPECT_EQ(rt_registry_send(&reg, ep, cancel_msg(300)), 0);
    EXPECT_EQ(rt_registry_send(&reg, ep, cancel_msg(301)), 0);
    uvnng_set_exiting();
    rt_registry_close(&reg, on_reg_closed);
    uint64_t ids[4];
    int kinds[4], msgs;
    EXPECT_EQ(drain(w, ids, kinds, 4, &msgs), 2);
    EXPECT_EQ(msgs, 1);
    EXPECT_EQ(ids[0], 300);
    EXPECT_EQ(ids[1], 301);
    EXPECT_EQ(kinds[1], TANDEM__ENVELOPE__KIND__CANCEL);
    EXPECT_EQ(seen.unsent, 0);
    run_until(&reg_closed, 0, 2000);
    EXPECT_EQ(reg_closed, 1);
    nng_close(w);
}

static void test_refused_model(void)
{
    nng_socket w = fake_listen("inproc://w-other");
    uint64_t refused = reg.n_refused;
    EXPECT_EQ(rt_registry_dial(&reg, "inproc://w-other", 0), 0);
    EXPECT_EQ(send_hello(w, "w-other", "inproc://w-other", "llama-3-8b", 1), 0);
    for (int i = 0; i < 500 && reg.n_refused == refused; i++) {
        run_for(2);
    }
    EXPECT_EQ(reg.n_refused, refused + 1);
    EXPECT_EQ(rt_pipeline_endpoint_find(pl, "w-other"), TANDEM_ENOENT);
    /* The reason is kept for GET /v1/cluster "refusals" (tandem up reads it). */
    const struct rt_link *l = reg.links;
    while (l != NULL && strcmp(l->addr, "inproc://w-other") != 0) {
        l = l->next;
    }
    CU_ASSERT_FATAL(l != NULL);
    EXPECT_STR(l->refusal.worker_id, "w-other");
    EXPECT_STR(l->refusal.control_addr, "inproc://w-other");
    EXPECT_STR(l->refusal.why, "it serves model 'llama-3-8b', the router 'tiny' (--model)");
    EXPECT_EQ(l->refusal.count, 1);
    nng_close(w);
}

/* A worker of the router's model name with another vocabulary (a checkpoint
 * that says "tiny" but has 32000 ids) is refused with both sizes; an older
 * worker that does not say its vocabulary (0) is not checked. */
static void test_refused_vocab(void)
{
    nng_socket w = fake_listen("inproc://w-vocab");
    uint64_t refused = reg.n_refused;
    EXPECT_EQ(rt_registry_dial(&reg, "inproc://w-vocab", 0), 0);
    Tandem__WorkerHello h;
    fill_hello(&h, "w-vocab", "inproc://w-vocab", "tiny", 1);
    h.vocab_size = 32000;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    EXPECT_EQ(wire_send(w, &env, 0), 0);
    for (int i = 0; i < 500 && reg.n_refused == refused; i++) {
        run_for(2);
    }
    EXPECT_EQ(reg.n_refused, refused + 1);
    EXPECT_EQ(rt_pipeline_endpoint_find(pl, "w-vocab"), TANDEM_ENOENT);
    const struct rt_link *l = reg.links;
    while (l != NULL && strcmp(l->addr, "inproc://w-vocab") != 0) {
        l = l->next;
    }
    CU_ASSERT_FATAL(l != NULL);
    EXPECT_STR(l->refusal.why, "its vocabulary has 32000 tokens, the router's tokenizer 512 "
                               "(--tokenizer, or the model preset's)");
    nng_close(w);

    nng_socket old = fake_listen("inproc://w-novocab");
    EXPECT_EQ(rt_registry_dial(&reg, "inproc://w-novocab", 0), 0);
    fill_hello(&h, "w-novocab", "inproc://w-novocab", "tiny", 1);
    h.vocab_size = 0;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    EXPECT_EQ(wire_send(old, &env, 0), 0);
    for (int i = 0; i < 500 && rt_pipeline_endpoint_find(pl, "w-novocab") < 0; i++) {
        run_for(2);
    }
    CU_ASSERT(rt_pipeline_endpoint_find(pl, "w-novocab") >= 0);
    EXPECT_EQ(reg.n_refused, refused + 1);
    nng_close(old);
}

/* An announcement in another protocol version: never dialed, its reason
 * kept without a worker id or address (nothing of it could be read). */
static void test_refused_announcement(void)
{
    nng_socket push;
    nng_push0_open(&push);
    nng_dial(push, "inproc://announce", NULL, 0);
    Tandem__WorkerHello h;
    fill_hello(&h, "w-9", "inproc://w9", "tiny", 1);
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    uint8_t buf[4096];
    size_t len = 0;
    EXPECT_EQ(wire_pack(&env, buf, sizeof(buf), &len), 0);
    CU_ASSERT_FATAL(len > 2 && buf[0] == 0x08 && buf[1] == WIRE_VERSION);
    buf[1] = WIRE_VERSION + 1; /* field 1 (version) is packed first */
    uint64_t rejected = reg.n_rejected_msgs;
    int links = reg.n_links;
    EXPECT_EQ(nng_send(push, buf, len, 0), 0);
    for (int i = 0; i < 500 && reg.n_rejected_msgs == rejected; i++) {
        run_for(2);
    }
    EXPECT_EQ(reg.n_rejected_msgs, rejected + 1);
    EXPECT_EQ(reg.n_links, links);
    const struct rt_refusal *f = NULL;
    for (int i = 0; i < RT_REFUSED_ANNOUNCES; i++) {
        f = reg.refused_announces[i].why[0] != '\0' ? &reg.refused_announces[i] : f;
    }
    CU_ASSERT_FATAL(f != NULL);
    EXPECT_STR(f->worker_id, "");
    EXPECT_STR(f->control_addr, "");
    EXPECT_STR(f->why, "an announcement the router cannot read: version 2, this build speaks 1");
    nng_close(push);
}

static void test_announce(void)
{
    nng_socket w = fake_listen("inproc://w2");
    nng_socket push;
    nng_push0_open(&push);
    nng_dial(push, "inproc://announce", NULL, 0);
    Tandem__WorkerHello h;
    fill_hello(&h, "w-2", "inproc://w2", "tiny", 1);
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    int links = reg.n_links;
    EXPECT_EQ(wire_send(push, &env, 0), 0);
    for (int i = 0; i < 500 && reg.n_links == links; i++) {
        run_for(2);
    }
    EXPECT_EQ(reg.n_links, links + 1);
    EXPECT_EQ(reg.n_announces, 1);
    /* A second announcement of a known address dials nothing new. */
    EXPECT_EQ(wire_send(push, &env, 0), 0);
    for (int i = 0; i < 1000 && reg.n_announces < 2; i++) {
        run_for(2);
    }
    EXPECT_EQ(reg.n_announces, 2); /* it was read, and */
    EXPECT_EQ(reg.n_links, links + 1);
    int ups = seen.ups;
    EXPECT_EQ(send_hello(w, "w-2", "inproc://w2", "tiny", 1), 0);
    run_until(&seen.ups, ups, 2000);
    CU_ASSERT(rt_pipeline_endpoint_find(pl, "w-2") >= 0);
    int healthy, registered;
    rt_registry_counts(&reg, &healthy, &registered);
    EXPECT_EQ(healthy, 1);
    EXPECT_EQ(registered, 2); /* w-1 (down) and w-2 */
    nng_close(push);
    nng_close(w);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("rt_registry", setup, teardown);
    CU_add_test(s, "lifecycle", test_lifecycle);
    CU_add_test(s, "refused_model", test_refused_model);
    CU_add_test(s, "announce", test_announce);
    CU_add_test(s, "refused_announcement", test_refused_announcement);
    CU_add_test(s, "batches", test_batches);
    CU_add_test(s, "refused_vocab", test_refused_vocab); /* leaves an endpoint */
    CU_add_test(s, "lifecycle_ipc", test_lifecycle_ipc); /* leaves an endpoint */
    CU_add_test(s, "refused_hello_ends_batch", test_refused_hello_ends_batch);
    CU_add_test(s, "close_sends_queued", test_close_sends_queued); /* last: closes */
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed != 0;
}
