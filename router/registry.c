/* The router's registry: see registry.h. */
#include "registry.h"

#include <nng/protocol/pipeline0/pull.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "log.h"
#include "metrics.h"
#include "tandem_err.h"
#include "tls.h"
#include "uvsp.h"

#define WATCHDOG_MS   100  /* heartbeat and forget checks */
#define RECONN_MIN_MS 100  /* redial backoff of a control link */
#define RECONN_MAX_MS 1000 /* (a restarted worker is found within a second) */
#define WARN_PER_LINK 5    /* undecodable messages logged per link */

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static void handle_closed(struct rt_registry *reg)
{
    if (--reg->open_handles == 0 && reg->closing) {
        free(reg->by_ep);
        reg->by_ep = NULL;
        if (reg->close_cb != NULL) {
            reg->close_cb(reg);
        }
    }
}

/* ---- Endpoints ---------------------------------------------------------- */

static const struct rt_endpoint *link_endpoint(const struct rt_link *l)
{
    return l->ep >= 0 ? rt_pipeline_endpoint(l->reg->pl, l->ep) : NULL;
}

/* Unregisters the link's endpoint (requests on it are failed over first). */
static void drop_endpoint(struct rt_link *l)
{
    struct rt_registry *reg = l->reg;
    if (l->ep < 0) {
        return;
    }
    int ep = l->ep;
    reg->cbs.on_down(reg->cb_arg, ep);
    const struct rt_endpoint *e = rt_pipeline_endpoint(reg->pl, ep);
    LOG_INFO("registry", "endpoint %s removed", e ? e->id : "?");
    rt_pipeline_endpoint_remove(reg->pl, ep);
    reg->by_ep[ep] = NULL;
    l->ep = -1;
}

static void set_unhealthy(struct rt_link *l, const char *why)
{
    struct rt_registry *reg = l->reg;
    const struct rt_endpoint *e = link_endpoint(l);
    if (e == NULL || !e->healthy) {
        return;
    }
    LOG_WARN("registry", "endpoint %s unhealthy: %s", e->id, why);
    rt_pipeline_endpoint_set_healthy(reg->pl, l->ep, 0);
    reg->cbs.on_down(reg->cb_arg, l->ep);
}

static void set_healthy(struct rt_link *l)
{
    struct rt_registry *reg = l->reg;
    const struct rt_endpoint *e = link_endpoint(l);
    if (e == NULL || e->healthy) {
        return;
    }
    LOG_INFO("registry", "endpoint %s healthy again", e->id);
    rt_pipeline_endpoint_set_healthy(reg->pl, l->ep, 1);
    reg->cbs.on_up(reg->cb_arg, l->ep);
}

/* Keeps why in r: the count goes on while the reason and worker stay. */
static void note_refusal(struct rt_refusal *r, uint64_t now, const char *id, const char *addr,
                         const char *why)
{
    int same = strcmp(r->why, why) == 0 && strcmp(r->worker_id, id) == 0 &&
               strcmp(r->control_addr, addr) == 0;
    r->count = same ? r->count + 1 : 1;
    r->last_ms = now;
    snprintf(r->worker_id, sizeof(r->worker_id), "%s", id);
    snprintf(r->control_addr, sizeof(r->control_addr), "%s", addr);
    snprintf(r->why, sizeof(r->why), "%s", why);
}

/* An announcement refused: kept in the slot of the same address, else the
 * oldest. */
static void note_announce_refusal(struct rt_registry *reg, const char *id, const char *addr,
                                  const char *why)
{
    struct rt_refusal *slot = &reg->refused_announces[0];
    for (int i = 0; i < RT_REFUSED_ANNOUNCES; i++) {
        struct rt_refusal *r = &reg->refused_announces[i];
        if (r->why[0] != '\0' && strcmp(r->control_addr, addr) == 0) {
            slot = r;
            break;
        }
        if (r->last_ms < slot->last_ms || (r->why[0] == '\0' && slot->why[0] != '\0')) {
            slot = r;
        }
    }
    note_refusal(slot, uv_now(reg->loop), id, addr, why);
}

static void refuse(struct rt_link *l, const char *id, const char *fmt, const char *a, const char *b)
{
    char why[RT_REFUSAL_WHY_BYTES];
    snprintf(why, sizeof(why), fmt, a, b);
    LOG_WARN("registry", "worker at %s refused: %s", l->addr, why);
    note_refusal(&l->refusal, uv_now(l->reg->loop), id, l->addr, why);
    l->refused = 1;
    l->reg->n_refused++;
    drop_endpoint(l);
}

/* Whether the registered endpoint still describes what h announces. */
static int same_worker(const struct rt_endpoint *e, const struct rt_link *l,
                       const Tandem__WorkerHello *h, enum rt_role role)
{
    return strcmp(e->id, h->worker_id) == 0 && e->role == role &&
           l->incarnation == h->incarnation && strcmp(e->data_addr, h->kv_address) == 0 &&
           (uint32_t)e->block_size == h->block_size && e->max_running == h->max_running_seqs &&
           e->max_context == h->max_context;
}

static void handle_hello(struct rt_link *l, const Tandem__WorkerHello *h, int pipe)
{
    struct rt_registry *reg = l->reg;
    l->n_hello++;
    if (strcmp(h->model, reg->opts.model) != 0) {
        refuse(l, h->worker_id, "it serves model '%s', the router '%s' (--model)", h->model,
               reg->opts.model);
        return;
    }
    if (h->block_size != (uint32_t)reg->opts.block_size) {
        char a[16], b[16];
        snprintf(a, sizeof(a), "%u", h->block_size);
        snprintf(b, sizeof(b), "%d", reg->opts.block_size);
        refuse(l, h->worker_id, "its KV block size is %s tokens, the router's %s (--block-size)", a,
               b);
        return;
    }
    if (h->vocab_size != 0 && reg->opts.vocab_size > 0 &&
        h->vocab_size != (uint32_t)reg->opts.vocab_size) {
        char a[16], b[16];
        snprintf(a, sizeof(a), "%u", h->vocab_size);
        snprintf(b, sizeof(b), "%d", reg->opts.vocab_size);
        refuse(l, h->worker_id,
               "its vocabulary has %s tokens, the router's tokenizer %s (--tokenizer, or the "
               "model preset's)",
               a, b);
        return;
    }
    struct rt_endpoint_info info;
    if (rt_feed_hello_info(h, &info) != 0) {
        refuse(l, h->worker_id, "%s%s", "bad role, or id or address too long for the router", "");
        return;
    }
    const struct rt_endpoint *e = link_endpoint(l);
    if (e != NULL && !same_worker(e, l, h, info.role)) {
        drop_endpoint(l); /* restarted or changed: start it afresh */
    }
    if (l->ep < 0) {
        int other = rt_pipeline_endpoint_find(reg->pl, h->worker_id);
        if (other >= 0) {
            struct rt_link *o = reg->by_ep[other];
            if (o != NULL && o != l && o->hello) {
                LOG_WARN("registry", "worker id '%s' at %s is already registered from %s: ignored",
                         h->worker_id, l->addr, o->addr);
                return;
            }
            /* The same worker, now reached here (it moved, or restarted on a
             * new port): take it over and start it afresh. */
            if (o != NULL) {
                drop_endpoint(o);
            } else {
                rt_pipeline_endpoint_remove(reg->pl, other);
            }
        }
        int ep = rt_pipeline_endpoint_add(reg->pl, &info);
        if (ep < 0) {
            LOG_WARN("registry", "cannot register worker %s at %s: %s", h->worker_id, l->addr,
                     tandem_strerror(ep));
            return;
        }
        reg->by_ep[ep] = l;
        l->ep = ep;
        LOG_INFO("registry",
                 "endpoint %s registered: %s, control %s, kv %s, %u KV blocks, context %u",
                 h->worker_id, rt_role_name(info.role), h->control_address,
                 h->kv_address[0] ? h->kv_address : "-", h->kv_blocks_total, h->max_context);
    }
    l->incarnation = h->incarnation;
    l->refusal.why[0] = '\0';
    snprintf(l->metrics_addr, sizeof(l->metrics_addr), "%s", h->metrics_address);
    l->hello = 1;
    l->hello_pipe = pipe;
    l->takes_batches = h->control_batches;
    l->kv = (struct rt_feed_seq){0};
    l->last_hb_ms = uv_now(reg->loop);
    if (!rt_pipeline_endpoint(reg->pl, l->ep)->healthy) {
        rt_pipeline_endpoint_set_healthy(reg->pl, l->ep, 1);
    }
    reg->cbs.on_up(reg->cb_arg, l->ep);
}

static void handle_heartbeat(struct rt_link *l, const Tandem__Heartbeat *hb)
{
    struct rt_registry *reg = l->reg;
    l->n_heartbeat++;
    rt_feed_heartbeat(reg->pl, l->ep, hb);
    l->last_hb_ms = uv_now(reg->loop);
    set_healthy(l);
}

static void handle_kv_events(struct rt_link *l, const Tandem__KvEvents *ke)
{
    l->n_kv_events++;
    rt_feed_kv_events(l->reg->pl, l->ep, link_endpoint(l)->id, &l->kv, ke);
}

/* ---- Cluster secret ----------------------------------------------------- */

static void count_auth_failure(struct rt_registry *reg, const char *kind)
{
    reg->n_auth_failures++;
    struct metrics_series *s;
    const char *const v[] = {kind, NULL};
    if (reg->opts.auth_failures != NULL &&
        metrics_series_get(reg->opts.auth_failures, v, &s) == 0) {
        metrics_counter_inc(s);
    }
}

/* ---- The link's transport ------------------------------------------------
 * uvsp for ipc:// and tcp://IP:PORT (the loop reads and writes the
 * connection itself), NNG through uvnng for the rest (tls+tcp://, host
 * names, inproc://). Both speak PAIR0 to the worker's NNG socket. */

/* Sends msg on the link without blocking. 0: msg is gone; otherwise it
 * stays the caller's: TANDEM_ENOENT (no pipe), TANDEM_ETIMEOUT (the send
 * buffer is full) or another code. */
static int link_send(struct rt_link *l, nng_msg *msg)
{
    if (l->native) {
        return uvsp_send(&l->sp, msg);
    }
    int rv = wire_handoff(l->u.sock, msg, NNG_FLAG_NONBLOCK);
    return rv == 0 ? 0 : wire_nng_err(rv);
}

/* The wait before the link's next dial starts at min_ms (to RECONN_MAX_MS). */
static void link_backoff(struct rt_link *l, uint64_t min_ms)
{
    if (l->native) {
        uvsp_set_backoff(&l->sp, min_ms, RECONN_MAX_MS);
    } else {
        nng_socket_set_ms(l->u.sock, NNG_OPT_RECONNMINT, (nng_duration)min_ms);
    }
}

/* Disconnects pipe; the link dials again. */
static void link_drop_pipe(struct rt_link *l, int pipe)
{
    if (l->native) {
        uvsp_drop(&l->sp, pipe);
    } else {
        nng_pipe p = {.id = (uint32_t)pipe};
        nng_pipe_close(p);
    }
}

/* Whether pipe is still the link's (uvsp knows at once; NNG says it later,
 * through a pipe event, so a pipe is taken as live until then). */
static int link_pipe_live(const struct rt_link *l, int pipe)
{
    return !l->native || uvsp_pipe(&l->sp) == pipe;
}

/* Sends Auth{nonce, proof} on the link's socket (either may be NULL). */
static void send_auth(struct rt_link *l, const uint8_t *nonce, const uint8_t *proof)
{
    Tandem__Auth a = TANDEM__AUTH__INIT;
    if (nonce != NULL) {
        a.nonce.data = (uint8_t *)nonce;
        a.nonce.len = AUTH_NONCE_BYTES;
    }
    if (proof != NULL) {
        a.proof.data = (uint8_t *)proof;
        a.proof.len = AUTH_TAG_BYTES;
    }
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__AUTH, 0, &a);
    nng_msg *msg;
    int rc = wire_pack_msg(&env, &msg);
    if (rc == 0) {
        rc = link_send(l, msg);
        if (rc != 0) {
            nng_msg_free(msg);
        }
    }
    if (rc != 0) {
        LOG_WARN("registry", "%s: cannot send Auth: %s", l->addr, tandem_strerror(rc));
    }
}

/* A new pipe: challenge the worker with a fresh nonce. */
static void challenge(struct rt_link *l, int pipe)
{
    if (auth_random(l->nonce, sizeof(l->nonce)) != 0) {
        LOG_ERROR("registry", "%s: no random nonce: the worker cannot be registered", l->addr);
        l->nonce_pipe = 0;
        return;
    }
    l->nonce_pipe = pipe;
    send_auth(l, l->nonce, NULL);
}

/* The worker's own challenge: answer it, so it takes jobs from us. */
static void handle_auth(struct rt_link *l, const Tandem__Auth *a)
{
    const struct auth_key *k = l->reg->opts.secret;
    if (k == NULL && a->nonce.len > 0 && l->refusal.why[0] == '\0') {
        /* It will send no Hello before we prove a secret we do not have. */
        LOG_WARN("registry", "worker at %s asks for the cluster secret; this router has none",
                 l->addr);
        note_refusal(&l->refusal, uv_now(l->reg->loop), "", l->addr,
                     "the worker uses a cluster secret and this router has none (give both "
                     "the same --" AUTH_SECRET_FLAG " or " AUTH_SECRET_ENV ")");
    }
    if (k == NULL || a->nonce.len == 0) {
        return;
    }
    uint8_t proof[AUTH_TAG_BYTES];
    auth_router_proof(k, a->nonce.data, a->nonce.len, proof);
    send_auth(l, NULL, proof);
}

/* Whether h answers the nonce sent on its pipe; *why says what is wrong. */
static int hello_authentic(const struct rt_link *l, const Tandem__WorkerHello *h, int pipe,
                           const char **why)
{
    if (l->nonce_pipe == 0 || l->nonce_pipe != pipe) {
        *why = "Hello before the router's challenge on its pipe";
        return 0;
    }
    if (h->auth_proof.len != AUTH_TAG_BYTES) {
        *why = "no proof of the cluster secret (is --cluster-secret-file set on the worker?)";
        return 0;
    }
    uint8_t want[AUTH_TAG_BYTES];
    auth_hello_proof(l->reg->opts.secret, l->nonce, sizeof(l->nonce), h->worker_id, h->incarnation,
                     want);
    if (!auth_equal(want, h->auth_proof.data, AUTH_TAG_BYTES)) {
        *why = "wrong proof of the cluster secret";
        return 0;
    }
    return 1;
}

/* Refuses the worker on this pipe: counted, logged (not every time), the
 * pipe closed. NNG redials; at most once a second from now on. */
static void refuse_auth(struct rt_link *l, const char *id, int pipe, const char *why)
{
    count_auth_failure(l->reg, "hello");
    note_refusal(&l->refusal, uv_now(l->reg->loop), id, l->addr, why);
    l->n_auth_failures++;
    if (l->n_auth_failures <= 3 || l->n_auth_failures % 100 == 0) {
        LOG_WARN("registry", "worker at %s refused (%llu times): %s", l->addr,
                 (unsigned long long)l->n_auth_failures, why);
    }
    link_backoff(l, RECONN_MAX_MS);
    link_drop_pipe(l, pipe);
}

/* ---- Links -------------------------------------------------------------- */

/* One envelope from a worker (a message, or an item of its BATCH). */
static void on_link_env(struct rt_link *l, const Tandem__Envelope *env, int pipe)
{
    struct rt_registry *reg = l->reg;
    const char *why = NULL;
    if (env->kind == TANDEM__ENVELOPE__KIND__AUTH) {
        handle_auth(l, env->auth);
    } else if (env->kind == TANDEM__ENVELOPE__KIND__HELLO && reg->opts.secret != NULL &&
               !hello_authentic(l, env->hello, pipe, &why)) {
        refuse_auth(l, env->hello->worker_id, pipe, why);
    } else if (env->kind == TANDEM__ENVELOPE__KIND__HELLO) {
        if (l->n_auth_failures > 0) {
            link_backoff(l, RECONN_MIN_MS);
        }
        handle_hello(l, env->hello, pipe);
    } else if (l->ep < 0 || !l->hello) {
        /* Nothing counts before Hello. */
    } else if (env->kind == TANDEM__ENVELOPE__KIND__HEARTBEAT) {
        handle_heartbeat(l, env->heartbeat);
    } else if (env->kind == TANDEM__ENVELOPE__KIND__KV_EVENTS) {
        handle_kv_events(l, env->kv_events);
    } else if (env->request_id != 0) {
        reg->cbs.on_message(reg->cb_arg, l->ep, env);
    } else if (env->kind == TANDEM__ENVELOPE__KIND__ERROR) {
        LOG_WARN("registry", "endpoint %s reports error %s: %s", link_endpoint(l)->id,
                 tandem_errname(env->error->code), env->error->message);
    } else {
        reg->n_rejected_msgs++;
        LOG_WARN("registry", "endpoint %s sent an unexpected %s", link_endpoint(l)->id,
                 wire_kind_name(env->kind));
    }
}

static void link_refused_msg(struct rt_link *l, size_t len, int rc)
{
    struct rt_registry *reg = l->reg;
    reg->n_rejected_msgs++;
    if (reg->n_rejected_msgs <= WARN_PER_LINK * 16) {
        LOG_WARN("registry", "%s: refused a %zu-byte message: %s (%s)", l->addr, len,
                 tandem_strerror(rc), wire_error_detail());
    }
}

/* One message from the worker on pipe. */
static void link_msg(struct rt_link *l, const void *body, size_t len, int pipe)
{
    struct rt_registry *reg = l->reg;
    Tandem__Envelope *env;
    int rc = wire_unpack(body, len, &env);
    if (rc != 0) {
        link_refused_msg(l, len, rc);
        return;
    }
    if (env->kind != TANDEM__ENVELOPE__KIND__BATCH) {
        if (!l->refused && !reg->closing) {
            on_link_env(l, env, pipe);
        }
        wire_free(env);
        return;
    }
    /* A batch: its items one by one, as if each had come alone. A handler
     * may refuse or close the link, or drop the pipe: the rest are then
     * dropped, as later messages would be. */
    for (size_t i = 0; i < env->batch->n_envelopes && !l->refused && !l->closing && !reg->closing &&
                       link_pipe_live(l, pipe);
         i++) {
        Tandem__Envelope *item;
        rc = wire_unpack_item(env, i, &item);
        if (rc != 0) {
            link_refused_msg(l, env->batch->envelopes[i].len, rc);
            continue;
        }
        on_link_env(l, item, pipe);
        wire_free(item);
    }
    wire_free(env);
}

static void on_nng_msg(struct uvnng *u, nng_msg *msg)
{
    link_msg(u->data, nng_msg_body(msg), nng_msg_len(msg), (int)nng_pipe_id(nng_msg_get_pipe(msg)));
    nng_msg_free(msg);
}

static void on_sp_msg(struct uvsp *sp, const uint8_t *body, size_t len, int pipe)
{
    link_msg(sp->data, body, len, pipe);
}

/* ---- Outgoing batches ----------------------------------------------------- */

/* One control-link message with n envelopes left for a worker. */
static void count_sent(struct rt_registry *reg, size_t n)
{
    if (reg->opts.messages_sent != NULL) {
        metrics_counter_inc(reg->opts.messages_sent);
        metrics_counter_add(reg->opts.envelopes_sent, (double)n);
    }
}

/* Frees what waits in l->out. With report, every job in it is reported
 * unsent with rc (after the queue is emptied: the callback may queue more). */
static void out_drop(struct rt_link *l, int report, int rc)
{
    struct rt_registry *reg = l->reg;
    nng_msg **out = l->out;
    uint64_t *job = l->out_job;
    size_t n = l->n_out;
    l->out = NULL;
    l->out_job = NULL;
    l->n_out = l->cap_out = 0;
    int ep = l->ep;
    for (size_t i = 0; i < n; i++) {
        nng_msg_free(out[i]);
    }
    for (size_t i = 0; report && i < n; i++) {
        if (job[i] != 0 && reg->cbs.on_unsent != NULL) {
            reg->cbs.on_unsent(reg->cb_arg, ep, job[i], rc);
        }
    }
    free(out);
    free(job);
}

static void out_unlist(struct rt_link *l)
{
    if (!l->out_listed) {
        return;
    }
    for (struct rt_link **pp = &l->reg->out_links; *pp; pp = &(*pp)->out_next) {
        if (*pp == l) {
            *pp = l->out_next;
            break;
        }
    }
    l->out_listed = 0;
}

/* Sends what waits in l->out, in order: runs of up to WIRE_MAX_BATCH
 * envelopes and RT_OUT_BATCH_BYTES as one BATCH each, a lone or long one as
 * it is. At the first run NNG refuses, the rest is dropped and (with
 * report) its jobs reported unsent. */
static void out_flush(struct rt_link *l, int report)
{
    struct rt_registry *reg = l->reg;
    size_t i = 0;
    int rc = 0;
    while (i < l->n_out && rc == 0) {
        size_t j = i + 1, bytes = nng_msg_len(l->out[i]);
        while (j < l->n_out && j - i < WIRE_MAX_BATCH &&
               bytes + nng_msg_len(l->out[j]) <= RT_OUT_BATCH_BYTES) {
            bytes += nng_msg_len(l->out[j]);
            j++;
        }
        /* link_send leaves a refused message with us: the envelopes stay
         * in out until theirs has left. */
        nng_msg *m = l->out[i];
        if (j - i > 1) {
            rc = wire_batch_pack_msg(l->out + i, j - i, &m);
            if (rc != 0) {
                LOG_ERROR("registry", "cannot pack a batch for %s: %s", l->addr,
                          wire_error_detail());
                break;
            }
        }
        rc = link_send(l, m);
        if (rc != 0) {
            if (m != l->out[i]) {
                nng_msg_free(m);
            }
            break;
        }
        for (size_t k = i; k < j; k++) {
            if (l->out[k] != m) {
                nng_msg_free(l->out[k]);
            }
            l->out[k] = NULL;
        }
        count_sent(reg, j - i);
        i = j;
    }
    /* out[0..i) left; out[i..n_out) did not. */
    size_t kept = l->n_out - i;
    if (kept > 0) {
        memmove(l->out, l->out + i, kept * sizeof(*l->out));
        memmove(l->out_job, l->out_job + i, kept * sizeof(*l->out_job));
        l->n_out = kept;
        LOG_DEBUG("registry", "%zu envelopes for %s not sent: %s", kept, l->addr,
                  tandem_strerror(rc));
        out_drop(l, report, rc == TANDEM_ETIMEOUT ? rc : TANDEM_ENOENT);
    } else {
        l->n_out = 0;
    }
}

/* Every link's batch leaves. Jobs reported unsent (with report) may be sent
 * again elsewhere at once; they leave in this same pass. */
static void out_flush_all(struct rt_registry *reg, int report)
{
    while (reg->out_links != NULL) {
        struct rt_link *l = reg->out_links;
        reg->out_links = l->out_next;
        l->out_listed = 0;
        out_flush(l, report);
    }
}

/* Before the loop blocks. */
static void on_prepare(uv_prepare_t *h)
{
    out_flush_all(h->data, 1);
    uv_prepare_stop(h);
}

static int out_push(struct rt_link *l, uint64_t job, nng_msg *msg)
{
    struct rt_registry *reg = l->reg;
    if (l->n_out == l->cap_out) {
        size_t cap = l->cap_out ? 2 * l->cap_out : 16;
        nng_msg **out = realloc(l->out, cap * sizeof(*out));
        if (out != NULL) {
            l->out = out;
        }
        uint64_t *ids = out != NULL ? realloc(l->out_job, cap * sizeof(*ids)) : NULL;
        if (ids == NULL) {
            nng_msg_free(msg);
            return TANDEM_ENOMEM;
        }
        l->out_job = ids;
        l->cap_out = cap;
    }
    l->out[l->n_out] = msg;
    l->out_job[l->n_out] = job;
    l->n_out++;
    if (!l->out_listed) {
        l->out_listed = 1;
        l->out_next = reg->out_links;
        reg->out_links = l;
        uv_prepare_start(&reg->prepare, on_prepare);
    }
    return 0;
}

/* Pipe came (up) or went. */
static void link_pipe(struct rt_link *l, int pipe, int up)
{
    struct rt_registry *reg = l->reg;
    if (reg->closing) {
        return;
    }
    /* Through NNG, pipe events come through a uv_async and messages through
     * the receive fd: the two are not ordered. A new pipe's Hello can be
     * handled before its ADD_POST, or before the old pipe's REM_POST. So
     * Hello state is tied to the pipe it came on, and only that pipe's
     * removal clears it. */
    if (up) {
        l->pipes++;
        LOG_DEBUG("registry", "connected to %s", l->addr);
        if (reg->opts.secret != NULL) {
            challenge(l, pipe);
        }
    } else if (l->pipes > 0) {
        --l->pipes;
        if (l->hello && pipe == l->hello_pipe) {
            l->hello = 0;
            out_unlist(l);
            out_drop(l, 0, 0); /* set_unhealthy fails their requests over */
            l->n_pipes_lost++;
            l->down_since_ms = uv_now(reg->loop);
            LOG_DEBUG("registry", "lost the link to %s", l->addr);
            set_unhealthy(l, "control link lost");
        }
    }
}

static void on_nng_pipe(struct uvnng *u, nng_pipe pipe, nng_pipe_ev ev)
{
    if (ev == NNG_PIPE_EV_ADD_POST || ev == NNG_PIPE_EV_REM_POST) {
        link_pipe(u->data, (int)nng_pipe_id(pipe), ev == NNG_PIPE_EV_ADD_POST);
    }
}

static void on_sp_pipe(struct uvsp *sp, int pipe, int up)
{
    link_pipe(sp->data, pipe, up);
}

static void link_freed(struct rt_link *l)
{
    struct rt_registry *reg = l->reg;
    free(l);
    handle_closed(reg);
}

static void on_nng_link_closed(uv_handle_t *h)
{
    struct uvnng *u = h->data;
    link_freed(container_of(u, struct rt_link, u));
}

static void on_sp_link_closed(struct uvsp *sp)
{
    link_freed(sp->data);
}

static void link_close(struct rt_link *l)
{
    struct rt_registry *reg = l->reg;
    for (struct rt_link **pp = &reg->links; *pp; pp = &(*pp)->next) {
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    }
    reg->n_links--;
    out_unlist(l);
    out_drop(l, 0, 0);
    l->closing = 1;
    if (l->native) {
        uvsp_close(&l->sp, on_sp_link_closed);
    } else {
        uvnng_close(&l->u, on_nng_link_closed);
    }
}

static struct rt_link *find_link(struct rt_registry *reg, const char *addr)
{
    for (struct rt_link *l = reg->links; l; l = l->next) {
        if (strcmp(l->addr, addr) == 0) {
            return l;
        }
    }
    return NULL;
}

/* A link whose handles are open joins reg's list. */
static void link_add(struct rt_registry *reg, struct rt_link *l)
{
    reg->open_handles++;
    l->next = reg->links;
    reg->links = l;
    reg->n_links++;
}

/* rt_registry_dial's link l to l->addr on uvsp. */
static int dial_native(struct rt_registry *reg, struct rt_link *l)
{
    l->native = 1;
    int rc = uvsp_open(reg->loop, &l->sp, l->addr, WIRE_MAX_MSG_BYTES, on_sp_msg, on_sp_pipe, l);
    if (rc != 0) {
        LOG_ERROR("registry", "cannot dial %s: %s", l->addr, tandem_strerror(rc));
        free(l);
        return rc;
    }
    uvsp_set_backoff(&l->sp, RECONN_MIN_MS, RECONN_MAX_MS);
    link_add(reg, l);
    LOG_INFO("registry", "dialing worker control %s%s", l->addr, l->is_static ? " (static)" : "");
    return 0;
}

int rt_registry_dial(struct rt_registry *reg, const char *addr, int is_static)
{
    if (addr == NULL || addr[0] == '\0' || strlen(addr) > WIRE_MAX_ADDR_BYTES) {
        return TANDEM_EINVAL;
    }
    struct rt_link *l = find_link(reg, addr);
    if (l != NULL) {
        l->is_static |= is_static;
        return 0;
    }
    l = calloc(1, sizeof(*l));
    if (l == NULL) {
        return TANDEM_ENOMEM;
    }
    l->reg = reg;
    l->ep = -1;
    l->is_static = is_static;
    snprintf(l->addr, sizeof(l->addr), "%s", addr);
    l->down_since_ms = uv_now(reg->loop);
    if (uvsp_url_ok(addr)) {
        return dial_native(reg, l);
    }
    nng_socket s;
    int rc = ctl_open(&s);
    if (rc != 0) {
        free(l);
        return rc;
    }
    nng_socket_set_ms(s, NNG_OPT_RECONNMINT, RECONN_MIN_MS);
    nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, RECONN_MAX_MS);
    rc = uvnng_init(reg->loop, &l->u, s, on_nng_msg, on_nng_pipe, l);
    if (rc != 0) {
        /* uvnng cannot say how far it got: the link is leaked rather than
         * closing a handle that may not exist (only on ENOMEM-like paths). */
        nng_close(s);
        LOG_ERROR("registry", "cannot watch the link to %s: %s", addr, tandem_strerror(rc));
        return rc;
    }
    link_add(reg, l);
    rc = uvnng_dial(&l->u, addr); /* a new dialer after UVNNG_REDIAL_MS without a pipe */
    if (rc != 0) {
        LOG_WARN("registry", "cannot dial %s: %s", addr, tls_error_detail());
        link_close(l);
        return rc == TANDEM_ENNG ? TANDEM_EINVAL : rc;
    }
    LOG_INFO("registry", "dialing worker control %s%s", addr, is_static ? " (static)" : "");
    return 0;
}

/* ---- Announcements ------------------------------------------------------ */

static void on_announce(struct uvnng *u, nng_msg *msg)
{
    struct rt_registry *reg = u->data;
    Tandem__Envelope *env;
    int rc = wire_unpack(nng_msg_body(msg), nng_msg_len(msg), &env);
    nng_msg_free(msg);
    if (rc != 0 || reg->closing) {
        if (rc != 0) {
            char why[RT_REFUSAL_WHY_BYTES];
            snprintf(why, sizeof(why), "an announcement the router cannot read: %s",
                     wire_error_detail());
            reg->n_rejected_msgs++;
            LOG_DEBUG("registry", "bad announcement: %s", wire_error_detail());
            note_announce_refusal(reg, "", "", why);
        }
        wire_free(env);
        return;
    }
    if (env->kind == TANDEM__ENVELOPE__KIND__HELLO && reg->opts.secret != NULL) {
        /* Only workers holding the secret make the router dial anything. */
        const Tandem__WorkerHello *h = env->hello;
        uint8_t want[AUTH_TAG_BYTES];
        auth_announce_tag(reg->opts.secret, h->worker_id, h->control_address, h->incarnation, want);
        if (h->auth_proof.len != AUTH_TAG_BYTES ||
            !auth_equal(want, h->auth_proof.data, AUTH_TAG_BYTES)) {
            count_auth_failure(reg, "announce");
            note_announce_refusal(reg, h->worker_id, h->control_address,
                                  h->auth_proof.len == 0
                                      ? "its announcement has no tag of the cluster secret (give "
                                        "it the router's --" AUTH_SECRET_FLAG " or " AUTH_SECRET_ENV
                                        ")"
                                      : "its announcement has a wrong tag of the cluster secret "
                                        "(give it the router's secret file)");
            uint64_t n = ++reg->n_announce_refused;
            if (n <= 3 || n % 100 == 0) {
                LOG_WARN("registry",
                         "announcement of %s refused (%llu times): no valid tag of the cluster "
                         "secret",
                         h->control_address, (unsigned long long)n);
            }
            wire_free(env);
            return;
        }
    }
    if (env->kind == TANDEM__ENVELOPE__KIND__HELLO) {
        const Tandem__WorkerHello *h = env->hello;
        reg->n_announces++;
        for (int i = 0; i < RT_REFUSED_ANNOUNCES; i++) {
            struct rt_refusal *r = &reg->refused_announces[i];
            if (strcmp(r->control_addr, h->control_address) == 0) {
                r->why[0] = '\0'; /* taken now: the refusal is history */
            }
        }
        int known = find_link(reg, h->control_address) != NULL;
        int ep = rt_pipeline_endpoint_find(reg->pl, h->worker_id);
        if (!known && ep >= 0 && reg->by_ep[ep] != NULL && reg->by_ep[ep]->pipes > 0) {
            known = 1; /* the same worker reached under another spelling */
        }
        if (!known) {
            LOG_INFO("registry", "worker %s announced itself at %s", h->worker_id,
                     h->control_address);
            rt_registry_dial(reg, h->control_address, 0);
        }
    }
    wire_free(env);
}

int rt_registry_listen(struct rt_registry *reg, const char *url)
{
    nng_socket s;
    int rc = wire_nng_err(nng_pull0_open(&s));
    if (rc != 0) {
        return rc;
    }
    rc = wire_socket_setup(s, WIRE_LINK_CONTROL);
    if (rc != 0) {
        nng_close(s);
        return rc;
    }
    nng_listener lst;
    rc = tls_listen(s, url, &lst);
    if (rc != 0) {
        nng_close(s);
        return rc == TANDEM_ENNG ? TANDEM_EINVAL : rc;
    }
    char *bound = NULL;
    if (nng_listener_get_string(lst, NNG_OPT_URL, &bound) == 0 && bound != NULL) {
        snprintf(reg->announce_url, sizeof(reg->announce_url), "%s", bound);
        nng_strfree(bound);
    } else {
        snprintf(reg->announce_url, sizeof(reg->announce_url), "%s", url);
    }
    rc = uvnng_init(reg->loop, &reg->announce, s, on_announce, NULL, reg);
    if (rc != 0) {
        nng_close(s);
        return rc;
    }
    reg->announce_open = 1;
    reg->open_handles++;
    return 0;
}

/* ---- Watchdog ----------------------------------------------------------- */

static void on_watchdog(uv_timer_t *t)
{
    struct rt_registry *reg = t->data;
    uint64_t now = uv_now(reg->loop);
    struct rt_link *next;
    for (struct rt_link *l = reg->links; l; l = next) {
        next = l->next;
        if (l->hello && now - l->last_hb_ms > reg->opts.heartbeat_timeout_ms) {
            char why[64];
            snprintf(why, sizeof(why), "no heartbeat for %llu ms",
                     (unsigned long long)(now - l->last_hb_ms));
            set_unhealthy(l, why);
        }
        if (!l->is_static && l->pipes == 0 && now - l->down_since_ms > reg->opts.forget_ms) {
            LOG_INFO("registry", "forgetting %s: unreachable for %llu ms", l->addr,
                     (unsigned long long)(now - l->down_since_ms));
            drop_endpoint(l);
            link_close(l);
        }
    }
}

/* ---- Public ------------------------------------------------------------- */

int rt_registry_init(struct rt_registry *reg, uv_loop_t *loop, struct rt_pipeline *pl,
                     const struct rt_registry_opts *opts, const struct rt_registry_cbs *cbs,
                     void *arg)
{
    memset(reg, 0, sizeof(*reg));
    reg->loop = loop;
    reg->pl = pl;
    reg->opts = *opts;
    reg->cbs = *cbs;
    reg->cb_arg = arg;
    reg->max_ep = rt_pipeline_max_endpoints(pl);
    reg->by_ep = calloc((size_t)reg->max_ep, sizeof(*reg->by_ep));
    if (reg->by_ep == NULL) {
        return TANDEM_ENOMEM;
    }
    if (uv_timer_init(loop, &reg->timer) != 0) {
        free(reg->by_ep);
        return TANDEM_EUV;
    }
    reg->timer.data = reg;
    reg->open_handles = 1;
    uv_timer_start(&reg->timer, on_watchdog, WATCHDOG_MS, WATCHDOG_MS);
    uv_prepare_init(loop, &reg->prepare);
    reg->prepare.data = reg;
    reg->open_handles++;
    return 0;
}

int rt_registry_send_job(struct rt_registry *reg, int ep, uint64_t id, nng_msg *msg)
{
    struct rt_link *l = ep >= 0 && ep < reg->max_ep ? reg->by_ep[ep] : NULL;
    if (l == NULL || !l->hello || reg->closing) {
        nng_msg_free(msg);
        return TANDEM_ENOENT;
    }
    if (l->takes_batches) {
        return out_push(l, id, msg);
    }
    int rc = link_send(l, msg);
    if (rc == 0) {
        count_sent(reg, 1);
    } else {
        nng_msg_free(msg);
    }
    return rc;
}

int rt_registry_send(struct rt_registry *reg, int ep, nng_msg *msg)
{
    return rt_registry_send_job(reg, ep, 0, msg);
}

const struct rt_link *rt_registry_link(const struct rt_registry *reg, int ep)
{
    return ep >= 0 && ep < reg->max_ep ? reg->by_ep[ep] : NULL;
}

int rt_registry_max_context(const struct rt_registry *reg)
{
    return rt_feed_max_context(reg->pl);
}

void rt_registry_counts(const struct rt_registry *reg, int *healthy, int *registered)
{
    int h = 0, n = 0;
    for (int ep = 0; ep < reg->max_ep; ep++) {
        const struct rt_endpoint *e = rt_pipeline_endpoint(reg->pl, ep);
        if (e != NULL) {
            n++;
            h += e->healthy != 0;
        }
    }
    *healthy = h;
    *registered = n;
}

static void on_own_handle_closed(uv_handle_t *h)
{
    handle_closed(h->data);
}

static void on_announce_closed(uv_handle_t *h)
{
    struct uvnng *u = h->data;
    handle_closed(u->data);
}

void rt_registry_close(struct rt_registry *reg, void (*cb)(struct rt_registry *reg))
{
    if (reg->closing) {
        return;
    }
    reg->closing = 1;
    reg->close_cb = cb;
    uv_close((uv_handle_t *)&reg->timer, on_own_handle_closed);
    uv_close((uv_handle_t *)&reg->prepare, on_own_handle_closed);
    /* What this turn queued (the Cancels of a router that stops) still
     * leaves: the workers free those requests now, not when the link drops.
     * Nothing is reported: the dispatcher is closed. */
    out_flush_all(reg, 0);
    if (reg->announce_open) {
        reg->announce_open = 0;
        uvnng_close(&reg->announce, on_announce_closed);
    }
    while (reg->links != NULL) {
        link_close(reg->links);
    }
}
