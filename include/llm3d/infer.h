/*
 * llm3d inference: incremental forward with a key/value cache, for generation.
 *
 *   struct l3d_infer *inf;
 *   if (l3d_infer_init(&inf, model) != L3D_OK) ...;    // model: full shard, weights loaded
 *   const float *logits = l3d_infer_step(inf, prompt, n);   // (Vp) logits after the prompt
 *   int tok = pick(logits);
 *   logits = l3d_infer_step(inf, &tok, 1);                  // costs one position, not n+1
 *   ...
 *   l3d_infer_reset(inf);                                   // a new sequence
 *   l3d_infer_free(inf);
 *
 * Each layer's keys and values of the positions seen so far stay in a cache of (maxT, C) per
 * layer, laid out as the model's qkv activation (heads side by side), so a step over n new tokens
 * runs the layers on n rows: the matrix products and LayerNorms through the backend kernels, and
 * causal attention of the new rows over the cached positions here. The logits of position p equal
 * those of l3d_gpt_forward over the tokens 0..p (tests/test_infer.c checks every position).
 * The model's parameters are read in place (m->params through m->tensors); its activation
 * buffers are not used, so a model initialised for B = T = 1 suffices. Buffers are allocated once,
 * in init, for maxT rows.
 */
#ifndef LLM3D_INFER_H
#define LLM3D_INFER_H

#include <stdint.h>

#include "llm3d/core.h"
#include "llm3d/model.h"

struct l3d_infer;

/* L3D_ERR_LAYOUT unless m holds the whole model (one shard, no tensor or pipeline split). */
l3d_status l3d_infer_init(struct l3d_infer **out, const struct l3d_gpt *m);
/* Runs tokens[0..n) at positions pos..pos+n-1 (pos = l3d_infer_pos), 1 <= n, pos + n <= maxT,
 * tokens in [0, V); returns the logits (Vp, the first V real) of the last of them, valid until the
 * next call. */
const float *l3d_infer_step(struct l3d_infer *inf, const int32_t *tokens, int n);
int l3d_infer_pos(const struct l3d_infer *inf); /* positions in the cache */
void l3d_infer_reset(struct l3d_infer *inf);    /* empties the cache */
void l3d_infer_free(struct l3d_infer *inf);

#endif
