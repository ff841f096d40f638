/* Model families as data (include/llm3d/arch.h): one row per family, and the look-ups every
 * reader of a family goes through. GPT-2: Radford et al. 2019, Hugging Face's GPT2LMHeadModel;
 * Llama: Touvron et al. 2023, Dubey et al. 2024, Hugging Face's LlamaForCausalLM. */
#include <stdio.h>
#include <string.h>

#include "llm3d/arch.h"

#define D(x) L3D_DIM_##x
/* A vector of cols elements (a layer's when layer), a matrix's row block */
#define VEC(hf, t, layer, cols) {hf, t, layer, 1, D(0), D(1), D(1), D(cols), false, false, 0, 0}
#define MAT(hf, t, layer, r0, rows, trows, cols, tr) \
    {hf, t, layer, 2, D(r0), D(rows), D(trows), D(cols), tr, false, 0, 0}
/* a dense MLP's matrix (the layers without experts), a MoE layer's, an expert's */
#define DMAT(hf, t, r0, rows, trows, cols) \
    {hf, t, true, 2, D(r0), D(rows), D(trows), D(cols), false, false, L3D_PART_DENSE, 0}
#define MMAT(hf, t, r0, rows, trows, cols) \
    {hf, t, true, 2, D(r0), D(rows), D(trows), D(cols), false, false, L3D_PART_MOE, 0}
#define EMAT(hf, t, r0, rows, trows, cols, stride) \
    {hf, t, true, 2, D(r0), D(rows), D(trows), D(cols), false, false, L3D_PART_EXPERT, D(stride)}
#define HEAD(hf) {hf, "lmhead", false, 2, D(0), D(V), D(VP), D(C), false, true, 0, 0}
#define KEY(k, kind, io, dflt) {k, L3D_KEY_##kind, io, dflt, NULL, false, NULL}
#define RW (L3D_KEY_READ | L3D_KEY_WRITE)
#define R L3D_KEY_READ
#define W L3D_KEY_WRITE

static const struct l3d_arch_tensor gpt2_tensors[] = {
    MAT("transformer.wte.weight", "wte", false, 0, V, VP, C, false),
    MAT("transformer.wpe.weight", "wpe", false, 0, T, T, C, false),
    VEC("transformer.h.%d.ln_1.weight", "ln1w", true, C),
    VEC("transformer.h.%d.ln_1.bias", "ln1b", true, C),
    MAT("transformer.h.%d.attn.c_attn.weight", "qkvw", true, 0, 3C, 3C, C, true), /* fused */
    VEC("transformer.h.%d.attn.c_attn.bias", "qkvb", true, 3C),
    MAT("transformer.h.%d.attn.c_proj.weight", "attprojw", true, 0, C, C, C, true),
    VEC("transformer.h.%d.attn.c_proj.bias", "attprojb", true, C),
    VEC("transformer.h.%d.ln_2.weight", "ln2w", true, C),
    VEC("transformer.h.%d.ln_2.bias", "ln2b", true, C),
    MAT("transformer.h.%d.mlp.c_fc.weight", "fcw", true, 0, F, F, C, true),
    VEC("transformer.h.%d.mlp.c_fc.bias", "fcb", true, F),
    MAT("transformer.h.%d.mlp.c_proj.weight", "fcprojw", true, 0, C, C, F, true),
    VEC("transformer.h.%d.mlp.c_proj.bias", "fcprojb", true, C),
    VEC("transformer.ln_f.weight", "lnfw", false, C),
    VEC("transformer.ln_f.bias", "lnfb", false, C),
    HEAD("lm_head.weight"),
};

/* Llama's embedding and each layer's attention with its two norms, which Mixtral shares. */
#define LLAMA_ATTENTION                                                                        \
    MAT("model.embed_tokens.weight", "wte", false, 0, V, VP, C, false),                       \
    VEC("model.layers.%d.input_layernorm.weight", "ln1w", true, C),                           \
    MAT("model.layers.%d.self_attn.q_proj.weight", "qkvw", true, 0, Q, QKV, C, false),        \
    MAT("model.layers.%d.self_attn.k_proj.weight", "qkvw", true, Q, KV, QKV, C, false),       \
    MAT("model.layers.%d.self_attn.v_proj.weight", "qkvw", true, Q_KV, KV, QKV, C, false),    \
    MAT("model.layers.%d.self_attn.o_proj.weight", "attprojw", true, 0, C, C, Q, false),      \
    VEC("model.layers.%d.post_attention_layernorm.weight", "ln2w", true, C)

/* Llama's dense MLP (SwiGLU's gate, up and down projections), its final norm and untied head,
 * which Qwen3 shares; a mixture-of-experts layer's router and experts (gate, down, up: each
 * expert's three in turn), whose names Mixtral and Qwen3-MoE choose */
#define LLAMA_MLP                                                                              \
    DMAT("model.layers.%d.mlp.gate_proj.weight", "fcw", 0, F, 2F, C),                         \
    DMAT("model.layers.%d.mlp.up_proj.weight", "fcw", F, F, 2F, C),                           \
    DMAT("model.layers.%d.mlp.down_proj.weight", "fcprojw", 0, C, C, F)
#define LLAMA_HEAD VEC("model.norm.weight", "lnfw", false, C), HEAD("lm_head.weight")
#define EXPERTS(router, gate, down, up)                                                        \
    MMAT(router, "router", 0, E, E, C), EMAT(gate, "expfcw", 0, FE, E2FE, C, 2FE),            \
    EMAT(down, "expprojw", 0, C, EC, FE, C), EMAT(up, "expfcw", FE, FE, E2FE, C, 2FE)

static const struct l3d_arch_tensor llama_tensors[] = {LLAMA_ATTENTION, LLAMA_MLP, LLAMA_HEAD};

/* Mixtral (Jiang et al. 2024, Hugging Face's MixtralForCausalLM): Llama's attention, and in every
 * layer a router (block_sparse_moe.gate) and experts whose w1, w3, w2 are SwiGLU's gate, up and
 * down projections. */
static const struct l3d_arch_tensor mixtral_tensors[] = {
    LLAMA_ATTENTION,
    EXPERTS("model.layers.%d.block_sparse_moe.gate.weight",
            "model.layers.%d.block_sparse_moe.experts.%d.w1.weight",
            "model.layers.%d.block_sparse_moe.experts.%d.w2.weight",
            "model.layers.%d.block_sparse_moe.experts.%d.w3.weight"),
    LLAMA_HEAD,
};

/* Qwen3 (Qwen team 2025, Hugging Face's Qwen3ForCausalLM): Llama's blocks with QK-norm, each
 * layer's self_attn.q_norm and k_norm (a head's size each) */
#define QK_NORM                                                                                \
    VEC("model.layers.%d.self_attn.q_norm.weight", "qnormw", true, HS),                       \
    VEC("model.layers.%d.self_attn.k_norm.weight", "knormw", true, HS)

static const struct l3d_arch_tensor qwen3_tensors[] = {LLAMA_ATTENTION, QK_NORM, LLAMA_MLP,
                                                       LLAMA_HEAD};

/* Qwen3-MoE (Hugging Face's Qwen3MoeForCausalLM): Qwen3's attention, and in every layer a router
 * (mlp.gate) and experts whose gate_proj, up_proj, down_proj are Mixtral's w1, w3, w2 */
static const struct l3d_arch_tensor qwen3_moe_tensors[] = {
    LLAMA_ATTENTION,
    QK_NORM,
    EXPERTS("model.layers.%d.mlp.gate.weight", "model.layers.%d.mlp.experts.%d.gate_proj.weight",
            "model.layers.%d.mlp.experts.%d.down_proj.weight",
            "model.layers.%d.mlp.experts.%d.up_proj.weight"),
    LLAMA_HEAD,
};

static const char *const gpt2_acts[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
static const char *const llama_acts[] = {"silu", NULL};

/* Read in this order (the first error is the one reported), written in it (R: read only, W:
 * written only); tie_word_embeddings and torch_dtype close every file. */
static const struct l3d_arch_key gpt2_keys[] = {
    KEY("n_layer", LAYERS, RW, -1), KEY("n_embd", CHANNELS, RW, -1),
    KEY("n_head", HEADS, RW, -1), KEY("vocab_size", VOCAB, RW, -1),
    KEY("n_positions", CONTEXT, RW, -1), KEY("n_ctx", CONTEXT, W, -1),
    KEY("n_inner", FFN, RW, 0), KEY("layer_norm_epsilon", EPS, RW, 1e-5),
    KEY("tie_word_embeddings", TIED, R, 0),
    {"activation_function", L3D_KEY_STRING, RW, 0, gpt2_acts, false,
     "GPT-2's GELU is the tanh approximation, gelu_new"},
    {"scale_attn_weights", L3D_KEY_BOOL, R, 0, NULL, true,
     "attention scores are scaled by 1/sqrt(head size)"},
    {"scale_attn_by_inverse_layer_idx", L3D_KEY_BOOL, R, 0, NULL, false,
     "no per-layer score scaling"},
    {"add_cross_attention", L3D_KEY_BOOL, R, 0, NULL, false, "a decoder without cross-attention"},
};

/* LlamaConfig's sizes of the attention, which MixtralConfig shares */
#define LLAMA_SIZES                                                                             \
    KEY("num_hidden_layers", LAYERS, RW, -1), KEY("hidden_size", CHANNELS, RW, -1),            \
    KEY("num_attention_heads", HEADS, RW, -1), KEY("num_key_value_heads", KV_HEADS, RW, 0),    \
    KEY("head_dim", HEAD_DIM, W, 0)

static const struct l3d_arch_key llama_keys[] = {
    LLAMA_SIZES, KEY("intermediate_size", FFN, RW, -1),
    KEY("vocab_size", VOCAB, RW, -1), KEY("max_position_embeddings", CONTEXT, RW, -1),
    KEY("rms_norm_eps", EPS, RW, 1e-6), KEY("rope_theta", THETA, RW, 10000.0),
    KEY("tie_word_embeddings", TIED, R, 0),
    {"hidden_act", L3D_KEY_STRING, RW, 0, llama_acts, false, "Llama's MLP is SwiGLU: silu"},
    {"attention_bias", L3D_KEY_BOOL, RW, 0, NULL, false, "the model has no biases"},
    {"mlp_bias", L3D_KEY_BOOL, RW, 0, NULL, false, "the model has no biases"},
    KEY("head_dim", HEAD_DIM, R, 0), KEY("rope_scaling", ROPE_SCALING, RW, 0),
};

/* MixtralConfig's keys: intermediate_size is the experts' width (no dense MLP); the router
 * always renormalises its top-k (no norm_topk_prob key); router_aux_loss_coef counts when
 * output_router_logits is true, as in MixtralForCausalLM's forward. */
static const struct l3d_arch_key mixtral_keys[] = {
    LLAMA_SIZES, KEY("intermediate_size", EXPERT_FFN, RW, -1),
    KEY("num_local_experts", EXPERTS, RW, -1), KEY("num_experts_per_tok", TOP_K, RW, -1),
    {"hidden_act", L3D_KEY_STRING, RW, 0, llama_acts, false, "Mixtral's experts are SwiGLU: silu"},
    KEY("vocab_size", VOCAB, RW, -1), KEY("max_position_embeddings", CONTEXT, RW, -1),
    KEY("rms_norm_eps", EPS, RW, 1e-5), KEY("rope_theta", THETA, RW, 1e6),
    KEY("tie_word_embeddings", TIED, R, 0),
    {"sliding_window", L3D_KEY_NULL, RW, 0, NULL, false, "llm3d's attention is fully causal"},
    {"router_jitter_noise", L3D_KEY_ZERO, RW, 0, NULL, false, "llm3d's router adds no noise"},
    KEY("output_router_logits", ROUTER_LOGITS, RW, 0),
    KEY("router_aux_loss_coef", AUX_COEF, RW, 0.001),
    KEY("head_dim", HEAD_DIM, R, 0), KEY("rope_scaling", ROPE_SCALING, RW, 0),
};

/* Qwen3Config's keys beyond Llama's sizes: no biases (attention_bias), no sliding window
 * (use_sliding_window false: sliding_window and max_window_layers are then unused) */
#define QWEN3_COMMON                                                                            \
    KEY("vocab_size", VOCAB, RW, -1), KEY("max_position_embeddings", CONTEXT, RW, -1),         \
    KEY("rms_norm_eps", EPS, RW, 1e-6), KEY("rope_theta", THETA, RW, 10000.0),                 \
    KEY("tie_word_embeddings", TIED, R, 0),                                                     \
    {"hidden_act", L3D_KEY_STRING, RW, 0, llama_acts, false, "Qwen3's MLP is SwiGLU: silu"},   \
    {"attention_bias", L3D_KEY_BOOL, RW, 0, NULL, false, "the model has no biases"},          \
    {"use_sliding_window", L3D_KEY_BOOL, RW, 0, NULL, false,                                   \
     "llm3d's attention is fully causal"},                                                     \
    {"attention_dropout", L3D_KEY_ZERO, RW, 0, NULL, false, "llm3d has no dropout"}

static const struct l3d_arch_key qwen3_keys[] = {
    LLAMA_SIZES, KEY("intermediate_size", FFN, RW, -1), QWEN3_COMMON,
    KEY("head_dim", HEAD_DIM, R, 0), KEY("rope_scaling", ROPE_SCALING, RW, 0),
};

/* Qwen3MoeConfig's: intermediate_size is the dense MLP's (of mlp_only_layers, which llm3d
 * honours empty: every layer has experts, decoder_sparse_step 1), moe_intermediate_size the
 * experts'; norm_topk_prob says whether the top-k weights are renormalised (its default false);
 * router_aux_loss_coef counts when output_router_logits is true, as in Mixtral. */
static const struct l3d_arch_key qwen3_moe_keys[] = {
    LLAMA_SIZES, KEY("intermediate_size", FFN, RW, -1),
    KEY("moe_intermediate_size", EXPERT_FFN, RW, -1), KEY("num_experts", EXPERTS, RW, -1),
    KEY("num_experts_per_tok", TOP_K, RW, -1), KEY("norm_topk_prob", NORM_TOPK, RW, 0),
    {"decoder_sparse_step", L3D_KEY_FIXED, RW, 1, NULL, false,
     "llm3d's MoE layers are every layer after the dense ones"},
    {"mlp_only_layers", L3D_KEY_EMPTY, RW, 0, NULL, false, "every layer has experts"},
    QWEN3_COMMON,
    KEY("output_router_logits", ROUTER_LOGITS, RW, 0),
    KEY("router_aux_loss_coef", AUX_COEF, RW, 0.001),
    KEY("head_dim", HEAD_DIM, R, 0), KEY("rope_scaling", ROPE_SCALING, RW, 0),
};

static const char *const gpt2_ignored[] = {".attn.bias", ".attn.masked_bias", NULL};
static const char *const llama_ignored[] = {".rotary_emb.inv_freq", NULL};

#define N(a) (int)(sizeof a / sizeof a[0])

/* The families, in enum order. */
/* The families, in enum order, then their Hugging Face flavours with experts. */
static const struct l3d_arch_info families[] = {
    {.arch = L3D_ARCH_GPT2, .name = "gpt2", .title = "GPT-2", .hf_model_type = "gpt2",
     .hf_architecture = "GPT2LMHeadModel", .norm = L3D_NORM_LAYERNORM, .mlp = L3D_MLP_GELU,
     .pos = L3D_POS_LEARNED, .no_bias = false, .untied = false, .llmc_fp32 = 3, .llmc_bf16 = 5,
     .hf_keys = gpt2_keys, .n_hf_keys = N(gpt2_keys), .hf_tensors = gpt2_tensors,
     .n_hf_tensors = N(gpt2_tensors), .hf_prefix_optional = "transformer.",
     .hf_ignored = gpt2_ignored},
    {.arch = L3D_ARCH_LLAMA, .name = "llama", .title = "Llama", .hf_model_type = "llama",
     .hf_architecture = "LlamaForCausalLM", .norm = L3D_NORM_RMSNORM, .mlp = L3D_MLP_SWIGLU,
     .pos = L3D_POS_ROPE, .no_bias = true, .untied = true, .llmc_fp32 = 0, .llmc_bf16 = 0,
     .hf_keys = llama_keys, .n_hf_keys = N(llama_keys), .hf_tensors = llama_tensors,
     .n_hf_tensors = N(llama_tensors), .hf_prefix_optional = NULL, .hf_ignored = llama_ignored},
    {.arch = L3D_ARCH_LLAMA, .name = "mixtral", .title = "Mixtral", .hf_model_type = "mixtral",
     .hf_architecture = "MixtralForCausalLM", .moe = true, .norm = L3D_NORM_RMSNORM,
     .mlp = L3D_MLP_SWIGLU, .pos = L3D_POS_ROPE, .no_bias = true, .untied = true,
     .hf_keys = mixtral_keys, .n_hf_keys = N(mixtral_keys), .hf_tensors = mixtral_tensors,
     .n_hf_tensors = N(mixtral_tensors), .hf_prefix_optional = NULL, .hf_ignored = llama_ignored},
    {.arch = L3D_ARCH_LLAMA, .name = "qwen3", .title = "Qwen3", .hf_model_type = "qwen3",
     .hf_architecture = "Qwen3ForCausalLM", .qk_norm = true, .norm = L3D_NORM_RMSNORM,
     .mlp = L3D_MLP_SWIGLU, .pos = L3D_POS_ROPE, .no_bias = true, .untied = true,
     .hf_keys = qwen3_keys, .n_hf_keys = N(qwen3_keys), .hf_tensors = qwen3_tensors,
     .n_hf_tensors = N(qwen3_tensors), .hf_prefix_optional = NULL, .hf_ignored = llama_ignored},
    {.arch = L3D_ARCH_LLAMA, .name = "qwen3_moe", .title = "Qwen3-MoE",
     .hf_model_type = "qwen3_moe", .hf_architecture = "Qwen3MoeForCausalLM", .moe = true,
     .qk_norm = true, .norm = L3D_NORM_RMSNORM, .mlp = L3D_MLP_SWIGLU, .pos = L3D_POS_ROPE,
     .no_bias = true, .untied = true, .hf_keys = qwen3_moe_keys, .n_hf_keys = N(qwen3_moe_keys),
     .hf_tensors = qwen3_moe_tensors, .n_hf_tensors = N(qwen3_moe_tensors),
     .hf_prefix_optional = NULL, .hf_ignored = llama_ignored},
};
#define NROWS N(families)

const struct l3d_arch_info *l3d_arch_info(enum l3d_arch arch) {
    return (int)arch >= 0 && arch < L3D_ARCH_COUNT ? &families[arch] : NULL;
}

const struct l3d_arch_info *l3d_arch_hf_row(const struct l3d_model_spec *m) {
    for (int i = 0; i < NROWS; i++)
        if (families[i].arch == m->arch && families[i].moe == (m->moe.experts > 0) &&
            families[i].qk_norm == m->qk_norm)
            return &families[i];
    return NULL;
}

l3d_status l3d_arch_hf_check(const struct l3d_arch_info *a, const struct l3d_model_spec *m) {
    const struct l3d_moe_spec *e = &m->moe;
    int hd = l3d_model_head_dim(m);
    if ((int64_t)hd * m->NH != m->C && !l3d_arch_key_of(a, L3D_KEY_HEAD_DIM))
        return l3d_error(L3D_ERR_ARG, "--head-dim %d: a %s folder's head size is the channels / "
                         "heads (%d / %d); keep llm3d's model.bin or checkpoints for this model",
                         hd, a->title, m->C, m->NH);
    if (!a->moe) return L3D_OK;
    if (e->shared > 0 || e->dense_layers > 0)
        return l3d_error(L3D_ERR_ARG, "--moe-shared-experts %d, --moe-dense-layers %d: a %s "
                         "folder has neither shared experts nor dense layers; keep llm3d's "
                         "model.bin or checkpoints for this model", e->shared, e->dense_layers,
                         a->title);
    if (!e->norm_topk && !l3d_arch_key_of(a, L3D_KEY_NORM_TOPK))
        return l3d_error(L3D_ERR_ARG, "--no-moe-norm-topk: %s's router always renormalises its "
                         "top-%d weights; train with --moe-norm-topk to write a %s folder",
                         a->title, e->top_k, a->title);
    return L3D_OK;
}

/* The row whose string at byte offset `field` is s (names: the families only). */
static const struct l3d_arch_info *find(size_t field, const char *s) {
    int n = field == offsetof(struct l3d_arch_info, name) ? L3D_ARCH_COUNT : NROWS;
    for (int i = 0; s && i < n; i++)
        if (strcmp(*(const char *const *)((const char *)&families[i] + field), s) == 0)
            return &families[i];
    return NULL;
}

const struct l3d_arch_info *l3d_arch_by_name(const char *name) {
    return find(offsetof(struct l3d_arch_info, name), name);
}

const struct l3d_arch_info *l3d_arch_by_hf_type(const char *model_type) {
    return find(offsetof(struct l3d_arch_info, hf_model_type), model_type);
}

const struct l3d_arch_info *l3d_arch_by_hf_architecture(const char *architecture) {
    return find(offsetof(struct l3d_arch_info, hf_architecture), architecture);
}

const struct l3d_arch_info *l3d_arch_by_llmc_version(int version) {
    for (int i = 0; version > 0 && i < L3D_ARCH_COUNT; i++)
        if (families[i].llmc_fp32 == version || families[i].llmc_bf16 == version)
            return &families[i];
    return NULL;
}

const char *const *l3d_arch_names(void) {
    static const char *names[L3D_ARCH_COUNT];
    for (int i = 0; i < L3D_ARCH_COUNT; i++) names[i] = families[i].name;
    return names;
}

const char *l3d_arch_list(char *buf, size_t cap, const char *conj, bool hf) {
    size_t k = 0;
    int n = hf ? NROWS : L3D_ARCH_COUNT; /* the model_type values: the flavours' too */
    buf[0] = 0;
    for (int i = 0; i < n && k < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 < n ? ", " : " ";
        bool last = i > 0 && i + 1 == n;
        k += (size_t)snprintf(buf + k, cap - k, "%s%s%s%s", sep, last ? conj : "",
                              last ? " " : "", hf ? families[i].hf_model_type : families[i].name);
    }
    return buf;
}

int64_t l3d_arch_dim(const struct l3d_model_spec *m, enum l3d_arch_dim d) {
    int64_t C = m->C, F = m->ffn, hs = l3d_model_head_dim(m);
    int64_t q = m->NH * hs, kv = l3d_model_kv_heads(m) * hs;
    switch (d) {
    case L3D_DIM_0: return 0;
    case L3D_DIM_1: return 1;
    case L3D_DIM_C: return C;
    case L3D_DIM_3C: return 3 * C;
    case L3D_DIM_F: return F;
    case L3D_DIM_2F: return 2 * F;
    case L3D_DIM_V: return m->V;
    case L3D_DIM_VP: return m->Vp;
    case L3D_DIM_T: return m->maxT;
    case L3D_DIM_Q: return q;
    case L3D_DIM_KV: return kv;
    case L3D_DIM_Q_KV: return q + kv;
    case L3D_DIM_QKV: return q + 2 * kv;
    case L3D_DIM_E: return m->moe.experts;
    case L3D_DIM_FE: return m->moe.ffn;
    case L3D_DIM_2FE: return 2 * m->moe.ffn;
    case L3D_DIM_E2FE: return 2 * m->moe.ffn * m->moe.experts;
    case L3D_DIM_EC: return C * m->moe.experts;
    case L3D_DIM_HS: return hs;
    }
    return 0;
}

const struct l3d_arch_key *l3d_arch_key_of(const struct l3d_arch_info *a,
                                           enum l3d_arch_key_kind k) {
    for (int i = 0; i < a->n_hf_keys; i++)
        if (a->hf_keys[i].kind == k) return &a->hf_keys[i];
    return NULL;
}

void l3d_model_set_arch(struct l3d_model_spec *m, enum l3d_arch arch) {
    const struct l3d_arch_info *a = l3d_arch_info(arch);
    L3D_ASSERT(a);
    m->arch = arch;
    m->norm = a->norm;
    m->mlp = a->mlp;
    m->pos = a->pos;
    m->no_bias = a->no_bias;
    m->untied = a->untied;
}

const char *l3d_arch_name(enum l3d_arch arch) {
    const struct l3d_arch_info *a = l3d_arch_info(arch);
    return a ? a->name : families[0].name;
}

bool l3d_arch_parse(const char *name, enum l3d_arch *out) {
    const struct l3d_arch_info *a = l3d_arch_by_name(name);
    if (a) *out = a->arch;
    return a != NULL;
}

/* The blocks' key/value heads (include/llm3d/model.h): here with the family rows that read it. */
int l3d_model_kv_heads(const struct l3d_model_spec *m) {
    return m->NKV > 0 ? m->NKV : m->NH;
}

int l3d_model_head_dim(const struct l3d_model_spec *m) {
    return m->head_dim > 0 ? m->head_dim : m->NH > 0 ? m->C / m->NH : 0;
}
