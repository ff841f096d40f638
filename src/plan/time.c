/* Time of one micro-batch on a pipeline rank: each chunk's matrix products at their own shapes'
 * efficiency, its attention, element-wise kernels, recomputation, TP collectives and p2p
 * receives (l3d_plan_rank_time), from the rates of the layout's ranks (l3d_plan_tctx_init). */
#include <math.h>
#include <string.h>

#include "plan-impl.h"

void l3d_plan_tctx_init(struct l3d_plan_tctx *x, const struct l3d_model_spec *m,
                        const struct l3d_profile *prof, const struct l3d_plan_run *run,
                        const struct l3d_layout *lay) {
    bool fp32 = l3d_plan_trainer(run);
    /* rates: a rank is `threads` devices; ranks x threads beyond a node's devices share them */
    *x = (struct l3d_plan_tctx){.m = m, .prof = prof, .lay = lay, .fp32 = fp32, .cal = 1.0,
                                .flash = run->flash, .dropout = !fp32}; /* fp32: llm3d's trainer */
    if (run->calibrated && prof->gemm_calibration > 0) x->cal = prof->gemm_calibration;
    double share = 1.0;
    if (fp32 && run->devices > prof->devices_per_node && prof->inter_bw <= 0)
        share = (double)prof->devices_per_node / (double)run->devices; /* one oversubscribed node */
    x->share = share;
    x->threads = lay->threads;
    x->rate = l3d_plan_peak(prof, run) * lay->threads * share;
    x->bw = prof->mem_bw * prof->kernel_bw_eff * lay->threads * share;
    for (int k = 0; k < L3D_KERN_N; k++)
        x->bw_k[k] = prof->mem_bw * l3d_profile_kern_eff(prof, (enum l3d_kern)k) * lay->threads *
                     share;
    x->e = l3d_plan_bytes(run->precision.param);
    /* --tp-reduce-dtype fp32: the partial sums travel in fp32, twice a 16-bit model's bytes */
    x->tp_e = run->precision.tp_reduce_fp32 ? l3d_plan_bytes(L3D_F32) : x->e;
    x->cp_e = run->precision.cp_fp32 ? 4.0 : x->e; /* the ring's dK|dV sums in fp32 */
    x->ntok = (double)lay->micro_batch * m->maxT;
    if (lay->tp > 1) l3d_plan_link(prof, 0, lay->tp - 1, lay->tp, &x->tp_bw, &x->tp_lat);
    x->cp = 1;
}

int l3d_plan_cp_local(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                      struct l3d_model_spec *mc, struct l3d_layout *lo) {
    int cp = lay->cp > 1 ? lay->cp : 1;
    *mc = *m;
    *lo = *lay;
    mc->maxT = m->maxT / cp;
    lo->dp = lay->dp * cp;
    lo->cp = 1;
    return cp;
}

void l3d_plan_tctx_cp(struct l3d_plan_tctx *x, int cp, int tp) {
    x->cp = cp;
    if (cp > 1) l3d_plan_link(x->prof, 0, (int64_t)tp * cp - 1, tp, &x->cp_bw, &x->cp_lat);
}

/* One M x N x K product of a rank (M x K times K x N) at compute efficiency e: gemm() gives it
 * the product's own shape's (l3d_profile_gemm_eff_shape: the curve at its FLOPs, with the wave
 * quantization of its M x N output tiles), so a small micro-batch (small M) or a thin TP shard
 * (small N or K) is slower per FLOP than the cubes the curve was measured on. A rank's k threads
 * share the product at that one-core efficiency times gemm_thread_eff, which calibrate measures
 * as the same product on k threads against k single cores (not at the curve's 1/k of the FLOPs
 * too: that counted the smaller size twice; 1 on GPUs).
 * Roofline (Williams et al. 2009): never faster than moving its operands and result once through
 * memory, e (M K + K N + M N) bytes at the element-wise kernels' bandwidth. */
static double gemm_at(const struct l3d_plan_tctx *x, double M, double N, double K, double e) {
    double f = 2 * M * N * K;
    if (x->threads > 1) e *= x->prof->gemm_thread_eff;
    double compute = f / (x->rate * e * x->cal);
    double memory = x->e * (M * K + K * N + M * N) / x->bw;
    return compute > memory ? compute : memory;
}
static double gemm(const struct l3d_plan_tctx *x, double M, double N, double K) {
    return gemm_at(x, M, N, K, l3d_profile_gemm_eff_shape(x->prof, M, N, K));
}
/* c products of one M x N x K shape in one batched call (the attention's heads): each at the
 * efficiency of their stacked shape (c M x N x K: the same FLOPs and output tiles), each moving
 * its own operands. */
static double gemm_batched(const struct l3d_plan_tctx *x, double c, double M, double N, double K) {
    return c * gemm_at(x, M, N, K, l3d_profile_gemm_eff_shape(x->prof, c * M, N, K));
}

/* `count` linear layers of a rank, each on M tokens, K inputs, N outputs: the shapes the planner
 * times (linear) and `llm3d bench --calibrate --model` measures (l3d_plan_linear_shapes), from
 * the same functions below, so that a model's gemm_exact entries are the shapes planned. */
struct lin {
    double M, N, K, count;
};

/* Forward and backward of a linear layer (or l->count alike): y = x W (M x N x K); backward
 * dx = dy W^T (M x K x N) and dW = x^T dy (K x N x M), the reduction over the tokens. A
 * gemm_exact entry of the profile at this shape, measured as the trainer runs the layer, comes
 * first (l3d_profile_exact); else each product by its shape (gemm), the weight gradient at the
 * profile's efficiency by tokens where it has one (gemm_eff_wgrad: on this CPU the bf16 weight
 * gradient into the fp32 main_grad runs at half the forward's rate at 128 tokens, whatever the
 * weight's shape). */
static void linear(const struct l3d_plan_tctx *x, const struct lin *l, double *fwd, double *bwd) {
    double M = l->M, N = l->N, K = l->K, ef, ew;
    if (l3d_profile_exact(x->prof, M, N, K, &ef, &ew)) {
        *fwd += l->count * gemm_at(x, M, N, K, ef);
        *bwd += l->count * (gemm_at(x, M, K, N, ef) + gemm_at(x, K, N, M, ew));
        return;
    }
    *fwd += l->count * gemm(x, M, N, K);
    *bwd += l->count *
            (gemm(x, M, K, N) + gemm_at(x, K, N, M, l3d_profile_wgrad_eff(x->prof, M, N, K)));
}

/* A layer's attention linears on N tokens: QKV and the projection (column / row parallel), all
 * N tokens under SP too (the all-gather comes first); kv = h without grouped queries */
static int attn_lins(const struct l3d_model_spec *m, const struct l3d_layout *lay, double N,
                     struct lin *o) {
    double t = lay->tp, h = m->C, hd = l3d_model_head_dim(m);
    double q = m->NH * hd, kv = l3d_model_kv_heads(m) * hd; /* q = kv = h: GPT-2's */
    o[0] = (struct lin){N, (q + 2 * kv) / t, h, 1};
    o[1] = (struct lin){N, h, q / t, 1};
    return 2;
}

/* A dense MLP's: up (SwiGLU's gate and up fused) and down, column / row parallel */
static int dense_lins(const struct l3d_model_spec *m, const struct l3d_layout *lay, double N,
                      struct lin *o) {
    double t = lay->tp, h = m->C, f = (double)m->ffn;
    double mul = m->mlp == L3D_MLP_SWIGLU ? 2 : 1;
    o[0] = (struct lin){N, mul * f / t, h, 1};
    o[1] = (struct lin){N, h, f / t, 1};
    return 2;
}

/* The mixture of experts' (src/model/moe.c): the router (E outputs); the N K routed rows,
 * balanced over the experts (the ideal the load-balancing loss aims at), through this rank's
 * E / ep experts, one product per expert and projection on each EP rank's N K / E rows (the
 * trainer multiplies each (sending rank, expert) segment on its own: E products of N K / E
 * rows, not E / ep of ep N K / E); the shared experts on every token */
static int moe_lins(const struct l3d_model_spec *m, double N, struct lin *o) {
    const struct l3d_moe_spec *q = &m->moe;
    double h = m->C, F = (double)(q->ffn > 0 ? q->ffn : m->ffn), E = q->experts;
    double mul = m->mlp == L3D_MLP_SWIGLU ? 2 : 1, rows = N * q->top_k / E;
    int n = 0;
    o[n++] = (struct lin){N, E, h, 1};
    o[n++] = (struct lin){rows, mul * F, h, E};
    o[n++] = (struct lin){rows, h, F, E};
    if (q->shared > 0) {
        o[n++] = (struct lin){N, mul * q->shared * F, h, 1};
        o[n++] = (struct lin){N, h, q->shared * F, 1};
    }
    return n;
}

/* The LM head's (vocabulary-parallel) */
static int head_lins(const struct l3d_model_spec *m, const struct l3d_layout *lay, double N,
                     struct lin *o) {
    struct l3d_model_spec c = l3d_plan_model_gpt(m);
    o[0] = (struct lin){N, (double)c.Vp / lay->tp, m->C, 1};
    return 1;
}

/* adds shape s to out[0..*n) unless there (or out is full) */
static void add_shape(int64_t (*out)[3], int *n, int max, const struct lin *s) {
    int64_t v[3] = {llround(s->M), llround(s->N), llround(s->K)};
    for (int i = 0; i < *n; i++)
        if (out[i][0] == v[0] && out[i][1] == v[1] && out[i][2] == v[2]) return;
    if (*n < max) memcpy(out[(*n)++], v, sizeof v);
}

int l3d_plan_linear_shapes(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                           int64_t (*out)[3], int max) {
    struct l3d_model_spec mc;
    struct l3d_layout lo;
    l3d_plan_cp_local(m, lay, &mc, &lo);
    double N = (double)lay->micro_batch * mc.maxT;
    struct lin l[8];
    int n = 0, k = attn_lins(&mc, lay, N, l);
    if (mc.moe.experts == 0 || mc.moe.dense_layers > 0) k += dense_lins(&mc, lay, N, l + k);
    if (mc.moe.experts > 0) k += moe_lins(&mc, N, l + k);
    k += head_lins(&mc, lay, N, l + k);
    for (int i = 0; i < k; i++) add_shape(out, &n, max, &l[i]);
    return n;
}

/* The attention core of one layer on one micro-batch and rank (a/t heads): forward *f, backward
 * *bw. Fused (flash): 4 b s^2 h / t FLOPs forward, twice that backward (its recomputed scores
 * included), at the profile's attn_eff. Unfused, as Megatron-LM's core attention, which writes
 * the b (a/t) s^2 scores to memory and reads them back: its batched products, b (a/t) of them, at
 * the GEMM curve of their stacked shapes (forward QK^T, M = s, N = s, K = h/a, and P V, N = h/a,
 * K = s; backward dP like QK^T, dV, dQ and dK like P V), each head's bounded by moving its own
 * operands (the scores written or read), then the element-wise passes over the scores at
 * the kernels' bandwidth: softmax forward reads and writes them, backward reads probabilities
 * and gradient and writes one; attention dropout (Megatron-LM's, not llm3d's trainer) reads and
 * writes them and a byte of mask each way. The tensors are Korthikanti et al. 2022's (sec. 4.1:
 * 2as^2b of QK^T output and of softmax output, as^2b of mask, 2as^2b of dropout output). Where
 * the scores' size s^2 rivals the layer's h^2, at small h, these passes, not the FLOPs, set the
 * attention's time. */
static void attention(const struct l3d_plan_tctx *x, double *f, double *bw) {
    const struct l3d_model_spec *m = x->m;
    /* s: the rank's query rows; sk: the keys they see (context parallelism: the whole
     * sequence's, the ring's blocks each rank's 1/cp of the causal work) */
    double b = x->lay->micro_batch, s = m->maxT, sk = s * x->cp, t = x->lay->tp;
    double q = (double)m->NH * l3d_model_head_dim(m); /* the attention's channels: h for GPT-2 */
    if (x->flash) {
        *f = 4 * b * s * sk * q / t / (x->rate * x->prof->attn_eff);
        *bw = 2 * *f;
        return;
    }
    double heads = b * m->NH / t, d = l3d_model_head_dim(m), sc = heads * s * sk;
    double qk = gemm_batched(x, heads, s, sk, d), pv = gemm_batched(x, heads, s, d, sk), e = x->e;
    double pf = sc * 2 * e, pb = sc * 3 * e; /* softmax */
    if (x->dropout) {
        pf += sc * (2 * e + 1);
        pb += sc * (2 * e + 1);
    }
    *f = qk + pv + pf / x->bw;
    *bw = qk + 3 * pv + pb / x->bw;
}

/* The ring's transfers of one layer not hidden behind its attention (context parallelism,
 * src/parallel/cp.c): forward, cp - 1 steps each passing the rank's K|V (b s 2h/t elements of the
 * model's type) while a block computes (at / cp of the attention); backward, cp - 1 steps passing
 * K|V and a dK|dV sum at once (two messages on the link; the sum in the ring's type, cp_e bytes
 * an element) behind atb / cp, then the last dK|dV hop, not hidden. The part of a step's transfer
 * longer than its block is exposed. *fwd, *bwd: seconds. */
static void ring(const struct l3d_plan_tctx *x, double at, double atb, double *fwd, double *bwd) {
    *fwd = *bwd = 0;
    if (x->cp <= 1) return;
    double n = x->ntok * 2 * x->m->C / x->lay->tp / x->cp_bw;
    double kv = n * x->e + x->cp_lat, sum = n * x->cp_e + x->cp_lat;
    double f = kv - at / x->cp, b = kv + sum - atb / x->cp;
    *fwd = (x->cp - 1) * (f > 0 ? f : 0);
    *bwd = (x->cp - 1) * (b > 0 ? b : 0) + sum;
}

/* Ring all-reduce of n bytes over g ranks with bus bandwidth bw and per-message latency lat:
 * 2 (g - 1) / g n / bw + 2 (g - 1) lat (Patarasuk & Yuan 2009; NCCL's "bus bandwidth"). */
double l3d_plan_all_reduce(double n, int g, double bw, double lat) {
    if (g <= 1) return 0.0;
    return 2.0 * (g - 1) / g * n / bw + 2.0 * (g - 1) * lat;
}

/* The link between ranks lo and hi, the ends of a group on the rank grid: the node's NICs shared by
 * the `senders` devices that use them at once when the group crosses nodes, else the pair link
 * when both lie in one pair, else the node's links. */
void l3d_plan_link(const struct l3d_profile *p, int64_t lo, int64_t hi, int senders, double *bw,
                   double *lat) {
    int64_t dpn = p->devices_per_node;
    /* a machine without a network (inter_bw 0, the local profile) runs every rank on its one node,
     * oversubscribed when ranks x threads exceed its devices */
    if (lo / dpn != hi / dpn && p->inter_bw > 0) {
        /* the node's NICs, shared by the devices that send at once */
        *bw = p->inter_bw / (senders < dpn ? senders : dpn);
        *lat = p->inter_lat;
    } else if (p->pair_size > 1 && lo / p->pair_size == hi / p->pair_size) {
        *bw = p->pair_bw;
        *lat = p->intra_lat;
    } else {
        *bw = p->intra_bw > 0 ? p->intra_bw : p->mem_bw;
        *lat = p->intra_lat;
    }
}

/* an all-reduce of n bytes over the TP group */
static double tp_all_reduce(const struct l3d_plan_tctx *x, double n) {
    return l3d_plan_all_reduce(n, x->lay->tp, x->tp_bw, x->tp_lat);
}

/* The TP sum of n elements of partial activations or input gradients: an all-reduce, or under
 * SP an all-gather and a reduce-scatter of the same bus volume, only the sum's half of it in
 * tp_e (--tp-reduce-dtype fp32; the gather moves the model's type). */
static double tp_sum(const struct l3d_plan_tctx *x, double n) {
    double ar = tp_all_reduce(x, n * x->tp_e);
    return x->lay->sp ? (ar + tp_all_reduce(x, n * x->e)) / 2 : ar;
}

/* What the last chunk adds to o. */
static void head_time(const struct l3d_plan_tctx *x, struct l3d_plan_parts *o) {
    const struct l3d_model_spec *m = x->m;
    const struct l3d_layout *lay = x->lay;
    double h = m->C, N = x->ntok, e = x->e;
    /* LM head (vocabulary-parallel) and cross-entropy on fp32 logits: max, sum-exp, gradient */
    struct lin hl;
    head_lins(m, lay, N, &hl);
    double Vl = hl.N;
    double hg = 0, hgb = 0;
    linear(x, &hl, &hg, &hgb);
    /* the trainer keeps the logits in its own type (16 bits in mixed precision); Megatron-LM
     * casts them to fp32 for the loss (Korthikanti et al. 2022, sec. 4.3: 4 s b v bytes) */
    double le = x->fp32 ? e : l3d_plan_bytes(L3D_F32);
    double hel = N * Vl * le * 5 / x->bw + N * h * e * 2 * 3 / x->bw_k[L3D_KERN_LAYERNORM];
    o->gemm += hg + hgb;
    o->elem += hel;
    o->bwd += hgb;
    if (lay->tp > 1)
        o->tp += (1 - x->prof->tp_overlap) *
                 (tp_sum(x, N * h) + 3 * tp_all_reduce(x, N * l3d_plan_bytes(L3D_F32)));
}

/* One all-to-all of the EP group: each rank sends (ep - 1) / ep of its n bytes, to the group's
 * members on its node over the node's links and to the others over the NICs, which every device
 * of the node shares (every rank is in an EP group exchanging at once); the two at once, so the
 * slower sets the time, with a latency for each of the ep - 1 peers. */
double l3d_plan_all_to_all(const struct l3d_plan_tctx *x, double n) {
    const struct l3d_profile *p = x->prof;
    int64_t ep = x->lay->ep > 1 ? x->lay->ep : 1;
    if (ep == 1) return 0.0;
    /* the group: ep consecutive ranks of dp x cp (ring ranks first: tp apart; DP ranks tp cp pp
     * apart, src/parallel/topo.c), from the first; its members on that one's node (all of them
     * without a network) and the farthest of each kind */
    int64_t tp = x->lay->tp, cp = x->cp, pp = x->lay->pp, dpn = p->devices_per_node;
    int64_t q = 0, near = 0, far = 0;
    for (int64_t j = 0; j < ep; j++) {
        int64_t d = j / cp * tp * cp * pp + j % cp * tp;
        if (p->inter_bw <= 0 || d < dpn) q++, near = d;
        far = d;
    }
    double on = 0, off = 0, bw, lat = 0, ilat = 0;
    if (q > 1) {
        l3d_plan_link(p, 0, near, 1, &bw, &ilat);
        on = (double)(q - 1) / ep * n / bw;
    }
    if (q < ep) {
        l3d_plan_link(p, 0, far, (int)dpn, &bw, &lat);
        off = (double)(ep - q) / ep * n / bw;
    }
    return (on > off ? on : off) + (double)(q - 1) * ilat + (double)(ep - q) * lat;
}

/* A layer's parts: its products forward (g) and backward (gb), its element-wise passes (el),
 * and expert parallelism's exchanges forward (af) and backward (ab). */
struct layer_cost {
    double g, gb, el, af, ab;
};

/* The MLP of a dense layer (dense_lins) and its activation (GELU on f/t, SwiGLU reading two
 * f-wide inputs). */
static void dense_mlp(const struct l3d_plan_tctx *x, struct layer_cost *o) {
    const struct l3d_model_spec *m = x->m;
    double t = x->lay->tp, N = x->ntok, f = (double)m->ffn;
    struct lin l[2];
    for (int i = 0, n = dense_lins(m, x->lay, N, l); i < n; i++) linear(x, &l[i], &o->g, &o->gb);
    o->el += N * x->e * (m->mlp == L3D_MLP_SWIGLU ? 3 : 2) * f / t / x->bw_k[L3D_KERN_GELU];
}

/* The mixture of experts in place of the MLP: its products (moe_lins); the gather into expert
 * order and the weighted combine (read + write of N K rows, the combine's output read and
 * written), backward about twice the traffic; with expert parallelism the rows dispatched and
 * combined by all-to-all, twice forward (and the routing's counts, a latency) and twice
 * backward. */
static void moe_mlp(const struct l3d_plan_tctx *x, struct layer_cost *o) {
    const struct l3d_model_spec *m = x->m;
    const struct l3d_moe_spec *q = &m->moe;
    double h = m->C, N = x->ntok, F = (double)(q->ffn > 0 ? q->ffn : m->ffn);
    double E = q->experts, K = q->top_k, ep = x->lay->ep > 1 ? x->lay->ep : 1;
    double mul = m->mlp == L3D_MLP_SWIGLU ? 2 : 1;
    struct lin l[5];
    for (int i = 0, n = moe_lins(m, N, l); i < n; i++) linear(x, &l[i], &o->g, &o->gb);
    o->el += N * x->e * ((mul + 1) * (K + q->shared) * F / x->bw_k[L3D_KERN_GELU] +
                         (3 * K * h + 2 * h) / x->bw_k[L3D_KERN_RESIDUAL]);
    double rows_bytes = N * K * h * x->e;
    o->ab = 2 * l3d_plan_all_to_all(x, rows_bytes);
    o->af = o->ab + (ep > 1 ? l3d_plan_all_to_all(x, E * 8.0) : 0.0);
}

/* Seconds of one micro-batch through one chunk, forward + backward (+ recomputation), split
 * (struct l3d_plan_parts), its p2p left out. */
static void chunk_time(const struct l3d_plan_tctx *x, const struct l3d_plan_chunk *ch,
                       struct l3d_plan_parts *o) {
    const struct l3d_model_spec *m = x->m;
    const struct l3d_layout *lay = x->lay;
    double t = lay->tp, h = m->C, N = x->ntok, e = x->e;
    double spdiv = lay->sp ? t : 1.0;
    /* the layers: dense ones and mixture-of-experts ones (moe.dense_layers lead) */
    double Ll = ch->sh.layer_count, Lm = l3d_shard_moe_layers(m, &ch->sh), Ld = Ll - Lm;
    memset(o, 0, sizeof *o);
    /* per layer: QKV and the attention projection (column / row parallel) on the micro-batch's
     * b s tokens (all of them under SP too: the all-gather comes first), forward and its two
     * backward products; then the MLP, or the experts (dense_mlp, moe_mlp) */
    double hd = l3d_model_head_dim(m), q = m->NH * hd, kv = l3d_model_kv_heads(m) * hd;
    struct layer_cost base = {0};
    struct lin al[2];
    for (int i = 0, n = attn_lins(m, lay, N, al); i < n; i++) linear(x, &al[i], &base.g, &base.gb);
    /* the attention core (attention(): fused at attn_eff, or its products and score passes) */
    double at, atb, rf, rb;
    attention(x, &at, &atb);
    ring(x, at, atb, &rf, &rb);
    /* element-wise passes, read + write: 2 LayerNorms (2 h each), 2 residual adds (3 h), each at
     * its own kernel's bandwidth (the MLP's activation with the MLP); backward about twice the
     * traffic of the same kernels */
    base.el = N * e * (4 * h / spdiv / x->bw_k[L3D_KERN_LAYERNORM] +
                       6 * h / spdiv / x->bw_k[L3D_KERN_RESIDUAL]);
    /* RoPE rotates q and k in place (read + write), a streaming pass like a residual add */
    if (m->pos == L3D_POS_ROPE) base.el += N * e * 2 * (q + kv) / t / x->bw_k[L3D_KERN_RESIDUAL];
    struct layer_cost d = base, mx = base;
    dense_mlp(x, &d);
    if (Lm > 0) moe_mlp(x, &mx);
    /* two all-reduces forward (with SP an all-gather and a reduce-scatter each, the same bus
     * volume), two backward; the profile's tp_overlap of it hidden behind compute */
    double ar = lay->tp > 1 ? (1 - x->prof->tp_overlap) * tp_sum(x, N * h) : 0.0;
    double g = Ld * d.g + Lm * mx.g, gb = Ld * d.gb + Lm * mx.gb, el = Ld * d.el + Lm * mx.el;
    o->gemm = g + gb;
    o->attn = Ll * (at + atb);
    o->elem = 3 * el;
    o->tp = Ll * 4 * ar;
    o->cp = Ll * (rf + rb);
    o->a2a = Lm * (mx.af + mx.ab);
    o->bwd = gb + Ll * (atb + 2 * ar + rb) + 2 * el + Lm * mx.ab;
    o->wgt = gb / 2; /* of the two backward products, dW = x^T dy (the head's: with B) */
    /* what is recomputed before each layer's backward: full, the whole forward from the layer's
     * input (its products, attention, element-wise passes, its two TP collectives and its
     * exchanges: Korthikanti et al. 2022, sec. 5, "full activation recomputation"); selective,
     * the attention core from QK^T through softmax and dropout to the product with V (their
     * sec. 5, Figure 3), i.e. its forward, and nothing with a fused attention, which keeps no
     * scores to drop and whose backward already recomputes them (counted in attn_eff):
     * Megatron-LM checkpoints the core attention only without flash attention */
    if (lay->recompute == L3D_RECOMPUTE_FULL) {
        o->rec = g + Ll * (at + 2 * ar + rf) + el + Lm * mx.af;
        o->gemm += g;
        o->attn += Ll * at;
        o->elem += el;
        o->tp += Ll * 2 * ar;
        o->cp += Ll * rf;
        o->a2a += Lm * mx.af;
    } else if (lay->recompute == L3D_RECOMPUTE_SELECTIVE && !x->flash) {
        o->rec = Ll * at;
        o->attn += Ll * at;
    }
    if (ch->last) head_time(x, o);
    if (ch->first) {
        /* gather + position add, and its backward: streaming passes, as a residual add */
        o->elem += N * h * e * 3 * 3 / x->bw_k[L3D_KERN_RESIDUAL];
        if (lay->tp > 1)
            o->tp += (1 - x->prof->tp_overlap) * tp_all_reduce(x, N * h * e);
    }
    o->total = o->gemm + o->attn + o->elem + o->tp + o->p2p + o->cp + o->a2a;
}

/* The receives of chunk ch of pipeline rank r, a micro-batch: *prev its input activation from the
 * previous virtual stage, *next its output's gradient from the next one (0 at the ends). Megatron's
 * scatter/gather sends 1/t of it per TP rank in mixed precision, the trainer the whole (B,T,C). */
/* The transfer from pipeline rank r to rank pr (0 on the same rank: zbv's turn). */
static double p2p_time(const struct l3d_plan_tctx *x, int r, int pr) {
    int t = x->lay->tp;
    double msg = x->ntok * x->m->C * x->e / (x->fp32 ? 1.0 : t), bw, lat;
    int64_t me = (int64_t)r * t, peer = (int64_t)pr * t;
    if (pr == r) return 0.0;
    l3d_plan_link(x->prof, me < peer ? me : peer, me < peer ? peer + t - 1 : me + t - 1, t, &bw,
                  &lat);
    return msg / bw + lat;
}

static void chunk_p2p(const struct l3d_plan_tctx *x, const struct l3d_plan_chunk *ch, int r,
                      int k, double *prev, double *next) {
    int p = x->lay->pp, vs = l3d_pp_vstage(x->lay->schedule, p, r, k), pr, c;
    *prev = *next = 0;
    if (!ch->first) {
        l3d_pp_vstage_owner(x->lay->schedule, p, vs - 1, &pr, &c);
        *prev = p2p_time(x, r, pr);
    }
    if (!ch->last) {
        l3d_pp_vstage_owner(x->lay->schedule, p, vs + 1, &pr, &c);
        *next = p2p_time(x, r, pr);
    }
}

void l3d_plan_rank_time(const struct l3d_plan_tctx *x, const struct l3d_plan_chunk *ch, int r,
                        struct l3d_plan_shapes *memo, double *vt, struct l3d_plan_parts *sum) {
    int p = x->lay->pp, v = x->lay->v, S = p * v;
    memset(sum, 0, sizeof *sum);
    for (int k = 0; k < v; k++) {
        /* p2p: the rank receives an activation from the previous virtual stage and a gradient
         * from the next one per micro-batch */
        double pp_prev, pp_next;
        chunk_p2p(x, &ch[k], r, k, &pp_prev, &pp_next);
        /* the rest once a shape */
        struct l3d_plan_parts cp;
        if (ch[k].shape >= 0 && memo->e[ch[k].shape].timed) {
            cp = memo->e[ch[k].shape].t;
        } else {
            chunk_time(x, &ch[k], &cp);
            if (ch[k].shape >= 0) {
                memo->e[ch[k].shape].t = cp;
                memo->e[ch[k].shape].timed = true;
            }
        }
        if (vt) {
            int vs = l3d_pp_vstage(x->lay->schedule, p, r, k);
            vt[vs] = cp.total - cp.bwd - cp.rec;
            vt[S + vs] = cp.bwd + cp.rec;
            vt[2 * S + vs] = pp_prev;
            vt[3 * S + vs] = pp_next;
            /* zb-h1's W: the weight-gradient products, and under full recomputation the
             * layer's forward again (src/model/gpt.c: B's rebuilt activations are gone), which
             * the backward (B + W) then has twice */
            bool again = l3d_pp_split(x->lay->schedule) &&
                         x->lay->recompute == L3D_RECOMPUTE_FULL;
            vt[4 * S + vs] = cp.wgt + (again ? cp.rec : 0.0);
            vt[S + vs] += again ? cp.rec : 0.0;
        }
        cp.p2p = pp_prev + pp_next;
        cp.total += cp.p2p;
        l3d_plan_parts_add(sum, &cp, 1.0);
    }
}
