/*
 * llm3d context parallelism: cp ranks share every sequence of a micro-batch, each holding T / cp
 * of its tokens, and attention runs round the ring of those ranks (ring attention: Liu et al.
 * 2023, "Ring Attention with Blockwise Transformers"; the load-balanced causal split and the
 * backward's ring of dK / dV of Megatron-LM's context parallelism). docs/DESIGN.md, "Context
 * parallelism".
 *
 *   struct l3d_cp cpc;
 *   if (l3d_cp_attach(&cpc, m, topo.cp_comm) != L3D_OK) ...;   // hooks and ring buffers
 *   l3d_gpt_forward(m, my_chunks, my_targets, B, T / cp);      // the model sees its T / cp rows
 *   l3d_cp_detach(&cpc);
 *
 * Each sequence is cut into 2 cp chunks; ring rank r holds chunks r and 2 cp - 1 - r (its rows
 * 0..T/(2cp)-1 and the rest), so that with the causal mask every rank has the same work
 * (l3d_cp_chunk_start, include/llm3d/model.h). Forward, step s = 0..cp-1: the K|V rows of ring
 * rank r - s (its own at s = 0) are sent on to r + 1 while the next block arrives from r - 1 (the
 * non-blocking transfers posted before the block's computation), and each of the rank's query
 * chunks attends over the key chunks it may see (l3d_be_attention_block_forward), merged by their
 * log-sum-exp (l3d_be_attention_merge). Backward visits the blocks in the same order with the
 * final out and lse (l3d_be_attention_block_backward): dQ stays local; each block's dK|dV sum
 * travels with it, one rank behind (the sum of step s - 1 is in flight while step s computes),
 * and after the last step reaches the rank that owns the block.
 */
#ifndef LLM3D_CP_H
#define LLM3D_CP_H

#include "llm3d/backend.h"
#include "llm3d/comm.h"
#include "llm3d/model.h"

struct l3d_cp {
    struct l3d_comm *comm;    /* the ring */
    struct l3d_backend *be;
    enum l3d_dtype dt;        /* the model's activations */
    enum l3d_dtype rdt;       /* the ring's sums: fp32 (--cp-reduce-dtype fp32, 16 bits), else dt */
    int64_t cap;              /* elements of each K|V buffer */
    void *kv[2];              /* this step's K|V block and the next one's (B, T, 2 NKV HS), dt */
    void *kvw;                /* rdt != dt: this step's block widened, as the kernels read it */
    void *dkv[3];             /* backward: the running dK|dV sums, in flight and computed (rdt) */
    void *part;               /* forward: one block's partial output (B, T, NH HS); backward with
                               * rdt != dt: dout widened */
    float *part_lse;          /* ... and its log-sum-exp (B, NH, T) */
    void *wqkv, *wdqkv;       /* rdt != dt: qkv and dqkv widened to rdt (B, T, NH + 2 NKV, HS) */
    void *wout;               /* ... and the output (forward's, accumulated; backward's, read) */
    double comm_s;            /* time waiting for the ring's transfers (exposed), to read */
    int64_t bytes;            /* bytes sent round the ring */
};

/* Installs m's context-parallel hooks (cp_size, cp_rank, the attention hooks) over cp_comm and
 * allocates the ring's buffers for m's largest micro-batch (device memory of m's backend,
 * l3d_cp_bytes). fp32 (--cp-reduce-dtype fp32) with 16-bit activations: the ring runs in fp32 on
 * widened q, k, v (the K|V blocks travel in the model's type, widened on arrival), its partial
 * outputs, merges and dK|dV sums (which travel) fp32, each result rounded to the model's type
 * once (a no-op for fp32 models). Nothing when cp_comm has one rank. L3D_ERR_OOM when the
 * buffers do not fit; L3D_ERR_ARG under L3D_ATTENTION=naive (the ring runs the tiled kernel's
 * blocks). */
l3d_status l3d_cp_attach(struct l3d_cp *cp, struct l3d_gpt *m, struct l3d_comm *cp_comm,
                          bool fp32);
void l3d_cp_detach(struct l3d_cp *cp);
/* Bytes of the ring's buffers for a micro-batch of B sequences of T rows (this rank's: the
 * sequence length / cp) with NH query and NKV key/value heads of HS, activations of type dt:
 * 2 K|V-sized buffers in dt (the blocks travel in the model's type), 3 K|V-sized (the dK|dV sums)
 * and one output-sized buffer in the ring's type (fp32 with fp32 and 16-bit dt, else dt) and a
 * log-sum-exp; with fp32 under 16 bits also the block, qkv, dqkv and the output widened (the
 * memory check and the planner count them). */
size_t l3d_cp_bytes(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, enum l3d_dtype dt,
                    bool fp32);

#endif
