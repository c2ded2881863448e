/* Across hosts, with two loopback addresses standing in for two hosts
 * (Linux routes all of 127/8 to lo): host A = 127.0.0.2 runs tandem-router
 * and tandem-prefill, host B = 127.0.0.3 runs tandem-decode. Every listener
 * is given its host explicitly (router --host and --announce, workers
 * --control, --kv and --metrics-host), so nothing listens on 127.0.0.1.
 *
 *   - The same completions (prefilled on A, KV shipped to B, routing
 *     deploy/routing/pd-always.yaml) over tcp:// and over tls+tcp:// with a
 *     cluster CA made at test time (deploy/make-cluster-ca.sh, openssl) give
 *     exactly the tokens and logprobs of the single-host run (everything on
 *     127.0.0.1).
 *   - A worker whose certificate another CA signed is refused: the router
 *     never lists it, and the cluster keeps serving.
 *   - A worker whose certificate its own --tls-ca did not sign exits 2 at
 *     start (tls_init's self-check). */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "expect.h"
#include "harness.h"

#define HOST_A  "127.0.0.2"
#define HOST_B  "127.0.0.3"
#define N_REQ   3
#define MAX_TOK 8

static char certs[200]; /* temporary directory: ca/ (the cluster's), other/ */

/* ---- HTTP to any address ------------------------------------------------- */

static int tcp_connect(const char *host, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (fd < 0 || inet_pton(AF_INET, host, &a.sin_addr) != 1 ||
        connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    return fd;
}

/* One request with Connection: close; *out gets the (de-chunked) body,
 * malloc'd. Returns the status, or -1. */
static int http_do(const char *host, int port, const char *method, const char *path,
                   const char *body, char **out)
{
    *out = NULL;
    int fd = tcp_connect(host, port);
    if (fd < 0) {
        return -1;
    }
    size_t blen = body ? strlen(body) : 0;
    char head[512];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, host, port, blen);
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n ||
        (blen > 0 && send(fd, body, blen, MSG_NOSIGNAL) != (ssize_t)blen)) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    double deadline = h_ms() + 60000;
    while (buf != NULL && h_ms() < deadline) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, 1000) <= 0) {
            continue;
        }
        if (cap - len < 4096) {
            cap *= 2;
            char *b = realloc(buf, cap + 1);
            if (b == NULL) {
                break;
            }
            buf = b;
        }
        ssize_t r = recv(fd, buf + len, cap - len, 0);
        if (r <= 0) {
            break;
        }
        len += (size_t)r;
    }
    close(fd);
    if (buf == NULL) {
        return -1;
    }
    buf[len] = '\0';
    int status = -1;
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || sep == NULL) {
        free(buf);
        return -1;
    }
    *sep = '\0';
    char *b = sep + 4;
    if (strstr(buf, "chunked") != NULL) {
        char *w = b, *r = b;
        for (;;) {
            long sz = strtol(r, &r, 16);
            r = strstr(r, "\r\n");
            if (sz <= 0 || r == NULL) {
                break;
            }
            memmove(w, r + 2, (size_t)sz);
            w += sz;
            r += 2 + sz + 2;
        }
        *w = '\0';
    }
    *out = strdup(b);
    free(buf);
    return status;
}

/* A free TCP port on host (bound, then released). */
static int free_port(const char *host)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && inet_pton(AF_INET, host, &a.sin_addr) == 1 &&
        bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

static double metric(const char *host, int port, const char *series)
{
    char *body;
    double v = NAN;
    if (http_do(host, port, "GET", "/metrics", NULL, &body) == 200) {
        v = h_metric(body, series);
    }
    free(body);
    return v;
}

/* ---- A cluster on two "hosts" ------------------------------------------ */

enum mode { SINGLE_HOST, TCP, TLS };

struct cluster {
    enum mode mode;
    const char *a, *b; /* hosts */
    int port;          /* router HTTP */
    char announce[128];
    struct h_proc router, p, d;
};

/* Appends --tls-ca, --tls-cert, --tls-key for host name's files from
 * certs/<ca_dir>/; the paths live in paths. */
static void cert_args(const char **args, int *n, const char *ca_dir, const char *name,
                      char paths[3][512])
{
    snprintf(paths[0], 512, "%s/%s/ca.crt", certs, ca_dir);
    snprintf(paths[1], 512, "%s/%s/%s.crt", certs, ca_dir, name);
    snprintf(paths[2], 512, "%s/%s/%s.key", certs, ca_dir, name);
    args[(*n)++] = "--tls-ca";
    args[(*n)++] = paths[0];
    args[(*n)++] = "--tls-cert";
    args[(*n)++] = paths[1];
    args[(*n)++] = "--tls-key";
    args[(*n)++] = paths[2];
}

/* Worker args for host h: listen there, announce to c's router. */
static int spawn_worker(struct cluster *c, struct h_proc *p, const char *binary, const char *id,
                        const char *h, const char *ca_dir, int timeout_ms)
{
    const char *scheme = c->mode == TLS ? "tls+tcp" : "tcp";
    char control[128], kv[128], tls[3][512];
    snprintf(control, sizeof(control), "%s://%s:0", scheme, h);
    snprintf(kv, sizeof(kv), "%s://%s:0", scheme, h);
    const char *args[32] = {"--id",           id, "--control",   control,
                            "--kv",           kv, "--router",    c->announce,
                            "--metrics-host", h,  "--log-level", "warn"};
    int n = 12;
    if (c->mode == TLS) {
        cert_args(args, &n, ca_dir, h, tls);
    }
    args[n] = NULL;
    return h_spawn(p, binary, args, timeout_ms);
}

static int wait_healthy(const struct cluster *c, int want, int timeout_ms)
{
    double deadline = h_ms() + timeout_ms;
    int last = -1;
    while (h_ms() < deadline) {
        char *body;
        if (http_do(c->a, c->port, "GET", "/health", NULL, &body) == 200) {
            const char *h = strstr(body, "\"healthy_endpoints\":");
            last = h ? atoi(h + 20) : -1;
        }
        free(body);
        if (last == want) {
            return 0;
        }
        h_sleep_ms(50);
    }
    fprintf(stderr, "\n%d of %d endpoints healthy\n", last, want);
    return -1;
}

static int cluster_start(struct cluster *c, enum mode mode)
{
    memset(c, 0, sizeof(*c));
    c->mode = mode;
    c->a = mode == SINGLE_HOST ? "127.0.0.1" : HOST_A;
    c->b = mode == SINGLE_HOST ? "127.0.0.1" : HOST_B;
    c->port = free_port(c->a);
    snprintf(c->announce, sizeof(c->announce), "%s://%s:%d", mode == TLS ? "tls+tcp" : "tcp", c->a,
             free_port(c->a));
    char port_s[16], routing[512], tls[3][512];
    snprintf(port_s, sizeof(port_s), "%d", c->port);
    const char *src = getenv("TANDEM_SOURCE_DIR");
    snprintf(routing, sizeof(routing), "%s/deploy/routing/pd-always.yaml", src ? src : ".");
    const char *args[32] = {"--host",
                            c->a,
                            "--port",
                            port_s,
                            "--announce",
                            c->announce,
                            "--routing",
                            routing,
                            "--log-level",
                            "warn",
                            "--heartbeat-timeout-ms",
                            "5000"};
    int n = 12;
    if (mode == TLS) {
        cert_args(args, &n, "ca", c->a, tls);
    }
    args[n] = NULL;
    if (h_spawn(&c->router, "tandem-router", args, 20000) != 0 ||
        spawn_worker(c, &c->p, "tandem-prefill", "prefill-a", c->a, "ca", 20000) != 0 ||
        spawn_worker(c, &c->d, "tandem-decode", "decode-b", c->b, "ca", 20000) != 0) {
        return -1;
    }
    return wait_healthy(c, 2, 15000);
}

static void cluster_stop(struct cluster *c)
{
    EXPECT_EQ(h_stop(&c->router, SIGTERM, 5000), 0);
    EXPECT_EQ(h_stop(&c->d, SIGTERM, 5000), 0);
    EXPECT_EQ(h_stop(&c->p, SIGTERM, 5000), 0);
}

/* What a run produced, per request: the text and the logprobs as JSON. */
struct outputs {
    char *text[N_REQ];
    char *logprobs[N_REQ];
};

static void outputs_free(struct outputs *o)
{
    for (int i = 0; i < N_REQ; i++) {
        free(o->text[i]);
        free(o->logprobs[i]);
    }
}

/* N_REQ completions of 100-token prompts, MAX_TOK greedy tokens each.
 * first: the cluster's first round (the metrics count only this one). */
static void run_requests(const struct cluster *c, struct outputs *o, int first)
{
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < N_REQ; i++) {
        uint32_t prompt[100];
        h_prompt(prompt, 100, (uint64_t)(40 + i), 3, 259);
        char body[2048];
        size_t len = (size_t)snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"prompt\":[");
        for (int k = 0; k < 100; k++) {
            len +=
                (size_t)snprintf(body + len, sizeof(body) - len, "%s%u", k ? "," : "", prompt[k]);
        }
        snprintf(body + len, sizeof(body) - len,
                 "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":1}",
                 MAX_TOK);
        char *resp;
        int st = http_do(c->a, c->port, "POST", "/v1/completions", body, &resp);
        EXPECT_EQ(st, 200);
        json_t *j = st == 200 ? json_loads(resp, JSON_ALLOW_NUL, NULL) : NULL;
        if (j == NULL) {
            fprintf(stderr, "\ncompletion: %d %s\n", st, resp ? resp : "");
        }
        free(resp);
        CU_ASSERT_PTR_NOT_NULL_FATAL(j);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *t = json_string_value(json_object_get(ch, "text"));
        json_t *lp = json_object_get(json_object_get(ch, "logprobs"), "token_logprobs");
        EXPECT_EQ(json_array_size(lp), MAX_TOK);
        EXPECT_EQ(
            json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")),
            MAX_TOK);
        o->text[i] = strdup(t ? t : "(none)");
        o->logprobs[i] = json_dumps(lp, JSON_COMPACT);
        json_decref(j);
    }
    if (!first) {
        return;
    }
    /* Every request was prefilled on A and its KV shipped to B: 100 tokens
     * are 6 full blocks and a partial one. */
    EXPECT_EQ(metric(c->a, c->port, "tandem:pd_decisions_total{prefill=\"remote\"}"), N_REQ);
    EXPECT_EQ(metric(c->b, c->d.metrics_port, "tandem:kv_frames_installed_total"), N_REQ * 7);
}

static void expect_same(const struct outputs *got, const struct outputs *want, const char *what)
{
    for (int i = 0; i < N_REQ; i++) {
        int same = got->text[i] && want->text[i] && strcmp(got->text[i], want->text[i]) == 0 &&
                   got->logprobs[i] && want->logprobs[i] &&
                   strcmp(got->logprobs[i], want->logprobs[i]) == 0;
        if (!same) {
            fprintf(stderr, "\n%s, request %d:\n  got  [%s] %s\n  want [%s] %s\n", what, i,
                    got->text[i], got->logprobs[i], want->text[i], want->logprobs[i]);
        }
        CU_ASSERT(same);
    }
}

/* Listeners are where they were told to be, addresses announced as such. */
static void expect_addresses(const struct cluster *c)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "%s://%s:", c->mode == TLS ? "tls+tcp" : "tcp", c->b);
    CU_ASSERT(strncmp(c->d.control, prefix, strlen(prefix)) == 0);
    CU_ASSERT(strncmp(c->d.kv, prefix, strlen(prefix)) == 0);
    snprintf(prefix, sizeof(prefix), "%s://%s:", c->mode == TLS ? "tls+tcp" : "tcp", c->a);
    CU_ASSERT(strncmp(c->p.control, prefix, strlen(prefix)) == 0);
    CU_ASSERT(strncmp(c->p.kv, prefix, strlen(prefix)) == 0);
    snprintf(prefix, sizeof(prefix), "%s:", c->b);
    CU_ASSERT(strncmp(c->d.metrics, prefix, strlen(prefix)) == 0);
    /* Nothing of the router's on 127.0.0.1. */
    char *body;
    EXPECT_EQ(http_do("127.0.0.1", c->port, "GET", "/health", NULL, &body), -1);
    free(body);
    EXPECT_EQ(http_do("127.0.0.1", c->d.metrics_port, "GET", "/health", NULL, &body), -1);
    free(body);
    EXPECT_EQ(http_do(c->b, c->d.metrics_port, "GET", "/health", NULL, &body), 200);
    free(body);
}

static struct outputs single; /* the single-host run: the reference */

static void test_single_host(void)
{
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, SINGLE_HOST) == 0);
    run_requests(&c, &single, 1);
    cluster_stop(&c);
    for (int i = 0; i < N_REQ; i++) {
        /* The text may be empty (byte tokens that are no UTF-8); the
         * logprobs are never. */
        CU_ASSERT(single.text[i] != NULL && single.logprobs[i] != NULL &&
                  strlen(single.logprobs[i]) > 2 * MAX_TOK);
    }
}

static void test_tcp(void)
{
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, TCP) == 0);
    expect_addresses(&c);
    struct outputs o;
    run_requests(&c, &o, 1);
    expect_same(&o, &single, "tcp:// across hosts");
    outputs_free(&o);
    cluster_stop(&c);
}

static void test_tls(void)
{
    struct cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, TLS) == 0);
    expect_addresses(&c);
    struct outputs o;
    run_requests(&c, &o, 1);
    expect_same(&o, &single, "tls+tcp:// across hosts");
    outputs_free(&o);

    /* A decode worker on B with a certificate from another CA (and that CA
     * as its own, so it starts): its announcements never get through the
     * router's handshake, so the router never lists it. */
    struct h_proc rogue;
    CU_ASSERT_FATAL(spawn_worker(&c, &rogue, "tandem-decode", "rogue-b", HOST_B, "other", 20000) ==
                    0);
    h_sleep_ms(2500); /* two announcement periods and more */
    char *body;
    EXPECT_EQ(http_do(c.a, c.port, "GET", "/v1/cluster", NULL, &body), 200);
    CU_ASSERT(body != NULL && strstr(body, "rogue-b") == NULL);
    CU_ASSERT(body != NULL && strstr(body, "decode-b") != NULL);
    free(body);
    EXPECT_EQ(wait_healthy(&c, 2, 1000), 0);
    /* The cluster still serves, with the same tokens. */
    run_requests(&c, &o, 0);
    expect_same(&o, &single, "tls+tcp:// after a refused worker");
    outputs_free(&o);
    EXPECT_EQ(h_stop(&rogue, SIGTERM, 5000), 0);

    /* A worker whose certificate its own CA did not sign stops at start. */
    char ca[400], cert[400], key[400], control[64];
    snprintf(ca, sizeof(ca), "%s/ca/ca.crt", certs);
    snprintf(cert, sizeof(cert), "%s/other/%s.crt", certs, HOST_B);
    snprintf(key, sizeof(key), "%s/other/%s.key", certs, HOST_B);
    snprintf(control, sizeof(control), "tls+tcp://%s:0", HOST_B);
    const char *bad[] = {"--control", control,     "--tls-ca", ca,  "--tls-cert",
                         cert,        "--tls-key", key,        NULL};
    EXPECT_EQ(h_run("tandem-decode", bad, 20000, 0), 2);
    cluster_stop(&c);
}

static int suite_init(void)
{
    h_init();
    /* Linux routes 127/8 to lo; elsewhere these tests cannot run. */
    if (free_port(HOST_A) < 0 || free_port(HOST_B) < 0) {
        fprintf(stderr, "test_multihost: cannot bind %s and %s\n", HOST_A, HOST_B);
        return 1;
    }
    const char *src = getenv("TANDEM_SOURCE_DIR");
    snprintf(certs, sizeof(certs), "%s/certs", h_tmpdir());
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s/deploy/make-cluster-ca.sh %s/ca %s %s >/dev/null && "
             "TANDEM_CA_SUBJECT=/CN=another-ca %s/deploy/make-cluster-ca.sh %s/other %s "
             ">/dev/null",
             src ? src : ".", certs, HOST_A, HOST_B, src ? src : ".", certs, HOST_B);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_multihost: %s failed (openssl installed?)\n", cmd);
        return 1;
    }
    return 0;
}

static int suite_fini(void)
{
    h_cleanup_all();
    outputs_free(&single);
    if (certs[0] != '\0') {
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", certs);
        if (system(cmd) != 0) {
            fprintf(stderr, "test_multihost: cannot remove %s\n", certs);
        }
    }
    return 0;
}

static void teardown(void)
{
    h_cleanup_all();
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s =
        CU_add_suite_with_setup_and_teardown("multihost", suite_init, suite_fini, NULL, teardown);
    CU_add_test(s, "single_host", test_single_host);
    CU_add_test(s, "tcp", test_tcp);
    CU_add_test(s, "tls", test_tls);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
