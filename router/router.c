/* tandem-router as a library: see router.h. */
#include "router.h"

#include <errno.h>
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
    HAVE_METRICS = 1 << 0,
    HAVE_REGISTRY = 1 << 1,
    HAVE_DISPATCH = 1 << 2,
    HAVE_HTTP = 1 << 3,
};

void rt_opts_default(struct rt_opts *o)
{
    *o = (struct rt_opts){
        .host = HTTP_DEFAULT_HOST,
        .port = HTTP_DEFAULT_PORT,
        .announce = RT_DEFAULT_ANNOUNCE,
        .model = RT_DEFAULT_MODEL,
        .block_size = BH_DEFAULT_BLOCK_SIZE,
        .max_body = 4u << 20,
        .max_connections = 1024,
        .max_pending = RT_DEFAULT_MAX_PENDING,
        .retries = RT_DEFAULT_RETRIES,
        .log_level = LOG_LEVEL_INFO,
        .heartbeat_timeout_ms = RT_DEFAULT_HB_TIMEOUT,
        .request_timeout_ms = 30000,
        .idle_timeout_ms = 60000,
        .deadline_ms = RT_DEFAULT_DEADLINE_MS,
        .forget_ms = RT_DEFAULT_FORGET_MS,
        .decisions = RT_DEFAULT_DECISIONS,
    };
}

/* ---- Tokenizer ---------------------------------------------------------- */

/* Entries in a llama2.c tokenizer.bin: the file does not say, so count
 * (score, len, bytes) records to the end. Returns the count or an error. */
static int count_entries(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return errno == ENOENT ? TANDEM_ENOENT : TANDEM_EIO;
    }
    int32_t max_len;
    int n = 0, rc = 0;
    if (fread(&max_len, 4, 1, f) != 1) {
        rc = TANDEM_ETRUNCATED;
    }
    while (rc == 0) {
        float score;
        int32_t len;
        if (fread(&score, 4, 1, f) != 1) {
            break; /* the end */
        }
        if (fread(&len, 4, 1, f) != 1 || len < 0 || len > TOK_MAX_PIECE ||
            fseek(f, len, SEEK_CUR) != 0) {
            rc = TANDEM_EFORMAT;
            break;
        }
        if (++n > TOK_MAX_VOCAB) {
            rc = TANDEM_ETOOBIG;
        }
    }
    fclose(f);
    return rc != 0 ? rc : n;
}

static int open_tokenizer(struct router *r, char *err, size_t errlen)
{
    const struct preset_model *pm = preset_model_find(r->opts.model); /* NULL: not a preset */
    if (pm != NULL) {
        r->preset_context = pm->max_context;
    }
    int rc;
    if (r->opts.tokenizer != NULL) {
        int n = count_entries(r->opts.tokenizer);
        rc = n < 0 ? n : tok_load(&r->tok, r->opts.tokenizer, n);
        if (rc != 0) {
            snprintf(err, errlen, "--tokenizer %s: %s", r->opts.tokenizer, tandem_strerror(rc));
            return rc == TANDEM_ENOMEM ? rc : TANDEM_EINVAL;
        }
    } else if (pm != NULL) {
        /* A sim model: byte-level text, ids up to its vocabulary. */
        rc = tok_create_bytes_n(&r->tok, pm->vocab_size);
    } else {
        rc = tok_create_bytes(&r->tok);
    }
    if (rc != 0) {
        snprintf(err, errlen, "tokenizer: %s", tandem_strerror(rc));
    }
    return rc;
}

/* ---- Decision records --------------------------------------------------- */

static int declog_init(struct rt_declog *l, int cap)
{
    memset(l, 0, sizeof(*l));
    l->cap = cap;
    l->buf_cap = 4096;
    l->buf = malloc(l->buf_cap);
    l->e = calloc((size_t)(cap > 0 ? cap : 1), sizeof(*l->e));
    if (l->buf == NULL || l->e == NULL) {
        free(l->buf);
        free(l->e);
        memset(l, 0, sizeof(*l));
        return TANDEM_ENOMEM;
    }
    return 0;
}

static void declog_fini(struct rt_declog *l)
{
    for (int i = 0; i < l->cap && l->e != NULL; i++) {
        free(l->e[i].json);
    }
    free(l->e);
    free(l->buf);
    memset(l, 0, sizeof(*l));
}

void rt_declog_add(struct router *r, const struct rt_decision *d)
{
    struct rt_declog *l = &r->declog;
    int debug = log_get_level() <= LOG_LEVEL_DEBUG;
    if (l->buf == NULL || (l->cap == 0 && !debug)) {
        return;
    }
    int n = rt_decision_format(r->pl, d, l->buf, l->buf_cap);
    while (n == TANDEM_ETOOBIG && l->buf_cap < (64u << 20)) {
        char *b = realloc(l->buf, l->buf_cap * 2);
        if (b == NULL) {
            break;
        }
        l->buf = b;
        l->buf_cap *= 2;
        n = rt_decision_format(r->pl, d, l->buf, l->buf_cap);
    }
    if (n < 0) {
        return;
    }
    if (debug) {
        LOG_DEBUG("decision", "%s", l->buf);
    }
    if (l->cap == 0) {
        return;
    }
    struct rt_declog_entry *e = &l->e[l->head];
    char *json = realloc(e->json, (size_t)n + 1);
    if (json == NULL) {
        return;
    }
    memcpy(json, l->buf, (size_t)n + 1);
    e->json = json;
    e->seq = d->seq;
    e->actual = -1;
    l->head = (l->head + 1) % l->cap;
    if (l->n < l->cap) {
        l->n++;
    }
}

void rt_declog_actual(struct router *r, uint64_t seq, int actual)
{
    struct rt_declog *l = &r->declog;
    /* Newest first: a finishing request's decision is usually recent. */
    for (int k = 0; k < l->n; k++) {
        struct rt_declog_entry *e = &l->e[(l->head - 1 - k + l->cap) % l->cap];
        if (e->seq == seq) {
            e->actual = actual;
            return;
        }
    }
}

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

static const struct rt_sink_ops http_sink = {
    .hold = sink_hold,
    .release = sink_release,
    .respond = sink_respond,
    .start_sse = sink_start_sse,
    .write_sse = sink_write_sse,
    .end = sink_end,
};

void rt_handle_generate(struct router *r, struct http_req *req, enum oa_kind kind)
{
    size_t len;
    const char *body = http_req_body(req, &len);
    rt_dispatch_submit(&r->d, req, kind, body, len, http_req_header(req, "x-session-token"));
}

static int send_job(void *arg, int ep, uint64_t id, const struct ctl_job *job)
{
    struct router *r = arg;
    nng_msg *msg;
    int rc = ctl_job_msg(id, job, &msg);
    if (rc != 0) {
        LOG_ERROR("dispatch", "cannot build a job: %s (%s)", tandem_strerror(rc),
                  wire_error_detail());
        return rc == TANDEM_ETIMEOUT || rc == TANDEM_ENOENT ? TANDEM_EINVAL : rc;
    }
    rc = rt_registry_send(&r->reg, ep, msg);
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
    rt_dispatch_run_pending(&r->d);
}

static void kick(void *arg)
{
    struct router *r = arg;
    uv_idle_start(&r->dispatch_kick, on_kick);
}

static void on_tick(uv_timer_t *t)
{
    struct router *r = t->data;
    rt_dispatch_tick(&r->d);
}

static int max_context(void *arg)
{
    return rt_max_context(arg);
}

static void on_decision(void *arg, const struct rt_decision *dec)
{
    rt_declog_add(arg, dec);
}

static void on_cached(void *arg, uint64_t seq, int actual)
{
    rt_declog_actual(arg, seq, actual);
}

/* The dispatcher with this router's pipeline, tokenizer, metrics, options,
 * registry and loop. */
static int dispatch_open(struct router *r)
{
    struct rt_dispatch_deps deps = {
        .pl = r->pl,
        .tok = r->tok,
        .m = &r->m,
        .model = r->model,
        .root = r->root,
        .block_size = r->block_size,
        .uses_hashes = r->uses_hashes,
        .max_pending = r->opts.max_pending,
        .retries = r->opts.retries,
        .deadline_ms = r->opts.deadline_ms,
        .sink = &http_sink,
        .arg = r,
        .send_job = send_job,
        .send_cancel = send_cancel,
        .now = clock_now,
        .kick = kick,
        .max_context = max_context,
        .on_decision = on_decision,
        .on_cached = on_cached,
    };
    int rc = rt_dispatch_init(&r->d, &deps);
    if (rc != 0) {
        return rc;
    }
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
    if (r->opts.max_context > 0) {
        return r->opts.max_context;
    }
    int learned = rt_registry_max_context(&r->reg);
    if (learned > 0) {
        return learned;
    }
    return r->preset_context > 0 ? r->preset_context : RT_DEFAULT_MAX_CONTEXT;
}

static void collect(struct metrics_registry *reg, void *arg)
{
    struct router *r = arg;
    (void)reg;
    metrics_gauge_set(r->m.running, r->d.n_running);
    metrics_gauge_set(r->m.waiting, r->d.n_pending);
    int healthy, total;
    rt_registry_counts(&r->reg, &healthy, &total);
    metrics_gauge_set(r->m.endpoints_healthy, healthy);
    metrics_gauge_set(r->m.endpoints_total, total);
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

int rt_open(struct router *r, uv_loop_t *loop, const struct rt_opts *o, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    r->loop = loop;
    r->opts = *o;
    if (o->model == NULL || o->model[0] == '\0' || strlen(o->model) >= OA_MODEL_MAX) {
        snprintf(err, errlen, "--model: must be 1 to %d bytes", OA_MODEL_MAX - 1);
        return TANDEM_EINVAL;
    }
    int rc = rt_metrics_init(&r->m, o->model);
    if (rc != 0) {
        snprintf(err, errlen, "metrics: %s", tandem_strerror(rc));
        return rc;
    }
    r->have |= HAVE_METRICS;
    rc = open_tokenizer(r, err, errlen);
    if (rc != 0) {
        return rc;
    }
    struct rt_pipeline_opts po = {.seed = (uint64_t)o->seed};
    char perr[RT_ERR_MAX];
    if (o->routing != NULL) {
        rc = rt_pipeline_load(&r->pl, o->routing, &po, perr, sizeof(perr));
    } else {
        rc = rt_pipeline_parse(&r->pl, rt_default_routing(), "(default routing)", &po, perr,
                               sizeof(perr));
    }
    if (rc != 0) {
        snprintf(err, errlen, "--routing: %s", perr);
        return rc == TANDEM_ENOMEM ? rc : TANDEM_ECONFIG;
    }
    r->uses_hashes = rt_pipeline_uses_hashes(r->pl);
    r->block_size = r->uses_hashes ? rt_pipeline_block_size(r->pl) : o->block_size;
    if (r->block_size != o->block_size) {
        snprintf(err, errlen,
                 "--routing: the prefix plugins hash %d-token blocks, --block-size is %d (they "
                 "must be the workers' KV block size)",
                 r->block_size, o->block_size);
        return TANDEM_ECONFIG;
    }
    r->root = bh_root(o->model);
    r->model.id = o->model;
    r->model.vocab_size = tok_vocab_size(r->tok);
    r->model.max_context = RT_DEFAULT_MAX_CONTEXT;
    r->model.created = (int64_t)time(NULL);
    rc = declog_init(&r->declog, o->decisions);
    if (rc != 0) {
        snprintf(err, errlen, "decision log: %s", tandem_strerror(rc));
        return rc;
    }
    rc = metrics_on_collect(r->m.reg, collect, r);
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
    struct rt_registry_opts ro = {
        .model = o->model,
        .block_size = o->block_size,
        .heartbeat_timeout_ms = (uint64_t)o->heartbeat_timeout_ms,
        .forget_ms = (uint64_t)o->forget_ms,
        .secret = r->secret.set ? &r->secret : NULL,
        .auth_failures = r->m.auth_failures,
    };
    struct rt_registry_cbs cbs = {
        .on_message = rt_dispatch_on_message,
        .on_down = rt_dispatch_on_down,
        .on_up = rt_dispatch_on_up,
    };
    rc = rt_registry_init(&r->reg, loop, r->pl, &ro, &cbs, &r->d);
    if (rc != 0) {
        snprintf(err, errlen, "registry: %s", tandem_strerror(rc));
        return rc;
    }
    r->have |= HAVE_REGISTRY;
    rc = dispatch_open(r);
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
    rt_pipeline_destroy(r->pl);
    r->pl = NULL;
    tok_destroy(r->tok);
    r->tok = NULL;
    declog_fini(&r->declog);
    auth_key_wipe(&r->secret);
    if (r->have & HAVE_METRICS) {
        rt_metrics_fini(&r->m);
    }
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

/* The NNG sockets close last, once every client connection is closed:
 * nng_close may block for good (NNG 1.5 can deadlock closing a socket with
 * pipes coming and going; router/main.c has a stop watchdog for that), and
 * by then every client must have its answer and its EOF. */
static void close_registry(struct router *r)
{
    if ((r->have & HAVE_REGISTRY) && !r->reg.closing) {
        r->open_parts++;
        rt_registry_close(&r->reg, on_registry_closed);
    }
}

static void on_http_closed(struct http_server *srv)
{
    struct router *r = container_of(srv, struct router, http);
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
    if (r->have & HAVE_DISPATCH) {
        rt_dispatch_close(&r->d);
        r->open_parts += 2;
        uv_close((uv_handle_t *)&r->dispatch_tick, on_dispatch_handle_closed);
        uv_close((uv_handle_t *)&r->dispatch_kick, on_dispatch_handle_closed);
    }
    if (r->have & HAVE_HTTP) {
        r->open_parts++;
        http_server_close(&r->http, on_http_closed); /* then the registry */
    } else {
        close_registry(r);
    }
    part_closed(r);
}
