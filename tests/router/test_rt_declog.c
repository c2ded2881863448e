/* Decision records kept lazily (rt_declog): the text served later is the
 * live decision's rt_decision_format text byte for byte, across ring wraps
 * and buffer reuse, and a record names the endpoint it picked even after
 * that endpoint's slot was freed and reused by another. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../integration/expect.h"
#include "block_hash.h"
#include "default_routing.h"
#include "log.h"
#include "pipeline.h"
#include "rt_declog.h"
#include "tandem_err.h"
#include "pl_fixture.h"

#define HDR "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
/* One profile, one queue-scorer. */
#define QUEUE_ONLY                                                                                 \
    HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n"       \
        "  - pluginRef: queue-scorer\n"

static struct rt_pipeline *mk(const char *yaml)
{
    char err[RT_ERR_MAX];
    struct rt_pipeline *pl = NULL;
    struct rt_pipeline_opts o = {.max_endpoints = 16, .seed = 7};
    int rc = rt_pipeline_parse(&pl, yaml, "test.yaml", &o, err, sizeof(err));
    if (rc)
        printf("\n  config error: %s\n", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return pl;
}

static void set_load(struct rt_pipeline *pl, int ep, uint32_t waiting, uint32_t running,
                     uint64_t queued)
{
    struct rt_load l = {.waiting = waiting,
                        .running = running,
                        .kv_blocks_used = 10 * running,
                        .kv_blocks_total = 1000,
                        .prefill_tokens_queued = queued};
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_set_load(pl, ep, &l), 0);
}

struct req {
    uint32_t tok[1024];
    uint64_t hash[64];
    char rid[32];
    struct rt_request r;
};

static struct rt_request *mk_req(struct req *b, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++)
        b->tok[i] = seed * 10000u + (uint32_t)i;
    int nb = bh_hash_prompt(bh_root("tiny"), b->tok, n, 16, b->hash);
    CU_ASSERT_FATAL(nb >= 0);
    snprintf(b->rid, sizeof(b->rid), "cmpl-%u", seed);
    b->r = (struct rt_request){.id = seed,
                               .response_id = seed % 3 ? b->rid : NULL,
                               .tokens = b->tok,
                               .n_tokens = n,
                               .block_hashes = b->hash,
                               .n_blocks = nb,
                               .max_tokens = 16};
    return &b->r;
}

static char *live_text(const struct rt_pipeline *pl, const struct rt_decision *d)
{
    static char buf[1 << 16];
    int n = rt_decision_format(pl, d, buf, sizeof(buf));
    CU_ASSERT_FATAL(n > 0);
    return strdup(buf);
}

#define N_DECISIONS 40
#define KEEP        7

/* Many decisions through a ring of KEEP: each one read back at once and
 * the kept ones again at the end must be the live text. */
static void check_lazy_equals_live(const char *yaml)
{
    struct rt_pipeline *pl = mk(yaml);
    int p0 = add_ep(pl, "p0", RT_ROLE_PREFILL);
    int p1 = add_ep(pl, "p\"1", RT_ROLE_PREFILL);
    int d0 = add_ep(pl, "d0", RT_ROLE_DECODE);
    int d1 = add_ep(pl, "d1", RT_ROLE_DECODE);
    int c2 = add_ep(pl, "c2", RT_ROLE_COLOCATED);
    int eps[] = {p0, p1, d0, d1, c2};
    struct rt_declog l;
    CU_ASSERT_EQUAL_FATAL(rt_declog_init(&l, KEEP), 0);
    char *live[N_DECISIONS];
    uint64_t seqs[N_DECISIONS];
    int remote = 0, local = 0;
    for (int i = 0; i < N_DECISIONS; i++) {
        for (int k = 0; k < 5; k++)
            set_load(pl, eps[k], (uint32_t)((i * 7 + k * 3) % 5), (uint32_t)((i + k) % 9),
                     (uint64_t)((i * 131 + k * 17) % 900));
        struct req b;
        struct rt_request *rq = mk_req(&b, 64 + (i * 53) % 700, (uint32_t)(i % 6 + 1));
        /* Some prompts cached on d0 or d1 (precise prefix index): local prefills. */
        if (i % 4 == 1)
            CU_ASSERT_EQUAL(
                rt_pipeline_kv_event(pl, i % 8 == 1 ? d0 : d1, RT_KV_STORED, b.hash, b.r.n_blocks),
                0);
        int ex = i % 5 == 2 ? d1 : p1; /* candidate counts vary */
        if (i % 3 == 0) {
            rq->exclude = &ex;
            rq->n_exclude = 1;
        }
        const struct rt_decision *d = NULL;
        CU_ASSERT_EQUAL_FATAL(rt_pipeline_decide(pl, rq, &d), 0);
        remote += d->pd == RT_PD_REMOTE;
        local += d->pd == RT_PD_LOCAL;
        live[i] = live_text(pl, d);
        seqs[i] = d->seq;
        rt_declog_add(&l, pl, d);
        struct rt_ticket t = d->ticket;
        rt_pipeline_release(pl, &t, RT_RELEASE_ALL);
        int actual = 0;
        EXPECT_STR(rt_declog_json(&l, 0, &actual), live[i]);
        EXPECT_EQ(actual, -1);
    }
    /* Both P/D outcomes were recorded (two profile runs, and one). */
    CU_ASSERT(remote > 0);
    CU_ASSERT(local > 0);
    EXPECT_EQ(rt_declog_count(&l), KEEP);
    rt_declog_actual(&l, seqs[N_DECISIONS - 3], 48);
    for (int k = 0; k < KEEP; k++) {
        int actual = 0;
        EXPECT_STR(rt_declog_json(&l, k, &actual), live[N_DECISIONS - 1 - k]);
        EXPECT_EQ(actual, k == 2 ? 48 : -1);
    }
    int actual;
    CU_ASSERT_PTR_NULL(rt_declog_json(&l, KEEP, &actual));
    CU_ASSERT_PTR_NULL(rt_declog_json(&l, -1, &actual));
    printf("\n  %s\n", live[N_DECISIONS - 1]);
    for (int i = 0; i < N_DECISIONS; i++)
        free(live[i]);
    rt_declog_fini(&l);
    rt_pipeline_destroy(pl);
}

static void test_lazy_equals_live(void)
{
    check_lazy_equals_live(rt_default_routing());
    /* The load-aware decider writes its costs too. */
    check_lazy_equals_live(HDR "plugins:\n- type: decode-filter\n- type: prefill-filter\n"
                               "- type: prefix-cache-scorer\n  parameters: {mode: precise}\n"
                               "- type: queue-scorer\n- type: kv-cache-utilization-scorer\n"
                               "- type: load-aware-pd-decider\n"
                               "  parameters:\n    nonCachedTokens: 128\n"
                               "    transferOverheadTokens: 64\n    decodeInterference: 1\n"
                               "- type: pd-profile-handler\n"
                               "  parameters: {deciderPluginName: load-aware-pd-decider}\n"
                               "schedulingProfiles:\n"
                               "- name: decode\n  plugins:\n  - pluginRef: decode-filter\n"
                               "  - pluginRef: prefix-cache-scorer\n    weight: 3\n"
                               "  - pluginRef: queue-scorer\n    weight: 0.25\n"
                               "  - pluginRef: kv-cache-utilization-scorer\n    weight: 1\n"
                               "- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n"
                               "  - pluginRef: queue-scorer\n    weight: 1\n");
}

static const struct rt_decision *decide_one(struct rt_pipeline *pl, uint32_t seed)
{
    struct req b;
    const struct rt_decision *d = NULL;
    CU_ASSERT_EQUAL_FATAL(rt_pipeline_decide(pl, mk_req(&b, 40, seed), &d), 0);
    return d;
}

/* An endpoint removed and its slot taken by another: older records still
 * name the old one, whether read before or after a record names the new. */
static void test_reused_slot_named_right(void)
{
    struct rt_pipeline *pl = mk(QUEUE_ONLY);
    int a = add_ep(pl, "w-a", RT_ROLE_COLOCATED);
    int b = add_ep(pl, "w-b", RT_ROLE_COLOCATED);
    set_load(pl, b, 9, 0, 0); /* a wins */
    struct rt_declog l;
    CU_ASSERT_EQUAL_FATAL(rt_declog_init(&l, 4), 0);
    const struct rt_decision *d = decide_one(pl, 1);
    EXPECT_EQ(d->decode, a);
    char *first = live_text(pl, d);
    CU_ASSERT_PTR_NOT_NULL(strstr(first, "\"decode\":\"w-a\""));
    rt_declog_add(&l, pl, d);

    /* a goes; c takes its slot, goes too; e takes it: no decision meanwhile. */
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_remove(pl, a), 0);
    EXPECT_EQ(add_ep(pl, "w-c", RT_ROLE_COLOCATED), a);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_remove(pl, a), 0);
    EXPECT_EQ(add_ep(pl, "w-e", RT_ROLE_COLOCATED), a);
    int actual;
    EXPECT_STR(rt_declog_json(&l, 0, &actual), first);

    /* A decision that names only b leaves the first record as it was. */
    rt_pipeline_endpoint_set_healthy(pl, a, 0);
    d = decide_one(pl, 2);
    EXPECT_EQ(d->decode, b);
    char *second = live_text(pl, d);
    rt_declog_add(&l, pl, d);
    EXPECT_STR(rt_declog_json(&l, 1, &actual), first);

    /* One that names the slot's new endpoint: the first is written now. */
    rt_pipeline_endpoint_set_healthy(pl, a, 1);
    d = decide_one(pl, 3);
    EXPECT_EQ(d->decode, a);
    char *third = live_text(pl, d);
    CU_ASSERT_PTR_NOT_NULL(strstr(third, "\"decode\":\"w-e\""));
    rt_declog_add(&l, pl, d);
    EXPECT_STR(rt_declog_json(&l, 0, &actual), third);
    EXPECT_STR(rt_declog_json(&l, 1, &actual), second);
    EXPECT_STR(rt_declog_json(&l, 2, &actual), first);

    /* b goes and w-f takes its slot: both older records naming b keep w-b. */
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_remove(pl, b), 0);
    EXPECT_EQ(add_ep(pl, "w-f", RT_ROLE_COLOCATED), b);
    set_load(pl, a, 9, 0, 0); /* f wins */
    d = decide_one(pl, 4);
    EXPECT_EQ(d->decode, b);
    char *fourth = live_text(pl, d);
    rt_declog_add(&l, pl, d);
    EXPECT_STR(rt_declog_json(&l, 0, &actual), fourth);
    EXPECT_STR(rt_declog_json(&l, 1, &actual), third);
    EXPECT_STR(rt_declog_json(&l, 2, &actual), second);
    EXPECT_STR(rt_declog_json(&l, 3, &actual), first);

    /* The ring wraps over the records written as text: the slot's buffers
     * are reused for lazy ones. */
    char *more[4];
    for (int i = 0; i < 4; i++) {
        d = decide_one(pl, 5 + (uint32_t)i);
        more[i] = live_text(pl, d);
        rt_declog_add(&l, pl, d);
    }
    for (int k = 0; k < 4; k++)
        EXPECT_STR(rt_declog_json(&l, k, &actual), more[3 - k]);
    for (int i = 0; i < 4; i++)
        free(more[i]);
    free(first);
    free(second);
    free(third);
    free(fourth);
    rt_declog_fini(&l);
    rt_pipeline_destroy(pl);
}

/* --decisions 0 keeps nothing. */
static void test_keeps_none(void)
{
    struct rt_pipeline *pl = mk(QUEUE_ONLY);
    add_ep(pl, "w-a", RT_ROLE_COLOCATED);
    struct rt_declog l;
    CU_ASSERT_EQUAL_FATAL(rt_declog_init(&l, 0), 0);
    rt_declog_add(&l, pl, decide_one(pl, 1));
    EXPECT_EQ(rt_declog_count(&l), 0);
    int actual;
    CU_ASSERT_PTR_NULL(rt_declog_json(&l, 0, &actual));
    rt_declog_fini(&l);
    rt_pipeline_destroy(pl);
}

/* At debug level every decision is logged as the live text, kept or not
 * (--decisions 0). stderr goes to a file meanwhile. */
static void test_debug_log(void)
{
    struct rt_pipeline *pl = mk(rt_default_routing());
    add_ep(pl, "p0", RT_ROLE_PREFILL);
    add_ep(pl, "d0", RT_ROLE_DECODE);
    add_ep(pl, "d1", RT_ROLE_DECODE);
    struct rt_declog kept, none;
    CU_ASSERT_EQUAL_FATAL(rt_declog_init(&kept, 2), 0);
    CU_ASSERT_EQUAL_FATAL(rt_declog_init(&none, 0), 0);
    char path[] = "/tmp/test_rt_declog_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    CU_ASSERT_FATAL(saved >= 0 && dup2(fd, 2) == 2);
    log_set_level(LOG_LEVEL_DEBUG);
    char *live[4];
    for (int i = 0; i < 4; i++) {
        struct req b;
        const struct rt_decision *d = NULL;
        CU_ASSERT_EQUAL_FATAL(rt_pipeline_decide(pl, mk_req(&b, 300 + 100 * i, 9), &d), 0);
        live[i] = live_text(pl, d);
        rt_declog_add(i < 2 ? &none : &kept, pl, d);
    }
    log_set_level(LOG_LEVEL_INFO);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fdopen(fd, "r");
    CU_ASSERT_FATAL(f != NULL);
    rewind(f);
    static char line[1 << 16];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *json = strstr(line, "decision: ");
        if (json == NULL)
            continue;
        json += strlen("decision: ");
        line[strcspn(line, "\n")] = 0;
        if (n < 4)
            EXPECT_STR(json, live[n]);
        n++;
    }
    EXPECT_EQ(n, 4);
    fclose(f);
    unlink(path);
    for (int i = 0; i < 4; i++)
        free(live[i]);
    rt_declog_fini(&kept);
    rt_declog_fini(&none);
    rt_pipeline_destroy(pl);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("rt_declog", NULL, NULL);
    CU_add_test(s, "lazy_equals_live", test_lazy_equals_live);
    CU_add_test(s, "reused_slot_named_right", test_reused_slot_named_right);
    CU_add_test(s, "keeps_none", test_keeps_none);
    CU_add_test(s, "debug_log", test_debug_log);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
