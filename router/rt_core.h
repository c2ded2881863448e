/* The router without its loop: the parts of tandem-router that need no
 * socket, no HTTP server and no libuv, opened and closed as one, so that the
 * live router (router.c: HTTP, registry, timers) and the offline simulator
 * (simulate/) run the same pieces built the same way:
 *
 *   metrics (rt_metrics.h), tokenizer (the workers' or byte-level), the
 *   scheduling pipeline from the routing file or the embedded default
 *   (pipeline.h), the served model, the decision log, and the dispatcher
 *   (dispatch.h) wired to them.
 *
 * The host supplies what depends on where the router runs (struct
 * rt_core_host): how a job or a cancel reaches a worker, the clock, the
 * deferred call, where answers go, and the context the workers announced.
 * Workers' own messages reach the pipeline through rt_feed.h.
 *
 * Threading: one thread (the host's); every host callback is called on it,
 * from inside the rt_core_ / rt_dispatch_ call that caused it. */
#ifndef TANDEM_RT_CORE_H
#define TANDEM_RT_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "ctl.h"
#include "dispatch.h"
#include "flags.h"
#include "openai.h"
#include "pipeline.h"
#include "rt_declog.h"
#include "rt_metrics.h"
#include "tokenizer.h"

#define RT_DEFAULT_ANNOUNCE          "tcp://127.0.0.1:7000"
#define RT_DEFAULT_MODEL             "tiny"
#define RT_DEFAULT_MAX_CONTEXT       4096 /* before any worker says otherwise */
#define RT_DEFAULT_MAX_PENDING       1024
#define RT_DEFAULT_RETRIES           3
#define RT_DEFAULT_HB_TIMEOUT        1500   /* ms: 3 x the protocol's 500 ms heartbeat */
#define RT_DEFAULT_FORGET_MS         30000  /* announced worker unreachable this long: dropped */
#define RT_DEFAULT_DEADLINE_MS       600000 /* per request, the safety net */
#define RT_DEFAULT_HOLD_MS           10000  /* no endpoint: wait this long for one */
#define RT_DEFAULT_SHUTDOWN_DRAIN_MS 2000   /* stop: requests in flight may finish this long */
#define RT_DEFAULT_DECISIONS         128    /* decision records kept for GET /v1/decisions */

/* Command-line options (router/main.c documents each flag). */
struct rt_opts {
    const char *host;         /* HTTP listen address */
    int port;                 /* 0: ephemeral */
    const char *announce;     /* PULL0 listen URL for WorkerHello announcements; "" / "none": off */
    const char *routing;      /* EndpointPickerConfig file; NULL: the embedded default */
    const char *routing_text; /* not a flag: the config as YAML text (named by routing, or
                                 "(routing)"); NULL: from routing */
    const char *workers;      /* comma-separated control URLs, or NULL */
    const char *model;        /* served model name (block-hash root) */
    const char *tokenizer;    /* llama2.c tokenizer.bin, or NULL: byte-level */
    int block_size;
    int max_context; /* 0: learned from the workers' hellos (RT_DEFAULT_MAX_CONTEXT before) */
    uint64_t max_body;
    int max_connections;
    int max_pending;
    int retries;
    int log_level;
    int heartbeat_timeout_ms;
    int request_timeout_ms; /* HTTP: first byte to last of a request */
    int idle_timeout_ms;    /* HTTP keep-alive */
    int shutdown_drain_ms;  /* stop: requests in flight may finish this long */
    int deadline_ms;        /* one generation, start to end */
    int hold_timeout_ms;    /* no healthy endpoint: wait this long for one (0: 503 at once) */
    int forget_ms;
    int decisions;                   /* records kept */
    int seed;                        /* pipeline random stream; 0: from the clock */
    const char *cluster_secret_file; /* NULL: $TANDEM_CLUSTER_SECRET_FILE, else no secret */
    const char *api_key;             /* NULL: none; points into argv (main.c wipes it once read) */
    const char *api_key_file;        /* NULL: none; rt_apikey.h: which key wins */
};

void rt_opts_default(struct rt_opts *o);

/* The TLS files of --tls-ca, --tls-cert, --tls-key (NULL: not given). */
struct rt_tls_files {
    const char *ca, *cert, *key;
};

/* Fills f (RT_OPTS_MAX_FLAGS entries) with tandem-router's flags, bound to
 * o and tls, for flags_parse; returns the count. One table for the router
 * process (router/main.c) and for anyone reading a router command line as
 * the router would (the offline simulator reads the one `tandem up` builds). */
#define RT_OPTS_MAX_FLAGS 32
size_t rt_opts_flags(struct rt_opts *o, struct rt_tls_files *tls, struct flag *f);

/* What the dispatcher needs from where the router runs (see struct
 * rt_dispatch_deps for each call's contract). Copied by rt_core_open. */
struct rt_core_host {
    const struct rt_sink_ops *sink;
    void *arg; /* passed to every call below */
    int (*send_job)(void *arg, int ep, uint64_t id, const struct ctl_job *job);
    int (*send_cancel)(void *arg, int ep, uint64_t id);
    double (*now)(void *arg);
    void (*kick)(void *arg);
    /* The smallest context the healthy decode workers announced; 0: none. */
    int (*learned_context)(void *arg);
    /* rt_dispatch_deps.seed: 0 (live: random wire and response ids, so a
     * restarted router never reuses one), or a seed (offline: the same ids,
     * hence the same sampling seeds, every run). */
    uint64_t dispatch_seed;
};

struct rt_core {
    struct rt_opts opts; /* strings borrowed: they must outlive the core */
    struct rt_core_host host;
    struct rt_pipeline *pl;
    struct tokenizer *tok;
    struct oa_model model; /* model.id = opts.model; max_context refreshed per request */
    uint64_t root;         /* bh_root(model) */
    int block_size;        /* hashing block size (the pipeline's) */
    int uses_hashes;
    int preset_context; /* the model preset's max context (0: none) */
    struct rt_metrics m;
    struct rt_declog declog; /* opts.decisions records, for GET /v1/decisions */
    struct rt_dispatch d;
    unsigned have; /* parts opened (rt_core_fini closes only those) */
};

/* Builds the parts from o. Returns 0, or an error with a message naming the
 * flag in err: TANDEM_ECONFIG / TANDEM_EINVAL (bad routing file, tokenizer,
 * model name, block size: exit 2), TANDEM_ENOMEM. On failure call
 * rt_core_fini anyway. */
int rt_core_open(struct rt_core *c, const struct rt_opts *o, const struct rt_core_host *h,
                 char *err, size_t errlen);

/* Ends every live request (rt_dispatch_close); the parts stay readable. */
void rt_core_stop(struct rt_core *c);

/* Frees every part opened (after rt_core_stop, or on a failed open). */
void rt_core_fini(struct rt_core *c);

/* Context limit used for requests now: --max-context, else the smallest one
 * the healthy decode workers announced, else the model preset's, else
 * RT_DEFAULT_MAX_CONTEXT. */
int rt_core_max_context(const struct rt_core *c);

#endif
