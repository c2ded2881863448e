/* The worker's Prometheus metrics (tandem_worker): vLLM's names where one
 * exists, tandem: for the rest. docs/architecture.md ("## Workers") lists
 * them. Gauges and the counters mirrored from scheduler and pool statistics
 * are refreshed at every scrape; the rest are updated by the runtime and the
 * roles through w->m. */
#ifndef TANDEM_WK_METRICS_H
#define TANDEM_WK_METRICS_H

#include "worker.h"

/* Creates w->reg and registers every family in w->m. Needs the engine
 * (model name, pool). Returns 0 or a metrics.h error (TANDEM_ENOMEM,
 * TANDEM_EINVAL, TANDEM_EEXIST, TANDEM_ETOOBIG); on failure the caller destroys w->reg.
 *
 * Ownership: w->reg and the families it holds belong to the worker, which
 * destroys them (metrics_registry_destroy) after its loop has stopped; the
 * pointers in w->m borrow from w->reg.
 * Threads: called once on the worker's loop thread before the loop runs;
 * every update and every scrape afterwards happens on that thread too, so
 * nothing here locks. */
int wk_metrics_init(struct worker *w);

#endif
