#include "harness.h"
#include "watchdog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define H_MAX_FILES 64

static pid_t children[H_MAX_PROCS];
static char files[H_MAX_FILES][H_URL_MAX];
static int n_files;
static char tmpdir[128];
static int inited;

double h_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void h_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Async-signal-safe part of the cleanup: kill, unlink. */
static void kill_all_now(void)
{
    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
        }
    }
    for (int i = 0; i < n_files; i++) {
        unlink(files[i]);
    }
}

static void on_fatal(int sig)
{
    kill_all_now();
    if (tmpdir[0]) {
        rmdir(tmpdir);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void at_exit(void)
{
    h_cleanup_all();
    if (tmpdir[0]) {
        rmdir(tmpdir);
    }
}

void h_init(void)
{
    if (inited) {
        return;
    }
    inited = 1;
    atexit(at_exit);
    int sigs[] = {SIGSEGV, SIGABRT, SIGTERM, SIGINT, SIGALRM, SIGBUS, SIGFPE};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        signal(sigs[i], on_fatal);
    }
    signal(SIGPIPE, SIG_IGN);
}

const char *h_tmpdir(void)
{
    h_init();
    if (tmpdir[0] == '\0') {
        snprintf(tmpdir, sizeof(tmpdir), "/tmp/tandem-it-XXXXXX");
        if (mkdtemp(tmpdir) == NULL) {
            snprintf(tmpdir, sizeof(tmpdir), "/tmp");
        }
    }
    return tmpdir;
}

static void remember_file(const char *path)
{
    if (n_files < H_MAX_FILES) {
        snprintf(files[n_files++], H_URL_MAX, "%s", path);
    }
}

void h_ipc_url(char *out, size_t cap, const char *name)
{
    char path[H_URL_MAX];
    snprintf(path, sizeof(path), "%s/%s.ipc", h_tmpdir(), name);
    remember_file(path);
    snprintf(out, cap, "ipc://%s", path);
}

static int bin_path(char *out, size_t cap, const char *binary)
{
    const char *dir = getenv("TANDEM_BIN_DIR");
    if (dir == NULL) {
        dir = "build/bin";
    }
    snprintf(out, cap, "%s/%s", dir, binary);
    if (access(out, X_OK) != 0) {
        fprintf(stderr, "harness: %s is not executable (set TANDEM_BIN_DIR)\n", out);
        return -1;
    }
    return 0;
}

static int slot_add(pid_t pid)
{
    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (children[i] == 0) {
            children[i] = pid;
            return 0;
        }
    }
    return -1;
}

static void slot_del(pid_t pid)
{
    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (children[i] == pid) {
            children[i] = 0;
        }
    }
}

static pid_t spawn(const char *binary, const char *const *args, int out_fd, int quiet)
{
    char path[512];
    if (bin_path(path, sizeof(path), binary) != 0) {
        return -1;
    }
    const char *argv[64];
    int n = 0;
    argv[n++] = path;
    for (int i = 0; args && args[i] && n < 61; i++) {
        argv[n++] = args[i];
    }
    /* TANDEM_IT_LOG=debug|info|... overrides the tests' log level. */
    const char *level = getenv("TANDEM_IT_LOG");
    if (level != NULL && *level) {
        argv[n++] = "--log-level";
        argv[n++] = level;
    }
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (out_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
        posix_spawn_file_actions_addclose(&fa, out_fd);
    } else if (quiet) {
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    }
    if (quiet) {
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    }
    pid_t pid;
    int rc = posix_spawn(&pid, path, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "harness: posix_spawn %s: %s\n", path, strerror(rc));
        return -1;
    }
    if (slot_add(pid) != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fprintf(stderr, "harness: more than %d children\n", H_MAX_PROCS);
        return -1;
    }
    return pid;
}

static void field(const char *line, const char *key, char *out, size_t cap)
{
    out[0] = '\0';
    const char *p = strstr(line, key);
    if (p == NULL) {
        return;
    }
    p += strlen(key);
    size_t n = strcspn(p, " \n");
    if (n >= cap) {
        n = cap - 1;
    }
    memcpy(out, p, n);
    out[n] = '\0';
}

int h_spawn(struct h_proc *p, const char *binary, const char *const *args, int timeout_ms)
{
    h_init();
    memset(p, 0, sizeof(*p));
    int fds[2];
    if (pipe(fds) != 0) {
        return -1;
    }
    pid_t pid = spawn(binary, args, fds[1], 0);
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return -1;
    }
    p->pid = pid;
    char line[2048];
    size_t len = 0;
    double deadline = h_ms() + timeout_ms;
    int ok = 0;
    while (!ok) {
        int left = (int)(deadline - h_ms());
        if (left <= 0) {
            fprintf(stderr, "harness: %s printed no READY line within %d ms\n", binary, timeout_ms);
            break;
        }
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (poll(&pfd, 1, left) <= 0) {
            continue;
        }
        ssize_t n = read(fds[0], line + len, sizeof(line) - 1 - len);
        if (n <= 0) {
            fprintf(stderr, "harness: %s exited before READY\n", binary);
            break;
        }
        len += (size_t)n;
        line[len] = '\0';
        char *nl = strchr(line, '\n');
        if (nl != NULL) {
            ok = strncmp(line, "READY ", 6) == 0;
            if (!ok) {
                fprintf(stderr, "harness: %s: unexpected first line: %s\n", binary, line);
                break;
            }
        } else if (len == sizeof(line) - 1) {
            break;
        }
    }
    /* The worker prints nothing else on stdout; closing our end is fine
     * (it ignores SIGPIPE). */
    close(fds[0]);
    if (!ok) {
        h_stop(p, SIGKILL, 1000);
        return -1;
    }
    field(line, "id=", p->id, sizeof(p->id));
    field(line, "role=", p->role, sizeof(p->role));
    field(line, "control=", p->control, sizeof(p->control));
    field(line, "kv=", p->kv, sizeof(p->kv));
    field(line, "metrics=", p->metrics, sizeof(p->metrics));
    const char *colon = strrchr(p->metrics, ':');
    p->metrics_port = colon ? atoi(colon + 1) : 0;
    if (strncmp(p->control, "ipc://", 6) == 0) {
        remember_file(p->control + 6);
    }
    if (strncmp(p->kv, "ipc://", 6) == 0) {
        remember_file(p->kv + 6);
    }
    return 0;
}

static int wait_exit(pid_t pid, int timeout_ms, int *status)
{
    double deadline = h_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) {
            return 0;
        }
        if (r < 0) {
            return -1;
        }
        if (h_ms() >= deadline) {
            return 1;
        }
        h_sleep_ms(5);
    }
}

static int code_of(int status)
{
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    if (WIFSIGNALED(status)) {
        return 128 + WTERMSIG(status);
    }
    return -1;
}

/* Under TSan, libuv can lose a signal: a bare libuv program built with
 * -fsanitize=thread lost 1 SIGTERM sent right after its start in 223 runs
 * (none in 300 without TSan), and a router in 4. So there h_stop sends it
 * again every second, while the process still has a handler for it: router
 * and workers take a repeat as the same stop, and once they give the
 * handler back (exiting) nothing more is sent, so a repeat never kills. */
#if defined(__SANITIZE_THREAD__)
#define RESEND_LOST_SIGNALS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RESEND_LOST_SIGNALS 1
#endif
#endif
#ifndef RESEND_LOST_SIGNALS
#define RESEND_LOST_SIGNALS 0
#endif

/* Whether pid has a handler for sig (SigCgt in /proc/pid/status). */
static int catches(pid_t pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    unsigned long long mask = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "SigCgt: %llx", &mask) == 1) {
            break;
        }
    }
    fclose(f);
    return (mask >> (sig - 1)) & 1;
}

int h_stop(struct h_proc *p, int sig, int timeout_ms)
{
    if (p->pid <= 0) {
        return code_of(p->exit_status);
    }
    double deadline = h_ms() + timeout_ms;
    int status = 0, rc;
    for (;;) {
        kill(p->pid, sig);
        double left = deadline - h_ms();
        int slice = left > 0 ? (int)left : 0;
        int again = RESEND_LOST_SIGNALS && (sig == SIGTERM || sig == SIGINT) && left > 1000;
        rc = wait_exit(p->pid, again ? 1000 : slice, &status);
        if (rc != 1 || !again || !catches(p->pid, sig)) {
            break;
        }
    }
    if (rc == 1 && h_ms() < deadline) {
        rc = wait_exit(p->pid, (int)(deadline - h_ms()), &status);
    }
    if (rc == 1) {
        fprintf(stderr, "harness: pid %d did not exit within %d ms of signal %d: SIGKILL\n",
                (int)p->pid, timeout_ms, sig);
        kill(p->pid, SIGKILL);
        rc = wait_exit(p->pid, 5000, &status);
    }
    slot_del(p->pid);
    if (rc == 0 && code_of(status) == WATCHDOG_EXIT) {
        fprintf(stderr,
                "harness: pid %d exited %d: its stop watchdog fired, so its stop hung "
                "(common/watchdog.h; its stderr says where); not a clean stop\n",
                (int)p->pid, WATCHDOG_EXIT);
    }
    p->pid = 0;
    p->exit_status = status;
    return rc == 0 ? code_of(status) : -1;
}

int h_run(const char *binary, const char *const *args, int timeout_ms, int keep_output)
{
    h_init();
    pid_t pid = spawn(binary, args, -1, !keep_output);
    if (pid < 0) {
        return -1;
    }
    int status = 0;
    int rc = wait_exit(pid, timeout_ms, &status);
    if (rc != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        slot_del(pid);
        return -1;
    }
    slot_del(pid);
    return code_of(status);
}

void h_cleanup_all(void)
{
    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
            children[i] = 0;
        }
    }
    for (int i = 0; i < n_files; i++) {
        unlink(files[i]);
    }
    n_files = 0;
}

/* ---- HTTP --------------------------------------------------------------- */

static int connect_local(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        return -1;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads until EOF or timeout into a malloc'd NUL-terminated buffer. */
static char *read_all(int fd, int timeout_ms, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    double deadline = h_ms() + timeout_ms;
    while (buf != NULL) {
        int left = (int)(deadline - h_ms());
        if (left <= 0) {
            break;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, left) <= 0) {
            continue;
        }
        if (n + 1 == cap) {
            char *b = realloc(buf, cap * 2);
            if (b == NULL) {
                break;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0) {
            break;
        }
        n += (size_t)r;
    }
    if (buf != NULL) {
        buf[n] = '\0';
    }
    *len = n;
    return buf;
}

static int status_of(const char *resp)
{
    int major, minor, status;
    if (resp == NULL || sscanf(resp, "HTTP/%d.%d %d", &major, &minor, &status) != 3) {
        return -1;
    }
    return status;
}

int h_http_get(int port, const char *path, char **body)
{
    *body = NULL;
    int fd = connect_local(port);
    if (fd < 0) {
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t len;
    char *resp = read_all(fd, 5000, &len);
    close(fd);
    int status = status_of(resp);
    if (resp != NULL) {
        char *b = strstr(resp, "\r\n\r\n");
        *body = strdup(b ? b + 4 : "");
    }
    free(resp);
    return status;
}

int h_http_raw(int port, const void *data, size_t len, int timeout_ms)
{
    int fd = connect_local(port);
    if (fd < 0) {
        return -1;
    }
    ssize_t w = write(fd, data, len);
    (void)w;
    shutdown(fd, SHUT_WR);
    size_t n;
    char *resp = read_all(fd, timeout_ms, &n);
    close(fd);
    int status = status_of(resp);
    free(resp);
    return status;
}

double h_metric(const char *body, const char *series)
{
    if (body == NULL) {
        return NAN;
    }
    size_t n = strlen(series);
    for (const char *p = body; p && *p;) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            return strtod(p + n + 1, NULL);
        }
        p = strchr(p, '\n');
        if (p) {
            p++;
        }
    }
    return NAN;
}

double h_metric_sum(const char *body, const char *prefix)
{
    double sum = 0;
    int found = 0;
    size_t n = strlen(prefix);
    for (const char *p = body; p && *p;) {
        if (strncmp(p, prefix, n) == 0) {
            const char *sp = strchr(p, ' ');
            const char *nl = strchr(p, '\n');
            if (sp != NULL && (nl == NULL || sp < nl)) {
                sum += strtod(sp + 1, NULL);
                found = 1;
            }
        }
        p = strchr(p, '\n');
        if (p) {
            p++;
        }
    }
    return found ? sum : NAN;
}

double h_proc_metric_sum(const struct h_proc *p, const char *prefix)
{
    char *body;
    if (h_http_get(p->metrics_port, "/metrics", &body) != 200) {
        free(body);
        fprintf(stderr, "harness: %s: /metrics unavailable\n", p->id);
        return NAN;
    }
    double v = h_metric_sum(body, prefix);
    free(body);
    if (isnan(v)) {
        fprintf(stderr, "harness: %s: no series %s...}\n", p->id, prefix);
    }
    return v;
}

double h_proc_metric(const struct h_proc *p, const char *series)
{
    char *body;
    if (h_http_get(p->metrics_port, "/metrics", &body) != 200) {
        free(body);
        fprintf(stderr, "harness: %s: /metrics unavailable\n", p->id);
        return NAN;
    }
    double v = h_metric(body, series);
    free(body);
    if (isnan(v)) {
        fprintf(stderr, "harness: %s: no series %s\n", p->id, series);
    }
    return v;
}

int h_kv_invariant(const struct h_proc *p, double *used)
{
    char *body;
    if (h_http_get(p->metrics_port, "/metrics", &body) != 200) {
        free(body);
        fprintf(stderr, "harness: %s: /metrics unavailable\n", p->id);
        return -1;
    }
    double f = h_metric(body, "tandem:kv_blocks{state=\"free\"}");
    double u = h_metric(body, "tandem:kv_blocks{state=\"used\"}");
    double c = h_metric(body, "tandem:kv_blocks{state=\"cached_idle\"}");
    double t = h_metric(body, "tandem:kv_capacity_blocks");
    free(body);
    if (used != NULL) {
        *used = u;
    }
    if (isnan(f) || isnan(u) || isnan(c) || isnan(t) || f + u + c != t) {
        fprintf(stderr,
                "harness: %s: KV invariant broken: free %g + used %g + cached_idle %g != "
                "total %g\n",
                p->id, f, u, c, t);
        return -1;
    }
    return 0;
}

double h_wait_used(const struct h_proc *p, double want, int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    double u = NAN;
    for (;;) {
        u = h_proc_metric(p, "tandem:kv_blocks{state=\"used\"}");
        if (u == want || h_ms() >= deadline) {
            return u;
        }
        h_sleep_ms(20);
    }
}

void h_prompt(uint32_t *out, int n, uint64_t seed, uint32_t lo, uint32_t hi)
{
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        out[i] = lo + (uint32_t)(z % (hi - lo));
    }
}

/* ---- NNG close with a deadline ------------------------------------------ */

struct close_job {
    nng_socket s;
    int done; /* set by the closing thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *close_thread(void *arg)
{
    struct close_job *j = arg;
    nng_close(j->s);
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

int h_nng_close(nng_socket s)
{
    /* Not freed when the close is abandoned: the thread still uses it. */
    struct close_job *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        nng_close(s);
        return 0;
    }
    j->s = s;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, close_thread, j) != 0) {
        nng_close(s);
        free(j);
        return 0;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) != 0) {
            break;
        }
    }
    int done = j->done;
    pthread_mutex_unlock(&j->mu);
    if (!done) {
        pthread_detach(t);
        fprintf(stderr, "harness: nng_close blocked for 5 s (NNG 1.5 close deadlock); left "
                        "behind\n");
        return -1;
    }
    pthread_join(t, NULL);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    return 0;
}
