/* Statistics over seeds and the searches on the offline simulator
 * (tools/experiment/exp_stats.h, tools/search.h): the 95% half-width of
 * known samples, interval overlap, attainment against SLO scale, the rate
 * search (its result within the resolution, and monotone in the SLO and the
 * attainment asked), the P:D search on a 4-GPU budget of a small model
 * (deterministic best), and the errors of bad inputs. Small workloads: every
 * simulation here takes milliseconds. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "experiment/exp_main.h"
#include "log.h"
#include "experiment/exp_stats.h"
#include "search.h"
#include "simulate.h"
#include "simulate_cmd.h"
#include "tandem_err.h"

#define EXPECT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (tol))) {                                                           \
            fprintf(stderr, "\n%s:%d: %s = %.9g, want %.9g (+- %g)\n", __FILE__, __LINE__, #a, a_, \
                    b_, (double)(tol));                                                            \
        }                                                                                          \
        CU_ASSERT(fabs(a_ - b_) <= (tol));                                                         \
    } while (0)

static void test_ci(void)
{
    /* 1..5: mean 3, s = sqrt(2.5), t(0.975, 4) = 2.776. */
    double v[] = {1, 2, 3, 4, 5};
    struct exp_ci ci = exp_ci_of(v, 5);
    CU_ASSERT_EQUAL(ci.n, 5);
    EXPECT_NEAR(ci.mean, 3, 1e-12);
    EXPECT_NEAR(ci.half, 2.776 * sqrt(2.5) / sqrt(5.0), 1e-9);
    EXPECT_NEAR(ci.half, 1.96293, 1e-4);
    /* Two samples: t(0.975, 1) = 12.706, s = |a - b| / sqrt 2. */
    double w[] = {10, 12, NAN};
    ci = exp_ci_of(w, 3); /* NaN skipped */
    CU_ASSERT_EQUAL(ci.n, 2);
    EXPECT_NEAR(ci.mean, 11, 1e-12);
    EXPECT_NEAR(ci.half, 12.706 * sqrt(2.0) / sqrt(2.0), 1e-9);
    /* One sample: a mean, no interval; none: neither. */
    ci = exp_ci_of(v, 1);
    CU_ASSERT(ci.n == 1 && ci.mean == 1 && isnan(ci.half));
    ci = exp_ci_of(w + 2, 1);
    CU_ASSERT(ci.n == 0 && isnan(ci.mean));
    /* The t table and its continuation. */
    EXPECT_NEAR(exp_t975(1), 12.706, 1e-9);
    EXPECT_NEAR(exp_t975(30), 2.042, 1e-9);
    EXPECT_NEAR(exp_t975(31), 2.0395, 1e-3);
    EXPECT_NEAR(exp_t975(120), 1.9799, 1e-3);
    EXPECT_NEAR(exp_t975(100000), 1.95999, 1e-4);
    CU_ASSERT(isnan(exp_t975(0)));
    /* Seeds: the first is the file's; the others 1000 apart. */
    CU_ASSERT_EQUAL(exp_seed_of(7, 0), 7u);
    CU_ASSERT_EQUAL(exp_seed_of(7, 3), 3007u);
}

static void test_overlap(void)
{
    struct exp_ci a = {.mean = 10, .half = 1, .n = 5}, b = {.mean = 12, .half = 1, .n = 5};
    CU_ASSERT(exp_ci_overlap(&a, &b)); /* touching: 11 = 11 */
    b.mean = 12.01;
    CU_ASSERT(!exp_ci_overlap(&a, &b));
    CU_ASSERT(!exp_ci_overlap(&b, &a) == !exp_ci_overlap(&a, &b));
    b.half = 2;
    CU_ASSERT(exp_ci_overlap(&b, &a));
    /* Without an interval nothing is a tie by overlap. */
    b = (struct exp_ci){.mean = 10, .half = NAN, .n = 1};
    CU_ASSERT(!exp_ci_overlap(&a, &b));
}

static void test_attainment_scale(void)
{
    /* TTFT 100, 200, 300 ms; TPOT 10, 20, 40 ms; one failed request. */
    struct exp_req r[4] = {
        {.ttft_s = 0.1, .tpot_s = 0.010, .e2el_s = 1, .ok = 1},
        {.ttft_s = 0.2, .tpot_s = 0.020, .e2el_s = 1, .ok = 1},
        {.ttft_s = 0.3, .tpot_s = 0.040, .e2el_s = 1, .ok = 1},
        {.ttft_s = 0.01, .tpot_s = 0, .e2el_s = 0.01, .ok = 0},
    };
    struct lg_slo slo = {.ttft_ms = 200, .tpot_ms = 20, .e2el_ms = -1};
    EXPECT_NEAR(exp_attainment(r, 4, &slo, 1.0), 0.5, 1e-12); /* at the bound: meets */
    EXPECT_NEAR(exp_attainment(r, 4, &slo, 0.5), 0.25, 1e-12);
    EXPECT_NEAR(exp_attainment(r, 4, &slo, 1.5), 0.5, 1e-12);  /* TPOT 40 > 30 */
    EXPECT_NEAR(exp_attainment(r, 4, &slo, 2.0), 0.75, 1e-12); /* the failed one never */
    struct lg_slo none = {.ttft_ms = -1, .tpot_ms = -1, .e2el_ms = -1};
    CU_ASSERT(isnan(exp_attainment(r, 4, &none, 1.0)));
    CU_ASSERT(isnan(exp_attainment(r, 0, &slo, 1.0)));
}

/* ------------------------------------------------------------------ */
/* Searches on small offline clusters                                  */
/* ------------------------------------------------------------------ */

/* kv_blocks 4096: the workload (24 prompts of 65 blocks) never fills it, so every search gives
 * what the GPU-sized pool gives (checked: the same tables), while the KV check that test builds
 * run after every step (TANDEM_KV_CHECK, O(pool)) walks 4096 blocks instead of the H100 pool's:
 * 22-32 s -> 7 s of this test in the gcc build, 104 s in the ASan stage before. */
static const char *COLO1 = "name: colo1\nmodel: llama-3-8b\nbackend: sim\nblock_size: 16\n"
                           "pools:\n  colocated:\n    count: 1\n    kv_blocks: 4096\n";

static struct cluster *parse(const char *yaml)
{
    struct cluster *c = NULL;
    char err[1024] = "";
    int rc = cluster_parse(&c, yaml, strlen(yaml), "test.yaml", NULL, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "\ncluster: %s\n", err);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return c;
}

static const char *pd_yaml(void)
{
    static char yaml[512];
    const char *src = getenv("TANDEM_SOURCE_DIR");
    snprintf(yaml, sizeof(yaml),
             "name: pd\nmodel: llama-3-8b\nbackend: sim\nblock_size: 16\n"
             "routing: %s/deploy/routing/pd-always.yaml\n"
             "pools:\n  prefill:\n    count: 1\n    kv_blocks: 4096\n  decode:\n    count: 1\n    "
             "kv_blocks: 4096\n",
             src ? src : ".");
    return yaml;
}

/* 24 random 1024-token prompts with 16-token outputs. */
static void workload(struct lg_run_config *r)
{
    lg_run_config_default(r);
    r->num_prompts = 24;
    r->request_rate = 1;
    r->workload.random_input_len = 1024;
    r->workload.random_output_len = 16;
    r->workload.random_range_ratio = 0;
    r->workload.seed = 3;
    r->request_timeout_s = 600;
}

static double attainment_at(const struct cluster *c, const struct lg_run_config *run,
                            const struct lg_slo *slo, double rate, uint64_t seed)
{
    struct lg_run_config cfg = *run;
    cfg.request_rate = rate;
    cfg.workload.seed = seed;
    struct lg_run_result res;
    struct sm_options so;
    sm_options_default(&so);
    char err[SM_ERR_MAX];
    CU_ASSERT_EQUAL_FATAL(sm_run(c, &cfg, &so, &res, NULL, err, sizeof(err)), 0);
    double a = exp_attainment_records(res.records, res.n, slo, 1.0);
    lg_run_result_free(&res);
    return a;
}

static void test_rate_search(void)
{
    struct cluster *c = parse(COLO1);
    struct lg_run_config run;
    workload(&run);
    struct lg_slo slo = {.ttft_ms = 150, .tpot_ms = 50, .e2el_ms = -1};
    struct search_rate_opts o;
    search_rate_opts_default(&o);
    o.min_rate = 1;
    o.max_rate = 65;
    o.resolution = 1;
    o.seeds = 2;
    struct search_rate_result r;
    char err[SM_ERR_MAX] = "";
    int rc = search_rate(c, NULL, &run, &slo, &o, NULL, &r, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "\nsearch_rate: %s\n", err);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(r.n, 2);
    CU_ASSERT_EQUAL(r.gpus, 1);
    CU_ASSERT_EQUAL(r.below_min, 0);
    CU_ASSERT_EQUAL(r.at_max, 0);
    printf("\n  rates found: %g, %g (%d probes)", r.rate[0], r.rate[1], r.probes);
    for (int k = 0; k < r.n; k++) {
        /* Within the resolution: the rate found passes, one resolution
         * above it fails (the bisection's bracket). */
        CU_ASSERT(r.rate[k] > o.min_rate && r.rate[k] < o.max_rate);
        uint64_t seed = exp_seed_of(run.workload.seed, k);
        CU_ASSERT(attainment_at(c, &run, &slo, r.rate[k], seed) >= 0.9);
        CU_ASSERT(attainment_at(c, &run, &slo, r.rate[k] + o.resolution, seed) < 0.9);
    }
    EXPECT_NEAR(r.ci.mean, (r.rate[0] + r.rate[1]) / 2, 1e-12);
    EXPECT_NEAR(r.per_gpu.mean, r.ci.mean, 1e-12); /* one GPU */
    /* Monotone: a looser TTFT bound, or a lower attainment asked, never
     * lowers the rate found (per seed). */
    struct lg_slo loose = slo;
    loose.ttft_ms = 300;
    struct search_rate_result r2, r3;
    CU_ASSERT_EQUAL_FATAL(search_rate(c, NULL, &run, &loose, &o, NULL, &r2, err, sizeof(err)), 0);
    o.attainment = 0.5;
    CU_ASSERT_EQUAL_FATAL(search_rate(c, NULL, &run, &slo, &o, NULL, &r3, err, sizeof(err)), 0);
    for (int k = 0; k < 2; k++) {
        CU_ASSERT(r2.rate[k] >= r.rate[k]);
        CU_ASSERT(r3.rate[k] >= r.rate[k]);
    }
    CU_ASSERT(r2.ci.mean > r.ci.mean);
    /* Without an SLO there is nothing to search for. */
    struct lg_slo none = {.ttft_ms = -1, .tpot_ms = -1, .e2el_ms = -1};
    CU_ASSERT_EQUAL(search_rate(c, NULL, &run, &none, &o, NULL, &r3, err, sizeof(err)),
                    TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "needs SLOs"));
    cluster_free(c);
}

static void pd_opts(struct search_pd_opts *o)
{
    memset(o, 0, sizeof(*o));
    search_rate_opts_default(&o->rate);
    o->gpus = 4;
    o->rate.min_rate = 1;
    o->rate.max_rate = 65;
    o->rate.resolution = 4;
    o->rate.seeds = 2;
}

static char *table(const struct search_pd_row *rows, int n, const struct search_pd_opts *o)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    search_pd_print(f, rows, n, o);
    fclose(f);
    return buf;
}

static void test_pd_search(void)
{
    struct cluster *pd = parse(pd_yaml()), *colo = parse(COLO1);
    struct lg_run_config run;
    workload(&run);
    run.workload.random_input_len = 2048;
    struct lg_slo slo = {.ttft_ms = 120, .tpot_ms = 30, .e2el_ms = -1};
    struct search_pd_opts o;
    pd_opts(&o);
    char err[SM_ERR_MAX] = "";
    CU_ASSERT_EQUAL(search_parse_tps("1,2", &o, err, sizeof(err)), 0);
    struct search_pd_row *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    int rc = search_pd(pd, colo, NULL, &run, &slo, &o, NULL, &a, &na, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "\nsearch_pd: %s\n", err);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    /* 4 GPUs, TP 1 or 2 per phase: 1P3D 2P2D 3P1D (tp1/tp1), 1P2D (tp2/tp1),
     * 2P1D (tp1/tp2), 1P1D (tp2/tp2), and colocated x4 tp1, x2 tp2. */
    CU_ASSERT_EQUAL(na, 8);
    char *t = table(a, na, &o);
    printf("\n%s", t);
    for (int i = 0; i < na; i++) {
        CU_ASSERT(a[i].ok);
        CU_ASSERT_EQUAL(a[i].r.gpus, 4);
        CU_ASSERT(a[i].colocated
                      ? a[i].prefill * a[i].tp_prefill == 4
                      : a[i].prefill * a[i].tp_prefill + a[i].decode * a[i].tp_decode == 4);
        if (i > 0) { /* best first */
            CU_ASSERT(a[i - 1].r.per_gpu.mean >= a[i].r.per_gpu.mean);
        }
    }
    /* Deterministic: the same inputs, the same table. */
    CU_ASSERT_EQUAL_FATAL(
        search_pd(pd, colo, NULL, &run, &slo, &o, NULL, &b, &nb, err, sizeof(err)), 0);
    char *t2 = table(b, nb, &o);
    CU_ASSERT_STRING_EQUAL(t, t2);
    CU_ASSERT_STRING_EQUAL(a[0].label, "colocated x2 tp2");
    CU_ASSERT_PTR_NOT_NULL(strstr(t, "| colocated x2 tp2 | 2 x TP2 colocated | - | 4 | "));
    free(t);
    free(t2);
    free(a);
    free(b);
    cluster_free(pd);
    cluster_free(colo);
}

static void test_pd_errors(void)
{
    struct cluster *pd = parse(pd_yaml()), *colo = parse(COLO1);
    struct lg_run_config run;
    workload(&run);
    struct lg_slo slo = {.ttft_ms = 150, .tpot_ms = 50, .e2el_ms = -1};
    struct search_pd_opts o;
    pd_opts(&o);
    char err[SM_ERR_MAX] = "";
    struct search_pd_row *rows = NULL;
    int n = 0;
    /* No split: 2 GPUs at TP 2 cannot hold a prefill and a decode instance. */
    o.gpus = 2;
    CU_ASSERT_EQUAL(search_parse_tps("2", &o, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(search_pd(pd, colo, NULL, &run, &slo, &o, NULL, &rows, &n, err, sizeof(err)),
                    TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--gpus 2: no split into prefill and decode instances"));
    CU_ASSERT_PTR_NULL(rows);
    /* A TP the model refuses (llama-3-8b has 8 KV heads): every row says
     * why, and with nothing runnable the search fails naming the first. */
    o.gpus = 32;
    CU_ASSERT_EQUAL(search_parse_tps("16", &o, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(search_pd(pd, NULL, NULL, &run, &slo, &o, NULL, &rows, &n, err, sizeof(err)),
                    TANDEM_EINVAL);
    printf("\n  %s", err);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "no configuration of 32 GPUs could run: 1P1D tp16/tp16: "));
    /* A cluster without both pools. */
    CU_ASSERT_EQUAL(search_pd(colo, NULL, NULL, &run, &slo, &o, NULL, &rows, &n, err, sizeof(err)),
                    TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "needs a cluster with a prefill and a decode pool"));
    /* Bad --tp lists. */
    static const struct {
        const char *tps, *msg;
    } bad[] = {
        {"0", "--tp: '0' is not a TP degree in [1, 64] (e.g. --tp 1,2,4,8)"},
        {"1,x", "--tp: 'x' is not a TP degree in [1, 64] (e.g. --tp 1,2,4,8)"},
        {"2,2", "--tp: 2 is listed twice"},
        {"", "--tp: no TP degree given (e.g. --tp 1,2,4,8)"},
        {"1,2,3,4,5,6,7,8,9", "--tp: more than 8 degrees"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        CU_ASSERT_EQUAL(search_parse_tps(bad[i].tps, &o, err, sizeof(err)), TANDEM_EINVAL);
        if (strcmp(err, bad[i].msg) != 0) {
            printf("\n  --tp %s: got '%s', want '%s'", bad[i].tps, err, bad[i].msg);
            CU_FAIL("message");
        }
    }
    /* Bad search settings. */
    o.rate.min_rate = 8;
    o.rate.max_rate = 4;
    CU_ASSERT_EQUAL(search_rate_opts_check(&o.rate, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(err, "max_rate 4 must be above min_rate 8");
    cluster_free(pd);
    cluster_free(colo);
}

/* The command's own checks, before anything runs (exit code 2). */
static void test_cli_errors(void)
{
    static const char *const cases[][12] = {
        {"simulate", "--gpus", "4", NULL},
        {"simulate", "--search", "pd", NULL},
        {"simulate", "--search", "qd", "--gpus", "4", NULL},
        {"simulate", "--search", "pd", "--gpus", "4", "--tp", "1,0", NULL},
        {"simulate", "--search", "pd", "--gpus", "1", NULL},
        {"simulate", "--search", "pd", "--gpus", "4", "--attainment", "2", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *argv[12];
        int argc = 0;
        for (; cases[i][argc]; argc++) {
            argv[argc] = (char *)cases[i][argc];
        }
        argv[argc] = NULL;
        CU_ASSERT_EQUAL(simulate_main(argc, argv), 2);
    }
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return NULL;
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* An experiment offline with seeds, goodput_search and pd_search: its
 * report has the sections, and a second run writes the same bytes. */
static void test_experiment_offline(void)
{
    char dir[] = "/tmp/test_search.XXXXXX";
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    char path[512], out[128], file[128];
    snprintf(path, sizeof(path), "%s/pd.yaml", dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(pd_yaml(), f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/colo.yaml", dir);
    f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(COLO1, f);
    fclose(f);
    snprintf(file, sizeof(file), "%s/e.yaml", dir);
    f = fopen(file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("name: st\n"
          "configs:\n- {label: pd, cluster: pd.yaml}\n- {label: colo, cluster: colo.yaml}\n"
          "rates: [4, 8]\nseeds: 2\n"
          "goodput_search: {min_rate: 1, max_rate: 33, resolution: 8}\n"
          "pd_search: {gpus: 2, pd: pd, colocated: colo}\n"
          "bench: {dataset-name: random, random-input-len: 1024, random-output-len: 16, "
          "random-range-ratio: 0, num-prompts: 16, seed: 3, goodput: [ttft:150, tpot:50]}\n",
          f);
    fclose(f);
    snprintf(out, sizeof(out), "%s/report", dir);
    char *argv[] = {"bench", "--experiment", file, "--offline", "--out", out, NULL};
    CU_ASSERT_EQUAL(exp_main(6, argv), 0);
    const char *names[] = {"summary.md",  "results.csv",    "stats.csv",
                           "goodput.svg", "attainment.svg", "slo_scale.svg"};
    char *first[6];
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof(path), "%s/%s", out, names[i]);
        first[i] = slurp(path);
        CU_ASSERT_PTR_NOT_NULL(first[i]);
    }
    if (first[0]) {
        CU_ASSERT_PTR_NOT_NULL(strstr(first[0], "- Seeds: each cell ran with 2 seeds"));
        CU_ASSERT_PTR_NOT_NULL(strstr(first[0], "\n## Per-GPU goodput (goodput search)\n"));
        CU_ASSERT_PTR_NOT_NULL(strstr(first[0], "\n## P:D search\n"));
        CU_ASSERT_PTR_NOT_NULL(strstr(first[0], "| 1P1D tp1/tp1 | 1 x TP1 | 1 x TP1 | 2 | "));
        CU_ASSERT_PTR_NOT_NULL(
            strstr(first[0], "| colocated x2 tp1 | 2 x TP1 colocated | - | 2 |"));
        CU_ASSERT_PTR_NOT_NULL(strstr(first[0], "\n## SLO attainment by rate\n"));
    }
    CU_ASSERT_EQUAL(exp_main(6, argv), 0);
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof(path), "%s/%s", out, names[i]);
        char *again = slurp(path);
        CU_ASSERT(first[i] && again && strcmp(first[i], again) == 0);
        free(again);
        free(first[i]);
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

int main(void)
{
    log_init("test", LOG_LEVEL_WARN);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("search", NULL, NULL);
    CU_add_test(s, "ci", test_ci);
    CU_add_test(s, "overlap", test_overlap);
    CU_add_test(s, "attainment_scale", test_attainment_scale);
    CU_add_test(s, "rate_search", test_rate_search);
    CU_add_test(s, "pd_search", test_pd_search);
    CU_add_test(s, "pd_errors", test_pd_errors);
    CU_add_test(s, "cli_errors", test_cli_errors);
    CU_add_test(s, "experiment_offline", test_experiment_offline);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
