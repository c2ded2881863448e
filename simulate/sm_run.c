/* The simulator: setup from the cluster file, the router's and the client's
 * hosts, and the event loop. See simulate.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include "block_hash.h"
#include "loadgen/openai.h"
#include "log.h"
#include "sm_internal.h"
#include "tandem_err.h"
#include "up.h"
#include "wire.h"

void sm_options_default(struct sm_options *o)
{
    *o = (struct sm_options){.ctl_latency_s = SM_DEFAULT_CTL_LATENCY};
}

static void drop_event(const struct sm_event *e);

void sm_at(struct sm *sim, double t, int kind, int who, void *p)
{
    if (sm_queue_push(&sim->q, t, kind, who, p) != 0) {
        sm_fail(sim, TANDEM_ENOMEM, "out of memory for the event queue");
        struct sm_event e = {.t = t, .kind = kind, .who = who, .p = p};
        drop_event(&e);
    }
}

void sm_fail(struct sm *sim, int rc, const char *fmt, ...)
{
    if (sim->failed) {
        return;
    }
    sim->failed = rc != 0 ? rc : TANDEM_EINTERNAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sim->err, sizeof(sim->err), fmt, ap);
    va_end(ap);
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- The router's host ---- */

static int rt_send_job(void *arg, int ep, uint64_t id, const struct ctl_job *job)
{
    struct sm *sim = arg;
    if (ep < 0 || ep >= sim->max_ep || sim->ep_worker[ep] < 0) {
        return TANDEM_ENOENT;
    }
    struct ctl_job_env e;
    int rc = ctl_job_env(&e, id, job);
    if (rc != 0) {
        return rc;
    }
    sm_worker_send_control(sim, sim->ep_worker[ep], &e.env);
    return 0;
}

static int rt_send_cancel(void *arg, int ep, uint64_t id)
{
    struct sm *sim = arg;
    if (ep < 0 || ep >= sim->max_ep || sim->ep_worker[ep] < 0) {
        return TANDEM_ENOENT;
    }
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__CANCEL, id, &c);
    sm_worker_send_control(sim, sim->ep_worker[ep], &env);
    return 0;
}

static double rt_now(void *arg)
{
    return ((struct sm *)arg)->now;
}

static void rt_kick(void *arg)
{
    struct sm *sim = arg;
    if (!sim->kick_queued) {
        sim->kick_queued = 1;
        sm_at(sim, sim->now, SM_EV_KICK, -1, NULL);
    }
}

static int rt_learned_context(void *arg)
{
    return rt_feed_max_context(((struct sm *)arg)->rt.pl);
}

/* A token chunk carried as fields (sm_worker.c host_send_control): the
 * envelope wire_unpack would have given. */
static void deliver_chunk(struct sm *sim, const struct sm_worker *wk, uint64_t request_id,
                          uint32_t first_index, size_t n, uint32_t *tokens, float *logprobs)
{
    Tandem__TokenChunk tc = TANDEM__TOKEN_CHUNK__INIT;
    tc.first_index = first_index;
    tc.n_token_ids = n;
    tc.token_ids = tokens;
    if (logprobs != NULL) {
        tc.n_logprobs = n;
        tc.logprobs = logprobs;
    }
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.version = WIRE_VERSION;
    env.kind = TANDEM__ENVELOPE__KIND__TOKEN_CHUNK;
    env.request_id = request_id;
    env.body_case = TANDEM__ENVELOPE__BODY_TOKEN_CHUNK;
    env.token_chunk = &tc;
    rt_dispatch_on_message(&sim->rt.d, wk->ep, &env);
}

static void deliver_one(struct sm *sim, struct sm_worker *wk, struct sm_rmsg *r)
{
    if (r->inl) {
        deliver_chunk(sim, wk, r->request_id, r->first_index, 1, &r->token,
                      r->inl == 1 ? &r->logprob : NULL);
        return;
    }
    struct sm_msg *m = r->m;
    r->m = NULL;
    if (m->chunk) {
        deliver_chunk(sim, wk, m->request_id, m->first_index, m->len, (uint32_t *)m->bytes,
                      m->has_logprobs ? (float *)(m->bytes + m->len * sizeof(uint32_t)) : NULL);
        free(m);
        return;
    }
    Tandem__Envelope *env;
    int rc = wire_unpack(m->bytes, m->len, &env);
    free(m);
    if (rc != 0) {
        sm_fail(sim, rc, "router: a message from worker %d does not unpack: %s", wk->index,
                wire_error_detail());
        return;
    }
    switch (env->kind) {
    case TANDEM__ENVELOPE__KIND__HEARTBEAT:
        rt_feed_heartbeat(sim->rt.pl, wk->ep, env->heartbeat);
        break;
    case TANDEM__ENVELOPE__KIND__KV_EVENTS:
        rt_feed_kv_events(sim->rt.pl, wk->ep, wk->cfg.id, &wk->feed, env->kv_events);
        break;
    case TANDEM__ENVELOPE__KIND__HELLO:
        break; /* registered at the start */
    default:
        rt_dispatch_on_message(&sim->rt.d, wk->ep, env);
        break;
    }
    wire_free(env);
}

void sm_batch_free(struct sm_batch *b)
{
    if (b == NULL) {
        return;
    }
    for (int i = 0; i < b->n; i++) {
        free(b->r[i].m);
    }
    free(b);
}

void sm_router_deliver(struct sm *sim, int w, struct sm_batch *b)
{
    struct sm_worker *wk = &sim->w[w];
    if (wk->dead || wk->incarnation != b->from_inc) {
        sm_batch_free(b); /* lost with its sender */
        return;
    }
    /* A step's messages reach the router together (about ten per step at
     * 256 instances), each for a request whose state is cold. Before a
     * group of them is handled, one pass per stage of that state starts
     * fetching it for every message of the group (rt_dispatch_prefetch 3, 2,
     * 1 and 0: map slot, request, its buffers, sink; then the load
     * generator's request and its record): the misses of a stage overlap
     * across messages, and each stage finds what the one before fetched. */
    enum { GROUP = 32 };
    struct rt_dispatch *d = &sim->rt.d;
    for (int base = 0; base < b->n; base += GROUP) {
        int end = base + GROUP < b->n ? base + GROUP : b->n;
        struct sm_call *calls[GROUP];
        for (int stage = 3; stage >= 1; stage--) {
            for (int i = base; i < end; i++) {
                rt_dispatch_prefetch(d, b->r[i].request_id, stage);
            }
        }
        for (int i = base; i < end; i++) {
            calls[i - base] = rt_dispatch_prefetch(d, b->r[i].request_id, 0);
        }
        for (int i = base; i < end; i++) {
            if (calls[i - base] != NULL) {
                __builtin_prefetch(calls[i - base]->q);
            }
        }
        for (int i = base; i < end; i++) {
            if (calls[i - base] != NULL && calls[i - base]->q != NULL) {
                lg_driver_prefetch(calls[i - base]->q);
            }
        }
        for (int i = base; i < end; i++) {
            if (!sim->failed) { /* else freed below, as the loop's drop_event */
                deliver_one(sim, wk, &b->r[i]);
            }
        }
    }
    sm_batch_free(b);
}

/* ---- The client: the dispatcher's sink and the driver's host ---- */

static void call_maybe_free(struct sm_call *c)
{
    if (c->q == NULL && c->held == NULL && c->submitted && c->timeouts == 0) {
        free(c->path);
        free(c->body);
        free(c);
    }
}

static void call_done(struct sm_call *c, int err, enum lg_fail reason, const char *msg)
{
    struct lg_req *q = c->q;
    if (q == NULL) {
        return;
    }
    c->q = NULL;
    lg_driver_done(q, err, reason, msg);
}

static void sink_hold(void *sink, struct rt_req *q)
{
    ((struct sm_call *)sink)->held = q;
}

static void sink_release(void *sink)
{
    struct sm_call *c = sink;
    c->held = NULL;
    call_maybe_free(c);
}

static void sink_respond(void *sink, int status, const char *const *headers, const char *body,
                         size_t len)
{
    struct sm_call *c = sink;
    (void)headers;
    if (c->q == NULL) {
        return;
    }
    (void)lg_driver_status(c->q, status, "application/json");
    lg_driver_body(c->q, body, len);
    call_done(c, 0, LG_FAIL_NONE, NULL);
}

static void sink_start_sse(void *sink)
{
    struct sm_call *c = sink;
    if (c->q != NULL) {
        (void)lg_driver_status(c->q, 200, "text/event-stream");
    }
}

static void sink_write_sse(void *sink, const char *data, size_t len)
{
    struct sm_call *c = sink;
    if (c->q != NULL) {
        lg_driver_event(c->q, "message", data, len);
    }
}

/* A streamed token chunk as data: the fields the load generator's parser
 * reads out of its JSON (lg_openai_parse_chunk). */
static void sink_delta(void *sink, const char *text, size_t len, int role)
{
    struct sm_call *c = sink;
    if (c->q == NULL) {
        return;
    }
    struct lg_chunk ch; /* fields set one by one: text_buf is large and unused */
    ch.is_token = len > 0 || !role;
    ch.text = text;
    ch.text_len = len;
    ch.has_usage = 0;
    ch.prompt_tokens = ch.completion_tokens = ch.cached_tokens = -1;
    ch.is_error = 0;
    ch.error[0] = '\0';
    ch.root = NULL;
    (void)lg_driver_chunk(c->q, &ch);
}

static void sink_end(void *sink)
{
    call_done(sink, 0, LG_FAIL_NONE, NULL);
}

static const struct rt_sink_ops sm_sink = {
    .hold = sink_hold,
    .release = sink_release,
    .respond = sink_respond,
    .start_sse = sink_start_sse,
    .write_sse = sink_write_sse,
    .end = sink_end,
    .delta = sink_delta,
};

/* The reference (sm_options.pack_all): every chunk rendered and parsed. */
static const struct rt_sink_ops sm_sink_sse = {
    .hold = sink_hold,
    .release = sink_release,
    .respond = sink_respond,
    .start_sse = sink_start_sse,
    .write_sse = sink_write_sse,
    .end = sink_end,
};

static double drv_now(void *arg)
{
    return ((struct sm *)arg)->now;
}

static void drv_wake_at(void *arg, double t)
{
    struct sm *sim = arg;
    if (t == INFINITY) {
        sim->wake_t = -1; /* no wake */
        return;
    }
    if (t < sim->now) {
        t = sim->now;
    }
    sim->wake_t = t;
    sm_at(sim, t, SM_EV_WAKE, -1, NULL);
}

static int drv_send(void *arg, struct lg_req *q, const char *path, const char *body, size_t len,
                    double timeout_s)
{
    struct sm *sim = arg;
    struct sm_call *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->path = strdup(path)) == NULL || (c->body = malloc(len + 1)) == NULL) {
        if (c != NULL) {
            free(c->path);
        }
        free(c);
        return TANDEM_ENOMEM;
    }
    memcpy(c->body, body, len);
    c->body[len] = '\0';
    c->len = len;
    c->sim = sim;
    c->q = q;
    lg_driver_set_host(q, c);
    sm_at(sim, sim->now, SM_EV_SUBMIT, -1, c);
    if (timeout_s > 0) {
        sm_at(sim, sim->now + timeout_s, SM_EV_TIMEOUT, -1, c);
        c->timeouts++;
    }
    return 0;
}

/* Only after a fatal error in the driver (offline there is no SIGINT): the
 * client hangs up. */
static void drv_cancel(void *arg, struct lg_req *q)
{
    (void)arg;
    struct sm_call *c = lg_driver_host(q);
    if (c == NULL || c->q == NULL) {
        return;
    }
    if (c->held != NULL) {
        rt_dispatch_abort(c->held);
    }
    call_done(c, TANDEM_ECANCELLED, LG_FAIL_CANCELLED, "cancelled");
}

static void drv_ended(void *arg)
{
    ((struct sm *)arg)->ended = 1;
}

static const struct lg_driver_ops drv_ops = {
    .now = drv_now,
    .wake_at = drv_wake_at,
    .send = drv_send,
    .cancel = drv_cancel,
    .ended = drv_ended,
};

static void submit(struct sm *sim, struct sm_call *c)
{
    c->submitted = 1;
    if (c->q == NULL) { /* timed out before it left */
        call_maybe_free(c);
        return;
    }
    enum oa_kind kind = strstr(c->path, "chat") != NULL ? OA_KIND_CHAT : OA_KIND_COMPLETION;
    rt_dispatch_submit(&sim->rt.d, c, kind, c->body, c->len, NULL);
    free(c->body); /* the dispatcher copied what it keeps */
    c->body = NULL;
    call_maybe_free(c);
}

static void timeout(struct sm *sim, struct sm_call *c)
{
    (void)sim;
    c->timeouts--;
    if (c->q != NULL) {
        if (c->held != NULL) {
            rt_dispatch_abort(c->held); /* the client hangs up: Cancel to the worker */
        }
        call_done(c, TANDEM_ETIMEOUT, LG_FAIL_TIMEOUT, "request timeout");
    }
    call_maybe_free(c);
}

/* ---- The loop ---- */

static void run_event(struct sm *sim, const struct sm_event *e)
{
    double t0;
    switch (e->kind) {
    case SM_EV_WAKE:
        if (e->t == sim->wake_t) { /* the last wake asked for; earlier ones are stale */
            sim->wake_t = -1;
            lg_driver_wake(sim->drv);
        }
        return;
    case SM_EV_SUBMIT:
        t0 = wall_now();
        submit(sim, e->p);
        sim->st.router_submit_s += wall_now() - t0;
        sim->st.requests++;
        return;
    case SM_EV_TIMEOUT:
        timeout(sim, e->p);
        return;
    case SM_EV_KICK:
        t0 = wall_now();
        sim->kick_queued = 0;
        rt_dispatch_run_pending(&sim->rt.d);
        sim->st.router_submit_s += wall_now() - t0;
        return;
    case SM_EV_TICK:
        if (!sim->ended) {
            rt_dispatch_tick(&sim->rt.d);
            sm_at(sim, sim->now + RT_DISPATCH_TICK_MS / 1e3, SM_EV_TICK, -1, NULL);
        }
        return;
    case SM_EV_SAMPLE: /* what the router sees now, for --timeline */
        if (!sim->ended) {
            sim->opt.on_sample(sim->opt.sample_arg, sim->now, sim->rt.pl);
            sm_at(sim, sim->now + sim->opt.sample_s, SM_EV_SAMPLE, -1, NULL);
        }
        return;
    case SM_EV_FAIL:
        sm_worker_fail(&sim->w[e->who]);
        return;
    case SM_EV_RESTART:
        sm_worker_restart(&sim->w[e->who]);
        return;
    case SM_EV_TO_ROUTER:
        t0 = wall_now();
        sm_router_deliver(sim, e->who, e->p);
        sim->st.router_deliver_s += wall_now() - t0;
        return;
    default:
        sm_worker_event(&sim->w[e->who], e);
        return;
    }
}

/* Frees what an event still owns when the loop stops early. */
static void drop_event(const struct sm_event *e)
{
    switch (e->kind) {
    case SM_EV_TO_ROUTER:
        sm_batch_free(e->p);
        return;
    case SM_EV_TO_WORKER:
    case SM_EV_DATA:
        free(e->p);
        return;
    case SM_EV_SUBMIT:
    case SM_EV_TIMEOUT: {
        struct sm_call *c = e->p;
        if (e->kind == SM_EV_TIMEOUT) {
            c->timeouts--;
        } else {
            c->submitted = 1;
        }
        c->q = NULL;
        c->held = NULL;
        call_maybe_free(c);
        return;
    }
    default:
        return;
    }
}

/* ---- Setup ---- */

static int argc_of(char **argv)
{
    int n = 0;
    while (argv[n] != NULL) {
        n++;
    }
    return n;
}

static int open_router(struct sm *sim, const struct cluster *c, char **argv, char *err,
                       size_t errlen)
{
    struct rt_opts o;
    rt_opts_default(&o);
    struct rt_tls_files tls = {0};
    struct flag flags[RT_OPTS_MAX_FLAGS];
    size_t n = rt_opts_flags(&o, &tls, flags);
    char perr[512] = "";
    int rc = flags_parse(flags, n, argc_of(argv), argv, 1, NULL, perr, sizeof(perr));
    if (rc != FLAGS_OK) {
        snprintf(err, errlen, "router: %s", perr);
        return TANDEM_ECONFIG;
    }
    /* The routing the router would run with: --routing of simulate, the
     * cluster's file (already on the plan's command line), its inline
     * config, or the router's default. */
    if (sim->opt.routing_path != NULL) {
        o.routing = sim->opt.routing_path;
    } else if (c->routing_text != NULL) {
        o.routing = c->source;
        o.routing_text = c->routing_text;
    } else if (c->routing_path == NULL) {
        o.routing = NULL;
    }
    if (o.seed == 0) {
        o.seed = 1; /* the pipeline's random choices: fixed offline */
    }
    o.decisions = 0; /* nobody reads GET /v1/decisions offline */
    struct rt_core_host host = {
        .sink = sim->opt.pack_all ? &sm_sink_sse : &sm_sink,
        .arg = sim,
        .send_job = rt_send_job,
        .send_cancel = rt_send_cancel,
        .now = rt_now,
        .kick = rt_kick,
        .learned_context = rt_learned_context,
        .dispatch_seed = (uint64_t)o.seed,
    };
    rc = rt_core_open(&sim->rt, &o, &host, err, errlen);
    sim->rt_open = 1;
    if (rc != 0) {
        return rc;
    }
    sim->max_ep = rt_pipeline_max_endpoints(sim->rt.pl);
    sim->ep_worker = malloc((size_t)sim->max_ep * sizeof(*sim->ep_worker));
    if (sim->ep_worker == NULL) {
        return TANDEM_ENOMEM;
    }
    for (int i = 0; i < sim->max_ep; i++) {
        sim->ep_worker[i] = -1;
    }
    return 0;
}

/* Queues the failures of the options, each naming a worker of the plan. */
static int plan_fails(struct sm *sim, char *err, size_t errlen)
{
    for (int k = 0; k < sim->opt.n_fails; k++) {
        const struct sm_fail *f = &sim->opt.fails[k];
        int w = -1;
        for (int i = 0; i < sim->n_w; i++) {
            if (strcmp(sim->w[i].name, f->worker) == 0) {
                w = i;
            }
        }
        if (w < 0) {
            char names[512] = "";
            size_t used = 0;
            for (int i = 0; i < sim->n_w && used < sizeof(names); i++) {
                int len = snprintf(names + used, sizeof(names) - used, "%s%s", i ? ", " : "",
                                   sim->w[i].name);
                used += len > 0 ? (size_t)len : 0;
            }
            snprintf(err, errlen, "--fail %s: no such worker (this cluster has %s)", f->worker,
                     names);
            return TANDEM_EINVAL;
        }
        if (!(f->at_s >= 0)) {
            snprintf(err, errlen, "--fail %s: the time must be >= 0", f->worker);
            return TANDEM_EINVAL;
        }
        sm_at(sim, f->at_s, SM_EV_FAIL, w, NULL);
        if (f->restart_s >= 0) {
            sm_at(sim, f->at_s + f->restart_s, SM_EV_RESTART, w, NULL);
        }
    }
    return 0;
}

static int open_all(struct sm *sim, const struct cluster *c, struct up_plan *plan, char *err,
                    size_t errlen)
{
    struct up_plan_input in = {
        .bin_dir = "(simulate)",
        .run_dir = "(simulate)",
        .ipc_dir = "(simulate)",
        .router_port = c->router_port,
        .announce_port = 0,
    };
    int rc = up_plan_build(plan, c, &in, err, errlen);
    if (rc != 0) {
        return rc;
    }
    rc = open_router(sim, c, plan->procs[0].argv, err, errlen);
    if (rc != 0) {
        return rc;
    }
    sim->n_w = plan->n - 1;
    sim->w = calloc((size_t)(sim->n_w > 0 ? sim->n_w : 1), sizeof(*sim->w));
    if (sim->w == NULL) {
        return TANDEM_ENOMEM;
    }
    for (int i = 0; i < sim->n_w; i++) {
        struct sm_worker *w = &sim->w[i];
        w->sim = sim;
        w->index = i;
        w->role = plan->procs[i + 1].role;
        w->argv = plan->procs[i + 1].argv;
        snprintf(w->name, sizeof(w->name), "%s", plan->procs[i + 1].name);
        rc = sm_worker_open(w, err, errlen);
        if (rc != 0) {
            return rc;
        }
        sim->st.gpus += w->gpus;
    }
    sim->st.workers = sim->n_w;
    for (int i = 0; i < sim->n_w && !sim->failed; i++) {
        sm_worker_join(&sim->w[i]);
    }
    return sim->failed ? sim->failed : plan_fails(sim, err, errlen);
}

static void close_all(struct sm *sim)
{
    struct sm_event e;
    while (sm_queue_pop(&sim->q, &e) == 0) {
        drop_event(&e);
    }
    if (sim->rt_open) {
        rt_core_stop(&sim->rt); /* ends what is still live */
    }
    while (sm_queue_pop(&sim->q, &e) == 0) {
        drop_event(&e);
    }
    for (int i = 0; i < sim->n_w; i++) {
        sm_worker_close(&sim->w[i]);
    }
    while (sm_queue_pop(&sim->q, &e) == 0) {
        drop_event(&e);
    }
    if (sim->rt_open) {
        rt_core_fini(&sim->rt);
    }
    lg_driver_destroy(sim->drv);
    free(sim->w);
    free(sim->ep_worker);
    sm_queue_fini(&sim->q);
}

int sm_run(const struct cluster *c, const struct lg_run_config *run, const struct sm_options *o,
           struct lg_run_result *out, struct sm_stats *st, char *err, size_t errlen)
{
    struct sm *sim = calloc(1, sizeof(*sim));
    if (sim == NULL) {
        return TANDEM_ENOMEM;
    }
    sim->opt = *o;
    sim->wake_t = -1;
    sm_queue_init(&sim->q);
    struct up_plan plan;
    memset(&plan, 0, sizeof(plan));
    int rc = open_all(sim, c, &plan, err, errlen);
    if (rc == 0 && sim->failed) {
        rc = sim->failed;
        snprintf(err, errlen, "%s", sim->err);
    }
    if (rc == 0) {
        rc = lg_driver_create(&sim->drv, run, &drv_ops, sim, err, errlen);
    }
    if (rc == 0) {
        double t0 = wall_now();
        sm_at(sim, RT_DISPATCH_TICK_MS / 1e3, SM_EV_TICK, -1, NULL);
        if (sim->opt.on_sample != NULL && sim->opt.sample_s > 0) {
            sm_at(sim, 0, SM_EV_SAMPLE, -1, NULL);
        }
        lg_driver_start(sim->drv, c->model);
        struct sm_event e;
        while (!sim->ended && !sim->failed && sm_queue_pop(&sim->q, &e) == 0) {
            sim->now = e.t;
            sim->st.events++;
            run_event(sim, &e);
        }
        sim->st.wall_s = wall_now() - t0;
        sim->st.dispatch = sim->rt.d.stats;
        sim->st.modelled_s = sim->now;
        if (sim->failed) {
            rc = sim->failed;
            snprintf(err, errlen, "%s", sim->err);
        } else if (!sim->ended) {
            rc = TANDEM_EINTERNAL;
            snprintf(err, errlen,
                     "the simulation ran out of events before the run ended "
                     "(a request was lost: a bug)");
        } else {
            rc = lg_driver_finish(sim->drv, out, err, errlen);
        }
    }
    if (st != NULL) {
        *st = sim->st;
    }
    close_all(sim);
    up_plan_free(&plan);
    free(sim);
    return rc;
}
