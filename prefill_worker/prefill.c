/* The prefill role: see prefill.h. */
#include "prefill.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "block_hash.h"
#include "log.h"
#include "tandem_err.h"
#include "wk_tops.h"

struct preq {
    uint64_t id;
    uint32_t *prompt; /* (n_prompt) */
    int n_prompt;
    uint64_t *hashes; /* (n_full) chained hashes of the full blocks */
    int n_full;
    int skip;             /* leading blocks the decode worker holds: not shipped */
    struct wk_link *peer; /* the decode worker's data address */
    int logprobs;
    int blocks_sent;
    uint32_t first_token;
    float first_logprob;
    struct sampler_top top[WIRE_MAX_LOGPROBS];
    int n_top;
    double t_job;
};

struct pstate {
    struct u64_map reqs; /* id -> struct preq */
    int stopping;
    uint64_t model_block_bytes; /* kv_config_block_bytes: the modelled GPU's bytes per block */
};

static struct pstate *state(struct wk_core *c)
{
    return c->role_state;
}

static void preq_free(struct wk_core *c, struct preq *r)
{
    u64_map_del(&state(c)->reqs, r->id);
    if (r->peer != NULL) {
        wk_core_link_unref(c, r->peer);
    }
    free(r->prompt);
    free(r->hashes);
    free(r);
}

/* Sends a non-KV message about request id to a decode worker. */
static void send_to(struct wk_core *c, struct wk_link *p, Tandem__Envelope__Kind kind, uint64_t id,
                    void *body)
{
    Tandem__Envelope env;
    wire_env_init(&env, kind, id, body);
    wk_core_link_send(c, p, &env, NULL, 0, 0);
}

static void send_busy_to(struct wk_core *c, struct wk_link *p, uint64_t id,
                         Tandem__Busy__Reason reason, const char *detail)
{
    Tandem__Busy b = TANDEM__BUSY__INIT;
    b.reason = reason;
    b.detail = (char *)detail;
    send_to(c, p, TANDEM__ENVELOPE__KIND__BUSY, id, &b);
}

/* ---- Jobs --------------------------------------------------------------- */

static void handle_job(struct wk_core *c, uint64_t id, const Tandem__PrefillJob *pj)
{
    struct pstate *ps = state(c);
    struct wk_link *p;
    int rc = wk_core_link_get(c, pj->decode_kv_address, &p);
    if (rc != 0) {
        wk_core_reject(c, "data", "bad_address", "prefill job %llu: decode address '%s': %s",
                       (unsigned long long)id, pj->decode_kv_address, tandem_strerror(rc));
        return;
    }
    if (u64_map_get(&ps->reqs, id) != NULL) {
        wk_core_reject(c, "data", "duplicate", "prefill job %llu is already live",
                       (unsigned long long)id);
        wk_core_link_send_error(c, p, 0, TANDEM_EEXIST, "request %llu: duplicate id (already live)",
                                (unsigned long long)id);
        return;
    }
    if ((int64_t)ps->reqs.n >= (int64_t)c->cfg.max_running + c->cfg.max_waiting) {
        send_busy_to(c, p, id, TANDEM__BUSY__REASON__TOO_MANY_SEQS, "prefill queue full");
        return;
    }
    int n = (int)pj->n_prompt_token_ids;
    int vocab = c->be->info.vocab_size;
    for (int i = 0; i < n; i++) {
        if (pj->prompt_token_ids[i] >= (uint32_t)vocab) {
            wk_core_link_send_error(c, p, id, TANDEM_EINVAL,
                                    "prompt token %d: id %u outside the vocabulary (%d)", i,
                                    pj->prompt_token_ids[i], vocab);
            return;
        }
    }
    if (n >= c->max_context) {
        wk_core_link_send_error(c, p, id, TANDEM_ETOOBIG, "%d prompt tokens, context limit %d", n,
                                c->max_context);
        return;
    }
    if ((int)pj->skip_blocks > n / c->block_size) {
        wk_core_link_send_error(c, p, id, TANDEM_ERANGE,
                                "skip_blocks %u of a prompt with %d full blocks", pj->skip_blocks,
                                n / c->block_size);
        return;
    }
    if (pj->sampling->prompt_logprobs && c->be->info.emits_tokens) {
        wk_core_link_send_error(c, p, id, TANDEM_EUNSUPPORTED,
                                "prompt logprobs need a backend with logits (not %s)",
                                c->be->ops->name);
        return;
    }
    struct preq *r = calloc(1, sizeof(*r));
    int n_full = n / c->block_size;
    if (r != NULL) {
        r->prompt = malloc((size_t)n * sizeof(*r->prompt));
        r->hashes = malloc((size_t)(n_full > 0 ? n_full : 1) * sizeof(*r->hashes));
    }
    if (r == NULL || r->prompt == NULL || r->hashes == NULL || u64_map_put(&ps->reqs, id, r) != 0) {
        if (r != NULL) {
            free(r->prompt);
            free(r->hashes);
            free(r);
        }
        wk_core_link_send_error(c, p, id, TANDEM_ENOMEM, "out of memory");
        return;
    }
    memcpy(r->prompt, pj->prompt_token_ids, (size_t)n * sizeof(*r->prompt));
    r->id = id;
    r->n_prompt = n;
    r->n_full = n_full;
    r->skip = (int)pj->skip_blocks;
    r->peer = p;
    wk_core_link_ref(c, p);
    r->logprobs = (int)pj->sampling->logprobs;
    r->t_job = wk_core_now(c);
    bh_hash_prompt(c->root, r->prompt, n, c->block_size, r->hashes);
    struct sched_request sr = {
        .id = id,
        .user = r,
        .prompt = r->prompt,
        .n_prompt = n,
        .max_tokens = 1,
        .sampling = wk_core_sampling(c, id, pj->sampling),
        .logprobs = r->logprobs,
        .prompt_logprobs = pj->sampling->prompt_logprobs,
        .prompt_top = r->logprobs,
        .mode = SCHED_MODE_PREFILL_ONLY,
    };
    rc = sched_submit(c->sched, &sr);
    if (rc != 0) {
        wk_core_link_send_error(c, p, id, rc, "engine refused the prefill: %s",
                                tandem_strerror(rc));
        preq_free(c, r);
        return;
    }
    LOG_DEBUG("prefill", "request %llu: %d tokens for %s, skipping %d blocks",
              (unsigned long long)id, n, p->addr, r->skip);
}

static void on_data(struct wk_core *c, const struct wire_frame *f)
{
    const Tandem__Envelope *env = f->env;
    switch (env->kind) {
    case TANDEM__ENVELOPE__KIND__PREFILL_JOB:
        handle_job(c, env->request_id, env->prefill_job);
        return;
    case TANDEM__ENVELOPE__KIND__CANCEL:
        if (sched_cancel(c->sched, env->request_id) != 0) {
            /* Finished already (its PrefillDone crossed the cancel): fine. */
            LOG_DEBUG("prefill", "cancel for request %llu, which is not live",
                      (unsigned long long)env->request_id);
        }
        return;
    default:
        wk_core_reject(c, "data", "unexpected_kind", "%s is not sent to a prefill worker",
                       wire_kind_name(env->kind));
        return;
    }
}

static void on_control(struct wk_core *c, const Tandem__Envelope *env)
{
    if (env->kind == TANDEM__ENVELOPE__KIND__DECODE_JOB) {
        wk_core_send_error(c, env->request_id, TANDEM_EUNSUPPORTED,
                           "%s is a prefill worker: send decode jobs to a decode worker", c->id);
        wk_core_send_finish(c, env->request_id, TANDEM__FINISH__REASON__ERROR,
                            (uint32_t)env->decode_job->n_prompt_token_ids, 0, 0, NULL);
    }
    /* CANCEL: a prefill worker runs no router request. */
}

/* ---- Scheduler callbacks ------------------------------------------------ */

static void on_blocks_ready(void *arg, uint64_t id, void *user, const struct kv_seq *seq, int first,
                            int count, int n_valid)
{
    struct wk_core *c = arg;
    struct pstate *ps = state(c);
    struct preq *r = user;
    int bs = c->block_size;
    double t_ready = wk_core_now(c);
    int sent_before = r->blocks_sent;
    Tandem__KvFrameHeader h = TANDEM__KV_FRAME_HEADER__INIT;
    h.first_layer = 0;
    h.layer_count = (uint32_t)c->be->info.n_layers;
    h.dtype = (Tandem__KvDtype)(c->dtype + 1);
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__KV_FRAME, id, &h);
    for (int i = first; i < first + count; i++) {
        if (i < r->skip) {
            continue;
        }
        int tc = i < r->n_full ? bs : n_valid - i * bs;
        h.block_index = (uint32_t)i;
        h.token_count = (uint32_t)tc;
        /* A full block is named by its prefix-cache hash; a partial last
         * block has no name: hash 0 (docs/protocol.md). */
        h.block_hash = i < r->n_full ? r->hashes[i] : 0;
        const uint8_t *data = kv_block_data(c->pool, seq->blocks[i]);
        if (wk_core_link_send(c, r->peer, &env, data, c->block_bytes, ps->model_block_bytes) == 0) {
            r->blocks_sent++;
            metrics_counter_add(c->m.kv_bytes_sent, (double)c->block_bytes);
            metrics_counter_inc(c->m.kv_frames_sent);
            wk_core_kv_dump(c, "sent", id, (uint32_t)i, h.block_hash, data, c->block_bytes);
        }
    }
    /* Monotonic times for bench/xfer: when the chunk was done, and when its
     * frames were all handed to the send queue. */
    LOG_DEBUG("xfer", "request %llu: blocks [%d, %d) ready at %.6f, %d framed by %.6f",
              (unsigned long long)id, first, first + count, t_ready, r->blocks_sent - sent_before,
              wk_core_now(c));
}

static void on_token(void *arg, uint64_t id, void *user, int index, uint32_t token, float logprob,
                     const struct sampler_top *top, int n_top)
{
    struct wk_core *c = arg;
    struct preq *r = user;
    (void)id;
    (void)index;
    r->first_token = token;
    r->first_logprob = logprob;
    r->n_top = n_top < (int)WIRE_MAX_LOGPROBS ? n_top : (int)WIRE_MAX_LOGPROBS;
    if (r->n_top > 0) {
        memcpy(r->top, top, (size_t)r->n_top * sizeof(*top));
    }
    metrics_histogram_observe(c->m.ttft, wk_core_now(c) - r->t_job);
}

static void on_prompt_logprobs(void *arg, uint64_t id, void *user, int first, int n,
                               const float *logprob, const struct sampler_top *top, int n_top)
{
    struct wk_core *c = arg;
    struct preq *r = user;
    Tandem__PromptLogprobs p = TANDEM__PROMPT_LOGPROBS__INIT;
    p.first_index = (uint32_t)first;
    p.n_logprobs = (size_t)n;
    p.logprobs = (float *)logprob;
    struct wk_tops t = {0};
    if (n_top > 0 && wk_tops_build(&t, n, top, n_top, NULL, n_top) == 0) {
        p.n_top_logprobs = (size_t)n;
        p.top_logprobs = t.ptrs;
    }
    send_to(c, r->peer, TANDEM__ENVELOPE__KIND__PROMPT_LOGPROBS, id, &p);
    wk_tops_free(&t);
}

static void on_finish(void *arg, uint64_t id, void *user, enum sched_finish reason, int err,
                      const struct sched_usage *usage)
{
    struct wk_core *c = arg;
    struct pstate *ps = state(c);
    struct preq *r = user;
    const char *name = sched_finish_name(reason);
    if (reason == SCHED_FINISH_PREFILLED) {
        Tandem__TopLogprobs top = TANDEM__TOP_LOGPROBS__INIT;
        uint32_t ids[WIRE_MAX_LOGPROBS];
        float lps[WIRE_MAX_LOGPROBS];
        Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
        d.first_token = r->first_token;
        d.first_logprob = r->first_logprob;
        d.blocks_sent = (uint32_t)r->blocks_sent;
        d.cached_tokens = (uint32_t)usage->cached_tokens;
        if (r->logprobs > 0) {
            for (int i = 0; i < r->n_top; i++) {
                ids[i] = r->top[i].token;
                lps[i] = r->top[i].logprob;
            }
            top.n_token_ids = top.n_logprobs = (size_t)r->n_top;
            top.token_ids = ids;
            top.logprobs = lps;
            d.first_top_logprobs = &top;
        }
        send_to(c, r->peer, TANDEM__ENVELOPE__KIND__PREFILL_DONE, id, &d);
    } else if (reason == SCHED_FINISH_ERROR) {
        wk_core_link_send_error(c, r->peer, id, err ? err : TANDEM_EINTERNAL, "prefill failed: %s",
                                tandem_strerror(err ? err : TANDEM_EINTERNAL));
    } else if (reason == SCHED_FINISH_CANCELLED && ps->stopping) {
        /* Tell D now rather than let it wait for its transfer timeout. */
        wk_core_link_send_error(c, r->peer, id, TANDEM_ECLOSED, "prefill worker %s shutting down",
                                c->id);
        name = "abort";
    }
    wk_core_count_finish(c, name);
    metrics_histogram_observe(c->m.e2e, wk_core_now(c) - r->t_job);
    preq_free(c, r);
}

static void after_step(struct wk_core *c)
{
    /* Frames went out from on_blocks_ready; the host releases what its link
     * model held after this returns. */
    (void)c;
}

/* ---- Link events, shutdown ---------------------------------------------- */

static uint64_t *live_ids(struct wk_core *c, struct wk_link *only, size_t *n)
{
    struct pstate *ps = state(c);
    uint64_t *ids = malloc((ps->reqs.n + 1) * sizeof(*ids));
    *n = 0;
    if (ids == NULL) {
        return NULL;
    }
    size_t it = 0;
    uint64_t key;
    void *val;
    while (u64_map_next(&ps->reqs, &it, &key, &val)) {
        struct preq *r = val;
        if (only == NULL || r->peer == only) {
            ids[(*n)++] = key;
        }
    }
    return ids;
}

static void on_link(struct wk_core *c, struct wk_link *p, int up)
{
    if (up) {
        return;
    }
    /* The decode worker went away: nobody wants these prefills any more. */
    size_t n;
    uint64_t *ids = live_ids(c, p, &n);
    if (n > 0) {
        LOG_WARN("prefill", "decode worker %s went away: cancelling %zu prefills", p->addr, n);
    }
    for (size_t i = 0; ids && i < n; i++) {
        sched_cancel(c->sched, ids[i]);
    }
    free(ids);
    wk_core_link_drop(c, p);
}

static void on_control_down(struct wk_core *c)
{
    (void)c; /* prefills belong to decode workers, not to the router */
}

static void on_tick(struct wk_core *c, double now)
{
    (void)c;
    (void)now;
}

static void stop(struct wk_core *c)
{
    struct pstate *ps = state(c);
    ps->stopping = 1;
    size_t n;
    uint64_t *ids = live_ids(c, NULL, &n);
    for (size_t i = 0; ids && i < n; i++) {
        sched_cancel(c->sched, ids[i]);
    }
    free(ids);
}

static int init(struct wk_core *c)
{
    struct pstate *ps = calloc(1, sizeof(*ps));
    if (ps == NULL) {
        return TANDEM_ENOMEM;
    }
    u64_map_init(&ps->reqs);
    ps->model_block_bytes = kv_config_block_bytes(kv_pool_config(c->pool));
    c->role_state = ps;
    return 0;
}

static void fini(struct wk_core *c)
{
    struct pstate *ps = state(c);
    if (ps == NULL) {
        return;
    }
    size_t n;
    uint64_t *ids = live_ids(c, NULL, &n);
    for (size_t i = 0; ids && i < n; i++) {
        sched_cancel(c->sched, ids[i]);
    }
    free(ids);
    u64_map_fini(&ps->reqs);
    free(ps);
    c->role_state = NULL;
}

const struct worker_role prefill_role = {
    .name = "prefill",
    .hello = TANDEM__WORKER_HELLO__ROLE__PREFILL,
    .link_model = 1,
    .init = init,
    .fini = fini,
    .on_control = on_control,
    .on_data = on_data,
    .on_control_down = on_control_down,
    .on_link = on_link,
    .on_tick = on_tick,
    .after_step = after_step,
    .stop = stop,
    .sched =
        {
            .on_token = on_token,
            .on_finish = on_finish,
            .on_blocks_ready = on_blocks_ready,
            .on_prompt_logprobs = on_prompt_logprobs,
        },
};
