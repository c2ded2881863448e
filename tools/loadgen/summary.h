/* Per-request records and the benchmark summary computed from them, with the
 * definitions of vLLM's benchmarks/serve.py (calculate_metrics) so numbers can
 * be set side by side with `vllm bench serve`:
 *
 *   TTFT  = first token chunk received - request sent
 *   E2EL  = last token chunk received - request sent
 *   TPOT  = (E2EL - TTFT) / (output_tokens - 1), only for output_tokens > 1
 *   ITL   = every gap between successive token chunks, pooled over requests
 *   mean, median, std (population) and percentiles with numpy's default
 *   "linear" interpolation; an empty set gives 0 everywhere (vLLM's `or 0`)
 *   throughput = completed requests (or their tokens) / benchmark duration
 *   goodput    = completed requests meeting every given SLO / duration, where
 *                a request with output_tokens <= 1 has TPOT 0 (as vLLM)
 *   SLO attainment = requests meeting every SLO / all requests (failed ones
 *                count as misses); per-SLO attainment likewise
 *   cached-token ratio = sum(cached_tokens) / sum(prompt_tokens) over the
 *                completed requests whose usage reported cached tokens
 *
 * Everything here is pure; any thread. */
#ifndef TANDEM_LG_SUMMARY_H
#define TANDEM_LG_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#define LG_MAX_PERCENTILES 16
#define LG_MAX_FAIL_KINDS  32

/* Why a request failed. The summary groups failures by lg_fail_key(), which
 * is the name below, or "http_<status>" for LG_FAIL_HTTP. */
#define LG_FAIL_MAP(X)                                                                             \
    X(NONE, "none")                                                                                \
    X(CONNECT, "connect")           /* could not connect */                                        \
    X(TIMEOUT, "timeout")           /* --request-timeout elapsed */                                \
    X(HTTP, "http")                 /* status other than 200 */                                    \
    X(CLOSED, "closed")             /* connection closed before the response ended */              \
    X(IO, "io")                     /* read or write error */                                      \
    X(BAD_HTTP, "bad_http")         /* malformed HTTP response */                                  \
    X(BAD_STREAM, "bad_stream")     /* malformed SSE or chunk JSON */                              \
    X(STREAM_ERROR, "stream_error") /* the server sent an error object in the stream */            \
    X(NO_TOKENS, "no_tokens")       /* response ended without a single token */                    \
    X(CANCELLED, "cancelled")       /* run interrupted */                                          \
    X(CLIENT, "client")             /* local failure (memory, file descriptors) */

enum lg_fail {
#define LG_X(name, str) LG_FAIL_##name,
    LG_FAIL_MAP(LG_X)
#undef LG_X
        LG_FAIL_COUNT
};

/* One request of the measured run (warm-ups are not recorded). Times are in
 * seconds; arrival and start are relative to the start of the measured run. */
struct lg_record {
    int64_t index;         /* request number in the workload */
    int32_t session;       /* multi-turn session, or -1 */
    int32_t turn;          /* turn within the session, 0 otherwise */
    double arrival_s;      /* scheduled arrival */
    double start_s;        /* sent (>= arrival: the difference is client queueing) */
    double ttft_s;         /* ok only */
    double e2el_s;         /* ok only */
    double *itl_s;         /* (n_itl) gaps between successive token chunks; owned */
    uint32_t n_itl;        /* token chunks - 1 */
    uint32_t n_chunks;     /* token chunks received */
    int64_t prompt_tokens; /* usage.prompt_tokens when reported, else the target */
    int64_t output_tokens; /* usage.completion_tokens when reported, else n_chunks */
    int64_t cached_tokens; /* usage.prompt_tokens_details.cached_tokens, -1 if absent */
    int32_t target_prompt_len;
    int32_t target_output_len;
    int32_t http_status; /* 0 when no response status was received */
    uint8_t ok;
    uint8_t usage_prompt; /* prompt_tokens came from usage */
    uint8_t usage_output; /* output_tokens came from usage */
    uint8_t done_marker;  /* the stream ended with data: [DONE] */
    enum lg_fail reason;  /* LG_FAIL_NONE when ok */
    char *error;          /* detail (malloc'd) or NULL */
};

/* Frees what a record owns (itl_s, error) and zeroes those fields. */
void lg_record_clear(struct lg_record *r);

const char *lg_fail_name(enum lg_fail f);
/* Writes the grouping key of a failed record ("timeout", "http_503", ...). */
void lg_fail_key(const struct lg_record *r, char *out, size_t len);

/* TPOT of one record in seconds, the one copy of the formula: (E2EL - TTFT) /
 * (output_tokens - 1), and 0 when output_tokens <= 1 (vLLM's value for the
 * goodput check). Meaningful for completed records only; lg_has_tpot says
 * whether a record enters the TPOT distribution. Pure. */
double lg_tpot_s(const struct lg_record *r);
/* 1 when r completed with more than one output token (it has a TPOT). */
int lg_has_tpot(const struct lg_record *r);

/* A distribution in milliseconds. */
struct lg_dist {
    size_t n;
    double mean, median, std;
    double pct[LG_MAX_PERCENTILES]; /* at lg_summary.percentiles */
};

struct lg_slo {
    /* Milliseconds; a negative value means "not set". */
    double ttft_ms, tpot_ms, e2el_ms;
};

struct lg_summary_opts {
    int n_percentiles;
    double percentiles[LG_MAX_PERCENTILES]; /* in [0, 100] */
    struct lg_slo slo;
};

struct lg_failure_kind {
    char key[32];
    int64_t count;
    char example[256]; /* the first error message seen for this key */
};

struct lg_summary {
    int64_t completed, failed;
    double duration_s;
    int64_t total_input, total_output; /* completed requests only */
    double request_throughput, output_throughput, total_token_throughput;
    int has_goodput;
    int64_t good; /* completed requests meeting every SLO */
    double request_goodput;
    double slo_attainment;                                    /* NaN without SLOs or requests */
    double ttft_attainment, tpot_attainment, e2el_attainment; /* NaN when that SLO is not set */
    double max_output_tokens_per_s;                           /* vLLM's peak over 1 s buckets */
    int64_t max_concurrent_requests;             /* vLLM's sweep over [start, start + e2el) */
    struct lg_dist ttft, tpot, itl, e2el, queue; /* queue: start - arrival */
    int64_t cached_tokens, cached_prompt_tokens, requests_with_cached;
    double cached_token_ratio;     /* NaN when no request reported cached tokens */
    int64_t usage_output_requests; /* completed requests whose output count came from usage */
    int n_failure_kinds;
    struct lg_failure_kind failures[LG_MAX_FAIL_KINDS]; /* the last one collects overflow */
    int n_percentiles;
    double percentiles[LG_MAX_PERCENTILES];
    struct lg_slo slo;
};

/* numpy.percentile(x, p) with the default "linear" method on sorted[0..n):
 * virtual index (n - 1) x p / 100 and numpy's lerp. 0 for n == 0. */
double lg_percentile(const double *sorted, size_t n, double p);

/* Sorts values in place and fills out (values x scale: 1000 for s -> ms). */
void lg_dist_compute(double *values, size_t n, const double *percentiles, int n_percentiles,
                     double scale, struct lg_dist *out);

/* Computes the summary of records[0..n) over a run of duration_s seconds.
 * Returns 0, TANDEM_EINVAL (bad options) or TANDEM_ENOMEM. */
int lg_summary_compute(const struct lg_record *records, size_t n, double duration_s,
                       const struct lg_summary_opts *opts, struct lg_summary *out);

/* Parses "50,90,99" into opts->percentiles. 0 or TANDEM_EINVAL. */
int lg_parse_percentiles(const char *s, struct lg_summary_opts *opts);
/* Adds one "ttft:500" (names ttft, tpot, e2el; value in ms >= 0). Several may
 * be given separated by commas or spaces. 0 or TANDEM_EINVAL. */
int lg_parse_goodput(const char *s, struct lg_slo *slo);
/* Sets every SLO to "not set". */
void lg_slo_clear(struct lg_slo *slo);

#endif
