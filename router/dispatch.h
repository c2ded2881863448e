/* The router's request lifecycle (docs/architecture.md "## Router"): from a
 * parsed OpenAI request to the last byte of its response.
 *
 *   HTTP body --router/openai--> prompt ids (tokenized here, the workers'
 *   tokenizer) --bh_hash_prompt--> block hashes --rt_pipeline_decide-->
 *   D (and P) --DecodeJob--> worker --TokenChunk...Finish--> text, SSE chunks
 *   or one JSON response.
 *
 * Each attempt at running a request on a worker has its own wire request id
 * (random 64-bit start, never 0) and its own decision ticket. What comes back
 * is checked by a struct ctl_stream (token indices in order, no gap, no
 * duplicate). The rules:
 *   - Busy: the job was not taken; the endpoint is excluded and the request
 *     re-decided at once (not counted as a retry). When every candidate is
 *     busy the request waits in the router's bounded pending queue (FIFO),
 *     retried as capacity frees; a full queue answers 429 with Retry-After.
 *     While the queue is non-empty new requests join it behind the others.
 *   - Failure before the first token (Error, an unexpected Finish, the link
 *     or the heartbeats lost): retried on another endpoint, at most
 *     --retries times.
 *   - Failure after tokens were accepted: recovered with a DecodeJob whose
 *     generated_token_ids are the tokens accepted so far, on another healthy
 *     endpoint (local prefill); the stream goes on from the next index, so
 *     the client sees no duplicate or missing token. Same retry budget.
 *   - Stop strings (router/openai): on OA_STOPPED the router sends Cancel and
 *     finishes with "stop" when the worker's Finish (with usage) arrives.
 *   - Client gone (HTTP abort): Cancel to the worker, everything released.
 *   - Every request ends: a response, an error status, or (after the stream
 *     started) a last chunk with finish_reason "abort"; a per-request
 *     deadline is the safety net (504 before the stream, "abort" after).
 * The pipeline's in-flight accounting is released at the first token
 * (RT_RELEASE_PREFILL) and at the end of every attempt (RT_RELEASE_ALL);
 * the cached tokens the worker reports are fed back with
 * rt_pipeline_report_cached.
 *
 * Threading: the router's loop thread only. */
#ifndef TANDEM_RT_DISPATCH_H
#define TANDEM_RT_DISPATCH_H

#include <stdint.h>
#include <uv.h>

#include "http.h"
#include "openai.h"
#include "tandem.pb-c.h"
#include "u64_map.h"

struct router;
struct rt_req;
struct rt_attempt;

struct rt_dispatch_stats {
    uint64_t accepted;   /* requests that passed validation */
    uint64_t completed;  /* answered with a generation (200) */
    uint64_t rejected;   /* 4xx/5xx answered by the dispatcher */
    uint64_t aborted;    /* client went away */
    uint64_t busy;       /* Busy answers */
    uint64_t failures;   /* attempts lost before their first token */
    uint64_t recoveries; /* attempts lost after tokens, recovered */
    uint64_t stopped;    /* ended by a stop string */
    uint64_t deadlines;  /* hit the per-request deadline */
};

struct rt_dispatch {
    struct router *r;
    struct u64_map attempts;              /* wire request id -> struct rt_attempt */
    struct rt_req *live;                  /* every request not yet ended */
    struct rt_req *pend_head, *pend_tail; /* pending queue (FIFO) */
    int n_live, n_pending, n_running;
    uint64_t next_wire_id; /* random start: ids of a restarted router do not collide */
    uint64_t resp_base, n_resp;
    uv_timer_t sweep; /* deadlines, a stalled queue */
    uv_idle_t kick;   /* dispatches queued requests outside message callbacks */
    int kick_active;
    int kick_credit;
    int closing, open_handles;
    void (*close_cb)(struct rt_dispatch *d);
    struct rt_dispatch_stats stats;
};

/* Initialises d for router r (its pipeline, registry, tokenizer, metrics and
 * options). Returns 0, TANDEM_ENOMEM or TANDEM_EUV; close with
 * rt_dispatch_close. */
int rt_dispatch_init(struct rt_dispatch *d, struct router *r);

/* Handles POST /v1/completions (OA_KIND_COMPLETION) or POST
 * /v1/chat/completions (OA_KIND_CHAT): answers errors at once, or takes a
 * reference on req and answers when the generation ends. HTTP handler. */
void rt_dispatch_handle(struct rt_dispatch *d, struct http_req *req, enum oa_kind kind);

/* Registry callbacks (see registry.h). */
void rt_dispatch_on_message(void *arg, int ep, const Tandem__Envelope *env);
void rt_dispatch_on_down(void *arg, int ep);
void rt_dispatch_on_up(void *arg, int ep);

/* Ends every live request (503 before its stream started, "abort" after,
 * Cancel sent to its worker) and closes the handles; cb(d) runs when they
 * are closed. */
void rt_dispatch_close(struct rt_dispatch *d, void (*cb)(struct rt_dispatch *d));

#endif
