/* The dialing end of a PAIR0 control link, read and written by the libuv
 * loop itself, without NNG's threads.
 *
 * Through NNG, every message a worker sends the router crossed three
 * threads: NNG's poll thread read it, its task thread queued it and
 * signalled the socket's receive fd, and the loop woke to take it. At tens
 * of thousands of messages a second that hand-off was about 40% of the
 * router's CPU (docs/performance.md, "Control links the loop reads itself").
 * uvsp speaks NNG's wire protocol for PAIR0 over ipc:// and tcp://, so a
 * worker's NNG listener cannot tell it from an NNG dialer, and the loop
 * reads every message that arrived in one read.
 *
 * Wire (NNG 1.5.2, src/sp/transport/{tcp,ipc}; docs/protocol.md "Control
 * link framing"): each side first sends the 8-byte SP header 00 'S' 'P' 00,
 * its protocol id (PAIR0: 0x0010, big endian), 00 00. Then each message is
 * its length (8 bytes, big endian) and its body, on ipc:// preceded by a
 * message-type byte 0x01. PAIR0 adds no header of its own.
 *
 * Addresses: ipc://PATH and tcp://IPv4:PORT or tcp://[IPv6]:PORT
 * (uvsp_url_ok). Everything else (tls+tcp://, host names, inproc://) stays
 * on NNG through common/uvnng.
 *
 * Behaviour, as NNG's dialer:
 *   - it dials, and dials again after a failed dial or a lost connection,
 *     waiting min_ms, doubling up to max_ms (uvsp_set_backoff); a completed
 *     handshake resets the wait to min_ms;
 *   - a connection whose handshake completes is a pipe, with an id unique
 *     in the process (> 0); pipe_cb says when it comes and goes, in order
 *     with its messages;
 *   - a peer that is not a PAIR0 SP peer, sends a bad frame or a message
 *     over max_msg bytes is disconnected (logged) and dialled again, as NNG
 *     closes such a pipe.
 *
 * Sending: uvsp_send hands one message to libuv, which writes it at once
 * when the socket takes it and later otherwise. At most UVSP_MAX_QUEUED bytes
 * wait; past that uvsp_send refuses (TANDEM_ETIMEOUT) as NNG refuses a
 * non-blocking send when its buffer is full. Without a pipe it refuses with
 * TANDEM_ENOENT.
 *
 * Callbacks run on the loop thread; recv_cb's body is borrowed for the
 * call. A callback may call uvsp_drop or uvsp_close: nothing more of that
 * connection is delivered.
 *
 * Threading: the loop's thread only. Ownership: struct uvsp is embedded by
 * its owner; once uvsp_close's callback ran it may be freed. */
#ifndef TANDEM_UVSP_H
#define TANDEM_UVSP_H

#include <nng/nng.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <uv.h>

#define UVSP_PAIR0      0x0010u     /* NNG's PAIR0 protocol id (NNI_PROTO(1, 0)) */
#define UVSP_MAX_QUEUED (16u << 20) /* bytes waiting to be written, at most */
#define UVSP_MAX_URL    256

struct uvsp;
struct uvsp_conn; /* one connection (uvsp.c) */

/* A message of body[0..len) on pipe. */
typedef void (*uvsp_recv_cb)(struct uvsp *sp, const uint8_t *body, size_t len, int pipe);
/* Pipe came up (up = 1: the handshake completed) or went away (up = 0). */
typedef void (*uvsp_pipe_cb)(struct uvsp *sp, int pipe, int up);
typedef void (*uvsp_close_cb)(struct uvsp *sp);

struct uvsp {
    uv_loop_t *loop;
    uv_timer_t timer; /* the next dial */
    int ipc;          /* ipc:// (else tcp://) */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct sockaddr_storage addr;
    char url[UVSP_MAX_URL];
    size_t max_msg;
    uint64_t min_ms, max_ms, wait_ms;
    struct uvsp_conn *conn; /* dialing, handshaking or up; NULL between dials */
    uvsp_recv_cb recv_cb;
    uvsp_pipe_cb pipe_cb;
    void *data; /* for the owner */
    int closing;
    uvsp_close_cb close_cb;
    uint64_t dials, pipes, dropped; /* dials started, pipes up, peers disconnected for a fault */
};

/* 1 when uvsp can dial url (ipc://PATH, tcp://IPv4:PORT, tcp://[IPv6]:PORT),
 * else 0. Pure. */
int uvsp_url_ok(const char *url);

/* Starts dialing url on loop: messages of at most max_msg bytes go to
 * recv_cb (required), pipe events to pipe_cb (may be NULL). The backoff
 * starts at 100 ms doubling to 1 s (uvsp_set_backoff). Returns 0,
 * TANDEM_EINVAL (not a URL uvsp_url_ok takes, no recv_cb) or TANDEM_EUV; on
 * failure nothing is left open. */
int uvsp_open(uv_loop_t *loop, struct uvsp *sp, const char *url, size_t max_msg,
              uvsp_recv_cb recv_cb, uvsp_pipe_cb pipe_cb, void *data);

/* The wait before the next dials: from min_ms doubling to max_ms. */
void uvsp_set_backoff(struct uvsp *sp, uint64_t min_ms, uint64_t max_ms);

/* Sends msg (its body, framed) on the current pipe. 0: msg is ours and
 * freed once written (or once the connection is gone). Otherwise msg stays
 * the caller's: TANDEM_ENOENT (no pipe), TANDEM_ETIMEOUT (UVSP_MAX_QUEUED
 * bytes already wait), TANDEM_ENOMEM. */
int uvsp_send(struct uvsp *sp, nng_msg *msg);

/* The current pipe's id, or 0. */
int uvsp_pipe(const struct uvsp *sp);

/* Disconnects pipe (if it is the current one) and dials again after the
 * backoff; pipe_cb(pipe, 0) runs before it returns. Returns 0 or
 * TANDEM_ENOENT (not the current pipe). */
int uvsp_drop(struct uvsp *sp, int pipe);

/* Closes the connection and stops dialing; no callback runs after this but
 * cb(sp), once the handles are closed. */
void uvsp_close(struct uvsp *sp, uvsp_close_cb cb);

#endif
