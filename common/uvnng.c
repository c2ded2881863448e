#include "uvnng.h"
#include "log.h"
#include "tandem_err.h"
#include "tls.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* NNG's pipe callbacks get this, not the uvnng: a socket left open at exit
 * keeps calling them after its uvnng is gone, and then finds u NULL. */
struct uvnng_tap {
    pthread_mutex_t mu;
    struct uvnng *u;        /* under mu; NULL once the socket was left open */
    struct uvnng_tap *next; /* left_open */
};

static atomic_int exiting;
/* Taps of sockets left open, kept reachable (no leak report) until the exit. */
static struct uvnng_tap *left_open;
static pthread_mutex_t left_open_mu = PTHREAD_MUTEX_INITIALIZER;

#define REDIAL_TICK_MS 1000

/* nng_recvmsg(NNG_FLAG_NONBLOCK) on the socket's own aio: nng_recvmsg
 * allocates and frees one per call (a getrandom(2) each in NNG 1.5.2). */
static int recv_nonblock(struct uvnng *u, nng_msg **msg)
{
    if (u->aio == NULL) {
        return nng_recvmsg(u->sock, msg, NNG_FLAG_NONBLOCK);
    }
    nng_recv_aio(u->sock, u->aio);
    nng_aio_wait(u->aio);
    int rv = nng_aio_result(u->aio);
    if (rv == 0) {
        *msg = nng_aio_get_msg(u->aio);
        nng_aio_set_msg(u->aio, NULL);
    }
    return rv == NNG_ETIMEDOUT ? NNG_EAGAIN : rv;
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    struct uvnng *u = h->data;
    if (status < 0) {
        LOG_WARN("uvnng", "poll error: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < UVNNG_BATCH; i++) {
        nng_msg *msg;
        int rv = recv_nonblock(u, &msg);
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

static void deliver_events(struct uvnng *u)
{
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

static size_t msg_bytes(nng_msg *msg)
{
    return nng_msg_len(msg) + nng_msg_header_len(msg);
}

/* Queued mode, loop thread: hands recv_cb what was queued when we woke up.
 * What arrives meanwhile waits for the next wake-up (the callback has sent
 * the async again), so a fast sender cannot hold the loop here. */
static void deliver_queued(struct uvnng *u)
{
    pthread_mutex_lock(&u->mu);
    int n = u->st.depth;
    pthread_mutex_unlock(&u->mu);
    for (int i = 0; i < n && u->close_cb == NULL; i++) {
        pthread_mutex_lock(&u->mu);
        nng_msg *msg = u->q[u->q_head];
        u->q[u->q_head] = NULL;
        u->q_head = (u->q_head + 1) % u->q_cap;
        u->st.depth--;
        u->st.bytes -= msg_bytes(msg);
        /* The callback left the receive to us when the queue was full. */
        int rearm = u->q_paused && u->st.depth < u->q_cap && u->st.bytes < u->q_max_bytes;
        if (rearm) {
            u->q_paused = 0;
        }
        pthread_mutex_unlock(&u->mu);
        if (rearm) {
            nng_recv_aio(u->sock, u->aio);
        }
        u->recv_cb(u, msg);
    }
}

static void on_async(uv_async_t *h)
{
    struct uvnng *u = h->data;
    deliver_events(u);
    if (u->queued && u->close_cb == NULL) {
        deliver_queued(u);
    }
}

/* Queued mode, NNG thread: the receive completed. Queues the message and
 * re-arms, unless the queue is full (then the loop re-arms as it drains) or
 * we are closing (uvnng_close frees what is queued). */
static void on_recv_aio(void *arg)
{
    struct uvnng *u = arg;
    int rv = nng_aio_result(u->aio);
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED) {
        return; /* uvnng_close: nng_close or nng_aio_stop */
    }
    if (rv != 0 && rv != NNG_ETIMEDOUT && rv != NNG_ENOMEM) {
        /* Retrying would spin (a socket that cannot receive, say). */
        LOG_ERROR("uvnng", "recv: %s; no longer receiving on this socket", nng_strerror(rv));
        return;
    }
    nng_msg *msg = NULL;
    if (rv == 0) {
        msg = nng_aio_get_msg(u->aio);
        nng_aio_set_msg(u->aio, NULL);
    }
    pthread_mutex_lock(&u->mu);
    if (u->close_cb != NULL) {
        pthread_mutex_unlock(&u->mu);
        if (msg != NULL) {
            nng_msg_free(msg);
        }
        return;
    }
    int rearm = 1;
    if (msg != NULL) {
        int tail = (u->q_head + u->st.depth) % u->q_cap;
        u->q[tail] = msg;
        u->st.depth++;
        u->st.bytes += msg_bytes(msg);
        u->st.received++;
        if (u->st.depth > u->st.peak_depth) {
            u->st.peak_depth = u->st.depth;
        }
        if (u->st.bytes > u->st.peak_bytes) {
            u->st.peak_bytes = u->st.bytes;
        }
        if (u->st.depth >= u->q_cap || u->st.bytes >= u->q_max_bytes) {
            u->q_paused = 1;
            u->st.pauses++;
            rearm = 0;
        }
        uv_async_send(&u->async);
    }
    pthread_mutex_unlock(&u->mu);
    if (rv != 0) {
        LOG_WARN("uvnng", "recv: %s; receiving again", nng_strerror(rv));
    }
    if (rearm) {
        nng_recv_aio(u->sock, u->aio);
    }
}

/* NNG thread: counts the pipe and queues the event for pipe_cb. */
static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct uvnng_tap *t = arg;
    pthread_mutex_lock(&t->mu);
    struct uvnng *u = t->u;
    if (u == NULL) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    pthread_mutex_lock(&u->mu);
    u->n_pipes += ev == NNG_PIPE_EV_ADD_PRE ? 1 : ev == NNG_PIPE_EV_REM_POST ? -1 : 0;
    u->pipe_adds += ev == NNG_PIPE_EV_ADD_PRE;
    if (u->close_cb != NULL || u->pipe_cb == NULL || ev == NNG_PIPE_EV_ADD_PRE) {
        pthread_mutex_unlock(&u->mu);
        pthread_mutex_unlock(&t->mu);
        return;
    }
    if (u->n_events == u->cap_events) {
        int cap = u->cap_events ? u->cap_events * 2 : 16;
        struct uvnng_pipe_event *e = realloc(u->events, (size_t)cap * sizeof(*e));
        if (e == NULL) {
            pthread_mutex_unlock(&u->mu);
            pthread_mutex_unlock(&t->mu);
            LOG_ERROR("uvnng", "out of memory queueing a pipe event");
            return;
        }
        u->events = e;
        u->cap_events = cap;
    }
    u->events[u->n_events].pipe = p;
    u->events[u->n_events].ev = ev;
    u->n_events++;
    if (u->open_handles > 0) {
        uv_async_send(&u->async);
    }
    pthread_mutex_unlock(&u->mu);
    pthread_mutex_unlock(&t->mu);
}

/* ADD_PRE and REM_POST pair up (NNG 1.5.2 runs REM_POST for every pipe that
 * had ADD_PRE, ADD_POST or not), so n_pipes counts them. Returns 0 or
 * TANDEM_ENNG. */
static int tap_start(struct uvnng *u)
{
    static const nng_pipe_ev evs[] = {NNG_PIPE_EV_ADD_PRE, NNG_PIPE_EV_ADD_POST,
                                      NNG_PIPE_EV_REM_POST};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++) {
        if (nng_pipe_notify(u->sock, evs[i], on_pipe, u->tap) != 0) {
            return TANDEM_ENNG;
        }
    }
    return 0;
}

static void tap_stop(struct uvnng *u)
{
    for (int ev = NNG_PIPE_EV_ADD_PRE; ev <= NNG_PIPE_EV_REM_POST; ev++) {
        nng_pipe_notify(u->sock, (nng_pipe_ev)ev, NULL, NULL);
    }
}

static struct uvnng_tap *tap_new(struct uvnng *u)
{
    struct uvnng_tap *t = malloc(sizeof(*t));
    if (t != NULL) {
        pthread_mutex_init(&t->mu, NULL);
        t->u = u;
    }
    return t;
}

static void tap_free(struct uvnng_tap *t)
{
    if (t != NULL) {
        pthread_mutex_destroy(&t->mu);
        free(t);
    }
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
    u->tap = tap_new(u);
    if (u->tap == NULL) {
        pthread_mutex_destroy(&u->mu);
        return TANDEM_ENOMEM;
    }

    int rv = uv_async_init(loop, &u->async, on_async);
    if (rv != 0) {
        tap_free(u->tap);
        u->tap = NULL;
        pthread_mutex_destroy(&u->mu);
        return TANDEM_EUV;
    }
    u->async.data = u;
    pthread_mutex_lock(&u->mu);
    u->open_handles = 1;
    pthread_mutex_unlock(&u->mu);
    if (tap_start(u) != 0) {
        return TANDEM_ENNG;
    }
    if (recv_cb != NULL) {
        int fd;
        if (nng_socket_get_int(sock, NNG_OPT_RECVFD, &fd) != 0) {
            return TANDEM_ENNG;
        }
        if (uv_poll_init(loop, &u->poll, fd) != 0) {
            return TANDEM_EUV;
        }
        /* Without it (ENOMEM) every receive allocates its own. */
        if (nng_aio_alloc(&u->aio, NULL, NULL) == 0) {
            nng_aio_set_timeout(u->aio, NNG_DURATION_ZERO);
        }
        u->poll.data = u;
        u->open_handles++;
        uv_poll_start(&u->poll, UV_READABLE, on_readable);
    }
    return 0;
}

int uvnng_init_queued(uv_loop_t *loop, struct uvnng *u, nng_socket sock, uvnng_recv_cb recv_cb,
                      uvnng_pipe_cb pipe_cb, void *data, int max_msgs, size_t max_bytes)
{
    if (recv_cb == NULL || max_msgs < 1) {
        return TANDEM_EINVAL;
    }
    memset(u, 0, sizeof(*u));
    u->sock = sock;
    u->recv_cb = recv_cb;
    u->pipe_cb = pipe_cb;
    u->data = data;
    u->queued = 1;
    u->q_cap = max_msgs;
    u->q_max_bytes = max_bytes;
    int rc = TANDEM_ENOMEM;
    pthread_mutex_init(&u->mu, NULL);
    u->q = calloc((size_t)max_msgs, sizeof(*u->q));
    if (u->q == NULL) {
        goto out_mu;
    }
    u->tap = tap_new(u);
    if (u->tap == NULL) {
        goto out_q;
    }
    rc = TANDEM_ENNG;
    if (nng_aio_alloc(&u->aio, on_recv_aio, u) != 0) {
        goto out_tap;
    }
    nng_aio_set_timeout(u->aio, NNG_DURATION_INFINITE);
    /* Pipe events that come before the async exists wait in the queue
     * (on_pipe signals only once open_handles > 0). */
    if (tap_start(u) != 0) {
        goto out_notify;
    }
    rc = TANDEM_EUV;
    if (uv_async_init(loop, &u->async, on_async) != 0) {
        goto out_notify;
    }
    u->async.data = u;
    pthread_mutex_lock(&u->mu);
    u->open_handles = 1;
    if (u->n_events > 0) {
        uv_async_send(&u->async);
    }
    pthread_mutex_unlock(&u->mu);
    nng_recv_aio(sock, u->aio);
    return 0;

out_notify:
    /* A callback inside the tap's mutex finishes before u is let go. */
    tap_stop(u);
    pthread_mutex_lock(&u->tap->mu);
    u->tap->u = NULL;
    pthread_mutex_unlock(&u->tap->mu);
    nng_aio_free(u->aio);
    u->aio = NULL;
out_tap:
    tap_free(u->tap);
    u->tap = NULL;
out_q:
    free(u->q);
    u->q = NULL;
out_mu:
    free(u->events); /* a pipe event may have been queued meanwhile */
    u->events = NULL;
    pthread_mutex_destroy(&u->mu);
    return rc;
}

void uvnng_queue_stats(struct uvnng *u, struct uvnng_stats *out)
{
    pthread_mutex_lock(&u->mu);
    *out = u->st;
    pthread_mutex_unlock(&u->mu);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct uvnng *u = h->data;
    if (--u->open_handles == 0) {
        free(u->events);
        u->events = NULL;
        free(u->dial_url);
        u->dial_url = NULL;
        pthread_mutex_destroy(&u->mu);
        u->close_cb((uv_handle_t *)&u->async);
    }
}

/* Queued mode, after nng_close (or with the socket left open): no callback
 * runs after nng_aio_stop, so what is queued is ours to free. */
static void stop_queue(struct uvnng *u)
{
    nng_aio_stop(u->aio);
    nng_aio_free(u->aio);
    u->aio = NULL;
    pthread_mutex_lock(&u->mu);
    for (int i = 0; i < u->st.depth; i++) {
        nng_msg_free(u->q[(u->q_head + i) % u->q_cap]);
    }
    u->st.depth = 0;
    u->st.bytes = 0;
    free(u->q);
    u->q = NULL;
    pthread_mutex_unlock(&u->mu);
}

void uvnng_set_exiting(void)
{
    atomic_store(&exiting, 1);
}

int uvnng_pipes(struct uvnng *u)
{
    pthread_mutex_lock(&u->mu);
    int n = u->n_pipes;
    pthread_mutex_unlock(&u->mu);
    return n;
}

void uvnng_close(struct uvnng *u, uv_close_cb cb)
{
    pthread_mutex_lock(&u->mu);
    u->close_cb = cb;
    int pipes = u->n_pipes;
    pthread_mutex_unlock(&u->mu);
    if (u->recv_cb != NULL && !u->queued) {
        /* The fd belongs to the socket: stop polling before nng_close. */
        uv_poll_stop(&u->poll);
        uv_close((uv_handle_t *)&u->poll, on_handle_closed);
        if (u->aio != NULL) { /* idle: each receive waited for its end */
            nng_aio_free(u->aio);
            u->aio = NULL;
        }
    }
    if (u->dialing) {
        u->dialing = 0;
        uv_close((uv_handle_t *)&u->redial, on_handle_closed);
    }
    if (atomic_load(&exiting)) {
        /* Closing a pipe locally can wedge NNG 1.5.2's reaper for good
         * (docs/nng-close-deadlock.md), and once it is wedged every
         * nng_close waits for it, whichever socket: a pipe refused or
         * redialled earlier in the run may have done it. So at exit no socket
         * is closed here; the process exit closes them all. The tap stays with
         * the socket; once u is NULL no callback touches u. */
        pthread_mutex_lock(&u->tap->mu);
        u->tap->u = NULL;
        pthread_mutex_unlock(&u->tap->mu);
        pthread_mutex_lock(&left_open_mu);
        u->tap->next = left_open;
        left_open = u->tap;
        pthread_mutex_unlock(&left_open_mu);
        u->tap = NULL;
        LOG_DEBUG("uvnng", "socket %d left open for the exit (%d pipes)", nng_socket_id(u->sock),
                  pipes);
    } else {
        /* Queued mode: the pending receive ends with NNG_ECLOSED. Every pipe
         * callback has returned once nng_close has. */
        nng_close(u->sock);
        tap_free(u->tap);
        u->tap = NULL;
    }
    if (u->queued) {
        stop_queue(u);
    }
    uv_close((uv_handle_t *)&u->async, on_handle_closed);
}

/* Loop thread, every REDIAL_TICK_MS while dialing. */
static void on_redial(uv_timer_t *t)
{
    struct uvnng *u = t->data;
    uint64_t now = uv_now(t->loop);
    pthread_mutex_lock(&u->mu);
    int pipes = u->n_pipes;
    uint64_t adds = u->pipe_adds;
    pthread_mutex_unlock(&u->mu);
    /* A dialer that made a pipe since the last tick works, even if the pipe
     * is gone (a peer that refuses us): replacing it would only close a
     * dialer mid-handshake, which NNG 1.5.2 leaks. */
    if (pipes > 0 || adds != u->adds_seen) {
        u->adds_seen = adds;
        u->lonely_since_ms = now;
        return;
    }
    if (now - u->lonely_since_ms < UVNNG_REDIAL_MS) {
        return;
    }
    u->lonely_since_ms = now;
    nng_dialer_close(u->dialer);
    int rc = tls_dial(u->sock, u->dial_url, &u->dialer, NNG_FLAG_NONBLOCK);
    if (rc != 0) {
        LOG_WARN("uvnng", "redialing %s: %s; trying again in %d ms", u->dial_url,
                 tls_error_detail(), UVNNG_REDIAL_MS);
        return;
    }
    u->redials++;
    LOG_DEBUG("uvnng", "no pipe to %s for %d ms: a new dialer", u->dial_url, UVNNG_REDIAL_MS);
}

int uvnng_dial(struct uvnng *u, const char *url)
{
    if (u->dialing || u->close_cb != NULL || url == NULL) {
        return TANDEM_EINVAL;
    }
    char *copy = strdup(url);
    if (copy == NULL) {
        return TANDEM_ENOMEM;
    }
    uv_loop_t *loop = uv_handle_get_loop((uv_handle_t *)&u->async);
    if (uv_timer_init(loop, &u->redial) != 0) {
        free(copy);
        return TANDEM_EUV;
    }
    u->redial.data = u;
    pthread_mutex_lock(&u->mu);
    u->open_handles++;
    pthread_mutex_unlock(&u->mu);
    u->dialing = 1;
    u->dial_url = copy;
    int rc = tls_dial(u->sock, url, &u->dialer, NNG_FLAG_NONBLOCK);
    if (rc != 0) {
        return rc == TANDEM_ENNG ? TANDEM_EINVAL : rc; /* the timer closes with u */
    }
    u->lonely_since_ms = uv_now(loop);
    uv_timer_start(&u->redial, on_redial, REDIAL_TICK_MS, REDIAL_TICK_MS);
    return 0;
}

uint64_t uvnng_redials(const struct uvnng *u)
{
    return u->redials;
}
