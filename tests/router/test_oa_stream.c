/* The streamed-token path, old against new, byte for byte:
 *   - render: random requests (completions and chat, streamed or not, usage
 *     on or off, logprobs with 0..5 alternatives, echo, stop strings and stop
 *     token ids) fed the same random tokens (quotes, backslashes, control
 *     bytes, NUL, multi-byte characters split over tokens, invalid UTF-8,
 *     EOS, empty tokens; logprobs from -inf to 0, rarely NaN) through two
 *     outputs: the jansson renderer it replaced (oa_ref.c) and the direct one
 *     (openai.c); every chunk, body and usage chunk and every return code
 *     must be equal; a third output read through oa_output_delta (the
 *     offline simulator's path) must say what the load generator parses out
 *     of each rendered chunk, and finish with the same last chunk;
 *   - parse: each of those texts, hand-written vLLM / OpenAI / SGLang chunks
 *     and random one-byte mutants of all of them, read by the load
 *     generator's fast path and by jansson (lg_openai_parse_chunk_json):
 *     every field of struct lg_chunk, the return code and the error text
 *     must be equal.
 * Seed printed; OA_SEED=n replays. */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oa_ref.h"
#include "openai.h"
#include "tandem_err.h"
#include "tokenizer.h"
#include "loadgen/openai.h"

#define VOCAB 512

static struct tokenizer
    *g_tok; /* byte-level: id = byte + TOK_BYTE_BASE; >= 259 decode to nothing */
static uint64_t g_rng;
static long g_chunks, g_parsed, g_fast, g_deltas;

static uint32_t rnd(uint32_t n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return n ? (uint32_t)(g_rng % n) : 0;
}

/* ------------------------------------------------------------- parse side */

/* The fast path and jansson read data the same way; prints both on a
 * difference. */
static int same_parse(enum lg_api api, const char *data, size_t len)
{
    struct lg_chunk a, b;
    int ra = lg_openai_parse_chunk(api, data, len, &a);
    int rb = lg_openai_parse_chunk_json(api, data, len, &b);
    int same = ra == rb && a.is_token == b.is_token && (a.text == NULL) == (b.text == NULL) &&
               a.text_len == b.text_len &&
               (a.text == NULL || memcmp(a.text, b.text, a.text_len) == 0) &&
               a.has_usage == b.has_usage && a.prompt_tokens == b.prompt_tokens &&
               a.completion_tokens == b.completion_tokens && a.cached_tokens == b.cached_tokens &&
               a.is_error == b.is_error && strcmp(a.error, b.error) == 0;
    if (!same) {
        printf("\n  parse differs (api %d) on: %.*s\n    fast: rc %d token %d text %s len %zu "
               "usage %d %" PRId64 "/%" PRId64 "/%" PRId64 " error %d '%s'\n    json: rc %d "
               "token %d text %s len %zu usage %d %" PRId64 "/%" PRId64 "/%" PRId64
               " error %d '%s'\n",
               (int)api, (int)len, data, ra, a.is_token, a.text ? "set" : "NULL", a.text_len,
               a.has_usage, a.prompt_tokens, a.completion_tokens, a.cached_tokens, a.is_error,
               a.error, rb, b.is_token, b.text ? "set" : "NULL", b.text_len, b.has_usage,
               b.prompt_tokens, b.completion_tokens, b.cached_tokens, b.is_error, b.error);
    }
    g_parsed++;
    g_fast += ra == 0 && a.root == NULL;
    if (ra == 0) {
        lg_chunk_clear(&a);
    }
    if (rb == 0) {
        lg_chunk_clear(&b);
    }
    return same;
}

static const char mutant_bytes[] = "\"\\{}[],:0-.eEu \x01\x80\xC3\xED\xF4tnf";

/* same_parse on data and on n random one-byte mutants of it (replace,
 * delete, insert). */
static int same_parse_mutants(enum lg_api api, const char *data, size_t len, int n)
{
    int ok = same_parse(api, data, len);
    char *m = malloc(len + 2);
    for (int i = 0; m != NULL && i < n && len > 0; i++) {
        size_t at = rnd((uint32_t)len), ml = len;
        char ch = mutant_bytes[rnd(sizeof(mutant_bytes) - 1)];
        memcpy(m, data, len);
        switch (rnd(3)) {
        case 0:
            m[at] = ch;
            break;
        case 1:
            memmove(m + at, m + at + 1, len - at - 1);
            ml--;
            break;
        default:
            memmove(m + at + 1, m + at, len - at);
            m[at] = ch;
            ml++;
        }
        ok &= same_parse(api, m, ml);
    }
    free(m);
    return ok;
}

/* ------------------------------------------------------------ render side */

struct run {
    enum oa_kind kind;
    struct oa_request req;
    struct oa_prompt p;
    struct oa_output ref, neu;
    struct oa_output del; /* oa_output_delta's (streams without logprobs) */
    int del_begun;        /* del sent the role chunk as neu did */
    int del_roles;        /* deltas that carried the role: at most one */
    int ok;
};

static void expect_same(struct run *r, int rc_ref, int rc_new, const char *ref, const char *neu,
                        const char *what)
{
    int same = rc_ref == rc_new && (ref == NULL) == (neu == NULL) &&
               (ref == NULL || strcmp(ref, neu) == 0);
    if (!same) {
        printf("\n  %s differs: rc %d / %d\n    jansson: %s\n    direct:  %s\n", what, rc_ref,
               rc_new, ref ? ref : "(null)", neu ? neu : "(null)");
        r->ok = 0;
    }
    if (neu != NULL) {
        enum lg_api api = r->kind == OA_KIND_CHAT ? LG_API_CHAT : LG_API_COMPLETIONS;
        r->ok &= same_parse_mutants(api, neu, strlen(neu), 2);
        g_chunks++;
    }
}

/* A random token: mostly bytes that need escaping or build characters. */
static uint32_t random_token(void)
{
    static const char special[] = "\"\\/\b\f\n\r\t\x7F";
    uint32_t k = rnd(20);
    if (k < 6)
        return TOK_BYTE_BASE + 0x20 + rnd(0x5F);
    if (k < 9)
        return TOK_BYTE_BASE + (unsigned char)special[rnd(sizeof(special) - 1)];
    if (k < 11)
        return TOK_BYTE_BASE + rnd(0x20);
    if (k < 16)
        return TOK_BYTE_BASE + 0x80 + rnd(0x80);
    if (k < 17)
        return (uint32_t)tok_eos(g_tok);
    if (k < 18)
        return 259 + rnd(VOCAB - 259); /* decodes to nothing */
    return TOK_BYTE_BASE + (k == 18 ? 0xC3 : 0xA9);
}

static float random_lp(void)
{
    switch (rnd(12)) {
    case 0:
        return -INFINITY;
    case 1:
        return -12345.5f;
    case 2:
        return 0.0f;
    case 3:
        return -1e-7f * (float)(1 + rnd(1000));
    case 4:
        return rnd(40) == 0 ? NAN : -1.0f;
    default: {
        uint32_t bits = 0xBF000000u | rnd(1u << 24) | (rnd(4) << 24);
        float f;
        memcpy(&f, &bits, sizeof(f));
        return f;
    }
    }
}

/* Pushes one step's tokens into both outputs; 1 when they stopped. */
static int step(struct run *r)
{
    int stopped = 0;
    for (uint32_t n = 1 + rnd(3), i = 0; i < n; i++) {
        struct sampler_top top[OA_MAX_LOGPROBS];
        int n_top = (int)rnd(OA_MAX_LOGPROBS + 1);
        for (int k = 0; k < n_top; k++) {
            top[k].token = rnd(3) == 0 ? TOK_BYTE_BASE + 'a' : random_token();
            top[k].logprob = random_lp();
        }
        uint32_t t = r->req.n_stop_ids > 0 && rnd(30) == 0 ? r->req.stop_ids[0] : random_token();
        float lp = random_lp();
        int a = oa_output_token(&r->ref, t, lp, top, n_top);
        int b = oa_output_token(&r->neu, t, lp, top, n_top);
        if (oa_output_token(&r->del, t, lp, top, n_top) != b) {
            printf("\n  oa_output_token differs on the delta output\n");
            r->ok = 0;
        }
        if (a != b) {
            printf("\n  oa_output_token differs: %d / %d\n", a, b);
            r->ok = 0;
        }
        stopped |= a == OA_STOPPED;
    }
    return stopped;
}

static void run_fini(struct run *r)
{
    oa_output_fini(&r->ref);
    oa_output_fini(&r->neu);
    oa_output_fini(&r->del);
    oa_prompt_fini(&r->p);
    oa_request_fini(&r->req);
}

/* A random request body of kind. */
static char *random_body(enum oa_kind kind)
{
    static const char *const stops[] = {"\"", "\\n", "é", "ab", "\xF0\x9F\x98\x80", "q"};
    int stream = rnd(5) != 0;
    json_t *b = json_pack("{s:s,s:i,s:b}", "model", "tiny", "max_tokens", 60, "stream", stream);
    if (stream)
        json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", rnd(2)));
    if (kind == OA_KIND_CHAT) {
        json_object_set_new(b, "messages",
                            json_pack("[{s:s,s:s}]", "role", "user", "content", "Hi \"x\""));
        if (rnd(2)) {
            json_object_set_new(b, "logprobs", json_true());
            json_object_set_new(b, "top_logprobs", json_integer(rnd(6)));
        }
    } else {
        json_object_set_new(b, "prompt", json_string(rnd(2) ? "a\"b\\c\xC3\xA9" : "x"));
        if (rnd(2))
            json_object_set_new(b, "logprobs", json_integer(rnd(6)));
        json_object_set_new(b, "echo", json_boolean(rnd(3) == 0));
    }
    if (rnd(3) == 0)
        json_object_set_new(b, "stop", json_string(stops[rnd(6)]));
    if (rnd(3) == 0)
        json_object_set_new(b, "stop_token_ids", json_pack("[i]", TOK_BYTE_BASE + 'z'));
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static int run_init(struct run *r, enum oa_kind kind)
{
    static const char *const models[] = {"tiny", "m\"o\\d/\xC3\xA9\t\x01"};
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->ok = 1;
    char *body = random_body(kind);
    struct oa_error e;
    static const struct oa_model model = {.id = "tiny", .max_context = 4096, .vocab_size = VOCAB};
    int rc = oa_parse(kind, body, strlen(body), &r->req, &e);
    free(body);
    if (rc != 0 || oa_prompt_build(&r->req, g_tok, 1, &r->p, &e) != 0 ||
        oa_check_context(&r->req, &model, r->p.n_ids, &e) != 0) {
        printf("\n  %s\n", e.message);
        return -1;
    }
    char id[OA_ID_MAX];
    oa_format_id(kind, ((uint64_t)rnd(1u << 31) << 32) | rnd(1u << 31), id);
    const char *m = models[rnd(2)];
    int64_t created = rnd(2) ? 1700000000 : -5;
    if (oa_output_init(&r->ref, &r->req, &r->p, g_tok, id, m, created) != 0 ||
        oa_output_init(&r->neu, &r->req, &r->p, g_tok, id, m, created) != 0 ||
        oa_output_init(&r->del, &r->req, &r->p, g_tok, id, m, created) != 0)
        return -1;
    return 0;
}

/* Prompt logprobs (echo + logprobs) into both. */
static void prompt_logprobs(struct run *r)
{
    int n = r->p.n_ids - 1;
    if (n <= 0)
        return;
    float *lp = calloc((size_t)n, sizeof(*lp));
    struct sampler_top *top = calloc((size_t)n * OA_MAX_LOGPROBS, sizeof(*top));
    for (int j = 0; j < n; j++) {
        lp[j] = random_lp();
        for (int k = 0; k < OA_MAX_LOGPROBS; k++) {
            top[(size_t)j * OA_MAX_LOGPROBS + (size_t)k].token = random_token();
            top[(size_t)j * OA_MAX_LOGPROBS + (size_t)k].logprob = random_lp();
        }
    }
    int a = oa_output_prompt_logprobs(&r->ref, 1, n, lp, top, OA_MAX_LOGPROBS);
    int b = oa_output_prompt_logprobs(&r->neu, 1, n, lp, top, OA_MAX_LOGPROBS);
    r->ok &= a == b;
    free(lp);
    free(top);
}

/* The delta of r->del against the chunk neu rendered (rc, json): what the
 * load generator parses out of the JSON is what the delta says. Outputs
 * with logprobs are rendered, and the delta refuses them. */
static void expect_delta(struct run *r, int rc, const char *json)
{
    const char *text;
    size_t len;
    int role;
    int rd = oa_output_delta(&r->del, &text, &len, &role);
    if (r->del.logprobs) {
        r->ok &= rd == TANDEM_EINVAL;
        return;
    }
    if (rc != 0 || json == NULL) {
        if (rd != (rc < 0 ? rc : 0)) {
            printf("\n  delta: rc %d, the chunk's %d\n", rd, rc);
            r->ok = 0;
        }
        return;
    }
    struct lg_chunk c;
    enum lg_api api = r->kind == OA_KIND_CHAT ? LG_API_CHAT : LG_API_COMPLETIONS;
    if (rd != 1 || lg_openai_parse_chunk(api, json, strlen(json), &c) != 0) {
        printf("\n  delta: rc %d for %s\n", rd, json);
        r->ok = 0;
        return;
    }
    /* When r->del skipped the role chunk, its first delta carries the role
     * that neu's chunk does not: then only the text is comparable. */
    int same_role = role == (strstr(json, "\"delta\":{\"role\"") != NULL);
    r->del_roles += role;
    if ((r->del_begun && !same_role) || r->del_roles > 1) {
        printf("\n  delta role %d (%d so far) against %s\n", role, r->del_roles, json);
        r->ok = 0;
    }
    int is_token = len > 0 || !role;
    if ((same_role && c.is_token != is_token) || c.text_len != len ||
        memcmp(c.text, text, len) != 0) {
        printf("\n  delta \"%.*s\" (role %d) against %s\n", (int)len, text, role, json);
        r->ok = 0;
    }
    g_deltas++;
    lg_chunk_clear(&c);
}

/* One request through both renderers. */
static int render_one(enum oa_kind kind)
{
    struct run r;
    if (run_init(&r, kind) != 0) {
        run_fini(&r);
        printf("\n  cannot set up a request\n");
        return 0;
    }
    prompt_logprobs(&r);
    char *a = NULL, *b = NULL, *ua = NULL, *ub = NULL;
    int ra = oa_ref_begin(&r.ref, &a), rb = oa_output_begin(&r.neu, &b);
    expect_same(&r, ra, rb, a, b, "begin");
    free(a);
    free(b);
    /* The delta output starts without the role chunk half the time: its
     * first delta then carries the role. */
    if (rnd(2)) {
        a = NULL;
        ra = oa_output_begin(&r.del, &a);
        r.ok &= ra == rb;
        r.del_begun = 1;
        free(a);
    }
    for (int s = (int)rnd(25); s >= 0; s--) {
        int stopped = step(&r);
        if (r.ref.stream) {
            a = b = NULL;
            ra = oa_ref_chunk(&r.ref, &a);
            if (rnd(2)) {
                rb = oa_output_chunk(&r.neu, &b);
            } else {
                const char *v;
                size_t vl;
                rb = oa_output_chunk_ref(&r.neu, &v, &vl);
                b = v ? strdup(v) : NULL;
                if (v != NULL && vl != strlen(v))
                    r.ok = 0;
            }
            expect_same(&r, ra, rb, a, b, "chunk");
            expect_delta(&r, rb, b);
            free(a);
            free(b);
        }
        if (stopped)
            break;
    }
    enum oa_finish reason = (enum oa_finish)(1 + rnd(3));
    int prompt = (int)rnd(100), cached = (int)rnd(50);
    a = b = NULL;
    ra = oa_ref_finish(&r.ref, reason, prompt, cached, &a, r.ref.stream ? &ua : NULL);
    rb = oa_output_finish(&r.neu, reason, prompt, cached, &b, r.neu.stream ? &ub : NULL);
    expect_same(&r, ra, rb, a, b, "finish body");
    expect_same(&r, ra, rb, ua, ub, "usage chunk");
    /* The delta output advanced as the rendering one: the same last chunk
     * and usage (when both sent the chat role the same way). */
    int began = r.del_begun || r.del.began == r.neu.began;
    char *d = NULL, *ud = NULL;
    int rd = oa_output_finish(&r.del, reason, prompt, cached, &d, r.del.stream ? &ud : NULL);
    if (r.neu.stream && !r.neu.logprobs && began) {
        int same = rd == rb && (d == NULL) == (b == NULL) && (d == NULL || strcmp(d, b) == 0) &&
                   (ud == NULL) == (ub == NULL) && (ud == NULL || strcmp(ud, ub) == 0);
        if (!same) {
            printf("\n  delta output's finish differs:\n    %s\n    %s\n", d ? d : "(null)",
                   b ? b : "(null)");
            r.ok = 0;
        }
    }
    free(d);
    free(ud);
    free(a);
    free(b);
    free(ua);
    free(ub);
    int ok = r.ok;
    run_fini(&r);
    return ok;
}

/* 3000 random outputs; 300 with TANDEM_TEST_QUICK (deploy/test.sh's valgrind stage, where the
 * 3000 took 84 s of CPU: the same paths, fewer random draws). */
static void test_render_identity(void)
{
    const char *quick = getenv("TANDEM_TEST_QUICK");
    const int rounds = quick != NULL && strcmp(quick, "0") != 0 ? 300 : 3000;
    int bad = 0;
    for (int i = 0; i < rounds && bad < 5; i++)
        bad += !render_one(i % 2 ? OA_KIND_CHAT : OA_KIND_COMPLETION);
    printf("\n  %ld texts rendered both ways, %ld deltas read against them\n", g_chunks, g_deltas);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(g_chunks > 3 * rounds);
    CU_ASSERT(g_deltas > rounds / 3);
}

/* ------------------------------------------------------------- hand-written */

static const char *const g_samples[] = {
    /* vLLM, completions */
    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"text\":\" Hello\",\"logprobs\":null,\"finish_reason\":null,"
    "\"stop_reason\":null}],\"usage\":null}",
    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":"
    "[{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\","
    "\"stop_reason\":null}]}",
    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
    "\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"total_tokens\":26,"
    "\"completion_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":4}}}",
    /* vLLM, chat */
    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
    "\"logprobs\":null,\"finish_reason\":null}]}",
    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\u00e9\\ud83d\\ude00 \\\"q\\\" \\\\ "
    "\\n\\/\\b\\f\\r\\t\\u0000\"},\"logprobs\":null,\"finish_reason\":null}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\","
    "\"stop_reason\":128009}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":null,\"tool_calls\":[{\"id\":\"t\"}]},"
    "\"finish_reason\":null}]}",
    /* OpenAI */
    "{\"id\":\"chatcmpl-x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt\","
    "\"system_fingerprint\":\"fp\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},"
    "\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}",
    "{\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,"
    "\"total_tokens\":12,\"prompt_tokens_details\":{\"cached_tokens\":0,\"audio_tokens\":0},"
    "\"completion_tokens_details\":{\"reasoning_tokens\":0}}}",
    "{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":"
    "{\"role\":\"assistant\",\"content\":\"whole\"},\"finish_reason\":\"stop\"}],"
    "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}",
    /* SGLang */
    "{\"id\":\"s\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":"
    "[{\"index\":0,\"text\":\"a\",\"logprobs\":null,\"finish_reason\":null,"
    "\"matched_stop\":null}],\"usage\":null}",
    /* errors */
    "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":500}}",
    "{\"object\":\"error\",\"message\":\"bad\",\"type\":\"BadRequestError\",\"code\":400}",
    "{\"error\":\"plain\"}",
    /* what the fast path leaves to jansson, or must refuse */
    "{\"choices\":[{\"text\":\"a\"}],\"choices\":[{\"text\":\"b\"}]}",
    "{\"choices\":[{\"text\":\"a\",\"text\":\"b\"}]}",
    "{\"usage\":{\"prompt_tokens\":1.5e1,\"completion_tokens\":-3}}",
    "{\"usage\":{\"prompt_tokens\":12345678901234567890}}",
    "{\"usage\":{\"prompt_tokens\":123456789012345678,\"completion_tokens\":\"7\"}}",
    "{\"usage\":{\"prompt_tokens\":1e400}}",
    "{\"usage\":{\"x\":1e400}}",
    "{\"usage\":{\"x\":-0.0e-99999}}",
    "{\"\\u0000\":1,\"choices\":[{\"text\":\"\\u0000\"}]}",
    "{\"choices\":[{\"text\":\"\\ud800\"}]}",
    "{\"choices\":[{\"text\":\"\\udc00\"}]}",
    "{\"choices\":[{\"text\":\"\\ud800\\u0041\"}]}",
    "{\"choices\":[{\"text\":\"\xC3\"}]}",
    "{\"choices\":[{\"text\":\"\xED\xA0\x80\"}]}",
    "{\"choices\":[{\"text\":\"\xF4\x90\x80\x80\"}]}",
    "{\"choices\":[{\"text\":\"\xE0\x80\xAF\"}]}",
    "{\"choices\":[{\"text\":\"tab\there\"}]}",
    " \r\n\t{\"choices\":[{\"text\":\"ws\"}]} \n",
    "[{\"choices\":[]}]",
    "{}",
    "{\"choices\":\"x\",\"usage\":[]}",
    "{\"choices\":[1,{\"text\":\"a\"}]}",
    "{\"choices\":[{\"delta\":null,\"message\":{\"content\":\"m\"}}]}",
    "{\"choices\":[{\"delta\":{\"content\":\"d\"},\"message\":{\"content\":\"m\"}}]}",
    "{\"choices\":[{\"te\\u0078t\":\"escaped key\",\"finish_reason\":\"stop\"}]}",
    "{\"choices\":[{\"text\":\"a\"}]} x",
    "{\"choices\":[{\"text\":\"a\"},]}",
    "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]"
    "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],\"choices\":[{\"text\":\"d\"}]}",
    "{\"a\":tru,\"choices\":[]}",
    "{\"a\":true,\"b\":false,\"c\":null,\"d\":-0,\"e\":0.5,\"f\":1E+2,\"g\":[],\"choices\":[]}",
    "{\"a\":01}",
    "{\"a\":1.}",
    "{\"a\":-}",
    "{\"choices\":[{\"text\":\"",
    "",
};

static void test_parse_samples(void)
{
    int ok = 1;
    for (size_t i = 0; i < sizeof(g_samples) / sizeof(g_samples[0]); i++) {
        const char *s = g_samples[i];
        for (int api = LG_API_COMPLETIONS; api <= LG_API_CHAT; api++)
            ok &= same_parse_mutants((enum lg_api)api, s, strlen(s), 200);
    }
    /* Text over what the chunk keeps goes to jansson, with the same result. */
    char big[LG_CHUNK_TEXT_MAX + 64];
    int n = snprintf(big, sizeof(big), "{\"choices\":[{\"text\":\"");
    memset(big + n, 'x', LG_CHUNK_TEXT_MAX + 1);
    memcpy(big + n + LG_CHUNK_TEXT_MAX + 1, "\"}]}", 5);
    ok &= same_parse(LG_API_COMPLETIONS, big, strlen(big));
    CU_ASSERT(ok);
    /* The shapes streamed by Tandem and vLLM take the fast path. */
    struct lg_chunk c;
    CU_ASSERT_EQUAL(lg_openai_parse_chunk(LG_API_CHAT, g_samples[4], strlen(g_samples[4]), &c), 0);
    CU_ASSERT_PTR_NULL(c.root);
    CU_ASSERT_EQUAL(c.text_len, 20);
    CU_ASSERT_EQUAL(memcmp(c.text, "\xC3\xA9\xF0\x9F\x98\x80 \"q\" \\ \n/\b\f\r\t", 20), 0);
    lg_chunk_clear(&c);
    printf("\n  %ld texts parsed both ways, %ld by the fast path\n", g_parsed, g_fast);
}

int main(void)
{
    const char *seed = getenv("OA_SEED");
    g_rng = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    if (g_rng == 0)
        g_rng = 1;
    printf("test_oa_stream: OA_SEED=%" PRIu64 "\n", g_rng);
    if (tok_create_bytes_n(&g_tok, VOCAB) != 0)
        return 1;
    unsigned fails = 1;
    if (CU_initialize_registry() == CUE_SUCCESS) {
        CU_pSuite s = CU_add_suite("oa_stream", NULL, NULL);
        CU_add_test(s, "render_identity", test_render_identity);
        CU_add_test(s, "parse_samples", test_parse_samples);
        CU_basic_set_mode(CU_BRM_VERBOSE);
        CU_basic_run_tests();
        fails = CU_get_number_of_failures();
        CU_cleanup_registry();
    }
    tok_destroy(g_tok);
    return fails ? 1 : 0;
}
