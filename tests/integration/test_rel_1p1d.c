/* Reliability when a role's only worker dies (docs/reliability.md, "## Faults";
 * issue 16): the default cluster's shape, tandem-router with one prefill and
 * one decode worker (tiny) on loopback, each started as `tandem up` starts
 * it (a fixed id and fixed ipc:// addresses) and restarted with the same
 * command line after a kill -9, this test acting as the supervisor. Under
 * streaming load (40 requests at 6 req/s, greedy and seeded sampling,
 * routing pd-always so every prompt goes through the prefill worker):
 *   - kill -9 the decode worker while requests stream on it: requests are
 *     held while no decode worker is up, those in flight recovered on the
 *     restarted one (prompt plus the tokens already streamed);
 *   - then kill -9 the prefill worker while it prefills: the decode worker
 *     prefills meanwhile (the P/D local fallback);
 * and every request ends 200 with exactly the reference engine's completion
 * (which a fault-free cluster reproduces: test_int_determinism,
 * test_int_router). Prints how long the held requests waited (the router's
 * tandem:request_hold_seconds: count, mean, and the buckets of p50 and max),
 * the figures docs/reliability.md reports. */
#include <time.h>
#include <unistd.h>

#include "rel_common.h"

enum { N = 40, MAX_TOKENS = 32 };
#define RATE       6.0 /* requests per second */
#define RESTART_MS 600 /* the supervisor's delay before a restart (tandem up's first backoff) */

static void teardown(void)
{
    h_cleanup_all();
}

/* One worker as `tandem up` runs it: its command line, kept for restarts. */
struct sup_worker {
    const char *binary;
    char id[32];
    char control[H_URL_MAX], kv[H_URL_MAX];
    const char *argv[20];
    struct h_proc *proc;
};

static void sup_init(struct sup_worker *w, const char *binary, const char *id, const char *announce,
                     struct h_proc *proc)
{
    memset(w, 0, sizeof(*w));
    w->binary = binary;
    w->proc = proc;
    snprintf(w->id, sizeof(w->id), "%s", id);
    char name[64];
    snprintf(name, sizeof(name), "%s-control", id);
    h_ipc_url(w->control, sizeof(w->control), name);
    snprintf(name, sizeof(name), "%s-kv", id);
    h_ipc_url(w->kv, sizeof(w->kv), name);
    const char *a[] = {"--id",     w->id,    "--control",   w->control, "--kv", w->kv,
                       "--router", announce, "--log-level", "error",    NULL};
    memcpy(w->argv, a, sizeof(a));
}

static int sup_start(struct sup_worker *w)
{
    return h_spawn(w->proc, w->binary, w->argv, REL_HANG_MS);
}

/* Runs the driver for ms milliseconds. */
static void drive_for(struct rel_driver *dr, int ms)
{
    double end = h_ms() + ms;
    while (h_ms() < end) {
        rel_drive_step(dr, 5);
    }
}

/* Runs the driver until some running request has streamed at least one
 * token and has at least 16 to go, and the router has requests in flight
 * on role's worker. Returns 0, or -1 after timeout_ms. */
static int drive_until_mid_stream(struct rel_cluster *c, struct rel_driver *dr, const char *role,
                                  int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    while (h_ms() < deadline && dr->done < dr->n) {
        rel_drive_step(dr, 5);
        int mid = 0;
        for (int i = 0; i < dr->n && !mid; i++) {
            int t = rel_client_tokens(dr, i);
            mid = dr->cl[i].state == REL_READING && t >= 1 && t <= dr->reqs[i].max_tokens - 16;
        }
        if (mid && rel_busy_worker(c, role, 0) != NULL) {
            return 0;
        }
    }
    return -1;
}

/* Drives until role's worker has a request in flight. 0, or -1. */
static int drive_until_busy(struct rel_cluster *c, struct rel_driver *dr, const char *role,
                            int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    while (h_ms() < deadline && dr->done < dr->n) {
        rel_drive_step(dr, 2);
        if (rel_busy_worker(c, role, 0) != NULL) {
            return 0;
        }
    }
    return -1;
}

/* kill -9 w, keep the load going for RESTART_MS, start it again. */
static void kill_and_restart(struct rel_driver *dr, struct sup_worker *w, double t0)
{
    printf("  %.2f s: kill -9 %s, %d requests done, %d running\n", (h_ms() - t0) / 1e3, w->id,
           dr->done, dr->active);
    EXPECT_EQ(h_stop(w->proc, SIGKILL, 5000), 128 + SIGKILL);
    drive_for(dr, RESTART_MS);
    CU_ASSERT_FATAL(sup_start(w) == 0);
    printf("  %.2f s: %s restarted\n", (h_ms() - t0) / 1e3, w->id);
}

/* The held requests' waits from the router's histogram: count, sum, and
 * the bucket (lower, upper] that holds the median and the longest. */
static void print_holds(const struct rel_cluster *c)
{
    struct rtc_resp r;
    if (rtc_get(c->port, "/metrics", &r) != 200) {
        rtc_resp_free(&r);
        return;
    }
    const char *prefix = "tandem:request_hold_seconds_bucket{outcome=\"sent\",le=\"";
    double le[64], cum[64];
    int n = 0;
    for (const char *p = strstr(r.body, prefix); p != NULL && n < 64; p = strstr(p + 1, prefix)) {
        const char *v = p + strlen(prefix);
        le[n] = strncmp(v, "+Inf", 4) == 0 ? INFINITY : strtod(v, NULL);
        const char *sp = strchr(v, ' ');
        cum[n++] = sp ? strtod(sp + 1, NULL) : 0;
    }
    double count = h_metric(r.body, "tandem:request_hold_seconds_count{outcome=\"sent\"}");
    double sum = h_metric(r.body, "tandem:request_hold_seconds_sum{outcome=\"sent\"}");
    int med = -1, max = -1;
    for (int i = 0; i < n; i++) {
        if (med < 0 && cum[i] >= count / 2) {
            med = i;
        }
        if (max < 0 && cum[i] >= count) {
            max = i;
        }
    }
    printf("  held requests: %.0f, mean wait %.3f s", count, count > 0 ? sum / count : 0);
    if (med >= 0 && max >= 0) {
        printf(", p50 in (%g, %g] s, max in (%g, %g] s", med > 0 ? le[med - 1] : 0, le[med],
               max > 0 ? le[max - 1] : 0, le[max]);
    }
    printf("\n");
    rtc_resp_free(&r);
}

/* After a hang: what the router has in flight where, and each worker's
 * peer sockets and KV frames (which link stopped carrying frames). */
static void dump_state(const struct rel_cluster *c)
{
    struct rtc_resp r;
    if (rtc_get(c->port, "/v1/cluster", &r) == 200) {
        fprintf(stderr, "router /v1/cluster: %s\n", r.body);
    }
    rtc_resp_free(&r);
    const struct h_proc *w[] = {&c->p[0], &c->d[0]};
    for (int k = 0; k < 2; k++) {
        char *body = NULL;
        if (w[k]->pid > 0 && h_http_get(w[k]->metrics_port, "/metrics", &body) == 200) {
            for (char *line = strtok(body, "\n"); line; line = strtok(NULL, "\n")) {
                if (strncmp(line, "tandem:peer_sockets", 19) == 0 ||
                    strncmp(line, "tandem:kv_frames", 16) == 0 ||
                    strncmp(line, "tandem:messages_rejected", 24) == 0) {
                    fprintf(stderr, "%s: %s\n", w[k]->id, line);
                }
            }
        }
        free(body);
    }
}

static void test_kill_only_workers(void)
{
    double t_ref = h_ms();
    struct rel_req *reqs = rel_workload(N, 16, 24, 96, MAX_TOKENS, 4);
    CU_ASSERT_FATAL(rel_reference(reqs, N) == 0);
    printf("\n  reference: %.2f s\n", (h_ms() - t_ref) / 1e3);
    struct rel_cluster c;
    memset(&c, 0, sizeof(c));
    h_ipc_url(c.announce, sizeof(c.announce), "rel-announce");
    c.rargs[0] = "--routing";
    c.rargs[1] = rel_routing("pd-always.yaml");
    /* REL_ROUTER_LOG=info: the router's log on stderr (debugging). */
    c.rargs[2] = getenv("REL_ROUTER_LOG") ? "--log-level" : NULL;
    c.rargs[3] = getenv("REL_ROUTER_LOG");
    CU_ASSERT_FATAL(rel_start_router(&c, 0) == 0);
    struct sup_worker p, d;
    sup_init(&p, "tandem-prefill", "prefill-0", c.announce, &c.p[0]);
    sup_init(&d, "tandem-decode", "decode-0", c.announce, &c.d[0]);
    CU_ASSERT_FATAL(sup_start(&p) == 0 && sup_start(&d) == 0);
    c.n_p = c.n_d = 1;
    CU_ASSERT_FATAL(rtc_wait_healthy(c.port, 2, REL_HANG_MS) == 2);
    EXPECT_EQ(rel_router_metric(&c, "tandem:request_hold_seconds_count{outcome=\"sent\"}"), 0);
    EXPECT_EQ(
        rel_router_metric(&c, "tandem:pd_local_fallbacks_total{reason=\"no-prefill-endpoint\"}"),
        0);

    struct rel_driver dr;
    rel_driver_init(&dr, reqs, N, N, c.port);
    dr.rate = RATE;
    double t0 = h_ms();
    CU_ASSERT_FATAL(drive_until_mid_stream(&c, &dr, "decode", REL_HANG_MS) == 0);
    kill_and_restart(&dr, &d, t0);
    drive_for(&dr, 1000);
    CU_ASSERT_FATAL(drive_until_busy(&c, &dr, "prefill", REL_HANG_MS) == 0);
    kill_and_restart(&dr, &p, t0);

    rel_drive_all(&dr, 90000);
    printf("  %.2f s: %d requests done, %d hung\n", (h_ms() - t0) / 1e3, dr.done, dr.hung);
    EXPECT_EQ(dr.done, N);
    EXPECT_EQ(dr.hung, 0);
    if (dr.hung > 0) {
        dump_state(&c);
    }
    EXPECT_EQ(rel_check_all(&dr), 0);
    EXPECT_EQ(rel_router_metric(&c, "tandem:router_requests_total{code=\"200\"}"), N);
    double held = rel_router_metric(&c, "tandem:request_hold_seconds_count{outcome=\"sent\"}");
    double recovery = rel_router_metric(&c, "tandem:router_retries_total{reason=\"recovery\"}");
    double fallback =
        rel_router_metric(&c, "tandem:pd_local_fallbacks_total{reason=\"no-prefill-endpoint\"}");
    printf("  recoveries %.0f, P/D local fallbacks %.0f\n", recovery, fallback);
    print_holds(&c);
    CU_ASSERT(held >= 1);
    CU_ASSERT(recovery >= 1);
    CU_ASSERT(fallback >= 1);
    EXPECT_EQ(rel_router_metric(&c, "tandem:request_hold_seconds_count{outcome=\"expired\"}"), 0);
    CU_ASSERT(rel_wait_all_free(&c, REL_HANG_MS) >= 0);
    rel_driver_fini(&dr);
    rel_cluster_stop(&c);
    rel_workload_free(reqs, N);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("rel_1p1d", NULL, NULL, NULL, teardown);
    CU_add_test(s, "kill_only_workers", test_kill_only_workers);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
