/* Errors, logging and block hashing. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "block_hash.h"
#include "file.h"
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

/* file_read_all: the whole file NUL-terminated, up to the limit exactly;
 * a missing file, a directory and a file one byte too long refused with
 * the path in the message. */
static void test_file_read_all(void)
{
    char path[] = "/tmp/test_common.XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(write(fd, "abc\0def", 7), 7);
    close(fd);
    char *buf = NULL, err[256];
    size_t len = 0;
    CU_ASSERT_EQUAL(file_read_all(path, 7, &buf, &len, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(len, 7u);
    CU_ASSERT(buf != NULL && memcmp(buf, "abc\0def", 8) == 0); /* and the NUL after */
    free(buf);
    CU_ASSERT_EQUAL(file_read_all(path, 6, &buf, &len, err, sizeof(err)), TANDEM_ETOOBIG);
    CU_ASSERT_PTR_NULL(buf);
    char want[300];
    snprintf(want, sizeof(want), "%s: larger than 6 bytes", path);
    CU_ASSERT_STRING_EQUAL(err, want);
    unlink(path);
    CU_ASSERT_EQUAL(file_read_all(path, 7, &buf, NULL, err, sizeof(err)), TANDEM_ENOENT);
    snprintf(want, sizeof(want), "%s: cannot open: No such file or directory", path);
    CU_ASSERT_STRING_EQUAL(err, want);
    CU_ASSERT_EQUAL(file_read_all("/tmp", 7, &buf, NULL, err, sizeof(err)), TANDEM_EIO);
    CU_ASSERT_STRING_EQUAL(err, "/tmp: read error");
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
    CU_add_test(s, "file_read_all", test_file_read_all);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
