/* A PAIR0 control link on the libuv loop: see uvsp.h. */
#include "uvsp.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "log.h"
#include "tandem_err.h"

#define SP_HEADER_BYTES 8
#define READ_CHUNK      (64u << 10) /* room offered to each read, at least */
#define KEEP_BUF        (1u << 20)  /* a larger empty read buffer is freed */

struct uvsp_conn {
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } u;
    uv_connect_t connect;
    struct uvsp *sp; /* NULL once detached (dropped or closed) */
    int up;          /* the peer's SP header was read */
    int pipe;        /* id once up */
    uint8_t *buf;    /* (cap) bytes read, len of them not yet consumed */
    size_t cap, len;
    size_t need; /* bytes the frame at buf[0] needs in all (0: a header's worth) */
};

struct uvsp_write {
    uv_write_t req;
    nng_msg *msg;
    uint8_t head[9];
};

static const uint8_t our_header[SP_HEADER_BYTES] = {
    0, 'S', 'P', 0, (uint8_t)(UVSP_PAIR0 >> 8), (uint8_t)(UVSP_PAIR0 & 0xff), 0, 0};

static int next_pipe_id(void)
{
    static int last;
    int id = __atomic_add_fetch(&last, 1, __ATOMIC_RELAXED) & 0x7fffffff;
    return id != 0 ? id : next_pipe_id();
}

/* ---- Addresses ----------------------------------------------------------- */

/* Parses url into sp's address; 0 or TANDEM_EINVAL. */
static int parse_url(struct uvsp *sp, const char *url)
{
    if (strlen(url) >= sizeof(sp->url)) {
        return TANDEM_EINVAL;
    }
    if (strncmp(url, "ipc://", 6) == 0) {
        const char *path = url + 6;
        if (path[0] == '\0' || strlen(path) >= sizeof(sp->path)) {
            return TANDEM_EINVAL;
        }
        sp->ipc = 1;
        snprintf(sp->path, sizeof(sp->path), "%s", path);
        return 0;
    }
    if (strncmp(url, "tcp://", 6) != 0) {
        return TANDEM_EINVAL;
    }
    const char *host = url + 6, *colon;
    char ip[INET6_ADDRSTRLEN];
    size_t n;
    if (host[0] == '[') {
        const char *end = strchr(host, ']');
        if (end == NULL || end[1] != ':') {
            return TANDEM_EINVAL;
        }
        host++;
        n = (size_t)(end - host);
        colon = end + 1;
    } else {
        colon = strrchr(host, ':');
        if (colon == NULL) {
            return TANDEM_EINVAL;
        }
        n = (size_t)(colon - host);
    }
    if (n == 0 || n >= sizeof(ip)) {
        return TANDEM_EINVAL;
    }
    memcpy(ip, host, n);
    ip[n] = '\0';
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end != '\0' || port == 0 || port > 65535) {
        return TANDEM_EINVAL;
    }
    /* inet_pton, not uv_ip4_addr alone: that takes "1.2" as inet_aton does,
     * and NNG would not. Anything else is a host name: NNG resolves those. */
    struct in6_addr a;
    memset(&sp->addr, 0, sizeof(sp->addr));
    if (inet_pton(AF_INET, ip, &a) == 1) {
        uv_ip4_addr(ip, (int)port, (struct sockaddr_in *)&sp->addr);
    } else if (inet_pton(AF_INET6, ip, &a) == 1) {
        uv_ip6_addr(ip, (int)port, (struct sockaddr_in6 *)&sp->addr);
    } else {
        return TANDEM_EINVAL;
    }
    sp->ipc = 0;
    return 0;
}

int uvsp_url_ok(const char *url)
{
    struct uvsp sp;
    return url != NULL && parse_url(&sp, url) == 0;
}

/* ---- Connections --------------------------------------------------------- */

static void dial(struct uvsp *sp);

static void on_conn_closed(uv_handle_t *h)
{
    struct uvsp_conn *c = h->data;
    free(c->buf);
    free(c);
}

static void on_retry(uv_timer_t *t)
{
    struct uvsp *sp = t->data;
    if (!sp->closing && sp->conn == NULL) {
        dial(sp);
    }
}

/* Ends connection c of sp (why: NULL for an expected end, else logged) and
 * dials again after the backoff. pipe_cb runs last: it may close sp. */
static void conn_end(struct uvsp *sp, struct uvsp_conn *c, const char *why)
{
    int was_up = c->up, pipe = c->pipe;
    c->sp = NULL;
    if (sp->conn == c) {
        sp->conn = NULL;
    }
    uv_close(&c->u.h, on_conn_closed);
    if (why != NULL) {
        sp->dropped++;
        if (sp->dropped <= 5 || sp->dropped % 100 == 0) {
            LOG_WARN("uvsp", "%s: disconnected (%llu times): %s", sp->url,
                     (unsigned long long)sp->dropped, why);
        }
    }
    if (!sp->closing) {
        uv_timer_start(&sp->timer, on_retry, sp->wait_ms, 0);
        sp->wait_ms = sp->wait_ms * 2 < sp->max_ms ? sp->wait_ms * 2 : sp->max_ms;
    }
    if (was_up && sp->pipe_cb != NULL) {
        sp->pipe_cb(sp, pipe, 0);
    }
}

/* NNG's name of an SP protocol id (NNI_PROTO(major, minor)), for the log. */
static const char *proto_name(unsigned proto)
{
    switch (proto) {
    case 0x10:
        return "PAIR0";
    case 0x11:
        return "PAIR1";
    case 0x20:
        return "PUB0";
    case 0x21:
        return "SUB0";
    case 0x30:
        return "REQ0";
    case 0x31:
        return "REP0";
    case 0x50:
        return "PUSH0";
    case 0x51:
        return "PULL0";
    case 0x62:
        return "SURVEYOR0";
    case 0x63:
        return "RESPONDENT0";
    case 0x70:
        return "BUS0";
    default:
        return "unknown";
    }
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = v << 8 | p[i];
    }
    return v;
}

/* Delivers every whole frame in c->buf; 0, or -1 once c was ended. */
static int deliver(struct uvsp *sp, struct uvsp_conn *c)
{
    size_t off = 0, head = sp->ipc ? 9 : 8;
    char why[192];
    while (c->sp == sp) {
        const uint8_t *p = c->buf + off;
        size_t avail = c->len - off;
        if (!c->up) {
            if (avail < SP_HEADER_BYTES) {
                c->need = SP_HEADER_BYTES;
                break;
            }
            if (p[0] != 0 || p[1] != 'S' || p[2] != 'P' || p[3] != 0 || p[6] != 0 || p[7] != 0) {
                conn_end(sp, c,
                         "the peer is not an SP (NNG) socket: is this a worker's control address "
                         "(its --control)?");
                return -1;
            }
            unsigned proto = (unsigned)p[4] << 8 | p[5];
            if (proto != UVSP_PAIR0) {
                snprintf(why, sizeof(why),
                         "the peer speaks SP protocol 0x%04x (%s), not PAIR0: is this a worker's "
                         "control address (its --control)? A router's --announce is PULL0",
                         proto, proto_name(proto));
                conn_end(sp, c, why);
                return -1;
            }
            off += SP_HEADER_BYTES;
            c->up = 1;
            c->pipe = next_pipe_id();
            sp->pipes++;
            sp->wait_ms = sp->min_ms;
            if (sp->pipe_cb != NULL) {
                sp->pipe_cb(sp, c->pipe, 1);
            }
            continue;
        }
        if (avail < head) {
            c->need = head;
            break;
        }
        if (sp->ipc && p[0] != 1) {
            snprintf(why, sizeof(why), "a frame of type %u (ipc messages are type 1)", p[0]);
            conn_end(sp, c, why);
            return -1;
        }
        uint64_t n = get_be64(p + head - 8);
        if (n > sp->max_msg) {
            snprintf(why, sizeof(why), "a %llu-byte message, over the %zu-byte limit",
                     (unsigned long long)n, sp->max_msg);
            conn_end(sp, c, why);
            return -1;
        }
        if (avail - head < n) {
            c->need = head + (size_t)n;
            break;
        }
        off += head + (size_t)n;
        sp->recv_cb(sp, p + head, (size_t)n, c->pipe);
    }
    if (c->sp != sp) {
        return -1;
    }
    c->len -= off;
    if (c->len > 0 && off > 0) {
        memmove(c->buf, c->buf + off, c->len);
    } else if (c->len == 0 && c->cap > KEEP_BUF) {
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
    return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct uvsp_conn *c = h->data;
    size_t want = c->need > c->len ? c->need - c->len : 0;
    if (want < READ_CHUNK) {
        want = READ_CHUNK;
    }
    if (c->cap - c->len < want) {
        uint8_t *nb = realloc(c->buf, c->len + want);
        if (nb == NULL) {
            *buf = uv_buf_init(NULL, 0); /* the read fails with UV_ENOBUFS */
            return;
        }
        c->buf = nb;
        c->cap = c->len + want;
    }
    *buf = uv_buf_init((char *)c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    struct uvsp_conn *c = s->data;
    struct uvsp *sp = c->sp;
    if (sp == NULL || nread == 0) {
        return;
    }
    if (nread < 0) {
        char why[192];
        snprintf(why, sizeof(why), "cannot read: %s", uv_strerror((int)nread));
        /* The peer closing (a worker stopping, or refusing a second router)
         * is the ordinary end of a pipe; NNG does not report it either. */
        conn_end(sp, c, nread == UV_EOF || nread == UV_ECONNRESET ? NULL : why);
        return;
    }
    c->len += (size_t)nread;
    deliver(sp, c);
}

static void on_written(uv_write_t *req, int status)
{
    struct uvsp_write *w = (struct uvsp_write *)req;
    struct uvsp_conn *c = req->handle->data;
    if (w->msg != NULL) {
        nng_msg_free(w->msg);
    }
    free(w);
    if (status < 0 && status != UV_ECANCELED && c->sp != NULL) {
        conn_end(c->sp, c, NULL); /* the read side says why, if anything */
    }
}

static void on_connect(uv_connect_t *req, int status)
{
    struct uvsp_conn *c = req->data;
    struct uvsp *sp = c->sp;
    if (sp == NULL) {
        return; /* closed while dialing */
    }
    if (status < 0) {
        LOG_DEBUG("uvsp", "%s: cannot connect: %s", sp->url, uv_strerror(status));
        conn_end(sp, c, NULL);
        return;
    }
    if (!sp->ipc) {
        uv_tcp_nodelay(&c->u.tcp, 1); /* as NNG's tcp:// */
    }
    struct uvsp_write *w = calloc(1, sizeof(*w));
    uv_buf_t b = uv_buf_init((char *)our_header, sizeof(our_header));
    if (w != NULL && uv_write(&w->req, &c->u.s, &b, 1, on_written) != 0) {
        free(w); /* no callback will */
        w = NULL;
    }
    if (w == NULL || uv_read_start(&c->u.s, on_alloc, on_read) != 0) {
        conn_end(sp, c, "cannot start the handshake");
    }
}

static void dial(struct uvsp *sp)
{
    struct uvsp_conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        uv_timer_start(&sp->timer, on_retry, sp->max_ms, 0);
        return;
    }
    c->sp = sp;
    c->connect.data = c;
    int rc = sp->ipc ? uv_pipe_init(sp->loop, &c->u.pipe, 0) : uv_tcp_init(sp->loop, &c->u.tcp);
    if (rc != 0) {
        free(c);
        uv_timer_start(&sp->timer, on_retry, sp->max_ms, 0);
        return;
    }
    c->u.h.data = c;
    sp->conn = c;
    sp->dials++;
    if (sp->ipc) {
        uv_pipe_connect(&c->connect, &c->u.pipe, sp->path, on_connect);
        return;
    }
    rc = uv_tcp_connect(&c->connect, &c->u.tcp, (const struct sockaddr *)&sp->addr, on_connect);
    if (rc != 0) {
        LOG_DEBUG("uvsp", "%s: cannot connect: %s", sp->url, uv_strerror(rc));
        conn_end(sp, c, NULL);
    }
}

/* ---- API ------------------------------------------------------------------ */

int uvsp_open(uv_loop_t *loop, struct uvsp *sp, const char *url, size_t max_msg,
              uvsp_recv_cb recv_cb, uvsp_pipe_cb pipe_cb, void *data)
{
    memset(sp, 0, sizeof(*sp));
    if (url == NULL || recv_cb == NULL || parse_url(sp, url) != 0) {
        return TANDEM_EINVAL;
    }
    snprintf(sp->url, sizeof(sp->url), "%s", url);
    if (uv_timer_init(loop, &sp->timer) != 0) {
        return TANDEM_EUV;
    }
    sp->timer.data = sp;
    sp->loop = loop;
    sp->max_msg = max_msg;
    sp->min_ms = sp->wait_ms = 100;
    sp->max_ms = 1000;
    sp->recv_cb = recv_cb;
    sp->pipe_cb = pipe_cb;
    sp->data = data;
    dial(sp);
    return 0;
}

void uvsp_set_backoff(struct uvsp *sp, uint64_t min_ms, uint64_t max_ms)
{
    sp->min_ms = min_ms;
    sp->max_ms = max_ms > min_ms ? max_ms : min_ms;
    if (sp->wait_ms < sp->min_ms) {
        sp->wait_ms = sp->min_ms;
    } else if (sp->wait_ms > sp->max_ms) {
        sp->wait_ms = sp->max_ms;
    }
}

int uvsp_send(struct uvsp *sp, nng_msg *msg)
{
    struct uvsp_conn *c = sp->conn;
    if (c == NULL || !c->up) {
        return TANDEM_ENOENT;
    }
    if (uv_stream_get_write_queue_size(&c->u.s) > UVSP_MAX_QUEUED) {
        return TANDEM_ETIMEOUT;
    }
    struct uvsp_write *w = malloc(sizeof(*w));
    if (w == NULL) {
        return TANDEM_ENOMEM;
    }
    size_t n = nng_msg_len(msg), head = sp->ipc ? 9 : 8;
    uint8_t *p = w->head;
    if (sp->ipc) {
        *p++ = 1;
    }
    for (int i = 7; i >= 0; i--) {
        p[7 - i] = (uint8_t)((uint64_t)n >> (8 * i));
    }
    uv_buf_t b[2] = {uv_buf_init((char *)w->head, (unsigned)head),
                     uv_buf_init(nng_msg_body(msg), (unsigned)n)};
    w->msg = msg;
    if (uv_write(&w->req, &c->u.s, b, n > 0 ? 2 : 1, on_written) != 0) {
        free(w);
        return TANDEM_ENOENT;
    }
    return 0;
}

int uvsp_pipe(const struct uvsp *sp)
{
    return sp->conn != NULL && sp->conn->up ? sp->conn->pipe : 0;
}

int uvsp_drop(struct uvsp *sp, int pipe)
{
    if (pipe == 0 || uvsp_pipe(sp) != pipe) {
        return TANDEM_ENOENT;
    }
    conn_end(sp, sp->conn, NULL);
    return 0;
}

static void on_timer_closed(uv_handle_t *h)
{
    struct uvsp *sp = h->data;
    if (sp->close_cb != NULL) {
        sp->close_cb(sp);
    }
}

void uvsp_close(struct uvsp *sp, uvsp_close_cb cb)
{
    sp->closing = 1;
    sp->close_cb = cb;
    struct uvsp_conn *c = sp->conn;
    if (c != NULL) {
        c->sp = NULL;
        sp->conn = NULL;
        uv_close(&c->u.h, on_conn_closed);
    }
    uv_timer_stop(&sp->timer);
    uv_close((uv_handle_t *)&sp->timer, on_timer_closed);
}
