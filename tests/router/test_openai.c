/* OpenAI API layer: request parsing and every error, chat template, context
 * checks, response and SSE chunk JSON (compared as parsed JSON), logprobs
 * shapes, echo, stop strings across tokens and UTF-8 across tokens, and a
 * randomised stop-string run against a naive model (seed printed; OA_SEED
 * replays). */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template.h"
#include "openai.h"
#include "tandem_err.h"
#include "tokenizer.h"

#define B(c) ((uint32_t)(unsigned char)(c) + TOK_BYTE_BASE) /* byte-level token of byte c */

static struct tokenizer *g_tok; /* byte-level, 512 ids */

static const struct oa_model g_models[] = {
    {.id = "tiny", .max_context = 64, .vocab_size = 512, .created = 1700000000},
    {.id = "sim-llama", .max_context = 4096, .vocab_size = 32000, .created = 1700000001},
};

/* ------------------------------------------------------------- helpers */

static void assert_json_at(const char *actual, const char *expected, int line)
{
    json_error_t je;
    json_t *a = actual ? json_loads(actual, 0, &je) : NULL;
    json_t *x = json_loads(expected, 0, &je);
    if (x == NULL)
        printf("\n  line %d: bad expected JSON: %s\n", line, je.text);
    int ok = a != NULL && x != NULL && json_equal(a, x);
    if (!ok)
        printf("\n  line %d:\n    actual:   %s\n    expected: %s\n", line,
               actual ? actual : "(null)", expected);
    CU_assertImplementation(ok ? CU_TRUE : CU_FALSE, (unsigned)line, "JSON equal", __FILE__, "",
                            CU_FALSE);
    json_decref(a);
    json_decref(x);
}
#define ASSERT_JSON(a, x) assert_json_at((a), (x), __LINE__)

/* Parses body and expects the error (status, param or NULL, code or NULL, message). */
static void expect_error_at(enum oa_kind kind, const char *body, int status, const char *param,
                            const char *code, const char *message, int line)
{
    struct oa_request req;
    struct oa_error e;
    memset(&e, 0, sizeof(e));
    int rc = oa_parse(kind, body, strlen(body), &req, &e);
    int ok = rc == TANDEM_EINVAL && e.status == status &&
             strcmp(e.param, param ? param : "") == 0 &&
             ((code == NULL && e.code == NULL) ||
              (code != NULL && e.code != NULL && strcmp(e.code, code) == 0)) &&
             strcmp(e.message, message) == 0 && strcmp(e.type, "invalid_request_error") == 0;
    if (!ok)
        printf("\n  line %d: body %s\n    got      rc %d, %d, param '%s', code %s, '%s'\n"
               "    expected rc %d, %d, param '%s', code %s, '%s'\n",
               line, body, rc, e.status, e.param, e.code ? e.code : "(null)", e.message,
               TANDEM_EINVAL, status, param ? param : "", code ? code : "(null)", message);
    CU_assertImplementation(ok ? CU_TRUE : CU_FALSE, (unsigned)line, "error matches", __FILE__, "",
                            CU_FALSE);
    /* A failed parse leaves an empty request. */
    CU_ASSERT_PTR_NULL(req.doc);
    CU_ASSERT_PTR_NULL(req.messages);
    CU_ASSERT_PTR_NULL(req.prompt_ids);
    oa_request_fini(&req);
}
#define EXPECT_ERROR(k, body, st, param, code, msg)                                                \
    expect_error_at((k), (body), (st), (param), (code), (msg), __LINE__)
#define CMPL OA_KIND_COMPLETION
#define CHAT OA_KIND_CHAT

static void parse_ok(enum oa_kind kind, const char *body, struct oa_request *req)
{
    struct oa_error e;
    int rc = oa_parse(kind, body, strlen(body), req, &e);
    if (rc != 0)
        printf("\n  unexpected error for %s: %s\n", body, e.message);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
}

/* Valid UTF-8 (jansson's rules), n bytes. */
static int utf8_ok(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    int ok = j != NULL;
    json_decref(j);
    return ok;
}

/* Request + prompt + output for body. */
struct fixture {
    struct oa_request req;
    struct oa_prompt p;
    struct oa_output o;
};

static void fx_init(struct fixture *f, enum oa_kind kind, const char *body)
{
    struct oa_error e;
    parse_ok(kind, body, &f->req);
    CU_ASSERT_EQUAL_FATAL(oa_prompt_build(&f->req, g_tok, 1, &f->p, &e), 0);
    CU_ASSERT_EQUAL_FATAL(oa_check_context(&f->req, &g_models[0], f->p.n_ids, &e), 0);
    CU_ASSERT_EQUAL_FATAL(oa_output_init(&f->o, &f->req, &f->p, g_tok,
                                         kind == CHAT ? "chatcmpl-test" : "cmpl-test", "tiny",
                                         1700000000),
                          0);
}

static void fx_fini(struct fixture *f)
{
    oa_output_fini(&f->o);
    oa_prompt_fini(&f->p);
    oa_request_fini(&f->req);
}

/* Pushes each byte of s as a token with logprob lp and no alternatives. */
static int push_text(struct oa_output *o, const char *s, float lp)
{
    int rc = 0;
    for (size_t i = 0; s[i] && rc == 0; i++)
        rc = oa_output_token(o, B(s[i]), lp, NULL, 0);
    return rc;
}

/* The "text" or delta "content" of a chunk, appended to acc. */
static void chunk_text(const char *chunk, char *acc, size_t cap)
{
    json_error_t je;
    json_t *j = json_loads(chunk, 0, &je);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *t = json_object_get(c, "text");
    if (t == NULL)
        t = json_object_get(json_object_get(c, "delta"), "content");
    if (t != NULL) {
        CU_ASSERT_TRUE(utf8_ok(json_string_value(t), json_string_length(t)));
        strncat(acc, json_string_value(t), cap - strlen(acc) - 1);
    }
    json_decref(j);
}

/* ------------------------------------------------------------- parsing */

static void test_parse_completion_all_fields(void)
{
    struct oa_request r;
    const char *body =
        "{\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.25,\"top_k\":40,\"seed\":-3,\"stop\":[\"END\",\"\",\"\\n\\n\"],"
        "\"stop_token_ids\":[2,13],\"stream\":true,\"stream_options\":{\"include_usage\":true,"
        "\"continuous_usage_stats\":false},\"logprobs\":3,\"echo\":true,\"user\":\"u-1\","
        "\"n\":1,\"ignore_eos\":true,\"presence_penalty\":0,\"frequency_penalty\":0.0,"
        "\"repetition_penalty\":1,\"best_of\":1,\"logit_bias\":{},\"suffix\":\"\","
        "\"response_format\":{\"type\":\"text\"},\"some_future_field\":[1,2,{\"x\":null}]}";
    parse_ok(CMPL, body, &r);
    CU_ASSERT_EQUAL(r.kind, CMPL);
    CU_ASSERT_STRING_EQUAL(r.model, "tiny");
    CU_ASSERT_STRING_EQUAL(r.prompt_text, "Hello");
    CU_ASSERT_EQUAL(r.prompt_len, 5);
    CU_ASSERT_PTR_NULL(r.prompt_ids);
    CU_ASSERT_EQUAL(r.max_tokens, 7);
    CU_ASSERT_EQUAL(r.temperature, 0.5f);
    CU_ASSERT_EQUAL(r.top_p, 0.25f);
    CU_ASSERT_EQUAL(r.top_k, 40);
    CU_ASSERT_EQUAL(r.has_seed, 1);
    CU_ASSERT_EQUAL(r.seed, (uint64_t)-3);
    CU_ASSERT_EQUAL(r.n_stop, 2); /* the empty stop string is ignored */
    CU_ASSERT_STRING_EQUAL(r.stop[0], "END");
    CU_ASSERT_EQUAL(r.stop_len[0], 3);
    CU_ASSERT_STRING_EQUAL(r.stop[1], "\n\n");
    CU_ASSERT_EQUAL(r.n_stop_ids, 2);
    CU_ASSERT_EQUAL(r.stop_ids[0], 2);
    CU_ASSERT_EQUAL(r.stop_ids[1], 13);
    CU_ASSERT_EQUAL(r.stream, 1);
    CU_ASSERT_EQUAL(r.include_usage, 1);
    CU_ASSERT_EQUAL(r.logprobs, 1);
    CU_ASSERT_EQUAL(r.top_logprobs, 3);
    CU_ASSERT_EQUAL(r.echo, 1);
    CU_ASSERT_STRING_EQUAL(r.user, "u-1");
    CU_ASSERT_EQUAL(r.ignore_eos, 1);
    oa_request_fini(&r);
    CU_ASSERT_PTR_NULL(r.doc);
    oa_request_fini(&r); /* twice is harmless */
}

static void test_parse_defaults(void)
{
    struct oa_request r;
    parse_ok(CMPL, "{\"prompt\":\"x\"}", &r);
    CU_ASSERT_PTR_NULL(r.model);
    CU_ASSERT_EQUAL(r.max_tokens, -1);
    CU_ASSERT_EQUAL(r.temperature, 1.0f);
    CU_ASSERT_EQUAL(r.top_p, 1.0f);
    CU_ASSERT_EQUAL(r.top_k, 0);
    CU_ASSERT_EQUAL(r.has_seed, 0);
    CU_ASSERT_EQUAL(r.n_stop, 0);
    CU_ASSERT_EQUAL(r.n_stop_ids, 0);
    CU_ASSERT_EQUAL(r.stream, 0);
    CU_ASSERT_EQUAL(r.include_usage, 0);
    CU_ASSERT_EQUAL(r.logprobs, 0);
    CU_ASSERT_EQUAL(r.top_logprobs, 0);
    CU_ASSERT_EQUAL(r.echo, 0);
    CU_ASSERT_PTR_NULL(r.user);
    CU_ASSERT_EQUAL(r.ignore_eos, 0);
    oa_request_fini(&r);

    /* Explicit nulls mean "not given". */
    parse_ok(CMPL,
             "{\"model\":null,\"prompt\":\"x\",\"max_tokens\":null,\"temperature\":null,"
             "\"top_p\":null,\"top_k\":null,\"seed\":null,\"stop\":null,\"stop_token_ids\":null,"
             "\"stream\":null,\"stream_options\":null,\"logprobs\":null,\"echo\":null,"
             "\"user\":null,\"n\":null,\"presence_penalty\":null,\"logit_bias\":null}",
             &r);
    CU_ASSERT_PTR_NULL(r.model);
    CU_ASSERT_EQUAL(r.max_tokens, -1);
    CU_ASSERT_EQUAL(r.temperature, 1.0f);
    CU_ASSERT_EQUAL(r.logprobs, 0);
    oa_request_fini(&r);

    /* Edges of every range; integral reals for integers; top_k -1 is off. */
    parse_ok(CMPL,
             "{\"prompt\":\"x\",\"temperature\":0,\"top_p\":1,\"top_k\":-1,\"max_tokens\":1.0,"
             "\"logprobs\":0,\"seed\":9223372036854775807,\"stop\":\"s\"}",
             &r);
    CU_ASSERT_EQUAL(r.temperature, 0.0f);
    CU_ASSERT_EQUAL(r.top_p, 1.0f);
    CU_ASSERT_EQUAL(r.top_k, 0);
    CU_ASSERT_EQUAL(r.max_tokens, 1);
    CU_ASSERT_EQUAL(r.logprobs, 1);
    CU_ASSERT_EQUAL(r.top_logprobs, 0);
    CU_ASSERT_EQUAL(r.seed, (uint64_t)INT64_MAX);
    CU_ASSERT_EQUAL(r.n_stop, 1);
    CU_ASSERT_STRING_EQUAL(r.stop[0], "s");
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\",\"temperature\":2.0,\"top_k\":0,\"stream\":false}", &r);
    CU_ASSERT_EQUAL(r.temperature, 2.0f);
    oa_request_fini(&r);
}

static void test_parse_chat(void)
{
    struct oa_request r;
    const char *body =
        "{\"model\":\"tiny\",\"messages\":["
        "{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"developer\",\"content\":[]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},"
        "{\"type\":\"text\",\"text\":\"there\"}],\"name\":\"bob\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
        "{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":\"42\"}],"
        "\"tool_call_id\":\"c1\"}],"
        "\"max_tokens\":9,\"max_completion_tokens\":5,\"logprobs\":true,\"top_logprobs\":20,"
        "\"echo\":\"ignored for chat\",\"tools\":[],\"add_generation_prompt\":false}";
    parse_ok(CHAT, body, &r);
    CU_ASSERT_EQUAL(r.kind, CHAT);
    CU_ASSERT_EQUAL_FATAL(r.n_messages, 5);
    CU_ASSERT_EQUAL(r.messages[0].role, CHAT_ROLE_SYSTEM);
    CU_ASSERT_NSTRING_EQUAL(r.messages[0].content, "Be brief.", 9);
    CU_ASSERT_EQUAL(r.messages[0].content_len, 9);
    CU_ASSERT_EQUAL(r.messages[1].role, CHAT_ROLE_DEVELOPER);
    CU_ASSERT_EQUAL(r.messages[1].content_len, 0);
    CU_ASSERT_EQUAL(r.messages[2].role, CHAT_ROLE_USER);
    CU_ASSERT_EQUAL(r.messages[2].content_len, 8);
    CU_ASSERT_NSTRING_EQUAL(r.messages[2].content, "Hi\nthere", 8);
    CU_ASSERT_EQUAL(r.messages[3].role, CHAT_ROLE_ASSISTANT);
    CU_ASSERT_EQUAL(r.messages[3].content_len, 0);
    CU_ASSERT_EQUAL(r.messages[4].role, CHAT_ROLE_TOOL);
    CU_ASSERT_NSTRING_EQUAL(r.messages[4].content, "42", 2);
    CU_ASSERT_EQUAL(r.max_tokens, 5); /* max_completion_tokens wins */
    CU_ASSERT_EQUAL(r.logprobs, 1);
    CU_ASSERT_EQUAL(r.top_logprobs, OA_MAX_LOGPROBS); /* 20 capped at 5 */
    CU_ASSERT_EQUAL(r.echo, 0);
    CU_ASSERT_EQUAL(r.add_generation_prompt, 0);
    oa_request_fini(&r);

    parse_ok(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":3}", &r);
    CU_ASSERT_EQUAL(r.max_tokens, 3);
    CU_ASSERT_EQUAL(r.add_generation_prompt, 1);
    CU_ASSERT_EQUAL(r.logprobs, 0);
    oa_request_fini(&r);
    parse_ok(CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
             "\"top_logprobs\":2}",
             &r);
    CU_ASSERT_EQUAL(r.top_logprobs, 2);
    oa_request_fini(&r);
}

static void test_parse_errors_json(void)
{
    EXPECT_ERROR(CMPL, "", 400, NULL, "invalid_json",
                 "We could not parse the JSON body of your request: '[' or '{' expected near end "
                 "of file (line 1, column 0).");
    EXPECT_ERROR(CMPL, "{\"prompt\": \"x\",}", 400, NULL, "invalid_json",
                 "We could not parse the JSON body of your request: string or '}' expected near "
                 "'}' (line 1, column 16).");
    EXPECT_ERROR(CMPL, "{\n  \"prompt\": \"x\"\n  \"n\": 1}", 400, NULL, "invalid_json",
                 "We could not parse the JSON body of your request: '}' expected near '\"n\"' "
                 "(line 3, column 5).");
    EXPECT_ERROR(CMPL, "{\"prompt\": \"x\"} trailing", 400, NULL, "invalid_json",
                 "We could not parse the JSON body of your request: end of file expected near "
                 "'trailing' (line 1, column 24).");
    EXPECT_ERROR(CMPL, "{\"prompt\": \"\\u0000\"}", 400, NULL, "invalid_json",
                 "We could not parse the JSON body of your request: \\u0000 is not allowed "
                 "without JSON_ALLOW_NUL near '\"\\u0000\"' (line 1, column 19).");
    /* Raw invalid UTF-8 in the body: the quoted excerpt is scrubbed. */
    EXPECT_ERROR(CMPL, "{\"prompt\": \"\xff\"}", 400, NULL, "invalid_json",
                 "We could not parse the JSON body of your request: unable to decode byte 0xff "
                 "near '\"' (line 1, column 12).");
    EXPECT_ERROR(CMPL, "[1, 2]", 400, NULL, "invalid_type",
                 "Invalid type for the request body: expected an object, but got an array "
                 "instead.");
}

static void test_parse_errors_values(void)
{
    /* Missing and empty. */
    EXPECT_ERROR(CMPL, "{\"model\":\"tiny\"}", 400, "prompt", "missing_required_parameter",
                 "Missing required parameter: 'prompt'.");
    EXPECT_ERROR(CMPL, "{\"prompt\":null}", 400, "prompt", "missing_required_parameter",
                 "Missing required parameter: 'prompt'.");
    EXPECT_ERROR(CHAT, "{\"model\":\"tiny\"}", 400, "messages", "missing_required_parameter",
                 "Missing required parameter: 'messages'.");
    EXPECT_ERROR(CHAT, "{\"messages\":[]}", 400, "messages", "invalid_value",
                 "Invalid value for 'messages': expected a non-empty array, but got [].");
    EXPECT_ERROR(CMPL, "{\"prompt\":[]}", 400, "prompt", "invalid_value",
                 "Invalid value for 'prompt': expected a string or a non-empty array of token "
                 "ids, but got [].");
    EXPECT_ERROR(CMPL, "{\"prompt\":[[]]}", 400, "prompt[0]", "invalid_value",
                 "Invalid value for 'prompt[0]': expected a non-empty array of token ids, but "
                 "got [].");

    /* n, batches. */
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"n\":2}", 400, "n", "unsupported_value",
                 "n must be 1 (this server generates one choice per request), but got 2.");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}", 400, "n",
                 "unsupported_value",
                 "n must be 1 (this server generates one choice per request), but got 0.");
    EXPECT_ERROR(CMPL, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "unsupported_value",
                 "batched prompts are not supported: 'prompt' must be a string or one array of "
                 "token ids, but got an array of 2 prompts.");
    EXPECT_ERROR(CMPL, "{\"prompt\":[[1],[2],[3]]}", 400, "prompt", "unsupported_value",
                 "batched prompts are not supported: 'prompt' must be a string or one array of "
                 "token ids, but got an array of 3 prompts.");

    /* Ranges. */
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", "invalid_value",
                 "Invalid value for 'max_tokens': expected an integer between 1 and 2147483647, "
                 "but got 0.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"max_tokens\":2147483648}", 400, "max_tokens",
                 "invalid_value",
                 "Invalid value for 'max_tokens': expected an integer between 1 and 2147483647, "
                 "but got 2147483648.");
    EXPECT_ERROR(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                 "\"max_completion_tokens\":-5}",
                 400, "max_completion_tokens", "invalid_value",
                 "Invalid value for 'max_completion_tokens': expected an integer between 1 and "
                 "2147483647, but got -5.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"temperature\":2.5}", 400, "temperature",
                 "invalid_value",
                 "Invalid value for 'temperature': expected a number between 0 and 2, but got "
                 "2.5.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"temperature\":-0.1}", 400, "temperature",
                 "invalid_value",
                 "Invalid value for 'temperature': expected a number between 0 and 2, but got "
                 "-0.1.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p", "invalid_value",
                 "Invalid value for 'top_p': expected a number greater than 0 and at most 1, but "
                 "got 0.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"top_p\":1.01}", 400, "top_p", "invalid_value",
                 "Invalid value for 'top_p': expected a number greater than 0 and at most 1, but "
                 "got 1.01.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"top_k\":-2}", 400, "top_k", "invalid_value",
                 "Invalid value for 'top_k': expected -1 or 0 (off) or an integer >= 1, but got "
                 "-2.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"logprobs\":6}", 400, "logprobs", "invalid_value",
                 "Invalid value for 'logprobs': expected an integer between 0 and 5, but got 6.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"logprobs\":-1}", 400, "logprobs", "invalid_value",
                 "Invalid value for 'logprobs': expected an integer between 0 and 5, but got "
                 "-1.");
    EXPECT_ERROR(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
                 "\"top_logprobs\":21}",
                 400, "top_logprobs", "invalid_value",
                 "Invalid value for 'top_logprobs': expected an integer between 0 and 20, but "
                 "got 21.");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}",
                 400, "top_logprobs", "invalid_value",
                 "Invalid value for 'top_logprobs': it requires 'logprobs' to be true.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400,
                 "stream_options", "invalid_value",
                 "Invalid value for 'stream_options': it is only allowed when 'stream' is true.");
    EXPECT_ERROR(CMPL,
                 "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", 400,
                 "stream_options.include_usage", "invalid_type",
                 "Invalid type for 'stream_options.include_usage': expected a boolean, but got "
                 "an integer instead.");

    /* Stops. */
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop",
                 "invalid_value",
                 "Invalid value for 'stop': expected at most 4 stop sequences, but got 5.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"stop\":[\"a\",3]}", 400, "stop[1]", "invalid_type",
                 "Invalid type for 'stop[1]': expected a string, but got an integer instead.");
    {
        char body[600], long_stop[300];
        memset(long_stop, 'z', 257);
        long_stop[257] = '\0';
        snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"stop\":[\"a\",\"%s\"]}", long_stop);
        EXPECT_ERROR(CMPL, body, 400, "stop[1]", "invalid_value",
                     "Invalid value for 'stop[1]': expected a string of at most 256 bytes, but "
                     "got 257 bytes.");
        long_stop[256] = '\0';
        snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"stop\":\"%s\"}", long_stop);
        struct oa_request r;
        parse_ok(CMPL, body, &r);
        CU_ASSERT_EQUAL(r.stop_len[0], 256);
        oa_request_fini(&r);
    }
    EXPECT_ERROR(CMPL,
                 "{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,"
                 "17]}",
                 400, "stop_token_ids", "invalid_value",
                 "Invalid value for 'stop_token_ids': expected at most 16 token ids, but got 17.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"stop_token_ids\":[1,-1]}", 400, "stop_token_ids[1]",
                 "invalid_value",
                 "Invalid value for 'stop_token_ids[1]': expected a token id between 0 and "
                 "4294967295, but got -1.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"stop_token_ids\":[\"2\"]}", 400, "stop_token_ids[0]",
                 "invalid_type",
                 "Invalid type for 'stop_token_ids[0]': expected an integer token id, but got a "
                 "string instead.");

    /* Unsupported parameters. */
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"presence_penalty\":0.5}", 400, "presence_penalty",
                 "unsupported_value",
                 "Unsupported value for 'presence_penalty': this server supports only 0, but got "
                 "0.5.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"frequency_penalty\":-1}", 400, "frequency_penalty",
                 "unsupported_value",
                 "Unsupported value for 'frequency_penalty': this server supports only 0, but "
                 "got -1.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"repetition_penalty\":1.2}", 400, "repetition_penalty",
                 "unsupported_value",
                 "Unsupported value for 'repetition_penalty': this server supports only 1, but "
                 "got 1.2.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"best_of\":3}", 400, "best_of", "unsupported_value",
                 "Unsupported value for 'best_of': this server supports only 1, but got 3.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"logit_bias\":{\"50256\":-100}}", 400, "logit_bias",
                 "unsupported_value",
                 "Unsupported value for 'logit_bias': this server supports only null or {}, but "
                 "got {\"50256\":-100}.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"suffix\":\"end\"}", 400, "suffix", "unsupported_value",
                 "Unsupported value for 'suffix': this server supports only null or \"\", but got "
                 "\"end\".");
    EXPECT_ERROR(
        CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"get_weather_for_a_very_long_city_name\"}}]}",
        400, "tools", "unsupported_value",
        "Unsupported value for 'tools': this server supports only null or [], but got "
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_w...."); /* cut at 45 B */
    EXPECT_ERROR(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{"
                 "\"type\":\"json_object\"}}",
                 400, "response_format", "unsupported_value",
                 "Unsupported value for 'response_format': this server supports only {\"type\": "
                 "\"text\"}, but got {\"type\":\"json_object\"}.");

    /* Messages. */
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},\"hi\"]}", 400,
                 "messages[1]", "invalid_type",
                 "Invalid type for 'messages[1]': expected an object, but got a string instead.");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role",
                 "missing_required_parameter", "Missing required parameter: 'messages[0].role'.");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", 400,
                 "messages[0].role", "invalid_value",
                 "Invalid value for 'messages[0].role': expected one of 'system', 'developer', "
                 "'user', 'assistant' or 'tool', but got \"bot\".");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"User\",\"content\":\"x\"}]}", 400,
                 "messages[0].role", "invalid_value",
                 "Invalid value for 'messages[0].role': expected one of 'system', 'developer', "
                 "'user', 'assistant' or 'tool', but got \"User\".");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":7,\"content\":\"x\"}]}", 400, "messages[0].role",
                 "invalid_type",
                 "Invalid type for 'messages[0].role': expected a string, but got an integer "
                 "instead.");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content",
                 "missing_required_parameter",
                 "Missing required parameter: 'messages[0].content'.");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":{\"text\":\"x\"}}]}", 400,
                 "messages[0].content", "invalid_type",
                 "Invalid type for 'messages[0].content': expected a string or an array of "
                 "content parts, but got an object instead.");
    EXPECT_ERROR(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                 "\"a\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
                 400, "messages[0].content[1].type", "unsupported_value",
                 "Unsupported value for 'messages[0].content[1].type': this server supports only "
                 "\"text\", but got \"image_url\".");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}", 400,
                 "messages[0].content[0].type", "missing_required_parameter",
                 "Missing required parameter: 'messages[0].content[0].type'.");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
                 400, "messages[0].content[0].text", "missing_required_parameter",
                 "Missing required parameter: 'messages[0].content[0].text'.");
    EXPECT_ERROR(
        CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":5}]}]}",
        400, "messages[0].content[0].text", "invalid_type",
        "Invalid type for 'messages[0].content[0].text': expected a string, but got an "
        "integer instead.");
    EXPECT_ERROR(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[\"a\"]}]}", 400,
                 "messages[0].content[0]", "invalid_type",
                 "Invalid type for 'messages[0].content[0]': expected an object, but got a "
                 "string instead.");

    /* Token-id prompts. */
    EXPECT_ERROR(CMPL, "{\"prompt\":[1,-1]}", 400, "prompt[1]", "invalid_value",
                 "Invalid value for 'prompt[1]': expected a token id between 0 and 4294967295, "
                 "but got -1.");
    EXPECT_ERROR(CMPL, "{\"prompt\":[1,4294967296]}", 400, "prompt[1]", "invalid_value",
                 "Invalid value for 'prompt[1]': expected a token id between 0 and 4294967295, "
                 "but got 4294967296.");
    EXPECT_ERROR(CMPL, "{\"prompt\":[1,\"a\"]}", 400, "prompt[1]", "invalid_type",
                 "Invalid type for 'prompt[1]': expected an integer token id, but got a string "
                 "instead.");
    EXPECT_ERROR(CMPL, "{\"prompt\":[1,2.5]}", 400, "prompt[1]", "invalid_type",
                 "Invalid type for 'prompt[1]': expected an integer token id, but got a number "
                 "instead.");
    EXPECT_ERROR(CMPL, "{\"prompt\":[[1,null]]}", 400, "prompt[0][1]", "invalid_type",
                 "Invalid type for 'prompt[0][1]': expected an integer token id, but got null "
                 "instead.");
    EXPECT_ERROR(CMPL, "{\"prompt\":[{\"a\":1}]}", 400, "prompt[0]", "invalid_type",
                 "Invalid type for 'prompt[0]': expected an integer token id, but got an object "
                 "instead.");

    /* The first problem in field order is the one reported. */
    EXPECT_ERROR(CMPL, "{\"temperature\":9,\"model\":5}", 400, "model", "invalid_type",
                 "Invalid type for 'model': expected a string, but got an integer instead.");
}

/* Every field with every JSON type it does not accept. */
static void test_parse_wrong_types(void)
{
    static const struct {
        const char *text, *kind;
        char letter;
    } values[] = {{"\"x\"", "a string", 's'}, {"1", "an integer", 'i'}, {"1.5", "a number", 'r'},
                  {"true", "a boolean", 'b'}, {"{}", "an object", 'o'}, {"[]", "an array", 'a'}};
    static const struct {
        enum oa_kind kind;
        const char *field, *expected, *accepts; /* letters of the accepted JSON kinds */
    } fields[] = {
        {CMPL, "model", "a string", "s"},
        {CMPL, "prompt", "a string or an array of token ids", "sa"},
        {CMPL, "n", "an integer", "i"},
        {CMPL, "max_tokens", "an integer", "i"},
        {CMPL, "temperature", "a number", "ir"},
        {CMPL, "top_p", "a number", "ir"},
        {CMPL, "top_k", "an integer", "i"},
        {CMPL, "seed", "an integer", "i"},
        {CMPL, "stop", "a string or an array of strings", "sa"},
        {CMPL, "stop_token_ids", "an array of token ids", "a"},
        {CMPL, "ignore_eos", "a boolean", "b"},
        {CMPL, "stream", "a boolean", "b"},
        {CMPL, "stream_options", "an object", "o"},
        {CMPL, "logprobs", "an integer", "i"},
        {CMPL, "echo", "a boolean", "b"},
        {CMPL, "user", "a string", "s"},
        {CMPL, "presence_penalty", "a number", "ir"},
        {CMPL, "frequency_penalty", "a number", "ir"},
        {CMPL, "repetition_penalty", "a number", "ir"},
        {CMPL, "best_of", "a number", "ir"},
        {CHAT, "model", "a string", "s"},
        {CHAT, "messages", "an array", "a"},
        {CHAT, "max_tokens", "an integer", "i"},
        {CHAT, "max_completion_tokens", "an integer", "i"},
        {CHAT, "logprobs", "a boolean", "b"},
        {CHAT, "top_logprobs", "an integer", "i"},
        {CHAT, "add_generation_prompt", "a boolean", "b"},
        {CHAT, "stream", "a boolean", "b"},
        {CHAT, "user", "a string", "s"},
    };
    int checked = 0;
    for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
        for (size_t v = 0; v < sizeof(values) / sizeof(values[0]); v++) {
            if (strchr(fields[f].accepts, values[v].letter))
                continue;
            json_error_t je;
            json_t *doc = json_loads(fields[f].kind == CHAT
                                         ? "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\","
                                           "\"content\":\"x\"}],\"stream\":true}"
                                         : "{\"model\":\"tiny\",\"prompt\":\"x\",\"stream\":true}",
                                     0, &je);
            json_object_set_new(doc, fields[f].field,
                                json_loads(values[v].text, JSON_DECODE_ANY, &je));
            char *body = json_dumps(doc, JSON_COMPACT);
            char msg[256];
            snprintf(msg, sizeof(msg), "Invalid type for '%s': expected %s, but got %s instead.",
                     fields[f].field, fields[f].expected, values[v].kind);
            EXPECT_ERROR(fields[f].kind, body, 400, fields[f].field, "invalid_type", msg);
            free(body);
            json_decref(doc);
            checked++;
        }
    }
    CU_ASSERT_EQUAL(checked, 137);
}

static void test_token_prompts(void)
{
    struct oa_request r;
    struct oa_prompt p;
    struct oa_error e;

    parse_ok(CMPL, "{\"prompt\":[1,107,108.0]}", &r);
    CU_ASSERT_PTR_NULL(r.prompt_text);
    CU_ASSERT_EQUAL_FATAL(r.n_prompt_ids, 3);
    CU_ASSERT_EQUAL(r.prompt_ids[0], 1);
    CU_ASSERT_EQUAL(r.prompt_ids[1], 107);
    CU_ASSERT_EQUAL(r.prompt_ids[2], 108);
    /* Used verbatim: no BOS added; the text is the decoded ids. */
    CU_ASSERT_EQUAL_FATAL(oa_prompt_build(&r, g_tok, 1, &p, &e), 0);
    CU_ASSERT_EQUAL(p.n_ids, 3);
    CU_ASSERT_EQUAL(p.ids[0], 1);
    CU_ASSERT_EQUAL(p.ids[2], 108);
    CU_ASSERT_STRING_EQUAL(p.text, "hi");
    CU_ASSERT_EQUAL(p.text_len, 2);
    oa_prompt_fini(&p);
    oa_request_fini(&r);

    /* One nested list, or one string in a list, is not a batch. */
    parse_ok(CMPL, "{\"prompt\":[[200,201]]}", &r);
    CU_ASSERT_EQUAL(r.n_prompt_ids, 2);
    CU_ASSERT_EQUAL(r.prompt_ids[1], 201);
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":[\"one\"]}", &r);
    CU_ASSERT_STRING_EQUAL(r.prompt_text, "one");
    CU_ASSERT_EQUAL_FATAL(oa_prompt_build(&r, g_tok, 1, &p, &e), 0);
    CU_ASSERT_EQUAL(p.n_ids, 4);
    CU_ASSERT_EQUAL(p.ids[0], TOK_BOS);
    CU_ASSERT_EQUAL(p.ids[1], B('o'));
    CU_ASSERT_EQUAL(p.ids[3], B('e'));
    CU_ASSERT_STRING_EQUAL(p.text, "one");
    oa_prompt_fini(&p);
    CU_ASSERT_EQUAL_FATAL(oa_prompt_build(&r, g_tok, 0, &p, &e), 0);
    CU_ASSERT_EQUAL(p.n_ids, 3);
    oa_prompt_fini(&p);
    oa_request_fini(&r);

    /* Ids outside the tokenizer's vocabulary, then the model's. */
    parse_ok(CMPL, "{\"prompt\":[5,512]}", &r);
    CU_ASSERT_EQUAL(oa_prompt_build(&r, g_tok, 1, &p, &e), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(e.status, 400);
    CU_ASSERT_STRING_EQUAL(e.param, "prompt");
    CU_ASSERT_STRING_EQUAL(e.code, "invalid_value");
    CU_ASSERT_STRING_EQUAL(e.message, "Invalid value for 'prompt[1]': expected a token id below "
                                      "the vocabulary size 512, but got 512.");
    CU_ASSERT_PTR_NULL(p.ids);
    oa_request_fini(&r);
    struct oa_model small = {.id = "s", .max_context = 100, .vocab_size = 300};
    parse_ok(CMPL, "{\"prompt\":[5,300]}", &r);
    CU_ASSERT_EQUAL(oa_check_context(&r, &small, 2, &e), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(e.message, "Invalid value for 'prompt[1]': expected a token id below "
                                      "the vocabulary size 300, but got 300.");
    oa_request_fini(&r);

    /* Invalid UTF-8 from ids becomes U+FFFD in the prompt text. */
    parse_ok(CMPL, "{\"prompt\":[107,258,200]}", &r); /* 'h', 0xFF, 0xC5 */
    CU_ASSERT_EQUAL_FATAL(oa_prompt_build(&r, g_tok, 1, &p, &e), 0);
    CU_ASSERT_STRING_EQUAL(p.text, "h\xEF\xBF\xBD\xEF\xBF\xBD");
    oa_prompt_fini(&p);
    oa_request_fini(&r);
}

static void test_chat_template(void)
{
    struct chat_message m[] = {
        {CHAT_ROLE_SYSTEM, "Be brief.", 9}, {CHAT_ROLE_USER, "Hi", 2},
        {CHAT_ROLE_ASSISTANT, "Hello!", 6}, {CHAT_ROLE_TOOL, "42", 2},
        {CHAT_ROLE_DEVELOPER, "", 0},
    };
    char *s = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(chat_template_render(m, 5, 1, &s, &len), 0);
    const char *want = "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!\n"
                       "<|tool|>\n42\n<|system|>\n\n<|assistant|>\n";
    CU_ASSERT_STRING_EQUAL(s, want);
    CU_ASSERT_EQUAL(len, strlen(want));
    CU_ASSERT_EQUAL(chat_template_length(m, 5, 1), strlen(want));
    free(s);
    CU_ASSERT_EQUAL_FATAL(chat_template_render(m + 1, 1, 0, &s, &len), 0);
    CU_ASSERT_STRING_EQUAL(s, "<|user|>\nHi\n");
    free(s);
    CU_ASSERT_EQUAL_FATAL(chat_template_render(NULL, 0, 1, &s, &len), 0);
    CU_ASSERT_STRING_EQUAL(s, "<|assistant|>\n");
    free(s);
    struct chat_message bad = {(enum chat_role)99, "x", 1};
    CU_ASSERT_EQUAL(chat_template_render(&bad, 1, 1, &s, &len), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(chat_template_render(m, -1, 1, &s, &len), TANDEM_EINVAL);

    enum chat_role role;
    CU_ASSERT_EQUAL(chat_role_parse("developer", &role), 0);
    CU_ASSERT_EQUAL(role, CHAT_ROLE_DEVELOPER);
    CU_ASSERT_EQUAL(chat_role_parse("function", &role), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(chat_role_name(CHAT_ROLE_TOOL), "tool");
    CU_ASSERT_STRING_EQUAL(chat_role_name((enum chat_role)0), "?");

    /* Through the request: rendered, then BOS + one id per byte. */
    struct oa_request r;
    struct oa_prompt p;
    struct oa_error e;
    parse_ok(CHAT,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
             "\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}"
             "]}",
             &r);
    CU_ASSERT_EQUAL_FATAL(oa_prompt_build(&r, g_tok, 1, &p, &e), 0);
    want = "<|system|>\nS\n<|user|>\na\nb\n<|assistant|>\n";
    CU_ASSERT_STRING_EQUAL(p.text, want);
    CU_ASSERT_EQUAL_FATAL(p.n_ids, (int)strlen(want) + 1);
    CU_ASSERT_EQUAL(p.ids[0], TOK_BOS);
    for (size_t i = 0; i < strlen(want); i++)
        CU_ASSERT_EQUAL(p.ids[i + 1], B(want[i]));
    oa_prompt_fini(&p);
    oa_request_fini(&r);
}

static void test_models_and_context(void)
{
    struct oa_request r;
    struct oa_error e;
    parse_ok(CMPL, "{\"model\":\"sim-llama\",\"prompt\":\"x\"}", &r);
    CU_ASSERT_PTR_EQUAL(oa_resolve_model(&r, g_models, 2, &e), &g_models[1]);
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\"}", &r);
    CU_ASSERT_PTR_EQUAL(oa_resolve_model(&r, g_models, 2, &e), &g_models[0]);
    CU_ASSERT_PTR_NULL(oa_resolve_model(&r, g_models, 0, &e));
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"model\":\"gpt-4o\",\"prompt\":\"x\"}", &r);
    CU_ASSERT_PTR_NULL(oa_resolve_model(&r, g_models, 2, &e));
    CU_ASSERT_EQUAL(e.status, 400);
    CU_ASSERT_STRING_EQUAL(e.type, "invalid_request_error");
    CU_ASSERT_STRING_EQUAL(e.param, "model");
    CU_ASSERT_STRING_EQUAL(e.code, "model_not_found");
    CU_ASSERT_STRING_EQUAL(e.message, "The model `gpt-4o` does not exist.");
    char *j = oa_error_json(&e);
    ASSERT_JSON(j, "{\"error\":{\"message\":\"The model `gpt-4o` does not exist.\","
                   "\"type\":\"invalid_request_error\",\"param\":\"model\","
                   "\"code\":\"model_not_found\"}}");
    free(j);
    oa_request_fini(&r);

    /* Context 64 (tiny). Explicit max_tokens: prompt + completion must fit. */
    parse_ok(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":20}", &r);
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 44, &e), 0);
    CU_ASSERT_EQUAL(r.max_tokens, 20);
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 45, &e), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(e.status, 400);
    CU_ASSERT_STRING_EQUAL(e.param, "messages");
    CU_ASSERT_STRING_EQUAL(e.code, "context_length_exceeded");
    CU_ASSERT_STRING_EQUAL(e.message,
                           "This model's maximum context length is 64 tokens. However, you "
                           "requested 65 tokens (45 in the messages, 20 in the completion). "
                           "Please reduce the length of the messages or completion.");
    oa_request_fini(&r);

    /* No max_tokens: chat gets the rest of the context, completions 16 at most. */
    parse_ok(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 60, &e), 0);
    CU_ASSERT_EQUAL(r.max_tokens, 4);
    r.max_tokens = -1;
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 64, &e), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(e.code, "context_length_exceeded");
    CU_ASSERT_STRING_EQUAL(e.message,
                           "This model's maximum context length is 64 tokens. However, your "
                           "request has 64 input tokens. Please reduce the length of the input "
                           "messages.");
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\"}", &r);
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 10, &e), 0);
    CU_ASSERT_EQUAL(r.max_tokens, 16);
    r.max_tokens = -1;
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 55, &e), 0);
    CU_ASSERT_EQUAL(r.max_tokens, 9);
    r.max_tokens = -1;
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 70, &e), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(e.param, "prompt");
    CU_ASSERT_STRING_EQUAL(e.message,
                           "This model's maximum context length is 64 tokens. However, your "
                           "request has 70 input tokens. Please reduce the length of the input "
                           "messages.");
    oa_request_fini(&r);

    /* An empty prompt (a text prompt tokenized without BOS). */
    parse_ok(CMPL, "{\"prompt\":\"\"}", &r);
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 0, &e), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(e.param, "prompt");
    CU_ASSERT_STRING_EQUAL(e.code, "invalid_value");
    CU_ASSERT_STRING_EQUAL(e.message,
                           "Invalid value for 'prompt': the prompt is empty; it must have at "
                           "least one token.");
    oa_request_fini(&r);

    j = oa_models_json(g_models, 2);
    ASSERT_JSON(j, "{\"object\":\"list\",\"data\":["
                   "{\"id\":\"tiny\",\"object\":\"model\",\"created\":1700000000,"
                   "\"owned_by\":\"tandem\",\"root\":\"tiny\",\"max_model_len\":64},"
                   "{\"id\":\"sim-llama\",\"object\":\"model\",\"created\":1700000001,"
                   "\"owned_by\":\"tandem\",\"root\":\"sim-llama\",\"max_model_len\":4096}]}");
    free(j);
    j = oa_models_json(NULL, 0);
    ASSERT_JSON(j, "{\"object\":\"list\",\"data\":[]}");
    free(j);
}

static void test_error_builders(void)
{
    struct oa_error e;
    char *j;
    oa_error_no_endpoint(&e, "decode");
    CU_ASSERT_EQUAL(e.status, 503);
    j = oa_error_json(&e);
    ASSERT_JSON(j, "{\"error\":{\"message\":\"No healthy decode endpoint is available; try again "
                   "later.\",\"type\":\"server_error\",\"param\":null,"
                   "\"code\":\"service_unavailable\"}}");
    free(j);
    oa_error_saturated(&e, 2);
    CU_ASSERT_EQUAL(e.status, 429);
    j = oa_error_json(&e);
    ASSERT_JSON(j, "{\"error\":{\"message\":\"The server is saturated: too many requests are "
                   "pending. Retry after 2 s.\",\"type\":\"rate_limit_error\",\"param\":null,"
                   "\"code\":\"rate_limit_exceeded\"}}");
    free(j);
    oa_error_internal(&e, "worker lost");
    CU_ASSERT_EQUAL(e.status, 500);
    j = oa_error_json(&e);
    ASSERT_JSON(j, "{\"error\":{\"message\":\"Internal server error: worker lost\","
                   "\"type\":\"server_error\",\"param\":null,\"code\":\"internal_error\"}}");
    free(j);
    /* No code: the integer status, as common/http.c. */
    CU_ASSERT_EQUAL(
        oa_error_set(&e, 404, "invalid_request_error", NULL, NULL, "Not found: %s", "/v2"),
        TANDEM_EINVAL);
    j = oa_error_json(&e);
    ASSERT_JSON(j, "{\"error\":{\"message\":\"Not found: /v2\",\"type\":\"invalid_request_error\","
                   "\"param\":null,\"code\":404}}");
    free(j);
    /* A message cut in the middle of a character stays valid UTF-8. */
    char big[OA_ERR_MESSAGE_MAX + 8];
    memset(big, 'a', sizeof(big));
    memcpy(big + OA_ERR_MESSAGE_MAX - 3, "\xE2\x82\xAC\xE2\x82\xAC", 6);
    big[sizeof(big) - 1] = '\0';
    oa_error_set(&e, 400, "invalid_request_error", "p", NULL, "%s", big);
    CU_ASSERT_EQUAL(strlen(e.message), OA_ERR_MESSAGE_MAX - 1);
    CU_ASSERT_TRUE(utf8_ok(e.message, strlen(e.message)));
    CU_ASSERT_STRING_EQUAL(e.message + OA_ERR_MESSAGE_MAX - 4, "a??");
    j = oa_error_json(&e);
    CU_ASSERT_PTR_NOT_NULL(j);
    free(j);
}

/* ----------------------------------------------------------- responses */

static void test_completion_response(void)
{
    struct fixture f;
    char *body = NULL, *usage = NULL;
    fx_init(&f, CMPL, "{\"model\":\"tiny\",\"prompt\":\"ab\",\"max_tokens\":5}");
    CU_ASSERT_EQUAL(f.req.max_tokens, 5);
    CU_ASSERT_EQUAL(push_text(&f.o, "Hi \xC3\xA9", -0.5f), 0); /* "Hi é" */
    CU_ASSERT_EQUAL(oa_output_token(&f.o, TOK_EOS, -0.25f, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &body), TANDEM_EINVAL); /* not streaming */
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_STOP, 3, 1, &body, &usage), 0);
    CU_ASSERT_PTR_NULL(usage);
    ASSERT_JSON(body, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                      "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"Hi \xC3\xA9\","
                      "\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}],"
                      "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":6,\"total_tokens\":9,"
                      "\"prompt_tokens_details\":{\"cached_tokens\":1}}}");
    free(body);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_STOP, 3, 1, &body, &usage), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B('x'), 0, NULL, 0), OA_STOPPED);
    fx_fini(&f);

    /* length; a stop token id is reported as stop_reason. */
    fx_init(&f, CMPL, "{\"prompt\":\"ab\",\"stop_token_ids\":[107]}");
    CU_ASSERT_EQUAL(f.req.max_tokens, 16);
    CU_ASSERT_EQUAL(push_text(&f.o, "oh", 0), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_STOP, 3, 0, &body, NULL), 0);
    ASSERT_JSON(body, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                      "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"oh\","
                      "\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":107}],"
                      "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5,"
                      "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(body);
    fx_fini(&f);
    fx_init(&f, CMPL, "{\"prompt\":\"ab\"}");
    CU_ASSERT_EQUAL(push_text(&f.o, "xyz", 0), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 3, 0, &body, NULL), 0);
    ASSERT_JSON(body, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                      "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"xyz\","
                      "\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],"
                      "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3,\"total_tokens\":6,"
                      "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(body);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, (enum oa_finish)9, 3, 0, &body, NULL), TANDEM_EINVAL);
    fx_fini(&f);
}

static void test_chat_response(void)
{
    struct fixture f;
    char *body = NULL, *usage = NULL;
    fx_init(&f, CHAT, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    CU_ASSERT_EQUAL(oa_output_begin(&f.o, &body), 0); /* not streaming: no role chunk */
    CU_ASSERT_PTR_NULL(body);
    CU_ASSERT_EQUAL(push_text(&f.o, "Sure.", -1.0f), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_ABORT, 21, 16, &body, &usage), 0);
    ASSERT_JSON(body,
                "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion\",\"created\":1700000000,"
                "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                "\"content\":\"Sure.\"},\"logprobs\":null,\"finish_reason\":\"abort\","
                "\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":21,\"completion_tokens\":5,"
                "\"total_tokens\":26,\"prompt_tokens_details\":{\"cached_tokens\":16}}}");
    free(body);
    fx_fini(&f);
}

static void test_chat_stream(void)
{
    struct fixture f;
    char *c = NULL, *usage = NULL;
    fx_init(&f, CHAT,
            "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
            "\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0); /* nothing yet */
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_EQUAL(oa_output_begin(&f.o, &c), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                   "\"finish_reason\":null,\"stop_reason\":null}],\"usage\":null}");
    free(c);
    CU_ASSERT_EQUAL(oa_output_begin(&f.o, &c), 0); /* only once */
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_EQUAL(push_text(&f.o, "Hel", 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"delta\":{\"content\":\"Hel\"},\"logprobs\":null,"
                   "\"finish_reason\":null,\"stop_reason\":null}],\"usage\":null}");
    free(c);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0); /* nothing new */
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_EQUAL(push_text(&f.o, "lo", 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"delta\":{\"content\":\"lo\"},\"logprobs\":null,"
                   "\"finish_reason\":null,\"stop_reason\":null}],\"usage\":null}");
    free(c);
    CU_ASSERT_EQUAL(oa_output_token(&f.o, TOK_EOS, 0, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0); /* EOS has no text */
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_STOP, 12, 0, &c, &usage), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\","
                   "\"stop_reason\":null}],\"usage\":null}");
    ASSERT_JSON(usage, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                       "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[],"
                       "\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":6,"
                       "\"total_tokens\":18,\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(c);
    free(usage);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), TANDEM_EINVAL); /* finished */
    fx_fini(&f);

    /* Without begin and without include_usage: the first delta carries the
     * role; the last carries the remaining text; no usage field or chunk. */
    fx_init(&f, CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"stream\":true,"
            "\"stop\":\"XY\"}");
    CU_ASSERT_EQUAL(push_text(&f.o, "aX", 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"delta\":{\"role\":\"assistant\",\"content\":\"a\"},\"logprobs\":null,"
                   "\"finish_reason\":null,\"stop_reason\":null}]}");
    free(c);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 12, 0, &c, &usage), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"delta\":{\"content\":\"X\"},\"logprobs\":null,"
                   "\"finish_reason\":\"length\",\"stop_reason\":null}]}");
    CU_ASSERT_PTR_NULL(usage);
    free(c);
    fx_fini(&f);
}

static void test_completion_stream(void)
{
    struct fixture f;
    char *c = NULL, *usage = NULL;
    fx_init(&f, CMPL,
            "{\"prompt\":\"ab\",\"stream\":true,\"stream_options\":{\"include_usage\":false},"
            "\"echo\":true}");
    CU_ASSERT_EQUAL(oa_output_begin(&f.o, &c), 0); /* no role chunk for completions */
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_EQUAL(push_text(&f.o, "cd", 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0);
    /* echo: the prompt comes first, in the first chunk. */
    ASSERT_JSON(c, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                   "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"abcd\","
                   "\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}");
    free(c);
    CU_ASSERT_EQUAL(push_text(&f.o, "e", 0), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 3, 0, &c, &usage), 0);
    ASSERT_JSON(c, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                   "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"e\","
                   "\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]}");
    CU_ASSERT_PTR_NULL(usage);
    free(c);
    fx_fini(&f);

    fx_init(&f, CMPL,
            "{\"prompt\":\"ab\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    CU_ASSERT_EQUAL(push_text(&f.o, "z", 0), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 3, 2, &c, &usage), 0);
    ASSERT_JSON(c, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                   "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"z\","
                   "\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],"
                   "\"usage\":null}");
    ASSERT_JSON(usage, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\","
                       "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[],"
                       "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,"
                       "\"total_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":2}}}");
    free(c);
    free(usage);
    fx_fini(&f);
}

/* A token that adds no text still gets a chunk, with empty text (as vLLM, so a
 * client sees every token arrive); EOS and stop ids alone get none, the
 * finish chunk follows them. */
static void test_stream_empty_text(void)
{
    struct fixture f;
    char *c = NULL, *usage = NULL;
    fx_init(&f, CMPL, "{\"prompt\":\"ab\",\"stream\":true,\"stop\":\"xy\",\"stop_token_ids\":[1]}");
    CU_ASSERT_EQUAL(push_text(&f.o, "x", 0), 0); /* held back: maybe "xy" */
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0);
    ASSERT_JSON(c, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                   "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"\","
                   "\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}");
    free(c);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0); /* nothing new */
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_EQUAL(oa_output_token(&f.o, 1, 0, NULL, 0), 0); /* a stop id */
    CU_ASSERT_EQUAL(oa_output_token(&f.o, TOK_EOS, 0, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_STOP, 3, 0, &c, &usage), 0);
    ASSERT_JSON(c, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                   "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"x\","
                   "\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}]}");
    free(c);
    fx_fini(&f);
}

static void test_completion_logprobs(void)
{
    struct fixture f;
    char *body = NULL;
    fx_init(&f, CMPL, "{\"prompt\":\"ab\",\"logprobs\":2}");
    struct sampler_top top1[] = {{B('h'), -0.5f}, {B('x'), -1.25f}};
    struct sampler_top top2[] = {{B('j'), -0.75f}, {B('i'), -1.5f}, {B('k'), -3.0f}};
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B('h'), -0.5f, top1, 2), 0);
    /* The sampled token is not among the alternatives: 3 entries; the third
     * alternative is beyond logprobs = 2 and dropped. -inf becomes -9999. */
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B('i'), -1.5f, top2, 3), 0);
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B(0xC3), -INFINITY, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B(0xA9), -2.0f, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 3, 0, &body, NULL), 0);
    ASSERT_JSON(body,
                "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"hi\xC3\xA9\","
                "\"logprobs\":{\"tokens\":[\"h\",\"i\",\"\xEF\xBF\xBD\",\"\xEF\xBF\xBD\"],"
                "\"token_logprobs\":[-0.5,-1.5,-9999.0,-2.0],"
                "\"top_logprobs\":[{\"h\":-0.5,\"x\":-1.25},{\"i\":-1.5,\"j\":-0.75},"
                "{\"\xEF\xBF\xBD\":-9999.0},{\"\xEF\xBF\xBD\":-2.0}],"
                "\"text_offset\":[0,1,2,3]},\"finish_reason\":\"length\",\"stop_reason\":null}],"
                "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7,"
                "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(body);
    fx_fini(&f);

    /* logprobs 0: the sampled token's logprob only. Values keep float precision. */
    fx_init(&f, CMPL, "{\"prompt\":\"ab\",\"logprobs\":0,\"stream\":true}");
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B('q'), -0.1f, top1, 2), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &body), 0);
    json_error_t je;
    json_t *j = json_loads(body, 0, &je);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    CU_ASSERT_EQUAL(
        (float)json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 0)), -0.1f);
    CU_ASSERT_EQUAL(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)), 1);
    json_decref(j);
    free(body);
    /* text_offset continues across chunks. */
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B('r'), -0.5f, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &body), 0);
    ASSERT_JSON(body, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\","
                      "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                      "\"text\":\"r\",\"logprobs\":{\"tokens\":[\"r\"],\"token_logprobs\":[-0.5],"
                      "\"top_logprobs\":[{\"r\":-0.5}],\"text_offset\":[1]},"
                      "\"finish_reason\":null,\"stop_reason\":null}]}");
    free(body);
    fx_fini(&f);
}

static void test_chat_logprobs(void)
{
    struct fixture f;
    char *c = NULL, *usage = NULL;
    fx_init(&f, CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"logprobs\":true,"
            "\"top_logprobs\":1,\"stream\":true}");
    CU_ASSERT_EQUAL(oa_output_begin(&f.o, &c), 0);
    free(c);
    struct sampler_top top[] = {{B('O'), -0.25f}, {B('o'), -2.0f}};
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B('O'), -0.25f, top, 2), 0);
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B(0xC3), -0.5f, NULL, 0), 0);
    /* The held-back half character: logprobs are sent, text waits. */
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"delta\":{\"content\":\"O\"},\"logprobs\":{\"content\":["
                   "{\"token\":\"O\",\"logprob\":-0.25,\"bytes\":[79],\"top_logprobs\":["
                   "{\"token\":\"O\",\"logprob\":-0.25,\"bytes\":[79]}]},"
                   "{\"token\":\"\xEF\xBF\xBD\",\"logprob\":-0.5,\"bytes\":[195],"
                   "\"top_logprobs\":[]}]},"
                   "\"finish_reason\":null,\"stop_reason\":null}]}");
    free(c);
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B(0xA9), -1.0f, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 5, 0, &c, &usage), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion.chunk\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"delta\":{\"content\":\"\xC3\xA9\"},\"logprobs\":{\"content\":["
                   "{\"token\":\"\xEF\xBF\xBD\",\"logprob\":-1.0,\"bytes\":[169],"
                   "\"top_logprobs\":[]}]},"
                   "\"finish_reason\":\"length\",\"stop_reason\":null}]}");
    free(c);
    fx_fini(&f);

    /* Non-streaming chat with logprobs. */
    fx_init(&f, CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"logprobs\":true}");
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B('A'), -0.125f, top, 2), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 5, 0, &c, NULL), 0);
    ASSERT_JSON(c, "{\"id\":\"chatcmpl-test\",\"object\":\"chat.completion\","
                   "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                   "\"message\":{\"role\":\"assistant\",\"content\":\"A\"},"
                   "\"logprobs\":{\"content\":[{\"token\":\"A\",\"logprob\":-0.125,"
                   "\"bytes\":[65],\"top_logprobs\":[]}]},"
                   "\"finish_reason\":\"length\",\"stop_reason\":null}],"
                   "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(c);
    fx_fini(&f);
}

static void test_echo(void)
{
    struct fixture f;
    char *body = NULL;
    /* echo without logprobs. */
    fx_init(&f, CMPL, "{\"prompt\":\"ab\",\"echo\":true}");
    CU_ASSERT_EQUAL(push_text(&f.o, "c", 0), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 3, 0, &body, NULL), 0);
    ASSERT_JSON(body, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                      "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"abc\","
                      "\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],"
                      "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4,"
                      "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(body);
    fx_fini(&f);

    /* echo with logprobs: the prompt's tokens first (BOS, a, b), the first
     * with null logprobs; a position the worker did not report is null too. */
    fx_init(&f, CMPL, "{\"prompt\":\"ab\",\"echo\":true,\"logprobs\":1}");
    float plp[] = {-1.0f, -2.0f};
    struct sampler_top ptop[] = {{B('a'), -1.0f}, {B('c'), -0.75f}};
    CU_ASSERT_EQUAL(oa_output_prompt_logprobs(&f.o, 0, 1, plp, ptop, 1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(oa_output_prompt_logprobs(&f.o, 2, 2, plp, ptop, 1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(oa_output_prompt_logprobs(&f.o, 1, 2, plp, ptop, 1), 0);
    struct sampler_top gtop[] = {{B('c'), -0.5f}};
    CU_ASSERT_EQUAL(oa_output_token(&f.o, B('c'), -0.5f, gtop, 1), 0);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 3, 0, &body, NULL), 0);
    ASSERT_JSON(body,
                "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"abc\","
                "\"logprobs\":{\"tokens\":[\"\",\"a\",\"b\",\"c\"],"
                "\"token_logprobs\":[null,-1.0,-2.0,-0.5],"
                "\"top_logprobs\":[null,{\"a\":-1.0},{\"b\":-2.0,\"c\":-0.75},{\"c\":-0.5}],"
                "\"text_offset\":[0,0,1,2]},\"finish_reason\":\"length\",\"stop_reason\":null}],"
                "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4,"
                "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(body);
    fx_fini(&f);

    fx_init(&f, CMPL, "{\"prompt\":\"ab\",\"echo\":true,\"logprobs\":0,\"stream\":true}");
    CU_ASSERT_EQUAL(oa_output_prompt_logprobs(&f.o, 2, 1, plp + 1, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &body), 0);
    ASSERT_JSON(body, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\","
                      "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                      "\"text\":\"ab\",\"logprobs\":{\"tokens\":[\"\",\"a\",\"b\"],"
                      "\"token_logprobs\":[null,null,-2.0],\"top_logprobs\":[null,null,"
                      "{\"b\":-2.0}],\"text_offset\":[0,0,1]},"
                      "\"finish_reason\":null,\"stop_reason\":null}]}");
    free(body);
    /* After the prompt was sent, late prompt logprobs are ignored. */
    CU_ASSERT_EQUAL(oa_output_prompt_logprobs(&f.o, 1, 1, plp, NULL, 0), 0);
    CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &body), 0);
    CU_ASSERT_PTR_NULL(body);
    fx_fini(&f);

    /* echo of a token-id prompt: the decoded text. */
    fx_init(&f, CMPL, "{\"prompt\":[1,107,108],\"echo\":true}");
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 3, 0, &body, NULL), 0);
    ASSERT_JSON(body, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                      "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"hi\","
                      "\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],"
                      "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":0,\"total_tokens\":3,"
                      "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(body);
    fx_fini(&f);
}

/* ---------------------------------------------------- stop strings, UTF-8 */

/* Streams s byte by byte (one byte-level token each) and collects chunk
 * texts: each must be valid UTF-8; returns the concatenation in acc. */
static void stream_collect(struct oa_output *o, const char *s, size_t n, char *acc, size_t cap,
                           int *stopped_at)
{
    *stopped_at = -1;
    for (size_t i = 0; i < n; i++) {
        int rc = oa_output_token(o, B(s[i]), 0, NULL, 0);
        char *c = NULL;
        CU_ASSERT_EQUAL(oa_output_chunk(o, &c), 0);
        if (c) {
            chunk_text(c, acc, cap);
            free(c);
        }
        if (rc == OA_STOPPED) {
            if (*stopped_at < 0)
                *stopped_at = (int)i;
        } else {
            CU_ASSERT_EQUAL(rc, 0);
        }
    }
}

static void test_stop_strings(void)
{
    struct fixture f;
    char acc[256] = "", *c = NULL, *usage = NULL;
    int at;

    /* "END" over three tokens: text before it is sent, nothing from it on,
     * and tokens after the stop are ignored. */
    fx_init(&f, CMPL, "{\"prompt\":\"p\",\"stream\":true,\"stop\":[\"END\",\"zz\"]}");
    stream_collect(&f.o, "abcENDxyz", 9, acc, sizeof(acc), &at);
    CU_ASSERT_EQUAL(at, 5); /* the 'D' */
    CU_ASSERT_STRING_EQUAL(acc, "abc");
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 2, 0, &c, &usage), 0);
    ASSERT_JSON(c, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                   "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"\","
                   "\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":\"END\"}]}");
    free(c);
    fx_fini(&f);

    /* A partial match that fails is released in full; held text is sent at
     * the end when no stop completes. */
    fx_init(&f, CMPL, "{\"prompt\":\"p\",\"stream\":true,\"stop\":\"END\"}");
    acc[0] = '\0';
    stream_collect(&f.o, "aENxEN", 6, acc, sizeof(acc), &at);
    CU_ASSERT_EQUAL(at, -1);
    CU_ASSERT_STRING_EQUAL(acc, "aENx"); /* "EN" is held back */
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 2, 0, &c, &usage), 0);
    chunk_text(c, acc, sizeof(acc));
    CU_ASSERT_STRING_EQUAL(acc, "aENxEN");
    free(c);
    fx_fini(&f);

    /* Non-streaming: the text is cut, completion_tokens counts the tokens up
     * to the one that completed the stop, finish_reason is "stop". */
    fx_init(&f, CMPL, "{\"prompt\":\"p\",\"stop\":[\"lo w\"]}");
    CU_ASSERT_EQUAL(push_text(&f.o, "hello world", 0), OA_STOPPED);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 2, 0, &c, NULL), 0);
    ASSERT_JSON(c, "{\"id\":\"cmpl-test\",\"object\":\"text_completion\",\"created\":1700000000,"
                   "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"hel\","
                   "\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":\"lo w\"}],"
                   "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":7,\"total_tokens\":9,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(c);
    fx_fini(&f);

    /* Multi-byte stop string split inside a character and over tokens. */
    fx_init(&f, CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"stream\":true,"
            "\"stop\":\"\xE2\x82\xAC!\"}");
    acc[0] = '\0';
    const char *s = "1\xE2\x82\xAC"
                    "2\xE2\x82\xAC!3";
    stream_collect(&f.o, s, strlen(s), acc, sizeof(acc), &at);
    CU_ASSERT_EQUAL(at, 8);
    CU_ASSERT_STRING_EQUAL(acc, "1\xE2\x82\xAC"
                                "2");
    fx_fini(&f);
}

/* A llama2.c-style vocabulary with multi-byte pieces: ids 0..2 specials,
 * 3..258 byte tokens "<0xXX>", then extra pieces. */
static struct tokenizer *make_piece_tokenizer(const char *const *extra, int n_extra)
{
    size_t cap = 64 + (size_t)(259 + n_extra) * 32, len = 0;
    unsigned char *buf = calloc(1, cap);
    int32_t maxlen = 16;
    memcpy(buf, &maxlen, 4);
    len = 4;
    for (int i = 0; i < 259 + n_extra; i++) {
        char piece[32];
        if (i == 0)
            strcpy(piece, "<unk>");
        else if (i == 1)
            strcpy(piece, "<s>");
        else if (i == 2)
            strcpy(piece, "</s>");
        else if (i < 259)
            snprintf(piece, sizeof(piece), "<0x%02X>", i - 3);
        else
            snprintf(piece, sizeof(piece), "%s", extra[i - 259]);
        float score = (float)i;
        int32_t pl = (int32_t)strlen(piece);
        memcpy(buf + len, &score, 4);
        memcpy(buf + len + 4, &pl, 4);
        memcpy(buf + len + 8, piece, (size_t)pl);
        len += 8 + (size_t)pl;
    }
    struct tokenizer *t = NULL;
    CU_ASSERT_EQUAL(tok_load_mem(&t, buf, len, 259 + n_extra, "test"), 0);
    free(buf);
    return t;
}

static void test_textdec_pieces(void)
{
    static const char *const extra[] = {"xS", "TOPy", "ST", "O", "P", "\xC3", " "};
    struct tokenizer *t = make_piece_tokenizer(extra, 7);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    const char *stops[] = {"STOP"};
    size_t lens[] = {4};
    struct oa_textdec d;
    char out[OA_TEXTDEC_OUT_MAX];
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 0, out, 10), TANDEM_ETOOBIG);

    /* Split over 2 tokens, with text before and after inside those tokens. */
    CU_ASSERT_EQUAL_FATAL(oa_textdec_init(&d, t, TOK_NO_PREV, stops, lens, 1), 0);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 259, out, sizeof(out)), 1); /* "xS": "x", "S" held */
    CU_ASSERT_EQUAL(memcmp(out, "x", 1), 0);
    CU_ASSERT_EQUAL(d.n_held, 1);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 260, out, sizeof(out)), 0); /* "TOPy" */
    CU_ASSERT_EQUAL(d.stopped, 1);
    CU_ASSERT_EQUAL(d.stop_index, 0);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 259, out, sizeof(out)), 0);
    CU_ASSERT_EQUAL(oa_textdec_flush(&d, out, sizeof(out)), 0);

    /* Split over 3 tokens: "ST" "O" "P". */
    CU_ASSERT_EQUAL_FATAL(oa_textdec_init(&d, t, TOK_NO_PREV, stops, lens, 1), 0);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, B('a'), out, sizeof(out)), 1);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 261, out, sizeof(out)), 0);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 262, out, sizeof(out)), 0);
    CU_ASSERT_EQUAL(d.n_held, 3);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 263, out, sizeof(out)), 0);
    CU_ASSERT_EQUAL(d.stopped, 1);

    /* "STO" then not "P": the held text is released. */
    CU_ASSERT_EQUAL_FATAL(oa_textdec_init(&d, t, TOK_NO_PREV, stops, lens, 1), 0);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 261, out, sizeof(out)), 0);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 262, out, sizeof(out)), 0);
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 261, out, sizeof(out)), 3); /* "STOST": "STO", "ST" held */
    CU_ASSERT_EQUAL(memcmp(out, "STO", 3), 0);
    /* A lone lead byte piece, then the end: U+FFFD, and "ST" released. */
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 264, out, sizeof(out)), 0);
    int n = oa_textdec_flush(&d, out, sizeof(out));
    CU_ASSERT_EQUAL(n, 5);
    CU_ASSERT_EQUAL(memcmp(out, "ST\xEF\xBF\xBD", 5), 0);
    CU_ASSERT_EQUAL(d.stopped, 0);

    /* Out of the vocabulary: an error, state unchanged. */
    CU_ASSERT_EQUAL(oa_textdec_push(&d, 266, out, sizeof(out)), TANDEM_ERANGE);

    /* Bad arguments. */
    size_t zero[] = {0};
    CU_ASSERT_EQUAL(oa_textdec_init(&d, t, TOK_NO_PREV, stops, zero, 1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(oa_textdec_init(&d, t, TOK_NO_PREV, stops, lens, 5), TANDEM_EINVAL);
    tok_destroy(t);
}

static void test_utf8_across_tokens(void)
{
    struct fixture f;
    char acc[256] = "", *c = NULL, *usage = NULL;
    int at;
    /* 2-, 3- and 4-byte characters, one byte per token: every chunk valid. */
    const char *s = "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80!";
    fx_init(&f, CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"stream\":true}");
    int chunks = 0, with_text = 0;
    for (size_t i = 0; s[i]; i++) {
        CU_ASSERT_EQUAL(oa_output_token(&f.o, B(s[i]), 0, NULL, 0), 0);
        CU_ASSERT_EQUAL(oa_output_chunk(&f.o, &c), 0);
        if (c) {
            size_t before = strlen(acc);
            chunk_text(c, acc, sizeof(acc));
            free(c);
            chunks++;
            with_text += strlen(acc) > before;
        }
    }
    CU_ASSERT_EQUAL(chunks, (int)strlen(s)); /* one per token, as vLLM */
    CU_ASSERT_EQUAL(with_text, 10);          /* text once per whole character */
    CU_ASSERT_STRING_EQUAL(acc, s);
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 2, 0, &c, &usage), 0);
    free(c);
    fx_fini(&f);

    /* Invalid bytes and a truncated character at the end become U+FFFD. */
    fx_init(&f, CMPL, "{\"prompt\":\"p\",\"stream\":true}");
    acc[0] = '\0';
    stream_collect(&f.o,
                   "a\xFF"
                   "b\xE2\x82",
                   5, acc, sizeof(acc), &at);
    CU_ASSERT_STRING_EQUAL(acc, "a\xEF\xBF\xBD"
                                "b");
    CU_ASSERT_EQUAL(oa_output_finish(&f.o, OA_FINISH_LENGTH, 2, 0, &c, &usage), 0);
    chunk_text(c, acc, sizeof(acc));
    CU_ASSERT_STRING_EQUAL(acc, "a\xEF\xBF\xBD"
                                "b\xEF\xBF\xBD");
    free(c);
    fx_fini(&f);
}

/* ---------------------------------------------------------- randomised */

static uint64_t rnd_state;

static uint32_t rnd(uint32_t n)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return (uint32_t)(rnd_state % n);
}

/* Naive model: text grows one character at a time; the first prefix that
 * contains a stop string ends it, cut at the earliest such occurrence. */
static size_t naive_stop(const char *text, size_t n, const char *const *stops, int n_stop,
                         int *found)
{
    *found = 0;
    for (size_t end = 1; end <= n; end++) {
        if (end < n && ((unsigned char)text[end] & 0xC0) == 0x80)
            continue; /* not a character boundary */
        size_t best = SIZE_MAX;
        for (int k = 0; k < n_stop; k++) {
            size_t m = strlen(stops[k]);
            for (size_t i = 0; i + m <= end; i++) {
                if (memcmp(text + i, stops[k], m) == 0) {
                    if (i < best)
                        best = i;
                    break;
                }
            }
        }
        if (best != SIZE_MAX) {
            *found = 1;
            return best;
        }
    }
    return n;
}

static void test_stop_random(void)
{
    static const char *const alphabet[] = {
        "a", "b", " ", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};
    const char *env = getenv("OA_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    printf("\n  OA_SEED=%" PRIu64 " (set it to replay)\n", seed);
    rnd_state = seed | 1;
    int failures = 0;
    for (int iter = 0; iter < 20000 && failures < 5; iter++) {
        char text[256] = "", stopbuf[OA_MAX_STOP][32];
        const char *stops[OA_MAX_STOP];
        size_t lens[OA_MAX_STOP];
        int n_stop = (int)rnd(OA_MAX_STOP + 1);
        for (int k = 0; k < n_stop; k++) {
            stopbuf[k][0] = '\0';
            int chars = 1 + (int)rnd(4);
            for (int j = 0; j < chars; j++)
                strcat(stopbuf[k], alphabet[rnd(6)]);
            stops[k] = stopbuf[k];
            lens[k] = strlen(stopbuf[k]);
        }
        int chars = (int)rnd(40);
        for (int j = 0; j < chars; j++)
            strcat(text, alphabet[rnd(6)]);
        size_t n = strlen(text);

        struct oa_textdec d;
        char out[OA_TEXTDEC_OUT_MAX], got[512];
        size_t got_len = 0;
        CU_ASSERT_EQUAL_FATAL(oa_textdec_init(&d, g_tok, TOK_BOS, stops, lens, n_stop), 0);
        for (size_t i = 0; i < n; i++) {
            int w = oa_textdec_push(&d, B(text[i]), out, sizeof(out));
            CU_ASSERT_TRUE_FATAL(w >= 0);
            if (!utf8_ok(out, (size_t)w))
                failures++;
            memcpy(got + got_len, out, (size_t)w);
            got_len += (size_t)w;
        }
        int w = oa_textdec_flush(&d, out, sizeof(out));
        CU_ASSERT_TRUE_FATAL(w >= 0);
        memcpy(got + got_len, out, (size_t)w);
        got_len += (size_t)w;

        int found;
        size_t want = naive_stop(text, n, stops, n_stop, &found);
        if (got_len != want || memcmp(got, text, want) != 0 || d.stopped != found) {
            if (failures++ < 5)
                printf("  mismatch: text '%s' stops %d: got %zu bytes, want %zu (found %d/%d)\n",
                       text, n_stop, got_len, want, d.stopped, found);
        }
    }
    CU_ASSERT_EQUAL(failures, 0);
}

/* ------------------------------------------- documented input limits
 * One test per limit of docs/api.md ("Accepted values") and docs/reliability.md
 * ("Limits"): the value at the limit is accepted, one past it refused with the
 * documented status, code, param and message. */

/* {"prompt":"x","nest":[[...]]} nested depth levels deep in all (the body
 * object is level 1). New string. */
static char *nested_body(int depth)
{
    size_t cap = 2 * (size_t)depth + 64;
    char *s = malloc(cap);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    size_t n = (size_t)sprintf(s, "{\"prompt\":\"x\",\"nest\":");
    for (int i = 0; i < depth - 1; i++)
        s[n++] = '[';
    for (int i = 0; i < depth - 1; i++)
        s[n++] = ']';
    s[n++] = '}';
    s[n] = '\0';
    return s;
}

static void test_limit_json_depth(void)
{
    struct oa_request r;
    char *body = nested_body(2048); /* jansson's JSON_PARSER_MAX_DEPTH */
    parse_ok(CMPL, body, &r);
    oa_request_fini(&r);
    free(body);
    body = nested_body(2049);
    char msg[256];
    /* The 2048th '[' (level 2049) is at column 21 + 2048. */
    snprintf(msg, sizeof(msg),
             "We could not parse the JSON body of your request: maximum parsing depth reached "
             "near '[' (line 1, column %d).",
             21 + 2048);
    EXPECT_ERROR(CMPL, body, 400, NULL, "invalid_json", msg);
    free(body);
}

static void test_limit_stop_count(void)
{
    struct oa_request r;
    parse_ok(CMPL, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\"]}", &r);
    CU_ASSERT_EQUAL(r.n_stop, OA_MAX_STOP);
    oa_request_fini(&r);
    /* Empty strings are ignored, not counted. */
    parse_ok(CMPL, "{\"prompt\":\"x\",\"stop\":[\"\",\"a\"]}", &r);
    CU_ASSERT_EQUAL(r.n_stop, 1);
    oa_request_fini(&r);
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop",
                 "invalid_value",
                 "Invalid value for 'stop': expected at most 4 stop sequences, but got 5.");
}

static void test_limit_stop_bytes(void)
{
    char body[700], stop[300];
    memset(stop, 'z', 256);
    stop[256] = '\0';
    snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"stop\":[\"a\",\"%s\"]}", stop);
    struct oa_request r;
    parse_ok(CMPL, body, &r);
    CU_ASSERT_EQUAL(r.n_stop, 2);
    CU_ASSERT_EQUAL(r.stop_len[1], OA_MAX_STOP_BYTES);
    oa_request_fini(&r);
    /* Bytes, not characters: 128 two-byte characters are at the limit. */
    char *p = stop;
    for (int i = 0; i < 128; i++) {
        memcpy(p, "\xc3\xa9", 2);
        p += 2;
    }
    *p = '\0';
    snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"stop\":\"%s\"}", stop);
    parse_ok(CMPL, body, &r);
    CU_ASSERT_EQUAL(r.stop_len[0], 256);
    oa_request_fini(&r);
    memset(stop, 'z', 257);
    stop[257] = '\0';
    snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"stop\":[\"a\",\"%s\"]}", stop);
    EXPECT_ERROR(CMPL, body, 400, "stop[1]", "invalid_value",
                 "Invalid value for 'stop[1]': expected a string of at most 256 bytes, but got "
                 "257 bytes.");
}

static void test_limit_stop_token_ids(void)
{
    struct oa_request r;
    parse_ok(CMPL,
             "{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,"
             "4294967295]}",
             &r);
    CU_ASSERT_EQUAL(r.n_stop_ids, OA_MAX_STOP_IDS);
    CU_ASSERT_EQUAL(r.stop_ids[15], 4294967295u);
    oa_request_fini(&r);
    EXPECT_ERROR(CMPL,
                 "{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,"
                 "17]}",
                 400, "stop_token_ids", "invalid_value",
                 "Invalid value for 'stop_token_ids': expected at most 16 token ids, but got 17.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"stop_token_ids\":[4294967296]}", 400,
                 "stop_token_ids[0]", "invalid_value",
                 "Invalid value for 'stop_token_ids[0]': expected a token id between 0 and "
                 "4294967295, but got 4294967296.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"stop_token_ids\":[-1]}", 400, "stop_token_ids[0]",
                 "invalid_value",
                 "Invalid value for 'stop_token_ids[0]': expected a token id between 0 and "
                 "4294967295, but got -1.");
}

static void test_limit_logprobs(void)
{
    struct oa_request r;
    parse_ok(CMPL, "{\"prompt\":\"x\",\"logprobs\":5}", &r);
    CU_ASSERT_EQUAL(r.logprobs, 1);
    CU_ASSERT_EQUAL(r.top_logprobs, OA_MAX_LOGPROBS);
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\",\"logprobs\":0}", &r);
    CU_ASSERT_EQUAL(r.logprobs, 1);
    CU_ASSERT_EQUAL(r.top_logprobs, 0);
    oa_request_fini(&r);
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"logprobs\":6}", 400, "logprobs", "invalid_value",
                 "Invalid value for 'logprobs': expected an integer between 0 and 5, but got 6.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"logprobs\":-1}", 400, "logprobs", "invalid_value",
                 "Invalid value for 'logprobs': expected an integer between 0 and 5, but got -1.");
}

static void test_limit_chat_top_logprobs(void)
{
    struct oa_request r;
    /* Accepted up to 20, served as 5 (what the workers report). */
    parse_ok(CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
             "\"top_logprobs\":20}",
             &r);
    CU_ASSERT_EQUAL(r.logprobs, 1);
    CU_ASSERT_EQUAL(r.top_logprobs, OA_MAX_LOGPROBS);
    oa_request_fini(&r);
    parse_ok(CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
             "\"top_logprobs\":0}",
             &r);
    CU_ASSERT_EQUAL(r.top_logprobs, 0);
    oa_request_fini(&r);
    EXPECT_ERROR(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
                 "\"top_logprobs\":21}",
                 400, "top_logprobs", "invalid_value",
                 "Invalid value for 'top_logprobs': expected an integer between 0 and 20, but "
                 "got 21.");
    EXPECT_ERROR(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
                 "\"top_logprobs\":-1}",
                 400, "top_logprobs", "invalid_value",
                 "Invalid value for 'top_logprobs': expected an integer between 0 and 20, but "
                 "got -1.");
}

static void test_limit_max_tokens(void)
{
    struct oa_request r;
    parse_ok(CMPL, "{\"prompt\":\"x\",\"max_tokens\":1}", &r);
    CU_ASSERT_EQUAL(r.max_tokens, 1);
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\",\"max_tokens\":2147483647}", &r);
    CU_ASSERT_EQUAL(r.max_tokens, 2147483647);
    oa_request_fini(&r);
    parse_ok(CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"max_completion_tokens\":2147483647}",
             &r);
    CU_ASSERT_EQUAL(r.max_tokens, 2147483647);
    oa_request_fini(&r);
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", "invalid_value",
                 "Invalid value for 'max_tokens': expected an integer between 1 and 2147483647, "
                 "but got 0.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"max_tokens\":2147483648}", 400, "max_tokens",
                 "invalid_value",
                 "Invalid value for 'max_tokens': expected an integer between 1 and 2147483647, "
                 "but got 2147483648.");
    EXPECT_ERROR(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                 "\"max_completion_tokens\":2147483648}",
                 400, "max_completion_tokens", "invalid_value",
                 "Invalid value for 'max_completion_tokens': expected an integer between 1 and "
                 "2147483647, but got 2147483648.");
}

static void test_limit_n_and_best_of(void)
{
    struct oa_request r;
    parse_ok(CMPL, "{\"prompt\":\"x\",\"n\":1,\"best_of\":1}", &r);
    oa_request_fini(&r);
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"n\":2}", 400, "n", "unsupported_value",
                 "n must be 1 (this server generates one choice per request), but got 2.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"best_of\":2}", 400, "best_of", "unsupported_value",
                 "Unsupported value for 'best_of': this server supports only 1, but got 2.");
}

static void test_limit_prompt_and_message_count(void)
{
    struct oa_request r;
    /* One prompt, in each of its accepted forms. */
    parse_ok(CMPL, "{\"prompt\":[\"one\"]}", &r);
    CU_ASSERT_EQUAL(r.prompt_len, 3);
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":[[5,6]]}", &r);
    CU_ASSERT_EQUAL(r.n_prompt_ids, 2);
    oa_request_fini(&r);
    EXPECT_ERROR(CMPL, "{\"prompt\":[[5],[6]]}", 400, "prompt", "unsupported_value",
                 "batched prompts are not supported: 'prompt' must be a string or one array of "
                 "token ids, but got an array of 2 prompts.");
    /* Messages: at least one (no upper bound is documented). */
    parse_ok(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    CU_ASSERT_EQUAL(r.n_messages, 1);
    oa_request_fini(&r);
    EXPECT_ERROR(CHAT, "{\"messages\":[]}", 400, "messages", "invalid_value",
                 "Invalid value for 'messages': expected a non-empty array, but got [].");
}

static void test_limit_sampling_ranges(void)
{
    struct oa_request r;
    parse_ok(CMPL, "{\"prompt\":\"x\",\"temperature\":2,\"top_p\":1,\"top_k\":-1}", &r);
    CU_ASSERT_EQUAL(r.temperature, 2.0f);
    CU_ASSERT_EQUAL(r.top_p, 1.0f);
    CU_ASSERT_EQUAL(r.top_k, 0);
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\",\"temperature\":0,\"top_p\":0.001,\"top_k\":1}", &r);
    CU_ASSERT_EQUAL(r.temperature, 0.0f);
    CU_ASSERT_EQUAL(r.top_k, 1);
    oa_request_fini(&r);
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"temperature\":2.01}", 400, "temperature",
                 "invalid_value",
                 "Invalid value for 'temperature': expected a number between 0 and 2, but got "
                 "2.01.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"temperature\":-0.01}", 400, "temperature",
                 "invalid_value",
                 "Invalid value for 'temperature': expected a number between 0 and 2, but got "
                 "-0.01.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"top_p\":1.01}", 400, "top_p", "invalid_value",
                 "Invalid value for 'top_p': expected a number greater than 0 and at most 1, but "
                 "got 1.01.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p", "invalid_value",
                 "Invalid value for 'top_p': expected a number greater than 0 and at most 1, but "
                 "got 0.");
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"top_k\":-2}", 400, "top_k", "invalid_value",
                 "Invalid value for 'top_k': expected -1 or 0 (off) or an integer >= 1, but got "
                 "-2.");
}

static void test_limit_seed(void)
{
    struct oa_request r;
    parse_ok(CMPL, "{\"prompt\":\"x\",\"seed\":9223372036854775807}", &r);
    CU_ASSERT_EQUAL(r.seed, 9223372036854775807ull);
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\",\"seed\":-9223372036854775808}", &r);
    CU_ASSERT_EQUAL(r.seed, 9223372036854775808ull);
    oa_request_fini(&r);
    /* Past int64: jansson refuses the integer, so the body is not JSON. */
    EXPECT_ERROR(CMPL, "{\"prompt\":\"x\",\"seed\":9223372036854775808}", 400, NULL, "invalid_json",
                 "We could not parse the JSON body of your request: too big integer near "
                 "'9223372036854775808' (line 1, column 40).");
}

/* Token ids below the tokenizer's vocabulary (the router's checks the
 * model's too, oa_check_context). */
static void test_limit_token_ids(void)
{
    struct oa_request r;
    struct oa_prompt p;
    struct oa_error e;
    parse_ok(CMPL, "{\"prompt\":[1,511]}", &r);
    CU_ASSERT_EQUAL(oa_prompt_build(&r, g_tok, 1, &p, &e), 0);
    CU_ASSERT_EQUAL(p.n_ids, 2);
    oa_prompt_fini(&p);
    oa_request_fini(&r);
    parse_ok(CMPL, "{\"prompt\":[1,512]}", &r);
    CU_ASSERT_EQUAL(oa_prompt_build(&r, g_tok, 1, &p, &e), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(e.status, 400);
    CU_ASSERT_STRING_EQUAL(e.param, "prompt");
    CU_ASSERT_STRING_EQUAL(e.code, "invalid_value");
    CU_ASSERT_STRING_EQUAL(e.message, "Invalid value for 'prompt[1]': expected a token id below "
                                      "the vocabulary size 512, but got 512.");
    oa_request_fini(&r);
}

/* prompt + max_tokens <= the model's context (64 for "tiny" here). */
static void test_limit_context(void)
{
    struct oa_request r;
    struct oa_error e;
    parse_ok(CMPL, "{\"prompt\":\"x\",\"max_tokens\":4}", &r);
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 60, &e), 0);
    CU_ASSERT_EQUAL(r.max_tokens, 4);
    r.max_tokens = 4;
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 61, &e), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(e.status, 400);
    CU_ASSERT_STRING_EQUAL(e.type, "invalid_request_error");
    CU_ASSERT_STRING_EQUAL(e.param, "prompt");
    CU_ASSERT_STRING_EQUAL(e.code, "context_length_exceeded");
    CU_ASSERT_STRING_EQUAL(e.message,
                           "This model's maximum context length is 64 tokens. However, you "
                           "requested 65 tokens (61 in the messages, 4 in the completion). "
                           "Please reduce the length of the messages or completion.");
    oa_request_fini(&r);
    /* Without max_tokens the prompt alone must leave room for one token. */
    parse_ok(CMPL, "{\"prompt\":\"x\"}", &r);
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 63, &e), 0);
    CU_ASSERT_EQUAL(r.max_tokens, 1);
    r.max_tokens = -1;
    CU_ASSERT_EQUAL(oa_check_context(&r, &g_models[0], 64, &e), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(e.code, "context_length_exceeded");
    CU_ASSERT_STRING_EQUAL(e.message,
                           "This model's maximum context length is 64 tokens. However, your "
                           "request has 64 input tokens. Please reduce the length of the input "
                           "messages.");
    oa_request_fini(&r);
}

static void test_format_id(void)
{
    char id[OA_ID_MAX];
    oa_format_id(OA_KIND_COMPLETION, 0x2a, id);
    CU_ASSERT_STRING_EQUAL(id, "cmpl-000000000000002a");
    oa_format_id(OA_KIND_CHAT, UINT64_MAX, id);
    CU_ASSERT_STRING_EQUAL(id, "chatcmpl-ffffffffffffffff");
    CU_ASSERT_STRING_EQUAL(oa_finish_name(OA_FINISH_STOP), "stop");
    CU_ASSERT_STRING_EQUAL(oa_finish_name(OA_FINISH_LENGTH), "length");
    CU_ASSERT_STRING_EQUAL(oa_finish_name(OA_FINISH_ABORT), "abort");
    CU_ASSERT_PTR_NULL(oa_finish_name((enum oa_finish)0));
}

int main(void)
{
    if (tok_create_bytes(&g_tok) != 0)
        return 1;
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("openai", NULL, NULL);
    CU_add_test(s, "parse_completion_all_fields", test_parse_completion_all_fields);
    CU_add_test(s, "parse_defaults", test_parse_defaults);
    CU_add_test(s, "stream_empty_text", test_stream_empty_text);
    CU_add_test(s, "parse_chat", test_parse_chat);
    CU_add_test(s, "parse_errors_json", test_parse_errors_json);
    CU_add_test(s, "parse_errors_values", test_parse_errors_values);
    CU_add_test(s, "parse_wrong_types", test_parse_wrong_types);
    CU_add_test(s, "token_prompts", test_token_prompts);
    CU_add_test(s, "chat_template", test_chat_template);
    CU_add_test(s, "models_and_context", test_models_and_context);
    CU_add_test(s, "error_builders", test_error_builders);
    CU_add_test(s, "completion_response", test_completion_response);
    CU_add_test(s, "chat_response", test_chat_response);
    CU_add_test(s, "chat_stream", test_chat_stream);
    CU_add_test(s, "completion_stream", test_completion_stream);
    CU_add_test(s, "completion_logprobs", test_completion_logprobs);
    CU_add_test(s, "chat_logprobs", test_chat_logprobs);
    CU_add_test(s, "echo", test_echo);
    CU_add_test(s, "stop_strings", test_stop_strings);
    CU_add_test(s, "textdec_pieces", test_textdec_pieces);
    CU_add_test(s, "utf8_across_tokens", test_utf8_across_tokens);
    CU_add_test(s, "stop_random", test_stop_random);
    CU_add_test(s, "format_id", test_format_id);
    CU_add_test(s, "limit_json_depth", test_limit_json_depth);
    CU_add_test(s, "limit_stop_count", test_limit_stop_count);
    CU_add_test(s, "limit_stop_bytes", test_limit_stop_bytes);
    CU_add_test(s, "limit_stop_token_ids", test_limit_stop_token_ids);
    CU_add_test(s, "limit_logprobs", test_limit_logprobs);
    CU_add_test(s, "limit_chat_top_logprobs", test_limit_chat_top_logprobs);
    CU_add_test(s, "limit_max_tokens", test_limit_max_tokens);
    CU_add_test(s, "limit_n_and_best_of", test_limit_n_and_best_of);
    CU_add_test(s, "limit_prompt_and_message_count", test_limit_prompt_and_message_count);
    CU_add_test(s, "limit_sampling_ranges", test_limit_sampling_ranges);
    CU_add_test(s, "limit_seed", test_limit_seed);
    CU_add_test(s, "limit_token_ids", test_limit_token_ids);
    CU_add_test(s, "limit_context", test_limit_context);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    tok_destroy(g_tok);
    return failed ? 1 : 0;
}
