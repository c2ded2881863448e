/* The plan of a cluster: see up_plan.h. */
#include "up_plan.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "settings.h"
#include "tandem_err.h"

/* ------------------------------------------------------------------ */
/* The plan                                                            */
/* ------------------------------------------------------------------ */

struct argv_builder {
    char **v;
    int n, cap;
    int oom;
};

static void arg(struct argv_builder *b, const char *s)
{
    if (b->oom) {
        return;
    }
    if (b->n + 2 > b->cap) {
        int cap = b->cap ? b->cap * 2 : 32;
        char **v = realloc(b->v, sizeof(*v) * (size_t)cap);
        if (!v) {
            b->oom = 1;
            return;
        }
        b->v = v;
        b->cap = cap;
    }
    if (!(b->v[b->n] = strdup(s))) {
        b->oom = 1;
        return;
    }
    b->v[++b->n] = NULL;
}

static void arg2(struct argv_builder *b, const char *flag, const char *value)
{
    if (value) {
        arg(b, flag);
        arg(b, value);
    }
}

static void arg_int(struct argv_builder *b, const char *flag, long long v)
{
    char buf[32];
    if (v >= 0) {
        snprintf(buf, sizeof(buf), "%lld", v);
        arg2(b, flag, buf);
    }
}

static const char *binary_of(enum up_kind k, enum cluster_role r)
{
    return k == UP_ROUTER         ? "tandem-router"
           : r == CLUSTER_PREFILL ? "tandem-prefill"
                                  : "tandem-decode";
}

__attribute__((format(printf, 4, 5))) static int url_for(char *out, char *err, size_t errlen,
                                                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, UP_URL_MAX, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= UP_URL_MAX) {
        snprintf(err, errlen, "address too long: %s", out);
        return TANDEM_EINVAL;
    }
    return 0;
}

static int worker_urls(struct up_spec *s, const struct cluster *c, const struct up_plan *plan,
                       const struct cluster_pool *p, int in_pool, int global, char *err,
                       size_t errlen)
{
    int rc = 0;
    if (p->addrs) {
        snprintf(s->control, sizeof(s->control), "%s", p->addrs[in_pool].control);
        snprintf(s->kv, sizeof(s->kv), "%s", p->addrs[in_pool].kv);
    } else if (c->transport == CLUSTER_IPC) {
        if ((rc = url_for(s->control, err, errlen, "ipc://%s/%s.ctl.ipc", plan->ipc_dir,
                          s->name)) == 0) {
            rc = url_for(s->kv, err, errlen, "ipc://%s/%s.kv.ipc", plan->ipc_dir, s->name);
        }
    } else {
        int base = c->base_port;
        const char *scheme = cluster_tcp_scheme(c);
        if ((rc = url_for(s->control, err, errlen, "%s://%s:%d", scheme, c->tcp_host,
                          base ? base + 2 * global : 0)) == 0) {
            rc = url_for(s->kv, err, errlen, "%s://%s:%d", scheme, c->tcp_host,
                         base ? base + 2 * global + 1 : 0);
        }
    }
    s->metrics_port = c->metrics_base ? c->metrics_base + global : 0;
    return rc;
}

/* The same three files for every process: the CA is the trust boundary and
 * NNG 1.5 checks no host names (docs/multi-host.md). */
static void tls_argv(struct argv_builder *b, const struct cluster *c)
{
    arg2(b, "--tls-ca", c->tls_ca);
    arg2(b, "--tls-cert", c->tls_cert);
    arg2(b, "--tls-key", c->tls_key);
}

static void worker_argv(struct argv_builder *b, const struct cluster *c, const struct up_plan *plan,
                        const struct up_spec *s, const struct cluster_pool *p)
{
    arg2(b, "--id", s->name);
    arg2(b, "--control", s->control);
    arg2(b, "--kv", s->kv);
    arg_int(b, "--metrics-port", s->metrics_port);
    if (plan->announce[0]) {
        arg2(b, "--router", plan->announce);
    }
    tls_argv(b, c);
    /* Then every setting the cluster gives, in wk_settings order. */
    struct worker_config cfg;
    uint64_t set;
    cluster_worker_config(c, s->role, &cfg, &set);
    for (size_t i = 0; i < wk_n_settings; i++) {
        const struct setting *ws = &wk_settings[i];
        char buf[PATH_MAX + 64];
        if (!(set & ((uint64_t)1 << i)) || (ws->flags & SETTING_MANAGED)) {
            continue;
        }
        if (settings_format(ws, &cfg, buf, sizeof(buf)) < 0) {
            b->oom = 1; /* no value is that long */
            return;
        }
        char flag[80];
        snprintf(flag, sizeof(flag), "--%s%s", ws->name,
                 ws->type == FLAG_BOOL && strcmp(buf, "true") != 0 ? "=false" : "");
        if (ws->type == FLAG_BOOL) {
            arg(b, flag);
        } else {
            arg2(b, flag, buf);
        }
    }
    if (s->role == CLUSTER_COLOCATED) {
        arg(b, "--colocated");
    }
    for (int i = 0; i < p->n_args; i++) {
        arg(b, p->args[i]);
    }
}

static void router_argv(struct argv_builder *b, const struct cluster *c, const struct up_plan *plan)
{
    arg2(b, "--host", c->router_host);
    arg_int(b, "--port", plan->router_port);
    arg2(b, "--announce", plan->announce);
    tls_argv(b, c);
    arg2(b, "--model", c->model);
    arg_int(b, "--block-size", c->block_size);
    arg2(b, "--log-level", c->log_level);
    if (plan->routing_file[0]) {
        arg2(b, "--routing", plan->routing_file);
    }
    arg2(b, "--tokenizer", c->tokenizer);
    /* The file's path, never the key: argv is in commands.txt and ps. */
    arg2(b, "--api-key-file", c->router_api_key_file);
    for (int i = 0; i < c->n_router_args; i++) {
        arg(b, c->router_args[i]);
    }
}

int up_plan_build(struct up_plan *plan, const struct cluster *c, const struct up_plan_input *in,
                  char *err, size_t errlen)
{
    memset(plan, 0, sizeof(*plan));
    int n = cluster_worker_count(c) + (in->no_router ? 0 : 1);
    plan->procs = calloc((size_t)n, sizeof(*plan->procs));
    if (!plan->procs) {
        return TANDEM_ENOMEM;
    }
    plan->router_port = in->router_port;
    int rc = 0;
    if (c->transport == CLUSTER_IPC) {
        snprintf(plan->ipc_dir, sizeof(plan->ipc_dir), "%s", in->ipc_dir);
    }
    if (!in->no_router) {
        rc = c->transport == CLUSTER_IPC
                 ? url_for(plan->announce, err, errlen, "ipc://%s/announce.ipc", plan->ipc_dir)
                 : url_for(plan->announce, err, errlen, "%s://%s:%d", cluster_tcp_scheme(c),
                           c->tcp_host, in->announce_port);
        if (rc < 0) {
            goto fail;
        }
        if (c->routing_path) {
            snprintf(plan->routing_file, sizeof(plan->routing_file), "%s", c->routing_path);
        } else {
            /* Inline routing, or none (the router's default): written next
             * to the logs, so a run shows the routing it ran with. */
            int w = snprintf(plan->routing_file, sizeof(plan->routing_file), "%s/routing.yaml",
                             in->run_dir);
            if (w < 0 || (size_t)w >= sizeof(plan->routing_file)) {
                snprintf(err, errlen, "run directory path too long");
                rc = TANDEM_EINVAL;
                goto fail;
            }
        }
    }
    int global = 0;
    for (int i = 0; i < n; i++) {
        struct up_spec *s = &plan->procs[i];
        struct argv_builder b = {0};
        char path[PATH_MAX];
        const struct cluster_pool *p = NULL;
        if (i == 0 && !in->no_router) {
            s->kind = UP_ROUTER;
            snprintf(s->name, sizeof(s->name), "router");
        } else {
            int r = 0, k = global;
            while (k >= c->pools[r].count) {
                k -= c->pools[r++].count;
            }
            p = &c->pools[r];
            s->kind = UP_WORKER;
            s->role = (enum cluster_role)r;
            snprintf(s->name, sizeof(s->name), "%s-%d", cluster_role_name(s->role), k);
            if ((rc = worker_urls(s, c, plan, p, k, global, err, errlen)) < 0) {
                goto fail;
            }
            global++;
        }
        snprintf(path, sizeof(path), "%s/%s", in->bin_dir, binary_of(s->kind, s->role));
        arg(&b, path);
        if (s->kind == UP_ROUTER) {
            router_argv(&b, c, plan);
        } else {
            worker_argv(&b, c, plan, s, p);
        }
        s->argv = b.v;
        s->argc = b.n;
        plan->n = i + 1;
        if (b.oom) {
            rc = TANDEM_ENOMEM;
            goto fail;
        }
    }
    return 0;
fail:
    up_plan_free(plan);
    return rc;
}

void up_plan_free(struct up_plan *plan)
{
    for (int i = 0; i < plan->n; i++) {
        for (int j = 0; j < plan->procs[i].argc; j++) {
            free(plan->procs[i].argv[j]);
        }
        free(plan->procs[i].argv);
    }
    free(plan->procs);
    plan->procs = NULL;
    plan->n = 0;
}

void up_print_command(FILE *f, char *const *argv)
{
    for (int i = 0; argv[i]; i++) {
        const char *s = argv[i];
        int plain = *s != '\0';
        for (const char *q = s; *q; q++) {
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                        "@%+=:,./-_",
                        *q)) {
                plain = 0;
            }
        }
        fputs(i ? " " : "", f);
        if (plain) {
            fputs(s, f);
            continue;
        }
        fputc('\'', f);
        for (; *s; s++) {
            if (*s == '\'') {
                fputs("'\\''", f);
            } else {
                fputc(*s, f);
            }
        }
        fputc('\'', f);
    }
    fputc('\n', f);
}
