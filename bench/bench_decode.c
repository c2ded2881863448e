/* Benchmarks of the tiny backend (results in docs/performance.md, "tiny
 * engine", and docs/engine.md for the KV dtype agreement).
 *
 *   bench_decode [--sections decode,naive,prefill,gemm,kvdtype] [--ctx N]
 *                [--steps N] [--max-batch N] [--kv-dtype f32|f16|bf16|fp8]
 *
 * decode   aggregate decode tokens/s for batch 1, 2, 4, ..., max-batch on the
 *          default preset, one thread, every sequence at context ctx; per
 *          batch size the bytes a step must read (weights + every sequence's
 *          KV at the KV dtype) over the step's CPU time, against this core's
 *          memory bandwidth (STREAM-like copy, triad and read) measured just
 *          before, and the step's matmuls alone.
 * naive    batch-1 decode of a plain llama2.c-style fp32 forward (matrix-vector
 *          loops, no SIMD intrinsics) at the same context, for comparison.
 * prefill  prefill tokens/s and GFLOP/s of a ctx-token prompt, several chunk sizes.
 * gemm     GFLOP/s of the batch-invariant matmul on a decode step's shapes
 *          against OpenBLAS cblas_sgemm on the same shapes, when
 *          libopenblas.so.0 can be loaded (dlopen; nothing links against it).
 *          Run with OPENBLAS_CORETYPE set to the real core (e.g. SkylakeX on
 *          AMD Zen 4/5) and OPENBLAS_NUM_THREADS=1.
 * kvdtype  how often greedy tokens under f16, bf16 and fp8 KV differ from f32
 *          (16 prompts x 64 generated tokens on the default preset).
 * Default: every section but kvdtype. */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "bench_util.h"
#include "kernels.h"
#include "kv_cache.h"
#include "log.h"
#include "tandem_err.h"
#include "tiny.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float rng_unif(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 40) / 8388608.0 - 1.0);
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

/* ---- shared setup: the preset, a pool, 64 sequences at context ctx ---------------- */

struct setup {
    struct backend *be;
    struct kv_pool *kv;
    int ctx, steps, n_seqs, blocks_per_seq;
    int32_t *blocks;   /* (n_seqs, blocks_per_seq) */
    uint32_t *hist;    /* (n_seqs, ctx + steps) */
    float *logits;     /* (n_seqs, vocab) */
    float *first_step; /* (vocab) sequence 0's logits at position ctx, batch 1 */
};

static void setup_init(struct setup *s, int ctx, int steps, int n_seqs, enum kv_dtype dt)
{
    memset(s, 0, sizeof(*s));
    struct tiny_config c;
    tiny_default_config(&c);
    if (tiny_create(&s->be, &c) != 0)
        DIE("tiny_create failed");
    const struct model_info *mi = &s->be->info;
    s->ctx = ctx;
    s->steps = steps;
    s->n_seqs = n_seqs;
    s->blocks_per_seq = (ctx + steps + 15) / 16;
    struct kv_config kc = {.n_layers = mi->n_layers,
                           .n_kv_heads = mi->n_kv_heads,
                           .head_dim = mi->head_dim,
                           .block_size = 16,
                           .dtype = dt,
                           .n_blocks = n_seqs * s->blocks_per_seq};
    if (kv_pool_create(&s->kv, &kc) != 0)
        DIE("kv_pool_create failed");
    int len = ctx + steps;
    s->blocks = malloc((size_t)n_seqs * s->blocks_per_seq * sizeof(int32_t));
    s->hist = malloc((size_t)n_seqs * len * sizeof(uint32_t));
    s->logits = malloc((size_t)n_seqs * mi->vocab_size * sizeof(float));
    s->first_step = malloc((size_t)mi->vocab_size * sizeof(float));
    uint64_t r = 42;
    for (int i = 0; i < n_seqs * s->blocks_per_seq; i++)
        s->blocks[i] = i;
    for (int i = 0; i < n_seqs * len; i++)
        s->hist[i] = 3 + (uint32_t)(rng_next(&r) % 256);
    /* Prefill sequence 0 once; the others get copies of its KV blocks, so
     * every sequence reads its own ctx positions of KV from memory. */
    struct be_seq q = {.blocks = s->blocks, .pos = 0, .history = s->hist};
    struct be_out o = {.logits = s->logits};
    if (s->be->ops->prefill(s->be, s->kv, &q, s->hist, ctx, &o, NULL) != 0)
        DIE("prefill failed");
    for (int i = 1; i < n_seqs; i++) {
        memcpy(s->hist + (size_t)i * len, s->hist, (size_t)ctx * sizeof(uint32_t));
        for (int b = 0; b < (ctx + 15) / 16; b++)
            memcpy(kv_block_data(s->kv, s->blocks[(size_t)i * s->blocks_per_seq + b]),
                   kv_block_data(s->kv, s->blocks[b]), kv_block_bytes(s->kv));
    }
}

static void setup_fini(struct setup *s)
{
    kv_pool_destroy(s->kv);
    s->be->ops->destroy(s->be);
    free(s->blocks);
    free(s->hist);
    free(s->logits);
    free(s->first_step);
}

/* Decodes `steps` steps of sequences 0..B-1 from position ctx; wall seconds,
 * and the thread's CPU seconds in *cpu_s when it is not NULL. */
static double run_decode(struct setup *s, int B, int steps, double *cpu_s)
{
    struct be_seq *seqs = calloc((size_t)B, sizeof(*seqs));
    struct be_out *outs = calloc((size_t)B, sizeof(*outs));
    int len = s->ctx + s->steps, voc = s->be->info.vocab_size;
    double c0 = bench_cpu_s(), t0 = bench_now_s();
    for (int st = 0; st < steps; st++) {
        for (int i = 0; i < B; i++) {
            seqs[i].blocks = s->blocks + (size_t)i * s->blocks_per_seq;
            seqs[i].pos = s->ctx + st;
            seqs[i].history = s->hist + (size_t)i * len;
            outs[i].logits = s->logits + (size_t)i * voc;
        }
        if (s->be->ops->decode(s->be, s->kv, B, seqs, outs) != 0)
            DIE("decode failed");
        if (st == 0 && B == 1)
            memcpy(s->first_step, s->logits, (size_t)voc * sizeof(float));
    }
    double dt = bench_now_s() - t0;
    if (cpu_s != NULL)
        *cpu_s = bench_cpu_s() - c0;
    free(seqs);
    free(outs);
    return dt;
}

/* ---- this machine's memory bandwidth (STREAM-like) -------------------------------- */

/* Doubles per array: 128 MiB each, four times the 32 MiB L3 of the machine the
 * figures in docs/performance.md come from, so every pass streams from DRAM. */
#define BW_N ((size_t)16 << 20)

struct bw {
    double *a, *b, *c;        /* (BW_N) each */
    double copy, triad, read; /* GB/s, best of the passes of the last bw_measure */
};

static void bw_init(struct bw *w)
{
    memset(w, 0, sizeof(*w));
    w->a = malloc(BW_N * sizeof(double));
    w->b = malloc(BW_N * sizeof(double));
    w->c = malloc(BW_N * sizeof(double));
    if (w->a == NULL || w->b == NULL || w->c == NULL)
        DIE("bandwidth arrays: out of memory (3 x %zu MiB); free memory or lower BW_N",
            BW_N * sizeof(double) >> 20);
    for (size_t i = 0; i < BW_N; i++) { /* first touch: page faults stay out of the timing */
        w->a[i] = 1.0;
        w->b[i] = 2.0;
        w->c[i] = 0.5;
    }
}

static void bw_fini(struct bw *w)
{
    free(w->a);
    free(w->b);
    free(w->c);
}

/* One thread, best of `passes` of each kernel in thread CPU time (as the
 * decode steps it is compared with), counted as STREAM counts:
 * copy a = b (memcpy: glibc uses non-temporal stores at this size, so the
 * counted 16 bytes per element are the real traffic), triad a = b + s c (24
 * bytes per element counted; write-allocate makes it 32), read: a sum of b
 * (8 bytes per element, what a decode step mostly does). */
static void bw_measure(struct bw *w, int passes)
{
    size_t bytes = BW_N * sizeof(double);
    volatile double scalar = 3.0;
    double s = scalar, best_c = INFINITY, best_t = INFINITY, best_r = INFINITY;
    uint64_t sink = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = bench_cpu_s();
        memcpy(w->a, w->b, bytes);
        double t1 = bench_cpu_s();
        for (size_t i = 0; i < BW_N; i++)
            w->a[i] = w->b[i] + s * w->c[i];
        double t2 = bench_cpu_s();
        /* Integer sum: the compiler may vectorise it (a double sum it may not reorder). */
        const uint64_t *u = (const uint64_t *)(const void *)w->b;
        uint64_t acc = 0;
        for (size_t i = 0; i < BW_N; i++)
            acc += u[i];
        double t3 = bench_cpu_s();
        sink += acc + (uint64_t)w->a[p];
        best_c = fmin(best_c, t1 - t0);
        best_t = fmin(best_t, t2 - t1);
        best_r = fmin(best_r, t3 - t2);
    }
    w->copy = 2.0 * bytes / best_c * 1e-9;
    w->triad = 3.0 * bytes / best_t * 1e-9;
    w->read = (double)bytes / best_r * 1e-9 + (double)(sink == 42) * 1e-30;
}

/* The largest of the three: the denominator of "% of bandwidth". */
static double bw_best(const struct bw *w)
{
    return fmax(w->read, fmax(w->copy, w->triad));
}

/* Bytes one decode step of B sequences must read, each sequence attending
 * over n_pos positions: every weight once (the matrices and norm vectors;
 * the classifier once more when it is not the token embedding), B rows of the token
 * embedding, and B x n_pos positions of K and V at dtype dt. */
static double step_bytes(const struct backend *be, int B, double n_pos, enum kv_dtype dt)
{
    const struct model_info *mi = &be->info;
    double dim = mi->dim, hid = mi->hidden_dim, kvd = (double)mi->n_kv_heads * mi->head_dim;
    double per_layer = 2 * dim * dim + 2 * dim * kvd + 3 * dim * hid + 2 * dim;
    double weights = (mi->n_layers * per_layer + dim + (double)mi->vocab_size * dim) * 4;
    struct tiny_config c;
    if (tiny_get_config(be, &c) == 0 && c.separate_classifier)
        weights += (double)mi->vocab_size * dim * 4;
    return weights + B * dim * 4 + B * n_pos * (double)backend_kv_bytes_per_token(mi, dt);
}

/* A decode step's matrices with random weights, packed as the model packs
 * them: per layer wq wk wv wo w1 w3 w2, then the classifier. */
struct step_mats {
    int n;
    int (*shape)[2];     /* (n): n_out, n_in */
    float **w;           /* (n) each (n_out, n_in), as stored */
    struct kern_mat *km; /* (n) */
    float *x, *y;        /* (max_rows, widest n_in / n_out) activations */
    double flops_row;    /* 2 x the weights: one row through every matrix */
};

static void step_mats_init(struct step_mats *m, const struct model_info *mi, int max_rows)
{
    int kvd = mi->n_kv_heads * mi->head_dim;
    int per_layer[7][2] = {{mi->dim, mi->dim},
                           {kvd, mi->dim},
                           {kvd, mi->dim},
                           {mi->dim, mi->dim},
                           {mi->hidden_dim, mi->dim},
                           {mi->hidden_dim, mi->dim},
                           {mi->dim, mi->hidden_dim}};
    m->n = mi->n_layers * 7 + 1;
    m->shape = malloc((size_t)m->n * sizeof(*m->shape));
    for (int l = 0; l < mi->n_layers; l++)
        memcpy(m->shape[l * 7], per_layer, sizeof(per_layer));
    m->shape[m->n - 1][0] = mi->vocab_size;
    m->shape[m->n - 1][1] = mi->dim;
    m->w = malloc((size_t)m->n * sizeof(float *));
    m->km = malloc((size_t)m->n * sizeof(*m->km));
    uint64_t r = 7;
    m->flops_row = 0;
    for (int i = 0; i < m->n; i++) {
        size_t n = (size_t)m->shape[i][0] * m->shape[i][1];
        m->w[i] = malloc(n * sizeof(float));
        for (size_t j = 0; j < n; j++)
            m->w[i][j] = rng_unif(&r);
        if (kern_mat_pack(&m->km[i], m->w[i], m->shape[i][0], m->shape[i][1]) != 0)
            DIE("pack failed");
        m->flops_row += 2.0 * (double)n;
    }
    int maxw = mi->hidden_dim > mi->vocab_size ? mi->hidden_dim : mi->vocab_size;
    if (maxw < mi->dim)
        maxw = mi->dim;
    m->x = malloc((size_t)max_rows * maxw * sizeof(float));
    m->y = malloc((size_t)max_rows * maxw * sizeof(float));
    for (size_t j = 0; j < (size_t)max_rows * maxw; j++)
        m->x[j] = rng_unif(&r);
}

static void step_mats_fini(struct step_mats *m)
{
    for (int i = 0; i < m->n; i++) {
        free(m->w[i]);
        kern_mat_free(&m->km[i]);
    }
    free(m->w);
    free(m->km);
    free(m->shape);
    free(m->x);
    free(m->y);
}

/* Every matmul of a B-row step (B <= max_rows), weights from memory; CPU seconds. */
static double step_mats_run(const struct step_mats *m, int B)
{
    double t0 = bench_cpu_s();
    for (int i = 0; i < m->n; i++)
        kern_matmul(m->y, m->shape[i][0], m->x, m->shape[i][1], B, &m->km[i]);
    return bench_cpu_s() - t0;
}
static double batch1_tps;

static void section_decode(struct setup *s, int max_batch)
{
    enum kv_dtype dt = kv_pool_config(s->kv)->dtype;
    char load[64];
    bench_loadavg(load, sizeof(load));
    printf("\n## decode: default preset, one thread, context %d, %s KV, path %s (%s)\n", s->ctx,
           kv_dtype_name(dt), kern_path_name(kern_active_path()), load);
    printf("(best of 3 runs of %d steps per batch size, wall and thread CPU time; tokens/s and\n"
           "GB/s from CPU time, which other processes' preemption does not inflate. Before\n"
           "each batch size, this core's memory bandwidth: best of 3 passes of copy, triad and\n"
           "read over 128 MiB arrays, CPU time; %% of bandwidth = bytes a step must read / step\n"
           "CPU time / the best of the three. matmul ms: the step's matrices alone, B rows,\n"
           "CPU time; ceiling: the %% a step would reach if it were those matmuls then one read\n"
           "of its KV at that bandwidth)\n",
           s->steps);
    printf("| batch | wall ms | CPU ms | tokens/s | x batch 1 | MB read/step | GB/s | copy / triad "
           "/ read GB/s | %% of bandwidth | matmul ms | ceiling |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    struct bw w;
    bw_init(&w);
    struct step_mats m;
    step_mats_init(&m, &s->be->info, max_batch);
    run_decode(s, 1, 2, NULL); /* warm up */
    /* Step st attends over positions 0..ctx+st: the mean over the run. */
    double n_pos = s->ctx + 1 + (s->steps - 1) / 2.0;
    for (int B = 1; B <= max_batch; B *= 2) {
        bw_measure(&w, 3);
        /* Best of three runs: batch 1 is bound by memory bandwidth, which
         * other processes on the machine share. */
        int steps = s->steps;
        double wall = INFINITY, cpu = INFINITY;
        for (int rep = 0; rep < 3; rep++) {
            double c;
            wall = fmin(wall, run_decode(s, B, steps, &c));
            cpu = fmin(cpu, c);
        }
        double mm = INFINITY;
        for (int rep = 0; rep < 3; rep++)
            mm = fmin(mm, step_mats_run(&m, B));
        double bw = bw_best(&w) * 1e9;
        double kv_bytes = B * n_pos * (double)backend_kv_bytes_per_token(&s->be->info, dt);
        double tps = (double)B * steps / cpu, bytes = step_bytes(s->be, B, n_pos, dt);
        double gbs = bytes / (cpu / steps) * 1e-9;
        if (B == 1)
            batch1_tps = tps;
        printf("| %d | %.2f | %.2f | %.0f | %.1f | %.1f | %.1f | %.1f / %.1f / %.1f | %.0f%% | "
               "%.2f | %.0f%% |\n",
               B, wall * 1e3 / steps, cpu * 1e3 / steps, tps, tps / batch1_tps, bytes * 1e-6, gbs,
               w.copy, w.triad, w.read, 100.0 * gbs / bw_best(&w), mm * 1e3,
               100.0 * bytes / (mm + kv_bytes / bw) / bw);
        fflush(stdout);
    }
    bw_fini(&w);
    step_mats_fini(&m);
}

/* ---- naive llama2.c-style forward ---------------------------------------------- */

struct naive {
    int dim, hid, L, nh, nkv, voc, seq_len, hd, kvd;
    float *all;
    float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
    float *kc, *vc; /* (L, seq_len, kvd) */
    float *x, *xb, *xb2, *q, *hb, *hb2, *att, *logits;
};

static void naive_load(struct naive *m, const char *path)
{
    FILE *f = fopen(path, "rb");
    int32_t h[7];
    if (f == NULL || fread(h, 4, 7, f) != 7)
        DIE("cannot read %s", path);
    m->dim = h[0];
    m->hid = h[1];
    m->L = h[2];
    m->nh = h[3];
    m->nkv = h[4];
    m->voc = abs(h[5]);
    m->seq_len = h[6];
    m->hd = m->dim / m->nh;
    m->kvd = m->hd * m->nkv;
    size_t dim = (size_t)m->dim, hid = (size_t)m->hid, L = (size_t)m->L, kvd = (size_t)m->kvd;
    size_t n = (size_t)m->voc * dim +
               L * (2 * dim + 2 * dim * dim + 2 * dim * kvd + 3 * dim * hid) + dim +
               (size_t)m->seq_len * (size_t)m->hd + (h[5] < 0 ? (size_t)m->voc * dim : 0);
    m->all = malloc(n * sizeof(float));
    if (fread(m->all, sizeof(float), n, f) != n)
        DIE("short read %s", path);
    fclose(f);
    float *p = m->all;
    m->emb = p, p += (size_t)m->voc * dim;
    m->rms_att = p, p += L * dim;
    m->wq = p, p += L * dim * dim;
    m->wk = p, p += L * dim * kvd;
    m->wv = p, p += L * dim * kvd;
    m->wo = p, p += L * dim * dim;
    m->rms_ffn = p, p += L * dim;
    m->w1 = p, p += L * dim * hid;
    m->w2 = p, p += L * dim * hid;
    m->w3 = p, p += L * dim * hid;
    m->rms_final = p, p += dim;
    p += (size_t)m->seq_len * (size_t)m->hd;
    m->wcls = h[5] < 0 ? p : m->emb;
    m->kc = calloc(L * (size_t)m->seq_len * kvd, sizeof(float));
    m->vc = calloc(L * (size_t)m->seq_len * kvd, sizeof(float));
    m->x = malloc(dim * 4);
    m->xb = malloc(dim * 4);
    m->xb2 = malloc(dim * 4);
    m->q = malloc(dim * 4);
    m->att = malloc((size_t)m->nh * (size_t)m->seq_len * 4);
    m->hb = malloc(hid * 4);
    m->hb2 = malloc(hid * 4);
    m->logits = malloc((size_t)m->voc * 4);
}

static void naive_free(struct naive *m)
{
    free(m->all);
    free(m->kc);
    free(m->vc);
    free(m->x);
    free(m->xb);
    free(m->xb2);
    free(m->q);
    free(m->att);
    free(m->hb);
    free(m->hb2);
    free(m->logits);
}

static void n_rmsnorm(float *o, const float *x, const float *w, int n)
{
    float ss = 0.0f;
    for (int j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss /= n;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* llama2.c run.c matmul: W (d,n) @ x (n) -> xout (d). */
static void n_matmul(float *xout, const float *x, const float *w, int n, int d)
{
    for (int i = 0; i < d; i++) {
        float val = 0.0f;
        for (int j = 0; j < n; j++)
            val += w[(size_t)i * n + j] * x[j];
        xout[i] = val;
    }
}

static void n_softmax(float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

/* llama2.c run.c forward(), one token. */
static float *naive_forward(struct naive *m, int token, int pos)
{
    int dim = m->dim, kvd = m->kvd, hd = m->hd, hid = m->hid, grp = m->nh / m->nkv;
    float *x = m->x;
    memcpy(x, m->emb + (size_t)token * dim, (size_t)dim * 4);
    for (int l = 0; l < m->L; l++) {
        n_rmsnorm(m->xb, x, m->rms_att + (size_t)l * dim, dim);
        size_t loff = (size_t)l * m->seq_len * kvd;
        float *k = m->kc + loff + (size_t)pos * kvd, *v = m->vc + loff + (size_t)pos * kvd;
        n_matmul(m->q, m->xb, m->wq + (size_t)l * dim * dim, dim, dim);
        n_matmul(k, m->xb, m->wk + (size_t)l * dim * kvd, dim, kvd);
        n_matmul(v, m->xb, m->wv + (size_t)l * dim * kvd, dim, kvd);
        for (int i = 0; i < dim; i += 2) {
            float freq = 1.0f / powf(10000.0f, (float)(i % hd) / (float)hd);
            float val = (float)pos * freq, fcr = cosf(val), fci = sinf(val);
            int rotn = i < kvd ? 2 : 1;
            for (int vi = 0; vi < rotn; vi++) {
                float *vec = vi == 0 ? m->q : k;
                float v0 = vec[i], v1 = vec[i + 1];
                vec[i] = v0 * fcr - v1 * fci;
                vec[i + 1] = v0 * fci + v1 * fcr;
            }
        }
        for (int h = 0; h < m->nh; h++) {
            const float *q = m->q + h * hd;
            float *att = m->att + (size_t)h * m->seq_len;
            for (int t = 0; t <= pos; t++) {
                const float *kt = m->kc + loff + (size_t)t * kvd + (h / grp) * hd;
                float score = 0.0f;
                for (int i = 0; i < hd; i++)
                    score += q[i] * kt[i];
                att[t] = score / sqrtf((float)hd);
            }
            n_softmax(att, pos + 1);
            float *xb = m->xb + h * hd;
            memset(xb, 0, (size_t)hd * 4);
            for (int t = 0; t <= pos; t++) {
                const float *vt = m->vc + loff + (size_t)t * kvd + (h / grp) * hd;
                for (int i = 0; i < hd; i++)
                    xb[i] += att[t] * vt[i];
            }
        }
        n_matmul(m->xb2, m->xb, m->wo + (size_t)l * dim * dim, dim, dim);
        for (int i = 0; i < dim; i++)
            x[i] += m->xb2[i];
        n_rmsnorm(m->xb, x, m->rms_ffn + (size_t)l * dim, dim);
        n_matmul(m->hb, m->xb, m->w1 + (size_t)l * dim * hid, dim, hid);
        n_matmul(m->hb2, m->xb, m->w3 + (size_t)l * dim * hid, dim, hid);
        for (int i = 0; i < hid; i++) {
            float val = m->hb[i];
            val *= (1.0f / (1.0f + expf(-val)));
            m->hb[i] = val * m->hb2[i];
        }
        n_matmul(m->xb, m->hb, m->w2 + (size_t)l * dim * hid, hid, dim);
        for (int i = 0; i < dim; i++)
            x[i] += m->xb[i];
    }
    n_rmsnorm(x, x, m->rms_final, dim);
    n_matmul(m->logits, x, m->wcls, dim, m->voc);
    return m->logits;
}

static void section_naive(struct setup *s)
{
    char path[] = "/tmp/bench_decode.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        DIE("mkstemp failed");
    close(fd);
    if (tiny_save(s->be, path) != 0)
        DIE("tiny_save failed");
    struct naive m;
    naive_load(&m, path);
    unlink(path);
    /* Same KV as sequence 0 (copied into llama2.c's contiguous layout). */
    const struct model_info *mi = &s->be->info;
    enum kv_dtype kdt = kv_pool_config(s->kv)->dtype;
    size_t kvd = (size_t)m.kvd;
    for (int l = 0; l < m.L; l++)
        for (int p = 0; p < s->ctx; p++) {
            const uint8_t *blk = kv_block_data(s->kv, s->blocks[p / 16]);
            kv_dequantize(kdt, m.kc + ((size_t)l * m.seq_len + p) * kvd,
                          blk + kv_slot_offset(s->kv, l, 0, p % 16), kvd);
            kv_dequantize(kdt, m.vc + ((size_t)l * m.seq_len + p) * kvd,
                          blk + kv_slot_offset(s->kv, l, 1, p % 16), kvd);
        }
    int steps = s->steps < 16 ? s->steps : 16;
    double t0 = bench_now_s();
    for (int st = 0; st < steps; st++) {
        float *lg = naive_forward(&m, (int)s->hist[s->ctx + st], s->ctx + st);
        if (st == 0 && batch1_tps > 0) {
            double err = 0;
            for (int i = 0; i < mi->vocab_size; i++)
                err = fmax(err, fabs(lg[i] - s->first_step[i]));
            printf("(naive vs tiny logits at position %d: max |diff| %.2g)\n", s->ctx, err);
        }
    }
    double dt = bench_now_s() - t0;
    double tps = steps / dt;
    printf("\n## naive llama2.c-style forward, batch 1, context %d\n", s->ctx);
    printf("| engine | tokens/s |\n|---|---:|\n| naive fp32 matvec loops | %.1f |\n", tps);
    if (batch1_tps > 0)
        printf("| tiny (batch-invariant kernels) | %.1f |\n\ntiny / naive = %.2fx\n", batch1_tps,
               batch1_tps / tps);
    naive_free(&m);
}

/* ---- prefill -------------------------------------------------------------------- */

static void section_prefill(struct setup *s)
{
    const struct model_info *mi = &s->be->info;
    int n = s->ctx;
    double flops = 0;
    for (int p = 0; p < n; p++)
        flops += tiny_flops_per_token(mi, p);
    /* Last-position logits only (no prompt logprobs): classifier once. */
    flops -= (n - 1) * 2.0 * mi->dim * mi->vocab_size;
    printf("\n## prefill: default preset, one thread, %d-token prompt (%.2f GFLOP)\n", n,
           flops * 1e-9);
    printf("| chunk | seconds | tokens/s | GFLOP/s |\n|---:|---:|---:|---:|\n");
    int chunks[] = {n, 256, 64, 16};
    struct be_out o = {.logits = s->logits};
    for (size_t ci = 0; ci < sizeof(chunks) / sizeof(chunks[0]); ci++) {
        int chunk = chunks[ci];
        if (chunk > n)
            continue;
        double t0 = bench_now_s();
        for (int p = 0; p < n; p += chunk) {
            int m = n - p < chunk ? n - p : chunk;
            struct be_seq q = {.blocks = s->blocks, .pos = p, .history = s->hist};
            if (s->be->ops->prefill(s->be, s->kv, &q, s->hist + p, m, &o, NULL) != 0)
                DIE("prefill failed");
        }
        double dt = bench_now_s() - t0;
        /* Chunks compute the classifier once per chunk. */
        double f = flops + ((n + chunk - 1) / chunk - 1) * 2.0 * mi->dim * mi->vocab_size;
        printf("| %d | %.3f | %.0f | %.1f |\n", chunk, dt, n / dt, f / dt * 1e-9);
        fflush(stdout);
    }
}

/* ---- matmul vs OpenBLAS sgemm on decode shapes ------------------------------------ */

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
#define CBLAS_ROW_MAJOR 101
#define CBLAS_NO_TRANS  111
#define CBLAS_TRANS     112

static void section_gemm(const struct setup *s)
{
    struct step_mats m;
    step_mats_init(&m, &s->be->info, 64);
    int nm = m.n;
    int(*shape)[2] = m.shape;
    float **w = m.w, *x = m.x, *y = m.y;
    double flops_row = m.flops_row;
    float **wt = malloc((size_t)nm * sizeof(float *)); /* W transposed: (n_in, n_out) */
    for (int i = 0; i < nm; i++) {
        wt[i] = malloc((size_t)shape[i][0] * shape[i][1] * sizeof(float));
        for (int o = 0; o < shape[i][0]; o++)
            for (int k = 0; k < shape[i][1]; k++)
                wt[i][(size_t)k * shape[i][0] + o] = w[i][(size_t)o * shape[i][1] + k];
    }

    sgemm_fn sgemm = NULL;
    void *lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    const char *corename = "?";
    if (lib == NULL)
        lib = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
    if (lib != NULL) {
        *(void **)&sgemm = dlsym(lib, "cblas_sgemm");
        void (*set_threads)(int);
        *(void **)&set_threads = dlsym(lib, "openblas_set_num_threads");
        if (set_threads != NULL)
            set_threads(1);
        char *(*get_core)(void);
        *(void **)&get_core = dlsym(lib, "openblas_get_corename");
        if (get_core != NULL)
            corename = get_core();
    }
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("\n## matmul GFLOP/s on a decode step's shapes (%d matrices, %.1f MB of fp32 "
           "weights), one thread\n",
           nm, flops_row * 2 / 1e6);
    if (sgemm != NULL)
        printf("OpenBLAS: core %s (OPENBLAS_CORETYPE=%s)\n", corename, ct ? ct : "unset");
    else
        printf("OpenBLAS: libopenblas.so.0 not found, sgemm column skipped\n");
    printf("sgemm A: C = X W^T with W as stored (n_out x n_in, transb); sgemm B: W stored "
           "transposed (n_in x n_out)\n");
    printf("| batch | tiny kernel GFLOP/s | sgemm A GFLOP/s | sgemm B GFLOP/s | tiny / best sgemm "
           "|\n|---:|---:|---:|---:|---:|\n");
    int Bs[] = {1, 4, 16, 64};
    for (size_t bi = 0; bi < sizeof(Bs) / sizeof(Bs[0]); bi++) {
        int B = Bs[bi];
        double flops = flops_row * B;
        int reps = B >= 16 ? 4 : 12;
        double best_k = 1e30, best_a = 1e30, best_b = 1e30;
        for (int rep = 0; rep < reps; rep++) {
            double t0 = bench_now_s();
            for (int i = 0; i < nm; i++)
                kern_matmul(y, shape[i][0], x, shape[i][1], B, &m.km[i]);
            best_k = fmin(best_k, bench_now_s() - t0);
            if (sgemm != NULL) {
                t0 = bench_now_s();
                for (int i = 0; i < nm; i++)
                    sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, B, shape[i][0], shape[i][1],
                          1.0f, x, shape[i][1], w[i], shape[i][1], 0.0f, y, shape[i][0]);
                best_a = fmin(best_a, bench_now_s() - t0);
                t0 = bench_now_s();
                for (int i = 0; i < nm; i++)
                    sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, B, shape[i][0],
                          shape[i][1], 1.0f, x, shape[i][1], wt[i], shape[i][0], 0.0f, y,
                          shape[i][0]);
                best_b = fmin(best_b, bench_now_s() - t0);
            }
        }
        if (sgemm != NULL)
            printf("| %d | %.1f | %.1f | %.1f | %.2f |\n", B, flops / best_k * 1e-9,
                   flops / best_a * 1e-9, flops / best_b * 1e-9, fmin(best_a, best_b) / best_k);
        else
            printf("| %d | %.1f | - | - | - |\n", B, flops / best_k * 1e-9);
        fflush(stdout);
    }
    if (lib != NULL)
        dlclose(lib);
    for (int i = 0; i < nm; i++)
        free(wt[i]);
    free(wt);
    step_mats_fini(&m);
}

/* ---- KV dtype agreement ------------------------------------------------------------- */

static const char *const prompts[16] = {
    "The quick brown fox",
    "Once upon a time, there was",
    "int main(void) {",
    "Disaggregated serving splits prefill",
    "1, 1, 2, 3, 5, 8, 13,",
    "The capital of France is",
    "KV cache blocks are",
    "Hello, world!",
    "In the beginning",
    "SELECT name FROM users WHERE",
    "To be, or not to be:",
    "The weather today is",
    "def fib(n):",
    "A B C D E F G",
    "Lorem ipsum dolor sit amet",
    "Tandem is a prototype",
};

#define KVD_GEN 64

/* Greedy generation of KVD_GEN tokens for every prompt, batched (batch
 * invariance makes this the same as one at a time). When forced is not NULL
 * the given tokens are fed instead (teacher forcing) and out receives the
 * argmax at each step. tokens: (16, 128) prompt then generated. store, when
 * not NULL, receives the logits of every step: (16, KVD_GEN, vocab). */
static void kvd_run(struct backend *be, enum kv_dtype dt, uint32_t (*tok)[128], const int *plen,
                    const uint32_t (*forced)[128], uint32_t (*out)[128], float *store)
{
    const struct model_info *mi = &be->info;
    struct kv_config kc = {.n_layers = mi->n_layers,
                           .n_kv_heads = mi->n_kv_heads,
                           .head_dim = mi->head_dim,
                           .block_size = 16,
                           .dtype = dt,
                           .n_blocks = 16 * 8};
    struct kv_pool *kv = NULL;
    if (kv_pool_create(&kv, &kc) != 0)
        DIE("kv_pool_create failed");
    int32_t blocks[16][8];
    float *lg = malloc((size_t)16 * mi->vocab_size * sizeof(float));
    struct be_seq seqs[16];
    struct be_out outs[16];
    for (int i = 0; i < 16; i++) {
        for (int b = 0; b < 8; b++)
            blocks[i][b] = i * 8 + b;
        seqs[i] = (struct be_seq){.blocks = blocks[i], .pos = 0, .history = tok[i]};
        outs[i].logits = lg + (size_t)i * mi->vocab_size;
        if (be->ops->prefill(be, kv, &seqs[i], tok[i], plen[i], &outs[i], NULL) != 0)
            DIE("prefill failed");
    }
    for (int g = 0; g < KVD_GEN; g++) {
        for (int i = 0; i < 16; i++) {
            const float *l = outs[i].logits;
            if (store != NULL)
                memcpy(store + ((size_t)i * KVD_GEN + g) * mi->vocab_size, l,
                       (size_t)mi->vocab_size * sizeof(float));
            uint32_t best = 0;
            for (int v = 1; v < mi->vocab_size; v++)
                if (l[v] > l[best])
                    best = (uint32_t)v;
            int p = plen[i] + g;
            if (out != NULL)
                out[i][p] = best;
            tok[i][p] = forced != NULL ? forced[i][p] : best;
            seqs[i].pos = p;
        }
        if (g + 1 < KVD_GEN && be->ops->decode(be, kv, 16, seqs, outs) != 0)
            DIE("decode failed");
    }
    free(lg);
    kv_pool_destroy(kv);
}

static void section_kvdtype(void)
{
    struct tiny_config c;
    tiny_default_config(&c);
    struct backend *be = NULL;
    if (tiny_create(&be, &c) != 0)
        DIE("tiny_create failed");
    static uint32_t base[16][128], ref[16][128], tok[16][128], argm[16][128];
    int plen[16];
    for (int i = 0; i < 16; i++) {
        size_t n = strlen(prompts[i]);
        base[i][0] = (uint32_t)be->info.bos_id;
        for (size_t j = 0; j < n; j++)
            base[i][1 + j] = 3u + (unsigned char)prompts[i][j];
        plen[i] = (int)n + 1;
    }
    int voc = be->info.vocab_size;
    size_t nl = (size_t)16 * KVD_GEN * voc;
    float *ref_lg = malloc(nl * sizeof(float)), *dt_lg = malloc(nl * sizeof(float));
    memcpy(ref, base, sizeof(ref));
    kvd_run(be, KV_DTYPE_F32, ref, plen, NULL, NULL, ref_lg);
    /* How confident the f32 run is: top-1 minus top-2 logit at each step. */
    double *margin = malloc((size_t)16 * KVD_GEN * sizeof(double));
    for (int k = 0; k < 16 * KVD_GEN; k++) {
        const float *l = ref_lg + (size_t)k * voc;
        double a = -INFINITY, b = -INFINITY;
        for (int v = 0; v < voc; v++) {
            if (l[v] > a) {
                b = a;
                a = l[v];
            } else if (l[v] > b) {
                b = l[v];
            }
        }
        margin[k] = a - b;
    }
    for (int i = 1; i < 16 * KVD_GEN; i++) /* insertion sort: 1024 values */
        for (int j = i; j > 0 && margin[j - 1] > margin[j]; j--) {
            double tmp = margin[j];
            margin[j] = margin[j - 1];
            margin[j - 1] = tmp;
        }
    printf("\n## greedy tokens vs f32 KV: default preset, 16 prompts x %d generated tokens\n",
           KVD_GEN);
    printf("f32 top-1 minus top-2 logit over the %d steps: min %.3f, 5th percentile %.3f, "
           "median %.3f\n",
           16 * KVD_GEN, margin[0], margin[16 * KVD_GEN / 20], margin[16 * KVD_GEN / 2]);
    printf("| KV dtype | bytes/token | free-running tokens equal to f32 (same position) | "
           "prompts identical to the end | mean first divergence | teacher-forced argmax "
           "disagreement | teacher-forced mean / max abs logit error |\n"
           "|---|---:|---:|---:|---:|---:|---:|\n");
    for (int dt = KV_DTYPE_F16; dt < KV_DTYPE_COUNT; dt++) {
        memcpy(tok, base, sizeof(tok));
        kvd_run(be, (enum kv_dtype)dt, tok, plen, NULL, NULL, NULL);
        int same = 0, identical = 0;
        double first_sum = 0;
        for (int i = 0; i < 16; i++) {
            int first = KVD_GEN;
            for (int g = 0; g < KVD_GEN; g++) {
                int p = plen[i] + g;
                same += tok[i][p] == ref[i][p];
                if (tok[i][p] != ref[i][p] && first == KVD_GEN)
                    first = g;
            }
            identical += first == KVD_GEN;
            first_sum += first;
        }
        /* Teacher forcing: feed f32's tokens, count steps whose argmax differs. */
        memcpy(tok, base, sizeof(tok));
        kvd_run(be, (enum kv_dtype)dt, tok, plen, (const uint32_t(*)[128])ref, argm, dt_lg);
        int differ = 0;
        for (int i = 0; i < 16; i++)
            for (int g = 0; g < KVD_GEN; g++)
                differ += argm[i][plen[i] + g] != ref[i][plen[i] + g];
        double err_sum = 0, err_max = 0;
        for (size_t k = 0; k < nl; k++) {
            double e = fabs((double)dt_lg[k] - ref_lg[k]);
            err_sum += e;
            err_max = fmax(err_max, e);
        }
        printf("| %s | %zu | %.1f%% (%d/%d) | %d/16 | %.1f | %.2f%% (%d/%d) | %.4f / %.3f |\n",
               kv_dtype_name((enum kv_dtype)dt),
               backend_kv_bytes_per_token(&be->info, (enum kv_dtype)dt),
               100.0 * same / (16 * KVD_GEN), same, 16 * KVD_GEN, identical, first_sum / 16,
               100.0 * differ / (16 * KVD_GEN), differ, 16 * KVD_GEN, err_sum / (double)nl,
               err_max);
        fflush(stdout);
    }
    /* A look at what the random weights write. */
    printf("\nf32 continuation of prompt 0 (first 24 token ids):");
    for (int g = 0; g < 24; g++)
        printf(" %u", ref[0][plen[0] + g]);
    printf("\n");
    free(margin);
    free(ref_lg);
    free(dt_lg);
    be->ops->destroy(be);
}

static int has(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    const char *sections = "decode,naive,prefill,gemm";
    int ctx = 512, steps = 32, max_batch = 64;
    enum kv_dtype dt = KV_DTYPE_F32;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sections") == 0 && i + 1 < argc)
            sections = argv[++i];
        else if (strcmp(argv[i], "--ctx") == 0 && i + 1 < argc)
            ctx = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--max-batch") == 0 && i + 1 < argc)
            max_batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--kv-dtype") == 0 && i + 1 < argc) {
            if (kv_dtype_parse(argv[++i], &dt) != 0)
                DIE("bad --kv-dtype %s", argv[i]);
        } else {
            fprintf(stderr,
                    "usage: %s [--sections decode,naive,prefill,gemm,kvdtype] [--ctx N] "
                    "[--steps N] [--max-batch N] [--kv-dtype f32|f16|bf16|fp8]\n",
                    argv[0]);
            return 2;
        }
    }
    if (ctx < 1 || steps < 1 || max_batch < 1 || ctx + steps > 4096)
        DIE("bad --ctx/--steps/--max-batch");
    log_init("bench_decode", LOG_LEVEL_WARN);
    printf("bench_decode: kernels path %s (TANDEM_SIMD=%s)\n", kern_path_name(kern_active_path()),
           getenv("TANDEM_SIMD") ? getenv("TANDEM_SIMD") : "unset");
    if (has(sections, "decode") || has(sections, "naive") || has(sections, "prefill") ||
        has(sections, "gemm")) {
        struct setup s;
        setup_init(&s, ctx, steps, max_batch, dt);
        if (has(sections, "decode"))
            section_decode(&s, max_batch);
        if (has(sections, "naive"))
            section_naive(&s);
        if (has(sections, "prefill"))
            section_prefill(&s);
        if (has(sections, "gemm"))
            section_gemm(&s);
        setup_fini(&s);
    }
    if (has(sections, "kvdtype"))
        section_kvdtype();
    return 0;
}
