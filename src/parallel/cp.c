/* Context parallelism: ring attention over the CP group (include/llm3d/cp.h). */
#include <stdlib.h>
#include <string.h>

#include "llm3d/cp.h"

/* The geometry of this rank's query chunk qc against key chunk kc of ring rank src, the keys in a
 * packed K|V buffer (B, T, 2 NKV HS); k_pos > q_pos: a chunk entirely after, skipped. */
static struct l3d_attn_block pair(const struct l3d_cp *cp, int64_t B, int64_t T, int64_t NH,
                                  int64_t NKV, int64_t HS, int qc, int src, int kc) {
    int64_t W = (NH + 2 * NKV) * HS, KW = 2 * NKV * HS, C = NH * HS;
    int n = cp->comm->size;
    return (struct l3d_attn_block){
        .B = B, .NH = NH, .NKV = NKV, .HS = HS, .nq = T / 2, .nk = T / 2,
        .q_pos = l3d_cp_chunk_start(n, cp->comm->rank, qc, T),
        .k_pos = l3d_cp_chunk_start(n, src, kc, T), .q_rs = W, .q_bs = T * W, .kv_rs = KW,
        .kv_bs = T * KW, .o_rs = C, .o_bs = T * C, .lse_hs = T, .lse_bs = NH * T,
        .p16 = cp->dt == L3D_BF16 && l3d_be_attention_p16(cp->be, L3D_BF16, HS)};
}

static void *elem(enum l3d_dtype t, const void *p, int64_t i) {
    return (char *)p + i * (int64_t)l3d_dtype_size(t);
}
/* element i of a tensor the block kernels read or write (the ring's type: widened under fp32) */
static void *off(const struct l3d_cp *cp, const void *p, int64_t i) { return elem(cp->rdt, p, i); }

/* this rank's K|V rows of qkv (the model's type), packed: the block that starts round the ring,
 * which travels in the model's type (its values are; the ring's type only for sums) */
static void pack(struct l3d_cp *cp, void *kv, const void *qkv, int64_t rows, int64_t NH,
                 int64_t NKV, int64_t HS) {
    int64_t W = (NH + 2 * NKV) * HS, KW = 2 * NKV * HS;
    size_t bytes = (size_t)KW * l3d_dtype_size(cp->dt);
    for (int64_t i = 0; i < rows; i++)
        l3d_be_copy_d2d(cp->be, elem(cp->dt, kv, i * KW), elem(cp->dt, qkv, i * W + NH * HS),
                        bytes);
}

/* the K|V block cur (cnt elements of the model's type) as the block kernels read it: widened
 * into kvw under fp32, cur itself otherwise */
static const void *keys(struct l3d_cp *cp, const void *cur, int64_t cnt) {
    if (cp->rdt == cp->dt) return cur;
    l3d_be_convert(cp->be, cp->rdt, cp->kvw, cp->dt, cur, cnt);
    return cp->kvw;
}

/* L3D_CP_SERIAL=1 (benchmarks): every transfer waited for as soon as it is posted, before the
 * block computes, so comm_s is the whole transfer time (bench/cp.sh: the fraction hidden) */
static bool serial(void) {
    static int on = -1;
    if (on < 0) on = getenv("L3D_CP_SERIAL") && strcmp(getenv("L3D_CP_SERIAL"), "1") == 0;
    return on;
}

static void wait2(struct l3d_cp *cp, l3d_req rq[2]) {
    double t0 = l3d_time_s();
    l3d_comm_wait(cp->comm, &rq[0]);
    l3d_comm_wait(cp->comm, &rq[1]);
    cp->comm_s += l3d_time_s() - t0;
}

/* Lets the transfers in flight progress between two block kernels: MPI moves a large message
 * (a rendezvous) only inside its calls, so without these tests it would move at the wait, after
 * the computation it was meant to hide behind (docs/DESIGN.md, "Progress"). */
static void poll(struct l3d_cp *cp, l3d_req *rq, int n) {
    for (int i = 0; i < n; i++) l3d_comm_test(cp->comm, &rq[i]);
}

/* the next block's K|V (or dK|dV sum) on its way: sent to ring rank + 1, received from - 1 */
static void pass(struct l3d_cp *cp, enum l3d_dtype t, const void *send, void *recv, int64_t n,
                 int tag, l3d_req rq[2]) {
    int size = cp->comm->size, r = cp->comm->rank;
    l3d_be_sync(cp->be); /* the sent buffer is complete before MPI reads it */
    l3d_comm_send(cp->comm, send, n, t, (r + 1) % size, tag, &rq[0]);
    l3d_comm_recv(cp->comm, recv, n, t, (r + size - 1) % size, tag, &rq[1]);
    cp->bytes += n * (int64_t)l3d_dtype_size(t);
    if (serial()) wait2(cp, rq);
}

/* The ring's forward in its type cp->rdt: out, qkv of that type; the K|V blocks from qkv16, the
 * same tensor in the model's type */
static void forward_in(struct l3d_cp *cp, void *out, float *lse, const void *qkv,
                       const void *qkv16, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                       int64_t HS) {
    enum l3d_dtype dt = cp->rdt;
    int n = cp->comm->size, r = cp->comm->rank;
    int64_t W = (NH + 2 * NKV) * HS, KW = 2 * NKV * HS, C = NH * HS, c = T / 2, cnt = B * T * KW;
    L3D_ASSERT(T % 2 == 0 && cnt <= cp->cap);
    pack(cp, cp->kv[0], qkv16, B * T, NH, NKV, HS);
    bool have[2] = {false, false}; /* a query chunk's first block writes out and lse */
    for (int s = 0; s < n; s++) {
        int src = (r - s + n) % n;
        l3d_req rq[2];
        memset(rq, 0, sizeof rq);
        if (s < n - 1) pass(cp, cp->dt, cp->kv[s % 2], cp->kv[(s + 1) % 2], cnt, L3D_TAG_CP_KV, rq);
        const void *cur = keys(cp, cp->kv[s % 2], cnt);
        for (int qc = 0; qc < 2; qc++)
            for (int kc = 0; kc < 2; kc++) {
                struct l3d_attn_block g = pair(cp, B, T, NH, NKV, HS, qc, src, kc);
                if (g.k_pos > g.q_pos) continue;
                const void *k = off(cp, cur, kc * c * KW), *q = off(cp, qkv, qc * c * W);
                void *o = off(cp, out, qc * c * C);
                if (!have[qc]) {
                    l3d_be_attention_block_forward(cp->be, dt, o, lse + qc * c, q, k,
                                                   off(cp, k, NKV * HS), &g);
                    have[qc] = true;
                    poll(cp, rq, 2);
                    continue;
                }
                void *po = off(cp, cp->part, qc * c * C);
                l3d_be_attention_block_forward(cp->be, dt, po, cp->part_lse + qc * c, q, k,
                                               off(cp, k, NKV * HS), &g);
                l3d_be_attention_merge(cp->be, dt, o, lse + qc * c, po, cp->part_lse + qc * c,
                                       &g);
                poll(cp, rq, 2);
            }
        if (s < n - 1) wait2(cp, rq);
    }
}

/* --cp-reduce-dtype fp32 with 16-bit activations: the ring runs the fp32 kernels on the widened
 * q, k, v (bf16 and fp16 values and their products are exact in fp32, and one process's 16-bit
 * attention widens them too, cpu.c), its partial outputs merge in fp32 and the output is rounded
 * to the model's type once, as one process's. */
static void ring_forward(void *ctx, enum l3d_dtype dt, void *out, float *lse, const void *qkv,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct l3d_cp *cp = ctx;
    L3D_ASSERT(dt == cp->dt);
    if (cp->rdt == dt) {
        forward_in(cp, out, lse, qkv, qkv, B, T, NH, NKV, HS);
        return;
    }
    int64_t W = (NH + 2 * NKV) * HS, C = NH * HS;
    l3d_be_convert(cp->be, cp->rdt, cp->wqkv, dt, qkv, B * T * W);
    forward_in(cp, cp->wout, lse, cp->wqkv, qkv, B, T, NH, NKV, HS);
    l3d_be_convert(cp->be, dt, out, cp->rdt, cp->wout, B * T * C);
}

/* One step of backward: the gradients of block src (keys in kv) into dq (dqkv's) and dkv. */
static void backward_block(struct l3d_cp *cp, void *dqkv, void *dkv, const void *dout,
                           const void *qkv, const void *kv, const void *out, const float *lse,
                           int src, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                           l3d_req *rq) {
    int64_t W = (NH + 2 * NKV) * HS, KW = 2 * NKV * HS, C = NH * HS, c = T / 2;
    for (int qc = 0; qc < 2; qc++)
        for (int kc = 0; kc < 2; kc++) {
            struct l3d_attn_block g = pair(cp, B, T, NH, NKV, HS, qc, src, kc);
            if (g.k_pos > g.q_pos) continue;
            void *dk = off(cp, dkv, kc * c * KW);
            const void *k = off(cp, kv, kc * c * KW);
            l3d_be_attention_block_backward(
                cp->be, cp->rdt, off(cp, dqkv, qc * c * W), dk, off(cp, dk, NKV * HS),
                off(cp, dout, qc * c * C), off(cp, qkv, qc * c * W), k, off(cp, k, NKV * HS),
                off(cp, out, qc * c * C), lse + qc * c, &g);
            poll(cp, rq, 4);
        }
}

/* The ring's backward in its type cp->rdt (all tensors of that type; the K|V blocks from qkv16,
 * as forward_in): dkv[part] holds this step's block gradients; the running sum of the block
 * arrives in dkv[in] while they compute, then takes them and travels on (cp.h). */
static void backward_in(struct l3d_cp *cp, void *dqkv, const void *dout, const void *qkv,
                        const void *qkv16, const void *out, const float *lse, int64_t B,
                        int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    enum l3d_dtype dt = cp->rdt;
    int n = cp->comm->size, r = cp->comm->rank;
    int64_t W = (NH + 2 * NKV) * HS, KW = 2 * NKV * HS, cnt = B * T * KW;
    size_t bytes = (size_t)cnt * l3d_dtype_size(dt);
    L3D_ASSERT(T % 2 == 0 && cnt <= cp->cap);
    pack(cp, cp->kv[0], qkv16, B * T, NH, NKV, HS);
    int part = 0, acc = -1, in = -1;
    for (int s = 0; s < n; s++) {
        l3d_req rq[4], *rd = rq + 2; /* K|V, then the dK|dV sum */
        memset(rq, 0, sizeof rq);
        if (s < n - 1) pass(cp, cp->dt, cp->kv[s % 2], cp->kv[(s + 1) % 2], cnt, L3D_TAG_CP_KV, rq);
        if (s > 0) {
            in = 3 - part - acc; /* the buffer neither computed into nor in flight */
            pass(cp, dt, cp->dkv[acc], cp->dkv[in], cnt, L3D_TAG_CP_DKV, rd);
        }
        const void *cur = keys(cp, cp->kv[s % 2], cnt);
        l3d_be_memset(cp->be, cp->dkv[part], 0, bytes);
        backward_block(cp, dqkv, cp->dkv[part], dout, qkv, cur, out, lse, (r - s + n) % n, B, T,
                       NH, NKV, HS, rq);
        if (s < n - 1) wait2(cp, rq);
        if (s == 0) {
            acc = part;
            part = 1;
            continue;
        }
        wait2(cp, rd);
        l3d_be_add_inplace(cp->be, dt, cp->dkv[in], cp->dkv[part], cnt);
        acc = in;
    }
    /* the last hop: each block's sum home to its owner, added into dqkv's K|V rows */
    in = 3 - part - acc;
    l3d_req rd[2];
    memset(rd, 0, sizeof rd);
    pass(cp, dt, cp->dkv[acc], cp->dkv[in], cnt, L3D_TAG_CP_DKV, rd);
    wait2(cp, rd);
    for (int64_t i = 0; i < B * T; i++)
        l3d_be_add_inplace(cp->be, dt, off(cp, dqkv, i * W + NH * HS), off(cp, cp->dkv[in], i * KW),
                           KW);
}

/* fp32 ring (ring_forward): dqkv widened, dQ and the dK|dV sums accumulated in fp32 (the sums
 * travel in fp32), rounded back once; dout into the forward's partial-output buffer, out (the
 * rounded output, which one process's backward reads too) into the forward's fp32 output. */
static void ring_backward(void *ctx, enum l3d_dtype dt, void *dqkv, const void *dout,
                          const void *qkv, const void *out, const float *lse, int64_t B,
                          int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct l3d_cp *cp = ctx;
    L3D_ASSERT(dt == cp->dt);
    if (cp->rdt == dt) {
        backward_in(cp, dqkv, dout, qkv, qkv, out, lse, B, T, NH, NKV, HS);
        return;
    }
    int64_t W = (NH + 2 * NKV) * HS, C = NH * HS;
    l3d_be_convert(cp->be, cp->rdt, cp->wqkv, dt, qkv, B * T * W);
    l3d_be_convert(cp->be, cp->rdt, cp->wdqkv, dt, dqkv, B * T * W);
    l3d_be_convert(cp->be, cp->rdt, cp->part, dt, dout, B * T * C);
    l3d_be_convert(cp->be, cp->rdt, cp->wout, dt, out, B * T * C);
    backward_in(cp, cp->wdqkv, cp->part, cp->wqkv, qkv, cp->wout, lse, B, T, NH, NKV, HS);
    l3d_be_convert(cp->be, dt, dqkv, cp->rdt, cp->wdqkv, B * T * W);
}

/* the ring's type: fp32 on request under 16-bit activations, else the model's */
static enum l3d_dtype ring_type(enum l3d_dtype dt, bool fp32) {
    return fp32 && dt != L3D_F32 ? L3D_F32 : dt;
}

size_t l3d_cp_bytes(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, enum l3d_dtype dt,
                    bool fp32) {
    enum l3d_dtype rdt = ring_type(dt, fp32);
    int64_t KV = B * T * 2 * NKV * HS, O = B * T * NH * HS, W = KV + O;
    size_t e = l3d_dtype_size(rdt);
    /* the K|V block widened, qkv, dqkv and out widened */
    size_t wide = rdt != dt ? (size_t)(KV + 2 * W + O) * e : 0;
    return (size_t)(2 * KV) * l3d_dtype_size(dt) + (size_t)(3 * KV + O) * e +
           (size_t)(B * NH * T) * 4 + wide;
}

/* the ring's buffers (l3d_cp_bytes), false when one does not fit */
static bool alloc_ring(struct l3d_cp *cp, int64_t B, int64_t T, int64_t NH, int64_t HS) {
    struct l3d_backend *be = cp->be;
    size_t e = l3d_dtype_size(cp->rdt), kvb = (size_t)cp->cap * e;
    size_t ob = (size_t)(B * T * NH * HS) * e, wb = kvb + ob;
    size_t kv16 = (size_t)cp->cap * l3d_dtype_size(cp->dt); /* K|V travel in the model's type */
    bool ok = true;
    for (int i = 0; i < 2; i++) ok = ok && (cp->kv[i] = l3d_be_alloc(be, kv16, "CP ring K|V"));
    for (int i = 0; i < 3; i++) ok = ok && (cp->dkv[i] = l3d_be_alloc(be, kvb, "CP ring dK|dV"));
    ok = ok && (cp->part = l3d_be_alloc(be, ob, "CP partial out"));
    ok = ok && (cp->part_lse = l3d_be_alloc(be, (size_t)(B * NH * T) * 4, "CP partial lse"));
    if (cp->rdt == cp->dt) return ok;
    ok = ok && (cp->kvw = l3d_be_alloc(be, kvb, "CP fp32 K|V"));
    ok = ok && (cp->wqkv = l3d_be_alloc(be, wb, "CP fp32 qkv"));
    ok = ok && (cp->wdqkv = l3d_be_alloc(be, wb, "CP fp32 dqkv"));
    return ok && (cp->wout = l3d_be_alloc(be, ob, "CP fp32 out"));
}

l3d_status l3d_cp_attach(struct l3d_cp *cp, struct l3d_gpt *m, struct l3d_comm *cp_comm,
                          bool fp32) {
    memset(cp, 0, sizeof *cp);
    cp->comm = cp_comm;
    cp->be = m->be;
    cp->dt = m->dt;
    cp->rdt = ring_type(m->dt, fp32);
    if (cp_comm->size == 1) return L3D_OK;
    if (m->attn_naive)
        return l3d_error(L3D_ERR_ARG, "L3D_ATTENTION=naive with --cp %d: the ring runs the tiled "
                         "kernel's blocks; unset L3D_ATTENTION", cp_comm->size);
    int64_t B = m->Bmax, T = m->Tmax, NH = m->shard.head_count, HS = l3d_model_head_dim(&m->cfg);
    int64_t NKV = NH; /* GPT-2: a key/value head per head */
    cp->cap = B * T * 2 * NKV * HS;
    if (!alloc_ring(cp, B, T, NH, HS)) {
        l3d_cp_detach(cp);
        return l3d_error(L3D_ERR_OOM, "cannot allocate the context-parallel ring's buffers "
                         "(%.1f MiB): lower --batch or --seq-len, or raise --cp%s",
                         (double)l3d_cp_bytes(B, T, NH, NKV, HS, m->dt, fp32) / 1048576.0,
                         cp->rdt != cp->dt ? ", or drop --cp-reduce-dtype fp32" : "");
    }
    m->hooks.cp_size = cp_comm->size;
    m->hooks.cp_rank = cp_comm->rank;
    m->hooks.cp_ctx = cp;
    m->hooks.cp_attention_forward = ring_forward;
    m->hooks.cp_attention_backward = ring_backward;
    return L3D_OK;
}

void l3d_cp_detach(struct l3d_cp *cp) {
    if (!cp->be) return;
    for (int i = 0; i < 2; i++) l3d_be_free(cp->be, cp->kv[i]);
    for (int i = 0; i < 3; i++) l3d_be_free(cp->be, cp->dkv[i]);
    l3d_be_free(cp->be, cp->part);
    l3d_be_free(cp->be, cp->part_lse);
    l3d_be_free(cp->be, cp->kvw);
    l3d_be_free(cp->be, cp->wqkv);
    l3d_be_free(cp->be, cp->wdqkv);
    l3d_be_free(cp->be, cp->wout);
    memset(cp, 0, sizeof *cp);
}
