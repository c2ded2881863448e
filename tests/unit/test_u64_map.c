/* The u64 -> pointer map (common/u64_map.h): put, replace, get, delete with
 * backward shift (every remaining key still found after deletions inside
 * probe runs), growth, iteration, key 0 refused. Keys follow a printed seed. */
#include <CUnit/Basic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tandem_err.h"
#include "u64_map.h"

#define N 5000

static uint64_t seed = 0x5eed1234u;

static uint64_t next_key(void)
{
    uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z != 0 ? z : 1;
}

static void test_basics(void)
{
    struct u64_map m;
    u64_map_init(&m);
    int a = 1, b = 2;
    CU_ASSERT_PTR_NULL(u64_map_get(&m, 7));
    CU_ASSERT_EQUAL(u64_map_put(&m, 0, &a), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(u64_map_put(&m, 7, &a), 0);
    CU_ASSERT_PTR_EQUAL(u64_map_get(&m, 7), &a);
    CU_ASSERT_EQUAL(u64_map_put(&m, 7, &b), 0); /* replaces */
    CU_ASSERT_EQUAL(m.n, 1u);
    CU_ASSERT_PTR_EQUAL(u64_map_get(&m, 7), &b);
    CU_ASSERT_PTR_NULL(u64_map_get(&m, 0));
    CU_ASSERT_PTR_EQUAL(u64_map_del(&m, 7), &b);
    CU_ASSERT_PTR_NULL(u64_map_del(&m, 7));
    CU_ASSERT_PTR_NULL(u64_map_get(&m, 7));
    CU_ASSERT_EQUAL(m.n, 0u);
    u64_map_fini(&m);
}

/* Sequential ids (the router's and workers' request ids) and random hashes,
 * half deleted in insertion order: the rest must all stay reachable. */
static void check_many(int sequential)
{
    struct u64_map m;
    u64_map_init(&m);
    uint64_t *keys = malloc(N * sizeof(*keys));
    CU_ASSERT_PTR_NOT_NULL_FATAL(keys);
    uint64_t base = next_key() >> 1;
    for (int i = 0; i < N; i++) {
        keys[i] = sequential ? base + (uint64_t)i : next_key();
        CU_ASSERT_EQUAL_FATAL(u64_map_put(&m, keys[i], &keys[i]), 0);
    }
    CU_ASSERT_EQUAL(m.n, (size_t)N);
    CU_ASSERT(2 * m.n <= m.mask + 1); /* load <= 1/2 */
    for (int i = 0; i < N; i += 2) {
        CU_ASSERT_PTR_EQUAL(u64_map_del(&m, keys[i]), &keys[i]);
    }
    CU_ASSERT_EQUAL(m.n, (size_t)N / 2);
    int found = 0, wrong = 0;
    for (int i = 0; i < N; i++) {
        void *v = u64_map_get(&m, keys[i]);
        if (i % 2 == 0) {
            wrong += v != NULL;
        } else {
            found += v == &keys[i];
        }
    }
    CU_ASSERT_EQUAL(found, N / 2);
    CU_ASSERT_EQUAL(wrong, 0);
    size_t it = 0, seen = 0;
    uint64_t k;
    void *v;
    while (u64_map_next(&m, &it, &k, &v)) {
        CU_ASSERT_PTR_EQUAL(v, u64_map_get(&m, k));
        seen++;
    }
    CU_ASSERT_EQUAL(seen, (size_t)N / 2);
    free(keys);
    u64_map_fini(&m);
    CU_ASSERT_PTR_NULL(m.slots);
}

static void test_sequential(void)
{
    check_many(1);
}

static void test_random(void)
{
    check_many(0);
}

int main(void)
{
    printf("u64_map seed %llu\n", (unsigned long long)seed);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("u64_map", NULL, NULL);
    CU_add_test(s, "basics", test_basics);
    CU_add_test(s, "sequential", test_sequential);
    CU_add_test(s, "random", test_random);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
