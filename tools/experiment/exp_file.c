/* The experiment file's loader: its top level, configurations and rates
 * (exp_file_run.c reads the sections of what every cell runs with). The
 * libyaml document API keeps every node's line, so every message names it.
 * See exp_file.h. */
#define _GNU_SOURCE
#include "exp_file.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "exp_loader.h"
#include "exp_util.h"
#include "file.h"
#include "tandem_err.h"
#include "yaml_node.h"

int exp_ld_fail(struct exp_loader *ld, int line, const char *fmt, ...)
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

int exp_ld_oom(struct exp_loader *ld)
{
    snprintf(ld->err, ld->errlen, "out of memory");
    return TANDEM_ENOMEM;
}

yaml_node_t *exp_ld_node(struct exp_loader *ld, int id)
{
    return yaml_document_get_node(&ld->doc, id);
}

static char *dup_str(const char *s)
{
    return s ? strdup(s) : NULL;
}

static const char *const top_keys[] = {
    "name",       "description", "clusters",       "routings",          "configs",    "rates",
    "restart",    "time_scale",  "bench",          "cluster_overrides", "up_timeout", "settle",
    "extra_slos", "seeds",       "goodput_search", "pd_search",         NULL};
static const char *const pd_search_keys[] = {"gpus", "tp", "pd", "colocated", NULL};
static const char *const gsearch_keys[] = {"attainment", "min_rate", "max_rate", "resolution",
                                           NULL};
static const char *const config_keys[] = {"label", "cluster", "routing", "set", NULL};
static const char *const routing_keys[] = {"label", "routing", "set", NULL};

int exp_ld_check_keys(struct exp_loader *ld, yaml_node_t *m, const char *where,
                      const char *const *valid)
{
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = exp_ld_node(ld, p->key);
        const char *ks = yn_scalar(k);
        if (!ks) {
            return exp_ld_fail(ld, yn_line(k), "%s: keys must be plain strings", where);
        }
        if (yn_name_index(ks, valid) < 0) {
            char names[512];
            yn_name_join(names, sizeof(names), valid);
            char hint[96] = "";
            if (strchr(ks, '-')) {
                char snake[64];
                snprintf(snake, sizeof(snake), "%s", ks);
                for (char *c = snake; *c; c++) {
                    *c = *c == '-' ? '_' : *c;
                }
                if (yn_name_index(snake, valid) >= 0) {
                    snprintf(hint, sizeof(hint), " (did you mean %s?)", snake);
                }
            }
            return exp_ld_fail(ld, yn_line(k), "%s%s%s: unknown key%s (valid: %s)", where,
                               where[0] ? "." : "", ks, hint, names);
        }
        for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
            const char *qs = yn_scalar(exp_ld_node(ld, q->key));
            if (qs && strcmp(qs, ks) == 0) {
                return exp_ld_fail(ld, yn_line(k), "%s%s%s: duplicate key", where,
                                   where[0] ? "." : "", ks);
            }
        }
    }
    return 0;
}

yaml_node_t *exp_ld_get(struct exp_loader *ld, yaml_node_t *m, const char *key)
{
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *ks = yn_scalar(exp_ld_node(ld, p->key));
        if (ks && strcmp(ks, key) == 0) {
            return exp_ld_node(ld, p->value);
        }
    }
    return NULL;
}

int exp_ld_string(struct exp_loader *ld, yaml_node_t *n, const char *key, const char **out)
{
    const char *s = yn_scalar(n);
    if (!s || (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && s[0] == '\0')) {
        return exp_ld_fail(ld, yn_line(n), "%s: expected a string", key);
    }
    *out = s;
    return 0;
}

static int get_number(struct exp_loader *ld, yaml_node_t *n, const char *key, double lo, double hi,
                      double *out)
{
    const char *s = yn_scalar(n);
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || end == s || *end != '\0' || errno != 0 || !(v >= lo && v <= hi)) {
        return exp_ld_fail(ld, yn_line(n), "%s: expected a number in [%g, %g], got '%s'", key, lo,
                           hi, s ? s : "(not a scalar)");
    }
    *out = v;
    return 0;
}

/* Resolves a path against the experiment's directory and checks it is
 * readable. */
static int get_path(struct exp_loader *ld, yaml_node_t *n, const char *key, char **out)
{
    const char *s;
    if (exp_ld_string(ld, n, key, &s) != 0) {
        return TANDEM_ECONFIG;
    }
    char buf[PATH_MAX], real[PATH_MAX];
    int w = s[0] == '/' ? snprintf(buf, sizeof(buf), "%s", s)
                        : snprintf(buf, sizeof(buf), "%s/%s", ld->e->base_dir, s);
    if (w < 0 || (size_t)w >= sizeof(buf)) {
        return exp_ld_fail(ld, yn_line(n), "%s: path too long", key);
    }
    if (access(buf, R_OK) != 0) {
        return exp_ld_fail(ld, yn_line(n), "%s: cannot read '%s': %s", key, buf, strerror(errno));
    }
    *out = strdup(realpath(buf, real) ? real : buf);
    return *out ? 0 : exp_ld_oom(ld);
}

/* The base name of a path without .yaml / .yml. */
static void stem(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    size_t l = strlen(out);
    if (l > 5 && strcmp(out + l - 5, ".yaml") == 0) {
        out[l - 5] = '\0';
    } else if (l > 4 && strcmp(out + l - 4, ".yml") == 0) {
        out[l - 4] = '\0';
    }
}

static int label_ok(const char *s)
{
    if (!s[0]) {
        return 0;
    }
    for (const char *c = s; *c; c++) {
        if (!isalnum((unsigned char)*c) && !strchr("._+-", *c)) {
            return 0;
        }
    }
    return 1;
}

/* A routing entry of a configuration: the file (NULL: the cluster's own),
 * and an optional `set` mapping of one key to a scalar or a list. */
struct routing_spec {
    char *path;
    const char *label; /* NULL: derived */
    yaml_node_t *set;  /* the mapping, or NULL */
    int line;
};

static int add_config(struct exp_loader *ld, const char *label, const char *cluster,
                      const char *routing, const char *set_key, const char *set_value, int line)
{
    struct exp_file *e = ld->e;
    if (e->n_configs == EXP_MAX_CONFIGS) {
        return exp_ld_fail(ld, line, "configs: more than %d configurations", EXP_MAX_CONFIGS);
    }
    if (e->n_configs == ld->cap_configs) {
        int cap = ld->cap_configs ? ld->cap_configs * 2 : 8;
        struct exp_config *c = realloc(e->configs, (size_t)cap * sizeof(*c));
        if (!c) {
            return exp_ld_oom(ld);
        }
        e->configs = c;
        ld->cap_configs = cap;
    }
    if (strlen(label) >= EXP_LABEL_MAX || !label_ok(label)) {
        return exp_ld_fail(ld, line,
                           "label: '%s' must be 1-%d characters of letters, digits and . _ + -",
                           label, EXP_LABEL_MAX - 1);
    }
    for (int i = 0; i < e->n_configs; i++) {
        if (strcmp(e->configs[i].label, label) == 0) {
            return exp_ld_fail(ld, line, "label: '%s' is used twice (also line %d)", label,
                               e->configs[i].line);
        }
    }
    struct exp_config *c = &e->configs[e->n_configs];
    memset(c, 0, sizeof(*c));
    snprintf(c->label, sizeof(c->label), "%s", label);
    c->line = line;
    c->cluster_path = dup_str(cluster);
    c->routing_path = dup_str(routing);
    c->set_key = dup_str(set_key);
    c->set_value = dup_str(set_value);
    e->n_configs++;
    if (!c->cluster_path || (routing && !c->routing_path) || (set_key && !c->set_key) ||
        (set_value && !c->set_value)) {
        return exp_ld_oom(ld);
    }
    return 0;
}

/* Adds the configurations of one cluster with one routing entry: one, or
 * one per value of a `set` list. base_label is the label before a set
 * value is appended (or substituted for "{value}"). */
static int add_configs(struct exp_loader *ld, const char *base_label, const char *cluster,
                       const struct routing_spec *r, int line)
{
    if (!r->set) {
        return add_config(ld, base_label, cluster, r->path, NULL, NULL, line);
    }
    yaml_node_t *m = r->set;
    if (m->type != YAML_MAPPING_NODE ||
        m->data.mapping.pairs.top - m->data.mapping.pairs.start != 1) {
        return exp_ld_fail(ld, yn_line(m), "set: expected a mapping of one PLUGIN.PARAM key");
    }
    yaml_node_pair_t *p = m->data.mapping.pairs.start;
    yaml_node_t *k = exp_ld_node(ld, p->key);
    yaml_node_t *v = exp_ld_node(ld, p->value);
    const char *key = yn_scalar(k);
    const char *dot = key ? strchr(key, '.') : NULL;
    if (!dot || dot == key || dot[1] == '\0' || strchr(dot + 1, '.')) {
        return exp_ld_fail(ld, yn_line(k), "set: key '%s' is not PLUGIN.PARAM", key ? key : "?");
    }
    yaml_node_item_t *start = NULL, *top = NULL;
    int one = 0;
    if (v->type == YAML_SEQUENCE_NODE) {
        start = v->data.sequence.items.start;
        top = v->data.sequence.items.top;
        if (start == top) {
            return exp_ld_fail(ld, yn_line(v), "set.%s: empty list", key);
        }
    } else if (v->type == YAML_SCALAR_NODE) {
        one = 1;
    } else {
        return exp_ld_fail(ld, yn_line(v), "set.%s: expected a value or a list of values", key);
    }
    for (int i = 0; one ? i < 1 : start + i < top; i++) {
        yaml_node_t *val = one ? v : exp_ld_node(ld, start[i]);
        const char *vs = yn_scalar(val);
        if (!vs || !vs[0]) {
            return exp_ld_fail(ld, yn_line(val), "set.%s: values must be scalars", key);
        }
        char label[256];
        const char *brace = strstr(base_label, "{value}");
        if (brace) {
            exp_sfmt(label, sizeof(label), "%.*s%s%s", (int)(brace - base_label), base_label, vs,
                     brace + 7);
        } else if (one) {
            exp_sfmt(label, sizeof(label), "%s", base_label);
        } else {
            exp_sfmt(label, sizeof(label), "%s-%s", base_label, vs);
        }
        int rc = add_config(ld, label, cluster, r->path, key, vs, yn_line(val));
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* A routing entry: "cluster" (the cluster's own), a path, or a mapping
 * {routing, label, set}. */
static int read_routing(struct exp_loader *ld, yaml_node_t *n, const char *where,
                        struct routing_spec *out)
{
    memset(out, 0, sizeof(*out));
    out->line = yn_line(n);
    if (n->type == YAML_SCALAR_NODE) {
        if (strcmp(yn_scalar(n), "cluster") == 0) {
            return 0;
        }
        return get_path(ld, n, where, &out->path);
    }
    if (n->type != YAML_MAPPING_NODE) {
        return exp_ld_fail(ld, yn_line(n), "%s: expected a path, 'cluster' or a mapping", where);
    }
    int rc = exp_ld_check_keys(ld, n, where, routing_keys);
    if (rc != 0) {
        return rc;
    }
    yaml_node_t *r = exp_ld_get(ld, n, "routing");
    if (r && !(yn_scalar(r) && strcmp(yn_scalar(r), "cluster") == 0) &&
        (rc = get_path(ld, r, "routing", &out->path)) != 0) {
        return rc;
    }
    yaml_node_t *l = exp_ld_get(ld, n, "label");
    if (l && (rc = exp_ld_string(ld, l, "label", &out->label)) != 0) {
        return rc;
    }
    out->set = exp_ld_get(ld, n, "set");
    return 0;
}

static int read_cross(struct exp_loader *ld, yaml_node_t *clusters, yaml_node_t *routings)
{
    if (clusters->type != YAML_SEQUENCE_NODE) {
        return exp_ld_fail(ld, yn_line(clusters), "clusters: expected a list of cluster files");
    }
    if (routings && routings->type != YAML_SEQUENCE_NODE) {
        return exp_ld_fail(ld, yn_line(routings), "routings: expected a list");
    }
    struct routing_spec own = {.line = yn_line(clusters)};
    int n_r = routings
                  ? (int)(routings->data.sequence.items.top - routings->data.sequence.items.start)
                  : 1;
    if (n_r == 0) {
        return exp_ld_fail(ld, yn_line(routings), "routings: empty list");
    }
    for (yaml_node_item_t *ci = clusters->data.sequence.items.start;
         ci < clusters->data.sequence.items.top; ci++) {
        yaml_node_t *cn = exp_ld_node(ld, *ci);
        char *cpath = NULL;
        int rc = get_path(ld, cn, "clusters", &cpath);
        if (rc != 0) {
            return rc;
        }
        char cstem[128];
        stem(cpath, cstem, sizeof(cstem));
        for (int ri = 0; ri < n_r && rc == 0; ri++) {
            struct routing_spec rs = own;
            if (routings) {
                rc = read_routing(ld, exp_ld_node(ld, routings->data.sequence.items.start[ri]),
                                  "routings", &rs);
            }
            if (rc == 0) {
                char label[256], rstem[128] = "";
                if (rs.label) {
                    snprintf(rstem, sizeof(rstem), "%s", rs.label);
                } else if (rs.path) {
                    stem(rs.path, rstem, sizeof(rstem));
                }
                exp_sfmt(label, sizeof(label), "%s%s%s", cstem, rstem[0] ? "+" : "", rstem);
                rc = add_configs(ld, label, cpath, &rs, rs.line);
            }
            free(rs.path);
        }
        free(cpath);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

static int read_configs(struct exp_loader *ld, yaml_node_t *list)
{
    if (list->type != YAML_SEQUENCE_NODE) {
        return exp_ld_fail(ld, yn_line(list), "configs: expected a list of mappings");
    }
    for (yaml_node_item_t *it = list->data.sequence.items.start; it < list->data.sequence.items.top;
         it++) {
        yaml_node_t *m = exp_ld_node(ld, *it);
        if (m->type != YAML_MAPPING_NODE) {
            return exp_ld_fail(ld, yn_line(m),
                               "configs: expected a mapping (cluster, routing, label, set)");
        }
        int rc = exp_ld_check_keys(ld, m, "configs[]", config_keys);
        if (rc != 0) {
            return rc;
        }
        yaml_node_t *cn = exp_ld_get(ld, m, "cluster");
        if (!cn) {
            return exp_ld_fail(ld, yn_line(m),
                               "configs[]: cluster: missing (every configuration names "
                               "its cluster file)");
        }
        char *cpath = NULL;
        if ((rc = get_path(ld, cn, "cluster", &cpath)) != 0) {
            return rc;
        }
        struct routing_spec rs = {.line = yn_line(m)};
        yaml_node_t *r = exp_ld_get(ld, m, "routing");
        if (r && !(yn_scalar(r) && strcmp(yn_scalar(r), "cluster") == 0)) {
            rc = get_path(ld, r, "routing", &rs.path);
        }
        yaml_node_t *l = exp_ld_get(ld, m, "label");
        if (rc == 0 && l) {
            rc = exp_ld_string(ld, l, "label", &rs.label);
        }
        rs.set = exp_ld_get(ld, m, "set");
        if (rc == 0) {
            char label[256], cstem[128], rstem[128] = "";
            stem(cpath, cstem, sizeof(cstem));
            if (rs.path) {
                stem(rs.path, rstem, sizeof(rstem));
            }
            if (rs.label) {
                exp_sfmt(label, sizeof(label), "%s", rs.label);
            } else {
                exp_sfmt(label, sizeof(label), "%s%s%s", cstem, rstem[0] ? "+" : "", rstem);
            }
            rc = add_configs(ld, label, cpath, &rs, yn_line(m));
        }
        free(rs.path);
        free(cpath);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int exp_rate_parse(const char *s, double *out)
{
    if (strcmp(s, "inf") == 0 || strcmp(s, ".inf") == 0 || strcmp(s, "Infinity") == 0) {
        *out = INFINITY;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0 || !(v > 0) || !isfinite(v)) {
        return TANDEM_EINVAL;
    }
    *out = v;
    return 0;
}

static int read_rates(struct exp_loader *ld, yaml_node_t *n)
{
    if (n->type != YAML_SEQUENCE_NODE ||
        n->data.sequence.items.start == n->data.sequence.items.top) {
        return exp_ld_fail(ld, yn_line(n), "rates: expected a non-empty list of request rates");
    }
    struct exp_file *e = ld->e;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *v = exp_ld_node(ld, *it);
        if (e->n_rates == EXP_MAX_RATES) {
            return exp_ld_fail(ld, yn_line(v), "rates: more than %d rates", EXP_MAX_RATES);
        }
        const char *s = yn_scalar(v);
        double r;
        if (!s || exp_rate_parse(s, &r) != 0) {
            return exp_ld_fail(ld, yn_line(v), "rates: '%s' is not a positive number or inf",
                               s ? s : "(not a scalar)");
        }
        for (int i = 0; i < e->n_rates; i++) {
            if (e->rates[i] == r) {
                return exp_ld_fail(ld, yn_line(v), "rates: %s is listed twice", s);
            }
        }
        e->rates[e->n_rates++] = r;
    }
    qsort(e->rates, (size_t)e->n_rates, sizeof(double), exp_cmp_double);
    return 0;
}

int exp_seeds(const struct exp_file *e)
{
    return e->seeds > 0 ? e->seeds : e->offline ? 5 : 3;
}

/* goodput_search: {attainment, min_rate, max_rate, resolution}. */
static int read_goodput_search(struct exp_loader *ld, yaml_node_t *m)
{
    struct search_rate_opts *o = &ld->e->goodput_search;
    if (m->type != YAML_MAPPING_NODE) {
        return exp_ld_fail(ld, yn_line(m),
                           "goodput_search: expected a mapping {attainment, min_rate, max_rate, "
                           "resolution}");
    }
    int rc = exp_ld_check_keys(ld, m, "goodput_search", gsearch_keys);
    if (rc != 0) {
        return rc;
    }
    static const struct {
        const char *key;
        double lo, hi;
        size_t off;
    } nums[] = {
        {"attainment", 0.01, 1, offsetof(struct search_rate_opts, attainment)},
        {"min_rate", 1e-6, 1e9, offsetof(struct search_rate_opts, min_rate)},
        {"max_rate", 1e-6, 1e9, offsetof(struct search_rate_opts, max_rate)},
        {"resolution", 1e-6, 1e9, offsetof(struct search_rate_opts, resolution)},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        yaml_node_t *v = exp_ld_get(ld, m, nums[i].key);
        char key[64];
        exp_sfmt(key, sizeof(key), "goodput_search.%s", nums[i].key);
        if (v && (rc = get_number(ld, v, key, nums[i].lo, nums[i].hi,
                                  (double *)((char *)o + nums[i].off))) != 0) {
            return rc;
        }
    }
    char msg[256];
    if (search_rate_opts_check(o, msg, sizeof(msg)) != 0) {
        return exp_ld_fail(ld, yn_line(m), "goodput_search: %s", msg);
    }
    ld->e->has_goodput_search = 1;
    ld->e->goodput_search_line = yn_line(m);
    return 0;
}

/* A configuration named by label (key: where, in messages): its index. */
static int config_by_label(struct exp_loader *ld, yaml_node_t *n, const char *key, int *out)
{
    const char *s;
    int rc = exp_ld_string(ld, n, key, &s);
    if (rc != 0) {
        return rc;
    }
    const struct exp_file *e = ld->e;
    for (int i = 0; i < e->n_configs; i++) {
        if (strcmp(e->configs[i].label, s) == 0) {
            *out = i;
            return 0;
        }
    }
    char have[512];
    size_t l = 0;
    have[0] = '\0';
    for (int i = 0; i < e->n_configs && l < sizeof(have); i++) {
        l += (size_t)snprintf(have + l, sizeof(have) - l, "%s%s", i ? ", " : "",
                              e->configs[i].label);
    }
    return exp_ld_fail(ld, yn_line(n), "%s: no configuration '%s' (have: %s)", key, s, have);
}

/* pd_search: {gpus, tp: [..], pd: LABEL, colocated: LABEL}. */
static int read_pd_search(struct exp_loader *ld, yaml_node_t *m)
{
    struct exp_file *e = ld->e;
    if (m->type != YAML_MAPPING_NODE) {
        return exp_ld_fail(ld, yn_line(m),
                           "pd_search: expected a mapping {gpus, tp, pd, colocated}");
    }
    int rc = exp_ld_check_keys(ld, m, "pd_search", pd_search_keys);
    if (rc != 0) {
        return rc;
    }
    yaml_node_t *v = exp_ld_get(ld, m, "gpus");
    double gpus;
    if (!v) {
        return exp_ld_fail(ld, yn_line(m), "pd_search.gpus: missing (the GPU budget)");
    }
    if ((rc = get_number(ld, v, "pd_search.gpus", 2, 65536, &gpus)) != 0) {
        return rc;
    }
    if (gpus != floor(gpus)) {
        return exp_ld_fail(ld, yn_line(v), "pd_search.gpus: expected a whole number, got '%s'",
                           yn_scalar(v));
    }
    e->pd_search.gpus = (int)gpus;
    if ((v = exp_ld_get(ld, m, "tp"))) {
        char list[256] = "", msg[256];
        size_t l = 0;
        if (v->type == YAML_SEQUENCE_NODE) {
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 it < v->data.sequence.items.top && l < sizeof(list); it++) {
                const char *t = yn_scalar(exp_ld_node(ld, *it));
                l +=
                    (size_t)snprintf(list + l, sizeof(list) - l, "%s%s", l ? "," : "", t ? t : "?");
            }
        } else if (yn_scalar(v)) {
            snprintf(list, sizeof(list), "%s", yn_scalar(v));
        }
        if (search_parse_tps(list, &e->pd_search, msg, sizeof(msg)) != 0) {
            return exp_ld_fail(ld, yn_line(v), "pd_search.tp: %s", msg + strlen("--tp: "));
        }
    }
    if (!(v = exp_ld_get(ld, m, "pd"))) {
        return exp_ld_fail(ld, yn_line(m),
                           "pd_search.pd: missing (the label of a configuration with prefill "
                           "and decode pools: the splits' base)");
    }
    if ((rc = config_by_label(ld, v, "pd_search.pd", &e->pd_search_config)) != 0) {
        return rc;
    }
    e->pd_search_colocated = -1;
    if ((v = exp_ld_get(ld, m, "colocated")) &&
        (rc = config_by_label(ld, v, "pd_search.colocated", &e->pd_search_colocated)) != 0) {
        return rc;
    }
    e->has_pd_search = 1;
    e->pd_search_line = yn_line(m);
    return 0;
}

static int load_root(struct exp_loader *ld, yaml_node_t *root)
{
    struct exp_file *e = ld->e;
    int rc = exp_ld_check_keys(ld, root, "", top_keys);
    if (rc != 0) {
        return rc;
    }
    yaml_node_t *v;
    const char *s;
    if (!(v = exp_ld_get(ld, root, "name"))) {
        return exp_ld_fail(ld, yn_line(root),
                           "name: missing (the experiment's name, used in the "
                           "report directory)");
    }
    if ((rc = exp_ld_string(ld, v, "name", &s)) != 0) {
        return rc;
    }
    if (!label_ok(s) || strlen(s) >= 128) {
        return exp_ld_fail(ld, yn_line(v), "name: '%s' must be letters, digits and . _ + -", s);
    }
    if (!(e->name = strdup(s))) {
        return exp_ld_oom(ld);
    }
    if ((v = exp_ld_get(ld, root, "description"))) {
        if ((rc = exp_ld_string(ld, v, "description", &s)) != 0) {
            return rc;
        }
        if (!(e->description = strdup(s))) {
            return exp_ld_oom(ld);
        }
    }
    yaml_node_t *clusters = exp_ld_get(ld, root, "clusters");
    yaml_node_t *routings = exp_ld_get(ld, root, "routings");
    yaml_node_t *configs = exp_ld_get(ld, root, "configs");
    if (routings && !clusters) {
        return exp_ld_fail(ld, yn_line(routings),
                           "routings: needs clusters (the cross product "
                           "clusters x routings)");
    }
    if (!clusters && !configs) {
        return exp_ld_fail(ld, yn_line(root),
                           "configs: missing (give configs, or clusters [x "
                           "routings])");
    }
    if (clusters && (rc = read_cross(ld, clusters, routings)) != 0) {
        return rc;
    }
    if (configs && (rc = read_configs(ld, configs)) != 0) {
        return rc;
    }
    if (!(v = exp_ld_get(ld, root, "rates"))) {
        return exp_ld_fail(ld, yn_line(root), "rates: missing (a list of request rates)");
    }
    if ((rc = read_rates(ld, v)) != 0) {
        return rc;
    }
    if ((v = exp_ld_get(ld, root, "restart"))) {
        s = yn_scalar(v);
        if (s && strcmp(s, "per-config") == 0) {
            e->restart = EXP_RESTART_PER_CONFIG;
        } else if (s && strcmp(s, "per-rate") == 0) {
            e->restart = EXP_RESTART_PER_RATE;
        } else {
            return exp_ld_fail(ld, yn_line(v), "restart: expected per-config or per-rate, got '%s'",
                               s ? s : "(not a scalar)");
        }
    }
    if ((v = exp_ld_get(ld, root, "time_scale"))) {
        return exp_ld_fail(ld, yn_line(v),
                           "time_scale: goes under cluster_overrides (it changes the "
                           "sim pools)");
    }
    if ((v = exp_ld_get(ld, root, "cluster_overrides")) && (rc = exp_ld_overrides(ld, v)) != 0) {
        return rc;
    }
    if ((v = exp_ld_get(ld, root, "up_timeout")) &&
        (rc = get_number(ld, v, "up_timeout", 1, 3600, &e->up_timeout_s)) != 0) {
        return rc;
    }
    if ((v = exp_ld_get(ld, root, "settle")) &&
        (rc = get_number(ld, v, "settle", 0, 600, &e->settle_s)) != 0) {
        return rc;
    }
    if ((v = exp_ld_get(ld, root, "extra_slos")) && (rc = exp_ld_extra_slos(ld, v)) != 0) {
        return rc;
    }
    double seeds;
    if ((v = exp_ld_get(ld, root, "seeds"))) {
        if ((rc = get_number(ld, v, "seeds", 1, EXP_MAX_SEEDS, &seeds)) != 0) {
            return rc;
        }
        if (seeds != floor(seeds)) {
            return exp_ld_fail(ld, yn_line(v),
                               "seeds: expected a whole number of runs per cell, "
                               "got '%s'",
                               yn_scalar(v));
        }
        e->seeds = (int)seeds;
    }
    if ((v = exp_ld_get(ld, root, "goodput_search")) && (rc = read_goodput_search(ld, v)) != 0) {
        return rc;
    }
    if ((v = exp_ld_get(ld, root, "pd_search")) && (rc = read_pd_search(ld, v)) != 0) {
        return rc;
    }
    if ((v = exp_ld_get(ld, root, "bench"))) {
        e->bench_line = yn_line(v);
        if ((rc = exp_ld_bench(ld, v)) != 0) {
            return rc;
        }
    }
    return exp_ld_check_bench(ld);
}

int exp_parse(struct exp_file **out, const char *text, size_t len, const char *name,
              const char *base_dir, char *err, size_t errlen)
{
    *out = NULL;
    if (errlen) {
        err[0] = '\0';
    }
    struct exp_loader ld = {.source = name, .err = err, .errlen = errlen};
    struct exp_file *e = calloc(1, sizeof(*e));
    if (!e) {
        return exp_ld_oom(&ld);
    }
    ld.e = e;
    e->restart = EXP_RESTART_PER_CONFIG;
    wk_config_defaults(&e->ov.cfg);
    e->up_timeout_s = 120;
    e->settle_s = 1;
    search_rate_opts_default(&e->goodput_search);
    char cwd[PATH_MAX];
    if (!base_dir) {
        base_dir = getcwd(cwd, sizeof(cwd)) ? cwd : ".";
    }
    e->source = strdup(name);
    e->base_dir = strdup(base_dir);
    if (!e->source || !e->base_dir) {
        exp_free(e);
        return exp_ld_oom(&ld);
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        exp_free(e);
        return exp_ld_oom(&ld);
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc;
    if (!yaml_parser_load(&parser, &ld.doc)) {
        rc = exp_ld_fail(&ld, (int)parser.problem_mark.line + 1, "YAML: %s",
                         parser.problem ? parser.problem : "syntax error");
        yaml_parser_delete(&parser);
        exp_free(e);
        return rc;
    }
    yaml_parser_delete(&parser);
    yaml_node_t *root = yaml_document_get_root_node(&ld.doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        rc = exp_ld_fail(&ld, root ? yn_line(root) : 1,
                         "expected a mapping (name, configs, rates, "
                         "bench, ...)");
    } else {
        rc = load_root(&ld, root);
    }
    yaml_document_delete(&ld.doc);
    if (rc != 0) {
        exp_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

int exp_load(struct exp_file **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    char *buf;
    size_t n;
    int rc = file_read_all(path, EXP_MAX_FILE, &buf, &n, err, errlen);
    if (rc != 0) {
        return rc;
    }
    char real[PATH_MAX], dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", realpath(path, real) ? real : path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
    } else {
        snprintf(dir, sizeof(dir), ".");
    }
    rc = exp_parse(out, buf, n, path, dir[0] ? dir : "/", err, errlen);
    free(buf);
    return rc;
}

void exp_free(struct exp_file *e)
{
    if (!e) {
        return;
    }
    for (int i = 0; i < e->n_configs; i++) {
        free(e->configs[i].cluster_path);
        free(e->configs[i].routing_path);
        free(e->configs[i].set_key);
        free(e->configs[i].set_value);
    }
    free(e->configs);
    for (int i = 0; i < e->bench_argc; i++) {
        free(e->bench_argv[i]);
    }
    free(e->bench_argv);
    free(e->bench_lines);
    for (int i = 0; i < e->ov.n_router_args; i++) {
        free(e->ov.router_args[i]);
    }
    free(e->ov.router_args);
    for (size_t i = 0; i < wk_n_settings; i++) {
        if (wk_settings[i].type == FLAG_STR && (e->ov.set & ((uint64_t)1 << i))) {
            free(*(char **)((char *)&e->ov.cfg + wk_settings[i].off));
        }
    }
    free(e->ov.log_level);
    free(e->source);
    free(e->base_dir);
    free(e->name);
    free(e->description);
    free(e);
}
