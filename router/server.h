/* The router's HTTP routes (docs/api.md, docs/architecture.md "## Router"):
 *
 *   POST /v1/completions, POST /v1/chat/completions   -> dispatch.h
 *   GET  /v1/models     the served model
 *   GET  /health        200 {"status":"ok",...} whenever the loop runs
 *   GET  /metrics       Prometheus text (rt_metrics.h)
 *   GET  /v1/cluster    endpoints: id, role, health, addresses, load, KV
 *                       usage, in-flight; links not yet registered; decision
 *                       statistics
 *   GET  /v1/decisions  the last decision records, newest first, each with
 *                       the cached tokens the worker then reported;
 *                       ?limit=N keeps N, &candidates=K the K best-scored
 *                       candidates per profile run
 *   GET  /dashboard     the live page (rt_dashboard.h), open like /health
 *
 * Anything else is 404 (405 for a known path with another method), in
 * OpenAI's error shape. Threading: the router's loop thread. */
#ifndef TANDEM_RT_SERVER_H
#define TANDEM_RT_SERVER_H

#include "http.h"

/* The http_handler_fn of the router; user is the struct router. */
void rt_server_handle(struct http_req *req, void *user);

/* GET /v1/cluster and GET /v1/decisions bodies as new strings (free()), or
 * NULL when out of memory. r is a struct router. */
struct router;
char *rt_server_cluster_json(struct router *r);
/* limit: records, newest first (< 0: every one kept); candidates > 0: keep
 * that many best-scored candidates per profile run (0: all). */
char *rt_server_decisions_json(struct router *r, int limit, int candidates);

#endif
