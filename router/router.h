/* tandem-router as a library: everything the process owns, opened and closed
 * as one (router/main.c parses the flags and runs the loop). The pieces:
 * the scheduling pipeline (pipeline.h), the registry of workers
 * (registry.h), the request lifecycle (dispatch.h), the HTTP routes
 * (server.h) and the metrics (rt_metrics.h). docs/architecture.md
 * ("## Router") describes the design.
 *
 * Threading: one libuv loop thread owns all of it. */
#ifndef TANDEM_ROUTER_H
#define TANDEM_ROUTER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "auth.h"
#include "dispatch.h"
#include "http.h"
#include "openai.h"
#include "pipeline.h"
#include "registry.h"
#include "rt_metrics.h"
#include "tokenizer.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

#define RT_DEFAULT_ANNOUNCE    "tcp://127.0.0.1:7000"
#define RT_DEFAULT_MODEL       "tiny"
#define RT_DEFAULT_MAX_CONTEXT 4096 /* before any worker says otherwise */
#define RT_DEFAULT_MAX_PENDING 1024
#define RT_DEFAULT_RETRIES     3
#define RT_DEFAULT_HB_TIMEOUT  1500   /* ms: 3 x the protocol's 500 ms heartbeat */
#define RT_DEFAULT_FORGET_MS   30000  /* announced worker unreachable this long: dropped */
#define RT_DEFAULT_DEADLINE_MS 600000 /* per request, the safety net */
#define RT_DEFAULT_DECISIONS   128    /* decision records kept for GET /v1/decisions */

/* Command-line options (router/main.c documents each flag). */
struct rt_opts {
    const char *host;      /* HTTP listen address */
    int port;              /* 0: ephemeral */
    const char *announce;  /* PULL0 listen URL for WorkerHello announcements; "" / "none": off */
    const char *routing;   /* EndpointPickerConfig file; NULL: the embedded default */
    const char *workers;   /* comma-separated control URLs, or NULL */
    const char *model;     /* served model name (block-hash root) */
    const char *tokenizer; /* llama2.c tokenizer.bin, or NULL: byte-level */
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
    int deadline_ms;        /* one generation, start to end */
    int forget_ms;
    int decisions;                   /* records kept */
    int seed;                        /* pipeline random stream; 0: from the clock */
    const char *cluster_secret_file; /* NULL: $TANDEM_CLUSTER_SECRET_FILE, else no secret */
};

void rt_opts_default(struct rt_opts *o);

/* Last decision records (one JSON line each, rt_decision_format), a ring. */
struct rt_declog_entry {
    uint64_t seq; /* decision seq, 0: empty */
    char *json;   /* owned */
    int actual;   /* cached tokens the worker reported, -1 until then */
};

struct rt_declog {
    struct rt_declog_entry *e; /* (cap) */
    int cap, head, n;
    char *buf; /* scratch for rt_decision_format */
    size_t buf_cap;
};

struct router {
    uv_loop_t *loop;
    struct rt_opts opts;
    struct rt_pipeline *pl;
    struct tokenizer *tok;
    struct oa_model model; /* model.id = opts.model; max_context refreshed per request */
    uint64_t root;         /* bh_root(model) */
    int block_size;        /* hashing block size (the pipeline's) */
    int uses_hashes;
    int preset_context; /* the model preset's max context (0: none) */
    struct rt_metrics m;
    struct rt_registry reg;
    struct auth_key secret;   /* the cluster secret (secret.set = 0: none) */
    struct rt_dispatch d;     /* the pure core; the two handles below drive it */
    uv_timer_t dispatch_tick; /* rt_dispatch_tick every RT_DISPATCH_TICK_MS */
    uv_idle_t dispatch_kick;  /* rt_dispatch_run_pending outside message callbacks */
    struct http_server http;
    int http_port;
    struct rt_declog declog;
    unsigned have;
    int closing, open_parts;
    void (*close_cb)(struct router *r);
};

/* Builds everything from o (strings must outlive r) and binds the HTTP and
 * announce listeners and dials --workers. Returns 0, or an error code with
 * a message naming the flag in err: TANDEM_ECONFIG / TANDEM_EINVAL (bad
 * routing file, tokenizer, URL or value: exit 2), TANDEM_EBUSY (address in
 * use) and others (exit 1). On failure call rt_close anyway (it closes
 * what was opened). */
int rt_open(struct router *r, uv_loop_t *loop, const struct rt_opts *o, char *err, size_t errlen);

/* Context limit used for requests now: --max-context, else the smallest one
 * the healthy decode workers announced, else the model preset's, else
 * RT_DEFAULT_MAX_CONTEXT. */
int rt_max_context(const struct router *r);

/* Handles POST /v1/completions (OA_KIND_COMPLETION) or /v1/chat/completions
 * (OA_KIND_CHAT) with the dispatcher: answers errors at once, or takes a
 * reference on req and answers when the generation ends. HTTP handler. */
void rt_handle_generate(struct router *r, struct http_req *req, enum oa_kind kind);

/* Keeps a decision record (the oldest is dropped when opts.decisions are
 * kept) and logs it at debug level. Loop thread. */
void rt_declog_add(struct router *r, const struct rt_decision *d);
/* Records the cached tokens reported for decision seq (if still kept). */
void rt_declog_actual(struct router *r, uint64_t seq, int actual);

/* Closes everything (live requests end, listeners close, links close); cb(r)
 * runs once every handle is closed. Safe on a partly opened router. */
void rt_close(struct router *r, void (*cb)(struct router *r));

#endif
