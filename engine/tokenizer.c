/* Tokenizers: byte-level and llama2.c tokenizer.bin. See tokenizer.h.
 *
 * The llama2.c encoder gives the ids of llama2.c run.c encode() without its
 * O(n^2) merge scan, in three layers (docs/engine.md "## tokenizer"):
 *  - Barriers: a merge result is a vocabulary string, so two symbols whose
 *    boundary bytes (last of the left, first of the right) never occur next
 *    to each other in any piece can never be joined. The symbols between
 *    barriers form independent segments, merged one at a time.
 *  - Short segments run llama2.c's own scan on a small array, memoised per
 *    call by their initial ids (text repeats its words).
 *  - Long segments: symbols form a doubly linked list; every adjacent pair
 *    that can merge has one entry in an indexed binary min-heap keyed by
 *    (score descending, index of its left symbol ascending). llama2.c merges
 *    the pair with the highest score, the leftmost among equals (a
 *    left-to-right scan with strict >); the heap top is that pair because
 *    merging never reorders symbols. O(n log n) whatever the input.
 * Vocabulary strings are found by a polynomial hash modulo the Mersenne
 * prime 2^61-1, whose value for a concatenation follows from the halves'
 * hashes in O(1): H(a||b) = H(a) * B^|b| + H(b). */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tandem_err.h"

#define MOD       "tok"
#define HMOD      ((1ULL << 61) - 1)
#define HBASE     0x0f3d5b79a2c4e681ULL /* < 2^61 - 1 */
#define KEY_NEVER UINT32_MAX            /* merge_key of an id that llama2.c never merges into */

struct slot {
    uint64_t h;  /* hash of the string */
    uint32_t id; /* id + 1; 0 marks an empty slot */
    uint32_t len;
};

struct tokenizer {
    enum tok_kind kind;
    int vocab_size;
    unsigned char bytes[256]; /* bytes[b] == b: one-byte pieces for decode */

    /* llama2.c kind only. */
    char *arena;           /* every piece, back to back */
    uint32_t *off;         /* (vocab_size) piece i starts at arena + off[i] */
    uint32_t *len;         /* (vocab_size) length up to the first NUL, as strcmp sees it */
    float *score;          /* (vocab_size) */
    uint64_t *hash;        /* (vocab_size) H(piece i) */
    uint64_t *pw;          /* (vocab_size) HBASE^len[i] mod 2^61-1 */
    uint32_t *merge_key;   /* (vocab_size) ~order(score), KEY_NEVER if never merged into */
    int16_t *byte_val;     /* (vocab_size) b when piece i is exactly "<0xHH>", else -1 */
    uint16_t *edge;        /* (vocab_size) first byte << 8 | last byte of piece i */
    uint64_t bigram[1024]; /* bit x << 8 | y: byte x then byte y occurs in some piece */
    struct slot *slots;    /* (nslots) open addressing, linear probing */
    uint32_t nslots;       /* power of two >= 2 * vocab_size */
    int slot_shift;        /* 64 - log2(nslots) */
    int32_t byte_id[256];  /* id of the one-byte string b, or -1 */
    uint32_t space_id;     /* id of " " (the dummy prefix) */
    int max_token_length;
};

/* ---- hashing ----------------------------------------------------------- */

static inline uint64_t hmul(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    uint64_t s = ((uint64_t)r & HMOD) + (uint64_t)(r >> 61);
    s = (s & HMOD) + (s >> 61);
    return s >= HMOD ? s - HMOD : s;
}

static inline uint64_t hadd(uint64_t a, uint64_t b)
{
    uint64_t s = a + b; /* both < 2^61: no overflow */
    return s >= HMOD ? s - HMOD : s;
}

static inline uint64_t hstep(uint64_t h, unsigned char c)
{
    /* c + 1 so that leading zero bytes still change the hash. */
    return hadd(hmul(h, HBASE), (uint64_t)c + 1);
}

static uint64_t hbytes(const unsigned char *s, size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        h = hstep(h, s[i]);
    }
    return h;
}

static inline uint32_t slot_index(const struct tokenizer *t, uint64_t h)
{
    return (uint32_t)((h * 0x9E3779B97F4A7C15ULL) >> t->slot_shift);
}

static inline const char *piece_of(const struct tokenizer *t, uint32_t id)
{
    return t->arena + t->off[id];
}

/* Id of the string s[0..n) with hash h, or -1. */
static int32_t lookup(const struct tokenizer *t, const char *s, uint32_t n, uint64_t h)
{
    uint32_t mask = t->nslots - 1;
    for (uint32_t i = slot_index(t, h);; i = (i + 1) & mask) {
        const struct slot *sl = &t->slots[i];
        if (sl->id == 0) {
            return -1;
        }
        if (sl->h == h && sl->len == n && memcmp(piece_of(t, sl->id - 1), s, n) == 0) {
            return (int32_t)(sl->id - 1);
        }
    }
}

/* Id of the concatenation of pieces a and b, or -1. */
static inline int32_t lookup_pair(const struct tokenizer *t, uint32_t a, uint32_t b)
{
    uint64_t h = hadd(hmul(t->hash[a], t->pw[b]), t->hash[b]);
    uint32_t la = t->len[a], lb = t->len[b], n = la + lb;
    uint32_t mask = t->nslots - 1;
    for (uint32_t i = slot_index(t, h);; i = (i + 1) & mask) {
        const struct slot *sl = &t->slots[i];
        if (sl->id == 0) {
            return -1;
        }
        if (sl->h == h && sl->len == n) {
            const char *c = piece_of(t, sl->id - 1);
            if (memcmp(c, piece_of(t, a), la) == 0 && memcmp(c + la, piece_of(t, b), lb) == 0) {
                return (int32_t)(sl->id - 1);
            }
        }
    }
}

/* Maps a score to a uint32 that sorts like it, inverted so that a min-heap
 * pops the highest score first. -0 counts as +0 (llama2.c compares with >). */
static uint32_t score_key(float f)
{
    if (f == 0.0f) {
        f = 0.0f;
    }
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* ---- creation ------------------------------------------------------------ */

static struct tokenizer *tok_alloc(enum tok_kind kind, int vocab_size)
{
    struct tokenizer *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return NULL;
    }
    t->kind = kind;
    t->vocab_size = vocab_size;
    for (int b = 0; b < 256; b++) {
        t->bytes[b] = (unsigned char)b;
    }
    return t;
}

int tok_create_bytes_n(struct tokenizer **out, int vocab_size)
{
    if (out == NULL || vocab_size < TOK_MIN_VOCAB || vocab_size > TOK_MAX_VOCAB) {
        return TANDEM_EINVAL;
    }
    struct tokenizer *t = tok_alloc(TOK_KIND_BYTES, vocab_size);
    if (t == NULL) {
        return TANDEM_ENOMEM;
    }
    *out = t;
    return 0;
}

int tok_create_bytes(struct tokenizer **out)
{
    return tok_create_bytes_n(out, TOK_BYTES_VOCAB);
}

void tok_destroy(struct tokenizer *t)
{
    if (t == NULL) {
        return;
    }
    free(t->slots);
    free(t->edge);
    free(t->byte_val);
    free(t->merge_key);
    free(t->pw);
    free(t->hash);
    free(t->score);
    free(t->len);
    free(t->off);
    free(t->arena);
    free(t);
}

static int32_t rd_i32(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

static float rd_f32(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* b when s[0..n) is exactly "<0xHH>", else -1. */
static int parse_byte_piece(const char *s, size_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') {
        return -1;
    }
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

/* Builds the string table and per-id tables once the pieces are in place. */
static int build_index(struct tokenizer *t, const char *name)
{
    uint32_t v = (uint32_t)t->vocab_size;
    uint32_t nslots = 1;
    int bits = 0;
    while (nslots < 2 * v) {
        nslots <<= 1;
        bits++;
    }
    t->nslots = nslots;
    t->slot_shift = 64 - bits;
    t->slots = calloc(nslots, sizeof(*t->slots));
    t->hash = malloc(v * sizeof(*t->hash));
    t->pw = malloc(v * sizeof(*t->pw));
    t->merge_key = malloc(v * sizeof(*t->merge_key));
    t->byte_val = malloc(v * sizeof(*t->byte_val));
    t->edge = malloc(v * sizeof(*t->edge));
    if (t->slots == NULL || t->hash == NULL || t->pw == NULL || t->merge_key == NULL ||
        t->byte_val == NULL || t->edge == NULL) {
        return TANDEM_ENOMEM;
    }
    /* HBASE^k for every length up to the longest piece. */
    uint64_t pows[TOK_MAX_PIECE + 1];
    pows[0] = 1;
    for (int k = 1; k <= TOK_MAX_PIECE; k++) {
        pows[k] = hmul(pows[k - 1], HBASE);
    }
    int dups = 0, bad_bytes = 0;
    for (uint32_t i = 0; i < v; i++) {
        const char *p = piece_of(t, i);
        uint32_t n = t->len[i];
        t->hash[i] = hbytes((const unsigned char *)p, n);
        t->pw[i] = pows[n];
        float sc = t->score[i];
        t->merge_key[i] = sc > -1e10f ? score_key(sc) : KEY_NEVER;
        t->byte_val[i] = (int16_t)parse_byte_piece(p, n);
        const unsigned char *up = (const unsigned char *)p;
        t->edge[i] = n > 0 ? (uint16_t)(up[0] << 8 | up[n - 1]) : 0;
        for (uint32_t k = 0; k + 1 < n; k++) {
            uint32_t pair = (uint32_t)up[k] << 8 | up[k + 1];
            t->bigram[pair >> 6] |= 1ULL << (pair & 63);
        }
        if (i >= TOK_BYTE_BASE && i < TOK_BYTE_BASE + 256 &&
            t->byte_val[i] != (int16_t)(i - TOK_BYTE_BASE)) {
            bad_bytes++;
        }
        /* Insert unless the string is already there: the lowest id wins. */
        if (lookup(t, p, n, t->hash[i]) >= 0) {
            dups++;
            continue;
        }
        uint32_t mask = nslots - 1, s = slot_index(t, t->hash[i]);
        while (t->slots[s].id != 0) {
            s = (s + 1) & mask;
        }
        t->slots[s] = (struct slot){.h = t->hash[i], .id = i + 1, .len = n};
    }
    if (dups > 0) {
        LOG_WARN(MOD, "%s: %d duplicate vocabulary strings; the lowest id of each is used", name,
                 dups);
    }
    if (bad_bytes > 0) {
        LOG_WARN(MOD,
                 "%s: %d of ids 3..258 are not the byte pieces <0x00>..<0xFF>; byte fallback "
                 "still uses id = byte + 3",
                 name, bad_bytes);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = lookup(t, &c, 1, hbytes((const unsigned char *)&c, 1));
    }
    int32_t sp = t->byte_id[' '];
    if (sp < 0) {
        LOG_WARN(MOD, "%s: no \" \" piece; the dummy prefix is the byte token <0x20>", name);
        sp = (int32_t)(TOK_BYTE_BASE + ' ');
    }
    t->space_id = (uint32_t)sp;
    return 0;
}

int tok_load_mem(struct tokenizer **out, const void *data, size_t size, int vocab_size,
                 const char *name)
{
    if (name == NULL) {
        name = "tokenizer";
    }
    if (out == NULL || (data == NULL && size > 0)) {
        return TANDEM_EINVAL;
    }
    if (vocab_size < TOK_MIN_VOCAB || vocab_size > TOK_MAX_VOCAB) {
        LOG_ERROR(MOD, "%s: vocab_size %d outside [%d, %d]", name, vocab_size, TOK_MIN_VOCAB,
                  TOK_MAX_VOCAB);
        return TANDEM_EINVAL;
    }
    if (size > TOK_MAX_FILE) {
        LOG_ERROR(MOD, "%s: %zu bytes, over the %u byte limit", name, size, TOK_MAX_FILE);
        return TANDEM_ETOOBIG;
    }
    const unsigned char *p = data;
    if (size < 4) {
        LOG_ERROR(MOD, "%s: truncated at offset 0: need 4 bytes of max_token_length, have %zu",
                  name, size);
        return TANDEM_ETRUNCATED;
    }
    int32_t mtl = rd_i32(p);
    if (mtl < 1 || mtl > TOK_MAX_PIECE) {
        LOG_ERROR(MOD, "%s: max_token_length %d at offset 0 is outside [1, %d]", name, (int)mtl,
                  TOK_MAX_PIECE);
        return TANDEM_EFORMAT;
    }
    /* Pass 1: validate every entry and size the arena. */
    size_t pos = 4, text_bytes = 0;
    for (int i = 0; i < vocab_size; i++) {
        if (size - pos < 8) {
            LOG_ERROR(MOD,
                      "%s: truncated in entry %d of %d at offset %zu: need 8 bytes of score and "
                      "length, have %zu",
                      name, i, vocab_size, pos, size - pos);
            return TANDEM_ETRUNCATED;
        }
        int32_t n = rd_i32(p + pos + 4);
        if (n < 0 || n > mtl) {
            LOG_ERROR(MOD,
                      "%s: entry %d at offset %zu has length %d, outside [0, max_token_length %d]",
                      name, i, pos, (int)n, (int)mtl);
            return TANDEM_EFORMAT;
        }
        pos += 8;
        if (size - pos < (size_t)n) {
            LOG_ERROR(MOD,
                      "%s: truncated in entry %d of %d at offset %zu: need %d bytes of text, "
                      "have %zu",
                      name, i, vocab_size, pos, (int)n, size - pos);
            return TANDEM_ETRUNCATED;
        }
        pos += (size_t)n;
        text_bytes += (size_t)n;
    }
    if (pos < size) {
        LOG_WARN(MOD,
                 "%s: %zu bytes after entry %d ignored (a larger vocabulary than the model's?)",
                 name, size - pos, vocab_size - 1);
    }

    int rc = TANDEM_ENOMEM;
    struct tokenizer *t = tok_alloc(TOK_KIND_LLAMA2C, vocab_size);
    if (t == NULL) {
        return TANDEM_ENOMEM;
    }
    t->max_token_length = mtl;
    t->arena = malloc(text_bytes + 1);
    t->off = malloc((size_t)vocab_size * sizeof(*t->off));
    t->len = malloc((size_t)vocab_size * sizeof(*t->len));
    t->score = malloc((size_t)vocab_size * sizeof(*t->score));
    if (t->arena == NULL || t->off == NULL || t->len == NULL || t->score == NULL) {
        goto fail;
    }
    /* Pass 2: copy. A piece is used up to its first NUL, as llama2.c's C
     * strings are. */
    pos = 4;
    size_t at = 0;
    for (int i = 0; i < vocab_size; i++) {
        t->score[i] = rd_f32(p + pos);
        size_t n = (size_t)rd_i32(p + pos + 4);
        pos += 8;
        memcpy(t->arena + at, p + pos, n);
        t->off[i] = (uint32_t)at;
        t->len[i] = (uint32_t)strnlen(t->arena + at, n);
        at += n;
        pos += n;
    }
    rc = build_index(t, name);
    if (rc != 0) {
        goto fail;
    }
    *out = t;
    return 0;

fail:
    tok_destroy(t);
    return rc;
}

int tok_load(struct tokenizer **out, const char *path, int vocab_size)
{
    if (out == NULL || path == NULL) {
        return TANDEM_EINVAL;
    }
    int rc;
    unsigned char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        LOG_ERROR(MOD, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT ? TANDEM_ENOENT : TANDEM_EIO;
    }
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) {
        size = ftell(f);
    }
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        LOG_ERROR(MOD, "%s: cannot determine the file size: %s", path, strerror(errno));
        rc = TANDEM_EIO;
        goto out_close;
    }
    if ((unsigned long)size > TOK_MAX_FILE) {
        LOG_ERROR(MOD, "%s: %ld bytes, over the %u byte limit", path, size, TOK_MAX_FILE);
        rc = TANDEM_ETOOBIG;
        goto out_close;
    }
    buf = malloc((size_t)size + 1);
    if (buf == NULL) {
        rc = TANDEM_ENOMEM;
        goto out_close;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        LOG_ERROR(MOD, "%s: read error", path);
        rc = TANDEM_EIO;
        goto out_free;
    }
    rc = tok_load_mem(out, buf, (size_t)size, vocab_size, path);
out_free:
    free(buf);
out_close:
    fclose(f);
    return rc;
}

enum tok_kind tok_kind(const struct tokenizer *t)
{
    return t->kind;
}

int tok_vocab_size(const struct tokenizer *t)
{
    return t->vocab_size;
}

int tok_bos(const struct tokenizer *t)
{
    (void)t;
    return (int)TOK_BOS;
}

int tok_eos(const struct tokenizer *t)
{
    (void)t;
    return (int)TOK_EOS;
}

/* ---- encode -------------------------------------------------------------- */

/* Indexed binary min-heap of merge candidates. heap[] holds keys
 * (merge_key << 32 | left symbol index); hpos[sym] is the heap slot of the
 * pair whose left symbol is sym, or -1. */
struct merge_heap {
    uint64_t *heap;
    int32_t *hpos;
    int n;
};

static inline void heap_set(struct merge_heap *h, int i, uint64_t key)
{
    h->heap[i] = key;
    h->hpos[(uint32_t)key] = i;
}

static void heap_up(struct merge_heap *h, int i)
{
    uint64_t key = h->heap[i];
    while (i > 0) {
        int parent = (i - 1) >> 1;
        if (h->heap[parent] <= key) {
            break;
        }
        heap_set(h, i, h->heap[parent]);
        i = parent;
    }
    heap_set(h, i, key);
}

static void heap_down(struct merge_heap *h, int i)
{
    uint64_t key = h->heap[i];
    int n = h->n;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) {
            break;
        }
        if (c + 1 < n && h->heap[c + 1] < h->heap[c]) {
            c++;
        }
        if (key <= h->heap[c]) {
            break;
        }
        heap_set(h, i, h->heap[c]);
        i = c;
    }
    heap_set(h, i, key);
}

static void heap_remove(struct merge_heap *h, uint32_t sym)
{
    int i = h->hpos[sym];
    if (i < 0) {
        return;
    }
    h->hpos[sym] = -1;
    h->n--;
    if (i == h->n) {
        return;
    }
    uint64_t last = h->heap[h->n];
    heap_set(h, i, last);
    if (i > 0 && h->heap[(i - 1) >> 1] > last) {
        heap_up(h, i);
    } else {
        heap_down(h, i);
    }
}

/* Inserts, re-keys or removes the pair whose left symbol is sym, key being
 * its new key or 0 when the pair cannot merge. */
static void heap_update(struct merge_heap *h, uint32_t sym, uint64_t key)
{
    int i = h->hpos[sym];
    if (key == 0) {
        heap_remove(h, sym);
    } else if (i < 0) {
        i = h->n++;
        heap_set(h, i, key);
        heap_up(h, i);
    } else {
        uint64_t old = h->heap[i];
        heap_set(h, i, key);
        if (key < old) {
            heap_up(h, i);
        } else {
            heap_down(h, i);
        }
    }
}

/* Merge scratch for n symbols: one allocation. */
struct merge_scratch {
    uint32_t *id;  /* (n) token id of each live symbol */
    int32_t *next; /* (n) next live symbol or -1 */
    int32_t *prev; /* (n) previous live symbol or -1 */
    uint32_t *pid; /* (n) id the pair (sym, next[sym]) merges into */
    struct merge_heap h;
};

/* The heap key of the pair (l, next[l]), setting pid[l], or 0 when the pair
 * cannot merge. */
static inline uint64_t pair_key(const struct tokenizer *t, struct merge_scratch *m, int32_t l)
{
    int32_t r = m->next[l];
    if (r < 0) {
        return 0;
    }
    int32_t c = lookup_pair(t, m->id[l], m->id[r]);
    if (c < 0 || t->merge_key[c] == KEY_NEVER) {
        return 0;
    }
    m->pid[l] = (uint32_t)c;
    /* +1 on the high word keeps every real key non-zero (0 means "none");
     * merge_key <= KEY_NEVER - 1 so it cannot overflow. */
    return ((uint64_t)t->merge_key[c] + 1) << 32 | (uint32_t)l;
}

/* A segment this short is merged by llama2.c's own scan over a small array
 * (cache-resident and cheaper than the heap); longer ones use the heap. */
#define SMALL_SEGMENT 24

/* llama2.c's loop on ids[0..n): returns the new length. */
static int merge_small(const struct tokenizer *t, uint32_t *ids, int n)
{
    uint32_t key[SMALL_SEGMENT], pid[SMALL_SEGMENT];
    for (int i = 0; i + 1 < n; i++) {
        int32_t c = lookup_pair(t, ids[i], ids[i + 1]);
        key[i] = c < 0 ? KEY_NEVER : t->merge_key[c];
        pid[i] = (uint32_t)c;
    }
    while (n > 1) {
        /* Strict < keeps the leftmost of equal scores, as llama2.c's >. */
        int best = -1;
        uint32_t bk = KEY_NEVER;
        for (int i = 0; i + 1 < n; i++) {
            if (key[i] < bk) {
                bk = key[i];
                best = i;
            }
        }
        if (best < 0) {
            break;
        }
        ids[best] = pid[best];
        n--;
        for (int i = best + 1; i < n; i++) {
            ids[i] = ids[i + 1];
            key[i] = key[i + 1];
            pid[i] = pid[i + 1];
        }
        for (int i = best > 0 ? best - 1 : 0; i <= best && i + 1 < n; i++) {
            int32_t c = lookup_pair(t, ids[i], ids[i + 1]);
            key[i] = c < 0 ? KEY_NEVER : t->merge_key[c];
            pid[i] = (uint32_t)c;
        }
    }
    return n;
}

/* Per-call memo of merged segments: text repeats its words, and a segment's
 * result depends only on its initial ids. Growth failures just stop
 * memoising. */
struct memo_ent {
    uint64_t h;
    uint32_t off;   /* pool[off..off+in_len) input ids, then out_len output ids */
    uint8_t in_len; /* 0: empty slot */
    uint8_t out_len;
};

struct memo {
    struct memo_ent *tab; /* (cap) */
    uint32_t cap, used;
    uint32_t *pool; /* (pool_cap) */
    size_t pool_len, pool_cap;
};

static uint64_t ids_hash(const uint32_t *ids, int n)
{
    uint64_t h = (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h = (h ^ ids[i]) * 0x9E3779B97F4A7C15ULL;
    }
    return h ^ (h >> 29);
}

static const struct memo_ent *memo_find(const struct memo *mm, uint64_t h, const uint32_t *ids,
                                        int n)
{
    if (mm->cap == 0) {
        return NULL;
    }
    for (uint32_t i = (uint32_t)(h >> 32) & (mm->cap - 1);; i = (i + 1) & (mm->cap - 1)) {
        const struct memo_ent *e = &mm->tab[i];
        if (e->in_len == 0) {
            return NULL;
        }
        if (e->h == h && e->in_len == n &&
            memcmp(mm->pool + e->off, ids, sizeof(uint32_t) * (size_t)n) == 0) {
            return e;
        }
    }
}

static void memo_insert(struct memo *mm, struct memo_ent e)
{
    uint32_t i = (uint32_t)(e.h >> 32) & (mm->cap - 1);
    while (mm->tab[i].in_len != 0) {
        i = (i + 1) & (mm->cap - 1);
    }
    mm->tab[i] = e;
    mm->used++;
}

/* Makes room for one more entry and n + SMALL_SEGMENT pool ids; 0 or -1. */
static int memo_reserve(struct memo *mm, int n)
{
    if ((mm->used + 1) * 2 > mm->cap) {
        uint32_t ncap = mm->cap ? mm->cap * 2 : 1024;
        struct memo_ent *nt = calloc(ncap, sizeof(*nt));
        if (nt == NULL) {
            return -1;
        }
        struct memo old = *mm;
        mm->tab = nt;
        mm->cap = ncap;
        mm->used = 0;
        for (uint32_t i = 0; i < old.cap; i++) {
            if (old.tab[i].in_len != 0) {
                memo_insert(mm, old.tab[i]);
            }
        }
        free(old.tab);
    }
    size_t need = mm->pool_len + (size_t)n + SMALL_SEGMENT;
    if (need > mm->pool_cap) {
        size_t ncap = mm->pool_cap ? mm->pool_cap * 2 : 4096;
        while (ncap < need) {
            ncap *= 2;
        }
        if (ncap > UINT32_MAX) {
            return -1;
        }
        uint32_t *np = realloc(mm->pool, ncap * sizeof(*np));
        if (np == NULL) {
            return -1;
        }
        mm->pool = np;
        mm->pool_cap = ncap;
    }
    return 0;
}

/* Merges ids[0..n) (2 <= n <= SMALL_SEGMENT) through the memo; returns the
 * new length. */
static int merge_small_memo(const struct tokenizer *t, struct memo *mm, uint32_t *ids, int n)
{
    uint64_t h = ids_hash(ids, n);
    const struct memo_ent *e = memo_find(mm, h, ids, n);
    if (e != NULL) {
        memcpy(ids, mm->pool + e->off + e->in_len, sizeof(uint32_t) * e->out_len);
        return e->out_len;
    }
    if (memo_reserve(mm, n) != 0) {
        return merge_small(t, ids, n);
    }
    uint32_t off = (uint32_t)mm->pool_len;
    memcpy(mm->pool + off, ids, sizeof(uint32_t) * (size_t)n);
    int left = merge_small(t, ids, n);
    memcpy(mm->pool + off + n, ids, sizeof(uint32_t) * (size_t)left);
    mm->pool_len += (size_t)(n + left);
    memo_insert(
        mm, (struct memo_ent){.h = h, .off = off, .in_len = (uint8_t)n, .out_len = (uint8_t)left});
    return left;
}

/* The heap algorithm on symbols a..b-1 of m; the result is the list from a. */
static void merge_heap(const struct tokenizer *t, struct merge_scratch *m, int32_t a, int32_t b)
{
    for (int32_t i = a; i < b; i++) {
        m->next[i] = i + 1 < b ? i + 1 : -1;
        m->prev[i] = i > a ? i - 1 : -1;
        m->h.hpos[i] = -1;
    }
    m->h.n = 0;
    for (int32_t i = a; i + 1 < b; i++) {
        uint64_t key = pair_key(t, m, i);
        if (key != 0) {
            m->h.heap[m->h.n] = key;
            m->h.hpos[i] = m->h.n++;
        }
    }
    for (int i = m->h.n / 2 - 1; i >= 0; i--) {
        heap_down(&m->h, i);
    }
    while (m->h.n > 0) {
        int32_t l = (int32_t)(uint32_t)m->h.heap[0];
        int32_t r = m->next[l];
        m->id[l] = m->pid[l];
        heap_remove(&m->h, (uint32_t)r);
        int32_t rr = m->next[r];
        m->next[l] = rr;
        if (rr >= 0) {
            m->prev[rr] = l;
        }
        heap_update(&m->h, (uint32_t)l, pair_key(t, m, l));
        if (m->prev[l] >= 0) {
            heap_update(&m->h, (uint32_t)m->prev[l], pair_key(t, m, m->prev[l]));
        }
    }
}

/* Non-zero when no merge can ever join a symbol x to a following symbol y:
 * every merge result is a vocabulary string containing the last byte of x
 * followed by the first byte of y, and no piece has that byte pair. Empty
 * pieces are never a barrier (they merge away without a byte pair). */
static inline int barrier(const struct tokenizer *t, uint32_t x, uint32_t y)
{
    if (t->len[x] == 0 || t->len[y] == 0) {
        return 0;
    }
    uint32_t pair = (uint32_t)(t->edge[x] & 0xFF) << 8 | (uint32_t)(t->edge[y] >> 8);
    return !(t->bigram[pair >> 6] >> (pair & 63) & 1);
}

static int encode_llama2c(const struct tokenizer *t, const unsigned char *s, size_t len,
                          int add_bos, uint32_t *out, int max_out)
{
    size_t cap = len + 2;
    struct merge_scratch m;
    size_t per = sizeof(uint32_t) * 2 + sizeof(int32_t) * 3 + sizeof(uint64_t);
    char *mem = malloc(cap * per);
    if (mem == NULL) {
        return TANDEM_ENOMEM;
    }
    m.h.heap = (uint64_t *)mem;
    m.id = (uint32_t *)(mem + cap * sizeof(uint64_t));
    m.pid = m.id + cap;
    m.next = (int32_t *)(m.pid + cap);
    m.prev = m.next + cap;
    m.h.hpos = m.prev + cap;
    m.h.n = 0;

    /* Initial symbols: BOS, the dummy prefix, then llama2.c's codepoint
     * grouping: a group starts at any byte and takes following continuation
     * bytes (10xxxxxx) up to 4 bytes in all, whatever the lead byte says. */
    int32_t n = 0;
    if (add_bos) {
        m.id[n++] = TOK_BOS;
    }
    if (len > 0) {
        m.id[n++] = t->space_id;
    }
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        size_t g = 1;
        while (g < 4 && i + g < len && (s[i + g] & 0xC0) == 0x80) {
            g++;
        }
        int32_t id;
        if (g == 1) {
            id = t->byte_id[c];
        } else {
            id = lookup(t, (const char *)s + i, (uint32_t)g, hbytes(s + i, g));
        }
        if (id >= 0) {
            m.id[n++] = (uint32_t)id;
        } else {
            for (size_t k = 0; k < g; k++) {
                m.id[n++] = TOK_BYTE_BASE + s[i + k];
            }
        }
        i += g;
    }

    /* Merges never cross a barrier, so each segment between barriers is
     * merged on its own; the global (score, position) order restricted to a
     * segment is the segment's own order, so the ids are the same. */
    int count = 0;
    int32_t a = 0;
    struct memo mm = {0};
    for (int32_t k = 1; k <= n; k++) {
        if (k < n && !barrier(t, m.id[k - 1], m.id[k])) {
            continue;
        }
        int32_t seg = k - a;
        if (seg <= SMALL_SEGMENT) {
            int left = seg > 1 ? merge_small_memo(t, &mm, m.id + a, (int)seg) : 1;
            if (left > max_out - count) {
                goto too_big;
            }
            memcpy(out + count, m.id + a, sizeof(uint32_t) * (size_t)left);
            count += left;
        } else {
            merge_heap(t, &m, a, k);
            for (int32_t i = a; i >= 0; i = m.next[i]) {
                if (count == max_out) {
                    goto too_big;
                }
                out[count++] = m.id[i];
            }
        }
        a = k;
    }
    free(mm.tab);
    free(mm.pool);
    free(mem);
    return count;

too_big:
    free(mm.tab);
    free(mm.pool);
    free(mem);
    return TANDEM_ETOOBIG;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, uint32_t *out,
               int max_out)
{
    if (t == NULL || (text == NULL && len > 0) || (out == NULL && max_out > 0) || max_out < 0) {
        return TANDEM_EINVAL;
    }
    if (len > (size_t)TOK_MAX_TEXT) {
        return TANDEM_ETOOBIG;
    }
    const unsigned char *s = (const unsigned char *)text;
    if (t->kind == TOK_KIND_LLAMA2C) {
        return encode_llama2c(t, s, len, add_bos, out, max_out);
    }
    size_t need = len + (add_bos ? 1 : 0);
    if (need > (size_t)max_out) {
        return TANDEM_ETOOBIG;
    }
    int k = 0;
    if (add_bos) {
        out[k++] = TOK_BOS;
    }
    for (size_t i = 0; i < len; i++) {
        out[k + i] = TOK_BYTE_BASE + s[i];
    }
    return (int)need;
}

/* ---- decode -------------------------------------------------------------- */

int tok_piece(const struct tokenizer *t, uint32_t id, const char **piece, size_t *len)
{
    if (id >= (uint32_t)t->vocab_size) {
        return TANDEM_ERANGE;
    }
    if (t->kind == TOK_KIND_LLAMA2C) {
        *piece = piece_of(t, id);
        *len = t->len[id];
    } else if (id >= TOK_BYTE_BASE && id < TOK_BYTE_BASE + 256) {
        *piece = (const char *)t->bytes + (id - TOK_BYTE_BASE);
        *len = 1;
    } else {
        *piece = (const char *)t->bytes;
        *len = 0;
    }
    return 0;
}

int tok_decode_piece(const struct tokenizer *t, uint32_t prev, uint32_t id, const char **piece,
                     size_t *len)
{
    if (id >= (uint32_t)t->vocab_size) {
        return TANDEM_ERANGE;
    }
    if (id < TOK_BYTE_BASE) {
        /* Control tokens are not text (llama2.c would print "\n</s>\n"). */
        *piece = (const char *)t->bytes;
        *len = 0;
        return 0;
    }
    if (t->kind == TOK_KIND_BYTES) {
        return tok_piece(t, id, piece, len);
    }
    const char *p = piece_of(t, id);
    size_t n = t->len[id];
    int b = t->byte_val[id];
    /* After BOS, SentencePiece drops the leading space (llama2.c PR #89);
     * llama2.c checks for a byte piece after that. */
    if (prev == TOK_BOS && n > 0 && p[0] == ' ') {
        p++;
        n--;
        b = parse_byte_piece(p, n);
    }
    if (b >= 0) {
        *piece = (const char *)t->bytes + b;
        *len = 1;
    } else {
        *piece = p;
        *len = n;
    }
    return 0;
}

int tok_decode(const struct tokenizer *t, const uint32_t *ids, int n, char *out, size_t cap)
{
    if (t == NULL || n < 0 || (ids == NULL && n > 0) || (out == NULL && cap > 0)) {
        return TANDEM_EINVAL;
    }
    size_t total = 0;
    uint32_t prev = TOK_NO_PREV;
    for (int i = 0; i < n; i++) {
        const char *p;
        size_t len;
        int rc = tok_decode_piece(t, prev, ids[i], &p, &len);
        if (rc != 0) {
            return rc;
        }
        if (total + len > (size_t)INT32_MAX) {
            return TANDEM_ETOOBIG;
        }
        if (out != NULL) {
            if (total + len + 1 > cap) {
                return TANDEM_ETOOBIG;
            }
            memcpy(out + total, p, len);
        }
        total += len;
        prev = ids[i];
    }
    if (out != NULL) {
        if (total + 1 > cap) {
            return TANDEM_ETOOBIG;
        }
        out[total] = '\0';
    }
    return (int)total;
}

/* ---- streaming UTF-8 ----------------------------------------------------- */

void tok_utf8_init(struct tok_utf8 *s)
{
    s->nheld = 0;
}

static size_t put_fffd(char *out, size_t k)
{
    out[k] = (char)0xEF;
    out[k + 1] = (char)0xBF;
    out[k + 2] = (char)0xBD;
    return k + 3;
}

int tok_utf8_push(struct tok_utf8 *s, const char *in, size_t len, char *out, size_t cap)
{
    if (len > (size_t)INT32_MAX / 3 - 9 || cap < TOK_UTF8_OUT_MAX(len)) {
        return TANDEM_ETOOBIG;
    }
    const unsigned char *u = (const unsigned char *)in;
    size_t nh = s->nheld, total = nh + len, k = 0;
#define AT(j) ((j) < nh ? s->held[j] : u[(j)-nh])
    size_t i = 0;
    while (i < total) {
        unsigned char c = AT(i);
        if (c < 0x80) {
            out[k++] = (char)c;
            i++;
            continue;
        }
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 3;
            if (c == 0xE0) {
                lo = 0xA0; /* no overlongs */
            } else if (c == 0xED) {
                hi = 0x9F; /* no surrogates */
            }
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 4;
            if (c == 0xF0) {
                lo = 0x90;
            } else if (c == 0xF4) {
                hi = 0x8F; /* nothing above U+10FFFF */
            }
        } else {
            k = put_fffd(out, k);
            i++;
            continue;
        }
        size_t got = 1;
        while (got < need && i + got < total) {
            unsigned char cc = AT(i + got);
            if (got == 1 ? (cc < lo || cc > hi) : (cc & 0xC0) != 0x80) {
                break;
            }
            got++;
        }
        if (got == need) {
            for (size_t j = 0; j < need; j++) {
                out[k++] = (char)AT(i + j);
            }
            i += need;
        } else if (i + got == total) {
            /* A valid prefix cut by the end of the input: hold it back. */
            unsigned char tmp[4];
            for (size_t j = 0; j < got; j++) {
                tmp[j] = AT(i + j);
            }
            memcpy(s->held, tmp, got);
            s->nheld = (unsigned)got;
            return (int)k;
        } else {
            k = put_fffd(out, k);
            i += got;
        }
    }
#undef AT
    s->nheld = 0;
    return (int)k;
}

int tok_utf8_flush(struct tok_utf8 *s, char *out, size_t cap)
{
    if (s->nheld == 0) {
        return 0;
    }
    if (cap < 3) {
        return TANDEM_ETOOBIG;
    }
    s->nheld = 0;
    return (int)put_fffd(out, 0);
}

int tok_stream_token(const struct tokenizer *t, struct tok_utf8 *s, uint32_t prev, uint32_t id,
                     char *out, size_t cap)
{
    const char *p;
    size_t n;
    int rc = tok_decode_piece(t, prev, id, &p, &n);
    if (rc != 0) {
        return rc;
    }
    return tok_utf8_push(s, p, n, out, cap);
}
