/* session-affinity-scorer: 1 for the endpoint the session's previous request
 * went to (in the same profile), 0 for every other; 0 for all when the
 * request has no session key (x-session-token header, else the "user"
 * field). llm-d round-trips the pod name through the x-session-token header;
 * Tandem keeps the session -> endpoint map in the router instead, so any
 * stable client key works.
 *
 * The map is a bounded 4-way set-associative table of maxSessions entries:
 * a new session may displace the least recently decided session of its set. */
#include <stdlib.h>
#include <xxhash.h>

#include "pipeline.h"
#include "tandem_err.h"

#define WAYS 4

struct session_cfg {
    int64_t max_sessions;
};

struct session_entry {
    uint64_t key; /* 0 = empty */
    uint64_t stamp;
    int32_t ep;
    uint32_t gen;
};

struct session_state {
    struct session_entry *sets; /* (n_sets, WAYS) */
    uint64_t mask;              /* n_sets - 1 */
    uint64_t clock;
};

static const struct session_cfg session_defaults = {.max_sessions = 65536};

static const struct rt_param_spec session_params[] = {
    RT_P_INT("maxSessions", struct session_cfg, max_sessions, WAYS, 1 << 24),
};

static int session_init(struct rt_plugin *p)
{
    const struct session_cfg *cfg = p->cfg;
    struct session_state *st = calloc(1, sizeof(*st));
    if (!st)
        return TANDEM_ENOMEM;
    p->state = st;
    uint64_t n_sets = 1;
    while (n_sets * WAYS < (uint64_t)cfg->max_sessions)
        n_sets <<= 1;
    st->mask = n_sets - 1;
    st->sets = calloc(n_sets * WAYS, sizeof(*st->sets));
    return st->sets ? 0 : TANDEM_ENOMEM;
}

static void session_fini(struct rt_plugin *p)
{
    struct session_state *st = p->state;
    if (st)
        free(st->sets);
    free(st);
}

static uint64_t session_key(const struct rt_request *req, int profile)
{
    uint64_t k = XXH3_64bits_withSeed(req->session, req->session_len, (uint64_t)profile + 1);
    return k ? k : 1;
}

static struct session_entry *lookup(struct session_state *st, uint64_t key)
{
    struct session_entry *set = &st->sets[(key & st->mask) * WAYS];
    for (int w = 0; w < WAYS; w++)
        if (set[w].key == key)
            return &set[w];
    return NULL;
}

static void session_score(struct rt_plugin *p, struct rt_cycle *c, const int *cands, int n,
                          double *out)
{
    struct session_state *st = p->state;
    const struct session_entry *e = NULL;
    if (c->req->session && c->req->session_len)
        e = lookup(st, session_key(c->req, c->profile));
    for (int i = 0; i < n; i++)
        out[i] =
            e && e->ep == cands[i] && rt_pipeline_ep(c->pl, cands[i])->gen == e->gen ? 1.0 : 0.0;
}

static void remember(struct session_state *st, uint64_t key, int ep, uint32_t gen)
{
    struct session_entry *set = &st->sets[(key & st->mask) * WAYS];
    struct session_entry *victim = &set[0];
    for (int w = 0; w < WAYS; w++) {
        if (set[w].key == key || set[w].key == 0) {
            victim = &set[w];
            break;
        }
        if (set[w].stamp < victim->stamp)
            victim = &set[w];
    }
    *victim = (struct session_entry){.key = key, .stamp = ++st->clock, .ep = ep, .gen = gen};
}

static void session_on_decision(struct rt_plugin *p, struct rt_cycle *c)
{
    struct session_state *st = p->state;
    if (!c->req->session || !c->req->session_len)
        return;
    for (int r = 0; r < c->dec->n_runs; r++) {
        const struct rt_profile_run *run = &c->dec->runs[r];
        if (run->picked < 0)
            continue;
        for (int s = 0; s < run->n_scorers; s++) {
            if (run->scorers[s] == p) {
                remember(st, session_key(c->req, run->profile), run->picked,
                         rt_pipeline_ep(c->pl, run->picked)->gen);
                break;
            }
        }
    }
}

const struct rt_plugin_ops rt_session_affinity_scorer_ops = {
    .type = "session-affinity-scorer",
    .kind = RT_KIND_SCORER,
    .params = session_params,
    .n_params = RT_COUNT(session_params),
    .cfg_size = sizeof(struct session_cfg),
    .cfg_defaults = &session_defaults,
    .init = session_init,
    .fini = session_fini,
    .score = session_score,
    .on_decision = session_on_decision,
};
