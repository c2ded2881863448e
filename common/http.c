/* HTTP/1.1 server on libuv with http-parser. See http.h for the contract and
 * docs/architecture.md ("HTTP server") for the design. */
#include "http.h"

#include <http_parser.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "tandem_err.h"

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define HTTP_READ_BUF    (64 * 1024)
#define HTTP_MAX_HEADERS 100
#define HTTP_NO_OFF      UINT32_MAX
/* Connections over the limit are answered 503 from a small pool; beyond it
 * they are closed at once. */
#define HTTP_MAX_REJECTING 64

struct buf {
    char *data;
    size_t len;
    size_t cap;
};

struct hdr {
    uint32_t name;  /* offset in hbuf, NUL-terminated */
    uint32_t value; /* offset in hbuf, NUL-terminated */
};

enum cb_kind { CB_NONE, CB_URL, CB_FIELD, CB_VALUE };
enum conn_state { CONN_OPEN, CONN_DRAINING, CONN_CLOSED };
enum timer_mode { TM_NONE, TM_IDLE, TM_READ, TM_LINGER };
enum body_mode { BODY_LENGTH, BODY_CHUNKED, BODY_RAW };

struct http_req {
    struct http_server *srv;
    struct http_conn *conn; /* NULL once detached (response ended or client gone) */
    struct http_req *next;  /* connection queue, then abort or free list */
    unsigned refs;
    /* Parsed request: strings live in hbuf as NUL-terminated runs, url first. */
    struct buf hbuf;
    struct hdr *hdrs; /* (hdrs_cap) */
    unsigned nhdrs, hdrs_cap;
    enum cb_kind last_cb;
    uint32_t path_off, query_off;
    struct buf body;
    unsigned char method;
    unsigned char version; /* 10 or 11 */
    unsigned headers_done : 1, keep_alive : 1, head_method : 1, expect_continue : 1,
        continue_sent : 1, dispatched : 1, resp_started : 1, resp_done : 1, streaming : 1,
        close_after : 1, aborted : 1, corked : 1;
    enum body_mode mode;
    struct buf out; /* response bytes waiting for earlier responses to end */
    http_abort_fn abort_fn;
    void *abort_arg;
};

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shutdown;
    http_parser parser;
    struct http_server *srv;
    struct http_conn *prev, *next; /* server's list */
    struct http_conn *resume_next;
    struct http_req *cur;             /* being parsed */
    struct http_req *ready;           /* parsed, to dispatch once the parser returns */
    struct http_req *q_head, *q_tail; /* parsed, response not ended, in request order */
    unsigned nqueued;
    char *pending; /* (pending_len) input not parsed yet while paused */
    size_t pending_len;
    enum conn_state state;
    enum timer_mode tmode;
    int parse_status; /* status chosen by a parser callback that stopped the parser */
    int handles_open;
    unsigned reading : 1, paused : 1, parse_dead : 1, resume_queued : 1, reject : 1;
};

struct wreq {
    uv_write_t req;
    uv_buf_t buf;
    char data[];
};

static const char *const empty_str = "";

/* uv_buf_init takes an unsigned int length; uv_buf_t itself holds a size_t. */
static uv_buf_t mkbuf(const void *base, size_t len)
{
    return (uv_buf_t){.base = (char *)base, .len = len};
}

/* ---- byte buffers ---- */

static int buf_reserve(struct buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    if (extra > SIZE_MAX / 2 - b->len)
        return TANDEM_ENOMEM;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return TANDEM_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

static int buf_append(struct buf *b, const void *p, size_t n)
{
    if (buf_reserve(b, n + 1))
        return TANDEM_ENOMEM;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static int buf_puts(struct buf *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}

static int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || buf_reserve(b, (size_t)n + 1))
        return TANDEM_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

static void buf_free(struct buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- deferred work: abort callbacks, resumes and frees run from the loop ---- */

static void on_deferred(uv_idle_t *h);

static void server_kick(struct http_server *srv)
{
    if (!srv->deferred_active && !srv->finished) {
        uv_idle_start(&srv->deferred, on_deferred);
        srv->deferred_active = 1;
    }
}

static void req_free(struct http_req *r)
{
    struct http_server *srv = r->srv;
    buf_free(&r->hbuf);
    buf_free(&r->body);
    buf_free(&r->out);
    free(r->hdrs);
    free(r);
    srv->stats.requests_live--;
}

void http_req_ref(struct http_req *req)
{
    req->refs++;
}

void http_req_unref(struct http_req *req)
{
    if (req->refs == 0) {
        LOG_ERROR("http", "request unref'd more often than ref'd");
        return;
    }
    if (--req->refs == 0) {
        req->next = req->srv->free_head;
        req->srv->free_head = req;
        server_kick(req->srv);
    }
}

static void server_maybe_finish(struct http_server *srv);
static void conn_resume(struct http_conn *c);

static void on_deferred(uv_idle_t *h)
{
    struct http_server *srv = container_of(h, struct http_server, deferred);
    for (;;) {
        if (srv->abort_head) {
            struct http_req *r = srv->abort_head;
            srv->abort_head = r->next;
            if (!srv->abort_head)
                srv->abort_tail = NULL;
            r->next = NULL;
            http_abort_fn fn = r->abort_fn;
            r->abort_fn = NULL;
            if (fn)
                fn(r, r->abort_arg);
            http_req_unref(r); /* the connection's reference */
        } else if (srv->resume_head) {
            struct http_conn *c = srv->resume_head;
            srv->resume_head = c->resume_next;
            c->resume_next = NULL;
            c->resume_queued = 0;
            conn_resume(c);
        } else if (srv->free_head) {
            struct http_req *r = srv->free_head;
            srv->free_head = r->next;
            req_free(r);
        } else {
            break;
        }
    }
    uv_idle_stop(h);
    srv->deferred_active = 0;
    server_maybe_finish(srv);
}

/* ---- connection output ---- */

static void conn_close(struct http_conn *c);
static void conn_drain(struct http_conn *c);
static void conn_update_timer(struct http_conn *c);

static void on_write(uv_write_t *w, int status)
{
    struct http_conn *c = container_of((uv_tcp_t *)w->handle, struct http_conn, tcp);
    free(container_of(w, struct wreq, req));
    if (status < 0 && status != UV_ECANCELED)
        conn_close(c);
}

/* Hands bufs to the socket in order: straight to the kernel when nothing is
 * queued, the rest copied into one uv_write. */
static int conn_write(struct http_conn *c, uv_buf_t *bufs, unsigned n)
{
    uv_stream_t *s = (uv_stream_t *)&c->tcp;
    size_t total = 0, skip = 0;
    for (unsigned i = 0; i < n; i++)
        total += bufs[i].len;
    if (total == 0)
        return 0;
    if (uv_stream_get_write_queue_size(s) == 0) {
        int rc = uv_try_write(s, bufs, n);
        if (rc >= 0) {
            if ((size_t)rc == total)
                return 0;
            skip = (size_t)rc;
        } else if (rc != UV_EAGAIN && rc != UV_ENOSYS) {
            conn_close(c);
            return TANDEM_ECLOSED;
        }
    }
    struct wreq *w = malloc(sizeof *w + (total - skip));
    if (!w) {
        conn_close(c);
        return TANDEM_ENOMEM;
    }
    size_t off = 0;
    for (unsigned i = 0; i < n; i++) {
        size_t len = bufs[i].len;
        const char *p = bufs[i].base;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        p += skip;
        len -= skip;
        skip = 0;
        memcpy(w->data + off, p, len);
        off += len;
    }
    w->buf = mkbuf(w->data, off);
    int rc = uv_write(&w->req, s, &w->buf, 1, on_write);
    if (rc < 0) {
        free(w);
        conn_close(c);
        return TANDEM_ECLOSED;
    }
    return 0;
}

/* Sends response bytes for r, or buffers them while an earlier response on
 * the connection is unfinished. */
static int req_emit(struct http_req *r, uv_buf_t *bufs, unsigned n)
{
    struct http_conn *c = r->conn;
    if (r->aborted || !c || c->state != CONN_OPEN)
        return TANDEM_ECLOSED;
    size_t unsent = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + r->out.len;
    if (unsent > c->srv->cfg.max_output_bytes) {
        LOG_WARN("http", "client not reading (%zu bytes unsent): closing", unsent);
        conn_close(c);
        return TANDEM_ECLOSED;
    }
    if (c->q_head == r && r->out.len == 0 && !r->corked)
        return conn_write(c, bufs, n);
    for (unsigned i = 0; i < n; i++) {
        if (buf_append(&r->out, bufs[i].base, bufs[i].len)) {
            conn_close(c);
            return TANDEM_ENOMEM;
        }
    }
    return 0;
}

/* Pops ended responses off the head of the queue, flushing what the next
 * ones buffered meanwhile. */
static void conn_advance(struct http_conn *c)
{
    struct http_req *r;
    while (c->state == CONN_OPEN && (r = c->q_head)) {
        if (r->out.len) {
            struct buf out = r->out;
            memset(&r->out, 0, sizeof r->out);
            uv_buf_t b = mkbuf(out.data, out.len);
            conn_write(c, &b, 1);
            buf_free(&out);
            if (c->state != CONN_OPEN)
                return;
        }
        if (!r->resp_done)
            break;
        c->q_head = r->next;
        if (!c->q_head)
            c->q_tail = NULL;
        c->nqueued--;
        r->next = NULL;
        r->conn = NULL;
        int close_after = r->close_after;
        http_req_unref(r);
        if (close_after) {
            conn_drain(c);
            return;
        }
    }
    if (c->state != CONN_OPEN)
        return;
    if (c->paused && c->nqueued < c->srv->cfg.max_pipelined && !c->resume_queued) {
        c->resume_queued = 1;
        c->resume_next = c->srv->resume_head;
        c->srv->resume_head = c;
        server_kick(c->srv);
    }
    conn_update_timer(c);
}

/* ---- response API ---- */

static int is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static int check_headers(struct http_req *r, const char *const *h)
{
    for (size_t i = 0; h && h[i]; i += 2) {
        const char *name = h[i], *value = h[i + 1];
        if (!value || !*name)
            return TANDEM_EINVAL;
        for (const char *p = name; *p; p++)
            if (!is_tchar((unsigned char)*p))
                return TANDEM_EINVAL;
        for (const char *p = value; *p; p++)
            if ((unsigned char)*p < 0x20 && *p != '\t')
                return TANDEM_EINVAL;
        if (!strcasecmp(name, "Content-Length") || !strcasecmp(name, "Transfer-Encoding") ||
            !strcasecmp(name, "Date"))
            return TANDEM_EINVAL;
        if (!strcasecmp(name, "Connection")) {
            if (strcasecmp(value, "close"))
                return TANDEM_EINVAL;
            r->close_after = 1;
        }
    }
    return 0;
}

static const char *server_date(struct http_server *srv)
{
    static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    if (now != srv->date_sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        snprintf(srv->date, sizeof srv->date, "Date: %s, %02d %s %04d %02d:%02d:%02d GMT\r\n",
                 days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900,
                 tm.tm_hour, tm.tm_min, tm.tm_sec);
        srv->date_sec = now;
    }
    return srv->date;
}

static const char *reason_phrase(int status)
{
    const char *s = http_status_str((enum http_status)status);
    return strcmp(s, "<unknown>") ? s : "Unknown";
}

/* Builds the status line and header block for r into b. */
static int req_head(struct http_req *r, int status, const char *const *builtin,
                    const char *const *headers, enum body_mode mode, size_t content_length,
                    struct buf *b)
{
    if (status < 200 || status > 599)
        return TANDEM_EINVAL;
    if (r->resp_started)
        return TANDEM_EINVAL;
    int close_after = r->close_after;
    if (check_headers(r, headers)) {
        r->close_after = close_after;
        return TANDEM_EINVAL;
    }
    if (r->aborted || !r->conn)
        return TANDEM_ECLOSED;
    if (!r->keep_alive || r->srv->closing || mode == BODY_RAW)
        r->close_after = 1;
    int rc = buf_printf(b, "HTTP/1.1 %d %s\r\n", status, reason_phrase(status));
    if (!rc && r->srv->cfg.date_header)
        rc = buf_puts(b, server_date(r->srv));
    for (int pass = 0; pass < 2 && !rc; pass++) {
        const char *const *h = pass ? headers : builtin;
        for (size_t i = 0; h && h[i] && !rc; i += 2) {
            if (!strcasecmp(h[i], "Connection"))
                continue; /* emitted below, once */
            rc = buf_printf(b, "%s: %s\r\n", h[i], h[i + 1]);
        }
    }
    if (!rc && mode == BODY_LENGTH && status != 204 && status != 304)
        rc = buf_printf(b, "Content-Length: %zu\r\n", content_length);
    if (!rc && mode == BODY_CHUNKED)
        rc = buf_puts(b, "Transfer-Encoding: chunked\r\n");
    if (!rc && r->close_after)
        rc = buf_puts(b, "Connection: close\r\n");
    else if (!rc && r->version == 10)
        rc = buf_puts(b, "Connection: keep-alive\r\n");
    if (!rc)
        rc = buf_puts(b, "\r\n");
    return rc;
}

static int req_finish(struct http_req *r)
{
    r->resp_done = 1;
    struct http_conn *c = r->conn;
    if (c && c->q_head == r)
        conn_advance(c);
    return 0;
}

int http_req_respond(struct http_req *req, int status, const char *const *headers, const void *body,
                     size_t len)
{
    struct buf head = {0};
    int rc = req_head(req, status, NULL, headers, BODY_LENGTH, len, &head);
    if (rc) {
        buf_free(&head);
        return rc;
    }
    req->resp_started = 1;
    uv_buf_t bufs[2] = {mkbuf(head.data, head.len), mkbuf(body ? body : empty_str, len)};
    int has_body = !req->head_method && status != 204 && status != 304 && len > 0;
    rc = req_emit(req, bufs, has_body ? 2 : 1);
    buf_free(&head);
    if (rc)
        return rc;
    return req_finish(req);
}

static int req_start(struct http_req *req, int status, const char *const *builtin,
                     const char *const *headers)
{
    struct buf head = {0};
    enum body_mode mode = req->version >= 11 ? BODY_CHUNKED : BODY_RAW;
    int rc = req_head(req, status, builtin, headers, mode, 0, &head);
    if (rc) {
        buf_free(&head);
        return rc;
    }
    req->resp_started = 1;
    req->streaming = 1;
    req->mode = mode;
    uv_buf_t b = mkbuf(head.data, head.len);
    rc = req_emit(req, &b, 1);
    buf_free(&head);
    return rc;
}

int http_req_start(struct http_req *req, int status, const char *const *headers)
{
    return req_start(req, status, NULL, headers);
}

int http_req_start_sse(struct http_req *req, const char *const *headers)
{
    static const char *const sse[] = {"Content-Type", "text/event-stream", "Cache-Control",
                                      "no-cache", NULL};
    return req_start(req, 200, sse, headers);
}

/* A chunk's size line, "%zx\r\n", into out (at least 19 bytes); returns its
 * length. */
static size_t chunk_size_line(char *out, size_t len)
{
    char tmp[16];
    size_t n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[len & 15];
        len >>= 4;
    } while (len);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = '\r';
    out[n + 1] = '\n';
    return n + 2;
}

int http_req_write(struct http_req *req, const void *data, size_t len)
{
    if (!req->streaming || req->resp_done)
        return TANDEM_EINVAL;
    if (req->aborted || !req->conn)
        return TANDEM_ECLOSED;
    if (len == 0 || req->head_method)
        return 0;
    if (req->mode == BODY_RAW) {
        uv_buf_t b = mkbuf(data, len);
        return req_emit(req, &b, 1);
    }
    char hex[24];
    size_t n = chunk_size_line(hex, len);
    uv_buf_t bufs[3] = {mkbuf(hex, n), mkbuf(data, len), mkbuf("\r\n", 2)};
    return req_emit(req, bufs, 3);
}

int http_req_write_sse(struct http_req *req, const char *event, const char *data, size_t len)
{
    if (!req->streaming || req->resp_done)
        return TANDEM_EINVAL;
    if (event && strpbrk(event, "\r\n"))
        return TANDEM_EINVAL;
    if (req->aborted || !req->conn)
        return TANDEM_ECLOSED;
    if (!event && len > 0 && req->mode == BODY_CHUNKED && !req->head_method &&
        !memchr(data, '\n', len) && !memchr(data, '\r', len)) {
        /* One line (every JSON chunk): the chunk's pieces as they are. */
        char hex[32];
        size_t n = chunk_size_line(hex, len + 8);
        memcpy(hex + n, "data: ", 6);
        uv_buf_t bufs[3] = {mkbuf(hex, n + 6), mkbuf(data, len), mkbuf("\n\n\r\n", 4)};
        return req_emit(req, bufs, 3);
    }
    struct buf b = {0};
    int rc = 0;
    if (event)
        rc = buf_printf(&b, "event: %s\n", event);
    size_t i = 0;
    do {
        size_t j = i;
        while (j < len && data[j] != '\r' && data[j] != '\n')
            j++;
        if (!rc)
            rc = buf_puts(&b, "data: ");
        if (!rc)
            rc = buf_append(&b, data + i, j - i);
        if (!rc)
            rc = buf_puts(&b, "\n");
        if (j < len && data[j] == '\r' && j + 1 < len && data[j + 1] == '\n')
            j++;
        i = j + 1;
    } while (i < len);
    if (!rc)
        rc = buf_puts(&b, "\n");
    if (!rc)
        rc = http_req_write(req, b.data, b.len);
    buf_free(&b);
    return rc;
}

void http_req_cork(struct http_req *req)
{
    req->corked = 1;
}

int http_req_uncork(struct http_req *req)
{
    if (!req->corked)
        return 0;
    req->corked = 0;
    struct http_conn *c = req->conn;
    if (req->aborted || !c || c->state != CONN_OPEN || c->q_head != req || req->out.len == 0)
        return 0; /* an earlier response unfinished: conn_advance sends it */
    uv_buf_t b = mkbuf(req->out.data, req->out.len);
    int rc = conn_write(c, &b, 1);
    req->out.len = 0;
    return rc;
}

int http_req_end(struct http_req *req)
{
    if (!req->streaming || req->resp_done)
        return TANDEM_EINVAL;
    if (req->aborted || !req->conn)
        return TANDEM_ECLOSED;
    if (req->mode == BODY_CHUNKED && !req->head_method) {
        uv_buf_t b = mkbuf("0\r\n\r\n", 5);
        int rc = req_emit(req, &b, 1);
        if (rc)
            return rc;
    }
    return req_finish(req);
}

size_t http_req_unsent_bytes(const struct http_req *req)
{
    if (req->aborted || !req->conn || req->conn->state == CONN_CLOSED)
        return 0;
    return uv_stream_get_write_queue_size((const uv_stream_t *)&req->conn->tcp) + req->out.len;
}

void http_req_on_abort(struct http_req *req, http_abort_fn fn, void *arg)
{
    req->abort_fn = fn;
    req->abort_arg = arg;
}

int http_req_is_aborted(const struct http_req *req)
{
    return req->aborted;
}

/* Server-generated errors use OpenAI's error shape, since that is what the
 * router's clients parse. */
static int req_respond_error(struct http_req *r, int status, const char *msg)
{
    static const char *const json[] = {"Content-Type", "application/json", NULL};
    static const char *const retry[] = {"Content-Type", "application/json", "Retry-After", "1",
                                        NULL};
    char body[256];
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":%d}}",
                     msg, status >= 500 ? "server_error" : "invalid_request_error", status);
    return http_req_respond(r, status, status == 503 ? retry : json, body, (size_t)n);
}

/* ---- request accessors ---- */

const char *http_req_method(const struct http_req *req)
{
    return http_method_str((enum http_method)req->method);
}

const char *http_req_path(const struct http_req *req)
{
    if (!req->headers_done || req->path_off == HTTP_NO_OFF)
        return "/";
    return req->hbuf.data + req->path_off;
}

const char *http_req_query(const struct http_req *req)
{
    if (!req->headers_done || req->query_off == HTTP_NO_OFF)
        return empty_str;
    return req->hbuf.data + req->query_off;
}

const char *http_req_header(const struct http_req *req, const char *name)
{
    if (!req->headers_done)
        return NULL;
    for (unsigned i = 0; i < req->nhdrs; i++)
        if (!strcasecmp(req->hbuf.data + req->hdrs[i].name, name))
            return req->hbuf.data + req->hdrs[i].value;
    return NULL;
}

size_t http_req_header_count(const struct http_req *req)
{
    return req->headers_done ? req->nhdrs : 0;
}

int http_req_header_at(const struct http_req *req, size_t i, const char **name, const char **value)
{
    if (!req->headers_done || i >= req->nhdrs)
        return TANDEM_ERANGE;
    *name = req->hbuf.data + req->hdrs[i].name;
    *value = req->hbuf.data + req->hdrs[i].value;
    return 0;
}

const char *http_req_body(const struct http_req *req, size_t *len)
{
    if (len)
        *len = req->body.len;
    return req->body.data ? req->body.data : empty_str;
}

int http_req_version(const struct http_req *req)
{
    return req->version;
}

struct http_server *http_req_server(const struct http_req *req)
{
    return req->srv;
}

/* ---- parsing ---- */

static struct http_req *req_new(struct http_conn *c)
{
    struct http_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->srv = c->srv;
    r->conn = c;
    r->refs = 1; /* the connection's */
    r->version = 11;
    r->keep_alive = 1;
    r->path_off = r->query_off = HTTP_NO_OFF;
    c->srv->stats.requests_live++;
    return r;
}

static void conn_enqueue(struct http_conn *c, struct http_req *r)
{
    r->next = NULL;
    if (c->q_tail)
        c->q_tail->next = r;
    else
        c->q_head = r;
    c->q_tail = r;
    c->nqueued++;
}

static void timer_set(struct http_conn *c, enum timer_mode mode, uint64_t ms);
static void on_timer(uv_timer_t *t);

static int fail(struct http_conn *c, int status)
{
    c->parse_status = status;
    return -1;
}

static int on_message_begin(http_parser *p)
{
    struct http_conn *c = p->data;
    c->cur = req_new(c);
    if (!c->cur)
        return fail(c, 0);
    timer_set(c, TM_READ, c->srv->cfg.request_timeout_ms);
    return 0;
}

/* Appends one NUL-terminated run boundary when the kind of data changes. */
static int req_switch(struct http_req *r, enum cb_kind kind)
{
    if (r->last_cb == kind)
        return 0;
    if (r->last_cb != CB_NONE && buf_append(&r->hbuf, "", 1))
        return TANDEM_ENOMEM;
    r->last_cb = kind;
    return 0;
}

/* Would len more bytes of kind keep the header block within max_header_bytes?
 * Counts the separator req_switch adds before a new piece, so a request is
 * measured the same however TCP splits it. */
static int header_bytes_ok(struct http_conn *c, struct http_req *r, enum cb_kind kind, size_t more)
{
    size_t sep = r->last_cb != kind && r->last_cb != CB_NONE;
    return r->hbuf.len + sep + more + 4 * (size_t)r->nhdrs <= c->srv->cfg.max_header_bytes;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    if (!header_bytes_ok(c, r, CB_URL, len))
        return fail(c, 414);
    if (req_switch(r, CB_URL) || buf_append(&r->hbuf, at, len))
        return fail(c, 0);
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    if (r->headers_done)
        return 0; /* trailer fields are dropped */
    if (!header_bytes_ok(c, r, CB_FIELD, len))
        return fail(c, 431);
    if (r->last_cb != CB_FIELD) {
        if (r->nhdrs >= HTTP_MAX_HEADERS)
            return fail(c, 431);
        if (req_switch(r, CB_FIELD))
            return fail(c, 0);
        if (r->nhdrs == r->hdrs_cap) {
            unsigned cap = r->hdrs_cap ? r->hdrs_cap * 2 : 16;
            struct hdr *h = realloc(r->hdrs, cap * sizeof *h);
            if (!h)
                return fail(c, 0);
            r->hdrs = h;
            r->hdrs_cap = cap;
        }
        r->hdrs[r->nhdrs].name = (uint32_t)r->hbuf.len;
        r->hdrs[r->nhdrs].value = HTTP_NO_OFF;
        r->nhdrs++;
    }
    if (buf_append(&r->hbuf, at, len))
        return fail(c, 0);
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    if (r->headers_done)
        return 0;
    if (!header_bytes_ok(c, r, CB_VALUE, len))
        return fail(c, 431);
    if (r->last_cb != CB_VALUE) {
        if (req_switch(r, CB_VALUE))
            return fail(c, 0);
        r->hdrs[r->nhdrs - 1].value = (uint32_t)r->hbuf.len;
    }
    if (buf_append(&r->hbuf, at, len))
        return fail(c, 0);
    return 0;
}

/* Splits the request target into path and query, trims header values. */
static void req_finish_headers(struct http_req *r)
{
    char *base = r->hbuf.data;
    for (unsigned i = 0; i < r->nhdrs; i++) {
        if (r->hdrs[i].value == HTTP_NO_OFF) /* defensive: the name's NUL is "" */
            r->hdrs[i].value = r->hdrs[i].name + (uint32_t)strlen(base + r->hdrs[i].name);
        char *v = base + r->hdrs[i].value;
        size_t n = strlen(v);
        while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
            v[--n] = '\0';
    }
    char *url = base;
    char *hash = strchr(url, '#');
    if (hash)
        *hash = '\0';
    char *path = url;
    if (!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8)) {
        path = strchr(strstr(url, "://") + 3, '/');
        if (!path)
            return; /* path "/" (HTTP_NO_OFF), no query */
    }
    char *q = strchr(path, '?');
    if (q) {
        *q = '\0';
        r->query_off = (uint32_t)(q + 1 - base);
    }
    r->path_off = (uint32_t)(path - base);
}

static int on_headers_complete(http_parser *p)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    const struct http_config *cfg = &c->srv->cfg;
    if (r->last_cb != CB_NONE && buf_append(&r->hbuf, "", 1))
        return fail(c, 0);
    if (!r->hbuf.data)
        return fail(c, 400);
    req_finish_headers(r);
    r->headers_done = 1;
    r->method = (unsigned char)p->method;
    /* http-parser takes any digit (and "GET /" as 0.9): only 1.x is HTTP/1.1's
     * syntax, and a later 1.x minor is served as 1.1 (RFC 9110 2.5). */
    if (p->http_major != 1)
        return fail(c, 505);
    r->version = p->http_minor == 0 ? 10 : 11;
    r->keep_alive = http_should_keep_alive(p) ? 1 : 0;
    r->head_method = p->method == HTTP_HEAD;
    int has_body =
        (p->flags & F_CHUNKED) || (p->content_length > 0 && p->content_length != ULLONG_MAX);
    if (!(p->flags & F_CHUNKED) && has_body) {
        if (p->content_length > cfg->max_body_bytes)
            return fail(c, 413);
        if (buf_reserve(&r->body, (size_t)p->content_length + 1))
            return fail(c, 0);
    }
    const char *expect = http_req_header(r, "Expect");
    r->expect_continue = has_body && expect && !strcasecmp(expect, "100-continue");
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    if (len > c->srv->cfg.max_body_bytes - r->body.len)
        return fail(c, 413);
    if (buf_append(&r->body, at, len))
        return fail(c, 0);
    return 0;
}

static int on_chunk_header(http_parser *p)
{
    struct http_conn *c = p->data;
    if (p->content_length > c->srv->cfg.max_body_bytes - c->cur->body.len)
        return fail(c, 413);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    if (buf_reserve(&r->body, 1))
        return fail(c, 0);
    if (r->body.data)
        r->body.data[r->body.len] = '\0';
    if (p->upgrade)
        r->keep_alive = 0; /* no protocol switching here: answer, then close */
    c->cur = NULL;
    conn_enqueue(c, r);
    if (!r->keep_alive)
        c->parse_dead = 1; /* nothing after a closing request is read */
    if (c->tmode == TM_READ)
        timer_set(c, TM_NONE, 0);
    c->ready = r;
    /* Return to conn_feed so the handler runs outside the parser. */
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
    .on_chunk_header = on_chunk_header,
};

/* Answers a request the server rejects itself; the connection closes after. */
static void conn_error(struct http_conn *c, int status, const char *msg)
{
    c->parse_dead = 1;
    if (c->tmode == TM_READ)
        timer_set(c, TM_NONE, 0);
    struct http_req *r = c->cur;
    c->cur = NULL;
    if (!r)
        r = req_new(c);
    if (!r || status == 0) {
        if (r)
            http_req_unref(r);
        conn_close(c);
        return;
    }
    r->keep_alive = 0;
    r->close_after = 1;
    conn_enqueue(c, r);
    c->srv->stats.errors += status != 503;
    req_respond_error(r, status, msg);
}

static void conn_parse_error(struct http_conn *c)
{
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    int status = 400;
    const char *msg = "malformed request";
    if (e == HPE_HEADER_OVERFLOW) {
        status = 431;
    } else if (e >= HPE_CB_message_begin && e <= HPE_CB_chunk_complete) {
        status = c->parse_status;
    } else if (e == HPE_INVALID_CHUNK_SIZE) {
        msg = "malformed chunked body";
    } else if (e == HPE_INVALID_TRANSFER_ENCODING) {
        status = 501;
        msg = "unsupported transfer encoding";
    }
    switch (status) {
    case 413:
        msg = "request body too large";
        break;
    case 414:
        msg = "request URI too long";
        break;
    case 431:
        msg = "request header fields too large";
        break;
    case 505:
        msg = "HTTP version not supported";
        break;
    default:
        break;
    }
    conn_error(c, status, msg);
}

static void conn_dispatch(struct http_conn *c, struct http_req *r)
{
    struct http_server *srv = c->srv;
    r->dispatched = 1;
    srv->stats.requests++;
    http_req_ref(r);
    srv->handler(r, srv->user);
    /* Nobody but the connection (and us) holds it: the handler forgot it. */
    if (!r->resp_done && !r->aborted && r->refs == 1u + (r->conn != NULL)) {
        LOG_WARN("http", "handler for %s %s kept no reference and did not answer",
                 http_req_method(r), http_req_path(r));
        if (!r->resp_started)
            req_respond_error(r, 500, "request not handled");
        else
            http_req_end(r);
    }
    http_req_unref(r);
}

static void conn_read_start(struct http_conn *c);

/* Parses data and dispatches every request completed by it. Stops (keeping
 * the rest in c->pending) when max_pipelined requests wait on the connection. */
static void conn_feed(struct http_conn *c, const char *data, size_t len)
{
    while (len > 0 && c->state == CONN_OPEN && !c->parse_dead) {
        if (c->nqueued >= c->srv->cfg.max_pipelined) {
            char *p = malloc(len);
            if (!p) {
                conn_close(c);
                return;
            }
            memcpy(p, data, len);
            c->pending = p;
            c->pending_len = len;
            c->paused = 1;
            if (c->reading) {
                uv_read_stop((uv_stream_t *)&c->tcp);
                c->reading = 0;
            }
            return;
        }
        size_t n = http_parser_execute(&c->parser, &parser_settings, data, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        data += n;
        len -= n;
        if (e == HPE_PAUSED) {
            http_parser_pause(&c->parser, 0);
            struct http_req *r = c->ready;
            c->ready = NULL;
            if (r && c->state == CONN_OPEN)
                conn_dispatch(c, r);
            continue;
        }
        if (e != HPE_OK) {
            conn_parse_error(c);
            return;
        }
        if (n == 0)
            break;
    }
    struct http_req *r = c->cur;
    if (c->state == CONN_OPEN && r && r->expect_continue && !r->continue_sent && !c->q_head) {
        /* Only when no earlier response is going, or the interim one would
         * land inside it; the client then sends its body after a delay anyway. */
        r->continue_sent = 1;
        uv_buf_t b = mkbuf("HTTP/1.1 100 Continue\r\n\r\n", 25);
        conn_write(c, &b, 1);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct http_conn *c = container_of((uv_tcp_t *)h, struct http_conn, tcp);
    struct http_server *srv = c->srv;
    if (!srv->rbuf_busy) {
        srv->rbuf_busy = 1;
        *buf = mkbuf(srv->rbuf, HTTP_READ_BUF);
        return;
    }
    char *p = malloc(HTTP_READ_BUF);
    *buf = mkbuf(p, p ? HTTP_READ_BUF : 0);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct http_conn *c = container_of((uv_tcp_t *)s, struct http_conn, tcp);
    struct http_server *srv = c->srv;
    if (nread > 0) {
        if (c->state == CONN_OPEN && !c->parse_dead)
            conn_feed(c, buf->base, (size_t)nread);
        /* else: draining or past a closing request: input is discarded */
    } else if (nread < 0) {
        /* EOF counts as the client going away, even while requests are in
         * flight: their abort callbacks cancel the work. */
        conn_close(c);
    }
    if (buf->base == srv->rbuf)
        srv->rbuf_busy = 0;
    else
        free(buf->base);
    if (c->state == CONN_OPEN)
        conn_update_timer(c);
}

static void conn_read_start(struct http_conn *c)
{
    if (c->reading)
        return;
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc < 0) {
        conn_close(c);
        return;
    }
    c->reading = 1;
}

static void conn_resume(struct http_conn *c)
{
    if (c->state != CONN_OPEN || !c->paused || c->nqueued >= c->srv->cfg.max_pipelined)
        return;
    c->paused = 0;
    char *p = c->pending;
    size_t n = c->pending_len;
    c->pending = NULL;
    c->pending_len = 0;
    if (p) {
        conn_feed(c, p, n);
        free(p);
    }
    if (c->state == CONN_OPEN && !c->paused)
        conn_read_start(c);
    if (c->state == CONN_OPEN)
        conn_update_timer(c);
}

/* ---- timers ---- */

static void timer_set(struct http_conn *c, enum timer_mode mode, uint64_t ms)
{
    c->tmode = mode;
    if (mode == TM_NONE)
        uv_timer_stop(&c->timer);
    else
        uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* A connection with nothing parsed, queued or buffered waits for the idle
 * timeout; a busy one has no read timer (the handler takes its time). */
static void conn_update_timer(struct http_conn *c)
{
    if (c->cur)
        return; /* the request timer runs from its first byte */
    if (!c->q_head && !c->paused && !c->parse_dead) {
        if (c->tmode != TM_IDLE)
            timer_set(c, TM_IDLE, c->srv->cfg.idle_timeout_ms);
    } else if (c->tmode == TM_IDLE || c->tmode == TM_READ) {
        timer_set(c, TM_NONE, 0);
    }
}

static void on_timer(uv_timer_t *t)
{
    struct http_conn *c = container_of(t, struct http_conn, timer);
    enum timer_mode mode = c->tmode;
    c->tmode = TM_NONE;
    switch (mode) {
    case TM_IDLE:
    case TM_LINGER:
        conn_close(c);
        break;
    case TM_READ:
        if (c->state == CONN_OPEN && c->cur)
            conn_error(c, 408, "request not received in time");
        break;
    case TM_NONE:
        break;
    }
}

/* ---- connection lifetime ---- */

/* Detaches every request from a connection that is going away: requests the
 * handler still answers are aborted (callback from the loop). */
static void conn_detach_all(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    struct http_req *r = c->q_head;
    c->q_head = c->q_tail = NULL;
    c->nqueued = 0;
    c->ready = NULL;
    while (r) {
        struct http_req *next = r->next;
        r->next = NULL;
        r->conn = NULL;
        buf_free(&r->out);
        if (!r->resp_done) {
            r->aborted = 1;
            if (r->dispatched)
                srv->stats.aborted++;
        }
        if (r->dispatched && !r->resp_done && r->abort_fn) {
            if (srv->abort_tail)
                srv->abort_tail->next = r;
            else
                srv->abort_head = r;
            srv->abort_tail = r;
            server_kick(srv);
        } else {
            http_req_unref(r);
        }
        r = next;
    }
    if (c->cur) {
        c->cur->conn = NULL;
        c->cur->aborted = 1;
        http_req_unref(c->cur);
        c->cur = NULL;
    }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct http_conn *c = container_of(req, struct http_conn, shutdown);
    if (c->state == CONN_CLOSED)
        return;
    if (status < 0 || c->srv->cfg.linger_ms == 0)
        conn_close(c);
    else
        timer_set(c, TM_LINGER, c->srv->cfg.linger_ms);
}

/* After a final response: send everything (within request_timeout_ms),
 * half-close, then read-and-discard until the client closes or linger_ms
 * passes, so that a client still sending gets our response, not a reset. */
static void conn_drain(struct http_conn *c)
{
    if (c->state != CONN_OPEN)
        return;
    c->state = CONN_DRAINING;
    c->parse_dead = 1;
    conn_detach_all(c);
    free(c->pending);
    c->pending = NULL;
    c->pending_len = 0;
    c->paused = 0;
    timer_set(c, TM_LINGER, c->srv->cfg.request_timeout_ms);
    conn_read_start(c);
    if (c->state != CONN_DRAINING)
        return;
    if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown) < 0)
        conn_close(c);
}

static void conn_free(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->reject)
        srv->n_rejecting--;
    else
        srv->n_conns--;
    srv->stats.connections_open--;
    free(c->pending);
    free(c);
    server_maybe_finish(srv);
}

static void on_tcp_closed(uv_handle_t *h)
{
    struct http_conn *c = container_of((uv_tcp_t *)h, struct http_conn, tcp);
    if (--c->handles_open == 0)
        conn_free(c);
}

static void on_timer_closed(uv_handle_t *h)
{
    struct http_conn *c = container_of((uv_timer_t *)h, struct http_conn, timer);
    if (--c->handles_open == 0)
        conn_free(c);
}

static void conn_close(struct http_conn *c)
{
    if (c->state == CONN_CLOSED)
        return;
    c->state = CONN_CLOSED;
    conn_detach_all(c);
    if (c->resume_queued) {
        struct http_conn **pp = &c->srv->resume_head;
        while (*pp && *pp != c)
            pp = &(*pp)->resume_next;
        if (*pp)
            *pp = c->resume_next;
        c->resume_queued = 0;
    }
    c->tmode = TM_NONE;
    uv_close((uv_handle_t *)&c->tcp, on_tcp_closed);
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

static void on_connection(uv_stream_t *ls, int status)
{
    struct http_server *srv = container_of((uv_tcp_t *)ls, struct http_server, listener);
    if (status < 0) {
        LOG_WARN("http", "accept: %s", uv_strerror(status));
        return;
    }
    struct http_conn *c = calloc(1, sizeof *c);
    if (!c) {
        LOG_ERROR("http", "accept: out of memory");
        return;
    }
    c->srv = srv;
    uv_tcp_init(srv->loop, &c->tcp);
    uv_timer_init(srv->loop, &c->timer);
    c->handles_open = 2;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->stats.connections_open++;
    srv->stats.connections_accepted++;
    c->reject = srv->n_conns >= srv->cfg.max_connections;
    if (c->reject)
        srv->n_rejecting++;
    else
        srv->n_conns++;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    int rc = uv_accept(ls, (uv_stream_t *)&c->tcp);
    if (rc < 0 || srv->closing || (c->reject && srv->n_rejecting > HTTP_MAX_REJECTING)) {
        if (c->reject)
            srv->stats.connections_rejected++;
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    conn_read_start(c);
    if (c->state != CONN_OPEN)
        return;
    if (c->reject) {
        srv->stats.connections_rejected++;
        conn_error(c, 503, "too many connections");
        return;
    }
    conn_update_timer(c);
}

/* ---- server ---- */

void http_config_default(struct http_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->max_header_bytes = 16 * 1024;
    cfg->max_body_bytes = 4u << 20;
    cfg->max_connections = 1024;
    cfg->max_pipelined = 16;
    cfg->max_output_bytes = 8u << 20;
    cfg->request_timeout_ms = 30000;
    cfg->idle_timeout_ms = 60000;
    cfg->linger_ms = 2000;
    cfg->date_header = 1;
}

int http_server_init(struct http_server *srv, uv_loop_t *loop, const struct http_config *cfg,
                     http_handler_fn handler, void *user)
{
    memset(srv, 0, sizeof *srv);
    if (cfg)
        srv->cfg = *cfg;
    else
        http_config_default(&srv->cfg);
    if (!handler || !loop || srv->cfg.max_pipelined == 0 || srv->cfg.max_connections == 0 ||
        srv->cfg.max_header_bytes == 0)
        return TANDEM_EINVAL;
    srv->rbuf = malloc(HTTP_READ_BUF);
    if (!srv->rbuf)
        return TANDEM_ENOMEM;
    srv->loop = loop;
    srv->handler = handler;
    srv->user = user;
    /* Neither can fail: uv_tcp_init with AF_UNSPEC creates no socket. */
    uv_idle_init(loop, &srv->deferred);
    uv_tcp_init(loop, &srv->listener);
    srv->listener_open = 1;
    return 0;
}

int http_server_listen(struct http_server *srv, const char *host, int port)
{
    if (srv->listening || srv->closing || port < 0 || port > 65535)
        return TANDEM_EINVAL;
    if (!host)
        host = HTTP_DEFAULT_HOST;
    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss))
        return TANDEM_EINVAL;
    int rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&ss, 0);
    if (!rc)
        rc = uv_listen((uv_stream_t *)&srv->listener, 511, on_connection);
    if (rc < 0) {
        LOG_WARN("http", "listen on %s:%d: %s", host, port, uv_strerror(rc));
        return rc == UV_EADDRINUSE ? TANDEM_EBUSY : TANDEM_EUV;
    }
    srv->listening = 1;
    return 0;
}

int http_server_port(const struct http_server *srv)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (!srv->listening || uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &len) < 0)
        return TANDEM_EINVAL;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void on_deferred_closed(uv_handle_t *h)
{
    struct http_server *srv = container_of((uv_idle_t *)h, struct http_server, deferred);
    free(srv->rbuf);
    srv->rbuf = NULL;
    if (srv->close_cb)
        srv->close_cb(srv);
}

static void server_maybe_finish(struct http_server *srv)
{
    if (!srv->closing || srv->finished || srv->listener_open || srv->conns ||
        srv->stats.requests_live || srv->abort_head || srv->free_head || srv->resume_head)
        return;
    srv->finished = 1;
    srv->deferred_active = 0;
    uv_close((uv_handle_t *)&srv->deferred, on_deferred_closed);
}

static void on_listener_closed(uv_handle_t *h)
{
    struct http_server *srv = container_of((uv_tcp_t *)h, struct http_server, listener);
    srv->listener_open = 0;
    server_maybe_finish(srv);
}

/* A connection of a server shutting down: it reads no more requests and
 * closes gracefully (conn_drain: queued bytes flushed, half-close, EOF) at
 * once when nothing is in flight, else once its last response has ended. */
static void conn_shutdown(struct http_conn *c)
{
    if (c->state != CONN_OPEN)
        return;
    c->parse_dead = 1;
    free(c->pending);
    c->pending = NULL;
    c->pending_len = 0;
    c->paused = 0;
    if (c->cur) { /* half received: never handed to the handler */
        c->cur->conn = NULL;
        c->cur->aborted = 1;
        http_req_unref(c->cur);
        c->cur = NULL;
    }
    if (c->tmode == TM_READ || c->tmode == TM_IDLE)
        timer_set(c, TM_NONE, 0);
    if (!c->q_head)
        conn_drain(c);
    else
        c->q_tail->close_after = 1; /* conn_advance drains after it */
}

void http_server_shutdown(struct http_server *srv, http_close_fn cb)
{
    if (srv->closing)
        return;
    srv->closing = 1;
    srv->graceful = 1;
    srv->close_cb = cb;
    uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
    struct http_conn *next;
    for (struct http_conn *c = srv->conns; c; c = next) {
        next = c->next;
        conn_shutdown(c);
    }
    server_maybe_finish(srv);
}

void http_server_close(struct http_server *srv, http_close_fn cb)
{
    if (srv->closing && !srv->graceful)
        return;
    if (!srv->closing) {
        srv->closing = 1;
        uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
    }
    srv->graceful = 0;
    if (cb)
        srv->close_cb = cb;
    for (struct http_conn *c = srv->conns; c; c = c->next)
        conn_close(c);
}

void http_server_get_stats(const struct http_server *srv, struct http_server_stats *out)
{
    *out = srv->stats;
}
