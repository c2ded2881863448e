/* tandem bench: arrival processes (loadgen/arrivals.c) and the random
 * numbers under them (loadgen/rng.c).
 *
 * Stated tolerances: with n gaps the sample mean's relative standard error is
 * CV / sqrt(n), CV = 1 / sqrt(burstiness). 10,000 Poisson gaps: 1%, so 3% is
 * three standard errors; burstiness 0.5 (CV 1.41) uses 20,000 gaps for the
 * same margin. The CV itself is checked within 10%. Seeds are printed and
 * TANDEM_TEST_SEED replays one. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen/arrivals.h"
#include "loadgen/rng.h"
#include "tandem_err.h"

static uint64_t seed = 1;

#define EXPECT_WITHIN(got, want, rel)                                                              \
    do {                                                                                           \
        double g_ = (got), w_ = (want);                                                            \
        int ok_ = fabs(g_ - w_) <= (rel)*fabs(w_);                                                 \
        if (!ok_)                                                                                  \
            fprintf(stderr, "\n%s:%d: %s == %.6g, want %.6g within %.1f%% (seed %llu)\n",          \
                    __FILE__, __LINE__, #got, g_, w_, (rel)*100.0, (unsigned long long)seed);      \
        CU_ASSERT(ok_);                                                                            \
    } while (0)

/* Mean and coefficient of variation of the gaps of n arrivals. */
static void gap_stats(double rate, double burstiness, size_t n, double *mean, double *cv)
{
    double *t = malloc(n * sizeof(double));
    CU_ASSERT_EQUAL_FATAL(lg_arrivals_fill(rate, burstiness, seed, 0, n, t), 0);
    double sum = 0, ss = 0, prev = 0;
    for (size_t i = 0; i < n; i++) {
        double g = t[i] - prev;
        CU_ASSERT(g >= 0);
        prev = t[i];
        sum += g;
    }
    *mean = sum / (double)n;
    prev = 0;
    for (size_t i = 0; i < n; i++) {
        double g = t[i] - prev;
        prev = t[i];
        ss += (g - *mean) * (g - *mean);
    }
    *cv = sqrt(ss / (double)n) / *mean;
    free(t);
}

static void test_poisson_rate(void)
{
    double mean, cv;
    gap_stats(10.0, 1.0, 10000, &mean, &cv);
    EXPECT_WITHIN(1.0 / mean, 10.0, 0.03);
    EXPECT_WITHIN(cv, 1.0, 0.10);
    gap_stats(250.0, 1.0, 10000, &mean, &cv);
    EXPECT_WITHIN(1.0 / mean, 250.0, 0.03);
}

static void test_gamma_rate(void)
{
    double mean, cv;
    gap_stats(10.0, 4.0, 10000, &mean, &cv); /* even: CV 0.5 */
    EXPECT_WITHIN(1.0 / mean, 10.0, 0.03);
    EXPECT_WITHIN(cv, 0.5, 0.10);
    gap_stats(10.0, 0.5, 20000, &mean, &cv); /* bursty: CV 1.41 */
    EXPECT_WITHIN(1.0 / mean, 10.0, 0.03);
    EXPECT_WITHIN(cv, sqrt(2.0), 0.10);
    gap_stats(3.0, 0.25, 40000, &mean, &cv); /* shape < 1 path: CV 2 */
    EXPECT_WITHIN(1.0 / mean, 3.0, 0.03);
    EXPECT_WITHIN(cv, 2.0, 0.10);
}

static void test_special_rates(void)
{
    double t[5];
    /* Infinite rate: everything at time 0. */
    CU_ASSERT_EQUAL(lg_arrivals_fill(INFINITY, 1.0, seed, 1, 5, t), 0);
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(t[i], 0.0);
    }
    /* Infinite burstiness: constant gaps of 1/rate (the first arrival too). */
    CU_ASSERT_EQUAL(lg_arrivals_fill(4.0, INFINITY, seed, 0, 5, t), 0);
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_DOUBLE_EQUAL(t[i], 0.25 * (i + 1), 1e-12);
    }
    struct lg_arrivals a;
    CU_ASSERT_EQUAL(lg_arrivals_init(&a, 0, 1, 1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_arrivals_init(&a, -1, 1, 1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_arrivals_init(&a, 1, 0, 1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_arrivals_init(&a, NAN, 1, 1), TANDEM_EINVAL);
}

static void test_normalize(void)
{
    /* vLLM's rescaling: the last arrival lands exactly on n / rate. */
    const size_t n = 1000;
    double *raw = malloc(n * sizeof(double)), *norm = malloc(n * sizeof(double));
    CU_ASSERT_EQUAL(lg_arrivals_fill(20.0, 0.7, seed, 0, n, raw), 0);
    CU_ASSERT_EQUAL(lg_arrivals_fill(20.0, 0.7, seed, 1, n, norm), 0);
    CU_ASSERT_DOUBLE_EQUAL(norm[n - 1], 50.0, 1e-9);
    double f = 50.0 / raw[n - 1];
    for (size_t i = 0; i < n; i++) {
        CU_ASSERT_DOUBLE_EQUAL(norm[i], raw[i] * f, 1e-9);
        if (i > 0) {
            CU_ASSERT(norm[i] >= norm[i - 1]);
        }
    }
    free(raw);
    free(norm);
}

static void test_reproducible(void)
{
    double a[100], b[100], c[100];
    CU_ASSERT_EQUAL(lg_arrivals_fill(5.0, 2.0, seed, 1, 100, a), 0);
    CU_ASSERT_EQUAL(lg_arrivals_fill(5.0, 2.0, seed, 1, 100, b), 0);
    CU_ASSERT_EQUAL(lg_arrivals_fill(5.0, 2.0, seed + 1, 1, 100, c), 0);
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof(a)), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(a, c, sizeof(a)), 0);
    /* The lazy generator gives the same times as the filled array. */
    struct lg_arrivals s;
    CU_ASSERT_EQUAL(lg_arrivals_init(&s, 5.0, 2.0, seed), 0);
    CU_ASSERT_EQUAL(lg_arrivals_fill(5.0, 2.0, seed, 0, 100, b), 0);
    for (int i = 0; i < 100; i++) {
        CU_ASSERT_EQUAL(lg_arrivals_next(&s), b[i]);
    }
}

static void test_rng(void)
{
    /* Fixed vectors: the stream must not change between releases, or old
     * --seed runs would stop being reproducible. */
    struct lg_rng r;
    lg_rng_seed(&r, 0);
    CU_ASSERT_EQUAL(lg_rng_next(&r), 11091344671253066420ULL);
    struct lg_rng d1, d2, d3;
    lg_rng_derive(&d1, 42, LG_STREAM_REQUEST, 7);
    lg_rng_derive(&d2, 42, LG_STREAM_REQUEST, 7);
    lg_rng_derive(&d3, 42, LG_STREAM_REQUEST, 8);
    uint64_t x1 = lg_rng_next(&d1);
    CU_ASSERT_EQUAL(x1, 12500959011378919169ULL);
    CU_ASSERT_EQUAL(x1, lg_rng_next(&d2));
    double t[3];
    CU_ASSERT_EQUAL(lg_arrivals_fill(10, 1, 0, 0, 3, t), 0);
    CU_ASSERT_DOUBLE_EQUAL(t[0], 0.513641616536193, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(t[1], 0.6045445701419192, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(t[2], 0.70401201374698896, 1e-12);
    CU_ASSERT_NOT_EQUAL(x1, lg_rng_next(&d3));

    lg_rng_seed(&r, seed);
    int seen[7] = {0};
    for (int i = 0; i < 7000; i++) {
        int64_t v = lg_rng_range(&r, -3, 3);
        CU_ASSERT_FATAL(v >= -3 && v <= 3);
        seen[v + 3]++;
    }
    for (int i = 0; i < 7; i++) {
        CU_ASSERT(seen[i] > 800 && seen[i] < 1200); /* 1000 expected, sd ~29 */
    }
    CU_ASSERT_EQUAL(lg_rng_range(&r, 5, 5), 5);
    double u_min = 1, u_max = 0, g_sum = 0, n_sum = 0, n_ss = 0;
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        double u = lg_rng_uniform(&r);
        u_min = fmin(u_min, u);
        u_max = fmax(u_max, u);
        g_sum += lg_rng_gamma(&r, 2.5, 3.0);
        double z = lg_rng_normal(&r);
        n_sum += z;
        n_ss += z * z;
    }
    CU_ASSERT(u_min >= 0 && u_max < 1);
    EXPECT_WITHIN(g_sum / n, 7.5, 0.02); /* shape x scale */
    CU_ASSERT(fabs(n_sum / n) < 0.02);
    EXPECT_WITHIN(n_ss / n, 1.0, 0.02);
}

int main(void)
{
    const char *env = getenv("TANDEM_TEST_SEED");
    if (env != NULL) {
        seed = strtoull(env, NULL, 10);
    }
    printf("test_bench_arrivals: seed %llu (replay with TANDEM_TEST_SEED)\n",
           (unsigned long long)seed);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench_arrivals", NULL, NULL);
    CU_add_test(s, "poisson_rate", test_poisson_rate);
    CU_add_test(s, "gamma_rate", test_gamma_rate);
    CU_add_test(s, "special_rates", test_special_rates);
    CU_add_test(s, "normalize", test_normalize);
    CU_add_test(s, "reproducible", test_reproducible);
    CU_add_test(s, "rng", test_rng);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
