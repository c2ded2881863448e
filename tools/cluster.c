/* Cluster files (cluster.h): the structure and its pool settings, the
 * accessors, cluster_free, and where a cluster comes from (cluster_load,
 * cluster_default). The rest of the module: cluster_load.c (the YAML loader,
 * cluster_parse), cluster_routing.c (the `routing:` key), cluster_check.c
 * (defaults and cross-checks), cluster_write.c (the file written back);
 * cluster_int.h is what they share. */
#include "cluster.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "file.h"
#include "log.h"
#include "tandem_err.h"
#include "wk_config.h"

#include "cluster_int.h"

const char *const cluster_role_names[CLUSTER_N_ROLES + 1] = {"prefill", "decode", "colocated",
                                                             NULL};
const char *const cluster_transport_names[] = {"ipc", "tcp", NULL};

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
/* A pool's worker settings (wk_settings)                              */
/* ------------------------------------------------------------------ */

int cluster_pool_has(const struct cluster_pool *p, const char *name)
{
    int i = wk_setting(name);
    return i >= 0 && (p->set & cluster_bit(i)) != 0;
}

const char *cluster_pool_backend(const struct cluster_pool *p)
{
    return backend_names[p->cfg.backend];
}

/* Back to the default; a string the pool owned is freed. */
static void pool_unset(struct cluster_pool *p, int i)
{
    const struct setting *s = &wk_settings[i];
    if ((p->set & cluster_bit(i)) && s->type == FLAG_STR) {
        free(*(char **)((char *)&p->cfg + s->off));
    }
    struct worker_config def;
    wk_config_defaults(&def);
    settings_copy(s, &p->cfg, &def);
    p->set &= ~cluster_bit(i);
}

/* Stores the string v (taken: the pool frees it) as setting i. */
void cluster_pool_take_str(struct cluster_pool *p, int i, char *v)
{
    pool_unset(p, i);
    *(char **)((char *)&p->cfg + wk_settings[i].off) = v;
    p->set |= cluster_bit(i);
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
        cluster_pool_take_str(p, i, d);
    } else {
        settings_copy(s, &p->cfg, src);
        p->set |= cluster_bit(i);
    }
    /* A setting this one excludes goes (kv_blocks replaces kv_memory). */
    for (size_t j = 0; j < wk_n_settings; j++) {
        if (wk_settings[j].conflicts && strcmp(wk_settings[j].conflicts, s->name) == 0) {
            pool_unset(p, (int)j);
        }
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
    *set |= cluster_bit(wk_setting("block-size"));
    if (c->log_level && log_level_parse(c->log_level, &level) == 0) {
        cfg->log_level = (int)level;
        *set |= cluster_bit(wk_setting("log-level"));
    }
    const struct setting *tok = &wk_settings[wk_setting("tokenizer")];
    if (c->tokenizer && (!tok->reads || (backend_at((size_t)p->cfg.backend)->reads & tok->reads))) {
        cfg->tokenizer = c->tokenizer;
        *set |= cluster_bit(wk_setting("tokenizer"));
    }
}

const char *cluster_role_name(enum cluster_role r)
{
    return (unsigned)r < CLUSTER_N_ROLES ? cluster_role_names[r] : "?";
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
    free(c->router_api_key_file);
    free(c->ipc_dir);
    free(c->tcp_host);
    free(c->tls_ca);
    free(c->tls_cert);
    free(c->tls_key);
    free(c->routing_path);
    free(c->routing_text);
    free(c);
}

struct cluster *cluster_new(void)
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
