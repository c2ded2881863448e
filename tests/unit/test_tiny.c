/* The tiny backend and its kernels: against a naive double-precision
 * reference, batch invariance, chunking invariance, scattered blocks,
 * llama2.c checkpoints, KV dtypes and every SIMD path.
 *
 * Randomised tests print their seed; TANDEM_TEST_SEED=<n> replays one. */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "kernels.h"
#include "kv_cache.h"
#include "log.h"
#include "tandem_err.h"
#include "tiny.h"

static uint64_t g_seed;
/* TANDEM_TEST_QUICK=1 (deploy/test.sh's valgrind stage): the same code on a
 * smaller workload, since valgrind runs the SIMD kernels some 1000x slower. */
static int g_quick;
static char g_dir[256];

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(rng_next(s) % n);
}

static float rng_unif(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* Shape A: head_dim 16, GQA group 2, padded panels (hidden 172, vocab 96). */
static void cfg_a(struct tiny_config *c)
{
    memset(c, 0, sizeof(*c));
    c->dim = 64;
    c->hidden_dim = 172;
    c->n_layers = 2;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->vocab_size = 96;
    c->max_context = 256;
    c->seed = g_seed;
}

/* Shape B: head_dim 48 (masked lane tails), one KV head for 2 query heads,
 * separate classifier. */
static void cfg_b(struct tiny_config *c)
{
    memset(c, 0, sizeof(*c));
    c->dim = 96;
    c->hidden_dim = 200;
    c->n_layers = 2;
    c->n_heads = 2;
    c->n_kv_heads = 1;
    c->vocab_size = 70;
    c->max_context = 128;
    c->seed = g_seed ^ 0x5555;
    c->separate_classifier = 1;
}

static struct kv_pool *make_pool(const struct backend *be, int n_blocks, int bs, enum kv_dtype dt)
{
    struct kv_config kc = {.n_layers = be->info.n_layers,
                           .n_kv_heads = be->info.n_kv_heads,
                           .head_dim = be->info.head_dim,
                           .block_size = bs,
                           .dtype = dt,
                           .n_blocks = n_blocks,
                           .payload_div = 0};
    struct kv_pool *p = NULL;
    int rc = kv_pool_create(&p, &kc);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    /* Stale bytes that would show if a position were read before written. */
    for (int b = 0; b < n_blocks; b++)
        memset(kv_block_data(p, b), 0x7f, kv_block_bytes(p));
    return p;
}

static void tmp_path(char *dst, size_t cap, const char *name)
{
    snprintf(dst, cap, "%s/%s", g_dir, name);
}

static int path_list(enum kern_path *out)
{
    int n = 0;
    for (int p = KERN_PATH_COUNT - 1; p >= 0; p--)
        if (kern_path_supported((enum kern_path)p))
            out[n++] = (enum kern_path)p;
    return n;
}

/* Runs tokens[0..n) through prefill in chunks of `chunk` (n when <= 0) into a
 * sequence whose block table is blocks; all logits land in logits (n x vocab). */
static int prefill_chunked(struct backend *be, struct kv_pool *kv, const int32_t *blocks,
                           const uint32_t *tokens, int n, int chunk, float *logits)
{
    int voc = be->info.vocab_size;
    if (chunk <= 0)
        chunk = n;
    float *last = malloc((size_t)voc * sizeof(float));
    int rc = 0;
    for (int p = 0; p < n && rc == 0; p += chunk) {
        int m = n - p < chunk ? n - p : chunk;
        struct be_seq s = {.blocks = blocks, .pos = p, .history = tokens, .seed = 0};
        struct be_out o = {.logits = last};
        rc = be->ops->prefill(be, kv, &s, tokens + p, m, &o, logits + (size_t)p * voc);
        if (rc == 0 && memcmp(last, logits + (size_t)(p + m - 1) * voc, (size_t)voc * 4) != 0)
            rc = -1000;
    }
    free(last);
    return rc;
}

/* Token by token: a prefill of the first token, then decode steps. */
static int decode_all(struct backend *be, struct kv_pool *kv, const int32_t *blocks,
                      const uint32_t *tokens, int n, float *logits)
{
    int voc = be->info.vocab_size;
    struct be_seq s = {.blocks = blocks, .pos = 0, .history = tokens, .seed = 0};
    struct be_out o = {.logits = logits};
    int rc = be->ops->prefill(be, kv, &s, tokens, 1, &o, NULL);
    for (int p = 1; p < n && rc == 0; p++) {
        s.pos = p;
        o.logits = logits + (size_t)p * voc;
        rc = be->ops->decode(be, kv, 1, &s, &o);
    }
    return rc;
}

/* ---- the reference: llama2.c read with plain fread, forward in double ---------- */

struct ref_model {
    int dim, hid, n_layers, n_heads, n_kv_heads, vocab, seq_len, shared;
    float *all; /* owns every tensor below */
    float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *rope, *wcls;
};

static size_t ref_layout(struct ref_model *m, float *base)
{
    size_t dim = (size_t)m->dim, hid = (size_t)m->hid, L = (size_t)m->n_layers;
    size_t hd = dim / (size_t)m->n_heads, kvd = hd * (size_t)m->n_kv_heads;
    size_t voc = (size_t)m->vocab, off = 0;
#define T(field, n)                                                                                \
    do {                                                                                           \
        m->field = base != NULL ? base + off : NULL;                                               \
        off += (n);                                                                                \
    } while (0)
    T(emb, voc * dim);
    T(rms_att, L * dim);
    T(wq, L * dim * dim);
    T(wk, L * dim * kvd);
    T(wv, L * dim * kvd);
    T(wo, L * dim * dim);
    T(rms_ffn, L * dim);
    T(w1, L * dim * hid);
    T(w2, L * dim * hid);
    T(w3, L * dim * hid);
    T(rms_final, dim);
    T(rope, (size_t)m->seq_len * hd);
    if (m->shared)
        m->wcls = m->emb;
    else
        T(wcls, voc * dim);
#undef T
    return off;
}

static int ref_read(struct ref_model *m, const char *path)
{
    memset(m, 0, sizeof(*m));
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    int32_t h[7];
    if (fread(h, 4, 7, f) != 7) {
        fclose(f);
        return -1;
    }
    m->dim = h[0];
    m->hid = h[1];
    m->n_layers = h[2];
    m->n_heads = h[3];
    m->n_kv_heads = h[4];
    m->vocab = abs(h[5]);
    m->shared = h[5] > 0;
    m->seq_len = h[6];
    size_t n = ref_layout(m, NULL);
    m->all = malloc(n * sizeof(float));
    size_t got = fread(m->all, sizeof(float), n, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    ref_layout(m, m->all);
    return got == n && !extra ? 0 : -1;
}

static int ref_write(const struct ref_model *m, const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    int32_t h[7] = {m->dim,     m->hid,        m->n_layers,
                    m->n_heads, m->n_kv_heads, m->shared ? m->vocab : -m->vocab,
                    m->seq_len};
    struct ref_model tmp = *m;
    size_t n = ref_layout(&tmp, NULL);
    int ok = fwrite(h, 4, 7, f) == 7 && fwrite(m->all, sizeof(float), n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A random model in memory, written by the test itself. */
static void ref_random(struct ref_model *m, const struct tiny_config *c, int shared, uint64_t seed)
{
    memset(m, 0, sizeof(*m));
    m->dim = c->dim;
    m->hid = c->hidden_dim;
    m->n_layers = c->n_layers;
    m->n_heads = c->n_heads;
    m->n_kv_heads = c->n_kv_heads;
    m->vocab = c->vocab_size;
    m->seq_len = c->max_context;
    m->shared = shared;
    size_t n = ref_layout(m, NULL);
    m->all = malloc(n * sizeof(float));
    ref_layout(m, m->all);
    for (size_t i = 0; i < n; i++)
        m->all[i] = rng_unif(&seed) * 0.2f;
    size_t L = (size_t)m->n_layers, dim = (size_t)m->dim;
    for (size_t i = 0; i < L * dim; i++) {
        m->rms_att[i] = 1.0f + rng_unif(&seed) * 0.1f;
        m->rms_ffn[i] = 1.0f + rng_unif(&seed) * 0.1f;
    }
    for (size_t i = 0; i < (size_t)m->vocab * dim; i++)
        m->emb[i] = rng_unif(&seed);
    for (size_t i = 0; i < dim; i++)
        m->rms_final[i] = 1.0f + rng_unif(&seed) * 0.1f;
    memset(m->rope, 0, (size_t)m->seq_len * (dim / (size_t)m->n_heads) * sizeof(float));
}

static void ref_rmsnorm(double *o, const double *x, const float *w, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    ss = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++)
        o[i] = w[i] * (ss * x[i]);
}

static void ref_matvec(double *y, const float *w, const double *x, int n_out, int n_in)
{
    for (int o = 0; o < n_out; o++) {
        double acc = 0;
        for (int i = 0; i < n_in; i++)
            acc += (double)w[(size_t)o * n_in + i] * x[i];
        y[o] = acc;
    }
}

/* logits (n x vocab) of every position of tokens. */
static void ref_forward(const struct ref_model *m, const uint32_t *tokens, int n, double *logits)
{
    int dim = m->dim, hid = m->hid, hd = dim / m->n_heads, kvd = hd * m->n_kv_heads;
    int grp = m->n_heads / m->n_kv_heads;
    double *kc = calloc((size_t)m->n_layers * n * kvd, sizeof(double));
    double *vc = calloc((size_t)m->n_layers * n * kvd, sizeof(double));
    double *x = malloc(dim * sizeof(double)), *xb = malloc(dim * sizeof(double));
    double *q = malloc(dim * sizeof(double)), *att = malloc(dim * sizeof(double));
    double *h1 = malloc(hid * sizeof(double)), *h3 = malloc(hid * sizeof(double));
    double *sc = malloc(n * sizeof(double)), *tmp = malloc(dim * sizeof(double));
    for (int pos = 0; pos < n; pos++) {
        for (int i = 0; i < dim; i++)
            x[i] = m->emb[(size_t)tokens[pos] * dim + i];
        for (int l = 0; l < m->n_layers; l++) {
            double *k = kc + ((size_t)l * n + pos) * kvd, *v = vc + ((size_t)l * n + pos) * kvd;
            ref_rmsnorm(xb, x, m->rms_att + (size_t)l * dim, dim);
            ref_matvec(q, m->wq + (size_t)l * dim * dim, xb, dim, dim);
            ref_matvec(k, m->wk + (size_t)l * dim * kvd, xb, kvd, dim);
            ref_matvec(v, m->wv + (size_t)l * dim * kvd, xb, kvd, dim);
            for (int i = 0; i < dim; i += 2) {
                double freq = 1.0 / pow(10000.0, (double)(i % hd) / hd);
                double c = cos(pos * freq), s = sin(pos * freq);
                double a = q[i], b = q[i + 1];
                q[i] = a * c - b * s;
                q[i + 1] = a * s + b * c;
                if (i < kvd) {
                    a = k[i];
                    b = k[i + 1];
                    k[i] = a * c - b * s;
                    k[i + 1] = a * s + b * c;
                }
            }
            for (int h = 0; h < m->n_heads; h++) {
                int g = h / grp;
                double mx = -1e300, sum = 0;
                for (int t = 0; t <= pos; t++) {
                    const double *kt = kc + ((size_t)l * n + t) * kvd + g * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += q[h * hd + i] * kt[i];
                    sc[t] = d / sqrt((double)hd);
                    if (sc[t] > mx)
                        mx = sc[t];
                }
                for (int t = 0; t <= pos; t++) {
                    sc[t] = exp(sc[t] - mx);
                    sum += sc[t];
                }
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int t = 0; t <= pos; t++)
                        acc += sc[t] / sum * vc[((size_t)l * n + t) * kvd + g * hd + i];
                    att[h * hd + i] = acc;
                }
            }
            ref_matvec(tmp, m->wo + (size_t)l * dim * dim, att, dim, dim);
            for (int i = 0; i < dim; i++)
                x[i] += tmp[i];
            ref_rmsnorm(xb, x, m->rms_ffn + (size_t)l * dim, dim);
            ref_matvec(h1, m->w1 + (size_t)l * dim * hid, xb, hid, dim);
            ref_matvec(h3, m->w3 + (size_t)l * dim * hid, xb, hid, dim);
            for (int i = 0; i < hid; i++)
                h1[i] = h1[i] / (1.0 + exp(-h1[i])) * h3[i];
            ref_matvec(tmp, m->w2 + (size_t)l * dim * hid, h1, dim, hid);
            for (int i = 0; i < dim; i++)
                x[i] += tmp[i];
        }
        ref_rmsnorm(xb, x, m->rms_final, dim);
        ref_matvec(logits + (size_t)pos * m->vocab, m->wcls, xb, m->vocab, dim);
    }
    free(kc);
    free(vc);
    free(x);
    free(xb);
    free(q);
    free(att);
    free(h1);
    free(h3);
    free(sc);
    free(tmp);
}

/* Max |tiny - reference| over n positions, tiny run by chunked prefill. */
static double ref_error(struct backend *be, const struct ref_model *m, int n, uint64_t *seed)
{
    int voc = be->info.vocab_size;
    uint32_t *tok = malloc((size_t)n * sizeof(uint32_t));
    for (int i = 0; i < n; i++)
        tok[i] = rng_below(seed, (uint32_t)voc);
    double *want = malloc((size_t)n * voc * sizeof(double));
    float *got = malloc((size_t)n * voc * sizeof(float));
    ref_forward(m, tok, n, want);
    struct kv_pool *kv = make_pool(be, (n + 15) / 16, 16, KV_DTYPE_F32);
    int32_t blocks[64];
    for (int i = 0; i < 64; i++)
        blocks[i] = i;
    CU_ASSERT_EQUAL(prefill_chunked(be, kv, blocks, tok, n, 13, got), 0);
    double err = 0, mag = 0;
    for (size_t i = 0; i < (size_t)n * voc; i++) {
        double e = fabs(got[i] - want[i]);
        if (!(e <= err))
            err = e;
        if (fabs(want[i]) > mag)
            mag = fabs(want[i]);
    }
    printf("[max |err| %.3g, max |logit| %.3g] ", err, mag);
    kv_pool_destroy(kv);
    free(tok);
    free(want);
    free(got);
    return err;
}

/* ---- tests -------------------------------------------------------------------- */

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#ifdef TEST_ASAN
/* Under ASan the matmul kernels are not instrumented; kern_matmul checks each
 * call's footprint instead (kernels.c). A child passes an x one float short,
 * then a y one float short, and must die naming the buffer. */
static void matmul_short_buffer(int short_y, const char *want)
{
    int fds[2];
    CU_ASSERT_FATAL(pipe(fds) == 0);
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        struct kern_mat m;
        float *w = calloc(16 * 24, sizeof(float));
        kern_mat_pack(&m, w, 16, 24);
        float *x = malloc((3 * 24 - (short_y ? 0 : 1)) * sizeof(float));
        float *y = malloc((3 * 16 - (short_y ? 1 : 0)) * sizeof(float));
        memset(x, 0, (3 * 24 - (short_y ? 0 : 1)) * sizeof(float));
        kern_matmul(y, 16, x, 24, 3, &m);
        _exit(0);
    }
    close(fds[1]);
    char buf[8192];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(buf) - 1 && (r = read(fds[0], buf + n, sizeof(buf) - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = 0;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CU_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    if (strstr(buf, want) == NULL)
        printf("\nchild stderr: %s\n", buf);
    CU_ASSERT(strstr(buf, want) != NULL);
}

static void test_matmul_footprint_asan(void)
{
    enum kern_path paths[KERN_PATH_COUNT];
    int np = path_list(paths);
    for (int p = 0; p < np; p++) {
        kern_set_path(paths[p]);
        matmul_short_buffer(0, "kern_matmul: input x (row 2");
        matmul_short_buffer(1, "kern_matmul: output y (row 2");
    }
    kern_set_path(paths[0]);
}
#endif

static void test_kernels_canonical(void)
{
    /* kern_dot and kern_matmul against the definitions in kernels.h, on every
     * path, bit for bit. */
    enum kern_path paths[KERN_PATH_COUNT];
    int np = path_list(paths);
    uint64_t s = g_seed ^ 0xd07;
    float a[200], b[200];
    for (int i = 0; i < 200; i++) {
        a[i] = rng_unif(&s);
        b[i] = rng_unif(&s);
    }
    for (int n = 0; n <= 200; n += (n < 40 ? 1 : 17)) {
        float l[16] = {0};
        for (int i = 0; i < n; i++)
            l[i % 16] = fmaf(a[i], b[i], l[i % 16]);
        for (int j = 0; j < 8; j++)
            l[j] += l[j + 8];
        for (int j = 0; j < 4; j++)
            l[j] += l[j + 4];
        for (int j = 0; j < 2; j++)
            l[j] += l[j + 2];
        float want = l[0] + l[1];
        for (int p = 0; p < np; p++) {
            kern_set_path(paths[p]);
            float got = kern_dot(a, b, n);
            if (memcmp(&got, &want, 4) != 0) {
                printf("\ndot n=%d path %s: %a != %a\n", n, kern_path_name(paths[p]), got, want);
                CU_FAIL("kern_dot differs from the canonical order");
            }
        }
    }
    int shapes[][3] = {{1, 1, 1},    {70, 33, 1},  {64, 64, 6},
                       {130, 17, 7}, {5, 200, 13}, {200, 9, 25}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int n_out = shapes[si][0], n_in = shapes[si][1], rows = shapes[si][2];
        float *w = malloc((size_t)n_out * n_in * 4), *x = malloc((size_t)rows * n_in * 4);
        float *want = malloc((size_t)rows * n_out * 4),
              *got = malloc((size_t)rows * (n_out + 3) * 4);
        for (int i = 0; i < n_out * n_in; i++)
            w[i] = rng_unif(&s);
        for (int i = 0; i < rows * n_in; i++)
            x[i] = rng_unif(&s);
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < n_out; o++) {
                float acc = 0.0f;
                for (int i = 0; i < n_in; i++)
                    acc = fmaf(w[(size_t)o * n_in + i], x[(size_t)r * n_in + i], acc);
                want[(size_t)r * n_out + o] = acc;
            }
        struct kern_mat m;
        CU_ASSERT_EQUAL_FATAL(kern_mat_pack(&m, w, n_out, n_in), 0);
        float *back = malloc((size_t)n_in * 4);
        kern_mat_get_row(&m, n_out - 1, back);
        CU_ASSERT_EQUAL(memcmp(back, w + (size_t)(n_out - 1) * n_in, (size_t)n_in * 4), 0);
        free(back);
        for (int p = 0; p < np; p++) {
            kern_set_path(paths[p]);
            /* ldy > n_out: the padding columns must stay untouched. */
            int ldy = n_out + 3;
            for (int i = 0; i < rows * ldy; i++)
                got[i] = -7.0f;
            kern_matmul(got, ldy, x, n_in, rows, &m);
            int bad = 0;
            for (int r = 0; r < rows; r++) {
                bad |= memcmp(got + (size_t)r * ldy, want + (size_t)r * n_out, (size_t)n_out * 4);
                for (int o = n_out; o < ldy; o++)
                    bad |= got[(size_t)r * ldy + o] != -7.0f;
            }
            if (bad)
                printf("\nmatmul %dx%d rows %d path %s differs\n", n_out, n_in, rows,
                       kern_path_name(paths[p]));
            CU_ASSERT_EQUAL(bad, 0);
        }
        kern_mat_free(&m);
        free(w);
        free(x);
        free(want);
        free(got);
    }
    kern_set_path(paths[0]);
}

static void test_kernels_exp_softmax(void)
{
    /* kern_exp is accurate, and softmax / SwiGLU give the same bits on every
     * path (odd lengths exercise the masked tails). */
    double worst = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
        double want = exp((double)x), got = kern_exp(x);
        double rel = fabs(got - want) / want;
        if (rel > worst)
            worst = rel;
    }
    printf("[kern_exp max rel err %.2g] ", worst);
    CU_ASSERT(worst < 3e-7);
    CU_ASSERT_EQUAL(kern_exp(0.0f), 1.0f);
    CU_ASSERT(kern_exp(-1000.0f) > 0.0f && kern_exp(-1000.0f) < 1e-37f);
    CU_ASSERT(isfinite(kern_exp(1000.0f)));

    enum kern_path paths[KERN_PATH_COUNT];
    int np = path_list(paths);
    uint64_t s = g_seed ^ 0xe4;
    int lens[] = {1, 2, 7, 15, 16, 17, 31, 33, 100, 515};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int n = lens[li];
        float *x = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
        float *want_sm = malloc((size_t)n * 4), *want_sw = malloc((size_t)n * 4);
        float *got = malloc((size_t)n * 4);
        for (int i = 0; i < n; i++) {
            x[i] = rng_unif(&s) * 30.0f;
            g[i] = rng_unif(&s) * 3.0f;
        }
        for (int p = 0; p < np; p++) {
            kern_set_path(paths[p]);
            memcpy(got, x, (size_t)n * 4);
            kern_softmax(got, n);
            if (p == 0) {
                memcpy(want_sm, got, (size_t)n * 4);
                double sum = 0;
                for (int i = 0; i < n; i++)
                    sum += got[i];
                CU_ASSERT(fabs(sum - 1.0) < 1e-5);
            } else {
                CU_ASSERT_EQUAL(memcmp(got, want_sm, (size_t)n * 4), 0);
            }
            memcpy(got, x, (size_t)n * 4);
            kern_swiglu(got, g, (size_t)n);
            if (p == 0) {
                memcpy(want_sw, got, (size_t)n * 4);
                for (int i = 0; i < n; i++) {
                    double v = x[i], silu = v / (1.0 + exp(-v));
                    CU_ASSERT(fabs(got[i] - silu * g[i]) <= 1e-5 * (1.0 + fabs(silu * g[i])));
                }
            } else {
                CU_ASSERT_EQUAL(memcmp(got, want_sw, (size_t)n * 4), 0);
            }
        }
        free(x);
        free(g);
        free(want_sm);
        free(want_sw);
        free(got);
    }
    kern_set_path(paths[0]);
}

/* Fills n stored values of dt at dst. mode 0: random values of about unit
 * size; mode 1: the dtype's bit patterns in turn from a random one, skipping
 * those that are not finite or reach 2^32 (so that scores stay finite);
 * mode 2: every bit pattern in turn, infinities and NaNs included. */
static void kv_fill(enum kv_dtype dt, uint8_t *dst, size_t n, int mode, uint64_t *s)
{
    size_t es = kv_dtype_size(dt);
    uint32_t npat = es == 1 ? 256 : 65536, next = rng_below(s, npat);
    for (size_t i = 0; i < n; i++) {
        uint8_t b[4];
        if (mode == 0) {
            float f = rng_unif(s) * 2.0f;
            kv_quantize(dt, b, &f, 1);
        } else {
            for (;;) {
                uint16_t h = (uint16_t)next;
                if (es == 1)
                    b[0] = (uint8_t)next;
                else
                    memcpy(b, &h, sizeof h);
                next = (next + 1) % npat;
                float f;
                kv_dequantize(dt, &f, b, 1);
                if (mode == 2 || (isfinite(f) && fabsf(f) < 0x1p32f))
                    break;
            }
        }
        memcpy(dst + i * es, b, es);
    }
}

static void test_kernels_attention_kv_dtypes(void)
{
    /* kern_attention reading f16, bf16 or fp8 K/V as stored gives the bits
     * of kv_dequantize followed by kern_attention on the f32 rows, on every
     * path: random values, then every (finite) bit pattern of the dtype in
     * the keys and values, then every pattern with NaNs and infinities. The
     * narrow buffers are allocated to the byte so that ASan catches a read
     * past the last row. */
    enum kern_path paths[KERN_PATH_COUNT];
    int np = path_list(paths);
    uint64_t s = g_seed ^ 0xd7e;
    int cases[][5] = {/* n_heads, n_kv_heads, hd, bs, n_pos */
                      {8, 2, 64, 16, 100}, {2, 1, 48, 5, 37},  {4, 4, 16, 16, 16},
                      {3, 1, 8, 1, 9},     {6, 2, 80, 16, 70}, {1, 1, 2, 5, 1},
                      {8, 2, 64, 16, 17},  {5, 5, 33, 7, 50},  {8, 2, 64, 16, 512}};
    int ncase = (int)(sizeof(cases) / sizeof(cases[0]));
    if (g_quick)
        cases[ncase - 1][4] = 64; /* still every fp8 pattern, a part of the 16-bit ones */
    for (int dt = KV_DTYPE_F16; dt < KV_DTYPE_COUNT; dt++) {
        size_t es = kv_dtype_size((enum kv_dtype)dt);
        for (int ci = 0; ci < ncase; ci++) {
            int nh = cases[ci][0], nkv = cases[ci][1], hd = cases[ci][2], bs = cases[ci][3];
            int npos = cases[ci][4], stride = nkv * hd + (ci % 2 ? 3 : 0);
            int nblk = (npos + bs - 1) / bs;
            size_t nval = (size_t)nblk * bs * stride;
            uint8_t *kmem = malloc(nval * es), *vmem = malloc(nval * es);
            float *kref = malloc(nval * 4), *vref = malloc(nval * 4);
            const void **kb = malloc((size_t)nblk * sizeof(*kb)),
                       **vb = malloc((size_t)nblk * sizeof(*vb)),
                       **kr = malloc((size_t)nblk * sizeof(*kr)),
                       **vr = malloc((size_t)nblk * sizeof(*vr));
            /* Blocks in reverse order in memory: block 0's last row ends the buffer. */
            for (int b = 0; b < nblk; b++) {
                size_t o = (size_t)(nblk - 1 - b) * bs * stride;
                kb[b] = kmem + o * es;
                vb[b] = vmem + o * es;
                kr[b] = kref + o;
                vr[b] = vref + o;
            }
            float *q = malloc((size_t)nh * hd * 4), *want = malloc((size_t)nh * hd * 4);
            float *got = malloc((size_t)nh * hd * 4), *scratch = malloc((size_t)nh * npos * 4);
            int nmode = ci == 4 || ci == 7 || ci == ncase - 1 ? 3 : 1;
            for (int mode = 0; mode < nmode; mode++) {
                kv_fill((enum kv_dtype)dt, kmem, nval, mode, &s);
                kv_fill((enum kv_dtype)dt, vmem, nval, mode, &s);
                kv_dequantize((enum kv_dtype)dt, kref, kmem, nval);
                kv_dequantize((enum kv_dtype)dt, vref, vmem, nval);
                for (int i = 0; i < nh * hd; i++)
                    q[i] = rng_unif(&s) * 2.0f;
                for (int p = 0; p < np; p++) {
                    kern_set_path(paths[p]);
                    kern_attention(want, q, nh, nkv, hd, npos, KV_DTYPE_F32, kr, vr, bs, stride,
                                   scratch);
                    memset(got, 0xa5, (size_t)nh * hd * 4);
                    kern_attention(got, q, nh, nkv, hd, npos, (enum kv_dtype)dt, kb, vb, bs, stride,
                                   scratch);
                    /* With NaNs in K/V (mode 2) a NaN output must be NaN in
                     * both, but its payload may differ: which NaN operand of
                     * an fma propagates depends on the instruction form the
                     * compiler picked, which may differ between a key loaded
                     * from memory and one widened in a register. */
                    int i = 0;
                    while (i < nh * hd && (memcmp(got + i, want + i, 4) == 0 ||
                                           (mode == 2 && isnan(got[i]) && isnan(want[i]))))
                        i++;
                    if (i < nh * hd) {
                        uint32_t g, w;
                        memcpy(&g, got + i, 4);
                        memcpy(&w, want + i, 4);
                        printf("\n%s K/V, %s path, case %d, mode %d: out[%d] = %08x, "
                               "dequantised first %08x\n",
                               kv_dtype_name((enum kv_dtype)dt), kern_path_name(paths[p]), ci, mode,
                               i, g, w);
                        CU_FAIL("attention on narrow K/V differs from dequantised K/V");
                    }
                }
            }
            free(kmem);
            free(vmem);
            free(kref);
            free(vref);
            free(kb);
            free(vb);
            free(kr);
            free(vr);
            free(q);
            free(want);
            free(got);
            free(scratch);
        }
    }
    kern_set_path(paths[0]);
}

static void test_kernels_attention(void)
{
    /* kern_attention against a double-precision reference, and the same
     * bits on every path, for head sizes with and without lane tails, GQA
     * groups of 1..4, block sizes 1, 5 and 16, rows wider than the heads. */
    enum kern_path paths[KERN_PATH_COUNT];
    int np = path_list(paths);
    uint64_t s = g_seed ^ 0xa77;
    int cases[][5] = {/* n_heads, n_kv_heads, hd, bs, n_pos */
                      {8, 2, 64, 16, 100}, {2, 1, 48, 5, 37},  {4, 4, 16, 16, 16},
                      {3, 1, 8, 1, 9},     {6, 2, 80, 16, 70}, {1, 1, 2, 5, 1},
                      {8, 2, 64, 16, 17},  {5, 5, 33, 7, 50}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int nh = cases[ci][0], nkv = cases[ci][1], hd = cases[ci][2], bs = cases[ci][3];
        int npos = cases[ci][4], grp = nh / nkv, stride = nkv * hd + 3;
        int nblk = (npos + bs - 1) / bs;
        float *kmem = malloc((size_t)nblk * bs * stride * 4);
        float *vmem = malloc((size_t)nblk * bs * stride * 4);
        for (size_t i = 0; i < (size_t)nblk * bs * stride; i++) {
            kmem[i] = rng_unif(&s) * 2.0f;
            vmem[i] = rng_unif(&s);
        }
        /* Blocks in reverse order in memory. */
        const float **kb = malloc((size_t)nblk * sizeof(*kb)),
                    **vb = malloc((size_t)nblk * sizeof(*vb));
        const void **kbv = malloc((size_t)nblk * sizeof(*kbv)),
                   **vbv = malloc((size_t)nblk * sizeof(*vbv));
        for (int b = 0; b < nblk; b++) {
            kb[b] = kmem + (size_t)(nblk - 1 - b) * bs * stride;
            vb[b] = vmem + (size_t)(nblk - 1 - b) * bs * stride;
            kbv[b] = kb[b];
            vbv[b] = vb[b];
        }
        float *q = malloc((size_t)nh * hd * 4), *out = malloc((size_t)nh * hd * 4);
        float *want = malloc((size_t)nh * hd * 4), *scratch = malloc((size_t)nh * npos * 4);
        for (int i = 0; i < nh * hd; i++)
            q[i] = rng_unif(&s) * 2.0f;
        double err = 0;
        for (int h = 0; h < nh; h++) {
            int g = h / grp;
            double *sc = malloc((size_t)npos * sizeof(double)), mx = -1e300, sum = 0;
            for (int t = 0; t < npos; t++) {
                const float *k = kb[t / bs] + (size_t)(t % bs) * stride + g * hd;
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[h * hd + i] * k[i];
                sc[t] = d / sqrt((double)hd);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (int t = 0; t < npos; t++)
                sum += (sc[t] = exp(sc[t] - mx));
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int t = 0; t < npos; t++)
                    acc += sc[t] / sum * vb[t / bs][(size_t)(t % bs) * stride + g * hd + i];
                want[h * hd + i] = (float)acc;
            }
            free(sc);
        }
        float *first = malloc((size_t)nh * hd * 4);
        for (int p = 0; p < np; p++) {
            kern_set_path(paths[p]);
            kern_attention(out, q, nh, nkv, hd, npos, KV_DTYPE_F32, kbv, vbv, bs, stride, scratch);
            if (p == 0) {
                memcpy(first, out, (size_t)nh * hd * 4);
                for (int i = 0; i < nh * hd; i++)
                    err = fmax(err, fabs(out[i] - want[i]));
                CU_ASSERT(err < 1e-5);
            } else if (memcmp(first, out, (size_t)nh * hd * 4) != 0) {
                printf("\nattention case %zu: %s differs from %s\n", ci, kern_path_name(paths[p]),
                       kern_path_name(paths[0]));
                CU_FAIL("attention differs between paths");
            }
        }
        free(first);
        free(kmem);
        free(vmem);
        free(kb);
        free(vb);
        free(kbv);
        free(vbv);
        free(q);
        free(out);
        free(want);
        free(scratch);
    }
    kern_set_path(paths[0]);
}

static void test_paths_api(void)
{
    enum kern_path p;
    CU_ASSERT_EQUAL(kern_path_parse("avx2", &p), 0);
    CU_ASSERT_EQUAL(p, KERN_PATH_AVX2);
    CU_ASSERT_EQUAL(kern_path_parse("sse", &p), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(kern_path_name(KERN_PATH_AVX512), "avx512");
    CU_ASSERT_EQUAL(kern_set_path((enum kern_path)17), TANDEM_EINVAL);
    CU_ASSERT(kern_path_supported(KERN_PATH_SCALAR));
    printf("[default path %s] ", kern_path_name(kern_active_path()));
}

static void test_default_preset(void)
{
    struct tiny_config c;
    tiny_default_config(&c);
    CU_ASSERT_EQUAL(c.dim, 512);
    CU_ASSERT_EQUAL(c.hidden_dim, 1376);
    CU_ASSERT_EQUAL(c.n_layers, 8);
    CU_ASSERT_EQUAL(c.n_heads, 8);
    CU_ASSERT_EQUAL(c.n_kv_heads, 2);
    CU_ASSERT_EQUAL(c.vocab_size, 512);
    CU_ASSERT_EQUAL(c.max_context, 4096);
    CU_ASSERT_EQUAL(c.seed, 0x7a6e646dULL);
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    const struct model_info *mi = &be->info;
    CU_ASSERT_STRING_EQUAL(mi->name, "tiny");
    CU_ASSERT_STRING_EQUAL(be->ops->name, "tiny");
    CU_ASSERT_EQUAL(mi->head_dim, 64);
    CU_ASSERT_EQUAL(mi->bos_id, 1);
    CU_ASSERT_EQUAL(mi->eos_id, 2);
    CU_ASSERT_EQUAL(mi->emits_tokens, 0);
    CU_ASSERT_EQUAL(mi->max_context, 4096);
    CU_ASSERT_PTR_NULL(be->ops->step_end);
    CU_ASSERT_EQUAL(backend_kv_bytes_per_token(mi, KV_DTYPE_F32), 8192u);
    /* Deterministic weights: two builds give the same logits. */
    struct backend *be2 = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be2, &c), 0);
    uint32_t tok[20];
    for (int i = 0; i < 20; i++)
        tok[i] = (uint32_t)(3 + "Hello, tiny world!!!"[i]);
    float *l1 = malloc(20 * 512 * 4), *l2 = malloc(20 * 512 * 4);
    struct kv_pool *kv = make_pool(be, 4, 16, KV_DTYPE_F32);
    int32_t blocks[4] = {0, 1, 2, 3};
    CU_ASSERT_EQUAL(prefill_chunked(be, kv, blocks, tok, 20, 0, l1), 0);
    CU_ASSERT_EQUAL(prefill_chunked(be2, kv, blocks, tok, 20, 8, l2), 0);
    CU_ASSERT_EQUAL(memcmp(l1, l2, 20 * 512 * 4), 0);
    int finite = 1;
    for (int i = 0; i < 20 * 512; i++)
        finite &= isfinite(l1[i]) != 0;
    CU_ASSERT(finite);
    /* A different shape is not named like the preset. */
    struct backend *be3 = NULL;
    struct tiny_config a;
    cfg_a(&a);
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be3, &a), 0);
    CU_ASSERT(strncmp(be3->info.name, "tiny-", 5) == 0);
    be3->ops->destroy(be3);
    kv_pool_destroy(kv);
    free(l1);
    free(l2);
    be->ops->destroy(be);
    be2->ops->destroy(be2);
}

static void test_bad_config(void)
{
    struct tiny_config c;
    struct backend *be = NULL;
    log_set_level(LOG_LEVEL_ERROR + 1);
    cfg_a(&c);
    c.n_heads = 3; /* 64 % 3 */
    CU_ASSERT_EQUAL(tiny_create(&be, &c), TANDEM_EINVAL);
    cfg_a(&c);
    c.n_kv_heads = 3;
    CU_ASSERT_EQUAL(tiny_create(&be, &c), TANDEM_EINVAL);
    cfg_a(&c);
    c.n_heads = 64; /* head_dim 1: odd */
    c.n_kv_heads = 1;
    CU_ASSERT_EQUAL(tiny_create(&be, &c), TANDEM_EINVAL);
    cfg_a(&c);
    c.vocab_size = 0;
    CU_ASSERT_EQUAL(tiny_create(&be, &c), TANDEM_EINVAL);
    cfg_a(&c);
    c.max_context = -1;
    CU_ASSERT_EQUAL(tiny_create(&be, &c), TANDEM_EINVAL);
    log_set_level(LOG_LEVEL_WARN);
    CU_ASSERT_PTR_NULL(be);
}

/* The reference comparison on one path for shapes A and B. */
static void reference_on_path(enum kern_path path)
{
    CU_ASSERT_EQUAL_FATAL(kern_set_path(path), 0);
    struct tiny_config cfgs[2];
    cfg_a(&cfgs[0]);
    cfg_b(&cfgs[1]);
    uint64_t s = g_seed ^ 0x3e;
    for (int i = 0; i < 2; i++) {
        struct backend *be = NULL;
        CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &cfgs[i]), 0);
        char path_buf[300];
        tmp_path(path_buf, sizeof(path_buf), "ref.bin");
        CU_ASSERT_EQUAL_FATAL(tiny_save(be, path_buf), 0);
        struct ref_model m;
        CU_ASSERT_EQUAL_FATAL(ref_read(&m, path_buf), 0);
        CU_ASSERT_EQUAL(m.shared, !cfgs[i].separate_classifier);
        double err = ref_error(be, &m, 64, &s);
        CU_ASSERT(err < 1e-3);
        free(m.all);
        unlink(path_buf);
        be->ops->destroy(be);
    }
}

static void test_reference(void)
{
    enum kern_path paths[KERN_PATH_COUNT];
    int np = path_list(paths);
    for (int p = 0; p < np; p++) {
        printf("[%s] ", kern_path_name(paths[p]));
        reference_on_path(paths[p]);
    }
    kern_set_path(paths[0]);
}

/* Sequence state for the batch tests. */
#define TS_MAXB 16
#define TS_MAXT (TS_MAXB * 16)
struct tseq {
    int32_t blocks[TS_MAXB];
    uint32_t hist[TS_MAXT];
    int len; /* positions with KV written */
};

static void tseq_start(struct backend *be, struct kv_pool *kv, struct tseq *t, int *next_block,
                       int plen, uint64_t *s, float *scratch)
{
    for (int b = 0; b < TS_MAXB; b++)
        t->blocks[b] = (*next_block)++;
    for (int i = 0; i < TS_MAXT; i++)
        t->hist[i] = rng_below(s, (uint32_t)be->info.vocab_size);
    CU_ASSERT_EQUAL(prefill_chunked(be, kv, t->blocks, t->hist, plen, 0, scratch), 0);
    t->len = plen;
}

/* Logits of a target sequence at every decode step are bitwise the same
 * alone and at any index of batches of the given sizes. */
static void invariance_on_path(enum kern_path path, const int *sizes, int n_sizes, int steps)
{
    CU_ASSERT_EQUAL_FATAL(kern_set_path(path), 0);
    struct tiny_config c;
    cfg_a(&c);
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    int voc = c.vocab_size, plen0 = 5;
    float *scratch = malloc((size_t)TS_MAXT * voc * 4);
    float *alone = malloc((size_t)steps * voc * 4);
    struct kv_pool *kv = make_pool(be, 65 * TS_MAXB, 16, KV_DTYPE_F32);
    struct tseq *ts = calloc(64, sizeof(*ts));
    struct be_seq *bs = calloc(64, sizeof(*bs));
    struct be_out *outs = calloc(64, sizeof(*outs));
    float *lg = malloc((size_t)64 * voc * 4);

    /* Alone. */
    uint64_t s = g_seed ^ 0x1a;
    int nb = 0;
    struct tseq target;
    tseq_start(be, kv, &target, &nb, plen0, &s, scratch);
    uint32_t hist0[TS_MAXT];
    memcpy(hist0, target.hist, sizeof(hist0));
    for (int st = 0; st < steps; st++) {
        struct be_seq q = {.blocks = target.blocks, .pos = target.len, .history = target.hist};
        struct be_out o = {.logits = alone + (size_t)st * voc};
        CU_ASSERT_EQUAL(be->ops->decode(be, kv, 1, &q, &o), 0);
        target.len++;
    }
    int mismatches = 0;
    for (int si = 0; si < n_sizes; si++) {
        int B = sizes[si];
        int where = (int)rng_below(&s, (uint32_t)B);
        nb = TS_MAXB; /* block 0..15 stay with the alone run */
        for (int i = 0; i < B; i++) {
            if (i == where) {
                for (int b = 0; b < TS_MAXB; b++)
                    ts[i].blocks[b] = nb++;
                memcpy(ts[i].hist, hist0, sizeof(hist0));
                CU_ASSERT_EQUAL(
                    prefill_chunked(be, kv, ts[i].blocks, ts[i].hist, plen0, 3, scratch), 0);
                ts[i].len = plen0;
            } else {
                tseq_start(be, kv, &ts[i], &nb, 1 + (int)rng_below(&s, 60), &s, scratch);
            }
        }
        for (int st = 0; st < steps; st++) {
            for (int i = 0; i < B; i++) {
                bs[i] = (struct be_seq){.blocks = ts[i].blocks,
                                        .pos = ts[i].len,
                                        .history = ts[i].hist,
                                        .seed = (uint64_t)i};
                outs[i].logits = lg + (size_t)i * voc;
            }
            CU_ASSERT_EQUAL(be->ops->decode(be, kv, B, bs, outs), 0);
            for (int i = 0; i < B; i++)
                ts[i].len++;
            if (memcmp(lg + (size_t)where * voc, alone + (size_t)st * voc, (size_t)voc * 4) != 0)
                mismatches++;
        }
    }
    if (mismatches)
        printf("\n%d mismatching steps on %s\n", mismatches, kern_path_name(path));
    CU_ASSERT_EQUAL(mismatches, 0);
    kv_pool_destroy(kv);
    free(scratch);
    free(alone);
    free(ts);
    free(bs);
    free(outs);
    free(lg);
    be->ops->destroy(be);
}

static void test_batch_invariance(void)
{
    enum kern_path paths[KERN_PATH_COUNT];
    path_list(paths);
    if (g_quick) {
        /* Both sides of every SIMD tile edge the kernels have (8, 16). */
        int sizes[] = {2, 3, 7, 8, 9, 16, 17, 33, 64};
        invariance_on_path(paths[0], sizes, 9, 3);
        return;
    }
    int sizes[63];
    for (int i = 0; i < 63; i++)
        sizes[i] = i + 2;
    invariance_on_path(paths[0], sizes, 63, 24);
}

static void test_paths_invariance(void)
{
    /* Every path: reference checked in test_reference; here invariance on a
     * few batch sizes, and the same bits on every path. */
    enum kern_path paths[KERN_PATH_COUNT];
    int np = path_list(paths);
    int sizes[] = {2, 7, 64};
    for (int p = 0; p < np; p++) {
        printf("[%s] ", kern_path_name(paths[p]));
        invariance_on_path(paths[p], sizes, 3, g_quick ? 2 : paths[p] == KERN_PATH_SCALAR ? 4 : 12);
    }
    struct tiny_config c;
    cfg_b(&c);
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    int n = 40, voc = c.vocab_size;
    uint32_t tok[40];
    uint64_t s = g_seed ^ 0x9a7;
    for (int i = 0; i < n; i++)
        tok[i] = rng_below(&s, (uint32_t)voc);
    float *want = malloc((size_t)n * voc * 4), *got = malloc((size_t)n * voc * 4);
    int32_t blocks[4] = {0, 1, 2, 3};
    for (int p = 0; p < np; p++) {
        kern_set_path(paths[p]);
        struct kv_pool *kv = make_pool(be, 4, 16, KV_DTYPE_F32);
        CU_ASSERT_EQUAL(prefill_chunked(be, kv, blocks, tok, n, 9, p == 0 ? want : got), 0);
        if (p > 0) {
            int same = memcmp(want, got, (size_t)n * voc * 4) == 0;
            if (!same)
                printf("\n%s differs from %s\n", kern_path_name(paths[p]),
                       kern_path_name(paths[0]));
            CU_ASSERT(same);
        }
        kv_pool_destroy(kv);
    }
    kern_set_path(paths[0]);
    free(want);
    free(got);
    be->ops->destroy(be);
}

/* Bytes of every K and V slot of positions 0..n-1, in position order. */
static void gather_kv(struct kv_pool *kv, const int32_t *blocks, int n, int L, size_t vec_bytes,
                      int bs, uint8_t *dst)
{
    for (int p = 0; p < n; p++)
        for (int l = 0; l < L; l++)
            for (int kind = 0; kind < 2; kind++) {
                memcpy(dst, kv_block_data(kv, blocks[p / bs]) + kv_slot_offset(kv, l, kind, p % bs),
                       vec_bytes);
                dst += vec_bytes;
            }
}

static void test_chunked_prefill(void)
{
    struct tiny_config c;
    cfg_a(&c);
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    int n = g_quick ? 40 : 200, voc = c.vocab_size, nblk = (n + 15) / 16;
    uint32_t tok[200];
    uint64_t s = g_seed ^ 0xc4;
    for (int i = 0; i < n; i++)
        tok[i] = rng_below(&s, (uint32_t)voc);
    int32_t blocks[16];
    for (int i = 0; i < 16; i++)
        blocks[i] = i;
    int chunks[] = {0, 1, 7, 16, 100, -1 /* token-by-token decode */};
    int nch = (int)(sizeof(chunks) / sizeof(chunks[0]));
    for (int dt = 0; dt < KV_DTYPE_COUNT; dt++) {
        size_t vec = (size_t)be->info.n_kv_heads * be->info.head_dim * kv_dtype_size(dt);
        size_t kvn = (size_t)n * c.n_layers * 2 * vec;
        float *want = malloc((size_t)n * voc * 4), *got = malloc((size_t)n * voc * 4);
        uint8_t *kwant = malloc(kvn), *kgot = malloc(kvn);
        for (int ci = 0; ci < nch; ci++) {
            struct kv_pool *kv = make_pool(be, nblk, 16, (enum kv_dtype)dt);
            float *dst = ci == 0 ? want : got;
            int rc = chunks[ci] >= 0 ? prefill_chunked(be, kv, blocks, tok, n, chunks[ci], dst)
                                     : decode_all(be, kv, blocks, tok, n, dst);
            CU_ASSERT_EQUAL(rc, 0);
            gather_kv(kv, blocks, n, c.n_layers, vec, 16, ci == 0 ? kwant : kgot);
            if (ci > 0) {
                int same_l = memcmp(want, got, (size_t)n * voc * 4) == 0;
                int same_kv = memcmp(kwant, kgot, kvn) == 0;
                if (!same_l || !same_kv)
                    printf("\n%s chunk %d: logits %s, KV %s\n", kv_dtype_name(dt), chunks[ci],
                           same_l ? "same" : "DIFFER", same_kv ? "same" : "DIFFER");
                CU_ASSERT(same_l);
                CU_ASSERT(same_kv);
            }
            kv_pool_destroy(kv);
        }
        free(want);
        free(got);
        free(kwant);
        free(kgot);
    }
    be->ops->destroy(be);
}

static void test_scattered_blocks(void)
{
    struct tiny_config c;
    cfg_b(&c);
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    int voc = c.vocab_size, n = 100;
    uint64_t s = g_seed ^ 0x5c;
    uint32_t tok[100];
    for (int i = 0; i < n; i++)
        tok[i] = rng_below(&s, (uint32_t)voc);
    int bsizes[] = {16, 5};
    for (int bi = 0; bi < 2; bi++) {
        for (int dt = 0; dt < KV_DTYPE_COUNT; dt += 3) { /* f32 and fp8 */
            int bs = bsizes[bi], nblk = (n + bs - 1) / bs, pool_blocks = 3 * nblk;
            int32_t contig[100], scat[100], perm[300];
            for (int i = 0; i < pool_blocks; i++)
                perm[i] = i;
            for (int i = pool_blocks - 1; i > 0; i--) {
                int j = (int)rng_below(&s, (uint32_t)i + 1);
                int tmp = perm[i];
                perm[i] = perm[j];
                perm[j] = tmp;
            }
            for (int i = 0; i < nblk; i++) {
                contig[i] = i;
                scat[i] = perm[i];
            }
            float *a = malloc((size_t)n * voc * 4), *b = malloc((size_t)n * voc * 4);
            size_t vec = (size_t)be->info.n_kv_heads * be->info.head_dim * kv_dtype_size(dt);
            size_t kvn = (size_t)n * c.n_layers * 2 * vec;
            uint8_t *ka = malloc(kvn), *kb = malloc(kvn);
            struct kv_pool *p1 = make_pool(be, pool_blocks, bs, (enum kv_dtype)dt);
            struct kv_pool *p2 = make_pool(be, pool_blocks, bs, (enum kv_dtype)dt);
            /* 60 by prefill in chunks of 11, then decode. */
            CU_ASSERT_EQUAL(prefill_chunked(be, p1, contig, tok, 60, 11, a), 0);
            CU_ASSERT_EQUAL(prefill_chunked(be, p2, scat, tok, 60, 11, b), 0);
            for (int p = 60; p < n; p++) {
                struct be_seq q1 = {.blocks = contig, .pos = p, .history = tok};
                struct be_seq q2 = {.blocks = scat, .pos = p, .history = tok};
                struct be_out o1 = {.logits = a + (size_t)p * voc};
                struct be_out o2 = {.logits = b + (size_t)p * voc};
                CU_ASSERT_EQUAL(be->ops->decode(be, p1, 1, &q1, &o1), 0);
                CU_ASSERT_EQUAL(be->ops->decode(be, p2, 1, &q2, &o2), 0);
            }
            CU_ASSERT_EQUAL(memcmp(a, b, (size_t)n * voc * 4), 0);
            gather_kv(p1, contig, n, c.n_layers, vec, bs, ka);
            gather_kv(p2, scat, n, c.n_layers, vec, bs, kb);
            CU_ASSERT_EQUAL(memcmp(ka, kb, kvn), 0);
            kv_pool_destroy(p1);
            kv_pool_destroy(p2);
            free(a);
            free(b);
            free(ka);
            free(kb);
        }
    }
    be->ops->destroy(be);
}

static void same_logits(struct backend *x, struct backend *y, int n, uint64_t *s)
{
    int voc = x->info.vocab_size;
    uint32_t *tok = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++)
        tok[i] = rng_below(s, (uint32_t)voc);
    float *a = malloc((size_t)n * voc * 4), *b = malloc((size_t)n * voc * 4);
    int32_t blocks[64];
    for (int i = 0; i < 64; i++)
        blocks[i] = i;
    struct kv_pool *kv = make_pool(x, (n + 15) / 16, 16, KV_DTYPE_F32);
    CU_ASSERT_EQUAL(prefill_chunked(x, kv, blocks, tok, n, 0, a), 0);
    CU_ASSERT_EQUAL(prefill_chunked(y, kv, blocks, tok, n, 0, b), 0);
    CU_ASSERT_EQUAL(memcmp(a, b, (size_t)n * voc * 4), 0);
    kv_pool_destroy(kv);
    free(tok);
    free(a);
    free(b);
}

static int file_equal(const char *p1, const char *p2)
{
    FILE *a = fopen(p1, "rb"), *b = fopen(p2, "rb");
    int same = a != NULL && b != NULL;
    while (same) {
        int ca = fgetc(a), cb = fgetc(b);
        if (ca != cb)
            same = 0;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (a)
        fclose(a);
    if (b)
        fclose(b);
    return same;
}

static void test_checkpoint_roundtrip(void)
{
    /* In-memory model -> tiny_save -> tiny_load: same info, same bits. */
    struct tiny_config cfgs[2];
    cfg_a(&cfgs[0]);
    cfg_b(&cfgs[1]);
    uint64_t s = g_seed ^ 0xcc;
    for (int i = 0; i < 2; i++) {
        struct backend *be = NULL, *ld = NULL;
        CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &cfgs[i]), 0);
        char p1[300], p2[300];
        tmp_path(p1, sizeof(p1), "model-a.bin");
        tmp_path(p2, sizeof(p2), "model-b.bin");
        CU_ASSERT_EQUAL_FATAL(tiny_save(be, p1), 0);
        CU_ASSERT_EQUAL_FATAL(tiny_load(&ld, p1), 0);
        CU_ASSERT_STRING_EQUAL(ld->info.name, "model-a");
        CU_ASSERT_EQUAL(ld->info.dim, be->info.dim);
        CU_ASSERT_EQUAL(ld->info.hidden_dim, be->info.hidden_dim);
        CU_ASSERT_EQUAL(ld->info.n_layers, be->info.n_layers);
        CU_ASSERT_EQUAL(ld->info.n_heads, be->info.n_heads);
        CU_ASSERT_EQUAL(ld->info.n_kv_heads, be->info.n_kv_heads);
        CU_ASSERT_EQUAL(ld->info.head_dim, be->info.head_dim);
        CU_ASSERT_EQUAL(ld->info.vocab_size, be->info.vocab_size);
        CU_ASSERT_EQUAL(ld->info.max_context, be->info.max_context);
        CU_ASSERT_EQUAL(ld->info.bos_id, 1);
        CU_ASSERT_EQUAL(ld->info.eos_id, 2);
        struct tiny_config lc;
        CU_ASSERT_EQUAL(tiny_get_config(ld, &lc), 0);
        CU_ASSERT_EQUAL(lc.separate_classifier, cfgs[i].separate_classifier);
        same_logits(be, ld, 40, &s);
        /* Saving the loaded model gives the same file. */
        CU_ASSERT_EQUAL(tiny_save(ld, p2), 0);
        CU_ASSERT(file_equal(p1, p2));
        unlink(p1);
        unlink(p2);
        be->ops->destroy(be);
        ld->ops->destroy(ld);
    }
}

static void test_checkpoint_written_by_test(void)
{
    /* A file the test writes with fwrite in llama2.c's layout, shared and
     * separate classifier: loads, matches the reference, and reads back. */
    for (int shared = 0; shared < 2; shared++) {
        struct tiny_config c;
        cfg_a(&c);
        c.max_context = 64;
        struct ref_model m;
        ref_random(&m, &c, shared, g_seed ^ (0x77 + (uint64_t)shared));
        char p[300], p2[300];
        tmp_path(p, sizeof(p), shared ? "stories-shared.bin" : "stories-sep.bin");
        tmp_path(p2, sizeof(p2), "resaved.bin");
        CU_ASSERT_EQUAL_FATAL(ref_write(&m, p), 0);
        struct backend *be = NULL;
        CU_ASSERT_EQUAL_FATAL(tiny_load(&be, p), 0);
        CU_ASSERT_STRING_EQUAL(be->info.name, shared ? "stories-shared" : "stories-sep");
        uint64_t s = g_seed ^ 0x61;
        double err = ref_error(be, &m, 64, &s);
        CU_ASSERT(err < 1e-3);
        /* The weights the backend holds are exactly the file's. */
        CU_ASSERT_EQUAL(tiny_save(be, p2), 0);
        struct ref_model back;
        CU_ASSERT_EQUAL_FATAL(ref_read(&back, p2), 0);
        CU_ASSERT_EQUAL(back.shared, shared);
        size_t nw = (size_t)(back.rope - back.all); /* every tensor before the RoPE tables */
        CU_ASSERT_EQUAL(memcmp(back.all, m.all, nw * 4), 0);
        if (!shared)
            CU_ASSERT_EQUAL(
                memcmp(back.wcls, m.wcls, (size_t)m.vocab * (size_t)m.dim * sizeof(float)), 0);
        /* The reloaded file gives the same bits as the first load. */
        struct backend *be2 = NULL;
        CU_ASSERT_EQUAL_FATAL(tiny_load(&be2, p2), 0);
        same_logits(be, be2, 30, &s);
        be2->ops->destroy(be2);
        free(back.all);
        free(m.all);
        unlink(p);
        unlink(p2);
        be->ops->destroy(be);
    }
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    if (n > 0)
        CU_ASSERT_EQUAL(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void test_checkpoint_errors(void)
{
    struct tiny_config c;
    cfg_a(&c);
    c.max_context = 32;
    struct ref_model m;
    ref_random(&m, &c, 0, g_seed);
    char good[300], bad[300];
    tmp_path(good, sizeof(good), "good.bin");
    tmp_path(bad, sizeof(bad), "bad.bin");
    CU_ASSERT_EQUAL_FATAL(ref_write(&m, good), 0);
    FILE *f = fopen(good, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *bytes = malloc((size_t)size + 16);
    CU_ASSERT_EQUAL_FATAL(fread(bytes, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    memset(bytes + size, 0, 16);

    struct backend *be = NULL;
    log_set_level(LOG_LEVEL_ERROR + 1); /* the errors below are expected */
    CU_ASSERT_EQUAL(tiny_load(&be, good), 0);
    if (be)
        be->ops->destroy(be);
    be = NULL;
    tmp_path(bad, sizeof(bad), "does-not-exist.bin");
    CU_ASSERT_EQUAL(tiny_load(&be, bad), TANDEM_ENOENT);
    tmp_path(bad, sizeof(bad), "bad.bin");
    CU_ASSERT_EQUAL(tiny_load(&be, g_dir), TANDEM_EIO); /* a directory */
    long cuts[] = {0, 3, 27, 28, 100, size / 2, size - 4, size - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        write_bytes(bad, bytes, (size_t)cuts[i]);
        CU_ASSERT_EQUAL(tiny_load(&be, bad), TANDEM_ETRUNCATED);
    }
    write_bytes(bad, bytes, (size_t)size + 1); /* trailing byte */
    CU_ASSERT_EQUAL(tiny_load(&be, bad), TANDEM_EFORMAT);
    /* Header fields: dim 0, heads not dividing dim, kv heads not dividing
     * heads, odd head_dim, negative layers, vocab INT32_MIN, seq_len 0, magic. */
    int32_t edits[][2] = {{0, 0},  {3, 3},         {4, 3}, {3, 64},
                          {2, -1}, {5, INT32_MIN}, {6, 0}, {0, 0x616b3432}};
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        uint8_t *copy = malloc((size_t)size);
        memcpy(copy, bytes, (size_t)size);
        memcpy(copy + 4 * edits[i][0], &edits[i][1], 4);
        if (i == 3) { /* 64 heads of 1 -> odd head_dim; keep kv heads dividing */
            int32_t one = 1;
            memcpy(copy + 16, &one, 4);
        }
        write_bytes(bad, copy, (size_t)size);
        int rc = tiny_load(&be, bad);
        if (rc != TANDEM_EFORMAT)
            printf("\nheader edit %zu: %s\n", i, tandem_errname(rc));
        CU_ASSERT_EQUAL(rc, TANDEM_EFORMAT);
        free(copy);
    }
    /* A header that says "shared classifier" on a file that has one: the
     * file is longer than described. */
    memcpy(bytes + 20, &(int32_t){m.vocab}, 4);
    write_bytes(bad, bytes, (size_t)size);
    CU_ASSERT_EQUAL(tiny_load(&be, bad), TANDEM_EFORMAT);
    log_set_level(LOG_LEVEL_WARN);
    CU_ASSERT_PTR_NULL(be);
    unlink(good);
    unlink(bad);
    free(bytes);
    free(m.all);
}

static void test_call_errors(void)
{
    struct tiny_config c;
    cfg_a(&c);
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    log_set_level(LOG_LEVEL_ERROR + 1);
    int voc = c.vocab_size;
    float *lg = malloc((size_t)voc * 4);
    int32_t blocks[16];
    for (int i = 0; i < 16; i++)
        blocks[i] = i;
    uint32_t tok[4] = {1, 2, 3, (uint32_t)voc};
    struct be_seq s = {.blocks = blocks, .pos = 0, .history = tok};
    struct be_out o = {.logits = lg};
    struct kv_pool *kv = make_pool(be, 16, 16, KV_DTYPE_F32);
    CU_ASSERT_EQUAL(be->ops->prefill(be, kv, &s, tok, 4, &o, NULL), TANDEM_EINVAL); /* token */
    CU_ASSERT_EQUAL(be->ops->prefill(be, kv, &s, tok, 0, &o, NULL), TANDEM_EINVAL);
    s.pos = c.max_context - 2;
    CU_ASSERT_EQUAL(be->ops->prefill(be, kv, &s, tok, 3, &o, NULL), TANDEM_ERANGE);
    s.pos = 0;
    CU_ASSERT_EQUAL(be->ops->prefill(be, kv, &s, tok, 3, &o, NULL), 0);
    s.pos = 3;
    CU_ASSERT_EQUAL(be->ops->decode(be, kv, 1, &s, &o), TANDEM_EINVAL); /* history[3] */
    CU_ASSERT_EQUAL(be->ops->decode(be, kv, 0, NULL, NULL), 0);
    /* A pool of another shape. */
    struct kv_config kc = {.n_layers = c.n_layers + 1,
                           .n_kv_heads = c.n_kv_heads,
                           .head_dim = be->info.head_dim,
                           .block_size = 16,
                           .dtype = KV_DTYPE_F32,
                           .n_blocks = 4};
    struct kv_pool *other = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&other, &kc), 0);
    s.pos = 0;
    CU_ASSERT_EQUAL(be->ops->prefill(be, other, &s, tok, 3, &o, NULL), TANDEM_EINVAL);
    kv_pool_destroy(other);
    CU_ASSERT_EQUAL(tiny_save(NULL, "x"), TANDEM_EINVAL);
    log_set_level(LOG_LEVEL_WARN);
    kv_pool_destroy(kv);
    free(lg);
    be->ops->destroy(be);
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static void test_kv_dtypes(void)
{
    /* Every dtype runs a greedy generation; values stay finite and close to
     * f32 (the measured token agreement on the preset is in docs/engine.md). */
    struct tiny_config c;
    cfg_a(&c);
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    int voc = c.vocab_size, plen = 20, gen = 30, n = plen + gen;
    uint64_t s = g_seed ^ 0xd7;
    uint32_t ref_tok[64];
    int32_t blocks[4] = {0, 1, 2, 3};
    float *lg = malloc((size_t)n * voc * 4), *ref_lg = malloc((size_t)n * voc * 4);
    for (int i = 0; i < plen; i++)
        ref_tok[i] = rng_below(&s, (uint32_t)voc);
    for (int dt = 0; dt < KV_DTYPE_COUNT; dt++) {
        uint32_t tok[64];
        memcpy(tok, ref_tok, sizeof(tok));
        struct kv_pool *kv = make_pool(be, 4, 16, (enum kv_dtype)dt);
        CU_ASSERT_EQUAL(prefill_chunked(be, kv, blocks, tok, plen, 0, lg), 0);
        for (int p = plen; p < n; p++) {
            tok[p] = (uint32_t)argmax(lg + (size_t)(p - 1) * voc, voc);
            struct be_seq q = {.blocks = blocks, .pos = p, .history = tok};
            struct be_out o = {.logits = lg + (size_t)p * voc};
            CU_ASSERT_EQUAL(be->ops->decode(be, kv, 1, &q, &o), 0);
        }
        double max_diff = 0;
        int finite = 1, same_tokens = 0;
        for (size_t i = 0; i < (size_t)n * voc; i++)
            finite &= isfinite(lg[i]) != 0;
        if (dt == KV_DTYPE_F32) {
            memcpy(ref_lg, lg, (size_t)n * voc * 4);
            memcpy(ref_tok, tok, sizeof(tok));
        } else {
            /* The prompt's logits see the same tokens: compare them. */
            for (size_t i = 0; i < (size_t)plen * voc; i++)
                if (fabs(lg[i] - ref_lg[i]) > max_diff)
                    max_diff = fabs(lg[i] - ref_lg[i]);
            for (int p = plen; p < n; p++)
                same_tokens += tok[p] == ref_tok[p];
            printf("[%s: max prompt-logit diff %.3g, %d/%d tokens as f32] ", kv_dtype_name(dt),
                   max_diff, same_tokens, gen);
            double bound = dt == KV_DTYPE_FP8 ? 2.0 : dt == KV_DTYPE_BF16 ? 0.5 : 0.05;
            CU_ASSERT(max_diff < bound);
            CU_ASSERT(max_diff > 0);
        }
        CU_ASSERT(finite);
        kv_pool_destroy(kv);
    }
    free(lg);
    free(ref_lg);
    be->ops->destroy(be);
}

int main(void)
{
    const char *env = getenv("TANDEM_TEST_SEED");
    g_seed = env != NULL ? strtoull(env, NULL, 0) : 0x7e57u;
    env = getenv("TANDEM_TEST_QUICK");
    g_quick = env != NULL && strcmp(env, "0") != 0;
    printf("test_tiny seed %" PRIu64 " (replay with TANDEM_TEST_SEED=%" PRIu64 ")\n", g_seed,
           g_seed);
    log_init("test_tiny", LOG_LEVEL_WARN);
    snprintf(g_dir, sizeof(g_dir), "/tmp/test_tiny.XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("tiny", NULL, NULL);
    CU_add_test(s, "paths_api", test_paths_api);
    CU_add_test(s, "kernels_canonical", test_kernels_canonical);
#ifdef TEST_ASAN
    CU_add_test(s, "matmul_footprint_asan", test_matmul_footprint_asan);
#endif
    CU_add_test(s, "kernels_exp_softmax", test_kernels_exp_softmax);
    CU_add_test(s, "kernels_attention", test_kernels_attention);
    CU_add_test(s, "kernels_attention_kv_dtypes", test_kernels_attention_kv_dtypes);
    CU_add_test(s, "default_preset", test_default_preset);
    CU_add_test(s, "bad_config", test_bad_config);
    CU_add_test(s, "reference", test_reference);
    CU_add_test(s, "batch_invariance", test_batch_invariance);
    CU_add_test(s, "paths_invariance", test_paths_invariance);
    CU_add_test(s, "chunked_prefill", test_chunked_prefill);
    CU_add_test(s, "scattered_blocks", test_scattered_blocks);
    CU_add_test(s, "checkpoint_roundtrip", test_checkpoint_roundtrip);
    CU_add_test(s, "checkpoint_written_by_test", test_checkpoint_written_by_test);
    CU_add_test(s, "checkpoint_errors", test_checkpoint_errors);
    CU_add_test(s, "call_errors", test_call_errors);
    CU_add_test(s, "kv_dtypes", test_kv_dtypes);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    rmdir(g_dir);
    return failed ? 1 : 0;
}
