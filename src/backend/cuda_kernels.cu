/*
 * The CUDA backend's kernels (launchers declared in src/backend/cuda_kernels.h). EXPERIMENTAL:
 * compiled and warning-free in every CI run, never yet run on a GPU; tests/cuda/test_cuda_kernels.c
 * (scripts/gpu-check.sh) compares each with the CPU backend the first time a GPU is at hand.
 *
 * Numerics follow the CPU backend (src/backend/cpu.c): 16-bit storage, fp32 arithmetic, each 16-bit
 * output rounded once to nearest even; gradient outputs accumulate (+=); the same formulas (GELU's
 * tanh form, LayerNorm eps 1e-5, AdamW as written in backend-impl.h). Every reduction has a fixed
 * order for a given shape (no atomics), so a run repeats bit for bit on one GPU; it differs from the
 * CPU's order, hence the tolerances of the kernel test. expf here, the CPU's polynomial there.
 *
 * Attention is FlashAttention's recurrence (Dao et al. 2022, Algorithm 1; Dao 2023 for the single
 * rescale per step) in its simplest GPU form: one warp a query row, the row's q and running output
 * in registers (ceil(HS / 32) elements a lane), keys visited one by one with an online softmax,
 * the log-sum-exp kept per row as the CPU kernel does. The backward pass recomputes the
 * probabilities from lse: one warp per query row for dQ, one per key row for dK and dV (no
 * atomics). No T x T tensor. It uses no tensor cores: the tiled tensor-core version is the next
 * step once a GPU can measure it. One set of kernels serves every attention entry through a
 * geometry (struct l3d_cuk_attn: strides, the query rows' offset into the keys, grouped-query
 * heads reading their shared key/value head in place): the fused qkv of training, the KV cache of
 * generation, the blocks of context parallelism (and their merge).
 *
 * The Llama blocks: RMSNorm one warp a row as LayerNorm (its weight gradient LayerNorm's column
 * sums with xhat = x rstd); RoPE one thread a rotary pair, the angle's cosine and sine in double
 * as the CPU's table; SwiGLU one thread an output element.
 */
#include <cub/cub.cuh>
#include <math.h>
#include <stdint.h>

#include "backend/cuda_device.cuh"

/* block of 256 threads: the sum (or max) of every thread's x, returned to all; fixed order */
__device__ float block_reduce(float x, bool is_max) {
    __shared__ float w[8];
    __shared__ float r;
    x = is_max ? warp_max(x) : warp_sum(x);
    if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = w[0];
        for (int k = 1; k < (int)(blockDim.x >> 5); k++) a = is_max ? fmaxf(a, w[k]) : a + w[k];
        r = a;
    }
    __syncthreads();
    float out = r;
    __syncthreads();
    return out;
}

/* ---- embedding -------------------------------------------------------------------------------- */

template <typename T>
__global__ void encoder_forward_k(T *out, const int32_t *tokens, const T *wte, const T *wpe,
                                  int64_t vstart, int64_t vcount, int64_t T_, int64_t C,
                                  int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t bt = i / C, c = i % C, v = (int64_t)tokens[bt] - vstart;
        float x = v >= 0 && v < vcount ? ld(wte + v * C + c) : 0.0f;
        if (wpe) x += ld(wpe + (bt % T_) * C + c);
        st(out + i, x);
    }
}

/* The rows of each token, grouped on the device: keys (the token's row of the slice, vcount for a
 * token outside it) sorted with their positions by CUB's stable radix sort (so a token's positions
 * stay ascending), then run-length encoded (uniq, cnt, *nruns) and the counts scanned (off). */
__global__ void encoder_keys_k(int32_t *keys, int32_t *pos, const int32_t *tokens, int64_t vstart,
                               int64_t vcount, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t v = (int64_t)tokens[i] - vstart;
        keys[i] = (int32_t)(v >= 0 && v < vcount ? v : vcount);
        pos[i] = (int32_t)i;
    }
}

/* one block a run (a distinct token; y: blocks of channels): its rows summed in position order in
 * fp32, added to the gradient once. Blocks past the runs, and the run of tokens outside the
 * slice, do nothing (the grid is sized for the most runs: no copy to the host). */
template <typename T, typename G>
__global__ void encoder_backward_wte_k(G *dwte, const T *dout, const int32_t *uniq,
                                       const int32_t *cnt, const int32_t *off,
                                       const int32_t *order, const int32_t *nruns, int64_t vcount,
                                       int64_t C) {
    int64_t u = blockIdx.x, c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (u >= *nruns || uniq[u] >= vcount || c >= C) return;
    float s = 0.0f;
    for (int32_t k = off[u]; k < off[u] + cnt[u]; k++) s += ld(dout + (int64_t)order[k] * C + c);
    G *g = dwte + (int64_t)uniq[u] * C + c;
    st(g, ld(g) + s);
}

template <typename T, typename G>
__global__ void encoder_backward_wpe_k(G *dwpe, const T *dout, int64_t B, int64_t T_, int64_t C) {
    GRID_STRIDE(i, T_ * C) {
        float s = 0.0f;
        for (int64_t b = 0; b < B; b++) s += ld(dout + b * T_ * C + i);
        st(dwpe + i, ld(dwpe + i) + s);
    }
}

/* ---- LayerNorm: one warp a row ---------------------------------------------------------------- */

#define LN_EPS 1e-5f

/* With add (not NULL): res's row = inp's + add's, rounded to T, and the row normalised is res's
 * (the residual add and the norm in one pass; each lane reads back only what it wrote). */
template <typename T>
__device__ const T *residual_row(T *res, const T *inp, const T *add, int64_t row, int64_t C,
                                 int lane) {
    if (!add) return inp + row * C;
    for (int64_t c = lane; c < C; c += 32)
        st(res + row * C + c, ld(inp + row * C + c) + ld(add + row * C + c));
    return res + row * C;
}

template <typename T>
__global__ void layernorm_forward_k(T *out, float *mean, float *rstd, const T *inp, const T *w,
                                    const T *b, int64_t N, int64_t C, T *res, const T *add) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= N) return;
    const T *x = residual_row(res, inp, add, row, C, lane);
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += 32) s += ld(x + c);
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float d = ld(x + c) - m;
        v += d * d;
    }
    float r = 1.0f / sqrtf(warp_sum(v) / (float)C + LN_EPS);
    for (int64_t c = lane; c < C; c += 32)
        st(out + row * C + c, (ld(x + c) - m) * r * ld(w + c) + ld(b + c));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

template <typename T>
__global__ void layernorm_dinp_k(T *dinp, const T *dout, const T *inp, const T *w,
                                 const float *mean, const float *rstd, int64_t N, int64_t C) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= N) return;
    const T *x = inp + row * C, *d = dout + row * C;
    float m = mean[row], r = rstd[row], sg = 0.0f, sgx = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float g = ld(d + c) * ld(w + c);
        sg += g;
        sgx += g * (ld(x + c) - m) * r;
    }
    sg = warp_sum(sg) / (float)C;
    sgx = warp_sum(sgx) / (float)C;
    for (int64_t c = lane; c < C; c += 32) {
        float xhat = (ld(x + c) - m) * r;
        T *o = dinp + row * C + c;
        st(o, ld(o) + r * (ld(d + c) * ld(w + c) - sg - xhat * sgx));
    }
}

/* Column sums over N rows, 32 columns a block (x) by 8 row lanes (y), each lane a fixed stride of
 * rows, the 8 partial sums added in lane order: g += sum_n f(n, c), with f = x (mode 0) or
 * dout * xhat (mode 1, the norm's dweight; x is dout, inp/rstd given, mean NULL for RMSNorm's
 * xhat = x rstd). */
template <typename T, typename G>
__global__ void colsum_k(G *g, const T *x, const T *inp, const float *mean, const float *rstd,
                         int mode, int64_t N, int64_t C) {
    __shared__ float part[8][33];
    int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int64_t n = threadIdx.y; n < N; n += 8) {
            float d = ld(x + n * C + c);
            s += mode == 0 ? d : d * (ld(inp + n * C + c) - (mean ? mean[n] : 0.0f)) * rstd[n];
        }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float a = part[0][threadIdx.x];
        for (int k = 1; k < 8; k++) a += part[k][threadIdx.x];
        st(g + c, ld(g + c) + a);
    }
}

/* ---- RMSNorm: one warp a row, as LayerNorm; rotary positions, SwiGLU: a thread an element ---- */

template <typename T>
__global__ void rmsnorm_forward_k(T *out, float *rstd, const T *inp, const T *w, int64_t N,
                                  int64_t C, float eps, T *res, const T *add) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= N) return;
    const T *x = residual_row(res, inp, add, row, C, lane);
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float a = ld(x + c);
        s += a * a;
    }
    float r = 1.0f / sqrtf(warp_sum(s) / (float)C + eps);
    for (int64_t c = lane; c < C; c += 32) st(out + row * C + c, ld(x + c) * r * ld(w + c));
    if (lane == 0) rstd[row] = r;
}

/* dinp += rstd (g - xhat mean(g xhat)), g = dout w, xhat = x rstd (the CPU's rms_backward_row) */
template <typename T>
__global__ void rmsnorm_dinp_k(T *dinp, const T *dout, const T *inp, const T *w,
                               const float *rstd, int64_t N, int64_t C) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= N) return;
    const T *x = inp + row * C, *d = dout + row * C;
    float r = rstd[row], sgx = 0.0f;
    for (int64_t c = lane; c < C; c += 32) sgx += ld(d + c) * ld(w + c) * ld(x + c) * r;
    sgx = warp_sum(sgx) / (float)C;
    for (int64_t c = lane; c < C; c += 32) {
        T *o = dinp + row * C + c;
        st(o, ld(o) + r * (ld(d + c) * ld(w + c) - ld(x + c) * r * sgx));
    }
}

/* One thread a rotary pair (row bt, head h of the NH + NKV rotated, pair i): the angle
 * pos[t] inv_freq[i] formed and its cosine and sine taken in double, then rounded once, as the
 * CPU's table (Hugging Face's fp32 angle is off by ~4e-3 rad at position 10^5); sign -1 turns
 * back. Llama 3.1's frequency scaling is in inv_freq (l3d_rope_inv_freq). */
template <typename T>
__global__ void rope_k(T *qkv, const float *inv_freq, const int32_t *pos, int64_t T_, int64_t NR,
                       int64_t CQ, int64_t HS, float sign, int64_t n) {
    const int64_t H2 = HS / 2;
    GRID_STRIDE(e, n) {
        int64_t i = e % H2, h = (e / H2) % NR, bt = e / (H2 * NR);
        double sn, cs;
        sincos((double)pos[bt % T_] * (double)inv_freq[i], &sn, &cs);
        float c = (float)cs, s = sign * (float)sn;
        T *lo = qkv + bt * CQ + h * HS + i, *hi = lo + H2;
        float a = ld(lo), b = ld(hi);
        st(lo, a * c - b * s);
        st(hi, b * c + a * s);
    }
}

/* out = silu(g) u; backward dg += d u s (1 + g (1 - s)), du += d g s, s = sigmoid(g) */
template <typename T>
__global__ void swiglu_k(T *out, T *dinp, const T *dout, const T *inp, int64_t H, int64_t n) {
    GRID_STRIDE(e, n) {
        int64_t r = e / H, c = e % H;
        const T *gp = inp + r * 2 * H + c;
        float g = ld(gp), u = ld(gp + H), s = 1.0f / (1.0f + expf(-g));
        if (out) {
            st(out + e, g * s * u);
            continue;
        }
        float d = ld(dout + e);
        T *dg = dinp + r * 2 * H + c, *du = dg + H;
        st(dg, ld(dg) + d * u * s * (1.0f + g * (1.0f - s)));
        st(du, ld(du) + d * g * s);
    }
}

/* ---- attention -------------------------------------------------------------------------------- */

/* A row of HS elements over a warp: lane l holds elements l, l + 32, ... (P of them). */
template <int P, typename T>
__device__ __forceinline__ void row_load(float (&r)[P], const T *p, int64_t HS, int lane) {
#pragma unroll
    for (int k = 0; k < P; k++) {
        int64_t d = lane + 32 * k;
        r[k] = d < HS ? ld(p + d) : 0.0f;
    }
}
template <int P, typename T>
__device__ __forceinline__ float row_dot(const float (&r)[P], const T *p, int64_t HS, int lane) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < P; k++) {
        int64_t d = lane + 32 * k;
        if (d < HS) s += r[k] * ld(p + d);
    }
    return warp_sum(s);
}
/* p[0, HS) += the row r held as row_load holds it */
template <int P, typename T>
__device__ __forceinline__ void row_add(T *p, const float (&r)[P], int64_t HS, int lane) {
#pragma unroll
    for (int k = 0; k < P; k++) {
        int64_t d = lane + 32 * k;
        if (d < HS) st(p + d, ld(p + d) + r[k]);
    }
}

/* Query row `row` of the grid, (b, h, i) in that order, and the last key it sees */
struct attn_row {
    int64_t b, h, i, last;
};
__device__ __forceinline__ attn_row attn_row_of(const l3d_cuk_attn &g, int64_t row) {
    attn_row r;
    r.i = row % g.nq;
    r.h = (row / g.nq) % g.NH;
    r.b = row / (g.nq * g.NH);
    r.last = g.p0 + r.i < g.nk - 1 ? g.p0 + r.i : g.nk - 1;
    return r;
}

/* One warp a query row (b, h, i): the keys 0..last of key/value head h / grp visited one by one
 * with the online softmax; out =, lse = (when not NULL). Grouped-query heads read their shared
 * key/value head where it is (no repeated copy). */
template <int P, typename T>
__global__ void attn_forward_k(T *out, float *lse, const T *q, const T *k, const T *v,
                               l3d_cuk_attn g, int64_t rows) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= rows) return;
    const attn_row r = attn_row_of(g, row);
    const int64_t HS = g.HS;
    const T *qr = q + r.b * g.qb + r.i * g.qs + r.h * HS;
    const int64_t kvo = r.b * g.kb + (r.h / g.grp) * HS;
    const T *kh = k + kvo, *vh = v + kvo;
    const float scale = 1.0f / sqrtf((float)HS);
    float qv[P], o[P];
    row_load<P>(qv, qr, HS, lane);
#pragma unroll
    for (int e = 0; e < P; e++) o[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j <= r.last; j++) {
        float s = row_dot<P>(qv, kh + j * g.ks, HS, lane) * scale;
        float mx = fmaxf(m, s), corr = expf(m - mx), p = expf(s - mx);
        l = l * corr + p;
        m = mx;
#pragma unroll
        for (int e = 0; e < P; e++) {
            int64_t d = lane + 32 * e;
            o[e] = o[e] * corr + (d < HS ? p * ld(vh + j * g.ks + d) : 0.0f);
        }
    }
    T *orow = out + r.b * g.ob + r.i * g.os + r.h * HS;
#pragma unroll
    for (int e = 0; e < P; e++) {
        int64_t d = lane + 32 * e;
        if (d < HS) st(orow + d, o[e] / l);
    }
    if (lse && lane == 0) lse[r.b * g.lb + r.h * g.lh + r.i] = m + logf(l);
}

/* D (B,NH,nq) = rowsum(dO * O) of each query row (FlashAttention-2 eq. 4) */
template <int P, typename T>
__global__ void attn_D_k(float *D, const T *dout, const T *out, l3d_cuk_attn g, int64_t rows) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= rows) return;
    const attn_row r = attn_row_of(g, row);
    const int64_t o = r.b * g.ob + r.i * g.os + r.h * g.HS;
    float gr[P];
    row_load<P>(gr, dout + o, g.HS, lane);
    float d = row_dot<P>(gr, out + o, g.HS, lane);
    if (lane == 0) D[row] = d;
}

/* dQ of query row (b, h, i) (+=): sum over its keys j of dS_ij k_j, dS = P (dP - D) / sqrt(HS) */
template <int P, typename T>
__global__ void attn_dq_k(T *dq, const T *dout, const T *q, const T *k, const T *v,
                          const float *lse, const float *D, l3d_cuk_attn g, int64_t rows) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= rows) return;
    const attn_row r = attn_row_of(g, row);
    const int64_t HS = g.HS, qo = r.b * g.qb + r.i * g.qs + r.h * HS;
    const int64_t kvo = r.b * g.kb + (r.h / g.grp) * HS;
    const float scale = 1.0f / sqrtf((float)HS), L = lse[r.b * g.lb + r.h * g.lh + r.i];
    const float Di = D[row];
    float qv[P], gr[P], dqr[P];
    row_load<P>(qv, q + qo, HS, lane);
    row_load<P>(gr, dout + r.b * g.ob + r.i * g.os + r.h * HS, HS, lane);
#pragma unroll
    for (int e = 0; e < P; e++) dqr[e] = 0.0f;
    for (int64_t j = 0; j <= r.last; j++) {
        const T *kj = k + kvo + j * g.ks, *vj = v + kvo + j * g.ks;
        float p = expf(row_dot<P>(qv, kj, HS, lane) * scale - L);
        float ds = p * (row_dot<P>(gr, vj, HS, lane) - Di) * scale;
#pragma unroll
        for (int e = 0; e < P; e++) {
            int64_t d = lane + 32 * e;
            if (d < HS) dqr[e] += ds * ld(kj + d);
        }
    }
    row_add<P>(dq + qo, dqr, HS, lane);
}

/* dK, dV of key row j of key/value head kh (+=): sums over the grp query heads that read it and
 * their rows i that see it (p0 + i >= j) of dS_ij q_i and P_ij dO_i. One warp owns the row: no
 * atomics, and the order is fixed. */
template <int P, typename T>
__global__ void attn_dkv_k(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                           const float *lse, const float *D, l3d_cuk_attn g, int64_t rows) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= rows) return;
    const int64_t NKV = g.NH / g.grp, HS = g.HS;
    const int64_t j = row % g.nk, kh = (row / g.nk) % NKV, b = row / (g.nk * NKV);
    const int64_t kvo = b * g.kb + j * g.ks + kh * HS, i0 = j > g.p0 ? j - g.p0 : 0;
    const float scale = 1.0f / sqrtf((float)HS);
    float kv[P], vv[P], dkr[P], dvr[P];
    row_load<P>(kv, k + kvo, HS, lane);
    row_load<P>(vv, v + kvo, HS, lane);
#pragma unroll
    for (int e = 0; e < P; e++) dkr[e] = dvr[e] = 0.0f;
    for (int64_t h = kh * g.grp; h < (kh + 1) * g.grp; h++) {
        const float *Lh = lse + b * g.lb + h * g.lh, *Dh = D + (b * g.NH + h) * g.nq;
        for (int64_t i = i0; i < g.nq; i++) {
            const T *qi = q + b * g.qb + i * g.qs + h * HS;
            const T *gi = dout + b * g.ob + i * g.os + h * HS;
            float p = expf(row_dot<P>(kv, qi, HS, lane) * scale - Lh[i]);
            float ds = p * (row_dot<P>(vv, gi, HS, lane) - Dh[i]) * scale;
#pragma unroll
            for (int e = 0; e < P; e++) {
                int64_t d = lane + 32 * e;
                if (d < HS) {
                    dvr[e] += p * ld(gi + d);
                    dkr[e] += ds * ld(qi + d);
                }
            }
        }
    }
    row_add<P>(dk + kvo, dkr, HS, lane);
    row_add<P>(dv + kvo, dvr, HS, lane);
}

/* One warp a query row: the two log-sum-exps combined (expf / logf, as the CPU), the row
 * reweighted; a row whose lse2 is -inf is left as it is */
template <typename T>
__global__ void attn_merge_k(T *out, float *lse, const T *out2, const float *lse2, l3d_cuk_attn g,
                             int64_t rows) {
    const int64_t row = warp_row();
    const int lane = warp_lane();
    if (row >= rows) return;
    const attn_row r = attn_row_of(g, row);
    const int64_t li = r.b * g.lb + r.h * g.lh + r.i;
    const float L1 = lse[li], L2 = lse2[li];
    if (L2 == -INFINITY) return;
    float mx = fmaxf(L1, L2), w1 = expf(L1 - mx), w2 = expf(L2 - mx), sum = w1 + w2;
    w1 /= sum;
    w2 /= sum;
    const int64_t o = r.b * g.ob + r.i * g.os + r.h * g.HS;
    for (int64_t d = lane; d < g.HS; d += 32)
        st(out + o + d, w1 * ld(out + o + d) + w2 * ld(out2 + o + d));
    __syncwarp();
    if (lane == 0) lse[li] = mx + logf(sum);
}

/* P = ceil(HS / 32) as a template argument: 1..8 (HS <= 256, L3D_CUDA_MAX_HS) */
#define PER_LANE(HS, ...)                                \
    do {                                               \
        switch (l3d_cuda_attn_per_lane(HS)) {          \
        case 1: { const int P = 1; __VA_ARGS__; } break;         \
        case 2: { const int P = 2; __VA_ARGS__; } break;         \
        case 3: { const int P = 3; __VA_ARGS__; } break;         \
        case 4: { const int P = 4; __VA_ARGS__; } break;         \
        case 5: { const int P = 5; __VA_ARGS__; } break;         \
        case 6: { const int P = 6; __VA_ARGS__; } break;         \
        case 7: { const int P = 7; __VA_ARGS__; } break;         \
        default: { const int P = 8; __VA_ARGS__; } break;        \
        }                                              \
    } while (0)

static const uint32_t kRowWarps = 4; /* warps a block in the row kernels */

/* ---- elementwise ------------------------------------------------------------------------------ */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

template <typename T>
__global__ void elementwise_k(int op, T *out, const T *a, const T *b, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = ld(a + i);
        if (op == 0) {
            st(out + i, 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
        } else if (op == 1) {
            float th = tanhf(GELU_K * (x + 0.044715f * x * x * x)), sech2 = 1.0f - th * th;
            float df = 0.5f * (1.0f + th) +
                       0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
            st(out + i, ld(out + i) + df * ld(b + i));
        } else {
            st(out + i, x + ld(b + i));
        }
    }
}

template <typename T>
__global__ void add_bias_k(T *out, const T *bias, int64_t C, int64_t n) {
    GRID_STRIDE(i, n) st(out + i, ld(out + i) + ld(bias + i % C));
}

/* ---- cross-entropy: one block (256 threads) a row --------------------------------------------- */

template <typename T>
__global__ void xent_k(int pass, T *logits, float *out, float *tlogit, const float *maxv,
                       const float *sumexp, const int32_t *targets, float dloss, int64_t vstart,
                       int64_t Vl, int64_t Vvalid) {
    int64_t n = blockIdx.x;
    T *row = logits + n * Vl;
    if (pass == 0) {
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < Vvalid; j += blockDim.x) mx = fmaxf(mx, ld(row + j));
        mx = block_reduce(mx, true);
        if (threadIdx.x == 0) out[n] = mx;
        return;
    }
    int64_t t = (int64_t)targets[n] - vstart;
    float mx = maxv[n];
    if (pass == 1) {
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < Vvalid; j += blockDim.x) s += expf(ld(row + j) - mx);
        s = block_reduce(s, false);
        if (threadIdx.x == 0) {
            out[n] = s;
            tlogit[n] = t >= 0 && t < Vvalid ? ld(row + t) : 0.0f;
        }
        return;
    }
    float k = dloss / sumexp[n];
    for (int64_t j = threadIdx.x; j < Vl; j += blockDim.x) {
        /* padding columns (Vvalid..Vl) are 0 even when a target id points into them */
        float g = 0.0f;
        if (j < Vvalid) {
            g = expf(ld(row + j) - mx) * k;
            if (j == t) g -= dloss;
        }
        st(row + j, g);
    }
}

__global__ void xent_losses_k(float *losses, const float *maxv, const float *sumexp,
                              const float *tlogit, int64_t n) {
    GRID_STRIDE(i, n) losses[i] = logf(sumexp[i]) + maxv[i] - tlogit[i];
}
/* *loss_sum += the losses in token order, one thread: bit-identical whatever the grid */
__global__ void xent_sum_k(double *loss_sum, const float *losses, int64_t n) {
    double s = *loss_sum;
    for (int64_t i = 0; i < n; i++) s += losses[i];
    *loss_sum = s;
}

/* ---- optimizer, norms, conversions ------------------------------------------------------------ */

/* zero: the gradient written 0 once read, the next step's zeroing in this pass (not yet run on
 * a GPU: tests/cuda/test_cuda_kernels.c compares it with the unfused pair where one exists) */
template <typename T, typename G>
__global__ void adamw_k(T *param, float *master, float *m, float *v, G *grad, bool zero, float gs,
                        int64_t n, float lr, float b1, float b2, float eps, float wd, float bc1,
                        float bc2) {
    GRID_STRIDE(i, n) {
        float g = ld(grad + i) * gs;
        if (zero) st(grad + i, 0.0f);
        float mi = b1 * m[i] + (1.0f - b1) * g, vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = master[i];
        p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p);
        master[i] = p;
        if (param) st(param + i, p);
    }
}

template <typename T>
__global__ void sumsq_part_k(double *part, const T *x, int64_t n) {
    __shared__ double w[256];
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double a = ld(x + i);
        s += a * a;
    }
    w[threadIdx.x] = s;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) w[threadIdx.x] += w[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = w[0];
}
__global__ void sumsq_final_k(double *acc, const double *part, uint32_t np) {
    double s = 0.0;
    for (uint32_t k = 0; k < np; k++) s += part[k];
    *acc += s;
}

template <typename D, typename S>
__global__ void convert_k(D *dst, const S *src, int64_t n) {
    GRID_STRIDE(i, n) st(dst + i, ld(src + i));
}

template <typename T>
__global__ void unscale_k(float *found_inf, T *x, float inv, int64_t n) {
    GRID_STRIDE(i, n) {
        float a = ld(x + i);
        if (!(fabsf(a) <= 3.40282347e38f)) *found_inf = 1.0f; /* Inf, NaN: every writer the same */
        if (inv != 1.0f) st(x + i, a * inv);
    }
}

/* ---- launchers -------------------------------------------------------------------------------- */

extern "C" {

const char *l3d_cuk_last_error(void) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

void l3d_cuk_encoder_forward(int dt, void *out, const int32_t *tokens, const void *wte,
                             const void *wpe, int64_t vocab_start, int64_t vocab_count, int64_t B,
                             int64_t T_, int64_t C, void *stream) {
    LAUNCH_1D(B * T_ * C, 256);
    DISPATCH(dt, (encoder_forward_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)out, tokens, (const T *)wte, (const T *)wpe, vocab_start, vocab_count,
                     T_, C, B * T_ * C)));
}

/* the work area of the grouping: 7 int32 arrays of n (keys and positions in and out, uniq, cnt,
 * off), the run count, then CUB's scratch */
static size_t enc_arrays(int64_t n) { return ((size_t)(7 * n + 1) * sizeof(int32_t) + 255) & ~(size_t)255; }
static int enc_bits(int64_t vcount) { /* the key bits to sort: keys are 0..vcount */
    int b = 1;
    while (b < 31 && ((int64_t)1 << b) <= vcount) b++;
    return b;
}
size_t l3d_cuk_encoder_backward_wte_bytes(int64_t BT, int64_t vocab_count) {
    size_t a = 0, b = 0, c = 0;
    int n = (int)BT;
    int32_t *z = NULL;
    cub::DeviceRadixSort::SortPairs(NULL, a, z, z, z, z, n, 0, enc_bits(vocab_count));
    cub::DeviceRunLengthEncode::Encode(NULL, b, z, z, z, z, n);
    cub::DeviceScan::ExclusiveSum(NULL, c, z, z, n);
    size_t m = a > b ? a : b;
    return enc_arrays(BT) + (m > c ? m : c);
}

#define CUB_OK(call)                    \
    do {                                \
        if ((call) != cudaSuccess) return #call; \
    } while (0)

const char *l3d_cuk_encoder_backward_wte(int dt, int gdt, void *dwte, const void *dout,
                                         const int32_t *tokens, int64_t vocab_start,
                                         int64_t vocab_count, int64_t BT, int64_t C, void *work,
                                         size_t work_bytes, void *stream) {
    if (BT == 0 || C == 0) return NULL;
    int32_t *keys = (int32_t *)work, *pos = keys + BT, *skeys = pos + BT, *order = skeys + BT;
    int32_t *uniq = order + BT, *cnt = uniq + BT, *off = cnt + BT, *nruns = off + BT;
    void *tmp = (char *)work + enc_arrays(BT);
    size_t tb = work_bytes - enc_arrays(BT);
    cudaStream_t s = ST(stream);
    int n = (int)BT;
    struct l3d_cuda_launch L = l3d_cuda_launch_1d(BT, 256, kMaxBlocks);
    encoder_keys_k<<<L.blocks, L.threads, 0, s>>>(keys, pos, tokens, vocab_start, vocab_count, BT);
    CUB_OK(cudaGetLastError());
    CUB_OK(cub::DeviceRadixSort::SortPairs(tmp, tb, keys, skeys, pos, order, n, 0,
                                           enc_bits(vocab_count), s));
    /* counts past the runs stay 0, so the scan over all n never sums garbage */
    CUB_OK(cudaMemsetAsync(cnt, 0, (size_t)BT * sizeof *cnt, s));
    CUB_OK(cub::DeviceRunLengthEncode::Encode(tmp, tb, skeys, uniq, cnt, nruns, n, s));
    CUB_OK(cub::DeviceScan::ExclusiveSum(tmp, tb, cnt, off, n, s));
    dim3 grid((unsigned)BT, (unsigned)((C + 127) / 128));
    DISPATCH_G(dt, gdt, (encoder_backward_wte_k<T, G><<<grid, 128, 0, s>>>(
                            (G *)dwte, (const T *)dout, uniq, cnt, off, order, nruns,
                            vocab_count, C)));
    return NULL;
}

void l3d_cuk_encoder_backward_wpe(int dt, int gdt, void *dwpe, const void *dout, int64_t B,
                                  int64_t T_, int64_t C, void *stream) {
    LAUNCH_1D(T_ * C, 256);
    DISPATCH_G(dt, gdt, (encoder_backward_wpe_k<T, G><<<L.blocks, L.threads, 0, ST(stream)>>>(
                            (G *)dwpe, (const T *)dout, B, T_, C)));
}

void l3d_cuk_layernorm_forward(int dt, void *out, float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int64_t N, int64_t C,
                               void *stream) {
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(N, kRowWarps);
    if (L.blocks == 0) return;
    DISPATCH(dt, (layernorm_forward_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)out, mean, rstd, (const T *)inp, (const T *)weight, (const T *)bias, N,
                     C, (T *)NULL, (const T *)NULL)));
}

void l3d_cuk_residual_norm_forward(int dt, void *res, void *out, float *mean, float *rstd,
                                   const void *a, const void *b, const void *weight,
                                   const void *bias, int64_t N, int64_t C, float eps,
                                   void *stream) {
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(N, kRowWarps);
    if (L.blocks == 0) return;
    if (mean) {
        DISPATCH(dt, (layernorm_forward_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                         (T *)out, mean, rstd, (const T *)a, (const T *)weight, (const T *)bias,
                         N, C, (T *)res, (const T *)b)));
    } else {
        DISPATCH(dt, (rmsnorm_forward_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                         (T *)out, rstd, (const T *)a, (const T *)weight, N, C, eps, (T *)res,
                         (const T *)b)));
    }
}

static void colsum(int mode, int dt, int gdt, void *g, const void *x, const void *inp,
                   const float *mean, const float *rstd, int64_t N, int64_t C,
                   cudaStream_t s) {
    if (C == 0) return;
    dim3 grid((unsigned)((C + 31) / 32)), block(32, 8);
    DISPATCH_G(dt, gdt, (colsum_k<T, G><<<grid, block, 0, s>>>(
                            (G *)g, (const T *)x, (const T *)inp, mean, rstd, mode, N, C)));
}

void l3d_cuk_layernorm_backward(int dt, int gdt, void *dinp, void *dweight, void *dbias,
                                const void *dout, const void *inp, const void *weight,
                                const float *mean, const float *rstd, int64_t N, int64_t C,
                                void *stream) {
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(N, kRowWarps);
    if (L.blocks == 0) return;
    if (dinp)
        DISPATCH(dt, (layernorm_dinp_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                         (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean,
                         rstd, N, C)));
    if (dweight) colsum(1, dt, gdt, dweight, dout, inp, mean, rstd, N, C, ST(stream));
    if (dbias) colsum(0, dt, gdt, dbias, dout, NULL, NULL, NULL, N, C, ST(stream));
}

void l3d_cuk_colsum_add(int dt, int gdt, void *g, const void *x, int64_t N, int64_t C,
                        void *stream) {
    colsum(0, dt, gdt, g, x, NULL, NULL, NULL, N, C, ST(stream));
}

void l3d_cuk_attn_forward(int dt, void *out, float *lse, const void *q, const void *k,
                          const void *v, const struct l3d_cuk_attn *g, void *stream) {
    int64_t rows = g->B * g->NH * g->nq;
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(rows, kRowWarps);
    if (L.blocks == 0) return;
    DISPATCH(dt, PER_LANE(g->HS, (attn_forward_k<P, T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                                     (T *)out, lse, (const T *)q, (const T *)k, (const T *)v, *g,
                                     rows))));
}

/* D, then dQ (a warp a query row), then dK and dV (a warp a key row of each key/value head) */
void l3d_cuk_attn_backward(int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const void *out, const float *lse,
                           float *D, const struct l3d_cuk_attn *g, void *stream) {
    int64_t rows = g->B * g->NH * g->nq, krows = g->B * (g->NH / g->grp) * g->nk;
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(rows, kRowWarps);
    struct l3d_cuda_launch K = l3d_cuda_launch_rows(krows, kRowWarps);
    if (L.blocks == 0 || K.blocks == 0) return;
    cudaStream_t s = ST(stream);
    DISPATCH(dt, PER_LANE(g->HS, {
        attn_D_k<P, T><<<L.blocks, L.threads, 0, s>>>(D, (const T *)dout, (const T *)out, *g,
                                                      rows);
        attn_dq_k<P, T><<<L.blocks, L.threads, 0, s>>>((T *)dq, (const T *)dout, (const T *)q,
                                                       (const T *)k, (const T *)v, lse, D, *g,
                                                       rows);
        attn_dkv_k<P, T><<<K.blocks, K.threads, 0, s>>>((T *)dk, (T *)dv, (const T *)dout,
                                                        (const T *)q, (const T *)k, (const T *)v,
                                                        lse, D, *g, krows);
    }));
}

void l3d_cuk_attn_merge(int dt, void *out, float *lse, const void *out2, const float *lse2,
                        const struct l3d_cuk_attn *g, void *stream) {
    int64_t rows = g->B * g->NH * g->nq;
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(rows, kRowWarps);
    if (L.blocks == 0) return;
    DISPATCH(dt, (attn_merge_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)out, lse, (const T *)out2, lse2, *g, rows)));
}

void l3d_cuk_rmsnorm_forward(int dt, void *out, float *rstd, const void *inp, const void *weight,
                             int64_t N, int64_t C, float eps, void *stream) {
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(N, kRowWarps);
    if (L.blocks == 0) return;
    DISPATCH(dt, (rmsnorm_forward_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)out, rstd, (const T *)inp, (const T *)weight, N, C, eps, (T *)NULL,
                     (const T *)NULL)));
}

void l3d_cuk_rmsnorm_backward(int dt, int gdt, void *dinp, void *dweight, const void *dout,
                              const void *inp, const void *weight, const float *rstd, int64_t N,
                              int64_t C, void *stream) {
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(N, kRowWarps);
    if (L.blocks == 0) return;
    if (dinp)
        DISPATCH(dt, (rmsnorm_dinp_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                         (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, rstd, N,
                         C)));
    if (dweight) colsum(1, dt, gdt, dweight, dout, inp, NULL, rstd, N, C, ST(stream));
}

void l3d_cuk_rope(int dt, void *qkv, const float *inv_freq, const int32_t *pos, int64_t B,
                  int64_t T_, int64_t NH, int64_t NKV, int64_t HS, float sign, void *stream) {
    LAUNCH_1D(B * T_ * (NH + NKV) * (HS / 2), 256);
    DISPATCH(dt, (rope_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)qkv, inv_freq, pos, T_, NH + NKV, (NH + 2 * NKV) * HS, HS, sign,
                     B * T_ * (NH + NKV) * (HS / 2))));
}

void l3d_cuk_swiglu(int dt, void *out, void *dinp, const void *dout, const void *inp, int64_t N,
                    int64_t H, void *stream) {
    LAUNCH_1D(N * H, 256);
    DISPATCH(dt, (swiglu_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)out, (T *)dinp, (const T *)dout, (const T *)inp, H, N * H)));
}

void l3d_cuk_elementwise(int op, int dt, void *out, const void *a, const void *b, int64_t N,
                         void *stream) {
    LAUNCH_1D(N, 256);
    DISPATCH(dt, (elementwise_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     op, (T *)out, (const T *)a, (const T *)b, N)));
}

void l3d_cuk_add_bias(int dt, void *out, const void *bias, int64_t N, int64_t C, void *stream) {
    LAUNCH_1D(N * C, 256);
    DISPATCH(dt, (add_bias_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>((T *)out,
                                                                       (const T *)bias, C,
                                                                       N * C)));
}

void l3d_cuk_xent(int pass, int dt, void *logits, float *out, float *tlogit, const float *maxv,
                  const float *sumexp, const int32_t *targets, float dloss, int64_t vocab_start,
                  int64_t N, int64_t Vl, int64_t Vvalid, void *stream) {
    if (N == 0) return;
    DISPATCH(dt, (xent_k<T><<<(unsigned)N, 256, 0, ST(stream)>>>(
                     pass, (T *)logits, out, tlogit, maxv, sumexp, targets, dloss, vocab_start,
                     Vl, Vvalid)));
}

void l3d_cuk_xent_loss(float *losses, double *loss_sum, const float *maxv, const float *sumexp,
                       const float *tlogit, int64_t N, void *stream) {
    LAUNCH_1D(N, 256);
    xent_losses_k<<<L.blocks, L.threads, 0, ST(stream)>>>(losses, maxv, sumexp, tlogit, N);
    xent_sum_k<<<1, 1, 0, ST(stream)>>>(loss_sum, losses, N);
}

void l3d_cuk_adamw(int dt, int gdt, void *param, float *master, float *m, float *v, void *grad,
                   bool zero, float grad_scale, int64_t n, float lr, float beta1, float beta2,
                   float eps, float wd, float bc1, float bc2, void *stream) {
    LAUNCH_1D(n, 256);
    DISPATCH_G(dt, gdt, (adamw_k<T, G><<<L.blocks, L.threads, 0, ST(stream)>>>(
                            (T *)param, master, m, v, (G *)grad, zero, grad_scale, n, lr, beta1,
                            beta2, eps, wd, bc1, bc2)));
}

void l3d_cuk_sumsq(int dt, double *acc, const void *x, int64_t n, double *partials,
                   void *stream) {
    struct l3d_cuda_launch L = l3d_cuda_launch_1d(n, 256, L3D_CUK_PARTIALS);
    if (L.blocks == 0) return;
    DISPATCH(dt, (sumsq_part_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(partials,
                                                                         (const T *)x, n)));
    sumsq_final_k<<<1, 1, 0, ST(stream)>>>(acc, partials, L.blocks);
}

void l3d_cuk_convert(int dst_t, void *dst, int src_t, const void *src, int64_t n, void *stream) {
    LAUNCH_1D(n, 256);
    DISPATCH(dst_t, {
        typedef T D;
        DISPATCH(src_t, (convert_k<D, T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                            (D *)dst, (const T *)src, n)));
    });
}

void l3d_cuk_unscale(int dt, float *found_inf, void *x, float inv_scale, int64_t n,
                     void *stream) {
    LAUNCH_1D(n, 256);
    DISPATCH(dt, (unscale_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(found_inf, (T *)x,
                                                                      inv_scale, n)));
}

} /* extern "C" */
