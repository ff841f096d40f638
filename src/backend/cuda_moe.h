/*
 * The per-token and per-expert arithmetic of the CUDA backend's mixture-of-experts kernels
 * (cuda_moe.cu), written once for the host and the device: the kernels call these functions one
 * thread a token (or once for the experts' offsets), and tests/cuda/test_cuda_host.c runs the very
 * same functions on the host against the CPU backend's kernels (src/backend/cpu_moe.c), so the
 * routing rules (top-k order and ties, renormalisation, capacity, the router's gradient with the
 * auxiliary losses) are checked without a GPU; the device's products and reductions are not.
 * Semantics: include/llm3d/backend.h, "mixture of experts". Plain C for the host, nvcc for both.
 */
#ifndef LLM3D_BACKEND_CUDA_MOE_H
#define LLM3D_BACKEND_CUDA_MOE_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define L3D_MOE_FN static inline __host__ __device__
#else
#define L3D_MOE_FN static inline
#endif

/* One token's routing from its router logits (E, fp32) in p, which become their softmax (in
 * place): idx (K) the K most probable experts, most probable first, a tie going to the lower
 * expert index (an expert replaces the running best only when strictly more probable, and the
 * experts are visited in index order); w (K) their probabilities, divided by their sum when
 * norm_topk. forced (K; NULL: the top-k) replaces the selection (--moe-force-balance): idx =
 * forced, the weights the probabilities there. Returns the logits' log-sum-exp. K <= E. */
L3D_MOE_FN float l3d_moe_route_row(float *p, int32_t *idx, float *w, const int32_t *forced,
                                   int64_t E, int64_t K, int norm_topk) {
    float top = p[0];
    for (int64_t e = 1; e < E; e++) top = p[e] > top ? p[e] : top;
    float z = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        p[e] = expf(p[e] - top);
        z += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] = p[e] / z;
    float chosen = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        int32_t pick = forced ? forced[k] : -1;
        for (int64_t e = 0; !forced && e < E; e++) {
            int64_t j = 0;
            while (j < k && idx[j] != e) j++;
            if (j == k && (pick < 0 || p[e] > p[pick])) pick = (int32_t)e;
        }
        idx[k] = pick;
        w[k] = p[pick];
        chosen += w[k];
    }
    for (int64_t k = 0; norm_topk && k < K; k++) w[k] = w[k] / chosen;
    return top + logf(z);
}

/* The assignments an expert keeps of the `routed` it has in a segment whose count starts at fill
 * (its assignments before the segment elsewhere in the micro-batch): all when dropless
 * (capacity <= 0), else what is left of the capacity, at most routed. */
L3D_MOE_FN int32_t l3d_moe_kept(int64_t routed, int32_t fill, int64_t capacity) {
    if (capacity <= 0) return (int32_t)routed;
    int64_t left = capacity - fill;
    return (int32_t)(left < 0 ? 0 : left < routed ? left : routed);
}

/* The counting sort's offsets, in place: cnt (E+1, int32) holds each expert's kept assignments
 * in cnt[0..E) and becomes where each expert's rows start (cnt[E]: the rows kept in all);
 * stats[e] holds its assignments before drops, and stats[2E+1] becomes the assignments dropped. */
L3D_MOE_FN void l3d_moe_offsets(int32_t *cnt, float *stats, int64_t E) {
    int32_t row = 0;
    float dropped = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        int32_t kept = cnt[e];
        dropped += stats[e] - (float)kept;
        cnt[e] = row;
        row += kept;
    }
    cnt[E] = row;
    stats[2 * E + 1] = dropped;
}

/* The row of an expert's assignment number `rank` (0-based, in token order) of a segment whose
 * count starts at fill and whose kept rows start at row0: -1 when the capacity (> 0) is spent. */
L3D_MOE_FN int32_t l3d_moe_slot(int32_t row0, int32_t fill, int64_t rank, int64_t capacity) {
    return capacity > 0 && fill + rank >= capacity ? -1 : row0 + (int32_t)rank;
}

/* The bits set in m: the device's __popc, the host's builtin. */
L3D_MOE_FN int l3d_moe_popc(uint32_t m) {
#ifdef __CUDA_ARCH__
    return __popc(m);
#else
    return __builtin_popcount(m);
#endif
}

/* The rank (0-based, token order) of the assignment that lane `lane` of warp `wid` holds in a
 * chunk of an expert's walk over the assignments: `seen` of the expert's in the chunks before, the
 * counts of the warps before this one (in_warp[0..wid)), and the lanes before this one whose
 * assignment is the expert's (m: the warp's ballot, bit l for lane l). */
L3D_MOE_FN int64_t l3d_moe_chunk_rank(int64_t seen, const int32_t *in_warp, int wid, uint32_t m,
                                      int lane) {
    int64_t rank = seen;
    for (int k = 0; k < wid; k++) rank += in_warp[k];
    return rank + l3d_moe_popc(m & ((1u << lane) - 1u));
}

/* One token's router-logit gradient dl (E, =) from its top-k weights' gradient dw (K): first the
 * gradient of each probability (the load-balancing loss's aux_scale x stats[e] on every expert,
 * plus the chosen experts' dw, through the renormalisation w_k = p_k / S when norm_topk:
 * (dw_k - sum_j dw_j w_j) / S), then through the softmax (p_e (g_e - sum_j p_j g_j)), plus the
 * z-loss's z_scale x lse x p_e. p (E) the probabilities, idx, w (K) the routing. */
L3D_MOE_FN void l3d_moe_dlogits_row(float *dl, const float *dw, const float *p, float lse,
                                    const int32_t *idx, const float *w, const float *stats,
                                    int64_t E, int64_t K, int norm_topk, float aux_scale,
                                    float z_scale) {
    float S = 0.0f, back = 0.0f;
    for (int64_t k = 0; norm_topk && k < K; k++) {
        S += p[idx[k]];
        back += dw[k] * w[k];
    }
    for (int64_t e = 0; e < E; e++) dl[e] = aux_scale * stats[e];
    for (int64_t k = 0; k < K; k++) dl[idx[k]] += norm_topk ? (dw[k] - back) / S : dw[k];
    float mean = 0.0f;
    for (int64_t e = 0; e < E; e++) mean += p[e] * dl[e];
    for (int64_t e = 0; e < E; e++) dl[e] = p[e] * (dl[e] - mean) + z_scale * lse * p[e];
}

#endif
