#include "uvnng.h"
#include "log.h"
#include "tandem_err.h"

#include <stdlib.h>
#include <string.h>

static void on_readable(uv_poll_t *h, int status, int events)
{
    struct uvnng *u = h->data;
    if (status < 0) {
        LOG_WARN("uvnng", "poll error: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < UVNNG_BATCH; i++) {
        nng_msg *msg;
        int rv = nng_recvmsg(u->sock, &msg, NNG_FLAG_NONBLOCK);
        if (rv == NNG_EAGAIN) {
            return;
        }
        if (rv != 0) {
            if (rv != NNG_ECLOSED) {
                LOG_WARN("uvnng", "recv: %s", nng_strerror(rv));
            }
            return;
        }
        u->recv_cb(u, msg);
    }
}

static void on_async(uv_async_t *h)
{
    struct uvnng *u = h->data;
    for (;;) {
        struct uvnng_pipe_event ev;
        pthread_mutex_lock(&u->mu);
        if (u->n_events == 0) {
            pthread_mutex_unlock(&u->mu);
            return;
        }
        ev = u->events[0];
        memmove(u->events, u->events + 1, (size_t)(u->n_events - 1) * sizeof(ev));
        u->n_events--;
        pthread_mutex_unlock(&u->mu);
        if (u->pipe_cb != NULL) {
            u->pipe_cb(u, ev.pipe, ev.ev);
        }
    }
}

/* NNG thread. */
static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct uvnng *u = arg;
    pthread_mutex_lock(&u->mu);
    if (u->close_cb != NULL) {
        pthread_mutex_unlock(&u->mu);
        return;
    }
    if (u->n_events == u->cap_events) {
        int cap = u->cap_events ? u->cap_events * 2 : 16;
        struct uvnng_pipe_event *e = realloc(u->events, (size_t)cap * sizeof(*e));
        if (e == NULL) {
            pthread_mutex_unlock(&u->mu);
            LOG_ERROR("uvnng", "out of memory queueing a pipe event");
            return;
        }
        u->events = e;
        u->cap_events = cap;
    }
    u->events[u->n_events].pipe = p;
    u->events[u->n_events].ev = ev;
    u->n_events++;
    uv_async_send(&u->async);
    pthread_mutex_unlock(&u->mu);
}

int uvnng_init(uv_loop_t *loop, struct uvnng *u, nng_socket sock, uvnng_recv_cb recv_cb,
               uvnng_pipe_cb pipe_cb, void *data)
{
    memset(u, 0, sizeof(*u));
    u->sock = sock;
    u->recv_cb = recv_cb;
    u->pipe_cb = pipe_cb;
    u->data = data;
    pthread_mutex_init(&u->mu, NULL);

    int rv = uv_async_init(loop, &u->async, on_async);
    if (rv != 0) {
        pthread_mutex_destroy(&u->mu);
        return TANDEM_EUV;
    }
    u->async.data = u;
    u->open_handles = 1;
    if (pipe_cb != NULL) {
        if (nng_pipe_notify(sock, NNG_PIPE_EV_ADD_POST, on_pipe, u) != 0 ||
            nng_pipe_notify(sock, NNG_PIPE_EV_REM_POST, on_pipe, u) != 0) {
            return TANDEM_ENNG;
        }
    }
    if (recv_cb != NULL) {
        int fd;
        if (nng_socket_get_int(sock, NNG_OPT_RECVFD, &fd) != 0) {
            return TANDEM_ENNG;
        }
        if (uv_poll_init(loop, &u->poll, fd) != 0) {
            return TANDEM_EUV;
        }
        u->poll.data = u;
        u->open_handles++;
        uv_poll_start(&u->poll, UV_READABLE, on_readable);
    }
    return 0;
}

static void on_handle_closed(uv_handle_t *h)
{
    struct uvnng *u = h->data;
    if (--u->open_handles == 0) {
        free(u->events);
        u->events = NULL;
        pthread_mutex_destroy(&u->mu);
        u->close_cb((uv_handle_t *)&u->async);
    }
}

void uvnng_close(struct uvnng *u, uv_close_cb cb)
{
    pthread_mutex_lock(&u->mu);
    u->close_cb = cb;
    pthread_mutex_unlock(&u->mu);
    if (u->recv_cb != NULL) {
        /* The fd belongs to the socket: stop polling before nng_close. */
        uv_poll_stop(&u->poll);
        uv_close((uv_handle_t *)&u->poll, on_handle_closed);
    }
    nng_close(u->sock);
    uv_close((uv_handle_t *)&u->async, on_handle_closed);
}
