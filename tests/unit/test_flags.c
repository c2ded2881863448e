/* Command-line flag parsing shared by every binary. */
#include <CUnit/Basic.h>
#include <stdint.h>
#include <string.h>

#include "flags.h"
#include "tandem_err.h"

static const char *const backends[] = {"tiny", "sim", NULL};

struct opts {
    const char *id;
    int blocks;
    double scale;
    int colocated;
    uint64_t budget;
    int backend;
};

static int parse(struct opts *o, int argc, char **argv, char *err, size_t errlen)
{
    const struct flag f[] = {
        {"id", FLAG_STR, &o->id, "worker id", 0, 0, NULL},
        {"kv-blocks", FLAG_INT, &o->blocks, "KV blocks", 1, 1e6, NULL},
        {"time-scale", FLAG_DOUBLE, &o->scale, "time scale", 0, 100, NULL},
        {"colocated", FLAG_BOOL, &o->colocated, "colocated mode", 0, 0, NULL},
        {"kv-budget", FLAG_BYTES, &o->budget, "KV memory", 0, 0, NULL},
        {"backend", FLAG_CHOICE, &o->backend, "backend", 0, 0, backends},
    };
    return flags_parse(f, FLAGS_COUNT(f), argc, argv, 1, NULL, err, errlen);
}

static void test_parse_good(void)
{
    struct opts o = {"d0", 64, 1.0, 0, 0, 0};
    char *argv[] = {"prog",        "--id=decode-1", "--kv-blocks", "4096",      "--time-scale=0.5",
                    "--colocated", "--kv-budget",   "4GiB",        "--backend", "sim"};
    char err[256] = "";
    CU_ASSERT_EQUAL(parse(&o, 10, argv, err, sizeof(err)), FLAGS_OK);
    CU_ASSERT_STRING_EQUAL(o.id, "decode-1");
    CU_ASSERT_EQUAL(o.blocks, 4096);
    CU_ASSERT_DOUBLE_EQUAL(o.scale, 0.5, 0);
    CU_ASSERT_EQUAL(o.colocated, 1);
    CU_ASSERT_EQUAL(o.budget, 4294967296ull);
    CU_ASSERT_EQUAL(o.backend, 1);
}

static void test_parse_bad(void)
{
    struct opts o = {"d0", 64, 1.0, 0, 0, 0};
    char err[256];
    char *a1[] = {"prog", "--nope"};
    CU_ASSERT_EQUAL(parse(&o, 2, a1, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--nope"));
    char *a2[] = {"prog", "--kv-blocks", "12x"};
    CU_ASSERT_EQUAL(parse(&o, 3, a2, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--kv-blocks"));
    char *a3[] = {"prog", "--kv-blocks", "0"};
    CU_ASSERT_EQUAL(parse(&o, 3, a3, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "out of range"));
    char *a4[] = {"prog", "--backend", "gpu"};
    CU_ASSERT_EQUAL(parse(&o, 3, a4, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "tiny sim"));
    char *a5[] = {"prog", "--id"};
    CU_ASSERT_EQUAL(parse(&o, 2, a5, err, sizeof(err)), TANDEM_EINVAL);
    char *a6[] = {"prog", "stray"};
    CU_ASSERT_EQUAL(parse(&o, 2, a6, err, sizeof(err)), TANDEM_EINVAL);
    char *a7[] = {"prog", "--colocated=maybe"};
    CU_ASSERT_EQUAL(parse(&o, 2, a7, err, sizeof(err)), TANDEM_EINVAL);
    char *a8[] = {"prog", "--help"};
    CU_ASSERT_EQUAL(parse(&o, 2, a8, err, sizeof(err)), FLAGS_HELP);
    char *a9[] = {"prog", "--version"};
    CU_ASSERT_EQUAL(parse(&o, 2, a9, err, sizeof(err)), FLAGS_VERSION);
    /* Defaults are untouched by a failed parse of another flag. */
    CU_ASSERT_EQUAL(o.blocks, 64);
}

static void test_bytes(void)
{
    uint64_t v;
    CU_ASSERT_EQUAL(flags_parse_bytes("140e9", &v), 0);
    CU_ASSERT_EQUAL(v, 140000000000ull);
    CU_ASSERT_EQUAL(flags_parse_bytes("140GB", &v), 0);
    CU_ASSERT_EQUAL(v, 140000000000ull);
    CU_ASSERT_EQUAL(flags_parse_bytes("80GiB", &v), 0);
    CU_ASSERT_EQUAL(v, 85899345920ull);
    CU_ASSERT_EQUAL(flags_parse_bytes("512mib", &v), 0);
    CU_ASSERT_EQUAL(v, 536870912ull);
    CU_ASSERT_EQUAL(flags_parse_bytes("4096", &v), 0);
    CU_ASSERT_EQUAL(v, 4096ull);
    CU_ASSERT_EQUAL(flags_parse_bytes("-1", &v), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(flags_parse_bytes("1XB", &v), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(flags_parse_bytes("", &v), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(flags_parse_bytes("1e30", &v), TANDEM_EINVAL);
}

static void test_rest(void)
{
    const char *cfg = "x";
    const struct flag f[] = {{"config", FLAG_STR, &cfg, "file", 0, 0, NULL}};
    char *argv[] = {"tandem", "--config", "a.yaml", "plan", "--json"};
    int rest = -1;
    char err[128];
    CU_ASSERT_EQUAL(flags_parse(f, 1, 5, argv, 1, &rest, err, sizeof(err)), FLAGS_OK);
    CU_ASSERT_EQUAL(rest, 3);
    CU_ASSERT_STRING_EQUAL(cfg, "a.yaml");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("flags", NULL, NULL);
    CU_add_test(s, "parse_good", test_parse_good);
    CU_add_test(s, "parse_bad", test_parse_bad);
    CU_add_test(s, "bytes", test_bytes);
    CU_add_test(s, "rest", test_rest);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
