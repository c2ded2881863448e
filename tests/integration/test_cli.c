/* Every binary's command line (issue 6, "Every binary"): tandem and its
 * subcommands up, plan and bench, tandem-router, tandem-prefill and
 * tandem-decode each
 *   - print --help on stdout and exit 0, listing every flag with its
 *     default ("[default: ...]" on every flag line but --help and --version);
 *   - print "<name> <version>" on --version and exit 0;
 *   - exit 2 on an unknown flag or a bad value, with a message on stderr that
 *     names the flag, and nothing on stdout.
 * The binaries come from TANDEM_BIN_DIR; each runs through /bin/sh with its
 * stdout and stderr in files of a temporary directory. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

static const char *bin_dir;
static char tmp[128];

struct run {
    int code; /* exit code, or -1 */
    char *out, *err;
};

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return strdup("");
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf != NULL && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            cap *= 2;
            char *b = realloc(buf, cap);
            if (b == NULL) {
                free(buf);
                buf = NULL;
            }
            buf = b;
        }
    }
    fclose(f);
    if (buf != NULL) {
        buf[len] = '\0';
    }
    return buf;
}

/* Runs "<bin_dir>/<cmd>" (cmd: binary name and arguments, shell words).
 * timeout(1) only catches a hang (each command answers from its flags alone,
 * in milliseconds): it then exits 124, which no check here accepts. */
static struct run run(const char *cmd)
{
    struct run r = {.code = -1};
    char line[2048], out[256], err[256];
    snprintf(out, sizeof(out), "%s/out", tmp);
    snprintf(err, sizeof(err), "%s/err", tmp);
    snprintf(line, sizeof(line), "cd %s && timeout 60 %s/%s </dev/null >%s 2>%s", tmp, bin_dir, cmd,
             out, err);
    int st = system(line);
    if (st != -1 && WIFEXITED(st)) {
        r.code = WEXITSTATUS(st);
    }
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
}

static void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
}

/* The commands under test: binary (and subcommand), the name --version
 * prints, and a flag every --help must list. */
static const struct cmd {
    const char *cmd;
    const char *version_name;
    const char *some_flag;
} cmds[] = {
    {"tandem", "tandem", NULL},
    {"tandem up", "tandem", "--config"},
    {"tandem plan", "tandem", "--model"},
    {"tandem bench", "tandem", "--base-url"},
    {"tandem bench --experiment no-such-experiment.yaml", "tandem", "--out"},
    {"tandem-router", "tandem-router", "--announce"},
    {"tandem-prefill", "tandem-prefill", "--control"},
    {"tandem-decode", "tandem-decode", "--colocated"},
};
#define N_CMDS (sizeof(cmds) / sizeof(cmds[0]))

static void test_help(void)
{
    for (size_t i = 0; i < N_CMDS; i++) {
        char line[256];
        snprintf(line, sizeof(line), "%s --help", cmds[i].cmd);
        struct run r = run(line);
        if (r.code != 0 || strncmp(r.out, "usage: ", 7) != 0) {
            fprintf(stderr, "\n%s: exit %d, stdout starts '%.40s'\n", line, r.code, r.out);
        }
        CU_ASSERT_EQUAL(r.code, 0);
        CU_ASSERT_EQUAL(strncmp(r.out, "usage: ", 7), 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.out, "  --help "));
        CU_ASSERT_PTR_NOT_NULL(strstr(r.out, "  --version "));
        if (cmds[i].some_flag != NULL) {
            char want[64];
            snprintf(want, sizeof(want), "  %s ", cmds[i].some_flag);
            CU_ASSERT_PTR_NOT_NULL(strstr(r.out, want));
        }
        /* Every flag line has its default. */
        int flags = 0, missing = 0;
        for (char *p = r.out; p != NULL && *p != '\0';) {
            char *eol = strchr(p, '\n');
            size_t len = eol ? (size_t)(eol - p) : strlen(p);
            if (len > 4 && strncmp(p, "  --", 4) == 0 && strncmp(p, "  --help ", 9) != 0 &&
                strncmp(p, "  --version ", 12) != 0) {
                flags++;
                char l[1024];
                snprintf(l, sizeof(l), "%.*s", (int)(len < 1023 ? len : 1023), p);
                if (strstr(l, "[default: ") == NULL || l[strlen(l) - 1] != ']') {
                    fprintf(stderr, "\n%s: no default on: %s\n", line, l);
                    missing++;
                }
            }
            p = eol ? eol + 1 : NULL;
        }
        CU_ASSERT_EQUAL(missing, 0);
        /* "tandem" alone has subcommands, not flags. */
        CU_ASSERT(cmds[i].some_flag == NULL || flags >= 5);
        run_free(&r);
    }
}

static void test_version(void)
{
    for (size_t i = 0; i < N_CMDS; i++) {
        char line[256], want[128];
        snprintf(line, sizeof(line), "%s --version", cmds[i].cmd);
        snprintf(want, sizeof(want), "%s %s\n", cmds[i].version_name, TANDEM_VERSION);
        struct run r = run(line);
        if (r.code != 0 || strcmp(r.out, want) != 0) {
            fprintf(stderr, "\n%s: exit %d, stdout '%s', want '%s'\n", line, r.code, r.out, want);
        }
        CU_ASSERT_EQUAL(r.code, 0);
        CU_ASSERT_STRING_EQUAL(r.out, want);
        run_free(&r);
    }
}

/* cmd must exit 2 with nothing on stdout and a stderr naming `named`. */
static void expect_usage_error(const char *cmd, const char *named)
{
    struct run r = run(cmd);
    int ok = r.code == 2 && r.out[0] == '\0' && strstr(r.err, named) != NULL;
    if (!ok) {
        fprintf(stderr, "\n%s: exit %d (want 2), stdout '%.80s', stderr '%.300s' (want '%s')\n",
                cmd, r.code, r.out, r.err, named);
    }
    CU_ASSERT_EQUAL(r.code, 2);
    CU_ASSERT_STRING_EQUAL(r.out, "");
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, named));
    run_free(&r);
}

static void test_unknown_flag(void)
{
    for (size_t i = 0; i < N_CMDS; i++) {
        char line[256];
        snprintf(line, sizeof(line), "%s --no-such-flag", cmds[i].cmd);
        expect_usage_error(line, "--no-such-flag");
        snprintf(line, sizeof(line), "%s --no-such-flag=3", cmds[i].cmd);
        expect_usage_error(line, "--no-such-flag");
    }
    expect_usage_error("tandem no-such-command", "no-such-command");
    expect_usage_error("tandem", "usage: tandem");
}

static void test_bad_value(void)
{
    static const struct {
        const char *cmd, *named;
    } cases[] = {
        {"tandem up --port abc", "--port"},
        {"tandem up --timeout 0", "--timeout"},
        {"tandem up --log-level loud", "--log-level"},
        {"tandem up --config /nonexistent/cluster.yaml", "/nonexistent/cluster.yaml"},
        {"tandem up --port", "--port"},
        {"tandem up --restart-backoff 0", "--restart-backoff"},
        {"tandem up --restart-backoff-max x", "--restart-backoff-max"},
        {"tandem up --healthy-reset -1", "--healthy-reset"},
        {"tandem plan --model no-such-model", "--model"},
        {"tandem plan --layers abc --kv-heads 8 --head-dim 128", "--layers"},
        {"tandem plan --model llama-3-8b --tp 0", "--tp"},
        {"tandem plan --model llama-3-8b --kv-budget 12XB", "--kv-budget"},
        {"tandem bench --num-prompts x", "--num-prompts"},
        {"tandem bench --request-rate -1", "--request-rate"},
        {"tandem bench --dataset-name nope", "--dataset-name"},
        {"tandem bench --goodput ttft", "--goodput"},
        {"tandem bench --experiment x.yaml --restart sometimes", "--restart"},
        {"tandem bench --experiment /nonexistent/experiment.yaml", "/nonexistent/experiment.yaml"},
        {"tandem-router --port 70000", "--port"},
        {"tandem-router --retries many", "--retries"},
        {"tandem-router --routing /nonexistent/routing.yaml", "--routing"},
        {"tandem-router --announce foo://bar --port 0", "--announce"},
        {"tandem-router --announce tls+tcp://127.0.0.1:0 --port 0", "--announce"},
        {"tandem-router --tls-ca /nonexistent/ca.crt", "--tls-"},
        {"tandem-router --tls-ca /nonexistent/ca.crt --tls-cert /x --tls-key /y", "--tls-ca"},
        {"tandem-router --max-body lots", "--max-body"},
        {"tandem-prefill --max-running 0", "--max-running"},
        {"tandem-prefill --backend gpu", "--backend"},
        {"tandem-prefill --backend sim --model no-such-model", "--model"},
        {"tandem-prefill --heartbeat-ms 1", "--heartbeat-ms"},
        {"tandem-prefill --tls-cert /x", "--tls-"},
        {"tandem-prefill --control foo://bar", "--control"},
        {"tandem-decode --kv tls+tcp://127.0.0.1:0", "--kv"},
        {"tandem-decode --kv-dtype f12", "--kv-dtype"},
        {"tandem-decode --colocated=maybe", "--colocated"},
        {"tandem-decode --kv-memory 1e", "--kv-memory"},
        {"tandem-decode --metrics-host not-an-address", "--metrics-host"},
        {"tandem-decode --tls-ca /nonexistent/ca.crt --tls-cert /x --tls-key /y", "--tls-ca"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        expect_usage_error(cases[i].cmd, cases[i].named);
    }
}

static int suite_init(void)
{
    bin_dir = getenv("TANDEM_BIN_DIR");
    snprintf(tmp, sizeof(tmp), "/tmp/tandem-test-cli-XXXXXX");
    if (bin_dir == NULL || mkdtemp(tmp) == NULL) {
        fprintf(stderr, "test_cli: needs TANDEM_BIN_DIR (set by ctest) and /tmp\n");
        return 1;
    }
    return 0;
}

static int suite_fini(void)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : 1;
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("cli", suite_init, suite_fini);
    CU_add_test(s, "help", test_help);
    CU_add_test(s, "version", test_version);
    CU_add_test(s, "unknown_flag", test_unknown_flag);
    CU_add_test(s, "bad_value", test_bad_value);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
