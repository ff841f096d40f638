/*
 * llm3d layout: what a parallel layout gives each rank — the layers of every virtual pipeline
 * stage and the model shard of every (virtual stage, TP rank) pair. The trainer (src/train) and the
 * planner (src/plan) both call these, so the planner sizes the very shards the trainer allocates.
 *
 *   int layers[8];                                               // pp x v entries
 *   if (l3d_layout_stage_layers(&cfg, &spec.layout, layers) != L3D_OK) ...;     // balanced
 *   struct l3d_shard sh;                                         // virtual stage c pp + pp_rank
 *   l3d_layout_stage_shard(&cfg, layers, pp * v, c * pp + pp_rank, tp, tp_rank, sp, &sh);
 *
 * Worked example: GPT-2 124M (12 layers) on pp = 2, v = 1: layers {7, 5} (the head weighs about
 * 5.5 layers, see docs/DESIGN.md); stage 1 on TP rank 1 of 2 holds layers 7..11, heads 6..11, the
 * MLP columns 1536..3071, the upper half of the padded vocabulary, and the head.
 */
#ifndef LLM3D_LAYOUT_H
#define LLM3D_LAYOUT_H

#include <stdbool.h>

#include "llm3d/core.h"
#include "llm3d/model.h"
#include "llm3d/spec.h"

/* Layers of each of layout l's pp x v virtual stages (layers has pp v entries): the list given
 * as "a,b,..." (--pp-layers); else with pp_first or pp_last given, those ends and the stages
 * between split evenly (l3d_layout_split_ends); else the partition that balances the stages'
 * cost at the layout's sequence (l3d_pp_partition). L3D_ERR_LAYOUT naming --pp and --pp-virtual
 * when there are more stages than layers; the parser's error for a bad list. */
l3d_status l3d_layout_stage_layers(const struct l3d_model_spec *cfg, const struct l3d_layout *l,
                                   int *layers);
/* L layers on S stages with the first holding `first` and the last `last` (0: not given): the
 * stages without a given count split the rest evenly, the earlier ones taking one more when it
 * does not divide (Megatron-Core's uneven first and last pipeline stages; 126 layers on 16 as
 * 7 + 14 x 8 + 7). L3D_ERR_LAYOUT naming the flags when a stage would get no layer, or S is 1
 * and the ends disagree with L. */
l3d_status l3d_layout_split_ends(int L, int S, int first, int last, int *layers);
/* The shard of virtual stage vs of `stages` on TP rank tp_rank of tp: the layer range from
 * layers, the head / MLP-column / vocabulary slice of l3d_tp_shard (sp: sequence parallel), the
 * embedding on the first stage and the head on the last. Returns l3d_tp_shard's status; the layer
 * range and the ends are filled either way. */
l3d_status l3d_layout_stage_shard(const struct l3d_model_spec *cfg, const int *layers, int stages,
                                  int vs, int tp, int tp_rank, bool sp, struct l3d_shard *out);

#endif
