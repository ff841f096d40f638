/*
 * The CUDA backend's host arithmetic (src/backend/cuda_host.c), checked without a GPU: built only
 * with -DL3D_CUDA=ON, ctest label nogpu (run by `make test` when nvcc exists). Every check compares
 * with values worked out by hand, and each family has a case that must be rejected.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda_host.h"
#include "backend/cuda_moe.h"
#include "llm3d/backend.h"
#include "test.h"

static void test_local_rank(void) {
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("SLURM_LOCALID");
    CHECK(l3d_cuda_env_local_rank() == -1);
    setenv("SLURM_LOCALID", "5", 1);
    CHECK(l3d_cuda_env_local_rank() == 5);
    setenv("MPI_LOCALRANKID", "2", 1); /* MPICH's before Slurm's */
    CHECK(l3d_cuda_env_local_rank() == 2);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1); /* Open MPI's first */
    CHECK(l3d_cuda_env_local_rank() == 3);
    /* negative: text that is not a non-negative integer is skipped, the next variable read */
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3x", 1);
    CHECK(l3d_cuda_env_local_rank() == 2);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "-1", 1);
    CHECK(l3d_cuda_env_local_rank() == 2);
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("SLURM_LOCALID");

    /* ranks 0..5 on nodes 0 0 1 0 1 1: local ranks 0 1 0 2 1 2 */
    const int node_of[6] = {0, 0, 1, 0, 1, 1}, want[6] = {0, 1, 0, 2, 1, 2};
    for (int r = 0; r < 6; r++) CHECK(l3d_cuda_local_rank_of(node_of, 6, r) == want[r]);

    CHECK(l3d_cuda_pick_device(0, 8) == 0);
    CHECK(l3d_cuda_pick_device(7, 8) == 7);
    CHECK(l3d_cuda_pick_device(9, 8) == 1); /* more ranks than devices: wrap */
    CHECK(l3d_cuda_pick_device(3, 1) == 0);
    CHECK(l3d_cuda_pick_device(-1, 4) == 0);
    CHECK(l3d_cuda_pick_device(2, 0) == -1); /* no device */
}

static void test_comm_choice(void) {
    int a, b;
    /* 4 ranks, 2 nodes, devices 0 1 on each: NCCL */
    const int node4[4] = {0, 0, 1, 1}, dev4[4] = {0, 1, 0, 1};
    CHECK(l3d_cuda_comm_choice(node4, dev4, 4, &a, &b) == L3D_CUDA_COMM_NCCL);
    CHECK(a == -1 && b == -1);
    /* the same device numbers on different nodes are different devices */
    const int node2[2] = {0, 1}, dev2[2] = {0, 0};
    CHECK(l3d_cuda_comm_choice(node2, dev2, 2, &a, &b) == L3D_CUDA_COMM_NCCL);
    /* negative: two ranks of one node on one device (2 ranks, 1 GPU): staged, naming them */
    const int node3[3] = {0, 0, 0}, dev3[3] = {0, 1, 1};
    CHECK(l3d_cuda_comm_choice(node3, dev3, 3, &a, &b) == L3D_CUDA_COMM_STAGED);
    CHECK(a == 1 && b == 2);
    /* the device picked by local rank mod devices: 2 ranks on a 1-GPU node share it */
    int d0 = l3d_cuda_pick_device(0, 1), d1 = l3d_cuda_pick_device(1, 1);
    const int one_node[2] = {0, 0};
    const int devs[2] = {d0, d1};
    CHECK(l3d_cuda_comm_choice(one_node, devs, 2, &a, &b) == L3D_CUDA_COMM_STAGED);
    CHECK(l3d_cuda_comm_choice(one_node, devs, 1, &a, &b) == L3D_CUDA_COMM_NCCL);
}

/* all_to_allv's grouped sends and receives over 4 ranks: uneven and empty blocks, gaps between
 * blocks, 2-byte elements; negative: an empty block is no transfer and does not widen the span,
 * even with its displacement past the data */
static void test_a2a(void) {
    struct l3d_cuda_xfer x[4];
    const int64_t cnt[4] = {3, 0, 5, 2}, dis[4] = {0, 99, 4, 10};
    CHECK(l3d_cuda_a2a_xfers(4, cnt, dis, 2, x) == 3);
    CHECK(x[0].peer == 0 && x[0].at == 0 && x[0].count == 3);
    CHECK(x[1].peer == 2 && x[1].at == 8 && x[1].count == 5);
    CHECK(x[2].peer == 3 && x[2].at == 20 && x[2].count == 2);
    CHECK(l3d_cuda_blocks_span(4, cnt, dis) == 12); /* not 99: block 1 is empty */
    const int64_t back[4] = {2, 0, 0, 7}, bdis[4] = {7, 0, 0, 0}; /* blocks in reverse order */
    CHECK(l3d_cuda_a2a_xfers(4, back, bdis, 4, x) == 2);
    CHECK(x[0].peer == 0 && x[0].at == 28 && x[1].peer == 3 && x[1].at == 0 && x[1].count == 7);
    CHECK(l3d_cuda_blocks_span(4, back, bdis) == 9);
    const int64_t none[4] = {0, 0, 0, 0};
    CHECK(l3d_cuda_a2a_xfers(4, none, dis, 8, x) == 0 && l3d_cuda_blocks_span(4, none, dis) == 0);
}

static void test_launch(void) {
    struct l3d_cuda_launch l = l3d_cuda_launch_1d(1000, 256, 4096);
    CHECK(l.blocks == 4 && l.threads == 256);
    l = l3d_cuda_launch_1d(1024, 256, 4096);
    CHECK(l.blocks == 4);
    l = l3d_cuda_launch_1d(1025, 256, 4096);
    CHECK(l.blocks == 5);
    l = l3d_cuda_launch_1d(0, 256, 4096);
    CHECK(l.blocks == 0);
    l = l3d_cuda_launch_1d((int64_t)1 << 40, 512, 8192); /* capped: the grid-stride loop covers */
    CHECK(l.blocks == 8192 && l.threads == 512);
    l = l3d_cuda_launch_rows(10, 4);
    CHECK(l.blocks == 3 && l.threads == 128);
    l = l3d_cuda_launch_rows(8, 4);
    CHECK(l.blocks == 2);
    CHECK(l3d_cuda_attn_per_lane(64) == 2);
    CHECK(l3d_cuda_attn_per_lane(8) == 1);
    CHECK(l3d_cuda_attn_per_lane(33) == 2);
    CHECK(l3d_cuda_attn_per_lane(256) == 8);
    /* negative: shapes the kernel cannot hold */
    CHECK(l3d_cuda_attn_per_lane(257) == 0);
    CHECK(l3d_cuda_attn_per_lane(0) == 0);
}

/* the table against a plain array of the live allocations, through growth and deletions in the
 * middle of probe runs */
static void test_allocs(void) {
    struct l3d_cuda_allocs t = {0};
    enum { N = 1000 };
    static uintptr_t addr[N];
    static size_t size[N];
    static bool live[N];
    size_t total = 0, count = 0, got = 0;
    for (int i = 0; i < N; i++) {
        /* distinct, scattered 256-byte aligned addresses (an odd multiplier is a bijection mod 2^20) */
        addr[i] = 0x7f0000000000u + (((uintptr_t)i * 2654435761u) & 0xfffff) * 256;
        size[i] = (size_t)(i + 1) * 100;
        l3d_cuda_allocs_add(&t, (void *)addr[i], size[i]);
        live[i] = true;
        total += size[i];
        count++;
    }
    CHECK(t.total == total && t.count == count);
    for (int i = 0; i < N; i += 3) { /* every third one freed */
        CHECK(l3d_cuda_allocs_remove(&t, (void *)addr[i], &got));
        CHECK(got == size[i]);
        live[i] = false;
        total -= size[i];
        count--;
    }
    CHECK(t.total == total && t.count == count);
    bool all_found = true;
    for (int i = 0; i < N; i++) {
        if (!live[i]) continue;
        size_t b = 0;
        all_found &= l3d_cuda_allocs_remove(&t, (void *)addr[i], &b) && b == size[i];
        l3d_cuda_allocs_add(&t, (void *)addr[i], size[i]); /* put back */
    }
    CHECK(all_found);
    /* negative: a freed pointer, a foreign one and NULL are not allocations */
    CHECK(!l3d_cuda_allocs_remove(&t, (void *)addr[0], &got));
    CHECK(!l3d_cuda_allocs_remove(&t, (void *)(addr[1] + 8), &got));
    CHECK(!l3d_cuda_allocs_remove(&t, NULL, &got));
    CHECK(t.total == total && t.count == count);
    l3d_cuda_allocs_free(&t);
    CHECK(t.count == 0 && t.total == 0);
}

/* the plan cache: hits, the filling order, then round-robin replacement once full */
static void test_plans(void) {
    struct l3d_cuda_plan_table t = {0};
    bool hit, evict;
    struct l3d_cuda_mm_key k = {1, 0, 768, 4096, 2304, 2, 2, 768, 768, 2304, 1, 256, 256, 256};
    CHECK(l3d_cuda_plan_slot(&t, &k, &hit, &evict) == 0 && !hit && !evict);
    CHECK(l3d_cuda_plan_slot(&t, &k, &hit, &evict) == 0 && hit && !evict);
    /* negative: a key that differs in one field (here only the alignment of A) is another plan */
    struct l3d_cuda_mm_key k2 = k;
    k2.align_a = 2;
    CHECK(l3d_cuda_plan_slot(&t, &k2, &hit, &evict) == 1 && !hit);
    k2 = k;
    k2.bias = 0;
    CHECK(l3d_cuda_plan_slot(&t, &k2, &hit, &evict) == 2 && !hit);
    for (int i = 3; i < L3D_CUDA_PLANS; i++) { /* fill the table: n = 1.. */
        struct l3d_cuda_mm_key ki = k;
        ki.n = i;
        CHECK(l3d_cuda_plan_slot(&t, &ki, &hit, &evict) == i && !hit && !evict);
    }
    CHECK(t.used == L3D_CUDA_PLANS);
    struct l3d_cuda_mm_key kn = k;
    kn.n = 100000; /* full: slot 0 is replaced, then 1 */
    CHECK(l3d_cuda_plan_slot(&t, &kn, &hit, &evict) == 0 && !hit && evict);
    CHECK(l3d_cuda_plan_slot(&t, &kn, &hit, &evict) == 0 && hit);
    CHECK(l3d_cuda_plan_slot(&t, &k, &hit, &evict) == 1 && !hit && evict); /* k was evicted */
    CHECK(t.used == L3D_CUDA_PLANS && t.next == 2);

    CHECK(l3d_cuda_align((void *)(uintptr_t)0x7f0000001000u) == 256);
    CHECK(l3d_cuda_align((void *)(uintptr_t)0x7f0000001080u) == 128);
    CHECK(l3d_cuda_align((void *)(uintptr_t)0x7f0000001006u) == 2);
    CHECK(l3d_cuda_align((void *)(uintptr_t)0x7f0000001001u) == 1);
}

static void test_peak(void) {
    const char *src;
    struct l3d_cuda_dev sxm = {"NVIDIA H100 80GB HBM3", 9, 0, 132, 1980000};
    CHECK_NEAR(l3d_cuda_peak(&sxm, L3D_BF16, &src), 989.4e12, 1e9);
    CHECK(src && strstr(src, "H100"));
    CHECK_NEAR(l3d_cuda_peak(&sxm, L3D_F32, &src), 66.9e12, 1e9);
    struct l3d_cuda_dev pcie = {"NVIDIA H100 PCIe", 9, 0, 114, 1755000};
    CHECK_NEAR(l3d_cuda_peak(&pcie, L3D_BF16, &src), 756.5e12, 1e9);
    struct l3d_cuda_dev h200 = {"NVIDIA H200", 9, 0, 132, 1980000};
    CHECK_NEAR(l3d_cuda_peak(&h200, L3D_F16, &src), 989.4e12, 1e9);
    /* not in the table: SMs x clock x 4096 (Hopper) */
    struct l3d_cuda_dev other = {"NVIDIA GH-something", 9, 0, 100, 1500000};
    CHECK_NEAR(l3d_cuda_peak(&other, L3D_BF16, &src), 100 * 1.5e9 * 4096, 1e6);
    CHECK(src && strstr(src, "SMs"));
    /* negative: types without products, and an architecture the backend has no rate for */
    CHECK(l3d_cuda_peak(&sxm, L3D_I32, &src) == 0.0 && src == NULL);
    struct l3d_cuda_dev old = {"Tesla V100", 7, 0, 80, 1530000};
    CHECK(l3d_cuda_peak(&old, L3D_BF16, &src) == 0.0);
}

/* ---- attention geometry: the kernels' walk on the host ------------------------------------------
 * The CUDA attention kernels' index arithmetic (cuda_kernels.cu: attn_row_of, attn_forward_k,
 * attn_D_k, attn_dq_k, attn_dkv_k: which rows, heads, keys and strides each warp reads and
 * writes) replayed in double on the host over the geometry l3d_cuda_attn_* builds, against the
 * CPU backend's kernels: each entry's layout is proven without a GPU, grouped-query heads, the
 * KV cache and the padded blocks of context parallelism included. */

struct emu {
    const struct l3d_cuk_attn *g;
    const float *q, *k, *v, *out, *dout, *lse;
};
static int64_t emu_last(const struct l3d_cuk_attn *g, int64_t i) {
    return g->p0 + i < g->nk - 1 ? g->p0 + i : g->nk - 1;
}
/* query row (b, h, i): its probabilities over keys 0..last into p (the row's lse from e->lse when
 * given, else computed and returned through *lse_out) */
static void emu_probs(const struct emu *e, int64_t b, int64_t h, int64_t i, double *p,
                      double *lse_out) {
    const struct l3d_cuk_attn *g = e->g;
    const float *qr = e->q + b * g->qb + i * g->qs + h * g->HS;
    const int64_t kvo = b * g->kb + h / g->grp * g->HS;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j <= emu_last(g, i); j++) {
        double s = 0;
        for (int64_t d = 0; d < g->HS; d++) s += (double)qr[d] * e->k[kvo + j * g->ks + d];
        p[j] = s / sqrt((double)g->HS);
        mx = fmax(mx, p[j]);
    }
    for (int64_t j = 0; j <= emu_last(g, i); j++) sum += exp(p[j] - mx);
    double L = e->lse ? e->lse[b * g->lb + h * g->lh + i] : mx + log(sum);
    for (int64_t j = 0; j <= emu_last(g, i); j++) p[j] = exp(p[j] - L);
    if (lse_out) *lse_out = L;
}
static void emu_forward(const struct emu *e, float *out, float *lse) {
    const struct l3d_cuk_attn *g = e->g;
    double p[64];
    for (int64_t row = 0; row < g->B * g->NH * g->nq; row++) {
        int64_t i = row % g->nq, h = row / g->nq % g->NH, b = row / (g->nq * g->NH), L;
        const int64_t kvo = b * g->kb + h / g->grp * g->HS;
        double l;
        emu_probs(e, b, h, i, p, &l);
        for (int64_t d = 0; d < g->HS; d++) {
            double o = 0;
            for (int64_t j = 0; j <= emu_last(g, i); j++) o += p[j] * e->v[kvo + j * g->ks + d];
            out[b * g->ob + i * g->os + h * g->HS + d] = (float)o;
        }
        L = b * g->lb + h * g->lh + i;
        if (lse) lse[L] = (float)l;
    }
}
/* dS_ij of query row (b, h, i) and key j: P_ij (dO_i . v_j - D_i) / sqrt(HS) */
static double emu_ds(const struct emu *e, int64_t b, int64_t h, int64_t i, int64_t j, double p) {
    const struct l3d_cuk_attn *g = e->g;
    const int64_t o = b * g->ob + i * g->os + h * g->HS, kvo = b * g->kb + h / g->grp * g->HS;
    double D = 0, dp = 0;
    for (int64_t d = 0; d < g->HS; d++) {
        D += (double)e->dout[o + d] * e->out[o + d];
        dp += (double)e->dout[o + d] * e->v[kvo + j * g->ks + d];
    }
    return p * (dp - D) / sqrt((double)g->HS);
}
/* dq per query row over its keys; dk, dv per key row (b, kh, j) over the grp heads that read it
 * and their rows i >= j - p0 (attn_dkv_k's loop bounds) */
static void emu_backward(const struct emu *e, float *dq, float *dk, float *dv) {
    const struct l3d_cuk_attn *g = e->g;
    double p[64];
    for (int64_t row = 0; row < g->B * g->NH * g->nq; row++) {
        int64_t i = row % g->nq, h = row / g->nq % g->NH, b = row / (g->nq * g->NH);
        const int64_t kvo = b * g->kb + h / g->grp * g->HS;
        emu_probs(e, b, h, i, p, NULL);
        for (int64_t j = 0; j <= emu_last(g, i); j++) {
            double ds = emu_ds(e, b, h, i, j, p[j]);
            float *dqr = dq + b * g->qb + i * g->qs + h * g->HS;
            for (int64_t d = 0; d < g->HS; d++) dqr[d] += (float)(ds * e->k[kvo + j * g->ks + d]);
        }
    }
    const int64_t NKV = g->NH / g->grp;
    for (int64_t row = 0; row < g->B * NKV * g->nk; row++) {
        int64_t j = row % g->nk, kh = row / g->nk % NKV, b = row / (g->nk * NKV);
        const int64_t kvo = b * g->kb + j * g->ks + kh * g->HS;
        for (int64_t h = kh * g->grp; h < (kh + 1) * g->grp; h++)
            for (int64_t i = j > g->p0 ? j - g->p0 : 0; i < g->nq; i++) {
                emu_probs(e, b, h, i, p, NULL);
                double ds = emu_ds(e, b, h, i, j, p[j]);
                for (int64_t d = 0; d < g->HS; d++) {
                    const int64_t qo = b * g->qb + i * g->qs + h * g->HS + d;
                    dk[kvo + d] += (float)(ds * e->q[qo]);
                    dv[kvo + d] += (float)(p[j] * e->dout[b * g->ob + i * g->os + h * g->HS + d]);
                }
            }
    }
}
static float *randn(int64_t n, uint64_t seed) {
    float *x = calloc((size_t)n, sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)l3d_rng_normal(seed, 0, (uint64_t)i);
    return x;
}
/* the CPU backend's buffer of n floats from host x (NULL: zeros), and back */
static float *dev(struct l3d_backend *be, const float *x, int64_t n) {
    float *d = l3d_be_alloc(be, (size_t)n * sizeof *d, "emu");
    L3D_ASSERT(d);
    l3d_be_memset(be, d, 0, (size_t)n * sizeof *d);
    if (x) l3d_be_copy_h2d(be, d, x, (size_t)n * sizeof *d);
    return d;
}
static float *host(struct l3d_backend *be, const float *d, int64_t n) {
    float *x = calloc((size_t)n, sizeof *x);
    l3d_be_copy_d2h(be, x, d, (size_t)n * sizeof *x);
    return x;
}
static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = isnan(a[i] - b[i]) ? INFINITY : fmax(m, fabs(a[i] - b[i]));
    return m;
}

/* attention_forward / backward on a fused qkv of 6 query heads over 2 key/value heads; negative:
 * the mask one row off (p0 1) is rejected */
static void test_attn_full(struct l3d_backend *be) {
    enum { B = 2, T = 9, NH = 6, NKV = 2, HS = 8, CQ = (NH + 2 * NKV) * HS };
    const int64_t nx = B * T * CQ, no = B * T * NH * HS, nl = B * NH * T;
    float *qkv = randn(nx, 11), *dout = randn(no, 12), *dq = calloc(nx, 4), *out = calloc(no, 4);
    float *lse = calloc(nl, 4), *dqkv_d = dev(be, NULL, nx), *qkv_d = dev(be, qkv, nx);
    float *out_d = dev(be, NULL, no), *lse_d = dev(be, NULL, nl), *dout_d = dev(be, dout, no);
    l3d_be_attention_forward(be, L3D_F32, out_d, lse_d, qkv_d, B, T, NH, NKV, HS);
    l3d_be_attention_backward(be, L3D_F32, dqkv_d, dout_d, qkv_d, out_d, lse_d, B, T, NH, NKV,
                              HS);
    float *out_c = host(be, out_d, no), *lse_c = host(be, lse_d, nl), *dq_c = host(be, dqkv_d, nx);
    struct l3d_cuk_attn g = l3d_cuda_attn_full(B, T, NH, NKV, HS);
    struct emu e = {&g, qkv, qkv + NH * HS, qkv + (NH + NKV) * HS, out_c, dout, NULL};
    emu_forward(&e, out, lse);
    CHECK(max_diff(out, out_c, no) < 1e-5 && max_diff(lse, lse_c, nl) < 1e-5);
    e.lse = lse_c;
    emu_backward(&e, dq, dq + NH * HS, dq + (NH + NKV) * HS);
    CHECK(max_diff(dq, dq_c, nx) < 1e-5);
    g.p0 = 1;
    e.lse = NULL;
    emu_forward(&e, out, lse);
    CHECK(max_diff(out, out_c, no) > 1e-3);
    l3d_be_free(be, qkv_d), l3d_be_free(be, dqkv_d), l3d_be_free(be, out_d);
    l3d_be_free(be, lse_d), l3d_be_free(be, dout_d);
    free(qkv), free(dout), free(dq), free(out), free(lse), free(out_c), free(lse_c), free(dq_c);
}

/* attention_cached: 3 new rows at position 4 over 7 cached rows; negative: position 3 */
static void test_attn_cached(struct l3d_backend *be) {
    enum { POS = 4, N = 3, NH = 6, NKV = 2, HS = 8, CQ = (NH + 2 * NKV) * HS };
    const int64_t nx = (POS + N) * CQ, no = N * NH * HS;
    float *qkv = randn(nx, 21), *out = calloc(no, 4), *qkv_d = dev(be, qkv, nx);
    float *out_d = dev(be, NULL, no);
    l3d_be_attention_cached(be, L3D_F32, out_d, qkv_d + POS * CQ, qkv_d + NH * HS,
                            qkv_d + (NH + NKV) * HS, POS, N, NH, NKV, HS, CQ, CQ);
    float *out_c = host(be, out_d, no);
    struct l3d_cuk_attn g = l3d_cuda_attn_cached(POS, N, NH, NKV, HS, CQ, CQ);
    struct emu e = {&g, qkv + POS * CQ, qkv + NH * HS, qkv + (NH + NKV) * HS, NULL, NULL, NULL};
    emu_forward(&e, out, NULL);
    CHECK(max_diff(out, out_c, no) < 1e-5);
    g.p0 = POS - 1;
    emu_forward(&e, out, NULL);
    CHECK(max_diff(out, out_c, no) > 1e-3);
    l3d_be_free(be, qkv_d), l3d_be_free(be, out_d);
    free(qkv), free(out), free(out_c);
}
/* the block kernels of context parallelism on padded strides: 7 query rows at position 9 over 10
 * key rows from 3; negative: the last key row dropped (nk 9) */
static void test_attn_block(struct l3d_backend *be) {
    enum { B = 2, NH = 6, NKV = 2, HS = 8, NQ = 7, NK = 10, QR = NH * HS + 5, KR = NKV * HS + 3 };
    const struct l3d_attn_block a = {.B = B, .NH = NH, .NKV = NKV, .HS = HS, .nq = NQ, .nk = NK,
                                     .q_pos = 9, .k_pos = 3, .q_rs = QR, .q_bs = NQ * QR + 2,
                                     .kv_rs = KR, .kv_bs = NK * KR + 1, .o_rs = QR,
                                     .o_bs = NQ * QR + 2, .lse_hs = NQ + 2,
                                     .lse_bs = NH * (NQ + 2) + 1};
    const int64_t nq = B * a.q_bs, nk = B * a.kv_bs, nl = B * a.lse_bs;
    float *q = randn(nq, 31), *k = randn(nk, 32), *v = randn(nk, 33), *dout = randn(nq, 34);
    float *out = calloc(nq, 4), *lse = calloc(nl, 4), *dq = calloc(nq, 4), *dk = calloc(nk, 4);
    float *dv = calloc(nk, 4), *q_d = dev(be, q, nq), *k_d = dev(be, k, nk), *v_d = dev(be, v, nk);
    float *out_d = dev(be, NULL, nq), *lse_d = dev(be, NULL, nl), *dout_d = dev(be, dout, nq);
    float *dq_d = dev(be, NULL, nq), *dk_d = dev(be, NULL, nk), *dv_d = dev(be, NULL, nk);
    l3d_be_attention_block_forward(be, L3D_F32, out_d, lse_d, q_d, k_d, v_d, &a);
    l3d_be_attention_block_backward(be, L3D_F32, dq_d, dk_d, dv_d, dout_d, q_d, k_d, v_d, out_d,
                                    lse_d, &a);
    float *out_c = host(be, out_d, nq), *lse_c = host(be, lse_d, nl), *dq_c = host(be, dq_d, nq);
    float *dk_c = host(be, dk_d, nk), *dv_c = host(be, dv_d, nk);
    struct l3d_cuk_attn g = l3d_cuda_attn_block(&a);
    struct emu e = {&g, q, k, v, out_c, dout, NULL};
    emu_forward(&e, out, lse);
    CHECK(max_diff(out, out_c, nq) < 1e-5 && max_diff(lse, lse_c, nl) < 1e-5);
    e.lse = lse_c;
    emu_backward(&e, dq, dk, dv);
    CHECK(max_diff(dq, dq_c, nq) < 1e-5);
    CHECK(max_diff(dk, dk_c, nk) < 1e-5 && max_diff(dv, dv_c, nk) < 1e-5);
    g.nk = NK - 1;
    e.lse = NULL;
    emu_forward(&e, out, lse);
    CHECK(max_diff(out, out_c, nq) > 1e-3);
    float *bufs[] = {q_d, k_d, v_d, out_d, lse_d, dout_d, dq_d, dk_d, dv_d};
    for (int i = 0; i < 9; i++) l3d_be_free(be, bufs[i]);
    float *hb[] = {q, k, v, dout, out, lse, dq, dk, dv, out_c, lse_c, dq_c, dk_c, dv_c};
    for (int i = 0; i < 14; i++) free(hb[i]);
}

/* ---- mixture of experts: the kernels' per-token functions (cuda_moe.h) on the host -----------
 * The route kernels' steps replayed on the host with the very functions the device runs
 * (l3d_moe_route_row a token, l3d_moe_offsets, l3d_moe_slot an assignment in token order,
 * l3d_moe_dlogits_row a token), against the CPU backend's MoE kernels: the routing rules are
 * proven without a GPU; the device's logits, reductions and ballots are not. */

enum { MN = 24, MC = 16, ME = 6, MK = 2 };
struct moe_ref {
    float probs[MN * ME], lse[MN], wts[MN * MK], stats[2 * ME + 2];
    int32_t idx[MN * MK], pos[MN * MK], off[ME + 1];
};

/* moe_slot_k's walk for expert e with blocks of `threads`: segment by segment (MN K / segs
 * assignments, the count starting at fill[s ME + e]), chunk by chunk, each warp's ballot and
 * count, then each assignment's rank by l3d_moe_chunk_rank and its row by l3d_moe_slot (place),
 * or the expert's kept rows by l3d_moe_kept into off[e] and its assignments into stats[e] */
static void moe_slot_walk(struct moe_ref *r, int32_t e, int64_t cap, int threads,
                          const int32_t *fill, int64_t segs, bool place) {
    int32_t in_warp[32];
    uint32_t m[32];
    int64_t per = MN * MK / segs, row = 0, routed = 0;
    for (int64_t s0 = 0; s0 < MN * MK; s0 += per) {
        int32_t f = fill ? fill[(s0 / per) * ME + e] : 0;
        int64_t seen = 0;
        for (int64_t base = s0; base < s0 + per; base += threads) {
            for (int w = 0; w < threads / 32; w++) {
                m[w] = 0;
                for (int l = 0; l < 32; l++) {
                    int64_t i = base + 32 * w + l;
                    if (i < s0 + per && r->idx[i] == e) m[w] |= 1u << l;
                }
                in_warp[w] = l3d_moe_popc(m[w]);
            }
            for (int t = 0; place && t < threads && base + t < s0 + per; t++)
                if (r->idx[base + t] == e)
                    r->pos[base + t] = l3d_moe_slot(
                        r->off[e] + (int32_t)row, f,
                        l3d_moe_chunk_rank(seen, in_warp, t / 32, m[t / 32], t % 32), cap);
            for (int w = 0; w < threads / 32; w++) seen += in_warp[w];
        }
        row += l3d_moe_kept(seen, f, cap);
        routed += seen;
    }
    if (!place) r->off[e] = (int32_t)row, r->stats[e] = (float)routed;
}

/* the route kernels' steps on the host (blocks of `threads` in the slot walk) */
static void moe_replay(struct moe_ref *r, const float *x, const float *w, int norm, int64_t cap,
                       int threads, const int32_t *fill, int64_t segs) {
    memset(r->off, 0, sizeof r->off);
    for (int64_t n = 0; n < MN; n++) {
        for (int64_t e = 0; e < ME; e++) { /* the CPU's order, so that ties stay ties */
            float s = 0.0f;
            for (int64_t c = 0; c < MC; c++) s += x[n * MC + c] * w[e * MC + c];
            r->probs[n * ME + e] = s;
        }
        r->lse[n] = l3d_moe_route_row(r->probs + n * ME, r->idx + n * MK, r->wts + n * MK, NULL, ME,
                                      MK, norm);
    }
    for (int32_t e = 0; e < ME; e++) moe_slot_walk(r, e, cap, threads, fill, segs, false);
    l3d_moe_offsets(r->off, r->stats, ME);
    for (int32_t e = 0; e < ME; e++) moe_slot_walk(r, e, cap, threads, fill, segs, true);
    double z = 0.0;
    for (int64_t e = 0; e < ME; e++) {
        double s = 0.0;
        for (int64_t n = 0; n < MN; n++) s += r->probs[n * ME + e];
        r->stats[ME + e] = (float)s;
    }
    for (int64_t n = 0; n < MN; n++) z += (double)r->lse[n] * r->lse[n];
    r->stats[2 * ME] = (float)z;
}

/* the CPU backend's routing of x by w into r (its buffers: floats' size) */
static void moe_cpu(struct l3d_backend *be, struct moe_ref *r, const float *x, const float *w,
                    int norm, int64_t cap, const int32_t *fill, int64_t segs) {
    float *d[10];
    const int64_t n[10] = {MN * ME, MN, MN * MK, MN * MK, MN * MK, ME + 1, 2 * ME + 2, MN * MC,
                           ME * MC, 3 * ME};
    void *out[7] = {r->probs, r->lse, r->idx, r->wts, r->pos, r->off, r->stats};
    for (int i = 0; i < 10; i++) d[i] = dev(be, i == 7 ? x : i == 8 ? w : NULL, n[i]);
    l3d_be_moe_route(be, L3D_F32, d[0], d[1], (int32_t *)d[2], d[3], (int32_t *)d[4],
                     (int32_t *)d[5], d[6], (int32_t *)d[9], d[7], d[8], MN, MC, ME, MK, norm, cap,
                     fill, segs, NULL);
    for (int i = 0; i < 7; i++) l3d_be_copy_d2h(be, out[i], d[i], (size_t)n[i] * 4);
    for (int i = 0; i < 10; i++) l3d_be_free(be, d[i]);
}

static bool moe_same(const struct moe_ref *a, const struct moe_ref *b) {
    return memcmp(a->idx, b->idx, sizeof a->idx) == 0 &&
           memcmp(a->pos, b->pos, sizeof a->pos) == 0 &&
           memcmp(a->off, b->off, sizeof a->off) == 0 &&
           max_diff(a->probs, b->probs, MN * ME) < 1e-6 && max_diff(a->lse, b->lse, MN) < 1e-5 &&
           max_diff(a->wts, b->wts, MN * MK) < 1e-6 &&
           max_diff(a->stats, b->stats, 2 * ME + 2) < 1e-4;
}

/* Token 0 all zeros (every expert equally likely: experts 0 and 1), token 1 along weight row 2,
 * which row 4 repeats (a tie at the top: 2 before 4); dropless and with a capacity of 3, plain
 * and renormalised, in one segment and in 3 with starting fills (a context-parallel ring's
 * counts before each chunk); the slot walk in blocks of 32 (two chunks), 64 (two warps) and 256
 * threads (the kernel's). Negative: another capacity, the renormalisation off, or (with a
 * capacity) the fills left out, is rejected. */
static void test_moe_route(struct l3d_backend *be) {
    float *x = randn(MN * MC, 21), *w = randn(ME * MC, 22);
    for (int64_t c = 0; c < MC; c++) {
        x[c] = 0.0f;
        w[4 * MC + c] = w[2 * MC + c];
        x[MC + c] = w[2 * MC + c];
    }
    int32_t fill[3 * ME];
    for (int i = 0; i < 3 * ME; i++) fill[i] = (i * 7) % 6; /* some past the capacity of 3 */
    struct moe_ref *ref = calloc(1, sizeof *ref), *cpu = calloc(1, sizeof *cpu);
    for (int v = 0; v < 8; v++) {
        int norm = v & 1;
        int64_t cap = v & 2 ? 3 : 0, segs = v & 4 ? 3 : 1;
        const int32_t *f = v & 4 ? fill : NULL;
        moe_cpu(be, cpu, x, w, norm, cap, f, segs);
        for (int threads = 32; threads <= 256; threads *= 2) {
            moe_replay(ref, x, w, norm, cap, threads, f, segs);
            CHECK(moe_same(ref, cpu));
        }
        CHECK(ref->idx[0] == 0 && ref->idx[1] == 1 && ref->idx[2] == 2 && ref->idx[3] == 4);
        /* dropless: every assignment has a row; 48 assignments over 6 experts of 3 rows: drops */
        CHECK(cap ? ref->stats[2 * ME + 1] > 0.0f && ref->off[ME] < MN * MK
                  : ref->stats[2 * ME + 1] == 0.0f && ref->off[ME] == MN * MK);
        moe_replay(ref, x, w, norm, cap ? 2 : 3, 256, f, segs);
        CHECK(!moe_same(ref, cpu));
        moe_replay(ref, x, w, !norm, cap, 256, f, segs);
        CHECK(!moe_same(ref, cpu));
        if (cap && f) {
            moe_replay(ref, x, w, norm, cap, 256, NULL, 1);
            CHECK(!moe_same(ref, cpu));
        }
    }
    free(x), free(w), free(ref), free(cpu);
}

/* The router's dlogits from the CPU's routing (renormalised, capacity 3) with both auxiliary
 * losses, l3d_moe_dlogits_row a token against the CPU kernel; negative: another aux_scale, and
 * the renormalisation off. */
static void test_moe_dlogits(struct l3d_backend *be) {
    float *x = randn(MN * MC, 23), *w = randn(ME * MC, 24), *dw = randn(MN * MK, 25);
    struct moe_ref *r = calloc(1, sizeof *r);
    moe_cpu(be, r, x, w, 1, 3, NULL, 1);
    const int64_t n[8] = {MN * MK, MN * MC, ME * MC, MN * ME, MN, MN * MK, MN * MK, 2 * ME + 2};
    const float *src[8] = {dw, x, w, r->probs, r->lse, (const float *)r->idx, r->wts, r->stats};
    float *d[8], *dl = dev(be, NULL, MN * ME), want[MN * ME], got[MN * ME];
    for (int i = 0; i < 8; i++) d[i] = dev(be, src[i], n[i]);
    l3d_be_moe_router_backward(be, L3D_F32, L3D_F32, NULL, NULL, dl, d[0], d[1], d[2], d[3], d[4],
                               (const int32_t *)d[5], d[6], d[7], MN, MC, ME, MK, 1, 0.05f,
                               0.01f);
    l3d_be_copy_d2h(be, want, dl, sizeof want);
    for (int v = 0; v < 3; v++) {
        for (int64_t t = 0; t < MN; t++)
            l3d_moe_dlogits_row(got + t * ME, dw + t * MK, r->probs + t * ME, r->lse[t],
                                r->idx + t * MK, r->wts + t * MK, r->stats, ME, MK, v != 2,
                                v == 1 ? 0.04f : 0.05f, 0.01f);
        CHECK(v == 0 ? max_diff(got, want, MN * ME) < 1e-5 : max_diff(got, want, MN * ME) > 1e-4);
    }
    for (int i = 0; i < 8; i++) l3d_be_free(be, d[i]);
    l3d_be_free(be, dl);
    free(x), free(w), free(dw), free(r);
}

int main(void) {
    test_local_rank();
    test_comm_choice();
    test_a2a();
    test_launch();
    test_allocs();
    test_plans();
    test_peak();
    struct l3d_backend *cpu = l3d_backend_cpu_init();
    test_attn_full(cpu);
    test_attn_cached(cpu);
    test_attn_block(cpu);
    test_moe_route(cpu);
    test_moe_dlogits(cpu);
    l3d_backend_free(cpu);
    return TEST_REPORT();
}
