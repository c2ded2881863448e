/* `tandem up`: plan, start in order, wait for health, supervise, stop. */
#include "up.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "default_routing.h"
#include "flags.h"
#include "loadgen/http_client.h"
#include "log.h"
#include "rt_apikey.h"
#include "supervise.h"
#include "tandem_err.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define JOIN_POLL_MS    100  /* /v1/cluster while waiting for the workers to join */
#define RUN_POLL_MS     1000 /* /v1/cluster while running: reports leaves and rejoins */
#define HTTP_TIMEOUT_MS 1000
#define TAIL_LINES      15
#define MAX_BODY        (4u << 20)

int up_ready_field(const char *line, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *s = line; (s = strstr(s, key)) != NULL; s += kl) {
        if ((s == line || s[-1] == ' ') && s[kl] == '=') {
            const char *v = s + kl + 1;
            size_t n = strcspn(v, " \t\r\n");
            snprintf(out, cap, "%.*s", (int)n, v);
            return 0;
        }
    }
    return TANDEM_ENOENT;
}

/* ------------------------------------------------------------------ */
/* Runtime                                                             */
/* ------------------------------------------------------------------ */

enum up_phase { PH_ROUTER, PH_WORKERS, PH_JOIN, PH_RUNNING, PH_STOPPING };

struct up;

struct up_proc {
    struct sv_proc sv;
    struct up *up;
    const struct up_spec *spec;
    int ready;          /* READY seen in the current run */
    int healthy;        /* listed healthy by the router since that READY */
    int joined;         /* was ever healthy (for the "rejoined" message) */
    int refusal_logged; /* a refusal while running was logged (until healthy again) */
    /* The router's "incarnation" of the endpoint (the worker's start time)
     * when last seen healthy, and that of the run that exited: an entry still
     * carrying the old one is the dead run, not the restarted one. */
    long long incarnation, stale_incarnation;
    char control[UP_URL_MAX], kv[UP_URL_MAX], metrics[64], http[64], announce[UP_URL_MAX];
};

struct up_options {
    const char *config;
    const char *run_dir;
    const char *bin_dir;
    int dry_run;
    int no_router;
    int print_config;
    int port;
    double timeout_s;
    double stop_timeout_s;
    double backoff_s;
    double backoff_max_s;
    double healthy_reset_s;
    int log_level;
    const char *prom_targets; /* --prometheus-targets: another copy of the targets file */
};

struct up {
    uv_loop_t loop;
    struct up_options opt;
    struct cluster *c;
    struct up_plan plan;
    char run_dir[PATH_MAX];
    int created_ipc_dir;
    struct supervisor sv;
    int sv_open;
    struct up_proc *procs; /* (n) in plan order */
    int n;
    struct up_proc *router; /* NULL without router */
    enum up_phase phase;
    uv_signal_t sigint, sigterm;
    uv_timer_t deadline, poll;
    int handles_open;
    struct lg_http_client http;
    int http_open;
    struct lg_http_call call;
    int call_busy;
    int call_status;
    char *body;
    size_t body_len;
    int exit_code;
    int router_port; /* from the router's READY line */
    int refused;     /* the router refused a worker while joining: stop next turn */
};

static void up_stop(struct up *u, int exit_code);

static int workers_ready(const struct up *u)
{
    for (int i = 0; i < u->n; i++) {
        if (u->procs[i].spec->kind == UP_WORKER && !u->procs[i].ready) {
            return 0;
        }
    }
    return 1;
}

static int workers_healthy(const struct up *u)
{
    for (int i = 0; i < u->n; i++) {
        if (u->procs[i].spec->kind == UP_WORKER && !u->procs[i].healthy) {
            return 0;
        }
    }
    return 1;
}

static void print_tail(const struct up_proc *p)
{
    char tail[8192];
    int n = sv_log_tail(&p->sv, TAIL_LINES, tail, sizeof(tail));
    if (n > 0) {
        fprintf(stderr, "last %d lines of %s:\n%s(all of it: less %s)\n", n, p->sv.log_path, tail,
                p->sv.log_path);
    } else {
        fprintf(stderr, "%s is empty\n", p->sv.log_path);
    }
}

/* The router's API key as the router will find it (rt_apikey.h; a cluster
 * file cannot give --api-key): 1 with key filled, 0 without a key, or an
 * error (the router reports it and exits). Wipe key after use. */
static int router_api_key(const struct up *u, char *key)
{
    char src[PATH_MAX + 32], err[PATH_MAX + 256];
    return rt_apikey_find(NULL, u->c->router_api_key_file, key, src, sizeof(src), err, sizeof(err));
}

/* Where the key is and how clients (the OpenAI SDK, tandem bench) get it. */
static int print_api_key(const struct up *u, FILE *f)
{
    char key[RT_APIKEY_MAX + 1];
    int set = u->router && router_api_key(u, key) > 0;
    auth_wipe(key, sizeof(key));
    if (set && u->c->router_api_key_file) {
        fprintf(f,
                "  %-14s /v1 needs 'Authorization: Bearer <key>', key in %s\n"
                "  %-14s export OPENAI_API_KEY=\"$(cat '%s')\"   # OpenAI SDK, tandem bench\n",
                "api key", u->c->router_api_key_file, "", u->c->router_api_key_file);
    } else if (set) {
        fprintf(f,
                "  %-14s /v1 needs 'Authorization: Bearer <key>', key from $%s\n"
                "  %-14s export OPENAI_API_KEY=\"$%s\"   # OpenAI SDK, tandem bench\n",
                "api key", RT_APIKEY_ENV, "", RT_APIKEY_ENV);
    }
    return set;
}

/* ---- Prometheus targets ---- */

#define UP_PROM_TARGETS "prometheus-targets.json" /* in the run directory */

/* Prometheus file_sd: one target group per process, so each scrape carries
 * the process's name and role (deploy/observability/prometheus.yml). */
static int put_targets(struct up *u, FILE *f)
{
    json_t *groups = json_array();
    for (int i = 0; groups != NULL && i < u->n; i++) {
        const struct up_proc *p = &u->procs[i];
        const char *addr = p->spec->kind == UP_ROUTER ? p->http : p->metrics;
        if (addr[0] == '\0') {
            continue; /* not ready (yet): no address to scrape */
        }
        const char *role = p->spec->kind == UP_ROUTER ? "router" : cluster_role_name(p->spec->role);
        json_array_append_new(groups, json_pack("{s:[s],s:{s:s,s:s,s:s}}", "targets", addr,
                                                "labels", "cluster", u->c->name, "process",
                                                p->spec->name, "role", role));
    }
    int rc = groups != NULL ? json_dumpf(groups, f, JSON_INDENT(2)) : -1;
    json_decref(groups);
    fputc('\n', f);
    return rc;
}

/* Writes path whole or not at all (a temporary file renamed over it), so
 * Prometheus, which rereads it when it changes, never sees half of it. */
static void write_targets_at(struct up *u, const char *path)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL || put_targets(u, f) != 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        LOG_WARN("up", "cannot write the Prometheus targets %s: %s", path, strerror(errno));
        if (f != NULL) {
            unlink(tmp);
        }
    }
}

/* The targets in the run directory and, with --prometheus-targets, there
 * too; rewritten whenever a process (re)starts on new addresses. */
static void write_targets(struct up *u)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/" UP_PROM_TARGETS, u->run_dir);
    write_targets_at(u, path);
    if (u->opt.prom_targets != NULL) {
        write_targets_at(u, u->opt.prom_targets);
    }
}

static void print_banner(struct up *u)
{
    FILE *f = stdout;
    fprintf(f, "\ntandem up: cluster '%s' is up: %d worker%s%s (run dir %s)\n", u->c->name,
            cluster_worker_count(u->c), cluster_worker_count(u->c) == 1 ? "" : "s",
            u->router ? " behind the router" : ", no router", u->run_dir);
    for (int i = 0; i < u->n; i++) {
        const struct up_proc *p = &u->procs[i];
        if (p->spec->kind == UP_ROUTER) {
            fprintf(f, "  %-14s http://%s  announce=%s  pid=%d\n", p->spec->name, p->http,
                    p->announce, (int)p->sv.pid);
            fprintf(f, "  %-14s http://%s/dashboard  (live page: workers, decisions, TTFT/TPOT)\n",
                    "dashboard", p->http);
        } else {
            fprintf(f, "  %-14s control=%s  kv=%s  metrics=http://%s/metrics  pid=%d\n",
                    p->spec->name, p->control, p->kv, p->metrics, (int)p->sv.pid);
        }
    }
    if (cluster_tls(u->c)) {
        fprintf(f, "  %-14s mutual TLS on every NNG link (tls+tcp://), CA %s\n", "tls",
                u->c->tls_ca);
    }
    const char *bearer = print_api_key(u, f) ? " -H \"Authorization: Bearer $OPENAI_API_KEY\"" : "";
    if (u->router) {
        fprintf(f,
                "\nTry it:\n  curl http://%s/v1/completions%s -H 'Content-Type: application/json' "
                "-d '{\"model\":\"%s\",\"prompt\":\"Hello\",\"max_tokens\":16}'\n"
                "  curl http://%s/v1/cluster%s\n",
                u->router->http, bearer, u->c->model, u->router->http, bearer);
    } else {
        fprintf(f, "\nNo router (--no-router): the workers take jobs on their control "
                   "addresses (docs/protocol.md).\n");
    }
    write_targets(u);
    fprintf(f, "Metrics: Prometheus targets in %s%s%s (deploy/observability/).\n",
            u->opt.prom_targets ? u->opt.prom_targets : u->run_dir, u->opt.prom_targets ? "" : "/",
            u->opt.prom_targets ? "" : UP_PROM_TARGETS);
    fprintf(f, "Logs: %s/<name>.log. Stop with Ctrl-C (SIGINT) or SIGTERM.\n", u->run_dir);
    fprintf(f, "READY id=up http=%s run_dir=%s\n", u->router ? u->router->http : "none",
            u->run_dir);
    fflush(f);
}

/* ---- /v1/cluster ---- */

/* The router's reason for refusing p, from /v1/cluster "refusals" (by worker
 * id or control address), or NULL. A refusal naming neither (an
 * announcement the router could not read) counts for every worker not
 * listed healthy: under tandem up only its workers announce there. */
static const char *refusal_of(const struct up_proc *p, json_t *refusals)
{
    size_t k;
    json_t *f;
    json_array_foreach(refusals, k, f)
    {
        const char *id = json_string_value(json_object_get(f, "worker_id"));
        const char *addr = json_string_value(json_object_get(f, "control_address"));
        const char *why = json_string_value(json_object_get(f, "reason"));
        int mine = (id && strcmp(id, p->spec->name) == 0) ||
                   (addr && (strcmp(addr, p->spec->control) == 0 ||
                             (p->control[0] && strcmp(addr, p->control) == 0))) ||
                   (!id && !addr);
        if (why && mine) {
            return why;
        }
    }
    return NULL;
}

/* While joining, a refused worker never joins: say why (for each one) and
 * stop. While running, log it once (a restarted router or worker may
 * disagree now). */
static void check_refusals(struct up *u, json_t *root)
{
    json_t *refusals = json_object_get(root, "refusals");
    int refused = 0;
    for (int i = 0; i < u->n && !u->refused; i++) {
        struct up_proc *p = &u->procs[i];
        const char *why =
            p->spec->kind == UP_WORKER && !p->healthy && p->ready ? refusal_of(p, refusals) : NULL;
        if (why == NULL || (u->phase == PH_RUNNING && p->refusal_logged)) {
            continue;
        }
        if (u->phase == PH_RUNNING) {
            LOG_WARN("up", "the router refuses %s: %s (see %s)", p->spec->name, why,
                     u->router->sv.log_path);
            p->refusal_logged = 1;
        } else {
            fprintf(stderr, "tandem up: the router refused %s: %s\n", p->spec->name, why);
            refused++;
        }
    }
    if (refused > 0) {
        fprintf(stderr,
                "tandem up: every worker must serve the router's model, KV block size and "
                "vocabulary, speak its protocol version and hold the same cluster secret; fix the "
                "cluster file (model, checkpoint, tokenizer, block_size, args) or "
                "TANDEM_CLUSTER_SECRET_FILE, then run "
                "tandem up again (the router's log: %s)\n",
                u->router->sv.log_path);
        u->refused = 1; /* stopped from the poll timer, not inside the HTTP client */
    }
}

static void apply_cluster(struct up *u, json_t *root)
{
    json_t *eps = json_object_get(root, "endpoints");
    for (int i = 0; i < u->n; i++) {
        struct up_proc *p = &u->procs[i];
        if (p->spec->kind != UP_WORKER) {
            continue;
        }
        int healthy = 0;
        long long inc = 0;
        size_t k;
        json_t *e;
        json_array_foreach(eps, k, e)
        {
            const char *id = json_string_value(json_object_get(e, "id"));
            if (id && strcmp(id, p->spec->name) == 0) {
                healthy = json_is_true(json_object_get(e, "healthy"));
                inc = (long long)json_integer_value(json_object_get(e, "incarnation"));
            }
        }
        healthy = healthy && p->ready && (inc == 0 || inc != p->stale_incarnation);
        if (healthy) {
            p->incarnation = inc;
        }
        if (healthy && !p->healthy && u->phase == PH_RUNNING) {
            LOG_INFO("up", "%s %s the router", p->spec->name, p->joined ? "rejoined" : "joined");
        } else if (!healthy && p->healthy && u->phase == PH_RUNNING) {
            LOG_WARN("up", "%s is no longer healthy in the router", p->spec->name);
        }
        p->healthy = healthy;
        p->joined |= healthy;
        p->refusal_logged &= !healthy;
    }
    check_refusals(u, root);
}

static int on_http_headers(struct lg_http_call *c, int status, const char *ctype,
                           enum lg_fail *reason, char *msg)
{
    struct up *u = container_of(c, struct up, call);
    (void)ctype;
    (void)reason;
    (void)msg;
    u->call_status = status;
    return 0;
}

static int on_http_body(struct lg_http_call *c, const char *data, size_t len, enum lg_fail *reason,
                        char *msg)
{
    struct up *u = container_of(c, struct up, call);
    if (u->body_len + len > MAX_BODY) {
        *reason = LG_FAIL_CLIENT;
        snprintf(msg, 256, "/v1/cluster answer over %u bytes", MAX_BODY);
        return TANDEM_ETOOBIG;
    }
    char *b = realloc(u->body, u->body_len + len + 1);
    if (!b) {
        *reason = LG_FAIL_CLIENT;
        snprintf(msg, 256, "out of memory");
        return TANDEM_ENOMEM;
    }
    u->body = b;
    memcpy(b + u->body_len, data, len);
    u->body_len += len;
    b[u->body_len] = '\0';
    return 0;
}

static void on_poll(uv_timer_t *t);

static void on_http_done(struct lg_http_call *c, int err, enum lg_fail reason, const char *msg)
{
    struct up *u = container_of(c, struct up, call);
    u->call_busy = 0;
    (void)reason;
    if (err == 0 && u->call_status == 200 && u->body) {
        json_error_t jerr;
        json_t *root = json_loads(u->body, 0, &jerr);
        if (root) {
            apply_cluster(u, root);
            json_decref(root);
        } else {
            LOG_WARN("up", "router /v1/cluster: bad JSON: %s", jerr.text);
        }
    } else if (err == 0) {
        LOG_DEBUG("up", "router /v1/cluster: HTTP %d", u->call_status);
    } else {
        LOG_DEBUG("up", "router /v1/cluster: %s", msg ? msg : "failed");
    }
    free(u->body);
    u->body = NULL;
    u->body_len = 0;
    if (u->phase == PH_JOIN && u->refused) {
        uv_timer_start(&u->poll, on_poll, 0, 0);
        return;
    }
    if (u->phase == PH_JOIN && workers_healthy(u)) {
        u->phase = PH_RUNNING;
        uv_timer_stop(&u->deadline);
        print_banner(u);
    }
    if (u->phase == PH_JOIN || u->phase == PH_RUNNING) {
        uv_timer_start(&u->poll, on_poll, u->phase == PH_JOIN ? JOIN_POLL_MS : RUN_POLL_MS, 0);
    }
}

static const struct lg_http_call_ops http_ops = {
    .on_headers = on_http_headers,
    .on_body = on_http_body,
    .on_done = on_http_done,
};

static void on_poll(uv_timer_t *t)
{
    struct up *u = container_of(t, struct up, poll);
    if (u->refused) {
        up_stop(u, 1);
        return;
    }
    if (u->call_busy || !u->http_open || (u->phase != PH_JOIN && u->phase != PH_RUNNING)) {
        return;
    }
    u->call.ops = &http_ops;
    u->call.timeout_ms = HTTP_TIMEOUT_MS;
    u->call_status = 0;
    if (lg_http_send(&u->http, &u->call, "GET", "/v1/cluster", NULL, 0) == 0) {
        u->call_busy = 1;
    } else {
        uv_timer_start(&u->poll, on_poll, JOIN_POLL_MS, 0);
    }
}

static void start_join(struct up *u)
{
    char err[256], host[64];
    u->phase = PH_JOIN;
    snprintf(host, sizeof(host), "%s", u->router->http);
    char *colon = strrchr(host, ':');
    int port = colon ? atoi(colon + 1) : 0;
    if (colon) {
        *colon = '\0';
    }
    if (!u->http_open) {
        /* /v1/cluster is behind the API key like the rest of /v1. */
        char key[RT_APIKEY_MAX + 1], auth[RT_APIKEY_MAX + 32] = "";
        if (router_api_key(u, key) > 0) {
            snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", key);
        }
        int rc = lg_http_client_init(&u->http, &u->loop, host, port, auth[0] ? auth : NULL, err,
                                     sizeof(err));
        auth_wipe(key, sizeof(key));
        auth_wipe(auth, sizeof(auth));
        if (rc != 0) {
            LOG_ERROR("up", "router http address '%s': %s", u->router->http, err);
            up_stop(u, 1);
            return;
        }
        u->http_open = 1;
    }
    LOG_INFO("up", "every worker is ready; waiting for them to join the router");
    uv_timer_start(&u->poll, on_poll, 0, 0);
}

/* ---- process events ---- */

static void start_workers(struct up *u)
{
    u->phase = PH_WORKERS;
    for (int i = 0; i < u->n; i++) {
        if (u->procs[i].spec->kind == UP_WORKER) {
            sv_start(&u->procs[i].sv);
        }
    }
}

static void on_line(struct sv_proc *sp, const char *line)
{
    struct up_proc *p = container_of(sp, struct up_proc, sv);
    struct up *u = p->up;
    if (strncmp(line, "READY ", 6) != 0 || u->phase == PH_STOPPING) {
        return;
    }
    up_ready_field(line, "control", p->control, sizeof(p->control));
    up_ready_field(line, "kv", p->kv, sizeof(p->kv));
    up_ready_field(line, "metrics", p->metrics, sizeof(p->metrics));
    up_ready_field(line, "http", p->http, sizeof(p->http));
    up_ready_field(line, "announce", p->announce, sizeof(p->announce));
    p->ready = 1;
    p->healthy = 0;
    sv_mark_ready(sp);
    if (u->phase == PH_RUNNING) {
        LOG_INFO("up", "%s is ready again (pid %d, run %d)", p->spec->name, (int)sp->pid, sp->runs);
        write_targets(u); /* its ports may be new */
        if (p == u->router) {
            /* A new router knows nobody until the workers announce again. */
            for (int i = 0; i < u->n; i++) {
                u->procs[i].healthy = 0;
            }
        }
    } else {
        LOG_INFO("up", "%s is ready (pid %d)", p->spec->name, (int)sp->pid);
    }
    if (u->phase == PH_ROUTER && p == u->router) {
        start_workers(u);
    } else if (u->phase == PH_WORKERS && workers_ready(u)) {
        if (u->router) {
            start_join(u);
        } else {
            u->phase = PH_RUNNING;
            uv_timer_stop(&u->deadline);
            print_banner(u);
        }
    }
}

static void on_exit_cb(struct sv_proc *sp, int status, int restart_ms)
{
    struct up_proc *p = container_of(sp, struct up_proc, sv);
    struct up *u = p->up;
    char what[96];
    sv_describe_status(status, what, sizeof(what));
    int was_ready = sp->ready; /* this run printed READY */
    p->ready = 0;
    p->healthy = 0;
    p->stale_incarnation = p->incarnation;
    if (u->phase == PH_STOPPING) {
        LOG_INFO("up", "%s exited: %s", p->spec->name, what);
        return;
    }
    if (sp->gave_up) {
        fprintf(stderr,
                "tandem up: %s (pid %d) exited: %s; it failed to start %d times in a row, so it "
                "is not restarted\n",
                p->spec->name, (int)sp->last_pid, what, sp->failed_starts);
        print_tail(p);
        fprintf(stderr,
                "tandem up: fix what its log says (its command line: %s/commands.txt), then run "
                "tandem up again; stopping the cluster\n",
                u->run_dir);
        up_stop(u, 1);
        return;
    }
    if (!was_ready) {
        LOG_WARN(
            "up",
            "%s (pid %d) exited during start-up: %s; restarting in %.1f s (failed start %d of %d)",
            p->spec->name, (int)sp->last_pid, what, restart_ms / 1000.0, sp->failed_starts,
            u->sv.backoff.give_up);
        return;
    }
    if (u->phase != PH_RUNNING) {
        fprintf(stderr, "tandem up: %s exited before the cluster was up: %s\n", p->spec->name,
                what);
        print_tail(p);
        up_stop(u, 1);
        return;
    }
    LOG_WARN("up", "%s (pid %d) exited: %s; restarting in %.1f s (restart %d)", p->spec->name,
             (int)sp->last_pid, what, restart_ms / 1000.0, sp->runs);
}

static const struct sv_proc_ops proc_ops = {
    .on_line = on_line,
    .on_exit = on_exit_cb,
};

static void on_deadline(uv_timer_t *t)
{
    struct up *u = container_of(t, struct up, deadline);
    const struct up_proc *late = NULL;
    const char *what = "print READY";
    for (int i = 0; i < u->n && !late; i++) {
        const struct up_proc *p = &u->procs[i];
        if (p->sv.runs > 0 && !p->ready) {
            late = p;
        }
    }
    for (int i = 0; i < u->n && !late; i++) {
        const struct up_proc *p = &u->procs[i];
        if (p->spec->kind == UP_WORKER && !p->healthy) {
            late = p;
            what = "be listed healthy in the router's /v1/cluster";
        }
    }
    fprintf(stderr, "tandem up: timed out after %g s waiting for %s to %s\n", u->opt.timeout_s,
            late ? late->spec->name : "the cluster", what);
    if (late) {
        print_tail(late);
        if (late != u->router && u->router && u->phase == PH_JOIN) {
            print_tail(u->router);
        }
    }
    up_stop(u, 1);
}

/* ---- stopping ---- */

static void on_handle_closed(uv_handle_t *h)
{
    struct up *u = h->data;
    u->handles_open--;
}

static void close_handle(struct up *u, uv_handle_t *h)
{
    h->data = u;
    uv_close(h, on_handle_closed);
}

static void on_sv_done(struct supervisor *sv)
{
    struct up *u = container_of(sv, struct up, sv);
    u->sv_open = 0;
    close_handle(u, (uv_handle_t *)&u->sigint);
    close_handle(u, (uv_handle_t *)&u->sigterm);
    close_handle(u, (uv_handle_t *)&u->deadline);
    close_handle(u, (uv_handle_t *)&u->poll);
}

static void on_http_closed(struct lg_http_client *c)
{
    struct up *u = container_of(c, struct up, http);
    u->http_open = 0;
}

static void up_stop(struct up *u, int exit_code)
{
    if (u->phase == PH_STOPPING) {
        return;
    }
    u->phase = PH_STOPPING;
    u->exit_code = exit_code;
    uv_timer_stop(&u->deadline);
    uv_timer_stop(&u->poll);
    if (u->http_open) {
        lg_http_client_close(&u->http, on_http_closed);
    }
    int grace = (int)(u->opt.stop_timeout_s * 1000);
    if (sv_running(&u->sv) > 0) {
        LOG_INFO("up", "stopping %d process%s (SIGTERM, SIGKILL after %.1f s)", sv_running(&u->sv),
                 sv_running(&u->sv) == 1 ? "" : "es", grace / 1000.0);
    }
    sv_shutdown(&u->sv, grace, on_sv_done);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct up *u = h->data;
    if (u->phase == PH_STOPPING) {
        LOG_WARN("up", "second %s: SIGKILL now", signum == SIGINT ? "SIGINT" : "SIGTERM");
        sv_shutdown(&u->sv, 0, on_sv_done);
        return;
    }
    LOG_INFO("up", "%s: stopping the cluster", signum == SIGINT ? "SIGINT" : "SIGTERM");
    up_stop(u, u->phase == PH_RUNNING ? 0 : 130);
}

/* ------------------------------------------------------------------ */
/* Files and ports                                                     */
/* ------------------------------------------------------------------ */

static int mkdir_p(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *s = buf + 1; *s; s++) {
        if (*s == '/') {
            *s = '\0';
            if (mkdir(buf, mode) != 0 && errno != EEXIST) {
                return -1;
            }
            *s = '/';
        }
    }
    return mkdir(buf, mode) != 0 && errno != EEXIST ? -1 : 0;
}

/* A port nobody listens on now (bind to 0, read it back, close). */
/* Binds a TCP socket to host:0; returns it (the kernel's port in *port) or
 * -1. The caller closes it once every port it needs is picked: ports of
 * sockets still bound are never handed out twice. */
static int bind_free_port(const char *host, int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    socklen_t len = sizeof(a);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static void default_run_dir(char *out, size_t cap, const char *root)
{
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
    snprintf(out, cap, "%s/%s", root, stamp);
}

/* Creates a new run directory: root/<stamp>, or root/<stamp>-2, -3... if the
 * name is taken; points root/latest at it. */
static int make_run_dir(struct up *u)
{
    if (u->opt.run_dir) {
        if (mkdir_p(u->opt.run_dir, 0755) != 0) {
            fprintf(stderr, "tandem up: cannot create %s: %s\n", u->opt.run_dir, strerror(errno));
            return -1;
        }
        snprintf(u->run_dir, sizeof(u->run_dir), "%s", u->opt.run_dir);
        return 0;
    }
    char base[PATH_MAX];
    if (mkdir_p("run", 0755) != 0) {
        fprintf(stderr, "tandem up: cannot create ./run: %s\n", strerror(errno));
        return -1;
    }
    default_run_dir(base, sizeof(base), "run");
    for (int i = 1; i < 100; i++) {
        if (i == 1) {
            snprintf(u->run_dir, sizeof(u->run_dir), "%s", base);
        } else {
            snprintf(u->run_dir, sizeof(u->run_dir), "%.4000s-%d", base, i);
        }
        if (mkdir(u->run_dir, 0755) == 0) {
            const char *leaf = strrchr(u->run_dir, '/') + 1;
            unlink("run/latest.tmp");
            if (symlink(leaf, "run/latest.tmp") == 0 && rename("run/latest.tmp", "run/latest")) {
                unlink("run/latest.tmp");
            }
            return 0;
        }
        if (errno != EEXIST) {
            break;
        }
    }
    fprintf(stderr, "tandem up: cannot create a run directory under ./run: %s\n", strerror(errno));
    return -1;
}

static int write_file(const char *dir, const char *name, int (*fn)(struct up *u, FILE *f),
                      struct up *u)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "tandem up: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = fn(u, f);
    if (fclose(f) != 0 || rc < 0) {
        fprintf(stderr, "tandem up: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

static int put_cluster(struct up *u, FILE *f)
{
    return cluster_write(u->c, f);
}

static int put_routing(struct up *u, FILE *f)
{
    if (u->c->routing_text) {
        return cluster_write_routing(u->c, f);
    }
    fprintf(f, "# tandem-router's default routing (the cluster gives none), as the router reads "
               "it.\n");
    fputs(rt_default_routing(), f);
    return ferror(f) ? TANDEM_EIO : 0;
}

static int put_commands(struct up *u, FILE *f)
{
    fprintf(f, "# tandem up %s: the command line of every process, in start order.\n",
            TANDEM_VERSION);
    for (int i = 0; i < u->plan.n; i++) {
        fprintf(f, "# %s\n", u->plan.procs[i].name);
        up_print_command(f, u->plan.procs[i].argv);
    }
    return ferror(f) ? -1 : 0;
}

static void unlink_ipc(const char *url)
{
    if (strncmp(url, "ipc://", 6) == 0 && unlink(url + 6) == 0) {
        LOG_DEBUG("up", "removed %s", url + 6);
    }
}

static void remove_ipc_files(struct up *u)
{
    unlink_ipc(u->plan.announce);
    for (int i = 0; i < u->plan.n; i++) {
        unlink_ipc(u->plan.procs[i].control);
        unlink_ipc(u->plan.procs[i].kv);
    }
    if (u->created_ipc_dir && rmdir(u->plan.ipc_dir) != 0) {
        LOG_WARN("up", "cannot remove %s: %s", u->plan.ipc_dir, strerror(errno));
    }
}

static int bin_dir_of_self(char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        return -1;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash) {
        return -1;
    }
    *slash = '\0';
    snprintf(out, cap, "%s", self);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Flags and main                                                      */
/* ------------------------------------------------------------------ */

static int parse_flags(struct up_options *o, int argc, char **argv, char *err, size_t errlen)
{
    struct flag flags[] = {
        {"config", FLAG_STR, &o->config,
         "cluster file (also -c FILE); none: the embedded default (1 prefill + 1 decode, tiny)", 0,
         0, NULL},
        {"run-dir", FLAG_STR, &o->run_dir,
         "where logs, the resolved config and the command lines go (none: ./run/<timestamp>, "
         "with ./run/latest pointing at it)",
         0, 0, NULL},
        {"dry-run", FLAG_BOOL, &o->dry_run, "print the command lines that would run, then exit", 0,
         0, NULL},
        {"print-config", FLAG_BOOL, &o->print_config,
         "print the resolved cluster file (defaults filled in), then exit", 0, 0, NULL},
        {"no-router", FLAG_BOOL, &o->no_router,
         "start the workers only (no tandem-router, no --router for the workers)", 0, 0, NULL},
        {"port", FLAG_INT, &o->port,
         "router HTTP port, overriding ports.router (-1: from the file; 0: a free port)", -1, 65535,
         NULL},
        {"bin-dir", FLAG_STR, &o->bin_dir,
         "directory of tandem-router, tandem-prefill, tandem-decode (none: the directory of this "
         "tandem binary)",
         0, 0, NULL},
        {"timeout", FLAG_DOUBLE, &o->timeout_s,
         "seconds for the whole cluster to become healthy at start", 1, 3600, NULL},
        {"stop-timeout", FLAG_DOUBLE, &o->stop_timeout_s,
         "seconds between SIGTERM and SIGKILL when stopping", 0, 600, NULL},
        {"restart-backoff", FLAG_DOUBLE, &o->backoff_s,
         "seconds before the first restart of a process that exited (doubles each time)", 0.01,
         3600, NULL},
        {"restart-backoff-max", FLAG_DOUBLE, &o->backoff_max_s, "longest restart delay, seconds",
         0.01, 3600, NULL},
        {"healthy-reset", FLAG_DOUBLE, &o->healthy_reset_s,
         "seconds of being ready after which the restart delay goes back to the first one", 0.01,
         86400, NULL},
        {"log-level", FLAG_CHOICE, &o->log_level, "log level of tandem up itself", 0, 0,
         log_level_names},
        {"prometheus-targets", FLAG_STR, &o->prom_targets,
         "also write the Prometheus file_sd targets (router and every worker; always in the run "
         "directory as " UP_PROM_TARGETS ") to this file, rewritten when a process restarts",
         0, 0, NULL},
    };
    /* -c FILE is the one short flag: rewrite it to --config. */
    char **args = calloc((size_t)argc + 1, sizeof(*args));
    if (!args) {
        snprintf(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    for (int i = 0; i < argc; i++) {
        args[i] = strcmp(argv[i], "-c") == 0 ? "--config" : argv[i];
    }
    int rc = flags_parse(flags, FLAGS_COUNT(flags), argc, args, 1, NULL, err, errlen);
    free(args);
    if (rc == FLAGS_HELP) {
        flags_usage(stdout,
                    "tandem up [-c cluster.yaml] [flags]\n\n"
                    "Starts a local Tandem cluster (router, prefill, decode and colocated workers) "
                    "from a cluster\nfile, waits until every process is healthy, prints the "
                    "endpoints, restarts processes that\nexit (with backoff), and stops everything "
                    "on SIGINT or SIGTERM. docs/up.md has the file format;\n"
                    "deploy/clusters/ has examples.\n\n"
                    "Security: a tls: section in the cluster file (ca, cert, key: PEM files, e.g. "
                    "made by\ndeploy/make-cluster-ca.sh) runs every link between the router and "
                    "the workers over mutual\nTLS (tls+tcp://) and gives every process "
                    "--tls-ca, --tls-cert and --tls-key. The cluster\nsecret "
                    "(docs/reliability.md): TANDEM_CLUSTER_SECRET_FILE=FILE in the environment "
                    "reaches every\nprocess.",
                    flags, FLAGS_COUNT(flags));
    }
    return rc;
}

static void options_default(struct up_options *o)
{
    *o = (struct up_options){
        .port = -1,
        .timeout_s = CLUSTER_DEFAULT_TIMEOUT,
        .stop_timeout_s = 4.5,
        .backoff_s = SV_BACKOFF_INITIAL_MS / 1000.0,
        .backoff_max_s = SV_BACKOFF_MAX_MS / 1000.0,
        .healthy_reset_s = SV_BACKOFF_RESET_MS / 1000.0,
        .log_level = LOG_LEVEL_INFO,
    };
}

/* The flags' seconds in ms, rounded: (int)(1.005 * 1000) would be 1004. */
static int seconds_to_ms(double s)
{
    return (int)(s * 1000 + 0.5);
}

static struct sv_backoff backoff_policy(const struct up_options *o)
{
    return (struct sv_backoff){
        .initial_ms = seconds_to_ms(o->backoff_s),
        .max_ms = seconds_to_ms(o->backoff_max_s),
        .reset_ms = seconds_to_ms(o->healthy_reset_s),
        .give_up = SV_BACKOFF_GIVE_UP,
    };
}

int up_restart_policy(int argc, char **argv, struct sv_backoff *out, char *err, size_t errlen)
{
    struct up_options o;
    options_default(&o);
    int rc = parse_flags(&o, argc, argv, err, errlen);
    if (rc == FLAGS_OK) {
        *out = backoff_policy(&o);
    }
    return rc;
}

static int check_binaries(const struct up_plan *plan)
{
    for (int i = 0; i < plan->n; i++) {
        const char *path = plan->procs[i].argv[0];
        if (access(path, X_OK) != 0) {
            fprintf(stderr, "tandem up: %s: %s%s\n", path, strerror(errno),
                    plan->procs[i].kind == UP_ROUTER
                        ? " (the router is not built; --no-router starts the workers only)"
                        : "");
            return -1;
        }
    }
    return 0;
}

static int run(struct up *u)
{
    int rc = uv_loop_init(&u->loop);
    if (rc != 0) {
        fprintf(stderr, "tandem up: event loop: %s\n", uv_strerror(rc));
        return 1;
    }
    struct sv_backoff backoff = backoff_policy(&u->opt);
    if (sv_init(&u->sv, &u->loop, &backoff) != 0) {
        fprintf(stderr, "tandem up: cannot watch child processes\n");
        uv_loop_close(&u->loop);
        return 1;
    }
    u->sv_open = 1;
    u->n = u->plan.n;
    for (int i = 0; i < u->n; i++) {
        struct up_proc *p = &u->procs[i];
        char log_path[PATH_MAX + 80];
        p->up = u;
        p->spec = &u->plan.procs[i];
        snprintf(p->sv.name, sizeof(p->sv.name), "%s", p->spec->name);
        p->sv.argv = p->spec->argv;
        snprintf(log_path, sizeof(log_path), "%s/%s.log", u->run_dir, p->spec->name);
        p->sv.log_path = strdup(log_path);
        p->sv.ops = &proc_ops;
        p->sv.restart = 1;
        if (!p->sv.log_path || sv_add(&u->sv, &p->sv) != 0) {
            u->exit_code = 1;
            u->n = i;
            break;
        }
        if (p->spec->kind == UP_ROUTER) {
            u->router = p;
        }
    }
    uv_signal_init(&u->loop, &u->sigint);
    uv_signal_init(&u->loop, &u->sigterm);
    u->sigint.data = u->sigterm.data = u;
    uv_signal_start(&u->sigint, on_signal, SIGINT);
    uv_signal_start(&u->sigterm, on_signal, SIGTERM);
    uv_timer_init(&u->loop, &u->deadline);
    uv_timer_init(&u->loop, &u->poll);
    u->handles_open = 4;

    if (u->exit_code != 0) {
        up_stop(u, 1);
    } else {
        LOG_INFO("up", "cluster '%s': %s%d worker%s; logs in %s", u->c->name,
                 u->router ? "router + " : "", cluster_worker_count(u->c),
                 cluster_worker_count(u->c) == 1 ? "" : "s", u->run_dir);
        uv_timer_start(&u->deadline, on_deadline, (uint64_t)(u->opt.timeout_s * 1000), 0);
        if (u->router) {
            u->phase = PH_ROUTER;
            sv_start(&u->router->sv);
        } else {
            start_workers(u);
        }
    }
    uv_run(&u->loop, UV_RUN_DEFAULT);
    remove_ipc_files(u);
    if (uv_loop_close(&u->loop) != 0) {
        LOG_WARN("up", "event loop closed with handles open");
    }
    for (int i = 0; i < u->plan.n; i++) {
        free((char *)u->procs[i].sv.log_path);
    }
    if (u->exit_code == 0) {
        LOG_INFO("up", "stopped; logs are in %s", u->run_dir);
    }
    return u->exit_code;
}

int up_main(int argc, char **argv)
{
    struct up *u = calloc(1, sizeof(*u));
    char err[CLUSTER_ERR_MAX];
    int code = 1;
    if (!u) {
        fprintf(stderr, "tandem up: out of memory\n");
        return 1;
    }
    options_default(&u->opt);
    int rc = parse_flags(&u->opt, argc, argv, err, sizeof(err));
    if (rc == FLAGS_HELP) {
        code = 0;
        goto out;
    }
    if (rc == FLAGS_VERSION) {
        printf("tandem %s\n", TANDEM_VERSION);
        code = 0;
        goto out;
    }
    if (rc != FLAGS_OK) {
        fprintf(stderr, "tandem up: %s\n", err);
        code = 2;
        goto out;
    }
    log_init("tandem-up", (enum log_level)u->opt.log_level);
    signal(SIGPIPE, SIG_IGN);

    rc = u->opt.config ? cluster_load(&u->c, u->opt.config, err, sizeof(err))
                       : cluster_default(&u->c, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tandem up: %s\n", err);
        code = rc == TANDEM_ENOMEM ? 1 : 2;
        goto out;
    }
    if (u->opt.port >= 0) {
        u->c->router_port = u->opt.port;
    }
    if (u->opt.print_config) {
        code = cluster_write(u->c, stdout) == 0 ? 0 : 1;
        goto out;
    }
    char bin_dir[PATH_MAX];
    if (u->opt.bin_dir) {
        snprintf(bin_dir, sizeof(bin_dir), "%s", u->opt.bin_dir);
    } else if (bin_dir_of_self(bin_dir, sizeof(bin_dir)) != 0) {
        fprintf(stderr, "tandem up: cannot find my own directory; pass --bin-dir\n");
        goto out;
    }

    struct up_plan_input in = {
        .bin_dir = bin_dir,
        .no_router = u->opt.no_router,
        .router_port = u->c->router_port,
        .announce_port = cluster_announce_port(u->c),
    };
    char ipc_dir[PATH_MAX];
    if (u->opt.dry_run) {
        char rd[PATH_MAX];
        default_run_dir(rd, sizeof(rd), "run");
        in.run_dir = u->opt.run_dir ? u->opt.run_dir : rd;
        in.ipc_dir = u->c->ipc_dir ? u->c->ipc_dir : "/tmp/tandem-up-XXXXXX";
        if (up_plan_build(&u->plan, u->c, &in, err, sizeof(err)) != 0) {
            fprintf(stderr, "tandem up: %s\n", err);
            goto out;
        }
        printf("# tandem up --dry-run: cluster '%s' from %s (%d worker%s)\n", u->c->name,
               u->c->source, cluster_worker_count(u->c),
               cluster_worker_count(u->c) == 1 ? "" : "s");
        if (u->c->transport == CLUSTER_IPC && !u->c->ipc_dir) {
            printf("# ipc sockets go to a fresh directory (mkdtemp %s)\n", in.ipc_dir);
        }
        if (u->c->routing_text) {
            printf("# the inline routing is written to %s\n", u->plan.routing_file);
        } else if (!u->c->routing_path) {
            printf("# no routing given: the router's default is written to %s\n",
                   u->plan.routing_file);
        }
        if (cluster_tls(u->c)) {
            printf("# tls: every NNG address is tls+tcp://, every process presents %s (CA %s)\n",
                   u->c->tls_cert, u->c->tls_ca);
        }
        for (int i = 0; i < u->plan.n; i++) {
            printf("# %s\n", u->plan.procs[i].name);
            up_print_command(stdout, u->plan.procs[i].argv);
        }
        code = 0;
        goto out;
    }

    /* Ports asked as 0 must survive restarts, so pick them now, both at
     * once: picked one after the other, the kernel may hand out the port it
     * just gave back, and the router's HTTP and announce listeners would
     * collide ("busy"). */
    int hold[2] = {-1, -1};
    if (in.router_port == 0 && !u->opt.no_router) {
        hold[0] = bind_free_port(u->c->router_host, &in.router_port);
        in.router_port = hold[0] < 0 ? -1 : in.router_port;
    }
    if (u->c->transport == CLUSTER_TCP && in.announce_port == 0 && !u->opt.no_router) {
        hold[1] = bind_free_port(u->c->tcp_host, &in.announce_port);
        in.announce_port = hold[1] < 0 ? -1 : in.announce_port;
    }
    for (int i = 0; i < 2; i++) {
        if (hold[i] >= 0) {
            close(hold[i]);
        }
    }
    if (in.router_port < 0 || (u->c->transport == CLUSTER_TCP && in.announce_port < 0)) {
        fprintf(stderr, "tandem up: cannot find a free port\n");
        goto out;
    }
    if (make_run_dir(u) != 0) {
        goto out;
    }
    char real[PATH_MAX];
    if (realpath(u->run_dir, real)) {
        snprintf(u->run_dir, sizeof(u->run_dir), "%s", real);
    }
    in.run_dir = u->run_dir;
    if (u->c->transport == CLUSTER_IPC) {
        if (u->c->ipc_dir) {
            snprintf(ipc_dir, sizeof(ipc_dir), "%s", u->c->ipc_dir);
            struct stat st;
            if (stat(ipc_dir, &st) != 0) {
                if (mkdir_p(ipc_dir, 0700) != 0) {
                    fprintf(stderr, "tandem up: cannot create %s: %s\n", ipc_dir, strerror(errno));
                    goto out;
                }
                u->created_ipc_dir = 1;
            }
        } else {
            snprintf(ipc_dir, sizeof(ipc_dir), "/tmp/tandem-up-XXXXXX");
            if (!mkdtemp(ipc_dir)) {
                fprintf(stderr, "tandem up: mkdtemp: %s\n", strerror(errno));
                goto out;
            }
            u->created_ipc_dir = 1;
        }
        in.ipc_dir = ipc_dir;
    }
    if (up_plan_build(&u->plan, u->c, &in, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem up: %s\n", err);
        goto out_ipc;
    }
    if (check_binaries(&u->plan) != 0 || write_file(u->run_dir, "cluster.yaml", put_cluster, u) ||
        write_file(u->run_dir, "commands.txt", put_commands, u) ||
        (!u->c->routing_path && !u->opt.no_router &&
         write_file(u->run_dir, "routing.yaml", put_routing, u))) {
        goto out_ipc;
    }
    u->procs = calloc((size_t)u->plan.n, sizeof(*u->procs));
    if (!u->procs) {
        fprintf(stderr, "tandem up: out of memory\n");
        goto out_ipc;
    }
    code = run(u);
    goto out;

out_ipc:
    if (u->created_ipc_dir) {
        rmdir(ipc_dir);
    }
out:
    free(u->procs);
    up_plan_free(&u->plan);
    cluster_free(u->c);
    free(u);
    return code;
}
