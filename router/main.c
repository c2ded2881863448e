/* tandem-router: the OpenAI-compatible HTTP front end, the registry of
 * workers and the scheduling pipeline in one libuv loop (router/router.h).
 *
 * Prints exactly one line on stdout once every listener is bound:
 *   READY id=router http=127.0.0.1:<port> announce=<url|none>
 * and runs until SIGINT or SIGTERM, then ends every request and exits 0.
 * Exit codes: 0 (clean stop, --help, --version), 2 (bad flag or value,
 * bad routing file), 1 (anything else at startup). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "flags.h"
#include "log.h"
#include "router.h"
#include "tandem_err.h"
#include "tls.h"
#include "watchdog.h"

/* --tls-ca, --tls-cert, --tls-key: loaded by tls_init for tls+tcp:// addresses. */
static const char *tls_ca, *tls_cert, *tls_key;

static size_t build_flags(struct rt_opts *o, struct flag *f)
{
    size_t n = 0;
#define F(...) f[n++] = (struct flag){__VA_ARGS__}
    F("host", FLAG_STR, &o->host, "HTTP listen address (IPv4 or IPv6 literal)", 0, 0, NULL);
    F("port", FLAG_INT, &o->port, "HTTP port (0: any free port, printed on the READY line)", 0,
      65535, NULL);
    F("announce", FLAG_STR, &o->announce,
      "NNG address of the PULL0 socket workers started with --router announce themselves to "
      "(tcp://host:0: any free port; 'none': off)",
      0, 0, NULL);
    F("routing", FLAG_STR, &o->routing,
      "EndpointPickerConfig YAML (docs/routing.md; default: embedded P/D with precise "
      "prefix-cache, queue and active-request scorers, = deploy/routing/pd-prefix-based.yaml "
      "with mode: precise)",
      0, 0, NULL);
    F("workers", FLAG_STR, &o->workers,
      "comma-separated worker control addresses to dial (besides announced ones)", 0, 0, NULL);
    F("model", FLAG_STR, &o->model,
      "served model name; workers must serve it (also the block-hash root; a sim preset name "
      "sets the vocabulary and context)",
      0, 0, NULL);
    F("tokenizer", FLAG_STR, &o->tokenizer,
      "llama2.c tokenizer.bin (default: the byte-level tokenizer of the tiny model)", 0, 0, NULL);
    F("block-size", FLAG_INT, &o->block_size, "tokens per KV block (the workers' --block-size)", 1,
      1024, NULL);
    F("max-context", FLAG_INT, &o->max_context,
      "context limit in tokens (0: the smallest one the decode workers announce; 4096, or the "
      "sim preset's, before any)",
      0, 131072, NULL);
    F("max-body", FLAG_BYTES, &o->max_body, "largest request body (413 beyond)", 0, 0, NULL);
    F("max-connections", FLAG_INT, &o->max_connections, "open HTTP connections (503 beyond)", 1,
      1000000, NULL);
    F("max-pending", FLAG_INT, &o->max_pending,
      "requests queued in the router while every worker is busy (429 with Retry-After beyond)", 0,
      1000000, NULL);
    F("retries", FLAG_INT, &o->retries,
      "times a request lost on a worker is sent again (before or after its first token)", 0, 100,
      NULL);
    F("heartbeat-timeout-ms", FLAG_INT, &o->heartbeat_timeout_ms,
      "an endpoint is unhealthy after this long without a heartbeat", 50, 3600000, NULL);
    F("request-timeout-ms", FLAG_INT, &o->request_timeout_ms,
      "HTTP: a request must arrive whole within this long of its first byte (408)", 10, 3600000,
      NULL);
    F("idle-timeout-ms", FLAG_INT, &o->idle_timeout_ms,
      "HTTP: an idle keep-alive connection is closed after this long", 10, 86400000, NULL);
    F("deadline-ms", FLAG_INT, &o->deadline_ms,
      "a generation still running after this long ends (504, or finish_reason abort)", 100,
      86400000, NULL);
    F("forget-ms", FLAG_INT, &o->forget_ms, "an announced worker unreachable this long is removed",
      100, 86400000, NULL);
    F("decisions", FLAG_INT, &o->decisions, "decision records kept for GET /v1/decisions", 0,
      100000, NULL);
    F("seed", FLAG_INT, &o->seed, "seed of the pipeline's random choices (0: from the clock)", 0,
      2147483647, NULL);
    F("log-level", FLAG_CHOICE, &o->log_level, "log level (debug logs every decision as JSON)", 0,
      0, log_level_names);
    F(TLS_FLAG_CA, FLAG_STR, &tls_ca,
      "cluster CA certificate (PEM) for tls+tcp:// addresses (docs/multi-host.md)", 0, 0, NULL);
    F(TLS_FLAG_CERT, FLAG_STR, &tls_cert, "the router's certificate (PEM), signed by the CA", 0, 0,
      NULL);
    F(TLS_FLAG_KEY, FLAG_STR, &tls_key, "the router's private key (PEM)", 0, 0, NULL);
    F(AUTH_SECRET_FLAG, FLAG_STR, &o->cluster_secret_file,
      "file holding the cluster secret (16 to 4096 bytes): workers must prove it to register "
      "and to announce themselves (docs/reliability.md; default: $" AUTH_SECRET_ENV ", else none)",
      0, 0, NULL);
#undef F
    return n;
}

#define MAX_FLAGS 32

static struct router router;
static uv_signal_t sigint_h, sigterm_h;
static int stopping;

static void on_signal_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_router_closed(struct router *r)
{
    (void)r;
    /* The signal handles stay open (unreferenced) until the loop ends, so a
     * second signal during shutdown is still caught. */
    uv_unref((uv_handle_t *)&sigint_h);
    uv_unref((uv_handle_t *)&sigterm_h);
}

/* Seconds after a stop signal before the watchdog (common/watchdog.h) ends a
 * router stuck in an NNG socket close: seen about once in 30 stops of a router
 * with live workers. The router closes its NNG sockets last (router.c), so by
 * then every client has its answer and its EOF. */
#define STOP_WATCHDOG_S 3

static void on_signal(uv_signal_t *s, int signum)
{
    (void)s;
    if (stopping) {
        return;
    }
    stopping = 1;
    LOG_INFO("router", "signal %d: stopping", signum);
    watchdog_start("tandem-router", STOP_WATCHDOG_S);
    rt_close(&router, on_router_closed);
}

int main(int argc, char **argv)
{
    struct rt_opts o;
    rt_opts_default(&o);
    struct flag flags[MAX_FLAGS];
    size_t n = build_flags(&o, flags);
    char err[1024] = "";
    int rc = flags_parse(flags, n, argc, argv, 1, NULL, err, sizeof(err));
    if (rc == FLAGS_HELP) {
        flags_usage(stdout,
                    "tandem-router [flags]\n\n"
                    "Tandem's router: the OpenAI API over HTTP (POST /v1/completions, POST "
                    "/v1/chat/completions,\nGET /v1/models, /health, /metrics, /v1/cluster, "
                    "/v1/decisions), a registry of prefill,\ndecode and colocated workers, and "
                    "the llm-d-style scheduling pipeline. Prints\n"
                    "  READY id=router http=<host>:<port> announce=<url|none>\n"
                    "once listening.",
                    flags, n);
        return 0;
    }
    if (rc == FLAGS_VERSION) {
        printf("tandem-router %s\n", TANDEM_VERSION);
        return 0;
    }
    if (rc != FLAGS_OK) {
        fprintf(stderr, "tandem-router: %s\n", err);
        return 2;
    }
    log_init("router", (enum log_level)o.log_level);
    signal(SIGPIPE, SIG_IGN);
    rc = tls_init(tls_ca, tls_cert, tls_key, err, sizeof(err));
    if (rc == 0 && !tls_enabled() &&
        (tls_url_is_tls(o.announce) ||
         (o.workers != NULL && strstr(o.workers, "tls+tcp") != NULL))) {
        snprintf(err, sizeof(err), "--%s: tls+tcp:// needs --%s, --%s and --%s",
                 tls_url_is_tls(o.announce) ? "announce" : "workers", TLS_FLAG_CA, TLS_FLAG_CERT,
                 TLS_FLAG_KEY);
        rc = TANDEM_EINVAL;
    }
    if (rc != 0) {
        fprintf(stderr, "tandem-router: %s\n", err);
        return 2;
    }

    uv_loop_t loop;
    if (uv_loop_init(&loop) != 0) {
        fprintf(stderr, "tandem-router: cannot create the event loop\n");
        return 1;
    }
    uv_signal_init(&loop, &sigint_h);
    uv_signal_init(&loop, &sigterm_h);
    uv_signal_start(&sigint_h, on_signal, SIGINT);
    uv_signal_start(&sigterm_h, on_signal, SIGTERM);
    int code = 0;
    rc = rt_open(&router, &loop, &o, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tandem-router: %s\n", err);
        code = rc == TANDEM_EINVAL || rc == TANDEM_ECONFIG || rc == TANDEM_ERANGE ? 2 : 1;
        stopping = 1;
        rt_close(&router, on_router_closed);
    } else {
        const char *ann = router.reg.announce_url[0] ? router.reg.announce_url : "none";
        int v6 = strchr(o.host, ':') != NULL;
        printf("READY id=router http=%s%s%s:%d announce=%s\n", v6 ? "[" : "", o.host, v6 ? "]" : "",
               router.http_port, ann);
        fflush(stdout);
        LOG_INFO("router", "listening on http://%s:%d, announce %s, model %s, routing %s", o.host,
                 router.http_port, ann, o.model, o.routing ? o.routing : "(default)");
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    /* Closing the handles gives the signals back their default action; a
     * repeat of the stop signal from here on (a sender that signals the
     * process and its group, or TSan delivering a deferred copy: test_up saw
     * a router that had logged "stopped" die by SIGTERM) must not turn a
     * clean exit into a death by SIGTERM. */
    uv_close((uv_handle_t *)&sigint_h, on_signal_closed);
    uv_close((uv_handle_t *)&sigterm_h, on_signal_closed);
    uv_run(&loop, UV_RUN_DEFAULT);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    if (uv_loop_close(&loop) != 0) {
        LOG_WARN("router", "event loop closed with handles still open");
    }
    tls_fini();
    if (code == 0) {
        LOG_INFO("router", "stopped");
    }
    return code;
}
