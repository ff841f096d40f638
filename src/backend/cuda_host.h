/*
 * The CUDA backend's host arithmetic (src/backend/cuda_host.c): device selection, the choice of
 * communicator, launch shapes, the allocation table behind memory accounting and the peak FLOP/s
 * table. Pure host functions with no CUDA header, so that tests/cuda/test_cuda_host.c checks them
 * on a machine without a GPU (ctest -L nogpu, in `make test` when nvcc exists). Only the CUDA
 * backend (cuda.c), the NCCL communicator (src/comm/nccl.c) and that test include this file.
 */
#ifndef LLM3D_BACKEND_CUDA_HOST_H
#define LLM3D_BACKEND_CUDA_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda_kernels.h"
#include "llm3d/backend.h"
#include "llm3d/core.h"

/* ---- device selection ----------------------------------------------------------------------- */

/* This process's rank among the ranks of its node as the launcher announces it: the first of
 * OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), MPI_LOCALRANKID (MPICH's Hydra), SLURM_LOCALID that is
 * set and is a non-negative decimal integer; -1 when none is (then the caller counts the ranks of
 * its MPI_COMM_TYPE_SHARED node itself: l3d_cuda_local_rank_of). */
int l3d_cuda_env_local_rank(void);
/* The rank's index among the ranks of its node: node_of (n entries, l3d_comm_nodes's numbering)
 * counted below rank. */
int l3d_cuda_local_rank_of(const int *node_of, int n, int rank);
/* The device of a rank: local_rank modulo the ndev visible devices (a negative local rank: 0);
 * -1 when there is no device. */
int l3d_cuda_pick_device(int local_rank, int ndev);

/* ---- communicator choice -------------------------------------------------------------------- */

enum l3d_cuda_comm_kind {
    L3D_CUDA_COMM_NCCL,   /* every rank its own device: NCCL on device buffers */
    L3D_CUDA_COMM_STAGED, /* two ranks share a device (NCCL refuses that): MPI through host copies */
};
/* NCCL when no two of the n ranks have the same (node, device); otherwise STAGED, with *a < *b
 * the first two ranks that share one (both -1 for NCCL). Every rank computes it from the same
 * gathered arrays, so every rank takes the same communicator. */
enum l3d_cuda_comm_kind l3d_cuda_comm_choice(const int *node_of, const int *device_of, int n,
                                             int *a, int *b);

/* ---- the v-collectives over NCCL: their blocks --------------------------------------------- */

/* One transfer of one side of an all_to_allv: count elements to or from rank peer, `at` bytes
 * into the send or the receive buffer. */
struct l3d_cuda_xfer {
    int peer;
    size_t at, count;
};
/* One side (the sends, or the receives) of an all_to_allv over p ranks as NCCL's grouped sends
 * and receives take it: a transfer for each rank with a non-zero count, in rank order, block r
 * displs[r] elements of es bytes in. Zero counts are skipped on both sides alike (rank r's count
 * for this rank is this rank's for r: the communicator's contract), so every NCCL send meets its
 * receive. Returns how many were written to x (at most p). A negative count or displacement
 * aborts (programmer error). */
int l3d_cuda_a2a_xfers(int p, const int64_t *counts, const int64_t *displs, size_t es,
                       struct l3d_cuda_xfer *x);
/* The elements the non-empty blocks of a v-collective reach (the end of the farthest one; 0 when
 * all are empty): how much of the buffer the staged path copies to the host and back. A zero
 * count's displacement may point anywhere (past the buffer too), as MPI's extent ignores it. */
int64_t l3d_cuda_blocks_span(int p, const int64_t *counts, const int64_t *displs);

/* ---- launch shapes: cuda_kernels.h (read by nvcc as well) ----------------------------------- */

/* ---- attention geometry: each attention entry's layout as one struct l3d_cuk_attn ------------ */

/* attention_forward / backward on qkv (B,T,NH+2*NKV,HS): the queries at qkv, the keys at
 * + NH HS, the values at + (NH + NKV) HS (the caller's offsets); out (B,T,NH,HS); lse (B,NH,T). */
struct l3d_cuk_attn l3d_cuda_attn_full(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
/* attention_cached: n query rows at positions pos.., q_stride apart, over pos + n cached rows
 * kv_stride apart; out (n, NH HS); no lse. */
struct l3d_cuk_attn l3d_cuda_attn_cached(int64_t pos, int64_t n, int64_t NH, int64_t NKV,
                                         int64_t HS, int64_t q_stride, int64_t kv_stride);
/* the block kernels of context parallelism: l3d_attn_block's fields as they are */
struct l3d_cuk_attn l3d_cuda_attn_block(const struct l3d_attn_block *g);

/* ---- allocation table: the accounting of device memory -------------------------------------- */

/* cudaFree does not say how large a buffer was: the backend keeps each live allocation's size to
 * take it back out of l3d_mem_used (the same accounting as the CPU backend's). An open-addressing
 * hash table keyed by address (linear probing, backward-shift deletion), grown at 1/2 load. */
struct l3d_cuda_allocs {
    uintptr_t *key; /* 0: empty slot */
    size_t *bytes;
    size_t cap, count, total;
};
void l3d_cuda_allocs_add(struct l3d_cuda_allocs *t, const void *p, size_t bytes);
/* The size of live allocation p, removed from the table; false when p is not one (a foreign or
 * freed pointer). */
bool l3d_cuda_allocs_remove(struct l3d_cuda_allocs *t, const void *p, size_t *bytes);
void l3d_cuda_allocs_free(struct l3d_cuda_allocs *t);

/* ---- cuBLASLt plans: a product's descriptors and algorithm, made once per shape ------------- */

/* What decides a product's descriptors and algorithm: operations, sizes, element types (codes of
 * the caller), leading dimensions, whether the bias epilogue is on, and the alignment in bytes
 * cuBLASLt may assume of A, B and C/D (l3d_cuda_align). All int64 (no padding): keys compare as
 * bytes. */
struct l3d_cuda_mm_key {
    int64_t ta, tb, m, n, k, ab, d, lda, ldb, ldd, bias, align_a, align_b, align_d;
};
#define L3D_CUDA_PLANS 64
/* The keys of the cached plans; the plans themselves (CUDA handles) are the caller's, slot for
 * slot. A model has a few dozen shapes; generation adds one per prompt length, so a full table
 * replaces its entries in turn (round robin). */
struct l3d_cuda_plan_table {
    struct l3d_cuda_mm_key key[L3D_CUDA_PLANS];
    int used, next; /* slots filled; the slot replaced next once all are */
};
/* The slot of key k: *hit when it is cached there; otherwise the slot now assigned to k (its key
 * recorded), *evict when that slot held another plan, which the caller destroys before making
 * k's. */
int l3d_cuda_plan_slot(struct l3d_cuda_plan_table *t, const struct l3d_cuda_mm_key *k, bool *hit,
                       bool *evict);
/* The alignment of address p that cuBLASLt may assume: its largest power-of-two divisor, at most
 * 256 (cuBLASLt's default assumption, which sub-buffers of a flat buffer need not meet). */
int64_t l3d_cuda_align(const void *p);

/* ---- peak FLOP/s ---------------------------------------------------------------------------- */

/* What the backend reads of cudaDeviceProp / cudaDeviceGetAttribute. */
struct l3d_cuda_dev {
    const char *name; /* "NVIDIA H100 80GB HBM3" */
    int major, minor, sms, clock_khz;
};
/* Dense peak of the products the backend runs in t: bf16 and fp16 on tensor cores, fp32 as
 * CUBLAS_COMPUTE_32F (fp32 cores, no TF32); 0 for other types. From the data-sheet table when the
 * name matches a row (*source names the sheet), else SMs x clock x the architecture's dense
 * FLOP/clock/SM (*source says so); 0 for an unknown architecture. */
double l3d_cuda_peak(const struct l3d_cuda_dev *d, enum l3d_dtype t, const char **source);

#endif
