/* One description per setting (common/settings.h, worker/wk_config.h): for
 * every worker setting of wk_settings, a value other than the default set
 * through each path it has (the flag, the cluster-file key, the argv `tandem
 * up` builds from that cluster, an experiment's cluster_overrides) gives the
 * same struct worker_config. A setting added to the table is covered without
 * changing this test (string settings the cluster loader checks against
 * presets have a sample value below). Also the value parser's messages. */
#include <CUnit/Basic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster.h"
#include "experiment/exp_derive.h"
#include "experiment/exp_file.h"
#include "flags.h"
#include "kv_dtype.h"
#include "backend.h"
#include "settings.h"
#include "tandem_err.h"
#include "up.h"
#include "wk_config.h"

static char src_dir[PATH_MAX];
static char tmp_dir[] = "/tmp/test_settings-XXXXXX";

/* Values the cluster loader checks beyond their type. */
static const struct {
    const char *name, *value;
} samples[] = {
    {"model", "llama-3-70b"}, {"gpu", "h200"}, {"link", "nvlink"},        {"payload", "1/4"},
    {"mfu", "0.4"},           {"mbu", "0.6"},  {"step-overhead-ms", "2"},
};

/* A value of s other than its default, as text. */
static void sample(const struct setting *s, char *out, size_t len)
{
    for (size_t i = 0; i < sizeof(samples) / sizeof(samples[0]); i++) {
        if (strcmp(samples[i].name, s->name) == 0) {
            snprintf(out, len, "%s", samples[i].value);
            return;
        }
    }
    int n = 0;
    const char *const *ch;
    switch (s->type) {
    case FLAG_STR:
        if (s->flags & SETTING_PATH) { /* a readable file, by its real path */
            snprintf(out, len, "%s/deploy/clusters/tiny-1p1d.yaml", src_dir);
        } else {
            snprintf(out, len, "sample-%s", s->name);
        }
        return;
    case FLAG_INT:
        snprintf(out, len, "%d",
                 (int)(s->min >= s->max || s->def + 1 <= s->max ? s->def + 1 : s->def - 1));
        return;
    case FLAG_DOUBLE:
        snprintf(out, len, "%.17g", s->def != 0 ? s->def / 2 : 0.5);
        return;
    case FLAG_BOOL:
        snprintf(out, len, "%s", s->def != 0 ? "false" : "true");
        return;
    case FLAG_BYTES:
        snprintf(out, len, "%.0f", s->def + 4096);
        return;
    case FLAG_CHOICE:
        ch = settings_choices(s);
        while (ch[n]) {
            n++;
        }
        snprintf(out, len, "%s", ch[((int)s->def + 1) % n]);
        return;
    }
}

/* The backend a cluster testing s runs: the first that reads s, else sim
 * (the samples are sim presets). */
static const char *backend_for(const struct setting *s)
{
    return s->reads ? backend_reading(s->reads)->name : "sim";
}

/* Every setting but skip equals its default in cfg. */
static void assert_defaults_but(const struct worker_config *cfg, int skip)
{
    struct worker_config def;
    wk_config_defaults(&def);
    for (size_t i = 0; i < wk_n_settings; i++) {
        if ((int)i != skip && !settings_equal(&wk_settings[i], cfg, &def)) {
            printf("\n  --%s changed --%s too\n", wk_settings[skip].name, wk_settings[i].name);
            CU_FAIL("a flag set another setting");
        }
    }
}

static void assert_same(const struct setting *s, const struct worker_config *want,
                        const struct worker_config *got, const char *path)
{
    char a[PATH_MAX + 64], b[PATH_MAX + 64];
    if (!settings_equal(s, want, got)) {
        settings_format(s, want, a, sizeof(a));
        settings_format(s, got, b, sizeof(b));
        printf("\n  %s: --%s: flag gives '%s', %s gives '%s'\n", path, s->name, a, path, b);
        CU_FAIL("paths disagree");
    }
}

static int parse_argv(struct worker_config *cfg, int argc, char **argv)
{
    char err[512] = "";
    int rc = wk_config_parse(cfg, argc, argv, "tandem-decode", 1, NULL, err, sizeof(err));
    if (rc != FLAGS_OK) {
        printf("\n  flags: %s\n", err);
    }
    return rc;
}

static struct cluster *cluster_with(const struct setting *s, const char *value)
{
    char text[PATH_MAX + 256], err[CLUSTER_ERR_MAX];
    snprintf(text, sizeof(text), "backend: %s\npools:\n  decode:\n    count: 1\n%s%s%s%s",
             backend_for(s), value ? "    " : "", value ? s->key : "", value ? ": " : "",
             value ? value : "");
    if (value) {
        strcat(text, "\n");
    }
    struct cluster *c = NULL;
    if (cluster_parse(&c, text, strlen(text), "t.yaml", tmp_dir, err, sizeof(err)) != 0) {
        printf("\n  cluster: %s\n%s", err, text);
    }
    return c;
}

/* The worker argv tandem up builds for c, parsed by the worker's flags. */
static void argv_path(const struct cluster *c, const struct worker_config *want)
{
    struct up_plan plan;
    struct up_plan_input in = {
        .bin_dir = "/bin", .run_dir = tmp_dir, .ipc_dir = tmp_dir, .no_router = 1};
    char err[512];
    CU_ASSERT_EQUAL_FATAL(up_plan_build(&plan, c, &in, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL_FATAL(plan.n, 1);
    struct worker_config got;
    CU_ASSERT_EQUAL(parse_argv(&got, plan.procs[0].argc, plan.procs[0].argv), FLAGS_OK);
    for (size_t i = 0; i < wk_n_settings; i++) {
        if (!(wk_settings[i].flags & SETTING_MANAGED)) {
            assert_same(&wk_settings[i], want, &got, "tandem up's argv");
        }
    }
    up_plan_free(&plan);
}

static void override_path(int i, const char *value, const struct worker_config *want)
{
    const struct setting *s = &wk_settings[i];
    char cpath[PATH_MAX], text[3 * PATH_MAX], err[EXP_ERR_MAX] = "", cf[PATH_MAX];
    struct cluster *base = cluster_with(s, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(base);
    snprintf(cpath, sizeof(cpath), "%s/base.cluster.yaml", tmp_dir);
    FILE *f = fopen(cpath, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(cluster_write(base, f), 0);
    fclose(f);
    cluster_free(base);
    snprintf(text, sizeof(text),
             "name: o\nconfigs:\n- cluster: %s\n  label: o\nrates: [1]\n"
             "cluster_overrides:\n  %s: \"%s\"\n",
             cpath, s->key, value);
    struct exp_file *e = NULL;
    int rc = exp_parse(&e, text, strlen(text), "o.yaml", tmp_dir, err, sizeof(err));
    if (rc != 0) {
        printf("\n  experiment: %s\n", err);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    double ts;
    rc = exp_prepare(e, 0, tmp_dir, cf, sizeof(cf), &ts, err, sizeof(err));
    if (rc != 0) {
        printf("\n  exp_prepare: %s\n", err);
    }
    CU_ASSERT_EQUAL(rc, 0);
    struct cluster *c = NULL;
    CU_ASSERT_EQUAL(cluster_load(&c, cf, err, sizeof(err)), 0);
    if (c) {
        assert_same(s, want, &c->pools[CLUSTER_DECODE].cfg, "cluster_overrides");
        CU_ASSERT(cluster_pool_has(&c->pools[CLUSTER_DECODE], s->name));
        cluster_free(c);
    }
    exp_free(e);
}

static void test_every_path_agrees(void)
{
    int pools = 0, overrides = 0;
    for (size_t i = 0; i < wk_n_settings; i++) {
        const struct setting *s = &wk_settings[i];
        char value[PATH_MAX + 64], flag[PATH_MAX + 160];
        sample(s, value, sizeof(value));
        /* The flag: this setting and nothing else changes. */
        struct worker_config byflag;
        snprintf(flag, sizeof(flag), "--%s=%s", s->name, value);
        char *argv[] = {"tandem-decode", flag, NULL};
        CU_ASSERT_EQUAL_FATAL(parse_argv(&byflag, 2, argv), FLAGS_OK);
        struct worker_config def;
        wk_config_defaults(&def);
        if (settings_equal(s, &byflag, &def)) {
            printf("\n  --%s=%s is the default\n", s->name, value);
            CU_FAIL("the sample must differ from the default");
        }
        assert_defaults_but(&byflag, (int)i);
        if (!(s->flags & SETTING_POOL)) {
            continue;
        }
        /* The cluster-file key gives the same value, and so does the argv
         * tandem up builds from that cluster. */
        pools++;
        struct cluster *c = cluster_with(s, value);
        CU_ASSERT_PTR_NOT_NULL_FATAL(c);
        struct worker_config bykey;
        uint64_t set;
        cluster_worker_config(c, CLUSTER_DECODE, &bykey, &set);
        assert_same(s, &byflag, &bykey, "the cluster key");
        CU_ASSERT(set & ((uint64_t)1 << i));
        argv_path(c, &bykey);
        cluster_free(c);
        if (s->flags & SETTING_OVERRIDE) {
            overrides++;
            override_path((int)i, value, &byflag);
        }
    }
    CU_ASSERT(pools >= 14);
    CU_ASSERT(overrides >= 6);
}

/* The file form's checks and messages (cluster files and overrides). */
static void test_parse_value(void)
{
    struct worker_config cfg;
    wk_config_defaults(&cfg);
    char why[256];
    const struct setting *mr = &wk_settings[wk_setting("max-running")];
    CU_ASSERT_EQUAL(settings_parse_value(mr, "0", &cfg, why, sizeof(why)), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(why, "expected an integer in [1, 65536], got '0'");
    CU_ASSERT_EQUAL(settings_parse_value(mr, "65536", &cfg, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(cfg.max_running, 65536);
    CU_ASSERT_EQUAL(settings_parse_value(mr, "65537", &cfg, why, sizeof(why)), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(settings_parse_value(mr, "7x", &cfg, why, sizeof(why)), TANDEM_EINVAL);
    const struct setting *dt = &wk_settings[wk_setting("kv-dtype")];
    CU_ASSERT_EQUAL(settings_parse_value(dt, "int4", &cfg, why, sizeof(why)), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(why, "expected one of auto, f32, f16, bf16, fp8, got 'int4'");
    CU_ASSERT_EQUAL(settings_parse_value(dt, "fp8", &cfg, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(cfg.kv_dtype, 4);
    const struct setting *pl = &wk_settings[wk_setting("payload")];
    CU_ASSERT_EQUAL(settings_parse_value(pl, "half", &cfg, why, sizeof(why)), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(why, "expected auto, full, none or 1/N, got 'half'");
    const struct setting *km = &wk_settings[wk_setting("kv-memory")];
    CU_ASSERT_EQUAL(settings_parse_value(km, "0", &cfg, why, sizeof(why)), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(why, "expected a byte count such as 40GiB, 512MiB or 1e9, got '0'");
    CU_ASSERT_EQUAL(settings_parse_value(km, "1GiB", &cfg, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(cfg.kv_memory, 1ull << 30);
    const struct setting *ts = &wk_settings[wk_setting("time-scale")];
    CU_ASSERT_EQUAL(settings_parse_value(ts, "-1", &cfg, why, sizeof(why)), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(why, "expected a number in [0, 1e+06], got '-1'");
}

/* The help of setting name contains want; prints both when not. */
static void expect_help_has(const char *name, const char *want)
{
    int i = wk_setting(name);
    CU_ASSERT_FATAL(i >= 0);
    const char *help = wk_settings[i].help;
    if (strstr(help, want) == NULL) {
        printf("\n  --%s: help \"%s\" does not say \"%s\"\n", name, help, want);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(help, want));
}

static const char *payload_word(int div)
{
    return div == 1 ? "full" : div < 0 ? "none" : "1/N";
}

/* Five help texts of wk_settings name tiny's and sim's defaults by hand (so
 * --help stays as it was): they must say what the descriptors hold. */
static void test_help_states_backend_defaults(void)
{
    const struct backend_desc *t = backend_find("tiny"), *s = backend_find("sim");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    char want[256];
    snprintf(want, sizeof(want), "tiny: '%s' (embedded weights); sim: a model preset (default %s)",
             t->default_model, s->default_model);
    expect_help_has("model", want);
    snprintf(want, sizeof(want), "(auto: %s for tiny, %s for sim)",
             payload_word(t->default_payload_div), payload_word(s->default_payload_div));
    expect_help_has("payload", want);
    snprintf(want, sizeof(want), "(auto: %s for tiny, %s for sim)",
             kv_dtype_name(t->default_kv_dtype), kv_dtype_name(s->default_kv_dtype));
    expect_help_has("kv-dtype", want);
    snprintf(want, sizeof(want), "(0: %d for tiny, %d for sim)", t->default_token_budget,
             s->default_token_budget);
    expect_help_has("token-budget", want);

    /* tiny's capacity without --kv-blocks or --kv-memory; sim's depends on the GPU. */
    struct backend_params p = {.time_scale = 1.0};
    struct backend *be = NULL;
    char err[256] = "";
    int32_t n = -1;
    CU_ASSERT_EQUAL_FATAL(t->create(&be, &p, err, sizeof(err)), 0);
    int bs = (int)wk_settings[wk_setting("block-size")].def;
    CU_ASSERT_EQUAL(t->kv_capacity(be, t->default_kv_dtype, bs, &n, err, sizeof(err)), 0);
    be->ops->destroy(be);
    snprintf(want, sizeof(want), "(0: from --kv-memory, else %d for tiny, GPU HBM for sim)",
             (int)n);
    expect_help_has("kv-blocks", want);
}

int main(void)
{
    const char *d = getenv("TANDEM_SOURCE_DIR");
    if (!realpath(d ? d : ".", src_dir) || !mkdtemp(tmp_dir)) {
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("settings", NULL, NULL);
    CU_add_test(s, "every_path_agrees", test_every_path_agrees);
    CU_add_test(s, "parse_value", test_parse_value);
    CU_add_test(s, "help_states_backend_defaults", test_help_states_backend_defaults);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", tmp_dir);
    }
    return failed ? 1 : 0;
}
