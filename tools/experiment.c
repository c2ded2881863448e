/* The experiment runner: loader (libyaml document API, so messages carry
 * the file's line), derived cluster files, the `tandem up` child, one load
 * generator run per cell, and the report (markdown, CSV, JSON, SVG). See
 * experiment.h and docs/experiments.md. */
#define _GNU_SOURCE
#include "experiment.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#include "backend.h"
#include "cluster.h"
#include "flags.h"
#include "loadgen/metric.h"
#include "log.h"
#include "loadgen/report.h"
#include "file.h"
#include "supervise.h"
#include "tandem_err.h"
#include "up.h"
#include "yaml_node.h"

/* snprintf without truncation warnings: messages and paths are cut to fit
 * (paths are checked where a cut one would matter). Returns what snprintf
 * returns. */
__attribute__((format(printf, 3, 4))) static int sfmt(char *out, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(out, cap, f, ap);
    va_end(ap);
    return n;
}

/* ------------------------------------------------------------------ */
/* Loader                                                              */
/* ------------------------------------------------------------------ */

struct loader {
    yaml_document_t doc;
    const char *source;
    char *err;
    size_t errlen;
    struct exp_file *e;
    int cap_configs;
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

static int oom(struct loader *ld)
{
    snprintf(ld->err, ld->errlen, "out of memory");
    return TANDEM_ENOMEM;
}

static yaml_node_t *node_at(yaml_document_t *doc, int id)
{
    return yaml_document_get_node(doc, id);
}

static char *dup_str(const char *s)
{
    return s ? strdup(s) : NULL;
}

static const char *const top_keys[] = {
    "name",       "description", "clusters",   "routings", "configs",
    "rates",      "restart",     "time_scale", "bench",    "cluster_overrides",
    "up_timeout", "settle",      "extra_slos", NULL};
static const char *const config_keys[] = {"label", "cluster", "routing", "set", NULL};
static const char *const routing_keys[] = {"label", "routing", "set", NULL};
/* `tandem bench` flags the runner sets itself. */
static const char *const bench_managed[] = {"base-url",
                                            "url",
                                            "host",
                                            "port",
                                            "request-rate",
                                            "json",
                                            "save-result",
                                            "result-dir",
                                            "result-filename",
                                            "save-requests",
                                            "label",
                                            "progress",
                                            "disable-progress",
                                            "disable-tqdm",
                                            "metric-percentiles",
                                            "help",
                                            "version",
                                            "experiment",
                                            NULL};

/* Checks that mapping m has only keys from valid and no duplicates. */
static int check_keys(struct loader *ld, yaml_node_t *m, const char *where,
                      const char *const *valid)
{
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = node_at(&ld->doc, p->key);
        const char *ks = yn_scalar(k);
        if (!ks) {
            return fail(ld, yn_line(k), "%s: keys must be plain strings", where);
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
            return fail(ld, yn_line(k), "%s%s%s: unknown key%s (valid: %s)", where,
                        where[0] ? "." : "", ks, hint, names);
        }
        for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
            const char *qs = yn_scalar(node_at(&ld->doc, q->key));
            if (qs && strcmp(qs, ks) == 0) {
                return fail(ld, yn_line(k), "%s%s%s: duplicate key", where, where[0] ? "." : "",
                            ks);
            }
        }
    }
    return 0;
}

static yaml_node_t *get(struct loader *ld, yaml_node_t *m, const char *key)
{
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *ks = yn_scalar(node_at(&ld->doc, p->key));
        if (ks && strcmp(ks, key) == 0) {
            return node_at(&ld->doc, p->value);
        }
    }
    return NULL;
}

static int get_string(struct loader *ld, yaml_node_t *n, const char *key, const char **out)
{
    const char *s = yn_scalar(n);
    if (!s || (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && s[0] == '\0')) {
        return fail(ld, yn_line(n), "%s: expected a string", key);
    }
    *out = s;
    return 0;
}

static int get_number(struct loader *ld, yaml_node_t *n, const char *key, double lo, double hi,
                      double *out)
{
    const char *s = yn_scalar(n);
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || end == s || *end != '\0' || errno != 0 || !(v >= lo && v <= hi)) {
        return fail(ld, yn_line(n), "%s: expected a number in [%g, %g], got '%s'", key, lo, hi,
                    s ? s : "(not a scalar)");
    }
    *out = v;
    return 0;
}

/* Resolves a path against the experiment's directory and checks it is
 * readable. */
static int get_path(struct loader *ld, yaml_node_t *n, const char *key, char **out)
{
    const char *s;
    if (get_string(ld, n, key, &s) != 0) {
        return TANDEM_ECONFIG;
    }
    char buf[PATH_MAX], real[PATH_MAX];
    int w = s[0] == '/' ? snprintf(buf, sizeof(buf), "%s", s)
                        : snprintf(buf, sizeof(buf), "%s/%s", ld->e->base_dir, s);
    if (w < 0 || (size_t)w >= sizeof(buf)) {
        return fail(ld, yn_line(n), "%s: path too long", key);
    }
    if (access(buf, R_OK) != 0) {
        return fail(ld, yn_line(n), "%s: cannot read '%s': %s", key, buf, strerror(errno));
    }
    *out = strdup(realpath(buf, real) ? real : buf);
    return *out ? 0 : oom(ld);
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

static int add_config(struct loader *ld, const char *label, const char *cluster,
                      const char *routing, const char *set_key, const char *set_value, int line)
{
    struct exp_file *e = ld->e;
    if (e->n_configs == EXP_MAX_CONFIGS) {
        return fail(ld, line, "configs: more than %d configurations", EXP_MAX_CONFIGS);
    }
    if (e->n_configs == ld->cap_configs) {
        int cap = ld->cap_configs ? ld->cap_configs * 2 : 8;
        struct exp_config *c = realloc(e->configs, (size_t)cap * sizeof(*c));
        if (!c) {
            return oom(ld);
        }
        e->configs = c;
        ld->cap_configs = cap;
    }
    if (strlen(label) >= EXP_LABEL_MAX || !label_ok(label)) {
        return fail(ld, line, "label: '%s' must be 1-%d characters of letters, digits and . _ + -",
                    label, EXP_LABEL_MAX - 1);
    }
    for (int i = 0; i < e->n_configs; i++) {
        if (strcmp(e->configs[i].label, label) == 0) {
            return fail(ld, line, "label: '%s' is used twice (also line %d)", label,
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
        return oom(ld);
    }
    return 0;
}

/* Adds the configurations of one cluster with one routing entry: one, or
 * one per value of a `set` list. base_label is the label before a set
 * value is appended (or substituted for "{value}"). */
static int add_configs(struct loader *ld, const char *base_label, const char *cluster,
                       const struct routing_spec *r, int line)
{
    if (!r->set) {
        return add_config(ld, base_label, cluster, r->path, NULL, NULL, line);
    }
    yaml_node_t *m = r->set;
    if (m->type != YAML_MAPPING_NODE ||
        m->data.mapping.pairs.top - m->data.mapping.pairs.start != 1) {
        return fail(ld, yn_line(m), "set: expected a mapping of one PLUGIN.PARAM key");
    }
    yaml_node_pair_t *p = m->data.mapping.pairs.start;
    yaml_node_t *k = node_at(&ld->doc, p->key);
    yaml_node_t *v = node_at(&ld->doc, p->value);
    const char *key = yn_scalar(k);
    const char *dot = key ? strchr(key, '.') : NULL;
    if (!dot || dot == key || dot[1] == '\0' || strchr(dot + 1, '.')) {
        return fail(ld, yn_line(k), "set: key '%s' is not PLUGIN.PARAM", key ? key : "?");
    }
    yaml_node_item_t *start = NULL, *top = NULL;
    int one = 0;
    if (v->type == YAML_SEQUENCE_NODE) {
        start = v->data.sequence.items.start;
        top = v->data.sequence.items.top;
        if (start == top) {
            return fail(ld, yn_line(v), "set.%s: empty list", key);
        }
    } else if (v->type == YAML_SCALAR_NODE) {
        one = 1;
    } else {
        return fail(ld, yn_line(v), "set.%s: expected a value or a list of values", key);
    }
    for (int i = 0; one ? i < 1 : start + i < top; i++) {
        yaml_node_t *val = one ? v : node_at(&ld->doc, start[i]);
        const char *vs = yn_scalar(val);
        if (!vs || !vs[0]) {
            return fail(ld, yn_line(val), "set.%s: values must be scalars", key);
        }
        char label[256];
        const char *brace = strstr(base_label, "{value}");
        if (brace) {
            sfmt(label, sizeof(label), "%.*s%s%s", (int)(brace - base_label), base_label, vs,
                 brace + 7);
        } else if (one) {
            sfmt(label, sizeof(label), "%s", base_label);
        } else {
            sfmt(label, sizeof(label), "%s-%s", base_label, vs);
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
static int read_routing(struct loader *ld, yaml_node_t *n, const char *where,
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
        return fail(ld, yn_line(n), "%s: expected a path, 'cluster' or a mapping", where);
    }
    int rc = check_keys(ld, n, where, routing_keys);
    if (rc != 0) {
        return rc;
    }
    yaml_node_t *r = get(ld, n, "routing");
    if (r && !(yn_scalar(r) && strcmp(yn_scalar(r), "cluster") == 0) &&
        (rc = get_path(ld, r, "routing", &out->path)) != 0) {
        return rc;
    }
    yaml_node_t *l = get(ld, n, "label");
    if (l && (rc = get_string(ld, l, "label", &out->label)) != 0) {
        return rc;
    }
    out->set = get(ld, n, "set");
    return 0;
}

static int read_cross(struct loader *ld, yaml_node_t *clusters, yaml_node_t *routings)
{
    if (clusters->type != YAML_SEQUENCE_NODE) {
        return fail(ld, yn_line(clusters), "clusters: expected a list of cluster files");
    }
    if (routings && routings->type != YAML_SEQUENCE_NODE) {
        return fail(ld, yn_line(routings), "routings: expected a list");
    }
    struct routing_spec own = {.line = yn_line(clusters)};
    int n_r = routings
                  ? (int)(routings->data.sequence.items.top - routings->data.sequence.items.start)
                  : 1;
    if (n_r == 0) {
        return fail(ld, yn_line(routings), "routings: empty list");
    }
    for (yaml_node_item_t *ci = clusters->data.sequence.items.start;
         ci < clusters->data.sequence.items.top; ci++) {
        yaml_node_t *cn = node_at(&ld->doc, *ci);
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
                rc = read_routing(ld, node_at(&ld->doc, routings->data.sequence.items.start[ri]),
                                  "routings", &rs);
            }
            if (rc == 0) {
                char label[256], rstem[128] = "";
                if (rs.label) {
                    snprintf(rstem, sizeof(rstem), "%s", rs.label);
                } else if (rs.path) {
                    stem(rs.path, rstem, sizeof(rstem));
                }
                sfmt(label, sizeof(label), "%s%s%s", cstem, rstem[0] ? "+" : "", rstem);
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

static int read_configs(struct loader *ld, yaml_node_t *list)
{
    if (list->type != YAML_SEQUENCE_NODE) {
        return fail(ld, yn_line(list), "configs: expected a list of mappings");
    }
    for (yaml_node_item_t *it = list->data.sequence.items.start; it < list->data.sequence.items.top;
         it++) {
        yaml_node_t *m = node_at(&ld->doc, *it);
        if (m->type != YAML_MAPPING_NODE) {
            return fail(ld, yn_line(m),
                        "configs: expected a mapping (cluster, routing, label, set)");
        }
        int rc = check_keys(ld, m, "configs[]", config_keys);
        if (rc != 0) {
            return rc;
        }
        yaml_node_t *cn = get(ld, m, "cluster");
        if (!cn) {
            return fail(ld, yn_line(m),
                        "configs[]: cluster: missing (every configuration names "
                        "its cluster file)");
        }
        char *cpath = NULL;
        if ((rc = get_path(ld, cn, "cluster", &cpath)) != 0) {
            return rc;
        }
        struct routing_spec rs = {.line = yn_line(m)};
        yaml_node_t *r = get(ld, m, "routing");
        if (r && !(yn_scalar(r) && strcmp(yn_scalar(r), "cluster") == 0)) {
            rc = get_path(ld, r, "routing", &rs.path);
        }
        yaml_node_t *l = get(ld, m, "label");
        if (rc == 0 && l) {
            rc = get_string(ld, l, "label", &rs.label);
        }
        rs.set = get(ld, m, "set");
        if (rc == 0) {
            char label[256], cstem[128], rstem[128] = "";
            stem(cpath, cstem, sizeof(cstem));
            if (rs.path) {
                stem(rs.path, rstem, sizeof(rstem));
            }
            if (rs.label) {
                sfmt(label, sizeof(label), "%s", rs.label);
            } else {
                sfmt(label, sizeof(label), "%s%s%s", cstem, rstem[0] ? "+" : "", rstem);
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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int parse_rate_text(const char *s, double *out)
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

static int read_rates(struct loader *ld, yaml_node_t *n)
{
    if (n->type != YAML_SEQUENCE_NODE ||
        n->data.sequence.items.start == n->data.sequence.items.top) {
        return fail(ld, yn_line(n), "rates: expected a non-empty list of request rates");
    }
    struct exp_file *e = ld->e;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *v = node_at(&ld->doc, *it);
        if (e->n_rates == EXP_MAX_RATES) {
            return fail(ld, yn_line(v), "rates: more than %d rates", EXP_MAX_RATES);
        }
        const char *s = yn_scalar(v);
        double r;
        if (!s || parse_rate_text(s, &r) != 0) {
            return fail(ld, yn_line(v), "rates: '%s' is not a positive number or inf",
                        s ? s : "(not a scalar)");
        }
        for (int i = 0; i < e->n_rates; i++) {
            if (e->rates[i] == r) {
                return fail(ld, yn_line(v), "rates: %s is listed twice", s);
            }
        }
        e->rates[e->n_rates++] = r;
    }
    qsort(e->rates, (size_t)e->n_rates, sizeof(double), cmp_double);
    return 0;
}

/* The keys of cluster_overrides: router_args, the overridable worker
 * settings in wk_settings order, log_level. */
static void override_keys(const char **keys)
{
    int n = 0;
    keys[n++] = "router_args";
    for (size_t i = 0; i < wk_n_settings; i++) {
        if (wk_settings[i].flags & SETTING_OVERRIDE) {
            keys[n++] = wk_settings[i].key;
        }
    }
    keys[n++] = "log_level";
    keys[n] = NULL;
}

/* One worker setting of cluster_overrides, checked as in a cluster file. */
static int read_override(struct loader *ld, yaml_node_t *v, int i)
{
    const struct setting *s = &wk_settings[i];
    struct exp_overrides *o = &ld->e->ov;
    const char *text = yn_scalar(v);
    char why[EXP_ERR_MAX / 2];
    if (!text) {
        text = "(not a scalar)";
    }
    if (settings_parse_value(s, text, &o->cfg, why, sizeof(why)) != 0) {
        return fail(ld, yn_line(v), "cluster_overrides.%s: %s", s->key, why);
    }
    if (s->type == FLAG_STR) {
        char **dst = (char **)((char *)&o->cfg + s->off);
        if (!(*dst = strdup(text))) {
            return oom(ld);
        }
    }
    o->set |= (uint64_t)1 << i;
    return 0;
}

static int read_overrides(struct loader *ld, yaml_node_t *m)
{
    if (m->type != YAML_MAPPING_NODE) {
        return fail(ld, yn_line(m), "cluster_overrides: expected a mapping");
    }
    const char *keys[SETTINGS_MAX + 3];
    override_keys(keys);
    int rc = check_keys(ld, m, "cluster_overrides", keys);
    if (rc != 0) {
        return rc;
    }
    struct exp_overrides *o = &ld->e->ov;
    yaml_node_t *v;
    const char *s;
    for (size_t i = 0; i < wk_n_settings; i++) {
        if ((wk_settings[i].flags & SETTING_OVERRIDE) && (v = get(ld, m, wk_settings[i].key)) &&
            (rc = read_override(ld, v, (int)i)) != 0) {
            return rc;
        }
    }
    if ((v = get(ld, m, "log_level"))) {
        enum log_level level;
        if ((rc = get_string(ld, v, "cluster_overrides.log_level", &s)) != 0) {
            return rc;
        }
        if (log_level_parse(s, &level) != 0) {
            char names[128];
            yn_name_join(names, sizeof(names), log_level_names);
            return fail(ld, yn_line(v), "cluster_overrides.log_level: expected one of %s, got '%s'",
                        names, s);
        }
        if (!(o->log_level = strdup(s))) {
            return oom(ld);
        }
    }
    if ((v = get(ld, m, "router_args"))) {
        if (v->type != YAML_SEQUENCE_NODE) {
            return fail(ld, yn_line(v),
                        "cluster_overrides.router_args: expected a list of "
                        "tandem-router flags");
        }
        int n = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
        o->router_args = calloc((size_t)n + 1, sizeof(char *));
        if (!o->router_args) {
            return oom(ld);
        }
        for (int i = 0; i < n; i++) {
            yaml_node_t *a = node_at(&ld->doc, v->data.sequence.items.start[i]);
            if (!yn_scalar(a)) {
                return fail(ld, yn_line(a),
                            "cluster_overrides.router_args: items must be "
                            "strings");
            }
            if (!(o->router_args[o->n_router_args++] = strdup(yn_scalar(a)))) {
                return oom(ld);
            }
        }
    }
    return 0;
}

/* extra_slos: a list of SLO sets, each a list of KEY:MS ([ttft:500, tpot:50])
 * or one string ("ttft:500 tpot:50"). */
static int read_extra_slos(struct loader *ld, yaml_node_t *n)
{
    if (n->type != YAML_SEQUENCE_NODE) {
        return fail(ld, yn_line(n),
                    "extra_slos: expected a list of SLO sets ([ttft:MS, "
                    "tpot:MS, e2el:MS])");
    }
    struct exp_file *e = ld->e;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *set = node_at(&ld->doc, *it);
        if (e->n_extra_slos == EXP_MAX_SLOS) {
            return fail(ld, yn_line(set), "extra_slos: at most %d sets", EXP_MAX_SLOS);
        }
        char text[256] = "";
        size_t len = 0;
        if (set->type == YAML_SCALAR_NODE) {
            len = (size_t)snprintf(text, sizeof(text), "%s", yn_scalar(set));
        } else if (set->type == YAML_SEQUENCE_NODE) {
            for (yaml_node_item_t *k = set->data.sequence.items.start;
                 k < set->data.sequence.items.top && len < sizeof(text); k++) {
                const char *v = yn_scalar(node_at(&ld->doc, *k));
                len += (size_t)snprintf(text + len, sizeof(text) - len, "%s%s", len ? "," : "",
                                        v ? v : "?");
            }
        }
        struct lg_slo *slo = &e->extra_slos[e->n_extra_slos];
        lg_slo_clear(slo);
        if (len == 0 || len >= sizeof(text) || lg_parse_goodput(text, slo) != 0) {
            return fail(ld, yn_line(set),
                        "extra_slos: '%s' is not KEY:MS pairs with KEY ttft, tpot or e2el", text);
        }
        e->n_extra_slos++;
    }
    return 0;
}

/* Appends YAML node n as JSON text: mappings as objects, sequences as
 * arrays, plain scalars as numbers / true / false / null when they read as
 * one, everything else as strings. */
static int yaml_to_json(yaml_document_t *doc, yaml_node_t *n, json_t **out)
{
    if (n->type == YAML_MAPPING_NODE) {
        json_t *o = json_object();
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; o && p < n->data.mapping.pairs.top;
             p++) {
            const char *k = yn_scalar(node_at(doc, p->key));
            json_t *v = NULL;
            if (!k || yaml_to_json(doc, node_at(doc, p->value), &v) != 0) {
                json_decref(o);
                return TANDEM_EINVAL;
            }
            json_object_set_new(o, k, v);
        }
        *out = o;
        return o ? 0 : TANDEM_ENOMEM;
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        json_t *a = json_array();
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             a && it < n->data.sequence.items.top; it++) {
            json_t *v = NULL;
            if (yaml_to_json(doc, node_at(doc, *it), &v) != 0) {
                json_decref(a);
                return TANDEM_EINVAL;
            }
            json_array_append_new(a, v);
        }
        *out = a;
        return a ? 0 : TANDEM_ENOMEM;
    }
    const char *s = yn_scalar(n);
    if (!s) {
        return TANDEM_EINVAL;
    }
    if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        char *end;
        if (strcmp(s, "true") == 0 || strcmp(s, "false") == 0) {
            *out = json_boolean(s[0] == 't');
            return 0;
        }
        if (strcmp(s, "null") == 0 || strcmp(s, "~") == 0 || s[0] == '\0') {
            *out = json_null();
            return 0;
        }
        errno = 0;
        long long iv = strtoll(s, &end, 10);
        if (end != s && *end == '\0' && errno == 0) {
            *out = json_integer(iv);
            return 0;
        }
        double dv = strtod(s, &end);
        if (end != s && *end == '\0' && isfinite(dv)) {
            *out = json_real(dv);
            return 0;
        }
    }
    *out = json_string(s);
    return *out ? 0 : TANDEM_ENOMEM;
}

static int push_arg(struct loader *ld, char *arg, int line)
{
    struct exp_file *e = ld->e;
    if (!arg) {
        return oom(ld);
    }
    char **a = realloc(e->bench_argv, (size_t)(e->bench_argc + 1) * sizeof(char *));
    int *l = realloc(e->bench_lines, (size_t)(e->bench_argc + 1) * sizeof(int));
    if (a) {
        e->bench_argv = a;
    }
    if (l) {
        e->bench_lines = l;
    }
    if (!a || !l) {
        free(arg);
        return oom(ld);
    }
    e->bench_argv[e->bench_argc] = arg;
    e->bench_lines[e->bench_argc] = line;
    e->bench_argc++;
    return 0;
}

/* bench: {flag: value} -> "--flag=value" (lists joined with commas,
 * mappings as JSON). */
static int read_bench(struct loader *ld, yaml_node_t *m)
{
    if (m->type != YAML_MAPPING_NODE) {
        return fail(ld, yn_line(m), "bench: expected a mapping of tandem bench flags");
    }
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = node_at(&ld->doc, p->key);
        yaml_node_t *v = node_at(&ld->doc, p->value);
        const char *ks = yn_scalar(k);
        if (!ks || !ks[0] || strlen(ks) > 64 || ks[0] == '-') {
            return fail(ld, yn_line(k),
                        "bench: keys are tandem bench flag names without "
                        "dashes (num_prompts or num-prompts)");
        }
        char flag[72];
        snprintf(flag, sizeof(flag), "%s", ks);
        for (char *c = flag; *c; c++) {
            *c = *c == '_' ? '-' : *c;
        }
        for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
            char prev[72];
            snprintf(prev, sizeof(prev), "%s", yn_scalar(node_at(&ld->doc, q->key)));
            for (char *c = prev; *c; c++) {
                *c = *c == '_' ? '-' : *c;
            }
            if (strcmp(prev, flag) == 0) {
                return fail(ld, yn_line(k), "bench.%s: duplicate key", ks);
            }
        }
        if (yn_name_index(flag, bench_managed) >= 0) {
            return fail(ld, yn_line(k),
                        "bench.%s: set by the experiment runner (rates: for the rate; the "
                        "report for results)",
                        ks);
        }
        char *arg = NULL;
        if (v->type == YAML_SCALAR_NODE) {
            if (asprintf(&arg, "--%s=%s", flag, yn_scalar(v)) < 0) {
                arg = NULL;
            }
        } else if (v->type == YAML_SEQUENCE_NODE) {
            size_t cap = strlen(flag) + 4, len = 0;
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 it < v->data.sequence.items.top; it++) {
                const char *s = yn_scalar(node_at(&ld->doc, *it));
                if (!s) {
                    return fail(ld, yn_line(v), "bench.%s: list items must be scalars", ks);
                }
                cap += strlen(s) + 1;
            }
            arg = malloc(cap);
            if (arg) {
                len = (size_t)snprintf(arg, cap, "--%s=", flag);
                for (yaml_node_item_t *it = v->data.sequence.items.start;
                     it < v->data.sequence.items.top; it++) {
                    const char *s = yn_scalar(node_at(&ld->doc, *it));
                    len += (size_t)snprintf(arg + len, cap - len, "%s%s",
                                            it == v->data.sequence.items.start ? "" : ",", s);
                }
            }
        } else {
            json_t *j = NULL;
            if (yaml_to_json(&ld->doc, v, &j) != 0) {
                return fail(ld, yn_line(v), "bench.%s: cannot convert to JSON", ks);
            }
            char *txt = json_dumps(j, JSON_COMPACT);
            json_decref(j);
            if (txt && asprintf(&arg, "--%s=%s", flag, txt) < 0) {
                arg = NULL;
            }
            free(txt);
        }
        int rc = push_arg(ld, arg, yn_line(k));
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int exp_bench_options(const struct exp_file *e, struct bench_options *o, char *err, size_t errlen)
{
    char **argv = calloc((size_t)e->bench_argc + 5, sizeof(char *));
    if (!argv) {
        memset(o, 0, sizeof(*o));
        sfmt(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    int argc = 0;
    argv[argc++] = (char *)"bench";
    /* The report's table needs p50/p90/p99; the lag check needs the queue. */
    argv[argc++] = (char *)"--metric-percentiles=50,90,99";
    argv[argc++] = (char *)"--percentile-metrics=ttft,tpot,itl,e2el,client_queue_time";
    argv[argc++] = (char *)"--request-rate=1"; /* a placeholder: each cell sets its rate */
    for (int i = 0; i < e->bench_argc; i++) {
        argv[argc++] = e->bench_argv[i];
    }
    int rc = bench_parse_args(o, argc, argv, 1, 0, NULL, err, errlen);
    free(argv);
    return rc == FLAGS_OK ? 0 : TANDEM_EINVAL;
}

/* Whether msg names flag ("--name") as a whole word. */
static int names_flag(const char *msg, const char *flag)
{
    size_t fl = strlen(flag);
    for (const char *hit = strstr(msg, flag); hit; hit = strstr(hit + 1, flag)) {
        char next = hit[fl];
        if (!isalnum((unsigned char)next) && next != '-') {
            return 1;
        }
    }
    return 0;
}

/* Runs bench_parse_args over the bench flags so a bad flag is reported at
 * load time with the line of its key. */
static int check_bench(struct loader *ld)
{
    struct exp_file *e = ld->e;
    struct bench_options o;
    char msg[768] = "";
    int rc = exp_bench_options(e, &o, msg, sizeof(msg));
    bench_options_fini(&o);
    if (rc == 0) {
        return 0;
    }
    if (rc == TANDEM_ENOMEM) {
        return oom(ld);
    }
    int line = e->bench_line ? e->bench_line : 1;
    for (int i = 0; i < e->bench_argc; i++) {
        char flag[80];
        const char *a = e->bench_argv[i];
        const char *eq = strchr(a, '=');
        snprintf(flag, sizeof(flag), "%.*s", (int)(eq ? (size_t)(eq - a) : strlen(a)), a);
        if (names_flag(msg, flag)) {
            line = e->bench_lines[i];
            break;
        }
    }
    return fail(ld, line, "bench: %s", msg);
}

static int load_root(struct loader *ld, yaml_node_t *root)
{
    struct exp_file *e = ld->e;
    int rc = check_keys(ld, root, "", top_keys);
    if (rc != 0) {
        return rc;
    }
    yaml_node_t *v;
    const char *s;
    if (!(v = get(ld, root, "name"))) {
        return fail(ld, yn_line(root),
                    "name: missing (the experiment's name, used in the "
                    "report directory)");
    }
    if ((rc = get_string(ld, v, "name", &s)) != 0) {
        return rc;
    }
    if (!label_ok(s) || strlen(s) >= 128) {
        return fail(ld, yn_line(v), "name: '%s' must be letters, digits and . _ + -", s);
    }
    if (!(e->name = strdup(s))) {
        return oom(ld);
    }
    if ((v = get(ld, root, "description"))) {
        if ((rc = get_string(ld, v, "description", &s)) != 0) {
            return rc;
        }
        if (!(e->description = strdup(s))) {
            return oom(ld);
        }
    }
    yaml_node_t *clusters = get(ld, root, "clusters");
    yaml_node_t *routings = get(ld, root, "routings");
    yaml_node_t *configs = get(ld, root, "configs");
    if (routings && !clusters) {
        return fail(ld, yn_line(routings),
                    "routings: needs clusters (the cross product "
                    "clusters x routings)");
    }
    if (!clusters && !configs) {
        return fail(ld, yn_line(root),
                    "configs: missing (give configs, or clusters [x "
                    "routings])");
    }
    if (clusters && (rc = read_cross(ld, clusters, routings)) != 0) {
        return rc;
    }
    if (configs && (rc = read_configs(ld, configs)) != 0) {
        return rc;
    }
    if (!(v = get(ld, root, "rates"))) {
        return fail(ld, yn_line(root), "rates: missing (a list of request rates)");
    }
    if ((rc = read_rates(ld, v)) != 0) {
        return rc;
    }
    if ((v = get(ld, root, "restart"))) {
        s = yn_scalar(v);
        if (s && strcmp(s, "per-config") == 0) {
            e->restart = EXP_RESTART_PER_CONFIG;
        } else if (s && strcmp(s, "per-rate") == 0) {
            e->restart = EXP_RESTART_PER_RATE;
        } else {
            return fail(ld, yn_line(v), "restart: expected per-config or per-rate, got '%s'",
                        s ? s : "(not a scalar)");
        }
    }
    if ((v = get(ld, root, "time_scale"))) {
        return fail(ld, yn_line(v),
                    "time_scale: goes under cluster_overrides (it changes the "
                    "sim pools)");
    }
    if ((v = get(ld, root, "cluster_overrides")) && (rc = read_overrides(ld, v)) != 0) {
        return rc;
    }
    if ((v = get(ld, root, "up_timeout")) &&
        (rc = get_number(ld, v, "up_timeout", 1, 3600, &e->up_timeout_s)) != 0) {
        return rc;
    }
    if ((v = get(ld, root, "settle")) &&
        (rc = get_number(ld, v, "settle", 0, 600, &e->settle_s)) != 0) {
        return rc;
    }
    if ((v = get(ld, root, "extra_slos")) && (rc = read_extra_slos(ld, v)) != 0) {
        return rc;
    }
    if ((v = get(ld, root, "bench"))) {
        e->bench_line = yn_line(v);
        if ((rc = read_bench(ld, v)) != 0) {
            return rc;
        }
    }
    return check_bench(ld);
}

int exp_parse(struct exp_file **out, const char *text, size_t len, const char *name,
              const char *base_dir, char *err, size_t errlen)
{
    *out = NULL;
    if (errlen) {
        err[0] = '\0';
    }
    struct loader ld = {.source = name, .err = err, .errlen = errlen};
    struct exp_file *e = calloc(1, sizeof(*e));
    if (!e) {
        return oom(&ld);
    }
    ld.e = e;
    e->restart = EXP_RESTART_PER_CONFIG;
    wk_config_defaults(&e->ov.cfg);
    e->up_timeout_s = 120;
    e->settle_s = 1;
    char cwd[PATH_MAX];
    if (!base_dir) {
        base_dir = getcwd(cwd, sizeof(cwd)) ? cwd : ".";
    }
    e->source = strdup(name);
    e->base_dir = strdup(base_dir);
    if (!e->source || !e->base_dir) {
        exp_free(e);
        return oom(&ld);
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        exp_free(e);
        return oom(&ld);
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc;
    if (!yaml_parser_load(&parser, &ld.doc)) {
        rc = fail(&ld, (int)parser.problem_mark.line + 1, "YAML: %s",
                  parser.problem ? parser.problem : "syntax error");
        yaml_parser_delete(&parser);
        exp_free(e);
        return rc;
    }
    yaml_parser_delete(&parser);
    yaml_node_t *root = yaml_document_get_root_node(&ld.doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        rc = fail(&ld, root ? yn_line(root) : 1,
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

/* ------------------------------------------------------------------ */
/* Derived routing and cluster files                                   */
/* ------------------------------------------------------------------ */

static yaml_node_t *map_get(yaml_document_t *doc, yaml_node_t *m, const char *key,
                            yaml_node_pair_t **pair)
{
    if (!m || m->type != YAML_MAPPING_NODE) {
        return NULL;
    }
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *ks = yn_scalar(node_at(doc, p->key));
        if (ks && strcmp(ks, key) == 0) {
            if (pair) {
                *pair = p;
            }
            return node_at(doc, p->value);
        }
    }
    return NULL;
}

static int emit_write(void *data, unsigned char *buf, size_t size)
{
    return fwrite(buf, 1, size, (FILE *)data) == size;
}

int exp_routing_set(const char *path, const char *src_text, size_t src_len, const char *key,
                    const char *value, FILE *out, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = src_len;
    if (!src_text) {
        FILE *f = fopen(path, "rb");
        if (!f) {
            sfmt(err, errlen, "%s: %s", path, strerror(errno));
            return TANDEM_EIO;
        }
        text = malloc(EXP_MAX_FILE + 1);
        len = text ? fread(text, 1, EXP_MAX_FILE, f) : 0;
        fclose(f);
        if (!text) {
            sfmt(err, errlen, "out of memory");
            return TANDEM_ENOMEM;
        }
        src_text = text;
    }
    const char *dot = strchr(key, '.');
    char plugin[128];
    snprintf(plugin, sizeof(plugin), "%.*s", dot ? (int)(dot - key) : 0, key);
    const char *param = dot ? dot + 1 : "";
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = 0;
    if (!yaml_parser_initialize(&parser)) {
        free(text);
        sfmt(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)src_text, len);
    int loaded = yaml_parser_load(&parser, &doc);
    if (!loaded) {
        sfmt(err, errlen, "%s:%d: YAML: %s", path, (int)parser.problem_mark.line + 1,
             parser.problem ? parser.problem : "syntax error");
    }
    yaml_parser_delete(&parser);
    free(text);
    if (!loaded) {
        return TANDEM_ECONFIG;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_node_t *plugins = map_get(&doc, root, "plugins", NULL);
    int target = 0;
    if (plugins && plugins->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = plugins->data.sequence.items.start;
             !target && it < plugins->data.sequence.items.top; it++) {
            yaml_node_t *pl = node_at(&doc, *it);
            const char *nm = yn_scalar(map_get(&doc, pl, "name", NULL));
            const char *ty = yn_scalar(map_get(&doc, pl, "type", NULL));
            if ((nm && strcmp(nm, plugin) == 0) || (!nm && ty && strcmp(ty, plugin) == 0)) {
                target = *it;
            }
        }
    }
    if (!target) {
        sfmt(err, errlen, "%s: set %s: no plugin named '%s' under plugins", path, key, plugin);
        yaml_document_delete(&doc);
        return TANDEM_ECONFIG;
    }
    /* Node pointers move when nodes are added: look them up by id again. */
    yaml_node_t *pl = node_at(&doc, target);
    yaml_node_t *params = map_get(&doc, pl, "parameters", NULL);
    int params_id = 0;
    if (params && params->type != YAML_MAPPING_NODE) {
        sfmt(err, errlen, "%s:%d: plugin '%s': parameters is not a mapping", path, yn_line(params),
             plugin);
        yaml_document_delete(&doc);
        return TANDEM_ECONFIG;
    }
    if (params) {
        params_id = (int)(params - doc.nodes.start) + 1;
    } else {
        int k = yaml_document_add_scalar(&doc, NULL, (yaml_char_t *)"parameters", -1,
                                         YAML_PLAIN_SCALAR_STYLE);
        params_id = yaml_document_add_mapping(&doc, NULL, YAML_BLOCK_MAPPING_STYLE);
        if (!k || !params_id || !yaml_document_append_mapping_pair(&doc, target, k, params_id)) {
            rc = TANDEM_ENOMEM;
        }
    }
    int v = rc ? 0
               : yaml_document_add_scalar(&doc, NULL, (yaml_char_t *)value, -1,
                                          YAML_PLAIN_SCALAR_STYLE);
    if (!rc && !v) {
        rc = TANDEM_ENOMEM;
    }
    if (!rc) {
        yaml_node_pair_t *pair = NULL;
        if (map_get(&doc, node_at(&doc, params_id), param, &pair)) {
            pair->value = v;
        } else {
            int k = yaml_document_add_scalar(&doc, NULL, (yaml_char_t *)param, -1,
                                             YAML_PLAIN_SCALAR_STYLE);
            if (!k || !yaml_document_append_mapping_pair(&doc, params_id, k, v)) {
                rc = TANDEM_ENOMEM;
            }
        }
    }
    if (rc) {
        sfmt(err, errlen, "out of memory");
        yaml_document_delete(&doc);
        return rc;
    }
    fprintf(out, "# %s with %s = %s (written by tandem bench --experiment)\n", path, key, value);
    yaml_emitter_t em;
    if (!yaml_emitter_initialize(&em)) {
        yaml_document_delete(&doc);
        sfmt(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    yaml_emitter_set_output(&em, emit_write, out);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, 100);
    /* yaml_emitter_dump destroys the document, whether it succeeds or not. */
    int ok = 0;
    if (!yaml_emitter_open(&em)) {
        yaml_document_delete(&doc);
    } else {
        ok = yaml_emitter_dump(&em, &doc) && yaml_emitter_close(&em) && yaml_emitter_flush(&em);
    }
    yaml_emitter_delete(&em);
    if (!ok || ferror(out)) {
        sfmt(err, errlen, "%s: cannot write the derived routing", path);
        return TANDEM_EIO;
    }
    return 0;
}

static int mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *c = buf + 1; *c; c++) {
        if (*c == '/') {
            *c = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                return TANDEM_EIO;
            }
            *c = '/';
        }
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? TANDEM_EIO : 0;
}

static int replace_str(char **dst, const char *s)
{
    char *d = strdup(s);
    if (!d) {
        return TANDEM_ENOMEM;
    }
    free(*dst);
    *dst = d;
    return 0;
}

int exp_prepare(const struct exp_file *e, int i, const char *dir, char *cluster_file,
                size_t cluster_len, double *time_scale, char *err, size_t errlen)
{
    const struct exp_config *cfg = &e->configs[i];
    char cdir[PATH_MAX], routing_file[PATH_MAX] = "", msg[CLUSTER_ERR_MAX];
    sfmt(cdir, sizeof(cdir), "%s/configs", dir);
    if (mkdir_p(cdir) != 0) {
        sfmt(err, errlen, "cannot create %s: %s", cdir, strerror(errno));
        return TANDEM_EIO;
    }
    struct cluster *c = NULL;
    int rc = cluster_load(&c, cfg->cluster_path, msg, sizeof(msg));
    if (rc != 0) {
        sfmt(err, errlen, "%s:%d: config %s: %s", e->source, cfg->line, cfg->label, msg);
        return rc;
    }
    const struct exp_overrides *ov = &e->ov;
    for (int r = 0; r < CLUSTER_N_ROLES && rc == 0; r++) {
        struct cluster_pool *p = &c->pools[r];
        if (p->count == 0) {
            continue;
        }
        for (size_t k = 0; k < wk_n_settings && rc == 0; k++) {
            const struct setting *ws = &wk_settings[k];
            unsigned reads = backend_at((size_t)p->cfg.backend)->reads;
            if ((ov->set & ((uint64_t)1 << k)) && (!ws->reads || (reads & ws->reads)) &&
                (!ws->override_reads || (reads & ws->override_reads))) {
                rc = cluster_pool_set(p, (int)k, &ov->cfg);
            }
        }
    }
    if (rc == 0 && ov->log_level) {
        rc = replace_str(&c->log_level, ov->log_level);
    }
    if (rc == 0 && ov->n_router_args > 0) {
        /* Appended to the cluster's own router.args; tandem up's loader
         * refuses flags it sets itself. */
        char **args = realloc(c->router_args,
                              (size_t)(c->n_router_args + ov->n_router_args + 1) * sizeof(char *));
        if (!args) {
            rc = TANDEM_ENOMEM;
        } else {
            c->router_args = args;
            for (int k = 0; k < ov->n_router_args && rc == 0; k++) {
                if (!(args[c->n_router_args] = strdup(ov->router_args[k]))) {
                    rc = TANDEM_ENOMEM;
                } else {
                    c->n_router_args++;
                }
            }
            args[c->n_router_args] = NULL;
        }
    }
    if (rc == 0 && cfg->set_key) {
        const char *src = cfg->routing_path ? cfg->routing_path : c->routing_path;
        if (!src && !c->routing_text) {
            sfmt(err, errlen,
                 "%s:%d: config %s: set %s: the cluster has no routing file to change "
                 "(name one with routing:)",
                 e->source, cfg->line, cfg->label, cfg->set_key);
            cluster_free(c);
            return TANDEM_ECONFIG;
        }
        sfmt(routing_file, sizeof(routing_file), "%s/%s.routing.yaml", cdir, cfg->label);
        FILE *f = fopen(routing_file, "w");
        if (!f) {
            sfmt(err, errlen, "cannot write %s: %s", routing_file, strerror(errno));
            cluster_free(c);
            return TANDEM_EIO;
        }
        rc = exp_routing_set(src ? src : cfg->cluster_path, src ? NULL : c->routing_text,
                             src ? 0 : strlen(c->routing_text), cfg->set_key, cfg->set_value, f,
                             msg, sizeof(msg));
        if (fclose(f) != 0 && rc == 0) {
            rc = TANDEM_EIO;
            sfmt(msg, sizeof(msg), "cannot write %s", routing_file);
        }
        if (rc != 0) {
            sfmt(err, errlen, "%s:%d: config %s: %s", e->source, cfg->line, cfg->label, msg);
            cluster_free(c);
            return rc;
        }
    } else if (rc == 0 && cfg->routing_path) {
        sfmt(routing_file, sizeof(routing_file), "%s", cfg->routing_path);
    }
    if (rc == 0 && routing_file[0]) {
        rc = replace_str(&c->routing_path, routing_file);
        free(c->routing_text);
        c->routing_text = NULL;
        c->routing_flow = 0;
    }
    if (rc != 0) {
        sfmt(err, errlen, "out of memory");
        cluster_free(c);
        return rc;
    }
    /* The conversion factor between wall and modelled seconds. */
    double ts = -1;
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        const struct cluster_pool *p = &c->pools[r];
        if (p->count == 0) {
            continue;
        }
        int timed = backend_at((size_t)p->cfg.backend)->reads & BACKEND_READS_HARDWARE;
        double t = timed ? p->cfg.time_scale : 1.0;
        if (ts >= 0 && t != ts) {
            sfmt(err, errlen,
                 "%s:%d: config %s: pools run at different time scales (%g and %g): the "
                 "report could not convert to modelled seconds",
                 e->source, cfg->line, cfg->label, ts, t);
            cluster_free(c);
            return TANDEM_ECONFIG;
        }
        ts = t;
    }
    if (!(ts > 0)) {
        sfmt(err, errlen,
             "%s:%d: config %s: time_scale 0 (never sleep) has no modelled time to report; "
             "use a positive time_scale",
             e->source, cfg->line, cfg->label);
        cluster_free(c);
        return TANDEM_ECONFIG;
    }
    *time_scale = ts;
    int w = sfmt(cluster_file, cluster_len, "%s/%s.cluster.yaml", cdir, cfg->label);
    if (w < 0 || (size_t)w >= cluster_len) {
        sfmt(err, errlen, "path too long: %s", cdir);
        cluster_free(c);
        return TANDEM_EIO;
    }
    FILE *f = fopen(cluster_file, "w");
    if (!f) {
        sfmt(err, errlen, "cannot write %s: %s", cluster_file, strerror(errno));
        cluster_free(c);
        return TANDEM_EIO;
    }
    fprintf(f,
            "# Configuration '%s' of experiment %s (%s), written by tandem bench "
            "--experiment.\n",
            cfg->label, e->name, e->source);
    rc = cluster_write(c, f);
    cluster_free(c);
    if (fclose(f) != 0 || rc != 0) {
        sfmt(err, errlen, "cannot write %s", cluster_file);
        return TANDEM_EIO;
    }
    /* Validate what tandem up will read, routing included. */
    rc = cluster_load(&c, cluster_file, msg, sizeof(msg));
    cluster_free(c);
    if (rc != 0) {
        sfmt(err, errlen, "%s:%d: config %s: the derived cluster is not valid: %s", e->source,
             cfg->line, cfg->label, msg);
        return TANDEM_ECONFIG;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* The cluster: `tandem up` as a child process                          */
/* ------------------------------------------------------------------ */

static volatile sig_atomic_t g_stop;

static void on_stop_signal(int sig)
{
    g_stop = 1;
    if (sig == SIGTERM) {
        /* A run in progress listens for SIGINT (loadgen/run.c). */
        kill(getpid(), SIGINT);
    }
}

/* (Re)installs the runner's handlers: lg_run takes SIGINT over while it
 * runs and leaves the default behind. */
static void catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

struct upproc {
    pid_t pid;
    char host[128];
    int port;
    char log_path[PATH_MAX];
    double up_s; /* seconds from start to READY */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    if (s <= 0) {
        return;
    }
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !g_stop) {
    }
}

/* Copies the last lines of a log (at most max bytes) to stderr. */
static void print_tail(const char *path, long max)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > max ? size - max : 0;
    fseek(f, from, SEEK_SET);
    char buf[512];
    size_t n;
    fprintf(stderr, "--- last lines of %s ---\n", path);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
        fwrite(buf, 1, n, stderr);
    }
    fclose(f);
}

/* Waits up to timeout_s for pid to exit; returns 1 when it did. */
static int wait_exit(pid_t pid, double timeout_s, int *status)
{
    double end = now_s() + timeout_s;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) {
            return 1;
        }
        if (now_s() >= end) {
            return 0;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Stops the cluster: SIGTERM (tandem up stops everything within its 5 s),
 * SIGKILL after 10 s (the workers then get their death signal). */
static void up_stop(struct upproc *u)
{
    if (u->pid <= 0) {
        return;
    }
    int status = 0;
    kill(u->pid, SIGTERM);
    if (!wait_exit(u->pid, 10, &status)) {
        fprintf(stderr, "[exp] tandem up (pid %d) did not stop within 10 s: SIGKILL\n",
                (int)u->pid);
        kill(u->pid, SIGKILL);
        wait_exit(u->pid, 5, &status);
    } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        fprintf(stderr, "[exp] tandem up (pid %d) ended with status 0x%x (see %s)\n", (int)u->pid,
                status, u->log_path);
    }
    u->pid = 0;
}

/* Starts `bin up -c cluster_file --port 0 --run-dir run_dir` with stdout
 * and stderr in log_path, and waits for its READY line. 0, TANDEM_EIO
 * (could not start, or it exited: message in err), TANDEM_ETIMEOUT,
 * TANDEM_ECANCELLED (a stop signal). */
static int up_start(const char *bin, const char *cluster_file, const char *run_dir,
                    double timeout_s, struct upproc *u, char *err, size_t errlen)
{
    char tbuf[32];
    snprintf(tbuf, sizeof(tbuf), "%g", timeout_s);
    char *argv[] = {
        (char *)bin, (char *)"up",        (char *)"-c",    (char *)cluster_file, (char *)"--port",
        (char *)"0", (char *)"--run-dir", (char *)run_dir, (char *)"--timeout",  tbuf,
        NULL};
    int fd = open(u->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        sfmt(err, errlen, "cannot create %s: %s", u->log_path, strerror(errno));
        return TANDEM_EIO;
    }
    double t0 = now_s();
    /* Its own process group, so a terminal's Ctrl-C reaches the runner only,
     * which stops things in order; the death signal stops the cluster if the
     * runner dies. */
    pid_t pid;
    if (sv_spawn(argv, fd, &pid) != 0) {
        int e = errno;
        close(fd);
        sfmt(err, errlen, "fork: %s", strerror(e));
        return TANDEM_EIO;
    }
    close(fd);
    u->pid = pid;
    FILE *f = fopen(u->log_path, "r");
    char line[4096];
    double deadline = t0 + timeout_s + 15;
    int rc = TANDEM_ETIMEOUT;
    while (f) {
        long pos = ftell(f);
        if (fgets(line, sizeof(line), f) && strchr(line, '\n')) {
            if (strncmp(line, "READY id=up ", 12) == 0) {
                char http[160];
                if (up_ready_field(line, "http", http, sizeof(http)) == 0) {
                    char *colon = strrchr(http, ':');
                    if (colon) {
                        *colon = '\0';
                        sfmt(u->host, sizeof(u->host), "%s", http);
                        u->port = atoi(colon + 1);
                        rc = 0;
                        break;
                    }
                }
            }
            continue;
        }
        fseek(f, pos, SEEK_SET); /* a partial line: read it again when complete */
        clearerr(f);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            u->pid = 0;
            sfmt(err, errlen, "tandem up exited before the cluster was up (status 0x%x)", status);
            rc = TANDEM_EIO;
            break;
        }
        if (g_stop) {
            rc = TANDEM_ECANCELLED;
            sfmt(err, errlen, "interrupted");
            break;
        }
        if (now_s() > deadline) {
            sfmt(err, errlen, "tandem up printed no READY line within %.0f s", timeout_s + 15);
            break;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (f) {
        fclose(f);
    } else {
        sfmt(err, errlen, "cannot read %s", u->log_path);
        rc = TANDEM_EIO;
    }
    u->up_s = now_s() - t0;
    if (rc != 0) {
        if (rc != TANDEM_ECANCELLED) {
            print_tail(u->log_path, 2000);
        }
        up_stop(u);
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* Host measurements                                                   */
/* ------------------------------------------------------------------ */

struct host_sample {
    double t;
    unsigned long long busy, total; /* /proc/stat jiffies */
    double cluster_cpu;             /* seconds */
    double self_cpu;                /* seconds */
    double load1;
};

/* CPU seconds of pid and its direct children, with their reaped children. */
static double tree_cpu(pid_t root)
{
    if (root <= 0) {
        return 0;
    }
    DIR *d = opendir("/proc");
    if (!d) {
        return NAN;
    }
    double hz = (double)sysconf(_SC_CLK_TCK);
    double sum = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)de->d_name[0])) {
            continue;
        }
        char path[64], buf[1024];
        sfmt(path, sizeof(path), "/proc/%.20s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) {
            continue;
        }
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *p = strrchr(buf, ')');
        if (!p) {
            continue;
        }
        /* After the comm: state ppid pgrp session tty tpgid flags minflt
         * cminflt majflt cmajflt utime stime cutime cstime. */
        char state;
        int ppid;
        unsigned long long skip, ut, st, cut, cst;
        if (sscanf(p + 2, "%c %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu",
                   &state, &ppid, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip,
                   &ut, &st, &cut, &cst) != 15) {
            continue;
        }
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid == root || ppid == root) {
            sum += (double)(ut + st + cut + cst) / hz;
        }
    }
    closedir(d);
    return sum;
}

static void host_sample(struct host_sample *s, pid_t cluster)
{
    memset(s, 0, sizeof(*s));
    s->t = now_s();
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        unsigned long long v[8] = {0};
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) == 8) {
            for (int i = 0; i < 8; i++) {
                s->total += v[i];
            }
            s->busy = s->total - v[3] - v[4]; /* minus idle and iowait */
        }
        fclose(f);
    }
    s->load1 = NAN;
    f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &s->load1) != 1) {
            s->load1 = NAN;
        }
        fclose(f);
    }
    s->cluster_cpu = tree_cpu(cluster);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    s->self_cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                  (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void host_diff(const struct host_sample *a, const struct host_sample *b, struct exp_host *h)
{
    h->wall_s = b->t - a->t;
    h->host_busy =
        b->total > a->total ? (double)(b->busy - a->busy) / (double)(b->total - a->total) : NAN;
    h->cluster_cpu_s = b->cluster_cpu - a->cluster_cpu;
    h->loadgen_cpu_s = b->self_cpu - a->self_cpu;
    h->load1_start = a->load1;
    h->load1_end = b->load1;
    h->ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/* ------------------------------------------------------------------ */
/* Cells                                                               */
/* ------------------------------------------------------------------ */

void exp_cell_fini(struct exp_cell *c)
{
    free(c->ttft_ms);
    free(c->tpot_ms);
    json_decref(c->json);
    c->ttft_ms = c->tpot_ms = NULL;
    c->n_ttft = c->n_tpot = 0;
    c->json = NULL;
}

int exp_cell_distributions(struct exp_cell *c, const struct lg_record *recs, size_t n)
{
    free(c->ttft_ms);
    free(c->tpot_ms);
    c->n_ttft = c->n_tpot = 0;
    c->ttft_ms = malloc((n ? n : 1) * sizeof(double));
    c->tpot_ms = malloc((n ? n : 1) * sizeof(double));
    if (!c->ttft_ms || !c->tpot_ms) {
        free(c->ttft_ms);
        free(c->tpot_ms);
        c->ttft_ms = c->tpot_ms = NULL;
        return TANDEM_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const struct lg_record *r = &recs[i];
        if (!r->ok) {
            continue;
        }
        c->ttft_ms[c->n_ttft++] = r->ttft_s * 1000.0;
        if (lg_has_tpot(r)) {
            c->tpot_ms[c->n_tpot++] = lg_tpot_s(r) * 1000.0;
        }
    }
    qsort(c->ttft_ms, c->n_ttft, sizeof(double), cmp_double);
    qsort(c->tpot_ms, c->n_tpot, sizeof(double), cmp_double);
    return 0;
}

/* "2", "0.5", "inf": rates in file names and tables. */
static void rate_word(double r, char *out, size_t cap)
{
    if (isinf(r)) {
        snprintf(out, cap, "inf");
    } else {
        snprintf(out, cap, "%g", r);
    }
}

/* The runtime of one experiment. */
struct exp_run {
    const struct exp_file *e;
    struct bench_options bo;
    const char *out_dir;
    int progress;
    char cluster_files[EXP_MAX_CONFIGS][PATH_MAX];
    double time_scales[EXP_MAX_CONFIGS];
};

static json_t *num_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *cell_json_extra(const struct exp_run *x, const struct exp_cell *c, double wall_rate,
                               const struct upproc *u)
{
    const struct exp_file *e = x->e;
    const struct exp_config *cfg = &e->configs[c->config];
    const struct exp_host *h = &c->host;
    json_t *o = json_object();
    json_t *host = json_object();
    if (!o || !host) {
        json_decref(o);
        json_decref(host);
        return NULL;
    }
    double rate = e->rates[c->rate];
    json_object_set_new(o, "experiment", json_string(e->name));
    json_object_set_new(o, "config", json_string(cfg->label));
    json_object_set_new(o, "cluster", json_string(cfg->cluster_path));
    json_object_set_new(o, "routing",
                        cfg->routing_path ? json_string(cfg->routing_path) : json_null());
    if (cfg->set_key) {
        json_object_set_new(o, "set", json_pack("{ss}", cfg->set_key, cfg->set_value));
    } else {
        json_object_set_new(o, "set", json_null());
    }
    json_object_set_new(o, "derived_cluster", json_string(x->cluster_files[c->config]));
    json_object_set_new(o, "up_log", json_string(u->log_path));
    json_object_set_new(o, "rate", isinf(rate) ? json_string("inf") : json_real(rate));
    json_object_set_new(o, "rate_index", json_integer(c->rate));
    json_object_set_new(o, "wall_request_rate",
                        isinf(wall_rate) ? json_string("inf") : json_real(wall_rate));
    json_object_set_new(o, "time_scale", json_real(c->time_scale));
    json_object_set_new(o, "times", json_string("modelled seconds (wall / time_scale)"));
    json_object_set_new(o, "seed", json_integer((json_int_t)c->seed));
    json_object_set_new(
        o, "restart", json_string(e->restart == EXP_RESTART_PER_RATE ? "per-rate" : "per-config"));
    json_object_set_new(o, "sent_rate", num_or_null(c->sent_rate));
    json_t *extra = json_array();
    for (int k = 0; extra && k < e->n_extra_slos; k++) {
        const struct lg_slo *slo = &e->extra_slos[k];
        json_array_append_new(
            extra, json_pack("{s:o,s:o,s:o,s:o}", "ttft_ms",
                             slo->ttft_ms >= 0 ? json_real(slo->ttft_ms) : json_null(), "tpot_ms",
                             slo->tpot_ms >= 0 ? json_real(slo->tpot_ms) : json_null(), "e2el_ms",
                             slo->e2el_ms >= 0 ? json_real(slo->e2el_ms) : json_null(),
                             "request_goodput", num_or_null(c->extra_goodput[k])));
    }
    json_object_set_new(o, "extra_slos", extra ? extra : json_null());
    json_object_set_new(host, "ncpu", json_integer(h->ncpu));
    json_object_set_new(host, "busy", num_or_null(h->host_busy));
    json_object_set_new(host, "wall_s", num_or_null(h->wall_s));
    json_object_set_new(host, "cluster_cpu_s", num_or_null(h->cluster_cpu_s));
    json_object_set_new(host, "cluster_cpu_cores",
                        num_or_null(h->wall_s > 0 ? h->cluster_cpu_s / h->wall_s : NAN));
    json_object_set_new(host, "runner_cpu_s", num_or_null(h->loadgen_cpu_s));
    json_object_set_new(host, "runner_cpu_cores",
                        num_or_null(h->wall_s > 0 ? h->loadgen_cpu_s / h->wall_s : NAN));
    json_object_set_new(host, "load1_start", num_or_null(h->load1_start));
    json_object_set_new(host, "load1_end", num_or_null(h->load1_end));
    json_object_set_new(o, "host", host);
    return o;
}

static int write_json_file(const char *path, json_t *j, char *err, size_t errlen)
{
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
        sfmt(err, errlen, "cannot write %s", path);
        return TANDEM_EIO;
    }
    return 0;
}

/* Runs one cell against the cluster u. Returns 0 (the cell is filled, its
 * files written), or a negative code with c->error set. *interrupted is set
 * when the run was cut short by a signal. */
static int run_cell(struct exp_run *x, int ci, int ri, const struct upproc *u, struct exp_cell *c,
                    int *interrupted)
{
    const struct exp_file *e = x->e;
    const struct exp_config *cfg = &e->configs[ci];
    double ts = x->time_scales[ci];
    double rate = e->rates[ri];
    struct lg_run_config rc = x->bo.run;
    rc.host = u->host;
    rc.port = u->port;
    rc.request_rate = isinf(rate) ? INFINITY : rate / ts;
    rc.duration_s = x->bo.run.duration_s * ts;
    rc.request_timeout_s = x->bo.run.request_timeout_s * ts;
    rc.think_time_s = x->bo.run.think_time_s * ts;
    rc.workload.trace_time_scale = x->bo.run.workload.trace_time_scale * ts;
    rc.workload.seed = x->bo.run.workload.seed + (e->restart == EXP_RESTART_PER_CONFIG ? ri : 0);
    rc.progress = x->progress;
    c->config = ci;
    c->rate = ri;
    c->seed = rc.workload.seed;
    c->time_scale = ts;
    c->ok = 0;
    char err[768] = "";
    struct host_sample a, b;
    host_sample(&a, u->pid);
    struct lg_run_result res;
    int r = lg_run(&rc, &res, err, sizeof(err));
    catch_signals();
    host_sample(&b, u->pid);
    if (r != 0) {
        sfmt(c->error, sizeof(c->error), "%s", err);
        *interrupted = r == TANDEM_ECANCELLED || g_stop; /* Ctrl-C during the warm-ups */
        return r;
    }
    host_diff(&a, &b, &c->host);
    *interrupted = res.interrupted || g_stop;
    double last_start = 0;
    for (size_t i = 0; i < res.n; i++) {
        struct lg_record *rec = &res.records[i];
        rec->arrival_s /= ts;
        rec->start_s /= ts;
        rec->ttft_s /= ts;
        rec->e2el_s /= ts;
        for (uint32_t j = 0; j < rec->n_itl; j++) {
            rec->itl_s[j] /= ts;
        }
        last_start = rec->start_s > last_start ? rec->start_s : last_start;
    }
    res.duration_s /= ts;
    c->sent_rate = last_start > 0 ? (double)res.n / last_start : NAN;
    r = lg_summary_compute(res.records, res.n, res.duration_s, &x->bo.summary, &c->s);
    for (int k = 0; r == 0 && k < e->n_extra_slos; k++) {
        struct lg_summary_opts opts = x->bo.summary;
        opts.slo = e->extra_slos[k];
        struct lg_summary *tmp = malloc(sizeof(*tmp));
        r = tmp ? lg_summary_compute(res.records, res.n, res.duration_s, &opts, tmp)
                : TANDEM_ENOMEM;
        c->extra_goodput[k] = r == 0 ? tmp->request_goodput : NAN;
        free(tmp);
    }
    if (r == 0) {
        r = exp_cell_distributions(c, res.records, res.n);
    }
    if (r != 0) {
        sfmt(c->error, sizeof(c->error), "cannot compute the summary: %s", tandem_strerror(r));
        lg_run_result_free(&res);
        return r;
    }
    char base_url[256], rw[32], path[PATH_MAX + 128];
    snprintf(base_url, sizeof(base_url), "http://%s:%d", u->host, u->port);
    rate_word(rate, rw, sizeof(rw));
    struct lg_report_info info = {
        .backend = x->bo.backend,
        .label = cfg->label,
        .model = res.model,
        .dataset = lg_dataset_name(rc.workload.dataset),
        .base_url = base_url,
        .endpoint = rc.path,
        .num_prompts = rc.num_prompts >= 0 ? rc.num_prompts : (int64_t)res.n,
        .duration_target_s = x->bo.run.duration_s,
        .request_rate = rate,
        .burstiness = rc.burstiness,
        .max_concurrency = rc.max_concurrency,
        .seed = rc.workload.seed,
        .num_warmups = rc.num_warmups,
        .metrics = x->bo.metrics,
        .run = &res,
    };
    c->json = lg_report_json(&c->s, &info);
    json_t *extra = c->json ? cell_json_extra(x, c, rc.request_rate, u) : NULL;
    if (!extra) {
        sfmt(c->error, sizeof(c->error), "out of memory");
        lg_run_result_free(&res);
        return TANDEM_ENOMEM;
    }
    json_object_set_new(c->json, "experiment", extra);
    int w = 0;
    sfmt(path, sizeof(path), "%s/cells/%s-r%s.json", x->out_dir, cfg->label, rw);
    w = write_json_file(path, c->json, err, sizeof(err));
    sfmt(path, sizeof(path), "%s/requests/%s-r%s.csv", x->out_dir, cfg->label, rw);
    if (w == 0) {
        w = lg_report_save_requests(path, res.records, res.n, err, sizeof(err));
    }
    lg_run_result_free(&res);
    if (w != 0) {
        sfmt(c->error, sizeof(c->error), "%s", err);
        return w;
    }
    c->ok = 1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Report: CSV and markdown                                            */
/* ------------------------------------------------------------------ */

/* The value of percentile p in a distribution of summary s (NaN when the
 * summary was computed without it). */
static double pct_of(const struct lg_summary *s, const struct lg_dist *d, double p)
{
    return lg_dist_stat(s, d, p);
}

/* Formats v with prec decimals, or none when v is not finite. */
static const char *fmt(char *buf, size_t cap, double v, int prec, const char *none)
{
    if (!isfinite(v)) {
        snprintf(buf, cap, "%s", none);
    } else {
        snprintf(buf, cap, "%.*f", prec, v);
    }
    return buf;
}

static void csv_field(FILE *f, const char *s)
{
    if (strpbrk(s, ",\"\n\r")) {
        fputc('"', f);
        for (const char *c = s; *c; c++) {
            if (*c == '"') {
                fputc('"', f);
            }
            fputc(*c, f);
        }
        fputc('"', f);
    } else {
        fputs(s, f);
    }
}

/* "timeout:2;http_503:1" */
static void failures_text(const struct lg_summary *s, char *out, size_t cap, const char *sep,
                          const char *kv)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < s->n_failure_kinds && n < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s%s%s%lld", i ? sep : "", s->failures[i].key, kv,
                         (long long)s->failures[i].count);
        if (w < 0) {
            break;
        }
        n += (size_t)w;
    }
}

static const char *base_name(const char *path)
{
    const char *b = path ? strrchr(path, '/') : NULL;
    return b ? b + 1 : path;
}

static double goodput_or_throughput(const struct lg_summary *s)
{
    return s->has_goodput ? s->request_goodput : s->request_throughput;
}

/* results.csv's columns that come from the cell, not from the summary, at
 * their ranks lg_csv_cell_rank[] among the CSV ranks of lg_metrics
 * (loadgen/metric.h, where a new one takes its enum value and rank). */
struct exp_csv_col {
    const char *name;
    int prec;
    double (*get)(const struct exp_cell *c);
};

static double cell_sent_rate(const struct exp_cell *c)
{
    return c->sent_rate;
}

static double cell_host_busy(const struct exp_cell *c)
{
    return c->host.host_busy;
}

static double cell_cluster_cpu(const struct exp_cell *c)
{
    return c->host.wall_s > 0 ? c->host.cluster_cpu_s / c->host.wall_s : NAN;
}

static double cell_runner_cpu(const struct exp_cell *c)
{
    return c->host.wall_s > 0 ? c->host.loadgen_cpu_s / c->host.wall_s : NAN;
}

static double cell_load1_start(const struct exp_cell *c)
{
    return c->host.load1_start;
}

static double cell_load1_end(const struct exp_cell *c)
{
    return c->host.load1_end;
}

static const struct exp_csv_col cell_cols[LG_CSV_CELL_COUNT] = {
    [LG_CSV_SENT_RATE] = {.name = "sent_rate", .prec = 4, .get = cell_sent_rate},
    [LG_CSV_HOST_BUSY] = {.name = "host_busy", .prec = 3, .get = cell_host_busy},
    [LG_CSV_CLUSTER_CPU] = {.name = "cluster_cpu_cores", .prec = 3, .get = cell_cluster_cpu},
    [LG_CSV_RUNNER_CPU] = {.name = "runner_cpu_cores", .prec = 3, .get = cell_runner_cpu},
    [LG_CSV_LOAD1_START] = {.name = "load1_start", .prec = 2, .get = cell_load1_start},
    [LG_CSV_LOAD1_END] = {.name = "load1_end", .prec = 2, .get = cell_load1_end},
};

static const struct exp_csv_col *cell_col_at(int rank)
{
    for (size_t i = 0; i < LG_CSV_CELL_COUNT; i++) {
        if (lg_csv_cell_rank[i] == rank) {
            return &cell_cols[i];
        }
    }
    return NULL;
}

static int csv_last_rank(void)
{
    int last = lg_metric_last(LG_OUT_CSV);
    for (size_t i = 0; i < LG_CSV_CELL_COUNT; i++) {
        last = lg_csv_cell_rank[i] > last ? lg_csv_cell_rank[i] : last;
    }
    return last;
}

/* "ttft_p50_ms", "ttft_mean_ms" */
static void stat_name(char *out, size_t cap, const char *prefix, double stat, const char *pre,
                      const char *post)
{
    char w[32];
    if (stat == LG_STAT_MEAN) {
        snprintf(w, sizeof(w), "mean");
    } else {
        w[0] = 'p';
        lg_percentile_word(stat, w + 1, sizeof(w) - 1);
    }
    snprintf(out, cap, "%s%s%s%s", prefix, pre, w, post);
}

/* The header names of the columns at CSV rank r (with their leading commas)
 * into f; returns how many. */
static int csv_names(FILE *f, int r)
{
    const struct lg_metric *m = lg_metric_at(LG_OUT_CSV, r);
    const struct exp_csv_col *cc = cell_col_at(r);
    if (cc != NULL) {
        fprintf(f, ",%s", cc->name);
        return 1;
    }
    if (m == NULL) {
        return 0;
    }
    const struct lg_col *c = &m->at[LG_OUT_CSV];
    if (m->kind != LG_KIND_DIST) {
        fprintf(f, ",%s", c->name);
        return 1;
    }
    for (int k = 0; k < c->n_stats; k++) {
        char name[64];
        stat_name(name, sizeof(name), c->name, c->stats[k], "_", "_ms");
        fprintf(f, ",%s", name);
    }
    return c->n_stats;
}

/* The values of the columns at CSV rank r of cell c, each after a comma. */
static void csv_values(FILE *f, const struct exp_cell *c, int r)
{
    const struct lg_metric *m = lg_metric_at(LG_OUT_CSV, r);
    const struct exp_csv_col *cc = cell_col_at(r);
    const struct lg_summary *s = &c->s;
    char b[64];
    if (cc != NULL) {
        fprintf(f, ",%s", fmt(b, sizeof(b), cc->get(c), cc->prec, ""));
    } else if (m != NULL && m->kind == LG_KIND_COUNT) {
        fprintf(f, ",%lld", (long long)m->get(s));
    } else if (m != NULL && m->kind != LG_KIND_DIST) {
        fprintf(f, ",%s", fmt(b, sizeof(b), m->get(s), m->at[LG_OUT_CSV].prec, ""));
    } else if (m != NULL) {
        const struct lg_col *col = &m->at[LG_OUT_CSV];
        for (int k = 0; k < col->n_stats; k++) {
            double v = lg_dist_stat(s, m->dist(s), col->stats[k]);
            fprintf(f, ",%s", fmt(b, sizeof(b), v, col->prec, ""));
        }
    }
}

int exp_write_csv(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n)
{
    int last = csv_last_rank(), n_cols = 1; /* failures */
    fputs("config,cluster,routing,set,rate,seed,time_scale,status", f);
    for (int r = 1; r <= last; r++) {
        n_cols += csv_names(f, r);
    }
    fputs(",failures", f);
    for (int k = 0; k < e->n_extra_slos; k++) {
        fprintf(f, ",goodput_slo%d", k + 2);
    }
    fputc('\n', f);
    for (size_t i = 0; i < n; i++) {
        const struct exp_cell *c = &cells[i];
        const struct exp_config *cfg = &e->configs[c->config];
        const struct lg_summary *s = &c->s;
        char rw[32], set[256] = "", b[64];
        rate_word(e->rates[c->rate], rw, sizeof(rw));
        if (cfg->set_key) {
            snprintf(set, sizeof(set), "%s=%s", cfg->set_key, cfg->set_value);
        }
        csv_field(f, cfg->label);
        fputc(',', f);
        csv_field(f, base_name(cfg->cluster_path));
        fputc(',', f);
        csv_field(f, cfg->routing_path ? base_name(cfg->routing_path) : "");
        fputc(',', f);
        csv_field(f, set);
        fprintf(f, ",%s,%llu,%g,", rw, (unsigned long long)c->seed, c->time_scale);
        if (!c->ok) {
            char st[300];
            sfmt(st, sizeof(st), "not run: %s", c->error);
            csv_field(f, st);
            for (int k = 0; k < n_cols + e->n_extra_slos; k++) {
                fputc(',', f);
            }
            fputc('\n', f);
            continue;
        }
        fputs("ok", f);
        for (int r = 1; r <= last; r++) {
            csv_values(f, c, r);
        }
        fputc(',', f);
        char fl[512];
        failures_text(s, fl, sizeof(fl), ";", ":");
        csv_field(f, fl);
        for (int k = 0; k < e->n_extra_slos; k++) {
            fprintf(f, ",%s", fmt(b, sizeof(b), c->extra_goodput[k], 4, ""));
        }
        fputc('\n', f);
    }
    return ferror(f) ? TANDEM_EIO : 0;
}

/* Markdown cell text: '|' would end the cell. */
static void md_text(FILE *f, const char *s)
{
    for (const char *c = s; *c; c++) {
        if (*c == '|') {
            fputs("\\|", f);
        } else if (*c == '\n') {
            fputc(' ', f);
        } else {
            fputc(*c, f);
        }
    }
}

/* The cell of configuration ci at rate ri, or NULL. */
static const struct exp_cell *find_cell(const struct exp_cell *cells, size_t n, int ci, int ri)
{
    for (size_t i = 0; i < n; i++) {
        if (cells[i].config == ci && cells[i].rate == ri) {
            return &cells[i];
        }
    }
    return NULL;
}

static int used_config(const struct exp_cell *cells, size_t n, int ci)
{
    for (size_t i = 0; i < n; i++) {
        if (cells[i].config == ci) {
            return 1;
        }
    }
    return 0;
}

static int used_rate(const struct exp_cell *cells, size_t n, int ri)
{
    for (size_t i = 0; i < n; i++) {
        if (cells[i].rate == ri) {
            return 1;
        }
    }
    return 0;
}

/* "TTFT <= 500 ms, TPOT <= 50 ms" */
static void slo_words(const struct lg_slo *slo, char *out, size_t cap)
{
    size_t len = 0;
    const char *names[] = {"TTFT", "TPOT", "E2EL"};
    double v[] = {slo->ttft_ms, slo->tpot_ms, slo->e2el_ms};
    out[0] = '\0';
    for (int i = 0; i < 3; i++) {
        if (v[i] >= 0 && len < cap) {
            int w =
                snprintf(out + len, cap - len, "%s%s <= %g ms", len ? ", " : "", names[i], v[i]);
            len += w > 0 ? (size_t)w : 0;
        }
    }
}

/* The SLOs of the first run cell ("" when none is set). */
static void slo_text(const struct exp_cell *cells, size_t n, char *out, size_t cap)
{
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (cells[i].ok) {
            slo_words(&cells[i].s.slo, out, cap);
            return;
        }
    }
}

/* One row per rate, one column per configuration: goodput under the main
 * SLOs (k < 0; throughput without SLOs) or under extra SLO set k, and the
 * best configuration with its margin over the second. */
static void pivot(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n, int k)
{
    char b1[64];
    fprintf(f, "| rate |");
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (used_config(cells, n, ci)) {
            fprintf(f, " %s |", e->configs[ci].label);
        }
    }
    fprintf(f, " best |\n|---:|");
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (used_config(cells, n, ci)) {
            fprintf(f, "---:|");
        }
    }
    fprintf(f, "---|\n");
    for (int ri = 0; ri < e->n_rates; ri++) {
        if (!used_rate(cells, n, ri)) {
            continue;
        }
        char rw[32];
        rate_word(e->rates[ri], rw, sizeof(rw));
        fprintf(f, "| %s |", rw);
        int best = -1, second = -1;
        double bv = -1, sv = -1;
        for (int ci = 0; ci < e->n_configs; ci++) {
            if (!used_config(cells, n, ci)) {
                continue;
            }
            const struct exp_cell *c = find_cell(cells, n, ci, ri);
            double v = !c || !c->ok ? NAN
                       : k < 0      ? goodput_or_throughput(&c->s)
                                    : c->extra_goodput[k];
            fprintf(f, " %s |", fmt(b1, sizeof(b1), v, 2, "-"));
            if (!isfinite(v)) {
                continue;
            }
            if (v > bv) {
                second = best;
                sv = bv;
                best = ci;
                bv = v;
            } else if (v > sv) {
                second = ci;
                sv = v;
            }
        }
        if (best < 0) {
            fprintf(f, " - |\n");
        } else if (second < 0) {
            fprintf(f, " %s |\n", e->configs[best].label);
        } else if (bv == sv || (sv > 0 && (bv / sv - 1.0) * 100.0 < 0.05)) {
            fprintf(f, " tie |\n"); /* what "+0.0%" would say */
        } else if (sv > 0) {
            fprintf(f, " %s (+%.1f%% over %s) |\n", e->configs[best].label, (bv / sv - 1.0) * 100.0,
                    e->configs[second].label);
        } else {
            fprintf(f, " %s (others 0) |\n", e->configs[best].label);
        }
    }
}

static int max_ncpu(const struct exp_cell *cells, size_t n)
{
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        m = cells[i].host.ncpu > m ? cells[i].host.ncpu : m;
    }
    return m;
}

/* The Results table's metric headers, in lg_metrics' markdown order, each
 * " name |"; returns how many columns. */
static int md_names(FILE *f)
{
    int last = lg_metric_last(LG_OUT_MD), cols = 0;
    for (int r = 1; r <= last; r++) {
        const struct lg_metric *m = lg_metric_at(LG_OUT_MD, r);
        const struct lg_col *c = m ? &m->at[LG_OUT_MD] : NULL;
        if (c == NULL) {
            continue;
        }
        if (m->kind != LG_KIND_DIST) {
            fprintf(f, " %s |", c->name);
            cols++;
            continue;
        }
        for (int k = 0; k < c->n_stats; k++) {
            char name[64];
            stat_name(name, sizeof(name), c->name, c->stats[k], " ", "");
            fprintf(f, " %s |", name);
            cols++;
        }
    }
    return cols;
}

/* One value of the Results table ("v | "): a ratio in percent, "-" (a
 * ratio: its text) when undefined. */
static void md_value(FILE *f, const struct lg_metric *m, double v, int prec)
{
    char b[64];
    if (m->kind == LG_KIND_RATIO && isfinite(v)) {
        fprintf(f, "%.*f%% | ", prec, v * 100.0);
    } else if (m->kind == LG_KIND_RATIO && m->none != NULL) {
        fprintf(f, "%s | ", m->none);
    } else {
        fprintf(f, "%s | ", fmt(b, sizeof(b), v, prec, "-"));
    }
}

static void md_values(FILE *f, const struct lg_summary *s)
{
    int last = lg_metric_last(LG_OUT_MD);
    for (int r = 1; r <= last; r++) {
        const struct lg_metric *m = lg_metric_at(LG_OUT_MD, r);
        const struct lg_col *c = m ? &m->at[LG_OUT_MD] : NULL;
        if (c == NULL) {
            continue;
        }
        if (m->kind != LG_KIND_DIST) {
            md_value(f, m, m->get(s), c->prec);
            continue;
        }
        for (int k = 0; k < c->n_stats; k++) {
            md_value(f, m, lg_dist_stat(s, m->dist(s), c->stats[k]), c->prec);
        }
    }
}

int exp_write_markdown(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                       const char *const *meta, int n_meta)
{
    char b1[64], b2[64], slo[160];
    slo_text(cells, n, slo, sizeof(slo));
    int has_slo = slo[0] != '\0';
    fprintf(f, "# Experiment %s\n\n", e->name);
    if (e->description) {
        fprintf(f, "%s\n\n", e->description);
    }
    for (int i = 0; i < n_meta; i++) {
        fprintf(f, "- %s\n", meta[i]);
    }
    fprintf(f, "- Times are modelled: wall seconds divided by the cluster's time_scale (1 for "
               "tiny clusters).\n");
    if (has_slo) {
        fprintf(f,
                "- SLOs: %s. Goodput = completed requests meeting every SLO / duration "
                "(req/s).\n",
                slo);
    } else {
        fprintf(f, "- No SLOs given: the goodput columns show the request throughput.\n");
    }
    fprintf(f, "- Restart: %s.\n",
            e->restart == EXP_RESTART_PER_RATE
                ? "a fresh cluster per cell, the same seed at every rate"
                : "one cluster per configuration; rate i uses seed + i, so no prompt is "
                  "repeated on a cluster");
    fprintf(f, "- Workload (tandem bench flags):");
    for (int i = 0; i < e->bench_argc; i++) {
        fprintf(f, " `%s`", e->bench_argv[i]);
    }
    fprintf(f, "%s\n\n", e->bench_argc ? "" : " (defaults)");

    fprintf(f, "## Configurations\n\n| config | cluster | routing | set | time scale |\n"
               "|---|---|---|---|---:|\n");
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (!used_config(cells, n, ci)) {
            continue;
        }
        const struct exp_config *cfg = &e->configs[ci];
        double ts = NAN;
        for (size_t i = 0; i < n; i++) {
            if (cells[i].config == ci) {
                ts = cells[i].time_scale;
                break;
            }
        }
        fprintf(f, "| %s | %s | %s | ", cfg->label, base_name(cfg->cluster_path),
                cfg->routing_path ? base_name(cfg->routing_path) : "(the cluster's)");
        if (cfg->set_key) {
            fprintf(f, "%s = %s", cfg->set_key, cfg->set_value);
        }
        fprintf(f, " | %g |\n", ts);
    }

    fprintf(f, "\n## Results\n\nRates, goodput and throughput in requests per second; "
               "latencies in ms (p50 / p90 / p99).\n\n"
               "| config | rate |");
    int md_cols = md_names(f);
    fprintf(f, " failures |\n|---|---:|");
    for (int k = 0; k < md_cols; k++) {
        fprintf(f, "---:|");
    }
    fprintf(f, "---|\n");
    for (size_t i = 0; i < n; i++) {
        const struct exp_cell *c = &cells[i];
        const struct lg_summary *s = &c->s;
        char rw[32];
        rate_word(e->rates[c->rate], rw, sizeof(rw));
        fprintf(f, "| %s | %s | ", e->configs[c->config].label, rw);
        if (!c->ok) {
            for (int k = 0; k < md_cols; k++) {
                fprintf(f, "- | ");
            }
            fprintf(f, "not run: ");
            md_text(f, c->error);
            fprintf(f, " |\n");
            continue;
        }
        md_values(f, s);
        char fl[512];
        failures_text(s, fl, sizeof(fl), ", ", " ");
        if (s->failed > 0) {
            fprintf(f, "%lld (", (long long)s->failed);
            md_text(f, fl);
            fprintf(f, ") |\n");
        } else {
            fprintf(f, "0 |\n");
        }
    }

    fprintf(f, "\n## %s by rate\n\n", has_slo ? "Goodput" : "Throughput");
    pivot(f, e, cells, n, -1);
    for (int k = 0; k < e->n_extra_slos; k++) {
        char t[160];
        slo_words(&e->extra_slos[k], t, sizeof(t));
        fprintf(f,
                "\n## Goodput by rate, %s\n\nThe same requests under another SLO set "
                "(extra_slos).\n\n",
                t);
        pivot(f, e, cells, n, k);
    }

    fprintf(f,
            "\n## Machine\n\nSent rate = measured requests / time of the last send "
            "(modelled req/s): below the rate means the load generator fell behind. Client "
            "lag = send time - scheduled arrival. CPU in cores (wall), over the measured run; "
            "host busy = share of the machine's CPUs busy (%d CPUs), whatever runs on "
            "them.\n\n"
            "| config | rate | sent rate | client lag p99 (ms) | cluster CPU | runner CPU | "
            "host busy | load1 start / end |\n"
            "|---|---:|---:|---:|---:|---:|---:|---|\n",
            max_ncpu(cells, n));
    for (size_t i = 0; i < n; i++) {
        const struct exp_cell *c = &cells[i];
        char rw[32];
        rate_word(e->rates[c->rate], rw, sizeof(rw));
        fprintf(f, "| %s | %s | ", e->configs[c->config].label, rw);
        if (!c->ok) {
            fprintf(f, "- | - | - | - | - | - |\n");
            continue;
        }
        const struct exp_host *h = &c->host;
        fprintf(f, "%s | %s | ", fmt(b1, sizeof(b1), c->sent_rate, 2, "-"),
                fmt(b2, sizeof(b2), pct_of(&c->s, &c->s.queue, 99), 1, "-"));
        fprintf(f, "%s | %s | ",
                fmt(b1, sizeof(b1), h->wall_s > 0 ? h->cluster_cpu_s / h->wall_s : NAN, 2, "-"),
                fmt(b2, sizeof(b2), h->wall_s > 0 ? h->loadgen_cpu_s / h->wall_s : NAN, 2, "-"));
        if (isfinite(h->host_busy)) {
            fprintf(f, "%.0f%% | ", h->host_busy * 100.0);
        } else {
            fprintf(f, "- | ");
        }
        fprintf(f, "%s / %s |\n", fmt(b1, sizeof(b1), h->load1_start, 2, "-"),
                fmt(b2, sizeof(b2), h->load1_end, 2, "-"));
    }
    fprintf(f, "\nPlots: goodput.svg, ttft_cdf.svg, tpot_cdf.svg. Per cell: cells/*.json "
               "(vLLM's keys), requests/*.csv.\n");
    return ferror(f) ? TANDEM_EIO : 0;
}

/* ------------------------------------------------------------------ */
/* Report: SVG                                                         */
/* ------------------------------------------------------------------ */

/* Tableau 10; configurations past the tenth are dashed. */
static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

struct axis {
    double lo, hi;
    int log;
};

/* The smallest of 1, 2, 5 x 10^k that is >= x (x > 0). */
static double nice_step(double x)
{
    double p = pow(10.0, floor(log10(x)));
    static const double m[] = {1, 2, 5, 10};
    for (int i = 0; i < 4; i++) {
        if (m[i] * p >= x * (1 - 1e-12)) {
            return m[i] * p;
        }
    }
    return 10 * p;
}

/* A linear axis from 0 to the first multiple of a nice step >= max. */
static struct axis axis_linear(double max)
{
    struct axis a = {0, 1, 0};
    if (max > 0 && isfinite(max)) {
        double step = nice_step(max / 5);
        a.hi = ceil(max / step - 1e-9) * step;
    }
    return a;
}

static double axis_pos(const struct axis *a, double v, double p0, double p1)
{
    double t;
    if (a->log) {
        v = v < a->lo ? a->lo : v;
        t = (log10(v) - log10(a->lo)) / (log10(a->hi) - log10(a->lo));
    } else {
        t = (v - a->lo) / (a->hi - a->lo);
    }
    return p0 + t * (p1 - p0);
}

static void svg_text_esc(FILE *f, const char *s)
{
    for (const char *c = s; *c; c++) {
        switch (*c) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*c, f);
        }
    }
}

static void tick_label(double v, double step, char *out, size_t cap)
{
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    snprintf(out, cap, "%.*f", dec, v);
}

/* Axes with ticks and grid lines for the plot area [x0, x1] x [y0, y1]
 * (y0 at the top). */
static void svg_axes(FILE *f, const struct axis *ax, const struct axis *ay, double x0, double x1,
                     double y0, double y1, const char *xlabel, const char *ylabel)
{
    fprintf(f, "<g class=\"axes\" font-size=\"11\" fill=\"#333\">\n");
    /* y ticks */
    double ystep = nice_step((ay->hi - ay->lo) / 5);
    for (double v = ay->lo; v <= ay->hi + ystep * 1e-6; v += ystep) {
        double y = axis_pos(ay, v, y1, y0);
        char t[32];
        tick_label(v, ystep, t, sizeof(t));
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                x0, y, x1, y, x0 - 4, y + 4, t);
    }
    /* x ticks */
    if (ax->log) {
        for (double v = ax->lo; v <= ax->hi * (1 + 1e-9); v *= 10) {
            double x = axis_pos(ax, v, x0, x1);
            char t[32];
            tick_label(v, v, t, sizeof(t));
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                    x, y0, x, y1, x, y1 + 14, t);
        }
    } else {
        double xstep = nice_step((ax->hi - ax->lo) / 5);
        for (double v = ax->lo; v <= ax->hi + xstep * 1e-6; v += xstep) {
            double x = axis_pos(ax, v, x0, x1);
            char t[32];
            tick_label(v, xstep, t, sizeof(t));
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                    x, y0, x, y1, x, y1 + 14, t);
        }
    }
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#333\"/>\n",
            x0, y0, x1 - x0, y1 - y0);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (x0 + x1) / 2, y1 + 32);
    svg_text_esc(f, xlabel);
    fprintf(f,
            "</text>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">",
            x0 - 42, (y0 + y1) / 2, x0 - 42, (y0 + y1) / 2);
    svg_text_esc(f, ylabel);
    fprintf(f, "</text>\n</g>\n");
}

static void svg_stroke(FILE *f, int ci)
{
    fprintf(f, "stroke=\"%s\" stroke-width=\"2\"%s", palette[ci % 10],
            ci >= 10 ? " stroke-dasharray=\"6 3\"" : "");
}

static void svg_legend(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                       double x, double y)
{
    fprintf(f, "<g class=\"legend\" font-size=\"12\">\n");
    int row = 0;
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (!used_config(cells, n, ci)) {
            continue;
        }
        double yy = y + 18.0 * row++;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" ", x, yy, x + 24, yy);
        svg_stroke(f, ci);
        fprintf(f, "/><text x=\"%.1f\" y=\"%.1f\">", x + 30, yy + 4);
        svg_text_esc(f, e->configs[ci].label);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</g>\n");
}

static void svg_begin(FILE *f, double w, double h, const char *title)
{
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">",
            w, h, w, h, w / 2);
    svg_text_esc(f, title);
    fprintf(f, "</text>\n");
}

#define GP_W  720.0
#define GP_H  440.0
#define GP_X0 70.0
#define GP_X1 540.0
#define GP_Y0 50.0
#define GP_Y1 380.0

int exp_write_svg_goodput(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n)
{
    char slo[160];
    slo_text(cells, n, slo, sizeof(slo));
    int has_slo = slo[0] != '\0';
    double xmax = 0, ymax = 0;
    for (size_t i = 0; i < n; i++) {
        double r = e->rates[cells[i].rate];
        if (!cells[i].ok || isinf(r)) {
            continue;
        }
        xmax = r > xmax ? r : xmax;
        double v = goodput_or_throughput(&cells[i].s);
        ymax = isfinite(v) && v > ymax ? v : ymax;
    }
    struct axis ax = axis_linear(xmax), ay = axis_linear(ymax);
    char title[320];
    if (has_slo) {
        snprintf(title, sizeof(title), "%s: goodput (%s)", e->name, slo);
    } else {
        snprintf(title, sizeof(title), "%s: request throughput", e->name);
    }
    svg_begin(f, GP_W, GP_H, title);
    svg_axes(f, &ax, &ay, GP_X0, GP_X1, GP_Y0, GP_Y1, "request rate (req/s)",
             has_slo ? "goodput (req/s)" : "throughput (req/s)");
    /* The ideal: every request good. */
    fprintf(f,
            "<line class=\"ideal\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"#aaa\" stroke-dasharray=\"3 3\"/>\n",
            GP_X0, GP_Y1, axis_pos(&ax, fmin(ax.hi, ay.hi), GP_X0, GP_X1),
            axis_pos(&ay, fmin(ax.hi, ay.hi), GP_Y1, GP_Y0));
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (!used_config(cells, n, ci)) {
            continue;
        }
        fprintf(f, "<g class=\"config\">\n<polyline fill=\"none\" ");
        svg_stroke(f, ci);
        fprintf(f, " points=\"");
        int first = 1;
        for (int ri = 0; ri < e->n_rates; ri++) {
            const struct exp_cell *c = find_cell(cells, n, ci, ri);
            if (!c || !c->ok || isinf(e->rates[ri])) {
                continue;
            }
            double v = goodput_or_throughput(&c->s);
            fprintf(f, "%s%.1f,%.1f", first ? "" : " ", axis_pos(&ax, e->rates[ri], GP_X0, GP_X1),
                    axis_pos(&ay, isfinite(v) ? v : 0, GP_Y1, GP_Y0));
            first = 0;
        }
        fprintf(f, "\"/>\n");
        for (int ri = 0; ri < e->n_rates; ri++) {
            const struct exp_cell *c = find_cell(cells, n, ci, ri);
            if (!c || !c->ok || isinf(e->rates[ri])) {
                continue;
            }
            double v = goodput_or_throughput(&c->s);
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    axis_pos(&ax, e->rates[ri], GP_X0, GP_X1),
                    axis_pos(&ay, isfinite(v) ? v : 0, GP_Y1, GP_Y0), palette[ci % 10]);
        }
        fprintf(f, "</g>\n");
    }
    svg_legend(f, e, cells, n, GP_X1 + 20, GP_Y0 + 10);
    fprintf(f, "</svg>\n");
    return ferror(f) ? TANDEM_EIO : 0;
}

#define CDF_PW    300.0 /* panel */
#define CDF_PH    250.0
#define CDF_ML    60.0 /* margins inside a panel */
#define CDF_MR    12.0
#define CDF_MT    28.0
#define CDF_MB    46.0
#define CDF_TOP   36.0 /* title band */
#define CDF_LEG   190.0
#define CDF_STEPS 100

int exp_write_svg_cdf(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                      int metric)
{
    const char *name = metric == 0 ? "TTFT" : "TPOT";
    double lo = INFINITY, hi = 0;
    int panels = 0;
    for (int ri = 0; ri < e->n_rates; ri++) {
        panels += used_rate(cells, n, ri);
    }
    for (size_t i = 0; i < n; i++) {
        const double *v = metric == 0 ? cells[i].ttft_ms : cells[i].tpot_ms;
        size_t m = metric == 0 ? cells[i].n_ttft : cells[i].n_tpot;
        if (!cells[i].ok || m == 0) {
            continue;
        }
        for (size_t k = 0; k < m; k++) {
            if (v[k] > 0) {
                lo = v[k] < lo ? v[k] : lo;
                break; /* sorted: the first positive is the smallest */
            }
        }
        hi = v[m - 1] > hi ? v[m - 1] : hi;
    }
    struct axis ax;
    if (hi > 0 && isfinite(lo) && hi / lo > 20) {
        ax.log = 1;
        ax.lo = pow(10.0, floor(log10(lo)));
        ax.hi = pow(10.0, ceil(log10(hi)));
    } else {
        ax = axis_linear(hi);
    }
    struct axis ay = {0, 1, 0};
    int cols = panels < 3 ? (panels ? panels : 1) : 3;
    int rows = panels ? (panels + cols - 1) / cols : 1;
    double w = cols * CDF_PW + CDF_LEG, h = CDF_TOP + rows * CDF_PH;
    char title[256], xlabel[64];
    snprintf(title, sizeof(title), "%s: %s CDF per rate%s", e->name, name,
             ax.log ? " (log x)" : "");
    snprintf(xlabel, sizeof(xlabel), "%s (ms)", name);
    svg_begin(f, w, h, title);
    int p = 0;
    for (int ri = 0; ri < e->n_rates; ri++) {
        if (!used_rate(cells, n, ri)) {
            continue;
        }
        double px = (p % cols) * CDF_PW, py = CDF_TOP + (p / cols) * CDF_PH;
        double x0 = px + CDF_ML, x1 = px + CDF_PW - CDF_MR, y0 = py + CDF_MT,
               y1 = py + CDF_PH - CDF_MB;
        p++;
        char rw[32];
        rate_word(e->rates[ri], rw, sizeof(rw));
        fprintf(f,
                "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                "font-size=\"12\">rate %s req/s</text>\n",
                (x0 + x1) / 2, y0 - 8, rw);
        svg_axes(f, &ax, &ay, x0, x1, y0, y1, xlabel, "fraction of requests");
        for (int ci = 0; ci < e->n_configs; ci++) {
            const struct exp_cell *c = find_cell(cells, n, ci, ri);
            const double *v = c ? (metric == 0 ? c->ttft_ms : c->tpot_ms) : NULL;
            size_t m = c ? (metric == 0 ? c->n_ttft : c->n_tpot) : 0;
            if (!c || !c->ok || m == 0) {
                continue;
            }
            fprintf(f, "<polyline fill=\"none\" ");
            svg_stroke(f, ci);
            fprintf(f, " points=\"");
            for (int q = 0; q <= CDF_STEPS; q++) {
                double val = lg_percentile(v, m, 100.0 * q / CDF_STEPS);
                fprintf(f, "%s%.1f,%.1f", q ? " " : "", axis_pos(&ax, val, x0, x1),
                        axis_pos(&ay, (double)q / CDF_STEPS, y1, y0));
            }
            fprintf(f, "\"/>\n");
        }
        fprintf(f, "</g>\n");
    }
    svg_legend(f, e, cells, n, cols * CDF_PW + 10, CDF_TOP + CDF_MT + 10);
    fprintf(f, "</svg>\n");
    return ferror(f) ? TANDEM_EIO : 0;
}

typedef int (*writer_fn)(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                         const char *const *meta, int n_meta, int arg);

static int w_csv(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                 const char *const *meta, int n_meta, int arg)
{
    (void)meta, (void)n_meta, (void)arg;
    return exp_write_csv(f, e, cells, n);
}

static int w_md(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                const char *const *meta, int n_meta, int arg)
{
    (void)arg;
    return exp_write_markdown(f, e, cells, n, meta, n_meta);
}

static int w_goodput(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                     const char *const *meta, int n_meta, int arg)
{
    (void)meta, (void)n_meta, (void)arg;
    return exp_write_svg_goodput(f, e, cells, n);
}

static int w_cdf(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                 const char *const *meta, int n_meta, int arg)
{
    (void)meta, (void)n_meta;
    return exp_write_svg_cdf(f, e, cells, n, arg);
}

int exp_write_report(const char *dir, const struct exp_file *e, const struct exp_cell *cells,
                     size_t n, const char *const *meta, int n_meta, char *err, size_t errlen)
{
    static const struct {
        const char *name;
        writer_fn fn;
        int arg;
    } files[] = {
        {"summary.md", w_md, 0},    {"results.csv", w_csv, 0},  {"goodput.svg", w_goodput, 0},
        {"ttft_cdf.svg", w_cdf, 0}, {"tpot_cdf.svg", w_cdf, 1},
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[PATH_MAX + 32], tmp[PATH_MAX + 40];
        sfmt(path, sizeof(path), "%s/%s", dir, files[i].name);
        sfmt(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (!f) {
            sfmt(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
            return TANDEM_EIO;
        }
        int rc = files[i].fn(f, e, cells, n, meta, n_meta, files[i].arg);
        if (fclose(f) != 0 || rc != 0 || rename(tmp, path) != 0) {
            sfmt(err, errlen, "cannot write %s", path);
            unlink(tmp);
            return TANDEM_EIO;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* exp_main                                                            */
/* ------------------------------------------------------------------ */

static const char *const restart_choices[] = {"file", "per-config", "per-rate", NULL};

static void usage(FILE *f, const struct flag *flags, size_t n)
{
    flags_usage(f,
                "tandem bench --experiment FILE [--out DIR] [flags]\n\n"
                "Runs an experiment file: every configuration (cluster file x routing, each\n"
                "started with `tandem up`) at every request rate with the same workload and\n"
                "seed, then writes a report directory: summary.md, results.csv, cells/*.json,\n"
                "requests/*.csv, goodput.svg, ttft_cdf.svg, tpot_cdf.svg. Times are modelled\n"
                "seconds (wall / the sim's time_scale). See docs/experiments.md.",
                flags, n);
}

static int parse_rates_flag(const char *s, struct exp_file *e, char *err, size_t errlen)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", s);
    e->n_rates = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        double r;
        if (e->n_rates == EXP_MAX_RATES || parse_rate_text(t, &r) != 0) {
            sfmt(err, errlen, "--rates: '%s' is not a positive number or inf", t);
            return TANDEM_EINVAL;
        }
        for (int i = 0; i < e->n_rates; i++) {
            if (e->rates[i] == r) {
                sfmt(err, errlen, "--rates: %s is listed twice", t);
                return TANDEM_EINVAL;
            }
        }
        e->rates[e->n_rates++] = r;
    }
    if (e->n_rates == 0) {
        sfmt(err, errlen, "--rates: no rate given");
        return TANDEM_EINVAL;
    }
    qsort(e->rates, (size_t)e->n_rates, sizeof(double), cmp_double);
    return 0;
}

/* Marks the configurations named in a comma list. */
static int parse_only(const char *s, const struct exp_file *e, int *sel, char *err, size_t errlen)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), "%s", s);
    for (int i = 0; i < e->n_configs; i++) {
        sel[i] = 0;
    }
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < e->n_configs; i++) {
            if (strcmp(e->configs[i].label, t) == 0) {
                sel[i] = found = 1;
            }
        }
        if (!found) {
            size_t n = (size_t)sfmt(err, errlen, "--only: no configuration '%s' (have:", t);
            for (int i = 0; i < e->n_configs && n < errlen; i++) {
                n += (size_t)snprintf(err + n, errlen - n, " %s", e->configs[i].label);
            }
            if (n < errlen) {
                snprintf(err + n, errlen - n, ")");
            }
            return TANDEM_EINVAL;
        }
    }
    return 0;
}

/* Meta lines of the report. */
struct meta {
    char lines[8][1024];
    const char *ptr[8];
    int n;
};

__attribute__((format(printf, 2, 3))) static void meta_add(struct meta *m, const char *fmt_, ...)
{
    if (m->n == 8) {
        return;
    }
    va_list ap;
    va_start(ap, fmt_);
    vsnprintf(m->lines[m->n], sizeof(m->lines[0]), fmt_, ap);
    va_end(ap);
    m->ptr[m->n] = m->lines[m->n];
    m->n++;
}

static void load_text(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        double a = 0, b = 0, c = 0;
        if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) {
            snprintf(out, cap, "%.2f, %.2f, %.2f", a, b, c);
        }
        fclose(f);
    }
}

static void print_cell(const struct exp_file *e, const struct exp_cell *c)
{
    char rw[32], b1[32], b2[32], b3[32];
    rate_word(e->rates[c->rate], rw, sizeof(rw));
    if (!c->ok) {
        fprintf(stderr, "[exp]   %s @ %s: not run: %s\n", e->configs[c->config].label, rw,
                c->error);
        return;
    }
    const struct lg_summary *s = &c->s;
    fprintf(stderr,
            "[exp]   %s @ %s req/s: %lld ok, %lld failed, %s %s req/s, TTFT p90 %s ms, TPOT "
            "p90 %s ms, host busy %.0f%%, load %.2f\n",
            e->configs[c->config].label, rw, (long long)s->completed, (long long)s->failed,
            s->has_goodput ? "goodput" : "throughput",
            fmt(b1, sizeof(b1), goodput_or_throughput(s), 2, "-"),
            fmt(b2, sizeof(b2), pct_of(s, &s->ttft, 90), 1, "-"),
            fmt(b3, sizeof(b3), pct_of(s, &s->tpot, 90), 1, "-"),
            isfinite(c->host.host_busy) ? c->host.host_busy * 100 : 0, c->host.load1_end);
}

/* Shallow copies of the cells run so far, in slot order, for the report. */
static size_t compact(const struct exp_cell *cells, size_t n, struct exp_cell *view)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (cells[i].done) {
            view[m++] = cells[i];
        }
    }
    return m;
}

/* The `tandem` binary to start clusters with. */
static void self_binary(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    out[n > 0 ? n : 0] = '\0';
}

int exp_main(int argc, char **argv)
{
    const char *file = NULL, *out = NULL, *only = NULL, *rates = NULL, *bin = NULL;
    int dry_run = 0, restart = 0, progress = isatty(STDERR_FILENO), disable_progress = 0;
    const struct flag flags[] = {
        {"experiment", FLAG_STR, &file, "experiment file (YAML)", 0, 0, NULL},
        {"out", FLAG_STR, &out,
         "report directory (default: run/experiments/<name>-<YYYYmmdd-HHMMSS>)", 0, 0, NULL},
        {"dry-run", FLAG_BOOL, &dry_run,
         "validate, write the derived cluster files, print the plan; start nothing", 0, 0, NULL},
        {"only", FLAG_STR, &only, "run only these configurations (comma-separated labels)", 0, 0,
         NULL},
        {"rates", FLAG_STR, &rates, "replace the file's rates (comma-separated)", 0, 0, NULL},
        {"restart", FLAG_CHOICE, &restart, "file (the file's restart:), per-config or per-rate", 0,
         0, restart_choices},
        {"tandem-bin", FLAG_STR, &bin, "the tandem binary that runs `up` (default: this one)", 0, 0,
         NULL},
        {"progress", FLAG_BOOL, &progress, "show the load generator's progress line", 0, 0, NULL},
        {"disable-progress", FLAG_BOOL, &disable_progress, "never show it", 0, 0, NULL},
    };
    char err[EXP_ERR_MAX] = "";
    int rc = flags_parse(flags, FLAGS_COUNT(flags), argc, argv, 1, NULL, err, sizeof(err));
    if (rc == FLAGS_HELP) {
        usage(stdout, flags, FLAGS_COUNT(flags));
        return 0;
    }
    if (rc == FLAGS_VERSION) {
        printf("tandem %s\n", TANDEM_VERSION);
        return 0;
    }
    if (rc != FLAGS_OK) {
        fprintf(stderr, "tandem bench: %s\n", err);
        return 2;
    }
    if (!file) {
        fprintf(stderr, "tandem bench: --experiment FILE is required with the experiment flags\n");
        return 2;
    }
    struct exp_file *e = NULL;
    rc = exp_load(&e, file, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tandem bench: %s\n", err);
        return 2;
    }
    if (restart > 0) {
        e->restart = restart == 1 ? EXP_RESTART_PER_CONFIG : EXP_RESTART_PER_RATE;
    }
    int sel[EXP_MAX_CONFIGS];
    for (int i = 0; i < e->n_configs; i++) {
        sel[i] = 1;
    }
    if ((rates && parse_rates_flag(rates, e, err, sizeof(err)) != 0) ||
        (only && parse_only(only, e, sel, err, sizeof(err)) != 0)) {
        fprintf(stderr, "tandem bench: %s\n", err);
        exp_free(e);
        return 2;
    }
    struct exp_run *x = calloc(1, sizeof(*x));
    if (!x) {
        exp_free(e);
        return 1;
    }
    x->e = e;
    x->progress = progress && !disable_progress;
    if (exp_bench_options(e, &x->bo, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem bench: %s: %s\n", file, err);
        bench_options_fini(&x->bo);
        free(x);
        exp_free(e);
        return 2;
    }
    char outbuf[PATH_MAX], binbuf[PATH_MAX], when[64];
    time_t t0 = time(NULL);
    struct tm tm;
    localtime_r(&t0, &tm);
    strftime(when, sizeof(when), "%Y%m%d-%H%M%S", &tm);
    if (!out) {
        sfmt(outbuf, sizeof(outbuf), "run/experiments/%s-%s", e->name, when);
        out = outbuf;
    }
    x->out_dir = out;
    if (!bin) {
        self_binary(binbuf, sizeof(binbuf));
        bin = binbuf;
    }
    int exit_code = 0;
    struct exp_cell *cells = NULL, *view = NULL;
    size_t n_cells = 0;
    char sub[PATH_MAX + 16];
    const char *subs[] = {"", "/cells", "/requests", "/runs", "/logs"};
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        sfmt(sub, sizeof(sub), "%s%s", out, subs[i]);
        if (mkdir_p(sub) != 0) {
            fprintf(stderr, "tandem bench: cannot create %s: %s\n", sub, strerror(errno));
            exit_code = 1;
            goto done;
        }
    }
    /* Every derived cluster is written and validated before anything starts. */
    int n_sel = 0;
    for (int i = 0; i < e->n_configs; i++) {
        if (!sel[i]) {
            continue;
        }
        n_sel++;
        rc = exp_prepare(e, i, out, x->cluster_files[i], sizeof(x->cluster_files[i]),
                         &x->time_scales[i], err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "tandem bench: %s\n", err);
            exit_code = 2;
            goto done;
        }
    }
    double per_cell = x->bo.run.duration_s > 0 ? x->bo.run.duration_s : NAN;
    fprintf(stderr, "[exp] %s: %d configurations x %d rates, restart %s; report in %s\n", e->name,
            n_sel, e->n_rates,
            e->restart == EXP_RESTART_PER_RATE ? "per rate" : "per configuration", out);
    for (int i = 0; i < e->n_configs; i++) {
        if (!sel[i]) {
            continue;
        }
        fprintf(stderr, "[exp]   %-28s %s up -c %s --port 0 (time_scale %g)\n", e->configs[i].label,
                bin, x->cluster_files[i], x->time_scales[i]);
        double est = 0;
        for (int r = 0; r < e->n_rates; r++) {
            double cell = isfinite(per_cell) ? per_cell
                          : isinf(e->rates[r]) || x->bo.run.num_prompts < 0
                              ? 0
                              : (double)x->bo.run.num_prompts / e->rates[r];
            est += cell * x->time_scales[i];
        }
        fprintf(stderr, "[exp]   %-28s sending for about %.0f s (wall) in all\n", "", est);
    }
    if (dry_run) {
        fprintf(stderr, "[exp] dry run: nothing started\n");
        goto done;
    }
    n_cells = (size_t)n_sel * (size_t)e->n_rates;
    cells = calloc(n_cells, sizeof(*cells));
    view = calloc(n_cells, sizeof(*view));
    if (!cells || !view) {
        exit_code = 1;
        goto done;
    }
    struct meta meta = {.n = 0};
    char cmd[900] = "", load[64];
    size_t cl = 0;
    cl += (size_t)snprintf(cmd, sizeof(cmd), "tandem");
    for (int i = 0; i < argc && cl < sizeof(cmd); i++) {
        cl += (size_t)snprintf(cmd + cl, sizeof(cmd) - cl, " %s", argv[i]);
    }
    load_text(load, sizeof(load));
    char date[64];
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S %z", &tm);
    meta_add(&meta, "Command: `%s`", cmd);
    meta_add(&meta, "Started %s on %ld CPUs; load average at the start: %s", date,
             sysconf(_SC_NPROCESSORS_ONLN), load);
    catch_signals();
    int interrupted = 0;
    int per_rate = e->restart == EXP_RESTART_PER_RATE;
    int sel_idx[EXP_MAX_CONFIGS], k_sel = 0;
    for (int i = 0; i < e->n_configs; i++) {
        if (sel[i]) {
            sel_idx[k_sel++] = i;
        }
    }
    /* Cells live in configuration-major slots (the report's order). Per
     * configuration the clusters run in that order too; per rate the
     * configurations take turns at each rate, so the cells compared side by
     * side also ran side by side in time. */
    struct upproc u;
    memset(&u, 0, sizeof(u));
    int up_ok = 0;
    for (size_t step = 0; step < n_cells && !interrupted; step++) {
        int k = per_rate ? (int)(step % (size_t)n_sel) : (int)(step / (size_t)e->n_rates);
        int ri = per_rate ? (int)(step / (size_t)n_sel) : (int)(step % (size_t)e->n_rates);
        int ci = sel_idx[k];
        const struct exp_config *cfg = &e->configs[ci];
        struct exp_cell *c = &cells[(size_t)k * (size_t)e->n_rates + (size_t)ri];
        c->config = ci;
        c->rate = ri;
        c->time_scale = x->time_scales[ci];
        c->seed = x->bo.run.workload.seed + (per_rate ? 0 : (uint64_t)ri);
        if (ri == 0 || per_rate) {
            char rd[PATH_MAX + 64], rw[32];
            rate_word(e->rates[ri], rw, sizeof(rw));
            memset(&u, 0, sizeof(u));
            sfmt(rd, sizeof(rd), "%s/runs/%s%s%s", out, cfg->label, per_rate ? "-r" : "",
                 per_rate ? rw : "");
            sfmt(u.log_path, sizeof(u.log_path), "%s/logs/%s%s%s.up.log", out, cfg->label,
                 per_rate ? "-r" : "", per_rate ? rw : "");
            fprintf(stderr, "[exp] %s: starting the cluster\n", cfg->label);
            rc = up_start(bin, x->cluster_files[ci], rd, e->up_timeout_s, &u, err, sizeof(err));
            up_ok = rc == 0;
            if (rc == TANDEM_ECANCELLED) {
                interrupted = 1;
                break;
            }
            if (!up_ok) {
                fprintf(stderr, "[exp] %s: the cluster did not start: %s\n", cfg->label, err);
                exit_code = 1;
            } else {
                fprintf(stderr, "[exp] %s: up at %s:%d in %.1f s\n", cfg->label, u.host, u.port,
                        u.up_s);
            }
        }
        if (up_ok) {
            sleep_s(e->settle_s);
        }
        if (g_stop) {
            interrupted = 1;
            break;
        }
        if (!up_ok) {
            sfmt(c->error, sizeof(c->error), "the cluster did not start (see %s)", u.log_path);
        } else {
            int cut = 0;
            rc = run_cell(x, ci, ri, &u, c, &cut);
            if (rc != 0) {
                exit_code = 1;
            }
            interrupted = cut || g_stop;
        }
        c->done = 1;
        print_cell(e, c);
        if ((per_rate || ri == e->n_rates - 1 || interrupted) && u.pid > 0) {
            fprintf(stderr, "[exp] %s: stopping the cluster\n", cfg->label);
            up_stop(&u);
        }
        char msg[EXP_ERR_MAX];
        size_t nv = compact(cells, n_cells, view);
        if (exp_write_report(out, e, view, nv, meta.ptr, meta.n, msg, sizeof(msg)) != 0) {
            fprintf(stderr, "tandem bench: %s\n", msg);
            exit_code = 1;
        }
    }
    if (u.pid > 0) {
        up_stop(&u);
    }
    load_text(load, sizeof(load));
    time_t t1 = time(NULL);
    meta_add(&meta, "Took %.0f s; load average at the end: %s%s", difftime(t1, t0), load,
             interrupted ? " (interrupted: partial results)" : "");
    size_t nv = compact(cells, n_cells, view);
    if (exp_write_report(out, e, view, nv, meta.ptr, meta.n, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem bench: %s\n", err);
        exit_code = 1;
    }
    fprintf(stderr, "[exp] report: %s/summary.md\n", out);
    printf("%s/summary.md\n", out);
    if (interrupted) {
        exit_code = 130;
    }
done:
    for (size_t i = 0; cells && i < n_cells; i++) {
        exp_cell_fini(&cells[i]);
    }
    free(cells);
    free(view);
    bench_options_fini(&x->bo);
    free(x);
    exp_free(e);
    return exit_code;
}
