/* What test_up and test_up_router share: running `tandem up` as a child
 * (its stdout read, its stderr in a file), waiting for its lines and exit,
 * checking a clean stop, and the test's directories. Header-only (static
 * functions) because each test file is its own executable; the includer
 * sets bin_dir, src_dir and tmp_root in main. Threads: the main thread. */
#ifndef TANDEM_UP_RUN_H
#define TANDEM_UP_RUN_H

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

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
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
static inline int up_start(struct up_run *r, const char *const *args, const char *env_set)
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

static inline void up_read(struct up_run *r, int wait_ms)
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

static inline char *slurp(const char *path)
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

static inline int count_in(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *s = hay; (s = strstr(s, needle)) != NULL; s += strlen(needle)) {
        n++;
    }
    return n;
}

/* Waits for needle on stdout. */
static inline int up_wait_out(struct up_run *r, const char *needle, int timeout_ms)
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
static inline int wait_file(const char *path, const char *needle, int count, int timeout_ms)
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
static inline int up_wait_exit(struct up_run *r, int timeout_ms, double *ms)
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
static inline pid_t banner_pid(const char *out, const char *name)
{
    char key[80];
    snprintf(key, sizeof(key), "\n  %s ", name);
    const char *s = strstr(out, key);
    const char *p = s ? strstr(s, "pid=") : NULL;
    return p ? (pid_t)atoi(p + 4) : 0;
}

/* The ipc directory in the banner ("ipc:///tmp/tandem-up-XXXXXX/..."), or "". */
static inline void banner_ipc_dir(const char *out, char *dir, size_t cap)
{
    const char *s = strstr(out, "ipc:///tmp/tandem-up-");
    dir[0] = '\0';
    if (s) {
        s += 6;
        size_t n = strcspn(s + 5, "/") + 5;
        snprintf(dir, cap, "%.*s", (int)n, s);
    }
}

static inline int alive(pid_t pid)
{
    return pid > 0 && kill(pid, 0) == 0;
}

/* Prints the stop watchdog's message from any process log of a stopped run
 * (its run directory from tandem up's "logs in DIR" line): such a process
 * exited 70 because its stop hung and the watchdog ended it, which
 * expect_up_exits fails; this prints why. */
static inline void note_watchdogs(const struct up_run *r)
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
static inline void check_clean_stop(struct up_run *r, int want_code, const char *const *exits,
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
static inline void killed_line(char *out, size_t cap, const char *name, pid_t pid)
{
    snprintf(out, cap, "%s (pid %d) exited: killed by signal 9 (SIGKILL)", name, (int)pid);
}

/* A 1P1D cluster stopped by a signal with no exit before: every process
 * exits 0 on the SIGTERM. */
static const char *const clean_stop_1p1d[] = {"router exited: exit code 0",
                                              "prefill-0 exited: exit code 0",
                                              "decode-0 exited: exit code 0", NULL};

static inline int run_simple(const char *const *args, char *out, size_t cap, char *err,
                             size_t errcap)
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

static inline void write_text(const char *path, const char *text)
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
static inline void mirror_example(const char *name, char *path, size_t cap)
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

static inline int rm_rf(const char *path)
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
        int n = snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        if (n < 0 || (size_t)n >= sizeof(sub)) {
            continue; /* longer than a path can be: not ours */
        }
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

/* The main of a tandem up test executable ("test_up", suite "up"): takes
 * TANDEM_BIN_DIR and TANDEM_SOURCE_DIR, makes tmp_root, becomes the
 * subreaper of what it starts (leftover.h), runs the tests add_tests
 * registers, and removes tmp_root when all passed (else says where it is).
 * Returns the exit status. */
static inline int up_main(const char *name, void (*add_tests)(CU_pSuite suite))
{
    const char *b = getenv("TANDEM_BIN_DIR");
    const char *s = getenv("TANDEM_SOURCE_DIR");
    if (!b || !s) {
        fprintf(stderr, "%s: set TANDEM_BIN_DIR and TANDEM_SOURCE_DIR (ctest does)\n", name);
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
    add_tests(CU_add_suite(name + strlen("test_"), NULL, NULL));
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    if (failed == 0) {
        rm_rf(tmp_root);
    } else {
        printf("%s: files kept in %s\n", name, tmp_root);
    }
    return failed ? 1 : 0;
}

#endif
