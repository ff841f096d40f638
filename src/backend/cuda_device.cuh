/*
 * What the CUDA backend's kernel files share (cuda_kernels.cu, cuda_moe.cu): the storage types'
 * loads and stores (fp32 arithmetic, one rounding to nearest even a 16-bit store), the dispatch of
 * a launcher body over the element types, grid-stride loops and the warp primitives. nvcc only.
 */
#ifndef LLM3D_BACKEND_CUDA_DEVICE_CUH
#define LLM3D_BACKEND_CUDA_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda_kernels.h"

/* ---- storage types ---------------------------------------------------------------------------- */

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void st(float *p, float x) { *p = x; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void st(__half *p, float x) { *p = __float2half_rn(x); }

/* A launcher body for each storage type: the body (the variadic arguments) expands the launch with T the element type. */
#define DISPATCH(dt, ...)                                  \
    do {                                                 \
        switch (dt) {                                    \
        case L3D_CUK_F32: { typedef float T; __VA_ARGS__; } break; \
        case L3D_CUK_BF16: {                             \
            typedef __nv_bfloat16 T;                     \
            __VA_ARGS__;                                           \
        } break;                                         \
        default: {                                       \
            typedef __half T;                            \
            __VA_ARGS__;                                           \
        } break;                                         \
        }                                                \
    } while (0)
/* parameter gradients: the activations' type T, or fp32 (G) */
#define DISPATCH_G(dt, gdt, ...)                                       \
    do {                                                             \
        if ((gdt) == L3D_CUK_F32) {                                  \
            typedef float G;                                         \
            DISPATCH(dt, __VA_ARGS__);                                         \
        } else if ((dt) == L3D_CUK_BF16) {                           \
            typedef __nv_bfloat16 G;                                 \
            typedef __nv_bfloat16 T;                                 \
            __VA_ARGS__;                                                       \
        } else {                                                     \
            typedef __half G;                                        \
            typedef __half T;                                        \
            __VA_ARGS__;                                                       \
        }                                                            \
    } while (0)

#define ST(s) ((cudaStream_t)(s))
#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)
static const uint32_t kMaxBlocks = 65535u * 8u;

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
/* One warp a row: this warp's row of the grid, and this thread's lane in it. */
__device__ __forceinline__ int64_t warp_row() {
    return (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}
__device__ __forceinline__ int warp_lane() { return threadIdx.x & 31; }

#define LAUNCH_1D(n, threads) \
    struct l3d_cuda_launch L = l3d_cuda_launch_1d((n), (threads), kMaxBlocks); \
    if (L.blocks == 0) return

#endif
