/* Tokenizer encode throughput on a 220 KB text, for the byte-level kind and
 * for a llama2.c tokenizer.bin. The vocabulary is synthetic but realistic:
 * BPE merges learned by this program from a deterministic English-like
 * corpus (words with SentencePiece's leading space), scored -rank as
 * SentencePiece scores its pieces. Everything is generated from fixed seeds,
 * so runs are comparable.
 *
 * usage: bench_tokenizer [merges (default 4000)] [repeats (default 50)] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "tokenizer.h"

#define TEXT_BYTES (220 * 1024)
#define NWORDS     3000

static uint64_t rng_state = 0x1234567;

static uint32_t rnd(uint32_t n)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (uint32_t)((z ^ (z >> 31)) % n);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- corpus -------------------------------------------------------------- */

static char words[NWORDS][24];

static void make_words(void)
{
    static const char *const syl[] = {
        "the", "an", "re", "in", "er", "on", "at", "st",          "en",        "ing", "ou",
        "al",  "le", "ti", "ca", "ro", "ne", "de", "mo",          "pa",        "ly",  "se",
        "ch",  "th", "wa", "bu", "fi", "go", "ki", "lu",          "ma",        "no",  "pi",
        "qu",  "sa", "to", "ve", "yo", "z",  "x",  "caf\xC3\xA9", "na\xC3\xAF"};
    int nsyl = (int)(sizeof(syl) / sizeof(syl[0]));
    for (int w = 0; w < NWORDS; w++) {
        int n = 1 + (int)rnd(3) + (w > 200 ? (int)rnd(2) : 0);
        words[w][0] = '\0';
        for (int k = 0; k < n; k++) {
            const char *s = syl[w < 100 ? rnd(24) : rnd((uint32_t)nsyl)];
            if (strlen(words[w]) + strlen(s) < sizeof(words[w])) {
                strcat(words[w], s);
            }
        }
    }
}

/* Zipf-like word choice: low ranks far more often. */
static const char *pick_word(void)
{
    uint32_t r = rnd(1000000);
    double u = (double)r / 1e6;
    int idx = (int)((double)NWORDS * u * u * u);
    return words[idx < NWORDS ? idx : NWORDS - 1];
}

static size_t make_text(char *buf, size_t target)
{
    size_t n = 0;
    int sentence = 0;
    while (n < target - 64) {
        const char *w = pick_word();
        size_t len = strlen(w);
        if (n > 0) {
            buf[n++] = ' ';
        }
        memcpy(buf + n, w, len);
        if (sentence == 0 && buf[n] >= 'a' && buf[n] <= 'z') {
            buf[n] = (char)(buf[n] - 'a' + 'A');
        }
        n += len;
        sentence++;
        uint32_t p = rnd(100);
        if (p < 6) {
            buf[n++] = ',';
        } else if (p < 11 || sentence > 20) {
            buf[n++] = rnd(4) ? '.' : '?';
            sentence = 0;
            if (rnd(6) == 0) {
                buf[n++] = '\n';
            }
        } else if (p < 12) {
            memcpy(buf + n, " \xE2\x80\x94", 4); /* em dash */
            n += 4;
        }
    }
    return n;
}

/* ---- BPE training over word types ---------------------------------------- */

#define MAXPIECE 64

struct piece {
    char s[MAXPIECE];
    int len;
};

static struct piece *pieces;
static int npieces;

static int piece_add(const char *s, int len)
{
    for (int i = 0; i < npieces; i++) {
        if (pieces[i].len == len && memcmp(pieces[i].s, s, (size_t)len) == 0) {
            return i;
        }
    }
    memcpy(pieces[npieces].s, s, (size_t)len);
    pieces[npieces].len = len;
    return npieces++;
}

struct wtype {
    int sym[40]; /* piece indices */
    int n;
    int count;
};

/* Learns up to nmerges merges from the word types of the corpus. Pieces
 * 0..nbase-1 are the single codepoints; merge k becomes piece nbase + k. */
static int train(const char *text, size_t len, int nmerges, int *nbase)
{
    pieces = calloc((size_t)(nmerges + 512), sizeof(*pieces));
    /* Word types: " word" units split at spaces (SentencePiece style). */
    int cap = 8192, ntypes = 0;
    struct wtype *types = calloc((size_t)cap, sizeof(*types));
    char **keys = calloc((size_t)cap, sizeof(char *));
    size_t i = 0;
    char unit[256];
    while (i < len) {
        size_t u = 0;
        unit[u++] = ' ';
        if (text[i] == ' ') {
            i++;
        }
        while (i < len && text[i] != ' ' && u < 200) {
            unit[u++] = text[i++];
        }
        unit[u] = '\0';
        int t;
        for (t = 0; t < ntypes; t++) {
            if (strcmp(keys[t], unit) == 0) {
                break;
            }
        }
        if (t == ntypes) {
            if (ntypes == cap) {
                continue;
            }
            keys[t] = strdup(unit);
            types[t].n = 0;
            for (size_t k = 0; k < u && types[t].n < 40;) {
                size_t g = 1;
                while (k + g < u && ((unsigned char)unit[k + g] & 0xC0) == 0x80) {
                    g++;
                }
                types[t].sym[types[t].n++] = piece_add(unit + k, (int)g);
                k += g;
            }
            ntypes++;
        }
        types[t].count++;
    }
    *nbase = npieces;
    int merges = 0;
    for (; merges < nmerges; merges++) {
        /* Count pairs (a, b) weighted by type frequency; pick the most
         * frequent, ties to the first seen (deterministic). */
        int best_a = -1, best_b = -1, best = 1;
        /* A small open-addressing table over pairs. */
        enum { TB = 1 << 16 };
        static int64_t tkey[TB];
        static int tval[TB];
        memset(tkey, 0xff, sizeof(tkey));
        for (int t = 0; t < ntypes; t++) {
            for (int k = 0; k + 1 < types[t].n; k++) {
                int64_t key = (int64_t)types[t].sym[k] << 32 | types[t].sym[k + 1];
                uint32_t h = (uint32_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> 48);
                while (tkey[h] != -1 && tkey[h] != key) {
                    h = (h + 1) & (TB - 1);
                }
                if (tkey[h] == -1) {
                    tkey[h] = key;
                    tval[h] = 0;
                }
                tval[h] += types[t].count;
                if (tval[h] > best) {
                    best = tval[h];
                    best_a = types[t].sym[k];
                    best_b = types[t].sym[k + 1];
                }
            }
        }
        if (best_a < 0 || pieces[best_a].len + pieces[best_b].len >= MAXPIECE) {
            break;
        }
        char s[2 * MAXPIECE];
        memcpy(s, pieces[best_a].s, (size_t)pieces[best_a].len);
        memcpy(s + pieces[best_a].len, pieces[best_b].s, (size_t)pieces[best_b].len);
        int c = piece_add(s, pieces[best_a].len + pieces[best_b].len);
        for (int t = 0; t < ntypes; t++) {
            int o = 0;
            for (int k = 0; k < types[t].n; k++) {
                if (k + 1 < types[t].n && types[t].sym[k] == best_a &&
                    types[t].sym[k + 1] == best_b) {
                    types[t].sym[o++] = c;
                    k++;
                } else {
                    types[t].sym[o++] = types[t].sym[k];
                }
            }
            types[t].n = o;
        }
    }
    for (int t = 0; t < ntypes; t++) {
        free(keys[t]);
    }
    free(keys);
    free(types);
    return merges;
}

/* tokenizer.bin: specials, 256 byte pieces, codepoints, merges (-rank). */
static unsigned char *write_bin(int nbase, int nmerges, size_t *size, int *vocab)
{
    int v = 3 + 256 + nbase + nmerges;
    size_t cap = 4 + (size_t)v * (8 + MAXPIECE);
    unsigned char *buf = malloc(cap), *p = buf + 4;
    int32_t mtl = 6;
    for (int i = 0; i < npieces; i++) {
        if (pieces[i].len > mtl) {
            mtl = pieces[i].len;
        }
    }
    memcpy(buf, &mtl, 4);
    for (int id = 0; id < v; id++) {
        char tmp[16];
        const char *s;
        int32_t len;
        float score = 0.0f;
        if (id < 3) {
            s = id == 0 ? "<unk>" : id == 1 ? "\n<s>\n" : "\n</s>\n";
            len = (int32_t)strlen(s);
        } else if (id < 259) {
            snprintf(tmp, sizeof(tmp), "<0x%02X>", id - 3);
            s = tmp;
            len = 6;
        } else {
            int k = id - 259;
            s = pieces[k].s;
            len = pieces[k].len;
            score = k < nbase ? -1e9f : -(float)(k - nbase);
        }
        memcpy(p, &score, 4);
        memcpy(p + 4, &len, 4);
        memcpy(p + 8, s, (size_t)len);
        p += 8 + len;
    }
    *size = (size_t)(p - buf);
    *vocab = v;
    return buf;
}

static int has_pair(const struct piece *p, const char *xy)
{
    for (int i = 0; i + 1 < p->len; i++) {
        if (p->s[i] == xy[0] && p->s[i + 1] == xy[1]) {
            return 1;
        }
    }
    return 0;
}

static double bench_encode(const struct tokenizer *t, const char *text, size_t len, uint32_t *ids,
                           int reps, int *count, double *best)
{
    double total = 0;
    *best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        *count = tok_encode(t, text, len, 1, ids, (int)TOK_ENCODE_BOUND(len));
        double dt = now_ms() - t0;
        total += dt;
        if (dt < *best) {
            *best = dt;
        }
    }
    return total / reps;
}

int main(int argc, char **argv)
{
    int want_merges = argc > 1 ? atoi(argv[1]) : 4000;
    int reps = argc > 2 ? atoi(argv[2]) : 50;
    log_init("bench", LOG_LEVEL_WARN);

    make_words();
    char *text = malloc(TEXT_BYTES + 1);
    size_t len = make_text(text, TEXT_BYTES);
    uint32_t *ids = malloc(sizeof(uint32_t) * TOK_ENCODE_BOUND(len));

    double t0 = now_ms();
    int nbase;
    int nmerges = train(text, len, want_merges, &nbase);
    size_t size;
    int vocab;
    unsigned char *bin = write_bin(nbase, nmerges, &size, &vocab);
    double train_ms = now_ms() - t0;

    struct tokenizer *tb = NULL, *tl = NULL;
    if (tok_create_bytes(&tb) != 0) {
        return 1;
    }
    t0 = now_ms();
    int rc = tok_load_mem(&tl, bin, size, vocab, "synthetic");
    double load_ms = now_ms() - t0;
    if (rc != 0) {
        fprintf(stderr, "load failed: %d\n", rc);
        return 1;
    }

    printf("text: %zu bytes; synthetic vocab: %d ids (%d codepoints, %d merges), "
           "trained in %.0f ms, loaded in %.2f ms\n",
           len, vocab, nbase, nmerges, train_ms, load_ms);
    int n;
    double best;
    double avg = bench_encode(tb, text, len, ids, reps, &n, &best);
    printf("byte-level : %7d ids  %8.3f ms/encode (best %.3f)  %8.1f MB/s\n", n, avg, best,
           (double)len / 1e6 / (avg / 1e3));
    avg = bench_encode(tl, text, len, ids, reps, &n, &best);
    printf("llama2.c   : %7d ids  %8.3f ms/encode (best %.3f)  %8.1f MB/s  (%.2f bytes/id)\n", n,
           avg, best, (double)len / 1e6 / (avg / 1e3), (double)len / n);

    /* Worst case for the segmenting: letters x, y with "xy" and "yx" both
     * inside some piece, repeated, give one 220 KB segment (heap path). */
    char *flat = malloc(len + 1);
    int fx = -1, fy = -1;
    for (int x = 'a'; x <= 'z' && fx < 0; x++) {
        for (int y = 'a'; y <= 'z' && fx < 0; y++) {
            char xy[3] = {(char)x, (char)y, 0}, yx[3] = {(char)y, (char)x, 0};
            int hx = 0, hy = 0;
            for (int i = 0; i < npieces && !(hx && hy); i++) {
                hx |= has_pair(&pieces[i], xy);
                hy |= has_pair(&pieces[i], yx);
            }
            if (hx && hy && x != y) {
                fx = x;
                fy = y;
            }
        }
    }
    if (fx >= 0) {
        for (size_t i = 0; i < len; i++) {
            flat[i] = (char)(i % 2 ? fy : fx);
        }
        int nf;
        avg = bench_encode(tl, flat, len, ids, reps < 10 ? reps : 10, &nf, &best);
        printf("llama2.c, one segment (\"%c%c%c%c...\"): %d ids  %.3f ms/encode  %.1f MB/s\n", fx,
               fy, fx, fy, nf, avg, (double)len / 1e6 / (avg / 1e3));
    }
    free(flat);

    /* Decode back, for completeness. */
    n = tok_encode(tl, text, len, 1, ids, (int)TOK_ENCODE_BOUND(len));
    char *back = malloc(len * 2 + 16);
    t0 = now_ms();
    for (int r = 0; r < reps; r++) {
        tok_decode(tl, ids, n, back, len * 2 + 16);
    }
    double dec = (now_ms() - t0) / reps;
    printf("llama2.c decode: %.3f ms (%.1f MB/s), round trip %s\n", dec,
           (double)len / 1e6 / (dec / 1e3), memcmp(back, text, len) == 0 ? "ok" : "DIFFERS");

    free(back);
    tok_destroy(tl);
    tok_destroy(tb);
    free(bin);
    free(pieces);
    free(ids);
    free(text);
    return 0;
}
