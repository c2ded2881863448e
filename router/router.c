/* tandem-router as a library: see router.h. */
#include "router.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block_hash.h"
#include "default_routing.h"
#include "log.h"
#include "presets.h"
#include "server.h"
#include "tandem_err.h"

enum {
    HAVE_CORE = 1 << 0,
    HAVE_REGISTRY = 1 << 1,
    HAVE_DISPATCH = 1 << 2,
    HAVE_HTTP = 1 << 3,
};

/* ---- The dispatcher's shell: HTTP, registry, libuv ---------------------- */

/* struct rt_sink_ops on an HTTP request. */
static void on_http_abort(struct http_req *http, void *arg)
{
    (void)http;
    rt_dispatch_abort(arg);
}

static void sink_hold(void *sink, struct rt_req *q)
{
    http_req_ref(sink);
    http_req_on_abort(sink, on_http_abort, q);
}

static void sink_release(void *sink)
{
    http_req_on_abort(sink, NULL, NULL);
    http_req_unref(sink);
}

static void sink_respond(void *sink, int status, const char *const *headers, const char *body,
                         size_t len)
{
    http_req_respond(sink, status, headers, body, len);
}

static void sink_start_sse(void *sink)
{
    http_req_start_sse(sink, NULL);
}

static void sink_write_sse(void *sink, const char *data, size_t len)
{
    http_req_write_sse(sink, NULL, data, len);
}

static void sink_end(void *sink)
{
    http_req_end(sink);
}

static void sink_batch(void *sink, int on)
{
    if (on) {
        http_req_cork(sink);
    } else {
        http_req_uncork(sink);
    }
}

static const struct rt_sink_ops http_sink = {
    .hold = sink_hold,
    .release = sink_release,
    .respond = sink_respond,
    .start_sse = sink_start_sse,
    .write_sse = sink_write_sse,
    .end = sink_end,
    .batch = sink_batch,
};

void rt_handle_generate(struct router *r, struct http_req *req, enum oa_kind kind)
{
    size_t len;
    const char *body = http_req_body(req, &len);
    rt_dispatch_submit(&r->core.d, req, kind, body, len, http_req_header(req, "x-session-token"));
}

static int send_job(void *arg, int ep, uint64_t id, const struct ctl_job *job)
{
    struct router *r = arg;
    nng_msg *msg;
    struct ctl_job j = *job;
    j.control_batches = 1; /* on_link_msg takes a worker's BATCH */
    int rc = ctl_job_msg(id, &j, &msg);
    if (rc != 0) {
        LOG_ERROR("dispatch", "cannot build a job: %s (%s)", tandem_strerror(rc),
                  wire_error_detail());
        return rc == TANDEM_ETIMEOUT || rc == TANDEM_ENOENT ? TANDEM_EINVAL : rc;
    }
    rc = rt_registry_send_job(&r->reg, ep, id, msg);
    return rc == 0 || rc == TANDEM_ETIMEOUT ? rc : TANDEM_ENOENT;
}

static int send_cancel(void *arg, int ep, uint64_t id)
{
    struct router *r = arg;
    nng_msg *msg;
    int rc = ctl_cancel_msg(id, &msg);
    return rc != 0 ? 0 : rt_registry_send(&r->reg, ep, msg);
}

static double clock_now(void *arg)
{
    (void)arg;
    return ctl_now();
}

static void on_kick(uv_idle_t *h)
{
    struct router *r = h->data;
    uv_idle_stop(h);
    rt_dispatch_run_pending(&r->core.d);
}

static void kick(void *arg)
{
    struct router *r = arg;
    uv_idle_start(&r->dispatch_kick, on_kick);
}

static void on_tick(uv_timer_t *t)
{
    struct router *r = t->data;
    rt_dispatch_tick(&r->core.d);
}

static int learned_context(void *arg)
{
    struct router *r = arg;
    return rt_registry_max_context(&r->reg);
}

/* The libuv handles that drive the dispatcher. */
static int dispatch_handles_open(struct router *r)
{
    if (uv_timer_init(r->loop, &r->dispatch_tick) != 0 ||
        uv_idle_init(r->loop, &r->dispatch_kick) != 0) {
        return TANDEM_EUV;
    }
    r->dispatch_tick.data = r;
    r->dispatch_kick.data = r;
    r->have |= HAVE_DISPATCH;
    uv_timer_start(&r->dispatch_tick, on_tick, RT_DISPATCH_TICK_MS, RT_DISPATCH_TICK_MS);
    return 0;
}

/* ---- Open and close ----------------------------------------------------- */

int rt_max_context(const struct router *r)
{
    return rt_core_max_context(&r->core);
}

static void collect(struct metrics_registry *reg, void *arg)
{
    struct router *r = arg;
    (void)reg;
    metrics_gauge_set(r->core.m.running, r->core.d.n_running);
    metrics_gauge_set(r->core.m.waiting, r->core.d.n_pending);
    int healthy, total;
    rt_registry_counts(&r->reg, &healthy, &total);
    metrics_gauge_set(r->core.m.endpoints_healthy, healthy);
    metrics_gauge_set(r->core.m.endpoints_total, total);
}

/* Dials every URL of a comma-separated list. */
static int dial_workers(struct router *r, char *err, size_t errlen)
{
    const char *s = r->opts.workers;
    while (s != NULL && *s != '\0') {
        size_t n = strcspn(s, ",");
        char url[WIRE_MAX_ADDR_BYTES + 1];
        if (n == 0 || n > WIRE_MAX_ADDR_BYTES) {
            snprintf(err, errlen, "--workers: empty or overlong address in '%s'", r->opts.workers);
            return TANDEM_EINVAL;
        }
        memcpy(url, s, n);
        url[n] = '\0';
        int rc = rt_registry_dial(&r->reg, url, 1);
        if (rc != 0) {
            snprintf(err, errlen, "--workers: cannot dial '%s': %s", url, tandem_strerror(rc));
            return TANDEM_EINVAL;
        }
        s += n;
        if (*s == ',') {
            s++;
        }
    }
    return 0;
}

/* The API key (rt_apikey.h): only its digest stays in r. A router reachable
 * from other hosts without one says so, since anyone there can generate. */
static int load_api_key(struct router *r, const struct rt_opts *o, char *err, size_t errlen)
{
    char key[RT_APIKEY_MAX + 1], source[PATH_MAX + 32];
    int rc = rt_apikey_find(o->api_key, o->api_key_file, key, source, sizeof(source), err, errlen);
    if (rc > 0) {
        rt_apikey_init(&r->apikey, key, strlen(key));
        LOG_INFO("router", "API key from %s: /v1 requests need 'Authorization: Bearer <key>'",
                 source);
    }
    auth_wipe(key, sizeof(key));
    if (rc == 0 && !rt_apikey_host_is_loopback(o->host)) {
        LOG_WARN("router",
                 "listening on %s without an API key: anyone who can reach it can run "
                 "generations (/v1/completions, /v1/chat/completions) and read the workers' "
                 "addresses (/v1/cluster). Set one with $%s, --%s FILE or --%s KEY "
                 "(router.api_key_file in a cluster file); docs/api.md",
                 o->host, RT_APIKEY_ENV, RT_APIKEY_FILE_FLAG, RT_APIKEY_FLAG);
    }
    return rc < 0 ? rc : 0;
}

int rt_open(struct router *r, uv_loop_t *loop, const struct rt_opts *o, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    r->loop = loop;
    r->opts = *o;
    struct rt_core_host host = {
        .sink = &http_sink,
        .arg = r,
        .send_job = send_job,
        .send_cancel = send_cancel,
        .now = clock_now,
        .kick = kick,
        .learned_context = learned_context,
    };
    r->have |= HAVE_CORE;
    int rc = rt_core_open(&r->core, o, &host, err, errlen);
    if (rc != 0) {
        return rc;
    }
    rc = metrics_on_collect(r->core.m.reg, collect, r);
    if (rc != 0) {
        snprintf(err, errlen, "metrics: %s", tandem_strerror(rc));
        return rc;
    }

    const char *secret_path = auth_secret_path(o->cluster_secret_file);
    if (secret_path != NULL) {
        int loose = 0;
        rc = auth_secret_load(secret_path, &r->secret, &loose, err, errlen);
        if (rc != 0) {
            return rc;
        }
        if (loose) {
            LOG_WARN("router", "cluster secret file %s is readable by group or others",
                     secret_path);
        }
        LOG_INFO("router", "cluster secret from %s: workers must prove it", secret_path);
    }
    if ((rc = load_api_key(r, o, err, errlen)) != 0) {
        return rc;
    }
    struct rt_registry_opts ro = {
        .model = o->model,
        .block_size = o->block_size,
        .vocab_size = tok_vocab_size(r->core.tok),
        .heartbeat_timeout_ms = (uint64_t)o->heartbeat_timeout_ms,
        .forget_ms = (uint64_t)o->forget_ms,
        .secret = r->secret.set ? &r->secret : NULL,
        .auth_failures = r->core.m.auth_failures,
        .envelopes_sent = r->core.m.ctl_envelopes,
        .messages_sent = r->core.m.ctl_messages,
    };
    struct rt_registry_cbs cbs = {
        .on_message = rt_dispatch_on_message,
        .on_down = rt_dispatch_on_down,
        .on_up = rt_dispatch_on_up,
        .on_unsent = rt_dispatch_on_unsent,
    };
    rc = rt_registry_init(&r->reg, loop, r->core.pl, &ro, &cbs, &r->core.d);
    if (rc != 0) {
        snprintf(err, errlen, "registry: %s", tandem_strerror(rc));
        return rc;
    }
    r->have |= HAVE_REGISTRY;
    rc = dispatch_handles_open(r);
    if (rc != 0) {
        snprintf(err, errlen, "dispatcher: %s", tandem_strerror(rc));
        return rc;
    }

    struct http_config hc;
    http_config_default(&hc);
    hc.max_body_bytes = (size_t)o->max_body;
    hc.max_connections = (unsigned)o->max_connections;
    hc.request_timeout_ms = (uint64_t)o->request_timeout_ms;
    hc.idle_timeout_ms = (uint64_t)o->idle_timeout_ms;
    rc = http_server_init(&r->http, loop, &hc, rt_server_handle, r);
    if (rc != 0) {
        snprintf(err, errlen, "HTTP server: %s", tandem_strerror(rc));
        return rc;
    }
    r->have |= HAVE_HTTP;
    rc = http_server_listen(&r->http, o->host, o->port);
    if (rc != 0) {
        snprintf(err, errlen, "--host %s --port %d: %s", o->host, o->port, tandem_strerror(rc));
        return rc;
    }
    r->http_port = http_server_port(&r->http);
    if (o->announce != NULL && o->announce[0] != '\0' && strcmp(o->announce, "none") != 0) {
        rc = rt_registry_listen(&r->reg, o->announce);
        if (rc != 0) {
            snprintf(err, errlen, "--announce %s: %s", o->announce,
                     rc == TANDEM_EINVAL ? "not a valid NNG address" : tandem_strerror(rc));
            return rc;
        }
    }
    return dial_workers(r, err, errlen);
}

static void part_closed(struct router *r)
{
    if (--r->open_parts > 0) {
        return;
    }
    if (r->have & HAVE_CORE) {
        rt_core_fini(&r->core);
    }
    auth_key_wipe(&r->secret);
    auth_wipe(&r->apikey, sizeof(r->apikey));
    r->have = 0;
    if (r->close_cb != NULL) {
        r->close_cb(r);
    }
}

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static void on_dispatch_handle_closed(uv_handle_t *h)
{
    part_closed(h->data);
}

static void on_registry_closed(struct rt_registry *reg)
{
    part_closed(container_of(reg, struct router, reg));
}

/* The NNG sockets close last, once every client connection is closed: the
 * workers keep generating what the clients drain, and every client has its
 * answer and its EOF before the links go. */
static void close_registry(struct router *r)
{
    if ((r->have & HAVE_REGISTRY) && !r->reg.closing) {
        r->open_parts++;
        rt_registry_close(&r->reg, on_registry_closed);
    }
}

/* Ends every request still live (503, or the stream's end) and closes the
 * dispatcher's handles. Called once open_parts counts a part still open. */
static void stop_core(struct router *r)
{
    if (r->core_stopped) {
        return;
    }
    r->core_stopped = 1;
    if (r->have & HAVE_CORE) {
        rt_core_stop(&r->core);
    }
    if (r->have & HAVE_DISPATCH) {
        r->open_parts += 2;
        uv_close((uv_handle_t *)&r->dispatch_tick, on_dispatch_handle_closed);
        uv_close((uv_handle_t *)&r->dispatch_kick, on_dispatch_handle_closed);
    }
}

static void on_stop_timer_closed(uv_handle_t *h)
{
    part_closed(h->data);
}

static void close_stop_timer(struct router *r)
{
    if (!uv_is_closing((uv_handle_t *)&r->stop_timer)) {
        uv_close((uv_handle_t *)&r->stop_timer, on_stop_timer_closed);
    }
}

/* --shutdown-drain-ms after the stop began: what is still live ends now,
 * and RT_STOP_FLUSH_MS later the connections still open are cut. */
static void on_stop_timer(uv_timer_t *t)
{
    struct router *r = t->data;
    if (!r->core_stopped) {
        LOG_INFO("router", "stop: requests still live after %d ms end now",
                 r->opts.shutdown_drain_ms);
        stop_core(r);
        uv_timer_start(t, on_stop_timer, RT_STOP_FLUSH_MS, 0);
        return;
    }
    LOG_WARN("router", "stop: closing connections still sending after %d ms more",
             RT_STOP_FLUSH_MS);
    close_stop_timer(r);
    http_server_close(&r->http, NULL);
}

static void on_http_closed(struct http_server *srv)
{
    struct router *r = container_of(srv, struct router, http);
    stop_core(r);
    close_stop_timer(r);
    close_registry(r);
    part_closed(r);
}

void rt_close(struct router *r, void (*cb)(struct router *r))
{
    if (r->closing) {
        return;
    }
    r->closing = 1;
    r->close_cb = cb;
    r->open_parts = 1; /* held until every close is started */
    if (r->have & HAVE_HTTP) {
        /* New connections are refused, requests in flight run on (the
         * workers and links stay) for --shutdown-drain-ms, each connection
         * closes once its last response has been sent (http_server_shutdown),
         * then the registry. */
        r->open_parts += 2;
        uv_timer_init(r->loop, &r->stop_timer);
        r->stop_timer.data = r;
        uv_timer_start(&r->stop_timer, on_stop_timer, (uint64_t)r->opts.shutdown_drain_ms, 0);
        http_server_shutdown(&r->http, on_http_closed);
    } else {
        stop_core(r);
        close_registry(r);
    }
    part_closed(r);
}
