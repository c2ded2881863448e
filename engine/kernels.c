/* Batch-invariant kernels: scalar, AVX2+FMA and AVX-512F paths of the same
 * canonical arithmetic (see kernels.h). No global -m flags: the SIMD paths are
 * functions with target attributes, chosen at run time. */
#include "kernels.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tandem_err.h"

#define TARGET_AVX512 __attribute__((target("avx512f")))
#define TARGET_AVX2   __attribute__((target("avx2,fma")))
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Activation rows sharing one load of a weight panel row. */
#define MM_ROWS 6

struct kern_impl {
    void (*matmul)(float *y, int ldy, const float *x, int ldx, int n_rows,
                   const struct kern_mat *m);
    float (*dot)(const float *a, const float *b, int n);
    /* s[j * n_pos + t] = dot(q_j, k_t), unscaled. */
    void (*scores)(float *s, const float *q, int n_q, int hd, int n_pos, const float *const *kblk,
                   int bs, int stride, int off);
    /* out_j[d] = sum_t s[j * n_pos + t] * v_t[d]. */
    void (*values)(float *out, const float *s, int n_q, int hd, int n_pos, const float *const *vblk,
                   int bs, int stride, int off);
};

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

static float dot_scalar(const float *a, const float *b, int n)
{
    float l[16] = {0};
    for (int i = 0; i < n; i++)
        l[i & 15] = fmaf(a[i], b[i], l[i & 15]);
    return reduce16(l);
}

static void matmul_scalar(float *y, int ldy, const float *x, int ldx, int n_rows,
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

static void scores_scalar(float *s, const float *q, int n_q, int hd, int n_pos,
                          const float *const *kblk, int bs, int stride, int off)
{
    for (int t = 0; t < n_pos; t++) {
        const float *k = kblk[t / bs] + (size_t)(t % bs) * (size_t)stride + off;
        for (int j = 0; j < n_q; j++)
            s[(size_t)j * n_pos + t] = dot_scalar(q + (size_t)j * hd, k, hd);
    }
}

static void values_scalar(float *out, const float *s, int n_q, int hd, int n_pos,
                          const float *const *vblk, int bs, int stride, int off)
{
    for (int j = 0; j < n_q; j++) {
        float *o = out + (size_t)j * hd;
        const float *a = s + (size_t)j * n_pos;
        for (int d = 0; d < hd; d++)
            o[d] = 0.0f;
        for (int t = 0; t < n_pos; t++) {
            const float *v = vblk[t / bs] + (size_t)(t % bs) * (size_t)stride + off;
            for (int d = 0; d < hd; d++)
                o[d] = fmaf(a[t], v[d], o[d]);
        }
    }
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

/* Mask of the first n (0..8) 32-bit lanes. */
TARGET_AVX2 static ALWAYS_INLINE __m256i lanes_avx2(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
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
        /* Lanes past the end keep their value (a masked fma), as in the
         * scalar definition. */
        int r = n - i;
        __m256i mlo = lanes_avx2(r), mhi = lanes_avx2(r - 8);
        __m256 flo =
            _mm256_fmadd_ps(_mm256_maskload_ps(a + i, mlo), _mm256_maskload_ps(b + i, mlo), lo);
        lo = _mm256_blendv_ps(lo, flo, _mm256_castsi256_ps(mlo));
        if (r > 8) {
            __m256 fhi = _mm256_fmadd_ps(_mm256_maskload_ps(a + i + 8, mhi),
                                         _mm256_maskload_ps(b + i + 8, mhi), hi);
            hi = _mm256_blendv_ps(hi, fhi, _mm256_castsi256_ps(mhi));
        }
    }
    return reduce8x2_avx2(lo, hi);
}

TARGET_AVX2 static float dot_avx2(const float *a, const float *b, int n)
{
    return dot_avx2_inl(a, b, n);
}

/* 16 output columns (two ymm) x nr rows, whole reduction. */
TARGET_AVX2 static ALWAYS_INLINE void mm_tile_avx2(float *y, int ldy, const float *x, int ldx,
                                                   const float *P, int n_in, int nr, int ncol)
{
    __m256 acc[MM_ROWS][2];
    for (int r = 0; r < nr; r++) {
        acc[r][0] = _mm256_setzero_ps();
        acc[r][1] = _mm256_setzero_ps();
    }
    for (int i = 0; i < n_in; i++) {
        const float *w = P + (size_t)i * KERN_PANEL;
        __m256 w0 = _mm256_loadu_ps(w);
        __m256 w1 = _mm256_loadu_ps(w + 8);
        for (int r = 0; r < nr; r++) {
            __m256 xv = _mm256_broadcast_ss(x + (size_t)r * ldx + i);
            acc[r][0] = _mm256_fmadd_ps(w0, xv, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(w1, xv, acc[r][1]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float *yr = y + (size_t)r * ldy;
        if (ncol >= 16) {
            _mm256_storeu_ps(yr, acc[r][0]);
            _mm256_storeu_ps(yr + 8, acc[r][1]);
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, acc[r][0]);
            _mm256_storeu_ps(tmp + 8, acc[r][1]);
            memcpy(yr, tmp, (size_t)ncol * sizeof(float));
        }
    }
}

TARGET_AVX2 static void matmul_avx2(float *y, int ldy, const float *x, int ldx, int n_rows,
                                    const struct kern_mat *m)
{
    for (int p = 0; p < m->n_panels; p++) {
        const float *P = m->data + (size_t)p * (size_t)m->n_in * KERN_PANEL;
        for (int c0 = 0; c0 < KERN_PANEL; c0 += 16) {
            int o0 = p * KERN_PANEL + c0;
            if (o0 >= m->n_out)
                break;
            int ncol = m->n_out - o0;
            int b = 0;
            for (; b + MM_ROWS <= n_rows; b += MM_ROWS)
                mm_tile_avx2(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P + c0,
                             m->n_in, MM_ROWS, ncol);
            switch (n_rows - b) {
            case 5:
                mm_tile_avx2(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P + c0,
                             m->n_in, 5, ncol);
                break;
            case 4:
                mm_tile_avx2(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P + c0,
                             m->n_in, 4, ncol);
                break;
            case 3:
                mm_tile_avx2(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P + c0,
                             m->n_in, 3, ncol);
                break;
            case 2:
                mm_tile_avx2(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P + c0,
                             m->n_in, 2, ncol);
                break;
            case 1:
                mm_tile_avx2(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P + c0,
                             m->n_in, 1, ncol);
                break;
            default:
                break;
            }
        }
    }
}

TARGET_AVX2 static void scores_avx2(float *s, const float *q, int n_q, int hd, int n_pos,
                                    const float *const *kblk, int bs, int stride, int off)
{
    for (int t = 0; t < n_pos; t++) {
        const float *k = kblk[t / bs] + (size_t)(t % bs) * (size_t)stride + off;
        for (int j = 0; j < n_q; j++)
            s[(size_t)j * n_pos + t] = dot_avx2_inl(q + (size_t)j * hd, k, hd);
    }
}

TARGET_AVX2 static void values_avx2(float *out, const float *s, int n_q, int hd, int n_pos,
                                    const float *const *vblk, int bs, int stride, int off)
{
    for (int j = 0; j < n_q; j++) {
        const float *a = s + (size_t)j * n_pos;
        for (int d0 = 0; d0 < hd; d0 += 32) {
            int nd = hd - d0 < 32 ? hd - d0 : 32;
            __m256i mk[4];
            for (int c = 0; c < 4; c++)
                mk[c] = lanes_avx2(nd - 8 * c);
            __m256 acc[4];
            for (int c = 0; c < 4; c++)
                acc[c] = _mm256_setzero_ps();
            for (int t = 0; t < n_pos; t++) {
                const float *v = vblk[t / bs] + (size_t)(t % bs) * (size_t)stride + off + d0;
                __m256 av = _mm256_broadcast_ss(a + t);
                if (nd == 32) {
                    for (int c = 0; c < 4; c++)
                        acc[c] = _mm256_fmadd_ps(av, _mm256_loadu_ps(v + 8 * c), acc[c]);
                } else {
                    for (int c = 0; c < 4; c++)
                        acc[c] = _mm256_fmadd_ps(av, _mm256_maskload_ps(v + 8 * c, mk[c]), acc[c]);
                }
            }
            float *o = out + (size_t)j * hd + d0;
            for (int c = 0; c < 4; c++)
                _mm256_maskstore_ps(o + 8 * c, mk[c], acc[c]);
        }
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

/* Mask of the first n lanes, n clamped to 0..16. */
static inline __mmask16 lanes16(int n)
{
    if (n <= 0)
        return 0;
    if (n >= 16)
        return 0xffff;
    return (__mmask16)((1u << n) - 1u);
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
TARGET_AVX512 static ALWAYS_INLINE void mm_tile_avx512(float *y, int ldy, const float *x, int ldx,
                                                       const float *P, int n_in, int nr,
                                                       const __mmask16 *mk)
{
    __m512 acc[MM_ROWS][4];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int i = 0; i < n_in; i++) {
        const float *w = P + (size_t)i * KERN_PANEL;
        __m512 w0 = _mm512_load_ps(w);
        __m512 w1 = _mm512_load_ps(w + 16);
        __m512 w2 = _mm512_load_ps(w + 32);
        __m512 w3 = _mm512_load_ps(w + 48);
        for (int r = 0; r < nr; r++) {
            __m512 xv = _mm512_set1_ps(x[(size_t)r * ldx + i]);
            acc[r][0] = _mm512_fmadd_ps(w0, xv, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(w1, xv, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(w2, xv, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(w3, xv, acc[r][3]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float *yr = y + (size_t)r * ldy;
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(yr + 16 * c, mk[c], acc[r][c]);
    }
}

TARGET_AVX512 static void matmul_avx512(float *y, int ldy, const float *x, int ldx, int n_rows,
                                        const struct kern_mat *m)
{
    for (int p = 0; p < m->n_panels; p++) {
        const float *P = m->data + (size_t)p * (size_t)m->n_in * KERN_PANEL;
        int o0 = p * KERN_PANEL;
        __mmask16 mk[4];
        for (int c = 0; c < 4; c++)
            mk[c] = lanes16(m->n_out - o0 - 16 * c);
        int b = 0;
        for (; b + MM_ROWS <= n_rows; b += MM_ROWS)
            mm_tile_avx512(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P, m->n_in,
                           MM_ROWS, mk);
        switch (n_rows - b) {
        case 5:
            mm_tile_avx512(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P, m->n_in, 5,
                           mk);
            break;
        case 4:
            mm_tile_avx512(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P, m->n_in, 4,
                           mk);
            break;
        case 3:
            mm_tile_avx512(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P, m->n_in, 3,
                           mk);
            break;
        case 2:
            mm_tile_avx512(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P, m->n_in, 2,
                           mk);
            break;
        case 1:
            mm_tile_avx512(y + (size_t)b * ldy + o0, ldy, x + (size_t)b * ldx, ldx, P, m->n_in, 1,
                           mk);
            break;
        default:
            break;
        }
    }
}

TARGET_AVX512 static void scores_avx512(float *s, const float *q, int n_q, int hd, int n_pos,
                                        const float *const *kblk, int bs, int stride, int off)
{
    for (int t = 0; t < n_pos; t++) {
        const float *k = kblk[t / bs] + (size_t)(t % bs) * (size_t)stride + off;
        for (int j = 0; j < n_q; j++)
            s[(size_t)j * n_pos + t] = dot_avx512_inl(q + (size_t)j * hd, k, hd);
    }
}

TARGET_AVX512 static void values_avx512(float *out, const float *s, int n_q, int hd, int n_pos,
                                        const float *const *vblk, int bs, int stride, int off)
{
    for (int j = 0; j < n_q; j++) {
        const float *a = s + (size_t)j * n_pos;
        for (int d0 = 0; d0 < hd; d0 += 64) {
            __mmask16 mk[4];
            for (int c = 0; c < 4; c++)
                mk[c] = lanes16(hd - d0 - 16 * c);
            __m512 acc[4];
            for (int c = 0; c < 4; c++)
                acc[c] = _mm512_setzero_ps();
            for (int t = 0; t < n_pos; t++) {
                const float *v = vblk[t / bs] + (size_t)(t % bs) * (size_t)stride + off + d0;
                __m512 av = _mm512_set1_ps(a[t]);
                for (int c = 0; c < 4; c++)
                    acc[c] = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk[c], v + 16 * c), acc[c]);
            }
            float *o = out + (size_t)j * hd + d0;
            for (int c = 0; c < 4; c++)
                _mm512_mask_storeu_ps(o + 16 * c, mk[c], acc[c]);
        }
    }
}

/* ---- dispatch ------------------------------------------------------------ */

static const struct kern_impl impls[KERN_PATH_COUNT] = {
    [KERN_PATH_SCALAR] = {.matmul = matmul_scalar,
                          .dot = dot_scalar,
                          .scores = scores_scalar,
                          .values = values_scalar},
    [KERN_PATH_AVX2] = {.matmul = matmul_avx2,
                        .dot = dot_avx2,
                        .scores = scores_avx2,
                        .values = values_avx2},
    [KERN_PATH_AVX512] = {.matmul = matmul_avx512,
                          .dot = dot_avx512,
                          .scores = scores_avx512,
                          .values = values_avx512},
};

static const char *const path_names[KERN_PATH_COUNT] = {
    [KERN_PATH_SCALAR] = "scalar",
    [KERN_PATH_AVX2] = "avx2",
    [KERN_PATH_AVX512] = "avx512",
};

static pthread_once_t path_once = PTHREAD_ONCE_INIT;
static enum kern_path cur_path = KERN_PATH_SCALAR;
static const struct kern_impl *cur = &impls[KERN_PATH_SCALAR];

int kernels_path_supported(enum kern_path p)
{
    __builtin_cpu_init();
    switch (p) {
    case KERN_PATH_SCALAR:
        return 1;
    case KERN_PATH_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case KERN_PATH_AVX512:
        return __builtin_cpu_supports("avx512f") != 0;
    default:
        return 0;
    }
}

const char *kernels_path_name(enum kern_path p)
{
    if ((unsigned)p >= KERN_PATH_COUNT)
        return "?";
    return path_names[p];
}

int kernels_path_parse(const char *s, enum kern_path *out)
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
    if (kernels_path_supported(KERN_PATH_AVX512))
        p = KERN_PATH_AVX512;
    else if (kernels_path_supported(KERN_PATH_AVX2))
        p = KERN_PATH_AVX2;
    const char *env = getenv("TANDEM_SIMD");
    if (env != NULL && env[0] != '\0') {
        enum kern_path want;
        if (kernels_path_parse(env, &want) != 0)
            LOG_WARN("kernels", "TANDEM_SIMD=%s is not avx512, avx2 or scalar; using %s", env,
                     path_names[p]);
        else if (!kernels_path_supported(want))
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

enum kern_path kernels_path(void)
{
    pthread_once(&path_once, path_init);
    return cur_path;
}

int kernels_set_path(enum kern_path p)
{
    pthread_once(&path_once, path_init);
    if ((unsigned)p >= KERN_PATH_COUNT)
        return TANDEM_EINVAL;
    if (!kernels_path_supported(p))
        return TANDEM_EUNSUPPORTED;
    cur_path = p;
    cur = &impls[p];
    return 0;
}

/* ---- entry points ---------------------------------------------------------- */

void kern_matmul(float *y, int ldy, const float *x, int ldx, int n_rows, const struct kern_mat *m)
{
    if (n_rows <= 0)
        return;
    impl()->matmul(y, ldy, x, ldx, n_rows, m);
}

float kern_dot(const float *a, const float *b, int n)
{
    return impl()->dot(a, b, n);
}

void kern_attention(float *out, const float *q, int n_q, int hd, int n_pos,
                    const float *const *kblk, const float *const *vblk, int bs, int stride, int off,
                    float *scratch)
{
    const struct kern_impl *k = impl();
    k->scores(scratch, q, n_q, hd, n_pos, kblk, bs, stride, off);
    /* Softmax: scalar and shared by every path, so its bits do not depend on
     * the path either. */
    float scale = sqrtf((float)hd);
    for (int j = 0; j < n_q; j++) {
        float *s = scratch + (size_t)j * n_pos;
        float max = -INFINITY;
        for (int t = 0; t < n_pos; t++) {
            s[t] = s[t] / scale;
            if (s[t] > max)
                max = s[t];
        }
        float sum = 0.0f;
        for (int t = 0; t < n_pos; t++) {
            s[t] = expf(s[t] - max);
            sum += s[t];
        }
        for (int t = 0; t < n_pos; t++)
            s[t] = s[t] / sum;
    }
    k->values(out, scratch, n_q, hd, n_pos, vblk, bs, stride, off);
}
