/* prefix-cache-scorer (and its precise-mode alias precise-prefix-cache-scorer):
 * score = leading blocks of the prompt an endpoint holds / blocks considered.
 *
 * mode approx: the index learns from the router's own decisions (the decode
 * endpoint, and the prefill endpoint of a remote prefill, are recorded as
 * holding the request's blocks), LRU-bounded per endpoint by
 * lruCapacityPerServer, as llm-d's prefix-cache-scorer.
 * mode precise: the index mirrors the workers' KV events
 * (rt_pipeline_kv_event), as llm-d's precise-prefix-cache-scorer.
 *
 * The first prefix plugin (or the one pd-profile-handler's prefixPluginName
 * names) is the pipeline's prefix source: the P/D deciders and the decision
 * record's predicted cached tokens read its matches. */
#include <stdlib.h>

#include "block_hash.h"
#include "log.h"
#include "pipeline.h"
#include "prefix_index.h"
#include "tandem_err.h"

enum { MODE_APPROX = 0, MODE_PRECISE = 1 };

#define APPROX_DEFAULT_CAPACITY  31250     /* llm-d's lruCapacityPerServer default */
#define PRECISE_DEFAULT_CAPACITY (1 << 20) /* memory bound only */

struct prefix_cfg {
    int mode;
    int64_t block_size;
    int64_t capacity;   /* 0: the mode's default */
    int64_t max_blocks; /* 0: every block of the prompt */
};

struct prefix_state {
    struct rt_prefix_index *ix;
    uint32_t *matched; /* (max_endpoints) leading blocks held, for seq */
    uint64_t seq;      /* decision the matches belong to, 0 = none */
    int considered;    /* blocks of the request considered */
    int warned_block_size;
};

static const char *const modes[] = {"approx", "precise", NULL};

static const struct prefix_cfg approx_defaults = {
    .mode = MODE_APPROX,
    .block_size = BH_DEFAULT_BLOCK_SIZE,
};

static const struct prefix_cfg precise_defaults = {
    .mode = MODE_PRECISE,
    .block_size = BH_DEFAULT_BLOCK_SIZE,
};

static const struct rt_param_spec prefix_params[] = {
    RT_P_ENUM("mode", struct prefix_cfg, mode, modes),
    RT_P_INT("blockSize", struct prefix_cfg, block_size, 1, BH_MAX_BLOCK_SIZE),
    RT_P_INT("blockSizeTokens", struct prefix_cfg, block_size, 1, BH_MAX_BLOCK_SIZE),
    RT_P_INT("hashBlockSize", struct prefix_cfg, block_size, 1, BH_MAX_BLOCK_SIZE),
    RT_P_INT("lruCapacityPerServer", struct prefix_cfg, capacity, 1, 1 << 30),
    RT_P_INT("maxPrefixBlocksToMatch", struct prefix_cfg, max_blocks, 0, 1 << 30),
};

/* llm-d's precise scorer nests these under indexerConfig/tokenProcessorConfig. */
static const struct rt_param_spec precise_params[] = {
    RT_P_INT("blockSize", struct prefix_cfg, block_size, 1, BH_MAX_BLOCK_SIZE),
    RT_P_INT("tokenProcessorConfig.blockSize", struct prefix_cfg, block_size, 1, BH_MAX_BLOCK_SIZE),
    RT_P_INT("indexerConfig.tokenProcessorConfig.blockSize", struct prefix_cfg, block_size, 1,
             BH_MAX_BLOCK_SIZE),
    RT_P_INT("maxPrefixBlocksToMatch", struct prefix_cfg, max_blocks, 0, 1 << 30),
    RT_P_INT("indexerConfig.kvBlockIndexConfig.maxPrefixBlocksToMatch", struct prefix_cfg,
             max_blocks, 0, 1 << 30),
    RT_P_INT("lruCapacityPerServer", struct prefix_cfg, capacity, 1, 1 << 30),
};

static int prefix_init(struct rt_plugin *p)
{
    struct prefix_cfg *cfg = p->cfg;
    if (!cfg->capacity)
        cfg->capacity =
            cfg->mode == MODE_APPROX ? APPROX_DEFAULT_CAPACITY : PRECISE_DEFAULT_CAPACITY;
    struct prefix_state *st = calloc(1, sizeof(*st));
    if (!st)
        return TANDEM_ENOMEM;
    p->state = st;
    int max_eps = rt_pipeline_max_endpoints(p->pl);
    st->matched = calloc((size_t)max_eps, sizeof(*st->matched));
    if (!st->matched)
        return TANDEM_ENOMEM;
    return rt_prefix_index_create(&st->ix, max_eps, (uint32_t)cfg->capacity);
}

static void prefix_fini(struct rt_plugin *p)
{
    struct prefix_state *st = p->state;
    if (!st)
        return;
    rt_prefix_index_destroy(st->ix);
    free(st->matched);
    free(st);
}

static int considered_blocks(const struct prefix_cfg *cfg, const struct rt_request *req)
{
    int n = req->n_blocks;
    if (cfg->max_blocks && n > cfg->max_blocks)
        n = (int)cfg->max_blocks;
    return n;
}

/* Matches every endpoint once per decision. */
static void ensure_matched(struct rt_plugin *p, struct rt_cycle *c)
{
    struct prefix_state *st = p->state;
    if (st->seq == c->seq)
        return;
    st->seq = c->seq;
    st->considered = considered_blocks(p->cfg, c->req);
    rt_prefix_index_match(st->ix, c->req->block_hashes, st->considered, st->matched);
}

static void prefix_score(struct rt_plugin *p, struct rt_cycle *c, const int *cands, int n,
                         double *out)
{
    struct prefix_state *st = p->state;
    ensure_matched(p, c);
    for (int i = 0; i < n; i++)
        out[i] = st->considered ? (double)st->matched[cands[i]] / st->considered : 0.0;
}

static int prefix_cached_blocks(struct rt_plugin *p, struct rt_cycle *c, int ep)
{
    struct prefix_state *st = p->state;
    ensure_matched(p, c);
    return (int)st->matched[ep];
}

static int prefix_block_size(const struct rt_plugin *p)
{
    const struct prefix_cfg *cfg = p->cfg;
    return (int)cfg->block_size;
}

static void prefix_on_decision(struct rt_plugin *p, struct rt_cycle *c)
{
    const struct prefix_cfg *cfg = p->cfg;
    struct prefix_state *st = p->state;
    if (cfg->mode != MODE_APPROX)
        return;
    int n = considered_blocks(cfg, c->req);
    /* Both ends of a remote prefill hold the prompt afterwards. */
    if (rt_prefix_index_touch(st->ix, c->dec->decode, c->req->block_hashes, n) < 0 ||
        (c->dec->prefill >= 0 &&
         rt_prefix_index_touch(st->ix, c->dec->prefill, c->req->block_hashes, n) < 0))
        LOG_WARN("router", "prefix-cache-scorer '%s': out of memory learning a decision", p->name);
}

static void prefix_on_endpoint(struct rt_plugin *p, int ep, enum rt_ep_event ev)
{
    struct prefix_state *st = p->state;
    const struct prefix_cfg *cfg = p->cfg;
    rt_prefix_index_clear_endpoint(st->ix, ep);
    st->seq = 0;
    const struct rt_endpoint *e = rt_pipeline_endpoint(p->pl, ep);
    if (ev == RT_EP_ADDED && e && e->block_size != cfg->block_size && !st->warned_block_size) {
        st->warned_block_size = 1;
        LOG_WARN("router",
                 "prefix-cache-scorer '%s': endpoint %s has block size %d, the router hashes "
                 "with %d: its prefix matches will be wrong",
                 p->name, e->id, e->block_size, (int)cfg->block_size);
    }
}

static int prefix_on_kv_event(struct rt_plugin *p, int ep, enum rt_kv_event ev,
                              const uint64_t *hashes, int n)
{
    const struct prefix_cfg *cfg = p->cfg;
    struct prefix_state *st = p->state;
    if (cfg->mode != MODE_PRECISE)
        return 0;
    st->seq = 0;
    switch (ev) {
    case RT_KV_STORED:
        return rt_prefix_index_store(st->ix, ep, hashes, n);
    case RT_KV_REMOVED:
        return rt_prefix_index_remove(st->ix, ep, hashes, n);
    case RT_KV_ALL_CLEARED:
        rt_prefix_index_clear_endpoint(st->ix, ep);
        return 0;
    }
    return TANDEM_EINVAL;
}

const struct rt_plugin_ops rt_prefix_cache_scorer_ops = {
    .type = "prefix-cache-scorer",
    .kind = RT_KIND_SCORER,
    .params = prefix_params,
    .n_params = RT_COUNT(prefix_params),
    .cfg_size = sizeof(struct prefix_cfg),
    .cfg_defaults = &approx_defaults,
    .init = prefix_init,
    .fini = prefix_fini,
    .score = prefix_score,
    .cached_blocks = prefix_cached_blocks,
    .block_size = prefix_block_size,
    .on_decision = prefix_on_decision,
    .on_endpoint = prefix_on_endpoint,
    .on_kv_event = prefix_on_kv_event,
};

const struct rt_plugin_ops rt_precise_prefix_cache_scorer_ops = {
    .type = "precise-prefix-cache-scorer",
    .kind = RT_KIND_SCORER,
    .params = precise_params,
    .n_params = RT_COUNT(precise_params),
    .cfg_size = sizeof(struct prefix_cfg),
    .cfg_defaults = &precise_defaults,
    .init = prefix_init,
    .fini = prefix_fini,
    .score = prefix_score,
    .cached_blocks = prefix_cached_blocks,
    .block_size = prefix_block_size,
    .on_decision = prefix_on_decision,
    .on_endpoint = prefix_on_endpoint,
    .on_kv_event = prefix_on_kv_event,
};
