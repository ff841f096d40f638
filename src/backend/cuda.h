/*
 * The CUDA backend (src/backend/cuda.c; only in a build with -DL3D_CUDA=ON), by name "cuda"
 * (registry.c). EXPERIMENTAL: compiled in every CI run, not yet run on a GPU. What the NCCL
 * communicator (src/comm/nccl.c) needs of it: its stream, its device, whether a pointer is device
 * memory.
 */
#ifndef LLM3D_BACKEND_CUDA_H
#define LLM3D_BACKEND_CUDA_H

#include <stdbool.h>

#include "llm3d/backend.h"

/* The device of this rank: its local rank (launcher's environment, src/backend/cuda_host.c)
 * modulo the visible devices. Prints "the CUDA backend has not yet run on a GPU (experimental)"
 * once (local rank 0). Aborts, saying why, when there is no device. */
struct l3d_backend *l3d_backend_cuda_init(void);
bool l3d_backend_is_cuda(const struct l3d_backend *be);
/* the backend's stream (a cudaStream_t), on which every kernel and copy runs in issue order */
void *l3d_backend_cuda_stream(struct l3d_backend *be);
int l3d_backend_cuda_device(struct l3d_backend *be);
/* Moves the backend to device local_rank modulo the visible devices, before anything is allocated
 * (the device world does it when the launcher announced no local rank). */
void l3d_backend_cuda_rebind(struct l3d_backend *be, int local_rank);
/* The CUDA devices this process sees; 0 when there is none or the runtime cannot say (no driver):
 * what a GPU test asks before it starts the backend, to skip where there is no GPU. */
int l3d_cuda_device_count(void);
/* whether p is device memory (cudaPointerGetAttributes): host buffers pass to MPI as they are */
bool l3d_cuda_is_device_ptr(const void *p);

#endif
