/* The bench metric table (metric.h). */
#include "metric.h"

#include <math.h>
#include <string.h>

#include "report.h"

#define GET(field)                                                                                 \
    static double get_##field(const struct lg_summary *s)                                          \
    {                                                                                              \
        return (double)s->field;                                                                   \
    }
GET(duration_s)
GET(completed)
GET(failed)
GET(total_input)
GET(total_output)
GET(request_throughput)
GET(output_throughput)
GET(total_token_throughput)
GET(max_output_tokens_per_s)
GET(max_concurrent_requests)
GET(cached_token_ratio)
GET(cached_tokens)
GET(requests_with_cached)
GET(usage_output_requests)
GET(good)
GET(slo_attainment)
#undef GET

static double get_request_goodput(const struct lg_summary *s)
{
    return s->has_goodput ? s->request_goodput : NAN;
}

/* summary.md's goodput column: the throughput when no SLO was given. */
static double get_goodput_or_throughput(const struct lg_summary *s)
{
    return s->has_goodput ? s->request_goodput : s->request_throughput;
}

#define DIST(field)                                                                                \
    static const struct lg_dist *dist_##field(const struct lg_summary *s)                          \
    {                                                                                              \
        return &s->field;                                                                          \
    }
DIST(ttft)
DIST(tpot)
DIST(itl)
DIST(e2el)
DIST(queue)
#undef DIST

#define TEXT(r, label, p) [LG_OUT_TEXT] = {.rank = (r), .name = (label), .prec = (p)}
#define JSON(r)           [LG_OUT_JSON] = {.rank = (r)}
#define CSV(r, col, p)    [LG_OUT_CSV] = {.rank = (r), .name = (col), .prec = (p)}
#define MD(r, col, p)     [LG_OUT_MD] = {.rank = (r), .name = (col), .prec = (p)}

/* Text labels and JSON keys are vLLM's (benchmarks/serve.py) where it has the
 * metric; the text table prints "{:<40} {:<10}" with 2 decimals. */
const struct lg_metric lg_metrics[] = {
    {.key = "completed",
     .unit = "requests",
     .kind = LG_KIND_COUNT,
     .get = get_completed,
     .at = {TEXT(1, "Successful requests:", -1), JSON(2), CSV(1, "completed", 0)}},
    {.key = "failed",
     .unit = "requests",
     .kind = LG_KIND_COUNT,
     .get = get_failed,
     .at = {TEXT(2, "Failed requests:", -1), JSON(3), CSV(2, "failed", 0)}},
    {.key = "duration",
     .unit = "s",
     .kind = LG_KIND_REAL,
     .get = get_duration_s,
     .at = {TEXT(4, "Benchmark duration (s):", 2), JSON(1), CSV(3, "duration_s", 3)}},
    {.key = "total_input_tokens",
     .unit = "tokens",
     .kind = LG_KIND_COUNT,
     .get = get_total_input,
     .at = {TEXT(5, "Total input tokens:", -1), JSON(4)}},
    {.key = "total_output_tokens",
     .unit = "tokens",
     .kind = LG_KIND_COUNT,
     .get = get_total_output,
     .at = {TEXT(6, "Total generated tokens:", -1), JSON(5)}},
    {.key = "request_throughput",
     .unit = "req/s",
     .kind = LG_KIND_REAL,
     .get = get_request_throughput,
     .at = {TEXT(7, "Request throughput (req/s):", 2), JSON(6), CSV(4, "request_throughput", 4),
            MD(2, "throughput", 2)}},
    {.key = "request_goodput",
     .unit = "req/s",
     .kind = LG_KIND_REAL,
     .needs_slo = 1,
     .get = get_request_goodput,
     .at = {TEXT(8, "Request goodput (req/s):", 2), JSON(7), CSV(5, "request_goodput", 4)}},
    {.key = "goodput_or_throughput",
     .unit = "req/s",
     .kind = LG_KIND_REAL,
     .get = get_goodput_or_throughput,
     .at = {MD(1, "goodput", 2)}},
    {.key = "output_throughput",
     .unit = "tok/s",
     .kind = LG_KIND_REAL,
     .get = get_output_throughput,
     .at = {TEXT(9, "Output token throughput (tok/s):", 2), JSON(8),
            CSV(6, "output_throughput", 4)}},
    {.key = "total_token_throughput",
     .unit = "tok/s",
     .kind = LG_KIND_REAL,
     .get = get_total_token_throughput,
     .at = {TEXT(12, "Total Token throughput (tok/s):", 2), JSON(9)}},
    {.key = "max_output_tokens_per_s",
     .unit = "tok/s",
     .kind = LG_KIND_REAL,
     .get = get_max_output_tokens_per_s,
     .at = {TEXT(10, "Peak output token throughput (tok/s):", 2), JSON(10)}},
    {.key = "max_concurrent_requests",
     .unit = "requests",
     .kind = LG_KIND_COUNT,
     .get = get_max_concurrent_requests,
     .at = {TEXT(11, "Peak concurrent requests:", 2), JSON(11)}},
    {.key = "ttft",
     .unit = "ms",
     .kind = LG_KIND_DIST,
     .section = LG_SEC_DIST,
     .dist = dist_ttft,
     .mask = LG_METRIC_TTFT,
     .title = "Time to First Token",
     .at = {TEXT(13, "TTFT", 2), JSON(12),
            [LG_OUT_CSV] = {.rank = 8,
                            .name = "ttft",
                            .prec = 3,
                            .n_stats = 4,
                            .stats = {LG_STAT_MEAN, 50, 90, 99}},
            [LG_OUT_MD] =
                {.rank = 3, .name = "TTFT", .prec = 1, .n_stats = 3, .stats = {50, 90, 99}}}},
    {.key = "tpot",
     .unit = "ms",
     .kind = LG_KIND_DIST,
     .section = LG_SEC_DIST,
     .dist = dist_tpot,
     .mask = LG_METRIC_TPOT,
     .title = "Time per Output Token (excl. 1st token)",
     .at = {TEXT(14, "TPOT", 2), JSON(13),
            [LG_OUT_CSV] = {.rank = 9,
                            .name = "tpot",
                            .prec = 3,
                            .n_stats = 4,
                            .stats = {LG_STAT_MEAN, 50, 90, 99}},
            [LG_OUT_MD] = {.rank = 4, .name = "TPOT", .prec = 1, .n_stats = 2, .stats = {50, 99}}}},
    {.key = "itl",
     .unit = "ms",
     .kind = LG_KIND_DIST,
     .section = LG_SEC_DIST,
     .dist = dist_itl,
     .mask = LG_METRIC_ITL,
     .title = "Inter-token Latency",
     .at =
         {TEXT(15, "ITL", 2), JSON(14),
          [LG_OUT_CSV] = {.rank = 10, .name = "itl", .prec = 3, .n_stats = 2, .stats = {50, 99}}}},
    {.key = "e2el",
     .unit = "ms",
     .kind = LG_KIND_DIST,
     .section = LG_SEC_DIST,
     .dist = dist_e2el,
     .mask = LG_METRIC_E2EL,
     .title = "End-to-end Latency",
     .at =
         {TEXT(16, "E2EL", 2), JSON(15),
          [LG_OUT_CSV] = {.rank = 11, .name = "e2el", .prec = 3, .n_stats = 2, .stats = {50, 99}}}},
    {.key = "client_queue_time", /* start - scheduled arrival */
     .unit = "ms",
     .kind = LG_KIND_DIST,
     .section = LG_SEC_DIST,
     .dist = dist_queue,
     .mask = LG_METRIC_QUEUE,
     .title = "Client-side Queueing",
     .at = {TEXT(17, "Client Queue Time", 2), JSON(16),
            [LG_OUT_CSV] =
                {.rank = 14, .name = "client_queue", .prec = 3, .n_stats = 1, .stats = {99}}}},
    {.key = "cached_token_ratio",
     .unit = "ratio",
     .kind = LG_KIND_RATIO,
     .section = LG_SEC_CACHE,
     .none = "n/a",
     .get = get_cached_token_ratio,
     .at = {TEXT(19, "Cached token ratio (%):", 2), JSON(17), CSV(12, "cached_token_ratio", 4),
            MD(5, "cached", 1)}},
    {.key = "cached_tokens",
     .unit = "tokens",
     .kind = LG_KIND_COUNT,
     .section = LG_SEC_CACHE,
     .get = get_cached_tokens,
     .at = {TEXT(20, "Cached prompt tokens:", -1), JSON(18)}},
    {.key = "requests_reporting_cached_tokens",
     .unit = "requests",
     .kind = LG_KIND_COUNT,
     .section = LG_SEC_CACHE,
     .get = get_requests_with_cached,
     .at = {JSON(19)}},
    {.key = "output_tokens_from_usage",
     .unit = "requests",
     .kind = LG_KIND_COUNT,
     .section = LG_SEC_CACHE,
     .get = get_usage_output_requests,
     .at = {JSON(20)}},
    {.key = "good_requests",
     .unit = "requests",
     .kind = LG_KIND_COUNT,
     .section = LG_SEC_SLO,
     .needs_slo = 1,
     .get = get_good,
     .at = {JSON(21)}},
    {.key = "slo_attainment",
     .unit = "ratio",
     .kind = LG_KIND_RATIO,
     .section = LG_SEC_SLO,
     .none = "0.00",
     .get = get_slo_attainment,
     .at = {TEXT(18, "All SLOs met (%):", 2), JSON(22), CSV(7, "slo_attainment", 4)}},
};

const size_t lg_n_metrics = sizeof(lg_metrics) / sizeof(lg_metrics[0]);

/* Taken by exp_report.c's own results.csv columns: a CSV rank above is not
 * one of these. */
const int lg_csv_cell_rank[LG_CSV_CELL_COUNT] = {
    [LG_CSV_SENT_RATE] = 13,  [LG_CSV_HOST_BUSY] = 15,   [LG_CSV_CLUSTER_CPU] = 16,
    [LG_CSV_RUNNER_CPU] = 17, [LG_CSV_LOAD1_START] = 18, [LG_CSV_LOAD1_END] = 19,
};

const struct lg_metric *lg_metric_at(enum lg_out out, int rank)
{
    for (size_t i = 0; rank > 0 && i < lg_n_metrics; i++) {
        if (lg_metrics[i].at[out].rank == rank) {
            return &lg_metrics[i];
        }
    }
    return NULL;
}

int lg_metric_last(enum lg_out out)
{
    int last = 0;
    for (size_t i = 0; i < lg_n_metrics; i++) {
        last = lg_metrics[i].at[out].rank > last ? lg_metrics[i].at[out].rank : last;
    }
    return last;
}

const struct lg_metric *lg_metric_find(const char *key)
{
    for (size_t i = 0; i < lg_n_metrics; i++) {
        if (strcmp(lg_metrics[i].key, key) == 0) {
            return &lg_metrics[i];
        }
    }
    return NULL;
}

double lg_dist_stat(const struct lg_summary *s, const struct lg_dist *d, double stat)
{
    if (stat == LG_STAT_MEAN) {
        return d->mean;
    }
    for (int i = 0; i < s->n_percentiles; i++) {
        if (s->percentiles[i] == stat) {
            return d->pct[i];
        }
    }
    return NAN;
}
