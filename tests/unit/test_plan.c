/* `tandem plan`: the arithmetic against hand-computed cases, flag parsing,
 * the JSON keys, and the binary's exit codes (TANDEM_BIN_DIR, set by ctest). */
#include <CUnit/Basic.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "flags.h"
#include "plan.h"
#include "tandem_err.h"

static int parse(struct plan_input *in, int argc, char **argv)
{
    char err[512];
    plan_input_init(in);
    return plan_parse_args(in, argc, argv, 1, err, sizeof(err));
}

static void test_kv_bytes(void)
{
    /* llama-3-70b: 2 x 80 x 8 x 128 x 2 = 327680 B = 320 KiB per token. */
    CU_ASSERT_EQUAL(plan_kv_bytes_per_token(80, 8, 128, KV_DTYPE_BF16), 327680u);
    CU_ASSERT_EQUAL(plan_kv_bytes_per_token(80, 8, 128, KV_DTYPE_F16), 327680u);
    CU_ASSERT_EQUAL(plan_kv_bytes_per_token(80, 8, 128, KV_DTYPE_F32), 655360u);
    CU_ASSERT_EQUAL(plan_kv_bytes_per_token(80, 8, 128, KV_DTYPE_FP8), 163840u);
    /* llama-3-8b: 2 x 32 x 8 x 128 x 2 = 131072 = 128 KiB. */
    CU_ASSERT_EQUAL(plan_kv_bytes_per_token(32, 8, 128, KV_DTYPE_BF16), 131072u);
}

/* llama-3-70b bf16, a 640 GB budget, 140e9 weight bytes. */
static void test_compute_70b(void)
{
    struct plan_input in;
    struct plan_result r;
    char err[256];
    char *argv[] = {"plan",           "--model",         "llama-3-70b", "--contexts",
                    "8192,131072",    "--kv-budget",     "640GB",       "--reads",
                    "1:8192,64:8192", "--weights-bytes", "140e9"};
    CU_ASSERT_EQUAL_FATAL(parse(&in, 11, argv), FLAGS_OK);
    CU_ASSERT_EQUAL_FATAL(plan_compute(&in, &r, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(r.kv_bytes_per_token, 327680u);
    CU_ASSERT_EQUAL(r.kv_budget, 640000000000u);
    CU_ASSERT_EQUAL(r.budget_source, PLAN_BUDGET_FLAG);
    CU_ASSERT_EQUAL(r.n_contexts, 2);
    /* 8192 x 327680 = 2684354560 B = 2.7 GB; 640e9 / that = 238.4 */
    CU_ASSERT_EQUAL(r.contexts[0].tokens, 8192);
    CU_ASSERT_EQUAL(r.contexts[0].bytes_per_sequence, 2684354560u);
    CU_ASSERT_EQUAL(r.contexts[0].sequences_fit, 238);
    /* 131072 x 327680 = 42949672960 B = 42.9 GB; 640e9 / that = 14.9 */
    CU_ASSERT_EQUAL(r.contexts[1].bytes_per_sequence, 42949672960u);
    CU_ASSERT_EQUAL(r.contexts[1].sequences_fit, 14);
    /* 140e9 / 1 + 8192 x 327680; 140e9 / 64 + 8192 x 327680 */
    CU_ASSERT_EQUAL(r.n_reads, 2);
    CU_ASSERT_EQUAL(r.reads[0].bytes_per_token, 142684354560.0);
    CU_ASSERT_EQUAL(r.reads[1].batch, 64);
    CU_ASSERT_EQUAL(r.reads[1].context, 8192);
    CU_ASSERT_EQUAL(r.reads[1].bytes_per_token, 2187500000.0 + 2684354560.0);
    CU_ASSERT_EQUAL(r.reads[1].bytes_per_step, 140e9 + 64.0 * 2684354560.0);
    CU_ASSERT_EQUAL(r.reads[0].step_seconds, -1.0); /* no GPU */
    CU_ASSERT_EQUAL(r.weights_fit, -1);

    /* The text output shows the same numbers with the stated units. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    plan_print_text(f, &in, &r);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "327680 B (320.0 KiB)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "2.7"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "42.9"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "238"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "142684354560"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "4871854560"));
    free(buf);
}

/* With a GPU: the decode lower bound and a budget derived from HBM. */
static void test_compute_gpu(void)
{
    struct plan_input in;
    struct plan_result r;
    char err[256];
    char *argv[] = {"plan",       "--model", "llama-3-8b", "--gpu",         "h100-sxm",
                    "--contexts", "8k",      "--reads",    "1:8192,32:2048"};
    CU_ASSERT_EQUAL_FATAL(parse(&in, 9, argv), FLAGS_OK);
    CU_ASSERT_EQUAL_FATAL(plan_compute(&in, &r, err, sizeof(err)), 0);
    /* Weights 2 x 8030261248 B; budget 80e9 x 0.9 - weights = 55939477504. */
    CU_ASSERT_EQUAL(r.budget_source, PLAN_BUDGET_GPU);
    CU_ASSERT_EQUAL(r.kv_budget, 55939477504u);
    CU_ASSERT_EQUAL(r.weights_fit, 1);
    /* 8192 x 131072 = 1073741824 B per sequence: 52 fit. */
    CU_ASSERT_EQUAL(r.contexts[0].bytes_per_sequence, 1073741824u);
    CU_ASSERT_EQUAL(r.contexts[0].sequences_fit, 52);
    double w = 16060522496.0;
    double step0 = (w + 1073741824.0) / 3.35e12;
    CU_ASSERT_DOUBLE_EQUAL(r.reads[0].step_seconds, step0, step0 * 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(r.reads[0].tokens_per_s, 1.0 / step0, 1e-9);
    double step1 = (w + 32.0 * 2048 * 131072) / 3.35e12;
    CU_ASSERT_DOUBLE_EQUAL(r.reads[1].step_seconds, step1, step1 * 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(r.reads[1].tokens_per_s, 32.0 / step1, 1e-9);

    /* tp 2 doubles the bandwidth and the HBM. */
    char *argv2[] = {"plan", "--model", "llama-3-70b", "--gpu", "h100-sxm",
                     "--tp", "2",       "--reads",     "1:8192"};
    CU_ASSERT_EQUAL_FATAL(parse(&in, 9, argv2), FLAGS_OK);
    CU_ASSERT_EQUAL_FATAL(plan_compute(&in, &r, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(r.kv_budget, 144000000000u - 141107412992u);
    double step = (141107412992.0 + 2684354560.0) / (2 * 3.35e12);
    CU_ASSERT_DOUBLE_EQUAL(r.reads[0].step_seconds, step, step * 1e-12);

    /* On one GPU the 70B weights do not fit: no derived budget. */
    char *argv3[] = {"plan", "--model", "llama-3-70b", "--gpu", "h100-sxm", "--contexts", "8192"};
    CU_ASSERT_EQUAL_FATAL(parse(&in, 7, argv3), FLAGS_OK);
    CU_ASSERT_EQUAL_FATAL(plan_compute(&in, &r, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(r.weights_fit, 0);
    CU_ASSERT_EQUAL(r.budget_source, PLAN_BUDGET_NONE);
    CU_ASSERT_EQUAL(r.contexts[0].sequences_fit, -1);
}

static void test_custom_shape(void)
{
    struct plan_input in;
    struct plan_result r;
    char err[256];
    char *argv[] = {"plan",       "--layers",   "80",         "--kv-heads", "8",
                    "--head-dim", "128",        "--kv-dtype", "fp8",        "--kv-budget",
                    "1GiB",       "--contexts", "1000"};
    CU_ASSERT_EQUAL_FATAL(parse(&in, 13, argv), FLAGS_OK);
    CU_ASSERT_PTR_NULL(in.model);
    CU_ASSERT_EQUAL(in.kv_dtype, KV_DTYPE_FP8);
    CU_ASSERT_EQUAL(in.kv_budget, 1073741824u);
    CU_ASSERT_EQUAL_FATAL(plan_compute(&in, &r, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(r.kv_bytes_per_token, 163840u);
    CU_ASSERT_EQUAL(r.contexts[0].sequences_fit, 1073741824 / 163840000);
    /* --reads needs weights when there is no preset. */
    char *argv2[] = {"plan",       "--layers", "80",      "--kv-heads", "8",
                     "--head-dim", "128",      "--reads", "1:1"};
    CU_ASSERT_EQUAL_FATAL(parse(&in, 9, argv2), FLAGS_OK);
    CU_ASSERT_EQUAL(plan_compute(&in, &r, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--weights-bytes"));
}

static void test_byte_syntax(void)
{
    const char *forms[] = {"140e9", "140GB", "140000000000", "140gb"};
    for (int i = 0; i < 4; i++) {
        struct plan_input in;
        char *argv[] = {"plan", "--model", "llama-3-70b", "--weights-bytes", (char *)forms[i]};
        CU_ASSERT_EQUAL(parse(&in, 5, argv), FLAGS_OK);
        CU_ASSERT_EQUAL(in.weights_bytes, 140000000000u);
    }
    struct plan_input in;
    char *argv[] = {"plan", "--model", "llama-3-70b", "--weights-bytes", "140GiB"};
    CU_ASSERT_EQUAL(parse(&in, 5, argv), FLAGS_OK);
    CU_ASSERT_EQUAL(in.weights_bytes, 140ull * 1073741824ull);
}

static void test_lists(void)
{
    int64_t c[PLAN_MAX_ITEMS];
    int n = -1;
    CU_ASSERT_EQUAL(plan_parse_contexts("8192,131072", c, PLAN_MAX_ITEMS, &n), 0);
    CU_ASSERT_EQUAL(n, 2);
    CU_ASSERT_EQUAL(c[0], 8192);
    CU_ASSERT_EQUAL(c[1], 131072);
    CU_ASSERT_EQUAL(plan_parse_contexts("8k,128K,1", c, PLAN_MAX_ITEMS, &n), 0);
    CU_ASSERT_EQUAL(n, 3);
    CU_ASSERT_EQUAL(c[0], 8192);
    CU_ASSERT_EQUAL(c[1], 131072);
    CU_ASSERT_EQUAL(c[2], 1);
    const char *bad[] = {"",     ",",   "8192,", ",8192", "0",         "-1",
                         "abc",  "8kk", "k",     "1.5",   "100000001", "99999999999999999999999",
                         " 8192"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CU_ASSERT_EQUAL(plan_parse_contexts(bad[i], c, PLAN_MAX_ITEMS, &n), TANDEM_EINVAL);
    }
    CU_ASSERT_EQUAL(plan_parse_contexts("1,2,3", c, 2, &n), TANDEM_EINVAL); /* too many */

    struct plan_read r[PLAN_MAX_ITEMS];
    CU_ASSERT_EQUAL(plan_parse_reads("1:8192,64:8k", r, PLAN_MAX_ITEMS, &n), 0);
    CU_ASSERT_EQUAL(n, 2);
    CU_ASSERT_EQUAL(r[0].batch, 1);
    CU_ASSERT_EQUAL(r[0].context, 8192);
    CU_ASSERT_EQUAL(r[1].batch, 64);
    CU_ASSERT_EQUAL(r[1].context, 8192);
    const char *badr[] = {"", "1", "1:", ":8", "0:8", "1:0", "1-8192", "1:8:8", "1:8,", "a:1"};
    for (size_t i = 0; i < sizeof(badr) / sizeof(badr[0]); i++) {
        CU_ASSERT_EQUAL(plan_parse_reads(badr[i], r, PLAN_MAX_ITEMS, &n), TANDEM_EINVAL);
    }
}

static void test_bad_args(void)
{
    struct plan_input in;
    char *a1[] = {"plan", "--bogus"};
    CU_ASSERT_EQUAL(parse(&in, 2, a1), TANDEM_EINVAL);
    char *a2[] = {"plan", "--model", "llama-2"};
    CU_ASSERT_EQUAL(parse(&in, 3, a2), TANDEM_EINVAL);
    char *a3[] = {"plan", "--layers", "80", "--kv-heads", "8"};
    CU_ASSERT_EQUAL(parse(&in, 5, a3), TANDEM_EINVAL);
    char *a4[] = {"plan", "--layers", "0", "--kv-heads", "8", "--head-dim", "128"};
    CU_ASSERT_EQUAL(parse(&in, 7, a4), TANDEM_EINVAL);
    char *a5[] = {"plan", "--model", "llama-3-8b", "--layers", "8"};
    CU_ASSERT_EQUAL(parse(&in, 5, a5), TANDEM_EINVAL);
    char *a6[] = {"plan", "--model", "llama-3-8b", "--kv-dtype", "fp9"};
    CU_ASSERT_EQUAL(parse(&in, 5, a6), TANDEM_EINVAL);
    char *a7[] = {"plan", "--model", "llama-3-8b", "--gpu", "h100"};
    CU_ASSERT_EQUAL(parse(&in, 5, a7), TANDEM_EINVAL);
    char *a8[] = {"plan", "--model", "llama-3-8b", "--tp", "0"};
    CU_ASSERT_EQUAL(parse(&in, 5, a8), TANDEM_EINVAL);
    char *a9[] = {"plan", "--model", "llama-3-8b", "--weights-bytes", "lots"};
    CU_ASSERT_EQUAL(parse(&in, 5, a9), TANDEM_EINVAL);
    char *a10[] = {"plan", "--model", "llama-3-8b", "--reads", "8192"};
    CU_ASSERT_EQUAL(parse(&in, 5, a10), TANDEM_EINVAL);
    char *a11[] = {"plan", "--model", "llama-3-8b", "extra"};
    CU_ASSERT_EQUAL(parse(&in, 4, a11), TANDEM_EINVAL);
    char *a12[] = {"plan", "--help"};
    CU_ASSERT_EQUAL(parse(&in, 2, a12), FLAGS_HELP);
    /* The message names the flag. */
    char err[512];
    plan_input_init(&in);
    char *a13[] = {"plan", "--model", "llama-3-8b", "--contexts", "8192,zz"};
    CU_ASSERT_EQUAL(plan_parse_args(&in, 5, a13, 1, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--contexts"));
}

static void test_json(void)
{
    struct plan_input in;
    struct plan_result r;
    char err[256];
    char *argv[] = {"plan",        "--model", "llama-3-70b", "--contexts",     "8192,131072",
                    "--kv-budget", "640e9",   "--reads",     "1:8192,64:8192", "--weights-bytes",
                    "140e9",       "--gpu",   "h100-sxm",    "--tp",           "8",
                    "--json"};
    CU_ASSERT_EQUAL_FATAL(parse(&in, 16, argv), FLAGS_OK);
    CU_ASSERT_EQUAL(in.json, 1);
    CU_ASSERT_EQUAL_FATAL(plan_compute(&in, &r, err, sizeof(err)), 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(plan_print_json(f, &in, &r), 0);
    fclose(f);
    json_error_t jerr;
    json_t *root = json_loads(buf, 0, &jerr);
    free(buf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(root, "kv_bytes_per_token")), 327680);
    CU_ASSERT_EQUAL(json_real_value(json_object_get(root, "kv_kib_per_token")), 320.0);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(root, "model")), "llama-3-70b");
    json_t *cs = json_object_get(root, "contexts");
    CU_ASSERT_EQUAL_FATAL(json_array_size(cs), 2);
    json_t *c1 = json_array_get(cs, 1);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(c1, "tokens")), 131072);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(c1, "bytes_per_sequence")), 42949672960LL);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(c1, "sequences_fit")), 14);
    json_t *rs = json_object_get(root, "reads");
    CU_ASSERT_EQUAL_FATAL(json_array_size(rs), 2);
    json_t *r0 = json_array_get(rs, 0);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(r0, "batch")), 1);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(r0, "context")), 8192);
    CU_ASSERT_EQUAL(json_number_value(json_object_get(r0, "bytes_per_token")), 142684354560.0);
    double step = 142684354560.0 / (8 * 3.35e12);
    CU_ASSERT_DOUBLE_EQUAL(json_number_value(json_object_get(r0, "step_seconds_min")), step,
                           step * 1e-12);
    json_t *g = json_object_get(root, "gpu");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(g, "name")), "h100-sxm");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(g, "tp")), 8);
    json_decref(root);
}

/* Runs "$TANDEM_BIN_DIR/tandem args", returns its exit code and (when out
 * is not NULL) up to cap-1 bytes of its stdout. */
static int run_tandem(const char *args, char *out, size_t cap)
{
    const char *dir = getenv("TANDEM_BIN_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s/tandem' %s 2>/dev/null", dir, args);
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return -1;
    }
    size_t n = 0;
    char tmp[4096];
    size_t got;
    while ((got = fread(tmp, 1, sizeof(tmp), p)) > 0) {
        for (size_t i = 0; out != NULL && i < got && n + 1 < cap; i++) {
            out[n++] = tmp[i];
        }
    }
    if (out != NULL) {
        out[n] = '\0';
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_binary(void)
{
    if (getenv("TANDEM_BIN_DIR") == NULL) {
        fprintf(stderr, "\nTANDEM_BIN_DIR is not set (run through ctest): binary not tested\n");
        CU_FAIL("TANDEM_BIN_DIR not set");
        return;
    }
    static char out[65536];
    CU_ASSERT_EQUAL(run_tandem("--version", out, sizeof(out)), 0);
    CU_ASSERT_STRING_EQUAL(out, "tandem 0.1.0\n");
    CU_ASSERT_EQUAL(run_tandem("--help", out, sizeof(out)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "plan"));
    CU_ASSERT_EQUAL(run_tandem("plan --help", out, sizeof(out)), 0);
    const char *flags[] = {"--model",    "--layers",        "--kv-heads",  "--head-dim",
                           "--kv-dtype", "--weights-bytes", "--kv-budget", "--contexts",
                           "--reads",    "--gpu",           "--tp",        "--hbm-util",
                           "--json",     "default: bf16"};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        CU_ASSERT_PTR_NOT_NULL(strstr(out, flags[i]));
    }
    CU_ASSERT_EQUAL(run_tandem("plan --model llama-3-70b --contexts 8192,131072 --kv-budget 640GB "
                               "--reads 1:8192 --json",
                               out, sizeof(out)),
                    0);
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(root, "kv_bytes_per_token")), 327680);
    json_decref(root);
    CU_ASSERT_EQUAL(run_tandem("plan --model llama-3-8b --contexts 8192", out, sizeof(out)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "131072 B (128.0 KiB)"));
    CU_ASSERT_EQUAL(run_tandem("plan --bogus", NULL, 0), 2);
    CU_ASSERT_EQUAL(run_tandem("plan --model nope", NULL, 0), 2);
    CU_ASSERT_EQUAL(run_tandem("plan --model llama-3-8b --contexts x", NULL, 0), 2);
    CU_ASSERT_EQUAL(run_tandem("plan --layers 8", NULL, 0), 2);
    CU_ASSERT_EQUAL(run_tandem("plan --model llama-3-8b --tp", NULL, 0), 2);
    CU_ASSERT_EQUAL(run_tandem("frobnicate", NULL, 0), 2);
    CU_ASSERT_EQUAL(run_tandem("", NULL, 0), 2);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("plan", NULL, NULL);
    CU_add_test(s, "kv_bytes", test_kv_bytes);
    CU_add_test(s, "compute_70b", test_compute_70b);
    CU_add_test(s, "compute_gpu", test_compute_gpu);
    CU_add_test(s, "custom_shape", test_custom_shape);
    CU_add_test(s, "byte_syntax", test_byte_syntax);
    CU_add_test(s, "lists", test_lists);
    CU_add_test(s, "bad_args", test_bad_args);
    CU_add_test(s, "json", test_json);
    CU_add_test(s, "binary", test_binary);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
