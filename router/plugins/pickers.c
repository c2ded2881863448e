/* Pickers: choose one candidate from the weighted totals.
 *   max-score-picker        highest total, ties broken uniformly at random
 *   random-picker           uniform
 *   weighted-random-picker  probability proportional to the total (uniform when all <= 0)
 *   round-robin-picker      next endpoint index after the last pick, in rotation
 *   power-of-two-picker     two distinct random candidates, the less loaded one
 * Draws come from the pipeline's seeded random source; a lone candidate is
 * returned without drawing. */
#include <stdlib.h>

#include "pipeline.h"
#include "tandem_err.h"

/* llm-d's pickers can return several endpoints; the router sends a request to one. */
struct picker_cfg {
    int64_t max_endpoints;
};

static const struct picker_cfg picker_defaults = {.max_endpoints = 1};

static const struct rt_param_spec picker_params[] = {
    RT_P_INT("maxNumOfEndpoints", struct picker_cfg, max_endpoints, 1, 1),
};

static int max_score_pick(struct rt_plugin *p, struct rt_cycle *c, const int *cands,
                          const double *total, int n)
{
    int *ties = rt_pipeline_scratch(c->pl);
    int k = 0;
    double best = total[0];
    for (int i = 0; i < n; i++) {
        if (total[i] > best) {
            best = total[i];
            k = 0;
        }
        if (total[i] == best)
            ties[k++] = i;
    }
    return k == 1 ? ties[0] : ties[rt_pipeline_rand_below(c->pl, (uint32_t)k)];
}

const struct rt_plugin_ops rt_max_score_picker_ops = {
    .type = "max-score-picker",
    .kind = RT_KIND_PICKER,
    .params = picker_params,
    .n_params = RT_COUNT(picker_params),
    .cfg_size = sizeof(struct picker_cfg),
    .cfg_defaults = &picker_defaults,
    .pick = max_score_pick,
};

static int random_pick(struct rt_plugin *p, struct rt_cycle *c, const int *cands,
                       const double *total, int n)
{
    return n == 1 ? 0 : (int)rt_pipeline_rand_below(c->pl, (uint32_t)n);
}

const struct rt_plugin_ops rt_random_picker_ops = {
    .type = "random-picker",
    .kind = RT_KIND_PICKER,
    .params = picker_params,
    .n_params = RT_COUNT(picker_params),
    .cfg_size = sizeof(struct picker_cfg),
    .cfg_defaults = &picker_defaults,
    .pick = random_pick,
};

static int weighted_random_pick(struct rt_plugin *p, struct rt_cycle *c, const int *cands,
                                const double *total, int n)
{
    if (n == 1)
        return 0;
    double sum = 0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (total[i] > 0) {
            sum += total[i];
            last = i;
        }
    }
    if (last < 0)
        return (int)rt_pipeline_rand_below(c->pl, (uint32_t)n);
    double r = rt_pipeline_rand01(c->pl) * sum;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        if (total[i] <= 0)
            continue;
        acc += total[i];
        if (r < acc)
            return i;
    }
    return last; /* rounding */
}

const struct rt_plugin_ops rt_weighted_random_picker_ops = {
    .type = "weighted-random-picker",
    .kind = RT_KIND_PICKER,
    .params = picker_params,
    .n_params = RT_COUNT(picker_params),
    .cfg_size = sizeof(struct picker_cfg),
    .cfg_defaults = &picker_defaults,
    .pick = weighted_random_pick,
};

/* The cursor is the endpoint index last picked, one per profile, so a
 * changing candidate set (health, filters) keeps the rotation fair. */
struct rr_state {
    int last[RT_MAX_PROFILES];
};

static int rr_init(struct rt_plugin *p)
{
    struct rr_state *st = malloc(sizeof(*st));
    if (!st)
        return TANDEM_ENOMEM;
    for (int i = 0; i < RT_MAX_PROFILES; i++)
        st->last[i] = -1;
    p->state = st;
    return 0;
}

static void rr_fini(struct rt_plugin *p)
{
    free(p->state);
}

static int rr_pick(struct rt_plugin *p, struct rt_cycle *c, const int *cands, const double *total,
                   int n)
{
    struct rr_state *st = p->state;
    int prof = c->profile >= 0 && c->profile < RT_MAX_PROFILES ? c->profile : 0;
    int last = st->last[prof];
    int next = -1, first = 0;
    for (int i = 0; i < n; i++) {
        if (cands[i] < cands[first])
            first = i;
        if (cands[i] > last && (next < 0 || cands[i] < cands[next]))
            next = i;
    }
    int pos = next >= 0 ? next : first;
    st->last[prof] = cands[pos];
    return pos;
}

const struct rt_plugin_ops rt_round_robin_picker_ops = {
    .type = "round-robin-picker",
    .kind = RT_KIND_PICKER,
    .init = rr_init,
    .fini = rr_fini,
    .pick = rr_pick,
};

/* Lexicographic load: router-tracked in-flight requests, then in-flight
 * tokens, then the heartbeat's waiting + running. Negative when a is lighter. */
static int load_cmp(const struct rt_endpoint *a, const struct rt_endpoint *b)
{
    if (a->inflight_requests != b->inflight_requests)
        return a->inflight_requests < b->inflight_requests ? -1 : 1;
    if (a->inflight_tokens != b->inflight_tokens)
        return a->inflight_tokens < b->inflight_tokens ? -1 : 1;
    uint64_t la = (uint64_t)a->load.waiting + a->load.running;
    uint64_t lb = (uint64_t)b->load.waiting + b->load.running;
    if (la != lb)
        return la < lb ? -1 : 1;
    return 0;
}

static int p2c_pick(struct rt_plugin *p, struct rt_cycle *c, const int *cands, const double *total,
                    int n)
{
    if (n == 1)
        return 0;
    int a = (int)rt_pipeline_rand_below(c->pl, (uint32_t)n);
    int b = (int)rt_pipeline_rand_below(c->pl, (uint32_t)n - 1);
    if (b >= a)
        b++;
    return load_cmp(rt_pipeline_ep(c->pl, cands[b]), rt_pipeline_ep(c->pl, cands[a])) < 0 ? b : a;
}

const struct rt_plugin_ops rt_power_of_two_picker_ops = {
    .type = "power-of-two-picker",
    .kind = RT_KIND_PICKER,
    .pick = p2c_pick,
};
