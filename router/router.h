/* tandem-router as a library: everything the process owns, opened and closed
 * as one (router/main.c parses the flags and runs the loop). The pieces:
 * the scheduling pipeline (pipeline.h), the registry of workers
 * (registry.h), the request lifecycle (dispatch.h), the HTTP routes
 * (server.h) and the metrics (rt_metrics.h). docs/architecture.md
 * ("## Router") describes the design.
 *
 * Threading: one libuv loop thread owns all of it. */
#ifndef TANDEM_ROUTER_H
#define TANDEM_ROUTER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "auth.h"
#include "dispatch.h"
#include "http.h"
#include "openai.h"
#include "pipeline.h"
#include "registry.h"
#include "rt_apikey.h"
#include "rt_core.h"
#include "rt_metrics.h"
#include "tokenizer.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

struct router {
    uv_loop_t *loop;
    struct rt_opts opts;
    struct rt_core core; /* pipeline, tokenizer, metrics, decision log, dispatcher */
    struct rt_registry reg;
    struct auth_key secret;   /* the cluster secret (secret.set = 0: none) */
    struct rt_apikey apikey;  /* /v1 needs it (apikey.set = 0: no key) */
    uv_timer_t dispatch_tick; /* rt_dispatch_tick every RT_DISPATCH_TICK_MS */
    uv_idle_t dispatch_kick;  /* rt_dispatch_run_pending outside message callbacks */
    struct http_server http;
    int http_port;
    uv_timer_t stop_timer; /* the stop's drain, then flush deadline (rt_close) */
    unsigned have;
    int closing, core_stopped, open_parts;
    void (*close_cb)(struct router *r);
};

/* Builds everything from o (strings must outlive r) and binds the HTTP and
 * announce listeners and dials --workers. Returns 0, or an error code with
 * a message naming the flag in err: TANDEM_ECONFIG / TANDEM_EINVAL (bad
 * routing file, tokenizer, URL or value: exit 2), TANDEM_EBUSY (address in
 * use) and others (exit 1). On failure call rt_close anyway (it closes
 * what was opened). */
int rt_open(struct router *r, uv_loop_t *loop, const struct rt_opts *o, char *err, size_t errlen);

/* Context limit used for requests now: --max-context, else the smallest one
 * the healthy decode workers announced, else the model preset's, else
 * RT_DEFAULT_MAX_CONTEXT. */
int rt_max_context(const struct router *r);

/* Handles POST /v1/completions (OA_KIND_COMPLETION) or /v1/chat/completions
 * (OA_KIND_CHAT) with the dispatcher: answers errors at once, or takes a
 * reference on req and answers when the generation ends. HTTP handler. */
void rt_handle_generate(struct router *r, struct http_req *req, enum oa_kind kind);

/* After --shutdown-drain-ms, requests still live end (503 or the stream's
 * end) and connections get this long to take their last bytes before they
 * are cut. */
#define RT_STOP_FLUSH_MS 1000

/* Stops: the HTTP listener closes, requests in flight run on for
 * --shutdown-drain-ms (each connection closes, EOF, once its last response
 * is sent), then what is left ends and, RT_STOP_FLUSH_MS later, is cut; the
 * NNG sockets close last. cb(r) runs once every handle is closed. Safe on a
 * partly opened router. */
void rt_close(struct router *r, void (*cb)(struct router *r));

#endif
