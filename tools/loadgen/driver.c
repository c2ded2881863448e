/* The run's logic: a scheduler of arrivals (a min-heap of due times), the
 * requests in flight, and the records, on the host's clock and transport.
 * See driver.h. */
#include "driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "arrivals.h"
#include "log.h"
#include "openai.h"
#include "tandem_err.h"

#define ERROR_BODY_MAX (64u << 10) /* kept of a non-200 body, for its message */
#define JSON_BODY_MAX  (64u << 20) /* a whole non-streamed response */

enum phase { PHASE_IDLE, PHASE_WARMUP, PHASE_MAIN, PHASE_DONE };
enum kind { KIND_WARMUP, KIND_MAIN };
enum mode { MODE_NONE, MODE_SSE, MODE_JSON, MODE_ERROR };

struct pend {
    double t; /* due, seconds from the start of the measured run */
    int64_t index;
    int fresh; /* a new arrival (not a follow-up turn) */
};

struct lg_req {
    /* What each streamed token touches comes first (lg_driver_chunk). */
    struct lg_driver *d;
    double t_first, t_last; /* ops->now() */
    uint32_t n_chunks;
    uint32_t n_itl, cap_itl;
    int keep_text;
    double *itl;
    char *text; /* generated text (multi-turn reply) */
    size_t text_len, text_cap;
    struct lg_req *prev, *next;
    void *host;
    enum kind kind;
    size_t slot; /* record (KIND_MAIN) */
    int64_t index;
    int32_t session, turn;
    double t_start; /* ops->now() */
    enum mode mode;
    int status;
    char *body; /* MODE_JSON, MODE_ERROR */
    size_t body_len, body_cap;
    int64_t prompt_tokens, completion_tokens, cached_tokens;
    int done_marker;
    int cancelled; /* ops->cancel was called */
    enum lg_fail fail;
    char fail_msg[LG_DRIVER_MSG];
};

struct lg_driver {
    const struct lg_run_config *cfg;
    const struct lg_driver_ops *ops;
    void *arg;
    struct lg_workload wl;
    struct lg_openai_opts api;
    char model[256];
    enum phase phase;
    enum lg_driver_phase shown; /* for the stats: the phase running or last run */
    double t0;                  /* now() at the start of the measured run */
    double wake;                /* the last wake_at time asked for, INFINITY: none */
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
    struct lg_req *head;
    int64_t in_flight;
    int64_t warm_next, warm_done, warmups_ok, warmups_failed;
    int64_t main_done, main_failed;
    struct lg_record *records;
    size_t n_records, cap_records;
    /* outcome */
    int64_t not_sent;
    int interrupted;
    double duration_s;
    int pumping; /* inside pump or pump_warmup: a failed send ends its request
                  * synchronously, and must not recurse into another pump */
    int failed;  /* fatal: err is set */
    char err[LG_DRIVER_MSG];
};

/* ---- time ---- */

static double since_t0(const struct lg_driver *d)
{
    return d->ops->now(d->arg) - d->t0;
}

/* Whether a time of the measured run (seconds from its start) has come at
 * host time now. The same sum as the wake asked for, so a host that wakes the
 * driver exactly then finds it due (t0 + t - t0 may differ from t). */
static int has_come(const struct lg_driver *d, double t, double now)
{
    return d->t0 + t <= now;
}

static int duration_over(const struct lg_driver *d, double now)
{
    return d->generating && d->cfg->duration_s > 0 && has_come(d, d->cfg->duration_s, now);
}

/* ---- the heap of due arrivals ---- */

static int pend_less(const struct pend *a, const struct pend *b)
{
    return a->t < b->t || (a->t == b->t && a->index < b->index);
}

static int heap_push(struct lg_driver *d, double t, int64_t index, int fresh)
{
    if (d->heap_n == d->heap_cap) {
        size_t n = d->heap_cap ? d->heap_cap * 2 : 64;
        struct pend *h = realloc(d->heap, n * sizeof(*h));
        if (h == NULL) {
            return TANDEM_ENOMEM;
        }
        d->heap = h;
        d->heap_cap = n;
    }
    size_t i = d->heap_n++;
    d->heap[i] = (struct pend){t, index, fresh};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pend_less(&d->heap[i], &d->heap[p])) {
            break;
        }
        struct pend x = d->heap[i];
        d->heap[i] = d->heap[p];
        d->heap[p] = x;
        i = p;
    }
    return 0;
}

static struct pend heap_pop(struct lg_driver *d)
{
    struct pend top = d->heap[0];
    d->heap[0] = d->heap[--d->heap_n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < d->heap_n && pend_less(&d->heap[l], &d->heap[m])) {
            m = l;
        }
        if (l + 1 < d->heap_n && pend_less(&d->heap[l + 1], &d->heap[m])) {
            m = l + 1;
        }
        if (m == i) {
            break;
        }
        struct pend x = d->heap[i];
        d->heap[i] = d->heap[m];
        d->heap[m] = x;
        i = m;
    }
    return top;
}

/* ---- scheduling ---- */

static void fatal(struct lg_driver *d, int rc, const char *msg);
static void pump(struct lg_driver *d);

/* Schedules the next new arrival (one at a time: arrival times never
 * decrease, so the heap stays small even for unbounded runs). */
static void schedule_next_fresh(struct lg_driver *d)
{
    if (!d->generating || d->fresh_exhausted) {
        return;
    }
    if (d->units_total >= 0 && d->units_next >= d->units_total) {
        d->fresh_exhausted = 1;
        return;
    }
    int64_t unit = d->units_next;
    int64_t index = unit * d->wl.turns;
    double t;
    if (d->use_trace_times) {
        t = lg_workload_arrival(&d->wl, index);
    } else if (d->arrival_times != NULL) {
        t = d->arrival_times[unit];
    } else {
        t = lg_arrivals_next(&d->arrivals);
    }
    if (d->cfg->duration_s > 0 && t >= d->cfg->duration_s) {
        d->fresh_exhausted = 1;
        return;
    }
    if (heap_push(d, t, index, 1) != 0) {
        fatal(d, TANDEM_ENOMEM, "out of memory");
        return;
    }
    d->units_next++;
}

static void stop_generating(struct lg_driver *d)
{
    d->generating = 0;
    d->fresh_exhausted = 1;
    d->not_sent += (int64_t)d->heap_n;
    d->heap_n = 0;
}

/* Asks the host for a wake at the next arrival not yet due at host time now
 * or the end of the duration, whichever comes first (none when neither is
 * pending). */
static void set_wake(struct lg_driver *d, double now)
{
    double t = INFINITY;
    if (d->heap_n > 0 && !has_come(d, d->heap[0].t, now)) {
        t = d->heap[0].t;
    }
    if (d->generating && d->cfg->duration_s > 0 && d->cfg->duration_s < t) {
        t = d->cfg->duration_s;
    }
    t = isinf(t) ? INFINITY : d->t0 + t;
    if (t != d->wake) {
        d->wake = t;
        d->ops->wake_at(d->arg, t);
    }
}

/* ---- records ---- */

static int new_record(struct lg_driver *d, size_t *slot)
{
    if (d->n_records == d->cap_records) {
        size_t n = d->cap_records ? d->cap_records * 2 : 1024;
        struct lg_record *p = realloc(d->records, n * sizeof(*p));
        if (p == NULL) {
            return TANDEM_ENOMEM;
        }
        d->records = p;
        d->cap_records = n;
    }
    *slot = d->n_records++;
    memset(&d->records[*slot], 0, sizeof(struct lg_record));
    return 0;
}

static void set_error(struct lg_record *rec, const char *msg)
{
    free(rec->error);
    rec->error = msg ? strdup(msg) : NULL;
}

/* ---- one request ---- */

static struct lg_req *req_new(struct lg_driver *d, enum kind kind)
{
    void *p = NULL; /* on a cache line: its head is what each token touches */
    if (posix_memalign(&p, 64, sizeof(struct lg_req)) != 0) {
        return NULL;
    }
    struct lg_req *q = memset(p, 0, sizeof(*q));
    q->d = d;
    q->kind = kind;
    q->prompt_tokens = q->completion_tokens = q->cached_tokens = -1;
    q->session = -1;
    return q;
}

static void req_free(struct lg_req *q)
{
    free(q->itl);
    free(q->body);
    free(q->text);
    free(q);
}

static void list_add(struct lg_driver *d, struct lg_req *q)
{
    q->next = d->head;
    if (q->next != NULL) {
        q->next->prev = q;
    }
    d->head = q;
    d->in_flight++;
}

static void list_remove(struct lg_driver *d, struct lg_req *q)
{
    if (q->prev != NULL) {
        q->prev->next = q->next;
    } else {
        d->head = q->next;
    }
    if (q->next != NULL) {
        q->next->prev = q->prev;
    }
    q->prev = q->next = NULL;
    d->in_flight--;
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

static int req_fail(struct lg_req *q, enum lg_fail reason, int rc, const char *fmt, const char *arg)
{
    q->fail = reason;
    snprintf(q->fail_msg, sizeof(q->fail_msg), fmt, arg);
    return rc;
}

/* A token chunk arrived at time t. */
static int on_token(struct lg_req *q, double t)
{
    if (q->n_chunks == 0) {
        q->t_first = t;
    } else {
        if (q->n_itl == q->cap_itl) {
            uint32_t n = q->cap_itl ? q->cap_itl * 2 : 64;
            double *p = realloc(q->itl, n * sizeof(double));
            if (p == NULL) {
                return TANDEM_ENOMEM;
            }
            q->itl = p;
            q->cap_itl = n;
        }
        q->itl[q->n_itl++] = t - q->t_last;
    }
    q->t_last = t;
    q->n_chunks++;
    return 0;
}

/* Applies one parsed chunk (streamed, or a whole JSON response). */
static int apply_chunk(struct lg_req *q, const struct lg_chunk *c, double t)
{
    if (c->is_error) {
        return req_fail(q, LG_FAIL_STREAM_ERROR, TANDEM_EPROTO, "%s", c->error);
    }
    if (c->has_usage) {
        if (c->prompt_tokens >= 0) {
            q->prompt_tokens = c->prompt_tokens;
        }
        if (c->completion_tokens >= 0) {
            q->completion_tokens = c->completion_tokens;
        }
        if (c->cached_tokens >= 0) {
            q->cached_tokens = c->cached_tokens;
        }
    }
    if (c->is_token) {
        if (on_token(q, t) != 0 || (q->keep_text && c->text_len > 0 &&
                                    append(&q->text, &q->text_len, &q->text_cap, c->text,
                                           c->text_len, JSON_BODY_MAX) != 0)) {
            return req_fail(q, LG_FAIL_CLIENT, TANDEM_ENOMEM, "%s", "out of memory");
        }
    }
    return 0;
}

void lg_driver_set_host(struct lg_req *q, void *host)
{
    q->host = host;
}

void *lg_driver_host(const struct lg_req *q)
{
    return q->host;
}

int lg_driver_status(struct lg_req *q, int status, const char *content_type)
{
    q->status = status;
    if (status != 200) {
        q->mode = MODE_ERROR;
    } else if (strncasecmp(content_type, "text/event-stream", 17) == 0) {
        q->mode = MODE_SSE;
    } else {
        q->mode = MODE_JSON;
    }
    return q->mode == MODE_SSE;
}

int lg_driver_event(struct lg_req *q, const char *name, const char *data, size_t len)
{
    double t = q->d->ops->now(q->d->arg);
    if (strcmp(name, "error") == 0) {
        return req_fail(q, LG_FAIL_STREAM_ERROR, TANDEM_EPROTO, "error event: %.200s", data);
    }
    if (strcmp(name, "message") != 0) {
        return 0;
    }
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        q->done_marker = 1;
        return 0;
    }
    struct lg_chunk c;
    if (lg_openai_parse_chunk(q->d->cfg->workload.api, data, len, &c) != 0) {
        return req_fail(q, LG_FAIL_BAD_STREAM, TANDEM_EPROTO, "malformed SSE data: %.200s",
                        c.error);
    }
    int rc = apply_chunk(q, &c, t);
    lg_chunk_clear(&c);
    return rc;
}

int lg_driver_chunk(struct lg_req *q, const struct lg_chunk *c)
{
    return apply_chunk(q, c, q->d->ops->now(q->d->arg));
}

void lg_driver_prefetch(const struct lg_req *q)
{
    if (q->itl != NULL) {
        __builtin_prefetch(q->itl + q->n_itl);
    }
}

int lg_driver_body(struct lg_req *q, const char *data, size_t len)
{
    switch (q->mode) {
    case MODE_JSON:
        if (q->body_len + len > JSON_BODY_MAX) {
            q->fail = LG_FAIL_BAD_STREAM;
            snprintf(q->fail_msg, sizeof(q->fail_msg), "response body over %u bytes",
                     JSON_BODY_MAX);
            return TANDEM_ETOOBIG;
        }
        if (append(&q->body, &q->body_len, &q->body_cap, data, len, JSON_BODY_MAX) != 0) {
            return req_fail(q, LG_FAIL_CLIENT, TANDEM_ENOMEM, "%s", "out of memory");
        }
        return 0;
    case MODE_ERROR:
        if (q->body_len < ERROR_BODY_MAX) {
            append(&q->body, &q->body_len, &q->body_cap, data, len, ERROR_BODY_MAX);
        }
        return 0;
    case MODE_SSE:
    case MODE_NONE:
        return 0;
    }
    return 0;
}

/* The response is complete: read what is buffered and decide ok or failed. */
static void conclude(struct lg_req *q)
{
    if (q->mode == MODE_JSON) {
        struct lg_chunk c;
        if (lg_openai_parse_chunk(q->d->cfg->workload.api, q->body ? q->body : "", q->body_len,
                                  &c) != 0) {
            req_fail(q, LG_FAIL_BAD_STREAM, 0, "malformed JSON response: %.200s", c.error);
        } else {
            apply_chunk(q, &c, q->d->ops->now(q->d->arg));
            lg_chunk_clear(&c);
        }
    } else if (q->mode == MODE_ERROR) {
        char m[200];
        lg_openai_error_message(q->body ? q->body : "", q->body_len, m, sizeof(m));
        q->fail = LG_FAIL_HTTP;
        snprintf(q->fail_msg, sizeof(q->fail_msg), "HTTP %d: %s", q->status, m);
    }
    if (q->fail == LG_FAIL_NONE && q->n_chunks == 0) {
        req_fail(q, LG_FAIL_NO_TOKENS, 0, "%s", "the response ended without a token");
    }
}

static void fill_record(struct lg_driver *d, struct lg_req *q)
{
    struct lg_record *rec = &d->records[q->slot];
    rec->ok = q->fail == LG_FAIL_NONE;
    rec->reason = q->fail;
    rec->http_status = q->status;
    rec->done_marker = (uint8_t)q->done_marker;
    if (!rec->ok) {
        set_error(rec, q->fail_msg);
    }
    rec->n_chunks = q->n_chunks;
    if (q->n_chunks > 0) {
        rec->ttft_s = q->t_first - q->t_start;
        rec->e2el_s = q->t_last - q->t_start;
    }
    rec->itl_s = q->itl;
    rec->n_itl = q->n_itl;
    q->itl = NULL;
    rec->usage_prompt = q->prompt_tokens >= 0;
    rec->prompt_tokens = q->prompt_tokens >= 0 ? q->prompt_tokens : rec->target_prompt_len;
    rec->usage_output = q->completion_tokens >= 0;
    rec->output_tokens = q->completion_tokens >= 0 ? q->completion_tokens : (int64_t)q->n_chunks;
    rec->cached_tokens = q->cached_tokens;
    d->main_done++;
    if (!rec->ok) {
        d->main_failed++;
    }
}

/* Multi-turn: hand the reply to the workload and schedule the next turn. */
static void next_turn(struct lg_driver *d, struct lg_req *q, int ok)
{
    if (d->wl.turns <= 1 || q->kind != KIND_MAIN) {
        return;
    }
    struct lg_prompt p;
    memset(&p, 0, sizeof(p));
    p.index = q->index;
    p.session = q->session;
    p.turn = q->turn;
    lg_workload_turn_done(&d->wl, &p, ok ? q->text : NULL, ok ? q->text_len : 0);
    int64_t next = q->index + 1;
    if (!d->generating || q->turn + 1 >= d->wl.turns ||
        (d->requests_cap >= 0 && next >= d->requests_cap)) {
        return;
    }
    double t = since_t0(d) + d->cfg->think_time_s;
    if (d->cfg->duration_s > 0 && t >= d->cfg->duration_s) {
        return;
    }
    if (heap_push(d, t, next, 0) != 0) {
        fatal(d, TANDEM_ENOMEM, "out of memory");
    }
}

static void start_main(struct lg_driver *d);
static void pump_warmup(struct lg_driver *d);

void lg_driver_done(struct lg_req *q, int err, enum lg_fail reason, const char *msg)
{
    struct lg_driver *d = q->d;
    list_remove(d, q);
    if (err == 0) {
        conclude(q);
    } else if (q->fail == LG_FAIL_NONE || reason == LG_FAIL_TIMEOUT ||
               reason == LG_FAIL_CANCELLED) {
        q->fail = reason == LG_FAIL_NONE ? LG_FAIL_CLIENT : reason;
        snprintf(q->fail_msg, sizeof(q->fail_msg), "%s", msg ? msg : tandem_strerror(err));
    }
    int ok = q->fail == LG_FAIL_NONE;
    if (q->kind == KIND_WARMUP) {
        d->warm_done++;
        if (ok) {
            d->warmups_ok++;
        } else {
            d->warmups_failed++;
            if (d->warmups_failed <= 3) {
                LOG_WARN("bench", "warm-up request failed: %s", q->fail_msg);
            }
        }
        req_free(q);
        pump_warmup(d);
        return;
    }
    fill_record(d, q);
    next_turn(d, q, ok);
    req_free(q);
    pump(d);
}

/* Sends q's request; on failure to send, ends it at once. */
static void send_request(struct lg_driver *d, struct lg_req *q, const char *body, size_t len)
{
    q->t_start = d->ops->now(d->arg);
    list_add(d, q);
    int rc = d->ops->send(d->arg, q, d->cfg->path, body, len, d->cfg->request_timeout_s);
    if (rc != 0) {
        /* Not sent: end it like a failed request (no report will come). */
        lg_driver_done(q, rc, rc == TANDEM_ECANCELLED ? LG_FAIL_CANCELLED : LG_FAIL_CONNECT,
                       d->ops->send_error ? d->ops->send_error(d->arg) : NULL);
    }
}

/* Starts request index's record (measured requests). */
static int begin_record(struct lg_driver *d, struct lg_req *q, double arrival)
{
    if (new_record(d, &q->slot) != 0) {
        return TANDEM_ENOMEM;
    }
    struct lg_record *rec = &d->records[q->slot];
    rec->index = q->index;
    rec->session = -1;
    rec->arrival_s = arrival;
    rec->start_s = since_t0(d);
    rec->cached_tokens = -1;
    return 0;
}

/* Makes and sends request index (measured or warm-up). */
static void dispatch(struct lg_driver *d, int64_t index, double arrival, enum kind kind)
{
    struct lg_req *q = req_new(d, kind);
    if (q == NULL) {
        fatal(d, TANDEM_ENOMEM, "out of memory");
        return;
    }
    q->index = index;
    if (kind == KIND_MAIN && begin_record(d, q, arrival) != 0) {
        req_free(q);
        fatal(d, TANDEM_ENOMEM, "out of memory");
        return;
    }
    struct lg_prompt p;
    int rc = lg_workload_make(&d->wl, index, kind == KIND_WARMUP, &p);
    char *body = NULL;
    size_t len = 0;
    if (rc == 0) {
        body = lg_openai_body(&d->api, &p, &len);
        if (body == NULL) {
            rc = TANDEM_ENOMEM;
        }
    }
    if (rc != 0) {
        lg_prompt_free(&p);
        snprintf(q->fail_msg, sizeof(q->fail_msg), "cannot make request %lld: %s", (long long)index,
                 tandem_strerror(rc));
        q->fail = LG_FAIL_CLIENT;
        /* Account for it like any finished request. */
        list_add(d, q);
        lg_driver_done(q, rc, LG_FAIL_CLIENT, q->fail_msg);
        return;
    }
    q->session = p.session;
    q->turn = p.turn;
    q->keep_text =
        d->wl.turns > 1 && kind == KIND_MAIN && d->cfg->workload.mt_history == LG_HISTORY_RESPONSE;
    if (kind == KIND_MAIN) {
        struct lg_record *rec = &d->records[q->slot];
        rec->session = p.session;
        rec->turn = p.turn;
        rec->target_prompt_len = p.prompt_len;
        rec->target_output_len = p.output_len;
    }
    lg_prompt_free(&p);
    send_request(d, q, body, len);
    free(body);
}

/* ---- phases ---- */

static void end_run(struct lg_driver *d)
{
    d->phase = PHASE_DONE;
    d->ops->ended(d->arg);
}

/* Ends the run once nothing is in flight and, unless it failed, nothing is
 * left to send. */
static void check_end(struct lg_driver *d)
{
    if (d->phase == PHASE_DONE || d->in_flight > 0) {
        return;
    }
    if (d->failed) {
        end_run(d);
    } else if (d->phase == PHASE_MAIN && d->heap_n == 0 && (d->fresh_exhausted || !d->generating)) {
        d->duration_s = since_t0(d);
        end_run(d);
    }
}

/* Cancels every request in flight; the host may end each from inside
 * cancel (which unlinks it) or later. */
static void cancel_all(struct lg_driver *d)
{
    for (;;) {
        struct lg_req *q = d->head;
        while (q != NULL && q->cancelled) {
            q = q->next;
        }
        if (q == NULL) {
            return;
        }
        q->cancelled = 1;
        d->ops->cancel(d->arg, q);
    }
}

static void pump(struct lg_driver *d)
{
    if (d->phase != PHASE_MAIN || d->pumping) {
        return;
    }
    d->pumping = 1;
    double now = d->ops->now(d->arg);
    if (duration_over(d, now)) {
        stop_generating(d);
    }
    int max = d->cfg->max_concurrency;
    while (d->heap_n > 0 && d->phase == PHASE_MAIN && !d->failed) {
        if (duration_over(d, now)) {
            stop_generating(d);
            break;
        }
        if (!has_come(d, d->heap[0].t, now) || (max > 0 && d->in_flight >= max)) {
            break;
        }
        struct pend p = heap_pop(d);
        if (p.fresh) {
            schedule_next_fresh(d);
        }
        dispatch(d, p.index, p.t, KIND_MAIN);
        now = d->ops->now(d->arg);
    }
    d->pumping = 0;
    check_end(d);
    if (d->phase == PHASE_MAIN) {
        set_wake(d, now);
    }
}

static void start_main(struct lg_driver *d)
{
    d->phase = PHASE_MAIN;
    d->shown = LG_DRIVER_RUN;
    d->t0 = d->ops->now(d->arg);
    d->generating = 1;
    schedule_next_fresh(d);
    pump(d);
}

static void pump_warmup(struct lg_driver *d)
{
    if (d->phase != PHASE_WARMUP || d->pumping) {
        return;
    }
    d->pumping = 1;
    int max = d->cfg->max_concurrency;
    while (d->warm_next < d->cfg->num_warmups && (max <= 0 || d->in_flight < max) &&
           d->phase == PHASE_WARMUP && !d->failed) {
        int64_t i = d->warm_next++;
        dispatch(d, i * d->wl.turns, 0, KIND_WARMUP);
    }
    d->pumping = 0;
    if (d->failed) {
        check_end(d);
    } else if (d->phase == PHASE_WARMUP && d->warm_done >= d->cfg->num_warmups &&
               d->in_flight == 0) {
        start_main(d);
    }
}

/* A fatal error: stop sending, cancel what is in flight, end the run once
 * it has all ended; lg_driver_finish returns rc. */
static void fatal(struct lg_driver *d, int rc, const char *msg)
{
    if (d->failed || d->phase == PHASE_DONE) {
        return;
    }
    d->failed = rc;
    snprintf(d->err, sizeof(d->err), "%s", msg);
    stop_generating(d);
    cancel_all(d);
    check_end(d);
}

void lg_driver_start(struct lg_driver *d, const char *model)
{
    snprintf(d->model, sizeof(d->model), "%s", model);
    d->api.model = d->model;
    d->phase = PHASE_WARMUP;
    d->shown = LG_DRIVER_WARMUP;
    pump_warmup(d);
}

void lg_driver_wake(struct lg_driver *d)
{
    d->wake = INFINITY; /* the host's wake is spent */
    pump(d);
}

void lg_driver_interrupt(struct lg_driver *d)
{
    if (d->phase == PHASE_DONE) {
        return;
    }
    d->interrupted = 1;
    if (d->phase != PHASE_MAIN) {
        fatal(d, TANDEM_ECANCELLED, "interrupted");
        return;
    }
    stop_generating(d);
    cancel_all(d);
    check_end(d);
    if (d->phase == PHASE_MAIN) {
        set_wake(d, d->ops->now(d->arg));
    }
}

void lg_driver_stats(const struct lg_driver *d, struct lg_driver_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->phase = d->shown;
    out->in_flight = d->in_flight;
    out->t_start = d->t0;
    if (d->shown == LG_DRIVER_WARMUP) {
        out->done = d->warm_done;
        out->failed = d->warmups_failed;
        out->total = d->cfg->num_warmups;
    } else if (d->shown == LG_DRIVER_RUN) {
        out->done = d->main_done;
        out->failed = d->main_failed;
        out->total = d->requests_cap;
    }
}

/* ---- create, finish, destroy ---- */

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

/* How many requests and arrivals, and the arrival times when precomputed. */
static int plan_arrivals(struct lg_driver *d, char *err, size_t errlen)
{
    const struct lg_run_config *cfg = d->cfg;
    d->requests_cap = cfg->num_prompts;
    if (d->wl.count >= 0 && (d->requests_cap < 0 || d->requests_cap > d->wl.count)) {
        d->requests_cap = d->wl.count;
    }
    if (d->requests_cap < 0 && !(cfg->duration_s > 0)) {
        snprintf(err, errlen, "an unbounded run needs --duration");
        return TANDEM_EINVAL;
    }
    int64_t turns = d->wl.turns;
    d->units_total = d->requests_cap < 0 ? -1 : (d->requests_cap + turns - 1) / turns;
    d->use_trace_times = cfg->trace_timestamps && lg_workload_arrival(&d->wl, 0) >= 0;
    if (lg_arrivals_init(&d->arrivals, cfg->request_rate, cfg->burstiness, cfg->workload.seed) !=
        0) {
        snprintf(err, errlen, "bad --request-rate or --burstiness");
        return TANDEM_EINVAL;
    }
    if (!d->use_trace_times && d->units_total > 0 && isfinite(cfg->request_rate)) {
        d->arrival_times = malloc((size_t)d->units_total * sizeof(double));
        if (d->arrival_times == NULL) {
            snprintf(err, errlen, "out of memory");
            return TANDEM_ENOMEM;
        }
        /* A duration cuts the arrivals short: the rescaling (which assumes
         * every one is sent) would then change the rate, so it is off. */
        lg_arrivals_fill(cfg->request_rate, cfg->burstiness, cfg->workload.seed,
                         cfg->normalize_arrivals && !(cfg->duration_s > 0), (size_t)d->units_total,
                         d->arrival_times);
    }
    return 0;
}

int lg_driver_create(struct lg_driver **out, const struct lg_run_config *cfg,
                     const struct lg_driver_ops *ops, void *arg, char *err, size_t errlen)
{
    *out = NULL;
    int rc = validate(cfg, err, errlen);
    if (rc != 0) {
        return rc;
    }
    struct lg_driver *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        snprintf(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    d->cfg = cfg;
    d->ops = ops;
    d->arg = arg;
    d->wake = INFINITY;
    rc = lg_workload_init(&d->wl, &cfg->workload, err, errlen);
    if (rc != 0) {
        free(d);
        return rc;
    }
    rc = plan_arrivals(d, err, errlen);
    if (rc != 0) {
        lg_driver_destroy(d);
        return rc;
    }
    d->api.api = cfg->workload.api;
    d->api.ignore_eos = cfg->ignore_eos;
    d->api.temperature = cfg->temperature;
    d->api.extra_body = cfg->extra_body;
    d->api.model = d->model;
    *out = d;
    return 0;
}

static int cmp_record(const void *a, const void *b)
{
    const struct lg_record *x = a, *y = b;
    return (x->index > y->index) - (x->index < y->index);
}

int lg_driver_finish(struct lg_driver *d, struct lg_run_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->trace_count = -1;
    if (d->failed) {
        snprintf(err, errlen, "%s", d->err);
        return d->failed;
    }
    if (d->cfg->workload.dataset == LG_DATASET_TRACE) {
        out->trace_count = d->wl.count;
    }
    qsort(d->records, d->n_records, sizeof(*d->records), cmp_record);
    out->records = d->records;
    out->n = d->n_records;
    d->records = NULL;
    d->n_records = d->cap_records = 0;
    out->duration_s = d->duration_s;
    snprintf(out->model, sizeof(out->model), "%s", d->model);
    out->warmups_ok = d->warmups_ok;
    out->warmups_failed = d->warmups_failed;
    out->not_sent = d->not_sent;
    out->interrupted = d->interrupted;
    return 0;
}

void lg_driver_destroy(struct lg_driver *d)
{
    if (d == NULL) {
        return;
    }
    while (d->head != NULL) {
        struct lg_req *q = d->head;
        d->head = q->next;
        req_free(q);
    }
    for (size_t i = 0; i < d->n_records; i++) {
        lg_record_clear(&d->records[i]);
    }
    free(d->records);
    free(d->heap);
    free(d->arrival_times);
    lg_workload_fini(&d->wl);
    free(d);
}
