/* A small blocking HTTP/1.1 client for the router's end-to-end tests
 * (test_int_router*.c): raw sockets on loopback, whole responses parsed
 * (Content-Length, chunked, or read to EOF), several responses read from one
 * connection for pipelining, SSE events split out, and the router process
 * started through the harness on a free port. Header-only (static inline)
 * because each test file is its own executable.
 *
 * The integration tests parse what the router sends with JSON_ALLOW_NUL: the
 * tiny model samples byte tokens, <0x00> among them, and the router's valid
 * "\u0000" is refused by jansson's default (3% of answers to one 4-token
 * request; test_int_router_dashboard failed on it in CI). */
#ifndef TANDEM_RT_CLIENT_H
#define TANDEM_RT_CLIENT_H

#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "openai.h"
#include "tandem_err.h"
#include "tokenizer.h"

/* Compares doubles (metric values): NAN, a missing series, never equals
 * anything. Prints both sides on failure. */
#define EXPECT_NUM(got, want)                                                                      \
    do {                                                                                           \
        double g_ = (double)(got), w_ = (double)(want);                                            \
        if (!(g_ == w_))                                                                           \
            fprintf(stderr, "\n%s:%d: %s == %g, want %g\n", __FILE__, __LINE__, #got, g_, w_);     \
        CU_ASSERT(g_ == w_);                                                                       \
    } while (0)

struct rtc_resp {
    int status;    /* -1: no (complete) response */
    char *headers; /* raw header block (owned) */
    char *body;    /* de-chunked body, NUL-terminated (owned) */
    size_t body_len;
    int closed; /* the server closed the connection after it */
};

struct rtc_conn {
    int fd;
    char *buf; /* (cap) bytes received and not yet parsed: [0, len) */
    size_t len, cap;
    int eof;
};

static inline void rtc_resp_free(struct rtc_resp *r)
{
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof(*r));
    r->status = -1;
}

/* A free TCP port on 127.0.0.1 (bound then released). */
static inline int rtc_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

static inline int rtc_connect(struct rtc_conn *c, int port)
{
    memset(c, 0, sizeof(*c));
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0) {
        return -1;
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    return 0;
}

static inline void rtc_close(struct rtc_conn *c)
{
    if (c->fd >= 0) {
        close(c->fd);
    }
    free(c->buf);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

static inline int rtc_send(struct rtc_conn *c, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads more bytes (waiting up to timeout_ms). Returns bytes read, 0 on EOF,
 * -1 on timeout or error. */
static inline int rtc_fill(struct rtc_conn *c, int timeout_ms)
{
    if (c->eof) {
        return 0;
    }
    struct pollfd pfd = {c->fd, POLLIN, 0};
    int pr = poll(&pfd, 1, timeout_ms);
    if (pr <= 0) {
        return -1;
    }
    if (c->cap - c->len < 65536) {
        size_t cap = c->cap ? c->cap * 2 : 131072;
        char *b = realloc(c->buf, cap + 1);
        if (b == NULL) {
            return -1;
        }
        c->buf = b;
        c->cap = cap;
    }
    ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
        c->eof = 1;
        return 0;
    }
    if (n < 0) {
        return errno == EINTR ? 1 : -1;
    }
    c->len += (size_t)n;
    c->buf[c->len] = '\0';
    return (int)n;
}

/* Value of header name in a raw header block, copied to out ("" if absent). */
static inline void rtc_header(const char *headers, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    size_t n = strlen(name);
    for (const char *p = headers; p && *p;) {
        const char *eol = strstr(p, "\r\n");
        if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
            const char *v = p + n + 1;
            while (*v == ' ') {
                v++;
            }
            size_t len = eol ? (size_t)(eol - v) : strlen(v);
            if (len >= cap) {
                len = cap - 1;
            }
            memcpy(out, v, len);
            out[len] = '\0';
            return;
        }
        p = eol ? eol + 2 : NULL;
    }
}

/* Tries to parse one whole response from the buffer. Returns 1 (parsed and
 * consumed), 0 (need more bytes), -1 (malformed). */
static inline int rtc_parse(struct rtc_conn *c, struct rtc_resp *r, int head_only)
{
    if (c->len == 0) {
        return 0;
    }
    c->buf[c->len] = '\0';
    char *end = strstr(c->buf, "\r\n\r\n");
    if (end == NULL) {
        return 0;
    }
    size_t hlen = (size_t)(end - c->buf) + 4;
    int major, minor, status;
    if (sscanf(c->buf, "HTTP/%d.%d %d", &major, &minor, &status) != 3) {
        return -1;
    }
    char *headers = strndup(c->buf, hlen);
    char te[64], cl[32], conn[32];
    rtc_header(headers, "Transfer-Encoding", te, sizeof(te));
    rtc_header(headers, "Content-Length", cl, sizeof(cl));
    rtc_header(headers, "Connection", conn, sizeof(conn));
    char *body = NULL;
    size_t blen = 0, used = hlen;
    if (head_only) {
        body = strdup("");
    } else if (strcasecmp(te, "chunked") == 0) {
        body = malloc(c->len + 1);
        size_t p = hlen;
        for (;;) {
            char *crlf = strstr(c->buf + p, "\r\n");
            if (crlf == NULL) {
                free(body);
                free(headers);
                return 0;
            }
            size_t n = strtoul(c->buf + p, NULL, 16);
            size_t data = (size_t)(crlf - c->buf) + 2;
            if (data + n + 2 > c->len) {
                free(body);
                free(headers);
                return 0;
            }
            memcpy(body + blen, c->buf + data, n);
            blen += n;
            p = data + n + 2;
            if (n == 0) {
                break;
            }
        }
        used = p;
    } else if (cl[0] != '\0') {
        size_t n = strtoul(cl, NULL, 10);
        if (hlen + n > c->len) {
            free(headers);
            return 0;
        }
        body = malloc(n + 1);
        memcpy(body, c->buf + hlen, n);
        blen = n;
        used = hlen + n;
    } else {
        if (!c->eof) {
            free(headers);
            return 0;
        }
        blen = c->len - hlen;
        body = malloc(blen + 1);
        memcpy(body, c->buf + hlen, blen);
        used = c->len;
    }
    body[blen] = '\0';
    r->status = status;
    r->headers = headers;
    r->body = body;
    r->body_len = blen;
    r->closed = strcasecmp(conn, "close") == 0;
    memmove(c->buf, c->buf + used, c->len - used);
    c->len -= used;
    return 1;
}

/* Reads one whole response. timeout_ms bounds a wait in which no byte comes (a hang), not the
 * whole response: a long stream on a loaded machine (a 400-token stream under ASan at load 10
 * took over 30 s) is slow, not hung. Returns its status, or -1. */
static inline int rtc_read(struct rtc_conn *c, struct rtc_resp *r, int timeout_ms)
{
    memset(r, 0, sizeof(*r));
    r->status = -1;
    double deadline = h_ms() + timeout_ms;
    for (;;) {
        int rc = rtc_parse(c, r, 0);
        if (rc != 0) {
            return rc == 1 ? r->status : -1;
        }
        int left = (int)(deadline - h_ms());
        if (left <= 0) {
            return -1;
        }
        int n = rtc_fill(c, left);
        if (n == 0) {
            rc = rtc_parse(c, r, 0);
            return rc == 1 ? r->status : -1;
        }
        if (n > 0) {
            deadline = h_ms() + timeout_ms; /* progress */
        }
        if (n < 0 && h_ms() >= deadline) {
            return -1;
        }
    }
}

/* One request on a new connection (Connection: close). body may be NULL for
 * GET. Returns the status, or -1. */
static inline int rtc_request(int port, const char *method, const char *path, const char *body,
                              const char *extra_headers, struct rtc_resp *r, int timeout_ms)
{
    struct rtc_conn c;
    memset(r, 0, sizeof(*r));
    r->status = -1;
    if (rtc_connect(&c, port) != 0) {
        return -1;
    }
    size_t blen = body ? strlen(body) : 0;
    char *req = malloc(blen + 1024);
    int n = snprintf(req, 1024,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, extra_headers ? extra_headers : "", blen);
    memcpy(req + n, body ? body : "", blen);
    int rc = rtc_send(&c, req, (size_t)n + blen);
    free(req);
    if (rc == 0) {
        rc = rtc_read(&c, r, timeout_ms);
    }
    rtc_close(&c);
    return rc < 0 ? -1 : r->status;
}

static inline int rtc_post(int port, const char *path, const char *json, struct rtc_resp *r)
{
    return rtc_request(port, "POST", path, json, NULL, r, 60000);
}

static inline int rtc_get(int port, const char *path, struct rtc_resp *r)
{
    return rtc_request(port, "GET", path, NULL, NULL, r, 10000);
}

/* The n-th (0-based) "data: " payload of an SSE body, copied to a new
 * string, or NULL past the end. */
static inline char *rtc_sse_event(const char *body, int n)
{
    const char *p = body;
    for (int i = 0; p != NULL; i++) {
        p = strstr(p, "data: ");
        if (p == NULL) {
            return NULL;
        }
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (i == n) {
            return strndup(p, e ? (size_t)(e - p) : strlen(p));
        }
        p = e;
    }
    return NULL;
}

/* Starts tandem-router through the harness on a free HTTP port with args
 * (NULL-terminated); *port gets the port. Returns 0 or -1. */
static inline int rtc_spawn_router(struct h_proc *p, const char *const *args, int *port)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        int free_port = rtc_free_port();
        char port_s[16];
        snprintf(port_s, sizeof(port_s), "%d", free_port);
        const char *a[48];
        int n = 0;
        a[n++] = "--port";
        a[n++] = port_s;
        for (int i = 0; args && args[i] && n < 46; i++) {
            a[n++] = args[i];
        }
        a[n] = NULL;
        if (h_spawn(p, "tandem-router", a, 20000) == 0) {
            *port = free_port;
            return 0;
        }
    }
    return -1;
}

/* Polls GET /health until healthy_endpoints reaches want (or timeout_ms).
 * Returns the last count seen, -1 if the router never answered. */
static inline int rtc_wait_healthy(int port, int want, int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    int last = -1;
    for (;;) {
        struct rtc_resp r;
        if (rtc_get(port, "/health", &r) == 200) {
            const char *h = strstr(r.body, "\"healthy_endpoints\":");
            if (h != NULL) {
                last = atoi(h + 20);
            }
        }
        rtc_resp_free(&r);
        if (last >= want || h_ms() >= deadline) {
            return last;
        }
        h_sleep_ms(20);
    }
}

/* ---- The single-process engine, for expected outputs
 * ------------------------------------------------------ */

/* h_reference_run for one prompt: greedy, ignore_eos, max_tokens ids and
 * their logprobs. Returns 0 or an error. */
static inline int ref_run(const uint32_t *prompt, int n, int max_tokens, uint32_t *ids, float *lps)
{
    struct h_ref_req r = {
        .prompt = prompt, .n_prompt = n, .max_tokens = max_tokens, .ids = ids, .lps = lps};
    return h_reference_run(&r, 1);
}

/* ids decoded the way the router does (router/openai's decoder, byte-level
 * tokenizer). Returns a new string. */
static inline char *decode_text(const uint32_t *ids, int n, uint32_t prev)
{
    struct tokenizer *tok;
    tok_create_bytes(&tok);
    struct oa_textdec dec;
    oa_textdec_init(&dec, tok, prev, NULL, NULL, 0);
    size_t cap = (size_t)(n + 1) * OA_TEXTDEC_OUT_MAX, len = 0;
    char *text = malloc(cap + 1);
    for (int i = 0; i < n; i++) {
        len += (size_t)oa_textdec_push(&dec, ids[i], text + len, cap - len);
    }
    len += (size_t)oa_textdec_flush(&dec, text + len, cap - len);
    text[len] = '\0';
    tok_destroy(tok);
    return text;
}

/* The engine's text for prompt; logprobs into lps (max_tokens) if not NULL. */
static inline char *reference_text(const uint32_t *prompt, int n, int max_tokens, float *lps)
{
    uint32_t *ids = calloc((size_t)max_tokens, sizeof(*ids));
    float *l = calloc((size_t)max_tokens, sizeof(*l));
    char *text = NULL;
    if (ref_run(prompt, n, max_tokens, ids, l) == 0) {
        text = decode_text(ids, max_tokens, prompt[n - 1]);
        if (lps != NULL) {
            memcpy(lps, l, (size_t)max_tokens * sizeof(*l));
        }
    }
    free(ids);
    free(l);
    return text;
}

#endif
