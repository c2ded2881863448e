/* tandem-router: the OpenAI-compatible HTTP front end, the registry of
 * workers and the scheduling pipeline in one libuv loop (router/router.h).
 *
 * Prints exactly one line on stdout once every listener is bound:
 *   READY id=router http=127.0.0.1:<port> announce=<url|none>
 * and runs until SIGINT or SIGTERM, then ends every request and exits 0.
 * Exit codes: 0 (clean stop, --help, --version), 2 (bad flag or value,
 * bad routing file), 1 (anything else at startup), 70 (the stop watchdog
 * ended a stop that hung: common/watchdog.h). */
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
#include "uvnng.h"
#include "watchdog.h"

/* --tls-ca, --tls-cert, --tls-key: loaded by tls_init for tls+tcp:// addresses. */
static struct rt_tls_files tls;

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

/* Seconds after a stop signal, beyond --shutdown-drain-ms and
 * RT_STOP_FLUSH_MS, before the watchdog (common/watchdog.h) ends a stop that
 * hangs, exit status 70. The NNG close deadlock that made it fire in about 1 of 30 stops is avoided
 * (uvnng_set_exiting); a fired watchdog is a bug to report. */
#define STOP_WATCHDOG_S 3

static void on_signal(uv_signal_t *s, int signum)
{
    (void)s;
    if (stopping) {
        return;
    }
    stopping = 1;
    LOG_INFO("router", "signal %d: stopping", signum);
    uvnng_set_exiting(); /* the NNG close deadlock: common/uvnng.h */
    unsigned drain_s = (unsigned)(router.opts.shutdown_drain_ms + RT_STOP_FLUSH_MS + 999) / 1000;
    watchdog_start("tandem-router", STOP_WATCHDOG_S + drain_s);
    rt_close(&router, on_router_closed);
}

int main(int argc, char **argv)
{
    struct rt_opts o;
    rt_opts_default(&o);
    struct flag flags[RT_OPTS_MAX_FLAGS];
    size_t n = rt_opts_flags(&o, &tls, flags);
    char err[1024] = "";
    int rc = flags_parse(flags, n, argc, argv, 1, NULL, err, sizeof(err));
    if (rc == FLAGS_HELP) {
        o.api_key = NULL; /* --help shows defaults: never a key given before it */
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
    rc = tls_init(tls.ca, tls.cert, tls.key, err, sizeof(err));
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
    if (o.api_key != NULL) {
        /* rt_open kept the key's digest: take the key out of argv, so ps and
         * /proc/<pid>/cmdline no longer show it (they did until now). */
        auth_wipe((char *)o.api_key, strlen(o.api_key));
        o.api_key = router.opts.api_key = NULL;
    }
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
