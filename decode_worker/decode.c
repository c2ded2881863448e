/* The decode role: see decode.h. */
#include "decode.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "block_hash.h"
#include "log.h"
#include "tandem_err.h"
#include "wk_tops.h"

enum dphase {
    DR_TRANSFER = 0, /* blocks reserved, waiting for P's frames and PrefillDone */
    DR_SCHED,        /* in the scheduler (local prefill or decoding) */
};

/* Pending tokens kept inside a request (reserve_pending). */
#define DREQ_INLINE 4
/* A request whose client does not stream (DecodeJob.hold_tokens) sends its
 * tokens after the first at most this many at a time: the router hears of
 * progress (dashboard, recovery) without a message per step. */
#define DREQ_HOLD_TOKENS 64

struct dreq {
    /* What each token touches (on_token, flush_chunk): two cache lines. */
    uint64_t id;
    double t_last; /* last token */
    int tokens_seen;
    int n_pend, cap; /* tokens of the current step, sent as one TokenChunk by after_step */
    int first_pend;  /* completion index of tok[0] */
    int dirty;
    int logprobs;                 /* top logprobs asked for */
    int hold;                     /* DecodeJob.hold_tokens (held_back) */
    uint32_t *tok;                /* (cap) */
    float *lp;                    /* (cap) */
    uint8_t *ntop;                /* (cap) */
    struct sampler_top *top;      /* (cap, WIRE_MAX_LOGPROBS) */
    uint32_t tok_in[DREQ_INLINE]; /* tok, lp and ntop while cap is DREQ_INLINE */
    float lp_in[DREQ_INLINE];
    uint8_t ntop_in[DREQ_INLINE];

    enum dphase phase;
    uint32_t *prompt; /* (n_total) prompt, then recovered tokens (local recovery only) */
    int n_prompt;     /* the original prompt */
    int n_total;
    double t_job; /* wk_core_now at arrival */

    /* DR_TRANSFER */
    uint64_t *hashes; /* (n_full) chained hashes of the prompt's full blocks */
    int n_full;
    struct kv_seq kv;
    int n_blocks; /* blocks of the prompt, the partial last one included */
    int skip;     /* leading blocks D already held */
    int received;
    uint8_t *got; /* (n_blocks) 1 once installed */
    struct wk_link *peer;
    double t_sent; /* wk_core_now when the PrefillJob was sent */
    struct sampler_params sp;
    uint32_t stop[SCHED_MAX_STOP];
    int n_stop;
    int ignore_eos;
    int max_tokens;
};

struct dstate {
    struct u64_map reqs; /* id -> struct dreq */
    struct dreq **dirty; /* (cap_dirty) requests with pending tokens, in the order they got
                            their first */
    int n_dirty, cap_dirty;
    int colocated;
    int aborting; /* shutting down: a cancel is reported as ABORT */
    int silent;   /* the router is gone: nothing to send */
};

static struct dstate *state(struct wk_core *c)
{
    return c->role_state;
}

/* ---- Request state ------------------------------------------------------ */

static void unlink_dirty(struct dstate *ds, struct dreq *r)
{
    if (!r->dirty) {
        return;
    }
    for (int i = 0; i < ds->n_dirty; i++) {
        if (ds->dirty[i] == r) {
            memmove(ds->dirty + i, ds->dirty + i + 1, (size_t)(ds->n_dirty - i - 1) * sizeof(r));
            ds->n_dirty--;
            break;
        }
    }
    r->dirty = 0;
}

/* Releases everything the request holds outside the scheduler and frees it. */
static void dreq_free(struct wk_core *c, struct dreq *r)
{
    struct dstate *ds = state(c);
    u64_map_del(&ds->reqs, r->id);
    unlink_dirty(ds, r);
    if (r->phase == DR_TRANSFER) {
        c->n_outside--;
    }
    kv_seq_release(c->pool, &r->kv);
    kv_seq_fini(&r->kv);
    if (r->peer != NULL) {
        wk_core_link_unref(c, r->peer);
    }
    free(r->prompt);
    free(r->hashes);
    free(r->got);
    if (r->tok != r->tok_in) {
        free(r->tok);
        free(r->lp);
        free(r->ntop);
    }
    free(r->top);
    free(r);
    /* Blocks went back to the pool: a queued request may fit now. */
    wk_core_kick(c);
}

static void send_cancel_to_prefill(struct wk_core *c, struct dreq *r)
{
    Tandem__Cancel cancel = TANDEM__CANCEL__INIT;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__CANCEL, r->id, &cancel);
    wk_core_link_send(c, r->peer, &env, NULL, 0, 0);
}

/* Ends a request that is not in the scheduler (nothing was streamed yet). */
static void end_outside(struct wk_core *c, struct dreq *r, Tandem__Finish__Reason reason, int err,
                        const char *why)
{
    struct dstate *ds = state(c);
    const char *name = reason == TANDEM__FINISH__REASON__CANCELLED ? "cancelled"
                       : reason == TANDEM__FINISH__REASON__ABORT   ? "abort"
                                                                   : "error";
    if (!ds->silent) {
        if (reason == TANDEM__FINISH__REASON__ERROR) {
            wk_core_send_error(c, r->id, err, "%s", why);
        }
        uint32_t cached = r->phase == DR_TRANSFER ? (uint32_t)(r->skip * c->block_size) : 0;
        wk_core_send_finish(c, r->id, reason, (uint32_t)r->n_prompt, 0, cached, NULL);
    }
    if (reason == TANDEM__FINISH__REASON__ERROR) {
        LOG_WARN("decode", "request %llu failed: %s", (unsigned long long)r->id, why);
    }
    wk_core_count_finish(c, name);
    metrics_histogram_observe(c->m.e2e, wk_core_now(c) - r->t_job);
    dreq_free(c, r);
}

static void fail_transfer(struct wk_core *c, struct dreq *r, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail_transfer(struct wk_core *c, struct dreq *r, int err, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    end_outside(c, r, TANDEM__FINISH__REASON__ERROR, err, why);
}

/* Error + Finish(ERROR) for a job refused before any state exists. */
static void refuse(struct wk_core *c, uint64_t id, uint32_t n_prompt, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void refuse(struct wk_core *c, uint64_t id, uint32_t n_prompt, int err, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    LOG_INFO("decode", "request %llu refused: %s", (unsigned long long)id, why);
    wk_core_send_error(c, id, err, "%s", why);
    wk_core_send_finish(c, id, TANDEM__FINISH__REASON__ERROR, n_prompt, 0, 0, NULL);
    wk_core_count_finish(c, "error");
}

/* ---- Streaming tokens --------------------------------------------------- */

/* Room for one more pending token. The first DREQ_INLINE tokens of a step
 * live inside the request (a decode step adds one), so the token path
 * touches no other allocation; past that the arrays move to the heap. */
static int reserve_pending(struct dreq *r)
{
    if (r->n_pend < r->cap) {
        return 0;
    }
    if (r->cap == 0) {
        r->top = malloc(DREQ_INLINE * WIRE_MAX_LOGPROBS * sizeof(*r->top));
        if (r->top == NULL) {
            return TANDEM_ENOMEM;
        }
        r->tok = r->tok_in;
        r->lp = r->lp_in;
        r->ntop = r->ntop_in;
        r->cap = DREQ_INLINE;
        return 0;
    }
    int cap = 2 * r->cap;
    int inl = r->tok == r->tok_in;
    uint32_t *tok = realloc(inl ? NULL : r->tok, (size_t)cap * sizeof(*tok));
    float *lp = realloc(inl ? NULL : r->lp, (size_t)cap * sizeof(*lp));
    uint8_t *ntop = realloc(inl ? NULL : r->ntop, (size_t)cap * sizeof(*ntop));
    struct sampler_top *top = realloc(r->top, (size_t)cap * WIRE_MAX_LOGPROBS * sizeof(*top));
    if (inl) {
        if (tok != NULL) {
            memcpy(tok, r->tok_in, sizeof(r->tok_in));
        }
        if (lp != NULL) {
            memcpy(lp, r->lp_in, sizeof(r->lp_in));
        }
        if (ntop != NULL) {
            memcpy(ntop, r->ntop_in, sizeof(r->ntop_in));
        }
    }
    if (tok == NULL || lp == NULL || ntop == NULL || top == NULL) {
        /* Keep what is consistent: the old arrays (still valid) or the new. */
        if (inl) {
            free(tok);
            free(lp);
            free(ntop);
        } else {
            r->tok = tok ? tok : r->tok;
            r->lp = lp ? lp : r->lp;
            r->ntop = ntop ? ntop : r->ntop;
        }
        r->top = top ? top : r->top;
        return TANDEM_ENOMEM;
    }
    r->tok = tok;
    r->lp = lp;
    r->ntop = ntop;
    r->top = top;
    r->cap = cap;
    return 0;
}

/* The pending tokens as a TokenChunk (t holds its alternatives: chunk_sent
 * frees it). n_pend > 0. */
static void chunk_build(struct dreq *r, Tandem__TokenChunk *chunk, struct wk_tops *t)
{
    int n = r->n_pend;
    tandem__token_chunk__init(chunk);
    chunk->first_index = (uint32_t)r->first_pend;
    chunk->n_token_ids = (size_t)n;
    chunk->token_ids = r->tok;
    chunk->n_logprobs = (size_t)n;
    chunk->logprobs = r->lp;
    memset(t, 0, sizeof(*t));
    if (r->logprobs > 0 && wk_tops_build(t, n, r->top, WIRE_MAX_LOGPROBS, r->ntop, 0) == 0) {
        chunk->n_top_logprobs = (size_t)n;
        chunk->top_logprobs = t->ptrs;
    }
}

static void chunk_sent(struct dreq *r, struct wk_tops *t)
{
    wk_tops_free(t);
    r->first_pend += r->n_pend;
    r->n_pend = 0;
}

static void flush_chunk(struct wk_core *c, struct dreq *r)
{
    if (r->n_pend == 0) {
        return;
    }
    Tandem__TokenChunk chunk;
    struct wk_tops t;
    chunk_build(r, &chunk, &t);
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__TOKEN_CHUNK, r->id, &chunk);
    if (!state(c)->silent) {
        wk_core_send_control(c, &env);
    }
    chunk_sent(r, &t);
}

static void on_token(void *arg, uint64_t id, void *user, int index, uint32_t token, float logprob,
                     const struct sampler_top *top, int n_top)
{
    struct wk_core *c = arg;
    struct dstate *ds = state(c);
    struct dreq *r = user;
    (void)id;
    double now = wk_core_now(c);
    if (r->tokens_seen == 0) {
        metrics_histogram_observe(c->m.ttft, now - r->t_job);
    } else {
        metrics_histogram_observe(c->m.itl, now - r->t_last);
    }
    r->tokens_seen++;
    r->t_last = now;
    if (r->n_pend > 0 && r->first_pend + r->n_pend != index) {
        flush_chunk(c, r); /* never happens: the scheduler reports in order */
    }
    if (r->n_pend == 0) {
        r->first_pend = index;
    }
    if (r->n_pend >= (int)WIRE_MAX_CHUNK_TOKENS) {
        flush_chunk(c, r);
        r->first_pend = index;
    }
    if (reserve_pending(r) != 0) {
        LOG_ERROR("decode", "request %llu: out of memory buffering a token",
                  (unsigned long long)r->id);
        return;
    }
    int k = r->n_pend++;
    r->tok[k] = token;
    r->lp[k] = logprob;
    int nt = n_top < (int)WIRE_MAX_LOGPROBS ? n_top : (int)WIRE_MAX_LOGPROBS;
    for (int j = 0; j < nt; j++) {
        r->top[k * WIRE_MAX_LOGPROBS + j] = top[j];
    }
    r->ntop[k] = (uint8_t)nt;
    if (!r->dirty) {
        if (ds->n_dirty == ds->cap_dirty) {
            int cap = ds->cap_dirty ? 2 * ds->cap_dirty : 64;
            struct dreq **p = realloc(ds->dirty, (size_t)cap * sizeof(*p));
            if (p == NULL) {
                flush_chunk(c, r); /* no room to wait for the step's end: now */
                return;
            }
            ds->dirty = p;
            ds->cap_dirty = cap;
        }
        r->dirty = 1;
        ds->dirty[ds->n_dirty++] = r;
    }
}

/* After a request's first chunk its tokens wait until N are pending: N is
 * DREQ_HOLD_TOKENS for a DecodeJob.hold_tokens job, else --stream-interval
 * (on_finish sends the rest). */
static int held_back(const struct wk_core *c, const struct dreq *r)
{
    int n = r->hold ? DREQ_HOLD_TOKENS : c->cfg.stream_interval;
    return n > 1 && r->tokens_seen > r->n_pend && r->n_pend < n;
}

static void after_step(struct wk_core *c)
{
    struct dstate *ds = state(c);
    /* Newest first, as the list this array replaced; each request's
     * pending tokens fetched a few requests ahead (they went cold during
     * the step). */
    for (int i = ds->n_dirty - 1; i >= 0; i--) {
        if (i >= 3) {
            __builtin_prefetch(ds->dirty[i - 3]);
            __builtin_prefetch((const char *)ds->dirty[i - 3] + 64);
        }
        struct dreq *r = ds->dirty[i];
        r->dirty = 0;
        if (!held_back(c, r)) { /* else its next token lists it again */
            flush_chunk(c, r);
        }
    }
    ds->n_dirty = 0;
}

static void on_finish(void *arg, uint64_t id, void *user, enum sched_finish reason, int err,
                      const struct sched_usage *usage)
{
    struct wk_core *c = arg;
    struct dstate *ds = state(c);
    struct dreq *r = user;
    (void)id;
    /* A held request's last tokens ride in its Finish (one message less);
     * an error or cancel keeps the TokenChunk, Error, Finish order. */
    int attach =
        r->hold && r->n_pend > 0 && (reason == SCHED_FINISH_LENGTH || reason == SCHED_FINISH_STOP);
    if (!attach) {
        flush_chunk(c, r);
    }
    Tandem__Finish__Reason fr;
    const char *name;
    switch (reason) {
    case SCHED_FINISH_LENGTH:
        fr = TANDEM__FINISH__REASON__LENGTH;
        name = "length";
        break;
    case SCHED_FINISH_STOP:
        fr = TANDEM__FINISH__REASON__STOP;
        name = "stop";
        break;
    case SCHED_FINISH_CANCELLED:
        fr = ds->aborting ? TANDEM__FINISH__REASON__ABORT : TANDEM__FINISH__REASON__CANCELLED;
        name = ds->aborting ? "abort" : "cancelled";
        break;
    default:
        fr = TANDEM__FINISH__REASON__ERROR;
        name = "error";
        break;
    }
    if (!ds->silent) {
        if (fr == TANDEM__FINISH__REASON__ERROR) {
            wk_core_send_error(c, r->id, err ? err : TANDEM_EINTERNAL, "engine: %s",
                               tandem_strerror(err ? err : TANDEM_EINTERNAL));
        }
        Tandem__TokenChunk last;
        struct wk_tops t;
        if (attach) {
            chunk_build(r, &last, &t);
        }
        wk_core_send_finish(c, r->id, fr, (uint32_t)usage->prompt_tokens,
                            (uint32_t)usage->completion_tokens, (uint32_t)usage->cached_tokens,
                            attach ? &last : NULL);
        if (attach) {
            chunk_sent(r, &t);
        }
    }
    wk_core_count_finish(c, name);
    metrics_histogram_observe(c->m.e2e, wk_core_now(c) - r->t_job);
    dreq_free(c, r);
}

static void on_prompt_logprobs(void *arg, uint64_t id, void *user, int first, int n,
                               const float *logprob, const struct sampler_top *top, int n_top)
{
    struct wk_core *c = arg;
    (void)user;
    if (state(c)->silent) {
        return;
    }
    Tandem__PromptLogprobs p = TANDEM__PROMPT_LOGPROBS__INIT;
    p.first_index = (uint32_t)first;
    p.n_logprobs = (size_t)n;
    p.logprobs = (float *)logprob;
    struct wk_tops t = {0};
    if (n_top > 0 && wk_tops_build(&t, n, top, n_top, NULL, n_top) == 0) {
        p.n_top_logprobs = (size_t)n;
        p.top_logprobs = t.ptrs;
    }
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__PROMPT_LOGPROBS, id, &p);
    wk_core_send_control(c, &env);
    wk_tops_free(&t);
}

/* ---- Jobs --------------------------------------------------------------- */

static void copy_stops(struct dreq *r, const Tandem__SamplingParams *sp)
{
    r->n_stop = (int)sp->n_stop_token_ids;
    if (r->n_stop > 0) {
        memcpy(r->stop, sp->stop_token_ids, (size_t)r->n_stop * sizeof(*r->stop));
    }
    r->ignore_eos = sp->ignore_eos;
    r->logprobs = (int)sp->logprobs;
}

static void submit_local(struct wk_core *c, struct dreq *r, const Tandem__DecodeJob *dj)
{
    struct dstate *ds = state(c);
    int n_gen = r->n_total - r->n_prompt;
    struct sched_request sr = {
        .id = r->id,
        .user = r,
        .prompt = r->prompt,
        .n_prompt = r->n_total,
        .n_generated = n_gen,
        .max_tokens = (int)dj->max_tokens,
        .stop_ids = r->stop,
        .n_stop = r->n_stop,
        .ignore_eos = r->ignore_eos,
        .sampling = r->sp,
        .logprobs = r->logprobs,
        .prompt_logprobs = dj->sampling->prompt_logprobs,
        .prompt_top = r->logprobs,
        .mode = SCHED_MODE_FULL,
    };
    r->phase = DR_SCHED;
    int rc = u64_map_put(&ds->reqs, r->id, r);
    if (rc == 0) {
        rc = sched_submit(c->sched, &sr);
        if (rc != 0) {
            u64_map_del(&ds->reqs, r->id);
        }
    }
    if (rc != 0) {
        refuse(c, r->id, (uint32_t)r->n_prompt, rc, "engine refused the request: %s",
               tandem_strerror(rc));
        r->phase = DR_SCHED;
        free(r->prompt);
        free(r);
        return;
    }
    r->first_pend = n_gen;
}

/* Disaggregated: reserve, then ask P for what D does not hold. */
static void start_transfer(struct wk_core *c, struct dreq *r, const Tandem__DecodeJob *dj)
{
    struct dstate *ds = state(c);
    int bs = c->block_size;
    r->max_tokens = (int)dj->max_tokens;
    r->n_full = r->n_prompt / bs;
    r->n_blocks = (r->n_prompt + bs - 1) / bs;
    r->hashes = malloc((size_t)(r->n_full > 0 ? r->n_full : 1) * sizeof(*r->hashes));
    r->got = calloc((size_t)r->n_blocks, 1);
    kv_seq_init(&r->kv, c->root);
    r->phase = DR_TRANSFER;
    c->n_outside++; /* dreq_free undoes it from here on */
    if (r->hashes == NULL || r->got == NULL || u64_map_put(&ds->reqs, r->id, r) != 0) {
        refuse(c, r->id, (uint32_t)r->n_prompt, TANDEM_ENOMEM, "out of memory");
        dreq_free(c, r);
        return;
    }
    bh_hash_prompt(c->root, r->prompt, r->n_prompt, bs, r->hashes);
    /* Every full block may match: D still needs P's first token. */
    int matched = kv_seq_match(c->pool, &r->kv, r->prompt, r->n_prompt);
    if (matched < 0) {
        fail_transfer(c, r, matched, "prefix lookup failed: %s", tandem_strerror(matched));
        return;
    }
    int rc = kv_seq_grow(c->pool, &r->kv, r->n_prompt);
    if (rc != 0) {
        struct kv_stats ks;
        kv_pool_stats(c->pool, &ks);
        char detail[160];
        snprintf(detail, sizeof(detail), "%d KV blocks needed, %d free or evictable of %d",
                 r->n_blocks - matched / bs, ks.free + ks.cached_idle, ks.total);
        if (!ds->silent) {
            wk_core_send_busy(c, r->id,
                              rc == TANDEM_ENOSPACE ? TANDEM__BUSY__REASON__NO_KV_BLOCKS
                                                    : TANDEM__BUSY__REASON__TOO_MANY_SEQS,
                              detail);
        }
        LOG_INFO("decode", "request %llu: busy (%s)", (unsigned long long)r->id, detail);
        dreq_free(c, r);
        return;
    }
    r->skip = matched / bs;
    struct wk_link *p;
    rc = wk_core_link_get(c, dj->prefill_address, &p);
    if (rc == TANDEM_ETOOBIG) {
        if (!ds->silent) {
            wk_core_send_busy(c, r->id, TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE,
                              "too many peer sockets");
        }
        dreq_free(c, r);
        return;
    }
    if (rc != 0) {
        fail_transfer(c, r, rc, "prefill address '%s': %s", dj->prefill_address,
                      tandem_strerror(rc));
        return;
    }
    if (p->ever_up && !p->up) {
        /* It was connected and is not now: it died or restarts. Let the
         * router pick another rather than wait for the transfer timeout. */
        char detail[WIRE_MAX_ADDR_BYTES + 64];
        snprintf(detail, sizeof(detail), "prefill worker %s is not connected", p->addr);
        if (!ds->silent) {
            wk_core_send_busy(c, r->id, TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE, detail);
        }
        dreq_free(c, r);
        return;
    }
    r->peer = p;
    wk_core_link_ref(c, p);

    Tandem__SamplingParams sp = *dj->sampling;
    sp.optional_seed_case = TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED;
    sp.seed = r->sp.seed; /* P samples the first token with D's seed */
    sp.n_stop_token_ids = 0;
    sp.stop_token_ids = NULL;
    Tandem__PrefillJob pj = TANDEM__PREFILL_JOB__INIT;
    pj.n_prompt_token_ids = (size_t)r->n_prompt;
    pj.prompt_token_ids = r->prompt;
    pj.skip_blocks = (uint32_t)r->skip;
    pj.decode_kv_address = c->kv_addr;
    pj.sampling = &sp;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__PREFILL_JOB, r->id, &pj);
    r->t_sent = wk_core_now(c);
    rc = wk_core_link_send(c, p, &env, NULL, 0, 0);
    if (rc != 0) {
        if (!ds->silent) {
            wk_core_send_busy(c, r->id, TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE,
                              "cannot queue the prefill job");
        }
        dreq_free(c, r);
        return;
    }
    LOG_DEBUG("decode", "request %llu: %d prompt tokens, %d blocks held, %d asked from %s",
              (unsigned long long)r->id, r->n_prompt, r->skip, r->n_blocks - r->skip, p->addr);
}

static void handle_job(struct wk_core *c, uint64_t id, const Tandem__DecodeJob *dj)
{
    struct dstate *ds = state(c);
    uint32_t n_prompt = (uint32_t)dj->n_prompt_token_ids;
    if (u64_map_get(&ds->reqs, id) != NULL) {
        wk_core_reject(c, "control", "duplicate", "request %llu is already live",
                       (unsigned long long)id);
        wk_core_send_error(c, 0, TANDEM_EEXIST, "request %llu: duplicate id (already live)",
                           (unsigned long long)id);
        return;
    }
    if ((int64_t)ds->reqs.n >= (int64_t)c->cfg.max_running + c->cfg.max_waiting) {
        wk_core_send_busy(c, id, TANDEM__BUSY__REASON__TOO_MANY_SEQS, "queue full");
        return;
    }
    int n_total = (int)(dj->n_prompt_token_ids + dj->n_generated_token_ids);
    int vocab = c->be->info.vocab_size;
    for (size_t i = 0; i < dj->n_prompt_token_ids; i++) {
        if (dj->prompt_token_ids[i] >= (uint32_t)vocab) {
            refuse(c, id, n_prompt, TANDEM_EINVAL,
                   "prompt token %zu: id %u outside the vocabulary (%d)", i,
                   dj->prompt_token_ids[i], vocab);
            return;
        }
    }
    for (size_t i = 0; i < dj->n_generated_token_ids; i++) {
        if (dj->generated_token_ids[i] >= (uint32_t)vocab) {
            refuse(c, id, n_prompt, TANDEM_EINVAL,
                   "generated token %zu: id %u outside the vocabulary", i,
                   dj->generated_token_ids[i]);
            return;
        }
    }
    if (dj->sampling->n_stop_token_ids > SCHED_MAX_STOP) {
        refuse(c, id, n_prompt, TANDEM_EINVAL, "%zu stop token ids, at most %d",
               dj->sampling->n_stop_token_ids, SCHED_MAX_STOP);
        return;
    }
    if (n_total >= c->max_context) {
        refuse(c, id, n_prompt, TANDEM_ETOOBIG, "%d tokens, context limit %d", n_total,
               c->max_context);
        return;
    }
    if (dj->sampling->prompt_logprobs && c->be->info.emits_tokens) {
        refuse(c, id, n_prompt, TANDEM_EUNSUPPORTED,
               "prompt logprobs need a backend with logits (not %s)", c->be->ops->name);
        return;
    }
    void *mem = NULL; /* on a cache line: its head is what each token touches */
    struct dreq *r = posix_memalign(&mem, 64, sizeof(*r)) == 0 ? memset(mem, 0, sizeof(*r)) : NULL;
    uint32_t *prompt = malloc((size_t)n_total * sizeof(*prompt));
    if (r == NULL || prompt == NULL) {
        free(r);
        free(prompt);
        refuse(c, id, n_prompt, TANDEM_ENOMEM, "out of memory");
        return;
    }
    memcpy(prompt, dj->prompt_token_ids, n_prompt * sizeof(*prompt));
    if (dj->n_generated_token_ids > 0) {
        memcpy(prompt + n_prompt, dj->generated_token_ids,
               dj->n_generated_token_ids * sizeof(*prompt));
    }
    r->id = id;
    r->prompt = prompt;
    r->n_prompt = (int)n_prompt;
    r->n_total = n_total;
    r->t_job = wk_core_now(c);
    r->sp = wk_core_sampling(c, id, dj->sampling);
    r->hold = dj->hold_tokens;
    copy_stops(r, dj->sampling);
    /* Recovery always prefills locally: prompt + generated is a new prefix
     * that no prefill worker was asked for (docs/protocol.md). A job naming
     * this worker's own data address is local too (a decode worker is not a
     * prefill worker). */
    if (ds->colocated || dj->prefill_address[0] == '\0' || dj->n_generated_token_ids > 0 ||
        strcmp(dj->prefill_address, c->kv_addr) == 0) {
        submit_local(c, r, dj);
    } else {
        start_transfer(c, r, dj);
    }
}

static void handle_cancel(struct wk_core *c, uint64_t id)
{
    struct dreq *r = u64_map_get(&state(c)->reqs, id);
    if (r == NULL) {
        LOG_DEBUG("decode", "cancel for request %llu, which is not live", (unsigned long long)id);
        return;
    }
    if (r->phase == DR_TRANSFER) {
        send_cancel_to_prefill(c, r);
        end_outside(c, r, TANDEM__FINISH__REASON__CANCELLED, 0, "cancelled");
    } else {
        sched_cancel(c->sched, id);
    }
}

static void on_control(struct wk_core *c, const Tandem__Envelope *env)
{
    if (env->kind == TANDEM__ENVELOPE__KIND__DECODE_JOB) {
        handle_job(c, env->request_id, env->decode_job);
    } else if (env->kind == TANDEM__ENVELOPE__KIND__CANCEL) {
        handle_cancel(c, env->request_id);
    }
}

/* ---- Data link: frames from prefill workers ----------------------------- */

static struct dreq *transfer_of(struct wk_core *c, uint64_t id)
{
    struct dreq *r = u64_map_get(&state(c)->reqs, id);
    if (r == NULL || r->phase != DR_TRANSFER) {
        return NULL;
    }
    r->peer->last_rx_s = wk_core_now(c);
    return r;
}

static void install_frame(struct wk_core *c, const struct wire_frame *f)
{
    const Tandem__KvFrameHeader *h = f->env->kv_frame;
    uint64_t id = f->env->request_id;
    struct dreq *r = transfer_of(c, id);
    if (r == NULL) {
        wk_core_reject_frame(c, "unknown_request", "request %llu is not receiving KV",
                             (unsigned long long)id);
        return;
    }
    int bs = c->block_size;
    uint32_t idx = h->block_index;
    if (idx >= (uint32_t)r->n_blocks || idx < (uint32_t)r->skip) {
        wk_core_reject_frame(c, "block_index", "request %llu: block %u outside [%d, %d)",
                             (unsigned long long)id, idx, r->skip, r->n_blocks);
        return;
    }
    if (r->got[idx]) {
        wk_core_reject_frame(c, "duplicate", "request %llu: block %u already installed",
                             (unsigned long long)id, idx);
        return;
    }
    uint32_t want_tc =
        (int)idx < r->n_full ? (uint32_t)bs : (uint32_t)(r->n_prompt - (int)idx * bs);
    if (h->token_count != want_tc) {
        wk_core_reject_frame(c, "token_count", "request %llu: block %u has %u tokens, expected %u",
                             (unsigned long long)id, idx, h->token_count, want_tc);
        return;
    }
    if (h->dtype != (Tandem__KvDtype)(c->dtype + 1)) {
        wk_core_reject_frame(c, "dtype", "request %llu: block %u in dtype %d, pool is %s",
                             (unsigned long long)id, idx, (int)h->dtype, kv_dtype_name(c->dtype));
        return;
    }
    if (h->first_layer != 0 || h->layer_count != (uint32_t)c->be->info.n_layers) {
        wk_core_reject_frame(
            c, "layers", "request %llu: block %u has layers [%u, +%u), want all %d",
            (unsigned long long)id, idx, h->first_layer, h->layer_count, c->be->info.n_layers);
        return;
    }
    if (f->payload_len != c->block_bytes) {
        wk_core_reject_frame(c, "size", "request %llu: block %u of %zu bytes, blocks here are %zu",
                             (unsigned long long)id, idx, f->payload_len, c->block_bytes);
        return;
    }
    /* Full blocks: the chained hash of D's own copy of the prompt. A partial
     * last block has no name: 0 (docs/protocol.md). */
    uint64_t want = (int)idx < r->n_full ? r->hashes[idx] : 0;
    if (h->block_hash != want) {
        wk_core_reject_frame(c, "hash",
                             "request %llu: block %u hash %016llx, D's copy of the prompt gives "
                             "%016llx",
                             (unsigned long long)id, idx, (unsigned long long)h->block_hash,
                             (unsigned long long)want);
        return;
    }
    uint8_t *dst = kv_block_data(c->pool, r->kv.blocks[idx]);
    if (f->payload_len > 0) {
        memcpy(dst, f->payload, f->payload_len);
    }
    r->got[idx] = 1;
    r->received++;
    metrics_counter_add(c->m.kv_bytes_received, (double)f->payload_len);
    metrics_counter_inc(c->m.kv_frames_installed);
    wk_core_kv_dump(c, "installed", id, idx, want, dst, f->payload_len);
    /* Monotonic times for bench/xfer: first and last block of the transfer. */
    if (r->received == 1 || r->received == r->n_blocks - r->skip) {
        LOG_DEBUG("xfer", "request %llu: block %u installed at %.6f (%d of %d)",
                  (unsigned long long)id, idx, wk_core_now(c), r->received, r->n_blocks - r->skip);
    }
}

static void prefill_done(struct wk_core *c, uint64_t id, const Tandem__PrefillDone *d)
{
    struct dreq *r = transfer_of(c, id);
    if (r == NULL) {
        wk_core_reject(c, "data", "unknown_request", "prefill_done for request %llu",
                       (unsigned long long)id);
        return;
    }
    int expected = r->n_blocks - r->skip;
    if (r->received != expected) {
        fail_transfer(c, r, TANDEM_EPROTO,
                      "prefill worker %s finished with %d of %d blocks installed (%u sent)",
                      r->peer->addr, r->received, expected, d->blocks_sent);
        return;
    }
    int cached = (int)d->cached_tokens < r->n_prompt ? (int)d->cached_tokens : r->n_prompt;
    if (cached > r->kv.n_cached_tokens) {
        r->kv.n_cached_tokens = cached;
    }
    int rc = kv_seq_commit(c->pool, &r->kv, r->prompt, r->n_prompt);
    if (rc < 0) {
        fail_transfer(c, r, rc, "commit of received blocks failed: %s", tandem_strerror(rc));
        return;
    }
    metrics_histogram_observe(c->m.kv_transfer, wk_core_now(c) - r->t_sent);
    struct sampler_top top[WIRE_MAX_LOGPROBS];
    int n_top = 0;
    if (d->first_top_logprobs != NULL) {
        n_top = (int)d->first_top_logprobs->n_token_ids;
        for (int i = 0; i < n_top; i++) {
            top[i].token = d->first_top_logprobs->token_ids[i];
            top[i].logprob = d->first_top_logprobs->logprobs[i];
        }
    }
    if (n_top > r->logprobs) {
        n_top = r->logprobs;
    }
    struct sched_request sr = {
        .id = r->id,
        .user = r,
        .prompt = r->prompt,
        .n_prompt = r->n_prompt,
        .max_tokens = r->max_tokens,
        .stop_ids = r->stop,
        .n_stop = r->n_stop,
        .ignore_eos = r->ignore_eos,
        .sampling = r->sp,
        .logprobs = r->logprobs,
        .prompt_logprobs = 0, /* P reported them */
        .mode = SCHED_MODE_PREFILLED,
        .kv = &r->kv,
        .first_token = d->first_token,
        .first_logprob = d->first_logprob,
        .first_top = top,
        .n_first_top = n_top,
    };
    rc = sched_submit(c->sched, &sr);
    if (rc != 0) {
        fail_transfer(c, r, rc, "engine refused the prefilled request: %s", tandem_strerror(rc));
        return;
    }
    /* The scheduler owns the blocks now. */
    r->phase = DR_SCHED;
    c->n_outside--;
    wk_core_link_unref(c, r->peer);
    r->peer = NULL;
    free(r->got);
    r->got = NULL;
    kv_seq_fini(&r->kv);
    /* P's first token goes out now, not with the first decode step's: a
     * client's first chunk then holds one token and TTFT is not a step late. */
    if (sched_admit(c->sched) > 0) {
        after_step(c);
    }
}

static void on_data(struct wk_core *c, const struct wire_frame *f)
{
    const Tandem__Envelope *env = f->env;
    struct dreq *r;
    switch (env->kind) {
    case TANDEM__ENVELOPE__KIND__KV_FRAME:
        install_frame(c, f);
        return;
    case TANDEM__ENVELOPE__KIND__PREFILL_DONE:
        prefill_done(c, env->request_id, env->prefill_done);
        return;
    case TANDEM__ENVELOPE__KIND__PROMPT_LOGPROBS:
        if (transfer_of(c, env->request_id) == NULL) {
            wk_core_reject(c, "data", "unknown_request", "prompt_logprobs for request %llu",
                           (unsigned long long)env->request_id);
        } else if (!state(c)->silent) {
            wk_core_send_control(c, env); /* forwarded as is */
        }
        return;
    case TANDEM__ENVELOPE__KIND__ERROR:
        if (env->request_id == 0) {
            LOG_WARN("decode", "a prefill worker reports: %s (%s)", env->error->message,
                     tandem_errname(env->error->code));
            return;
        }
        r = transfer_of(c, env->request_id);
        if (r == NULL) {
            wk_core_reject(c, "data", "unknown_request", "error for request %llu",
                           (unsigned long long)env->request_id);
            return;
        }
        fail_transfer(c, r, env->error->code, "prefill worker %s: %s", r->peer->addr,
                      env->error->message);
        return;
    case TANDEM__ENVELOPE__KIND__BUSY:
        r = transfer_of(c, env->request_id);
        if (r == NULL) {
            wk_core_reject(c, "data", "unknown_request", "busy for request %llu",
                           (unsigned long long)env->request_id);
            return;
        }
        if (!state(c)->silent) {
            char detail[WIRE_MAX_TEXT_BYTES];
            snprintf(detail, sizeof(detail), "prefill worker %s busy: %s", r->peer->addr,
                     env->busy->detail);
            wk_core_send_busy(c, r->id, TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE, detail);
        }
        dreq_free(c, r);
        return;
    default:
        wk_core_reject(c, "data", "unexpected_kind", "%s is not sent to a decode worker",
                       wire_kind_name(env->kind));
        return;
    }
}

/* ---- Link events, timeouts, shutdown ------------------------------------ */

/* Collects the live requests (the map must not change while iterating). */
static struct dreq **snapshot(struct wk_core *c, size_t *n)
{
    struct dstate *ds = state(c);
    struct dreq **all = malloc((ds->reqs.n + 1) * sizeof(*all));
    *n = 0;
    if (all == NULL) {
        return NULL;
    }
    size_t it = 0;
    uint64_t key;
    void *val;
    while (u64_map_next(&ds->reqs, &it, &key, &val)) {
        all[(*n)++] = val;
    }
    return all;
}

static void on_link(struct wk_core *c, struct wk_link *p, int up)
{
    if (up) {
        return;
    }
    size_t n;
    struct dreq **all = snapshot(c, &n);
    for (size_t i = 0; all && i < n; i++) {
        struct dreq *r = all[i];
        if (r->phase == DR_TRANSFER && r->peer == p) {
            fail_transfer(c, r, TANDEM_ECLOSED, "prefill worker %s went away mid-transfer",
                          p->addr);
        }
    }
    free(all);
}

static void on_tick(struct wk_core *c, double now)
{
    size_t n;
    struct dreq **all = snapshot(c, &n);
    double limit = c->cfg.transfer_timeout_ms / 1000.0;
    for (size_t i = 0; all && i < n; i++) {
        struct dreq *r = all[i];
        if (r->phase != DR_TRANSFER) {
            continue;
        }
        double last = r->peer->last_rx_s > r->t_sent ? r->peer->last_rx_s : r->t_sent;
        if (now - last > limit) {
            send_cancel_to_prefill(c, r);
            fail_transfer(c, r, TANDEM_ETIMEOUT, "no progress from prefill worker %s for %llu ms",
                          r->peer->addr, (unsigned long long)((now - last) * 1000.0));
        }
    }
    free(all);
}

/* Ends every request: reason for the ones outside the scheduler, the
 * scheduler's cancel (reported per ds->aborting) for the others. */
static void end_all(struct wk_core *c, Tandem__Finish__Reason reason)
{
    size_t n;
    struct dreq **all = snapshot(c, &n);
    for (size_t i = 0; all && i < n; i++) {
        struct dreq *r = all[i];
        if (r->phase == DR_TRANSFER) {
            send_cancel_to_prefill(c, r);
            end_outside(c, r, reason, 0, "ended");
        } else {
            sched_cancel(c->sched, r->id);
        }
    }
    free(all);
}

static void on_control_down(struct wk_core *c)
{
    struct dstate *ds = state(c);
    size_t n = ds->reqs.n;
    if (n > 0) {
        LOG_WARN("decode", "router gone: cancelling %zu requests", n);
    }
    ds->silent = 1;
    end_all(c, TANDEM__FINISH__REASON__CANCELLED);
    ds->silent = 0;
}

static void stop(struct wk_core *c)
{
    struct dstate *ds = state(c);
    ds->aborting = 1;
    end_all(c, TANDEM__FINISH__REASON__ABORT);
}

static int init_common(struct wk_core *c, int colocated)
{
    struct dstate *ds = calloc(1, sizeof(*ds));
    if (ds == NULL) {
        return TANDEM_ENOMEM;
    }
    u64_map_init(&ds->reqs);
    ds->colocated = colocated;
    c->role_state = ds;
    return 0;
}

static int init_decode(struct wk_core *c)
{
    return init_common(c, 0);
}

static int init_colocated(struct wk_core *c)
{
    return init_common(c, 1);
}

static void fini(struct wk_core *c)
{
    struct dstate *ds = state(c);
    if (ds == NULL) {
        return;
    }
    size_t n;
    struct dreq **all = snapshot(c, &n);
    for (size_t i = 0; all && i < n; i++) {
        /* Still here only if stop never ran (startup failed). */
        if (all[i]->phase == DR_SCHED) {
            sched_cancel(c->sched, all[i]->id);
        } else {
            dreq_free(c, all[i]);
        }
    }
    free(all);
    u64_map_fini(&ds->reqs);
    free(ds->dirty);
    free(ds);
    c->role_state = NULL;
}

#define DECODE_OPS                                                                                 \
    .fini = fini, .on_control = on_control, .on_data = on_data,                                    \
    .on_control_down = on_control_down, .on_link = on_link, .on_tick = on_tick,                    \
    .after_step = after_step, .stop = stop,                                                        \
    .sched = {                                                                                     \
        .on_token = on_token, .on_finish = on_finish, .on_prompt_logprobs = on_prompt_logprobs}

const struct worker_role decode_role = {
    .name = "decode",
    .hello = TANDEM__WORKER_HELLO__ROLE__DECODE,
    .init = init_decode,
    DECODE_OPS,
};

const struct worker_role colocated_role = {
    .name = "colocated",
    .hello = TANDEM__WORKER_HELLO__ROLE__COLOCATED,
    .init = init_colocated,
    DECODE_OPS,
};
