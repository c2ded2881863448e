/* Metrics registry: exact Prometheus text for each metric type, validation,
 * and /metrics served over a real loopback HTTP connection. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http.h"
#include "log.h"
#include "metrics.h"
#include "tandem_err.h"

/* Failures print both sides. */
#define EXPECT_TEXT(got, want)                                                                     \
    do {                                                                                           \
        const char *g_ = (got), *w_ = (want);                                                      \
        g_ = g_ ? g_ : "";                                                                         \
        int ok_ = !strcmp(g_, w_);                                                                 \
        if (!ok_)                                                                                  \
            fprintf(stderr, "\n%s:%d:\n--- got\n%s--- want\n%s---\n", __FILE__, __LINE__, g_, w_); \
        CU_ASSERT(ok_);                                                                            \
    } while (0)

static struct metrics_buf rendered;

static char *render(struct metrics_registry *reg)
{
    metrics_buf_free(&rendered);
    CU_ASSERT_EQUAL(metrics_render(reg, &rendered), 0);
    return rendered.data;
}

static void test_counter(void)
{
    struct metrics_registry *reg;
    struct metrics_family *f;
    struct metrics_series *s;
    CU_ASSERT_EQUAL_FATAL(metrics_registry_create(&reg), 0);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "tandem:requests_total", "Requests seen.", NULL, &f),
                    0);
    /* Unlabelled: exported at 0 before the first update. */
    EXPECT_TEXT(render(reg), "# HELP tandem:requests_total Requests seen.\n"
                             "# TYPE tandem:requests_total counter\n"
                             "tandem:requests_total 0\n");
    CU_ASSERT_EQUAL(metrics_series_get(f, NULL, &s), 0);
    metrics_counter_inc(s);
    metrics_counter_add(s, 2);
    metrics_counter_add(s, -5); /* counters never go down */
    CU_ASSERT_EQUAL(metrics_series_value(s), 3);
    EXPECT_TEXT(render(reg), "# HELP tandem:requests_total Requests seen.\n"
                             "# TYPE tandem:requests_total counter\n"
                             "tandem:requests_total 3\n");
    metrics_registry_destroy(reg);
}

static void test_labelled_counter(void)
{
    struct metrics_registry *reg;
    struct metrics_family *f;
    struct metrics_series *stop, *length, *again, *odd;
    const char *const labels[] = {"model_name", "finished_reason", NULL};
    CU_ASSERT_EQUAL_FATAL(metrics_registry_create(&reg), 0);
    CU_ASSERT_EQUAL(
        metrics_counter_new(reg, "vllm:request_success_total", "Finished requests.", labels, &f),
        0);
    /* No series yet: only the metadata. */
    EXPECT_TEXT(render(reg), "# HELP vllm:request_success_total Finished requests.\n"
                             "# TYPE vllm:request_success_total counter\n");
    CU_ASSERT_EQUAL(metrics_series_get(f, (const char *[]){"tiny", "stop", NULL}, &stop), 0);
    CU_ASSERT_EQUAL(metrics_series_get(f, (const char *[]){"tiny", "length", NULL}, &length), 0);
    CU_ASSERT_EQUAL(metrics_series_get(f, (const char *[]){"tiny", "stop", NULL}, &again), 0);
    CU_ASSERT_PTR_EQUAL(stop, again);
    CU_ASSERT_EQUAL(metrics_series_get(f, (const char *[]){"a\"b\\c\nd", "x", NULL}, &odd), 0);
    metrics_counter_add(stop, 2);
    metrics_counter_inc(length);
    EXPECT_TEXT(
        render(reg),
        "# HELP vllm:request_success_total Finished requests.\n"
        "# TYPE vllm:request_success_total counter\n"
        "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 2\n"
        "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 1\n"
        "vllm:request_success_total{model_name=\"a\\\"b\\\\c\\nd\",finished_reason=\"x\"} 0\n");
    metrics_series_remove(odd);
    metrics_series_remove(stop);
    EXPECT_TEXT(render(reg),
                "# HELP vllm:request_success_total Finished requests.\n"
                "# TYPE vllm:request_success_total counter\n"
                "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 1\n");
    /* Wrong number of values. */
    CU_ASSERT_EQUAL(metrics_series_get(f, (const char *[]){"tiny", NULL}, &odd), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_series_get(f, NULL, &odd), TANDEM_EINVAL);
    metrics_registry_destroy(reg);
}

static double kv_usage(void *arg)
{
    return *(double *)arg;
}

static void test_gauge(void)
{
    struct metrics_registry *reg;
    struct metrics_family *running, *usage, *vals;
    struct metrics_series *s, *u;
    double usage_value = 0.25;
    CU_ASSERT_EQUAL_FATAL(metrics_registry_create(&reg), 0);
    CU_ASSERT_EQUAL(metrics_gauge_new(reg, "vllm:num_requests_running",
                                      "Requests in the running batch.", NULL, &running),
                    0);
    CU_ASSERT_EQUAL(
        metrics_gauge_new(reg, "vllm:kv_cache_usage_perc", "KV cache usage.", NULL, &usage), 0);
    CU_ASSERT_EQUAL(metrics_gauge_new(reg, "t_values", "Line one\\\nline two",
                                      (const char *[]){"v", NULL}, &vals),
                    0);
    metrics_series_get(running, NULL, &s);
    metrics_gauge_set(s, 7);
    metrics_gauge_add(s, -3);
    metrics_series_get(usage, NULL, &u);
    metrics_gauge_set_fn(u, kv_usage, &usage_value);
    static const struct {
        const char *label;
        double v;
    } cases[] = {{"tiny", 1e-06},     {"big", 1e+20}, {"int", 123456789},
                 {"tenth", 0.1},      {"neg", -2.5},  {"inf", INFINITY},
                 {"ninf", -INFINITY}, {"nan", NAN},   {"third", 1.0 / 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct metrics_series *v;
        CU_ASSERT_EQUAL(metrics_series_get(vals, (const char *[]){cases[i].label, NULL}, &v), 0);
        metrics_gauge_set(v, cases[i].v);
    }
    const char *want = "# HELP vllm:num_requests_running Requests in the running batch.\n"
                       "# TYPE vllm:num_requests_running gauge\n"
                       "vllm:num_requests_running 4\n"
                       "# HELP vllm:kv_cache_usage_perc KV cache usage.\n"
                       "# TYPE vllm:kv_cache_usage_perc gauge\n"
                       "vllm:kv_cache_usage_perc 0.25\n"
                       "# HELP t_values Line one\\\\\\nline two\n"
                       "# TYPE t_values gauge\n"
                       "t_values{v=\"tiny\"} 1e-06\n"
                       "t_values{v=\"big\"} 1e+20\n"
                       "t_values{v=\"int\"} 123456789\n"
                       "t_values{v=\"tenth\"} 0.1\n"
                       "t_values{v=\"neg\"} -2.5\n"
                       "t_values{v=\"inf\"} +Inf\n"
                       "t_values{v=\"ninf\"} -Inf\n"
                       "t_values{v=\"nan\"} NaN\n"
                       "t_values{v=\"third\"} 0.3333333333333333\n";
    EXPECT_TEXT(render(reg), want);
    /* The callback is read at render time. */
    usage_value = 0.5;
    CU_ASSERT(strstr(render(reg), "vllm:kv_cache_usage_perc 0.5\n") != NULL);
    CU_ASSERT_EQUAL(metrics_series_value(u), 0.5);
    metrics_registry_destroy(reg);
}

static void test_histogram(void)
{
    struct metrics_registry *reg;
    struct metrics_family *ttft, *plain;
    struct metrics_series *s, *p;
    const double bounds[] = {0.1, 0.5, 1, 2.5};
    CU_ASSERT_EQUAL_FATAL(metrics_registry_create(&reg), 0);
    CU_ASSERT_EQUAL(metrics_histogram_new(reg, "vllm:time_to_first_token_seconds",
                                          "Time to first token.",
                                          (const char *[]){"model_name", NULL}, bounds, 4, &ttft),
                    0);
    CU_ASSERT_EQUAL(metrics_histogram_new(reg, "tandem:transfer_seconds", "KV transfer time.", NULL,
                                          bounds, 2, &plain),
                    0);
    CU_ASSERT_EQUAL(metrics_series_get(ttft, (const char *[]){"tiny", NULL}, &s), 0);
    const double obs[] = {0.0625, 0.25, 0.5, 0.75, 4}; /* 0.5 lands in le="0.5" */
    for (size_t i = 0; i < 5; i++)
        metrics_histogram_observe(s, obs[i]);
    metrics_series_get(plain, NULL, &p);
    metrics_histogram_observe(p, 3);
    CU_ASSERT_EQUAL(metrics_series_value(s), 5);
    EXPECT_TEXT(render(reg),
                "# HELP vllm:time_to_first_token_seconds Time to first token.\n"
                "# TYPE vllm:time_to_first_token_seconds histogram\n"
                "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.1\"} 1\n"
                "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.5\"} 3\n"
                "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"1\"} 4\n"
                "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"2.5\"} 4\n"
                "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} 5\n"
                "vllm:time_to_first_token_seconds_sum{model_name=\"tiny\"} 5.5625\n"
                "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 5\n"
                "# HELP tandem:transfer_seconds KV transfer time.\n"
                "# TYPE tandem:transfer_seconds histogram\n"
                "tandem:transfer_seconds_bucket{le=\"0.1\"} 0\n"
                "tandem:transfer_seconds_bucket{le=\"0.5\"} 0\n"
                "tandem:transfer_seconds_bucket{le=\"+Inf\"} 1\n"
                "tandem:transfer_seconds_sum 3\n"
                "tandem:transfer_seconds_count 1\n");
    metrics_registry_destroy(reg);
}

static void test_validation(void)
{
    struct metrics_registry *reg;
    struct metrics_family *f;
    const double good[] = {1, 2}, flat[] = {1, 1}, inf[] = {1, INFINITY};
    CU_ASSERT_EQUAL_FATAL(metrics_registry_create(&reg), 0);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "a_total", "", NULL, &f), 0);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "a_total", "", NULL, &f), TANDEM_EEXIST);
    CU_ASSERT_EQUAL(metrics_gauge_new(reg, "a_total", "", NULL, &f), TANDEM_EEXIST);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "9lives", "", NULL, &f), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "has-dash", "", NULL, &f), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "", "", NULL, &f), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "b", "", (const char *[]){"__x", NULL}, &f),
                    TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "b", "", (const char *[]){"a:b", NULL}, &f),
                    TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "b", "", (const char *[]){"x", "x", NULL}, &f),
                    TANDEM_EINVAL);
    CU_ASSERT_EQUAL(
        metrics_counter_new(
            reg, "b", "", (const char *[]){"a", "b", "c", "d", "e", "f", "g", "h", "i", NULL}, &f),
        TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_histogram_new(reg, "h", "", NULL, flat, 2, &f), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_histogram_new(reg, "h", "", NULL, inf, 2, &f), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_histogram_new(reg, "h", "", NULL, good, 0, &f), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_histogram_new(reg, "h", "", (const char *[]){"le", NULL}, good, 2, &f),
                    TANDEM_EINVAL);
    CU_ASSERT_EQUAL(metrics_histogram_new(reg, "h", "", NULL, good, 2, &f), 0);
    /* A counter may carry "le"; only histograms reserve it. */
    CU_ASSERT_EQUAL(metrics_counter_new(reg, "c", NULL, (const char *[]){"le", NULL}, &f), 0);
    metrics_registry_destroy(reg);
}

struct collect_state {
    struct metrics_series *s;
    int calls;
};

static void collect(struct metrics_registry *reg, void *arg)
{
    struct collect_state *st = arg;
    st->calls++;
    metrics_gauge_set(st->s, st->calls * 10);
}

/* ---- /metrics over HTTP ---- */

static struct metrics_registry *served;

static void metrics_handler(struct http_req *req, void *user)
{
    if (!strcmp(http_req_path(req), "/metrics"))
        metrics_respond(req, served);
    else
        http_req_respond(req, 404, NULL, NULL, 0);
}

static int closed;

static void on_closed(struct http_server *srv)
{
    closed = 1;
}

static void test_http_endpoint(void)
{
    struct metrics_family *f;
    struct collect_state st = {0};
    CU_ASSERT_EQUAL_FATAL(metrics_registry_create(&served), 0);
    CU_ASSERT_EQUAL(metrics_gauge_new(served, "vllm:num_requests_waiting", "Waiting.", NULL, &f),
                    0);
    metrics_series_get(f, NULL, &st.s);
    CU_ASSERT_EQUAL(metrics_on_collect(served, collect, &st), 0);

    uv_loop_t loop;
    struct http_server srv;
    struct http_config cfg;
    http_config_default(&cfg);
    cfg.date_header = 0;
    CU_ASSERT_FATAL(uv_loop_init(&loop) == 0);
    CU_ASSERT_FATAL(http_server_init(&srv, &loop, &cfg, metrics_handler, NULL) == 0);
    CU_ASSERT_FATAL(http_server_listen(&srv, "127.0.0.1", 0) == 0);
    int port = http_server_port(&srv);

    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CU_ASSERT_FATAL(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    const char *req = "GET /metrics HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    CU_ASSERT(send(fd, req, strlen(req), 0) == (ssize_t)strlen(req));
    char buf[4096];
    size_t len = 0;
    for (int i = 0; i < 2000; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        poll(&pfd, 1, 1);
        ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (n == 0)
            break;
        if (n > 0)
            len += (size_t)n;
    }
    buf[len] = '\0';
    close(fd);
    const char *body = "# HELP vllm:num_requests_waiting Waiting.\n"
                       "# TYPE vllm:num_requests_waiting gauge\n"
                       "vllm:num_requests_waiting 10\n";
    char want[1024];
    snprintf(want, sizeof want,
             "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
             strlen(body), body);
    EXPECT_TEXT(buf, want);
    CU_ASSERT_EQUAL(st.calls, 1);

    http_server_close(&srv, on_closed);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT(closed);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
    metrics_registry_destroy(served);
}

int main(void)
{
    log_init("test_metrics", LOG_LEVEL_ERROR);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("metrics", NULL, NULL);
    CU_add_test(s, "counter", test_counter);
    CU_add_test(s, "labelled_counter", test_labelled_counter);
    CU_add_test(s, "gauge", test_gauge);
    CU_add_test(s, "histogram", test_histogram);
    CU_add_test(s, "validation", test_validation);
    CU_add_test(s, "http_endpoint", test_http_endpoint);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    metrics_buf_free(&rendered);
    return failed ? 1 : 0;
}
