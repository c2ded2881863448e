/* Storage types for KV-cache values, with conversion to and from fp32.
 * f32 (4 bytes), f16 (IEEE half, 2), bf16 (2), fp8 e4m3 (OCP "e4m3fn": 1 byte,
 * bias 7, no infinities, max finite 448, saturating, round-to-nearest-even).
 * All functions are pure and thread-safe. */
#ifndef TANDEM_KV_DTYPE_H
#define TANDEM_KV_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum kv_dtype { KV_DTYPE_F32 = 0, KV_DTYPE_F16, KV_DTYPE_BF16, KV_DTYPE_FP8, KV_DTYPE_COUNT };

/* Bytes per stored value: 4, 2, 2, 1 (0 for anything else). Inline so that
 * kernels specialised on a constant dtype fold it. */
static inline size_t kv_dtype_size(enum kv_dtype dt)
{
    switch (dt) {
    case KV_DTYPE_F32:
        return 4;
    case KV_DTYPE_F16:
    case KV_DTYPE_BF16:
        return 2;
    case KV_DTYPE_FP8:
        return 1;
    default:
        return 0;
    }
}
/* "f32", "f16", "bf16", "fp8". */
const char *kv_dtype_name(enum kv_dtype dt);
/* Parses a name above (also "fp32", "fp16", "float32", "e4m3"). 0 or TANDEM_EINVAL. */
int kv_dtype_parse(const char *s, enum kv_dtype *out);

/* dst (n values of dt) <- src (n floats). NaN becomes NaN (fp8: 0x7f). */
void kv_quantize(enum kv_dtype dt, void *dst, const float *src, size_t n);
/* dst (n floats) <- src (n values of dt). */
void kv_dequantize(enum kv_dtype dt, float *dst, const void *src, size_t n);

/* Scalar conversions, exposed for tests and kernels. */
uint16_t kv_f32_to_f16(float f);
float kv_f16_to_f32(uint16_t h);
uint16_t kv_f32_to_bf16(float f);
float kv_bf16_to_f32(uint16_t h);
uint8_t kv_f32_to_fp8(float f);
float kv_fp8_to_f32(uint8_t v);

#endif
