/* `tandem up` with real processes: flags and --dry-run; the workers-only
 * cluster (start, kill -9 and restart, stop on SIGINT with no process and no
 * ipc file left); a failing worker at start; and the router path against a
 * stand-in router that keeps the tandem-router contract (this executable,
 * run under the name tandem-router: READY line, workers' announcements on
 * NNG, GET /health and /v1/cluster), for joining, rejoining after a worker or
 * router crash, the start timeout and the SIGKILL deadline. The tests that
 * need the real tandem-router are in test_up_router.c; what both run
 * `tandem up` with is up_run.h.
 *
 * The test process is a child subreaper (leftover.h), so any process `tandem
 * up` leaked would descend from it; after each run it checks that none does,
 * running or exited. Every process tandem up started must have exited as the
 * test expects (tandem up's exit lines, up_exits.h): 0 on the stop's SIGTERM,
 * killed by signal 9 where the test killed it, and no other exit.
 *
 * No wall-clock bounds: each wait is for an event (a line on stdout, in a
 * log, an exit), with a generous timeout that only catches a hang. */
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

/* ------------------------------------------------------------------ */
/* The stand-in router                                                 */
/* ------------------------------------------------------------------ */

static volatile sig_atomic_t fake_stop;

static void fake_on_term(int sig)
{
    (void)sig;
    fake_stop = 1;
}

struct fake_worker {
    char id[128];
    char role[16];
    double seen_ms;
};

static void fake_reply(int fd, int status, const char *body)
{
    char head[256];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: "
                     "%zu\r\nConnection: close\r\n\r\n",
                     status, strlen(body));
    if (write(fd, head, (size_t)n) < 0 || write(fd, body, strlen(body)) < 0) {
        return;
    }
}

static int fake_router_main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *announce = NULL;
    int port = 8000;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--host")) {
            host = argv[++i];
        } else if (!strcmp(argv[i], "--port")) {
            port = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--announce")) {
            announce = argv[++i];
        }
    }
    if (getenv("FAKE_ROUTER_IGNORE_TERM")) {
        signal(SIGTERM, SIG_IGN);
    } else {
        signal(SIGTERM, fake_on_term);
    }
    signal(SIGINT, fake_on_term);
    nng_socket s;
    int rv;
    if (!announce || (rv = nng_pull0_open(&s)) != 0 || (rv = nng_listen(s, announce, NULL, 0))) {
        fprintf(stderr, "fake router: cannot listen on %s\n", announce ? announce : "(none)");
        return 1;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    socklen_t alen = sizeof(a);
    if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 16) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) != 0) {
        fprintf(stderr, "fake router: cannot listen on %s:%d: %s\n", host, port, strerror(errno));
        return 1;
    }
    printf("READY id=router http=127.0.0.1:%d announce=%s\n", ntohs(a.sin_port), announce);
    fflush(stdout);
    fprintf(stderr, "fake router: up\n");
    int nfd;
    nng_socket_get_int(s, NNG_OPT_RECVFD, &nfd);
    struct fake_worker seen[64];
    int n_seen = 0;
    while (!fake_stop) {
        struct pollfd pf[2] = {{.fd = lfd, .events = POLLIN}, {.fd = nfd, .events = POLLIN}};
        if (poll(pf, 2, 100) <= 0) {
            continue;
        }
        Tandem__Envelope *env;
        while (wire_recv(s, NNG_FLAG_NONBLOCK, &env) == 0) {
            if (env->body_case == TANDEM__ENVELOPE__BODY_HELLO) {
                const Tandem__WorkerHello *h = env->hello;
                int i = 0;
                while (i < n_seen && strcmp(seen[i].id, h->worker_id) != 0) {
                    i++;
                }
                if (i == n_seen && n_seen < 64) {
                    n_seen++;
                    snprintf(seen[i].id, sizeof(seen[i].id), "%s", h->worker_id);
                    fprintf(stderr, "fake router: hello from %s\n", h->worker_id);
                }
                if (i < 64) {
                    seen[i].seen_ms = now_ms();
                    snprintf(seen[i].role, sizeof(seen[i].role), "%s",
                             h->role == TANDEM__WORKER_HELLO__ROLE__PREFILL     ? "prefill"
                             : h->role == TANDEM__WORKER_HELLO__ROLE__COLOCATED ? "colocated"
                                                                                : "decode");
                }
            }
            wire_free(env);
        }
        if (!(pf[0].revents & POLLIN)) {
            continue;
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            continue;
        }
        char req[4096];
        size_t got = 0;
        struct pollfd rp = {.fd = fd, .events = POLLIN};
        while (got < sizeof(req) - 1 && poll(&rp, 1, 1000) > 0) {
            ssize_t r = read(fd, req + got, sizeof(req) - 1 - got);
            if (r <= 0) {
                break;
            }
            got += (size_t)r;
            req[got] = '\0';
            if (strstr(req, "\r\n\r\n")) {
                break;
            }
        }
        req[got] = '\0';
        if (!strncmp(req, "GET /health ", 12)) {
            fake_reply(fd, 200, "{\"status\":\"ok\"}");
        } else if (!strncmp(req, "GET /v1/cluster ", 16)) {
            char body[8192];
            size_t o = (size_t)snprintf(body, sizeof(body), "{\"endpoints\":[");
            int healthy_ok = getenv("FAKE_ROUTER_NO_HEALTH") == NULL;
            for (int i = 0; i < n_seen; i++) {
                int healthy = healthy_ok && now_ms() - seen[i].seen_ms < 2500;
                o += (size_t)snprintf(
                    body + o, sizeof(body) - o, "%s{\"id\":\"%s\",\"role\":\"%s\",\"healthy\":%s}",
                    i ? "," : "", seen[i].id, seen[i].role, healthy ? "true" : "false");
            }
            snprintf(body + o, sizeof(body) - o, "]}");
            fake_reply(fd, 200, body);
        } else {
            fake_reply(fd, 404, "{\"error\":{\"message\":\"not in the stand-in router\"}}");
        }
        close(fd);
    }
    fprintf(stderr, "fake router: stopping\n");
    nng_close(s);
    close(lfd);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Tests                                                               */
/* ------------------------------------------------------------------ */

static void test_cli(void)
{
    static char out[1 << 16], err[1 << 16];
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--help", NULL}, out, sizeof(out), NULL, 0), 0);
    static const char *const flags[] = {"--config",
                                        "--run-dir",
                                        "--dry-run",
                                        "--print-config",
                                        "--no-router",
                                        "--port",
                                        "--bin-dir",
                                        "--timeout",
                                        "--stop-timeout",
                                        "--restart-backoff",
                                        "--restart-backoff-max",
                                        "--healthy-reset",
                                        "--log-level",
                                        "--help",
                                        "--version"};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        if (!strstr(out, flags[i])) {
            printf("\n--help lacks %s\n", flags[i]);
            CU_FAIL("a flag is missing from --help");
        }
    }
    /* The defaults docs/up.md's flag table gives. */
    static const char *const defaults[][2] = {{"--port N ", "-1"},
                                              {"--timeout X ", "60"},
                                              {"--stop-timeout X ", "4.5"},
                                              {"--restart-backoff X ", "0.5"},
                                              {"--restart-backoff-max X ", "10"},
                                              {"--healthy-reset X ", "30"},
                                              {"--log-level CHOICE ", "info"}};
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
        char key[64], want[64];
        snprintf(key, sizeof(key), "\n  %s", defaults[i][0]);
        snprintf(want, sizeof(want), "[default: %s]\n", defaults[i][1]);
        const char *line = strstr(out, key);
        const char *eol = line ? strchr(line + 1, '\n') : NULL;
        size_t wl = strlen(want);
        if (!eol || (size_t)(eol + 1 - line) < wl || strncmp(eol + 1 - wl, want, wl) != 0) {
            printf("\n--help: %s lacks %s", defaults[i][0], want);
            CU_FAIL("a default in --help");
        }
    }
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "Security: a tls: section in the cluster file (ca, cert, key"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "TANDEM_CLUSTER_SECRET_FILE=FILE"));
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--version", NULL}, out, sizeof(out), NULL, 0), 0);
    CU_ASSERT_EQUAL(strncmp(out, "tandem ", 7), 0);
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--bogus", NULL}, NULL, 0, err, sizeof(err)), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--bogus"));
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--port", "x", NULL}, NULL, 0, err, sizeof(err)),
                    2);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--port"));
    CU_ASSERT_EQUAL(run_simple((const char *[]){"extra", NULL}, NULL, 0, NULL, 0), 2);
    CU_ASSERT_EQUAL(
        run_simple((const char *[]){"-c", "/no/such.yaml", NULL}, NULL, 0, err, sizeof(err)), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "tandem up: /no/such.yaml: cannot open: No such file"));

    /* A bad cluster file: exit 2, the message names the key and line. */
    char bad[PATH_MAX];
    snprintf(bad, sizeof(bad), "%s/bad.yaml", tmp_root);
    FILE *f = fopen(bad, "w");
    fputs("name: bad\npools:\n  decode:\n    count: 1\n    kv_blocs: 9\n", f);
    fclose(f);
    CU_ASSERT_EQUAL(
        run_simple((const char *[]){"-c", bad, "--dry-run", NULL}, NULL, 0, err, sizeof(err)), 2);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof(want), "tandem up: %s:5: pools.decode.kv_blocs: unknown key", bad);
    if (!strstr(err, want)) {
        printf("\nwant %s\ngot %s\n", want, err);
        CU_FAIL("bad cluster file message");
    }

    /* --print-config round-trips through -c. */
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--print-config", NULL}, out, sizeof(out), NULL, 0),
                    0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "name: \"default\"\n"));
    char printed[PATH_MAX];
    snprintf(printed, sizeof(printed), "%s/printed.yaml", tmp_root);
    f = fopen(printed, "w");
    fputs(out, f);
    fclose(f);
    CU_ASSERT_EQUAL(run_simple((const char *[]){"-c", printed, "--print-config", NULL}, err,
                               sizeof(err), NULL, 0),
                    0);
    CU_ASSERT_STRING_EQUAL(strchr(err, '\n'), strchr(out, '\n')); /* after the source line */
}

static void test_dry_run(void)
{
    static char out[1 << 16];
    CU_ASSERT_EQUAL(run_simple((const char *[]){"--dry-run", "--bin-dir", "/opt/t", NULL}, out,
                               sizeof(out), NULL, 0),
                    0);
    CU_ASSERT_PTR_NOT_NULL(strstr(
        out, "# router\n/opt/t/tandem-router --host 127.0.0.1 --port 8000 --announce "
             "ipc:///tmp/tandem-up-XXXXXX/announce.ipc --model tiny --block-size 16 --log-level "
             "info --routing "));
    CU_ASSERT_PTR_NOT_NULL(strstr(
        out, "# prefill-0\n/opt/t/tandem-prefill --id prefill-0 --control "
             "ipc:///tmp/tandem-up-XXXXXX/prefill-0.ctl.ipc --kv "
             "ipc:///tmp/tandem-up-XXXXXX/prefill-0.kv.ipc --metrics-port 0 --router "
             "ipc:///tmp/tandem-up-XXXXXX/announce.ipc --backend tiny --model tiny --block-size "
             "16 --log-level info\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "# decode-0\n/opt/t/tandem-decode --id decode-0 "));
    CU_ASSERT_EQUAL(count_in(out, "\n/opt/t/"), 3);
    /* Nothing was started or created. */
    CU_ASSERT_EQUAL(leftover_count(), 0);

    CU_ASSERT_EQUAL(
        run_simple((const char *[]){"--dry-run", "--no-router", "--bin-dir", "/b", NULL}, out,
                   sizeof(out), NULL, 0),
        0);
    CU_ASSERT_PTR_NULL(strstr(out, "tandem-router"));
    CU_ASSERT_PTR_NULL(strstr(out, "--router"));
    CU_ASSERT_EQUAL(count_in(out, "\n/b/"), 2);

    /* Every example cluster: its processes and flags. */
    char dir[PATH_MAX + 32];
    snprintf(dir, sizeof(dir), "%s/deploy/clusters", src_dir);
    DIR *d = opendir(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".yaml")) {
            continue;
        }
        char path[PATH_MAX + 320];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        char *text = slurp(path);
        int tls = strstr(text, "\ntls:") != NULL;
        free(text);
        if (tls) {
            mirror_example(e->d_name, path, sizeof(path));
        }
        int code = run_simple((const char *[]){"-c", path, "--dry-run", "--bin-dir", "/b", NULL},
                              out, sizeof(out), NULL, 0);
        CU_ASSERT_EQUAL(code, 0);
        CU_ASSERT_EQUAL(count_in(out, "\n/b/tandem-router "), 1);
        int workers = count_in(out, "\n/b/tandem-prefill ") + count_in(out, "\n/b/tandem-decode ");
        if (strstr(e->d_name, "x4") || strstr(e->d_name, "2p2d")) {
            CU_ASSERT_EQUAL(workers, 4);
        } else if (strstr(e->d_name, "x8") || strstr(e->d_name, "4p4d")) {
            CU_ASSERT_EQUAL(workers, 8);
        } else {
            CU_ASSERT_EQUAL(workers, 2);
        }
        if (strstr(e->d_name, "colocated")) {
            CU_ASSERT_EQUAL(count_in(out, " --colocated"), workers);
        }
        if (strstr(e->d_name, "sim-")) {
            CU_ASSERT_EQUAL(count_in(out, " --backend sim --model llama-3-70b --gpu h100-sxm "
                                          "--tp 4"),
                            workers);
            CU_ASSERT_PTR_NOT_NULL(strstr(out, "--announce tcp://127.0.0.1:8001"));
        }
        /* Every process gets the three files; every NNG address is
         * tls+tcp://. Without tls, no TLS flag and no tls+tcp://. */
        CU_ASSERT_EQUAL(count_in(out, " --tls-ca "), tls ? workers + 1 : 0);
        CU_ASSERT_EQUAL(count_in(out, " --tls-cert "), tls ? workers + 1 : 0);
        CU_ASSERT_EQUAL(count_in(out, " --tls-key "), tls ? workers + 1 : 0);
        /* announce, 3 per worker (control, kv, router), the comment */
        CU_ASSERT_EQUAL(count_in(out, "tls+tcp://"), tls ? 3 * workers + 2 : 0);
        if (tls) {
            char want[PATH_MAX + 200];
            snprintf(want, sizeof(want),
                     "--announce tls+tcp://127.0.0.1:8001 --tls-ca %s/mirror/run/certs/ca.crt "
                     "--tls-cert %s/mirror/run/certs/127.0.0.1.crt --tls-key "
                     "%s/mirror/run/certs/127.0.0.1.key --model tiny",
                     tmp_root, tmp_root, tmp_root);
            CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
            CU_ASSERT_EQUAL(count_in(out, " --control tls+tcp://127.0.0.1:0 --kv "
                                          "tls+tcp://127.0.0.1:0 "),
                            workers);
            CU_ASSERT_EQUAL(count_in(out, " --router tls+tcp://127.0.0.1:8001 --tls-ca "), workers);
            CU_ASSERT_PTR_NOT_NULL(strstr(out, "# tls: every NNG address is tls+tcp://"));
        }
        files++;
    }
    closedir(d);
    CU_ASSERT(files >= 11);

    /* ipc socket paths are at most 107 bytes (sun_path): with the longest
     * name tandem up gives a socket, transport.dir may have 82. */
    char dir82[128], cfg[PATH_MAX + 32];
    snprintf(dir82, sizeof(dir82), "/tmp/%077d", 0);
    CU_ASSERT_EQUAL(strlen(dir82), 82);
    snprintf(cfg, sizeof(cfg), "%s/ipc-dir.yaml", tmp_root);
    char text[PATH_MAX + 512];
    snprintf(
        text, sizeof(text),
        "transport:\n  kind: ipc\n  dir: %s\npools: {prefill: {count: 1}, decode: {count: 1}}\n",
        dir82);
    write_text(cfg, text);
    CU_ASSERT_EQUAL(run_simple((const char *[]){"-c", cfg, "--dry-run", "--bin-dir", "/b", NULL},
                               out, sizeof(out), NULL, 0),
                    0);
    snprintf(text, sizeof(text), " --control ipc://%s/prefill-0.ctl.ipc ", dir82);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, text));
    static char err[1 << 16];
    snprintf(
        text, sizeof(text),
        "transport:\n  kind: ipc\n  dir: %s0\npools: {prefill: {count: 1}, decode: {count: 1}}\n",
        dir82);
    write_text(cfg, text);
    CU_ASSERT_EQUAL(run_simple((const char *[]){"-c", cfg, "--dry-run", "--bin-dir", "/b", NULL},
                               NULL, 0, err, sizeof(err)),
                    2);
    snprintf(text, sizeof(text),
             "%s:3: transport.dir: '%s0' is too long for ipc socket paths (at most 82 bytes)", cfg,
             dir82);
    if (!strstr(err, text)) {
        printf("\nwant %s\ngot %s\n", text, err);
        CU_FAIL("transport.dir length limit");
    }
}

/* Workers only: start, kill -9 a worker twice (restarted after 0.5 s, the
 * default first delay, then after 0.7 s: the doubled 1 s capped by
 * --restart-backoff-max 0.7, so the live supervisor runs the policy with the
 * flag's value; READY again in its log each time), SIGINT (every process
 * exits 0, nothing left). */
static void test_workers_only(void)
{
    struct up_run *r = malloc(sizeof(*r));
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof(run_dir), "%s/workers-only", tmp_root);
    CU_ASSERT_EQUAL_FATAL(up_start(r,
                                   (const char *[]){"--no-router", "--run-dir", run_dir,
                                                    "--restart-backoff-max", "0.7", NULL},
                                   NULL),
                          0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("tandem up --no-router did not come up");
        kill(r->pid, SIGINT);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    char want[PATH_MAX + 64];
    snprintf(want, sizeof(want), "READY id=up http=none run_dir=%s\n", run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, "cluster 'default' is up: 2 workers, no router"));
    pid_t pre = banner_pid(r->out, "prefill-0"), dec = banner_pid(r->out, "decode-0");
    CU_ASSERT(alive(pre));
    CU_ASSERT(alive(dec));
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    CU_ASSERT_EQUAL(strncmp(ipc_dir, "/tmp/tandem-up-", 15), 0);
    struct stat st;
    CU_ASSERT_EQUAL(stat(ipc_dir, &st), 0);

    /* The run directory. */
    char path[PATH_MAX + 64];
    static const char *const files[] = {"cluster.yaml", "commands.txt", "prefill-0.log",
                                        "decode-0.log"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s/%s", run_dir, files[i]);
        CU_ASSERT_EQUAL(stat(path, &st), 0);
    }
    snprintf(path, sizeof(path), "%s/commands.txt", run_dir);
    char *cmds = slurp(path);
    CU_ASSERT_PTR_NOT_NULL(strstr(cmds, "# decode-0\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(cmds, "/tandem-decode --id decode-0 --control ipc:///tmp/"));
    free(cmds);
    char dec_log[PATH_MAX + 64];
    snprintf(dec_log, sizeof(dec_log), "%s/decode-0.log", run_dir);
    CU_ASSERT_EQUAL(wait_file(dec_log, "\nREADY id=decode-0 role=decode ", 1, EVENT_MS), 0);

    /* kill -9: restarted after the first delay, READY again. */
    CU_ASSERT_EQUAL(kill(dec, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log, "\nREADY id=decode-0 role=decode ", 2, EVENT_MS), 0);
    char kill1[128], kill2[128];
    killed_line(kill1, sizeof(kill1), "decode-0", dec);
    snprintf(want, sizeof(want), "%s; restarting in 0.5 s (restart 1)", kill1);
    CU_ASSERT_EQUAL(wait_file(r->err_path, want, 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 is ready again (pid ", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log,
                              "run 1 exited (killed by signal 9 (SIGKILL)); restarting "
                              "in 500 ms",
                              1, EVENT_MS),
                    0);
    char *err = slurp(r->err_path);
    const char *again = strstr(err, "decode-0 is ready again (pid ");
    pid_t dec2 = again ? (pid_t)atoi(again + 29) : 0;
    free(err);
    CU_ASSERT(dec2 != dec && alive(dec2));
    CU_ASSERT(alive(pre)); /* the other worker was left alone */

    /* kill -9 of the new run: the delay doubles to 1 s, capped at 0.7 s. */
    CU_ASSERT_EQUAL(kill(dec2, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log, "\nREADY id=decode-0 role=decode ", 3, EVENT_MS), 0);
    killed_line(kill2, sizeof(kill2), "decode-0", dec2);
    snprintf(want, sizeof(want), "%s; restarting in 0.7 s (restart 2)", kill2);
    CU_ASSERT_EQUAL(wait_file(r->err_path, want, 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 is ready again (pid ", 2, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log,
                              "run 2 exited (killed by signal 9 (SIGKILL)); restarting "
                              "in 700 ms",
                              1, EVENT_MS),
                    0);
    err = slurp(r->err_path);
    again = strstr(err, "decode-0 is ready again (pid ");
    again = again ? strstr(again + 1, "decode-0 is ready again (pid ") : NULL;
    pid_t dec3 = again ? (pid_t)atoi(again + 29) : 0;
    free(err);
    CU_ASSERT(dec3 != dec2 && alive(dec3));

    /* SIGINT: every process exits 0, nothing left. */
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {pre, dec, dec2, dec3};
    const char *const exits[] = {kill1, kill2, "prefill-0 exited: exit code 0",
                                 "decode-0 exited: exit code 0", NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 4);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "SIGINT: stopping the cluster", 1, 0), 0);
    CU_ASSERT_EQUAL(wait_file(dec_log, "run 3 exited (exit code 0)", 1, 0), 0);
    free(r);
}

/* A worker that cannot start (a bad flag through the cluster file's args):
 * tandem up restarts it with backoff, gives up after the third failed start
 * (sv_backoff.h, SV_BACKOFF_GIVE_UP), prints its log's tail with the command
 * to read all of it, stops the other one and exits 1. */
static void test_start_failure(void)
{
    char cfg[PATH_MAX];
    snprintf(cfg, sizeof(cfg), "%s/failing.yaml", tmp_root);
    FILE *f = fopen(cfg, "w");
    fputs("name: failing\npools:\n  prefill: {count: 1}\n  decode:\n    count: 1\n"
          "    args: [\"--frobnicate\"]\n",
          f);
    fclose(f);
    struct up_run *r = malloc(sizeof(*r));
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof(run_dir), "%s/failing", tmp_root);
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"-c", cfg, "--no-router", "--run-dir", run_dir, NULL}, NULL),
        0);
    double ms = 0;
    CU_ASSERT_EQUAL(up_wait_exit(r, EXIT_MS, &ms), 1);
    printf("\n(gave up after %.0f ms)", ms);
    /* prefill-0 gets the stop's SIGTERM while it starts: before its handler
     * is installed that ends it by the signal, after, with exit code 0. */
    const char *const exits[] = {
        " exited during start-up: exit code 2; restarting in 0.5 s (failed start 1 of 3)\n",
        " exited during start-up: exit code 2; restarting in 1.0 s (failed start 2 of 3)\n",
        " exited: exit code 2; it failed to start 3 times in a row, so it is not restarted\n",
        "prefill-0 exited: exit code 0|prefill-0 exited: killed by signal 15 (SIGTERM)", NULL};
    expect_up_exits(r->err_path, exits);
    char *err = slurp(r->err_path);
    CU_ASSERT_EQUAL(count_in(err, "decode-0 (pid "), 3);
    CU_ASSERT_EQUAL(count_in(err, "tandem up: decode-0 (pid "), 1);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof(want), "%s/decode-0.log:\n", run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    snprintf(want, sizeof(want), "(all of it: less %s/decode-0.log)\n", run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    snprintf(want, sizeof(want), "fix what its log says (its command line: %s/commands.txt)",
             run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    /* The worker's own message, from each of its three runs. */
    CU_ASSERT_EQUAL(count_in(err, "  tandem-decode: unknown flag --frobnicate (see --help)\n"), 3);
    if (!strstr(err, "--frobnicate")) {
        printf("\n%s\n", err);
    }
    free(err);
    char log[PATH_MAX + 32];
    snprintf(log, sizeof(log), "%s/decode-0.log", run_dir);
    CU_ASSERT_EQUAL(wait_file(log,
                              "run 3 exited (exit code 2): 3 runs in a row ended before "
                              "ready, not restarting",
                              1, 0),
                    0);
    char *l = slurp(log);
    CU_ASSERT_PTR_NULL(strstr(l, "run 4:"));
    free(l);
    CU_ASSERT_PTR_NULL(strstr(r->out, "READY id=up"));
    CU_ASSERT_EQUAL(leftover_count(), 0);
    free(r);
}

/* A bin directory with the real workers and this executable as tandem-router. */
static void fake_bin_dir(char *out, size_t cap)
{
    snprintf(out, cap, "%s/fakebin", tmp_root);
    mkdir(out, 0755);
    char self[PATH_MAX], link[PATH_MAX + 32], target[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = '\0';
    snprintf(link, sizeof(link), "%s/tandem-router", out);
    if (symlink(self, link) != 0 && errno != EEXIST) {
        CU_FAIL("symlink tandem-router");
    }
    static const char *const workers[] = {"tandem-prefill", "tandem-decode"};
    for (int i = 0; i < 2; i++) {
        snprintf(link, sizeof(link), "%s/%s", out, workers[i]);
        snprintf(target, sizeof(target), "%s/%s", bin_dir, workers[i]);
        if (symlink(target, link) != 0 && errno != EEXIST) {
            CU_FAIL("symlink a worker");
        }
    }
}

/* The router path against the stand-in router: join, worker crash and
 * rejoin, router crash (workers rejoin the new one), stop. */
static void test_router_contract(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/contract", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir", run_dir, NULL},
                 NULL),
        0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("tandem up with the stand-in router did not come up");
        kill(r->pid, SIGINT);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    const char *h = strstr(r->out, "READY id=up http=127.0.0.1:");
    int port = h ? atoi(h + 27) : 0;
    CU_ASSERT(port > 0 && port != 8000);
    char want[PATH_MAX + 512];
    snprintf(want, sizeof(want),
             "  curl http://127.0.0.1:%d/v1/completions -H 'Content-Type: application/json' -d "
             "'{\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":16}'\n",
             port);
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, "cluster 'default' is up: 2 workers behind the router"));
    /* The live page's address (router/dashboard/). */
    snprintf(want, sizeof(want), "\n  dashboard      http://127.0.0.1:%d/dashboard ", port);
    CU_ASSERT_PTR_NOT_NULL(strstr(r->out, want));
    char router_log[PATH_MAX + 32];
    snprintf(router_log, sizeof(router_log), "%s/router.log", run_dir);
    /* The router was started first, with the plan's flags, and the inline
     * routing written next to the logs. */
    char *log = slurp(router_log);
    snprintf(want, sizeof(want), "--port %d --announce ipc:///tmp/tandem-up-", port);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, want));
    snprintf(want, sizeof(want), "--routing %s/routing.yaml", run_dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "fake router: hello from prefill-0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "fake router: hello from decode-0"));
    free(log);
    snprintf(want, sizeof(want), "%s/routing.yaml", run_dir);
    char *routing = slurp(want);
    CU_ASSERT_PTR_NOT_NULL(strstr(routing, "\nkind: EndpointPickerConfig\n"));
    free(routing);
    char *err = slurp(r->err_path);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "every worker is ready; waiting for them to join"));
    /* Order: router ready before any worker started. */
    const char *router_ready = strstr(err, "router is ready (pid");
    const char *worker_ready = strstr(err, "-0 is ready (pid");
    CU_ASSERT(router_ready && worker_ready && router_ready < worker_ready);
    free(err);
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    pid_t router = banner_pid(r->out, "router"), dec = banner_pid(r->out, "decode-0"),
          pre = banner_pid(r->out, "prefill-0");
    CU_ASSERT(alive(router) && alive(dec) && alive(pre));

    /* kill -9 of a worker: restarted, announces itself, the router lists it
     * healthy again. */
    CU_ASSERT_EQUAL(kill(dec, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 1, EVENT_MS), 0);

    /* kill -9 of the router: restarted, both workers rejoin the new one. */
    CU_ASSERT_EQUAL(kill(router, SIGKILL), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "router is ready again (pid ", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "prefill-0 rejoined the router", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 rejoined the router", 2, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(router_log, "# tandem up ", 3, 0), 0); /* run 1, exit, run 2 */

    CU_ASSERT_EQUAL(kill(r->pid, SIGTERM), 0);
    pid_t pids[] = {router, dec, pre};
    char killed_dec[80], killed_router[80];
    killed_line(killed_dec, sizeof(killed_dec), "decode-0", dec);
    killed_line(killed_router, sizeof(killed_router), "router", router);
    const char *const exits[] = {killed_dec,
                                 killed_router,
                                 "router exited: exit code 0",
                                 "prefill-0 exited: exit code 0",
                                 "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 3);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "SIGTERM: stopping the cluster", 1, 0), 0);
    free(r);
}

/* Workers never listed healthy: the start timeout names one and fails. */
static void test_join_timeout(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/join-timeout", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(up_start(r,
                                   (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir",
                                                    run_dir, "--timeout", "5", NULL},
                                   "FAKE_ROUTER_NO_HEALTH=1"),
                          0);
    CU_ASSERT_EQUAL(up_wait_exit(r, EXIT_MS, NULL), 1);
    /* The stand-in router was READY long before; a worker may still be
     * starting when the timeout stops it (see below), and a SIGTERM before
     * its handler is installed ends it by the signal. */
    const char *const exits[] = {
        "router exited: exit code 0",
        "prefill-0 exited: exit code 0|prefill-0 exited: killed by signal 15 (SIGTERM)",
        "decode-0 exited: exit code 0|decode-0 exited: killed by signal 15 (SIGTERM)", NULL};
    expect_up_exits(r->err_path, exits);
    char *err = slurp(r->err_path);
    /* On a loaded machine the workers may not even be READY within the
     * timeout: either way the message names the process it waited for. */
    const char *msg = strstr(err, "tandem up: timed out after 5 s waiting for ");
    CU_ASSERT_PTR_NOT_NULL(msg);
    if (msg != NULL) {
        const char *who = msg + strlen("tandem up: timed out after 5 s waiting for ");
        CU_ASSERT(strncmp(who, "prefill-0", 9) == 0 || strncmp(who, "decode-0", 8) == 0);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(err, ".log:\n")); /* the tail of its log */
    free(err);
    CU_ASSERT_EQUAL(leftover_count(), 0);
    free(r);
}

/* SIGINT before the cluster is up (the workers never listed healthy, so it
 * waits for them to join): every process stops, exit code 130. */
static void test_interrupted(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/interrupted", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir", run_dir, NULL},
                 "FAKE_ROUTER_NO_HEALTH=1"),
        0);
    CU_ASSERT_EQUAL(
        wait_file(r->err_path, "every worker is ready; waiting for them to join", 1, READY_MS), 0);
    char path[PATH_MAX + 32], ipc_dir[PATH_MAX];
    snprintf(path, sizeof(path), "%s/commands.txt", run_dir);
    char *cmds = slurp(path);
    banner_ipc_dir(cmds, ipc_dir, sizeof(ipc_dir));
    free(cmds);
    CU_ASSERT_EQUAL(strncmp(ipc_dir, "/tmp/tandem-up-", 15), 0);
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    /* Every process printed READY (its handler is installed): each exits 0. */
    check_clean_stop(r, 130, clean_stop_1p1d, ipc_dir, NULL, 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "SIGINT: stopping the cluster", 1, 0), 0);
    CU_ASSERT_PTR_NULL(strstr(r->out, "READY id=up"));
    free(r);
}

/* A process that ignores SIGTERM (the stand-in router, told to) is killed at
 * the stop deadline (--stop-timeout, STOP_TIMEOUT_S here), not before; the
 * workers exit 0 on the SIGTERM. */
static void test_stop_deadline(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/deadline", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(
        up_start(r, (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir", run_dir, NULL},
                 "FAKE_ROUTER_IGNORE_TERM=1"),
        0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("did not come up");
        kill(r->pid, SIGKILL);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    pid_t router = banner_pid(r->out, "router");
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    double start = now_ms();
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {router};
    const char *const exits[] = {"router exited: killed by signal 9 (SIGKILL)",
                                 "prefill-0 exited: exit code 0", "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 1);
    /* It waited for the deadline before the SIGKILL. Cannot flake: the
     * deadline is a libuv timer on the monotonic clock started when tandem up
     * handled the SIGINT, after `start`; 100 ms below it for the ms rounding
     * of its clock. */
    double waited = now_ms() - start, deadline = atof(STOP_TIMEOUT_S) * 1000;
    if (waited < deadline - 100) {
        printf("\nSIGKILL after %.0f ms, want the %.0f ms stop timeout\n", waited, deadline);
        CU_FAIL("the SIGKILL came before the stop deadline");
    }
    char *err = slurp(r->err_path);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "router (pid "));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, ") still running at the stop deadline: SIGKILL"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "router exited: killed by signal 9 (SIGKILL)"));
    free(err);
    free(r);
}

/* A second signal while stopping sends SIGKILL at once: the stand-in router
 * ignores the SIGTERM, and is killed by the second SIGINT. The stop deadline
 * is 600 s, past EXIT_MS: a tandem up that exits at all did not wait for it. */
static void test_second_signal(void)
{
    char fake[PATH_MAX], run_dir[PATH_MAX];
    fake_bin_dir(fake, sizeof(fake));
    snprintf(run_dir, sizeof(run_dir), "%s/second-signal", tmp_root);
    struct up_run *r = malloc(sizeof(*r));
    CU_ASSERT_EQUAL_FATAL(up_start(r,
                                   (const char *[]){"--bin-dir", fake, "--port", "0", "--run-dir",
                                                    run_dir, "--stop-timeout", "600", NULL},
                                   "FAKE_ROUTER_IGNORE_TERM=1"),
                          0);
    if (up_wait_out(r, "READY id=up ", READY_MS) != 0) {
        CU_FAIL("did not come up");
        kill(r->pid, SIGKILL);
        up_wait_exit(r, EXIT_MS, NULL);
        free(r);
        return;
    }
    pid_t router = banner_pid(r->out, "router");
    char ipc_dir[PATH_MAX];
    banner_ipc_dir(r->out, ipc_dir, sizeof(ipc_dir));
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "SIGINT: stopping the cluster", 1, EVENT_MS), 0);
    /* The second signal once the workers have stopped, so only the router
     * (which ignores SIGTERM) is running. A worker SIGKILLed while it exits
     * under ASan dies during LeakSanitizer's check and orphans the checker
     * (a clone of the worker, re-parented to this test as a zombie): a
     * leftover this test would report, made by the test's own timing. */
    CU_ASSERT_EQUAL(wait_file(r->err_path, "prefill-0 exited", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(wait_file(r->err_path, "decode-0 exited", 1, EVENT_MS), 0);
    CU_ASSERT_EQUAL(kill(r->pid, SIGINT), 0);
    pid_t pids[] = {router};
    const char *const exits[] = {"router exited: killed by signal 9 (SIGKILL)",
                                 "prefill-0 exited: exit code 0", "decode-0 exited: exit code 0",
                                 NULL};
    check_clean_stop(r, 0, exits, ipc_dir, pids, 1);
    char *err = slurp(r->err_path);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "second SIGINT: SIGKILL now"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "still running: SIGKILL now, before the stop deadline"));
    CU_ASSERT_PTR_NULL(strstr(err, "still running at the stop deadline"));
    free(err);
    free(r);
}

static void add_tests(CU_pSuite suite)
{
    CU_add_test(suite, "cli", test_cli);
    CU_add_test(suite, "dry_run", test_dry_run);
    CU_add_test(suite, "workers_only", test_workers_only);
    CU_add_test(suite, "start_failure", test_start_failure);
    CU_add_test(suite, "router_contract", test_router_contract);
    CU_add_test(suite, "join_timeout", test_join_timeout);
    CU_add_test(suite, "interrupted", test_interrupted);
    CU_add_test(suite, "stop_deadline", test_stop_deadline);
    CU_add_test(suite, "second_signal", test_second_signal);
}

int main(int argc, char **argv)
{
    const char *base = strrchr(argv[0], '/');
    if (!strcmp(base ? base + 1 : argv[0], "tandem-router")) {
        return fake_router_main(argc, argv);
    }
    return up_main("test_up", add_tests);
}
