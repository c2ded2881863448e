/* Report output: the summary table in the layout of vLLM's "Serving
 * Benchmark Result" (labels and widths of vllm/benchmarks/serve.py, so the two
 * can be set side by side, plus our lines), the summary as JSON with vLLM's
 * result keys plus ours, and the per-request records as CSV or JSONL.
 *
 * Single-threaded; writes to the given stream or file. */
#ifndef TANDEM_LG_REPORT_H
#define TANDEM_LG_REPORT_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "run.h"
#include "summary.h"

/* Which distributions get printed and written (--percentile-metrics). */
enum {
    LG_METRIC_TTFT = 1 << 0,
    LG_METRIC_TPOT = 1 << 1,
    LG_METRIC_ITL = 1 << 2,
    LG_METRIC_E2EL = 1 << 3,
    LG_METRIC_QUEUE = 1 << 4, /* "client_queue_time" */
};

/* Parses "ttft,tpot,itl,e2el" (also client_queue_time). 0 or TANDEM_EINVAL. */
int lg_parse_metrics(const char *s, unsigned *mask);

/* Everything about the run the report shows besides the summary. */
struct lg_report_info {
    const char *backend; /* "openai" (completions) or "openai-chat" */
    const char *label;   /* NULL: the backend */
    const char *model;
    const char *dataset;
    const char *base_url;     /* "http://host:port" */
    const char *endpoint;     /* the request path */
    int64_t num_prompts;      /* -1: none (duration) */
    double duration_target_s; /* 0: none */
    double request_rate;      /* INFINITY allowed */
    double burstiness;
    int max_concurrency; /* 0: none */
    uint64_t seed;
    int num_warmups;
    unsigned metrics;                /* LG_METRIC_* */
    const struct lg_run_result *run; /* may be NULL (tests) */
};

/* Prints the table to f. */
void lg_report_print(FILE *f, const struct lg_summary *s, const struct lg_report_info *info);

/* The summary as a JSON object (new reference; NULL when out of memory):
 * vLLM's keys (date, backend, endpoint_type, label, model_id, num_prompts,
 * request_rate, burstiness, max_concurrency, duration, completed, failed,
 * total_input_tokens, total_output_tokens, request_throughput,
 * request_goodput, output_throughput, total_token_throughput,
 * max_output_tokens_per_s, max_concurrent_requests, and per selected metric
 * mean_X_ms, median_X_ms, std_X_ms, pNN_X_ms) plus ours (dataset_name, seed,
 * num_warmups, cached_token_ratio, cached_tokens, slo, slo_attainment,
 * slo_attainment_by_metric, failures, failure_examples, ...). A value that is
 * undefined (NaN) is null. */
json_t *lg_report_json(const struct lg_summary *s, const struct lg_report_info *info);

/* Writes lg_report_json to path ("-": stdout). 0, TANDEM_ENOMEM or TANDEM_EIO
 * (message in err). */
int lg_report_write_json(const char *path, const struct lg_summary *s,
                         const struct lg_report_info *info, char *err, size_t errlen);

enum lg_requests_format { LG_REQUESTS_CSV = 0, LG_REQUESTS_JSONL = 1 };
/* The format of a --save-requests path from its extension (.csv, .jsonl or
 * .ndjson, case-insensitive). 0 or TANDEM_EINVAL. */
int lg_requests_format(const char *path, enum lg_requests_format *out);

/* Writes one line per record: CSV (header line first; gaps as count, mean and
 * max) or JSONL (every gap). 0, TANDEM_EINVAL (extension), TANDEM_EIO. */
int lg_report_save_requests(const char *path, const struct lg_record *recs, size_t n, char *err,
                            size_t errlen);

/* The JSON key word for a percentile as vLLM writes it: "99", "99.9". */
void lg_percentile_word(double p, char *out, size_t len);

#endif
