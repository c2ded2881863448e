/* Batch-invariant kernels: scalar, AVX2+FMA and AVX-512F paths of the same
 * canonical arithmetic (see kernels.h). No global -m flags: the SIMD paths are
 * functions with target attributes, chosen at run time. */
#include "kernels.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tandem_err.h"

#define TARGET_AVX512 __attribute__((target("avx512f")))
#define TARGET_AVX2   __attribute__((target("avx2,fma,f16c")))
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Under AddressSanitizer and ThreadSanitizer the matmul kernels' own loads
 * and stores are not instrumented (MATMUL_UNCHECKED): the checks of their
 * per-element and 64-byte accesses were 85% of an ASan engine's time and a
 * third of a TSan one's (CI's sanitizer stages ran the tiny model at a third
 * of its speed). Instead kern_matmul checks each call's footprint once before
 * the kernel runs (check_footprint): under ASan every x row, y row and the
 * packed weights must be addressable; under TSan every x row is a read and
 * every y row a write (the weights are written once, at load, and a worker
 * runs its engine on its loop thread). An out-of-bounds or racing matmul is
 * still reported. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KERN_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define KERN_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(KERN_ASAN)
#define KERN_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(KERN_TSAN)
#define KERN_TSAN 1
#endif
#ifdef KERN_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#include <stdio.h>
#define MATMUL_UNCHECKED __attribute__((no_sanitize("address")))
#elif defined(KERN_TSAN)
/* In the TSan runtime, not in clang 14's public header. */
void __tsan_read_range(void *addr, unsigned long size);
void __tsan_write_range(void *addr, unsigned long size);
#define MATMUL_UNCHECKED __attribute__((no_sanitize("thread")))
#else
#define MATMUL_UNCHECKED
#endif

/* Unrolls an attention loop, so that its accumulators stay in registers at
 * -O2. Not under a sanitizer: clang takes minutes to compile the unrolled
 * instrumented tiles (ASan: over 8 minutes for this file, 31 s without), and
 * there speed is not the point. */
#if defined(KERN_ASAN) || defined(KERN_TSAN)
#define ATTN_UNROLL(n)
#else
#define ATTN_PRAGMA(x) _Pragma(#x)
#define ATTN_UNROLL(n) ATTN_PRAGMA(GCC unroll n)
#endif

/* Activation rows sharing one load of a weight panel row. */
#define MM_ROWS 6

/* The attention kernels read K and V in their stored type (kblk/vblk entries
 * point at values of dt, rows stride values apart) and widen each value to
 * f32 in registers: the widening is exact, so every dtype goes through the
 * f32 arithmetic with the same operations in the same order. */
struct kern_impl {
    void (*matmul)(float *y, int ldy, const float *x, int ldx, int n_rows,
                   const struct kern_mat *m);
    float (*dot)(const float *a, const float *b, int n);
    /* s[h * n_pos + t] = dot(q_h, k_t,g(h)) / sqrtf(hd). */
    void (*scores)(float *s, const float *q, int n_heads, int n_kv_heads, int hd, int n_pos,
                   enum kv_dtype dt, const void *const *kblk, int bs, int stride);
    /* x[0..n) <- softmax(x). */
    void (*softmax)(float *x, int n);
    /* out_h[d] = sum_t s[h * n_pos + t] * v_t,g(h)[d]. */
    void (*values)(float *out, const float *s, int n_heads, int n_kv_heads, int hd, int n_pos,
                   enum kv_dtype dt, const void *const *vblk, int bs, int stride);
    void (*swiglu)(float *h, const float *g, size_t n);
};

/* Calls fn with dt as a constant, so that each dtype gets its own copy of an
 * always-inline kernel body with the widening folded in. */
#define KV_DISPATCH(dt, fn, ...)                                                                   \
    do {                                                                                           \
        switch (dt) {                                                                              \
        case KV_DTYPE_F16:                                                                         \
            fn(KV_DTYPE_F16, __VA_ARGS__);                                                         \
            break;                                                                                 \
        case KV_DTYPE_BF16:                                                                        \
            fn(KV_DTYPE_BF16, __VA_ARGS__);                                                        \
            break;                                                                                 \
        case KV_DTYPE_FP8:                                                                         \
            fn(KV_DTYPE_FP8, __VA_ARGS__);                                                         \
            break;                                                                                 \
        default:                                                                                   \
            fn(KV_DTYPE_F32, __VA_ARGS__);                                                         \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* The row of position t: rb bytes apart inside blocks of bs positions. */
static inline const uint8_t *kv_row(const void *const *blk, int t, int bs, size_t rb)
{
    return (const uint8_t *)blk[t / bs] + (size_t)(t % bs) * rb;
}

/* The canonical exp (kern_exp): clamp to [EXP_LO, EXP_HI], n = rint(x log2 e),
 * r = x - n ln2 (two-step Cody-Waite), a degree-7 Cephes polynomial by fused
 * Horner steps, times 2^n built in the exponent bits. Only IEEE basic
 * operations and fma, so every path gets the same bits. */
#define EXP_LO    -87.0f
#define EXP_HI    88.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2HI 0.693359375f
#define EXP_LN2LO -2.12194440e-4f
#define EXP_P0    1.9875691500e-4f
#define EXP_P1    1.3981999507e-3f
#define EXP_P2    8.3334519073e-3f
#define EXP_P3    4.1665795894e-2f
#define EXP_P4    1.6666665459e-1f
#define EXP_P5    5.0000001201e-1f

/* ---- packing ---------------------------------------------------------- */

int kern_mat_alloc(struct kern_mat *m, int n_out, int n_in)
{
    memset(m, 0, sizeof(*m));
    if (n_out < 1 || n_in < 1)
        return TANDEM_EINVAL;
    int n_panels = (n_out + KERN_PANEL - 1) / KERN_PANEL;
    size_t bytes = (size_t)n_panels * (size_t)n_in * KERN_PANEL * sizeof(float);
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0)
        return TANDEM_ENOMEM;
    memset(p, 0, bytes);
    m->data = p;
    m->n_in = n_in;
    m->n_out = n_out;
    m->n_panels = n_panels;
    return 0;
}

void kern_mat_set_row(struct kern_mat *m, int o, const float *row)
{
    float *base = m->data + (size_t)(o / KERN_PANEL) * (size_t)m->n_in * KERN_PANEL;
    int c = o % KERN_PANEL;
    for (int i = 0; i < m->n_in; i++)
        base[(size_t)i * KERN_PANEL + c] = row[i];
}

void kern_mat_get_row(const struct kern_mat *m, int o, float *row)
{
    const float *base = m->data + (size_t)(o / KERN_PANEL) * (size_t)m->n_in * KERN_PANEL;
    int c = o % KERN_PANEL;
    for (int i = 0; i < m->n_in; i++)
        row[i] = base[(size_t)i * KERN_PANEL + c];
}

int kern_mat_pack(struct kern_mat *m, const float *w, int n_out, int n_in)
{
    int rc = kern_mat_alloc(m, n_out, n_in);
    if (rc != 0)
        return rc;
    for (int o = 0; o < n_out; o++)
        kern_mat_set_row(m, o, w + (size_t)o * (size_t)n_in);
    return 0;
}

void kern_mat_free(struct kern_mat *m)
{
    free(m->data);
    memset(m, 0, sizeof(*m));
}

/* ---- scalar path: the definition of the arithmetic -------------------- */

static float reduce16(float *l)
{
    for (int j = 0; j < 8; j++)
        l[j] = l[j] + l[j + 8];
    for (int j = 0; j < 4; j++)
        l[j] = l[j] + l[j + 4];
    for (int j = 0; j < 2; j++)
        l[j] = l[j] + l[j + 2];
    return l[0] + l[1];
}

/* Value i of a KV row of type dt, widened to f32 (exact). */
static ALWAYS_INLINE float kv_at(enum kv_dtype dt, const uint8_t *p, int i)
{
    uint16_t h;
    float f;
    switch (dt) {
    case KV_DTYPE_F16:
        memcpy(&h, p + 2 * (size_t)i, sizeof h);
        return kv_f16_to_f32(h);
    case KV_DTYPE_BF16:
        memcpy(&h, p + 2 * (size_t)i, sizeof h);
        return kv_bf16_to_f32(h);
    case KV_DTYPE_FP8:
        return kv_fp8_to_f32(p[i]);
    default:
        memcpy(&f, p + 4 * (size_t)i, sizeof f);
        return f;
    }
}

/* The canonical dot of a (floats) and b (n values of dt). */
static ALWAYS_INLINE float dot_kv_scalar(const float *a, enum kv_dtype dt, const uint8_t *b, int n)
{
    float l[16] = {0};
    for (int i = 0; i < n; i++)
        l[i & 15] = fmaf(a[i], kv_at(dt, b, i), l[i & 15]);
    return reduce16(l);
}

static float dot_scalar(const float *a, const float *b, int n)
{
    return dot_kv_scalar(a, KV_DTYPE_F32, (const uint8_t *)b, n);
}

float kern_exp(float x)
{
    x = x > EXP_LO ? x : EXP_LO;
    x = x < EXP_HI ? x : EXP_HI;
    float k = rintf(x * EXP_LOG2E);
    float r = fmaf(k, -EXP_LN2HI, x);
    r = fmaf(k, -EXP_LN2LO, r);
    float y = fmaf(EXP_P0, r, EXP_P1);
    y = fmaf(y, r, EXP_P2);
    y = fmaf(y, r, EXP_P3);
    y = fmaf(y, r, EXP_P4);
    y = fmaf(y, r, EXP_P5);
    float r2 = r * r;
    y = fmaf(y, r2, r);
    y = y + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return y * scale;
}

MATMUL_UNCHECKED static void matmul_scalar(float *y, int ldy, const float *x, int ldx, int n_rows,
                                           const struct kern_mat *m)
{
    float acc[KERN_PANEL];
    for (int p = 0; p < m->n_panels; p++) {
        const float *P = m->data + (size_t)p * (size_t)m->n_in * KERN_PANEL;
        int o0 = p * KERN_PANEL;
        int ncol = m->n_out - o0 < KERN_PANEL ? m->n_out - o0 : KERN_PANEL;
        for (int b = 0; b < n_rows; b++) {
            const float *xr = x + (size_t)b * (size_t)ldx;
            for (int c = 0; c < KERN_PANEL; c++)
                acc[c] = 0.0f;
            for (int i = 0; i < m->n_in; i++) {
                const float *w = P + (size_t)i * KERN_PANEL;
                for (int c = 0; c < ncol; c++)
                    acc[c] = fmaf(w[c], xr[i], acc[c]);
            }
            memcpy(y + (size_t)b * (size_t)ldy + o0, acc, (size_t)ncol * sizeof(float));
        }
    }
}

static ALWAYS_INLINE void scores_scalar_t(enum kv_dtype dt, float *s, const float *q, int n_heads,
                                          int n_kv_heads, int hd, int n_pos,
                                          const void *const *kblk, int bs, int stride)
{
    size_t es = kv_dtype_size(dt);
    float scale = sqrtf((float)hd);
    int group = n_heads / n_kv_heads;
    for (int t = 0; t < n_pos; t++) {
        const uint8_t *k = kv_row(kblk, t, bs, (size_t)stride * es);
        for (int h = 0; h < n_heads; h++)
            s[(size_t)h * n_pos + t] =
                dot_kv_scalar(q + (size_t)h * hd, dt, k + (size_t)(h / group) * hd * es, hd) /
                scale;
    }
}

static void scores_scalar(float *s, const float *q, int n_heads, int n_kv_heads, int hd, int n_pos,
                          enum kv_dtype dt, const void *const *kblk, int bs, int stride)
{
    KV_DISPATCH(dt, scores_scalar_t, s, q, n_heads, n_kv_heads, hd, n_pos, kblk, bs, stride);
}

/* max (any order: exact), e = kern_exp(x - max), the 16-lane sum of e, then
 * x = e / sum. */
static void softmax_scalar(float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = mx > x[i] ? mx : x[i];
    float l[16] = {0};
    for (int i = 0; i < n; i++) {
        x[i] = kern_exp(x[i] - mx);
        l[i & 15] = l[i & 15] + x[i];
    }
    float sum = reduce16(l);
    for (int i = 0; i < n; i++)
        x[i] = x[i] / sum;
}

static ALWAYS_INLINE void values_scalar_t(enum kv_dtype dt, float *out, const float *s, int n_heads,
                                          int n_kv_heads, int hd, int n_pos,
                                          const void *const *vblk, int bs, int stride)
{
    size_t es = kv_dtype_size(dt);
    int group = n_heads / n_kv_heads;
    for (int h = 0; h < n_heads; h++) {
        float *o = out + (size_t)h * hd;
        const float *a = s + (size_t)h * n_pos;
        for (int d = 0; d < hd; d++)
            o[d] = 0.0f;
        for (int t = 0; t < n_pos; t++) {
            const uint8_t *v =
                kv_row(vblk, t, bs, (size_t)stride * es) + (size_t)(h / group) * hd * es;
            for (int d = 0; d < hd; d++)
                o[d] = fmaf(a[t], kv_at(dt, v, d), o[d]);
        }
    }
}

static void values_scalar(float *out, const float *s, int n_heads, int n_kv_heads, int hd,
                          int n_pos, enum kv_dtype dt, const void *const *vblk, int bs, int stride)
{
    KV_DISPATCH(dt, values_scalar_t, out, s, n_heads, n_kv_heads, hd, n_pos, vblk, bs, stride);
}

/* h = h * (1 / (1 + exp(0 - h))) * g (SiLU gate). */
static void swiglu_scalar(float *h, const float *g, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = h[i];
        v = v * (1.0f / (1.0f + kern_exp(0.0f - v)));
        h[i] = v * g[i];
    }
}

/* Length of the run of positions from t that share a block, capped at cap. */
static inline int run_len(int t, int n_pos, int bs, int cap)
{
    int run = bs - t % bs;
    if (run > n_pos - t)
        run = n_pos - t;
    return run < cap ? run : cap;
}

/* Asks for the KV rows of positions t..t+n-1 (inside one block) ahead of use:
 * blocks are scattered, and hardware prefetchers stop at page edges. */
static inline void prefetch_rows(const uint8_t *row, int n, size_t rb, int row_bytes)
{
    for (int u = 0; u < n; u++, row += rb)
        for (int b = 0; b < row_bytes; b += 64)
            __builtin_prefetch(row + b, 0, 3);
}

/* ---- AVX2 + FMA --------------------------------------------------------- */

TARGET_AVX2 static ALWAYS_INLINE float reduce8x2_avx2(__m256 lo, __m256 hi)
{
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

/* The canonical reductions of four 16-lane accumulators (lo = lanes 0..7,
 * hi = 8..15), computed together: the same additions as reduce16, in
 * transposed form. Returns [r0, r1, r2, r3]. */
TARGET_AVX2 static ALWAYS_INLINE __m128 reduce8x2_x4_avx2(const __m256 *lo, const __m256 *hi)
{
    __m256 s0 = _mm256_add_ps(lo[0], hi[0]), s1 = _mm256_add_ps(lo[1], hi[1]);
    __m256 s2 = _mm256_add_ps(lo[2], hi[2]), s3 = _mm256_add_ps(lo[3], hi[3]);
    __m256 p01 =
        _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
    __m256 p23 =
        _mm256_add_ps(_mm256_permute2f128_ps(s2, s3, 0x20), _mm256_permute2f128_ps(s2, s3, 0x31));
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(p01, p23, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(p01, p23, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 t = _mm256_add_ps(_mm256_shuffle_ps(r, r, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(r, r, _MM_SHUFFLE(3, 1, 3, 1)));
    /* t = [r0, r2, r0, r2 | r1, r3, r1, r3] */
    return _mm_unpacklo_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Mask of the first n (clamped to 0..8) 32-bit lanes. */
TARGET_AVX2 static ALWAYS_INLINE __m256i lanes_avx2(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

TARGET_AVX2 static ALWAYS_INLINE __m256 exp_avx2(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
    x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-EXP_LN2HI), x);
    r = _mm256_fmadd_ps(k, _mm256_set1_ps(-EXP_LN2LO), r);
    __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(EXP_P0), r, _mm256_set1_ps(EXP_P1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P5));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* fp8 e4m3fn -> f32, the bits of kv_fp8_to_f32: the 7 magnitude bits put at
 * the top of an f32 exponent/mantissa and scaled by 2^120 (exact, subnormals
 * included); 0x7f is NaN. u: one byte per 32-bit lane. */
TARGET_AVX2 static ALWAYS_INLINE __m256 fp8_avx2(__m256i u)
{
    __m256i em = _mm256_and_si256(u, _mm256_set1_epi32(0x7f));
    __m256 f =
        _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(em, 20)), _mm256_set1_ps(0x1p120f));
    __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    f = _mm256_blendv_ps(f, nan,
                         _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f))));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24);
    return _mm256_or_ps(f, _mm256_castsi256_ps(sign));
}

/* 8 KV values of type dt at p, widened to f32 (the bits of kv_dequantize). */
TARGET_AVX2 static ALWAYS_INLINE __m256 kv8_avx2(enum kv_dtype dt, const uint8_t *p)
{
    switch (dt) {
    case KV_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    case KV_DTYPE_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    case KV_DTYPE_FP8:
        return fp8_avx2(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    default:
        return _mm256_loadu_ps((const float *)p);
    }
}

/* The first n (clamped to 0..8) values, m = lanes_avx2(n); +0 in the other
 * lanes, and nothing past them is read (the last row of an arena may end
 * there). */
TARGET_AVX2 static ALWAYS_INLINE __m256 kv8_part_avx2(enum kv_dtype dt, const uint8_t *p, int n,
                                                      __m256i m)
{
    if (dt == KV_DTYPE_F32)
        return _mm256_maskload_ps((const float *)p, m);
    float tmp[8] = {0};
    if (n > 0)
        kv_dequantize(dt, tmp, p, (size_t)(n < 8 ? n : 8));
    return _mm256_loadu_ps(tmp);
}

/* acc = fma(a, b, acc) on the lanes of m only (lanes past the end keep their
 * value, as in the scalar definition); b is already loaded under m. */
TARGET_AVX2 static ALWAYS_INLINE __m256 fma_tail_avx2(const float *a, __m256 b, __m256 acc,
                                                      __m256i m)
{
    __m256 f = _mm256_fmadd_ps(_mm256_maskload_ps(a, m), b, acc);
    return _mm256_blendv_ps(acc, f, _mm256_castsi256_ps(m));
}

TARGET_AVX2 static ALWAYS_INLINE float dot_avx2_inl(const float *a, const float *b, int n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
    }
    if (i < n) {
        int r = n - i;
        __m256i mlo = lanes_avx2(r), mhi = lanes_avx2(r - 8);
        lo = fma_tail_avx2(a + i, _mm256_maskload_ps(b + i, mlo), lo, mlo);
        if (r > 8)
            hi = fma_tail_avx2(a + i + 8, _mm256_maskload_ps(b + i + 8, mhi), hi, mhi);
    }
    return reduce8x2_avx2(lo, hi);
}

TARGET_AVX2 static float dot_avx2(const float *a, const float *b, int n)
{
    return dot_avx2_inl(a, b, n);
}

/* 8*ng output columns (ng ymm) x nr rows, whole reduction. ncol: columns
 * of the tile that exist. */
TARGET_AVX2 MATMUL_UNCHECKED static ALWAYS_INLINE void
mm_tile_avx2(float *y, int ldy, const float *x, int ldx, const float *P, int n_in, int nr, int ng,
             int ncol, int pf)
{
    __m256 acc[MM_ROWS][8];
    /* The loops over r and g must unroll so that acc lives in registers. */
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int g = 0; g < ng; g++)
            acc[r][g] = _mm256_setzero_ps();
    for (int i = 0; i < n_in; i++) {
        const float *w = P + (size_t)i * KERN_PANEL;
        __m256 wv[8];
        if (pf) /* whole panel rows ahead, for the narrower tiles that follow */
            for (int c = 0; c < KERN_PANEL; c += 16)
                __builtin_prefetch(w + 8 * KERN_PANEL + c, 0, 3);
#pragma GCC unroll 8
        for (int g = 0; g < ng; g++)
            wv[g] = _mm256_loadu_ps(w + 8 * g);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            __m256 xv = _mm256_broadcast_ss(x + (size_t)r * ldx + i);
#pragma GCC unroll 8
            for (int g = 0; g < ng; g++)
                acc[r][g] = _mm256_fmadd_ps(wv[g], xv, acc[r][g]);
        }
    }
    /* Unrolled too: a store loop indexing acc at run time keeps acc in
     * memory, and gcc -O2 then stores every accumulator on every i. */
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        float *yr = y + (size_t)r * ldy;
#pragma GCC unroll 8
        for (int g = 0; g < ng; g++) {
            int left = ncol - 8 * g;
            if (left >= 8) {
                _mm256_storeu_ps(yr + 8 * g, acc[r][g]);
            } else if (left > 0) {
                float tmp[8];
                _mm256_storeu_ps(tmp, acc[r][g]);
                memcpy(yr + 8 * g, tmp, (size_t)left * sizeof(float));
            }
        }
    }
}

/* Rows in tiles of 6 x 16 columns; a remainder of 1 row takes the whole
 * 64-column panel at once and 2-3 rows 32 columns, so small batches (decode
 * at batch 1) still keep 8-12 independent chains in flight. */
TARGET_AVX2 MATMUL_UNCHECKED static void matmul_avx2(float *y, int ldy, const float *x, int ldx,
                                                     int n_rows, const struct kern_mat *m)
{
    int full = n_rows - n_rows % MM_ROWS, rem = n_rows - full;
    for (int p = 0; p < m->n_panels; p++) {
        const float *P = m->data + (size_t)p * (size_t)m->n_in * KERN_PANEL;
        for (int c0 = 0; c0 < KERN_PANEL; c0 += 16) {
            int o0 = p * KERN_PANEL + c0;
            if (o0 >= m->n_out)
                break;
            for (int b = 0; b < full; b += MM_ROWS)
                mm_tile_avx2(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P + c0,
                             m->n_in, MM_ROWS, 2, m->n_out - o0, b == 0 && c0 == 0);
        }
        if (rem == 0)
            continue;
        float *yb = y + (size_t)full * ldy;
        const float *xb = x + (size_t)full * ldx;
        int cw = rem == 1 ? 64 : rem <= 3 ? 32 : 16;
        for (int c0 = 0; c0 < KERN_PANEL; c0 += cw) {
            int o0 = p * KERN_PANEL + c0;
            if (o0 >= m->n_out)
                break;
            int ncol = m->n_out - o0;
            switch (rem) {
            case 5:
                mm_tile_avx2(yb + o0, ldy, xb, ldx, P + c0, m->n_in, 5, 2, ncol,
                             full == 0 && c0 == 0);
                break;
            case 4:
                mm_tile_avx2(yb + o0, ldy, xb, ldx, P + c0, m->n_in, 4, 2, ncol,
                             full == 0 && c0 == 0);
                break;
            case 3:
                mm_tile_avx2(yb + o0, ldy, xb, ldx, P + c0, m->n_in, 3, 4, ncol,
                             full == 0 && c0 == 0);
                break;
            case 2:
                mm_tile_avx2(yb + o0, ldy, xb, ldx, P + c0, m->n_in, 2, 4, ncol,
                             full == 0 && c0 == 0);
                break;
            default:
                mm_tile_avx2(yb + o0, ldy, xb, ldx, P + c0, m->n_in, 1, 8, ncol,
                             full == 0 && c0 == 0);
                break;
            }
        }
    }
}

/* Scores of runs of up to 4 positions (inside one block) against every query
 * head: four accumulators reduced together. */
TARGET_AVX2 static ALWAYS_INLINE void scores_avx2_t(enum kv_dtype dt, float *s, const float *q,
                                                    int n_heads, int n_kv_heads, int hd, int n_pos,
                                                    const void *const *kblk, int bs, int stride)
{
    const size_t es = kv_dtype_size(dt), rb = (size_t)stride * es;
    const __m128 scale = _mm_set1_ps(sqrtf((float)hd));
    int group = n_heads / n_kv_heads, full = hd & ~15, r = hd - full;
    int row_bytes = n_kv_heads * hd * (int)es;
    __m256i mlo = lanes_avx2(r), mhi = lanes_avx2(r - 8);
    for (int t = 0; t < n_pos;) {
        int run = run_len(t, n_pos, bs, 4);
        const uint8_t *k0 = kv_row(kblk, t, bs, rb);
        if (t + run < n_pos)
            prefetch_rows(kv_row(kblk, t + run, bs, rb), run_len(t + run, n_pos, bs, 4), rb,
                          row_bytes);
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + (size_t)h * hd;
            const uint8_t *kp[4];
            ATTN_UNROLL(4)
            for (int i = 0; i < 4; i++)
                kp[i] = k0 + (size_t)(i < run ? i : run - 1) * rb + (size_t)(h / group) * hd * es;
            __m256 lo[4], hi[4];
            ATTN_UNROLL(4)
            for (int i = 0; i < 4; i++)
                lo[i] = hi[i] = _mm256_setzero_ps();
            for (int d = 0; d < full; d += 16) {
                __m256 ql = _mm256_loadu_ps(qh + d), qhv = _mm256_loadu_ps(qh + d + 8);
                ATTN_UNROLL(4)
                for (int i = 0; i < 4; i++) {
                    lo[i] = _mm256_fmadd_ps(ql, kv8_avx2(dt, kp[i] + d * es), lo[i]);
                    hi[i] = _mm256_fmadd_ps(qhv, kv8_avx2(dt, kp[i] + (d + 8) * es), hi[i]);
                }
            }
            if (r > 0) {
                ATTN_UNROLL(4)
                for (int i = 0; i < 4; i++) {
                    const uint8_t *kt = kp[i] + (size_t)full * es;
                    lo[i] = fma_tail_avx2(qh + full, kv8_part_avx2(dt, kt, r, mlo), lo[i], mlo);
                    if (r > 8)
                        hi[i] = fma_tail_avx2(
                            qh + full + 8, kv8_part_avx2(dt, kt + 8 * es, r - 8, mhi), hi[i], mhi);
                }
            }
            __m128 res = _mm_div_ps(reduce8x2_x4_avx2(lo, hi), scale);
            float tmp[4];
            _mm_storeu_ps(tmp, res);
            memcpy(s + (size_t)h * n_pos + t, tmp, (size_t)run * sizeof(float));
        }
        t += run;
    }
}

TARGET_AVX2 static void scores_avx2(float *s, const float *q, int n_heads, int n_kv_heads, int hd,
                                    int n_pos, enum kv_dtype dt, const void *const *kblk, int bs,
                                    int stride)
{
    KV_DISPATCH(dt, scores_avx2_t, s, q, n_heads, n_kv_heads, hd, n_pos, kblk, bs, stride);
}

TARGET_AVX2 static void softmax_avx2(float *x, int n)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
    float m = -INFINITY;
    for (; i < n; i++)
        m = m > x[i] ? m : x[i];
    float tmp[8];
    _mm256_storeu_ps(tmp, mx);
    for (int j = 0; j < 8; j++)
        m = m > tmp[j] ? m : tmp[j];
    __m256 vm = _mm256_set1_ps(m);
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        __m256 e0 = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        __m256 e1 = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vm));
        _mm256_storeu_ps(x + i, e0);
        _mm256_storeu_ps(x + i + 8, e1);
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
    }
    for (int h = 0; i < n; i += 8, h++) {
        __m256i mk = lanes_avx2(n - i);
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(x + i, mk), vm));
        _mm256_maskstore_ps(x + i, mk, e);
        e = _mm256_and_ps(e, _mm256_castsi256_ps(mk)); /* +0: sums stay exact */
        if (h == 0)
            lo = _mm256_add_ps(lo, e);
        else
            hi = _mm256_add_ps(hi, e);
    }
    __m256 vs = _mm256_set1_ps(reduce8x2_avx2(lo, hi));
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), vs));
    if (i < n) {
        __m256i mk = lanes_avx2(n - i);
        _mm256_maskstore_ps(x + i, mk, _mm256_div_ps(_mm256_maskload_ps(x + i, mk), vs));
    }
}

/* Up to 4 query heads (sharing one KV head) x 16 values of head_dim, whole
 * sum over positions. v rows start at the KV head's offset (off values).
 * whole: the 16 values all exist (hd - d0 >= 16). */
TARGET_AVX2 static ALWAYS_INLINE void values_tile_avx2(enum kv_dtype dt, float *out, const float *s,
                                                       int nj, int hd, int d0, int n_pos,
                                                       const void *const *vblk, int bs, int stride,
                                                       size_t off, int whole)
{
    const size_t es = kv_dtype_size(dt), rb = (size_t)stride * es;
    __m256i m0 = lanes_avx2(hd - d0), m1 = lanes_avx2(hd - d0 - 8);
    __m256 acc[4][2];
    ATTN_UNROLL(4)
    for (int j = 0; j < 4; j++)
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int t = 0; t < n_pos;) {
        int run = run_len(t, n_pos, bs, bs);
        const uint8_t *v = kv_row(vblk, t, bs, rb) + (off + (size_t)d0) * es;
        for (int u = 0; u < run; u++, v += rb) {
            __m256 v0, v1;
            if (whole) {
                v0 = kv8_avx2(dt, v);
                v1 = kv8_avx2(dt, v + 8 * es);
            } else {
                v0 = kv8_part_avx2(dt, v, hd - d0, m0);
                v1 = kv8_part_avx2(dt, v + 8 * es, hd - d0 - 8, m1);
            }
            ATTN_UNROLL(4)
            for (int j = 0; j < nj; j++) {
                __m256 a = _mm256_broadcast_ss(s + (size_t)j * n_pos + t + u);
                acc[j][0] = _mm256_fmadd_ps(a, v0, acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(a, v1, acc[j][1]);
            }
        }
        t += run;
    }
    ATTN_UNROLL(4)
    for (int j = 0; j < nj; j++) {
        _mm256_maskstore_ps(out + (size_t)j * hd + d0, m0, acc[j][0]);
        _mm256_maskstore_ps(out + (size_t)j * hd + d0 + 8, m1, acc[j][1]);
    }
}

TARGET_AVX2 static ALWAYS_INLINE void values_avx2_t(enum kv_dtype dt, float *out, const float *s,
                                                    int n_heads, int n_kv_heads, int hd, int n_pos,
                                                    const void *const *vblk, int bs, int stride)
{
    int group = n_heads / n_kv_heads;
    for (int h = 0; h < n_heads;) {
        int g = h / group, nj = (g + 1) * group - h;
        nj = nj < 4 ? nj : 4;
        float *o = out + (size_t)h * hd;
        const float *sj = s + (size_t)h * n_pos;
        size_t off = (size_t)g * hd;
        for (int d0 = 0; d0 < hd; d0 += 16) {
            if (hd - d0 < 16)
                values_tile_avx2(dt, o, sj, nj, hd, d0, n_pos, vblk, bs, stride, off, 0);
            else if (nj == 4)
                values_tile_avx2(dt, o, sj, 4, hd, d0, n_pos, vblk, bs, stride, off, 1);
            else if (nj == 3)
                values_tile_avx2(dt, o, sj, 3, hd, d0, n_pos, vblk, bs, stride, off, 1);
            else if (nj == 2)
                values_tile_avx2(dt, o, sj, 2, hd, d0, n_pos, vblk, bs, stride, off, 1);
            else
                values_tile_avx2(dt, o, sj, 1, hd, d0, n_pos, vblk, bs, stride, off, 1);
        }
        h += nj;
    }
}

TARGET_AVX2 static void values_avx2(float *out, const float *s, int n_heads, int n_kv_heads, int hd,
                                    int n_pos, enum kv_dtype dt, const void *const *vblk, int bs,
                                    int stride)
{
    KV_DISPATCH(dt, values_avx2_t, out, s, n_heads, n_kv_heads, hd, n_pos, vblk, bs, stride);
}

TARGET_AVX2 static ALWAYS_INLINE __m256 swiglu8_avx2(__m256 h, __m256 g)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), h));
    __m256 v = _mm256_mul_ps(h, _mm256_div_ps(one, _mm256_add_ps(one, e)));
    return _mm256_mul_ps(v, g);
}

TARGET_AVX2 static void swiglu_avx2(float *h, const float *g, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(h + i, swiglu8_avx2(_mm256_loadu_ps(h + i), _mm256_loadu_ps(g + i)));
    if (i < n) {
        __m256i mk = lanes_avx2((int)(n - i));
        _mm256_maskstore_ps(
            h + i, mk, swiglu8_avx2(_mm256_maskload_ps(h + i, mk), _mm256_maskload_ps(g + i, mk)));
    }
}

/* ---- AVX-512F ------------------------------------------------------------ */

TARGET_AVX512 static ALWAYS_INLINE float reduce16_avx512(__m512 acc)
{
    __m256 lo = _mm512_castps512_ps256(acc);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

/* The canonical reductions of 16 accumulators at once (the additions of
 * reduce16 in transposed form): lane f of the result is reduce16(a[f]). */
TARGET_AVX512 static ALWAYS_INLINE __m512 reduce16_x16_avx512(const __m512 *a)
{
    __m512 p[8], q[4], r[2];
    for (int i = 0; i < 8; i++) /* l[j] + l[j+8] */
        p[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++) /* + l[j+4] */
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) /* + l[j+2] */
        r[i] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * i], q[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(q[2 * i], q[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 t = _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* Lane 4i + m of t holds accumulator 4m + i. */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, t);
}

/* Mask of the first n lanes, n clamped to 0..16. */
static inline __mmask16 lanes16(int n)
{
    if (n <= 0)
        return 0;
    if (n >= 16)
        return 0xffff;
    return (__mmask16)((1u << n) - 1u);
}

TARGET_AVX512 static ALWAYS_INLINE __m512 exp_avx512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LO));
    x = _mm512_min_ps(x, _mm512_set1_ps(EXP_HI));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-EXP_LN2HI), x);
    r = _mm512_fmadd_ps(k, _mm512_set1_ps(-EXP_LN2LO), r);
    __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(EXP_P0), r, _mm512_set1_ps(EXP_P1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P5));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

TARGET_AVX512 static ALWAYS_INLINE float dot_avx512_inl(const float *a, const float *b, int n)
{
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        __mmask16 k = lanes16(n - i);
        acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i),
                                    _mm512_maskz_loadu_ps(k, b + i), acc, k);
    }
    return reduce16_avx512(acc);
}

TARGET_AVX512 static float dot_avx512(const float *a, const float *b, int n)
{
    return dot_avx512_inl(a, b, n);
}

/* 64 output columns (four zmm) x nr rows, whole reduction. */
TARGET_AVX512 MATMUL_UNCHECKED static ALWAYS_INLINE void mm_tile_avx512(float *y, int ldy,
                                                                        const float *x, int ldx,
                                                                        const float *P, int n_in,
                                                                        int nr, const __mmask16 *mk)
{
    __m512 acc[MM_ROWS][4];
    /* The loops over r must unroll so that acc lives in registers: gcc -O2
     * leaves them rolled and keeps acc on the stack, a load and a store
     * around every fma (40% of the FMA peak on Zen 4). */
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int i = 0; i < n_in; i++) {
        const float *w = P + (size_t)i * KERN_PANEL;
        __m512 w0 = _mm512_load_ps(w);
        __m512 w1 = _mm512_load_ps(w + 16);
        __m512 w2 = _mm512_load_ps(w + 32);
        __m512 w3 = _mm512_load_ps(w + 48);
#pragma GCC unroll 6
        for (int r = 0; r < nr; r++) {
            __m512 xv = _mm512_set1_ps(x[(size_t)r * ldx + i]);
            acc[r][0] = _mm512_fmadd_ps(w0, xv, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(w1, xv, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(w2, xv, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(w3, xv, acc[r][3]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++) {
        float *yr = y + (size_t)r * ldy;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(yr + 16 * c, mk[c], acc[r][c]);
    }
}

TARGET_AVX512 MATMUL_UNCHECKED static void matmul_avx512(float *y, int ldy, const float *x, int ldx,
                                                         int n_rows, const struct kern_mat *m)
{
    for (int p = 0; p < m->n_panels; p++) {
        const float *P = m->data + (size_t)p * (size_t)m->n_in * KERN_PANEL;
        int o0 = p * KERN_PANEL;
        __mmask16 mk[4];
        for (int c = 0; c < 4; c++)
            mk[c] = lanes16(m->n_out - o0 - 16 * c);
        float *yb = y + o0;
        const float *xb = x;
        int b = 0;
        for (; b + MM_ROWS <= n_rows; b += MM_ROWS) {
            mm_tile_avx512(yb, ldy, xb, ldx, P, m->n_in, MM_ROWS, mk);
            yb += (size_t)MM_ROWS * ldy;
            xb += (size_t)MM_ROWS * ldx;
        }
        switch (n_rows - b) {
        case 5:
            mm_tile_avx512(yb, ldy, xb, ldx, P, m->n_in, 5, mk);
            break;
        case 4:
            mm_tile_avx512(yb, ldy, xb, ldx, P, m->n_in, 4, mk);
            break;
        case 3:
            mm_tile_avx512(yb, ldy, xb, ldx, P, m->n_in, 3, mk);
            break;
        case 2:
            mm_tile_avx512(yb, ldy, xb, ldx, P, m->n_in, 2, mk);
            break;
        case 1:
            mm_tile_avx512(yb, ldy, xb, ldx, P, m->n_in, 1, mk);
            break;
        default:
            break;
        }
    }
}

/* fp8 e4m3fn -> f32 as fp8_avx2, 16 lanes. */
TARGET_AVX512 static ALWAYS_INLINE __m512 fp8_avx512(__m512i u)
{
    __m512i em = _mm512_and_si512(u, _mm512_set1_epi32(0x7f));
    __m512 f =
        _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(em, 20)), _mm512_set1_ps(0x1p120f));
    __mmask16 nan = _mm512_cmpeq_epi32_mask(em, _mm512_set1_epi32(0x7f));
    __m512i bits =
        _mm512_mask_mov_epi32(_mm512_castps_si512(f), nan, _mm512_set1_epi32(0x7fc00000));
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}

/* 16 KV values of type dt at p, widened to f32 (the bits of kv_dequantize). */
TARGET_AVX512 static ALWAYS_INLINE __m512 kv16_avx512(enum kv_dtype dt, const uint8_t *p)
{
    switch (dt) {
    case KV_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    case KV_DTYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    case KV_DTYPE_FP8:
        return fp8_avx512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
    default:
        return _mm512_loadu_ps((const float *)p);
    }
}

/* The first n (clamped to 0..16) values, +0 in the other lanes; nothing past
 * them is read. (AVX-512F has no masked 8- or 16-bit loads.) */
TARGET_AVX512 static ALWAYS_INLINE __m512 kv16_part_avx512(enum kv_dtype dt, const uint8_t *p,
                                                           int n)
{
    if (dt == KV_DTYPE_F32)
        return _mm512_maskz_loadu_ps(lanes16(n), p);
    float tmp[16] = {0};
    if (n > 0)
        kv_dequantize(dt, tmp, p, (size_t)(n < 16 ? n : 16));
    return _mm512_loadu_ps(tmp);
}

/* Scores of ng query heads (rows of hd floats from qh; they share one KV
 * head) against np = 16 / ng positions (key rows from kh, rb bytes apart;
 * rows from run on repeat row run - 1): 16 accumulators, acc[j * np + p] for
 * head j and position p, reduced together into lane j * np + p. nc = hd / 16
 * chunks. Each chunk of a key is loaded and widened once for the ng heads. */
TARGET_AVX512 static ALWAYS_INLINE __m512 scores_tile_avx512(enum kv_dtype dt, const float *qh,
                                                             int hd, const uint8_t *kh, int run,
                                                             size_t rb, int nc, int ng)
{
    const size_t es = kv_dtype_size(dt);
    const int np = 16 / ng;
    __m512 acc[16], qv[8];
    /* One head: the query in registers, each key an fma memory operand. Four
     * heads: too many registers, the queries come from L1 instead. */
    ATTN_UNROLL(8)
    for (int c = 0; c < nc; c++)
        qv[c] = _mm512_loadu_ps(qh + 16 * c);
    const uint8_t *k = kh;
    ATTN_UNROLL(16)
    for (int p = 0; p < np; p++) {
        if (p > 0 && p < run) /* rows from run on repeat the last one */
            k += rb;
        ATTN_UNROLL(8)
        for (int c = 0; c < nc; c++) {
            __m512 kv = kv16_avx512(dt, k + (size_t)(16 * c) * es);
            ATTN_UNROLL(4)
            for (int j = 0; j < ng; j++) {
                __m512 a = c == 0 ? _mm512_setzero_ps() : acc[j * np + p];
                __m512 qj = ng == 1 ? qv[c] : _mm512_loadu_ps(qh + (size_t)j * hd + 16 * c);
                acc[j * np + p] = _mm512_fmadd_ps(qj, kv, a);
            }
        }
    }
    return reduce16_x16_avx512(acc);
}

/* One query head against a run of up to 16 positions (rows past the run
 * repeat the last one), any head size: chunks in a loop, the last one masked.
 * For head sizes the tiles do not cover. */
TARGET_AVX512 static ALWAYS_INLINE __m512 scores16_any_avx512(enum kv_dtype dt, const float *qh,
                                                              const uint8_t *kh, int run, size_t rb,
                                                              int hd)
{
    const size_t es = kv_dtype_size(dt);
    int full = hd & ~15;
    __mmask16 mr = lanes16(hd - full);
    const uint8_t *kp[16];
    for (int i = 0; i < 16; i++)
        kp[i] = kh + (size_t)(i < run ? i : run - 1) * rb;
    __m512 acc[16];
    for (int i = 0; i < 16; i++)
        acc[i] = _mm512_setzero_ps();
    for (int d = 0; d < full; d += 16) {
        __m512 qv = _mm512_loadu_ps(qh + d);
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_fmadd_ps(qv, kv16_avx512(dt, kp[i] + (size_t)d * es), acc[i]);
    }
    if (mr != 0) {
        __m512 qv = _mm512_maskz_loadu_ps(mr, qh + full);
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_mask3_fmadd_ps(
                qv, kv16_part_avx512(dt, kp[i] + (size_t)full * es, hd - full), acc[i], mr);
    }
    return reduce16_x16_avx512(acc);
}

#define SCORES_TILE_CASE(nc)                                                                       \
    case nc:                                                                                       \
        r = nh == 4     ? scores_tile_avx512(dt, qh, hd, kh, 4, rb, nc, 4)                         \
            : run == 16 ? scores_tile_avx512(dt, qh, hd, kh, 16, rb, nc, 1)                        \
                        : scores_tile_avx512(dt, qh, hd, kh, run, rb, nc, 1);                      \
        break;

/* Runs of up to 16 positions (inside one block) against every query head;
 * the next run's rows are prefetched (blocks are scattered, and hardware
 * prefetchers stop at page edges). fp8 keys, whose widening costs more than
 * their load, go in tiles of 4 heads x 4 positions when the GQA group is a
 * multiple of 4; other keys, and the last, partial run, 1 head x 16
 * positions (with f32 and bf16 keys the 4 x 4 tiles measured slower: fewer
 * misses in flight). */
TARGET_AVX512 static ALWAYS_INLINE void scores_avx512_t(enum kv_dtype dt, float *s, const float *q,
                                                        int n_heads, int n_kv_heads, int hd,
                                                        int n_pos, const void *const *kblk, int bs,
                                                        int stride)
{
    const size_t es = kv_dtype_size(dt), rb = (size_t)stride * es;
    const __m512 scale = _mm512_set1_ps(sqrtf((float)hd));
    int group = n_heads / n_kv_heads, ng = dt == KV_DTYPE_FP8 && group % 4 == 0 ? 4 : 1;
    int row_bytes = n_kv_heads * hd * (int)es;
    int nc = hd % 16 == 0 && hd <= 128 ? hd / 16 : 0;
    for (int t = 0; t < n_pos;) {
        int run = run_len(t, n_pos, bs, 16);
        const uint8_t *k0 = kv_row(kblk, t, bs, rb);
        if (t + run < n_pos)
            prefetch_rows(kv_row(kblk, t + run, bs, rb), run_len(t + run, n_pos, bs, 16), rb,
                          row_bytes);
        for (int h = 0; h < n_heads;) {
            int nh = run == 16 && nc > 0 ? ng : 1;
            const float *qh = q + (size_t)h * hd;
            const uint8_t *k1 = k0 + (size_t)(h / group) * hd * es;
            for (int p0 = 0; p0 < 16; p0 += 16 / nh) {
                const uint8_t *kh = k1 + (size_t)p0 * rb;
                __m512 r;
                switch (nc) {
                    SCORES_TILE_CASE(1)
                    SCORES_TILE_CASE(2)
                    SCORES_TILE_CASE(3)
                    SCORES_TILE_CASE(4)
                    SCORES_TILE_CASE(5)
                    SCORES_TILE_CASE(6)
                    SCORES_TILE_CASE(7)
                    SCORES_TILE_CASE(8)
                default:
                    r = scores16_any_avx512(dt, qh, kh, run, rb, hd);
                    break;
                }
                r = _mm512_div_ps(r, scale);
                float *sp = s + (size_t)h * n_pos + t + p0;
                if (nh == 1) {
                    _mm512_mask_storeu_ps(sp, lanes16(run), r);
                } else {
                    _mm_storeu_ps(sp, _mm512_extractf32x4_ps(r, 0));
                    _mm_storeu_ps(sp + n_pos, _mm512_extractf32x4_ps(r, 1));
                    _mm_storeu_ps(sp + 2 * (size_t)n_pos, _mm512_extractf32x4_ps(r, 2));
                    _mm_storeu_ps(sp + 3 * (size_t)n_pos, _mm512_extractf32x4_ps(r, 3));
                }
            }
            h += nh;
        }
        t += run;
    }
}

TARGET_AVX512 static void scores_avx512(float *s, const float *q, int n_heads, int n_kv_heads,
                                        int hd, int n_pos, enum kv_dtype dt,
                                        const void *const *kblk, int bs, int stride)
{
    KV_DISPATCH(dt, scores_avx512_t, s, q, n_heads, n_kv_heads, hd, n_pos, kblk, bs, stride);
}

TARGET_AVX512 static void softmax_avx512(float *x, int n)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
    if (i < n) {
        __mmask16 k = lanes16(n - i);
        mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, x + i));
    }
    __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 acc = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 k = lanes16(n - i);
        __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        _mm512_mask_storeu_ps(x + i, k, e);
        acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    __m512 vs = _mm512_set1_ps(reduce16_avx512(acc));
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_div_ps(_mm512_loadu_ps(x + i), vs));
    if (i < n) {
        __mmask16 k = lanes16(n - i);
        _mm512_mask_storeu_ps(x + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), vs));
    }
}

/* Up to 4 query heads (sharing one KV head) x 64 values of head_dim, whole
 * sum over positions. v rows start at the KV head's offset (off values).
 * whole: the 64 values all exist (hd - d0 >= 64). */
TARGET_AVX512 static ALWAYS_INLINE void
values_tile_avx512(enum kv_dtype dt, float *out, const float *s, int nj, int hd, int d0, int n_pos,
                   const void *const *vblk, int bs, int stride, size_t off, int whole)
{
    const size_t es = kv_dtype_size(dt), rb = (size_t)stride * es;
    __mmask16 mk[4];
    ATTN_UNROLL(4)
    for (int c = 0; c < 4; c++)
        mk[c] = lanes16(hd - d0 - 16 * c);
    int nd = hd - d0 < 64 ? hd - d0 : 64;
    __m512 acc[4][4];
    ATTN_UNROLL(4)
    for (int j = 0; j < 4; j++)
        ATTN_UNROLL(4)
    for (int c = 0; c < 4; c++)
        acc[j][c] = _mm512_setzero_ps();
    for (int t = 0; t < n_pos;) {
        int run = run_len(t, n_pos, bs, bs);
        const uint8_t *v = kv_row(vblk, t, bs, rb) + (off + (size_t)d0) * es;
        if (t + run < n_pos)
            prefetch_rows(kv_row(vblk, t + run, bs, rb) + (off + (size_t)d0) * es,
                          run_len(t + run, n_pos, bs, bs), rb, nd * (int)es);
        for (int u = 0; u < run; u++, v += rb) {
            __m512 vv[4];
            ATTN_UNROLL(4)
            for (int c = 0; c < 4; c++) {
                int n = hd - d0 - 16 * c;
                vv[c] = whole || n >= 16 ? kv16_avx512(dt, v + 16 * c * es)
                                         : kv16_part_avx512(dt, v + 16 * c * es, n);
            }
            ATTN_UNROLL(4)
            for (int j = 0; j < nj; j++) {
                __m512 a = _mm512_set1_ps(s[(size_t)j * n_pos + t + u]);
                ATTN_UNROLL(4)
                for (int c = 0; c < 4; c++)
                    acc[j][c] = _mm512_fmadd_ps(a, vv[c], acc[j][c]);
            }
        }
        t += run;
    }
    ATTN_UNROLL(4)
    for (int j = 0; j < nj; j++)
        ATTN_UNROLL(4)
    for (int c = 0; c < 4; c++)
        _mm512_mask_storeu_ps(out + (size_t)j * hd + d0 + 16 * c, mk[c], acc[j][c]);
}

TARGET_AVX512 static ALWAYS_INLINE void values_avx512_t(enum kv_dtype dt, float *out,
                                                        const float *s, int n_heads, int n_kv_heads,
                                                        int hd, int n_pos, const void *const *vblk,
                                                        int bs, int stride)
{
    int group = n_heads / n_kv_heads;
    for (int h = 0; h < n_heads;) {
        int g = h / group, nj = (g + 1) * group - h;
        nj = nj < 4 ? nj : 4;
        float *o = out + (size_t)h * hd;
        const float *sj = s + (size_t)h * n_pos;
        size_t off = (size_t)g * hd;
        for (int d0 = 0; d0 < hd; d0 += 64) {
            if (hd - d0 < 64)
                values_tile_avx512(dt, o, sj, nj, hd, d0, n_pos, vblk, bs, stride, off, 0);
            else if (nj == 4)
                values_tile_avx512(dt, o, sj, 4, hd, d0, n_pos, vblk, bs, stride, off, 1);
            else if (nj == 3)
                values_tile_avx512(dt, o, sj, 3, hd, d0, n_pos, vblk, bs, stride, off, 1);
            else if (nj == 2)
                values_tile_avx512(dt, o, sj, 2, hd, d0, n_pos, vblk, bs, stride, off, 1);
            else
                values_tile_avx512(dt, o, sj, 1, hd, d0, n_pos, vblk, bs, stride, off, 1);
        }
        h += nj;
    }
}

TARGET_AVX512 static void values_avx512(float *out, const float *s, int n_heads, int n_kv_heads,
                                        int hd, int n_pos, enum kv_dtype dt,
                                        const void *const *vblk, int bs, int stride)
{
    KV_DISPATCH(dt, values_avx512_t, out, s, n_heads, n_kv_heads, hd, n_pos, vblk, bs, stride);
}

TARGET_AVX512 static ALWAYS_INLINE __m512 swiglu16_avx512(__m512 h, __m512 g)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), h));
    __m512 v = _mm512_mul_ps(h, _mm512_div_ps(one, _mm512_add_ps(one, e)));
    return _mm512_mul_ps(v, g);
}

TARGET_AVX512 static void swiglu_avx512(float *h, const float *g, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(h + i, swiglu16_avx512(_mm512_loadu_ps(h + i), _mm512_loadu_ps(g + i)));
    if (i < n) {
        __mmask16 k = lanes16((int)(n - i));
        _mm512_mask_storeu_ps(
            h + i, k,
            swiglu16_avx512(_mm512_maskz_loadu_ps(k, h + i), _mm512_maskz_loadu_ps(k, g + i)));
    }
}
/* ---- dispatch ------------------------------------------------------------ */

static const struct kern_impl impls[KERN_PATH_COUNT] = {
    [KERN_PATH_SCALAR] = {.matmul = matmul_scalar,
                          .dot = dot_scalar,
                          .scores = scores_scalar,
                          .softmax = softmax_scalar,
                          .values = values_scalar,
                          .swiglu = swiglu_scalar},
    [KERN_PATH_AVX2] = {.matmul = matmul_avx2,
                        .dot = dot_avx2,
                        .scores = scores_avx2,
                        .softmax = softmax_avx2,
                        .values = values_avx2,
                        .swiglu = swiglu_avx2},
    [KERN_PATH_AVX512] = {.matmul = matmul_avx512,
                          .dot = dot_avx512,
                          .scores = scores_avx512,
                          .softmax = softmax_avx512,
                          .values = values_avx512,
                          .swiglu = swiglu_avx512},
};

static const char *const path_names[KERN_PATH_COUNT] = {
    [KERN_PATH_SCALAR] = "scalar",
    [KERN_PATH_AVX2] = "avx2",
    [KERN_PATH_AVX512] = "avx512",
};

static pthread_once_t path_once = PTHREAD_ONCE_INIT;
static enum kern_path cur_path = KERN_PATH_SCALAR;
static const struct kern_impl *cur = &impls[KERN_PATH_SCALAR];

/* F16C (CPUID.1:ECX bit 29): not among GCC 12's __builtin_cpu_supports names. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return (c >> 29) & 1u;
}

int kern_path_supported(enum kern_path p)
{
    __builtin_cpu_init();
    switch (p) {
    case KERN_PATH_SCALAR:
        return 1;
    case KERN_PATH_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case KERN_PATH_AVX512:
        return __builtin_cpu_supports("avx512f") != 0;
    default:
        return 0;
    }
}

const char *kern_path_name(enum kern_path p)
{
    if ((unsigned)p >= KERN_PATH_COUNT)
        return "?";
    return path_names[p];
}

int kern_path_parse(const char *s, enum kern_path *out)
{
    if (s == NULL)
        return TANDEM_EINVAL;
    for (int p = 0; p < KERN_PATH_COUNT; p++) {
        if (strcmp(s, path_names[p]) == 0) {
            *out = (enum kern_path)p;
            return 0;
        }
    }
    return TANDEM_EINVAL;
}

static void path_init(void)
{
    enum kern_path p = KERN_PATH_SCALAR;
    if (kern_path_supported(KERN_PATH_AVX512))
        p = KERN_PATH_AVX512;
    else if (kern_path_supported(KERN_PATH_AVX2))
        p = KERN_PATH_AVX2;
    const char *env = getenv("TANDEM_SIMD");
    if (env != NULL && env[0] != '\0') {
        enum kern_path want;
        if (kern_path_parse(env, &want) != 0)
            LOG_WARN("kernels", "TANDEM_SIMD=%s is not avx512, avx2 or scalar; using %s", env,
                     path_names[p]);
        else if (!kern_path_supported(want))
            LOG_WARN("kernels", "TANDEM_SIMD=%s is not supported by this CPU; using %s", env,
                     path_names[p]);
        else
            p = want;
    }
    cur_path = p;
    cur = &impls[p];
}

static inline const struct kern_impl *impl(void)
{
    pthread_once(&path_once, path_init);
    return cur;
}

enum kern_path kern_active_path(void)
{
    pthread_once(&path_once, path_init);
    return cur_path;
}

int kern_set_path(enum kern_path p)
{
    pthread_once(&path_once, path_init);
    if ((unsigned)p >= KERN_PATH_COUNT)
        return TANDEM_EINVAL;
    if (!kern_path_supported(p))
        return TANDEM_EUNSUPPORTED;
    cur_path = p;
    cur = &impls[p];
    return 0;
}

/* ---- entry points ---------------------------------------------------------- */

#ifdef KERN_ASAN
static void check_region(const void *p, size_t bytes, const char *what, int row)
{
    const void *bad = __asan_region_is_poisoned((void *)(uintptr_t)p, bytes);
    if (bad == NULL)
        return;
    fprintf(stderr,
            "kern_matmul: %s (row %d, %zu bytes at %p) reaches unaddressable memory at %p: "
            "a caller passed a buffer shorter than its shape\n",
            what, row, bytes, p, bad);
    __sanitizer_print_stack_trace();
    abort();
}

static void check_footprint(const float *y, int ldy, const float *x, int ldx, int n_rows,
                            const struct kern_mat *m)
{
    for (int r = 0; r < n_rows; r++) {
        check_region(x + (size_t)r * ldx, (size_t)m->n_in * sizeof(float), "input x", r);
        check_region(y + (size_t)r * ldy, (size_t)m->n_out * sizeof(float), "output y", r);
    }
    check_region(m->data, (size_t)m->n_panels * m->n_in * KERN_PANEL * sizeof(float),
                 "packed weights", 0);
}
#elif defined(KERN_TSAN)
static void check_footprint(const float *y, int ldy, const float *x, int ldx, int n_rows,
                            const struct kern_mat *m)
{
    for (int r = 0; r < n_rows; r++) {
        __tsan_read_range((void *)(uintptr_t)(x + (size_t)r * ldx), (size_t)m->n_in * 4);
        __tsan_write_range((void *)(y + (size_t)r * ldy), (size_t)m->n_out * 4);
    }
}
#endif

void kern_matmul(float *y, int ldy, const float *x, int ldx, int n_rows, const struct kern_mat *m)
{
    if (n_rows <= 0)
        return;
#if defined(KERN_ASAN) || defined(KERN_TSAN)
    check_footprint(y, ldy, x, ldx, n_rows, m);
#endif
    impl()->matmul(y, ldy, x, ldx, n_rows, m);
}

float kern_dot(const float *a, const float *b, int n)
{
    return impl()->dot(a, b, n);
}

void kern_attention(float *out, const float *q, int n_heads, int n_kv_heads, int hd, int n_pos,
                    enum kv_dtype dt, const void *const *kblk, const void *const *vblk, int bs,
                    int stride, float *scratch)
{
    const struct kern_impl *k = impl();
    k->scores(scratch, q, n_heads, n_kv_heads, hd, n_pos, dt, kblk, bs, stride);
    for (int h = 0; h < n_heads; h++)
        k->softmax(scratch + (size_t)h * n_pos, n_pos);
    k->values(out, scratch, n_heads, n_kv_heads, hd, n_pos, dt, vblk, bs, stride);
}

void kern_swiglu(float *h, const float *g, size_t n)
{
    impl()->swiglu(h, g, n);
}

void kern_softmax(float *x, int n)
{
    if (n > 0)
        impl()->softmax(x, n);
}
