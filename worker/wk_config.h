/* A worker's settings and engine construction (tandem_worker).
 *
 * What: struct worker_config is everything tandem-prefill and tandem-decode
 * take on their command line. Each field is described once, in the table
 * wk_settings (wk_config.c): flag name, cluster-file key, type, default,
 * range, allowed values and help. That table yields the flags and --help of
 * both binaries (wk_config_parse), the keys of a cluster file's pools and
 * their checks (tools/cluster.c), the argv `tandem up` builds
 * (tools/up.c) and an experiment's cluster_overrides (tools/experiment/).
 * Adding a worker setting is one line of wk_settings plus its field here and
 * its use. The engine (backend, KV pool, scheduler) is then built from the
 * config with the defaults documented in docs/architecture.md ("## Workers").
 *
 * Ownership: the strings of a config parsed from argv point into argv; a
 * config filled by another owner (a cluster file's pool) says who owns its
 * strings there. wk_engine_create's results belong to the worker and are
 * freed by wk_engine_destroy.
 * Threads: wk_config_* are pure (any thread); wk_engine_* run on the core's
 * thread (wk_core.h).
 * Errors: TANDEM_EINVAL / TANDEM_ECONFIG with a message naming the flag in
 * err, or the engine's error. */
#ifndef TANDEM_WK_CONFIG_H
#define TANDEM_WK_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "settings.h"

struct wk_core;

struct worker_config {
    const char *id;          /* NULL: "<role>-<pid>" */
    const char *control_url; /* PAIR0 listener for the router */
    const char *kv_url;      /* PULL0 listener for the data link */
    int metrics_port;        /* 0: ephemeral */
    const char *router;      /* announce address (PULL0 on the router), or NULL */
    int backend;             /* index into backend_names (engine/backend.h) */
    const char *model;       /* NULL: "tiny" / "llama-3-8b" */
    const char *checkpoint;  /* tiny: llama2.c checkpoint */
    const char *tokenizer;   /* tiny: llama2.c tokenizer.bin, checked against the model */
    const char *gpu;
    int tp;
    const char *link;
    const char *payload; /* "auto", "full", "1/N", "none" */
    double time_scale;
    const char *mfu;              /* sim: "auto" or a number in (0, 1] */
    const char *mbu;              /* sim: "auto" or a number in (0, 1] */
    const char *step_overhead_ms; /* sim: "auto" or a number in [0, 1e6] */
    int kv_blocks;                /* 0: from kv_memory or the default */
    uint64_t kv_memory;           /* bytes; 0: unset */
    int block_size;
    int kv_dtype; /* 0 auto, then f32, f16, bf16, fp8 */
    int max_running;
    int token_budget;
    int max_prefill_chunk;
    int scheduler; /* enum sched_policy: index into sched_policy_names */
    int max_waiting;
    int stream_interval; /* decode: tokens sent every N steps (the first at once) */
    int heartbeat_ms;
    int transfer_timeout_ms;
    int seed;      /* seeds requests that come without one */
    int log_level; /* enum log_level */
    int colocated;
    const char *kv_dump; /* debug/test: append one line per KV block shipped or installed */

    /* Across hosts (docs/multi-host.md). */
    const char *metrics_host; /* /metrics listen address */
    const char *advertise;    /* host announced in place of the listen host, or NULL */
    const char *tls_ca;       /* PEM files for tls+tcp:// (common/tls.h), or NULL */
    const char *tls_cert;
    const char *tls_key;
    const char *cluster_secret_file; /* NULL: $TANDEM_CLUSTER_SECRET_FILE, else none */
};

/* The worker's settings, in --help order (wk_n_settings entries). A pool of
 * a cluster file marks the ones it gives with bit i of a uint64_t. */
extern const struct setting wk_settings[];
extern const size_t wk_n_settings;

/* The index of the setting with this flag name ("kv-blocks"); -1 when none. */
int wk_setting(const char *name);

/* Checks a --payload value: "auto", "full", "none" or "1/N" (1 <= N <=
 * 2^20). Returns 0 (and *div: 0 auto, 1 full, -1 none, N), or TANDEM_EINVAL.
 * div may be NULL. */
int wk_payload_parse(const char *s, int *div);

/* Fills cfg with the defaults shown by --help. */
void wk_config_defaults(struct worker_config *cfg);

/* Parses argv[1..argc) into cfg (defaults first). has_colocated adds the
 * --colocated flag. Returns FLAGS_OK, FLAGS_HELP (usage printed to help_out),
 * FLAGS_VERSION, or TANDEM_EINVAL with a message naming the flag in err. */
int wk_config_parse(struct worker_config *cfg, int argc, char **argv, const char *binary,
                    int has_colocated, FILE *help_out, char *err, size_t errlen);

/* Builds c->be, c->tok, c->pool and c->sched (callbacks from c->role, arg c)
 * from c->cfg, and fills root, block_size, dtype, block_bytes, max_context
 * (wk_core_init calls it).
 * Returns 0; TANDEM_EINVAL / TANDEM_ECONFIG for a bad combination of flags
 * (message in err, naming the flag); or the engine's error (message in err).
 * On failure nothing is left allocated. */
int wk_engine_create(struct wk_core *c, char *err, size_t errlen);

/* Frees what wk_engine_create built (sched, pool, tokenizer, backend). */
void wk_engine_destroy(struct wk_core *c);

#endif
