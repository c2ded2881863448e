/* Load scorers, each with llm-d's formula (docs/routing.md):
 *   queue-scorer                 (max - waiting) / (max - min) over candidates, 1 when all equal
 *   kv-cache-utilization-scorer  1 - kv_blocks_used / kv_blocks_total
 *   load-aware-scorer            0.5 with an empty queue, else 0.5 x (1 - min(waiting, T) / T)
 *   active-request-scorer        router-tracked in-flight requests (and optionally tokens):
 *                                1 at or below idleThreshold, else
 *                                (max - count) / max x maxBusyScore */
#include "pipeline.h"

static void queue_score(struct rt_plugin *p, struct rt_cycle *c, const int *cands, int n,
                        double *out)
{
    uint32_t lo = UINT32_MAX, hi = 0;
    for (int i = 0; i < n; i++) {
        uint32_t q = rt_pipeline_ep(c->pl, cands[i])->load.waiting;
        lo = q < lo ? q : lo;
        hi = q > hi ? q : hi;
    }
    for (int i = 0; i < n; i++) {
        uint32_t q = rt_pipeline_ep(c->pl, cands[i])->load.waiting;
        out[i] = hi == lo ? 1.0 : (double)(hi - q) / (double)(hi - lo);
    }
}

const struct rt_plugin_ops rt_queue_scorer_ops = {
    .type = "queue-scorer",
    .kind = RT_KIND_SCORER,
    .score = queue_score,
};

static void kv_util_score(struct rt_plugin *p, struct rt_cycle *c, const int *cands, int n,
                          double *out)
{
    for (int i = 0; i < n; i++)
        out[i] = 1.0 - rt_endpoint_kv_usage(rt_pipeline_ep(c->pl, cands[i]));
}

const struct rt_plugin_ops rt_kv_cache_utilization_scorer_ops = {
    .type = "kv-cache-utilization-scorer",
    .kind = RT_KIND_SCORER,
    .score = kv_util_score,
};

struct load_aware_cfg {
    int64_t threshold;
};

static const struct load_aware_cfg load_aware_defaults = {.threshold = 128};

static const struct rt_param_spec load_aware_params[] = {
    RT_P_INT("threshold", struct load_aware_cfg, threshold, 1, 1e9),
};

static void load_aware_score(struct rt_plugin *p, struct rt_cycle *c, const int *cands, int n,
                             double *out)
{
    const struct load_aware_cfg *cfg = p->cfg;
    double t = (double)cfg->threshold;
    for (int i = 0; i < n; i++) {
        double w = rt_pipeline_ep(c->pl, cands[i])->load.waiting;
        if (w == 0) {
            out[i] = 0.5;
            continue;
        }
        if (w > t)
            w = t;
        out[i] = 0.5 * (1.0 - w / t);
    }
}

const struct rt_plugin_ops rt_load_aware_scorer_ops = {
    .type = "load-aware-scorer",
    .kind = RT_KIND_SCORER,
    .params = load_aware_params,
    .n_params = RT_COUNT(load_aware_params),
    .cfg_size = sizeof(struct load_aware_cfg),
    .cfg_defaults = &load_aware_defaults,
    .score = load_aware_score,
};

struct active_cfg {
    int64_t idle_threshold;
    double max_busy_score;
    double token_weight;
};

static const struct active_cfg active_defaults = {
    .idle_threshold = 0,
    .max_busy_score = 1.0,
    .token_weight = 0.0,
};

static const struct rt_param_spec active_params[] = {
    RT_P_INT("idleThreshold", struct active_cfg, idle_threshold, 0, 1e9),
    RT_P_DOUBLE("maxBusyScore", struct active_cfg, max_busy_score, 0, 1),
    RT_P_DOUBLE("tokenWeight", struct active_cfg, token_weight, 0, 1),
};

static void active_score(struct rt_plugin *p, struct rt_cycle *c, const int *cands, int n,
                         double *out)
{
    const struct active_cfg *cfg = p->cfg;
    uint32_t max_count = 0;
    uint64_t max_tokens = 0;
    for (int i = 0; i < n; i++) {
        const struct rt_endpoint *e = rt_pipeline_ep(c->pl, cands[i]);
        max_count = e->inflight_requests > max_count ? e->inflight_requests : max_count;
        max_tokens = e->inflight_tokens > max_tokens ? e->inflight_tokens : max_tokens;
    }
    for (int i = 0; i < n; i++) {
        const struct rt_endpoint *e = rt_pipeline_ep(c->pl, cands[i]);
        double req = 1.0;
        if (e->inflight_requests > (uint64_t)cfg->idle_threshold)
            req = (double)(max_count - e->inflight_requests) / max_count * cfg->max_busy_score;
        double tok =
            max_tokens ? (double)(max_tokens - e->inflight_tokens) / (double)max_tokens : 1.0;
        out[i] = (1.0 - cfg->token_weight) * req + cfg->token_weight * tok;
    }
}

const struct rt_plugin_ops rt_active_request_scorer_ops = {
    .type = "active-request-scorer",
    .kind = RT_KIND_SCORER,
    .params = active_params,
    .n_params = RT_COUNT(active_params),
    .cfg_size = sizeof(struct active_cfg),
    .cfg_defaults = &active_defaults,
    .score = active_score,
};
