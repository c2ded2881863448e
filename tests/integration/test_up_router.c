/* `tandem up` with the real tandem-router (split from test_up.c, which runs
 * it against a stand-in): a completion over HTTP through a started cluster, a
 * worker refused for its model, and a cluster file with a tls section
 * (certificates made at test time with deploy/make-cluster-ca.sh). Each test
 * prints "SKIPPED: tandem-router not built" while it does not exist, and
 * fails then if TANDEM_REQUIRE_ROUTER=1. The same subreaper and exit-line
 * checks as test_up (leftover.h, up_exits.h). */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include "backend.h"
#include "leftover.h"
#include "tiny.h"
#include "up_exits.h"
#include "wire.h"
#include "up_run.h"

/* ---- with the real router ---- */

static int have_router(void)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/tandem-router", bin_dir);
    if (access(path, X_OK) == 0) {
        return 1;
    }
    printf("\nSKIPPED: tandem-router not built (%s)\n", path);
    if (getenv("TANDEM_REQUIRE_ROUTER") && !strcmp(getenv("TANDEM_REQUIRE_ROUTER"), "1")) {
        CU_FAIL("TANDEM_REQUIRE_ROUTER=1 but tandem-router is not built");
    }
    return 0;
}

/* POST body to 127.0.0.1:port path; returns the status, *resp the body. */
static int http_post(int port, const char *path, const char *body, char **resp)
{
    *resp = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    char head[512];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     body ? "POST" : "GET", path, body ? strlen(body) : 0);
    if (write(fd, head, (size_t)n) != n ||
        (body && write(fd, body, strlen(body)) != (ssize_t)strlen(body))) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    double end = now_ms() + 30000;
    while (len < cap - 1 && now_ms() < end && poll(&pf, 1, 1000) >= 0) {
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r == 0 || errno != EAGAIN) {
                break;
            }
        } else {
            len += (size_t)r;
        }
    }
    close(fd);
    buf[len] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
        status = -1;
    }
    char *b = strstr(buf, "\r\n\r\n");
    *resp = strdup(b ? b + 4 : "");
    free(buf);
    return status;
}

static int completion_ok(int port)
{
    char *resp;
    int status = http_post(port, "/v1/completions",
                           "{\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":16}", &resp);
    int ok = status == 200 && strstr(resp, "\"choices\"") && strstr(resp, "\"text\"");
    if (!ok) {
        printf("\ncompletion: HTTP %d: %s\n", status, resp);
    }
    free(resp);
    return ok;
}

/* Retries a completion until one succeeds (after a rejoin the router may
 * still be dialing the worker); 1 if one did within EVENT_MS. */
static int completion_served(int port)
{
    double end = now_ms() + EVENT_MS;
    while (!completion_ok(port)) {
        if (now_ms() > end) {
            return 0;
        }
        sleep_ms(200);
    }
    return 1;
}

/* A llama2.c checkpoint (a small tiny_create model) at path: its file
 * name gives the model its workers announce. */
static void write_checkpoint(const char *path)
{
    struct tiny_config c;
    tiny_default_config(&c);
    c.dim = 64;
    c.hidden_dim = 128;
    c.n_layers = 1;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.max_context = 256;
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    CU_ASSERT_EQUAL(tiny_save(be, path), 0);
    be->ops->destroy(be);
}

/* Workers the router refuses (model 'stories' in the cluster file, a
 * checkpoint named B.bin): tandem up prints the router's reason for each
 * while waiting for them to join, stops everything and exits 1, long before
 * its --timeout. */
static void test_refused(void)
{
    if (!have_router()) {
        return;
    }
    char ckpt[PATH_MAX], cfg[PATH_MAX], run_dir[PATH_MAX], text[2 * PATH_MAX + 256];
    snprintf(ckpt, sizeof(ckpt), "%s/B.bin", tmp_root);
    write_checkpoint(ckpt);
    snprintf(cfg, sizeof(cfg), "%s/refused.yaml", tmp_root);
    snprintf(text, sizeof(text),
             "model: stories\npools:\n  prefill: {count: 1, checkpoint: %s}\n"
             "  decode: {count: 1, checkpoint: %s}\n",
             ckpt, ckpt);
    write_text(cfg, text);
    snprintf(run_dir, sizeof(run_dir), "%s/refused", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"-c", cfg, "--port", "0", "--run-dir", run_dir, NULL}, NULL),
        0);
    double ms = 0;
    CU_ASSERT_EQUAL(up_wait_exit(r, EXIT_MS, &ms), 1);
    printf("\n(refused and stopped after %.0f ms)", ms);
    const char *const exits[] = {
        "router exited: exit code 0",
        "prefill-0 exited: exit code 0|prefill-0 exited: killed by signal 15 (SIGTERM)",
        "decode-0 exited: exit code 0|decode-0 exited: killed by signal 15 (SIGTERM)", NULL};
    expect_up_exits(r->err_path, exits);
    char *err = slurp(r->err_path);
    /* Each worker the router had refused by the poll that saw one (one or
     * both), once. */
    static const char *const names[] = {"prefill-0", "decode-0"};
    int refused = 0;
    for (int i = 0; i < 2; i++) {
        char want[256];
        snprintf(want, sizeof(want),
                 "tandem up: the router refused %s: it serves model 'B', the router 'stories' "
                 "(--model)\n",
                 names[i]);
        CU_ASSERT(count_in(err, want) <= 1);
        refused += count_in(err, want);
    }
    CU_ASSERT(refused >= 1);
    CU_ASSERT_EQUAL(count_in(err, "tandem up: the router refused "), refused);
    char want[PATH_MAX + 256];
    snprintf(want, sizeof(want),
             "fix the cluster file (model, checkpoint, tokenizer, block_size, args) or "
             "TANDEM_CLUSTER_SECRET_FILE, then run tandem up again (the router's log: "
             "%s/router.log)\n",
             run_dir);
    CU_ASSERT_EQUAL(count_in(err, want), 1);
    CU_ASSERT_PTR_NULL(strstr(err, "timed out"));
    if (count_in(err, want) != 1) {
        printf("\n%s\n", err);
    }
    free(err);
    CU_ASSERT_PTR_NULL(strstr(r->out, "READY id=up"));
    CU_ASSERT_EQUAL(leftover_count(), 0);
    free(r);
}

/* The default cluster with the real router: a completion, kill -9 of the
 * decode worker (restarted, rejoins, serves again), kill -9 of the router
 * (restarted, the workers rejoin it, it serves), SIGINT, nothing left. */
static void test_real_router(void)
{
    if (!have_router()) {
        return;
    }
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof(run_dir), "%s/real", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"--port", "0", "--run-dir", run_dir, NULL}, NULL), 0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("tandem up (default cluster) did not come up");
        kill(r->pid, SIGINT);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    const char *h = strstr(r->out, "READY id=up http=127.0.0.1:");
    int port = h ? atoi(h + 27) : 0;
    CU_ASSERT_FATAL(port > 0);
    CU_ASSERT(completion_ok(port));
    char *body;
    CU_ASSERT_EQUAL(http_post(port, "/health", NULL, &body), 200);
    free(body);
    CU_ASSERT_EQUAL(http_post(port, "/v1/cluster", NULL, &body), 200);
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "\"prefill-0\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "\"decode-0\""));
    free(body);
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    pid_t router = banner_pid(r->out, "router"), dec = banner_pid(r->out, "decode-0"),
          pre = banner_pid(r->out, "prefill-0");

    CU_ASSERT_EQUAL(kill(dec, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 1, EVENT_MS), 0);
    CU_ASSERT(completion_served(port));

    /* kill -9 of the router: restarted on the same port, both workers
     * announce themselves to the new one, which serves. */
    CU_ASSERT_EQUAL(kill(router, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "router is ready again (pid ", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "prefill-0 rejoined the router", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 2, EVENT_MS), 0);
    CU_ASSERT(completion_served(port));
    char *err = slurp(r->err_path);
    const char *again = strstr(err, "router is ready again (pid ");
    pid_t router2 = again ? (pid_t)atoi(again + 27) : 0;
    free(err);

    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {router, dec, pre, router2};
    char killed_dec[80], killed_router[80];
    killed_line(killed_dec, sizeof(killed_dec), "decode-0", dec);
    killed_line(killed_router, sizeof(killed_router), "router", router);
    const char *const exits[] = {killed_dec,
                                 killed_router,
                                 "router exited: exit code 0",
                                 "prefill-0 exited: exit code 0",
                                 "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 4);
    free(r);
}

/* ---- tls ---- */

/* Spawns bin_dir/<binary> args... with stdout and stderr to log. */
static pid_t spawn_logged(const char *binary, const char *const *args, const char *log)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/%s", bin_dir, binary);
    const char *argv[32];
    int n = 0;
    argv[n++] = path;
    for (int i = 0; args[i] && n < 31; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    if (posix_spawn(&pid, path, &fa, NULL, (char *const *)argv, environ) != 0) {
        pid = -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

/* Waits for pid to exit; SIGKILL after timeout_ms. Returns its exit code,
 * or -1 (signalled or killed). */
static int wait_pid(pid_t pid, int timeout_ms)
{
    double end = now_ms() + timeout_ms;
    int status;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        sleep_ms(20);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The value of a series ("name{labels}") in a Prometheus text page, or -1. */
static double metric_value(const char *page, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = page; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            return strtod(p + n + 1, NULL);
        }
    }
    return -1;
}

static double get_metric(int port, const char *series)
{
    char *page;
    double v = http_post(port, "/metrics", NULL, &page) == 200 ? metric_value(page, series) : -1;
    free(page);
    return v;
}

/* The port in a banner field "<key>...:PORT" of the process name. */
static int banner_port(const char *out, const char *name, const char *key)
{
    char k[80];
    snprintf(k, sizeof(k), "\n  %s ", name);
    const char *s = strstr(out, k);
    const char *eol = s ? strchr(s + 1, '\n') : NULL;
    const char *f = s ? strstr(s, key) : NULL;
    if (!f || (eol && f > eol)) {
        return 0;
    }
    const char *colon = strchr(f + strlen(key), ':');
    return colon ? atoi(colon + 1) : 0;
}

/* Starts a decode worker by hand, without certificates, announcing over
 * plain tcp:// to 127.0.0.1:announce; waits for its READY line, then for the
 * router on port to list it: up to EVENT_MS when it should be (expect 1), or
 * for 3 s (three announcement periods) when it should not (expect 0: a window
 * that a loaded machine can only make pass, not fail). Stops it (it must exit
 * 0). Returns 1 if it was listed, 0 if not, -1 if it did not start or exit. */
static int plain_worker_listed(int port, int announce, const char *log, int expect)
{
    char ann[64];
    snprintf(ann, sizeof(ann), "tcp://127.0.0.1:%d", announce);
    pid_t pid = spawn_logged("tandem-decode",
                             (const char *[]){"--id", "rogue-0", "--router", ann, "--control",
                                              "tcp://127.0.0.1:0", "--kv", "tcp://127.0.0.1:0",
                                              "--log-level", "warn", NULL},
                             log);
    if (pid <= 0) {
        return -1;
    }
    int listed = wait_file(log, "READY id=rogue-0 ", 1, EVENT_MS) == 0 ? 0 : -1;
    double end = now_ms() + (expect ? EVENT_MS : 3000);
    while (listed == 0 && now_ms() < end) {
        char *body;
        if (http_post(port, "/v1/cluster", NULL, &body) == 200 && strstr(body, "\"rogue-0\"")) {
            listed = 1;
        }
        free(body);
        sleep_ms(100);
    }
    kill(pid, SIGTERM);
    int code = wait_pid(pid, EXIT_MS);
    if (code != 0) {
        printf("\nhand-started worker: exit %d\n", code);
        listed = -1;
    }
    return listed;
}

/* What one greedy completion gave, to compare runs: the "choices" array as
 * the router wrote it (text, logprobs, finish reason). */
struct tls_answer {
    char choices[8192];
    int completion_tokens;
    double remote_prefills; /* router: tandem:pd_decisions_total{prefill="remote"} */
    double kv_frames;       /* decode-0: tandem:kv_frames_installed_total */
};

static int answer(int port, int decode_metrics, struct tls_answer *a)
{
    char *resp;
    memset(a, 0, sizeof(*a));
    int status = http_post(port, "/v1/completions",
                           "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                           "\"temperature\":0,\"ignore_eos\":true,\"logprobs\":1}",
                           &resp);
    const char *c = strstr(resp, "\"choices\":");
    const char *u = c ? strstr(c, ",\"usage\":") : NULL;
    const char *t = u ? strstr(u, "\"completion_tokens\":") : NULL;
    if (status != 200 || !u || !t || (size_t)(u - c) >= sizeof(a->choices)) {
        printf("\ncompletion: HTTP %d: %s\n", status, resp);
        free(resp);
        return -1;
    }
    snprintf(a->choices, sizeof(a->choices), "%.*s", (int)(u - c), c);
    a->completion_tokens = atoi(t + 20);
    free(resp);
    a->remote_prefills = get_metric(port, "tandem:pd_decisions_total{prefill=\"remote\"}");
    a->kv_frames = get_metric(decode_metrics, "tandem:kv_frames_installed_total");
    return 0;
}

/* Writes a cluster file: 1 prefill + 1 decode, pd-always routing (every
 * prompt prefilled on prefill-0, its KV shipped to decode-0), over tcp, with
 * or without a tls section (paths relative to the file). */
static void write_tls_cluster(const char *path, int tls)
{
    char text[PATH_MAX + 512];
    snprintf(text, sizeof(text),
             "name: %s\n%s"
             "routing: %s/deploy/routing/pd-always.yaml\n"
             "pools:\n  prefill: {count: 1}\n  decode: {count: 1}\n",
             tls ? "tls" : "plain",
             tls ? "tls:\n  ca: certs/ca.crt\n  cert: certs/127.0.0.1.crt\n"
                   "  key: certs/127.0.0.1.key\n"
                 : "transport: {kind: tcp}\n",
             src_dir);
    write_text(path, text);
}

/* Starts the cluster file cfg (--port 0), returns the router's HTTP port and
 * the decode worker's metrics port, or 0. */
static int tls_up(struct up_run *r, const char *cfg, const char *run_dir, int *decode_metrics)
{
    if (up_start(r, (const char *[]){"-c", cfg, "--port", "0", "--run-dir", run_dir, NULL}, NULL) !=
        0) {
        return 0;
    }
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        kill(r->pid, SIGINT);
        up_wait_exit(r, EXIT_MS, NULL);
        return 0;
    }
    const char *h = strstr(r->out, "READY id=up http=127.0.0.1:");
    *decode_metrics = banner_port(r->out, "decode-0", "metrics=http://127.0.0.1");
    return h ? atoi(h + 27) : 0;
}

/* A cluster file with a tls section: the same cluster over tcp:// first
 * (the reference answer), then over tls+tcp:// with certificates made by
 * deploy/make-cluster-ca.sh: every process got the three files, the router
 * lists both workers at tls+tcp:// addresses, a completion prefilled on
 * prefill-0 and shipped to decode-0 over TLS gives exactly the reference
 * tokens and logprobs, a worker started by hand without certificates
 * (plain tcp:// to the announce port) is never listed, one pointed at the
 * tls+tcp:// address without them exits 2, and a killed worker is restarted
 * and rejoins over TLS. */
static void test_tls(void)
{
    if (!have_router()) {
        return;
    }
    char cmd[3 * PATH_MAX], certs[PATH_MAX + 16];
    snprintf(certs, sizeof(certs), "%s/certs", tmp_root);
    snprintf(cmd, sizeof(cmd), "'%s/deploy/make-cluster-ca.sh' '%s' 127.0.0.1 >/dev/null 2>&1",
             src_dir, certs);
    if (system(cmd) != 0) {
        printf("\n%s failed (openssl installed?)\n", cmd);
        CU_FAIL_FATAL("deploy/make-cluster-ca.sh");
    }
    char plain_cfg[PATH_MAX + 32], tls_cfg[PATH_MAX + 32], run_dir[PATH_MAX + 32];
    snprintf(plain_cfg, sizeof(plain_cfg), "%s/plain.yaml", tmp_root);
    snprintf(tls_cfg, sizeof(tls_cfg), "%s/tls.yaml", tmp_root);
    write_tls_cluster(plain_cfg, 0);
    write_tls_cluster(tls_cfg, 1);

    /* The reference: plain tcp://. */
    struct up_run *r = malloc(sizeof(*r));
    struct tls_answer want, got;
    int dm = 0;
    snprintf(run_dir, sizeof(run_dir), "%s/plain", tmp_root);
    int port = tls_up(r, plain_cfg, run_dir, &dm);
    if (port <= 0 || dm <= 0) {
        CU_FAIL("the plain tcp cluster did not come up");
        free(r);
        return;
    }
    CU_ASSERT_EQUAL(answer(port, dm, &want), 0);
    /* Checking the check below: without tls the same hand-started worker
     * joins. */
    char rogue_log[PATH_MAX + 32];
    snprintf(rogue_log, sizeof(rogue_log), "%s/rogue-plain.log", tmp_root);
    CU_ASSERT_EQUAL(plain_worker_listed(port,
                                        banner_port(r->out, "router", "announce=tcp://127.0.0.1"),
                                        rogue_log, 1),
                    1);
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    check_clean_stop(r, 0, clean_stop_1p1d, NULL, NULL, 0);
    CU_ASSERT_EQUAL(want.completion_tokens, 8);
    CU_ASSERT_EQUAL(want.remote_prefills, 1);
    CU_ASSERT(want.kv_frames >= 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(want.choices, "\"finish_reason\":\"length\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(want.choices, "\"token_logprobs\":["));

    /* The same cluster with the tls section. */
    snprintf(run_dir, sizeof(run_dir), "%s/tls", tmp_root);
    port = tls_up(r, tls_cfg, run_dir, &dm);
    if (port <= 0 || dm <= 0) {
        CU_FAIL("the tls cluster did not come up");
        free(r);
        return;
    }
    int announce = banner_port(r->out, "router", "announce=tls+tcp://127.0.0.1");
    CU_ASSERT(announce > 0);
    CU_ASSERT_EQUAL(count_in(r->out, "control=tls+tcp://127.0.0.1:"), 2);
    CU_ASSERT_EQUAL(count_in(r->out, "kv=tls+tcp://127.0.0.1:"), 2);
    char want_s[4 * PATH_MAX];
    snprintf(want_s, sizeof(want_s), "mutual TLS on every NNG link (tls+tcp://), CA %s/ca.crt\n",
             certs);
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, want_s));
    /* Every process got the same three files (absolute: resolved against the
     * cluster file's directory). */
    snprintf(want_s, sizeof(want_s), "%s/commands.txt", run_dir);
    char *cmds = slurp(want_s);
    snprintf(want_s, sizeof(want_s),
             " --tls-ca %s/ca.crt --tls-cert %s/127.0.0.1.crt --tls-key %s/127.0.0.1.key ", certs,
             certs, certs);
    CU_ASSERT_EQUAL(count_in(cmds, want_s), 3);
    CU_ASSERT_EQUAL(count_in(cmds, "tcp://"), count_in(cmds, "tls+tcp://"));
    free(cmds);

    /* The router lists both workers, healthy, at the tls+tcp:// addresses
     * they announced (and dialed back over TLS). */
    char *body;
    CU_ASSERT_EQUAL(http_post(port, "/v1/cluster", NULL, &body), 200);
    snprintf(want_s, sizeof(want_s), "\"announce\":\"tls+tcp://127.0.0.1:%d\"", announce);
    CU_ASSERT_PTR_NOT_NULL(strstr(body, want_s));
    /* TLS links stay on NNG (uvsp has no TLS). */
    CU_ASSERT_EQUAL(count_in(body, "\"healthy\":true,\"link\":\"up\",\"link_transport\":\"nng\","
                                   "\"control_address\":\"tls+tcp://127.0.0.1:"),
                    2);
    CU_ASSERT_EQUAL(count_in(body, "\"kv_address\":\"tls+tcp://127.0.0.1:"), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "{\"id\":\"prefill-0\",\"role\":\"prefill\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "{\"id\":\"decode-0\",\"role\":\"decode\""));
    free(body);

    /* A completion: prefilled on prefill-0, KV shipped over TLS to decode-0,
     * exactly the tokens and logprobs of the tcp:// run. */
    CU_ASSERT_EQUAL(answer(port, dm, &got), 0);
    CU_ASSERT_STRING_EQUAL(got.choices, want.choices);
    CU_ASSERT_EQUAL(got.completion_tokens, 8);
    CU_ASSERT_EQUAL(got.remote_prefills, 1);
    CU_ASSERT_EQUAL(got.kv_frames, want.kv_frames);

    /* By hand, without certificates: a worker announcing over plain tcp://
     * to the router's announce port starts (READY) but never gets through
     * the handshake, so the router never lists it. */
    char ann[64], log[PATH_MAX + 32];
    snprintf(log, sizeof(log), "%s/rogue.log", tmp_root);
    CU_ASSERT_EQUAL(plain_worker_listed(port, announce, log, 0), 0);
    CU_ASSERT_EQUAL(http_post(port, "/v1/cluster", NULL, &body), 200);
    CU_ASSERT_EQUAL(count_in(body, "\"healthy\":true"), 2);
    free(body);
    /* And pointed at the tls+tcp:// address without certificates, a worker
     * refuses to start. */
    snprintf(ann, sizeof(ann), "tls+tcp://127.0.0.1:%d", announce);
    pid_t bare =
        spawn_logged("tandem-decode",
                     (const char *[]){"--id", "bare-0", "--router", ann, "--control",
                                      "tcp://127.0.0.1:0", "--kv", "tcp://127.0.0.1:0", NULL},
                     log);
    CU_ASSERT_FATAL(bare > 0);
    CU_ASSERT_EQUAL(wait_pid(bare, EXIT_MS), 2);
    CU_ASSERT_EQUAL(wait_file(log, "tls+tcp:// needs", 1, 0), 0);
    /* kill -9 of decode-0: restarted, it listens on tls+tcp:// again and
     * rejoins; the cluster serves the same answer (its KV again shipped over
     * TLS). */
    pid_t dec = banner_pid(r->out, "decode-0");
    CU_ASSERT_EQUAL(kill(dec, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 1, EVENT_MS), 0);
    struct tls_answer again;
    int served = 0;
    for (double end = now_ms() + EVENT_MS; !served && now_ms() < end;) {
        served = answer(port, dm, &again) == 0;
        if (!served) {
            sleep_ms(200);
        }
    }
    CU_ASSERT(served);
    CU_ASSERT_STRING_EQUAL(again.choices, want.choices);
    CU_ASSERT(again.remote_prefills >= 2); /* more if a try came before the link */

    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {banner_pid(r->out, "router"), banner_pid(r->out, "prefill-0"), dec};
    char killed_dec[80];
    killed_line(killed_dec, sizeof(killed_dec), "decode-0", dec);
    const char *const exits[] = {killed_dec, "router exited: exit code 0",
                                 "prefill-0 exited: exit code 0", "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, NULL, pids, 3);
    free(r);
}

static void add_tests(CU_pSuite suite)
{
    CU_add_test(suite, "real_router", test_real_router);
    CU_add_test(suite, "refused", test_refused);
    CU_add_test(suite, "tls", test_tls);
}

int main(void)
{
    return up_main("test_up_router", add_tests);
}
