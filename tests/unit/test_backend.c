/* The table of backends (engine/backend.c): lookup by name and by instance,
 * the names a flag offers and the error for an unknown one, and each
 * descriptor's defaults, KV capacity, construction errors and KV-link model,
 * pinned to what the workers used before the table existed (the values in
 * the `engine:` line a worker logs at start). */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "calibration.h"
#include "flags.h"
#include "kv_cache.h"
#include "log.h"
#include "sim.h"
#include "tandem_err.h"
#include "tiny.h"

#define EXPECT_INT(got, want)                                                                      \
    do {                                                                                           \
        long long g_ = (long long)(got), w_ = (long long)(want);                                   \
        if (g_ != w_) {                                                                            \
            fprintf(stderr, "\n%s:%d: %s == %lld, want %lld\n", __FILE__, __LINE__, #got, g_, w_); \
        }                                                                                          \
        CU_ASSERT(g_ == w_);                                                                       \
    } while (0)

#define EXPECT_STR(got, want)                                                                      \
    do {                                                                                           \
        const char *g_ = (got), *w_ = (want);                                                      \
        int ok_ = g_ != NULL && w_ != NULL ? strcmp(g_, w_) == 0 : g_ == w_;                       \
        if (!ok_) {                                                                                \
            fprintf(stderr, "\n%s:%d: %s == \"%s\", want \"%s\"\n", __FILE__, __LINE__, #got,      \
                    g_ ? g_ : "(null)", w_ ? w_ : "(null)");                                       \
        }                                                                                          \
        CU_ASSERT(ok_);                                                                            \
    } while (0)

/* The worker's settings when only --backend is given (wk_config_defaults). */
static struct backend_params default_params(void)
{
    return (struct backend_params){
        .gpu = "h100-sxm", .tp = 1, .link = "ib-400g", .time_scale = 1.0};
}

static void test_lookup(void)
{
    EXPECT_INT(backend_count(), 2);
    EXPECT_STR(backend_names[0], "tiny");
    EXPECT_STR(backend_names[1], "sim");
    CU_ASSERT_PTR_NULL(backend_names[2]);
    for (size_t i = 0; i < backend_count(); i++) {
        const struct backend_desc *d = backend_at(i);
        CU_ASSERT_PTR_NOT_NULL_FATAL(d);
        EXPECT_STR(d->name, backend_names[i]);
        EXPECT_STR(d->ops->name, d->name);
        CU_ASSERT_PTR_EQUAL(backend_find(d->name), d);
        CU_ASSERT_PTR_NOT_NULL(d->create);
        CU_ASSERT_PTR_NOT_NULL(d->kv_capacity);
        CU_ASSERT_PTR_NOT_NULL(d->model_known);
        CU_ASSERT_PTR_NOT_NULL(d->model_names);
    }
    CU_ASSERT_PTR_NULL(backend_at(2));
    CU_ASSERT_PTR_EQUAL(backend_find("tiny"), &tiny_backend);
    CU_ASSERT_PTR_EQUAL(backend_find("sim"), &sim_backend);
    /* The worker's --backend default is index 0, the cluster file's default the same. */
    CU_ASSERT_PTR_EQUAL(backend_default(), &tiny_backend);
    CU_ASSERT_PTR_NULL(backend_find("nope"));
    CU_ASSERT_PTR_NULL(backend_find("Tiny"));
    CU_ASSERT_PTR_NULL(backend_find("si"));
    CU_ASSERT_PTR_NULL(backend_find(""));
    CU_ASSERT_PTR_NULL(backend_find(NULL));
    CU_ASSERT_PTR_EQUAL(backend_reading(BACKEND_READS_FILES), &tiny_backend);
    CU_ASSERT_PTR_EQUAL(backend_reading(BACKEND_READS_HARDWARE), &sim_backend);
    CU_ASSERT_PTR_NULL(backend_reading(0));
}

/* A --backend flag over the table: the index it stores, and the message for a
 * name the table does not have (what tandem-prefill prints). */
static void test_flag(void)
{
    int idx = -1;
    struct flag f[] = {{"backend", FLAG_CHOICE, &idx, "model backend", 0, 0, backend_names}};
    char err[256] = "";
    char *ok[] = {"x", "--backend", "sim"};
    EXPECT_INT(flags_parse(f, 1, 3, ok, 1, NULL, err, sizeof(err)), FLAGS_OK);
    EXPECT_INT(idx, 1);
    CU_ASSERT_PTR_EQUAL(backend_at((size_t)idx), &sim_backend);
    char *bad[] = {"x", "--backend", "nope"};
    EXPECT_INT(flags_parse(f, 1, 3, bad, 1, NULL, err, sizeof(err)), TANDEM_EINVAL);
    EXPECT_STR(err, "--backend: 'nope' is not one of tiny sim");
}

static void test_defaults(void)
{
    const struct backend_desc *t = backend_find("tiny"), *s = backend_find("sim");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    EXPECT_STR(t->default_model, "tiny");
    EXPECT_INT(t->default_kv_dtype, KV_DTYPE_F32);
    EXPECT_INT(t->default_payload_div, 1);
    EXPECT_INT(!(t->reads & BACKEND_READS_PAYLOAD), 1);
    EXPECT_INT(t->default_token_budget, 128);
    EXPECT_INT(t->reads, BACKEND_READS_FILES);
    CU_ASSERT_PTR_NULL(t->transfer_seconds);
    CU_ASSERT_PTR_NULL(t->time_scale);
    CU_ASSERT_PTR_NULL(t->step_seconds);

    EXPECT_STR(s->default_model, "llama-3-8b");
    EXPECT_INT(s->default_kv_dtype, KV_DTYPE_BF16);
    EXPECT_INT(s->default_payload_div, -1);
    EXPECT_INT(!(s->reads & BACKEND_READS_PAYLOAD), 0);
    EXPECT_INT(s->default_token_budget, 2048);
    EXPECT_INT(s->reads, BACKEND_READS_HARDWARE | BACKEND_READS_PAYLOAD);
    CU_ASSERT_PTR_NOT_NULL(s->transfer_seconds);
    CU_ASSERT_PTR_NOT_NULL(s->time_scale);
    CU_ASSERT_PTR_NOT_NULL(s->step_seconds);

    CU_ASSERT(t->model_known("tiny"));
    CU_ASSERT(!t->model_known("llama-3-8b"));
    CU_ASSERT(s->model_known("llama-3-8b"));
    CU_ASSERT(!s->model_known("tiny"));
    char names[512];
    t->model_names(names, sizeof(names));
    EXPECT_STR(names, "tiny");
    s->model_names(names, sizeof(names));
    CU_ASSERT(strncmp(names, "llama-3-8b, ", 12) == 0);
}

/* The default instance of each backend, its capacity with neither
 * --kv-blocks nor --kv-memory, and the table's way back from it. */
static void test_create_capacity(void)
{
    char err[256] = "";
    struct backend_params p = default_params();
    struct backend *be = NULL;
    int32_t n = -1;

    const struct backend_desc *t = backend_find("tiny");
    EXPECT_INT(t->create(&be, &p, err, sizeof(err)), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(be);
    EXPECT_STR(be->info.name, "tiny");
    CU_ASSERT_PTR_EQUAL(backend_of(be), t);
    EXPECT_INT(t->kv_capacity(be, KV_DTYPE_F32, 16, &n, err, sizeof(err)), 0);
    EXPECT_INT(n, 2048);
    be->ops->destroy(be);

    be = NULL;
    const struct backend_desc *s = backend_find("sim");
    p.time_scale = 0.25;
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(be);
    EXPECT_STR(be->info.name, "llama-3-8b");
    CU_ASSERT_PTR_EQUAL(backend_of(be), s);
    /* 26674 blocks: the engine line of `tandem-prefill --backend sim`. */
    EXPECT_INT(s->kv_capacity(be, KV_DTYPE_BF16, 16, &n, err, sizeof(err)), 0);
    EXPECT_INT(n, 26674);
    CU_ASSERT(s->time_scale(be) == 0.25);
    CU_ASSERT(s->transfer_seconds(be, 0) > 0);
    CU_ASSERT(s->transfer_seconds(be, 1u << 30) == sim_transfer_seconds(be, 1u << 30));
    /* The step time a live worker times its steps with (worker.c). */
    CU_ASSERT(s->step_seconds(be) == 0);
    uint32_t tok[4] = {1, 2, 3, 4};
    struct be_seq seq = {.history = tok, .seed = 1};
    struct be_out out;
    EXPECT_INT(be->ops->prefill(be, NULL, &seq, tok, 4, &out, NULL), 0);
    be->ops->step_end(be);
    CU_ASSERT(s->step_seconds(be) > 0.001);
    CU_ASSERT(s->step_seconds(be) == sim_last_step_seconds(be));
    be->ops->destroy(be);

    CU_ASSERT_PTR_NULL(backend_of(NULL));
    struct backend_ops fake_ops = {.name = "fake"};
    struct backend fake = {.ops = &fake_ops};
    CU_ASSERT_PTR_NULL(backend_of(&fake));
}

/* Construction errors: the messages the worker prints, naming its flags. */
static void test_create_errors(void)
{
    char err[256] = "";
    struct backend *be = NULL;
    const struct backend_desc *t = backend_find("tiny"), *s = backend_find("sim");

    struct backend_params p = default_params();
    p.model = "foo";
    EXPECT_INT(t->create(&be, &p, err, sizeof(err)), TANDEM_EINVAL);
    EXPECT_STR(err, "--model: unknown tiny model 'foo' (the tiny backend has 'tiny'; give "
                    "--checkpoint FILE for others)");
    p.model = "tiny";
    p.checkpoint = "/nonexistent";
    EXPECT_INT(t->create(&be, &p, err, sizeof(err)), TANDEM_EINVAL);
    EXPECT_STR(err, "--model conflicts with --checkpoint (the file names it)");

    p = default_params();
    p.checkpoint = "x";
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), TANDEM_EINVAL);
    EXPECT_STR(err, "--checkpoint is for the tiny backend only");
    p = default_params();
    p.tokenizer = "x";
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), TANDEM_EINVAL);
    EXPECT_STR(err, "--tokenizer is for the tiny backend only");
    p = default_params();
    p.gpu = "h900";
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT(strncmp(err, "--gpu: unknown preset 'h900' (one of: ", 38) == 0);
    p = default_params();
    p.model = "llama-3-70b";
    p.gpu = "a100-80g";
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), TANDEM_ECONFIG);
    EXPECT_STR(err, "sim backend (--model llama-3-70b --gpu a100-80g --tp 1): bad configuration");
    CU_ASSERT_PTR_NULL(be);
}

/* The efficiency flags: auto takes the calibration table's values for a
 * calibrated pair and the global defaults otherwise; a number always wins;
 * bad text is refused with the flag named. */
static void test_calibration_default(void)
{
    char err[256] = "";
    struct backend *be = NULL;
    struct sim_config c;
    const struct backend_desc *s = backend_find("sim");
    const struct calibration *cal = calibration_find("llama-2-7b", "h100-sxm");
    CU_ASSERT_PTR_NOT_NULL_FATAL(cal);
    CU_ASSERT_PTR_NULL(calibration_find("llama-3-70b", "h100-sxm"));

    struct backend_params p = default_params();
    p.model = "llama-2-7b"; /* calibrated on h100-sxm: every field from the table */
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), 0);
    sim_config_of(be, &c);
    CU_ASSERT(c.mfu == cal->mfu && c.mbu == cal->mbu && c.step_overhead_s == cal->step_overhead_s);
    CU_ASSERT(c.mfu != SIM_DEFAULT_MFU && c.step_overhead_s != SIM_DEFAULT_OVERHEAD_S);
    be->ops->destroy(be);

    p.mfu = "0.3"; /* explicit wins; the others stay calibrated */
    p.mbu = "auto";
    p.step_overhead_ms = "0";
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), 0);
    sim_config_of(be, &c);
    CU_ASSERT(c.mfu == 0.3 && c.mbu == cal->mbu && c.step_overhead_s == 0.0);
    be->ops->destroy(be);

    p = default_params(); /* llama-3-8b: uncalibrated, the global defaults */
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), 0);
    sim_config_of(be, &c);
    CU_ASSERT(c.mfu == SIM_DEFAULT_MFU && c.mbu == SIM_DEFAULT_MBU &&
              c.step_overhead_s == SIM_DEFAULT_OVERHEAD_S);
    be->ops->destroy(be);

    be = NULL;
    p.mbu = "1.5";
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), TANDEM_EINVAL);
    EXPECT_STR(err, "--mbu: expected auto or a number in (0, 1], got '1.5'");
    p.mbu = NULL;
    p.step_overhead_ms = "-1";
    EXPECT_INT(s->create(&be, &p, err, sizeof(err)), TANDEM_EINVAL);
    EXPECT_STR(err, "--step-overhead-ms: expected auto or a number in [0, 1000000], got '-1'");
    CU_ASSERT_PTR_NULL(be);
}

int main(void)
{
    log_init("test_backend", LOG_LEVEL_ERROR);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("backend", NULL, NULL);
    CU_add_test(s, "lookup", test_lookup);
    CU_add_test(s, "flag", test_flag);
    CU_add_test(s, "defaults", test_defaults);
    CU_add_test(s, "create_capacity", test_create_capacity);
    CU_add_test(s, "create_errors", test_create_errors);
    CU_add_test(s, "calibration_default", test_calibration_default);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
