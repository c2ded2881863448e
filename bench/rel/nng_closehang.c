/* nng_closehang: NNG 1.5.2's close deadlock with NNG calls only
 * (docs/nng-close-deadlock.md). A PULL0 listener socket is opened, takes
 * messages and is closed, over and over, while PUSH0 dialer threads connect,
 * send and close. Built by bench/CMakeLists.txt, never run by ctest.
 *
 *   nng_closehang [iterations] [dialer threads] [mode]     (300 4 0)
 *
 * mode  PULL0 listener                              PUSH0 dialers
 *   0   closed every iteration (nng_close)          dial, send 3, close
 *   1   same as 0                                   dial once, send forever
 *   2   opened once, never closed                   dial, send 3, close
 *   3   same as 0                                   dial, send nothing, close
 *   4   same as 0, never calls nng_recvmsg          dial, send 3, close
 *   5   a new one each iteration (its own address); the old one is left
 *       open with its pipes (the process exit closes it): uvnng's avoidance
 *                                                   dial, send 3, close
 *   6   each iteration: listener closed, every live pipe closed with
 *       nng_pipe_close, then nng_close once no pipe is left
 *                                                   dial, send 3, close
 *   7   same as 0                                   dial, send 3 EMPTY
 *       messages (the 9-byte header is all: one read per message), close
 *
 * A monitor thread prints "stuck at iteration N" and every thread's
 * backtrace (gdb) when no iteration ends for 3 s, then exits 3. Exit 0 and
 * "no hang" otherwise. */
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DIALERS 16
#define MAX_PIPES   256

static char url_fmt[200];
static atomic_long url_gen; /* mode 5: the address of iteration url_gen */
static atomic_int stop_dialers;
static atomic_long progress;
static int mode;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long events;
static nng_pipe live[MAX_PIPES]; /* mode 6: pipes added and not yet removed */
static int n_live;

static void current_url(char *out, size_t cap)
{
    snprintf(out, cap, url_fmt, mode == 5 ? atomic_load(&url_gen) : 0L);
}

static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    events++;
    if (ev == NNG_PIPE_EV_ADD_POST && n_live < MAX_PIPES) {
        live[n_live++] = p;
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        for (int i = 0; i < n_live; i++) {
            if (nng_pipe_id(live[i]) == nng_pipe_id(p)) {
                live[i] = live[--n_live];
                break;
            }
        }
    }
    pthread_mutex_unlock(&mu);
}

static void *dialer(void *arg)
{
    (void)arg;
    int sends = mode == 1 ? 1000000 : mode == 3 ? 0 : 3;
    while (!atomic_load(&stop_dialers)) {
        nng_socket s;
        if (nng_push0_open(&s) != 0) {
            continue;
        }
        char url[256];
        current_url(url, sizeof(url));
        nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 1);
        nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 10);
        nng_dial(s, url, NULL, NNG_FLAG_NONBLOCK);
        for (int i = 0; i < sends && !atomic_load(&stop_dialers); i++) {
            nng_send(s, "hello", mode == 7 ? 0 : 5, NNG_FLAG_NONBLOCK);
            usleep(200);
            if (mode == 2) {
                atomic_fetch_add(&progress, 1);
            }
        }
        if (mode == 3) {
            usleep(600);
        }
        nng_close(s);
    }
    return NULL;
}

static void *monitor(void *arg)
{
    (void)arg;
    long last = -1;
    int stuck = 0;
    for (;;) {
        sleep(1);
        long now = atomic_load(&progress);
        if (now == last && ++stuck >= 3) {
            char cmd[128];
            fprintf(stderr, "stuck at iteration %ld; stacks:\n", now);
            snprintf(cmd, sizeof(cmd), "gdb -p %d -batch -ex 'thread apply all bt' 1>&2",
                     (int)getpid());
            if (system(cmd) != 0) {
                fprintf(stderr, "(gdb failed: no stacks)\n");
            }
            _exit(3);
        }
        if (now != last) {
            stuck = 0;
        }
        last = now;
    }
    return NULL;
}

static void take(nng_socket s)
{
    nng_msg *m;
    if (mode != 4 && nng_recvmsg(s, &m, NNG_FLAG_NONBLOCK) == 0) {
        nng_msg_free(m);
    }
}

/* Mode 6: no new pipe, close the live ones, wait until none is left. */
static void close_pipes_first(nng_listener l)
{
    nng_listener_close(l);
    nng_pipe mine[MAX_PIPES];
    pthread_mutex_lock(&mu);
    int n = n_live;
    memcpy(mine, live, (size_t)n * sizeof(mine[0]));
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n; i++) {
        nng_pipe_close(mine[i]);
    }
    for (;;) {
        pthread_mutex_lock(&mu);
        n = n_live;
        pthread_mutex_unlock(&mu);
        if (n == 0) {
            return;
        }
        usleep(100);
    }
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 300;
    int nd = argc > 2 ? atoi(argv[2]) : 4;
    mode = argc > 3 ? atoi(argv[3]) : 0;
    if (iters < 1 || nd < 1 || nd > MAX_DIALERS || mode < 0 || mode > 7) {
        fprintf(stderr,
                "usage: nng_closehang [iterations >= 1] [dialer threads 1..%d] "
                "[mode 0..7]\n",
                MAX_DIALERS);
        return 2;
    }
    snprintf(url_fmt, sizeof(url_fmt), "ipc:///tmp/nng_closehang-%d-%%ld.ipc", (int)getpid());
    pthread_t m;
    pthread_create(&m, NULL, monitor, NULL);
    pthread_t d[MAX_DIALERS];
    for (int i = 0; i < nd; i++) {
        pthread_create(&d[i], NULL, dialer, NULL);
    }
    for (long it = 0; it < iters; it++) {
        nng_socket s;
        nng_listener l;
        char url[256];
        if (nng_pull0_open(&s) != 0) {
            abort();
        }
        nng_pipe_notify(s, NNG_PIPE_EV_ADD_POST, on_pipe, NULL);
        nng_pipe_notify(s, NNG_PIPE_EV_REM_POST, on_pipe, NULL);
        current_url(url, sizeof(url));
        if (nng_listen(s, url, &l, 0) != 0) {
            fprintf(stderr, "listen on %s failed\n", url);
            abort();
        }
        for (int k = 0; k < 20; k++) {
            take(s);
            usleep(100 + rand() % 500);
        }
        if (mode == 2) {
            for (int w = 0; w < 3000; w++) {
                take(s);
                usleep(1000);
            }
        }
        if (mode == 5) {
            /* Left open: dialers move to the next address, and close
             * their pipes to this socket while it lives on. */
            atomic_fetch_add(&url_gen, 1);
            char *path = strchr(url, '/') + 2;
            unlink(path);
        } else {
            if (mode == 6) {
                close_pipes_first(l);
            }
            nng_close(s);
        }
        atomic_fetch_add(&progress, 1);
    }
    atomic_store(&stop_dialers, 1);
    for (int i = 0; i < nd; i++) {
        pthread_join(d[i], NULL);
    }
    printf("%d iterations, %ld pipe events, no hang\n", iters, events);
    return 0;
}
