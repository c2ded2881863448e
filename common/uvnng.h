/* Bridge from NNG sockets to a libuv loop, without busy polling.
 *
 * Receiving: NNG exposes a file descriptor (NNG_OPT_RECVFD) that is readable
 * while a message waits on the socket; a uv_poll_t watches it and the loop
 * drains messages with NNG_FLAG_NONBLOCK, at most UVNNG_BATCH per wake-up so
 * one busy socket cannot starve the rest of the loop.
 *
 * Pipe events: nng_pipe_notify callbacks run on NNG's threads; they are
 * queued under a mutex and delivered on the loop thread through a uv_async_t.
 *
 * Ownership: struct uvnng is embedded by its owner and takes the socket:
 * uvnng_close closes it. Each received message is handed to recv_cb, which
 * owns it from then on (nng_msg_free it or send it on). */
#ifndef TANDEM_UVNNG_H
#define TANDEM_UVNNG_H

#include <nng/nng.h>
#include <pthread.h>
#include <uv.h>

#define UVNNG_BATCH 64

struct uvnng;

/* Loop thread. The callee owns msg. */
typedef void (*uvnng_recv_cb)(struct uvnng *u, nng_msg *msg);
/* Loop thread. ev is NNG_PIPE_EV_ADD_POST or NNG_PIPE_EV_REM_POST. */
typedef void (*uvnng_pipe_cb)(struct uvnng *u, nng_pipe pipe, nng_pipe_ev ev);

struct uvnng_pipe_event {
    nng_pipe pipe;
    nng_pipe_ev ev;
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
};

/* Starts watching sock on loop. recv_cb may be NULL for send-only sockets
 * (then only pipe events are delivered); pipe_cb may be NULL. Returns 0,
 * TANDEM_ENNG (cannot get the fd or register the notifier) or TANDEM_EUV. */
int uvnng_init(uv_loop_t *loop, struct uvnng *u, nng_socket sock, uvnng_recv_cb recv_cb,
               uvnng_pipe_cb pipe_cb, void *data);

/* Stops watching, closes the socket (nng_close: pending pipe callbacks finish
 * first and are dropped), then closes the libuv handles; cb(&u->async) runs
 * once all are closed, after which u may be freed. Loop thread. */
void uvnng_close(struct uvnng *u, uv_close_cb cb);

#endif
