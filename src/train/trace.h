/*
 * The timeline of --trace (private to src/train): the pipeline executor records each rank's
 * events (l3d_pp_trace_add, include/llm3d/pipeline.h); at the end every rank's events go to world
 * rank 0, which writes one Chrome trace-event JSON file (chrome://tracing, ui.perfetto.dev): a
 * process per rank named by its (tp, pp, dp) coordinates.
 *
 *   l3d_pp_exec_init(&px, ..., trace_events);       // room for trace_events events a rank
 *   ... steps ...
 *   st = l3d_train_trace_write(&px, world, "trace.json", tp_rank, pp_rank, dp_rank);
 */
#ifndef LLM3D_TRAIN_TRACE_H
#define LLM3D_TRAIN_TRACE_H

#include "llm3d/comm.h"
#include "llm3d/pipeline.h"

/* Collective over world; L3D_ERR_IO (on rank 0) when the file cannot be written. */
l3d_status l3d_train_trace_write(const struct l3d_pp_exec *x, struct l3d_comm *world,
                                 const char *path, int tp_rank, int pp_rank, int dp_rank);

#endif
