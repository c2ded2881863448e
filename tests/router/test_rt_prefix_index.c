/* Prefix index: approx LRU behaviour, precise event sequences, and a
 * randomised run against a naive model (seed printed; TANDEM_SEED replays). */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "prefix_index.h"
#include "tandem_err.h"

#define N_EPS 4

static struct rt_prefix_index *make(uint32_t cap)
{
    struct rt_prefix_index *ix = NULL;
    CU_ASSERT_EQUAL_FATAL(rt_prefix_index_create(&ix, N_EPS, cap), 0);
    return ix;
}

static void test_create_args(void)
{
    struct rt_prefix_index *ix = NULL;
    CU_ASSERT_EQUAL(rt_prefix_index_create(&ix, 0, 10), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(rt_prefix_index_create(&ix, 4, 0), TANDEM_EINVAL);
    CU_ASSERT_PTR_NULL(ix);
    ix = make(10);
    uint64_t h = 1;
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, N_EPS, &h, 1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, -1, &h, 1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 0, &h, -1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 0, NULL, 0), 0);
    rt_prefix_index_destroy(ix);
}

static void test_match_leading(void)
{
    struct rt_prefix_index *ix = make(100);
    uint64_t a[] = {11, 12, 13}, b[] = {11, 12}, q[] = {11, 12, 13, 14};
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 0, a, 3), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 1, b, 2), 0);
    uint32_t m[N_EPS];
    CU_ASSERT_EQUAL(rt_prefix_index_match(ix, q, 4, m), 3);
    CU_ASSERT_EQUAL(m[0], 3);
    CU_ASSERT_EQUAL(m[1], 2);
    CU_ASSERT_EQUAL(m[2], 0);
    CU_ASSERT_EQUAL(m[3], 0);
    CU_ASSERT_EQUAL(rt_prefix_index_match_one(ix, 0, q, 4), 3);
    CU_ASSERT_EQUAL(rt_prefix_index_match_one(ix, 1, q, 4), 2);
    /* Only exact leading runs count: ep 2 holds blocks 0 and 2 but not 1. */
    uint64_t gap[] = {11, 13};
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 2, gap, 2), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_match(ix, q, 4, m), 3);
    CU_ASSERT_EQUAL(m[2], 1);
    /* A first block nobody holds matches nothing. */
    uint64_t miss[] = {99, 11};
    CU_ASSERT_EQUAL(rt_prefix_index_match(ix, miss, 2, m), 0);
    CU_ASSERT_EQUAL(m[0] + m[1] + m[2] + m[3], 0);
    CU_ASSERT_EQUAL(rt_prefix_index_match(ix, q, 0, m), 0);
    struct rt_prefix_index_stats st;
    rt_prefix_index_stats(ix, &st);
    CU_ASSERT_EQUAL(st.nodes, 7);
    CU_ASSERT_EQUAL(st.hashes, 3);
    CU_ASSERT_EQUAL(rt_prefix_index_check(ix), 0);
    rt_prefix_index_destroy(ix);
}

/* Touching [1,2,3] stores 3, 2, 1 in that order, so 1 is most recent. */
static void test_approx_lru(void)
{
    struct rt_prefix_index *ix = make(4);
    uint64_t p1[] = {1, 2, 3}, p2[] = {10, 11};
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 0, p1, 3), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 0, p2, 2), 0);
    /* Recency was 1,2,3; then 11 (room), then 10 evicts the tail block 3. */
    CU_ASSERT_EQUAL(rt_prefix_index_count(ix, 0), 4);
    CU_ASSERT_TRUE(rt_prefix_index_holds(ix, 0, 1));
    CU_ASSERT_TRUE(rt_prefix_index_holds(ix, 0, 2));
    CU_ASSERT_FALSE(rt_prefix_index_holds(ix, 0, 3));
    CU_ASSERT_TRUE(rt_prefix_index_holds(ix, 0, 10));
    CU_ASSERT_TRUE(rt_prefix_index_holds(ix, 0, 11));
    CU_ASSERT_EQUAL(rt_prefix_index_match_one(ix, 0, p1, 3), 2);
    /* Recency now 10, 11, 1, 2. Touch [2] refreshes it: 2, 10, 11, 1. */
    uint64_t two = 2, nine = 9, eight = 8;
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 0, &two, 1), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 0, &nine, 1), 0); /* evicts 1 */
    CU_ASSERT_FALSE(rt_prefix_index_holds(ix, 0, 1));
    CU_ASSERT_TRUE(rt_prefix_index_holds(ix, 0, 2));
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 0, &eight, 1), 0); /* evicts 11 */
    CU_ASSERT_FALSE(rt_prefix_index_holds(ix, 0, 11));
    CU_ASSERT_TRUE(rt_prefix_index_holds(ix, 0, 10));
    struct rt_prefix_index_stats st;
    rt_prefix_index_stats(ix, &st);
    CU_ASSERT_EQUAL(st.evictions, 3);
    CU_ASSERT_EQUAL(st.nodes, 4);
    /* Capacity is per endpoint: ep 1 is unaffected by ep 0's evictions. */
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 1, p1, 3), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_count(ix, 1), 3);
    CU_ASSERT_EQUAL(rt_prefix_index_count(ix, 0), 4);
    /* A prompt longer than the capacity keeps its leading blocks. */
    uint64_t longp[] = {101, 102, 103, 104, 105, 106};
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 2, longp, 6), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_match_one(ix, 2, longp, 6), 4);
    CU_ASSERT_EQUAL(rt_prefix_index_check(ix), 0);
    rt_prefix_index_destroy(ix);
}

static void test_precise_events(void)
{
    struct rt_prefix_index *ix = make(1000);
    uint64_t blocks[] = {0xA1, 0xA2, 0xA3, 0xA4};
    uint32_t m[N_EPS];
    CU_ASSERT_EQUAL(rt_prefix_index_store(ix, 1, blocks, 4), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_store(ix, 3, blocks, 2), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_match(ix, blocks, 4, m), 4);
    CU_ASSERT_EQUAL(m[1], 4);
    CU_ASSERT_EQUAL(m[3], 2);
    /* REMOVED of the second block cuts ep 1's match after the first. */
    CU_ASSERT_EQUAL(rt_prefix_index_remove(ix, 1, &blocks[1], 1), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_match(ix, blocks, 4, m), 2);
    CU_ASSERT_EQUAL(m[1], 1);
    CU_ASSERT_EQUAL(m[3], 2);
    /* Stored again (re-prefilled): full match again. */
    CU_ASSERT_EQUAL(rt_prefix_index_store(ix, 1, &blocks[1], 1), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_match_one(ix, 1, blocks, 4), 4);
    /* A duplicate STORED does not double count. */
    CU_ASSERT_EQUAL(rt_prefix_index_store(ix, 1, blocks, 4), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_count(ix, 1), 4);
    /* REMOVED of something not held is counted and ignored. */
    uint64_t unknown = 0xDEAD;
    CU_ASSERT_EQUAL(rt_prefix_index_remove(ix, 1, &unknown, 1), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_remove(ix, 0, blocks, 1), 0);
    struct rt_prefix_index_stats st;
    rt_prefix_index_stats(ix, &st);
    CU_ASSERT_EQUAL(st.removed_unknown, 2);
    CU_ASSERT_EQUAL(st.nodes, 6);
    /* ALL_CLEARED for ep 1 leaves ep 3 alone. */
    rt_prefix_index_clear_endpoint(ix, 1);
    CU_ASSERT_EQUAL(rt_prefix_index_match(ix, blocks, 4, m), 2);
    CU_ASSERT_EQUAL(m[1], 0);
    CU_ASSERT_EQUAL(m[3], 2);
    CU_ASSERT_EQUAL(rt_prefix_index_count(ix, 1), 0);
    rt_prefix_index_stats(ix, &st);
    CU_ASSERT_EQUAL(st.nodes, 2);
    CU_ASSERT_EQUAL(st.hashes, 2);
    rt_prefix_index_clear_endpoint(ix, 3);
    rt_prefix_index_stats(ix, &st);
    CU_ASSERT_EQUAL(st.nodes, 0);
    CU_ASSERT_EQUAL(st.hashes, 0);
    CU_ASSERT_EQUAL(rt_prefix_index_check(ix), 0);
    rt_prefix_index_destroy(ix);
}

/* Past one pool chunk and many shard doublings, then everything evicted. */
static void test_large(void)
{
    struct rt_prefix_index *ix = NULL;
    CU_ASSERT_EQUAL_FATAL(rt_prefix_index_create(&ix, 3, 40000), 0);
    enum { N = 60000 };
    uint64_t *h = malloc(sizeof(uint64_t) * N);
    for (int i = 0; i < N; i++)
        h[i] = 0x1000000ull + (uint64_t)i * 7919;
    CU_ASSERT_EQUAL(rt_prefix_index_store(ix, 0, h, N), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, 1, h, 30000), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_count(ix, 0), 40000);
    CU_ASSERT_EQUAL(rt_prefix_index_count(ix, 1), 30000);
    /* store() keeps the latest 40000: hashes 20000.. */
    CU_ASSERT_EQUAL(rt_prefix_index_match_one(ix, 0, h, N), 0);
    CU_ASSERT_EQUAL(rt_prefix_index_match_one(ix, 0, h + 20000, N - 20000), 40000);
    uint32_t m[3];
    CU_ASSERT_EQUAL(rt_prefix_index_match(ix, h, N, m), 30000);
    CU_ASSERT_EQUAL(m[1], 30000);
    CU_ASSERT_EQUAL(m[0], 0);
    struct rt_prefix_index_stats st;
    rt_prefix_index_stats(ix, &st);
    CU_ASSERT_EQUAL(st.nodes, 70000);
    CU_ASSERT_EQUAL(st.hashes, 60000); /* 0..29999 by ep 1, 20000..59999 by ep 0 */
    CU_ASSERT_EQUAL(st.evictions, 20000);
    CU_ASSERT_EQUAL(rt_prefix_index_check(ix), 0);
    rt_prefix_index_clear_endpoint(ix, 0);
    rt_prefix_index_clear_endpoint(ix, 1);
    rt_prefix_index_stats(ix, &st);
    CU_ASSERT_EQUAL(st.nodes, 0);
    CU_ASSERT_EQUAL(st.hashes, 0);
    CU_ASSERT_EQUAL(rt_prefix_index_check(ix), 0);
    free(h);
    rt_prefix_index_destroy(ix);
}

/* ---- randomised run against a naive model ---- */

#define R_EPS  6
#define R_CAP  150
#define R_UNIV 2500
#define R_OPS  300000
#define R_MAXN 24

struct model {
    uint64_t h[R_EPS][R_CAP]; /* most recent first */
    int n[R_EPS];
};

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int model_find(const struct model *m, int ep, uint64_t h)
{
    for (int i = 0; i < m->n[ep]; i++)
        if (m->h[ep][i] == h)
            return i;
    return -1;
}

static void model_drop(struct model *m, int ep, int i)
{
    memmove(&m->h[ep][i], &m->h[ep][i + 1], sizeof(uint64_t) * (size_t)(m->n[ep] - i - 1));
    m->n[ep]--;
}

static void model_hold(struct model *m, int ep, uint64_t h)
{
    int i = model_find(m, ep, h);
    if (i >= 0)
        model_drop(m, ep, i);
    else if (m->n[ep] == R_CAP)
        m->n[ep]--;
    memmove(&m->h[ep][1], &m->h[ep][0], sizeof(uint64_t) * (size_t)m->n[ep]);
    m->h[ep][0] = h;
    m->n[ep]++;
}

static void test_randomised(void)
{
    const char *env = getenv("TANDEM_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    printf("\n  test_randomised seed=%" PRIu64 " (TANDEM_SEED=%" PRIu64 " replays)\n", seed, seed);
    rng_state = seed;
    struct rt_prefix_index *ix = NULL;
    CU_ASSERT_EQUAL_FATAL(rt_prefix_index_create(&ix, R_EPS, R_CAP), 0);
    struct model *m = calloc(1, sizeof(*m));
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    uint64_t hs[R_MAXN];
    uint32_t matched[R_EPS];
    int bad = 0;
    for (int op = 0; op < R_OPS && !bad; op++) {
        int ep = (int)(rnd() % R_EPS);
        int n = (int)(rnd() % R_MAXN);
        /* Prompts share prefixes: a random start in a small universe, then a run. */
        uint64_t base = rnd() % R_UNIV;
        for (int i = 0; i < n; i++)
            hs[i] = (rnd() % 4 == 0) ? rnd() % R_UNIV : (base + (uint64_t)i) % R_UNIV;
        int kind = (int)(rnd() % 100);
        if (kind < 45) {
            CU_ASSERT_EQUAL(rt_prefix_index_touch(ix, ep, hs, n), 0);
            for (int i = n - 1; i >= 0; i--)
                model_hold(m, ep, hs[i]);
        } else if (kind < 75) {
            CU_ASSERT_EQUAL(rt_prefix_index_store(ix, ep, hs, n), 0);
            for (int i = 0; i < n; i++)
                model_hold(m, ep, hs[i]);
        } else if (kind < 97) {
            CU_ASSERT_EQUAL(rt_prefix_index_remove(ix, ep, hs, n), 0);
            for (int i = 0; i < n; i++) {
                int j = model_find(m, ep, hs[i]);
                if (j >= 0)
                    model_drop(m, ep, j);
            }
        } else {
            rt_prefix_index_clear_endpoint(ix, ep);
            m->n[ep] = 0;
        }
        /* Query a fresh prompt against every endpoint. */
        int qn = (int)(rnd() % R_MAXN);
        uint64_t qbase = rnd() % R_UNIV;
        for (int i = 0; i < qn; i++)
            hs[i] = (qbase + (uint64_t)i) % R_UNIV;
        int best = rt_prefix_index_match(ix, hs, qn, matched);
        int mbest = 0;
        for (int e = 0; e < R_EPS; e++) {
            int k = 0;
            while (k < qn && model_find(m, e, hs[k]) >= 0)
                k++;
            mbest = k > mbest ? k : mbest;
            if ((int)matched[e] != k || rt_prefix_index_count(ix, e) != (uint32_t)m->n[e]) {
                printf("  op %d ep %d: matched %u model %d, count %u model %d\n", op, e, matched[e],
                       k, rt_prefix_index_count(ix, e), m->n[e]);
                bad = 1;
            }
        }
        if (best != mbest)
            bad = 1;
        if (op % 5000 == 0 && rt_prefix_index_check(ix) != 0)
            bad = 1;
    }
    CU_ASSERT_FALSE(bad);
    CU_ASSERT_EQUAL(rt_prefix_index_check(ix), 0);
    struct rt_prefix_index_stats st;
    rt_prefix_index_stats(ix, &st);
    uint64_t total = 0;
    for (int e = 0; e < R_EPS; e++)
        total += (uint64_t)m->n[e];
    CU_ASSERT_EQUAL(st.nodes, total);
    CU_ASSERT(st.evictions > 0);
    free(m);
    rt_prefix_index_destroy(ix);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("rt_prefix_index", NULL, NULL);
    CU_add_test(s, "create_args", test_create_args);
    CU_add_test(s, "match_leading", test_match_leading);
    CU_add_test(s, "approx_lru", test_approx_lru);
    CU_add_test(s, "precise_events", test_precise_events);
    CU_add_test(s, "large", test_large);
    CU_add_test(s, "randomised", test_randomised);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
