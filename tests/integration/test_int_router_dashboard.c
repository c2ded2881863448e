/* Integration: the router's live page, GET /dashboard, in a real browser.
 *
 * A router with one prefill and two decode workers (tiny backend: real KV
 * to ship; P/D always) takes one completion; then headless Chromium
 * (Debian's chromium, installed by deploy/install-deps.sh) opens
 * /dashboard, runs its script for a few seconds of virtual time and dumps
 * the DOM. The DOM must list every worker the router lists and the decision
 * of the test's request (found by the response id the answer carried), with
 * its decode and prefill workers and verdict, and the browser must print no
 * console message at all (the page logs only its own bugs and uncaught
 * exceptions; Chromium prints every console message on stderr as
 * "CONSOLE"). With --api-key the page itself stays open, asks for the key,
 * and with the key in its address shows the cluster.
 *
 * The data the page reads is checked too: the decision record's response
 * id, /v1/decisions?limit=&candidates= and the per-endpoint picks and KV
 * transfer counters that heartbeats carry to /v1/cluster. */
#define _GNU_SOURCE
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "expect.h"
#include "rt_cluster.h"

#define BROWSER_MS 120000 /* a browser run longer than this is a hang */
#define BUDGET_MS  "4000" /* virtual time the page runs: four polls */

extern char **environ;

/* The chromium binary: $TANDEM_CHROMIUM, else chromium on the PATH; NULL if
 * there is none. */
static const char *find_chromium(char *buf, size_t cap)
{
    const char *env = getenv("TANDEM_CHROMIUM");
    if (env != NULL && env[0] != '\0') {
        return access(env, X_OK) == 0 ? env : NULL;
    }
    const char *path = getenv("PATH");
    for (const char *p = path ? path : "/usr/bin:/bin"; *p != '\0';) {
        size_t n = strcspn(p, ":");
        snprintf(buf, cap, "%.*s/chromium", (int)n, p);
        if (access(buf, X_OK) == 0) {
            return buf;
        }
        p += n + (p[n] == ':');
    }
    return NULL;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* rm -r dir */
static void remove_tree(const char *dir)
{
    nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s != NULL) {
        size_t got = fread(s, 1, (size_t)n, f);
        s[got] = '\0';
    }
    fclose(f);
    return s;
}

/* Opens url in headless Chromium for BUDGET_MS of virtual time and returns
 * the DOM (*dom) and what the browser printed on stderr (*log), both
 * malloc'd. Returns 0, or -1 (said on stderr). */
static int browse(const char *url, char **dom, char **log)
{
    *dom = *log = NULL;
    char bin[1024];
    const char *chromium = find_chromium(bin, sizeof(bin));
    if (chromium == NULL) {
        fprintf(stderr, "\nchromium not found on the PATH (or $TANDEM_CHROMIUM): install Debian's "
                        "chromium package, as deploy/install-deps.sh does\n");
        return -1;
    }
    /* The browser's profile and output in a directory of their own,
     * removed when it is done. */
    char dir[] = "/tmp/tandem-dashboard-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "\ncannot make a directory in /tmp: %s\n", strerror(errno));
        return -1;
    }
    char out[512], err[512], profile[512];
    snprintf(out, sizeof(out), "%s/dom.html", dir);
    snprintf(err, sizeof(err), "%s/chromium.log", dir);
    snprintf(profile, sizeof(profile), "--user-data-dir=%s/profile", dir);
    const char *argv[] = {chromium,
                          "--headless",
                          "--no-sandbox",
                          "--disable-gpu",
                          "--no-first-run",
                          "--disable-extensions",
                          profile,
                          "--enable-logging=stderr",
                          "--v=0",
                          "--virtual-time-budget=" BUDGET_MS,
                          "--dump-dom",
                          url,
                          NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawnattr_init(&at);
    /* Its own process group, so that a hang is ended with every helper
     * process the browser started. */
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&at, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, chromium, &fa, &at, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0) {
        fprintf(stderr, "\ncannot start %s: %s\n", chromium, strerror(rc));
        remove_tree(dir);
        return -1;
    }
    double deadline = h_ms() + BROWSER_MS;
    int status = 0;
    pid_t w;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && h_ms() < deadline) {
        h_sleep_ms(50);
    }
    if (w == 0) {
        fprintf(stderr, "\n%s did not finish in %d s: killed\n", chromium, BROWSER_MS / 1000);
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    *dom = slurp(out);
    *log = slurp(err);
    remove_tree(dir);
    if (w == 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || *dom == NULL || *log == NULL) {
        fprintf(stderr, "\n%s failed (status 0x%x); its log:\n%s\n", chromium, status,
                *log ? *log : "(none)");
        return -1;
    }
    return 0;
}

/* Every console message the page caused (Chromium prints them on stderr as
 * "...:CONSOLE:<line>] ..." or "...CONSOLE(<line>)] ..."), said on stderr.
 * Returns how many there were. */
static int console_lines(const char *log)
{
    int n = 0;
    for (const char *l = log; l != NULL && *l != '\0';) {
        const char *eol = strchr(l, '\n');
        size_t len = eol ? (size_t)(eol - l) : strlen(l);
        const char *c = memmem(l, len, "CONSOLE", 7);
        if (c != NULL && (c[7] == ':' || c[7] == '(')) {
            fprintf(stderr, "\nbrowser console: %.*s\n", (int)len, l);
            n++;
        }
        l = eol ? eol + 1 : NULL;
    }
    return n;
}

/* The part of the DOM inside <tbody id="id"> (a new string), or NULL: the
 * table the script drew, without the script's own text. */
static char *dom_tbody(const char *dom, const char *id)
{
    char key[64];
    snprintf(key, sizeof(key), "<tbody id=\"%s\">", id);
    const char *s = strstr(dom, key);
    const char *e = s ? strstr(s, "</tbody>") : NULL;
    return e ? strndup(s, (size_t)(e - s)) : NULL;
}

/* The table row of the DOM that starts with `<tr attr="value"` (a new
 * string up to its </tr>), or NULL. */
static char *dom_row(const char *dom, const char *attr, const char *value)
{
    char key[256];
    snprintf(key, sizeof(key), "<tr %s=\"%s\"", attr, value);
    const char *s = strstr(dom, key);
    const char *e = s ? strstr(s, "</tr>") : NULL;
    return e ? strndup(s, (size_t)(e - s)) : NULL;
}

static int count_rows(const char *dom, const char *attr)
{
    char key[64];
    snprintf(key, sizeof(key), "<tr %s=\"", attr);
    int n = 0;
    for (const char *s = strstr(dom, key); s != NULL; s = strstr(s + 1, key)) {
        n++;
    }
    return n;
}

/* The JSON string member name of o, "" when absent. */
static const char *str_of(json_t *o, const char *name)
{
    const char *s = json_string_value(json_object_get(o, name));
    return s ? s : "";
}

/* One completion; its response id into id. Returns the HTTP status. */
static int complete(int port, const char *headers, char *id, size_t cap)
{
    struct rtc_resp r;
    const char *body = "{\"prompt\":\"Where does the dashboard find this request? By its id, "
                       "which the decision record carries.\",\"max_tokens\":4,\"ignore_eos\":true}";
    int status = rtc_request(port, "POST", "/v1/completions", body, headers, &r, 60000);
    /* JSON_ALLOW_NUL: the tiny model samples byte tokens, <0x00> among them
     * (3% of these answers carry "\u0000", valid JSON that jansson refuses
     * by default). */
    json_t *j = status == 200 ? json_loads(r.body, JSON_ALLOW_NUL, NULL) : NULL;
    snprintf(id, cap, "%s", str_of(j, "id"));
    json_decref(j);
    rtc_resp_free(&r);
    return status;
}

/* /v1/cluster once the heartbeats of both ends have carried the transfer's
 * bytes (each worker reports its own, on its own heartbeat), or after
 * RTC_HANG_MS. */
static json_t *cluster_after_transfer(int port, const char *prefill, const char *decode)
{
    double deadline = h_ms() + RTC_HANG_MS;
    for (;;) {
        json_t *c = rtc_get_json(port, "/v1/cluster");
        size_t i;
        json_t *e;
        int sent = 0, received = 0;
        json_array_foreach(json_object_get(c, "endpoints"), i, e)
        {
            json_t *xf = json_object_get(e, "kv_transfer");
            const char *id = str_of(e, "id");
            if (id != NULL && strcmp(id, prefill) == 0) {
                sent = json_integer_value(json_object_get(xf, "bytes_sent")) > 0;
            }
            if (id != NULL && strcmp(id, decode) == 0) {
                received = json_integer_value(json_object_get(xf, "bytes_received")) > 0;
            }
        }
        if ((sent && received) || h_ms() >= deadline) {
            return c;
        }
        json_decref(c);
        h_sleep_ms(50);
    }
}

static void test_page_in_browser(void)
{
    struct rtc_cluster c;
    if (rtc_cluster_start(&c, "pd-always.yaml", 1, 2, NULL, NULL) != 0) {
        CU_FAIL_FATAL("the cluster did not start");
    }
    char id[OA_ID_MAX];
    EXPECT_EQ(complete(c.port, NULL, id, sizeof(id)), 200);
    CU_ASSERT(strncmp(id, "cmpl-", 5) == 0);

    /* The decision record names the request by its response id. */
    json_t *d = rtc_get_json(c.port, "/v1/decisions?limit=1&candidates=1");
    json_t *decs = json_object_get(d, "decisions");
    EXPECT_EQ(json_array_size(decs), 1);
    EXPECT_EQ(json_integer_value(json_object_get(d, "total")), 1);
    json_t *rec = json_array_get(decs, 0);
    EXPECT_STR(str_of(rec, "response_id"), id);
    EXPECT_STR(str_of(rec, "pd"), "remote");
    char decode[64], prefill[64];
    snprintf(decode, sizeof(decode), "%s", str_of(rec, "decode"));
    snprintf(prefill, sizeof(prefill), "%s", str_of(rec, "prefill"));
    /* The decode run had two candidates; one is kept, the one picked. */
    json_t *run = json_array_get(json_object_get(rec, "runs"), 0);
    EXPECT_STR(str_of(run, "profile"), "decode");
    EXPECT_EQ(json_integer_value(json_object_get(run, "candidates_total")), 2);
    json_t *cands = json_object_get(run, "candidates");
    EXPECT_EQ(json_array_size(cands), 1);
    EXPECT_STR(str_of(json_array_get(cands, 0), "endpoint"), decode);
    json_decref(d);
    struct rtc_resp r;
    EXPECT_EQ(rtc_get(c.port, "/v1/decisions?limit=-1", &r), 400);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.body ? r.body : "", "limit (records, newest first)"));
    rtc_resp_free(&r);

    /* Per endpoint: picks, and the KV bytes the heartbeats carry. */
    json_t *cl = cluster_after_transfer(c.port, prefill, decode);
    json_t *eps = json_object_get(cl, "endpoints");
    EXPECT_EQ(json_array_size(eps), 3);
    size_t i;
    json_t *e;
    json_array_foreach(eps, i, e)
    {
        const char *eid = str_of(e, "id");
        int picked = strcmp(eid, decode) == 0 || strcmp(eid, prefill) == 0;
        EXPECT_EQ(json_integer_value(json_object_get(e, "picks")), picked);
        json_t *xf = json_object_get(e, "kv_transfer");
        json_int_t sent = json_integer_value(json_object_get(xf, "bytes_sent"));
        json_int_t got = json_integer_value(json_object_get(xf, "bytes_received"));
        int ok = strcmp(eid, prefill) == 0 ? sent > 0 : sent == 0;
        ok = ok && (strcmp(eid, decode) == 0 ? got > 0 : got == 0);
        if (!ok) {
            char *s = json_dumps(e, JSON_COMPACT);
            fprintf(stderr, "\nKV bytes of %s (prefill %s, decode %s): %s\n", eid, prefill, decode,
                    s);
            free(s);
        }
        CU_ASSERT(ok);
        CU_ASSERT_PTR_NOT_NULL(json_object_get(e, "prefix_cache"));
    }

    /* The page, open without a key, in the browser. */
    char url[128], *dom, *log;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/dashboard", c.port);
    if (browse(url, &dom, &log) != 0) {
        CU_FAIL("the browser did not run the page");
        json_decref(cl);
        rtc_cluster_stop(&c);
        return;
    }
    EXPECT_EQ(console_lines(log), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(dom, "data-state=\"ok\">live"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dom, "<form id=\"keyform\" hidden"));
    /* Every worker the router lists, with its role and health. */
    char *workers = dom_tbody(dom, "workers"), *decisions = dom_tbody(dom, "decisions");
    CU_ASSERT(workers != NULL && decisions != NULL);
    if (workers == NULL || decisions == NULL) {
        fprintf(stderr, "\nthe page has no table of workers or decisions:\n%s\n", dom);
        workers = workers ? workers : strdup("");
        decisions = decisions ? decisions : strdup("");
    }
    EXPECT_EQ(count_rows(workers, "data-worker"), 3);
    json_array_foreach(eps, i, e)
    {
        char *row = dom_row(workers, "data-worker", str_of(e, "id"));
        char role[64];
        snprintf(role, sizeof(role), "<span class=\"role %s\">", str_of(e, "role"));
        if (row == NULL) {
            fprintf(stderr, "\nworker %s is not on the page\n", str_of(e, "id"));
        }
        CU_ASSERT(row != NULL && strstr(row, role) != NULL &&
                  strstr(row, "<span class=\"health up\">up</span>") != NULL);
        free(row);
    }
    json_decref(cl);
    /* The test's own decision: its workers and verdict. */
    char *row = dom_row(decisions, "data-response", id);
    if (row == NULL) {
        fprintf(stderr, "\nthe decision of %s is not on the page\n", id);
    }
    char want[256];
    snprintf(want, sizeof(want), "<td class=\"id\">%s</td><td class=\"id\">%s</td>", decode,
             prefill);
    CU_ASSERT(row != NULL && strstr(row, want) != NULL);
    CU_ASSERT(row != NULL && strstr(row, "<span class=\"pd remote\">remote</span>") != NULL);
    CU_ASSERT(row != NULL && strstr(row, "prefix-cache") != NULL);
    free(row);
    free(workers);
    free(decisions);
    /* The page measured its polls. */
    const char *polls = strstr(dom, "data-polls=\"");
    CU_ASSERT(polls != NULL && atoi(polls + 12) >= 1);
    free(dom);
    free(log);
    rtc_cluster_stop(&c);
}

static void test_page_asks_for_key(void)
{
    struct h_proc router;
    int port = 0;
    const char *args[] = {"--announce", "none",       "--log-level", "error",
                          "--api-key",  "dash-key-1", NULL};
    if (rtc_spawn_router(&router, args, &port) != 0) {
        CU_FAIL_FATAL("the router did not start");
    }
    /* The page is open like /health; its data is not. */
    struct rtc_resp r;
    EXPECT_EQ(rtc_get(port, "/dashboard", &r), 200);
    char ctype[128];
    rtc_header(r.headers, "Content-Type", ctype, sizeof(ctype));
    EXPECT_STR(ctype, "text/html; charset=utf-8");
    CU_ASSERT_PTR_NOT_NULL(strstr(r.body ? r.body : "", "<title>Tandem cluster</title>"));
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_get(port, "/v1/cluster", &r), 401);
    rtc_resp_free(&r);

    char url[160], *dom, *log;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/dashboard", port);
    if (browse(url, &dom, &log) == 0) {
        EXPECT_EQ(console_lines(log), 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(dom, "<form id=\"keyform\">"));
        CU_ASSERT_PTR_NOT_NULL(strstr(dom, "data-state=\"error\">an API key is needed"));
        char *workers = dom_tbody(dom, "workers");
        EXPECT_STR(workers, "<tbody id=\"workers\">");
        free(workers);
    } else {
        CU_FAIL("the browser did not run the page");
    }
    free(dom);
    free(log);
    /* The key in the address: the page sends it and shows the cluster. */
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/dashboard#key=dash-key-1", port);
    if (browse(url, &dom, &log) == 0) {
        EXPECT_EQ(console_lines(log), 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(dom, "<form id=\"keyform\" hidden"));
        CU_ASSERT_PTR_NOT_NULL(strstr(dom, "data-state=\"ok\">live"));
    } else {
        CU_FAIL("the browser did not run the page");
    }
    free(dom);
    free(log);
    EXPECT_EQ(h_stop(&router, SIGTERM, 10000), 0);
}

static int teardown(void)
{
    h_cleanup_all();
    return 0;
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("router_dashboard", NULL, teardown);
    CU_add_test(s, "page_in_browser", test_page_in_browser);
    CU_add_test(s, "page_asks_for_key", test_page_asks_for_key);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
