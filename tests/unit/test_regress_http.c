/* Regressions found by fuzz/fuzz_http: each test replays the input that
 * broke a property (docs/reliability.md "## Bad input"), over loopback TCP
 * against a real server. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http.h"
#include "tandem_err.h"

static uv_loop_t loop;
static struct http_server srv;
static int n_handled, last_version;

static void handler(struct http_req *req, void *user)
{
    n_handled++;
    last_version = http_req_version(req);
    char body[16];
    int n = snprintf(body, sizeof body, "v%d", last_version);
    http_req_respond(req, 200, NULL, body, (size_t)n);
}

/* Sends req on a new connection, half-closes, and collects the response
 * until the server closes (the loop runs in between). Returns its length. */
static size_t exchange(const char *req, char *out, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)http_server_port(&srv))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CU_ASSERT_EQUAL_FATAL(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    CU_ASSERT_EQUAL(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    shutdown(fd, SHUT_WR);
    size_t len = 0;
    for (int i = 0; i < 2000; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5) == 1) {
            ssize_t n = recv(fd, out + len, cap - 1 - len, 0);
            if (n <= 0)
                break;
            len += (size_t)n;
        }
    }
    out[len] = '\0';
    close(fd);
    for (int i = 0; i < 50; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    return len;
}

static void expect_prefix(const char *got, const char *want)
{
    int ok = strncmp(got, want, strlen(want)) == 0;
    if (!ok)
        fprintf(stderr, "\n  got  [%.60s]\n  want [%s...]\n", got, want);
    CU_ASSERT(ok);
}

/* fuzz_http: "HTTP/2.1" in the request line was parsed as version 21 and
 * handed to the handler (http_req_version promises 10 or 11). Any major
 * version but 1 is now 505; a later 1.x minor is served as 1.1. */
static void test_version(void)
{
    char buf[4096];
    n_handled = 0;
    exchange("GET /health HTTP/2.1\r\nHost: l fuzz\r\n\r\n", buf, sizeof buf);
    expect_prefix(buf, "HTTP/1.1 505 HTTP Version Not Supported\r\n");
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "HTTP version not supported"));
    exchange("GET /old HTTP/0.9\r\n\r\n", buf, sizeof buf);
    expect_prefix(buf, "HTTP/1.1 505 ");
    CU_ASSERT_EQUAL(n_handled, 0);

    exchange("GET /minor HTTP/1.2\r\n\r\n", buf, sizeof buf);
    expect_prefix(buf, "HTTP/1.1 200 OK\r\n");
    CU_ASSERT_EQUAL(n_handled, 1);
    CU_ASSERT_EQUAL(last_version, 11);
    exchange("GET /ten HTTP/1.0\r\n\r\n", buf, sizeof buf);
    expect_prefix(buf, "HTTP/1.1 200 OK\r\n");
    CU_ASSERT_EQUAL(n_handled, 2);
    CU_ASSERT_EQUAL(last_version, 10);
}

static int closed;

static void on_closed(struct http_server *s)
{
    closed = 1;
}

int main(void)
{
    uv_loop_init(&loop);
    if (http_server_init(&srv, &loop, NULL, handler, NULL) != 0 ||
        http_server_listen(&srv, "127.0.0.1", 0) != 0) {
        fprintf(stderr, "cannot start the server\n");
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("regress_http", NULL, NULL);
    CU_add_test(s, "version", test_version);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    http_server_close(&srv, on_closed);
    while (!closed)
        uv_run(&loop, UV_RUN_ONCE);
    uv_loop_close(&loop);
    return failed ? 1 : 0;
}
