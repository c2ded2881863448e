/* Profile handlers: which profiles a decision runs, and in what order.
 *   single-profile-handler  the one profile picks the endpoint that prefills
 *                           and decodes (colocated); injected when there is
 *                           one profile and no handler, as in llm-d.
 *   pd-profile-handler      decode profile first (pick D), then the P/D
 *                           decider (counted against D), then, if it says
 *                           so, the prefill profile (pick P). A prefill
 *                           profile with no candidate, or one that picks D
 *                           itself, falls back to a local prefill on D. */
#include <stdlib.h>

#include "pipeline.h"
#include "tandem_err.h"

static int single_link(struct rt_plugin *p)
{
    int n = rt_pipeline_n_profiles(p->pl);
    if (n != 1)
        return rt_plugin_fail(p, NULL,
                              "runs exactly one scheduling profile, but %d are defined "
                              "(use pd-profile-handler for decode and prefill profiles)",
                              n);
    return 0;
}

static int single_run(struct rt_plugin *p, struct rt_cycle *c)
{
    int ep = rt_cycle_run_profile(c, 0);
    if (ep < 0)
        return ep;
    c->dec->decode = ep;
    c->dec->pd = RT_PD_SINGLE;
    c->dec->verdict.reason = RT_PD_REASON_NONE;
    return 0;
}

const struct rt_plugin_ops rt_single_profile_handler_ops = {
    .type = "single-profile-handler",
    .kind = RT_KIND_PROFILE_HANDLER,
    .link = single_link,
    .run = single_run,
};

struct pd_cfg {
    char decode_profile[RT_NAME_MAX];
    char prefill_profile[RT_NAME_MAX];
    char decider[RT_NAME_MAX];
    char prefix_plugin[RT_NAME_MAX];
};

struct pd_state {
    int decode, prefill;
    struct rt_plugin *decider;
};

static const struct pd_cfg pd_defaults = {
    .decode_profile = "decode",
    .prefill_profile = "prefill",
    .decider = "prefix-based-pd-decider",
    .prefix_plugin = "",
};

static const struct rt_param_spec pd_params[] = {
    RT_P_STRING("decodeProfile", struct pd_cfg, decode_profile),
    RT_P_STRING("prefillProfile", struct pd_cfg, prefill_profile),
    RT_P_STRING("deciderPluginName", struct pd_cfg, decider),
    RT_P_STRING("prefixPluginName", struct pd_cfg, prefix_plugin),
};

static int pd_init(struct rt_plugin *p)
{
    p->state = calloc(1, sizeof(struct pd_state));
    return p->state ? 0 : TANDEM_ENOMEM;
}

static void pd_fini(struct rt_plugin *p)
{
    free(p->state);
}

/* The decider named by deciderPluginName; when that is the default and no
 * plugin has that name, the only decider defined. */
static int find_decider(struct rt_plugin *p, struct rt_plugin **out)
{
    const struct pd_cfg *cfg = p->cfg;
    struct rt_plugin *d = rt_pipeline_plugin_mut(p->pl, cfg->decider);
    if (d) {
        if (d->ops->kind != RT_KIND_DECIDER)
            return rt_plugin_fail(p, "deciderPluginName", "plugin '%s' (type %s) is not a decider",
                                  d->name, d->ops->type);
        *out = d;
        return 0;
    }
    if (rt_plugin_param_set(p, "deciderPluginName"))
        return rt_plugin_fail(p, "deciderPluginName", "no plugin is named '%s'", cfg->decider);
    struct rt_plugin *only = NULL;
    for (int i = 0; i < rt_pipeline_n_plugins(p->pl); i++) {
        struct rt_plugin *x = rt_pipeline_plugin_at(p->pl, i);
        if (x->ops->kind != RT_KIND_DECIDER)
            continue;
        if (only)
            return rt_plugin_fail(p, NULL,
                                  "no plugin is named '%s' and several deciders are defined "
                                  "('%s', '%s'): name one with deciderPluginName",
                                  cfg->decider, only->name, x->name);
        only = x;
    }
    if (!only)
        return rt_plugin_fail(p, NULL,
                              "needs a P/D decider: define a 'prefix-based-pd-decider' plugin "
                              "(or another decider and name it with deciderPluginName)");
    *out = only;
    return 0;
}

static int pd_link(struct rt_plugin *p)
{
    const struct pd_cfg *cfg = p->cfg;
    struct pd_state *st = p->state;
    st->decode = rt_pipeline_find_profile(p->pl, cfg->decode_profile);
    if (st->decode < 0)
        return rt_plugin_fail(p, "decodeProfile", "no schedulingProfile is named '%s'",
                              cfg->decode_profile);
    st->prefill = rt_pipeline_find_profile(p->pl, cfg->prefill_profile);
    if (st->prefill < 0)
        return rt_plugin_fail(p, "prefillProfile", "no schedulingProfile is named '%s'",
                              cfg->prefill_profile);
    if (st->prefill == st->decode)
        return rt_plugin_fail(p, "prefillProfile", "'%s' is also the decode profile",
                              cfg->prefill_profile);
    int rc = find_decider(p, &st->decider);
    if (rc < 0)
        return rc;
    if (cfg->prefix_plugin[0]) {
        struct rt_plugin *x = rt_pipeline_plugin_mut(p->pl, cfg->prefix_plugin);
        if (!x)
            return rt_plugin_fail(p, "prefixPluginName", "no plugin is named '%s'",
                                  cfg->prefix_plugin);
        if (!x->ops->cached_blocks)
            return rt_plugin_fail(p, "prefixPluginName",
                                  "plugin '%s' (type %s) is not a prefix-cache-scorer", x->name,
                                  x->ops->type);
        rt_pipeline_set_prefix_source(p->pl, x);
    }
    return 0;
}

static int pd_run(struct rt_plugin *p, struct rt_cycle *c)
{
    struct pd_state *st = p->state;
    struct rt_decision *d = c->dec;
    int dec_ep = rt_cycle_run_profile(c, st->decode);
    if (dec_ep < 0)
        return dec_ep;
    d->decode = dec_ep;
    d->decider = st->decider;
    struct rt_pd_verdict v = {.prompt_tokens = c->req->n_tokens, .remote_ep = -1};
    int cached = rt_cycle_cached_tokens(c, dec_ep);
    v.uncached_tokens = c->req->n_tokens - (cached > 0 ? cached : 0);
    st->decider->ops->decide(st->decider, c, dec_ep, &v);
    d->pd = RT_PD_LOCAL;
    if (v.disaggregate) {
        int pre_ep = rt_cycle_run_profile(c, st->prefill);
        if (pre_ep < 0) {
            v.disaggregate = 0;
            v.reason = RT_PD_REASON_NO_PREFILL_ENDPOINT;
        } else if (pre_ep == dec_ep) {
            v.disaggregate = 0;
            v.reason = RT_PD_REASON_SAME_ENDPOINT;
        } else {
            d->prefill = pre_ep;
            d->pd = RT_PD_REMOTE;
        }
    }
    d->verdict = v;
    return 0;
}

const struct rt_plugin_ops rt_pd_profile_handler_ops = {
    .type = "pd-profile-handler",
    .kind = RT_KIND_PROFILE_HANDLER,
    .params = pd_params,
    .n_params = RT_COUNT(pd_params),
    .cfg_size = sizeof(struct pd_cfg),
    .cfg_defaults = &pd_defaults,
    .init = pd_init,
    .link = pd_link,
    .fini = pd_fini,
    .run = pd_run,
};
