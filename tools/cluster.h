/* Cluster files for `tandem up` (docs/up.md): one YAML file describes a local
 * cluster (a router and pools of prefill, decode and colocated workers), its
 * transport, ports and routing. Loaded with libyaml's document API, so every
 * message names the key by its dotted path and gives the file's line:
 *
 *   c.yaml:7: pools.decode.kv_blocs: unknown key (valid: count, backend, ...)
 *   c.yaml:5: pools.decode.count: expected an integer in [0, 64], got 'many'
 *
 * Everything is validated here, before a process starts: types and ranges,
 * sim presets (model, GPU, link), paths (relative ones resolve against the
 * cluster file's directory), flags that `tandem up` sets itself, and the
 * routing configuration (file or inline mapping) through the router's own
 * loader and plugin table (rt_pipeline_create), so a bad plugin is reported
 * with its file and line too, and the `tls:` files (readable PEM of the
 * right kind; whether the key matches the certificate and the CA signed it is
 * checked by each process at start, tls_init).
 *
 * A pool's worker settings are described once, in wk_settings
 * (worker/wk_config.h): its keys, their checks and messages come from there.
 * A setting the file does not give keeps the worker's default, and no flag
 * is passed for it. Threading: pure functions, any thread. */
#ifndef TANDEM_CLUSTER_H
#define TANDEM_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "wk_config.h"

#define CLUSTER_ERR_MAX         1024 /* suggested size of error buffers */
#define CLUSTER_MAX_POOL        1024 /* workers per pool (offline clusters are large; live ones rarely pass 16) */
#define CLUSTER_MAX_FILE        (1u << 20)
#define CLUSTER_DEFAULT_PORT    8000
#define CLUSTER_DEFAULT_TIMEOUT 60

enum cluster_role { CLUSTER_PREFILL = 0, CLUSTER_DECODE, CLUSTER_COLOCATED, CLUSTER_N_ROLES };

enum cluster_transport { CLUSTER_IPC = 0, CLUSTER_TCP };

/* Explicit listen addresses of one worker (pools.<role>.addresses[i]). */
struct cluster_addr {
    char *control; /* tcp://host:port, tls+tcp://host:port or ipc:///path */
    char *kv;
};

struct cluster_pool {
    int count; /* 0: the pool is absent */
    int line;  /* line of the pool's key (0 when absent) */
    /* Its workers' settings (worker/wk_config.h): the defaults, then the
     * pool keys the file gives and what the pool inherits from the top level
     * (backend, model), each marked in set (bit i: wk_settings[i]). Strings
     * of settings in set are owned by the cluster, the others are the
     * table's static defaults. A model is absent (not in set) with a
     * checkpoint; a checkpoint is an absolute path. */
    struct worker_config cfg;
    uint64_t set;
    char **args; /* (n_args) extra flags, passed last */
    int n_args;
    struct cluster_addr *addrs; /* (n_addrs) = count, or NULL: from transport */
    int n_addrs;
};

struct cluster {
    char *source;   /* the file's path as given, or "(default)" */
    char *base_dir; /* absolute directory relative paths resolve against */
    char *name;
    char *model;     /* the served model name (router --model) */
    char *backend;   /* default backend of the pools */
    char *tokenizer; /* absolute path, or NULL */
    int block_size;  /* workers' and router's --block-size */
    char *log_level; /* every process's --log-level */

    char *router_host;  /* router HTTP host */
    char **router_args; /* (n_router_args) extra router flags */
    int n_router_args;
    char *router_api_key_file; /* absolute path of the API key file, or NULL */

    int router_port;   /* HTTP; 0: a free port picked at start */
    int announce_port; /* tcp transport; -1: router_port + 1 (cluster_announce_port) */
    int metrics_base;  /* worker i: metrics_base + i; 0: any free port */

    enum cluster_transport transport;
    char *ipc_dir;  /* ipc: NULL = a fresh mkdtemp under /tmp */
    char *tcp_host; /* tcp: where workers and the announce socket listen */
    int base_port;  /* tcp: worker i gets base+2i (control), base+2i+1 (kv); 0: any */

    /* Mutual TLS (the `tls:` section): absolute paths of the cluster CA and
     * the certificate and key every process presents, all three or all NULL.
     * With them every NNG address is tls+tcp:// (transport tcp) and every
     * process gets --tls-ca, --tls-cert, --tls-key. */
    char *tls_ca;
    char *tls_cert;
    char *tls_key;

    /* Routing: at most one of the two. */
    char *routing_path; /* absolute path of an EndpointPickerConfig file */
    char *routing_text; /* inline mapping, dedented YAML text */
    int routing_flow;   /* the inline mapping was written in flow style {..} */
    int routing_line;   /* line of the `routing:` key (0: no routing) */

    struct cluster_pool pools[CLUSTER_N_ROLES];
};

/* 1 when the pool gives the setting with this flag name ("kv-blocks"). */
int cluster_pool_has(const struct cluster_pool *p, const char *name);

/* The pool's backend by name ("tiny", "sim"). */
const char *cluster_pool_backend(const struct cluster_pool *p);

/* Sets wk_settings[i] of the pool to its value in src (a string is copied)
 * and unsets a setting that conflicts with it (kv_memory for kv_blocks).
 * For callers that change a loaded cluster (experiment overrides); nothing
 * is checked. Returns 0 or TANDEM_ENOMEM. */
int cluster_pool_set(struct cluster_pool *p, int i, const struct worker_config *src);

/* The configuration the workers of pool r run with: the pool's settings,
 * then the cluster-wide ones (block_size, log_level, and the tokenizer for
 * the backend it is for); *set marks the settings `tandem up` passes as
 * flags (the others are the workers' defaults). Strings borrow from c. For
 * `tandem up`'s argv, and for running workers without one. */
void cluster_worker_config(const struct cluster *c, enum cluster_role r, struct worker_config *cfg,
                           uint64_t *set);

/* "prefill", "decode", "colocated". */
const char *cluster_role_name(enum cluster_role r);

/* Reads and validates a cluster file. On success *out is owned by the caller
 * (cluster_free). Errors: TANDEM_ECONFIG (message "<file>:<line>: <key>:
 * <problem>" in err), TANDEM_ENOENT / TANDEM_EIO (cannot read the file),
 * TANDEM_ETOOBIG (over CLUSTER_MAX_FILE), TANDEM_ENOMEM. */
int cluster_load(struct cluster **out, const char *path, char *err, size_t errlen);

/* Same from text[0..len); name stands for the file in messages and base_dir
 * (NULL: the current directory) is where relative paths resolve. */
int cluster_parse(struct cluster **out, const char *text, size_t len, const char *name,
                  const char *base_dir, char *err, size_t errlen);

/* The embedded default: router on 127.0.0.1:8000, one prefill and one decode
 * worker on the tiny model over ipc, no routing (the router's default:
 * deploy/routing/pd-prefix-precise.yaml, compiled into tandem-router). */
int cluster_default(struct cluster **out, char *err, size_t errlen);

/* The default's YAML text (static). */
const char *cluster_default_text(void);

void cluster_free(struct cluster *c);

/* The tcp announce port: ports.announce, else the router port + 1 (so
 * --port moves both); 0 when both are 0 (a free port is picked at start). */
int cluster_announce_port(const struct cluster *c);

/* Workers in all pools. */
int cluster_worker_count(const struct cluster *c);

/* 1 when the cluster runs its NNG links over tls+tcp:// (a `tls:` section). */
int cluster_tls(const struct cluster *c);

/* The scheme of the cluster's tcp addresses: "tls+tcp" or "tcp". */
const char *cluster_tcp_scheme(const struct cluster *c);

/* Writes c as a complete cluster file (every setting explicit, paths
 * absolute) that cluster_parse reads back to the same structure. Returns 0 or
 * TANDEM_EIO. */
int cluster_write(const struct cluster *c, FILE *f);

/* Writes the inline routing mapping as a standalone EndpointPickerConfig file
 * (what the router gets as --routing). Returns 0, TANDEM_EINVAL (no inline
 * routing) or TANDEM_EIO. */
int cluster_write_routing(const struct cluster *c, FILE *f);

#endif
