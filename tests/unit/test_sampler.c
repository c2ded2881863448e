/* Sampler: greedy, temperature, top-k, top-p, logprobs and the counter-based
 * random stream, on hand-made logits with hand-computed expectations. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "sampler.h"
#include "tandem_err.h"

/* Index of the first cumulative weight exceeding u x total, in order[]. */
static uint32_t pick(const double *w, const uint32_t *order, int n, double u)
{
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        total += w[i];
    }
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += w[i];
        if (acc > u * total) {
            return order[i];
        }
    }
    return order[n - 1];
}

/* u too close to a cut point for a hand computation to be trusted. */
static int near_cut(const double *w, int n, double u)
{
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        total += w[i];
    }
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += w[i];
        if (fabs(acc / total - u) < 1e-9) {
            return 1;
        }
    }
    return 0;
}

static void test_argmax_ties(void)
{
    float l[] = {1.0f, 3.0f, 3.0f, 2.0f};
    CU_ASSERT_EQUAL(sampler_argmax(l, 4), 1);
    float l2[] = {NAN, -1.0f, 5.0f, 5.0f};
    CU_ASSERT_EQUAL(sampler_argmax(l2, 4), 2);
    float l3[] = {-INFINITY, -INFINITY};
    CU_ASSERT_EQUAL(sampler_argmax(l3, 2), 0);
    float l4[] = {0.0f};
    CU_ASSERT_EQUAL(sampler_argmax(l4, 1), 0);
}

static void test_greedy_and_topk1(void)
{
    struct sampler *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&s, 6), 0);
    float l[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
    struct sampler_params g = sampler_params_greedy();
    CU_ASSERT_EQUAL(g.temperature, 0.0f);
    CU_ASSERT_EQUAL(g.top_p, 1.0f);
    struct sampler_params k1 = {.temperature = 0.8f, .top_k = 1, .top_p = 1.0f, .seed = 42};
    struct sampler_params k1p = {.temperature = 5.0f, .top_k = 1, .top_p = 0.3f, .seed = 7};
    for (uint64_t i = 0; i < 200; i++) {
        CU_ASSERT_EQUAL(sampler_sample(s, &g, l, i), 1);
        CU_ASSERT_EQUAL(sampler_sample(s, &k1, l, i), 1);
        CU_ASSERT_EQUAL(sampler_sample(s, &k1p, l, i), 1);
    }
    /* A tiny top_p keeps only the most likely token (lowest id on ties). */
    struct sampler_params tp = {.temperature = 1.0f, .top_k = 0, .top_p = 0.01f, .seed = 3};
    for (uint64_t i = 0; i < 200; i++) {
        CU_ASSERT_EQUAL(sampler_sample(s, &tp, l, i), 1);
    }
    sampler_destroy(s);
}

static void test_params_check(void)
{
    struct sampler_params p = sampler_params_greedy();
    CU_ASSERT_EQUAL(sampler_params_check(&p), 0);
    p.temperature = -0.1f;
    CU_ASSERT_EQUAL(sampler_params_check(&p), TANDEM_EINVAL);
    p.temperature = NAN;
    CU_ASSERT_EQUAL(sampler_params_check(&p), TANDEM_EINVAL);
    p.temperature = INFINITY;
    CU_ASSERT_EQUAL(sampler_params_check(&p), TANDEM_EINVAL);
    p.temperature = 1.0f;
    p.top_p = 0.0f;
    CU_ASSERT_EQUAL(sampler_params_check(&p), TANDEM_EINVAL);
    p.top_p = 1.5f;
    CU_ASSERT_EQUAL(sampler_params_check(&p), TANDEM_EINVAL);
    p.top_p = NAN;
    CU_ASSERT_EQUAL(sampler_params_check(&p), TANDEM_EINVAL);
    p.top_p = 1.0f;
    p.top_k = -5; /* off */
    CU_ASSERT_EQUAL(sampler_params_check(&p), 0);
    CU_ASSERT_EQUAL(sampler_params_check(NULL), TANDEM_EINVAL);
    struct sampler *s = NULL;
    CU_ASSERT_EQUAL(sampler_create(&s, 0), TANDEM_EINVAL);
    CU_ASSERT_PTR_NULL(s);
}

/* Unfiltered sampling walks ids in order: token = first cumulative > u. */
static void test_plain_temperature(void)
{
    struct sampler *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&s, 4), 0);
    const double pr[] = {0.5, 0.3, 0.15, 0.05};
    float l[4];
    for (int i = 0; i < 4; i++) {
        l[i] = (float)log(pr[i]);
    }
    const uint32_t ids[] = {0, 1, 2, 3};
    const float temps[] = {1.0f, 2.0f, 0.5f};
    int counts[4] = {0};
    for (int t = 0; t < 3; t++) {
        struct sampler_params p = {.temperature = temps[t], .top_k = 0, .top_p = 1.0f, .seed = 99};
        double w[4];
        double mx = l[0];
        for (int i = 0; i < 4; i++) {
            w[i] = exp(((double)l[i] - mx) / (double)temps[t]);
        }
        for (uint64_t idx = 0; idx < 2000; idx++) {
            double u = sampler_uniform(99, idx);
            if (near_cut(w, 4, u)) {
                continue;
            }
            uint32_t got = sampler_sample(s, &p, l, idx);
            CU_ASSERT_EQUAL(got, pick(w, ids, 4, u));
            if (t == 0) {
                counts[got]++;
            }
        }
    }
    /* At T = 1 the frequencies follow the probabilities. */
    for (int i = 0; i < 4; i++) {
        CU_ASSERT(fabs(counts[i] / 2000.0 - pr[i]) < 0.04);
    }
    sampler_destroy(s);
}

/* Probabilities 0.5, 0.3, 0.15, 0.05: top_p keeps the smallest most-likely
 * prefix reaching p, then samples from it renormalised, most likely first. */
static void test_top_p_cuts(void)
{
    struct sampler *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&s, 4), 0);
    /* Stored in a shuffled id order to check the sort. */
    const uint32_t ids[] = {2, 0, 3, 1}; /* by probability: id 2, 0, 3, 1 */
    const double pr[] = {0.5, 0.3, 0.15, 0.05};
    float l[4];
    for (int i = 0; i < 4; i++) {
        l[ids[i]] = (float)log(pr[i]);
    }
    const float cuts[] = {0.45f, 0.55f, 0.7f, 0.85f, 0.9f, 0.97f, 1.0f};
    const int keep[] = {1, 2, 2, 3, 3, 4, 4};
    for (int c = 0; c < 7; c++) {
        struct sampler_params p = {.temperature = 1.0f, .top_k = 0, .top_p = cuts[c], .seed = 5};
        double w[4];
        for (int i = 0; i < 4; i++) {
            w[i] = exp((double)l[ids[i]] - (double)l[ids[0]]);
        }
        int seen[4] = {0};
        for (uint64_t idx = 0; idx < 3000; idx++) {
            double u = sampler_uniform(5, idx);
            uint32_t got = sampler_sample(s, &p, l, idx);
            if (cuts[c] < 1.0f && !near_cut(w, keep[c], u)) {
                CU_ASSERT_EQUAL(got, pick(w, ids, keep[c], u));
            }
            for (int i = 0; i < 4; i++) {
                seen[i] += got == ids[i];
            }
        }
        for (int i = 0; i < 4; i++) {
            if (i < keep[c]) {
                CU_ASSERT(seen[i] > 0);
            } else {
                CU_ASSERT_EQUAL(seen[i], 0);
            }
        }
    }
    sampler_destroy(s);
}

static void test_top_k(void)
{
    enum { V = 300 };
    struct sampler *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&s, V), 0);
    float l[V];
    uint64_t x = 12345;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        l[i] = (float)((x >> 40) % 1000) / 250.0f; /* ties happen */
    }
    /* Rank of each id: logit descending, id ascending. */
    int rank[V];
    for (int i = 0; i < V; i++) {
        rank[i] = 0;
        for (int j = 0; j < V; j++) {
            rank[i] += l[j] > l[i] || (l[j] == l[i] && j < i);
        }
    }
    const int ks[] = {2, 10, 64, 65, 100, 299};
    for (int c = 0; c < 6; c++) {
        struct sampler_params p = {.temperature = 3.0f, .top_k = ks[c], .top_p = 1.0f, .seed = 11};
        int hit_last = 0;
        for (uint64_t idx = 0; idx < 3000; idx++) {
            uint32_t got = sampler_sample(s, &p, l, idx);
            CU_ASSERT_FATAL(got < V);
            CU_ASSERT(rank[got] < ks[c]);
            hit_last |= ks[c] <= 10 && rank[got] == ks[c] - 1;
        }
        if (ks[c] <= 10) {
            CU_ASSERT(hit_last);
        }
    }
    /* top_k and top_p together: top_p applies within the top-k set. */
    struct sampler_params p = {.temperature = 1.0f, .top_k = 3, .top_p = 0.999999f, .seed = 1};
    for (uint64_t idx = 0; idx < 500; idx++) {
        CU_ASSERT(rank[sampler_sample(s, &p, l, idx)] < 3);
    }
    sampler_destroy(s);
}

static void test_logprobs(void)
{
    float l[] = {1.0f, 2.0f, 3.0f, 0.5f, 3.0f};
    double sum = 0.0;
    for (int i = 0; i < 5; i++) {
        sum += exp((double)l[i]);
    }
    double lse = log(sum);
    struct sampler_top top[SAMPLER_MAX_TOP];
    float lp = sampler_logprobs(l, 5, 1, top, 3);
    CU_ASSERT_DOUBLE_EQUAL(lp, 2.0 - lse, 1e-6);
    CU_ASSERT_EQUAL(top[0].token, 2); /* tie with 4: lower id first */
    CU_ASSERT_EQUAL(top[1].token, 4);
    CU_ASSERT_EQUAL(top[2].token, 1);
    CU_ASSERT_DOUBLE_EQUAL(top[0].logprob, 3.0 - lse, 1e-6);
    CU_ASSERT_EQUAL(top[0].logprob, top[1].logprob);
    CU_ASSERT_DOUBLE_EQUAL(top[2].logprob, 2.0 - lse, 1e-6);
    CU_ASSERT_EQUAL(top[2].logprob, lp);
    /* Probabilities sum to one. */
    double total = 0.0;
    for (uint32_t t = 0; t < 5; t++) {
        total += exp(sampler_logprobs(l, 5, t, NULL, 0));
    }
    CU_ASSERT_DOUBLE_EQUAL(total, 1.0, 1e-6);
    /* n_top clamps to the vocabulary; every entry is filled in order. */
    lp = sampler_logprobs(l, 5, 3, top, SAMPLER_MAX_TOP);
    CU_ASSERT_DOUBLE_EQUAL(lp, 0.5 - lse, 1e-6);
    const uint32_t order[] = {2, 4, 1, 0, 3};
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(top[i].token, order[i]);
    }
    /* Uniform logits: log(1/n); exact small case. */
    float u[] = {0.0f, 0.0f, 0.0f, 0.0f};
    CU_ASSERT_DOUBLE_EQUAL(sampler_logprobs(u, 4, 2, top, 2), -log(4.0), 1e-7);
    CU_ASSERT_EQUAL(top[0].token, 0);
    CU_ASSERT_EQUAL(top[1].token, 1);
    /* Large logits do not overflow. */
    float big[] = {1000.0f, 999.0f};
    CU_ASSERT_DOUBLE_EQUAL(sampler_logprobs(big, 2, 0, NULL, 0), -log1p(exp(-1.0)), 1e-6);
    /* A token outside the vocabulary has no probability. */
    CU_ASSERT(isinf(sampler_logprobs(big, 2, 9, NULL, 0)));
}

static void test_rng(void)
{
    /* Pure function of (seed, index). */
    CU_ASSERT_EQUAL(sampler_uniform(1, 0), sampler_uniform(1, 0));
    CU_ASSERT(sampler_uniform(1, 0) != sampler_uniform(2, 0));
    CU_ASSERT(sampler_uniform(1, 0) != sampler_uniform(1, 1));
    CU_ASSERT(sampler_uniform(0, 1) != sampler_uniform(1, 0));
    double mean = 0.0, lo = 1.0, hi = 0.0;
    int n = 20000;
    for (int i = 0; i < n; i++) {
        double u = sampler_uniform(77, (uint64_t)i);
        CU_ASSERT_FATAL(u >= 0.0 && u < 1.0);
        mean += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    mean /= n;
    CU_ASSERT(fabs(mean - 0.5) < 0.01);
    CU_ASSERT(lo < 0.001 && hi > 0.999);

    /* Call order does not matter: two sequences interleaved, each alone, and
     * one index out of order give the same tokens. */
    enum { V = 50, N = 100 };
    struct sampler *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&s, V), 0);
    float l[V];
    for (int i = 0; i < V; i++) {
        l[i] = (float)((i * 37) % 11) / 4.0f;
    }
    struct sampler_params a = {.temperature = 1.3f, .top_k = 20, .top_p = 0.9f, .seed = 1001};
    struct sampler_params b = {.temperature = 0.7f, .top_k = 0, .top_p = 1.0f, .seed = 2002};
    uint32_t ta[N], tb[N];
    for (int i = 0; i < N; i++) {
        ta[i] = sampler_sample(s, &a, l, (uint64_t)i);
    }
    for (int i = 0; i < N; i++) {
        tb[i] = sampler_sample(s, &b, l, (uint64_t)i);
    }
    int diff = 0;
    for (int i = N - 1; i >= 0; i--) {
        CU_ASSERT_EQUAL(sampler_sample(s, &b, l, (uint64_t)i), tb[i]);
        CU_ASSERT_EQUAL(sampler_sample(s, &a, l, (uint64_t)i), ta[i]);
        diff += ta[i] != tb[i];
    }
    CU_ASSERT(diff > 0);
    /* A second sampler instance agrees. */
    struct sampler *s2 = NULL;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&s2, V), 0);
    CU_ASSERT_EQUAL(sampler_sample(s2, &a, l, 57), ta[57]);
    sampler_destroy(s2);
    sampler_destroy(s);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite su = CU_add_suite("sampler", NULL, NULL);
    CU_add_test(su, "argmax_ties", test_argmax_ties);
    CU_add_test(su, "greedy_and_topk1", test_greedy_and_topk1);
    CU_add_test(su, "params_check", test_params_check);
    CU_add_test(su, "plain_temperature", test_plain_temperature);
    CU_add_test(su, "top_p_cuts", test_top_p_cuts);
    CU_add_test(su, "top_k", test_top_k);
    CU_add_test(su, "logprobs", test_logprobs);
    CU_add_test(su, "rng", test_rng);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
