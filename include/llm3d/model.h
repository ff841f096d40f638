/*
 * llm3d model: forward and backward of GPT-2 (Radford et al. 2019) and of the Llama family
 * (Touvron et al. 2023; RMSNorm, SwiGLU, RoPE, grouped key/value heads, an untied head), one code
 * path set by the architecture fields of struct l3d_model_spec, written against a shard.
 *
 *   struct l3d_model_spec cfg;
 *   l3d_model_preset(&cfg, "d12");             // GPT-2 124M
 *   struct l3d_shard sh = l3d_shard_full(&cfg);     // the 1x1x1 layout holds everything
 *   struct l3d_gpt *m;
 *   if (l3d_gpt_init(&m, &cfg, &sh, be, B, T, L3D_GRADS_FLAT) != L3D_OK) ...;
 *   l3d_gpt_init_weights(m, seed);
 *   l3d_gpt_zero_grad(m);
 *   float loss = l3d_gpt_forward(m, inputs, targets, B, T);
 *   l3d_gpt_backward(m, 1.0f / (B * T));           // d(mean loss)/d(loss of one token)
 *   // m->params, m->grads: one flat buffer each; m->tensors[i] says where each tensor lies
 *
 * A shard is what one rank holds: a contiguous range of layers (its pipeline stage), a range of
 * attention heads and of FFN columns (its tensor-parallel slice), a range of rows of the padded
 * vocabulary (vocabulary-parallel embedding and LM head), and whether it holds the embedding
 * (first stage) and the final norm + head + loss (last stage). The model sizes every buffer
 * from the shard and never assumes the full model.
 *
 * Every buffer of the model (parameters, gradients, activations, tokens) is device memory of the
 * backend it was built with; l3d_gpt_shard_to_full / full_to_shard work on host copies.
 *
 * Parameters of GPT-2 are the 16 tensors of llm.c's GPT-2 checkpoint, in its order, matrices
 * (out, in):
 *   wte (Vp,C) wpe (maxT,C) ln1w ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C) attprojw (L,C,C)
 *   attprojb (L,C) ln2w ln2b (L,C) fcw (L,4C,C) fcb (L,4C) fcprojw (L,C,4C) fcprojb (L,C)
 *   lnfw lnfb (C)
 * restricted to the shard's slice (qkvw keeps its q|k|v blocks, each with the local heads).
 * Llama's (Touvron et al. 2023) take the same names, no biases, no wpe (RoPE), hd a head's size
 * (l3d_model_head_dim: C / NH unless head_dim sets it apart):
 *   wte (Vp,C) ln1w (L,C) qkvw (L,(NH+2 NKV) hd,C) attprojw (L,C,NH hd) ln2w (L,C)
 *   fcw (L,2 ffn,C) fcprojw (L,C,ffn) lnfw (C) lmhead (Vp,C) (untied only)
 * qkvw's rows are the q heads, then the k heads, then the v heads (each block restricted to the
 * shard's heads), fcw's the gate rows then the up rows (each restricted to the shard's columns).
 */
#ifndef LLM3D_MODEL_H
#define LLM3D_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"

#define L3D_VOCAB_ALIGN 128
/* Limits l3d_gpt_config_finish enforces (a file's header is checked against them before any
 * allocation): the sizes as large as the planner's (llm3d plan sizes models up to these), and at
 * most L3D_MAX_PARAMS parameters, so that every element count and byte size of the model, its
 * gradients and its optimizer state (16 bytes a parameter) fits an int64_t. */
#define L3D_MAX_LAYERS (1 << 16)
#define L3D_MAX_CHANNELS (1 << 20)
#define L3D_MAX_CONTEXT (1 << 24)
#define L3D_MAX_PARAMS ((double)(1LL << 56))
/* Slots of the tensor table: GPT-2's 16 tensors in llm.c's order, then Llama's untied head, then
 * the mixture-of-experts layers' router, experts and shared MLP (struct l3d_moe_spec), then the
 * query and key norms' weights (qk_norm). An
 * architecture leaves the slots it has no tensor for empty (l3d_gpt_tensor_used). */
#define L3D_NUM_TENSORS 28

/* The architecture of a model, as data (GPT-2: Radford et al. 2019; Llama: Touvron et al. 2023,
 * Dubey et al. 2024). Each enum's zero is GPT-2's choice, so a zeroed spec with sizes is GPT-2. */
/* the family: tensor names in files, its row in include/llm3d/arch.h's table */
enum l3d_arch { L3D_ARCH_GPT2, L3D_ARCH_LLAMA, L3D_ARCH_COUNT };
enum l3d_norm { L3D_NORM_LAYERNORM, L3D_NORM_RMSNORM };
enum l3d_mlp { L3D_MLP_GELU, L3D_MLP_SWIGLU }; /* GELU(x W1) W2, or (SiLU(x Wg) * x Wu) Wd */
enum l3d_pos { L3D_POS_LEARNED, L3D_POS_ROPE }; /* wpe rows added, or q and k rotated */

/* Rotary position embedding (Su et al. 2021) in Hugging Face's rotate-half form: dimension i of a
 * head pairs with i + hd/2, at frequency theta^(-2i/hd). Llama 3.1's frequency scaling
 * (rope_scaling {"rope_type": "llama3"} in config.json) when factor > 0: wavelengths longer than
 * original_context / low_freq_factor are divided by factor, those shorter than
 * original_context / high_freq_factor kept, and those between interpolated. */
struct l3d_rope {
    double theta;            /* 0: 10000 (Llama 2); Llama 3: 500000 */
    double factor;           /* 0: no scaling; Llama 3.1: 8 */
    double low_freq_factor;  /* Llama 3.1: 1 */
    double high_freq_factor; /* Llama 3.1: 4 */
    int original_context;    /* Llama 3.1: 8192 */
};

/* Mixture of experts (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al.
 * 2021): layers dense_layers..L-1 replace the MLP by `experts` expert MLPs of width ffn (the
 * model's MLP kind: GELU for GPT-2's blocks, SwiGLU for Llama's; biases as the model) and a
 * router, a linear layer C -> experts without bias whose softmax, in fp32 whatever the precision,
 * picks each token's top_k experts (ties: the lower expert index first); their weights are the
 * probabilities, renormalised to sum to 1 over the k when norm_topk (Mixtral; Qwen3-MoE's
 * norm_topk_prob). `shared` always-on experts are one shared MLP of width shared x ffn (the sum of
 * `shared` experts of width ffn, DeepSeek's; Qwen3-MoE has none), added with weight 1.
 * capacity_factor > 0: expert e keeps at most ceil(capacity_factor x N x top_k / experts) of a
 * micro-batch's N tokens' assignments, in token order (row order of the micro-batch; a token
 * picks an expert at most once), the rest dropped (their output is 0, their weight still in the
 * renormalisation); 0: dropless. The objective adds, for each MoE layer, aux_coef x Switch's
 * E sum_i f_i P_i (f_i: the fraction of the N x top_k assignments routed to expert i before any
 * drop, P_i: its mean router probability) and z_coef x ST-MoE's router z-loss (the mean over
 * tokens of logsumexp(router logits)^2). experts 0: a dense model (every other field 0). */
struct l3d_moe_spec {
    int experts;         /* E; 0: dense */
    int top_k;           /* K, 1..E */
    int64_t ffn;         /* expert width F; 0: the model's ffn */
    int shared;          /* always-on experts (one MLP of shared x ffn) */
    int dense_layers;    /* leading layers that keep the dense MLP */
    bool norm_topk;      /* renormalise the top-k weights */
    double aux_coef;     /* load-balancing loss coefficient (0: none) */
    double z_coef;       /* router z-loss coefficient (0: none) */
    double capacity_factor; /* 0: dropless */
    bool force_balance;  /* benchmarking only: a fixed balanced selection (l3d_moe_force_rows) */
};

/* The model of a run spec (include/llm3d/spec.h): sizes and architecture. */
struct l3d_model_spec {
    char name[48]; /* the preset it came from, "custom", or "" */
    int L;    /* layers */
    int C;    /* channels */
    int NH;   /* attention (query) heads */
    int V;    /* vocabulary size */
    int Vp;   /* V padded to a multiple of L3D_VOCAB_ALIGN */
    int maxT; /* context length (rows of wpe with learned positions) */
    int64_t ffn; /* MLP width (hidden size); 0: GPT-2's 4C (GELU only; SwiGLU needs it given) */
    enum l3d_arch arch;
    int NKV;  /* key/value heads (grouped-query attention, Ainslie et al. 2023); 0: NH (MHA) */
    enum l3d_norm norm;
    float norm_eps;  /* 0: 1e-5 (GPT-2's LayerNorm; Llama 2's RMSNorm) */
    enum l3d_mlp mlp;
    enum l3d_pos pos;
    struct l3d_rope rope; /* with pos L3D_POS_ROPE */
    bool no_bias;    /* no biases in the linear layers and norms (Llama); GPT-2 has them */
    bool untied;     /* a separate output head (lm_head) instead of the token embedding (Llama) */
    struct l3d_moe_spec moe; /* experts 0: dense */
    /* QK-norm (Qwen3; Dehghani et al. 2023 for ViT-22B, Wortsman et al. 2023): each query and key
     * head RMSNorm-ed over its hd elements (epsilon norm_eps) after the q|k|v product and before
     * RoPE, one weight vector qnormw (hd) for every query head and knormw (hd) for every key
     * head of a layer */
    bool qk_norm;
    /* A head's size hd (Qwen3 sets it apart from the channels: hidden 2048, 32 heads of 128);
     * 0: C / NH. The q|k|v product has (NH + 2 NKV) hd rows, the attention output NH hd
     * channels and the output projection (C, NH hd). Read it through l3d_model_head_dim. */
    int head_dim;
};

/* Checks sizes (C divisible by NH, positive values) and the architecture's rules (NH divisible
 * by NKV, an even head size for RoPE, ...), sets Vp and fills the defaults (ffn 4C for GELU,
 * norm_eps 1e-5, rope theta 10000). NKV stays 0 for "as many as NH" (so a --heads given after a
 * preset still means multi-head attention): read it through l3d_model_kv_heads. */
l3d_status l3d_gpt_config_finish(struct l3d_model_spec *cfg);
/* Key/value heads: NKV, or NH when NKV is 0. */
int l3d_model_kv_heads(const struct l3d_model_spec *m);
/* A head's size: head_dim, or C / NH when head_dim is 0 (0 when NH is). */
int l3d_model_head_dim(const struct l3d_model_spec *m);
/* Parameters of the whole model (every tensor, the padded vocabulary's rows included). */
double l3d_model_param_count(const struct l3d_model_spec *m);
/* The parameters one token uses: the whole model's but the (experts - top_k) experts of each MoE
 * layer it does not reach (the count MFU is quoted on); the whole count for a dense model. */
double l3d_model_active_param_count(const struct l3d_model_spec *m);
/* The mixture-of-experts fields' rules (src/model/moe.c): experts >= 0; with experts > 0,
 * 1 <= top_k <= experts, ffn >= 0, shared >= 0, dense_layers <= L, finite coefficients >= 0 and a
 * capacity factor >= 0; with experts 0, every other field unset. L3D_ERR_ARG naming the flag. */
l3d_status l3d_moe_spec_check(const struct l3d_model_spec *m);
/* Whether global layer l is a mixture-of-experts layer. */
bool l3d_model_moe_layer(const struct l3d_model_spec *m, int l);
/* The family's blocks on a spec (its sizes kept), as its row (include/llm3d/arch.h) says: GPT-2's
 * (every architecture field zero), or Llama's (RMSNorm, SwiGLU, RoPE, no biases, untied head;
 * NKV, ffn, eps and theta as they are). */
void l3d_model_set_arch(struct l3d_model_spec *m, enum l3d_arch arch);
/* The family's row's name ("gpt2", "llama"), and back (false for another name). */
const char *l3d_arch_name(enum l3d_arch arch);
bool l3d_arch_parse(const char *name, enum l3d_arch *out);
/* Whether two finished specs have the same sizes and architecture (every field but the name). */
bool l3d_model_same(const struct l3d_model_spec *a, const struct l3d_model_spec *b);
/* The part of l3d_model_same that decides each tensor's name and shape in a file, the padded
 * vocabulary aside (a file holds V rows; Vp is the trainer's): sizes, family, KV heads, norm,
 * MLP, positions, biases and tying; not Vp, the norm's epsilon or RoPE's scaling. */
bool l3d_model_same_shapes(const struct l3d_model_spec *a, const struct l3d_model_spec *b);
/* Whether a spec has GPT-2's blocks: a family llm.c's files hold (GPT-2) with its row's blocks
 * (LayerNorm, GELU, learned positions, biases, tied head) and a KV head per head, whatever its MLP
 * width and epsilon. */
bool l3d_model_gpt2_blocks(const struct l3d_model_spec *m);
/* Whether a finished spec is plain GPT-2 (every architecture field at its GPT-2 value: its blocks,
 * an MLP of 4 C and epsilon 1e-5), which llm.c's files and the manifests of earlier versions
 * describe without an architecture record. */
bool l3d_model_is_gpt2(const struct l3d_model_spec *m);
/* The rotary embedding's inverse frequencies, out (HS/2 floats, HS = l3d_model_head_dim, host
 * memory):
 * theta^(-2i/HS) for pair i, with Llama 3.1's scaling when rope.factor > 0 (src/model/rope.c gives
 * the formula and its source); theta 0 means 10000. The table l3d_be_rope_forward takes. */
void l3d_rope_inv_freq(const struct l3d_model_spec *m, float *out);

struct l3d_shard {
    int layer_start, layer_count; /* layers [layer_start, layer_start + layer_count) */
    int head_start, head_count;   /* attention heads */
    int64_t ffn_start, ffn_count; /* columns of the MLP's hidden layer (of ffn; SwiGLU: of its
                                   * gate and, the same columns, of its up projection) */
    int64_t vocab_start, vocab_count; /* rows of the padded vocabulary */
    bool has_embedding;  /* token + position embedding (first pipeline stage) */
    bool has_head;       /* final LayerNorm, tied LM head and loss (last pipeline stage) */
    bool adds_row_bias;  /* adds the biases of row-parallel layers (one rank of a TP group) */
    /* Sequence parallelism (Korthikanti et al. 2022): with sp_size > 1 the LayerNorm and residual
     * regions hold rows [sp_rank N/sp_size, (sp_rank+1) N/sp_size) of the N = B*T rows only. */
    int sp_size, sp_rank;
    /* Expert parallelism: the MoE experts [expert_start, expert_start + expert_count) this rank
     * holds (l3d_shard_set_experts; all of them otherwise); the router keeps all E rows. */
    int expert_start, expert_count;
    /* Rows of the head's chunked cross-entropy (--xent-chunk, l3d_gpt_xent_rows): 0 for all of
     * them, the unchunked head. */
    int64_t xent_rows;
    /* The TP group's partial sums in fp32 (--tp-reduce-dtype fp32; src/model/tpsum.c): the
     * row-parallel outputs and column-parallel input gradients made, summed and only then
     * rounded to a 16-bit model's type. Nothing in fp32 or without TP (set only with tp > 1). */
    bool tp_reduce_f32;
};

/* The experts of EP rank ep_rank of ep (ep divides moe.experts, 0 reads as 1; a dense model:
 * unchanged). */
void l3d_shard_set_experts(const struct l3d_model_spec *cfg, struct l3d_shard *sh, int ep,
                           int ep_rank);

struct l3d_shard l3d_shard_full(const struct l3d_model_spec *cfg);
/* Checks that the shard lies inside the model and is not empty where it must not be. */
l3d_status l3d_shard_check(const struct l3d_model_spec *cfg, const struct l3d_shard *sh);

enum l3d_tensor_id {
    L3D_T_WTE, L3D_T_WPE, L3D_T_LN1W, L3D_T_LN1B, L3D_T_QKVW, L3D_T_QKVB, L3D_T_ATTPROJW,
    L3D_T_ATTPROJB, L3D_T_LN2W, L3D_T_LN2B, L3D_T_FCW, L3D_T_FCB, L3D_T_FCPROJW, L3D_T_FCPROJB,
    L3D_T_LNFW, L3D_T_LNFB, L3D_T_LMHEAD,
    /* mixture of experts (layers moe.dense_layers..L-1 of the shard only; E experts, expert
     * width F, its first product's rows Fm = F or 2F with SwiGLU, shared width S F):
     * router (Lm,E,C); expfcw (Lm,E Fm,C): expert e's rows e Fm .. (e+1) Fm - 1, laid out as
     * fcw (SwiGLU: gate rows then up rows); expfcb (Lm,1,E Fm); expprojw (Lm,E C,F): expert e's
     * rows e C ..; expprojb (Lm,1,E C); the shared MLP shfcw (Lm,S Fm,C) shfcb (Lm,1,S Fm)
     * shprojw (Lm,C,S F) shprojb (Lm,1,C) */
    L3D_T_ROUTER, L3D_T_EXPFCW, L3D_T_EXPFCB, L3D_T_EXPPROJW, L3D_T_EXPPROJB, L3D_T_SHFCW,
    L3D_T_SHFCB, L3D_T_SHPROJW, L3D_T_SHPROJB,
    /* QK-norm (qk_norm): qnormw (L,1,hd), knormw (L,1,hd), replicated over tensor parallelism */
    L3D_T_QNORMW, L3D_T_KNORMW,
};

/* Whether tensor t is one of the routed experts' (expfcw, expfcb, expprojw, expprojb). */
static inline bool l3d_gpt_expert_tensor(int t) {
    return t == L3D_T_EXPFCW || t == L3D_T_EXPFCB || t == L3D_T_EXPPROJW || t == L3D_T_EXPPROJB;
}

/* Whether the architecture has tensor t (GPT-2: the 16 of llm.c; Llama: wte, ln1w, qkvw,
 * attprojw, ln2w, fcw, fcprojw, lnfw, and lmhead when untied). A tensor it lacks has no elements
 * in any shard; the table keeps its slot so that ids stay fixed. */
bool l3d_gpt_tensor_used(const struct l3d_model_spec *cfg, int t);
/* A shard's key/value heads: its query heads' groups (tp divides NKV, l3d_tp_shard). */
int l3d_shard_kv_start(const struct l3d_model_spec *cfg, const struct l3d_shard *sh);
int l3d_shard_kv_count(const struct l3d_model_spec *cfg, const struct l3d_shard *sh);

struct l3d_tensor_info {
    const char *name;   /* llm.c's name */
    int64_t offset;     /* in elements, into the flat params / grads / moment buffers */
    int64_t count;      /* elements held by this shard (0 if none) */
    enum l3d_dtype dtype; /* element type in the parameter buffer (the model's dt) */
    size_t bytes;       /* count * l3d_dtype_size(dtype) */
    int64_t layers, rows, cols; /* local shape: (layers, rows, cols); layers 1 for non-layer */
    bool decay;         /* weight decay applies (matrices: 2-D tensors, as in llm.c / nanoGPT) */
};

/* Hooks the parallel layers install; a NULL hook is a no-op (tp = 1, dp = 1). Buffers hold n
 * elements of type dt: the model's activation type (16 bits in mixed precision, which is what
 * Megatron-LM's TP collectives move), or L3D_F32 for the cross-entropy statistics and the
 * LayerNorm weight gradients. */
struct l3d_gpt_hooks {
    void *ctx;
    /* In-place sum over the tensor-parallel group. */
    void (*tp_all_reduce)(void *ctx, void *buf, int64_t n, enum l3d_dtype dt);
    /* In-place max over the tensor-parallel group (vocabulary-parallel cross-entropy). */
    void (*tp_all_reduce_max)(void *ctx, void *buf, int64_t n, enum l3d_dtype dt);
    /* Optional non-blocking form of tp_all_reduce, one in flight at a time: begin, then end waits.
     * Backward overlaps the input-gradient sum with the weight-gradient product through it. */
    void (*tp_all_reduce_begin)(void *ctx, void *buf, int64_t n, enum l3d_dtype dt);
    void (*tp_all_reduce_end)(void *ctx);
    /* Sequence parallelism: full (size x n) <- every rank's local (n); local (n) <- this rank's
     * block of the sum of full over the group. */
    void (*tp_all_gather)(void *ctx, const void *local, void *full, int64_t n, enum l3d_dtype dt);
    void (*tp_reduce_scatter)(void *ctx, const void *full, void *local, int64_t n,
                              enum l3d_dtype dt);
    /* Called by backward when the gradients of local layer `layer` are final for this micro-batch,
     * and with layer -1 at the end, when those of the non-layer tensors (wte, wpe, lnf) are. In
     * gradient-slot mode it must not return before the slot of layer + 1 may be reused. */
    void *grads_ctx;
    void (*grads_ready)(void *ctx, int layer);
    /* Called by backward between kernels (with grads_ctx): lets the communication started by
     * grads_ready progress while the next kernels compute (see l3d_dp_poll_kernels). */
    void (*progress)(void *ctx);
    /* Context parallelism (src/parallel/cp.c, docs/DESIGN.md "Context parallelism"): cp_size > 1
     * ranks share each sequence; this rank's T rows are chunks cp_rank and 2 cp_size - 1 - cp_rank
     * of its 2 cp_size chunks of T / 2 rows (l3d_cp_chunk_start), whose positions the embedding
     * takes, and attention runs round the ring through these two hooks (with cp_ctx) in place of
     * the backend's kernels: qkv rows [NH q | NKV k | NKV v] heads of HS. */
    int cp_size, cp_rank;
    void *cp_ctx;
    l3d_attention_forward_fn *cp_attention_forward;
    l3d_attention_backward_fn *cp_attention_backward;
    /* ZeRO-3 (include/llm3d/dp.h; a model built with L3D_GRADS_SHARDED holds no parameters):
     * before forward or backward (backward true) uses the parameters of local layer `layer` (-1:
     * the non-layer tensors, for the whole pass) it asks params_get where they lie: a buffer laid
     * out as the gradient slots (slot_off; nonlayer_off for -1), valid until params_done(layer).
     * A recomputed forward inside backward reuses backward's buffer. */
    void *params_ctx;
    const void *(*params_get)(void *ctx, int layer, bool backward);
    void (*params_done)(void *ctx, int layer, bool backward);
    /* Expert parallelism (src/parallel/ep.c; a shard holding some of the experts): the blocking
     * all-to-all over the EP group that dispatches token rows to their experts' ranks and
     * combines them back (comm.h's all_to_allv, counts and displacements in elements of dt). */
    void *ep_ctx;
    void (*ep_all_to_allv)(void *ctx, const void *send, const int64_t *scounts,
                           const int64_t *sdispls, void *recv, const int64_t *rcounts,
                           const int64_t *rdispls, enum l3d_dtype dt);
    /* The ranks that split each micro-batch's tokens (the context-parallel ring; tok_split of
     * them, 1: none): the router's per-expert counts of a MoE layer are summed over them
     * (tok_sum, in place, with tok_ctx), so that Switch's load-balancing loss and its gradient see
     * the micro-batch's whole f_i as on one rank (Megatron-Core sums tokens_per_expert over its
     * tp x cp group the same way); with a capacity, every chunk's counts are summed the same
     * way for the drop decision's starting fills (src/model/moe.c, ring_fills). */
    int tok_split;
    void *tok_ctx;
    void (*tok_sum)(void *ctx, float *buf, int64_t n);
};
/* Context parallelism: the position of the first row of chunk k (0 or 1) of the T rows rank
 * cp_rank of cp holds, Megatron-LM's load-balanced causal split: chunk cp_rank and chunk
 * 2 cp - 1 - cp_rank of T / 2 rows each (every rank then has the same attention work). */
int64_t l3d_cp_chunk_start(int cp, int cp_rank, int k, int64_t T);

struct l3d_gpt_acts; /* activation pointer table, private to the model */
struct l3d_moe_state; /* the MoE layers' state, private to the model (src/model/moe.c) */
struct l3d_qknorm_state; /* QK-norm's state, private to the model (src/model/qknorm.c) */
struct l3d_tpsum_state; /* the fp32 TP sums' buffers, private to the model (src/model/tpsum.c) */

/* Activation recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
 * Transformer Models"): keep every layer's activations (none), all but the attention
 * probabilities, recomputed from q and k in backward (selective), or only each layer's input,
 * the whole layer recomputed in backward (full). Same results in every mode. The tiled attention
 * kernel (the default) keeps no probabilities, only a log-sum-exp per query row, and its backward
 * recomputes the scores anyway: selective then keeps and recomputes what none does (it differs
 * from none only under the benchmark's materialising kernel, L3D_ATTENTION=naive). */
enum l3d_recompute { L3D_RECOMPUTE_NONE, L3D_RECOMPUTE_SELECTIVE, L3D_RECOMPUTE_FULL };

struct l3d_gpt {
    struct l3d_model_spec cfg;
    struct l3d_shard shard;
    struct l3d_backend *be;
    struct l3d_gpt_hooks hooks;
    int Bmax, Tmax;       /* sizes the activations were planned for */
    int act_slots, slot;  /* micro-batches whose activations can be kept at once; current one */
    bool head_once;       /* the head's activations once, not per slot (l3d_gpt_split_init) */
    enum l3d_recompute recompute;
    bool attn_naive;      /* L3D_ATTENTION=naive: the materialising kernel (benchmark, oracle) */
    int64_t num_params;   /* elements in this shard */
    /* Precision: the type of the parameters and activations (L3D_F32, or L3D_BF16 / L3D_F16 for
     * mixed precision: the matrix products' operands in 16 bits, every reduction in fp32);
     * gradients are always fp32 (Megatron-LM's main_grad, accumulated over micro-batches without
     * 16-bit rounding), as are LayerNorm statistics, the attention log-sum-exp and the loss. */
    enum l3d_dtype dt;
    size_t es;            /* l3d_dtype_size(dt) */
    struct l3d_tensor_info tensors[L3D_NUM_TENSORS];
    /* Device memory of `be` (include/llm3d/backend.h): host code reaches it only by copies. */
    void *params;         /* flat, num_params of type dt; NULL with L3D_GRADS_SHARDED */
    /* L3D_GRADS_SHARDED: the buffers params_get gave for layer `gathered_id` and the non-layer
     * tensors, where l3d_gpt_param_ptr points while a pass runs */
    const void *gathered_layer, *gathered_nonlayer;
    int gathered_id;
    float *grads;         /* flat, num_params, same offsets (L3D_GRADS_FLAT only) */
    /* Gradient-slot mode (ZeRO-2): the non-layer tensors' gradients in one buffer, each layer's in
     * one of two slots (layer % 2) holding its one-layer slices of the 12 layer tensors. */
    float *grads_nonlayer;
    float *grad_slot[2];
    int64_t slot_size, slot_off[L3D_NUM_TENSORS], nonlayer_size, nonlayer_off[L3D_NUM_TENSORS];
    struct l3d_gpt_acts *acts;
    struct l3d_moe_state *moe; /* the MoE layers' activations and statistics (src/model/moe.c) */
    struct l3d_qknorm_state *qkn; /* QK-norm's activations (src/model/qknorm.c); NULL without */
    struct l3d_tpsum_state *tp32; /* fp32 TP sums (src/model/tpsum.c); NULL unless shard's
                                   * tp_reduce_f32 in 16-bit precision */
    /* activations of type dt */
    void *input_act;      /* (B,T,C): the stage input when !has_embedding, else the embedding */
    void *dinput_act;     /* (B,T,C): gradient of the stage input after backward */
    float *losses;        /* (B,T) per-token loss of the last forward with targets */
    /* The local vocabulary slice of the logits: (B,T,Vl) of the last forward when xent_rows
     * covers Bmax x Tmax (unchunked), else one chunk of xent_rows rows, which the head's forward
     * and backward fill and reuse a chunk at a time (l3d_gpt_xent_rows); after a forward
     * without targets it holds the rows from logits_row0 to the last (all, or the last chunk). */
    void *logits;
    int64_t xent_rows;    /* rows of logits at once (the cross-entropy chunk) */
    int64_t logits_row0;  /* the first row m->logits holds after a forward without targets */
    size_t act_bytes;     /* bytes of activations and backward scratch */
    int32_t *inputs;      /* (B,T) copy of the last forward's tokens, for backward */
    int32_t *targets;     /* (B,T) copy of its targets */
    double *loss_sum;     /* one double: the summed loss of the last forward */
    /* Rotary positions (pos L3D_POS_ROPE): inv_freq (hd/2 fp32, l3d_rope_inv_freq) and the
     * position of each of the Tmax rows of a sequence (int32, 0..Tmax-1 unless a caller such as
     * context parallelism writes others), device memory; NULL without RoPE. */
    float *rope_inv_freq;
    int32_t *rope_pos;
    int rope_cp_T; /* the T whose context-parallel positions rope_pos holds (0: none yet) */
    bool has_targets;
    int B, T;             /* sizes of the last forward */
    /* Split backward (l3d_gpt_split_init): per W slot, each layer's output gradients of its
     * products and norms, kept from l3d_gpt_backward_input to l3d_gpt_backward_weight. */
    void *wstash;
    void *wnorm;          /* gradient slots (ZeRO-2/3): B's norm weight gradients per W slot */
    int64_t wstash_layer; /* bytes of one layer's stash; a W slot holds layer_count of them */
    int wstash_slots, wslot; /* W slots (micro-batches between B and W at once); current one */
};

/* Where gradients live: one flat buffer (the default), two layer slots plus the non-layer
 * tensors (ZeRO-2, see l3d_gpt_grad_ptr), or nowhere (inference). L3D_GRADS_SHARDED (ZeRO-3):
 * slots as ZeRO-2, and no parameter buffer: the passes take them from hooks.params_get. */
enum l3d_grad_mode { L3D_GRADS_FLAT, L3D_GRADS_SLOTS, L3D_GRADS_NONE, L3D_GRADS_SHARDED };

/* Allocates parameters, gradients and activations for micro-batches up to (B, T), once. */
l3d_status l3d_gpt_init(struct l3d_gpt **out, const struct l3d_model_spec *cfg,
                        const struct l3d_shard *sh, struct l3d_backend *be, int B, int T,
                        enum l3d_grad_mode grads);
/* The same with act_slots sets of saved activations (a pipeline stage keeps several micro-batches
 * between their forward and backward; l3d_gpt_use_slot chooses the one that forward, backward,
 * input_act, dinput_act, logits and the output act on) and a recomputation mode. */
l3d_status l3d_gpt_init_ex(struct l3d_gpt **out, const struct l3d_model_spec *cfg,
                           const struct l3d_shard *sh, struct l3d_backend *be, int B, int T,
                           enum l3d_grad_mode grads, int act_slots, enum l3d_recompute recompute);
/* The same in precision dt (L3D_F32, L3D_BF16 or L3D_F16): parameters and activations of that
 * type, gradients fp32. The materialising attention kernel (L3D_ATTENTION=naive) is fp32 only. */
l3d_status l3d_gpt_init_dt(struct l3d_gpt **out, const struct l3d_model_spec *cfg,
                           const struct l3d_shard *sh, struct l3d_backend *be, int B, int T,
                           enum l3d_grad_mode grads, int act_slots, enum l3d_recompute recompute,
                           enum l3d_dtype dt);
/* An fp32 view of m: a copy of its struct whose parameters are the fp32 buffer p (num_params,
 * device memory), for code that reads or writes fp32 parameters (initialisation, checkpoints,
 * llm.c files) whatever m's precision; it shares m's activations and must not run or be freed. */
void l3d_gpt_fp32_view(const struct l3d_gpt *m, float *p, struct l3d_gpt *view);
/* Where tensor t's parameters of local layer `layer` lie in m->params (type m->dt); without
 * m->params (L3D_GRADS_SHARDED), in the buffer params_get gave for the pass. */
void *l3d_gpt_param_ptr(const struct l3d_gpt *m, int t, int layer);
void l3d_gpt_use_slot(struct l3d_gpt *m, int slot);
void l3d_gpt_free(struct l3d_gpt *m);
/* Activation bytes of a shard in closed form (what m->act_bytes holds, up to 64-byte alignment of
 * each buffer): per layer and micro-batch, in fp32 with s = T, b = B, h = C, a = heads, t = TP size
 * and p = 1 or t with sequence parallelism (Korthikanti et al. 2022, sec. 4, adapted: no dropout,
 * LayerNorm statistics kept instead of inputs, 4-byte values), with the tiled attention kernel
 * (flash; Dao et al. 2022), which keeps one log-sum-exp per query row and head:
 *   none, selective  4 (s b h (2 + 12/t + 2/p) + a s b / t + 4 s b / p)
 *   full             4 s b h / p                       (the layer's input only)
 * and with the materialising kernel (flash false: L3D_ATTENTION=naive, the benchmark's oracle)
 * the a s b / t term becomes a s^2 b / t, which selective drops, plus an a s^2 b / t scratch
 * for its backward. Times act_slots micro-batches, plus the stage's input, head and token buffers
 * per slot and one layer's backward (and recomputation) buffers shared by all slots. QK-norm adds
 * (src/model/qknorm.c, l3d_qknorm_act_bytes) per layer and slot (one set under full
 * recomputation) the product's output before the norm and its rstd, E s b q + 4 s b (a + k) / t
 * with q the local q|k|v width and k the KV heads (E: the element size), and one layer's four
 * (s b, q) scratch buffers, its row maps (3 s b (a + 2k) / t int32) and 2 hd fp32. The fp32 TP
 * sums (the shard's tp_reduce_f32 in 16 bits; src/model/tpsum.c, l3d_tpsum_act_bytes) add 4 bytes
 * times: s b by the widest local product of the layers (at least h), h by that width or the
 * vocabulary slice, s b h, s b h / p under SP, and h. */
size_t l3d_gpt_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                         int T, int act_slots, enum l3d_recompute recompute, bool flash);
/* The same in precision dt: the activations of type dt take l3d_dtype_size(dt) bytes, the fp32
 * statistics (LayerNorm mean and rstd, log-sum-exp, loss terms) and the tokens 4 (as above). */
/* The head's activations of one slot in closed form (final LayerNorm, its gathered copy under SP,
 * the logits slice when unchunked (l3d_gpt_xent_rows below B x T: one chunk of them in the shared
 * region instead, which l3d_gpt_act_bytes_dt counts), the loss statistics; not the per-token
 * losses): 0 without the head. */
size_t l3d_gpt_head_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                              int T, enum l3d_dtype dt);
size_t l3d_gpt_act_bytes_dt(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                            int T, int act_slots, enum l3d_recompute recompute, bool flash,
                            enum l3d_dtype dt);

/* The cross-entropy chunk: the head's logits are computed a chunk of rows at a time, the loss
 * statistics and, in backward, the dlogits and both products'
 * gradients of one chunk of rows before the next (Liger-kernel's fused linear cross-entropy, over
 * rows: each row's whole local vocabulary is in its chunk, the tp statistics combine per chunk).
 * l3d_gpt_xent_rows: the rows of a chunk for a shard and Bmax x Tmax = BT rows: the shard's
 * xent_rows (--xent-chunk), at most BT; 0 (the default) is BT: one chunk, the unchunked head, the
 * logits kept from forward to backward. Chunks trade the logits' memory for the head's forward
 * product once more, and thin products ran 2-3x slower here (docs/BENCHMARKS.md): opt-in. */
int64_t l3d_gpt_xent_rows(const struct l3d_shard *sh, int64_t BT);

/* Normal(0, 0.02) matrices, residual projections scaled by 1/sqrt(2L) (GPT-2 paper, sec. 2.3),
 * LayerNorm weights 1, biases 0, padding rows of wte 0. Each element's value depends only on
 * (seed, tensor, its index in the full tensor), so every layout initialises the same model. */
void l3d_gpt_init_weights(struct l3d_gpt *m, uint64_t seed);
/* Elements [lo, lo + n) of the flat fp32 parameters l3d_gpt_init_weights gives m's shard, into
 * dst (n floats of m's backend; every element depends on the seed and its index only): ZeRO-3
 * initialises its range this way, with no whole copy (m needs no parameter buffer). */
/* The host staging the initialisation computes its values in, a block at a time (allocated
 * for the call, after the optimizer state: at the memory peak; the plan's transients). */
#define L3D_GPT_INIT_BLOCK_BYTES ((size_t)16384 * sizeof(float))
void l3d_gpt_init_weights_range(const struct l3d_gpt *m, uint64_t seed, int64_t lo, int64_t n,
                                float *dst);

/* Forward of a micro-batch. inputs (B,T) token ids (read when has_embedding; otherwise input_act
 * holds the stage input), targets (B,T) or NULL. Returns the mean loss over the B*T tokens when
 * targets are given and the shard has the head, else 0. */
float l3d_gpt_forward(struct l3d_gpt *m, const int32_t *inputs, const int32_t *targets, int B,
                      int T);
/* Backward of the last forward (which had targets); parameter gradients accumulate (+=) into
 * m->grads. dloss is the weight of each token's loss in the objective: 1/(B*T*micro-batches).
 * For a shard without the head, dout_act (B,T,C) is the gradient of its output (else NULL). */
void l3d_gpt_backward(struct l3d_gpt *m, float dloss, const void *dout_act);
/* The same backward in two calls (zero-bubble pipelines, Qi et al. 2024): B, the input gradient
 * (what the previous stage waits for; the head's, the embedding's and a MoE layer's weight
 * gradients come with it), then, possibly after other micro-batches' passes, W: the transformer
 * layers' products' weight gradients (dW = x^T dy of each product, and the biases'; the norms'
 * weights come with B) from the slot's saved activations and the output gradients B stashed in
 * the slot, over the activations B read for the last time (no memory beyond the slot's). Both act
 * on the current slot (l3d_gpt_use_slot); W of a slot before its next forward. B then W leaves
 * the gradients bit for bit as l3d_gpt_backward (the products are the same calls, split). Under
 * full recomputation (the slot holds the layer outputs only) W rebuilds the layer's forward again
 * and the output gradients wait in a stash of wslots W slots: wslot 0 .. wslots - 1 (a
 * micro-batch's own until its W: the schedule's micro % wslots, first in first out; ignored
 * otherwise). grads_ready fires per layer from W.
 * head_once (the schedule runs each micro-batch's B on the head's stage before the next forward:
 * l3d_pp_fb_slots 1) lays the head's activations out once, not per slot: the stage keeps up to
 * pp micro-batches to W under ZB-H1 (1F1B: 1), and the logits of each would cost it more than
 * 1F1B's fullest stage; l3d_gpt_act_bytes_dt less (slots - 1) l3d_gpt_head_act_bytes.
 * With gradient slots (ZeRO-2/3, grad_slots) B keeps the norms' weight gradients (4 C fp32 a
 * layer and W slot) and W zeroes the layer's slot, puts them in with the products' and fires
 * grads_ready, as the fused backward does per micro-batch.
 * l3d_gpt_split_init allocates the stash (l3d_gpt_wstash_bytes, 0 without full recomputation or
 * gradient slots): L3D_ERR_OOM;
 * L3D_ERR_ARG for a MoE model with gradient slots (its experts' gradients come in B) or with full
 * recomputation (W's rebuilt forward would rerun the experts). */
l3d_status l3d_gpt_split_init(struct l3d_gpt *m, int wslots, bool head_once);
void l3d_gpt_backward_input(struct l3d_gpt *m, float dloss, const void *dout_act, int wslot);
void l3d_gpt_backward_weight(struct l3d_gpt *m, int wslot);
size_t l3d_gpt_wstash_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                            int T, int wslots, enum l3d_recompute recompute, bool grad_slots,
                            enum l3d_dtype dt);
void l3d_gpt_zero_grad(struct l3d_gpt *m);
/* Where the gradient of tensor `t`, local layer `layer` (0 for non-layer tensors) lies, holding
 * rows*cols elements for a layer tensor or count for the others. */
float *l3d_gpt_grad_ptr(const struct l3d_gpt *m, int t, int layer);
/* Fills the tensor table of a shard (offsets, local shapes) and returns its element count. */
int64_t l3d_gpt_plan_tensors(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                             struct l3d_tensor_info tensors[L3D_NUM_TENSORS]);
/* Places a shard's parameters (src, laid out by l3d_gpt_plan_tensors for sh) at their positions in
 * the full model's flat buffer (full): gathering tensor-parallel shards into one llm.c model. */
void l3d_gpt_shard_to_full(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                           const float *src, float *full);
/* The reverse: a shard's parameters (dst) cut from the full model's flat buffer. */
void l3d_gpt_full_to_shard(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                           const float *full, float *dst);
/* Where shard sh holds full rows [R0, R1) of tensor t's layer `layer` (0 for a non-layer
 * tensor): its local rows [*r0, *r1) (every local column), from flat offset *off of its
 * parameters. false when it holds none of them. */
bool l3d_gpt_shard_rows(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                        int64_t layer, int64_t R0, int64_t R1, int64_t *off, int64_t *r0,
                        int64_t *r1);
/* Places local rows [r0, r1) of sh's tensor t (src, (r1 - r0, local cols)) into dst, full rows
 * from R0 on of one layer of the full tensor ((rows, full cols)). */
void l3d_gpt_shard_place(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                         int64_t r0, int64_t r1, const float *src, int64_t R0, float *dst);
/* Where element (r, c) of a layer of shard sh's tensor t lies in that layer of the full model's
 * tensor: row *gr, column *gc (the mapping of the two above). Along r, *gr only grows. */
void l3d_gpt_global_rc(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                       int64_t r, int64_t c, int64_t *gr, int64_t *gc);
/* Whether tensor t is one of the per-layer tensors (the 12 of llm.c, and the MoE ones). */
bool l3d_gpt_is_layer_tensor(int t);
/* Which of tensor t's layers holds local layer `layer` of shard sh: layer itself for every tensor
 * of a dense model; with experts, the dense MLP's tensors (fcw, fcb, fcprojw, fcprojb) hold the
 * shard's leading dense layers only and the MoE tensors its MoE layers only (the index among
 * them); -1 when tensor t has no part in that layer. */
int64_t l3d_gpt_tensor_layer(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int t,
                             int layer);
/* The index, among the full model's layers of tensor t, of shard sh's first layer of t (0 for a
 * non-layer tensor; a pipeline stage's MoE tensors count the model's MoE layers, from
 * moe.dense_layers, and its dense MLP tensors the leading dense ones). */
int64_t l3d_gpt_tensor_first(const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                             int t);
/* Mixture-of-experts statistics of the forwards since the last take (a full recomputation's
 * forward inside backward not counted), as l3d_model_moe_stats_len doubles laid out for the whole
 * model, so that a rank can sum them with its data-parallel peers' and the other pipeline
 * stages': per MoE layer of the model and expert, the assignments routed to it (before any drop;
 * layers x experts), then the sums over forwards and layers of the load-balancing and z losses
 * (unscaled by their coefficients), the assignments dropped and the forwards counted (by the
 * shard holding the model's first MoE layer). 0 doubles for a dense model. Take adds the shard's
 * into out (its layers' rows; the caller zeroes out once for all its chunks) and resets. */
int64_t l3d_model_moe_stats_len(const struct l3d_model_spec *cfg);
void l3d_gpt_moe_stats_take(struct l3d_gpt *m, double *out);
/* A stats vector (summed over ranks or not) in words: the mean over layers and forwards of the
 * two losses, the dropped assignments, and each layer's load (its largest expert's assignments
 * over the mean per expert; 1: balanced) into load (layers doubles; NULL: not wanted), the
 * largest in load_max. */
struct l3d_moe_summary {
    double aux, z, dropped, load_max;
};
void l3d_moe_summarize(const double *stats, int layers, int experts, double *load,
                       struct l3d_moe_summary *out);
/* MoE layers of a shard. */
int l3d_shard_moe_layers(const struct l3d_model_spec *cfg, const struct l3d_shard *sh);

/* Output of the shard's last layer (B,T,C) of the last forward (what a pipeline stage sends). */
const void *l3d_gpt_output_act(const struct l3d_gpt *m);

/* Parameter count of the full model, and the model FLOPs per token of a training step:
 * 6N + 12 L C T (PaLM, Chowdhery et al. 2022, appendix B), N = every parameter but the position
 * embedding (which takes part in no matrix product), the LM head counted through the tied wte. */
int64_t l3d_gpt_param_count(const struct l3d_model_spec *cfg);
double l3d_gpt_flops_per_token(const struct l3d_model_spec *cfg, int T);

#endif
