/*
 * The hang watchdog of the MPI communicator (src/comm/watchdog.c), private to src/comm/.
 *
 *   m->watch = l3d_mpi_watch_init(world_size);         // collective over the world
 *   world->watch = l3d_mpi_watch_pub(m->watch);        // the settings callers fill (comm.h)
 *   MPI_Iallreduce(..., &r); l3d_mpi_watch_wait(m, &r, -1, "all-reduce");
 *   l3d_mpi_watch_free(m->watch);                      // before MPI_Finalize
 */
#ifndef LLM3D_COMM_WATCHDOG_H
#define LLM3D_COMM_WATCHDOG_H

#include "comm/mpi-impl.h"

/* Duplicates the world for the liveness questions; collective over MPI_COMM_WORLD. */
struct mpi_watch *l3d_mpi_watch_init(int world_size);
void l3d_mpi_watch_free(struct mpi_watch *w);
/* The timeout, labels and longest wait that the communicator's users read and write. */
struct l3d_watch *l3d_mpi_watch_pub(struct mpi_watch *w);

/* Completes r (a request of communicator m: peer >= 0 for a send or receive, -1 for a
 * collective), answering the other ranks' liveness questions while it waits; after the watch
 * timeout finds the rank that does not respond, names it and aborts the job (status 75). Records
 * the longest wait in the public struct. */
void l3d_mpi_watch_wait(struct mpi_comm *m, MPI_Request *r, int peer, const char *op);

#endif
