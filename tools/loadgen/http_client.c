#include "http_client.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <http_parser.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tandem_err.h"

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define READ_BUF 65536

enum conn_state { CONN_CONNECTING, CONN_ACTIVE, CONN_IDLE, CONN_CLOSING };

struct lg_http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_connect_t connect_req;
    uv_write_t write_req;
    http_parser parser;
    struct lg_http_client *client;
    struct lg_http_call *call;
    struct lg_http_conn *idle_next;
    struct lg_http_conn *prev, *next; /* client->all */
    enum conn_state state;
    int open_handles;
    int writing;
    int reused;    /* the current call was sent on a connection used before */
    int got_bytes; /* response bytes seen for the current call */
    int complete;  /* the current response ended */
    int cb_err;    /* on_headers/on_body failed */
    enum lg_fail cb_reason;
    char cb_msg[256];
    /* header parsing: only Content-Type is kept */
    char field[32];
    size_t field_len;
    int field_overflow;
    int in_value;
    int value_is_ctype;
    char ctype[128];
    size_t ctype_len;
};

/* ---- connection bookkeeping ---- */

static void conn_handle_closed(uv_handle_t *h)
{
    struct lg_http_conn *conn = h->data;
    if (--conn->open_handles > 0) {
        return;
    }
    struct lg_http_client *c = conn->client;
    if (conn->prev != NULL) {
        conn->prev->next = conn->next;
    } else {
        c->all = conn->next;
    }
    if (conn->next != NULL) {
        conn->next->prev = conn->prev;
    }
    c->stats.open--;
    free(conn);
    if (c->closing && c->all == NULL) {
        free(c->rbuf);
        c->rbuf = NULL;
        if (c->close_cb != NULL) {
            void (*cb)(struct lg_http_client *) = c->close_cb;
            c->close_cb = NULL;
            cb(c);
        }
    }
}

static void idle_remove(struct lg_http_conn *conn)
{
    struct lg_http_client *c = conn->client;
    for (struct lg_http_conn **p = &c->idle; *p != NULL; p = &(*p)->idle_next) {
        if (*p == conn) {
            *p = conn->idle_next;
            conn->idle_next = NULL;
            c->stats.idle--;
            return;
        }
    }
}

static void conn_close(struct lg_http_conn *conn)
{
    if (conn->state == CONN_CLOSING) {
        return;
    }
    if (conn->state == CONN_IDLE) {
        idle_remove(conn);
    }
    conn->state = CONN_CLOSING;
    uv_timer_stop(&conn->timer);
    uv_close((uv_handle_t *)&conn->timer, conn_handle_closed);
    uv_close((uv_handle_t *)&conn->tcp, conn_handle_closed);
}

static void call_free_buf(struct lg_http_call *call)
{
    free(call->wbuf);
    call->wbuf = NULL;
    call->wlen = 0;
}

static int conn_start(struct lg_http_client *c, struct lg_http_call *call);

/* Detaches the call, closes the connection and ends the call with err,
 * unless it qualifies for its one retry. */
static void conn_fail(struct lg_http_conn *conn, int err, enum lg_fail reason, const char *msg)
{
    struct lg_http_call *call = conn->call;
    int retry = call != NULL && conn->reused && !conn->got_bytes && !call->retried &&
                reason != LG_FAIL_TIMEOUT && reason != LG_FAIL_CANCELLED && !conn->client->closing;
    conn->call = NULL;
    conn_close(conn);
    if (call == NULL) {
        return;
    }
    call->conn = NULL;
    if (retry) {
        call->retried = 1;
        conn->client->stats.retries++;
        if (conn_start(conn->client, call) == 0) {
            return;
        }
        msg = conn->client->last_error;
        reason = LG_FAIL_CONNECT;
        err = TANDEM_EIO;
    }
    call_free_buf(call);
    call->ops->on_done(call, err, reason, msg);
}

static void conn_finish(struct lg_http_conn *conn, int clean)
{
    struct lg_http_call *call = conn->call;
    struct lg_http_client *c = conn->client;
    conn->call = NULL;
    call->conn = NULL;
    uv_timer_stop(&conn->timer);
    /* A write still pending (the server answered before reading all of the
     * request) would collide with the next request's write: close instead. */
    if (clean && !c->closing && !conn->writing && http_should_keep_alive(&conn->parser)) {
        conn->state = CONN_IDLE;
        conn->idle_next = c->idle;
        c->idle = conn;
        c->stats.idle++;
    } else {
        conn_close(conn);
    }
    call_free_buf(call);
    call->ops->on_done(call, 0, LG_FAIL_NONE, NULL);
}

/* ---- http-parser callbacks ---- */

static int on_message_begin(http_parser *p)
{
    struct lg_http_conn *conn = p->data;
    conn->field_len = 0;
    conn->field_overflow = 0;
    conn->in_value = 0;
    conn->ctype_len = 0;
    conn->ctype[0] = '\0';
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    struct lg_http_conn *conn = p->data;
    if (conn->in_value) { /* a new field starts */
        conn->in_value = 0;
        conn->field_len = 0;
        conn->field_overflow = 0;
    }
    if (conn->field_len + len >= sizeof(conn->field)) {
        conn->field_overflow = 1;
        return 0;
    }
    memcpy(conn->field + conn->field_len, at, len);
    conn->field_len += len;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    struct lg_http_conn *conn = p->data;
    if (!conn->in_value) {
        conn->in_value = 1;
        conn->field[conn->field_len] = '\0';
        conn->value_is_ctype =
            !conn->field_overflow && strcasecmp(conn->field, "content-type") == 0;
        if (conn->value_is_ctype) {
            conn->ctype_len = 0;
        }
    }
    if (conn->value_is_ctype) {
        size_t n = sizeof(conn->ctype) - 1 - conn->ctype_len;
        n = len < n ? len : n;
        memcpy(conn->ctype + conn->ctype_len, at, n);
        conn->ctype_len += n;
        conn->ctype[conn->ctype_len] = '\0';
    }
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    struct lg_http_conn *conn = p->data;
    struct lg_http_call *call = conn->call;
    if (call == NULL) {
        return -1;
    }
    int rc = call->ops->on_headers(call, (int)p->status_code, conn->ctype, &conn->cb_reason,
                                   conn->cb_msg);
    if (rc != 0) {
        conn->cb_err = rc;
        return -1;
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct lg_http_conn *conn = p->data;
    struct lg_http_call *call = conn->call;
    if (call == NULL) {
        return -1;
    }
    int rc = call->ops->on_body(call, at, len, &conn->cb_reason, conn->cb_msg);
    if (rc != 0) {
        conn->cb_err = rc;
        return -1;
    }
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct lg_http_conn *conn = p->data;
    conn->complete = 1;
    http_parser_pause(p, 1); /* stop here: the call ends after execute returns */
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- libuv callbacks ---- */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct lg_http_conn *conn = h->data;
    struct lg_http_client *c = conn->client;
    if (c->rbuf == NULL) {
        c->rbuf = malloc(READ_BUF);
    }
    *buf = uv_buf_init(c->rbuf, c->rbuf ? READ_BUF : 0);
}

/* After http_parser_execute: end the call if the response is complete or the
 * parser (or a callback) failed. */
static void after_parse(struct lg_http_conn *conn, size_t parsed, size_t len)
{
    char msg[256];
    if (conn->cb_err) {
        conn->cb_err = 0;
        conn_fail(conn, TANDEM_EPROTO, conn->cb_reason, conn->cb_msg);
        return;
    }
    if (conn->complete) {
        /* Bytes past the response (we never pipeline) make the connection
         * unusable. */
        conn_finish(conn, parsed + 1 >= len);
        return;
    }
    enum http_errno e = HTTP_PARSER_ERRNO(&conn->parser);
    if (e != HPE_OK) {
        snprintf(msg, sizeof(msg), "malformed HTTP response: %s", http_errno_description(e));
        conn_fail(conn, TANDEM_EPROTO, LG_FAIL_BAD_HTTP, msg);
    }
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct lg_http_conn *conn = s->data;
    char msg[256];
    if (conn->state == CONN_CLOSING) {
        return;
    }
    if (nread > 0) {
        if (conn->call == NULL) { /* bytes on an idle connection: not ours to read */
            conn_close(conn);
            return;
        }
        conn->got_bytes = 1;
        size_t parsed =
            http_parser_execute(&conn->parser, &parser_settings, buf->base, (size_t)nread);
        /* A paused parser stops on the byte that completed the message. */
        after_parse(conn, parsed, (size_t)nread);
        return;
    }
    if (nread == 0) {
        return;
    }
    if (conn->call == NULL) {
        conn_close(conn);
        return;
    }
    if (nread == UV_EOF) {
        /* The end of a body delimited by the close, if it was one. */
        http_parser_execute(&conn->parser, &parser_settings, NULL, 0);
        if (conn->cb_err) {
            conn->cb_err = 0;
            conn_fail(conn, TANDEM_EPROTO, conn->cb_reason, conn->cb_msg);
        } else if (conn->complete) {
            conn_finish(conn, 0); /* never back to the pool: the server closed it */
        } else {
            conn_fail(conn, TANDEM_ECLOSED, LG_FAIL_CLOSED,
                      conn->got_bytes ? "connection closed before the response ended"
                                      : "connection closed before any response");
        }
        return;
    }
    snprintf(msg, sizeof(msg), "read: %s", uv_strerror((int)nread));
    conn_fail(conn, TANDEM_EIO, LG_FAIL_IO, msg);
}

static void write_cb(uv_write_t *req, int status)
{
    struct lg_http_conn *conn = req->data;
    conn->writing = 0;
    if (status < 0 && status != UV_ECANCELED && conn->state != CONN_CLOSING && conn->call != NULL) {
        char msg[256];
        snprintf(msg, sizeof(msg), "write: %s", uv_strerror(status));
        conn_fail(conn, TANDEM_EIO, LG_FAIL_IO, msg);
    }
}

/* Starts writing the call's request. Returns 0 or a libuv error (nothing
 * failed yet: the caller decides). */
static int conn_write(struct lg_http_conn *conn)
{
    struct lg_http_call *call = conn->call;
    uv_buf_t b = uv_buf_init(call->wbuf, (unsigned)call->wlen);
    conn->writing = 1;
    conn->write_req.data = conn;
    int rc = uv_write(&conn->write_req, (uv_stream_t *)&conn->tcp, &b, 1, write_cb);
    if (rc != 0) {
        conn->writing = 0;
    }
    return rc;
}

static void connect_cb(uv_connect_t *req, int status)
{
    struct lg_http_conn *conn = req->data;
    if (conn->state == CONN_CLOSING) {
        return;
    }
    char msg[256];
    if (status < 0) {
        snprintf(msg, sizeof(msg), "connect: %s", uv_strerror(status));
        conn_fail(conn, TANDEM_EIO, LG_FAIL_CONNECT, msg);
        return;
    }
    conn->state = CONN_ACTIVE;
    int rc = uv_read_start((uv_stream_t *)&conn->tcp, alloc_cb, read_cb);
    if (rc == 0) {
        rc = conn_write(conn);
    }
    if (rc != 0) {
        snprintf(msg, sizeof(msg), "write: %s", uv_strerror(rc));
        conn_fail(conn, TANDEM_EIO, LG_FAIL_IO, msg);
    }
}

static void timer_cb(uv_timer_t *t)
{
    struct lg_http_conn *conn = t->data;
    if (conn->call != NULL) {
        conn_fail(conn, TANDEM_ETIMEOUT, LG_FAIL_TIMEOUT, "request timed out");
    }
}

/* Binds call to conn: fresh parser state, the timer armed to the deadline. */
static void conn_assign(struct lg_http_conn *conn, struct lg_http_call *call)
{
    conn->call = call;
    call->conn = conn;
    conn->got_bytes = 0;
    conn->complete = 0;
    conn->cb_err = 0;
    http_parser_init(&conn->parser, HTTP_RESPONSE);
    conn->parser.data = conn;
    uint64_t now = uv_now(conn->client->loop);
    uint64_t left = call->deadline > now ? call->deadline - now : 1;
    uv_timer_start(&conn->timer, timer_cb, left, 0);
}

/* Takes an idle connection or opens one. 0, or TANDEM_EIO/TANDEM_ENOMEM with
 * the message in c->last_error (on_done not called). */
static int conn_start(struct lg_http_client *c, struct lg_http_call *call)
{
    struct lg_http_conn *conn;
    while ((conn = c->idle) != NULL) {
        c->idle = conn->idle_next;
        conn->idle_next = NULL;
        c->stats.idle--;
        conn->state = CONN_ACTIVE;
        conn_assign(conn, call);
        conn->reused = 1;
        if (conn_write(conn) == 0) {
            c->stats.connections_reused++;
            return 0;
        }
        /* A broken idle connection: drop it and try the next (never ending the
         * call from inside lg_http_send). */
        conn->call = NULL;
        call->conn = NULL;
        conn_close(conn);
    }
    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        snprintf(c->last_error, sizeof(c->last_error), "out of memory");
        return TANDEM_ENOMEM;
    }
    conn->client = c;
    int rc = uv_tcp_init(c->loop, &conn->tcp);
    if (rc != 0) {
        snprintf(c->last_error, sizeof(c->last_error), "socket: %s", uv_strerror(rc));
        free(conn);
        return TANDEM_EIO;
    }
    uv_timer_init(c->loop, &conn->timer);
    conn->tcp.data = conn;
    conn->timer.data = conn;
    conn->open_handles = 2;
    conn->state = CONN_CONNECTING;
    conn->next = c->all;
    if (c->all != NULL) {
        c->all->prev = conn;
    }
    c->all = conn;
    c->stats.open++;
    c->stats.connections_opened++;
    if (c->stats.open > c->stats.peak_open) {
        c->stats.peak_open = c->stats.open;
    }
    uv_tcp_nodelay(&conn->tcp, 1);
    conn->connect_req.data = conn;
    rc = uv_tcp_connect(&conn->connect_req, &conn->tcp, (const struct sockaddr *)&c->addr,
                        connect_cb);
    if (rc != 0) {
        snprintf(c->last_error, sizeof(c->last_error), "connect: %s", uv_strerror(rc));
        conn_close(conn);
        return TANDEM_EIO;
    }
    conn_assign(conn, call);
    conn->reused = 0;
    return 0;
}

/* ---- public ---- */

int lg_http_client_init(struct lg_http_client *c, uv_loop_t *loop, const char *host, int port,
                        const char *extra_headers, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->loop = loop;
    if (host == NULL || *host == '\0' || port < 1 || port > 65535) {
        snprintf(err, errlen, "bad host or port");
        return TANDEM_EINVAL;
    }
    if (extra_headers != NULL && strlen(extra_headers) >= sizeof(c->extra_headers)) {
        snprintf(err, errlen, "extra headers too long");
        return TANDEM_EINVAL;
    }
    snprintf(c->extra_headers, sizeof(c->extra_headers), "%s", extra_headers ? extra_headers : "");
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return TANDEM_EINVAL;
    }
    memcpy(&c->addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (strchr(host, ':') != NULL) {
        snprintf(c->host_header, sizeof(c->host_header), "[%s]:%d", host, port);
    } else {
        snprintf(c->host_header, sizeof(c->host_header), "%s:%d", host, port);
    }
    return 0;
}

int lg_http_send(struct lg_http_client *c, struct lg_http_call *call, const char *method,
                 const char *path, const char *body, size_t len)
{
    if (c->closing) {
        snprintf(c->last_error, sizeof(c->last_error), "client closing");
        return TANDEM_ECANCELLED;
    }
    call->client = c;
    call->conn = NULL;
    call->retried = 0;
    char head[2048];
    int n;
    if (body != NULL || strcmp(method, "POST") == 0) {
        n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tandem-bench\r\n"
                     "Accept: text/event-stream, application/json\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n",
                     method, path, c->host_header, len, c->extra_headers);
    } else {
        n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tandem-bench\r\n"
                     "Accept: application/json\r\n%s\r\n",
                     method, path, c->host_header, c->extra_headers);
        len = 0;
    }
    if (n < 0 || (size_t)n >= sizeof(head)) {
        snprintf(c->last_error, sizeof(c->last_error), "request path too long");
        return TANDEM_EINVAL;
    }
    call->wbuf = malloc((size_t)n + len);
    if (call->wbuf == NULL) {
        snprintf(c->last_error, sizeof(c->last_error), "out of memory");
        return TANDEM_ENOMEM;
    }
    memcpy(call->wbuf, head, (size_t)n);
    if (len > 0) {
        memcpy(call->wbuf + n, body, len);
    }
    call->wlen = (size_t)n + len;
    call->deadline = uv_now(c->loop) + (call->timeout_ms ? call->timeout_ms : 1);
    int rc = conn_start(c, call);
    if (rc != 0) {
        call_free_buf(call);
    }
    return rc;
}

void lg_http_cancel(struct lg_http_call *call)
{
    if (call->conn != NULL) {
        conn_fail(call->conn, TANDEM_ECANCELLED, LG_FAIL_CANCELLED, "cancelled");
    }
}

void lg_http_client_close(struct lg_http_client *c, void (*cb)(struct lg_http_client *c))
{
    if (c->closing) {
        return;
    }
    c->closing = 1;
    c->close_cb = cb;
    /* Cancelling may call back into the owner; walk a snapshot-safe way:
     * restart from the head after each cancellation. */
    for (;;) {
        struct lg_http_conn *conn = c->all;
        while (conn != NULL && (conn->call == NULL || conn->state == CONN_CLOSING)) {
            conn = conn->next;
        }
        if (conn == NULL) {
            break;
        }
        conn_fail(conn, TANDEM_ECANCELLED, LG_FAIL_CANCELLED, "cancelled");
    }
    for (struct lg_http_conn *conn = c->all; conn != NULL; conn = conn->next) {
        conn_close(conn);
    }
    if (c->all == NULL) {
        free(c->rbuf);
        c->rbuf = NULL;
        c->close_cb = NULL;
        if (cb != NULL) {
            cb(c);
        }
    }
}

void lg_http_client_stats(const struct lg_http_client *c, struct lg_http_client_stats *out)
{
    *out = c->stats;
}

int lg_parse_url(const char *url, char *host, size_t hostlen, int *port, char *prefix,
                 size_t prefixlen)
{
    const char *p = url;
    if (strncasecmp(p, "http://", 7) != 0) {
        return TANDEM_EINVAL;
    }
    p += 7;
    const char *hs, *he;
    if (*p == '[') {
        hs = p + 1;
        he = strchr(hs, ']');
        if (he == NULL) {
            return TANDEM_EINVAL;
        }
        p = he + 1;
    } else {
        hs = p;
        while (*p && *p != ':' && *p != '/') {
            p++;
        }
        he = p;
    }
    if (he == hs || (size_t)(he - hs) >= hostlen) {
        return TANDEM_EINVAL;
    }
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    *port = 80;
    if (*p == ':') {
        p++;
        long v = 0;
        const char *d = p;
        while (isdigit((unsigned char)*p) && v <= 65535) {
            v = v * 10 + (*p++ - '0');
        }
        if (p == d || v < 1 || v > 65535) {
            return TANDEM_EINVAL;
        }
        *port = (int)v;
    }
    if (*p != '\0' && *p != '/') {
        return TANDEM_EINVAL;
    }
    size_t plen = strlen(p);
    while (plen > 0 && p[plen - 1] == '/') {
        plen--;
    }
    if (plen >= prefixlen) {
        return TANDEM_EINVAL;
    }
    memcpy(prefix, p, plen);
    prefix[plen] = '\0';
    return 0;
}
