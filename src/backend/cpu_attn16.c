/* bf16 flash attention in AVX512-BF16 dot products (src/backend/cpu_attn16.h).
 *
 * cpu.c's flash kernels widen 16-bit tensors into fp32 and multiply in fp32 (sgemm on 64 x 64
 * blocks). Here the same blocks, in the same order, multiply bf16 operands with vdpbf16ps: each
 * fp32 lane adds the products of one pair of bf16 elements, exact products summed in fp32, at
 * twice the FMA's FLOPs an instruction. One product kernel, dot_gemm: C (M x N, fp32) = alpha A B
 * (+ C), A bf16 rows read in place, B packed in pairs along the sum (pair p of column n: B's rows
 * 2p and 2p+1 in one 32-bit word, the layout vdpbf16ps takes), a tile of 4 rows x 64 columns in
 * 16 accumulators. The keys and values of a block are packed once per block and serve every
 * query block and every query head of their group (grouped-query attention repeats nothing).
 * Scores, softmax, the output and the gradients accumulate in fp32; what feeds a product is bf16:
 * the probabilities P before P V and P^T dO, dS before dS K and dS^T Q (FlashAttention-2 rounds
 * the same operands on GPUs). Each output is rounded to bf16 once.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu_attn16.h"

typedef uint16_t bf16;

bool l3d_fa16_on(enum l3d_dtype dt, int64_t HS) {
    if (dt != L3D_BF16 || HS % 2 != 0) return false;
    const char *e = getenv("L3D_ATTN_DOT");
    bool want = e && *e ? strcmp(e, "0") != 0 : l3d_fa16_default();
    return want && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

bool l3d_fa16_default(void) {
    return __builtin_cpu_is("amd");
}

static inline uint32_t pair_at(const bf16 *p) {
    uint32_t x;
    memcpy(&x, p, sizeof x);
    return x;
}

#define T16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline __mmask16 tail16(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* C (M x N, row stride ldc) = alpha A B, plus C when acc. A: M rows of 2 K2 bf16 (stride lda);
 * Bp: K2 rows of N packed pairs (stride ldb; pack_t, pack_n). Rows past M read row M - 1 and are
 * not stored; columns past N are masked. */
T16 static void dot_gemm(int64_t M, int64_t N, int64_t K2, const bf16 *A, int64_t lda,
                         const uint32_t *Bp, int64_t ldb, float alpha, bool acc, float *C,
                         int64_t ldc) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
        __mmask16 mk[4];
        for (int v = 0; v < 4; v++) mk[v] = tail16(N - n0 - 16 * v);
        for (int64_t i0 = 0; i0 < M; i0 += 4) {
            const bf16 *ar[4];
            for (int r = 0; r < 4; r++) ar[r] = A + (i0 + r < M ? i0 + r : M - 1) * lda;
            __m512 c[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) c[r][v] = _mm512_setzero_ps();
            for (int64_t p = 0; p < K2; p++) {
                const uint32_t *b = Bp + p * ldb + n0;
                __m512bh bv[4];
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++)
                    bv[v] = (__m512bh)_mm512_maskz_loadu_epi32(mk[v], b + 16 * v);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    __m512bh a = (__m512bh)_mm512_set1_epi32((int)pair_at(ar[r] + 2 * p));
#pragma GCC unroll 4
                    for (int v = 0; v < 4; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, bv[v]);
                }
            }
            for (int r = 0; r < 4 && i0 + r < M; r++)
                for (int v = 0; v < 4; v++) {
                    if (!mk[v]) continue;
                    float *cp = C + (i0 + r) * ldc + n0 + 16 * v;
                    __m512 x = _mm512_mul_ps(c[r][v], va);
                    if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], cp));
                    _mm512_mask_storeu_ps(cp, mk[v], x);
                }
        }
    }
}

/* Bp (K2 rows of stride ldb) for B = X^T, X of N rows of 2 K2 bf16 (stride ldx, even): pair p
 * of column n is X[n][2p..2p+1]; 16 columns a gather. */
T16 static void pack_t(uint32_t *Bp, int64_t ldb, const bf16 *X, int64_t ldx, int64_t N,
                       int64_t K2) {
    if (ldx % 2) { /* pairs off 32-bit alignment: no gather */
        for (int64_t n = 0; n < N; n++)
            for (int64_t p = 0; p < K2; p++) Bp[p * ldb + n] = pair_at(X + n * ldx + 2 * p);
        return;
    }
    const __m512i step = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_mullo_epi32(step, _mm512_set1_epi32((int)(ldx / 2)));
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
        __mmask16 mk = tail16(N - n0);
        const int *base = (const int *)(X + n0 * ldx);
        for (int64_t p = 0; p < K2; p++) {
            __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mk, idx, base + p, 4);
            _mm512_mask_storeu_epi32(Bp + p * ldb + n0, mk, g);
        }
    }
}

/* Bp (stride ldb) for B = X, X of K rows of N bf16 (stride ldx): pair p of column n is X[2p][n]
 * (low half) and X[2p + 1][n], zero past row K - 1. */
T16 static void pack_n(uint32_t *Bp, int64_t ldb, const bf16 *X, int64_t ldx, int64_t K,
                       int64_t N) {
    for (int64_t p = 0; p < (K + 1) / 2; p++) {
        const bf16 *r0 = X + 2 * p * ldx, *r1 = X + (2 * p + 1) * ldx;
        bool two = 2 * p + 1 < K;
        for (int64_t n0 = 0; n0 < N; n0 += 16) {
            __mmask16 mk = tail16(N - n0);
            __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, r0 + n0));
            __m512i hi = two ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, r1 + n0))
                             : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(Bp + p * ldb + n0, mk,
                                     _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

/* n fp32 to bf16, round to nearest even (vcvtneps2bf16), zeros from n to n_pad */
T16 static void to_bf16(bf16 *d, const float *s, int64_t n, int64_t n_pad) {
    for (int64_t j = 0; j < n_pad; j += 16) {
        __mmask16 mk = tail16(n_pad - j), mv = tail16(n - j);
        __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mv, s + j));
        _mm256_mask_storeu_epi16(d + j, mk, (__m256i)h);
    }
}

int64_t l3d_fa16_forward_floats(int64_t HS) {
    /* S, O fp32; K and V packed (HS BK bf16 each); P bf16 */
    return L3D_FA_BQ * L3D_FA_BK + L3D_FA_BQ * HS + L3D_FA_BK * HS + L3D_FA_BQ * L3D_FA_BK / 2;
}

void l3d_fa16_forward_block(bf16 *out, int64_t os, float *lse, const bf16 *q, int64_t qs,
                            const bf16 *k, const bf16 *v, int64_t ks, int64_t p0, int64_t nq,
                            int64_t nkv, int64_t HS, float *w) {
    const float scale = 1.0f / sqrtf((float)HS);
    float *S = w, *O = S + L3D_FA_BQ * L3D_FA_BK;
    uint32_t *Kp = (uint32_t *)(O + L3D_FA_BQ * HS), *Vp = Kp + L3D_FA_BK * HS / 2;
    bf16 *Pb = (bf16 *)(Vp + L3D_FA_BK * HS / 2);
    float m[L3D_FA_BQ], l[L3D_FA_BQ];
    for (int64_t i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0.0f;
    memset(O, 0, (size_t)(nq * HS) * sizeof(float));
    const int64_t nkeys = p0 + nq < nkv ? p0 + nq : nkv;
    for (int64_t j0 = 0; j0 < nkeys; j0 += L3D_FA_BK) {
        int64_t nk = nkeys - j0 < L3D_FA_BK ? nkeys - j0 : L3D_FA_BK, nk2 = (nk + 1) / 2;
        pack_t(Kp, nk, k + j0 * ks, ks, nk, HS / 2);
        pack_n(Vp, HS, v + j0 * ks, ks, nk, HS);
        dot_gemm(nq, nk, HS / 2, q, qs, Kp, nk, scale, false, S, L3D_FA_BK);
        for (int64_t i = 0; i < nq; i++) {
            float *s = S + i * L3D_FA_BK, *o = O + i * HS;
            int64_t valid = p0 + i - j0 + 1; /* keys j0.. j0+valid-1 are visible to row i */
            float corr = l3d_fa_online_row16(s, valid > nk ? nk : valid, nk, &m[i], &l[i]);
            if (corr != 1.0f)
                for (int64_t d = 0; d < HS; d++) o[d] *= corr;
            to_bf16(Pb + i * L3D_FA_BK, s, nk, 2 * nk2);
        }
        dot_gemm(nq, HS, nk2, Pb, L3D_FA_BK, Vp, HS, 1.0f, true, O, HS);
    }
    for (int64_t i = 0; i < nq; i++) {
        float inv = 1.0f / l[i], *o = O + i * HS;
        for (int64_t d = 0; d < HS; d++) o[d] *= inv;
        to_bf16(out + i * os, o, HS, HS);
        if (lse) lse[i] = m[i] * L3D_LN2 + logf(l[i]);
    }
}

/* The backward span in transposed form, so that every product reads its A operand in place or
 * from rows the pass writes anyway: per (query block i, key block j) of head r,
 *   S^T = K_j Q_i^T, dP^T = V_j dO_i^T        (B: Q and dO packed once per span, pack_t)
 *   P^T = exp(S^T - L), dS^T = P^T (dP^T - D) / sqrt(HS), both rounded to bf16 rows
 *   dV_j += P^T dO_i, dK_j += dS^T Q_i        (B: Q and dO packed once per span, pack_n)
 *   dQ_i^T += K_j^T dS^T                      (A: K_j transposed once per key block)
 * dQ's new terms accumulate transposed (HS rows of nq) from zero and join its old value once at
 * the end, in row order. */
struct bwd_scratch {
    float *D, *dqT, *dk, *dv, *St, *dPt;
    uint32_t *Qt, *dOt, *Qn, *dOn, *dSn;
    bf16 *KT, *Pt, *dSt;
};

static int64_t even(int64_t n) { return n + (n & 1); }

int64_t l3d_fa16_backward_floats(int64_t rep, int64_t nq, int64_t nk, int64_t HS) {
    const int64_t blk = L3D_FA_BQ * L3D_FA_BK, nqe = even(nq);
    /* D, dq^T, dk, dv, S^T, dP^T; Q and dO packed twice (nq HS / 2 words each, rounded up);
     * dS packed; K^T, P^T, dS^T in bf16 */
    return rep * nq + rep * nq * HS + 2 * nk * HS + 2 * blk + 4 * rep * nqe * HS / 2 + blk / 2 +
           HS * L3D_FA_BK / 2 + blk + 64;
}

static struct bwd_scratch bwd_layout(const struct l3d_fa16_span *a, float *w) {
    const int64_t HS = a->HS, blk = L3D_FA_BQ * L3D_FA_BK, rq = a->rep * even(a->nq) * HS / 2;
    struct bwd_scratch s;
    s.D = w;
    s.dqT = s.D + a->rep * a->nq;
    s.dk = s.dqT + a->rep * a->nq * HS;
    s.dv = s.dk + a->nk * HS;
    s.St = s.dv + a->nk * HS;
    s.dPt = s.St + blk;
    s.Qt = (uint32_t *)(s.dPt + blk);
    s.dOt = s.Qt + rq;
    s.Qn = s.dOt + rq;
    s.dOn = s.Qn + rq;
    s.dSn = s.dOn + rq;
    s.KT = (bf16 *)(s.dSn + blk / 2);
    s.Pt = s.KT + HS * L3D_FA_BK;
    s.dSt = s.Pt + blk;
    return s;
}

/* D = rowsum(dO * O) of every query row of every head, and the packed Q and dO of every head:
 * transposed pairs (S^T, dP^T: columns nq, stride nq) and row pairs (dV, dK: stride HS) */
static void bwd_prepare(const struct l3d_fa16_span *a, struct bwd_scratch *s) {
    const int64_t HS = a->HS, nq = a->nq, rq = even(nq) * HS / 2;
    for (int64_t r = 0; r < a->rep; r++) {
        const bf16 *q = a->q + r * a->hq, *dO = a->dO + r * a->ho, *O = a->O + r * a->ho;
        for (int64_t i = 0; i < nq; i++) {
            const bf16 *o = O + i * a->os, *g = dO + i * a->os;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int64_t c = 0; c < HS; c++) d += l3d_bf16_widen(o[c]) * l3d_bf16_widen(g[c]);
            s->D[r * nq + i] = d;
        }
        pack_t(s->Qt + r * rq, nq, q, a->qs, nq, HS / 2);
        pack_t(s->dOt + r * rq, nq, dO, a->os, nq, HS / 2);
        pack_n(s->Qn + r * rq, HS, q, a->qs, nq, HS);
        pack_n(s->dOn + r * rq, HS, dO, a->os, nq, HS);
    }
}

/* P^T and dS^T of key rows j0.. (nk) against query columns i0.. (nq) of head r, from S^T and
 * dP^T, into bf16 rows of L3D_FA_BQ (the pad column zero); masked entries are zero */
static void bwd_probs(const struct l3d_fa16_span *a, struct bwd_scratch *s, int64_t r,
                      int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
    const float scale = 1.0f / sqrtf((float)a->HS);
    const float *L = a->L + r * a->hl + i0, *D = s->D + r * a->nq + i0;
    for (int64_t j = 0; j < nk; j++) {
        float *p = s->St + j * L3D_FA_BQ, *dp = s->dPt + j * L3D_FA_BQ;
        int64_t first = j0 + j - a->p0 - i0; /* the first query column that sees key j0 + j */
        first = first < 0 ? 0 : first > nq ? nq : first;
        for (int64_t i = 0; i < first; i++) p[i] = dp[i] = 0.0f;
#pragma omp simd
        for (int64_t i = first; i < nq; i++) {
            p[i] = fast_expf(p[i] - L[i]);
            dp[i] = p[i] * (dp[i] - D[i]) * scale;
        }
        to_bf16(s->Pt + j * L3D_FA_BQ, p, nq, even(nq));
        to_bf16(s->dSt + j * L3D_FA_BQ, dp, nq, even(nq));
    }
}

/* the six products of one (query block, key block) pair of head r (the header comment) */
static void bwd_pair(const struct l3d_fa16_span *a, struct bwd_scratch *s, int64_t r, int64_t i0,
                     int64_t nq, int64_t j0, int64_t nk) {
    const int64_t HS = a->HS, rq = even(a->nq) * HS / 2, nq2 = (nq + 1) / 2;
    const bf16 *kj = a->k + j0 * a->ks, *vj = a->v + j0 * a->ks;
    dot_gemm(nk, nq, HS / 2, kj, a->ks, s->Qt + r * rq + i0, a->nq, 1.0f / sqrtf((float)HS),
             false, s->St, L3D_FA_BQ);
    dot_gemm(nk, nq, HS / 2, vj, a->ks, s->dOt + r * rq + i0, a->nq, 1.0f, false, s->dPt,
             L3D_FA_BQ);
    bwd_probs(a, s, r, i0, nq, j0, nk);
    const uint32_t *dOn = s->dOn + r * rq + i0 / 2 * HS, *Qn = s->Qn + r * rq + i0 / 2 * HS;
    dot_gemm(nk, HS, nq2, s->Pt, L3D_FA_BQ, dOn, HS, 1.0f, true, s->dv + j0 * HS, HS);
    dot_gemm(nk, HS, nq2, s->dSt, L3D_FA_BQ, Qn, HS, 1.0f, true, s->dk + j0 * HS, HS);
    pack_n(s->dSn, nq, s->dSt, L3D_FA_BQ, nk, nq);
    dot_gemm(HS, nq, (nk + 1) / 2, s->KT, L3D_FA_BK, s->dSn, nq, 1.0f, true,
             s->dqT + r * a->nq * HS + i0, a->nq);
}

/* rows x HS bf16 (stride ls) <-> fp32 rows (stride HS) */
static void widen(float *d, const bf16 *s, int64_t ls, int64_t rows, int64_t HS) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < HS; c++) d[i * HS + c] = l3d_bf16_widen(s[i * ls + c]);
}
static void narrow(bf16 *d, int64_t ld, const float *s, int64_t rows, int64_t HS) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < HS; c++) d[i * ld + c] = l3d_bf16_narrow(s[i * HS + c]);
}
/* d (rows x HS bf16, stride ld) = d + s^T, s the transposed sums (HS rows of stride rows),
 * rounded once: dq's old value joins its new terms at the end, read in row order */
static void narrow_add_t(bf16 *d, int64_t ld, const float *s, int64_t rows, int64_t HS) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < HS; c++)
            d[i * ld + c] = l3d_bf16_narrow(l3d_bf16_widen(d[i * ld + c]) + s[c * rows + i]);
}

/* K_j^T: HS rows of the block's keys, the pad column (nk odd) zero */
static void transpose_keys(bf16 *KT, const bf16 *k, int64_t ks, int64_t nk, int64_t HS) {
    for (int64_t d = 0; d < HS; d++) {
        for (int64_t j = 0; j < nk; j++) KT[d * L3D_FA_BK + j] = k[j * ks + d];
        if (nk & 1) KT[d * L3D_FA_BK + nk] = 0;
    }
}

/* Key blocks outer, then the query heads in order, then their query blocks (the fp32 span's
 * order: dK_j and dV_j sum the group's heads and blocks in one fixed order). */
void l3d_fa16_backward_span(const struct l3d_fa16_span *a, float *w) {
    const int64_t HS = a->HS, nqb = (a->nq + L3D_FA_BQ - 1) / L3D_FA_BQ;
    struct bwd_scratch s = bwd_layout(a, w);
    bwd_prepare(a, &s);
    memset(s.dqT, 0, (size_t)(a->rep * a->nq * HS) * sizeof(float));
    widen(s.dk, a->dk, a->gks, a->nk, HS);
    widen(s.dv, a->dv, a->gks, a->nk, HS);
    for (int64_t j0 = 0; j0 < a->nk; j0 += L3D_FA_BK) {
        int64_t nk = a->nk - j0 < L3D_FA_BK ? a->nk - j0 : L3D_FA_BK;
        transpose_keys(s.KT, a->k + j0 * a->ks, a->ks, nk, HS);
        /* the first query block with a row that sees key j0 */
        int64_t qb0 = j0 > a->p0 ? (j0 - a->p0) / L3D_FA_BQ : 0;
        for (int64_t r = 0; r < a->rep; r++)
            for (int64_t qb = qb0; qb < nqb; qb++) {
                int64_t i0 = qb * L3D_FA_BQ, nq = a->nq - i0 < L3D_FA_BQ ? a->nq - i0 : L3D_FA_BQ;
                bwd_pair(a, &s, r, i0, nq, j0, nk);
            }
    }
    for (int64_t r = 0; r < a->rep; r++)
        narrow_add_t(a->dq + r * a->hq, a->gqs, s.dqT + r * a->nq * HS, a->nq, HS);
    narrow(a->dk, a->gks, s.dk, a->nk, HS);
    narrow(a->dv, a->gks, s.dv, a->nk, HS);
}
