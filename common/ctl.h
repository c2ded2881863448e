/* The router's side of a worker's control link (docs/protocol.md, "Worker
 * flows"): dial a worker's PAIR0 control address, build and send DecodeJob
 * and Cancel from plain C structs, and assemble what comes back per request.
 *
 * Two ways to use it:
 *   - synchronously (tests, benchmarks): ctl_dial, then ctl_run (one request)
 *     or ctl_run_many (several requests on one or more sockets), which block
 *     until every stream is done or the timeout passes;
 *   - from a libuv loop (the router): ctl_open + nng_dial(NNG_FLAG_NONBLOCK),
 *     hand the socket to uvnng, send with ctl_job_msg / ctl_cancel_msg and
 *     wire_sendmsg, decode received messages with wire_unpack and feed each
 *     to the request's ctl_stream.
 *
 * A stream checks what a worker promises: token chunks arrive in order with
 * no gap and no duplicate (first_index == tokens so far), and nothing follows
 * the end. The end of a request is Finish, or Busy (the worker did not take
 * it: no Finish follows, the router may pick another worker). An Error for
 * the request is recorded and is followed by Finish(ERROR).
 *
 * Threading: no shared state; a struct ctl_stream is used by one thread. */
#ifndef TANDEM_CTL_H
#define TANDEM_CTL_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "tandem.pb-c.h"
#include "wire.h"

#define CTL_MAX_TOP    WIRE_MAX_LOGPROBS
#define CTL_MAX_ERROR  256
#define CTL_MAX_STOP   WIRE_MAX_STOP_IDS
#define CTL_SEND_BUF   1024 /* messages buffered by NNG on a control socket */
#define CTL_SEND_TIMEO 5000 /* ms: a blocking send to a dead worker gives up */

/* One request, as the router hands it to a worker. Arrays are borrowed. */
struct ctl_job {
    const uint32_t *prompt; /* (n_prompt) token ids, n_prompt >= 1 */
    int n_prompt;
    const uint32_t *generated; /* (n_generated) tokens already streamed (recovery), or NULL */
    int n_generated;
    uint32_t max_tokens; /* >= 1, counts the generated ones */
    float temperature;   /* 0: greedy */
    float top_p;         /* (0, 1] */
    uint32_t top_k;      /* 0: off */
    int has_seed;        /* 0: the worker picks the seed */
    uint64_t seed;
    const uint32_t *stop_ids; /* (n_stop) */
    int n_stop;
    uint32_t logprobs;   /* top alternatives per generated token, 0..5 */
    int prompt_logprobs; /* 1: the worker also sends PromptLogprobs */
    int ignore_eos;
    int hold_tokens;             /* DecodeJob.hold_tokens: the client does not stream */
    int control_batches;         /* DecodeJob.control_batches: the sender takes BATCH envelopes */
    const char *prefill_address; /* data address of the prefill worker, NULL/"" = local */
};

/* Greedy, top_p 1, max_tokens 16, everything else zero/NULL. */
void ctl_job_init(struct ctl_job *job);

/* The DecodeJob envelope of (id, job), unpacked: env points into e, and
 * e's arrays into job (both must outlive env's use). What ctl_job_msg
 * packs; the offline simulator packs it with wire_pack. Returns 0 or
 * TANDEM_EINVAL. Pure. */
struct ctl_job_env {
    Tandem__Envelope env;
    Tandem__DecodeJob dj;
    Tandem__SamplingParams sp;
};
int ctl_job_env(struct ctl_job_env *e, uint64_t id, const struct ctl_job *job);

/* Builds the DecodeJob envelope for (id, job) into a new nng_msg ready to
 * send on a control link. Returns 0 or a wire code (TANDEM_EINVAL for a
 * struct the validator refuses, with wire_error_detail()). *out is the
 * caller's. Any thread. */
int ctl_job_msg(uint64_t id, const struct ctl_job *job, nng_msg **out);

/* The Cancel envelope for id, as a new nng_msg. */
int ctl_cancel_msg(uint64_t id, nng_msg **out);

/* Build and send (wire_sendmsg: the message is consumed either way).
 * flags as nng_sendmsg. */
int ctl_send_job(nng_socket s, uint64_t id, const struct ctl_job *job, int flags);
int ctl_send_cancel(nng_socket s, uint64_t id, int flags);

/* Opens a PAIR0 socket set up for a control link (receive limit, send
 * buffer CTL_SEND_BUF, send timeout CTL_SEND_TIMEO). Returns 0 or a wire
 * code; on success the caller closes *out with nng_close. */
int ctl_open(nng_socket *out);

/* ctl_open + nng_dial(url).
 * flags 0: synchronous: the dial fails (TANDEM_ECLOSED / TANDEM_ENNG) if
 *   nobody listens, and on success returns only once the worker's
 *   WorkerHello arrived on the link (TANDEM_ETIMEOUT after CTL_HELLO_MS).
 *   A worker with a cluster secret is answered with the secret from
 *   TANDEM_CLUSTER_SECRET_FILE (the file is read once), so tests and
 *   benchmarks drive it as the router would.
 *   A worker's PAIR0 takes one router at a time and may refuse a pipe while
 *   an old one is still being torn down; a job sent on a refused pipe is
 *   lost, and the Hello is what says the link is really up.
 * NNG_FLAG_NONBLOCK: returns at once and NNG keeps redialling in the
 *   background (the router, which waits for the Hello on its loop).
 * On failure nothing stays open. */
int ctl_dial(nng_socket *out, const char *url, int flags);

/* ctl_dial(url, 0), also handing over the WorkerHello envelope (*hello is
 * the caller's: wire_free). */
int ctl_dial_hello(nng_socket *out, const char *url, Tandem__Envelope **hello);

#define CTL_HELLO_MS 10000

struct ctl_top {
    uint32_t token;
    float logprob;
};

/* What a worker sent for one request. */
/* What each token chunk touches comes first (one cache line), the error
 * texts last. */
struct ctl_stream {
    uint64_t id;
    int n_tokens;
    int first_index;     /* index of tokens[0] (the first chunk's first_index; a
                            recovery continues after the tokens it was given) */
    int done;            /* Finish or Busy received */
    int count_only;      /* set after ctl_stream_init: token chunks are checked and counted
                            (n_tokens, first_index, t_first) but not kept (tokens, logprobs,
                            top and n_top stay NULL): the caller reads them from each chunk */
    uint32_t *tokens;    /* (cap) generated ids, in completion order from index 0 */
    float *logprobs;     /* (cap) logprob of each, NaN where none was sent */
    struct ctl_top *top; /* (cap, CTL_MAX_TOP) alternatives of each; NULL until a chunk
                            brings some (read it only where n_top > 0) */
    uint8_t *n_top;      /* (cap) alternatives of each, 0..CTL_MAX_TOP */
    int cap;
    double t_first;             /* CLOCK_MONOTONIC seconds of the first token, 0 if none */
    double t_done;              /* ... of the end, 0 if not done */
    float *prompt_logprobs;     /* (n_prompt_logprobs) logprob of prompt position i + 1 */
    struct ctl_top *prompt_top; /* (n_prompt_logprobs, CTL_MAX_TOP) alternatives of each */
    uint8_t *n_prompt_top;      /* (n_prompt_logprobs) alternatives of each */
    int n_prompt_logprobs;
    int cap_prompt_logprobs;
    int finish_reason;      /* Tandem__Finish__Reason, 0 until a Finish */
    uint32_t prompt_tokens; /* usage, from the Finish */
    uint32_t completion_tokens;
    uint32_t cached_tokens;
    int busy;        /* 1: ended by Busy */
    int busy_reason; /* Tandem__Busy__Reason */
    int error_code;  /* TANDEM_E* of the last Error, 0 if none */
    int bad;         /* protocol violations seen (gaps, duplicates, after the end) */
    char error[CTL_MAX_ERROR];
    char bad_detail[CTL_MAX_ERROR];
};

/* Zeroes s for request id. Nothing is allocated until tokens arrive. */
void ctl_stream_init(struct ctl_stream *s, uint64_t id);
/* Frees the arrays; s may be reused after ctl_stream_init. */
void ctl_stream_fini(struct ctl_stream *s);

/* Feeds one decoded control envelope (a Finish with last_tokens: the tokens
 * first, as a TokenChunk would be). Returns 0 when consumed, 1 when
 * consumed and the stream is now done, TANDEM_ENOENT when env is not about
 * this request (another id, or a worker-scoped kind: hello, heartbeat, KV
 * events, link errors), TANDEM_EPROTO when it breaks the stream's rules (a
 * gap or duplicate in token indices, a message after the end, a kind a
 * worker does not send: s->bad counts them, s->bad_detail says the last
 * one; the message is otherwise ignored), TANDEM_ENOMEM. */
int ctl_stream_feed(struct ctl_stream *s, const Tandem__Envelope *env);

/* Monotonic clock in seconds (the stream timestamps' clock). */
double ctl_now(void);

/* Called by ctl_run / ctl_run_many for every received envelope no stream
 * claims (hello, heartbeat, KV events, ...). env is borrowed. */
typedef void (*ctl_other_fn)(void *arg, nng_socket s, const Tandem__Envelope *env);

/* One request of ctl_run_many. */
struct ctl_item {
    nng_socket sock; /* control socket of the worker that runs it */
    uint64_t id;     /* unique across the items */
    const struct ctl_job *job;
    struct ctl_stream stream; /* initialised by ctl_run_many; the caller fini's it */
};

/* Sends every item's job, then receives on all their sockets (poll(2) on the
 * NNG receive fds, no busy loop) until every stream is done or timeout_ms
 * passed. Returns 0 when all are done, TANDEM_ETIMEOUT (streams hold what
 * arrived), or the first send error (streams of items not sent are left
 * empty and not done). Protocol violations do not stop it: check
 * stream.bad. Messages that fail to decode are dropped. Blocking; any
 * thread that owns the sockets. */
int ctl_run_many(struct ctl_item *items, int n, int timeout_ms, ctl_other_fn other, void *arg);

/* ctl_run_many for one request: sends (id, job) on s and collects into
 * *out (initialised here; the caller calls ctl_stream_fini). */
int ctl_run(nng_socket s, uint64_t id, const struct ctl_job *job, int timeout_ms,
            struct ctl_stream *out);

#endif
