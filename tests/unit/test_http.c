/* HTTP server: real HTTP over loopback TCP. The server's loop runs in this
 * thread; the client is a plain non-blocking socket, and the test runs the
 * loop (UV_RUN_NOWAIT) between its sends and while it waits for bytes. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "log.h"
#include "tandem_err.h"

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* Failures print both sides. */
#define EXPECT_MEM(got, glen, want)                                                                \
    do {                                                                                           \
        const char *w_ = (want);                                                                   \
        size_t wl_ = strlen(w_), gl_ = (glen);                                                     \
        int ok_ = gl_ == wl_ && memcmp((got), w_, wl_) == 0;                                       \
        if (!ok_)                                                                                  \
            fprintf(stderr, "\n%s:%d:\n  got  (%zu) [%.*s]\n  want (%zu) [%s]\n", __FILE__,        \
                    __LINE__, gl_, (int)gl_, (const char *)(got), wl_, w_);                        \
        CU_ASSERT(ok_);                                                                            \
    } while (0)

#define EXPECT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            fprintf(stderr, "\n%s:%d: %s == %lld, want %s == %lld\n", __FILE__, __LINE__, #a, a_,  \
                    #b, b_);                                                                       \
        CU_ASSERT(a_ == b_);                                                                       \
    } while (0)

#define EXPECT_STR(got, want)                                                                      \
    do {                                                                                           \
        const char *g_ = (got);                                                                    \
        EXPECT_MEM(g_ ? g_ : "(null)", strlen(g_ ? g_ : "(null)"), want);                          \
    } while (0)

static const char *const text_plain[] = {"Content-Type", "text/plain", NULL};

#define HANG_MS 30000 /* a wait for an event longer than this is a hang */

/* ---- server under test ---- */

static uv_loop_t loop;
static struct http_server srv;
static int srv_closed;
static int port;

struct rec {
    char method[16];
    char path[256];
    char query[256];
    char xtest[256];
    char body[4096];
    size_t body_len;
    size_t nhdrs;
    int version;
};

static struct rec recs[256];
static int n_recs;      /* requests seen by the handler */
static int n_responded; /* asynchronous responses sent */
static int max_outstanding;
static int n_aborts;
static int abort_rc;
static int misuse_rcs[8];
static int flood_rc, flood_writes;
static int out_rcs[2];          /* /out: its two writes */
static size_t big_unsent;       /* /big: bytes queued in the server after the response */
static size_t corked_unsent[2]; /* /corked: bytes held after three events, after uncork */
#define BIG_BYTES (6 << 20)

struct pending {
    uv_timer_t timer;
    struct http_req *req;
    int left; /* stream ticks left; -1 for a delayed reply */
    int ms;
};

static void pending_closed(uv_handle_t *h)
{
    free(container_of((uv_timer_t *)h, struct pending, timer));
}

static void pending_done(struct pending *p)
{
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, pending_closed);
    http_req_unref(p->req);
}

static void on_abort(struct http_req *req, void *arg)
{
    struct pending *p = arg;
    n_aborts++;
    if (p->left >= 0)
        abort_rc = http_req_write(req, "x", 1);
    else
        abort_rc = http_req_respond(req, 200, NULL, "x", 1);
    pending_done(p);
}

/* Requests to /hold wait here until the test releases them (in order). */
static struct pending *held[64];
static int n_held, n_released;

static void release_held(int n)
{
    for (int i = 0; i < n && n_released < n_held; i++) {
        struct pending *p = held[n_released++];
        CU_ASSERT_EQUAL(http_req_respond(p->req, 200, text_plain, "held", 4), 0);
        pending_done(p);
    }
}

static void delay_fire(uv_timer_t *t)
{
    struct pending *p = container_of(t, struct pending, timer);
    char body[64];
    int n = snprintf(body, sizeof body, "delayed %d", p->ms);
    n_responded++;
    CU_ASSERT_EQUAL(http_req_respond(p->req, 200, text_plain, body, (size_t)n), 0);
    pending_done(p);
}

static void stream_tick(uv_timer_t *t)
{
    struct pending *p = container_of(t, struct pending, timer);
    if (p->left-- > 0) {
        http_req_write(p->req, "tick\n", 5); /* errors: the abort callback cleans up */
        return;
    }
    CU_ASSERT_EQUAL(http_req_end(p->req), 0);
    pending_done(p);
}

static int query_int(struct http_req *req, const char *key)
{
    const char *q = strstr(http_req_query(req), key);
    return q ? atoi(q + strlen(key)) : 0;
}

static struct pending *pending_new(struct http_req *req, int left, int ms)
{
    struct pending *p = calloc(1, sizeof *p);
    CU_ASSERT_FATAL(p != NULL);
    uv_timer_init(&loop, &p->timer);
    p->req = req;
    p->left = left;
    p->ms = ms;
    http_req_ref(req);
    http_req_on_abort(req, on_abort, p);
    return p;
}

static void flood(struct http_req *req)
{
    static char chunk[64 * 1024];
    memset(chunk, 'f', sizeof chunk);
    CU_ASSERT_EQUAL(http_req_start(req, 200, text_plain), 0);
    struct pending *p = pending_new(req, 0, 0);
    (void)p; /* released by the abort callback when the server gives up */
    flood_writes = 0;
    do {
        flood_rc = http_req_write(req, chunk, sizeof chunk);
        flood_writes += flood_rc == 0;
    } while (flood_rc == 0 && flood_writes < 1000);
}

static void misuse(struct http_req *req)
{
    const char *const crlf[] = {"X-Bad", "a\r\nInjected: 1", NULL};
    const char *const clen[] = {"Content-Length", "3", NULL};
    const char *const conn[] = {"Connection", "upgrade", NULL};
    const char *const badname[] = {"Bad Name", "x", NULL};
    misuse_rcs[0] = http_req_write(req, "x", 1);                     /* before start */
    misuse_rcs[1] = http_req_respond(req, 99, NULL, NULL, 0);        /* bad status */
    misuse_rcs[2] = http_req_respond(req, 200, crlf, NULL, 0);       /* header injection */
    misuse_rcs[3] = http_req_respond(req, 200, clen, NULL, 0);       /* server's header */
    misuse_rcs[4] = http_req_respond(req, 200, conn, NULL, 0);       /* Connection: other */
    misuse_rcs[5] = http_req_respond(req, 200, badname, NULL, 0);    /* bad name */
    misuse_rcs[6] = http_req_respond(req, 200, text_plain, "ok", 2); /* fine */
    misuse_rcs[7] = http_req_respond(req, 200, text_plain, "ok", 2); /* twice */
}

static void handler(struct http_req *req, void *user)
{
    const char *path = http_req_path(req);
    int outstanding = n_recs + 1 - n_responded;
    if (outstanding > max_outstanding)
        max_outstanding = outstanding;
    if (n_recs < (int)(sizeof recs / sizeof recs[0])) {
        struct rec *r = &recs[n_recs];
        memset(r, 0, sizeof *r);
        snprintf(r->method, sizeof r->method, "%s", http_req_method(req));
        snprintf(r->path, sizeof r->path, "%s", path);
        snprintf(r->query, sizeof r->query, "%s", http_req_query(req));
        const char *x = http_req_header(req, "x-TEST");
        snprintf(r->xtest, sizeof r->xtest, "%s", x ? x : "(none)");
        const char *body = http_req_body(req, &r->body_len);
        memcpy(r->body, body, r->body_len < sizeof r->body ? r->body_len : sizeof r->body);
        r->nhdrs = http_req_header_count(req);
        r->version = http_req_version(req);
    }
    n_recs++;
    if (!strcmp(path, "/hello")) {
        http_req_respond(req, 200, text_plain, "hello", 5);
    } else if (!strcmp(path, "/echo")) {
        size_t len;
        const char *body = http_req_body(req, &len);
        http_req_respond(req, 200, text_plain, body, len);
    } else if (!strcmp(path, "/hold")) {
        struct pending *p = pending_new(req, -1, 0);
        if (n_held < (int)(sizeof held / sizeof held[0]))
            held[n_held++] = p;
    } else if (!strcmp(path, "/delay")) {
        struct pending *p = pending_new(req, -1, query_int(req, "ms="));
        uv_timer_start(&p->timer, delay_fire, (uint64_t)p->ms, 0);
    } else if (!strcmp(path, "/stream")) {
        CU_ASSERT_EQUAL(http_req_start(req, 200, text_plain), 0);
        CU_ASSERT_EQUAL(http_req_write(req, "first", 5), 0);
        struct pending *p = pending_new(req, query_int(req, "n="), 0);
        uv_timer_start(&p->timer, stream_tick, 10, 10);
    } else if (!strcmp(path, "/sse")) {
        const char *const extra[] = {"X-Accel", "no", NULL};
        CU_ASSERT_EQUAL(http_req_start_sse(req, extra), 0);
        CU_ASSERT_EQUAL(http_req_write_sse(req, NULL, "{\"a\":1}", 7), 0);
        CU_ASSERT_EQUAL(http_req_write_sse(req, "ping", "line1\nline2\r\nline3", 18), 0);
        CU_ASSERT_EQUAL(http_req_write_sse(req, NULL, "[DONE]", 6), 0);
        CU_ASSERT_EQUAL(http_req_write_sse(req, "bad\nevent", "x", 1), TANDEM_EINVAL);
        CU_ASSERT_EQUAL(http_req_end(req), 0);
        CU_ASSERT_EQUAL(http_req_end(req), TANDEM_EINVAL);
        CU_ASSERT_EQUAL(http_req_write(req, "late", 4), TANDEM_EINVAL);
    } else if (!strcmp(path, "/corked")) {
        /* Three events held by the cork, sent by uncork; one more, then
         * (?end=1) corked again: http_req_end sends what is held. */
        CU_ASSERT_EQUAL(http_req_start_sse(req, NULL), 0);
        http_req_cork(req);
        CU_ASSERT_EQUAL(http_req_write_sse(req, NULL, "{\"a\":1}", 7), 0);
        CU_ASSERT_EQUAL(http_req_write_sse(req, "ping", "x\ny", 3), 0);
        CU_ASSERT_EQUAL(http_req_write_sse(req, NULL, "{\"b\":2}", 7), 0);
        corked_unsent[0] = http_req_unsent_bytes(req);
        CU_ASSERT_EQUAL(http_req_uncork(req), 0);
        corked_unsent[1] = http_req_unsent_bytes(req);
        CU_ASSERT_EQUAL(http_req_uncork(req), 0); /* not corked: nothing */
        if (query_int(req, "end=") == 1)
            http_req_cork(req);
        CU_ASSERT_EQUAL(http_req_write_sse(req, NULL, "[DONE]", 6), 0);
        CU_ASSERT_EQUAL(http_req_end(req), 0);
    } else if (!strcmp(path, "/forget")) {
        /* neither answers nor keeps a reference: the server answers 500 */
    } else if (!strcmp(path, "/out")) {
        /* n bytes in one chunk, then the end (the last chunk): out_rcs says
         * how each went. */
        static char big[65536];
        size_t n = (size_t)query_int(req, "n=");
        memset(big, 'o', sizeof big);
        CU_ASSERT_EQUAL(http_req_start(req, 200, text_plain), 0);
        out_rcs[0] = http_req_write(req, big, n < sizeof big ? n : sizeof big);
        out_rcs[1] = http_req_end(req);
    } else if (!strcmp(path, "/big")) {
        /* n bytes of 'b' in one chunk, then the end; big_unsent: what the
         * kernel did not take at once */
        size_t n = (size_t)query_int(req, "n=");
        char *b = malloc(n);
        CU_ASSERT_FATAL(b != NULL);
        memset(b, 'b', n);
        CU_ASSERT_EQUAL(http_req_start(req, 200, text_plain), 0);
        CU_ASSERT_EQUAL(http_req_write(req, b, n), 0);
        big_unsent = http_req_unsent_bytes(req);
        CU_ASSERT_EQUAL(http_req_end(req), 0);
        free(b);
    } else if (!strcmp(path, "/flood")) {
        flood(req);
    } else if (!strcmp(path, "/misuse")) {
        misuse(req);
    } else if (!strcmp(path, "/close")) {
        const char *const h[] = {"Content-Type", "text/plain", "Connection", "close", NULL};
        http_req_respond(req, 200, h, "bye", 3);
    } else {
        http_req_respond(req, 404, text_plain, "not found", 9);
    }
}

static void test_config(struct http_config *cfg)
{
    http_config_default(cfg);
    cfg->date_header = 0; /* byte-exact responses */
    cfg->linger_ms = 200;
}

static void server_start(const struct http_config *cfg)
{
    CU_ASSERT_FATAL(uv_loop_init(&loop) == 0);
    struct http_config def;
    if (!cfg) {
        test_config(&def);
        cfg = &def;
    }
    CU_ASSERT_FATAL(http_server_init(&srv, &loop, cfg, handler, NULL) == 0);
    CU_ASSERT_FATAL(http_server_listen(&srv, NULL, 0) == 0);
    port = http_server_port(&srv);
    CU_ASSERT_FATAL(port > 0);
    n_recs = n_responded = max_outstanding = n_aborts = 0;
    n_held = n_released = 0;
    abort_rc = 0;
    srv_closed = 0;
}

static void on_server_closed(struct http_server *s)
{
    CU_ASSERT_PTR_EQUAL(s, &srv);
    srv_closed = 1;
}

static void server_stop(void)
{
    http_server_close(&srv, on_server_closed);
    for (int i = 0; i < 1000 && !srv_closed; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    CU_ASSERT(srv_closed);
    uv_run(&loop, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop), 0);
}

/* ---- client ---- */

struct cli {
    int fd;
    char *buf; /* (cap) received bytes */
    size_t len, cap;
    int eof, reset;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void cli_open_rcvbuf(struct cli *c, int rcvbuf)
{
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    CU_ASSERT_FATAL(c->fd >= 0);
    if (rcvbuf)
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    /* Without it, byte-at-a-time writes wait on delayed ACKs (Nagle). */
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* Loopback connects complete in the kernel's backlog: no loop needed. */
    CU_ASSERT_FATAL(connect(c->fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    c->cap = 1 << 16;
    c->buf = malloc(c->cap);
    CU_ASSERT_FATAL(c->buf != NULL);
}

static void cli_open(struct cli *c)
{
    cli_open_rcvbuf(c, 0);
}

static void cli_close(struct cli *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
}

static void cli_recv(struct cli *c)
{
    while (!c->eof) {
        if (c->cap - c->len < 4096) {
            c->cap *= 2;
            c->buf = realloc(c->buf, c->cap);
            CU_ASSERT_FATAL(c->buf != NULL);
        }
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
        if (n > 0) {
            c->len += (size_t)n;
            c->buf[c->len] = '\0';
        } else if (n == 0) {
            c->eof = 1;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
        } else if (errno != EINTR) {
            c->eof = c->reset = 1;
        }
    }
}

/* Runs the server loop once and collects what the client received, waiting
 * at most a couple of milliseconds for either side. */
static void pump(struct cli *c)
{
    uv_run(&loop, UV_RUN_NOWAIT);
    struct pollfd fds[2] = {{.fd = uv_backend_fd(&loop), .events = POLLIN},
                            {.fd = c ? c->fd : -1, .events = POLLIN}};
    poll(fds, 2, 2);
    uv_run(&loop, UV_RUN_NOWAIT);
    if (c && c->fd >= 0)
        cli_recv(c);
}

static void pump_ms(struct cli *c, double ms)
{
    double end = now_ms() + ms;
    while (now_ms() < end)
        pump(c);
}

static void cli_send(struct cli *c, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            pump(c);
        } else {
            CU_FAIL("send failed");
            return;
        }
    }
}

static void cli_sends(struct cli *c, const char *s)
{
    cli_send(c, s, strlen(s));
}

struct resp {
    int status;
    char body[8192];
    size_t body_len;
};

static struct resp resps[64];
static int n_resps_parsed;

static int rp_headers(http_parser *p)
{
    if (n_resps_parsed < 64) {
        resps[n_resps_parsed].status = (int)p->status_code;
        resps[n_resps_parsed].body_len = 0;
    }
    return 0;
}

static int rp_body(http_parser *p, const char *at, size_t len)
{
    if (n_resps_parsed < 64) {
        struct resp *r = &resps[n_resps_parsed];
        size_t room = sizeof r->body - r->body_len;
        memcpy(r->body + r->body_len, at, len < room ? len : room);
        r->body_len += len < room ? len : room;
    }
    return 0;
}

static int rp_complete(http_parser *p)
{
    n_resps_parsed++;
    return 0;
}

/* Number of complete responses in c->buf (parsed into resps[]). */
static int count_responses(const struct cli *c)
{
    static const http_parser_settings s = {
        .on_headers_complete = rp_headers, .on_body = rp_body, .on_message_complete = rp_complete};
    http_parser p;
    http_parser_init(&p, HTTP_RESPONSE);
    n_resps_parsed = 0;
    http_parser_execute(&p, &s, c->buf, c->len);
    return n_resps_parsed;
}

static int wait_responses(struct cli *c, int n, double timeout_ms)
{
    double end = now_ms() + timeout_ms;
    while (count_responses(c) < n && !c->eof && now_ms() < end)
        pump(c);
    return count_responses(c);
}

static int wait_bytes(struct cli *c, size_t n, double timeout_ms)
{
    double end = now_ms() + timeout_ms;
    while (c->len < n && !c->eof && now_ms() < end)
        pump(c);
    return c->len >= n;
}

static int wait_eof(struct cli *c, double timeout_ms)
{
    double end = now_ms() + timeout_ms;
    while (!c->eof && now_ms() < end)
        pump(c);
    return c->eof;
}

/* Runs the loop until the handler has seen n requests; returns n_recs. */
static int wait_recs(struct cli *c, int n)
{
    double end = now_ms() + HANG_MS;
    while (n_recs < n && now_ms() < end)
        pump(c);
    return n_recs;
}

static void cli_reset_buf(struct cli *c)
{
    c->len = 0;
    c->buf[0] = '\0';
}

static void wait_server_idle(unsigned conns, double timeout_ms)
{
    struct http_server_stats st;
    double end = now_ms() + timeout_ms;
    do {
        pump(NULL);
        http_server_get_stats(&srv, &st);
    } while ((st.connections_open != conns || st.requests_live != 0) && now_ms() < end);
    EXPECT_EQ(st.connections_open, conns);
    EXPECT_EQ(st.requests_live, 0);
}

static const char *const HELLO = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                 "Content-Length: 5\r\n\r\nhello";

/* One fresh connection, one GET /hello: the server still serves. */
static void expect_still_serving(void)
{
    struct cli c;
    cli_open(&c);
    cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len, HELLO);
    cli_close(&c);
}

static const char *error_response(int status, const char *reason, const char *msg)
{
    static char out[1024];
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":%d}}",
                     msg, status >= 500 ? "server_error" : "invalid_request_error", status);
    snprintf(out, sizeof out,
             "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n"
             "Connection: close\r\n\r\n%s",
             status, reason, status == 503 ? "Retry-After: 1\r\n" : "", n, body);
    return out;
}

/* ---- tests ---- */

static void test_get_post(void)
{
    server_start(NULL);
    struct cli c;
    cli_open(&c);
    cli_sends(&c, "GET /hello?x=1&y=2#frag HTTP/1.1\r\nHost: a\r\nX-Test: One\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len, HELLO);
    EXPECT_STR(recs[0].method, "GET");
    EXPECT_STR(recs[0].path, "/hello");
    EXPECT_STR(recs[0].query, "x=1&y=2");
    EXPECT_STR(recs[0].xtest, "One");
    EXPECT_EQ(recs[0].nhdrs, 2);
    EXPECT_EQ(recs[0].version, 11);
    EXPECT_EQ(recs[0].body_len, 0);

    cli_reset_buf(&c);
    cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nabc=1");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len,
               "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nabc=1");
    EXPECT_STR(recs[1].method, "POST");
    EXPECT_MEM(recs[1].body, recs[1].body_len, "abc=1");
    EXPECT_STR(recs[1].xtest, "(none)");

    cli_reset_buf(&c);
    cli_sends(&c, "GET http://example.com/nope?q HTTP/1.1\r\nHost: a\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len,
               "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\n"
               "not found");
    EXPECT_STR(recs[2].path, "/nope");
    EXPECT_STR(recs[2].query, "q");

    cli_reset_buf(&c);
    cli_sends(&c, "HEAD /hello HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\n\r\n");
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n";
    char want[512];
    snprintf(want, sizeof want, "%s%s", head, HELLO);
    wait_bytes(&c, strlen(want), HANG_MS);
    EXPECT_MEM(c.buf, c.len, want);
    EXPECT_STR(recs[3].method, "HEAD");
    EXPECT_EQ(c.eof, 0);
    cli_close(&c);
    wait_server_idle(0, HANG_MS);
    server_stop();
}

static void test_split_every_byte(void)
{
    static const char *const reqs[] = {
        "POST /echo?q=split HTTP/1.1\r\nHost: h\r\nX-Test: value with  spaces \t\r\n"
        "Content-Length: 11\r\n\r\nhello world",
        "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\nx-test: c\r\n\r\n"
        "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: t\r\n\r\n",
    };
    const char *resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n"
                       "\r\nhello world";
    server_start(NULL);
    struct cli c;
    cli_open(&c);
    for (int v = 0; v < 2; v++) {
        const char *req = reqs[v];
        size_t len = strlen(req);
        /* Reference: the whole request in one write. */
        cli_reset_buf(&c);
        cli_sends(&c, req);
        EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
        EXPECT_MEM(c.buf, c.len, resp);
        struct rec ref = recs[n_recs - 1];
        EXPECT_STR(ref.path, "/echo");
        EXPECT_MEM(ref.body, ref.body_len, "hello world");
        EXPECT_STR(ref.xtest, v == 0 ? "value with  spaces" : "c");
        EXPECT_EQ(ref.nhdrs, v == 0 ? 3 : 2);
        /* Split in two at every byte boundary, and then one byte at a time,
         * with the loop running between the writes. */
        for (size_t k = 1; k <= len; k++) {
            cli_reset_buf(&c);
            int before = n_recs;
            if (k < len) {
                cli_send(&c, req, k);
                pump(&c);
                pump(&c);
                cli_send(&c, req + k, len - k);
            } else {
                for (size_t i = 0; i < len; i++) {
                    cli_send(&c, req + i, 1);
                    pump(&c);
                }
            }
            CU_ASSERT_EQUAL(wait_responses(&c, 1, HANG_MS), 1);
            EXPECT_MEM(c.buf, c.len, resp);
            CU_ASSERT_EQUAL(n_recs, before + 1);
            const struct rec *r = &recs[n_recs - 1];
            int same = !strcmp(r->method, ref.method) && !strcmp(r->path, ref.path) &&
                       !strcmp(r->query, ref.query) && !strcmp(r->xtest, ref.xtest) &&
                       r->body_len == ref.body_len && !memcmp(r->body, ref.body, r->body_len) &&
                       r->nhdrs == ref.nhdrs;
            if (!same)
                fprintf(stderr, "\nvariant %d split at %zu parsed differently\n", v, k);
            CU_ASSERT(same);
            if (n_recs > 200)
                n_recs = 0; /* recs[] is a ring for this test */
        }
    }
    EXPECT_EQ(c.eof, 0);
    cli_close(&c);
    server_stop();
}

static void test_pipelined_in_order(void)
{
    server_start(NULL);
    struct cli c;
    cli_open(&c);
    cli_sends(&c, "GET /hold HTTP/1.1\r\nHost: h\r\n\r\n"
                  "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n"
                  "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nxyz");
    /* All three reach the handler at once; nothing is written while the
     * first waits for the test to release it. */
    EXPECT_EQ(wait_recs(&c, 3), 3);
    pump_ms(&c, 20);
    EXPECT_EQ(c.len, 0);
    release_held(1);
    EXPECT_EQ(wait_responses(&c, 3, HANG_MS), 3);
    char want[1024];
    snprintf(want, sizeof want,
             "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nheld"
             "%sHTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nxyz",
             HELLO);
    EXPECT_MEM(c.buf, c.len, want);

    /* A long streaming first response: the second waits for its last chunk. */
    cli_reset_buf(&c);
    cli_sends(&c,
              "GET /stream?n=3 HTTP/1.1\r\nHost: h\r\n\r\nGET /hello HTTP/1.1\r\nHost: h\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 2, HANG_MS), 2);
    snprintf(want, sizeof want,
             "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
             "5\r\nfirst\r\n5\r\ntick\n\r\n5\r\ntick\n\r\n5\r\ntick\n\r\n0\r\n\r\n%s",
             HELLO);
    EXPECT_MEM(c.buf, c.len, want);

    /* A whole stream produced while an earlier reply is pending is held back. */
    cli_reset_buf(&c);
    int before = n_recs;
    cli_sends(&c, "GET /hold HTTP/1.1\r\nHost: h\r\n\r\nGET /sse HTTP/1.1\r\nHost: h\r\n\r\n");
    EXPECT_EQ(wait_recs(&c, before + 2), before + 2); /* the stream is complete */
    pump_ms(&c, 10);
    EXPECT_EQ(c.len, 0);
    release_held(1);
    EXPECT_EQ(wait_responses(&c, 2, HANG_MS), 2);
    const char *first = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n"
                        "\r\nheldHTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n";
    const char *last = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    CU_ASSERT(c.len > strlen(first) && !strncmp(c.buf, first, strlen(first)));
    CU_ASSERT(c.len > strlen(last) && !strcmp(c.buf + c.len - strlen(last), last));
    cli_close(&c);
    wait_server_idle(0, HANG_MS);
    server_stop();
}

static void test_pipeline_bounded(void)
{
    struct http_config cfg;
    test_config(&cfg);
    cfg.max_pipelined = 2;
    server_start(&cfg);
    struct cli c;
    cli_open(&c);
    char reqs[4096] = "", want[8192] = "";
    for (int i = 0; i < 10; i++) {
        int ms = 2 * (10 - i); /* later requests finish sooner */
        char one[128];
        snprintf(one, sizeof one, "GET /delay?ms=%d HTTP/1.1\r\nHost: h\r\n\r\n", ms);
        strcat(reqs, one);
        snprintf(one, sizeof one,
                 "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
                 "delayed %d",
                 ms >= 10 ? 10 : 9, ms);
        strcat(want, one);
    }
    cli_sends(&c, reqs);
    EXPECT_EQ(wait_responses(&c, 10, HANG_MS), 10);
    EXPECT_MEM(c.buf, c.len, want);
    EXPECT_EQ(n_recs, 10);
    /* Reading pauses while two requests wait: never more in the handler. */
    EXPECT_EQ(max_outstanding, 2);
    cli_close(&c);
    wait_server_idle(0, HANG_MS);
    server_stop();
}

static void test_chunked_bodies(void)
{
    server_start(NULL);
    struct cli c;
    cli_open(&c);
    cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "4;name=value\r\nWiki\r\n5\r\npedia\r\n0\r\nX-Trailer: t\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len,
               "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\n"
               "Wikipedia");
    EXPECT_EQ(recs[0].nhdrs, 2); /* the trailer is not a header */
    cli_close(&c);

    static const char *const bad[] = {
        /* not hex */
        "POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
        "chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        /* chunk longer than announced */
        "POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
        "chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n",
        /* both framings: smuggling attempt */
        "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\r\n0\r\n\r\n",
    };
    for (int i = 0; i < 3; i++) {
        cli_open(&c);
        cli_sends(&c, bad[i]);
        EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
        EXPECT_EQ(resps[0].status, 400);
        if (i == 0)
            EXPECT_MEM(c.buf, c.len, error_response(400, "Bad Request", "malformed chunked body"));
        CU_ASSERT(wait_eof(&c, HANG_MS));
        cli_close(&c);
        expect_still_serving();
    }
    EXPECT_EQ(n_recs, 4); /* the good one and three still-serving checks */
    wait_server_idle(0, HANG_MS);
    struct http_server_stats st;
    http_server_get_stats(&srv, &st);
    EXPECT_EQ(st.errors, 3);
    server_stop();
}

static void test_oversized_headers(void)
{
    struct http_config cfg;
    test_config(&cfg);
    cfg.max_header_bytes = 1024;
    server_start(&cfg);
    char big[4096];
    struct cli c;

    memset(big, 0, sizeof big);
    strcpy(big, "GET /hello HTTP/1.1\r\nHost: h\r\nX-Big: ");
    memset(big + strlen(big), 'a', 1200);
    strcat(big, "\r\n\r\n");
    cli_open(&c);
    cli_sends(&c, big);
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(
        c.buf, c.len,
        error_response(431, "Request Header Fields Too Large", "request header fields too large"));
    CU_ASSERT(wait_eof(&c, HANG_MS));
    cli_close(&c);
    expect_still_serving();

    /* Many small fields add up too. */
    strcpy(big, "GET /hello HTTP/1.1\r\n");
    for (int i = 0; i < 150; i++)
        strcat(big, "A: b\r\n");
    strcat(big, "\r\n");
    cli_open(&c);
    cli_sends(&c, big);
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_EQ(resps[0].status, 431);
    cli_close(&c);

    memset(big, 0, sizeof big);
    strcpy(big, "GET /");
    memset(big + 5, 'u', 1100);
    strcat(big, " HTTP/1.1\r\nHost: h\r\n\r\n");
    cli_open(&c);
    cli_sends(&c, big);
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len, error_response(414, "URI Too Long", "request URI too long"));
    CU_ASSERT(wait_eof(&c, HANG_MS));
    cli_close(&c);
    expect_still_serving();
    EXPECT_EQ(n_recs, 2);
    server_stop();
}

/* Sends req on a new connection in one write, or one byte at a time with the
 * server's loop running in between, and returns the status of the answer. */
static int status_of(const char *req, int bytewise)
{
    struct cli c;
    cli_open(&c);
    size_t len = strlen(req);
    if (bytewise) {
        for (size_t i = 0; i < len && !c.eof; i++) {
            cli_send(&c, req + i, 1);
            pump(&c);
        }
    } else {
        cli_send(&c, req, len);
    }
    int st = wait_responses(&c, 1, HANG_MS) == 1 ? resps[0].status : -1;
    cli_close(&c);
    return st;
}

/* max_header_bytes counts the URL and, per header field, its name and value
 * plus 6 bytes (": ", CRLF, and the separators the server stores). At the
 * limit the request is served, one byte past it refused with 431 (414 when
 * the URL alone is over), the same however TCP splits the bytes. */
static void test_limit_header_bytes(void)
{
    struct http_config cfg;
    test_config(&cfg);
    cfg.max_header_bytes = 1024;
    server_start(&cfg);
    static char req[2048];
    for (int over = 0; over <= 1; over++) {
        /* "/hello" 6 + "Host" "h" 4 + 1 + 6 + "X-Big" 5 + 6 = 28 */
        int v = 1024 - 28 + over;
        int n = snprintf(req, sizeof req, "GET /hello HTTP/1.1\r\nHost: h\r\nX-Big: ");
        memset(req + n, 'a', (size_t)v);
        snprintf(req + n + v, sizeof req - (size_t)(n + v), "\r\n\r\n");
        for (int bytewise = 0; bytewise <= 1; bytewise++) {
            int st = status_of(req, bytewise);
            if (st != (over ? 431 : 200))
                fprintf(stderr, "\nheader block %d bytes, %s: %d\n", 1024 + over,
                        bytewise ? "a byte at a time" : "one write", st);
            EXPECT_EQ(st, over ? 431 : 200);
        }
    }
    /* The URL alone: 1024 bytes reach the handler (404 for this path), 1025
     * are 414. No header field, so the URL is all that counts. */
    for (int over = 0; over <= 1; over++) {
        int n = snprintf(req, sizeof req, "GET /");
        memset(req + n, 'u', (size_t)(1023 + over));
        snprintf(req + n + 1023 + over, sizeof req - (size_t)(n + 1023 + over),
                 " HTTP/1.1\r\n\r\n");
        for (int bytewise = 0; bytewise <= 1; bytewise++)
            EXPECT_EQ(status_of(req, bytewise), over ? 414 : 404);
    }
    EXPECT_EQ(n_recs, 4);
    wait_server_idle(0, HANG_MS);
    server_stop();
}

/* At most HTTP_MAX_HEADERS (100) header fields; the 101st is 431. */
static void test_limit_header_fields(void)
{
    server_start(NULL);
    static char req[2048];
    for (int over = 0; over <= 1; over++) {
        int n = snprintf(req, sizeof req, "GET /hello HTTP/1.1\r\n");
        for (int i = 0; i < 100 + over; i++)
            n += snprintf(req + n, sizeof req - (size_t)n, "A: b\r\n");
        snprintf(req + n, sizeof req - (size_t)n, "\r\n");
        EXPECT_EQ(status_of(req, 0), over ? 431 : 200);
    }
    EXPECT_EQ(n_recs, 1);
    EXPECT_EQ(recs[0].nhdrs, 100);
    server_stop();
}

/* The body: max_body_bytes decoded bytes are served, one more is 413, with
 * Content-Length and chunked. */
static void test_limit_body_bytes(void)
{
    struct http_config cfg;
    test_config(&cfg);
    cfg.max_body_bytes = 1000;
    server_start(&cfg);
    static char req[4096];
    for (int over = 0; over <= 1; over++) {
        int n = snprintf(req, sizeof req, "POST /echo HTTP/1.1\r\nContent-Length: %d\r\n\r\n",
                         1000 + over);
        memset(req + n, 'b', (size_t)(1000 + over));
        req[n + 1000 + over] = '\0';
        EXPECT_EQ(status_of(req, 0), over ? 413 : 200);
        /* Chunked: 600 bytes, then 400 + over. */
        n = snprintf(req, sizeof req,
                     "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n");
        memset(req + n, 'c', 600);
        n += 600;
        n += snprintf(req + n, sizeof req - (size_t)n, "\r\n%x\r\n", 400 + over);
        memset(req + n, 'c', (size_t)(400 + over));
        n += 400 + over;
        snprintf(req + n, sizeof req - (size_t)n, "\r\n0\r\n\r\n");
        EXPECT_EQ(status_of(req, 0), over ? 413 : 200);
    }
    EXPECT_EQ(n_recs, 2);
    EXPECT_EQ(recs[0].body_len, 1000);
    EXPECT_EQ(recs[1].body_len, 1000);
    server_stop();
}

/* Unsent output: a response held behind an earlier one on its connection
 * buffers everything it writes. A write that finds max_output_bytes unsent
 * still goes (here the end of the response); one that finds a byte more
 * closes the connection (a client that does not read). The buffered bytes
 * are the head, and the chunk's size line, data and CRLF. */
static void test_limit_output_bytes(void)
{
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n";
    const int data = 4000; /* "fa0\r\n" + data + "\r\n" */
    struct http_config cfg;
    test_config(&cfg);
    cfg.max_output_bytes = strlen(head) + 5 + (size_t)data + 2;
    server_start(&cfg);
    for (int over = 0; over <= 1; over++) {
        struct cli c;
        cli_open(&c);
        char req[256];
        snprintf(req, sizeof req,
                 "GET /hold HTTP/1.1\r\nHost: h\r\n\r\nGET /out?n=%d HTTP/1.1\r\nHost: h\r\n\r\n",
                 data + over);
        int before = n_recs;
        cli_sends(&c, req);
        EXPECT_EQ(wait_recs(&c, before + 2), before + 2);
        EXPECT_EQ(out_rcs[0], 0);
        EXPECT_EQ(out_rcs[1], over ? TANDEM_ECLOSED : 0);
        if (out_rcs[1] == 0) {
            release_held(1);
            EXPECT_EQ(wait_responses(&c, 2, HANG_MS), 2);
            EXPECT_EQ(resps[1].status, 200);
            EXPECT_EQ(resps[1].body_len, (size_t)data);
        } else {
            /* Closed: the held request was aborted with it. */
            CU_ASSERT(wait_eof(&c, HANG_MS));
        }
        cli_close(&c);
        wait_server_idle(0, HANG_MS);
    }
    server_stop();
}

/* Reading pauses once max_pipelined (16 by default) requests wait on the
 * connection: 20 pipelined /hold requests, 16 reach the handler; each answer
 * lets one more in. */
static void test_limit_pipelined(void)
{
    server_start(NULL);
    struct cli c;
    cli_open(&c);
    char reqs[2048] = "";
    for (int i = 0; i < 20; i++)
        strcat(reqs, "GET /hold HTTP/1.1\r\nHost: h\r\n\r\n");
    cli_sends(&c, reqs);
    EXPECT_EQ(wait_recs(&c, 16), 16);
    pump_ms(&c, 50); /* a 17th would have had time to be parsed */
    EXPECT_EQ(n_recs, 16);
    release_held(1);
    EXPECT_EQ(wait_recs(&c, 17), 17);
    pump_ms(&c, 50);
    EXPECT_EQ(n_recs, 17);
    release_held(3);
    EXPECT_EQ(wait_recs(&c, 20), 20);
    release_held(16);
    EXPECT_EQ(wait_responses(&c, 20, HANG_MS), 20);
    cli_close(&c);
    wait_server_idle(0, HANG_MS);
    server_stop();
}

static void test_oversized_body(void)
{
    struct http_config cfg;
    test_config(&cfg);
    cfg.max_body_bytes = 1000;
    server_start(&cfg);
    static char body[3000];
    memset(body, 'b', sizeof body);
    char head[256];
    struct cli c;

    /* Declared too large: refused at the headers, the body sent anyway is
     * drained so the client reads the 413 rather than a reset. */
    cli_open(&c);
    snprintf(head, sizeof head, "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 2000\r\n\r\n");
    cli_sends(&c, head);
    cli_send(&c, body, 2000);
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len, error_response(413, "Payload Too Large", "request body too large"));
    CU_ASSERT(wait_eof(&c, HANG_MS));
    EXPECT_EQ(c.reset, 0);
    cli_close(&c);

    /* Chunked: the running total is what counts. */
    cli_open(&c);
    cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; i++) {
        cli_sends(&c, "190\r\n"); /* 400 bytes */
        cli_send(&c, body, 400);
        cli_sends(&c, "\r\n");
    }
    cli_sends(&c, "0\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_EQ(resps[0].status, 413);
    CU_ASSERT(wait_eof(&c, HANG_MS));
    cli_close(&c);

    /* Exactly at the limit is fine. */
    cli_open(&c);
    snprintf(head, sizeof head, "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n");
    cli_sends(&c, head);
    cli_send(&c, body, 1000);
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_EQ(resps[0].status, 200);
    EXPECT_EQ(resps[0].body_len, 1000);
    cli_close(&c);
    EXPECT_EQ(n_recs, 1);
    expect_still_serving();
    server_stop();
}

static void test_slow_client(void)
{
    struct http_config cfg;
    test_config(&cfg);
    cfg.request_timeout_ms = 150;
    server_start(&cfg);
    const char *want = error_response(408, "Request Timeout", "request not received in time");
    struct cli c;

    /* Headers never finish. */
    cli_open(&c);
    double t0 = now_ms();
    cli_sends(&c, "GET /hello HTTP/1.1\r\nHost:");
    CU_ASSERT(wait_eof(&c, HANG_MS));
    double dt = now_ms() - t0;
    EXPECT_MEM(c.buf, c.len, want);
    /* Not before the timeout. This cannot flake: our clock starts before the
     * first byte is sent, the server's timer when its loop has read it; only
     * the loop's cached time (updated right before the read callbacks) could
     * start it early, by far less than the 10 ms allowed. */
    CU_ASSERT(dt >= 140);
    cli_close(&c);

    /* Body never finishes. */
    cli_open(&c);
    cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc");
    CU_ASSERT(wait_eof(&c, HANG_MS));
    EXPECT_MEM(c.buf, c.len, want);
    cli_close(&c);

    /* Trickling bytes does not extend the deadline. */
    cli_open(&c);
    const char *req = "GET /hello HTTP/1.1\r\nHost: h\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    t0 = now_ms();
    for (size_t i = 0; req[i] && !c.eof; i++) {
        cli_send(&c, req + i, 1);
        pump_ms(&c, 15);
    }
    CU_ASSERT(wait_eof(&c, HANG_MS));
    /* Had each byte restarted the clock, the request would have arrived
     * whole and been served. */
    EXPECT_MEM(c.buf, c.len, want);
    cli_close(&c);
    EXPECT_EQ(n_recs, 0);
    expect_still_serving();
    server_stop();
}

static void test_keepalive_and_close(void)
{
    struct http_config cfg;
    test_config(&cfg);
    /* Long enough that a keep-alive request sent right after the previous
     * answer is never late for it, even on a loaded machine. */
    cfg.idle_timeout_ms = 500;
    server_start(&cfg);
    struct cli c;

    /* Keep-alive: three requests, one connection. */
    cli_open(&c);
    double t0 = 0;
    for (int i = 0; i < 3; i++) {
        cli_reset_buf(&c);
        t0 = now_ms();
        cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n");
        EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
        EXPECT_MEM(c.buf, c.len, HELLO);
    }
    EXPECT_EQ(c.eof, 0);
    /* Idle: closed silently after the idle timeout. */
    cli_reset_buf(&c);
    CU_ASSERT(wait_eof(&c, HANG_MS));
    double dt = now_ms() - t0;
    EXPECT_EQ(c.len, 0);
    /* Not before the timeout. This cannot flake: t0 is before the last
     * request was sent, and the idle clock starts only once it is answered;
     * only the loop's cached time could start it early, by far less than the
     * 10 ms allowed. */
    CU_ASSERT(dt >= 490);
    cli_close(&c);

    /* A connection that never sends anything is idle too. */
    cli_open(&c);
    CU_ASSERT(wait_eof(&c, HANG_MS));
    EXPECT_EQ(c.len, 0);
    cli_close(&c);

    /* Connection: close, and what was pipelined after it is not served. */
    const char *closing = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
                          "Connection: close\r\n\r\nhello";
    int before = n_recs;
    cli_open(&c);
    cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
                  "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n");
    CU_ASSERT(wait_eof(&c, HANG_MS));
    EXPECT_MEM(c.buf, c.len, closing);
    EXPECT_EQ(n_recs, before + 1);
    cli_close(&c);

    /* HTTP/1.0 closes by default... */
    cli_open(&c);
    cli_sends(&c, "GET /hello HTTP/1.0\r\n\r\n");
    CU_ASSERT(wait_eof(&c, HANG_MS));
    EXPECT_MEM(c.buf, c.len, closing);
    EXPECT_EQ(recs[n_recs - 1].version, 10);
    cli_close(&c);

    /* ...unless it asks for keep-alive. */
    const char *kept = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
                       "Connection: keep-alive\r\n\r\nhello";
    cli_open(&c);
    for (int i = 0; i < 2; i++) {
        cli_reset_buf(&c);
        cli_sends(&c, "GET /hello HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
        EXPECT_MEM(c.buf, c.len, kept);
    }
    EXPECT_EQ(c.eof, 0);
    cli_close(&c);

    /* The handler can close too. */
    cli_open(&c);
    cli_sends(&c, "GET /close HTTP/1.1\r\nHost: h\r\n\r\n");
    CU_ASSERT(wait_eof(&c, HANG_MS));
    EXPECT_MEM(c.buf, c.len,
               "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
               "Connection: close\r\n\r\nbye");
    cli_close(&c);
    wait_server_idle(0, HANG_MS);
    server_stop();
}

static void test_disconnect_aborts(void)
{
    server_start(NULL);
    struct cli c;

    /* Mid-stream. */
    cli_open(&c);
    cli_sends(&c, "GET /stream?n=100000 HTTP/1.1\r\nHost: h\r\n\r\n");
    const char *start = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n5\r\ntick\n\r\n";
    CU_ASSERT(wait_bytes(&c, strlen(start), HANG_MS));
    CU_ASSERT(c.len >= strlen(start) && !memcmp(c.buf, start, strlen(start)));
    cli_close(&c);
    double end = now_ms() + HANG_MS;
    while (n_aborts == 0 && now_ms() < end)
        pump(NULL);
    EXPECT_EQ(n_aborts, 1);
    EXPECT_EQ(abort_rc, TANDEM_ECLOSED); /* writes after the abort are no-ops */
    wait_server_idle(0, HANG_MS);

    /* While the handler works on a reply (nothing written yet). */
    cli_open(&c);
    cli_sends(&c, "GET /delay?ms=100000 HTTP/1.1\r\nHost: h\r\n\r\n");
    EXPECT_EQ(wait_recs(&c, 2), 2);
    cli_close(&c);
    end = now_ms() + HANG_MS;
    while (n_aborts == 1 && now_ms() < end)
        pump(NULL);
    EXPECT_EQ(n_aborts, 2);
    EXPECT_EQ(abort_rc, TANDEM_ECLOSED);
    wait_server_idle(0, HANG_MS);

    /* A client that does not read: the server gives up on it. */
    cli_open_rcvbuf(&c, 4096);
    cli_sends(&c, "GET /flood HTTP/1.1\r\nHost: h\r\n\r\n");
    end = now_ms() + HANG_MS;
    while (n_aborts == 2 && now_ms() < end) {
        uv_run(&loop, UV_RUN_NOWAIT); /* never read on the client side */
        poll(NULL, 0, 1);
    }
    EXPECT_EQ(n_aborts, 3);
    EXPECT_EQ(flood_rc, TANDEM_ECLOSED);
    CU_ASSERT(flood_writes > 0 && flood_writes < 1000);
    cli_close(&c);
    wait_server_idle(0, HANG_MS);

    struct http_server_stats st;
    http_server_get_stats(&srv, &st);
    EXPECT_EQ(st.aborted, 3);
    expect_still_serving();
    server_stop();
}

static void test_sse_framing(void)
{
    server_start(NULL);
    struct cli c;
    cli_open(&c);
    cli_sends(&c, "GET /sse HTTP/1.1\r\nHost: h\r\n\r\n");
    const char *want =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        "Cache-Control: no-cache\r\nX-Accel: no\r\nTransfer-Encoding: chunked\r\n\r\n"
        "f\r\ndata: {\"a\":1}\n\n\r\n"
        "31\r\nevent: ping\ndata: line1\ndata: line2\ndata: line3\n\n\r\n"
        "e\r\ndata: [DONE]\n\n\r\n"
        "0\r\n\r\n";
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len, want);
    EXPECT_EQ(c.eof, 0);
    cli_close(&c);

    /* HTTP/1.0 has no chunked encoding: raw events, end of stream = close. */
    cli_open(&c);
    cli_sends(&c, "GET /sse HTTP/1.0\r\n\r\n");
    CU_ASSERT(wait_eof(&c, HANG_MS));
    EXPECT_MEM(c.buf, c.len,
               "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
               "X-Accel: no\r\nConnection: close\r\n\r\n"
               "data: {\"a\":1}\n\nevent: ping\ndata: line1\ndata: line2\ndata: line3\n\n"
               "data: [DONE]\n\n");
    cli_close(&c);
    wait_server_idle(0, HANG_MS);
    server_stop();
}

/* http_req_cork holds a stream's events, http_req_uncork (or the end) sends
 * them: the bytes are those of the events written one by one. */
static void test_sse_cork(void)
{
    server_start(NULL);
    const char *want = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "f\r\ndata: {\"a\":1}\n\n\r\n"
                       "1d\r\nevent: ping\ndata: x\ndata: y\n\n\r\n"
                       "f\r\ndata: {\"b\":2}\n\n\r\n"
                       "e\r\ndata: [DONE]\n\n\r\n"
                       "0\r\n\r\n";
    for (int end = 0; end <= 1; end++) {
        struct cli c;
        cli_open(&c);
        cli_sends(&c, end ? "GET /corked?end=1 HTTP/1.1\r\nHost: h\r\n\r\n"
                          : "GET /corked?end=0 HTTP/1.1\r\nHost: h\r\n\r\n");
        EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
        EXPECT_MEM(c.buf, c.len, want);
        EXPECT_EQ(corked_unsent[0], (size_t)(20 + 35 + 20));
        EXPECT_EQ(corked_unsent[1], 0);
        cli_close(&c);
    }
    wait_server_idle(0, HANG_MS);
    server_stop();
}

static void test_max_connections(void)
{
    struct http_config cfg;
    test_config(&cfg);
    cfg.max_connections = 2;
    server_start(&cfg);
    struct cli a, b, c;
    cli_open(&a);
    cli_open(&b);
    cli_sends(&a, "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n");
    cli_sends(&b, "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n");
    EXPECT_EQ(wait_responses(&a, 1, HANG_MS), 1);
    EXPECT_EQ(wait_responses(&b, 1, HANG_MS), 1);

    cli_open(&c);
    cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n");
    CU_ASSERT(wait_eof(&c, HANG_MS));
    EXPECT_MEM(c.buf, c.len, error_response(503, "Service Unavailable", "too many connections"));
    cli_close(&c);

    cli_close(&a);
    wait_server_idle(1, HANG_MS);
    expect_still_serving();
    struct http_server_stats st;
    http_server_get_stats(&srv, &st);
    EXPECT_EQ(st.connections_rejected, 1);
    EXPECT_EQ(st.connections_accepted, 4);
    EXPECT_EQ(n_recs, 3);
    cli_close(&b);
    server_stop();
}

static void test_handler_contract(void)
{
    server_start(NULL);
    struct cli c;
    cli_open(&c);
    /* A handler that neither answers nor keeps the request: 500, connection kept. */
    cli_sends(&c, "GET /forget HTTP/1.1\r\nHost: h\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    const char *body = "{\"error\":{\"message\":\"request not handled\",\"type\":\"server_error\","
                       "\"param\":null,\"code\":500}}";
    char want[512];
    snprintf(want, sizeof want,
             "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    EXPECT_MEM(c.buf, c.len, want);

    cli_reset_buf(&c);
    cli_sends(&c, "GET /misuse HTTP/1.1\r\nHost: h\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    EXPECT_MEM(c.buf, c.len,
               "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok");
    EXPECT_EQ(misuse_rcs[0], TANDEM_EINVAL);
    EXPECT_EQ(misuse_rcs[1], TANDEM_EINVAL);
    EXPECT_EQ(misuse_rcs[2], TANDEM_EINVAL);
    EXPECT_EQ(misuse_rcs[3], TANDEM_EINVAL);
    EXPECT_EQ(misuse_rcs[4], TANDEM_EINVAL);
    EXPECT_EQ(misuse_rcs[5], TANDEM_EINVAL);
    EXPECT_EQ(misuse_rcs[6], 0);
    EXPECT_EQ(misuse_rcs[7], TANDEM_EINVAL);

    /* Expect: 100-continue gets the interim response before the body. */
    cli_reset_buf(&c);
    cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                  "Expect: 100-continue\r\n\r\n");
    const char *cont = "HTTP/1.1 100 Continue\r\n\r\n";
    CU_ASSERT(wait_bytes(&c, strlen(cont), HANG_MS));
    EXPECT_MEM(c.buf, c.len, cont);
    cli_sends(&c, "hello");
    snprintf(want, sizeof want, "%s%s", cont, HELLO);
    CU_ASSERT(wait_bytes(&c, strlen(want), HANG_MS));
    EXPECT_MEM(c.buf, c.len, want);
    EXPECT_EQ(c.eof, 0);
    cli_close(&c);

    /* Requests pending when the server closes are aborted, then all is freed. */
    cli_open(&c);
    cli_sends(&c, "GET /delay?ms=100000 HTTP/1.1\r\nHost: h\r\n\r\n");
    struct cli d;
    cli_open(&d);
    cli_sends(&d, "GET /stream?n=100000 HTTP/1.1\r\nHost: h\r\n\r\n");
    CU_ASSERT(wait_bytes(&d, 10, HANG_MS));
    pump_ms(&c, 10);
    EXPECT_EQ(n_aborts, 0);
    server_stop(); /* asserts the close callback ran and the loop closed */
    EXPECT_EQ(n_aborts, 2);
    cli_close(&c);
    cli_close(&d);
}

static void test_date_header(void)
{
    struct http_config cfg;
    http_config_default(&cfg);
    server_start(&cfg);
    struct cli c;
    cli_open(&c);
    cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n");
    EXPECT_EQ(wait_responses(&c, 1, HANG_MS), 1);
    char wd[4], mon[4];
    int day, year, hh, mm, ss, n = 0;
    CU_ASSERT(sscanf(c.buf, "HTTP/1.1 200 OK\r\nDate: %3s, %d %3s %d %d:%d:%d GMT\r\n%n", wd, &day,
                     mon, &year, &hh, &mm, &ss, &n) == 7);
    CU_ASSERT(n > 0 && wd[3] == '\0' && year >= 2024);
    CU_ASSERT(strstr(c.buf, "Content-Length: 5\r\n\r\nhello") != NULL);
    cli_close(&c);
    server_stop();
}

/* http_server_shutdown: an idle keep-alive connection gets EOF at once; a
 * response in flight still ends, with Connection: close and then EOF; a
 * whole multi-MiB response queued for a client that has not read yet
 * reaches it completely (http_server_close would drop the unsent bytes),
 * then EOF; the server then finishes by itself. */
static void test_shutdown_drains(void)
{
    struct http_config cfg;
    test_config(&cfg);
    server_start(&cfg);
    struct cli idle, held_c, slow;
    cli_open(&idle);
    cli_sends(&idle, "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n");
    EXPECT_EQ(wait_responses(&idle, 1, HANG_MS), 1);
    cli_open(&held_c);
    cli_sends(&held_c, "GET /hold HTTP/1.1\r\nHost: h\r\n\r\n");
    cli_open_rcvbuf(&slow, 4096);
    char req[96];
    snprintf(req, sizeof req, "GET /big?n=%d HTTP/1.1\r\nHost: h\r\n\r\n", BIG_BYTES);
    cli_sends(&slow, req);
    double end = now_ms() + HANG_MS;
    while ((n_recs < 3 || n_held < 1) && now_ms() < end)
        pump(NULL); /* the slow client reads nothing yet */
    EXPECT_EQ(n_recs, 3);
    EXPECT_EQ(n_held, 1);
    size_t unsent = big_unsent;
    printf("\n  %zu of %d bytes still unsent when the shutdown begins\n", unsent, BIG_BYTES);
    CU_ASSERT(unsent > 0); /* else the test proves nothing */

    http_server_shutdown(&srv, on_server_closed);
    CU_ASSERT(wait_eof(&idle, HANG_MS));
    CU_ASSERT(!idle.reset);
    EXPECT_EQ(count_responses(&idle), 1);
    cli_close(&idle);

    pump_ms(&held_c, 20);
    CU_ASSERT(!held_c.eof); /* its response has not ended */
    release_held(1);
    CU_ASSERT(wait_eof(&held_c, HANG_MS));
    CU_ASSERT(!held_c.reset);
    EXPECT_MEM(held_c.buf, held_c.len,
               "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n"
               "Connection: close\r\n\r\nheld");
    cli_close(&held_c);

    CU_ASSERT(wait_eof(&slow, HANG_MS));
    CU_ASSERT(!slow.reset);
    size_t bs = 0; /* the head and chunk sizes have no 'b' */
    for (size_t i = 0; i < slow.len; i++)
        bs += slow.buf[i] == 'b';
    EXPECT_EQ(bs, BIG_BYTES);
    CU_ASSERT(slow.len > 7 && memcmp(slow.buf + slow.len - 7, "\r\n0\r\n\r\n", 7) == 0);
    cli_close(&slow);

    end = now_ms() + HANG_MS;
    while (!srv_closed && now_ms() < end)
        pump(NULL);
    CU_ASSERT(srv_closed);
    uv_run(&loop, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop), 0);
}

int main(void)
{
    log_init("test_http", LOG_LEVEL_ERROR);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("http", NULL, NULL);
    CU_add_test(s, "get_post", test_get_post);
    CU_add_test(s, "split_every_byte", test_split_every_byte);
    CU_add_test(s, "pipelined_in_order", test_pipelined_in_order);
    CU_add_test(s, "pipeline_bounded", test_pipeline_bounded);
    CU_add_test(s, "chunked_bodies", test_chunked_bodies);
    CU_add_test(s, "oversized_headers", test_oversized_headers);
    CU_add_test(s, "oversized_body", test_oversized_body);
    CU_add_test(s, "limit_header_bytes", test_limit_header_bytes);
    CU_add_test(s, "limit_header_fields", test_limit_header_fields);
    CU_add_test(s, "limit_body_bytes", test_limit_body_bytes);
    CU_add_test(s, "limit_output_bytes", test_limit_output_bytes);
    CU_add_test(s, "limit_pipelined", test_limit_pipelined);
    CU_add_test(s, "slow_client", test_slow_client);
    CU_add_test(s, "keepalive_and_close", test_keepalive_and_close);
    CU_add_test(s, "disconnect_aborts", test_disconnect_aborts);
    CU_add_test(s, "sse_framing", test_sse_framing);
    CU_add_test(s, "sse_cork", test_sse_cork);
    CU_add_test(s, "max_connections", test_max_connections);
    CU_add_test(s, "handler_contract", test_handler_contract);
    CU_add_test(s, "date_header", test_date_header);
    CU_add_test(s, "shutdown_drains", test_shutdown_drains);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
