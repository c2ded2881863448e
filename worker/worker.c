/* The worker runtime: see worker.h. */
#include "worker.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <nng/protocol/pair0/pair.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "flags.h"
#include "log.h"
#include "tandem_err.h"
#include "tandem_rng.h"
#include "tls.h"
#include "watchdog.h"
#include "wk_config.h"

#define STOP_DRAIN_MS   500 /* at SIGTERM, how long queued messages get to leave */
#define STOP_WATCHDOG_S 10  /* from the signal to exit 70 (common/watchdog.h) */

/* What worker_main has set up, so a failure half-way closes exactly that. */
enum {
    HAVE_CTL = 1 << 0,
    HAVE_DATA = 1 << 1,
    HAVE_HTTP = 1 << 2,
    HAVE_TIMERS = 1 << 3,
    HAVE_ANNOUNCE = 1 << 4,
    HAVE_ALARM = 1 << 5,
};

static unsigned have;    /* one worker per process */
static int have_signals; /* sigint/sigterm initialised (closed last) */

static void worker_kick(struct worker *w);
static void defer(struct worker *w, Tandem__Envelope *env, struct wire_frame *f);
static void held_drop(struct worker *w, struct wk_peer *p);

static double worker_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t unix_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
}

static int warn_allowed(struct worker *w)
{
    return wk_core_warn_allowed(&w->core);
}

/* ---- Control link: sending ---------------------------------------------- */

/* Sends a packed message to the router on the control link; always
 * consumes msg. Dropped (TANDEM_ECLOSED) when no router is connected; queued
 * when NNG cannot take it yet. what names it in a warning. */
static int send_control_msg(struct worker *w, nng_msg *msg, const char *what)
{
    if (w->ctl_pipes <= 0 || !(have & HAVE_CTL)) {
        nng_msg_free(msg);
        metrics_counter_inc(w->core.m.ctl_dropped);
        return TANDEM_ECLOSED;
    }
    int rc = wk_out_send(&w->ctl_out, msg);
    if (rc == 0) {
        metrics_counter_inc(w->core.m.ctl_envelopes);
    } else {
        metrics_counter_inc(w->core.m.ctl_dropped);
        if (warn_allowed(w)) {
            LOG_WARN("worker", "dropped %s for the router: %s", what, tandem_strerror(rc));
        }
    }
    return rc;
}

/* Packs env (the caller's) into *out. 0 or the wire error (logged). */
static int pack_control(const Tandem__Envelope *env, nng_msg **out)
{
    int rc = wire_pack_msg(env, out);
    if (rc != 0) {
        LOG_ERROR("worker", "cannot pack %s for the router: %s (%s)", wire_kind_name(env->kind),
                  tandem_strerror(rc), wire_error_detail());
    }
    return rc;
}

/* Sends env to the router (send_control_msg). env stays the caller's. */
static int send_control(struct worker *w, const Tandem__Envelope *env)
{
    if (w->ctl_pipes <= 0 || !(have & HAVE_CTL)) {
        metrics_counter_inc(w->core.m.ctl_dropped);
        return TANDEM_ECLOSED;
    }
    nng_msg *msg;
    int rc = pack_control(env, &msg);
    return rc != 0 ? rc : send_control_msg(w, msg, wire_kind_name(env->kind));
}

static void fill_hello(struct worker *w, Tandem__WorkerHello *h)
{
    wk_core_hello(&w->core, h);
    h->control_address = w->ctl_url;
    h->metrics_address = w->metrics_addr;
    h->incarnation = w->incarnation;
    h->control_batches = 1;
}

/* The router may be told about us: a pipe is attached and, with a cluster
 * secret, the router challenged us and got our Hello. */
static int ctl_ready(const struct worker *w)
{
    return w->ctl_pipes > 0 && (!w->secret.set || w->ctl_hello_sent);
}

/* Tells the core what it needs of the router link (KV events). */
static void update_router(struct worker *w)
{
    wk_core_set_router(&w->core, w->ctl_pipes <= 0 ? WK_ROUTER_NONE
                                 : ctl_ready(w)    ? WK_ROUTER_READY
                                                   : WK_ROUTER_ATTACHED);
}

static void send_heartbeat(struct worker *w)
{
    w->last_hb_ns = uv_hrtime();
    wk_core_heartbeat(&w->core);
}

static void on_flush_check(uv_check_t *h)
{
    struct worker *w = h->data;
    if (!w->holding) { /* a timed step's events leave at its end */
        wk_core_flush_events(&w->core);
    }
    wk_out_flush(&w->ctl_out); /* not after the next step (a tiny one computes) */
}

/* ---- Cluster secret on the control link ----------------------------------- */

static void send_auth(struct worker *w, const uint8_t *nonce, const uint8_t *proof)
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
    send_control(w, &env);
}

/* Hello (with the proof of the router's nonce when there is a secret); the
 * first one on a pipe is followed by a heartbeat and the prefix-cache
 * snapshot. */
static void send_hello(struct worker *w)
{
    Tandem__WorkerHello h;
    fill_hello(w, &h);
    uint8_t proof[AUTH_TAG_BYTES];
    if (w->secret.set) {
        auth_hello_proof(&w->secret, w->router_nonce, w->router_nonce_len, w->core.id,
                         w->incarnation, proof);
        h.auth_proof.data = proof;
        h.auth_proof.len = sizeof(proof);
    }
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    send_control(w, &env);
    if (!w->ctl_hello_sent) {
        w->ctl_hello_sent = 1;
        update_router(w);
        send_heartbeat(w);
        wk_core_snapshot(&w->core);
    }
}

/* An Auth from the router on pipe: its challenge (answered with a Hello
 * once that pipe is ours) and/or its proof of our challenge. */
static void handle_auth(struct worker *w, const Tandem__Auth *a, uint32_t pipe)
{
    if (!w->secret.set) {
        wk_core_reject(&w->core, "control", "unexpected_kind",
                       "the router uses a cluster secret, this worker has none");
        return;
    }
    if (a->nonce.len > 0) {
        memcpy(w->router_nonce, a->nonce.data, a->nonce.len);
        w->router_nonce_len = a->nonce.len;
        w->router_nonce_pipe = pipe;
        if (pipe == w->ctl_pipe_id && !w->stopping) {
            send_hello(w);
        }
    }
    if (a->proof.len > 0) {
        uint8_t want[AUTH_TAG_BYTES];
        auth_router_proof(&w->secret, w->ctl_nonce, sizeof(w->ctl_nonce), want);
        if (pipe == w->ctl_pipe_id && auth_equal(want, a->proof.data, AUTH_TAG_BYTES)) {
            if (!w->ctl_authed) {
                LOG_INFO("worker", "the router proved the cluster secret (pipe %u)", pipe);
            }
            w->ctl_authed = 1;
        } else {
            wk_core_reject(&w->core, "control", "auth",
                           "wrong proof of the cluster secret from the router");
        }
    }
}

/* ---- Control link: receiving -------------------------------------------- */

/* One envelope from the router (a message, or an item of its BATCH); takes
 * env. */
static void on_ctl_env(struct worker *w, Tandem__Envelope *env, uint32_t pipe)
{
    if (env->kind == TANDEM__ENVELOPE__KIND__AUTH) {
        handle_auth(w, env->auth, pipe);
    } else if (env->kind != TANDEM__ENVELOPE__KIND__DECODE_JOB &&
               env->kind != TANDEM__ENVELOPE__KIND__CANCEL) {
        wk_core_reject(&w->core, "control", "unexpected_kind", "%s is not sent to a worker",
                       wire_kind_name(env->kind));
    } else if (w->secret.set && (!w->ctl_authed || pipe != w->ctl_pipe_id)) {
        wk_core_reject(&w->core, "control", "auth",
                       "%s from a router that has not proved the cluster secret",
                       wire_kind_name(env->kind));
    } else {
        if (env->kind == TANDEM__ENVELOPE__KIND__DECODE_JOB && env->decode_job->control_batches &&
            pipe == w->ctl_pipe_id && !w->ctl_out.coalesce &&
            wk_out_coalesce(&w->ctl_out, 1) == 0) {
            LOG_DEBUG("worker", "the router takes batches (pipe %u)", pipe);
        }
        if (w->stopping) {
            if (env->kind == TANDEM__ENVELOPE__KIND__DECODE_JOB) {
                wk_core_send_busy(&w->core, env->request_id, TANDEM__BUSY__REASON__DRAINING,
                                  "worker shutting down");
            }
        } else if (w->holding) {
            defer(w, env, NULL);
            return;
        } else {
            wk_core_on_control(&w->core, env);
        }
    }
    wire_free(env);
}

static void on_ctl_msg(struct uvnng *u, nng_msg *msg)
{
    struct worker *w = u->data;
    Tandem__Envelope *env;
    int rc = wire_unpack(nng_msg_body(msg), nng_msg_len(msg), &env);
    size_t len = nng_msg_len(msg);
    uint32_t pipe = nng_pipe_id(nng_msg_get_pipe(msg));
    nng_msg_free(msg);
    if (rc != 0) {
        wk_core_reject(&w->core, "control", tandem_errname(rc), "%zu bytes: %s", len,
                       wire_error_detail());
        /* A router speaking another version is told so (docs/protocol.md,
         * "Versioning"), at most once a second. */
        uint64_t now = uv_now(&w->loop);
        if (rc == TANDEM_EVERSION && now - w->version_error_ms >= 1000) {
            w->version_error_ms = now;
            wk_core_send_error(&w->core, 0, TANDEM_EVERSION, "%s speaks protocol version %d",
                               w->core.id, WIRE_VERSION);
        }
        return;
    }
    if (env->kind != TANDEM__ENVELOPE__KIND__BATCH) {
        on_ctl_env(w, env, pipe);
    } else {
        for (size_t i = 0; i < env->batch->n_envelopes; i++) {
            Tandem__Envelope *item;
            rc = wire_unpack_item(env, i, &item);
            if (rc != 0) {
                wk_core_reject(&w->core, "control", tandem_errname(rc), "batch item %zu: %s", i,
                               wire_error_detail());
                continue;
            }
            on_ctl_env(w, item, pipe);
        }
        wire_free(env);
    }
    worker_kick(w);
}

/* PAIR0 takes one router at a time: NNG rejects a second pipe while one is
 * attached, and may report the removal of a pipe it never reported as added.
 * So only pipes seen added count, by id, and a router learns its link is up
 * from the WorkerHello this sends on it. */
static void on_ctl_pipe(struct uvnng *u, nng_pipe pipe, nng_pipe_ev ev)
{
    struct worker *w = u->data;
    uint32_t id = nng_pipe_id(pipe);
    if (ev == NNG_PIPE_EV_ADD_POST) {
        if (w->ctl_pipe_id != 0) {
            LOG_WARN("worker", "control pipe %u added while pipe %u is attached", id,
                     w->ctl_pipe_id);
        }
        wk_out_coalesce(&w->ctl_out, 0); /* until this router's first job says it takes them */
        w->ctl_pipe_id = id;
        w->ctl_pipes = 1;
        w->ctl_authed = 0;
        w->ctl_hello_sent = 0;
        update_router(w);
        LOG_INFO("worker", "router connected (pipe %u)", id);
        if (w->stopping) {
            return;
        }
        if (!w->secret.set) {
            send_hello(w);
            return;
        }
        /* Challenge the router; answer its challenge (maybe here already). */
        if (auth_random(w->ctl_nonce, sizeof(w->ctl_nonce)) != 0) {
            LOG_ERROR("worker", "no random nonce: the router cannot prove itself");
        }
        send_auth(w, w->ctl_nonce, NULL);
        if (w->router_nonce_pipe == id) {
            send_hello(w);
        }
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        if (id != w->ctl_pipe_id) {
            LOG_DEBUG("worker", "control pipe %u (never attached) closed", id);
            return;
        }
        w->ctl_pipe_id = 0;
        w->ctl_pipes = 0;
        w->ctl_authed = 0;
        w->ctl_hello_sent = 0;
        LOG_INFO("worker", "router disconnected (pipe %u)", id);
        wk_out_clear(&w->ctl_out);
        wk_out_coalesce(&w->ctl_out, 0);
        held_drop(w, NULL);
        update_router(w); /* drops the buffered KV events */
        if (!w->stopping) {
            wk_core_on_control_down(&w->core);
            worker_kick(w);
        }
    }
}

/* ---- Data link ---------------------------------------------------------- */

static void on_data_msg(struct uvnng *u, nng_msg *msg)
{
    struct worker *w = u->data;
    struct wire_frame f;
    size_t len = nng_msg_len(msg);
    if (w->secret.set) {
        /* Before anything is decoded: the envelope must end with a valid
         * tag of the cluster secret. */
        const uint8_t *b = nng_msg_body(msg);
        uint32_t n = len >= 4 ? (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                                    (uint32_t)b[3] << 24
                              : 0;
        int arc = len < 4 || n > len - 4 ? TANDEM_EPROTO : auth_frame_check(&w->secret, b + 4, n);
        if (arc != 0) {
            nng_msg_free(msg);
            wk_core_reject(&w->core, "data", "auth", "%zu bytes: %s", len,
                           arc == TANDEM_EAUTH ? "wrong tag of the cluster secret"
                                               : "no tag of the cluster secret");
            return;
        }
    }
    int rc = wire_frame_unpack_msg(msg, &f);
    if (rc != 0) {
        nng_msg_free(msg);
        wk_core_reject(&w->core, "data", tandem_errname(rc), "%zu bytes: %s", len,
                       wire_error_detail());
        if (rc == TANDEM_ECHECKSUM) {
            wk_core_reject_frame(&w->core, "checksum", "payload does not match its XXH3-64");
        }
        return;
    }
    if (w->holding && !w->stopping) {
        defer(w, NULL, &f);
        return;
    }
    if (!w->stopping) {
        wk_core_on_data(&w->core, &f);
    }
    wire_frame_fini(&f);
    worker_kick(w);
}

/* ---- Peers -------------------------------------------------------------- */

static void peer_release(struct wk_peer *p)
{
    if (--p->closing == 0) {
        free(p->addr);
        free(p);
    }
}

static void on_peer_out_closed(uv_handle_t *h)
{
    struct wk_out *o = h->data;
    peer_release((struct wk_peer *)((char *)o - offsetof(struct wk_peer, out)));
}

static void on_peer_u_closed(uv_handle_t *h)
{
    struct uvnng *u = h->data;
    peer_release(u->data);
}

static void peer_close(struct wk_peer *p)
{
    p->closing = 2;
    wk_out_close(&p->out, on_peer_out_closed);
    uvnng_close(&p->u, on_peer_u_closed);
}

static void on_peer_pipe(struct uvnng *u, nng_pipe pipe, nng_pipe_ev ev)
{
    struct wk_peer *p = u->data;
    struct worker *w = p->w;
    (void)pipe;
    if (ev == NNG_PIPE_EV_ADD_POST) {
        p->pipes++;
        p->link.up = 1;
        p->link.ever_up = 1;
        LOG_DEBUG("worker", "peer %s connected", p->addr);
        if (!w->stopping) {
            wk_core_on_link(&w->core, &p->link, 1);
        }
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        if (p->pipes > 0) {
            p->pipes--;
        }
        p->link.up = p->pipes > 0;
        LOG_INFO("worker", "peer %s disconnected", p->addr);
        if (!w->stopping) {
            wk_core_on_link(&w->core, &p->link, 0);
            worker_kick(w);
        }
    }
}

/* Evicts one unreferenced peer that is down and has nothing queued. */
static int peer_evict_one(struct worker *w)
{
    for (struct wk_peer **pp = &w->peers; *pp; pp = &(*pp)->next) {
        struct wk_peer *p = *pp;
        if (p->refs == 0 && p->pipes == 0 && wk_out_pending(&p->out) == 0) {
            *pp = p->next;
            w->n_peers--;
            LOG_INFO("worker", "closing idle peer socket to %s", p->addr);
            peer_close(p);
            return 1;
        }
    }
    return 0;
}

/* The cached peer socket for a data address, dialing it (non-blocking) the
 * first time. Returns 0, TANDEM_EINVAL (bad URL), TANDEM_ETOOBIG (too many
 * peers), or an NNG/uv error. The peer lives until shutdown (or until it is
 * evicted while unreferenced and down). */
static int peer_get(struct worker *w, const char *addr, struct wk_peer **out)
{
    for (struct wk_peer *p = w->peers; p; p = p->next) {
        if (strcmp(p->addr, addr) == 0) {
            *out = p;
            return 0;
        }
    }
    if (w->n_peers >= WORKER_MAX_PEERS && !peer_evict_one(w)) {
        return TANDEM_ETOOBIG;
    }
    struct wk_peer *p = calloc(1, sizeof(*p));
    char *a = strdup(addr);
    if (p == NULL || a == NULL) {
        free(p);
        free(a);
        return TANDEM_ENOMEM;
    }
    p->w = w;
    p->addr = a;
    p->link.addr = a;
    p->link.last_rx_s = worker_now();
    int rv = nng_push0_open(&p->sock);
    if (rv != 0) {
        free(a);
        free(p);
        return wire_nng_err(rv);
    }
    rv = nng_socket_set_int(p->sock, NNG_OPT_SENDBUF, WORKER_PEER_SENDBUF);
    if (rv == 0) {
        rv = nng_socket_set_ms(p->sock, NNG_OPT_SENDTIMEO, WORKER_SEND_TIMEO_MS);
    }
    if (rv == 0) {
        rv = nng_socket_set_ms(p->sock, NNG_OPT_RECONNMINT, 50);
    }
    if (rv == 0) {
        rv = nng_socket_set_ms(p->sock, NNG_OPT_RECONNMAXT, 1000);
    }
    if (rv != 0) {
        nng_close(p->sock);
        free(a);
        free(p);
        return wire_nng_err(rv);
    }
    int rc = uvnng_init(&w->loop, &p->u, p->sock, NULL, on_peer_pipe, p);
    if (rc == 0) {
        rc = wk_out_init(&w->loop, &p->out, p->sock, WORKER_PEER_MAXQ);
        if (rc != 0) {
            /* Only the async handle is open: close it and free from its callback. */
            p->closing = 1;
            uvnng_close(&p->u, on_peer_u_closed);
            return rc;
        }
    } else {
        nng_close(p->sock);
        free(a);
        free(p);
        return rc;
    }
    /* A new dialer after UVNNG_REDIAL_MS without a pipe (common/uvnng.h). */
    rc = uvnng_dial(&p->u, addr);
    if (rc != 0) {
        LOG_WARN("worker", "peer %s: %s", addr, tls_error_detail());
        peer_close(p);
        return rc;
    }
    p->next = w->peers;
    w->peers = p;
    w->n_peers++;
    LOG_DEBUG("worker", "dialing peer %s", addr);
    *out = p;
    return 0;
}

static void seal_frame(void *arg, const void *env, size_t len, uint8_t tag[WIRE_AUTH_TAG_BYTES])
{
    auth_frame_tag(arg, env, len, tag);
}

/* Packs a data-link frame of env (+ payload for KV_FRAME) into *out, with
 * the envelope's auth_tag when a cluster secret is set (common/auth.h).
 * Returns 0 or a wire error; *out is the caller's on success. */
static int frame_msg(struct worker *w, const Tandem__Envelope *env, const void *payload,
                     size_t payload_len, nng_msg **out)
{
    if (!w->secret.set) {
        return wire_frame_pack_msg(env, payload, payload_len, out);
    }
    return wire_frame_pack_msg_sealed(env, payload, payload_len, seal_frame, &w->secret, out);
}

/* Frames env (+ payload for KV_FRAME) and queues it to the peer. */
static int peer_send(struct worker *w, struct wk_peer *p, const Tandem__Envelope *env,
                     const void *payload, size_t payload_len)
{
    nng_msg *msg;
    int rc = frame_msg(w, env, payload, payload_len, &msg);
    if (rc != 0) {
        LOG_ERROR("worker", "cannot frame %s for %s: %s (%s)", wire_kind_name(env->kind), p->addr,
                  tandem_strerror(rc), wire_error_detail());
        return rc;
    }
    rc = wk_out_send(&p->out, msg);
    if (rc != 0 && warn_allowed(w)) {
        LOG_WARN("worker", "dropped %s for %s: %s", wire_kind_name(env->kind), p->addr,
                 tandem_strerror(rc));
    }
    return rc;
}

/* Queues a ready data-link message to the peer; it is not handed to NNG
 * before uv_hrtime() reaches due_ns (0: now), and what is queued after it
 * waits too. Always consumes msg. */
static int peer_send_msg(struct worker *w, struct wk_peer *p, nng_msg *msg, uint64_t due_ns)
{
    int rc = wk_out_send_at(&p->out, msg, due_ns);
    if (rc != 0 && warn_allowed(w)) {
        LOG_WARN("worker", "dropped a message for %s: %s", p->addr, tandem_strerror(rc));
    }
    return rc;
}

/* ---- KV link model and timed steps -------------------------------------- */

/* Timed steps for a backend that gives its modelled step time, at a time
 * scale > 0; the backend is then built with time_scale 0 (it never sleeps):
 * see worker.h. Before wk_core_init. */
static void timed_init(struct worker *w, struct worker_config *cfg)
{
    const struct backend_desc *bd = backend_at((size_t)cfg->backend);
    if (bd != NULL && bd->step_seconds != NULL && (bd->reads & BACKEND_READS_HARDWARE) &&
        cfg->time_scale > 0) {
        w->timed = 1;
        w->scale = cfg->time_scale;
        w->step_seconds = bd->step_seconds;
        cfg->time_scale = 0;
    }
}

/* On for a backend with a KV-link model and a time scale > 0 (backend.h). */
static void link_model_init(struct worker *w)
{
    const struct backend_desc *bd = backend_of(w->core.be);
    if (bd != NULL && bd->transfer_seconds != NULL && bd->time_scale != NULL) {
        if (!w->timed) {
            w->scale = bd->time_scale(w->core.be);
        }
        w->link_model = w->scale > 0;
        w->transfer_seconds = bd->transfer_seconds;
    }
}

/* Holds msg (consumed) for p (NULL: the router) until the end of the step. */
static int hold_msg(struct worker *w, struct wk_peer *p, nng_msg *msg, uint64_t model_bytes)
{
    if (w->n_held == w->cap_held) {
        size_t cap = w->cap_held ? 2 * w->cap_held : 64;
        struct wk_held *h = realloc(w->held, cap * sizeof(*h));
        if (h == NULL) {
            nng_msg_free(msg);
            return TANDEM_ENOMEM;
        }
        w->held = h;
        w->cap_held = cap;
    }
    w->held[w->n_held++] = (struct wk_held){.msg = msg, .peer = p, .model_bytes = model_bytes};
    if (p != NULL) {
        p->refs++;
    }
    return 0;
}

/* Frames env (+ payload) for p and holds it until the end of the step. */
static int hold(struct worker *w, struct wk_peer *p, const Tandem__Envelope *env,
                const void *payload, size_t len, uint64_t model_bytes)
{
    nng_msg *msg;
    int rc = frame_msg(w, env, payload, len, &msg);
    if (rc != 0) {
        LOG_ERROR("worker", "cannot frame %s: %s (%s)", wire_kind_name(env->kind),
                  tandem_strerror(rc), wire_error_detail());
        return rc;
    }
    return hold_msg(w, p, msg, model_bytes);
}

static void held_unref(struct wk_held *h)
{
    if (h->peer != NULL && h->peer->refs > 0) {
        h->peer->refs--;
    }
}

/* Drops the held messages for p (NULL: the router), which went away. */
static void held_drop(struct worker *w, struct wk_peer *p)
{
    size_t k = 0;
    for (size_t i = 0; i < w->n_held; i++) {
        struct wk_held *h = &w->held[i];
        if (h->peer == p) {
            nng_msg_free(h->msg);
            held_unref(h);
        } else {
            w->held[k++] = *h;
        }
    }
    w->n_held = k;
}

/* Sends the held messages as of now_ns (uv_hrtime: the step's end), each KV
 * frame due when the modelled link (one per destination) has carried its
 * bytes, plus the link latency. */
static void release_held(struct worker *w, uint64_t now_ns)
{
    double lat = w->n_held > 0 && w->link_model ? w->transfer_seconds(w->core.be, 0) : 0;
    for (size_t i = 0; i < w->n_held; i++) {
        struct wk_held *h = &w->held[i];
        if (h->peer == NULL) {
            send_control_msg(w, h->msg, "a message");
            continue;
        }
        uint64_t due = 0;
        if (h->model_bytes > 0 && w->link_model) {
            double bw_s = w->transfer_seconds(w->core.be, h->model_bytes) - lat;
            uint64_t start = h->peer->link_free_ns > now_ns ? h->peer->link_free_ns : now_ns;
            h->peer->link_free_ns = start + (uint64_t)(bw_s * w->scale * 1e9);
            due = h->peer->link_free_ns + (uint64_t)(lat * w->scale * 1e9);
        }
        peer_send_msg(w, h->peer, h->msg, due);
        held_unref(h);
    }
    w->n_held = 0;
}

/* A message for the core that arrived during a timed step (env or f, owned
 * from here on): kept for the step's end. Taken now when out of memory. */
static void defer(struct worker *w, Tandem__Envelope *env, struct wire_frame *f)
{
    if (w->n_inbox == w->cap_inbox) {
        size_t cap = w->cap_inbox ? 2 * w->cap_inbox : 64;
        struct wk_inbox *q = realloc(w->inbox, cap * sizeof(*q));
        if (q == NULL) {
            LOG_WARN("worker", "out of memory deferring a message: taken during the step");
            if (env != NULL) {
                wk_core_on_control(&w->core, env);
                wire_free(env);
            } else {
                wk_core_on_data(&w->core, f);
                wire_frame_fini(f);
            }
            return;
        }
        w->inbox = q;
        w->cap_inbox = cap;
    }
    w->inbox[w->n_inbox++] =
        (struct wk_inbox){.env = env, .f = env == NULL ? *f : (struct wire_frame){0}};
}

/* Hands the deferred messages to the core, in arrival order (take = 1), or
 * frees them (take = 0). */
static void inbox_drain(struct worker *w, int take)
{
    /* The core may not defer more now (holding is off), so the array stays. */
    for (size_t i = 0; i < w->n_inbox; i++) {
        struct wk_inbox *m = &w->inbox[i];
        if (m->env != NULL) {
            if (take) {
                wk_core_on_control(&w->core, m->env);
            }
            wire_free(m->env);
        } else {
            if (take) {
                wk_core_on_data(&w->core, &m->f);
            }
            wire_frame_fini(&m->f);
        }
    }
    w->n_inbox = 0;
}

/* At exit: peers may be gone by now, only the messages are ours to free. */
static void free_held(struct worker *w)
{
    for (size_t i = 0; i < w->n_held; i++) {
        nng_msg_free(w->held[i].msg);
    }
    free(w->held);
    w->held = NULL;
    w->n_held = w->cap_held = 0;
    inbox_drain(w, 0);
    free(w->inbox);
    w->inbox = NULL;
    w->cap_inbox = 0;
}

/* ---- The core's host ops ------------------------------------------------ */

static struct wk_peer *peer_of(struct wk_link *l)
{
    return (struct wk_peer *)((char *)l - offsetof(struct wk_peer, link));
}

static int host_send_control(void *host, const Tandem__Envelope *env)
{
    struct worker *w = host;
    if (!w->holding) {
        return send_control(w, env);
    }
    nng_msg *msg;
    int rc = pack_control(env, &msg);
    return rc != 0 ? rc : hold_msg(w, NULL, msg, 0);
}

static int host_link_get(void *host, const char *addr, struct wk_link **out)
{
    struct wk_peer *p = NULL;
    int rc = peer_get(host, addr, &p);
    if (rc == 0) {
        *out = &p->link;
    }
    return rc;
}

static void host_link_ref(void *host, struct wk_link *l)
{
    (void)host;
    peer_of(l)->refs++;
}

static void host_link_unref(void *host, struct wk_link *l)
{
    (void)host;
    struct wk_peer *p = peer_of(l);
    if (p->refs > 0) {
        p->refs--;
    }
}

static int host_link_send(void *host, struct wk_link *l, const Tandem__Envelope *env,
                          const void *payload, size_t len, uint64_t model_bytes)
{
    struct worker *w = host;
    if (w->holding || (w->link_model && w->core.role->link_model)) {
        return hold(w, peer_of(l), env, payload, len, model_bytes);
    }
    return peer_send(w, peer_of(l), env, payload, len);
}

static void host_link_drop(void *host, struct wk_link *l)
{
    wk_out_clear(&peer_of(l)->out);
    held_drop(host, peer_of(l));
}

static double host_now(void *host)
{
    (void)host;
    return worker_now();
}

static uint64_t host_unix_ms(void *host)
{
    (void)host;
    return unix_ms();
}

static void host_kick(void *host)
{
    worker_kick(host);
}

static const struct wk_host_ops host_ops = {
    .send_control = host_send_control,
    .link_get = host_link_get,
    .link_ref = host_link_ref,
    .link_unref = host_link_unref,
    .link_send = host_link_send,
    .link_drop = host_link_drop,
    .now = host_now,
    .unix_ms = host_unix_ms,
    .kick = host_kick,
};

/* What /metrics shows that only the host knows. */
static void host_collect(struct metrics_registry *reg, void *arg)
{
    (void)reg;
    struct worker *w = arg;
    metrics_gauge_set(w->core.m.peers, w->n_peers);
    struct http_server_stats hs;
    http_server_get_stats(&w->http, &hs);
    if (hs.errors > w->last_http_errors) {
        metrics_counter_add(w->core.m.http_errors, (double)(hs.errors - w->last_http_errors));
        w->last_http_errors = hs.errors;
    }
    metrics_counter_add(w->core.m.ctl_messages, (double)(w->ctl_out.sent - w->last_ctl_messages));
    w->last_ctl_messages = w->ctl_out.sent;
}

/* ---- Stepping ----------------------------------------------------------- */

/* A step blocks the loop (tiny computes) or defers the heartbeat (a timed
 * step): the heartbeat timer may be late, so a due heartbeat also goes out
 * between steps. */
static void heartbeat_if_due(struct worker *w)
{
    if (ctl_ready(w) &&
        uv_hrtime() - w->last_hb_ns >= (uint64_t)w->core.cfg.heartbeat_ms * 1000000u) {
        send_heartbeat(w);
    }
}

/* After a step that returned n: keeps stepping while there is work that can
 * move; n == 0: nothing can until new work, a cancel or freed blocks
 * (worker_kick restarts us then). */
static void step_next(struct worker *w, int n)
{
    if (n == 0 || !wk_core_busy(&w->core) || w->stopping) {
        uv_idle_stop(&w->step_idle);
        w->stepping = 0;
    } else if (!w->stepping) {
        worker_kick(w);
    } else {
        w->pending_ns = uv_hrtime();
    }
}

/* The end of a timed step: its outputs leave (KV frames paced from its
 * modelled end), then what arrived during it reaches the core, in order. */
static void timed_step_end(struct worker *w)
{
    uint64_t end = uv_hrtime();
    struct worker_metrics *m = &w->core.m;
    double modelled = (double)(w->step_due_ns - w->step_start_ns) / 1e9;
    double wall = (double)(end - w->step_start_ns) / 1e9;
    metrics_histogram_observe(m->step_modelled, modelled);
    metrics_histogram_observe(m->step_wall, wall);
    metrics_histogram_observe(m->step_overrun, wall - modelled);
    w->holding = 0;
    release_held(w, w->step_due_ns);
    w->stepping = 0; /* the idle handle is stopped: kicks from here start the next step */
    inbox_drain(w, 1);
    wk_core_flush_events(&w->core);
    heartbeat_if_due(w);
    if (w->step_n > 0) {
        worker_kick(w);
    }
}

static void on_step_alarm(struct wk_alarm *a)
{
    timed_step_end(a->data);
}

/* A timed step: computed now, ended on the alarm at its start + modelled
 * seconds x time scale (at once when that has passed, or when nothing
 * moved). */
static void timed_step(struct worker *w)
{
    w->step_start_ns = uv_hrtime();
    w->holding = 1;
    w->step_n = wk_core_step(&w->core);
    double dt = w->step_n > 0 ? w->step_seconds(w->core.be) * w->scale : 0;
    w->step_due_ns = w->step_start_ns + (uint64_t)(dt * 1e9);
    uv_idle_stop(&w->step_idle); /* w->stepping stays 1: kicks wait for the end */
    if (w->step_n > 0 && w->step_due_ns > uv_hrtime()) {
        wk_alarm_at(&w->step_alarm, w->step_due_ns);
    } else {
        timed_step_end(w);
    }
}

static void on_step(uv_idle_t *h)
{
    struct worker *w = h->data;
    /* What the timers sent (a heartbeat) leaves before a step that computes. */
    wk_out_flush(&w->ctl_out);
    if (w->pending_ns != 0) {
        metrics_histogram_observe(w->core.m.step_idle_gap,
                                  (double)(uv_hrtime() - w->pending_ns) / 1e9);
        w->pending_ns = 0;
    }
    int n = 0;
    if (wk_core_busy(&w->core)) {
        if (w->timed) {
            timed_step(w);
            return;
        }
        n = wk_core_step(&w->core);
        /* Without the link model frames left during the step, as soon as
         * their chunk was computed. */
        release_held(w, uv_hrtime());
        heartbeat_if_due(w);
    }
    step_next(w, n);
}

/* Makes the scheduler step again (after new work, a cancel or freed blocks). */
static void worker_kick(struct worker *w)
{
    if (!w->stepping && !w->stopping && wk_core_busy(&w->core)) {
        uv_idle_start(&w->step_idle, on_step);
        w->stepping = 1;
        w->pending_ns = uv_hrtime();
    }
}

/* ---- Timers ------------------------------------------------------------- */

static void on_heartbeat(uv_timer_t *t)
{
    struct worker *w = t->data;
    if (w->stopping) {
        return;
    }
    /* Not twice in a row when one just left between steps. A timed step
     * defers the heartbeat and the tick: its end sends a due heartbeat (as the
     * simulator does), the next period ticks. */
    if (!w->holding && ctl_ready(w) &&
        uv_hrtime() - w->last_hb_ns >= (uint64_t)w->core.cfg.heartbeat_ms * 1000000u / 2) {
        send_heartbeat(w);
    }
    uint64_t now = uv_now(&w->loop);
    if (!w->holding) {
        wk_core_tick(&w->core);
    }
    for (struct wk_peer *p = w->peers; p; p = p->next) {
        size_t n = wk_out_expire(&p->out, now, (uint64_t)w->core.cfg.transfer_timeout_ms);
        if (n > 0) {
            LOG_WARN("worker", "peer %s took nothing for %d ms: dropped %zu queued messages",
                     p->addr, w->core.cfg.transfer_timeout_ms, n);
        }
    }
    worker_kick(w);
}

static void on_announce(uv_timer_t *t)
{
    struct worker *w = t->data;
    Tandem__WorkerHello h;
    fill_hello(w, &h);
    uint8_t tag[AUTH_TAG_BYTES];
    if (w->secret.set) {
        auth_announce_tag(&w->secret, w->core.id, w->ctl_url, w->incarnation, tag);
        h.auth_proof.data = tag;
        h.auth_proof.len = sizeof(tag);
    }
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__HELLO, 0, &h);
    nng_msg *msg;
    if (wire_pack_msg(&env, &msg) == 0) {
        /* Nobody listening yet is normal: NNG redials, we retry next second. */
        wire_sendmsg(w->announce.sock, msg, NNG_FLAG_NONBLOCK);
    }
}

/* ---- HTTP --------------------------------------------------------------- */

static void on_http(struct http_req *req, void *user)
{
    struct worker *w = user;
    const char *path = http_req_path(req);
    int get = strcmp(http_req_method(req), "GET") == 0;
    const char *const text[] = {"Content-Type", "text/plain; charset=utf-8", NULL};
    if (get && strcmp(path, "/metrics") == 0) {
        metrics_respond(req, w->core.reg);
    } else if (get && strcmp(path, "/health") == 0) {
        http_req_respond(req, 200, text, "ok\n", 3);
    } else {
        http_req_respond(req, 404, text, "not found\n", 10);
    }
}

/* ---- Shutdown ----------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
    (void)h;
}

static void close_all(struct worker *w)
{
    if (have & HAVE_TIMERS) {
        uv_close((uv_handle_t *)&w->hb_timer, on_handle_closed);
        uv_close((uv_handle_t *)&w->stop_timer, on_handle_closed);
        uv_close((uv_handle_t *)&w->step_idle, on_handle_closed);
        uv_close((uv_handle_t *)&w->flush_check, on_handle_closed);
        /* The signal handles stay open (unreferenced) until the process is
         * about to return: closing one restores the default action, and a
         * second SIGTERM during cleanup would then kill us with status 143. */
        uv_unref((uv_handle_t *)&w->sigint);
        uv_unref((uv_handle_t *)&w->sigterm);
    }
    if (have & HAVE_ALARM) {
        wk_alarm_close(&w->step_alarm, on_handle_closed);
    }
    if (have & HAVE_ANNOUNCE) {
        uv_close((uv_handle_t *)&w->announce_timer, on_handle_closed);
        uvnng_close(&w->announce, on_handle_closed);
    }
    if (have & HAVE_HTTP) {
        http_server_close(&w->http, NULL);
    }
    if (have & HAVE_CTL) {
        wk_out_close(&w->ctl_out, on_handle_closed);
        uvnng_close(&w->ctl, on_handle_closed);
    }
    if (have & HAVE_DATA) {
        uvnng_close(&w->data, on_handle_closed);
    }
    while (w->peers != NULL) {
        struct wk_peer *p = w->peers;
        w->peers = p->next;
        peer_close(p);
    }
    w->n_peers = 0;
    have = 0;
}

static int queues_empty(struct worker *w)
{
    if ((have & HAVE_CTL) && w->ctl_pipes > 0 && wk_out_pending(&w->ctl_out) > 0) {
        return 0;
    }
    for (struct wk_peer *p = w->peers; p; p = p->next) {
        if (p->pipes > 0 && wk_out_pending(&p->out) > 0) {
            return 0;
        }
    }
    return 1;
}

static void on_stop_tick(uv_timer_t *t)
{
    struct worker *w = t->data;
    if (queues_empty(w) || uv_now(&w->loop) - w->stop_started_ms >= STOP_DRAIN_MS) {
        uv_timer_stop(t);
        close_all(w);
    }
}

static void worker_stop(struct worker *w)
{
    if (w->stopping) {
        return;
    }
    LOG_INFO("worker", "stopping: ending every request");
    if (w->holding) { /* a timed step ends here: its outputs first */
        wk_alarm_stop(&w->step_alarm);
        w->holding = 0;
        inbox_drain(w, 0);
    }
    wk_core_stop(&w->core);
    release_held(w, uv_hrtime());
    wk_core_flush_events(&w->core);
    w->stopping = 1;
    w->stop_started_ms = uv_now(&w->loop);
    if (w->stepping) {
        uv_idle_stop(&w->step_idle);
        w->stepping = 0;
    }
    uv_timer_stop(&w->hb_timer);
    if (have & HAVE_ANNOUNCE) {
        uv_timer_stop(&w->announce_timer);
    }
    uv_timer_start(&w->stop_timer, on_stop_tick, 0, 10);
}

static void on_signal(uv_signal_t *s, int signum)
{
    struct worker *w = s->data;
    LOG_INFO("worker", "signal %d", signum);
    if (!w->stopping) {
        /* Requests end and queues drain (STOP_DRAIN_MS) before the NNG
         * sockets close; a stop that still hangs ends with status 70. */
        watchdog_start("tandem worker", STOP_WATCHDOG_S);
        uvnng_set_exiting(); /* the NNG close deadlock: common/uvnng.h */
    }
    worker_stop(w);
}

/* ---- Startup ------------------------------------------------------------ */

/* Resolves the listener's URL (the real port for tcp://...:0), with the
 * host replaced by --advertise when given. */
static void listener_url(const struct worker *w, nng_listener l, const char *given, char *out,
                         size_t cap)
{
    char *url = NULL;
    if (nng_listener_get_string(l, NNG_OPT_URL, &url) == 0 && url != NULL) {
        snprintf(out, cap, "%s", url);
        nng_strfree(url);
    } else {
        snprintf(out, cap, "%s", given);
    }
    if (w->core.cfg.advertise != NULL) {
        char tmp[WIRE_MAX_ADDR_BYTES + 1];
        if (tls_url_with_host(out, w->core.cfg.advertise, tmp, sizeof(tmp)) == 0) {
            snprintf(out, cap, "%s", tmp);
        }
    }
}

static int open_control(struct worker *w, char *err, size_t errlen)
{
    nng_socket s;
    int rv = nng_pair0_open(&s);
    if (rv != 0) {
        snprintf(err, errlen, "control socket: %s", nng_strerror(rv));
        return wire_nng_err(rv);
    }
    if (wire_socket_setup(s, WIRE_LINK_CONTROL) != 0 ||
        nng_socket_set_int(s, NNG_OPT_SENDBUF, WORKER_CTL_SENDBUF) != 0 ||
        nng_socket_set_int(s, NNG_OPT_RECVBUF, WORKER_CTL_SENDBUF) != 0 ||
        nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, WORKER_SEND_TIMEO_MS) != 0) {
        nng_close(s);
        snprintf(err, errlen, "control socket options");
        return TANDEM_ENNG;
    }
    int rc = uvnng_init(&w->loop, &w->ctl, s, on_ctl_msg, on_ctl_pipe, w);
    if (rc == 0) {
        rc = wk_out_init(&w->loop, &w->ctl_out, s, WORKER_CTL_MAXQ);
        w->ctl_out.handoff_copy = 1; /* lsan.supp: wire_handoff */
        if (rc != 0) {
            uvnng_close(&w->ctl, on_handle_closed);
        }
    } else {
        nng_close(s);
    }
    if (rc != 0) {
        snprintf(err, errlen, "control socket: %s", tandem_strerror(rc));
        return rc;
    }
    have |= HAVE_CTL;
    nng_listener l;
    rc = tls_listen(s, w->core.cfg.control_url, &l);
    if (rc != 0) {
        snprintf(err, errlen, "--control %s: %s", w->core.cfg.control_url, tls_error_detail());
        return rc;
    }
    listener_url(w, l, w->core.cfg.control_url, w->ctl_url, sizeof(w->ctl_url));
    return 0;
}

static int open_data(struct worker *w, char *err, size_t errlen)
{
    nng_socket s;
    int rv = nng_pull0_open(&s);
    if (rv != 0) {
        snprintf(err, errlen, "data socket: %s", nng_strerror(rv));
        return wire_nng_err(rv);
    }
    if (wire_socket_setup(s, WIRE_LINK_DATA) != 0 ||
        nng_socket_set_int(s, NNG_OPT_RECVBUF, WORKER_DATA_RECVBUF) != 0) {
        nng_close(s);
        snprintf(err, errlen, "data socket options");
        return TANDEM_ENNG;
    }
    /* Queued: a step blocks the loop (tiny computes; the sim slept, before
     * its steps were timed), and PULL0 reads a pipe's next frame only once
     * the last one was taken, so polled receiving installed one frame per
     * step per sender (docs/experiments.md, "The hand-off bottleneck").
     * NNG's threads now keep receiving into a bounded queue and the loop
     * installs all of it between two steps. */
    int rc = uvnng_init_queued(&w->loop, &w->data, s, on_data_msg, NULL, w, WORKER_DATA_RECVBUF,
                               WORKER_DATA_RECVQ);
    if (rc != 0) {
        nng_close(s);
        snprintf(err, errlen, "data socket: %s", tandem_strerror(rc));
        return rc;
    }
    have |= HAVE_DATA;
    nng_listener l;
    rc = tls_listen(s, w->core.cfg.kv_url, &l);
    if (rc != 0) {
        snprintf(err, errlen, "--kv %s: %s", w->core.cfg.kv_url, tls_error_detail());
        return rc;
    }
    listener_url(w, l, w->core.cfg.kv_url, w->core.kv_addr, sizeof(w->core.kv_addr));
    return 0;
}

static int open_announce(struct worker *w, char *err, size_t errlen)
{
    nng_socket s;
    int rv = nng_push0_open(&s);
    if (rv != 0) {
        snprintf(err, errlen, "announce socket: %s", nng_strerror(rv));
        return wire_nng_err(rv);
    }
    nng_socket_set_int(s, NNG_OPT_SENDBUF, 1);
    nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 1000);
    int rc = uvnng_init(&w->loop, &w->announce, s, NULL, NULL, w);
    if (rc != 0) {
        nng_close(s);
        snprintf(err, errlen, "announce socket: %s", tandem_strerror(rc));
        return rc;
    }
    uv_timer_init(&w->loop, &w->announce_timer);
    have |= HAVE_ANNOUNCE; /* close_all closes both */
    /* A new dialer after UVNNG_REDIAL_MS without a pipe: NNG 1.5.2 can leave
     * one that never dials again (a worker never rejoined a restarted router,
     * docs/reliability.md). */
    rc = uvnng_dial(&w->announce, w->core.cfg.router);
    if (rc != 0) {
        snprintf(err, errlen, "--router %s: %s", w->core.cfg.router, tls_error_detail());
        return rc;
    }
    w->announce_timer.data = w;
    uv_timer_start(&w->announce_timer, on_announce, 0, WORKER_ANNOUNCE_MS);
    return 0;
}

static void init_timers(struct worker *w)
{
    uv_timer_init(&w->loop, &w->hb_timer);
    w->hb_timer.data = w;
    uv_timer_start(&w->hb_timer, on_heartbeat, (uint64_t)w->core.cfg.heartbeat_ms,
                   (uint64_t)w->core.cfg.heartbeat_ms);
    uv_timer_init(&w->loop, &w->stop_timer);
    w->stop_timer.data = w;
    uv_idle_init(&w->loop, &w->step_idle);
    w->step_idle.data = w;
    uv_check_init(&w->loop, &w->flush_check);
    w->flush_check.data = w;
    uv_check_start(&w->flush_check, on_flush_check);
    uv_signal_init(&w->loop, &w->sigint);
    w->sigint.data = w;
    uv_signal_start(&w->sigint, on_signal, SIGINT);
    uv_signal_init(&w->loop, &w->sigterm);
    w->sigterm.data = w;
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    have |= HAVE_TIMERS;
    have_signals = 1;
}

static void unlink_ipc(const char *url)
{
    if (strncmp(url, "ipc://", 6) == 0 && url[6] != '\0') {
        unlink(url + 6);
    }
}

/* Binds everything and prints READY. Returns 0 or an error (message in err). */
static int start(struct worker *w, char *err, size_t errlen)
{
    int rc = open_control(w, err, errlen);
    if (rc == 0) {
        rc = open_data(w, err, errlen);
    }
    if (rc != 0) {
        return rc;
    }
    rc = http_server_init(&w->http, &w->loop, NULL, on_http, w);
    if (rc != 0) {
        snprintf(err, errlen, "metrics server: %s", tandem_strerror(rc));
        return rc;
    }
    have |= HAVE_HTTP;
    rc = http_server_listen(&w->http, w->core.cfg.metrics_host, w->core.cfg.metrics_port);
    if (rc != 0) {
        snprintf(err, errlen, "--metrics-host %s --metrics-port %d: %s", w->core.cfg.metrics_host,
                 w->core.cfg.metrics_port, tandem_strerror(rc));
        return rc;
    }
    w->http_port = http_server_port(&w->http);
    const char *mhost =
        w->core.cfg.advertise != NULL ? w->core.cfg.advertise : w->core.cfg.metrics_host;
    int v6 = strchr(mhost, ':') != NULL;
    snprintf(w->metrics_addr, sizeof(w->metrics_addr), "%s%s%s:%d", v6 ? "[" : "", mhost,
             v6 ? "]" : "", w->http_port);
    init_timers(w);
    if (w->timed) {
        rc = wk_alarm_init(&w->loop, &w->step_alarm, on_step_alarm);
        if (rc != 0) {
            snprintf(err, errlen, "step timer: %s (%s)", tandem_strerror(rc), strerror(errno));
            return rc;
        }
        w->step_alarm.data = w;
        have |= HAVE_ALARM;
    }
    if (w->core.cfg.router != NULL) {
        rc = open_announce(w, err, errlen);
        if (rc != 0) {
            return rc;
        }
    }
    printf("READY id=%s role=%s control=%s kv=%s metrics=%s\n", w->core.id, w->core.role->name,
           w->ctl_url, w->core.kv_addr, w->metrics_addr);
    fflush(stdout);
    LOG_INFO("worker", "%s worker %s: control %s, kv %s, metrics http://%s/metrics",
             w->core.role->name, w->core.id, w->ctl_url, w->core.kv_addr, w->metrics_addr);
    return 0;
}

/* KV frames are large (128 KiB to a few MiB each) and come and go in bursts
 * of a whole prompt. With glibc's defaults a burst is returned to the kernel
 * as soon as it is freed (heap trimmed, or munmap above the mmap threshold)
 * and the next transfer faults every page back in: measured, that was most
 * of the cost of shipping a tiny block (docs/performance.md, "## KV transfer
 * (workers)"). Keep freed memory in the heap instead; what the heap holds
 * is bounded by the send queues (WORKER_PEER_MAXQ, NNG's buffers) and the
 * data link's receive queue (WORKER_DATA_RECVQ). Blocks
 * above 32 MiB (glibc's largest mmap threshold) still use mmap. */
static void tune_malloc(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

int worker_main(int argc, char **argv, const char *binary, const struct worker_role *role,
                const struct worker_role *colocated)
{
    static struct worker wk; /* one per process; big, so not on the stack */
    static struct worker_config cfg;
    struct worker *w = &wk;
    char err[1024] = "";
    int rc = wk_config_parse(&cfg, argc, argv, binary, colocated != NULL, stdout, err, sizeof(err));
    if (rc == FLAGS_HELP) {
        return 0;
    }
    if (rc == FLAGS_VERSION) {
        printf("%s %s\n", binary, TANDEM_VERSION);
        return 0;
    }
    if (rc != FLAGS_OK) {
        fprintf(stderr, "%s: %s\n", binary, err);
        return 2;
    }
    const struct worker_role *r = cfg.colocated && colocated != NULL ? colocated : role;
    char id[WIRE_MAX_NAME_BYTES + 1];
    if (cfg.id != NULL) {
        if (cfg.id[0] == '\0' || strlen(cfg.id) > WIRE_MAX_NAME_BYTES) {
            fprintf(stderr, "%s: --id: must be 1 to %u bytes\n", binary, WIRE_MAX_NAME_BYTES);
            return 2;
        }
        snprintf(id, sizeof(id), "%s", cfg.id);
    } else {
        snprintf(id, sizeof(id), "%s-%ld", r->name, (long)getpid());
    }
    log_init(id, (enum log_level)cfg.log_level);
    signal(SIGPIPE, SIG_IGN);
    rc = tls_init(cfg.tls_ca, cfg.tls_cert, cfg.tls_key, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", binary, err);
        return 2;
    }
    const char *secret_path = auth_secret_path(cfg.cluster_secret_file);
    if (secret_path != NULL) {
        int loose = 0;
        if (auth_secret_load(secret_path, &w->secret, &loose, err, sizeof(err)) != 0) {
            fprintf(stderr, "%s: %s\n", binary, err);
            return 2;
        }
        if (loose) {
            LOG_WARN("worker", "cluster secret file %s is readable by group or others",
                     secret_path);
        }
        LOG_INFO("worker", "cluster secret from %s: peers must prove it", secret_path);
    }
    w->incarnation = unix_ms();
    tune_malloc(); /* process-wide: NNG's threads' arenas too */
    timed_init(w, &cfg);

    /* The data address is known once bound (start). */
    rc = wk_core_init(&w->core, &cfg, r, &host_ops, w, id, NULL, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", binary, err);
        auth_key_wipe(&w->secret);
        tls_fini();
        return rc == TANDEM_EINVAL || rc == TANDEM_ECONFIG ? 2 : 1;
    }
    int code = 1, loop_ok = 0;
    link_model_init(w);
    if (metrics_on_collect(w->core.reg, host_collect, w) != 0) {
        fprintf(stderr, "%s: cannot register metrics\n", binary);
        goto out_core;
    }
    if (uv_loop_init(&w->loop) != 0) {
        fprintf(stderr, "%s: cannot create the event loop\n", binary);
        goto out_core;
    }
    loop_ok = 1;
    rc = start(w, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", binary, err);
        if (rc == TANDEM_EINVAL) {
            code = 2; /* a bad address (scheme, host, TLS without files) */
        }
        close_all(w);
        uv_run(&w->loop, UV_RUN_DEFAULT);
    } else {
        uv_run(&w->loop, UV_RUN_DEFAULT);
        LOG_INFO("worker", "stopped");
        code = 0;
    }
    /* Only files we bound: a failed listen may have met another process's. */
    unlink_ipc(w->ctl_url);
    unlink_ipc(w->core.kv_addr);
    w->stopping = 1;
out_core:
    wk_core_fini(&w->core);
    free_held(w);
    auth_key_wipe(&w->secret);
    tls_fini();
    if (loop_ok) {
        /* Last, so that a signal during cleanup is still caught (ignored). */
        if (have_signals) {
            /* Closing the handles gives the signals back their default
             * action; a repeat of the stop signal from here on (a sender that
             * signals the process and its group, or TSan delivering a
             * deferred copy) must not turn a clean exit into a death by
             * SIGTERM. (libuv sets SIG_DFL when the last handle closes, so
             * the ignore goes after.) */
            uv_close((uv_handle_t *)&w->sigint, on_handle_closed);
            uv_close((uv_handle_t *)&w->sigterm, on_handle_closed);
            uv_run(&w->loop, UV_RUN_DEFAULT);
            signal(SIGINT, SIG_IGN);
            signal(SIGTERM, SIG_IGN);
        }
        uv_loop_close(&w->loop);
    }
    return code;
}
