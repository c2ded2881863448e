/* Processes a test left behind, for tests that start `tandem up` (test_up,
 * test_bench_live): with leftover_init, the test process is a child
 * subreaper, so anything a process it started leaves running when it exits
 * is re-parented to the test instead of init. leftover_count then finds:
 *   - every live descendant of the test (a walk of /proc by parent pid, any
 *     depth: a worker still running, and anything it started), and
 *   - every exited child nobody reaped (an orphan that died after its parent,
 *     e.g. of the death signal when `tandem up` exited without stopping it),
 * prints each one, ends the running ones (SIGKILL, so a leak fails one test
 * and does not outlive it or show up again in the next), reaps them all and
 * returns how many there were. Call it when every process the test started
 * itself has been waited for.
 *
 * Header-only (static functions) so the two tests share one copy without a
 * library. Threads: the test's main thread. */
#ifndef TANDEM_LEFTOVER_H
#define TANDEM_LEFTOVER_H

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Makes the test process a child subreaper. Returns 0 or -1 (errno). */
static inline int leftover_init(void)
{
    return prctl(PR_SET_CHILD_SUBREAPER, 1) == 0 ? 0 : -1;
}

struct leftover_proc {
    pid_t pid, ppid;
    char state;
    char stat[160]; /* "pid (name) S" from /proc/<pid>/stat, for the message */
};

/* Every process in /proc (*n of them; free the array). NULL if /proc cannot
 * be read. */
static inline struct leftover_proc *leftover_snapshot(int *n)
{
    DIR *d = opendir("/proc");
    if (d == NULL) {
        return NULL;
    }
    int cap = 1024;
    struct leftover_proc *ps = malloc(sizeof(*ps) * (size_t)cap);
    struct dirent *e;
    *n = 0;
    while (ps != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') {
            continue;
        }
        char path[300], buf[1024];
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            continue; /* gone since readdir */
        }
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        /* "pid (comm) S ppid ...": comm may hold spaces and parentheses. */
        char *rp = strrchr(buf, ')');
        int ppid;
        char state;
        if (rp == NULL || sscanf(rp + 2, "%c %d", &state, &ppid) != 2) {
            continue;
        }
        if (*n == cap) {
            cap *= 2;
            struct leftover_proc *more = realloc(ps, sizeof(*ps) * (size_t)cap);
            if (more == NULL) {
                free(ps);
                ps = NULL;
                break;
            }
            ps = more;
        }
        struct leftover_proc *p = &ps[(*n)++];
        p->pid = (pid_t)atoi(e->d_name);
        p->ppid = (pid_t)ppid;
        p->state = state;
        snprintf(p->stat, sizeof(p->stat), "%.*s", (int)(rp + 3 - buf), buf);
    }
    closedir(d);
    return ps;
}

/* Descendants of the test, live or exited and not reaped: prints each
 * ("left behind: <pid> (<name>) <state>, parent <ppid> (running)"), kills
 * the live ones, reaps them all (waiting up to 10 s) and returns their number;
 * -1 if /proc cannot be read. */
static inline int leftover_count(void)
{
    int n = 0;
    struct leftover_proc *ps = leftover_snapshot(&n);
    if (ps == NULL) {
        printf("\nleftover_count: cannot read /proc\n");
        return -1;
    }
    /* mark[i]: ps[i] descends from us. Parents may be listed after their
     * children, so repeat until nothing changes (depth passes). */
    char *mark = calloc((size_t)n + 1, 1);
    pid_t self = getpid();
    int found = 0;
    for (int changed = 1; changed && mark != NULL;) {
        changed = 0;
        for (int i = 0; i < n; i++) {
            if (mark[i]) {
                continue;
            }
            int parent_marked = ps[i].ppid == self;
            for (int j = 0; j < n && !parent_marked; j++) {
                parent_marked = mark[j] && ps[j].pid == ps[i].ppid;
            }
            if (parent_marked) {
                mark[i] = 1;
                changed = 1;
                found++;
                printf("\nleft behind: %s, parent %d (%s)", ps[i].stat, (int)ps[i].ppid,
                       ps[i].state == 'Z' ? "exited, not reaped" : "running");
                if (ps[i].state != 'Z') {
                    kill(ps[i].pid, SIGKILL);
                }
            }
        }
    }
    free(mark);
    free(ps);
    /* Reap: the killed ones are (or become, as their parents die) our
     * children. Until none is left, or 10 s. */
    for (int tries = 0; tries < 1000; tries++) {
        pid_t r = waitpid(-1, NULL, WNOHANG);
        if (r < 0 && errno == ECHILD) {
            break;
        }
        if (r == 0) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return found;
}

#endif
