/* The router's registry: which workers exist, how to reach them, and whether
 * they are healthy (docs/architecture.md "## Router", docs/protocol.md).
 *
 * Workers are found two ways: static control addresses (--workers) and
 * announcements, a WorkerHello pushed every second to the router's announce
 * socket (PULL0, --announce) by workers started with --router. Either way
 * the registry dials the worker's control address with a PAIR0 link of its
 * own, redialled while the worker is away: on ipc:// and tcp://IP the loop
 * reads and writes it itself (common/uvsp), otherwise (tls+tcp://, host
 * names, inproc://) it is an NNG socket watched through common/uvnng.
 * Messages and pipe events reach the loop either way, without polling.
 *
 * On every new control pipe the worker sends Hello, a heartbeat and a
 * snapshot of its prefix cache. The registry then
 *   - registers the worker as a pipeline endpoint (rt_pipeline_endpoint_add,
 *     keyed by worker id), healthy; a new incarnation (restart) re-registers
 *     it, so its prefix-index entries and sessions start empty;
 *   - keeps its load from heartbeats and feeds its KV events to the precise
 *     prefix index; a gap in KvEvents.seq resets the endpoint's cache;
 *   - marks it unhealthy after heartbeat_timeout_ms without a heartbeat, and
 *     at once when the pipe goes away (the dispatcher's on_down callback
 *     fails or recovers its requests); it rejoins by itself on the next
 *     heartbeat or pipe;
 *   - forgets an announced worker whose link stayed down for forget_ms
 *     (static ones are kept).
 * A worker serving another model or block size than the router's is refused
 * (logged, never registered); every refusal keeps its reason (struct
 * rt_refusal) for GET /v1/cluster. Request-scoped messages (tokens, finish, busy,
 * errors) go to the dispatcher's on_message callback.
 *
 * Threading: the router's loop thread only. */
#ifndef TANDEM_RT_REGISTRY_H
#define TANDEM_RT_REGISTRY_H

#include <stdint.h>
#include <uv.h>

#include "auth.h"
#include "pipeline.h"
#include "rt_feed.h"
#include "tandem.pb-c.h"
#include "uvnng.h"
#include "uvsp.h"
#include "wire.h"

struct rt_registry;
struct metrics_family;

/* Why the router refused a worker, kept for GET /v1/cluster ("refusals"): the
 * registry is the one place that decides, the API and `tandem up` read it.
 * why[0] == 0: no refusal. Strings come from the worker (unauthenticated
 * when the refusal is for the cluster secret) and are bounded. */
#define RT_REFUSAL_WHY_BYTES 384
#define RT_REFUSED_ANNOUNCES 8 /* announcements refused: most recent kept */
struct rt_refusal {
    char worker_id[WIRE_MAX_NAME_BYTES + 1];    /* "" when unknown (no Hello decoded) */
    char control_addr[WIRE_MAX_ADDR_BYTES + 1]; /* "" when unknown */
    char why[RT_REFUSAL_WHY_BYTES];
    uint64_t count;   /* refusals with this reason in a row */
    uint64_t last_ms; /* uv_now of the latest */
};

/* One control link: a PAIR0 link dialed to one worker control address. */
struct rt_link {
    struct rt_registry *reg;
    struct rt_link *next;
    char addr[WIRE_MAX_ADDR_BYTES + 1]; /* control address dialed */
    int is_static;                      /* from --workers: never forgotten */
    int native; /* 1: the link runs on sp (ipc://, tcp://IP), else on u (NNG) */
    struct uvsp sp;
    struct uvnng u;
    int pipes;              /* live pipes (0 or 1 for PAIR0) */
    int hello;              /* Hello received on the current pipe */
    int hello_pipe;         /* id of the NNG pipe that Hello came on */
    int refused;            /* model or block size mismatch: ignored */
    int ep;                 /* pipeline endpoint slot, -1 until Hello */
    uint64_t incarnation;   /* from the last Hello */
    uint64_t last_hb_ms;    /* uv_now of the last Hello or Heartbeat */
    uint64_t down_since_ms; /* uv_now when the last pipe went away (or the dial) */
    struct rt_feed_seq kv;  /* KvEvents sequence on this pipe (gaps counted there) */
    char metrics_addr[WIRE_MAX_ADDR_BYTES + 1];
    uint64_t n_hello, n_heartbeat, n_kv_events, n_pipes_lost;
    /* The latest refusal on this link (cleared by a good Hello). */
    struct rt_refusal refusal;
    /* Cluster secret: our challenge on pipe nonce_pipe (0: none sent). */
    uint8_t nonce[AUTH_NONCE_BYTES];
    int nonce_pipe;
    uint64_t n_auth_failures;
    int closing;
    /* The Hello said control_batches: this turn's jobs and cancels for it
     * wait in out (out_job[i]: the request id of a job, 0 for anything else)
     * and leave as BATCH messages before the loop blocks. */
    int takes_batches;
    nng_msg **out;
    uint64_t *out_job;
    size_t n_out, cap_out;
    struct rt_link *out_next; /* reg->out_links, while out_listed */
    int out_listed;
};

struct rt_registry_cbs {
    /* A request-scoped envelope (request_id != 0) from endpoint ep; env is
     * borrowed for the call. */
    void (*on_message)(void *arg, int ep, const Tandem__Envelope *env);
    /* ep stopped being usable (link lost, heartbeats missed, removed): every
     * request on it must be failed over. Called before the slot is reused. */
    void (*on_down)(void *arg, int ep);
    /* ep became healthy (registered, or back). */
    void (*on_up)(void *arg, int ep);
    /* Optional: job id, queued for ep by rt_registry_send_job and reported
     * sent, never left (rc: TANDEM_ETIMEOUT, the link's send buffer was full;
     * TANDEM_ENOENT, the link went away first). Called before the loop blocks,
     * outside any other callback of the registry. */
    void (*on_unsent)(void *arg, int ep, uint64_t id, int rc);
};

struct rt_registry_opts {
    const char *model;             /* served model: workers must announce it */
    int block_size;                /* workers must use it */
    int vocab_size;                /* the router's tokenizer's: workers must have it (0: any) */
    uint64_t heartbeat_timeout_ms; /* unhealthy after this long without a heartbeat */
    uint64_t forget_ms;            /* announced link down this long: forgotten */
    /* Cluster secret (not owned), or NULL: workers must answer the router's
     * nonce with auth_hello_proof before they are registered, and tag their
     * announcements (auth_announce_tag); the router answers their nonce. */
    const struct auth_key *secret;
    struct metrics_family *auth_failures; /* {kind}: refusals counted, or NULL */
    /* Counted as they leave for workers, or NULL: control envelopes, and the
     * control-link messages they left in. */
    struct metrics_series *envelopes_sent, *messages_sent;
};

struct rt_registry {
    uv_loop_t *loop;
    struct rt_pipeline *pl;
    struct rt_registry_opts opts;
    struct rt_registry_cbs cbs;
    void *cb_arg;
    struct rt_link *links;
    int n_links;
    struct rt_link **by_ep; /* (max_endpoints) link of each registered endpoint */
    int max_ep;
    struct uvnng announce;
    int announce_open;
    char announce_url[WIRE_MAX_ADDR_BYTES + 1];
    uv_timer_t timer;          /* heartbeat watchdog, forgetting */
    uv_prepare_t prepare;      /* sends out_links' batches before the loop blocks */
    struct rt_link *out_links; /* links with messages in out */
    int closing, open_handles;
    void (*close_cb)(struct rt_registry *reg);
    uint64_t n_announces, n_refused, n_rejected_msgs, n_auth_failures, n_announce_refused;
    /* Announcements refused (cluster secret, undecodable): never dialed. */
    struct rt_refusal refused_announces[RT_REFUSED_ANNOUNCES];
};

/* Initialises reg on loop for pipeline pl (not owned). Returns 0,
 * TANDEM_ENOMEM or TANDEM_EUV. After success close with rt_registry_close. */
int rt_registry_init(struct rt_registry *reg, uv_loop_t *loop, struct rt_pipeline *pl,
                     const struct rt_registry_opts *opts, const struct rt_registry_cbs *cbs,
                     void *arg);

/* Listens for announcements on url (PULL0; tcp://host:0 picks a port). The
 * bound URL is then in reg->announce_url. Returns 0, TANDEM_EINVAL (bad
 * URL), TANDEM_EBUSY (address in use) or another wire_nng_err code. */
int rt_registry_listen(struct rt_registry *reg, const char *url);

/* Dials a worker's control address (static: never forgotten). A second call
 * with the same address is a no-op. Returns 0, TANDEM_EINVAL (bad URL or
 * too long), TANDEM_ENOMEM or a wire_nng_err code. */
int rt_registry_dial(struct rt_registry *reg, const char *addr, int is_static);

/* Most bytes of envelopes in one BATCH to a worker; a longer one leaves alone. */
#define RT_OUT_BATCH_BYTES (256u << 10)

/* Sends msg (one packed envelope) on ep's control link without blocking;
 * always consumes msg. To a worker that takes batches, the envelopes of one
 * loop turn leave together, in order, as BATCH messages when the loop is
 * about to block (each message costs the worker a trip through NNG's
 * threads, and both processes a write and a read); 0 then means queued.
 * Returns 0, TANDEM_ENOENT (no such endpoint or link down), TANDEM_ETIMEOUT
 * (the link's send buffer is full) or another code. A queued message that
 * cannot leave is dropped (a Cancel lost, as when its send fails now). */
int rt_registry_send(struct rt_registry *reg, int ep, nng_msg *msg);

/* rt_registry_send for the DecodeJob of request id: if it was queued and
 * then could not leave, cbs.on_unsent(ep, id, rc) says so. */
int rt_registry_send_job(struct rt_registry *reg, int ep, uint64_t id, nng_msg *msg);

/* The link of registered endpoint ep, or NULL. */
const struct rt_link *rt_registry_link(const struct rt_registry *reg, int ep);

/* Smallest max_context announced by a healthy decode-capable endpoint, or 0
 * when none is known. */
int rt_registry_max_context(const struct rt_registry *reg);

/* Healthy endpoints, and registered ones. */
void rt_registry_counts(const struct rt_registry *reg, int *healthy, int *registered);

/* Closes every link and the announce socket; cb(reg) runs once every handle
 * is closed. The on_down callback is not called. */
void rt_registry_close(struct rt_registry *reg, void (*cb)(struct rt_registry *reg));

#endif
