/* Data parallelism's private parts shared by dp.c and zero3.c (include/llm3d/dp.h). */
#ifndef LLM3D_DP_IMPL_H
#define LLM3D_DP_IMPL_H

#include "llm3d/dp.h"

/* ZeRO-3: this rank's parameter shard (own_count, zeroed), the non-layer and layer gather
 * buffers (prefetch 1) and the model's params hooks; L3D_ERR_OOM when they do not fit (the
 * caller frees with l3d_dp_zero3_free). */
l3d_status l3d_dp_zero3_init(struct l3d_dp *dp);
void l3d_dp_zero3_free(struct l3d_dp *dp);
/* Tests every pending parameter gather (the progress hook). */
void l3d_dp_zero3_poll(struct l3d_dp *dp);
/* Frees a stream left open (l3d_dp_fp32_stream_begin), without communication. */
void l3d_dp_stream_free(struct l3d_dp *dp);

#endif
