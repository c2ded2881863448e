/* Cluster file loader on libyaml's document API: the node tree keeps each
 * node's marks, which give every message its line and let an inline routing
 * mapping be cut out of the source text as written. */
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
#include "pipeline.h"
#include "presets.h"
#include "file.h"
#include "tandem_err.h"
#include "wk_config.h"
#include "yaml_node.h"

#define PATH_KEY_MAX 160
/* Longest socket name we create in an ipc directory: "colocated-63.ctl.ipc". */
#define IPC_NAME_MAX 24
#define SUN_PATH_MAX 107

static const char *const role_names[CLUSTER_N_ROLES + 1] = {"prefill", "decode", "colocated", NULL};
static const char *const transport_choices[] = {"ipc", "tcp", NULL};

/* Flags `tandem up` passes itself; extra args may not repeat them (for
 * workers: the settings marked SETTING_MANAGED). The TLS flags come from the
 * `tls:` section only, so that the addresses' scheme and the flags cannot
 * disagree. */
static const char *const router_managed[] = {"--host",     "--port",    "--announce", "--tls-ca",
                                             "--tls-cert", "--tls-key", NULL};

static const char default_text[] =
    "# The embedded default cluster of `tandem up`: a router on 127.0.0.1:8000,\n"
    "# one prefill and one decode worker on the tiny model, over ipc://. No\n"
    "# routing: the router's default (deploy/routing/pd-prefix-precise.yaml).\n"
    "name: default\n"
    "model: tiny\n"
    "backend: tiny\n"
    "block_size: 16\n"
    "log_level: info\n"
    "router:\n"
    "  host: 127.0.0.1\n"
    "ports:\n"
    "  router: 8000\n"
    "  metrics_base: 0\n"
    "transport:\n"
    "  kind: ipc\n"
    "pools:\n"
    "  prefill:\n"
    "    count: 1\n"
    "  decode:\n"
    "    count: 1\n";

/* ------------------------------------------------------------------ */
/* Loader state and messages                                           */
/* ------------------------------------------------------------------ */

struct key_line {
    char path[PATH_KEY_MAX];
    int line;
};

struct loader {
    yaml_document_t doc;
    const char *source;
    const char *text;
    size_t len;
    char *err;
    size_t errlen;
    struct cluster *c;
    struct key_line *lines; /* (n_lines) every key seen, for cross-checks */
    int n_lines;
    int cap_lines;
    int routing_bs; /* blockSize of the routing's prefix scorers, 0: none */
    int tls_line;   /* line of the `tls:` key, 0: none */
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
static int line_at(const struct loader *ld, const char *path, int fallback)
{
    for (int i = 0; i < ld->n_lines; i++) {
        if (strcmp(ld->lines[i].path, path) == 0) {
            return ld->lines[i].line;
        }
    }
    return fallback;
}

/* out = "prefix.key" (or "key"), truncated to PATH_KEY_MAX. */
static void key_path(char *out, const char *prefix, const char *key)
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

static int set_str(char **dst, const char *s)
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
        return fail(ld, yn_line(v), "%s: expected a single value, got a %s", path,
                    v->type == YAML_MAPPING_NODE ? "mapping" : "list");
    }
    if (!*s) {
        return fail(ld, yn_line(v), "%s: empty value", path);
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

static int resolve_path(struct loader *ld, const char *s, char **out)
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
        return set_str(out, real);
    }
    if (buf[0] == '/') {
        normalize_path(buf);
    }
    return set_str(out, buf);
}

static int load_args(struct loader *ld, const char *path, yaml_node_t *v, char ***args, int *n)
{
    if (v->type != YAML_SEQUENCE_NODE) {
        return fail(ld, yn_line(v), "%s: expected a list of strings, e.g. [\"--seed\", \"7\"]",
                    path);
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
            return fail(ld, yn_line(it), "%s[%d]: expected a string", path, i);
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

/* ------------------------------------------------------------------ */
/* A pool's worker settings (wk_settings)                              */
/* ------------------------------------------------------------------ */

static uint64_t bit(int i)
{
    return (uint64_t)1 << i;
}

int cluster_pool_has(const struct cluster_pool *p, const char *name)
{
    int i = wk_setting(name);
    return i >= 0 && (p->set & bit(i)) != 0;
}

const char *cluster_pool_backend(const struct cluster_pool *p)
{
    return backend_names[p->cfg.backend];
}

/* Back to the default; a string the pool owned is freed. */
static void pool_unset(struct cluster_pool *p, int i)
{
    const struct setting *s = &wk_settings[i];
    if ((p->set & bit(i)) && s->type == FLAG_STR) {
        free(*(char **)((char *)&p->cfg + s->off));
    }
    struct worker_config def;
    wk_config_defaults(&def);
    settings_copy(s, &p->cfg, &def);
    p->set &= ~bit(i);
}

/* Stores the string v (taken: the pool frees it) as setting i. */
static void pool_take_str(struct cluster_pool *p, int i, char *v)
{
    pool_unset(p, i);
    *(char **)((char *)&p->cfg + wk_settings[i].off) = v;
    p->set |= bit(i);
}

int cluster_pool_set(struct cluster_pool *p, int i, const struct worker_config *src)
{
    const struct setting *s = &wk_settings[i];
    if (s->type == FLAG_STR) {
        const char *v = *(const char *const *)((const char *)src + s->off);
        char *d = v ? strdup(v) : NULL;
        if (v && !d) {
            return TANDEM_ENOMEM;
        }
        pool_take_str(p, i, d);
    } else {
        settings_copy(s, &p->cfg, src);
        p->set |= bit(i);
    }
    /* A setting this one excludes goes (kv_blocks replaces kv_memory). */
    for (size_t j = 0; j < wk_n_settings; j++) {
        if (wk_settings[j].conflicts && strcmp(wk_settings[j].conflicts, s->name) == 0) {
            pool_unset(p, (int)j);
        }
    }
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
            return fail(ld, yn_line(v), "%s: %s", path, why);
        }
        p->set |= bit(i);
        return 0;
    }
    struct worker_config tmp = p->cfg;
    if (settings_parse_value(s, text, &tmp, why, sizeof(why)) < 0) {
        return fail(ld, yn_line(v), "%s: %s", path, why);
    }
    char *owned = NULL;
    if (s->flags & SETTING_PATH) {
        if ((rc = resolve_path(ld, text, &owned)) < 0) {
            return rc == TANDEM_ETOOBIG ? fail(ld, yn_line(v), "%s: path too long", path) : rc;
        }
        if (access(owned, R_OK) != 0) {
            pool_take_str(p, i, owned); /* freed with the cluster */
            return fail(ld, yn_line(v), "%s: cannot read '%s': %s", path, owned, strerror(errno));
        }
    } else if (!(owned = strdup(text))) {
        return TANDEM_ENOMEM;
    }
    pool_take_str(p, i, owned);
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
        return set_str((char **)p, s);
    case F_CHOICE:
    case F_ENUM: {
        const char *const *choices = f->choices;
        int i = yn_name_index(s, choices);
        if (i < 0) {
            yn_name_join(names, sizeof(names), choices);
            return fail(ld, yn_line(v), "%s: expected one of %s, got '%s'", path, names, s);
        }
        if (f->kind == F_ENUM) {
            *(int *)p = i;
            return 0;
        }
        return set_str((char **)p, s);
    }
    case F_INT: {
        long x;
        if (parse_int(s, &x) < 0 || x < (long)f->min || x > (long)f->max) {
            return fail(ld, yn_line(v), "%s: expected an integer in [%.0f, %.0f], got '%s'", path,
                        f->min, f->max, s);
        }
        *(int *)p = (int)x;
        return 0;
    }
    case F_DOUBLE: {
        char *end;
        double x = strtod(s, &end);
        if (end == s || *end != '\0' || !isfinite(x) || x < f->min || x > f->max) {
            return fail(ld, yn_line(v), "%s: expected a number in [%g, %g], got '%s'", path, f->min,
                        f->max, s);
        }
        *(double *)p = x;
        return 0;
    }
    case F_BYTES: {
        uint64_t x;
        if (flags_parse_bytes(s, &x) < 0 || x == 0) {
            return fail(ld, yn_line(v),
                        "%s: expected a byte count such as 40GiB, 512MiB or 1e9, got '%s'", path,
                        s);
        }
        *(uint64_t *)p = x;
        return 0;
    }
    case F_PATH:
    case F_DIR:
        if ((rc = resolve_path(ld, s, (char **)p)) < 0) {
            return rc == TANDEM_ETOOBIG ? fail(ld, yn_line(v), "%s: path too long", path) : rc;
        }
        if (f->kind == F_PATH && access(*(char **)p, R_OK) != 0) {
            return fail(ld, yn_line(v), "%s: cannot read '%s': %s", path, *(char **)p,
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
        return fail(ld, yn_line(map), "%s: expected a mapping of keys to values", prefix);
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = node(ld, p->key);
        yaml_node_t *v = node(ld, p->value);
        const char *ks = yn_scalar(k);
        if (!ks) {
            return fail(ld, yn_line(k), "%s: keys must be plain names", prefix);
        }
        key_path(path, prefix, ks);
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            if (strcmp(ks, yn_scalar(node(ld, q->key))) == 0) {
                return fail(ld, yn_line(k), "%s: duplicate key", path);
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
            return fail(ld, yn_line(k), "%s: unknown key (valid: %s)%s", path, valid, hint);
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
    {0},
};

static const struct field ports_fields[] = {
    FLD("router", F_INT, struct cluster, router_port, 0, 65535, NULL),
    FLD("announce", F_INT, struct cluster, announce_port, 0, 65535, NULL),
    FLD("metrics_base", F_INT, struct cluster, metrics_base, 0, 65535, NULL),
    {0},
};

static const struct field transport_fields[] = {
    FLD("kind", F_ENUM, struct cluster, transport, 0, 0, transport_choices),
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
        return fail(ld, yn_line(v), "%s: expected a list of {control: URL, kv: URL}", path);
    }
    int count = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (count > CLUSTER_MAX_POOL) {
        return fail(ld, yn_line(v), "%s: at most %d addresses", path, CLUSTER_MAX_POOL);
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
            return fail(ld, yn_line(it), "%s: needs both control and kv", ipath);
        }
        const char *bad = !valid_url(a->control) ? a->control : !valid_url(a->kv) ? a->kv : NULL;
        if (bad) {
            return fail(ld, yn_line(it),
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
        return fail(ld, yn_line(v), "%s: expected a mapping with prefill, decode, colocated", path);
    }
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *pk = node(ld, p->key);
        yaml_node_t *pv = node(ld, p->value);
        const char *ks = yn_scalar(pk);
        if (!ks) {
            return fail(ld, yn_line(pk), "%s: keys must be plain names", path);
        }
        key_path(ppath, path, ks);
        int r = yn_name_index(ks, role_names);
        if (r < 0) {
            return fail(ld, yn_line(pk), "%s: unknown pool (valid: prefill, decode, colocated)",
                        ppath);
        }
        if (c->pools[r].line) {
            return fail(ld, yn_line(pk), "%s: duplicate key", ppath);
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

/* The length of the YAML line break at s (before to), or 0: "\r\n", "\r",
 * "\n", and, for libyaml, NEL, U+2028 and U+2029 too. */
static size_t yaml_break(const char *s, const char *to)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t left = (size_t)(to - s);
    if (left >= 2 && u[0] == '\r' && u[1] == '\n') {
        return 2;
    }
    if (left >= 1 && (u[0] == '\r' || u[0] == '\n')) {
        return 1;
    }
    if (left >= 2 && u[0] == 0xc2 && u[1] == 0x85) {
        return 2;
    }
    if (left >= 3 && u[0] == 0xe2 && u[1] == 0x80 && (u[2] == 0xa8 || u[2] == 0xa9)) {
        return 3;
    }
    return 0;
}

/* Copies [from, to) of the source and drops `col` columns of indentation from
 * every line (comment or blank lines with less are trimmed to their text). */
static char *dedent(const char *from, const char *to, int col)
{
    char *out = malloc((size_t)(to - from) + 2);
    if (!out) {
        return NULL;
    }
    size_t n = 0;
    const char *s = from;
    while (s < to) {
        /* Every YAML line break becomes "\n" (a lone "\r" ends a line for
         * libyaml too: found by fuzz_cluster_yaml), and the next line loses
         * its indentation. */
        const char *end = s;
        size_t brk = 0;
        while (end < to && (brk = yaml_break(end, to)) == 0) {
            end++;
        }
        int skip = 0;
        while (skip < col && s + skip < end && s[skip] == ' ') {
            skip++;
        }
        memcpy(out + n, s + skip, (size_t)(end - s - skip));
        n += (size_t)(end - s - skip);
        out[n++] = '\n';
        s = end + brk;
        if (brk == 0) {
            break;
        }
    }
    /* Trailing blank lines (up to the next key) go. */
    while (n >= 2 && out[n - 1] == '\n' && out[n - 2] == '\n') {
        n--;
    }
    while (n > 0 && (out[n - 1] == ' ' || out[n - 1] == '\n')) {
        n--;
    }
    out[n++] = '\n';
    out[n] = '\0';
    return out;
}

/* Validates an EndpointPickerConfig (text, named name, or the file at path)
 * with the router's loader and plugin table, and notes the block size its
 * prefix scorers hash with. */
static int check_routing(struct loader *ld, int line, const char *text, const char *name,
                         const char *path)
{
    char rerr[RT_ERR_MAX];
    struct rt_config *cfg = NULL;
    struct rt_pipeline *pl = NULL;
    struct rt_pipeline_opts opts = {.max_endpoints = 4, .seed = 1};
    int rc = text ? rt_config_parse(&cfg, text, strlen(text), name, rerr, sizeof(rerr))
                  : rt_config_load(&cfg, path, rerr, sizeof(rerr));
    if (rc == 0) {
        rc = rt_pipeline_create(&pl, cfg, &opts, rerr, sizeof(rerr));
    }
    if (rc == TANDEM_ENOMEM) {
        rt_config_free(cfg);
        return rc;
    }
    if (rc < 0) {
        rt_config_free(cfg);
        return fail(ld, line, "routing: %s", rerr);
    }
    ld->routing_bs = 0;
    for (int i = 0; i < cfg->n_plugins; i++) {
        if (strstr(cfg->plugins[i].type, "prefix-cache-scorer")) {
            ld->routing_bs = rt_pipeline_block_size(pl);
        }
    }
    rt_pipeline_destroy(pl);
    rt_config_free(cfg);
    return 0;
}

/* The byte offset of character n of text (len bytes, UTF-8, as libyaml reads
 * it: a leading byte order mark is not a character), or len past the end.
 * libyaml's marks (index, column) count characters, not bytes: an offset
 * taken from them is wrong after the first multi-byte character (found by
 * fuzz_cluster_yaml). */
static size_t char_to_byte(const char *text, size_t len, size_t n)
{
    const unsigned char *t = (const unsigned char *)text;
    size_t i = len >= 3 && t[0] == 0xef && t[1] == 0xbb && t[2] == 0xbf ? 3 : 0;
    for (; i < len; i++) {
        if ((t[i] & 0xc0) != 0x80 && n-- == 0) {
            return i;
        }
    }
    return len;
}
static int load_routing(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                        void *base)
{
    struct cluster *c = base;
    c->routing_line = yn_line(k);
    if (v->type == YAML_SCALAR_NODE) {
        const char *s = yn_scalar(v);
        if (!*s) {
            return fail(ld, yn_line(v),
                        "%s: expected the path of an EndpointPickerConfig file or an inline "
                        "mapping",
                        path);
        }
        int rc = resolve_path(ld, s, &c->routing_path);
        if (rc < 0) {
            return rc == TANDEM_ETOOBIG ? fail(ld, yn_line(v), "%s: path too long", path) : rc;
        }
        if (access(c->routing_path, R_OK) != 0) {
            return fail(ld, yn_line(v), "%s: cannot read '%s': %s", path, c->routing_path,
                        strerror(errno));
        }
        return check_routing(ld, c->routing_line, NULL, NULL, c->routing_path);
    }
    if (v->type != YAML_MAPPING_NODE) {
        return fail(ld, yn_line(v),
                    "%s: expected the path of an EndpointPickerConfig file or an inline mapping",
                    path);
    }
    /* libyaml's marks count characters; the text is bytes. */
    size_t start = v->start_mark.index, end_char = v->end_mark.index;
    size_t col = v->start_mark.column;
    if (start > end_char || col > start) {
        return fail(ld, yn_line(v), "%s: cannot locate the mapping in the file", path);
    }
    c->routing_flow = v->data.mapping.style == YAML_FLOW_MAPPING_STYLE;
    size_t from = char_to_byte(ld->text, ld->len, c->routing_flow ? start : start - col);
    size_t end = char_to_byte(ld->text, ld->len, end_char);
    if (end > ld->len || from > end) {
        return fail(ld, yn_line(v), "%s: cannot locate the mapping in the file", path);
    }
    /* The text handed to the router's loader keeps the cluster file's line
     * numbers: the mapping's own text, after as many newlines. */
    size_t pad = v->start_mark.line + (c->routing_flow ? col : 0);
    char *padded = malloc(pad + (end - from) + 1);
    if (!padded) {
        return TANDEM_ENOMEM;
    }
    memset(padded, '\n', v->start_mark.line);
    memset(padded + v->start_mark.line, ' ', pad - v->start_mark.line);
    memcpy(padded + pad, ld->text + from, end - from);
    padded[pad + end - from] = '\0';
    c->routing_text = dedent(ld->text + from, ld->text + end, c->routing_flow ? 0 : (int)col);
    if (!c->routing_text) {
        free(padded);
        return TANDEM_ENOMEM;
    }
    int rc = check_routing(ld, c->routing_line, padded, ld->source, NULL);
    free(padded);
    return rc;
}

/* Reads at most PEM_SCAN bytes of a PEM file for the check below. */
#define PEM_SCAN (1u << 20)

/* The file at file must hold a PEM block of the kind the key asks for: a
 * certificate for ca and cert, a private key for key. Catches swapped or
 * wrong files with the line that names them; the deeper checks (the key is
 * the certificate's, the CA signed it) need TLS and run in each process. */
static int check_pem(struct loader *ld, const char *key, const char *file, int want_key)
{
    int line = line_at(ld, key, ld->tls_line);
    FILE *f = fopen(file, "rb");
    if (!f) {
        int e = errno;
        return fail(ld, line, "%s: cannot read '%s': %s%s", key, file, strerror(e),
                    e == ENOENT ? " (deploy/make-cluster-ca.sh makes a CA and certificates)" : "");
    }
    char *buf = malloc(PEM_SCAN + 1);
    if (!buf) {
        fclose(f);
        return TANDEM_ENOMEM;
    }
    size_t n = fread(buf, 1, PEM_SCAN, f);
    int rerr = ferror(f);
    fclose(f);
    buf[n] = '\0';
    const char *begin = rerr ? NULL : strstr(buf, "-----BEGIN ");
    int ok = begin && (want_key ? strstr(begin, "PRIVATE KEY-----") != NULL
                                : strstr(begin, "-----BEGIN CERTIFICATE-----") != NULL);
    free(buf);
    if (rerr) {
        return fail(ld, line, "%s: cannot read '%s' (a directory?)", key, file);
    }
    if (!ok) {
        return fail(ld, line, "%s: '%s' holds no PEM %s (-----BEGIN %s-----)", key, file,
                    want_key ? "private key" : "certificate",
                    want_key ? "PRIVATE KEY" : "CERTIFICATE");
    }
    return 0;
}

static const struct field tls_fields[] = {
    /* Resolved only: check_pem reads them, with a hint when one is missing. */
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
        return fail(ld, yn_line(v),
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
        return fail(ld, ld->tls_line,
                    "%s: missing %s (give all three: ca, cert and key, or no tls section)", path,
                    missing);
    }
    if ((rc = check_pem(ld, "tls.ca", c->tls_ca, 0)) < 0 ||
        (rc = check_pem(ld, "tls.cert", c->tls_cert, 0)) < 0 ||
        (rc = check_pem(ld, "tls.key", c->tls_key, 1)) < 0) {
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
    {.key = "routing", .kind = F_SPECIAL, .fn = load_routing},
    {.key = "pools", .kind = F_SPECIAL, .fn = load_pools},
    {0},
};

/* ------------------------------------------------------------------ */
/* Cross-checks and defaults                                           */
/* ------------------------------------------------------------------ */

static int check_managed(struct loader *ld, const char *path, char **args, int n,
                         const char *const *managed)
{
    for (int i = 0; i < n; i++) {
        for (int j = 0; managed[j]; j++) {
            size_t l = strlen(managed[j]);
            if (strncmp(args[i], managed[j], l) == 0 && (args[i][l] == '\0' || args[i][l] == '=')) {
                return fail(ld, line_at(ld, path, 1),
                            "%s: '%s' is set by tandem up (see docs/up.md for the cluster file's "
                            "equivalent)",
                            path, managed[j]);
            }
        }
    }
    return 0;
}

/* A pool key only for another backend, or two keys that exclude each other. */
static int check_pool_keys(struct loader *ld, const struct cluster_pool *p, const char *pre)
{
    char path[PATH_KEY_MAX];
    int pline = p->line ? p->line : 1;
    const struct backend_desc *bd = backend_at((size_t)p->cfg.backend);
    for (size_t i = 0; i < wk_n_settings; i++) {
        const struct setting *s = &wk_settings[i];
        if (!(s->flags & SETTING_POOL) || !(p->set & bit((int)i))) {
            continue;
        }
        key_path(path, pre, s->key);
        if (s->reads && !(bd->reads & s->reads)) {
            return fail(ld, line_at(ld, path, pline), "%s: only for the %s backend", path,
                        backend_reading(s->reads)->name);
        }
        int other = s->conflicts ? wk_setting(s->conflicts) : -1;
        if (other >= 0 && (p->set & bit(other))) {
            return fail(ld, line_at(ld, path, pline), "%s: conflicts with %s.%s (give one)", path,
                        pre, wk_settings[other].key);
        }
    }
    return 0;
}

static int check_pool(struct loader *ld, enum cluster_role r)
{
    struct cluster *c = ld->c;
    struct cluster_pool *p = &c->pools[r];
    char pre[PATH_KEY_MAX], path[PATH_KEY_MAX], names[1024];
    int rc;
    key_path(pre, "pools", role_names[r]);
    int pline = p->line ? p->line : 1;
#define AT(key) (key_path(path, pre, key), line_at(ld, path, pline))
    const struct backend_desc *bd = backend_at((size_t)p->cfg.backend);
    int has_checkpoint = cluster_pool_has(p, "checkpoint");
    if ((rc = check_pool_keys(ld, p, pre)) < 0) {
        return rc;
    }
    if (has_checkpoint && cluster_pool_has(p, "model")) {
        return fail(ld, AT("checkpoint"),
                    "%s.checkpoint: conflicts with %s.model (the checkpoint names its model)", pre,
                    pre);
    }
    /* A model inherited from the top level is reported there. */
    char mkey[PATH_KEY_MAX];
    key_path(mkey, pre, "model");
    int mline = line_at(ld, mkey, 0);
    if (!mline) {
        snprintf(mkey, sizeof(mkey), "model");
        mline = line_at(ld, "model", pline);
    }
    if (!has_checkpoint && !cluster_pool_has(p, "model")) {
        struct worker_config top = {.model = c->model};
        if ((rc = cluster_pool_set(p, wk_setting("model"), &top)) < 0) {
            return rc;
        }
    }
    const char *model = cluster_pool_has(p, "model") ? p->cfg.model : NULL;
    if (!(bd->reads & BACKEND_READS_HARDWARE)) {
        if (model && !bd->model_known(model)) {
            return fail(ld, mline,
                        "%s: the %s backend has the model '%s' (or a checkpoint), got '%s'", mkey,
                        bd->name, bd->default_model, model);
        }
    } else {
        if (!bd->model_known(model)) {
            bd->model_names(names, sizeof(names));
            return fail(ld, mline, "%s: unknown %s model '%s' (one of: %s)", mkey, bd->name, model,
                        names);
        }
        if (cluster_pool_has(p, "gpu") && !preset_gpu_find(p->cfg.gpu)) {
            preset_gpu_names(names, sizeof(names));
            return fail(ld, AT("gpu"), "%s.gpu: unknown GPU '%s' (one of: %s)", pre, p->cfg.gpu,
                        names);
        }
        if (cluster_pool_has(p, "link") && !preset_link_find(p->cfg.link)) {
            preset_link_names(names, sizeof(names));
            return fail(ld, AT("link"), "%s.link: unknown link '%s' (one of: %s)", pre, p->cfg.link,
                        names);
        }
    }
    if (p->addrs && p->n_addrs != p->count) {
        return fail(ld, AT("addresses"), "%s.addresses: %d address%s for %d worker%s", pre,
                    p->n_addrs, p->n_addrs == 1 ? "" : "es", p->count, p->count == 1 ? "" : "s");
    }
    /* With tls every link must be tls+tcp:// (a tcp:// or ipc:// listener
     * would carry the cluster in the clear); without it a tls+tcp://
     * address has no certificates and the worker would exit at start. */
    for (int i = 0; i < p->n_addrs; i++) {
        const char *urls[2] = {p->addrs[i].control, p->addrs[i].kv};
        static const char *const which[2] = {"control", "kv"};
        for (int j = 0; j < 2; j++) {
            int is_tls = strncmp(urls[j], "tls+tcp://", 10) == 0;
            if (is_tls == cluster_tls(c)) {
                continue;
            }
            char apath[PATH_KEY_MAX + 40];
            snprintf(apath, sizeof(apath), "%s.addresses[%d].%s", pre, i, which[j]);
            return fail(ld, line_at(ld, apath, pline),
                        is_tls ? "%s: '%s' needs the tls section (certificates for every process)"
                               : "%s: '%s' is not tls+tcp:// (with tls, every address must be)",
                        apath, urls[j]);
        }
    }
    char managed[SETTINGS_MAX][48];
    const char *list[SETTINGS_MAX + 1];
    int n = 0;
    for (size_t i = 0; i < wk_n_settings; i++) {
        if (wk_settings[i].flags & SETTING_MANAGED) {
            snprintf(managed[n], sizeof(managed[n]), "--%s", wk_settings[i].name);
            list[n] = managed[n];
            n++;
        }
    }
    list[n] = NULL;
    key_path(path, pre, "args");
    if ((rc = check_managed(ld, path, p->args, p->n_args, list)) < 0) {
        return rc;
    }
#undef AT
    return 0;
}

/* Port ranges [lo, lo + n) that must not overlap. */
struct port_range {
    const char *what;
    int lo, n;
};

static int finish(struct loader *ld)
{
    struct cluster *c = ld->c;
    int rc;
    if (!c->name && (rc = set_str(&c->name, "cluster")) < 0) {
        return rc;
    }
    if (!c->backend && (rc = set_str(&c->backend, backend_default()->name)) < 0) {
        return rc;
    }
    if (!c->log_level && (rc = set_str(&c->log_level, "info")) < 0) {
        return rc;
    }
    if (!c->router_host && (rc = set_str(&c->router_host, "127.0.0.1")) < 0) {
        return rc;
    }
    if (c->block_size <= 0) {
        c->block_size = BH_DEFAULT_BLOCK_SIZE;
    }
    if (c->router_port < 0) {
        c->router_port = CLUSTER_DEFAULT_PORT;
    }
    if (c->metrics_base < 0) {
        c->metrics_base = 0;
    }

    /* Pools: one backend, then one model (its default depends on the
     * backend), then each pool's settings. */
    int decoders = 0, total = 0, first = -1;
    char pre[PATH_KEY_MAX], path[PATH_KEY_MAX];
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        struct cluster_pool *p = &c->pools[r];
        if (!cluster_pool_has(p, "backend")) {
            p->cfg.backend = yn_name_index(c->backend, backend_names);
            p->set |= bit(wk_setting("backend"));
        }
        if (p->count == 0) {
            continue;
        }
        if (first < 0) {
            first = r;
            continue;
        }
        const struct cluster_pool *f = &c->pools[first];
        key_path(pre, "pools", role_names[r]);
        if (p->cfg.backend != f->cfg.backend) {
            key_path(path, pre, "backend");
            return fail(ld, line_at(ld, path, p->line),
                        "pools.%s.backend: '%s' differs from pools.%s.backend '%s' (one cluster, "
                        "one backend)",
                        role_names[r], cluster_pool_backend(p), role_names[first],
                        cluster_pool_backend(f));
        }
    }
    const char *eff = first >= 0 ? cluster_pool_backend(&c->pools[first]) : c->backend;
    if (!c->model && (rc = set_str(&c->model, backend_find(eff)->default_model)) < 0) {
        return rc;
    }
    first = -1;
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        struct cluster_pool *p = &c->pools[r];
        if (p->count > 0 && (rc = check_pool(ld, (enum cluster_role)r)) < 0) {
            return rc;
        }
        total += p->count;
        decoders += r == CLUSTER_PREFILL ? 0 : p->count;
        if (p->count == 0) {
            continue;
        }
        if (first < 0) {
            first = r;
            continue;
        }
        const struct cluster_pool *f = &c->pools[first];
        key_path(pre, "pools", role_names[r]);
        const char *pm = cluster_pool_has(p, "model") ? p->cfg.model : NULL;
        const char *fm = cluster_pool_has(f, "model") ? f->cfg.model : NULL;
        if ((pm || fm) && (!pm || !fm || strcmp(pm, fm))) {
            key_path(path, pre, "model");
            return fail(ld, line_at(ld, path, p->line),
                        "pools.%s.model: '%s' differs from pools.%s.model '%s' (one cluster "
                        "serves one model)",
                        role_names[r], pm ? pm : "(checkpoint)", role_names[first],
                        fm ? fm : "(checkpoint)");
        }
    }
    int pools_line = line_at(ld, "pools", 1);
    if (decoders == 0) {
        return fail(ld, pools_line,
                    "pools: no decode or colocated worker (a cluster needs at least one)");
    }
    if (c->pools[CLUSTER_PREFILL].count > 0 && c->pools[CLUSTER_DECODE].count == 0) {
        return fail(ld, line_at(ld, "pools.prefill", pools_line),
                    "pools.prefill: prefill workers need decode workers (pools.decode.count > 0)");
    }

    /* TLS secures tcp links: it makes tcp the default transport, and ipc
     * given explicitly is a contradiction. */
    if (cluster_tls(c) && c->transport == CLUSTER_IPC) {
        int kind_line = line_at(ld, "transport.kind", 0);
        if (kind_line) {
            return fail(ld, kind_line,
                        "transport.kind: ipc cannot be used with tls (line %d): tls+tcp:// needs "
                        "kind tcp",
                        ld->tls_line);
        }
        c->transport = CLUSTER_TCP;
    }

    /* Transport. */
    if (c->transport == CLUSTER_IPC) {
        static const char *const tcp_only[] = {"transport.host", "transport.base_port",
                                               "ports.announce", NULL};
        for (int i = 0; tcp_only[i]; i++) {
            if (line_at(ld, tcp_only[i], 0)) {
                return fail(ld, line_at(ld, tcp_only[i], 0),
                            "%s: only for transport kind tcp (this cluster uses ipc)", tcp_only[i]);
            }
        }
        if (c->ipc_dir && strlen(c->ipc_dir) + 1 + IPC_NAME_MAX > SUN_PATH_MAX) {
            return fail(ld, line_at(ld, "transport.dir", 1),
                        "transport.dir: '%s' is too long for ipc socket paths (at most %d bytes)",
                        c->ipc_dir, SUN_PATH_MAX - 1 - IPC_NAME_MAX);
        }
    } else {
        if (line_at(ld, "transport.dir", 0)) {
            return fail(ld, line_at(ld, "transport.dir", 0),
                        "transport.dir: only for transport kind ipc (this cluster uses tcp%s)",
                        cluster_tls(c) ? ", for tls" : "");
        }
        if (!c->tcp_host && (rc = set_str(&c->tcp_host, "127.0.0.1")) < 0) {
            return rc;
        }
        if (c->base_port < 0) {
            c->base_port = 0;
        }
        if (cluster_announce_port(c) > 65535) {
            return fail(ld, line_at(ld, "ports.router", 1),
                        "ports.router: %d leaves no port for the announce socket (set "
                        "ports.announce)",
                        c->router_port);
        }
    }
    if (c->base_port > 0 && c->base_port + 2 * total - 1 > 65535) {
        return fail(ld, line_at(ld, "transport.base_port", 1),
                    "transport.base_port: %d + 2 x %d workers passes 65535", c->base_port, total);
    }
    if (c->metrics_base > 0 && c->metrics_base + total - 1 > 65535) {
        return fail(ld, line_at(ld, "ports.metrics_base", 1),
                    "ports.metrics_base: %d + %d workers passes 65535", c->metrics_base, total);
    }
    struct port_range ranges[] = {
        {"ports.router", c->router_port, c->router_port > 0},
        {"ports.announce", cluster_announce_port(c),
         c->transport == CLUSTER_TCP && cluster_announce_port(c) > 0},
        {"ports.metrics_base", c->metrics_base, c->metrics_base > 0 ? total : 0},
        {"transport.base_port", c->base_port, c->base_port > 0 ? 2 * total : 0},
    };
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < i; j++) {
            const struct port_range *a = &ranges[i], *b = &ranges[j];
            if (a->n && b->n && a->lo < b->lo + b->n && b->lo < a->lo + a->n) {
                return fail(ld, line_at(ld, a->what, 1), "%s: ports %d-%d overlap %s (%d-%d)",
                            a->what, a->lo, a->lo + a->n - 1, b->what, b->lo, b->lo + b->n - 1);
            }
        }
    }
    if ((rc = check_managed(ld, "router.args", c->router_args, c->n_router_args, router_managed)) <
        0) {
        return rc;
    }
    if (ld->routing_bs > 0 && ld->routing_bs != c->block_size) {
        return fail(ld, c->routing_line,
                    "routing: the prefix-cache-scorer's blockSize %d differs from block_size %d "
                    "(the workers' KV block size)",
                    ld->routing_bs, c->block_size);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Public API                                                          */
/* ------------------------------------------------------------------ */

void cluster_worker_config(const struct cluster *c, enum cluster_role r, struct worker_config *cfg,
                           uint64_t *set)
{
    const struct cluster_pool *p = &c->pools[r];
    enum log_level level = LOG_LEVEL_INFO;
    *cfg = p->cfg;
    *set = p->set;
    cfg->block_size = c->block_size;
    *set |= bit(wk_setting("block-size"));
    if (c->log_level && log_level_parse(c->log_level, &level) == 0) {
        cfg->log_level = (int)level;
        *set |= bit(wk_setting("log-level"));
    }
    const struct setting *tok = &wk_settings[wk_setting("tokenizer")];
    if (c->tokenizer && (!tok->reads || (backend_at((size_t)p->cfg.backend)->reads & tok->reads))) {
        cfg->tokenizer = c->tokenizer;
        *set |= bit(wk_setting("tokenizer"));
    }
}

const char *cluster_role_name(enum cluster_role r)
{
    return (unsigned)r < CLUSTER_N_ROLES ? role_names[r] : "?";
}

const char *cluster_default_text(void)
{
    return default_text;
}

int cluster_announce_port(const struct cluster *c)
{
    if (c->announce_port >= 0) {
        return c->announce_port;
    }
    return c->router_port > 0 ? c->router_port + 1 : 0;
}

int cluster_tls(const struct cluster *c)
{
    return c->tls_ca != NULL;
}

const char *cluster_tcp_scheme(const struct cluster *c)
{
    return cluster_tls(c) ? "tls+tcp" : "tcp";
}

int cluster_worker_count(const struct cluster *c)
{
    int n = 0;
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        n += c->pools[r].count;
    }
    return n;
}

static void free_args(char **a, int n)
{
    for (int i = 0; i < n; i++) {
        free(a[i]);
    }
    free(a);
}

void cluster_free(struct cluster *c)
{
    if (!c) {
        return;
    }
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        struct cluster_pool *p = &c->pools[r];
        for (size_t i = 0; i < wk_n_settings; i++) {
            pool_unset(p, (int)i);
        }
        free_args(p->args, p->n_args);
        for (int i = 0; i < p->n_addrs; i++) {
            free(p->addrs[i].control);
            free(p->addrs[i].kv);
        }
        free(p->addrs);
    }
    free(c->source);
    free(c->base_dir);
    free(c->name);
    free(c->model);
    free(c->backend);
    free(c->tokenizer);
    free(c->log_level);
    free(c->router_host);
    free_args(c->router_args, c->n_router_args);
    free(c->ipc_dir);
    free(c->tcp_host);
    free(c->tls_ca);
    free(c->tls_cert);
    free(c->tls_key);
    free(c->routing_path);
    free(c->routing_text);
    free(c);
}

static struct cluster *cluster_new(void)
{
    struct cluster *c = calloc(1, sizeof(*c));
    if (!c) {
        return NULL;
    }
    c->block_size = -1;
    c->router_port = -1;
    c->announce_port = -1;
    c->metrics_base = -1;
    c->base_port = -1;
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        wk_config_defaults(&c->pools[r].cfg);
    }
    return c;
}

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
    if (set_str(&ld.c->source, name) < 0 || set_str(&ld.c->base_dir, base_dir) < 0) {
        goto fail_cluster;
    }
    if (!yaml_parser_initialize(&parser)) {
        goto fail_cluster;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &ld.doc)) {
        rc = fail(&ld, (int)parser.problem_mark.line + 1, "YAML syntax error: %s%s%s",
                  parser.problem ? parser.problem : "unknown", parser.context ? " " : "",
                  parser.context ? parser.context : "");
        goto fail_parser;
    }
    yaml_node_t *root = yaml_document_get_root_node(&ld.doc);
    if (!root) {
        rc = fail(&ld, 1, "empty cluster file (docs/up.md shows the keys)");
        goto fail_doc;
    }
    if (root->type != YAML_MAPPING_NODE) {
        rc = fail(&ld, yn_line(root), "the cluster file must be a mapping of keys to values");
        goto fail_doc;
    }
    if ((rc = load_mapping(&ld, root, "", top_fields, ld.c)) < 0) {
        goto fail_doc;
    }
    if ((rc = finish(&ld)) < 0) {
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

int cluster_load(struct cluster **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    char *buf;
    size_t n;
    int rc = file_read_all(path, CLUSTER_MAX_FILE, &buf, &n, err, errlen);
    if (rc != 0) {
        return rc;
    }
    char real[PATH_MAX], dir[PATH_MAX];
    if (!realpath(path, real)) {
        snprintf(real, sizeof(real), "%s", path);
    }
    snprintf(dir, sizeof(dir), "%s", real);
    char *slash = strrchr(dir, '/');
    if (slash == dir) {
        dir[1] = '\0';
    } else if (slash) {
        *slash = '\0';
    } else {
        snprintf(dir, sizeof(dir), ".");
    }
    rc = cluster_parse(out, buf, n, path, dir, err, errlen);
    free(buf);
    return rc;
}

int cluster_default(struct cluster **out, char *err, size_t errlen)
{
    return cluster_parse(out, default_text, sizeof(default_text) - 1, "(default)", NULL, err,
                         errlen);
}

/* ------------------------------------------------------------------ */
/* Writing                                                             */
/* ------------------------------------------------------------------ */

/* The code point of the UTF-8 sequence at s (*len its bytes), or -1 when s
 * does not start a valid 2- or 3-byte sequence. */
static long utf8_at(const unsigned char *s, int *len)
{
    if (s[0] >= 0xc2 && s[0] <= 0xdf && (s[1] & 0xc0) == 0x80) {
        *len = 2;
        return ((long)(s[0] & 0x1f) << 6) | (s[1] & 0x3f);
    }
    if ((s[0] & 0xf0) == 0xe0 && (s[1] & 0xc0) == 0x80 && (s[2] & 0xc0) == 0x80) {
        *len = 3;
        return ((long)(s[0] & 0x0f) << 12) | ((long)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    }
    return -1;
}

/* s as a YAML double-quoted scalar that reads back as the same bytes. Besides
 * quotes, backslashes and C0 controls, YAML escapes what a reader would not
 * keep as is: DEL and the C1 controls (not printable), U+2028 and U+2029
 * (line breaks inside a quoted scalar, folded into a space on reading: found
 * by fuzz_cluster_yaml), the byte order mark and U+FFFE/U+FFFF. */
static void put_str(FILE *f, const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    while (*s) {
        unsigned char ch = *s;
        int len = 1;
        long cp = ch >= 0x80 ? utf8_at(s, &len) : -1;
        if (ch == '"' || ch == '\\') {
            fprintf(f, "\\%c", ch);
        } else if (ch < 0x20 || ch == 0x7f) {
            fprintf(f, "\\x%02x", ch);
        } else if ((cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff ||
                   cp == 0xfffe || cp == 0xffff) {
            fprintf(f, "\\u%04lx", cp);
        } else {
            fwrite(s, 1, (size_t)len, f);
        }
        s += len;
    }
    fputc('"', f);
}

static void put_kv(FILE *f, const char *indent, const char *key, const char *s)
{
    if (s) {
        fprintf(f, "%s%s: ", indent, key);
        put_str(f, s);
        fputc('\n', f);
    }
}

static void put_args(FILE *f, const char *indent, char **args, int n)
{
    if (n > 0) {
        fprintf(f, "%sargs: [", indent);
        for (int i = 0; i < n; i++) {
            if (i) {
                fputs(", ", f);
            }
            put_str(f, args[i]);
        }
        fputs("]\n", f);
    }
}

static void put_indented(FILE *f, const char *text, const char *indent)
{
    const char *s = text;
    while (*s) {
        const char *eol = strchr(s, '\n');
        size_t n = eol ? (size_t)(eol - s) : strlen(s);
        if (n) {
            fprintf(f, "%s%.*s\n", indent, (int)n, s);
        } else {
            fputc('\n', f);
        }
        s += n + (eol ? 1 : 0);
    }
}

/* A pool setting the pool gives, as "    key: value" (strings and choices
 * quoted). */
static void put_setting(FILE *f, const struct cluster_pool *p, int i)
{
    const struct setting *s = &wk_settings[i];
    char buf[PATH_MAX + 64];
    if (!(s->flags & SETTING_POOL) || !(p->set & bit(i)) ||
        settings_format(s, &p->cfg, buf, sizeof(buf)) < 0) {
        return;
    }
    if (s->type == FLAG_STR || s->type == FLAG_CHOICE) {
        put_kv(f, "    ", s->key, buf);
    } else {
        fprintf(f, "    %s: %s\n", s->key, buf);
    }
}

int cluster_write(const struct cluster *c, FILE *f)
{
    fprintf(f, "# tandem up cluster, resolved from %s (defaults filled in).\n", c->source);
    put_kv(f, "", "name", c->name);
    put_kv(f, "", "model", c->model);
    put_kv(f, "", "backend", c->backend);
    put_kv(f, "", "tokenizer", c->tokenizer);
    fprintf(f, "block_size: %d\n", c->block_size);
    put_kv(f, "", "log_level", c->log_level);
    fprintf(f, "router:\n");
    put_kv(f, "  ", "host", c->router_host);
    put_args(f, "  ", c->router_args, c->n_router_args);
    fprintf(f, "ports:\n  router: %d\n", c->router_port);
    if (c->transport == CLUSTER_TCP && c->announce_port >= 0) {
        fprintf(f, "  announce: %d\n", c->announce_port);
    }
    fprintf(f, "  metrics_base: %d\n", c->metrics_base);
    fprintf(f, "transport:\n  kind: %s\n", transport_choices[c->transport]);
    if (c->transport == CLUSTER_TCP) {
        put_kv(f, "  ", "host", c->tcp_host);
        fprintf(f, "  base_port: %d\n", c->base_port);
    } else {
        put_kv(f, "  ", "dir", c->ipc_dir);
    }
    if (cluster_tls(c)) {
        fprintf(f, "tls:\n");
        put_kv(f, "  ", "ca", c->tls_ca);
        put_kv(f, "  ", "cert", c->tls_cert);
        put_kv(f, "  ", "key", c->tls_key);
    }
    if (c->routing_path) {
        put_kv(f, "", "routing", c->routing_path);
    } else if (c->routing_text && c->routing_flow) {
        fprintf(f, "routing: %s", c->routing_text);
    } else if (c->routing_text) {
        fprintf(f, "routing:\n");
        put_indented(f, c->routing_text, "  ");
    }
    fprintf(f, "pools:\n");
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        const struct cluster_pool *p = &c->pools[r];
        if (p->count == 0) {
            continue;
        }
        fprintf(f, "  %s:\n    count: %d\n", role_names[r], p->count);
        for (size_t i = 0; i < wk_n_settings; i++) {
            put_setting(f, p, (int)i);
        }
        put_args(f, "    ", p->args, p->n_args);
        if (p->addrs) {
            fprintf(f, "    addresses:\n");
            for (int i = 0; i < p->n_addrs; i++) {
                fprintf(f, "    - control: ");
                put_str(f, p->addrs[i].control);
                fprintf(f, "\n      kv: ");
                put_str(f, p->addrs[i].kv);
                fputc('\n', f);
            }
        }
    }
    return ferror(f) ? TANDEM_EIO : 0;
}

int cluster_write_routing(const struct cluster *c, FILE *f)
{
    if (!c->routing_text) {
        return TANDEM_EINVAL;
    }
    fprintf(f, "# The inline routing of %s (line %d), as the router reads it.\n", c->source,
            c->routing_line);
    fputs(c->routing_text, f);
    return ferror(f) ? TANDEM_EIO : 0;
}
