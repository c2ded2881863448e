/* uvsp, the loop's own PAIR0 dialer, against real NNG PAIR0 listeners (the
 * peer a worker is) on ipc:// and tcp://, and against raw sockets that speak
 * the protocol wrong: messages of every size arrive whole and in order both
 * ways, a peer that is not PAIR0 or breaks a frame is disconnected and
 * dialled again, a restarted peer is found again, and a callback may drop
 * the pipe or close the link. */
#include <CUnit/Basic.h>
#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>
#include <nng/protocol/pipeline0/push.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "../integration/expect.h"
#include "tandem_err.h"
#include "uvsp.h"

#define MAX_MSG (4u << 20)

/* What the loop saw. */
struct seen {
    int ups, downs;
    int pipe;      /* the current one, 0 when down */
    int last_pipe; /* the last one that came up */
    int msgs;
    size_t bytes;
    uint32_t next_seq; /* messages carry a sequence number in their first 4 bytes */
    int out_of_order;
    int bad_content;
    int drop_at; /* drop the pipe when this message arrives (0: never) */
    int close_at;
    int closed;
};

static struct seen seen;
static uv_loop_t loop;
static uv_timer_t tick;

/* A message of len bytes: seq, then bytes that depend on seq and position. */
static void fill(uint8_t *p, size_t len, uint32_t seq)
{
    for (size_t i = 0; i < len; i++) {
        p[i] = (uint8_t)(seq * 31 + i * 7);
    }
    if (len >= 4) {
        memcpy(p, &seq, 4);
    }
}

static int check(const uint8_t *p, size_t len, uint32_t seq)
{
    for (size_t i = 4; i < len; i++) {
        if (p[i] != (uint8_t)(seq * 31 + i * 7)) {
            return 0;
        }
    }
    uint32_t got;
    memcpy(&got, p, 4);
    return len < 4 || got == seq;
}

static void on_recv(struct uvsp *sp, const uint8_t *body, size_t len, int pipe)
{
    CU_ASSERT(pipe == seen.pipe && pipe > 0);
    seen.msgs++;
    seen.bytes += len;
    if (len >= 4) {
        uint32_t seq;
        memcpy(&seq, body, 4);
        seen.out_of_order += seq != seen.next_seq;
        seen.bad_content += !check(body, len, seq);
        seen.next_seq = seq + 1;
    }
    if (seen.drop_at == seen.msgs) {
        EXPECT_EQ(uvsp_drop(sp, pipe), 0);
        EXPECT_EQ(seen.pipe, 0); /* pipe_cb ran before uvsp_drop returned */
    }
    if (seen.close_at == seen.msgs) {
        uvsp_close(sp, NULL);
    }
}

static void on_pipe(struct uvsp *sp, int pipe, int up)
{
    (void)sp;
    CU_ASSERT(pipe > 0);
    if (up) {
        CU_ASSERT(seen.pipe == 0);
        CU_ASSERT(pipe != seen.last_pipe);
        seen.ups++;
        seen.pipe = seen.last_pipe = pipe;
    } else {
        CU_ASSERT(pipe == seen.pipe);
        seen.downs++;
        seen.pipe = 0;
    }
}

static void on_closed(struct uvsp *sp)
{
    (void)sp;
    seen.closed++;
}

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

static void loop_start(void)
{
    memset(&seen, 0, sizeof(seen));
    CU_ASSERT_FATAL(uv_loop_init(&loop) == 0);
    uv_timer_init(&loop, &tick);
    uv_timer_start(&tick, on_tick, 5, 5); /* UV_RUN_ONCE never blocks long */
}

/* Runs the loop until *v >= want or ms pass; returns *v. */
static int run_until(const int *v, int want, int ms)
{
    uint64_t end = uv_now(&loop) + (uint64_t)ms;
    while (*v < want && uv_now(&loop) < end) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    return *v;
}

static void run_for(int ms)
{
    int never = 0;
    run_until(&never, 1, ms);
}

static void loop_end(struct uvsp *sp)
{
    if (sp != NULL && !sp->closing) {
        uvsp_close(sp, on_closed);
    }
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop), 0);
}

/* Ends a test with an NNG peer: our side first, then the peer once NNG has
 * torn its end of the pipe down. (NNG 1.5.2 loses a listener's objects when
 * its socket closes while a pipe is mid-handshake: valgrind saw it when the
 * peer was closed first, with our redial in flight.) */
static void loop_end_peer(struct uvsp *sp, nng_socket peer)
{
    loop_end(sp);
    uv_sleep(100);
    nng_close(peer);
}

static void ipc_url(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "ipc:///tmp/tandem-test-uvsp-%ld-%s.ipc", (long)getpid(), name);
}

/* A PAIR0 listener on url; with port 0 the bound URL replaces it. */
static nng_socket pair_listen(char *url, size_t cap)
{
    nng_socket s;
    CU_ASSERT_FATAL(nng_pair0_open(&s) == 0);
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, MAX_MSG + 16);
    nng_socket_set_int(s, NNG_OPT_SENDBUF, 1024);
    nng_socket_set_int(s, NNG_OPT_RECVBUF, 1024);
    nng_listener l;
    CU_ASSERT_FATAL(nng_listen(s, url, &l, 0) == 0);
    char *bound = NULL;
    if (nng_listener_get_string(l, NNG_OPT_URL, &bound) == 0) {
        snprintf(url, cap, "%s", bound);
        nng_strfree(bound);
    }
    return s;
}

static nng_msg *make_msg(size_t len, uint32_t seq)
{
    nng_msg *m;
    CU_ASSERT_FATAL(nng_msg_alloc(&m, len) == 0);
    fill(nng_msg_body(m), len, seq);
    return m;
}

/* A fresh loop, a PAIR0 peer listening on ipc (name) and sp connected to it
 * (its pipe up); returns the peer, url is its address. */
static nng_socket connected(struct uvsp *sp, const char *name, char *url, size_t cap)
{
    ipc_url(url, cap, name);
    loop_start();
    nng_socket peer = pair_listen(url, cap);
    EXPECT_EQ(uvsp_open(&loop, sp, url, MAX_MSG, on_recv, on_pipe, NULL), 0);
    EXPECT_EQ(run_until(&seen.ups, 1, 5000), 1);
    return peer;
}

/* The socket of the link's connection: the loop's one pipe or tcp handle. */
static void find_stream(uv_handle_t *h, void *arg)
{
    if (h->type == UV_NAMED_PIPE || h->type == UV_TCP) {
        uv_fileno(h, arg);
    }
}

/* Waits, without running the loop, until `bytes` have arrived unread on the
 * link's socket: the peer's NNG has written every message it was given.
 * NNG 1.5.2 leaks a message still in its send aio when the pipe closes (see
 * tests/sanitizers/lsan.supp), so the tests that close or drop the link
 * with messages in flight wait for them to leave NNG first. */
static void wait_unread(int bytes)
{
    uv_os_fd_t fd = -1;
    uv_walk(&loop, find_stream, &fd);
    CU_ASSERT_FATAL(fd >= 0);
    int unread = 0;
    for (int i = 0; i < 5000 && unread < bytes; i++) {
        CU_ASSERT_FATAL(ioctl(fd, FIONREAD, &unread) == 0);
        if (unread < bytes) {
            usleep(1000);
        }
    }
    EXPECT_EQ(unread, bytes);
}

/* ---- Both ways, every size ------------------------------------------------ */

/* The peer: echoes every message back until stop. */
struct echo {
    nng_socket s;
    int stop;
    int echoed;
    pthread_t thread;
};

static void *echo_main(void *arg)
{
    struct echo *e = arg;
    nng_socket_set_ms(e->s, NNG_OPT_RECVTIMEO, 50);
    while (!__atomic_load_n(&e->stop, __ATOMIC_ACQUIRE)) {
        nng_msg *m;
        if (nng_recvmsg(e->s, &m, 0) != 0) {
            continue;
        }
        if (nng_sendmsg(e->s, m, 0) != 0) {
            nng_msg_free(m);
            continue;
        }
        __atomic_add_fetch(&e->echoed, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* Sizes that cross every boundary of the reader: empty, shorter than a
 * length header, a read chunk (64 KiB) and its neighbours, more than the
 * read buffer keeps (1 MiB), and the limit itself. */
static const size_t sizes[] = {4, 5, 8, 9, 100, 65535, 65536, 65537, 300000, 1500000, MAX_MSG};

static void roundtrip(const char *url_in)
{
    char url[256];
    snprintf(url, sizeof(url), "%s", url_in);
    loop_start();
    struct echo e = {.s = pair_listen(url, sizeof(url))};
    CU_ASSERT_FATAL(uvsp_url_ok(url));
    struct uvsp sp;
    EXPECT_EQ(uvsp_open(&loop, &sp, url, MAX_MSG, on_recv, on_pipe, NULL), 0);
    EXPECT_EQ(run_until(&seen.ups, 1, 5000), 1);
    CU_ASSERT_FATAL(seen.pipe > 0);
    EXPECT_EQ(uvsp_pipe(&sp), seen.pipe);
    CU_ASSERT_FATAL(pthread_create(&e.thread, NULL, echo_main, &e) == 0);

    /* Many small ones in one turn (they share reads), then every size. */
    uint32_t seq = 0;
    size_t want_bytes = 0;
    for (int i = 0; i < 500; i++, seq++) {
        EXPECT_EQ(uvsp_send(&sp, make_msg(16, seq)), 0);
        want_bytes += 16;
    }
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++, seq++) {
        EXPECT_EQ(uvsp_send(&sp, make_msg(sizes[i], seq)), 0);
        want_bytes += sizes[i];
    }
    EXPECT_EQ(run_until(&seen.msgs, (int)seq, 20000), (int)seq);
    EXPECT_EQ(seen.bytes, want_bytes);
    EXPECT_EQ(seen.out_of_order, 0);
    EXPECT_EQ(seen.bad_content, 0);
    EXPECT_EQ(seen.downs, 0);
    EXPECT_EQ(sp.dropped, 0);

    /* An empty message has no sequence number: it arrives, counted. */
    nng_msg *empty;
    CU_ASSERT_FATAL(nng_msg_alloc(&empty, 0) == 0);
    EXPECT_EQ(uvsp_send(&sp, empty), 0);
    EXPECT_EQ(run_until(&seen.msgs, (int)seq + 1, 5000), (int)seq + 1);
    EXPECT_EQ(seen.bytes, want_bytes);

    __atomic_store_n(&e.stop, 1, __ATOMIC_RELEASE);
    pthread_join(e.thread, NULL);
    nng_close(e.s);
    EXPECT_EQ(run_until(&seen.downs, 1, 5000), 1); /* the peer went away */
    EXPECT_EQ(uvsp_pipe(&sp), 0);
    nng_msg *m = make_msg(8, 0);
    EXPECT_EQ(uvsp_send(&sp, m), TANDEM_ENOENT); /* no pipe: the message is still ours */
    nng_msg_free(m);
    loop_end(&sp);
    EXPECT_EQ(seen.closed, 1);
}

static void test_roundtrip_ipc(void)
{
    char url[128];
    ipc_url(url, sizeof(url), "rt");
    roundtrip(url);
}

static void test_roundtrip_tcp(void)
{
    roundtrip("tcp://127.0.0.1:0");
}

/* ---- Peers that come and go ------------------------------------------------ */

/* The peer closes and comes back on the same address: the link finds it,
 * as a new pipe; messages the peer sent before flow as they should. */
static void test_peer_restart(void)
{
    char url[128];
    struct uvsp sp;
    nng_socket peer = connected(&sp, "restart", url, sizeof(url));
    int first = seen.pipe;
    for (uint32_t i = 0; i < 3; i++) {
        EXPECT_EQ(nng_sendmsg(peer, make_msg(64, i), 0), 0);
    }
    EXPECT_EQ(run_until(&seen.msgs, 3, 5000), 3);
    nng_close(peer);
    EXPECT_EQ(run_until(&seen.downs, 1, 5000), 1);
    run_for(300); /* dials fail while nobody listens */
    CU_ASSERT(sp.dials >= 2);
    peer = pair_listen(url, sizeof(url));
    EXPECT_EQ(run_until(&seen.ups, 2, 5000), 2);
    CU_ASSERT(seen.pipe != first);
    EXPECT_EQ(nng_sendmsg(peer, make_msg(64, 3), 0), 0);
    EXPECT_EQ(run_until(&seen.msgs, 4, 5000), 4);
    EXPECT_EQ(seen.out_of_order, 0);
    EXPECT_EQ(sp.dropped, 0); /* a peer going away is not a fault */
    loop_end_peer(&sp, peer);
}

/* A callback drops the pipe: no later message of it is delivered, the
 * link dials again and the peer's next messages come on the new pipe. */
static void test_drop_from_callback(void)
{
    char url[128];
    struct uvsp sp;
    nng_socket peer = connected(&sp, "drop", url, sizeof(url));
    int first = seen.pipe;
    seen.drop_at = 2;
    for (uint32_t i = 0; i < 3; i++) {
        EXPECT_EQ(nng_sendmsg(peer, make_msg(32, i), 0), 0);
    }
    wait_unread(3 * (1 + 8 + 32)); /* all three in one read: ipc type, length, body */
    run_until(&seen.ups, 2, 5000);
    EXPECT_EQ(seen.downs, 1);
    EXPECT_EQ(seen.ups, 2);
    CU_ASSERT(seen.last_pipe != first);
    EXPECT_EQ(seen.msgs, 2); /* the third came in the same read, after the drop */
    EXPECT_EQ(uvsp_drop(&sp, first), TANDEM_ENOENT); /* not the current pipe */
    loop_end_peer(&sp, peer);
}

/* A callback closes the link: nothing more is delivered, the close
 * callback is not needed (NULL). */
static void test_close_from_callback(void)
{
    char url[128];
    struct uvsp sp;
    nng_socket peer = connected(&sp, "close", url, sizeof(url));
    seen.close_at = 1;
    for (uint32_t i = 0; i < 3; i++) {
        EXPECT_EQ(nng_sendmsg(peer, make_msg(32, i), 0), 0);
    }
    wait_unread(3 * (1 + 8 + 32));
    run_for(300);
    EXPECT_EQ(seen.msgs, 1);
    EXPECT_EQ(seen.downs, 0); /* closing reports nothing */
    loop_end_peer(NULL, peer);
}

/* ---- Peers that speak it wrong -------------------------------------------- */

/* Not PAIR0 (a PUSH0 listener): no pipe ever comes up; the link keeps
 * dialling, and each try is counted as a fault. */
static void test_wrong_protocol(void)
{
    char url[128];
    ipc_url(url, sizeof(url), "push");
    loop_start();
    nng_socket peer;
    CU_ASSERT_FATAL(nng_push0_open(&peer) == 0);
    CU_ASSERT_FATAL(nng_listen(peer, url, NULL, 0) == 0);
    struct uvsp sp;
    EXPECT_EQ(uvsp_open(&loop, &sp, url, MAX_MSG, on_recv, on_pipe, NULL), 0);
    int dropped = 0;
    for (uint64_t end = uv_now(&loop) + 5000; sp.dropped < 2 && uv_now(&loop) < end;) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    dropped = (int)sp.dropped;
    CU_ASSERT(dropped >= 2);
    EXPECT_EQ(seen.ups, 0);
    EXPECT_EQ(seen.msgs, 0);
    loop_end_peer(&sp, peer);
}

/* A raw ipc peer: accepts, reads our header, writes `reply` and waits for
 * the close. */
struct raw {
    int fd;
    int stop;
    int served;
    int bad_header; /* connections whose first 8 bytes were not a PAIR0 header */
    const uint8_t *reply;
    size_t reply_len;
    pthread_t thread;
    char path[100];
};

static void *raw_main(void *arg)
{
    struct raw *r = arg;
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {.fd = r->fd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0) {
            continue;
        }
        int c = accept(r->fd, NULL, NULL);
        if (c < 0) {
            continue;
        }
        uint8_t theirs[8];
        size_t got = 0;
        while (got < 8) {
            ssize_t n = read(c, theirs + got, 8 - got);
            if (n <= 0) {
                break;
            }
            got += (size_t)n;
        }
        static const uint8_t pair0_header[8] = {0, 'S', 'P', 0, 0x00, 0x10, 0, 0};
        if (got != 8 || memcmp(theirs, pair0_header, 8) != 0) {
            __atomic_add_fetch(&r->bad_header, 1, __ATOMIC_RELEASE);
        }
        if (write(c, r->reply, r->reply_len) == (ssize_t)r->reply_len) {
            uint8_t b;
            struct pollfd q = {.fd = c, .events = POLLIN};
            if (poll(&q, 1, 2000) > 0 && read(c, &b, 1) == 0) {
                __atomic_add_fetch(&r->served, 1, __ATOMIC_RELEASE); /* we were hung up on */
            }
        }
        close(c);
    }
    return NULL;
}

static void raw_peer(const uint8_t *reply, size_t len, int want_ups, int want_msgs)
{
    loop_start();
    struct raw r = {.reply = reply, .reply_len = len};
    snprintf(r.path, sizeof(r.path), "/tmp/tandem-test-uvsp-%ld-raw.ipc", (long)getpid());
    unlink(r.path);
    r.fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", r.path);
    CU_ASSERT_FATAL(r.fd >= 0 && bind(r.fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
                    listen(r.fd, 8) == 0);
    CU_ASSERT_FATAL(pthread_create(&r.thread, NULL, raw_main, &r) == 0);
    char url[128];
    snprintf(url, sizeof(url), "ipc://%s", r.path);
    struct uvsp sp;
    EXPECT_EQ(uvsp_open(&loop, &sp, url, 1000, on_recv, on_pipe, NULL), 0);
    for (uint64_t end = uv_now(&loop) + 5000;
         (sp.dropped < 2 || __atomic_load_n(&r.served, __ATOMIC_ACQUIRE) < 2) &&
         uv_now(&loop) < end;) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    CU_ASSERT(sp.dropped >= 2);
    CU_ASSERT(__atomic_load_n(&r.served, __ATOMIC_ACQUIRE) >= 2);
    /* Each connection: the pipe came up (or not) and went; what came before
     * the bad frame was delivered. */
    CU_ASSERT(want_ups ? seen.ups >= 2 : seen.ups == 0);
    EXPECT_EQ(seen.downs, seen.ups - (seen.pipe != 0));
    CU_ASSERT(want_msgs ? seen.msgs >= 2 * want_msgs : seen.msgs == 0);
    loop_end(&sp);
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(r.thread, NULL);
    EXPECT_EQ(r.bad_header, 0);
    close(r.fd);
    unlink(r.path);
}

/* Not SP at all (an HTTP server, say). */
static void test_not_sp(void)
{
    static const uint8_t http[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    raw_peer(http, sizeof(http) - 1, 0, 0);
}

#define PAIR0_HEADER 0, 'S', 'P', 0, 0x00, 0x10, 0, 0
#define FRAME4(b)    1, 0, 0, 0, 0, 0, 0, 0, 4, b, b, b, b /* ipc: type, length 4, body */

/* A good message, then a frame of type 2: the first is delivered. */
static void test_bad_frame_type(void)
{
    static const uint8_t reply[] = {PAIR0_HEADER, FRAME4(0), 2, 0, 0, 0, 0, 0, 0, 0, 4, 1, 1, 1, 1};
    raw_peer(reply, sizeof(reply), 1, 1);
}

/* A good message, then one over the link's limit (1000 bytes here). */
static void test_oversized(void)
{
    static const uint8_t reply[] = {PAIR0_HEADER, FRAME4(0), 1, 0, 0, 0, 0, 0, 0, 0x03, 0xe9};
    raw_peer(reply, sizeof(reply), 1, 1);
}

/* ---- Addresses and edges --------------------------------------------------- */

static void test_url_ok(void)
{
    CU_ASSERT(uvsp_url_ok("ipc:///tmp/x.ipc"));
    CU_ASSERT(uvsp_url_ok("ipc://relative.ipc"));
    CU_ASSERT(uvsp_url_ok("tcp://127.0.0.1:7000"));
    CU_ASSERT(uvsp_url_ok("tcp://[::1]:7000"));
    CU_ASSERT(uvsp_url_ok("tcp://10.1.2.3:65535"));
    /* NNG's: TLS, names to resolve, in-process. */
    CU_ASSERT(!uvsp_url_ok("tls+tcp://127.0.0.1:7000"));
    CU_ASSERT(!uvsp_url_ok("tcp://localhost:7000"));
    CU_ASSERT(!uvsp_url_ok("tcp://tandem-router:7000"));
    CU_ASSERT(!uvsp_url_ok("inproc://x"));
    /* Not addresses to dial. */
    CU_ASSERT(!uvsp_url_ok("tcp://127.0.0.1"));
    CU_ASSERT(!uvsp_url_ok("tcp://127.0.0.1:0"));
    CU_ASSERT(!uvsp_url_ok("tcp://127.0.0.1:70000"));
    CU_ASSERT(!uvsp_url_ok("tcp://127.0.0.1:7x"));
    CU_ASSERT(!uvsp_url_ok("tcp://127.0.0.1:"));
    CU_ASSERT(!uvsp_url_ok("tcp://1.2:7000")); /* inet_aton would take it; NNG would not */
    CU_ASSERT(!uvsp_url_ok("tcp://[::1]7000"));
    CU_ASSERT(!uvsp_url_ok("tcp://:7000"));
    CU_ASSERT(!uvsp_url_ok("ipc://"));
    CU_ASSERT(!uvsp_url_ok(""));
    CU_ASSERT(!uvsp_url_ok(NULL));
    char long_path[300];
    memset(long_path, 'a', sizeof(long_path) - 1);
    long_path[sizeof(long_path) - 1] = '\0';
    memcpy(long_path, "ipc:///", 7);
    CU_ASSERT(!uvsp_url_ok(long_path)); /* longer than sun_path */

    struct uvsp sp;
    loop_start();
    EXPECT_EQ(uvsp_open(&loop, &sp, "tcp://localhost:1", MAX_MSG, on_recv, on_pipe, NULL),
              TANDEM_EINVAL);
    EXPECT_EQ(uvsp_open(&loop, &sp, "ipc:///tmp/x", MAX_MSG, NULL, on_pipe, NULL), TANDEM_EINVAL);
    loop_end(NULL);
}

/* Closed while nobody listens (a dial pending or waiting): the close
 * callback runs and nothing is left open (the loop closes). With a backoff
 * of a second, the link does not dial again within half of one. */
static void test_close_while_dialing(void)
{
    char url[128];
    ipc_url(url, sizeof(url), "nobody");
    unlink(url + 6);
    loop_start();
    struct uvsp sp;
    EXPECT_EQ(uvsp_open(&loop, &sp, url, MAX_MSG, on_recv, on_pipe, NULL), 0);
    uvsp_set_backoff(&sp, 1000, 1000);
    run_for(500);
    EXPECT_EQ(sp.dials, 1);
    EXPECT_EQ(seen.ups, 0);
    loop_end(&sp);
    EXPECT_EQ(seen.closed, 1);

    loop_start();
    EXPECT_EQ(uvsp_open(&loop, &sp, "tcp://127.0.0.1:1", MAX_MSG, on_recv, on_pipe, NULL), 0);
    loop_end(&sp); /* at once: the connect is cancelled */
    EXPECT_EQ(seen.closed, 1);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("uvsp", NULL, NULL);
    CU_add_test(s, "roundtrip_ipc", test_roundtrip_ipc);
    CU_add_test(s, "roundtrip_tcp", test_roundtrip_tcp);
    CU_add_test(s, "peer_restart", test_peer_restart);
    CU_add_test(s, "drop_from_callback", test_drop_from_callback);
    CU_add_test(s, "close_from_callback", test_close_from_callback);
    CU_add_test(s, "wrong_protocol", test_wrong_protocol);
    CU_add_test(s, "not_sp", test_not_sp);
    CU_add_test(s, "bad_frame_type", test_bad_frame_type);
    CU_add_test(s, "oversized", test_oversized);
    CU_add_test(s, "url_ok", test_url_ok);
    CU_add_test(s, "close_while_dialing", test_close_while_dialing);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
