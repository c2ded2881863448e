/* Tokenizers: byte-level ids, llama2.c tokenizer.bin encode/decode against a
 * straight port of llama2.c's O(n^2) encode, bad files, fuzzed input, and the
 * streaming UTF-8 helper.
 *
 * Randomised tests print their seed; replay with TANDEM_TEST_SEED=<seed>. */
#include <CUnit/Basic.h>
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "tandem_err.h"
#include "tokenizer.h"

static uint64_t g_seed;

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(rng_next(s) % n);
}

static void quiet_logs(int quiet)
{
    log_set_level(quiet ? (enum log_level)(LOG_LEVEL_ERROR + 1) : LOG_LEVEL_WARN);
}

/* ---- a tokenizer.bin written by the test --------------------------------- */

#define TV_MAX 4096

struct tv {
    int n;
    char *s[TV_MAX];
    int len[TV_MAX];
    float score[TV_MAX];
};

static int tv_find(const struct tv *v, const char *s, int len)
{
    for (int i = 0; i < v->n; i++) {
        if (v->len[i] == len && memcmp(v->s[i], s, (size_t)len) == 0) {
            return i;
        }
    }
    return -1;
}

static int tv_add(struct tv *v, const char *s, int len, float score)
{
    if (v->n == TV_MAX || tv_find(v, s, len) >= 0) {
        return -1;
    }
    v->s[v->n] = malloc((size_t)len + 1);
    memcpy(v->s[v->n], s, (size_t)len);
    v->s[v->n][len] = '\0';
    v->len[v->n] = len;
    v->score[v->n] = score;
    return v->n++;
}

/* Replaces the string of id (kept unique by the caller). */
static void tv_set(struct tv *v, int id, const char *s, int len)
{
    free(v->s[id]);
    v->s[id] = malloc((size_t)len + 1);
    memcpy(v->s[id], s, (size_t)len);
    v->s[id][len] = '\0';
    v->len[id] = len;
}

static void tv_free(struct tv *v)
{
    for (int i = 0; i < v->n; i++) {
        free(v->s[i]);
    }
    v->n = 0;
}

/* Ids of the fixed part of the test vocabulary. */
#define ID_CHAR(c)  (259 + ((c)-0x20)) /* printable ASCII 0x20..0x7E */
#define ID_NL       354
#define ID_E_ACUTE  355 /* é */
#define ID_EURO     356 /* € */
#define ID_U_UML    357 /* ü */
#define ID_SP_T     358 /* " t"  -1.0 */
#define ID_HE       359 /* "he"  -2.0 */
#define ID_SP_THE   360 /* " the" -3.0 */
#define ID_IN       361 /* "in"  -1.5 */
#define ID_NG       362 /* "ng"  -4.0 */
#define ID_ING      363 /* "ing" -2.5 */
#define ID_SP_A     364 /* " a"  -5.0 */
#define ID_E_BANG   365 /* "é!"  -1.0 */
#define ID_ZHE_PAIR 366 /* "<0xD0><0xB6>" -0.5: a merge of two byte tokens */
#define ID_AA       367 /* "aa" -6.0 */
#define ID_BB       368 /* "bb" -6.0 */
#define ID_AB       369 /* "ab" -6.0 */
#define ID_XY       370 /* "xy" -0.0 */
#define ID_YZ       371 /* "yz" +0.0: ties with -0.0 */
#define TV_BASE_N   372

static void tv_base(struct tv *v)
{
    v->n = 0;
    tv_add(v, "<unk>", 5, 0.0f);
    tv_add(v, "\n<s>\n", 5, 0.0f);
    tv_add(v, "\n</s>\n", 6, 0.0f);
    for (int b = 0; b < 256; b++) {
        char buf[8];
        snprintf(buf, sizeof(buf), "<0x%02X>", b);
        tv_add(v, buf, 6, 0.0f);
    }
    for (int c = 0x20; c <= 0x7E; c++) {
        char ch = (char)c;
        tv_add(v, &ch, 1, -100.0f);
    }
    tv_add(v, "\n", 1, -100.0f);
    tv_add(v, "\xC3\xA9", 2, -100.0f);
    tv_add(v, "\xE2\x82\xAC", 3, -100.0f);
    tv_add(v, "\xC3\xBC", 2, -100.0f);
    tv_add(v, " t", 2, -1.0f);
    tv_add(v, "he", 2, -2.0f);
    tv_add(v, " the", 4, -3.0f);
    tv_add(v, "in", 2, -1.5f);
    tv_add(v, "ng", 2, -4.0f);
    tv_add(v, "ing", 3, -2.5f);
    tv_add(v, " a", 2, -5.0f);
    tv_add(v, "\xC3\xA9!", 3, -1.0f);
    tv_add(v, "<0xD0><0xB6>", 12, -0.5f);
    tv_add(v, "aa", 2, -6.0f);
    tv_add(v, "bb", 2, -6.0f);
    tv_add(v, "ab", 2, -6.0f);
    tv_add(v, "xy", 2, -0.0f);
    tv_add(v, "yz", 2, 0.0f);
    CU_ASSERT_EQUAL_FATAL(v->n, TV_BASE_N);
}

/* Adds count random merges (concatenations of two existing pieces) with
 * scores that often tie, and a few that llama2.c never merges (<= -1e10,
 * NaN). "\n" never takes part, so no merge crosses a newline. */
static void tv_random_merges(struct tv *v, uint64_t *rng, int count)
{
    static const int extra_bytes[] = {0xC3, 0xA9, 0xD1, 0x84, 0x80, 0xF0};
    for (int tries = 0; count > 0 && tries < count * 50; tries++) {
        int a, b;
        for (int k = 0;; k++) {
            a = (int)rng_below(rng, (uint32_t)v->n);
            if (a >= 259 && a != ID_NL) {
                break;
            }
            if (k > 4 && rng_below(rng, 8) == 0) {
                a = 3 + extra_bytes[rng_below(rng, 6)];
                break;
            }
        }
        for (int k = 0;; k++) {
            b = (int)rng_below(rng, (uint32_t)v->n);
            if (b >= 259 && b != ID_NL) {
                break;
            }
            if (k > 4 && rng_below(rng, 8) == 0) {
                b = 3 + extra_bytes[rng_below(rng, 6)];
                break;
            }
        }
        int len = v->len[a] + v->len[b];
        if (len > 24) {
            continue;
        }
        char buf[64];
        memcpy(buf, v->s[a], (size_t)v->len[a]);
        memcpy(buf + v->len[a], v->s[b], (size_t)v->len[b]);
        float score;
        uint32_t r = rng_below(rng, 100);
        if (r < 3) {
            score = -1e10f;
        } else if (r < 5) {
            score = NAN;
        } else if (r < 7) {
            score = -1e11f;
        } else if (r < 9) {
            score = -0.0f;
        } else if (r < 11) {
            score = 0.0f;
        } else if (r < 12) {
            score = INFINITY;
        } else if (r < 60) {
            score = -(float)(1 + rng_below(rng, 8));
        } else {
            score = -(float)(rng_next(rng) % 100000) / 1000.0f;
        }
        if (tv_add(v, buf, len, score) >= 0) {
            count--;
        }
    }
}

static void put_i32(unsigned char *p, int32_t x)
{
    memcpy(p, &x, 4); /* the test runs little-endian, like the format */
}

static unsigned char *tv_file(const struct tv *v, size_t *size)
{
    size_t n = 4;
    int mtl = 1;
    for (int i = 0; i < v->n; i++) {
        n += 8 + (size_t)v->len[i];
        if (v->len[i] > mtl) {
            mtl = v->len[i];
        }
    }
    unsigned char *buf = malloc(n);
    put_i32(buf, mtl);
    size_t at = 4;
    for (int i = 0; i < v->n; i++) {
        memcpy(buf + at, &v->score[i], 4);
        put_i32(buf + at + 4, v->len[i]);
        memcpy(buf + at + 8, v->s[i], (size_t)v->len[i]);
        at += 8 + (size_t)v->len[i];
    }
    *size = n;
    return buf;
}

static size_t entry_offset(const unsigned char *file, int i)
{
    size_t at = 4;
    for (int k = 0; k < i; k++) {
        int32_t len;
        memcpy(&len, file + at + 4, 4);
        at += 8 + (size_t)len;
    }
    return at;
}

static struct tokenizer *tv_load(const struct tv *v)
{
    size_t size;
    unsigned char *file = tv_file(v, &size);
    struct tokenizer *t = NULL;
    int rc = tok_load_mem(&t, file, size, v->n, "test");
    CU_ASSERT_EQUAL(rc, 0);
    free(file);
    return t;
}

/* ---- the reference: llama2.c run.c encode(), O(n^2) --------------------- */

struct ref {
    const struct tv *v;
    int *sorted; /* ids sorted by strcmp, as llama2.c's sorted_vocab */
    int mtl;
};

static const struct tv *g_sort_tv;

static int ref_cmp(const void *a, const void *b)
{
    return strcmp(g_sort_tv->s[*(const int *)a], g_sort_tv->s[*(const int *)b]);
}

static void ref_init(struct ref *r, const struct tv *v)
{
    r->v = v;
    r->sorted = malloc(sizeof(int) * (size_t)v->n);
    r->mtl = 1;
    for (int i = 0; i < v->n; i++) {
        r->sorted[i] = i;
        if (v->len[i] > r->mtl) {
            r->mtl = v->len[i];
        }
    }
    g_sort_tv = v;
    qsort(r->sorted, (size_t)v->n, sizeof(int), ref_cmp);
}

static int ref_lookup(const struct ref *r, const char *str)
{
    int lo = 0, hi = r->v->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(str, r->v->s[r->sorted[mid]]);
        if (c == 0) {
            return r->sorted[mid];
        }
        if (c < 0) {
            hi = mid - 1;
        } else {
            lo = mid + 1;
        }
    }
    return -1;
}

/* llama2.c encode(t, text, bos, 0, tokens, &n), with the dummy prefix
 * optional so that the test can encode the pieces of a longer text. */
static int ref_encode(const struct ref *r, const char *text, int bos, int dummy, uint32_t *tokens)
{
    const struct tv *v = r->v;
    char *str_buffer = malloc((size_t)r->mtl * 2 + 1 + 2);
    size_t str_len = 0;
    int n = 0;
    if (bos) {
        tokens[n++] = 1;
    }
    if (dummy && text[0] != '\0') {
        tokens[n++] = (uint32_t)ref_lookup(r, " ");
    }
    for (const char *c = text; *c != '\0'; c++) {
        if ((*c & 0xC0) != 0x80) {
            str_len = 0;
        }
        str_buffer[str_len++] = *c;
        str_buffer[str_len] = '\0';
        if ((*(c + 1) & 0xC0) == 0x80 && str_len < 4) {
            continue;
        }
        int id = ref_lookup(r, str_buffer);
        if (id != -1) {
            tokens[n++] = (uint32_t)id;
        } else {
            for (size_t i = 0; i < str_len; i++) {
                tokens[n++] = (unsigned char)str_buffer[i] + 3;
            }
        }
        str_len = 0;
    }
    while (1) {
        float best_score = -1e10;
        int best_id = -1;
        int best_idx = -1;
        for (int i = 0; i < n - 1; i++) {
            snprintf(str_buffer, (size_t)r->mtl * 2 + 3, "%s%s", v->s[tokens[i]],
                     v->s[tokens[i + 1]]);
            int id = ref_lookup(r, str_buffer);
            if (id != -1 && v->score[id] > best_score) {
                best_score = v->score[id];
                best_id = id;
                best_idx = i;
            }
        }
        if (best_idx == -1) {
            break;
        }
        tokens[best_idx] = (uint32_t)best_id;
        for (int i = best_idx + 1; i < n - 1; i++) {
            tokens[i] = tokens[i + 1];
        }
        n--;
    }
    free(str_buffer);
    return n;
}

/* llama2.c decode() over a whole sequence, with this module's choice that
 * control ids 0..2 are not text. */
static size_t ref_decode(const struct tv *v, const uint32_t *ids, int n, char *out)
{
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 3) {
            continue;
        }
        const char *p = v->s[ids[i]];
        if (i > 0 && ids[i - 1] == 1 && p[0] == ' ') {
            p++;
        }
        if (strlen(p) == 6 && strncmp(p, "<0x", 3) == 0 && isxdigit((unsigned char)p[3]) &&
            isxdigit((unsigned char)p[4]) && p[5] == '>') {
            out[k++] = (char)strtol(p + 3, NULL, 16);
        } else {
            memcpy(out + k, p, strlen(p));
            k += strlen(p);
        }
    }
    return k;
}

/* ---- memory right before an unreadable page ------------------------------ */

struct guard {
    unsigned char *map;
    size_t maplen;
};

/* Returns a buffer of n bytes whose end touches a PROT_NONE page, so any
 * over-read faults. */
static unsigned char *guard_alloc(struct guard *g, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t data_pages = (n + page - 1) / page;
    g->maplen = (data_pages + 1) * page;
    g->map = mmap(NULL, g->maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CU_ASSERT_FATAL(g->map != MAP_FAILED);
    CU_ASSERT_FATAL(mprotect(g->map + data_pages * page, page, PROT_NONE) == 0);
    return g->map + data_pages * page - n;
}

static void guard_free(struct guard *g)
{
    munmap(g->map, g->maplen);
}

/* ---- helpers ------------------------------------------------------------- */

static int ids_equal(const uint32_t *a, int na, const uint32_t *b, int nb)
{
    return na == nb && (na == 0 || memcmp(a, b, sizeof(uint32_t) * (size_t)na) == 0);
}

static void print_ids(const char *what, const uint32_t *ids, int n)
{
    fprintf(stderr, "%s (%d):", what, n);
    for (int i = 0; i < n && i < 64; i++) {
        fprintf(stderr, " %u", ids[i]);
    }
    fprintf(stderr, "\n");
}

static int encode_str(const struct tokenizer *t, const char *s, int bos, uint32_t *out, int max)
{
    return tok_encode(t, s, strlen(s), bos, out, max);
}

#define ASSERT_IDS(t, text, bos, ...)                                                              \
    do {                                                                                           \
        const uint32_t want_[] = {__VA_ARGS__};                                                    \
        uint32_t got_[64];                                                                         \
        int n_ = tok_encode((t), (text), sizeof(text) - 1, (bos), got_, 64);                       \
        int nw_ = (int)(sizeof(want_) / sizeof(want_[0]));                                         \
        if (!ids_equal(got_, n_, want_, nw_)) {                                                    \
            print_ids("got ", got_, n_);                                                           \
            print_ids("want", want_, nw_);                                                         \
        }                                                                                          \
        CU_ASSERT(ids_equal(got_, n_, want_, nw_));                                                \
    } while (0)

/* Independent UTF-8 validity check (Unicode table 3-7). */
static int utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            need = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 3;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 4;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            return 0;
        }
        if (i + need > n || s[i + 1] < lo || s[i + 1] > hi) {
            return 0;
        }
        for (size_t k = 2; k < need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                return 0;
            }
        }
        i += need;
    }
    return 1;
}

/* ---- byte-level ---------------------------------------------------------- */

static void test_bytes_encode(void)
{
    struct tokenizer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(tok_create_bytes(&t), 0);
    CU_ASSERT_EQUAL(tok_kind(t), TOK_KIND_BYTES);
    CU_ASSERT_EQUAL(tok_vocab_size(t), 512);
    CU_ASSERT_EQUAL(tok_bos(t), 1);
    CU_ASSERT_EQUAL(tok_eos(t), 2);

    /* "Hé€😀" : H=0x48, é=C3 A9, €=E2 82 AC, 😀=F0 9F 98 80. */
    ASSERT_IDS(t, "H\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 1, 1, 75, 198, 172, 229, 133, 175, 243,
               162, 155, 131);
    ASSERT_IDS(t, "a b", 0, 100, 35, 101);
    ASSERT_IDS(t, "", 1, 1);
    uint32_t out[8];
    CU_ASSERT_EQUAL(tok_encode(t, "", 0, 0, out, 8), 0);
    /* A NUL-free binary-ish string: control bytes, DEL, high bytes. */
    ASSERT_IDS(t, "\x01\x7f\x80\xfe\xff\x1b[0m", 0, 4, 130, 131, 257, 258, 30, 94, 51, 112);
    /* Every byte 1..255 (and NUL, which the length makes visible). */
    char all[256];
    uint32_t ids[260];
    for (int b = 0; b < 256; b++) {
        all[b] = (char)b;
    }
    CU_ASSERT_EQUAL(tok_encode(t, all, 256, 1, ids, 260), 257);
    CU_ASSERT_EQUAL(ids[0], 1u);
    int ok = 1;
    for (int b = 0; b < 256; b++) {
        ok &= ids[1 + b] == (uint32_t)b + 3;
    }
    CU_ASSERT(ok);
    /* Too small an output. */
    CU_ASSERT_EQUAL(tok_encode(t, "abc", 3, 1, out, 3), TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(tok_encode(t, "abc", 3, 0, out, 3), 3);
    CU_ASSERT_EQUAL(tok_encode(t, "abc", 3, 0, out, -1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(tok_encode(t, NULL, 3, 0, out, 8), TANDEM_EINVAL);
    tok_destroy(t);

    CU_ASSERT_EQUAL(tok_create_bytes_n(&t, 258), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(tok_create_bytes_n(&t, 259), 0);
    CU_ASSERT_EQUAL(tok_vocab_size(t), 259);
    tok_destroy(t);
    tok_destroy(NULL);
}

static void test_bytes_decode(void)
{
    struct tokenizer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(tok_create_bytes(&t), 0);
    const char text[] = "Once upon a time, caf\xC3\xA9 \xF0\x9F\x98\x80\x01\xff";
    size_t n = sizeof(text) - 1;
    uint32_t ids[64];
    int k = tok_encode(t, text, n, 1, ids, 64);
    CU_ASSERT_EQUAL(k, (int)n + 1);
    char out[128];
    CU_ASSERT_EQUAL(tok_decode(t, ids, k, out, sizeof(out)), (int)n);
    CU_ASSERT(memcmp(out, text, n) == 0 && out[n] == '\0');
    CU_ASSERT_EQUAL(tok_decode(t, ids, k, NULL, 0), (int)n);
    CU_ASSERT_EQUAL(tok_decode(t, ids, k, out, n), TANDEM_ETOOBIG); /* no room for the NUL */

    /* Specials and the unused ids 259..511 decode to nothing. */
    uint32_t odd[] = {0, 1, 2, 259, 300, 511, 3 + 'x'};
    CU_ASSERT_EQUAL(tok_decode(t, odd, 7, out, sizeof(out)), 1);
    CU_ASSERT_STRING_EQUAL(out, "x");
    uint32_t bad[] = {100, 512};
    CU_ASSERT_EQUAL(tok_decode(t, bad, 2, out, sizeof(out)), TANDEM_ERANGE);
    const char *p;
    size_t len;
    CU_ASSERT_EQUAL(tok_decode_piece(t, TOK_BOS, 3 + ' ', &p, &len), 0);
    CU_ASSERT(len == 1 && p[0] == ' '); /* no space stripping in the byte kind */
    CU_ASSERT_EQUAL(tok_decode_piece(t, TOK_NO_PREV, 512, &p, &len), TANDEM_ERANGE);
    tok_destroy(t);
}

/* ---- llama2.c tokenizer.bin ---------------------------------------------- */

static void test_l2c_fixed(void)
{
    struct tv v;
    tv_base(&v);
    struct tokenizer *t = tv_load(&v);
    CU_ASSERT_FATAL(t != NULL);
    CU_ASSERT_EQUAL(tok_kind(t), TOK_KIND_LLAMA2C);
    CU_ASSERT_EQUAL(tok_vocab_size(t), TV_BASE_N);

    /* BOS, dummy prefix, merges " t" (-1), "he" (-2), " the" (-3). */
    ASSERT_IDS(t, "the", 1, 1, ID_SP_THE);
    ASSERT_IDS(t, "the", 0, ID_SP_THE);
    /* " t", then "in" (-1.5) before "ing" (-2.5); "ng" (-4) never wins. */
    ASSERT_IDS(t, "thing", 0, ID_SP_T, ID_CHAR('h'), ID_ING);
    /* Equal scores: the leftmost pair wins ("ab" before "bb"; first "aa"). */
    ASSERT_IDS(t, "babb", 0, ID_CHAR(' '), ID_CHAR('b'), ID_AB, ID_CHAR('b'));
    ASSERT_IDS(t, "baaa", 0, ID_CHAR(' '), ID_CHAR('b'), ID_AA, ID_CHAR('a'));
    ASSERT_IDS(t, "aaa", 0, ID_SP_A, ID_AA);
    ASSERT_IDS(t, "xyz", 0, ID_CHAR(' '), ID_XY, ID_CHAR('z')); /* -0.0 == +0.0 */
    /* Dummy prefix only for non-empty text. */
    ASSERT_IDS(t, "", 1, 1);
    uint32_t out[8];
    CU_ASSERT_EQUAL(tok_encode(t, "", 0, 0, out, 8), 0);
    ASSERT_IDS(t, "x", 0, ID_CHAR(' '), ID_CHAR('x'));
    ASSERT_IDS(t, " ", 0, ID_CHAR(' '), ID_CHAR(' '));
    /* Codepoints in the vocabulary. */
    ASSERT_IDS(t, "\xE2\x82\xAC", 0, ID_CHAR(' '), ID_EURO);
    ASSERT_IDS(t, "\xC3\xA9!", 0, ID_CHAR(' '), ID_E_BANG);
    ASSERT_IDS(t, "\xC3\xBC\xC3\xA9", 0, ID_CHAR(' '), ID_U_UML, ID_E_ACUTE);
    /* Byte fallback: ф (D1 84) is not in the vocabulary. */
    ASSERT_IDS(t, "\xD1\x84", 1, 1, ID_CHAR(' '), 0xD1 + 3, 0x84 + 3);
    /* ж falls back to <0xD0><0xB6>, whose concatenation is a piece. */
    ASSERT_IDS(t, "\xD0\xB6", 0, ID_CHAR(' '), ID_ZHE_PAIR);
    /* llama2.c groups any byte with the continuation bytes after it: "a\x80"
     * is one unknown group, so even the 'a' falls back to <0x61>. */
    ASSERT_IDS(t, "a\x80", 0, ID_CHAR(' '), 'a' + 3, 0x80 + 3);
    /* Groups stop at 4 bytes; the rest starts a new group. */
    ASSERT_IDS(t, "\xC3\xA9\xA9\xA9\xA9", 0, ID_CHAR(' '), 0xC3 + 3, 0xA9 + 3, 0xA9 + 3, 0xA9 + 3,
               0xA9 + 3);
    /* A NUL is a byte like any other (llama2.c would stop there). */
    ASSERT_IDS(t, "a\0b", 0, ID_SP_A, 3, ID_CHAR('b'));
    /* A long segment (the heap path): " a" first, then "aa" from the left. */
    char as[61];
    memset(as, 'a', 60);
    as[60] = '\0';
    uint32_t many[64];
    CU_ASSERT_EQUAL(encode_str(t, as, 0, many, 64), 31);
    int ok = many[0] == ID_SP_A && many[30] == ID_CHAR('a');
    for (int i = 1; i < 30; i++) {
        ok &= many[i] == ID_AA;
    }
    CU_ASSERT(ok);
    CU_ASSERT_EQUAL(encode_str(t, as, 0, many, 30), TANDEM_ETOOBIG);
    /* Output too small, then exactly right. */
    CU_ASSERT_EQUAL(encode_str(t, "thing", 0, out, 2), TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(encode_str(t, "thing", 0, out, 3), 3);
    tok_destroy(t);
    tv_free(&v);
}

static void test_l2c_decode(void)
{
    struct tv v;
    tv_base(&v);
    struct tokenizer *t = tv_load(&v);
    CU_ASSERT_FATAL(t != NULL);
    char out[256];
    const char *p;
    size_t len;

    uint32_t a[] = {1, ID_SP_THE, ID_CHAR(' '), ID_IN, ID_CHAR('!')};
    CU_ASSERT_EQUAL(tok_decode(t, a, 5, out, sizeof(out)), 7);
    CU_ASSERT_STRING_EQUAL(out, "the in!"); /* space after BOS stripped */
    CU_ASSERT_EQUAL(tok_decode(t, a + 1, 4, out, sizeof(out)), 8);
    CU_ASSERT_STRING_EQUAL(out, " the in!");
    /* Byte pieces become raw bytes; after BOS a byte space is kept. */
    uint32_t b[] = {1, 3 + ' ', 0xC3 + 3, 0xA9 + 3, 2, 0};
    CU_ASSERT_EQUAL(tok_decode(t, b, 6, out, sizeof(out)), 3);
    CU_ASSERT_STRING_EQUAL(out, " \xC3\xA9");
    /* A merged piece that only looks like bytes is text. */
    CU_ASSERT_EQUAL(tok_decode_piece(t, TOK_NO_PREV, ID_ZHE_PAIR, &p, &len), 0);
    CU_ASSERT(len == 12 && memcmp(p, "<0xD0><0xB6>", 12) == 0);
    /* " " alone after BOS decodes to nothing. */
    CU_ASSERT_EQUAL(tok_decode_piece(t, TOK_BOS, ID_CHAR(' '), &p, &len), 0);
    CU_ASSERT_EQUAL(len, 0);
    /* Control tokens are not text; tok_piece still shows the raw strings. */
    CU_ASSERT_EQUAL(tok_decode_piece(t, TOK_NO_PREV, TOK_EOS, &p, &len), 0);
    CU_ASSERT_EQUAL(len, 0);
    CU_ASSERT_EQUAL(tok_piece(t, TOK_EOS, &p, &len), 0);
    CU_ASSERT(len == 6 && memcmp(p, "\n</s>\n", 6) == 0);
    CU_ASSERT_EQUAL(tok_piece(t, 3 + 0x41, &p, &len), 0);
    CU_ASSERT(len == 6 && memcmp(p, "<0x41>", 6) == 0);
    CU_ASSERT_EQUAL(tok_decode_piece(t, TOK_NO_PREV, TV_BASE_N, &p, &len), TANDEM_ERANGE);
    CU_ASSERT_EQUAL(tok_piece(t, TV_BASE_N, &p, &len), TANDEM_ERANGE);

    /* Round trip with BOS for text made of known pieces and fallbacks. */
    const char *texts[] = {"the thing \xC3\xA9! \xD1\x84 aab", " leading space", "x", "a\x80z"};
    for (int i = 0; i < 4; i++) {
        uint32_t ids[128];
        int n = encode_str(t, texts[i], 1, ids, 128);
        CU_ASSERT(n > 0);
        CU_ASSERT_EQUAL(tok_decode(t, ids, n, out, sizeof(out)), (int)strlen(texts[i]));
        CU_ASSERT_STRING_EQUAL(out, texts[i]);
    }
    tok_destroy(t);
    tv_free(&v);
}

/* Random text: vocabulary pieces, codepoints, stray bytes. */
static size_t random_text(uint64_t *rng, const struct tv *v, char *buf, size_t max)
{
    static const char *const bits[] = {"a",        "b",        "e",        "g",
                                       "h",        "i",        "n",        "t",
                                       " ",        "!",        "\xC3\xA9", "\xE2\x82\xAC",
                                       "\xC3\xBC", "\xD0\xB6", "\xD1\x84", "\xF0\x9F\x98\x80",
                                       "  "};
    size_t n = 0, target = rng_below(rng, (uint32_t)max);
    while (n < target) {
        uint32_t r = rng_below(rng, 10);
        const char *s;
        size_t len;
        char byte;
        if (r < 5) {
            s = bits[rng_below(rng, sizeof(bits) / sizeof(bits[0]))];
            len = strlen(s);
        } else if (r < 8) {
            int id = 259 + (int)rng_below(rng, (uint32_t)(v->n - 259));
            if (id == ID_NL) {
                continue;
            }
            s = v->s[id];
            len = (size_t)v->len[id];
        } else {
            byte = (char)(1 + rng_below(rng, 255));
            s = &byte;
            len = 1;
        }
        if (n + len > target) {
            break;
        }
        memcpy(buf + n, s, len);
        n += len;
    }
    buf[n] = '\0';
    return n;
}

static void test_l2c_random_vs_reference(void)
{
    uint64_t rng = g_seed;
    printf("\n  seed %llu\n", (unsigned long long)g_seed);
    enum { N_VOCABS = 6, N_TEXTS = 250, MAX_TEXT = 200 };
    char text[MAX_TEXT + 1];
    uint32_t want[MAX_TEXT + 3], got[MAX_TEXT + 3];
    int mismatches = 0, merges_seen = 0;
    for (int vi = 0; vi < N_VOCABS; vi++) {
        struct tv v;
        tv_base(&v);
        /* Empty pieces merge away in llama2.c: an empty BOS string, or an
         * empty byte piece for 0x01 (never a barrier). */
        if (vi % 3 == 1) {
            tv_set(&v, 1, "", 0);
        } else if (vi % 3 == 2) {
            tv_set(&v, 3 + 0x01, "", 0);
        }
        tv_random_merges(&v, &rng, 150 + 250 * vi);
        struct ref r;
        ref_init(&r, &v);
        struct tokenizer *t = tv_load(&v);
        CU_ASSERT_FATAL(t != NULL);
        for (int k = 0; k < N_TEXTS; k++) {
            size_t n = random_text(&rng, &v, text, MAX_TEXT);
            int bos = (int)rng_below(&rng, 2);
            int nw = ref_encode(&r, text, bos, 1, want);
            int ng = tok_encode(t, text, n, bos, got, MAX_TEXT + 3);
            merges_seen += (int)n + bos + (n > 0) - nw;
            if (!ids_equal(got, ng, want, nw)) {
                if (mismatches++ < 3) {
                    fprintf(stderr, "vocab %d text %d (%zu bytes) differs\n", vi, k, n);
                    print_ids("got ", got, ng);
                    print_ids("want", want, nw);
                }
            }
        }
        free(r.sorted);
        tok_destroy(t);
        tv_free(&v);
    }
    CU_ASSERT_EQUAL(mismatches, 0);
    CU_ASSERT(merges_seen > 1000); /* the texts really exercise merging */
}

/* 220 KB of text: newline-separated segments. No piece contains "\n" with
 * anything else, so no merge crosses a newline and the expected ids are the
 * reference's ids of each segment, the first with BOS and dummy prefix. */
static void test_l2c_large(void)
{
    uint64_t rng = g_seed ^ 0x5151;
    struct tv v;
    tv_base(&v);
    tv_random_merges(&v, &rng, 1500);
    struct ref r;
    ref_init(&r, &v);
    struct tokenizer *t = tv_load(&v);
    CU_ASSERT_FATAL(t != NULL);

    enum { NSEG = 24, SEGMAX = 400 };
    static char seg[NSEG][SEGMAX + 2];
    static uint32_t seg_ids[NSEG][SEGMAX + 4];
    int seg_n[NSEG];
    size_t seg_len[NSEG];
    for (int i = 0; i < NSEG; i++) {
        size_t n;
        do {
            n = random_text(&rng, &v, seg[i], SEGMAX);
        } while (n == 0 || (unsigned char)seg[i][0] >= 0x80 || seg[i][0] == '\n');
        seg[i][n] = '\n';
        seg[i][n + 1] = '\0';
        seg_len[i] = n + 1;
        seg_n[i] = ref_encode(&r, seg[i], 0, 0, seg_ids[i]);
    }
    size_t want_bytes = 220 * 1024;
    char *text = malloc(want_bytes + SEGMAX + 2);
    uint32_t *want = malloc(sizeof(uint32_t) * (want_bytes + SEGMAX + 4));
    size_t len = 0;
    int nw = 0;
    for (int k = 0; len < want_bytes; k++) {
        int i = (int)rng_below(&rng, NSEG);
        memcpy(text + len, seg[i], seg_len[i]);
        len += seg_len[i];
        if (k == 0) {
            nw = ref_encode(&r, seg[i], 1, 1, want);
        } else {
            memcpy(want + nw, seg_ids[i], sizeof(uint32_t) * (size_t)seg_n[i]);
            nw += seg_n[i];
        }
    }
    uint32_t *got = malloc(sizeof(uint32_t) * TOK_ENCODE_BOUND(len));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int ng = tok_encode(t, text, len, 1, got, (int)TOK_ENCODE_BOUND(len));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("\n  %zu bytes -> %d ids in %.2f ms\n", len, ng,
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    CU_ASSERT_EQUAL(ng, nw);
    CU_ASSERT(ids_equal(got, ng, want, nw));
    CU_ASSERT(ng < (int)len * 3 / 4); /* merges happened */
    /* Decode against a plain decoder over the test's own vocabulary. */
    size_t cap = 0;
    for (int i = 0; i < nw; i++) {
        cap += (size_t)v.len[want[i]];
    }
    char *back = malloc(cap + 1), *expect = malloc(cap + 1);
    size_t elen = ref_decode(&v, want, nw, expect);
    CU_ASSERT_EQUAL(tok_decode(t, got, ng, back, cap + 1), (int)elen);
    CU_ASSERT(memcmp(back, expect, elen) == 0);
    free(expect);
    /* The byte kind on the same text. */
    struct tokenizer *tb = NULL;
    CU_ASSERT_EQUAL_FATAL(tok_create_bytes(&tb), 0);
    CU_ASSERT_EQUAL(tok_encode(tb, text, len, 1, got, (int)TOK_ENCODE_BOUND(len)), (int)len + 1);
    CU_ASSERT_EQUAL(got[len], 3u + '\n');
    tok_destroy(tb);
    free(back);
    free(got);
    free(want);
    free(text);
    free(r.sorted);
    tok_destroy(t);
    tv_free(&v);
}

/* ---- bad files ----------------------------------------------------------- */

/* Runs tok_load_mem with stderr captured into buf. */
static int load_capture(const unsigned char *file, size_t size, int vocab, char *buf, size_t cap)
{
    struct tokenizer *t = NULL;
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    dup2(fileno(tmp), 2);
    int rc = tok_load_mem(&t, file, size, vocab, "bad.bin");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, cap - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
    tok_destroy(t);
    return rc;
}

static void test_bad_files(void)
{
    struct tv v;
    tv_base(&v);
    size_t size;
    unsigned char *file = tv_file(&v, &size);
    unsigned char *copy = malloc(size + 16);
    char log[4096], want[128];
    struct tokenizer *t = NULL;

    CU_ASSERT_EQUAL(tok_load_mem(&t, file, size, v.n, "good"), 0);
    tok_destroy(t);
    t = NULL;

    /* Every truncation fails cleanly, without reading past the end. */
    quiet_logs(1);
    int bad = 0;
    for (size_t cut = 0; cut < size; cut++) {
        struct guard g;
        unsigned char *p = guard_alloc(&g, cut);
        memcpy(p, file, cut);
        int rc = tok_load_mem(&t, p, cut, v.n, "cut");
        bad += rc != TANDEM_ETRUNCATED || t != NULL;
        guard_free(&g);
    }
    quiet_logs(0);
    CU_ASSERT_EQUAL(bad, 0);

    /* The error names the entry and its offset. */
    size_t off5 = entry_offset(file, 5);
    CU_ASSERT_EQUAL(load_capture(file, off5 + 10, v.n, log, sizeof(log)), TANDEM_ETRUNCATED);
    snprintf(want, sizeof(want), "entry 5 of %d at offset %zu", v.n, off5 + 8);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "ERROR"));

    memcpy(copy, file, size);
    put_i32(copy + off5 + 4, -1);
    CU_ASSERT_EQUAL(load_capture(copy, size, v.n, log, sizeof(log)), TANDEM_EFORMAT);
    snprintf(want, sizeof(want), "entry 5 at offset %zu has length -1", off5);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, want));

    memcpy(copy, file, size);
    put_i32(copy + off5 + 4, 0x7fffffff);
    CU_ASSERT_EQUAL(load_capture(copy, size, v.n, log, sizeof(log)), TANDEM_EFORMAT);

    /* An entry longer than the header's max_token_length (12). */
    memcpy(copy, file, size);
    put_i32(copy + off5 + 4, 13);
    CU_ASSERT_EQUAL(load_capture(copy, size, v.n, log, sizeof(log)), TANDEM_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "max_token_length 12"));

    int32_t mtls[] = {0, -1, TOK_MAX_PIECE + 1, INT32_MIN};
    for (int i = 0; i < 4; i++) {
        memcpy(copy, file, size);
        put_i32(copy, mtls[i]);
        CU_ASSERT_EQUAL(load_capture(copy, size, v.n, log, sizeof(log)), TANDEM_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(log, "max_token_length"));
    }

    /* The model says more entries than the file has. */
    CU_ASSERT_EQUAL(load_capture(file, size, v.n + 1, log, sizeof(log)), TANDEM_ETRUNCATED);
    snprintf(want, sizeof(want), "entry %d of %d at offset %zu", v.n, v.n + 1, size);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, want));

    /* Fewer: the rest is ignored with a warning and merges beyond are gone. */
    CU_ASSERT_EQUAL(load_capture(file, size, 300, log, sizeof(log)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "ignored"));
    CU_ASSERT_EQUAL(tok_load_mem(&t, file, size, 300, "short"), 0);
    /* ids >= 300 are gone: 't', 'h', 'e' fall back to byte tokens. */
    ASSERT_IDS(t, "the", 0, ID_CHAR(' '), 3 + 't', 3 + 'h', 3 + 'e');
    tok_destroy(t);
    t = NULL;

    quiet_logs(1);
    CU_ASSERT_EQUAL(tok_load_mem(&t, file, size, 258, "small"), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(tok_load_mem(&t, file, size, TOK_MAX_VOCAB + 1, "big"), TANDEM_EINVAL);
    quiet_logs(0);
    CU_ASSERT_EQUAL(tok_load_mem(NULL, file, size, v.n, "null"), TANDEM_EINVAL);
    CU_ASSERT_PTR_NULL(t);

    /* The file path variant. */
    char path[] = "/tmp/tandem_tok_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(write(fd, file, size), (ssize_t)size);
    close(fd);
    CU_ASSERT_EQUAL(tok_load(&t, path, v.n), 0);
    ASSERT_IDS(t, "the", 1, 1, ID_SP_THE);
    tok_destroy(t);
    t = NULL;
    fd = open(path, O_WRONLY | O_TRUNC);
    CU_ASSERT_EQUAL(write(fd, file, 100), 100);
    close(fd);
    quiet_logs(1);
    CU_ASSERT_EQUAL(tok_load(&t, path, v.n), TANDEM_ETRUNCATED);
    unlink(path);
    CU_ASSERT_EQUAL(tok_load(&t, path, v.n), TANDEM_ENOENT);
    CU_ASSERT(tok_load(&t, "/", v.n) < 0);
    quiet_logs(0);
    CU_ASSERT_PTR_NULL(t);

    /* Duplicates resolve to the lowest id; a vocabulary without " " uses
     * <0x20> as the dummy prefix. */
    struct tv w;
    tv_base(&w);
    w.s[ID_CHAR(' ')][0] = '~'; /* now "~" twice: ids 259 and 353 */
    unsigned char *wf = tv_file(&w, &size);
    quiet_logs(1);
    CU_ASSERT_EQUAL(tok_load_mem(&t, wf, size, w.n, "dups"), 0);
    quiet_logs(0);
    ASSERT_IDS(t, "~~", 0, 3 + ' ', ID_CHAR(' '), ID_CHAR(' '));
    tok_destroy(t);
    free(wf);
    tv_free(&w);

    free(copy);
    free(file);
    tv_free(&v);
}

/* ---- fuzz ---------------------------------------------------------------- */

static void check_ids(const struct tokenizer *t, const uint32_t *ids, int n, int *bad)
{
    for (int i = 0; i < n; i++) {
        *bad += ids[i] >= (uint32_t)tok_vocab_size(t);
    }
}

static void test_fuzz_text(void)
{
    uint64_t rng = g_seed ^ 0xF00D;
    struct tv v;
    tv_base(&v);
    tv_random_merges(&v, &rng, 800);
    struct tokenizer *tl = tv_load(&v);
    struct tokenizer *tb = NULL;
    CU_ASSERT_EQUAL_FATAL(tok_create_bytes(&tb), 0);
    CU_ASSERT_FATAL(tl != NULL);
    int bad = 0, roundtrip_bad = 0;
    enum { MAXN = 3000 };
    static uint32_t ids[MAXN + 2];
    static char back[8 * MAXN + 16]; /* merged byte pieces decode as text */
    for (int iter = 0; iter < 2000; iter++) {
        size_t n = rng_below(&rng, iter < 1900 ? 300 : MAXN);
        struct guard g;
        unsigned char *p = guard_alloc(&g, n);
        uint32_t mode = rng_below(&rng, 3);
        for (size_t i = 0; i < n; i++) {
            /* raw bytes, UTF-8-heavy bytes, or bytes around continuation */
            p[i] = mode == 0 ? (unsigned char)rng_next(&rng)
                   : mode == 1
                       ? (unsigned char)(0x80 + rng_below(&rng, 0x80))
                       : (unsigned char)"a \x80\xBF\xC3\xE2\xF0\xF4\xFF\0"[rng_below(&rng, 10)];
        }
        int bos = (int)rng_below(&rng, 2);
        int k = tok_encode(tl, (const char *)p, n, bos, ids, MAXN + 2);
        bad += k < 0;
        if (k > 0) {
            check_ids(tl, ids, k, &bad);
            int d = tok_decode(tl, ids, k, back, sizeof(back));
            bad += d < 0;
        }
        k = tok_encode(tb, (const char *)p, n, bos, ids, MAXN + 2);
        bad += k != (int)n + bos;
        if (k >= 0) {
            check_ids(tb, ids, k, &bad);
            int d = tok_decode(tb, ids, k, back, sizeof(back));
            roundtrip_bad += d != (int)n || memcmp(back, p, n) != 0;
        }
        /* Random ids decode without crashing; out-of-range ones are refused. */
        for (int i = 0; i < 16; i++) {
            ids[i] = rng_below(&rng, (uint32_t)v.n + 8);
        }
        int d = tok_decode(tl, ids, 16, back, sizeof(back));
        int any_out = 0;
        for (int i = 0; i < 16; i++) {
            any_out |= ids[i] >= (uint32_t)v.n;
        }
        bad += any_out ? d != TANDEM_ERANGE : d < 0;
        guard_free(&g);
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(roundtrip_bad, 0);
    tok_destroy(tl);
    tok_destroy(tb);
    tv_free(&v);
}

static void test_fuzz_file(void)
{
    uint64_t rng = g_seed ^ 0xBEEF;
    struct tv v;
    tv_base(&v);
    tv_random_merges(&v, &rng, 100);
    size_t size;
    unsigned char *file = tv_file(&v, &size);
    int bad = 0, loaded = 0;
    quiet_logs(1);
    for (int iter = 0; iter < 1500; iter++) {
        size_t n = size + (rng_below(&rng, 4) == 0 ? rng_below(&rng, 64) : 0);
        struct guard g;
        unsigned char *p = guard_alloc(&g, n);
        memcpy(p, file, size);
        for (size_t i = size; i < n; i++) {
            p[i] = (unsigned char)rng_next(&rng);
        }
        int muts = 1 + (int)rng_below(&rng, 4);
        for (int m = 0; m < muts; m++) {
            uint32_t kind = rng_below(&rng, 4);
            if (n == 0) {
                break;
            }
            size_t at = rng_below(&rng, (uint32_t)n);
            if (kind == 0) {
                p[at] ^= (unsigned char)(1u << rng_below(&rng, 8));
            } else if (kind == 1 && at + 4 <= n) {
                /* a plausible length or header field */
                int32_t x = (int32_t)rng_below(&rng, 40) - 8;
                if (rng_below(&rng, 4) == 0) {
                    x = (int32_t)rng_next(&rng);
                }
                put_i32(p + at, x);
            } else if (kind == 2) {
                n = at; /* truncate: the tail stays mapped but out of bounds */
            } else {
                p[at] = (unsigned char)rng_next(&rng);
            }
        }
        /* Keep the end of the buffer at the guard page. */
        unsigned char *q = g.map + (g.maplen - (size_t)sysconf(_SC_PAGESIZE)) - n;
        memmove(q, p, n);
        int vocab = rng_below(&rng, 3) == 0 ? 259 + (int)rng_below(&rng, 300) : v.n;
        struct tokenizer *t = NULL;
        int rc = tok_load_mem(&t, q, n, vocab, "fuzz");
        if (rc == 0) {
            loaded++;
            uint32_t ids[300];
            char text[256], back[4096];
            for (int k = 0; k < 8; k++) {
                size_t tl = random_text(&rng, &v, text, 200);
                int c = tok_encode(t, text, tl, 1, ids, 300);
                bad += c < 0;
                if (c > 0) {
                    check_ids(t, ids, c, &bad);
                    int need = tok_decode(t, ids, c, NULL, 0);
                    bad += need < 0;
                    if (need >= 0 && (size_t)need < sizeof(back)) {
                        bad += tok_decode(t, ids, c, back, sizeof(back)) != need;
                    }
                }
            }
        } else {
            bad += rc != TANDEM_EFORMAT && rc != TANDEM_ETRUNCATED;
            bad += t != NULL;
        }
        tok_destroy(t);
        guard_free(&g);
    }
    quiet_logs(0);
    printf("\n  %d of 1500 mutated files loaded\n", loaded);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(loaded > 0);
    free(file);
    tv_free(&v);
}

/* ---- streaming UTF-8 ----------------------------------------------------- */

static int push_str(struct tok_utf8 *s, const char *in, size_t n, char *out)
{
    return tok_utf8_push(s, in, n, out, TOK_UTF8_OUT_MAX(n));
}

#define FFFD "\xEF\xBF\xBD"

static void expect_push(const char *in, size_t n, const char *want, size_t want_n, unsigned held)
{
    struct tok_utf8 s;
    char out[64];
    tok_utf8_init(&s);
    int k = push_str(&s, in, n, out);
    CU_ASSERT_EQUAL(k, (int)want_n);
    CU_ASSERT(k == (int)want_n && memcmp(out, want, want_n) == 0);
    CU_ASSERT_EQUAL(s.nheld, held);
}

static void test_utf8_stream(void)
{
    struct tok_utf8 s;
    char out[64];
    tok_utf8_init(&s);
    CU_ASSERT_EQUAL(push_str(&s, "h\xC3", 2, out), 1);
    CU_ASSERT_EQUAL(s.nheld, 1u);
    CU_ASSERT_EQUAL(push_str(&s, "\xA9!", 2, out), 3);
    CU_ASSERT(memcmp(out, "\xC3\xA9!", 3) == 0);
    /* 😀 one byte at a time. */
    const char *emoji = "\xF0\x9F\x98\x80";
    int got[4];
    for (int i = 0; i < 4; i++) {
        got[i] = push_str(&s, emoji + i, 1, out);
    }
    CU_ASSERT(got[0] == 0 && got[1] == 0 && got[2] == 0 && got[3] == 4);
    CU_ASSERT(memcmp(out, emoji, 4) == 0);
    CU_ASSERT_EQUAL(tok_utf8_flush(&s, out, sizeof(out)), 0);

    /* Ill-formed input: one U+FFFD per maximal subpart. */
    expect_push("\xFF", 1, FFFD, 3, 0);
    expect_push("\xC0\x80", 2, FFFD FFFD, 6, 0);
    expect_push("\xE0\x80", 2, FFFD FFFD, 6, 0);
    expect_push("\xED\xA0\x80", 3, FFFD FFFD FFFD, 9, 0);
    expect_push("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD, 12, 0);
    expect_push("\xE2\x82"
                "A",
                3, FFFD "A", 4, 0);
    expect_push("a\xF0\x9F\x98", 4, "a", 1, 3);
    expect_push("\xE0\xA0", 2, "", 0, 2);
    expect_push("\xF0\x8F", 2, FFFD FFFD, 6, 0); /* overlong 4-byte lead */
    expect_push("x\0y", 3, "x\0y", 3, 0);

    /* Held bytes then a bad continuation. */
    tok_utf8_init(&s);
    CU_ASSERT_EQUAL(push_str(&s, "\xE2\x82", 2, out), 0);
    CU_ASSERT_EQUAL(push_str(&s, "\xE2\x82\xAC", 3, out), 6);
    CU_ASSERT(memcmp(out, FFFD "\xE2\x82\xAC", 6) == 0);
    /* Flush of an unfinished character. */
    CU_ASSERT_EQUAL(push_str(&s, "\xC3", 1, out), 0);
    CU_ASSERT_EQUAL(tok_utf8_flush(&s, out, 2), TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(tok_utf8_flush(&s, out, sizeof(out)), 3);
    CU_ASSERT(memcmp(out, FFFD, 3) == 0);
    CU_ASSERT_EQUAL(s.nheld, 0u);
    /* Too small an output leaves the state alone. */
    CU_ASSERT_EQUAL(push_str(&s, "\xC3", 1, out), 0);
    CU_ASSERT_EQUAL(tok_utf8_push(&s, "\xA9", 1, out, 3), TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(s.nheld, 1u);

    /* Streaming a byte-level and a llama2.c decode token by token: every
     * chunk is valid UTF-8 and the chunks add up to the text. */
    const char text[] = "caf\xC3\xA9 \xD1\x84\xE2\x82\xAC \xF0\x9F\x98\x80 the thing";
    size_t n = sizeof(text) - 1;
    struct tokenizer *tb = NULL;
    CU_ASSERT_EQUAL_FATAL(tok_create_bytes(&tb), 0);
    struct tv v;
    tv_base(&v);
    struct tokenizer *tl = tv_load(&v);
    CU_ASSERT_FATAL(tl != NULL);
    struct tokenizer *ts[2] = {tb, tl};
    for (int which = 0; which < 2; which++) {
        uint32_t ids[128];
        int k = tok_encode(ts[which], text, n, 1, ids, 128);
        CU_ASSERT_FATAL(k > 0);
        char all[256];
        static char chunk[TOK_UTF8_OUT_MAX(TOK_MAX_PIECE)];
        size_t total = 0;
        int invalid = 0;
        tok_utf8_init(&s);
        for (int i = 0; i < k; i++) {
            int c = tok_stream_token(ts[which], &s, i ? ids[i - 1] : TOK_NO_PREV, ids[i], chunk,
                                     sizeof(chunk));
            CU_ASSERT_FATAL(c >= 0);
            invalid += !utf8_valid((unsigned char *)chunk, (size_t)c);
            memcpy(all + total, chunk, (size_t)c);
            total += (size_t)c;
        }
        CU_ASSERT_EQUAL(tok_utf8_flush(&s, chunk, sizeof(chunk)), 0);
        CU_ASSERT_EQUAL(invalid, 0);
        CU_ASSERT_EQUAL(total, n);
        CU_ASSERT(memcmp(all, text, n) == 0);
    }
    CU_ASSERT_EQUAL(tok_stream_token(tb, &s, TOK_NO_PREV, 9999, out, sizeof(out)), TANDEM_ERANGE);

    /* Random bytes in random splits always give valid UTF-8. */
    uint64_t rng = g_seed ^ 0xABC;
    int invalid = 0;
    for (int iter = 0; iter < 2000; iter++) {
        unsigned char in[64];
        size_t len = rng_below(&rng, 64);
        for (size_t i = 0; i < len; i++) {
            in[i] = (unsigned char)"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xFF\x80"
                                   "a"[rng_below(&rng, 12)];
        }
        tok_utf8_init(&s);
        char buf[TOK_UTF8_OUT_MAX(64)];
        size_t at = 0;
        while (at < len) {
            size_t step = 1 + rng_below(&rng, 5);
            if (step > len - at) {
                step = len - at;
            }
            int c = tok_utf8_push(&s, (const char *)in + at, step, buf, sizeof(buf));
            invalid += c < 0 || !utf8_valid((unsigned char *)buf, (size_t)c);
            at += step;
        }
        int c = tok_utf8_flush(&s, buf, sizeof(buf));
        invalid += c < 0 || !utf8_valid((unsigned char *)buf, (size_t)c);
    }
    CU_ASSERT_EQUAL(invalid, 0);
    tok_destroy(tb);
    tok_destroy(tl);
    tv_free(&v);
}

/* ---- threads ------------------------------------------------------------- */

struct thr_arg {
    const struct tokenizer *t;
    const char *text;
    size_t len;
    uint32_t *ids;
    int n;
};

static void *thr_encode(void *p)
{
    struct thr_arg *a = p;
    for (int rep = 0; rep < 20; rep++) {
        a->n = tok_encode(a->t, a->text, a->len, 1, a->ids, (int)TOK_ENCODE_BOUND(a->len));
    }
    return NULL;
}

static void test_threads(void)
{
    uint64_t rng = g_seed ^ 0x7777;
    struct tv v;
    tv_base(&v);
    tv_random_merges(&v, &rng, 600);
    struct tokenizer *t = tv_load(&v);
    CU_ASSERT_FATAL(t != NULL);
    size_t len = 0;
    char *text = malloc(40000 + 300);
    while (len < 40000) {
        len += random_text(&rng, &v, text + len, 250);
    }
    uint32_t *ref = malloc(sizeof(uint32_t) * TOK_ENCODE_BOUND(len));
    int nref = tok_encode(t, text, len, 1, ref, (int)TOK_ENCODE_BOUND(len));
    CU_ASSERT(nref > 0);
    pthread_t th[2];
    struct thr_arg args[2];
    for (int i = 0; i < 2; i++) {
        args[i] =
            (struct thr_arg){t, text, len, malloc(sizeof(uint32_t) * TOK_ENCODE_BOUND(len)), 0};
        pthread_create(&th[i], NULL, thr_encode, &args[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CU_ASSERT(ids_equal(args[i].ids, args[i].n, ref, nref));
        free(args[i].ids);
    }
    free(ref);
    free(text);
    tok_destroy(t);
    tv_free(&v);
}

int main(void)
{
    const char *env = getenv("TANDEM_TEST_SEED");
    g_seed =
        env ? strtoull(env, NULL, 10) : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)getpid();
    printf("test_tokenizer seed %llu (replay: TANDEM_TEST_SEED=%llu)\n", (unsigned long long)g_seed,
           (unsigned long long)g_seed);
    log_set_level(LOG_LEVEL_WARN);

    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("tokenizer", NULL, NULL);
    CU_add_test(s, "bytes_encode", test_bytes_encode);
    CU_add_test(s, "bytes_decode", test_bytes_decode);
    CU_add_test(s, "l2c_fixed", test_l2c_fixed);
    CU_add_test(s, "l2c_decode", test_l2c_decode);
    CU_add_test(s, "l2c_random_vs_reference", test_l2c_random_vs_reference);
    CU_add_test(s, "l2c_large_220k", test_l2c_large);
    CU_add_test(s, "bad_files", test_bad_files);
    CU_add_test(s, "fuzz_text", test_fuzz_text);
    CU_add_test(s, "fuzz_file", test_fuzz_file);
    CU_add_test(s, "utf8_stream", test_utf8_stream);
    CU_add_test(s, "threads", test_threads);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
