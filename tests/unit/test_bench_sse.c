/* tandem bench: the SSE parser (loadgen/sse.c) on whole, split and garbled
 * streams, the OpenAI chunk reader and request bodies (loadgen/openai.c), and
 * the URL parser (loadgen/http_client.c). Inputs are placed right before an
 * unreadable page so any over-read crashes. */
#include <CUnit/Basic.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loadgen/http_client.h"
#include "loadgen/openai.h"
#include "loadgen/rng.h"
#include "loadgen/sse.h"
#include "tandem_err.h"

static uint64_t seed = 1;

/* ---- guarded buffers ---- */

static char *guard_base;
static size_t guard_page;

static void guard_init(void)
{
    guard_page = (size_t)sysconf(_SC_PAGESIZE);
    guard_base =
        mmap(NULL, 2 * guard_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (guard_base == MAP_FAILED || mprotect(guard_base + guard_page, guard_page, PROT_NONE) != 0) {
        guard_base = NULL;
    }
}

/* A copy of s[0..n) ending right at the unreadable page. */
static const char *guarded(const char *s, size_t n)
{
    if (guard_base == NULL || n > guard_page) {
        return s;
    }
    char *p = guard_base + guard_page - n;
    memcpy(p, s, n);
    return p;
}

/* ---- collected events ---- */

struct events {
    int n;
    char name[16][32];
    char data[16][256];
    int stop_at; /* return an error on this event (1-based), 0: never */
};

static int collect(void *arg, const char *name, const char *data, size_t len)
{
    struct events *e = arg;
    CU_ASSERT_EQUAL(strlen(data), len); /* NUL-terminated at len */
    if (e->n < 16) {
        snprintf(e->name[e->n], sizeof(e->name[0]), "%s", name);
        snprintf(e->data[e->n], sizeof(e->data[0]), "%.*s", (int)len, data);
    }
    e->n++;
    return e->stop_at == e->n ? TANDEM_ECANCELLED : 0;
}

/* Feeds s in pieces cut at the given positions, then finishes. */
static int feed_split(const char *s, const size_t *cuts, int ncuts, struct events *e)
{
    struct lg_sse p;
    lg_sse_init(&p, 0);
    memset(e, 0, sizeof(*e));
    size_t n = strlen(s), prev = 0;
    int rc = 0;
    for (int i = 0; i <= ncuts && rc == 0; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        rc = lg_sse_feed(&p, guarded(s + prev, end - prev), end - prev, collect, e);
        prev = end;
    }
    if (rc == 0) {
        rc = lg_sse_finish(&p, collect, e);
    }
    lg_sse_fini(&p);
    return rc;
}

static const char *const stream = ": keep-alive\n\n"
                                  "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
                                  "data: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n"
                                  "event: ping\ndata:x\rdata:  y\r\r"
                                  "data: line1\ndata: line2\nid: 7\nretry: 100\nfoo\n\n"
                                  "data: [DONE]\n\n";

static void check_stream_events(const struct events *e)
{
    CU_ASSERT_EQUAL_FATAL(e->n, 5);
    CU_ASSERT_STRING_EQUAL(e->name[0], "message");
    CU_ASSERT_STRING_EQUAL(e->data[0], "{\"choices\":[{\"text\":\"a\"}]}");
    CU_ASSERT_STRING_EQUAL(e->data[1], "{\"choices\":[{\"text\":\"b\"}]}");
    CU_ASSERT_STRING_EQUAL(e->name[2], "ping");
    CU_ASSERT_STRING_EQUAL(e->data[2], "x\n y"); /* only one leading space is removed */
    CU_ASSERT_STRING_EQUAL(e->name[3], "message");
    CU_ASSERT_STRING_EQUAL(e->data[3], "line1\nline2");
    CU_ASSERT_STRING_EQUAL(e->data[4], "[DONE]");
}

static void test_sse_whole(void)
{
    struct events e;
    CU_ASSERT_EQUAL(feed_split(stream, NULL, 0, &e), 0);
    check_stream_events(&e);
}

static void test_sse_splits(void)
{
    /* Every single cut and every pair of cuts give the same events, CRLF and
     * CR-LF pairs split across feeds included. */
    size_t n = strlen(stream);
    struct events e;
    for (size_t i = 1; i < n; i++) {
        size_t cut[1] = {i};
        CU_ASSERT_EQUAL(feed_split(stream, cut, 1, &e), 0);
        check_stream_events(&e);
        for (size_t j = i + 1; j < n; j += 7) {
            size_t cuts[2] = {i, j};
            CU_ASSERT_EQUAL(feed_split(stream, cuts, 2, &e), 0);
            check_stream_events(&e);
        }
    }
    /* Byte by byte. */
    size_t *cuts = malloc(n * sizeof(size_t));
    for (size_t i = 0; i + 1 < n; i++) {
        cuts[i] = i + 1;
    }
    CU_ASSERT_EQUAL(feed_split(stream, cuts, (int)n - 1, &e), 0);
    check_stream_events(&e);
    free(cuts);
}

static void test_sse_end_of_stream(void)
{
    struct events e;
    /* No blank line after the last event: delivered by finish. */
    CU_ASSERT_EQUAL(feed_split("data: {\"x\":1}\n", NULL, 0, &e), 0);
    CU_ASSERT_EQUAL(e.n, 1);
    CU_ASSERT_STRING_EQUAL(e.data[0], "{\"x\":1}");
    /* Not even a newline. */
    CU_ASSERT_EQUAL(feed_split("data: [DONE]", NULL, 0, &e), 0);
    CU_ASSERT_EQUAL(e.n, 1);
    CU_ASSERT_STRING_EQUAL(e.data[0], "[DONE]");
    /* Only comments or empty lines: nothing. */
    CU_ASSERT_EQUAL(feed_split(":a\n\n\n\r\n:b", NULL, 0, &e), 0);
    CU_ASSERT_EQUAL(e.n, 0);
    /* An empty data line is an event with empty data. */
    CU_ASSERT_EQUAL(feed_split("data\n\n", NULL, 0, &e), 0);
    CU_ASSERT_EQUAL(e.n, 1);
    CU_ASSERT_STRING_EQUAL(e.data[0], "");
}

static void test_sse_errors(void)
{
    /* The callback's error stops parsing and sticks. */
    struct lg_sse p;
    struct events e;
    memset(&e, 0, sizeof(e));
    e.stop_at = 1;
    lg_sse_init(&p, 0);
    const char *two = "data: 1\n\ndata: 2\n\n";
    CU_ASSERT_EQUAL(lg_sse_feed(&p, two, strlen(two), collect, &e), TANDEM_ECANCELLED);
    CU_ASSERT_EQUAL(e.n, 1);
    CU_ASSERT_EQUAL(lg_sse_feed(&p, "data: 3\n\n", 9, collect, &e), TANDEM_EPROTO);
    CU_ASSERT_EQUAL(lg_sse_finish(&p, collect, &e), TANDEM_EPROTO);
    lg_sse_fini(&p);

    /* Oversized line or event. */
    lg_sse_init(&p, 64);
    memset(&e, 0, sizeof(e));
    char big[200];
    memset(big, 'x', sizeof(big));
    CU_ASSERT_EQUAL(lg_sse_feed(&p, big, sizeof(big), collect, &e), TANDEM_ETOOBIG);
    lg_sse_fini(&p);
    lg_sse_init(&p, 64);
    char lines[400] = "";
    for (int i = 0; i < 10; i++) {
        strcat(lines, "data: 0123456789\n"); /* 11 bytes of data each */
    }
    CU_ASSERT_EQUAL(lg_sse_feed(&p, lines, strlen(lines), collect, &e), TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(e.n, 0);
    lg_sse_fini(&p);

    /* Reset makes a parser reusable. */
    lg_sse_init(&p, 0);
    memset(&e, 0, sizeof(e));
    CU_ASSERT_EQUAL(lg_sse_feed(&p, "data: part", 10, collect, &e), 0);
    lg_sse_reset(&p);
    CU_ASSERT_EQUAL(lg_sse_feed(&p, "data: new\n\n", 11, collect, &e), 0);
    CU_ASSERT_EQUAL(e.n, 1);
    CU_ASSERT_STRING_EQUAL(e.data[0], "new");
    lg_sse_fini(&p);
}

static int count_only(void *arg, const char *name, const char *data, size_t len)
{
    (*(int *)arg)++;
    return strlen(data) == len ? 0 : TANDEM_EINTERNAL;
}

static void test_sse_garbage(void)
{
    /* Random bytes (biased to the syntax characters) in random pieces: no
     * crash, no over-read, NUL-terminated events. */
    struct lg_rng r;
    lg_rng_seed(&r, seed);
    static const char alphabet[] = "data: \n\r:event[DONE]{}x\0\xff";
    for (int round = 0; round < 2000; round++) {
        char buf[512];
        size_t n = (size_t)lg_rng_range(&r, 0, sizeof(buf));
        for (size_t i = 0; i < n; i++) {
            buf[i] = lg_rng_uniform(&r) < 0.8
                         ? alphabet[lg_rng_range(&r, 0, (int64_t)sizeof(alphabet) - 2)]
                         : (char)lg_rng_range(&r, 0, 255);
        }
        struct lg_sse p;
        lg_sse_init(&p, (size_t)lg_rng_range(&r, 16, 1024));
        int events = 0, rc = 0;
        for (size_t off = 0; off < n && rc == 0;) {
            size_t k = (size_t)lg_rng_range(&r, 1, 64);
            if (k > n - off) {
                k = n - off;
            }
            rc = lg_sse_feed(&p, guarded(buf + off, k), k, count_only, &events);
            off += k;
        }
        if (rc == 0) {
            rc = lg_sse_finish(&p, count_only, &events);
        }
        CU_ASSERT(rc == 0 || rc == TANDEM_ETOOBIG);
        lg_sse_fini(&p);
    }
}

/* ---- OpenAI chunks ---- */

static int parse(enum lg_api api, const char *s, struct lg_chunk *c)
{
    return lg_openai_parse_chunk(api, guarded(s, strlen(s)), strlen(s), c);
}

static void test_chunks(void)
{
    struct lg_chunk c;
    /* completions token */
    CU_ASSERT_EQUAL_FATAL(
        parse(LG_API_COMPLETIONS,
              "{\"choices\":[{\"index\":0,\"text\":\"Hi\",\"finish_reason\":null}]}", &c),
        0);
    CU_ASSERT_TRUE(c.is_token);
    CU_ASSERT_EQUAL(c.text_len, 2);
    CU_ASSERT_EQUAL(memcmp(c.text, "Hi", 2), 0);
    CU_ASSERT_FALSE(c.has_usage);
    lg_chunk_clear(&c);
    /* an empty text without finish_reason is a (special) token */
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS, "{\"choices\":[{\"text\":\"\"}]}", &c), 0);
    CU_ASSERT_TRUE(c.is_token);
    lg_chunk_clear(&c);
    /* finish-only: not a token */
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS,
                          "{\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}", &c),
                    0);
    CU_ASSERT_FALSE(c.is_token);
    lg_chunk_clear(&c);
    /* the last token with its finish_reason: a token */
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS,
                          "{\"choices\":[{\"text\":\"!\",\"finish_reason\":\"length\"}]}", &c),
                    0);
    CU_ASSERT_TRUE(c.is_token);
    lg_chunk_clear(&c);
    /* chat: role-only first chunk is not a token; content is */
    CU_ASSERT_EQUAL(parse(LG_API_CHAT,
                          "{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}",
                          &c),
                    0);
    CU_ASSERT_FALSE(c.is_token);
    lg_chunk_clear(&c);
    CU_ASSERT_EQUAL(parse(LG_API_CHAT, "{\"choices\":[{\"delta\":{\"content\":\"yo\"}}]}", &c), 0);
    CU_ASSERT_TRUE(c.is_token);
    CU_ASSERT_EQUAL(c.text_len, 2);
    lg_chunk_clear(&c);
    /* chat as a whole response */
    CU_ASSERT_EQUAL(
        parse(LG_API_CHAT,
              "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"full\"}}],"
              "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
              &c),
        0);
    CU_ASSERT_TRUE(c.is_token);
    CU_ASSERT_EQUAL(c.completion_tokens, 4);
    lg_chunk_clear(&c);
    /* usage chunk with cached tokens (choices empty) */
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS,
                          "{\"choices\":[],\"usage\":{\"prompt_tokens\":100,"
                          "\"completion_tokens\":16,\"total_tokens\":116,"
                          "\"prompt_tokens_details\":{\"cached_tokens\":64}}}",
                          &c),
                    0);
    CU_ASSERT_FALSE(c.is_token);
    CU_ASSERT_TRUE(c.has_usage);
    CU_ASSERT_EQUAL(c.prompt_tokens, 100);
    CU_ASSERT_EQUAL(c.completion_tokens, 16);
    CU_ASSERT_EQUAL(c.cached_tokens, 64);
    lg_chunk_clear(&c);
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS, "{\"usage\":{\"prompt_tokens\":1}}", &c), 0);
    CU_ASSERT_EQUAL(c.cached_tokens, -1);
    CU_ASSERT_EQUAL(c.completion_tokens, -1);
    lg_chunk_clear(&c);
    /* errors, both shapes */
    CU_ASSERT_EQUAL(
        parse(LG_API_COMPLETIONS, "{\"error\":{\"message\":\"boom\",\"type\":\"x\"}}", &c), 0);
    CU_ASSERT_TRUE(c.is_error);
    CU_ASSERT_STRING_EQUAL(c.error, "boom");
    lg_chunk_clear(&c);
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS, "{\"object\":\"error\",\"message\":\"bad\"}", &c), 0);
    CU_ASSERT_TRUE(c.is_error);
    CU_ASSERT_STRING_EQUAL(c.error, "bad");
    lg_chunk_clear(&c);
    /* garbage */
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS, "{\"choices\":[", &c), TANDEM_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.error, "bad chunk JSON"));
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS, "[1,2]", &c), TANDEM_EPROTO);
    CU_ASSERT_EQUAL(parse(LG_API_COMPLETIONS, "", &c), TANDEM_EPROTO);
}

static void test_error_message(void)
{
    char m[64];
    const char *b1 = "{\"error\":{\"message\":\"Too many requests\",\"code\":429}}";
    lg_openai_error_message(b1, strlen(b1), m, sizeof(m));
    CU_ASSERT_STRING_EQUAL(m, "Too many requests");
    const char *b2 = "{\"object\":\"error\",\"message\":\"max_tokens too large\"}";
    lg_openai_error_message(b2, strlen(b2), m, sizeof(m));
    CU_ASSERT_STRING_EQUAL(m, "max_tokens too large");
    const char *b3 = "{\"detail\":\"Not Found\"}";
    lg_openai_error_message(b3, strlen(b3), m, sizeof(m));
    CU_ASSERT_STRING_EQUAL(m, "Not Found");
    const char *b4 = "<html>\nBad Gateway\n</html>";
    lg_openai_error_message(b4, strlen(b4), m, sizeof(m));
    CU_ASSERT_STRING_EQUAL(m, "<html> Bad Gateway </html>");
    lg_openai_error_message("", 0, m, sizeof(m));
    CU_ASSERT_STRING_EQUAL(m, "");
    char model[32];
    const char *models = "{\"object\":\"list\",\"data\":[{\"id\":\"tiny\"},{\"id\":\"b\"}]}";
    CU_ASSERT_EQUAL(lg_openai_first_model(models, strlen(models), model, sizeof(model)), 0);
    CU_ASSERT_STRING_EQUAL(model, "tiny");
    CU_ASSERT_EQUAL(lg_openai_first_model("{\"data\":[]}", 11, model, sizeof(model)),
                    TANDEM_EPROTO);
}

static void test_body(void)
{
    struct lg_openai_opts o = {
        .api = LG_API_COMPLETIONS, .model = "m", .ignore_eos = 1, .temperature = NAN};
    struct lg_prompt p;
    memset(&p, 0, sizeof(p));
    p.text = "hello";
    p.text_len = 5;
    p.output_len = 16;
    size_t len;
    char *s = lg_openai_body(&o, &p, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(len, strlen(s));
    json_t *j = json_loads(s, 0, NULL);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "model")), "m");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "prompt")), "hello");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "max_tokens")), 16);
    CU_ASSERT(json_is_true(json_object_get(j, "stream")));
    CU_ASSERT(json_is_true(json_object_get(json_object_get(j, "stream_options"), "include_usage")));
    CU_ASSERT(json_is_true(json_object_get(j, "ignore_eos")));
    CU_ASSERT_PTR_NULL(json_object_get(j, "temperature"));
    json_decref(j);
    free(s);

    /* ids, temperature, extra body wins */
    int32_t ids[3] = {5, 6, 7};
    p.text = NULL;
    p.ids = ids;
    p.n_ids = 3;
    o.ignore_eos = 0;
    o.temperature = 0;
    json_t *extra = json_loads("{\"max_tokens\": 3, \"top_k\": 1}", 0, NULL);
    o.extra_body = extra;
    s = lg_openai_body(&o, &p, &len);
    j = json_loads(s, 0, NULL);
    const json_t *pr = json_object_get(j, "prompt");
    CU_ASSERT_EQUAL(json_array_size(pr), 3);
    CU_ASSERT_EQUAL(json_integer_value(json_array_get(pr, 2)), 7);
    CU_ASSERT_PTR_NULL(json_object_get(j, "ignore_eos"));
    CU_ASSERT_DOUBLE_EQUAL(json_number_value(json_object_get(j, "temperature")), 0, 0);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "max_tokens")), 3);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "top_k")), 1);
    json_decref(j);
    json_decref(extra);
    free(s);

    /* chat messages */
    struct lg_message msgs[2] = {{"system", "sys", 3}, {"user", "q\"uote", 6}};
    memset(&p, 0, sizeof(p));
    p.msgs = msgs;
    p.n_msgs = 2;
    p.output_len = 2;
    o = (struct lg_openai_opts){.api = LG_API_CHAT, .model = "m", .temperature = NAN};
    s = lg_openai_body(&o, &p, &len);
    j = json_loads(s, 0, NULL);
    const json_t *m = json_object_get(j, "messages");
    CU_ASSERT_EQUAL(json_array_size(m), 2);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(json_array_get(m, 1), "content")),
                           "q\"uote");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(json_array_get(m, 0), "role")),
                           "system");
    CU_ASSERT_PTR_NULL(json_object_get(j, "prompt"));
    json_decref(j);
    free(s);
}

static void test_url(void)
{
    char host[64], prefix[64];
    int port;
    CU_ASSERT_EQUAL(
        lg_parse_url("http://127.0.0.1:8000", host, sizeof(host), &port, prefix, sizeof(prefix)),
        0);
    CU_ASSERT_STRING_EQUAL(host, "127.0.0.1");
    CU_ASSERT_EQUAL(port, 8000);
    CU_ASSERT_STRING_EQUAL(prefix, "");
    CU_ASSERT_EQUAL(
        lg_parse_url("http://example.com/api/", host, sizeof(host), &port, prefix, sizeof(prefix)),
        0);
    CU_ASSERT_STRING_EQUAL(host, "example.com");
    CU_ASSERT_EQUAL(port, 80);
    CU_ASSERT_STRING_EQUAL(prefix, "/api");
    CU_ASSERT_EQUAL(
        lg_parse_url("http://[::1]:9/", host, sizeof(host), &port, prefix, sizeof(prefix)), 0);
    CU_ASSERT_STRING_EQUAL(host, "::1");
    CU_ASSERT_EQUAL(port, 9);
    const char *bad[] = {"https://x",      "ftp://x",      "http://",     "http://x:0",
                         "http://x:65536", "http://x:12a", "http://[::1", "x:80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CU_ASSERT_EQUAL(lg_parse_url(bad[i], host, sizeof(host), &port, prefix, sizeof(prefix)),
                        TANDEM_EINVAL);
    }
}

int main(void)
{
    const char *env = getenv("TANDEM_TEST_SEED");
    if (env != NULL) {
        seed = strtoull(env, NULL, 10);
    }
    printf("test_bench_sse: seed %llu (replay with TANDEM_TEST_SEED)\n", (unsigned long long)seed);
    guard_init();
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench_sse", NULL, NULL);
    CU_add_test(s, "sse_whole", test_sse_whole);
    CU_add_test(s, "sse_splits", test_sse_splits);
    CU_add_test(s, "sse_end_of_stream", test_sse_end_of_stream);
    CU_add_test(s, "sse_errors", test_sse_errors);
    CU_add_test(s, "sse_garbage", test_sse_garbage);
    CU_add_test(s, "chunks", test_chunks);
    CU_add_test(s, "error_message", test_error_message);
    CU_add_test(s, "body", test_body);
    CU_add_test(s, "url", test_url);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
