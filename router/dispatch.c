/* The router's request lifecycle: see dispatch.h. */
#include "dispatch.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "block_hash.h"
#include "log.h"
#include "tandem_err.h"
#include "tandem_rng.h"

#define KICK_ON_UP 64 /* queued requests tried when an endpoint comes back */

enum rq_state {
    RQ_NEW = 0,
    RQ_PENDING,  /* in the pending queue */
    RQ_RUNNING,  /* an attempt is on a worker */
    RQ_STOPPING, /* a stop string ended it: Cancel sent, waiting for the Finish */
};

/* An attempt at running a request on a worker. It lives inside its request
 * (one at a time): a token chunk finds both in the same few cache lines. */
struct rt_attempt {
    struct rt_req *req;
    int ep;          /* decode endpoint */
    int consumed;    /* tokens of st handed to the output */
    int n_generated; /* recovery: tokens given as generated_token_ids */
    int got_first;
    uint64_t wire_id;
    struct ctl_stream st; /* count_only: the tokens are read from each chunk */
    int prefill_ep;       /* remote prefill endpoint, -1 */
    struct rt_ticket ticket;
    uint64_t decision_seq;
};

/* What each token chunk touches comes first: the request's head, its
 * attempt's head, its output's head. Allocated on a cache line. */
struct rt_req {
    struct rt_dispatch *d;
    void *sink; /* where the answer goes (deps.sink ops) */
    enum rq_state state;
    int started;   /* SSE headers sent */
    uint32_t *gen; /* (cap_gen) tokens accepted so far */
    int n_gen, cap_gen;
    double t_arrive, t_last;
    struct rt_attempt *att; /* &att_mem while an attempt runs, else NULL */
    struct rt_attempt att_mem;
    struct oa_output out;
    struct rt_req *prev, *next; /* live list */
    struct rt_req *qnext;       /* pending queue */
    enum oa_kind kind;
    struct oa_prompt prompt;
    uint64_t *hashes; /* (n_hashes) */
    int n_hashes;
    char *session; /* owned, or NULL */
    size_t session_len;
    struct ctl_job job; /* template; prompt, generated and prefill set per attempt */
    uint32_t stop_ids[OA_MAX_STOP_IDS];
    int *exclude; /* (cap_exclude) endpoints not to pick again */
    int n_exclude, cap_exclude;
    int n_busy_excluded;
    int failures;                  /* attempts lost (retries used) */
    int held;                      /* waiting in the queue for want of any endpoint */
    double hold_start, hold_until; /* deps.now() seconds, while held */
    double deadline;               /* deps.now() seconds */
    char last_error[160];
};

static double now_s(const struct rt_dispatch *d)
{
    return d->deps.now(d->deps.arg);
}

/* ---- Requests ----------------------------------------------------------- */

static void kick_pending(struct rt_dispatch *d, int credit);

/* A zeroed request on a cache line of its own (its head is what every token
 * chunk touches), or NULL. */
static struct rt_req *req_alloc(void)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, sizeof(struct rt_req)) != 0) {
        return NULL;
    }
    memset(p, 0, sizeof(struct rt_req));
    return p;
}

static void attempt_fini(struct rt_attempt *a)
{
    ctl_stream_fini(&a->st);
}

/* Ends the current attempt's bookkeeping: releases its pipeline charge,
 * forgets its wire id. Sends Cancel first when cancel (the worker may still
 * run it). */
static void attempt_end(struct rt_req *q, int cancel)
{
    struct rt_attempt *a = q->att;
    if (a == NULL) {
        return;
    }
    struct rt_dispatch *d = q->d;
    if (cancel) {
        int rc = d->deps.send_cancel(d->deps.arg, a->ep, a->wire_id);
        if (rc != 0 && rc != TANDEM_ENOENT) {
            LOG_WARN("dispatch", "request %llu: cannot send Cancel: %s",
                     (unsigned long long)a->wire_id, tandem_strerror(rc));
        }
    }
    rt_pipeline_release(d->deps.pl, &a->ticket, RT_RELEASE_ALL);
    u64_map_del(&d->attempts, a->wire_id);
    attempt_fini(a);
    q->att = NULL;
    d->n_running--;
}

static void pending_remove(struct rt_dispatch *d, struct rt_req *q)
{
    struct rt_req *prev = NULL;
    for (struct rt_req *p = d->pend_head; p; prev = p, p = p->qnext) {
        if (p == q) {
            if (prev) {
                prev->qnext = p->qnext;
            } else {
                d->pend_head = p->qnext;
            }
            if (d->pend_tail == p) {
                d->pend_tail = prev;
            }
            d->n_pending--;
            q->qnext = NULL;
            return;
        }
    }
}

/* Frees the request; the HTTP response must have been answered (or the
 * client is gone). */
static void req_free(struct rt_req *q)
{
    struct rt_dispatch *d = q->d;
    attempt_end(q, 0);
    if (q->state == RQ_PENDING) {
        pending_remove(d, q);
    }
    if (q->held) {
        q->held = 0;
        d->n_held--;
    }
    if (q->prev) {
        q->prev->next = q->next;
    } else {
        d->live = q->next;
    }
    if (q->next) {
        q->next->prev = q->prev;
    }
    d->n_live--;
    d->deps.sink->release(q->sink);
    oa_output_fini(&q->out);
    oa_prompt_fini(&q->prompt);
    free(q->hashes);
    free(q->session);
    free(q->exclude);
    free(q->gen);
    free(q);
}

static const char *const json_headers[] = {"Content-Type", "application/json", NULL};

/* Answers an error before anything was sent. */
static void respond_error(struct rt_dispatch *d, void *sink, const struct oa_error *e)
{
    char *json = oa_error_json(e);
    const char *retry[] = {"Content-Type", "application/json", "Retry-After", "1", NULL};
    d->deps.sink->respond(sink, e->status, e->status == 429 ? retry : json_headers, json,
                          json ? strlen(json) : 0);
    free(json);
    rt_metrics_request(d->deps.m, e->status);
    d->stats.rejected++;
}

/* Starts the SSE stream, with the chat role chunk, once. */
static void sse_start(struct rt_req *q)
{
    if (q->started) {
        return;
    }
    q->started = 1;
    const struct rt_sink_ops *ops = q->d->deps.sink;
    ops->start_sse(q->sink);
    char *first = NULL;
    if (oa_output_begin(&q->out, &first) == 0 && first != NULL) {
        ops->write_sse(q->sink, first, strlen(first));
        free(first);
    }
}

/* Writes one SSE event (taking json), starting the stream first. */
static void sse_write(struct rt_req *q, char *json)
{
    sse_start(q);
    if (json != NULL) {
        q->d->deps.sink->write_sse(q->sink, json, strlen(json));
        free(json);
    }
}

/* The generation is over: the response (or the stream's end) goes out and
 * the request is freed. */
static void finish_ok(struct rt_req *q, enum oa_finish reason, int cached)
{
    struct rt_dispatch *d = q->d;
    const struct rt_sink_ops *ops = d->deps.sink;
    struct rt_metrics *m = d->deps.m;
    char *body = NULL, *usage = NULL;
    int n_prompt = q->prompt.n_ids;
    if (q->out.stream) {
        sse_start(q);
    }
    int rc =
        oa_output_finish(&q->out, reason, n_prompt, cached, &body, q->out.stream ? &usage : NULL);
    if (rc != 0) {
        struct oa_error e;
        oa_error_internal(&e, "cannot render the response");
        if (!q->started) {
            respond_error(d, q->sink, &e);
        } else {
            ops->end(q->sink);
        }
        req_free(q);
        return;
    }
    if (q->out.stream) {
        sse_write(q, body);
        if (usage != NULL) {
            sse_write(q, usage);
        }
        ops->write_sse(q->sink, "[DONE]", 6);
        ops->end(q->sink);
    } else {
        ops->respond(q->sink, 200, json_headers, body, strlen(body));
        free(body);
    }
    double t = now_s(d);
    metrics_histogram_observe(m->e2e, t - q->t_arrive);
    metrics_counter_add(m->prompt_tokens, n_prompt);
    metrics_counter_add(m->generation_tokens, q->out.n_tokens);
    rt_metrics_request(m, 200);
    d->stats.completed++;
    req_free(q);
}

/* Gives up on a request: an error status before anything was streamed, the
 * stream's end with finish_reason "abort" after. */
static void finish_failed(struct rt_req *q, int status, const char *code, const char *msg)
{
    struct rt_dispatch *d = q->d;
    attempt_end(q, 1);
    if (q->started) {
        char *body = NULL, *usage = NULL;
        if (oa_output_finish(&q->out, OA_FINISH_ABORT, q->prompt.n_ids, 0, &body, &usage) == 0) {
            sse_write(q, body);
            if (usage != NULL) {
                sse_write(q, usage);
            }
        }
        d->deps.sink->write_sse(q->sink, "[DONE]", 6);
        d->deps.sink->end(q->sink);
        rt_metrics_request(d->deps.m, 200);
    } else {
        struct oa_error e;
        oa_error_set(&e, status, status < 500 ? "invalid_request_error" : "server_error", NULL,
                     code, "%s", msg);
        respond_error(d, q->sink, &e);
    }
    req_free(q);
}

static int exclude_add(struct rt_req *q, int ep)
{
    for (int i = 0; i < q->n_exclude; i++) {
        if (q->exclude[i] == ep) {
            return 0;
        }
    }
    if (q->n_exclude == q->cap_exclude) {
        int cap = q->cap_exclude ? 2 * q->cap_exclude : 4;
        int *x = realloc(q->exclude, (size_t)cap * sizeof(*x));
        if (x == NULL) {
            return TANDEM_ENOMEM;
        }
        q->exclude = x;
        q->cap_exclude = cap;
    }
    q->exclude[q->n_exclude++] = ep;
    return 0;
}

static void dispatch_req(struct rt_req *q);

/* Parks q in the pending queue. Returns 0, or 1 when the queue is full:
 * then q was answered 429 and freed (a request already streaming is never
 * refused). */
static int park(struct rt_req *q)
{
    struct rt_dispatch *d = q->d;
    if (d->n_pending >= d->deps.max_pending && q->n_gen == 0) {
        struct oa_error e;
        oa_error_saturated(&e, RT_RETRY_AFTER_S);
        respond_error(d, q->sink, &e);
        req_free(q);
        return 1;
    }
    q->state = RQ_PENDING;
    q->qnext = NULL;
    if (d->pend_tail) {
        d->pend_tail->qnext = q;
    } else {
        d->pend_head = q;
    }
    d->pend_tail = q;
    d->n_pending++;
    return 0;
}

/* ---- Holding: no endpoint at all ----------------------------------------- */

/* q (parked) starts waiting for an endpoint: until hold_ms from now, never
 * past its deadline. */
static void hold_begin(struct rt_req *q)
{
    struct rt_dispatch *d = q->d;
    double now = now_s(d);
    q->held = 1;
    q->hold_start = now;
    q->hold_until = now + (double)d->deps.hold_ms * 1e-3;
    if (q->hold_until > q->deadline) {
        q->hold_until = q->deadline;
    }
    d->stats.held++;
    if (d->n_held++ == 0) {
        LOG_WARN("dispatch",
                 "no healthy decode endpoint: holding requests up to %d ms for one to join "
                 "(--hold-timeout-ms)",
                 d->deps.hold_ms);
    }
}

/* q stops waiting (sent, expired, aborted): its wait is observed in
 * tandem:request_hold_seconds{outcome}. */
static void hold_end(struct rt_req *q, struct metrics_series *outcome)
{
    struct rt_dispatch *d = q->d;
    if (!q->held) {
        return;
    }
    q->held = 0;
    double waited = now_s(d) - q->hold_start;
    metrics_histogram_observe(outcome, waited);
    if (--d->n_held == 0) {
        LOG_INFO("dispatch", "no request held any more (the last waited %.3f s)", waited);
    }
}

/* A held request whose hold ran out: the 503 a request without any
 * endpoint gets, saying how long it waited and what to do. */
static void hold_expire(struct rt_req *q)
{
    struct rt_dispatch *d = q->d;
    double waited = now_s(d) - q->hold_start;
    hold_end(q, d->deps.m->hold_expired);
    d->stats.hold_expired++;
    char msg[320];
    snprintf(msg, sizeof(msg),
             "No healthy decode endpoint is available: none joined while the router held the "
             "request for %.1f s. Check that the decode workers are running (GET /v1/cluster "
             "lists the healthy ones) and try again; the router's --hold-timeout-ms sets how "
             "long it waits.",
             waited);
    finish_failed(q, 503, "service_unavailable", msg);
}

/* A P/D decision that wanted a remote prefill and found no usable prefill
 * endpoint, while the cluster has one (down, or left out after a failure),
 * prefills on D instead: counted per decision, logged once per transition
 * (and once when remote prefills resume). A cluster without prefill workers
 * (colocated pools under a P/D routing) is not falling back. */
static void note_pd_fallback(struct rt_dispatch *d, const struct rt_decision *dec)
{
    if (dec->pd == RT_PD_LOCAL && dec->verdict.reason == RT_PD_REASON_NO_PREFILL_ENDPOINT &&
        rt_pipeline_has_prefill_endpoint(d->deps.pl)) {
        metrics_counter_inc(d->deps.m->pd_no_prefill);
        d->stats.pd_fallbacks++;
        if (!d->pd_fallback) {
            d->pd_fallback = 1;
            LOG_WARN("dispatch", "no prefill endpoint available: prefilling on the decode "
                                 "endpoints until one is back");
        }
    } else if (dec->pd == RT_PD_REMOTE && d->pd_fallback) {
        d->pd_fallback = 0;
        LOG_INFO("dispatch", "a prefill endpoint is back: remote prefills resume");
    }
}

/* Records a decision: metrics, decision log. */
static void note_decision(struct rt_dispatch *d, const struct rt_decision *dec)
{
    struct rt_metrics *m = d->deps.m;
    metrics_histogram_observe(m->decision_seconds, (double)dec->latency_ns * 1e-9);
    const struct rt_endpoint *de = rt_pipeline_endpoint(d->deps.pl, dec->decode);
    if (de != NULL) {
        rt_metrics_decision(m, de->id, de->role);
    }
    if (dec->pd == RT_PD_REMOTE) {
        const struct rt_endpoint *pe = rt_pipeline_endpoint(d->deps.pl, dec->prefill);
        if (pe != NULL) {
            rt_metrics_decision(m, pe->id, pe->role);
        }
        metrics_counter_inc(m->pd_remote);
    } else {
        metrics_counter_inc(m->pd_local);
    }
    note_pd_fallback(d, dec);
    if (d->deps.on_decision != NULL) {
        d->deps.on_decision(d->deps.arg, dec);
    }
}

/* Lost an attempt (failure or recovery case): retry or give up. */
static void attempt_failed(struct rt_req *q, int cancel, const char *why)
{
    struct rt_dispatch *d = q->d;
    struct rt_attempt *a = q->att;
    if (a != NULL) {
        const struct rt_endpoint *e = rt_pipeline_endpoint(d->deps.pl, a->ep);
        snprintf(q->last_error, sizeof(q->last_error), "%s on %s", why, e ? e->id : "?");
        exclude_add(q, a->ep);
        if (a->prefill_ep >= 0 && !a->got_first) {
            /* The decode worker may be reporting its prefill worker's loss
             * before the router sees that link drop: avoid both. */
            exclude_add(q, a->prefill_ep);
        }
        attempt_end(q, cancel);
    }
    if (q->state == RQ_STOPPING) {
        finish_ok(q, OA_FINISH_STOP, 0); /* the stop string already ended it */
        return;
    }
    if (q->n_gen >= (int)q->job.max_tokens ||
        q->prompt.n_ids + q->n_gen >= d->deps.max_context(d->deps.arg)) {
        finish_ok(q, OA_FINISH_LENGTH, 0); /* lost after its last token */
        return;
    }
    q->failures++;
    if (q->failures > d->deps.retries) {
        char msg[300];
        snprintf(msg, sizeof(msg), "The request failed on %d workers (last: %s); try again later.",
                 q->failures, q->last_error);
        LOG_WARN("dispatch", "giving up on a request: %s", q->last_error);
        finish_failed(q, 503, "service_unavailable", msg);
        return;
    }
    if (q->n_gen > 0) {
        d->stats.recoveries++;
        rt_metrics_retry(d->deps.m, "recovery");
        LOG_INFO("dispatch", "recovering a request after %d tokens: %s", q->n_gen, q->last_error);
    } else {
        d->stats.failures++;
        rt_metrics_retry(d->deps.m, "failure");
        LOG_INFO("dispatch", "retrying a request: %s", q->last_error);
    }
    dispatch_req(q);
}

/* Decides and sends a job for q (state NEW, PENDING taken out, or RUNNING
 * without an attempt). Ends q on a final failure. */
static void dispatch_req(struct rt_req *q)
{
    struct rt_dispatch *d = q->d;
    struct rt_pipeline *pl = d->deps.pl;
    uint64_t wire_id = d->next_wire_id++;
    if (wire_id == 0) {
        wire_id = d->next_wire_id++;
    }
    struct rt_request rq = {
        .id = wire_id,
        .response_id = q->out.id,
        .tokens = q->prompt.ids,
        .n_tokens = q->prompt.n_ids,
        .block_hashes = q->hashes,
        .n_blocks = q->n_hashes,
        .session = q->session,
        .session_len = q->session_len,
        .max_tokens = q->job.max_tokens,
        .exclude = q->exclude,
        .n_exclude = q->n_exclude,
    };
    const struct rt_decision *dec = NULL;
    int rc = rt_pipeline_decide(pl, &rq, &dec);
    if (rc == TANDEM_ENOENT && q->n_exclude > 0 && q->n_busy_excluded == 0) {
        /* Only endpoints that failed are left out: one that is healthy again
         * may take it (the retry budget bounds this). */
        q->n_exclude = 0;
        rq.n_exclude = 0;
        rc = rt_pipeline_decide(pl, &rq, &dec);
    }
    if (rc == TANDEM_ENOENT) {
        if (!q->held) {
            metrics_counter_inc(d->deps.m->decision_failures);
        }
        if (q->n_busy_excluded > 0) {
            park(q); /* every candidate is busy: wait for capacity */
            return;
        }
        if (d->deps.hold_ms > 0 && !d->closing) {
            /* No endpoint at all: wait for one to join (or come back). */
            if (park(q) == 0 && !q->held) {
                hold_begin(q);
            }
            return;
        }
        struct oa_error e;
        oa_error_no_endpoint(&e, "decode");
        finish_failed(q, e.status, e.code, e.message);
        return;
    }
    if (rc != 0) {
        finish_failed(q, 500, "internal_error", "Internal server error: routing failed.");
        return;
    }
    hold_end(q, d->deps.m->hold_sent);
    note_decision(d, dec);
    struct rt_attempt *a = &q->att_mem;
    memset(a, 0, sizeof(*a));
    a->req = q;
    a->wire_id = wire_id;
    a->ep = dec->decode;
    a->prefill_ep = dec->pd == RT_PD_REMOTE ? dec->prefill : -1;
    a->ticket = dec->ticket;
    a->decision_seq = dec->seq;
    a->n_generated = q->n_gen;
    ctl_stream_init(&a->st, wire_id);
    a->st.count_only = 1; /* on_tokens reads the tokens from each chunk */
    if (u64_map_put(&d->attempts, wire_id, a) != 0) {
        rt_pipeline_release(pl, &a->ticket, RT_RELEASE_ALL);
        attempt_fini(a);
        finish_failed(q, 500, "internal_error", "Internal server error: out of memory.");
        return;
    }
    q->att = a;
    q->state = RQ_RUNNING;
    d->n_running++;

    q->job.prompt = q->prompt.ids;
    q->job.n_prompt = q->prompt.n_ids;
    q->job.generated = q->n_gen > 0 ? q->gen : NULL;
    q->job.n_generated = q->n_gen;
    const struct rt_endpoint *pe =
        a->prefill_ep >= 0 ? rt_pipeline_endpoint(pl, a->prefill_ep) : NULL;
    q->job.prefill_address = pe != NULL ? pe->data_addr : "";
    rc = d->deps.send_job(d->deps.arg, a->ep, wire_id, &q->job);
    if (rc == TANDEM_ETIMEOUT || rc == TANDEM_ENOENT) {
        attempt_failed(q, 0, rc == TANDEM_ETIMEOUT ? "send queue full" : "link down");
    } else if (rc != 0) {
        finish_failed(q, 500, "internal_error", "Internal server error: cannot build the job.");
    }
}

/* ---- Tokens ------------------------------------------------------------- */

static int gen_push(struct rt_req *q, uint32_t t)
{
    if (q->n_gen == q->cap_gen) {
        int cap = q->cap_gen ? 2 * q->cap_gen : 64;
        uint32_t *g = realloc(q->gen, (size_t)cap * sizeof(*g));
        if (g == NULL) {
            return TANDEM_ENOMEM;
        }
        q->gen = g;
        q->cap_gen = cap;
    }
    q->gen[q->n_gen++] = t;
    return 0;
}

/* Streams what the token just given to q->out adds: one SSE event (none for
 * EOS or a stop id alone). */
static void stream_token(struct rt_req *q)
{
    sse_start(q);
    const struct rt_sink_ops *sk = q->d->deps.sink;
    const char *chunk;
    size_t len;
    int role;
    if (sk->delta != NULL && !q->out.logprobs) {
        if (oa_output_delta(&q->out, &chunk, &len, &role) == 1) {
            sk->delta(q->sink, chunk, len, role);
        }
    } else if (oa_output_chunk_ref(&q->out, &chunk, &len) == 0 && chunk != NULL) {
        sk->write_sse(q->sink, chunk, len);
    }
}

static void uncork(struct rt_req *q, int corked)
{
    if (corked) {
        q->d->deps.sink->batch(q->sink, 0);
    }
}

/* c: the chunk (a TokenChunk, or a Finish's last_tokens) whose tokens the stream just
 * counted (count_only). Returns 0, or -1 when it ended the attempt (q and a may be gone). */
static int on_tokens(struct rt_req *q, struct rt_attempt *a, const Tandem__TokenChunk *c)
{
    struct rt_dispatch *d = q->d;
    struct rt_metrics *m = d->deps.m;
    if (a->consumed == 0 && a->st.n_tokens > 0 && a->st.first_index != a->n_generated) {
        char why[96];
        snprintf(why, sizeof(why), "first token index %d, expected %d", a->st.first_index,
                 a->n_generated);
        attempt_failed(q, 1, why);
        return -1;
    }
    int n_new = a->st.n_tokens - a->consumed;
    if (n_new <= 0) {
        return 0;
    }
    double t = now_s(d);
    if (!a->got_first) {
        a->got_first = 1;
        rt_pipeline_release(d->deps.pl, &a->ticket, RT_RELEASE_PREFILL);
    }
    if (q->n_gen == 0) {
        metrics_histogram_observe(m->ttft, t - q->t_arrive);
    } else {
        double itl = (t - q->t_last) / n_new;
        for (int i = 0; i < n_new; i++) {
            metrics_histogram_observe(m->itl, itl);
        }
    }
    q->t_last = t;
    /* Several tokens (a worker that streams every few steps): one SSE event
     * each, as they would have come one by one, written together. */
    int corked = q->out.stream && n_new > 1 && d->deps.sink->batch != NULL;
    if (corked) {
        d->deps.sink->batch(q->sink, 1);
    }
    /* The chunk's tokens are the stream's new ones (count_only). */
    for (int k = 0; k < n_new && q->state == RQ_RUNNING; k++) {
        struct sampler_top top[CTL_MAX_TOP];
        int n_top = 0;
        if (c->n_top_logprobs > 0 && c->top_logprobs[k] != NULL) {
            const Tandem__TopLogprobs *tl = c->top_logprobs[k];
            n_top = tl->n_token_ids < CTL_MAX_TOP ? (int)tl->n_token_ids : (int)CTL_MAX_TOP;
            for (int i = 0; i < n_top; i++) {
                top[i].token = tl->token_ids[i];
                top[i].logprob = tl->logprobs[i];
            }
        }
        uint32_t tok = c->token_ids[k];
        int rc = oa_output_token(&q->out, tok, c->n_logprobs ? c->logprobs[k] : NAN, top, n_top);
        if (rc < 0) {
            LOG_WARN("dispatch", "request %llu: token %u refused: %s",
                     (unsigned long long)a->wire_id, tok, tandem_strerror(rc));
            a->consumed = a->st.n_tokens;
            uncork(q, corked);
            finish_failed(q, 500, "internal_error",
                          "Internal server error: the worker sent a token outside the "
                          "vocabulary.");
            return -1;
        }
        if (gen_push(q, tok) != 0) {
            a->consumed = a->st.n_tokens;
            uncork(q, corked);
            finish_failed(q, 500, "internal_error", "Internal server error: out of memory.");
            return -1;
        }
        if (rc == OA_STOPPED) {
            /* A stop string: cancel, and finish when the worker's Finish
             * brings the usage. */
            q->state = RQ_STOPPING;
            d->stats.stopped++;
            d->deps.send_cancel(d->deps.arg, a->ep, a->wire_id);
        }
        if (q->out.stream) {
            stream_token(q);
        }
    }
    a->consumed = a->st.n_tokens;
    uncork(q, corked);
    return 0;
}

static void on_prompt_logprobs(struct rt_req *q, const Tandem__PromptLogprobs *p)
{
    int n = (int)p->n_logprobs;
    int n_top = q->out.top_logprobs;
    struct sampler_top *top = NULL;
    if (n_top > 0 && p->n_top_logprobs == p->n_logprobs) {
        top = calloc((size_t)n * (size_t)n_top, sizeof(*top));
        if (top == NULL) {
            return;
        }
        for (int j = 0; j < n; j++) {
            const Tandem__TopLogprobs *t = p->top_logprobs[j];
            for (int i = 0; i < n_top; i++) {
                struct sampler_top *s = &top[(size_t)j * (size_t)n_top + (size_t)i];
                if ((size_t)i < t->n_token_ids) {
                    s->token = t->token_ids[i];
                    s->logprob = t->logprobs[i];
                } else {
                    s->token = 0;
                    s->logprob = -INFINITY;
                }
            }
        }
    } else {
        n_top = 0;
    }
    oa_output_prompt_logprobs(&q->out, (int)p->first_index, n, p->logprobs, top, n_top);
    free(top);
}

/* Worker errors that say the request itself is wrong: retrying elsewhere
 * would fail the same way. */
static int client_error(int code)
{
    return code == TANDEM_EINVAL || code == TANDEM_ETOOBIG || code == TANDEM_EUNSUPPORTED ||
           code == TANDEM_ERANGE;
}

static void on_finish(struct rt_req *q, struct rt_attempt *a)
{
    struct rt_dispatch *d = q->d;
    struct rt_metrics *m = d->deps.m;
    int reason = a->st.finish_reason;
    int cached = (int)a->st.cached_tokens;
    if (cached > q->prompt.n_ids) {
        cached = q->prompt.n_ids;
    }
    enum oa_finish fin;
    if (q->state == RQ_STOPPING) {
        fin = OA_FINISH_STOP;
    } else if (reason == TANDEM__FINISH__REASON__LENGTH) {
        fin = OA_FINISH_LENGTH;
    } else if (reason == TANDEM__FINISH__REASON__STOP) {
        fin = OA_FINISH_STOP;
    } else if (reason == TANDEM__FINISH__REASON__ERROR && client_error(a->st.error_code) &&
               q->n_gen == 0) {
        char msg[CTL_MAX_ERROR + 64];
        snprintf(msg, sizeof(msg), "The worker refused the request: %s", a->st.error);
        attempt_end(q, 0);
        finish_failed(q, 400, "invalid_value", msg);
        kick_pending(d, 1);
        return;
    } else {
        char why[CTL_MAX_ERROR + 64];
        snprintf(why, sizeof(why), "finished with %s%s%s",
                 reason == TANDEM__FINISH__REASON__ERROR       ? "an error"
                 : reason == TANDEM__FINISH__REASON__ABORT     ? "abort"
                 : reason == TANDEM__FINISH__REASON__CANCELLED ? "an unrequested cancel"
                                                               : "an unknown reason",
                 a->st.error[0] ? ": " : "", a->st.error);
        attempt_failed(q, 0, why);
        kick_pending(d, 1);
        return;
    }
    if (a->n_generated == 0 && a->ticket.predicted_cached_decode >= 0) {
        int predicted = a->ticket.predicted_cached_decode;
        int err = rt_pipeline_report_cached(d->deps.pl, &a->ticket, cached);
        metrics_counter_add(m->predicted_cached, predicted);
        metrics_counter_add(m->actual_cached, cached);
        metrics_histogram_observe(m->cached_abs_error, fabs((double)err));
    }
    if (d->deps.on_cached != NULL) {
        d->deps.on_cached(d->deps.arg, a->decision_seq, cached);
    }
    attempt_end(q, 0);
    finish_ok(q, fin, cached);
    kick_pending(d, 1);
}

static void on_busy(struct rt_req *q, struct rt_attempt *a)
{
    struct rt_dispatch *d = q->d;
    int ep = a->ep;
    /* D cannot reach the prefill worker it was given (not connected: it
     * died or restarts, and D's link to it is not back yet): leave that P
     * out, not D, so D prefills locally or another P is picked. Excluding D
     * would park the request, and every retry would pick the same pair
     * while the router still sees P healthy. */
    int pre = a->st.busy_reason == TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE ? a->prefill_ep : -1;
    d->stats.busy++;
    rt_metrics_retry(d->deps.m, "busy");
    LOG_DEBUG("dispatch", "request %llu: busy: %s", (unsigned long long)a->wire_id, a->st.error);
    attempt_end(q, 0);
    if (pre >= 0) {
        exclude_add(q, pre);
    } else {
        exclude_add(q, ep);
        q->n_busy_excluded++;
    }
    dispatch_req(q);
}

void rt_dispatch_on_message(void *arg, int ep, const Tandem__Envelope *env)
{
    struct rt_dispatch *d = arg;
    struct rt_attempt *a = u64_map_get(&d->attempts, env->request_id);
    if (a == NULL || a->ep != ep) {
        LOG_DEBUG("dispatch", "%s for request %llu, which is not live here",
                  wire_kind_name(env->kind), (unsigned long long)env->request_id);
        return;
    }
    struct rt_req *q = a->req;
    int rc = ctl_stream_feed(&a->st, env);
    if (rc == TANDEM_EPROTO) {
        LOG_WARN("dispatch", "protocol violation: %s", a->st.bad_detail);
        attempt_failed(q, 1, "protocol violation");
        return;
    }
    if (rc < 0) {
        attempt_failed(q, 1, tandem_strerror(rc));
        return;
    }
    switch (env->kind) {
    case TANDEM__ENVELOPE__KIND__TOKEN_CHUNK:
        on_tokens(q, a, env->token_chunk);
        break;
    case TANDEM__ENVELOPE__KIND__PROMPT_LOGPROBS:
        on_prompt_logprobs(q, env->prompt_logprobs);
        break;
    case TANDEM__ENVELOPE__KIND__FINISH:
        /* Finish.last_tokens (hold_tokens jobs): ctl_stream_feed took them. */
        if (env->finish->last_tokens != NULL && a->st.n_tokens > a->consumed &&
            on_tokens(q, a, env->finish->last_tokens) != 0) {
            break;
        }
        on_finish(q, a);
        break;
    case TANDEM__ENVELOPE__KIND__BUSY:
        on_busy(q, a);
        break;
    default:
        break; /* ERROR: recorded, the Finish follows */
    }
}

void *rt_dispatch_prefetch(const struct rt_dispatch *d, uint64_t request_id, int stage)
{
    if (stage >= 3) {
        u64_map_prefetch(&d->attempts, request_id);
        return NULL;
    }
    const struct rt_attempt *a = u64_map_get(&d->attempts, request_id);
    if (a == NULL) {
        return NULL;
    }
    /* Every live attempt is its request's att_mem. */
    const struct rt_req *q =
        (const struct rt_req *)((const char *)a - offsetof(struct rt_req, att_mem));
    if (stage == 2) {
        __builtin_prefetch(q);
        __builtin_prefetch(a);
        __builtin_prefetch((const char *)a + 48);
        __builtin_prefetch(&q->out);
        __builtin_prefetch((const char *)&q->out + 64);
    } else if (stage == 1) {
        if (q->gen != NULL) {
            __builtin_prefetch(q->gen + q->n_gen);
        }
        if (q->out.text != NULL) {
            __builtin_prefetch(q->out.text + q->out.text_len);
        }
    } else {
        __builtin_prefetch(q->sink);
        return q->sink;
    }
    return NULL;
}

void rt_dispatch_on_down(void *arg, int ep)
{
    struct rt_dispatch *d = arg;
    struct rt_req *next;
    for (struct rt_req *q = d->live; q; q = next) {
        next = q->next;
        struct rt_attempt *a = q->att;
        if (a == NULL) {
            continue;
        }
        if (a->ep == ep) {
            if (q->state == RQ_STOPPING) {
                attempt_end(q, 0);
                finish_ok(q, OA_FINISH_STOP, 0);
            } else {
                attempt_failed(q, 1, "endpoint lost");
            }
        } else if (a->prefill_ep == ep && !a->got_first) {
            /* Its prefill worker is gone: D would wait for frames. */
            attempt_failed(q, 1, "prefill endpoint lost");
        }
    }
}

void rt_dispatch_on_unsent(void *arg, int ep, uint64_t id, int rc)
{
    struct rt_dispatch *d = arg;
    struct rt_attempt *a = u64_map_get(&d->attempts, id);
    if (a == NULL || a->ep != ep) {
        return; /* ended meanwhile (its link lost, the client gone) */
    }
    /* As a send that fails at once (dispatch_req): the worker never had it. */
    attempt_failed(a->req, 0, rc == TANDEM_ETIMEOUT ? "send queue full" : "link down");
}

void rt_dispatch_on_up(void *arg, int ep)
{
    struct rt_dispatch *d = arg;
    (void)ep;
    /* Every held request may go now; KICK_ON_UP of those waiting for
     * capacity. */
    kick_pending(d, KICK_ON_UP + d->n_held);
}

/* ---- Pending queue, deadlines ------------------------------------------- */

void rt_dispatch_run_pending(struct rt_dispatch *d)
{
    d->kick_active = 0;
    int n = d->kick_credit;
    d->kick_credit = 0;
    /* Only the requests queued now: one that parks again waits for the next
     * kick instead of spinning. */
    int budget = d->n_pending < n ? d->n_pending : n;
    for (int i = 0; i < budget && d->pend_head != NULL; i++) {
        struct rt_req *q = d->pend_head;
        pending_remove(d, q);
        q->state = RQ_NEW;
        q->n_exclude = 0;
        q->n_busy_excluded = 0;
        dispatch_req(q);
    }
}

static void kick_pending(struct rt_dispatch *d, int credit)
{
    if (d->n_pending == 0 || d->closing) {
        return;
    }
    d->kick_credit += credit;
    if (!d->kick_active) {
        d->kick_active = 1;
        d->deps.kick(d->deps.arg);
    }
}

void rt_dispatch_tick(struct rt_dispatch *d)
{
    double now = now_s(d);
    struct rt_req *next;
    for (struct rt_req *q = d->live; q; q = next) {
        next = q->next;
        if (q->held && now >= q->hold_until) {
            hold_expire(q);
        } else if (now >= q->deadline) {
            d->stats.deadlines++;
            LOG_WARN("dispatch", "a request hit its %d ms deadline", d->deps.deadline_ms);
            finish_failed(q, 504, "timeout",
                          "The request did not complete within the router's deadline.");
        }
    }
    /* Nothing running to free capacity: try the queue's head anyway. Held
     * requests wait for rt_dispatch_on_up instead (retrying them would only
     * rotate the queue). */
    if (d->n_pending > d->n_held && d->n_running == 0) {
        kick_pending(d, 1);
    }
}

/* ---- Requests in ------------------------------------------------------------ */

void rt_dispatch_abort(struct rt_req *q)
{
    struct rt_dispatch *d = q->d;
    d->stats.aborted++;
    rt_metrics_request(d->deps.m, 499);
    hold_end(q, d->deps.m->hold_aborted);
    attempt_end(q, 1);
    req_free(q);
    kick_pending(d, 1);
}

/* The job template of q from the parsed request. */
static void job_from_request(struct rt_dispatch *d, struct rt_req *q, const struct oa_request *oreq)
{
    ctl_job_init(&q->job);
    q->job.max_tokens = (uint32_t)oreq->max_tokens;
    q->job.temperature = oreq->temperature;
    q->job.top_p = oreq->top_p;
    q->job.top_k = (uint32_t)oreq->top_k;
    q->job.has_seed = 1;
    /* Without a seed the router picks one, so a retry or a recovery samples
     * the same stream. */
    q->job.seed = oreq->has_seed ? oreq->seed : rng_hash64(d->resp_base + d->n_resp);
    memcpy(q->stop_ids, oreq->stop_ids, (size_t)oreq->n_stop_ids * sizeof(*q->stop_ids));
    q->job.stop_ids = q->stop_ids;
    q->job.n_stop = oreq->n_stop_ids;
    q->job.logprobs = oreq->logprobs ? (uint32_t)oreq->top_logprobs : 0;
    q->job.prompt_logprobs = oreq->echo && oreq->logprobs;
    q->job.ignore_eos = oreq->ignore_eos;
    /* Nothing reaches the client before the end, and no stop string needs the
     * tokens early to cancel: the worker may send them in fewer chunks. */
    q->job.hold_tokens = !oreq->stream && oreq->n_stop == 0;
}

void rt_dispatch_submit(struct rt_dispatch *d, void *sink, enum oa_kind kind, const char *body,
                        size_t len, const char *session)
{
    const struct rt_dispatch_deps *dp = &d->deps;
    double t0 = now_s(d);
    if (d->closing) {
        struct oa_error e;
        oa_error_set(&e, 503, "server_error", NULL, "service_unavailable",
                     "The router is shutting down.");
        respond_error(d, sink, &e);
        return;
    }
    struct oa_request oreq;
    struct oa_error err;
    struct rt_req *q = NULL;
    if (oa_parse(kind, body, len, &oreq, &err) != 0) {
        respond_error(d, sink, &err);
        oa_request_fini(&oreq);
        return;
    }
    struct oa_model model = dp->model;
    model.max_context = dp->max_context(dp->arg);
    const struct oa_model *m = oa_resolve_model(&oreq, &model, 1, &err);
    q = req_alloc();
    if (m == NULL || q == NULL) {
        if (q == NULL) {
            oa_error_internal(&err, "out of memory");
        }
        goto fail;
    }
    if (oa_prompt_build(&oreq, dp->tok, 1, &q->prompt, &err) != 0 ||
        oa_check_context(&oreq, m, q->prompt.n_ids, &err) != 0) {
        goto fail;
    }
    q->d = d;
    q->sink = sink;
    q->kind = kind;
    q->t_arrive = t0;
    q->deadline = t0 + (double)dp->deadline_ms * 1e-3;
    char id[OA_ID_MAX];
    oa_format_id(kind, d->resp_base + ++d->n_resp, id);
    if (oa_output_init(&q->out, &oreq, &q->prompt, dp->tok, id, m->id, (int64_t)time(NULL)) != 0) {
        oa_error_internal(&err, "out of memory");
        goto fail_prompt;
    }
    if (session == NULL) {
        session = oreq.user;
    }
    if (session != NULL && session[0] != '\0') {
        q->session = strdup(session);
        q->session_len = q->session ? strlen(q->session) : 0;
    }
    if (dp->uses_hashes) {
        int nb = q->prompt.n_ids / dp->block_size;
        q->hashes = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(*q->hashes));
        if (q->hashes == NULL) {
            oa_error_internal(&err, "out of memory");
            goto fail_output;
        }
        q->n_hashes =
            bh_hash_prompt(dp->root, q->prompt.ids, q->prompt.n_ids, dp->block_size, q->hashes);
        if (q->n_hashes < 0) {
            q->n_hashes = 0;
        }
    }
    job_from_request(d, q, &oreq);
    oa_request_fini(&oreq);

    dp->sink->hold(sink, q);
    q->next = d->live;
    if (d->live) {
        d->live->prev = q;
    }
    d->live = q;
    d->n_live++;
    d->stats.accepted++;
    if (d->n_pending > d->n_held) {
        park(q); /* behind the ones already waiting for capacity */
    } else {
        /* Nobody waits, or only for an endpoint: decide now (held behind
         * them if there is still none, with its own hold clock). */
        dispatch_req(q);
    }
    return;

fail_output:
    oa_output_fini(&q->out);
fail_prompt:
    free(q->hashes);
    free(q->session);
fail:
    if (q != NULL) {
        oa_prompt_fini(&q->prompt);
        free(q);
    }
    oa_request_fini(&oreq);
    respond_error(d, sink, &err);
}

/* ---- Init, close -------------------------------------------------------- */

int rt_dispatch_init(struct rt_dispatch *d, const struct rt_dispatch_deps *deps)
{
    memset(d, 0, sizeof(*d));
    d->deps = *deps;
    uint64_t seed[2];
    if (deps->seed != 0) {
        seed[0] = rng_hash64(deps->seed);
        seed[1] = rng_hash64(seed[0]);
    } else if (getrandom(seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed[0] = rng_hash64((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
        seed[1] = rng_hash64(seed[0] ^ (uint64_t)(uintptr_t)d);
    }
    /* Leave room below 2^64 so the counter never wraps to 0 in practice. */
    d->next_wire_id = (seed[0] >> 1) | 1;
    d->resp_base = seed[1];
    u64_map_init(&d->attempts);
    return 0;
}

void rt_dispatch_close(struct rt_dispatch *d)
{
    if (d->closing) {
        return;
    }
    d->closing = 1;
    while (d->live != NULL) {
        finish_failed(d->live, 503, "service_unavailable", "The router is shutting down.");
    }
    u64_map_fini(&d->attempts);
}
