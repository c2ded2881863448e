/* `tandem bench` against a live default cluster (issue 7, "Tests"): starts
 * `tandem up --port 0` (one prefill and one decode tiny worker behind the
 * router), runs a short benchmark with the real binary, parses its --json
 * with jansson and checks vLLM's result keys and the counts; runs a small
 * experiment file through `tandem bench --experiment` (which starts and stops
 * a cluster of its own) and checks the report directory; checks the
 * observability files against the running cluster (deploy/observability/:
 * `promtool check config`, the Prometheus targets tandem up wrote, every
 * target's /metrics through `promtool check metrics`, every metric the
 * Grafana dashboard queries exported); then stops the cluster with SIGTERM
 * and checks it exits 0 within 5 s.
 *
 * The test process is a child subreaper, so anything `tandem up` leaked
 * would become its child: after stopping, it checks it has none. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "expect.h"
#include "leftover.h"
#include "up_exits.h"

/* Generous: only catches a hang (a stop takes at most --stop-timeout, 4.5 s,
 * plus reaping). */
#define STOP_TIMEOUT_S 60
/* Generous: a benchmark here sends for about 2 s; this only catches a hang. */
#define RUN_TIMEOUT_S 120

static char bin_dir[PATH_MAX];
static char src_dir[PATH_MAX];
static char tmp[] = "/tmp/test_bench_live_XXXXXX";
static pid_t up_pid;
static int up_port;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Starts argv with stdout and stderr in log (its own process group, death
 * signal SIGTERM). Returns the pid or -1. */
static pid_t spawn(char *const argv[], const char *log)
{
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd);
    return pid;
}

/* Waits up to timeout_s for pid; returns its status or -1 on timeout. */
static int wait_for(pid_t pid, double timeout_s)
{
    double end = now_s() + timeout_s;
    int status;
    while (now_s() < end) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            return status;
        }
        sleep_ms(20);
    }
    return -1;
}

static void print_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return;
    }
    char line[1024];
    printf("\n--- %s ---\n", path);
    while (fgets(line, sizeof(line), f)) {
        fputs(line, stdout);
    }
    fclose(f);
}

/* Runs argv to completion (timeout_s); returns the exit code, or -1. */
static int run(char *const argv[], const char *log, double timeout_s)
{
    pid_t pid = spawn(argv, log);
    if (pid < 0) {
        return -1;
    }
    int status = wait_for(pid, timeout_s);
    if (status < 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        print_file(log);
        return -1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        print_file(log);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int suite_init(void)
{
    const char *b = getenv("TANDEM_BIN_DIR");
    const char *s = getenv("TANDEM_SOURCE_DIR");
    if (!b || !s || !mkdtemp(tmp)) {
        fprintf(stderr, "TANDEM_BIN_DIR and TANDEM_SOURCE_DIR must be set (ctest sets them)\n");
        return 1;
    }
    snprintf(bin_dir, sizeof(bin_dir), "%s", b);
    snprintf(src_dir, sizeof(src_dir), "%s", s);
    return leftover_init();
}

static int suite_clean(void)
{
    if (up_pid > 0) {
        kill(up_pid, SIGKILL);
        waitpid(up_pid, NULL, 0);
    }
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
    return system(cmd) == 0 ? 0 : 1;
}

static void test_up(void)
{
    char tandem[PATH_MAX + 16], run_dir[PATH_MAX + 16], log[PATH_MAX + 16];
    snprintf(tandem, sizeof(tandem), "%s/tandem", bin_dir);
    snprintf(run_dir, sizeof(run_dir), "%s/run", tmp);
    snprintf(log, sizeof(log), "%s/up.log", tmp);
    /* --stop-timeout 15: longer than the workers' 10 s stop watchdog
     * (worker/worker.c), so a stop that hangs ends by the
     * watchdog (exit 70, a failure) rather than by tandem up's SIGKILL at the default
     * 4.5 s; a SIGKILL then means a hang no watchdog caught. */
    char targets[PATH_MAX + 16];
    snprintf(targets, sizeof(targets), "%s/targets.json", tmp);
    char *argv[] = {tandem,
                    "up",
                    "--port",
                    "0",
                    "--run-dir",
                    run_dir,
                    "--stop-timeout",
                    "15",
                    "--prometheus-targets",
                    targets,
                    NULL};
    up_pid = spawn(argv, log);
    CU_ASSERT_FATAL(up_pid > 0);
    /* Longer than tandem up's own --timeout (60 s), so a slow start is
     * reported by tandem up, and this only catches a hang. */
    double end = now_s() + 90;
    while (now_s() < end && up_port == 0) {
        FILE *f = fopen(log, "r");
        char line[1024];
        while (f && fgets(line, sizeof(line), f)) {
            const char *h = strstr(line, "READY id=up http=");
            const char *colon = h ? strchr(h + 17, ':') : NULL;
            if (colon) {
                up_port = atoi(colon + 1);
            }
        }
        if (f) {
            fclose(f);
        }
        if (waitpid(up_pid, NULL, WNOHANG) == up_pid) {
            up_pid = 0;
            break;
        }
        sleep_ms(50);
    }
    if (up_port == 0) {
        print_file(log);
    }
    CU_ASSERT_FATAL(up_port > 0);
}

static const char *const vllm_number_keys[] = {"duration",
                                               "completed",
                                               "failed",
                                               "total_input_tokens",
                                               "total_output_tokens",
                                               "request_throughput",
                                               "output_throughput",
                                               "total_token_throughput",
                                               "mean_ttft_ms",
                                               "median_ttft_ms",
                                               "p99_ttft_ms",
                                               "mean_tpot_ms",
                                               "median_tpot_ms",
                                               "p99_tpot_ms",
                                               "mean_itl_ms",
                                               "median_itl_ms",
                                               "p99_itl_ms",
                                               "mean_e2el_ms",
                                               "median_e2el_ms",
                                               "p99_e2el_ms",
                                               "request_goodput",
                                               "num_prompts",
                                               "burstiness",
                                               "request_rate",
                                               "max_output_tokens_per_s",
                                               "max_concurrent_requests",
                                               NULL};

static int run_shell(const char *cmd, char *out, size_t cap);

/* --timeline DIR of the run above: timeline.csv lists both workers of the
 * cluster from the first sample (taken before the first request) to the
 * last (after the run): decode-0 was picked at least once per request,
 * warm-ups included (14; more when a request was retried), and the last
 * sample has the router's own count of its picks. timeline.svg draws them. */
static void check_timeline(const char *dir)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/timeline.csv", dir);
    FILE *f = fopen(path, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    char line[512];
    CU_ASSERT(fgets(line, sizeof(line), f) != NULL);
    EXPECT_STR(line, "t_s,worker,role,waiting,running,kv_usage,picks,picks_per_s\n");
    int rows_p = 0, rows_d = 0;
    double first = -1, last = -1;
    while (fgets(line, sizeof(line), f) != NULL) {
        double t, waiting, running, kv, picks;
        char worker[64], role[32];
        if (sscanf(line, "%lf,%63[^,],%31[^,],%lf,%lf,%lf,%lf", &t, worker, role, &waiting,
                   &running, &kv, &picks) != 7) {
            fprintf(stderr, "\ntimeline.csv: bad line %s", line);
            CU_FAIL("timeline.csv line");
            continue;
        }
        CU_ASSERT(kv >= 0 && kv <= 1 && waiting >= 0 && running >= 0);
        if (strcmp(worker, "prefill-0") == 0) {
            rows_p++;
            EXPECT_STR(role, "prefill");
        } else if (strcmp(worker, "decode-0") == 0) {
            rows_d++;
            EXPECT_STR(role, "decode");
            first = first < 0 ? picks : first;
            last = picks;
        } else {
            fprintf(stderr, "\ntimeline.csv: unknown worker %s\n", worker);
            CU_FAIL("timeline.csv worker");
        }
    }
    fclose(f);
    CU_ASSERT(rows_d >= 2);
    EXPECT_EQ(rows_p, rows_d);
    CU_ASSERT(last - first >= 14);
    char cmd[256], out[256];
    snprintf(cmd, sizeof(cmd),
             "curl -sf http://127.0.0.1:%d/metrics | "
             "sed -n 's/^tandem:routing_decisions_total{endpoint=\"decode-0\".*} //p'",
             up_port);
    CU_ASSERT_EQUAL(run_shell(cmd, out, sizeof(out)), 0);
    EXPECT_EQ(atoi(out), (int)last);
    snprintf(path, sizeof(path), "%s/timeline.svg", dir);
    char *all = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&all, &len);
    f = fopen(path, "r");
    int ch;
    while (f != NULL && m != NULL && (ch = fgetc(f)) != EOF) {
        fputc(ch, m);
    }
    if (f != NULL) {
        fclose(f);
    }
    if (m != NULL) {
        fclose(m);
    }
    CU_ASSERT(all != NULL && strncmp(all, "<?xml", 5) == 0);
    CU_ASSERT(all != NULL && strstr(all, ">decode-0 (decode)</text>") != NULL);
    CU_ASSERT(all != NULL && strstr(all, ">prefill-0 (prefill)</text>") != NULL);
    free(all);
}
static void test_bench_json(void)
{
    if (up_port == 0) {
        CU_FAIL("no cluster");
        return;
    }
    char tandem[PATH_MAX + 16], url[64], json[PATH_MAX + 16], log[PATH_MAX + 16];
    char timeline[PATH_MAX + 16];
    snprintf(timeline, sizeof(timeline), "%s/timeline", tmp);
    snprintf(tandem, sizeof(tandem), "%s/tandem", bin_dir);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", up_port);
    snprintf(json, sizeof(json), "%s/result.json", tmp);
    snprintf(log, sizeof(log), "%s/bench.log", tmp);
    /* logprobs: every token is a stream chunk, even bytes that are not text. */
    char *argv[] = {tandem,
                    "bench",
                    "--base-url",
                    url,
                    "--dataset-name",
                    "random",
                    "--random-input-len",
                    "32",
                    "--random-output-len",
                    "8",
                    "--num-prompts",
                    "12",
                    "--request-rate",
                    "8",
                    "--seed",
                    "1",
                    "--num-warmups",
                    "2",
                    "--goodput",
                    "ttft:30000",
                    "tpot:30000",
                    "--extra-body",
                    "{\"logprobs\": 0}",
                    "--json",
                    json,
                    "--timeline",
                    timeline,
                    "--timeline-ms",
                    "100",
                    NULL};
    CU_ASSERT_EQUAL(run(argv, log, RUN_TIMEOUT_S), 0);
    json_error_t jerr;
    json_t *o = json_load_file(json, 0, &jerr);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    for (int i = 0; vllm_number_keys[i]; i++) {
        json_t *v = json_object_get(o, vllm_number_keys[i]);
        if (!json_is_number(v)) {
            printf("\nkey %s: not a number\n", vllm_number_keys[i]);
            CU_FAIL("vLLM key");
        }
    }
    CU_ASSERT(json_is_string(json_object_get(o, "date")));
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(o, "backend")), "openai");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(o, "model_id")), "tiny");
    CU_ASSERT(json_is_null(json_object_get(o, "tokenizer_id")));
    CU_ASSERT(json_is_null(json_object_get(o, "max_concurrency")));
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "completed")), 12);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "failed")), 0);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "num_prompts")), 12);
    CU_ASSERT_EQUAL(json_number_value(json_object_get(o, "request_rate")), 8.0);
    /* 32 prompt bytes + BOS on the byte-level tokenizer; 8 tokens each. */
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "total_input_tokens")), 12 * 33);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "total_output_tokens")), 12 * 8);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "good_requests")), 12);
    CU_ASSERT(json_number_value(json_object_get(o, "duration")) > 0);
    CU_ASSERT(json_number_value(json_object_get(o, "mean_ttft_ms")) > 0);
    CU_ASSERT(json_number_value(json_object_get(o, "median_tpot_ms")) > 0);
    CU_ASSERT_EQUAL(json_object_size(json_object_get(o, "failures")), 0);
    json_decref(o);
    check_timeline(timeline);
}

/* Counts the lines of the file at path that contain needle. */
/* ---- deploy/observability/ against the running cluster ---- */

/* Runs the shell command cmd; its output (stdout and stderr) into out.
 * Returns the exit code, or -1. */
static int run_shell(const char *cmd, char *out, size_t cap)
{
    char full[PATH_MAX * 3];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (p == NULL) {
        return -1;
    }
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define MAX_NAMES 512

/* Adds the metric names of an exposition body (sample lines) to names. */
static void add_names(const char *body, char **names, int *n)
{
    for (const char *line = body; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "") {
        if (*line == '#' || *line == '\n') {
            continue;
        }
        size_t len = strcspn(line, "{ \n");
        int seen = 0;
        for (int i = 0; i < *n && !seen; i++) {
            seen = strlen(names[i]) == len && strncmp(names[i], line, len) == 0;
        }
        if (!seen && *n < MAX_NAMES) {
            names[(*n)++] = strndup(line, len);
        }
    }
}

static int has_name(char **names, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++) {
        if (strlen(names[i]) == len && strncmp(names[i], name, len) == 0) {
            return 1;
        }
    }
    return 0;
}

/* promtool is Debian's prometheus package (deploy/install-deps.sh). */
static void test_observability(void)
{
    CU_ASSERT_FATAL(up_port > 0);
    static char out[1 << 16];
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof(cmd), "promtool check config %s/deploy/observability/prometheus.yml",
             src_dir);
    int rc = run_shell(cmd, out, sizeof(out));
    if (rc != 0) {
        printf("\n%s: exit %d\n%s(promtool is in Debian's prometheus package: "
               "deploy/install-deps.sh)\n",
               cmd, rc, out);
    }
    CU_ASSERT_EQUAL(rc, 0);

    /* The targets: the router and both workers, with their labels. */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/targets.json", tmp);
    json_error_t jerr;
    json_t *groups = json_load_file(path, 0, &jerr);
    CU_ASSERT_FATAL(json_is_array(groups));
    CU_ASSERT_EQUAL(json_array_size(groups), 3);
    char *names[MAX_NAMES];
    int n_names = 0, roles = 0;
    size_t i;
    json_t *g;
    json_array_foreach(groups, i, g)
    {
        const char *target = json_string_value(json_array_get(json_object_get(g, "targets"), 0));
        const char *role = json_string_value(json_object_get(json_object_get(g, "labels"), "role"));
        CU_ASSERT_FATAL(target != NULL && role != NULL);
        roles |= strcmp(role, "router") == 0    ? 1
                 : strcmp(role, "prefill") == 0 ? 2
                 : strcmp(role, "decode") == 0  ? 4
                                                : 8;
        /* Its /metrics passes promtool (names with colons excepted, as vLLM's). */
        char body[PATH_MAX + 16];
        snprintf(body, sizeof(body), "%s/metrics-%zu.txt", tmp, i);
        snprintf(cmd, sizeof(cmd), "curl -sf http://%s/metrics -o %s", target, body);
        CU_ASSERT_EQUAL_FATAL(run_shell(cmd, out, sizeof(out)), 0);
        snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", body);
        run_shell(cmd, out, sizeof(out));
        for (char *line = strtok(out, "\n"); line != NULL; line = strtok(NULL, "\n")) {
            if (strstr(line, "metric names should not contain ':'") == NULL) {
                printf("\npromtool check metrics (%s): %s\n", role, line);
                CU_FAIL("promtool check metrics");
            }
        }
        char *text = NULL;
        FILE *f = fopen(body, "r");
        if (f != NULL) {
            static char buf[1 << 20];
            size_t len = fread(buf, 1, sizeof(buf) - 1, f);
            buf[len] = '\0';
            fclose(f);
            text = buf;
        }
        CU_ASSERT_FATAL(text != NULL);
        add_names(text, names, &n_names);
    }
    CU_ASSERT_EQUAL(roles, 1 | 2 | 4);
    json_decref(groups);

    /* Every metric the dashboard queries is exported. */
    snprintf(path, sizeof(path), "%s/deploy/observability/grafana-dashboard.json", src_dir);
    json_t *dash = json_load_file(path, 0, &jerr);
    CU_ASSERT_FATAL(dash != NULL);
    int queried = 0;
    json_t *panel, *target;
    size_t k;
    json_array_foreach(json_object_get(dash, "panels"), i, panel)
    {
        json_array_foreach(json_object_get(panel, "targets"), k, target)
        {
            const char *e = json_string_value(json_object_get(target, "expr"));
            CU_ASSERT_FATAL(e != NULL);
            for (const char *p = e; (p = strpbrk(p, "tv")) != NULL;) {
                size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_:");
                int metric =
                    (strncmp(p, "tandem:", 7) == 0 || strncmp(p, "vllm:", 5) == 0) &&
                    (p == e || strchr("abcdefghijklmnopqrstuvwxyz0123456789_:", p[-1]) == NULL);
                if (metric) {
                    queried++;
                    if (!has_name(names, n_names, p, len)) {
                        printf("\nthe dashboard queries %.*s, which the cluster does not export\n",
                               (int)len, p);
                        CU_FAIL("dashboard metric not exported");
                    }
                }
                p += len > 0 ? len : 1;
            }
        }
    }
    CU_ASSERT(queried >= 25);
    json_decref(dash);
    for (int j = 0; j < n_names; j++) {
        free(names[j]);
    }
}

static int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    int n = 0;
    char line[4096];
    while (f && fgets(line, sizeof(line), f)) {
        n += strstr(line, needle) != NULL;
    }
    if (f) {
        fclose(f);
    }
    return n;
}

/* Every process of a 1P1D cluster exited 0 on the stop's SIGTERM, and none
 * exited before (tandem up's log; up_exits.h). */
static const char *const clean_stop[] = {"router exited: exit code 0",
                                         "prefill-0 exited: exit code 0",
                                         "decode-0 exited: exit code 0", NULL};
/* The experiment's cluster runs at tandem up's default --stop-timeout (4.5 s;
 * tandem bench passes no other): a worker whose stop hangs is killed there
 * before its 10 s watchdog, so a worker may also end by that SIGKILL. Any
 * other status fails (an ASan leak report's exit code 23, a fired watchdog's
 * 70, a crash). */
static const char *const experiment_stop[] = {
    "router exited: exit code 0",
    "prefill-0 exited: exit code 0|prefill-0 exited: killed by signal 9 (SIGKILL)",
    "decode-0 exited: exit code 0|decode-0 exited: killed by signal 9 (SIGKILL)", NULL};

static void test_experiment_live(void)
{
    char tandem[PATH_MAX + 16], file[PATH_MAX + 16], out[PATH_MAX + 16], log[PATH_MAX + 16];
    snprintf(tandem, sizeof(tandem), "%s/tandem", bin_dir);
    snprintf(file, sizeof(file), "%s/e.yaml", tmp);
    snprintf(out, sizeof(out), "%s/report", tmp);
    snprintf(log, sizeof(log), "%s/experiment.log", tmp);
    FILE *f = fopen(file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fprintf(f,
            "name: live\n"
            "configs:\n"
            "- {label: one, cluster: %s/deploy/clusters/tiny-1p1d.yaml}\n"
            "rates: [4, 8]\n"
            "seeds: 1\n" /* live runs default to 3 seeds: 3x the time, over CI's budget */
            "settle: 0.2\n"
            "cluster_overrides: {log_level: warn}\n"
            "bench:\n"
            "  random-input-len: 32\n"
            "  random-output-len: 4\n"
            "  num-prompts: 6\n"
            "  seed: 3\n"
            "  goodput: [ttft:30000]\n"
            "  extra-body: {logprobs: 0}\n",
            src_dir);
    fclose(f);
    char *argv[] = {tandem, "bench", "--experiment", file, "--out", out, NULL};
    CU_ASSERT_EQUAL(run(argv, log, RUN_TIMEOUT_S), 0);
    const char *names[] = {"summary.md",      "results.csv",         "goodput.svg",
                           "ttft_cdf.svg",    "tpot_cdf.svg",        "configs/one.cluster.yaml",
                           "logs/one.up.log", "requests/one-r4.csv", NULL};
    for (int i = 0; names[i]; i++) {
        char p[PATH_MAX + 64];
        snprintf(p, sizeof(p), "%s/%s", out, names[i]);
        struct stat st;
        if (stat(p, &st) != 0 || st.st_size == 0) {
            printf("\nmissing or empty: %s\n", p);
            CU_FAIL("report file");
        }
    }
    for (int r = 0; r < 2; r++) {
        char p[PATH_MAX + 64];
        snprintf(p, sizeof(p), "%s/cells/one-r%d.json", out, r ? 8 : 4);
        json_error_t jerr;
        json_t *o = json_load_file(p, 0, &jerr);
        CU_ASSERT_PTR_NOT_NULL(o);
        if (!o) {
            continue;
        }
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "completed")), 6);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "failed")), 0);
        CU_ASSERT_EQUAL(json_number_value(json_object_get(o, "request_rate")), r ? 8.0 : 4.0);
        json_t *x = json_object_get(o, "experiment");
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(x, "config")), "one");
        /* restart per configuration: rate i uses seed + i */
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(x, "seed")), 3 + r);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "seed")), 3 + r);
        CU_ASSERT(json_is_object(json_object_get(x, "host")));
        json_decref(o);
    }
    char p[PATH_MAX + 64];
    snprintf(p, sizeof(p), "%s/results.csv", out);
    f = fopen(p, "r");
    int lines = 0, ok = 0;
    char line[4096];
    while (f && fgets(line, sizeof(line), f)) {
        lines++;
        ok += strstr(line, ",ok,6,0,") != NULL;
    }
    if (f) {
        fclose(f);
    }
    CU_ASSERT_EQUAL(lines, 3);
    CU_ASSERT_EQUAL(ok, 2);
    /* The experiment's own cluster (one start: restart per configuration)
     * stopped cleanly too; tandem bench only warns when it did not. */
    snprintf(p, sizeof(p), "%s/logs/one.up.log", out);
    expect_up_exits(p, experiment_stop);
    EXPECT_EQ(count_lines(log, "[exp] tandem up (pid"), 0);
}

static void test_stop(void)
{
    if (up_pid <= 0) {
        CU_FAIL("no cluster");
        return;
    }
    char log[PATH_MAX + 16];
    snprintf(log, sizeof(log), "%s/up.log", tmp);
    kill(up_pid, SIGTERM);
    int status = wait_for(up_pid, STOP_TIMEOUT_S);
    CU_ASSERT(status >= 0);
    CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (status >= 0) {
        up_pid = 0;
    }
    expect_up_exits(log, clean_stop);
    /* Nothing left behind, running or not: the router and workers were
     * stopped and reaped by tandem up (orphans would descend from us). */
    EXPECT_EQ(leftover_count(), 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench_live", suite_init, suite_clean);
    CU_add_test(s, "up", test_up);
    CU_add_test(s, "bench_json", test_bench_json);
    CU_add_test(s, "experiment", test_experiment_live);
    CU_add_test(s, "observability", test_observability);
    CU_add_test(s, "stop", test_stop);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
