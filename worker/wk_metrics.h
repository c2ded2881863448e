/* The worker's Prometheus metrics (tandem_worker): vLLM's names where one
 * exists, tandem: for the rest. docs/architecture.md ("## Workers") lists
 * them. Gauges and the counters mirrored from scheduler and pool statistics
 * are refreshed at every scrape; the rest are updated by the runtime and the
 * roles through w->m. */
#ifndef TANDEM_WK_METRICS_H
#define TANDEM_WK_METRICS_H

#include "worker.h"

/* Creates w->reg and registers every family in w->m. Needs the engine
 * (model name, pool). Returns 0 or a metrics error; on failure the caller
 * destroys w->reg. */
int wk_metrics_init(struct worker *w);

#endif
