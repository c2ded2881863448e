/* The OpenAI request layer (router/openai.h) as the router runs it on a POST
 * body: oa_parse, oa_resolve_model, oa_prompt_build (chat template and
 * tokenizer), oa_check_context, then a generated completion rendered with
 * oa_output_* (text decoding, stop strings, logprobs, SSE chunks).
 *
 * Input: one selector byte, then the body. Selector bit 0: chat (else
 * completions); bit 1: a small llama2.c BPE tokenizer (else the byte-level
 * one); bit 2: the model's context is 64 tokens (else 4096).
 *
 * Properties: no crash or leak; every JSON the layer produces (errors,
 * responses, chunks) parses with jansson; the prompt text is valid UTF-8 and
 * its token ids are inside the vocabulary; oa_check_context leaves a
 * max_tokens that fits the context. */
#include <jansson.h>
#include <string.h>

#include "fuzz.h"
#include "openai.h"
#include "tandem_err.h"
#include "tokenizer.h"

static struct tokenizer *g_bytes, *g_bpe;

/* A llama2.c tokenizer.bin in memory: the 3 specials, the 256 byte tokens,
 * then merges, longer ones scoring higher (as sentencepiece's do). */
static struct tokenizer *make_bpe(void)
{
    static const char *const merges[] = {
        " ",   "e",  "t",    "th",   "he",    "the", " the", "in",    "er",     "an",   " a",
        "<|",  "|>", "user", "assi", "stant", "ass", "syst", "em",    "system", "\n<",  "ab",
        "abc", "é",  "😀",    "  ",   "    ",  "\n",  "\n\n", "hello", " world", "Hello"};
    size_t n = sizeof(merges) / sizeof(merges[0]);
    size_t cap = 4 + 259 * 16 + n * 32;
    unsigned char *buf = malloc(cap), *p = buf + 4;
    int32_t mtl = 16;
    memcpy(buf, &mtl, 4);
    for (int id = 0; id < 259 + (int)n; id++) {
        char piece[32];
        if (id == 0)
            strcpy(piece, "<unk>");
        else if (id == 1)
            strcpy(piece, "\n<s>\n");
        else if (id == 2)
            strcpy(piece, "\n</s>\n");
        else if (id < 259)
            snprintf(piece, sizeof piece, "<0x%02X>", id - 3);
        else
            snprintf(piece, sizeof piece, "%s", merges[id - 259]);
        float score = id < 259 ? 0.0f : (float)strlen(piece) - (float)(id - 259) / 100.0f;
        int32_t len = (int32_t)strlen(piece);
        memcpy(p, &score, 4);
        memcpy(p + 4, &len, 4);
        memcpy(p + 8, piece, (size_t)len);
        p += 8 + len;
    }
    struct tokenizer *t = NULL;
    int rc = tok_load_mem(&t, buf, (size_t)(p - buf), 259 + (int)n, "fuzz-bpe");
    free(buf);
    FUZZ_CHECK(rc == 0);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_init_logs();
    FUZZ_CHECK(tok_create_bytes(&g_bytes) == 0);
    g_bpe = make_bpe();
    return 0;
}

static void check_json(char *s)
{
    FUZZ_CHECK(s != NULL);
    json_error_t je;
    /* "\u0000" is valid JSON, in strings and in keys (completions' top_logprobs
     * are keyed by token text); jansson only reads it in strings. */
    json_t *j = json_loads(s, JSON_ALLOW_NUL, &je);
    int nul_key = j == NULL && strstr(je.text, "NUL byte in object key") != NULL;
    if (j == NULL && !nul_key)
        fprintf(stderr, "bad JSON (%s): %s\n", je.text, s);
    FUZZ_CHECK(j != NULL || nul_key);
    json_decref(j);
    free(s);
}

static void check_error(const struct oa_error *e)
{
    FUZZ_CHECK(e->status >= 400 && e->status <= 599 && e->type != NULL);
    check_json(oa_error_json(e));
}

/* Generates up to 24 tokens picked from the prompt, as a worker might. */
static void generate(const struct oa_request *req, const struct oa_prompt *p,
                     const struct tokenizer *tok, const struct oa_model *m)
{
    struct oa_output o;
    int rc = oa_output_init(&o, req, p, tok, "cmpl-0000000000000000", m->id, 1700000000);
    FUZZ_CHECK(rc == 0);
    char *s = NULL, *usage = NULL;
    FUZZ_CHECK(oa_output_begin(&o, &s) == 0);
    if (s)
        check_json(s);
    int vocab = tok_vocab_size(tok);
    if (req->echo && req->logprobs && p->n_ids > 1) {
        int n = p->n_ids - 1;
        float *lp = malloc((size_t)n * sizeof(float));
        struct sampler_top *top = malloc((size_t)n * 2 * sizeof(*top));
        for (int j = 0; j < n; j++) {
            lp[j] = -0.5f * (float)(j % 7);
            top[2 * j] = (struct sampler_top){p->ids[j + 1], lp[j]};
            top[2 * j + 1] = (struct sampler_top){(p->ids[j] + 1) % (uint32_t)vocab, -9.0f};
        }
        FUZZ_CHECK(oa_output_prompt_logprobs(&o, 1, n, lp, top, 2) == 0);
        free(lp);
        free(top);
    }
    int n_gen = req->max_tokens < 24 ? req->max_tokens : 24;
    enum oa_finish reason = OA_FINISH_LENGTH;
    for (int i = 0; i < n_gen; i++) {
        uint32_t t = (p->ids[(size_t)i % (size_t)p->n_ids] * 7u + (uint32_t)i) % (uint32_t)vocab;
        struct sampler_top top[2] = {{t, -0.25f}, {(t + 1) % (uint32_t)vocab, -2.0f}};
        rc = oa_output_token(&o, t, -0.25f, top, 2);
        FUZZ_CHECK(rc == 0 || rc == OA_STOPPED);
        if (req->stream && i % 3 == 0) {
            FUZZ_CHECK(oa_output_chunk(&o, &s) == 0);
            if (s)
                check_json(s);
        }
        if (rc == OA_STOPPED || t == TOK_EOS) {
            reason = OA_FINISH_STOP;
            break;
        }
    }
    FUZZ_CHECK(oa_output_finish(&o, reason, p->n_ids, p->n_ids / 2, &s, &usage) == 0);
    check_json(s);
    if (usage)
        check_json(usage);
    oa_output_fini(&o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum oa_kind kind = (data[0] & 1) ? OA_KIND_CHAT : OA_KIND_COMPLETION;
    const struct tokenizer *tok = (data[0] & 2) ? g_bpe : g_bytes;
    struct oa_model m = {.id = "tiny",
                         .max_context = (data[0] & 4) ? 64 : 4096,
                         .vocab_size = tok_vocab_size(tok),
                         .created = 1700000000};
    struct oa_request req;
    struct oa_error err;
    if (oa_parse(kind, (const char *)data + 1, size - 1, &req, &err) != 0) {
        check_error(&err);
        oa_request_fini(&req);
        return 0;
    }
    FUZZ_CHECK(req.kind == kind);
    if (oa_resolve_model(&req, &m, 1, &err) == NULL) {
        check_error(&err);
        oa_request_fini(&req);
        return 0;
    }
    struct oa_prompt p;
    if (oa_prompt_build(&req, tok, 1, &p, &err) != 0) {
        check_error(&err);
        oa_request_fini(&req);
        return 0;
    }
    json_t *text = json_stringn(p.text, p.text_len);
    FUZZ_CHECK(text != NULL); /* jansson refuses invalid UTF-8 */
    json_decref(text);
    for (int i = 0; i < p.n_ids; i++)
        FUZZ_CHECK(p.ids[i] < (uint32_t)m.vocab_size);
    if (oa_check_context(&req, &m, p.n_ids, &err) != 0) {
        check_error(&err);
    } else {
        FUZZ_CHECK(req.max_tokens >= 1 && p.n_ids + req.max_tokens <= m.max_context);
        generate(&req, &p, tok, &m);
    }
    oa_prompt_fini(&p);
    oa_request_fini(&req);
    return 0;
}
