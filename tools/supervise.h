/* Process supervision on a libuv loop, for `tandem up`.
 *
 * Each supervised process runs in its own process group (so a terminal's
 * Ctrl-C reaches only the supervisor, which decides the order of things) with
 * PR_SET_PDEATHSIG set to SIGTERM (so it goes away if the supervisor is
 * killed outright). Its stdout and stderr share one pipe, which the loop
 * copies to the process's log file (appending) and splits into lines for the
 * owner's on_line callback.
 *
 * An exit (seen through SIGCHLD) is reported to on_exit and, unless the
 * supervisor is stopping or the process is not restartable, followed by a
 * restart after the delay sv_backoff_next (sv_backoff.h) gives for that run:
 * the first delay, doubling up to a cap, back to the first once a run was
 * ready (sv_mark_ready) long enough, and no restart (gave_up set) once
 * backoff.give_up runs in a row ended before becoming ready.
 *
 * sv_shutdown sends SIGTERM to every process group, SIGKILL to those still
 * alive grace_ms later, reaps them all, closes every handle and then calls its
 * callback: after that the supervisor holds no handle on the loop.
 *
 * Threads: everything on the loop's thread. The supervisor forks, so the
 * process must not run other threads that hold locks across fork (libuv's
 * threadpool is fine: the child only calls async-signal-safe functions before
 * exec). */
#ifndef TANDEM_SUPERVISE_H
#define TANDEM_SUPERVISE_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "sv_backoff.h"

#define SV_LINE_MAX 4096 /* longer output lines are handed over in pieces */

struct sv_proc;
struct sv_reader;
struct supervisor;

struct sv_proc_ops {
    /* One line of the current run's output, without the newline (already in
     * the log). May be NULL. */
    void (*on_line)(struct sv_proc *p, const char *line);
    /* The process exited with waitpid status. restart_ms >= 0: it will be
     * started again in that many ms; -1: it will not (stopping, not
     * restartable, or gave_up: it failed to start too often). p->ready still
     * says whether this run became ready. May be NULL. */
    void (*on_exit)(struct sv_proc *p, int status, int restart_ms);
    /* A run started (pid set). May be NULL. */
    void (*on_start)(struct sv_proc *p);
};

/* Embedded by its owner. Fill the public part, then sv_add. */
struct sv_proc {
    /* public, set before sv_add */
    char name[64];
    char *const *argv; /* argv[0]: path to execute; not copied, must outlive the proc */
    const char *log_path;
    const struct sv_proc_ops *ops;
    int restart; /* 1: restart after an exit */
    void *data;  /* owner's */

    /* read-only */
    pid_t pid;         /* 0 when not running */
    pid_t last_pid;    /* of the latest run, kept after it exits */
    int runs;          /* runs started so far */
    int ready;         /* sv_mark_ready was called in this run */
    int last_status;   /* waitpid status of the last exit */
    int delay_ms;      /* delay before the latest restart; 0 before the first */
    int failed_starts; /* runs in a row, up to the latest, that ended before ready */
    int gave_up;       /* not restarted: failed_starts reached backoff.give_up */

    /* private */
    struct supervisor *sv;
    int log_fd;
    struct sv_reader *reader; /* of the current run */
    uv_timer_t restart_timer;
    int timer_open;
    uint64_t started_at; /* uv_now when the current run started */
    uint64_t ready_at;   /* uv_now at sv_mark_ready */
};

/* Embedded by its owner. Fields are private. */
struct supervisor {
    uv_loop_t *loop;
    struct sv_backoff backoff;
    struct sv_proc **procs; /* (n) */
    int n;
    int cap;
    struct sv_reader *readers; /* every open reader, current or draining */
    uv_signal_t sigchld;
    uv_timer_t kill_timer;
    int stopping;
    int hurried; /* a second sv_shutdown moved the SIGKILL earlier */
    int closing;
    int pending_closes;
    void (*done_cb)(struct supervisor *sv);
};

/* Starts argv[0] (a path: execv, no PATH search) with argv as a child set up
 * the way every process Tandem starts is: its own process group (so a
 * terminal's Ctrl-C reaches only the parent, which stops things in order),
 * PR_SET_PDEATHSIG SIGTERM (so it goes if the parent is killed outright),
 * default signal dispositions and an empty signal mask, stdin from /dev/null
 * and stdout and stderr on out_fd (give it close-on-exec: the child gets its
 * own copy). The child exits 126 when the parent died before the death
 * signal was set or a dup2 failed, and 127 after writing "tandem up: cannot
 * execute <path>: ..." to out_fd when exec fails. Every signal is blocked
 * across the fork, so no handler of the parent's (libuv's signal pipe) runs
 * in the child. Returns 0 with *pid set, or TANDEM_EIO (errno from open or
 * fork; nothing started). Call it from the thread that owns the children,
 * with no other thread holding locks the child could need (it calls only
 * async-signal-safe functions before exec). */
int sv_spawn(char *const *argv, int out_fd, pid_t *pid);

/* Initialises sv on loop (installs the SIGCHLD handler). backoff is the
 * restart policy, NULL for the defaults (SV_BACKOFF_*). Returns 0 or a
 * TANDEM_E* code. */
int sv_init(struct supervisor *sv, uv_loop_t *loop, const struct sv_backoff *backoff);

/* Registers p (not started) and opens its log file for appending. Returns 0,
 * TANDEM_EIO (log file; message on stderr through the log) or TANDEM_ENOMEM. */
int sv_add(struct supervisor *sv, struct sv_proc *p);

/* Starts a run of p now (no-op if it is running). A failure to fork or to
 * create the pipe is treated as an exit with status 127 << 8 (restarts per
 * policy). Returns 0 or the error code. */
int sv_start(struct sv_proc *p);

/* The owner saw p become ready (e.g. its READY line): a run that lasts
 * backoff.reset_ms from now resets the restart delay. */
void sv_mark_ready(struct sv_proc *p);

/* Writes "# tandem up <UTC time>: <message>" as a line of p's log. */
void sv_note(struct sv_proc *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Stops everything: no more restarts, SIGTERM to every running process group,
 * SIGKILL to the survivors after grace_ms, then closes every handle and calls
 * cb (may be NULL) once the last one is closed. Calling it again while it
 * runs with a smaller grace_ms moves the SIGKILL earlier (0: now). */
void sv_shutdown(struct supervisor *sv, int grace_ms, void (*cb)(struct supervisor *sv));

/* Copies the last max_lines lines of p's log into out (NUL-terminated,
 * each line indented by two spaces). Returns the number of lines. */
int sv_log_tail(const struct sv_proc *p, int max_lines, char *out, size_t cap);

/* Describes a waitpid status: "exit code 1", "killed by signal 9 (SIGKILL)". */
void sv_describe_status(int status, char *out, size_t cap);

/* Processes running now. */
int sv_running(const struct supervisor *sv);

#endif
