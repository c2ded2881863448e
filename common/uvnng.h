/* Bridge from NNG sockets to a libuv loop, without busy polling.
 *
 * Receiving, two modes:
 * - uvnng_init (polled): NNG exposes a file descriptor (NNG_OPT_RECVFD) that
 *   is readable while a message waits on the socket; a uv_poll_t watches it
 *   and the loop drains messages with NNG_FLAG_NONBLOCK, at most UVNNG_BATCH
 *   per wake-up so one busy socket cannot starve the rest of the loop. NNG
 *   reads from a connection only what the application takes: PULL0 holds one
 *   message per pipe and reads the next only after it was taken, so a loop
 *   that blocks (a worker's scheduler step) receives one message per pipe
 *   per loop turn.
 * - uvnng_init_queued (queued): an nng_aio receive is always pending, so NNG
 *   keeps reading while the loop thread is busy. Its callback (an NNG
 *   thread) moves each message into a bounded queue under a mutex, re-arms
 *   the receive and wakes the loop with the uv_async_t; the loop hands every
 *   queued message to recv_cb. When the queue holds max_msgs messages or
 *   max_bytes bytes the receive is not re-armed until the loop has taken
 *   some: the pressure goes back through NNG to the sender (TCP window,
 *   PUSH0's send buffer); nothing is dropped.
 *
 * Pipe events: nng_pipe_notify callbacks run on NNG's threads; they are
 * queued under a mutex and delivered on the loop thread through the same
 * uv_async_t. uvnng owns the socket's pipe notifications (the owner must not
 * call nng_pipe_notify): it also counts the live pipes, for the two NNG
 * 1.5.2 bugs below.
 *
 * Dialing (uvnng_dial): NNG 1.5.2's dialer stops for good when the peer
 * dies inside the SP handshake (EPIPE read as NNG_ECLOSED, "no further
 * action": docs/reliability.md). A socket that has had no pipe, and no new
 * one, for UVNNG_REDIAL_MS gets its dialer closed and a new one started;
 * while the peer is merely down this only restarts a dial that was failing
 * anyway. A dialer whose pipes the peer keeps closing (a refusal) works and
 * is left alone: NNG 1.5.2 leaks a dialer closed mid-handshake.
 *
 * Exit (uvnng_set_exiting): NNG 1.5.2 wedges its process-wide reaper, and
 * with it every later nng_close, when a pipe is closed locally while a
 * message on it is half read (docs/nng-close-deadlock.md), which a refused or
 * redialled pipe may have done long before. Once the process is exiting,
 * uvnng_close leaves every socket open (it stops receiving and detaches every
 * callback) and the exit closes them: peers see the close a moment later.
 *
 * Ownership: struct uvnng is embedded by its owner and takes the socket:
 * uvnng_close closes it. Each received message is handed to recv_cb, which
 * owns it from then on (nng_msg_free it or send it on). */
#ifndef TANDEM_UVNNG_H
#define TANDEM_UVNNG_H

#include <nng/nng.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define UVNNG_BATCH 64
/* A dialing socket without a pipe for this long gets a new dialer. */
#define UVNNG_REDIAL_MS 3000

struct uvnng_tap; /* what NNG's pipe callbacks hold (uvnng.c) */

struct uvnng;

/* Loop thread. The callee owns msg. */
typedef void (*uvnng_recv_cb)(struct uvnng *u, nng_msg *msg);
/* Loop thread. ev is NNG_PIPE_EV_ADD_POST or NNG_PIPE_EV_REM_POST. */
typedef void (*uvnng_pipe_cb)(struct uvnng *u, nng_pipe pipe, nng_pipe_ev ev);

struct uvnng_pipe_event {
    nng_pipe pipe;
    nng_pipe_ev ev;
};

/* Queued mode's counters (uvnng_queue_stats). Bytes are nng_msg_len plus
 * the header. */
struct uvnng_stats {
    uint64_t received; /* messages taken from NNG */
    uint64_t pauses;   /* times the receive waited for the loop (queue full) */
    int depth;         /* messages queued now */
    size_t bytes;      /* bytes queued now */
    int peak_depth;    /* most messages queued at once */
    size_t peak_bytes; /* most bytes queued at once */
};

struct uvnng {
    uv_poll_t poll;
    uv_async_t async;
    nng_socket sock;
    uvnng_recv_cb recv_cb;
    uvnng_pipe_cb pipe_cb;
    void *data; /* for the owner */
    pthread_mutex_t mu;
    struct uvnng_pipe_event *events; /* (cap) queued pipe events, under mu */
    int n_events;
    int cap_events;
    int open_handles; /* handles still to close */
    uv_close_cb close_cb;
    struct uvnng_tap *tap; /* NULL once closed or left open */
    int n_pipes;           /* pipes past NNG_PIPE_EV_ADD_PRE and not yet removed, under mu */
    uint64_t pipe_adds;    /* pipes ever past NNG_PIPE_EV_ADD_PRE, under mu */

    /* uvnng_dial only. */
    uv_timer_t redial;
    int dialing;
    char *dial_url;
    nng_dialer dialer;
    uint64_t lonely_since_ms; /* uv_now when the socket last had a pipe (or dialed) */
    uint64_t adds_seen;       /* pipe_adds at the last redial tick */
    uint64_t redials;         /* dialers replaced */

    /* Queued mode only (queued = 1); q and the counters are under mu. */
    int queued;
    nng_aio *aio;       /* the pending receive (polled mode: the receives' aio, idle between) */
    nng_msg **q;        /* (q_cap) ring of received messages */
    int q_cap;          /* max_msgs */
    int q_head;         /* index of the oldest */
    size_t q_max_bytes; /* max_bytes */
    int q_paused;       /* no receive pending: the loop re-arms it */
    struct uvnng_stats st;
};

/* Starts watching sock on loop (polled mode). recv_cb may be NULL for
 * send-only sockets (then only pipe events are delivered); pipe_cb may be
 * NULL. Returns 0, TANDEM_ENNG (cannot get the fd or register the notifier)
 * or TANDEM_EUV. Loop thread. */
int uvnng_init(uv_loop_t *loop, struct uvnng *u, nng_socket sock, uvnng_recv_cb recv_cb,
               uvnng_pipe_cb pipe_cb, void *data);

/* Starts receiving on sock in queued mode: at most max_msgs (>= 1) messages
 * are queued, and the receive pauses once the queue holds max_bytes or more
 * (so the bytes held are at most max_bytes plus one message). recv_cb is
 * required; pipe_cb may be NULL. Every message queued when the loop wakes
 * is delivered in that wake-up, in arrival order. Returns 0, TANDEM_EINVAL
 * (no recv_cb, max_msgs < 1), TANDEM_ENOMEM, TANDEM_ENNG or TANDEM_EUV; on
 * failure no handle is left open and the socket is still the caller's.
 * Loop thread. */
int uvnng_init_queued(uv_loop_t *loop, struct uvnng *u, nng_socket sock, uvnng_recv_cb recv_cb,
                      uvnng_pipe_cb pipe_cb, void *data, int max_msgs, size_t max_bytes);

/* Queued mode's counters (zeros in polled mode). Loop thread (or any thread
 * before uvnng_close). */
void uvnng_queue_stats(struct uvnng *u, struct uvnng_stats *out);

/* Dials url (tls_dial, non-blocking: NNG reconnects by itself) and checks
 * every second that the socket has a pipe; after UVNNG_REDIAL_MS without one
 * (and without a new one since the last check) it closes the dialer and
 * starts a new one (the NNG 1.5.2 dialer bug above).
 * One dial per uvnng. Returns 0, TANDEM_EINVAL (a URL NNG cannot dial, a
 * tls+tcp:// URL without tls_init: tls_error_detail() says which; or a second
 * dial), TANDEM_ENOMEM or TANDEM_EUV; on failure nothing was started and u
 * is still to be closed with uvnng_close. Loop thread. */
int uvnng_dial(struct uvnng *u, const char *url);

/* Dialers uvnng_dial replaced so far. Loop thread. */
uint64_t uvnng_redials(const struct uvnng *u);

/* Pipes the socket has now (handshaking ones included). Any thread before
 * uvnng_close. */
int uvnng_pipes(struct uvnng *u);

/* The process is exiting (a stop signal): from now on uvnng_close leaves
 * every socket open instead of calling nng_close on it, for the process exit
 * to close. Any thread; for main() at a stop signal. */
void uvnng_set_exiting(void);

/* Stops watching, closes the socket (nng_close: pending pipe callbacks finish
 * first and are dropped; after uvnng_set_exiting the socket is left open
 * instead, with no callback of ours attached), in queued mode stops the receive
 * (waiting for a running callback) and frees every message still queued, then closes the libuv
 * handles; cb(&u->async) runs once all are closed, after which u may be freed. Loop thread; may be
 * called from recv_cb (the rest of that wake-up's messages are freed, not delivered). */
void uvnng_close(struct uvnng *u, uv_close_cb cb);

#endif
