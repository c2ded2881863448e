/* The worker's engine half (library tandem_wk_core): everything a prefill or
 * decode worker decides, with no socket, event loop or clock of its own. The
 * live worker (worker.h, struct worker) and the offline simulator host a
 * wk_core each and carry its messages; the roles (prefill_worker/,
 * decode_worker/) plug into it.
 *
 * What it owns: the parsed settings, the worker's id and its own data
 * address, the engine (backend, KV pool, scheduler, tokenizer; wk_config.c
 * builds them), the metrics registry and struct worker_metrics, the KV-event
 * buffer with the mirror of cached block hashes (for the snapshot a new
 * router gets) and the role with its state.
 *
 * What the host gives: struct wk_host_ops, a table of callbacks for every
 * effect outside the engine: messages to the router (control) and to other
 * workers (data links, struct wk_link), the clocks, and "step soon".
 *
 * Threads: one, the host's. Every wk_core_* function, every host callback
 * and every role callback runs on it; nothing here locks.
 * Ownership: struct wk_core is the host's memory (embed it); what
 * wk_core_init allocates (engine, registry, event buffer, --kv-dump file,
 * role state) is freed by wk_core_fini. Links belong to the host.
 * Never blocks, never sleeps: a step's cost is the backend's. The sim
 * backend sleeps through its modelled step only when time_scale > 0; the
 * live worker (worker.h, "Timed steps") and the simulator build it with
 * time_scale 0 and time its steps themselves.
 *
 * What the host must call, and when:
 *   wk_core_init once; wk_core_set_kv_addr once its data address is known;
 *   wk_core_set_router whenever its router link changes (none, attached,
 *   ready for events); wk_core_on_control / wk_core_on_data for each
 *   validated inbound message; wk_core_on_link when a link it handed out
 *   goes up or down; wk_core_on_control_down when the router goes away;
 *   wk_core_step while wk_core_busy (after kick, until a step returns 0);
 *   wk_core_flush_events after each turn of its loop (or at least before the
 *   next heartbeat); wk_core_tick and wk_core_heartbeat every heartbeat
 *   period; wk_core_snapshot when a router joins; wk_core_stop at shutdown,
 *   wk_core_fini last.
 * Errors: int functions return 0 or a negative TANDEM_E* (tandem_err.h). */
#ifndef TANDEM_WK_CORE_H
#define TANDEM_WK_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "kv_cache.h"
#include "metrics.h"
#include "scheduler.h"
#include "tandem.pb-c.h"
#include "tokenizer.h"
#include "u64_map.h"
#include "wire.h"
#include "wk_config.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

/* Another worker's data address as the roles see it. The host allocates it
 * (link_get), keeps up / ever_up current and owns it; the core writes
 * last_rx_s. A link a role holds a reference to (link_ref) stays valid until
 * the matching link_unref. */
struct wk_link {
    const char *addr; /* as given to link_get */
    int up;           /* a connection is up now */
    int ever_up;      /* has been up at least once */
    double last_rx_s; /* host-clock seconds of the last message about one of its requests */
};

/* The host's side. host is the pointer given to wk_core_init. Envelopes and
 * payloads are borrowed for the call (the host copies or packs them). */
struct wk_host_ops {
    /* To the router on the control link. Returns 0, TANDEM_ECLOSED when no
     * router is attached, or the host's send error (the host counts drops in
     * worker_metrics.ctl_dropped). */
    int (*send_control)(void *host, const Tandem__Envelope *env);
    /* The link to a data address, created (and dialed) the first time.
     * Returns 0, TANDEM_EINVAL (bad address), TANDEM_ETOOBIG (too many
     * links) or a transport error. */
    int (*link_get)(void *host, const char *addr, struct wk_link **out);
    void (*link_ref)(void *host, struct wk_link *l);
    void (*link_unref)(void *host, struct wk_link *l);
    /* Sends env (+ payload for KV_FRAME) to l, in order with everything sent
     * to l before. model_bytes: the modelled GPU's KV bytes this frame stands
     * for (0 for non-KV messages). When the role has link_model set, the host
     * applies the KV link model: it holds what the role sends until the end
     * of the step and paces KV frames by the backend's transfer_seconds x
     * time_scale per destination. Returns 0 or a send error (nothing sent). */
    int (*link_send)(void *host, struct wk_link *l, const Tandem__Envelope *env,
                     const void *payload, size_t len, uint64_t model_bytes);
    /* Drops what is queued for l and not yet sent (the destination went
     * away). May be NULL. */
    void (*link_drop)(void *host, struct wk_link *l);
    double (*now)(void *host);       /* monotonic seconds (modelled seconds offline) */
    uint64_t (*unix_ms)(void *host); /* wall clock, for heartbeat timestamps */
    void (*kick)(void *host);        /* the scheduler has work that can progress: step soon */
};

struct wk_core;

/* A role: the callbacks that make a worker a prefill or a decode worker.
 * Every callback runs on the host's thread; all are required unless noted. */
struct worker_role {
    const char *name;                /* "prefill", "decode", "colocated" */
    Tandem__WorkerHello__Role hello; /* role announced in WorkerHello */
    /* 1: the host's KV link model applies to this role's data-link sends
     * (wk_host_ops.link_send). */
    int link_model;
    /* Allocates the role's state (c->role_state) once the engine exists. */
    int (*init)(struct wk_core *c);
    /* Frees it, after stop and after every request is gone. */
    void (*fini)(struct wk_core *c);
    /* A validated control envelope from the router (DECODE_JOB or CANCEL);
     * borrowed for the call. */
    void (*on_control)(struct wk_core *c, const Tandem__Envelope *env);
    /* A validated data-link frame; borrowed (copy the payload during the call). */
    void (*on_data)(struct wk_core *c, const struct wire_frame *f);
    /* The router went away. */
    void (*on_control_down)(struct wk_core *c);
    /* A link's connection came up (up = 1) or went away (up = 0). */
    void (*on_link)(struct wk_core *c, struct wk_link *l, int up);
    /* Every heartbeat period: timeouts. now is the host's now(). */
    void (*on_tick)(struct wk_core *c, double now);
    /* After every scheduler step (flush per-request token chunks). */
    void (*after_step)(struct wk_core *c);
    /* Shutdown: end every request (blocks released, peers told). */
    void (*stop)(struct wk_core *c);
    /* Scheduler callbacks; the core sets .arg to itself, any may be NULL. */
    struct sched_callbacks sched;
};

/* Metric series the core, the roles and the host update (all owned by c->reg). */
struct worker_metrics {
    struct metrics_series *running, *waiting, *kv_usage;
    struct metrics_series *prefix_queries, *prefix_hits, *preemptions;
    struct metrics_series *prompt_tokens, *generation_tokens;
    struct metrics_series *ttft, *itl, *e2e;
    struct metrics_family *success; /* {finished_reason, model_name} */
    struct metrics_series *kv_bytes_sent, *kv_bytes_received;
    struct metrics_series *kv_frames_sent, *kv_frames_installed;
    struct metrics_series *kv_transfer;
    struct metrics_family *frames_rejected;   /* {reason} */
    struct metrics_family *messages_rejected; /* {link, reason} */
    struct metrics_series *kv_free, *kv_used, *kv_cached_idle, *kv_total;
    struct metrics_series *ctl_dropped, *http_errors, *peers; /* the host's */
    struct metrics_series *ctl_envelopes, *ctl_messages;      /* the host's */
    /* The live host's step timing (worker.c): modelled x time_scale, wall,
     * overrun (wall - modelled x time_scale) of steps whose end it times, and
     * the gap from a step's end (or new work) to the next step's start. */
    struct metrics_series *step_modelled, *step_wall, *step_overrun, *step_idle_gap;
    /* Last values added to counters mirrored from sched/pool stats. */
    uint64_t last_queries, last_hits, last_preempt, last_prompt, last_gen;
};

struct wk_core_event {
    uint64_t hash;
    uint8_t kind; /* enum kv_event */
};

/* The router link as the core needs to know it (wk_core_set_router). */
enum wk_router {
    WK_ROUTER_NONE = 0, /* no router: KV events are not buffered */
    WK_ROUTER_ATTACHED, /* attached, not yet told about us: events buffer, not sent */
    WK_ROUTER_READY,    /* told about us (Hello sent): events are sent */
};

struct wk_core {
    const struct wk_host_ops *ops;
    void *host;
    const struct worker_role *role;
    void *role_state;
    struct worker_config cfg;
    char id[WIRE_MAX_NAME_BYTES + 1];
    char kv_addr[WIRE_MAX_ADDR_BYTES + 1]; /* own data address ("" until set) */

    /* Engine (wk_engine_create). */
    struct backend *be;
    struct kv_pool *pool;
    struct sched *sched;
    struct tokenizer *tok; /* NULL unless --tokenizer */
    uint64_t root;         /* bh_root(model name) */
    int block_size;
    enum kv_dtype dtype;
    size_t block_bytes; /* kv_block_bytes(pool) */
    int max_context;    /* sched_max_context */
    int n_outside;      /* requests the role holds outside the scheduler (waiting) */
    int32_t *kv_refs;   /* (pool blocks) TANDEM_KV_CHECK builds: references counted
                           after each step; NULL otherwise */

    struct metrics_registry *reg;
    struct worker_metrics m;

    /* KV events since the last flush, and the set of cached hashes (for the
     * snapshot sent to a newly connected router). */
    enum wk_router router;
    struct wk_core_event *ev;
    size_t n_ev, cap_ev;
    uint64_t ev_seq;
    struct u64_map cached;

    /* Rate limit of rejection warnings. */
    double warn_window_s;
    int warn_count;

    FILE *kv_dump;
};

/* ---- For the host ------------------------------------------------------- */

/* Copies cfg, builds the engine (wk_engine_create), opens --kv-dump,
 * registers the metrics and calls role->init. kv_addr may be NULL (set it
 * with wk_core_set_kv_addr once known); id is copied. c is zeroed first.
 * Returns 0; TANDEM_EINVAL / TANDEM_ECONFIG for bad settings (message in
 * err, naming the flag, without the binary's name); another error
 * otherwise (message in err). On failure nothing is left allocated. */
int wk_core_init(struct wk_core *c, const struct worker_config *cfg, const struct worker_role *role,
                 const struct wk_host_ops *ops, void *host, const char *id, const char *kv_addr,
                 char *err, size_t errlen);
/* role->fini, then frees everything wk_core_init built. c may be zeroed. */
void wk_core_fini(struct wk_core *c);
void wk_core_set_kv_addr(struct wk_core *c, const char *kv_addr);

/* The router link changed. To WK_ROUTER_NONE: buffered events are dropped
 * (a router that comes later gets a snapshot). Call wk_core_on_control_down
 * too when a router went away and requests should end. */
void wk_core_set_router(struct wk_core *c, enum wk_router r);

/* Inbound messages, validated by the host (versions, secret, kinds), and
 * link events. Each ends with ops->kick (there may be work to step), but
 * for a link coming up. */
void wk_core_on_control(struct wk_core *c, const Tandem__Envelope *env);
void wk_core_on_data(struct wk_core *c, const struct wire_frame *f);
void wk_core_on_link(struct wk_core *c, struct wk_link *l, int up);
void wk_core_on_control_down(struct wk_core *c);

/* One scheduler step and the role's after_step (and, in TANDEM_KV_CHECK
 * builds, the KV cache check, which aborts on a broken invariant). Returns
 * sched_step's count: 0 means nothing can move until new work, a cancel or
 * freed blocks (the core kicks then). */
int wk_core_step(struct wk_core *c);
int wk_core_busy(const struct wk_core *c);
/* Every heartbeat period: the role's timeouts (transfer timeout); kicks. */
void wk_core_tick(struct wk_core *c);
/* Builds a Heartbeat and sends it to the router. */
void wk_core_heartbeat(struct wk_core *c);
/* Sends the buffered KV events (KvEvents) when the router is READY; the
 * buffer is emptied either way. */
void wk_core_flush_events(struct wk_core *c);
/* A router joined: ALL_CLEARED then every cached hash, superseding what was
 * buffered. */
void wk_core_snapshot(struct wk_core *c);
/* Fills h (initialised here) with what the core knows; the host sets
 * control_address, metrics_address, incarnation and auth_proof. The strings
 * point into c. */
void wk_core_hello(const struct wk_core *c, Tandem__WorkerHello *h);
/* Shutdown: the role ends every request. */
void wk_core_stop(struct wk_core *c);
/* 1 when a rejection may be logged now (at most 20 a second). */
int wk_core_warn_allowed(struct wk_core *c);

/* ---- For the roles ------------------------------------------------------ */

/* Sends env to the router (see wk_host_ops.send_control). */
int wk_core_send_control(struct wk_core *c, const Tandem__Envelope *env);
/* Error(code, message) for request id (0: about the worker). */
int wk_core_send_error(struct wk_core *c, uint64_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Finish(reason, usage) for request id, with last as its last_tokens (NULL:
 * none; borrowed). */
int wk_core_send_finish(struct wk_core *c, uint64_t id, Tandem__Finish__Reason reason,
                        uint32_t prompt_tokens, uint32_t completion_tokens, uint32_t cached_tokens,
                        const Tandem__TokenChunk *last);
/* Busy(reason, detail) for request id. */
int wk_core_send_busy(struct wk_core *c, uint64_t id, Tandem__Busy__Reason reason,
                      const char *detail);

/* The host's links (wk_host_ops). */
int wk_core_link_get(struct wk_core *c, const char *addr, struct wk_link **out);
void wk_core_link_ref(struct wk_core *c, struct wk_link *l);
void wk_core_link_unref(struct wk_core *c, struct wk_link *l);
int wk_core_link_send(struct wk_core *c, struct wk_link *l, const Tandem__Envelope *env,
                      const void *payload, size_t len, uint64_t model_bytes);
void wk_core_link_drop(struct wk_core *c, struct wk_link *l);
/* Error(code, message) about request id (0: about the worker) to l. */
int wk_core_link_send_error(struct wk_core *c, struct wk_link *l, uint64_t id, int code,
                            const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The host's clock, in seconds (latency histograms, timeouts). */
double wk_core_now(const struct wk_core *c);
/* Makes the host step again (after new work, a cancel or freed blocks). */
void wk_core_kick(struct wk_core *c);

/* Counts a rejected inbound message and logs why (rate-limited).
 * link: "control" or "data"; reason: a short label ("EPROTO", "unknown_request"). */
void wk_core_reject(struct wk_core *c, const char *link, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Counts a rejected KV frame (tandem:kv_frames_rejected_total{reason}) and logs. */
void wk_core_reject_frame(struct wk_core *c, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* vllm:request_success_total{finished_reason=reason} += 1. */
void wk_core_count_finish(struct wk_core *c, const char *reason);

/* Appends a line to --kv-dump (no-op without it):
 *   <what> <request id> <block index> <block hash hex> <xxh3 of bytes hex> <len> */
void wk_core_kv_dump(struct wk_core *c, const char *what, uint64_t id, uint32_t index,
                     uint64_t hash, const void *bytes, size_t len);

/* Sampling parameters of a wire request; seed from the message or derived
 * from --seed and the request id, so P and D agree when D forwards it. */
struct sampler_params wk_core_sampling(const struct wk_core *c, uint64_t id,
                                       const Tandem__SamplingParams *sp);

#endif
