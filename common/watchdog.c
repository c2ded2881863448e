#include "watchdog.h"
#include "tandem_err.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

struct watch {
    const char *prog;
    unsigned seconds;
};

static struct watch the_watch; /* one stop per process */

static void *watch(void *arg)
{
    const struct watch *w = arg;
    sleep(w->seconds);
    char msg[256];
    int n = snprintf(msg, sizeof(msg),
                     "%s: shutdown still blocked after %u s (an NNG socket close: NNG 1.5 "
                     "deadlock); exiting\n",
                     w->prog, w->seconds);
    if (n > 0) {
        ssize_t rc = write(2, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
        (void)rc;
    }
    _exit(0);
    return NULL;
}

int watchdog_start(const char *prog, unsigned seconds)
{
    the_watch.prog = prog;
    the_watch.seconds = seconds;
    pthread_t t;
    if (pthread_create(&t, NULL, watch, &the_watch) != 0) {
        return TANDEM_ENOMEM;
    }
    pthread_detach(t);
    return 0;
}
