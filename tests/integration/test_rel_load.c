/* Load (docs/reliability.md, "## Load"), against the real router:
 *   - three times saturation: a router with two simulated colocated workers
 *     (llama-3-8b on an H100, time scale 1, so a request costs real
 *     modelled time and capacity is fixed) and a small pending queue.
 *     Saturation is measured first (closed loop at the cluster's capacity);
 *     then requests arrive open loop at three times that rate. The router
 *     must answer everything, refusing what it cannot take with 429 (or
 *     503), stay up, keep its memory bounded (VmRSS before, peak, after),
 *     answer every /health on another connection throughout, and serve
 *     normally once the load is gone;
 *   - 10,000 idle connections held at once (RLIMIT_NOFILE raised to the
 *     hard limit, --max-connections above it): none is dropped, normal
 *     requests beside them succeed, /health too, and clients that trickle a
 *     request get 408 and a close, not before --request-timeout-ms.
 * Latencies (429s, /health, a completion beside the idle connections) are
 * printed, not bounded: on a shared machine they measure its load. Each wait
 * has an overall timeout (REL_HANG_MS) that only catches a hang. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "rel_common.h"

static void teardown(void)
{
    h_cleanup_all();
}

/* VmRSS of pid in KiB, or -1. */
static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) {
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return kb;
}

/* Open file descriptors of pid that are sockets. */
static int socket_fds(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        char p[320], t[64];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        ssize_t len = readlink(p, t, sizeof(t) - 1);
        n += len > 7 && memcmp(t, "socket:", 7) == 0;
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* p-th percentile (0..100) of v[0..n), sorted in place. */
static double pct(double *v, int n, double p)
{
    if (n == 0) {
        return NAN;
    }
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    int i = (int)(p / 100.0 * (n - 1) + 0.5);
    return v[i];
}

/* One GET /health on a new connection: its latency in ms, or -1. */
static double health_ms(int port)
{
    double t0 = h_ms();
    struct rtc_resp r;
    int st = rtc_request(port, "GET", "/health", NULL, NULL, &r, REL_HANG_MS);
    rtc_resp_free(&r);
    return st == 200 ? h_ms() - t0 : -1;
}

/* ---- Three times saturation -------------------------------------------- */

static void test_overload(void)
{
    /* Capacity: 2 workers x 4 running, nothing waiting on the workers; the
     * router queues 8 more, then answers 429. */
    struct rel_cluster c;
    const char *rargs[] = {"--model", "llama-3-8b", "--max-pending", "8", NULL};
    const char *wargs[] = {"--colocated", "--backend",     "sim", "--model",
                           "llama-3-8b",  "--time-scale",  "1",   "--max-running",
                           "4",           "--max-waiting", "0",   NULL};
    memset(&c, 0, sizeof(c));
    CU_ASSERT_FATAL(rel_cluster_start(&c, 0, 2, rargs, wargs) == 0);
    pid_t rpid = c.router.pid;

    /* Saturation: closed loop with as many clients as the workers run. */
    enum { NSAT = 48, MT = 32 };
    struct rel_req *sat = rel_workload(NSAT, 71, 100, 200, MT, 0);
    struct rel_driver dr;
    rel_driver_init(&dr, sat, NSAT, 8, c.port);
    double t0 = h_ms();
    rel_drive_all(&dr, 60000);
    double sat_s = (h_ms() - t0) / 1e3;
    int ok = 0;
    for (int i = 0; i < NSAT; i++) {
        ok += dr.cl[i].status == 200;
    }
    double rate = ok / sat_s;
    printf("\n  saturation: %d requests (%d tokens each) in %.2f s with 8 clients: %.1f req/s\n",
           ok, MT, sat_s, rate);
    EXPECT_EQ(ok, NSAT);
    rel_driver_fini(&dr);
    rel_workload_free(sat, NSAT);
    long rss0 = rss_kb(rpid);

    /* Three times that, open loop, for a few seconds. */
    double offered = 3 * rate;
    int n = (int)(offered * 6);
    if (n > 1500) {
        n = 1500;
    }
    struct rel_req *load = rel_workload(n, 72, 100, 200, MT, 0);
    rel_driver_init(&dr, load, n, 1, c.port);
    dr.timeout_ms = REL_HANG_MS;
    double *health = calloc(4096, sizeof(*health));
    int n_health = 0;
    long rss_peak = rss0;
    double next_health = 0;
    t0 = h_ms();
    while (dr.done < n && h_ms() - t0 < 60000) {
        /* Start every request whose arrival time has come. */
        double due = (h_ms() - t0) / 1e3 * offered;
        if (dr.next < n && dr.next < due) {
            dr.conc = dr.active + (int)(due - dr.next) + 1;
        } else {
            dr.conc = dr.active;
        }
        rel_drive_step(&dr, 1);
        if (h_ms() >= next_health && n_health < 4096) {
            health[n_health++] = health_ms(c.port);
            next_health = h_ms() + 20;
            long r = rss_kb(rpid);
            rss_peak = r > rss_peak ? r : rss_peak;
        }
    }
    double load_s = (h_ms() - t0) / 1e3;
    int n200 = 0, n429 = 0, n503 = 0, other = 0;
    double *refuse_ms = calloc((size_t)n, sizeof(*refuse_ms));
    int n_ref = 0;
    for (int i = 0; i < n; i++) {
        struct rel_client *cl = &dr.cl[i];
        if (cl->status == 200) {
            n200++;
        } else if (cl->status == 429 || cl->status == 503) {
            n429 += cl->status == 429;
            n503 += cl->status == 503;
            refuse_ms[n_ref++] = cl->t_end - cl->t_start;
        } else {
            other++;
            fprintf(stderr, "\nrequest %d: status %d\n", i, cl->status);
        }
    }
    int bad_health = 0;
    for (int i = 0; i < n_health; i++) {
        bad_health += health[i] < 0;
    }
    double h50 = pct(health, n_health, 50), h99 = pct(health, n_health, 99),
           hmax = pct(health, n_health, 100);
    double r50 = pct(refuse_ms, n_ref, 50), r99 = pct(refuse_ms, n_ref, 99);
    long rss1 = rss_kb(rpid);
    printf("  3x: %d requests offered at %.1f req/s over %.1f s: %d x 200, %d x 429, %d x 503, "
           "%d other, %d hung\n",
           n, offered, load_s, n200, n429, n503, other, dr.hung);
    printf("  429/503 answered in p50 %.1f ms, p99 %.1f ms\n", r50, r99);
    printf("  /health on its own connections (%d probes): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
           n_health, h50, h99, hmax);
    printf("  router VmRSS: %ld KiB before, %ld KiB peak, %ld KiB after\n", rss0, rss_peak, rss1);
    EXPECT_EQ(dr.done, n);
    EXPECT_EQ(dr.hung, 0);
    EXPECT_EQ(other, 0);
    CU_ASSERT(n429 + n503 > n / 3); /* most of the excess is refused... */
    CU_ASSERT(n200 >= ok / 2);      /* ...while the cluster keeps serving */
    EXPECT_EQ(bad_health, 0);
    CU_ASSERT(n_health > 0);
    CU_ASSERT(rss_peak - rss0 < 64 * 1024);
    /* Still running (kill(rpid, 0) would succeed on a zombie too). */
    EXPECT_EQ(waitpid(rpid, NULL, WNOHANG), 0);
    rel_driver_fini(&dr);
    rel_workload_free(load, n);
    free(health);
    free(refuse_ms);

    /* The load is gone: requests succeed again, and nothing is left over. */
    struct rel_req *after = rel_workload(8, 73, 100, 200, MT, 0);
    rel_driver_init(&dr, after, 8, 4, c.port);
    rel_drive_all(&dr, 60000);
    for (int i = 0; i < 8; i++) {
        EXPECT_EQ(dr.cl[i].status, 200);
    }
    rel_driver_fini(&dr);
    rel_workload_free(after, 8);
    EXPECT_EQ(rel_router_metric(&c, "vllm:num_requests_running{model_name=\"llama-3-8b\"}"), 0);
    EXPECT_EQ(rel_router_metric(&c, "vllm:num_requests_waiting{model_name=\"llama-3-8b\"}"), 0);
    CU_ASSERT(rel_wait_all_free(&c, REL_HANG_MS) >= 0);
    rel_cluster_stop(&c);
}

/* ---- 10,000 idle connections ------------------------------------------------ */

static void test_idle_connections(void)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rlim_t want = 10000 + 200;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl); /* inherited by the router */
    int target = 10000;
    if (rl.rlim_max < want) {
        target = (int)rl.rlim_max - 200;
        printf("\n  hard RLIMIT_NOFILE is %llu: holding %d connections instead of 10,000\n",
               (unsigned long long)rl.rlim_max, target);
    }
    char maxc[16];
    snprintf(maxc, sizeof(maxc), "%d", target + 100);
    struct rel_cluster c;
    const char *rargs[] = {"--max-connections", maxc, "--request-timeout-ms", "2000", NULL};
    CU_ASSERT_FATAL(rel_cluster_start(&c, 0, 1, rargs, NULL) == 0);
    pid_t rpid = c.router.pid;
    h_sleep_ms(200); /* the start-up's HTTP probes closed */
    long rss0 = rss_kb(rpid);
    int fds0 = socket_fds(rpid);

    /* Open them in batches of 256. */
    int *fd = malloc((size_t)target * sizeof(*fd));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    double t0 = h_ms();
    int opened = 0, held = 0;
    for (int i = 0; i < target; i++) {
        fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd[i] < 0) {
            fprintf(stderr, "\nsocket %d: %s\n", i, strerror(errno));
            break;
        }
        int rc = connect(fd[i], (struct sockaddr *)&a, sizeof(a));
        if (rc != 0 && errno != EINPROGRESS) {
            fprintf(stderr, "\nconnect %d: %s\n", i, strerror(errno));
            close(fd[i]);
            break;
        }
        opened++;
        if (i % 256 == 255 || i == target - 1) {
            /* The router accepts the batch before the next is opened: the listen backlog
             * is 511, and a SYN dropped on a full backlog is retried only after 1, 3, 7,
             * 15 s, so a router slowed down (ASan, a loaded machine) must not be outrun.
             * The wait ends when the router stops accepting for REL_HANG_MS. */
            double idle0 = h_ms();
            int last = -1;
            while ((held = socket_fds(rpid) - fds0) < opened && h_ms() - idle0 < REL_HANG_MS) {
                if (held > last) {
                    last = held;
                    idle0 = h_ms();
                }
                h_sleep_ms(5);
            }
        }
    }
    EXPECT_EQ(opened, target);
    double open_s = (h_ms() - t0) / 1e3;
    long rss1 = rss_kb(rpid);
    printf("\n  %d idle connections held by the router after %.1f s; router VmRSS %ld -> %ld KiB "
           "(%.2f KiB per connection)\n",
           held, open_s, rss0, rss1, (double)(rss1 - rss0) / (held > 0 ? held : 1));
    CU_ASSERT(held >= opened);

    /* Beside them: completions and /health are served. */
    double lat[5];
    for (int k = 0; k < 5; k++) {
        struct rtc_resp r;
        double t1 = h_ms();
        EXPECT_EQ(
            rtc_post(c.port, "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":4}", &r),
            200);
        lat[k] = h_ms() - t1;
        rtc_resp_free(&r);
    }
    double hl[50];
    int bad_health = 0;
    for (int k = 0; k < 50; k++) {
        hl[k] = health_ms(c.port);
        bad_health += hl[k] < 0;
    }
    double l50 = pct(lat, 5, 50), hmax = pct(hl, 50, 100);
    printf("  beside them: a 4-token completion in %.1f ms (median of 5), /health max %.1f ms of "
           "50\n",
           l50, hmax);
    EXPECT_EQ(bad_health, 0);

    /* Slow clients: a request line trickled a byte every 100 ms gets 408
     * and a close once --request-timeout-ms (2 s) has passed, not before. */
    enum { SLOW = 20 };
    struct rtc_conn slow[SLOW];
    const char *req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    double ts = h_ms();
    for (int i = 0; i < SLOW; i++) {
        CU_ASSERT_FATAL(rtc_connect(&slow[i], c.port) == 0);
    }
    int done[SLOW] = {0}, n408 = 0, n_done = 0;
    double t408[SLOW] = {0};
    for (size_t pos = 0; n_done < SLOW && h_ms() - ts < REL_HANG_MS; pos++) {
        for (int i = 0; i < SLOW; i++) {
            if (done[i]) {
                continue;
            }
            if (pos < strlen(req)) {
                rtc_send(&slow[i], req + pos, 1);
            }
            rtc_fill(&slow[i], 0);
            struct rtc_resp r;
            memset(&r, 0, sizeof(r));
            r.status = -1;
            if (rtc_parse(&slow[i], &r, 0) == 1 || slow[i].eof) {
                n408 += r.status == 408;
                rtc_resp_free(&r);
                t408[i] = h_ms() - ts;
                done[i] = 1;
                n_done++;
            }
        }
        h_sleep_ms(100);
    }
    /* Then the close. */
    int closed = 0;
    double t2 = h_ms();
    for (int i = 0; i < SLOW; i++) {
        while (!slow[i].eof && h_ms() - t2 < REL_HANG_MS) {
            rtc_fill(&slow[i], 100);
        }
        closed += slow[i].eof;
        rtc_close(&slow[i]);
    }
    double tmin = pct(t408, SLOW, 0), tmax = pct(t408, SLOW, 100);
    printf("  %d trickling clients: %d got 408 after %.0f..%.0f ms, %d closed\n", SLOW, n408, tmin,
           tmax, closed);
    EXPECT_EQ(n408, SLOW);
    EXPECT_EQ(closed, SLOW);
    /* Not before the timeout: each client's first byte left after ts, so
     * its 408 cannot come sooner than 2000 ms after it (100 ms of slack for
     * the router's coarse loop clock). This restates what the router must
     * wait; it cannot flake on a slow machine, which only makes it later. */
    CU_ASSERT(tmin >= 1900);

    /* None of the idle ones was dropped meanwhile (nothing to read, no
     * hang-up). */
    int dropped = 0;
    for (int i = 0; i < opened; i++) {
        struct pollfd p = {fd[i], POLLIN, 0};
        dropped += poll(&p, 1, 0) > 0;
    }
    EXPECT_EQ(dropped, 0);
    for (int i = 0; i < opened; i++) {
        close(fd[i]);
    }
    free(fd);
    t0 = h_ms();
    while (h_ms() - t0 < REL_HANG_MS && socket_fds(rpid) - fds0 > 10) {
        h_sleep_ms(100);
    }
    long rss2 = rss_kb(rpid);
    printf("  all closed: the router's sockets back to %d (+%d) after %.1f s, VmRSS %ld KiB\n",
           socket_fds(rpid), socket_fds(rpid) - fds0, (h_ms() - t0) / 1e3, rss2);
    CU_ASSERT(socket_fds(rpid) - fds0 <= 10);
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"again\",\"max_tokens\":2}", &r),
              200);
    rtc_resp_free(&r);
    rel_cluster_stop(&c);
}

/* Under AddressSanitizer, freed memory waits in a quarantine (256 MiB by default) before
 * reuse, so the router's VmRSS would grow by what it frees, not by what it holds. The router
 * inherits this process's ASAN_OPTIONS: a 4 MiB quarantine keeps the memory bound meaningful
 * (use-after-free is still caught within the last 4 MiB freed). */
static void asan_small_quarantine(void)
{
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
    const char *old = getenv("ASAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=4", old ? old : "",
             old && *old ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
#endif
#endif
}

int main(void)
{
    asan_small_quarantine();
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("rel_load", NULL, NULL, NULL, teardown);
    const char *only = getenv("REL_ONLY");
#define ADD(name, fn)                                                                              \
    if (only == NULL || strcmp(only, name) == 0)                                                   \
    CU_add_test(s, name, fn)
    ADD("overload_3x", test_overload);
    ADD("idle_connections", test_idle_connections);
#undef ADD
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
