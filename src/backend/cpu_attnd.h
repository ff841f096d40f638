/* bf16 attention with its products as oneDNN matmuls (src/backend/cpu_attnd.c): on a CPU with
 * AMX, oneDNN's brgemm kernels multiply bf16 tiles at ~3.5x the fp32 FMA rate. Only cpu.c
 * includes this file.
 *
 *   struct l3d_attnd *ad = l3d_attnd_init();          // decides once: on with L3D_ATTN_DNNL=1
 *   if (l3d_attnd_on(ad, dt)) l3d_attnd_forward(ad, out, lse, qkv, B, T, NH, NKV, HS);
 *   ...
 *   l3d_attnd_free(ad);
 */
#ifndef LLM3D_CPU_ATTND_H
#define LLM3D_CPU_ATTND_H

#include <stdbool.h>
#include <stdint.h>

#include "llm3d/core.h"

/* a oneDNN call that must succeed (cpu.c's and cpu_attnd.c's) */
#define L3D_DNNL_CHECK(call)                                                                 \
    do {                                                                                     \
        dnnl_status_t st_ = (call);                                                          \
        if (st_ != dnnl_success)                                                             \
            l3d_fatal(__FILE__, __LINE__, "oneDNN call %s failed with status %d", #call,     \
                      (int)st_);                                                             \
    } while (0)

struct l3d_attnd;

/* The path's context (its own oneDNN engine, primitive cache and scratch), with the choice made
 * once: opt-in, $L3D_ATTN_DNNL "1" on wherever oneDNN has non-reference bf16 matmuls (AMX or
 * not), unset, empty or "0" off, any other value a fatal error (l3d_attnd_init says why;
 * l3d_attnd_rule says which). */
struct l3d_attnd *l3d_attnd_init(void);
void l3d_attnd_free(struct l3d_attnd *ad);
/* whether tensors of type dt take this path (bf16 only, and the choice above) */
bool l3d_attnd_on(const struct l3d_attnd *ad, enum l3d_dtype dt);
/* the choice in words, e.g. "oneDNN brg:avx512_core_amx_bf16 (L3D_ATTN_DNNL=1, AMX)" or
 * "off (the default; ...)" */
const char *l3d_attnd_rule(const struct l3d_attnd *ad);

// out (B,T,NH,HS), lse (B,NH,T), qkv (B,T,NH+2*NKV,HS), all bf16 but lse (fp32)
void l3d_attnd_forward(struct l3d_attnd *ad, uint16_t *out, float *lse, const uint16_t *qkv,
                       int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
// dqkv (B,T,NH+2*NKV,HS) +=, dout (B,T,NH,HS), qkv, out (B,T,NH,HS), lse (B,NH,T)
void l3d_attnd_backward(struct l3d_attnd *ad, uint16_t *dqkv, const uint16_t *dout,
                        const uint16_t *qkv, const uint16_t *out, const float *lse, int64_t B,
                        int64_t T, int64_t NH, int64_t NKV, int64_t HS);

#endif
