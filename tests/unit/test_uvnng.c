/* NNG -> libuv bridge: messages and pipe events reach the loop thread; in
 * queued mode they keep arriving while the loop thread is blocked, within
 * the queue's bounds, and closing frees what is queued. */
#include <CUnit/Basic.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "tandem_err.h"
#include "uvnng.h"

struct ctx {
    struct uvnng u;
    int received;
    int sum;
    int adds;
    int removes;
    int closed;
    uv_timer_t timer;
};

static void on_msg(struct uvnng *u, nng_msg *msg)
{
    struct ctx *c = u->data;
    uint32_t v;
    CU_ASSERT_EQUAL_FATAL(nng_msg_len(msg), 4);
    memcpy(&v, nng_msg_body(msg), 4);
    c->received++;
    c->sum += (int)v;
    nng_msg_free(msg);
}

static void on_pipe_ev(struct uvnng *u, nng_pipe p, nng_pipe_ev ev)
{
    struct ctx *c = u->data;
    CU_ASSERT(nng_pipe_id(p) > 0);
    if (ev == NNG_PIPE_EV_ADD_POST) {
        c->adds++;
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        c->removes++;
    }
}

static int closed_calls;

static void on_closed(uv_handle_t *h)
{
    (void)h;
    closed_calls++;
}

static void on_tick(uv_timer_t *t)
{
    struct ctx *c = t->data;
    (void)c;
}

static void run_until(uv_loop_t *loop, int *flag, int want)
{
    for (int i = 0; i < 2000 && *flag < want; i++) {
        uv_run(loop, UV_RUN_ONCE);
    }
}

/* Initialises loop and zeroes c, with c's timer ticking so UV_RUN_ONCE
 * never blocks forever if an event is missing. */
static void loop_with_tick(uv_loop_t *loop, struct ctx *c)
{
    memset(c, 0, sizeof(*c));
    CU_ASSERT_EQUAL_FATAL(uv_loop_init(loop), 0);
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    uv_timer_start(&c->timer, on_tick, 5, 5);
}

static void test_messages_and_pipes(void)
{
    uv_loop_t loop;
    struct ctx c;
    loop_with_tick(&loop, &c);

    nng_socket pull, push;
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&pull), 0);
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(&push), 0);
    /* Buffers large enough for the whole burst: the loop is not running while
     * the test sends. */
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_int(pull, NNG_OPT_RECVBUF, 1024), 0);
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_int(push, NNG_OPT_SENDBUF, 1024), 0);
    CU_ASSERT_EQUAL_FATAL(uvnng_init(&loop, &c.u, pull, on_msg, on_pipe_ev, &c), 0);
    CU_ASSERT_EQUAL_FATAL(nng_listen(pull, "inproc://uvnng-test", NULL, 0), 0);
    CU_ASSERT_EQUAL_FATAL(nng_dial(push, "inproc://uvnng-test", NULL, 0), 0);
    run_until(&loop, &c.adds, 1);
    CU_ASSERT_EQUAL(c.adds, 1);

    /* More than one batch, so the drain limit and re-arming are exercised. */
    int expect = 0;
    for (uint32_t i = 1; i <= 3 * UVNNG_BATCH + 5; i++) {
        nng_msg *m;
        nng_msg_alloc(&m, 4);
        memcpy(nng_msg_body(m), &i, 4);
        CU_ASSERT_EQUAL_FATAL(nng_sendmsg(push, m, 0), 0);
        expect += (int)i;
    }
    run_until(&loop, &c.received, 3 * UVNNG_BATCH + 5);
    CU_ASSERT_EQUAL(c.received, 3 * UVNNG_BATCH + 5);
    CU_ASSERT_EQUAL(c.sum, expect);

    nng_close(push);
    run_until(&loop, &c.removes, 1);
    CU_ASSERT_EQUAL(c.removes, 1);

    uvnng_close(&c.u, on_closed);
    uv_close((uv_handle_t *)&c.timer, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(closed_calls, 1);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
}

/* ---- Queued mode ---------------------------------------------------------- */

#define Q_STEP_MS 20 /* a blocking "scheduler step" of the receiving loop */

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The receiving side: messages carry their sequence number in the first 4
 * bytes; a uv_idle callback sleeps Q_STEP_MS per loop turn until `want`
 * arrived (or max_steps turns passed). */
struct qctx {
    struct uvnng u;
    uv_idle_t idle;
    int want;
    int max_steps;
    int received;
    uint32_t next_seq;
    int out_of_order;
    int steps;         /* idle callbacks that slept */
    int most_per_turn; /* most messages delivered between two steps */
    int this_turn;
    int close_after; /* > 0: uvnng_close from recv_cb after that many */
    int closed_in_cb;
};

static int q_closed;

static void on_q_closed(uv_handle_t *h)
{
    (void)h;
    q_closed++;
}

static void on_q_msg(struct uvnng *u, nng_msg *msg)
{
    struct qctx *c = u->data;
    uint32_t seq = 0;
    if (nng_msg_len(msg) >= 4) {
        memcpy(&seq, nng_msg_body(msg), 4);
    }
    if (seq != c->next_seq) {
        c->out_of_order++;
    }
    c->next_seq = seq + 1;
    c->received++;
    c->this_turn++;
    nng_msg_free(msg);
    if (c->close_after > 0 && c->received == c->close_after) {
        c->closed_in_cb = 1;
        uvnng_close(u, on_q_closed);
    }
}

static void on_q_step(uv_idle_t *h)
{
    struct qctx *c = h->data;
    if (c->this_turn > c->most_per_turn) {
        c->most_per_turn = c->this_turn;
    }
    c->this_turn = 0;
    if (c->received >= c->want || c->steps >= c->max_steps || c->closed_in_cb) {
        uv_idle_stop(h);
        uv_stop(h->loop);
        return;
    }
    sleep_ms(Q_STEP_MS);
    c->steps++;
}

struct sender {
    nng_socket push;
    int n;
    size_t size;
    int sent;
    int failed; /* first error (0: none) */
};

static void *send_thread(void *arg)
{
    struct sender *s = arg;
    for (int i = 0; i < s->n; i++) {
        nng_msg *m;
        if (nng_msg_alloc(&m, s->size) != 0) {
            s->failed = NNG_ENOMEM;
            break;
        }
        memset(nng_msg_body(m), 0xab, s->size);
        uint32_t seq = (uint32_t)i;
        memcpy(nng_msg_body(m), &seq, 4);
        int rv = nng_sendmsg(s->push, m, 0);
        if (rv != 0) {
            nng_msg_free(m);
            s->failed = rv;
            break;
        }
        s->sent++;
    }
    return NULL;
}

static void url_for(char *out, size_t cap, const char *transport, int k)
{
    if (strcmp(transport, "ipc") == 0) {
        snprintf(out, cap, "ipc:///tmp/tandem-test-uvnng-%ld-%d.ipc", (long)getpid(), k);
    } else {
        snprintf(out, cap, "tcp://127.0.0.1:0");
    }
}

static void unlink_url(const char *url)
{
    if (strncmp(url, "ipc://", 6) == 0) {
        unlink(url + 6);
    }
}

/* Opens pull (listening) and push (dialed, its send buffer small so that
 * the sender depends on the receiver), the receiving side in queued mode
 * (max_msgs > 0) or polled (max_msgs == 0). */
static void open_pair(uv_loop_t *loop, struct qctx *c, const char *transport, int k, int max_msgs,
                      size_t max_bytes, nng_socket *push, char *url, size_t url_cap)
{
    nng_socket pull;
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&pull), 0);
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(push), 0);
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_int(*push, NNG_OPT_SENDBUF, 4), 0);
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_ms(*push, NNG_OPT_SENDTIMEO, 10000), 0);
    if (max_msgs > 0) {
        CU_ASSERT_EQUAL_FATAL(
            uvnng_init_queued(loop, &c->u, pull, on_q_msg, NULL, c, max_msgs, max_bytes), 0);
    } else {
        CU_ASSERT_EQUAL_FATAL(uvnng_init(loop, &c->u, pull, on_q_msg, NULL, c), 0);
    }
    url_for(url, url_cap, transport, k);
    nng_listener l;
    CU_ASSERT_EQUAL_FATAL(nng_listen(pull, url, &l, 0), 0);
    char *bound = NULL;
    CU_ASSERT_EQUAL_FATAL(nng_listener_get_string(l, NNG_OPT_URL, &bound), 0);
    snprintf(url, url_cap, "%s", bound);
    nng_strfree(bound);
    CU_ASSERT_EQUAL_FATAL(nng_dial(*push, url, NULL, 0), 0);
}

struct blocked_result {
    int received, steps, most_per_turn, out_of_order;
    struct uvnng_stats st;
};

/* n messages of size bytes pushed from a thread while the receiving loop
 * sleeps Q_STEP_MS per turn. */
static void run_blocked(const char *transport, int k, int n, size_t size, int max_msgs,
                        size_t max_bytes, struct blocked_result *out)
{
    uv_loop_t loop;
    struct qctx c;
    memset(&c, 0, sizeof(c));
    c.want = n;
    c.max_steps = 4 * n + 50;
    CU_ASSERT_EQUAL_FATAL(uv_loop_init(&loop), 0);
    nng_socket push;
    char url[256];
    open_pair(&loop, &c, transport, k, max_msgs, max_bytes, &push, url, sizeof(url));
    uv_idle_init(&loop, &c.idle);
    c.idle.data = &c;
    uv_idle_start(&c.idle, on_q_step);

    struct sender s = {.push = push, .n = n, .size = size};
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, send_thread, &s), 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(s.failed, 0);
    CU_ASSERT_EQUAL(s.sent, n);

    memset(out, 0, sizeof(*out));
    out->received = c.received;
    out->steps = c.steps;
    out->most_per_turn = c.most_per_turn;
    out->out_of_order = c.out_of_order;
    uvnng_queue_stats(&c.u, &out->st);

    nng_close(push);
    q_closed = 0;
    uvnng_close(&c.u, on_q_closed);
    uv_close((uv_handle_t *)&c.idle, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(q_closed, 1);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
    unlink_url(url);
}

/* The defect this mode fixes, and the fix, side by side. Queued, NNG keeps
 * receiving while the loop sleeps and a turn delivers everything that came:
 * asserted. Polled, a blocked loop takes about one message per turn over
 * TCP on a quiet machine (PULL0 reads a pipe's next message only once the
 * last was taken, and NNG's read completes on another thread after the loop
 * saw EAGAIN), but more whenever the loop thread is preempted between two
 * receives, so that side is only printed. */
static void blocked_loop(const char *transport)
{
    const int n = 120;
    struct blocked_result polled, queued;
    run_blocked(transport, 0, n, 4096, 0, 0, &polled);
    run_blocked(transport, 1, n, 4096, 256, 64u << 20, &queued);
    printf("\n  %s, %d messages, %d ms steps: polled %d steps (at most %d per turn), "
           "queued %d steps (at most %d per turn, peak depth %d)\n",
           transport, n, Q_STEP_MS, polled.steps, polled.most_per_turn, queued.steps,
           queued.most_per_turn, queued.st.peak_depth);
    CU_ASSERT_EQUAL(polled.received, n);
    CU_ASSERT_EQUAL(queued.received, n);
    CU_ASSERT_EQUAL(polled.out_of_order, 0);
    CU_ASSERT_EQUAL(queued.out_of_order, 0);
    CU_ASSERT_EQUAL(queued.st.received, (uint64_t)n);
    CU_ASSERT_EQUAL(queued.st.depth, 0);
    CU_ASSERT_EQUAL(queued.st.bytes, 0);
    CU_ASSERT(queued.st.peak_depth <= 256);
    /* Far fewer steps than messages (one on a quiet machine). */
    CU_ASSERT(queued.steps <= n / 10);
}

static void test_queued_blocked_ipc(void)
{
    blocked_loop("ipc");
}

static void test_queued_blocked_tcp(void)
{
    blocked_loop("tcp");
}

/* A queue of 8 messages: never more than 8 queued (the receive pauses,
 * the sender waits), all delivered in order. */
static void test_queued_msg_bound(void)
{
    const int n = 100, bound = 8;
    struct blocked_result r;
    run_blocked("ipc", 2, n, 1024, bound, 64u << 20, &r);
    CU_ASSERT_EQUAL(r.received, n);
    CU_ASSERT_EQUAL(r.out_of_order, 0);
    CU_ASSERT(r.st.peak_depth <= bound);
    CU_ASSERT_EQUAL(r.st.peak_depth, bound); /* the loop sleeps long enough to fill it */
    CU_ASSERT(r.st.pauses >= 1);
    CU_ASSERT(r.most_per_turn <= bound);
    CU_ASSERT(r.steps >= n / bound - 1);
}

/* A byte bound of 10 messages of 4 KiB (+ header): the queue stops taking
 * more at the bound, so it holds at most the bound plus one message. */
static void test_queued_byte_bound(void)
{
    const int n = 100;
    const size_t size = 4096, max_bytes = 10 * 4096;
    struct blocked_result r;
    run_blocked("tcp", 3, n, size, 256, max_bytes, &r);
    CU_ASSERT_EQUAL(r.received, n);
    CU_ASSERT_EQUAL(r.out_of_order, 0);
    CU_ASSERT(r.st.peak_bytes <= max_bytes + size);
    CU_ASSERT(r.st.peak_bytes >= max_bytes);
    CU_ASSERT(r.st.peak_depth <= 11);
    CU_ASSERT(r.st.pauses >= 1);
}

/* Closing while messages are queued (the loop never ran) frees them, and a
 * sender blocked on the full queue gets an error, not a hang. Run under
 * valgrind for the leak check. */
static void test_queued_close_with_messages(void)
{
    const int bound = 8;
    uv_loop_t loop;
    struct qctx c;
    memset(&c, 0, sizeof(c));
    CU_ASSERT_EQUAL_FATAL(uv_loop_init(&loop), 0);
    nng_socket push;
    char url[256];
    open_pair(&loop, &c, "ipc", 4, bound, 64u << 20, &push, url, sizeof(url));
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_ms(push, NNG_OPT_SENDTIMEO, 300), 0);
    /* 5 MiB: more than the queue, NNG's buffers and the kernel's hold. */
    struct sender s = {.push = push, .n = 40, .size = 128 << 10};
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, send_thread, &s), 0);
    struct uvnng_stats st;
    for (int i = 0; i < 500; i++) {
        uvnng_queue_stats(&c.u, &st);
        if (st.depth == bound) {
            break;
        }
        sleep_ms(10);
    }
    CU_ASSERT_EQUAL(st.depth, bound);
    CU_ASSERT_EQUAL(st.pauses, 1);
    q_closed = 0;
    uvnng_close(&c.u, on_q_closed);
    pthread_join(th, NULL);
    CU_ASSERT(s.sent >= bound);
    CU_ASSERT(s.sent < s.n);
    CU_ASSERT(s.failed != 0);
    nng_close(push);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(c.received, 0);
    CU_ASSERT_EQUAL(q_closed, 1);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
    unlink_url(url);
}

/* uvnng_close from recv_cb: the rest of the wake-up's messages are freed,
 * not delivered. */
static void test_queued_close_from_callback(void)
{
    uv_loop_t loop;
    struct qctx c;
    memset(&c, 0, sizeof(c));
    c.want = 1000;
    c.max_steps = 200;
    c.close_after = 3;
    CU_ASSERT_EQUAL_FATAL(uv_loop_init(&loop), 0);
    nng_socket push;
    char url[256];
    open_pair(&loop, &c, "ipc", 5, 16, 64u << 20, &push, url, sizeof(url));
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_ms(push, NNG_OPT_SENDTIMEO, 300), 0);
    struct sender s = {.push = push, .n = 30, .size = 512};
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, send_thread, &s), 0);
    /* Let the queue fill before the loop first turns, so the close comes
     * in the middle of a wake-up. */
    struct uvnng_stats st;
    for (int i = 0; i < 500; i++) {
        uvnng_queue_stats(&c.u, &st);
        if (st.depth == 16) {
            break;
        }
        sleep_ms(10);
    }
    CU_ASSERT_EQUAL(st.depth, 16);
    q_closed = 0;
    uv_idle_init(&loop, &c.idle);
    c.idle.data = &c;
    uv_idle_start(&c.idle, on_q_step);
    uv_run(&loop, UV_RUN_DEFAULT);
    pthread_join(th, NULL);
    nng_close(push);
    uv_close((uv_handle_t *)&c.idle, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(c.received, 3);
    CU_ASSERT_EQUAL(c.closed_in_cb, 1);
    CU_ASSERT_EQUAL(q_closed, 1);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
    unlink_url(url);
}

static void test_queued_bad_args(void)
{
    uv_loop_t loop;
    struct qctx c;
    CU_ASSERT_EQUAL_FATAL(uv_loop_init(&loop), 0);
    nng_socket pull;
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&pull), 0);
    CU_ASSERT_EQUAL(uvnng_init_queued(&loop, &c.u, pull, NULL, NULL, &c, 8, 1024), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(uvnng_init_queued(&loop, &c.u, pull, on_q_msg, NULL, &c, 0, 1024),
                    TANDEM_EINVAL);
    nng_close(pull);
    uv_run(&loop, UV_RUN_DEFAULT); /* nothing was left open */

    /* A socket that cannot receive: the receive fails once (logged) and is
     * not retried in a loop; closing is clean. */
    nng_socket push;
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(&push), 0);
    memset(&c, 0, sizeof(c));
    CU_ASSERT_EQUAL_FATAL(uvnng_init_queued(&loop, &c.u, push, on_q_msg, NULL, &c, 8, 1024), 0);
    sleep_ms(50);
    struct uvnng_stats st;
    uvnng_queue_stats(&c.u, &st);
    CU_ASSERT_EQUAL(st.received, 0);
    q_closed = 0;
    uvnng_close(&c.u, on_q_closed);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(q_closed, 1);
    CU_ASSERT_EQUAL(c.received, 0);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
}

/* ---- Dialing and exit ------------------------------------------------------ */

#define HANG_MS 30000 /* only a missing event reaches it */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Runs loop (kept awake by c's timer) until done(u) or HANG_MS. */
static void run_while(uv_loop_t *loop, struct uvnng *u, int (*done)(struct uvnng *u))
{
    double t0 = now_ms();
    while (!done(u) && now_ms() - t0 < HANG_MS) {
        uv_run(loop, UV_RUN_ONCE);
    }
}

static int redialed(struct uvnng *u)
{
    return uvnng_redials(u) > 0;
}

static int has_pipe(struct uvnng *u)
{
    return uvnng_pipes(u) > 0;
}

/* A dialing socket with no pipe for UVNNG_REDIAL_MS gets a new dialer (NNG
 * 1.5.2's dialer can stop for good), and the new one connects once a
 * listener comes. */
static void test_dial_redials(void)
{
    uv_loop_t loop;
    struct ctx c;
    loop_with_tick(&loop, &c);
    nng_socket push, pull;
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(&push), 0);
    CU_ASSERT_EQUAL_FATAL(uvnng_init(&loop, &c.u, push, NULL, on_pipe_ev, &c), 0);
    CU_ASSERT_EQUAL(uvnng_dial(&c.u, "inproc://uvnng-redial"), 0);
    CU_ASSERT_EQUAL(uvnng_dial(&c.u, "inproc://uvnng-redial"), TANDEM_EINVAL); /* one dial */
    CU_ASSERT_EQUAL(uvnng_pipes(&c.u), 0);
    run_while(&loop, &c.u, redialed);
    CU_ASSERT(uvnng_redials(&c.u) >= 1);
    printf("\n  %llu dialer(s) replaced while nobody listened\n",
           (unsigned long long)uvnng_redials(&c.u));
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&pull), 0);
    CU_ASSERT_EQUAL_FATAL(nng_listen(pull, "inproc://uvnng-redial", NULL, 0), 0);
    run_while(&loop, &c.u, has_pipe);
    CU_ASSERT_EQUAL(uvnng_pipes(&c.u), 1);
    run_until(&loop, &c.adds, 1);
    CU_ASSERT_EQUAL(c.adds, 1);

    closed_calls = 0;
    uvnng_close(&c.u, on_closed);
    uv_close((uv_handle_t *)&c.timer, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(closed_calls, 1);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
    nng_close(pull);
}

/* A peer that refuses us: an ipc listener, not NNG's, that answers the SP
 * handshake as a PULL0 socket (so NNG adds the pipe) and then closes the
 * connection. (Closing each pipe with nng_pipe_close on an NNG listener
 * instead makes NNG 1.5.2 write to a freed pipe under valgrind, on inproc
 * and on ipc alike: NNG's bug, not what this test is about.) */
struct refuser {
    int fd;
    int stop;
    int closed; /* connections refused */
    pthread_t thread;
    char path[100];
};

static void *refuser_main(void *arg)
{
    struct refuser *r = arg;
    /* 0, 'S', 'P', 0, protocol (big-endian: PULL0 = 0x51), 0, 0 */
    static const unsigned char head[8] = {0, 'S', 'P', 0, 0x00, 0x51, 0, 0};
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {.fd = r->fd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0) {
            continue;
        }
        int c = accept(r->fd, NULL, NULL);
        if (c < 0) {
            continue;
        }
        unsigned char theirs[8];
        size_t got = 0;
        while (got < 8) {
            ssize_t n = read(c, theirs + got, 8 - got);
            if (n <= 0) {
                break;
            }
            got += (size_t)n;
        }
        if (got == 8 && write(c, head, 8) == 8) {
            usleep(20 * 1000); /* the dialer adds the pipe */
        }
        close(c);
        __atomic_add_fetch(&r->closed, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int refuser_start(struct refuser *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->path, sizeof(r->path), "/tmp/tandem-test-uvnng-refuser-%ld.ipc", (long)getpid());
    unlink(r->path);
    r->fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", r->path);
    if (r->fd < 0 || bind(r->fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(r->fd, 8) != 0) {
        return -1;
    }
    return pthread_create(&r->thread, NULL, refuser_main, r) == 0 ? 0 : -1;
}

static void refuser_stop(struct refuser *r)
{
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
    pthread_join(r->thread, NULL);
    close(r->fd);
    unlink(r->path);
}

/* A dialer whose pipes keep coming and being closed by the peer works: it is
 * not replaced, however long the socket spends without a pipe (replacing it
 * would close a dialer mid-handshake, which NNG 1.5.2 leaks). */
static void test_dial_refused_not_redialed(void)
{
    uv_loop_t loop;
    struct ctx c;
    loop_with_tick(&loop, &c);
    struct refuser r;
    CU_ASSERT_FATAL(refuser_start(&r) == 0);
    char url[128];
    snprintf(url, sizeof(url), "ipc://%s", r.path);
    nng_socket push;
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(&push), 0);
    /* Redial after the refusal at most every 400 ms: most ticks see no pipe. */
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_ms(push, NNG_OPT_RECONNMINT, 400), 0);
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_ms(push, NNG_OPT_RECONNMAXT, 400), 0);
    CU_ASSERT_EQUAL_FATAL(uvnng_init(&loop, &c.u, push, NULL, on_pipe_ev, &c), 0);
    CU_ASSERT_EQUAL(uvnng_dial(&c.u, url), 0);
    double t0 = now_ms();
    while (now_ms() - t0 < 2.0 * UVNNG_REDIAL_MS) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    printf("\n  %d pipes refused in %d ms, %llu dialer(s) replaced\n", c.removes,
           2 * UVNNG_REDIAL_MS, (unsigned long long)uvnng_redials(&c.u));
    CU_ASSERT(c.removes >= 3);
    CU_ASSERT_EQUAL(uvnng_redials(&c.u), 0);

    closed_calls = 0;
    uvnng_close(&c.u, on_closed);
    uv_close((uv_handle_t *)&c.timer, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(closed_calls, 1);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
    refuser_stop(&r);
}

/* A URL NNG cannot dial: TANDEM_EINVAL, and the uvnng still closes. */
static void test_dial_bad_url(void)
{
    uv_loop_t loop;
    struct ctx c;
    memset(&c, 0, sizeof(c));
    CU_ASSERT_EQUAL_FATAL(uv_loop_init(&loop), 0);
    nng_socket push;
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(&push), 0);
    CU_ASSERT_EQUAL_FATAL(uvnng_init(&loop, &c.u, push, NULL, NULL, &c), 0);
    CU_ASSERT_EQUAL(uvnng_dial(&c.u, "nosuch://x"), TANDEM_EINVAL);
    closed_calls = 0;
    uvnng_close(&c.u, on_closed);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(closed_calls, 1);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
}

static int sink_removed;

static void on_sink_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    (void)arg;
    if (ev == NNG_PIPE_EV_REM_POST) {
        __atomic_add_fetch(&sink_removed, 1, __ATOMIC_RELEASE);
    }
}

/* After uvnng_set_exiting every socket is left open for the exit: a receiving
 * one with a pipe, one without pipes (their addresses stay taken) and a
 * send-only one (its pipe to the sink still carries). Last test: the exit
 * mode is for good. */
static void test_exit_leaves_receivers_open(void)
{
    uv_loop_t loop;
    struct ctx a, b, s;
    memset(&b, 0, sizeof(b));
    memset(&s, 0, sizeof(s));
    loop_with_tick(&loop, &a);
    nng_socket pa, pb, peer, sender, sink;
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&pa), 0);
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&pb), 0);
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(&peer), 0);
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(&sender), 0);
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&sink), 0);
    nng_pipe_notify(sink, NNG_PIPE_EV_REM_POST, on_sink_pipe, NULL);
    CU_ASSERT_EQUAL_FATAL(uvnng_init(&loop, &a.u, pa, on_msg, on_pipe_ev, &a), 0);
    CU_ASSERT_EQUAL_FATAL(uvnng_init(&loop, &b.u, pb, on_msg, NULL, &b), 0);
    CU_ASSERT_EQUAL_FATAL(uvnng_init(&loop, &s.u, sender, NULL, NULL, &s), 0);
    CU_ASSERT_EQUAL_FATAL(nng_listen(pa, "inproc://uvnng-exit-a", NULL, 0), 0);
    CU_ASSERT_EQUAL_FATAL(nng_listen(pb, "inproc://uvnng-exit-b", NULL, 0), 0);
    CU_ASSERT_EQUAL_FATAL(nng_listen(sink, "inproc://uvnng-exit-s", NULL, 0), 0);
    CU_ASSERT_EQUAL_FATAL(nng_dial(peer, "inproc://uvnng-exit-a", NULL, 0), 0);
    CU_ASSERT_EQUAL(uvnng_dial(&s.u, "inproc://uvnng-exit-s"), 0);
    run_until(&loop, &a.adds, 1);
    run_while(&loop, &s.u, has_pipe);
    CU_ASSERT_EQUAL(uvnng_pipes(&a.u), 1);
    CU_ASSERT_EQUAL(uvnng_pipes(&b.u), 0);
    CU_ASSERT_EQUAL(uvnng_pipes(&s.u), 1);
    uint32_t v = 7;
    CU_ASSERT_EQUAL(nng_send(peer, &v, sizeof(v), 0), 0);
    run_until(&loop, &a.received, 1);
    CU_ASSERT_EQUAL(a.sum, 7);

    uvnng_set_exiting();
    closed_calls = 0;
    uvnng_close(&a.u, on_closed);
    uvnng_close(&b.u, on_closed);
    uvnng_close(&s.u, on_closed);
    uv_close((uv_handle_t *)&a.timer, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(closed_calls, 3);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);

    nng_socket probe;
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&probe), 0);
    CU_ASSERT_EQUAL(nng_listen(probe, "inproc://uvnng-exit-a", NULL, 0), NNG_EADDRINUSE);
    CU_ASSERT_EQUAL(nng_listen(probe, "inproc://uvnng-exit-b", NULL, 0), NNG_EADDRINUSE);
    /* a's pipe lives: a send gets through (blocking, with a bound: a non-blocking one failed
     * when the pipe had not yet taken up the first message's place, 1 run in ~10 under load). */
    CU_ASSERT_EQUAL(nng_socket_set_ms(peer, NNG_OPT_SENDTIMEO, HANG_MS), 0);
    CU_ASSERT_EQUAL(nng_send(peer, &v, sizeof(v), 0), 0);
    /* The sender was left open: its pipe to the sink still carries. */
    CU_ASSERT_EQUAL(nng_send(sender, &v, sizeof(v), 0), 0);
    uint32_t *got = NULL;
    size_t got_len = 0;
    CU_ASSERT_EQUAL(nng_socket_set_ms(sink, NNG_OPT_RECVTIMEO, HANG_MS), 0);
    CU_ASSERT_EQUAL(nng_recv(sink, &got, &got_len, NNG_FLAG_ALLOC), 0);
    CU_ASSERT(got_len == sizeof(v) && got != NULL && *got == v);
    nng_free(got, got_len);
    CU_ASSERT_EQUAL(__atomic_load_n(&sink_removed, __ATOMIC_ACQUIRE), 0);
    nng_close(probe);
    nng_close(peer);
    nng_close(sink);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("uvnng", NULL, NULL);
    CU_add_test(s, "messages_and_pipes", test_messages_and_pipes);
    CU_add_test(s, "queued_blocked_ipc", test_queued_blocked_ipc);
    CU_add_test(s, "queued_blocked_tcp", test_queued_blocked_tcp);
    CU_add_test(s, "queued_msg_bound", test_queued_msg_bound);
    CU_add_test(s, "queued_byte_bound", test_queued_byte_bound);
    CU_add_test(s, "queued_close_with_messages", test_queued_close_with_messages);
    CU_add_test(s, "queued_close_from_callback", test_queued_close_from_callback);
    CU_add_test(s, "queued_bad_args", test_queued_bad_args);
    CU_add_test(s, "dial_redials", test_dial_redials);
    CU_add_test(s, "dial_refused_not_redialed", test_dial_refused_not_redialed);
    CU_add_test(s, "dial_bad_url", test_dial_bad_url);
    CU_add_test(s, "exit_leaves_receivers_open", test_exit_leaves_receivers_open);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    nng_fini(); /* NNG's threads, so valgrind sees no leak */
    return failed ? 1 : 0;
}
