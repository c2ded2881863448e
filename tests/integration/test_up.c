/* `tandem up` with real processes: flags and --dry-run; the workers-only
 * cluster (start, kill -9 and restart, stop on SIGINT with no process and no
 * ipc file left); a failing worker at start; and the router path against a
 * stand-in router that keeps the tandem-router contract (this executable,
 * run under the name tandem-router: READY line, workers' announcements on
 * NNG, GET /health and /v1/cluster), for joining, rejoining after a worker or
 * router crash, the start timeout and the SIGKILL deadline. The tests that
 * need the real tandem-router (a completion over HTTP; a cluster file with
 * a tls section, certificates made at test time with
 * deploy/make-cluster-ca.sh) print "SKIPPED: tandem-router not built" while
 * it does not exist, and fail then if TANDEM_REQUIRE_ROUTER=1.
 *
 * The test process is a child subreaper (leftover.h), so any process `tandem
 * up` leaked would descend from it; after each run it checks that none does,
 * running or exited. Every process tandem up started must have exited as the
 * test expects (tandem up's exit lines, up_exits.h): 0 on the stop's SIGTERM,
 * killed by signal 9 where the test killed it, and no other exit.
 *
 * No wall-clock bounds: each wait is for an event (a line on stdout, in a
 * log, an exit), with a generous timeout that only catches a hang. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>

#include "backend.h"
#include "leftover.h"
#include "tiny.h"
#include "up_exits.h"
#include "wire.h"

/* Timeouts that only catch a hang. READY_MS is longer than tandem up's own
 * --timeout (60 s), so a slow start is reported by tandem up itself. */
#define READY_MS 90000
#define EVENT_MS 30000
#define EXIT_MS  60000

/* tandem up's --stop-timeout in these tests (unless a test gives one):
 * longer than the workers' 10 s stop watchdog (worker/worker.c,
 * common/watchdog.h), so a stop that hangs ends by its watchdog, exit code 70
 * after a message (a failure: the exit lines want exit code 0), rather than by
 * tandem up's SIGKILL at the default 4.5 s; a SIGKILL means a hang no
 * watchdog caught. */
#define STOP_TIMEOUT_S "15"

extern char **environ;

static char bin_dir[PATH_MAX];
static char src_dir[PATH_MAX];
static char tmp_root[] = "/tmp/test_up_XXXXXX";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ------------------------------------------------------------------ */
/* The stand-in router                                                 */
/* ------------------------------------------------------------------ */

static volatile sig_atomic_t fake_stop;

static void fake_on_term(int sig)
{
    (void)sig;
    fake_stop = 1;
}

struct fake_worker {
    char id[128];
    char role[16];
    double seen_ms;
};

static void fake_reply(int fd, int status, const char *body)
{
    char head[256];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: "
                     "%zu\r\nConnection: close\r\n\r\n",
                     status, strlen(body));
    if (write(fd, head, (size_t)n) < 0 || write(fd, body, strlen(body)) < 0) {
        return;
    }
}

static int fake_router_main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *announce = NULL;
    int port = 8000;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--host")) {
            host = argv[++i];
        } else if (!strcmp(argv[i], "--port")) {
            port = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--announce")) {
            announce = argv[++i];
        }
    }
    if (getenv("FAKE_ROUTER_IGNORE_TERM")) {
        signal(SIGTERM, SIG_IGN);
    } else {
        signal(SIGTERM, fake_on_term);
    }
    signal(SIGINT, fake_on_term);
    nng_socket s;
    int rv;
    if (!announce || (rv = nng_pull0_open(&s)) != 0 || (rv = nng_listen(s, announce, NULL, 0))) {
        fprintf(stderr, "fake router: cannot listen on %s\n", announce ? announce : "(none)");
        return 1;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    socklen_t alen = sizeof(a);
    if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 16) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) != 0) {
        fprintf(stderr, "fake router: cannot listen on %s:%d: %s\n", host, port, strerror(errno));
        return 1;
    }
    printf("READY id=router http=127.0.0.1:%d announce=%s\n", ntohs(a.sin_port), announce);
    fflush(stdout);
    fprintf(stderr, "fake router: up\n");
    int nfd;
    nng_socket_get_int(s, NNG_OPT_RECVFD, &nfd);
    struct fake_worker seen[64];
    int n_seen = 0;
    while (!fake_stop) {
        struct pollfd pf[2] = {{.fd = lfd, .events = POLLIN}, {.fd = nfd, .events = POLLIN}};
        if (poll(pf, 2, 100) <= 0) {
            continue;
        }
        Tandem__Envelope *env;
        while (wire_recv(s, NNG_FLAG_NONBLOCK, &env) == 0) {
            if (env->body_case == TANDEM__ENVELOPE__BODY_HELLO) {
                const Tandem__WorkerHello *h = env->hello;
                int i = 0;
                while (i < n_seen && strcmp(seen[i].id, h->worker_id) != 0) {
                    i++;
                }
                if (i == n_seen && n_seen < 64) {
                    n_seen++;
                    snprintf(seen[i].id, sizeof(seen[i].id), "%s", h->worker_id);
                    fprintf(stderr, "fake router: hello from %s\n", h->worker_id);
                }
                if (i < 64) {
                    seen[i].seen_ms = now_ms();
                    snprintf(seen[i].role, sizeof(seen[i].role), "%s",
                             h->role == TANDEM__WORKER_HELLO__ROLE__PREFILL     ? "prefill"
                             : h->role == TANDEM__WORKER_HELLO__ROLE__COLOCATED ? "colocated"
                                                                                : "decode");
                }
            }
            wire_free(env);
        }
        if (!(pf[0].revents & POLLIN)) {
            continue;
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            continue;
        }
        char req[4096];
        size_t got = 0;
        struct pollfd rp = {.fd = fd, .events = POLLIN};
        while (got < sizeof(req) - 1 && poll(&rp, 1, 1000) > 0) {
            ssize_t r = read(fd, req + got, sizeof(req) - 1 - got);
            if (r <= 0) {
                break;
            }
            got += (size_t)r;
            req[got] = '\0';
            if (strstr(req, "\r\n\r\n")) {
                break;
            }
        }
        req[got] = '\0';
        if (!strncmp(req, "GET /health ", 12)) {
            fake_reply(fd, 200, "{\"status\":\"ok\"}");
        } else if (!strncmp(req, "GET /v1/cluster ", 16)) {
            char body[8192];
            size_t o = (size_t)snprintf(body, sizeof(body), "{\"endpoints\":[");
            int healthy_ok = getenv("FAKE_ROUTER_NO_HEALTH") == NULL;
            for (int i = 0; i < n_seen; i++) {
                int healthy = healthy_ok && now_ms() - seen[i].seen_ms < 2500;
                o += (size_t)snprintf(
                    body + o, sizeof(body) - o, "%s{\"id\":\"%s\",\"role\":\"%s\",\"healthy\":%s}",
                    i ? "," : "", seen[i].id, seen[i].role, healthy ? "true" : "false");
            }
            snprintf(body + o, sizeof(body) - o, "]}");
            fake_reply(fd, 200, body);
        } else {
            fake_reply(fd, 404, "{\"error\":{\"message\":\"not in the stand-in router\"}}");
        }
        close(fd);
    }
    fprintf(stderr, "fake router: stopping\n");
    nng_close(s);
    close(lfd);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Running tandem up                                                   */
/* ------------------------------------------------------------------ */

struct up_run {
    pid_t pid;
    int out_fd;
    char out[1 << 16];
    size_t out_len;
    char err_path[PATH_MAX];
    char run_dir[PATH_MAX];
    int exit_code;
};

static int run_counter;

/* Starts `tandem up ARGS...` (NULL-terminated) with stdout to a pipe and
 * stderr to a file; env_set is NULL or "NAME=value" to add. */
static int up_start(struct up_run *r, const char *const *args, const char *env_set)
{
    memset(r, 0, sizeof(*r));
    r->exit_code = -1;
    run_counter++;
    snprintf(r->err_path, sizeof(r->err_path), "%s/up-%d.err", tmp_root, run_counter);
    snprintf(r->run_dir, sizeof(r->run_dir), "%s/run-%d", tmp_root, run_counter);
    char tandem[PATH_MAX + 16];
    snprintf(tandem, sizeof(tandem), "%s/tandem", bin_dir);
    const char *argv[64];
    int n = 0;
    argv[n++] = tandem;
    argv[n++] = "up";
    int stop_timeout = 0;
    for (int i = 0; args[i] && n < 60; i++) {
        stop_timeout |= strcmp(args[i], "--stop-timeout") == 0;
        argv[n++] = args[i];
    }
    if (!stop_timeout) {
        argv[n++] = "--stop-timeout";
        argv[n++] = STOP_TIMEOUT_S;
    }
    argv[n] = NULL;
    int fds[2];
    if (pipe(fds) != 0) {
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    posix_spawn_file_actions_addopen(&fa, 2, r->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char *envp[256];
    int ne = 0;
    for (char **e = environ; *e && ne < 250; e++) {
        envp[ne++] = *e;
    }
    if (env_set) {
        envp[ne++] = (char *)env_set;
    }
    envp[ne] = NULL;
    int rc = posix_spawn(&r->pid, tandem, &fa, NULL, (char *const *)argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return -1;
    }
    r->out_fd = fds[0];
    fcntl(r->out_fd, F_SETFL, O_NONBLOCK);
    return 0;
}

static void up_read(struct up_run *r, int wait_ms)
{
    struct pollfd pf = {.fd = r->out_fd, .events = POLLIN};
    if (r->out_fd < 0 || poll(&pf, 1, wait_ms) <= 0) {
        return;
    }
    ssize_t n = read(r->out_fd, r->out + r->out_len, sizeof(r->out) - 1 - r->out_len);
    if (n > 0) {
        r->out_len += (size_t)n;
        r->out[r->out_len] = '\0';
    } else if (n == 0) {
        close(r->out_fd);
        r->out_fd = -1;
    }
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return strdup("");
    }
    char *buf = malloc(1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count_in(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *s = hay; (s = strstr(s, needle)) != NULL; s += strlen(needle)) {
        n++;
    }
    return n;
}

/* Waits for needle on stdout. */
static int up_wait_out(struct up_run *r, const char *needle, int timeout_ms)
{
    double end = now_ms() + timeout_ms;
    while (!strstr(r->out, needle)) {
        if (now_ms() > end || r->out_fd < 0) {
            printf("\nno '%s' on stdout after %d ms; stdout:\n%s\nstderr:\n", needle, timeout_ms,
                   r->out);
            char *e = slurp(r->err_path);
            printf("%s\n", e);
            free(e);
            return -1;
        }
        up_read(r, 50);
    }
    return 0;
}

/* Waits until the file at path holds needle at least count times. */
static int wait_file(const char *path, const char *needle, int count, int timeout_ms)
{
    double end = now_ms() + timeout_ms;
    for (;;) {
        char *s = slurp(path);
        int n = count_in(s, needle);
        if (n >= count) {
            free(s);
            return 0;
        }
        if (now_ms() > end) {
            printf("\n%s: '%s' %d times, want %d, after %d ms:\n%s\n", path, needle, n, count,
                   timeout_ms, s);
            free(s);
            return -1;
        }
        free(s);
        sleep_ms(50);
    }
}

/* Waits for tandem up to exit; SIGKILL after timeout_ms. Returns its exit
 * code (-1 if killed by us or by a signal); *ms gets how long it took. */
static int up_wait_exit(struct up_run *r, int timeout_ms, double *ms)
{
    double start = now_ms();
    int status;
    for (;;) {
        up_read(r, 0);
        pid_t w = waitpid(r->pid, &status, WNOHANG);
        if (w == r->pid) {
            break;
        }
        if (now_ms() - start > timeout_ms) {
            printf("\ntandem up did not exit in %d ms: SIGKILL\n", timeout_ms);
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &status, 0);
            r->exit_code = -1;
            if (ms) {
                *ms = now_ms() - start;
            }
            return -1;
        }
        sleep_ms(10);
    }
    if (ms) {
        *ms = now_ms() - start;
    }
    while (r->out_fd >= 0) {
        up_read(r, 100);
    }
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r->exit_code;
}

/* pid= of a banner line "  <name> ... pid=N". */
static pid_t banner_pid(const char *out, const char *name)
{
    char key[80];
    snprintf(key, sizeof(key), "\n  %s ", name);
    const char *s = strstr(out, key);
    const char *p = s ? strstr(s, "pid=") : NULL;
    return p ? (pid_t)atoi(p + 4) : 0;
}

/* The ipc directory in the banner ("ipc:///tmp/tandem-up-XXXXXX/..."), or "". */
static void banner_ipc_dir(const char *out, char *dir, size_t cap)
{
    const char *s = strstr(out, "ipc:///tmp/tandem-up-");
    dir[0] = '\0';
    if (s) {
        s += 6;
        size_t n = strcspn(s + 5, "/") + 5;
        snprintf(dir, cap, "%.*s", (int)n, s);
    }
}

static int alive(pid_t pid)
{
    return pid > 0 && kill(pid, 0) == 0;
}

/* Prints the stop watchdog's message from any process log of a stopped run
 * (its run directory from tandem up's "logs in DIR" line): such a process
 * exited 70 because its stop hung and the watchdog ended it, which
 * expect_up_exits fails; this prints why. */
static void note_watchdogs(const struct up_run *r)
{
    char *err = slurp(r->err_path);
    const char *at = strstr(err, "; logs in ");
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%.*s", at ? (int)strcspn(at + 10, "\n") : 0, at ? at + 10 : "");
    free(err);
    DIR *d = dir[0] ? opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".log") != 0) {
            continue;
        }
        char path[2 * PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        char *log = slurp(path);
        const char *w = strstr(log, "shutdown still blocked");
        if (w) {
            printf("\nnote: %s: the stop watchdog ended it: %.*s\n", path, (int)strcspn(w, "\n"),
                   w);
        }
        free(log);
    }
    if (d) {
        closedir(d);
    }
}

/* Checks a stopped run: exit code, every exit of a process it started as in
 * exits (up_exits.h), no process left, no ipc directory. */
static void check_clean_stop(struct up_run *r, int want_code, const char *const *exits,
                             const char *ipc_dir, const pid_t *pids, int n_pids)
{
    int code = up_wait_exit(r, EXIT_MS, NULL);
    CU_ASSERT_EQUAL(code, want_code);
    expect_up_exits(r->err_path, exits);
    note_watchdogs(r);
    CU_ASSERT_EQUAL(leftover_count(), 0);
    for (int i = 0; i < n_pids; i++) {
        if (alive(pids[i])) {
            printf("\npid %d still alive\n", (int)pids[i]);
            CU_FAIL("a process survived tandem up");
        }
    }
    if (ipc_dir && ipc_dir[0]) {
        struct stat st;
        CU_ASSERT_EQUAL(stat(ipc_dir, &st), -1);
        if (stat(ipc_dir, &st) == 0) {
            printf("\n%s still exists\n", ipc_dir);
        }
    }
}

/* tandem up's line for a run of name that the test killed with SIGKILL. */
static void killed_line(char *out, size_t cap, const char *name, pid_t pid)
{
    snprintf(out, cap, "%s (pid %d) exited: killed by signal 9 (SIGKILL)", name, (int)pid);
}

/* A 1P1D cluster stopped by a signal with no exit before: every process
 * exits 0 on the SIGTERM. */
static const char *const clean_stop_1p1d[] = {"router exited: exit code 0",
                                              "prefill-0 exited: exit code 0",
                                              "decode-0 exited: exit code 0", NULL};

static int run_simple(const char *const *args, char *out, size_t cap, char *err, size_t errcap)
{
    struct up_run *r = malloc(sizeof(*r));
    if (up_start(r, args, NULL) != 0) {
        free(r);
        return -2;
    }
    int code = up_wait_exit(r, EXIT_MS, NULL);
    if (out) {
        snprintf(out, cap, "%s", r->out);
    }
    if (err) {
        char *e = slurp(r->err_path);
        snprintf(err, errcap, "%s", e);
        free(e);
    }
    free(r);
    return code;
}

static const char PEM_CERT[] = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
static const char PEM_KEY[] = "-----BEGIN PRIVATE KEY-----\nMIGHfake\n-----END PRIVATE KEY-----\n";

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
}

/* The example deploy/clusters/<name> (whose tls section names generated
 * certificates, not committed) copied into a tree that mirrors the
 * repository's: <tmp>/mirror/deploy/clusters/<name>, deploy/routing -> the
 * source's, run/certs/ with stand-in PEM files (enough for --dry-run; the
 * processes themselves would refuse them). path gets the copy's path. */
static void mirror_example(const char *name, char *path, size_t cap)
{
    char dir[PATH_MAX], src[PATH_MAX + 320], dst[PATH_MAX + 320];
    snprintf(dir, sizeof(dir), "%s/mirror", tmp_root);
    mkdir(dir, 0755);
    snprintf(dst, sizeof(dst), "%s/deploy", dir);
    mkdir(dst, 0755);
    snprintf(dst, sizeof(dst), "%s/deploy/clusters", dir);
    mkdir(dst, 0755);
    snprintf(dst, sizeof(dst), "%s/deploy/routing", dir);
    snprintf(src, sizeof(src), "%s/deploy/routing", src_dir);
    if (symlink(src, dst) != 0 && errno != EEXIST) {
        CU_FAIL("symlink deploy/routing");
    }
    snprintf(dst, sizeof(dst), "%s/run", dir);
    mkdir(dst, 0755);
    snprintf(dst, sizeof(dst), "%s/run/certs", dir);
    mkdir(dst, 0755);
    snprintf(dst, sizeof(dst), "%s/run/certs/ca.crt", dir);
    write_text(dst, PEM_CERT);
    snprintf(dst, sizeof(dst), "%s/run/certs/127.0.0.1.crt", dir);
    write_text(dst, PEM_CERT);
    snprintf(dst, sizeof(dst), "%s/run/certs/127.0.0.1.key", dir);
    write_text(dst, PEM_KEY);
    snprintf(src, sizeof(src), "%s/deploy/clusters/%s", src_dir, name);
    char *text = slurp(src);
    snprintf(path, cap, "%s/deploy/clusters/%s", dir, name);
    write_text(path, text);
    free(text);
}

/* ------------------------------------------------------------------ */
/* Tests                                                               */
/* ------------------------------------------------------------------ */

static void test_cli(void)
{
    static char out[1 << 16], err[1 << 16];
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--help", NULL}, out, sizeof(out), NULL, 0), 0);
    static const char *const flags[] = {"--config",
                                        "--run-dir",
                                        "--dry-run",
                                        "--print-config",
                                        "--no-router",
                                        "--port",
                                        "--bin-dir",
                                        "--timeout",
                                        "--stop-timeout",
                                        "--restart-backoff",
                                        "--restart-backoff-max",
                                        "--healthy-reset",
                                        "--log-level",
                                        "--help",
                                        "--version"};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        if (!strstr(out, flags[i])) {
            printf("\n--help lacks %s\n", flags[i]);
            CU_FAIL("a flag is missing from --help");
        }
    }
    /* The defaults docs/up.md's flag table gives. */
    static const char *const defaults[][2] = {{"--port N ", "-1"},
                                              {"--timeout X ", "60"},
                                              {"--stop-timeout X ", "4.5"},
                                              {"--restart-backoff X ", "0.5"},
                                              {"--restart-backoff-max X ", "10"},
                                              {"--healthy-reset X ", "30"},
                                              {"--log-level CHOICE ", "info"}};
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
        char key[64], want[64];
        snprintf(key, sizeof(key), "\n  %s", defaults[i][0]);
        snprintf(want, sizeof(want), "[default: %s]\n", defaults[i][1]);
        const char *line = strstr(out, key);
        const char *eol = line ? strchr(line + 1, '\n') : NULL;
        size_t wl = strlen(want);
        if (!eol || (size_t)(eol + 1 - line) < wl || strncmp(eol + 1 - wl, want, wl) != 0) {
            printf("\n--help: %s lacks %s", defaults[i][0], want);
            CU_FAIL("a default in --help");
        }
    }
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "Security: a tls: section in the cluster file (ca, cert, key"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "TANDEM_CLUSTER_SECRET_FILE=FILE"));
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--version", NULL}, out, sizeof(out), NULL, 0), 0);
    CU_ASSERT_EQUAL(strncmp(out, "tandem ", 7), 0);
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--bogus", NULL}, NULL, 0, err, sizeof(err)), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--bogus"));
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--port", "x", NULL}, NULL, 0, err, sizeof(err)),
                    2);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--port"));
    CU_ASSERT_EQUAL(run_simple((const char *[]){"extra", NULL}, NULL, 0, NULL, 0), 2);
    CU_ASSERT_EQUAL(
        run_simple((const char *[]){"-c", "/no/such.yaml", NULL}, NULL, 0, err, sizeof(err)), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "tandem up: /no/such.yaml: cannot open: No such file"));

    /* A bad cluster file: exit 2, the message names the key and line. */
    char bad[PATH_MAX];
    snprintf(bad, sizeof(bad), "%s/bad.yaml", tmp_root);
    FILE *f = fopen(bad, "w");
    fputs("name: bad\npools:\n  decode:\n    count: 1\n    kv_blocs: 9\n", f);
    fclose(f);
    CU_ASSERT_EQUAL(
        run_simple((const char *[]){"-c", bad, "--dry-run", NULL}, NULL, 0, err, sizeof(err)), 2);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof(want), "tandem up: %s:5: pools.decode.kv_blocs: unknown key", bad);
    if (!strstr(err, want)) {
        printf("\nwant %s\ngot %s\n", want, err);
        CU_FAIL("bad cluster file message");
    }

    /* --print-config round-trips through -c. */
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--print-config", NULL}, out, sizeof(out), NULL, 0),
                    0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "name: \"default\"\n"));
    char printed[PATH_MAX];
    snprintf(printed, sizeof(printed), "%s/printed.yaml", tmp_root);
    f = fopen(printed, "w");
    fputs(out, f);
    fclose(f);
    CU_ASSERT_EQUAL(run_simple((const char *[]){"-c", printed, "--print-config", NULL}, err,
                               sizeof(err), NULL, 0),
                    0);
    CU_ASSERT_STRING_EQUAL(strchr(err, '\n'), strchr(out, '\n')); /* after the source line */
}

static void test_dry_run(void)
{
    static char out[1 << 16];
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--dry-run", "--bin-dir", "/opt/t", NULL}, out,
                               sizeof(out), NULL, 0),
                    0);
    CU_ASSERT_PTR_NOT_NULL(strstr(
        out, "# router\n/opt/t/tandem-router --host 127.0.0.1 --port 8000 --announce "
             "ipc:///tmp/tandem-up-XXXXXX/announce.ipc --model tiny --block-size 16 --log-level "
             "info --routing "));
    CU_ASSERT_PTR_NOT_NULL(strstr(
        out, "# prefill-0\n/opt/t/tandem-prefill --id prefill-0 --control "
             "ipc:///tmp/tandem-up-XXXXXX/prefill-0.ctl.ipc --kv "
             "ipc:///tmp/tandem-up-XXXXXX/prefill-0.kv.ipc --metrics-port 0 --router "
             "ipc:///tmp/tandem-up-XXXXXX/announce.ipc --backend tiny --model tiny --block-size "
             "16 --log-level info\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "# decode-0\n/opt/t/tandem-decode --id decode-0 "));
    CU_ASSERT_EQUAL(count_in(out, "\n/opt/t/"), 3);
    /* Nothing was started or created. */
    CU_ASSERT_EQUAL(leftover_count(), 0);

    CU_ASSERT_EQUAL(
        run_simple((const char *[]){"--dry-run", "--no-router", "--bin-dir", "/b", NULL}, out,
                   sizeof(out), NULL, 0),
        0);
    CU_ASSERT_PTR_NULL(strstr(out, "tandem-router"));
    CU_ASSERT_PTR_NULL(strstr(out, "--router"));
    CU_ASSERT_EQUAL(count_in(out, "\n/b/"), 2);

    /* Every example cluster: its processes and flags. */
    char dir[PATH_MAX + 32];
    snprintf(dir, sizeof(dir), "%s/deploy/clusters", src_dir);
    DIR *d = opendir(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".yaml")) {
            continue;
        }
        char path[PATH_MAX + 320];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        char *text = slurp(path);
        int tls = strstr(text, "\ntls:") != NULL;
        free(text);
        if (tls) {
            mirror_example(e->d_name, path, sizeof(path));
        }
        int code = run_simple((const char *[]){"-c", path, "--dry-run", "--bin-dir", "/b", NULL},
                              out, sizeof(out), NULL, 0);
        CU_ASSERT_EQUAL(code, 0);
        CU_ASSERT_EQUAL(count_in(out, "\n/b/tandem-router "), 1);
        int workers = count_in(out, "\n/b/tandem-prefill ") + count_in(out, "\n/b/tandem-decode ");
        if (strstr(e->d_name, "x4") || strstr(e->d_name, "2p2d")) {
            CU_ASSERT_EQUAL(workers, 4);
        } else if (strstr(e->d_name, "x8") || strstr(e->d_name, "4p4d")) {
            CU_ASSERT_EQUAL(workers, 8);
        } else {
            CU_ASSERT_EQUAL(workers, 2);
        }
        if (strstr(e->d_name, "colocated")) {
            CU_ASSERT_EQUAL(count_in(out, " --colocated"), workers);
        }
        if (strstr(e->d_name, "sim-")) {
            CU_ASSERT_EQUAL(count_in(out, " --backend sim --model llama-3-70b --gpu h100-sxm "
                                          "--tp 4"),
                            workers);
            CU_ASSERT_PTR_NOT_NULL(strstr(out, "--announce tcp://127.0.0.1:8001"));
        }
        /* Every process gets the three files; every NNG address is
         * tls+tcp://. Without tls, no TLS flag and no tls+tcp://. */
        CU_ASSERT_EQUAL(count_in(out, " --tls-ca "), tls ? workers + 1 : 0);
        CU_ASSERT_EQUAL(count_in(out, " --tls-cert "), tls ? workers + 1 : 0);
        CU_ASSERT_EQUAL(count_in(out, " --tls-key "), tls ? workers + 1 : 0);
        /* announce, 3 per worker (control, kv, router), the comment */
        CU_ASSERT_EQUAL(count_in(out, "tls+tcp://"), tls ? 3 * workers + 2 : 0);
        if (tls) {
            char want[PATH_MAX + 200];
            snprintf(want, sizeof(want),
                     "--announce tls+tcp://127.0.0.1:8001 --tls-ca %s/mirror/run/certs/ca.crt "
                     "--tls-cert %s/mirror/run/certs/127.0.0.1.crt --tls-key "
                     "%s/mirror/run/certs/127.0.0.1.key --model tiny",
                     tmp_root, tmp_root, tmp_root);
            CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
            CU_ASSERT_EQUAL(count_in(out, " --control tls+tcp://127.0.0.1:0 --kv "
                                          "tls+tcp://127.0.0.1:0 "),
                            workers);
            CU_ASSERT_EQUAL(count_in(out, " --router tls+tcp://127.0.0.1:8001 --tls-ca "), workers);
            CU_ASSERT_PTR_NOT_NULL(strstr(out, "# tls: every NNG address is tls+tcp://"));
        }
        files++;
    }
    closedir(d);
    CU_ASSERT(files >= 11);

    /* ipc socket paths are at most 107 bytes (sun_path): with the longest
     * name tandem up gives a socket, transport.dir may have 82. */
    char dir82[128], cfg[PATH_MAX + 32];
    snprintf(dir82, sizeof(dir82), "/tmp/%077d", 0);
    CU_ASSERT_EQUAL(strlen(dir82), 82);
    snprintf(cfg, sizeof(cfg), "%s/ipc-dir.yaml", tmp_root);
    char text[PATH_MAX + 512];
    snprintf(
        text, sizeof(text),
        "transport:\n  kind: ipc\n  dir: %s\npools: {prefill: {count: 1}, decode: {count: 1}}\n",
        dir82);
    write_text(cfg, text);
    CU_ASSERT_EQUAL(run_simple((const char *[]){"-c", cfg, "--dry-run", "--bin-dir", "/b", NULL},
                               out, sizeof(out), NULL, 0),
                    0);
    snprintf(text, sizeof(text), " --control ipc://%s/prefill-0.ctl.ipc ", dir82);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, text));
    static char err[1 << 16];
    snprintf(
        text, sizeof(text),
        "transport:\n  kind: ipc\n  dir: %s0\npools: {prefill: {count: 1}, decode: {count: 1}}\n",
        dir82);
    write_text(cfg, text);
    CU_ASSERT_EQUAL(run_simple((const char *[]){"-c", cfg, "--dry-run", "--bin-dir", "/b", NULL},
                               NULL, 0, err, sizeof(err)),
                    2);
    snprintf(text, sizeof(text),
             "%s:3: transport.dir: '%s0' is too long for ipc socket paths (at most 82 bytes)", cfg,
             dir82);
    if (!strstr(err, text)) {
        printf("\nwant %s\ngot %s\n", text, err);
        CU_FAIL("transport.dir length limit");
    }
}

/* Workers only: start, kill -9 a worker twice (restarted after 0.5 s, the
 * default first delay, then after 0.7 s: the doubled 1 s capped by
 * --restart-backoff-max 0.7, so the live supervisor runs the policy with the
 * flag's value; READY again in its log each time), SIGINT (every process
 * exits 0, nothing left). */
static void test_workers_only(void)
{
    struct up_run *r = malloc(sizeof(*r));
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof(run_dir), "%s/workers-only", tmp_root);
    CU_ASSERT_EQUAL_FATAL(up_start(r,
                                   (const char *[]){"--no-router", "--run-dir", run_dir,
                                                    "--restart-backoff-max", "0.7", NULL},
                                   NULL),
                          0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("tandem up --no-router did not come up");
        kill(r->pid, SIGINT);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    char want[PATH_MAX + 64];
    snprintf(want, sizeof(want), "READY id=up http=none run_dir=%s\n", run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, "cluster 'default' is up: 2 workers, no router"));
    pid_t pre = banner_pid(r->out, "prefill-0"), dec = banner_pid(r->out, "decode-0");
    CU_ASSERT(alive(pre));
    CU_ASSERT(alive(dec));
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    CU_ASSERT_EQUAL(strncmp(ipc_dir, "/tmp/tandem-up-", 15), 0);
    struct stat st;
    CU_ASSERT_EQUAL(stat(ipc_dir, &st), 0);

    /* The run directory. */
    char path[PATH_MAX + 64];
    static const char *const files[] = {"cluster.yaml", "commands.txt", "prefill-0.log",
                                        "decode-0.log"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s/%s", run_dir, files[i]);
        CU_ASSERT_EQUAL(stat(path, &st), 0);
    }
    snprintf(path, sizeof(path), "%s/commands.txt", run_dir);
    char *cmds = slurp(path);
    CU_ASSERT_PTR_NOT_NULL(strstr(cmds, "# decode-0\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(cmds, "/tandem-decode --id decode-0 --control ipc:///tmp/"));
    free(cmds);
    char dec_log[PATH_MAX + 64];
    snprintf(dec_log, sizeof(dec_log), "%s/decode-0.log", run_dir);
    CU_ASSERT_EQUAL(wait_file(dec_log, "\nREADY id=decode-0 role=decode ", 1, EVENT_MS), 0);

    /* kill -9: restarted after the first delay, READY again. */
    CU_ASSERT_EQUAL(kill(dec, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log, "\nREADY id=decode-0 role=decode ", 2, EVENT_MS), 0);
    char kill1[128], kill2[128];
    killed_line(kill1, sizeof(kill1), "decode-0", dec);
    snprintf(want, sizeof(want), "%s; restarting in 0.5 s (restart 1)", kill1);
    CU_ASSERT_EQUAL(wait_file(r->err_path, want, 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 is ready again (pid ", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log,
                              "run 1 exited (killed by signal 9 (SIGKILL)); restarting "
                              "in 500 ms",
                              1, EVENT_MS),
                    0);
    char *err = slurp(r->err_path);
    const char *again = strstr(err, "decode-0 is ready again (pid ");
    pid_t dec2 = again ? (pid_t)atoi(again + 29) : 0;
    free(err);
    CU_ASSERT(dec2 != dec && alive(dec2));
    CU_ASSERT(alive(pre)); /* the other worker was left alone */

    /* kill -9 of the new run: the delay doubles to 1 s, capped at 0.7 s. */
    CU_ASSERT_EQUAL(kill(dec2, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log, "\nREADY id=decode-0 role=decode ", 3, EVENT_MS), 0);
    killed_line(kill2, sizeof(kill2), "decode-0", dec2);
    snprintf(want, sizeof(want), "%s; restarting in 0.7 s (restart 2)", kill2);
    CU_ASSERT_EQUAL(wait_file(r->err_path, want, 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 is ready again (pid ", 2, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log,
                              "run 2 exited (killed by signal 9 (SIGKILL)); restarting "
                              "in 700 ms",
                              1, EVENT_MS),
                    0);
    err = slurp(r->err_path);
    again = strstr(err, "decode-0 is ready again (pid ");
    again = again ? strstr(again + 1, "decode-0 is ready again (pid ") : NULL;
    pid_t dec3 = again ? (pid_t)atoi(again + 29) : 0;
    free(err);
    CU_ASSERT(dec3 != dec2 && alive(dec3));

    /* SIGINT: every process exits 0, nothing left. */
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {pre, dec, dec2, dec3};
    const char *const exits[] = {kill1, kill2, "prefill-0 exited: exit code 0",
                                 "decode-0 exited: exit code 0", NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 4);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "SIGINT: stopping the cluster", 1, 0), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log, "run 3 exited (exit code 0)", 1, 0), 0);
    free(r);
}

/* A worker that cannot start (a bad flag through the cluster file's args):
 * tandem up restarts it with backoff, gives up after the third failed start
 * (sv_backoff.h, SV_BACKOFF_GIVE_UP), prints its log's tail with the command
 * to read all of it, stops the other one and exits 1. */
static void test_start_failure(void)
{
    char cfg[PATH_MAX];
    snprintf(cfg, sizeof(cfg), "%s/failing.yaml", tmp_root);
    FILE *f = fopen(cfg, "w");
    fputs("name: failing\npools:\n  prefill: {count: 1}\n  decode:\n    count: 1\n"
          "    args: [\"--frobnicate\"]\n",
          f);
    fclose(f);
    struct up_run *r = malloc(sizeof(*r));
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof(run_dir), "%s/failing", tmp_root);
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"-c", cfg, "--no-router", "--run-dir", run_dir, NULL}, NULL),
        0);
    double ms = 0;
    CU_ASSERT_EQUAL(up_wait_exit(r, EXIT_MS, &ms), 1);
    printf("\n(gave up after %.0f ms)", ms);
    /* prefill-0 gets the stop's SIGTERM while it starts: before its handler
     * is installed that ends it by the signal, after, with exit code 0. */
    const char *const exits[] = {
        " exited during start-up: exit code 2; restarting in 0.5 s (failed start 1 of 3)\n",
        " exited during start-up: exit code 2; restarting in 1.0 s (failed start 2 of 3)\n",
        " exited: exit code 2; it failed to start 3 times in a row, so it is not restarted\n",
        "prefill-0 exited: exit code 0|prefill-0 exited: killed by signal 15 (SIGTERM)", NULL};
    expect_up_exits(r->err_path, exits);
    char *err = slurp(r->err_path);
    CU_ASSERT_EQUAL(count_in(err, "decode-0 (pid "), 3);
    CU_ASSERT_EQUAL(count_in(err, "tandem up: decode-0 (pid "), 1);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof(want), "%s/decode-0.log:\n", run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    snprintf(want, sizeof(want), "(all of it: less %s/decode-0.log)\n", run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    snprintf(want, sizeof(want), "fix what its log says (its command line: %s/commands.txt)",
             run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    /* The worker's own message, from each of its three runs. */
    CU_ASSERT_EQUAL(count_in(err, "  tandem-decode: unknown flag --frobnicate (see --help)\n"), 3);
    if (!strstr(err, "--frobnicate")) {
        printf("\n%s\n", err);
    }
    free(err);
    char log[PATH_MAX + 32];
    snprintf(log, sizeof(log), "%s/decode-0.log", run_dir);
    CU_ASSERT_EQUAL(wait_file(log,
                              "run 3 exited (exit code 2): 3 runs in a row ended before "
                              "ready, not restarting",
                              1, 0),
                    0);
    char *l = slurp(log);
    CU_ASSERT_PTR_NULL(strstr(l, "run 4:"));
    free(l);
    CU_ASSERT_PTR_NULL(strstr(r->out, "READY id=up"));
    CU_ASSERT_EQUAL(leftover_count(), 0);
    free(r);
}

/* A bin directory with the real workers and this executable as tandem-router. */
static void fake_bin_dir(char *out, size_t cap)
{
    snprintf(out, cap, "%s/fakebin", tmp_root);
    mkdir(out, 0755);
    char self[PATH_MAX], link[PATH_MAX + 32], target[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = '\0';
    snprintf(link, sizeof(link), "%s/tandem-router", out);
    if (symlink(self, link) != 0 && errno != EEXIST) {
        CU_FAIL("symlink tandem-router");
    }
    static const char *const workers[] = {"tandem-prefill", "tandem-decode"};
    for (int i = 0; i < 2; i++) {
        snprintf(link, sizeof(link), "%s/%s", out, workers[i]);
        snprintf(target, sizeof(target), "%s/%s", bin_dir, workers[i]);
        if (symlink(target, link) != 0 && errno != EEXIST) {
            CU_FAIL("symlink a worker");
        }
    }
}

/* The router path against the stand-in router: join, worker crash and
 * rejoin, router crash (workers rejoin the new one), stop. */
static void test_router_contract(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/contract", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir", run_dir, NULL},
                 NULL),
        0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("tandem up with the stand-in router did not come up");
        kill(r->pid, SIGINT);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    const char *h = strstr(r->out, "READY id=up http=127.0.0.1:");
    int port = h ? atoi(h + 27) : 0;
    CU_ASSERT(port > 0 && port != 8000);
    char want[PATH_MAX + 512];
    snprintf(want, sizeof(want),
             "  curl http://127.0.0.1:%d/v1/completions -H 'Content-Type: application/json' -d "
             "'{\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":16}'\n",
             port);
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, "cluster 'default' is up: 2 workers behind the router"));
    /* The live page's address (router/dashboard/). */
    snprintf(want, sizeof(want), "\n  dashboard      http://127.0.0.1:%d/dashboard ", port);
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, want));
    char router_log[PATH_MAX + 32];
    snprintf(router_log, sizeof(router_log), "%s/router.log", run_dir);
    /* The router was started first, with the plan's flags, and the inline
     * routing written next to the logs. */
    char *log = slurp(router_log);
    snprintf(want, sizeof(want), "--port %d --announce ipc:///tmp/tandem-up-", port);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, want));
    snprintf(want, sizeof(want), "--routing %s/routing.yaml", run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "fake router: hello from prefill-0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "fake router: hello from decode-0"));
    free(log);
    snprintf(want, sizeof(want), "%s/routing.yaml", run_dir);
    char *routing = slurp(want);
    CU_ASSERT_PTR_NOT_NULL(strstr(routing, "\nkind: EndpointPickerConfig\n"));
    free(routing);
    char *err = slurp(r->err_path);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "every worker is ready; waiting for them to join"));
    /* Order: router ready before any worker started. */
    const char *router_ready = strstr(err, "router is ready (pid");
    const char *worker_ready = strstr(err, "-0 is ready (pid");
    CU_ASSERT(router_ready && worker_ready && router_ready < worker_ready);
    free(err);
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    pid_t router = banner_pid(r->out, "router"), dec = banner_pid(r->out, "decode-0"),
          pre = banner_pid(r->out, "prefill-0");
    CU_ASSERT(alive(router) && alive(dec) && alive(pre));

    /* kill -9 of a worker: restarted, announces itself, the router lists it
     * healthy again. */
    CU_ASSERT_EQUAL(kill(dec, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 1, EVENT_MS), 0);

    /* kill -9 of the router: restarted, both workers rejoin the new one. */
    CU_ASSERT_EQUAL(kill(router, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "router is ready again (pid ", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "prefill-0 rejoined the router", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 2, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(router_log, "# tandem up ", 3, 0), 0); /* run 1, exit, run 2 */

    CU_ASSERT_EQUAL(kill(r->pid, SIGTERM), 0);
    pid_t pids[] = {router, dec, pre};
    char killed_dec[80], killed_router[80];
    killed_line(killed_dec, sizeof(killed_dec), "decode-0", dec);
    killed_line(killed_router, sizeof(killed_router), "router", router);
    const char *const exits[] = {killed_dec,
                                 killed_router,
                                 "router exited: exit code 0",
                                 "prefill-0 exited: exit code 0",
                                 "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 3);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "SIGTERM: stopping the cluster", 1, 0), 0);
    free(r);
}

/* Workers never listed healthy: the start timeout names one and fails. */
static void test_join_timeout(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/join-timeout", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(up_start(r,
                                   (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir",
                                                    run_dir, "--timeout", "5", NULL},
                                   "FAKE_ROUTER_NO_HEALTH=1"),
                          0);
    CU_ASSERT_EQUAL(up_wait_exit(r, EXIT_MS, NULL), 1);
    /* The stand-in router was READY long before; a worker may still be
     * starting when the timeout stops it (see below), and a SIGTERM before
     * its handler is installed ends it by the signal. */
    const char *const exits[] = {
        "router exited: exit code 0",
        "prefill-0 exited: exit code 0|prefill-0 exited: killed by signal 15 (SIGTERM)",
        "decode-0 exited: exit code 0|decode-0 exited: killed by signal 15 (SIGTERM)", NULL};
    expect_up_exits(r->err_path, exits);
    char *err = slurp(r->err_path);
    /* On a loaded machine the workers may not even be READY within the
     * timeout: either way the message names the process it waited for. */
    const char *msg = strstr(err, "tandem up: timed out after 5 s waiting for ");
    CU_ASSERT_PTR_NOT_NULL(msg);
    if (msg != NULL) {
        const char *who = msg + strlen("tandem up: timed out after 5 s waiting for ");
        CU_ASSERT(strncmp(who, "prefill-0", 9) == 0 || strncmp(who, "decode-0", 8) == 0);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(err, ".log:\n")); /* the tail of its log */
    free(err);
    CU_ASSERT_EQUAL(leftover_count(), 0);
    free(r);
}

/* SIGINT before the cluster is up (the workers never listed healthy, so it
 * waits for them to join): every process stops, exit code 130. */
static void test_interrupted(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/interrupted", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir", run_dir, NULL},
                 "FAKE_ROUTER_NO_HEALTH=1"),
        0);
    CU_ASSERT_EQUAL(
        wait_file(r->err_path, "every worker is ready; waiting for them to join", 1, READY_MS), 0);
    char path[PATH_MAX + 32], ipc_dir[PATH_MAX];
    snprintf(path, sizeof(path), "%s/commands.txt", run_dir);
    char *cmds = slurp(path);
    banner_ipc_dir(cmds, ipc_dir, sizeof(ipc_dir));
    free(cmds);
    CU_ASSERT_EQUAL(strncmp(ipc_dir, "/tmp/tandem-up-", 15), 0);
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    /* Every process printed READY (its handler is installed): each exits 0. */
    check_clean_stop(r, 130, clean_stop_1p1d, ipc_dir, NULL, 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "SIGINT: stopping the cluster", 1, 0), 0);
    CU_ASSERT_PTR_NULL(strstr(r->out, "READY id=up"));
    free(r);
}

/* A process that ignores SIGTERM (the stand-in router, told to) is killed at
 * the stop deadline (--stop-timeout, STOP_TIMEOUT_S here), not before; the
 * workers exit 0 on the SIGTERM. */
static void test_stop_deadline(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/deadline", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir", run_dir, NULL},
                 "FAKE_ROUTER_IGNORE_TERM=1"),
        0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("did not come up");
        kill(r->pid, SIGKILL);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    pid_t router = banner_pid(r->out, "router");
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    double start = now_ms();
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {router};
    const char *const exits[] = {"router exited: killed by signal 9 (SIGKILL)",
                                 "prefill-0 exited: exit code 0", "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 1);
    /* It waited for the deadline before the SIGKILL. Cannot flake: the
     * deadline is a libuv timer on the monotonic clock started when tandem up
     * handled the SIGINT, after `start`; 100 ms below it for the ms rounding
     * of its clock. */
    double waited = now_ms() - start, deadline = atof(STOP_TIMEOUT_S) * 1000;
    if (waited < deadline - 100) {
        printf("\nSIGKILL after %.0f ms, want the %.0f ms stop timeout\n", waited, deadline);
        CU_FAIL("the SIGKILL came before the stop deadline");
    }
    char *err = slurp(r->err_path);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "router (pid "));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, ") still running at the stop deadline: SIGKILL"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "router exited: killed by signal 9 (SIGKILL)"));
    free(err);
    free(r);
}

/* A second signal while stopping sends SIGKILL at once: the stand-in router
 * ignores the SIGTERM, and is killed by the second SIGINT. The stop deadline
 * is 600 s, past EXIT_MS: a tandem up that exits at all did not wait for it. */
static void test_second_signal(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/second-signal", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(up_start(r,
                                   (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir",
                                                    run_dir, "--stop-timeout", "600", NULL},
                                   "FAKE_ROUTER_IGNORE_TERM=1"),
                          0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("did not come up");
        kill(r->pid, SIGKILL);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    pid_t router = banner_pid(r->out, "router");
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "SIGINT: stopping the cluster", 1, EVENT_MS), 0);
    /* The second signal once the workers have stopped, so only the router
     * (which ignores SIGTERM) is running. A worker SIGKILLed while it exits
     * under ASan dies during LeakSanitizer's check and orphans the checker
     * (a clone of the worker, re-parented to this test as a zombie): a
     * leftover this test would report, made by the test's own timing. */
    CU_ASSERT_EQUAL(wait_file(r->err_path, "prefill-0 exited", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 exited", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {router};
    const char *const exits[] = {"router exited: killed by signal 9 (SIGKILL)",
                                 "prefill-0 exited: exit code 0", "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 1);
    char *err = slurp(r->err_path);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "second SIGINT: SIGKILL now"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "still running: SIGKILL now, before the stop deadline"));
    CU_ASSERT_PTR_NULL(strstr(err, "still running at the stop deadline"));
    free(err);
    free(r);
}

/* ---- with the real router ---- */

static int have_router(void)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/tandem-router", bin_dir);
    if (access(path, X_OK) == 0) {
        return 1;
    }
    printf("\nSKIPPED: tandem-router not built (%s)\n", path);
    if (getenv("TANDEM_REQUIRE_ROUTER") && !strcmp(getenv("TANDEM_REQUIRE_ROUTER"), "1")) {
        CU_FAIL("TANDEM_REQUIRE_ROUTER=1 but tandem-router is not built");
    }
    return 0;
}

/* POST body to 127.0.0.1:port path; returns the status, *resp the body. */
static int http_post(int port, const char *path, const char *body, char **resp)
{
    *resp = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    char head[512];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     body ? "POST" : "GET", path, body ? strlen(body) : 0);
    if (write(fd, head, (size_t)n) != n ||
        (body && write(fd, body, strlen(body)) != (ssize_t)strlen(body))) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    double end = now_ms() + 30000;
    while (len < cap - 1 && now_ms() < end && poll(&pf, 1, 1000) >= 0) {
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r == 0 || errno != EAGAIN) {
                break;
            }
        } else {
            len += (size_t)r;
        }
    }
    close(fd);
    buf[len] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
        status = -1;
    }
    char *b = strstr(buf, "\r\n\r\n");
    *resp = strdup(b ? b + 4 : "");
    free(buf);
    return status;
}

static int completion_ok(int port)
{
    char *resp;
    int status = http_post(port, "/v1/completions",
                           "{\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":16}", &resp);
    int ok = status == 200 && strstr(resp, "\"choices\"") && strstr(resp, "\"text\"");
    if (!ok) {
        printf("\ncompletion: HTTP %d: %s\n", status, resp);
    }
    free(resp);
    return ok;
}

/* Retries a completion until one succeeds (after a rejoin the router may
 * still be dialing the worker); 1 if one did within EVENT_MS. */
static int completion_served(int port)
{
    double end = now_ms() + EVENT_MS;
    while (!completion_ok(port)) {
        if (now_ms() > end) {
            return 0;
        }
        sleep_ms(200);
    }
    return 1;
}

/* A llama2.c checkpoint (a small tiny_create model) at path: its file
 * name gives the model its workers announce. */
static void write_checkpoint(const char *path)
{
    struct tiny_config c;
    tiny_default_config(&c);
    c.dim = 64;
    c.hidden_dim = 128;
    c.n_layers = 1;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.max_context = 256;
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    CU_ASSERT_EQUAL(tiny_save(be, path), 0);
    be->ops->destroy(be);
}

/* Workers the router refuses (model 'stories' in the cluster file, a
 * checkpoint named B.bin): tandem up prints the router's reason for each
 * while waiting for them to join, stops everything and exits 1, long before
 * its --timeout. */
static void test_refused(void)
{
    if (!have_router()) {
        return;
    }
    char ckpt[PATH_MAX], cfg[PATH_MAX], run_dir[PATH_MAX], text[2 * PATH_MAX + 256];
    snprintf(ckpt, sizeof(ckpt), "%s/B.bin", tmp_root);
    write_checkpoint(ckpt);
    snprintf(cfg, sizeof(cfg), "%s/refused.yaml", tmp_root);
    snprintf(text, sizeof(text),
             "model: stories\npools:\n  prefill: {count: 1, checkpoint: %s}\n"
             "  decode: {count: 1, checkpoint: %s}\n",
             ckpt, ckpt);
    write_text(cfg, text);
    snprintf(run_dir, sizeof(run_dir), "%s/refused", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"-c", cfg, "--port", "0", "--run-dir", run_dir, NULL}, NULL),
        0);
    double ms = 0;
    CU_ASSERT_EQUAL(up_wait_exit(r, EXIT_MS, &ms), 1);
    printf("\n(refused and stopped after %.0f ms)", ms);
    const char *const exits[] = {
        "router exited: exit code 0",
        "prefill-0 exited: exit code 0|prefill-0 exited: killed by signal 15 (SIGTERM)",
        "decode-0 exited: exit code 0|decode-0 exited: killed by signal 15 (SIGTERM)", NULL};
    expect_up_exits(r->err_path, exits);
    char *err = slurp(r->err_path);
    /* Each worker the router had refused by the poll that saw one (one or
     * both), once. */
    static const char *const names[] = {"prefill-0", "decode-0"};
    int refused = 0;
    for (int i = 0; i < 2; i++) {
        char want[256];
        snprintf(want, sizeof(want),
                 "tandem up: the router refused %s: it serves model 'B', the router 'stories' "
                 "(--model)\n",
                 names[i]);
        CU_ASSERT(count_in(err, want) <= 1);
        refused += count_in(err, want);
    }
    CU_ASSERT(refused >= 1);
    CU_ASSERT_EQUAL(count_in(err, "tandem up: the router refused "), refused);
    char want[PATH_MAX + 256];
    snprintf(want, sizeof(want),
             "fix the cluster file (model, checkpoint, tokenizer, block_size, args) or "
             "TANDEM_CLUSTER_SECRET_FILE, then run tandem up again (the router's log: "
             "%s/router.log)\n",
             run_dir);
    CU_ASSERT_EQUAL(count_in(err, want), 1);
    CU_ASSERT_PTR_NULL(strstr(err, "timed out"));
    if (count_in(err, want) != 1) {
        printf("\n%s\n", err);
    }
    free(err);
    CU_ASSERT_PTR_NULL(strstr(r->out, "READY id=up"));
    CU_ASSERT_EQUAL(leftover_count(), 0);
    free(r);
}

/* The default cluster with the real router: a completion, kill -9 of the
 * decode worker (restarted, rejoins, serves again), kill -9 of the router
 * (restarted, the workers rejoin it, it serves), SIGINT, nothing left. */
static void test_real_router(void)
{
    if (!have_router()) {
        return;
    }
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof(run_dir), "%s/real", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"--port", "0", "--run-dir", run_dir, NULL}, NULL), 0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("tandem up (default cluster) did not come up");
        kill(r->pid, SIGINT);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    const char *h = strstr(r->out, "READY id=up http=127.0.0.1:");
    int port = h ? atoi(h + 27) : 0;
    CU_ASSERT_FATAL(port > 0);
    CU_ASSERT(completion_ok(port));
    char *body;
    CU_ASSERT_EQUAL(http_post(port, "/health", NULL, &body), 200);
    free(body);
    CU_ASSERT_EQUAL(http_post(port, "/v1/cluster", NULL, &body), 200);
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "\"prefill-0\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "\"decode-0\""));
    free(body);
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    pid_t router = banner_pid(r->out, "router"), dec = banner_pid(r->out, "decode-0"),
          pre = banner_pid(r->out, "prefill-0");

    CU_ASSERT_EQUAL(kill(dec, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 1, EVENT_MS), 0);
    CU_ASSERT(completion_served(port));

    /* kill -9 of the router: restarted on the same port, both workers
     * announce themselves to the new one, which serves. */
    CU_ASSERT_EQUAL(kill(router, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "router is ready again (pid ", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "prefill-0 rejoined the router", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 2, EVENT_MS), 0);
    CU_ASSERT(completion_served(port));
    char *err = slurp(r->err_path);
    const char *again = strstr(err, "router is ready again (pid ");
    pid_t router2 = again ? (pid_t)atoi(again + 27) : 0;
    free(err);

    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {router, dec, pre, router2};
    char killed_dec[80], killed_router[80];
    killed_line(killed_dec, sizeof(killed_dec), "decode-0", dec);
    killed_line(killed_router, sizeof(killed_router), "router", router);
    const char *const exits[] = {killed_dec,
                                 killed_router,
                                 "router exited: exit code 0",
                                 "prefill-0 exited: exit code 0",
                                 "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 4);
    free(r);
}

/* ---- tls ---- */

/* Spawns bin_dir/<binary> args... with stdout and stderr to log. */
static pid_t spawn_logged(const char *binary, const char *const *args, const char *log)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/%s", bin_dir, binary);
    const char *argv[32];
    int n = 0;
    argv[n++] = path;
    for (int i = 0; args[i] && n < 31; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    if (posix_spawn(&pid, path, &fa, NULL, (char *const *)argv, environ) != 0) {
        pid = -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

/* Waits for pid to exit; SIGKILL after timeout_ms. Returns its exit code,
 * or -1 (signalled or killed). */
static int wait_pid(pid_t pid, int timeout_ms)
{
    double end = now_ms() + timeout_ms;
    int status;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        sleep_ms(20);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The value of a series ("name{labels}") in a Prometheus text page, or -1. */
static double metric_value(const char *page, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = page; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            return strtod(p + n + 1, NULL);
        }
    }
    return -1;
}

static double get_metric(int port, const char *series)
{
    char *page;
    double v = http_post(port, "/metrics", NULL, &page) == 200 ? metric_value(page, series) : -1;
    free(page);
    return v;
}

/* The port in a banner field "<key>...:PORT" of the process name. */
static int banner_port(const char *out, const char *name, const char *key)
{
    char k[80];
    snprintf(k, sizeof(k), "\n  %s ", name);
    const char *s = strstr(out, k);
    const char *eol = s ? strchr(s + 1, '\n') : NULL;
    const char *f = s ? strstr(s, key) : NULL;
    if (!f || (eol && f > eol)) {
        return 0;
    }
    const char *colon = strchr(f + strlen(key), ':');
    return colon ? atoi(colon + 1) : 0;
}

/* Starts a decode worker by hand, without certificates, announcing over
 * plain tcp:// to 127.0.0.1:announce; waits for its READY line, then for the
 * router on port to list it: up to EVENT_MS when it should be (expect 1), or
 * for 3 s (three announcement periods) when it should not (expect 0: a window
 * that a loaded machine can only make pass, not fail). Stops it (it must exit
 * 0). Returns 1 if it was listed, 0 if not, -1 if it did not start or exit. */
static int plain_worker_listed(int port, int announce, const char *log, int expect)
{
    char ann[64];
    snprintf(ann, sizeof(ann), "tcp://127.0.0.1:%d", announce);
    pid_t pid = spawn_logged("tandem-decode",
                             (const char *[]){"--id", "rogue-0", "--router", ann, "--control",
                                              "tcp://127.0.0.1:0", "--kv", "tcp://127.0.0.1:0",
                                              "--log-level", "warn", NULL},
                             log);
    if (pid <= 0) {
        return -1;
    }
    int listed = wait_file(log, "READY id=rogue-0 ", 1, EVENT_MS) == 0 ? 0 : -1;
    double end = now_ms() + (expect ? EVENT_MS : 3000);
    while (listed == 0 && now_ms() < end) {
        char *body;
        if (http_post(port, "/v1/cluster", NULL, &body) == 200 && strstr(body, "\"rogue-0\"")) {
            listed = 1;
        }
        free(body);
        sleep_ms(100);
    }
    kill(pid, SIGTERM);
    int code = wait_pid(pid, EXIT_MS);
    if (code != 0) {
        printf("\nhand-started worker: exit %d\n", code);
        listed = -1;
    }
    return listed;
}

/* What one greedy completion gave, to compare runs: the "choices" array as
 * the router wrote it (text, logprobs, finish reason). */
struct tls_answer {
    char choices[8192];
    int completion_tokens;
    double remote_prefills; /* router: tandem:pd_decisions_total{prefill="remote"} */
    double kv_frames;       /* decode-0: tandem:kv_frames_installed_total */
};

static int answer(int port, int decode_metrics, struct tls_answer *a)
{
    char *resp;
    memset(a, 0, sizeof(*a));
    int status = http_post(port, "/v1/completions",
                           "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                           "\"temperature\":0,\"ignore_eos\":true,\"logprobs\":1}",
                           &resp);
    const char *c = strstr(resp, "\"choices\":");
    const char *u = c ? strstr(c, ",\"usage\":") : NULL;
    const char *t = u ? strstr(u, "\"completion_tokens\":") : NULL;
    if (status != 200 || !u || !t || (size_t)(u - c) >= sizeof(a->choices)) {
        printf("\ncompletion: HTTP %d: %s\n", status, resp);
        free(resp);
        return -1;
    }
    snprintf(a->choices, sizeof(a->choices), "%.*s", (int)(u - c), c);
    a->completion_tokens = atoi(t + 20);
    free(resp);
    a->remote_prefills = get_metric(port, "tandem:pd_decisions_total{prefill=\"remote\"}");
    a->kv_frames = get_metric(decode_metrics, "tandem:kv_frames_installed_total");
    return 0;
}

/* Writes a cluster file: 1 prefill + 1 decode, pd-always routing (every
 * prompt prefilled on prefill-0, its KV shipped to decode-0), over tcp, with
 * or without a tls section (paths relative to the file). */
static void write_tls_cluster(const char *path, int tls)
{
    char text[PATH_MAX + 512];
    snprintf(text, sizeof(text),
             "name: %s\n%s"
             "routing: %s/deploy/routing/pd-always.yaml\n"
             "pools:\n  prefill: {count: 1}\n  decode: {count: 1}\n",
             tls ? "tls" : "plain",
             tls ? "tls:\n  ca: certs/ca.crt\n  cert: certs/127.0.0.1.crt\n"
                   "  key: certs/127.0.0.1.key\n"
                 : "transport: {kind: tcp}\n",
             src_dir);
    write_text(path, text);
}

/* Starts the cluster file cfg (--port 0), returns the router's HTTP port and
 * the decode worker's metrics port, or 0. */
static int tls_up(struct up_run *r, const char *cfg, const char *run_dir, int *decode_metrics)
{
    if (up_start(r, (const char *[]){"-c", cfg, "--port", "0", "--run-dir", run_dir, NULL}, NULL) !=
        0) {
        return 0;
    }
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        kill(r->pid, SIGINT);
        up_wait_exit(r, EXIT_MS, NULL);
        return 0;
    }
    const char *h = strstr(r->out, "READY id=up http=127.0.0.1:");
    *decode_metrics = banner_port(r->out, "decode-0", "metrics=http://127.0.0.1");
    return h ? atoi(h + 27) : 0;
}

/* A cluster file with a tls section: the same cluster over tcp:// first
 * (the reference answer), then over tls+tcp:// with certificates made by
 * deploy/make-cluster-ca.sh: every process got the three files, the router
 * lists both workers at tls+tcp:// addresses, a completion prefilled on
 * prefill-0 and shipped to decode-0 over TLS gives exactly the reference
 * tokens and logprobs, a worker started by hand without certificates
 * (plain tcp:// to the announce port) is never listed, one pointed at the
 * tls+tcp:// address without them exits 2, and a killed worker is restarted
 * and rejoins over TLS. */
static void test_tls(void)
{
    if (!have_router()) {
        return;
    }
    char cmd[3 * PATH_MAX], certs[PATH_MAX + 16];
    snprintf(certs, sizeof(certs), "%s/certs", tmp_root);
    snprintf(cmd, sizeof(cmd), "'%s/deploy/make-cluster-ca.sh' '%s' 127.0.0.1 >/dev/null 2>&1",
             src_dir, certs);
    if (system(cmd) != 0) {
        printf("\n%s failed (openssl installed?)\n", cmd);
        CU_FAIL_FATAL("deploy/make-cluster-ca.sh");
    }
    char plain_cfg[PATH_MAX + 32], tls_cfg[PATH_MAX + 32], run_dir[PATH_MAX + 32];
    snprintf(plain_cfg, sizeof(plain_cfg), "%s/plain.yaml", tmp_root);
    snprintf(tls_cfg, sizeof(tls_cfg), "%s/tls.yaml", tmp_root);
    write_tls_cluster(plain_cfg, 0);
    write_tls_cluster(tls_cfg, 1);

    /* The reference: plain tcp://. */
    struct up_run *r = malloc(sizeof(*r));
    struct tls_answer want, got;
    int dm = 0;
    snprintf(run_dir, sizeof(run_dir), "%s/plain", tmp_root);
    int port = tls_up(r, plain_cfg, run_dir, &dm);
    if (port <= 0 || dm <= 0) {
        CU_FAIL("the plain tcp cluster did not come up");
        free(r);
        return;
    }
    CU_ASSERT_EQUAL(answer(port, dm, &want), 0);
    /* Checking the check below: without tls the same hand-started worker
     * joins. */
    char rogue_log[PATH_MAX + 32];
    snprintf(rogue_log, sizeof(rogue_log), "%s/rogue-plain.log", tmp_root);
    CU_ASSERT_EQUAL(plain_worker_listed(port,
                                        banner_port(r->out, "router", "announce=tcp://127.0.0.1"),
                                        rogue_log, 1),
                    1);
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    check_clean_stop(r, 0, clean_stop_1p1d, NULL, NULL, 0);
    CU_ASSERT_EQUAL(want.completion_tokens, 8);
    CU_ASSERT_EQUAL(want.remote_prefills, 1);
    CU_ASSERT(want.kv_frames >= 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(want.choices, "\"finish_reason\":\"length\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(want.choices, "\"token_logprobs\":["));

    /* The same cluster with the tls section. */
    snprintf(run_dir, sizeof(run_dir), "%s/tls", tmp_root);
    port = tls_up(r, tls_cfg, run_dir, &dm);
    if (port <= 0 || dm <= 0) {
        CU_FAIL("the tls cluster did not come up");
        free(r);
        return;
    }
    int announce = banner_port(r->out, "router", "announce=tls+tcp://127.0.0.1");
    CU_ASSERT(announce > 0);
    CU_ASSERT_EQUAL(count_in(r->out, "control=tls+tcp://127.0.0.1:"), 2);
    CU_ASSERT_EQUAL(count_in(r->out, "kv=tls+tcp://127.0.0.1:"), 2);
    char want_s[4 * PATH_MAX];
    snprintf(want_s, sizeof(want_s), "mutual TLS on every NNG link (tls+tcp://), CA %s/ca.crt\n",
             certs);
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, want_s));
    /* Every process got the same three files (absolute: resolved against the
     * cluster file's directory). */
    snprintf(want_s, sizeof(want_s), "%s/commands.txt", run_dir);
    char *cmds = slurp(want_s);
    snprintf(want_s, sizeof(want_s),
             " --tls-ca %s/ca.crt --tls-cert %s/127.0.0.1.crt --tls-key %s/127.0.0.1.key ", certs,
             certs, certs);
    CU_ASSERT_EQUAL(count_in(cmds, want_s), 3);
    CU_ASSERT_EQUAL(count_in(cmds, "tcp://"), count_in(cmds, "tls+tcp://"));
    free(cmds);

    /* The router lists both workers, healthy, at the tls+tcp:// addresses
     * they announced (and dialed back over TLS). */
    char *body;
    CU_ASSERT_EQUAL(http_post(port, "/v1/cluster", NULL, &body), 200);
    snprintf(want_s, sizeof(want_s), "\"announce\":\"tls+tcp://127.0.0.1:%d\"", announce);
    CU_ASSERT_PTR_NOT_NULL(strstr(body, want_s));
    /* TLS links stay on NNG (uvsp has no TLS). */
    CU_ASSERT_EQUAL(count_in(body, "\"healthy\":true,\"link\":\"up\",\"link_transport\":\"nng\","
                                   "\"control_address\":\"tls+tcp://127.0.0.1:"),
                    2);
    CU_ASSERT_EQUAL(count_in(body, "\"kv_address\":\"tls+tcp://127.0.0.1:"), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "{\"id\":\"prefill-0\",\"role\":\"prefill\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "{\"id\":\"decode-0\",\"role\":\"decode\""));
    free(body);

    /* A completion: prefilled on prefill-0, KV shipped over TLS to decode-0,
     * exactly the tokens and logprobs of the tcp:// run. */
    CU_ASSERT_EQUAL(answer(port, dm, &got), 0);
    CU_ASSERT_STRING_EQUAL(got.choices, want.choices);
    CU_ASSERT_EQUAL(got.completion_tokens, 8);
    CU_ASSERT_EQUAL(got.remote_prefills, 1);
    CU_ASSERT_EQUAL(got.kv_frames, want.kv_frames);

    /* By hand, without certificates: a worker announcing over plain tcp://
     * to the router's announce port starts (READY) but never gets through
     * the handshake, so the router never lists it. */
    char ann[64], log[PATH_MAX + 32];
    snprintf(log, sizeof(log), "%s/rogue.log", tmp_root);
    CU_ASSERT_EQUAL(plain_worker_listed(port, announce, log, 0), 0);
    CU_ASSERT_EQUAL(http_post(port, "/v1/cluster", NULL, &body), 200);
    CU_ASSERT_EQUAL(count_in(body, "\"healthy\":true"), 2);
    free(body);
    /* And pointed at the tls+tcp:// address without certificates, a worker
     * refuses to start. */
    snprintf(ann, sizeof(ann), "tls+tcp://127.0.0.1:%d", announce);
    pid_t bare =
        spawn_logged("tandem-decode",
                     (const char *[]){"--id", "bare-0", "--router", ann, "--control",
                                      "tcp://127.0.0.1:0", "--kv", "tcp://127.0.0.1:0", NULL},
                     log);
    CU_ASSERT_FATAL(bare > 0);
    CU_ASSERT_EQUAL(wait_pid(bare, EXIT_MS), 2);
    CU_ASSERT_EQUAL(wait_file(log, "tls+tcp:// needs", 1, 0), 0);
    /* kill -9 of decode-0: restarted, it listens on tls+tcp:// again and
     * rejoins; the cluster serves the same answer (its KV again shipped over
     * TLS). */
    pid_t dec = banner_pid(r->out, "decode-0");
    CU_ASSERT_EQUAL(kill(dec, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 1, EVENT_MS), 0);
    struct tls_answer again;
    int served = 0;
    for (double end = now_ms() + EVENT_MS; !served && now_ms() < end;) {
        served = answer(port, dm, &again) == 0;
        if (!served) {
            sleep_ms(200);
        }
    }
    CU_ASSERT(served);
    CU_ASSERT_STRING_EQUAL(again.choices, want.choices);
    CU_ASSERT(again.remote_prefills >= 2); /* more if a try came before the link */

    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {banner_pid(r->out, "router"), banner_pid(r->out, "prefill-0"), dec};
    char killed_dec[80];
    killed_line(killed_dec, sizeof(killed_dec), "decode-0", dec);
    const char *const exits[] = {killed_dec, "router exited: exit code 0",
                                 "prefill-0 exited: exit code 0", "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, NULL, pids, 3);
    free(r);
}

static int rm_rf(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        return unlink(path);
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) {
            continue;
        }
        char sub[PATH_MAX];
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
            rm_rf(sub);
        } else {
            unlink(sub);
        }
    }
    closedir(d);
    return rmdir(path);
}

int main(int argc, char **argv)
{
    const char *base = strrchr(argv[0], '/');
    if (!strcmp(base ? base + 1 : argv[0], "tandem-router")) {
        return fake_router_main(argc, argv);
    }
    const char *b = getenv("TANDEM_BIN_DIR");
    const char *s = getenv("TANDEM_SOURCE_DIR");
    if (!b || !s) {
        fprintf(stderr, "test_up: set TANDEM_BIN_DIR and TANDEM_SOURCE_DIR (ctest does)\n");
        return 1;
    }
    snprintf(bin_dir, sizeof(bin_dir), "%s", b);
    snprintf(src_dir, sizeof(src_dir), "%s", s);
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    if (leftover_init() != 0) {
        perror("PR_SET_CHILD_SUBREAPER");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    CU_initialize_registry();
    CU_pSuite suite = CU_add_suite("up", NULL, NULL);
    CU_add_test(suite, "cli", test_cli);
    CU_add_test(suite, "dry_run", test_dry_run);
    CU_add_test(suite, "workers_only", test_workers_only);
    CU_add_test(suite, "start_failure", test_start_failure);
    CU_add_test(suite, "router_contract", test_router_contract);
    CU_add_test(suite, "join_timeout", test_join_timeout);
    CU_add_test(suite, "interrupted", test_interrupted);
    CU_add_test(suite, "stop_deadline", test_stop_deadline);
    CU_add_test(suite, "second_signal", test_second_signal);
    CU_add_test(suite, "real_router", test_real_router);
    CU_add_test(suite, "refused", test_refused);
    CU_add_test(suite, "tls", test_tls);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    if (failed == 0) {
        rm_rf(tmp_root);
    } else {
        printf("test_up: files kept in %s\n", tmp_root);
    }
    return failed ? 1 : 0;
}
