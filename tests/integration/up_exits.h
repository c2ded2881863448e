/* How the processes `tandem up` started ended, read from tandem up's stderr,
 * for the tests that run it (test_up, test_bench_live). tandem up's exit code
 * says nothing about them (0 after a stop by signal), but it logs every exit
 * of every process it started (docs/up.md, "Supervision" and "Stopping"):
 *   "<name> (pid N) exited: <status>; restarting in ..."   while running,
 *   "<name> exited: <status>"                              while stopping,
 *   "tandem up: <name> exited before the cluster was up: <status>",
 *   "<name> (pid N) exited during start-up: <status>; restarting in ...",
 *   "tandem up: <name> (pid N) exited: <status>; it failed to start ...",
 * with <status> from sv_describe_status ("exit code 0", "killed by signal 9
 * (SIGKILL)"). Under ASan a leak report makes a process's exit code 23, so
 * "exit code 0" also says it ended without one.
 *
 * Header-only (static functions), shared by the two tests. Threads: the test's
 * main thread. */
#ifndef TANDEM_UP_EXITS_H
#define TANDEM_UP_EXITS_H

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Under TSan, libuv can lose a signal (docs/reliability.md, "h_stop repeats
 * it"); tandem up sends its SIGTERM once, so a process may then be killed at
 * the stop deadline instead of exiting 0. Only there is that accepted. */
#if defined(__SANITIZE_THREAD__)
#define UP_EXITS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UP_EXITS_TSAN 1
#endif
#endif
#ifndef UP_EXITS_TSAN
#define UP_EXITS_TSAN 0
#endif

/* Whether line has one of the '|'-separated alternatives of want. */
static inline int up_exits_match(const char *line, const char *want)
{
    char alt[512];
    for (const char *w = want; w != NULL;) {
        const char *bar = strchr(w, '|');
        size_t len = bar ? (size_t)(bar - w) : strlen(w);
        snprintf(alt, sizeof(alt), "%.*s", (int)len, w);
        if (strstr(line, alt) != NULL) {
            return 1;
        }
        /* TSan: "<name> exited: exit code 0" may be a SIGKILL at the deadline. */
        static const char clean[] = " exited: exit code 0";
        size_t cl = sizeof(clean) - 1;
        if (UP_EXITS_TSAN && len > cl && strcmp(alt + len - cl, clean) == 0) {
            snprintf(alt + len - cl, sizeof(alt) - (len - cl),
                     " exited: killed by signal 9 (SIGKILL)");
            if (strstr(line, alt) != NULL) {
                printf("\n(TSan: accepted a lost SIGTERM: %s)", line);
                return 1;
            }
        }
        w = bar ? bar + 1 : NULL;
    }
    return 0;
}

/* Checks the file at log (tandem up's stderr, after it exited): every entry
 * of want (NULL-terminated; each a substring of one exit line, or several
 * alternatives separated by '|') matches exactly one exit line, and there is
 * no other exit line (no process exited that the test did not expect to).
 * Prints what differs and the log; returns the number of problems (0: as
 * expected) after a CUnit assertion on it. */
static inline int expect_up_exits(const char *log, const char *const *want)
{
    FILE *f = fopen(log, "r");
    char line[4096];
    int n_want = 0;
    while (want[n_want] != NULL) {
        n_want++;
    }
    int *seen = calloc((size_t)n_want + 1, sizeof(int));
    int exits = 0, unexpected = 0;
    while (f != NULL && seen != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, " exited: ") == NULL &&
            strstr(line, " exited before the cluster") == NULL &&
            strstr(line, " exited during start-up: ") == NULL) {
            continue;
        }
        exits++;
        int hit = 0;
        for (int i = 0; i < n_want; i++) {
            if (up_exits_match(line, want[i])) {
                seen[i]++;
                hit = 1;
            }
        }
        if (!hit) {
            printf("\n%s: unexpected exit: %s", log, line);
            unexpected++;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    int problems = unexpected + (f == NULL) + (seen == NULL);
    for (int i = 0; seen != NULL && i < n_want; i++) {
        if (seen[i] != 1) {
            printf("\n%s: '%s' on %d exit lines, want 1", log, want[i], seen[i]);
            problems++;
        }
    }
    free(seen);
    if (problems > 0) {
        printf("\n%s: %d exit lines, want %d; the log:\n", log, exits, n_want);
        f = fopen(log, "r");
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            fputs(line, stdout);
        }
        if (f != NULL) {
            fclose(f);
        }
    }
    CU_ASSERT_EQUAL(problems, 0);
    return problems;
}

#endif
