/* The progress line on stderr: "done, in flight, elapsed, rate", rewritten in
 * place (carriage return) at most a few times per second by the run. */
#ifndef TANDEM_LG_PROGRESS_H
#define TANDEM_LG_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

struct lg_progress {
    const char *phase; /* "warm-up" or "run" */
    int64_t done;      /* finished requests (ok or failed) */
    int64_t failed;
    int64_t total; /* -1 when unknown (--duration) */
    int64_t in_flight;
    double elapsed_s;
    double duration_s; /* > 0 for --duration runs */
};

/* Formats one line without a newline, e.g.
 * "[bench] run: 120/1000 done (2 failed), 64 in flight, 12.3 s, 9.8 req/s".
 * Returns the length written (truncated to len - 1). */
size_t lg_progress_format(const struct lg_progress *p, char *buf, size_t len);

#endif
