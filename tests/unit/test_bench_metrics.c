/* tandem bench: the summary (loadgen/summary.c) on synthetic timelines with
 * hand-computed values, numpy's percentile rule, goodput with several SLOs,
 * attainment, the flag parsers, the vLLM-layout table, the JSON keys and the
 * per-request files (loadgen/report.c). Times are binary fractions of a
 * second so the expected values are exact. */
#include <CUnit/Basic.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loadgen/metric.h"
#include "loadgen/progress.h"
#include "loadgen/report.h"
#include "loadgen/summary.h"
#include "tandem_err.h"

#define EXPECT_NEAR(got, want)                                                                     \
    do {                                                                                           \
        double g_ = (got), w_ = (want);                                                            \
        int ok_ = fabs(g_ - w_) <= 1e-9 * fmax(1.0, fabs(w_));                                     \
        if (!ok_)                                                                                  \
            fprintf(stderr, "\n%s:%d: %s == %.17g, want %.17g\n", __FILE__, __LINE__, #got, g_,    \
                    w_);                                                                           \
        CU_ASSERT(ok_);                                                                            \
    } while (0)

#define EXPECT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            fprintf(stderr, "\n%s:%d: %s == %lld, want %lld\n", __FILE__, __LINE__, #a, a_, b_);   \
        CU_ASSERT(a_ == b_);                                                                       \
    } while (0)

/* ---- numpy's percentile ---- */

static void test_percentile(void)
{
    const double a[] = {1, 2, 3, 4};
    /* virtual index (n-1) p/100 and lerp from the nearer end. */
    EXPECT_NEAR(lg_percentile(a, 4, 0), 1);
    EXPECT_NEAR(lg_percentile(a, 4, 100), 4);
    EXPECT_NEAR(lg_percentile(a, 4, 50), 2.5);  /* vi 1.5 */
    EXPECT_NEAR(lg_percentile(a, 4, 25), 1.75); /* vi 0.75: 2 - 1 x 0.25 */
    const double b[] = {0, 10, 30};
    EXPECT_NEAR(lg_percentile(b, 3, 75), 20); /* vi 1.5: 30 - 20 x 0.5 */
    EXPECT_NEAR(lg_percentile(b, 3, 10), 2);  /* vi 0.2: 0 + 10 x 0.2 */
    const double c[] = {10, 20, 30, 40, 50};
    EXPECT_NEAR(lg_percentile(c, 5, 37.5), 25); /* vi 1.5 */
    EXPECT_NEAR(lg_percentile(c, 5, 90), 46);   /* vi 3.6: 50 - 10 x 0.4 */
    double d[10];
    for (int i = 0; i < 10; i++) {
        d[i] = i;
    }
    EXPECT_NEAR(lg_percentile(d, 10, 99), 8.91); /* vi 8.91 */
    const double one[] = {7};
    EXPECT_NEAR(lg_percentile(one, 1, 99), 7);
    EXPECT_NEAR(lg_percentile(NULL, 0, 50), 0); /* vLLM's `or 0` */
}

/* ---- the metric table: each writer's ranks distinct, every row complete ---- */

static void test_metric_table(void)
{
    for (int out = 0; out < LG_OUT_COUNT; out++) {
        for (size_t i = 0; i < lg_n_metrics; i++) {
            const struct lg_metric *m = &lg_metrics[i];
            int r = m->at[out].rank;
            if (r == 0) {
                continue;
            }
            if (lg_metric_at((enum lg_out)out, r) != m) {
                fprintf(stderr, "\nwriter %d rank %d: %s shares it\n", out, r, m->key);
            }
            CU_ASSERT_PTR_EQUAL(lg_metric_at((enum lg_out)out, r), m);
            CU_ASSERT(out == LG_OUT_JSON || m->at[out].name != NULL);
            CU_ASSERT(out != LG_OUT_TEXT || r != LG_TEXT_RANK_RUN);
        }
    }
    /* results.csv shows exp_report.c's cell column at these ranks, not a row. */
    for (int k = 0; k < LG_CSV_CELL_COUNT; k++) {
        CU_ASSERT(lg_csv_cell_rank[k] > 0);
        const struct lg_metric *m = lg_metric_at(LG_OUT_CSV, lg_csv_cell_rank[k]);
        if (m != NULL) {
            fprintf(stderr, "\nCSV rank %d: %s takes a cell column's rank\n", lg_csv_cell_rank[k],
                    m->key);
        }
        CU_ASSERT_PTR_NULL(m);
        for (int j = 0; j < k; j++) {
            CU_ASSERT(lg_csv_cell_rank[j] != lg_csv_cell_rank[k]);
        }
    }
    for (size_t i = 0; i < lg_n_metrics; i++) {
        const struct lg_metric *m = &lg_metrics[i];
        CU_ASSERT_PTR_EQUAL(lg_metric_find(m->key), m);
        if (m->kind == LG_KIND_DIST) {
            CU_ASSERT(m->dist != NULL && m->mask != 0 && m->title != NULL);
        } else {
            CU_ASSERT(m->get != NULL);
        }
    }
    EXPECT_EQ(lg_metric_last(LG_OUT_TEXT), 20);
    EXPECT_EQ(lg_metric_last(LG_OUT_JSON), 22);
    struct lg_summary s = {.n_percentiles = 2, .percentiles = {50, 99}};
    s.ttft.mean = 3;
    s.ttft.pct[1] = 7;
    EXPECT_NEAR(lg_dist_stat(&s, &s.ttft, LG_STAT_MEAN), 3);
    EXPECT_NEAR(lg_dist_stat(&s, &s.ttft, 99), 7);
    CU_ASSERT(isnan(lg_dist_stat(&s, &s.ttft, 90))); /* not computed */
}

/* ---- TPOT: the one formula (lg_tpot_s) and its one-token edge case ---- */

static void test_tpot(void)
{
    struct lg_record r = {.ok = 1, .ttft_s = 0.25, .e2el_s = 1.0, .output_tokens = 4};
    EXPECT_NEAR(lg_tpot_s(&r), 0.25); /* (1 - 0.25) / 3 */
    EXPECT_EQ(lg_has_tpot(&r), 1);
    r.output_tokens = 2;
    EXPECT_NEAR(lg_tpot_s(&r), 0.75);
    r.output_tokens = 1; /* no gap after the first token: TPOT 0, not in the distribution */
    EXPECT_NEAR(lg_tpot_s(&r), 0);
    EXPECT_EQ(lg_has_tpot(&r), 0);
    r.output_tokens = 0;
    EXPECT_NEAR(lg_tpot_s(&r), 0);
    EXPECT_EQ(lg_has_tpot(&r), 0);
    r.output_tokens = 4;
    r.ok = 0; /* a failed request has none */
    EXPECT_EQ(lg_has_tpot(&r), 0);
}

static void test_dist(void)
{
    /* Unsorted in, population std: mean 5, std 2. */
    double v[] = {9, 2, 4, 4, 5, 4, 7, 5};
    const double p[] = {50, 90};
    struct lg_dist d;
    lg_dist_compute(v, 8, p, 2, 1.0, &d);
    EXPECT_EQ(d.n, 8);
    EXPECT_NEAR(d.mean, 5);
    EXPECT_NEAR(d.std, 2);
    EXPECT_NEAR(d.median, 4.5); /* (4 + 5) / 2 */
    EXPECT_NEAR(d.pct[0], 4.5);
    EXPECT_NEAR(d.pct[1], 7.6); /* sorted 2 4 4 4 5 5 7 9; vi 6.3: 7 + 2 x 0.3 */
    double odd[] = {3, 1, 2};
    lg_dist_compute(odd, 3, p, 1, 1000.0, &d);
    EXPECT_NEAR(d.median, 2000);
    EXPECT_NEAR(d.mean, 2000);
    lg_dist_compute(NULL, 0, p, 2, 1000.0, &d);
    EXPECT_EQ(d.n, 0);
    EXPECT_NEAR(d.mean, 0);
    EXPECT_NEAR(d.pct[1], 0);
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Large inputs take the radix sort: the same order as qsort, so the same
 * median, percentiles and (order-dependent) sum to the bit; with negatives,
 * zeros of both signs, duplicates and a wide range of exponents. */
static void test_dist_large(void)
{
    enum { N = 200003 };
    double *v = malloc(N * sizeof(*v)), *ref = malloc(N * sizeof(*ref));
    CU_ASSERT_PTR_NOT_NULL_FATAL(v);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < N; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        switch (x % 8) {
        case 0:
            v[i] = (x >> 40) % 2 ? 0.0 : -0.0;
            break;
        case 1:
            v[i] = 0.0183; /* a step time, many times over */
            break;
        default:
            v[i] = ldexp((double)(x >> 11) / 9007199254740992.0, (int)((x >> 3) % 40) - 20) *
                   ((x >> 60) % 3 == 0 ? -1 : 1);
        }
        ref[i] = v[i];
    }
    qsort(ref, N, sizeof(*ref), cmp_dbl);
    const double p[] = {1, 50, 99, 99.9};
    struct lg_dist d;
    lg_dist_compute(v, N, p, 4, 1.0, &d);
    int sorted = 1;
    for (int i = 0; i < N; i++) {
        sorted &= v[i] == ref[i]; /* -0 == +0 */
    }
    CU_ASSERT(sorted);
    double sum = 0;
    for (int i = 0; i < N; i++) {
        sum += ref[i];
    }
    CU_ASSERT_EQUAL(d.mean, sum / N);
    CU_ASSERT_EQUAL(d.median, ref[N / 2]);
    for (int k = 0; k < 4; k++) {
        CU_ASSERT_EQUAL(d.pct[k], lg_percentile(ref, N, p[k]));
    }
    free(v);
    free(ref);
}

/* ---- a synthetic run ----
 *
 * r0: sent at 0, first token at 0.125, gaps 0.0625 0.125 0.0625 0.25,
 *     5 output tokens (usage), prompt 128 of which 64 cached.
 *     TTFT 125 ms, E2EL 625 ms, TPOT (625 - 125) / 4 = 125 ms.
 * r1: sent at 0.5 (arrived 0.25), first token +0.25, one gap 0.25, 2 tokens,
 *     prompt 100, no cached count. TTFT 250, E2EL 500, TPOT 250.
 * r2: sent at 1.0, one token at +0.0625, prompt 32, 0 cached. TTFT 62.5,
 *     E2EL 62.5, no TPOT (and TPOT 0 for goodput).
 * r3: timed out. r4: HTTP 503. */
static double gaps0[] = {0.0625, 0.125, 0.0625, 0.25};
static double gaps1[] = {0.25};

static void make_run(struct lg_record *r)
{
    memset(r, 0, 5 * sizeof(*r));
    for (int i = 0; i < 5; i++) {
        r[i].index = i;
        r[i].session = -1;
        r[i].cached_tokens = -1;
    }
    r[0] = (struct lg_record){.index = 0,
                              .session = -1,
                              .arrival_s = 0,
                              .start_s = 0,
                              .ttft_s = 0.125,
                              .e2el_s = 0.625,
                              .itl_s = gaps0,
                              .n_itl = 4,
                              .n_chunks = 5,
                              .prompt_tokens = 128,
                              .output_tokens = 5,
                              .cached_tokens = 64,
                              .http_status = 200,
                              .ok = 1};
    r[1] = (struct lg_record){.index = 1,
                              .session = -1,
                              .arrival_s = 0.25,
                              .start_s = 0.5,
                              .ttft_s = 0.25,
                              .e2el_s = 0.5,
                              .itl_s = gaps1,
                              .n_itl = 1,
                              .n_chunks = 2,
                              .prompt_tokens = 100,
                              .output_tokens = 2,
                              .cached_tokens = -1,
                              .http_status = 200,
                              .ok = 1};
    r[2] = (struct lg_record){.index = 2,
                              .session = -1,
                              .arrival_s = 1.0,
                              .start_s = 1.0,
                              .ttft_s = 0.0625,
                              .e2el_s = 0.0625,
                              .n_chunks = 1,
                              .prompt_tokens = 32,
                              .output_tokens = 1,
                              .cached_tokens = 0,
                              .http_status = 200,
                              .ok = 1};
    r[3].reason = LG_FAIL_TIMEOUT;
    r[3].error = "request timed out";
    r[4].reason = LG_FAIL_HTTP;
    r[4].http_status = 503;
    r[4].error = "HTTP 503: overloaded";
}

static void opts_init(struct lg_summary_opts *o)
{
    memset(o, 0, sizeof(*o));
    CU_ASSERT_EQUAL(lg_parse_percentiles("50,90,99", o), 0);
    lg_slo_clear(&o->slo);
}

static void test_summary(void)
{
    struct lg_record r[5];
    make_run(r);
    struct lg_summary_opts o;
    opts_init(&o);
    struct lg_summary s;
    CU_ASSERT_EQUAL_FATAL(lg_summary_compute(r, 5, 2.0, &o, &s), 0);
    EXPECT_EQ(s.completed, 3);
    EXPECT_EQ(s.failed, 2);
    EXPECT_EQ(s.total_input, 128 + 100 + 32);
    EXPECT_EQ(s.total_output, 5 + 2 + 1);
    EXPECT_NEAR(s.duration_s, 2.0);
    EXPECT_NEAR(s.request_throughput, 1.5);
    EXPECT_NEAR(s.output_throughput, 4.0);
    EXPECT_NEAR(s.total_token_throughput, 134.0);
    /* TTFT {62.5, 125, 250} */
    EXPECT_EQ(s.ttft.n, 3);
    EXPECT_NEAR(s.ttft.mean, 437.5 / 3);
    EXPECT_NEAR(s.ttft.median, 125);
    EXPECT_NEAR(s.ttft.pct[0], 125);
    EXPECT_NEAR(s.ttft.pct[1], 225);   /* vi 1.8: 250 - 125 x 0.2 */
    EXPECT_NEAR(s.ttft.pct[2], 247.5); /* vi 1.98: 250 - 125 x 0.02 */
    /* TPOT excludes the 1-token request: {125, 250} */
    EXPECT_EQ(s.tpot.n, 2);
    EXPECT_NEAR(s.tpot.mean, 187.5);
    EXPECT_NEAR(s.tpot.median, 187.5);
    EXPECT_NEAR(s.tpot.std, 62.5);
    /* ITL pooled over requests: {62.5, 125, 62.5, 250} + {250} */
    EXPECT_EQ(s.itl.n, 5);
    EXPECT_NEAR(s.itl.mean, 150);
    EXPECT_NEAR(s.itl.median, 125);
    EXPECT_NEAR(s.itl.std, sqrt(7187.5));
    EXPECT_NEAR(s.itl.pct[1], 250); /* vi 3.6 between 250 and 250 */
    /* E2EL {62.5, 500, 625} */
    EXPECT_NEAR(s.e2el.mean, 1187.5 / 3);
    EXPECT_NEAR(s.e2el.median, 500);
    /* Client queue: {0, 250, 0} */
    EXPECT_NEAR(s.queue.mean, 250.0 / 3);
    /* No SLOs: no goodput, attainment undefined. */
    CU_ASSERT_FALSE(s.has_goodput);
    CU_ASSERT(isnan(s.request_goodput));
    CU_ASSERT(isnan(s.slo_attainment));
    /* Cached: (64 + 0) / (128 + 32); r1 did not report. */
    EXPECT_EQ(s.requests_with_cached, 2);
    EXPECT_EQ(s.cached_tokens, 64);
    EXPECT_NEAR(s.cached_token_ratio, 0.4);
    /* Peaks: r0 [0, 0.625) and r1 [0.5, 1.0) overlap; r2 starts as r1 ends.
     * Tokens in second 0: r0's five, r1's first (0.75); second 1: r1's second
     * (1.0), r2's (1.0625). */
    EXPECT_EQ(s.max_concurrent_requests, 2);
    EXPECT_NEAR(s.max_output_tokens_per_s, 6);
    /* Failures by reason. */
    EXPECT_EQ(s.n_failure_kinds, 2);
    CU_ASSERT_STRING_EQUAL(s.failures[0].key, "timeout");
    EXPECT_EQ(s.failures[0].count, 1);
    CU_ASSERT_STRING_EQUAL(s.failures[0].example, "request timed out");
    CU_ASSERT_STRING_EQUAL(s.failures[1].key, "http_503");
    EXPECT_EQ(s.failures[1].count, 1);
}

static void test_goodput(void)
{
    struct lg_record r[5];
    make_run(r);
    struct lg_summary_opts o;
    opts_init(&o);
    struct lg_summary s;

    /* TTFT <= 200 and TPOT <= 200: r0 (125, 125) and r2 (62.5, TPOT 0) are
     * good; r1 misses TTFT (250). */
    CU_ASSERT_EQUAL(lg_parse_goodput("ttft:200 tpot:200", &o.slo), 0);
    CU_ASSERT_EQUAL_FATAL(lg_summary_compute(r, 5, 2.0, &o, &s), 0);
    CU_ASSERT_TRUE(s.has_goodput);
    EXPECT_EQ(s.good, 2);
    EXPECT_NEAR(s.request_goodput, 1.0);
    EXPECT_NEAR(s.slo_attainment, 0.4); /* failed requests are misses */
    EXPECT_NEAR(s.ttft_attainment, 0.4);
    EXPECT_NEAR(s.tpot_attainment, 0.4);
    CU_ASSERT(isnan(s.e2el_attainment));

    /* Adding E2EL <= 600 drops r0 (625): only r2 meets every SLO. */
    CU_ASSERT_EQUAL(lg_parse_goodput("e2el:600", &o.slo), 0);
    CU_ASSERT_EQUAL_FATAL(lg_summary_compute(r, 5, 2.0, &o, &s), 0);
    EXPECT_EQ(s.good, 1);
    EXPECT_NEAR(s.request_goodput, 0.5);
    EXPECT_NEAR(s.slo_attainment, 0.2);
    EXPECT_NEAR(s.e2el_attainment, 0.4); /* r1 (500) and r2 */

    /* An SLO equal to the value holds (vLLM: slo >= value). */
    lg_slo_clear(&o.slo);
    CU_ASSERT_EQUAL(lg_parse_goodput("ttft:125", &o.slo), 0);
    CU_ASSERT_EQUAL_FATAL(lg_summary_compute(r, 5, 2.0, &o, &s), 0);
    EXPECT_EQ(s.good, 2); /* r0 (125) and r2 */

    /* TPOT only: r2's single token counts as TPOT 0. */
    lg_slo_clear(&o.slo);
    CU_ASSERT_EQUAL(lg_parse_goodput("tpot:100", &o.slo), 0);
    CU_ASSERT_EQUAL_FATAL(lg_summary_compute(r, 5, 2.0, &o, &s), 0);
    EXPECT_EQ(s.good, 1);
}

static void test_empty(void)
{
    struct lg_summary_opts o;
    opts_init(&o);
    struct lg_summary s;
    CU_ASSERT_EQUAL(lg_summary_compute(NULL, 0, 0, &o, &s), 0);
    EXPECT_EQ(s.completed, 0);
    EXPECT_NEAR(s.ttft.mean, 0);
    CU_ASSERT(isnan(s.cached_token_ratio));
    EXPECT_EQ(s.max_concurrent_requests, 0);
    o.n_percentiles = LG_MAX_PERCENTILES + 1;
    CU_ASSERT_EQUAL(lg_summary_compute(NULL, 0, 1, &o, &s), TANDEM_EINVAL);
}

static void test_parsers(void)
{
    struct lg_summary_opts o;
    memset(&o, 0, sizeof(o));
    CU_ASSERT_EQUAL(lg_parse_percentiles("99", &o), 0);
    EXPECT_EQ(o.n_percentiles, 1);
    CU_ASSERT_EQUAL(lg_parse_percentiles("25,50,99.9", &o), 0);
    EXPECT_EQ(o.n_percentiles, 3);
    EXPECT_NEAR(o.percentiles[2], 99.9);
    CU_ASSERT_EQUAL(lg_parse_percentiles("", &o), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_parse_percentiles("101", &o), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_parse_percentiles("50,,90", &o), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_parse_percentiles("50x", &o), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_parse_percentiles("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", &o),
                    TANDEM_EINVAL);

    struct lg_slo slo;
    lg_slo_clear(&slo);
    CU_ASSERT_EQUAL(lg_parse_goodput("ttft:500,tpot:50", &slo), 0);
    EXPECT_NEAR(slo.ttft_ms, 500);
    EXPECT_NEAR(slo.tpot_ms, 50);
    CU_ASSERT(slo.e2el_ms < 0);
    CU_ASSERT_EQUAL(lg_parse_goodput(",e2el:1.5 ", &slo), 0);
    EXPECT_NEAR(slo.e2el_ms, 1.5);
    CU_ASSERT_EQUAL(lg_parse_goodput("foo:1", &slo), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_parse_goodput("ttft", &slo), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_parse_goodput("ttft:-1", &slo), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_parse_goodput("ttft:abc", &slo), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_parse_goodput("", &slo), TANDEM_EINVAL);

    unsigned m = 0;
    CU_ASSERT_EQUAL(lg_parse_metrics("ttft,e2el", &m), 0);
    EXPECT_EQ(m, LG_METRIC_TTFT | LG_METRIC_E2EL);
    CU_ASSERT_EQUAL(lg_parse_metrics("ttft,tpot,itl,e2el,client_queue_time", &m), 0);
    EXPECT_EQ(m, 31);
    CU_ASSERT_EQUAL(lg_parse_metrics("ttft,foo", &m), TANDEM_EINVAL);

    char w[32];
    lg_percentile_word(99, w, sizeof(w));
    CU_ASSERT_STRING_EQUAL(w, "99");
    lg_percentile_word(99.9, w, sizeof(w));
    CU_ASSERT_STRING_EQUAL(w, "99.9");
    lg_percentile_word(12.5, w, sizeof(w));
    CU_ASSERT_STRING_EQUAL(w, "12.5");
}

/* ---- report ---- */

static struct lg_report_info info_for_test(void)
{
    struct lg_report_info info = {
        .backend = "openai",
        .model = "tiny",
        .dataset = "random",
        .base_url = "http://127.0.0.1:8000",
        .endpoint = "/v1/completions",
        .num_prompts = 5,
        .request_rate = 4,
        .burstiness = 1,
        .max_concurrency = 8,
        .seed = 7,
        .metrics = LG_METRIC_TTFT | LG_METRIC_TPOT | LG_METRIC_ITL | LG_METRIC_E2EL,
    };
    return info;
}

/* Reads a whole stream written by f into a malloc'd string. */
static char *slurp(FILE *f)
{
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    CU_ASSERT_EQUAL(fread(s, 1, (size_t)n, f), (size_t)n);
    return s;
}

static void expect_line(const char *text, const char *line)
{
    int found = 0;
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == strlen(line) && memcmp(p, line, len) == 0) {
            found = 1;
            break;
        }
        p = e ? e + 1 : NULL;
    }
    if (!found) {
        fprintf(stderr, "\nline not found: [%s]\n", line);
    }
    CU_ASSERT(found);
}

static void test_table(void)
{
    struct lg_record r[5];
    make_run(r);
    struct lg_summary_opts o;
    opts_init(&o);
    CU_ASSERT_EQUAL(lg_parse_goodput("ttft:200 tpot:200", &o.slo), 0);
    struct lg_summary s;
    CU_ASSERT_EQUAL_FATAL(lg_summary_compute(r, 5, 2.0, &o, &s), 0);
    struct lg_report_info info = info_for_test();
    FILE *f = tmpfile();
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    lg_report_print(f, &s, &info);
    char *t = slurp(f);
    fclose(f);
    /* vLLM's "{:<40} {:<10}" layout, trailing spaces included. */
    expect_line(t, "============ Serving Benchmark Result ============");
    expect_line(t, "Successful requests:                     3         ");
    expect_line(t, "Failed requests:                         2         ");
    expect_line(t, "Maximum request concurrency:             8         ");
    expect_line(t, "Request rate configured (RPS):           4.00      ");
    expect_line(t, "Benchmark duration (s):                  2.00      ");
    expect_line(t, "Total input tokens:                      260       ");
    expect_line(t, "Total generated tokens:                  8         ");
    expect_line(t, "Request throughput (req/s):              1.50      ");
    expect_line(t, "Request goodput (req/s):                 1.00      ");
    expect_line(t, "Output token throughput (tok/s):         4.00      ");
    expect_line(t, "Peak output token throughput (tok/s):    6.00      ");
    expect_line(t, "Peak concurrent requests:                2.00      ");
    expect_line(t, "Total Token throughput (tok/s):          134.00    ");
    expect_line(t, "---------------Time to First Token----------------");
    expect_line(t, "Mean TTFT (ms):                          145.83    ");
    expect_line(t, "Median TTFT (ms):                        125.00    ");
    expect_line(t, "P90 TTFT (ms):                           225.00    ");
    expect_line(t, "-----Time per Output Token (excl. 1st token)------");
    expect_line(t, "Mean TPOT (ms):                          187.50    ");
    expect_line(t, "---------------Inter-token Latency----------------");
    expect_line(t, "Mean ITL (ms):                           150.00    ");
    expect_line(t, "----------------End-to-end Latency----------------");
    expect_line(t, "Median E2EL (ms):                        500.00    ");
    expect_line(t, "All SLOs met (%):                        40.00     ");
    expect_line(t, "Cached token ratio (%):                  40.00     ");
    expect_line(t, "Failed (http_503):                       1         ");
    expect_line(t, "==================================================");
    free(t);
}

static void expect_real(const json_t *o, const char *key, double want)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) {
        fprintf(stderr, "\nJSON key %s missing or not a number\n", key);
        CU_FAIL("missing key");
        return;
    }
    EXPECT_NEAR(json_number_value(v), want);
}

static void test_json(void)
{
    struct lg_record r[5];
    make_run(r);
    struct lg_summary_opts o;
    opts_init(&o);
    CU_ASSERT_EQUAL(lg_parse_percentiles("50,90,99,99.9", &o), 0);
    CU_ASSERT_EQUAL(lg_parse_goodput("ttft:200 tpot:200", &o.slo), 0);
    struct lg_summary s;
    CU_ASSERT_EQUAL_FATAL(lg_summary_compute(r, 5, 2.0, &o, &s), 0);
    struct lg_report_info info = info_for_test();
    json_t *j = lg_report_json(&s, &info);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    /* vLLM's keys */
    expect_real(j, "completed", 3);
    expect_real(j, "failed", 2);
    expect_real(j, "duration", 2.0);
    expect_real(j, "total_input_tokens", 260);
    expect_real(j, "total_output_tokens", 8);
    expect_real(j, "request_throughput", 1.5);
    expect_real(j, "request_goodput", 1.0);
    expect_real(j, "output_throughput", 4.0);
    expect_real(j, "total_token_throughput", 134.0);
    expect_real(j, "max_concurrent_requests", 2);
    expect_real(j, "max_output_tokens_per_s", 6);
    expect_real(j, "mean_ttft_ms", 437.5 / 3);
    expect_real(j, "median_ttft_ms", 125);
    expect_real(j, "p50_ttft_ms", 125);
    expect_real(j, "p90_ttft_ms", 225);
    expect_real(j, "p99_ttft_ms", 247.5);
    CU_ASSERT_PTR_NOT_NULL(json_object_get(j, "p99.9_ttft_ms"));
    CU_ASSERT_PTR_NOT_NULL(json_object_get(j, "std_ttft_ms"));
    expect_real(j, "mean_tpot_ms", 187.5);
    expect_real(j, "std_tpot_ms", 62.5);
    expect_real(j, "mean_itl_ms", 150);
    expect_real(j, "median_itl_ms", 125);
    expect_real(j, "median_e2el_ms", 500);
    CU_ASSERT_PTR_NOT_NULL(json_object_get(j, "p99_e2el_ms"));
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "backend")), "openai");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "model_id")), "tiny");
    expect_real(j, "request_rate", 4);
    CU_ASSERT(json_is_integer(json_object_get(j, "max_concurrency")));
    /* ours */
    expect_real(j, "cached_token_ratio", 0.4);
    expect_real(j, "slo_attainment", 0.4);
    expect_real(j, "good_requests", 2);
    const json_t *f = json_object_get(j, "failures");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(f, "timeout")), 1);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(f, "http_503")), 1);
    CU_ASSERT_STRING_EQUAL(
        json_string_value(json_object_get(json_object_get(j, "failure_examples"), "http_503")),
        "HTTP 503: overloaded");
    expect_real(json_object_get(j, "slo"), "ttft_ms", 200);
    CU_ASSERT(json_is_null(json_object_get(json_object_get(j, "slo"), "e2el_ms")));
    CU_ASSERT(
        json_is_null(json_object_get(json_object_get(j, "slo_attainment_by_metric"), "e2el")));
    json_decref(j);

    /* Infinite rate and no SLOs: "inf" and nulls, as vLLM writes them. */
    lg_slo_clear(&o.slo);
    CU_ASSERT_EQUAL_FATAL(lg_summary_compute(r, 5, 2.0, &o, &s), 0);
    info.request_rate = INFINITY;
    info.max_concurrency = 0;
    j = lg_report_json(&s, &info);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "request_rate")), "inf");
    CU_ASSERT(json_is_null(json_object_get(j, "request_goodput")));
    CU_ASSERT(json_is_null(json_object_get(j, "max_concurrency")));
    CU_ASSERT(json_is_null(json_object_get(j, "slo_attainment")));
    json_decref(j);

    /* Through a file. */
    char path[] = "/tmp/test_bench_metrics_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    char err[256];
    CU_ASSERT_EQUAL(lg_report_write_json(path, &s, &info, err, sizeof(err)), 0);
    json_error_t jerr;
    j = json_load_file(path, 0, &jerr);
    CU_ASSERT_PTR_NOT_NULL(j);
    expect_real(j, "completed", 3);
    json_decref(j);
    unlink(path);
    CU_ASSERT_EQUAL(lg_report_write_json("/nonexistent-dir/x.json", &s, &info, err, sizeof(err)),
                    TANDEM_EIO);
}

static void test_save_requests(void)
{
    struct lg_record r[5];
    make_run(r);
    char err[256];
    enum lg_requests_format fmt;
    CU_ASSERT_EQUAL(lg_requests_format("a.csv", &fmt), 0);
    CU_ASSERT_EQUAL(fmt, LG_REQUESTS_CSV);
    CU_ASSERT_EQUAL(lg_requests_format("a.JSONL", &fmt), 0);
    CU_ASSERT_EQUAL(fmt, LG_REQUESTS_JSONL);
    CU_ASSERT_EQUAL(lg_requests_format("a.json", &fmt), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(lg_report_save_requests("/tmp/x.txt", r, 5, err, sizeof(err)), TANDEM_EINVAL);

    char csv[] = "/tmp/test_bench_reqs_XXXXXX.csv";
    int fd = mkstemps(csv, 4);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    CU_ASSERT_EQUAL_FATAL(lg_report_save_requests(csv, r, 5, err, sizeof(err)), 0);
    FILE *f = fopen(csv, "r");
    char line[1024];
    CU_ASSERT_PTR_NOT_NULL_FATAL(fgets(line, sizeof(line), f));
    CU_ASSERT_EQUAL(strncmp(line, "index,session,turn,arrival_s,start_s,queue_ms,ttft_ms", 52), 0);
    CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof(line), f));
    /* r0: 4 gaps, mean (62.5+125+62.5+250)/4 = 125, max 250 */
    CU_ASSERT_STRING_EQUAL(line, "0,-1,0,0.000000,0.000000,0.000000,125.000000,625.000000,"
                                 "125.000000,128,5,64,0,0,5,4,125.000000,250.000000,200,1,,\n");
    int lines = 2;
    while (fgets(line, sizeof(line), f) != NULL) {
        lines++;
        if (lines == 6) {
            CU_ASSERT_STRING_EQUAL(line, "4,-1,0,0.000000,0.000000,0.000000,,,,0,0,,0,0,0,0,,,"
                                         "503,0,http,\"HTTP 503: overloaded\"\n");
        }
    }
    CU_ASSERT_EQUAL(lines, 6);
    fclose(f);
    unlink(csv);

    char jl[] = "/tmp/test_bench_reqs_XXXXXX.jsonl";
    fd = mkstemps(jl, 6);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    CU_ASSERT_EQUAL_FATAL(lg_report_save_requests(jl, r, 5, err, sizeof(err)), 0);
    f = fopen(jl, "r");
    int n = 0;
    char big[4096];
    while (fgets(big, sizeof(big), f) != NULL) {
        json_t *o = json_loads(big, 0, NULL);
        CU_ASSERT_PTR_NOT_NULL_FATAL(o);
        if (n == 0) {
            const json_t *itl = json_object_get(o, "itl_ms");
            CU_ASSERT_EQUAL(json_array_size(itl), 4);
            EXPECT_NEAR(json_real_value(json_array_get(itl, 3)), 250);
            EXPECT_NEAR(json_number_value(json_object_get(o, "ttft_ms")), 125);
            EXPECT_NEAR(json_number_value(json_object_get(o, "tpot_ms")), 125);
            CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "cached_tokens")), 64);
            CU_ASSERT(json_is_true(json_object_get(o, "ok")));
        }
        if (n == 2) {
            CU_ASSERT(json_is_null(json_object_get(o, "tpot_ms"))); /* one token */
        }
        if (n == 3) {
            CU_ASSERT(json_is_false(json_object_get(o, "ok")));
            CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(o, "reason")), "timeout");
            CU_ASSERT(json_is_null(json_object_get(o, "ttft_ms")));
        }
        json_decref(o);
        n++;
    }
    CU_ASSERT_EQUAL(n, 5);
    fclose(f);
    unlink(jl);
}

static void test_progress(void)
{
    char line[256];
    struct lg_progress p = {.phase = "run",
                            .done = 120,
                            .failed = 2,
                            .total = 1000,
                            .in_flight = 64,
                            .elapsed_s = 12.0};
    size_t n = lg_progress_format(&p, line, sizeof(line));
    CU_ASSERT_STRING_EQUAL(
        line, "[bench] run: 120/1000 done (2 failed), 64 in flight, 12.0 s, 10.0 req/s");
    CU_ASSERT_EQUAL(n, strlen(line));
    p.total = -1;
    p.duration_s = 60;
    lg_progress_format(&p, line, sizeof(line));
    CU_ASSERT_STRING_EQUAL(line,
                           "[bench] run: 120 done (2 failed), 64 in flight, 12.0/60 s, 10.0 req/s");
    n = lg_progress_format(&p, line, 10); /* truncated, still terminated */
    CU_ASSERT_EQUAL(n, 9);
    CU_ASSERT_STRING_EQUAL(line, "[bench] r");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench_metrics", NULL, NULL);
    CU_add_test(s, "percentile", test_percentile);
    CU_add_test(s, "metric_table", test_metric_table);
    CU_add_test(s, "tpot", test_tpot);
    CU_add_test(s, "dist", test_dist);
    CU_add_test(s, "dist_large", test_dist_large);
    CU_add_test(s, "summary", test_summary);
    CU_add_test(s, "goodput", test_goodput);
    CU_add_test(s, "empty", test_empty);
    CU_add_test(s, "parsers", test_parsers);
    CU_add_test(s, "table", test_table);
    CU_add_test(s, "json", test_json);
    CU_add_test(s, "save_requests", test_save_requests);
    CU_add_test(s, "progress", test_progress);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
