/* common/tandem_rng.h: splitmix64 and xoshiro256** give the published
 * reference outputs, and the engine's streams built on them (sampler_uniform)
 * keep the values they had before the copies were merged (ef69453), so
 * determinism across versions holds. */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <stdio.h>

#include "sampler.h"
#include "tandem_rng.h"

#define EXPECT_U64(got, want)                                                                      \
    do {                                                                                           \
        uint64_t g_ = (got), w_ = (want);                                                          \
        if (g_ != w_) {                                                                            \
            fprintf(stderr, "\n%s = %016" PRIx64 ", want %016" PRIx64 "\n", #got, g_, w_);         \
        }                                                                                          \
        CU_ASSERT_EQUAL(g_, w_);                                                                   \
    } while (0)

/* Vigna's splitmix64.c from state 0. */
static void test_splitmix64(void)
{
    uint64_t x = 0;
    EXPECT_U64(rng_splitmix64(&x), 0xe220a8397b1dcdafULL);
    EXPECT_U64(x, RNG_GOLDEN);
    EXPECT_U64(rng_splitmix64(&x), 0x6e789e6aa1b965f4ULL);
    EXPECT_U64(rng_splitmix64(&x), 0x06c45d188009454fULL);
    EXPECT_U64(rng_hash64(0), 0xe220a8397b1dcdafULL);
    EXPECT_U64(rng_hash64(42), 0xbdd732262feb6e95ULL);
    EXPECT_U64(rng_mix64(0), 0);
    EXPECT_U64(rng_mix64(1), 0x5692161d100b05e5ULL);
    EXPECT_U64(rng_mix64(RNG_GOLDEN), 0xe220a8397b1dcdafULL);
}

static void test_xoshiro(void)
{
    struct rng r;
    rng_seed(&r, 7);
    EXPECT_U64(rng_next(&r), 0xb358faf74ef9765aULL);
    EXPECT_U64(rng_next(&r), 0x475c3d964f482cd2ULL);
    EXPECT_U64(rng_next(&r), 0xd6f1d349952c7996ULL);
}

static void test_sampler_stream(void)
{
    CU_ASSERT_EQUAL(sampler_uniform(1, 2), 0.77818478152784576);
    CU_ASSERT_EQUAL(sampler_uniform(0, 0), 0.096240074103380424);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("tandem_rng", NULL, NULL);
    CU_add_test(s, "splitmix64", test_splitmix64);
    CU_add_test(s, "xoshiro", test_xoshiro);
    CU_add_test(s, "sampler_stream", test_sampler_stream);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
