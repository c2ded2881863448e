/* Regressions found by fuzz/fuzz_kvframe and fuzz/fuzz_wire: each test
 * replays the input that broke a property (docs/reliability.md "## Bad
 * input"). */
#include <CUnit/Basic.h>
#include <string.h>

#include "tandem_err.h"
#include "wire.h"

/* fuzz_kvframe: a PrefillDone frame whose body holds field number 0 encoded
 * as the two-byte key 0x80 0x00. protobuf-c kept it as an unknown field and
 * packed it back as 0x00, which it then refused: the frame unpacked, packed,
 * and the packed bytes did not unpack. Field 0 is now refused on unpack. */
static const uint8_t kvframe_field_zero[] = {
    0x28, 0x00, 0x00, 0x00, 0x08, 0x01, 0x10, 0x06, 0x18, 0x0c, 0x4a, 0x20, 0x08, 0x4d, 0x80,
    0x00, 0x00, 0x80, 0xbe, 0x1a, 0x13, 0x3d, 0x03, 0xd8, 0x58, 0x58, 0x58, 0x58, 0x58, 0x58,
    0x58, 0x58, 0x58, 0x58, 0x58, 0x58, 0x58, 0x58, 0x58, 0x58, 0x58, 0x58, 0x58, 0x06};

static void test_kvframe_field_zero(void)
{
    struct wire_frame f;
    CU_ASSERT_EQUAL(wire_frame_unpack(kvframe_field_zero, sizeof kvframe_field_zero, &f),
                    TANDEM_EPROTO);
    CU_ASSERT_PTR_NULL(f.env);
    CU_ASSERT_PTR_NOT_NULL(strstr(wire_error_detail(), "field number 0"));
}

/* The same on the control link: Cancel (request 1) with 0x80 0x00 0x00 in
 * its body, and in a nested message (DecodeJob.sampling). Without the bogus
 * field both envelopes unpack. */
static void test_control_field_zero(void)
{
    const uint8_t cancel_bad[] = {0x08, 0x01, 0x10, 0x09, 0x18, 0x01, 0x62, 0x03, 0x80, 0x00, 0x00};
    const uint8_t cancel_ok[] = {0x08, 0x01, 0x10, 0x09, 0x18, 0x01, 0x62, 0x00};
    /* DecodeJob{prompt [5], max_tokens 4, sampling{top_p 1.0f [, field 0]}} */
    const uint8_t job_bad[] = {0x08, 0x01, 0x10, 0x03, 0x18, 0x01, 0x32, 0x0f,
                               0x0a, 0x01, 0x05, 0x10, 0x04, 0x1a, 0x08, 0x15,
                               0x00, 0x00, 0x80, 0x3f, 0x80, 0x00, 0x00};
    uint8_t job_ok[sizeof job_bad - 3];
    memcpy(job_ok, job_bad, sizeof job_ok);
    job_ok[7] -= 3;  /* DecodeJob length */
    job_ok[14] -= 3; /* SamplingParams length */

    Tandem__Envelope *env = NULL;
    CU_ASSERT_EQUAL(wire_unpack(cancel_bad, sizeof cancel_bad, &env), TANDEM_EPROTO);
    CU_ASSERT_PTR_NULL(env);
    CU_ASSERT_EQUAL(wire_unpack(job_bad, sizeof job_bad, &env), TANDEM_EPROTO);
    CU_ASSERT_PTR_NULL(env);
    CU_ASSERT_PTR_NOT_NULL(strstr(wire_error_detail(), "field number 0"));

    CU_ASSERT_EQUAL(wire_unpack(cancel_ok, sizeof cancel_ok, &env), 0);
    wire_free(env);
    env = NULL;
    int rc = wire_unpack(job_ok, sizeof job_ok, &env);
    if (rc != 0)
        fprintf(stderr, "\njob_ok: %s (%s)\n", tandem_strerror(rc), wire_error_detail());
    CU_ASSERT_EQUAL(rc, 0);
    if (env != NULL) {
        CU_ASSERT_EQUAL(env->decode_job->max_tokens, 4);
        CU_ASSERT_EQUAL(env->decode_job->n_prompt_token_ids, 1);
    }
    wire_free(env);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("regress_wire", NULL, NULL);
    CU_add_test(s, "kvframe_field_zero", test_kvframe_field_zero);
    CU_add_test(s, "control_field_zero", test_control_field_zero);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
