/* An ordered outbound queue on an NNG socket, driven by a libuv loop.
 *
 * Sends never block the loop: wk_out_send tries a non-blocking send and, when
 * NNG cannot take the message yet (its send buffer is full, or a PUSH socket
 * has no pipe), queues it; a uv_poll_t on the socket's send fd
 * (NNG_OPT_SENDFD, readable while a send would succeed) drains the queue in
 * order. The poll handle is active only while the head of the queue is due,
 * so an idle worker does not wake up for it. Order is preserved: once
 * something is queued, later messages queue behind it. The queue is bounded
 * in bytes; beyond the bound a message is refused.
 *
 * Coalescing (wk_out_coalesce, control links to a peer that takes BATCH
 * envelopes): messages sent in one turn of the loop wait in a batch and leave
 * as one BATCH message (wire_batch_pack_msg; a lone message leaves as it is)
 * when the loop is about to block (a uv_prepare_t), at wk_out_flush, when
 * the batch is full, or before anything sent with a release time. Each NNG
 * message costs both processes a trip through NNG's threads; a decode step
 * that ends a dozen requests' chunks sends one.
 *
 * A message may carry a release time (wk_out_send_at): it is not handed to
 * NNG before then, and neither is anything queued after it. The sim backend
 * uses it to model the KV link's bandwidth and latency (a uv_timer_t wakes
 * the queue when the head is due).
 *
 * Threading: loop thread only. The socket stays the owner's (close it after
 * wk_out_close). */
#ifndef TANDEM_WK_OUT_H
#define TANDEM_WK_OUT_H

#include <nng/nng.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct wk_out_item {
    nng_msg *msg;
    uint64_t queued_ms; /* uv_now when queued */
    uint64_t due_ns;    /* uv_hrtime before which it is not sent (0: now) */
};

struct wk_out {
    uv_poll_t poll;   /* on the send fd; active while the head is due */
    uv_timer_t timer; /* wakes the queue when a held head becomes due */
    nng_socket sock;
    struct wk_out_item *q; /* (cap) ring */
    size_t head, n, cap;
    size_t bytes;     /* queued message bytes */
    size_t max_bytes; /* bound on bytes */
    int polling;
    int timing;
    int closed;
    int closing;      /* handles still to close */
    uint64_t sent;    /* messages handed to NNG */
    uint64_t dropped; /* refused or discarded */
    /* Hand NNG a copy of each message (wire_handoff: NNG 1.5.2 can lose a
     * message it owns, and lsan.supp names only that copy). Set on the
     * control link, where the loss was seen; off for KV frames (large). */
    int handoff_copy;
    uv_close_cb close_cb;

    /* Coalescing (wk_out_coalesce). */
    int coalesce;
    uv_prepare_t prepare; /* active while batch holds messages */
    nng_msg **batch;      /* (WIRE_MAX_BATCH) this turn's messages, in order */
    size_t n_batch;
    size_t batch_bytes;
};

/* Most bytes of envelopes in one BATCH; a longer message leaves alone. */
#define WK_OUT_BATCH_BYTES (256u << 10)

/* Starts an empty queue for sock. Returns 0, TANDEM_ENNG (no send fd) or
 * TANDEM_EUV. After success, close with wk_out_close. */
int wk_out_init(uv_loop_t *loop, struct wk_out *o, nng_socket sock, size_t max_bytes);

/* Sends or queues msg; always consumes it. Returns 0 (sent or queued),
 * TANDEM_EBUSY (queue over max_bytes: dropped), TANDEM_ECLOSED (closed),
 * TANDEM_ENOMEM, or the NNG error of a failed send (dropped). */
int wk_out_send(struct wk_out *o, nng_msg *msg);

/* As wk_out_send, but msg (and everything after it) waits until uv_hrtime()
 * reaches due_ns. */
int wk_out_send_at(struct wk_out *o, nng_msg *msg, uint64_t due_ns);

/* Turns coalescing on (the peer takes BATCH envelopes) or off (what waits
 * leaves first). Returns 0 or TANDEM_ENOMEM. */
int wk_out_coalesce(struct wk_out *o, int on);

/* Hands on the batch now (coalescing only; no-op when it is empty). */
void wk_out_flush(struct wk_out *o);

/* Drops every queued message. */
void wk_out_clear(struct wk_out *o);

/* Drops the whole queue when its oldest message has waited more than
 * max_age_ms (a peer that never takes anything). Returns messages dropped. */
size_t wk_out_expire(struct wk_out *o, uint64_t now_ms, uint64_t max_age_ms);

/* Messages waiting (queued or in the batch). */
size_t wk_out_pending(const struct wk_out *o);

/* Drops the queue and the batch and closes the handles; cb((uv_handle_t
 * *)&o->poll) runs once all are closed. */
void wk_out_close(struct wk_out *o, uv_close_cb cb);

#endif
