/* KV storage types: exact encodings, ties, saturation and round-trip bounds. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kv_dtype.h"
#include "tandem_err.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Deterministic sweep values (the sweep is exhaustive in structure, the
 * mantissas come from a fixed xorshift stream). */
static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t rng32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static void test_names(void)
{
    enum kv_dtype dt;
    CU_ASSERT_EQUAL(kv_dtype_size(KV_DTYPE_F32), 4);
    CU_ASSERT_EQUAL(kv_dtype_size(KV_DTYPE_F16), 2);
    CU_ASSERT_EQUAL(kv_dtype_size(KV_DTYPE_BF16), 2);
    CU_ASSERT_EQUAL(kv_dtype_size(KV_DTYPE_FP8), 1);
    CU_ASSERT_STRING_EQUAL(kv_dtype_name(KV_DTYPE_F32), "f32");
    CU_ASSERT_STRING_EQUAL(kv_dtype_name(KV_DTYPE_F16), "f16");
    CU_ASSERT_STRING_EQUAL(kv_dtype_name(KV_DTYPE_BF16), "bf16");
    CU_ASSERT_STRING_EQUAL(kv_dtype_name(KV_DTYPE_FP8), "fp8");
    for (int i = 0; i < KV_DTYPE_COUNT; i++) {
        CU_ASSERT_EQUAL(kv_dtype_parse(kv_dtype_name((enum kv_dtype)i), &dt), 0);
        CU_ASSERT_EQUAL(dt, (enum kv_dtype)i);
    }
    static const struct {
        const char *s;
        enum kv_dtype dt;
    } alias[] = {{"fp32", KV_DTYPE_F32},
                 {"float32", KV_DTYPE_F32},
                 {"fp16", KV_DTYPE_F16},
                 {"e4m3", KV_DTYPE_FP8}};
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
        dt = KV_DTYPE_COUNT;
        CU_ASSERT_EQUAL(kv_dtype_parse(alias[i].s, &dt), 0);
        CU_ASSERT_EQUAL(dt, alias[i].dt);
    }
    dt = KV_DTYPE_BF16;
    CU_ASSERT_EQUAL(kv_dtype_parse("f64", &dt), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(kv_dtype_parse("", &dt), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(kv_dtype_parse("F16", &dt), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(kv_dtype_parse(NULL, &dt), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(dt, KV_DTYPE_BF16); /* untouched on failure */
}

static void test_f16_exact(void)
{
    CU_ASSERT_EQUAL(kv_f32_to_f16(1.0f), 0x3c00);
    CU_ASSERT_EQUAL(kv_f32_to_f16(-2.0f), 0xc000);
    CU_ASSERT_EQUAL(kv_f32_to_f16(0.0f), 0x0000);
    CU_ASSERT_EQUAL(kv_f32_to_f16(-0.0f), 0x8000);
    CU_ASSERT_EQUAL(kv_f32_to_f16(65504.0f), 0x7bff);
    CU_ASSERT_EQUAL(kv_f32_to_f16(-65504.0f), 0xfbff);
    CU_ASSERT_EQUAL(kv_f32_to_f16(65519.0f), 0x7bff);
    CU_ASSERT_EQUAL(kv_f32_to_f16(65520.0f), 0x7c00); /* tie rounds to even: inf */
    CU_ASSERT_EQUAL(kv_f32_to_f16(1e6f), 0x7c00);
    CU_ASSERT_EQUAL(kv_f32_to_f16(INFINITY), 0x7c00);
    CU_ASSERT_EQUAL(kv_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t n = kv_f32_to_f16(NAN);
    CU_ASSERT_EQUAL(n & 0x7c00, 0x7c00);
    CU_ASSERT_NOT_EQUAL(n & 0x03ff, 0);
    /* Subnormals: smallest 2^-24, largest 1023 * 2^-24, then 2^-14 normal. */
    CU_ASSERT_EQUAL(kv_f32_to_f16(0x1p-24f), 0x0001);
    CU_ASSERT_EQUAL(kv_f32_to_f16(-0x1p-24f), 0x8001);
    CU_ASSERT_EQUAL(kv_f32_to_f16(1023 * 0x1p-24f), 0x03ff);
    CU_ASSERT_EQUAL(kv_f32_to_f16(0x1p-14f), 0x0400);
    CU_ASSERT_EQUAL(kv_f32_to_f16(0x1p-25f), 0x0000);        /* tie to even: 0 */
    CU_ASSERT_EQUAL(kv_f32_to_f16(0x1.000002p-25f), 0x0001); /* just above the tie */
    CU_ASSERT_EQUAL(kv_f32_to_f16(3 * 0x1p-25f), 0x0002);    /* tie between 1 and 2 */
    CU_ASSERT_EQUAL(kv_f32_to_f16(0x1p-30f), 0x0000);
    CU_ASSERT_EQUAL(kv_f32_to_f16(1e-45f), 0x0000); /* f32 subnormal */
    /* Normal ties: 1 + 2^-11 is half way between 0x3c00 and 0x3c01. */
    CU_ASSERT_EQUAL(kv_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    CU_ASSERT_EQUAL(kv_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    CU_ASSERT_EQUAL(kv_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    CU_ASSERT_EQUAL(kv_f32_to_f16(2047 * 0x1p-25f), 0x0400); /* rounds up into normal */

    CU_ASSERT_EQUAL(kv_f16_to_f32(0x3c00), 1.0f);
    CU_ASSERT_EQUAL(kv_f16_to_f32(0xc000), -2.0f);
    CU_ASSERT_EQUAL(kv_f16_to_f32(0x7bff), 65504.0f);
    CU_ASSERT_EQUAL(kv_f16_to_f32(0x0001), 0x1p-24f);
    CU_ASSERT_EQUAL(kv_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
    CU_ASSERT_EQUAL(kv_f16_to_f32(0x0400), 0x1p-14f);
    CU_ASSERT_EQUAL(bits(kv_f16_to_f32(0x8000)), 0x80000000u);
    CU_ASSERT(isinf(kv_f16_to_f32(0x7c00)) && kv_f16_to_f32(0x7c00) > 0);
    CU_ASSERT(isinf(kv_f16_to_f32(0xfc00)) && kv_f16_to_f32(0xfc00) < 0);
    CU_ASSERT(isnan(kv_f16_to_f32(0x7e00)));
    CU_ASSERT(isnan(kv_f16_to_f32(0x7c01)));
    CU_ASSERT(isnan(kv_f16_to_f32(0xffff)));
}

static void test_bf16_exact(void)
{
    CU_ASSERT_EQUAL(kv_f32_to_bf16(1.0f), 0x3f80);
    CU_ASSERT_EQUAL(kv_f32_to_bf16(-2.0f), 0xc000);
    CU_ASSERT_EQUAL(kv_f32_to_bf16(-0.0f), 0x8000);
    CU_ASSERT_EQUAL(kv_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
    CU_ASSERT_EQUAL(kv_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    CU_ASSERT_EQUAL(kv_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    CU_ASSERT_EQUAL(kv_f32_to_bf16(INFINITY), 0x7f80);
    CU_ASSERT_EQUAL(kv_f32_to_bf16(-INFINITY), 0xff80);
    CU_ASSERT_EQUAL(kv_f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds up */
    CU_ASSERT_EQUAL(kv_f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
    CU_ASSERT_EQUAL(kv_f32_to_bf16(from_bits(0x00010000u)), 0x0001); /* subnormal */
    CU_ASSERT_EQUAL(kv_f32_to_bf16(from_bits(0x00008000u)), 0x0000); /* tie to even */
    CU_ASSERT_EQUAL(kv_f32_to_bf16(from_bits(0x00018000u)), 0x0002);
    uint16_t n = kv_f32_to_bf16(NAN);
    CU_ASSERT_EQUAL(n & 0x7f80, 0x7f80);
    CU_ASSERT_NOT_EQUAL(n & 0x007f, 0);
    /* A NaN whose payload lives only in the low 16 bits stays a NaN. */
    n = kv_f32_to_bf16(from_bits(0x7f800001u));
    CU_ASSERT(isnan(kv_bf16_to_f32(n)));

    CU_ASSERT_EQUAL(kv_bf16_to_f32(0x3f80), 1.0f);
    CU_ASSERT_EQUAL(kv_bf16_to_f32(0xc000), -2.0f);
    CU_ASSERT_EQUAL(kv_bf16_to_f32(0x0001), 0x1p-133f);
    CU_ASSERT(isinf(kv_bf16_to_f32(0x7f80)));
    CU_ASSERT(isnan(kv_bf16_to_f32(0x7fc0)));
}

static void test_fp8_exact(void)
{
    CU_ASSERT_EQUAL(kv_f32_to_fp8(1.0f), 0x38);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(-2.0f), 0xc0);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(0.0f), 0x00);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(-0.0f), 0x80);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(448.0f), 0x7e);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(-448.0f), 0xfe);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(416.0f), 0x7d);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(449.0f), 0x7e); /* saturation */
    CU_ASSERT_EQUAL(kv_f32_to_fp8(464.0f), 0x7e);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(1e9f), 0x7e);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(-1e9f), 0xfe);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(INFINITY), 0x7e);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(-INFINITY), 0xfe);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(NAN), 0x7f);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(-NAN), 0xff);
    /* Subnormals m * 2^-9, smallest normal 2^-6. */
    CU_ASSERT_EQUAL(kv_f32_to_fp8(0x1p-9f), 0x01);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(-0x1p-9f), 0x81);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(7 * 0x1p-9f), 0x07);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(0x1p-6f), 0x08);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(0x1p-10f), 0x00); /* tie to even: 0 */
    CU_ASSERT_EQUAL(kv_f32_to_fp8(0x1.000002p-10f), 0x01);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(3 * 0x1p-10f), 0x02);  /* tie between 1 and 2 */
    CU_ASSERT_EQUAL(kv_f32_to_fp8(15 * 0x1p-10f), 0x08); /* tie 7 | 8: even, normal */
    CU_ASSERT_EQUAL(kv_f32_to_fp8(1e-30f), 0x00);
    /* Normal ties: 1.0625 is half way between 1.0 (0x38) and 1.125 (0x39). */
    CU_ASSERT_EQUAL(kv_f32_to_fp8(1.0625f), 0x38);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(1.1875f), 0x3a);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(1.07f), 0x39);
    CU_ASSERT_EQUAL(kv_f32_to_fp8(1.875f * 128), 0x77); /* 240 */
    CU_ASSERT_EQUAL(kv_f32_to_fp8(248.0f), 0x78);       /* tie 240 | 256: even = 256 */

    CU_ASSERT_EQUAL(kv_fp8_to_f32(0x38), 1.0f);
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0xc0), -2.0f);
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0x7e), 448.0f);
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0xfe), -448.0f);
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0x01), 0x1p-9f);
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0x07), 7 * 0x1p-9f);
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0x08), 0x1p-6f);
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0x78), 256.0f);
    CU_ASSERT_EQUAL(bits(kv_fp8_to_f32(0x80)), 0x80000000u);
    CU_ASSERT(isnan(kv_fp8_to_f32(0x7f)));
    CU_ASSERT(isnan(kv_fp8_to_f32(0xff)));
    /* Exponent 15 is an ordinary binade apart from its NaN code. */
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0x78), 256.0f);
    CU_ASSERT_EQUAL(kv_fp8_to_f32(0x79), 288.0f);
}

/* Every code decodes to a value that encodes back to the same code; the
 * values are strictly increasing; every midpoint between neighbours rounds to
 * the even code and the floats either side round to the nearer one. */
static void check_codes(const char *name, int n_pos, float (*dec)(uint32_t), uint32_t (*enc)(float))
{
    int bad = 0;
    for (int v = 0; v < n_pos; v++) {
        float x = dec((uint32_t)v);
        if (enc(x) != (uint32_t)v) {
            bad++;
        }
        if (v + 1 < n_pos) {
            float y = dec((uint32_t)v + 1);
            float mid = x + (y - x) / 2; /* exact: the formats are narrower than f32 */
            uint32_t even = (v & 1) ? (uint32_t)v + 1 : (uint32_t)v;
            if (!(x < y) || enc(mid) != even || enc(nextafterf(mid, 0.0f)) != (uint32_t)v ||
                enc(nextafterf(mid, INFINITY)) != (uint32_t)v + 1) {
                if (bad < 5) {
                    printf("\n  %s: codes %#x/%#x mid %a\n", name, v, v + 1, mid);
                }
                bad++;
            }
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static float dec_f16(uint32_t v)
{
    return kv_f16_to_f32((uint16_t)v);
}
static uint32_t enc_f16(float f)
{
    return kv_f32_to_f16(f);
}
static float dec_bf16(uint32_t v)
{
    return kv_bf16_to_f32((uint16_t)v);
}
static uint32_t enc_bf16(float f)
{
    return kv_f32_to_bf16(f);
}
static float dec_fp8(uint32_t v)
{
    return kv_fp8_to_f32((uint8_t)v);
}
static uint32_t enc_fp8(float f)
{
    return kv_f32_to_fp8(f);
}

static void test_all_codes(void)
{
    check_codes("f16", 0x7c00, dec_f16, enc_f16);    /* +0 .. 65504 */
    check_codes("bf16", 0x7f80, dec_bf16, enc_bf16); /* +0 .. bf16 max */
    check_codes("fp8", 0x7f, dec_fp8, enc_fp8);      /* +0 .. 448 */
    /* Negative codes mirror positive ones. */
    for (int v = 0; v < 0x7f; v++) {
        CU_ASSERT_EQUAL(kv_fp8_to_f32((uint8_t)(v | 0x80)), -kv_fp8_to_f32((uint8_t)v));
    }
    for (uint32_t v = 0; v < 0x7c00; v += 7) {
        CU_ASSERT_EQUAL(kv_f16_to_f32((uint16_t)(v | 0x8000)), -kv_f16_to_f32((uint16_t)v));
    }
}

/* Relative round-trip error over normals in range; absolute below. */
static void sweep(enum kv_dtype dt, float lo_normal, float hi, float rel_bound, float abs_bound)
{
    double worst_rel = 0, worst_abs = 0;
    float x;
    for (int i = 0; i < 400000; i++) {
        /* Uniform in log2 over [2^-30, hi], random mantissa and sign. */
        float e = -30.0f + (log2f(hi) + 30.0f) * (float)(rng32() >> 8) / 16777216.0f;
        x = exp2f(e);
        if (x > hi) {
            x = hi;
        }
        if (rng32() & 1) {
            x = -x;
        }
        uint8_t buf[4];
        float back;
        kv_quantize(dt, buf, &x, 1);
        kv_dequantize(dt, &back, buf, 1);
        double err = fabs((double)back - (double)x);
        if (fabsf(x) >= lo_normal) {
            double rel = err / fabs((double)x);
            if (rel > worst_rel) {
                worst_rel = rel;
            }
        } else if (err > worst_abs) {
            worst_abs = err;
        }
    }
    CU_ASSERT(worst_rel <= rel_bound);
    CU_ASSERT(worst_abs <= abs_bound);
    if (rel_bound > 0) {
        CU_ASSERT(worst_rel > rel_bound / 4); /* the sweep really probes the bound */
    }
    if (worst_rel > rel_bound || worst_abs > abs_bound) {
        printf("\n  %s: worst rel %g (bound %g), worst abs %g (bound %g)\n", kv_dtype_name(dt),
               worst_rel, (double)rel_bound, worst_abs, (double)abs_bound);
    }
}

static void test_round_trip(void)
{
    sweep(KV_DTYPE_F32, 0x1p-126f, 1e30f, 0.0f, 0.0f);
    sweep(KV_DTYPE_F16, 0x1p-14f, 65504.0f, 0x1p-11f, 0x1p-25f);
    sweep(KV_DTYPE_BF16, 0x1p-126f, 1e30f, 0x1p-8f, 0.0f);
    sweep(KV_DTYPE_FP8, 0x1p-6f, 448.0f, 0x1p-4f, 0x1p-10f);
}

/* The bulk routines agree bit for bit with the scalar ones. */
static void test_bulk(void)
{
    enum { N = 1027 };
    static float src[N], back[N];
    static uint8_t q[N * 4];
    uint16_t h16;
    for (int i = 0; i < N; i++) {
        src[i] = from_bits(rng32());
        if (i % 3 == 0) {
            src[i] = (float)((int)(rng32() % 2001) - 1000) / 37.0f;
        }
    }
    src[0] = NAN;
    src[1] = INFINITY;
    src[2] = -0.0f;
    for (int d = 0; d < KV_DTYPE_COUNT; d++) {
        enum kv_dtype dt = (enum kv_dtype)d;
        int bad = 0;
        kv_quantize(dt, q, src, N);
        kv_dequantize(dt, back, q, N);
        for (int i = 0; i < N; i++) {
            uint32_t code;
            float ref;
            switch (dt) {
            case KV_DTYPE_F32:
                code = bits(src[i]);
                ref = src[i];
                bad += memcmp(q + 4 * i, &code, 4) != 0;
                break;
            case KV_DTYPE_F16:
                code = kv_f32_to_f16(src[i]);
                ref = kv_f16_to_f32((uint16_t)code);
                memcpy(&h16, q + 2 * i, 2);
                bad += h16 != code;
                break;
            case KV_DTYPE_BF16:
                code = kv_f32_to_bf16(src[i]);
                ref = kv_bf16_to_f32((uint16_t)code);
                memcpy(&h16, q + 2 * i, 2);
                bad += h16 != code;
                break;
            default:
                code = kv_f32_to_fp8(src[i]);
                ref = kv_fp8_to_f32((uint8_t)code);
                bad += q[i] != code;
                break;
            }
            bad += !(bits(back[i]) == bits(ref) || (isnan(back[i]) && isnan(ref)));
        }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT(isnan(back[0]));
    }
    CU_ASSERT_EQUAL(q[0], 0x7f); /* fp8 pass ran last: NaN is 0x7f */
    CU_ASSERT_EQUAL(q[1], 0x7e); /* inf saturates */
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("kv_dtype", NULL, NULL);
    CU_add_test(s, "names", test_names);
    CU_add_test(s, "f16_exact", test_f16_exact);
    CU_add_test(s, "bf16_exact", test_bf16_exact);
    CU_add_test(s, "fp8_exact", test_fp8_exact);
    CU_add_test(s, "all_codes", test_all_codes);
    CU_add_test(s, "round_trip", test_round_trip);
    CU_add_test(s, "bulk", test_bulk);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
