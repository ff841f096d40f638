/* The start and end of an MPI test of the model (tests/mpi/test_*.c): the world and the backend
 * ($L3D_BACKEND, default cpu) the communicators use, then every rank's failures agreed so that
 * each rank exits with the same status. */
#ifndef LLM3D_MPI_TEST_H
#define LLM3D_MPI_TEST_H

#include "llm3d/comm.h"
#include "test.h"

/* The world (NULL after printing why, when MPI does not start) with *be as its backend. */
static inline struct l3d_comm *test_mpi_init(int *argc, char ***argv, struct l3d_backend **be) {
    struct l3d_comm *world;
    if (l3d_comm_mpi_init(argc, argv, &world) != L3D_OK) {
        fprintf(stderr, "%s\n", l3d_error_message());
        return NULL;
    }
    *be = test_backend_init();
    l3d_comm_use_backend(world, *be); /* before any group is split from the world */
    return world;
}

/* Frees be, agrees on the failures, finalizes MPI; the exit status. */
static inline int test_mpi_end(struct l3d_comm *world, struct l3d_backend *be) {
    l3d_comm_use_backend(world, NULL); /* the backend goes; the world stays for the last sum */
    l3d_backend_free(be);
    int fails = test_failures;
    l3d_comm_all_reduce(world, &fails, 1, L3D_I32, L3D_MAX, NULL);
    int rc = TEST_REPORT();
    l3d_comm_mpi_finalize(world);
    return fails ? 1 : rc;
}

#endif
