/* The timeline file of --trace (src/train/trace.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "llm3d/file.h"
#include "train/trace.h"

static const char *const ev_names[] = {"forward", "backward", "recv activation", "recv gradient",
                                       "tied embedding sum", "data-parallel wait", "optimizer",
                                       "step", "weight gradient", "kernels"};

l3d_status l3d_train_trace_write(const struct l3d_pp_exec *x, struct l3d_comm *world,
                                 const char *path, int tp_rank, int pp_rank, int dp_rank) {
    /* every rank's count and coordinates, then its events, to rank 0 */
    int32_t mine[4] = {(int32_t)x->nev, tp_rank, pp_rank, dp_rank};
    int W = world->size;
    int32_t *all = l3d_alloc((size_t)W * 4 * sizeof(int32_t), "trace");
    int64_t *counts = l3d_alloc((size_t)W * 2 * sizeof(int64_t), "trace"), *displs = counts + W;
    for (int i = 0; i < W; i++) {
        counts[i] = 4;
        displs[i] = 4 * i;
    }
    memcpy(all + 4 * world->rank, mine, sizeof mine);
    l3d_comm_all_gatherv(world, all, counts, displs, L3D_I32, NULL);
    l3d_free(counts);
    l3d_status st = L3D_OK;
    if (world->rank != 0) {
        if (x->nev > 0)
            l3d_comm_send(world, x->ev, x->nev * (int64_t)sizeof(struct l3d_pp_event), L3D_U8, 0,
                          L3D_TAG_TRACE, NULL);
        l3d_free(all);
        return st;
    }
    /* through the file writer (include/llm3d/file.h): a failed write (its path and errno
     * reported) leaves no partial trace and whatever path held before */
    struct l3d_out out;
    FILE *f = NULL;
    if ((st = l3d_out_open(&out, path, "--trace file")) == L3D_OK) f = l3d_out_stream(&out);
    if (f) fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    bool first = true;
    for (int rk = 0; rk < W; rk++) {
        int64_t n = all[4 * rk];
        struct l3d_pp_event *recv = NULL;
        const struct l3d_pp_event *ev = x->ev;
        if (rk != 0) {
            recv = l3d_alloc((size_t)(n > 0 ? n : 1) * sizeof *recv, "trace");
            if (n > 0)
                l3d_comm_recv(world, recv, n * (int64_t)sizeof *recv, L3D_U8, rk, L3D_TAG_TRACE,
                              NULL);
            ev = recv;
        }
        if (f) {
            fprintf(f, "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
                    "\"rank %d (tp %d, pp %d, dp %d)\"}}", first ? "" : ",\n", rk, rk,
                    all[4 * rk + 1], all[4 * rk + 2], all[4 * rk + 3]);
            first = false;
            for (int64_t i = 0; i < n; i++) {
                const struct l3d_pp_event *e = &ev[i];
                if (e->kind == L3D_EV_KFAM) { /* a row (thread) per family, from tid 2 */
                    fprintf(f, ",\n{\"name\":\"kernels %s %d\",\"cat\":\"kernels\","
                            "\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                            "\"args\":{\"step\":%d}}",
                            l3d_kfam_name(e->chunk), e->micro, rk, 2 + e->chunk, e->t0 * 1e6,
                            (e->t1 - e->t0) * 1e6, e->micro);
                    continue;
                }
                bool mb = e->kind <= L3D_EV_RECV_GRAD || e->kind == L3D_EV_WGRAD;
                fprintf(f, ",\n{\"name\":\"%s", ev_names[e->kind]);
                if (mb) fprintf(f, " m%d c%d", e->micro, e->chunk);
                if (e->kind == L3D_EV_OPTIMIZER || e->kind == L3D_EV_STEP)
                    fprintf(f, " %d", e->micro);
                fprintf(f, "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
                        "\"dur\":%.3f,\"args\":{\"micro\":%d,\"chunk\":%d}}", ev_names[e->kind],
                        rk, e->kind == L3D_EV_STEP ? 1 : 0, e->t0 * 1e6, (e->t1 - e->t0) * 1e6,
                        e->micro, e->chunk);
            }
        }
        l3d_free(recv);
    }
    if (f) {
        fprintf(f, "\n]}\n");
        st = l3d_out_commit(&out);
    }
    l3d_free(all);
    return st;
}
