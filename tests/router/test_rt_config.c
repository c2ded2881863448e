/* EndpointPickerConfig files: good ones (every deploy/routing example, an
 * llm-d file with sections we ignore) and bad ones, each bad case's message
 * checked to name the offending key and its line. */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "default_routing.h"
#include "pipeline.h"
#include "router.h"
#include "tandem_err.h"

#define HDR "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

static void test_parse_shape(void)
{
    const char *yaml = HDR "plugins:\n"
                           "- type: prefix-cache-scorer\n" /* 4 */
                           "  parameters:\n"
                           "    mode: precise\n" /* 6 */
                           "    nested:\n"
                           "      deeper: \"x y\"\n" /* 8 */
                           "- name: q\n"             /* 9 */
                           "  type: queue-scorer\n"
                           "schedulingProfiles:\n"
                           "- name: default\n" /* 12 */
                           "  plugins:\n"
                           "  - pluginRef: q\n" /* 14 */
                           "    weight: 2.5\n"
                           "  - pluginRef: prefix-cache-scorer\n";
    struct rt_config *cfg = NULL;
    char err[RT_ERR_MAX];
    CU_ASSERT_EQUAL_FATAL(rt_config_parse(&cfg, yaml, strlen(yaml), "shape.yaml", err, sizeof(err)),
                          0);
    CU_ASSERT_STRING_EQUAL(cfg->source, "shape.yaml");
    CU_ASSERT_STRING_EQUAL(cfg->api_version, "inference.networking.x-k8s.io/v1alpha1");
    CU_ASSERT_EQUAL_FATAL(cfg->n_plugins, 2);
    CU_ASSERT_STRING_EQUAL(cfg->plugins[0].type, "prefix-cache-scorer");
    CU_ASSERT_STRING_EQUAL(cfg->plugins[0].name, "prefix-cache-scorer"); /* defaults to type */
    CU_ASSERT_EQUAL(cfg->plugins[0].line, 4);
    CU_ASSERT_EQUAL_FATAL(cfg->plugins[0].n_params, 2);
    CU_ASSERT_STRING_EQUAL(cfg->plugins[0].params[0].key, "mode");
    CU_ASSERT_STRING_EQUAL(cfg->plugins[0].params[0].value, "precise");
    CU_ASSERT_EQUAL(cfg->plugins[0].params[0].line, 6);
    CU_ASSERT_STRING_EQUAL(cfg->plugins[0].params[1].key, "nested.deeper");
    CU_ASSERT_STRING_EQUAL(cfg->plugins[0].params[1].value, "x y");
    CU_ASSERT_EQUAL(cfg->plugins[0].params[1].line, 8);
    CU_ASSERT_STRING_EQUAL(cfg->plugins[1].name, "q");
    CU_ASSERT_EQUAL(cfg->plugins[1].line, 9);
    CU_ASSERT_EQUAL_FATAL(cfg->n_profiles, 1);
    CU_ASSERT_STRING_EQUAL(cfg->profiles[0].name, "default");
    CU_ASSERT_EQUAL(cfg->profiles[0].line, 12);
    CU_ASSERT_EQUAL_FATAL(cfg->profiles[0].n_refs, 2);
    CU_ASSERT_STRING_EQUAL(cfg->profiles[0].refs[0].plugin_ref, "q");
    CU_ASSERT_EQUAL(cfg->profiles[0].refs[0].weight, 2.5);
    CU_ASSERT_TRUE(cfg->profiles[0].refs[0].has_weight);
    CU_ASSERT_EQUAL(cfg->profiles[0].refs[0].line, 14);
    CU_ASSERT_EQUAL(cfg->profiles[0].refs[1].weight, 1.0); /* default weight */
    CU_ASSERT_FALSE(cfg->profiles[0].refs[1].has_weight);
    rt_config_free(cfg);
}

/* The llm-d documentation's sample P/D configuration, as written there, plus
 * sections Tandem ignores with a warning. */
static void test_llmd_sample(void)
{
    const char *yaml = "apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
                       "kind: EndpointPickerConfig\n"
                       "featureGates: [flowControl]\n"
                       "plugins:\n"
                       "- type: prefix-cache-scorer\n"
                       "  parameters:\n"
                       "    hashBlockSize: 16\n"
                       "    maxPrefixBlocksToMatch: 256\n"
                       "    lruCapacityPerServer: 31250\n"
                       "- type: prefill-filter\n"
                       "- type: decode-filter\n"
                       "- type: max-score-picker\n"
                       "- type: prefix-based-pd-decider\n"
                       "  parameters:\n"
                       "    nonCachedTokens: 10\n"
                       "- type: pd-profile-handler\n"
                       "schedulingProfiles:\n"
                       "- name: prefill\n"
                       "  plugins:\n"
                       "  - pluginRef: prefill-filter\n"
                       "  - pluginRef: max-score-picker\n"
                       "  - pluginRef: prefix-cache-scorer\n"
                       "    weight: 50\n"
                       "- name: decode\n"
                       "  plugins:\n"
                       "  - pluginRef: decode-filter\n"
                       "  - pluginRef: max-score-picker\n"
                       "  - pluginRef: prefix-cache-scorer\n"
                       "    weight: 50\n"
                       "saturationDetector:\n"
                       "  queueDepthThreshold: 5\n";
    struct rt_pipeline *pl = NULL;
    char err[RT_ERR_MAX];
    int rc = rt_pipeline_parse(&pl, yaml, "llmd.yaml", NULL, err, sizeof(err));
    if (rc)
        printf("\n  %s\n", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(rt_pipeline_block_size(pl), 16);
    CU_ASSERT_EQUAL(rt_pipeline_max_endpoints(pl), RT_DEFAULT_MAX_ENDPOINTS);
    rt_pipeline_destroy(pl);
}

/* Every example under deploy/routing loads and builds. */
static void test_deploy_examples(void)
{
    const char *src = getenv("TANDEM_SOURCE_DIR");
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/deploy/routing", src ? src : TANDEM_SOURCE_DIR_DEFAULT);
    DIR *d = opendir(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".yaml") != 0)
            continue;
        char path[2048];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        struct rt_pipeline *pl = NULL;
        char err[RT_ERR_MAX];
        int rc = rt_pipeline_load(&pl, path, NULL, err, sizeof(err));
        if (rc)
            printf("\n  %s: %s\n", de->d_name, err);
        CU_ASSERT_EQUAL(rc, 0);
        rt_pipeline_destroy(pl);
        n++;
    }
    closedir(d);
    printf("\n  %d example configs loaded\n", n);
    CU_ASSERT(n >= 11);
}

/* The compiled-in default routing is deploy/routing/pd-prefix-precise.yaml,
 * byte for byte, and builds a P/D pipeline on the precise prefix index. */
static void test_default_routing(void)
{
    const char *src = getenv("TANDEM_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof(path), "%s/deploy/routing/pd-prefix-precise.yaml",
             src ? src : TANDEM_SOURCE_DIR_DEFAULT);
    FILE *f = fopen(path, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    static char text[16384];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    CU_ASSERT_STRING_EQUAL(rt_default_routing(), text);
    CU_ASSERT_PTR_NOT_NULL(strstr(rt_default_routing(), "mode: precise"));
    struct rt_pipeline *pl = NULL;
    char err[RT_ERR_MAX];
    CU_ASSERT_EQUAL_FATAL(
        rt_pipeline_parse(&pl, rt_default_routing(), "(default routing)", NULL, err, sizeof(err)),
        0);
    CU_ASSERT_EQUAL(rt_pipeline_block_size(pl), 16);
    CU_ASSERT(rt_pipeline_uses_hashes(pl));
    rt_pipeline_destroy(pl);
}

struct bad {
    const char *yaml;
    int rc;
    const char *msg; /* the whole message */
};

/* Line numbers: HDR is lines 1-2. */
static const struct bad bad_cases[] = {
    /* YAML syntax */
    {HDR "plugins:\n- type: [queue-scorer\nschedulingProfiles: []\n", TANDEM_ECONFIG,
     "bad.yaml:5: YAML syntax error: did not find expected ',' or ']' while parsing a flow "
     "sequence"},
    {HDR "plugins:\n  - type: a\n - type: b\n", TANDEM_ECONFIG,
     "bad.yaml:5: YAML syntax error: did not find expected key while parsing a block mapping"},
    /* document shape */
    {"", TANDEM_ECONFIG, "bad.yaml:1: empty configuration (expected kind: EndpointPickerConfig)"},
    {"kind: EndpointPickerConfig\napiVersion: v9\n", TANDEM_ECONFIG,
     "bad.yaml:2: apiVersion 'v9' is not supported (use inference.networking.x-k8s.io/v1alpha1 "
     "or llm-d.ai/v1)"},
    {"apiVersion: llm-d.ai/v1\nkind: Pod\n", TANDEM_ECONFIG,
     "bad.yaml:2: kind 'Pod' is not EndpointPickerConfig"},
    {HDR "plugins: []\nschedulingProfiles:\n- name: x\nscheduling: {}\n", TANDEM_ECONFIG,
     "bad.yaml:6: unknown key 'scheduling' (expected apiVersion, kind, plugins, "
     "schedulingProfiles)"},
    {HDR "plugins: []\n", TANDEM_ECONFIG,
     "bad.yaml:1: missing 'schedulingProfiles' (at least one profile is needed)"},
    {HDR "plugins: []\nplugins: []\n", TANDEM_ECONFIG,
     "bad.yaml:4: EndpointPickerConfig: duplicate key 'plugins'"},
    {HDR "plugins:\n- name: x\nschedulingProfiles:\n- name: p\n", TANDEM_ECONFIG,
     "bad.yaml:4: plugins entry: missing 'type'"},
    {HDR "plugins:\n- type: queue-scorer\n  weight: 3\nschedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:5: plugins entry: unknown key 'weight' (expected type, name, parameters)"},
    {HDR "plugins:\n- type: load-aware-scorer\n  parameters:\n    threshold: [1, 2]\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:6: plugin 'load-aware-scorer' parameters: parameter 'threshold' is a list; lists "
     "are not supported"},
    {HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n"
         "  - pluginRef: queue-scorer\n    weight: heavy\n",
     TANDEM_ECONFIG, "bad.yaml:9: pluginRef 'queue-scorer': weight 'heavy' is not a number >= 0"},
    {HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n"
         "  - weight: 2\n",
     TANDEM_ECONFIG, "bad.yaml:8: schedulingProfiles plugin: missing 'pluginRef'"},
    /* plugin types and parameters */
    {HDR "plugins:\n- type: queue-scorer\n- type: lora-affinity-scorer\n  name: lora\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:5: plugin 'lora': unknown type 'lora-affinity-scorer' (docs/routing.md lists the "
     "types)"},
    {HDR "plugins:\n- type: load-aware-scorer\n  parameters:\n    threshold: 10\n"
         "    treshold: 12\nschedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:7: plugin 'load-aware-scorer' (type load-aware-scorer): unknown parameter "
     "'treshold' (known: threshold)"},
    {HDR "plugins:\n- type: queue-scorer\n  parameters: {depth: 3}\nschedulingProfiles:\n"
         "- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:5: plugin 'queue-scorer' (type queue-scorer): unknown parameter 'depth' (it takes "
     "none)"},
    {HDR "plugins:\n- type: load-aware-scorer\n  name: lo\n  parameters:\n    threshold: -1\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:7: plugin 'lo' (type load-aware-scorer): parameter 'threshold': '-1' is not an "
     "integer in [1, 1000000000]"},
    {HDR "plugins:\n- type: load-aware-scorer\n  parameters:\n    threshold: 1.5\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:6: plugin 'load-aware-scorer' (type load-aware-scorer): parameter 'threshold': "
     "'1.5' is not an integer in [1, 1000000000]"},
    {HDR "plugins:\n- type: prefix-cache-scorer\n  parameters:\n    mode: exact\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:6: plugin 'prefix-cache-scorer' (type prefix-cache-scorer): parameter 'mode': "
     "'exact' is not one of: approx, precise"},
    {HDR "plugins:\n- type: active-request-scorer\n  parameters:\n    maxBusyScore: 1.5\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:6: plugin 'active-request-scorer' (type active-request-scorer): parameter "
     "'maxBusyScore': '1.5' is not a number in [0, 1]"},
    {HDR "plugins:\n- type: max-score-picker\n  parameters:\n    maxNumOfEndpoints: 2\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:6: plugin 'max-score-picker' (type max-score-picker): parameter "
     "'maxNumOfEndpoints': '2' is not an integer in [1, 1]"},
    {HDR "plugins:\n- type: prefix-cache-scorer\n  parameters:\n    blockSize: 16\n"
         "    hashBlockSize: 32\nschedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:7: plugin 'prefix-cache-scorer' (type prefix-cache-scorer): parameter "
     "'hashBlockSize' repeats 'blockSize' (line 6)"},
    {HDR "plugins:\n- type: queue-scorer\n- type: load-aware-scorer\n  name: queue-scorer\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:5: plugin name 'queue-scorer' is already used (line 4); give one of them a "
     "different 'name'"},
    /* profiles and references */
    {HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n"
         "  - pluginRef: queue-scorer\n  - pluginRef: kv-cache-utilization-scorer\n",
     TANDEM_ECONFIG,
     "bad.yaml:9: profile 'p': pluginRef 'kv-cache-utilization-scorer' does not name a plugin "
     "defined under 'plugins'"},
    {HDR "plugins:\n- type: random-picker\nschedulingProfiles:\n- name: p\n  plugins:\n"
         "  - pluginRef: random-picker\n    weight: 2\n",
     TANDEM_ECONFIG,
     "bad.yaml:9: profile 'p': pluginRef 'random-picker' has a weight but is a picker, not a "
     "scorer"},
    {HDR "plugins:\n- type: random-picker\n- type: max-score-picker\nschedulingProfiles:\n"
         "- name: p\n  plugins:\n  - pluginRef: random-picker\n  - pluginRef: max-score-picker\n",
     TANDEM_ECONFIG,
     "bad.yaml:10: profile 'p': a second picker 'max-score-picker' (already 'random-picker')"},
    {HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n"
         "  - pluginRef: queue-scorer\n  - pluginRef: queue-scorer\n",
     TANDEM_ECONFIG, "bad.yaml:9: profile 'p': pluginRef 'queue-scorer' is listed twice"},
    {HDR "plugins:\n- type: always-disagg-pd-decider\nschedulingProfiles:\n- name: p\n"
         "  plugins:\n  - pluginRef: always-disagg-pd-decider\n",
     TANDEM_ECONFIG,
     "bad.yaml:8: profile 'p': pluginRef 'always-disagg-pd-decider' is a P/D decider; list it "
     "under 'plugins' only"},
    {HDR "plugins: []\nschedulingProfiles:\n- name: a\n- name: a\n", TANDEM_ECONFIG,
     "bad.yaml:6: profile name 'a' is already used (line 5)"},
    /* handlers and deciders */
    {HDR "plugins: []\nschedulingProfiles:\n- name: decode\n- name: prefill\n", TANDEM_ECONFIG,
     "bad.yaml:6: 2 schedulingProfiles need a profile handler plugin (pd-profile-handler or "
     "single-profile-handler)"},
    {HDR "plugins:\n- type: single-profile-handler\nschedulingProfiles:\n- name: decode\n"
         "- name: prefill\n",
     TANDEM_ECONFIG,
     "bad.yaml:4: plugin 'single-profile-handler' (type single-profile-handler): runs exactly "
     "one scheduling profile, but 2 are defined (use pd-profile-handler for decode and prefill "
     "profiles)"},
    {HDR "plugins:\n- type: single-profile-handler\n- type: pd-profile-handler\n"
         "schedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:5: plugin 'pd-profile-handler': a second profile handler (already "
     "'single-profile-handler')"},
    {HDR "plugins:\n- type: always-disagg-pd-decider\n- type: pd-profile-handler\n"
         "  parameters:\n    prefillProfile: prefil\nschedulingProfiles:\n- name: decode\n"
         "- name: prefill\n",
     TANDEM_ECONFIG,
     "bad.yaml:7: plugin 'pd-profile-handler' (type pd-profile-handler): parameter "
     "'prefillProfile': no schedulingProfile is named 'prefil'"},
    {HDR "plugins:\n- type: pd-profile-handler\nschedulingProfiles:\n- name: decode\n"
         "- name: prefill\n",
     TANDEM_ECONFIG,
     "bad.yaml:4: plugin 'pd-profile-handler' (type pd-profile-handler): needs a P/D decider: "
     "define a 'prefix-based-pd-decider' plugin (or another decider and name it with "
     "deciderPluginName)"},
    {HDR "plugins:\n- type: queue-scorer\n- type: pd-profile-handler\n  parameters:\n"
         "    deciderPluginName: queue-scorer\nschedulingProfiles:\n- name: decode\n"
         "- name: prefill\n",
     TANDEM_ECONFIG,
     "bad.yaml:7: plugin 'pd-profile-handler' (type pd-profile-handler): parameter "
     "'deciderPluginName': plugin 'queue-scorer' (type queue-scorer) is not a decider"},
    {HDR "plugins:\n- type: prefix-based-pd-decider\n  parameters:\n    nonCachedTokens: 64\n"
         "- type: pd-profile-handler\nschedulingProfiles:\n- name: decode\n- name: prefill\n",
     TANDEM_ECONFIG,
     "bad.yaml:6: plugin 'prefix-based-pd-decider' (type prefix-based-pd-decider): parameter "
     "'nonCachedTokens': counts tokens cached on the decode endpoint, which needs a "
     "prefix-cache-scorer plugin under 'plugins'"},
    {HDR "plugins:\n- type: prefix-cache-scorer\n- type: prefix-cache-scorer\n  name: other\n"
         "  parameters: {blockSize: 32}\nschedulingProfiles:\n- name: p\n",
     TANDEM_ECONFIG,
     "bad.yaml:7: plugin 'other' (type prefix-cache-scorer): parameter 'blockSize': 32 differs "
     "from 16 of plugin 'prefix-cache-scorer': the router hashes each prompt with one block "
     "size"},
};

static void test_bad_configs(void)
{
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const struct bad *b = &bad_cases[i];
        struct rt_pipeline *pl = NULL;
        char err[RT_ERR_MAX];
        int rc = rt_pipeline_parse(&pl, b->yaml, "bad.yaml", NULL, err, sizeof(err));
        if (rc != b->rc || strcmp(err, b->msg) != 0)
            printf("\n  case %zu: rc %d\n    got:  %s\n    want: %s\n", i, rc, err, b->msg);
        CU_ASSERT_EQUAL(rc, b->rc);
        CU_ASSERT_STRING_EQUAL(err, b->msg);
        CU_ASSERT_PTR_NULL(pl);
        rt_pipeline_destroy(pl);
    }
}

static void test_files(void)
{
    char path[] = "/tmp/tandem_rt_config_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    const char *text = HDR "plugins:\n- type: nope\nschedulingProfiles:\n- name: p\n";
    CU_ASSERT_EQUAL(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    struct rt_pipeline *pl = NULL;
    char err[RT_ERR_MAX], want[RT_ERR_MAX + 64];
    CU_ASSERT_EQUAL(rt_pipeline_load(&pl, path, NULL, err, sizeof(err)), TANDEM_ECONFIG);
    snprintf(want, sizeof(want),
             "%s:4: plugin 'nope': unknown type 'nope' (docs/routing.md lists the types)", path);
    CU_ASSERT_STRING_EQUAL(err, want);
    unlink(path);
    CU_ASSERT_EQUAL(rt_pipeline_load(&pl, path, NULL, err, sizeof(err)), TANDEM_ENOENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot open"));
    CU_ASSERT_PTR_NULL(pl);
    /* Errors fit the buffer they are given. */
    char tiny[8];
    CU_ASSERT_EQUAL(rt_pipeline_parse(&pl, "kind: x\n", "bad.yaml", NULL, tiny, sizeof(tiny)),
                    TANDEM_ECONFIG);
    CU_ASSERT_STRING_EQUAL(tiny, "bad.yam");
    CU_ASSERT_EQUAL(rt_pipeline_parse(&pl, "kind: x\n", "bad.yaml", NULL, NULL, 0), TANDEM_ECONFIG);
}

/* ---- Documented limits (docs/reliability.md "Limits": routing config):
 * each at the limit and one past it. */

/* Parses yaml as "lim.yaml"; returns the code, err filled. */
static int parse_limit(const char *yaml, char *err, size_t errlen)
{
    struct rt_pipeline *pl = NULL;
    int rc = rt_pipeline_parse(&pl, yaml, "lim.yaml", NULL, err, errlen);
    if (rc != 0)
        CU_ASSERT_PTR_NULL(pl);
    rt_pipeline_destroy(pl);
    return rc;
}

#define EXPECT_PARSE(yaml, want_rc, want_msg)                                                      \
    do {                                                                                           \
        char err_[RT_ERR_MAX];                                                                     \
        int rc_ = parse_limit((yaml), err_, sizeof(err_));                                         \
        const char *w_ = (want_msg);                                                               \
        int ok_ = rc_ == (want_rc) && (rc_ == 0 || strcmp(err_, w_) == 0);                         \
        if (!ok_)                                                                                  \
            printf("\n  line %d: rc %d, want %d\n    got:  %s\n    want: %s\n", __LINE__, rc_,     \
                   (want_rc), rc_ ? err_ : "", w_);                                                \
        CU_ASSERT(ok_);                                                                            \
    } while (0)

/* 64 plugins, counting the picker and profile handler the pipeline adds
 * when the file has none. */
static void test_limit_plugins(void)
{
    static char y[16384];
    for (int over = 0; over <= 1; over++) {
        /* 62 scorers + a picker + a handler, all from the file. */
        int k =
            sprintf(y, HDR "plugins:\n- type: max-score-picker\n- type: single-profile-handler\n");
        for (int i = 0; i < 62 + over; i++)
            k += sprintf(y + k, "- type: queue-scorer\n  name: q%d\n", i);
        sprintf(y + k, "schedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: q0\n");
        /* Scorer i starts at line 6 + 2 i: the 63rd (the 65th plugin) at 130. */
        EXPECT_PARSE(y, over ? TANDEM_ECONFIG : 0, "lim.yaml:130: more than 64 plugins");
    }
    /* 62 from the file: the two defaults make 64. One more, and the
     * default handler is the 65th: the error names the profile needing it. */
    for (int over = 0; over <= 1; over++) {
        int k = sprintf(y, HDR "plugins:\n");
        for (int i = 0; i < 62 + over; i++)
            k += sprintf(y + k, "- type: queue-scorer\n  name: q%d\n", i);
        sprintf(y + k, "schedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: q0\n");
        EXPECT_PARSE(y, over ? TANDEM_ECONFIG : 0,
                     "lim.yaml:131: more than 64 plugins, counting the 'single-profile-handler' "
                     "added by default");
    }
}

/* 8 schedulingProfiles (pd-profile-handler runs decode and prefill; the
 * others may be defined). */
static void test_limit_profiles(void)
{
    static char y[4096];
    for (int over = 0; over <= 1; over++) {
        int k = sprintf(y, HDR "plugins:\n- type: queue-scorer\n- type: always-disagg-pd-decider\n"
                               "- type: pd-profile-handler\nschedulingProfiles:\n");
        for (int i = 0; i < 8 + over; i++)
            k += sprintf(y + k, "- name: %s\n  plugins:\n  - pluginRef: queue-scorer\n",
                         i == 0   ? "decode"
                         : i == 1 ? "prefill"
                                  : (char[]){'p', (char)('0' + i), 0});
        /* Profile i starts at line 8 + 3 i: the 9th at 32. */
        EXPECT_PARSE(y, over ? TANDEM_ECONFIG : 0, "lim.yaml:32: more than 8 schedulingProfiles");
    }
}

/* 16 plugins in one profile (filters, scorers and the picker). */
static void test_limit_profile_plugins(void)
{
    static char y[4096];
    for (int over = 0; over <= 1; over++) {
        int n = 16 + over, k = sprintf(y, HDR "plugins:\n");
        for (int i = 0; i < n; i++)
            k += sprintf(y + k, "- type: queue-scorer\n  name: q%d\n", i);
        k += sprintf(y + k, "schedulingProfiles:\n- name: p\n  plugins:\n");
        for (int i = 0; i < n; i++)
            k += sprintf(y + k, "  - pluginRef: q%d\n", i);
        /* pluginRef i is at line 41 + i: the 17th at 57. */
        EXPECT_PARSE(y, over ? TANDEM_ECONFIG : 0,
                     "lim.yaml:57: profile 'p': more than 16 plugins");
    }
}

/* Names of 63 bytes (64 with the NUL), plugins and profiles. */
static void test_limit_names(void)
{
    static char y[2048], name[80], want[RT_ERR_MAX];
    for (int over = 0; over <= 1; over++) {
        memset(name, 'n', sizeof(name));
        name[63 + over] = '\0';
        sprintf(y,
                HDR "plugins:\n- type: queue-scorer\n  name: %s\nschedulingProfiles:\n- name: p\n"
                    "  plugins:\n  - pluginRef: %s\n",
                name, name);
        snprintf(want, sizeof(want), "lim.yaml:4: plugin name '%s' is longer than 63 bytes", name);
        EXPECT_PARSE(y, over ? TANDEM_ECONFIG : 0, want);
        sprintf(y,
                HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: %s\n"
                    "  plugins:\n  - pluginRef: queue-scorer\n",
                name);
        snprintf(want, sizeof(want), "lim.yaml:6: profile name '%s' is longer than 63 bytes", name);
        EXPECT_PARSE(y, over ? TANDEM_ECONFIG : 0, want);
    }
}

/* A routing file of 1 MiB loads; a byte more is refused before parsing. */
static void test_limit_file_bytes(void)
{
    const char *text = HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n"
                           "  plugins:\n  - pluginRef: queue-scorer\n";
    size_t size = 1u << 20;
    char *buf = malloc(size + 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    for (int over = 0; over <= 1; over++) {
        /* The configuration, then comment lines up to the size. */
        size_t len = size + (size_t)over, n = strlen(text);
        memcpy(buf, text, n);
        while (n < len) {
            size_t line = len - n < 80 ? len - n : 80;
            memset(buf + n, ' ', line);
            buf[n] = '#';
            buf[n + line - 1] = '\n';
            n += line;
        }
        char path[] = "/tmp/tandem_rt_limit_XXXXXX";
        int fd = mkstemp(path);
        CU_ASSERT_FATAL(fd >= 0);
        CU_ASSERT_EQUAL(write(fd, buf, len), (ssize_t)len);
        close(fd);
        struct rt_pipeline *pl = NULL;
        char err[RT_ERR_MAX], want[RT_ERR_MAX + 64];
        int rc = rt_pipeline_load(&pl, path, NULL, err, sizeof(err));
        if (over) {
            CU_ASSERT_NOT_EQUAL(rc, 0);
            snprintf(want, sizeof(want), "%s: larger than %zu bytes", path, size);
            CU_ASSERT_STRING_EQUAL(err, want);
            CU_ASSERT_PTR_NULL(pl);
        } else {
            if (rc != 0)
                printf("\n  %s\n", err);
            CU_ASSERT_EQUAL(rc, 0);
        }
        rt_pipeline_destroy(pl);
        unlink(path);
    }
    free(buf);
}

/* 65,536 endpoint slots (rt_pipeline_opts.max_endpoints). */
static void test_limit_endpoints(void)
{
    const char *text = HDR "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n"
                           "  plugins:\n  - pluginRef: queue-scorer\n";
    for (int over = 0; over <= 1; over++) {
        struct rt_pipeline_opts po = {.seed = 1, .max_endpoints = RT_MAX_ENDPOINTS + over};
        struct rt_pipeline *pl = NULL;
        char err[RT_ERR_MAX];
        CU_ASSERT_EQUAL(rt_pipeline_parse(&pl, text, "lim.yaml", &po, err, sizeof(err)),
                        over ? TANDEM_EINVAL : 0);
        CU_ASSERT(over ? pl == NULL : pl != NULL);
        rt_pipeline_destroy(pl);
    }
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("rt_config", NULL, NULL);
    CU_add_test(s, "parse_shape", test_parse_shape);
    CU_add_test(s, "llmd_sample", test_llmd_sample);
    CU_add_test(s, "deploy_examples", test_deploy_examples);
    CU_add_test(s, "default_routing", test_default_routing);
    CU_add_test(s, "bad_configs", test_bad_configs);
    CU_add_test(s, "files", test_files);
    CU_add_test(s, "limit_plugins", test_limit_plugins);
    CU_add_test(s, "limit_profiles", test_limit_profiles);
    CU_add_test(s, "limit_profile_plugins", test_limit_profile_plugins);
    CU_add_test(s, "limit_names", test_limit_names);
    CU_add_test(s, "limit_file_bytes", test_limit_file_bytes);
    CU_add_test(s, "limit_endpoints", test_limit_endpoints);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
