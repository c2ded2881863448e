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
 *     While the queue is non-empty new requests join it behind the others
 *     (unless every one waiting is held, below). A Busy because D cannot
 *     reach the prefill worker it was given excludes that P instead, and D
 *     prefills locally.
 *   - No endpoint at all (no healthy endpoint passes the decode profile's
 *     filters: a role's only worker died, or none has joined yet): the
 *     request is held in the same pending queue (same bound, 429 past it)
 *     for up to deps.hold_ms, never past its deadline, and sent as soon as
 *     an endpoint comes up (rt_dispatch_on_up); a hold that runs out
 *     answers 503 saying how long it waited. hold_ms 0: 503 at once.
 *     A request lost on a worker that was the last of its role (in flight,
 *     tokens streamed) is held the same way and recovered on the worker
 *     that joins next, a restarted one included.
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
 * Dependencies: dispatch reaches its neighbours only through struct
 * rt_dispatch_deps (the pipeline, the tokenizer, the metrics, the limits,
 * sending to a worker, the clock, a deferred call, where answers go), so it
 * runs without sockets, HTTP or libuv: the router (router.c) fills the deps
 * with its registry, HTTP requests and a libuv idle handle and timer (a thin
 * shell around this pure core); tests/router/test_rt_dispatch.c fills them
 * with fakes, as an offline simulator would.
 *
 * Threading: one thread (the router's loop thread); every callback in the
 * deps is called on it, from inside the rt_dispatch_ call that caused it. */
#ifndef TANDEM_RT_DISPATCH_H
#define TANDEM_RT_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "ctl.h"
#include "openai.h"
#include "pipeline.h"
#include "rt_metrics.h"
#include "tandem.pb-c.h"
#include "u64_map.h"

#define RT_RETRY_AFTER_S    1   /* Retry-After of a 429 */
#define RT_DISPATCH_TICK_MS 250 /* how often the owner calls rt_dispatch_tick */

struct rt_req;
struct rt_attempt;

/* Where a request's answer goes: one HTTP request live (router.c), a
 * recorder in tests. sink is the pointer given to rt_dispatch_submit. A
 * request's answer is exactly one respond, or start_sse, write_sse... and
 * end. */
struct rt_sink_ops {
    /* Dispatch keeps the request (q) beyond rt_dispatch_submit: the sink
     * stays valid until release; the owner calls rt_dispatch_abort(q) if the
     * client goes away first. */
    void (*hold)(void *sink, struct rt_req *q);
    /* Dispatch is done with a held sink (after its answer, or abort). */
    void (*release)(void *sink);
    /* A whole response; headers are name, value, ..., NULL. */
    void (*respond)(void *sink, int status, const char *const *headers, const char *body,
                    size_t len);
    void (*start_sse)(void *sink);                               /* 200 text/event-stream */
    void (*write_sse)(void *sink, const char *data, size_t len); /* one "data:" event */
    void (*end)(void *sink);                                     /* the stream's end */
    /* Optional (NULL: every chunk through write_sse). A streamed token chunk
     * of a request without logprobs as data instead of its JSON
     * (oa_output_delta: its text and whether it carries the chat role). The
     * live router leaves it NULL; the offline simulator's client reads the
     * same fields the load generator parses out of the JSON. */
    void (*delta)(void *sink, const char *text, size_t len, int role);
    /* Optional: on (1), the sink may hold the write_sse events that follow
     * and send them together when batch(sink, 0) comes (one write for the
     * several tokens of one TokenChunk); the bytes are those of the events
     * written one by one. */
    void (*batch)(void *sink, int on);
};

/* What dispatch needs, copied by rt_dispatch_init. Pointers are borrowed and
 * must outlive the dispatcher. Every callback gets arg. */
struct rt_dispatch_deps {
    struct rt_pipeline *pl;
    struct tokenizer *tok;
    struct rt_metrics *m;
    struct oa_model model; /* the served model; max_context from max_context() per request */
    uint64_t root;         /* bh_root(model) */
    int block_size;        /* hashing block size */
    int uses_hashes;       /* rt_pipeline_uses_hashes(pl) */
    int max_pending;       /* queued requests; a full queue answers 429 */
    int retries;           /* attempts lost per request before 503 */
    int deadline_ms;       /* per request, start to end */
    int hold_ms;           /* no endpoint: how long a request waits for one (0: 503 at once) */
    uint64_t seed;         /* 0: random wire and response ids; else derived from it */
    const struct rt_sink_ops *sink;
    void *arg;
    /* Sends the DecodeJob (id, job) to endpoint ep (job's arrays are
     * borrowed for the call). Returns 0; TANDEM_ENOENT (link down) or
     * TANDEM_ETIMEOUT (send queue full): not delivered, dispatch tries
     * another endpoint; anything else: the job cannot be built (500). */
    int (*send_job)(void *arg, int ep, uint64_t id, const struct ctl_job *job);
    /* Sends Cancel for id to ep. Returns 0, TANDEM_ENOENT or another code. */
    int (*send_cancel)(void *arg, int ep, uint64_t id);
    double (*now)(void *arg); /* monotonic seconds */
    /* Asks for one rt_dispatch_run_pending(d) call soon, outside the current
     * callback (not from inside it). Not called again until it ran. */
    void (*kick)(void *arg);
    int (*max_context)(void *arg); /* tokens, prompt + generated, for requests now */
    /* Optional (NULL: none): a decision was made; a decision's cached tokens
     * reported by the worker. */
    void (*on_decision)(void *arg, const struct rt_decision *dec);
    void (*on_cached)(void *arg, uint64_t seq, int actual);
};

struct rt_dispatch_stats {
    uint64_t accepted;     /* requests that passed validation */
    uint64_t completed;    /* answered with a generation (200) */
    uint64_t rejected;     /* 4xx/5xx answered by the dispatcher */
    uint64_t aborted;      /* client went away */
    uint64_t busy;         /* Busy answers */
    uint64_t failures;     /* attempts lost before their first token */
    uint64_t recoveries;   /* attempts lost after tokens, recovered */
    uint64_t stopped;      /* ended by a stop string */
    uint64_t deadlines;    /* hit the per-request deadline */
    uint64_t held;         /* held for want of any endpoint (counted once per request) */
    uint64_t hold_expired; /* held until hold_ms ran out: 503 */
    uint64_t pd_fallbacks; /* P/D wanted a remote prefill, prefilled on D: the prefill
                              endpoints are down (or left out after a failure) */
};

struct rt_dispatch {
    struct rt_dispatch_deps deps;
    struct u64_map attempts;              /* wire request id -> struct rt_attempt */
    struct rt_req *live;                  /* every request not yet ended */
    struct rt_req *pend_head, *pend_tail; /* pending queue (FIFO) */
    int n_live, n_pending, n_running;
    int n_held;      /* of n_pending: held for want of an endpoint */
    int pd_fallback; /* the last P/D decision fell back to local for want of a prefill endpoint */
    uint64_t next_wire_id; /* random start: ids of a restarted router do not collide */
    uint64_t resp_base, n_resp;
    int kick_active; /* deps.kick asked, rt_dispatch_run_pending not yet run */
    int kick_credit; /* queued requests the next run may try */
    int closing;
    struct rt_dispatch_stats stats;
};

/* Initialises d with deps (copied). Returns 0. Nothing is allocated until
 * the first request; end with rt_dispatch_close. */
int rt_dispatch_init(struct rt_dispatch *d, const struct rt_dispatch_deps *deps);

/* Handles a POST /v1/completions (OA_KIND_COMPLETION) or /v1/chat/completions
 * (OA_KIND_CHAT) body: answers errors at once through deps.sink, or holds
 * sink (deps.sink->hold) and answers when the generation ends. session: the
 * x-session-token header, or NULL (then the body's "user"). */
void rt_dispatch_submit(struct rt_dispatch *d, void *sink, enum oa_kind kind, const char *body,
                        size_t len, const char *session);

/* The client of held request q went away: Cancel to its worker, q freed,
 * its sink released. */
void rt_dispatch_abort(struct rt_req *q);

/* The deferred call deps.kick asked for: tries the pending queue's head. */
void rt_dispatch_run_pending(struct rt_dispatch *d);

/* Every RT_DISPATCH_TICK_MS: ends held requests whose hold ran out (503)
 * and requests past their deadline (504 before the stream, "abort" after),
 * and retries a stalled queue. */
void rt_dispatch_tick(struct rt_dispatch *d);

/* Registry callbacks (see registry.h); arg is the struct rt_dispatch. */
void rt_dispatch_on_message(void *arg, int ep, const Tandem__Envelope *env);
/* Starts fetching what a coming message for request_id will touch, so that a
 * host delivering many messages at once (the simulator delivers a worker's
 * step) overlaps their cache misses. Call it with stage 3, 2, 1 and 0, each
 * stage for all the coming messages (or a couple of messages) before the
 * next, and all before the messages themselves: 3 fetches the id's map slot,
 * 2 the request's head with its attempt and output state, 1 its token and
 * text buffers, 0 its sink, which it returns (NULL before stage 0, or for an
 * id not live) for the host to fetch its own state behind it. Changes nothing. */
void *rt_dispatch_prefetch(const struct rt_dispatch *d, uint64_t request_id, int stage);
void rt_dispatch_on_down(void *arg, int ep);
void rt_dispatch_on_up(void *arg, int ep);
void rt_dispatch_on_unsent(void *arg, int ep, uint64_t id, int rc);

/* Ends every live request (503 before its stream started, "abort" after,
 * Cancel sent to its worker) and frees what d holds. Later calls answer 503
 * and ignore worker messages. */
void rt_dispatch_close(struct rt_dispatch *d);

#endif
