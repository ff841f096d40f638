/*
 * llm3d checkpoints. For now: llm.c's single-file GPT-2 weights (the sharded, resumable format
 * comes with issue "checkpoints").
 *
 *   l3d_ckpt_save_llmc("out/model.bin", model);              // full shard only
 *   struct l3d_gpt_config cfg;
 *   l3d_ckpt_read_llmc_config("out/model.bin", &cfg);        // to size the model
 *   l3d_ckpt_load_llmc("out/model.bin", model);              // into a model of that config
 *
 * File (llm.c train_gpt2.c, gpt2_build_from_checkpoint): 256 int32 header, [0] = 20240326,
 * [1] = 3 (fp32), [2] = maxT, [3] = V, [4] = L, [5] = NH, [6] = C, [7] = Vp; then the 16 tensors in
 * llm.c's order as fp32, the padded wte rows included.
 */
#ifndef LLM3D_CKPT_H
#define LLM3D_CKPT_H

#include "llm3d/core.h"
#include "llm3d/model.h"

#define L3D_LLMC_MAGIC 20240326
#define L3D_LLMC_VERSION_FP32 3

/* Written atomically: a temporary file, fsync, then rename over path. */
l3d_status l3d_ckpt_save_llmc(const char *path, const struct l3d_gpt *m);
/* The same from a full model's flat parameters (e.g. gathered from tensor-parallel shards). */
l3d_status l3d_ckpt_save_llmc_params(const char *path, const struct l3d_gpt_config *cfg,
                                     const float *params, int64_t num_params);
l3d_status l3d_ckpt_read_llmc_config(const char *path, struct l3d_gpt_config *cfg);
l3d_status l3d_ckpt_load_llmc(const char *path, struct l3d_gpt *m);

#endif
