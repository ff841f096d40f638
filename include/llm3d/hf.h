/*
 * Hugging Face model folders: config.json and safetensors weights, read and written for every
 * architecture of the model spec (GPT2LMHeadModel and LlamaForCausalLM names; a Llama model with
 * experts as MixtralForCausalLM).
 *
 *   struct l3d_model_spec cfg;
 *   l3d_model_file_config("gpt2-hf/", &cfg);       // a folder, or an llm.c file: its sizes
 *   ... l3d_gpt_init(&m, &cfg, ...) ...
 *   l3d_model_file_load("gpt2-hf/", m);            // any shard, any layout
 *   l3d_hf_save("out/", &cfg, full, L3D_BF16, L3D_HF_SHARD_BYTES);  // from the full fp32 model
 *
 * A folder holds config.json and model.safetensors, or shards listed by
 * model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: file}}).
 *
 * safetensors (huggingface/safetensors, its README's format): an 8-byte little-endian header
 * length N, N bytes of a JSON object {"NAME": {"dtype": "F32", "shape": [..], "data_offsets":
 * [BEGIN, END]}, ..., "__metadata__": {string: string}}, then the data, offsets relative to its
 * start, tensors row-major little-endian. Read: F32, BF16, F16 (widened to fp32 exactly); any
 * other dtype of the format is refused when the tensor is needed. Checked before any tensor is
 * used: the header within the file (at most 100 MB, as the reference reader), each tensor's
 * offsets inside the data, its byte count equal to its shape's, no two tensors overlapping, no
 * byte after the last tensor's data, shapes and offsets integers written as such ("2.0" refused),
 * no NUL in a name, no key twice (the JSON reader).
 * Loading checks every shape against config.json and every weight for NaN and infinity; each
 * error names the file, the tensor and the value.
 *
 * Layout (the llm3d tensor table, include/llm3d/model.h, by name): GPT-2's Conv1D weights are
 * stored (in, out), the transpose of llm3d's (out, in): transformer.h.N.attn.c_attn.weight (C, 3C)
 * is qkvw (3C, C) transposed; HF's vocabulary is unpadded (V rows of wte; llm3d's padding rows
 * read as zero, written nowhere); lm_head is tied (absent, or ignored when present). Llama:
 * q_proj|k_proj|v_proj are row sections of qkvw, gate_proj|up_proj of fcw, lm_head is lmhead
 * when tie_word_embeddings is false; HF's q and k rows follow the rotate-half RoPE convention of
 * llm3d's kernel, so no permutation. Mixtral: model.layers.N.block_sparse_moe.gate is the router
 * (E, C), experts.M.w1 | w3 the gate | up rows of expert M's block of expfcw (rows M 2F ..), w2
 * its (C, F) block of expprojw (rows M C ..); a folder whose expert count differs from its
 * config.json's num_local_experts is refused naming the file, the tensor and both counts.
 */
#ifndef LLM3D_HF_H
#define LLM3D_HF_H

#include <stdbool.h>
#include <stdint.h>

#include "llm3d/core.h"
#include "llm3d/model.h"

struct l3d_ckpt_pieces; /* include/llm3d/ckpt.h */
struct l3d_tokenizer;   /* include/llm3d/tokenizer.h */

#define L3D_HF_SHARD_BYTES ((int64_t)4 << 30) /* default shard size of a written folder */
#define L3D_ST_MAX_HEADER ((int64_t)100 << 20) /* the reference reader's limit */
#define L3D_ST_MAX_DIMS 8

/* ---- safetensors (src/ckpt/safetensors.c) ---------------------------------------------------- */

struct l3d_st_tensor {
    char *name;
    char dtype_name[16];           /* as written: "F32", "BF16", "I64", ... */
    enum l3d_dtype dtype;          /* L3D_F32, L3D_BF16, L3D_F16; else unhandled (see handled) */
    bool handled;
    int ndim;
    int64_t shape[L3D_ST_MAX_DIMS];
    int64_t count;                 /* elements */
    int64_t offset, bytes;         /* in its file, absolute */
    int file;                      /* index into l3d_st.files */
};

/* The tensors of one file or of a sharded folder. */
struct l3d_st {
    int nfiles;
    char **files;
    int n;
    struct l3d_st_tensor *t;
    int nmeta;                     /* __metadata__ of the (first) file: key, value pairs */
    char **meta;
};

/* One file's header, checked against the file (its size). Appends to st (zeroed first). */
l3d_status l3d_st_open_file(struct l3d_st *st, const char *path);
/* A folder: model.safetensors, else the files of model.safetensors.index.json (a weight_map of at
 * least one entry, each in the file it names, every tensor of those files listed; a missing
 * shard is an error naming it). */
l3d_status l3d_st_open_dir(struct l3d_st *st, const char *dir);
void l3d_st_close(struct l3d_st *st);
const struct l3d_st_tensor *l3d_st_find(const struct l3d_st *st, const char *name);
/* The tensor's elements as fp32 (count of them), checked finite. */
l3d_status l3d_st_read_f32(const struct l3d_st *st, const struct l3d_st_tensor *t, float *out);
/* Its elements [first, first + count) (row-major), likewise. */
l3d_status l3d_st_read_f32_range(const struct l3d_st *st, const struct l3d_st_tensor *t,
                                 int64_t first, int64_t count, float *out);

/* What the writer writes: name, shape (1 or 2 dims); fill puts tensor i's elements (fp32,
 * row-major in the file's layout) into out. */
struct l3d_st_entry {
    char name[112];
    int ndim;
    int64_t shape[2];
};
typedef void (*l3d_st_fill)(void *ctx, int i, float *out);
/* Writes dir/model.safetensors, or, when the tensors pass shard_bytes, dir/model-0000K-of-0000N
 * .safetensors and the index; dt L3D_F32, L3D_BF16 (nearest even) or L3D_F16. dir is a new
 * folder (l3d_hf_save's temporary one, swapped into place whole); each file goes through
 * include/llm3d/file.h's writer. __metadata__ {"format": "pt"} as Hugging Face's writers. */
l3d_status l3d_st_write(const char *dir, const struct l3d_st_entry *e, int n, l3d_st_fill fill,
                        void *ctx, enum l3d_dtype dt, int64_t shard_bytes);
/* The names of a model folder that a new model replaces: config.json, model.safetensors, the
 * index and model-K-of-N.safetensors; everything else in the folder is carried over. */
bool l3d_st_owned(const char *name);
/* Removes what l3d_st_write writes in dir (the single file, the index, shard files); whether
 * there was a single file or an index. */
bool l3d_st_remove(const char *dir);

/* ---- Hugging Face folders (src/ckpt/hf.c) ---------------------------------------------------- */

/* config.json's text into a spec (finished by l3d_gpt_config_finish); what names the file. A
 * config the code cannot honour is refused naming the key. */
l3d_status l3d_hf_config_parse(const char *text, size_t len, const char *what,
                               struct l3d_model_spec *cfg);
/* dir/config.json parsed, then checked against the safetensors headers before any caller
 * allocates the model it describes (a 0.5 MB folder may claim a 4M-token vocabulary): each tensor
 * the model needs present with its shape and a dtype llm3d reads, every tensor of the files
 * placed; no weight is read. */
l3d_status l3d_hf_config_read(const char *dir, struct l3d_model_spec *cfg);
/* The spec as config.json (l3d_free it); torch_dtype from dt. */
char *l3d_hf_config_text(const struct l3d_model_spec *cfg, enum l3d_dtype dt);

/* One Hugging Face tensor and where it lies in the llm3d full model (l3d_gpt_plan_tensors of
 * l3d_shard_full): table entry `tensor`, layer `layer`, rows [row0, row0 + rows) of its (rows,
 * cols) matrix, transposed (HF (cols, rows)) or not; 1-D when ndim is 1. */
struct l3d_hf_tensor {
    struct l3d_st_entry e;
    const char *table;   /* the table tensor's name ("qkvw") */
    int tensor;          /* its index in the table; -1 before binding */
    int64_t layer, row0, rows, cols;
    int64_t table_rows;  /* the rows a layer of it must have */
    bool transposed;
};
/* The model's Hugging Face tensors, in the order a folder is written (*n of them; l3d_free the
 * array). Refused when the model's tensor table does not hold what the architecture needs. */
l3d_status l3d_hf_tensors(const struct l3d_model_spec *cfg, struct l3d_hf_tensor **out, int *n);
/* The same, bound to the table only when `bound` (unbound: names and shapes from the spec alone,
 * tensor -1; refused only for a model no family's Hugging Face row holds: GPT-2 with experts, or
 * experts of a kind the row's format has no place for, l3d_arch_hf_check). */
l3d_status l3d_hf_tensors_ex(const struct l3d_model_spec *cfg, bool bound,
                             struct l3d_hf_tensor **out, int *n);

/* Whether path is a directory holding config.json. */
bool l3d_hf_is_folder(const char *path);
/* Whether the folder at path holds any file of a model (l3d_st_owned's names): what writing a
 * model there would replace, which needs --overwrite. */
bool l3d_hf_has_model(const char *path);
/* The full model's fp32 parameters (l3d_gpt_param_count of them, llm3d's layout; padding rows
 * zero) from the folder, whose config.json must describe cfg. */
l3d_status l3d_hf_load(const char *dir, const struct l3d_model_spec *cfg, float *full);
/* Writes config.json and the weights from the full model's fp32 parameters (host memory).
 * Refused before anything is written (the folder not even created) when a weight is NaN or
 * infinite (in any dt: the reader refuses them), or beyond dt's range (F16 from 65520, BF16 from
 * about 3.396e38: it would be written as infinity); the error names the tensor, element, value. */
l3d_status l3d_hf_save(const char *dir, const struct l3d_model_spec *cfg, const float *full,
                       enum l3d_dtype dt, int64_t shard_bytes);
/* The same folder from the full model's HF tensors taken one at a time: fill(ctx, i, out) puts
 * tensor i of l3d_hf_tensors' order into out as the file holds it (transposed where the entry
 * is); called twice for each tensor in that order (a check of every value, then the writing)
 * unless the folder cannot be begun. */
l3d_status l3d_hf_save_fill(const char *dir, const struct l3d_model_spec *cfg, l3d_st_fill fill,
                            void *ctx, enum l3d_dtype dt, int64_t shard_bytes);
/* Both, with the tokenizer's Hugging Face files (l3d_tokenizer_write_hf: tokenizer.json,
 * tokenizer_config.json with model_max_length the model's context, special_tokens_map.json,
 * generation_config.json) in the same folder, published with the model (tok NULL: none written;
 * those of a folder already there are kept). */
l3d_status l3d_hf_save_tok(const char *dir, const struct l3d_model_spec *cfg, const float *full,
                           enum l3d_dtype dt, int64_t shard_bytes,
                           const struct l3d_tokenizer *tok);
l3d_status l3d_hf_save_fill_tok(const char *dir, const struct l3d_model_spec *cfg,
                                l3d_st_fill fill, void *ctx, enum l3d_dtype dt,
                                int64_t shard_bytes, const struct l3d_tokenizer *tok);

/* ---- model files: an llm.c file or a Hugging Face folder ------------------------------------- */

l3d_status l3d_model_file_config(const char *path, struct l3d_model_spec *cfg);
/* Into an fp32 model or view of the file's config, any shard (like l3d_ckpt_load_llmc). */
l3d_status l3d_model_file_load(const char *path, struct l3d_gpt *m);
/* Into a view without parameters whose parameters go a piece at a time (struct l3d_ckpt_pieces,
 * include/llm3d/ckpt.h): [q->lo, q->hi) handed to q->put. An llm.c file of the full shard is read
 * a piece at a time (l3d_ckpt_load_llmc_pieces); a folder (any shard) a strip of each tensor's
 * rows at a time, only those of the shard's slice (docs/DESIGN.md, "Hugging Face folders"). */
l3d_status l3d_model_file_load_pieces(const char *path, const struct l3d_gpt *m,
                                      const struct l3d_ckpt_pieces *q);

#endif
