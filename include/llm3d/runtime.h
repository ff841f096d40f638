/*
 * llm3d runtime: the one place that builds what a command runs on — the world communicator, the
 * backend, and once the layout is known the rank grid with its TP, PP, DP and embedding
 * communicators — and hands it to train/ (which then names no MPI function and no backend).
 *
 *   struct l3d_runtime_opts o = {.cmd = "train", .backend = NULL};  // NULL: $L3D_BACKEND, cpu
 *   struct l3d_runtime *rt;
 *   if (l3d_runtime_init(&argc, &argv, &o, &rt) != L3D_OK) ...;      // message printed once
 *   ... resolve the layout (l3d_spec_resolve: every rank the same verdict) ...
 *   if (l3d_runtime_layout(rt, &spec.layout) != L3D_OK) ...;         // collective over the world
 *   l3d_comm_all_reduce(rt->topo.dp_comm, ...);
 *   l3d_runtime_free(rt);                                             // communicators, backend, MPI
 */
#ifndef LLM3D_RUNTIME_H
#define LLM3D_RUNTIME_H

#include <stdbool.h>

#include "llm3d/backend.h"
#include "llm3d/comm.h"
#include "llm3d/core.h"
#include "llm3d/topo.h"

struct l3d_runtime_opts {
    const char *cmd;     /* the command, for messages ("train") */
    const char *backend; /* the --backend flag: NULL or "" takes $L3D_BACKEND, else "cpu" */
    bool no_world;       /* one process without MPI (generate): world is a communicator of one */
    bool stop_signals;   /* SIGTERM / SIGUSR1 kept off every thread before MPI and OpenMP start
                          * theirs, for the training loop's preemption saves */
    bool progress_thread; /* MPI_THREAD_MULTIPLE and a progress thread
                           * (l3d_comm_mpi_init_progress) */
};

struct l3d_runtime {
    struct l3d_comm *world;   /* NULL with no_world */
    struct l3d_backend *be;
    struct l3d_topo topo;     /* valid once l3d_runtime_layout returned L3D_OK */
    bool has_topo;
    const char *comm_name;    /* the communication library, for logs */
    bool mpi;                 /* world came from MPI (finalised by l3d_runtime_free) */
};

/* Builds the world (MPI: l3d_comm_mpi_init, which installs the abort hook; it may consume MPI's
 * own arguments from argc/argv) and the backend. On failure every rank has the same status and
 * the message is printed once, prefixed "llm3d <cmd>: "; *out is NULL and nothing is left. */
l3d_status l3d_runtime_init(int *argc, char ***argv, const struct l3d_runtime_opts *o,
                            struct l3d_runtime **out);
/* Builds the rank grid of layout l (resolved: l3d_layout_resolve; it must outlive the runtime's
 * topology) and its communicators (l3d_topo_init), replacing an earlier one. Collective over the
 * world. */
l3d_status l3d_runtime_layout(struct l3d_runtime *rt, const struct l3d_layout *l);
/* Frees the communicators, the backend and the world (MPI finalised); NULL is a no-op. */
void l3d_runtime_free(struct l3d_runtime *rt);

/* The preemption signals SIGTERM and SIGUSR1 (src/runtime/signals.c), process-wide.
 * l3d_runtime_signals_block keeps them off the calling thread and every thread started after:
 * call it before MPI and OpenMP start theirs (l3d_runtime_init does, with stop_signals). It starts
 * a thread that takes them: until a loop takes them over, one ends the process (status
 * 128 + signal), as by default. After l3d_runtime_signals_take (which blocks them first if that
 * was not done) the first signal is a request that l3d_runtime_signal_pending returns (0: none)
 * and a second ends the process. l3d_runtime_signals_release ends the thread and gives them back
 * their default action on the calling thread. */
void l3d_runtime_signals_block(void);
void l3d_runtime_signals_take(void);
void l3d_runtime_signals_release(void);
int l3d_runtime_signal_pending(void);

#endif
