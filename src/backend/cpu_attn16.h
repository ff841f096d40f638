/* The CPU backend's shared inline math and its bf16 dot-product attention (cpu_attn16.c): the
 * flash kernels of cpu.c with their products in AVX512-BF16 dot products (vdpbf16ps), fp32
 * accumulation, where the CPU has them. Only src/backend/cpu*.c include this file. */
#ifndef LLM3D_CPU_ATTN16_H
#define LLM3D_CPU_ATTN16_H

#include <stdbool.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include "llm3d/core.h"

/* the flash kernels' blocks: query rows x keys (cpu.c's attention section says why 64) */
#define L3D_FA_BQ 64
#define L3D_FA_BK 64

/* Element i of a buffer of type t (fp32, bf16, fp16) read as fp32 (exact), or written from fp32
 * rounded to nearest even (bf16 as l3d_bf16_narrow, NaN kept quiet). */
static inline float l3d_cpu_ld(enum l3d_dtype t, const void *p, int64_t i) {
    if (t == L3D_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == L3D_BF16 ? l3d_bf16_widen(h) : l3d_f16_to_f32(h);
}
static inline void l3d_cpu_st(enum l3d_dtype t, void *p, int64_t i, float v) {
    if (t == L3D_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = t == L3D_BF16 ? l3d_bf16_narrow(v) : l3d_f32_to_f16(v);
}

/* 2^n from t = 1.5 * 2^23 + n (n an integer in [-127, 127]; -127 gives 0): t's encoding is
 * 0x4b400000 + n. Unsigned, so that a NaN t (the caller's result then NaN) is no undefined
 * behaviour: (int32_t)NaN and a left shift of a negative int are (UBSan stopped on both). */
static inline float l3d_pow2_shifted(float t) {
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    uint32_t bits = (tb - 0x4b400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return scale;
}

/* exp(x) with only arithmetic and bit operations, so loops calling it vectorise (glibc's expf
 * does not without -ffast-math). Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then the
 * degree-6 Taylor polynomial of e^r (truncation error < 1.3e-7 relative), times 2^n. */
static inline float fast_expf(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + shifter;
    float n = t - shifter;
    float r = x - n * 0.693145751953125f;  /* ln2 high part, exact in float */
    r = r - n * 1.428606765330187e-06f;    /* ln2 low part */
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * l3d_pow2_shifted(t);
}

/* bf16 attention's probabilities (cpu_attnd.c, and cpu.c's flash kernels wherever they take its
 * numerics: the ring's blocks, the KV cache). With t = s log2(e) of a scaled score s and m an
 * integer offset (the row's ceil(max t) or, in an online softmax, the running one), p = 2^(t - m)
 * is formed as 2^f 2^(n - m), n = round(t) and f = t - n both exact: bf16(p) = bf16(2^f) 2^(n - m)
 * for EVERY integer m (a power-of-two scale commutes with rounding), so a block of keys that sees
 * only part of a row, or a row whose running max grows, rounds each (query, key) probability to
 * the same bf16 value as the whole row does; only the fp32 sums differ in order. 0 below 2^-126
 * relative to the offset (where a normal number would end). */
#define L3D_LOG2E 1.44269504088896341f
#define L3D_LN2 0.693147180559945309f
static inline float l3d_attn_p(float t, float m) {
    /* n the integer nearest t (adding 1.5 * 2^23 rounds, for |t| < 2^22), f = t - n exact
     * (Sterbenz: n and t within a factor 2 when n != 0); truncf would not vectorise here */
    float n = (t + 12582912.0f) - 12582912.0f, f = t - n;
    float e = fast_expf(f * L3D_LN2); /* 2^f in [2^-1/2, 2^1/2] */
    float k = n - m;
    k = k < -127.0f ? -127.0f : (k > 127.0f ? 127.0f : k); /* -127: the encoding of zero */
    return e * l3d_pow2_shifted(k + 12582912.0f);
}
/* p rounded to bf16 (and read back as fp32) */
static inline float l3d_attn_p16(float p) { return l3d_bf16_widen(l3d_bf16_narrow(p)); }
/* the integer offset of a row whose scaled scores' max is mx: ceil(mx log2(e)) (x log2(e) is
 * monotone in x, so the max of the t's is the t of the max) */
static inline float l3d_attn_m(float mx) { return ceilf(mx * L3D_LOG2E); }

/* One row's online softmax over a block of scores s (valid of nk visible): s becomes the
 * unnormalised probabilities (zero past valid), the running max m and sum l advance; returns the
 * factor the row's output is rescaled by. Both flash forwards' (cpu.c, cpu_attn16.c). */
static inline float l3d_fa_online_row(float *s, int64_t valid, int64_t nk, float *m, float *l) {
    float mx = *m;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < valid; j++) mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; j++) {
        s[j] = fast_expf(s[j] - mx);
        sum += s[j];
    }
    for (int64_t j = valid < 0 ? 0 : valid; j < nk; j++) s[j] = 0.0f;
    float corr = fast_expf(*m - mx); /* 0 on the first block: m = -inf */
    *l = *l * corr + sum;
    *m = mx;
    return corr;
}

/* l3d_fa_online_row on bf16 attention's numerics (cpu_attnd.c, l3d_attn_p): the running offset
 * m an integer (log2 units), s becomes 2^(s log2 e - m) rounded to bf16 (the value the full
 * row's path rounds it to, whatever m), l sums them unrounded; the rescale 2^(m_old - m) is exact;
 * the row's log-sum-exp is then m ln 2 + log(l). cpu.c's flash forward on those numerics and the
 * dot-product forward (cpu_attn16.c) share it. */
static inline float l3d_fa_online_row16(float *s, int64_t valid, int64_t nk, float *m,
                                        float *l) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < valid; j++) mx = s[j] > mx ? s[j] : mx;
    float mn = l3d_attn_m(mx) > *m ? l3d_attn_m(mx) : *m, sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; j++) {
        float p = l3d_attn_p(s[j] * L3D_LOG2E, mn);
        sum += p;
        s[j] = l3d_attn_p16(p);
    }
    for (int64_t j = valid < 0 ? 0 : valid; j < nk; j++) s[j] = 0.0f;
    float corr = *m == -INFINITY ? 0.0f : l3d_attn_p(*m, mn); /* 2^(m_old - m), exact */
    *l = *l * corr + sum;
    *m = mn;
    return corr;
}

/* Whether the bf16 attention kernels run their products in bf16 dot products: dt bf16, HS even
 * (the products take element pairs), a CPU with AVX512-BF16 (checked at run time: the fallback is
 * cpu.c's fp32 path, which widens the operands) and L3D_ATTN_DOT "1", or unset on a CPU where
 * l3d_fa16_default says so; "0" is the tests' switch to the fallback on such a CPU. */
bool l3d_fa16_on(enum l3d_dtype dt, int64_t HS);
/* Without L3D_ATTN_DOT: whether the dot products run where the CPU has them, by the CPU's maker,
 * never by a timing (two runs of one job would take different paths and differ in their bits).
 * On: AMD's (measured on a Zen 5 VM: vdpbf16ps at twice the FMA's FLOP/s, the attention 1.6x
 * faster than the widened path, a GPT-2 bf16 step 4-9% shorter, 2026-12-07). Off: Intel's (an
 * AMX Xeon VM measured vdpbf16ps at half the FMA's FLOP/s, 104-108 against 197-217 GFLOP/s a
 * thread, 2026-12-07, and the widened path faster there) and the others, not measured
 * (docs/BENCHMARKS.md). */
bool l3d_fa16_default(void);

/* fp32 scratch floats per thread of l3d_fa16_forward_block (with HS even) */
int64_t l3d_fa16_forward_floats(int64_t HS);
/* cpu.c's fa_forward_block_n on bf16 tensors: query rows i = 0..nq-1 at positions p0 + i over
 * keys 0..min(p0 + i, nkv - 1); q (stride qs), k and v (stride ks), out (stride os) bf16, lse (nq)
 * fp32 or NULL; w: l3d_fa16_forward_floats(HS) floats. Scores and the output accumulate in fp32;
 * the probabilities are rounded to bf16 for the product with V on bf16 attention's numerics
 * (l3d_fa_online_row16: each rounds to the value the whole row's softmax rounds it to, so that
 * the ring's blocks, cpu.c's widened kernels on those numerics and the KV cache agree with it up
 * to the order of fp32 sums); out is rounded once. */
void l3d_fa16_forward_block(uint16_t *out, int64_t os, float *lse, const uint16_t *q, int64_t qs,
                            const uint16_t *k, const uint16_t *v, int64_t ks, int64_t p0,
                            int64_t nq, int64_t nkv, int64_t HS, float *w);

/* One key/value head and the rep query heads it serves, bf16 (cpu.c's struct fa_span): query
 * head r at q + r hq, dq + r hq, dO + r ho, O + r ho, L + r hl; rows of nq queries at positions
 * p0 + i over nk keys. */
struct l3d_fa16_span {
    uint16_t *dq, *dk, *dv;
    const uint16_t *q, *k, *v, *dO, *O;
    const float *L;
    int64_t gqs, gks, qs, ks, os; /* rows: dq; dk and dv; q; k and v; dO and O */
    int64_t hq, ho, hl;
    int64_t rep, p0, nq, nk, HS;
};
/* fp32 scratch floats per thread of l3d_fa16_backward_span */
int64_t l3d_fa16_backward_floats(int64_t rep, int64_t nq, int64_t nk, int64_t HS);
/* dq, dk, dv += the span's gradients (cpu.c's fa_backward_span), accumulated in fp32 scratch w
 * (widened from the bf16 gradients first, rounded back once at the end); P and dS rounded to bf16
 * for their products. */
void l3d_fa16_backward_span(const struct l3d_fa16_span *a, float *w);

#endif
