/* P/D deciders, asked by pd-profile-handler once D is picked: is this prompt
 * worth a remote prefill? (docs/routing.md "P/D deciders" has the formulas.)
 *   prefix-based-pd-decider   llm-d's: yes when the prompt tokens not cached
 *                             on D reach nonCachedTokens (0: always yes);
 *                             Tandem adds promptTokens, a minimum prompt.
 *   always-disagg-pd-decider  yes.
 *   never-disagg-pd-decider   no (P/D deployment that prefills on D).
 *   load-aware-pd-decider     Tandem's: yes when enough tokens are uncached
 *                             on D AND a remote prefill is expected to give
 *                             the first token sooner, from the endpoints'
 *                             queued prefill work and D's decode load. */
#include "pipeline.h"
#include "tandem_err.h"

struct prefix_decider_cfg {
    int64_t non_cached_tokens;
    int64_t prompt_tokens;
};

static const struct prefix_decider_cfg prefix_decider_defaults = {
    .non_cached_tokens = 0,
    .prompt_tokens = 0,
};

static const struct rt_param_spec prefix_decider_params[] = {
    RT_P_INT("nonCachedTokens", struct prefix_decider_cfg, non_cached_tokens, 0, 1e9),
    RT_P_INT("promptTokens", struct prefix_decider_cfg, prompt_tokens, 0, 1e9),
};

static int needs_prefix_source(struct rt_plugin *p, const char *param)
{
    if (rt_pipeline_has_prefix_source(p->pl))
        return 0;
    return rt_plugin_fail(p, param,
                          "counts tokens cached on the decode endpoint, which needs a "
                          "prefix-cache-scorer plugin under 'plugins'");
}

static int prefix_decider_link(struct rt_plugin *p)
{
    const struct prefix_decider_cfg *cfg = p->cfg;
    if (cfg->non_cached_tokens > 0)
        return needs_prefix_source(p, "nonCachedTokens");
    return 0;
}

static void prefix_decide(struct rt_plugin *p, struct rt_cycle *c, int decode_ep,
                          struct rt_pd_verdict *v)
{
    const struct prefix_decider_cfg *cfg = p->cfg;
    if (v->prompt_tokens < cfg->prompt_tokens) {
        v->disaggregate = 0;
        v->reason = RT_PD_REASON_SHORT_PROMPT;
    } else if (v->uncached_tokens < cfg->non_cached_tokens) {
        v->disaggregate = 0;
        v->reason = RT_PD_REASON_CACHED_ON_DECODE;
    } else {
        v->disaggregate = 1;
        v->reason = RT_PD_REASON_ENOUGH_UNCACHED;
    }
}

const struct rt_plugin_ops rt_prefix_based_pd_decider_ops = {
    .type = "prefix-based-pd-decider",
    .kind = RT_KIND_DECIDER,
    .params = prefix_decider_params,
    .n_params = RT_COUNT(prefix_decider_params),
    .cfg_size = sizeof(struct prefix_decider_cfg),
    .cfg_defaults = &prefix_decider_defaults,
    .link = prefix_decider_link,
    .decide = prefix_decide,
};

static void always_decide(struct rt_plugin *p, struct rt_cycle *c, int decode_ep,
                          struct rt_pd_verdict *v)
{
    v->disaggregate = 1;
    v->reason = RT_PD_REASON_ALWAYS;
}

const struct rt_plugin_ops rt_always_disagg_pd_decider_ops = {
    .type = "always-disagg-pd-decider",
    .kind = RT_KIND_DECIDER,
    .decide = always_decide,
};

static void never_decide(struct rt_plugin *p, struct rt_cycle *c, int decode_ep,
                         struct rt_pd_verdict *v)
{
    v->disaggregate = 0;
    v->reason = RT_PD_REASON_NEVER;
}

const struct rt_plugin_ops rt_never_disagg_pd_decider_ops = {
    .type = "never-disagg-pd-decider",
    .kind = RT_KIND_DECIDER,
    .decide = never_decide,
};

struct load_decider_cfg {
    int64_t non_cached_tokens;
    int64_t prompt_tokens;
    double transfer_overhead;   /* prefill-token equivalents per remote prefill */
    double decode_interference; /* local prefill slowdown at a full decode batch */
    double prefill_speed_ratio; /* P's prefill throughput / D's */
};

static const struct load_decider_cfg load_decider_defaults = {
    .non_cached_tokens = 256,
    .prompt_tokens = 0,
    .transfer_overhead = 64,
    .decode_interference = 1.0,
    .prefill_speed_ratio = 1.0,
};

static const struct rt_param_spec load_decider_params[] = {
    RT_P_INT("nonCachedTokens", struct load_decider_cfg, non_cached_tokens, 0, 1e9),
    RT_P_INT("promptTokens", struct load_decider_cfg, prompt_tokens, 0, 1e9),
    RT_P_DOUBLE("transferOverheadTokens", struct load_decider_cfg, transfer_overhead, 0, 1e9),
    RT_P_DOUBLE("decodeInterference", struct load_decider_cfg, decode_interference, 0, 1000),
    RT_P_DOUBLE("prefillSpeedRatio", struct load_decider_cfg, prefill_speed_ratio, 0.01, 100),
};

static int load_decider_link(struct rt_plugin *p)
{
    return needs_prefix_source(p, NULL);
}

/* Prefill work an endpoint has ahead of a new prompt: the heartbeat's queue,
 * or the router's own count when decisions since the heartbeat added more. */
static double pending_prefill(const struct rt_endpoint *e)
{
    uint64_t q = e->load.prefill_tokens_queued;
    return (double)(e->inflight_prefill_tokens > q ? e->inflight_prefill_tokens : q);
}

/* How busy D's decode batch is, in [0, 1]. */
static double decode_busy(const struct rt_endpoint *e)
{
    double b = e->max_running ? (double)e->load.running / e->max_running : rt_endpoint_kv_usage(e);
    return b > 1 ? 1 : b;
}

static void load_decide(struct rt_plugin *p, struct rt_cycle *c, int decode_ep,
                        struct rt_pd_verdict *v)
{
    const struct load_decider_cfg *cfg = p->cfg;
    v->disaggregate = 0;
    if (v->prompt_tokens < cfg->prompt_tokens) {
        v->reason = RT_PD_REASON_SHORT_PROMPT;
        return;
    }
    if (v->uncached_tokens < cfg->non_cached_tokens) {
        v->reason = RT_PD_REASON_CACHED_ON_DECODE;
        return;
    }
    const struct rt_endpoint *d = rt_pipeline_ep(c->pl, decode_ep);
    v->local_cost =
        pending_prefill(d) + v->uncached_tokens * (1.0 + cfg->decode_interference * decode_busy(d));
    int nb;
    const int *base = rt_cycle_base(c, &nb);
    for (int i = 0; i < nb; i++) {
        const struct rt_endpoint *e = rt_pipeline_ep(c->pl, base[i]);
        if (!rt_role_can_prefill_remote(e->role))
            continue;
        int cached = rt_cycle_cached_tokens(c, base[i]);
        double work = pending_prefill(e) + (v->prompt_tokens - (cached > 0 ? cached : 0));
        double cost = work / cfg->prefill_speed_ratio + cfg->transfer_overhead;
        if (v->remote_ep < 0 || cost < v->remote_cost) {
            v->remote_cost = cost;
            v->remote_ep = base[i];
        }
    }
    if (v->remote_ep < 0) {
        v->reason = RT_PD_REASON_NO_PREFILL_ENDPOINT;
        return;
    }
    v->disaggregate = v->remote_cost < v->local_cost;
    v->reason = v->disaggregate ? RT_PD_REASON_REMOTE_FASTER : RT_PD_REASON_LOCAL_FASTER;
}

const struct rt_plugin_ops rt_load_aware_pd_decider_ops = {
    .type = "load-aware-pd-decider",
    .kind = RT_KIND_DECIDER,
    .params = load_decider_params,
    .n_params = RT_COUNT(load_decider_params),
    .cfg_size = sizeof(struct load_decider_cfg),
    .cfg_defaults = &load_decider_defaults,
    .link = load_decider_link,
    .decide = load_decide,
};
