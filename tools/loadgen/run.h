/* One benchmark run: warm-ups, then the measured requests, on a private libuv
 * loop, against one OpenAI-compatible server. `tandem bench` calls it once;
 * the experiment runner (later) calls it per matrix point.
 *
 * Load:
 * - Open loop: arrival times from arrivals.h (Poisson or gamma at
 *   --request-rate with --burstiness; infinite rate: all at time 0), or a
 *   trace's own timestamps.
 * - Closed loop: --max-concurrency caps requests in flight (as vLLM's
 *   semaphore); a request whose arrival time has come waits for a free slot,
 *   and the wait is its client queue time (start - arrival). With an
 *   infinite rate this is the classic closed loop: a new request the moment
 *   one finishes.
 * - A count (num_prompts) or a duration: with duration_s > 0 no request is
 *   sent once it has elapsed (those in flight finish; still-queued ones are
 *   counted as not sent), and num_prompts (when >= 0) is an extra cap.
 * - Multi-turn: the arrival process starts sessions; turn t+1 is sent
 *   think_time_s after turn t finished.
 * - Warm-ups: num_warmups requests with warm-up contents, all at once (capped
 *   by max_concurrency), before the measured run; never recorded.
 *
 * Nothing here exits or hangs: every request has a timeout, the run always
 * ends, and SIGINT (while lg_run runs) stops sending, cancels what is in
 * flight and ends the run early with what was measured (a second SIGINT
 * gets the default action). RLIMIT_NOFILE is raised to its hard limit and
 * SIGPIPE is ignored (process-wide; both stay so).
 *
 * Threads: lg_run blocks the calling thread for the whole run. */
#ifndef TANDEM_LG_RUN_H
#define TANDEM_LG_RUN_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "http_client.h"
#include "summary.h"
#include "workload.h"

struct lg_run_config {
    /* target */
    const char *host;
    int port;
    const char *path;        /* request path, e.g. "/v1/completions" */
    const char *models_path; /* "/v1/models" (after any base URL prefix) */
    const char *model;       /* NULL or "": the first model of GET models_path */
    const char *api_key;     /* NULL: no Authorization header */
    int ignore_eos;
    double temperature;       /* NaN: not sent */
    const json_t *extra_body; /* borrowed; NULL: none */
    /* load */
    int64_t num_prompts; /* measured requests; -1: unbounded (needs duration_s) */
    double duration_s;   /* > 0: stop sending after this many seconds */
    double request_rate; /* requests (multi-turn: sessions) per second; INFINITY ok */
    double burstiness;
    int normalize_arrivals; /* rescale so the last arrival is at count / rate (vLLM) */
    int max_concurrency;    /* 0: unlimited */
    int num_warmups;
    double request_timeout_s;           /* > 0 */
    double think_time_s;                /* multi-turn */
    int trace_timestamps;               /* trace: use the trace's arrival times when it has them */
    struct lg_workload_config workload; /* api and seed live here */
    /* progress line */
    int progress;            /* 1: print it */
    FILE *progress_out;      /* NULL: stderr */
    double progress_after_s; /* first shown after this long */
};

/* Defaults: 127.0.0.1:8000 /v1/completions, 1000 prompts, infinite rate,
 * burstiness 1, normalized arrivals, ignore_eos, 600 s request timeout,
 * the workload defaults, progress after 2 s (but progress off). */
void lg_run_config_default(struct lg_run_config *cfg);

struct lg_run_result {
    struct lg_record *records; /* (n) measured requests, by index; owned */
    size_t n;
    double duration_s; /* start of the measured run to its last response */
    char model[256];   /* the model the requests named */
    int64_t warmups_ok, warmups_failed;
    int64_t not_sent; /* scheduled but dropped at the end of --duration or by SIGINT */
    int interrupted;
    int64_t trace_count; /* requests in the trace, -1 otherwise */
    struct lg_http_client_stats http;
};

/* Runs the benchmark. Returns 0 (whatever the requests' outcomes: see the
 * records), or a negative code with a message in err: TANDEM_EINVAL (bad
 * config), TANDEM_EIO (the model list could not be read), TANDEM_ENOMEM,
 * TANDEM_EUV. out is filled on 0 and must then be freed with
 * lg_run_result_free. */
int lg_run(const struct lg_run_config *cfg, struct lg_run_result *out, char *err, size_t errlen);

void lg_run_result_free(struct lg_run_result *r);

#endif
