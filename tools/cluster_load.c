/* Cluster file loader on libyaml's document API: the node tree keeps each
 * node's marks, which give every message its line and let an inline routing
 * mapping be cut out of the source text as written (cluster_routing.c). The
 * keys are tables of fields (struct field); what a file may not say across
 * keys is checked once all are read (cluster_check.c). */
#include "cluster.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "backend.h"
#include "block_hash.h"
#include "flags.h"
#include "log.h"
#include "tandem_err.h"
#include "wk_config.h"
#include "yaml_node.h"

#include "cluster_int.h"

/* ------------------------------------------------------------------ */
/* Loader state and messages                                           */
/* ------------------------------------------------------------------ */

int cluster_fail(struct loader *ld, int line, const char *fmt, ...)
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

static int remember(struct loader *ld, const char *path, int line)
{
    if (ld->n_lines == ld->cap_lines) {
        int cap = ld->cap_lines ? ld->cap_lines * 2 : 32;
        struct key_line *kl = realloc(ld->lines, sizeof(*kl) * (size_t)cap);
        if (!kl) {
            return TANDEM_ENOMEM;
        }
        ld->lines = kl;
        ld->cap_lines = cap;
    }
    snprintf(ld->lines[ld->n_lines].path, PATH_KEY_MAX, "%s", path);
    ld->lines[ld->n_lines].line = line;
    ld->n_lines++;
    return 0;
}

/* Line of the key at path, or fallback when the file does not have it. */
int cluster_line_at(const struct loader *ld, const char *path, int fallback)
{
    for (int i = 0; i < ld->n_lines; i++) {
        if (strcmp(ld->lines[i].path, path) == 0) {
            return ld->lines[i].line;
        }
    }
    return fallback;
}

/* out = "prefix.key" (or "key"), truncated to PATH_KEY_MAX. */
void cluster_key_path(char *out, const char *prefix, const char *key)
{
    size_t n = 0;
    if (prefix && *prefix) {
        n = strlen(prefix);
        n = n > PATH_KEY_MAX - 2 ? PATH_KEY_MAX - 2 : n;
        memmove(out, prefix, n);
        out[n++] = '.';
    }
    size_t k = strlen(key);
    k = k > PATH_KEY_MAX - 1 - n ? PATH_KEY_MAX - 1 - n : k;
    memcpy(out + n, key, k);
    out[n + k] = '\0';
}

int cluster_set_str(char **dst, const char *s)
{
    char *d = strdup(s);
    if (!d) {
        return TANDEM_ENOMEM;
    }
    free(*dst);
    *dst = d;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Typed values                                                        */
/* ------------------------------------------------------------------ */

enum fkind {
    F_STR,     /* char *, any non-empty scalar */
    F_CHOICE,  /* char *, one of choices */
    F_ENUM,    /* int, index into choices */
    F_INT,     /* int in [min, max] */
    F_DOUBLE,  /* double in [min, max] */
    F_BYTES,   /* uint64_t, > 0 */
    F_PATH,    /* char *, resolved against base_dir, must be readable */
    F_DIR,     /* char *, resolved against base_dir, need not exist */
    F_ARGS,    /* char ** + int count (the int follows at aux_off) */
    F_SPECIAL, /* fn handles it */
    F_SETTING, /* wk_settings[setting] of a struct cluster_pool */
};

struct field;
typedef int (*special_fn)(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                          void *base);

struct field {
    const char *key;
    enum fkind kind;
    size_t off;
    double min, max;
    const char *const *choices;
    size_t aux_off;
    special_fn fn;
    int setting;
};

static int want_scalar(struct loader *ld, const char *path, yaml_node_t *v, const char **out)
{
    const char *s = yn_scalar(v);
    if (!s) {
        return cluster_fail(ld, yn_line(v), "%s: expected a single value, got a %s", path,
                            v->type == YAML_MAPPING_NODE ? "mapping" : "list");
    }
    if (!*s) {
        return cluster_fail(ld, yn_line(v), "%s: empty value", path);
    }
    *out = s;
    return 0;
}

static int parse_int(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0') {
        return TANDEM_EINVAL;
    }
    *out = v;
    return 0;
}

/* Drops "." and "name/.." segments and repeated slashes of an absolute path
 * in place, without looking at the file system: for paths realpath cannot
 * resolve (not there yet), so messages name /a/run/certs/ca.crt rather than
 * /a/deploy/clusters/../../run/certs/ca.crt. */
static void normalize_path(char *path)
{
    char *w = path; /* path[0] is '/' and stays */
    const char *r = path;
    while (*r) {
        while (*r == '/') {
            r++;
        }
        const char *end = strchr(r, '/');
        size_t n = end ? (size_t)(end - r) : strlen(r);
        if (n == 0 || (n == 1 && r[0] == '.')) {
            /* nothing */
        } else if (n == 2 && r[0] == '.' && r[1] == '.') {
            while (w > path && *--w != '/') {
            }
        } else {
            *w++ = '/';
            memmove(w, r, n);
            w += n;
        }
        r += n;
    }
    if (w == path) {
        *w++ = '/';
    }
    *w = '\0';
}

int cluster_resolve_path(struct loader *ld, const char *s, char **out)
{
    char buf[PATH_MAX];
    if (s[0] == '/') {
        snprintf(buf, sizeof(buf), "%s", s);
    } else {
        int n = snprintf(buf, sizeof(buf), "%s/%s", ld->c->base_dir, s);
        if (n < 0 || (size_t)n >= sizeof(buf)) {
            return TANDEM_ETOOBIG;
        }
    }
    char real[PATH_MAX];
    if (realpath(buf, real)) {
        return cluster_set_str(out, real);
    }
    if (buf[0] == '/') {
        normalize_path(buf);
    }
    return cluster_set_str(out, buf);
}

static int load_args(struct loader *ld, const char *path, yaml_node_t *v, char ***args, int *n)
{
    if (v->type != YAML_SEQUENCE_NODE) {
        return cluster_fail(ld, yn_line(v),
                            "%s: expected a list of strings, e.g. [\"--seed\", \"7\"]", path);
    }
    int count = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
    char **a = calloc((size_t)count + 1, sizeof(*a));
    if (!a) {
        return TANDEM_ENOMEM;
    }
    for (int i = 0; i < count; i++) {
        yaml_node_t *it = node(ld, v->data.sequence.items.start[i]);
        const char *s = yn_scalar(it);
        if (!s) {
            for (int j = 0; j < i; j++) {
                free(a[j]);
            }
            free(a);
            return cluster_fail(ld, yn_line(it), "%s[%d]: expected a string", path, i);
        }
        a[i] = strdup(s);
        if (!a[i]) {
            for (int j = 0; j < i; j++) {
                free(a[j]);
            }
            free(a);
            return TANDEM_ENOMEM;
        }
    }
    for (int i = 0; i < *n; i++) {
        free((*args)[i]);
    }
    free(*args);
    *args = a;
    *n = count;
    return 0;
}

static int load_setting(struct loader *ld, int i, const char *path, yaml_node_t *v, void *base)
{
    struct cluster_pool *p = base;
    const struct setting *s = &wk_settings[i];
    const char *text;
    char why[CLUSTER_ERR_MAX];
    int rc = want_scalar(ld, path, v, &text);
    if (rc < 0) {
        return rc;
    }
    if (s->type != FLAG_STR) {
        if (settings_parse_value(s, text, &p->cfg, why, sizeof(why)) < 0) {
            return cluster_fail(ld, yn_line(v), "%s: %s", path, why);
        }
        p->set |= cluster_bit(i);
        return 0;
    }
    struct worker_config tmp = p->cfg;
    if (settings_parse_value(s, text, &tmp, why, sizeof(why)) < 0) {
        return cluster_fail(ld, yn_line(v), "%s: %s", path, why);
    }
    char *owned = NULL;
    if (s->flags & SETTING_PATH) {
        if ((rc = cluster_resolve_path(ld, text, &owned)) < 0) {
            return rc == TANDEM_ETOOBIG ? cluster_fail(ld, yn_line(v), "%s: path too long", path)
                                        : rc;
        }
        if (access(owned, R_OK) != 0) {
            cluster_pool_take_str(p, i, owned); /* freed with the cluster */
            return cluster_fail(ld, yn_line(v), "%s: cannot read '%s': %s", path, owned,
                                strerror(errno));
        }
    } else if (!(owned = strdup(text))) {
        return TANDEM_ENOMEM;
    }
    cluster_pool_take_str(p, i, owned);
    return 0;
}

static int load_value(struct loader *ld, const struct field *f, const char *path, yaml_node_t *k,
                      yaml_node_t *v, void *base)
{
    char *p = (char *)base + f->off;
    const char *s = NULL;
    char names[512];
    int rc;
    if (f->kind == F_SPECIAL) {
        return f->fn(ld, path, k, v, base);
    }
    if (f->kind == F_ARGS) {
        return load_args(ld, path, v, (char ***)p, (int *)((char *)base + f->aux_off));
    }
    if (f->kind == F_SETTING) {
        return load_setting(ld, f->setting, path, v, base);
    }
    if ((rc = want_scalar(ld, path, v, &s)) < 0) {
        return rc;
    }
    switch (f->kind) {
    case F_STR:
        return cluster_set_str((char **)p, s);
    case F_CHOICE:
    case F_ENUM: {
        const char *const *choices = f->choices;
        int i = yn_name_index(s, choices);
        if (i < 0) {
            yn_name_join(names, sizeof(names), choices);
            return cluster_fail(ld, yn_line(v), "%s: expected one of %s, got '%s'", path, names, s);
        }
        if (f->kind == F_ENUM) {
            *(int *)p = i;
            return 0;
        }
        return cluster_set_str((char **)p, s);
    }
    case F_INT: {
        long x;
        if (parse_int(s, &x) < 0 || x < (long)f->min || x > (long)f->max) {
            return cluster_fail(ld, yn_line(v), "%s: expected an integer in [%.0f, %.0f], got '%s'",
                                path, f->min, f->max, s);
        }
        *(int *)p = (int)x;
        return 0;
    }
    case F_DOUBLE: {
        char *end;
        double x = strtod(s, &end);
        if (end == s || *end != '\0' || !isfinite(x) || x < f->min || x > f->max) {
            return cluster_fail(ld, yn_line(v), "%s: expected a number in [%g, %g], got '%s'", path,
                                f->min, f->max, s);
        }
        *(double *)p = x;
        return 0;
    }
    case F_BYTES: {
        uint64_t x;
        if (flags_parse_bytes(s, &x) < 0 || x == 0) {
            return cluster_fail(ld, yn_line(v),
                                "%s: expected a byte count such as 40GiB, 512MiB or 1e9, got '%s'",
                                path, s);
        }
        *(uint64_t *)p = x;
        return 0;
    }
    case F_PATH:
    case F_DIR:
        if ((rc = cluster_resolve_path(ld, s, (char **)p)) < 0) {
            return rc == TANDEM_ETOOBIG ? cluster_fail(ld, yn_line(v), "%s: path too long", path)
                                        : rc;
        }
        if (f->kind == F_PATH && access(*(char **)p, R_OK) != 0) {
            return cluster_fail(ld, yn_line(v), "%s: cannot read '%s': %s", path, *(char **)p,
                                strerror(errno));
        }
        return 0;
    default:
        return TANDEM_EINVAL;
    }
}

/* Checks map is a mapping of unique plain keys from fields, loads each value
 * into base, and records every key's line under prefix. */
static int load_mapping(struct loader *ld, yaml_node_t *map, const char *prefix,
                        const struct field *fields, void *base)
{
    char path[PATH_KEY_MAX];
    if (map->type != YAML_MAPPING_NODE) {
        return cluster_fail(ld, yn_line(map), "%s: expected a mapping of keys to values", prefix);
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(ld, p->key);
        yaml_node_t *v = node(ld, p->value);
        const char *ks = yn_scalar(k);
        if (!ks) {
            return cluster_fail(ld, yn_line(k), "%s: keys must be plain names", prefix);
        }
        cluster_key_path(path, prefix, ks);
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            if (strcmp(ks, yn_scalar(node(ld, q->key))) == 0) {
                return cluster_fail(ld, yn_line(k), "%s: duplicate key", path);
            }
        }
        const struct field *f = fields;
        while (f->key && strcmp(f->key, ks) != 0) {
            f++;
        }
        if (!f->key) {
            char valid[512];
            size_t n = 0;
            valid[0] = '\0';
            for (const struct field *g = fields; g->key && n < sizeof(valid); g++) {
                int w =
                    snprintf(valid + n, sizeof(valid) - n, "%s%s", g == fields ? "" : ", ", g->key);
                n += w > 0 ? (size_t)w : 0;
            }
            char hint[PATH_KEY_MAX + 32] = "";
            char alt[PATH_KEY_MAX];
            snprintf(alt, sizeof(alt), "%s", ks);
            for (char *c = alt; *c; c++) {
                *c = *c == '-' ? '_' : *c;
            }
            for (const struct field *g = fields; g->key; g++) {
                if (strcmp(g->key, alt) == 0 && strcmp(alt, ks) != 0) {
                    snprintf(hint, sizeof(hint), "; did you mean '%s'?", alt);
                }
            }
            return cluster_fail(ld, yn_line(k), "%s: unknown key (valid: %s)%s", path, valid, hint);
        }
        int rc = remember(ld, path, yn_line(k));
        if (rc < 0) {
            return rc;
        }
        if ((rc = load_value(ld, f, path, k, v, base)) < 0) {
            return rc;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Sections                                                            */
/* ------------------------------------------------------------------ */

#define FLD(name, fk, type, member, lo, hi, ch)                                                    \
    {                                                                                              \
        .key = name, .kind = fk, .off = offsetof(type, member), .min = lo, .max = hi,              \
        .choices = ch                                                                              \
    }

static const struct field router_fields[] = {
    FLD("host", F_STR, struct cluster, router_host, 0, 0, NULL),
    {.key = "args",
     .kind = F_ARGS,
     .off = offsetof(struct cluster, router_args),
     .aux_off = offsetof(struct cluster, n_router_args)},
    FLD("api_key_file", F_PATH, struct cluster, router_api_key_file, 0, 0, NULL),
    {0},
};

static const struct field ports_fields[] = {
    FLD("router", F_INT, struct cluster, router_port, 0, 65535, NULL),
    FLD("announce", F_INT, struct cluster, announce_port, 0, 65535, NULL),
    FLD("metrics_base", F_INT, struct cluster, metrics_base, 0, 65535, NULL),
    {0},
};

static const struct field transport_fields[] = {
    FLD("kind", F_ENUM, struct cluster, transport, 0, 0, cluster_transport_names),
    FLD("dir", F_DIR, struct cluster, ipc_dir, 0, 0, NULL),
    FLD("host", F_STR, struct cluster, tcp_host, 0, 0, NULL),
    FLD("base_port", F_INT, struct cluster, base_port, 0, 65535, NULL),
    {0},
};

static int valid_url(const char *s)
{
    const char *rest = NULL;
    if (strncmp(s, "ipc:///", 7) == 0) {
        return strlen(s + 6) <= SUN_PATH_MAX;
    }
    if (strncmp(s, "tcp://", 6) == 0) {
        rest = s + 6;
    } else if (strncmp(s, "tls+tcp://", 10) == 0) {
        rest = s + 10;
    } else {
        return 0;
    }
    const char *colon = strrchr(rest, ':');
    long port;
    return colon && colon > rest && parse_int(colon + 1, &port) == 0 && port >= 0 && port <= 65535;
}

static int load_addresses(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                          void *base)
{
    struct cluster_pool *pool = base;
    char ipath[PATH_KEY_MAX];
    if (v->type != YAML_SEQUENCE_NODE) {
        return cluster_fail(ld, yn_line(v), "%s: expected a list of {control: URL, kv: URL}", path);
    }
    int count = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (count > CLUSTER_MAX_POOL) {
        return cluster_fail(ld, yn_line(v), "%s: at most %d addresses", path, CLUSTER_MAX_POOL);
    }
    pool->addrs = calloc((size_t)count + 1, sizeof(*pool->addrs));
    if (!pool->addrs) {
        return TANDEM_ENOMEM;
    }
    pool->n_addrs = count;
    static const struct field addr_fields[] = {
        FLD("control", F_STR, struct cluster_addr, control, 0, 0, NULL),
        FLD("kv", F_STR, struct cluster_addr, kv, 0, 0, NULL),
        {0},
    };
    for (int i = 0; i < count; i++) {
        yaml_node_t *it = node(ld, v->data.sequence.items.start[i]);
        struct cluster_addr *a = &pool->addrs[i];
        snprintf(ipath, sizeof(ipath), "%s[%d]", path, i);
        int rc = load_mapping(ld, it, ipath, addr_fields, a);
        if (rc < 0) {
            return rc;
        }
        if (!a->control || !a->kv) {
            return cluster_fail(ld, yn_line(it), "%s: needs both control and kv", ipath);
        }
        const char *bad = !valid_url(a->control) ? a->control : !valid_url(a->kv) ? a->kv : NULL;
        if (bad) {
            return cluster_fail(
                ld, yn_line(it),
                "%s: '%s' is not tcp://host:port, tls+tcp://host:port or ipc:///path "
                "(at most %d bytes)",
                ipath, bad, SUN_PATH_MAX);
        }
    }
    (void)k;
    return 0;
}

/* The keys of pools.<role>: count, every pool setting of wk_settings (in
 * its order), args, addresses. Returns how many fields (plus the {0}). */
static int pool_fields(struct field *f)
{
    int n = 0;
    f[n++] =
        (struct field)FLD("count", F_INT, struct cluster_pool, count, 0, CLUSTER_MAX_POOL, NULL);
    for (size_t i = 0; i < wk_n_settings; i++) {
        if (wk_settings[i].flags & SETTING_POOL) {
            f[n++] =
                (struct field){.key = wk_settings[i].key, .kind = F_SETTING, .setting = (int)i};
        }
    }
    f[n++] = (struct field){.key = "args",
                            .kind = F_ARGS,
                            .off = offsetof(struct cluster_pool, args),
                            .aux_off = offsetof(struct cluster_pool, n_args)};
    f[n++] = (struct field){.key = "addresses", .kind = F_SPECIAL, .fn = load_addresses};
    f[n++] = (struct field){0};
    return n;
}

static int load_pools(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                      void *base)
{
    struct cluster *c = base;
    char ppath[PATH_KEY_MAX];
    struct field fields[SETTINGS_MAX + 4];
    pool_fields(fields);
    if (v->type != YAML_MAPPING_NODE) {
        return cluster_fail(ld, yn_line(v),
                            "%s: expected a mapping with prefill, decode, colocated", path);
    }
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *pk = node(ld, p->key);
        yaml_node_t *pv = node(ld, p->value);
        const char *ks = yn_scalar(pk);
        if (!ks) {
            return cluster_fail(ld, yn_line(pk), "%s: keys must be plain names", path);
        }
        cluster_key_path(ppath, path, ks);
        int r = yn_name_index(ks, cluster_role_names);
        if (r < 0) {
            return cluster_fail(ld, yn_line(pk),
                                "%s: unknown pool (valid: prefill, decode, colocated)", ppath);
        }
        if (c->pools[r].line) {
            return cluster_fail(ld, yn_line(pk), "%s: duplicate key", ppath);
        }
        c->pools[r].line = yn_line(pk);
        int rc = remember(ld, ppath, yn_line(pk));
        if (rc < 0 || (rc = load_mapping(ld, pv, ppath, fields, &c->pools[r])) < 0) {
            return rc;
        }
    }
    (void)k;
    return 0;
}

static const struct field tls_fields[] = {
    /* Resolved only: cluster_check_pem reads them, with a hint when one is missing. */
    FLD("ca", F_DIR, struct cluster, tls_ca, 0, 0, NULL),
    FLD("cert", F_DIR, struct cluster, tls_cert, 0, 0, NULL),
    FLD("key", F_DIR, struct cluster, tls_key, 0, 0, NULL),
    {0},
};

static int load_tls(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v, void *base)
{
    struct cluster *c = base;
    ld->tls_line = yn_line(k);
    if (v->type != YAML_MAPPING_NODE) {
        return cluster_fail(
            ld, yn_line(v),
            "%s: expected a mapping {ca: FILE, cert: FILE, key: FILE} (PEM files, e.g. "
            "from deploy/make-cluster-ca.sh)",
            path);
    }
    int rc = load_mapping(ld, v, path, tls_fields, base);
    if (rc < 0) {
        return rc;
    }
    const char *missing = !c->tls_ca ? "ca" : !c->tls_cert ? "cert" : !c->tls_key ? "key" : NULL;
    if (missing) {
        return cluster_fail(ld, ld->tls_line,
                            "%s: missing %s (give all three: ca, cert and key, or no tls section)",
                            path, missing);
    }
    if ((rc = cluster_check_pem(ld, "tls.ca", c->tls_ca, 0)) < 0 ||
        (rc = cluster_check_pem(ld, "tls.cert", c->tls_cert, 0)) < 0 ||
        (rc = cluster_check_pem(ld, "tls.key", c->tls_key, 1)) < 0) {
        return rc;
    }
    return 0;
}

static int load_router(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                       void *base)
{
    (void)k;
    return load_mapping(ld, v, path, router_fields, base);
}

static int load_ports(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                      void *base)
{
    (void)k;
    return load_mapping(ld, v, path, ports_fields, base);
}

static int load_transport(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                          void *base)
{
    (void)k;
    return load_mapping(ld, v, path, transport_fields, base);
}

static const struct field top_fields[] = {
    FLD("name", F_STR, struct cluster, name, 0, 0, NULL),
    FLD("model", F_STR, struct cluster, model, 0, 0, NULL),
    FLD("backend", F_CHOICE, struct cluster, backend, 0, 0, backend_names),
    FLD("tokenizer", F_PATH, struct cluster, tokenizer, 0, 0, NULL),
    FLD("block_size", F_INT, struct cluster, block_size, 1, BH_MAX_BLOCK_SIZE, NULL),
    FLD("log_level", F_CHOICE, struct cluster, log_level, 0, 0, log_level_names),
    {.key = "router", .kind = F_SPECIAL, .fn = load_router},
    {.key = "ports", .kind = F_SPECIAL, .fn = load_ports},
    {.key = "transport", .kind = F_SPECIAL, .fn = load_transport},
    {.key = "tls", .kind = F_SPECIAL, .fn = load_tls},
    {.key = "routing", .kind = F_SPECIAL, .fn = cluster_load_routing},
    {.key = "pools", .kind = F_SPECIAL, .fn = load_pools},
    {0},
};

/* ------------------------------------------------------------------ */
/* Parsing                                                             */
/* ------------------------------------------------------------------ */

int cluster_parse(struct cluster **out, const char *text, size_t len, const char *name,
                  const char *base_dir, char *err, size_t errlen)
{
    struct loader ld = {.source = name, .text = text, .len = len, .err = err, .errlen = errlen};
    yaml_parser_t parser;
    int rc = TANDEM_ENOMEM;
    char cwd[PATH_MAX];
    if (errlen) {
        err[0] = '\0';
    }
    *out = NULL;
    if (!(ld.c = cluster_new())) {
        return TANDEM_ENOMEM;
    }
    if (!base_dir) {
        base_dir = getcwd(cwd, sizeof(cwd)) ? cwd : ".";
    }
    if (cluster_set_str(&ld.c->source, name) < 0 ||
        cluster_set_str(&ld.c->base_dir, base_dir) < 0) {
        goto fail_cluster;
    }
    if (!yaml_parser_initialize(&parser)) {
        goto fail_cluster;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &ld.doc)) {
        rc = cluster_fail(&ld, (int)parser.problem_mark.line + 1, "YAML syntax error: %s%s%s",
                          parser.problem ? parser.problem : "unknown", parser.context ? " " : "",
                          parser.context ? parser.context : "");
        goto fail_parser;
    }
    yaml_node_t *root = yaml_document_get_root_node(&ld.doc);
    if (!root) {
        rc = cluster_fail(&ld, 1, "empty cluster file (docs/up.md shows the keys)");
        goto fail_doc;
    }
    if (root->type != YAML_MAPPING_NODE) {
        rc = cluster_fail(&ld, yn_line(root),
                          "the cluster file must be a mapping of keys to values");
        goto fail_doc;
    }
    if ((rc = load_mapping(&ld, root, "", top_fields, ld.c)) < 0) {
        goto fail_doc;
    }
    if ((rc = cluster_finish(&ld)) < 0) {
        goto fail_doc;
    }
    yaml_document_delete(&ld.doc);
    yaml_parser_delete(&parser);
    free(ld.lines);
    *out = ld.c;
    return 0;

fail_doc:
    yaml_document_delete(&ld.doc);
fail_parser:
    yaml_parser_delete(&parser);
fail_cluster:
    free(ld.lines);
    cluster_free(ld.c);
    return rc;
}
