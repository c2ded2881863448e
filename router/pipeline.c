/* The scheduling pipeline framework: building plugins and profiles from a
 * configuration, endpoint slots, running a decision, in-flight accounting and
 * decision records. The plugins themselves live in router/plugins/. */
#include "pipeline.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block_hash.h"
#include "tandem_rng.h"
#include "log.h"
#include "tandem_err.h"

#define RT_RELEASE_DECODE 2u /* internal: the decode half of RT_RELEASE_ALL */

struct profile {
    char name[RT_NAME_MAX];
    int line;
    struct rt_plugin *filters[RT_MAX_PROFILE_PLUGINS];
    int n_filters;
    struct rt_plugin *scorers[RT_MAX_PROFILE_PLUGINS];
    double weights[RT_MAX_PROFILE_PLUGINS];
    int n_scorers;
    struct rt_plugin *picker;
    int *cand;     /* (max_endpoints) candidates after the filters */
    int *tmp;      /* (max_endpoints) filter ping-pong */
    double *raw;   /* (max_endpoints, n_scorers) */
    double *total; /* (max_endpoints) */
    double *col;   /* (max_endpoints) one scorer's output */
    uint64_t ran_seq;
};

struct rt_pipeline {
    char source[256];
    int max_endpoints;
    int hi;                  /* slots >= hi are unused */
    struct rt_endpoint *eps; /* (max_endpoints) */

    struct rt_plugin *plugins[RT_MAX_PLUGINS];
    int n_plugins;
    struct profile profiles[RT_MAX_PROFILES];
    int n_profiles;
    struct rt_plugin *handler;
    struct rt_plugin *prefix_source;
    struct rt_plugin *hooked[RT_MAX_PLUGINS]; /* plugins with on_decision */
    int n_hooked;
    int block_size;
    int uses_hashes;

    struct rng rng;
    uint64_t seq;
    int *base; /* (max_endpoints) */
    int n_base;
    uint8_t *excluded; /* (max_endpoints) */
    int *scratch;      /* (max_endpoints) for pickers */
    struct rt_decision dec;
    struct rt_pipeline_stats stats;

    /* During rt_pipeline_create only. */
    char *err;
    size_t errlen;
};

static const char *const reason_names[] = {
#define RT_X(name, text) text,
    RT_PD_REASONS(RT_X)
#undef RT_X
};

const char *rt_pd_reason_name(enum rt_pd_reason r)
{
    return (unsigned)r < RT_PD_REASON_COUNT ? reason_names[r] : "?";
}

const char *rt_pd_mode_name(enum rt_pd_mode m)
{
    switch (m) {
    case RT_PD_SINGLE:
        return "single";
    case RT_PD_LOCAL:
        return "local";
    case RT_PD_REMOTE:
        return "remote";
    }
    return "?";
}

const char *rt_role_name(enum rt_role r)
{
    switch (r) {
    case RT_ROLE_PREFILL:
        return "prefill";
    case RT_ROLE_DECODE:
        return "decode";
    case RT_ROLE_COLOCATED:
        return "colocated";
    }
    return "?";
}

int rt_role_parse(const char *s, enum rt_role *out)
{
    static const enum rt_role roles[] = {RT_ROLE_PREFILL, RT_ROLE_DECODE, RT_ROLE_COLOCATED};
    for (size_t i = 0; s && i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (strcmp(s, rt_role_name(roles[i])) == 0) {
            *out = roles[i];
            return 0;
        }
    }
    return TANDEM_EINVAL;
}

double rt_endpoint_kv_usage(const struct rt_endpoint *ep)
{
    if (!ep->load.kv_blocks_total)
        return 0;
    double u = (double)ep->load.kv_blocks_used / (double)ep->load.kv_blocks_total;
    return u > 1 ? 1 : u;
}

/* ------------------------------------------------------------------ */
/* Random source (common/tandem_rng).                                          */
/* ------------------------------------------------------------------ */

void rt_pipeline_seed(struct rt_pipeline *pl, uint64_t seed)
{
    rng_seed(&pl->rng, seed);
}

uint64_t rt_pipeline_rand(struct rt_pipeline *pl)
{
    return rng_next(&pl->rng);
}

double rt_pipeline_rand01(struct rt_pipeline *pl)
{
    return rng_uniform(&pl->rng);
}

uint32_t rt_pipeline_rand_below(struct rt_pipeline *pl, uint32_t n)
{
    return rng_below(&pl->rng, n);
}

int *rt_pipeline_scratch(struct rt_pipeline *pl)
{
    return pl->scratch;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ */
/* Building                                                             */
/* ------------------------------------------------------------------ */

__attribute__((format(printf, 3, 4))) static int cfg_fail(struct rt_pipeline *pl, int line,
                                                          const char *fmt, ...)
{
    if (pl->errlen) {
        int n = snprintf(pl->err, pl->errlen, "%s:%d: ", pl->source, line);
        if (n >= 0 && (size_t)n < pl->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(pl->err + n, pl->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return TANDEM_ECONFIG;
}

static const struct rt_cfg_param *src_param(const struct rt_plugin *p, const char *param)
{
    if (!p->src || !param)
        return NULL;
    for (int i = 0; i < p->src->n_params; i++)
        if (strcmp(p->src->params[i].key, param) == 0)
            return &p->src->params[i];
    return NULL;
}

int rt_plugin_param_set(const struct rt_plugin *p, const char *param)
{
    return src_param(p, param) != NULL;
}

int rt_plugin_fail(struct rt_plugin *p, const char *param, const char *fmt, ...)
{
    struct rt_pipeline *pl = p->pl;
    char msg[RT_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const struct rt_cfg_param *sp = src_param(p, param);
    int line = sp ? sp->line : p->line;
    if (!pl->err) {
        LOG_WARN("router", "plugin '%s' (type %s): %s", p->name, p->ops->type, msg);
        return TANDEM_ECONFIG;
    }
    if (param)
        return cfg_fail(pl, line, "plugin '%s' (type %s): parameter '%s': %s", p->name,
                        p->ops->type, param, msg);
    return cfg_fail(pl, line, "plugin '%s' (type %s): %s", p->name, p->ops->type, msg);
}

const struct rt_plugin_ops *rt_plugin_ops_find(const char *type)
{
    for (int i = 0; i < rt_plugin_registry_len; i++)
        if (strcmp(rt_plugin_registry[i]->type, type) == 0)
            return rt_plugin_registry[i];
    return NULL;
}

static int find_spec(const struct rt_plugin_ops *ops, const char *key)
{
    for (int i = 0; i < ops->n_params; i++)
        if (strcmp(ops->params[i].name, key) == 0)
            return i;
    return -1;
}

static int param_value(struct rt_plugin *p, const struct rt_param_spec *sp,
                       const struct rt_cfg_param *cp)
{
    char *at = (char *)p->cfg + sp->offset;
    const char *v = cp->value;
    char *end;
    errno = 0;
    switch (sp->type) {
    case RT_PARAM_INT: {
        long long x = strtoll(v, &end, 10);
        if (errno || *end || end == v || (double)x < sp->min || (double)x > sp->max)
            return rt_plugin_fail(p, cp->key, "'%s' is not an integer in [%.0f, %.0f]", v, sp->min,
                                  sp->max);
        *(int64_t *)(void *)at = x;
        return 0;
    }
    case RT_PARAM_DOUBLE: {
        double x = strtod(v, &end);
        if (errno || *end || end == v || !isfinite(x) || x < sp->min || x > sp->max)
            return rt_plugin_fail(p, cp->key, "'%s' is not a number in [%g, %g]", v, sp->min,
                                  sp->max);
        *(double *)(void *)at = x;
        return 0;
    }
    case RT_PARAM_BOOL:
        if (strcmp(v, "true") == 0)
            *(int *)(void *)at = 1;
        else if (strcmp(v, "false") == 0)
            *(int *)(void *)at = 0;
        else
            return rt_plugin_fail(p, cp->key, "'%s' is not true or false", v);
        return 0;
    case RT_PARAM_ENUM: {
        char choices[256] = "";
        size_t used = 0;
        for (int i = 0; sp->choices[i]; i++) {
            if (strcmp(v, sp->choices[i]) == 0) {
                *(int *)(void *)at = i;
                return 0;
            }
            int n = snprintf(choices + used, sizeof(choices) - used, "%s%s", i ? ", " : "",
                             sp->choices[i]);
            if (n > 0 && used + (size_t)n < sizeof(choices))
                used += (size_t)n;
        }
        return rt_plugin_fail(p, cp->key, "'%s' is not one of: %s", v, choices);
    }
    case RT_PARAM_STRING:
        if (strlen(v) >= RT_NAME_MAX)
            return rt_plugin_fail(p, cp->key, "'%s' is longer than %d bytes", v, RT_NAME_MAX - 1);
        memcpy(at, v, strlen(v) + 1);
        return 0;
    }
    return TANDEM_EINTERNAL;
}

static int parse_params(struct rt_plugin *p)
{
    const struct rt_plugin_ops *ops = p->ops;
    const struct rt_cfg_plugin *src = p->src;
    for (int i = 0; src && i < src->n_params; i++) {
        const struct rt_cfg_param *cp = &src->params[i];
        int k = find_spec(ops, cp->key);
        if (k < 0) {
            char known[384] = "";
            size_t used = 0;
            for (int j = 0; j < ops->n_params; j++) {
                int n = snprintf(known + used, sizeof(known) - used, "%s%s", j ? ", " : "",
                                 ops->params[j].name);
                if (n > 0 && used + (size_t)n < sizeof(known))
                    used += (size_t)n;
            }
            return cfg_fail(p->pl, cp->line, "plugin '%s' (type %s): unknown parameter '%s' (%s%s)",
                            p->name, ops->type, cp->key,
                            ops->n_params ? "known: " : "it takes none", known);
        }
        /* An alias of a parameter already given (same offset) is a conflict. */
        for (int j = 0; j < i; j++) {
            int kj = find_spec(ops, src->params[j].key);
            if (kj >= 0 && ops->params[kj].offset == ops->params[k].offset)
                return cfg_fail(
                    p->pl, cp->line, "plugin '%s' (type %s): parameter '%s' repeats '%s' (line %d)",
                    p->name, ops->type, cp->key, src->params[j].key, src->params[j].line);
        }
        int rc = param_value(p, &ops->params[k], cp);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* A plugin from the file (src), or one the pipeline adds by default (src
 * NULL; line is where the file needs it, for messages). */
static int new_plugin(struct rt_pipeline *pl, const struct rt_plugin_ops *ops, const char *name,
                      const struct rt_cfg_plugin *src, int line, struct rt_plugin **out)
{
    if (pl->n_plugins >= RT_MAX_PLUGINS && src)
        return cfg_fail(pl, src->line, "more than %d plugins", RT_MAX_PLUGINS);
    if (pl->n_plugins >= RT_MAX_PLUGINS)
        return cfg_fail(pl, line, "more than %d plugins, counting the '%s' added by default",
                        RT_MAX_PLUGINS, name);
    struct rt_plugin *p = calloc(1, sizeof(*p));
    if (!p)
        return TANDEM_ENOMEM;
    p->ops = ops;
    p->pl = pl;
    p->src = src;
    p->line = src ? src->line : 0;
    p->index = pl->n_plugins;
    snprintf(p->name, sizeof(p->name), "%s", name);
    pl->plugins[pl->n_plugins++] = p;
    if (ops->cfg_size) {
        p->cfg = malloc(ops->cfg_size);
        if (!p->cfg)
            return TANDEM_ENOMEM;
        memcpy(p->cfg, ops->cfg_defaults, ops->cfg_size);
    }
    int rc = parse_params(p);
    if (rc < 0)
        return rc;
    if (ops->init && (rc = ops->init(p)) < 0)
        return rc;
    *out = p;
    return 0;
}

static struct rt_plugin *find_plugin(const struct rt_pipeline *pl, const char *name)
{
    for (int i = 0; i < pl->n_plugins; i++)
        if (strcmp(pl->plugins[i]->name, name) == 0)
            return pl->plugins[i];
    return NULL;
}

static const char *kind_name(enum rt_plugin_kind k)
{
    switch (k) {
    case RT_KIND_FILTER:
        return "filter";
    case RT_KIND_SCORER:
        return "scorer";
    case RT_KIND_PICKER:
        return "picker";
    case RT_KIND_PROFILE_HANDLER:
        return "profile handler";
    case RT_KIND_DECIDER:
        return "P/D decider";
    }
    return "?";
}

/* A profile without a picker (at line) gets max-score-picker, as in llm-d. */
static int default_picker(struct rt_pipeline *pl, int line, struct rt_plugin **out)
{
    const struct rt_plugin_ops *ops = rt_plugin_ops_find("max-score-picker");
    struct rt_plugin *p = find_plugin(pl, "max-score-picker");
    if (p && p->ops == ops) {
        *out = p;
        return 0;
    }
    const char *name = p ? "max-score-picker (default)" : "max-score-picker";
    p = find_plugin(pl, name);
    if (p) {
        *out = p;
        return 0;
    }
    return new_plugin(pl, ops, name, NULL, line, out);
}

static int build_profile(struct rt_pipeline *pl, const struct rt_cfg_profile *cp,
                         struct profile *pr)
{
    snprintf(pr->name, sizeof(pr->name), "%s", cp->name);
    pr->line = cp->line;
    if (strlen(cp->name) >= RT_NAME_MAX)
        return cfg_fail(pl, cp->line, "profile name '%s' is longer than %d bytes", cp->name,
                        RT_NAME_MAX - 1);
    if (cp->n_refs > RT_MAX_PROFILE_PLUGINS)
        return cfg_fail(pl, cp->refs[RT_MAX_PROFILE_PLUGINS].line,
                        "profile '%s': more than %d plugins", cp->name, RT_MAX_PROFILE_PLUGINS);
    for (int i = 0; i < cp->n_refs; i++) {
        const struct rt_cfg_ref *r = &cp->refs[i];
        struct rt_plugin *p = find_plugin(pl, r->plugin_ref);
        if (!p)
            return cfg_fail(pl, r->line,
                            "profile '%s': pluginRef '%s' does not name a plugin defined under "
                            "'plugins'",
                            cp->name, r->plugin_ref);
        for (int j = 0; j < i; j++)
            if (strcmp(cp->refs[j].plugin_ref, r->plugin_ref) == 0)
                return cfg_fail(pl, r->line, "profile '%s': pluginRef '%s' is listed twice",
                                cp->name, r->plugin_ref);
        enum rt_plugin_kind k = p->ops->kind;
        if (r->has_weight && k != RT_KIND_SCORER)
            return cfg_fail(pl, r->weight_line,
                            "profile '%s': pluginRef '%s' has a weight but is a %s, not a scorer",
                            cp->name, r->plugin_ref, kind_name(k));
        switch (k) {
        case RT_KIND_FILTER:
            pr->filters[pr->n_filters++] = p;
            break;
        case RT_KIND_SCORER:
            pr->weights[pr->n_scorers] = r->weight;
            pr->scorers[pr->n_scorers++] = p;
            break;
        case RT_KIND_PICKER:
            if (pr->picker)
                return cfg_fail(pl, r->line, "profile '%s': a second picker '%s' (already '%s')",
                                cp->name, r->plugin_ref, pr->picker->name);
            pr->picker = p;
            break;
        case RT_KIND_PROFILE_HANDLER:
        case RT_KIND_DECIDER:
            return cfg_fail(pl, r->line,
                            "profile '%s': pluginRef '%s' is a %s; list it under 'plugins' only",
                            cp->name, r->plugin_ref, kind_name(k));
        }
    }
    if (!pr->picker)
        return default_picker(pl, cp->line, &pr->picker);
    return 0;
}

static int alloc_scratch(struct rt_pipeline *pl)
{
    size_t n = (size_t)pl->max_endpoints;
    for (int i = 0; i < pl->n_profiles; i++) {
        struct profile *pr = &pl->profiles[i];
        size_t ns = pr->n_scorers ? (size_t)pr->n_scorers : 1;
        pr->cand = malloc(sizeof(int) * n);
        pr->tmp = malloc(sizeof(int) * n);
        pr->raw = malloc(sizeof(double) * n * ns);
        pr->total = malloc(sizeof(double) * n);
        pr->col = malloc(sizeof(double) * n);
        if (!pr->cand || !pr->tmp || !pr->raw || !pr->total || !pr->col)
            return TANDEM_ENOMEM;
    }
    return 0;
}

int rt_pipeline_create(struct rt_pipeline **out, const struct rt_config *cfg,
                       const struct rt_pipeline_opts *opts, char *err, size_t errlen)
{
    if (errlen)
        err[0] = 0;
    if (!out || !cfg)
        return TANDEM_EINVAL;
    int max_eps = opts && opts->max_endpoints ? opts->max_endpoints : RT_DEFAULT_MAX_ENDPOINTS;
    if (max_eps < 1 || max_eps > RT_MAX_ENDPOINTS)
        return TANDEM_EINVAL;
    struct rt_pipeline *pl = calloc(1, sizeof(*pl));
    if (!pl)
        return TANDEM_ENOMEM;
    int rc = TANDEM_ENOMEM;
    pl->err = err;
    pl->errlen = errlen;
    pl->max_endpoints = max_eps;
    pl->block_size = BH_DEFAULT_BLOCK_SIZE;
    snprintf(pl->source, sizeof(pl->source), "%s", cfg->source ? cfg->source : "<config>");
    uint64_t seed = opts && opts->seed ? opts->seed : now_ns() ^ (uint64_t)(uintptr_t)pl;
    rt_pipeline_seed(pl, seed);
    pl->eps = calloc((size_t)max_eps, sizeof(*pl->eps));
    pl->base = malloc(sizeof(int) * (size_t)max_eps);
    pl->scratch = malloc(sizeof(int) * (size_t)max_eps);
    pl->excluded = calloc((size_t)max_eps, 1);
    if (!pl->eps || !pl->base || !pl->scratch || !pl->excluded)
        goto fail;

    /* Plugins, in file order. */
    for (int i = 0; i < cfg->n_plugins; i++) {
        const struct rt_cfg_plugin *cp = &cfg->plugins[i];
        if (strlen(cp->name) >= RT_NAME_MAX) {
            rc = cfg_fail(pl, cp->line, "plugin name '%s' is longer than %d bytes", cp->name,
                          RT_NAME_MAX - 1);
            goto fail;
        }
        struct rt_plugin *other = find_plugin(pl, cp->name);
        if (other) {
            rc = cfg_fail(pl, cp->line,
                          "plugin name '%s' is already used (line %d); give one of them a "
                          "different 'name'",
                          cp->name, other->line);
            goto fail;
        }
        const struct rt_plugin_ops *ops = rt_plugin_ops_find(cp->type);
        if (!ops) {
            rc = cfg_fail(pl, cp->type_line ? cp->type_line : cp->line,
                          "plugin '%s': unknown type '%s' (docs/routing.md lists the types)",
                          cp->name, cp->type);
            goto fail;
        }
        struct rt_plugin *p;
        if ((rc = new_plugin(pl, ops, cp->name, cp, cp->line, &p)) < 0)
            goto fail;
    }

    /* Profiles. */
    if (cfg->n_profiles > RT_MAX_PROFILES) {
        rc = cfg_fail(pl, cfg->profiles[RT_MAX_PROFILES].line, "more than %d schedulingProfiles",
                      RT_MAX_PROFILES);
        goto fail;
    }
    for (int i = 0; i < cfg->n_profiles; i++) {
        for (int j = 0; j < i; j++) {
            if (strcmp(cfg->profiles[i].name, cfg->profiles[j].name) == 0) {
                rc = cfg_fail(pl, cfg->profiles[i].line,
                              "profile name '%s' is already used (line %d)", cfg->profiles[i].name,
                              cfg->profiles[j].line);
                goto fail;
            }
        }
        pl->n_profiles = i + 1;
        if ((rc = build_profile(pl, &cfg->profiles[i], &pl->profiles[i])) < 0)
            goto fail;
    }

    /* The profile handler: exactly one, or single-profile-handler injected. */
    for (int i = 0; i < pl->n_plugins; i++) {
        struct rt_plugin *p = pl->plugins[i];
        if (p->ops->kind != RT_KIND_PROFILE_HANDLER)
            continue;
        if (pl->handler) {
            rc = cfg_fail(pl, p->line, "plugin '%s': a second profile handler (already '%s')",
                          p->name, pl->handler->name);
            goto fail;
        }
        pl->handler = p;
    }
    if (!pl->handler) {
        if (pl->n_profiles != 1) {
            rc = cfg_fail(pl, cfg->profiles[pl->n_profiles > 1 ? 1 : 0].line,
                          "%d schedulingProfiles need a profile handler plugin "
                          "(pd-profile-handler or single-profile-handler)",
                          pl->n_profiles);
            goto fail;
        }
        rc = new_plugin(pl, rt_plugin_ops_find("single-profile-handler"), "single-profile-handler",
                        NULL, cfg->profiles[0].line, &pl->handler);
        if (rc < 0)
            goto fail;
    }

    for (int i = 0; i < pl->n_plugins; i++) {
        struct rt_plugin *p = pl->plugins[i];
        if (p->ops->link && (rc = p->ops->link(p)) < 0)
            goto fail;
    }

    /* The block size every prefix plugin hashes with must be one. */
    struct rt_plugin *first_prefix = NULL;
    for (int i = 0; i < pl->n_plugins; i++) {
        struct rt_plugin *p = pl->plugins[i];
        if (!p->ops->block_size)
            continue;
        pl->uses_hashes = 1;
        if (!first_prefix) {
            first_prefix = p;
            pl->block_size = p->ops->block_size(p);
        } else if (p->ops->block_size(p) != pl->block_size) {
            rc = rt_plugin_fail(p, "blockSize",
                                "%d differs from %d of plugin '%s': the router hashes each "
                                "prompt with one block size",
                                p->ops->block_size(p), pl->block_size, first_prefix->name);
            goto fail;
        }
    }
    if (!pl->prefix_source) {
        for (int i = 0; i < pl->n_plugins && !pl->prefix_source; i++)
            if (pl->plugins[i]->ops->cached_blocks)
                pl->prefix_source = pl->plugins[i];
    }
    for (int i = 0; i < pl->n_plugins; i++)
        if (pl->plugins[i]->ops->on_decision)
            pl->hooked[pl->n_hooked++] = pl->plugins[i];

    if ((rc = alloc_scratch(pl)) < 0)
        goto fail;
    for (int i = 0; i < pl->n_plugins; i++)
        pl->plugins[i]->src = NULL;
    pl->err = NULL;
    pl->errlen = 0;
    *out = pl;
    return 0;
fail:
    if (rc == TANDEM_ENOMEM && errlen)
        snprintf(err, errlen, "%s: out of memory", pl->source);
    rt_pipeline_destroy(pl);
    return rc;
}

int rt_pipeline_load(struct rt_pipeline **out, const char *path,
                     const struct rt_pipeline_opts *opts, char *err, size_t errlen)
{
    struct rt_config *cfg;
    int rc = rt_config_load(&cfg, path, err, errlen);
    if (rc < 0)
        return rc;
    rc = rt_pipeline_create(out, cfg, opts, err, errlen);
    rt_config_free(cfg);
    return rc;
}

int rt_pipeline_parse(struct rt_pipeline **out, const char *yaml, const char *name,
                      const struct rt_pipeline_opts *opts, char *err, size_t errlen)
{
    struct rt_config *cfg;
    int rc = rt_config_parse(&cfg, yaml, yaml ? strlen(yaml) : 0, name, err, errlen);
    if (rc < 0)
        return rc;
    rc = rt_pipeline_create(out, cfg, opts, err, errlen);
    rt_config_free(cfg);
    return rc;
}

void rt_pipeline_destroy(struct rt_pipeline *pl)
{
    if (!pl)
        return;
    for (int i = pl->n_plugins - 1; i >= 0; i--) {
        struct rt_plugin *p = pl->plugins[i];
        if (p->ops->fini)
            p->ops->fini(p);
        free(p->cfg);
        free(p);
    }
    for (int i = 0; i < pl->n_profiles; i++) {
        struct profile *pr = &pl->profiles[i];
        free(pr->cand);
        free(pr->tmp);
        free(pr->raw);
        free(pr->total);
        free(pr->col);
    }
    free(pl->eps);
    free(pl->base);
    free(pl->scratch);
    free(pl->excluded);
    free(pl);
}

int rt_pipeline_block_size(const struct rt_pipeline *pl)
{
    return pl->block_size;
}

int rt_pipeline_uses_hashes(const struct rt_pipeline *pl)
{
    return pl->uses_hashes;
}

int rt_pipeline_max_endpoints(const struct rt_pipeline *pl)
{
    return pl->max_endpoints;
}

int rt_pipeline_endpoints_hi(const struct rt_pipeline *pl)
{
    return pl->hi;
}

int rt_pipeline_find_profile(const struct rt_pipeline *pl, const char *name)
{
    for (int i = 0; i < pl->n_profiles; i++)
        if (strcmp(pl->profiles[i].name, name) == 0)
            return i;
    return -1;
}

int rt_pipeline_n_profiles(const struct rt_pipeline *pl)
{
    return pl->n_profiles;
}

int rt_pipeline_n_plugins(const struct rt_pipeline *pl)
{
    return pl->n_plugins;
}

struct rt_plugin *rt_pipeline_plugin_at(struct rt_pipeline *pl, int i)
{
    return i >= 0 && i < pl->n_plugins ? pl->plugins[i] : NULL;
}

struct rt_plugin *rt_pipeline_plugin_mut(struct rt_pipeline *pl, const char *name)
{
    return find_plugin(pl, name);
}

const struct rt_plugin *rt_pipeline_plugin(const struct rt_pipeline *pl, const char *name)
{
    return find_plugin(pl, name);
}

const char *rt_plugin_name(const struct rt_plugin *p)
{
    return p->name;
}

const char *rt_plugin_type(const struct rt_plugin *p)
{
    return p->ops->type;
}

void rt_pipeline_set_prefix_source(struct rt_pipeline *pl, struct rt_plugin *p)
{
    pl->prefix_source = p;
}

int rt_pipeline_has_prefix_source(const struct rt_pipeline *pl)
{
    if (pl->prefix_source)
        return 1;
    for (int i = 0; i < pl->n_plugins; i++)
        if (pl->plugins[i]->ops->cached_blocks)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Endpoints                                                            */
/* ------------------------------------------------------------------ */

static struct rt_endpoint *slot(const struct rt_pipeline *pl, int ep)
{
    if (ep < 0 || ep >= pl->max_endpoints || !pl->eps[ep].in_use)
        return NULL;
    return &pl->eps[ep];
}

struct rt_endpoint *rt_pipeline_ep(struct rt_pipeline *pl, int ep)
{
    return &pl->eps[ep];
}

const struct rt_endpoint *rt_pipeline_endpoint(const struct rt_pipeline *pl, int ep)
{
    return slot(pl, ep);
}

const char *rt_pipeline_slot_id(const struct rt_pipeline *pl, int ep, uint32_t *gen)
{
    if (ep < 0 || ep >= pl->max_endpoints)
        return NULL;
    if (gen)
        *gen = pl->eps[ep].gen;
    return pl->eps[ep].id;
}

int rt_pipeline_has_prefill_endpoint(const struct rt_pipeline *pl)
{
    for (int i = 0; i < pl->hi; i++) {
        const struct rt_endpoint *e = slot(pl, i);
        if (e != NULL && rt_role_can_prefill_remote(e->role))
            return 1;
    }
    return 0;
}

static void notify(struct rt_pipeline *pl, int ep, enum rt_ep_event ev)
{
    for (int i = 0; i < pl->n_plugins; i++)
        if (pl->plugins[i]->ops->on_endpoint)
            pl->plugins[i]->ops->on_endpoint(pl->plugins[i], ep, ev);
}

static int copy_str(char *dst, size_t cap, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n >= cap)
        return TANDEM_EINVAL;
    memcpy(dst, s ? s : "", n + 1);
    return 0;
}

int rt_pipeline_endpoint_add(struct rt_pipeline *pl, const struct rt_endpoint_info *info)
{
    if (!info || !info->id || !info->id[0] || strlen(info->id) >= RT_ID_MAX)
        return TANDEM_EINVAL;
    if (info->role != RT_ROLE_PREFILL && info->role != RT_ROLE_DECODE &&
        info->role != RT_ROLE_COLOCATED)
        return TANDEM_EINVAL;
    if (info->block_size < 1 || info->block_size > BH_MAX_BLOCK_SIZE)
        return TANDEM_EINVAL;
    if ((info->control_addr && strlen(info->control_addr) >= RT_ADDR_MAX) ||
        (info->data_addr && strlen(info->data_addr) >= RT_ADDR_MAX))
        return TANDEM_EINVAL;
    if (rt_pipeline_endpoint_find(pl, info->id) >= 0)
        return TANDEM_EEXIST;
    int ep = 0;
    while (ep < pl->max_endpoints && pl->eps[ep].in_use)
        ep++;
    if (ep == pl->max_endpoints)
        return TANDEM_ETOOBIG;
    struct rt_endpoint *e = &pl->eps[ep];
    uint32_t gen = e->gen + 1;
    memset(e, 0, sizeof(*e));
    copy_str(e->id, sizeof(e->id), info->id);
    copy_str(e->control_addr, sizeof(e->control_addr), info->control_addr);
    copy_str(e->data_addr, sizeof(e->data_addr), info->data_addr);
    e->role = info->role;
    e->block_size = info->block_size;
    e->max_running = info->max_running;
    e->max_context = info->max_context;
    e->gen = gen ? gen : 1;
    e->in_use = 1;
    e->healthy = 1;
    if (ep >= pl->hi)
        pl->hi = ep + 1;
    notify(pl, ep, RT_EP_ADDED);
    return ep;
}

int rt_pipeline_endpoint_remove(struct rt_pipeline *pl, int ep)
{
    struct rt_endpoint *e = slot(pl, ep);
    if (!e)
        return TANDEM_ENOENT;
    notify(pl, ep, RT_EP_REMOVED);
    e->in_use = 0;
    e->healthy = 0;
    while (pl->hi > 0 && !pl->eps[pl->hi - 1].in_use)
        pl->hi--;
    return 0;
}

int rt_pipeline_endpoint_find(const struct rt_pipeline *pl, const char *id)
{
    for (int ep = 0; id && ep < pl->hi; ep++)
        if (pl->eps[ep].in_use && strcmp(pl->eps[ep].id, id) == 0)
            return ep;
    return TANDEM_ENOENT;
}

int rt_pipeline_endpoint_set_load(struct rt_pipeline *pl, int ep, const struct rt_load *load)
{
    struct rt_endpoint *e = slot(pl, ep);
    if (!e || !load)
        return TANDEM_ENOENT;
    e->load = *load;
    return 0;
}

int rt_pipeline_endpoint_set_healthy(struct rt_pipeline *pl, int ep, int healthy)
{
    struct rt_endpoint *e = slot(pl, ep);
    if (!e)
        return TANDEM_ENOENT;
    e->healthy = healthy != 0;
    return 0;
}

int rt_pipeline_endpoint_reset_cache(struct rt_pipeline *pl, int ep)
{
    if (!slot(pl, ep))
        return TANDEM_ENOENT;
    notify(pl, ep, RT_EP_RESET);
    return 0;
}

int rt_pipeline_kv_event(struct rt_pipeline *pl, int ep, enum rt_kv_event ev,
                         const uint64_t *hashes, int n)
{
    if (!slot(pl, ep))
        return TANDEM_ENOENT;
    if (ev != RT_KV_STORED && ev != RT_KV_REMOVED && ev != RT_KV_ALL_CLEARED)
        return TANDEM_EINVAL;
    if (n < 0 || (n > 0 && !hashes))
        return TANDEM_EINVAL;
    for (int i = 0; i < pl->n_plugins; i++) {
        struct rt_plugin *p = pl->plugins[i];
        if (!p->ops->on_kv_event)
            continue;
        int rc = p->ops->on_kv_event(p, ep, ev, hashes, n);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Deciding                                                             */
/* ------------------------------------------------------------------ */

const int *rt_cycle_base(struct rt_cycle *c, int *n)
{
    *n = c->pl->n_base;
    return c->pl->base;
}

int rt_cycle_cached_tokens(struct rt_cycle *c, int ep)
{
    struct rt_pipeline *pl = c->pl;
    struct rt_plugin *src = pl->prefix_source;
    if (!src)
        return -1;
    int n = c->req->n_tokens;
    int blocks = src->ops->cached_blocks(src, c, ep);
    /* Workers keep at least one prompt token to compute (engine/scheduler.h). */
    int cap = n > 0 ? (n - 1) / pl->block_size : 0;
    if (blocks > cap)
        blocks = cap;
    return blocks * pl->block_size;
}

int rt_cycle_run_profile(struct rt_cycle *c, int profile)
{
    struct rt_pipeline *pl = c->pl;
    struct rt_decision *d = c->dec;
    if (profile < 0 || profile >= pl->n_profiles || d->n_runs >= RT_MAX_RUNS)
        return TANDEM_EINVAL;
    struct profile *pr = &pl->profiles[profile];
    if (pr->ran_seq == c->seq)
        return TANDEM_EINVAL;
    pr->ran_seq = c->seq;
    c->profile = profile;

    const int *in = pl->base;
    int n = pl->n_base;
    int *bufs[2] = {pr->cand, pr->tmp};
    int which = 0;
    for (int f = 0; f < pr->n_filters && n > 0; f++) {
        struct rt_plugin *fp = pr->filters[f];
        int *out = bufs[which];
        n = fp->ops->filter(fp, c, in, n, out);
        in = out;
        which ^= 1;
    }
    if (in != pr->cand)
        memcpy(pr->cand, in, sizeof(int) * (size_t)n);

    struct rt_profile_run *r = &d->runs[d->n_runs++];
    r->profile = profile;
    r->profile_name = pr->name;
    r->n_candidates = n;
    r->candidates = pr->cand;
    r->n_scorers = pr->n_scorers;
    r->scorers = (const struct rt_plugin *const *)pr->scorers;
    r->weights = pr->weights;
    r->raw = pr->raw;
    r->total = pr->total;
    r->picker = pr->picker;
    r->picked = -1;
    r->picked_pos = -1;
    if (n == 0) {
        c->profile = -1;
        return TANDEM_ENOENT;
    }

    int ns = pr->n_scorers;
    memset(pr->total, 0, sizeof(double) * (size_t)n);
    for (int s = 0; s < ns; s++) {
        struct rt_plugin *sp = pr->scorers[s];
        double w = pr->weights[s];
        sp->ops->score(sp, c, pr->cand, n, pr->col);
        for (int i = 0; i < n; i++) {
            double v = pr->col[i];
            if (!(v >= 0)) /* also NaN */
                v = 0;
            else if (v > 1)
                v = 1;
            pr->raw[(size_t)i * (size_t)ns + (size_t)s] = v;
            pr->total[i] += w * v;
        }
    }
    int pos = pr->picker->ops->pick(pr->picker, c, pr->cand, pr->total, n);
    if (pos < 0 || pos >= n)
        pos = 0;
    r->picked_pos = pos;
    r->picked = pr->cand[pos];
    c->profile = -1;
    return r->picked;
}

static int req_valid(const struct rt_pipeline *pl, const struct rt_request *req)
{
    if (!req || req->n_tokens < 0 || req->n_blocks < 0 || req->n_exclude < 0)
        return 0;
    if ((req->n_tokens && !req->tokens) || (req->n_blocks && !req->block_hashes) ||
        (req->n_exclude && !req->exclude))
        return 0;
    if (req->n_blocks > req->n_tokens / pl->block_size)
        return 0;
    return 1;
}

static uint64_t sub_sat(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

static void charge(struct rt_pipeline *pl, struct rt_decision *d, const struct rt_request *req)
{
    struct rt_ticket *t = &d->ticket;
    uint64_t n = (uint64_t)req->n_tokens;
    memset(t, 0, sizeof(*t));
    t->seq = d->seq;
    t->decode = d->decode;
    t->prefill = d->prefill;
    t->predicted_cached_decode = d->predicted_cached_decode;
    t->actual_cached_decode = -1;

    struct rt_endpoint *de = &pl->eps[d->decode];
    uint64_t cached_d = d->predicted_cached_decode > 0 ? (uint64_t)d->predicted_cached_decode : 0;
    t->decode_gen = de->gen;
    t->decode_tokens = n + req->max_tokens;
    t->decode_work = d->pd == RT_PD_REMOTE ? 0 : n - cached_d;
    de->inflight_requests++;
    de->picks++;
    de->inflight_tokens += t->decode_tokens;
    de->inflight_prefill_tokens += t->decode_work;
    if (d->prefill >= 0) {
        struct rt_endpoint *pe = &pl->eps[d->prefill];
        uint64_t cached_p =
            d->predicted_cached_prefill > 0 ? (uint64_t)d->predicted_cached_prefill : 0;
        t->prefill_gen = pe->gen;
        t->prefill_tokens = n;
        t->prefill_work = n - cached_p;
        pe->inflight_requests++;
        pe->picks++;
        pe->inflight_tokens += t->prefill_tokens;
        pe->inflight_prefill_tokens += t->prefill_work;
    }
}

int rt_pipeline_decide(struct rt_pipeline *pl, const struct rt_request *req,
                       const struct rt_decision **out)
{
    if (!pl || !out || !req_valid(pl, req))
        return TANDEM_EINVAL;
    uint64_t t0 = now_ns();
    struct rt_decision *d = &pl->dec;
    memset(d, 0, sizeof(*d));
    d->seq = ++pl->seq;
    d->request_id = req->id;
    if (req->response_id != NULL)
        snprintf(d->response_id, sizeof(d->response_id), "%s", req->response_id);
    d->decode = -1;
    d->prefill = -1;
    d->prompt_tokens = req->n_tokens;
    d->predicted_cached_decode = -1;
    d->predicted_cached_prefill = -1;
    d->actual_cached_decode = -1;
    d->verdict.remote_ep = -1;

    for (int i = 0; i < req->n_exclude; i++)
        if (req->exclude[i] >= 0 && req->exclude[i] < pl->max_endpoints)
            pl->excluded[req->exclude[i]] = 1;
    int nb = 0;
    for (int ep = 0; ep < pl->hi; ep++) {
        const struct rt_endpoint *e = &pl->eps[ep];
        if (e->in_use && e->healthy && !pl->excluded[ep])
            pl->base[nb++] = ep;
    }
    pl->n_base = nb;
    for (int i = 0; i < req->n_exclude; i++)
        if (req->exclude[i] >= 0 && req->exclude[i] < pl->max_endpoints)
            pl->excluded[req->exclude[i]] = 0;

    struct rt_cycle c = {.pl = pl, .req = req, .dec = d, .seq = d->seq, .profile = -1};
    int rc = pl->handler->ops->run(pl->handler, &c);
    if (rc < 0 || d->decode < 0) {
        pl->stats.failures++;
        d->latency_ns = now_ns() - t0;
        *out = d;
        return rc < 0 ? rc : TANDEM_ENOENT;
    }
    d->predicted_cached_decode = rt_cycle_cached_tokens(&c, d->decode);
    if (d->prefill >= 0)
        d->predicted_cached_prefill = rt_cycle_cached_tokens(&c, d->prefill);
    charge(pl, d, req);
    for (int i = 0; i < pl->n_hooked; i++)
        pl->hooked[i]->ops->on_decision(pl->hooked[i], &c);

    pl->stats.decisions++;
    if (d->pd == RT_PD_SINGLE)
        pl->stats.pd_single++;
    else if (d->pd == RT_PD_LOCAL)
        pl->stats.pd_local++;
    else
        pl->stats.pd_remote++;
    d->latency_ns = now_ns() - t0;
    *out = d;
    return 0;
}

void rt_pipeline_release(struct rt_pipeline *pl, struct rt_ticket *t, unsigned what)
{
    unsigned todo = what & RT_RELEASE_ALL & ~t->released;
    struct rt_endpoint *de = slot(pl, t->decode);
    struct rt_endpoint *pe = slot(pl, t->prefill);
    if (de && de->gen != t->decode_gen)
        de = NULL;
    if (pe && pe->gen != t->prefill_gen)
        pe = NULL;
    if (todo & RT_RELEASE_PREFILL) {
        if (de)
            de->inflight_prefill_tokens = sub_sat(de->inflight_prefill_tokens, t->decode_work);
        if (pe) {
            pe->inflight_prefill_tokens = sub_sat(pe->inflight_prefill_tokens, t->prefill_work);
            pe->inflight_tokens = sub_sat(pe->inflight_tokens, t->prefill_tokens);
            if (pe->inflight_requests)
                pe->inflight_requests--;
        }
    }
    if ((todo & RT_RELEASE_DECODE) && de) {
        de->inflight_tokens = sub_sat(de->inflight_tokens, t->decode_tokens);
        if (de->inflight_requests)
            de->inflight_requests--;
    }
    t->released |= todo;
}

int rt_pipeline_report_cached(struct rt_pipeline *pl, struct rt_ticket *t, int actual_cached)
{
    if (actual_cached < 0)
        actual_cached = 0;
    if (t->actual_cached_decode >= 0)
        return t->predicted_cached_decode >= 0
                   ? t->predicted_cached_decode - t->actual_cached_decode
                   : 0;
    t->actual_cached_decode = actual_cached;
    if (t->predicted_cached_decode < 0)
        return 0;
    int e = t->predicted_cached_decode - actual_cached;
    pl->stats.cached_reports++;
    pl->stats.predicted_tokens += (uint64_t)t->predicted_cached_decode;
    pl->stats.actual_tokens += (uint64_t)actual_cached;
    pl->stats.abs_error_tokens += (uint64_t)(e < 0 ? -e : e);
    if (e == 0)
        pl->stats.exact_predictions++;
    return e;
}

void rt_pipeline_stats(const struct rt_pipeline *pl, struct rt_pipeline_stats *out)
{
    *out = pl->stats;
}

int rt_run_find(const struct rt_profile_run *r, int ep)
{
    for (int i = 0; i < r->n_candidates; i++)
        if (r->candidates[i] == ep)
            return i;
    return -1;
}

/* ------------------------------------------------------------------ */
/* Decision records as JSON                                             */
/* ------------------------------------------------------------------ */

struct out {
    char *buf;
    size_t cap, len;
    int overflow;
};

__attribute__((format(printf, 2, 3))) static void put(struct out *o, const char *fmt, ...)
{
    if (o->overflow)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->len) {
        o->overflow = 1;
        return;
    }
    o->len += (size_t)n;
}

/* Appends n bytes of s as they are. */
static void put_raw(struct out *o, const char *s, size_t n)
{
    if (o->overflow)
        return;
    if (n >= o->cap - o->len) {
        o->overflow = 1;
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = 0;
}

/* A JSON string. Runs of bytes that need no escape are copied at once:
 * this runs for every name of a decision record served or logged. */
static void put_str(struct out *o, const char *s)
{
    put_raw(o, "\"", 1);
    while (*s && !o->overflow) {
        size_t n = 0;
        while (s[n] && s[n] != '"' && s[n] != '\\' && (unsigned char)s[n] >= 0x20)
            n++;
        put_raw(o, s, n);
        s += n;
        if (!*s)
            break;
        unsigned char ch = (unsigned char)*s++;
        if (ch == '"' || ch == '\\')
            put(o, "\\%c", ch);
        else
            put(o, "\\u%04x", ch);
    }
    put_raw(o, "\"", 1);
}

static const char *slot_name(const void *arg, int ep)
{
    return rt_pipeline_slot_id(arg, ep, NULL);
}

static void put_ep(struct out *o, rt_ep_name_fn name, const void *arg, int ep)
{
    const char *id = name(arg, ep);
    if (!id)
        put(o, "null");
    else
        put_str(o, id);
}

int rt_decision_format(const struct rt_pipeline *pl, const struct rt_decision *d, char *buf,
                       size_t len)
{
    return rt_decision_format_with(d, slot_name, pl, buf, len);
}

int rt_decision_format_with(const struct rt_decision *d, rt_ep_name_fn name, const void *arg,
                            char *buf, size_t len)
{
    if (!len)
        return TANDEM_ETOOBIG;
    struct out o = {.buf = buf, .cap = len};
    buf[0] = 0;
    put(&o, "{\"seq\":%llu,\"request_id\":%llu,\"response_id\":", (unsigned long long)d->seq,
        (unsigned long long)d->request_id);
    if (d->response_id[0])
        put_str(&o, d->response_id);
    else
        put(&o, "null");
    put(&o, ",\"decode\":");
    put_ep(&o, name, arg, d->decode);
    put(&o, ",\"prefill\":");
    put_ep(&o, name, arg, d->prefill);
    put(&o, ",\"pd\":\"%s\",\"reason\":\"%s\"", rt_pd_mode_name(d->pd),
        rt_pd_reason_name(d->verdict.reason));
    if (d->decider) {
        put(&o, ",\"decider\":");
        put_str(&o, d->decider->name);
        put(&o, ",\"uncached_tokens\":%d", d->verdict.uncached_tokens);
        if (d->verdict.local_cost > 0 || d->verdict.remote_cost > 0)
            put(&o, ",\"local_cost\":%.1f,\"remote_cost\":%.1f", d->verdict.local_cost,
                d->verdict.remote_cost);
    }
    put(&o,
        ",\"prompt_tokens\":%d,\"predicted_cached_decode\":%d,\"predicted_cached_prefill\":%d,"
        "\"latency_ns\":%llu,\"runs\":[",
        d->prompt_tokens, d->predicted_cached_decode, d->predicted_cached_prefill,
        (unsigned long long)d->latency_ns);
    for (int r = 0; r < d->n_runs; r++) {
        const struct rt_profile_run *run = &d->runs[r];
        put(&o, "%s{\"profile\":", r ? "," : "");
        put_str(&o, run->profile_name);
        put(&o, ",\"picker\":");
        put_str(&o, run->picker->name);
        put(&o, ",\"picked\":");
        put_ep(&o, name, arg, run->picked);
        put(&o, ",\"weights\":{");
        for (int s = 0; s < run->n_scorers; s++) {
            put(&o, "%s", s ? "," : "");
            put_str(&o, run->scorers[s]->name);
            put(&o, ":%g", run->weights[s]);
        }
        put(&o, "},\"candidates\":[");
        for (int i = 0; i < run->n_candidates; i++) {
            put(&o, "%s{\"endpoint\":", i ? "," : "");
            put_ep(&o, name, arg, run->candidates[i]);
            put(&o, ",\"total\":%.6g,\"scores\":{", run->total[i]);
            for (int s = 0; s < run->n_scorers; s++) {
                put(&o, "%s", s ? "," : "");
                put_str(&o, run->scorers[s]->name);
                put(&o, ":%.6g", rt_run_raw(run, i, s));
            }
            put(&o, "}}");
        }
        put(&o, "]}");
    }
    put(&o, "]}");
    if (o.overflow)
        return TANDEM_ETOOBIG;
    return (int)o.len;
}
