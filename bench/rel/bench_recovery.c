/* How long the cluster takes to recover from faults (docs/reliability.md,
 * "## Faults"): the times test_rel_faults waits for without bounding them.
 * A real tandem-router with 2 tandem-prefill + 2 tandem-decode tiny workers
 * announcing over ipc:// (the test's cluster, idle but for the streams each
 * case starts), router --heartbeat-timeout-ms 1500 (the default):
 *   - heartbeat: a worker SIGSTOPped: ms until the router's /v1/cluster shows
 *     it unhealthy (missed heartbeats; sent every 250 ms, checked every
 *     100 ms); SIGCONT: ms until it is healthy again;
 *   - restart: the router SIGKILLed, or SIGTERMed, with 2 streams running: ms
 *     until both clients' connections end, ms until no worker holds a KV
 *     block, and, after a new router starts on the same addresses, ms until
 *     all 4 workers are healthy in it;
 *   - disconnect: 4 clients close mid-stream: ms from the last close until no
 *     worker holds a KV block.
 * Medians, minima and maxima over the runs; the load average is printed
 * beside them (other work on the machine moves every figure).
 *
 * usage: bench_recovery [runs (default 5)]
 * The binaries come from TANDEM_BIN_DIR, else this executable's directory. */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "harness.h"
#include "rt_client.h"

/* A recovery slower than this is reported as a hang. */
#define HANG_MS 30000
#define N_W     4

struct cluster {
    struct h_proc router, w[N_W]; /* w: prefill, prefill, decode, decode */
    int port;
    char port_s[16];
    char announce[H_URL_MAX];
};

/* Starts the router (on c->port when fixed, else on a free port). */
static int start_router(struct cluster *c, int fixed)
{
    const char *args[] = {"--announce",  c->announce, "--heartbeat-timeout-ms", "1500",
                          "--log-level", "error",     fixed ? "--port" : NULL,  c->port_s,
                          NULL};
    if (fixed) {
        return h_spawn(&c->router, "tandem-router", args, HANG_MS);
    }
    if (rtc_spawn_router(&c->router, args, &c->port) != 0) {
        return -1;
    }
    snprintf(c->port_s, sizeof(c->port_s), "%d", c->port);
    return 0;
}

static int start_cluster(struct cluster *c)
{
    memset(c, 0, sizeof(*c));
    h_ipc_url(c->announce, sizeof(c->announce), "bench-announce");
    if (start_router(c, 0) != 0) {
        return -1;
    }
    const char *args[] = {"--router",       c->announce, "--log-level", "error",
                          "--token-budget", "32",        NULL};
    for (int i = 0; i < N_W; i++) {
        if (h_spawn(&c->w[i], i < 2 ? "tandem-prefill" : "tandem-decode", args, HANG_MS) != 0) {
            return -1;
        }
    }
    return rtc_wait_healthy(c->port, N_W, HANG_MS) == N_W ? 0 : -1;
}

/* Whether /v1/cluster lists endpoint id as healthy: 1, 0, -1 (not listed). */
static int endpoint_healthy(int port, const char *id)
{
    struct rtc_resp r;
    int healthy = -1;
    if (rtc_get(port, "/v1/cluster", &r) == 200) {
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *eps = json_object_get(j, "endpoints");
        for (size_t i = 0; i < json_array_size(eps); i++) {
            json_t *e = json_array_get(eps, i);
            const char *eid = json_string_value(json_object_get(e, "id"));
            if (eid != NULL && strcmp(eid, id) == 0) {
                healthy = json_is_true(json_object_get(e, "healthy"));
            }
        }
        json_decref(j);
    }
    rtc_resp_free(&r);
    return healthy;
}

/* Ms until /v1/cluster shows endpoint id with health want (0 or 1; counted
 * from t0), or -1. */
static double healthy_ms(const struct cluster *c, const char *id, int want, double t0)
{
    while (h_ms() - t0 < HANG_MS) {
        if (endpoint_healthy(c->port, id) == want) {
            return h_ms() - t0;
        }
        h_sleep_ms(2);
    }
    return -1;
}

/* Ms until every worker holds no KV block (counted from t0), or -1. */
static double all_free_ms(struct cluster *c, double t0)
{
    for (;;) {
        int busy = 0;
        for (int i = 0; i < N_W; i++) {
            double used = h_proc_metric(&c->w[i], "tandem:kv_blocks{state=\"used\"}");
            busy += !(used == 0);
        }
        if (busy == 0) {
            return h_ms() - t0;
        }
        if (h_ms() - t0 > HANG_MS) {
            return -1;
        }
        h_sleep_ms(2);
    }
}

/* Opens a streaming completion of a 300-token prompt and 400 tokens. */
static int open_stream(struct rtc_conn *conn, int port, uint64_t seed)
{
    uint32_t prompt[300];
    h_prompt(prompt, 300, seed, 3, 259);
    char body[4096];
    int n = snprintf(body, sizeof(body), "{\"prompt\":[");
    for (int i = 0; i < 300; i++) {
        n += snprintf(body + n, sizeof(body) - (size_t)n, "%s%u", i ? "," : "", prompt[i]);
    }
    n += snprintf(body + n, sizeof(body) - (size_t)n,
                  "],\"max_tokens\":400,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}");
    char req[4600];
    int len = snprintf(req, sizeof(req),
                       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                       n, body);
    if (rtc_connect(conn, port) != 0) {
        return -1;
    }
    return rtc_send(conn, req, (size_t)len);
}

static int events(const struct rtc_conn *conn)
{
    int n = 0;
    for (const char *p = conn->buf; p != NULL && conn->len > 0 && (p = strstr(p, "data: ")); p++) {
        n++;
    }
    return n;
}

/* Opens k streams and reads until each has streamed at least 3 events.
 * Returns 0, or -1 when one ended or stalled. */
static int streams_running(struct rtc_conn *conns, int k, int port, uint64_t seed)
{
    for (int i = 0; i < k; i++) {
        if (open_stream(&conns[i], port, seed + (uint64_t)i) != 0) {
            return -1;
        }
    }
    double t0 = h_ms();
    for (int i = 0; i < k; i++) {
        while (events(&conns[i]) < 3) {
            if (conns[i].eof || h_ms() - t0 > HANG_MS) {
                return -1;
            }
            rtc_fill(&conns[i], 10);
        }
    }
    return 0;
}

struct samples {
    double v[64];
    int n;
};

static void add(struct samples *s, double v)
{
    if (s->n < 64) {
        s->v[s->n++] = v;
    }
}

/* "median (min-max)" of s, or "hung" when a run did not recover. */
static void print_stat(const char *what, struct samples *s)
{
    int hung = 0;
    for (int i = 0; i < s->n; i++) {
        hung += s->v[i] < 0;
    }
    bench_sort(s->v, s->n);
    if (s->n == 0 || hung > 0) {
        printf("  %-58s %d of %d runs did not recover within %d ms\n", what, hung, s->n, HANG_MS);
        return;
    }
    printf("  %-58s %7.0f ms  (%.0f-%.0f)\n", what, s->v[s->n / 2], s->v[0], s->v[s->n - 1]);
}

static int bench_heartbeat(struct cluster *c, int runs)
{
    struct samples detect = {0}, back = {0};
    for (int r = 0; r < runs; r++) {
        struct h_proc *victim = &c->w[r % N_W];
        double t0 = h_ms();
        kill(victim->pid, SIGSTOP);
        add(&detect, healthy_ms(c, victim->id, 0, t0));
        kill(victim->pid, SIGCONT);
        add(&back, healthy_ms(c, victim->id, 1, h_ms()));
        if (rtc_wait_healthy(c->port, N_W, HANG_MS) != N_W) {
            return -1;
        }
    }
    printf("heartbeat (--heartbeat-timeout-ms 1500), %d runs:\n", runs);
    print_stat("SIGSTOP -> the router marks the worker unhealthy", &detect);
    print_stat("SIGCONT -> healthy again", &back);
    return 0;
}

static int bench_restart(struct cluster *c, int runs, int sig)
{
    struct samples ended = {0}, freed = {0}, back = {0};
    for (int r = 0; r < runs; r++) {
        struct rtc_conn conns[2];
        if (streams_running(conns, 2, c->port, 1000 + (uint64_t)r * 10) != 0) {
            fprintf(stderr, "bench_recovery: streams did not start\n");
            return -1;
        }
        double t0 = h_ms();
        int code = h_stop(&c->router, sig, HANG_MS);
        if (code != (sig == SIGKILL ? 128 + SIGKILL : 0)) {
            fprintf(stderr, "bench_recovery: the router exited with %d\n", code);
        }
        double t = -1;
        while (h_ms() - t0 < HANG_MS && (!conns[0].eof || !conns[1].eof)) {
            rtc_fill(&conns[0], 1);
            rtc_fill(&conns[1], 1);
        }
        if (conns[0].eof && conns[1].eof) {
            t = h_ms() - t0;
        }
        add(&ended, t);
        rtc_close(&conns[0]);
        rtc_close(&conns[1]);
        add(&freed, all_free_ms(c, t0));
        if (start_router(c, 1) != 0) {
            return -1;
        }
        double t1 = h_ms();
        add(&back, rtc_wait_healthy(c->port, N_W, HANG_MS) == N_W ? h_ms() - t1 : -1);
    }
    const char *name = sig == SIGKILL ? "SIGKILL" : "SIGTERM";
    printf("router %s with 2 streams running, %d runs:\n", name, runs);
    print_stat("-> both clients' connections ended", &ended);
    print_stat("-> no worker holds a KV block", &freed);
    print_stat("new router on the same addresses -> all 4 workers healthy", &back);
    return 0;
}

static int bench_disconnect(struct cluster *c, int runs)
{
    struct samples freed = {0};
    for (int r = 0; r < runs; r++) {
        struct rtc_conn conns[4];
        if (streams_running(conns, 4, c->port, 2000 + (uint64_t)r * 10) != 0) {
            fprintf(stderr, "bench_recovery: streams did not start\n");
            return -1;
        }
        for (int i = 0; i < 4; i++) {
            rtc_close(&conns[i]);
        }
        add(&freed, all_free_ms(c, h_ms()));
    }
    printf("4 clients disconnect mid-stream, %d runs:\n", runs);
    print_stat("last close -> no worker holds a KV block", &freed);
    return 0;
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 5;
    if (runs < 1 || runs > 64) {
        fprintf(stderr, "usage: %s [runs (default 5, at most 64)]\n", argv[0]);
        return 2;
    }
    h_init();
    bench_set_bin_dir();
    struct cluster c;
    if (start_cluster(&c) != 0) {
        fprintf(stderr, "bench_recovery: the cluster did not start\n");
        h_cleanup_all();
        return 1;
    }
    char load[128] = "";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fgets(load, sizeof(load), f) == NULL) {
            load[0] = '\0';
        }
        fclose(f);
    }
    printf("bench_recovery: router + 2 prefill + 2 decode tiny workers; load average %s", load);
    int rc = bench_heartbeat(&c, runs);
    rc = rc == 0 ? bench_restart(&c, runs, SIGKILL) : rc;
    rc = rc == 0 ? bench_restart(&c, runs, SIGTERM) : rc;
    rc = rc == 0 ? bench_disconnect(&c, runs) : rc;
    int code = h_stop(&c.router, SIGTERM, HANG_MS);
    for (int i = 0; i < N_W; i++) {
        int w = h_stop(&c.w[i], SIGTERM, HANG_MS);
        code = code != 0 ? code : w;
    }
    if (code != 0) {
        fprintf(stderr, "bench_recovery: a process exited with %d at the end\n", code);
    }
    h_cleanup_all();
    return rc == 0 && code == 0 ? 0 : 1;
}
