#include "wk_metrics.h"

#include "tandem_err.h"

/* vLLM's buckets (vllm/engine/metrics.py), so dashboards line up. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                    5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double transfer_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25,   0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
/* Step times (modelled x time_scale, wall) and the lateness of a step's end
 * or start (overrun, idle gap): tens of microseconds to seconds. */
static const double step_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                     0.1,    0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
static const double late_bounds[] = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025,
                                     0.0005,  0.001,    0.0025,  0.005,  0.01,
                                     0.025,   0.05,     0.1,     0.25,   1.0};

/* The fixed label values of the rejection counters, exported at 0 from the
 * start (Prometheus practice, and vLLM's), so a reader, or a test, tells "none
 * yet" (0) from "not exported" (no series). Reasons: docs/architecture.md
 * ("Validation and bounded memory", and the KV frame checks). */
static const char *const frame_reject_reasons[] = {
    "unknown_request", "block_index", "duplicate", "token_count", "dtype",
    "layers",          "size",        "hash",      "checksum",    NULL};
/* tandem:messages_rejected_total{link, reason}, per link: what wire_unpack
 * (control) and wire_frame_unpack_msg (data) refuse, by TANDEM_E* name, and
 * the worker's own reasons (worker.c, prefill.c, decode.c). */
static const int ctl_reject_errors[] = {
    TANDEM_EPROTO, TANDEM_EVERSION, TANDEM_ETOOBIG, TANDEM_ETRUNCATED,
    TANDEM_ERANGE, TANDEM_EINVAL,   TANDEM_ENOMEM,  0};
static const char *const ctl_reject_reasons[] = {"auth", "unexpected_kind", "duplicate", NULL};
static const int data_reject_errors[] = {TANDEM_EPROTO,     TANDEM_EVERSION,  TANDEM_ETOOBIG,
                                         TANDEM_ETRUNCATED, TANDEM_ERANGE,    TANDEM_EINVAL,
                                         TANDEM_ENOMEM,     TANDEM_ECHECKSUM, 0};
static const char *const data_reject_reasons[] = {
    "auth", "unexpected_kind", "duplicate", "unknown_request", "bad_address", NULL};

/* Creates the series {link, reason} of tandem:messages_rejected_total for
 * each of errors (0-terminated, by name) and reasons (NULL-terminated).
 * Returns 0 or metrics_series_get's error. */
static int preregister_rejects(struct metrics_family *f, const char *link, const int *errors,
                               const char *const *reasons)
{
    struct metrics_series *s;
    int rc = 0;
    for (int i = 0; rc == 0 && errors[i] != 0; i++) {
        const char *const v[] = {link, tandem_errname(errors[i]), NULL};
        rc = metrics_series_get(f, v, &s);
    }
    for (int i = 0; rc == 0 && reasons[i] != NULL; i++) {
        const char *const v[] = {link, reasons[i], NULL};
        rc = metrics_series_get(f, v, &s);
    }
    return rc;
}

static void collect(struct metrics_registry *reg, void *arg)
{
    (void)reg;
    struct wk_core *c = arg;
    struct worker_metrics *m = &c->m;
    struct sched_stats st;
    sched_stats(c->sched, &st);
    struct kv_stats ks;
    kv_pool_stats(c->pool, &ks);
    metrics_gauge_set(m->running, st.running);
    metrics_gauge_set(m->waiting, st.waiting + c->n_outside);
    metrics_gauge_set(m->kv_usage, ks.total ? (double)ks.in_use / ks.total : 0.0);
    metrics_gauge_set(m->kv_free, ks.free);
    metrics_gauge_set(m->kv_used, ks.in_use);
    metrics_gauge_set(m->kv_cached_idle, ks.cached_idle);
    metrics_gauge_set(m->kv_total, ks.total);
#define MIRROR(series, cur, last)                                                                  \
    do {                                                                                           \
        uint64_t v_ = (cur);                                                                       \
        if (v_ > (last)) {                                                                         \
            metrics_counter_add((series), (double)(v_ - (last)));                                  \
            (last) = v_;                                                                           \
        }                                                                                          \
    } while (0)
    MIRROR(m->prefix_queries, st.prefix_cache_queries, m->last_queries);
    MIRROR(m->prefix_hits, st.prefix_cache_hits, m->last_hits);
    MIRROR(m->preemptions, st.preemptions, m->last_preempt);
    MIRROR(m->prompt_tokens, st.prompt_tokens, m->last_prompt);
    MIRROR(m->generation_tokens, st.generation_tokens, m->last_gen);
#undef MIRROR
}

int wk_metrics_init(struct wk_core *c)
{
    int rc = metrics_registry_create(&c->reg);
    if (rc != 0) {
        return rc;
    }
    struct metrics_registry *r = c->reg;
    struct worker_metrics *m = &c->m;
    const char *model = c->be->info.name;
    const char *const model_label[] = {"model_name", NULL};
    const char *const model_value[] = {model, NULL};
    struct metrics_family *f;

    METRICS_GAUGE(m->running, "vllm:num_requests_running", "Requests in the running batch.",
                  model_label, model_value);
    METRICS_GAUGE(m->waiting, "vllm:num_requests_waiting",
                  "Requests waiting: queued, preempted, or receiving their KV.", model_label,
                  model_value);
    METRICS_GAUGE(m->kv_usage, "vllm:kv_cache_usage_perc",
                  "Fraction of KV blocks in use (1 = full); cached idle blocks count as free.",
                  model_label, model_value);
    METRICS_COUNTER(m->prefix_queries, "vllm:prefix_cache_queries_total",
                    "Prompt tokens looked up in the prefix cache.", model_label, model_value);
    METRICS_COUNTER(m->prefix_hits, "vllm:prefix_cache_hits_total",
                    "Prompt tokens found in the prefix cache.", model_label, model_value);
    METRICS_COUNTER(m->preemptions, "vllm:num_preemptions_total", "Preemptions by recompute.",
                    model_label, model_value);
    METRICS_COUNTER(m->prompt_tokens, "vllm:prompt_tokens_total",
                    "Prompt tokens of started requests.", model_label, model_value);
    METRICS_COUNTER(m->generation_tokens, "vllm:generation_tokens_total", "Tokens generated.",
                    model_label, model_value);
    METRICS_HISTOGRAM(m->ttft, "vllm:time_to_first_token_seconds",
                      "From the job's arrival to its first generated token.", model_label,
                      model_value, ttft_bounds);
    METRICS_HISTOGRAM(m->itl, "vllm:inter_token_latency_seconds",
                      "Between consecutive tokens of a request.", model_label, model_value,
                      itl_bounds);
    METRICS_HISTOGRAM(m->e2e, "vllm:e2e_request_latency_seconds",
                      "From the job's arrival to its finish.", model_label, model_value,
                      e2e_bounds);
    if (rc == 0) {
        const char *const labels[] = {"finished_reason", "model_name", NULL};
        rc = metrics_counter_new(r, "vllm:request_success_total",
                                 "Finished requests by finish reason.", labels, &m->success);
    }
    METRICS_COUNTER(m->kv_bytes_sent, "tandem:kv_bytes_sent_total",
                    "KV payload bytes shipped to decode workers.", NULL, NULL);
    METRICS_COUNTER(m->kv_bytes_received, "tandem:kv_bytes_received_total",
                    "KV payload bytes installed from prefill workers.", NULL, NULL);
    METRICS_COUNTER(m->kv_frames_sent, "tandem:kv_frames_sent_total", "KV frames shipped.", NULL,
                    NULL);
    METRICS_COUNTER(m->kv_frames_installed, "tandem:kv_frames_installed_total",
                    "KV frames verified and installed.", NULL, NULL);
    METRICS_HISTOGRAM(m->kv_transfer, "tandem:kv_transfer_seconds",
                      "From PrefillJob sent to the prompt's KV installed (decode worker).", NULL,
                      NULL, transfer_bounds);
    if (rc == 0) {
        const char *const labels[] = {"reason", NULL};
        rc = metrics_counter_new(r, "tandem:kv_frames_rejected_total",
                                 "KV frames dropped, by reason.", labels, &m->frames_rejected);
        for (int i = 0; rc == 0 && frame_reject_reasons[i] != NULL; i++) {
            const char *const v[] = {frame_reject_reasons[i], NULL};
            struct metrics_series *s;
            rc = metrics_series_get(m->frames_rejected, v, &s);
        }
    }
    if (rc == 0) {
        const char *const labels[] = {"link", "reason", NULL};
        rc = metrics_counter_new(r, "tandem:messages_rejected_total",
                                 "Inbound messages refused, by link and reason.", labels,
                                 &m->messages_rejected);
        if (rc == 0) {
            rc = preregister_rejects(m->messages_rejected, "control", ctl_reject_errors,
                                     ctl_reject_reasons);
        }
        if (rc == 0) {
            rc = preregister_rejects(m->messages_rejected, "data", data_reject_errors,
                                     data_reject_reasons);
        }
    }
    if (rc == 0) {
        const char *const labels[] = {"state", NULL};
        rc = metrics_gauge_new(
            r, "tandem:kv_blocks",
            "KV blocks by state; free + used + cached_idle = tandem:kv_capacity_blocks.", labels,
            &f);
        const char *const v_free[] = {"free", NULL}, *const v_used[] = {"used", NULL},
                          *const v_idle[] = {"cached_idle", NULL};
        METRICS_SERIES(m->kv_free, v_free);
        METRICS_SERIES(m->kv_used, v_used);
        METRICS_SERIES(m->kv_cached_idle, v_idle);
    }
    METRICS_GAUGE(m->kv_total, "tandem:kv_capacity_blocks", "KV blocks in the pool.", NULL, NULL);
    METRICS_COUNTER(m->ctl_dropped, "tandem:control_messages_dropped_total",
                    "Messages for the router dropped: no router connected or its queue full.", NULL,
                    NULL);
    METRICS_COUNTER(
        m->ctl_envelopes, "tandem:control_envelopes_sent_total",
        "Envelopes (jobs' tokens, finishes, KV events, heartbeats, ...) for the router.", NULL,
        NULL);
    METRICS_COUNTER(m->ctl_messages, "tandem:control_messages_sent_total",
                    "NNG messages on the control link: fewer than the envelopes when the "
                    "router takes batches (several envelopes of one loop turn in one message).",
                    NULL, NULL);
    METRICS_COUNTER(
        m->http_errors, "tandem:http_errors_total",
        "HTTP requests answered with an error by the metrics server (400, 408, 413, ...).", NULL,
        NULL);
    METRICS_GAUGE(m->peers, "tandem:peer_sockets", "Cached data-link sockets to other workers.",
                  NULL, NULL);
    METRICS_HISTOGRAM(m->step_modelled, "tandem:step_modelled_seconds",
                      "Steps whose end the worker times (sim, time_scale > 0): modelled step "
                      "time x time_scale, the wall time the step should take.",
                      NULL, NULL, step_bounds);
    METRICS_HISTOGRAM(m->step_wall, "tandem:step_wall_seconds",
                      "Those steps: wall time from the step's start to its end.", NULL, NULL,
                      step_bounds);
    METRICS_HISTOGRAM(m->step_overrun, "tandem:step_overrun_seconds",
                      "Those steps: how late the end came, wall - modelled x time_scale.", NULL,
                      NULL, late_bounds);
    METRICS_HISTOGRAM(m->step_idle_gap, "tandem:step_idle_gap_seconds",
                      "From a step's end, or new work, to the next step's start while the "
                      "scheduler had work.",
                      NULL, NULL, late_bounds);
    if (rc == 0) {
        const char *const labels[] = {"id", "role", "model_name", "version", NULL};
        const char *const values[] = {c->id, c->role->name, model, TANDEM_VERSION, NULL};
        struct metrics_series *info;
        rc = metrics_gauge_new(r, "tandem:worker_info", "Constant 1, labelled with what this is.",
                               labels, &f);
        METRICS_SERIES(info, values);
        if (rc == 0) {
            metrics_gauge_set(info, 1);
        }
    }
    if (rc == 0) {
        rc = metrics_on_collect(r, collect, c);
    }
    return rc;
}
