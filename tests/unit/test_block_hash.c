/* Chained block hashing (common/block_hash.h). */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "block_hash.h"
#include "tandem_err.h"

#define N_TOK 256

static void fill(uint32_t *t, int n, uint32_t base)
{
    for (int i = 0; i < n; i++) {
        t[i] = base + (uint32_t)i * 2654435761u;
    }
}

static void test_equal_prefixes(void)
{
    uint32_t a[N_TOK], b[N_TOK];
    uint64_t ha[N_TOK / 16], hb[N_TOK / 16];
    fill(a, N_TOK, 7);
    memcpy(b, a, sizeof a);
    /* Same first 5 blocks, then different. */
    for (int i = 80; i < N_TOK; i++) {
        b[i] ^= 0x5a5a5a5au;
    }
    uint64_t root = bh_root("tiny");
    CU_ASSERT_EQUAL(bh_hash_prompt(root, a, N_TOK, 16, ha), N_TOK / 16);
    CU_ASSERT_EQUAL(bh_hash_prompt(root, b, N_TOK, 16, hb), N_TOK / 16);
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(ha[i], hb[i]);
    }
    for (int i = 5; i < N_TOK / 16; i++) {
        CU_ASSERT_NOT_EQUAL(ha[i], hb[i]);
    }
    /* A longer prompt with the same start has the same leading hashes. */
    uint64_t hshort[4];
    CU_ASSERT_EQUAL(bh_hash_prompt(root, a, 64, 16, hshort), 4);
    CU_ASSERT_EQUAL(memcmp(hshort, ha, sizeof hshort), 0);
    /* bh_block chains exactly like bh_hash_prompt. */
    uint64_t h = root;
    for (int i = 0; i < N_TOK / 16; i++) {
        h = bh_block(h, a + i * 16, 16);
        CU_ASSERT_EQUAL(h, ha[i]);
    }
}

static void test_single_token_change(void)
{
    uint32_t base[128], t[128];
    uint64_t h0[8], h1[8];
    fill(base, 128, 1);
    uint64_t root = bh_root("tiny");
    CU_ASSERT_EQUAL(bh_hash_prompt(root, base, 128, 16, h0), 8);
    for (int pos = 0; pos < 128; pos++) {
        memcpy(t, base, sizeof t);
        t[pos] += 1;
        CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 128, 16, h1), 8);
        int blk = pos / 16;
        for (int i = 0; i < 8; i++) {
            if (i < blk) {
                CU_ASSERT_EQUAL(h1[i], h0[i]);
            } else {
                CU_ASSERT_NOT_EQUAL(h1[i], h0[i]);
            }
        }
    }
}

static void test_partial_block(void)
{
    uint32_t t[64];
    uint64_t h[8], ref[8];
    fill(t, 64, 3);
    uint64_t root = bh_root("tiny");
    const uint64_t canary = 0xdeadbeefcafef00dull;
    for (int i = 0; i < 8; i++) {
        h[i] = canary;
    }
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 47, 16, h), 2);
    CU_ASSERT_EQUAL(h[2], canary); /* the 15-token tail is not named */
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 15, 16, h), 0);
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 0, 16, h), 0);
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 48, 16, ref), 3);
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 63, 16, h), 3);
    CU_ASSERT_EQUAL(memcmp(h, ref, 3 * sizeof h[0]), 0);
    CU_ASSERT_EQUAL(h[3], canary);
    /* Other block sizes: n / bs every time. */
    uint64_t per_token[64];
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 64, 1, per_token), 64);
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 64, 7, per_token), 9);
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 64, 64, per_token), 1);
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 63, 64, per_token), 0);
}

static void test_root(void)
{
    uint64_t a = bh_root("tiny"), b = bh_root("llama-3-8b"), c = bh_root("tiny");
    CU_ASSERT_EQUAL(a, c);
    CU_ASSERT_NOT_EQUAL(a, b);
    CU_ASSERT_NOT_EQUAL(bh_root(""), a);
    CU_ASSERT_EQUAL(a, XXH3_64bits("tiny", 4));
    /* Different roots name the same tokens differently. */
    uint32_t t[16];
    fill(t, 16, 0);
    CU_ASSERT_NOT_EQUAL(bh_block(a, t, 16), bh_block(b, t, 16));
    /* Definition: XXH3-64 of little-endian token ids, parent as seed. */
    uint8_t le[64];
    for (int i = 0; i < 16; i++) {
        le[4 * i] = (uint8_t)t[i];
        le[4 * i + 1] = (uint8_t)(t[i] >> 8);
        le[4 * i + 2] = (uint8_t)(t[i] >> 16);
        le[4 * i + 3] = (uint8_t)(t[i] >> 24);
    }
    CU_ASSERT_EQUAL(bh_block(a, t, 16), XXH3_64bits_withSeed(le, sizeof le, a));
}

/* Committed constants: tokens 0..63, block size 16, root "tiny". If these
 * change, every cached prefix and every router index changes with them. */
static void test_fixed_vectors(void)
{
    static const uint64_t expect_root = UINT64_C(0x5a5d85f2db179ac1);
    static const uint64_t expect[4] = {UINT64_C(0xcffbf0e1187e3903), UINT64_C(0x27f448a121865e15),
                                       UINT64_C(0x091741ca0f4db7df), UINT64_C(0x204e1bf6eebde68f)};
    uint32_t t[64];
    uint64_t h[4];
    for (int i = 0; i < 64; i++) {
        t[i] = (uint32_t)i;
    }
    uint64_t root = bh_root("tiny");
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 64, 16, h), 4);
    CU_ASSERT_EQUAL(root, expect_root);
    if (root != expect_root) {
        printf("\n  root 0x%016" PRIx64 " expected 0x%016" PRIx64 "\n", root, expect_root);
    }
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(h[i], expect[i]);
        if (h[i] != expect[i]) {
            printf("\n  h[%d] 0x%016" PRIx64 " expected 0x%016" PRIx64 "\n", i, h[i], expect[i]);
        }
    }
}

static void test_bad_args(void)
{
    uint32_t t[16] = {0};
    uint64_t h[16];
    CU_ASSERT_EQUAL(bh_hash_prompt(1, t, 16, 0, h), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(bh_hash_prompt(1, t, 16, -16, h), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(bh_hash_prompt(1, t, 16, BH_MAX_BLOCK_SIZE + 1, h), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(bh_hash_prompt(1, t, -1, 16, h), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(bh_hash_prompt(1, t, 16, BH_MAX_BLOCK_SIZE, h), 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("block_hash", NULL, NULL);
    CU_add_test(s, "equal_prefixes", test_equal_prefixes);
    CU_add_test(s, "single_token_change", test_single_token_change);
    CU_add_test(s, "partial_block", test_partial_block);
    CU_add_test(s, "root", test_root);
    CU_add_test(s, "fixed_vectors", test_fixed_vectors);
    CU_add_test(s, "bad_args", test_bad_args);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
