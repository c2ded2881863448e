/* Batch-invariant compute kernels for the `tiny` backend (fp32, CPU).
 *
 * Batch invariance: every output element is computed by a fixed sequence of
 * floating-point operations that depends only on the shapes of the model,
 * never on how many rows are in the batch, where a row sits in it, or how a
 * prompt was chunked. Batching only changes how many activation rows share
 * each weight value loaded from memory (that is where the speed-up comes from).
 *
 * The canonical arithmetic (what every path computes, bit for bit):
 *   - matmul y[b][o] and the attention value sum out[d]: one fused
 *     multiply-add chain per output element, in increasing index order,
 *     starting from +0:  acc = fmaf(w[i], x[i], acc)  for i = 0, 1, ...
 *   - dot (attention scores, RMSNorm sum of squares): 16 lanes; lane j is a
 *     fused multiply-add chain over the elements i = j, j+16, j+32, ... from
 *     +0; then the lanes are summed pairwise: l[j] += l[j+8] (j < 8), then
 *     l[j] += l[j+4], l[j] += l[j+2], and finally l[0] + l[1].
 *   - softmax: m = max (exact in any order), e[i] = kern_exp(x[i] - m), the
 *     sum of e in the same 16-lane shape as dot (plain additions), then
 *     x[i] = e[i] / sum.
 *   - kern_exp: a fixed sequence of IEEE operations and fmas (no libm), so
 *     a vector lane and the scalar function agree.
 * Each of these is an exact function of its inputs, so the three paths
 * (AVX-512F, AVX2+FMA, scalar with C99 fmaf) give the same bits; they differ
 * only in speed. Every fused operation is spelled out (fmaf or an intrinsic),
 * so the code must not be built with -ffast-math or -ffp-contract=fast.
 *
 * The path rule: on first use, the process takes the path named by the
 * environment variable TANDEM_SIMD ("avx512", "avx2" or "scalar") if the CPU
 * supports it (otherwise it logs a warning and ignores the variable), else
 * the widest the CPU supports (AVX-512F, then AVX2 with FMA and F16C, then
 * scalar).
 * kern_set_path() overrides it (tests, benchmarks).
 *
 * Threading: every kernel is reentrant and may run on any thread. Path
 * selection is process-wide: kern_set_path() must not race with kernels
 * running on other threads. */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H

#include <stddef.h>

#include "kv_dtype.h"

enum kern_path { KERN_PATH_SCALAR = 0, KERN_PATH_AVX2, KERN_PATH_AVX512, KERN_PATH_COUNT };

/* Output columns per weight panel (see struct kern_mat). */
#define KERN_PANEL 64

/* The path in use (selected on first call by the rule above). Thread-safe. */
enum kern_path kern_active_path(void);
/* "scalar", "avx2", "avx512"; "?" for anything else. */
const char *kern_path_name(enum kern_path p);
/* Parses a name above. Returns 0, or TANDEM_EINVAL. */
int kern_path_parse(const char *s, enum kern_path *out);
/* 1 when this CPU can run path p. */
int kern_path_supported(enum kern_path p);
/* Switches every kernel to path p. Returns 0, TANDEM_EINVAL for an unknown
 * path, or TANDEM_EUNSUPPORTED when the CPU lacks it (path unchanged). Not
 * thread-safe: call while no kernel runs. */
int kern_set_path(enum kern_path p);

/* A weight matrix W (n_out x n_in, row-major in the checkpoint) repacked for
 * the matmul: output columns in panels of KERN_PANEL, each panel stored
 * input-major so a kernel streams it sequentially. The last panel is padded
 * with zeros. */
struct kern_mat {
    float *data; /* (n_panels, n_in, KERN_PANEL): data[p][i][c] = W[p*KERN_PANEL + c][i] */
    int n_in;
    int n_out;
    int n_panels;
};

/* Packs w (n_out x n_in floats, row-major) into m (64-byte aligned). Returns
 * 0, TANDEM_EINVAL (a count < 1), or TANDEM_ENOMEM. Free with kern_mat_free. */
int kern_mat_pack(struct kern_mat *m, const float *w, int n_out, int n_in);
/* Allocates m for n_out x n_in and leaves it zeroed (fill with kern_mat_set_row). */
int kern_mat_alloc(struct kern_mat *m, int n_out, int n_in);
/* Writes row o of W (n_in floats) into m. */
void kern_mat_set_row(struct kern_mat *m, int o, const float *row);
/* Reads row o of W (n_in floats) back out of m. */
void kern_mat_get_row(const struct kern_mat *m, int o, float *row);
/* Frees m's data (m itself is the caller's) and zeroes it. NULL-safe data. */
void kern_mat_free(struct kern_mat *m);

/* y[b][o] = sum_i W[o][i] * x[b][i] for b < n_rows, o < m->n_out, the
 * canonical fma chain. x rows are ldx floats apart, y rows ldy (>= n_out).
 * y must not overlap x. */
void kern_matmul(float *y, int ldy, const float *x, int ldx, int n_rows, const struct kern_mat *m);

/* The canonical 16-lane dot product of a and b (n >= 0 floats). */
float kern_dot(const float *a, const float *b, int n);

/* The canonical exp: for x in [-87, 88] within 2 ulp of exp(x); below -87
 * it returns exp(-87), above 88 exp(88). Same bits on every path. */
float kern_exp(float x);

/* In place: x[0..n) <- softmax(x), canonical order (n >= 1). */
void kern_softmax(float *x, int n);

/* In place: h[i] <- silu(h[i]) * g[i], silu(v) = v * (1 / (1 + kern_exp(0 - v))). */
void kern_swiglu(float *h, const float *g, size_t n);

/* Causal attention of one query, at position n_pos - 1, for every head;
 * query head h reads KV head g = h / (n_heads / n_kv_heads):
 *   s[h][t] = dot(q_h, k_t,g) / sqrtf(hd);  a[h] = softmax(s[h]);
 *   out_h[d] = sum_t a[h][t] * v_t,g[d]   (canonical fma chain over t)
 * q, out: (n_heads, hd) contiguous. K and V are read as stored, values of
 * type dt: the keys of position t are the (n_kv_heads, hd) values at
 * kblk[t / bs] + (t % bs) * stride values (stride >= n_kv_heads * hd),
 * values likewise in vblk. Each value is widened to f32 as it is loaded
 * (exact), so the result has the bits of kv_dequantize followed by this
 * function on f32 rows. scratch: n_heads * n_pos floats. n_heads must be a
 * multiple of n_kv_heads. */
void kern_attention(float *out, const float *q, int n_heads, int n_kv_heads, int hd, int n_pos,
                    enum kv_dtype dt, const void *const *kblk, const void *const *vblk, int bs,
                    int stride, float *scratch);

#endif
