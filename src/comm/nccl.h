/*
 * The device communicator of a CUDA run (src/comm/nccl.c; only with -DL3D_CUDA=ON). EXPERIMENTAL:
 * compiled in every CI run, not yet run on a GPU.
 *
 * It wraps the MPI world, which stays the launcher and the bootstrap: device buffers go through
 * NCCL on the communicator's own stream when every rank has a device of its own, or, when two
 * ranks share a device (NCCL refuses that), through MPI on host copies (staged); host buffers
 * always go through MPI. The choice is l3d_cuda_comm_choice's (src/backend/cuda_host.c), the same
 * on every rank, and a staged run says so in one line at start-up.
 *
 *   struct l3d_comm *w;
 *   l3d_comm_device_world(mpi_world, be, &w);     // collective; w == mpi_world unless be is CUDA
 *   ... l3d_comm_split(w, ...), l3d_comm_all_reduce(dp, device_buf, ...) ...
 *   l3d_comm_mpi_finalize(l3d_comm_device_release(w));
 */
#ifndef LLM3D_COMM_NCCL_H
#define LLM3D_COMM_NCCL_H

#include "llm3d/backend.h"
#include "llm3d/comm.h"

l3d_status l3d_comm_device_world(struct l3d_comm *mpi_world, struct l3d_backend *be,
                                 struct l3d_comm **out);
/* frees a device world (not the MPI world) and returns the MPI world; an MPI world as it is */
struct l3d_comm *l3d_comm_device_release(struct l3d_comm *world);

#endif
