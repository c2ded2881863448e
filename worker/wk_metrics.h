/* The worker's Prometheus metrics (tandem_wk_core): vLLM's names where one
 * exists, tandem: for the rest. docs/architecture.md ("## Workers") lists
 * them. Gauges and the counters mirrored from scheduler and pool statistics
 * are refreshed at every scrape; the rest are updated by the core, the host
 * and the roles through c->m. */
#ifndef TANDEM_WK_METRICS_H
#define TANDEM_WK_METRICS_H

#include "wk_core.h"

/* Creates c->reg and registers every family in c->m. Needs the engine
 * (model name, pool). Returns 0 or a metrics.h error (TANDEM_ENOMEM,
 * TANDEM_EINVAL, TANDEM_EEXIST, TANDEM_ETOOBIG); on failure the caller destroys w->reg.
 *
 * The gauges and counters only the host knows (tandem:peer_sockets,
 * tandem:http_errors_total) are registered here, so the exposition order
 * stays one table, and set by the host from a collect hook of its own
 * (metrics_on_collect), which runs after this one.
 *
 * Ownership: c->reg and the families it holds belong to the core, which
 * destroys them (metrics_registry_destroy) in wk_core_fini; the pointers in
 * c->m borrow from c->reg.
 * Threads: called once from wk_core_init; every update and every scrape
 * afterwards happens on the core's thread too, so nothing here locks. */
int wk_metrics_init(struct wk_core *c);

#endif
