/* The runtime a command runs on: world, backend, rank grid (include/llm3d/runtime.h). */
#include <stdio.h>
#include <stdlib.h>

#include "llm3d/runtime.h"
#ifdef L3D_CUDA
#include "comm/nccl.h"
#endif

l3d_status l3d_runtime_init(int *argc, char ***argv, const struct l3d_runtime_opts *o,
                            struct l3d_runtime **out) {
    *out = NULL;
    const char *cmd = o->cmd ? o->cmd : "llm3d";
    if (o->stop_signals) l3d_runtime_signals_block(); /* before MPI and OpenMP start threads */
    struct l3d_runtime *rt = calloc(1, sizeof *rt); /* not accounted: l3d_mem_peak is the model's */
    if (!rt) {
        fprintf(stderr, "llm3d %s: out of memory\n", cmd);
        return L3D_ERR_OOM;
    }
    l3d_status st = L3D_OK;
    if (!o->no_world) {
        st = l3d_comm_mpi_init_progress(argc, argv, o->progress_thread, &rt->world);
        if (st != L3D_OK) {
            fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
            free(rt);
            return st;
        }
        rt->mpi = true;
        rt->comm_name = l3d_comm_mpi_library();
    } else {
        rt->comm_name = "one process";
    }
    /* the backend's name comes from the flag or the environment: agree so that it is said once */
    bool report = true;
    st = l3d_backend_init(o->backend, &rt->be);
    if (rt->world) st = l3d_comm_agree(rt->world, st, &report);
    if (st != L3D_OK) {
        if (report) fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
        l3d_runtime_free(rt);
        return st;
    }
    /* every communicator split from the world (the topology's) takes the backend's buffers */
    if (rt->world) l3d_comm_use_backend(rt->world, rt->be);
#ifdef L3D_CUDA /* a CUDA backend's world: NCCL, or MPI through host copies (src/comm/nccl.h) */
    if (rt->world) l3d_comm_device_world(rt->world, rt->be, &rt->world);
#endif
    *out = rt;
    return L3D_OK;
}

l3d_status l3d_runtime_layout(struct l3d_runtime *rt, const struct l3d_layout *l) {
    L3D_ASSERT(rt->world); /* a runtime without a world runs no layout */
    if (rt->has_topo) l3d_topo_free(&rt->topo);
    rt->has_topo = false;
    l3d_status st = l3d_topo_init(&rt->topo, rt->world, l);
    rt->has_topo = st == L3D_OK;
    return st;
}

void l3d_runtime_free(struct l3d_runtime *rt) {
    if (!rt) return;
    if (rt->has_topo) l3d_topo_free(&rt->topo);
    if (rt->world) l3d_comm_use_backend(rt->world, NULL);
    if (rt->be) l3d_backend_free(rt->be);
#ifdef L3D_CUDA
    rt->world = l3d_comm_device_release(rt->world);
#endif
    if (rt->mpi) l3d_comm_mpi_finalize(rt->world);
    free(rt);
}
