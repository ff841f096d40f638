/*
 * The CUDA backend's mixture-of-experts kernels (launchers in cuda_kernels.h; semantics
 * include/llm3d/backend.h, "mixture of experts"). EXPERIMENTAL: compiled with -Werror in every
 * CI run, never yet run on a GPU; tests/cuda/test_cuda_kernels.c compares each with the CPU
 * backend (src/backend/cpu_moe.c) the first time a GPU is at hand (scripts/gpu-check.sh).
 *
 * The router: its product one warp a token (each expert's dot summed over the lanes in fp32),
 * then one thread a token for the softmax, the top-k and the weights (l3d_moe_route_row, the same
 * function tests/cuda/test_cuda_host.c runs on the host); then one block an expert walks the
 * assignments in token order, segment by segment (a warp ballot and a block prefix a chunk),
 * twice: first counting each expert's assignments and the rows it keeps, then, after the offsets
 * by one thread (E steps), giving each assignment its row: the CPU's stable counting sort,
 * capacity and starting fills included, without a copy to the host. The statistics are a block an expert (its probabilities summed over the tokens, in
 * double, a fixed tree) and one for the lse^2 sum. Gather, combine and its backward: a thread an
 * element or a warp an assignment, every sum in fp32 in the CPU's order over k. The router's
 * backward: one thread a token for dlogits (l3d_moe_dlogits_row), a thread an element of dinp
 * (E terms in expert order), and dweight as the norms' column sums (32 columns a block by 8 row
 * lanes, added in lane order). No atomics on floating point: a run repeats bit for bit.
 *
 * The router is E x C a token, a small part of a MoE layer, whose expert products go through the
 * backend's matmul (cuBLASLt), one product an expert's rows (src/model/moe.c).
 */
#include <math.h>
#include <stdint.h>

#include "backend/cuda_device.cuh"
#include "backend/cuda_moe.h"

/* ---- the router ------------------------------------------------------------------------------- */

/* logits (N,E) fp32 into probs = inp (N,C) weight (E,C)^T: one warp a token */
template <typename T>
__global__ void moe_logits_k(float *logits, const T *inp, const T *w, int64_t N, int64_t C,
                             int64_t E) {
    const int64_t n = warp_row();
    const int lane = warp_lane();
    if (n >= N) return;
    const T *x = inp + n * C;
    for (int64_t e = 0; e < E; e++) {
        float s = 0.0f;
        for (int64_t c = lane; c < C; c += 32) s += ld(x + c) * ld(w + e * C + c);
        s = warp_sum(s);
        if (lane == 0) logits[n * E + e] = s;
    }
}

/* one thread a token: softmax, lse, top-k (or the forced experts) and weights */
__global__ void moe_route_k(float *probs, float *lse, int32_t *idx, float *wts,
                            const int32_t *forced, int64_t N, int64_t E, int64_t K,
                            int norm_topk) {
    GRID_STRIDE(n, N) {
        lse[n] = l3d_moe_route_row(probs + n * E, idx + n * K, wts + n * K,
                                   forced ? forced + n * K : NULL, E, K, norm_topk);
    }
}

__global__ void moe_offsets_k(int32_t *cnt, float *stats, int64_t E) {
    l3d_moe_offsets(cnt, stats, E);
}

/* One block (kMoeThreads) an expert: its assignments in token order, segment by segment (per
 * assignments each, the count of segment s starting at fill[s E + e], 0 without fill), a chunk
 * of blockDim at a time, each ranked within its segment by l3d_moe_chunk_rank from its warp's
 * ballot and the counts of the warps before it. Counting (pos NULL): cnt[e] = the kept rows
 * (l3d_moe_kept a segment), stats[e] = the assignments; placing: pos of each = l3d_moe_slot. */
static const int kMoeThreads = 256;
__global__ void moe_slot_k(int32_t *pos, int32_t *cnt, float *stats, const int32_t *idx,
                           const int32_t *offsets, const int32_t *fill, int64_t NK, int64_t per,
                           int64_t E, int64_t capacity) {
    __shared__ int32_t in_warp[32];
    const int32_t e = (int32_t)blockIdx.x;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int64_t row = 0, routed = 0; /* this expert's kept rows and assignments in the segments before */
    for (int64_t s0 = 0; s0 < NK; s0 += per) {
        const int32_t f = fill ? fill[(s0 / per) * E + e] : 0;
        int64_t seen = 0; /* this expert's assignments in the segment's chunks before */
        for (int64_t base = s0; base < s0 + per; base += blockDim.x) {
            const int64_t i = base + threadIdx.x;
            const bool mine = i < s0 + per && idx[i] == e;
            const uint32_t m = __ballot_sync(0xffffffffu, mine);
            if (lane == 0) in_warp[wid] = __popc(m);
            __syncthreads();
            if (mine && pos)
                pos[i] = l3d_moe_slot(offsets[e] + (int32_t)row, f,
                                      l3d_moe_chunk_rank(seen, in_warp, wid, m, lane), capacity);
            for (int k = 0; k < nw; k++) seen += in_warp[k];
            __syncthreads();
        }
        row += l3d_moe_kept(seen, f, capacity);
        routed += seen;
    }
    if (!pos && threadIdx.x == 0) {
        cnt[e] = (int32_t)row;
        stats[e] = (float)routed;
    }
}

/* Block b < E: stats[E + b] = expert b's probabilities summed over the tokens; block E:
 * stats[2E] = the sum of lse^2. In double, per thread then a fixed tree. */
__global__ void moe_stats_k(float *stats, const float *probs, const float *lse, int64_t N,
                            int64_t E) {
    __shared__ double part[kMoeThreads];
    const int64_t b = blockIdx.x;
    double s = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        double x = b < E ? (double)probs[n * E + b] : (double)lse[n];
        s += b < E ? x : x * x;
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) stats[E + b] = (float)part[0];
}

/* ---- gather, combine -------------------------------------------------------------------------- */

template <typename T>
__global__ void moe_permute_k(T *rows, const T *inp, const int32_t *pos, int64_t K, int64_t C,
                              int64_t n) {
    GRID_STRIDE(i, n) {
        const int64_t a = i / C, c = i % C, r = pos[a];
        if (r >= 0) rows[r * C + c] = inp[(a / K) * C + c];
    }
}

/* out (N,C) += sum over the kept k of w rows[pos], in k order, rounded once */
template <typename T>
__global__ void moe_combine_k(T *out, const T *rows, const int32_t *pos, const float *wts,
                              int64_t K, int64_t C, int64_t n) {
    GRID_STRIDE(i, n) {
        const int64_t t = i / C, c = i % C;
        float s = ld(out + i);
        for (int64_t k = 0; k < K; k++) {
            const int64_t r = pos[t * K + k];
            if (r >= 0) s += (wts ? wts[t * K + k] : 1.0f) * ld(rows + r * C + c);
        }
        st(out + i, s);
    }
}

/* one warp an assignment: drows row = w dout[token] (=), dwts = dout[token] . rows[row] (=) */
template <typename T>
__global__ void moe_combine_backward_k(T *drows, float *dwts, const T *dout, const T *rows,
                                       const int32_t *pos, const float *wts, int64_t K,
                                       int64_t C, int64_t NK) {
    const int64_t a = warp_row();
    const int lane = warp_lane();
    if (a >= NK) return;
    const int64_t r = pos[a];
    const T *g = dout + (a / K) * C;
    float d = 0.0f;
    for (int64_t c = lane; r >= 0 && c < C; c += 32) {
        float gc = ld(g + c);
        d += gc * ld(rows + r * C + c);
        st(drows + r * C + c, wts[a] * gc);
    }
    d = warp_sum(d);
    if (lane == 0) dwts[a] = d;
}

/* ---- the router's backward -------------------------------------------------------------------- */

__global__ void moe_dlogits_k(float *dlogits, const float *dwts, const float *probs,
                              const float *lse, const int32_t *idx, const float *wts,
                              const float *stats, int64_t N, int64_t E, int64_t K, int norm_topk,
                              float aux_scale, float z_scale) {
    GRID_STRIDE(n, N) {
        l3d_moe_dlogits_row(dlogits + n * E, dwts + n * K, probs + n * E, lse[n], idx + n * K,
                            wts + n * K, stats, E, K, norm_topk, aux_scale, z_scale);
    }
}

/* dinp (N,C) += dlogits (N,E) weight (E,C), the E terms in expert order */
template <typename T>
__global__ void moe_router_dinp_k(T *dinp, const float *dlogits, const T *w, int64_t E,
                                  int64_t C, int64_t n) {
    GRID_STRIDE(i, n) {
        const int64_t t = i / C, c = i % C;
        float s = ld(dinp + i);
        for (int64_t e = 0; e < E; e++) s += dlogits[t * E + e] * ld(w + e * C + c);
        st(dinp + i, s);
    }
}

/* dweight (E,C) += dlogits^T inp: block (column chunk, expert), 32 columns by 8 row lanes */
template <typename T, typename G>
__global__ void moe_router_dweight_k(G *dw, const float *dlogits, const T *inp, int64_t N,
                                     int64_t C, int64_t E) {
    __shared__ float part[8][33];
    const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x, e = blockIdx.y;
    float s = 0.0f;
    if (c < C)
        for (int64_t n = threadIdx.y; n < N; n += 8) s += dlogits[n * E + e] * ld(inp + n * C + c);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float a = part[0][threadIdx.x];
        for (int k = 1; k < 8; k++) a += part[k][threadIdx.x];
        G *g = dw + e * C + c;
        st(g, ld(g) + a);
    }
}

/* ---- launchers -------------------------------------------------------------------------------- */

extern "C" {

void l3d_cuk_moe_route(int dt, float *probs, float *lse, int32_t *idx, float *wts, int32_t *pos,
                       int32_t *offsets, float *stats, const void *inp, const void *weight,
                       int64_t N, int64_t C, int64_t E, int64_t K, int norm_topk,
                       int64_t capacity, const int32_t *fill, int64_t segs,
                       const int32_t *forced, void *stream) {
    cudaStream_t s = ST(stream);
    struct l3d_cuda_launch R = l3d_cuda_launch_rows(N, 4);
    if (R.blocks > 0) {
        DISPATCH(dt, (moe_logits_k<T><<<R.blocks, R.threads, 0, s>>>(
                         probs, (const T *)inp, (const T *)weight, N, C, E)));
        struct l3d_cuda_launch L = l3d_cuda_launch_1d(N, 128, kMaxBlocks);
        moe_route_k<<<L.blocks, L.threads, 0, s>>>(probs, lse, idx, wts, forced, N, E, K,
                                                   norm_topk);
    }
    const int64_t per = N / segs * K;
    moe_slot_k<<<(unsigned)E, kMoeThreads, 0, s>>>(NULL, offsets, stats, idx, NULL, fill, N * K,
                                                  per, E, capacity);
    moe_offsets_k<<<1, 1, 0, s>>>(offsets, stats, E);
    moe_slot_k<<<(unsigned)E, kMoeThreads, 0, s>>>(pos, NULL, NULL, idx, offsets, fill, N * K,
                                                  per, E, capacity);
    moe_stats_k<<<(unsigned)(E + 1), kMoeThreads, 0, s>>>(stats, probs, lse, N, E);
}

void l3d_cuk_moe_permute(int dt, void *rows, const void *inp, const int32_t *pos, int64_t N,
                         int64_t K, int64_t C, void *stream) {
    LAUNCH_1D(N * K * C, 256);
    DISPATCH(dt, (moe_permute_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)rows, (const T *)inp, pos, K, C, N * K * C)));
}

void l3d_cuk_moe_combine(int dt, void *out, const void *rows, const int32_t *pos,
                         const float *wts, int64_t N, int64_t K, int64_t C, void *stream) {
    LAUNCH_1D(N * C, 256);
    DISPATCH(dt, (moe_combine_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)out, (const T *)rows, pos, wts, K, C, N * C)));
}

void l3d_cuk_moe_combine_backward(int dt, void *drows, float *dwts, const void *dout,
                                  const void *rows, const int32_t *pos, const float *wts,
                                  int64_t N, int64_t K, int64_t C, void *stream) {
    struct l3d_cuda_launch L = l3d_cuda_launch_rows(N * K, 4);
    if (L.blocks == 0) return;
    DISPATCH(dt, (moe_combine_backward_k<T><<<L.blocks, L.threads, 0, ST(stream)>>>(
                     (T *)drows, dwts, (const T *)dout, (const T *)rows, pos, wts, K, C,
                     N * K)));
}

void l3d_cuk_moe_router_backward(int dt, int gdt, void *dinp, void *dweight, float *dlogits,
                                 const float *dwts, const void *inp, const void *weight,
                                 const float *probs, const float *lse, const int32_t *idx,
                                 const float *wts, const float *stats, int64_t N, int64_t C,
                                 int64_t E, int64_t K, int norm_topk, float aux_scale,
                                 float z_scale, void *stream) {
    cudaStream_t s = ST(stream);
    struct l3d_cuda_launch L = l3d_cuda_launch_1d(N, 128, kMaxBlocks);
    if (L.blocks == 0) return; /* no token: nothing to add */
    moe_dlogits_k<<<L.blocks, L.threads, 0, s>>>(dlogits, dwts, probs, lse, idx, wts, stats, N,
                                                 E, K, norm_topk, aux_scale, z_scale);
    struct l3d_cuda_launch D = l3d_cuda_launch_1d(N * C, 256, kMaxBlocks);
    if (dinp && D.blocks > 0)
        DISPATCH(dt, (moe_router_dinp_k<T><<<D.blocks, D.threads, 0, s>>>(
                         (T *)dinp, dlogits, (const T *)weight, E, C, N * C)));
    if (dweight && C > 0) {
        dim3 grid((unsigned)((C + 31) / 32), (unsigned)E), block(32, 8);
        DISPATCH_G(dt, gdt, (moe_router_dweight_k<T, G><<<grid, block, 0, s>>>(
                                (G *)dweight, dlogits, (const T *)inp, N, C, E)));
    }
}

} /* extern "C" */
