/* The worker host of the simulator: a wk_core whose messages are events.
 * See simulate.h for what is modelled. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "decode.h"
#include "log.h"
#include "prefill.h"
#include "sim.h"
#include "sm_internal.h"
#include "tandem_err.h"
#include "wire.h"

/* Modelled unix time of modelled second 0, for heartbeat timestamps:
 * fixed, so that a run does not depend on the day it ran. */
#define SM_EPOCH_MS 1767225600000ull /* 2026-01-01 */

/* Events of a worker's own clock carry its incarnation in place of a
 * payload, so that those of a killed one are ignored. */
static void *inc_tag(const struct sm_worker *w)
{
    return (void *)(intptr_t)w->incarnation;
}

static int stale(const struct sm_worker *w, const struct sm_event *e)
{
    return w->dead || (intptr_t)e->p != (intptr_t)w->incarnation;
}

static struct sm_worker *host_of(void *host)
{
    return host;
}

static struct sm_msg *msg_new(struct sm *sim, int kind, size_t len)
{
    struct sm_msg *m = malloc(sizeof(*m) + len);
    if (m == NULL) {
        sm_fail(sim, TANDEM_ENOMEM, "out of memory for a message");
        return NULL;
    }
    memset(m, 0, sizeof(*m));
    m->kind = kind;
    m->len = len;
    return m;
}

/* A control envelope packed (and validated) into a new message. */
static int msg_pack(struct sm *sim, int kind, const Tandem__Envelope *env, struct sm_msg **out)
{
    size_t cap = tandem__envelope__get_packed_size(env);
    struct sm_msg *m = msg_new(sim, kind, cap);
    if (m == NULL) {
        return TANDEM_ENOMEM;
    }
    int rc = wire_pack(env, m->bytes, cap, &m->len);
    if (rc != 0) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* A token chunk without top logprobs, validated as wire_pack validates,
 * kept as its fields: packing and unpacking one per token was a third of
 * the simulator's time. */
static int msg_chunk(struct sm *sim, const Tandem__Envelope *env, struct sm_msg **out)
{
    const Tandem__TokenChunk *tc = env->token_chunk;
    size_t n = tc->n_token_ids;
    int lp = tc->n_logprobs > 0;
    struct sm_msg *m = msg_new(sim, SM_EV_TO_ROUTER, n * sizeof(uint32_t) * (lp ? 2 : 1));
    if (m == NULL) {
        return TANDEM_ENOMEM;
    }
    m->chunk = 1;
    m->has_logprobs = lp;
    m->first_index = tc->first_index;
    m->request_id = env->request_id;
    m->len = n;
    memcpy(m->bytes, tc->token_ids, n * sizeof(uint32_t));
    if (lp) {
        memcpy(m->bytes + n * sizeof(uint32_t), tc->logprobs, n * sizeof(float));
    }
    *out = m;
    return 0;
}

static void list_add(struct sm_msg **head, struct sm_msg **tail, struct sm_msg *m)
{
    m->next = NULL;
    if (*tail != NULL) {
        (*tail)->next = m;
    } else {
        *head = m;
    }
    *tail = m;
}

/* Batch b (messages for the router) leaves worker w at time t: one event,
 * they arrive together, in order. */
static void depart_batch(struct sm_worker *w, struct sm_batch *b, double t)
{
    struct sm *sim = w->sim;
    sim->st.messages += (uint64_t)b->n;
    sm_at(sim, t + sim->opt.ctl_latency_s, SM_EV_TO_ROUTER, w->index, b);
}

/* Message m (on the data link) leaves worker w at time t. */
static void depart(struct sm_worker *w, struct sm_msg *m, double t)
{
    struct sm *sim = w->sim;
    sim->st.messages++;
    /* The data link: KV frames hold both NICs for their transfer time; every
     * message arrives after the ones sent before it on the same link. */
    struct sm_worker *to = &sim->w[m->to];
    struct sm_link *l = m->link;
    m->to_inc = to->incarnation;
    double lat = sim->opt.ctl_latency_s, arrive;
    if (w->transfer_seconds != NULL) {
        lat = w->transfer_seconds(w->core.be, 0);
    }
    if (m->model_bytes > 0 && w->transfer_seconds != NULL) {
        double tx = w->transfer_seconds(w->core.be, m->model_bytes) - lat;
        double rx = tx;
        if (to->transfer_seconds != NULL) {
            rx = to->transfer_seconds(to->core.be, m->model_bytes) -
                 to->transfer_seconds(to->core.be, 0);
        }
        double xfer = tx > rx ? tx : rx;
        double start = t;
        start = w->tx_free > start ? w->tx_free : start;
        start = to->rx_free > start ? to->rx_free : start;
        w->tx_free = to->rx_free = start + xfer;
        arrive = start + xfer + lat;
        sim->st.kv_frames++;
        sim->st.kv_bytes += (double)m->model_bytes;
    } else {
        arrive = t + lat;
    }
    if (arrive < l->last_arrival) {
        arrive = l->last_arrival;
    }
    l->last_arrival = arrive;
    sm_at(sim, arrive, SM_EV_DATA, m->to, m);
}

/* A data-link message: sent now, or at the end of the step being computed. */
static void send_msg(struct sm_worker *w, struct sm_msg *m)
{
    if (w->dead) {
        free(m); /* a killed process sends nothing (its core is being torn down) */
        return;
    }
    m->from = w->index;
    m->from_inc = w->incarnation;
    if (w->in_step) {
        m->before = w->rb; /* what the router gets before it leaves first */
        w->rb = NULL;
        list_add(&w->out_head, &w->out_tail, m);
    } else {
        depart(w, m, w->sim->now);
    }
}

/* A message for the router: into the step's batch, or sent now. */
static int send_router(struct sm_worker *w, const struct sm_rmsg *r)
{
    if (w->dead) {
        free(r->m); /* as send_msg */
        return 0;
    }
    struct sm_batch *b = w->in_step ? w->rb : NULL;
    if (b == NULL || b->n == b->cap) {
        int cap = b != NULL ? 2 * b->cap : w->in_step ? 64 : 1;
        struct sm_batch *nb = realloc(b, sizeof(*b) + (size_t)cap * sizeof(b->r[0]));
        if (nb == NULL) {
            free(r->m);
            sm_fail(w->sim, TANDEM_ENOMEM, "out of memory for a message");
            return TANDEM_ENOMEM;
        }
        if (b == NULL) {
            nb->n = 0;
            nb->from_inc = w->incarnation;
        }
        nb->cap = cap;
        b = nb;
    }
    b->r[b->n++] = *r;
    if (w->in_step) {
        w->rb = b;
    } else {
        depart_batch(w, b, w->sim->now);
    }
    return 0;
}

static void free_list(struct sm_msg **head, struct sm_msg **tail)
{
    while (*head != NULL) {
        struct sm_msg *m = *head;
        *head = m->next;
        free(m);
    }
    *tail = NULL;
}

/* Frees what w's step sent and has not left yet. */
static void free_outbox(struct sm_worker *w)
{
    while (w->out_head != NULL) {
        struct sm_msg *m = w->out_head;
        w->out_head = m->next;
        sm_batch_free(m->before);
        free(m);
    }
    w->out_tail = NULL;
    sm_batch_free(w->rb);
    w->rb = NULL;
}

/* ---- wk_host_ops ---- */

static int host_send_control(void *host, const Tandem__Envelope *env)
{
    struct sm_worker *w = host_of(host);
    struct sm_rmsg r = {.request_id = env->request_id};
    const Tandem__TokenChunk *tc = env->token_chunk;
    int rc;
    if (env->kind == TANDEM__ENVELOPE__KIND__TOKEN_CHUNK && !w->sim->opt.pack_all &&
        tc != NULL && tc->n_top_logprobs == 0) {
        rc = wire_validate(env);
        if (rc == 0 && tc->n_token_ids == 1) {
            r.inl = tc->n_logprobs > 0 ? 1 : 2;
            r.first_index = tc->first_index;
            r.token = tc->token_ids[0];
            r.logprob = r.inl == 1 ? tc->logprobs[0] : 0.0f;
        } else if (rc == 0) {
            rc = msg_chunk(w->sim, env, &r.m);
        }
    } else {
        rc = msg_pack(w->sim, SM_EV_TO_ROUTER, env, &r.m);
    }
    if (rc != 0) {
        LOG_ERROR("simulate", "worker %s: cannot pack %s: %s (%s)", w->cfg.id,
                  wire_kind_name(env->kind), tandem_strerror(rc), wire_error_detail());
        return rc;
    }
    return send_router(w, &r);
}

static int find_worker_by_kv(const struct sm *sim, const char *addr)
{
    for (int i = 0; i < sim->n_w; i++) {
        if (strcmp(sim->w[i].kv_addr, addr) == 0) {
            return i;
        }
    }
    return -1;
}

static int host_link_get(void *host, const char *addr, struct wk_link **out)
{
    struct sm_worker *w = host_of(host);
    for (struct sm_link *l = w->links; l; l = l->next) {
        if (strcmp(l->l.addr, addr) == 0) {
            *out = &l->l;
            return 0;
        }
    }
    int to = find_worker_by_kv(w->sim, addr);
    if (to < 0) {
        return TANDEM_EINVAL; /* no worker listens there: as a dial to nowhere */
    }
    struct sm_link *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        return TANDEM_ENOMEM;
    }
    l->l.addr = w->sim->w[to].kv_addr;
    l->l.up = 1;
    l->l.ever_up = 1;
    l->to = to;
    l->next = w->links;
    w->links = l;
    *out = &l->l;
    return 0;
}

static struct sm_link *link_of(struct wk_link *l)
{
    return (struct sm_link *)((char *)l - offsetof(struct sm_link, l));
}

static void host_link_ref(void *host, struct wk_link *l)
{
    (void)host;
    link_of(l)->refs++;
}

static void host_link_unref(void *host, struct wk_link *l)
{
    (void)host;
    link_of(l)->refs--;
}

static int host_link_send(void *host, struct wk_link *wl, const Tandem__Envelope *env,
                          const void *payload, size_t len, uint64_t model_bytes)
{
    struct sm_worker *w = host_of(host);
    struct sm_link *l = link_of(wl);
    size_t size;
    int rc = wire_frame_size(env, len, &size);
    if (rc != 0) {
        return rc;
    }
    struct sm_msg *m = msg_new(w->sim, SM_EV_DATA, size);
    if (m == NULL) {
        return TANDEM_ENOMEM;
    }
    rc = wire_frame_pack(env, payload, len, m->bytes, size, &m->len);
    if (rc != 0) {
        LOG_ERROR("simulate", "worker %s: cannot frame %s: %s (%s)", w->cfg.id,
                  wire_kind_name(env->kind), tandem_strerror(rc), wire_error_detail());
        free(m);
        return rc;
    }
    m->to = l->to;
    m->link = l;
    m->model_bytes = model_bytes;
    send_msg(w, m);
    return 0;
}

static double host_now(void *host)
{
    return host_of(host)->sim->now;
}

static uint64_t host_unix_ms(void *host)
{
    return SM_EPOCH_MS + (uint64_t)(host_of(host)->sim->now * 1e3);
}

static void host_kick(void *host)
{
    struct sm_worker *w = host_of(host);
    if (!w->stepping && !w->step_queued && !w->dead) {
        w->step_queued = 1;
        sm_at(w->sim, w->sim->now, SM_EV_STEP, w->index, inc_tag(w));
    }
}

static const struct wk_host_ops host_ops = {
    .send_control = host_send_control,
    .link_get = host_link_get,
    .link_ref = host_link_ref,
    .link_unref = host_link_unref,
    .link_send = host_link_send,
    .now = host_now,
    .unix_ms = host_unix_ms,
    .kick = host_kick,
};

/* ---- Setup ---- */

static const struct worker_role *role_for(enum cluster_role r)
{
    switch (r) {
    case CLUSTER_PREFILL:
        return &prefill_role;
    case CLUSTER_DECODE:
        return &decode_role;
    default:
        return &colocated_role;
    }
}

int sm_worker_open(struct sm_worker *w, char *err, size_t errlen)
{
    int argc = 0;
    while (w->argv[argc] != NULL) {
        argc++;
    }
    char perr[512] = "";
    int rc = wk_config_parse(&w->cfg, argc, w->argv, w->argv[0], 1, NULL, perr, sizeof(perr));
    if (rc != FLAGS_OK) {
        snprintf(err, errlen, "worker %d: %s", w->index, perr);
        return TANDEM_ECONFIG;
    }
    w->cfg.time_scale = 0; /* modelled time: never sleep */
    snprintf(w->kv_addr, sizeof(w->kv_addr), "sim://%s/kv", w->name);
    snprintf(w->ctl_addr, sizeof(w->ctl_addr), "sim://%s/control", w->name);
    rc = wk_core_init(&w->core, &w->cfg, role_for(w->role), &host_ops, w, w->cfg.id, w->kv_addr,
                      perr, sizeof(perr));
    if (rc != 0) {
        snprintf(err, errlen, "worker %s: %s", w->cfg.id, perr);
        return rc;
    }
    w->core_open = 1;
    if (!sim_is(w->core.be)) {
        snprintf(err, errlen,
                 "worker %s: backend %s has no cost model: offline, every pool must use the "
                 "sim backend (backend: sim in the cluster file)",
                 w->cfg.id, w->core.be->ops->name);
        return TANDEM_ECONFIG;
    }
    const struct backend_desc *bd = backend_of(w->core.be);
    w->transfer_seconds = bd != NULL ? bd->transfer_seconds : NULL;
    w->gpus = w->cfg.tp > 0 ? w->cfg.tp : 1;
    w->ep = -1;
    return 0;
}

void sm_worker_close(struct sm_worker *w)
{
    if (w->core_open) {
        wk_core_fini(&w->core);
        w->core_open = 0;
    }
    while (w->links != NULL) {
        struct sm_link *l = w->links;
        w->links = l->next;
        free(l);
    }
    free_outbox(w);
    free_list(&w->in_head, &w->in_tail);
}

int sm_worker_join(struct sm_worker *w)
{
    struct sm *sim = w->sim;
    Tandem__WorkerHello h = TANDEM__WORKER_HELLO__INIT;
    wk_core_hello(&w->core, &h);
    h.control_address = w->ctl_addr;
    h.kv_address = w->kv_addr;
    struct rt_endpoint_info info;
    int rc = rt_feed_hello_info(&h, &info);
    if (rc != 0) {
        sm_fail(sim, rc, "worker %s: its Hello does not describe an endpoint", w->cfg.id);
        return rc;
    }
    int ep = rt_pipeline_endpoint_add(sim->rt.pl, &info);
    if (ep < 0) {
        sm_fail(sim, ep, "worker %s: the router cannot register it: %s (max endpoints %d)",
                w->cfg.id, tandem_strerror(ep), sim->max_ep);
        return ep;
    }
    w->ep = ep;
    sim->ep_worker[ep] = w->index;
    rt_pipeline_endpoint_set_healthy(sim->rt.pl, ep, 1);
    rt_dispatch_on_up(&sim->rt.d, ep);
    /* A router that connects learns everything: as live, on the control link. */
    wk_core_set_router(&w->core, WK_ROUTER_READY);
    wk_core_snapshot(&w->core);
    wk_core_heartbeat(&w->core);
    w->hb_last = sim->now;
    double period = w->cfg.heartbeat_ms / 1e3;
    sm_at(sim, sim->now + period * (1.0 + (double)w->index / sim->n_w), SM_EV_HEARTBEAT, w->index,
          inc_tag(w));
    return 0;
}

/* ---- Events ---- */

static void handle(struct sm_worker *w, struct sm_msg *m)
{
    if (m->kind == SM_EV_TO_WORKER) {
        Tandem__Envelope *env;
        int rc = wire_unpack(m->bytes, m->len, &env);
        if (rc != 0) {
            sm_fail(w->sim, rc, "worker %s: a control message does not unpack: %s", w->cfg.id,
                    wire_error_detail());
        } else {
            wk_core_on_control(&w->core, env);
            wire_free(env);
        }
    } else {
        struct wire_frame f;
        int rc = wire_frame_unpack(m->bytes, m->len, &f);
        if (rc != 0) {
            sm_fail(w->sim, rc, "worker %s: a data frame does not unpack: %s", w->cfg.id,
                    wire_error_detail());
        } else {
            wk_core_on_data(&w->core, &f);
            wire_frame_fini(&f);
        }
    }
    free(m);
}

static void step(struct sm_worker *w)
{
    struct sm *sim = w->sim;
    w->step_queued = 0;
    if (w->stepping || !wk_core_busy(&w->core)) {
        return;
    }
    w->in_step = 1;
    int n = wk_core_step(&w->core);
    w->in_step = 0;
    w->moved = n > 0;
    double dt = sim_last_step_seconds(w->core.be);
    if (n == 0) {
        dt = 0; /* nothing could move: wait for a kick */
    }
    w->steps++;
    sim->st.steps++;
    w->busy_s += dt;
    sim->st.busy_s += dt;
    w->stepping = 1;
    sm_at(sim, sim->now + dt, SM_EV_STEP_END, w->index, inc_tag(w));
}

static void heartbeat_if_due(struct sm_worker *w, double min_gap)
{
    struct sm *sim = w->sim;
    if (sim->now - w->hb_last >= min_gap) {
        wk_core_heartbeat(&w->core);
        w->hb_last = sim->now;
    }
}

static void step_end(struct sm_worker *w)
{
    struct sm *sim = w->sim;
    w->stepping = 0;
    /* In the order sent: each data-link message after the batch for the
     * router sent before it, then the last batch. */
    while (w->out_head != NULL) {
        struct sm_msg *m = w->out_head;
        w->out_head = m->next;
        m->next = NULL;
        if (m->before != NULL) {
            depart_batch(w, m->before, sim->now);
            m->before = NULL;
        }
        depart(w, m, sim->now);
    }
    w->out_tail = NULL;
    if (w->rb != NULL) {
        depart_batch(w, w->rb, sim->now);
        w->rb = NULL;
    }
    /* What reached the worker during the step, in arrival order. */
    while (w->in_head != NULL) {
        struct sm_msg *m = w->in_head;
        w->in_head = m->next;
        handle(w, m);
    }
    w->in_tail = NULL;
    wk_core_flush_events(&w->core);
    /* Live, a due heartbeat also leaves between steps. */
    heartbeat_if_due(w, w->cfg.heartbeat_ms / 1e3);
    /* Step again only after a step that moved something, as live
     * (timed_step_end). After one that moved nothing, what was stuck stays
     * stuck until a message, a freed block or the tick kicks the worker:
     * stepping again at once would repeat that step at the same modelled
     * time forever (a decode worker whose preempted sequence waits for blocks
     * that transfers in flight hold). The messages handled above kicked it
     * already when they gave it work. */
    if (w->moved && wk_core_busy(&w->core)) {
        host_kick(w);
    }
}

void sm_worker_event(struct sm_worker *w, const struct sm_event *e)
{
    struct sm *sim = w->sim;
    switch (e->kind) {
    case SM_EV_TO_WORKER:
    case SM_EV_DATA: {
        struct sm_msg *m = e->p;
        const struct sm_worker *from = m->from >= 0 ? &sim->w[m->from] : NULL;
        if (w->dead || m->to_inc != w->incarnation ||
            (from != NULL && (from->dead || from->incarnation != m->from_inc))) {
            free(m); /* lost with the process at either end */
            return;
        }
        if (w->stepping) {
            list_add(&w->in_head, &w->in_tail, e->p);
            return;
        }
        handle(w, e->p);
        wk_core_flush_events(&w->core);
        return;
    }
    case SM_EV_STEP:
        if (!stale(w, e)) {
            step(w);
        }
        return;
    case SM_EV_STEP_END:
        if (!stale(w, e)) {
            step_end(w);
        }
        return;
    case SM_EV_HEARTBEAT:
        if (sim->ended || stale(w, e)) {
            return;
        }
        sm_at(sim, sim->now + w->cfg.heartbeat_ms / 1e3, SM_EV_HEARTBEAT, w->index, inc_tag(w));
        if (w->stepping) {
            return; /* live, the timer waits for the step; step_end sends it */
        }
        heartbeat_if_due(w, w->cfg.heartbeat_ms / 2e3);
        wk_core_tick(&w->core);
        return;
    default:
        return;
    }
}

void sm_worker_send_control(struct sm *sim, int w, const Tandem__Envelope *env)
{
    struct sm_msg *m;
    int rc = msg_pack(sim, SM_EV_TO_WORKER, env, &m);
    if (rc != 0) {
        sm_fail(sim, rc, "router: cannot pack %s: %s", wire_kind_name(env->kind),
                wire_error_detail());
        return;
    }
    m->from = -1;
    m->to = w;
    m->to_inc = sim->w[w].incarnation;
    sim->st.messages++;
    sm_at(sim, sim->now + sim->opt.ctl_latency_s, SM_EV_TO_WORKER, w, m);
}

/* ---- Failures ---- */

/* Every other live worker's data link to w goes down (up = 0) or up. */
static void peers_see(struct sm_worker *w, int up)
{
    struct sm *sim = w->sim;
    for (int i = 0; i < sim->n_w; i++) {
        struct sm_worker *x = &sim->w[i];
        if (x == w || x->dead) {
            continue;
        }
        for (struct sm_link *l = x->links; l; l = l->next) {
            if (l->to == w->index && l->l.up != up) {
                l->l.up = up;
                wk_core_on_link(&x->core, &l->l, up);
                wk_core_flush_events(&x->core);
            }
        }
    }
}

void sm_worker_fail(struct sm_worker *w)
{
    struct sm *sim = w->sim;
    if (w->dead) {
        return;
    }
    LOG_INFO("simulate", "%.6f: worker %s killed", sim->now, w->name);
    w->dead = 1;
    /* The router sees the control link close: as the registry does. */
    if (w->ep >= 0) {
        rt_pipeline_endpoint_set_healthy(sim->rt.pl, w->ep, 0);
        rt_dispatch_on_down(&sim->rt.d, w->ep);
    }
    peers_see(w, 0);
    /* The process is gone with everything it held (its outbox and inbox too). */
    sm_worker_close(w);
    w->stepping = w->step_queued = w->in_step = 0;
}

void sm_worker_restart(struct sm_worker *w)
{
    struct sm *sim = w->sim;
    if (!w->dead) {
        return;
    }
    LOG_INFO("simulate", "%.6f: worker %s restarts", sim->now, w->name);
    w->dead = 0;
    w->incarnation++;
    w->tx_free = w->rx_free = sim->now;
    w->feed = (struct rt_feed_seq){0};
    /* A restarted worker is a new endpoint for the router (registry.c:
     * another incarnation is started afresh). */
    if (w->ep >= 0) {
        rt_pipeline_endpoint_remove(sim->rt.pl, w->ep);
        sim->ep_worker[w->ep] = -1;
        w->ep = -1;
    }
    char err[SM_ERR_MAX];
    int rc = sm_worker_open(w, err, sizeof(err));
    if (rc != 0) {
        sm_fail(sim, rc, "restarting %s: %s", w->name, err);
        return;
    }
    if (sm_worker_join(w) == 0) {
        peers_see(w, 1);
    }
}
