/* One benchmark run against one OpenAI-compatible server, live: the run
 * driver (driver.h: arrivals, open and closed loop, duration, multi-turn,
 * warm-ups, records) on a private libuv loop, with the HTTP client, SSE
 * parsing and the wall clock. `tandem bench` calls it once; the experiment
 * runner calls it per matrix point. lg_run_config and lg_run_result are in
 * driver.h.
 *
 * Without cfg->model, GET models_path names the model first. Nothing here
 * exits or hangs: every request has a timeout, the run always ends, and
 * SIGINT (while lg_run runs) stops sending, cancels what is in flight and
 * ends the run early with what was measured (a second SIGINT gets the
 * default action). RLIMIT_NOFILE is raised to its hard limit and SIGPIPE is
 * ignored (process-wide; both stay so).
 *
 * Threads: lg_run blocks the calling thread for the whole run. */
#ifndef TANDEM_LG_RUN_H
#define TANDEM_LG_RUN_H

#include "driver.h"
#include "http_client.h"

/* Runs the benchmark. Returns 0 (whatever the requests' outcomes: see the
 * records), or a negative code with a message in err: TANDEM_EINVAL (bad
 * config), TANDEM_EIO (the model list could not be read), TANDEM_ENOMEM,
 * TANDEM_EUV, TANDEM_ECANCELLED (SIGINT before the measured run). out is
 * filled on 0 and must then be freed with lg_run_result_free. */
int lg_run(const struct lg_run_config *cfg, struct lg_run_result *out, char *err, size_t errlen);

#endif
