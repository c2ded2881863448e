#include "wk_out.h"

#include <stdlib.h>

#include "log.h"
#include "tandem_err.h"
#include "wire.h"

static void item_drop(struct wk_out *o, size_t i)
{
    struct wk_out_item *it = &o->q[(o->head + i) % o->cap];
    o->bytes -= nng_msg_len(it->msg);
    nng_msg_free(it->msg);
    it->msg = NULL;
    o->dropped++;
}

static void poll_update(struct wk_out *o);

/* Sends from the head while NNG takes messages. */
static void drain(struct wk_out *o)
{
    while (o->n > 0) {
        struct wk_out_item *it = &o->q[o->head];
        size_t len = nng_msg_len(it->msg);
        int rv = nng_sendmsg(o->sock, it->msg, NNG_FLAG_NONBLOCK);
        if (rv == NNG_EAGAIN) {
            break;
        }
        if (rv != 0) {
            LOG_WARN("wk", "send failed: %s; dropping %zu queued messages", nng_strerror(rv), o->n);
            wk_out_clear(o);
            break;
        }
        it->msg = NULL;
        o->bytes -= len;
        o->sent++;
        o->head = (o->head + 1) % o->cap;
        o->n--;
    }
    poll_update(o);
}

static void on_writable(uv_poll_t *h, int status, int events)
{
    (void)events;
    struct wk_out *o = h->data;
    if (status < 0) {
        LOG_WARN("wk", "send poll: %s", uv_strerror(status));
    }
    drain(o);
}

static void poll_update(struct wk_out *o)
{
    if (o->closed) {
        return;
    }
    if (o->n > 0 && !o->polling) {
        uv_poll_start(&o->poll, UV_READABLE, on_writable);
        o->polling = 1;
    } else if (o->n == 0 && o->polling) {
        uv_poll_stop(&o->poll);
        o->polling = 0;
    }
}

int wk_out_init(uv_loop_t *loop, struct wk_out *o, nng_socket sock, size_t max_bytes)
{
    *o = (struct wk_out){.sock = sock, .max_bytes = max_bytes};
    int fd;
    if (nng_socket_get_int(sock, NNG_OPT_SENDFD, &fd) != 0) {
        return TANDEM_ENNG;
    }
    if (uv_poll_init(loop, &o->poll, fd) != 0) {
        return TANDEM_EUV;
    }
    o->poll.data = o;
    return 0;
}

static int push(struct wk_out *o, nng_msg *msg)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        struct wk_out_item *q = malloc(cap * sizeof(*q));
        if (q == NULL) {
            return TANDEM_ENOMEM;
        }
        for (size_t i = 0; i < o->n; i++) {
            q[i] = o->q[(o->head + i) % o->cap];
        }
        free(o->q);
        o->q = q;
        o->cap = cap;
        o->head = 0;
    }
    struct wk_out_item *it = &o->q[(o->head + o->n) % o->cap];
    it->msg = msg;
    it->queued_ms = uv_now(o->poll.loop);
    o->n++;
    o->bytes += nng_msg_len(msg);
    return 0;
}

int wk_out_send(struct wk_out *o, nng_msg *msg)
{
    if (o->closed) {
        nng_msg_free(msg);
        o->dropped++;
        return TANDEM_ECLOSED;
    }
    if (o->n == 0) {
        int rv = nng_sendmsg(o->sock, msg, NNG_FLAG_NONBLOCK);
        if (rv == 0) {
            o->sent++;
            return 0;
        }
        if (rv != NNG_EAGAIN) {
            nng_msg_free(msg);
            o->dropped++;
            return wire_nng_err(rv);
        }
    }
    if (o->bytes + nng_msg_len(msg) > o->max_bytes) {
        nng_msg_free(msg);
        o->dropped++;
        return TANDEM_EBUSY;
    }
    int rc = push(o, msg);
    if (rc != 0) {
        nng_msg_free(msg);
        o->dropped++;
        return rc;
    }
    poll_update(o);
    return 0;
}

void wk_out_clear(struct wk_out *o)
{
    for (size_t i = 0; i < o->n; i++) {
        item_drop(o, i);
    }
    o->n = 0;
    o->head = 0;
    poll_update(o);
}

size_t wk_out_expire(struct wk_out *o, uint64_t now_ms, uint64_t max_age_ms)
{
    if (o->n == 0 || now_ms - o->q[o->head].queued_ms <= max_age_ms) {
        return 0;
    }
    size_t n = o->n;
    wk_out_clear(o);
    return n;
}

size_t wk_out_pending(const struct wk_out *o)
{
    return o->n;
}

void wk_out_close(struct wk_out *o, uv_close_cb cb)
{
    wk_out_clear(o);
    if (o->polling) {
        uv_poll_stop(&o->poll);
        o->polling = 0;
    }
    o->closed = 1;
    free(o->q);
    o->q = NULL;
    o->cap = 0;
    uv_close((uv_handle_t *)&o->poll, cb);
}
