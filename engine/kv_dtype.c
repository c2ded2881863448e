/* KV storage types. Conversions work on bit patterns (memcpy, no type
 * punning through unions) and never depend on the FPU rounding mode except
 * in the f16 routines, which rely on the default round-to-nearest-even mode
 * and on the compiler not reassociating float arithmetic (no -ffast-math). */
#include "kv_dtype.h"
#include "tandem_err.h"

#include <string.h>

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* cond ? a : b without a branch. Written with masks so that the compiler
 * keeps both (float) operands unconditional and the bulk loops vectorise:
 * with a ternary, GCC sinks the float arithmetic into the arms and then
 * refuses to if-convert it because float ops may trap. */
static inline uint32_t select_u32(int cond, uint32_t a, uint32_t b)
{
    uint32_t mask = (uint32_t)0 - (uint32_t)(cond != 0);
    return (a & mask) | (b & ~mask);
}

const char *kv_dtype_name(enum kv_dtype dt)
{
    switch (dt) {
    case KV_DTYPE_F32:
        return "f32";
    case KV_DTYPE_F16:
        return "f16";
    case KV_DTYPE_BF16:
        return "bf16";
    case KV_DTYPE_FP8:
        return "fp8";
    default:
        return "unknown";
    }
}

int kv_dtype_parse(const char *s, enum kv_dtype *out)
{
    static const struct {
        const char *name;
        enum kv_dtype dt;
    } names[] = {
        {"f32", KV_DTYPE_F32}, {"fp32", KV_DTYPE_F32}, {"float32", KV_DTYPE_F32},
        {"f16", KV_DTYPE_F16}, {"fp16", KV_DTYPE_F16}, {"bf16", KV_DTYPE_BF16},
        {"fp8", KV_DTYPE_FP8}, {"e4m3", KV_DTYPE_FP8},
    };
    if (s == NULL || out == NULL) {
        return TANDEM_EINVAL;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].dt;
            return 0;
        }
    }
    return TANDEM_EINVAL;
}

/* ---- f16 -----------------------------------------------------------------
 * Branch-free conversions after Maratyszcza's FP16 library: the float unit
 * does the rounding (RNE) and the subnormal handling, so the loops vectorise. */

static inline uint16_t f16_encode(float f)
{
    /* Scaling by 2^112 then 2^-110 makes overflow saturate to inf and leaves
     * the value where adding the bias below rounds it to 10 mantissa bits. */
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    uint32_t w = f32_bits(f);
    float base = (f32_from_bits(w & 0x7fffffffu) * scale_to_inf) * scale_to_zero;

    uint32_t shl1_w = w + w;
    uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    bias = select_u32(bias < 0x71000000u, 0x71000000u, bias);
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = f32_bits(base);
    uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    uint32_t mantissa_bits = bits & 0x00000FFFu;
    uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | select_u32(shl1_w > 0xFF000000u, 0x7E00u, nonsign));
}

static inline float f16_decode(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w;

    /* Normal (and inf/nan): shift exponent and mantissa into place, rebias by
     * 224 in the exponent field and scale back by 2^-112 so that f16 inf/nan
     * (exponent 31) land on f32 exponent 255 before scaling. */
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;

    /* Subnormal: put the mantissa under the 0.5 exponent and subtract 0.5. */
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;

    const uint32_t denormalized_cutoff = 1u << 27;
    uint32_t result = sign | select_u32(two_w < denormalized_cutoff, f32_bits(denormalized),
                                        f32_bits(normalized));
    return f32_from_bits(result);
}

/* ---- bf16 ---------------------------------------------------------------- */

static inline uint16_t bf16_encode(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x0040u); /* keep it a (quiet) NaN */
    }
    /* Round to nearest, ties to even; overflow carries into inf correctly. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_decode(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

/* ---- fp8 e4m3fn -----------------------------------------------------------
 * s eeee mmm, bias 7. Exponent 15 is an ordinary binade except mantissa 7,
 * which is NaN; no infinities. Max finite 0x7e = 1.75 * 2^8 = 448. Smallest
 * normal 2^-6, subnormals m * 2^-9. */

#define FP8_NAN_BITS 0x7fu

/* Round |f| (clamped to 448) to 3 mantissa bits at its own exponent, or at
 * 2^-6 below that (subnormals), by adding M = 2^(e + 20): the sum's ulp is
 * exactly the e4m3 ulp 2^(e - 3), so the FPU rounds to nearest even, and
 * bits(sum) - bits(M) is the rounded value in those ulps: 8..16 for normals
 * (16 = carry into the next binade), 0..8 for subnormals. The code is then
 * ((e + 6) << 3) + that, with e >= -6. Branch-free, so the loop vectorises. */
static inline uint8_t fp8_encode(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t a = u & 0x7fffffffu;
    uint32_t is_nan = a > 0x7f800000u;
    a = select_u32(a > 0x43e00000u, 0x43e00000u, a); /* saturate at 448, inf included */
    uint32_t e = a & 0x7f800000u;
    e = select_u32(e < (121u << 23), 121u << 23, e); /* 2^-6: the subnormal binade */
    uint32_t m = e + (20u << 23);
    uint32_t q = f32_bits(f32_from_bits(a) + f32_from_bits(m)) - m;
    uint32_t code = (((e >> 23) - 121u) << 3) + q;
    code = select_u32(is_nan, FP8_NAN_BITS, code);
    return (uint8_t)(((u >> 24) & 0x80u) | code);
}

/* f32 bit pattern of every fp8 code, built by the preprocessor. */
#define FP8_SUB_BITS(m)                                                                            \
    ((m) == 0   ? 0u                                                                               \
     : (m) == 1 ? 0x3b000000u                                                                      \
     : (m) == 2 ? 0x3b800000u                                                                      \
     : (m) == 3 ? 0x3bc00000u                                                                      \
     : (m) == 4 ? 0x3c000000u                                                                      \
     : (m) == 5 ? 0x3c200000u                                                                      \
     : (m) == 6 ? 0x3c400000u                                                                      \
                : 0x3c600000u)
#define FP8_MAG_BITS(v)                                                                            \
    (((v)&0x7fu) == 0x7fu ? 0x7fc00000u                                                            \
     : ((v)&0x78u) == 0   ? FP8_SUB_BITS((v)&7u)                                                   \
                          : (((((v) >> 3) & 15u) + 120u) << 23) | (((v)&7u) << 20))
#define FP8_BITS(v) ((((v)&0x80u) ? 0x80000000u : 0u) | FP8_MAG_BITS(v))
#define FP8_T4(v)   FP8_BITS(v), FP8_BITS((v) + 1u), FP8_BITS((v) + 2u), FP8_BITS((v) + 3u)
#define FP8_T16(v)  FP8_T4(v), FP8_T4((v) + 4u), FP8_T4((v) + 8u), FP8_T4((v) + 12u)
#define FP8_T64(v)  FP8_T16(v), FP8_T16((v) + 16u), FP8_T16((v) + 32u), FP8_T16((v) + 48u)
#define FP8_T256(v) FP8_T64(v), FP8_T64((v) + 64u), FP8_T64((v) + 128u), FP8_T64((v) + 192u)

static const uint32_t fp8_table[256] = {FP8_T256(0u)};

static inline float fp8_decode(uint8_t v)
{
    return f32_from_bits(fp8_table[v]);
}

/* ---- public -------------------------------------------------------------- */

uint16_t kv_f32_to_f16(float f)
{
    return f16_encode(f);
}

float kv_f16_to_f32(uint16_t h)
{
    return f16_decode(h);
}

uint16_t kv_f32_to_bf16(float f)
{
    return bf16_encode(f);
}

float kv_bf16_to_f32(uint16_t h)
{
    return bf16_decode(h);
}

uint8_t kv_f32_to_fp8(float f)
{
    return fp8_encode(f);
}

float kv_fp8_to_f32(uint8_t v)
{
    return fp8_decode(v);
}

void kv_quantize(enum kv_dtype dt, void *dst, const float *src, size_t n)
{
    switch (dt) {
    case KV_DTYPE_F32:
        memmove(dst, src, n * sizeof(float));
        break;
    case KV_DTYPE_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = f16_encode(src[i]);
        }
        break;
    }
    case KV_DTYPE_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = bf16_encode(src[i]);
        }
        break;
    }
    case KV_DTYPE_FP8: {
        uint8_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = fp8_encode(src[i]);
        }
        break;
    }
    default:
        break;
    }
}

void kv_dequantize(enum kv_dtype dt, float *dst, const void *src, size_t n)
{
    switch (dt) {
    case KV_DTYPE_F32:
        memmove(dst, src, n * sizeof(float));
        break;
    case KV_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) {
            dst[i] = f16_decode(s[i]);
        }
        break;
    }
    case KV_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) {
            dst[i] = bf16_decode(s[i]);
        }
        break;
    }
    case KV_DTYPE_FP8: {
        const uint8_t *s = src;
        for (size_t i = 0; i < n; i++) {
            dst[i] = fp8_decode(s[i]);
        }
        break;
    }
    default:
        break;
    }
}
