/* The llama2.c tokenizer.bin loader (engine/tokenizer.h tok_load_mem) on any
 * bytes, then the loaded vocabulary in use: the input itself (its first 512
 * bytes) is encoded, decoded and streamed.
 *
 * The file does not say how many entries it holds; like the router (which
 * counts them), the harness counts (score, len, bytes) records to the end
 * and passes that, or TOK_MIN_VOCAB when the count is not usable.
 *
 * Properties: no crash, leak or over-read; encode returns at least one id
 * (BOS) and every id is inside the vocabulary; tok_decode's size query matches what it writes; the
 * streamed text (struct tok_utf8) is valid UTF-8. */
#include <string.h>

#include "fuzz.h"
#include "tandem_err.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_init_logs();
    return 0;
}

static int count_entries(const uint8_t *data, size_t size)
{
    size_t at = 4;
    int n = 0;
    while (at <= size && size - at >= 8) {
        int32_t len;
        memcpy(&len, data + at + 4, 4);
        if (len < 0 || len > TOK_MAX_PIECE || (size_t)len > size - at - 8)
            return -1;
        at += 8 + (size_t)len;
        if (++n > TOK_MAX_VOCAB)
            return -1;
    }
    return n;
}

/* 1 when s[0..n) is well-formed UTF-8 (no surrogates, no overlongs). */
static int utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

static void use(const struct tokenizer *t, const uint8_t *text, size_t len)
{
    int vocab = tok_vocab_size(t);
    int max = (int)TOK_ENCODE_BOUND(len);
    uint32_t *ids = malloc((size_t)max * sizeof(*ids));
    FUZZ_CHECK(ids != NULL);
    int n = tok_encode(t, (const char *)text, len, 1, ids, max);
    /* Not ids[0] == TOK_BOS: as in llama2.c, BOS merges with what follows
     * when the vocabulary has a piece starting with "\n<s>\n". */
    FUZZ_CHECK(n >= 1 && n <= max);
    for (int i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] < (uint32_t)vocab);

    int need = tok_decode(t, ids, n, NULL, 0);
    FUZZ_CHECK(need >= 0);
    char *out = malloc((size_t)need + 1);
    FUZZ_CHECK(out != NULL);
    FUZZ_CHECK(tok_decode(t, ids, n, out, (size_t)need + 1) == need && out[need] == '\0');
    free(out);

    struct tok_utf8 u;
    tok_utf8_init(&u);
    char buf[TOK_UTF8_OUT_MAX(TOK_MAX_PIECE)];
    uint32_t prev = TOK_NO_PREV;
    for (int i = 0; i < n; i++) {
        int w = tok_stream_token(t, &u, prev, ids[i], buf, sizeof buf);
        FUZZ_CHECK(w >= 0 && utf8_ok((const unsigned char *)buf, (size_t)w));
        prev = ids[i];
    }
    int w = tok_utf8_flush(&u, buf, sizeof buf);
    FUZZ_CHECK(w == 0 || (w == 3 && utf8_ok((const unsigned char *)buf, 3)));
    FUZZ_CHECK(tok_stream_token(t, &u, prev, (uint32_t)vocab, buf, sizeof buf) == TANDEM_ERANGE);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int n = size >= 4 ? count_entries(data, size) : -1;
    if (n < TOK_MIN_VOCAB)
        n = TOK_MIN_VOCAB;
    struct tokenizer *t = NULL;
    int rc = tok_load_mem(&t, data, size, n, "fuzz.bin");
    if (rc != 0) {
        FUZZ_CHECK(t == NULL);
        FUZZ_CHECK(rc == TANDEM_ETRUNCATED || rc == TANDEM_EFORMAT || rc == TANDEM_ETOOBIG ||
                   rc == TANDEM_ENOMEM);
        return 0;
    }
    FUZZ_CHECK(t != NULL && tok_vocab_size(t) == n && tok_kind(t) == TOK_KIND_LLAMA2C);
    use(t, data, size < 512 ? size : 512);
    tok_destroy(t);
    return 0;
}
