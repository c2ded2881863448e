/* Process supervision: fork/exec into a fresh process group, output through a
 * pipe into the log file, SIGCHLD-driven reaping, restart with backoff, and a
 * two-step stop (SIGTERM, then SIGKILL at the deadline). fork is used rather
 * than uv_spawn because the child must set PR_SET_PDEATHSIG between fork and
 * exec, which uv_spawn has no hook for. */
#include "supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "tandem_err.h"

#define READ_CHUNK 16384

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* The read end of one run's output pipe. Lives until EOF (or shutdown), which
 * may be after the run it belongs to was replaced by a new one. */
struct sv_reader {
    uv_pipe_t pipe;
    struct sv_proc *p;
    int run; /* p->runs when it was spawned */
    struct sv_reader *next;
    int closing;
    int counted; /* the supervisor's shutdown waits for its close */
    size_t len;
    char line[SV_LINE_MAX];
    char rbuf[READ_CHUNK];
};

static void check_done(struct supervisor *sv);

static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return; /* the log is best effort; the process keeps running */
        }
        buf += n;
        len -= (size_t)n;
    }
}

void sv_note(struct sv_proc *p, const char *fmt, ...)
{
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(
        buf, sizeof(buf), "# tandem up %04d-%02d-%02dT%02d:%02d:%02d.%03ldZ: ", tm.tm_year + 1900,
        tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(buf) - 2) {
        len = sizeof(buf) - 2;
    }
    buf[len++] = '\n';
    if (p->log_fd >= 0) {
        write_all(p->log_fd, buf, len);
    }
}

void sv_describe_status(int status, char *out, size_t cap)
{
    if (WIFEXITED(status)) {
        snprintf(out, cap, "exit code %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        static const struct {
            int sig;
            const char *name;
        } names[] = {{SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},
                     {SIGILL, "SIGILL"},   {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},
                     {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGSEGV, "SIGSEGV"},
                     {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
                     {SIGUSR1, "SIGUSR1"}, {SIGUSR2, "SIGUSR2"}};
        int sig = WTERMSIG(status);
        const char *name = "?";
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            name = names[i].sig == sig ? names[i].name : name;
        }
        snprintf(out, cap, "killed by signal %d (%s)%s", sig, name,
                 WCOREDUMP(status) ? ", core dumped" : "");
    } else {
        snprintf(out, cap, "status 0x%x", (unsigned)status);
    }
}

/* ------------------------------------------------------------------ */
/* Output                                                              */
/* ------------------------------------------------------------------ */

static void deliver(struct sv_reader *r)
{
    struct sv_proc *p = r->p;
    r->line[r->len] = '\0';
    if (r->run == p->runs && p->ops && p->ops->on_line) {
        p->ops->on_line(p, r->line);
    }
    r->len = 0;
}

static void consume(struct sv_reader *r, const char *buf, size_t n)
{
    write_all(r->p->log_fd, buf, n);
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            deliver(r);
        } else {
            r->line[r->len++] = buf[i];
            if (r->len == SV_LINE_MAX - 1) {
                deliver(r);
            }
        }
    }
}

static void on_reader_closed(uv_handle_t *h)
{
    struct sv_reader *r = container_of((uv_pipe_t *)h, struct sv_reader, pipe);
    struct supervisor *sv = r->p->sv;
    for (struct sv_reader **pp = &sv->readers; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    if (r->p->reader == r) {
        r->p->reader = NULL;
    }
    int counted = r->counted;
    free(r);
    if (counted && --sv->pending_closes == 0) {
        check_done(sv);
    }
}

static void reader_close(struct sv_reader *r)
{
    if (r->closing) {
        return;
    }
    r->closing = 1;
    if (r->len > 0) {
        deliver(r);
    }
    uv_close((uv_handle_t *)&r->pipe, on_reader_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct sv_reader *r = container_of((uv_pipe_t *)h, struct sv_reader, pipe);
    (void)suggested;
    *buf = uv_buf_init(r->rbuf, sizeof(r->rbuf));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct sv_reader *r = container_of((uv_pipe_t *)s, struct sv_reader, pipe);
    if (n > 0) {
        consume(r, buf->base, (size_t)n);
    } else if (n < 0) {
        reader_close(r); /* UV_EOF: every writer is gone */
    }
}

/* Reads what is left in the pipe without blocking (at shutdown, so the log
 * has the last words of a process that was just killed). */
static void drain(struct sv_reader *r)
{
    uv_os_fd_t fd;
    if (r->closing || uv_fileno((uv_handle_t *)&r->pipe, &fd) != 0) {
        return;
    }
    for (;;) {
        ssize_t n = read(fd, r->rbuf, sizeof(r->rbuf));
        if (n > 0) {
            consume(r, r->rbuf, (size_t)n);
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            break;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Runs                                                                */
/* ------------------------------------------------------------------ */

static void on_restart_timer(uv_timer_t *t)
{
    struct sv_proc *p = container_of(t, struct sv_proc, restart_timer);
    if (!p->sv->stopping) {
        sv_start(p);
    }
}

static void exited(struct sv_proc *p, int status)
{
    struct supervisor *sv = p->sv;
    char what[96];
    sv_describe_status(status, what, sizeof(what));
    p->pid = 0;
    p->last_status = status;
    int delay = -1;
    if (!sv->stopping && p->restart) {
        struct sv_run run = {
            .started_ms = (int64_t)p->started_at,
            .ready_ms = p->ready ? (int64_t)p->ready_at : SV_NEVER,
            .died_ms = (int64_t)uv_now(sv->loop),
            .failed_before = p->failed_starts,
        };
        delay = sv_backoff_next(&sv->backoff, p->delay_ms, &run);
        p->gave_up = delay == SV_GIVE_UP;
        delay = p->gave_up ? -1 : delay;
    }
    p->failed_starts = p->ready ? 0 : p->failed_starts + 1;
    if (p->ops && p->ops->on_exit) {
        p->ops->on_exit(p, status, delay); /* may stop everything */
    }
    p->ready = 0;
    if (delay >= 0 && !sv->stopping) {
        sv_note(p, "run %d exited (%s); restarting in %d ms", p->runs, what, delay);
    } else if (p->gave_up) {
        sv_note(p, "run %d exited (%s): %d runs in a row ended before ready, not restarting",
                p->runs, what, p->failed_starts);
    } else {
        sv_note(p, "run %d exited (%s)", p->runs, what);
    }
    if (delay >= 0 && !sv->stopping) {
        uv_timer_start(&p->restart_timer, on_restart_timer, (uint64_t)delay, 0);
        p->delay_ms = delay;
    }
    check_done(sv);
}

static void on_sigchld(uv_signal_t *h, int signum)
{
    struct supervisor *sv = container_of(h, struct supervisor, sigchld);
    (void)signum;
    /* Signals coalesce: look at every child each time. */
    for (int i = 0; i < sv->n; i++) {
        struct sv_proc *p = sv->procs[i];
        int status;
        if (p->pid > 0 && waitpid(p->pid, &status, WNOHANG) == p->pid) {
            exited(p, status);
        }
    }
}

/* Between fork and exec: async-signal-safe calls only. */
static void child(char *const *argv, int wfd, int nullfd, pid_t parent)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++) {
        sigaction(s, &sa, NULL); /* fails harmlessly for SIGKILL, SIGSTOP, RT internals */
    }
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) {
        _exit(126); /* the supervisor died before we set the death signal */
    }
    if (dup2(nullfd, 0) < 0 || dup2(wfd, 1) < 0 || dup2(wfd, 2) < 0) {
        _exit(126);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(argv[0], argv);
    static const char msg[] = "tandem up: cannot execute ";
    write_all(2, msg, sizeof(msg) - 1);
    write_all(2, argv[0], strlen(argv[0]));
    write_all(2, errno == ENOENT ? ": no such file\n" : ": exec failed\n",
              errno == ENOENT ? 15 : 14);
    _exit(127);
}

int sv_spawn(char *const *argv, int out_fd, pid_t *pid)
{
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nullfd < 0) {
        return TANDEM_EIO;
    }
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid_t parent = getpid();
    pid_t c = fork();
    if (c == 0) {
        child(argv, out_fd, nullfd, parent);
    }
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(nullfd);
    if (c < 0) {
        errno = fork_errno;
        return TANDEM_EIO;
    }
    setpgid(c, c); /* also in the child: whichever runs first */
    *pid = c;
    return 0;
}

int sv_start(struct sv_proc *p)
{
    struct supervisor *sv = p->sv;
    int fds[2] = {-1, -1};
    int rc = TANDEM_EIO;
    if (p->pid > 0 || sv->stopping) {
        return 0;
    }
    uv_timer_stop(&p->restart_timer);
    struct sv_reader *r = calloc(1, sizeof(*r));
    if (!r) {
        rc = TANDEM_ENOMEM;
        goto fail;
    }
    /* Close-on-exec so other children do not inherit it (one thread: no
     * fork can come between pipe and fcntl). */
    if (pipe(fds) != 0 || fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0 ||
        fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0) {
        LOG_ERROR("up", "%s: pipe: %s", p->name, strerror(errno));
        goto fail_pipe;
    }
    p->runs++;
    p->gave_up = 0;
    p->started_at = uv_now(sv->loop);
    sv_note(p, "run %d:%s", p->runs, "");
    for (int i = 0; p->argv[i]; i++) {
        write_all(p->log_fd, i ? " " : "#   ", i ? 1 : 4);
        write_all(p->log_fd, p->argv[i], strlen(p->argv[i]));
    }
    write_all(p->log_fd, "\n", 1);

    pid_t pid;
    rc = sv_spawn(p->argv, fds[1], &pid);
    int spawn_errno = errno;
    close(fds[1]);
    fds[1] = -1;
    if (rc != 0) {
        LOG_ERROR("up", "%s: start: %s", p->name, strerror(spawn_errno));
        goto fail_pipe;
    }
    p->pid = pid;
    p->last_pid = pid;
    p->ready = 0;

    r->p = p;
    r->run = p->runs;
    if (uv_pipe_init(sv->loop, &r->pipe, 0) != 0 || uv_pipe_open(&r->pipe, fds[0]) != 0) {
        /* The run goes on without its output; it still gets supervised. */
        LOG_ERROR("up", "%s: cannot read its output", p->name);
        close(fds[0]);
        free(r);
    } else {
        r->next = sv->readers;
        sv->readers = r;
        p->reader = r;
        uv_read_start((uv_stream_t *)&r->pipe, on_alloc, on_read);
    }
    if (p->ops && p->ops->on_start) {
        p->ops->on_start(p);
    }
    return 0;

fail_pipe:
    if (fds[0] >= 0) {
        close(fds[0]);
    }
    if (fds[1] >= 0) {
        close(fds[1]);
    }
    free(r);
fail:
    exited(p, 127 << 8);
    return rc;
}

void sv_mark_ready(struct sv_proc *p)
{
    p->ready = 1;
    p->ready_at = uv_now(p->sv->loop);
}

/* ------------------------------------------------------------------ */
/* Setup and shutdown                                                  */
/* ------------------------------------------------------------------ */

int sv_init(struct supervisor *sv, uv_loop_t *loop, const struct sv_backoff *backoff)
{
    memset(sv, 0, sizeof(*sv));
    sv->loop = loop;
    sv->backoff = backoff ? *backoff
                          : (struct sv_backoff){.initial_ms = SV_BACKOFF_INITIAL_MS,
                                                .max_ms = SV_BACKOFF_MAX_MS,
                                                .reset_ms = SV_BACKOFF_RESET_MS,
                                                .give_up = SV_BACKOFF_GIVE_UP};
    if (uv_signal_init(loop, &sv->sigchld) != 0) {
        return TANDEM_EIO;
    }
    uv_signal_start(&sv->sigchld, on_sigchld, SIGCHLD);
    uv_timer_init(loop, &sv->kill_timer);
    return 0;
}

int sv_add(struct supervisor *sv, struct sv_proc *p)
{
    if (sv->n == sv->cap) {
        int cap = sv->cap ? sv->cap * 2 : 16;
        struct sv_proc **ps = realloc(sv->procs, sizeof(*ps) * (size_t)cap);
        if (!ps) {
            return TANDEM_ENOMEM;
        }
        sv->procs = ps;
        sv->cap = cap;
    }
    p->log_fd = open(p->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (p->log_fd < 0) {
        LOG_ERROR("up", "%s: cannot open its log %s: %s", p->name, p->log_path, strerror(errno));
        return TANDEM_EIO;
    }
    p->sv = sv;
    p->pid = 0;
    p->runs = 0;
    p->reader = NULL;
    p->delay_ms = 0;
    p->failed_starts = 0;
    p->gave_up = 0;
    uv_timer_init(sv->loop, &p->restart_timer);
    p->timer_open = 1;
    sv->procs[sv->n++] = p;
    return 0;
}

int sv_running(const struct supervisor *sv)
{
    int n = 0;
    for (int i = 0; i < sv->n; i++) {
        n += sv->procs[i]->pid > 0;
    }
    return n;
}

static void signal_all(struct supervisor *sv, int sig)
{
    for (int i = 0; i < sv->n; i++) {
        pid_t pid = sv->procs[i]->pid;
        if (pid > 0) {
            /* The group: the process and anything it started. Only the pid
             * when there is no group yet (setpgid has not run): signalling
             * both delivered a stop signal twice, and a router that had
             * already stopped and restored SIGTERM's default died by it. */
            if (kill(-pid, sig) != 0) {
                kill(pid, sig);
            }
        }
    }
}

static void on_kill_timer(uv_timer_t *t)
{
    struct supervisor *sv = container_of(t, struct supervisor, kill_timer);
    /* Say which: the grace period ran out, or a later sv_shutdown cut it. */
    const char *why =
        sv->hurried ? ": SIGKILL now, before the stop deadline" : " at the stop deadline: SIGKILL";
    for (int i = 0; i < sv->n; i++) {
        if (sv->procs[i]->pid > 0) {
            sv_note(sv->procs[i], "still running%s", why);
            LOG_WARN("up", "%s (pid %d) still running%s", sv->procs[i]->name,
                     (int)sv->procs[i]->pid, why);
        }
    }
    signal_all(sv, SIGKILL);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct supervisor *sv = h->data;
    if (--sv->pending_closes == 0) {
        check_done(sv);
    }
}

static void close_handle(struct supervisor *sv, uv_handle_t *h)
{
    h->data = sv;
    sv->pending_closes++;
    uv_close(h, on_handle_closed);
}

static void check_done(struct supervisor *sv)
{
    if (!sv->stopping || sv_running(sv) > 0) {
        return;
    }
    if (!sv->closing) {
        sv->closing = 1;
        sv->pending_closes = 1; /* held until every close is issued */
        uv_timer_stop(&sv->kill_timer);
        close_handle(sv, (uv_handle_t *)&sv->kill_timer);
        close_handle(sv, (uv_handle_t *)&sv->sigchld);
        for (int i = 0; i < sv->n; i++) {
            close_handle(sv, (uv_handle_t *)&sv->procs[i]->restart_timer);
        }
        for (struct sv_reader *r = sv->readers; r; r = r->next) {
            drain(r);
            r->counted = 1;
            sv->pending_closes++;
            reader_close(r);
        }
        if (--sv->pending_closes > 0) {
            return;
        }
    }
    if (sv->pending_closes == 0 && sv->closing == 1) {
        sv->closing = 2;
        for (int i = 0; i < sv->n; i++) {
            struct sv_proc *p = sv->procs[i];
            if (p->log_fd >= 0) {
                close(p->log_fd);
                p->log_fd = -1;
            }
        }
        free(sv->procs);
        sv->procs = NULL;
        sv->n = sv->cap = 0;
        if (sv->done_cb) {
            sv->done_cb(sv);
        }
    }
}

void sv_shutdown(struct supervisor *sv, int grace_ms, void (*cb)(struct supervisor *sv))
{
    if (grace_ms < 0) {
        grace_ms = 0;
    }
    if (!sv->stopping) {
        sv->stopping = 1;
        sv->done_cb = cb;
        for (int i = 0; i < sv->n; i++) {
            struct sv_proc *p = sv->procs[i];
            uv_timer_stop(&p->restart_timer);
            if (p->pid > 0) {
                sv_note(p, "stopping: SIGTERM");
            }
        }
        signal_all(sv, SIGTERM);
        uv_timer_start(&sv->kill_timer, on_kill_timer, (uint64_t)grace_ms, 0);
    } else if (!sv->closing) {
        uint64_t due = uv_timer_get_due_in(&sv->kill_timer);
        if ((uint64_t)grace_ms < due) {
            sv->hurried = 1;
            uv_timer_start(&sv->kill_timer, on_kill_timer, (uint64_t)grace_ms, 0);
        }
    }
    check_done(sv);
}

int sv_log_tail(const struct sv_proc *p, int max_lines, char *out, size_t cap)
{
    char buf[16384];
    out[0] = '\0';
    int fd = open(p->log_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    struct stat st;
    off_t from = 0;
    if (fstat(fd, &st) == 0 && st.st_size > (off_t)sizeof(buf) - 1) {
        from = st.st_size - (off_t)sizeof(buf) + 1;
    }
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, from);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    /* Back from the end over max_lines line breaks. */
    char *start = buf + n;
    int lines = 0;
    if (start > buf && start[-1] == '\n') {
        start--;
    }
    while (start > buf && lines < max_lines) {
        start--;
        if (*start == '\n') {
            lines++;
        }
    }
    if (*start == '\n') {
        start++;
    } else if (from > 0) {
        char *nl = strchr(start, '\n'); /* a cut line */
        start = nl ? nl + 1 : start;
    }
    size_t o = 0;
    int count = 0;
    for (char *s = start; *s && o + 4 < cap;) {
        char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        int w = snprintf(out + o, cap - o, "  %.*s\n", (int)len, s);
        if (w < 0 || (size_t)w >= cap - o) {
            break;
        }
        o += (size_t)w;
        count++;
        s += len + (nl ? 1 : 0);
    }
    return count;
}
