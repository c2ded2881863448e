/* Security (docs/reliability.md, "## Security"), against the real router and
 * workers:
 *   - every listener binds 127.0.0.1 unless a flag says otherwise (read from
 *     /proc/net/tcp and tcp6, matched to each process by socket inode);
 *   - the cluster secret (--cluster-secret-file, TANDEM_CLUSTER_SECRET_FILE):
 *     workers with it register and serve (remote prefill, KV frames signed,
 *     completions identical to the engine); a worker without it or with a
 *     wrong one is refused at its announcement and at its Hello (counted),
 *     never registered, never given a job;
 *   - forged data-link messages (no tag, a wrong tag) are refused before
 *     decoding and counted, by a decode worker (KV frames) and a prefill
 *     worker (PrefillJobs); a correctly tagged one passes the check;
 *   - a worker takes jobs only from a router that proved the secret (the
 *     test plays the router over PAIR0: challenge, Hello proof checked,
 *     jobs refused until its proof is right, then served);
 *   - the secret appears in no log line (debug level), no /metrics output
 *     and no command line;
 *   - the API key (--api-key-file, --api-key): /v1 without it is 401 in the
 *     OpenAI shape, /health and /metrics stay open, and the key is in no log
 *     line, /metrics, /v1/cluster, /v1/decisions or command line.
 * The cost of the frame tag is bench/bench_frame_tag's (docs/reliability.md). */
#include <dirent.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "ctl.h"
#include "rel_common.h"
#include "wire.h"

static const char SECRET[] = "rel-secret-3f9a7c1e5b2d4068";
static const char WRONG[] = "rel-secret-3f9a7c1e5b2d4069";

static char secret_path[H_URL_MAX], wrong_path[H_URL_MAX], log_path[H_URL_MAX], key_path[H_URL_MAX];

static void teardown(void)
{
    h_cleanup_all();
}

/* One series of the router's /metrics, or NAN (no answer, no series). */
static double router_metric(int port, const char *series)
{
    struct rtc_resp r;
    double v = rtc_get(port, "/metrics", &r) == 200 ? h_metric(r.body, series) : NAN;
    rtc_resp_free(&r);
    return v;
}

/* Polls p's sum of the series starting with prefix until it reaches want
 * (or REL_HANG_MS pass); returns the last value, NAN when there is no such
 * series. */
static double wait_metric_sum(const struct h_proc *p, const char *prefix, double want)
{
    double v = h_proc_metric_sum(p, prefix);
    for (double end = h_ms() + REL_HANG_MS; !isnan(v) && v < want && h_ms() < end;) {
        h_sleep_ms(10);
        v = h_proc_metric_sum(p, prefix);
    }
    return v;
}

static void write_secret(char *path, size_t cap, const char *name, const char *content)
{
    snprintf(path, cap, "%s/%s", h_tmpdir(), name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_FATAL(write(fd, content, strlen(content)) == (ssize_t)strlen(content));
    CU_ASSERT_FATAL(write(fd, "\n", 1) == 1);
    close(fd);
}

static void remove_files(void)
{
    unlink(secret_path);
    unlink(wrong_path);
    unlink(log_path);
    unlink(key_path);
}

/* ---- Listeners ------------------------------------------------------------ */

/* Socket inodes of pid's open files. */
static int socket_inodes(pid_t pid, unsigned long *out, int cap)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    int n = 0;
    if (d == NULL) {
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < cap) {
        char p[320], target[128];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        ssize_t len = readlink(p, target, sizeof(target) - 1);
        if (len <= 0) {
            continue;
        }
        target[len] = '\0';
        unsigned long ino;
        if (sscanf(target, "socket:[%lu]", &ino) == 1) {
            out[n++] = ino;
        }
    }
    closedir(d);
    return n;
}

/* Listening TCP sockets of pid: their local addresses (hex as in
 * /proc/net/tcp[6], "0100007F" for 127.0.0.1) go to addrs. Returns the
 * count. */
static int listeners(pid_t pid, char addrs[][40], int cap)
{
    unsigned long inodes[512];
    int n_ino = socket_inodes(pid, inodes, 512), n = 0;
    const char *files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        char line[512];
        if (fp == NULL) {
            continue;
        }
        while (fgets(line, sizeof(line), fp) != NULL) {
            char local[64], remote[64];
            unsigned st;
            unsigned long ino;
            /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
            if (sscanf(line, " %*d: %63s %63s %x %*s %*s %*s %*d %*d %lu", local, remote, &st,
                       &ino) != 4 ||
                st != 0x0A) {
                continue;
            }
            for (int i = 0; i < n_ino; i++) {
                if (inodes[i] == ino && n < cap) {
                    char *colon = strchr(local, ':');
                    if (colon) {
                        *colon = '\0';
                    }
                    snprintf(addrs[n++], 40, "%s%.32s", f ? "v6:" : "", local);
                }
            }
        }
        fclose(fp);
    }
    return n;
}

static int all_loopback(const struct h_proc *p, int want_at_least)
{
    char addrs[16][40];
    int n = listeners(p->pid, addrs, 16), ok = n >= want_at_least;
    printf("\n  %s (pid %d): %d listening sockets:", p->id, (int)p->pid, n);
    for (int i = 0; i < n; i++) {
        printf(" %s", addrs[i]);
        ok &= strcmp(addrs[i], "0100007F") == 0;
    }
    return ok;
}

static void test_listeners_loopback(void)
{
    /* Defaults, except ports of 0 (others may hold 8000/7000) and tcp for
     * every worker address (the default transport), so every listener is a
     * TCP socket visible in /proc/net. */
    struct h_proc router, p, d, c;
    int port = 0;
    const char *rargs[] = {"--announce", "tcp://127.0.0.1:0", "--log-level", "error", NULL};
    CU_ASSERT_FATAL(rtc_spawn_router(&router, rargs, &port) == 0);
    const char *wargs[] = {"--log-level", "error", NULL};
    CU_ASSERT_FATAL(h_spawn(&p, "tandem-prefill", wargs, REL_HANG_MS) == 0);
    CU_ASSERT_FATAL(h_spawn(&d, "tandem-decode", wargs, REL_HANG_MS) == 0);
    const char *cargs[] = {"--colocated", "--log-level", "error", NULL};
    CU_ASSERT_FATAL(h_spawn(&c, "tandem-decode", cargs, REL_HANG_MS) == 0);
    CU_ASSERT(strncmp(p.control, "tcp://127.0.0.1:", 16) == 0);
    CU_ASSERT(strncmp(d.kv, "tcp://127.0.0.1:", 16) == 0);
    /* router: HTTP + announce; workers: control + data + metrics. */
    CU_ASSERT(all_loopback(&router, 2));
    CU_ASSERT(all_loopback(&p, 3));
    CU_ASSERT(all_loopback(&d, 3));
    CU_ASSERT(all_loopback(&c, 3));
    REL_EXPECT_CLEAN_STOP(&router);
    REL_EXPECT_CLEAN_STOP(&p);
    REL_EXPECT_CLEAN_STOP(&d);
    REL_EXPECT_CLEAN_STOP(&c);

    /* The check sees an explicit wildcard: --host 0.0.0.0 binds 00000000. */
    const char *wide[] = {"--host", "0.0.0.0", "--announce", "none", "--log-level", "error", NULL};
    CU_ASSERT_FATAL(rtc_spawn_router(&router, wide, &port) == 0);
    char addrs[8][40];
    int n = listeners(router.pid, addrs, 8);
    EXPECT_EQ(n, 1);
    EXPECT_STR(n > 0 ? addrs[0] : "", "00000000");
    printf("\n  --host 0.0.0.0: %s\n", n > 0 ? addrs[0] : "-");
    REL_EXPECT_CLEAN_STOP(&router);
}

/* ---- The cluster secret ---------------------------------------------------- */

/* Spawns with stderr (the process's log) appended to log_path. */
static int spawn_logged(struct h_proc *p, const char *bin, const char *const *args)
{
    int saved = dup(2);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, 2);
    close(fd);
    int rc = h_spawn(p, bin, args, REL_HANG_MS);
    dup2(saved, 2);
    close(saved);
    return rc;
}

static int contains(const char *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++) {
        if (memcmp(hay + i, needle, n) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Reads to the end: /proc files have no size, so no seek to the end. */
static char *slurp(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 4096;
    char *b = malloc(cap + 1);
    size_t n;
    while (b != NULL && (n = fread(b + *len, 1, cap - *len, f)) > 0) {
        *len += n;
        if (*len == cap) {
            cap *= 2;
            char *nb = realloc(b, cap + 1);
            if (nb == NULL) {
                free(b);
            }
            b = nb;
        }
    }
    if (b != NULL) {
        b[*len] = '\0';
    }
    fclose(f);
    return b;
}

/* No trace of the secret (whole, or its first 12 bytes) in buf. */
static int secret_free(const char *what, const char *buf, size_t len)
{
    char head[13];
    memcpy(head, SECRET, 12);
    head[12] = '\0';
    int bad = contains(buf, len, SECRET) || contains(buf, len, head);
    if (bad) {
        fprintf(stderr, "\n%s contains the secret\n", what);
    }
    return !bad;
}

static void test_cluster_secret(void)
{
    write_secret(secret_path, sizeof(secret_path), "secret", SECRET);
    write_secret(wrong_path, sizeof(wrong_path), "wrong", WRONG);
    snprintf(log_path, sizeof(log_path), "%s/logs", h_tmpdir());
    unlink(log_path);
    char ann[H_URL_MAX], nosec_ctl[H_URL_MAX], wrong_ctl[H_URL_MAX];
    h_ipc_url(ann, sizeof(ann), "sec-announce");
    h_ipc_url(nosec_ctl, sizeof(nosec_ctl), "sec-nosecret-ctl");
    h_ipc_url(wrong_ctl, sizeof(wrong_ctl), "sec-wrong-ctl");
    char statics[2 * H_URL_MAX + 2];
    snprintf(statics, sizeof(statics), "%s,%s", nosec_ctl, wrong_ctl);

    /* The router takes the secret from the flag, the good workers from the
     * environment variable. */
    struct h_proc router, p, d, nosec, wrong;
    int port = 0;
    /* The heartbeat timeout as in rel_common.h: one step of a Debug worker
     * (the KV cache checked after each) can outlast the 1.5 s default, and
     * the requests below then fail over until they run out of retries. */
    const char *rargs[] = {"--announce",
                           ann,
                           "--workers",
                           statics,
                           "--cluster-secret-file",
                           secret_path,
                           "--routing",
                           rel_routing("pd-always.yaml"),
                           "--heartbeat-timeout-ms",
                           "15000",
                           "--log-level",
                           "debug",
                           NULL};
    int saved = dup(2);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, 2);
    close(fd);
    int rc = rtc_spawn_router(&router, rargs, &port);
    dup2(saved, 2);
    close(saved);
    CU_ASSERT_FATAL(rc == 0);
    setenv(AUTH_SECRET_ENV, secret_path, 1);
    const char *good[] = {"--router", ann, "--log-level", "debug", NULL};
    CU_ASSERT_FATAL(spawn_logged(&p, "tandem-prefill", good) == 0);
    CU_ASSERT_FATAL(spawn_logged(&d, "tandem-decode", good) == 0);
    unsetenv(AUTH_SECRET_ENV);
    const char *nargs[] = {"--router", ann, "--control", nosec_ctl, "--log-level", "debug", NULL};
    CU_ASSERT_FATAL(spawn_logged(&nosec, "tandem-decode", nargs) == 0);
    const char *wargs[] = {
        "--router", ann,           "--control", wrong_ctl, "--cluster-secret-file",
        wrong_path, "--log-level", "debug",     NULL};
    CU_ASSERT_FATAL(spawn_logged(&wrong, "tandem-decode", wargs) == 0);

    /* The two good workers join. Both refusal counters exist from the start,
     * at 0 or more. */
    EXPECT_EQ(rtc_wait_healthy(port, 2, REL_HANG_MS), 2);
    const char *hello_series = "tandem:router_auth_failures_total{kind=\"hello\"}";
    const char *announce_series = "tandem:router_auth_failures_total{kind=\"announce\"}";
    double hello_refused = router_metric(port, hello_series);
    double announce_refused = router_metric(port, announce_series);
    CU_ASSERT(hello_refused >= 0);
    CU_ASSERT(announce_refused >= 0);
    /* The others keep trying (they announce every second, the router
     * redials its static links), and are refused every time: at its
     * Hello, each static link at least once; at its announcement, each
     * worker at least twice. */
    for (double end = h_ms() + REL_HANG_MS;
         (!(hello_refused >= 2) || !(announce_refused >= 4)) && h_ms() < end; h_sleep_ms(100)) {
        hello_refused = router_metric(port, hello_series);
        announce_refused = router_metric(port, announce_series);
    }
    printf("\n  refused: %.0f hellos, %.0f announcements\n", hello_refused, announce_refused);
    CU_ASSERT(hello_refused >= 2);
    CU_ASSERT(announce_refused >= 4);
    /* ...never registered. */
    EXPECT_EQ(rtc_wait_healthy(port, 2, 0), 2);
    struct rtc_resp r;
    CU_ASSERT_FATAL(rtc_get(port, "/v1/cluster", &r) == 200);
    json_t *j = json_loads(r.body, JSON_ALLOW_NUL, NULL);
    json_t *eps = json_object_get(j, "endpoints");
    EXPECT_EQ(json_array_size(eps), 2);
    for (size_t i = 0; i < json_array_size(eps); i++) {
        const char *id = json_string_value(json_object_get(json_array_get(eps, i), "id"));
        CU_ASSERT(id != NULL && (strcmp(id, p.id) == 0 || strcmp(id, d.id) == 0));
    }
    json_decref(j);
    rtc_resp_free(&r);

    /* With the secret everything works: remote prefill (pd-always), KV
     * frames tagged and checked, completions equal the engine's. */
    enum { N = 6 };
    struct rel_req *reqs = rel_workload(N, 61, 100, 400, 16, 2);
    CU_ASSERT_FATAL(rel_reference(reqs, N) == 0);
    struct rel_driver dr;
    rel_driver_init(&dr, reqs, N, 3, port);
    rel_drive_all(&dr, 60000);
    EXPECT_EQ(dr.done, N);
    EXPECT_EQ(rel_check_all(&dr), 0);
    rel_driver_fini(&dr);
    rel_workload_free(reqs, N);
    CU_ASSERT(h_proc_metric(&d, "tandem:kv_frames_installed_total") > 0);
    /* No frame refused: the series exist (every known reason, at 0). */
    EXPECT_EQ(h_proc_metric(&d, "tandem:messages_rejected_total{link=\"data\",reason=\"auth\"}"),
              0);
    EXPECT_EQ(h_proc_metric_sum(&d, "tandem:messages_rejected_total{link=\"data\""), 0);
    /* The refused workers never got a job. */
    EXPECT_EQ(h_proc_metric(&nosec, "vllm:prompt_tokens_total{model_name=\"tiny\"}"), 0);
    EXPECT_EQ(h_proc_metric(&wrong, "vllm:prompt_tokens_total{model_name=\"tiny\"}"), 0);
    CU_ASSERT(h_proc_metric(&d, "vllm:prompt_tokens_total{model_name=\"tiny\"}") > 0);
    /* The worker without a secret refused the router's challenges. Each
     * try races: both sides speak first on a new pipe, and the router
     * closes it on the bare Hello, which may drop its queued challenge.
     * It redials once a second, so one challenge gets through in time. */
    double refused_auth = wait_metric_sum(
        &nosec, "tandem:messages_rejected_total{link=\"control\",reason=\"unexpected_kind\"}", 1);
    CU_ASSERT(refused_auth >= 1);

    /* No secret in any log line, metrics page or command line. */
    struct h_proc *all[] = {&router, &p, &d, &nosec, &wrong};
    int ports[] = {port, p.metrics_port, d.metrics_port, nosec.metrics_port, wrong.metrics_port};
    for (int i = 0; i < 5; i++) {
        struct rtc_resp mr;
        EXPECT_EQ(rtc_get(ports[i], "/metrics", &mr), 200);
        CU_ASSERT(mr.body != NULL && mr.body_len > 0 &&
                  secret_free("/metrics", mr.body, mr.body_len));
        rtc_resp_free(&mr);
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)all[i]->pid);
        size_t len;
        char *cmd = slurp(path, &len);
        CU_ASSERT(cmd != NULL && secret_free("cmdline", cmd, len));
        free(cmd);
    }
    CU_ASSERT(rtc_get(port, "/v1/cluster", &r) == 200 &&
              secret_free("cluster", r.body, r.body_len));
    rtc_resp_free(&r);
    int all_clean = 1;
    for (int i = 0; i < 5; i++) {
        int code = rel_stop(all[i], SIGTERM, REL_STOP_MS);
        if (code != 0) {
            fprintf(stderr, "\n%s exited with %d\n", all[i]->id, code);
            all_clean = 0;
        }
        EXPECT_EQ(code, 0);
    }
    size_t len;
    char *logs = slurp(log_path, &len);
    printf("  %zu bytes of debug logs checked\n", len);
    /* Their stderr went to the log: show a sanitizer's report from there. */
    const char *report = logs != NULL ? strstr(logs, "==ERROR: ") : NULL;
    if (!all_clean && report != NULL) {
        while (report > logs && report[-1] != '\n') {
            report--;
        }
        fprintf(stderr, "%.16384s\n", report);
    }
    CU_ASSERT(logs != NULL && len > 1000);
    CU_ASSERT(logs != NULL && secret_free("the logs", logs, len));
    CU_ASSERT(logs != NULL && contains(logs, len, "refused"));
    free(logs);
    remove_files();
}

/* ---- The API key ------------------------------------------------------------ */

static const char API_KEY[] = "sk-rel-apikey-7c41d2e9b05f1a36";

/* A 401 in the OpenAI error shape: error.message as said, type
 * invalid_request_error, code invalid_api_key, param null; and the RFC 6750
 * challenge. */
static void expect_401(const struct rtc_resp *r, const char *message_start)
{
    EXPECT_EQ(r->status, 401);
    char www[64];
    rtc_header(r->headers, "WWW-Authenticate", www, sizeof(www));
    EXPECT_STR(www, "Bearer");
    json_t *root = r->body ? json_loads(r->body, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *e = json_object_get(root, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    CU_ASSERT(msg != NULL && strncmp(msg, message_start, strlen(message_start)) == 0);
    EXPECT_STR(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    EXPECT_STR(json_string_value(json_object_get(e, "code")), "invalid_api_key");
    CU_ASSERT(json_is_null(json_object_get(e, "param")));
    json_decref(root);
}

static int key_free(const char *what, const char *buf, size_t len)
{
    int bad = buf == NULL || contains(buf, len, API_KEY) || contains(buf, len, API_KEY + 8);
    if (bad) {
        fprintf(stderr, "\n%s contains the API key (or is missing)\n", what);
    }
    return !bad;
}

static int request(int port, const char *method, const char *path, const char *auth,
                   struct rtc_resp *r)
{
    char h[256] = "";
    if (auth != NULL) {
        snprintf(h, sizeof(h), "Authorization: %s\r\n", auth);
    }
    const char *body = strcmp(method, "POST") == 0
                           ? "{\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":4}"
                           : NULL;
    return rtc_request(port, method, path, body, h[0] ? h : NULL, r, 30000);
}

/* A router with --api-key-file (the way tandem up starts it) and a P/D pair
 * over loopback: /v1 without the key, with a wrong one or another scheme is
 * 401 in the OpenAI shape; with it 200; /health and /metrics stay open; the
 * key is in no /metrics, /v1/cluster, /v1/decisions, log line (debug) or
 * command line. Then --api-key KEY: gone from the router's command line once
 * it is READY, and it works. */
static void test_api_key(void)
{
    write_secret(key_path, sizeof(key_path), "api-key", API_KEY);
    snprintf(log_path, sizeof(log_path), "%s/logs", h_tmpdir());
    unlink(log_path);
    char ann[H_URL_MAX];
    h_ipc_url(ann, sizeof(ann), "key-announce");
    struct h_proc router, p, d;
    int port = 0;
    const char *rargs[] = {"--announce", ann, "--api-key-file", key_path, "--log-level",
                           "debug",      NULL};
    int saved = dup(2);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, 2);
    close(fd);
    int rc = rtc_spawn_router(&router, rargs, &port);
    dup2(saved, 2);
    close(saved);
    CU_ASSERT_FATAL(rc == 0);
    const char *wargs[] = {"--router", ann, NULL};
    CU_ASSERT_FATAL(spawn_logged(&p, "tandem-prefill", wargs) == 0);
    CU_ASSERT_FATAL(spawn_logged(&d, "tandem-decode", wargs) == 0);
    EXPECT_EQ(rtc_wait_healthy(port, 2, REL_HANG_MS), 2); /* /health needs no key */

    char bearer[128], wrong[128], longer[128];
    snprintf(bearer, sizeof(bearer), "Bearer %s", API_KEY);
    snprintf(wrong, sizeof(wrong), "Bearer %.*sX", (int)strlen(API_KEY) - 1, API_KEY);
    snprintf(longer, sizeof(longer), "Bearer %sX", API_KEY);
    const char *guarded[][2] = {{"POST", "/v1/completions"},
                                {"GET", "/v1/models"},
                                {"GET", "/v1/cluster"},
                                {"GET", "/v1/decisions"}};
    int n401 = 0;
    struct rtc_resp r;
    for (int i = 0; i < 4; i++) {
        const char *m = guarded[i][0], *path = guarded[i][1];
        request(port, m, path, NULL, &r);
        expect_401(&r, "You didn't provide an API key.");
        rtc_resp_free(&r);
        request(port, m, path, wrong, &r);
        expect_401(&r, "Incorrect API key provided.");
        rtc_resp_free(&r);
        request(port, m, path, longer, &r);
        expect_401(&r, "Incorrect API key provided.");
        rtc_resp_free(&r);
        char basic[160];
        snprintf(basic, sizeof(basic), "Basic %s", API_KEY);
        request(port, m, path, basic, &r);
        expect_401(&r, "The Authorization header must use the Bearer scheme");
        rtc_resp_free(&r);
        n401 += 4;
        EXPECT_EQ(request(port, m, path, bearer, &r), 200);
        CU_ASSERT(r.body != NULL && strstr(r.body, "\"error\"") == NULL);
        rtc_resp_free(&r);
    }
    EXPECT_EQ(request(port, "GET", "/health", NULL, &r), 200);
    rtc_resp_free(&r);
    EXPECT_EQ(request(port, "GET", "/metrics", NULL, &r), 200);
    EXPECT_EQ(h_metric(r.body, "tandem:router_requests_total{code=\"401\"}"), n401);
    CU_ASSERT(key_free("/metrics", r.body, r.body_len));
    rtc_resp_free(&r);
    const char *reads[] = {"/v1/cluster", "/v1/decisions", "/v1/models"};
    for (int i = 0; i < 3; i++) {
        EXPECT_EQ(request(port, "GET", reads[i], bearer, &r), 200);
        CU_ASSERT(key_free(reads[i], r.body, r.body_len));
        rtc_resp_free(&r);
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)router.pid);
    size_t len;
    char *cmd = slurp(path, &len);
    CU_ASSERT(key_free("cmdline", cmd, len));
    CU_ASSERT(cmd != NULL && contains(cmd, len, key_path));
    free(cmd);
    REL_EXPECT_CLEAN_STOP(&d);
    REL_EXPECT_CLEAN_STOP(&p);
    REL_EXPECT_CLEAN_STOP(&router);
    char *logs = slurp(log_path, &len);
    CU_ASSERT(logs != NULL && len > 1000);
    CU_ASSERT(key_free("the logs", logs, len));
    CU_ASSERT(logs != NULL && contains(logs, len, "API key from --api-key-file"));
    CU_ASSERT(logs != NULL && contains(logs, len, "401 GET /v1/models: wrong key"));
    free(logs);

    /* --api-key KEY: wiped from argv once read. */
    const char *kargs[] = {"--announce", "none", "--api-key", API_KEY, NULL};
    CU_ASSERT_FATAL(rtc_spawn_router(&router, kargs, &port) == 0);
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)router.pid);
    cmd = slurp(path, &len);
    CU_ASSERT(key_free("cmdline of --api-key", cmd, len));
    CU_ASSERT(cmd != NULL && contains(cmd, len, "--api-key"));
    free(cmd);
    EXPECT_EQ(request(port, "GET", "/v1/models", bearer, &r), 200);
    rtc_resp_free(&r);
    request(port, "GET", "/v1/models", NULL, &r);
    expect_401(&r, "You didn't provide an API key.");
    rtc_resp_free(&r);
    REL_EXPECT_CLEAN_STOP(&router);
    unlink(key_path);
}

/* ---- Forged data-link messages ---------------------------------------------- */

static void seal_with(void *arg, const void *env, size_t len, uint8_t tag[WIRE_AUTH_TAG_BYTES])
{
    if (arg != NULL) {
        auth_frame_tag(arg, env, len, tag);
    } else {
        memset(tag, 0x5a, WIRE_AUTH_TAG_BYTES);
    }
}

/* A data-link frame of env (+ payload), tagged with key unless key is NULL
 * (then untagged, or with a garbage tag when bad_tag). */
static nng_msg *frame(Tandem__Envelope *env, const void *payload, size_t len,
                      const struct auth_key *key, int bad_tag)
{
    nng_msg *msg = NULL;
    if (key != NULL || bad_tag) {
        CU_ASSERT(wire_frame_pack_msg_sealed(env, payload, len, seal_with, (void *)key, &msg) == 0);
    } else {
        CU_ASSERT(wire_frame_pack_msg(env, payload, len, &msg) == 0);
    }
    return msg;
}

/* PUSH sockets of send_to, kept open until the receiver has counted what
 * they sent (close_senders): a message still queued when its socket closes
 * may be dropped. */
static nng_socket senders[8];
static int n_senders;

/* Sends msg to addr from a new PUSH socket. */
static void send_to(const char *addr, nng_msg *msg)
{
    nng_socket s;
    CU_ASSERT_FATAL(n_senders < 8);
    CU_ASSERT_FATAL(nng_push0_open(&s) == 0);
    senders[n_senders++] = s;
    wire_socket_setup(s, WIRE_LINK_DATA);
    CU_ASSERT_FATAL(nng_dial(s, addr, NULL, 0) == 0);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, REL_HANG_MS);
    EXPECT_EQ(wire_sendmsg(s, msg, 0), 0);
}

static void close_senders(void)
{
    for (int i = 0; i < n_senders; i++) {
        h_nng_close(senders[i]);
    }
    n_senders = 0;
}

static void test_forged_frames(void)
{
    write_secret(secret_path, sizeof(secret_path), "secret", SECRET);
    struct auth_key key, wrong;
    auth_key_init(&key, SECRET, strlen(SECRET));
    auth_key_init(&wrong, WRONG, strlen(WRONG));
    struct h_proc p, d;
    const char *args[] = {"--cluster-secret-file", secret_path, "--log-level", "error", NULL};
    CU_ASSERT_FATAL(h_spawn(&p, "tandem-prefill", args, REL_HANG_MS) == 0);
    CU_ASSERT_FATAL(h_spawn(&d, "tandem-decode", args, REL_HANG_MS) == 0);
    const char *auth_d = "tandem:messages_rejected_total{link=\"data\",reason=\"auth\"}";

    /* KV frames to D: no tag, a garbage tag, a tag of the wrong secret. */
    uint8_t payload[4096];
    memset(payload, 1, sizeof(payload));
    Tandem__KvFrameHeader h = TANDEM__KV_FRAME_HEADER__INIT;
    h.block_index = 0;
    h.layer_count = 1;
    h.token_count = 16;
    h.dtype = TANDEM__KV_DTYPE__KV_DTYPE_F32;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__KV_FRAME, 77, &h);
    send_to(d.kv, frame(&env, payload, sizeof(payload), NULL, 0));
    send_to(d.kv, frame(&env, payload, sizeof(payload), NULL, 1));
    send_to(d.kv, frame(&env, payload, sizeof(payload), &wrong, 0));
    EXPECT_EQ(wait_metric_sum(&d, auth_d, 3), 3);
    /* Tagged with the secret: past the check, refused for what it is (no
     * such request), not for its tag. */
    send_to(d.kv, frame(&env, payload, sizeof(payload), &key, 0));
    EXPECT_EQ(wait_metric_sum(&d, "tandem:kv_frames_rejected_total{reason=\"unknown_request\"}", 1),
              1);
    EXPECT_EQ(h_proc_metric_sum(&d, auth_d), 3);
    EXPECT_EQ(h_proc_metric(&d, "tandem:kv_frames_installed_total"), 0);
    close_senders();

    /* PrefillJobs to P: refused without the secret; with it, P runs the job
     * and ships tagged frames and PrefillDone to the decode address named
     * (here, the test's own PULL socket). */
    nng_socket pull;
    CU_ASSERT_FATAL(nng_pull0_open(&pull) == 0);
    wire_socket_setup(pull, WIRE_LINK_DATA);
    char pull_url[H_URL_MAX];
    h_ipc_url(pull_url, sizeof(pull_url), "sec-pull");
    CU_ASSERT_FATAL(nng_listen(pull, pull_url, NULL, 0) == 0);
    nng_socket_set_ms(pull, NNG_OPT_RECVTIMEO, REL_HANG_MS);
    uint32_t prompt[40];
    h_prompt(prompt, 40, 5, 3, 259);
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    sp.temperature = 0;
    sp.top_p = 1;
    sp.optional_seed_case = TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED;
    sp.seed = 1;
    Tandem__PrefillJob pj = TANDEM__PREFILL_JOB__INIT;
    pj.prompt_token_ids = prompt;
    pj.n_prompt_token_ids = 40;
    pj.decode_kv_address = pull_url;
    pj.sampling = &sp;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__PREFILL_JOB, 99, &pj);
    const char *auth_p = "tandem:messages_rejected_total{link=\"data\",reason=\"auth\"}";
    const char *prompt_tokens = "vllm:prompt_tokens_total{model_name=\"tiny\"}";
    EXPECT_EQ(h_proc_metric(&p, auth_p), 0);
    send_to(p.kv, frame(&env, NULL, 0, NULL, 0));
    send_to(p.kv, frame(&env, NULL, 0, &wrong, 0));
    EXPECT_EQ(wait_metric_sum(&p, auth_p, 2), 2);
    /* Nothing was run: no prompt token, nothing sent to the decode address
     * (the signed job's frames below are all that arrive). */
    EXPECT_EQ(h_proc_metric(&p, prompt_tokens), 0);
    nng_msg *got = NULL;
    nng_socket_set_ms(pull, NNG_OPT_RECVTIMEO, 300);
    EXPECT_EQ(nng_recvmsg(pull, &got, 0), NNG_ETIMEDOUT);
    nng_socket_set_ms(pull, NNG_OPT_RECVTIMEO, REL_HANG_MS);
    send_to(p.kv, frame(&env, NULL, 0, &key, 0));
    int frames = 0, done = 0;
    while (!done && nng_recvmsg(pull, &got, 0) == 0) {
        const uint8_t *b = nng_msg_body(got);
        uint32_t n =
            (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        EXPECT_EQ(auth_frame_check(&key, b + 4, n), 0); /* P signs what it sends */
        struct wire_frame f;
        CU_ASSERT_FATAL(wire_frame_unpack_msg(got, &f) == 0);
        frames += f.env->kind == TANDEM__ENVELOPE__KIND__KV_FRAME;
        done = f.env->kind == TANDEM__ENVELOPE__KIND__PREFILL_DONE;
        wire_frame_fini(&f);
    }
    printf("\n  P ran the signed PrefillJob: %d tagged KV frames and PrefillDone\n", frames);
    EXPECT_EQ(frames, 3); /* 40 tokens: 2 full blocks and a partial one */
    EXPECT_EQ(done, 1);
    EXPECT_EQ(h_proc_metric_sum(&p, auth_p), 2);
    EXPECT_EQ(h_proc_metric(&p, prompt_tokens), 40); /* the signed job alone ran */
    close_senders();
    h_nng_close(pull);
    REL_EXPECT_CLEAN_STOP(&p);
    REL_EXPECT_CLEAN_STOP(&d);
    auth_key_wipe(&key);
    auth_key_wipe(&wrong);
    remove_files();
}

/* ---- The worker's side of the control link ---------------------------------- */

/* The next envelope other than heartbeats and KV events within timeout_ms,
 * or NULL. */
static Tandem__Envelope *recv_env(nng_socket s, int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    Tandem__Envelope *env = NULL;
    for (;;) {
        nng_msg *msg;
        int left = (int)(deadline - h_ms());
        nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, left > 0 ? left : 0);
        if (left <= 0 || nng_recvmsg(s, &msg, 0) != 0) {
            return NULL;
        }
        int rc = wire_unpack(nng_msg_body(msg), nng_msg_len(msg), &env);
        nng_msg_free(msg);
        if (rc == 0 && env->kind != TANDEM__ENVELOPE__KIND__HEARTBEAT &&
            env->kind != TANDEM__ENVELOPE__KIND__KV_EVENTS) {
            return env;
        }
        wire_free(env);
    }
}

static void send_auth(nng_socket s, const uint8_t *nonce, const uint8_t *proof)
{
    Tandem__Auth a = TANDEM__AUTH__INIT;
    if (nonce) {
        a.nonce.data = (uint8_t *)nonce;
        a.nonce.len = AUTH_NONCE_BYTES;
    }
    if (proof) {
        a.proof.data = (uint8_t *)proof;
        a.proof.len = AUTH_TAG_BYTES;
    }
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__AUTH, 0, &a);
    CU_ASSERT(wire_send(s, &env, 0) == 0);
}

static void test_worker_checks_router(void)
{
    write_secret(secret_path, sizeof(secret_path), "secret", SECRET);
    struct auth_key key;
    auth_key_init(&key, SECRET, strlen(SECRET));
    struct h_proc d;
    const char *args[] = {"--cluster-secret-file", secret_path, "--log-level", "error", NULL};
    CU_ASSERT_FATAL(h_spawn(&d, "tandem-decode", args, REL_HANG_MS) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_open(&s) == 0);
    CU_ASSERT_FATAL(nng_dial(s, d.control, NULL, 0) == 0);
    /* The worker challenges us first and says nothing else. */
    Tandem__Envelope *env = recv_env(s, REL_HANG_MS);
    CU_ASSERT_FATAL(env != NULL && env->kind == TANDEM__ENVELOPE__KIND__AUTH);
    EXPECT_EQ(env->auth->nonce.len, AUTH_NONCE_BYTES);
    uint8_t worker_nonce[AUTH_NONCE_BYTES];
    memcpy(worker_nonce, env->auth->nonce.data, sizeof(worker_nonce));
    wire_free(env);
    /* Our challenge: answered by a Hello that proves the secret. */
    uint8_t nonce[AUTH_NONCE_BYTES];
    auth_random(nonce, sizeof(nonce));
    send_auth(s, nonce, NULL);
    env = recv_env(s, REL_HANG_MS);
    CU_ASSERT_FATAL(env != NULL && env->kind == TANDEM__ENVELOPE__KIND__HELLO);
    uint8_t want[AUTH_TAG_BYTES];
    auth_hello_proof(&key, nonce, sizeof(nonce), env->hello->worker_id, env->hello->incarnation,
                     want);
    EXPECT_EQ(env->hello->auth_proof.len, AUTH_TAG_BYTES);
    CU_ASSERT(env->hello->auth_proof.len == AUTH_TAG_BYTES &&
              memcmp(want, env->hello->auth_proof.data, AUTH_TAG_BYTES) == 0);
    wire_free(env);
    /* A job before we proved ourselves, and after a wrong proof: refused,
     * nothing runs. */
    const char *auth_c = "tandem:messages_rejected_total{link=\"control\",reason=\"auth\"}";
    const char *prompt_tokens = "vllm:prompt_tokens_total{model_name=\"tiny\"}";
    EXPECT_EQ(h_proc_metric(&d, auth_c), 0);
    uint32_t prompt[20];
    h_prompt(prompt, 20, 9, 3, 259);
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = 20;
    job.max_tokens = 4;
    job.ignore_eos = 1;
    CU_ASSERT(ctl_send_job(s, 1001, &job, 0) == 0);
    uint8_t bad[AUTH_TAG_BYTES];
    auth_router_proof(&key, nonce, sizeof(nonce), bad); /* proof of the wrong nonce */
    send_auth(s, NULL, bad);
    CU_ASSERT(ctl_send_job(s, 1002, &job, 0) == 0);
    EXPECT_EQ(wait_metric_sum(&d, auth_c, 3), 3);
    env = recv_env(s, 300);
    CU_ASSERT(env == NULL); /* no token, no finish */
    wire_free(env);
    EXPECT_EQ(h_proc_metric(&d, prompt_tokens), 0);
    /* The right proof: the next job runs. */
    auth_router_proof(&key, worker_nonce, sizeof(worker_nonce), want);
    send_auth(s, NULL, want);
    CU_ASSERT(ctl_send_job(s, 1003, &job, 0) == 0);
    struct ctl_stream st;
    ctl_stream_init(&st, 1003);
    while (!st.done && (env = recv_env(s, REL_HANG_MS)) != NULL) {
        if (env->request_id == 1003) {
            ctl_stream_feed(&st, env);
        }
        wire_free(env);
    }
    EXPECT_EQ(st.done, 1);
    EXPECT_EQ(st.n_tokens, 4);
    EXPECT_EQ(st.finish_reason, TANDEM__FINISH__REASON__LENGTH);
    ctl_stream_fini(&st);
    EXPECT_EQ(h_proc_metric_sum(&d, auth_c), 3);
    EXPECT_EQ(h_proc_metric(&d, prompt_tokens), 20); /* job 1003 alone ran */
    h_nng_close(s);
    REL_EXPECT_CLEAN_STOP(&d);
    auth_key_wipe(&key);
    remove_files();
}

int main(void)
{
    h_init();
    atexit(remove_files);
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("rel_security", NULL, NULL, NULL, teardown);
    const char *only = getenv("REL_ONLY");
#define ADD(name, fn)                                                                              \
    if (only == NULL || strcmp(only, name) == 0)                                                   \
    CU_add_test(s, name, fn)
    ADD("listeners_loopback", test_listeners_loopback);
    ADD("cluster_secret", test_cluster_secret);
    ADD("api_key", test_api_key);
    ADD("forged_frames", test_forged_frames);
    ADD("worker_checks_router", test_worker_checks_router);
#undef ADD
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
