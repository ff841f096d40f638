/*
 * The CPU backend's mixture-of-experts kernels (include/llm3d/backend.h, "mixture of experts"):
 * the router (its product, softmax, top-k and the stable counting sort by expert), the gather of
 * token rows into expert order, the weighted combine back and their backward. Plain OpenMP loops
 * over tokens: a router is E x C a token (E a few dozen at most), so it is a small part of a MoE
 * layer, whose expert products go through the backend's matmul. Every sum is fp32 (the router's
 * probabilities, logits and their gradients are fp32 in every precision); a 16-bit output is
 * rounded once.
 */
#include <math.h>
#include <string.h>

#include "backend-impl.h"
#include "backend/cpu_attn16.h"

/* one element as fp32, and back rounded once (cpu_attn16.h), under short names */
#define ld l3d_cpu_ld
#define st l3d_cpu_st

static void check_types(const char *kernel, enum l3d_dtype dt) {
    if (dt != L3D_F32 && dt != L3D_BF16 && dt != L3D_F16)
        l3d_backend_no_variant("cpu", kernel, dt);
}

/* One token's router: logits (fp32 sums of the dt operands), softmax into p (E), its log-sum-exp,
 * and the K largest probabilities' experts (largest first; ties: the lower expert index first,
 * as the strict > below keeps the earlier one), or the K of forced (NULL: none; the softmax is
 * the same, the selection alone is replaced), with their weights, renormalised when asked. */
static float route_token(float *p, int32_t *idx, float *w, const int32_t *forced, const void *x,
                         const void *weight, enum l3d_dtype dt, int64_t n, int64_t C, int64_t E,
                         int64_t K, int norm_topk) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; e++) {
        float s = 0.0f;
        for (int64_t c = 0; c < C; c++) s += ld(dt, x, n * C + c) * ld(dt, weight, e * C + c);
        p[e] = s;
        if (s > mx) mx = s;
    }
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) sum += p[e] = expf(p[e] - mx);
    for (int64_t e = 0; e < E; e++) p[e] /= sum;
    float wsum = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        int32_t best = forced ? forced[k] : -1;
        for (int64_t e = 0; !forced && e < E; e++) {
            bool taken = false;
            for (int64_t j = 0; j < k; j++) taken |= idx[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = (int32_t)e;
        }
        L3D_ASSERT(best >= 0 && best < E); /* a forced expert out of range: the caller's error */
        idx[k] = best;
        w[k] = p[best];
        wsum += w[k];
    }
    if (norm_topk)
        for (int64_t k = 0; k < K; k++) w[k] /= wsum;
    return mx + logf(sum);
}

/* The stable counting sort of the n assignments idx (N K, token order) by expert, in integers
 * (exact past fp32's 2^24), the capacity included: segment s (per assignments each) starts
 * expert e's count at start[s E + e] (NULL: 0), so an assignment is kept while the expert's count
 * before it, those earlier in the micro-batch on other ranks included, is under the capacity. Two
 * passes: which are kept (pos = the rank among the expert's kept ones here), then the rows from
 * the offsets. work (3E): each expert's assignments (all), its running count, its kept ones. */
int64_t l3d_cpu_moe_sort(const int32_t *idx, int64_t n, int64_t E, int64_t capacity,
                         const int32_t *start, int64_t per, int32_t *work, int32_t *offsets,
                         int32_t *pos) {
    int32_t *count = work, *seen = work + E, *kept = work + 2 * E;
    memset(count, 0, (size_t)E * sizeof *count);
    memset(kept, 0, (size_t)E * sizeof *kept);
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t e = idx[i];
        if (i % per == 0)
            for (int64_t x = 0; x < E; x++) seen[x] = start ? start[(i / per) * E + x] : 0;
        count[e]++;
        if (capacity > 0 && seen[e]++ >= capacity) {
            pos[i] = -1;
            dropped++;
            continue;
        }
        pos[i] = kept[e]++;
    }
    offsets[0] = 0;
    for (int64_t e = 0; e < E; e++) offsets[e + 1] = offsets[e] + kept[e];
    for (int64_t i = 0; i < n; i++)
        if (pos[i] >= 0) pos[i] += offsets[idx[i]];
    return dropped;
}

void l3d_cpu_moe_route(void *ctx, enum l3d_dtype dt, float *probs, float *lse, int32_t *idx,
                       float *wts, int32_t *pos, int32_t *offsets, float *stats, int32_t *work,
                       const void *inp, const void *weight, int64_t N, int64_t C, int64_t E,
                       int64_t K, int norm_topk, int64_t capacity, const int32_t *fill,
                       int64_t segs, const int32_t *forced) {
    (void)ctx;
    check_types("moe_route", dt);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        lse[n] = route_token(probs + n * E, idx + n * K, wts + n * K,
                             forced ? forced + n * K : NULL, inp, weight, dt, n, C, E, K,
                             norm_topk);
    /* the counting sort in token order (sequential: N K integer steps), its counts in the
     * caller's workspace: no allocation in the step */
    int64_t dropped = l3d_cpu_moe_sort(idx, N * K, E, capacity, fill, N / segs * K, work, offsets,
                                       pos);
    for (int64_t e = 0; e < E; e++) stats[e] = (float)work[e];
    double z = 0.0;
    for (int64_t e = 0; e < E; e++) {
        double s = 0.0;
        for (int64_t n = 0; n < N; n++) s += probs[n * E + e];
        stats[E + e] = (float)s;
    }
    for (int64_t n = 0; n < N; n++) z += (double)lse[n] * lse[n];
    stats[2 * E] = (float)z;
    stats[2 * E + 1] = (float)dropped;
}

void l3d_cpu_moe_permute(void *ctx, enum l3d_dtype dt, void *rows, const void *inp,
                         const int32_t *pos, int64_t N, int64_t K, int64_t C) {
    (void)ctx;
    check_types("moe_permute", dt);
    size_t row = (size_t)C * (dt == L3D_F32 ? 4 : 2);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * K; i++)
        if (pos[i] >= 0)
            memcpy((char *)rows + (size_t)pos[i] * row, (const char *)inp + (size_t)(i / K) * row,
                   row);
}

void l3d_cpu_moe_combine(void *ctx, enum l3d_dtype dt, void *out, const void *rows,
                         const int32_t *pos, const float *wts, int64_t N, int64_t K, int64_t C) {
    (void)ctx;
    check_types("moe_combine", dt);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            float s = ld(dt, out, n * C + c);
            for (int64_t k = 0; k < K; k++) {
                int32_t r = pos[n * K + k];
                if (r >= 0) s += (wts ? wts[n * K + k] : 1.0f) * ld(dt, rows, (int64_t)r * C + c);
            }
            st(dt, out, n * C + c, s);
        }
}

void l3d_cpu_moe_combine_backward(void *ctx, enum l3d_dtype dt, void *drows, float *dwts,
                                  const void *dout, const void *rows, const int32_t *pos,
                                  const float *wts, int64_t N, int64_t K, int64_t C) {
    (void)ctx;
    check_types("moe_combine_backward", dt);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * K; i++) {
        int64_t n = i / K, r = pos[i];
        float d = 0.0f;
        for (int64_t c = 0; r >= 0 && c < C; c++) {
            float g = ld(dt, dout, n * C + c);
            d += g * ld(dt, rows, r * C + c);
            st(dt, drows, r * C + c, wts[i] * g);
        }
        dwts[i] = d;
    }
}

/* One token's router-logit gradient (E) from its top-k weights' gradient dw (K): through the
 * renormalisation, the softmax, and the two auxiliary losses (see l3d_be_moe_router_backward). */
static void router_dlogits(float *dl, const float *dw, const float *p, float lse,
                           const int32_t *idx, const float *w, const float *stats, int64_t E,
                           int64_t K, int norm_topk, float aux_scale, float z_scale) {
    for (int64_t e = 0; e < E; e++) dl[e] = aux_scale * stats[e]; /* dP first, in dl */
    if (norm_topk) { /* w_k = p_k / S: dp_k = (dw_k - sum_j dw_j w_j) / S */
        float S = 0.0f, dot = 0.0f;
        for (int64_t k = 0; k < K; k++) S += p[idx[k]], dot += dw[k] * w[k];
        for (int64_t k = 0; k < K; k++) dl[idx[k]] += (dw[k] - dot) / S;
    } else {
        for (int64_t k = 0; k < K; k++) dl[idx[k]] += dw[k];
    }
    float dot = 0.0f;
    for (int64_t e = 0; e < E; e++) dot += p[e] * dl[e];
    for (int64_t e = 0; e < E; e++) dl[e] = p[e] * (dl[e] - dot) + z_scale * lse * p[e];
}

void l3d_cpu_moe_router_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                 void *dweight, float *dlogits, const float *dwts,
                                 const void *inp, const void *weight, const float *probs,
                                 const float *lse, const int32_t *idx, const float *wts,
                                 const float *stats, int64_t N, int64_t C, int64_t E, int64_t K,
                                 int norm_topk, float aux_scale, float z_scale) {
    (void)ctx;
    check_types("moe_router_backward", dt);
    if (gdt != dt && gdt != L3D_F32) l3d_backend_no_variant("cpu", "moe_router_backward", gdt);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float *dl = dlogits + n * E;
        router_dlogits(dl, dwts + n * K, probs + n * E, lse[n], idx + n * K, wts + n * K, stats,
                       E, K, norm_topk, aux_scale, z_scale);
        for (int64_t c = 0; dinp && c < C; c++) {
            float s = ld(dt, dinp, n * C + c);
            for (int64_t e = 0; e < E; e++) s += dl[e] * ld(dt, weight, e * C + c);
            st(dt, dinp, n * C + c, s);
        }
    }
    if (!dweight) return;
#pragma omp parallel for schedule(static)
    for (int64_t ec = 0; ec < E * C; ec++) {
        int64_t e = ec / C, c = ec % C;
        float s = 0.0f;
        for (int64_t n = 0; n < N; n++) s += dlogits[n * E + e] * ld(dt, inp, n * C + c);
        st(gdt, dweight, ec, ld(gdt, dweight, ec) + s);
    }
}
