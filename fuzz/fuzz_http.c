/* The HTTP/1.1 server (common/http.c) with the OpenAI request decoding
 * (router/openai.c oa_parse) on the bodies it delivers.
 *
 * Each input is what one client sends on one TCP connection: the harness
 * connects to a server on 127.0.0.1 (one server and loop for the process),
 * writes the bytes, half-closes, reads every response byte and runs the loop
 * until the server has closed the connection and freed every request. No
 * test-only entry point is needed: the server's real read path parses the
 * bytes (they arrive in one read of up to 64 KiB, so a run is repeatable).
 *
 * The handler answers by path, so the fuzzer reaches every response shape:
 *   /v1/completions, /v1/chat/completions   oa_parse the body; the OpenAI
 *                     error (its status) or a 200 JSON, streamed as SSE when
 *                     the request says "stream": true
 *   /later            answered on the next loop turn (a reference is kept),
 *                     so pipelined responses are buffered and reordered, and
 *                     a client gone first runs the abort callback
 *   /chunked          the body echoed in chunks (Transfer-Encoding: chunked)
 *   /sse              the body as one SSE event named by the query
 *   /close            Connection: close
 *   /forget           no answer and no reference: the server answers 500
 *   /bad              a response with an invalid header first (refused),
 *                     then a valid one
 *   anything else     200 echoing method, path, query, headers and body
 * Limits are small (1 KiB of headers, 2 KiB of body, 4 pipelined, 64 KiB
 * unsent) so 413, 431, 414, pausing and the output cap are reachable.
 *
 * Properties: no crash, leak or hang (a connection must be closed within
 * 10 s); every request the server delivers has a NUL-terminated body within
 * max_body_bytes, version 10 or 11 and consistent header accessors; every
 * oa_parse error renders as JSON. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "http.h"
#include "openai.h"
#include "tandem_err.h"

#define MAX_BODY  2048
#define MAX_LATER 64

static uv_loop_t g_loop;
static struct http_server g_srv;
static int g_port;
static struct http_req *g_later[MAX_LATER];
static int g_n_later;

static const char *const text_headers[] = {"Content-Type", "text/plain", NULL};
static const char *const json_headers[] = {"Content-Type", "application/json", NULL};

static void check_req(struct http_req *req)
{
    size_t len = 0;
    const char *body = http_req_body(req, &len);
    FUZZ_CHECK(body != NULL && len <= MAX_BODY && body[len] == '\0');
    FUZZ_CHECK(http_req_version(req) == 10 || http_req_version(req) == 11);
    FUZZ_CHECK(http_req_method(req) != NULL && http_req_path(req) != NULL);
    FUZZ_CHECK(http_req_query(req) != NULL);
    size_t n = http_req_header_count(req);
    for (size_t i = 0; i < n; i++) {
        const char *name, *value;
        FUZZ_CHECK(http_req_header_at(req, i, &name, &value) == 0);
        FUZZ_CHECK(name != NULL && value != NULL);
        /* The first field of that name is what lookup finds. */
        const char *first = http_req_header(req, name);
        FUZZ_CHECK(first != NULL);
    }
    const char *name, *value;
    FUZZ_CHECK(http_req_header_at(req, n, &name, &value) == TANDEM_ERANGE);
}

static void answer_openai(struct http_req *req, enum oa_kind kind)
{
    size_t len;
    const char *body = http_req_body(req, &len);
    struct oa_request oreq;
    struct oa_error err;
    if (oa_parse(kind, body, len, &oreq, &err) != 0) {
        char *json = oa_error_json(&err);
        FUZZ_CHECK(json != NULL && err.status >= 400 && err.status <= 599);
        http_req_respond(req, err.status, json_headers, json, strlen(json));
        free(json);
        oa_request_fini(&oreq);
        return;
    }
    char json[256];
    int n = snprintf(json, sizeof json,
                     "{\"object\":\"%s\",\"max_tokens\":%d,\"n_stop\":%d,\"logprobs\":%d}",
                     kind == OA_KIND_CHAT ? "chat.completion" : "text_completion", oreq.max_tokens,
                     oreq.n_stop, oreq.logprobs);
    if (oreq.stream) {
        http_req_start_sse(req, NULL);
        http_req_write_sse(req, NULL, json, (size_t)n);
        http_req_write_sse(req, NULL, "[DONE]", 6);
        http_req_end(req);
    } else {
        http_req_respond(req, 200, json_headers, json, (size_t)n);
    }
    oa_request_fini(&oreq);
}

static void on_later_abort(struct http_req *req, void *arg)
{
    for (int i = 0; i < g_n_later; i++) {
        if (g_later[i] == req) {
            g_later[i] = g_later[--g_n_later];
            http_req_unref(req);
            return;
        }
    }
    FUZZ_CHECK(!"aborted request not in the later list");
}

/* Answers the requests kept by /later, oldest last so that responses are
 * produced out of order. */
static void answer_later(void)
{
    while (g_n_later > 0) {
        struct http_req *req = g_later[--g_n_later];
        http_req_on_abort(req, NULL, NULL);
        const char *path = http_req_path(req);
        http_req_respond(req, 200, text_headers, path, strlen(path));
        http_req_unref(req);
    }
}

static void echo(struct http_req *req)
{
    struct {
        char *data;
        size_t len;
    } out = {NULL, 0};
    FILE *f = open_memstream(&out.data, &out.len);
    FUZZ_CHECK(f != NULL);
    fprintf(f, "%s %s?%s HTTP/%d\n", http_req_method(req), http_req_path(req), http_req_query(req),
            http_req_version(req));
    size_t n = http_req_header_count(req);
    for (size_t i = 0; i < n; i++) {
        const char *name, *value;
        http_req_header_at(req, i, &name, &value);
        fprintf(f, "%s: %s\n", name, value);
    }
    size_t len;
    const char *body = http_req_body(req, &len);
    fwrite(body, 1, len, f);
    FUZZ_CHECK(fclose(f) == 0);
    http_req_respond(req, 200, text_headers, out.data, out.len);
    free(out.data);
}

static void handler(struct http_req *req, void *user)
{
    check_req(req);
    const char *path = http_req_path(req);
    size_t len;
    const char *body = http_req_body(req, &len);
    if (strcmp(path, "/v1/completions") == 0) {
        answer_openai(req, OA_KIND_COMPLETION);
    } else if (strcmp(path, "/v1/chat/completions") == 0) {
        answer_openai(req, OA_KIND_CHAT);
    } else if (strcmp(path, "/later") == 0 && g_n_later < MAX_LATER) {
        http_req_ref(req);
        http_req_on_abort(req, on_later_abort, NULL);
        g_later[g_n_later++] = req;
    } else if (strcmp(path, "/chunked") == 0) {
        http_req_start(req, 200, text_headers);
        for (size_t i = 0; i < len; i += 7)
            http_req_write(req, body + i, len - i < 7 ? len - i : 7);
        http_req_end(req);
    } else if (strcmp(path, "/sse") == 0) {
        const char *event = http_req_query(req);
        http_req_start_sse(req, NULL);
        /* An event name with CR or LF is refused: then send it unnamed. */
        if (http_req_write_sse(req, event[0] ? event : NULL, body, len) == TANDEM_EINVAL)
            http_req_write_sse(req, NULL, body, len);
        http_req_end(req);
    } else if (strcmp(path, "/close") == 0) {
        const char *h[] = {"Connection", "close", NULL};
        http_req_respond(req, 200, h, body, len);
    } else if (strcmp(path, "/forget") == 0) {
        /* the server answers 500 */
    } else if (strcmp(path, "/bad") == 0) {
        const char *h[] = {"X-Bad", "a\r\nInjected: 1", NULL};
        FUZZ_CHECK(http_req_respond(req, 200, h, "x", 1) == TANDEM_EINVAL);
        http_req_respond(req, 200, text_headers, "ok", 2);
    } else {
        echo(req);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_init_logs();
    signal(SIGPIPE, SIG_IGN);
    FUZZ_CHECK(uv_loop_init(&g_loop) == 0);
    struct http_config cfg;
    http_config_default(&cfg);
    cfg.max_header_bytes = 1024;
    cfg.max_body_bytes = MAX_BODY;
    cfg.max_pipelined = 4;
    cfg.max_output_bytes = 64 * 1024;
    cfg.date_header = 0;
    FUZZ_CHECK(http_server_init(&g_srv, &g_loop, &cfg, handler, NULL) == 0);
    FUZZ_CHECK(http_server_listen(&g_srv, "127.0.0.1", 0) == 0);
    g_port = http_server_port(&g_srv);
    FUZZ_CHECK(g_port > 0);
    return 0;
}

static int client_connect(void)
{
    /* Each connection leaves a TIME_WAIT behind (the client closes first);
     * cycling the source over 127.1.0.0/16 keeps ports from running out. A
     * connect that fails for want of a port or backlog slot on this shared
     * machine is retried: that is the environment, not the server. */
    static uint32_t n_conn;
    int fd = -1, err = 0;
    for (int attempt = 0; attempt < 200; attempt++) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        FUZZ_CHECK(fd >= 0);
        struct sockaddr_in src = {.sin_family = AF_INET};
        src.sin_addr.s_addr = htonl(0x7f010000u | (n_conn++ & 0xffffu));
        int one = 1;
        FUZZ_CHECK(setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one) == 0);
        FUZZ_CHECK(bind(fd, (struct sockaddr *)&src, sizeof src) == 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        /* The kernel completes the handshake from the listen backlog. */
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            break;
        err = errno;
        printf("fuzz_http: connect: %s (retrying)\n", strerror(err));
        fflush(stdout);
        close(fd);
        fd = -1;
        if (err != EADDRNOTAVAIL && err != EAGAIN && err != EINTR && err != ECONNREFUSED &&
            err != ETIMEDOUT)
            break;
        usleep(10000);
    }
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_server_stats st;
    http_server_get_stats(&g_srv, &st);
    uint64_t accepted = st.connections_accepted;
    int fd = client_connect();
    size_t off = 0;
    int shut = 0, eof = 0;
    uint64_t start = uv_hrtime();
    for (;;) {
        if (off < size) {
            ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
            if (n > 0)
                off += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                off = size; /* the server closed: the rest cannot be sent */
        }
        if (off == size && !shut) {
            shutdown(fd, SHUT_WR);
            shut = 1;
        }
        char buf[16384];
        ssize_t n = -1;
        while (!eof && (n = recv(fd, buf, sizeof buf, 0)) != 0) {
            if (n < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    eof = 1;
                break;
            }
        }
        if (n == 0)
            eof = 1;
        answer_later();
        http_server_get_stats(&g_srv, &st);
        if (eof && st.connections_accepted > accepted && st.connections_open == 0 &&
            st.requests_live == 0 && g_n_later == 0)
            break;
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN | (off < size ? POLLOUT : 0)},
                              {.fd = uv_backend_fd(&g_loop), .events = POLLIN}};
        int timeout = uv_backend_timeout(&g_loop);
        poll(p, 2, timeout < 0 || timeout > 50 ? 50 : timeout);
        uv_run(&g_loop, UV_RUN_NOWAIT);
        FUZZ_CHECK(uv_hrtime() - start < 10000000000ull);
    }
    close(fd);
    return 0;
}
