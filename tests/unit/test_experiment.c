/* Experiment files and reports (tools/experiment/): parsing good files
 * (cross products, explicit configurations, parameter sweeps, overrides,
 * bench flags) against the real deploy/ files (TANDEM_SOURCE_DIR), bad
 * files whose messages must name the file, line and key, the derived
 * routing and cluster files, and the report writers on synthetic cells:
 * the exact CSV and markdown, and the SVG's structure and coordinates. */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "experiment/exp_cell.h"
#include "experiment/exp_derive.h"
#include "experiment/exp_file.h"
#include "experiment/exp_report.h"
#include "experiment/exp_scrape.h"
#include "loadgen/openai.h"
#include "tandem_err.h"

static const char *source_dir(void)
{
    const char *d = getenv("TANDEM_SOURCE_DIR");
    return d ? d : ".";
}

/* Parses text as if it were <source>/deploy/experiments/t.yaml. */
static struct exp_file *parse(const char *text, int *rc, char *err, size_t errlen)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/deploy/experiments", source_dir());
    struct exp_file *e = NULL;
    *rc = exp_parse(&e, text, strlen(text), "t.yaml", dir, err, errlen);
    return e;
}

static struct exp_file *parse_ok(const char *text)
{
    char err[EXP_ERR_MAX] = "";
    int rc;
    struct exp_file *e = parse(text, &rc, err, sizeof(err));
    if (rc != 0) {
        printf("\nunexpected error %d: %s\n", rc, err);
    }
    CU_ASSERT_EQUAL(rc, 0);
    return e;
}

static const char *ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0 ? s : NULL;
}

static void test_parse_good(void)
{
    struct exp_file *e = parse_ok("name: demo\n"
                                  "description: two shapes\n"
                                  "clusters: [../clusters/tiny-2p2d.yaml, "
                                  "../clusters/tiny-colocated-x4.yaml]\n"
                                  "routings:\n"
                                  "  - cluster\n"
                                  "  - ../routing/round-robin.yaml\n"
                                  "configs:\n"
                                  "  - cluster: ../clusters/tiny-2p2d.yaml\n"
                                  "    routing: ../routing/pd-prefix-based.yaml\n"
                                  "    label: nct\n"
                                  "    set: {prefix-based-pd-decider.nonCachedTokens: [0, 256]}\n"
                                  "  - cluster: ../clusters/tiny-2p2d.yaml\n"
                                  "    label: la-{value}-x\n"
                                  "    routing: ../routing/pd-load-aware.yaml\n"
                                  "    set:\n"
                                  "      load-aware-pd-decider.decodeInterference: [0.5, 2]\n"
                                  "rates: [8, 2, inf, 0.5]\n"
                                  "restart: per-rate\n"
                                  "cluster_overrides: {max_running: 32, log_level: warn}\n"
                                  "up_timeout: 30\n"
                                  "extra_slos: [[tpot:25], \"ttft:3000 e2el:9000\"]\n"
                                  "settle: 0\n"
                                  "bench:\n"
                                  "  dataset_name: shared-prefix\n"
                                  "  gsp-num-groups: 4\n"
                                  "  num-prompts: 40\n"
                                  "  goodput: [ttft:500, tpot:50]\n"
                                  "  extra-body: {logprobs: 0, user: x}\n");
    if (!e) {
        return;
    }
    CU_ASSERT_STRING_EQUAL(e->name, "demo");
    CU_ASSERT_STRING_EQUAL(e->description, "two shapes");
    CU_ASSERT_EQUAL(e->n_configs, 8);
    const char *labels[] = {"tiny-2p2d",
                            "tiny-2p2d+round-robin",
                            "tiny-colocated-x4",
                            "tiny-colocated-x4+round-robin",
                            "nct-0",
                            "nct-256",
                            "la-0.5-x",
                            "la-2-x"};
    for (int i = 0; i < 8 && i < e->n_configs; i++) {
        CU_ASSERT_STRING_EQUAL(e->configs[i].label, labels[i]);
        CU_ASSERT_PTR_NOT_NULL(ends_with(e->configs[i].cluster_path, ".yaml"));
        CU_ASSERT_EQUAL(e->configs[i].cluster_path[0], '/');
    }
    CU_ASSERT_PTR_NULL(e->configs[0].routing_path);
    CU_ASSERT_PTR_NOT_NULL(
        ends_with(e->configs[1].routing_path, "/deploy/routing/round-robin.yaml"));
    CU_ASSERT_PTR_NOT_NULL(
        ends_with(e->configs[2].cluster_path, "/deploy/clusters/tiny-colocated-x4.yaml"));
    CU_ASSERT_PTR_NULL(e->configs[0].set_key);
    CU_ASSERT_STRING_EQUAL(e->configs[4].set_key, "prefix-based-pd-decider.nonCachedTokens");
    CU_ASSERT_STRING_EQUAL(e->configs[4].set_value, "0");
    CU_ASSERT_STRING_EQUAL(e->configs[5].set_value, "256");
    CU_ASSERT_STRING_EQUAL(e->configs[7].set_key, "load-aware-pd-decider.decodeInterference");
    CU_ASSERT_STRING_EQUAL(e->configs[7].set_value, "2");
    CU_ASSERT_EQUAL(e->configs[4].line, 11);
    CU_ASSERT_EQUAL(e->configs[6].line, 16);
    CU_ASSERT_EQUAL(e->n_rates, 4);
    CU_ASSERT_EQUAL(e->rates[0], 0.5);
    CU_ASSERT_EQUAL(e->rates[1], 2);
    CU_ASSERT_EQUAL(e->rates[2], 8);
    CU_ASSERT(isinf(e->rates[3]));
    CU_ASSERT_EQUAL(e->restart, EXP_RESTART_PER_RATE);
    CU_ASSERT_EQUAL(e->ov.cfg.max_running, 32);
    CU_ASSERT_EQUAL(e->ov.set, (uint64_t)1 << wk_setting("max-running"));
    CU_ASSERT_STRING_EQUAL(e->ov.log_level, "warn");
    CU_ASSERT_EQUAL(e->up_timeout_s, 30);
    CU_ASSERT_EQUAL(e->settle_s, 0);
    CU_ASSERT_EQUAL(e->bench_argc, 5);
    const char *args[] = {"--dataset-name=shared-prefix", "--gsp-num-groups=4", "--num-prompts=40",
                          "--goodput=ttft:500,tpot:50",
                          "--extra-body={\"logprobs\":0,\"user\":\"x\"}"};
    for (int i = 0; i < 5 && i < e->bench_argc; i++) {
        CU_ASSERT_STRING_EQUAL(e->bench_argv[i], args[i]);
    }
    CU_ASSERT_EQUAL(e->bench_lines[2], 26);
    CU_ASSERT_EQUAL(e->n_extra_slos, 2);
    CU_ASSERT_EQUAL(e->extra_slos[0].tpot_ms, 25);
    CU_ASSERT(e->extra_slos[0].ttft_ms < 0);
    CU_ASSERT_EQUAL(e->extra_slos[1].ttft_ms, 3000);
    CU_ASSERT_EQUAL(e->extra_slos[1].e2el_ms, 9000);

    struct bench_options o;
    char err[EXP_ERR_MAX];
    CU_ASSERT_EQUAL(exp_bench_options(e, &o, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(o.run.workload.dataset, LG_DATASET_SHARED_PREFIX);
    CU_ASSERT_EQUAL(o.run.workload.gsp_num_groups, 4);
    CU_ASSERT_EQUAL(o.run.num_prompts, 40);
    CU_ASSERT_EQUAL(o.summary.slo.ttft_ms, 500);
    CU_ASSERT_EQUAL(o.summary.slo.tpot_ms, 50);
    CU_ASSERT_EQUAL(o.summary.n_percentiles, 3);
    CU_ASSERT_EQUAL(o.summary.percentiles[1], 90);
    CU_ASSERT_PTR_NOT_NULL(o.run.extra_body);
    bench_options_fini(&o);
    exp_free(e);

    /* Defaults, and a label with one set value (no suffix). */
    e = parse_ok("name: d\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
                 "  label: one\n  set: {prefix-based-pd-decider.nonCachedTokens: 64}\n"
                 "rates: [1]\n");
    if (e) {
        CU_ASSERT_EQUAL(e->n_configs, 1);
        CU_ASSERT_STRING_EQUAL(e->configs[0].label, "one");
        CU_ASSERT_STRING_EQUAL(e->configs[0].set_value, "64");
        CU_ASSERT_EQUAL(e->restart, EXP_RESTART_PER_CONFIG);
        CU_ASSERT_EQUAL(e->up_timeout_s, 120);
        CU_ASSERT_EQUAL(e->settle_s, 1);
        CU_ASSERT_EQUAL(e->bench_argc, 0);
        CU_ASSERT_PTR_NULL(e->description);
        /* seeds: 5 offline, 3 live when not given; no goodput search. */
        CU_ASSERT_EQUAL(e->seeds, 0);
        CU_ASSERT_EQUAL(exp_seeds(e), 3);
        e->offline = 1;
        CU_ASSERT_EQUAL(exp_seeds(e), 5);
        CU_ASSERT_EQUAL(e->has_goodput_search, 0);
        exp_free(e);
    }
    /* seeds: and goodput_search: (attainment defaults to 0.9). */
    e = parse_ok("name: d\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\n"
                 "seeds: 7\ngoodput_search: {min_rate: 0.5, max_rate: 8, resolution: 0.125}\n");
    if (e) {
        CU_ASSERT_EQUAL(exp_seeds(e), 7);
        e->offline = 1;
        CU_ASSERT_EQUAL(exp_seeds(e), 7);
        CU_ASSERT_EQUAL(e->has_goodput_search, 1);
        CU_ASSERT_EQUAL(e->goodput_search_line, 6);
        CU_ASSERT_EQUAL(e->goodput_search.attainment, 0.9);
        CU_ASSERT_EQUAL(e->goodput_search.min_rate, 0.5);
        CU_ASSERT_EQUAL(e->goodput_search.max_rate, 8);
        CU_ASSERT_EQUAL(e->goodput_search.resolution, 0.125);
        CU_ASSERT_EQUAL(e->has_pd_search, 0);
        exp_free(e);
    }
    /* pd_search: names its bases by label. */
    e = parse_ok("name: d\nconfigs:\n- {label: pd, cluster: ../clusters/tiny-1p1d.yaml}\n"
                 "- {label: co, cluster: ../clusters/tiny-colocated-x4.yaml}\nrates: [1]\n"
                 "pd_search: {gpus: 8, tp: [1, 2], pd: pd, colocated: co}\n");
    if (e) {
        CU_ASSERT_EQUAL(e->has_pd_search, 1);
        CU_ASSERT_EQUAL(e->pd_search.gpus, 8);
        CU_ASSERT_EQUAL(e->pd_search.n_tps, 2);
        CU_ASSERT_EQUAL(e->pd_search.tps[1], 2);
        CU_ASSERT_EQUAL(e->pd_search_config, 0);
        CU_ASSERT_EQUAL(e->pd_search_colocated, 1);
        exp_free(e);
    }
}

struct bad_case {
    const char *text;
    const char *message; /* the whole message */
};

static void test_parse_bad(void)
{
    static const struct bad_case cases[] = {
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrate: [2]\n",
         "t.yaml:5: rate: unknown key (valid: name, description, clusters, routings, configs, "
         "rates, restart, time_scale, bench, cluster_overrides, up_timeout, settle, extra_slos, "
         "seeds, "
         "goodput_search, pd_search)"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
         "cluster-overrides: {}\n",
         "t.yaml:5: cluster-overrides: unknown key (did you mean cluster_overrides?) (valid: "
         "name, description, clusters, routings, configs, rates, restart, time_scale, bench, "
         "cluster_overrides, up_timeout, settle, extra_slos, seeds, goodput_search, "
         "pd_search)"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nseeds: 0\n",
         "t.yaml:5: seeds: expected a number in [1, 100], got '0'"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nseeds: 2.5\n",
         "t.yaml:5: seeds: expected a whole number of runs per cell, got '2.5'"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
         "goodput_search: {min_rate: 4, max_rate: 2}\n",
         "t.yaml:5: goodput_search: max_rate 2 must be above min_rate 4"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
         "goodput_search: {attainment: 90}\n",
         "t.yaml:5: goodput_search.attainment: expected a number in [0.01, 1], got '90'"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
         "goodput_search: {min_rate: 1, max_rate: 2, resolution: 5}\n",
         "t.yaml:5: goodput_search: resolution 5 must be in (0, max_rate - min_rate = 1]"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
         "goodput_search: {rate: 1}\n",
         "t.yaml:5: goodput_search.rate: unknown key (valid: attainment, min_rate, max_rate, "
         "resolution)"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
         "pd_search: {tp: [1]}\n",
         "t.yaml:5: pd_search.gpus: missing (the GPU budget)"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
         "pd_search: {gpus: 4, tp: [1, 0], pd: tiny-1p1d}\n",
         "t.yaml:5: pd_search.tp: '0' is not a TP degree in [1, 64] (e.g. --tp 1,2,4,8)"},
        {"name: x\nrates: [1]\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n"
         "pd_search: {gpus: 4, pd: nope}\n",
         "t.yaml:5: pd_search.pd: no configuration 'nope' (have: tiny-1p1d)"},
        {"name: x\nname: y\n", "t.yaml:2: name: duplicate key"},
        {"rates: [1]\n", "t.yaml:1: name: missing (the experiment's name, used in the report "
                         "directory)"},
        {"name: a b\n", "t.yaml:1: name: 'a b' must be letters, digits and . _ + -"},
        {"name: x\nrates: [1]\n",
         "t.yaml:1: configs: missing (give configs, or clusters [x routings])"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n",
         "t.yaml:1: rates: missing (a list of request rates)"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1, -2]\n",
         "t.yaml:4: rates: '-2' is not a positive number or inf"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [2, 2.0]\n",
         "t.yaml:4: rates: 2.0 is listed twice"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: 4\n",
         "t.yaml:4: rates: expected a non-empty list of request rates"},
        {"name: x\nconfigs:\n- routing: ../routing/random.yaml\nrates: [1]\n",
         "t.yaml:3: configs[]: cluster: missing (every configuration names its cluster file)"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n  labl: q\nrates: [1]\n",
         "t.yaml:4: configs[].labl: unknown key (valid: label, cluster, routing, set)"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n  label: a/b\nrates: [1]\n",
         "t.yaml:3: label: 'a/b' must be 1-63 characters of letters, digits and . _ + -"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n  label: a\n"
         "- cluster: ../clusters/tiny-2p2d.yaml\n  label: a\nrates: [1]\n",
         "t.yaml:5: label: 'a' is used twice (also line 3)"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n  set: {nodot: 1}\n"
         "rates: [1]\n",
         "t.yaml:4: set: key 'nodot' is not PLUGIN.PARAM"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n  set: {a.b: []}\n"
         "rates: [1]\n",
         "t.yaml:4: set.a.b: empty list"},
        {"name: x\nroutings: [cluster]\nrates: [1]\n",
         "t.yaml:2: routings: needs clusters (the cross product clusters x routings)"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\n"
         "time_scale: 0.5\n",
         "t.yaml:5: time_scale: goes under cluster_overrides (it changes the sim pools)"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\n"
         "restart: sometimes\n",
         "t.yaml:5: restart: expected per-config or per-rate, got 'sometimes'"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\n"
         "cluster_overrides:\n  max_running: 0\n",
         "t.yaml:6: cluster_overrides.max_running: expected an integer in [1, 65536], got "
         "'0'"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\nbench:\n"
         "  request-rate: 5\n",
         "t.yaml:6: bench.request-rate: set by the experiment runner (rates: for the rate; the "
         "report for results)"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\nbench:\n"
         "  seed: 1\n  random-input-len: lots\n",
         "t.yaml:7: bench: --random-input-len: 'lots' is not an integer"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\nbench:\n"
         "  seed: 1\n  dataset_name: nope\n",
         "t.yaml:7: bench: --dataset-name: 'nope' is not one of random, shared-prefix, "
         "multi-turn, long-short, sharegpt-synth, trace"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\nbench:\n"
         "  seed: 1\n  seed_: 2\n  num_prompts: 3\n  num-prompts: 4\n",
         "t.yaml:9: bench.num-prompts: duplicate key"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\nbench:\n"
         "  frobnicate: 1\n",
         "t.yaml:6: bench: unknown flag --frobnicate"},
        {"name: x\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\nrates: [1]\n"
         "extra_slos:\n- [ttft:5, tpot:6]\n- [latency:5]\n",
         "t.yaml:7: extra_slos: 'latency:5' is not KEY:MS pairs with KEY ttft, tpot or e2el"},
        {"name: x\nconfigs: [\n", NULL},
        {"- just\n- a list\n", "t.yaml:1: expected a mapping (name, configs, rates, bench, ...)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[EXP_ERR_MAX] = "";
        int rc;
        struct exp_file *e = parse(cases[i].text, &rc, err, sizeof(err));
        CU_ASSERT_EQUAL(rc, TANDEM_ECONFIG);
        CU_ASSERT_PTR_NULL(e);
        if (cases[i].message && strncmp(err, cases[i].message, strlen(cases[i].message)) != 0) {
            printf("\ncase %zu:\n  got:  %s\n  want: %s\n", i, err, cases[i].message);
            CU_FAIL("message");
        }
        if (!cases[i].message) {
            CU_ASSERT_PTR_NOT_NULL(strstr(err, "t.yaml:"));
            CU_ASSERT_PTR_NOT_NULL(strstr(err, "YAML:"));
        }
        exp_free(e);
    }
    /* A missing cluster file names the path. */
    char err[EXP_ERR_MAX] = "";
    int rc;
    struct exp_file *e = parse("name: x\nconfigs:\n- cluster: ../clusters/nope.yaml\nrates: [1]\n",
                               &rc, err, sizeof(err));
    CU_ASSERT_EQUAL(rc, TANDEM_ECONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "t.yaml:3: cluster: cannot read '"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "clusters/nope.yaml': No such file or directory"));
    exp_free(e);
    /* exp_load: a missing file. */
    CU_ASSERT_EQUAL(exp_load(&e, "/nonexistent/e.yaml", err, sizeof(err)), TANDEM_ENOENT);
    CU_ASSERT_STRING_EQUAL(err, "/nonexistent/e.yaml: cannot open: No such file or directory");
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) {
        s[n] = '\0';
    }
    fclose(f);
    return s;
}

static char *mem_text(char **buf, size_t *len, FILE **f)
{
    fclose(*f);
    *f = NULL;
    (void)len;
    return *buf;
}

static void test_routing_set(void)
{
    const char *doc = "apiVersion: v1\n"
                      "kind: EndpointPickerConfig\n"
                      "plugins:\n"
                      "- type: prefix-cache-scorer\n"
                      "  parameters:\n"
                      "    blockSize: 16\n"
                      "- name: dec\n"
                      "  type: prefix-based-pd-decider\n"
                      "  parameters:\n"
                      "    nonCachedTokens: 256\n"
                      "- type: queue-scorer\n";
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    char err[EXP_ERR_MAX] = "";
    CU_ASSERT_EQUAL(exp_routing_set("r.yaml", doc, strlen(doc), "dec.nonCachedTokens", "64", f, err,
                                    sizeof(err)),
                    0);
    char *out = mem_text(&buf, &len, &f);
    CU_ASSERT_STRING_EQUAL(out, "# r.yaml with dec.nonCachedTokens = 64 (written by tandem "
                                "bench --experiment)\n"
                                "apiVersion: v1\n"
                                "kind: EndpointPickerConfig\n"
                                "plugins:\n"
                                "- type: prefix-cache-scorer\n"
                                "  parameters:\n"
                                "    blockSize: 16\n"
                                "- name: dec\n"
                                "  type: prefix-based-pd-decider\n"
                                "  parameters:\n"
                                "    nonCachedTokens: 64\n"
                                "- type: queue-scorer\n");
    free(buf);

    /* A plugin without parameters, matched by type; a new parameter. */
    f = open_memstream(&buf, &len);
    CU_ASSERT_EQUAL(exp_routing_set("r.yaml", doc, strlen(doc), "queue-scorer.threshold", "8", f,
                                    err, sizeof(err)),
                    0);
    out = mem_text(&buf, &len, &f);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "- type: queue-scorer\n  parameters:\n    threshold: 8\n"));
    free(buf);
    f = open_memstream(&buf, &len);
    CU_ASSERT_EQUAL(exp_routing_set("r.yaml", doc, strlen(doc), "prefix-cache-scorer.mode",
                                    "precise", f, err, sizeof(err)),
                    0);
    out = mem_text(&buf, &len, &f);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "    blockSize: 16\n    mode: precise\n"));
    free(buf);

    /* The decider's type does not match a plugin that has a name. */
    f = open_memstream(&buf, &len);
    CU_ASSERT_EQUAL(exp_routing_set("r.yaml", doc, strlen(doc),
                                    "prefix-based-pd-decider.nonCachedTokens", "1", f, err,
                                    sizeof(err)),
                    TANDEM_ECONFIG);
    CU_ASSERT_STRING_EQUAL(err, "r.yaml: set prefix-based-pd-decider.nonCachedTokens: no plugin "
                                "named 'prefix-based-pd-decider' under plugins");
    fclose(f);
    free(buf);
}

static void test_prepare(void)
{
    char dir[] = "/tmp/tandem-exp-test-XXXXXX";
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    struct exp_file *e =
        parse_ok("name: p\n"
                 "configs:\n"
                 "- cluster: ../clusters/tiny-1p1d.yaml\n"
                 "  label: nct\n"
                 "  set: {prefix-based-pd-decider.nonCachedTokens: 1024}\n"
                 "- cluster: ../clusters/sim-llama3-70b-h100-colocated-x8.yaml\n"
                 "  routing: ../routing/round-robin.yaml\n"
                 "  label: sim\n"
                 "rates: [1]\n"
                 "cluster_overrides: {time_scale: 0.25, payload: none, max_running: 8,\n"
                 "  router_args: [--heartbeat-timeout-ms, '5000']}\n");
    if (!e) {
        return;
    }
    char cf[4096], err[EXP_ERR_MAX] = "";
    double ts = 0;
    CU_ASSERT_EQUAL(exp_prepare(e, 0, dir, cf, sizeof(cf), &ts, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(ts, 1.0); /* tiny: modelled = wall */
    struct cluster *c = NULL;
    CU_ASSERT_EQUAL(cluster_load(&c, cf, err, sizeof(err)), 0);
    if (c) {
        CU_ASSERT_PTR_NOT_NULL(ends_with(c->routing_path, "/configs/nct.routing.yaml"));
        CU_ASSERT_EQUAL(c->pools[CLUSTER_DECODE].cfg.max_running, 8);
        CU_ASSERT_EQUAL(c->pools[CLUSTER_PREFILL].cfg.max_running, 8);
        CU_ASSERT_EQUAL_FATAL(c->n_router_args, 2);
        CU_ASSERT_STRING_EQUAL(c->router_args[0], "--heartbeat-timeout-ms");
        CU_ASSERT_STRING_EQUAL(c->router_args[1], "5000");
        cluster_free(c);
    }
    char path[4200];
    snprintf(path, sizeof(path), "%s/configs/nct.routing.yaml", dir);
    char *r = slurp(path);
    CU_ASSERT_PTR_NOT_NULL(r);
    if (r) {
        /* The embedded default's inline routing, with the threshold changed. */
        CU_ASSERT_PTR_NOT_NULL(strstr(r, "nonCachedTokens: 1024\n"));
        CU_ASSERT_PTR_NULL(strstr(r, "nonCachedTokens: 256"));
        free(r);
    }
    CU_ASSERT_EQUAL(exp_prepare(e, 1, dir, cf, sizeof(cf), &ts, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(ts, 0.25);
    c = NULL;
    CU_ASSERT_EQUAL(cluster_load(&c, cf, err, sizeof(err)), 0);
    if (c) {
        CU_ASSERT_PTR_NOT_NULL(ends_with(c->routing_path, "/deploy/routing/round-robin.yaml"));
        CU_ASSERT_EQUAL(c->pools[CLUSTER_COLOCATED].cfg.time_scale, 0.25);
        CU_ASSERT_STRING_EQUAL(c->pools[CLUSTER_COLOCATED].cfg.payload, "none");
        cluster_free(c);
    }
    exp_free(e);

    /* A set value the router's loader refuses is reported before anything runs. */
    e = parse_ok("name: p\nconfigs:\n- cluster: ../clusters/tiny-1p1d.yaml\n  label: bad\n"
                 "  set: {prefix-based-pd-decider.nonCachedTokens: -5}\nrates: [1]\n");
    if (e) {
        CU_ASSERT_EQUAL(exp_prepare(e, 0, dir, cf, sizeof(cf), &ts, err, sizeof(err)),
                        TANDEM_ECONFIG);
        /* The line of the set value; then the router loader's own message. */
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "t.yaml:5: config bad: the derived cluster is not "
                                           "valid: "));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "/configs/bad.routing.yaml:16: plugin "
                                           "'prefix-based-pd-decider' (type "
                                           "prefix-based-pd-decider): parameter "
                                           "'nonCachedTokens': '-5' is not an integer in [0, "
                                           "1000000000]"));
        exp_free(e);
    }
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

/* ---- Report writers on synthetic cells ---- */

static struct exp_file *report_file(void)
{
    return parse_ok("name: rep\n"
                    "description: synthetic cells\n"
                    "configs:\n"
                    "- {label: a, cluster: ../clusters/tiny-1p1d.yaml}\n"
                    "- {label: b, cluster: ../clusters/tiny-colocated-x4.yaml, "
                    "routing: ../routing/round-robin.yaml}\n"
                    "- {label: c, cluster: ../clusters/tiny-2p2d.yaml, "
                    "set: {always-disagg-pd-decider.x: 1}}\n"
                    "rates: [1, 2]\n"
                    "bench: {num-prompts: 4, seed: 7}\n");
}

static void dist(struct lg_dist *d, double mean, double p50, double p90, double p99)
{
    d->n = 4;
    d->mean = mean;
    d->median = p50;
    d->pct[0] = p50;
    d->pct[1] = p90;
    d->pct[2] = p99;
}

/* A completed cell with goodput g, throughput t and TTFT/TPOT scaled by k. */
static void make_cell(struct exp_cell *c, int config, int rate, double g, double t, double k)
{
    memset(c, 0, sizeof(*c));
    c->config = config;
    c->rate = rate;
    c->done = 1;
    c->ok = 1;
    c->seed = 7 + (uint64_t)rate;
    c->time_scale = 1;
    struct lg_summary *s = &c->s;
    s->n_percentiles = 3;
    s->percentiles[0] = 50;
    s->percentiles[1] = 90;
    s->percentiles[2] = 99;
    s->completed = 4;
    s->duration_s = 4;
    s->request_throughput = t;
    s->has_goodput = 1;
    s->request_goodput = g;
    s->good = 3;
    s->output_throughput = 16;
    s->slo_attainment = 0.75;
    s->slo.ttft_ms = 500;
    s->slo.tpot_ms = 50;
    s->slo.e2el_ms = -1;
    dist(&s->ttft, 150 * k, 100 * k, 200 * k, 250 * k);
    dist(&s->tpot, 20 * k, 20 * k, 30 * k, 40 * k);
    dist(&s->itl, 20, 10, 20, 30);
    dist(&s->e2el, 600, 500, 600, 700);
    dist(&s->queue, 0.25, 0, 0.25, 0.5);
    s->cached_token_ratio = 0.25;
    s->n_failure_kinds = 0;
    c->sent_rate = rate + 1.0;
    c->host.host_busy = 0.5;
    c->host.wall_s = 2;
    c->host.cluster_cpu_s = 0.5;
    c->host.loadgen_cpu_s = 0.125;
    c->host.load1_start = 1.5;
    c->host.load1_end = 1.75;
    c->host.ncpu = 2;
    /* Rate index 0 kept time, 1 ran late (not valid), b at 1 was not measured. */
    c->host.step_overrun = rate == 0 ? 0.005 : 0.03;
    if (config == 1 && rate == 1) {
        c->host.step_overrun = NAN;
    }
    static double ttft[] = {100, 200, 250, 300};
    static double tpot[] = {10, 20, 40};
    c->ttft_ms = malloc(sizeof(ttft));
    c->tpot_ms = malloc(sizeof(tpot));
    for (int i = 0; i < 4; i++) {
        c->ttft_ms[i] = ttft[i] * k;
    }
    for (int i = 0; i < 3; i++) {
        c->tpot_ms[i] = tpot[i] * k;
    }
    c->n_ttft = 4;
    c->n_tpot = 3;
}

/* a@1, a@2, b@1, b@2 (two failures), c@1 not run. */
static size_t make_cells(struct exp_cell *cells)
{
    /* The sent rates (rate index + 1) are 1 and 2. */
    make_cell(&cells[0], 0, 0, 0.75, 1.0, 1);
    make_cell(&cells[1], 0, 1, 1.5, 2.0, 2);
    make_cell(&cells[2], 1, 0, 1.0, 1.0, 1);
    make_cell(&cells[3], 1, 1, 0.5, 1.5, 4);
    struct lg_summary *s = &cells[3].s;
    s->failed = 2;
    s->n_failure_kinds = 2;
    snprintf(s->failures[0].key, sizeof(s->failures[0].key), "timeout");
    s->failures[0].count = 1;
    snprintf(s->failures[1].key, sizeof(s->failures[1].key), "http_503");
    s->failures[1].count = 1;
    s->cached_token_ratio = NAN;
    memset(&cells[4], 0, sizeof(cells[4]));
    cells[4].config = 2;
    cells[4].rate = 0;
    cells[4].done = 1;
    cells[4].seed = 7;
    cells[4].time_scale = 1;
    snprintf(cells[4].error, sizeof(cells[4].error), "the cluster did not start (see x.log)");
    return 5;
}

static char *render(int what, const struct exp_file *e, const struct exp_cell *cells, size_t n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    static const char *const meta[] = {"Command: `tandem bench --experiment rep.yaml`"};
    int rc = what == 0   ? exp_write_csv(f, e, cells, n)
             : what == 1 ? exp_write_markdown(f, e, cells, n, meta, 1)
             : what == 2 ? exp_write_svg_goodput(f, e, cells, n)
                         : exp_write_svg_cdf(f, e, cells, n, what - 3);
    CU_ASSERT_EQUAL(rc, 0);
    fclose(f);
    return buf;
}

static void test_csv(void)
{
    struct exp_file *e = report_file();
    if (!e) {
        return;
    }
    struct exp_cell cells[5];
    size_t n = make_cells(cells);
    char *csv = render(0, e, cells, n);
    const char *want =
        "config,cluster,routing,set,rate,seed,time_scale,status,completed,failed,duration_s,"
        "request_throughput,request_goodput,output_throughput,slo_attainment,ttft_mean_ms,"
        "ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,tpot_mean_ms,tpot_p50_ms,tpot_p90_ms,tpot_p99_ms,"
        "itl_p50_ms,itl_p99_ms,e2el_p50_ms,e2el_p99_ms,cached_token_ratio,sent_rate,"
        "client_queue_p99_ms,host_busy,cluster_cpu_cores,runner_cpu_cores,load1_start,"
        "load1_end,failures\n"
        "a,tiny-1p1d.yaml,,,1,7,1,ok,4,0,4.000,1.0000,0.7500,16.0000,0.7500,150.000,100.000,"
        "200.000,250.000,20.000,20.000,30.000,40.000,10.000,30.000,500.000,700.000,0.2500,"
        "1.0000,0.500,0.500,0.250,0.062,1.50,1.75,\n"
        "a,tiny-1p1d.yaml,,,2,8,1,ok,4,0,4.000,2.0000,1.5000,16.0000,0.7500,300.000,200.000,"
        "400.000,500.000,40.000,40.000,60.000,80.000,10.000,30.000,500.000,700.000,0.2500,"
        "2.0000,0.500,0.500,0.250,0.062,1.50,1.75,\n"
        "b,tiny-colocated-x4.yaml,round-robin.yaml,,1,7,1,ok,4,0,4.000,1.0000,1.0000,16.0000,"
        "0.7500,150.000,100.000,200.000,250.000,20.000,20.000,30.000,40.000,10.000,30.000,"
        "500.000,700.000,0.2500,1.0000,0.500,0.500,0.250,0.062,1.50,1.75,\n"
        "b,tiny-colocated-x4.yaml,round-robin.yaml,,2,8,1,ok,4,2,4.000,1.5000,0.5000,16.0000,"
        "0.7500,600.000,400.000,800.000,1000.000,80.000,80.000,120.000,160.000,10.000,30.000,"
        "500.000,700.000,,2.0000,0.500,0.500,0.250,0.062,1.50,1.75,timeout:1;http_503:1\n"
        "c,tiny-2p2d.yaml,,always-disagg-pd-decider.x=1,1,7,1,not run: the cluster did not "
        "start (see x.log),,,,,,,,,,,,,,,,,,,,,,,,,,,,\n";
    CU_ASSERT_STRING_EQUAL(csv, want);
    if (strcmp(csv, want) != 0) {
        printf("\ngot:\n%s\n", csv);
    }
    /* Every line has the header's number of fields. */
    int fields_header = 1, fields = 1, line = 0;
    for (const char *p = csv; *p; p++) {
        if (*p == ',') {
            fields++;
        } else if (*p == '\n') {
            if (line == 0) {
                fields_header = fields;
            }
            CU_ASSERT_EQUAL(fields, fields_header);
            fields = 1;
            line++;
        }
    }
    CU_ASSERT_EQUAL(fields_header, 36);
    CU_ASSERT_EQUAL(line, 6);
    free(csv);
    for (size_t i = 0; i < n; i++) {
        exp_cell_fini(&cells[i]);
    }
    exp_free(e);
}

static void test_markdown(void)
{
    struct exp_file *e = report_file();
    if (!e) {
        return;
    }
    struct exp_cell cells[5];
    size_t n = make_cells(cells);
    char *md = render(1, e, cells, n);
    const char *want =
        "# Experiment rep\n"
        "\n"
        "synthetic cells\n"
        "\n"
        "- Command: `tandem bench --experiment rep.yaml`\n"
        "- Times are modelled: wall seconds divided by the cluster's time_scale (1 for tiny "
        "clusters).\n"
        "- SLOs: TTFT <= 500 ms, TPOT <= 50 ms. Goodput = completed requests meeting every SLO "
        "/ duration (req/s).\n"
        "- Restart: one cluster per configuration; rate i uses seed + i, so no prompt is "
        "repeated on a cluster.\n"
        "- Workload (tandem bench flags): `--num-prompts=4` `--seed=7`\n"
        "\n"
        "## Configurations\n"
        "\n"
        "| config | cluster | routing | set | time scale |\n"
        "|---|---|---|---|---:|\n"
        "| a | tiny-1p1d.yaml | (the cluster's) |  | 1 |\n"
        "| b | tiny-colocated-x4.yaml | round-robin.yaml |  | 1 |\n"
        "| c | tiny-2p2d.yaml | (the cluster's) | always-disagg-pd-decider.x = 1 | 1 |\n"
        "\n"
        "## Results\n"
        "\n"
        "Rates, goodput and throughput in requests per second; latencies in ms (p50 / p90 / "
        "p99).\n"
        "\n"
        "| config | rate | goodput | throughput | TTFT p50 | TTFT p90 | TTFT p99 | TPOT p50 | "
        "TPOT p99 | cached | failures |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
        "| a | 1 | 0.75 | 1.00 | 100.0 | 200.0 | 250.0 | 20.0 | 40.0 | 25.0% | 0 |\n"
        "| a | 2 | 1.50 | 2.00 | 200.0 | 400.0 | 500.0 | 40.0 | 80.0 | 25.0% | 0 |\n"
        "| b | 1 | 1.00 | 1.00 | 100.0 | 200.0 | 250.0 | 20.0 | 40.0 | 25.0% | 0 |\n"
        "| b | 2 | 0.50 | 1.50 | 400.0 | 800.0 | 1000.0 | 80.0 | 160.0 | n/a | 2 (timeout 1, "
        "http_503 1) |\n"
        "| c | 1 | - | - | - | - | - | - | - | - | not run: the cluster did not start (see "
        "x.log) |\n"
        "\n"
        "## Goodput by rate\n"
        "\n"
        "| rate | a | b | c | best |\n"
        "|---:|---:|---:|---:|---|\n"
        "| 1 | 0.75 | 1.00 | - | b (+33.3% over a) |\n"
        "| 2 | 1.50 | 0.50 | - | a (+200.0% over b) |\n"
        "\n"
        "## Machine\n"
        "\n"
        "Sent rate = measured requests / time of the last send (modelled req/s): below the rate "
        "means the load generator fell behind. Client lag = send time - scheduled arrival. CPU "
        "in cores (wall), over the measured run; host busy = share of the machine's CPUs busy "
        "(2 CPUs), whatever runs on them.\n"
        "\n"
        "| config | rate | sent rate | client lag p99 (ms) | cluster CPU | runner CPU | host "
        "busy | load1 start / end | step overrun | valid |\n"
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|\n"
        "| a | 1 | 1.00 | 0.5 | 0.25 | 0.06 | 50% | 1.50 / 1.75 | 0.5% | yes |\n"
        "| a | 2 | 2.00 | 0.5 | 0.25 | 0.06 | 50% | 1.50 / 1.75 | 3.0% | no |\n"
        "| b | 1 | 1.00 | 0.5 | 0.25 | 0.06 | 50% | 1.50 / 1.75 | 0.5% | yes |\n"
        "| b | 2 | 2.00 | 0.5 | 0.25 | 0.06 | 50% | 1.50 / 1.75 | - | - |\n"
        "| c | 1 | - | - | - | - | - | - | - | - |\n"
        "\n"
        "Step overrun = how late the workers' sim steps ended, over the cell, as a share of their "
        "modelled time (tandem:step_overrun_seconds / tandem:step_modelled_seconds). Above 2% the "
        "host did not keep the model's time, so the cell's latencies measure the host as much as "
        "the model: valid = no, do not compare them. \"-\": no timed steps (tiny workers, "
        "time_scale 0) or not measured.\n"
        "\n"
        "## Plots\n"
        "\n"
        "![goodput against rate](goodput.svg)\n"
        "\n"
        "![TTFT CDF per rate](ttft_cdf.svg)\n"
        "\n"
        "![TPOT CDF per rate](tpot_cdf.svg)\n"
        "\n"
        "Per cell: cells/*.json (vLLM's keys), requests/*.csv.\n";
    CU_ASSERT_STRING_EQUAL(md, want);
    if (strcmp(md, want) != 0) {
        printf("\ngot:\n%s\n", md);
    }
    free(md);
    for (size_t i = 0; i < n; i++) {
        exp_cell_fini(&cells[i]);
    }
    exp_free(e);
}

/* extra_slos: one more goodput column in the CSV, one more table. */
static void test_extra_slos_report(void)
{
    struct exp_file *e = parse_ok("name: x\n"
                                  "configs:\n"
                                  "- {label: a, cluster: ../clusters/tiny-1p1d.yaml}\n"
                                  "- {label: b, cluster: ../clusters/tiny-2p2d.yaml}\n"
                                  "rates: [1]\n"
                                  "extra_slos: [[tpot:25]]\n");
    if (!e) {
        return;
    }
    struct exp_cell cells[2];
    make_cell(&cells[0], 0, 0, 0.75, 1.0, 1);
    make_cell(&cells[1], 1, 0, 0.5, 1.0, 1);
    cells[0].extra_goodput[0] = 0.25;
    cells[1].extra_goodput[0] = 0.5;
    char *csv = render(0, e, cells, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(csv, ",load1_end,failures,goodput_slo2\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(csv, ",1.50,1.75,,0.2500\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(csv, ",1.50,1.75,,0.5000\n"));
    free(csv);
    char *md = render(1, e, cells, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(md, "| 1 | 0.75 | 0.50 | a (+50.0% over b) |\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(md, "\n## Goodput by rate, TPOT <= 25 ms\n\nThe same requests "
                                      "under another SLO set (extra_slos).\n\n| rate | a | b | "
                                      "best |\n|---:|---:|---:|---|\n| 1 | 0.25 | 0.50 | b "
                                      "(+100.0% over a) |\n"));
    free(md);
    exp_cell_fini(&cells[0]);
    exp_cell_fini(&cells[1]);
    exp_free(e);
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) {
        n++;
    }
    return n;
}

static void test_svg(void)
{
    struct exp_file *e = report_file();
    if (!e) {
        return;
    }
    struct exp_cell cells[5];
    size_t n = make_cells(cells);
    char *svg = render(2, e, cells, n);
    CU_ASSERT_EQUAL(strncmp(svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg ", 44), 0);
    CU_ASSERT_PTR_NOT_NULL(ends_with(svg, "</svg>\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">rep: goodput (TTFT &lt;= 500 ms, TPOT &lt;= 50 ms)<"));
    /* x: 0..2 over [70, 540]; y: 0..1.5 over [380, 50]. */
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "<polyline fill=\"none\" stroke=\"#4e79a7\" "
                                       "stroke-width=\"2\" points=\"305.0,215.0 540.0,50.0\"/>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "<polyline fill=\"none\" stroke=\"#f28e2b\" "
                                       "stroke-width=\"2\" points=\"305.0,160.0 540.0,270.0\"/>"));
    /* c has no run cell: an empty line, and its legend entry. */
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "stroke=\"#e15759\" stroke-width=\"2\" points=\"\"/>"));
    CU_ASSERT_EQUAL(count(svg, "<polyline"), 3);
    CU_ASSERT_EQUAL(count(svg, "<circle"), 4);
    CU_ASSERT_EQUAL(count(svg, "<g class=\"config\">"), 3);
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">a</text>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">c</text>"));
    /* ticks: x 0, 0.5, ... 2; y 0 .. 1.5 */
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "text-anchor=\"middle\">0.5</text>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "text-anchor=\"end\">1.5</text>"));
    CU_ASSERT_EQUAL(count(svg, "<svg "), 1);
    CU_ASSERT_EQUAL(count(svg, "<g"), count(svg, "</g>"));
    free(svg);

    /* TTFT CDF: values 100..1200 (k up to 4) span less than 20x: linear
     * axis 0..1200, two panels (rates 1 and 2), 101 points per line. */
    svg = render(3, e, cells, n);
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">rep: TTFT CDF per rate<"));
    CU_ASSERT_EQUAL(count(svg, "<g class=\"panel\">"), 2);
    CU_ASSERT_EQUAL(count(svg, "<polyline"), 4);
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">rate 1 req/s<"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">rate 2 req/s<"));
    /* The axis ends at 1500 (the first multiple of 500 >= 1200). Panel 1
     * spans x 60..288, y 64..240: a's first point is TTFT 100 ms at
     * fraction 0, its last 300 ms at fraction 1. */
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "stroke-width=\"2\" points=\"75.2,240.0 "));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, " 105.6,64.0\"/>"));
    const char *pl = strstr(svg, "points=\"");
    int pts = 0;
    for (const char *p = pl + 8; *p && *p != '"'; p++) {
        pts += *p == ',';
    }
    CU_ASSERT_EQUAL(pts, 101);
    CU_ASSERT_PTR_NOT_NULL(ends_with(svg, "</svg>\n"));
    free(svg);

    /* TPOT CDF: 10..160 spans 16x: linear; a spread over 20x goes log. */
    cells[3].tpot_ms[2] = 400;
    svg = render(4, e, cells, n);
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">rep: TPOT CDF per rate (log x)<"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "text-anchor=\"middle\">10</text>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "text-anchor=\"middle\">1000</text>"));
    free(svg);
    for (size_t i = 0; i < n; i++) {
        exp_cell_fini(&cells[i]);
    }
    exp_free(e);
}

/* The plot's width (its width="..." attribute). */
static double svg_width(const char *svg)
{
    const char *w = strstr(svg, " width=\"");
    return w ? atof(w + 8) : 0;
}

/* Where the legend entry of label starts (its <text x="...">), or -1. */
static double legend_x(const char *svg, const char *label)
{
    char want[96];
    snprintf(want, sizeof(want), ">%s</text>", label);
    const char *t = strstr(svg, want);
    const char *x = t;
    while (x && x > svg && strncmp(x, "<text x=\"", 9) != 0) {
        x--;
    }
    return x && x > svg ? atof(x + 9) : -1;
}

/* A long configuration name widens the plots instead of running off their
 * right edge (it did: "tiny-colocated-x4+pre..."); names are 12 px
 * sans-serif, whose glyphs average under 7 px. Short names keep the sizes. */
static void test_svg_legend_fits(void)
{
    struct exp_file *e = report_file();
    if (!e) {
        return;
    }
    struct exp_cell cells[5];
    size_t n = make_cells(cells);
    char *svg = render(2, e, cells, n);
    CU_ASSERT_EQUAL(svg_width(svg), 720);
    free(svg);
    static const char *const label = "tiny-colocated-x4+prefix-aware-precise+inflight";
    snprintf(e->configs[1].label, sizeof(e->configs[1].label), "%s", label);
    for (int what = 2; what <= 4; what++) {
        svg = render(what, e, cells, n);
        double x = legend_x(svg, label), w = svg_width(svg);
        CU_ASSERT(x > 0);
        if (!(w >= x + 7.0 * (double)strlen(label))) {
            printf("\nplot %d: legend at x %.1f, %zu characters, width %.1f\n", what, x,
                   strlen(label), w);
        }
        CU_ASSERT(w >= x + 7.0 * (double)strlen(label));
        free(svg);
    }
    for (size_t i = 0; i < n; i++) {
        exp_cell_fini(&cells[i]);
    }
    exp_free(e);
}

/* Three seeds per cell: mean ± half-width, the best bold unless its
 * interval overlaps the runner-up's (then both read "(tie)"), stats.csv,
 * a line per seed in results.csv and interval bars in goodput.svg. */
static void test_seeds_report(void)
{
    struct exp_file *e = report_file();
    if (!e) {
        return;
    }
    /* rate 1: a {1.0, 1.1, 0.9} against b {2.0, 2.1, 1.9}: apart;
     * rate 2: a {1.0, 1.2, 0.8} against b {1.1, 1.3, 0.9}: overlapping. */
    static const double g[2][2][3] = {{{1.0, 1.1, 0.9}, {1.0, 1.2, 0.8}},
                                      {{2.0, 2.1, 1.9}, {1.1, 1.3, 0.9}}};
    struct exp_cell cells[12];
    size_t n = 0;
    for (int ci = 0; ci < 2; ci++) {
        for (int ri = 0; ri < 2; ri++) {
            for (int k = 0; k < 3; k++) {
                make_cell(&cells[n], ci, ri, g[ci][ri][k], 2.0, 1 + 0.1 * k);
                cells[n].seed_k = k;
                cells[n].seed = exp_seed_of(cells[n].seed, k);
                n++;
            }
        }
    }
    char *md = render(1, e, cells, n);
    const char *want[] = {
        "- Seeds: each cell ran with 3 seeds (seed k = the cell's seed + 1000 k); values are mean "
        "± half-width of the 95% confidence interval (Student t, n - 1 degrees of freedom).",
        /* 4.303 x 0.1 / sqrt 3 = 0.248; TTFT p50 100, 110, 120: 110 ± 24.8 */
        "| a | 1 | 1.00 ± 0.25 | 2.00 ± 0.00 | 110.0 ± 24.8 | ",
        "| b | 2 | 1.10 ± 0.50 | 2.00 ± 0.00 | ",
        " | 0 over 3 seeds |\n",
        "| rate | a | b | best |\n|---:|---:|---:|---|\n"
        "| 1 | 1.00 ± 0.25 | **2.00 ± 0.25** | b (+100.0% over a) |\n"
        "| 2 | 1.00 ± 0.50 (tie) | 1.10 ± 0.50 (tie) | tie: b, a (intervals overlap) |\n",
        "## SLO attainment by rate",
        "| 1 | 75.0 ± 0.0 (tie) | 75.0 ± 0.0 (tie) | tie: a, b (intervals overlap) |\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        if (!strstr(md, want[i])) {
            printf("\nmissing: %s\n", want[i]);
            CU_FAIL("markdown with seeds");
        }
    }
    CU_ASSERT_PTR_NULL(strstr(md, "| a | 1 | 1.10 |")); /* no per-seed rows */
    free(md);
    char *csv = render(0, e, cells, n);
    CU_ASSERT_EQUAL(count(csv, "\n"), 13); /* a line per seed */
    CU_ASSERT_PTR_NOT_NULL(strstr(csv, "\na,tiny-1p1d.yaml,,,1,1007,1,ok,"));
    free(csv);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CU_ASSERT_EQUAL(exp_write_stats_csv(f, e, cells, n), 0);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf,
                                  "config,rate,seeds,request_goodput_mean,request_goodput_ci95,"
                                  "request_throughput_mean,"));
    if (!strstr(buf, "\na,1,3,1.0000,0.2484,2.0000,0.0000,110.000,24.843,")) {
        printf("\n%s\n", buf);
        CU_FAIL("stats.csv");
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "\nb,2,3,1.1000,0.4969,"));
    CU_ASSERT_EQUAL(count(buf, "\n"), 5);
    free(buf);
    char *svg = render(2, e, cells, n);
    CU_ASSERT_EQUAL(count(svg, "<path class=\"ci\""), 4);
    CU_ASSERT_EQUAL(count(svg, "<circle"), 4);
    free(svg);
    for (size_t i = 0; i < n; i++) {
        exp_cell_fini(&cells[i]);
    }
    exp_free(e);
}

/* Interval bars stop at what the metric can be: attainment in [0, 1],
 * goodput >= 0, although 3 wide seeds give t intervals past both (the
 * attainment of 1, 1, 0.1 is 0.70 ± 1.29; goodput 0.1, 2, 0.1 is
 * 0.73 ± 2.72). The plot's y runs from GP_Y1 = 380 (0) up to GP_Y0 = 50. */
static void test_interval_bars_bounded(void)
{
    struct exp_file *e = report_file();
    if (!e) {
        return;
    }
    static const double att[3] = {1.0, 1.0, 0.1}, good[3] = {0.1, 2.0, 0.1};
    struct exp_cell cells[3];
    for (int k = 0; k < 3; k++) {
        make_cell(&cells[k], 0, 0, good[k], 2.0, 1);
        cells[k].s.slo_attainment = att[k];
        cells[k].seed_k = k;
        cells[k].seed = exp_seed_of(cells[k].seed, k);
    }
    for (int what = 0; what < 2; what++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        CU_ASSERT_EQUAL(what == 0 ? exp_write_svg_attainment(f, e, cells, 3)
                                  : exp_write_svg_goodput(f, e, cells, 3),
                        0);
        fclose(f);
        const char *p = strstr(buf, "<path class=\"ci\" d=\"M");
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        double x, y0, y1;
        CU_ASSERT_EQUAL_FATAL(sscanf(p, "<path class=\"ci\" d=\"M%lf,%lfV%lf", &x, &y0, &y1), 3);
        if (!(y0 <= 380.0 + 1e-9 && y1 >= 50.0 - 1e-9 && y0 > y1)) {
            printf("\n%s bar from y %.1f to %.1f, outside 380..50\n",
                   what == 0 ? "attainment" : "goodput", y0, y1);
        }
        CU_ASSERT(y0 <= 380.0 + 1e-9); /* not below 0 */
        CU_ASSERT(y1 >= 50.0 - 1e-9);  /* not above the axis */
        CU_ASSERT(y0 > y1);
        if (what == 0) {
            CU_ASSERT_DOUBLE_EQUAL(y0, 380.0, 1e-9); /* 0.70 - 1.29 stops at 0 */
            CU_ASSERT_DOUBLE_EQUAL(y1, 50.0, 1e-9);  /* 0.70 + 1.29 stops at 1 */
        } else {
            CU_ASSERT_DOUBLE_EQUAL(y0, 380.0, 1e-9); /* 0.73 - 2.72 stops at 0 */
        }
        free(buf);
    }
    for (int k = 0; k < 3; k++) {
        exp_cell_fini(&cells[k]);
    }
    exp_free(e);
}

static void test_distributions_and_files(void)
{
    struct lg_record recs[4];
    memset(recs, 0, sizeof(recs));
    /* ok, 5 tokens: TPOT (1.5 - 0.5) / 4 = 0.25 s; ok, 1 token: no TPOT;
     * failed; ok, 3 tokens: (0.75 - 0.25) / 2 = 0.25 s. */
    recs[0] = (struct lg_record){.ok = 1, .ttft_s = 0.5, .e2el_s = 1.5, .output_tokens = 5};
    recs[1] = (struct lg_record){.ok = 1, .ttft_s = 0.125, .e2el_s = 0.125, .output_tokens = 1};
    recs[2] = (struct lg_record){.ok = 0, .ttft_s = 9, .e2el_s = 9, .output_tokens = 9};
    recs[3] = (struct lg_record){.ok = 1, .ttft_s = 0.25, .e2el_s = 0.75, .output_tokens = 3};
    struct exp_cell c;
    memset(&c, 0, sizeof(c));
    CU_ASSERT_EQUAL(exp_cell_distributions(&c, recs, 4), 0);
    CU_ASSERT_EQUAL(c.n_ttft, 3);
    CU_ASSERT_EQUAL(c.n_tpot, 2);
    CU_ASSERT_EQUAL(c.ttft_ms[0], 125);
    CU_ASSERT_EQUAL(c.ttft_ms[1], 250);
    CU_ASSERT_EQUAL(c.ttft_ms[2], 500);
    CU_ASSERT_EQUAL(c.tpot_ms[0], 250);
    CU_ASSERT_EQUAL(c.tpot_ms[1], 250);
    exp_cell_fini(&c);

    /* exp_write_report writes its files, and a PNG beside each plot. */
    struct exp_file *e = report_file();
    if (!e) {
        return;
    }
    struct exp_cell cells[5];
    size_t n = make_cells(cells);
    char dir[] = "/tmp/tandem-exp-report-XXXXXX";
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    char err[EXP_ERR_MAX];
    CU_ASSERT_EQUAL(exp_write_report(dir, e, cells, n, NULL, 0, err, sizeof(err)), 0);
    const char *names[] = {"summary.md",   "results.csv", "goodput.svg",    "ttft_cdf.svg",
                           "tpot_cdf.svg", "stats.csv",   "attainment.svg", "slo_scale.svg"};
    for (int i = 0; i < 8; i++) {
        char path[256];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        struct stat st;
        CU_ASSERT_EQUAL(stat(path, &st), 0);
        CU_ASSERT(st.st_size > 100);
        unlink(path);
        /* A PNG beside each SVG: rsvg-convert is installed for the tests
         * (deploy/install-deps.sh, librsvg2-bin). */
        size_t l = strlen(path);
        if (strcmp(path + l - 4, ".svg") == 0) {
            memcpy(path + l - 4, ".png", 4);
            FILE *png = fopen(path, "rb");
            unsigned char magic[8] = {0};
            if (png == NULL) {
                printf("\nno %s: is rsvg-convert (librsvg2-bin) installed?\n", path);
            }
            CU_ASSERT_FATAL(png != NULL);
            CU_ASSERT_EQUAL(fread(magic, 1, 8, png), 8);
            fclose(png);
            CU_ASSERT_EQUAL(memcmp(magic, "\x89PNG\r\n\x1a\n", 8), 0);
            unlink(path);
        }
    }
    CU_ASSERT_EQUAL(rmdir(dir), 0);
    CU_ASSERT_EQUAL(exp_write_report("/nonexistent/dir", e, cells, n, NULL, 0, err, sizeof(err)),
                    TANDEM_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot write /nonexistent/dir/summary.md.tmp"));
    for (size_t i = 0; i < n; i++) {
        exp_cell_fini(&cells[i]);
    }
    exp_free(e);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every shipped experiment file (each *.yaml of deploy/experiments, so a new
 * one is covered without editing this list) loads and its configurations
 * validate. */
static void test_shipped_files(void)
{
    char *files[64];
    size_t n_files = 0;
    char edir[1024];
    snprintf(edir, sizeof(edir), "%s/deploy/experiments", source_dir());
    DIR *d = opendir(edir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    for (struct dirent *de; (de = readdir(d)) != NULL && n_files < 64;) {
        size_t l = strlen(de->d_name);
        if (l > 5 && strcmp(de->d_name + l - 5, ".yaml") == 0) {
            files[n_files++] = strdup(de->d_name);
        }
    }
    closedir(d);
    qsort(files, n_files, sizeof(files[0]), cmp_name);
    CU_ASSERT(n_files >= 14);
    char dir[] = "/tmp/tandem-exp-shipped-XXXXXX";
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    for (size_t i = 0; i < n_files; i++) {
        char path[1024], err[EXP_ERR_MAX] = "", cf[4096];
        snprintf(path, sizeof(path), "%s/deploy/experiments/%s", source_dir(), files[i]);
        struct exp_file *e = NULL;
        int rc = exp_load(&e, path, err, sizeof(err));
        if (rc != 0) {
            printf("\n%s: %s\n", files[i], err);
        }
        CU_ASSERT_EQUAL(rc, 0);
        for (int c = 0; e && c < e->n_configs; c++) {
            double ts;
            rc = exp_prepare(e, c, dir, cf, sizeof(cf), &ts, err, sizeof(err));
            if (rc != 0) {
                printf("\n%s: %s\n", files[i], err);
            }
            CU_ASSERT_EQUAL(rc, 0);
            CU_ASSERT(ts > 0);
        }
        exp_free(e);
        free(files[i]);
    }
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

/* Sim runs ask for logprobs (one chunk per token); a byte-0 token's text is
 * then a key of top_logprobs, which jansson cannot hold: the load generator
 * reads such a chunk with the NUL taken as U+0001 (tools/loadgen/openai.c). */
static void test_nul_logprob_key(void)
{
    const char *chunk = "{\"choices\":[{\"index\":0,\"text\":\"\\u0000\",\"logprobs\":{"
                        "\"tokens\":[\"\\u0000\"],\"top_logprobs\":[{\"\\u0000\":-1.5}]},"
                        "\"finish_reason\":null}],\"usage\":null}";
    struct lg_chunk c;
    CU_ASSERT_EQUAL(lg_openai_parse_chunk(LG_API_COMPLETIONS, chunk, strlen(chunk), &c), 0);
    CU_ASSERT_EQUAL(c.is_token, 1);
    CU_ASSERT_EQUAL(c.text_len, 1);
    CU_ASSERT_EQUAL(c.text ? c.text[0] : -1, 1);
    lg_chunk_clear(&c);
    /* An escaped backslash before u0000 is text, not a NUL: read as is (by
     * jansson, whose document this looks into; the fast path keeps none). */
    const char *lit = "{\"choices\":[{\"text\":\"a\",\"logprobs\":{\"top_logprobs\":[{"
                      "\"\\\\u0000\":-1}]},\"finish_reason\":null}]}";
    CU_ASSERT_EQUAL(lg_openai_parse_chunk_json(LG_API_COMPLETIONS, lit, strlen(lit), &c), 0);
    CU_ASSERT_EQUAL(c.text_len, 1);
    json_t *top = json_array_get(
        json_object_get(
            json_object_get(json_array_get(json_object_get(c.root, "choices"), 0), "logprobs"),
            "top_logprobs"),
        0);
    CU_ASSERT_PTR_NOT_NULL(json_object_get(top, "\\u0000"));
    lg_chunk_clear(&c);
    /* Still malformed is still an error. */
    const char *bad = "{\"\\u0000\": [1, }";
    CU_ASSERT_EQUAL(lg_openai_parse_chunk(LG_API_COMPLETIONS, bad, strlen(bad), &c), TANDEM_EPROTO);
}

/* The live runner's step overrun: a sample read by its exact name, and the
 * share of a cell from the totals before and after it. */
static void test_step_overrun(void)
{
    const char *body = "# HELP tandem:step_modelled_seconds x\n"
                       "tandem:step_modelled_seconds_bucket{le=\"+Inf\"} 3\n"
                       "tandem:step_modelled_seconds_sum_x 9\n"
                       "tandem:step_modelled_seconds_sum 1.5\n"
                       "tandem:step_overrun_seconds_sum 0.0125\n";
    CU_ASSERT_DOUBLE_EQUAL(exp_prom_value(body, "tandem:step_modelled_seconds_sum"), 1.5, 0);
    CU_ASSERT_DOUBLE_EQUAL(exp_prom_value(body, "tandem:step_overrun_seconds_sum"), 0.0125, 0);
    CU_ASSERT(isnan(exp_prom_value(body, "tandem:step_wall_seconds_sum")));
    CU_ASSERT(isnan(exp_prom_value(body, "tandem:step_modelled")));
    struct exp_steps a = {.modelled_s = 1, .overrun_s = 0.01, .workers = 2};
    struct exp_steps b = {.modelled_s = 3, .overrun_s = 0.05, .workers = 2};
    CU_ASSERT_DOUBLE_EQUAL(exp_steps_overrun(&a, &b), 0.02, 1e-12);
    CU_ASSERT(isnan(exp_steps_overrun(&a, &a))); /* no timed step in between */
    b.workers = 3;                               /* a worker came or went */
    CU_ASSERT(isnan(exp_steps_overrun(&a, &b)));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("experiment", NULL, NULL);
    CU_add_test(s, "parse_good", test_parse_good);
    CU_add_test(s, "parse_bad", test_parse_bad);
    CU_add_test(s, "routing_set", test_routing_set);
    CU_add_test(s, "prepare", test_prepare);
    CU_add_test(s, "csv", test_csv);
    CU_add_test(s, "markdown", test_markdown);
    CU_add_test(s, "svg", test_svg);
    CU_add_test(s, "svg_legend_fits", test_svg_legend_fits);
    CU_add_test(s, "extra_slos_report", test_extra_slos_report);
    CU_add_test(s, "seeds_report", test_seeds_report);
    CU_add_test(s, "interval_bars_bounded", test_interval_bars_bounded);
    CU_add_test(s, "distributions_and_files", test_distributions_and_files);
    CU_add_test(s, "shipped_files", test_shipped_files);
    CU_add_test(s, "nul_logprob_key", test_nul_logprob_key);
    CU_add_test(s, "step_overrun", test_step_overrun);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
