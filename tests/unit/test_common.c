/* Errors, logging and block hashing. */
#include <CUnit/Basic.h>
#include <string.h>

#include "block_hash.h"
#include "log.h"
#include "tandem_err.h"

static void test_strerror(void)
{
    CU_ASSERT_STRING_EQUAL(tandem_strerror(0), "success");
    CU_ASSERT_STRING_EQUAL(tandem_strerror(TANDEM_ENOMEM), "out of memory");
    CU_ASSERT_STRING_EQUAL(tandem_strerror(TANDEM_ENOSPACE), "no free KV blocks");
    CU_ASSERT_STRING_EQUAL(tandem_errname(TANDEM_ECHECKSUM), "ECHECKSUM");
    CU_ASSERT_STRING_EQUAL(tandem_strerror(-9999), "unknown error");
    CU_ASSERT_STRING_EQUAL(tandem_strerror(1), "unknown error");
    /* Codes are distinct and negative. */
    CU_ASSERT(TANDEM_ENOMEM < 0);
    CU_ASSERT(TANDEM_EINTERNAL < TANDEM_ENOMEM);
}

static void test_log_level(void)
{
    enum log_level l;
    CU_ASSERT_EQUAL(log_level_parse("warn", &l), 0);
    CU_ASSERT_EQUAL(l, LOG_LEVEL_WARN);
    CU_ASSERT_EQUAL(log_level_parse("loud", &l), TANDEM_EINVAL);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("common", NULL, NULL);
    CU_add_test(s, "strerror", test_strerror);
    CU_add_test(s, "log_level", test_log_level);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
