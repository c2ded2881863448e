/* Top-logprob rows for the wire (worker/wk_tops.h): counts, the cap at
 * WIRE_MAX_LOGPROBS, strides, and a TokenChunk that carries them through
 * wire_pack and wire_unpack unchanged. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

#include "tandem_err.h"
#include "wire.h"
#include "wk_tops.h"

enum { ROWS = 4, STRIDE = 8 };

/* Alternative j of row i: token 100 i + j, logprob -(i + j / 8). */
static void fill(struct sampler_top *top)
{
    for (int i = 0; i < ROWS; i++) {
        for (int j = 0; j < STRIDE; j++) {
            top[i * STRIDE + j].token = (uint32_t)(100 * i + j);
            top[i * STRIDE + j].logprob = -((float)i + (float)j / 8.0f);
        }
    }
}

static void expect_rows(Tandem__TopLogprobs *const *rows, const int *want_n)
{
    for (int i = 0; i < ROWS; i++) {
        CU_ASSERT_EQUAL_FATAL(rows[i]->n_token_ids, (size_t)want_n[i]);
        CU_ASSERT_EQUAL_FATAL(rows[i]->n_logprobs, (size_t)want_n[i]);
        for (int j = 0; j < want_n[i]; j++) {
            CU_ASSERT_EQUAL(rows[i]->token_ids[j], (uint32_t)(100 * i + j));
            CU_ASSERT_EQUAL(rows[i]->logprobs[j], -((float)i + (float)j / 8.0f));
        }
    }
}

static void test_counts_and_cap(void)
{
    struct sampler_top top[ROWS * STRIDE];
    fill(top);
    /* Per-row counts (a TokenChunk), one above the cap. */
    const uint8_t counts[ROWS] = {0, 1, 5, 7};
    const int want[ROWS] = {0, 1, 5, (int)WIRE_MAX_LOGPROBS};
    struct wk_tops t;
    CU_ASSERT_EQUAL_FATAL(wk_tops_build(&t, ROWS, top, STRIDE, counts, 0), 0);
    expect_rows(t.ptrs, want);
    wk_tops_free(&t);
    CU_ASSERT_PTR_NULL(t.ptrs);
    /* One count for every row, rows n_top apart (PromptLogprobs). */
    struct sampler_top packed[ROWS * 3];
    for (int i = 0; i < ROWS; i++) {
        memcpy(&packed[i * 3], &top[i * STRIDE], 3 * sizeof(*packed));
    }
    const int three[ROWS] = {3, 3, 3, 3};
    CU_ASSERT_EQUAL_FATAL(wk_tops_build(&t, ROWS, packed, 3, NULL, 3), 0);
    expect_rows(t.ptrs, three);
    wk_tops_free(&t);
}

static void test_through_the_wire(void)
{
    struct sampler_top top[ROWS * STRIDE];
    fill(top);
    const uint8_t counts[ROWS] = {2, 2, 4, 5};
    const int want[ROWS] = {2, 2, 4, 5};
    uint32_t ids[ROWS] = {0, 100, 200, 300};
    float lps[ROWS] = {-0.0f, -1.0f, -2.0f, -3.0f};
    struct wk_tops t;
    CU_ASSERT_EQUAL_FATAL(wk_tops_build(&t, ROWS, top, STRIDE, counts, 0), 0);
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    c.first_index = 7;
    c.n_token_ids = c.n_logprobs = ROWS;
    c.token_ids = ids;
    c.logprobs = lps;
    c.n_top_logprobs = ROWS;
    c.top_logprobs = t.ptrs;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__TOKEN_CHUNK, 42, &c);
    uint8_t buf[4096];
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(wire_pack(&env, buf, sizeof(buf), &len), 0);
    wk_tops_free(&t);
    Tandem__Envelope *out = NULL;
    CU_ASSERT_EQUAL_FATAL(wire_unpack(buf, len, &out), 0);
    CU_ASSERT_EQUAL(out->request_id, 42u);
    CU_ASSERT_EQUAL_FATAL(out->token_chunk->n_top_logprobs, (size_t)ROWS);
    expect_rows(out->token_chunk->top_logprobs, want);
    wire_free(out);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("wk_tops", NULL, NULL);
    CU_add_test(s, "counts_and_cap", test_counts_and_cap);
    CU_add_test(s, "through_the_wire", test_through_the_wire);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
