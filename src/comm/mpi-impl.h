/*
 * Internals of the MPI communicator (src/comm/mpi.c), shared with its watchdog
 * (src/comm/watchdog.c) and reached by tests: the communicator's struct, the MPI error check,
 * the chunk size of the blocking large-count path and the launcher check (the last two so both
 * are testable without 2^31 elements or a second MPI). Only src/comm/ and the MPI tests include
 * this header, since it includes mpi.h.
 */
#ifndef LLM3D_COMM_MPI_IMPL_H
#define LLM3D_COMM_MPI_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <mpi.h>

#include "llm3d/comm.h"

/* Prints "llm3d: rank R: MPI_Xxx failed: <message>" and aborts every rank. `call` is the text of
 * the call; only its name (up to the parenthesis) is printed. */
_Noreturn void l3d_mpi_fail(const char *call, int rc, const char *file, int line);

#define L3D_MPI_CHECK(call)                                                \
    do {                                                                   \
        int l3d_mpi_rc_ = (call);                                          \
        if (l3d_mpi_rc_ != MPI_SUCCESS)                                    \
            l3d_mpi_fail(#call, l3d_mpi_rc_, __FILE__, __LINE__);          \
    } while (0)

struct mpi_watch;    /* watchdog.c */
struct mpi_progress; /* mpi.c: the progress thread */
struct mpi_types;    /* mpi.c: the bf16/fp16 datatype and reductions */

struct mpi_comm {
    struct l3d_comm base;
    struct mpi_watch *watch;     /* the world's, shared by splits */
    struct mpi_progress *prog;   /* the world's progress thread, shared by splits; NULL: none */
    MPI_Comm comm;
    int64_t max_count;       /* largest count of one blocking MPI call (see below) */
    struct mpi_types *types; /* bf16/fp16 datatype and reductions: the world's, shared by splits */
    bool is_world;           /* MPI_COMM_WORLD: released by l3d_comm_mpi_finalize only */
    /* a non-blocking all_to_allv's counts and displacements as MPI takes them (4 size ints, made
     * with the communicator: MPI reads them until completion), busy while one is in flight (a
     * second at once brings its own) */
    int *a2a_counts;
    bool a2a_busy;
};

static inline double l3d_mpi_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void l3d_mpi_nap(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

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
