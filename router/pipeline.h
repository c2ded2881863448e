/* The router's scheduling pipeline, after llm-d's EndpointPickerConfig:
 * plugins (filters, scorers, pickers, a profile handler, P/D deciders) and
 * scheduling profiles that list filters, weighted scorers and one picker.
 *
 * One decision (rt_pipeline_decide) runs the profile handler, which runs
 * profiles: each profile filters the healthy endpoints, scores the survivors
 * with every scorer (scores in [0, 1]), sums weight x score, and lets its
 * picker choose. The disaggregated handler (pd-profile-handler) runs the
 * decode profile first (pick D), asks its decider whether the prompt is worth
 * a remote prefill, and if so runs the prefill profile (pick P). The pipeline
 * then charges the chosen endpoints' router-side in-flight counters, so the
 * next decision, before any heartbeat, sees this one; lets plugins learn
 * (the approximate prefix index, session affinity, round-robin cursors); and
 * returns a record of everything it looked at (struct rt_decision).
 *
 * Costs: a decision is O(endpoints x scorers + prompt blocks) and allocates
 * nothing: every buffer is sized for max_endpoints when the pipeline is
 * created (the approximate prefix index grows its node pool by doubling
 * until endpoints reach their capacity, then only recycles).
 *
 * Plugins: one `const struct rt_plugin_ops` each, filled with designated
 * initialisers, listed once in router/plugins/plugin_table.c. docs/routing.md
 * documents every plugin, parameter and formula.
 *
 * Threading: a pipeline is not locked. Create it, and call every function,
 * on one thread (the router's loop thread). */
#ifndef TANDEM_RT_PIPELINE_H
#define TANDEM_RT_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "endpoint.h"

#define RT_NAME_MAX              64 /* plugin and profile names, with the NUL */
#define RT_MAX_PLUGINS           64 /* plugin instances, injected defaults included */
#define RT_MAX_PROFILES          8  /* scheduling profiles */
#define RT_MAX_PROFILE_PLUGINS   16 /* filters + scorers + picker in one profile */
#define RT_MAX_RUNS              2  /* profile runs per decision (decode, prefill) */
#define RT_RESPONSE_ID_MAX       48 /* bytes of a decision's response id, with the NUL */
#define RT_DEFAULT_MAX_ENDPOINTS 1024
#define RT_MAX_ENDPOINTS         65536

struct rt_pipeline;
struct rt_plugin;
struct rt_cycle;

/* ------------------------------------------------------------------ */
/* Requests and decisions                                               */
/* ------------------------------------------------------------------ */

/* A request as the pipeline sees it. Nothing is retained after decide. */
struct rt_request {
    uint64_t id;             /* router request id, for records and logs */
    const char *response_id; /* the answer's id ("cmpl-..."), copied into the decision
                                record so a client can find its own; NULL: none */
    const uint32_t *tokens;  /* (n_tokens) prompt token ids */
    int n_tokens;
    const uint64_t *block_hashes; /* (n_blocks) bh_hash_prompt() of the prompt at
                                     rt_pipeline_block_size(); may be NULL/0 when
                                     rt_pipeline_uses_hashes() is 0 */
    int n_blocks;
    const char *session; /* x-session-token header, else the OpenAI "user"
                            field, else NULL */
    size_t session_len;
    uint32_t max_tokens; /* completion budget */
    const int *exclude;  /* (n_exclude) endpoint indices not to pick (a retry
                            after a failure or a busy answer) */
    int n_exclude;
};

enum rt_pd_mode {
    RT_PD_SINGLE = 0, /* single profile: the endpoint prefills and decodes (colocated) */
    RT_PD_LOCAL,      /* P/D handler, decider said no: D prefills locally */
    RT_PD_REMOTE,     /* P/D handler, remote prefill on P, KV shipped to D */
};

/* Why the P/D decision went the way it did. */
#define RT_PD_REASONS(X)                                                                           \
    X(NONE, "single-profile")                                                                      \
    X(ALWAYS, "always")                                                                            \
    X(NEVER, "never")                                                                              \
    X(SHORT_PROMPT, "prompt-below-promptTokens")                                                   \
    X(CACHED_ON_DECODE, "uncached-below-nonCachedTokens")                                          \
    X(ENOUGH_UNCACHED, "uncached-above-thresholds")                                                \
    X(REMOTE_FASTER, "remote-prefill-faster")                                                      \
    X(LOCAL_FASTER, "local-prefill-faster")                                                        \
    X(NO_PREFILL_ENDPOINT, "no-prefill-endpoint")                                                  \
    X(SAME_ENDPOINT, "prefill-picked-decode-endpoint")

enum rt_pd_reason {
#define RT_X(name, text) RT_PD_REASON_##name,
    RT_PD_REASONS(RT_X)
#undef RT_X
        RT_PD_REASON_COUNT
};

/* A decider's answer and the numbers behind it. */
struct rt_pd_verdict {
    int disaggregate;
    enum rt_pd_reason reason;
    int prompt_tokens;
    int uncached_tokens; /* prompt tokens not predicted cached on D */
    double local_cost;   /* load-aware decider: estimated TTFT of a local prefill, in
                            prefill-token equivalents; 0 for other deciders */
    double remote_cost;  /* same for the best remote prefill */
    int remote_ep;       /* endpoint with that best remote cost, -1 */
};

/* What the router keeps per request (a plain copy of decision->ticket) to
 * release the in-flight accounting and report the cached tokens later. */
struct rt_ticket {
    uint64_t seq;
    int decode, prefill;                    /* endpoint indices (prefill -1 when local) */
    uint32_t decode_gen, prefill_gen;       /* slot generations at decision time */
    uint64_t decode_tokens, prefill_tokens; /* added to inflight_tokens */
    uint64_t decode_work, prefill_work;     /* added to inflight_prefill_tokens */
    int predicted_cached_decode;            /* tokens, -1 when no prefix index */
    int actual_cached_decode;               /* -1 until rt_pipeline_report_cached */
    unsigned released;                      /* RT_RELEASE_* bits done */
};

#define RT_RELEASE_PREFILL 1u /* prefill is over (first token): P and D's prefill work */
#define RT_RELEASE_ALL     3u /* the request is over: everything */

/* One profile run. Arrays point into the pipeline's scratch: valid until the
 * next rt_pipeline_decide. */
struct rt_profile_run {
    int profile;
    const char *profile_name;
    int n_candidates;
    const int *candidates; /* (n_candidates) endpoint indices, after filters */
    int n_scorers;
    const struct rt_plugin *const *scorers; /* (n_scorers) */
    const double *weights;                  /* (n_scorers) */
    const double *raw;                      /* (n_candidates, n_scorers) scores in [0, 1] */
    const double *total;                    /* (n_candidates) sum of weight x raw */
    const struct rt_plugin *picker;
    int picked;     /* endpoint index, -1 when no candidate survived the filters */
    int picked_pos; /* its position in candidates, -1 */
};

struct rt_decision {
    uint64_t seq; /* 1, 2, ... per pipeline */
    uint64_t request_id;
    char response_id[RT_RESPONSE_ID_MAX]; /* rt_request.response_id, "" when none */
    int decode;  /* endpoint that decodes (and prefills unless RT_PD_REMOTE) */
    int prefill; /* remote prefill endpoint, -1 */
    enum rt_pd_mode pd;
    const struct rt_plugin *decider; /* NULL under single-profile */
    struct rt_pd_verdict verdict;
    int prompt_tokens;
    int predicted_cached_decode;  /* tokens D is predicted to hold, -1 = no prefix index */
    int predicted_cached_prefill; /* same for P, -1 */
    int actual_cached_decode;     /* -1: the worker reports later (see the ticket) */
    int n_runs;
    struct rt_profile_run runs[RT_MAX_RUNS];
    struct rt_ticket ticket;
    uint64_t latency_ns; /* time spent in rt_pipeline_decide */
};

struct rt_pipeline_stats {
    uint64_t decisions; /* successful */
    uint64_t failures;  /* no endpoint (TANDEM_ENOENT) */
    uint64_t pd_single, pd_local, pd_remote;
    uint64_t cached_reports;                  /* rt_pipeline_report_cached calls counted */
    uint64_t predicted_tokens, actual_tokens; /* sums over the reports */
    uint64_t abs_error_tokens;                /* sum |predicted - actual| */
    uint64_t exact_predictions;
};

/* ------------------------------------------------------------------ */
/* Creating a pipeline                                                  */
/* ------------------------------------------------------------------ */

struct rt_pipeline_opts {
    int max_endpoints; /* endpoint slots, 0 = RT_DEFAULT_MAX_ENDPOINTS */
    uint64_t seed;     /* random tie-breaks and random plugins; 0 = from the clock */
};

/* Builds a pipeline from a parsed configuration: resolves plugin types and
 * parameters, profiles and references, injects the defaults llm-d injects
 * (max-score-picker in a profile without a picker; single-profile-handler
 * when there is one profile and no handler). cfg is not retained. On success
 * *out is owned by the caller (rt_pipeline_destroy). Errors: TANDEM_ECONFIG
 * with "<file>:<line>: ..." in err naming the plugin and parameter, or
 * TANDEM_EINVAL / TANDEM_ENOMEM. */
int rt_pipeline_create(struct rt_pipeline **out, const struct rt_config *cfg,
                       const struct rt_pipeline_opts *opts, char *err, size_t errlen);

/* rt_config_load + rt_pipeline_create. */
int rt_pipeline_load(struct rt_pipeline **out, const char *path,
                     const struct rt_pipeline_opts *opts, char *err, size_t errlen);

/* rt_config_parse + rt_pipeline_create (tests, inline configs). */
int rt_pipeline_parse(struct rt_pipeline **out, const char *yaml, const char *name,
                      const struct rt_pipeline_opts *opts, char *err, size_t errlen);

void rt_pipeline_destroy(struct rt_pipeline *pl);

/* Block size (tokens) the caller must hash prompts with: the blockSize of the
 * prefix-cache-scorer instances (all must agree), or BH_DEFAULT_BLOCK_SIZE. */
int rt_pipeline_block_size(const struct rt_pipeline *pl);

/* Whether any plugin reads request->block_hashes (if not, skip hashing). */
int rt_pipeline_uses_hashes(const struct rt_pipeline *pl);

/* Re-seeds the random source (tests replay a seed with it). */
void rt_pipeline_seed(struct rt_pipeline *pl, uint64_t seed);

/* ------------------------------------------------------------------ */
/* Endpoints (the registry's side)                                      */
/* ------------------------------------------------------------------ */

/* Registers an endpoint, healthy, with zero load. Returns its slot index
 * (>= 0), TANDEM_EEXIST (id taken), TANDEM_ETOOBIG (every slot used) or
 * TANDEM_EINVAL (bad role, empty or long id or address, block size outside
 * [1, BH_MAX_BLOCK_SIZE]). */
int rt_pipeline_endpoint_add(struct rt_pipeline *pl, const struct rt_endpoint_info *info);

/* Unregisters; plugins forget the endpoint. Returns 0 or TANDEM_ENOENT. */
int rt_pipeline_endpoint_remove(struct rt_pipeline *pl, int ep);

/* Slot index of a registered id, or TANDEM_ENOENT. O(endpoints). */
int rt_pipeline_endpoint_find(const struct rt_pipeline *pl, const char *id);

/* The endpoint in slot ep, or NULL when ep is out of range or unused. The
 * registry may read anything; it writes through the setters below. */
const struct rt_endpoint *rt_pipeline_endpoint(const struct rt_pipeline *pl, int ep);

int rt_pipeline_max_endpoints(const struct rt_pipeline *pl);
/* The id slot ep holds or last held (a removed endpoint keeps it until the
 * slot is reused), and in *gen (may be NULL) the slot's generation (0: never
 * used); NULL when ep is out of range. What decision records name. */
const char *rt_pipeline_slot_id(const struct rt_pipeline *pl, int ep, uint32_t *gen);
/* One past the highest slot in use (0: none): loops over the endpoints stop
 * here instead of at max_endpoints. */
int rt_pipeline_endpoints_hi(const struct rt_pipeline *pl);

/* Whether an endpoint that can prefill for another (the prefill role) is
 * registered, healthy or not. O(registered slots). */
int rt_pipeline_has_prefill_endpoint(const struct rt_pipeline *pl);

/* Heartbeat load. Returns 0 or TANDEM_ENOENT. */
int rt_pipeline_endpoint_set_load(struct rt_pipeline *pl, int ep, const struct rt_load *load);

/* Health (unhealthy endpoints are never candidates). 0 or TANDEM_ENOENT. */
int rt_pipeline_endpoint_set_healthy(struct rt_pipeline *pl, int ep, int healthy);

/* Forgets what the prefix indexes believe ep holds (worker restarted, KV
 * event sequence gap). 0 or TANDEM_ENOENT. */
int rt_pipeline_endpoint_reset_cache(struct rt_pipeline *pl, int ep);

enum rt_kv_event { RT_KV_STORED = 1, RT_KV_REMOVED, RT_KV_ALL_CLEARED };

/* A worker's KV event, in order: fed to every prefix-cache-scorer in precise
 * mode. hashes[0..n) for STORED/REMOVED; none for ALL_CLEARED. Returns 0,
 * TANDEM_ENOENT (unknown ep), TANDEM_EINVAL or TANDEM_ENOMEM. */
int rt_pipeline_kv_event(struct rt_pipeline *pl, int ep, enum rt_kv_event ev,
                         const uint64_t *hashes, int n);

/* ------------------------------------------------------------------ */
/* Deciding                                                             */
/* ------------------------------------------------------------------ */

/* Runs the pipeline. On success *out points to the pipeline's record, valid
 * until the next call (copy out->ticket to keep per request); the chosen
 * endpoints' in-flight counters are charged. Returns 0, TANDEM_ENOENT when
 * no endpoint passes the (decode) profile's filters (nothing is charged, and
 * *out points to the partial record, to log which profile came up empty), or
 * TANDEM_EINVAL on a bad request (negative counts, more block hashes than
 * full blocks). */
int rt_pipeline_decide(struct rt_pipeline *pl, const struct rt_request *req,
                       const struct rt_decision **out);

/* Gives back what the decision charged: RT_RELEASE_PREFILL when the first
 * token arrives (P is done, D's prefill work is done), RT_RELEASE_ALL when
 * the request ends (finish, error, cancel). Idempotent per bit; skipped for
 * an endpoint whose slot was reused since (generation differs). */
void rt_pipeline_release(struct rt_pipeline *pl, struct rt_ticket *t, unsigned what);

/* Records the cached tokens D reported (usage.prompt_tokens_details
 * .cached_tokens) against the prediction. Returns predicted - actual (the
 * signed error; 0 when no prediction was made), counted once per ticket. */
int rt_pipeline_report_cached(struct rt_pipeline *pl, struct rt_ticket *t, int actual_cached);

void rt_pipeline_stats(const struct rt_pipeline *pl, struct rt_pipeline_stats *out);

/* Writes the decision as one line of JSON (endpoint ids, P/D mode and reason,
 * predictions, and per profile the candidates with raw and total scores) to
 * buf. Returns the length written (without the NUL) or TANDEM_ETOOBIG when
 * it does not fit (buf then holds a truncated, NUL-terminated prefix). */
int rt_decision_format(const struct rt_pipeline *pl, const struct rt_decision *d, char *buf,
                       size_t len);

/* The id of endpoint slot ep as a record names it, or NULL to write null
 * (ep < 0, or a slot the record cannot name). */
typedef const char *(*rt_ep_name_fn)(const void *arg, int ep);

/* rt_decision_format with endpoint ids from name(arg, ep) instead of the
 * pipeline's slots: for a copy of a decision formatted later (rt_declog.h),
 * after a slot may have been reused by another endpoint. Everything else
 * d points to (profile names, scorers, picker, decider) must still be alive:
 * they live as long as the pipeline. Same text, same returns. */
int rt_decision_format_with(const struct rt_decision *d, rt_ep_name_fn name, const void *arg,
                            char *buf, size_t len);

const char *rt_pd_reason_name(enum rt_pd_reason r);
const char *rt_pd_mode_name(enum rt_pd_mode m);

/* Raw score of scorer s for candidate position i of run r. */
static inline double rt_run_raw(const struct rt_profile_run *r, int i, int s)
{
    return r->raw[(size_t)i * (size_t)r->n_scorers + (size_t)s];
}

/* Position of endpoint ep among r's candidates, or -1. */
int rt_run_find(const struct rt_profile_run *r, int ep);

/* A plugin instance by name (configured or injected), NULL if none. */
const struct rt_plugin *rt_pipeline_plugin(const struct rt_pipeline *pl, const char *name);
const char *rt_plugin_name(const struct rt_plugin *p);
const char *rt_plugin_type(const struct rt_plugin *p);

/* ------------------------------------------------------------------ */
/* Writing a plugin                                                     */
/* ------------------------------------------------------------------ */

enum rt_plugin_kind {
    RT_KIND_FILTER = 1,
    RT_KIND_SCORER,
    RT_KIND_PICKER,
    RT_KIND_PROFILE_HANDLER,
    RT_KIND_DECIDER,
};

enum rt_param_type {
    RT_PARAM_INT,    /* int64_t, integer text in [min, max] */
    RT_PARAM_DOUBLE, /* double, finite number in [min, max] */
    RT_PARAM_BOOL,   /* int, true or false */
    RT_PARAM_ENUM,   /* int, index of the text in choices */
    RT_PARAM_STRING, /* char[RT_NAME_MAX] */
};

/* One parameter: the framework parses and range-checks it into the plugin's
 * config struct at offset. Two specs with the same offset are aliases
 * (giving both is an error). */
struct rt_param_spec {
    const char *name;
    enum rt_param_type type;
    size_t offset;
    double min, max;
    const char *const *choices; /* ENUM: NULL-terminated */
};

/* Spec helpers: RT_P_INT("threshold", struct my_cfg, threshold, 1, 1e9). */
#define RT_P_INT(nm, st, fld, lo, hi)                                                              \
    {                                                                                              \
        .name = (nm), .type = RT_PARAM_INT, .offset = offsetof(st, fld), .min = (lo), .max = (hi)  \
    }
#define RT_P_DOUBLE(nm, st, fld, lo, hi)                                                           \
    {                                                                                              \
        .name = (nm), .type = RT_PARAM_DOUBLE, .offset = offsetof(st, fld), .min = (lo),           \
        .max = (hi)                                                                                \
    }
#define RT_P_BOOL(nm, st, fld)                                                                     \
    {                                                                                              \
        .name = (nm), .type = RT_PARAM_BOOL, .offset = offsetof(st, fld)                           \
    }
#define RT_P_ENUM(nm, st, fld, ch)                                                                 \
    {                                                                                              \
        .name = (nm), .type = RT_PARAM_ENUM, .offset = offsetof(st, fld), .choices = (ch)          \
    }
#define RT_P_STRING(nm, st, fld)                                                                   \
    {                                                                                              \
        .name = (nm), .type = RT_PARAM_STRING, .offset = offsetof(st, fld)                         \
    }
#define RT_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

enum rt_ep_event { RT_EP_ADDED = 1, RT_EP_REMOVED, RT_EP_RESET };

struct rt_plugin_ops {
    const char *type; /* the `type:` of the config, e.g. "queue-scorer" */
    enum rt_plugin_kind kind;
    const struct rt_param_spec *params; /* (n_params) */
    int n_params;
    size_t cfg_size;          /* parsed parameters: a struct of this size */
    const void *cfg_defaults; /* cfg_size bytes copied before parsing */

    /* After parameters are parsed (plugin->cfg): allocate plugin->state
     * (per-endpoint arrays sized rt_pipeline_max_endpoints). Report errors
     * with rt_plugin_fail. May be NULL. */
    int (*init)(struct rt_plugin *p);
    /* After every plugin and profile exists: resolve names (profiles,
     * deciders). May be NULL. */
    int (*link)(struct rt_plugin *p);
    void (*fini)(struct rt_plugin *p);

    /* FILTER: writes the kept subset of in[0..n) to out (order kept);
     * returns how many. */
    int (*filter)(struct rt_plugin *p, struct rt_cycle *c, const int *in, int n, int *out);
    /* SCORER: out[i] in [0, 1] for candidate cands[i]. */
    void (*score)(struct rt_plugin *p, struct rt_cycle *c, const int *cands, int n, double *out);
    /* PICKER: a position in [0, n) (n >= 1). */
    int (*pick)(struct rt_plugin *p, struct rt_cycle *c, const int *cands, const double *total,
                int n);
    /* DECIDER: fills v (prompt_tokens and uncached_tokens are preset). */
    void (*decide)(struct rt_plugin *p, struct rt_cycle *c, int decode_ep, struct rt_pd_verdict *v);
    /* PROFILE_HANDLER: runs profiles (rt_cycle_run_profile) and fills the
     * decision's decode, prefill, pd, decider and verdict. 0 or TANDEM_ENOENT. */
    int (*run)(struct rt_plugin *p, struct rt_cycle *c);

    /* Prefix source: leading blocks of the request's block_hashes that ep
     * holds. Its presence makes the plugin a prefix source. */
    int (*cached_blocks)(struct rt_plugin *p, struct rt_cycle *c, int ep);
    /* Block size the plugin hashes with (prefix plugins). */
    int (*block_size)(const struct rt_plugin *p);

    /* Hooks, any kind, may be NULL. on_decision runs after every successful
     * decision (c->dec is final); on_endpoint when a slot is added, removed
     * or its cache reset; on_kv_event for KV events. */
    void (*on_decision)(struct rt_plugin *p, struct rt_cycle *c);
    void (*on_endpoint)(struct rt_plugin *p, int ep, enum rt_ep_event ev);
    int (*on_kv_event)(struct rt_plugin *p, int ep, enum rt_kv_event ev, const uint64_t *hashes,
                       int n);
};

/* A plugin instance. */
struct rt_plugin {
    const struct rt_plugin_ops *ops;
    struct rt_pipeline *pl;
    char name[RT_NAME_MAX];
    int index;                       /* in the pipeline's plugin list */
    int line;                        /* config line of its entry, 0 when injected */
    void *cfg;                       /* parsed parameters (ops->cfg_size bytes) */
    void *state;                     /* the plugin's own, set by init, freed by fini */
    const struct rt_cfg_plugin *src; /* during create only, NULL otherwise */
};

/* Per-decision context handed to plugins. */
struct rt_cycle {
    struct rt_pipeline *pl;
    const struct rt_request *req;
    struct rt_decision *dec;
    uint64_t seq; /* decision number: key for per-decision caches */
    int profile;  /* profile being run, -1 outside a run */
};

/* The plugin table (router/plugins/plugin_table.c). */
extern const struct rt_plugin_ops *const rt_plugin_registry[];
extern const int rt_plugin_registry_len;
const struct rt_plugin_ops *rt_plugin_ops_find(const char *type);

/* During init/link: writes "<file>:<line>: plugin '<name>' (type <type>):
 * [parameter '<param>': ]<message>" to the create call's error buffer, with
 * the parameter's line when param is given and was set in the file. Returns
 * TANDEM_ECONFIG. */
int rt_plugin_fail(struct rt_plugin *p, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Whether param was given in the configuration (during init/link). */
int rt_plugin_param_set(const struct rt_plugin *p, const char *param);

/* Endpoint slot ep for plugins (never NULL for a candidate). */
struct rt_endpoint *rt_pipeline_ep(struct rt_pipeline *pl, int ep);

/* Random source shared by the pipeline's plugins (xoshiro256**). */
uint64_t rt_pipeline_rand(struct rt_pipeline *pl);
double rt_pipeline_rand01(struct rt_pipeline *pl);                   /* [0, 1) */
uint32_t rt_pipeline_rand_below(struct rt_pipeline *pl, uint32_t n); /* [0, n), n >= 1 */

/* Scratch of max_endpoints ints for pickers (clobbered by the next call). */
int *rt_pipeline_scratch(struct rt_pipeline *pl);

/* Profile index by name, or -1. */
int rt_pipeline_find_profile(const struct rt_pipeline *pl, const char *name);
int rt_pipeline_n_profiles(const struct rt_pipeline *pl);

/* Plugin instances in creation order (configured, then injected). */
int rt_pipeline_n_plugins(const struct rt_pipeline *pl);
struct rt_plugin *rt_pipeline_plugin_at(struct rt_pipeline *pl, int i);

/* Mutable plugin lookup for link(): by name, NULL if none. */
struct rt_plugin *rt_pipeline_plugin_mut(struct rt_pipeline *pl, const char *name);

/* Makes p the pipeline's prefix source (predictions, deciders). link() of a
 * profile handler with a prefixPluginName parameter calls it. */
void rt_pipeline_set_prefix_source(struct rt_pipeline *pl, struct rt_plugin *p);
int rt_pipeline_has_prefix_source(const struct rt_pipeline *pl);

/* For profile handlers: runs profile (filters, scorers, picker), records the
 * run in c->dec. Returns the picked endpoint index or TANDEM_ENOENT when no
 * candidate survives the filters. A profile runs at most once per decision. */
int rt_cycle_run_profile(struct rt_cycle *c, int profile);

/* Prompt tokens predicted cached on ep by the prefix source: its leading
 * blocks x block size, capped so at least one prompt token is computed (as
 * the workers' schedulers do). -1 when there is no prefix source. */
int rt_cycle_cached_tokens(struct rt_cycle *c, int ep);

/* Candidates before any filter: registered, healthy, not excluded. */
const int *rt_cycle_base(struct rt_cycle *c, int *n);

#endif
