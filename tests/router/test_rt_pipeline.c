/* Scheduling pipeline: every plugin with hand-made endpoint states and exact
 * scores, pickers with a fixed seed, profile handlers and deciders in
 * constructed cases, in-flight accounting against herding, decision records. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../integration/expect.h"
#include "block_hash.h"
#include "pipeline.h"
#include "tandem_err.h"
#include "pl_fixture.h"

#define HDR  "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
#define SEED 12345
#define EPS  1e-12

/* Exact draws of the seeded random source (SEED), recorded from a run. */
#define GOLDEN_MAX_SCORE 2, 0, 2, 0, 1, 0, 0, 0, 1, 2, 2, 1
#define GOLDEN_TIES      941, 998, 1061
#define GOLDEN_RANDOM    1579, 1675, 1746
#define GOLDEN_WEIGHTED  3953, 1047, 0

#define ASSERT_NEAR(a, b) CU_ASSERT(fabs((double)(a) - (double)(b)) < EPS)

static struct rt_pipeline *mk_seeded(const char *yaml, uint64_t seed)
{
    char err[RT_ERR_MAX];
    struct rt_pipeline *pl = NULL;
    struct rt_pipeline_opts o = {.max_endpoints = 16, .seed = seed};
    int rc = rt_pipeline_parse(&pl, yaml, "test.yaml", &o, err, sizeof(err));
    if (rc)
        printf("\n  config error: %s\n", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return pl;
}

static struct rt_pipeline *mk(const char *yaml)
{
    return mk_seeded(yaml, SEED);
}

static void set_load(struct rt_pipeline *pl, int ep, uint32_t waiting, uint32_t running,
                     uint32_t used, uint32_t total, uint64_t queued)
{
    struct rt_load l = {.waiting = waiting,
                        .running = running,
                        .kv_blocks_used = used,
                        .kv_blocks_total = total,
                        .prefill_tokens_queued = queued};
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_set_load(pl, ep, &l), 0);
}

struct req {
    uint32_t tok[2048];
    uint64_t hash[128];
    struct rt_request r;
};

/* Prompt of n tokens: ids seed*10000 + i, hashed at the pipeline's block size. */
static struct rt_request *mk_req(struct req *b, struct rt_pipeline *pl, int n, uint32_t seed,
                                 uint32_t max_tokens)
{
    for (int i = 0; i < n; i++)
        b->tok[i] = seed * 10000u + (uint32_t)i;
    int bs = rt_pipeline_block_size(pl);
    int nb = bh_hash_prompt(bh_root("tiny"), b->tok, n, bs, b->hash);
    CU_ASSERT_FATAL(nb >= 0);
    b->r = (struct rt_request){.id = seed,
                               .tokens = b->tok,
                               .n_tokens = n,
                               .block_hashes = b->hash,
                               .n_blocks = nb,
                               .max_tokens = max_tokens};
    return &b->r;
}

static const struct rt_decision *decide(struct rt_pipeline *pl, const struct rt_request *r)
{
    const struct rt_decision *d = NULL;
    int rc = rt_pipeline_decide(pl, r, &d);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return d;
}

/* Raw score of scorer s for endpoint ep in run 0 (or the given run). */
static double raw(const struct rt_decision *d, int run, int ep, int s)
{
    const struct rt_profile_run *r = &d->runs[run];
    int i = rt_run_find(r, ep);
    CU_ASSERT_FATAL(i >= 0);
    return rt_run_raw(r, i, s);
}

/* ---- filters ---- */

static void test_filters(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: decode-filter\n- type: prefill-filter\n"
                                    "- type: always-disagg-pd-decider\n- type: pd-profile-handler\n"
                                    "schedulingProfiles:\n"
                                    "- name: decode\n  plugins:\n  - pluginRef: decode-filter\n"
                                    "- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n");
    int p0 = add_ep(pl, "p0", RT_ROLE_PREFILL);
    int d1 = add_ep(pl, "d1", RT_ROLE_DECODE);
    int c2 = add_ep(pl, "c2", RT_ROLE_COLOCATED);
    int p3 = add_ep(pl, "p3", RT_ROLE_PREFILL);
    struct req b;
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, 32, 1, 8));
    CU_ASSERT_EQUAL(d->n_runs, 2);
    CU_ASSERT_EQUAL(d->runs[0].n_candidates, 2);
    CU_ASSERT_EQUAL(d->runs[0].candidates[0], d1);
    CU_ASSERT_EQUAL(d->runs[0].candidates[1], c2);
    CU_ASSERT_EQUAL(d->runs[1].n_candidates, 2);
    CU_ASSERT_EQUAL(d->runs[1].candidates[0], p0);
    CU_ASSERT_EQUAL(d->runs[1].candidates[1], p3);
    /* Unhealthy endpoints are never candidates. */
    rt_pipeline_endpoint_set_healthy(pl, c2, 0);
    rt_pipeline_endpoint_set_healthy(pl, p0, 0);
    d = decide(pl, mk_req(&b, pl, 32, 2, 8));
    CU_ASSERT_EQUAL(d->runs[0].n_candidates, 1);
    CU_ASSERT_EQUAL(d->decode, d1);
    CU_ASSERT_EQUAL(d->runs[1].n_candidates, 1);
    CU_ASSERT_EQUAL(d->prefill, p3);
    rt_pipeline_destroy(pl);
}

/* ---- load scorers ---- */

static void test_queue_scorer(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n"
                                    "- name: default\n  plugins:\n  - pluginRef: queue-scorer\n");
    int e0 = add_ep(pl, "e0", RT_ROLE_DECODE), e1 = add_ep(pl, "e1", RT_ROLE_DECODE),
        e2 = add_ep(pl, "e2", RT_ROLE_DECODE);
    set_load(pl, e0, 10, 0, 0, 0, 0);
    set_load(pl, e1, 5, 0, 0, 0, 0);
    set_load(pl, e2, 0, 0, 0, 0, 0);
    struct req b;
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, 16, 1, 1));
    ASSERT_NEAR(raw(d, 0, e0, 0), 0.0);
    ASSERT_NEAR(raw(d, 0, e1, 0), 0.5);
    ASSERT_NEAR(raw(d, 0, e2, 0), 1.0);
    CU_ASSERT_EQUAL(d->decode, e2);
    /* min-max normalisation over candidates: 4, 7, 10 give 1, 0.5, 0. */
    set_load(pl, e0, 4, 0, 0, 0, 0);
    set_load(pl, e1, 7, 0, 0, 0, 0);
    set_load(pl, e2, 10, 0, 0, 0, 0);
    d = decide(pl, mk_req(&b, pl, 16, 2, 1));
    ASSERT_NEAR(raw(d, 0, e0, 0), 1.0);
    ASSERT_NEAR(raw(d, 0, e1, 0), 0.5);
    ASSERT_NEAR(raw(d, 0, e2, 0), 0.0);
    /* All equal: all 1. */
    for (int e = 0; e < 3; e++)
        set_load(pl, e, 3, 0, 0, 0, 0);
    d = decide(pl, mk_req(&b, pl, 16, 3, 1));
    for (int e = 0; e < 3; e++)
        ASSERT_NEAR(raw(d, 0, e, 0), 1.0);
    rt_pipeline_destroy(pl);
}

static void test_kv_cache_utilization_scorer(void)
{
    struct rt_pipeline *pl =
        mk(HDR "plugins:\n- type: kv-cache-utilization-scorer\nschedulingProfiles:\n"
               "- name: default\n  plugins:\n  - pluginRef: kv-cache-utilization-scorer\n");
    int e[4];
    const char *ids[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        e[i] = add_ep(pl, ids[i], RT_ROLE_COLOCATED);
    set_load(pl, e[0], 0, 0, 0, 100, 0);
    set_load(pl, e[1], 0, 0, 25, 100, 0);
    set_load(pl, e[2], 0, 0, 100, 100, 0);
    /* e[3]: no heartbeat yet (total 0): usage 0, score 1 */
    struct req b;
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, 16, 1, 1));
    ASSERT_NEAR(raw(d, 0, e[0], 0), 1.0);
    ASSERT_NEAR(raw(d, 0, e[1], 0), 0.75);
    ASSERT_NEAR(raw(d, 0, e[2], 0), 0.0);
    ASSERT_NEAR(raw(d, 0, e[3], 0), 1.0);
    rt_pipeline_destroy(pl);
}

static void test_load_aware_scorer(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: load-aware-scorer\n  name: t10\n"
                                    "  parameters:\n    threshold: 10\n"
                                    "- type: load-aware-scorer\nschedulingProfiles:\n"
                                    "- name: default\n  plugins:\n  - pluginRef: t10\n"
                                    "  - pluginRef: load-aware-scorer\n");
    uint32_t waiting[] = {0, 5, 10, 20, 64};
    const char *ids[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < 5; i++)
        set_load(pl, add_ep(pl, ids[i], RT_ROLE_DECODE), waiting[i], 0, 0, 0, 0);
    struct req b;
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, 16, 1, 1));
    double want10[] = {0.5, 0.25, 0.0, 0.0, 0.0};
    double want128[] = {0.5, 0.5 * (1 - 5.0 / 128), 0.5 * (1 - 10.0 / 128), 0.5 * (1 - 20.0 / 128),
                        0.25};
    for (int i = 0; i < 5; i++) {
        ASSERT_NEAR(raw(d, 0, i, 0), want10[i]);
        ASSERT_NEAR(raw(d, 0, i, 1), want128[i]);
    }
    rt_pipeline_destroy(pl);
}

static void test_active_request_scorer(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: active-request-scorer\n"
                                    "- type: active-request-scorer\n  name: idle1\n"
                                    "  parameters: {idleThreshold: 1}\n"
                                    "- type: active-request-scorer\n  name: busy-half\n"
                                    "  parameters: {maxBusyScore: 0.5}\n"
                                    "- type: active-request-scorer\n  name: tokens\n"
                                    "  parameters: {tokenWeight: 0.5}\n"
                                    "- type: round-robin-picker\n"
                                    "schedulingProfiles:\n- name: default\n  plugins:\n"
                                    "  - pluginRef: active-request-scorer\n"
                                    "  - pluginRef: idle1\n  - pluginRef: busy-half\n"
                                    "  - pluginRef: tokens\n  - pluginRef: round-robin-picker\n");
    int e0 = add_ep(pl, "e0", RT_ROLE_DECODE), e1 = add_ep(pl, "e1", RT_ROLE_DECODE),
        e2 = add_ep(pl, "e2", RT_ROLE_DECODE);
    struct req b;
    struct rt_ticket t[4];
    /* Round robin: e0, e1, e2, e0. The last request is bigger. */
    for (int i = 0; i < 4; i++) {
        const struct rt_decision *d =
            decide(pl, mk_req(&b, pl, 16, (uint32_t)i + 1, i == 3 ? 48 : 16));
        CU_ASSERT_EQUAL(d->decode, i % 3);
        if (i == 0) /* nothing in flight: every scorer gives 1 */
            for (int s = 0; s < 4; s++)
                ASSERT_NEAR(raw(d, 0, e1, s), 1.0);
        t[i] = d->ticket;
    }
    const struct rt_endpoint *ep0 = rt_pipeline_endpoint(pl, e0);
    CU_ASSERT_EQUAL(ep0->inflight_requests, 2);
    CU_ASSERT_EQUAL(ep0->inflight_tokens, 32 + 64);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e1)->inflight_tokens, 32);
    /* Counts 2, 1, 1; tokens 96, 32, 32. */
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, 16, 9, 16));
    ASSERT_NEAR(raw(d, 0, e0, 0), 0.0);
    ASSERT_NEAR(raw(d, 0, e1, 0), 0.5);
    ASSERT_NEAR(raw(d, 0, e2, 0), 0.5);
    ASSERT_NEAR(raw(d, 0, e0, 1), 0.0);  /* 2 > idleThreshold 1 */
    ASSERT_NEAR(raw(d, 0, e1, 1), 1.0);  /* 1 <= 1: idle */
    ASSERT_NEAR(raw(d, 0, e1, 2), 0.25); /* (2-1)/2 x 0.5 */
    ASSERT_NEAR(raw(d, 0, e0, 3), 0.0);
    ASSERT_NEAR(raw(d, 0, e1, 3), 0.5 * 0.5 + 0.5 * (64.0 / 96.0));
    struct rt_ticket t5 = d->ticket; /* went to e1 (round robin) */
    CU_ASSERT_EQUAL(t5.decode, e1);
    /* Release: e0's big request ends; e1's last one too. Counts 1, 1, 1. */
    rt_pipeline_release(pl, &t[3], RT_RELEASE_ALL);
    rt_pipeline_release(pl, &t[3], RT_RELEASE_ALL); /* idempotent */
    rt_pipeline_release(pl, &t5, RT_RELEASE_ALL);
    CU_ASSERT_EQUAL(ep0->inflight_requests, 1);
    CU_ASSERT_EQUAL(ep0->inflight_tokens, 32);
    d = decide(pl, mk_req(&b, pl, 16, 10, 16));
    for (int e = 0; e < 3; e++) {
        ASSERT_NEAR(raw(d, 0, e, 0), 0.0); /* equally busy: (1-1)/1 */
        ASSERT_NEAR(raw(d, 0, e, 1), 1.0);
    }
    struct rt_ticket t6 = d->ticket;
    for (int i = 0; i < 3; i++)
        rt_pipeline_release(pl, &t[i], RT_RELEASE_ALL);
    rt_pipeline_release(pl, &t6, RT_RELEASE_ALL);
    for (int e = 0; e < 3; e++) {
        CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e)->inflight_requests, 0);
        CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e)->inflight_tokens, 0);
        CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e)->inflight_prefill_tokens, 0);
    }
    rt_pipeline_destroy(pl);
}

/* ---- session affinity, random ---- */

static void test_session_affinity_scorer(void)
{
    struct rt_pipeline *pl =
        mk(HDR "plugins:\n- type: session-affinity-scorer\nschedulingProfiles:\n"
               "- name: default\n  plugins:\n  - pluginRef: session-affinity-scorer\n");
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof(id), "e%d", i);
        add_ep(pl, id, RT_ROLE_DECODE);
    }
    struct req b;
    struct rt_request *r = mk_req(&b, pl, 16, 1, 1);
    r->session = "alice";
    r->session_len = 5;
    const struct rt_decision *d = decide(pl, r);
    for (int e = 0; e < 4; e++)
        ASSERT_NEAR(raw(d, 0, e, 0), 0.0);
    int first = d->decode;
    for (int k = 0; k < 5; k++) {
        d = decide(pl, r);
        CU_ASSERT_EQUAL(d->decode, first);
        for (int e = 0; e < 4; e++)
            ASSERT_NEAR(raw(d, 0, e, 0), e == first ? 1.0 : 0.0);
    }
    /* Another session, or none, has no affinity. */
    r->session = "bob";
    r->session_len = 3;
    d = decide(pl, r);
    for (int e = 0; e < 4; e++)
        ASSERT_NEAR(raw(d, 0, e, 0), 0.0);
    r->session = NULL;
    r->session_len = 0;
    d = decide(pl, r);
    for (int e = 0; e < 4; e++)
        ASSERT_NEAR(raw(d, 0, e, 0), 0.0);
    /* The endpoint leaves and a new one takes its slot: no stale affinity. */
    char id[RT_ID_MAX];
    snprintf(id, sizeof(id), "%s", rt_pipeline_endpoint(pl, first)->id);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_remove(pl, first), 0);
    CU_ASSERT_EQUAL(add_ep(pl, "newcomer", RT_ROLE_DECODE), first);
    r->session = "alice";
    r->session_len = 5;
    d = decide(pl, r);
    for (int e = 0; e < 4; e++)
        ASSERT_NEAR(raw(d, 0, e, 0), 0.0);
    rt_pipeline_destroy(pl);
}

static void test_random_scorer(void)
{
    const char *yaml = HDR "plugins:\n- type: random-scorer\nschedulingProfiles:\n"
                           "- name: default\n  plugins:\n  - pluginRef: random-scorer\n";
    struct rt_pipeline *a = mk_seeded(yaml, 7), *b = mk_seeded(yaml, 7), *c = mk_seeded(yaml, 8);
    for (int i = 0; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof(id), "e%d", i);
        add_ep(a, id, RT_ROLE_DECODE);
        add_ep(b, id, RT_ROLE_DECODE);
        add_ep(c, id, RT_ROLE_DECODE);
    }
    struct req rb;
    int differs = 0;
    for (int k = 0; k < 20; k++) {
        const struct rt_decision *da = decide(a, mk_req(&rb, a, 16, 1, 1));
        double va[5];
        for (int e = 0; e < 5; e++) {
            va[e] = raw(da, 0, e, 0);
            CU_ASSERT(va[e] >= 0 && va[e] < 1);
        }
        int pa = da->decode;
        const struct rt_decision *db = decide(b, &rb.r);
        for (int e = 0; e < 5; e++)
            CU_ASSERT_EQUAL(raw(db, 0, e, 0), va[e]);
        CU_ASSERT_EQUAL(db->decode, pa);
        const struct rt_decision *dc = decide(c, &rb.r);
        differs += raw(dc, 0, 0, 0) != va[0];
    }
    CU_ASSERT(differs > 15);
    rt_pipeline_destroy(a);
    rt_pipeline_destroy(b);
    rt_pipeline_destroy(c);
}

/* ---- prefix cache scorer ---- */

static void test_prefix_approx(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: prefix-cache-scorer\n"
                                    "  parameters: {mode: approx, blockSize: 16}\n"
                                    "- type: prefix-cache-scorer\n  name: first2\n"
                                    "  parameters: {maxPrefixBlocksToMatch: 2}\n"
                                    "schedulingProfiles:\n- name: default\n  plugins:\n"
                                    "  - pluginRef: prefix-cache-scorer\n  - pluginRef: first2\n"
                                    "    weight: 0\n");
    CU_ASSERT_EQUAL(rt_pipeline_block_size(pl), 16);
    CU_ASSERT_TRUE(rt_pipeline_uses_hashes(pl));
    int e0 = add_ep(pl, "e0", RT_ROLE_DECODE), e1 = add_ep(pl, "e1", RT_ROLE_DECODE);
    struct req a;
    mk_req(&a, pl, 64, 1, 8); /* 4 blocks */
    const struct rt_decision *d = decide(pl, &a.r);
    ASSERT_NEAR(raw(d, 0, e0, 0), 0.0);
    ASSERT_NEAR(raw(d, 0, e1, 0), 0.0);
    CU_ASSERT_EQUAL(d->predicted_cached_decode, 0);
    int x = d->decode, y = x == e0 ? e1 : e0;
    /* The decision taught the index: X now holds all four blocks. */
    d = decide(pl, &a.r);
    ASSERT_NEAR(raw(d, 0, x, 0), 1.0);
    ASSERT_NEAR(raw(d, 0, y, 0), 0.0);
    ASSERT_NEAR(raw(d, 0, x, 1), 1.0); /* 2 of the first 2 */
    CU_ASSERT_EQUAL(d->decode, x);
    /* 4 blocks held, but the worker computes at least one token: 3 x 16. */
    CU_ASSERT_EQUAL(d->predicted_cached_decode, 48);
    /* One more token: all 4 blocks usable. */
    struct req a1;
    mk_req(&a1, pl, 65, 1, 8);
    d = decide(pl, &a1.r);
    ASSERT_NEAR(raw(d, 0, x, 0), 1.0);
    CU_ASSERT_EQUAL(d->predicted_cached_decode, 64);
    /* Shares the first 2 of 4 blocks. */
    struct req h;
    mk_req(&h, pl, 64, 1, 8);
    for (int i = 32; i < 64; i++)
        h.tok[i] += 5000;
    h.r.n_blocks = bh_hash_prompt(bh_root("tiny"), h.tok, 64, 16, h.hash);
    d = decide(pl, &h.r);
    ASSERT_NEAR(raw(d, 0, x, 0), 0.5);
    ASSERT_NEAR(raw(d, 0, x, 1), 1.0);
    ASSERT_NEAR(raw(d, 0, y, 0), 0.0);
    /* Fewer than one block: no hash, score 0 and no division by zero. */
    struct req s;
    d = decide(pl, mk_req(&s, pl, 10, 1, 8));
    ASSERT_NEAR(raw(d, 0, x, 0), 0.0);
    CU_ASSERT_EQUAL(d->predicted_cached_decode, 0);
    /* Removing an endpoint forgets what it held. */
    rt_pipeline_endpoint_reset_cache(pl, x);
    d = decide(pl, &a.r);
    ASSERT_NEAR(raw(d, 0, x, 0), 0.0);
    rt_pipeline_destroy(pl);
}

static void test_prefix_precise(void)
{
    struct rt_pipeline *pl =
        mk(HDR "plugins:\n- type: prefix-cache-scorer\n  parameters: {mode: precise}\n"
               "- type: precise-prefix-cache-scorer\n  name: llmd\n"
               "  parameters:\n    tokenProcessorConfig:\n      blockSize: 16\n"
               "schedulingProfiles:\n- name: default\n  plugins:\n"
               "  - pluginRef: prefix-cache-scorer\n  - pluginRef: llmd\n");
    int e0 = add_ep(pl, "e0", RT_ROLE_DECODE), e1 = add_ep(pl, "e1", RT_ROLE_DECODE);
    struct req a;
    mk_req(&a, pl, 64, 1, 8);
    const struct rt_decision *d = decide(pl, &a.r);
    ASSERT_NEAR(raw(d, 0, e0, 0), 0.0);
    ASSERT_NEAR(raw(d, 0, e1, 0), 0.0);
    /* Decisions teach a precise index nothing. */
    d = decide(pl, &a.r);
    ASSERT_NEAR(raw(d, 0, d->decode, 0), 0.0);
    /* e1 reports it stored the four blocks. */
    CU_ASSERT_EQUAL(rt_pipeline_kv_event(pl, e1, RT_KV_STORED, a.hash, 4), 0);
    d = decide(pl, &a.r);
    ASSERT_NEAR(raw(d, 0, e1, 0), 1.0);
    ASSERT_NEAR(raw(d, 0, e1, 1), 1.0);
    ASSERT_NEAR(raw(d, 0, e0, 0), 0.0);
    CU_ASSERT_EQUAL(d->decode, e1);
    CU_ASSERT_EQUAL(d->predicted_cached_decode, 48);
    /* Block 1 evicted: only block 0 leads. */
    CU_ASSERT_EQUAL(rt_pipeline_kv_event(pl, e1, RT_KV_REMOVED, &a.hash[1], 1), 0);
    d = decide(pl, &a.r);
    ASSERT_NEAR(raw(d, 0, e1, 0), 0.25);
    CU_ASSERT_EQUAL(d->predicted_cached_decode, d->decode == e1 ? 16 : 0);
    CU_ASSERT_EQUAL(rt_pipeline_kv_event(pl, e1, RT_KV_ALL_CLEARED, NULL, 0), 0);
    d = decide(pl, &a.r);
    ASSERT_NEAR(raw(d, 0, e1, 0), 0.0);
    CU_ASSERT_EQUAL(rt_pipeline_kv_event(pl, 9, RT_KV_STORED, a.hash, 4), TANDEM_ENOENT);
    CU_ASSERT_EQUAL(rt_pipeline_kv_event(pl, e1, (enum rt_kv_event)7, a.hash, 4), TANDEM_EINVAL);
    rt_pipeline_destroy(pl);
}

/* ---- pickers ---- */

static void test_max_score_picker(void)
{
    const char *yaml = HDR "plugins:\n- type: max-score-picker\n"
                           "  parameters: {maxNumOfEndpoints: 1}\n"
                           "schedulingProfiles:\n- name: default\n  plugins:\n"
                           "  - pluginRef: max-score-picker\n";
    struct rt_pipeline *pl = mk(yaml), *again = mk(yaml);
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "e%d", i);
        add_ep(pl, id, RT_ROLE_DECODE);
        add_ep(again, id, RT_ROLE_DECODE);
    }
    /* All scores tie (no scorer): a uniform random tie-break, replayable. */
    struct req b;
    mk_req(&b, pl, 16, 1, 1);
    int count[3] = {0};
    int seq[12];
    for (int k = 0; k < 3000; k++) {
        const struct rt_decision *d = decide(pl, &b.r);
        count[d->decode]++;
        if (k < 12)
            seq[k] = d->decode;
        struct rt_ticket t = d->ticket;
        rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    }
    for (int k = 0; k < 12; k++)
        CU_ASSERT_EQUAL(decide(again, &b.r)->decode, seq[k]);
    /* Seed 12345's exact draws. */
    static const int golden[12] = {GOLDEN_MAX_SCORE};
    printf("\n  max-score ties, first picks:");
    for (int k = 0; k < 12; k++) {
        printf(" %d", seq[k]);
        CU_ASSERT_EQUAL(seq[k], golden[k]);
    }
    printf("\n  max-score ties over 3000: %d %d %d\n", count[0], count[1], count[2]);
    static const int golden_ties[3] = {GOLDEN_TIES};
    for (int e = 0; e < 3; e++)
        CU_ASSERT_EQUAL(count[e], golden_ties[e]);
    for (int e = 0; e < 3; e++)
        CU_ASSERT(count[e] > 900 && count[e] < 1100);
    rt_pipeline_destroy(pl);
    rt_pipeline_destroy(again);
}

static void test_random_and_weighted_pickers(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: random-picker\nschedulingProfiles:\n"
                                    "- name: default\n  plugins:\n  - pluginRef: random-picker\n");
    struct rt_pipeline *wp = mk(HDR "plugins:\n- type: weighted-random-picker\n"
                                    "- type: kv-cache-utilization-scorer\nschedulingProfiles:\n"
                                    "- name: default\n  plugins:\n"
                                    "  - pluginRef: weighted-random-picker\n"
                                    "  - pluginRef: kv-cache-utilization-scorer\n"
                                    "    weight: 2\n");
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "e%d", i);
        add_ep(pl, id, RT_ROLE_DECODE);
        add_ep(wp, id, RT_ROLE_DECODE);
    }
    /* Totals 2 x (1, 0.25, 0) = 2, 0.5, 0: probabilities 0.8, 0.2, 0. */
    set_load(wp, 0, 0, 0, 0, 100, 0);
    set_load(wp, 1, 0, 0, 75, 100, 0);
    set_load(wp, 2, 0, 0, 100, 100, 0);
    struct req b;
    mk_req(&b, pl, 16, 1, 1);
    int rc[3] = {0}, wc[3] = {0};
    for (int k = 0; k < 5000; k++) {
        const struct rt_decision *d = decide(pl, &b.r);
        rc[d->decode]++;
        d = decide(wp, &b.r);
        wc[d->decode]++;
        if (k == 0) {
            ASSERT_NEAR(d->runs[0].total[0], 2.0);
            ASSERT_NEAR(d->runs[0].total[1], 0.5);
            ASSERT_NEAR(d->runs[0].total[2], 0.0);
        }
    }
    printf("\n  random %d %d %d; weighted %d %d %d\n", rc[0], rc[1], rc[2], wc[0], wc[1], wc[2]);
    static const int golden_r[3] = {GOLDEN_RANDOM}, golden_w[3] = {GOLDEN_WEIGHTED};
    for (int e = 0; e < 3; e++) {
        CU_ASSERT_EQUAL(rc[e], golden_r[e]);
        CU_ASSERT_EQUAL(wc[e], golden_w[e]);
        CU_ASSERT(rc[e] > 1500 && rc[e] < 1833);
    }
    CU_ASSERT(wc[0] > 3850 && wc[0] < 4150);
    CU_ASSERT_EQUAL(wc[2], 0);
    /* All totals zero: uniform. */
    set_load(wp, 0, 0, 0, 100, 100, 0);
    set_load(wp, 1, 0, 0, 100, 100, 0);
    int z[3] = {0};
    for (int k = 0; k < 300; k++)
        z[decide(wp, &b.r)->decode]++;
    CU_ASSERT(z[0] > 0 && z[1] > 0 && z[2] > 0);
    rt_pipeline_destroy(pl);
    rt_pipeline_destroy(wp);
}

static void test_round_robin_picker(void)
{
    struct rt_pipeline *pl =
        mk(HDR "plugins:\n- type: round-robin-picker\nschedulingProfiles:\n"
               "- name: default\n  plugins:\n  - pluginRef: round-robin-picker\n");
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "e%d", i);
        add_ep(pl, id, RT_ROLE_DECODE);
    }
    struct req b;
    mk_req(&b, pl, 16, 1, 1);
    int want[] = {0, 1, 2, 0, 1};
    for (int k = 0; k < 5; k++)
        CU_ASSERT_EQUAL(decide(pl, &b.r)->decode, want[k]);
    /* e1 leaves the rotation while unhealthy: after 1 comes 2, then 0, 2. */
    rt_pipeline_endpoint_set_healthy(pl, 1, 0);
    int want2[] = {2, 0, 2, 0};
    for (int k = 0; k < 4; k++)
        CU_ASSERT_EQUAL(decide(pl, &b.r)->decode, want2[k]);
    rt_pipeline_endpoint_set_healthy(pl, 1, 1);
    int want3[] = {1, 2, 0};
    for (int k = 0; k < 3; k++)
        CU_ASSERT_EQUAL(decide(pl, &b.r)->decode, want3[k]);
    rt_pipeline_destroy(pl);
}

static void test_power_of_two_picker(void)
{
    struct rt_pipeline *pl =
        mk(HDR "plugins:\n- type: power-of-two-picker\nschedulingProfiles:\n"
               "- name: default\n  plugins:\n  - pluginRef: power-of-two-picker\n");
    int e0 = add_ep(pl, "e0", RT_ROLE_DECODE), e1 = add_ep(pl, "e1", RT_ROLE_DECODE);
    struct req b;
    mk_req(&b, pl, 16, 1, 1);
    /* With two endpoints both are sampled: the lighter always wins, so a
     * burst alternates. */
    for (int k = 0; k < 10; k++)
        decide(pl, &b.r);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e0)->inflight_requests, 5);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e1)->inflight_requests, 5);
    /* A big request makes one heavier: the next goes to the other (fewer
     * requests), and so does the one after (equal requests, fewer tokens). */
    struct req big;
    const struct rt_decision *d = decide(pl, mk_req(&big, pl, 64, 2, 100));
    int heavy = d->decode;
    CU_ASSERT_NOT_EQUAL(decide(pl, &b.r)->decode, heavy);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e0)->inflight_requests, 6);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e1)->inflight_requests, 6);
    CU_ASSERT_NOT_EQUAL(decide(pl, &b.r)->decode, heavy);
    rt_pipeline_destroy(pl);
}

/* ---- profile handlers and deciders ---- */

static void test_single_profile(void)
{
    /* No handler and no picker: single-profile-handler and max-score-picker
     * are injected, as in llm-d. */
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n"
                                    "- name: default\n  plugins:\n  - pluginRef: queue-scorer\n");
    CU_ASSERT_PTR_NOT_NULL(rt_pipeline_plugin(pl, "single-profile-handler"));
    CU_ASSERT_PTR_NOT_NULL(rt_pipeline_plugin(pl, "max-score-picker"));
    CU_ASSERT_FALSE(rt_pipeline_uses_hashes(pl));
    CU_ASSERT_EQUAL(rt_pipeline_block_size(pl), BH_DEFAULT_BLOCK_SIZE);
    int c0 = add_ep(pl, "c0", RT_ROLE_COLOCATED);
    add_ep(pl, "c1", RT_ROLE_COLOCATED);
    set_load(pl, 1, 4, 0, 0, 0, 0);
    struct req b;
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, 40, 1, 10));
    CU_ASSERT_EQUAL(d->pd, RT_PD_SINGLE);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_NONE);
    CU_ASSERT_EQUAL(d->decode, c0);
    CU_ASSERT_EQUAL(d->prefill, -1);
    CU_ASSERT_EQUAL(d->n_runs, 1);
    CU_ASSERT_STRING_EQUAL(d->runs[0].picker->name, "max-score-picker");
    CU_ASSERT_PTR_NULL(d->decider);
    CU_ASSERT_EQUAL(d->predicted_cached_decode, -1); /* no prefix index */
    /* The colocated endpoint prefills: its prefill work is charged. */
    const struct rt_endpoint *e = rt_pipeline_endpoint(pl, c0);
    CU_ASSERT_EQUAL(e->inflight_requests, 1);
    CU_ASSERT_EQUAL(e->inflight_tokens, 50);
    CU_ASSERT_EQUAL(e->inflight_prefill_tokens, 40);
    struct rt_ticket t = d->ticket;
    rt_pipeline_release(pl, &t, RT_RELEASE_PREFILL);
    CU_ASSERT_EQUAL(e->inflight_prefill_tokens, 0);
    CU_ASSERT_EQUAL(e->inflight_requests, 1);
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    CU_ASSERT_EQUAL(e->inflight_requests, 0);
    CU_ASSERT_EQUAL(e->inflight_tokens, 0);
    rt_pipeline_destroy(pl);
}

#define PD_YAML(decider_plugins)                                                                   \
    HDR "plugins:\n- type: decode-filter\n- type: prefill-filter\n"                                \
        "- type: prefix-cache-scorer\n" decider_plugins "- type: pd-profile-handler\n"             \
        "schedulingProfiles:\n"                                                                    \
        "- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n"                             \
        "  - pluginRef: prefix-cache-scorer\n"                                                     \
        "- name: decode\n  plugins:\n  - pluginRef: decode-filter\n"                               \
        "  - pluginRef: prefix-cache-scorer\n"

static struct rt_pipeline *pd_cluster(const char *yaml)
{
    struct rt_pipeline *pl = mk(yaml);
    add_ep(pl, "p0", RT_ROLE_PREFILL);
    add_ep(pl, "p1", RT_ROLE_PREFILL);
    add_ep(pl, "d2", RT_ROLE_DECODE);
    add_ep(pl, "d3", RT_ROLE_DECODE);
    return pl;
}

static void test_pd_always_never(void)
{
    struct rt_pipeline *pl = pd_cluster(PD_YAML("- type: always-disagg-pd-decider\n"));
    struct req b;
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, 64, 1, 20));
    CU_ASSERT_EQUAL(d->pd, RT_PD_REMOTE);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_ALWAYS);
    CU_ASSERT_STRING_EQUAL(d->decider->name, "always-disagg-pd-decider");
    CU_ASSERT(d->decode == 2 || d->decode == 3);
    CU_ASSERT(d->prefill == 0 || d->prefill == 1);
    CU_ASSERT_EQUAL(d->n_runs, 2);
    CU_ASSERT_STRING_EQUAL(d->runs[0].profile_name, "decode");
    CU_ASSERT_STRING_EQUAL(d->runs[1].profile_name, "prefill");
    CU_ASSERT_EQUAL(d->predicted_cached_decode, 0);
    CU_ASSERT_EQUAL(d->predicted_cached_prefill, 0);
    const struct rt_endpoint *de = rt_pipeline_endpoint(pl, d->decode);
    const struct rt_endpoint *pe = rt_pipeline_endpoint(pl, d->prefill);
    CU_ASSERT_EQUAL(de->inflight_tokens, 84);
    CU_ASSERT_EQUAL(de->inflight_prefill_tokens, 0); /* D installs frames, P computes */
    CU_ASSERT_EQUAL(pe->inflight_requests, 1);
    CU_ASSERT_EQUAL(pe->inflight_tokens, 64);
    CU_ASSERT_EQUAL(pe->inflight_prefill_tokens, 64);
    /* First token: P is done. */
    struct rt_ticket t = d->ticket;
    rt_pipeline_release(pl, &t, RT_RELEASE_PREFILL);
    CU_ASSERT_EQUAL(pe->inflight_requests, 0);
    CU_ASSERT_EQUAL(pe->inflight_tokens, 0);
    CU_ASSERT_EQUAL(pe->inflight_prefill_tokens, 0);
    CU_ASSERT_EQUAL(de->inflight_requests, 1);
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    CU_ASSERT_EQUAL(de->inflight_requests, 0);
    /* Approx learning recorded both P and D: the same prompt is cached on both. */
    int dd = d->decode, pp = d->prefill;
    d = decide(pl, &b.r);
    CU_ASSERT_EQUAL(d->decode, dd);
    CU_ASSERT_EQUAL(d->prefill, pp);
    CU_ASSERT_EQUAL(d->predicted_cached_decode, 48);
    CU_ASSERT_EQUAL(d->predicted_cached_prefill, 48);
    rt_pipeline_destroy(pl);

    pl = pd_cluster(PD_YAML("- type: never-disagg-pd-decider\n"));
    d = decide(pl, mk_req(&b, pl, 64, 1, 20));
    CU_ASSERT_EQUAL(d->pd, RT_PD_LOCAL);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_NEVER);
    CU_ASSERT_EQUAL(d->prefill, -1);
    CU_ASSERT_EQUAL(d->n_runs, 1);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, d->decode)->inflight_prefill_tokens, 64);
    rt_pipeline_destroy(pl);
}

static void test_pd_prefix_based(void)
{
    struct rt_pipeline *pl = pd_cluster(PD_YAML("- type: prefix-based-pd-decider\n"
                                                "  parameters: {nonCachedTokens: 32}\n"));
    struct req b;
    mk_req(&b, pl, 64, 1, 20);
    const struct rt_decision *d = decide(pl, &b.r);
    CU_ASSERT_EQUAL(d->pd, RT_PD_REMOTE);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_ENOUGH_UNCACHED);
    CU_ASSERT_EQUAL(d->verdict.uncached_tokens, 64);
    int dd = d->decode;
    /* Now 48 tokens are cached on D: 16 uncached < 32, prefill locally. */
    d = decide(pl, &b.r);
    CU_ASSERT_EQUAL(d->decode, dd);
    CU_ASSERT_EQUAL(d->pd, RT_PD_LOCAL);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_CACHED_ON_DECODE);
    CU_ASSERT_EQUAL(d->verdict.uncached_tokens, 16);
    CU_ASSERT_EQUAL(d->predicted_cached_decode, 48);
    CU_ASSERT_EQUAL(d->n_runs, 1);
    rt_pipeline_destroy(pl);

    /* nonCachedTokens 0 (llm-d's default): always disaggregate; promptTokens
     * gates short prompts. */
    pl = pd_cluster(PD_YAML("- type: prefix-based-pd-decider\n"
                            "  parameters: {promptTokens: 100}\n"));
    d = decide(pl, mk_req(&b, pl, 64, 1, 20));
    CU_ASSERT_EQUAL(d->pd, RT_PD_LOCAL);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_SHORT_PROMPT);
    struct req big;
    d = decide(pl, mk_req(&big, pl, 100, 2, 20));
    CU_ASSERT_EQUAL(d->pd, RT_PD_REMOTE);
    rt_pipeline_destroy(pl);
}

static void test_pd_fallbacks(void)
{
    struct rt_pipeline *pl = pd_cluster(PD_YAML("- type: always-disagg-pd-decider\n"));
    struct req b;
    mk_req(&b, pl, 64, 1, 20);
    /* No prefill endpoint: the prefill profile finds no candidate, D prefills. */
    rt_pipeline_endpoint_set_healthy(pl, 0, 0);
    rt_pipeline_endpoint_set_healthy(pl, 1, 0);
    const struct rt_decision *d = decide(pl, &b.r);
    CU_ASSERT_EQUAL(d->pd, RT_PD_LOCAL);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_NO_PREFILL_ENDPOINT);
    CU_ASSERT_EQUAL(d->prefill, -1);
    CU_ASSERT_EQUAL(d->n_runs, 2);
    CU_ASSERT_EQUAL(d->runs[1].n_candidates, 0);
    CU_ASSERT_EQUAL(d->runs[1].picked, -1);
    /* No decode endpoint: no decision. */
    rt_pipeline_endpoint_set_healthy(pl, 2, 0);
    rt_pipeline_endpoint_set_healthy(pl, 3, 0);
    CU_ASSERT_EQUAL(rt_pipeline_decide(pl, &b.r, &d), TANDEM_ENOENT);
    struct rt_pipeline_stats st;
    rt_pipeline_stats(pl, &st);
    CU_ASSERT_EQUAL(st.failures, 1);
    CU_ASSERT_EQUAL(st.decisions, 1);
    CU_ASSERT_EQUAL(st.pd_local, 1);
    rt_pipeline_destroy(pl);

    /* A prefill profile without a filter may pick D itself: local. */
    pl = mk(HDR "plugins:\n- type: always-disagg-pd-decider\n- type: pd-profile-handler\n"
                "schedulingProfiles:\n- name: decode\n- name: prefill\n");
    add_ep(pl, "only", RT_ROLE_COLOCATED);
    d = decide(pl, mk_req(&b, pl, 64, 1, 20));
    CU_ASSERT_EQUAL(d->pd, RT_PD_LOCAL);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_SAME_ENDPOINT);
    rt_pipeline_destroy(pl);
}

static void test_pd_load_aware(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: decode-filter\n- type: prefill-filter\n"
                                    "- type: prefix-cache-scorer\n- type: load-aware-pd-decider\n"
                                    "  parameters:\n    nonCachedTokens: 256\n"
                                    "    transferOverheadTokens: 64\n    decodeInterference: 1\n"
                                    "- type: pd-profile-handler\n"
                                    "  parameters: {deciderPluginName: load-aware-pd-decider}\n"
                                    "schedulingProfiles:\n"
                                    "- name: decode\n  plugins:\n  - pluginRef: decode-filter\n"
                                    "- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n");
    int p0 = add_ep(pl, "p0", RT_ROLE_PREFILL);
    int d1 = add_ep(pl, "d1", RT_ROLE_DECODE); /* max_running 16 */
    struct req b;
    uint32_t prompt = 1;
    /* (a) D half busy, P backlogged: local 512 x 1.5 = 768, remote 1000 + 512 + 64. */
    set_load(pl, d1, 0, 8, 0, 100, 0);
    set_load(pl, p0, 0, 0, 0, 100, 1000);
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, 512, prompt++, 16));
    CU_ASSERT_EQUAL(d->pd, RT_PD_LOCAL);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_LOCAL_FASTER);
    ASSERT_NEAR(d->verdict.local_cost, 768);
    ASSERT_NEAR(d->verdict.remote_cost, 1576);
    CU_ASSERT_EQUAL(d->verdict.remote_ep, p0);
    struct rt_ticket t = d->ticket;
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    /* (b) P idle: remote 576 < 768. */
    set_load(pl, p0, 0, 0, 0, 100, 0);
    d = decide(pl, mk_req(&b, pl, 512, prompt++, 16));
    CU_ASSERT_EQUAL(d->pd, RT_PD_REMOTE);
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_REMOTE_FASTER);
    ASSERT_NEAR(d->verdict.remote_cost, 576);
    CU_ASSERT_EQUAL(d->prefill, p0);
    t = d->ticket;
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    /* (c) D idle: local 512 < 576: the transfer is not worth it. */
    set_load(pl, d1, 0, 0, 0, 100, 0);
    d = decide(pl, mk_req(&b, pl, 512, prompt++, 16));
    CU_ASSERT_EQUAL(d->pd, RT_PD_LOCAL);
    ASSERT_NEAR(d->verdict.local_cost, 512);
    t = d->ticket;
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    /* (d) Too few uncached tokens. */
    d = decide(pl, mk_req(&b, pl, 200, prompt++, 16));
    CU_ASSERT_EQUAL(d->verdict.reason, RT_PD_REASON_CACHED_ON_DECODE);
    t = d->ticket;
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    /* (e) A burst: D saturated (local 1024); the first goes remote (576), the
     * second sees P's 512 in-flight prefill tokens (1088 > 1024) and stays. */
    set_load(pl, d1, 0, 16, 0, 100, 0);
    d = decide(pl, mk_req(&b, pl, 512, prompt++, 16));
    CU_ASSERT_EQUAL(d->pd, RT_PD_REMOTE);
    ASSERT_NEAR(d->verdict.local_cost, 1024);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, p0)->inflight_prefill_tokens, 512);
    struct rt_ticket t1 = d->ticket;
    d = decide(pl, mk_req(&b, pl, 512, prompt++, 16));
    CU_ASSERT_EQUAL(d->pd, RT_PD_LOCAL);
    ASSERT_NEAR(d->verdict.remote_cost, 1088);
    /* ... and after P's first token it is free again. */
    struct rt_ticket t2 = d->ticket;
    rt_pipeline_release(pl, &t2, RT_RELEASE_ALL);
    rt_pipeline_release(pl, &t1, RT_RELEASE_PREFILL);
    d = decide(pl, mk_req(&b, pl, 512, prompt++, 16));
    CU_ASSERT_EQUAL(d->pd, RT_PD_REMOTE);
    rt_pipeline_destroy(pl);

    /* prefillSpeedRatio 2: remote (0 + 512) / 2 + 64 = 320 beats an idle D's 512. */
    pl = mk(HDR "plugins:\n- type: decode-filter\n- type: prefill-filter\n"
                "- type: prefix-cache-scorer\n- type: load-aware-pd-decider\n"
                "  parameters: {prefillSpeedRatio: 2}\n- type: pd-profile-handler\n"
                "schedulingProfiles:\n"
                "- name: decode\n  plugins:\n  - pluginRef: decode-filter\n"
                "- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n");
    add_ep(pl, "p0", RT_ROLE_PREFILL);
    add_ep(pl, "d1", RT_ROLE_DECODE);
    d = decide(pl, mk_req(&b, pl, 512, 1, 16));
    CU_ASSERT_EQUAL(d->pd, RT_PD_REMOTE);
    ASSERT_NEAR(d->verdict.remote_cost, 320);
    ASSERT_NEAR(d->verdict.local_cost, 512);
    rt_pipeline_destroy(pl);
}

/* ---- deciders at their boundaries ---- */

/* P/D cluster p0 (prefill), d1 (decode), p2 (prefill) with a precise prefix
 * index, so what each endpoint holds is exactly what the test stores, and
 * the decider plugin named "dec". */
#define PD_PRECISE_YAML(decider)                                                                   \
    HDR "plugins:\n- type: decode-filter\n- type: prefill-filter\n"                                \
        "- type: prefix-cache-scorer\n  parameters: {mode: precise}\n" decider                     \
        "- type: pd-profile-handler\n  parameters: {deciderPluginName: dec}\n"                     \
        "schedulingProfiles:\n"                                                                    \
        "- name: decode\n  plugins:\n  - pluginRef: decode-filter\n"                               \
        "- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n"

enum { BP0 = 0, BD1 = 1, BP2 = 2 };

static struct rt_pipeline *pd_precise(const char *yaml)
{
    struct rt_pipeline *pl = mk(yaml);
    CU_ASSERT_EQUAL_FATAL(add_ep(pl, "p0", RT_ROLE_PREFILL), BP0);
    CU_ASSERT_EQUAL_FATAL(add_ep(pl, "d1", RT_ROLE_DECODE), BD1);
    CU_ASSERT_EQUAL_FATAL(add_ep(pl, "p2", RT_ROLE_PREFILL), BP2);
    return pl;
}

/* Endpoint ep stores the first n blocks of prompt family seed (every prompt
 * of mk_req with that seed shares them). */
static void hold_blocks(struct rt_pipeline *pl, int ep, uint32_t seed, int n)
{
    struct req b;
    mk_req(&b, pl, 64 * 16, seed, 1);
    CU_ASSERT_EQUAL_FATAL(rt_pipeline_kv_event(pl, ep, RT_KV_STORED, b.hash, n), 0);
}

/* Decides a prompt of n tokens of family seed, checks the way it went, the
 * reason and the uncached count (both sides printed on a mismatch), then
 * gives the in-flight accounting back so the next decision sees the same
 * load. */
static const struct rt_decision *verdict_is(struct rt_pipeline *pl, int n, uint32_t seed,
                                            enum rt_pd_mode pd, enum rt_pd_reason reason,
                                            int uncached)
{
    static struct req b;
    const struct rt_decision *d = decide(pl, mk_req(&b, pl, n, seed, 16));
    if (d->pd != pd || d->verdict.reason != reason)
        fprintf(stderr, "\nprompt %d: %s (%s), want %s (%s)\n", n, rt_pd_mode_name(d->pd),
                rt_pd_reason_name(d->verdict.reason), rt_pd_mode_name(pd),
                rt_pd_reason_name(reason));
    EXPECT_EQ(d->pd, pd);
    EXPECT_EQ(d->verdict.reason, reason);
    EXPECT_EQ(d->verdict.prompt_tokens, n);
    EXPECT_EQ(d->verdict.uncached_tokens, uncached);
    EXPECT_EQ(d->decode, BD1);
    if (pd == RT_PD_REMOTE) {
        CU_ASSERT(d->prefill == BP0 || d->prefill == BP2);
    } else {
        EXPECT_EQ(d->prefill, -1);
    }
    struct rt_ticket t = d->ticket;
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    return d;
}

static void test_pd_prefix_based_boundaries(void)
{
    /* D holds the first 2 blocks (32 tokens) of family 1, so a prompt of n
     * tokens has n - 32 uncached: the decider compares that, not n, with
     * nonCachedTokens 40, and remote starts at exactly 40 (>=). */
    struct rt_pipeline *pl = pd_precise(PD_PRECISE_YAML("- type: prefix-based-pd-decider\n"
                                                        "  name: dec\n"
                                                        "  parameters: {nonCachedTokens: 40}\n"));
    hold_blocks(pl, BD1, 1, 2);
    const struct rt_decision *d =
        verdict_is(pl, 71, 1, RT_PD_LOCAL, RT_PD_REASON_CACHED_ON_DECODE, 39);
    EXPECT_EQ(d->predicted_cached_decode, 32);
    verdict_is(pl, 72, 1, RT_PD_REMOTE, RT_PD_REASON_ENOUGH_UNCACHED, 40);
    verdict_is(pl, 73, 1, RT_PD_REMOTE, RT_PD_REASON_ENOUGH_UNCACHED, 41);
    /* Nothing cached (family 2): the whole prompt counts. */
    verdict_is(pl, 39, 2, RT_PD_LOCAL, RT_PD_REASON_CACHED_ON_DECODE, 39);
    verdict_is(pl, 40, 2, RT_PD_REMOTE, RT_PD_REASON_ENOUGH_UNCACHED, 40);
    /* What P holds does not matter to this decider. */
    hold_blocks(pl, BP0, 1, 4);
    hold_blocks(pl, BP2, 1, 4);
    verdict_is(pl, 72, 1, RT_PD_REMOTE, RT_PD_REASON_ENOUGH_UNCACHED, 40);
    rt_pipeline_destroy(pl);

    /* promptTokens 64 counts the whole prompt, cached part included (D holds
     * 32 tokens of it): 63 is short, 64 is not. */
    pl = pd_precise(PD_PRECISE_YAML("- type: prefix-based-pd-decider\n  name: dec\n"
                                    "  parameters: {nonCachedTokens: 1, promptTokens: 64}\n"));
    hold_blocks(pl, BD1, 1, 2);
    verdict_is(pl, 63, 1, RT_PD_LOCAL, RT_PD_REASON_SHORT_PROMPT, 31);
    verdict_is(pl, 64, 1, RT_PD_REMOTE, RT_PD_REASON_ENOUGH_UNCACHED, 32);
    verdict_is(pl, 65, 1, RT_PD_REMOTE, RT_PD_REASON_ENOUGH_UNCACHED, 33);
    rt_pipeline_destroy(pl);
}

#define LOAD_DECIDER(params)                                                                       \
    "- type: load-aware-pd-decider\n  name: dec\n  parameters:\n" params                           \
    "    transferOverheadTokens: 64\n    decodeInterference: 1\n    prefillSpeedRatio: 1\n"

static void test_pd_load_aware_boundaries(void)
{
    /* nonCachedTokens 256. D's batch is full (busy 1: local = 2 x uncached),
     * both P idle (remote = prompt + 64), so past the gate remote always
     * wins and the verdict flips exactly at uncached == 256. D holds 32
     * tokens of family 1: a prompt of n has n - 32 uncached. */
    struct rt_pipeline *pl =
        pd_precise(PD_PRECISE_YAML(LOAD_DECIDER("    nonCachedTokens: 256\n")));
    set_load(pl, BD1, 0, 16, 0, 100, 0);
    hold_blocks(pl, BD1, 1, 2);
    const struct rt_decision *d =
        verdict_is(pl, 287, 1, RT_PD_LOCAL, RT_PD_REASON_CACHED_ON_DECODE, 255);
    ASSERT_NEAR(d->verdict.local_cost, 0); /* the gate decided: no estimate */
    EXPECT_EQ(d->verdict.remote_ep, -1);
    d = verdict_is(pl, 288, 1, RT_PD_REMOTE, RT_PD_REASON_REMOTE_FASTER, 256);
    ASSERT_NEAR(d->verdict.local_cost, 512);
    ASSERT_NEAR(d->verdict.remote_cost, 352);
    d = verdict_is(pl, 289, 1, RT_PD_REMOTE, RT_PD_REASON_REMOTE_FASTER, 257);
    ASSERT_NEAR(d->verdict.local_cost, 514);
    ASSERT_NEAR(d->verdict.remote_cost, 353);
    rt_pipeline_destroy(pl);

    /* promptTokens 300 (nonCachedTokens 0): the whole prompt, 299 is short. */
    pl = pd_precise(
        PD_PRECISE_YAML(LOAD_DECIDER("    nonCachedTokens: 0\n    promptTokens: 300\n")));
    set_load(pl, BD1, 0, 16, 0, 100, 0);
    hold_blocks(pl, BD1, 1, 2);
    verdict_is(pl, 299, 1, RT_PD_LOCAL, RT_PD_REASON_SHORT_PROMPT, 267);
    verdict_is(pl, 300, 1, RT_PD_REMOTE, RT_PD_REASON_REMOTE_FASTER, 268);
    verdict_is(pl, 301, 1, RT_PD_REMOTE, RT_PD_REASON_REMOTE_FASTER, 269);
    rt_pipeline_destroy(pl);
}

static void test_pd_load_aware_tie(void)
{
    /* D half busy: local = 512 x 1.5 = 768 for a cold 512-token prompt.
     * Remote = queued + 512 + 64 on the less loaded P (p2 keeps 10000
     * queued). docs/routing.md: remote only when remote < local, so at
     * queued 192 (768 == 768) D keeps the prompt. */
    struct rt_pipeline *pl =
        pd_precise(PD_PRECISE_YAML(LOAD_DECIDER("    nonCachedTokens: 256\n")));
    set_load(pl, BD1, 0, 8, 0, 100, 0);
    set_load(pl, BP2, 0, 0, 0, 100, 10000);
    const uint64_t queued[] = {191, 192, 193};
    const enum rt_pd_mode want[] = {RT_PD_REMOTE, RT_PD_LOCAL, RT_PD_LOCAL};
    for (int i = 0; i < 3; i++) {
        set_load(pl, BP0, 0, 0, 0, 100, queued[i]);
        const struct rt_decision *d = verdict_is(
            pl, 512, 3, want[i],
            want[i] == RT_PD_REMOTE ? RT_PD_REASON_REMOTE_FASTER : RT_PD_REASON_LOCAL_FASTER, 512);
        ASSERT_NEAR(d->verdict.local_cost, 768);
        ASSERT_NEAR(d->verdict.remote_cost, 767 + i);
        EXPECT_EQ(d->verdict.remote_ep, BP0);
    }
    rt_pipeline_destroy(pl);
}

static void test_pd_load_aware_prefill_cached(void)
{
    /* D half busy, nothing of family 4 cached on D: local = 768 for 512
     * tokens. p0 queues 10000 (out of the running), p2 queues 208: remote =
     * 208 + 512 - cached(p2) + 64 = 784 - cached(p2). The verdict flips
     * between 1 block (768, a tie: local) and 2 blocks (752: remote). */
    struct rt_pipeline *pl =
        pd_precise(PD_PRECISE_YAML(LOAD_DECIDER("    nonCachedTokens: 256\n")));
    set_load(pl, BD1, 0, 8, 0, 100, 0);
    set_load(pl, BP0, 0, 0, 0, 100, 10000);
    set_load(pl, BP2, 0, 0, 0, 100, 208);
    const struct rt_decision *d =
        verdict_is(pl, 512, 4, RT_PD_LOCAL, RT_PD_REASON_LOCAL_FASTER, 512);
    ASSERT_NEAR(d->verdict.local_cost, 768);
    ASSERT_NEAR(d->verdict.remote_cost, 784);
    EXPECT_EQ(d->verdict.remote_ep, BP2);
    hold_blocks(pl, BP2, 4, 1);
    d = verdict_is(pl, 512, 4, RT_PD_LOCAL, RT_PD_REASON_LOCAL_FASTER, 512);
    ASSERT_NEAR(d->verdict.remote_cost, 768);
    hold_blocks(pl, BP2, 4, 2);
    d = verdict_is(pl, 512, 4, RT_PD_REMOTE, RT_PD_REASON_REMOTE_FASTER, 512);
    ASSERT_NEAR(d->verdict.local_cost, 768);
    ASSERT_NEAR(d->verdict.remote_cost, 752);
    EXPECT_EQ(d->verdict.remote_ep, BP2);
    /* Every block held: P still computes one token, so 31 of the 32 count
     * (496 tokens): 208 + 16 + 64. */
    hold_blocks(pl, BP2, 4, 32);
    d = verdict_is(pl, 512, 4, RT_PD_REMOTE, RT_PD_REASON_REMOTE_FASTER, 512);
    ASSERT_NEAR(d->verdict.remote_cost, 288);
    /* The best P is the one with the lowest remote cost: p0 holding 31
     * blocks still queues 10000 + 16 + 64. */
    hold_blocks(pl, BP0, 4, 32);
    d = verdict_is(pl, 512, 4, RT_PD_REMOTE, RT_PD_REASON_REMOTE_FASTER, 512);
    EXPECT_EQ(d->verdict.remote_ep, BP2);
    ASSERT_NEAR(d->verdict.remote_cost, 288);
    rt_pipeline_destroy(pl);
}

/* ---- herding ---- */

static void test_burst_spreads(void)
{
    struct rt_pipeline *pl =
        mk(HDR "plugins:\n- type: active-request-scorer\nschedulingProfiles:\n"
               "- name: default\n  plugins:\n  - pluginRef: active-request-scorer\n");
    struct rt_pipeline *herd = mk(HDR "plugins:\n- type: prefix-cache-scorer\nschedulingProfiles:\n"
                                      "- name: default\n  plugins:\n"
                                      "  - pluginRef: prefix-cache-scorer\n");
    for (int i = 0; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof(id), "e%d", i);
        add_ep(pl, id, RT_ROLE_DECODE);
        add_ep(herd, id, RT_ROLE_DECODE);
    }
    struct req b;
    mk_req(&b, pl, 256, 1, 32);
    /* Ten identical requests before any heartbeat or completion. */
    int n[5] = {0}, h[5] = {0};
    for (int k = 0; k < 10; k++) {
        n[decide(pl, &b.r)->decode]++;
        h[decide(herd, &b.r)->decode]++;
    }
    for (int e = 0; e < 5; e++) {
        CU_ASSERT_EQUAL(n[e], 2);
        CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, e)->inflight_requests, 2);
    }
    /* Prefix affinity alone herds all ten onto the first choice. */
    int max = 0;
    for (int e = 0; e < 5; e++)
        max = h[e] > max ? h[e] : max;
    CU_ASSERT_EQUAL(max, 10);
    rt_pipeline_destroy(pl);
    rt_pipeline_destroy(herd);
}

/* ---- records, reports, endpoints, requests ---- */

static void test_record_and_format(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: queue-scorer\n  name: q\n"
                                    "- type: kv-cache-utilization-scorer\n  name: kv\n"
                                    "schedulingProfiles:\n- name: default\n  plugins:\n"
                                    "  - pluginRef: q\n    weight: 2\n"
                                    "  - pluginRef: kv\n    weight: 3\n");
    int a = add_ep(pl, "w-a", RT_ROLE_COLOCATED), c = add_ep(pl, "w\"b", RT_ROLE_COLOCATED);
    set_load(pl, a, 2, 0, 50, 100, 0);
    set_load(pl, c, 4, 0, 10, 100, 0);
    struct req b;
    struct rt_request *rq = mk_req(&b, pl, 16, 3, 1);
    rq->response_id = "cmpl-\"42";
    const struct rt_decision *d = decide(pl, rq);
    const struct rt_profile_run *r = &d->runs[0];
    CU_ASSERT_EQUAL(r->n_scorers, 2);
    CU_ASSERT_STRING_EQUAL(r->scorers[0]->name, "q");
    CU_ASSERT_STRING_EQUAL(rt_plugin_type(r->scorers[1]), "kv-cache-utilization-scorer");
    ASSERT_NEAR(r->weights[0], 2);
    ASSERT_NEAR(r->weights[1], 3);
    /* a: 2 x 1 + 3 x 0.5 = 3.5; b: 2 x 0 + 3 x 0.9 = 2.7 */
    ASSERT_NEAR(r->total[rt_run_find(r, a)], 3.5);
    ASSERT_NEAR(r->total[rt_run_find(r, c)], 2.7);
    CU_ASSERT_EQUAL(d->decode, a);
    CU_ASSERT_EQUAL(r->picked, a);
    CU_ASSERT_EQUAL(r->candidates[r->picked_pos], a);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, a)->picks, 1u);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint(pl, c)->picks, 0u);
    CU_ASSERT_EQUAL(d->seq, 1);
    CU_ASSERT_EQUAL(d->request_id, 3);
    CU_ASSERT(d->latency_ns > 0);
    char buf[2048];
    int n = rt_decision_format(pl, d, buf, sizeof(buf));
    CU_ASSERT(n > 0 && (size_t)n == strlen(buf));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(buf, "{\"seq\":1,\"request_id\":3,\"response_id\":\"cmpl-\\\"42\",\"decode\":"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "\"decode\":\"w-a\",\"prefill\":null,\"pd\":\"single\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "{\"endpoint\":\"w\\\"b\",\"total\":2.7,"
                                       "\"scores\":{\"q\":0,\"kv\":0.9}}"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "\"picker\":\"max-score-picker\",\"picked\":\"w-a\","
                                       "\"weights\":{\"q\":2,\"kv\":3}"));
    printf("\n  %s\n", buf);
    char small[16];
    CU_ASSERT_EQUAL(rt_decision_format(pl, d, small, sizeof(small)), TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(strlen(small), 15);
    rt_pipeline_destroy(pl);
}

static void test_report_cached(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: prefix-cache-scorer\nschedulingProfiles:\n"
                                    "- name: default\n  plugins:\n"
                                    "  - pluginRef: prefix-cache-scorer\n");
    add_ep(pl, "e0", RT_ROLE_COLOCATED);
    struct req b;
    mk_req(&b, pl, 64, 1, 4);
    struct rt_ticket t0 = decide(pl, &b.r)->ticket;
    struct rt_ticket t1 = decide(pl, &b.r)->ticket;
    struct rt_ticket t2 = decide(pl, &b.r)->ticket;
    CU_ASSERT_EQUAL(t0.predicted_cached_decode, 0);
    CU_ASSERT_EQUAL(t1.predicted_cached_decode, 48);
    CU_ASSERT_EQUAL(t1.actual_cached_decode, -1);
    CU_ASSERT_EQUAL(rt_pipeline_report_cached(pl, &t0, 0), 0);
    CU_ASSERT_EQUAL(rt_pipeline_report_cached(pl, &t1, 48), 0);
    CU_ASSERT_EQUAL(rt_pipeline_report_cached(pl, &t2, 32), 16);
    CU_ASSERT_EQUAL(rt_pipeline_report_cached(pl, &t2, 0), 16); /* counted once */
    CU_ASSERT_EQUAL(t2.actual_cached_decode, 32);
    struct rt_pipeline_stats st;
    rt_pipeline_stats(pl, &st);
    CU_ASSERT_EQUAL(st.cached_reports, 3);
    CU_ASSERT_EQUAL(st.predicted_tokens, 96);
    CU_ASSERT_EQUAL(st.actual_tokens, 80);
    CU_ASSERT_EQUAL(st.abs_error_tokens, 16);
    CU_ASSERT_EQUAL(st.exact_predictions, 2);
    CU_ASSERT_EQUAL(st.decisions, 3);
    CU_ASSERT_EQUAL(st.pd_single, 3);
    rt_pipeline_destroy(pl);
}

static void test_endpoints_api(void)
{
    char err[RT_ERR_MAX];
    struct rt_pipeline *pl = NULL;
    struct rt_pipeline_opts o = {.max_endpoints = 2, .seed = 1};
    CU_ASSERT_EQUAL_FATAL(rt_pipeline_parse(&pl,
                                            HDR "plugins: []\nschedulingProfiles:\n- name: x\n",
                                            "t.yaml", &o, err, sizeof(err)),
                          0);
    struct rt_endpoint_info in = {.id = "a", .role = RT_ROLE_DECODE, .block_size = 16};
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_add(pl, &in), 0);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_add(pl, &in), TANDEM_EEXIST);
    in.id = "";
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_add(pl, &in), TANDEM_EINVAL);
    in.id = "b";
    in.role = (enum rt_role)9;
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_add(pl, &in), TANDEM_EINVAL);
    in.role = RT_ROLE_PREFILL;
    in.block_size = 0;
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_add(pl, &in), TANDEM_EINVAL);
    in.block_size = 16;
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_add(pl, &in), 1);
    in.id = "c";
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_add(pl, &in), TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_find(pl, "b"), 1);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_find(pl, "zz"), TANDEM_ENOENT);
    uint32_t gen = rt_pipeline_endpoint(pl, 0)->gen;
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_remove(pl, 0), 0);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_remove(pl, 0), TANDEM_ENOENT);
    CU_ASSERT_PTR_NULL(rt_pipeline_endpoint(pl, 0));
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_set_healthy(pl, 0, 1), TANDEM_ENOENT);
    struct rt_load l = {0};
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_set_load(pl, 5, &l), TANDEM_ENOENT);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_add(pl, &in), 0); /* "c" reuses slot 0 */
    CU_ASSERT_NOT_EQUAL(rt_pipeline_endpoint(pl, 0)->gen, gen);
    CU_ASSERT_STRING_EQUAL(rt_pipeline_endpoint(pl, 0)->id, "c");
    CU_ASSERT_STRING_EQUAL(rt_role_name(rt_pipeline_endpoint(pl, 0)->role), "prefill");
    enum rt_role role;
    CU_ASSERT_EQUAL(rt_role_parse("colocated", &role), 0);
    CU_ASSERT_EQUAL(role, RT_ROLE_COLOCATED);
    CU_ASSERT_EQUAL(rt_role_parse("both", &role), TANDEM_EINVAL);
    rt_pipeline_destroy(pl);
}

static void test_exclude_and_stale_release(void)
{
    struct rt_pipeline *pl = mk(HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n"
                                    "- name: default\n  plugins:\n  - pluginRef: queue-scorer\n");
    int e0 = add_ep(pl, "e0", RT_ROLE_DECODE), e1 = add_ep(pl, "e1", RT_ROLE_DECODE);
    set_load(pl, e1, 9, 0, 0, 0, 0); /* e0 is the better choice */
    struct req b;
    mk_req(&b, pl, 16, 1, 1);
    CU_ASSERT_EQUAL(decide(pl, &b.r)->decode, e0);
    /* A retry after e0 failed. */
    int ex[] = {e0};
    b.r.exclude = ex;
    b.r.n_exclude = 1;
    const struct rt_decision *d = decide(pl, &b.r);
    CU_ASSERT_EQUAL(d->decode, e1);
    CU_ASSERT_EQUAL(d->runs[0].n_candidates, 1);
    int ex2[] = {e0, e1, 99};
    b.r.exclude = ex2;
    b.r.n_exclude = 3;
    CU_ASSERT_EQUAL(rt_pipeline_decide(pl, &b.r, &d), TANDEM_ENOENT);
    b.r.n_exclude = 0;
    /* Exclusion is per request. */
    d = decide(pl, &b.r);
    CU_ASSERT_EQUAL(d->decode, e0);
    /* A ticket outliving its endpoint does not touch the slot's next tenant. */
    struct rt_ticket t = d->ticket;
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_remove(pl, e0), 0);
    CU_ASSERT_EQUAL(add_ep(pl, "e0-new", RT_ROLE_DECODE), e0);
    set_load(pl, e1, 0, 0, 0, 0, 0);
    d = decide(pl, &b.r);
    const struct rt_endpoint *ne = rt_pipeline_endpoint(pl, e0);
    uint32_t before = ne->inflight_requests;
    rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
    CU_ASSERT_EQUAL(ne->inflight_requests, before);
    /* Invalid requests. */
    b.r.n_blocks = 2; /* 16 tokens hold one block */
    CU_ASSERT_EQUAL(rt_pipeline_decide(pl, &b.r, &d), TANDEM_EINVAL);
    b.r.n_blocks = 1;
    b.r.n_tokens = -1;
    CU_ASSERT_EQUAL(rt_pipeline_decide(pl, &b.r, &d), TANDEM_EINVAL);
    rt_pipeline_destroy(pl);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("rt_pipeline", NULL, NULL);
    CU_add_test(s, "filters", test_filters);
    CU_add_test(s, "queue_scorer", test_queue_scorer);
    CU_add_test(s, "kv_cache_utilization_scorer", test_kv_cache_utilization_scorer);
    CU_add_test(s, "load_aware_scorer", test_load_aware_scorer);
    CU_add_test(s, "active_request_scorer", test_active_request_scorer);
    CU_add_test(s, "session_affinity_scorer", test_session_affinity_scorer);
    CU_add_test(s, "random_scorer", test_random_scorer);
    CU_add_test(s, "prefix_approx", test_prefix_approx);
    CU_add_test(s, "prefix_precise", test_prefix_precise);
    CU_add_test(s, "max_score_picker", test_max_score_picker);
    CU_add_test(s, "random_and_weighted_pickers", test_random_and_weighted_pickers);
    CU_add_test(s, "round_robin_picker", test_round_robin_picker);
    CU_add_test(s, "power_of_two_picker", test_power_of_two_picker);
    CU_add_test(s, "single_profile", test_single_profile);
    CU_add_test(s, "pd_always_never", test_pd_always_never);
    CU_add_test(s, "pd_prefix_based", test_pd_prefix_based);
    CU_add_test(s, "pd_fallbacks", test_pd_fallbacks);
    CU_add_test(s, "pd_load_aware", test_pd_load_aware);
    CU_add_test(s, "pd_prefix_based_boundaries", test_pd_prefix_based_boundaries);
    CU_add_test(s, "pd_load_aware_boundaries", test_pd_load_aware_boundaries);
    CU_add_test(s, "pd_load_aware_tie", test_pd_load_aware_tie);
    CU_add_test(s, "pd_load_aware_prefill_cached", test_pd_load_aware_prefill_cached);
    CU_add_test(s, "burst_spreads", test_burst_spreads);
    CU_add_test(s, "record_and_format", test_record_and_format);
    CU_add_test(s, "report_cached", test_report_cached);
    CU_add_test(s, "endpoints_api", test_endpoints_api);
    CU_add_test(s, "exclude_and_stale_release", test_exclude_and_stale_release);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
