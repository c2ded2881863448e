/* The offline simulator (simulate/): timing plumbing against its own model,
 * determinism, the P/D hand-off's KV frames, the prefix index fed by the
 * workers' KV events, and the refusal of a backend without a cost model.
 * Everything runs the production router, worker and load-generator code in
 * modelled time; no process, no socket. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster.h"
#include "log.h"
#include "simulate.h"
#include "tandem_err.h"
#include "timeline.h"

#define EXPECT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (tol))) {                                                           \
            fprintf(stderr, "\n%s:%d: %s = %.9g, want %.9g (+- %g)\n", __FILE__, __LINE__, #a, a_, \
                    b_, (double)(tol));                                                            \
        }                                                                                          \
        CU_ASSERT(fabs(a_ - b_) <= (tol));                                                         \
    } while (0)

static const char *COLO1 = "name: colo1\nmodel: llama-3-8b\nbackend: sim\nblock_size: 16\n"
                           "pools:\n  colocated:\n    count: 1\n";

/* 1 prefill + 1 decode worker, always disaggregated, over tcp:// with
 * ephemeral ports (every worker's planned address is tcp://127.0.0.1:0:
 * live they bind and announce theirs; offline each gets its own). */
static const char *pd_yaml(void)
{
    static char yaml[512];
    const char *src = getenv("TANDEM_SOURCE_DIR");
    snprintf(yaml, sizeof(yaml),
             "name: pd\nmodel: llama-3-8b\nbackend: sim\nblock_size: 16\n"
             "routing: %s/deploy/routing/pd-always.yaml\n"
             "transport:\n  kind: tcp\n  host: 127.0.0.1\n  base_port: 0\n"
             "pools:\n  prefill:\n    count: 1\n  decode:\n    count: 1\n",
             src ? src : ".");
    return yaml;
}

static struct cluster *parse(const char *yaml)
{
    struct cluster *c = NULL;
    char err[1024] = "";
    int rc = cluster_parse(&c, yaml, strlen(yaml), "test.yaml", NULL, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "\ncluster: %s\n", err);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return c;
}

/* A P/D cluster of n_prefill + n_decode sim workers (default transport),
 * always disaggregated; decode_extra is appended to the decode pool's keys
 * (each "    key: value\n"), "" for none. */
static struct cluster *parse_pd(const char *name, int n_prefill, int n_decode,
                                const char *decode_extra)
{
    const char *src = getenv("TANDEM_SOURCE_DIR");
    char yaml[640];
    snprintf(yaml, sizeof(yaml),
             "name: %s\nmodel: llama-3-8b\nbackend: sim\nblock_size: 16\n"
             "routing: %s/deploy/routing/pd-always.yaml\n"
             "pools:\n  prefill:\n    count: %d\n  decode:\n    count: %d\n%s",
             name, src ? src : ".", n_prefill, n_decode, decode_extra);
    return parse(yaml);
}

/* Random prompts of in tokens, out tokens each (ignore_eos), n requests at rate. */
static void workload(struct lg_run_config *r, int n, double rate, int in, int out)
{
    lg_run_config_default(r);
    r->num_prompts = n;
    r->request_rate = rate;
    r->workload.random_input_len = in;
    r->workload.random_output_len = out;
    r->workload.random_range_ratio = 0;
    r->workload.seed = 7;
    r->request_timeout_s = 600;
}

static int run(const struct cluster *c, const struct lg_run_config *r, double lat_s,
               struct lg_run_result *res, struct sm_stats *st)
{
    struct sm_options o;
    sm_options_default(&o);
    o.ctl_latency_s = lat_s;
    char err[SM_ERR_MAX] = "";
    int rc = sm_run(c, r, &o, res, st, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "\nsm_run: %s\n", err);
    }
    return rc;
}

static void expect_all_ok(const struct lg_run_result *res, size_t n, int out)
{
    CU_ASSERT_EQUAL(res->n, n);
    for (size_t i = 0; i < res->n; i++) {
        CU_ASSERT(res->records[i].ok);
        CU_ASSERT_EQUAL(res->records[i].output_tokens, out);
    }
}

/* One request on an idle worker: its TTFT is the job's trip, the prefill
 * step and the first token's trip back, so one more millisecond of control
 * latency each way adds exactly 2 ms; the decode steps do not move. */
static void test_control_latency(void)
{
    struct cluster *c = parse(COLO1);
    struct lg_run_config r;
    workload(&r, 1, INFINITY, 512, 8);
    struct lg_run_result a, b;
    CU_ASSERT_EQUAL_FATAL(run(c, &r, 0, &a, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(run(c, &r, 1e-3, &b, NULL), 0);
    expect_all_ok(&a, 1, 8);
    expect_all_ok(&b, 1, 8);
    EXPECT_NEAR(b.records[0].ttft_s - a.records[0].ttft_s, 2e-3, 1e-9);
    EXPECT_NEAR(b.records[0].e2el_s - a.records[0].e2el_s, 2e-3, 1e-9);
    CU_ASSERT_EQUAL(a.records[0].n_itl, 7);
    for (uint32_t i = 0; i < a.records[0].n_itl && i < b.records[0].n_itl; i++) {
        EXPECT_NEAR(a.records[0].itl_s[i], b.records[0].itl_s[i], 1e-9);
    }
    /* Llama-3-8B on one H100 at batch 1: weights-bound decode, about
     * 16 GB / (3.35 TB/s x 0.7) + 1 ms (docs/engine.md). */
    EXPECT_NEAR(a.records[0].itl_s[1], 16.06e9 / (3.35e12 * 0.7) + 1e-3, 0.5e-3);
    CU_ASSERT(a.records[0].ttft_s > a.records[0].itl_s[1]);
    lg_run_result_free(&a);
    lg_run_result_free(&b);
    cluster_free(c);
}

static int same_records(const struct lg_run_result *a, const struct lg_run_result *b)
{
    if (a->n != b->n || a->duration_s != b->duration_s) {
        return 0;
    }
    for (size_t i = 0; i < a->n; i++) {
        const struct lg_record *x = &a->records[i], *y = &b->records[i];
        if (x->ttft_s != y->ttft_s || x->e2el_s != y->e2el_s || x->start_s != y->start_s ||
            x->n_itl != y->n_itl || x->output_tokens != y->output_tokens ||
            x->cached_tokens != y->cached_tokens || x->ok != y->ok ||
            x->prompt_tokens != y->prompt_tokens || x->n_chunks != y->n_chunks) {
            return 0;
        }
        for (uint32_t j = 0; j < x->n_itl; j++) {
            if (x->itl_s[j] != y->itl_s[j]) {
                return 0;
            }
        }
    }
    return 1;
}

/* The same inputs give the same records, to the bit. */
static void test_deterministic(void)
{
    struct cluster *c = parse(pd_yaml());
    struct lg_run_config r;
    workload(&r, 40, 30, 300, 12);
    struct lg_run_result a, b;
    CU_ASSERT_EQUAL_FATAL(run(c, &r, 50e-6, &a, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(run(c, &r, 50e-6, &b, NULL), 0);
    expect_all_ok(&a, 40, 12);
    CU_ASSERT(same_records(&a, &b));
    lg_run_result_free(&b);
    /* Another seed gives other arrivals: the comparison can fail. */
    r.workload.seed = 8;
    CU_ASSERT_EQUAL_FATAL(run(c, &r, 50e-6, &b, NULL), 0);
    CU_ASSERT(!same_records(&a, &b));
    lg_run_result_free(&a);
    lg_run_result_free(&b);
    cluster_free(c);
}

/* Disaggregated: every block of every prompt crosses the data link once
 * (random prompts share nothing), and the first token waits for it. */
static void test_pd_frames(void)
{
    struct cluster *pd = parse(pd_yaml()), *colo = parse(COLO1);
    struct lg_run_config r;
    workload(&r, 10, 2, 1000, 4);
    struct lg_run_result a, b;
    struct sm_stats st;
    CU_ASSERT_EQUAL_FATAL(run(pd, &r, 50e-6, &a, &st), 0);
    CU_ASSERT_EQUAL_FATAL(run(colo, &r, 50e-6, &b, NULL), 0);
    expect_all_ok(&a, 10, 4);
    expect_all_ok(&b, 10, 4);
    uint64_t blocks = 0;
    for (size_t i = 0; i < a.n; i++) {
        blocks += (uint64_t)(a.records[i].prompt_tokens + 15) / 16;
        /* Low rate: both idle for every request; P/D adds the transfer. */
        CU_ASSERT(a.records[i].ttft_s > b.records[i].ttft_s);
    }
    CU_ASSERT_EQUAL(st.kv_frames, blocks);
    CU_ASSERT_EQUAL(st.workers, 2);
    lg_run_result_free(&a);
    lg_run_result_free(&b);
    cluster_free(pd);
    cluster_free(colo);
}

static void on_sample(void *arg, double now, const struct rt_pipeline *pl)
{
    CU_ASSERT_EQUAL(tl_sample_pipeline(arg, now, pl), 0);
}

/* --timeline offline: a sample every 0.5 modelled s from 0 while the
 * workload runs, both workers in each as the router sees them; every
 * request picked the decode worker once and the prefill worker once (P/D
 * always, no retry), so the picks of the two are equal, only grow, and
 * reach the requests decided. timeline.csv and .svg are written. */
static void test_timeline(void)
{
    struct cluster *c = parse(pd_yaml());
    struct lg_run_config r;
    workload(&r, 10, 2, 200, 4);
    struct sm_options o;
    sm_options_default(&o);
    struct timeline tl;
    tl_init(&tl);
    o.sample_s = 0.5;
    o.on_sample = on_sample;
    o.sample_arg = &tl;
    struct lg_run_result res;
    char err[SM_ERR_MAX] = "";
    CU_ASSERT_EQUAL_FATAL(sm_run(c, &r, &o, &res, NULL, err, sizeof(err)), 0);
    expect_all_ok(&res, 10, 4);
    CU_ASSERT_FATAL(tl.n >= 2);
    CU_ASSERT_EQUAL(tl.n_workers, 2);
    for (size_t i = 0; i < tl.n; i++) {
        EXPECT_NEAR(tl.s[i].t, 0.5 * (double)i, 1e-9);
        CU_ASSERT(tl.s[i].v[0].seen && tl.s[i].v[1].seen);
        for (int w = 0; i > 0 && w < 2; w++) {
            CU_ASSERT(tl.s[i].v[w].picks >= tl.s[i - 1].v[w].picks);
            /* P/D always: each decision picks one of each. */
            EXPECT_NEAR(tl.s[i].v[w].picks, tl.s[i].v[1 - w].picks, 0);
            CU_ASSERT(tl_picks_rate(&tl, i, w) >= 0);
        }
    }
    /* The last sample is taken less than 0.5 s before the last answer: at
     * least 9 of the 10 requests (seed 7's arrivals) were decided by then. */
    CU_ASSERT(tl.s[tl.n - 1].v[0].picks >= 9 && tl.s[tl.n - 1].v[0].picks <= 10);
    char dir[] = "/tmp/tandem-timeline-XXXXXX";
    CU_ASSERT_FATAL(mkdtemp(dir) != NULL);
    CU_ASSERT_EQUAL(tl_write(&tl, dir, "test", err, sizeof(err)), 0);
    const char *files[] = {"timeline.csv", "timeline.svg", "timeline.png"};
    for (int i = 0; i < 3; i++) {
        char p[128];
        snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
        CU_ASSERT(i == 2 || access(p, R_OK) == 0);
        unlink(p);
    }
    rmdir(dir);
    tl_fini(&tl);
    lg_run_result_free(&res);
    cluster_free(c);
}
/* Requests that found exactly their system prompt cached. */
static int hits_of(const struct lg_run_result *res, int64_t system_len)
{
    int hits = 0;
    for (size_t i = 0; i < res->n; i++) {
        hits += res->records[i].cached_tokens == system_len;
    }
    return hits;
}

/* Precise prefix routing sees the workers' KV events: in a shared-prefix
 * workload of 4 groups on 4 workers, every request but each group's first
 * finds its 512-token system prompt cached (60 of 64); round-robin spreads
 * each group over the 4 workers and misses once per group and worker (48). */
static void test_prefix_index_fed(void)
{
    char yaml[512];
    const char *routings[] = {"prefix-aware-precise.yaml", "round-robin.yaml"};
    int hits[2];
    const char *src = getenv("TANDEM_SOURCE_DIR");
    CU_ASSERT_PTR_NOT_NULL_FATAL(src);
    for (int k = 0; k < 2; k++) {
        snprintf(yaml, sizeof(yaml),
                 "name: px\nmodel: llama-3-8b\nbackend: sim\nblock_size: 16\n"
                 "routing: %s/deploy/routing/%s\npools:\n  colocated:\n    count: 4\n",
                 src, routings[k]);
        struct cluster *c = parse(yaml);
        struct lg_run_config r;
        workload(&r, 64, 20, 0, 8);
        r.workload.dataset = LG_DATASET_SHARED_PREFIX;
        r.workload.gsp_num_groups = 4;
        r.workload.gsp_prompts_per_group = 16;
        r.workload.gsp_system_prompt_len = 512;
        r.workload.gsp_question_len = 32;
        r.workload.gsp_output_len = 8;
        struct lg_run_result res;
        CU_ASSERT_EQUAL_FATAL(run(c, &r, 50e-6, &res, NULL), 0);
        expect_all_ok(&res, 64, 8);
        hits[k] = hits_of(&res, 512);
        lg_run_result_free(&res);
        cluster_free(c);
    }
    CU_ASSERT_EQUAL(hits[0], 60);
    CU_ASSERT_EQUAL(hits[1], 48);
}

/* A decode worker killed mid-run: its requests are retried (before their
 * first token) or recovered (after), elsewhere, and every one completes
 * with all its tokens; a prefill worker killed and restarted likewise. */
static void test_worker_failure(void)
{
    struct cluster *c = parse_pd("f", 2, 2, "");
    struct lg_run_config r;
    workload(&r, 100, 20, 1024, 64);
    struct sm_options o;
    sm_options_default(&o);
    o.fails[0] = (struct sm_fail){.worker = "decode-0", .at_s = 2.0, .restart_s = -1};
    o.fails[1] = (struct sm_fail){.worker = "prefill-1", .at_s = 3.0, .restart_s = 0.5};
    o.n_fails = 2;
    struct lg_run_result res;
    struct sm_stats st;
    char err[SM_ERR_MAX];
    int rc = sm_run(c, &r, &o, &res, &st, err, sizeof(err));
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    expect_all_ok(&res, 100, 64);
    CU_ASSERT(st.dispatch.recoveries > 0);
    CU_ASSERT(st.dispatch.failures > 0);
    lg_run_result_free(&res);
    /* A name the cluster does not have is refused. */
    o.fails[0].worker = "decode-7";
    CU_ASSERT_EQUAL(sm_run(c, &r, &o, &res, &st, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "decode-7"));
    cluster_free(c);
}

/* The default cluster's shape, one prefill and one decode worker: the
 * decode worker killed at 2 s (restarted 0.6 s later), then the prefill
 * worker at 3 s (0.5 s): no request fails. Requests are held while no
 * decode worker is up (those in flight recovered on the restarted one), and
 * prefilled on the decode worker while no prefill worker is. */
static void test_worker_failure_1p1d(void)
{
    struct cluster *c = parse_pd("f", 1, 1, "");
    struct lg_run_config r;
    workload(&r, 100, 20, 1024, 64);
    struct sm_options o;
    sm_options_default(&o);
    o.fails[0] = (struct sm_fail){.worker = "decode-0", .at_s = 2.0, .restart_s = 0.6};
    o.fails[1] = (struct sm_fail){.worker = "prefill-0", .at_s = 3.0, .restart_s = 0.5};
    o.n_fails = 2;
    struct lg_run_result res;
    struct sm_stats st;
    char err[SM_ERR_MAX];
    CU_ASSERT_EQUAL_FATAL(sm_run(c, &r, &o, &res, &st, err, sizeof(err)), 0);
    expect_all_ok(&res, 100, 64);
    CU_ASSERT(st.dispatch.held > 0);
    CU_ASSERT_EQUAL(st.dispatch.hold_expired, 0);
    CU_ASSERT(st.dispatch.recoveries > 0);
    CU_ASSERT(st.dispatch.pd_fallbacks > 0);
    lg_run_result_free(&res);
    cluster_free(c);
}

/* Token chunks travel as fields and reach the client as data (the fast
 * paths); packed, rendered to SSE JSON and parsed back (the reference,
 * pack_all), the run is the same to the bit. Completions, and multi-turn
 * chat: each turn's
 * prompt holds the previous answers' text, so a text the fast path got
 * wrong would change later prompts; the first chunk of each answer carries
 * the chat role (no token counted when its text is empty). */
static void test_fast_paths(void)
{
    struct cluster *c = parse(pd_yaml());
    for (int api = 0; api < 2; api++) {
        struct lg_run_config r;
        workload(&r, 12, 20, 40, 9);
        if (api) { /* multi-turn is chat only */
            r.workload.api = LG_API_CHAT;
            r.path = "/v1/chat/completions";
            r.workload.dataset = LG_DATASET_MULTI_TURN;
            r.workload.mt_turns = 3;
            r.workload.mt_input_len = 40;
            r.workload.mt_output_len = 9;
        }
        struct lg_run_result a, b;
        struct sm_stats sa, sb;
        struct sm_options o;
        char err[SM_ERR_MAX] = "";
        sm_options_default(&o);
        CU_ASSERT_EQUAL_FATAL(sm_run(c, &r, &o, &a, &sa, err, sizeof(err)), 0);
        o.pack_all = 1;
        CU_ASSERT_EQUAL_FATAL(sm_run(c, &r, &o, &b, &sb, err, sizeof(err)), 0);
        expect_all_ok(&a, 12, 9);
        CU_ASSERT(same_records(&a, &b));
        CU_ASSERT_EQUAL(sa.messages, sb.messages);
        CU_ASSERT_EQUAL(sa.events, sb.events);
        if (api) { /* later turns carry the earlier answers: their prompts grow */
            CU_ASSERT(a.records[2].prompt_tokens > a.records[0].prompt_tokens + 9);
        }
        lg_run_result_free(&a);
        lg_run_result_free(&b);
    }
    cluster_free(c);
}

/* A decode worker whose KV pool is full: a preempted sequence waits for
 * blocks that the transfers in flight hold. Its steps move nothing until a
 * transfer lands (a message, which kicks it); a worker that stepped again
 * after a step that moved nothing would do so forever at one modelled time
 * (the run never ended: the P:D search hung at 5P11D for 16 GPUs). The run
 * ends, with every request complete. */
static void test_idle_until_kicked(void)
{
    struct cluster *c = parse_pd("k", 3, 1, "    kv_blocks: 66\n");
    struct lg_run_config r;
    workload(&r, 24, INFINITY, 512, 256);
    struct lg_run_result res;
    struct sm_stats st;
    CU_ASSERT_EQUAL_FATAL(run(c, &r, 50e-6, &res, &st), 0);
    expect_all_ok(&res, 24, 256);
    lg_run_result_free(&res);
    cluster_free(c);
}

static void test_refuses_tiny(void)
{
    struct cluster *c = NULL;
    char err[1024];
    CU_ASSERT_EQUAL_FATAL(cluster_default(&c, err, sizeof(err)), 0);
    struct lg_run_config r;
    workload(&r, 1, 1, 16, 2);
    struct sm_options o;
    sm_options_default(&o);
    struct lg_run_result res;
    int rc = sm_run(c, &r, &o, &res, NULL, err, sizeof(err));
    CU_ASSERT_EQUAL(rc, TANDEM_ECONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "sim backend"));
    cluster_free(c);
}

int main(void)
{
    log_init("test", LOG_LEVEL_WARN);
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("simulate", NULL, NULL);
    CU_add_test(s, "control_latency", test_control_latency);
    CU_add_test(s, "deterministic", test_deterministic);
    CU_add_test(s, "pd_frames", test_pd_frames);
    CU_add_test(s, "timeline", test_timeline);
    CU_add_test(s, "prefix_index_fed", test_prefix_index_fed);
    CU_add_test(s, "worker_failure", test_worker_failure);
    CU_add_test(s, "worker_failure_1p1d", test_worker_failure_1p1d);
    CU_add_test(s, "fast_paths", test_fast_paths);
    CU_add_test(s, "refuses_tiny", test_refuses_tiny);
    CU_add_test(s, "idle_until_kicked", test_idle_until_kicked);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
