#include "watchdog.h"
#include "tandem_err.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct watch {
    const char *prog;
    unsigned seconds;
};

static struct watch the_watch; /* one stop per process */

static void fire(const struct watch *w)
{
    char msg[320];
    int n = snprintf(msg, sizeof(msg),
                     "%s: stop watchdog: shutdown still blocked after %u s (a hung NNG socket "
                     "close, docs/nng-close-deadlock.md, or a stop that never ended); exiting "
                     "with status %d. Report it with this process's log.\n",
                     w->prog, w->seconds, WATCHDOG_EXIT);
    if (n > 0) {
        ssize_t rc = write(2, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
        (void)rc;
    }
    _exit(WATCHDOG_EXIT);
}

static void *watch(void *arg)
{
    const struct watch *w = arg;
    sleep(w->seconds);
    fire(w);
    return NULL;
}

int watchdog_start(const char *prog, unsigned seconds)
{
    const char *env = getenv(WATCHDOG_ENV);
    if (env != NULL && env[0] != '\0') {
        char *end;
        unsigned long v = strtoul(env, &end, 10);
        if (*end == '\0' && v <= 86400) {
            seconds = (unsigned)v;
        } else {
            fprintf(stderr, "%s: %s=%s is not a whole number of seconds (0..86400): using %u s\n",
                    prog, WATCHDOG_ENV, env, seconds);
        }
    }
    the_watch.prog = prog;
    the_watch.seconds = seconds;
    if (seconds == 0) {
        fire(&the_watch);
    }
    pthread_t t;
    if (pthread_create(&t, NULL, watch, &the_watch) != 0) {
        return TANDEM_ENOMEM;
    }
    pthread_detach(t);
    return 0;
}
