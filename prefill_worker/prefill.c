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
    struct wk_peer *peer; /* the decode worker's data address */
    int logprobs;
    int blocks_sent;
    uint32_t first_token;
    float first_logprob;
    struct sampler_top top[WIRE_MAX_LOGPROBS];
    int n_top;
    double t_job;
};

/* A data-link message held until the end of the step (the link model). */
struct held {
    nng_msg *msg;
    struct wk_peer *peer; /* referenced while held */
    uint64_t model_bytes; /* KV bytes of the modelled GPU it stands for; 0 for others */
};

struct pstate {
    struct u64_map reqs; /* id -> struct preq */
    int stopping;
    /* A backend with a KV-link model and a time scale (backend.h): frames
     * leave at the end of the step that computed them and are paced by the
     * link's modelled bandwidth and latency (docs/architecture.md,
     * "## Workers"). */
    int link_model;
    double scale;
    double (*transfer_seconds)(const struct backend *be, uint64_t bytes); /* when link_model */
    uint64_t model_block_bytes; /* kv_config_block_bytes: full precision */
    struct held *held;          /* (cap_held) */
    size_t n_held, cap_held;
};

static struct pstate *state(struct worker *w)
{
    return w->role_state;
}

static void preq_free(struct worker *w, struct preq *r)
{
    u64_map_del(&state(w)->reqs, r->id);
    if (r->peer != NULL) {
        worker_peer_unref(r->peer);
    }
    free(r->prompt);
    free(r->hashes);
    free(r);
}

/* Frames env (+ payload) for p: now, or at the end of the step with the
 * link model. */
static int ship(struct worker *w, struct wk_peer *p, const Tandem__Envelope *env,
                const void *payload, size_t len, uint64_t model_bytes)
{
    struct pstate *ps = state(w);
    if (!ps->link_model) {
        return worker_peer_send(w, p, env, payload, len);
    }
    nng_msg *msg;
    int rc = worker_frame_msg(w, env, payload, len, &msg);
    if (rc != 0) {
        LOG_ERROR("prefill", "cannot frame %s: %s (%s)", wire_kind_name(env->kind),
                  tandem_strerror(rc), wire_error_detail());
        return rc;
    }
    if (ps->n_held == ps->cap_held) {
        size_t cap = ps->cap_held ? 2 * ps->cap_held : 64;
        struct held *h = realloc(ps->held, cap * sizeof(*h));
        if (h == NULL) {
            nng_msg_free(msg);
            return TANDEM_ENOMEM;
        }
        ps->held = h;
        ps->cap_held = cap;
    }
    ps->held[ps->n_held++] = (struct held){.msg = msg, .peer = p, .model_bytes = model_bytes};
    worker_peer_ref(p);
    return 0;
}

/* Sends the held messages, each KV frame due when the modelled link (one per
 * destination) has carried its bytes, plus the link latency. */
static void release_held(struct worker *w)
{
    struct pstate *ps = state(w);
    if (ps->n_held == 0) {
        return; /* also: without a link model nothing is ever held */
    }
    uint64_t now = uv_hrtime();
    double lat = ps->transfer_seconds(w->be, 0);
    for (size_t i = 0; i < ps->n_held; i++) {
        struct held *h = &ps->held[i];
        uint64_t due = 0;
        if (h->model_bytes > 0) {
            double bw_s = ps->transfer_seconds(w->be, h->model_bytes) - lat;
            uint64_t start = h->peer->link_free_ns > now ? h->peer->link_free_ns : now;
            h->peer->link_free_ns = start + (uint64_t)(bw_s * ps->scale * 1e9);
            due = h->peer->link_free_ns + (uint64_t)(lat * ps->scale * 1e9);
        }
        worker_peer_send_msg(w, h->peer, h->msg, due);
        worker_peer_unref(h->peer);
    }
    ps->n_held = 0;
}

/* Sends a non-KV message about request id to a decode worker. */
static void send_to(struct worker *w, struct wk_peer *p, Tandem__Envelope__Kind kind, uint64_t id,
                    void *body)
{
    Tandem__Envelope env;
    wire_env_init(&env, kind, id, body);
    ship(w, p, &env, NULL, 0, 0);
}

static void send_error_to(struct worker *w, struct wk_peer *p, uint64_t id, int code,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void send_error_to(struct worker *w, struct wk_peer *p, uint64_t id, int code,
                          const char *fmt, ...)
{
    char msg[WIRE_MAX_TEXT_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    Tandem__Error e = TANDEM__ERROR__INIT;
    e.code = code < 0 ? code : TANDEM_EINTERNAL;
    e.message = msg;
    send_to(w, p, TANDEM__ENVELOPE__KIND__ERROR, id, &e);
}

static void send_busy_to(struct worker *w, struct wk_peer *p, uint64_t id,
                         Tandem__Busy__Reason reason, const char *detail)
{
    Tandem__Busy b = TANDEM__BUSY__INIT;
    b.reason = reason;
    b.detail = (char *)detail;
    send_to(w, p, TANDEM__ENVELOPE__KIND__BUSY, id, &b);
}

/* ---- Jobs --------------------------------------------------------------- */

static void handle_job(struct worker *w, uint64_t id, const Tandem__PrefillJob *pj)
{
    struct pstate *ps = state(w);
    struct wk_peer *p;
    int rc = worker_peer_get(w, pj->decode_kv_address, &p);
    if (rc != 0) {
        worker_reject(w, "data", "bad_address", "prefill job %llu: decode address '%s': %s",
                      (unsigned long long)id, pj->decode_kv_address, tandem_strerror(rc));
        return;
    }
    if (u64_map_get(&ps->reqs, id) != NULL) {
        worker_reject(w, "data", "duplicate", "prefill job %llu is already live",
                      (unsigned long long)id);
        send_error_to(w, p, 0, TANDEM_EEXIST, "request %llu: duplicate id (already live)",
                      (unsigned long long)id);
        return;
    }
    if ((int64_t)ps->reqs.n >= (int64_t)w->cfg.max_running + w->cfg.max_waiting) {
        send_busy_to(w, p, id, TANDEM__BUSY__REASON__TOO_MANY_SEQS, "prefill queue full");
        return;
    }
    int n = (int)pj->n_prompt_token_ids;
    int vocab = w->be->info.vocab_size;
    for (int i = 0; i < n; i++) {
        if (pj->prompt_token_ids[i] >= (uint32_t)vocab) {
            send_error_to(w, p, id, TANDEM_EINVAL,
                          "prompt token %d: id %u outside the vocabulary (%d)", i,
                          pj->prompt_token_ids[i], vocab);
            return;
        }
    }
    if (n >= w->max_context) {
        send_error_to(w, p, id, TANDEM_ETOOBIG, "%d prompt tokens, context limit %d", n,
                      w->max_context);
        return;
    }
    if ((int)pj->skip_blocks > n / w->block_size) {
        send_error_to(w, p, id, TANDEM_ERANGE, "skip_blocks %u of a prompt with %d full blocks",
                      pj->skip_blocks, n / w->block_size);
        return;
    }
    if (pj->sampling->prompt_logprobs && w->be->info.emits_tokens) {
        send_error_to(w, p, id, TANDEM_EUNSUPPORTED,
                      "prompt logprobs need a backend with logits (not %s)", w->be->ops->name);
        return;
    }
    struct preq *r = calloc(1, sizeof(*r));
    int n_full = n / w->block_size;
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
        send_error_to(w, p, id, TANDEM_ENOMEM, "out of memory");
        return;
    }
    memcpy(r->prompt, pj->prompt_token_ids, (size_t)n * sizeof(*r->prompt));
    r->id = id;
    r->n_prompt = n;
    r->n_full = n_full;
    r->skip = (int)pj->skip_blocks;
    r->peer = p;
    worker_peer_ref(p);
    r->logprobs = (int)pj->sampling->logprobs;
    r->t_job = worker_now();
    bh_hash_prompt(w->root, r->prompt, n, w->block_size, r->hashes);
    struct sched_request sr = {
        .id = id,
        .user = r,
        .prompt = r->prompt,
        .n_prompt = n,
        .max_tokens = 1,
        .sampling = worker_sampling(w, id, pj->sampling),
        .logprobs = r->logprobs,
        .prompt_logprobs = pj->sampling->prompt_logprobs,
        .prompt_top = r->logprobs,
        .mode = SCHED_MODE_PREFILL_ONLY,
    };
    rc = sched_submit(w->sched, &sr);
    if (rc != 0) {
        send_error_to(w, p, id, rc, "engine refused the prefill: %s", tandem_strerror(rc));
        preq_free(w, r);
        return;
    }
    LOG_DEBUG("prefill", "request %llu: %d tokens for %s, skipping %d blocks",
              (unsigned long long)id, n, p->addr, r->skip);
}

static void on_data(struct worker *w, const struct wire_frame *f)
{
    const Tandem__Envelope *env = f->env;
    switch (env->kind) {
    case TANDEM__ENVELOPE__KIND__PREFILL_JOB:
        handle_job(w, env->request_id, env->prefill_job);
        return;
    case TANDEM__ENVELOPE__KIND__CANCEL:
        if (sched_cancel(w->sched, env->request_id) != 0) {
            /* Finished already (its PrefillDone crossed the cancel): fine. */
            LOG_DEBUG("prefill", "cancel for request %llu, which is not live",
                      (unsigned long long)env->request_id);
        }
        return;
    default:
        worker_reject(w, "data", "unexpected_kind", "%s is not sent to a prefill worker",
                      wire_kind_name(env->kind));
        return;
    }
}

static void on_control(struct worker *w, const Tandem__Envelope *env)
{
    if (env->kind == TANDEM__ENVELOPE__KIND__DECODE_JOB) {
        worker_send_error(w, env->request_id, TANDEM_EUNSUPPORTED,
                          "%s is a prefill worker: send decode jobs to a decode worker", w->id);
        worker_send_finish(w, env->request_id, TANDEM__FINISH__REASON__ERROR,
                           (uint32_t)env->decode_job->n_prompt_token_ids, 0, 0);
    }
    /* CANCEL: a prefill worker runs no router request. */
}

/* ---- Scheduler callbacks ------------------------------------------------ */

static void on_blocks_ready(void *arg, uint64_t id, void *user, const struct kv_seq *seq, int first,
                            int count, int n_valid)
{
    struct worker *w = arg;
    struct pstate *ps = state(w);
    struct preq *r = user;
    int bs = w->block_size;
    double t_ready = worker_now();
    int sent_before = r->blocks_sent;
    Tandem__KvFrameHeader h = TANDEM__KV_FRAME_HEADER__INIT;
    h.first_layer = 0;
    h.layer_count = (uint32_t)w->be->info.n_layers;
    h.dtype = (Tandem__KvDtype)(w->dtype + 1);
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
        const uint8_t *data = kv_block_data(w->pool, seq->blocks[i]);
        if (ship(w, r->peer, &env, data, w->block_bytes, ps->model_block_bytes) == 0) {
            r->blocks_sent++;
            metrics_counter_add(w->m.kv_bytes_sent, (double)w->block_bytes);
            metrics_counter_inc(w->m.kv_frames_sent);
            worker_kv_dump(w, "sent", id, (uint32_t)i, h.block_hash, data, w->block_bytes);
        }
    }
    /* Monotonic times for bench/xfer: when the chunk was done, and when its
     * frames were all handed to the send queue. */
    LOG_DEBUG("xfer", "request %llu: blocks [%d, %d) ready at %.6f, %d framed by %.6f",
              (unsigned long long)id, first, first + count, t_ready, r->blocks_sent - sent_before,
              worker_now());
}

static void on_token(void *arg, uint64_t id, void *user, int index, uint32_t token, float logprob,
                     const struct sampler_top *top, int n_top)
{
    struct worker *w = arg;
    struct preq *r = user;
    (void)id;
    (void)index;
    r->first_token = token;
    r->first_logprob = logprob;
    r->n_top = n_top < (int)WIRE_MAX_LOGPROBS ? n_top : (int)WIRE_MAX_LOGPROBS;
    if (r->n_top > 0) {
        memcpy(r->top, top, (size_t)r->n_top * sizeof(*top));
    }
    metrics_histogram_observe(w->m.ttft, worker_now() - r->t_job);
}

static void on_prompt_logprobs(void *arg, uint64_t id, void *user, int first, int n,
                               const float *logprob, const struct sampler_top *top, int n_top)
{
    struct worker *w = arg;
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
    send_to(w, r->peer, TANDEM__ENVELOPE__KIND__PROMPT_LOGPROBS, id, &p);
    wk_tops_free(&t);
}

static void on_finish(void *arg, uint64_t id, void *user, enum sched_finish reason, int err,
                      const struct sched_usage *usage)
{
    struct worker *w = arg;
    struct pstate *ps = state(w);
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
        send_to(w, r->peer, TANDEM__ENVELOPE__KIND__PREFILL_DONE, id, &d);
    } else if (reason == SCHED_FINISH_ERROR) {
        send_error_to(w, r->peer, id, err ? err : TANDEM_EINTERNAL, "prefill failed: %s",
                      tandem_strerror(err ? err : TANDEM_EINTERNAL));
    } else if (reason == SCHED_FINISH_CANCELLED && ps->stopping) {
        /* Tell D now rather than let it wait for its transfer timeout. */
        send_error_to(w, r->peer, id, TANDEM_ECLOSED, "prefill worker %s shutting down", w->id);
        name = "abort";
    }
    worker_count_finish(w, name);
    metrics_histogram_observe(w->m.e2e, worker_now() - r->t_job);
    preq_free(w, r);
}

static void after_step(struct worker *w)
{
    /* Without the link model frames left from on_blocks_ready, during the
     * step, as soon as their chunk was computed. */
    release_held(w);
}

/* ---- Link events, shutdown ---------------------------------------------- */

static uint64_t *live_ids(struct worker *w, struct wk_peer *only, size_t *n)
{
    struct pstate *ps = state(w);
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

static void on_peer(struct worker *w, struct wk_peer *p, int up)
{
    if (up) {
        return;
    }
    /* The decode worker went away: nobody wants these prefills any more. */
    size_t n;
    uint64_t *ids = live_ids(w, p, &n);
    if (n > 0) {
        LOG_WARN("prefill", "decode worker %s went away: cancelling %zu prefills", p->addr, n);
    }
    for (size_t i = 0; ids && i < n; i++) {
        sched_cancel(w->sched, ids[i]);
    }
    free(ids);
    wk_out_clear(&p->out);
}

static void on_control_down(struct worker *w)
{
    (void)w; /* prefills belong to decode workers, not to the router */
}

static void on_tick(struct worker *w, uint64_t now_ms)
{
    (void)w;
    (void)now_ms;
}

static void stop(struct worker *w)
{
    struct pstate *ps = state(w);
    ps->stopping = 1;
    size_t n;
    uint64_t *ids = live_ids(w, NULL, &n);
    for (size_t i = 0; ids && i < n; i++) {
        sched_cancel(w->sched, ids[i]);
    }
    free(ids);
    release_held(w);
}

static int init(struct worker *w)
{
    struct pstate *ps = calloc(1, sizeof(*ps));
    if (ps == NULL) {
        return TANDEM_ENOMEM;
    }
    u64_map_init(&ps->reqs);
    const struct backend_desc *bd = backend_of(w->be);
    if (bd != NULL && bd->transfer_seconds != NULL && bd->time_scale != NULL) {
        ps->scale = bd->time_scale(w->be);
        ps->link_model = ps->scale > 0;
        ps->transfer_seconds = bd->transfer_seconds;
    }
    ps->model_block_bytes = kv_config_block_bytes(kv_pool_config(w->pool));
    w->role_state = ps;
    return 0;
}

static void fini(struct worker *w)
{
    struct pstate *ps = state(w);
    if (ps == NULL) {
        return;
    }
    size_t n;
    uint64_t *ids = live_ids(w, NULL, &n);
    for (size_t i = 0; ids && i < n; i++) {
        sched_cancel(w->sched, ids[i]);
    }
    free(ids);
    /* Peers may be gone by now: only the messages are ours to free. */
    for (size_t i = 0; i < ps->n_held; i++) {
        nng_msg_free(ps->held[i].msg);
    }
    free(ps->held);
    u64_map_fini(&ps->reqs);
    free(ps);
    w->role_state = NULL;
}

const struct worker_role prefill_role = {
    .name = "prefill",
    .hello = TANDEM__WORKER_HELLO__ROLE__PREFILL,
    .init = init,
    .fini = fini,
    .on_control = on_control,
    .on_data = on_data,
    .on_control_down = on_control_down,
    .on_peer = on_peer,
    .on_tick = on_tick,
    .after_step = after_step,
    .stop = stop,
    .on_token = on_token,
    .on_finish = on_finish,
    .on_blocks_ready = on_blocks_ready,
    .on_prompt_logprobs = on_prompt_logprobs,
};
