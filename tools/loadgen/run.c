/* The live host of the run driver (driver.h): libuv timers and the clock,
 * the HTTP client, SSE parsing, the model list, SIGINT and the progress
 * line. See run.h. */
#include "run.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "log.h"
#include "openai.h"
#include "progress.h"
#include "sse.h"
#include "tandem_err.h"

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define ERROR_BODY_MAX (64u << 10) /* kept of a non-200 model list, for its message */
#define JSON_BODY_MAX  (64u << 20) /* the whole model list */
#define PROGRESS_MS    250

struct shell;

/* One HTTP request: a driver request (q), or the model list (q NULL). */
struct call {
    struct lg_http_call http;
    struct shell *s;
    struct lg_req *q;
    struct lg_sse sse;
    int sse_mode;     /* the driver wants SSE events */
    int event_failed; /* the driver failed q from an event */
    int status;       /* model list */
    char *body;       /* model list */
    size_t body_len;
};

struct shell {
    uv_loop_t loop;
    const struct lg_run_config *cfg;
    struct lg_driver *d;
    struct lg_http_client http;
    uv_timer_t wake_timer, progress_timer;
    uv_signal_t sigint;
    uint64_t t_run;      /* lg_run start (uv_hrtime): the driver's time 0 */
    struct call *models; /* GET models_path in flight */
    struct call *ending; /* being cancelled: still here when not ended from inside */
    char model[256];     /* from the model list */
    char send_err[256];  /* why the last send failed */
    int started;         /* the driver runs */
    int progress_shown;
    int over;   /* handles closed */
    int failed; /* fatal before the driver started: err is set */
    char *err;
    size_t errlen;
};

static void end_run(struct shell *s);

static void fatal(struct shell *s, int rc, const char *msg)
{
    if (s->failed) {
        return;
    }
    s->failed = rc;
    snprintf(s->err, s->errlen, "%s", msg);
    end_run(s);
}

/* ---- the driver's ops ---- */

static double host_now(void *arg)
{
    const struct shell *s = arg;
    return (double)(uv_hrtime() - s->t_run) / 1e9;
}

static void wake_cb(uv_timer_t *t)
{
    lg_driver_wake(container_of(t, struct shell, wake_timer)->d);
}

static void host_wake_at(void *arg, double t)
{
    struct shell *s = arg;
    if (isinf(t)) {
        uv_timer_stop(&s->wake_timer);
        return;
    }
    double ms = ceil((t - host_now(s)) * 1000.0);
    uv_timer_start(&s->wake_timer, wake_cb, ms < 0 ? 0 : (uint64_t)ms, 0);
}

static const struct lg_http_call_ops call_ops;

static struct call *call_new(struct shell *s, struct lg_req *q, double timeout_s)
{
    struct call *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    c->s = s;
    c->q = q;
    c->http.ops = &call_ops;
    c->http.timeout_ms = (uint64_t)ceil(timeout_s * 1000.0);
    lg_sse_init(&c->sse, 0);
    return c;
}

static void call_free(struct call *c)
{
    lg_sse_fini(&c->sse);
    free(c->body);
    free(c);
}

static int host_send(void *arg, struct lg_req *q, const char *path, const char *body, size_t len,
                     double timeout_s)
{
    struct shell *s = arg;
    struct call *c = call_new(s, q, timeout_s);
    if (c == NULL) {
        snprintf(s->send_err, sizeof(s->send_err), "out of memory");
        return TANDEM_ENOMEM;
    }
    lg_driver_set_host(q, c);
    int rc = lg_http_send(&s->http, &c->http, "POST", path, body, len);
    if (rc != 0) {
        snprintf(s->send_err, sizeof(s->send_err), "%s", s->http.last_error);
        lg_driver_set_host(q, NULL);
        call_free(c);
    }
    return rc;
}

static const char *host_send_error(void *arg)
{
    return ((struct shell *)arg)->send_err;
}

static void host_cancel(void *arg, struct lg_req *q)
{
    struct shell *s = arg;
    struct call *c = lg_driver_host(q);
    s->ending = c;
    lg_http_cancel(&c->http);
    if (s->ending == c) { /* not attached to a connection: end it here */
        s->ending = NULL;
        call_free(c);
        lg_driver_done(q, TANDEM_ECANCELLED, LG_FAIL_CANCELLED, "cancelled");
    }
}

static void host_ended(void *arg)
{
    end_run(arg);
}

static const struct lg_driver_ops host_ops = {
    .now = host_now,
    .wake_at = host_wake_at,
    .send = host_send,
    .send_error = host_send_error,
    .cancel = host_cancel,
    .ended = host_ended,
};

/* ---- HTTP callbacks ---- */

static int on_event(void *arg, const char *name, const char *data, size_t len)
{
    struct call *c = arg;
    int rc = lg_driver_event(c->q, name, data, len);
    c->event_failed = rc != 0;
    return rc;
}

static int on_headers(struct lg_http_call *call, int status, const char *ctype,
                      enum lg_fail *reason, char *msg)
{
    struct call *c = container_of(call, struct call, http);
    if (c->q == NULL) {
        c->status = status;
    } else {
        c->sse_mode = lg_driver_status(c->q, status, ctype);
    }
    return 0;
}

/* The model list's body: all of a 200 (the list), the start of an error. */
static int models_body(struct call *c, const char *data, size_t len, enum lg_fail *reason,
                       char *msg)
{
    size_t keep = (c->status == 200 ? JSON_BODY_MAX : ERROR_BODY_MAX) - c->body_len;
    if (len > keep && c->status == 200) {
        *reason = LG_FAIL_BAD_STREAM;
        snprintf(msg, 256, "response body over %u bytes", JSON_BODY_MAX);
        return TANDEM_ETOOBIG;
    }
    keep = len < keep ? len : keep;
    char *b = realloc(c->body, c->body_len + keep + 1);
    if (b == NULL) {
        *reason = LG_FAIL_CLIENT;
        snprintf(msg, 256, "out of memory");
        return TANDEM_ENOMEM;
    }
    memcpy(b + c->body_len, data, keep);
    c->body = b;
    c->body_len += keep;
    b[c->body_len] = '\0';
    return 0;
}

static int on_body(struct lg_http_call *call, const char *data, size_t len, enum lg_fail *reason,
                   char *msg)
{
    struct call *c = container_of(call, struct call, http);
    if (c->q == NULL) {
        return models_body(c, data, len, reason, msg);
    }
    if (!c->sse_mode) {
        *reason = LG_FAIL_BAD_STREAM; /* the driver has recorded its own */
        snprintf(msg, 256, "bad body");
        return lg_driver_body(c->q, data, len);
    }
    int rc = lg_sse_feed(&c->sse, data, len, on_event, c);
    if (rc != 0) {
        *reason = rc == TANDEM_ENOMEM && !c->event_failed ? LG_FAIL_CLIENT : LG_FAIL_BAD_STREAM;
        snprintf(msg, 256, "malformed SSE stream: %s", tandem_strerror(rc));
    }
    return rc;
}

static void start_driver(struct shell *s, const char *model)
{
    s->started = 1;
    lg_driver_start(s->d, model);
}

static void models_done(struct call *c, int err, enum lg_fail reason, const char *msg)
{
    struct shell *s = c->s;
    s->models = NULL;
    char why[256];
    if (err != 0) {
        snprintf(why, sizeof(why), "%s", msg ? msg : tandem_strerror(err));
    } else if (c->status != 200) {
        char m[200];
        lg_openai_error_message(c->body ? c->body : "", c->body_len, m, sizeof(m));
        snprintf(why, sizeof(why), "HTTP %d: %s", c->status, m);
    } else if (lg_openai_first_model(c->body ? c->body : "", c->body_len, s->model,
                                     sizeof(s->model)) != 0) {
        snprintf(why, sizeof(why), "no model in the response");
    } else {
        call_free(c);
        start_driver(s, s->model);
        return;
    }
    call_free(c);
    char m[512];
    snprintf(m, sizeof(m), "--model not given and GET %s failed: %s", s->cfg->models_path, why);
    fatal(s, TANDEM_EIO, m);
}

static void on_done(struct lg_http_call *call, int err, enum lg_fail reason, const char *msg)
{
    struct call *c = container_of(call, struct call, http);
    if (c->s->ending == c) {
        c->s->ending = NULL;
    }
    if (c->q == NULL) {
        models_done(c, err, reason, msg);
        return;
    }
    struct lg_req *q = c->q;
    if (err == 0 && c->sse_mode && lg_sse_finish(&c->sse, on_event, c) != 0) {
        /* What is pending at the end: an event the driver failed, or garbage. */
        err = TANDEM_EPROTO;
        reason = LG_FAIL_BAD_STREAM;
        msg = "malformed SSE stream at its end";
    }
    call_free(c);
    lg_driver_done(q, err, reason, msg);
}

static const struct lg_http_call_ops call_ops = {
    .on_headers = on_headers,
    .on_body = on_body,
    .on_done = on_done,
};

/* ---- progress, SIGINT, the end ---- */

static void progress_cb(uv_timer_t *t)
{
    struct shell *s = container_of(t, struct shell, progress_timer);
    double elapsed = host_now(s);
    if (elapsed < s->cfg->progress_after_s) {
        return;
    }
    struct lg_driver_stats st;
    lg_driver_stats(s->d, &st);
    struct lg_progress p = {
        .done = st.done,
        .failed = st.failed,
        .total = st.total,
        .in_flight = st.in_flight,
    };
    if (st.phase == LG_DRIVER_WARMUP) {
        p.phase = "warm-up";
        p.elapsed_s = elapsed;
    } else if (st.phase == LG_DRIVER_RUN) {
        p.phase = "run";
        p.elapsed_s = elapsed - st.t_start;
        p.duration_s = s->cfg->duration_s;
    } else {
        return;
    }
    char line[256];
    lg_progress_format(&p, line, sizeof(line));
    FILE *out = s->cfg->progress_out ? s->cfg->progress_out : stderr;
    fprintf(out, "\r%-90s", line);
    fflush(out);
    s->progress_shown = 1;
}

static void on_sigint(uv_signal_t *sig, int signum)
{
    struct shell *s = container_of(sig, struct shell, sigint);
    /* A second Ctrl-C kills the process the default way. */
    uv_signal_stop(sig);
    struct lg_driver_stats st;
    lg_driver_stats(s->d, &st);
    LOG_WARN("bench", "interrupted: cancelling %lld requests in flight",
             (long long)(st.in_flight + (s->models != NULL)));
    if (s->started) {
        lg_driver_interrupt(s->d);
    } else {
        fatal(s, TANDEM_ECANCELLED, "interrupted");
    }
}

static void closed_noop(uv_handle_t *h)
{
}

static void end_run(struct shell *s)
{
    if (s->over) {
        return;
    }
    if (s->progress_shown) {
        progress_cb(&s->progress_timer); /* the final counts stay on screen */
    }
    s->over = 1;
    uv_timer_stop(&s->wake_timer);
    uv_timer_stop(&s->progress_timer);
    if (s->progress_shown) {
        FILE *out = s->cfg->progress_out ? s->cfg->progress_out : stderr;
        fputc('\n', out);
        fflush(out);
    }
    uv_close((uv_handle_t *)&s->wake_timer, closed_noop);
    uv_close((uv_handle_t *)&s->progress_timer, closed_noop);
    uv_close((uv_handle_t *)&s->sigint, closed_noop);
    /* Cancels the model list if it is still in flight (its on_done runs). */
    lg_http_client_close(&s->http, NULL);
}

/* ---- lg_run ---- */

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            LOG_WARN("bench", "cannot raise the open file limit");
        }
    }
}

static void ignore_sigpipe(void)
{
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
        sa.sa_handler = SIG_IGN;
        sigaction(SIGPIPE, &sa, NULL);
    }
}

/* Starts the run: with the model given, the driver at once; else the model
 * list first. */
static void begin(struct shell *s)
{
    const struct lg_run_config *cfg = s->cfg;
    if (cfg->model != NULL && cfg->model[0] != '\0') {
        start_driver(s, cfg->model);
        return;
    }
    struct call *c = call_new(s, NULL, cfg->request_timeout_s);
    if (c == NULL) {
        fatal(s, TANDEM_ENOMEM, "out of memory");
        return;
    }
    s->models = c;
    if (lg_http_send(&s->http, &c->http, "GET", cfg->models_path, NULL, 0) != 0) {
        /* Not sent: end it like a failed request (no callback will come). */
        models_done(c, TANDEM_EIO, LG_FAIL_CONNECT, s->http.last_error);
    }
}

int lg_run(const struct lg_run_config *cfg, struct lg_run_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->trace_count = -1;
    /* On this stack: lg_run returns only once the loop is closed. */
    struct shell shell = {.cfg = cfg, .err = err, .errlen = errlen};
    struct shell *s = &shell;
    int rc = lg_driver_create(&s->d, cfg, &host_ops, s, err, errlen);
    if (rc != 0) {
        return rc;
    }
    raise_nofile();
    ignore_sigpipe();
    rc = uv_loop_init(&s->loop);
    if (rc != 0) {
        snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
        rc = TANDEM_EUV;
        goto out_driver;
    }
    char auth[600] = "";
    if (cfg->api_key != NULL && cfg->api_key[0] != '\0') {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", cfg->api_key);
    }
    rc = lg_http_client_init(&s->http, &s->loop, cfg->host, cfg->port, auth, err, errlen);
    if (rc != 0) {
        goto out_loop;
    }
    uv_timer_init(&s->loop, &s->wake_timer);
    uv_timer_init(&s->loop, &s->progress_timer);
    uv_signal_init(&s->loop, &s->sigint);
    uv_signal_start(&s->sigint, on_sigint, SIGINT);
    s->t_run = uv_hrtime();
    if (cfg->progress) {
        uv_timer_start(&s->progress_timer, progress_cb, PROGRESS_MS, PROGRESS_MS);
    }
    begin(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    rc = s->failed;
    if (rc == 0) {
        rc = lg_driver_finish(s->d, out, err, errlen);
    }
    if (rc == 0) {
        lg_http_client_stats(&s->http, &out->http);
    }
out_loop:
    if (uv_loop_close(&s->loop) != 0) {
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
    }
out_driver:
    lg_driver_destroy(s->d);
    return rc;
}
