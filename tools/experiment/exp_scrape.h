/* What the live runner reads from a running cluster's workers: the sum over
 * every worker of its step timing (tandem:step_modelled_seconds_sum and
 * tandem:step_overrun_seconds_sum, worker/wk_metrics.c), from the router's
 * GET /v1/cluster (each endpoint's metrics_address) and each worker's GET
 * /metrics. Blocking HTTP/1.1 over loopback or any TCP host, one connection
 * per request, a timeout per request; the caller's thread only. */
#ifndef TANDEM_EXP_SCRAPE_H
#define TANDEM_EXP_SCRAPE_H

#include <stddef.h>

/* Totals over the workers at one moment (counters: subtract two). */
struct exp_steps {
    double modelled_s; /* sum of tandem:step_modelled_seconds_sum */
    double overrun_s;  /* sum of tandem:step_overrun_seconds_sum */
    int workers;       /* workers read */
};

/* Reads every worker of the cluster whose router answers HTTP on host:port.
 * Returns 0, or TANDEM_EIO / TANDEM_EPROTO with a message in err (a worker
 * that does not answer, or exports neither series, fails the whole read). */
int exp_scrape_steps(const char *host, int port, struct exp_steps *out, char *err, size_t errlen);

/* GET path from host:port (with "Authorization: Bearer <bearer>" unless
 * bearer is NULL), one connection, SCRAPE_TIMEOUT_S per read; the body
 * (malloc'd, NUL-terminated) into *body when the status is 200. 0 or
 * TANDEM_EIO (message in err, naming the URL). */
int exp_http_get(const char *host, int port, const char *path, const char *bearer, char **body,
                 char *err, size_t errlen);

/* The value of the sample named exactly series (name and labels) in a
 * Prometheus text body, or NAN when there is none. Pure. */
double exp_prom_value(const char *body, const char *series);

/* The overrun share of a cell from totals taken before and after it:
 * (overrun after - before) / (modelled after - before); NAN when no timed
 * step ended in between (tiny workers, time_scale 0) or a counter went back
 * (a worker restarted). Pure. */
double exp_steps_overrun(const struct exp_steps *before, const struct exp_steps *after);

#endif
