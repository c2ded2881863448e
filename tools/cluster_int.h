/* Internal to the cluster module (tools/cluster*.c): what its files share.
 * Nothing outside them includes this header; the module's contract is
 * cluster.h.
 *
 *   cluster.c          the structure, its pool settings, accessors, free
 *   cluster_load.c     the YAML loader: fields, sections, cluster_parse
 *   cluster_routing.c  the `routing:` key (a file, or an inline mapping)
 *   cluster_check.c    defaults and cross-key checks once every key is read
 *   cluster_write.c    cluster_write, cluster_write_routing
 *
 * Ownership: cluster_parse owns the struct loader (on its stack), its libyaml
 * document and its lines; ld->c is the cluster being loaded, owned by the
 * loader until cluster_parse hands it to the caller, and freed by it on
 * error; whatever a loader function stores in ld->c (strings, args,
 * addresses) is freed with the cluster (cluster_free), also when that
 * function then fails. ld->err is the caller's buffer. Threading: pure
 * functions, any thread; a loader is used by one thread. */
#ifndef TANDEM_CLUSTER_INT_H
#define TANDEM_CLUSTER_INT_H

#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "cluster.h"

#define PATH_KEY_MAX 160 /* longest dotted key path, "pools.decode.kv_blocks" */
#define SUN_PATH_MAX 107 /* bytes of an ipc socket path */

/* "prefill", "decode", "colocated", NULL: indexed by enum cluster_role. */
extern const char *const cluster_role_names[CLUSTER_N_ROLES + 1];
/* "ipc", "tcp", NULL: indexed by enum cluster_transport. */
extern const char *const cluster_transport_names[];

static inline uint64_t cluster_bit(int i)
{
    return (uint64_t)1 << i;
}

/* ------------------------------------------------------------------ */
/* cluster.c                                                           */
/* ------------------------------------------------------------------ */

/* A cluster with nothing given: every number "not set" (-1), every pool at
 * the workers' defaults. NULL when out of memory; cluster_free frees it. */
struct cluster *cluster_new(void);

/* Stores the string v (taken: the pool frees it) as setting i. */
void cluster_pool_take_str(struct cluster_pool *p, int i, char *v);

/* ------------------------------------------------------------------ */
/* cluster_load.c: loader state and messages                           */
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

/* Writes "<source>:<line>: <message>" to ld->err; returns TANDEM_ECONFIG. */
__attribute__((format(printf, 3, 4))) int cluster_fail(struct loader *ld, int line, const char *fmt,
                                                       ...);

/* Line of the key at path, or fallback when the file does not have it. */
int cluster_line_at(const struct loader *ld, const char *path, int fallback);

/* out = "prefix.key" (or "key"), truncated to PATH_KEY_MAX. */
void cluster_key_path(char *out, const char *prefix, const char *key);

/* *dst = a copy of s (the old *dst is freed). 0 or TANDEM_ENOMEM. */
int cluster_set_str(char **dst, const char *s);

/* *out = s resolved against the cluster's base_dir, absolute (the old *out
 * is freed). 0, TANDEM_ETOOBIG (path too long) or TANDEM_ENOMEM. */
int cluster_resolve_path(struct loader *ld, const char *s, char **out);

/* ------------------------------------------------------------------ */
/* cluster_routing.c                                                   */
/* ------------------------------------------------------------------ */

/* The `routing:` key (k, value v) of the cluster base: sets routing_path or
 * routing_text, routing_flow and routing_line, checks the configuration and
 * notes ld->routing_bs. 0 or a negative TANDEM_ error (message in ld->err). */
int cluster_load_routing(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                         void *base);

/* ------------------------------------------------------------------ */
/* cluster_check.c                                                     */
/* ------------------------------------------------------------------ */

/* The file at file must hold a PEM block of the kind the key asks for: a
 * certificate (want_key 0) or a private key (1). 0 or a negative error. */
int cluster_check_pem(struct loader *ld, const char *key, const char *file, int want_key);

/* Fills in the defaults of what the file left out and checks what it may not
 * say across keys, once every key is read. 0 or a negative error. */
int cluster_finish(struct loader *ld);

#endif
