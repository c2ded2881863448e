/* tandem bench end to end: a fake OpenAI server written here on common/http.h
 * (real HTTP over loopback, in its own thread and loop) streams deterministic
 * tokens after controlled delays; lg_run (loadgen/run.h) and the tandem
 * binary run against it. Counts are asserted exactly; times only within
 * generous bounds (the machines are noisy). A raw socket server covers what
 * http.h cannot send: malformed HTTP and a stream cut in the middle.
 *
 * Fake server behaviour by the request's "model":
 *   anything else  stream max_tokens tokens "t0 ", "t1 ", ... : the first after
 *                  ttft_ms, then one per itl_ms; then a usage chunk
 *                  (prompt_tokens = prompt bytes or ids, cached = half), [DONE]
 *   err503         503 with an OpenAI error body
 *   garbled        an SSE stream whose data is not JSON
 *   hang           never answers
 *   empty          an SSE stream with only [DONE]
 *   plain          a whole (non-streamed) JSON completion */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "bench.h"
#include "flags.h"
#include "http.h"
#include "loadgen/arrivals.h"
#include "loadgen/run.h"
#include "loadgen/summary.h"
#include "log.h"
#include "tandem_err.h"

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define EXPECT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            fprintf(stderr, "\n%s:%d: %s == %lld, want %lld\n", __FILE__, __LINE__, #a, a_, b_);   \
        CU_ASSERT(a_ == b_);                                                                       \
    } while (0)

#define EXPECT_RANGE(v, lo, hi)                                                                    \
    do {                                                                                           \
        double v_ = (v);                                                                           \
        int ok_ = v_ >= (lo) && v_ <= (hi);                                                        \
        if (!ok_)                                                                                  \
            fprintf(stderr, "\n%s:%d: %s == %g, want [%g, %g]\n", __FILE__, __LINE__, #v, v_,      \
                    (double)(lo), (double)(hi));                                                   \
        CU_ASSERT(ok_);                                                                            \
    } while (0)

/* ---- the fake OpenAI server ---- */

struct fake {
    uv_loop_t loop;
    struct http_server srv;
    uv_async_t stop;
    pthread_t thread;
    int port;
    int ttft_ms, itl_ms; /* set before a run; read by the server thread */
    pthread_mutex_t mu;  /* guards everything below and ready */
    pthread_cond_t cv;
    int ready;
    int requests, models_requests, active, max_active, hanging, no_ignore_eos;
    int chat_n;
    int chat_msgs[64];       /* messages in each chat request, in arrival order */
    char chat_last[64][128]; /* the last assistant message before the new user one */
    char last_model[64];
};

static struct fake fk;

struct stream {
    uv_timer_t timer;
    struct http_req *req;
    int chat;
    int sent, n;
    int prompt_tokens;
    int counted; /* in fk.active */
};

static void stream_closed(uv_handle_t *h)
{
    free(container_of((uv_timer_t *)h, struct stream, timer));
}

static void stream_done(struct stream *st)
{
    pthread_mutex_lock(&fk.mu);
    if (st->counted) {
        fk.active--;
    }
    pthread_mutex_unlock(&fk.mu);
    uv_timer_stop(&st->timer);
    http_req_unref(st->req);
    uv_close((uv_handle_t *)&st->timer, stream_closed);
}

static void stream_abort(struct http_req *req, void *arg)
{
    stream_done(arg);
}

static void stream_tick(uv_timer_t *t)
{
    struct stream *st = container_of(t, struct stream, timer);
    char buf[512];
    int n;
    if (st->sent < st->n) {
        const char *fin = st->sent + 1 == st->n ? "\"length\"" : "null";
        if (st->chat) {
            n = snprintf(buf, sizeof(buf),
                         "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
                         "\"delta\":{\"content\":\"t%d \"},\"finish_reason\":%s}]}",
                         st->sent, fin);
        } else {
            n = snprintf(buf, sizeof(buf),
                         "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,"
                         "\"text\":\"t%d \",\"finish_reason\":%s}]}",
                         st->sent, fin);
        }
        http_req_write_sse(st->req, NULL, buf, (size_t)n);
        st->sent++;
        uv_timer_start(&st->timer, stream_tick, (uint64_t)fk.itl_ms, 0);
        return;
    }
    n = snprintf(buf, sizeof(buf),
                 "{\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                 "\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}",
                 st->prompt_tokens, st->n, st->prompt_tokens + st->n, st->prompt_tokens / 2);
    http_req_write_sse(st->req, NULL, buf, (size_t)n);
    http_req_write_sse(st->req, NULL, "[DONE]", 6);
    http_req_end(st->req);
    stream_done(st);
}

static const char *const json_hdr[] = {"Content-Type", "application/json", NULL};

/* Records a chat request's shape: message count and the last assistant text. */
static void note_chat(const json_t *msgs)
{
    pthread_mutex_lock(&fk.mu);
    if (fk.chat_n < 64) {
        fk.chat_msgs[fk.chat_n] = (int)json_array_size(msgs);
        fk.chat_last[fk.chat_n][0] = '\0';
        for (size_t i = 0; i < json_array_size(msgs); i++) {
            const json_t *m = json_array_get(msgs, i);
            if (strcmp(json_string_value(json_object_get(m, "role")), "assistant") == 0) {
                snprintf(fk.chat_last[fk.chat_n], sizeof(fk.chat_last[0]), "%s",
                         json_string_value(json_object_get(m, "content")));
            }
        }
    }
    fk.chat_n++;
    pthread_mutex_unlock(&fk.mu);
}

static int prompt_size(const json_t *body, int chat)
{
    if (chat) {
        int n = 0;
        const json_t *msgs = json_object_get(body, "messages");
        for (size_t i = 0; i < json_array_size(msgs); i++) {
            n += (int)json_string_length(json_object_get(json_array_get(msgs, i), "content"));
        }
        return n;
    }
    const json_t *p = json_object_get(body, "prompt");
    return json_is_array(p) ? (int)json_array_size(p) : (int)json_string_length(p);
}

static void handler(struct http_req *req, void *user)
{
    const char *path = http_req_path(req);
    if (strcmp(http_req_method(req), "GET") == 0 && strcmp(path, "/v1/models") == 0) {
        pthread_mutex_lock(&fk.mu);
        fk.models_requests++;
        pthread_mutex_unlock(&fk.mu);
        const char *b =
            "{\"object\":\"list\",\"data\":[{\"id\":\"fake-model\",\"object\":\"model\"}]}";
        http_req_respond(req, 200, json_hdr, b, strlen(b));
        return;
    }
    int chat = strcmp(path, "/v1/chat/completions") == 0;
    if (!chat && strcmp(path, "/v1/completions") != 0) {
        http_req_respond(req, 404, json_hdr, "{\"detail\":\"Not Found\"}", 22);
        return;
    }
    size_t len;
    const char *text = http_req_body(req, &len);
    json_t *body = json_loadb(text, len, 0, NULL);
    const char *model = json_string_value(json_object_get(body, "model"));
    model = model ? model : "";
    pthread_mutex_lock(&fk.mu);
    fk.requests++;
    snprintf(fk.last_model, sizeof(fk.last_model), "%s", model);
    if (!json_is_true(json_object_get(body, "ignore_eos"))) {
        fk.no_ignore_eos++;
    }
    pthread_mutex_unlock(&fk.mu);
    if (chat) {
        note_chat(json_object_get(body, "messages"));
    }
    if (strcmp(model, "err503") == 0) {
        const char *b = "{\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}";
        http_req_respond(req, 503, json_hdr, b, strlen(b));
    } else if (strcmp(model, "garbled") == 0) {
        http_req_start_sse(req, NULL);
        http_req_write(req, "data: {not json\n\n", 17);
        http_req_end(req);
    } else if (strcmp(model, "empty") == 0) {
        http_req_start_sse(req, NULL);
        http_req_write_sse(req, NULL, "[DONE]", 6);
        http_req_end(req);
    } else if (strcmp(model, "plain") == 0) {
        const char *b =
            "{\"choices\":[{\"index\":0,\"text\":\"abc\",\"finish_reason\":\"length\"}],"
            "\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3}}";
        http_req_respond(req, 200, json_hdr, b, strlen(b));
    } else {
        struct stream *st = calloc(1, sizeof(*st));
        st->req = req;
        st->chat = chat;
        st->n = (int)json_integer_value(json_object_get(body, "max_tokens"));
        st->prompt_tokens = prompt_size(body, chat);
        http_req_ref(req);
        http_req_on_abort(req, stream_abort, st);
        uv_timer_init(&fk.loop, &st->timer);
        st->counted = 1;
        pthread_mutex_lock(&fk.mu);
        fk.active++;
        if (fk.active > fk.max_active) {
            fk.max_active = fk.active;
        }
        int hang = strcmp(model, "hang") == 0;
        fk.hanging += hang;
        pthread_mutex_unlock(&fk.mu);
        http_req_start_sse(req, NULL);
        if (chat) { /* the role chunk first, at once, as vLLM sends it */
            const char *role = "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                               "\"content\":\"\"},\"finish_reason\":null}]}";
            http_req_write_sse(req, NULL, role, strlen(role));
        }
        if (!hang) {
            uv_timer_start(&st->timer, stream_tick, (uint64_t)fk.ttft_ms, 0);
        }
    }
    json_decref(body);
}

static void stop_cb(uv_async_t *a)
{
    http_server_close(&fk.srv, NULL);
    uv_close((uv_handle_t *)&fk.stop, NULL);
}

static void *server_main(void *arg)
{
    uv_run(&fk.loop, UV_RUN_DEFAULT);
    return NULL;
}

static int fake_start(void)
{
    memset(&fk, 0, sizeof(fk));
    pthread_mutex_init(&fk.mu, NULL);
    pthread_cond_init(&fk.cv, NULL);
    fk.ttft_ms = 50;
    fk.itl_ms = 10;
    struct http_config hc;
    http_config_default(&hc);
    hc.max_connections = 8192; /* the scale test holds thousands */
    if (uv_loop_init(&fk.loop) != 0 || http_server_init(&fk.srv, &fk.loop, &hc, handler, NULL) ||
        http_server_listen(&fk.srv, "127.0.0.1", 0) != 0) {
        return -1;
    }
    fk.port = http_server_port(&fk.srv);
    uv_async_init(&fk.loop, &fk.stop, stop_cb);
    return pthread_create(&fk.thread, NULL, server_main, NULL);
}

static void fake_stop(void)
{
    uv_async_send(&fk.stop);
    pthread_join(fk.thread, NULL);
    uv_loop_close(&fk.loop);
}

static void fake_reset(int ttft_ms, int itl_ms)
{
    pthread_mutex_lock(&fk.mu);
    fk.ttft_ms = ttft_ms;
    fk.itl_ms = itl_ms;
    fk.requests = fk.models_requests = fk.max_active = fk.hanging = fk.no_ignore_eos = 0;
    fk.chat_n = 0;
    pthread_mutex_unlock(&fk.mu);
}

/* ---- helpers ---- */

static void config(struct lg_run_config *c, const char *model, int n)
{
    lg_run_config_default(c);
    c->host = "127.0.0.1";
    c->port = fk.port;
    c->model = model;
    c->num_prompts = n;
    c->request_timeout_s = 20;
    c->workload.seed = 1;
    c->workload.random_input_len = 32;
    c->workload.random_output_len = 8;
}

static int run(const struct lg_run_config *c, struct lg_run_result *res)
{
    char err[512] = "";
    int rc = lg_run(c, res, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "\nlg_run: %s (%s)\n", tandem_strerror(rc), err);
    }
    return rc;
}

static struct lg_summary summarize(const struct lg_run_result *res)
{
    struct lg_summary_opts o;
    memset(&o, 0, sizeof(o));
    lg_parse_percentiles("50,90,99", &o);
    lg_slo_clear(&o.slo);
    struct lg_summary s;
    CU_ASSERT_EQUAL(lg_summary_compute(res->records, res->n, res->duration_s, &o, &s), 0);
    return s;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- tests ---- */

/* Closed loop of 4 against 50 ms to the first token and 10 ms per token. */
static void test_timing(void)
{
    fake_reset(50, 10);
    struct lg_run_config c;
    config(&c, "fake", 24);
    c.max_concurrency = 4;
    c.num_warmups = 3;
    struct lg_run_result res;
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    EXPECT_EQ(res.n, 24);
    EXPECT_EQ(res.warmups_ok, 3);
    for (size_t i = 0; i < res.n; i++) {
        const struct lg_record *r = &res.records[i];
        EXPECT_EQ(r->index, (long long)i);
        CU_ASSERT_TRUE(r->ok);
        EXPECT_EQ(r->http_status, 200);
        EXPECT_EQ(r->output_tokens, 8);
        CU_ASSERT_TRUE(r->usage_output);
        EXPECT_EQ(r->n_chunks, 8);
        EXPECT_EQ(r->n_itl, 7);
        EXPECT_EQ(r->prompt_tokens, 32);
        EXPECT_EQ(r->cached_tokens, 16);
        CU_ASSERT_TRUE(r->done_marker);
        EXPECT_RANGE(r->ttft_s, 0.045, 2.0);
        EXPECT_RANGE(r->e2el_s, 0.045 + 7 * 0.009, 4.0);
    }
    struct lg_summary s = summarize(&res);
    EXPECT_EQ(s.completed, 24);
    EXPECT_EQ(s.failed, 0);
    EXPECT_EQ(s.total_output, 24 * 8);
    EXPECT_EQ(s.total_input, 24 * 32);
    EXPECT_EQ(s.itl.n, 24 * 7);
    printf("\n  measured: TTFT median %.1f ms (server 50), ITL median %.1f ms (10), TPOT mean "
           "%.1f ms, E2EL median %.1f ms (120)\n",
           s.ttft.median, s.itl.median, s.tpot.mean, s.e2el.median);
    EXPECT_RANGE(s.ttft.median, 45, 300);
    EXPECT_RANGE(s.itl.median, 7, 100);
    EXPECT_RANGE(s.tpot.mean, 8, 100);
    EXPECT_RANGE(s.e2el.median, 45 + 63, 1000);
    EXPECT_RANGE(s.cached_token_ratio, 0.5, 0.5);
    /* The concurrency cap held, on both sides. */
    CU_ASSERT(s.max_concurrent_requests <= 4);
    pthread_mutex_lock(&fk.mu);
    EXPECT_EQ(fk.requests, 27);
    CU_ASSERT(fk.max_active <= 4);
    EXPECT_EQ(fk.no_ignore_eos, 0);
    EXPECT_EQ(fk.models_requests, 0);
    pthread_mutex_unlock(&fk.mu);
    /* Keep-alive: 4 connections serve the 27 requests. */
    CU_ASSERT(res.http.connections_opened <= 8);
    CU_ASSERT(res.http.connections_reused >= 19);
    /* 24 requests, 4 at a time, >= 120 ms each: at least 6 x 120 ms. */
    EXPECT_RANGE(res.duration_s, 0.7, 20);
    lg_run_result_free(&res);
}

/* Open loop: requests go out at the generated arrival times. */
static void test_open_loop(void)
{
    fake_reset(5, 5);
    struct lg_run_config c;
    config(&c, "fake", 20);
    c.request_rate = 40;
    c.workload.seed = 3;
    c.workload.random_output_len = 3;
    struct lg_run_result res;
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    double t[20];
    CU_ASSERT_EQUAL(lg_arrivals_fill(40, 1, 3, 1, 20, t), 0);
    EXPECT_EQ(res.n, 20);
    for (size_t i = 0; i < res.n && i < 20; i++) {
        const struct lg_record *r = &res.records[i];
        CU_ASSERT_TRUE(r->ok);
        CU_ASSERT_EQUAL(r->arrival_s, t[i]);
        EXPECT_RANGE(r->start_s - r->arrival_s, 0, 0.25);
    }
    CU_ASSERT_DOUBLE_EQUAL(t[19], 0.5, 1e-9); /* normalised: 20 / 40 */
    EXPECT_RANGE(res.duration_s, 0.5, 10);
    lg_run_result_free(&res);
}

static void expect_all_failed(const struct lg_run_result *res, size_t n, enum lg_fail reason,
                              const char *msg_part)
{
    EXPECT_EQ(res->n, (long long)n);
    for (size_t i = 0; i < res->n; i++) {
        const struct lg_record *r = &res->records[i];
        CU_ASSERT_FALSE(r->ok);
        EXPECT_EQ(r->reason, reason);
        CU_ASSERT_PTR_NOT_NULL(r->error);
        if (r->error != NULL && msg_part != NULL && strstr(r->error, msg_part) == NULL) {
            fprintf(stderr, "\nerror '%s' lacks '%s'\n", r->error, msg_part);
            CU_FAIL("error message");
        }
    }
}

static void test_failures(void)
{
    fake_reset(5, 5);
    struct lg_run_config c;
    struct lg_run_result res;

    config(&c, "err503", 3);
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    expect_all_failed(&res, 3, LG_FAIL_HTTP, "HTTP 503: overloaded");
    EXPECT_EQ(res.records[0].http_status, 503);
    struct lg_summary s = summarize(&res);
    EXPECT_EQ(s.failed, 3);
    EXPECT_EQ(s.n_failure_kinds, 1);
    CU_ASSERT_STRING_EQUAL(s.failures[0].key, "http_503");
    lg_run_result_free(&res);

    config(&c, "garbled", 3);
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    expect_all_failed(&res, 3, LG_FAIL_BAD_STREAM, "malformed SSE data");
    lg_run_result_free(&res);

    config(&c, "empty", 2);
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    expect_all_failed(&res, 2, LG_FAIL_NO_TOKENS, "without a token");
    CU_ASSERT_TRUE(res.records[0].done_marker);
    lg_run_result_free(&res);

    /* A hanging server: the timeout ends every request, and the run. */
    config(&c, "hang", 3);
    c.request_timeout_s = 0.3;
    double t0 = now_s();
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    EXPECT_RANGE(now_s() - t0, 0.25, 10);
    expect_all_failed(&res, 3, LG_FAIL_TIMEOUT, "timed out");
    lg_run_result_free(&res);

    /* A whole JSON response (no stream) still counts: one chunk at the end. */
    config(&c, "plain", 2);
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    EXPECT_EQ(res.n, 2);
    CU_ASSERT_TRUE(res.records[0].ok);
    EXPECT_EQ(res.records[0].n_chunks, 1);
    EXPECT_EQ(res.records[0].output_tokens, 3);
    EXPECT_EQ(res.records[0].prompt_tokens, 9);
    CU_ASSERT_EQUAL(res.records[0].ttft_s, res.records[0].e2el_s);
    lg_run_result_free(&res);

    /* Nobody listening. */
    int sock = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    CU_ASSERT_EQUAL(bind(sock, (struct sockaddr *)&a, sizeof(a)), 0);
    getsockname(sock, (struct sockaddr *)&a, &alen);
    close(sock); /* the port is now closed */
    config(&c, "fake", 3);
    c.port = ntohs(a.sin_port);
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    expect_all_failed(&res, 3, LG_FAIL_CONNECT, "connect");
    lg_run_result_free(&res);

    /* Without --model: the first of GET /v1/models. */
    config(&c, NULL, 2);
    c.workload.random_output_len = 2;
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    CU_ASSERT_STRING_EQUAL(res.model, "fake-model");
    EXPECT_EQ(res.n, 2);
    CU_ASSERT_TRUE(res.records[1].ok);
    pthread_mutex_lock(&fk.mu);
    EXPECT_EQ(fk.models_requests, 1);
    CU_ASSERT_STRING_EQUAL(fk.last_model, "fake-model");
    pthread_mutex_unlock(&fk.mu);
    lg_run_result_free(&res);

    /* ... and when that fails, the run does not start. */
    config(&c, NULL, 2);
    c.models_path = "/nope";
    char err[512];
    CU_ASSERT_EQUAL(lg_run(&c, &res, err, sizeof(err)), TANDEM_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "HTTP 404"));
}

/* ---- a raw server for what http.h never sends ---- */

struct raw {
    int fd;
    int conns;
    const char *reply; /* written after the request's headers arrive, then close */
    pthread_t thread;
};

static void *raw_main(void *arg)
{
    struct raw *r = arg;
    for (int i = 0; i < r->conns; i++) {
        int c = accept(r->fd, NULL, NULL);
        if (c < 0) {
            break;
        }
        char buf[8192];
        ssize_t got = 0, n;
        while ((n = read(c, buf + got, sizeof(buf) - 1 - (size_t)got)) > 0) {
            got += n;
            buf[got] = '\0';
            if (strstr(buf, "\r\n\r\n") != NULL) { /* body: short, in the same read or next */
                break;
            }
        }
        if (write(c, r->reply, strlen(r->reply)) < 0) {
            /* the client is gone: nothing to do */
        }
        usleep(20000);
        close(c);
    }
    return NULL;
}

static int raw_start(struct raw *r, const char *reply, int conns)
{
    r->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    if (bind(r->fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(r->fd, 16) != 0) {
        return -1;
    }
    getsockname(r->fd, (struct sockaddr *)&a, &alen);
    r->reply = reply;
    r->conns = conns;
    pthread_create(&r->thread, NULL, raw_main, r);
    return ntohs(a.sin_port);
}

static void raw_stop(struct raw *r)
{
    pthread_join(r->thread, NULL);
    close(r->fd);
}

static void test_raw_failures(void)
{
    struct lg_run_config c;
    struct lg_run_result res;
    struct raw r;

    int port = raw_start(&r, "HTTP/1.1 2x0 Nonsense\r\n\r\n", 2);
    CU_ASSERT_FATAL(port > 0);
    config(&c, "fake", 2);
    c.port = port;
    c.max_concurrency = 1;
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    expect_all_failed(&res, 2, LG_FAIL_BAD_HTTP, "malformed HTTP");
    lg_run_result_free(&res);
    raw_stop(&r);

    /* A chunked SSE stream cut after one token. */
    port = raw_start(&r,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n"
                     "24\r\ndata: {\"choices\":[{\"text\":\"t0 \"}]}\n\n\r\n"
                     "40\r\ndata: {\"choi",
                     2);
    CU_ASSERT_FATAL(port > 0);
    config(&c, "fake", 2);
    c.port = port;
    c.max_concurrency = 1;
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    expect_all_failed(&res, 2, LG_FAIL_CLOSED, "closed before the response ended");
    EXPECT_EQ(res.records[0].n_chunks, 1);
    lg_run_result_free(&res);
    raw_stop(&r);

    /* Unchunked and without length: the body ends at the close, and that is a
     * complete response. */
    port = raw_start(&r,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Connection: close\r\n\r\n"
                     "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
                     "data: {\"choices\":[{\"text\":\"b\"}]}\n\n"
                     "data: [DONE]\n\n",
                     2);
    config(&c, "fake", 2);
    c.port = port;
    c.max_concurrency = 1;
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    EXPECT_EQ(res.n, 2);
    for (size_t i = 0; i < res.n; i++) {
        CU_ASSERT_TRUE(res.records[i].ok);
        EXPECT_EQ(res.records[i].n_chunks, 2);
        EXPECT_EQ(res.records[i].output_tokens, 2); /* no usage: counted chunks */
        CU_ASSERT_FALSE(res.records[i].usage_output);
    }
    EXPECT_EQ(res.http.connections_opened, 2); /* Connection: close is honoured */
    lg_run_result_free(&res);
    raw_stop(&r);
}

/* Multi-turn chat: each turn resends the history with the real replies. */
static void test_multi_turn(void)
{
    fake_reset(5, 2);
    struct lg_run_config c;
    config(&c, "fake", 6);
    c.path = "/v1/chat/completions";
    c.workload.api = LG_API_CHAT;
    c.workload.dataset = LG_DATASET_MULTI_TURN;
    c.workload.mt_turns = 3;
    c.workload.mt_input_len = 10;
    c.workload.mt_output_len = 4;
    struct lg_run_result res;
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    EXPECT_EQ(res.n, 6);
    for (size_t i = 0; i < res.n; i++) {
        const struct lg_record *r = &res.records[i];
        CU_ASSERT_TRUE(r->ok);
        EXPECT_EQ(r->session, (long long)i / 3);
        EXPECT_EQ(r->turn, (long long)i % 3);
        EXPECT_EQ(r->n_chunks, 4); /* the role chunk is not a token */
        EXPECT_RANGE(r->ttft_s, 0.004, 2.0);
    }
    /* Prompt sizes the server saw: 10; 10 + 12 + 10; 32 + 12 + 10. */
    EXPECT_EQ(res.records[0].prompt_tokens, 10);
    EXPECT_EQ(res.records[1].prompt_tokens, 32);
    EXPECT_EQ(res.records[2].prompt_tokens, 54);
    /* Turn t+1 started after turn t ended. */
    for (int sidx = 0; sidx < 2; sidx++) {
        for (int t = 1; t < 3; t++) {
            const struct lg_record *a = &res.records[sidx * 3 + t - 1];
            const struct lg_record *b = &res.records[sidx * 3 + t];
            CU_ASSERT(b->start_s >= a->start_s + a->e2el_s);
        }
    }
    pthread_mutex_lock(&fk.mu);
    EXPECT_EQ(fk.chat_n, 6);
    int by_count[8] = {0};
    for (int i = 0; i < fk.chat_n && i < 64; i++) {
        if (fk.chat_msgs[i] >= 0 && fk.chat_msgs[i] < 8) {
            by_count[fk.chat_msgs[i]]++;
        }
        if (fk.chat_msgs[i] > 1) { /* the previous reply, verbatim */
            CU_ASSERT_STRING_EQUAL(fk.chat_last[i], "t0 t1 t2 t3 ");
        }
    }
    pthread_mutex_unlock(&fk.mu);
    EXPECT_EQ(by_count[1], 2);
    EXPECT_EQ(by_count[3], 2);
    EXPECT_EQ(by_count[5], 2);
    lg_run_result_free(&res);
}

/* --duration with a closed loop of 3. */
static void test_duration(void)
{
    fake_reset(10, 10);
    struct lg_run_config c;
    config(&c, "fake", 0);
    c.num_prompts = -1;
    c.duration_s = 0.6;
    c.max_concurrency = 3;
    c.workload.random_output_len = 2;
    struct lg_run_result res;
    double t0 = now_s();
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    EXPECT_RANGE(now_s() - t0, 0.6, 10);
    EXPECT_RANGE(res.duration_s, 0.6, 10);
    CU_ASSERT(res.n >= 9); /* ~3 x 0.6 / 0.02 = 90 on an idle machine */
    for (size_t i = 0; i < res.n; i++) {
        CU_ASSERT_TRUE(res.records[i].ok);
        CU_ASSERT(res.records[i].start_s < 0.61);
    }
    struct lg_summary s = summarize(&res);
    CU_ASSERT(s.max_concurrent_requests <= 3);
    lg_run_result_free(&res);
}

/* Thousands of requests at once, each its own connection and stream. */
static void test_thousands(void)
{
    fake_reset(1000, 20);
    struct lg_run_config c;
    config(&c, "fake", 3000);
    c.workload.random_input_len = 16;
    c.workload.random_output_len = 4;
    struct lg_run_result res;
    double t0 = now_s();
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    double wall = now_s() - t0;
    struct lg_summary s = summarize(&res);
    pthread_mutex_lock(&fk.mu);
    int max_active = fk.max_active;
    pthread_mutex_unlock(&fk.mu);
    printf("\n  3000 at once: %.2f s wall, %lld completed, %d streams at once in the server, "
           "%llu connections, TTFT median %.0f ms, p99 %.0f ms (server 1000)\n",
           wall, (long long)s.completed, max_active,
           (unsigned long long)res.http.connections_opened, s.ttft.median, s.ttft.pct[2]);
    EXPECT_EQ(s.completed, 3000);
    EXPECT_EQ(s.total_output, 3000 * 4);
    CU_ASSERT(max_active >= 1000); /* really concurrent, not a trickle */
    EXPECT_RANGE(wall, 1.0, 60);
    lg_run_result_free(&res);
}

static void *interrupter(void *arg)
{
    /* Once the run's four requests are hanging in the server, Ctrl-C. */
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&fk.mu);
        int h = fk.hanging;
        pthread_mutex_unlock(&fk.mu);
        if (h >= 4) {
            break;
        }
        usleep(10000);
    }
    kill(getpid(), SIGINT);
    return NULL;
}

static void test_sigint(void)
{
    fake_reset(5, 5);
    struct lg_run_config c;
    config(&c, "hang", 4);
    c.request_timeout_s = 60;
    pthread_t t;
    pthread_create(&t, NULL, interrupter, NULL);
    struct lg_run_result res;
    double t0 = now_s();
    CU_ASSERT_EQUAL_FATAL(run(&c, &res), 0);
    pthread_join(t, NULL);
    EXPECT_RANGE(now_s() - t0, 0, 10);
    CU_ASSERT_TRUE(res.interrupted);
    expect_all_failed(&res, 4, LG_FAIL_CANCELLED, "cancelled");
    lg_run_result_free(&res);
}

/* ---- flags ---- */

static int parse_args(struct bench_options *o, const char *line, char *err, size_t errlen)
{
    char buf[1024];
    char *argv[64];
    int argc = 0;
    snprintf(buf, sizeof(buf), "bench %s", line);
    for (char *t = strtok(buf, " "); t != NULL && argc < 63; t = strtok(NULL, " ")) {
        argv[argc++] = t;
    }
    argv[argc] = NULL;
    return bench_parse_args(o, argc, argv, 1, 0, NULL, err, errlen);
}

static void test_parse_args(void)
{
    struct bench_options o;
    char err[512];
    /* Defaults: vLLM's target and load, our percentiles. */
    CU_ASSERT_EQUAL_FATAL(parse_args(&o, "", err, sizeof(err)), FLAGS_OK);
    CU_ASSERT_STRING_EQUAL(o.run.host, "127.0.0.1");
    EXPECT_EQ(o.run.port, 8000);
    CU_ASSERT_STRING_EQUAL(o.run.path, "/v1/completions");
    CU_ASSERT_STRING_EQUAL(o.run.models_path, "/v1/models");
    CU_ASSERT_PTR_NULL(o.run.model);
    EXPECT_EQ(o.run.num_prompts, 1000);
    CU_ASSERT(isinf(o.run.request_rate));
    CU_ASSERT_DOUBLE_EQUAL(o.run.burstiness, 1.0, 0);
    EXPECT_EQ(o.run.workload.dataset, LG_DATASET_RANDOM);
    EXPECT_EQ(o.run.workload.api, LG_API_COMPLETIONS);
    EXPECT_EQ(o.summary.n_percentiles, 3);
    EXPECT_EQ(o.metrics, LG_METRIC_TTFT | LG_METRIC_TPOT | LG_METRIC_ITL | LG_METRIC_E2EL);
    CU_ASSERT(o.summary.slo.ttft_ms < 0 && o.summary.slo.tpot_ms < 0);
    CU_ASSERT_TRUE(o.run.ignore_eos);
    CU_ASSERT_FALSE(o.progress);
    bench_options_fini(&o);

    /* vLLM's multi-valued --goodput, the base URL with a prefix, chat by path. */
    CU_ASSERT_EQUAL_FATAL(parse_args(&o,
                                     "--base-url http://localhost:9000/api/ --goodput ttft:500 "
                                     "tpot:50 --endpoint /v1/chat/completions --goodput=e2el:9 "
                                     "--request-rate 2.5 --burstiness inf --seed 7",
                                     err, sizeof(err)),
                          FLAGS_OK);
    CU_ASSERT_STRING_EQUAL(o.run.host, "localhost");
    EXPECT_EQ(o.run.port, 9000);
    CU_ASSERT_STRING_EQUAL(o.run.path, "/api/v1/chat/completions");
    CU_ASSERT_STRING_EQUAL(o.run.models_path, "/api/v1/models");
    CU_ASSERT_STRING_EQUAL(o.base_url, "http://localhost:9000/api");
    EXPECT_EQ(o.run.workload.api, LG_API_CHAT);
    CU_ASSERT_STRING_EQUAL(o.backend, "openai-chat");
    CU_ASSERT_DOUBLE_EQUAL(o.summary.slo.ttft_ms, 500, 0);
    CU_ASSERT_DOUBLE_EQUAL(o.summary.slo.tpot_ms, 50, 0);
    CU_ASSERT_DOUBLE_EQUAL(o.summary.slo.e2el_ms, 9, 0);
    CU_ASSERT_DOUBLE_EQUAL(o.run.request_rate, 2.5, 0);
    CU_ASSERT(isinf(o.run.burstiness));
    EXPECT_EQ(o.run.workload.seed, 7);
    bench_options_fini(&o);

    /* Multi-turn picks chat; --duration makes the count a cap only when given. */
    CU_ASSERT_EQUAL_FATAL(parse_args(&o,
                                     "--dataset-name multi-turn --duration 5 --max-concurrency 2",
                                     err, sizeof(err)),
                          FLAGS_OK);
    EXPECT_EQ(o.run.workload.api, LG_API_CHAT);
    CU_ASSERT_STRING_EQUAL(o.run.path, "/v1/chat/completions");
    EXPECT_EQ(o.run.num_prompts, -1);
    bench_options_fini(&o);
    CU_ASSERT_EQUAL_FATAL(
        parse_args(&o, "--duration 5 --num-prompts 50 --backend openai-chat", err, sizeof(err)),
        FLAGS_OK);
    EXPECT_EQ(o.run.num_prompts, 50);
    EXPECT_EQ(o.run.workload.api, LG_API_CHAT);
    bench_options_fini(&o);
    CU_ASSERT_EQUAL_FATAL(parse_args(&o, "--progress --extra-body {\"top_k\":1}", err, sizeof(err)),
                          FLAGS_OK);
    CU_ASSERT_TRUE(o.progress);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(o.run.extra_body, "top_k")), 1);
    bench_options_fini(&o);

    /* Errors name the flag. */
    static const struct {
        const char *args, *flag;
    } bad[] = {
        {"--bogus", "--bogus"},
        {"--request-rate 0", "--request-rate"},
        {"--request-rate fast", "--request-rate"},
        {"--burstiness -1", "--burstiness"},
        {"--goodput", "--goodput"},
        {"--goodput ttft:1 bad:2", "--goodput"},
        {"--percentile-metrics ttft,foo", "--percentile-metrics"},
        {"--metric-percentiles 50,120", "--metric-percentiles"},
        {"--dataset-name sonnet", "--dataset-name"},
        {"--dataset-name trace", "--dataset-path"},
        {"--dataset-path x.jsonl", "--dataset-path"},
        {"--endpoint-type rpc", "--endpoint-type"},
        {"--endpoint v1/completions", "--endpoint"},
        {"--base-url https://x", "--base-url"},
        {"--prompt-token-ids --endpoint-type chat", "--prompt-token-ids"},
        {"--token-id-range 9:3", "--token-id-range"},
        {"--save-requests out.txt", "--save-requests"},
        {"--extra-body [1]", "--extra-body"},
        {"--temperature hot", "--temperature"},
        {"--duration 3", "--max-concurrency"},
        {"--num-prompts 0", "--num-prompts"},
        {"--max-concurrency -1", "--max-concurrency"},
        {"--multi-turn-history both", "--multi-turn-history"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        int rc = parse_args(&o, bad[i].args, err, sizeof(err));
        if (rc != TANDEM_EINVAL || strstr(err, bad[i].flag) == NULL) {
            fprintf(stderr, "\n'%s': rc %d, message '%s' (want %s)\n", bad[i].args, rc, err,
                    bad[i].flag);
            CU_FAIL("bad flag accepted or not named");
        }
        bench_options_fini(&o);
    }
    CU_ASSERT_EQUAL(parse_args(&o, "--help", err, sizeof(err)), FLAGS_HELP);
    bench_options_fini(&o);
}

/* ---- the binary ---- */

static int run_cli(const char *args, const char *out_path)
{
    const char *dir = getenv("TANDEM_BIN_DIR");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s/tandem bench %s >%s 2>&1", dir, args, out_path);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int file_contains(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, needle) != NULL;
}

static void test_cli(void)
{
    if (getenv("TANDEM_BIN_DIR") == NULL) {
        fprintf(stderr, "\nTANDEM_BIN_DIR is not set (run through ctest): binary not tested\n");
        CU_FAIL("TANDEM_BIN_DIR not set");
        return;
    }
    fake_reset(5, 2);
    char dir[] = "/tmp/test_bench_cli_XXXXXX";
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    char out[256], json[256], reqs[256], args[1024];
    snprintf(out, sizeof(out), "%s/out.txt", dir);
    snprintf(json, sizeof(json), "%s/summary.json", dir);
    snprintf(reqs, sizeof(reqs), "%s/requests.csv", dir);
    snprintf(args, sizeof(args),
             "--base-url http://127.0.0.1:%d --model fake --num-prompts 6 --random-input-len 20 "
             "--random-output-len 3 --max-concurrency 2 --seed 1 --goodput ttft:5000 tpot:5000 "
             "--json %s --save-requests %s --save-result --result-dir %s --label lbl",
             fk.port, json, reqs, dir);
    EXPECT_EQ(run_cli(args, out), 0);
    CU_ASSERT(file_contains(out, "============ Serving Benchmark Result ============"));
    CU_ASSERT(file_contains(out, "Successful requests:                     6"));
    CU_ASSERT(file_contains(out, "Maximum request concurrency:             2"));
    json_error_t jerr;
    json_t *j = json_load_file(json, 0, &jerr);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    EXPECT_EQ(json_integer_value(json_object_get(j, "completed")), 6);
    EXPECT_EQ(json_integer_value(json_object_get(j, "failed")), 0);
    EXPECT_EQ(json_integer_value(json_object_get(j, "total_output_tokens")), 18);
    EXPECT_EQ(json_integer_value(json_object_get(j, "total_input_tokens")), 120);
    const char *keys[] = {"duration",          "request_throughput", "request_goodput",
                          "output_throughput", "mean_ttft_ms",       "median_ttft_ms",
                          "p99_ttft_ms",       "p90_tpot_ms",        "mean_itl_ms",
                          "p50_e2el_ms",       "cached_token_ratio", "slo_attainment"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (!json_is_number(json_object_get(j, keys[i]))) {
            fprintf(stderr, "\nJSON key %s missing\n", keys[i]);
            CU_FAIL("JSON key");
        }
    }
    CU_ASSERT_DOUBLE_EQUAL(json_number_value(json_object_get(j, "slo_attainment")), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(json_number_value(json_object_get(j, "cached_token_ratio")), 0.5, 1e-12);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "label")), "lbl");
    json_decref(j);
    FILE *f = fopen(reqs, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    int lines = 0;
    char line[1024];
    while (fgets(line, sizeof(line), f) != NULL) {
        lines++;
    }
    fclose(f);
    EXPECT_EQ(lines, 7);
    /* --save-result: vLLM's file name in --result-dir. */
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls %s/lbl-infqps-concurrency2-fake-*.json >/dev/null 2>&1", dir);
    CU_ASSERT_EQUAL(system(cmd), 0);

    /* Bad usage: exit 2 with the flag named. */
    EXPECT_EQ(run_cli("--bogus 1", out), 2);
    CU_ASSERT(file_contains(out, "--bogus"));
    EXPECT_EQ(run_cli("--request-rate -3", out), 2);
    CU_ASSERT(file_contains(out, "--request-rate"));
    EXPECT_EQ(run_cli("--goodput ttft:1 foo:2", out), 2);
    CU_ASSERT(file_contains(out, "--goodput"));
    EXPECT_EQ(run_cli("--save-requests x.txt", out), 2);
    CU_ASSERT(file_contains(out, "--save-requests"));
    EXPECT_EQ(run_cli("--help", out), 0);
    CU_ASSERT(file_contains(out, "--max-concurrency N"));
    CU_ASSERT(file_contains(out, "[default: inf]"));
    /* Every request failing is exit 1. */
    snprintf(args, sizeof(args), "--port %d --model err503 --num-prompts 2", fk.port);
    EXPECT_EQ(run_cli(args, out), 1);
    CU_ASSERT(file_contains(out, "Failed (http_503):                       2"));
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    log_init("test_bench_e2e", LOG_LEVEL_ERROR);
    if (fake_start() != 0) {
        fprintf(stderr, "cannot start the fake server\n");
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench_e2e", NULL, NULL);
    CU_add_test(s, "timing", test_timing);
    CU_add_test(s, "open_loop", test_open_loop);
    CU_add_test(s, "failures", test_failures);
    CU_add_test(s, "raw_failures", test_raw_failures);
    CU_add_test(s, "multi_turn", test_multi_turn);
    CU_add_test(s, "duration", test_duration);
    CU_add_test(s, "thousands", test_thousands);
    CU_add_test(s, "sigint", test_sigint);
    CU_add_test(s, "parse_args", test_parse_args);
    CU_add_test(s, "cli", test_cli);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    fake_stop();
    return failed ? 1 : 0;
}
