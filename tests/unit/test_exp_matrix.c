/* The experiment matrix (tools/experiment/exp_matrix.c) with a fake runner
 * (no process, no socket): the order of the cells and of the runner's calls
 * for restart per-config and per-rate, the seeds and rates each cell is run
 * with, what the matrix makes of the runner's requests (summary, JSON with
 * the runner's own keys, files), and a configuration whose start fails. */
#define _GNU_SOURCE
#include <CUnit/Basic.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experiment/exp_cell.h"
#include "experiment/exp_file.h"
#include "experiment/exp_matrix.h"
#include "tandem_err.h"

#define MAX_CALLS 48

/* What the fake runner was asked, in order. */
struct fake {
    int fail_config; /* start fails for this configuration (-1: none) */
    char log[MAX_CALLS][96];
    int n_log;
    int running; /* started and not stopped */
};

static void fake_note(struct fake *f, const char *fmt_, ...) __attribute__((format(printf, 2, 3)));
static void fake_note(struct fake *f, const char *fmt_, ...)
{
    if (f->n_log == MAX_CALLS) {
        return;
    }
    va_list ap;
    va_start(ap, fmt_);
    vsnprintf(f->log[f->n_log++], sizeof(f->log[0]), fmt_, ap);
    va_end(ap);
}

static int fake_start(void *r, const struct exp_start *s, char *err, size_t errlen, char *note,
                      size_t notelen)
{
    struct fake *f = r;
    fake_note(f, "start %s", s->name);
    if (s->config == f->fail_config) {
        snprintf(err, errlen, "no such cluster");
        snprintf(note, notelen, "fake: %s did not start", s->name);
        return TANDEM_EIO;
    }
    f->running = 1;
    return 0;
}

static void fake_settle(void *r, double s)
{
    fake_note(r, "settle %g", s);
}

/* Three completed requests of 4 output tokens, 1 modelled second apart:
 * TTFT 100, 200, 300 ms; every token 10 ms after the previous one. */
static int fake_run(void *r, const struct lg_run_config *cfg, struct exp_cell *c,
                    struct exp_run_out *out, char *err, size_t errlen)
{
    struct fake *f = r;
    (void)err, (void)errlen;
    CU_ASSERT(f->running);
    fake_note(f, "run %d/%d rate %g seed %llu", c->config, c->rate, cfg->request_rate,
              (unsigned long long)cfg->workload.seed);
    CU_ASSERT_EQUAL(cfg->workload.seed, c->seed);
    out->res.records = calloc(3, sizeof(struct lg_record));
    CU_ASSERT_PTR_NOT_NULL_FATAL(out->res.records);
    for (int i = 0; i < 3; i++) {
        struct lg_record *rec = &out->res.records[i];
        rec->index = i;
        rec->session = -1;
        rec->arrival_s = rec->start_s = i;
        rec->ttft_s = 0.1 * (i + 1);
        rec->e2el_s = rec->ttft_s + 0.03;
        rec->n_chunks = 4;
        rec->prompt_tokens = rec->target_prompt_len = 16;
        rec->output_tokens = rec->target_output_len = 4;
        rec->cached_tokens = -1;
        rec->http_status = 200;
        rec->ok = 1;
        rec->done_marker = 1;
    }
    out->res.n = 3;
    out->res.duration_s = 2.5;
    out->res.trace_count = -1;
    snprintf(out->res.model, sizeof(out->res.model), "fake-model");
    snprintf(out->base_url, sizeof(out->base_url), "fake://");
    out->extra = json_pack("{s:b}", "fake", 1);
    c->host = (struct exp_host){.host_busy = NAN,
                                .cluster_cpu_s = NAN,
                                .loadgen_cpu_s = NAN,
                                .wall_s = NAN,
                                .load1_start = NAN,
                                .load1_end = NAN};
    return 0;
}

static void fake_stop(void *r)
{
    struct fake *f = r;
    fake_note(f, "stop");
    f->running = 0;
}

static const struct exp_runner_ops fake_ops = {
    .name = "fake",
    .start = fake_start,
    .settle = fake_settle,
    .run = fake_run,
    .stop = fake_stop,
};

/* Two configurations (a, b) x rates 1 and 4, seed 5, settle 0.25. */
static struct exp_file *two_by_two(const char *restart)
{
    const char *src = getenv("TANDEM_SOURCE_DIR");
    char dir[1024], text[1024], err[EXP_ERR_MAX] = "";
    snprintf(dir, sizeof(dir), "%s/deploy/experiments", src ? src : ".");
    snprintf(text, sizeof(text),
             "name: m\n"
             "configs:\n"
             "- {label: a, cluster: ../clusters/tiny-1p1d.yaml}\n"
             "- {label: b, cluster: ../clusters/tiny-2p2d.yaml}\n"
             "rates: [4, 1]\n"
             "restart: %s\n"
             "settle: 0.25\n"
             "bench: {seed: 5, num-prompts: 3, goodput: [ttft:250]}\n",
             restart);
    struct exp_file *e = NULL;
    int rc = exp_parse(&e, text, strlen(text), "m.yaml", dir, err, sizeof(err));
    if (rc != 0) {
        printf("\n%s\n", err);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return e;
}

struct harness {
    struct exp_file *e;
    struct bench_options bo;
    char dir[64];
    const char *cluster_files[2];
    double time_scales[2];
    int configs[2];
    struct exp_cell cells[8], view[8]; /* 2 configurations x 2 rates x up to 2 seeds */
    struct exp_matrix m;
};

static void harness_init(struct harness *h, const char *restart)
{
    memset(h, 0, sizeof(*h));
    h->e = two_by_two(restart);
    char err[EXP_ERR_MAX];
    CU_ASSERT_EQUAL_FATAL(exp_bench_options(h->e, &h->bo, err, sizeof(err)), 0);
    snprintf(h->dir, sizeof(h->dir), "/tmp/test_exp_matrix.XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(h->dir));
    char sub[128];
    snprintf(sub, sizeof(sub), "%s/cells", h->dir);
    mkdir(sub, 0777);
    snprintf(sub, sizeof(sub), "%s/requests", h->dir);
    mkdir(sub, 0777);
    h->cluster_files[0] = "/derived/a.cluster.yaml";
    h->cluster_files[1] = "/derived/b.cluster.yaml";
    h->time_scales[0] = h->time_scales[1] = 1;
    h->configs[0] = 0;
    h->configs[1] = 1;
    h->m = (struct exp_matrix){
        .e = h->e,
        .bo = &h->bo,
        .configs = h->configs,
        .n_configs = 2,
        .cluster_files = h->cluster_files,
        .time_scales = h->time_scales,
        .out_dir = h->dir,
        .cells = h->cells,
        .view = h->view,
    };
}

static void harness_fini(struct harness *h)
{
    for (int i = 0; i < 8; i++) {
        exp_cell_fini(&h->cells[i]);
    }
    bench_options_fini(&h->bo);
    exp_free(h->e);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", h->dir);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

static void expect_log(const struct fake *f, const char *const *want)
{
    int n = 0;
    for (; want[n]; n++) {
        if (n >= f->n_log || strcmp(f->log[n], want[n]) != 0) {
            printf("\ncall %d: got '%s', want '%s'\n", n, n < f->n_log ? f->log[n] : "(none)",
                   want[n]);
            CU_FAIL("runner calls");
            return;
        }
    }
    CU_ASSERT_EQUAL(f->n_log, n);
}

static void test_per_config(void)
{
    struct harness h;
    harness_init(&h, "per-config");
    struct fake f = {.fail_config = -1};
    int interrupted = -1;
    CU_ASSERT_EQUAL(exp_matrix_run(&h.m, &fake_ops, &f, &interrupted), 0);
    CU_ASSERT_EQUAL(interrupted, 0);
    /* One start per configuration; rate i (sorted: 1, 4) with seed 5 + i. */
    static const char *const want[] = {
        "start a",     "settle 0.25",           "run 0/0 rate 1 seed 5",
        "settle 0.25", "run 0/1 rate 4 seed 6", "stop",
        "start b",     "settle 0.25",           "run 1/0 rate 1 seed 5",
        "settle 0.25", "run 1/1 rate 4 seed 6", "stop",
        NULL};
    expect_log(&f, want);
    for (int i = 0; i < 4; i++) {
        const struct exp_cell *c = &h.cells[i];
        CU_ASSERT(c->done && c->ok);
        CU_ASSERT_EQUAL(c->config, i / 2); /* configuration-major slots */
        CU_ASSERT_EQUAL(c->rate, i % 2);
        CU_ASSERT_EQUAL(c->seed, 5u + (unsigned)(i % 2));
        /* The summary, goodput and distributions come from the runner's
         * requests: 2 of 3 meet TTFT <= 250 ms over 2.5 s. */
        CU_ASSERT_EQUAL(c->s.completed, 3);
        CU_ASSERT_DOUBLE_EQUAL(c->s.request_goodput, 2 / 2.5, 1e-9);
        CU_ASSERT_DOUBLE_EQUAL(c->sent_rate, 3 / 2.0, 1e-9);
        CU_ASSERT_EQUAL(c->n_ttft, 3);
        CU_ASSERT_EQUAL(c->n_tpot, 3);
        if (c->n_ttft == 3 && c->n_tpot == 3) {
            CU_ASSERT_DOUBLE_EQUAL(c->ttft_ms[2], 300, 1e-9);
            CU_ASSERT_DOUBLE_EQUAL(c->tpot_ms[0], 10, 1e-9);
        }
        json_t *x = json_object_get(c->json, "experiment");
        CU_ASSERT(json_is_true(json_object_get(x, "fake"))); /* the runner's own key */
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(x, "seed")), 5 + i % 2);
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(x, "derived_cluster")),
                               h.cluster_files[i / 2]);
        CU_ASSERT(json_is_null(json_object_get(json_object_get(x, "host"), "busy")));
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(c->json, "model_id")),
                               "fake-model");
    }
    const char *files[] = {"cells/a-r1.json",
                           "cells/b-r4.json",
                           "requests/b-r1.csv",
                           "summary.md",
                           "results.csv",
                           "goodput.svg",
                           NULL};
    for (int i = 0; files[i]; i++) {
        char p[256];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", h.dir, files[i]);
        if (stat(p, &st) != 0 || st.st_size == 0) {
            printf("\nmissing: %s\n", p);
            CU_FAIL("report file");
        }
    }
    harness_fini(&h);
}

static void test_per_rate(void)
{
    struct harness h;
    harness_init(&h, "per-rate");
    struct fake f = {.fail_config = -1};
    int interrupted = -1;
    CU_ASSERT_EQUAL(exp_matrix_run(&h.m, &fake_ops, &f, &interrupted), 0);
    /* A fresh cluster per cell, named by its rate; the configurations take
     * turns at each rate; the same seed everywhere. */
    static const char *const want[] = {"start a-r1", "settle 0.25", "run 0/0 rate 1 seed 5", "stop",
                                       "start b-r1", "settle 0.25", "run 1/0 rate 1 seed 5", "stop",
                                       "start a-r4", "settle 0.25", "run 0/1 rate 4 seed 5", "stop",
                                       "start b-r4", "settle 0.25", "run 1/1 rate 4 seed 5", "stop",
                                       NULL};
    expect_log(&f, want);
    CU_ASSERT_EQUAL(h.cells[1].config, 0); /* slots stay configuration-major */
    CU_ASSERT_EQUAL(h.cells[1].rate, 1);
    CU_ASSERT_EQUAL(h.cells[1].seed, 5);
    harness_fini(&h);
}

static void test_start_fails(void)
{
    struct harness h;
    harness_init(&h, "per-config");
    struct fake f = {.fail_config = 0};
    int interrupted = -1;
    CU_ASSERT_EQUAL(exp_matrix_run(&h.m, &fake_ops, &f, &interrupted), 1);
    CU_ASSERT_EQUAL(interrupted, 0);
    /* No settle, run or stop for the configuration that did not start; its
     * cells are done, not ok, with the runner's note. */
    static const char *const want[] = {"start a",     "start b",
                                       "settle 0.25", "run 1/0 rate 1 seed 5",
                                       "settle 0.25", "run 1/1 rate 4 seed 6",
                                       "stop",        NULL};
    expect_log(&f, want);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT(h.cells[i].done && !h.cells[i].ok);
        CU_ASSERT_STRING_EQUAL(h.cells[i].error, "fake: a did not start");
        CU_ASSERT_PTR_NULL(h.cells[i].json);
    }
    CU_ASSERT(h.cells[2].ok && h.cells[3].ok);
    harness_fini(&h);
}

/* Two seeds per cell: run k with seed + 1000 k right after run 0, on the
 * same cluster (per-config), slots rate-major then seed; run 1's files
 * carry -s1. */
static void test_seeds(void)
{
    struct harness h;
    harness_init(&h, "per-config");
    h.m.n_seeds = 2;
    struct fake f = {.fail_config = -1};
    int interrupted = -1;
    CU_ASSERT_EQUAL(exp_matrix_run(&h.m, &fake_ops, &f, &interrupted), 0);
    static const char *const want[] = {"start a",
                                       "settle 0.25",
                                       "run 0/0 rate 1 seed 5",
                                       "settle 0.25",
                                       "run 0/0 rate 1 seed 1005",
                                       "settle 0.25",
                                       "run 0/1 rate 4 seed 6",
                                       "settle 0.25",
                                       "run 0/1 rate 4 seed 1006",
                                       "stop",
                                       "start b",
                                       "settle 0.25",
                                       "run 1/0 rate 1 seed 5",
                                       "settle 0.25",
                                       "run 1/0 rate 1 seed 1005",
                                       "settle 0.25",
                                       "run 1/1 rate 4 seed 6",
                                       "settle 0.25",
                                       "run 1/1 rate 4 seed 1006",
                                       "stop",
                                       NULL};
    expect_log(&f, want);
    for (int i = 0; i < 8; i++) {
        CU_ASSERT(h.cells[i].ok);
        CU_ASSERT_EQUAL(h.cells[i].config, i / 4);
        CU_ASSERT_EQUAL(h.cells[i].rate, (i / 2) % 2);
        CU_ASSERT_EQUAL(h.cells[i].seed_k, i % 2);
        CU_ASSERT_EQUAL(h.cells[i].n_reqs, 3);
        json_t *x = json_object_get(h.cells[i].json, "experiment");
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(x, "seed_index")), i % 2);
    }
    const char *files[] = {"cells/a-r1.json", "cells/a-r1-s1.json", "requests/b-r4-s1.csv",
                           "stats.csv", NULL};
    for (int i = 0; files[i]; i++) {
        char p[256];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", h.dir, files[i]);
        if (stat(p, &st) != 0 || st.st_size == 0) {
            printf("\nmissing: %s\n", p);
            CU_FAIL("report file");
        }
    }
    harness_fini(&h);
    /* per-rate: a fresh cluster per run, named by rate and seed. */
    harness_init(&h, "per-rate");
    h.m.n_seeds = 2;
    struct fake g = {.fail_config = -1};
    CU_ASSERT_EQUAL(exp_matrix_run(&h.m, &fake_ops, &g, &interrupted), 0);
    CU_ASSERT_STRING_EQUAL(g.log[4], "start b-r1");
    CU_ASSERT_STRING_EQUAL(g.log[8], "start a-r1-s1");
    CU_ASSERT_STRING_EQUAL(g.log[10], "run 0/0 rate 1 seed 1005");
    harness_fini(&h);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("exp_matrix", NULL, NULL);
    CU_add_test(s, "per_config", test_per_config);
    CU_add_test(s, "per_rate", test_per_rate);
    CU_add_test(s, "start_fails", test_start_fails);
    CU_add_test(s, "seeds", test_seeds);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
