/* The simulator's state, shared by its files (simulate/): sm_run.c (setup,
 * the event loop, the router and the client), sm_worker.c (the worker host).
 * Internal: nothing outside simulate/ includes it. */
#ifndef TANDEM_SM_INTERNAL_H
#define TANDEM_SM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "loadgen/driver.h"
#include "rt_core.h"
#include "rt_feed.h"
#include "simulate.h"
#include "sm_queue.h"
#include "wk_core.h"

enum sm_kind {
    SM_EV_WAKE = 0,  /* the driver asked to be woken */
    SM_EV_SUBMIT,    /* a client request reaches the router (p: struct sm_call) */
    SM_EV_TIMEOUT,   /* a request's timeout (p: struct sm_call) */
    SM_EV_KICK,      /* rt_dispatch_run_pending */
    SM_EV_TICK,      /* rt_dispatch_tick */
    SM_EV_TO_ROUTER, /* control messages from worker who (p: struct sm_batch) */
    SM_EV_TO_WORKER, /* a control message to worker who (p: struct sm_msg) */
    SM_EV_DATA,      /* a data-link frame to worker who (p: struct sm_msg) */
    SM_EV_STEP,      /* worker who starts a step if it has work */
    SM_EV_STEP_END,  /* worker who's step ends */
    SM_EV_HEARTBEAT, /* worker who's heartbeat period */
    SM_EV_FAIL,      /* worker who dies */
    SM_EV_RESTART,   /* worker who starts again */
    SM_EV_SAMPLE,    /* sm_options.on_sample */
};

/* One message in flight: packed bytes (wire_pack / wire_frame_pack), or,
 * for a token chunk (the one message per generated token), its fields:
 * bytes holds n uint32 token ids, then n float logprobs when has_logprobs. */
struct sm_msg {
    struct sm_msg *next;  /* in a worker's inbox or outbox */
    int kind;             /* SM_EV_TO_ROUTER, SM_EV_TO_WORKER or SM_EV_DATA */
    int from;             /* worker index of the sender (-1: the router) */
    int to;               /* worker index (SM_EV_TO_WORKER, SM_EV_DATA) */
    int from_inc, to_inc; /* the workers' incarnations when it left: a message to or
                             from a process that died since is lost */
    struct sm_link *link; /* SM_EV_DATA: the sender's link */
    struct sm_batch *before; /* in an outbox: the messages for the router sent before it */
    uint64_t model_bytes; /* SM_EV_DATA: modelled KV bytes (0: not a KV frame) */
    int chunk;            /* a TokenChunk kept as fields (sm_options.pack_all unset) */
    int has_logprobs;
    uint32_t first_index;
    uint64_t request_id;
    size_t len; /* bytes; for a chunk, its token count */
    uint8_t bytes[];
};

/* One message for the router in a struct sm_batch: a token chunk of one
 * token inline (most messages: one per generated token per step), anything
 * else as its struct sm_msg. */
struct sm_rmsg {
    uint64_t request_id;
    uint32_t first_index; /* inline chunk */
    uint32_t token;
    float logprob;
    int inl;          /* 0: m; 1: inline chunk with its logprob; 2: without */
    struct sm_msg *m; /* inl 0 */
};

/* The messages a worker sends the router that travel as one event (a run of
 * them at a step's end), in order, in one array: walked without a pointer
 * chase and without a malloc per token. */
struct sm_batch {
    int from_inc; /* the sender's incarnation when it left */
    int n, cap;
    struct sm_rmsg r[];
};

/* A worker's data link to another worker. */
struct sm_link {
    struct wk_link l; /* what the roles see */
    struct sm_link *next;
    int to; /* worker index */
    int refs;
    double last_arrival; /* messages on a link arrive in the order sent */
};

struct sm;

struct sm_worker {
    struct sm *sim;
    int index;
    enum cluster_role role;
    struct worker_config cfg; /* parsed from the plan's argv (strings point into it) */
    char **argv;              /* borrowed from the plan */
    struct wk_core core;
    int core_open;
    int dead;        /* killed (SM_EV_FAIL) and not restarted */
    int incarnation; /* starts: events of an earlier one are stale */
    char name[64];   /* the plan's name ("decode-0") */
    /* Its addresses offline: the plan's may be ephemeral (tcp://host:0, bound
     * and announced live), so every worker gets its own, from its name. */
    char kv_addr[96], ctl_addr[96];
    int ep;                  /* the router's endpoint slot */
    struct rt_feed_seq feed; /* its KvEvents sequence at the router */
    int gpus;                /* TP degree */
    double (*transfer_seconds)(const struct backend *be, uint64_t bytes); /* NULL: none */

    int in_step;     /* inside wk_core_step: what it sends leaves at the step's end */
    int stepping;    /* a step is in flight until its SM_EV_STEP_END */
    int step_queued; /* an SM_EV_STEP is queued */
    int moved;       /* the last step moved something (a token, an admission, ...) */
    double hb_last;  /* when the last heartbeat left */
    /* Sent during the step in flight: messages on the data link (each after
     * the batch for the router sent before it, m->before), then rb. */
    struct sm_msg *out_head, *out_tail;
    struct sm_batch *rb; /* for the router, since the last data-link message */
    struct sm_msg *in_head, *in_tail;   /* arrived during the step in flight */
    struct sm_link *links;
    double tx_free, rx_free; /* NICs: busy until */
    uint64_t steps;
    double busy_s;
};

/* A client request: the driver's request and the dispatcher's sink. */
struct sm_call {
    struct sm *sim;
    struct lg_req *q;    /* NULL once the driver got its done */
    struct rt_req *held; /* the dispatcher holds it (hold .. release) */
    char *path;
    char *body;
    size_t len;
    int submitted; /* SM_EV_SUBMIT ran */
    int timeouts;  /* SM_EV_TIMEOUT events still queued (they point here) */
};

struct sm {
    struct sm_options opt;
    struct sm_queue q;
    double now;
    struct rt_core rt;
    int rt_open;
    struct sm_worker *w; /* (n_w) */
    int n_w;
    int *ep_worker; /* (max endpoints) endpoint slot -> worker index, -1 */
    int max_ep;
    struct lg_driver *drv;
    double wake_t; /* the wake the driver asked for, or -1 */
    int kick_queued;
    int ended;
    int failed; /* fatal: err holds why */
    char err[SM_ERR_MAX];
    struct sm_stats st;
};

/* ---- sm_run.c ---- */

/* Queues an event; out of memory is fatal for the run (sim->failed). */
void sm_at(struct sm *sim, double t, int kind, int who, void *p);
/* A fatal error: the run stops, err says why. */
void sm_fail(struct sm *sim, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Control messages from worker w reached the router: those of b, in order
 * (b freed). */
void sm_router_deliver(struct sm *sim, int w, struct sm_batch *b);
/* Frees b and the messages it holds. */
void sm_batch_free(struct sm_batch *b);

/* ---- sm_worker.c ---- */

/* Builds worker w's core from its argv (its config through its own flag
 * table, time_scale forced to 0). Returns 0 or an error with a message. */
int sm_worker_open(struct sm_worker *w, char *err, size_t errlen);
void sm_worker_close(struct sm_worker *w);
/* The router takes worker w: Hello -> endpoint, snapshot, first heartbeat. */
int sm_worker_join(struct sm_worker *w);
/* Worker w dies (SM_EV_FAIL), or starts again (SM_EV_RESTART). */
void sm_worker_fail(struct sm_worker *w);
void sm_worker_restart(struct sm_worker *w);
/* Handles one of the worker's events (SM_EV_TO_WORKER, SM_EV_DATA,
 * SM_EV_STEP, SM_EV_STEP_END, SM_EV_HEARTBEAT). */
void sm_worker_event(struct sm_worker *w, const struct sm_event *e);
/* A control message to worker w, leaving the router now. */
void sm_worker_send_control(struct sm *sim, int w, const Tandem__Envelope *env);

#endif
