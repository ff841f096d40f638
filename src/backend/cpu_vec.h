/* The explicit-SIMD building blocks of the CPU backend's element-wise and cross-entropy rows
 * (cpu_ew.c, cpu_xent.c): fast_expf's exp (Cody-Waite reduction, degree-6 polynomial, in fused
 * multiply-adds) as a scalar reference s_exp and as 16- and 8-lane vectors v16_exp / v8_exp that
 * give its bits lane by lane; loads that widen fp32, bf16 or fp16 exactly and stores that round
 * once to nearest even (the bits of l3d_bf16_narrow / l3d_f32_to_f16). Only src/backend/cpu*.c
 * include this file. */
#ifndef LLM3D_CPU_VEC_H
#define LLM3D_CPU_VEC_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "llm3d/core.h"

#define EXP_LO -87.0f
#define EXP_HI 88.0f
#define LOG2E 1.44269504088896341f
#define SHIFTER 12582912.0f        /* 1.5 * 2^23: adding it rounds to an integer */
#define LN2_HI 0.693145751953125f  /* exact in float */
#define LN2_LO 1.428606765330187e-06f
/* the paths' instruction sets: AVX-512 with its 16-bit loads and stores (BW, VL); AVX2 with FMA
 * and F16C (every AVX2 CPU has F16C) */
#define T512 "avx512f,avx512bw,avx512vl"
#define T256 "avx2,fma,f16c"

static inline float s_max(float c, float v) { return c > v ? c : v; } /* maxps(c, v) */
static inline float s_min(float c, float v) { return c < v ? c : v; } /* minps(c, v) */

static inline float s_exp(float a) {
    a = s_min(EXP_HI, s_max(EXP_LO, a));
    float t = fmaf(a, LOG2E, SHIFTER);
    float nn = t - SHIFTER;
    float r = fmaf(nn, -LN2_HI, a);
    r = fmaf(nn, -LN2_LO, r);
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t tb; /* unsigned: a NaN's bits are no undefined behaviour (fast_expf says why) */
    memcpy(&tb, &t, sizeof tb);
    uint32_t bits = (tb - 0x4b400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* One definition for both widths: W the lanes (16, 8), ATTR its target, V the float vector, P
 * the intrinsics' prefix (_mm512, _mm256), SI the integer vector's name (si512, si256). */
#define DEF_VEXP(W, ATTR, V, P, SI)                                                              \
    __attribute__((target(ATTR))) static inline V v##W##_exp(V a) {                             \
        a = P##_min_ps(P##_set1_ps(EXP_HI), P##_max_ps(P##_set1_ps(EXP_LO), a));               \
        V t = P##_fmadd_ps(a, P##_set1_ps(LOG2E), P##_set1_ps(SHIFTER));                       \
        V nn = P##_sub_ps(t, P##_set1_ps(SHIFTER));                                             \
        V r = P##_fmadd_ps(nn, P##_set1_ps(-LN2_HI), a);                                        \
        r = P##_fmadd_ps(nn, P##_set1_ps(-LN2_LO), r);                                          \
        V p = P##_set1_ps(1.0f / 720.0f);                                                       \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.0f / 120.0f));                                     \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.0f / 24.0f));                                      \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.0f / 6.0f));                                       \
        p = P##_fmadd_ps(p, r, P##_set1_ps(0.5f));                                              \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.0f));                                              \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.0f));                                              \
        return P##_mul_ps(p, P##_cast##SI##_ps(P##_slli_epi32(                                  \
                                 P##_add_epi32(P##_castps_##SI(t),                              \
                                               P##_set1_epi32((int)(127u - 0x4b400000u))),      \
                                 23)));                                                         \
    }

DEF_VEXP(16, T512, __m512, _mm512, si512)
DEF_VEXP(8, T256, __m256, _mm256, si256)

/* 16 elements of type t at p + i (masked: the others read as 0), widened exactly */
__attribute__((target(T512))) static inline __m512 v16_ld(enum l3d_dtype t, const void *p,
                                                          int64_t i, __mmask16 m) {
    if (t == L3D_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (t == L3D_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* stored rounded to nearest even: fp16 by vcvtps2ph, bf16 as l3d_bf16_narrow (NaN kept quiet) */
__attribute__((target(T512))) static inline void v16_st(enum l3d_dtype t, void *p, int64_t i,
                                                        __mmask16 m, __m512 v) {
    if (t == L3D_F32) {
        _mm512_mask_storeu_ps((float *)p + i, m, v);
        return;
    }
    __m256i h;
    if (t == L3D_F16) {
        h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
        __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                     _mm512_and_si512(hi, _mm512_set1_epi32(1)));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
        h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(
            nan, _mm512_srli_epi32(r, 16), _mm512_or_si512(hi, _mm512_set1_epi32(0x40))));
    }
    _mm256_mask_storeu_epi16((uint16_t *)p + i, m, h);
}

__attribute__((target(T256))) static inline __m256 v8_ld(enum l3d_dtype t, const void *p) {
    if (t == L3D_F32) return _mm256_loadu_ps(p);
    __m128i h = _mm_loadu_si128(p);
    if (t == L3D_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* as v16_st: the bits of l3d_bf16_narrow, of vcvtps2ph */
__attribute__((target(T256))) static inline void v8_st(enum l3d_dtype t, void *p, __m256 v) {
    if (t == L3D_F32) {
        _mm256_storeu_ps(p, v);
        return;
    }
    if (t == L3D_F16) {
        _mm_storeu_si128(p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        return;
    }
    __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                                   _mm256_and_si256(hi, _mm256_set1_epi32(1))),
                                  16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000)); /* both sides positive */
    __m256i b = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    /* 8 values below 2^16 to 16 bits: packus packs within 128-bit lanes; the permute joins them */
    __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08);
    _mm_storeu_si128(p, _mm256_castsi256_si128(pk));
}

#endif
