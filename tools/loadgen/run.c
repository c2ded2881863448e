/* The run engine: a scheduler of arrivals (a min-heap of due times), the
 * in-flight requests on the HTTP client, and the records. See run.h. */
#include "run.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include "arrivals.h"
#include "log.h"
#include "openai.h"
#include "progress.h"
#include "sse.h"
#include "tandem_err.h"

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define ERROR_BODY_MAX (64u << 10) /* kept of a non-200 body, for its message */
#define JSON_BODY_MAX  (64u << 20) /* a whole non-streamed response */
#define PROGRESS_MS    250

enum phase { PHASE_MODEL, PHASE_WARMUP, PHASE_MAIN, PHASE_DONE };
enum kind { KIND_MODEL, KIND_WARMUP, KIND_MAIN };
enum mode { MODE_NONE, MODE_SSE, MODE_JSON, MODE_ERROR };

struct pend {
    double t; /* due, seconds from the start of the measured run */
    int64_t index;
    int fresh; /* a new arrival (not a follow-up turn) */
};

struct run;

struct inflight {
    struct lg_http_call call;
    struct run *run;
    struct inflight *prev, *next;
    enum kind kind;
    size_t slot; /* record (KIND_MAIN) */
    int64_t index;
    int32_t session, turn;
    uint64_t t_start, t_first, t_last; /* uv_hrtime() */
    uint32_t n_chunks;
    double *itl;
    uint32_t n_itl, cap_itl;
    enum mode mode;
    int status;
    struct lg_sse sse;
    char *body; /* MODE_JSON, MODE_ERROR, KIND_MODEL */
    size_t body_len, body_cap;
    int keep_text;
    char *text; /* generated text (multi-turn reply) */
    size_t text_len, text_cap;
    int64_t prompt_tokens, completion_tokens, cached_tokens;
    int done_marker;
    enum lg_fail fail; /* set by the stream callbacks */
    char fail_msg[256];
};

struct run {
    uv_loop_t loop;
    const struct lg_run_config *cfg;
    struct lg_run_result *out;
    struct lg_workload wl;
    struct lg_http_client http;
    struct lg_openai_opts api;
    uv_timer_t arrival_timer, duration_timer, progress_timer;
    uv_signal_t sigint;
    enum phase phase;
    uint64_t t_run; /* lg_run start, for the progress delay */
    uint64_t t0;    /* start of the measured run (uv_hrtime) */
    /* arrivals */
    struct pend *heap;
    size_t heap_n, heap_cap;
    int generating;      /* new requests may still be scheduled */
    int fresh_exhausted; /* every arrival has been scheduled */
    int64_t units_total; /* arrivals (sessions for multi-turn); -1 unbounded */
    int64_t units_next;
    int64_t requests_cap;  /* measured requests; -1 unbounded */
    double *arrival_times; /* (units_total) when precomputed */
    struct lg_arrivals arrivals;
    int use_trace_times;
    /* requests */
    struct inflight *inflight_head;
    int64_t in_flight;
    int64_t warm_next, warm_done;
    int64_t main_done, main_failed;
    struct lg_record *records;
    size_t n_records, cap_records;
    int progress_shown;
    int pumping; /* inside pump or pump_warmup: a failed send ends its request
                  * synchronously, and must not recurse into another pump */
    int failed;  /* fatal: err is set */
    char *err;
    size_t errlen;
};

/* ---- time ---- */

static double since_t0(const struct run *r)
{
    return (double)(uv_hrtime() - r->t0) / 1e9;
}

/* ---- the heap of due arrivals ---- */

static int pend_less(const struct pend *a, const struct pend *b)
{
    return a->t < b->t || (a->t == b->t && a->index < b->index);
}

static int heap_push(struct run *r, double t, int64_t index, int fresh)
{
    if (r->heap_n == r->heap_cap) {
        size_t n = r->heap_cap ? r->heap_cap * 2 : 64;
        struct pend *h = realloc(r->heap, n * sizeof(*h));
        if (h == NULL) {
            return TANDEM_ENOMEM;
        }
        r->heap = h;
        r->heap_cap = n;
    }
    size_t i = r->heap_n++;
    r->heap[i] = (struct pend){t, index, fresh};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pend_less(&r->heap[i], &r->heap[p])) {
            break;
        }
        struct pend x = r->heap[i];
        r->heap[i] = r->heap[p];
        r->heap[p] = x;
        i = p;
    }
    return 0;
}

static struct pend heap_pop(struct run *r)
{
    struct pend top = r->heap[0];
    r->heap[0] = r->heap[--r->heap_n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < r->heap_n && pend_less(&r->heap[l], &r->heap[m])) {
            m = l;
        }
        if (l + 1 < r->heap_n && pend_less(&r->heap[l + 1], &r->heap[m])) {
            m = l + 1;
        }
        if (m == i) {
            break;
        }
        struct pend x = r->heap[i];
        r->heap[i] = r->heap[m];
        r->heap[m] = x;
        i = m;
    }
    return top;
}

/* ---- scheduling ---- */

static void fatal(struct run *r, int rc, const char *msg);
static void end_run(struct run *r);
static void pump(struct run *r);

/* Schedules the next new arrival (one at a time: arrival times never
 * decrease, so the heap stays small even for unbounded runs). */
static void schedule_next_fresh(struct run *r)
{
    if (!r->generating || r->fresh_exhausted) {
        return;
    }
    if (r->units_total >= 0 && r->units_next >= r->units_total) {
        r->fresh_exhausted = 1;
        return;
    }
    int64_t unit = r->units_next;
    int64_t index = unit * r->wl.turns;
    double t;
    if (r->use_trace_times) {
        t = lg_workload_arrival(&r->wl, index);
    } else if (r->arrival_times != NULL) {
        t = r->arrival_times[unit];
    } else {
        t = lg_arrivals_next(&r->arrivals);
    }
    if (r->cfg->duration_s > 0 && t >= r->cfg->duration_s) {
        r->fresh_exhausted = 1;
        return;
    }
    if (heap_push(r, t, index, 1) != 0) {
        fatal(r, TANDEM_ENOMEM, "out of memory");
        return;
    }
    r->units_next++;
}

static void stop_generating(struct run *r)
{
    r->generating = 0;
    r->fresh_exhausted = 1;
    r->out->not_sent += (int64_t)r->heap_n;
    r->heap_n = 0;
    uv_timer_stop(&r->arrival_timer);
}

/* ---- records ---- */

static int new_record(struct run *r, size_t *slot)
{
    if (r->n_records == r->cap_records) {
        size_t n = r->cap_records ? r->cap_records * 2 : 1024;
        struct lg_record *p = realloc(r->records, n * sizeof(*p));
        if (p == NULL) {
            return TANDEM_ENOMEM;
        }
        r->records = p;
        r->cap_records = n;
    }
    *slot = r->n_records++;
    memset(&r->records[*slot], 0, sizeof(struct lg_record));
    return 0;
}

static void set_error(struct lg_record *rec, const char *msg)
{
    free(rec->error);
    rec->error = msg ? strdup(msg) : NULL;
}

/* ---- one request ---- */

static const struct lg_http_call_ops call_ops;

static void inflight_free(struct inflight *f)
{
    lg_sse_fini(&f->sse);
    free(f->itl);
    free(f->body);
    free(f->text);
    free(f);
}

static void list_remove(struct run *r, struct inflight *f)
{
    if (f->prev != NULL) {
        f->prev->next = f->next;
    } else {
        r->inflight_head = f->next;
    }
    if (f->next != NULL) {
        f->next->prev = f->prev;
    }
    f->prev = f->next = NULL;
}

static int append(char **buf, size_t *len, size_t *cap, const char *data, size_t n, size_t max)
{
    if (*len + n > max) {
        n = max - *len;
    }
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *len + n + 1) {
            c *= 2;
        }
        char *b = realloc(*buf, c);
        if (b == NULL) {
            return TANDEM_ENOMEM;
        }
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

/* A token chunk arrived at time t. */
static int on_token(struct inflight *f, uint64_t t)
{
    if (f->n_chunks == 0) {
        f->t_first = t;
    } else {
        if (f->n_itl == f->cap_itl) {
            uint32_t n = f->cap_itl ? f->cap_itl * 2 : 64;
            double *p = realloc(f->itl, n * sizeof(double));
            if (p == NULL) {
                return TANDEM_ENOMEM;
            }
            f->itl = p;
            f->cap_itl = n;
        }
        f->itl[f->n_itl++] = (double)(t - f->t_last) / 1e9;
    }
    f->t_last = t;
    f->n_chunks++;
    return 0;
}

/* Applies one parsed chunk (streamed, or a whole JSON response). */
static int apply_chunk(struct inflight *f, const struct lg_chunk *c, uint64_t t)
{
    if (c->is_error) {
        f->fail = LG_FAIL_STREAM_ERROR;
        snprintf(f->fail_msg, sizeof(f->fail_msg), "%s", c->error);
        return TANDEM_EPROTO;
    }
    if (c->has_usage) {
        if (c->prompt_tokens >= 0) {
            f->prompt_tokens = c->prompt_tokens;
        }
        if (c->completion_tokens >= 0) {
            f->completion_tokens = c->completion_tokens;
        }
        if (c->cached_tokens >= 0) {
            f->cached_tokens = c->cached_tokens;
        }
    }
    if (c->is_token) {
        if (on_token(f, t) != 0) {
            f->fail = LG_FAIL_CLIENT;
            snprintf(f->fail_msg, sizeof(f->fail_msg), "out of memory");
            return TANDEM_ENOMEM;
        }
        if (f->keep_text && c->text_len > 0 &&
            append(&f->text, &f->text_len, &f->text_cap, c->text, c->text_len, JSON_BODY_MAX) !=
                0) {
            f->fail = LG_FAIL_CLIENT;
            snprintf(f->fail_msg, sizeof(f->fail_msg), "out of memory");
            return TANDEM_ENOMEM;
        }
    }
    return 0;
}

static int on_event(void *arg, const char *name, const char *data, size_t len)
{
    struct inflight *f = arg;
    uint64_t t = uv_hrtime();
    if (strcmp(name, "error") == 0) {
        f->fail = LG_FAIL_STREAM_ERROR;
        snprintf(f->fail_msg, sizeof(f->fail_msg), "error event: %.200s", data);
        return TANDEM_EPROTO;
    }
    if (strcmp(name, "message") != 0) {
        return 0;
    }
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        f->done_marker = 1;
        return 0;
    }
    struct lg_chunk c;
    if (lg_openai_parse_chunk(f->run->cfg->workload.api, data, len, &c) != 0) {
        f->fail = LG_FAIL_BAD_STREAM;
        snprintf(f->fail_msg, sizeof(f->fail_msg), "malformed SSE data: %.200s", c.error);
        return TANDEM_EPROTO;
    }
    int rc = apply_chunk(f, &c, t);
    lg_chunk_clear(&c);
    return rc;
}

static int on_headers(struct lg_http_call *call, int status, const char *ctype,
                      enum lg_fail *reason, char *msg)
{
    struct inflight *f = container_of(call, struct inflight, call);
    f->status = status;
    if (f->kind == KIND_MODEL || status != 200) {
        f->mode = status == 200 ? MODE_JSON : MODE_ERROR;
    } else if (strncasecmp(ctype, "text/event-stream", 17) == 0) {
        f->mode = MODE_SSE;
    } else {
        f->mode = MODE_JSON;
    }
    return 0;
}

static int on_body(struct lg_http_call *call, const char *data, size_t len, enum lg_fail *reason,
                   char *msg)
{
    struct inflight *f = container_of(call, struct inflight, call);
    int rc = 0;
    switch (f->mode) {
    case MODE_SSE:
        rc = lg_sse_feed(&f->sse, data, len, on_event, f);
        if (rc != 0 && f->fail == LG_FAIL_NONE) {
            f->fail = rc == TANDEM_ENOMEM ? LG_FAIL_CLIENT : LG_FAIL_BAD_STREAM;
            snprintf(f->fail_msg, sizeof(f->fail_msg), "malformed SSE stream: %s",
                     tandem_strerror(rc));
        }
        break;
    case MODE_JSON:
        if (f->body_len + len > JSON_BODY_MAX) {
            f->fail = LG_FAIL_BAD_STREAM;
            snprintf(f->fail_msg, sizeof(f->fail_msg), "response body over %u bytes",
                     JSON_BODY_MAX);
            rc = TANDEM_ETOOBIG;
            break;
        }
        rc = append(&f->body, &f->body_len, &f->body_cap, data, len, JSON_BODY_MAX);
        if (rc != 0) {
            f->fail = LG_FAIL_CLIENT;
            snprintf(f->fail_msg, sizeof(f->fail_msg), "out of memory");
        }
        break;
    case MODE_ERROR:
        if (f->body_len < ERROR_BODY_MAX) {
            append(&f->body, &f->body_len, &f->body_cap, data, len, ERROR_BODY_MAX);
        }
        break;
    case MODE_NONE:
        break;
    }
    if (rc != 0) {
        *reason = f->fail;
        snprintf(msg, 256, "%s", f->fail_msg);
    }
    return rc;
}

/* The response is complete: read what is buffered and decide ok or failed. */
static void conclude(struct inflight *f)
{
    if (f->mode == MODE_SSE) {
        if (lg_sse_finish(&f->sse, on_event, f) != 0 && f->fail == LG_FAIL_NONE) {
            f->fail = LG_FAIL_BAD_STREAM;
            snprintf(f->fail_msg, sizeof(f->fail_msg), "malformed SSE stream at its end");
        }
    } else if (f->mode == MODE_JSON && f->kind != KIND_MODEL) {
        struct lg_chunk c;
        if (lg_openai_parse_chunk(f->run->cfg->workload.api, f->body ? f->body : "", f->body_len,
                                  &c) != 0) {
            f->fail = LG_FAIL_BAD_STREAM;
            snprintf(f->fail_msg, sizeof(f->fail_msg), "malformed JSON response: %.200s", c.error);
        } else {
            apply_chunk(f, &c, uv_hrtime());
            lg_chunk_clear(&c);
        }
    } else if (f->mode == MODE_ERROR) {
        char m[200];
        lg_openai_error_message(f->body ? f->body : "", f->body_len, m, sizeof(m));
        f->fail = LG_FAIL_HTTP;
        snprintf(f->fail_msg, sizeof(f->fail_msg), "HTTP %d: %s", f->status, m);
    }
    if (f->fail == LG_FAIL_NONE && f->kind != KIND_MODEL && f->n_chunks == 0) {
        f->fail = LG_FAIL_NO_TOKENS;
        snprintf(f->fail_msg, sizeof(f->fail_msg), "the response ended without a token");
    }
}

static void fill_record(struct run *r, struct inflight *f)
{
    struct lg_record *rec = &r->records[f->slot];
    rec->ok = f->fail == LG_FAIL_NONE;
    rec->reason = f->fail;
    rec->http_status = f->status;
    rec->done_marker = (uint8_t)f->done_marker;
    if (!rec->ok) {
        set_error(rec, f->fail_msg);
    }
    rec->n_chunks = f->n_chunks;
    if (f->n_chunks > 0) {
        rec->ttft_s = (double)(f->t_first - f->t_start) / 1e9;
        rec->e2el_s = (double)(f->t_last - f->t_start) / 1e9;
    }
    rec->itl_s = f->itl;
    rec->n_itl = f->n_itl;
    f->itl = NULL;
    rec->usage_prompt = f->prompt_tokens >= 0;
    rec->prompt_tokens = f->prompt_tokens >= 0 ? f->prompt_tokens : rec->target_prompt_len;
    rec->usage_output = f->completion_tokens >= 0;
    rec->output_tokens = f->completion_tokens >= 0 ? f->completion_tokens : (int64_t)f->n_chunks;
    rec->cached_tokens = f->cached_tokens;
    if (rec->ok) {
        r->main_done++;
    } else {
        r->main_done++;
        r->main_failed++;
    }
}

/* Multi-turn: hand the reply to the workload and schedule the next turn. */
static void next_turn(struct run *r, struct inflight *f, int ok)
{
    if (r->wl.turns <= 1 || f->kind != KIND_MAIN) {
        return;
    }
    struct lg_prompt p;
    memset(&p, 0, sizeof(p));
    p.index = f->index;
    p.session = f->session;
    p.turn = f->turn;
    lg_workload_turn_done(&r->wl, &p, ok ? f->text : NULL, ok ? f->text_len : 0);
    int64_t next = f->index + 1;
    if (!r->generating || f->turn + 1 >= r->wl.turns ||
        (r->requests_cap >= 0 && next >= r->requests_cap)) {
        return;
    }
    double t = since_t0(r) + r->cfg->think_time_s;
    if (r->cfg->duration_s > 0 && t >= r->cfg->duration_s) {
        return;
    }
    if (heap_push(r, t, next, 0) != 0) {
        fatal(r, TANDEM_ENOMEM, "out of memory");
    }
}

static void start_main(struct run *r);
static void pump_warmup(struct run *r);
static void start_after_model(struct run *r);

static void on_done(struct lg_http_call *call, int err, enum lg_fail reason, const char *msg)
{
    struct inflight *f = container_of(call, struct inflight, call);
    struct run *r = f->run;
    list_remove(r, f);
    r->in_flight--;
    if (err == 0) {
        conclude(f);
    } else if (f->fail == LG_FAIL_NONE || reason == LG_FAIL_TIMEOUT ||
               reason == LG_FAIL_CANCELLED) {
        f->fail = reason == LG_FAIL_NONE ? LG_FAIL_CLIENT : reason;
        snprintf(f->fail_msg, sizeof(f->fail_msg), "%s", msg ? msg : tandem_strerror(err));
    }
    int ok = f->fail == LG_FAIL_NONE;
    switch (f->kind) {
    case KIND_MODEL:
        if (ok && lg_openai_first_model(f->body ? f->body : "", f->body_len, r->out->model,
                                        sizeof(r->out->model)) == 0) {
            inflight_free(f);
            start_after_model(r);
            return;
        }
        if (ok) {
            snprintf(f->fail_msg, sizeof(f->fail_msg), "no model in the response");
        }
        {
            char m[512];
            snprintf(m, sizeof(m), "--model not given and GET %s failed: %s", r->cfg->models_path,
                     f->fail_msg);
            inflight_free(f);
            fatal(r, TANDEM_EIO, m);
        }
        return;
    case KIND_WARMUP:
        r->warm_done++;
        if (ok) {
            r->out->warmups_ok++;
        } else {
            r->out->warmups_failed++;
            if (r->out->warmups_failed <= 3) {
                LOG_WARN("bench", "warm-up request failed: %s", f->fail_msg);
            }
        }
        inflight_free(f);
        pump_warmup(r);
        return;
    case KIND_MAIN:
        fill_record(r, f);
        next_turn(r, f, ok);
        inflight_free(f);
        pump(r);
        return;
    }
}

static const struct lg_http_call_ops call_ops = {
    .on_headers = on_headers,
    .on_body = on_body,
    .on_done = on_done,
};

static struct inflight *inflight_new(struct run *r, enum kind kind)
{
    struct inflight *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        return NULL;
    }
    f->run = r;
    f->kind = kind;
    f->call.ops = &call_ops;
    f->call.timeout_ms = (uint64_t)ceil(r->cfg->request_timeout_s * 1000.0);
    f->prompt_tokens = f->completion_tokens = f->cached_tokens = -1;
    f->session = -1;
    lg_sse_init(&f->sse, 0);
    return f;
}

/* Sends f's request; on failure to send, ends it at once. */
static void send_request(struct run *r, struct inflight *f, const char *method, const char *path,
                         const char *body, size_t len)
{
    f->t_start = uv_hrtime();
    f->next = r->inflight_head;
    if (f->next != NULL) {
        f->next->prev = f;
    }
    r->inflight_head = f;
    r->in_flight++;
    int rc = lg_http_send(&r->http, &f->call, method, path, body, len);
    if (rc != 0) {
        /* Not sent: end it like a failed request (no callback will come). */
        on_done(&f->call, rc, rc == TANDEM_ECANCELLED ? LG_FAIL_CANCELLED : LG_FAIL_CONNECT,
                r->http.last_error);
    }
}

/* Makes and sends request index (measured or warm-up). */
static void dispatch(struct run *r, int64_t index, double arrival, enum kind kind)
{
    struct inflight *f = inflight_new(r, kind);
    if (f == NULL) {
        fatal(r, TANDEM_ENOMEM, "out of memory");
        return;
    }
    f->index = index;
    size_t slot = 0;
    if (kind == KIND_MAIN) {
        if (new_record(r, &slot) != 0) {
            inflight_free(f);
            fatal(r, TANDEM_ENOMEM, "out of memory");
            return;
        }
        f->slot = slot;
        struct lg_record *rec = &r->records[slot];
        rec->index = index;
        rec->session = -1;
        rec->arrival_s = arrival;
        rec->start_s = since_t0(r);
        rec->cached_tokens = -1;
    }
    struct lg_prompt p;
    int rc = lg_workload_make(&r->wl, index, kind == KIND_WARMUP, &p);
    char *body = NULL;
    size_t len = 0;
    if (rc == 0) {
        body = lg_openai_body(&r->api, &p, &len);
        if (body == NULL) {
            rc = TANDEM_ENOMEM;
        }
    }
    if (rc != 0) {
        lg_prompt_free(&p);
        snprintf(f->fail_msg, sizeof(f->fail_msg), "cannot make request %lld: %s", (long long)index,
                 tandem_strerror(rc));
        f->fail = LG_FAIL_CLIENT;
        /* Account for it like any finished request. */
        f->next = r->inflight_head;
        if (f->next != NULL) {
            f->next->prev = f;
        }
        r->inflight_head = f;
        r->in_flight++;
        on_done(&f->call, rc, LG_FAIL_CLIENT, f->fail_msg);
        return;
    }
    f->session = p.session;
    f->turn = p.turn;
    f->keep_text =
        r->wl.turns > 1 && kind == KIND_MAIN && r->cfg->workload.mt_history == LG_HISTORY_RESPONSE;
    if (kind == KIND_MAIN) {
        struct lg_record *rec = &r->records[slot];
        rec->session = p.session;
        rec->turn = p.turn;
        rec->target_prompt_len = p.prompt_len;
        rec->target_output_len = p.output_len;
    }
    lg_prompt_free(&p);
    send_request(r, f, "POST", r->cfg->path, body, len);
    free(body);
}

/* ---- phases ---- */

static void arrival_timer_cb(uv_timer_t *t)
{
    pump(container_of(t, struct run, arrival_timer));
}

static void duration_timer_cb(uv_timer_t *t)
{
    pump(container_of(t, struct run, duration_timer));
}

static void maybe_end(struct run *r)
{
    if (r->phase == PHASE_MAIN && r->in_flight == 0 && r->heap_n == 0 &&
        (r->fresh_exhausted || !r->generating)) {
        r->out->duration_s = since_t0(r);
        end_run(r);
    }
}

static void pump(struct run *r)
{
    if (r->phase != PHASE_MAIN || r->pumping) {
        return;
    }
    r->pumping = 1;
    double now = since_t0(r);
    if (r->generating && r->cfg->duration_s > 0 && now >= r->cfg->duration_s) {
        stop_generating(r);
    }
    int max = r->cfg->max_concurrency;
    while (r->heap_n > 0 && r->phase == PHASE_MAIN) {
        if (r->generating && r->cfg->duration_s > 0 && now >= r->cfg->duration_s) {
            stop_generating(r);
            break;
        }
        if (r->heap[0].t > now || (max > 0 && r->in_flight >= max)) {
            break;
        }
        struct pend p = heap_pop(r);
        if (p.fresh) {
            schedule_next_fresh(r);
        }
        dispatch(r, p.index, p.t, KIND_MAIN);
        now = since_t0(r);
    }
    r->pumping = 0;
    if (r->phase != PHASE_MAIN) {
        return;
    }
    if (r->heap_n > 0 && r->heap[0].t > now) {
        double ms = ceil((r->heap[0].t - now) * 1000.0);
        uv_timer_start(&r->arrival_timer, arrival_timer_cb, ms < 0 ? 0 : (uint64_t)ms, 0);
    }
    maybe_end(r);
}

static void start_main(struct run *r)
{
    r->phase = PHASE_MAIN;
    r->t0 = uv_hrtime();
    r->generating = 1;
    if (r->cfg->duration_s > 0) {
        uv_timer_start(&r->duration_timer, duration_timer_cb,
                       (uint64_t)ceil(r->cfg->duration_s * 1000.0), 0);
    }
    schedule_next_fresh(r);
    pump(r);
}

static void pump_warmup(struct run *r)
{
    if (r->phase != PHASE_WARMUP || r->pumping) {
        return;
    }
    r->pumping = 1;
    int max = r->cfg->max_concurrency;
    while (r->warm_next < r->cfg->num_warmups && (max <= 0 || r->in_flight < max) &&
           r->phase == PHASE_WARMUP) {
        int64_t i = r->warm_next++;
        dispatch(r, i * r->wl.turns, 0, KIND_WARMUP);
    }
    r->pumping = 0;
    if (r->phase == PHASE_WARMUP && r->warm_done >= r->cfg->num_warmups && r->in_flight == 0) {
        start_main(r);
    }
}

static void start_after_model(struct run *r)
{
    r->api.model = r->out->model;
    r->phase = PHASE_WARMUP;
    pump_warmup(r);
}

static void progress_cb(uv_timer_t *t)
{
    struct run *r = container_of(t, struct run, progress_timer);
    if ((double)(uv_hrtime() - r->t_run) / 1e9 < r->cfg->progress_after_s) {
        return;
    }
    struct lg_progress p = {0};
    if (r->phase == PHASE_WARMUP) {
        p.phase = "warm-up";
        p.done = r->warm_done;
        p.failed = r->out->warmups_failed;
        p.total = r->cfg->num_warmups;
        p.elapsed_s = (double)(uv_hrtime() - r->t_run) / 1e9;
    } else if (r->phase == PHASE_MAIN) {
        p.phase = "run";
        p.done = r->main_done;
        p.failed = r->main_failed;
        p.total = r->requests_cap;
        p.elapsed_s = since_t0(r);
        p.duration_s = r->cfg->duration_s;
    } else {
        return;
    }
    p.in_flight = r->in_flight;
    char line[256];
    lg_progress_format(&p, line, sizeof(line));
    FILE *out = r->cfg->progress_out ? r->cfg->progress_out : stderr;
    fprintf(out, "\r%-90s", line);
    fflush(out);
    r->progress_shown = 1;
}

static void on_sigint(uv_signal_t *s, int signum)
{
    struct run *r = container_of(s, struct run, sigint);
    /* A second Ctrl-C kills the process the default way. */
    uv_signal_stop(s);
    r->out->interrupted = 1;
    LOG_WARN("bench", "interrupted: cancelling %lld requests in flight", (long long)r->in_flight);
    if (r->phase == PHASE_MODEL || r->phase == PHASE_WARMUP) {
        fatal(r, TANDEM_ECANCELLED, "interrupted");
        return;
    }
    stop_generating(r);
    while (r->inflight_head != NULL) {
        struct inflight *f = r->inflight_head;
        lg_http_cancel(&f->call);
        if (r->inflight_head == f) { /* not attached to a connection: end it here */
            on_done(&f->call, TANDEM_ECANCELLED, LG_FAIL_CANCELLED, "cancelled");
        }
    }
    maybe_end(r);
}

/* ---- start and end ---- */

static void closed_noop(uv_handle_t *h)
{
}

static void end_run(struct run *r)
{
    if (r->phase == PHASE_DONE) {
        return;
    }
    if (r->progress_shown) {
        progress_cb(&r->progress_timer); /* the final counts stay on screen */
    }
    r->phase = PHASE_DONE;
    uv_timer_stop(&r->arrival_timer);
    uv_timer_stop(&r->duration_timer);
    uv_timer_stop(&r->progress_timer);
    if (r->progress_shown) {
        FILE *out = r->cfg->progress_out ? r->cfg->progress_out : stderr;
        fputc('\n', out);
        fflush(out);
    }
    uv_close((uv_handle_t *)&r->arrival_timer, closed_noop);
    uv_close((uv_handle_t *)&r->duration_timer, closed_noop);
    uv_close((uv_handle_t *)&r->progress_timer, closed_noop);
    uv_close((uv_handle_t *)&r->sigint, closed_noop);
    /* Cancels whatever is still in flight (fatal errors); on_done runs. */
    lg_http_client_close(&r->http, NULL);
}

static void fatal(struct run *r, int rc, const char *msg)
{
    if (r->failed) {
        return;
    }
    r->failed = rc;
    snprintf(r->err, r->errlen, "%s", msg);
    if (r->phase != PHASE_DONE) {
        stop_generating(r);
        end_run(r);
    }
}

void lg_run_config_default(struct lg_run_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->host = "127.0.0.1";
    cfg->port = 8000;
    cfg->path = "/v1/completions";
    cfg->models_path = "/v1/models";
    cfg->ignore_eos = 1;
    cfg->temperature = NAN;
    cfg->num_prompts = 1000;
    cfg->request_rate = INFINITY;
    cfg->burstiness = 1.0;
    cfg->normalize_arrivals = 1;
    cfg->request_timeout_s = 600;
    cfg->trace_timestamps = 1;
    cfg->progress_after_s = 2.0;
    lg_workload_config_default(&cfg->workload);
}

void lg_run_result_free(struct lg_run_result *r)
{
    for (size_t i = 0; i < r->n; i++) {
        lg_record_clear(&r->records[i]);
    }
    free(r->records);
    r->records = NULL;
    r->n = 0;
}

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

static int cmp_record(const void *a, const void *b)
{
    const struct lg_record *x = a, *y = b;
    return (x->index > y->index) - (x->index < y->index);
}

static int validate(const struct lg_run_config *cfg, char *err, size_t errlen)
{
    if (!(cfg->request_rate > 0) || !(cfg->burstiness > 0)) {
        snprintf(err, errlen, "--request-rate and --burstiness must be > 0");
        return TANDEM_EINVAL;
    }
    if (!(cfg->request_timeout_s > 0) || cfg->max_concurrency < 0 || cfg->num_warmups < 0 ||
        cfg->think_time_s < 0 || !(cfg->duration_s >= 0)) {
        snprintf(err, errlen,
                 "--request-timeout must be > 0; --max-concurrency, --num-warmups, "
                 "--duration and the think time >= 0");
        return TANDEM_EINVAL;
    }
    if (cfg->duration_s > 0 && isinf(cfg->request_rate) && cfg->max_concurrency == 0 &&
        cfg->num_prompts < 0) {
        snprintf(err, errlen,
                 "--duration with an infinite --request-rate needs --max-concurrency (closed "
                 "loop) or --num-prompts");
        return TANDEM_EINVAL;
    }
    return 0;
}

int lg_run(const struct lg_run_config *cfg, struct lg_run_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->trace_count = -1;
    int rc = validate(cfg, err, errlen);
    if (rc != 0) {
        return rc;
    }
    struct run *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        snprintf(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    r->cfg = cfg;
    r->out = out;
    r->err = err;
    r->errlen = errlen;
    raise_nofile();
    ignore_sigpipe();

    rc = lg_workload_init(&r->wl, &cfg->workload, err, errlen);
    if (rc != 0) {
        goto out_run;
    }
    if (cfg->workload.dataset == LG_DATASET_TRACE) {
        out->trace_count = r->wl.count;
    }
    /* How many requests and arrivals. */
    r->requests_cap = cfg->num_prompts;
    if (r->wl.count >= 0 && (r->requests_cap < 0 || r->requests_cap > r->wl.count)) {
        r->requests_cap = r->wl.count;
    }
    if (r->requests_cap < 0 && !(cfg->duration_s > 0)) {
        snprintf(err, errlen, "an unbounded run needs --duration");
        rc = TANDEM_EINVAL;
        goto out_wl;
    }
    int64_t turns = r->wl.turns;
    r->units_total = r->requests_cap < 0 ? -1 : (r->requests_cap + turns - 1) / turns;
    r->use_trace_times = cfg->trace_timestamps && lg_workload_arrival(&r->wl, 0) >= 0;
    rc = lg_arrivals_init(&r->arrivals, cfg->request_rate, cfg->burstiness, cfg->workload.seed);
    if (rc != 0) {
        snprintf(err, errlen, "bad --request-rate or --burstiness");
        goto out_wl;
    }
    if (!r->use_trace_times && r->units_total > 0 && isfinite(cfg->request_rate)) {
        r->arrival_times = malloc((size_t)r->units_total * sizeof(double));
        if (r->arrival_times == NULL) {
            rc = TANDEM_ENOMEM;
            snprintf(err, errlen, "out of memory");
            goto out_wl;
        }
        /* A duration cuts the arrivals short: the rescaling (which assumes
         * every one is sent) would then change the rate, so it is off. */
        lg_arrivals_fill(cfg->request_rate, cfg->burstiness, cfg->workload.seed,
                         cfg->normalize_arrivals && !(cfg->duration_s > 0), (size_t)r->units_total,
                         r->arrival_times);
    }
    r->api.api = cfg->workload.api;
    r->api.ignore_eos = cfg->ignore_eos;
    r->api.temperature = cfg->temperature;
    r->api.extra_body = cfg->extra_body;
    snprintf(out->model, sizeof(out->model), "%s", cfg->model ? cfg->model : "");

    rc = uv_loop_init(&r->loop);
    if (rc != 0) {
        snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
        rc = TANDEM_EUV;
        goto out_arrivals;
    }
    char auth[600] = "";
    if (cfg->api_key != NULL && cfg->api_key[0] != '\0') {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", cfg->api_key);
    }
    rc = lg_http_client_init(&r->http, &r->loop, cfg->host, cfg->port, auth, err, errlen);
    if (rc != 0) {
        goto out_loop;
    }
    uv_timer_init(&r->loop, &r->arrival_timer);
    uv_timer_init(&r->loop, &r->duration_timer);
    uv_timer_init(&r->loop, &r->progress_timer);
    uv_signal_init(&r->loop, &r->sigint);
    uv_signal_start(&r->sigint, on_sigint, SIGINT);
    r->t_run = uv_hrtime();
    r->t0 = r->t_run;
    if (cfg->progress) {
        uv_timer_start(&r->progress_timer, progress_cb, PROGRESS_MS, PROGRESS_MS);
    }
    if (out->model[0] == '\0') {
        r->phase = PHASE_MODEL;
        struct inflight *f = inflight_new(r, KIND_MODEL);
        if (f == NULL) {
            fatal(r, TANDEM_ENOMEM, "out of memory");
        } else {
            send_request(r, f, "GET", cfg->models_path, NULL, 0);
        }
    } else {
        start_after_model(r);
    }
    uv_run(&r->loop, UV_RUN_DEFAULT);
    rc = r->failed;
    if (rc == 0) {
        lg_http_client_stats(&r->http, &out->http);
        qsort(r->records, r->n_records, sizeof(*r->records), cmp_record);
        out->records = r->records;
        out->n = r->n_records;
        r->records = NULL;
        r->n_records = 0;
    }
out_loop:
    if (uv_loop_close(&r->loop) != 0) {
        uv_run(&r->loop, UV_RUN_DEFAULT);
        uv_loop_close(&r->loop);
    }
out_arrivals:
    free(r->arrival_times);
out_wl:
    lg_workload_fini(&r->wl);
out_run:
    for (size_t i = 0; i < r->n_records; i++) {
        lg_record_clear(&r->records[i]);
    }
    free(r->records);
    free(r->heap);
    free(r);
    return rc;
}
