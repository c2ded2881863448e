/* Endpoint state as the router's scheduling pipeline sees it.
 *
 * An endpoint is one worker (prefill, decode, or colocated) known to the
 * router. The pipeline owns an array of endpoint slots (struct rt_endpoint),
 * sized when it is created; the router's registry adds and removes endpoints
 * and keeps their health and heartbeat load current through the rt_pipeline_
 * functions in pipeline.h. Plugins read this state; the pipeline alone writes
 * the router-side in-flight counters (at decision time and on release).
 *
 * A slot index is stable while the endpoint is registered. When an endpoint is
 * removed and its slot reused, the slot's generation changes, so anything
 * keyed by (index, generation) — a request's release ticket, a session's last
 * endpoint — can tell the new endpoint from the old one.
 *
 * Threading: the pipeline and its endpoints are used from one thread (the
 * router's loop thread). */
#ifndef TANDEM_RT_ENDPOINT_H
#define TANDEM_RT_ENDPOINT_H

#include <stdint.h>

#define RT_ID_MAX   64  /* worker id, bytes with the NUL */
#define RT_ADDR_MAX 128 /* NNG address, bytes with the NUL */

/* What a worker does. A colocated worker prefills and decodes in its own
 * batches; it is decode-capable (decode-filter keeps it, as llm-d keeps
 * "both"), but prefill-filter keeps only prefill workers (as llm-d). */
enum rt_role { RT_ROLE_PREFILL = 1, RT_ROLE_DECODE = 2, RT_ROLE_COLOCATED = 3 };

/* Load reported by the worker's heartbeat (proto Heartbeat). */
struct rt_load {
    uint32_t waiting;               /* sequences queued, not yet running */
    uint32_t running;               /* sequences in the running batch */
    uint64_t prefill_tokens_queued; /* prompt tokens not yet prefilled */
    uint32_t kv_blocks_used;        /* referenced by at least one sequence */
    uint32_t kv_blocks_total;
    uint32_t kv_blocks_cached_idle; /* cached, unreferenced, evictable */
    uint64_t timestamp_ms;          /* sender's unix ms */
    /* Counters since the worker started (0 from an older worker). */
    uint64_t prefix_cache_queries; /* prompt tokens looked up in its prefix cache */
    uint64_t prefix_cache_hits;    /* of those, found cached */
    uint64_t kv_bytes_sent;        /* KV payload bytes shipped (prefill) */
    uint64_t kv_bytes_received;    /* KV payload bytes installed (decode) */
};

/* What the registry knows when it adds an endpoint. */
struct rt_endpoint_info {
    const char *id; /* unique worker id (copied, < RT_ID_MAX bytes) */
    enum rt_role role;
    const char *control_addr; /* NNG control address (copied; may be NULL) */
    const char *data_addr;    /* NNG KV data address (copied; may be NULL) */
    int block_size;           /* tokens per KV block on the worker, >= 1 */
    uint32_t max_running;     /* max running sequences (capacity), 0 = unknown */
    uint32_t max_context;     /* tokens, prompt + generated, 0 = unknown */
};

struct rt_endpoint {
    /* Identity, set by rt_pipeline_endpoint_add. */
    char id[RT_ID_MAX];
    enum rt_role role;
    char control_addr[RT_ADDR_MAX];
    char data_addr[RT_ADDR_MAX];
    int block_size;
    uint32_t max_running;
    uint32_t max_context;
    uint32_t gen; /* changes each time the slot is (re)used */
    int in_use;   /* slot holds a registered endpoint */
    int healthy;  /* only healthy endpoints are candidates */

    /* Last heartbeat (rt_pipeline_endpoint_set_load). */
    struct rt_load load;

    /* Router-side accounting, updated by the pipeline when it decides and
     * when the router releases a request (rt_pipeline_release), so a burst
     * of decisions between two heartbeats sees its own earlier picks. */
    uint32_t inflight_requests;       /* requests holding this endpoint as P or D */
    uint64_t inflight_tokens;         /* D: prompt + max_tokens; P: prompt tokens */
    uint64_t inflight_prefill_tokens; /* uncached prompt tokens it must still prefill */
    uint64_t picks; /* decisions that picked it (as D or remote P) since it was added */
};

static inline int rt_role_can_decode(enum rt_role r)
{
    return r == RT_ROLE_DECODE || r == RT_ROLE_COLOCATED;
}

static inline int rt_role_can_prefill_remote(enum rt_role r)
{
    return r == RT_ROLE_PREFILL;
}

/* "prefill", "decode", "colocated", or "?" for an unknown value. */
const char *rt_role_name(enum rt_role r);

/* Parses the names above. Returns 0, or TANDEM_EINVAL. */
int rt_role_parse(const char *s, enum rt_role *out);

/* KV cache usage in [0, 1]: kv_blocks_used / kv_blocks_total, 0 when the
 * total is unknown (no heartbeat yet). */
double rt_endpoint_kv_usage(const struct rt_endpoint *ep);

#endif
