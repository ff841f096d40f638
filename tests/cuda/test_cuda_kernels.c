/*
 * Every CUDA kernel against the CPU backend, in fp32, bf16 and fp16 (ctest label gpu; run by
 * scripts/gpu-check.sh). NOT YET RUN: no GPU has been available to this project; it compiles in
 * every CI run (`make test`, build-cuda) and is ready for the first machine with one.
 *
 * Each case fills its inputs on the host (random normals rounded to the type, so both backends
 * read the same bits), runs the kernel on "cpu" and on "cuda", and compares every output
 * (accumulating outputs start from the same non-zero values, so += is checked as well). The
 * tolerance comes from the format: the relative error of max |gpu - cpu| / max |cpu| is allowed
 * 4 units of the output's rounding (2^-8 bf16, 2^-11 fp16, 2^-24 fp32) plus 16 fp32 units times
 * sqrt(K), K the longest reduction (the two backends sum in different orders). Negative case: the
 * GPU's output with one element moved by 10 tolerances must be rejected, for every comparison.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda.h"
#include "llm3d/backend.h"
#include "llm3d/core.h"
#include "llm3d/model.h"
#include "test.h"

enum kind { ACT, GRAD, F32, I32, F64 };        /* a buffer's type: dt, gdt, or fixed */
/* TOKENS: ints in [0, hi); ROPE_FREQ: Llama 3.1's scaled rotary frequencies of a head of 2n
 * (l3d_rope_inv_freq); LSE: normals, -inf at every i with i % 5 == hi (rows no key reached);
 * POS: the MoE rows of n assignments, a random permutation of 0..n-1 with -1 (dropped) at every
 * i with i % 7 == hi */
enum init { NORMAL, ZERO, POSITIVE, TOKENS, ROPE_FREQ, LSE, POS };

#define MAXB 16
struct buf {
    const char *name;
    enum kind kind;
    int64_t n;
    enum init init;
    int64_t hi;  /* TOKENS: the range */
    bool out;    /* compared after the kernel */
};

struct shape {
    int64_t B, T, C, NH, HS, OC, V, Vl, Vvalid, vstart;
    int64_t NKV; /* key/value heads of the grouped-query cases (dividing NH) */
    int64_t E, K; /* the MoE cases' experts and top-k */
};

struct kcase {
    const char *name;
    struct buf b[MAXB];
    int64_t K; /* longest reduction */
    bool f32_only;
    unsigned opt; /* OPT_MIXED: gradients (GRAD) fp32 under a 16-bit dt; OPT_MHA: run on the
                   * shape with NKV = NH (multi-head attention, GPT-2's) */
    void (*run)(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt, void **p,
                const struct shape *s);
};
enum { OPT_MIXED = 1, OPT_MHA = 2 };

static size_t kind_size(enum kind k, enum l3d_dtype dt, enum l3d_dtype gdt) {
    switch (k) {
    case ACT: return l3d_dtype_size(dt);
    case GRAD: return l3d_dtype_size(gdt);
    case F32: case I32: return 4;
    default: return 8;
    }
}
static enum l3d_dtype kind_type(enum kind k, enum l3d_dtype dt, enum l3d_dtype gdt) {
    return k == ACT ? dt : k == GRAD ? gdt : k == F32 ? L3D_F32 : k == I32 ? L3D_I32 : L3D_F64;
}

/* element i of a host buffer of type t as a double */
static double get(enum l3d_dtype t, const void *p, int64_t i) {
    switch (t) {
    case L3D_BF16: return l3d_bf16_to_f32(((const uint16_t *)p)[i]);
    case L3D_F16: return l3d_f16_to_f32(((const uint16_t *)p)[i]);
    case L3D_F32: return ((const float *)p)[i];
    case L3D_F64: return ((const double *)p)[i];
    default: return ((const int32_t *)p)[i];
    }
}
static void set(enum l3d_dtype t, void *p, int64_t i, double x) {
    switch (t) {
    case L3D_BF16: ((uint16_t *)p)[i] = l3d_f32_to_bf16((float)x); break;
    case L3D_F16: ((uint16_t *)p)[i] = l3d_f32_to_f16((float)x); break;
    case L3D_F32: ((float *)p)[i] = (float)x; break;
    case L3D_F64: ((double *)p)[i] = x; break;
    default: ((int32_t *)p)[i] = (int32_t)x; break;
    }
}

static double unit(enum l3d_dtype t) {
    return t == L3D_BF16 ? 0x1p-8 : t == L3D_F16 ? 0x1p-11 : t == L3D_F64 ? 0x1p-53 : 0x1p-24;
}
static double tolerance(enum l3d_dtype t, int64_t K) {
    return 4.0 * unit(t) + 16.0 * 0x1p-24 * sqrt((double)(K > 1 ? K : 1));
}

/* max |a - b| / max |b| over the finite pairs; infinite on a NaN on either side or an infinity
 * the other side has not (the same infinity on both: an lse of a row no key reached) */
static double rel_diff(enum l3d_dtype t, const void *a, const void *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = get(t, a, i), y = get(t, b, i);
        if (isinf(x) && x == y) continue;
        if (!isfinite(x) || !isfinite(y)) return INFINITY;
        d = fabs(x - y) > d ? fabs(x - y) : d;
        m = fabs(y) > m ? fabs(y) : m;
    }
    return m > 0 ? d / m : d;
}

/* ---- the kernels, each with its buffers in the order of its run function's p[] ---------------- */

#define S const struct shape *s
#define BTC (s->B * s->T * s->C)
static void r_matmul_f(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_matmul_forward(be, dt, p[0], p[1], p[2], p[3], s->B * s->T, s->C, s->OC);
}
static void r_matmul_b(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    l3d_be_matmul_backward_mixed(be, dt, g, p[0], p[1], p[2], p[3], p[4], p[5], s->B * s->T, s->C,
                                 s->OC);
}
static void r_enc_f(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_encoder_forward(be, dt, p[0], p[1], p[2], p[3], s->vstart, s->Vvalid, s->B, s->T,
                           s->C);
}
static void r_enc_b(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    l3d_be_encoder_backward_mixed(be, dt, g, p[0], p[1], p[2], p[3], s->vstart, s->Vvalid, s->B,
                                  s->T, s->C);
}
static void r_ln_f(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_layernorm_forward(be, dt, p[0], p[1], p[2], p[3], p[4], p[5], s->B * s->T, s->C);
}
/* the statistics from the forward pass on the same backend, then the backward pass */
static void r_ln_b(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    l3d_be_layernorm_forward(be, dt, p[8], p[6], p[7], p[4], p[5], p[9], s->B * s->T, s->C);
    l3d_be_layernorm_backward_mixed(be, dt, g, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7],
                                    s->B * s->T, s->C);
}
static void r_gelu_f(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_gelu_forward(be, dt, p[0], p[1], BTC);
}
static void r_gelu_b(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_gelu_backward(be, dt, p[0], p[1], p[2], BTC);
}
static void r_resid(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_residual_forward(be, dt, p[0], p[1], p[2], BTC);
}
static void r_addin(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_add_inplace(be, dt, p[0], p[1], BTC);
}
static void r_bias(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_add_bias(be, dt, p[0], p[1], s->B * s->T, s->C);
}
/* the three passes and the loss on one backend, every intermediate compared */
static void r_xent(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    int64_t N = s->B * s->T;
    l3d_be_xent_max(be, dt, p[1], p[0], N, s->Vl, s->Vvalid);
    l3d_be_xent_sumexp(be, dt, p[2], p[3], p[0], p[1], p[4], s->vstart, N, s->Vl, s->Vvalid);
    l3d_be_xent_loss(be, p[5], p[6], p[1], p[2], p[3], N);
    l3d_be_xent_backward(be, dt, p[0], p[1], p[2], p[4], 1.0f / (float)N, s->vstart, N, s->Vl,
                         s->Vvalid);
}
static void r_adamw(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_adamw(be, dt, p[0], p[1], p[2], p[3], 0.5f, BTC, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                 0.1f, 0.05f);
}
static void r_adamw_m(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    l3d_be_adamw_mixed(be, dt, g, p[0], p[1], p[2], p[3], p[4], 0.5f, BTC, 1e-2f, 0.9f, 0.95f,
                       1e-8f, 0.1f, 0.1f, 0.05f);
}
/* the step with the gradient zeroed in the same pass: the gradient an output, all zero */
static void r_adamw_z(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_adamw_zero(be, dt, dt, p[0], NULL, p[1], p[2], p[3], 0.5f, BTC, 1e-2f, 0.9f, 0.95f,
                      1e-8f, 0.1f, 0.1f, 0.05f);
}
static void r_adamw_mz(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p,
                       S) {
    l3d_be_adamw_zero(be, dt, g, p[0], p[1], p[2], p[3], p[4], 0.5f, BTC, 1e-2f, 0.9f, 0.95f,
                      1e-8f, 0.1f, 0.1f, 0.05f);
}
static void r_sumsq(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_sumsq(be, dt, p[0], p[1], BTC);
}
static void r_conv(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_convert(be, dt, p[0], L3D_F32, p[2], BTC); /* fp32 -> dt */
    l3d_be_convert(be, L3D_F32, p[1], dt, p[0], BTC); /* and back */
}
static void r_unscale(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p,
                      S) {
    (void)g;
    l3d_be_unscale(be, dt, p[1], p[0], 0.25f, BTC);
}
/* ---- the Llama kernels and grouped-query attention (NKV key/value heads) ---------------------- */

#define CQ(s) (((s)->NH + 2 * (s)->NKV) * (s)->HS)
static void r_rms_f(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_rmsnorm_forward(be, dt, p[0], p[1], p[2], p[3], s->B * s->T, s->C, 1e-5f);
}
/* rstd from the forward pass on the same backend, then the backward pass */
static void r_rms_b(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    l3d_be_rmsnorm_forward(be, dt, p[6], p[5], p[3], p[4], s->B * s->T, s->C, 1e-5f);
    l3d_be_rmsnorm_backward(be, dt, g, p[0], p[1], p[2], p[3], p[4], p[5], s->B * s->T, s->C);
}
/* the residual add and the norm after it in one pass: res, out, [mean,] rstd, a, b, weight
 * [, bias] */
static void r_res_ln(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_residual_layernorm_forward(be, dt, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7],
                                      s->B * s->T, s->C);
}
static void r_res_rms(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_residual_rmsnorm_forward(be, dt, p[0], p[1], p[2], p[3], p[4], p[5], s->B * s->T,
                                    s->C, 1e-5f);
}
/* rope_forward on qkv, rope_backward on dqkv (each in place) */
static void r_rope(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_rope_forward(be, dt, p[0], p[1], p[2], s->B, s->T, s->NH, s->NKV, s->HS);
    l3d_be_rope_backward(be, dt, p[3], p[1], p[2], s->B, s->T, s->NH, s->NKV, s->HS);
}
/* swiglu_forward into out, swiglu_backward into dinp, from the same inp */
static void r_swi(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_swiglu_forward(be, dt, p[0], p[1], s->B * s->T, s->C);
    l3d_be_swiglu_backward(be, dt, p[2], p[3], p[1], s->B * s->T, s->C);
}
static void r_att_f(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_attention_forward(be, dt, p[0], p[1], p[2], s->B, s->T, s->NH, s->NKV, s->HS);
}
static void r_att_b(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_attention_forward(be, dt, p[3], p[4], p[2], s->B, s->T, s->NH, s->NKV, s->HS);
    l3d_be_attention_backward(be, dt, p[0], p[1], p[2], p[3], p[4], s->B, s->T, s->NH, s->NKV,
                              s->HS);
}
/* T new rows at position 5 over a cache of 5 + T rows of a (B=1) qkv with NKV key/value heads
 * (the q rows: the last T of qkv) */
static void r_att_c(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    int64_t es = (int64_t)l3d_dtype_size(dt), pos = 5, qh = s->NH * s->HS, kh = s->NKV * s->HS;
    char *qkv = p[1];
    l3d_be_attention_cached(be, dt, p[0], qkv + pos * CQ(s) * es, qkv + qh * es,
                            qkv + (qh + kh) * es, pos, s->T, s->NH, s->NKV, s->HS, CQ(s), CQ(s));
}

/* A block of context parallelism with padded strides: T query rows at position 10 against T + 3
 * key rows from position 4 (each row sees keys up to 6 rows past its own index, the last rows
 * all of them); q, out rows NH HS + 8 apart, k, v rows NKV HS + 4, lse heads T + 1 apart. */
static struct l3d_attn_block blk(S) {
    int64_t nq = s->T, nk = s->T + 3, qr = s->NH * s->HS + 8, kr = s->NKV * s->HS + 4;
    return (struct l3d_attn_block){.B = s->B, .NH = s->NH, .NKV = s->NKV, .HS = s->HS, .nq = nq,
                                   .nk = nk, .q_pos = 10, .k_pos = 4, .q_rs = qr,
                                   .q_bs = nq * qr + 3, .kv_rs = kr, .kv_bs = nk * kr,
                                   .o_rs = qr, .o_bs = nq * qr, .lse_hs = nq + 1,
                                   .lse_bs = s->NH * (nq + 1) + 2};
}
#define BQ(s) ((s)->B * ((s)->T * ((s)->NH * (s)->HS + 8) + 3))
#define BKV(s) ((s)->B * ((s)->T + 3) * ((s)->NKV * (s)->HS + 4))
#define BL(s) ((s)->B * ((s)->NH * ((s)->T + 1) + 2))
static void r_blk_f(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    struct l3d_attn_block b = blk(s);
    l3d_be_attention_block_forward(be, dt, p[0], p[1], p[2], p[3], p[4], &b);
}
static void r_merge(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    struct l3d_attn_block b = blk(s);
    l3d_be_attention_merge(be, dt, p[0], p[1], p[2], p[3], &b);
}
/* out and lse from the block's forward pass on the same backend, then its backward pass */
static void r_blk_b(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    struct l3d_attn_block b = blk(s);
    l3d_be_attention_block_forward(be, dt, p[7], p[8], p[4], p[5], p[6], &b);
    l3d_be_attention_block_backward(be, dt, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8],
                                    &b);
}
#undef S

/* the kernels of the Llama blocks, grouped-query attention and context parallelism */
static void llama_cases(struct shape s, struct kcase *k, int *n) {
    int64_t NBT_ = s.B * s.T, X = NBT_ * s.C, Q = NBT_ * CQ(&s), L = s.B * s.NH * s.T;
    int i = *n;
    k[i++] = (struct kcase){"rmsnorm_forward", {{"out", ACT, X, ZERO, 0, true},
        {"rstd", F32, NBT_, ZERO, 0, true}, {"inp", ACT, X, NORMAL, 0, false},
        {"weight", ACT, s.C, NORMAL, 0, false}}, s.C, false, false, r_rms_f};
    for (int mixed = 0; mixed < 2; mixed++)
        k[i++] = (struct kcase){mixed ? "rmsnorm_backward (fp32 grads)" : "rmsnorm_backward",
            {{"dinp", ACT, X, NORMAL, 0, true}, {"dweight", GRAD, s.C, NORMAL, 0, true},
             {"dout", ACT, X, NORMAL, 0, false}, {"inp", ACT, X, NORMAL, 0, false},
             {"weight", ACT, s.C, NORMAL, 0, false}, {"rstd", F32, NBT_, ZERO, 0, false},
             {"rms_out", ACT, X, ZERO, 0, false}}, NBT_, false, mixed, r_rms_b};
    k[i++] = (struct kcase){"residual_rmsnorm_forward", {{"res", ACT, X, ZERO, 0, true},
        {"out", ACT, X, ZERO, 0, true}, {"rstd", F32, NBT_, ZERO, 0, true},
        {"a", ACT, X, NORMAL, 0, false}, {"b", ACT, X, NORMAL, 0, false},
        {"weight", ACT, s.C, NORMAL, 0, false}}, s.C, false, false, r_res_rms};
    k[i++] = (struct kcase){"residual_layernorm_forward", {{"res", ACT, X, ZERO, 0, true},
        {"out", ACT, X, ZERO, 0, true}, {"mean", F32, NBT_, ZERO, 0, true},
        {"rstd", F32, NBT_, ZERO, 0, true}, {"a", ACT, X, NORMAL, 0, false},
        {"b", ACT, X, NORMAL, 0, false}, {"weight", ACT, s.C, NORMAL, 0, false},
        {"bias", ACT, s.C, NORMAL, 0, false}}, s.C, false, false, r_res_ln};
    /* positions up to Llama 3.1's 131072: large angles, every band of the frequency scaling */
    k[i++] = (struct kcase){"rope_forward, rope_backward", {{"qkv", ACT, Q, NORMAL, 0, true},
        {"inv_freq", F32, s.HS / 2, ROPE_FREQ, 0, false},
        {"pos", I32, s.T, TOKENS, 131072, false}, {"dqkv", ACT, Q, NORMAL, 0, true}}, 2, false,
        false, r_rope};
    k[i++] = (struct kcase){"swiglu_forward, swiglu_backward", {{"out", ACT, X, ZERO, 0, true},
        {"inp", ACT, 2 * X, NORMAL, 0, false}, {"dinp", ACT, 2 * X, NORMAL, 0, true},
        {"dout", ACT, X, NORMAL, 0, false}}, 1, false, false, r_swi};
    k[i++] = (struct kcase){"attention_forward (GQA)", {{"out", ACT, X, ZERO, 0, true},
        {"lse", F32, L, ZERO, 0, true}, {"qkv", ACT, Q, NORMAL, 0, false}}, s.T * s.HS, false,
        false, r_att_f};
    k[i++] = (struct kcase){"attention_backward (GQA)", {{"dqkv", ACT, Q, NORMAL, 0, true},
        {"dout", ACT, X, NORMAL, 0, false}, {"qkv", ACT, Q, NORMAL, 0, false},
        {"out", ACT, X, ZERO, 0, false}, {"lse", F32, L, ZERO, 0, false}},
        s.T * s.HS * (s.NH / s.NKV), false, false, r_att_b};
    k[i++] = (struct kcase){"attention_cached (GQA)", {{"out", ACT, s.T * s.C, ZERO, 0, true},
        {"qkv", ACT, (s.T + 5) * CQ(&s), NORMAL, 0, false}}, (s.T + 5) * s.HS, false, false,
        r_att_c};
    k[i++] = (struct kcase){"attention_block_forward", {{"out", ACT, BQ(&s), ZERO, 0, true},
        {"lse", F32, BL(&s), ZERO, 0, true}, {"q", ACT, BQ(&s), NORMAL, 0, false},
        {"k", ACT, BKV(&s), NORMAL, 0, false}, {"v", ACT, BKV(&s), NORMAL, 0, false}},
        (s.T + 3) * s.HS, false, false, r_blk_f};
    /* -inf in lse (rows 1, 6, ...) and in lse2 (rows 3, 8, ...): the merge's special rows */
    k[i++] = (struct kcase){"attention_merge", {{"out", ACT, BQ(&s), NORMAL, 0, true},
        {"lse", F32, BL(&s), LSE, 1, true}, {"out2", ACT, BQ(&s), NORMAL, 0, false},
        {"lse2", F32, BL(&s), LSE, 3, false}}, 2, false, false, r_merge};
    k[i++] = (struct kcase){"attention_block_backward", {{"dq", ACT, BQ(&s), NORMAL, 0, true},
        {"dk", ACT, BKV(&s), NORMAL, 0, true}, {"dv", ACT, BKV(&s), NORMAL, 0, true},
        {"dout", ACT, BQ(&s), NORMAL, 0, false}, {"q", ACT, BQ(&s), NORMAL, 0, false},
        {"k", ACT, BKV(&s), NORMAL, 0, false}, {"v", ACT, BKV(&s), NORMAL, 0, false},
        {"out", ACT, BQ(&s), ZERO, 0, false}, {"lse", F32, BL(&s), ZERO, 0, false}},
        (s.T + 3) * s.HS * (s.NH / s.NKV), false, false, r_blk_b};
    *n = i;
}

/* ---- mixture of experts: N = B T tokens of C channels, E experts, top-K (shape's E, K) ------- */

#define MN(s) ((s)->B * (s)->T)
#define S const struct shape *s
/* about half an expert's even share of the N K assignments: some experts drop */
static int64_t moe_cap(S) { return (MN(s) * s->K + 2 * s->E - 1) / (2 * s->E); }
static void route(struct l3d_backend *be, enum l3d_dtype dt, void **p, const void *inp,
                  const void *w, int norm, int64_t cap, const int32_t *fill, S) {
    int32_t *work = l3d_be_alloc(be, (size_t)(3 * s->E) * 4, "routing workspace");
    l3d_be_moe_route(be, dt, p[0], p[1], p[2], p[3], p[4], p[5], p[6], work, inp, w, MN(s), s->C,
                     s->E, s->K, norm, cap, fill, fill ? s->B : 1, NULL);
    l3d_be_free(be, work);
}
static void r_moe_route(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p,
                        S) {
    (void)g;
    route(be, dt, p, p[7], p[8], 0, 0, NULL, s);
}
static void r_moe_route_nc(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p,
                           S) {
    (void)g;
    route(be, dt, p, p[7], p[8], 1, moe_cap(s), NULL, s);
}
/* a segment a sequence, each expert's count starting at a fill in [0, capacity) */
static void r_moe_route_fill(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g,
                             void **p, S) {
    (void)g;
    route(be, dt, p, p[7], p[8], 1, moe_cap(s), p[9], s);
}
static void r_moe_perm(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_moe_permute(be, dt, p[0], p[1], p[2], MN(s), s->K, s->C);
}
static void r_moe_comb(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    (void)g;
    l3d_be_moe_combine(be, dt, p[0], p[1], p[2], p[3], MN(s), s->K, s->C);
}
static void r_moe_comb1(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p,
                        S) {
    (void)g;
    l3d_be_moe_combine(be, dt, p[0], p[1], p[2], NULL, MN(s), s->K, s->C);
}
static void r_moe_comb_b(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p,
                         S) {
    (void)g;
    l3d_be_moe_combine_backward(be, dt, p[0], p[1], p[2], p[3], p[4], p[5], MN(s), s->K, s->C);
}
/* the routing (renormalised, with a capacity) on the same backend, then the router's backward
 * with both auxiliary losses */
static void r_moe_rb(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype g, void **p, S) {
    route(be, dt, p + 6, p[4], p[5], 1, moe_cap(s), NULL, s);
    l3d_be_moe_router_backward(be, dt, g, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8],
                               p[9], p[12], MN(s), s->C, s->E, s->K, 1, 0.01f, 0.001f);
}
#undef S

static void moe_cases(struct shape s, struct kcase *k, int *n) {
    int i = *n;
    const int64_t N = MN(&s), NK = N * s.K, NC = N * s.C, EC = s.E * s.C;
    static const char *const route_name[3] = {"moe_route", "moe_route (norm_topk, capacity)",
                                               "moe_route (capacity, starting fills)"};
    for (int v = 0; v < 3; v++)
        k[i++] = (struct kcase){route_name[v],
            {{"probs", F32, N * s.E, ZERO, 0, true}, {"lse", F32, N, ZERO, 0, true},
             {"idx", I32, NK, ZERO, 0, true}, {"wts", F32, NK, ZERO, 0, true},
             {"pos", I32, NK, ZERO, 0, true}, {"offsets", I32, s.E + 1, ZERO, 0, true},
             {"stats", F32, 2 * s.E + 2, ZERO, 0, true}, {"inp", ACT, NC, NORMAL, 0, false},
             {"weight", ACT, EC, NORMAL, 0, false},
             {"fill", I32, v == 2 ? s.B * s.E : 1, TOKENS, moe_cap(&s), false}}, s.C + N, false,
            false, v == 2 ? r_moe_route_fill : v ? r_moe_route_nc : r_moe_route};
    k[i++] = (struct kcase){"moe_permute", {{"rows", ACT, NK * s.C, NORMAL, 0, true},
        {"inp", ACT, NC, NORMAL, 0, false}, {"pos", I32, NK, POS, 3, false}}, 1, false, false,
        r_moe_perm};
    for (int v = 0; v < 2; v++)
        k[i++] = (struct kcase){v ? "moe_combine (no weights)" : "moe_combine",
            {{"out", ACT, NC, NORMAL, 0, true}, {"rows", ACT, NK * s.C, NORMAL, 0, false},
             {"pos", I32, NK, POS, 3, false}, {"wts", F32, NK, NORMAL, 0, false}}, s.K + 1,
            false, false, v ? r_moe_comb1 : r_moe_comb};
    k[i++] = (struct kcase){"moe_combine_backward", {{"drows", ACT, NK * s.C, NORMAL, 0, true},
        {"dwts", F32, NK, ZERO, 0, true}, {"dout", ACT, NC, NORMAL, 0, false},
        {"rows", ACT, NK * s.C, NORMAL, 0, false}, {"pos", I32, NK, POS, 5, false},
        {"wts", F32, NK, NORMAL, 0, false}}, s.C, false, false, r_moe_comb_b};
    for (int mixed = 0; mixed < 2; mixed++)
        k[i++] = (struct kcase){mixed ? "moe_router_backward (fp32 grads)" : "moe_router_backward",
            {{"dinp", ACT, NC, NORMAL, 0, true}, {"dweight", GRAD, EC, NORMAL, 0, true},
             {"dlogits", F32, N * s.E, ZERO, 0, true}, {"dwts", F32, NK, NORMAL, 0, false},
             {"inp", ACT, NC, NORMAL, 0, false}, {"weight", ACT, EC, NORMAL, 0, false},
             {"probs", F32, N * s.E, ZERO, 0, false}, {"lse", F32, N, ZERO, 0, false},
             {"idx", I32, NK, ZERO, 0, false}, {"wts", F32, NK, ZERO, 0, false},
             {"pos", I32, NK, ZERO, 0, false}, {"offsets", I32, s.E + 1, ZERO, 0, false},
             {"stats", F32, 2 * s.E + 2, ZERO, 0, false}}, N + s.C, false, mixed, r_moe_rb};
    *n = i;
}

#define NBT (s.B * s.T)
#define NBTC (s.B * s.T * s.C)
#define C3 (3 * s.C)
static struct kcase *cases(struct shape s, int *n) {
    static struct kcase k[64];
    int i = 0;
    k[i++] = (struct kcase){"matmul_forward", {{"out", ACT, NBT * s.OC, ZERO, 0, true},
        {"inp", ACT, NBTC, NORMAL, 0, false}, {"weight", ACT, s.OC * s.C, NORMAL, 0, false},
        {"bias", ACT, s.OC, NORMAL, 0, false}}, s.C, false, false, r_matmul_f};
    for (int mixed = 0; mixed < 2; mixed++)
        k[i++] = (struct kcase){mixed ? "matmul_backward (fp32 grads)" : "matmul_backward",
            {{"dinp", ACT, NBTC, NORMAL, 0, true}, {"dweight", GRAD, s.OC * s.C, NORMAL, 0, true},
             {"dbias", GRAD, s.OC, NORMAL, 0, true}, {"dout", ACT, NBT * s.OC, NORMAL, 0, false},
             {"inp", ACT, NBTC, NORMAL, 0, false}, {"weight", ACT, s.OC * s.C, NORMAL, 0, false}},
            NBT, false, mixed, r_matmul_b};
    k[i++] = (struct kcase){"encoder_forward", {{"out", ACT, NBTC, ZERO, 0, true},
        {"tokens", I32, NBT, TOKENS, s.vstart + s.Vvalid + 7, false},
        {"wte", ACT, s.Vvalid * s.C, NORMAL, 0, false},
        {"wpe", ACT, s.T * s.C, NORMAL, 0, false}}, 1, false, false, r_enc_f};
    for (int mixed = 0; mixed < 2; mixed++)
        k[i++] = (struct kcase){mixed ? "encoder_backward (fp32 grads)" : "encoder_backward",
            {{"dwte", GRAD, s.Vvalid * s.C, NORMAL, 0, true},
             {"dwpe", GRAD, s.T * s.C, NORMAL, 0, true}, {"dout", ACT, NBTC, NORMAL, 0, false},
             {"tokens", I32, NBT, TOKENS, s.vstart + s.Vvalid + 7, false}}, NBT, false, mixed,
            r_enc_b};
    k[i++] = (struct kcase){"layernorm_forward", {{"out", ACT, NBTC, ZERO, 0, true},
        {"mean", F32, NBT, ZERO, 0, true}, {"rstd", F32, NBT, ZERO, 0, true},
        {"inp", ACT, NBTC, NORMAL, 0, false}, {"weight", ACT, s.C, NORMAL, 0, false},
        {"bias", ACT, s.C, NORMAL, 0, false}}, s.C, false, false, r_ln_f};
    for (int mixed = 0; mixed < 2; mixed++)
        k[i++] = (struct kcase){mixed ? "layernorm_backward (fp32 grads)" : "layernorm_backward",
            {{"dinp", ACT, NBTC, NORMAL, 0, true}, {"dweight", GRAD, s.C, NORMAL, 0, true},
             {"dbias", GRAD, s.C, NORMAL, 0, true}, {"dout", ACT, NBTC, NORMAL, 0, false},
             {"inp", ACT, NBTC, NORMAL, 0, false}, {"weight", ACT, s.C, NORMAL, 0, false},
             {"mean", F32, NBT, ZERO, 0, false}, {"rstd", F32, NBT, ZERO, 0, false},
             {"ln_out", ACT, NBTC, ZERO, 0, false}, {"ln_bias", ACT, s.C, NORMAL, 0, false}},
            NBT, false, mixed, r_ln_b};
    k[i++] = (struct kcase){"attention_forward", {{"out", ACT, NBTC, ZERO, 0, true},
        {"lse", F32, s.B * s.NH * s.T, ZERO, 0, true}, {"qkv", ACT, NBT * C3, NORMAL, 0, false}},
        s.T * s.HS, false, OPT_MHA, r_att_f};
    k[i++] = (struct kcase){"attention_backward", {{"dqkv", ACT, NBT * C3, NORMAL, 0, true},
        {"dout", ACT, NBTC, NORMAL, 0, false}, {"qkv", ACT, NBT * C3, NORMAL, 0, false},
        {"out", ACT, NBTC, ZERO, 0, false}, {"lse", F32, s.B * s.NH * s.T, ZERO, 0, false}},
        s.T * s.HS, false, OPT_MHA, r_att_b};
    k[i++] = (struct kcase){"attention_cached", {{"out", ACT, s.T * s.C, ZERO, 0, true},
        {"qkv", ACT, (s.T + 5) * C3, NORMAL, 0, false}}, (s.T + 5) * s.HS, false, OPT_MHA,
        r_att_c};
    k[i++] = (struct kcase){"gelu_forward", {{"out", ACT, NBTC, ZERO, 0, true},
        {"inp", ACT, NBTC, NORMAL, 0, false}}, 1, false, false, r_gelu_f};
    k[i++] = (struct kcase){"gelu_backward", {{"dinp", ACT, NBTC, NORMAL, 0, true},
        {"dout", ACT, NBTC, NORMAL, 0, false}, {"inp", ACT, NBTC, NORMAL, 0, false}}, 1, false,
        false, r_gelu_b};
    k[i++] = (struct kcase){"residual_forward", {{"out", ACT, NBTC, ZERO, 0, true},
        {"a", ACT, NBTC, NORMAL, 0, false}, {"b", ACT, NBTC, NORMAL, 0, false}}, 1, false, false,
        r_resid};
    k[i++] = (struct kcase){"add_inplace", {{"dst", ACT, NBTC, NORMAL, 0, true},
        {"src", ACT, NBTC, NORMAL, 0, false}}, 1, false, false, r_addin};
    k[i++] = (struct kcase){"add_bias", {{"out", ACT, NBTC, NORMAL, 0, true},
        {"bias", ACT, s.C, NORMAL, 0, false}}, 1, false, false, r_bias};
    k[i++] = (struct kcase){"xent (max, sumexp, loss, backward)",
        {{"logits", ACT, NBT * s.Vl, NORMAL, 0, true}, {"maxv", F32, NBT, ZERO, 0, true},
         {"sumexp", F32, NBT, ZERO, 0, true}, {"tlogit", F32, NBT, ZERO, 0, true},
         {"targets", I32, NBT, TOKENS, s.vstart + s.Vvalid + 7, false},
         {"losses", F32, NBT, ZERO, 0, true}, {"loss_sum", F64, 1, POSITIVE, 0, true}},
        s.Vl + NBT, false, false, r_xent};
    /* z: the step with the gradient zeroed in the same pass (l3d_be_adamw_zero), the gradient
     * one of the outputs */
    static const char *const names[2][3] = {
        {"adamw", "adamw_mixed", "adamw_mixed (fp32 grads)"},
        {"adamw_zero", "adamw_zero mixed", "adamw_zero mixed (fp32 grads)"}};
    for (int z = 0; z < 2; z++) {
        k[i++] = (struct kcase){names[z][0], {{"param", ACT, NBTC, NORMAL, 0, true},
            {"m", F32, NBTC, NORMAL, 0, true}, {"v", F32, NBTC, POSITIVE, 0, true},
            {"grad", ACT, NBTC, NORMAL, 0, z == 1}}, 1, true, false, z ? r_adamw_z : r_adamw};
        for (int mixed = 0; mixed < 2; mixed++)
            k[i++] = (struct kcase){names[z][1 + mixed],
                {{"param", ACT, NBTC, ZERO, 0, true}, {"master", F32, NBTC, NORMAL, 0, true},
                 {"m", F32, NBTC, NORMAL, 0, true}, {"v", F32, NBTC, POSITIVE, 0, true},
                 {"grad", GRAD, NBTC, NORMAL, 0, z == 1}}, 1, false, mixed,
                z ? r_adamw_mz : r_adamw_m};
    }
    k[i++] = (struct kcase){"sumsq", {{"acc", F64, 1, POSITIVE, 0, true},
        {"x", ACT, NBTC, NORMAL, 0, false}}, NBTC, false, false, r_sumsq};
    k[i++] = (struct kcase){"convert", {{"half", ACT, NBTC, ZERO, 0, true},
        {"back", F32, NBTC, ZERO, 0, true}, {"src", F32, NBTC, NORMAL, 0, false}}, 1, false,
        false, r_conv};
    k[i++] = (struct kcase){"unscale", {{"x", ACT, NBTC, NORMAL, 0, true},
        {"found_inf", F32, 1, ZERO, 0, true}}, 1, false, false, r_unscale};
    llama_cases(s, k, &i);
    moe_cases(s, k, &i);
    L3D_ASSERT(i <= 64);
    *n = i;
    return k;
}

/* ---- the runner ------------------------------------------------------------------------------- */

static void fill(const struct buf *b, enum l3d_dtype t, void *h, uint64_t seed) {
    for (int64_t i = 0; i < b->n; i++) {
        double x = 0;
        if (b->init == NORMAL) x = l3d_rng_normal(seed, 0, (uint64_t)i);
        if (b->init == POSITIVE) x = 0.1 + fabs(l3d_rng_normal(seed, 0, (uint64_t)i));
        if (b->init == TOKENS) x = (double)(l3d_rng_u64(seed, 0, (uint64_t)i) % (uint64_t)b->hi);
        if (b->init == LSE) x = i % 5 == b->hi ? -INFINITY : l3d_rng_normal(seed, 0, (uint64_t)i);
        set(t, h, i, x);
    }
    if (b->init == POS) { /* Fisher-Yates */
        int32_t *r = h;
        for (int64_t i = 0; i < b->n; i++) r[i] = (int32_t)i;
        for (int64_t i = b->n - 1; i > 0; i--) {
            int64_t j = (int64_t)(l3d_rng_u64(seed, 1, (uint64_t)i) % (uint64_t)(i + 1));
            int32_t x = r[i];
            r[i] = r[j], r[j] = x;
        }
        for (int64_t i = 0; i < b->n; i++)
            if (i % 7 == b->hi) r[i] = -1;
    }
    if (b->init == ROPE_FREQ) { /* Llama 3.1 8B's rope settings on a head of 2 n */
        struct l3d_model_spec m = {.C = (int)(2 * b->n), .NH = 1,
                                   .rope = {500000.0, 8.0, 1.0, 4.0, 8192}};
        l3d_rope_inv_freq(&m, h);
    }
}

/* The case on one backend: host inputs in, outputs back into res[j] */
static void run_on(struct l3d_backend *be, const struct kcase *k, enum l3d_dtype dt,
                   enum l3d_dtype gdt, const struct shape *s, void *const *host, void **res) {
    void *dev[MAXB] = {0};
    for (int j = 0; j < MAXB && k->b[j].name; j++) {
        size_t bytes = (size_t)k->b[j].n * kind_size(k->b[j].kind, dt, gdt);
        dev[j] = l3d_be_alloc(be, bytes, k->b[j].name);
        L3D_ASSERT(dev[j]);
        l3d_be_copy_h2d(be, dev[j], host[j], bytes);
    }
    k->run(be, dt, gdt, dev, s);
    for (int j = 0; j < MAXB && k->b[j].name; j++) {
        size_t bytes = (size_t)k->b[j].n * kind_size(k->b[j].kind, dt, gdt);
        if (k->b[j].out) l3d_be_copy_d2h(be, res[j], dev[j], bytes);
        l3d_be_free(be, dev[j]);
    }
}

/* one case in one type: every output within tolerance, and the perturbed one rejected */
static void check_case(struct l3d_backend *cpu, struct l3d_backend *gpu, const struct kcase *k,
                       enum l3d_dtype dt, const struct shape *s, uint64_t seed) {
    enum l3d_dtype gdt = k->opt & OPT_MIXED ? L3D_F32 : dt;
    void *host[MAXB] = {0}, *rc[MAXB] = {0}, *rg[MAXB] = {0};
    for (int j = 0; j < MAXB && k->b[j].name; j++) {
        size_t bytes = (size_t)k->b[j].n * kind_size(k->b[j].kind, dt, gdt);
        host[j] = malloc(bytes);
        rc[j] = malloc(bytes);
        rg[j] = malloc(bytes);
        L3D_ASSERT(host[j] && rc[j] && rg[j]);
        fill(&k->b[j], kind_type(k->b[j].kind, dt, gdt), host[j], seed + (uint64_t)j);
    }
    run_on(cpu, k, dt, gdt, s, host, rc);
    run_on(gpu, k, dt, gdt, s, host, rg);
    for (int j = 0; j < MAXB && k->b[j].name; j++) {
        if (!k->b[j].out) continue;
        enum l3d_dtype t = kind_type(k->b[j].kind, dt, gdt);
        /* an fp32 output of 16-bit inputs carries their rounding: the tolerance of dt; integer
         * outputs (the MoE routing) exactly */
        double tol = t == L3D_I32 ? 0.0 : tolerance(unit(t) > unit(dt) ? t : dt, k->K);
        double d = rel_diff(t, rg[j], rc[j], k->b[j].n);
        printf("%-36s %-5s %-10s rel diff %.3g (tol %.3g)%s\n", k->name, l3d_dtype_name(dt),
               k->b[j].name, d, tol, d <= tol ? "" : "  FAIL");
        CHECK(d <= tol);
        /* negative: one element 10 tolerances (relative to the largest) away must fail */
        double mx = 0;
        for (int64_t i = 0; i < k->b[j].n; i++)
            if (isfinite(get(t, rc[j], i))) mx = fmax(mx, fabs(get(t, rc[j], i)));
        int64_t at = k->b[j].n / 2;
        while (at + 1 < k->b[j].n && !isfinite(get(t, rc[j], at))) at++;
        double bump = t == L3D_I32 ? 1.0 : 10.0 * tol * (mx > 0 ? mx : 1.0) + 4 * unit(t);
        set(t, rg[j], at, get(t, rc[j], at) + bump);
        CHECK(!(rel_diff(t, rg[j], rc[j], k->b[j].n) <= tol));
    }
    for (int j = 0; j < MAXB; j++) free(host[j]), free(rc[j]), free(rg[j]);
}

/* ---- special values, bit for bit against the CPU ----------------------------------------------- */

/* n floats through convert to dt and back (and unscale's flag) on one backend */
static void special_on(struct l3d_backend *be, enum l3d_dtype dt, const float *x, int64_t n,
                       uint16_t *half, float *back, float *flag) {
    float *dx = l3d_be_alloc(be, (size_t)n * 4, "x"), *db = l3d_be_alloc(be, (size_t)n * 4, "b");
    void *dh = l3d_be_alloc(be, (size_t)n * 2, "h");
    float *df = l3d_be_alloc(be, 4, "flag"), zero = 0.0f;
    L3D_ASSERT(dx && db && dh && df);
    l3d_be_copy_h2d(be, dx, x, (size_t)n * 4);
    l3d_be_copy_h2d(be, df, &zero, 4);
    l3d_be_convert(be, dt, dh, L3D_F32, dx, n);
    l3d_be_convert(be, L3D_F32, db, dt, dh, n);
    l3d_be_unscale(be, L3D_F32, df, dx, 1.0f, n);
    l3d_be_copy_d2h(be, half, dh, (size_t)n * 2);
    l3d_be_copy_d2h(be, back, db, (size_t)n * 4);
    l3d_be_copy_d2h(be, flag, df, 4);
    l3d_be_free(be, dx), l3d_be_free(be, db), l3d_be_free(be, dh), l3d_be_free(be, df);
}

/* convert: NaN stays a quiet NaN (payloads may differ), Inf and signed zeros kept, ties to even,
 * fp16 overflow from 65520, subnormals; unscale: found_inf set by an Inf or NaN, left 0 without */
static void check_special(struct l3d_backend *cpu, struct l3d_backend *gpu) {
    const float x[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f + 0x1p-8f,
                       1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f,
                       65519.0f, 65520.0f, 3e-7f, 6e-8f, 2e-8f, 3.4e38f, -3.4e38f, 1e-40f, 0.1f};
    enum { N = sizeof x / sizeof x[0] };
    const enum l3d_dtype types[2] = {L3D_BF16, L3D_F16};
    for (int ti = 0; ti < 2; ti++) {
        uint16_t hc[N], hg[N];
        float bc[N], bg[N], fc, fg;
        special_on(cpu, types[ti], x, N, hc, bc, &fc);
        special_on(gpu, types[ti], x, N, hg, bg, &fg);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            bool nan_c = isnan(bc[i]), nan_g = isnan(bg[i]);
            /* a quiet NaN: the top fraction bit (bf16 0x0040, fp16 0x0200) */
            uint16_t quiet = types[ti] == L3D_BF16 ? 0x0040 : 0x0200;
            bool same = nan_c || nan_g ? nan_c && nan_g && (hg[i] & quiet)
                                       : hc[i] == hg[i] && memcmp(&bc[i], &bg[i], 4) == 0;
            if (!same)
                printf("convert %-5s special value %d (%g): cpu 0x%04x, gpu 0x%04x  FAIL\n",
                       l3d_dtype_name(types[ti]), i, (double)x[i], hc[i], hg[i]);
            bad += !same;
        }
        printf("convert %-5s %d special values, %d differ\n", l3d_dtype_name(types[ti]), N, bad);
        CHECK(bad == 0);
        CHECK(fc == 1.0f && fg == 1.0f); /* the NaNs and Infs of x */
    }
    /* negative: finite values only leave the flag as it was (0) on both */
    uint16_t h[4];
    float b[4], fc, fg;
    special_on(cpu, L3D_BF16, x + 4, 4, h, b, &fc);
    special_on(gpu, L3D_BF16, x + 4, 4, h, b, &fg);
    CHECK(fc == 0.0f && fg == 0.0f);
}

/* whether case k is run: argv[1] "moe" takes the mixture-of-experts kernels only, "dense" the
 * others, none all (scripts/gpu-check.sh reports the two apart) */
static bool chosen(const struct kcase *k, const char *only) {
    bool moe = strncmp(k->name, "moe_", 4) == 0;
    return !only || (strcmp(only, "moe") == 0 ? moe : !moe);
}

int main(int argc, char **argv) {
    /* L3D_KERNEL_TEST_BACKEND=check runs the whole comparison on a machine without a GPU (the
     * CPU kernels behind the checking backend): the test's own shapes, buffers and negative
     * cases are proven before the first GPU run (ctest's test_cuda_kernels_check) */
    const char *other = getenv("L3D_KERNEL_TEST_BACKEND");
    const char *only = argc > 1 ? argv[1] : NULL;
    if (only && strcmp(only, "moe") != 0 && strcmp(only, "dense") != 0) {
        fprintf(stderr, "test_cuda_kernels: unknown selection '%s': give moe, dense or nothing "
                "(all)\n", only);
        return 2;
    }
    if (!(other && *other) && l3d_cuda_device_count() == 0) {
        printf("test_cuda_kernels: skipped: no CUDA device visible, so the CUDA kernels cannot "
               "run here (L3D_KERNEL_TEST_BACKEND=check runs the comparison on the CPU kernels)\n");
        return 77; /* ctest's SKIP_RETURN_CODE */
    }
    struct l3d_backend *cpu, *gpu;
    if (l3d_backend_init("cpu", &cpu) != L3D_OK ||
        l3d_backend_init(other && *other ? other : "cuda", &gpu) != L3D_OK) {
        fprintf(stderr, "%s\n", l3d_error_message());
        return 1;
    }
    /* HS 24 (lanes partly empty), a vocabulary slice from 0; HS 64 (GPT-2's), a slice from 50;
     * grouped-query heads 2 to 1 in both, then 6 query heads over 2 key/value heads (3 each:
     * head h reads h / 3, not h % 2) with HS 16; MoE: 8 experts top-2, 6 top-3, 5 top-1 */
    enum { NS = 3 };
    const struct shape shapes[NS] = {{2, 37, 48, 2, 24, 80, 101, 104, 101, 0, 1, 8, 2},
                                     {2, 70, 128, 2, 64, 96, 51, 56, 51, 50, 1, 6, 3},
                                     {1, 29, 96, 6, 16, 40, 77, 80, 77, 0, 2, 5, 1}};
    const enum l3d_dtype types[3] = {L3D_F32, L3D_BF16, L3D_F16};
    for (int si = 0; si < NS; si++) {
        int n;
        struct kcase *k = cases(shapes[si], &n);
        for (int ti = 0; ti < 3; ti++)
            for (int c = 0; c < n; c++) {
                if ((k[c].f32_only && types[ti] != L3D_F32) ||
                    ((k[c].opt & OPT_MIXED) && types[ti] == L3D_F32) || !chosen(&k[c], only))
                    continue;
                struct shape sh = shapes[si];
                if (k[c].opt & OPT_MHA) sh.NKV = sh.NH;
                check_case(cpu, gpu, &k[c], types[ti], &sh, 1000u * (uint64_t)si + 7);
            }
    }
    if (!only || strcmp(only, "dense") == 0) check_special(cpu, gpu);
    /* the comparison itself: the same infinity matches; NaN, or an infinity against a finite
     * value or the other infinity, does not */
    const float ninf[2] = {-INFINITY, 1.0f}, fin[2] = {0.0f, 1.0f}, pinf[2] = {INFINITY, 1.0f};
    const float nan2[2] = {NAN, 1.0f};
    CHECK(rel_diff(L3D_F32, ninf, ninf, 2) == 0.0);
    CHECK(isinf(rel_diff(L3D_F32, ninf, fin, 2)) && isinf(rel_diff(L3D_F32, fin, ninf, 2)));
    CHECK(isinf(rel_diff(L3D_F32, ninf, pinf, 2)) && isinf(rel_diff(L3D_F32, nan2, nan2, 2)));
    l3d_backend_free(gpu);
    l3d_backend_free(cpu);
    return TEST_REPORT();
}
