#include "progress.h"

#include <stdio.h>

size_t lg_progress_format(const struct lg_progress *p, char *buf, size_t len)
{
    if (len == 0) {
        return 0;
    }
    char total[32] = "";
    if (p->total >= 0) {
        snprintf(total, sizeof(total), "/%lld", (long long)p->total);
    }
    char elapsed[48];
    if (p->duration_s > 0) {
        snprintf(elapsed, sizeof(elapsed), "%.1f/%.0f s", p->elapsed_s, p->duration_s);
    } else {
        snprintf(elapsed, sizeof(elapsed), "%.1f s", p->elapsed_s);
    }
    double rate = p->elapsed_s > 0 ? (double)p->done / p->elapsed_s : 0;
    int n = snprintf(
        buf, len, "[bench] %s: %lld%s done (%lld failed), %lld in flight, %s, %.1f req/s", p->phase,
        (long long)p->done, total, (long long)p->failed, (long long)p->in_flight, elapsed, rate);
    if (n < 0) {
        buf[0] = '\0';
        return 0;
    }
    return (size_t)n < len ? (size_t)n : len - 1;
}
