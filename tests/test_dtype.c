/*
 * Element types: sizes, names and parsing; the bf16 and fp16 conversions. Every 16-bit pattern
 * goes to fp32 and back unchanged (NaNs stay NaNs of the same sign, quiet); every midpoint between
 * two neighbouring 16-bit values rounds to the even one, and one fp32 ulp either side of it to the
 * nearer; overflow, subnormals, signed zeros; named cases that truncation would fail.
 */
#include <string.h>

#include "llm3d/core.h"
#include "test.h"

static int bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }
static int f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

static void test_table(void) {
    static const struct {
        enum l3d_dtype t;
        const char *name;
        size_t size;
    } want[] = {{L3D_F32, "fp32", 4}, {L3D_F64, "fp64", 8},  {L3D_I32, "int32", 4},
                {L3D_U8, "uint8", 1}, {L3D_BF16, "bf16", 2}, {L3D_F16, "fp16", 2},
                {L3D_I64, "int64", 8}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        CHECK((int)want[k].t == (int)k); /* the order of the enum is part of the interface */
        CHECK(l3d_dtype_size(want[k].t) == want[k].size);
        CHECK(strcmp(l3d_dtype_name(want[k].t), want[k].name) == 0);
        enum l3d_dtype t = L3D_U8;
        CHECK(l3d_dtype_parse(want[k].name, &t) == L3D_OK && t == want[k].t);
    }
    enum l3d_dtype t = L3D_F32;
    CHECK(l3d_dtype_parse("float16", &t) == L3D_ERR_ARG && t == L3D_F32);
    CHECK(strstr(l3d_error_message(), "'float16'") && strstr(l3d_error_message(), "bf16"));
    CHECK(l3d_dtype_parse("", &t) == L3D_ERR_ARG);
    CHECK(l3d_dtype_parse("FP32", &t) == L3D_ERR_ARG);
}

/* All 65536 patterns through fp32 and back. */
static void test_round_trip(void) {
    int bad_bf = 0, bad_f16 = 0, nan_bf = 0, nan_f16 = 0;
    for (uint32_t k = 0; k < 65536; k++) {
        uint16_t h = (uint16_t)k;
        float b = l3d_bf16_to_f32(h), f = l3d_f16_to_f32(h);
        if (bf16_is_nan(h)) {
            uint16_t back = l3d_f32_to_bf16(b);
            nan_bf++;
            bad_bf += !(b != b) || !bf16_is_nan(back) || (back & 0x8000) != (h & 0x8000) ||
                      !(back & 0x40);
        } else {
            bad_bf += l3d_f32_to_bf16(b) != h || l3d_f32_bits(b) != (uint32_t)h << 16;
        }
        if (f16_is_nan(h)) {
            uint16_t back = l3d_f32_to_f16(f);
            nan_f16++;
            bad_f16 += !(f != f) || !f16_is_nan(back) || (back & 0x8000) != (h & 0x8000) ||
                       !(back & 0x200);
            bad_f16 += (h & 0x200) && back != h; /* a quiet NaN keeps its payload */
        } else {
            bad_f16 += l3d_f32_to_f16(f) != h;
        }
    }
    CHECK(bad_bf == 0);
    CHECK(bad_f16 == 0);
    CHECK(nan_bf == 2 * 127 && nan_f16 == 2 * 1023);
    /* fp16 values, by their definition: (-1)^s 2^(e-15) (1 + m/1024), subnormal m 2^-24 */
    int bad_val = 0;
    for (uint32_t k = 0; k < 0x7c00; k++) {
        uint32_t e = k >> 10, m = k & 0x3ff;
        double v = e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp((double)m, -24);
        bad_val += (double)l3d_f16_to_f32((uint16_t)k) != v;
        bad_val += (double)l3d_f16_to_f32((uint16_t)(k | 0x8000)) != -v;
    }
    CHECK(bad_val == 0);
    CHECK(l3d_f32_bits(l3d_f16_to_f32(0x8000)) == 0x80000000u); /* -0 */
}

/* Between every two neighbouring finite values of the same sign: the midpoint (exact in fp32)
 * rounds to the one with the even pattern, one fp32 ulp below it to the lower, above to the
 * upper. Run over both signs; the pair (max finite, Inf) included, as the overflow threshold. */
static void test_midpoints(void) {
    int bad_bf = 0, bad_f16 = 0;
    for (uint32_t sgn = 0; sgn <= 0x8000; sgn += 0x8000) {
        for (uint32_t k = 0; k < 0x7f80; k++) {
            uint16_t lo = (uint16_t)(sgn | k), hi = (uint16_t)(sgn | (k + 1));
            uint32_t mid = ((uint32_t)lo << 16) | 0x8000u;
            uint16_t even = (lo & 1) ? hi : lo;
            bad_bf += l3d_f32_to_bf16(l3d_f32_from_bits(mid)) != even;
            bad_bf += l3d_f32_to_bf16(l3d_f32_from_bits(mid - 1)) != lo;
            bad_bf += l3d_f32_to_bf16(l3d_f32_from_bits(mid + 1)) != hi;
        }
        for (uint32_t k = 0; k < 0x7c00; k++) {
            uint16_t lo = (uint16_t)(sgn | k), hi = (uint16_t)(sgn | (k + 1));
            float a = l3d_f16_to_f32(lo);
            /* hi is Inf for the last k: the midpoint is where the next binade would start */
            float b = k + 1 == 0x7c00 ? (sgn ? -65536.0f : 65536.0f) : l3d_f16_to_f32(hi);
            float mid = (a + b) * 0.5f; /* exact: fp16 has 11 bits, fp32 24 */
            uint16_t even = (lo & 1) ? hi : lo;
            bad_f16 += l3d_f32_to_f16(mid) != even;
            bad_f16 += l3d_f32_to_f16(l3d_f32_from_bits(l3d_f32_bits(mid) - 1)) != lo;
            bad_f16 += l3d_f32_to_f16(l3d_f32_from_bits(l3d_f32_bits(mid) + 1)) != hi;
        }
    }
    CHECK(bad_bf == 0);
    CHECK(bad_f16 == 0);
}

/* Named cases: each fails under truncation (or rounding half up, or a wrong threshold). */
static void test_named(void) {
    /* rounds, not truncates: 1 + 3/4 ulp -> 1 + ulp (truncation: 1) */
    CHECK(l3d_f32_to_bf16(1.0f + 0x1.8p-8f) == 0x3f81);
    CHECK(l3d_f32_to_f16(1.0f + 0x1.8p-11f) == 0x3c01);
    CHECK(l3d_f32_to_bf16(-1.0f - 0x1.8p-8f) == 0xbf81);
    /* ties to even: 1 + ulp/2 -> 1; (1 + ulp) + ulp/2 -> 1 + 2 ulp (half up would give 0x3f81) */
    CHECK(l3d_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);
    CHECK(l3d_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82);
    CHECK(l3d_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);
    CHECK(l3d_f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f) == 0x3c02);
    CHECK(l3d_f32_to_f16(2049.0f) == 0x6800); /* 2048 */
    CHECK(l3d_f32_to_f16(2051.0f) == 0x6802); /* 2052 */
    /* overflow: 65504 is the largest fp16; 65519.99 rounds to it, 65520 to Inf */
    CHECK(l3d_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(l3d_f32_to_f16(65519.996f) == 0x7bff);
    CHECK(l3d_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(l3d_f32_to_f16(-1e6f) == 0xfc00);
    CHECK(l3d_f32_to_f16(l3d_f32_from_bits(0x7f800000u)) == 0x7c00);
    CHECK(l3d_f32_to_bf16(l3d_f32_from_bits(0x7f7fffffu)) == 0x7f80); /* FLT_MAX -> Inf */
    CHECK(l3d_f32_to_bf16(l3d_f32_from_bits(0x7f7f7fffu)) == 0x7f7f); /* just below the midpoint */
    CHECK(l3d_f32_to_bf16(l3d_f32_from_bits(0xff800000u)) == 0xff80);
    /* subnormals: 2^-24 is the smallest fp16, 2^-25 (a tie) goes to 0, just above it to 2^-24 */
    CHECK(l3d_f32_to_f16(0x1p-24f) == 0x0001);
    CHECK(l3d_f32_to_f16(0x1p-25f) == 0x0000);
    CHECK(l3d_f32_to_f16(0x1.000002p-25f) == 0x0001);
    CHECK(l3d_f32_to_f16(0x1.8p-24f) == 0x0002);       /* 1.5 -> 2 (even) */
    CHECK(l3d_f32_to_f16(0x1.4p-23f) == 0x0002);       /* 2.5 -> 2 (even) */
    CHECK(l3d_f32_to_f16(0x1.ff8p-15f) == 0x03ff);     /* largest subnormal */
    CHECK(l3d_f32_to_f16(0x1.ffcp-15f) == 0x0400);     /* its midpoint to 2^-14 rounds up */
    CHECK(l3d_f32_to_f16(0x1p-14f) == 0x0400);         /* smallest normal */
    CHECK(l3d_f32_to_f16(-0x1p-24f) == 0x8001);
    CHECK(l3d_f32_to_f16(-1e-30f) == 0x8000);          /* underflow keeps the sign */
    /* fp32 subnormals: bf16 has them */
    CHECK(l3d_f32_to_bf16(l3d_f32_from_bits(0x00000001u)) == 0x0000);
    CHECK(l3d_f32_to_bf16(l3d_f32_from_bits(0x00018000u)) == 0x0002);
    CHECK(l3d_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(l3d_f16_to_f32(0x03ff) == 0x1.ff8p-15f);
    /* NaN: quiet, sign kept; a signalling NaN whose payload is all in the low bits stays NaN */
    CHECK(l3d_f32_to_bf16(l3d_f32_from_bits(0x7f800001u)) == 0x7fc0);
    CHECK(l3d_f32_to_bf16(l3d_f32_from_bits(0xffc00000u)) == 0xffc0);
    CHECK(l3d_f32_to_bf16(l3d_f32_from_bits(0x7fffffffu)) == 0x7fff); /* no carry into the sign */
    CHECK(l3d_f32_to_f16(l3d_f32_from_bits(0x7f800001u)) == 0x7e00);
    CHECK(l3d_f32_to_f16(l3d_f32_from_bits(0xffc00000u)) == 0xfe00);
}

/* The negative check: a truncating conversion fails the first named case above, so that case
 * does tell rounding from truncation. */
static uint16_t bf16_truncate(float f) { return (uint16_t)(l3d_f32_bits(f) >> 16); }

static void test_truncation_is_caught(void) {
    CHECK(bf16_truncate(1.0f + 0x1.8p-8f) != 0x3f81);
    CHECK(bf16_truncate(1.0f + 0x1.8p-8f) != l3d_f32_to_bf16(1.0f + 0x1.8p-8f));
}

#if defined(__FLT16_MAX__)
/* The compiler's _Float16 conversion (IEEE, nearest even) as an oracle over a stride of all fp32
 * patterns: about 2 million values, every exponent. */
static void test_against_float16(void) {
    int bad = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 2039) {
        float f = l3d_f32_from_bits((uint32_t)u);
        if (f != f) continue;
        _Float16 x = (_Float16)f;
        uint16_t want;
        memcpy(&want, &x, sizeof want);
        bad += l3d_f32_to_f16(f) != want;
        bad += l3d_f16_to_f32(want) != (float)x;
    }
    CHECK(bad == 0);
}
#endif

int main(void) {
    test_table();
    test_round_trip();
    test_midpoints();
    test_named();
    test_truncation_is_caught();
#if defined(__FLT16_MAX__)
    test_against_float16();
#endif
    return TEST_REPORT();
}
