/* Private to src/ckpt (dist.c, llmc.c): the host staging of device tensors. */
#ifndef LLM3D_CKPT_IMPL_H
#define LLM3D_CKPT_IMPL_H

#include <stdlib.h>

#include "llm3d/core.h"

#define L3D_CKPT_STAGE_BYTES ((size_t)64 << 20)

/* Bytes of the host buffer that stages a transfer of `want` bytes between a file and device
 * memory: want, at most 64 MiB, at least 1. Test hook: $L3D_CKPT_TEST_STAGE bytes at most
 * instead, so that tiny models take many transfers per tensor too. */
static inline size_t l3d_ckpt_stage_cap(size_t want) {
    const char *v = getenv("L3D_CKPT_TEST_STAGE");
    size_t most = v && atoll(v) > 0 ? (size_t)atoll(v) : L3D_CKPT_STAGE_BYTES;
    return want < most ? (want > 0 ? want : 1) : most;
}

/* A manifest's text parsed and its layout checked against its model, as a load does before it
 * reads any rank file (dist.c): the entry of the fuzz target tests/fuzz/fuzz_manifest.c. */
l3d_status l3d_ckpt_manifest_check(const char *text, size_t len);

#endif
