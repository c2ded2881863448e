/* The continuous-batching scheduler: FCFS, iteration level.
 *
 * Each sched_step() is one iteration of the engine:
 *   1. sequences admitted with their KV already filled (PREFILLED) join the
 *      running batch and emit the first token they were given, while fewer
 *      than max_running run and no waiting request was submitted before them;
 *   2. every running sequence in decode phase gets one token of the step's
 *      budget (oldest first);
 *   3. the rest of the budget goes to prefill chunks, FCFS: first sequences
 *      already part-way through their prompt, then waiting ones (while fewer
 *      than max_running run), at most max_prefill_chunk tokens each
 *      (chunked prefill: a long prompt takes several steps). Free slots go
 *      in submission order across the waiting and PREFILLED queues, except
 *      that a waiting head which found no free blocks does not hold up
 *      PREFILLED sequences (they bring their own KV);
 *   4. the backend runs one decode call for the batch and one prefill call
 *      per chunk; tokens are sampled, callbacks fire, finished sequences
 *      release their blocks, and ops->step_end (if any) closes the step.
 * That is the chunked policy (SCHED_POLICY_CHUNKED, the default: vLLM with
 * --enable-chunked-prefill, and vLLM v1). SCHED_POLICY_PREFILL_FIRST is vLLM
 * v0's default scheduler, DistServe's baseline: after step 1, a step is
 *   - a prefill step: waiting prompts are admitted whole, FCFS, while their
 *     lengths (prefix-cached tokens included, as vLLM v0 counts them) fit in
 *     what is left of token_budget, fewer than max_running run, and free
 *     blocks hold the whole prompt; the head that does not fit stops
 *     admission (no overtaking, no chunk; max_prefill_chunk is not used);
 *     or, when no prompt could start,
 *   - a decode step: step 2 alone, every running sequence.
 * Never both. A new prompt longer than token_budget can never start: it
 * finishes with SCHED_FINISH_ERROR (TANDEM_ETOOBIG) at the next step, as
 * vLLM v0 ignores a prompt above min(max_model_len, max_num_batched_tokens);
 * a sequence with generated tokens (preempted, or resumed) longer than that
 * finishes with SCHED_FINISH_LENGTH, keeping its tokens. PREFILLED sequences
 * compute nothing to join: they take running slots as in steps 1 and 3, in
 * prefill and decode steps alike, and decode in the next decode step.
 * Full blocks are committed to the prefix cache as soon as their KV is
 * written; a new sequence first shares the longest cached prefix of its
 * tokens (leaving at least one token to compute).
 *
 * When blocks run out, a sequence that needs one preempts by recompute the
 * newest running sequence not yet scheduled in this step (possibly itself):
 * its blocks are released and it goes back to the front of the waiting
 * queue with the tokens it generated; later it re-prefills prompt +
 * generated and continues. Sampling randomness is a function of (seed,
 * token index) (see sampler.h), so a preempted, recomputed or recovered
 * sequence produces the same tokens as an undisturbed one.
 *
 * Context limit: C = min(backend max_context, pool blocks x block_size)
 * tokens. A request whose prompt (+ resumed tokens) has >= C tokens finishes
 * with SCHED_FINISH_ERROR (err TANDEM_ETOOBIG) at the next step; a sequence
 * stops with SCHED_FINISH_LENGTH when prompt + completion reaches C.
 *
 * Threading: a scheduler, its backend and its pool belong to one thread (the
 * engine thread). Every function, and every callback (which run inside
 * sched_step or sched_cancel on that thread), is on that thread. Callbacks
 * must not call sched_submit, sched_cancel or sched_step on the same
 * scheduler; they may call sched_stats. */
#ifndef TANDEM_SCHEDULER_H
#define TANDEM_SCHEDULER_H

#include <stdint.h>

#include "backend.h"
#include "kv_cache.h"
#include "sampler.h"

struct sched;

/* How a step is composed (top of file). */
enum sched_policy {
    SCHED_POLICY_CHUNKED = 0,   /* decodes, then prefill chunks in the rest of the budget */
    SCHED_POLICY_PREFILL_FIRST, /* whole prompts, else decodes; never mixed (vLLM v0) */
    SCHED_POLICY_COUNT
};

struct sched_config {
    int max_running;          /* >= 1: sequences holding KV at once */
    int token_budget;         /* >= 1: tokens computed per step (decodes + prefill chunks);
                                 >= max_running so that every decode runs every step */
    int max_prefill_chunk;    /* >= 1: prompt tokens of one sequence per step */
    int block_size;           /* must equal the pool's block size */
    int max_context;          /* 0: the backend's max_context; else min(this, backend's) */
    enum sched_policy policy; /* 0: SCHED_POLICY_CHUNKED */
};

enum sched_mode {
    /* Prefill then decode on this worker (colocated, or selective P/D). */
    SCHED_MODE_FULL = 0,
    /* Prefill worker: prefill in chunks, report every block as it becomes
     * ready (on_blocks_ready), sample the first token, finish with
     * SCHED_FINISH_PREFILLED. */
    SCHED_MODE_PREFILL_ONLY,
    /* Decode worker: the prompt's KV is already in req->kv (blocks installed
     * by the caller) and the first token is given; only decodes. */
    SCHED_MODE_PREFILLED,
};

enum sched_finish {
    SCHED_FINISH_LENGTH = 0, /* max_tokens or the context limit reached */
    SCHED_FINISH_STOP,       /* EOS (unless ignore_eos) or a stop token id */
    SCHED_FINISH_CANCELLED,  /* sched_cancel */
    SCHED_FINISH_ERROR,      /* backend failure or impossible request (see err) */
    SCHED_FINISH_PREFILLED,  /* PREFILL_ONLY: KV and first token handed over */
    SCHED_FINISH_COUNT
};

/* Most stop token ids per request. */
#define SCHED_MAX_STOP 16

struct sched_request {
    uint64_t id;              /* unique among the scheduler's live requests */
    void *user;               /* passed back to every callback; not touched */
    const uint32_t *prompt;   /* (n_prompt) copied by sched_submit; for a resume it is the
                                 original prompt followed by the n_generated tokens so far */
    int n_prompt;             /* >= 1 */
    int n_generated;          /* resume: tokens of the completion already generated
                                 (the tail of prompt); 0 for a new request */
    int max_tokens;           /* >= 1: completion length limit, counting n_generated */
    const uint32_t *stop_ids; /* (n_stop) copied; a generated stop id ends the completion */
    int n_stop;               /* 0..SCHED_MAX_STOP */
    int ignore_eos;           /* 1: the backend's eos_id does not stop generation */
    struct sampler_params sampling;
    int logprobs;        /* top alternatives per generated token, 0..SAMPLER_MAX_TOP
                            (the chosen token's logprob is always reported) */
    int prompt_logprobs; /* 1: report the logprob of every prompt token (disables prefix
                            cache reuse for this request, as vLLM does) */
    int prompt_top;      /* with prompt_logprobs: alternatives per token, 0..SAMPLER_MAX_TOP */
    enum sched_mode mode;
    /* PREFILLED only. kv holds the KV of every prompt position (n_tokens >=
     * n_prompt, same root as the scheduler, blocks in the scheduler's pool).
     * On success the scheduler takes the sequence over: it copies the struct
     * and resets *kv to empty (the caller still calls kv_seq_fini on its own
     * struct, which is then a no-op). On failure *kv stays with the caller. */
    struct kv_seq *kv;
    uint32_t first_token;                /* the token sampled by the prefill worker */
    float first_logprob;                 /* its logprob */
    const struct sampler_top *first_top; /* (n_first_top) its alternatives, copied */
    int n_first_top;                     /* 0..SAMPLER_MAX_TOP */
};

struct sched_usage {
    int prompt_tokens;     /* n_prompt - n_generated at submission (the original prompt) */
    int completion_tokens; /* every token of the completion, resumed ones included */
    int cached_tokens;     /* prompt tokens served from the prefix cache at first admission
                              (PREFILLED: kv->n_cached_tokens as given) */
};

/* Output callbacks, all optional (NULL: not called). They run on the engine
 * thread inside sched_step (and on_finish inside sched_cancel); arrays they
 * receive are valid only during the call. */
struct sched_callbacks {
    void *arg;
    /* Token number index (0-based in the completion, continuing after resumed
     * tokens) of request id. Every generated token is reported, EOS and stop
     * ids included. top[0..n_top) are the alternatives asked for. */
    void (*on_token)(void *arg, uint64_t id, void *user, int index, uint32_t token, float logprob,
                     const struct sampler_top *top, int n_top);
    /* The request is over and every block it held is released (cached ones
     * stay in the prefix cache). err is 0, or the TANDEM_E* code of an ERROR.
     * Called exactly once per accepted request, last. */
    void (*on_finish)(void *arg, uint64_t id, void *user, enum sched_finish reason, int err,
                      const struct sched_usage *usage);
    /* PREFILL_ONLY: blocks seq->blocks[first .. first + count) now hold their
     * final KV; n_valid is how many leading tokens of the sequence are written,
     * so the last reported block is partial when n_valid % block_size != 0
     * (only at the end of the prompt). Every block of the prompt is reported
     * exactly once, in order, right after the chunk that filled it, before
     * the first token. Read payloads with kv_block_data during the call. */
    void (*on_blocks_ready)(void *arg, uint64_t id, void *user, const struct kv_seq *seq, int first,
                            int count, int n_valid);
    /* prompt_logprobs: logprob[j] is the logprob of prompt token first + j
     * (first >= 1: token 0 has none) given the tokens before it, and
     * top[j * n_top .. (j + 1) * n_top) its alternatives. Reported in order
     * as chunks complete; each prompt token once. */
    void (*on_prompt_logprobs)(void *arg, uint64_t id, void *user, int first, int n,
                               const float *logprob, const struct sampler_top *top, int n_top);
};

struct sched_stats {
    int waiting;                      /* queued, not holding KV (preempted ones included) */
    int running;                      /* holding KV: prefilling or decoding */
    int64_t prefill_tokens_queued;    /* tokens still to prefill over waiting and running */
    uint64_t steps;                   /* sched_step calls that computed something */
    uint64_t preemptions;             /* total */
    uint64_t prompt_tokens;           /* total prompt tokens of requests that produced a token */
    uint64_t generation_tokens;       /* total tokens reported through on_token */
    uint64_t prefill_tokens_computed; /* total tokens run through backend prefill */
    uint64_t prefix_cache_queries;    /* tokens looked up in the prefix cache (kv stats) */
    uint64_t prefix_cache_hits;       /* of which found */
    uint64_t finished[SCHED_FINISH_COUNT]; /* per enum sched_finish */
    int last_step_tokens;                  /* tokens scheduled in the last step (<= token_budget) */
    int last_step_decodes;                 /* of which decodes */
    int last_step_prefills;                /* prefill chunks in the last step */
};

/* Creates a scheduler over a backend and a pool (both borrowed: they must
 * outlive it). cfg is copied; cb is copied (may be NULL). Returns 0,
 * TANDEM_EINVAL (bad config, block size differs from the pool's) or
 * TANDEM_ENOMEM. On success the caller owns *out: sched_destroy. */
int sched_create(struct sched **out, const struct sched_config *cfg, struct backend *be,
                 struct kv_pool *pool, const struct sched_callbacks *cb);

/* Releases every block of every live request, without callbacks, and frees
 * the scheduler. Call it before destroying the pool and the backend. */
void sched_destroy(struct sched *s);

/* Queues a request (FCFS). Copies everything it needs from req. Returns 0;
 * TANDEM_EINVAL for bad fields (sizes, sampling params, PREFILLED without a
 * suitable kv, a token outside the vocabulary); TANDEM_EEXIST when id is
 * live; TANDEM_ENOMEM. On error nothing is kept and no callback fires. */
int sched_submit(struct sched *s, const struct sched_request *req);

/* Cancels a live request in any phase: releases every block at once and
 * calls on_finish(CANCELLED) before returning. Returns 0 or TANDEM_ENOENT. */
int sched_cancel(struct sched *s, uint64_t id);

/* Phase 0 of sched_step alone: PREFILLED sequences waiting for a running
 * slot take free ones and emit the first token they were given (on_token),
 * and requests that cannot run finish. A decode worker calls it when a
 * prefilled request arrives, so the first token leaves without waiting for a
 * decode step. Returns the number of such events (0: nothing changed). */
int sched_admit(struct sched *s);

/* Runs one iteration (see top of file). Returns the number of tokens
 * computed plus the number of sequences that finished, emitted or were
 * preempted without computing, so 0 means nothing can happen until new work arrives, a
 * request is cancelled, or blocks held outside the scheduler are freed.
 * Backend errors finish the affected sequences with SCHED_FINISH_ERROR;
 * the return value is never negative. */
int sched_step(struct sched *s);

/* 1 when any request is live (waiting or running). */
int sched_busy(const struct sched *s);

/* 1 when id is live. */
int sched_has(const struct sched *s, uint64_t id);

/* Adds one to refs[b] for every reference to block b a live request holds
 * (refs has the pool's n_blocks entries), for kv_check_refs. */
void sched_count_refs(const struct sched *s, int32_t *refs);

/* Snapshot of the counters (O(live requests)). */
void sched_stats(const struct sched *s, struct sched_stats *out);

/* The context limit C in tokens (see top of file). */
int sched_max_context(const struct sched *s);

/* Name of a finish reason: "length", "stop", "cancelled", "error",
 * "prefilled". */
const char *sched_finish_name(enum sched_finish reason);

/* Name of a policy, as the worker's --scheduler takes it: "chunked",
 * "prefill-first"; NULL out of range. sched_policy_names is that list,
 * NULL-terminated, in enum order. */
const char *sched_policy_name(enum sched_policy policy);
extern const char *const sched_policy_names[];

/* The token budget for a policy. given > 0: that; else the backend's
 * default, which prefill-first raises to the context limit ctx (whole prompts
 * must fit in a step: vLLM v0's default max_num_batched_tokens is
 * max(max_model_len, 2048)). *short_by is how many tokens the result falls
 * short of ctx under prefill-first (prompts that long are refused; vLLM v0
 * would not start), else 0. Pure. */
int sched_budget_for(enum sched_policy policy, int given, int backend_default, int ctx,
                     int *short_by);

#endif
