/* The router's Prometheus metrics (GET /metrics): requests by status, routing
 * decisions (latency, per endpoint, P/D), predicted vs actual cached tokens,
 * and per-request latency histograms under vLLM's names, all in one registry
 * owned by the router. docs/architecture.md ("## Router") lists every series.
 *
 * Threading: the router's loop thread only (the registry is not locked). */
#ifndef TANDEM_RT_METRICS_H
#define TANDEM_RT_METRICS_H

#include "endpoint.h"
#include "metrics.h"

struct rt_metrics {
    struct metrics_registry *reg;
    struct metrics_family *requests;      /* tandem:router_requests_total{code} */
    struct metrics_family *decisions;     /* tandem:routing_decisions_total{endpoint,role} */
    struct metrics_family *retries;       /* tandem:router_retries_total{reason} */
    struct metrics_family *auth_failures; /* tandem:router_auth_failures_total{kind} */
    struct metrics_series *decision_seconds;
    struct metrics_series *pd_remote, *pd_local;
    struct metrics_series *predicted_cached, *actual_cached, *cached_abs_error;
    struct metrics_series *ttft, *itl, *e2e;
    struct metrics_series *running, *waiting, *pending;
    struct metrics_series *prompt_tokens, *generation_tokens;
    struct metrics_series *decision_failures;
    /* tandem:request_hold_seconds{outcome}: sent, expired, aborted */
    struct metrics_series *hold_sent, *hold_expired, *hold_aborted;
    /* tandem:pd_local_fallbacks_total{reason="no-prefill-endpoint"} */
    struct metrics_series *pd_no_prefill;
    struct metrics_series *endpoints_healthy, *endpoints_total;
    struct metrics_series *code_200; /* hot path: the series of code="200" */
    /* The live router's control links (router.c; 0 in the simulator). */
    struct metrics_series *ctl_envelopes, *ctl_messages;
};

/* Registers every family in a new registry for model (the model_name label
 * of the vllm: series). Returns 0 or TANDEM_ENOMEM / TANDEM_EINVAL; on
 * failure nothing is left allocated. */
int rt_metrics_init(struct rt_metrics *m, const char *model);

void rt_metrics_fini(struct rt_metrics *m);

/* tandem:router_requests_total{code} += 1. */
void rt_metrics_request(struct rt_metrics *m, int status);

/* tandem:routing_decisions_total{endpoint=id, role} += 1. */
void rt_metrics_decision(struct rt_metrics *m, const char *endpoint, enum rt_role role);

/* tandem:router_retries_total{reason} += 1 ("busy", "failure", "recovery"). */
void rt_metrics_retry(struct rt_metrics *m, const char *reason);

#endif
