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
};

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

/* Drops every queued message. */
void wk_out_clear(struct wk_out *o);

/* Drops the whole queue when its oldest message has waited more than
 * max_age_ms (a peer that never takes anything). Returns messages dropped. */
size_t wk_out_expire(struct wk_out *o, uint64_t now_ms, uint64_t max_age_ms);

/* Messages waiting. */
size_t wk_out_pending(const struct wk_out *o);

/* Drops the queue and closes both handles; cb((uv_handle_t *)&o->poll) runs
 * once both are closed. */
void wk_out_close(struct wk_out *o, uv_close_cb cb);

#endif
