/* The router's metrics: see rt_metrics.h. */
#include "rt_metrics.h"

#include <stdio.h>
#include <string.h>

#include "pipeline.h"
#include "tandem_err.h"

/* vLLM's buckets (vllm/engine/metrics.py), as the workers use, so dashboards
 * line up. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                    5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
/* A decision takes microseconds; a 220 KB prompt about a millisecond. */
static const double decision_bounds[] = {1e-6,   2.5e-6, 5e-6, 1e-5,   2.5e-5, 5e-5, 1e-4,
                                         2.5e-4, 5e-4,   1e-3, 2.5e-3, 5e-3,   1e-2};
/* A held request waits for a worker to (re)start and join: about a second
 * after a kill, up to --hold-timeout-ms (10 s by default). */
static const double hold_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.2,  0.3,  0.4,  0.5,  0.6,
                                     0.7,  0.8,   0.9,  1.0, 1.25, 1.5,  1.75, 2.0,  2.5,
                                     3.0,  4.0,   5.0,  7.5, 10.0, 15.0, 20.0, 30.0, 60.0};
/* |predicted - actual| cached tokens: 0 is exact, a block is 16 tokens. */
static const double error_bounds[] = {0, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384};

/* The fixed label values of the labelled counters, exported at 0 from the
 * start (Prometheus practice, and vLLM's): a reader, or a test, then tells
 * "none yet" (0) from "not exported" (no series). */
static const char *const retry_reasons[] = {"busy", "failure", "recovery", NULL};
static const char *const auth_failure_kinds[] = {"hello", "announce", NULL};

/* Creates the series of each of values (NULL-terminated) in the one-label
 * family f. Returns 0 or metrics_series_get's error. */
static int preregister(struct metrics_family *f, const char *const *values)
{
    int rc = 0;
    for (int i = 0; rc == 0 && values[i] != NULL; i++) {
        const char *const v[] = {values[i], NULL};
        struct metrics_series *s;
        rc = metrics_series_get(f, v, &s);
    }
    return rc;
}

int rt_metrics_init(struct rt_metrics *m, const char *model)
{
    memset(m, 0, sizeof(*m));
    int rc = metrics_registry_create(&m->reg);
    if (rc != 0) {
        return rc;
    }
    struct metrics_registry *r = m->reg;
    const char *const model_label[] = {"model_name", NULL};
    const char *const model_value[] = {model, NULL};
    struct metrics_family *f = NULL;

    if (rc == 0) {
        const char *const labels[] = {"code", NULL};
        rc = metrics_counter_new(r, "tandem:router_requests_total",
                                 "HTTP requests answered by the router, by status code (499: the "
                                 "client went away first).",
                                 labels, &m->requests);
    }
    if (rc == 0) {
        const char *const v[] = {"200", NULL};
        rc = metrics_series_get(m->requests, v, &m->code_200);
    }
    METRICS_HISTOGRAM(m->decision_seconds, "tandem:routing_decision_seconds",
                      "Time spent in the scheduling pipeline per decision.", NULL, NULL,
                      decision_bounds);
    if (rc == 0) {
        const char *const labels[] = {"endpoint", "role", NULL};
        rc = metrics_counter_new(r, "tandem:routing_decisions_total",
                                 "Endpoints chosen by the pipeline (decode and remote prefill).",
                                 labels, &m->decisions);
    }
    if (rc == 0) {
        const char *const labels[] = {"prefill", NULL};
        const char *const remote[] = {"remote", NULL};
        const char *const local[] = {"local", NULL};
        rc = metrics_counter_new(r, "tandem:pd_decisions_total",
                                 "Decisions by where the prompt is prefilled: remote (a prefill "
                                 "worker, KV shipped) or local (the decode or colocated worker).",
                                 labels, &f);
        METRICS_SERIES(m->pd_remote, remote);
        METRICS_SERIES(m->pd_local, local);
    }
    METRICS_COUNTER(m->decision_failures, "tandem:routing_decision_failures_total",
                    "Decisions that found no endpoint (held until one joins, queued after Busy, "
                    "or answered 503).",
                    NULL, NULL);
    if (rc == 0) {
        const char *const labels[] = {"outcome", NULL};
        const char *const sent[] = {"sent", NULL};
        const char *const expired[] = {"expired", NULL};
        const char *const aborted[] = {"aborted", NULL};
        METRICS_HISTOGRAM(m->hold_sent, "tandem:request_hold_seconds",
                          "How long requests were held for want of any healthy endpoint, by how "
                          "the hold ended: sent (an endpoint joined), expired (503 after "
                          "--hold-timeout-ms), aborted (the client went away).",
                          labels, sent, hold_bounds);
        METRICS_SERIES(m->hold_expired, expired);
        METRICS_SERIES(m->hold_aborted, aborted);
    }
    if (rc == 0) {
        const char *const labels[] = {"reason", NULL};
        const char *const no_prefill[] = {rt_pd_reason_name(RT_PD_REASON_NO_PREFILL_ENDPOINT),
                                          NULL};
        METRICS_COUNTER(m->pd_no_prefill, "tandem:pd_local_fallbacks_total",
                        "P/D decisions that wanted a remote prefill and prefilled on the decode "
                        "endpoint instead, by reason (no-prefill-endpoint: the cluster's prefill "
                        "endpoints are all down, or left out after a failure).",
                        labels, no_prefill);
    }
    METRICS_COUNTER(
        m->predicted_cached, "tandem:predicted_cached_tokens_total",
        "Prompt tokens the prefix index predicted cached on the decode endpoint (requests "
        "with a prediction that finished).",
        NULL, NULL);
    METRICS_COUNTER(m->actual_cached, "tandem:actual_cached_tokens_total",
                    "Prompt tokens the worker reported cached, for the same requests.", NULL, NULL);
    METRICS_HISTOGRAM(
        m->cached_abs_error, "tandem:cached_tokens_prediction_error_tokens",
        "Absolute error |predicted - actual| of the cached-token prediction, per request.", NULL,
        NULL, error_bounds);
    if (rc == 0) {
        const char *const labels[] = {"reason", NULL};
        rc = metrics_counter_new(r, "tandem:router_retries_total",
                                 "Jobs sent again: busy (the worker refused it), failure (lost "
                                 "before the first token), recovery (lost after tokens streamed).",
                                 labels, &m->retries);
    }
    if (rc == 0) {
        rc = preregister(m->retries, retry_reasons);
    }
    if (rc == 0) {
        const char *const labels[] = {"kind", NULL};
        rc = metrics_counter_new(r, "tandem:router_auth_failures_total",
                                 "Workers refused for the cluster secret: hello (no or wrong proof "
                                 "of the router's nonce; the pipe is closed), announce (no or "
                                 "wrong tag; not dialed).",
                                 labels, &m->auth_failures);
    }
    if (rc == 0) {
        rc = preregister(m->auth_failures, auth_failure_kinds);
    }
    METRICS_COUNTER(m->ctl_envelopes, "tandem:router_control_envelopes_sent_total",
                    "Jobs and cancels sent to workers on their control links.", NULL, NULL);
    METRICS_COUNTER(
        m->ctl_messages, "tandem:router_control_messages_sent_total",
        "Control-link messages those envelopes left in: fewer when workers take batches "
        "(the jobs and cancels of one loop turn for a worker in one message).",
        NULL, NULL);
    METRICS_HISTOGRAM(m->ttft, "vllm:time_to_first_token_seconds",
                      "From the HTTP request's arrival at the router to its first generated token.",
                      model_label, model_value, ttft_bounds);
    METRICS_HISTOGRAM(m->itl, "vllm:inter_token_latency_seconds",
                      "Between consecutive tokens of a request, as the router receives them.",
                      model_label, model_value, itl_bounds);
    METRICS_HISTOGRAM(m->e2e, "vllm:e2e_request_latency_seconds",
                      "From the HTTP request's arrival at the router to its last token.",
                      model_label, model_value, e2e_bounds);
    METRICS_GAUGE(m->running, "vllm:num_requests_running",
                  "Requests the router has on a worker (sent, not finished).", model_label,
                  model_value);
    METRICS_GAUGE(m->waiting, "vllm:num_requests_waiting",
                  "Requests the router holds without a worker: queued after every worker was busy.",
                  model_label, model_value);
    METRICS_COUNTER(m->prompt_tokens, "vllm:prompt_tokens_total",
                    "Prompt tokens of finished requests.", model_label, model_value);
    METRICS_COUNTER(m->generation_tokens, "vllm:generation_tokens_total",
                    "Completion tokens returned to clients.", model_label, model_value);
    if (rc == 0) {
        const char *const labels[] = {"state", NULL};
        const char *const healthy[] = {"healthy", NULL};
        const char *const total[] = {"registered", NULL};
        rc = metrics_gauge_new(r, "tandem:router_endpoints",
                               "Endpoints known to the registry, and how many are healthy.", labels,
                               &f);
        METRICS_SERIES(m->endpoints_healthy, healthy);
        METRICS_SERIES(m->endpoints_total, total);
    }
    if (rc != 0) {
        metrics_registry_destroy(m->reg);
        memset(m, 0, sizeof(*m));
    }
    return rc;
}

void rt_metrics_fini(struct rt_metrics *m)
{
    metrics_registry_destroy(m->reg);
    memset(m, 0, sizeof(*m));
}

void rt_metrics_request(struct rt_metrics *m, int status)
{
    if (status == 200) {
        metrics_counter_inc(m->code_200);
        return;
    }
    char code[16];
    snprintf(code, sizeof(code), "%d", status);
    const char *const v[] = {code, NULL};
    struct metrics_series *s;
    if (metrics_series_get(m->requests, v, &s) == 0) {
        metrics_counter_inc(s);
    }
}

void rt_metrics_decision(struct rt_metrics *m, const char *endpoint, enum rt_role role)
{
    const char *const v[] = {endpoint, rt_role_name(role), NULL};
    struct metrics_series *s;
    if (metrics_series_get(m->decisions, v, &s) == 0) {
        metrics_counter_inc(s);
    }
}

void rt_metrics_retry(struct rt_metrics *m, const char *reason)
{
    const char *const v[] = {reason, NULL};
    struct metrics_series *s;
    if (metrics_series_get(m->retries, v, &s) == 0) {
        metrics_counter_inc(s);
    }
}
