/* The runtime shared by tandem-prefill and tandem-decode (library
 * tandem_worker): flags and engine construction, the libuv loop, the control
 * link to the router, the data link between workers, heartbeats, KV events,
 * the /metrics HTTP port and announcing to a router. docs/architecture.md
 * ("## Workers") describes the design; docs/protocol.md ("## Worker flows")
 * the messages.
 *
 * One libuv loop thread owns everything: the scheduler, its KV pool and
 * backend, every NNG socket (through common/uvnng for receiving and
 * worker/wk_out for sending) and the HTTP server. The data link receives in
 * uvnng's queued mode: NNG keeps reading KV frames while a step blocks the
 * loop, and the loop handles every queued frame between two steps. The scheduler runs from a
 * uv_idle handle only while it has work that can progress; an idle worker
 * sleeps in epoll (woken by sockets and its heartbeat timer).
 *
 * Roles plug in as a table of callbacks (struct worker_role): the prefill
 * role (prefill_worker/) and the decode role, disaggregated or colocated
 * (decode_worker/). The runtime calls them on the loop thread; they use the
 * worker_* helpers below, which must also be called only from the loop. */
#ifndef TANDEM_WORKER_H
#define TANDEM_WORKER_H

#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "auth.h"
#include "backend.h"
#include "http.h"
#include "kv_cache.h"
#include "metrics.h"
#include "scheduler.h"
#include "tandem.pb-c.h"
#include "tokenizer.h"
#include "uvnng.h"
#include "wire.h"
#include "wk_config.h"
#include "u64_map.h"
#include "wk_out.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

#define WORKER_MAX_PEERS    64           /* cached PUSH sockets to other workers */
#define WORKER_PEER_SENDBUF 256          /* messages NNG buffers per peer socket */
#define WORKER_PEER_MAXQ    (256u << 20) /* bytes our own queue holds per peer */
#define WORKER_CTL_SENDBUF  1024         /* messages NNG buffers on the control socket */
#define WORKER_CTL_MAXQ     (64u << 20)
#define WORKER_DATA_RECVBUF 256         /* messages the data link's receive queue holds */
#define WORKER_DATA_RECVQ   (64u << 20) /* bytes at which it stops taking more */
#define WORKER_SEND_TIMEO_MS                                                                       \
    1000 /* NNG send timeout: nothing here blocks, but a                                           \
            stray blocking send must not hang the loop */
#define WORKER_ANNOUNCE_MS 1000

/* struct worker_config (the parsed command line) and its settings table:
 * wk_config.h. */

/* A cached PUSH0 socket dialed to another worker's data address. */
struct wk_peer {
    struct wk_peer *next;
    struct worker *w;
    char *addr; /* (owned) data address as given */
    nng_socket sock;
    struct uvnng u; /* pipe events only */
    struct wk_out out;
    int pipes;             /* live pipes (connections) */
    int ever_up;           /* a pipe has been up at least once */
    int refs;              /* requests using it (worker_peer_ref) */
    uint64_t last_rx_ms;   /* uv_now of the last message about one of its requests */
    uint64_t link_free_ns; /* sim link model: uv_hrtime until which the link is busy */
    int closing;           /* handles still to close */
};

struct worker;

/* A role: the callbacks that make a worker a prefill or a decode worker.
 * Every callback runs on the loop thread; all are required unless noted. */
struct worker_role {
    const char *name;                /* "prefill", "decode", "colocated" */
    Tandem__WorkerHello__Role hello; /* role announced in WorkerHello */
    /* Allocates the role's state (w->role_state) once the engine exists. */
    int (*init)(struct worker *w);
    /* Frees it, after stop and after every request is gone. */
    void (*fini)(struct worker *w);
    /* A validated control envelope from the router (any kind but KV_FRAME);
     * borrowed for the call. */
    void (*on_control)(struct worker *w, const Tandem__Envelope *env);
    /* A validated data-link frame; borrowed (copy the payload during the call). */
    void (*on_data)(struct worker *w, const struct wire_frame *f);
    /* The router's control pipe went away (no pipe left). */
    void (*on_control_down)(struct worker *w);
    /* A peer's pipe came up (up = 1) or went away (up = 0). */
    void (*on_peer)(struct worker *w, struct wk_peer *p, int up);
    /* Every heartbeat period: timeouts. now_ms is uv_now. */
    void (*on_tick)(struct worker *w, uint64_t now_ms);
    /* After every scheduler step (flush per-request token chunks). */
    void (*after_step)(struct worker *w);
    /* SIGINT/SIGTERM: end every request (blocks released, peers told). */
    void (*stop)(struct worker *w);
    /* Scheduler callbacks (arg is the worker); any may be NULL. */
    void (*on_token)(void *arg, uint64_t id, void *user, int index, uint32_t token, float logprob,
                     const struct sampler_top *top, int n_top);
    void (*on_finish)(void *arg, uint64_t id, void *user, enum sched_finish reason, int err,
                      const struct sched_usage *usage);
    void (*on_blocks_ready)(void *arg, uint64_t id, void *user, const struct kv_seq *seq, int first,
                            int count, int n_valid);
    void (*on_prompt_logprobs)(void *arg, uint64_t id, void *user, int first, int n,
                               const float *logprob, const struct sampler_top *top, int n_top);
};

/* Metric series the runtime and the roles update (all owned by w->reg). */
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
    struct metrics_series *ctl_dropped, *http_errors, *peers;
    /* Last values added to counters mirrored from sched/pool stats. */
    uint64_t last_queries, last_hits, last_preempt, last_prompt, last_gen, last_http_errors;
};

struct worker_event {
    uint64_t hash;
    uint8_t kind; /* enum kv_event */
};

struct worker {
    uv_loop_t loop;
    const struct worker_role *role;
    void *role_state;
    struct worker_config cfg;
    char id[WIRE_MAX_NAME_BYTES + 1];
    uint64_t incarnation; /* start time, unix ms */

    /* Engine. */
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

    /* Control link (router dials us). */
    struct uvnng ctl;
    struct wk_out ctl_out;
    char ctl_url[WIRE_MAX_ADDR_BYTES + 1];
    int ctl_pipes;        /* 1 while a router is attached */
    uint32_t ctl_pipe_id; /* its pipe */
    /* Cluster secret (docs/protocol.md "Cluster secret"); secret.set = 0:
     * none, and the fields below are unused. On each control pipe both
     * sides challenge the other: ctl_nonce is ours, the router's arrives as
     * router_nonce on router_nonce_pipe (maybe before that pipe's ADD_POST
     * is handled here: NNG does not order the two). */
    struct auth_key secret;
    uint8_t ctl_nonce[AUTH_NONCE_BYTES];
    uint8_t router_nonce[AUTH_NONCE_MAX];
    size_t router_nonce_len;
    uint32_t router_nonce_pipe;
    int ctl_authed;     /* the router on ctl_pipe_id proved the secret: jobs allowed */
    int ctl_hello_sent; /* Hello, heartbeat and snapshot sent on ctl_pipe_id */
    /* Data link (other workers push to us). */
    struct uvnng data;
    char kv_url[WIRE_MAX_ADDR_BYTES + 1];
    struct wk_peer *peers;
    int n_peers;
    /* Announce to a router. */
    nng_socket announce;
    int announce_open;
    uv_timer_t announce_timer;

    struct http_server http;
    int http_port;
    char metrics_addr[64];
    struct metrics_registry *reg;
    struct worker_metrics m;

    uv_timer_t hb_timer;
    uint64_t last_hb_ns; /* uv_hrtime of the last heartbeat sent */
    uv_idle_t step_idle;
    int stepping;
    uv_check_t flush_check;
    uv_signal_t sigint, sigterm;
    uv_timer_t stop_timer;

    /* KV events since the last flush, and the set of cached hashes (for the
     * snapshot sent to a newly connected router). */
    struct worker_event *ev;
    size_t n_ev, cap_ev;
    uint64_t ev_seq;
    struct u64_map cached;

    /* Rate limit of rejection warnings. */
    uint64_t warn_window_ms;
    int warn_count;
    uint64_t version_error_ms; /* last ERROR{EVERSION} sent to the router */

    FILE *kv_dump;
    int stopping;
    uint64_t stop_started_ms;
    int handles_open;
};

/* The whole process: parses flags (--help, --version, exit code 2 on a bad
 * flag), builds the engine, binds, prints the READY line, runs the loop until
 * SIGINT/SIGTERM and cleans up. colocated is the role used with --colocated
 * (NULL: the binary has no such flag). Returns the process exit code. */
int worker_main(int argc, char **argv, const char *binary, const struct worker_role *role,
                const struct worker_role *colocated);

/* ---- Helpers for roles (loop thread) ------------------------------------ */

/* Packs a data-link frame of env (+ payload for KV_FRAME) into *out, with
 * the envelope's auth_tag when a cluster secret is set (common/auth.h).
 * Returns 0 or a wire error; *out is the caller's on success. */
int worker_frame_msg(struct worker *w, const Tandem__Envelope *env, const void *payload,
                     size_t payload_len, nng_msg **out);

/* Sends env to the router on the control link. Dropped (TANDEM_ECLOSED)
 * when no router is connected; queued when NNG cannot take it yet. env stays
 * the caller's. */
int worker_send_control(struct worker *w, const Tandem__Envelope *env);
/* Error(code, message) for request id (0: about the worker). */
int worker_send_error(struct worker *w, uint64_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Finish(reason, usage) for request id. */
int worker_send_finish(struct worker *w, uint64_t id, Tandem__Finish__Reason reason,
                       uint32_t prompt_tokens, uint32_t completion_tokens, uint32_t cached_tokens);
/* Busy(reason, detail) for request id. */
int worker_send_busy(struct worker *w, uint64_t id, Tandem__Busy__Reason reason,
                     const char *detail);

/* The cached peer socket for a data address, dialing it (non-blocking) the
 * first time. Returns 0, TANDEM_EINVAL (bad URL), TANDEM_ETOOBIG (too many
 * peers), or an NNG/uv error. The peer lives until shutdown (or until it is
 * evicted while unreferenced and down). */
int worker_peer_get(struct worker *w, const char *addr, struct wk_peer **out);
void worker_peer_ref(struct wk_peer *p);
void worker_peer_unref(struct wk_peer *p);
/* Frames env (+ payload for KV_FRAME) and queues it to the peer. */
int worker_peer_send(struct worker *w, struct wk_peer *p, const Tandem__Envelope *env,
                     const void *payload, size_t payload_len);

/* Queues a ready data-link message (wire_frame_pack_msg) to the peer; it is
 * not handed to NNG before uv_hrtime() reaches due_ns (0: now), and what is
 * queued after it waits too. Always consumes msg. */
int worker_peer_send_msg(struct worker *w, struct wk_peer *p, nng_msg *msg, uint64_t due_ns);

/* Makes the scheduler step again (after new work, a cancel or freed blocks). */
void worker_kick(struct worker *w);

/* Counts a rejected inbound message and logs why (rate-limited).
 * link: "control" or "data"; reason: a short label ("EPROTO", "unknown_request"). */
void worker_reject(struct worker *w, const char *link, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Counts a rejected KV frame (tandem:kv_frames_rejected_total{reason}) and logs. */
void worker_reject_frame(struct worker *w, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* vllm:request_success_total{finished_reason=reason} += 1. */
void worker_count_finish(struct worker *w, const char *reason);

/* Appends a line to --kv-dump (no-op without it):
 *   <what> <request id> <block index> <block hash hex> <xxh3 of bytes hex> <len> */
void worker_kv_dump(struct worker *w, const char *what, uint64_t id, uint32_t index, uint64_t hash,
                    const void *bytes, size_t len);

/* Seconds on a monotonic clock (for latency histograms). */
double worker_now(void);

/* Sampling parameters of a wire request; seed from the message or derived
 * from --seed and the request id, so P and D agree when D forwards it. */
struct sampler_params worker_sampling(const struct worker *w, uint64_t id,
                                      const Tandem__SamplingParams *sp);

#endif
