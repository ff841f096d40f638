/*
 * Tensor-parallel partial sums in fp32 (--tp-reduce-dtype fp32; README "Mixed precision",
 * docs/DESIGN.md "Tensor parallelism"). In 16-bit precision a tensor-parallel layout sums
 * partial activations: the row-parallel products' outputs (attention's output projection, the
 * MLP's down projection) in forward, the column-parallel products' input gradients (q|k|v, the
 * MLP's first product, the vocabulary-parallel head) in backward. By default, as Megatron-LM, each
 * rank rounds its partial product to 16 bits and the sum travels and is rounded in 16 bits; one
 * process rounds the whole sum once. Here the partial products are made in fp32 on fp32 copies
 * of their 16-bit operands (the product of two bf16 or fp16 numbers is exact in fp32, so this is
 * the 16-bit product with fp32 accumulation, up to the order of the sums), summed over the group
 * in fp32 (twice the bytes), and rounded to the model's type once, after the sum and the bias.
 * No new kernel: l3d_be_convert and the fp32 products, which every backend has.
 *
 * One allocation at start-up (m->tp32), its regions in floats, N = B T rows:
 *   xa     the widened left operand: N rows of the widest local product of the layers (q|k|v,
 *          the MLP's first product; at least C), through which the head's input gradient
 *          passes a block of rows at a time (its local vocabulary is wider)
 *   wa     the widened weight: C times the widest product's width, the head's vocabulary slice
 *   sum    (N, C) the partial, then summed, product
 *   local  (N / sp, C) this rank's rows of the sum (sequence parallelism only)
 *   bias   (C) the widened row-parallel bias
 */
#include "tpsum.h"

struct l3d_tpsum_state {
    void *base;
    float *xa, *wa, *sum, *local, *bias;
    int64_t xa_floats; /* the widened operand's room: rows of a block = xa_floats / width */
};

enum { R_XA, R_WA, R_SUM, R_LOCAL, R_BIAS, R_N };

static int64_t align16(int64_t floats) { return (floats + 15) / 16 * 16; } /* 64 bytes */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The regions' floats for N rows of shard sh (the widths as gpt.c's widths()). */
static void regions(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int64_t N,
                    int64_t r[R_N]) {
    int64_t C = cfg->C, hd = l3d_model_head_dim(cfg), Ca = (int64_t)sh->head_count * hd;
    int64_t qkv = Ca + 2 * (int64_t)l3d_shard_kv_count(cfg, sh) * hd;
    bool dense = l3d_shard_moe_layers(cfg, sh) < sh->layer_count; /* a layer with an MLP */
    int64_t F = dense ? sh->ffn_count : 0, Fm = cfg->mlp == L3D_MLP_SWIGLU ? 2 * F : F;
    int64_t wide = sh->layer_count > 0 ? max64(qkv, Fm) : 0; /* >= Ca, F: their inputs' widths */
    int64_t V = sh->has_head ? sh->vocab_count : 0;
    r[R_XA] = max64(N * max64(wide, C), V); /* a row of the head's gradient at least */
    r[R_WA] = C * max64(wide, V);
    r[R_SUM] = N * C;
    r[R_LOCAL] = sh->sp_size > 1 ? N / sh->sp_size * C : 0;
    r[R_BIAS] = C;
}

size_t l3d_tpsum_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                           int T, enum l3d_dtype dt) {
    if (!sh->tp_reduce_f32 || dt == L3D_F32) return 0;
    int64_t r[R_N], floats = 0;
    regions(cfg, sh, (int64_t)B * T, r);
    for (int i = 0; i < R_N; i++) floats += align16(r[i]);
    return (size_t)floats * sizeof(float);
}

l3d_status l3d_tpsum_init(struct l3d_gpt *m) {
    size_t bytes = l3d_tpsum_act_bytes(&m->cfg, &m->shard, m->Bmax, m->Tmax, m->dt);
    if (!bytes) return L3D_OK;
    struct l3d_tpsum_state *s = l3d_calloc(sizeof *s, "tp fp32 sums");
    s->base = l3d_be_alloc(m->be, bytes, "tp fp32 sums");
    if (!s->base) {
        l3d_free(s);
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f MiB for the tensor-parallel fp32 "
                         "sums (--tp-reduce-dtype fp32): lower --batch or --seq-len, or sum in "
                         "the model's type (--tp-reduce-dtype model)", bytes / 1048576.0);
    }
    l3d_be_memset(m->be, s->base, 0, bytes); /* first touch now, not in the step */
    int64_t r[R_N], off = 0;
    regions(&m->cfg, &m->shard, (int64_t)m->Bmax * m->Tmax, r);
    s->xa_floats = r[R_XA];
    float **const at[R_N] = {&s->xa, &s->wa, &s->sum, &s->local, &s->bias};
    for (int i = 0; i < R_N; i++) {
        *at[i] = (float *)s->base + off;
        off += align16(r[i]);
    }
    m->tp32 = s;
    return L3D_OK;
}

void l3d_tpsum_free(struct l3d_gpt *m) {
    if (!m->tp32) return;
    l3d_be_free(m->be, m->tp32->base);
    l3d_free(m->tp32);
    m->tp32 = NULL;
}

bool l3d_tpsum_on(const struct l3d_gpt *m) { return m->tp32 != NULL; }

/* The fp32 sum's rows rounded into dst: with sequence parallelism reduce-scattered to this rank's
 * N / sp rows first, else all-reduced (nothing to sum without the TP hooks: one process). */
static void sum_round(struct l3d_gpt *m, void *dst, int64_t N) {
    struct l3d_tpsum_state *s = m->tp32;
    int64_t C = m->cfg.C, sp = m->shard.sp_size;
    if (sp > 1) {
        m->hooks.tp_reduce_scatter(m->hooks.ctx, s->sum, s->local, N / sp * C, L3D_F32);
        l3d_be_convert(m->be, m->dt, dst, L3D_F32, s->local, N / sp * C);
        return;
    }
    if (m->hooks.tp_all_reduce) m->hooks.tp_all_reduce(m->hooks.ctx, s->sum, N * C, L3D_F32);
    l3d_be_convert(m->be, m->dt, dst, L3D_F32, s->sum, N * C);
}

void l3d_tpsum_row_forward(struct l3d_gpt *m, void *out, const void *inp, const void *w,
                           const void *b, int64_t N, int64_t Cin) {
    struct l3d_tpsum_state *s = m->tp32;
    const struct l3d_shard *sh = &m->shard;
    int64_t C = m->cfg.C, sp = sh->sp_size, Nl = N / sp;
    l3d_be_convert(m->be, L3D_F32, s->xa, m->dt, inp, N * Cin);
    l3d_be_convert(m->be, L3D_F32, s->wa, m->dt, w, C * Cin);
    /* the bias once across the group, as gpt.c's 16-bit path adds it: under SP on the rows this
     * rank keeps, else on the rank that adds the row biases (every rank when nothing is summed) */
    bool bias = b && (sp > 1 || sh->adds_row_bias || !m->hooks.tp_all_reduce);
    if (bias) l3d_be_convert(m->be, L3D_F32, s->bias, m->dt, b, C);
    l3d_be_matmul_forward(m->be, L3D_F32, s->sum, s->xa, s->wa, bias && sp == 1 ? s->bias : NULL,
                          N, Cin, C);
    if (bias && sp > 1)
        l3d_be_add_bias(m->be, L3D_F32, s->sum + sh->sp_rank * Nl * C, s->bias, Nl, C);
    sum_round(m, out, N);
}

void l3d_tpsum_zero(struct l3d_gpt *m, int64_t N) {
    l3d_be_memset(m->be, m->tp32->sum, 0, (size_t)(N * m->cfg.C) * sizeof(float));
}

void l3d_tpsum_dinp(struct l3d_gpt *m, int64_t r0, int64_t n, const void *dout, const void *w,
                    int64_t C, int64_t OC, bool widen_w) {
    struct l3d_tpsum_state *s = m->tp32;
    if (widen_w) l3d_be_convert(m->be, L3D_F32, s->wa, m->dt, w, OC * C);
    int64_t rows = s->xa_floats / OC; /* >= 1 (regions); n at once but for the head's */
    for (int64_t b0 = 0; b0 < n; b0 += rows) {
        int64_t nb = n - b0 < rows ? n - b0 : rows;
        const char *d = (const char *)dout + (size_t)(b0 * OC) * m->es;
        l3d_be_convert(m->be, L3D_F32, s->xa, m->dt, d, nb * OC);
        l3d_be_matmul_backward(m->be, L3D_F32, s->sum + (r0 + b0) * C, NULL, NULL, s->xa, NULL,
                               s->wa, nb, C, OC);
    }
}

void l3d_tpsum_reduce(struct l3d_gpt *m, void *dinp, int64_t N) { sum_round(m, dinp, N); }

bool l3d_tpsum_reduce_begin(struct l3d_gpt *m, int64_t N) {
    if (m->shard.sp_size > 1 || !m->hooks.tp_all_reduce_begin) return false;
    m->hooks.tp_all_reduce_begin(m->hooks.ctx, m->tp32->sum, N * m->cfg.C, L3D_F32);
    return true;
}

void l3d_tpsum_reduce_end(struct l3d_gpt *m, void *dinp, int64_t N) {
    m->hooks.tp_all_reduce_end(m->hooks.ctx);
    l3d_be_convert(m->be, m->dt, dinp, L3D_F32, m->tp32->sum, N * m->cfg.C);
}
