/* The load generator's logic without I/O or clock: one benchmark run
 * (warm-ups, then the measured requests) driven by a host that owns time and
 * the transport. The live host is lg_run (run.c: libuv timers, the HTTP
 * client, SSE parsing); `tandem simulate` is another, in modelled time. Both
 * get the same arrivals, load control, records and result.
 *
 * Load:
 * - Open loop: arrival times from arrivals.h (Poisson or gamma at
 *   request_rate with burstiness; infinite rate: all at time 0), or a
 *   trace's own timestamps.
 * - Closed loop: max_concurrency caps requests in flight (as vLLM's
 *   semaphore); a request whose arrival time has come waits for a free slot,
 *   and the wait is its client queue time (start - arrival). With an
 *   infinite rate this is the classic closed loop: a new request the moment
 *   one finishes.
 * - A count (num_prompts) or a duration: with duration_s > 0 no request is
 *   sent once it has elapsed (those in flight finish; still-queued ones are
 *   counted as not sent), and num_prompts (when >= 0) is an extra cap.
 * - Multi-turn: the arrival process starts sessions; turn t+1 is due
 *   think_time_s after turn t finished.
 * - Warm-ups: num_warmups requests with warm-up contents, all at once (capped
 *   by max_concurrency), before the measured run; never recorded.
 *
 * Time: the host's clock, ops->now(), in seconds (wall seconds live,
 * modelled seconds in the simulator). The measured run starts at the now()
 * of its first pump; record times (arrival, start) count from there, and
 * TTFT, ITL and E2E are differences of now() values taken when the host
 * reports a response's status, events and end. The driver reads no clock.
 *
 * Order of calls the host keeps: lg_driver_create, lg_driver_start (once the
 * model name is known), then any number of lg_driver_wake (when a wake_at
 * time has come), lg_driver_status / lg_driver_event / lg_driver_body /
 * lg_driver_done (per request it was asked to send) and lg_driver_interrupt,
 * until ops->ended; then lg_driver_finish (optional) and lg_driver_destroy.
 * Per request: send returned 0 -> at most one lg_driver_status -> its
 * events or body -> exactly one lg_driver_done. A host that never calls
 * lg_driver_start may destroy the driver at any time.
 *
 * Threads: one, the host's; nothing here blocks or sleeps. The driver calls
 * ops from inside the host's calls into it (start, wake, done, interrupt).
 * Re-entry: the host may call lg_driver_done for q from inside
 * ops->cancel(q); it must not call into the driver from inside any other op
 * (a failed send is told by its return value). */
#ifndef TANDEM_LG_DRIVER_H
#define TANDEM_LG_DRIVER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "http_stats.h"
#include "summary.h"
#include "workload.h"

/* A run's settings. The driver reads the load and request fields; the
 * target and progress fields are the live host's. */
struct lg_run_config {
    /* target (live host) */
    const char *host;
    int port;
    const char *path;        /* request path, e.g. "/v1/completions" */
    const char *models_path; /* "/v1/models" (after any base URL prefix) */
    const char *model;       /* NULL or "": the first model of GET models_path */
    const char *api_key;     /* NULL: no Authorization header */
    /* request body */
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
    /* progress line (live host) */
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
    int64_t trace_count;              /* requests in the trace, -1 otherwise */
    struct lg_http_client_stats http; /* the live host's; zero from lg_driver_finish */
};

/* Frees the records and zeroes n; r itself is the caller's. */
void lg_run_result_free(struct lg_run_result *r);

struct lg_driver; /* one run */
struct lg_req;    /* one request in flight; driver-owned, valid from ops->send to lg_driver_done */

#define LG_DRIVER_MSG 256 /* bytes of a failure message, with its NUL */

struct lg_driver_ops {
    /* Seconds on the host's clock; never decreases. */
    double (*now)(void *arg);
    /* Call lg_driver_wake once now() >= t (a due arrival, a think time, the
     * end of duration_s). Replaces any earlier wake; t INFINITY: none. */
    void (*wake_at)(void *arg, double t);
    /* Sends one request: POST path with the JSON body (len bytes, valid
     * during the call only; streamed or not as the body says), failing it
     * after timeout_s. 0: sent; the host later calls lg_driver_status, the
     * events or body, and exactly one lg_driver_done for q. A negative code:
     * not sent, nothing more comes for q; the driver records it as
     * LG_FAIL_CANCELLED (TANDEM_ECANCELLED) or LG_FAIL_CONNECT, with the
     * message of send_error. */
    int (*send)(void *arg, struct lg_req *q, const char *path, const char *body, size_t len,
                double timeout_s);
    /* Optional (NULL: tandem_strerror of the code): why the last send failed. */
    const char *(*send_error)(void *arg);
    /* Stops q (SIGINT, or a fatal error of the run). The host still calls
     * lg_driver_done for q, from inside cancel or later, normally with
     * LG_FAIL_CANCELLED. */
    void (*cancel)(void *arg, struct lg_req *q);
    /* The run is over and no request is in flight: no op is called after
     * this one. Called from inside one of the host's calls into the driver. */
    void (*ended)(void *arg);
};

/* Validates cfg (borrowed: it and what it points to must outlive d),
 * loads the workload and precomputes the arrivals. ops is borrowed too; arg
 * is passed to every op. Returns 0 with *out set, or TANDEM_EINVAL (bad
 * config, message in err, e.g. "--request-rate and --burstiness must be >
 * 0"), TANDEM_ENOMEM, or the workload's error (message in err). */
int lg_driver_create(struct lg_driver **out, const struct lg_run_config *cfg,
                     const struct lg_driver_ops *ops, void *arg, char *err, size_t errlen);

/* Starts the warm-ups, then (when they are done) the measured run, naming
 * model (copied; at most 255 bytes) in every request. Call once. */
void lg_driver_start(struct lg_driver *d, const char *model);

/* A wake_at time has come (an early or stale wake is harmless): sends what
 * is due, stops sending at the end of the duration, asks for the next wake. */
void lg_driver_wake(struct lg_driver *d);

/* Own data of the host per request (e.g. its transport state); NULL until
 * set. The driver never reads it. */
void lg_driver_set_host(struct lg_req *q, void *host);
void *lg_driver_host(const struct lg_req *q);

/* q's response status and content type ("" when absent) are in. Returns 1
 * when the host must deliver the body as SSE events (lg_driver_event: a 200
 * text/event-stream), 0 as raw bytes (lg_driver_body: JSON or an error
 * body). */
int lg_driver_status(struct lg_req *q, int status, const char *content_type);

/* One SSE event of q's stream (name "message" when the stream gave none;
 * data as sse.h delivers it, "[DONE]" included). Its time is now(). Returns
 * 0, or a negative code: q has failed (the driver recorded why: an error
 * event or chunk, a malformed chunk, no memory) and the host must end it
 * with lg_driver_done(q, code, ...). */
int lg_driver_event(struct lg_req *q, const char *name, const char *data, size_t len);

/* One "message" event of q's stream given as the fields lg_driver_event
 * would parse out of its data (a host that has them without JSON: the
 * offline simulator). Same time and return convention. */
struct lg_chunk; /* openai.h */
int lg_driver_chunk(struct lg_req *q, const struct lg_chunk *c);
/* Starts fetching what the next lg_driver_chunk of q will write (a host
 * delivering many chunks at once overlaps their cache misses). Changes
 * nothing. */
void lg_driver_prefetch(const struct lg_req *q);

/* Bytes of q's non-SSE body (ignored after lg_driver_status returned 1).
 * Same return convention as lg_driver_event. */
int lg_driver_body(struct lg_req *q, const char *data, size_t len);

/* q's end: err 0 (the response is complete) or a negative code with a reason
 * and a message (NULL: tandem_strerror(err)). A failure the driver already
 * recorded for q stands unless reason is LG_FAIL_TIMEOUT or
 * LG_FAIL_CANCELLED. Records q, frees it (the pointer is then invalid),
 * schedules a multi-turn follow-up, sends what may now go, and may call
 * ops->ended. */
void lg_driver_done(struct lg_req *q, int err, enum lg_fail reason, const char *msg);

/* SIGINT: marks the run interrupted. In the measured run: stops sending
 * (queued requests count as not sent), cancels every request in flight and
 * ends the run with what was measured. During the warm-ups: fails the run
 * (lg_driver_finish returns TANDEM_ECANCELLED, "interrupted"). */
void lg_driver_interrupt(struct lg_driver *d);

/* What the live progress line shows. */
enum lg_driver_phase { LG_DRIVER_IDLE, LG_DRIVER_WARMUP, LG_DRIVER_RUN };

struct lg_driver_stats {
    enum lg_driver_phase phase; /* the phase running, or the last one run */
    int64_t done;               /* requests of that phase finished, ok or failed */
    int64_t failed;             /* of which failed */
    int64_t total;              /* the phase's count; -1 when unknown (duration) */
    int64_t in_flight;
    double t_start; /* now() when the measured run started (LG_DRIVER_RUN) */
};
void lg_driver_stats(const struct lg_driver *d, struct lg_driver_stats *out);

/* After ops->ended: returns 0 and moves the records (sorted by index), the
 * counts, the model and the duration into out (zeroed first; out->http is
 * left zero, out->trace_count is -1 unless the dataset is a trace); free
 * with lg_run_result_free. Or returns the run's fatal error (message in
 * err, out zeroed): TANDEM_ENOMEM, TANDEM_ECANCELLED (interrupted during the
 * warm-ups). */
int lg_driver_finish(struct lg_driver *d, struct lg_run_result *out, char *err, size_t errlen);

/* Frees d and whatever it still holds; NULL is fine. Requests still in
 * flight become invalid: the host must not report on them any more. */
void lg_driver_destroy(struct lg_driver *d);

#endif
