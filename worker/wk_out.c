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

static void schedule(struct wk_out *o);

/* See wk_out.h: a copy made by wire_handoff on links that ask for it. */
static int handoff(struct wk_out *o, nng_msg *msg)
{
    if (o->handoff_copy) {
        return wire_handoff(o->sock, msg, NNG_FLAG_NONBLOCK);
    }
    return nng_sendmsg(o->sock, msg, NNG_FLAG_NONBLOCK);
}

/* Sends from the head while NNG takes messages and they are due. */
static void drain(struct wk_out *o)
{
    uint64_t now = uv_hrtime();
    while (o->n > 0) {
        struct wk_out_item *it = &o->q[o->head];
        if (it->due_ns > now) {
            break;
        }
        size_t len = nng_msg_len(it->msg);
        int rv = handoff(o, it->msg);
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
    schedule(o);
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

static void on_due(uv_timer_t *t)
{
    struct wk_out *o = t->data;
    o->timing = 0;
    drain(o);
}

/* Polls the send fd while the head is due, or times the head's release. */
static void schedule(struct wk_out *o)
{
    if (o->closed) {
        return;
    }
    uint64_t now = uv_hrtime();
    int due = o->n > 0 && o->q[o->head].due_ns <= now;
    if (due && !o->polling) {
        uv_poll_start(&o->poll, UV_READABLE, on_writable);
        o->polling = 1;
    } else if (!due && o->polling) {
        uv_poll_stop(&o->poll);
        o->polling = 0;
    }
    if (o->n > 0 && !due) {
        uint64_t wait_ns = o->q[o->head].due_ns - now;
        uv_timer_start(&o->timer, on_due, (wait_ns + 999999) / 1000000, 0);
        o->timing = 1;
    } else if (o->timing) {
        uv_timer_stop(&o->timer);
        o->timing = 0;
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
    uv_timer_init(loop, &o->timer);
    uv_prepare_init(loop, &o->prepare);
    o->poll.data = o;
    o->timer.data = o;
    o->prepare.data = o;
    return 0;
}

static int push(struct wk_out *o, nng_msg *msg, uint64_t due_ns)
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
    it->due_ns = due_ns;
    o->n++;
    o->bytes += nng_msg_len(msg);
    return 0;
}

static int send_one(struct wk_out *o, nng_msg *msg, uint64_t due_ns)
{
    if (o->closed) {
        nng_msg_free(msg);
        o->dropped++;
        return TANDEM_ECLOSED;
    }
    if (o->n == 0 && due_ns <= uv_hrtime()) {
        int rv = handoff(o, msg);
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
    int rc = push(o, msg, due_ns);
    if (rc != 0) {
        nng_msg_free(msg);
        o->dropped++;
        return rc;
    }
    schedule(o);
    return 0;
}

/* Drops the batch's messages (counted as dropped). */
static void batch_drop(struct wk_out *o)
{
    for (size_t i = 0; i < o->n_batch; i++) {
        nng_msg_free(o->batch[i]);
    }
    o->dropped += o->n_batch;
    o->n_batch = 0;
    o->batch_bytes = 0;
    uv_prepare_stop(&o->prepare);
}

void wk_out_flush(struct wk_out *o)
{
    size_t n = o->n_batch;
    if (n == 0) {
        return;
    }
    nng_msg *msg = o->batch[0];
    if (n > 1) {
        int rc = wire_batch_pack_msg(o->batch, n, &msg);
        if (rc != 0) {
            LOG_WARN("wk", "cannot batch %zu messages: %s (%s); dropped", n, tandem_strerror(rc),
                     wire_error_detail());
            batch_drop(o);
            return;
        }
        for (size_t i = 0; i < n; i++) {
            nng_msg_free(o->batch[i]);
        }
    }
    o->n_batch = 0;
    o->batch_bytes = 0;
    uv_prepare_stop(&o->prepare);
    int rc = send_one(o, msg, 0);
    if (rc != 0) {
        LOG_WARN("wk", "dropped %zu messages for the peer: %s", n, tandem_strerror(rc));
        o->dropped += n - 1; /* send_one counted the message itself */
    }
}

static void on_prepare(uv_prepare_t *h)
{
    wk_out_flush(h->data);
}

int wk_out_coalesce(struct wk_out *o, int on)
{
    if (on && o->batch == NULL) {
        o->batch = malloc(WIRE_MAX_BATCH * sizeof(*o->batch));
        if (o->batch == NULL) {
            return TANDEM_ENOMEM;
        }
    }
    if (!on) {
        wk_out_flush(o);
    }
    o->coalesce = on != 0;
    return 0;
}

int wk_out_send_at(struct wk_out *o, nng_msg *msg, uint64_t due_ns)
{
    size_t len = nng_msg_len(msg);
    if (o->coalesce && !o->closed && due_ns == 0 && len <= WK_OUT_BATCH_BYTES) {
        if (o->n_batch == WIRE_MAX_BATCH || o->batch_bytes + len > WK_OUT_BATCH_BYTES) {
            wk_out_flush(o);
        }
        if (o->n_batch == 0) {
            uv_prepare_start(&o->prepare, on_prepare);
        }
        o->batch[o->n_batch++] = msg;
        o->batch_bytes += len;
        return 0;
    }
    wk_out_flush(o); /* what was sent before leaves before */
    return send_one(o, msg, due_ns);
}

int wk_out_send(struct wk_out *o, nng_msg *msg)
{
    return wk_out_send_at(o, msg, 0);
}

void wk_out_clear(struct wk_out *o)
{
    batch_drop(o);
    for (size_t i = 0; i < o->n; i++) {
        item_drop(o, i);
    }
    o->n = 0;
    o->head = 0;
    schedule(o);
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
    return o->n + o->n_batch;
}

static void on_closed(uv_handle_t *h)
{
    struct wk_out *o = h->data;
    if (--o->closing == 0) {
        o->close_cb((uv_handle_t *)&o->poll);
    }
}

void wk_out_close(struct wk_out *o, uv_close_cb cb)
{
    wk_out_clear(o);
    if (o->polling) {
        uv_poll_stop(&o->poll);
        o->polling = 0;
    }
    if (o->timing) {
        uv_timer_stop(&o->timer);
        o->timing = 0;
    }
    o->closed = 1;
    free(o->q);
    o->q = NULL;
    o->cap = 0;
    free(o->batch);
    o->batch = NULL;
    o->coalesce = 0;
    o->close_cb = cb;
    o->closing = 3;
    uv_close((uv_handle_t *)&o->poll, on_closed);
    uv_close((uv_handle_t *)&o->timer, on_closed);
    uv_close((uv_handle_t *)&o->prepare, on_closed);
}
