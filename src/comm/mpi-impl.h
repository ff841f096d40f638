/*
 * Internals of the MPI communicator (src/comm/mpi.c) that tests reach: the chunk size of the
 * blocking large-count path and the launcher check, so both are testable without 2^31 elements or
 * a second MPI.
 */
#ifndef LLM3D_COMM_MPI_IMPL_H
#define LLM3D_COMM_MPI_IMPL_H

#include "llm3d/comm.h"

/* Largest count one blocking MPI call is given on c (default INT_MAX / 2); a blocking operation
 * over more elements loops over chunks. Collective: every rank of c must set the same value,
 * because send/recv and the collectives must be cut into the same chunks on both sides.
 * Communicators split from c later inherit it. */
void l3d_comm_mpi_set_max_count(struct l3d_comm *c, int64_t max_count);

/* The launcher check of l3d_comm_mpi_init: L3D_ERR_LAYOUT when mpi_size is 1 while a launcher
 * variable of the environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS) announces
 * more ranks; L3D_OK otherwise. */
l3d_status l3d_comm_mpi_check_launcher(int mpi_size);

#endif
