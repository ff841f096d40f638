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
    if (e && strcmp(e, "0") == 0) return false;
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

static inline uint32_t pair_at(const bf16 *p) {
    uint32_t x;
    memcpy(&x, p, sizeof x);
    return x;
}

/* C (M x N, row stride ldc) = alpha A B, plus C when acc. A: M rows of 2 K2 bf16 (stride lda);
 * Bp: K2 x N packed pairs (pack_t, pack_n). Rows past M read row M - 1 and are not stored;
 * columns past N are masked. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void
dot_gemm(int64_t M, int64_t N, int64_t K2, const bf16 *A, int64_t lda, const uint32_t *Bp,
         float alpha, bool acc, float *C, int64_t ldc) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
        __mmask16 mk[4];
        for (int v = 0; v < 4; v++) {
            int64_t left = N - n0 - 16 * v;
            mk[v] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        }
        for (int64_t i0 = 0; i0 < M; i0 += 4) {
            const bf16 *ar[4];
            for (int r = 0; r < 4; r++) ar[r] = A + (i0 + r < M ? i0 + r : M - 1) * lda;
            __m512 c[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) c[r][v] = _mm512_setzero_ps();
            for (int64_t p = 0; p < K2; p++) {
                const uint32_t *b = Bp + p * N + n0;
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

/* Bp for B = X^T, X of N rows of 2 K2 bf16 (stride ldx): pair p of column n is X[n][2p..2p+1]. */
static void pack_t(uint32_t *Bp, const bf16 *X, int64_t ldx, int64_t N, int64_t K2) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t p = 0; p < K2; p++) Bp[p * N + n] = pair_at(X + n * ldx + 2 * p);
}

/* Bp for B = X, X of K rows of N bf16 (stride ldx): pair p of column n is X[2p][n] (low half)
 * and X[2p + 1][n], zero past row K - 1. */
static void pack_n(uint32_t *Bp, const bf16 *X, int64_t ldx, int64_t K, int64_t N) {
    for (int64_t p = 0; p < (K + 1) / 2; p++) {
        const bf16 *r0 = X + 2 * p * ldx, *r1 = X + (2 * p + 1) * ldx;
        uint32_t *o = Bp + p * N;
        if (2 * p + 1 < K)
            for (int64_t n = 0; n < N; n++) o[n] = (uint32_t)r0[n] | (uint32_t)r1[n] << 16;
        else
            for (int64_t n = 0; n < N; n++) o[n] = r0[n];
    }
}

int64_t l3d_fa16_forward_floats(int64_t HS) {
    /* S, O fp32; K and V packed (HS BK bf16 each); P bf16 */
    return L3D_FA_BQ * L3D_FA_BK + L3D_FA_BQ * HS + L3D_FA_BK * HS + L3D_FA_BQ * L3D_FA_BK / 2;
}

/* One row's online softmax over a block of scores s (valid of nk visible): s becomes the
 * unnormalised probabilities (zero past valid), the running max m and sum l advance; returns the
 * factor the row's output is rescaled by. As cpu.c's fa_forward_block_n. */
static float online_row(float *s, int64_t valid, int64_t nk, float *m, float *l) {
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
        pack_t(Kp, k + j0 * ks, ks, nk, HS / 2);
        pack_n(Vp, v + j0 * ks, ks, nk, HS);
        dot_gemm(nq, nk, HS / 2, q, qs, Kp, scale, false, S, L3D_FA_BK);
        for (int64_t i = 0; i < nq; i++) {
            float *s = S + i * L3D_FA_BK, *o = O + i * HS;
            int64_t valid = p0 + i - j0 + 1; /* keys j0.. j0+valid-1 are visible to row i */
            float corr = online_row(s, valid > nk ? nk : valid, nk, &m[i], &l[i]);
            if (corr != 1.0f)
                for (int64_t d = 0; d < HS; d++) o[d] *= corr;
            bf16 *pb = Pb + i * L3D_FA_BK;
            for (int64_t j = 0; j < 2 * nk2; j++) pb[j] = j < nk ? l3d_bf16_narrow(s[j]) : 0;
        }
        dot_gemm(nq, HS, nk2, Pb, L3D_FA_BK, Vp, 1.0f, true, O, HS);
    }
    for (int64_t i = 0; i < nq; i++) {
        float inv = 1.0f / l[i];
        for (int64_t d = 0; d < HS; d++) out[i * os + d] = l3d_bf16_narrow(O[i * HS + d] * inv);
        if (lse) lse[i] = m[i] + logf(l[i]);
    }
}

/* the backward span's scratch: fp32 accumulators, then the per-block buffers */
struct bwd_scratch {
    float *D, *dq, *dk, *dv, *P, *dP;
    uint32_t *Kt, *Vt, *Kn, *dOn, *Qn;
    bf16 *Pt, *dSt, *dSb;
};

int64_t l3d_fa16_backward_floats(int64_t rep, int64_t nq, int64_t nk, int64_t HS) {
    const int64_t blk = L3D_FA_BQ * L3D_FA_BK;
    return rep * nq + rep * nq * HS + 2 * nk * HS + 2 * blk + 3 * L3D_FA_BK * HS / 2 +
           L3D_FA_BQ * HS + 3 * blk / 2;
}

static struct bwd_scratch bwd_layout(const struct l3d_fa16_span *a, float *w) {
    const int64_t HS = a->HS, blk = L3D_FA_BQ * L3D_FA_BK;
    struct bwd_scratch s;
    s.D = w;
    s.dq = s.D + a->rep * a->nq;
    s.dk = s.dq + a->rep * a->nq * HS;
    s.dv = s.dk + a->nk * HS;
    s.P = s.dv + a->nk * HS;
    s.dP = s.P + blk;
    s.Kt = (uint32_t *)(s.dP + blk);
    s.Vt = s.Kt + L3D_FA_BK * HS / 2;
    s.Kn = s.Vt + L3D_FA_BK * HS / 2;
    s.dOn = s.Kn + L3D_FA_BK * HS / 2;
    s.Qn = s.dOn + L3D_FA_BQ * HS / 2;
    s.Pt = (bf16 *)(s.Qn + L3D_FA_BQ * HS / 2);
    s.dSt = s.Pt + blk;
    s.dSb = s.dSt + blk;
    return s;
}

/* rows x HS bf16 (stride ls) <-> fp32 (stride HS) */
static void widen(float *d, const bf16 *s, int64_t ls, int64_t rows, int64_t HS) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < HS; c++) d[i * HS + c] = l3d_bf16_widen(s[i * ls + c]);
}
static void narrow(bf16 *d, int64_t ld, const float *s, int64_t rows, int64_t HS) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < HS; c++) d[i * ld + c] = l3d_bf16_narrow(s[i * HS + c]);
}

/* P = exp(S - L), dS = P (dP - D) / sqrt(HS) of query rows i0.. (nq of them) of head r against
 * keys j0.. (nk), into bf16: P^T and dS^T (rows of L3D_FA_BQ, the pad column zero) and dS (rows
 * of L3D_FA_BK, the pad column zero). */
static void bwd_probs(const struct l3d_fa16_span *a, struct bwd_scratch *s, int64_t r,
                      int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
    const float scale = 1.0f / sqrtf((float)a->HS);
    const float *L = a->L + r * a->hl + i0, *D = s->D + r * a->nq + i0;
    for (int64_t i = 0; i < nq + (nq & 1); i++) {
        int64_t valid = a->p0 + i0 + i - j0 + 1;
        valid = i >= nq ? 0 : valid > nk ? nk : (valid < 0 ? 0 : valid);
        const float *p = s->P + i * L3D_FA_BK, *dp = s->dP + i * L3D_FA_BK;
        for (int64_t j = 0; j < nk + (nk & 1); j++) {
            float pj = 0.0f, ds = 0.0f;
            if (j < valid) {
                pj = fast_expf(p[j] - L[i]);
                ds = pj * (dp[j] - D[i]) * scale;
            }
            bf16 pb = l3d_bf16_narrow(pj), db = l3d_bf16_narrow(ds);
            if (j < nk) s->Pt[j * L3D_FA_BQ + i] = pb, s->dSt[j * L3D_FA_BQ + i] = db;
            if (i < nq) s->dSb[i * L3D_FA_BK + j] = db;
        }
    }
}

/* D = rowsum(dO * O) of every query row of every head, once for all key blocks */
static void bwd_rowsums(const struct l3d_fa16_span *a, float *D) {
    for (int64_t r = 0; r < a->rep; r++)
        for (int64_t i = 0; i < a->nq; i++) {
            const bf16 *o = a->O + r * a->ho + i * a->os, *g = a->dO + r * a->ho + i * a->os;
            float d = 0.0f;
            for (int64_t c = 0; c < a->HS; c++) d += l3d_bf16_widen(o[c]) * l3d_bf16_widen(g[c]);
            D[r * a->nq + i] = d;
        }
}

/* The five products of one (query block, key block) pair of head r: P and dP, then
 * dV_j += P^T dO_i, dQ_i += dS K_j, dK_j += dS^T Q_i (cpu.c's fa_backward_span). */
static void bwd_pair(const struct l3d_fa16_span *a, struct bwd_scratch *s, int64_t r, int64_t i0,
                     int64_t nq, int64_t j0, int64_t nk) {
    const int64_t HS = a->HS, nq2 = (nq + 1) / 2, nk2 = (nk + 1) / 2;
    const bf16 *qh = a->q + r * a->hq + i0 * a->qs, *dOh = a->dO + r * a->ho + i0 * a->os;
    dot_gemm(nq, nk, HS / 2, qh, a->qs, s->Kt, 1.0f / sqrtf((float)HS), false, s->P, L3D_FA_BK);
    dot_gemm(nq, nk, HS / 2, dOh, a->os, s->Vt, 1.0f, false, s->dP, L3D_FA_BK);
    bwd_probs(a, s, r, i0, nq, j0, nk);
    pack_n(s->dOn, dOh, a->os, nq, HS);
    pack_n(s->Qn, qh, a->qs, nq, HS);
    dot_gemm(nk, HS, nq2, s->Pt, L3D_FA_BQ, s->dOn, 1.0f, true, s->dv + j0 * HS, HS);
    dot_gemm(nq, HS, nk2, s->dSb, L3D_FA_BK, s->Kn, 1.0f, true,
             s->dq + (r * a->nq + i0) * HS, HS);
    dot_gemm(nk, HS, nq2, s->dSt, L3D_FA_BQ, s->Qn, 1.0f, true, s->dk + j0 * HS, HS);
}

/* Key blocks outer, then the query heads in order, then their query blocks (the fp32 span's
 * order: dK_j and dV_j sum the group's heads and blocks in one fixed order). */
void l3d_fa16_backward_span(const struct l3d_fa16_span *a, float *w) {
    const int64_t HS = a->HS, nqb = (a->nq + L3D_FA_BQ - 1) / L3D_FA_BQ;
    struct bwd_scratch s = bwd_layout(a, w);
    bwd_rowsums(a, s.D);
    for (int64_t r = 0; r < a->rep; r++)
        widen(s.dq + r * a->nq * HS, a->dq + r * a->hq, a->gqs, a->nq, HS);
    widen(s.dk, a->dk, a->gks, a->nk, HS);
    widen(s.dv, a->dv, a->gks, a->nk, HS);
    for (int64_t j0 = 0; j0 < a->nk; j0 += L3D_FA_BK) {
        int64_t nk = a->nk - j0 < L3D_FA_BK ? a->nk - j0 : L3D_FA_BK;
        pack_t(s.Kt, a->k + j0 * a->ks, a->ks, nk, HS / 2);
        pack_t(s.Vt, a->v + j0 * a->ks, a->ks, nk, HS / 2);
        pack_n(s.Kn, a->k + j0 * a->ks, a->ks, nk, HS);
        /* the first query block with a row that sees key j0 */
        int64_t qb0 = j0 > a->p0 ? (j0 - a->p0) / L3D_FA_BQ : 0;
        for (int64_t r = 0; r < a->rep; r++)
            for (int64_t qb = qb0; qb < nqb; qb++) {
                int64_t i0 = qb * L3D_FA_BQ, nq = a->nq - i0 < L3D_FA_BQ ? a->nq - i0 : L3D_FA_BQ;
                bwd_pair(a, &s, r, i0, nq, j0, nk);
            }
    }
    for (int64_t r = 0; r < a->rep; r++)
        narrow(a->dq + r * a->hq, a->gqs, s.dq + r * a->nq * HS, a->nq, HS);
    narrow(a->dk, a->gks, s.dk, a->nk, HS);
    narrow(a->dv, a->gks, s.dv, a->nk, HS);
}
