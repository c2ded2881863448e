/* The router's HTTP routes: see server.h. */
#include "server.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "router.h"
#include "rt_dashboard.h"
#include "tandem_err.h"

static const char *const json_headers[] = {"Content-Type", "application/json", NULL};

static void respond_json(struct http_req *req, int status, char *json)
{
    if (json == NULL) {
        struct oa_error e;
        oa_error_internal(&e, "out of memory");
        json = oa_error_json(&e);
        status = 500;
    }
    http_req_respond(req, status, json_headers, json, json ? strlen(json) : 0);
    free(json);
}

static void respond_error(struct router *r, struct http_req *req, int status, const char *code,
                          const char *fmt, const char *arg, const char *allow)
{
    struct oa_error e;
    oa_error_set(&e, status, "invalid_request_error", NULL, code, fmt, arg);
    char *json = oa_error_json(&e);
    const char *h[] = {"Content-Type", "application/json", allow ? "Allow" : NULL, allow, NULL};
    http_req_respond(req, status, h, json, json ? strlen(json) : 0);
    free(json);
    rt_metrics_request(&r->core.m, status);
}

/* 401 in the OpenAI shape (its code "invalid_api_key"), with the RFC 6750
 * challenge. Logged without the token. */
static void respond_unauthorized(struct router *r, struct http_req *req, enum rt_apikey_verdict v)
{
    static const char *const why[] = {
        [RT_APIKEY_MISSING] = "You didn't provide an API key. Send it in an Authorization header "
                              "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        [RT_APIKEY_SCHEME] = "The Authorization header must use the Bearer scheme "
                             "(i.e. Authorization: Bearer YOUR_KEY).",
        [RT_APIKEY_WRONG] = "Incorrect API key provided.",
    };
    struct oa_error e;
    oa_error_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "%s", why[v]);
    char *json = oa_error_json(&e);
    const char *h[] = {"Content-Type", "application/json", "WWW-Authenticate", "Bearer", NULL};
    http_req_respond(req, 401, h, json, json ? strlen(json) : 0);
    free(json);
    rt_metrics_request(&r->core.m, 401);
    LOG_DEBUG("router", "401 %s %s: %s", http_req_method(req), http_req_path(req),
              v == RT_APIKEY_MISSING  ? "no Authorization header"
              : v == RT_APIKEY_SCHEME ? "not a Bearer token"
                                      : "wrong key");
}

/* ---- /v1/cluster -------------------------------------------------------- */

static json_t *refusal_json(const struct rt_refusal *f, uint64_t now)
{
    json_t *o = json_object();
    json_object_set_new(o, "worker_id", f->worker_id[0] ? json_string(f->worker_id) : json_null());
    json_object_set_new(o, "control_address",
                        f->control_addr[0] ? json_string(f->control_addr) : json_null());
    json_object_set_new(o, "reason", json_string(f->why));
    json_object_set_new(o, "count", json_integer((json_int_t)f->count));
    json_object_set_new(o, "ms_ago", json_integer((json_int_t)(now - f->last_ms)));
    return o;
}

/* Every worker the registry refused, with its reason (docs/api.md). */
static json_t *refusals_json(const struct rt_registry *reg, uint64_t now)
{
    json_t *a = json_array();
    for (const struct rt_link *l = reg->links; l; l = l->next) {
        if (l->refusal.why[0] != '\0') {
            json_array_append_new(a, refusal_json(&l->refusal, now));
        }
    }
    for (int i = 0; i < RT_REFUSED_ANNOUNCES; i++) {
        if (reg->refused_announces[i].why[0] != '\0') {
            json_array_append_new(a, refusal_json(&reg->refused_announces[i], now));
        }
    }
    return a;
}

static json_t *endpoint_json(struct router *r, int ep, const struct rt_endpoint *e)
{
    const struct rt_link *l = rt_registry_link(&r->reg, ep);
    uint64_t now = uv_now(r->loop);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(e->id));
    json_object_set_new(o, "role", json_string(rt_role_name(e->role)));
    json_object_set_new(o, "healthy", json_boolean(e->healthy));
    json_object_set_new(o, "link", json_string(l && l->pipes > 0 ? "up" : "down"));
    /* uvsp: the router's loop reads the link itself (ipc://, tcp://IP); nng: an
     * NNG socket (tls+tcp://, host names, inproc://). */
    json_object_set_new(o, "link_transport",
                        l != NULL ? json_string(l->native ? "uvsp" : "nng") : json_null());
    json_object_set_new(o, "control_address", json_string(e->control_addr));
    json_object_set_new(o, "kv_address", e->data_addr[0] ? json_string(e->data_addr) : json_null());
    json_object_set_new(o, "metrics_address",
                        l && l->metrics_addr[0] ? json_string(l->metrics_addr) : json_null());
    json_object_set_new(o, "incarnation", json_integer(l ? (json_int_t)l->incarnation : 0));
    json_object_set_new(o, "last_heartbeat_ms_ago",
                        l ? json_integer((json_int_t)(now - l->last_hb_ms)) : json_null());
    json_object_set_new(o, "block_size", json_integer(e->block_size));
    json_object_set_new(o, "max_running", json_integer(e->max_running));
    json_object_set_new(o, "max_context", json_integer(e->max_context));
    json_t *load = json_object();
    json_object_set_new(load, "waiting", json_integer(e->load.waiting));
    json_object_set_new(load, "running", json_integer(e->load.running));
    json_object_set_new(load, "prefill_tokens_queued",
                        json_integer((json_int_t)e->load.prefill_tokens_queued));
    json_object_set_new(o, "load", load);
    json_t *kv = json_object();
    json_object_set_new(kv, "blocks_used", json_integer(e->load.kv_blocks_used));
    json_object_set_new(kv, "blocks_total", json_integer(e->load.kv_blocks_total));
    json_object_set_new(kv, "blocks_cached_idle", json_integer(e->load.kv_blocks_cached_idle));
    json_object_set_new(kv, "usage", json_real(rt_endpoint_kv_usage(e)));
    json_object_set_new(o, "kv", kv);
    json_t *in = json_object();
    json_object_set_new(in, "requests", json_integer(e->inflight_requests));
    json_object_set_new(in, "tokens", json_integer((json_int_t)e->inflight_tokens));
    json_object_set_new(in, "prefill_tokens", json_integer((json_int_t)e->inflight_prefill_tokens));
    json_object_set_new(o, "inflight", in);
    json_object_set_new(o, "picks", json_integer((json_int_t)e->picks));
    json_t *pc = json_object();
    json_object_set_new(pc, "queries", json_integer((json_int_t)e->load.prefix_cache_queries));
    json_object_set_new(pc, "hits", json_integer((json_int_t)e->load.prefix_cache_hits));
    json_object_set_new(
        pc, "hit_rate",
        e->load.prefix_cache_queries > 0
            ? json_real((double)e->load.prefix_cache_hits / (double)e->load.prefix_cache_queries)
            : json_null());
    json_object_set_new(o, "prefix_cache", pc);
    json_t *xf = json_object();
    json_object_set_new(xf, "bytes_sent", json_integer((json_int_t)e->load.kv_bytes_sent));
    json_object_set_new(xf, "bytes_received", json_integer((json_int_t)e->load.kv_bytes_received));
    json_object_set_new(o, "kv_transfer", xf);
    if (l != NULL) {
        json_t *c = json_object();
        json_object_set_new(c, "hellos", json_integer((json_int_t)l->n_hello));
        json_object_set_new(c, "heartbeats", json_integer((json_int_t)l->n_heartbeat));
        json_object_set_new(c, "kv_events", json_integer((json_int_t)l->n_kv_events));
        json_object_set_new(c, "kv_seq_gaps", json_integer((json_int_t)l->kv.gaps));
        json_object_set_new(c, "links_lost", json_integer((json_int_t)l->n_pipes_lost));
        /* Connections uvsp closed for a protocol fault of the peer (NNG
         * closes such pipes without telling: 0 on nng links). */
        json_object_set_new(c, "link_faults",
                            json_integer(l->native ? (json_int_t)l->sp.dropped : 0));
        json_object_set_new(o, "counters", c);
    }
    return o;
}

char *rt_server_cluster_json(struct router *r)
{
    json_t *root = json_object();
    if (root == NULL) {
        return NULL;
    }
    /* The router's monotonic clock: rates between two reads (the page's). */
    json_object_set_new(root, "now_ms", json_integer((json_int_t)uv_now(r->loop)));
    json_object_set_new(root, "model", json_string(r->opts.model));
    json_object_set_new(root, "max_context", json_integer(rt_max_context(r)));
    json_object_set_new(root, "block_size", json_integer(r->opts.block_size));
    json_object_set_new(root, "routing",
                        json_string(r->opts.routing ? r->opts.routing : "(default)"));
    json_object_set_new(root, "announce",
                        r->reg.announce_url[0] ? json_string(r->reg.announce_url) : json_null());
    json_t *req = json_object();
    json_object_set_new(req, "running", json_integer(r->core.d.n_running));
    json_object_set_new(req, "pending", json_integer(r->core.d.n_pending));
    json_object_set_new(req, "live", json_integer(r->core.d.n_live));
    json_object_set_new(root, "requests", req);

    json_t *eps = json_array();
    int max = rt_pipeline_max_endpoints(r->core.pl);
    for (int ep = 0; ep < max; ep++) {
        const struct rt_endpoint *e = rt_pipeline_endpoint(r->core.pl, ep);
        if (e != NULL) {
            json_array_append_new(eps, endpoint_json(r, ep, e));
        }
    }
    json_object_set_new(root, "endpoints", eps);
    /* Links without an endpoint: dialing, or refused. */
    json_t *pending = json_array();
    for (const struct rt_link *l = r->reg.links; l; l = l->next) {
        if (l->ep < 0) {
            json_t *o = json_object();
            json_object_set_new(o, "control_address", json_string(l->addr));
            json_object_set_new(o, "state",
                                json_string(l->refused     ? "refused"
                                            : l->pipes > 0 ? "connected"
                                                           : "connecting"));
            json_object_set_new(o, "static", json_boolean(l->is_static));
            json_array_append_new(pending, o);
        }
    }
    json_object_set_new(root, "unregistered_links", pending);
    json_object_set_new(root, "refusals", refusals_json(&r->reg, uv_now(r->loop)));

    struct rt_pipeline_stats st;
    rt_pipeline_stats(r->core.pl, &st);
    json_t *dec = json_object();
    json_object_set_new(dec, "total", json_integer((json_int_t)st.decisions));
    json_object_set_new(dec, "failures", json_integer((json_int_t)st.failures));
    json_object_set_new(dec, "single", json_integer((json_int_t)st.pd_single));
    json_object_set_new(dec, "local_prefill", json_integer((json_int_t)st.pd_local));
    json_object_set_new(dec, "remote_prefill", json_integer((json_int_t)st.pd_remote));
    json_object_set_new(dec, "cached_reports", json_integer((json_int_t)st.cached_reports));
    json_object_set_new(dec, "predicted_cached_tokens",
                        json_integer((json_int_t)st.predicted_tokens));
    json_object_set_new(dec, "actual_cached_tokens", json_integer((json_int_t)st.actual_tokens));
    json_object_set_new(dec, "abs_error_tokens", json_integer((json_int_t)st.abs_error_tokens));
    json_object_set_new(dec, "exact_predictions", json_integer((json_int_t)st.exact_predictions));
    json_object_set_new(root, "decisions", dec);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* ---- /v1/decisions ------------------------------------------------------ */

/* Candidates by total score, best first. */
static int by_total_desc(const void *a, const void *b)
{
    double x = json_number_value(json_object_get(*(json_t *const *)a, "total"));
    double y = json_number_value(json_object_get(*(json_t *const *)b, "total"));
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Keeps the best `keep` candidates of each profile run of rec (and the one
 * picked, if it was not among them), and says how many there were in
 * "candidates_total": a record of a 64-worker cluster is mostly its
 * candidates' scores. */
static void trim_candidates(json_t *rec, size_t keep)
{
    size_t i;
    json_t *run;
    json_array_foreach(json_object_get(rec, "runs"), i, run)
    {
        json_t *cands = json_object_get(run, "candidates");
        size_t n = json_array_size(cands);
        json_object_set_new(run, "candidates_total", json_integer((json_int_t)n));
        if (n <= keep) {
            continue;
        }
        json_t **v = malloc(n * sizeof(*v));
        json_t *kept = json_array();
        if (v == NULL || kept == NULL) {
            free(v);
            json_decref(kept);
            continue;
        }
        for (size_t k = 0; k < n; k++) {
            v[k] = json_array_get(cands, k);
        }
        qsort(v, n, sizeof(*v), by_total_desc);
        const char *picked = json_string_value(json_object_get(run, "picked"));
        size_t picked_at = n;
        for (size_t k = 0; picked != NULL && k < n && picked_at == n; k++) {
            const char *id = json_string_value(json_object_get(v[k], "endpoint"));
            picked_at = id != NULL && strcmp(id, picked) == 0 ? k : n;
        }
        for (size_t k = 0; k < keep; k++) {
            json_array_append(
                kept, k + 1 == keep && picked_at >= keep && picked_at < n ? v[picked_at] : v[k]);
        }
        free(v);
        json_object_set_new(run, "candidates", kept);
    }
}

/* The query parameter name of query ("a=1&b=2") as an integer in [lo, hi]
 * into *out (left alone when absent). 0, or -1 when present and not such an
 * integer. */
static int query_int(const char *query, const char *name, long lo, long hi, long *out)
{
    size_t n = strlen(name);
    for (const char *p = query; p != NULL && *p != '\0';) {
        if (strncmp(p, name, n) == 0 && p[n] == '=') {
            char *end;
            errno = 0;
            long v = strtol(p + n + 1, &end, 10);
            if (errno != 0 || end == p + n + 1 || (*end != '\0' && *end != '&') || v < lo ||
                v > hi) {
                return -1;
            }
            *out = v;
            return 0;
        }
        p = strchr(p, '&');
        p = p != NULL ? p + 1 : NULL;
    }
    return 0;
}

char *rt_server_decisions_json(struct router *r, int limit, int candidates)
{
    json_t *root = json_object();
    json_t *arr = json_array();
    if (root == NULL || arr == NULL) {
        json_decref(root);
        json_decref(arr);
        return NULL;
    }
    struct rt_declog *l = &r->core.declog;
    int kept = rt_declog_count(l);
    int n = limit >= 0 && limit < kept ? limit : kept;
    for (int k = 0; k < n; k++) {
        int actual;
        const char *text = rt_declog_json(l, k, &actual);
        json_t *rec = text != NULL ? json_loads(text, 0, NULL) : NULL;
        if (rec == NULL) {
            continue;
        }
        json_object_set_new(rec, "actual_cached_decode",
                            actual >= 0 ? json_integer(actual) : json_null());
        if (candidates > 0) {
            trim_candidates(rec, (size_t)candidates);
        }
        json_array_append_new(arr, rec);
    }
    struct rt_pipeline_stats st;
    rt_pipeline_stats(r->core.pl, &st);
    json_object_set_new(root, "kept", json_integer(l->cap));
    json_object_set_new(root, "total", json_integer((json_int_t)st.decisions));
    json_object_set_new(root, "decisions", arr);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* GET /v1/decisions[?limit=N][&candidates=K] */
static void handle_decisions(struct router *r, struct http_req *req)
{
    const char *q = http_req_query(req);
    long limit = -1, cands = 0;
    if (query_int(q, "limit", 0, INT_MAX, &limit) != 0 ||
        query_int(q, "candidates", 1, INT_MAX, &cands) != 0) {
        respond_error(r, req, 400, "invalid_value",
                      "Bad query '%s': limit (records, newest first) is an integer >= 0, "
                      "candidates (best-scored candidates kept per profile run) an integer >= 1.",
                      q, NULL);
        return;
    }
    respond_json(req, 200, rt_server_decisions_json(r, (int)limit, (int)cands));
}

/* GET /dashboard: open like /health (the page asks for the API key and
 * sends it to the /v1 endpoints it polls). Inline script and style only,
 * data from this origin only. */
static void handle_dashboard(struct http_req *req)
{
    static const char *const h[] = {
        "Content-Type",
        "text/html; charset=utf-8",
        "Cache-Control",
        "no-store",
        "Content-Security-Policy",
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
        "X-Content-Type-Options",
        "nosniff",
        NULL,
    };
    size_t len;
    const char *page = rt_dashboard_page(&len);
    http_req_respond(req, 200, h, page, len);
}

/* ---- Routes ------------------------------------------------------------- */

void rt_server_handle(struct http_req *req, void *user)
{
    struct router *r = user;
    const char *path = http_req_path(req);
    const char *method = http_req_method(req);
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int post = strcmp(method, "POST") == 0;
    enum rt_apikey_verdict v =
        rt_apikey_guarded(path) ? rt_apikey_check(&r->apikey, http_req_header(req, "Authorization"))
                                : RT_APIKEY_OK;
    if (v != RT_APIKEY_OK) {
        respond_unauthorized(r, req, v);
        return;
    }
    if (strcmp(path, "/v1/completions") == 0 || strcmp(path, "/v1/chat/completions") == 0) {
        if (!post) {
            respond_error(r, req, 405, "method_not_allowed",
                          "Method %s is not allowed here: use POST.", method, "POST");
            return;
        }
        rt_handle_generate(r, req,
                           path[4] == 'c' && path[5] == 'h' ? OA_KIND_CHAT : OA_KIND_COMPLETION);
        return;
    }
    int known = strcmp(path, "/health") == 0 || strcmp(path, "/metrics") == 0 ||
                strcmp(path, "/v1/models") == 0 || strcmp(path, "/v1/cluster") == 0 ||
                strcmp(path, "/v1/decisions") == 0 || strcmp(path, "/dashboard") == 0;
    if (!known) {
        respond_error(r, req, 404, "not_found", "Unknown path %s.", path, NULL);
        return;
    }
    if (!get) {
        respond_error(r, req, 405, "method_not_allowed", "Method %s is not allowed here: use GET.",
                      method, "GET");
        return;
    }
    if (strcmp(path, "/health") == 0) {
        int healthy, total;
        rt_registry_counts(&r->reg, &healthy, &total);
        char body[128];
        int n = snprintf(body, sizeof(body),
                         "{\"status\":\"ok\",\"endpoints\":%d,\"healthy_endpoints\":%d}", total,
                         healthy);
        http_req_respond(req, 200, json_headers, body, (size_t)n);
    } else if (strcmp(path, "/metrics") == 0) {
        metrics_respond(req, r->core.m.reg);
    } else if (strcmp(path, "/v1/models") == 0) {
        r->core.model.max_context = rt_max_context(r);
        respond_json(req, 200, oa_models_json(&r->core.model, 1));
    } else if (strcmp(path, "/v1/cluster") == 0) {
        respond_json(req, 200, rt_server_cluster_json(r));
    } else if (strcmp(path, "/dashboard") == 0) {
        handle_dashboard(req);
    } else {
        handle_decisions(r, req);
    }
}
