/*
 * All-reduce bus bandwidth: a plain MPI_Allreduce loop against llm3d's communicator, blocking and
 * in the bucketed form the data-parallel layer uses (pieces of at most 4 MiB in flight together).
 * Bus bandwidth as nccl-tests defines it: bytes / time x 2 (n - 1) / n.
 * This benchmark is the one file outside src/comm that includes mpi.h: it is the reference.
 *   mpiexec -n 2 build/l3d_bench_allreduce
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "llm3d/comm.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define REPS 15

int main(int argc, char **argv) {
    struct l3d_comm *world;
    if (l3d_comm_mpi_init(&argc, &argv, &world) != L3D_OK) {
        fprintf(stderr, "%s\n", l3d_error_message());
        return 1;
    }
    int n = world->size, rank = world->rank;
    const int64_t bucket = (4 << 20) / 4;
    const int64_t max = (64 << 20) / 4;
    float *buf = malloc((size_t)max * sizeof(float));
    for (int64_t i = 0; i < max; i++) buf[i] = 1.0f; /* touched before timing */
    l3d_req *reqs = malloc((size_t)(max / bucket + 1) * sizeof(l3d_req));
    if (rank == 0)
        printf("%d ranks, %s\nsize       plain MPI_Allreduce    llm3d blocking    llm3d %lld MiB buckets"
               "   (bus bandwidth GB/s, median of %d)\n", n, l3d_comm_mpi_library(),
               (long long)(bucket * 4 >> 20), REPS);
    for (int64_t count = 1 << 16; count <= max; count *= 4) {
        double t[3][REPS];
        for (int r = 0; r < REPS; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t[0][r] = MPI_Wtime() - t0;
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            l3d_comm_all_reduce(world, buf, count, L3D_F32, L3D_SUM, NULL);
            t[1][r] = MPI_Wtime() - t0;
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            int k = 0;
            for (int64_t off = 0; off < count; off += bucket, k++)
                l3d_comm_all_reduce(world, buf + off, count - off < bucket ? count - off : bucket,
                                    L3D_F32, L3D_SUM, &reqs[k]);
            for (int j = 0; j < k; j++) l3d_comm_wait(world, &reqs[j]);
            t[2][r] = MPI_Wtime() - t0;
        }
        if (rank == 0) {
            double bytes = (double)count * 4, f = 2.0 * (n - 1) / n;
            printf("%6.2f MiB", bytes / 1048576.0);
            for (int v = 0; v < 3; v++) {
                qsort(t[v], REPS, sizeof(double), cmp);
                printf("   %8.2f (%7.2f ms)", bytes / t[v][REPS / 2] * f / 1e9, t[v][REPS / 2] * 1e3);
            }
            printf("\n");
        }
    }
    free(buf);
    free(reqs);
    l3d_comm_mpi_finalize(world);
    return 0;
}
