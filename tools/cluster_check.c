/* What a cluster file may not say across keys, checked once every key is
 * read: pool keys for another backend or that exclude each other, models,
 * presets, addresses against tls, flags tandem up passes itself, ports that
 * overlap; and the defaults of what the file leaves out. Also the tls files'
 * PEM check, called by the loader's `tls:` section. */
#include "cluster.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "block_hash.h"
#include "presets.h"
#include "rt_apikey.h"
#include "tandem_err.h"
#include "wk_config.h"
#include "yaml_node.h"

#include "cluster_int.h"

/* Longest socket name we create in an ipc directory: "colocated-63.ctl.ipc". */
#define IPC_NAME_MAX 24

/* Flags `tandem up` passes itself; extra args may not repeat them (for
 * workers: the settings marked SETTING_MANAGED). The TLS flags come from the
 * `tls:` section only, so that the addresses' scheme and the flags cannot
 * disagree. */
static const char *const router_managed[] = {"--host",         "--port",     "--announce",
                                             "--tls-ca",       "--tls-cert", "--tls-key",
                                             "--api-key-file", NULL};

/* The API key stays out of the cluster file and of every command line
 * tandem up records (commands.txt, --dry-run): router.api_key_file names
 * a file, checked here as the router will read it. */
static int check_api_key(struct loader *ld, const struct cluster *c)
{
    for (int i = 0; i < c->n_router_args; i++) {
        const char *a = c->router_args[i];
        if (strncmp(a, "--api-key", 9) == 0 && (a[9] == '\0' || a[9] == '=')) {
            return cluster_fail(ld, cluster_line_at(ld, "router.args", 1),
                                "router.args: '--api-key' would write the key into the cluster "
                                "file and the command lines tandem up records; use "
                                "router.api_key_file: FILE or $%s (docs/up.md)",
                                RT_APIKEY_ENV);
        }
    }
    if (c->router_api_key_file == NULL) {
        return 0;
    }
    char key[RT_APIKEY_MAX + 1], src[PATH_MAX + 32], err[CLUSTER_ERR_MAX];
    int rc = rt_apikey_find(NULL, c->router_api_key_file, key, src, sizeof(src), err, sizeof(err));
    auth_wipe(key, sizeof(key));
    if (rc < 0) {
        return rc == TANDEM_ENOMEM ? rc
                                   : cluster_fail(ld, cluster_line_at(ld, "router.api_key_file", 1),
                                                  "router.api_key_file: %s", err);
    }
    return 0;
}

/* Reads at most PEM_SCAN bytes of a PEM file for the check below. */
#define PEM_SCAN (1u << 20)

/* The file at file must hold a PEM block of the kind the key asks for: a
 * certificate for ca and cert, a private key for key. Catches swapped or
 * wrong files with the line that names them; the deeper checks (the key is
 * the certificate's, the CA signed it) need TLS and run in each process. */
int cluster_check_pem(struct loader *ld, const char *key, const char *file, int want_key)
{
    int line = cluster_line_at(ld, key, ld->tls_line);
    FILE *f = fopen(file, "rb");
    if (!f) {
        int e = errno;
        return cluster_fail(ld, line, "%s: cannot read '%s': %s%s", key, file, strerror(e),
                            e == ENOENT ? " (deploy/make-cluster-ca.sh makes a CA and certificates)"
                                        : "");
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
        return cluster_fail(ld, line, "%s: cannot read '%s' (a directory?)", key, file);
    }
    if (!ok) {
        return cluster_fail(ld, line, "%s: '%s' holds no PEM %s (-----BEGIN %s-----)", key, file,
                            want_key ? "private key" : "certificate",
                            want_key ? "PRIVATE KEY" : "CERTIFICATE");
    }
    return 0;
}

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
                return cluster_fail(
                    ld, cluster_line_at(ld, path, 1),
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
        if (!(s->flags & SETTING_POOL) || !(p->set & cluster_bit((int)i))) {
            continue;
        }
        cluster_key_path(path, pre, s->key);
        if (s->reads && !(bd->reads & s->reads)) {
            return cluster_fail(ld, cluster_line_at(ld, path, pline), "%s: only for the %s backend",
                                path, backend_reading(s->reads)->name);
        }
        int other = s->conflicts ? wk_setting(s->conflicts) : -1;
        if (other >= 0 && (p->set & cluster_bit(other))) {
            return cluster_fail(ld, cluster_line_at(ld, path, pline),
                                "%s: conflicts with %s.%s (give one)", path, pre,
                                wk_settings[other].key);
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
    cluster_key_path(pre, "pools", cluster_role_names[r]);
    int pline = p->line ? p->line : 1;
#define AT(key) (cluster_key_path(path, pre, key), cluster_line_at(ld, path, pline))
    const struct backend_desc *bd = backend_at((size_t)p->cfg.backend);
    int has_checkpoint = cluster_pool_has(p, "checkpoint");
    if ((rc = check_pool_keys(ld, p, pre)) < 0) {
        return rc;
    }
    if (has_checkpoint && cluster_pool_has(p, "model")) {
        return cluster_fail(
            ld, AT("checkpoint"),
            "%s.checkpoint: conflicts with %s.model (the checkpoint names its model)", pre, pre);
    }
    /* A model inherited from the top level is reported there. */
    char mkey[PATH_KEY_MAX];
    cluster_key_path(mkey, pre, "model");
    int mline = cluster_line_at(ld, mkey, 0);
    if (!mline) {
        snprintf(mkey, sizeof(mkey), "model");
        mline = cluster_line_at(ld, "model", pline);
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
            return cluster_fail(ld, mline,
                                "%s: the %s backend has the model '%s' (or a checkpoint), got '%s'",
                                mkey, bd->name, bd->default_model, model);
        }
    } else {
        if (!bd->model_known(model)) {
            bd->model_names(names, sizeof(names));
            return cluster_fail(ld, mline, "%s: unknown %s model '%s' (one of: %s)", mkey, bd->name,
                                model, names);
        }
        if (cluster_pool_has(p, "gpu") && !preset_gpu_find(p->cfg.gpu)) {
            preset_gpu_names(names, sizeof(names));
            return cluster_fail(ld, AT("gpu"), "%s.gpu: unknown GPU '%s' (one of: %s)", pre,
                                p->cfg.gpu, names);
        }
        if (cluster_pool_has(p, "link") && !preset_link_find(p->cfg.link)) {
            preset_link_names(names, sizeof(names));
            return cluster_fail(ld, AT("link"), "%s.link: unknown link '%s' (one of: %s)", pre,
                                p->cfg.link, names);
        }
    }
    if (p->addrs && p->n_addrs != p->count) {
        return cluster_fail(ld, AT("addresses"), "%s.addresses: %d address%s for %d worker%s", pre,
                            p->n_addrs, p->n_addrs == 1 ? "" : "es", p->count,
                            p->count == 1 ? "" : "s");
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
            return cluster_fail(
                ld, cluster_line_at(ld, apath, pline),
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
    cluster_key_path(path, pre, "args");
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

int cluster_finish(struct loader *ld)
{
    struct cluster *c = ld->c;
    int rc;
    if (!c->name && (rc = cluster_set_str(&c->name, "cluster")) < 0) {
        return rc;
    }
    if (!c->backend && (rc = cluster_set_str(&c->backend, backend_default()->name)) < 0) {
        return rc;
    }
    if (!c->log_level && (rc = cluster_set_str(&c->log_level, "info")) < 0) {
        return rc;
    }
    if (!c->router_host && (rc = cluster_set_str(&c->router_host, "127.0.0.1")) < 0) {
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
            p->set |= cluster_bit(wk_setting("backend"));
        }
        if (p->count == 0) {
            continue;
        }
        if (first < 0) {
            first = r;
            continue;
        }
        const struct cluster_pool *f = &c->pools[first];
        cluster_key_path(pre, "pools", cluster_role_names[r]);
        if (p->cfg.backend != f->cfg.backend) {
            cluster_key_path(path, pre, "backend");
            return cluster_fail(
                ld, cluster_line_at(ld, path, p->line),
                "pools.%s.backend: '%s' differs from pools.%s.backend '%s' (one cluster, "
                "one backend)",
                cluster_role_names[r], cluster_pool_backend(p), cluster_role_names[first],
                cluster_pool_backend(f));
        }
    }
    const char *eff = first >= 0 ? cluster_pool_backend(&c->pools[first]) : c->backend;
    if (!c->model && (rc = cluster_set_str(&c->model, backend_find(eff)->default_model)) < 0) {
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
        cluster_key_path(pre, "pools", cluster_role_names[r]);
        const char *pm = cluster_pool_has(p, "model") ? p->cfg.model : NULL;
        const char *fm = cluster_pool_has(f, "model") ? f->cfg.model : NULL;
        if ((pm || fm) && (!pm || !fm || strcmp(pm, fm))) {
            cluster_key_path(path, pre, "model");
            return cluster_fail(
                ld, cluster_line_at(ld, path, p->line),
                "pools.%s.model: '%s' differs from pools.%s.model '%s' (one cluster "
                "serves one model)",
                cluster_role_names[r], pm ? pm : "(checkpoint)", cluster_role_names[first],
                fm ? fm : "(checkpoint)");
        }
    }
    int pools_line = cluster_line_at(ld, "pools", 1);
    if (decoders == 0) {
        return cluster_fail(ld, pools_line,
                            "pools: no decode or colocated worker (a cluster needs at least one)");
    }
    if (c->pools[CLUSTER_PREFILL].count > 0 && c->pools[CLUSTER_DECODE].count == 0) {
        return cluster_fail(
            ld, cluster_line_at(ld, "pools.prefill", pools_line),
            "pools.prefill: prefill workers need decode workers (pools.decode.count > 0)");
    }

    /* TLS secures tcp links: it makes tcp the default transport, and ipc
     * given explicitly is a contradiction. */
    if (cluster_tls(c) && c->transport == CLUSTER_IPC) {
        int kind_line = cluster_line_at(ld, "transport.kind", 0);
        if (kind_line) {
            return cluster_fail(
                ld, kind_line,
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
            if (cluster_line_at(ld, tcp_only[i], 0)) {
                return cluster_fail(ld, cluster_line_at(ld, tcp_only[i], 0),
                                    "%s: only for transport kind tcp (this cluster uses ipc)",
                                    tcp_only[i]);
            }
        }
        if (c->ipc_dir && strlen(c->ipc_dir) + 1 + IPC_NAME_MAX > SUN_PATH_MAX) {
            return cluster_fail(
                ld, cluster_line_at(ld, "transport.dir", 1),
                "transport.dir: '%s' is too long for ipc socket paths (at most %d bytes)",
                c->ipc_dir, SUN_PATH_MAX - 1 - IPC_NAME_MAX);
        }
    } else {
        if (cluster_line_at(ld, "transport.dir", 0)) {
            return cluster_fail(
                ld, cluster_line_at(ld, "transport.dir", 0),
                "transport.dir: only for transport kind ipc (this cluster uses tcp%s)",
                cluster_tls(c) ? ", for tls" : "");
        }
        if (!c->tcp_host && (rc = cluster_set_str(&c->tcp_host, "127.0.0.1")) < 0) {
            return rc;
        }
        if (c->base_port < 0) {
            c->base_port = 0;
        }
        if (cluster_announce_port(c) > 65535) {
            return cluster_fail(ld, cluster_line_at(ld, "ports.router", 1),
                                "ports.router: %d leaves no port for the announce socket (set "
                                "ports.announce)",
                                c->router_port);
        }
    }
    if (c->base_port > 0 && c->base_port + 2 * total - 1 > 65535) {
        return cluster_fail(ld, cluster_line_at(ld, "transport.base_port", 1),
                            "transport.base_port: %d + 2 x %d workers passes 65535", c->base_port,
                            total);
    }
    if (c->metrics_base > 0 && c->metrics_base + total - 1 > 65535) {
        return cluster_fail(ld, cluster_line_at(ld, "ports.metrics_base", 1),
                            "ports.metrics_base: %d + %d workers passes 65535", c->metrics_base,
                            total);
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
                return cluster_fail(ld, cluster_line_at(ld, a->what, 1),
                                    "%s: ports %d-%d overlap %s (%d-%d)", a->what, a->lo,
                                    a->lo + a->n - 1, b->what, b->lo, b->lo + b->n - 1);
            }
        }
    }
    if ((rc = check_managed(ld, "router.args", c->router_args, c->n_router_args, router_managed)) <
            0 ||
        (rc = check_api_key(ld, c)) < 0) {
        return rc;
    }
    if (ld->routing_bs > 0 && ld->routing_bs != c->block_size) {
        return cluster_fail(
            ld, c->routing_line,
            "routing: the prefix-cache-scorer's blockSize %d differs from block_size %d "
            "(the workers' KV block size)",
            ld->routing_bs, c->block_size);
    }
    return 0;
}
