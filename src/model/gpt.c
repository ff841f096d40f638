/*
 * GPT-2 and Llama-family forward and backward over one shard (include/llm3d/model.h).
 *
 * Activations are planned once from (B, T) and the shard and live in one flat buffer; backward
 * uses one layer's worth of gradient scratch, reused from the last layer to the first, plus the
 * residual-stream gradient. Parameters, gradients and activations are device memory of the
 * model's backend: every kernel, fill and copy goes through it (include/llm3d/backend.h), and
 * host values (the initial weights, the loss) cross by explicit copies.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/arch.h"
#include "llm3d/model.h"
#include "moe.h"
#include "qknorm.h"
#include "tpsum.h"

/* ---- configuration ---------------------------------------------------------------------- */

/* Parameters of the whole model (doubles: the checks run before the sizes are known to fit). */
double l3d_model_param_count(const struct l3d_model_spec *m) {
    double C = m->C, hd = l3d_model_head_dim(m), kv = l3d_model_kv_heads(m) * hd;
    double q = m->NH * hd; /* the attention's channels: C unless head_dim sets hd apart */
    double F = m->ffn > 0 ? (double)m->ffn : 4.0 * C, bias = m->no_bias ? 0.0 : 1.0;
    double norm = m->norm == L3D_NORM_LAYERNORM ? 2 * C : C; /* LayerNorm: weight and bias */
    double attn = C * q + 2 * C * kv + q * C + bias * (q + 2 * kv + C);
    double mlp = m->mlp == L3D_MLP_SWIGLU ? 3 * C * F + bias * (2 * F + C) : 2 * C * F + bias * (F + C);
    double Vp = m->Vp > 0 ? m->Vp : m->V;
    double qkn = m->qk_norm ? 2 * hd : 0.0; /* QK-norm's two weight vectors */
    return m->L * (2 * norm + attn + mlp + qkn) + Vp * C * (m->untied ? 2 : 1) +
           (m->pos == L3D_POS_LEARNED ? (double)m->maxT * C : 0.0) + norm +
           l3d_moe_layer_param_delta(m, m->moe.experts);
}

/* The architecture's own rules (sizes are checked by the caller first). */
static l3d_status arch_check(struct l3d_model_spec *cfg) {
    if (cfg->NKV < 0 || (cfg->NKV > 0 && cfg->NH % cfg->NKV != 0))
        return l3d_error(L3D_ERR_ARG, "key/value heads (%d) must divide the %d query heads "
                         "(grouped-query attention): give a divisor of %d", cfg->NKV, cfg->NH,
                         cfg->NH);
    if (cfg->norm_eps == 0.0f) cfg->norm_eps = 1e-5f;
    if (!(cfg->norm_eps > 0.0f && cfg->norm_eps < 1.0f))
        return l3d_error(L3D_ERR_ARG, "norm epsilon %g: give a value in (0, 1), e.g. 1e-5",
                         (double)cfg->norm_eps);
    if (cfg->mlp == L3D_MLP_SWIGLU && cfg->ffn <= 0)
        return l3d_error(L3D_ERR_ARG, "a SwiGLU MLP needs its hidden size (ffn, "
                         "intermediate_size): give it");
    if (cfg->pos == L3D_POS_ROPE) {
        if (l3d_model_head_dim(cfg) % 2 != 0)
            return l3d_error(L3D_ERR_ARG, "rotary positions need an even head size, not %d "
                             "(%s): give an even --head-dim", l3d_model_head_dim(cfg),
                             cfg->head_dim > 0 ? "--head-dim" : "channels / heads");
        struct l3d_rope *r = &cfg->rope;
        if (r->theta == 0.0) r->theta = 10000.0;
        if (!(r->theta > 1.0) || !(r->factor >= 0.0))
            return l3d_error(L3D_ERR_ARG, "rope theta %g, scaling factor %g: give theta > 1 and "
                             "a factor >= 0 (0: no scaling)", r->theta, r->factor);
        if (r->factor > 0.0 && !(r->original_context > 0 && r->low_freq_factor > 0.0 &&
                                 r->high_freq_factor > r->low_freq_factor))
            return l3d_error(L3D_ERR_ARG, "rope scaling (factor %g) needs original context > 0 "
                             "(%d) and high_freq_factor (%g) > low_freq_factor (%g) > 0", r->factor,
                             r->original_context, r->high_freq_factor, r->low_freq_factor);
    }
    return L3D_OK;
}

l3d_status l3d_gpt_config_finish(struct l3d_model_spec *cfg) {
    if (cfg->L < 1 || cfg->C < 1 || cfg->NH < 1 || cfg->V < 2 || cfg->maxT < 1)
        return l3d_error(L3D_ERR_ARG, "model sizes must be positive (layers %d, channels %d, heads "
                         "%d, vocabulary %d, context %d)", cfg->L, cfg->C, cfg->NH, cfg->V, cfg->maxT);
    if (cfg->head_dim < 0 || cfg->head_dim > L3D_MAX_CHANNELS)
        return l3d_error(L3D_ERR_ARG, "--head-dim %d: give 1 to %d (0: channels / heads)",
                         cfg->head_dim, L3D_MAX_CHANNELS);
    if (cfg->head_dim == 0 && cfg->C % cfg->NH != 0)
        return l3d_error(L3D_ERR_ARG, "channels (%d) must be divisible by heads (%d), or give "
                         "the head size (--head-dim)", cfg->C, cfg->NH);
    /* a head size of channels / heads is the default's: one spelling for one model */
    if ((int64_t)cfg->head_dim * cfg->NH == cfg->C) cfg->head_dim = 0;
    if (cfg->V > (1 << 30))
        return l3d_error(L3D_ERR_ARG, "vocabulary size %d is too large", cfg->V);
    /* sane limits (far above any GPT): every count and byte size below then fits an int64_t */
    if (cfg->L > L3D_MAX_LAYERS || cfg->C > L3D_MAX_CHANNELS || cfg->maxT > L3D_MAX_CONTEXT ||
        cfg->ffn > 16LL * L3D_MAX_CHANNELS)
        return l3d_error(L3D_ERR_ARG, "model too large: layers %d (at most %d), channels %d (at "
                         "most %d), context %d (at most %d), MLP width %lld (at most %d)", cfg->L,
                         L3D_MAX_LAYERS, cfg->C, L3D_MAX_CHANNELS, cfg->maxT, L3D_MAX_CONTEXT,
                         (long long)cfg->ffn, 16 * L3D_MAX_CHANNELS);
    cfg->Vp = (cfg->V + L3D_VOCAB_ALIGN - 1) / L3D_VOCAB_ALIGN * L3D_VOCAB_ALIGN;
    l3d_status st = arch_check(cfg);
    if (st == L3D_OK) st = l3d_moe_spec_check(cfg);
    if (st != L3D_OK) return st;
    if (cfg->ffn <= 0) cfg->ffn = 4LL * cfg->C; /* GPT-2's MLP */
    if (cfg->moe.experts > 0 && cfg->moe.ffn == 0) cfg->moe.ffn = cfg->ffn; /* the MLP's width */
    if (cfg->moe.ffn > 16LL * L3D_MAX_CHANNELS)
        return l3d_error(L3D_ERR_ARG, "--moe-ffn %lld: at most %d", (long long)cfg->moe.ffn,
                         16 * L3D_MAX_CHANNELS);
    double params = l3d_model_param_count(cfg);
    if (params > L3D_MAX_PARAMS)
        return l3d_error(L3D_ERR_ARG, "model too large: %.3g parameters (layers %d, channels %d, "
                         "vocabulary %d, context %d; at most 2^56)", params, cfg->L, cfg->C,
                         cfg->V, cfg->maxT);
    return L3D_OK;
}

/* The MLP's hidden width: ffn, or GPT-2's 4C in a spec not yet finished. */
static int64_t model_ffn(const struct l3d_model_spec *cfg) {
    return cfg->ffn > 0 ? cfg->ffn : 4 * (int64_t)cfg->C;
}

/* Query heads per key/value head. */
static int kv_group(const struct l3d_model_spec *cfg) {
    return cfg->NH / l3d_model_kv_heads(cfg);
}

int l3d_shard_kv_start(const struct l3d_model_spec *cfg, const struct l3d_shard *sh) {
    return sh->head_start / kv_group(cfg);
}

int l3d_shard_kv_count(const struct l3d_model_spec *cfg, const struct l3d_shard *sh) {
    return sh->head_count / kv_group(cfg);
}

bool l3d_model_same_shapes(const struct l3d_model_spec *a, const struct l3d_model_spec *b) {
    return a->L == b->L && a->C == b->C && a->NH == b->NH && a->V == b->V && a->maxT == b->maxT &&
           model_ffn(a) == model_ffn(b) && a->arch == b->arch &&
           l3d_model_kv_heads(a) == l3d_model_kv_heads(b) && a->norm == b->norm &&
           a->mlp == b->mlp && a->pos == b->pos && a->no_bias == b->no_bias &&
           a->untied == b->untied && a->moe.experts == b->moe.experts &&
           a->moe.top_k == b->moe.top_k && a->moe.ffn == b->moe.ffn &&
           a->moe.shared == b->moe.shared && a->moe.dense_layers == b->moe.dense_layers &&
           a->qk_norm == b->qk_norm && l3d_model_head_dim(a) == l3d_model_head_dim(b);
}

bool l3d_model_same(const struct l3d_model_spec *a, const struct l3d_model_spec *b) {
    const struct l3d_rope *p = &a->rope, *q = &b->rope;
    const struct l3d_moe_spec *x = &a->moe, *y = &b->moe;
    bool moe = x->norm_topk == y->norm_topk && x->aux_coef == y->aux_coef &&
               x->z_coef == y->z_coef && x->capacity_factor == y->capacity_factor;
    return l3d_model_same_shapes(a, b) && moe && a->Vp == b->Vp && a->norm_eps == b->norm_eps &&
           (a->pos != L3D_POS_ROPE ||
            (p->theta == q->theta && p->factor == q->factor &&
             p->low_freq_factor == q->low_freq_factor &&
             p->high_freq_factor == q->high_freq_factor &&
             p->original_context == q->original_context));
}

bool l3d_model_gpt2_blocks(const struct l3d_model_spec *m) {
    const struct l3d_arch_info *a = l3d_arch_info(m->arch);
    return a && a->llmc_fp32 && l3d_model_kv_heads(m) == m->NH && m->norm == a->norm &&
           m->mlp == a->mlp && m->pos == a->pos && m->no_bias == a->no_bias &&
           m->untied == a->untied && m->moe.experts == 0 && /* llm.c has no experts */
           !m->qk_norm && (int64_t)l3d_model_head_dim(m) * m->NH == m->C;
}

bool l3d_model_is_gpt2(const struct l3d_model_spec *m) {
    return l3d_model_gpt2_blocks(m) && (m->norm_eps == 0.0f || m->norm_eps == 1e-5f) &&
           model_ffn(m) == 4LL * m->C;
}

struct l3d_shard l3d_shard_full(const struct l3d_model_spec *cfg) {
    return (struct l3d_shard){
        .layer_start = 0, .layer_count = cfg->L,
        .head_start = 0, .head_count = cfg->NH,
        .ffn_start = 0, .ffn_count = model_ffn(cfg),
        .vocab_start = 0, .vocab_count = cfg->Vp,
        .has_embedding = true, .has_head = true, .adds_row_bias = true,
        .sp_size = 1, .sp_rank = 0,
        .expert_start = 0, .expert_count = cfg->moe.experts,
    };
}

l3d_status l3d_shard_check(const struct l3d_model_spec *cfg, const struct l3d_shard *sh) {
    if (sh->layer_start < 0 || sh->layer_count < 0 || sh->layer_start + sh->layer_count > cfg->L)
        return l3d_error(L3D_ERR_LAYOUT, "shard layers [%d, %d) outside the model's %d layers",
                         sh->layer_start, sh->layer_start + sh->layer_count, cfg->L);
    if (sh->head_start < 0 || sh->head_count < 1 || sh->head_start + sh->head_count > cfg->NH)
        return l3d_error(L3D_ERR_LAYOUT, "shard heads [%d, %d) outside the model's %d heads",
                         sh->head_start, sh->head_start + sh->head_count, cfg->NH);
    int g = kv_group(cfg);
    if (sh->head_start % g != 0 || sh->head_count % g != 0)
        return l3d_error(L3D_ERR_LAYOUT, "shard heads [%d, %d) split a group of %d query heads "
                         "that share a key/value head (%d heads, %d key/value heads)",
                         sh->head_start, sh->head_start + sh->head_count, g, cfg->NH,
                         l3d_model_kv_heads(cfg));
    if (sh->ffn_start < 0 || sh->ffn_count < 1 || sh->ffn_start + sh->ffn_count > model_ffn(cfg))
        return l3d_error(L3D_ERR_LAYOUT, "shard FFN columns [%lld, %lld) outside the model's %lld",
                         (long long)sh->ffn_start, (long long)(sh->ffn_start + sh->ffn_count),
                         (long long)model_ffn(cfg));
    if (sh->vocab_start < 0 || sh->vocab_count < 1 || sh->vocab_start + sh->vocab_count > cfg->Vp)
        return l3d_error(L3D_ERR_LAYOUT, "shard vocabulary rows [%lld, %lld) outside the padded "
                         "vocabulary of %d", (long long)sh->vocab_start,
                         (long long)(sh->vocab_start + sh->vocab_count), cfg->Vp);
    if (sh->layer_count == 0 && !sh->has_embedding && !sh->has_head)
        return l3d_error(L3D_ERR_LAYOUT, "shard holds no layer, no embedding and no head");
    if (cfg->moe.experts > 0 && (sh->expert_start < 0 || sh->expert_count < 1 ||
                                 sh->expert_start + sh->expert_count > cfg->moe.experts))
        return l3d_error(L3D_ERR_LAYOUT, "shard experts [%d, %d) outside the model's %d",
                         sh->expert_start, sh->expert_start + sh->expert_count, cfg->moe.experts);
    if (sh->sp_size < 1 || sh->sp_rank < 0 || sh->sp_rank >= sh->sp_size)
        return l3d_error(L3D_ERR_LAYOUT, "sequence-parallel rank %d of %d", sh->sp_rank,
                         sh->sp_size);
    return L3D_OK;
}

/* ---- parameter table -------------------------------------------------------------------- */

static const char *const tensor_names[L3D_NUM_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb", "lmhead",
    "router", "expfcw", "expfcb", "expprojw", "expprojb", "shfcw", "shfcb", "shprojw", "shprojb",
    "qnormw", "knormw",
};

bool l3d_gpt_tensor_used(const struct l3d_model_spec *c, int t) {
    switch (t) {
    case L3D_T_WPE: return c->pos == L3D_POS_LEARNED;
    case L3D_T_LN1B: case L3D_T_LN2B: case L3D_T_LNFB: return c->norm == L3D_NORM_LAYERNORM;
    case L3D_T_QKVB: case L3D_T_ATTPROJB: case L3D_T_FCB: case L3D_T_FCPROJB: return !c->no_bias;
    case L3D_T_LMHEAD: return c->untied;
    case L3D_T_ROUTER: case L3D_T_EXPFCW: case L3D_T_EXPPROJW: return c->moe.experts > 0;
    case L3D_T_EXPFCB: case L3D_T_EXPPROJB: return c->moe.experts > 0 && !c->no_bias;
    case L3D_T_SHFCW: case L3D_T_SHPROJW: return c->moe.experts > 0 && c->moe.shared > 0;
    case L3D_T_SHFCB: case L3D_T_SHPROJB:
        return c->moe.experts > 0 && c->moe.shared > 0 && !c->no_bias;
    case L3D_T_QNORMW: case L3D_T_KNORMW: return c->qk_norm;
    default: return t >= 0 && t < L3D_NUM_TENSORS;
    }
}

int64_t l3d_gpt_plan_tensors(const struct l3d_model_spec *c, const struct l3d_shard *s,
                             struct l3d_tensor_info tensors[L3D_NUM_TENSORS]) {
    int64_t C = c->C, Ll = s->layer_count, HS = l3d_model_head_dim(c);
    int64_t Ca = (int64_t)s->head_count * HS; /* local attention channels */
    int64_t QKV = Ca + 2 * (int64_t)l3d_shard_kv_count(c, s) * HS; /* local q|k|v rows */
    int64_t F = s->ffn_count, Fm = c->mlp == L3D_MLP_SWIGLU ? 2 * F : F; /* fcw rows */
    /* the token embedding on the first stage, and on the last as the tied head */
    int64_t Vl = (s->has_embedding || (s->has_head && !c->untied)) ? s->vocab_count : 0;
    int64_t Vh = s->has_head ? s->vocab_count : 0;
    int64_t Tw = s->has_embedding ? c->maxT : 0;
    int64_t Cf = s->has_head ? C : 0;
    /* the dense MLP's layers and the MoE layers (the dense ones lead: moe.dense_layers) */
    int64_t Lm = l3d_shard_moe_layers(c, s), Ld = Ll - Lm;
    int64_t E = c->moe.experts, Fe = c->moe.ffn, mul = c->mlp == L3D_MLP_SWIGLU ? 2 : 1;
    int64_t Fem = mul * Fe, SF = c->moe.shared * Fe, SFm = mul * SF;
    int64_t El = s->expert_count; /* the shard's experts (expert parallelism), the router all E */
    /* (layers, rows, cols) of each tensor, in llm.c's order, then the MoE ones */
    const int64_t shape[L3D_NUM_TENSORS][3] = {
        {1, Vl, C},     {1, Tw, C},     {Ll, 1, C},  {Ll, 1, C},  {Ll, QKV, C},    {Ll, 1, QKV},
        {Ll, C, Ca},    {Ll, 1, C},     {Ll, 1, C},  {Ll, 1, C},  {Ld, Fm, C},     {Ld, 1, Fm},
        {Ld, C, F},     {Ld, 1, C},     {1, 1, Cf},  {1, 1, Cf},  {1, Vh, C},
        {Lm, E, C},     {Lm, El * Fem, C}, {Lm, 1, El * Fem}, {Lm, El * C, Fe}, {Lm, 1, El * C},
        {Lm, SFm, C},   {Lm, 1, SFm},   {Lm, C, SF}, {Lm, 1, C},
        {Ll, 1, HS},    {Ll, 1, HS},
    };
    int64_t off = 0;
    for (int i = 0; i < L3D_NUM_TENSORS; i++) {
        struct l3d_tensor_info *t = &tensors[i];
        bool used = l3d_gpt_tensor_used(c, i);
        t->name = tensor_names[i];
        t->layers = shape[i][0];
        t->rows = used ? shape[i][1] : 0;
        t->cols = shape[i][2];
        t->count = t->layers * t->rows * t->cols;
        t->offset = off;
        t->dtype = L3D_F32; /* l3d_gpt_init_dt sets the model's type */
        t->bytes = (size_t)t->count * l3d_dtype_size(t->dtype);
        t->decay = (i == L3D_T_WTE || i == L3D_T_WPE || i == L3D_T_QKVW || i == L3D_T_ATTPROJW ||
                    i == L3D_T_FCW || i == L3D_T_FCPROJW || i == L3D_T_LMHEAD ||
                    i == L3D_T_ROUTER || i == L3D_T_EXPFCW || i == L3D_T_EXPPROJW ||
                    i == L3D_T_SHFCW || i == L3D_T_SHPROJW);
        off += t->count;
    }
    return off;
}

static void plan_params(struct l3d_gpt *m) {
    m->num_params = l3d_gpt_plan_tensors(&m->cfg, &m->shard, m->tensors);
    for (int i = 0; i < L3D_NUM_TENSORS; i++) {
        const struct l3d_tensor_info *t = &m->tensors[i];
        if (l3d_gpt_is_layer_tensor(i)) {
            m->slot_off[i] = m->slot_size;
            m->slot_size += t->rows * t->cols;
        } else {
            m->nonlayer_off[i] = m->nonlayer_size;
            m->nonlayer_size += t->count;
        }
    }
}

bool l3d_gpt_is_layer_tensor(int t) {
    return (t >= L3D_T_LN1W && t <= L3D_T_FCPROJB) || (t >= L3D_T_ROUTER && t < L3D_NUM_TENSORS);
}

int64_t l3d_gpt_tensor_layer(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                             int layer) {
    if (cfg->moe.experts == 0) return layer;
    int g = sh->layer_start + layer, N = cfg->moe.dense_layers;
    bool moe = l3d_model_moe_layer(cfg, g);
    if (t >= L3D_T_FCW && t <= L3D_T_FCPROJB) return moe ? -1 : layer; /* dense layers lead */
    if (t >= L3D_T_ROUTER && t <= L3D_T_SHPROJB) /* the MoE layers' (QK-norm's: every layer) */
        return moe ? g - (sh->layer_start > N ? sh->layer_start : N) : -1;
    return layer;
}

int64_t l3d_gpt_tensor_first(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                             int t) {
    if (!l3d_gpt_is_layer_tensor(t)) return 0;
    int N = cfg->moe.dense_layers;
    if (cfg->moe.experts > 0 && t >= L3D_T_ROUTER) /* the MoE layers' own numbering */
        return (sh->layer_start > N ? sh->layer_start : N) - N;
    return sh->layer_start; /* the dense MLP's layers lead, so theirs is the model's */
}

/* Element i of a buffer of type t. */
static inline void *el(const void *p, int64_t i, size_t es) { return (char *)p + i * (int64_t)es; }

void *l3d_gpt_param_ptr(const struct l3d_gpt *m, int t, int layer) {
    const struct l3d_tensor_info *ti = &m->tensors[t];
    if (!m->params) { /* ZeRO-3: the gathered copy (gathered_params) */
        bool lt = l3d_gpt_is_layer_tensor(t);
        L3D_ASSERT(lt ? m->gathered_layer && m->gathered_id == layer : m->gathered_nonlayer != NULL);
        return el(lt ? m->gathered_layer : m->gathered_nonlayer,
                  lt ? m->slot_off[t] : m->nonlayer_off[t], m->es);
    }
    int64_t tl = l3d_gpt_is_layer_tensor(t) ? l3d_gpt_tensor_layer(&m->cfg, &m->shard, t, layer)
                                            : layer;
    L3D_ASSERT(tl >= 0); /* a layer the tensor has no part in (layer_params asks for none) */
    return el(m->params, ti->offset + tl * ti->rows * ti->cols, m->es);
}

void l3d_gpt_fp32_view(const struct l3d_gpt *m, float *p, struct l3d_gpt *view) {
    *view = *m;
    view->params = p;
    view->dt = L3D_F32;
    view->es = sizeof(float);
    for (int i = 0; i < L3D_NUM_TENSORS; i++) {
        view->tensors[i].dtype = L3D_F32;
        view->tensors[i].bytes = (size_t)view->tensors[i].count * sizeof(float);
    }
}

float *l3d_gpt_grad_ptr(const struct l3d_gpt *m, int t, int layer) {
    const struct l3d_tensor_info *ti = &m->tensors[t];
    if (!m->grads_nonlayer) {
        int64_t tl = l3d_gpt_is_layer_tensor(t) ? l3d_gpt_tensor_layer(&m->cfg, &m->shard, t, layer)
                                                : layer;
        L3D_ASSERT(tl >= 0);
        return m->grads + ti->offset + tl * ti->rows * ti->cols;
    }
    if (l3d_gpt_is_layer_tensor(t)) return m->grad_slot[layer % 2] + m->slot_off[t];
    return m->grads_nonlayer + m->nonlayer_off[t];
}


/* ---- activations ------------------------------------------------------------------------ */

/* One layer's saved activations; pointers into the flat activation buffer. */
struct layer_acts { /* of the model's type dt, but the statistics (fp32: mean, rstd, att) */
    void *ln1, *ln1_mean, *ln1_rstd;  /* (B,T,C), (B,T) (LayerNorm only), (B,T) */
    void *qkv;                        /* (B,T,QKV): q|k|v of the local heads (after RoPE) */
    void *atty;                       /* (B,T,Ca) */
    void *att;                        /* (B,Hl,T) log-sum-exp of the tiled kernel's rows, or
                                       * (B,Hl,T,T) probabilities with L3D_ATTENTION=naive */
    void *res2;                       /* (B,T,C) residual after attention */
    void *ln2, *ln2_mean, *ln2_rstd;
    void *fch, *fch_gelu;             /* (B,T,Fm) the MLP's first product ([gate | up] with
                                       * SwiGLU), (B,T,F) its activation */
    void *res3;                       /* (B,T,C) residual after the MLP: the layer's output */
};

struct l3d_gpt_acts { /* of the model's type dt, but the fp32 statistics and dlnw */
    void *base;
    int64_t slot_bytes;       /* size of one slot's region; slots come first in base */
    struct layer_acts *layer; /* layer_count entries, pointing into the current slot */
    /* recomputation: one layer's activations rebuilt in backward (full), the attention
     * probabilities of the layer being computed (selective and full), the recomputed attention
     * output that nobody reads (selective) and layer output (full) */
    struct layer_acts rc;
    float *att_shared;
    void *atty_tmp, *res3_tmp;
    void *scratch;            /* (B,T,C): row-parallel matmul output before the residual add */
    /* Sequence parallelism: this rank's rows (N/sp) where the full rows are gathered or scattered;
     * with sp = 1 they alias the full buffers. */
    void *scratch_local;      /* (N/sp,C) reduce-scattered row-parallel output */
    void *ln_local;           /* (N/sp,C) LayerNorm output before the all-gather */
    void *lnf_full;           /* (N,C) gathered final LayerNorm output */
    void *dres_full;          /* (N,C) gathered residual-stream gradient */
    void *dln_local;          /* (N/sp,C) reduce-scattered LayerNorm-output gradient */
    float *dlnw;              /* (4C) LayerNorm weight gradients of this rank's rows (SP), fp32 */
    void *lnf; float *lnf_mean, *lnf_rstd;
    float *maxv, *sumexp, *tlogit; /* (B,T) */
    /* backward scratch, one layer's worth */
    void *dres;               /* (B,T,C) gradient of the residual stream */
    void *dln;                /* (B,T,C) */
    void *dqkv;               /* (B,T,QKV) */
    void *datty;              /* (B,T,Ca) */
    float *datt;              /* (B,Hl,T,T), L3D_ATTENTION=naive only (fp32) */
    void *dfch, *dfch_gelu;   /* (B,T,Fm), (B,T,F) */
};

/* A layer's local widths: attention channels (query heads), q|k|v rows, MLP columns and the
 * rows of its first product (SwiGLU: gate and up). */
struct widths {
    int64_t HS, Hl, KVl, Ca, QKV, F, Fm;
};

static struct widths widths(const struct l3d_gpt *m) {
    const struct l3d_shard *s = &m->shard;
    struct widths w = {.HS = l3d_model_head_dim(&m->cfg), .Hl = s->head_count,
                       .KVl = l3d_shard_kv_count(&m->cfg, s), .F = s->ffn_count};
    w.Ca = w.Hl * w.HS;
    w.QKV = w.Ca + 2 * w.KVl * w.HS;
    w.Fm = m->cfg.mlp == L3D_MLP_SWIGLU ? 2 * w.F : w.F;
    return w;
}

/* The sizes (floats) of one layer's activations, in the order they are taken. */
static void layer_act_sizes(const struct l3d_gpt *m, int64_t sz[13]) {
    const struct l3d_shard *s = &m->shard;
    int64_t BT = (int64_t)m->Bmax * m->Tmax, T = m->Tmax, C = m->cfg.C, BTl = BT / s->sp_size;
    struct widths w = widths(m);
    int64_t att = (int64_t)m->Bmax * w.Hl * T * (m->attn_naive ? T : 1);
    int64_t mean = m->cfg.norm == L3D_NORM_LAYERNORM ? BTl : 0; /* RMSNorm keeps rstd only */
    const int64_t v[13] = {BT * C, mean, BTl, BT * w.QKV, BT * w.Ca, att,
                           BTl * C, BT * C, mean, BTl, BT * w.Fm, BT * w.F, BTl * C};
    memcpy(sz, v, sizeof v);
}

static void **layer_act_field(struct layer_acts *la, int i) {
    void **f[13] = {&la->ln1, &la->ln1_mean, &la->ln1_rstd, &la->qkv, &la->atty, &la->att,
                    &la->res2, &la->ln2, &la->ln2_mean, &la->ln2_rstd, &la->fch, &la->fch_gelu,
                    &la->res3};
    return f[i];
}

/* Whether field i of layer_act_field is an fp32 statistic (else of the model's type). */
static bool layer_act_f32(int i) { return i == 1 || i == 2 || i == 5 || i == 8 || i == 9; }

/* Walks the activation plan: with base NULL it only counts, so sizing and pointing share one list.
 * The first region holds what a micro-batch keeps from its forward to its backward, once per
 * activation slot (the pipeline keeps several micro-batches in flight); `slot` chooses which one
 * the pointers name. The second region is shared: scratch and one layer's backward buffers.
 * Which per-layer tensors are kept depends on the recomputation mode: all of them (none), all but
 * the attention probabilities (selective: only the materialising kernel has them; with the tiled
 * kernel it keeps everything, as none), only the layer's output (full). */
static int64_t point_acts(struct l3d_gpt *m, void *base, int slot) {
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    int64_t BT = (int64_t)m->Bmax * m->Tmax, C = m->cfg.C;
    int64_t sp = s->sp_size, BTl = BT / sp; /* rows of the LayerNorm and residual regions */
    int64_t BTs = sp > 1 ? BT : 0, BTls = sp > 1 ? BTl : 0; /* buffers only SP needs */
    struct widths w = widths(m);
    int64_t Ca = w.Ca, F = w.F, Vl = s->vocab_count, off = 0, sz[13];
    const bool chunked = m->xent_rows < BT; /* one chunk of logits, used within a pass: shared */
    const int64_t E = (int64_t)m->es, F4 = 4; /* bytes: the model's type; fp32 and int32 */
    /* selective recomputation drops only the materialised probabilities */
    const bool naive_sel = m->attn_naive && m->recompute == L3D_RECOMPUTE_SELECTIVE;
    char *region = base ? (char *)base + (int64_t)slot * a->slot_bytes : NULL;
    layer_act_sizes(m, sz);
#define TAKE(ptr, n, es)                                            \
    do {                                                            \
        if (region) (ptr) = (void *)(region + off);                 \
        off += ((int64_t)(n) * (es) + 63) / 64 * 64; /* aligned */  \
    } while (0)
    /* per-slot region */
    TAKE(m->input_act, BTl * C, E);
    for (int l = 0; l < s->layer_count; l++)
        for (int i = 0; i < 13; i++) {
            bool keep = m->recompute == L3D_RECOMPUTE_NONE ||
                        (m->recompute == L3D_RECOMPUTE_SELECTIVE && (i != 5 || !naive_sel)) ||
                        i == 12;
            /* a MoE layer has no dense MLP: its rows live in src/model/moe.c's buffers */
            bool moe = l3d_model_moe_layer(&m->cfg, s->layer_start + l) && (i == 10 || i == 11);
            if (keep) TAKE(*layer_act_field(&a->layer[l], i), moe ? 0 : sz[i],
                           layer_act_f32(i) ? F4 : E);
        }
    /* the head's: per slot, or once in the shared region (head_once: each forward's backward
     * comes before the next forward) */
#define TAKE_HEAD()                                 \
    do {                                            \
        TAKE(a->lnf, BTl * C, E);                   \
        TAKE(a->lnf_full, BTs * C, E);              \
        TAKE(a->lnf_mean, BTl, F4);                 \
        TAKE(a->lnf_rstd, BTl, F4);                 \
        if (!chunked) TAKE(m->logits, BT * Vl, E);  \
        TAKE(a->maxv, BT, F4);                      \
        TAKE(a->sumexp, BT, F4);                    \
        TAKE(a->tlogit, BT, F4);                    \
    } while (0)
    if (s->has_head && !m->head_once) TAKE_HEAD();
    if (s->has_head) TAKE(m->losses, BT, F4);
    TAKE(m->inputs, BT, F4);
    TAKE(m->targets, BT, F4);
    TAKE(m->dinput_act, BTl * C, E);
    a->slot_bytes = off;
    int64_t total = off * m->act_slots; /* the shared region follows every slot */
    region = base ? (char *)base + total : NULL;
    off = 0;
    /* shared region */
    if (s->has_head && m->head_once) TAKE_HEAD();
    if (s->has_head && chunked) TAKE(m->logits, m->xent_rows * Vl, E);
    if (naive_sel || m->recompute == L3D_RECOMPUTE_FULL) TAKE(a->att_shared, sz[5], F4);
    if (naive_sel) TAKE(a->atty_tmp, BT * Ca, E);
    if (m->recompute == L3D_RECOMPUTE_FULL) {
        for (int i = 0; i < 12; i++)
            if (i != 5) TAKE(*layer_act_field(&a->rc, i), sz[i], layer_act_f32(i) ? F4 : E);
        TAKE(a->res3_tmp, BTl * C, E);
    }
    TAKE(a->scratch, BT * C, E);
    TAKE(a->scratch_local, BTls * C, E);
    TAKE(a->ln_local, BTls * C, E);
    TAKE(a->dres, BTl * C, E);
    TAKE(a->dres_full, BTs * C, E);
    TAKE(a->dln, BT * C, E);
    TAKE(a->dln_local, BTls * C, E);
    TAKE(a->dlnw, sp > 1 ? 4 * C : 0, F4);
    TAKE(a->dqkv, BT * w.QKV, E);
    TAKE(a->datty, BT * Ca, E);
    TAKE(a->datt, m->attn_naive ? sz[5] : 0, F4);
    TAKE(a->dfch, BT * w.Fm, E);
    TAKE(a->dfch_gelu, BT * F, E);
#undef TAKE_HEAD
#undef TAKE
    if (base) {
        a->rc.att = a->att_shared;
        a->rc.res3 = a->res3_tmp;
        for (int l = 0; l < s->layer_count; l++) {
            struct layer_acts *la = &a->layer[l];
            if (m->recompute == L3D_RECOMPUTE_FULL) { /* all but the output live in rc */
                void *res3 = la->res3;
                *la = a->rc;
                la->res3 = res3;
            } else if (naive_sel) {
                la->att = a->att_shared;
            }
        }
        if (sp == 1) {
            a->scratch_local = a->scratch;
            a->lnf_full = a->lnf;
            a->dres_full = a->dres;
            a->dln_local = a->dln;
        }
    }
    return total + off; /* bytes */
}

/* RoPE's frequencies (l3d_rope_inv_freq, Llama 3.1 scaling included) and the positions 0..Tmax-1
 * of a sequence's rows, on the device; false when out of memory. */
static bool rope_init(struct l3d_gpt *m) {
    int64_t half = l3d_model_head_dim(&m->cfg) / 2, T = m->Tmax;
    m->rope_inv_freq = l3d_be_alloc(m->be, (size_t)half * sizeof(float), "rope frequencies");
    m->rope_pos = l3d_be_alloc(m->be, (size_t)T * sizeof(int32_t), "rope positions");
    float *f = l3d_alloc((size_t)half * sizeof(float), "rope frequencies");
    int32_t *p = l3d_alloc((size_t)T * sizeof(int32_t), "rope positions");
    l3d_rope_inv_freq(&m->cfg, f);
    for (int64_t t = 0; t < T; t++) p[t] = (int32_t)t;
    bool ok = m->rope_inv_freq && m->rope_pos;
    if (ok) {
        l3d_be_copy_h2d(m->be, m->rope_inv_freq, f, (size_t)half * sizeof(float));
        l3d_be_copy_h2d(m->be, m->rope_pos, p, (size_t)T * sizeof(int32_t));
        l3d_be_sync(m->be); /* before the host copies go */
    }
    l3d_free(f);
    l3d_free(p);
    return ok;
}

l3d_status l3d_gpt_init(struct l3d_gpt **out, const struct l3d_model_spec *cfg,
                        const struct l3d_shard *sh, struct l3d_backend *be, int B, int T,
                        enum l3d_grad_mode grads) {
    return l3d_gpt_init_ex(out, cfg, sh, be, B, T, grads, 1, L3D_RECOMPUTE_NONE);
}

l3d_status l3d_gpt_init_ex(struct l3d_gpt **out, const struct l3d_model_spec *cfg,
                           const struct l3d_shard *sh, struct l3d_backend *be, int B, int T,
                           enum l3d_grad_mode grads, int act_slots, enum l3d_recompute recompute) {
    return l3d_gpt_init_dt(out, cfg, sh, be, B, T, grads, act_slots, recompute, L3D_F32);
}

/* The model, shard and batch shape l3d_gpt_init_dt takes: L3D_OK, or the error. */
static l3d_status check_init(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                             int T) {
    l3d_status st = l3d_shard_check(cfg, sh);
    if (st != L3D_OK) return st;
    if (cfg->norm == L3D_NORM_LAYERNORM && cfg->norm_eps != 1e-5f)
        return l3d_error(L3D_ERR_ARG, "model '%s': LayerNorm with epsilon %g: the LayerNorm "
                         "kernels use GPT-2's 1e-5 (RMSNorm takes any); give --norm-eps 1e-5",
                         cfg->name[0] ? cfg->name : "custom", (double)cfg->norm_eps);
    if (B < 1 || T < 1)
        return l3d_error(L3D_ERR_ARG, "batch size (%d) and sequence length (%d) must be positive",
                         B, T);
    if (T > cfg->maxT)
        return l3d_error(L3D_ERR_ARG, "sequence length %d exceeds the model's context length %d "
                         "(raise --context or lower --seq-len)", T, cfg->maxT);
    if (((int64_t)B * T) % sh->sp_size != 0)
        return l3d_error(L3D_ERR_LAYOUT, "sequence parallelism over %d ranks needs batch x "
                         "sequence length (%d x %d) to divide by %d", sh->sp_size, B, T,
                         sh->sp_size);
    return L3D_OK;
}

/* The parts with buffers of their own (the MoE layers, QK-norm, the fp32 TP sums), their bytes
 * added to the activations'. */
static l3d_status init_parts(struct l3d_gpt *m) {
    const struct l3d_model_spec *c = &m->cfg;
    const struct l3d_shard *sh = &m->shard;
    int B = m->Bmax, T = m->Tmax;
    l3d_status st = l3d_moe_init(m);
    if (st != L3D_OK) return st;
    m->act_bytes += l3d_moe_act_bytes(c, sh, B, T, m->act_slots, m->recompute, m->dt);
    st = l3d_qknorm_init(m);
    if (st != L3D_OK) return st;
    m->act_bytes += l3d_qknorm_act_bytes(c, sh, B, T, m->act_slots, m->recompute, m->dt);
    st = l3d_tpsum_init(m);
    if (st != L3D_OK) return st;
    m->act_bytes += l3d_tpsum_act_bytes(c, sh, B, T, m->dt);
    return L3D_OK;
}

l3d_status l3d_gpt_init_dt(struct l3d_gpt **out, const struct l3d_model_spec *cfg,
                           const struct l3d_shard *sh, struct l3d_backend *be, int B, int T,
                           enum l3d_grad_mode grads, int act_slots, enum l3d_recompute recompute,
                           enum l3d_dtype dt) {
    *out = NULL;
    L3D_ASSERT(act_slots >= 1);
    L3D_ASSERT(dt == L3D_F32 || dt == L3D_BF16 || dt == L3D_F16);
    l3d_status st = check_init(cfg, sh, B, T);
    if (st != L3D_OK) return st;
    struct l3d_gpt *m = l3d_calloc(sizeof *m, "model");
    m->cfg = *cfg;
    m->shard = *sh;
    m->be = be;
    m->Bmax = B;
    m->Tmax = T;
    m->act_slots = act_slots;
    m->recompute = recompute;
    const char *attn = getenv("L3D_ATTENTION");
    if (attn && *attn && strcmp(attn, "flash") != 0 && strcmp(attn, "naive") != 0) {
        l3d_free(m);
        return l3d_error(L3D_ERR_ARG, "L3D_ATTENTION='%s': choose flash (the tiled kernel, the "
                         "default) or naive (the materialising oracle, for benchmarks)", attn);
    }
    m->attn_naive = attn && strcmp(attn, "naive") == 0;
    if (m->attn_naive && dt != L3D_F32) {
        l3d_free(m);
        return l3d_error(L3D_ERR_ARG, "L3D_ATTENTION=naive: the materialising attention kernel "
                         "is an fp32 oracle; use --precision fp32 with it, or unset L3D_ATTENTION");
    }
    m->dt = dt;
    m->es = l3d_dtype_size(dt);
    plan_params(m);
    for (int i = 0; i < L3D_NUM_TENSORS; i++) {
        m->tensors[i].dtype = dt;
        m->tensors[i].bytes = (size_t)m->tensors[i].count * m->es;
    }
    m->acts = l3d_calloc(sizeof *m->acts, "activation table");
    m->acts->layer = l3d_calloc(sizeof(struct layer_acts) * (size_t)(sh->layer_count + 1),
                                "activation table");
    m->xent_rows = l3d_gpt_xent_rows(sh, (int64_t)B * T);
    m->act_bytes = (size_t)point_acts(m, NULL, 0);
    const size_t gs = sizeof(float); /* gradients: fp32 */
    size_t pbytes = (size_t)m->num_params * m->es, gflat = (size_t)m->num_params * gs;
    size_t nlbytes = (size_t)m->nonlayer_size * gs, slbytes = (size_t)m->slot_size * gs;
    bool slots = grads == L3D_GRADS_SLOTS || grads == L3D_GRADS_SHARDED;
    size_t gbytes = grads == L3D_GRADS_FLAT ? gflat : slots ? nlbytes + 2 * slbytes : 0;
    if (grads == L3D_GRADS_SHARDED) pbytes = 0; /* the data-parallel state holds this rank's part */
    m->params = pbytes ? l3d_be_alloc(be, pbytes, "parameters") : NULL;
    bool grads_ok = true;
    if (grads == L3D_GRADS_FLAT) {
        grads_ok = (m->grads = l3d_be_alloc(be, gflat, "gradients")) != NULL;
    } else if (slots) {
        m->grads_nonlayer = l3d_be_alloc(be, nlbytes + 64, "gradients");
        for (int i = 0; i < 2; i++)
            m->grad_slot[i] = l3d_be_alloc(be, slbytes + 64, "gradient slots");
        grads_ok = m->grads_nonlayer && m->grad_slot[0] && m->grad_slot[1];
    }
    m->acts->base = l3d_be_alloc(be, m->act_bytes, "activations");
    m->loss_sum = l3d_be_alloc(be, sizeof(double), "loss");
    bool params_ok = m->params || !pbytes;
    bool rope_ok = cfg->pos != L3D_POS_ROPE || rope_init(m);
    if (!params_ok || !grads_ok || !m->acts->base || !m->loss_sum || !rope_ok) {
        size_t need = pbytes + gbytes + m->act_bytes;
        bool weights = !params_ok || !grads_ok; /* the model itself does not fit, whatever B, T */
        int64_t n = m->num_params;
        l3d_gpt_free(m);
        if (weights)
            return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB for the parameters and "
                             "gradients (%lld parameters on this rank): the model does not fit; "
                             "split it over more ranks (--tp, --pp, --zero 2) or choose a smaller "
                             "model", (pbytes + gbytes) / 1073741824.0, (long long)n);
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB for parameters, gradients and "
                         "activations (B=%d, T=%d): lower --batch or --seq-len", need / 1073741824.0,
                         B, T);
    }
    /* first touch now, not inside the step loop */
    if (m->params) l3d_be_memset(be, m->params, 0, pbytes);
    if (m->grads) l3d_be_memset(be, m->grads, 0, gflat);
    if (m->grads_nonlayer) {
        l3d_be_memset(be, m->grads_nonlayer, 0, nlbytes);
        for (int i = 0; i < 2; i++) l3d_be_memset(be, m->grad_slot[i], 0, slbytes);
    }
    l3d_be_memset(be, m->acts->base, 0, m->act_bytes);
    l3d_be_memset(be, m->loss_sum, 0, sizeof(double));
    point_acts(m, m->acts->base, 0);
    st = init_parts(m);
    if (st != L3D_OK) {
        l3d_gpt_free(m);
        return st;
    }
    *out = m;
    return L3D_OK;
}

void l3d_gpt_free(struct l3d_gpt *m) {
    if (!m) return;
    struct l3d_backend *be = m->be;
    l3d_moe_free(m);
    l3d_qknorm_free(m);
    l3d_tpsum_free(m);
    l3d_be_free(be, m->wstash);
    l3d_be_free(be, m->wnorm);
    if (m->acts) {
        l3d_be_free(be, m->acts->base);
        l3d_free(m->acts->layer);
        l3d_free(m->acts);
    }
    l3d_be_free(be, m->params);
    l3d_be_free(be, m->grads);
    l3d_be_free(be, m->grads_nonlayer);
    l3d_be_free(be, m->grad_slot[0]);
    l3d_be_free(be, m->grad_slot[1]);
    l3d_be_free(be, m->loss_sum);
    l3d_be_free(be, m->rope_inv_freq);
    l3d_be_free(be, m->rope_pos);
    l3d_free(m);
}

/* ---- initialisation --------------------------------------------------------------------- */

/* Full q|k|v row of local row r of a shard's qkvw: the q block, then the local heads; the k
 * block, then the local key/value heads; the v block likewise. */
static int64_t qkv_row(const struct l3d_model_spec *cfg, const struct l3d_shard *s, int64_t r) {
    int64_t HS = l3d_model_head_dim(cfg), Q = cfg->NH * HS, Ca = (int64_t)s->head_count * HS;
    int64_t KV = (int64_t)l3d_model_kv_heads(cfg) * HS, Ka = l3d_shard_kv_count(cfg, s) * HS;
    int64_t k0 = l3d_shard_kv_start(cfg, s) * HS;
    if (r < Ca) return (int64_t)s->head_start * HS + r;
    if (r < Ca + Ka) return Q + k0 + (r - Ca);
    return Q + KV + k0 + (r - Ca - Ka);
}

/* Full MLP row of local row r of a shard's fcw: its columns of the gate block, then (SwiGLU) the
 * same columns of the up block. */
static int64_t ffn_row(const struct l3d_model_spec *cfg, const struct l3d_shard *s, int64_t r) {
    if (r < s->ffn_count) return s->ffn_start + r;
    return cfg->ffn + s->ffn_start + (r - s->ffn_count);
}

/* Global (row, col) in the full llm.c tensor of a local (row, col) of a shard's tensor t. */
static void global_rc(const struct l3d_model_spec *cfg, const struct l3d_shard *s, int t, int64_t r,
                      int64_t c, int64_t *gr, int64_t *gc) {
    int64_t HS = l3d_model_head_dim(cfg), h0 = (int64_t)s->head_start * HS;
    int64_t efm = (cfg->mlp == L3D_MLP_SWIGLU ? 2 : 1) * cfg->moe.ffn; /* an expert's fcw rows */
    *gr = r;
    *gc = c;
    switch (t) {
    case L3D_T_WTE: case L3D_T_LMHEAD: *gr = s->vocab_start + r; break;
    case L3D_T_QKVW: *gr = qkv_row(cfg, s, r); break;
    case L3D_T_QKVB: *gc = qkv_row(cfg, s, c); break;
    case L3D_T_ATTPROJW: *gc = h0 + c; break;
    case L3D_T_FCW: *gr = ffn_row(cfg, s, r); break;
    case L3D_T_FCB: *gc = ffn_row(cfg, s, c); break;
    case L3D_T_FCPROJW: *gc = s->ffn_start + c; break;
    case L3D_T_EXPFCW: *gr = s->expert_start * efm + r; break; /* the shard's experts' rows */
    case L3D_T_EXPFCB: *gc = s->expert_start * efm + c; break;
    case L3D_T_EXPPROJW: *gr = (int64_t)s->expert_start * cfg->C + r; break;
    case L3D_T_EXPPROJB: *gc = (int64_t)s->expert_start * cfg->C + c; break;
    default: break;
    }
}

void l3d_gpt_global_rc(const struct l3d_model_spec *cfg, const struct l3d_shard *s, int t,
                       int64_t r, int64_t c, int64_t *gr, int64_t *gc) {
    global_rc(cfg, s, t, r, c, gr, gc);
}

/* Copies between a shard's flat layout and the full model's: to_full, or back. */
static void shard_copy(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, float *shard,
                       float *full, bool to_full) {
    struct l3d_tensor_info ts[L3D_NUM_TENSORS], tf[L3D_NUM_TENSORS];
    struct l3d_shard fs = l3d_shard_full(cfg);
    l3d_gpt_plan_tensors(cfg, sh, ts);
    l3d_gpt_plan_tensors(cfg, &fs, tf);
    for (int t = 0; t < L3D_NUM_TENSORS; t++) {
        const struct l3d_tensor_info *a = &ts[t], *b = &tf[t];
        int64_t l0 = l3d_gpt_tensor_first(cfg, sh, t);
        for (int64_t l = 0; l < a->layers; l++)
            for (int64_t r = 0; r < a->rows; r++)
                for (int64_t c = 0; c < a->cols; c++) {
                    int64_t gr, gc;
                    global_rc(cfg, sh, t, r, c, &gr, &gc);
                    float *f = &full[b->offset + ((l0 + l) * b->rows + gr) * b->cols + gc];
                    float *p = &shard[a->offset + (l * a->rows + r) * a->cols + c];
                    if (to_full)
                        *f = *p;
                    else
                        *p = *f;
                }
    }
}

void l3d_gpt_shard_to_full(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                           const float *src, float *full) {
    shard_copy(cfg, sh, (float *)src, full, true); /* src is only read */
}

void l3d_gpt_full_to_shard(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                           const float *full, float *dst) {
    shard_copy(cfg, sh, dst, (float *)full, false); /* full is only read */
}

bool l3d_gpt_shard_rows(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                        int64_t layer, int64_t R0, int64_t R1, int64_t *off, int64_t *r0,
                        int64_t *r1) {
    struct l3d_tensor_info ti[L3D_NUM_TENSORS];
    l3d_gpt_plan_tensors(cfg, sh, ti);
    const struct l3d_tensor_info *a = &ti[t];
    int64_t l = l3d_gpt_is_layer_tensor(t) ? layer - l3d_gpt_tensor_first(cfg, sh, t) : 0;
    if (a->count == 0 || l < 0 || l >= a->layers) return false;
    /* the local rows whose full rows lie in [R0, R1): an interval, as global_rc's row map is
     * increasing (heads, KV heads, MLP columns and vocabulary rows keep their order) */
    *r0 = a->rows;
    *r1 = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        int64_t gr, gc;
        global_rc(cfg, sh, t, r, 0, &gr, &gc);
        if (gr < R0 || gr >= R1) continue;
        if (r < *r0) *r0 = r;
        *r1 = r + 1;
    }
    *off = a->offset + (l * a->rows + *r0) * a->cols;
    return *r0 < *r1;
}

void l3d_gpt_shard_place(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                         int64_t r0, int64_t r1, const float *src, int64_t R0, float *dst) {
    struct l3d_tensor_info ts[L3D_NUM_TENSORS], tf[L3D_NUM_TENSORS];
    struct l3d_shard fs = l3d_shard_full(cfg);
    l3d_gpt_plan_tensors(cfg, sh, ts);
    l3d_gpt_plan_tensors(cfg, &fs, tf);
    int64_t cols = ts[t].cols, fcols = tf[t].cols;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = 0; c < cols; c++) {
            int64_t gr, gc;
            global_rc(cfg, sh, t, r, c, &gr, &gc);
            dst[(gr - R0) * fcols + gc] = src[(r - r0) * cols + c];
        }
}

/* The elements of tensor t that fall in [lo, lo + n) of the flat space: [*e0, *e1) of its own
 * elements (empty when *e0 >= *e1). */
static void init_span(const struct l3d_tensor_info *ti, int64_t lo, int64_t n, int64_t *e0,
                      int64_t *e1) {
    *e0 = lo > ti->offset ? lo - ti->offset : 0;
    *e1 = lo + n - ti->offset < ti->count ? lo + n - ti->offset : ti->count;
}

void l3d_gpt_init_weights_range(const struct l3d_gpt *m, uint64_t seed, int64_t lo, int64_t n,
                                float *dst) {
    const struct l3d_model_spec *cfg = &m->cfg;
    int64_t C = cfg->C, HS = l3d_model_head_dim(cfg), F = cfg->ffn, Q = cfg->NH * HS;
    int64_t QKV = Q + 2 * (int64_t)l3d_model_kv_heads(cfg) * HS;
    int64_t Fm = cfg->mlp == L3D_MLP_SWIGLU ? 2 * F : F;
    int64_t E = cfg->moe.experts, Fe = cfg->moe.ffn, Fem = Fm / F * Fe, S = cfg->moe.shared;
    /* full (rows, cols) of each normal-initialised matrix, to index its elements globally (a
     * tensor the architecture lacks has no elements: nothing to draw) */
    struct { int t; int64_t rows, cols; float std; } mats[] = {
        {L3D_T_WTE, cfg->Vp, C, 0.02f},
        {L3D_T_WPE, cfg->maxT, C, 0.02f},
        {L3D_T_QKVW, QKV, C, 0.02f},
        {L3D_T_ATTPROJW, C, Q, 0.02f / sqrtf(2.0f * (float)cfg->L)},
        {L3D_T_FCW, Fm, C, 0.02f},
        {L3D_T_FCPROJW, C, F, 0.02f / sqrtf(2.0f * (float)cfg->L)},
        {L3D_T_LMHEAD, cfg->Vp, C, 0.02f},
        {L3D_T_ROUTER, E, C, 0.02f},
        {L3D_T_EXPFCW, E * Fem, C, 0.02f},
        {L3D_T_EXPPROJW, E * C, Fe, 0.02f / sqrtf(2.0f * (float)cfg->L)},
        {L3D_T_SHFCW, S * Fem, C, 0.02f},
        {L3D_T_SHPROJW, C, S * Fe, 0.02f / sqrtf(2.0f * (float)cfg->L)},
    };
    /* computed on the host in blocks of at most INIT_BLOCK elements (a small staging buffer:
     * a mixed-precision run initialises after its optimizer state is allocated, at its memory
     * peak) and copied to the device */
    enum { INIT_BLOCK = L3D_GPT_INIT_BLOCK_BYTES / sizeof(float) };
    float *host = l3d_alloc(L3D_GPT_INIT_BLOCK_BYTES, "initial weights");
    l3d_be_memset(m->be, dst, 0, (size_t)n * sizeof(float));
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        const struct l3d_tensor_info *ti = &m->tensors[mats[i].t];
        const int64_t per_layer = ti->rows * ti->cols;
        /* the full tensor's index of the shard's first layer of it (MoE tensors: among the MoE
         * layers, which start at moe.dense_layers) */
        int64_t first = m->shard.layer_start, nd = cfg->moe.dense_layers;
        if (mats[i].t >= L3D_T_ROUTER) first = (first > nd ? first : nd) - nd;
        int64_t e0, e1;
        init_span(ti, lo, n, &e0, &e1);
        for (int64_t b0 = e0; b0 < e1; b0 += INIT_BLOCK) {
            int64_t nb = e1 - b0 < INIT_BLOCK ? e1 - b0 : INIT_BLOCK;
#pragma omp parallel for schedule(static)
            for (int64_t k = 0; k < nb; k++) {
                int64_t e = b0 + k, l = e / per_layer, r = e % per_layer / ti->cols;
                int64_t c = e % ti->cols;
                int64_t gl = l3d_gpt_is_layer_tensor(mats[i].t) ? first + l : 0;
                int64_t gr, gc;
                global_rc(&m->cfg, &m->shard, mats[i].t, r, c, &gr, &gc);
                if ((mats[i].t == L3D_T_WTE || mats[i].t == L3D_T_LMHEAD) && gr >= cfg->V) {
                    host[k] = 0.0f; /* padding rows */
                    continue;
                }
                uint64_t idx = (uint64_t)((gl * mats[i].rows + gr) * mats[i].cols + gc);
                host[k] = mats[i].std * l3d_rng_normal(seed, (uint64_t)mats[i].t, idx);
            }
            l3d_be_copy_h2d(m->be, dst + (ti->offset + b0 - lo), host, (size_t)nb * sizeof(float));
        }
    }
    for (int64_t k = 0; k < INIT_BLOCK; k++) host[k] = 1.0f;
    const int ones[] = {L3D_T_LN1W, L3D_T_LN2W, L3D_T_LNFW, L3D_T_QNORMW, L3D_T_KNORMW};
    for (size_t i = 0; i < sizeof ones / sizeof ones[0]; i++) {
        const struct l3d_tensor_info *ti = &m->tensors[ones[i]];
        int64_t e0, e1;
        init_span(ti, lo, n, &e0, &e1);
        for (int64_t b0 = e0; b0 < e1; b0 += INIT_BLOCK)
            l3d_be_copy_h2d(m->be, dst + (ti->offset + b0 - lo), host,
                            (size_t)(e1 - b0 < INIT_BLOCK ? e1 - b0 : INIT_BLOCK) * sizeof(float));
    }
    l3d_be_sync(m->be); /* before the staging buffer is refilled or freed */
    l3d_free(host);
}

void l3d_gpt_init_weights(struct l3d_gpt *m, uint64_t seed) {
    L3D_ASSERT(m->dt == L3D_F32); /* 16-bit models are initialised through an fp32 view */
    l3d_gpt_init_weights_range(m, seed, 0, m->num_params, m->params);
}

void l3d_gpt_zero_grad(struct l3d_gpt *m) {
    if (m->grads)
        l3d_be_memset(m->be, m->grads, 0, (size_t)m->num_params * sizeof(float));
    else if (m->grads_nonlayer) /* slots are zeroed layer by layer in backward */
        l3d_be_memset(m->be, m->grads_nonlayer, 0, (size_t)m->nonlayer_size * sizeof(float));
}

/* ---- forward ---------------------------------------------------------------------------- */

/* Pointers to one layer's gradients (fp32) in the flat buffer or the layer's slot. */
struct layer_grads {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb;
};

/* Pointers to one layer's parameters (type m->dt) in m->params. */
struct layer_params {
    void *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb;
};

/* A tensor the architecture lacks (a bias, GPT-2's wpe under RoPE): NULL, which the kernels read
 * as "none". */
static bool has_part(const struct l3d_gpt *m, int t, int layer) {
    return l3d_gpt_tensor_used(&m->cfg, t) &&
           (!l3d_gpt_is_layer_tensor(t) || l3d_gpt_tensor_layer(&m->cfg, &m->shard, t, layer) >= 0);
}

/* (a MoE layer has no dense MLP: its fcw ... are NULL too) */
static float *grad_or_null(const struct l3d_gpt *m, int t, int layer) {
    return has_part(m, t, layer) ? l3d_gpt_grad_ptr(m, t, layer) : NULL;
}

static void *param_or_null(const struct l3d_gpt *m, int t, int layer) {
    return has_part(m, t, layer) ? l3d_gpt_param_ptr(m, t, layer) : NULL;
}

/* The output head: the tied token embedding, or Llama's lm_head. */
static int head_tensor(const struct l3d_gpt *m) {
    return m->cfg.untied ? L3D_T_LMHEAD : L3D_T_WTE;
}

static struct layer_grads layer_grads(const struct l3d_gpt *m, int l) {
#define LG(id) grad_or_null(m, id, l)
    return (struct layer_grads){
        .ln1w = LG(L3D_T_LN1W), .ln1b = LG(L3D_T_LN1B), .qkvw = LG(L3D_T_QKVW),
        .qkvb = LG(L3D_T_QKVB), .attprojw = LG(L3D_T_ATTPROJW), .attprojb = LG(L3D_T_ATTPROJB),
        .ln2w = LG(L3D_T_LN2W), .ln2b = LG(L3D_T_LN2B), .fcw = LG(L3D_T_FCW),
        .fcb = LG(L3D_T_FCB), .fcprojw = LG(L3D_T_FCPROJW), .fcprojb = LG(L3D_T_FCPROJB),
    };
#undef LG
}

static struct layer_params layer_params(const struct l3d_gpt *m, int l) {
#define LP(id) param_or_null(m, id, l)
    return (struct layer_params){
        .ln1w = LP(L3D_T_LN1W), .ln1b = LP(L3D_T_LN1B), .qkvw = LP(L3D_T_QKVW),
        .qkvb = LP(L3D_T_QKVB), .attprojw = LP(L3D_T_ATTPROJW), .attprojb = LP(L3D_T_ATTPROJB),
        .ln2w = LP(L3D_T_LN2W), .ln2b = LP(L3D_T_LN2B), .fcw = LP(L3D_T_FCW),
        .fcb = LP(L3D_T_FCB), .fcprojw = LP(L3D_T_FCPROJW), .fcprojb = LP(L3D_T_FCPROJB),
    };
#undef LP
}

/* In-place sum over the TP group of n elements of type dt. */
static void tp_all_reduce(struct l3d_gpt *m, void *buf, int64_t n, enum l3d_dtype dt) {
    if (m->hooks.tp_all_reduce) m->hooks.tp_all_reduce(m->hooks.ctx, buf, n, dt);
}

/* The backward kernels: activations of the model's type, parameter gradients fp32 (main_grad). */
/* Lets the communication in flight progress between two kernels of backward (hooks.progress). */
static void progress(struct l3d_gpt *m) {
    if (m->hooks.progress) m->hooks.progress(m->hooks.grads_ctx);
}

/* With a progress hook the two products (input gradient, then weight gradient; independent, so
 * the same results) run as two calls with a progress call after each; in fp32 only: a 16-bit
 * product the CPU backend computes through fp32 operand copies stages both products' copies
 * at once, the peak the memory plan accounts (tests/cli/mixed.sh), which two calls would lower. */
static void matmul_backward(struct l3d_gpt *m, void *dinp, float *dweight, float *dbias,
                            const void *dout, const void *inp, const void *weight, int64_t N,
                            int64_t C, int64_t OC) {
    if (!dinp && !dweight && !dbias) return; /* B of a split backward: no weight gradient */
    if (m->hooks.progress && dinp && dweight && m->dt == L3D_F32) {
        l3d_be_matmul_backward_mixed(m->be, m->dt, L3D_F32, dinp, NULL, NULL, dout, inp, weight,
                                     N, C, OC);
        progress(m);
        dinp = NULL;
    }
    l3d_be_matmul_backward_mixed(m->be, m->dt, L3D_F32, dinp, dweight, dbias, dout, inp, weight,
                                 N, C, OC);
    progress(m);
}

/* The model's normalisation: LayerNorm (weight, bias; mean and rstd saved) or RMSNorm (weight;
 * rstd saved). */
static void norm_forward(struct l3d_gpt *m, void *out, float *mean, float *rstd, const void *inp,
                         const void *weight, const void *bias, int64_t N) {
    if (m->cfg.norm == L3D_NORM_RMSNORM)
        l3d_be_rmsnorm_forward(m->be, m->dt, out, rstd, inp, weight, N, m->cfg.C,
                               m->cfg.norm_eps);
    else
        l3d_be_layernorm_forward(m->be, m->dt, out, mean, rstd, inp, weight, bias, N, m->cfg.C);
}

/* The norm that follows a residual add, fused into it (residual_norm): where it writes (out,
 * mean, rstd) and its parameters (w, b). */
struct norm_after {
    void *out;
    float *mean, *rstd;
    const void *w, *b;
};

/* res_out (rows,C) = res_in + add, then, with nx, the norm of res_out into nx->out in the same
 * pass (l3d_be_residual_layernorm_forward / _rmsnorm_forward: the bits of the pair). The norm's
 * backward needs nothing fused: it accumulates its input gradient into dres, the residual's. */
static void residual_norm(struct l3d_gpt *m, void *res_out, const void *res_in, const void *add,
                          int64_t rows, const struct norm_after *nx) {
    int64_t C = m->cfg.C;
    if (!nx)
        l3d_be_residual_forward(m->be, m->dt, res_out, res_in, add, rows * C);
    else if (m->cfg.norm == L3D_NORM_RMSNORM)
        l3d_be_residual_rmsnorm_forward(m->be, m->dt, res_out, nx->out, nx->rstd, res_in, add,
                                        nx->w, rows, C, m->cfg.norm_eps);
    else
        l3d_be_residual_layernorm_forward(m->be, m->dt, res_out, nx->out, nx->mean, nx->rstd,
                                          res_in, add, nx->w, nx->b, rows, C);
}

static void layernorm_backward(struct l3d_gpt *m, void *dinp, float *dweight, float *dbias,
                               const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int64_t N, int64_t C) {
    if (m->cfg.norm == L3D_NORM_RMSNORM)
        l3d_be_rmsnorm_backward(m->be, m->dt, L3D_F32, dinp, dweight, dout, inp, weight, rstd, N,
                                C);
    else
        l3d_be_layernorm_backward_mixed(m->be, m->dt, L3D_F32, dinp, dweight, dbias, dout, inp,
                                        weight, mean, rstd, N, C);
}

/* Backward of a column-parallel product (Megatron's conjugate of the identity): the input gradient
 * dinp (N,C) is summed over the TP group, and that sum runs while the weight-gradient product
 * computes; with sequence parallelism it is reduce-scattered into acts->dln_local instead (the
 * conjugate of the forward all-gather). dinp is zeroed here. */
static void column_parallel_backward(struct l3d_gpt *m, void *dinp, float *dweight, float *dbias,
                                     const void *dout, const void *inp, const void *weight,
                                     int64_t N, int64_t C, int64_t OC) {
    int64_t sp = m->shard.sp_size;
    if (l3d_tpsum_on(m)) { /* the gradient made, summed, rounded in fp32 (src/model/tpsum.c) */
        void *to = sp > 1 ? m->acts->dln_local : dinp;
        l3d_tpsum_zero(m, N);
        l3d_tpsum_dinp(m, 0, N, dout, weight, C, OC, true);
        bool begun = l3d_tpsum_reduce_begin(m, N); /* behind the weight gradient's product */
        if (!begun) l3d_tpsum_reduce(m, to, N);
        matmul_backward(m, NULL, dweight, dbias, dout, inp, weight, N, C, OC);
        if (begun) l3d_tpsum_reduce_end(m, to, N);
        return;
    }
    l3d_be_memset(m->be, dinp, 0, (size_t)(N * C) * m->es);
    if (sp > 1) { /* sequence parallel: the sum is reduce-scattered to this rank's rows */
        matmul_backward(m, dinp, NULL, NULL, dout, inp, weight, N, C, OC);
        m->hooks.tp_reduce_scatter(m->hooks.ctx, dinp, m->acts->dln_local, N / sp * C, m->dt);
        matmul_backward(m, NULL, dweight, dbias, dout, inp, weight, N, C, OC);
        return;
    }
    if (!m->hooks.tp_all_reduce_begin) {
        matmul_backward(m, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
        tp_all_reduce(m, dinp, N * C, m->dt);
        return;
    }
    matmul_backward(m, dinp, NULL, NULL, dout, inp, weight, N, C, OC);
    m->hooks.tp_all_reduce_begin(m->hooks.ctx, dinp, N * C, m->dt);
    matmul_backward(m, NULL, dweight, dbias, dout, inp, weight, N, C, OC);
    m->hooks.tp_all_reduce_end(m->hooks.ctx);
}

static int64_t local_valid_vocab(const struct l3d_gpt *m) {
    int64_t v = m->cfg.V - m->shard.vocab_start;
    return v < 0 ? 0 : (v > m->shard.vocab_count ? m->shard.vocab_count : v);
}

/* Row-parallel matrix product followed by the residual add:
 * res_out = res_in + all_reduce(inp @ w^T) + b, the bias added once across the TP group; with nx
 * the norm after it too, on the same (this rank's) rows (residual_norm). */
static void row_parallel_residual(struct l3d_gpt *m, void *res_out, const void *res_in,
                                  const void *inp, const void *w, const void *b, int64_t N,
                                  int64_t Cin, const struct norm_after *nx) {
    int64_t C = m->cfg.C, sp = m->shard.sp_size;
    void *out = m->acts->scratch;
    const enum l3d_dtype dt = m->dt;
    if (l3d_tpsum_on(m)) { /* the output made, summed, rounded in fp32 (src/model/tpsum.c) */
        out = sp > 1 ? m->acts->scratch_local : out;
        l3d_tpsum_row_forward(m, out, inp, w, b, N, Cin);
        residual_norm(m, res_out, res_in, out, N / sp, nx);
        return;
    }
    if (sp > 1) { /* sequence parallel: reduce-scatter instead of all-reduce */
        int64_t Nl = N / sp, r0 = m->shard.sp_rank * Nl;
        l3d_be_matmul_forward(m->be, dt, out, inp, w, NULL, N, Cin, C);
        /* the bias once: on the rows this rank keeps */
        if (b) l3d_be_add_bias(m->be, dt, el(out, r0 * C, m->es), b, Nl, C);
        m->hooks.tp_reduce_scatter(m->hooks.ctx, out, m->acts->scratch_local, Nl * C, dt);
        residual_norm(m, res_out, res_in, m->acts->scratch_local, Nl, nx);
        return;
    }
    if (m->hooks.tp_all_reduce) {
        l3d_be_matmul_forward(m->be, dt, out, inp, w, m->shard.adds_row_bias ? b : NULL, N, Cin,
                              C);
        tp_all_reduce(m, out, N * C, dt);
    } else {
        l3d_be_matmul_forward(m->be, dt, out, inp, w, b, N, Cin, C);
    }
    residual_norm(m, res_out, res_in, out, N, nx);
}

int64_t l3d_cp_chunk_start(int cp, int cp_rank, int k, int64_t T) {
    /* test hook: the two chunks' positions swapped (tests/cli/cp.sh: the result must change) */
    static int swap = -1;
    if (swap < 0) swap = getenv("L3D_TEST_CP_SWAP_CHUNKS") != NULL;
    if (swap) k = 1 - k;
    return (k == 0 ? cp_rank : 2 * cp - 1 - cp_rank) * (T / 2);
}

/* RoPE's positions of this rank's T rows under context parallelism: its two chunks' (as encode
 * gives learned positions); without it they stay 0..Tmax-1 (rope_init). Written when T changes
 * only (the first forward): they depend on T, the CP size and rank, fixed for the model. */
static void rope_cp_positions(struct l3d_gpt *m, int T) {
    if (m->rope_cp_T == T) return;
    m->rope_cp_T = T;
    int32_t *p = l3d_alloc((size_t)T * sizeof(int32_t), "rope positions");
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < T / 2; i++)
            p[k * (T / 2) + i] =
                (int32_t)(l3d_cp_chunk_start(m->hooks.cp_size, m->hooks.cp_rank, k, T) + i);
    l3d_be_copy_h2d(m->be, m->rope_pos, p, (size_t)T * sizeof(int32_t));
    l3d_be_sync(m->be); /* before the host copy goes */
    l3d_free(p);
}

/* Attention of one layer: the backend's kernel, or the ring's (context parallelism). */
static void attention_forward(struct l3d_gpt *m, struct layer_acts *la, int B, int T,
                              const struct widths *w) {
    int64_t Hl = w->Hl, KVl = w->KVl, HS = w->HS;
    if (m->hooks.cp_attention_forward)
        m->hooks.cp_attention_forward(m->hooks.cp_ctx, m->dt, la->atty, la->att, la->qkv, B, T,
                                      Hl, KVl, HS);
    else if (m->attn_naive)
        l3d_be_attention_naive_forward(m->be, m->dt, la->atty, la->att, la->qkv, B, T, Hl, KVl,
                                       HS);
    else
        l3d_be_attention_forward(m->be, m->dt, la->atty, la->att, la->qkv, B, T, Hl, KVl, HS);
}

/* attention_forward's backward: dqkv += from datty (acts). */
static void attention_backward(struct l3d_gpt *m, struct layer_acts *la, int B, int T,
                               const struct widths *w) {
    struct l3d_gpt_acts *a = m->acts;
    int64_t Hl = w->Hl, KVl = w->KVl, HS = w->HS;
    if (m->hooks.cp_attention_backward)
        m->hooks.cp_attention_backward(m->hooks.cp_ctx, m->dt, a->dqkv, a->datty, la->qkv,
                                       la->atty, la->att, B, T, Hl, KVl, HS);
    else if (m->attn_naive)
        l3d_be_attention_naive_backward(m->be, m->dt, a->dqkv, a->datt, a->datty, la->qkv,
                                        la->att, B, T, Hl, KVl, HS);
    else
        l3d_be_attention_backward(m->be, m->dt, a->dqkv, a->datty, la->qkv, la->atty, la->att, B,
                                  T, Hl, KVl, HS);
}

/* The embedding lookup (encoder_forward's arguments) with the positions of this rank's rows:
 * 0..T-1, or under context parallelism those of its two chunks, each (sequence, chunk) a call. */
static void encode(struct l3d_gpt *m, void *out, const void *wte, const void *wpe, int64_t v0,
                   int64_t vn, int B, int T) {
    int64_t C = m->cfg.C;
    if (m->hooks.cp_size <= 1 || !wpe) {
        l3d_be_encoder_forward(m->be, m->dt, out, m->inputs, wte, wpe, v0, vn, B, T, C);
        return;
    }
    for (int64_t b = 0; b < B; b++)
        for (int k = 0; k < 2; k++) {
            int64_t r0 = b * T + k * (T / 2);
            int64_t pos = l3d_cp_chunk_start(m->hooks.cp_size, m->hooks.cp_rank, k, T);
            l3d_be_encoder_forward(m->be, m->dt, el(out, r0 * C, m->es), m->inputs + r0, wte,
                                   el(wpe, pos * C, m->es), v0, vn, 1, T / 2, C);
        }
}

/* encode's backward: dwte and dwpe (fp32) +=. */
static void encode_backward(struct l3d_gpt *m, float *dwte, float *dwpe, const void *dout, int B,
                            int T) {
    const struct l3d_shard *s = &m->shard;
    int64_t C = m->cfg.C, v0 = s->vocab_start, vn = s->vocab_count;
    if (m->hooks.cp_size <= 1) {
        l3d_be_encoder_backward_mixed(m->be, m->dt, L3D_F32, dwte, dwpe, dout, m->inputs, v0, vn,
                                      B, T, C);
        return;
    }
    l3d_be_encoder_backward_mixed(m->be, m->dt, L3D_F32, dwte, NULL, dout, m->inputs, v0, vn, B,
                                  T, C);
    for (int64_t b = 0; b < B; b++)
        for (int k = 0; k < 2 && dwpe; k++) {
            int64_t r0 = b * T + k * (T / 2);
            int64_t pos = l3d_cp_chunk_start(m->hooks.cp_size, m->hooks.cp_rank, k, T);
            l3d_be_encoder_backward_mixed(m->be, m->dt, L3D_F32, NULL, dwpe + pos * C,
                                          el(dout, r0 * C, m->es), m->inputs + r0, v0, 0, 1,
                                          T / 2, C);
        }
}

/* Where the norm after local layer l's output goes when it is fused into the layer's last
 * residual add: the next layer's first norm, or after the stage's last layer the final norm
 * (the head's). Only in the forward pass proper (count) and with the parameters resident: under
 * ZeRO-3 the next layer's weights are not gathered yet, and a recomputation rebuilds one layer
 * from its input, its own first norm included. false: the next layer norms its input itself. */
static bool next_norm(struct l3d_gpt *m, int l, bool count, struct norm_after *nx) {
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    if (!count || !m->params) return false;
    if (l + 1 < s->layer_count) {
        struct layer_acts *nl = &a->layer[l + 1];
        struct layer_params p = layer_params(m, l + 1);
        *nx = (struct norm_after){s->sp_size > 1 ? a->ln_local : nl->ln1, nl->ln1_mean,
                                  nl->ln1_rstd, p.ln1w, p.ln1b};
        return true;
    }
    if (!s->has_head) return false; /* the next stage's rank norms it */
    *nx = (struct norm_after){a->lnf, a->lnf_mean, a->lnf_rstd,
                              l3d_gpt_param_ptr(m, L3D_T_LNFW, 0), param_or_null(m, L3D_T_LNFB, 0)};
    return true;
}

/* One transformer layer's forward from its input x into la (res3 is its output). normed: its
 * first norm was computed with the previous layer's last residual add (next_norm); returns
 * whether the norm after its own output was (the next layer's first, or the final norm). */
static bool forward_layer(struct l3d_gpt *m, int l, struct layer_acts *la, const void *x, int B,
                          int T, bool count, bool normed) {
    struct l3d_gpt_acts *a = m->acts;
    const struct l3d_shard *s = &m->shard;
    const enum l3d_dtype dt = m->dt;
    int64_t N = (int64_t)B * T, C = m->cfg.C, sp = s->sp_size, Nl = N / sp;
    struct widths w = widths(m);
    struct layer_params p = layer_params(m, l);
    void *lnout = sp > 1 ? a->ln_local : la->ln1;
    if (!normed) norm_forward(m, lnout, la->ln1_mean, la->ln1_rstd, x, p.ln1w, p.ln1b, Nl);
    if (sp > 1) m->hooks.tp_all_gather(m->hooks.ctx, lnout, la->ln1, Nl * C, dt);
    l3d_be_matmul_forward(m->be, dt, la->qkv, la->ln1, p.qkvw, p.qkvb, N, C, w.QKV);
    if (m->cfg.qk_norm) l3d_qknorm_forward(m, l, la->qkv, N); /* before RoPE, as Qwen3 */
    if (m->cfg.pos == L3D_POS_ROPE) /* q and k rotated in place: what attention and backward see */
        l3d_be_rope_forward(m->be, dt, la->qkv, m->rope_inv_freq, m->rope_pos, B, T, w.Hl, w.KVl,
                            w.HS);
    attention_forward(m, la, B, T, &w);
    lnout = sp > 1 ? a->ln_local : la->ln2; /* ln2 with the residual add before it */
    const struct norm_after n2 = {lnout, la->ln2_mean, la->ln2_rstd, p.ln2w, p.ln2b};
    row_parallel_residual(m, la->res2, x, la->atty, p.attprojw, p.attprojb, N, w.Ca, &n2);
    if (sp > 1) m->hooks.tp_all_gather(m->hooks.ctx, lnout, la->ln2, Nl * C, dt);
    struct norm_after nx;
    bool fuse = next_norm(m, l, count, &nx);
    if (l3d_model_moe_layer(&m->cfg, s->layer_start + l)) { /* the experts instead of the MLP */
        /* whole on every tp rank, over the group's same N tokens (under SP the gathered ones):
         * this rank's rows of the output go on its residual */
        l3d_moe_forward(m, l, a->scratch, la->ln2, N, count);
        residual_norm(m, la->res3, la->res2, el(a->scratch, s->sp_rank * Nl * C, m->es), Nl,
                      fuse ? &nx : NULL);
        return fuse;
    }
    l3d_be_matmul_forward(m->be, dt, la->fch, la->ln2, p.fcw, p.fcb, N, C, w.Fm);
    if (m->cfg.mlp == L3D_MLP_SWIGLU)
        l3d_be_swiglu_forward(m->be, dt, la->fch_gelu, la->fch, N, w.F);
    else
        l3d_be_gelu_forward(m->be, dt, la->fch_gelu, la->fch, N * w.F);
    row_parallel_residual(m, la->res3, la->res2, la->fch_gelu, p.fcprojw, p.fcprojb, N, w.F,
                          fuse ? &nx : NULL);
    return fuse;
}

void l3d_gpt_use_slot(struct l3d_gpt *m, int slot) {
    L3D_ASSERT(slot >= 0 && slot < m->act_slots);
    if (slot == m->slot) return;
    point_acts(m, m->acts->base, slot);
    m->slot = slot;
}

/* ZeRO-3 (L3D_GRADS_SHARDED): the parameters of local layer l (-1: the non-layer tensors) for a
 * pass, from the data-parallel state's hooks; nothing when the model holds its parameters. */
static void params_begin(struct l3d_gpt *m, int l, bool backward) {
    if (m->params) return;
    const void *p = m->hooks.params_get(m->hooks.params_ctx, l, backward);
    if (l < 0) {
        m->gathered_nonlayer = p;
    } else {
        m->gathered_layer = p;
        m->gathered_id = l;
    }
}

static void params_end(struct l3d_gpt *m, int l, bool backward) {
    if (m->params) return;
    m->hooks.params_done(m->hooks.params_ctx, l, backward);
    if (l < 0)
        m->gathered_nonlayer = NULL;
    else
        m->gathered_layer = NULL;
}

/* The cross-entropy statistics of rows [r0, r0 + n) from their logits in m->logits:
 * vocabulary-parallel (Megatron-LM), max, then sum-exp and target logit, fp32 whatever the
 * logits' type; the max over the tp group here, per chunk (the sum-exp is relative to it), the
 * sums after the last chunk (head_forward). */
static void xent_chunk_stats(struct l3d_gpt *m, int64_t r0, int64_t n) {
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    const enum l3d_dtype dt = m->dt;
    int64_t Vl = s->vocab_count, Vvalid = local_valid_vocab(m);
    if (m->hooks.tp_all_reduce_max) {
        l3d_be_xent_max(m->be, dt, a->maxv + r0, m->logits, n, Vl, Vvalid);
        m->hooks.tp_all_reduce_max(m->hooks.ctx, a->maxv + r0, n, L3D_F32);
        l3d_be_xent_sumexp(m->be, dt, a->sumexp + r0, a->tlogit + r0, m->logits, a->maxv + r0,
                           m->targets + r0, s->vocab_start, n, Vl, Vvalid);
    } else { /* the whole vocabulary here: one read of the logits (the same bits) */
        l3d_be_xent_stats(m->be, dt, a->maxv + r0, a->sumexp + r0, a->tlogit + r0, m->logits,
                          m->targets + r0, s->vocab_start, n, Vl, Vvalid);
    }
}

/* Whether the head runs in chunks (else one chunk of every row: the logits kept whole from
 * forward to backward). */
static bool xent_chunked(const struct l3d_gpt *m) {
    return m->xent_rows < (int64_t)m->Bmax * m->Tmax;
}

/* The head's logits of rows [r0, r0 + n) into m->logits (at its start when chunked). */
static void head_logits(struct l3d_gpt *m, int64_t r0, int64_t n) {
    const void *wte = l3d_gpt_param_ptr(m, head_tensor(m), 0);
    int64_t C = m->cfg.C, Vl = m->shard.vocab_count;
    l3d_be_matmul_forward(m->be, m->dt, el(m->logits, xent_chunked(m) ? 0 : r0 * Vl, m->es),
                          el(m->acts->lnf_full, r0 * C, m->es), wte, NULL, n, C, Vl);
}

/* The final norm (unless normed: done with the last residual add), the head and (with targets)
 * the mean loss, a chunk of xent_rows rows at a time: the logits of a chunk, its statistics; the loss from all rows' statistics at the end.
 * Without targets the logits of the last chunk's rows stay (logits_row0 on). */
static float head_forward(struct l3d_gpt *m, const void *x, bool targets, bool normed) {
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    const enum l3d_dtype dt = m->dt;
    int64_t N = (int64_t)m->B * m->T, C = m->cfg.C, sp = s->sp_size, Nl = N / sp;
    const void *lnfw = l3d_gpt_param_ptr(m, L3D_T_LNFW, 0);
    const void *lnfb = param_or_null(m, L3D_T_LNFB, 0);
    if (!normed) norm_forward(m, a->lnf, a->lnf_mean, a->lnf_rstd, x, lnfw, lnfb, Nl);
    if (sp > 1) m->hooks.tp_all_gather(m->hooks.ctx, a->lnf, a->lnf_full, Nl * C, dt);
    int64_t rows = m->xent_rows;
    m->logits_row0 = N > rows ? N - rows : 0;
    if (!targets) {
        head_logits(m, m->logits_row0, N - m->logits_row0);
        return 0.0f;
    }
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        int64_t n = N - r0 < rows ? N - r0 : rows;
        head_logits(m, r0, n);
        xent_chunk_stats(m, r0, n);
    }
    if (m->hooks.tp_all_reduce) {
        tp_all_reduce(m, a->sumexp, N, L3D_F32);
        tp_all_reduce(m, a->tlogit, N, L3D_F32);
    }
    double total = 0.0;
    l3d_be_memset(m->be, m->loss_sum, 0, sizeof(double));
    l3d_be_xent_loss(m->be, m->losses, m->loss_sum, a->maxv, a->sumexp, a->tlogit, N);
    l3d_be_copy_d2h(m->be, &total, m->loss_sum, sizeof total);
    return (float)(total / (double)N);
}

static float forward_pass(struct l3d_gpt *m, const int32_t *inputs, const int32_t *targets, int B,
                          int T) {
    L3D_ASSERT(B >= 1 && B <= m->Bmax && T >= 1 && T <= m->Tmax);
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    const enum l3d_dtype dt = m->dt;
    int64_t N = (int64_t)B * T, C = m->cfg.C;
    m->B = B;
    m->T = T;
    m->has_targets = targets != NULL;
    if (inputs) l3d_be_copy_h2d(m->be, m->inputs, inputs, (size_t)N * sizeof(int32_t));
    if (targets) l3d_be_copy_h2d(m->be, m->targets, targets, (size_t)N * sizeof(int32_t));

    int64_t sp = s->sp_size, Nl = N / sp, r0 = s->sp_rank * Nl;
    L3D_ASSERT(N % sp == 0);
    if (m->cfg.pos == L3D_POS_ROPE && m->hooks.cp_size > 1) rope_cp_positions(m, T);
    if (s->has_embedding) {
        const void *wte = l3d_gpt_param_ptr(m, L3D_T_WTE, 0);
        const void *wpe = param_or_null(m, L3D_T_WPE, 0); /* NULL with RoPE */
        int64_t v0 = s->vocab_start, vn = s->vocab_count;
        if (sp > 1) { /* vocabulary-parallel lookup, summed and scattered by rows; + positions */
            l3d_be_encoder_forward(m->be, dt, a->scratch, m->inputs, wte, NULL, v0, vn, B, T, C);
            m->hooks.tp_reduce_scatter(m->hooks.ctx, a->scratch, m->input_act, Nl * C, dt);
            if (wpe) { /* learned positions (RoPE adds none) */
                encode(m, a->scratch, wte, wpe, 0, 0, B, T);
                l3d_be_add_inplace(m->be, dt, m->input_act, el(a->scratch, r0 * C, m->es),
                                   Nl * C);
            }
        } else if (m->hooks.tp_all_reduce) { /* vocabulary-parallel lookup: partial rows, summed */
            l3d_be_encoder_forward(m->be, dt, m->input_act, m->inputs, wte, NULL, v0, vn, B, T,
                                   C);
            tp_all_reduce(m, m->input_act, N * C, dt);
            if (wpe) {
                encode(m, a->scratch, wte, wpe, 0, 0, B, T);
                l3d_be_add_inplace(m->be, dt, m->input_act, a->scratch, N * C);
            }
        } else {
            encode(m, m->input_act, wte, wpe, v0, vn, B, T);
        }
    }
    const void *x = m->input_act;
    bool normed = false; /* x's norm done with the residual add that made it (next_norm) */
    for (int l = 0; l < s->layer_count; l++) {
        params_begin(m, l, false);
        normed = forward_layer(m, l, &a->layer[l], x, B, T, true, normed);
        params_end(m, l, false);
        x = a->layer[l].res3;
    }
    if (!s->has_head) return 0.0f;
    return head_forward(m, x, targets != NULL, normed);
}

float l3d_gpt_forward(struct l3d_gpt *m, const int32_t *inputs, const int32_t *targets, int B,
                      int T) {
    bool nonlayer = m->shard.has_embedding || m->shard.has_head;
    if (nonlayer) params_begin(m, -1, false);
    float loss = forward_pass(m, inputs, targets, B, T);
    if (nonlayer) params_end(m, -1, false);
    return loss;
}

const void *l3d_gpt_output_act(const struct l3d_gpt *m) {
    return m->shard.layer_count > 0 ? m->acts->layer[m->shard.layer_count - 1].res3 : m->input_act;
}

/* ---- backward --------------------------------------------------------------------------- */

/* The chunked head's backward: per chunk of rows its logits again (forward kept only their
 * statistics), dlogits in place from the forward's full-vocabulary normaliser (maxv, sumexp:
 * summed over the tp group in forward, so no collective here), its rows of d(lnf) = dlogits W
 * and dW += dlogits^T lnf; then d(lnf) summed over the tp group (column-parallel) once. */
static void head_chunks_backward(struct l3d_gpt *m, float dloss, float *dwte, const void *wte) {
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    int64_t N = (int64_t)m->B * m->T, C = m->cfg.C, sp = s->sp_size, rows = m->xent_rows;
    int64_t Vl = s->vocab_count, Vvalid = local_valid_vocab(m);
    bool f32 = l3d_tpsum_on(m); /* d(lnf) made, summed and rounded in fp32 (src/model/tpsum.c) */
    if (f32)
        l3d_tpsum_zero(m, N);
    else
        l3d_be_memset(m->be, a->dln, 0, (size_t)(N * C) * m->es);
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        int64_t n = N - r0 < rows ? N - r0 : rows;
        head_logits(m, r0, n);
        l3d_be_xent_backward(m->be, m->dt, m->logits, a->maxv + r0, a->sumexp + r0,
                             m->targets + r0, dloss, s->vocab_start, n, Vl, Vvalid);
        if (f32) l3d_tpsum_dinp(m, r0, n, m->logits, wte, C, Vl, r0 == 0);
        matmul_backward(m, f32 ? NULL : el(a->dln, r0 * C, m->es), dwte, NULL, m->logits,
                        el(a->lnf_full, r0 * C, m->es), wte, n, C, Vl);
    }
    if (f32)
        l3d_tpsum_reduce(m, sp > 1 ? a->dln_local : a->dln, N);
    else if (sp > 1) /* sequence parallel: the sum reduce-scattered to this rank's rows */
        m->hooks.tp_reduce_scatter(m->hooks.ctx, a->dln, a->dln_local, N / sp * C, m->dt);
    else
        tp_all_reduce(m, a->dln, N * C, m->dt);
}

/* The LM head's and final LayerNorm's backward (the last stage): dlogits from the loss, the head's
 * gradients, and d(x_last) into a->dres. */
static void head_backward(struct l3d_gpt *m, float dloss, const void *x_last) {
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    int64_t N = (int64_t)m->B * m->T, C = m->cfg.C, sp = s->sp_size, Nl = N / sp;
    size_t bytes_l = (size_t)(Nl * C) * m->es;
    float *dwte = l3d_gpt_grad_ptr(m, head_tensor(m), 0);
    const void *wte = l3d_gpt_param_ptr(m, head_tensor(m), 0);
    const void *lnfw = l3d_gpt_param_ptr(m, L3D_T_LNFW, 0);
    float *dlnfw = l3d_gpt_grad_ptr(m, L3D_T_LNFW, 0);
    float *dlnfb = grad_or_null(m, L3D_T_LNFB, 0);
    int64_t Vl = s->vocab_count, Vvalid = local_valid_vocab(m);
    L3D_ASSERT(m->has_targets);
    if (!xent_chunked(m)) { /* the forward's logits */
        /* logits become dlogits in place */
        l3d_be_xent_backward(m->be, m->dt, m->logits, a->maxv, a->sumexp, m->targets, dloss,
                             s->vocab_start, N, Vl, Vvalid);
        /* the head is column-parallel over the vocabulary */
        column_parallel_backward(m, a->dln, dwte, NULL, m->logits, a->lnf_full, wte, N, C, Vl);
    } else {
        head_chunks_backward(m, dloss, dwte, wte);
    }
    l3d_be_memset(m->be, a->dres, 0, bytes_l);
    if (sp > 1) { /* this rank's part of the final LayerNorm's weight gradients, summed */
        l3d_be_memset(m->be, a->dlnw, 0, 2 * (size_t)C * sizeof(float));
        layernorm_backward(m, a->dres, a->dlnw, dlnfb ? a->dlnw + C : NULL, a->dln_local,
                           x_last, lnfw, a->lnf_mean, a->lnf_rstd, Nl, C);
        tp_all_reduce(m, a->dlnw, 2 * C, L3D_F32);
        l3d_be_add_inplace(m->be, L3D_F32, dlnfw, a->dlnw, C);
        if (dlnfb) l3d_be_add_inplace(m->be, L3D_F32, dlnfb, a->dlnw + C, C);
    } else {
        layernorm_backward(m, a->dres, dlnfw, dlnfb, a->dln, x_last, lnfw, a->lnf_mean,
                           a->lnf_rstd, N, C);
    }
}

/* The dense MLP's backward: d(res3) in dres_full to d(ln2) in dln. */
static void mlp_backward(struct l3d_gpt *m, const struct layer_acts *la,
                         const struct layer_params *p, const struct layer_grads *g, int64_t N) {
    struct l3d_gpt_acts *a = m->acts;
    struct widths w = widths(m);
    const size_t E = m->es;
    int64_t C = m->cfg.C, F = w.F;
    l3d_be_memset(m->be, a->dfch_gelu, 0, (size_t)(N * F) * E);
    matmul_backward(m, a->dfch_gelu, g->fcprojw, g->fcprojb, a->dres_full, la->fch_gelu,
                    p->fcprojw, N, F, C);
    l3d_be_memset(m->be, a->dfch, 0, (size_t)(N * w.Fm) * E);
    if (m->cfg.mlp == L3D_MLP_SWIGLU)
        l3d_be_swiglu_backward(m->be, m->dt, a->dfch, a->dfch_gelu, la->fch, N, F);
    else
        l3d_be_gelu_backward(m->be, m->dt, a->dfch, a->dfch_gelu, la->fch, N * F);
    progress(m);
    column_parallel_backward(m, a->dln, g->fcw, g->fcb, a->dfch, la->ln2, p->fcw, N, C, w.Fm);
}

/* ---- split backward: the stash of W's inputs ------------------------------------------- */

/* What W needs beyond the saved activations: the gradients of its products' outputs, in the order
 * B produces them (MLP output, fc output, attention output, q|k|v); the norms' weight gradients
 * come with B (cheap, and their inputs then need not be kept). Without full recomputation B
 * writes them into the micro-batch's own activation slot, over what B has read for the last time
 * and W does not read: the layer output res3 (the next layer's B, or the head's, is done), the fc
 * output fch (the activation's backward is done), res2 (LayerNorm 2's backward is done) and q|k|v
 * (the attention's backward is done), each of its gradient's size; so a micro-batch between B and
 * W holds no more than between F and B, and ZB-H1 keeps 1F1B's activation memory (Qi et al.
 * 2024, sec. 3.1: at most pp micro-batches in flight). The residual gradients are this rank's
 * rows (W gathers them again under sequence parallelism). Under full recomputation the slot
 * keeps only res3: they go to a stash of wslots W slots. */
enum { WS_DMLP, WS_DFCH, WS_DATT, WS_DQKV, WS_N };

/* Elements of each stash entry of one layer for BT rows. */
static void wstash_sizes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int64_t BT,
                         int64_t sz[WS_N]) {
    int64_t C = cfg->C, HS = l3d_model_head_dim(cfg), BTl = BT / sh->sp_size;
    int64_t qkv = ((int64_t)sh->head_count + 2 * (int64_t)l3d_shard_kv_count(cfg, sh)) * HS;
    int64_t fm = cfg->mlp == L3D_MLP_SWIGLU ? 2 * (int64_t)sh->ffn_count : sh->ffn_count;
    const int64_t v[WS_N] = {BTl * C, BT * fm, BTl * C, BT * qkv};
    memcpy(sz, v, sizeof v);
}

/* Bytes of one layer's stash (each entry 64-byte aligned). */
static int64_t wstash_layer_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                                  int64_t BT, size_t es) {
    int64_t sz[WS_N], b = 0;
    wstash_sizes(cfg, sh, BT, sz);
    for (int i = 0; i < WS_N; i++) b += (sz[i] * (int64_t)es + 63) / 64 * 64;
    return b;
}

/* Bytes of one W slot's norm weight gradients (gradient slots: 4 C fp32 a layer, 64-aligned). */
static int64_t wnorm_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh) {
    return ((int64_t)4 * cfg->C * (int64_t)sizeof(float) + 63) / 64 * 64 * sh->layer_count;
}

size_t l3d_gpt_wstash_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                            int T, int wslots, enum l3d_recompute recompute, bool grad_slots,
                            enum l3d_dtype dt) {
    int64_t per = recompute == L3D_RECOMPUTE_FULL /* else in the activation slots */
                      ? wstash_layer_bytes(cfg, sh, (int64_t)B * T, l3d_dtype_size(dt)) *
                            sh->layer_count
                      : 0;
    if (grad_slots) per += wnorm_bytes(cfg, sh);
    return (size_t)(per * wslots);
}

/* Gradient slots (ZeRO-2/3): the slot of layer l is reused two layers on, so B keeps the norms'
 * weight gradients of the current W slot here (ln2w ln2b ln1w ln1b, C each) and W puts them into
 * the layer's gradient slot with the products'. */
static float *wnorm(const struct l3d_gpt *m, int l) {
    int64_t per = wnorm_bytes(&m->cfg, &m->shard) / m->shard.layer_count;
    return (float *)((char *)m->wnorm + ((int64_t)m->wslot * m->shard.layer_count + l) * per);
}

static struct layer_grads wnorm_grads(const struct l3d_gpt *m, const struct layer_grads *g,
                                      int l) {
    float *d = wnorm(m, l);
    int64_t C = m->cfg.C;
    return (struct layer_grads){.ln2w = g->ln2w ? d : NULL, .ln2b = g->ln2b ? d + C : NULL,
                                .ln1w = g->ln1w ? d + 2 * C : NULL,
                                .ln1b = g->ln1b ? d + 3 * C : NULL};
}

/* Entry i of local layer l's stash: in the slot's activations (la, the current slot's), or in
 * the current W slot of the stash under full recomputation. */
static void *wstash(const struct l3d_gpt *m, const struct layer_acts *la, int l, int i) {
    if (m->recompute != L3D_RECOMPUTE_FULL) {
        void *const in_slot[WS_N] = {la->res3, la->fch, la->res2, la->qkv};
        return in_slot[i];
    }
    int64_t sz[WS_N], off = ((int64_t)m->wslot * m->shard.layer_count + l) * m->wstash_layer;
    wstash_sizes(&m->cfg, &m->shard, (int64_t)m->Bmax * m->Tmax, sz);
    for (int k = 0; k < i; k++) off += (sz[k] * (int64_t)m->es + 63) / 64 * 64;
    return (char *)m->wstash + off;
}

/* B keeps entry i of layer l: n elements of src. */
static void stash(struct l3d_gpt *m, int l, int i, const void *src, int64_t n) {
    l3d_be_copy_d2d(m->be, wstash(m, &m->acts->layer[l], l, i), src, (size_t)n * m->es);
}

/* W's residual gradient (entry i, this rank's rows): all of them, gathered under sequence
 * parallelism as B had them. */
static const void *wstash_rows(struct l3d_gpt *m, int l, int i) {
    const void *mine = wstash(m, &m->acts->layer[l], l, i);
    if (m->shard.sp_size == 1) return mine;
    int64_t Nl = (int64_t)m->B * m->T / m->shard.sp_size;
    m->hooks.tp_all_gather(m->hooks.ctx, mine, m->acts->dres_full, Nl * m->cfg.C, m->dt);
    return m->acts->dres_full;
}

/* The head's activations once instead of per slot: the activation region laid out again (at
 * initialisation, before any pass: nothing in it yet); false when out of memory. */
static bool share_head(struct l3d_gpt *m) {
    size_t others = m->act_bytes - (size_t)point_acts(m, NULL, 0); /* the MoE buffers */
    l3d_be_free(m->be, m->acts->base);
    m->head_once = true;
    size_t bytes = (size_t)point_acts(m, NULL, 0);
    m->acts->base = l3d_be_alloc(m->be, bytes, "activations");
    if (!m->acts->base) return false;
    l3d_be_memset(m->be, m->acts->base, 0, bytes);
    point_acts(m, m->acts->base, 0);
    m->slot = 0;
    m->act_bytes = bytes + others;
    return true;
}

int64_t l3d_gpt_xent_rows(const struct l3d_shard *sh, int64_t BT) {
    int64_t r = sh->xent_rows > 0 ? sh->xent_rows : BT;
    return r < BT ? r : BT;
}

l3d_status l3d_gpt_split_init(struct l3d_gpt *m, int wslots, bool head_once) {
    if (m->grads_nonlayer && l3d_shard_moe_layers(&m->cfg, &m->shard) > 0)
        return l3d_error(L3D_ERR_ARG, "the zero-bubble schedule (--pp-schedule zb-h1) on a MoE "
                         "model computes the experts' gradients in B, which the gradient slots "
                         "of --zero 2 and 3 cannot hold until W: use --zero 0 or 1, or "
                         "--pp-schedule 1f1b");
    L3D_ASSERT(wslots >= 1 && !m->wstash);
    if (head_once && m->shard.has_head && m->act_slots > 1 && !share_head(m))
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f MiB for the activations: lower "
                         "--batch or --seq-len", (double)m->act_bytes / 1048576.0);
    m->wstash_slots = wslots;
    m->wstash_layer = wstash_layer_bytes(&m->cfg, &m->shard, (int64_t)m->Bmax * m->Tmax, m->es);
    bool slots = m->grads_nonlayer != NULL;
    size_t bytes = l3d_gpt_wstash_bytes(&m->cfg, &m->shard, m->Bmax, m->Tmax, wslots,
                                        m->recompute, slots, m->dt);
    size_t nb = slots ? (size_t)(wnorm_bytes(&m->cfg, &m->shard) * wslots) : 0;
    if (bytes == 0) return L3D_OK;
    if (bytes > nb) m->wstash = l3d_be_alloc(m->be, bytes - nb, "weight-gradient stash");
    if (nb) m->wnorm = l3d_be_alloc(m->be, nb, "weight-gradient stash");
    if ((bytes > nb && !m->wstash) || (nb && !m->wnorm))
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f MiB for the zero-bubble schedule's "
                         "weight-gradient stash: lower --batch or --seq-len, or use "
                         "--pp-schedule 1f1b", (double)bytes / 1048576.0);
    m->act_bytes += bytes;
    return L3D_OK;
}

/* The norms' weight gradients of layer l: directly (sp = 1), or this rank's rows' part in dlnw
 * (4C: ln2w ln2b ln1w ln1b), summed over the group by norm_grads_sum. */
static void norm_grads(struct l3d_gpt *m, const struct layer_grads *g, float *out[4]) {
    float *direct[4] = {g->ln2w, g->ln2b, g->ln1w, g->ln1b};
    float *d = m->acts->dlnw;
    int64_t C = m->cfg.C;
    if (m->shard.sp_size == 1) {
        memcpy(out, direct, sizeof direct);
        return;
    }
    l3d_be_memset(m->be, d, 0, 4 * (size_t)C * sizeof(float));
    for (int i = 0; i < 4; i++) out[i] = direct[i] ? d + i * C : NULL;
}

static void norm_grads_sum(struct l3d_gpt *m, const struct layer_grads *g, float *const gl[4]) {
    if (m->shard.sp_size == 1) return;
    int64_t C = m->cfg.C;
    float *direct[4] = {g->ln2w, g->ln2b, g->ln1w, g->ln1b};
    tp_all_reduce(m, m->acts->dlnw, 4 * C, L3D_F32);
    for (int i = 0; i < 4; i++)
        if (direct[i]) l3d_be_add_inplace(m->be, L3D_F32, direct[i], gl[i], C);
}

/* ---- backward --------------------------------------------------------------------------- */

/* Layer l's backward: a->dres holds d(its output) and then d(its input). defer (B of a split
 * backward): no weight gradients of the layer's own products and norms (a MoE layer's experts and
 * router have theirs), their output gradients stashed for W instead. */
static void backward_layer(struct l3d_gpt *m, int l, float dloss, bool defer) {
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    const enum l3d_dtype dt = m->dt;
    int B = m->B, T = m->T;
    int64_t N = (int64_t)B * T, C = m->cfg.C, sp = s->sp_size, Nl = N / sp;
    struct widths w = widths(m);
    bool moe = l3d_model_moe_layer(&m->cfg, s->layer_start + l);
    params_begin(m, l, true); /* a full recomputation below reuses it */
    struct layer_acts *la = &a->layer[l];
    struct layer_params p = layer_params(m, l);
    if (m->grads_nonlayer && !defer) /* split: W fills the slot */
        l3d_be_memset(m->be, m->grad_slot[l % 2], 0, (size_t)m->slot_size * sizeof(float));
    struct layer_grads g = layer_grads(m, l);
    if (defer && m->grads_nonlayer) { /* the norms' now, kept for W; the products' in W */
        g = wnorm_grads(m, &g, l);
        l3d_be_memset(m->be, wnorm(m, l), 0, 4 * (size_t)m->cfg.C * sizeof(float));
    } else if (defer) { /* the products' weight gradients wait for W; the norms' come now */
        g = (struct layer_grads){.ln1w = g.ln1w, .ln1b = g.ln1b, .ln2w = g.ln2w, .ln2b = g.ln2b};
    }
    const void *x = l > 0 ? a->layer[l - 1].res3 : m->input_act;
    if (m->recompute == L3D_RECOMPUTE_FULL) { /* the layer's forward again, from its input */
        la = &a->rc;
        forward_layer(m, l, la, x, B, T, false, false);
    } else if (m->recompute == L3D_RECOMPUTE_SELECTIVE && m->attn_naive) {
        /* the attention probabilities (the tiled kernel keeps none: nothing to rebuild) */
        l3d_be_attention_naive_forward(m->be, dt, a->atty_tmp, la->att, la->qkv, B, T, w.Hl,
                                       w.KVl, w.HS);
    }
    float *gl[4]; /* ln2w ln2b ln1w ln1b */
    norm_grads(m, &g, gl);
    /* MLP: dres holds d(res3) */
    if (sp > 1) m->hooks.tp_all_gather(m->hooks.ctx, a->dres, a->dres_full, Nl * C, dt);
    if (defer && !moe) stash(m, l, WS_DMLP, a->dres, Nl * C);
    if (moe) { /* d(ln2) of all N rows, whole on every tp rank: no sum; SP takes its rows */
        l3d_moe_backward(m, l, a->dln, a->dres_full, la->ln2, N, dloss);
        if (sp > 1)
            l3d_be_copy_d2d(m->be, a->dln_local, el(a->dln, s->sp_rank * Nl * C, m->es),
                            (size_t)(Nl * C) * m->es);
    } else {
        mlp_backward(m, la, &p, &g, N);
    }
    if (defer && !moe) stash(m, l, WS_DFCH, a->dfch, N * w.Fm);
    layernorm_backward(m, a->dres, gl[0], gl[1], a->dln_local, la->res2, p.ln2w, la->ln2_mean,
                       la->ln2_rstd, Nl, C);
    progress(m);
    /* attention: dres now holds d(res2) */
    if (sp > 1) m->hooks.tp_all_gather(m->hooks.ctx, a->dres, a->dres_full, Nl * C, dt);
    if (defer) stash(m, l, WS_DATT, a->dres, Nl * C);
    l3d_be_memset(m->be, a->datty, 0, (size_t)(N * w.Ca) * m->es);
    matmul_backward(m, a->datty, g.attprojw, g.attprojb, a->dres_full, la->atty, p.attprojw, N,
                    w.Ca, C);
    l3d_be_memset(m->be, a->dqkv, 0, (size_t)(N * w.QKV) * m->es);
    attention_backward(m, la, B, T, &w);
    if (m->cfg.pos == L3D_POS_ROPE) /* to the gradient of q and k before their rotation */
        l3d_be_rope_backward(m->be, dt, a->dqkv, m->rope_inv_freq, m->rope_pos, B, T, w.Hl,
                             w.KVl, w.HS);
    if (m->cfg.qk_norm) l3d_qknorm_backward(m, l, a->dqkv, N); /* its weights' with B */
    progress(m);
    if (defer) stash(m, l, WS_DQKV, a->dqkv, N * w.QKV);
    column_parallel_backward(m, a->dln, g.qkvw, g.qkvb, a->dqkv, la->ln1, p.qkvw, N, C, w.QKV);
    layernorm_backward(m, a->dres, gl[2], gl[3], a->dln_local, x, p.ln1w, la->ln1_mean,
                       la->ln1_rstd, Nl, C);
    norm_grads_sum(m, &g, gl);
    /* dres now holds d(x), the layer's input */
    params_end(m, l, true);
    if (!defer && m->hooks.grads_ready) m->hooks.grads_ready(m->hooks.grads_ctx, l);
}

/* W of layer l: its weight gradients from the stash and the slot's activations, the same
 * products backward_layer makes (each product's weight gradient independent of its input
 * gradient: the same bits). */
/* Gradient slots: the layer's slot zeroed as the fused backward has it, then B's norm weight
 * gradients into it (what the fused backward's += into zeros gives). */
static void weight_slot_begin(struct l3d_gpt *m, const struct layer_grads *g, int l) {
    l3d_be_memset(m->be, m->grad_slot[l % 2], 0, (size_t)m->slot_size * sizeof(float));
    struct layer_grads kept = wnorm_grads(m, g, l);
    float *const to[4] = {g->ln2w, g->ln2b, g->ln1w, g->ln1b};
    const float *const from[4] = {kept.ln2w, kept.ln2b, kept.ln1w, kept.ln1b};
    for (int i = 0; i < 4; i++)
        if (to[i]) l3d_be_copy_d2d(m->be, to[i], from[i], (size_t)m->cfg.C * sizeof(float));
}

static void weight_layer(struct l3d_gpt *m, int l) {
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    int64_t N = (int64_t)m->B * m->T, C = m->cfg.C;
    struct widths w = widths(m);
    params_begin(m, l, true);
    struct layer_acts *la = &a->layer[l];
    struct layer_params p = layer_params(m, l);
    struct layer_grads g = layer_grads(m, l);
    if (m->grads_nonlayer) /* the layer's gradient slot: B's norm gradients, then the products' */
        weight_slot_begin(m, &g, l);
    if (m->recompute == L3D_RECOMPUTE_FULL) { /* B's rebuilt activations are gone: again */
        const void *x = l > 0 ? a->layer[l - 1].res3 : m->input_act;
        la = &a->rc;
        forward_layer(m, l, la, x, m->B, m->T, false, false);
    }
    if (!l3d_model_moe_layer(&m->cfg, s->layer_start + l)) {
        matmul_backward(m, NULL, g.fcprojw, g.fcprojb, wstash_rows(m, l, WS_DMLP), la->fch_gelu,
                        p.fcprojw, N, w.F, C);
        matmul_backward(m, NULL, g.fcw, g.fcb, wstash(m, &a->layer[l], l, WS_DFCH), la->ln2,
                        p.fcw, N, C, w.Fm);
    }
    matmul_backward(m, NULL, g.attprojw, g.attprojb, wstash_rows(m, l, WS_DATT), la->atty,
                    p.attprojw, N, w.Ca, C);
    matmul_backward(m, NULL, g.qkvw, g.qkvb, wstash(m, &a->layer[l], l, WS_DQKV), la->ln1, p.qkvw,
                    N, C, w.QKV);
    params_end(m, l, true);
    if (m->hooks.grads_ready) m->hooks.grads_ready(m->hooks.grads_ctx, l);
}

static void backward_pass(struct l3d_gpt *m, float dloss, const void *dout_act, bool defer) {
    L3D_ASSERT(m->grads || m->grads_nonlayer); /* not an inference-only model */
    L3D_ASSERT(!defer || m->wstash_slots > 0); /* l3d_gpt_split_init */
    const struct l3d_shard *s = &m->shard;
    struct l3d_gpt_acts *a = m->acts;
    int B = m->B, T = m->T;
    int64_t N = (int64_t)B * T, C = m->cfg.C;
    /* sequence parallel: the LayerNorm and residual regions hold Nl of the N rows; their
     * gradients are gathered before each row-parallel product (the conjugate of its
     * reduce-scatter), and the LayerNorm weights' gradients, partial sums over this rank's rows,
     * are summed over the group. With sp = 1 the gathered buffers alias the local ones. */
    int64_t sp = s->sp_size, Nl = N / sp;
    size_t bytes_l = (size_t)(Nl * C) * m->es;
    const void *x_last = l3d_gpt_output_act(m);

    if (s->has_head) {
        head_backward(m, dloss, x_last);
    } else {
        L3D_ASSERT(dout_act != NULL);
        l3d_be_copy_d2d(m->be, a->dres, dout_act, bytes_l);
    }
    for (int l = s->layer_count - 1; l >= 0; l--) backward_layer(m, l, dloss, defer);
    l3d_be_copy_d2d(m->be, m->dinput_act, a->dres, bytes_l);
    if (s->has_embedding) {
        float *dwte = l3d_gpt_grad_ptr(m, L3D_T_WTE, 0);
        float *dwpe = grad_or_null(m, L3D_T_WPE, 0);
        if (sp > 1) m->hooks.tp_all_gather(m->hooks.ctx, a->dres, a->dres_full, Nl * C, m->dt);
        encode_backward(m, dwte, dwpe, a->dres_full, B, T);
    }
    if (m->hooks.grads_ready) m->hooks.grads_ready(m->hooks.grads_ctx, -1);
}

static void backward_run(struct l3d_gpt *m, float dloss, const void *dout_act, bool defer) {
    /* the non-layer tensors' parameters: only the head's backward reads them (wte, lnfw) */
    if (m->shard.has_head) params_begin(m, -1, true);
    backward_pass(m, dloss, dout_act, defer);
    if (m->shard.has_head) params_end(m, -1, true);
}

void l3d_gpt_backward(struct l3d_gpt *m, float dloss, const void *dout_act) {
    backward_run(m, dloss, dout_act, false);
}

void l3d_gpt_backward_input(struct l3d_gpt *m, float dloss, const void *dout_act, int wslot) {
    L3D_ASSERT(wslot >= 0 && wslot < m->wstash_slots);
    m->wslot = wslot;
    backward_run(m, dloss, dout_act, true);
}

void l3d_gpt_backward_weight(struct l3d_gpt *m, int wslot) {
    L3D_ASSERT(wslot >= 0 && wslot < m->wstash_slots);
    m->wslot = wslot;
    for (int l = m->shard.layer_count - 1; l >= 0; l--) weight_layer(m, l);
}

size_t l3d_gpt_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                         int T, int act_slots, enum l3d_recompute recompute, bool flash) {
    return l3d_gpt_act_bytes_dt(cfg, sh, B, T, act_slots, recompute, flash, L3D_F32);
}

size_t l3d_gpt_head_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                              int T, enum l3d_dtype dt) {
    if (!sh->has_head) return 0;
    double sb = (double)B * T, p = sh->sp_size, sbh = sb * cfg->C, V = (double)sh->vocab_count;
    double E = (double)l3d_dtype_size(dt);
    /* the logits only when unchunked (else one chunk of them, shared: l3d_gpt_act_bytes_dt) */
    double logits = l3d_gpt_xent_rows(sh, (int64_t)B * T) < (int64_t)B * T ? 0 : sb * V;
    return (size_t)(E * (sbh / p + (p > 1 ? sbh : 0) + logits) + 4 * (2 * sb / p + 3 * sb));
}

size_t l3d_gpt_act_bytes_dt(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                            int T, int act_slots, enum l3d_recompute recompute, bool flash,
                            enum l3d_dtype dt) {
    double s = T, b = B, h = cfg->C, a = sh->head_count;
    double p = sh->sp_size, sb = s * b, sbh = s * b * h;
    double E = (double)l3d_dtype_size(dt);
    /* each term in bytes: E for the activations of the model's type, 4 for the fp32 statistics
     * and the int32 tokens. a: this rank's heads. The tiled kernel keeps a
     * log-sum-exp per query row (a s b), the materialising one the probabilities (a s^2 b) and a
     * scratch of that size (both fp32) */
    int64_t hd = l3d_model_head_dim(cfg), ca = (int64_t)sh->head_count * hd;
    double Ca = (double)ca, att = 4 * (flash ? a * s * b : a * s * s * b);
    bool naive_sel = !flash && recompute == L3D_RECOMPUTE_SELECTIVE;
    /* other blocks than GPT-2's: the q|k|v and MLP widths' excess over GPT-2's 3 ca and
     * 4 ca + 4 ca (ca: this rank's attention channels, h / t unless head_dim sets hd apart;
     * GQA: fewer k and v rows; SwiGLU: gate|up and its product; 0 for GPT-2),
     * and RMSNorm's missing mean (of both norms) */
    int64_t qkv = ca + 2 * (int64_t)l3d_shard_kv_count(cfg, sh) * hd;
    int64_t f = sh->ffn_count, fm = cfg->mlp == L3D_MLP_SWIGLU ? 2 * f : f;
    double dw = (double)((qkv - 3 * ca) + (fm + f - 8 * ca));
    double dstat = cfg->norm == L3D_NORM_RMSNORM ? -4 * (2 * sb / p) : 0.0;
    double layer_all = E * sbh * (2 + 2 / p) + E * sb * 12 * Ca + att + 4 * (4 * sb / p) +
                       E * sb * dw + dstat;
    double layer = recompute == L3D_RECOMPUTE_NONE ? layer_all
                   : recompute == L3D_RECOMPUTE_SELECTIVE ? (naive_sel ? layer_all - att : layer_all)
                                                          : E * sbh / p;
    /* per slot: the stage input and its gradient, the tokens, and on the last stage the final
     * LayerNorm (its gathered copy under SP), the logits slice (unchunked), the loss statistics
     * and the per-token losses */
    double slot = sh->layer_count * layer + E * 2 * sbh / p + 4 * 2 * sb;
    if (sh->has_head) slot += (double)l3d_gpt_head_act_bytes(cfg, sh, B, T, dt) + 4 * sb;
    /* shared: the backward of one layer (residual gradient, LayerNorm-output gradient, q|k|v,
     * attention output, probabilities, MLP gradients) and the row-parallel output; SP adds the
     * gathered and scattered copies; recomputation adds what it rebuilds */
    double shared = E * (sbh / p + sbh + 3 * sb * Ca + sb * Ca + 8 * sb * Ca + sbh) +
                    (flash ? 0 : att) + E * sb * dw;
    if (p > 1) shared += E * (2 * sbh / p + sbh + sbh / p) + 4 * 4 * h;
    if (naive_sel || recompute == L3D_RECOMPUTE_FULL) shared += att;
    if (naive_sel) shared += E * sb * Ca;
    /* the chunked cross-entropy's one chunk of logits */
    int64_t xr = l3d_gpt_xent_rows(sh, B * (int64_t)T);
    if (sh->has_head && xr < B * (int64_t)T) shared += E * (double)xr * (double)sh->vocab_count;
    if (recompute == L3D_RECOMPUTE_FULL) shared += layer_all - att;
    /* a MoE layer keeps no dense MLP rows (fch, fch_gelu: the fm + f of each token), and the
     * MoE buffers come on top (src/model/moe.c) */
    if (recompute != L3D_RECOMPUTE_FULL)
        slot -= l3d_shard_moe_layers(cfg, sh) * E * sb * (double)(fm + f);
    return (size_t)(act_slots * slot + shared) +
           l3d_moe_act_bytes(cfg, sh, B, T, act_slots, recompute, dt) +
           l3d_qknorm_act_bytes(cfg, sh, B, T, act_slots, recompute, dt) +
           l3d_tpsum_act_bytes(cfg, sh, B, T, dt);
}

/* ---- counts ----------------------------------------------------------------------------- */

int64_t l3d_gpt_param_count(const struct l3d_model_spec *cfg) {
    struct l3d_tensor_info t[L3D_NUM_TENSORS];
    struct l3d_shard full = l3d_shard_full(cfg);
    return l3d_gpt_plan_tensors(cfg, &full, t);
}

double l3d_gpt_flops_per_token(const struct l3d_model_spec *cfg, int T) {
    double wpe = cfg->pos == L3D_POS_LEARNED ? (double)cfg->maxT * cfg->C : 0.0;
    /* an untied model's embedding is a lookup: only its head takes part in a product */
    double wte = cfg->untied ? (double)cfg->Vp * cfg->C : 0.0;
    /* the parameters a token uses: a MoE layer's top-k experts, not all of them */
    double active = (double)l3d_gpt_param_count(cfg) - l3d_model_param_count(cfg) +
                    l3d_model_active_param_count(cfg);
    double n = active - wpe - wte;
    return 6.0 * n + 12.0 * cfg->L * (double)cfg->NH * l3d_model_head_dim(cfg) * T;
}
