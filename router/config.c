/* EndpointPickerConfig YAML loader on libyaml's document API: the node tree
 * keeps each node's start mark, which gives every message its line. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "log.h"
#include "file.h"
#include "tandem_err.h"
#include "yaml_node.h"

#define CONFIG_MAX_BYTES (1u << 20)

static const char *const api_versions[] = {
    "inference.networking.x-k8s.io/v1alpha1",
    "config.apix.gateway-api-inference-extension.sigs.k8s.io/v1alpha1",
    "llm-d.ai/v1",
    "llm-d.ai/v1alpha1",
    NULL,
};

/* Top-level sections of llm-d's EndpointPickerConfig that Tandem does not
 * implement: accepted with a warning so an llm-d file loads. */
static const char *const ignored_sections[] = {
    "featureGates", "saturationDetector", "dataLayer", "flowControl",
    "parser",       "requestHandler",     NULL,
};

struct loader {
    yaml_document_t doc;
    const char *source;
    char *err;
    size_t errlen;
    struct rt_config *cfg;
};

__attribute__((format(printf, 3, 4))) static int fail(struct loader *ld, int line, const char *fmt,
                                                      ...)
{
    if (ld->errlen) {
        int n = snprintf(ld->err, ld->errlen, "%s:%d: ", ld->source, line);
        if (n >= 0 && (size_t)n < ld->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ld->err + n, ld->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return TANDEM_ECONFIG;
}

static yaml_node_t *node(struct loader *ld, int id)
{
    return yaml_document_get_node(&ld->doc, id);
}

static int in_list(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return 1;
    return 0;
}

/* Fails on a key that is not a scalar or appears twice in the same mapping. */
static int check_keys(struct loader *ld, const yaml_node_t *map, const char *what)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(ld, p->key);
        const char *ks = yn_scalar(k);
        if (!ks)
            return fail(ld, yn_line(k), "%s: keys must be plain names", what);
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++)
            if (strcmp(ks, yn_scalar(node(ld, q->key))) == 0)
                return fail(ld, yn_line(k), "%s: duplicate key '%s'", what, ks);
    }
    return 0;
}

/* A non-empty scalar value for key, or a failure naming it. */
static int want_scalar(struct loader *ld, const yaml_node_t *k, const yaml_node_t *v,
                       const char *what, const char **out)
{
    const char *s = yn_scalar(v);
    if (!s)
        return fail(ld, yn_line(v), "%s: '%s' must be a single value", what, yn_scalar(k));
    if (!*s)
        return fail(ld, yn_line(k), "%s: '%s' is empty", what, yn_scalar(k));
    *out = s;
    return 0;
}

static int copy_string(const char *s, char **out)
{
    *out = strdup(s);
    return *out ? 0 : TANDEM_ENOMEM;
}

static int add_param(struct loader *ld, struct rt_cfg_plugin *pl, const char *key,
                     const char *value, int line)
{
    struct rt_cfg_param *ps = realloc(pl->params, sizeof(*ps) * (size_t)(pl->n_params + 1));
    if (!ps)
        return TANDEM_ENOMEM;
    pl->params = ps;
    struct rt_cfg_param *p = &ps[pl->n_params];
    memset(p, 0, sizeof(*p));
    p->line = line;
    if (copy_string(key, &p->key) < 0 || copy_string(value, &p->value) < 0) {
        free(p->key);
        return TANDEM_ENOMEM;
    }
    pl->n_params++;
    return 0;
}

/* Flattens a parameters mapping into dotted keys below prefix. */
static int load_params(struct loader *ld, struct rt_cfg_plugin *pl, const yaml_node_t *map,
                       const char *prefix, int depth)
{
    char what[160];
    snprintf(what, sizeof(what), "plugin '%s' parameters", pl->name ? pl->name : pl->type);
    if (depth > 8)
        return fail(ld, yn_line(map), "%s: nested too deeply", what);
    int rc = check_keys(ld, map, what);
    if (rc < 0)
        return rc;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(ld, p->key), *v = node(ld, p->value);
        char key[256];
        int n = snprintf(key, sizeof(key), "%s%s%s", prefix, *prefix ? "." : "", yn_scalar(k));
        if (n < 0 || (size_t)n >= sizeof(key))
            return fail(ld, yn_line(k), "%s: key too long", what);
        if (v->type == YAML_MAPPING_NODE) {
            rc = load_params(ld, pl, v, key, depth + 1);
        } else if (v->type == YAML_SEQUENCE_NODE) {
            return fail(ld, yn_line(k), "%s: parameter '%s' is a list; lists are not supported",
                        what, key);
        } else {
            const char *s = yn_scalar(v);
            if (!*s)
                return fail(ld, yn_line(k), "%s: parameter '%s' has no value", what, key);
            rc = add_param(ld, pl, key, s, yn_line(k));
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_plugin(struct loader *ld, const yaml_node_t *item, struct rt_cfg_plugin *pl)
{
    pl->line = yn_line(item);
    if (item->type != YAML_MAPPING_NODE)
        return fail(ld, yn_line(item), "plugins: each entry must be a mapping with 'type'");
    int rc = check_keys(ld, item, "plugins entry");
    if (rc < 0)
        return rc;
    const yaml_node_t *params = NULL;
    for (yaml_node_pair_t *p = item->data.mapping.pairs.start; p < item->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(ld, p->key), *v = node(ld, p->value);
        const char *ks = yn_scalar(k), *s;
        if (strcmp(ks, "type") == 0) {
            if ((rc = want_scalar(ld, k, v, "plugins entry", &s)) < 0 ||
                (rc = copy_string(s, &pl->type)) < 0)
                return rc;
            pl->type_line = yn_line(k);
        } else if (strcmp(ks, "name") == 0) {
            if ((rc = want_scalar(ld, k, v, "plugins entry", &s)) < 0 ||
                (rc = copy_string(s, &pl->name)) < 0)
                return rc;
        } else if (strcmp(ks, "parameters") == 0) {
            if (v->type == YAML_MAPPING_NODE)
                params = v;
            else if (!(v->type == YAML_SCALAR_NODE && !*yn_scalar(v)))
                return fail(ld, yn_line(k), "plugins entry: 'parameters' must be a mapping");
        } else {
            return fail(ld, yn_line(k),
                        "plugins entry: unknown key '%s' (expected type, name, parameters)", ks);
        }
    }
    if (!pl->type)
        return fail(ld, pl->line, "plugins entry: missing 'type'");
    if (!pl->name && (rc = copy_string(pl->type, &pl->name)) < 0)
        return rc;
    if (params)
        return load_params(ld, pl, params, "", 0);
    return 0;
}

static int parse_weight(struct loader *ld, const yaml_node_t *k, const yaml_node_t *v,
                        struct rt_cfg_ref *r)
{
    const char *s;
    int rc = want_scalar(ld, k, v, "schedulingProfiles plugin", &s);
    if (rc < 0)
        return rc;
    char *end;
    errno = 0;
    double w = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(w) || w < 0)
        return fail(ld, yn_line(v), "pluginRef '%s': weight '%s' is not a number >= 0",
                    r->plugin_ref ? r->plugin_ref : "?", s);
    r->weight = w;
    r->has_weight = 1;
    r->weight_line = yn_line(k);
    return 0;
}

static int load_ref(struct loader *ld, const yaml_node_t *item, struct rt_cfg_ref *r)
{
    r->line = yn_line(item);
    r->weight = 1;
    if (item->type != YAML_MAPPING_NODE)
        return fail(ld, r->line,
                    "schedulingProfiles plugin: each entry must be a mapping with "
                    "'pluginRef'");
    int rc = check_keys(ld, item, "schedulingProfiles plugin");
    if (rc < 0)
        return rc;
    /* pluginRef first, so a bad weight's message can name it. */
    const yaml_node_t *wk = NULL, *wv = NULL;
    for (yaml_node_pair_t *p = item->data.mapping.pairs.start; p < item->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(ld, p->key), *v = node(ld, p->value);
        const char *ks = yn_scalar(k), *s;
        if (strcmp(ks, "pluginRef") == 0) {
            if ((rc = want_scalar(ld, k, v, "schedulingProfiles plugin", &s)) < 0 ||
                (rc = copy_string(s, &r->plugin_ref)) < 0)
                return rc;
        } else if (strcmp(ks, "weight") == 0) {
            wk = k;
            wv = v;
        } else {
            return fail(ld, yn_line(k),
                        "schedulingProfiles plugin: unknown key '%s' (expected pluginRef, weight)",
                        ks);
        }
    }
    if (!r->plugin_ref)
        return fail(ld, r->line, "schedulingProfiles plugin: missing 'pluginRef'");
    if (wk)
        return parse_weight(ld, wk, wv, r);
    return 0;
}

static int load_profile(struct loader *ld, const yaml_node_t *item, struct rt_cfg_profile *pr)
{
    pr->line = yn_line(item);
    if (item->type != YAML_MAPPING_NODE)
        return fail(ld, pr->line, "schedulingProfiles: each entry must be a mapping with 'name'");
    int rc = check_keys(ld, item, "schedulingProfiles entry");
    if (rc < 0)
        return rc;
    const yaml_node_t *plugins = NULL;
    for (yaml_node_pair_t *p = item->data.mapping.pairs.start; p < item->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(ld, p->key), *v = node(ld, p->value);
        const char *ks = yn_scalar(k), *s;
        if (strcmp(ks, "name") == 0) {
            if ((rc = want_scalar(ld, k, v, "schedulingProfiles entry", &s)) < 0 ||
                (rc = copy_string(s, &pr->name)) < 0)
                return rc;
        } else if (strcmp(ks, "plugins") == 0) {
            if (v->type == YAML_SEQUENCE_NODE)
                plugins = v;
            else if (!(v->type == YAML_SCALAR_NODE && !*yn_scalar(v)))
                return fail(ld, yn_line(k), "schedulingProfiles entry: 'plugins' must be a list");
        } else {
            return fail(ld, yn_line(k),
                        "schedulingProfiles entry: unknown key '%s' (expected name, plugins)", ks);
        }
    }
    if (!pr->name)
        return fail(ld, pr->line, "schedulingProfiles entry: missing 'name'");
    if (!plugins)
        return 0;
    int n = (int)(plugins->data.sequence.items.top - plugins->data.sequence.items.start);
    pr->refs = calloc((size_t)(n ? n : 1), sizeof(*pr->refs));
    if (!pr->refs)
        return TANDEM_ENOMEM;
    for (int i = 0; i < n; i++) {
        pr->n_refs = i + 1;
        rc = load_ref(ld, node(ld, plugins->data.sequence.items.start[i]), &pr->refs[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_root(struct loader *ld)
{
    yaml_node_t *root = yaml_document_get_root_node(&ld->doc);
    if (!root)
        return fail(ld, 1, "empty configuration (expected kind: EndpointPickerConfig)");
    if (root->type != YAML_MAPPING_NODE)
        return fail(ld, yn_line(root), "the document must be a mapping (apiVersion, kind, ...)");
    int rc = check_keys(ld, root, "EndpointPickerConfig");
    if (rc < 0)
        return rc;
    struct rt_config *cfg = ld->cfg;
    const yaml_node_t *plugins = NULL, *profiles = NULL;
    int have_kind = 0;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(ld, p->key), *v = node(ld, p->value);
        const char *ks = yn_scalar(k), *s;
        if (strcmp(ks, "apiVersion") == 0) {
            if ((rc = want_scalar(ld, k, v, "EndpointPickerConfig", &s)) < 0)
                return rc;
            if (!in_list(s, api_versions))
                return fail(ld, yn_line(v),
                            "apiVersion '%s' is not supported (use "
                            "inference.networking.x-k8s.io/v1alpha1 or llm-d.ai/v1)",
                            s);
            if ((rc = copy_string(s, &cfg->api_version)) < 0)
                return rc;
        } else if (strcmp(ks, "kind") == 0) {
            if ((rc = want_scalar(ld, k, v, "EndpointPickerConfig", &s)) < 0)
                return rc;
            if (strcmp(s, "EndpointPickerConfig") != 0)
                return fail(ld, yn_line(v), "kind '%s' is not EndpointPickerConfig", s);
            have_kind = 1;
        } else if (strcmp(ks, "plugins") == 0) {
            if (v->type != YAML_SEQUENCE_NODE)
                return fail(ld, yn_line(k), "'plugins' must be a list");
            plugins = v;
        } else if (strcmp(ks, "schedulingProfiles") == 0) {
            if (v->type != YAML_SEQUENCE_NODE)
                return fail(ld, yn_line(k), "'schedulingProfiles' must be a list");
            profiles = v;
        } else if (in_list(ks, ignored_sections)) {
            LOG_WARN("router", "%s:%d: section '%s' is not supported by tandem and is ignored",
                     ld->source, yn_line(k), ks);
        } else {
            return fail(ld, yn_line(k),
                        "unknown key '%s' (expected apiVersion, kind, plugins, "
                        "schedulingProfiles)",
                        ks);
        }
    }
    if (!cfg->api_version)
        return fail(ld, yn_line(root), "missing 'apiVersion'");
    if (!have_kind)
        return fail(ld, yn_line(root), "missing 'kind: EndpointPickerConfig'");
    if (!plugins)
        return fail(ld, yn_line(root), "missing 'plugins'");
    if (!profiles || profiles->data.sequence.items.top == profiles->data.sequence.items.start)
        return fail(ld, profiles ? yn_line(profiles) : yn_line(root),
                    "missing 'schedulingProfiles' (at least one profile is needed)");

    int n = (int)(plugins->data.sequence.items.top - plugins->data.sequence.items.start);
    cfg->plugins = calloc((size_t)(n ? n : 1), sizeof(*cfg->plugins));
    if (!cfg->plugins)
        return TANDEM_ENOMEM;
    for (int i = 0; i < n; i++) {
        cfg->n_plugins = i + 1;
        rc = load_plugin(ld, node(ld, plugins->data.sequence.items.start[i]), &cfg->plugins[i]);
        if (rc < 0)
            return rc;
    }
    n = (int)(profiles->data.sequence.items.top - profiles->data.sequence.items.start);
    cfg->profiles = calloc((size_t)n, sizeof(*cfg->profiles));
    if (!cfg->profiles)
        return TANDEM_ENOMEM;
    for (int i = 0; i < n; i++) {
        cfg->n_profiles = i + 1;
        rc = load_profile(ld, node(ld, profiles->data.sequence.items.start[i]), &cfg->profiles[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int rt_config_parse(struct rt_config **out, const char *text, size_t len, const char *name,
                    char *err, size_t errlen)
{
    struct loader ld = {.source = name ? name : "<config>", .err = err, .errlen = errlen};
    if (errlen)
        err[0] = 0;
    if (!out || (!text && len))
        return TANDEM_EINVAL;
    ld.cfg = calloc(1, sizeof(*ld.cfg));
    if (!ld.cfg || !(ld.cfg->source = strdup(ld.source))) {
        free(ld.cfg);
        return TANDEM_ENOMEM;
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        rt_config_free(ld.cfg);
        return TANDEM_ENOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)(text ? text : ""), len);
    int rc;
    if (!yaml_parser_load(&parser, &ld.doc)) {
        if (parser.error == YAML_MEMORY_ERROR) {
            rc = TANDEM_ENOMEM;
        } else {
            int line = (int)parser.problem_mark.line + 1;
            if (parser.context)
                rc = fail(&ld, line, "YAML syntax error: %s %s", parser.problem, parser.context);
            else
                rc = fail(&ld, line, "YAML syntax error: %s",
                          parser.problem ? parser.problem : "unknown");
        }
        yaml_parser_delete(&parser);
        rt_config_free(ld.cfg);
        return rc;
    }
    rc = load_root(&ld);
    yaml_document_delete(&ld.doc);
    yaml_parser_delete(&parser);
    if (rc == TANDEM_ENOMEM && errlen)
        snprintf(err, errlen, "%s: out of memory", ld.source);
    if (rc < 0) {
        rt_config_free(ld.cfg);
        return rc;
    }
    *out = ld.cfg;
    return 0;
}

int rt_config_load(struct rt_config **out, const char *path, char *err, size_t errlen)
{
    if (errlen)
        err[0] = 0;
    if (!out || !path)
        return TANDEM_EINVAL;
    char *buf;
    size_t n;
    int rc = file_read_all(path, CONFIG_MAX_BYTES, &buf, &n, err, errlen);
    if (rc == 0) {
        rc = rt_config_parse(out, buf, n, path, err, errlen);
        free(buf);
    }
    return rc;
}

void rt_config_free(struct rt_config *cfg)
{
    if (!cfg)
        return;
    for (int i = 0; i < cfg->n_plugins; i++) {
        struct rt_cfg_plugin *p = &cfg->plugins[i];
        free(p->type);
        free(p->name);
        for (int j = 0; j < p->n_params; j++) {
            free(p->params[j].key);
            free(p->params[j].value);
        }
        free(p->params);
    }
    free(cfg->plugins);
    for (int i = 0; i < cfg->n_profiles; i++) {
        struct rt_cfg_profile *pr = &cfg->profiles[i];
        free(pr->name);
        for (int j = 0; j < pr->n_refs; j++)
            free(pr->refs[j].plugin_ref);
        free(pr->refs);
    }
    free(cfg->profiles);
    free(cfg->api_version);
    free(cfg->source);
    free(cfg);
}
