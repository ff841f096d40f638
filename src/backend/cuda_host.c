/*
 * Host arithmetic of the CUDA backend (src/backend/cuda_host.h): no CUDA header, tested without a
 * GPU (tests/cuda/test_cuda_host.c).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda_host.h"

/* ---- device selection ----------------------------------------------------------------------- */

int l3d_cuda_env_local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID"};
    for (size_t k = 0; k < sizeof vars / sizeof vars[0]; k++) {
        const char *s = getenv(vars[k]);
        if (!s || !*s) continue;
        char *end;
        long v = strtol(s, &end, 10);
        if (*end == '\0' && v >= 0 && v < (1L << 30) && (s[0] >= '0' && s[0] <= '9'))
            return (int)v;
    }
    return -1;
}

int l3d_cuda_local_rank_of(const int *node_of, int n, int rank) {
    L3D_ASSERT(rank >= 0 && rank < n);
    int k = 0;
    for (int r = 0; r < rank; r++) k += node_of[r] == node_of[rank];
    return k;
}

int l3d_cuda_pick_device(int local_rank, int ndev) {
    if (ndev <= 0) return -1;
    return local_rank < 0 ? 0 : local_rank % ndev;
}

/* ---- communicator choice -------------------------------------------------------------------- */

enum l3d_cuda_comm_kind l3d_cuda_comm_choice(const int *node_of, const int *device_of, int n,
                                             int *a, int *b) {
    *a = *b = -1;
    /* n is a world size (thousands at most): the quadratic scan runs once at start-up */
    for (int j = 1; j < n; j++)
        for (int i = 0; i < j; i++)
            if (node_of[i] == node_of[j] && device_of[i] == device_of[j]) {
                *a = i;
                *b = j;
                return L3D_CUDA_COMM_STAGED;
            }
    return L3D_CUDA_COMM_NCCL;
}

/* ---- the v-collectives' blocks -------------------------------------------------------------- */

int l3d_cuda_a2a_xfers(int p, const int64_t *counts, const int64_t *displs, size_t es,
                       struct l3d_cuda_xfer *x) {
    int n = 0;
    for (int r = 0; r < p; r++) {
        L3D_ASSERT(counts[r] >= 0 && displs[r] >= 0);
        if (counts[r] > 0)
            x[n++] = (struct l3d_cuda_xfer){r, (size_t)displs[r] * es, (size_t)counts[r]};
    }
    return n;
}

int64_t l3d_cuda_blocks_span(int p, const int64_t *counts, const int64_t *displs) {
    int64_t span = 0;
    for (int r = 0; r < p; r++) {
        L3D_ASSERT(counts[r] >= 0 && displs[r] >= 0);
        if (counts[r] > 0 && displs[r] + counts[r] > span) span = displs[r] + counts[r];
    }
    return span;
}

/* ---- launch shapes -------------------------------------------------------------------------- */

struct l3d_cuda_launch l3d_cuda_launch_1d(int64_t n, uint32_t threads, uint32_t max_blocks) {
    L3D_ASSERT(n >= 0 && threads >= 32 && threads <= 1024 && threads % 32 == 0 && max_blocks > 0);
    int64_t b = (n + threads - 1) / threads;
    if (b > (int64_t)max_blocks) b = max_blocks;
    return (struct l3d_cuda_launch){(uint32_t)b, threads};
}

struct l3d_cuda_launch l3d_cuda_launch_rows(int64_t rows, uint32_t warps) {
    L3D_ASSERT(rows >= 0 && warps >= 1 && warps <= 32);
    int64_t b = (rows + warps - 1) / warps;
    L3D_ASSERT(b <= 2147483647);
    return (struct l3d_cuda_launch){(uint32_t)b, 32 * warps};
}

int l3d_cuda_attn_per_lane(int64_t HS) {
    if (HS < 1 || HS > L3D_CUDA_MAX_HS) return 0;
    return (int)((HS + 31) / 32);
}

/* ---- attention geometry --------------------------------------------------------------------- */

struct l3d_cuk_attn l3d_cuda_attn_full(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    const int64_t CQ = (NH + 2 * NKV) * HS, C = NH * HS;
    return (struct l3d_cuk_attn){.B = B, .NH = NH, .grp = NH / NKV, .HS = HS, .nq = T, .nk = T,
                                 .p0 = 0, .qs = CQ, .qb = T * CQ, .ks = CQ, .kb = T * CQ,
                                 .os = C, .ob = T * C, .lh = T, .lb = NH * T};
}

struct l3d_cuk_attn l3d_cuda_attn_cached(int64_t pos, int64_t n, int64_t NH, int64_t NKV,
                                         int64_t HS, int64_t q_stride, int64_t kv_stride) {
    return (struct l3d_cuk_attn){.B = 1, .NH = NH, .grp = NH / NKV, .HS = HS, .nq = n,
                                 .nk = pos + n, .p0 = pos, .qs = q_stride, .ks = kv_stride,
                                 .os = NH * HS, .lh = n};
}

struct l3d_cuk_attn l3d_cuda_attn_block(const struct l3d_attn_block *g) {
    return (struct l3d_cuk_attn){.B = g->B, .NH = g->NH, .grp = g->NH / g->NKV, .HS = g->HS,
                                 .nq = g->nq, .nk = g->nk, .p0 = g->q_pos - g->k_pos,
                                 .qs = g->q_rs, .qb = g->q_bs, .ks = g->kv_rs, .kb = g->kv_bs,
                                 .os = g->o_rs, .ob = g->o_bs, .lh = g->lse_hs, .lb = g->lse_bs};
}

/* ---- allocation table ----------------------------------------------------------------------- */

/* Fibonacci hashing of the address (allocations are 256-byte aligned: the low bits say nothing) */
static size_t slot_of(uintptr_t k, size_t cap) {
    return (size_t)(((uint64_t)k * 11400714819323198485ull) >> 16) & (cap - 1);
}

static void allocs_put(struct l3d_cuda_allocs *t, uintptr_t k, size_t bytes) {
    size_t i = slot_of(k, t->cap);
    while (t->key[i] != 0) i = (i + 1) & (t->cap - 1);
    t->key[i] = k;
    t->bytes[i] = bytes;
}

static void allocs_grow(struct l3d_cuda_allocs *t) {
    struct l3d_cuda_allocs old = *t;
    t->cap = old.cap ? 2 * old.cap : 64;
    /* not l3d_alloc: the table is bookkeeping, not the model's memory */
    t->key = calloc(t->cap, sizeof *t->key);
    t->bytes = calloc(t->cap, sizeof *t->bytes);
    L3D_ASSERT(t->key && t->bytes);
    for (size_t i = 0; i < old.cap; i++)
        if (old.key[i]) allocs_put(t, old.key[i], old.bytes[i]);
    free(old.key);
    free(old.bytes);
}

void l3d_cuda_allocs_add(struct l3d_cuda_allocs *t, const void *p, size_t bytes) {
    L3D_ASSERT(p != NULL);
    if (2 * (t->count + 1) > t->cap) allocs_grow(t);
    allocs_put(t, (uintptr_t)p, bytes);
    t->count++;
    t->total += bytes;
}

bool l3d_cuda_allocs_remove(struct l3d_cuda_allocs *t, const void *p, size_t *bytes) {
    uintptr_t k = (uintptr_t)p;
    if (!t->cap || k == 0) return false;
    size_t i = slot_of(k, t->cap);
    while (t->key[i] != k) {
        if (t->key[i] == 0) return false;
        i = (i + 1) & (t->cap - 1);
    }
    *bytes = t->bytes[i];
    t->total -= *bytes;
    t->count--;
    /* backward-shift deletion: move later entries of the probe run into the hole */
    for (size_t j = (i + 1) & (t->cap - 1); t->key[j] != 0; j = (j + 1) & (t->cap - 1)) {
        size_t home = slot_of(t->key[j], t->cap);
        /* j's entry may fill hole i when its home is not cyclically in (i, j] */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays) continue;
        t->key[i] = t->key[j];
        t->bytes[i] = t->bytes[j];
        i = j;
    }
    t->key[i] = 0;
    t->bytes[i] = 0;
    return true;
}

void l3d_cuda_allocs_free(struct l3d_cuda_allocs *t) {
    free(t->key);
    free(t->bytes);
    memset(t, 0, sizeof *t);
}

/* ---- cuBLASLt plans ------------------------------------------------------------------------ */

int l3d_cuda_plan_slot(struct l3d_cuda_plan_table *t, const struct l3d_cuda_mm_key *k, bool *hit,
                       bool *evict) {
    /* a linear scan: at most L3D_CUDA_PLANS keys of 112 bytes, beside a product's launch */
    for (int i = 0; i < t->used; i++)
        if (memcmp(&t->key[i], k, sizeof *k) == 0) {
            *hit = true;
            *evict = false;
            return i;
        }
    *hit = false;
    int slot;
    if (t->used < L3D_CUDA_PLANS) {
        slot = t->used++;
        *evict = false;
    } else {
        slot = t->next;
        t->next = (t->next + 1) % L3D_CUDA_PLANS;
        *evict = true;
    }
    t->key[slot] = *k;
    return slot;
}

int64_t l3d_cuda_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int64_t al = 256;
    while (al > 1 && a % (uintptr_t)al != 0) al /= 2;
    return al;
}

/* ---- peak FLOP/s ---------------------------------------------------------------------------- */

/* Dense (not 2:4 sparse) figures of NVIDIA's data sheets, FLOP/s. fp32 is the fp32-core rate
 * (the backend's fp32 products use CUBLAS_COMPUTE_32F, no TF32). Matched by substring of the
 * device name, most specific first. */
static const struct {
    const char *match, *source;
    double bf16, fp16, fp32;
} sheet[] = {
    {"H200", "NVIDIA H200 Tensor Core GPU datasheet (SXM, dense)", 989.4e12, 989.4e12, 66.9e12},
    {"H100 NVL", "NVIDIA H100 Tensor Core GPU datasheet (NVL, dense)", 835.5e12, 835.5e12,
     60.0e12},
    {"H100 PCIe", "NVIDIA H100 Tensor Core GPU datasheet (PCIe, dense)", 756.5e12, 756.5e12,
     51.2e12},
    {"H100", "NVIDIA H100 Tensor Core GPU datasheet (SXM, dense)", 989.4e12, 989.4e12, 66.9e12},
    {"A100", "NVIDIA A100 Tensor Core GPU datasheet (dense)", 312e12, 312e12, 19.5e12},
};

double l3d_cuda_peak(const struct l3d_cuda_dev *d, enum l3d_dtype t, const char **source) {
    *source = NULL;
    int k = t == L3D_BF16 ? 0 : t == L3D_F16 ? 1 : t == L3D_F32 ? 2 : -1;
    if (k < 0) return 0.0;
    for (size_t i = 0; i < sizeof sheet / sizeof sheet[0]; i++)
        if (d->name && strstr(d->name, sheet[i].match)) {
            *source = sheet[i].source;
            return k == 0 ? sheet[i].bf16 : k == 1 ? sheet[i].fp16 : sheet[i].fp32;
        }
    /* dense FLOP per clock per SM: tensor cores (16-bit) and fp32 cores (2 per FMA), from the
     * Ampere (GA100) and Hopper (GH100) architecture whitepapers: 989.4 TFLOP/s = 132 SMs x
     * 1.83 GHz x 4096; 312 = 108 x 1.41 GHz x 2048 */
    double per16 = 0, per32 = 0;
    if (d->major == 9) per16 = 4096, per32 = 256;
    else if (d->major == 8 && d->minor == 0) per16 = 2048, per32 = 128;
    else if (d->major == 8) per16 = 1024, per32 = 256; /* GA10x: half the tensor rate, 128 fp32 */
    if (per16 == 0 || d->sms <= 0 || d->clock_khz <= 0) return 0.0;
    *source = "SMs x clock x the architecture's dense rate (whitepaper)";
    return (double)d->sms * (double)d->clock_khz * 1e3 * (k == 2 ? per32 : per16);
}
