/* The worker's engine half: see wk_core.h. */
#include "wk_core.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "log.h"
#include "tandem_err.h"
#include "tandem_rng.h"
#include "wk_metrics.h"

#define WARNS_PER_SECOND 20

/* ---- Host ops ----------------------------------------------------------- */

int wk_core_send_control(struct wk_core *c, const Tandem__Envelope *env)
{
    return c->ops->send_control(c->host, env);
}

int wk_core_link_get(struct wk_core *c, const char *addr, struct wk_link **out)
{
    return c->ops->link_get(c->host, addr, out);
}

void wk_core_link_ref(struct wk_core *c, struct wk_link *l)
{
    c->ops->link_ref(c->host, l);
}

void wk_core_link_unref(struct wk_core *c, struct wk_link *l)
{
    c->ops->link_unref(c->host, l);
}

int wk_core_link_send(struct wk_core *c, struct wk_link *l, const Tandem__Envelope *env,
                      const void *payload, size_t len, uint64_t model_bytes)
{
    return c->ops->link_send(c->host, l, env, payload, len, model_bytes);
}

void wk_core_link_drop(struct wk_core *c, struct wk_link *l)
{
    if (c->ops->link_drop != NULL) {
        c->ops->link_drop(c->host, l);
    }
}

double wk_core_now(const struct wk_core *c)
{
    return c->ops->now(c->host);
}

void wk_core_kick(struct wk_core *c)
{
    c->ops->kick(c->host);
}

struct sampler_params wk_core_sampling(const struct wk_core *c, uint64_t id,
                                       const Tandem__SamplingParams *sp)
{
    struct sampler_params p = {
        .temperature = sp->temperature,
        .top_k = sp->top_k > INT_MAX ? INT_MAX : (int)sp->top_k,
        .top_p = sp->top_p,
    };
    if (sp->optional_seed_case == TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED) {
        p.seed = sp->seed;
    } else {
        p.seed = rng_hash64((uint64_t)c->cfg.seed ^ rng_hash64(id));
    }
    return p;
}

/* ---- Rejections and counters -------------------------------------------- */

int wk_core_warn_allowed(struct wk_core *c)
{
    double now = wk_core_now(c);
    if (now - c->warn_window_s >= 1.0) {
        if (c->warn_count > WARNS_PER_SECOND) {
            LOG_WARN("worker", "%d more rejections in the last second not logged",
                     c->warn_count - WARNS_PER_SECOND);
        }
        c->warn_window_s = now;
        c->warn_count = 0;
    }
    return ++c->warn_count <= WARNS_PER_SECOND;
}

static void count_label(struct metrics_family *f, const char *const *values)
{
    struct metrics_series *s;
    if (metrics_series_get(f, values, &s) == 0) {
        metrics_counter_inc(s);
    }
}

/* Counts a rejection in series values of f and logs "<what>: <message>"
 * under module when a warning may be logged now. */
static void reject_v(struct wk_core *c, struct metrics_family *f, const char *const *values,
                     const char *module, const char *what, const char *fmt, va_list ap)
    __attribute__((format(printf, 6, 0)));

static void reject_v(struct wk_core *c, struct metrics_family *f, const char *const *values,
                     const char *module, const char *what, const char *fmt, va_list ap)
{
    count_label(f, values);
    if (wk_core_warn_allowed(c)) {
        char msg[512];
        vsnprintf(msg, sizeof(msg), fmt, ap);
        LOG_WARN(module, "%s: %s", what, msg);
    }
}

void wk_core_reject(struct wk_core *c, const char *link, const char *reason, const char *fmt, ...)
{
    const char *const values[] = {link, reason, NULL};
    char what[160];
    snprintf(what, sizeof(what), "%s link: refused a message (%s)", link, reason);
    va_list ap;
    va_start(ap, fmt);
    reject_v(c, c->m.messages_rejected, values, "worker", what, fmt, ap);
    va_end(ap);
}

void wk_core_reject_frame(struct wk_core *c, const char *reason, const char *fmt, ...)
{
    const char *const values[] = {reason, NULL};
    char what[160];
    snprintf(what, sizeof(what), "dropped a KV frame (%s)", reason);
    va_list ap;
    va_start(ap, fmt);
    reject_v(c, c->m.frames_rejected, values, "kv", what, fmt, ap);
    va_end(ap);
}

void wk_core_count_finish(struct wk_core *c, const char *reason)
{
    const char *const values[] = {reason, c->be->info.name, NULL};
    count_label(c->m.success, values);
}

void wk_core_kv_dump(struct wk_core *c, const char *what, uint64_t id, uint32_t index,
                     uint64_t hash, const void *bytes, size_t len)
{
    if (c->kv_dump == NULL) {
        return;
    }
    uint64_t x = len > 0 ? XXH3_64bits(bytes, len) : 0;
    fprintf(c->kv_dump, "%s %" PRIu64 " %u %016" PRIx64 " %016" PRIx64 " %zu\n", what, id, index,
            hash, x, len);
    fflush(c->kv_dump);
}

/* ---- Messages to the router --------------------------------------------- */

/* Error(code, message) about request id, to l or (l NULL) the router. */
static int send_error_v(struct wk_core *c, struct wk_link *l, uint64_t id, int code,
                        const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

static int send_error_v(struct wk_core *c, struct wk_link *l, uint64_t id, int code,
                        const char *fmt, va_list ap)
{
    char msg[WIRE_MAX_TEXT_BYTES];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    Tandem__Error e = TANDEM__ERROR__INIT;
    e.code = code < 0 ? code : TANDEM_EINTERNAL;
    e.message = msg;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__ERROR, id, &e);
    return l == NULL ? wk_core_send_control(c, &env) : wk_core_link_send(c, l, &env, NULL, 0, 0);
}

int wk_core_send_error(struct wk_core *c, uint64_t id, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = send_error_v(c, NULL, id, code, fmt, ap);
    va_end(ap);
    return rc;
}

int wk_core_link_send_error(struct wk_core *c, struct wk_link *l, uint64_t id, int code,
                            const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = send_error_v(c, l, id, code, fmt, ap);
    va_end(ap);
    return rc;
}

int wk_core_send_finish(struct wk_core *c, uint64_t id, Tandem__Finish__Reason reason,
                        uint32_t prompt_tokens, uint32_t completion_tokens, uint32_t cached_tokens,
                        const Tandem__TokenChunk *last)
{
    Tandem__Usage u = TANDEM__USAGE__INIT;
    u.prompt_tokens = prompt_tokens;
    u.completion_tokens = completion_tokens;
    u.cached_tokens = cached_tokens;
    Tandem__Finish f = TANDEM__FINISH__INIT;
    f.reason = reason;
    f.usage = &u;
    f.last_tokens = (Tandem__TokenChunk *)last; /* packing only reads it */
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__FINISH, id, &f);
    return wk_core_send_control(c, &env);
}

int wk_core_send_busy(struct wk_core *c, uint64_t id, Tandem__Busy__Reason reason,
                      const char *detail)
{
    Tandem__Busy b = TANDEM__BUSY__INIT;
    b.reason = reason;
    b.detail = (char *)(detail ? detail : "");
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__BUSY, id, &b);
    return wk_core_send_control(c, &env);
}

void wk_core_hello(const struct wk_core *c, Tandem__WorkerHello *h)
{
    tandem__worker_hello__init(h);
    h->worker_id = (char *)c->id;
    h->role = c->role->hello;
    h->kv_address = (char *)c->kv_addr;
    h->model = c->be->info.name;
    h->block_size = (uint32_t)c->block_size;
    h->kv_dtype = (Tandem__KvDtype)(c->dtype + 1);
    h->kv_blocks_total = (uint32_t)kv_pool_config(c->pool)->n_blocks;
    h->max_running_seqs = (uint32_t)c->cfg.max_running;
    h->vocab_size = c->be->info.vocab_size > 0 ? (uint32_t)c->be->info.vocab_size : 0;
    h->max_context =
        (uint32_t)(c->max_context < (int)WIRE_MAX_TOKENS ? c->max_context : (int)WIRE_MAX_TOKENS);
}

void wk_core_heartbeat(struct wk_core *c)
{
    struct sched_stats st;
    sched_stats(c->sched, &st);
    struct kv_stats ks;
    kv_pool_stats(c->pool, &ks);
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.worker_id = c->id;
    hb.waiting = (uint32_t)(st.waiting + c->n_outside);
    hb.running = (uint32_t)st.running;
    hb.prefill_tokens_queued = (uint64_t)st.prefill_tokens_queued;
    hb.kv_blocks_used = (uint32_t)ks.in_use;
    hb.kv_blocks_total = (uint32_t)ks.total;
    hb.kv_blocks_cached_idle = (uint32_t)ks.cached_idle;
    hb.timestamp_ms = c->ops->unix_ms(c->host);
    hb.prefix_cache_queries = st.prefix_cache_queries;
    hb.prefix_cache_hits = st.prefix_cache_hits;
    hb.kv_bytes_sent = (uint64_t)metrics_series_value(c->m.kv_bytes_sent);
    hb.kv_bytes_received = (uint64_t)metrics_series_value(c->m.kv_bytes_received);
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HEARTBEAT, 0, &hb);
    wk_core_send_control(c, &env);
}

/* ---- KV events ---------------------------------------------------------- */

static void on_kv_event(void *arg, enum kv_event ev, uint64_t hash)
{
    struct wk_core *c = arg;
    if (ev == KV_EVENT_STORED) {
        if (u64_map_put(&c->cached, hash, c) != 0) {
            LOG_WARN("worker", "out of memory mirroring the prefix cache");
        }
    } else if (ev == KV_EVENT_REMOVED) {
        u64_map_del(&c->cached, hash);
    } else {
        u64_map_fini(&c->cached);
    }
    if (c->router == WK_ROUTER_NONE) {
        return; /* a router that connects later gets a snapshot */
    }
    if (c->n_ev == c->cap_ev) {
        size_t cap = c->cap_ev ? 2 * c->cap_ev : 256;
        struct wk_core_event *e = realloc(c->ev, cap * sizeof(*e));
        if (e == NULL) {
            LOG_WARN("worker", "out of memory queueing a KV event; the router will resync");
            return;
        }
        c->ev = e;
        c->cap_ev = cap;
    }
    c->ev[c->n_ev].hash = hash;
    c->ev[c->n_ev].kind = (uint8_t)ev;
    c->n_ev++;
}

/* Sends ev[0..n) as KvEvents messages: runs of one kind become one KvEvent,
 * split to stay within the wire limits. */
static void send_events(struct wk_core *c, const struct wk_core_event *ev, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t max_h = n - i < WIRE_MAX_EVENT_HASHES ? n - i : WIRE_MAX_EVENT_HASHES;
        /* Each event takes at least one of ev[i..n): no more than that. */
        size_t max_e = n - i < WIRE_MAX_EVENTS ? n - i : WIRE_MAX_EVENTS;
        Tandem__KvEvent *evs = calloc(max_e, sizeof(*evs));
        Tandem__KvEvent **ptrs = calloc(max_e, sizeof(*ptrs));
        uint64_t *hashes = malloc(max_h * sizeof(*hashes));
        if (evs == NULL || ptrs == NULL || hashes == NULL) {
            free(evs);
            free(ptrs);
            free(hashes);
            LOG_WARN("worker", "out of memory sending KV events; the router will resync");
            return;
        }
        size_t ne = 0, nh = 0;
        while (i < n && ne < max_e) {
            Tandem__KvEvent *e = &evs[ne];
            tandem__kv_event__init(e);
            if (ev[i].kind == KV_EVENT_ALL_CLEARED) {
                e->kind = TANDEM__KV_EVENT__KIND__ALL_CLEARED;
                i++;
            } else {
                if (nh == max_h) {
                    break;
                }
                uint8_t kind = ev[i].kind;
                size_t start = nh;
                while (i < n && ev[i].kind == kind && nh < max_h) {
                    hashes[nh++] = ev[i++].hash;
                }
                e->kind = kind == KV_EVENT_STORED ? TANDEM__KV_EVENT__KIND__STORED
                                                  : TANDEM__KV_EVENT__KIND__REMOVED;
                e->n_block_hashes = nh - start;
                e->block_hashes = hashes + start;
            }
            ptrs[ne] = e;
            ne++;
        }
        Tandem__KvEvents ke = TANDEM__KV_EVENTS__INIT;
        ke.worker_id = c->id;
        ke.seq = ++c->ev_seq;
        ke.n_events = ne;
        ke.events = ptrs;
        Tandem__Envelope env;
        wire_env_init(&env, TANDEM__ENVELOPE__KIND__KV_EVENTS, 0, &ke);
        wk_core_send_control(c, &env);
        free(evs);
        free(ptrs);
        free(hashes);
    }
}

void wk_core_flush_events(struct wk_core *c)
{
    if (c->n_ev > 0 && c->router == WK_ROUTER_READY) {
        send_events(c, c->ev, c->n_ev);
    }
    c->n_ev = 0;
}

void wk_core_snapshot(struct wk_core *c)
{
    size_t n = c->cached.n + 1;
    struct wk_core_event *ev = malloc(n * sizeof(*ev));
    if (ev == NULL) {
        LOG_WARN("worker", "out of memory building the prefix-cache snapshot");
        return;
    }
    ev[0].kind = KV_EVENT_ALL_CLEARED;
    ev[0].hash = 0;
    size_t k = 1, it = 0;
    uint64_t key;
    void *val;
    while (u64_map_next(&c->cached, &it, &key, &val) && k < n) {
        ev[k].kind = KV_EVENT_STORED;
        ev[k].hash = key;
        k++;
    }
    c->n_ev = 0; /* superseded */
    send_events(c, ev, k);
    free(ev);
}

void wk_core_set_router(struct wk_core *c, enum wk_router r)
{
    c->router = r;
    if (r == WK_ROUTER_NONE) {
        c->n_ev = 0;
    }
}

/* ---- Inbound, stepping -------------------------------------------------- */

/* Each of these may have given the scheduler work (or freed blocks a queued
 * request waits for): they end with a kick. */

void wk_core_on_control(struct wk_core *c, const Tandem__Envelope *env)
{
    c->role->on_control(c, env);
    wk_core_kick(c);
}

void wk_core_on_data(struct wk_core *c, const struct wire_frame *f)
{
    c->role->on_data(c, f);
    wk_core_kick(c);
}

void wk_core_on_link(struct wk_core *c, struct wk_link *l, int up)
{
    c->role->on_link(c, l, up);
    if (!up) {
        wk_core_kick(c); /* requests ended: blocks went back */
    }
}

void wk_core_on_control_down(struct wk_core *c)
{
    c->role->on_control_down(c);
    wk_core_kick(c);
}

void wk_core_tick(struct wk_core *c)
{
    c->role->on_tick(c, wk_core_now(c));
    wk_core_kick(c);
}

void wk_core_stop(struct wk_core *c)
{
    c->role->stop(c);
}

int wk_core_busy(const struct wk_core *c)
{
    return sched_busy(c->sched);
}

#ifdef TANDEM_KV_CHECK
/* TANDEM_KV_CHECK builds (docs/engine.md "Checking the KV cache"): after
 * every step, the pool's structure (kv_check) and every block's refcount
 * against the references the scheduler's sequences hold. The count is exact
 * unless the role holds requests outside the scheduler (a decode worker's
 * transfers in flight hold their blocks): then refcount >= held. A failure
 * is a bug in the engine, not bad input, so like assert() it aborts. */
static void check_kv(struct wk_core *c)
{
    memset(c->kv_refs, 0, (size_t)kv_pool_config(c->pool)->n_blocks * sizeof(*c->kv_refs));
    sched_count_refs(c->sched, c->kv_refs);
    if (kv_check(c->pool) == 0 && kv_check_refs(c->pool, c->kv_refs, c->n_outside == 0) == 0) {
        return;
    }
    struct sched_stats st;
    sched_stats(c->sched, &st);
    struct kv_stats ks;
    kv_pool_stats(c->pool, &ks);
    LOG_ERROR("worker",
              "KV cache check failed after step %" PRIu64 " (%s worker %s: %d running, %d waiting, "
              "%d outside the scheduler; blocks %d free, %d in use, %d cached idle of %d): "
              "aborting",
              st.steps, c->role->name, c->id, st.running, st.waiting, c->n_outside, ks.free,
              ks.in_use, ks.cached_idle, ks.total);
    abort();
}
#endif

int wk_core_step(struct wk_core *c)
{
    int n = sched_step(c->sched);
    c->role->after_step(c);
#ifdef TANDEM_KV_CHECK
    check_kv(c);
#endif
    return n;
}

/* ---- Life cycle --------------------------------------------------------- */

void wk_core_set_kv_addr(struct wk_core *c, const char *kv_addr)
{
    snprintf(c->kv_addr, sizeof(c->kv_addr), "%s", kv_addr ? kv_addr : "");
}

/* Errors that are not about the settings must not read as if they were (the
 * host exits 2 on those). */
static int not_settings(int rc)
{
    return rc == TANDEM_EINVAL || rc == TANDEM_ECONFIG ? TANDEM_EINTERNAL : rc;
}

int wk_core_init(struct wk_core *c, const struct worker_config *cfg, const struct worker_role *role,
                 const struct wk_host_ops *ops, void *host, const char *id, const char *kv_addr,
                 char *err, size_t errlen)
{
    *c = (struct wk_core){.ops = ops, .host = host, .role = role, .cfg = *cfg};
    snprintf(c->id, sizeof(c->id), "%s", id);
    wk_core_set_kv_addr(c, kv_addr);
    u64_map_init(&c->cached);
    int rc = wk_engine_create(c, err, errlen);
    if (rc != 0) {
        u64_map_fini(&c->cached);
        return rc;
    }
    if (c->cfg.kv_dump != NULL) {
        c->kv_dump = fopen(c->cfg.kv_dump, "a");
        if (c->kv_dump == NULL) {
            snprintf(err, errlen, "--kv-dump %s: cannot open", c->cfg.kv_dump);
            rc = TANDEM_EINVAL;
            goto out_engine;
        }
    }
    kv_set_event_cb(c->pool, on_kv_event, c);
    rc = wk_metrics_init(c);
    if (rc != 0) {
        snprintf(err, errlen, "cannot register metrics");
        rc = not_settings(rc);
        goto out_metrics;
    }
    rc = role->init(c);
    if (rc != 0) {
        snprintf(err, errlen, "role %s: %s", role->name, tandem_strerror(rc));
        rc = not_settings(rc);
        goto out_metrics;
    }
    return 0;

out_metrics:
    metrics_registry_destroy(c->reg);
    c->reg = NULL;
    if (c->kv_dump != NULL) {
        fclose(c->kv_dump);
        c->kv_dump = NULL;
    }
out_engine:
    kv_set_event_cb(c->pool, NULL, NULL);
    wk_engine_destroy(c);
    u64_map_fini(&c->cached);
    return rc;
}

void wk_core_fini(struct wk_core *c)
{
    if (c->role != NULL && c->role_state != NULL) {
        c->role->fini(c);
    }
    metrics_registry_destroy(c->reg);
    c->reg = NULL;
    if (c->kv_dump != NULL) {
        fclose(c->kv_dump);
        c->kv_dump = NULL;
    }
    if (c->pool != NULL) {
        kv_set_event_cb(c->pool, NULL, NULL);
    }
    wk_engine_destroy(c);
    u64_map_fini(&c->cached);
    free(c->ev);
    c->ev = NULL;
    c->n_ev = c->cap_ev = 0;
}
