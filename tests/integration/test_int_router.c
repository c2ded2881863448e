/* Integration: tandem-router with real workers on loopback. Flags and exit
 * codes; router + 2 prefill + 2 decode workers (tiny) announcing themselves:
 * completions and chat, streaming and not, text identical to the
 * single-process engine's tokens decoded the same way, local and remote
 * prefill, logprobs, a stop string (the worker is cancelled); the info
 * routes; bad requests in OpenAI's error shape with exact statuses; without
 * a decode worker, a request held until one joins, or 503 (at once with
 * --hold-timeout-ms 0, after the hold otherwise); prefix-aware routing (cached tokens after
 * warm-up) against round robin. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"
#include "rt_cluster.h"
#include "tokenizer.h"

static void teardown(void)
{
    h_cleanup_all();
}

/* ---- A cluster ---------------------------------------------------------- */

/* rt_cluster.h's cluster, its router and workers logging at warn (a later
 * --log-level wins). */
static const char *const warn[] = {"--log-level", "warn", NULL};

static int cluster_start(struct rtc_cluster *c, const char *routing, int n_p, int n_d)
{
    return rtc_cluster_start(c, routing, n_p, n_d, warn, warn);
}

/* Checks a completion's logprobs.token_logprobs against the engine's, bit
 * for bit (a float printed by the router reads back exactly). */
static void expect_logprobs(json_t *j, const float *want, int n)
{
    json_t *lp = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"),
        "token_logprobs");
    EXPECT_EQ(json_array_size(lp), n);
    int same = 0;
    for (int i = 0; i < n && i < (int)json_array_size(lp); i++) {
        double v = json_number_value(json_array_get(lp, (size_t)i));
        same += (float)v == want[i];
    }
    EXPECT_EQ(same, n);
}

static json_t *parse(const char *body)
{
    json_error_t e;
    json_t *j = json_loads(body ? body : "", JSON_ALLOW_NUL, &e);
    if (j == NULL) {
        fprintf(stderr, "\nnot JSON (%s): %.300s\n", e.text, body ? body : "(null)");
    }
    return j;
}

static const char *jstr(json_t *j, const char *path)
{
    /* path: "a.b.0.c" */
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    json_t *cur = j;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) {
        cur =
            json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
    }
    return cur && json_is_string(cur) ? json_string_value(cur) : NULL;
}

static long long jint(json_t *j, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    json_t *cur = j;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) {
        cur =
            json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
    }
    return cur && json_is_integer(cur) ? json_integer_value(cur) : -1;
}

/* Runs a completion with a token-id prompt; returns the parsed response (or
 * NULL) and the status in *status. */
static json_t *complete_ids(int port, const uint32_t *prompt, int n, int max_tokens,
                            const char *extra, int *status)
{
    char *ids = rtc_ids_json(prompt, n);
    size_t cap = strlen(ids) + 512;
    char *body = malloc(cap);
    snprintf(body, cap,
             "{\"model\":\"tiny\",\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true%s%s}",
             ids, max_tokens, extra ? "," : "", extra ? extra : "");
    struct rtc_resp r;
    *status = rtc_post(port, "/v1/completions", body, &r);
    json_t *j = *status == 200 ? parse(r.body) : NULL;
    if (*status != 200) {
        fprintf(stderr, "\ncompletion: %d %s\n", *status, r.body ? r.body : "");
    }
    rtc_resp_free(&r);
    free(body);
    free(ids);
    return j;
}

/* Streams a completion (status 200 expected) and parses its events (a new
 * answer; the caller frees it). */
static struct rtc_answer *stream_answer(int port, const char *path, const char *body)
{
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(port, path, body, &r), 200);
    struct rtc_answer *a = calloc(1, sizeof(*a));
    rtc_answer_parse(r.body, 1, a);
    rtc_resp_free(&r);
    return a;
}

/* ---- Flags -------------------------------------------------------------- */

static void test_flags(void)
{
    const char *help[] = {"--help", NULL};
    const char *version[] = {"--version", NULL};
    const char *unknown[] = {"--bogus", NULL};
    const char *bad_port[] = {"--port", "http", NULL};
    const char *bad_level[] = {"--log-level", "loud", NULL};
    const char *missing[] = {"--routing", "/nonexistent/routing.yaml", NULL};
    const char *block[] = {"--block-size", "32", "--port", "0", "--announce", "none", NULL};
    EXPECT_EQ(h_run("tandem-router", help, 30000, 0), 0);
    EXPECT_EQ(h_run("tandem-router", version, 30000, 0), 0);
    EXPECT_EQ(h_run("tandem-router", unknown, 30000, 0), 2);
    EXPECT_EQ(h_run("tandem-router", bad_port, 30000, 0), 2);
    EXPECT_EQ(h_run("tandem-router", bad_level, 30000, 0), 2);
    EXPECT_EQ(h_run("tandem-router", missing, 30000, 0), 2);
    /* The default routing hashes 16-token blocks. */
    EXPECT_EQ(h_run("tandem-router", block, 30000, 0), 2);
    char bad[H_URL_MAX];
    snprintf(bad, sizeof(bad), "%s/bad-routing.yaml", h_tmpdir());
    FILE *f = fopen(bad, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
          "plugins:\n- type: lora-affinity-scorer\nschedulingProfiles:\n- name: d\n  plugins:\n"
          "  - pluginRef: lora-affinity-scorer\n",
          f);
    fclose(f);
    const char *bad_routing[] = {"--routing", bad, "--port", "0", "--announce", "none", NULL};
    EXPECT_EQ(h_run("tandem-router", bad_routing, 30000, 0), 2);
    unlink(bad);
    /* Port in use: exit 1. */
    struct h_proc r;
    int port = 0;
    const char *none[] = {"--announce", "none", "--log-level", "error", NULL};
    CU_ASSERT_FATAL(rtc_spawn_router(&r, none, &port) == 0);
    CU_ASSERT(strstr(r.id, "router") != NULL);
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    const char *taken[] = {"--port", port_s, "--announce", "none", NULL};
    EXPECT_EQ(h_run("tandem-router", taken, 30000, 0), 1);
    EXPECT_EQ(h_stop(&r, SIGTERM, 10000), 0);
}

/* ---- Completions and chat ----------------------------------------------- */

static void test_completions_and_chat(void)
{
    struct rtc_cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, NULL, 2, 2) == 0);

    /* A short prompt: prefilled on D (uncached < nonCachedTokens). */
    uint32_t prompt[400];
    h_prompt(prompt, 400, 11, 3, 259);
    const int mt = 12;
    float want_lp[16];
    char *want = reference_text(prompt, 40, mt, want_lp);
    CU_ASSERT_FATAL(want != NULL);
    int st;
    json_t *j = complete_ids(c.port, prompt, 40, mt, "\"logprobs\":1", &st);
    EXPECT_EQ(st, 200);
    CU_ASSERT_FATAL(j != NULL);
    EXPECT_STR(jstr(j, "object"), "text_completion");
    EXPECT_STR(jstr(j, "model"), "tiny");
    CU_ASSERT(strncmp(jstr(j, "id") ? jstr(j, "id") : "", "cmpl-", 5) == 0);
    EXPECT_STR(jstr(j, "choices.0.text"), want);
    EXPECT_STR(jstr(j, "choices.0.finish_reason"), "length");
    EXPECT_EQ(jint(j, "usage.prompt_tokens"), 40);
    EXPECT_EQ(jint(j, "usage.completion_tokens"), mt);
    EXPECT_EQ(jint(j, "usage.total_tokens"), 40 + mt);
    CU_ASSERT(jint(j, "usage.prompt_tokens_details.cached_tokens") >= 0);
    expect_logprobs(j, want_lp, mt);
    json_decref(j);

    /* The same, streamed. */
    char body[4096];
    char *ids = rtc_ids_json(prompt, 40);
    snprintf(body, sizeof(body),
             "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
             "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             ids, mt);
    free(ids);
    struct rtc_answer *a = stream_answer(c.port, "/v1/completions", body);
    EXPECT_STR(a->text, want);
    EXPECT_EQ(a->completion_tokens, mt);
    EXPECT_EQ(a->done, 1);
    EXPECT_STR(a->finish, "length");
    free(a);
    free(want);

    /* A long prompt: 400 uncached tokens >= 256, prefilled on a prefill
     * worker and shipped; the tokens are the same. */
    uint32_t lp[400];
    h_prompt(lp, 400, 12, 3, 259);
    want = reference_text(lp, 400, 8, want_lp);
    j = complete_ids(c.port, lp, 400, 8, "\"logprobs\":2", &st);
    EXPECT_EQ(st, 200);
    CU_ASSERT_FATAL(j != NULL);
    EXPECT_STR(jstr(j, "choices.0.text"), want);
    expect_logprobs(j, want_lp, 8);
    json_decref(j);
    free(want);
    want = NULL;
    struct rtc_resp r;
    EXPECT_EQ(rtc_get(c.port, "/metrics", &r), 200);
    EXPECT_NUM(h_metric(r.body, "tandem:pd_decisions_total{prefill=\"remote\"}"), 1);
    EXPECT_NUM(h_metric(r.body, "tandem:pd_decisions_total{prefill=\"local\"}"), 2);
    EXPECT_NUM(h_metric(r.body, "tandem:router_requests_total{code=\"200\"}"), 3);
    EXPECT_NUM(h_metric(r.body, "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"}"), 3);
    EXPECT_NUM(h_metric(r.body, "vllm:e2e_request_latency_seconds_count{model_name=\"tiny\"}"), 3);
    EXPECT_NUM(h_metric(r.body, "tandem:routing_decision_seconds_count"), 3);
    EXPECT_NUM(h_metric(r.body, "vllm:num_requests_running{model_name=\"tiny\"}"), 0);
    rtc_resp_free(&r);
    double frames = 0;
    for (int i = 0; i < 2; i++) {
        frames += h_proc_metric(&c.d[i], "tandem:kv_frames_installed_total");
    }
    EXPECT_NUM(frames, 25); /* 400 tokens: 25 blocks */

    /* Chat: the template, BOS first, the byte tokenizer. The user message is
     * the first of a few whose greedy answer has text (random weights emit
     * many ids that decode to nothing; "Hello" gives ""), so comparing the
     * text can fail. */
    static const char *const contents[] = {"Hello", "Hi", "abc", "Tell me", "xyz", "ok", "q"};
    const char *content = NULL;
    uint32_t cp[64];
    int n = 0;
    for (size_t k = 0; k < sizeof(contents) / sizeof(*contents) && content == NULL; k++) {
        char tmpl[64];
        snprintf(tmpl, sizeof(tmpl), "<|user|>\n%s\n<|assistant|>\n", contents[k]);
        struct tokenizer *tok;
        tok_create_bytes(&tok);
        n = tok_encode(tok, tmpl, strlen(tmpl), 1, cp, 64);
        tok_destroy(tok);
        CU_ASSERT_FATAL(n == (int)strlen(tmpl) + 1);
        free(want);
        want = reference_text(cp, n, 10, NULL);
        if (want != NULL && want[0] != '\0') {
            content = contents[k];
        }
    }
    CU_ASSERT_FATAL(content != NULL);
    char chat[256], chat_stream[256];
    snprintf(chat, sizeof(chat),
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":10,"
             "\"temperature\":0,\"ignore_eos\":true}",
             content);
    EXPECT_EQ(rtc_post(c.port, "/v1/chat/completions", chat, &r), 200);
    j = parse(r.body);
    rtc_resp_free(&r);
    CU_ASSERT_FATAL(j != NULL);
    EXPECT_STR(jstr(j, "object"), "chat.completion");
    EXPECT_STR(jstr(j, "choices.0.message.role"), "assistant");
    EXPECT_STR(jstr(j, "choices.0.message.content"), want);
    EXPECT_EQ(jint(j, "usage.prompt_tokens"), n);
    json_decref(j);
    snprintf(chat_stream, sizeof(chat_stream),
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":10,"
             "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}",
             content);
    a = stream_answer(c.port, "/v1/chat/completions", chat_stream);
    EXPECT_STR(a->text, want);
    EXPECT_EQ(a->completion_tokens, -1); /* no include_usage: no usage chunk */
    EXPECT_EQ(a->done, 1);
    EXPECT_STR(a->finish, "length");
    free(a);
    EXPECT_EQ(rtc_post(c.port, "/v1/chat/completions", chat_stream, &r), 200);
    /* The first chunk names the role and carries the first token's text (a
     * prefix of the answer, "" when that token has none). */
    char *first = rtc_sse_event(r.body, 0);
    CU_ASSERT_FATAL(first != NULL);
    j = parse(first);
    free(first);
    CU_ASSERT_FATAL(j != NULL);
    EXPECT_STR(jstr(j, "choices.0.delta.role"), "assistant");
    const char *head = jstr(j, "choices.0.delta.content");
    CU_ASSERT(head != NULL && strncmp(want, head, strlen(head)) == 0);
    json_decref(j);
    rtc_resp_free(&r);

    /* A stop string: the text ends before it, finish_reason "stop", and the
     * worker was cancelled (no blocks held). The stop is the first printable
     * ASCII character of an engine output that has one (random weights emit
     * many ids without text). */
    uint32_t sp[40];
    char *full = NULL;
    int at = -1;
    for (uint64_t seed = 1; seed < 40 && at < 0; seed++) {
        h_prompt(sp, 40, seed, 3, 259);
        free(full);
        full = reference_text(sp, 40, 30, NULL);
        for (int i = 0; full != NULL && full[i] != '\0'; i++) {
            if (full[i] > ' ' && full[i] < 127 && full[i] != '"' && full[i] != '\\') {
                at = i;
                break;
            }
        }
    }
    CU_ASSERT_FATAL(at >= 0);
    char stop[2] = {full[at], 0};
    char extra[64];
    snprintf(extra, sizeof(extra), "\"stop\":[\"%s\"]", stop);
    j = complete_ids(c.port, sp, 40, 2000, extra, &st);
    CU_ASSERT_FATAL(j != NULL);
    char *before = strndup(full, (size_t)at);
    EXPECT_STR(jstr(j, "choices.0.text"), before);
    free(before);
    EXPECT_STR(jstr(j, "choices.0.finish_reason"), "stop");
    EXPECT_STR(jstr(j, "choices.0.stop_reason"), stop);
    CU_ASSERT(jint(j, "usage.completion_tokens") <= 30);
    json_decref(j);
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(h_wait_used(&c.d[i], 0, 30000), 0);
    }
    free(full);
    free(want);

    /* The info routes. */
    EXPECT_EQ(rtc_get(c.port, "/v1/models", &r), 200);
    j = parse(r.body);
    EXPECT_STR(jstr(j, "data.0.id"), "tiny");
    EXPECT_EQ(jint(j, "data.0.max_model_len"), 4096);
    json_decref(j);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_get(c.port, "/health", &r), 200);
    EXPECT_STR(r.body, "{\"status\":\"ok\",\"endpoints\":4,\"healthy_endpoints\":4}");
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_get(c.port, "/v1/cluster", &r), 200);
    j = parse(r.body);
    json_t *eps = json_object_get(j, "endpoints");
    EXPECT_EQ(json_array_size(eps), 4);
    int roles[4] = {0};
    for (size_t i = 0; i < json_array_size(eps); i++) {
        json_t *e = json_array_get(eps, i);
        const char *role = json_string_value(json_object_get(e, "role"));
        roles[role && strcmp(role, "prefill") == 0  ? 1
              : role && strcmp(role, "decode") == 0 ? 2
                                                    : 0]++;
        CU_ASSERT(json_is_true(json_object_get(e, "healthy")));
        CU_ASSERT(json_integer_value(json_object_get(json_object_get(e, "kv"), "blocks_total")) ==
                  2048);
        CU_ASSERT(json_object_get(json_object_get(e, "inflight"), "requests") != NULL);
        CU_ASSERT(json_is_string(json_object_get(e, "control_address")));
        /* The workers' control addresses are tcp://127.0.0.1 or ipc://: the
         * loop's own links, and no fault on them. */
        EXPECT_STR(json_string_value(json_object_get(e, "link_transport")), "uvsp");
        EXPECT_EQ(
            json_integer_value(json_object_get(json_object_get(e, "counters"), "link_faults")), 0);
    }
    EXPECT_EQ(roles[1], 2);
    EXPECT_EQ(roles[2], 2);
    json_decref(j);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_get(c.port, "/v1/decisions", &r), 200);
    j = parse(r.body);
    json_t *decs = json_object_get(j, "decisions");
    CU_ASSERT(json_array_size(decs) >= 7);
    json_t *d0 = json_array_get(decs, 0);
    CU_ASSERT(json_is_string(json_object_get(d0, "decode")));
    CU_ASSERT(json_object_get(d0, "actual_cached_decode") != NULL);
    json_decref(j);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_get(c.port, "/nope", &r), 404);
    rtc_resp_free(&r);
    rtc_cluster_stop(&c);
}

/* ---- Bad requests ------------------------------------------------------- */

static void expect_error(int port, const char *path, const char *body, int status, const char *type,
                         const char *code, const char *param)
{
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(port, path, body, &r), status);
    json_t *j = parse(r.body);
    CU_ASSERT_FATAL(j != NULL);
    json_t *e = json_object_get(j, "error");
    CU_ASSERT(json_is_object(e));
    CU_ASSERT(json_is_string(json_object_get(e, "message")));
    EXPECT_STR(jstr(j, "error.type"), type);
    EXPECT_STR(jstr(j, "error.code"), code);
    CU_ASSERT(json_object_get(e, "param") != NULL);
    if (param != NULL) {
        EXPECT_STR(jstr(j, "error.param"), param);
    }
    json_decref(j);
    rtc_resp_free(&r);
}

static void test_bad_requests(void)
{
    struct rtc_cluster c;
    CU_ASSERT_FATAL(cluster_start(&c, NULL, 0, 1) == 0);
    const char *cp = "/v1/completions", *ch = "/v1/chat/completions";
    expect_error(c.port, cp, "{\"prompt\": ", 400, "invalid_request_error", "invalid_json", NULL);
    expect_error(c.port, cp, "[1,2]", 400, "invalid_request_error", "invalid_type", NULL);
    expect_error(c.port, cp, "{\"prompt\":\"hi\",\"n\":2}", 400, "invalid_request_error",
                 "unsupported_value", "n");
    expect_error(c.port, cp, "{\"prompt\":\"hi\",\"model\":\"gpt-4\"}", 400,
                 "invalid_request_error", "model_not_found", "model");
    expect_error(c.port, cp, "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400,
                 "invalid_request_error", "invalid_type", "temperature");
    expect_error(c.port, cp, "{\"prompt\":\"hi\",\"top_p\":1.5}", 400, "invalid_request_error",
                 "invalid_value", "top_p");
    expect_error(c.port, cp, "{\"max_tokens\":4}", 400, "invalid_request_error",
                 "missing_required_parameter", "prompt");
    expect_error(c.port, cp, "{\"prompt\":[1,512]}", 400, "invalid_request_error", "invalid_value",
                 NULL);
    expect_error(c.port, ch, "{\"messages\":[]}", 400, "invalid_request_error", "invalid_value",
                 "messages");
    /* 4000 + 200 > 4096 */
    char *big = malloc(20000);
    size_t len = (size_t)sprintf(big, "{\"prompt\":[");
    for (int i = 0; i < 4000; i++) {
        len += (size_t)sprintf(big + len, "%s%d", i ? "," : "", 3 + i % 200);
    }
    sprintf(big + len, "],\"max_tokens\":200}");
    expect_error(c.port, cp, big, 400, "invalid_request_error", "context_length_exceeded",
                 "prompt");
    free(big);
    /* Wrong method, unknown path. */
    struct rtc_resp r;
    EXPECT_EQ(rtc_get(c.port, "/v1/completions", &r), 405);
    char allow[32];
    rtc_header(r.headers, "Allow", allow, sizeof(allow));
    EXPECT_STR(allow, "POST");
    json_t *j = parse(r.body);
    EXPECT_STR(jstr(j, "error.code"), "method_not_allowed");
    json_decref(j);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_post(c.port, "/v1/embeddings", "{}", &r), 404);
    j = parse(r.body);
    EXPECT_STR(jstr(j, "error.code"), "not_found");
    json_decref(j);
    rtc_resp_free(&r);
    /* Still serving. */
    EXPECT_EQ(rtc_post(c.port, cp, "{\"prompt\":\"ok\",\"max_tokens\":2}", &r), 200);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_get(c.port, "/metrics", &r), 200);
    EXPECT_NUM(h_metric(r.body, "tandem:router_requests_total{code=\"400\"}"), 10);
    EXPECT_NUM(h_metric(r.body, "tandem:router_requests_total{code=\"200\"}"), 1);
    rtc_resp_free(&r);
    rtc_cluster_stop(&c);
}

/* ---- No decode endpoint ------------------------------------------------- */

/* --hold-timeout-ms 0: 503 at once. */
static void test_no_decode_503(void)
{
    static const char *const no_hold[] = {"--log-level", "warn", "--hold-timeout-ms", "0", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 1, 0, no_hold, warn) == 0);
    expect_error(c.port, "/v1/completions", "{\"prompt\":\"hi\"}", 503, "server_error",
                 "service_unavailable", NULL);
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(c.port, "/v1/chat/completions",
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}",
                       &r),
              503);
    CU_ASSERT(strstr(r.body, "No healthy decode endpoint") != NULL);
    rtc_resp_free(&r);
    rtc_cluster_stop(&c);
}

/* The default holds a request until a decode worker joins: one sent before
 * any decode worker exists is answered by the one started after it, the
 * wait observed in tandem:request_hold_seconds. A hold that runs out
 * (--hold-timeout-ms 400) is the 503, after the hold, saying so. */
static void test_no_decode_held(void)
{
    static const char *const hold[] = {"--log-level", "warn", "--hold-timeout-ms", "400", NULL};
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 1, 0, hold, warn) == 0);
    double t0 = h_ms();
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(c.port, "/v1/completions", "{\"prompt\":\"hi\"}", &r), 503);
    CU_ASSERT(h_ms() - t0 >= 400);
    CU_ASSERT(strstr(r.body, "No healthy decode endpoint is available: none joined while the "
                             "router held the request for") != NULL);
    CU_ASSERT(strstr(r.body, "--hold-timeout-ms") != NULL);
    rtc_resp_free(&r);
    EXPECT_NUM(rtc_metric(c.port, "tandem:request_hold_seconds_count{outcome=\"expired\"}"), 1);
    rtc_cluster_stop(&c);

    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 1, 0, warn, warn) == 0);
    uint32_t prompt[8];
    h_prompt(prompt, 8, 17, 3, 259);
    struct rtc_conn conn;
    CU_ASSERT_FATAL(rtc_send_completion(&conn, c.port, prompt, 8, 4, 0) == 0);
    h_sleep_ms(300); /* held meanwhile */
    const char *w[] = {"--router", c.announce, "--log-level", "error", NULL};
    CU_ASSERT_FATAL(h_spawn(&c.d[0], "tandem-decode", w, 20000) == 0);
    c.n_d = 1;
    EXPECT_EQ(rtc_read(&conn, &r, RTC_HANG_MS), 200);
    rtc_resp_free(&r);
    rtc_close(&conn);
    EXPECT_NUM(rtc_metric(c.port, "tandem:request_hold_seconds_count{outcome=\"sent\"}"), 1);
    CU_ASSERT(rtc_metric(c.port, "tandem:request_hold_seconds_sum{outcome=\"sent\"}") >= 0.3);
    rtc_cluster_stop(&c);
}

/* ---- Prefix-aware routing vs round robin -------------------------------- */

/* KvEvents messages the router has received from its endpoints, summed
 * (the per-link counters of /v1/cluster), or -1 when it did not answer. */
static long long kv_events_received(int port)
{
    struct rtc_resp r;
    long long n = -1;
    if (rtc_get(port, "/v1/cluster", &r) == 200) {
        json_t *j = parse(r.body);
        json_t *eps = json_object_get(j, "endpoints");
        n = j != NULL ? 0 : -1;
        for (size_t i = 0; i < json_array_size(eps); i++) {
            json_t *cnt = json_object_get(json_array_get(eps, i), "counters");
            n += json_integer_value(json_object_get(cnt, "kv_events"));
        }
        json_decref(j);
    }
    rtc_resp_free(&r);
    return n;
}

/* 3 prompts with different 64-token prefixes, two rounds, on 2 decode
 * workers: returns how many second-round requests reported cached tokens. */
static int second_round_hits(const char *routing, int *cached_sum)
{
    struct rtc_cluster c;
    *cached_sum = 0;
    if (cluster_start(&c, routing, 0, 2) != 0) {
        return -1;
    }
    int hits = 0;
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 3; k++) {
            uint32_t prompt[74];
            h_prompt(prompt, 64, 100 + (uint64_t)k, 3, 259); /* shared prefix */
            h_prompt(prompt + 64, 10, 200 + (uint64_t)round * 10 + (uint64_t)k, 3, 259);
            long long events = kv_events_received(c.port);
            int st;
            json_t *j = complete_ids(c.port, prompt, 74, 2, NULL, &st);
            EXPECT_EQ(st, 200);
            long long cached = j ? jint(j, "usage.prompt_tokens_details.cached_tokens") : -1;
            if (round == 1) {
                hits += cached > 0;
                *cached_sum += (int)cached;
            } else {
                EXPECT_EQ(cached, 0);
            }
            json_decref(j);
            if (round == 0) {
                /* The second round is routed on the prefix index, which the
                 * serving worker feeds with the STORED events of this
                 * prompt's 4 blocks (one KvEvents batch: they are committed
                 * in its prefill step, no later token fills a block). Wait
                 * until that batch has reached the router. Only this
                 * request is running, so any new batch is its own. */
                double deadline = h_ms() + 30000;
                long long now = kv_events_received(c.port);
                while (now <= events && h_ms() < deadline) {
                    h_sleep_ms(5);
                    now = kv_events_received(c.port);
                }
                CU_ASSERT(events >= 0 && now > events);
            }
        }
    }
    rtc_cluster_stop(&c);
    return hits;
}

static void test_prefix_routing(void)
{
    int cached;
    int hits = second_round_hits("prefix-aware-precise.yaml", &cached);
    EXPECT_EQ(hits, 3);
    EXPECT_EQ(cached, 3 * 64); /* the 4 prefix blocks of each */
    printf("\n  prefix-aware: %d of 3 second-round requests hit, %d cached tokens\n", hits, cached);
    /* Round robin sends each prompt's second visit to the other worker. */
    hits = second_round_hits("round-robin.yaml", &cached);
    EXPECT_EQ(hits, 0);
    printf("  round-robin: %d of 3 second-round requests hit\n", hits);
}

/* ---- Static workers ------------------------------------------------------ */

/* --workers dials control addresses from the command line; no announcing. */
/* ---- Stream interval ---------------------------------------------------- */

/* body without its response ids and "created" values (random, and the
 * second of the request). Returns a new string. */
static char *without_ids(const char *body)
{
    char *out = malloc(strlen(body) + 1);
    CU_ASSERT_FATAL(out != NULL);
    size_t o = 0;
    for (const char *p = body; *p;) {
        if (strncmp(p, "\"id\":\"", 6) == 0) {
            const char *q = strchr(p + 6, '"');
            p = q ? q + 1 : p + strlen(p);
        } else if (strncmp(p, "\"created\":", 10) == 0) {
            p += 10;
            while (*p >= '0' && *p <= '9') {
                p++;
            }
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return out;
}

/* A decode worker with --stream-interval 4 sends a request's tokens 4 at a
 * time (the first at once, the last 2 with the finish); the client reads the
 * same events as from a worker that sends each token (logprobs and usage
 * included). */
static void test_stream_interval(void)
{
    uint32_t prompt[40];
    h_prompt(prompt, 40, 5, 3, 259);
    char *ids = rtc_ids_json(prompt, 40);
    char req[4096];
    snprintf(req, sizeof(req),
             "{\"prompt\":%s,\"max_tokens\":23,\"temperature\":0,\"ignore_eos\":true,"
             "\"stream\":true,\"logprobs\":2,\"stream_options\":{\"include_usage\":true}}",
             ids);
    free(ids);
    const char *const every4[] = {"--stream-interval", "4", NULL};
    char *got[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        struct rtc_cluster c;
        CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 1, warn, k ? every4 : NULL) == 0);
        struct rtc_resp r;
        EXPECT_EQ(rtc_post(c.port, "/v1/completions", req, &r), 200);
        got[k] = without_ids(r.body ? r.body : "");
        rtc_resp_free(&r);
        rtc_cluster_stop(&c);
    }
    /* 23 token events, the finish, the usage, [DONE]. */
    int events = 0;
    for (const char *p = got[1]; (p = strstr(p, "data: ")) != NULL; p += 6) {
        events++;
    }
    EXPECT_EQ(events, 23 + 3);
    EXPECT_STR(got[1], got[0]);
    free(got[0]);
    free(got[1]);
}

/* Ends body at its usage event's counts. */
static void cut_usage(char *body)
{
    char *u = strstr(body, "\"usage\":{\"prompt_tokens\"");
    CU_ASSERT_PTR_NOT_NULL(u);
    if (u != NULL) {
        *u = '\0';
    }
}

/* The router takes BATCH envelopes (its jobs say so): a worker sends the
 * envelopes of one loop turn as one NNG message. Six streams decoded
 * together read exactly what one alone reads, and the worker sent fewer
 * control messages than envelopes. */
static void test_control_batches(void)
{
    enum { N = 6, MAX = 12 };
    uint32_t prompt[24];
    h_prompt(prompt, 24, 7, 3, 259);
    struct rtc_cluster c;
    CU_ASSERT_FATAL(rtc_cluster_start(&c, NULL, 0, 1, warn, NULL) == 0);
    struct rtc_conn conn[N];
    struct rtc_resp r;
    CU_ASSERT_FATAL(rtc_send_completion(&conn[0], c.port, prompt, 24, MAX, 1) == 0);
    EXPECT_EQ(rtc_read(&conn[0], &r, RTC_HANG_MS), 200);
    char *alone = without_ids(r.body ? r.body : "");
    rtc_resp_free(&r);
    rtc_close(&conn[0]);
    int events = 0;
    for (const char *p = alone; (p = strstr(p, "data: ")) != NULL; p += 6) {
        events++;
    }
    EXPECT_EQ(events, MAX + 3); /* the tokens, the finish, the usage, [DONE] */
    cut_usage(alone);
    double renv0 = rtc_metric(c.port, "tandem:router_control_envelopes_sent_total");
    double rmsg0 = rtc_metric(c.port, "tandem:router_control_messages_sent_total");
    double env0 = rtc_metric(c.d[0].metrics_port, "tandem:control_envelopes_sent_total");
    double msg0 = rtc_metric(c.d[0].metrics_port, "tandem:control_messages_sent_total");
    for (int i = 0; i < N; i++) {
        CU_ASSERT_FATAL(rtc_send_completion(&conn[i], c.port, prompt, 24, MAX, 1) == 0);
    }
    for (int i = 0; i < N; i++) {
        EXPECT_EQ(rtc_read(&conn[i], &r, RTC_HANG_MS), 200);
        char *got = without_ids(r.body ? r.body : "");
        /* Up to the usage: the six find the prompt's blocks cached. */
        cut_usage(got);
        EXPECT_STR(got, alone);
        free(got);
        rtc_resp_free(&r);
        rtc_close(&conn[i]);
    }
    double env1 = rtc_metric(c.d[0].metrics_port, "tandem:control_envelopes_sent_total");
    double msg1 = rtc_metric(c.d[0].metrics_port, "tandem:control_messages_sent_total");
    printf("\n  %d streams together: %.0f envelopes in %.0f control messages\n", N, env1 - env0,
           msg1 - msg0);
    /* At least a token chunk per stream per step after the first: N x MAX. */
    CU_ASSERT(env1 - env0 >= N * MAX);
    CU_ASSERT(msg1 - msg0 > 0 && msg1 - msg0 < env1 - env0);
    /* The worker takes batches too: the router's jobs of one loop turn leave
     * together (how many share a turn is up to the scheduler; test_rt_registry
     * batches checks the batching itself). */
    double renv = rtc_metric(c.port, "tandem:router_control_envelopes_sent_total") - renv0;
    double rmsg = rtc_metric(c.port, "tandem:router_control_messages_sent_total") - rmsg0;
    printf("  the router sent %.0f envelopes in %.0f messages\n", renv, rmsg);
    CU_ASSERT(renv >= N);
    CU_ASSERT(rmsg >= 1 && rmsg <= renv);
    free(alone);
    rtc_cluster_stop(&c);
}

static void test_static_workers(void)
{
    struct h_proc d, router;
    char ctl[H_URL_MAX], kv[H_URL_MAX];
    h_ipc_url(ctl, sizeof(ctl), "static-ctl");
    h_ipc_url(kv, sizeof(kv), "static-kv");
    const char *wargs[] = {"--colocated", "--control", ctl, "--kv", kv,
                           "--log-level", "warn",      NULL};
    CU_ASSERT_FATAL(h_spawn(&d, "tandem-decode", wargs, 20000) == 0);
    const char *rargs[] = {"--announce", "none", "--workers", ctl, "--log-level", "warn", NULL};
    int port = 0;
    CU_ASSERT_FATAL(rtc_spawn_router(&router, rargs, &port) == 0);
    EXPECT_EQ(rtc_wait_healthy(port, 1, 30000), 1);
    struct rtc_resp r;
    EXPECT_EQ(rtc_post(port, "/v1/completions", "{\"prompt\":\"static\",\"max_tokens\":3}", &r),
              200);
    CU_ASSERT(r.body && strstr(r.body, "\"completion_tokens\":3") != NULL);
    rtc_resp_free(&r);
    EXPECT_EQ(rtc_get(port, "/v1/cluster", &r), 200);
    json_t *j = parse(r.body);
    EXPECT_STR(jstr(j, "endpoints.0.role"), "colocated");
    EXPECT_STR(jstr(j, "endpoints.0.control_address"), ctl);
    CU_ASSERT(json_is_null(json_object_get(j, "announce")));
    json_decref(j);
    rtc_resp_free(&r);
    EXPECT_EQ(h_stop(&router, SIGTERM, 10000), 0);
    EXPECT_EQ(h_stop(&d, SIGTERM, 15000), 0);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("router", NULL, NULL, NULL, teardown);
    CU_add_test(s, "flags", test_flags);
    CU_add_test(s, "completions_and_chat", test_completions_and_chat);
    CU_add_test(s, "bad_requests", test_bad_requests);
    CU_add_test(s, "no_decode_503", test_no_decode_503);
    CU_add_test(s, "no_decode_held", test_no_decode_held);
    CU_add_test(s, "prefix_routing", test_prefix_routing);
    CU_add_test(s, "static_workers", test_static_workers);
    CU_add_test(s, "stream_interval", test_stream_interval);
    CU_add_test(s, "control_batches", test_control_batches);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
