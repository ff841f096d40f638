/*
 * llm3d model families as data: one row per family (src/model/arch.c) says its name, its Hugging
 * Face model_type and architecture, the keys of its config.json, the names and layouts of its
 * Hugging Face tensors over llm3d's tensor table, the blocks it uses and whether llm.c's files hold
 * it. src/ckpt/hf.c, src/ckpt/llmc.c, src/cli/inspect.c, src/cli/flags.c, src/cli/plan.c and the
 * presets read the row; the kernels read the blocks (struct l3d_model_spec's norm, mlp, pos, ...),
 * never the family. Adding a family is a row here plus the kernels of any block it adds.
 *
 *   const struct l3d_arch_info *a = l3d_arch_by_hf_type("llama");  // NULL: not a family
 *   l3d_model_set_arch(&spec, a->arch);                            // its blocks on the spec
 */
#ifndef LLM3D_ARCH_H
#define LLM3D_ARCH_H

#include <stddef.h>

#include "llm3d/model.h"

/* A size in a family's tensor map, from the spec: hs = l3d_model_head_dim, F = ffn, KV = key/value
 * heads. */
enum l3d_arch_dim {
    L3D_DIM_0, L3D_DIM_1, L3D_DIM_C, L3D_DIM_3C, L3D_DIM_F, L3D_DIM_2F,
    L3D_DIM_V,    /* the vocabulary (a file's rows) */
    L3D_DIM_VP,   /* the padded vocabulary (the table's rows) */
    L3D_DIM_T,    /* the context */
    L3D_DIM_Q,    /* NH hs: the query heads' rows */
    L3D_DIM_KV,   /* KV hs: one of the key and value blocks */
    L3D_DIM_Q_KV, /* NH hs + KV hs: where the value block starts */
    L3D_DIM_QKV,  /* (NH + 2 KV) hs: the fused q|k|v rows */
    /* mixture of experts (struct l3d_moe_spec): E experts of width FE */
    L3D_DIM_E,    /* the experts: the router's rows */
    L3D_DIM_FE,   /* an expert's width */
    L3D_DIM_2FE,  /* an expert's gate|up rows of expfcw (SwiGLU) */
    L3D_DIM_E2FE, /* expfcw's rows: E experts' gate|up blocks */
    L3D_DIM_EC,   /* expprojw's rows: E experts' (C, FE) blocks */
    L3D_DIM_HS,   /* hd: a head's size (QK-norm's weights) */
};

/* Which layers a per-layer tensor has a copy in: every layer, the dense-MLP layers, the
 * mixture-of-experts layers (once each, or once for each expert, "%d" twice: layer, expert). */
enum l3d_arch_part { L3D_PART_ALL, L3D_PART_DENSE, L3D_PART_MOE, L3D_PART_EXPERT };

/* One tensor of a family's Hugging Face checkpoint: rows [row0, row0 + rows) of llm3d's table
 * tensor `table`, which has (table_rows, cols) a layer. A fused tensor (GPT-2's c_attn: q|k|v)
 * takes all its rows; split ones (Llama's q_proj, k_proj, v_proj; gate_proj, up_proj) a block.
 * An expert's (part L3D_PART_EXPERT) starts estride rows further for each expert before it:
 * Mixtral's experts.M.w3 is rows [M 2FE + FE, M 2FE + 2FE) of expfcw. */
struct l3d_arch_tensor {
    const char *hf;     /* its name; "%d" for the layer in a per-layer one */
    const char *table;  /* llm3d's tensor (struct l3d_tensor_info's name) */
    bool layer;         /* one a layer */
    int ndim;           /* 1: a vector (rows 1), 2: a matrix */
    enum l3d_arch_dim row0, rows, table_rows, cols;
    bool transposed;    /* stored (cols, rows): GPT-2's Conv1D keeps its weights (in, out) */
    bool untied_only;   /* only with an untied head (lm_head) */
    enum l3d_arch_part part;    /* a per-layer one's layers */
    enum l3d_arch_dim estride;  /* L3D_PART_EXPERT: rows from one expert to the next */
};

/* What a key of config.json holds. */
enum l3d_arch_key_kind {
    L3D_KEY_LAYERS, L3D_KEY_CHANNELS, L3D_KEY_HEADS,
    L3D_KEY_KV_HEADS, /* absent or null: as many as the heads */
    L3D_KEY_HEAD_DIM, /* a head's size; absent or null: channels / heads */
    L3D_KEY_FFN,      /* with dflt 0, null for GPT-2's 4C */
    L3D_KEY_VOCAB, L3D_KEY_CONTEXT, L3D_KEY_EPS, L3D_KEY_THETA,
    L3D_KEY_ROPE_SCALING, /* null, or Llama 3.1's */
    L3D_KEY_TIED,     /* tie_word_embeddings, the row's head when absent */
    L3D_KEY_STRING,   /* one of values (the first written) */
    L3D_KEY_BOOL,     /* only the value need */
    /* mixture of experts */
    L3D_KEY_EXPERTS,  /* the routed experts, E */
    L3D_KEY_TOP_K,    /* experts a token */
    L3D_KEY_EXPERT_FFN, /* an expert's width; a row without an FFN key (Mixtral: no dense MLP)
                         * reads it as the model's MLP width too */
    L3D_KEY_NORM_TOPK,  /* a bool: the top-k weights renormalised; a row without one: true */
    L3D_KEY_AUX_COEF,   /* the load-balancing loss coefficient, honoured (read) and written as
                         * such when output_router_logits, HF's switch for the loss, is true */
    L3D_KEY_ROUTER_LOGITS, /* output_router_logits: aux_coef > 0 */
    L3D_KEY_ZERO,     /* a number llm3d honours only at 0 or null (Mixtral's router_jitter_noise) */
    L3D_KEY_NULL,     /* a value llm3d honours only as null or absent (sliding_window) */
    L3D_KEY_FIXED,    /* a whole number llm3d honours only at dflt, or absent (Qwen3-MoE's
                       * decoder_sparse_step 1: every layer has experts) */
    L3D_KEY_EMPTY,    /* a list llm3d honours only empty, null or absent (mlp_only_layers) */
};

#define L3D_KEY_READ 1
#define L3D_KEY_WRITE 2

/* A key of a family's config.json, read and written in the row's order. */
struct l3d_arch_key {
    const char *key;
    enum l3d_arch_key_kind kind;
    int io;             /* L3D_KEY_READ | L3D_KEY_WRITE */
    double dflt;        /* a number's value when absent (integers: also null); -1: required */
    const char *const *values; /* STRING: those accepted, NULL-terminated */
    bool need;          /* BOOL: the one value llm3d honours */
    const char *why;    /* STRING, BOOL: why another is refused */
};

struct l3d_arch_info {
    enum l3d_arch arch;
    const char *name;            /* "gpt2": --arch, manifests, messages */
    const char *title;           /* "GPT-2": prose */
    const char *hf_model_type;   /* config.json's "model_type" */
    const char *hf_architecture; /* config.json's "architectures" */
    /* a Hugging Face flavour of the family rather than the family itself: its models have
     * experts (moe), it reads as the family `arch` with its blocks (a row after the
     * L3D_ARCH_COUNT families; name, title and llm.c versions unused) */
    bool moe;
    /* a flavour whose attention has QK-norm (Qwen3: the spec's qk_norm) */
    bool qk_norm;
    /* the blocks (l3d_model_set_arch) */
    enum l3d_norm norm;
    enum l3d_mlp mlp;
    enum l3d_pos pos;
    bool no_bias, untied;
    /* llm.c's files (magic 20240326) of this family: versions of fp32 and bf16; 0: none (llm3d
     * writes such a model as its own 1003 / 1005, the blocks in the header) */
    int llmc_fp32, llmc_bf16;
    /* Hugging Face */
    const struct l3d_arch_key *hf_keys;       /* config.json; n_hf_keys of them */
    int n_hf_keys;
    const struct l3d_arch_tensor *hf_tensors; /* in the order a folder is written */
    int n_hf_tensors;
    const char *hf_prefix_optional; /* a prefix some files lack (GPT2Model's "transformer.") */
    const char *const *hf_ignored;  /* suffixes of non-weights files hold (NULL-terminated) */
};

/* The row of a family; NULL for a value that is none. */
const struct l3d_arch_info *l3d_arch_info(enum l3d_arch arch);
/* The row a Hugging Face folder of model m is written as: its family's, or the family's flavour
 * of its experts and QK-norm (Llama: Mixtral with experts, Qwen3 with QK-norm, Qwen3-MoE with
 * both); NULL when there is none (GPT-2 with experts or QK-norm). */
const struct l3d_arch_info *l3d_arch_hf_row(const struct l3d_model_spec *m);
/* Whether row a can hold model m (its experts' rules: Mixtral's renormalised top-k, no shared
 * experts, no dense layers); L3D_ERR_ARG naming the flag otherwise. */
l3d_status l3d_arch_hf_check(const struct l3d_arch_info *a, const struct l3d_model_spec *m);
/* The row by llm3d's name, by config.json's model_type, by its architectures entry (families and
 * flavours), by an llm.c file's version; NULL when no row has it. */
const struct l3d_arch_info *l3d_arch_by_name(const char *name);
const struct l3d_arch_info *l3d_arch_by_hf_type(const char *model_type);
const struct l3d_arch_info *l3d_arch_by_hf_architecture(const char *architecture);
const struct l3d_arch_info *l3d_arch_by_llmc_version(int version);
/* The families' names in enum order (L3D_ARCH_COUNT of them). */
const char *const *l3d_arch_names(void);
/* The families' names, "gpt2 or llama" (conj "or"), "gpt2 and llama" (conj "and"), or with hf
 * the model_type values of every row, flavours included ("gpt2, llama and mixtral"): into buf
 * (cap bytes), which it returns. */
const char *l3d_arch_list(char *buf, size_t cap, const char *conj, bool hf);
/* A size of the map for spec m. */
int64_t l3d_arch_dim(const struct l3d_model_spec *m, enum l3d_arch_dim d);
/* The key of kind k in a's config.json, or NULL. */
const struct l3d_arch_key *l3d_arch_key_of(const struct l3d_arch_info *a,
                                           enum l3d_arch_key_kind k);

#endif
