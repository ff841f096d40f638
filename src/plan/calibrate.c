/*
 * Calibration (include/llm3d/calibrate.h; the command: llm3d bench --calibrate,
 * src/cli/calibrate.c): measures this machine and writes its system profile (format:
 * profiles/README.md) with `name = local`, where a device is one CPU core. The compute figures
 * are in calibrate_compute.c, the links in calibrate_comm.c, the file in calibrate_write.c, what
 * they all use in calibrate_base.c.
 *
 * It needs two or more ranks on this machine: the MPI figures (intra_bw_gbs, intra_lat_us) are an
 * all-reduce between them. Launched on several nodes with as many ranks each (one thread a rank),
 * it writes a two-level profile: devices_per_node is the ranks of a node, intra_* an all-reduce
 * inside each node (none with one rank a node), inter_* one between the nodes, a rank of each
 * (run once on the namespace cluster of scripts/cluster.sh, one rank a host). The order:
 *   1. rank 0 on all cores (its CPU affinity widened to every core the launcher's binding left
 *      out), the others asleep in a polled receive so that they take no core: STREAM triad
 *      bandwidth, the backend's element-wise kernels at the same thread count, the triad on one
 *      thread (printed), and one product on all cores (gemm_thread_eff's numerator);
 *   2. every rank on its own core, one thread each, at once (each core measured with its
 *      neighbours busy, as in a run that uses every core): the FMA peak, the trainer's linear layer
 *      (forward + backward) on a grid of shapes (and with --model that model's own), the backend's
 *      attention forward + backward at a GPT-2 small shape; rank 0's figures are written;
 *   3. the all-reduces; rank 0 writes the file (FILE.tmp, fsync, rename).
 * During each phase rank 0 reads the busy time of its cores from /proc/stat (steal included) and
 * takes away the ranks' own CPU time: when other processes took over a tenth of the cores' time,
 * the file and the output say that the figures are low. (The CPU time a phase got against what it
 * asked for is printed too, but it is no test: rank 0's threads idle in the kernels' serial parts
 * and got 85-97% of the cores on an idle machine.)
 * quick (--quick, used by tests/cli/calibrate.sh) measures fewer products for shorter times and
 * fewer all-reduces: the same figures, noisier.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plan/calibrate-impl.h"

/* Ends a phase that every rank ran (collective): the ranks' CPU time summed, rank 0's estimate of
 * the other processes' share, -1 elsewhere */
static double phase_end(struct l3d_comm *w, const struct l3d_calib *c,
                        const struct l3d_calib_phase_mark *p) {
    double own = l3d_calib_cpu_s() - p->cpu;
    l3d_comm_all_reduce(w, &own, 1, L3D_F64, L3D_SUM, NULL);
    return w->rank == 0 ? l3d_calib_phase_others(c, p, own) : -1.0;
}


/* The launch's nodes (l3d_comm_nodes): one, or several with as many ranks each (a two-level
 * profile); the same on every rank */
static l3d_status launch_nodes(struct l3d_comm *world, struct l3d_calib *c, int *node_of) {
    if (world->size < 2)
        return l3d_error(L3D_ERR_ARG, "--calibrate measures MPI between ranks too, so it needs 2 "
                         "ranks on this machine: OMP_NUM_THREADS=1 mpiexec -n 2 llm3d bench "
                         "--calibrate");
    c->ranks = world->size;
    c->nodes = l3d_comm_nodes(world, node_of);
    c->per_node = 0;
    for (int r = 0; r < world->size; r++) c->per_node += node_of[r] == 0;
    for (int n = 1; n < c->nodes; n++) {
        int k = 0;
        for (int r = 0; r < world->size; r++) k += node_of[r] == n;
        if (k != c->per_node)
            return l3d_error(L3D_ERR_ARG, "--calibrate across nodes needs as many ranks on each "
                             "node (node 0 has %d, node %d has %d): launch the same number per "
                             "host (e.g. mpiexec --map-by ppr:1:node)", c->per_node, n, k);
    }
    return L3D_OK;
}

l3d_status l3d_calib_measure(struct l3d_comm *world, struct l3d_calib *c,
                             l3d_calib_report_fn report, void *arg) {
    const bool lead = world->rank == 0;
    int *node_of = l3d_alloc((size_t)world->size * sizeof(int), "calibrate");
    l3d_status st = launch_nodes(world, c, node_of);
    if (st != L3D_OK) {
        l3d_free(node_of);
        return st;
    }
    double t0 = l3d_time_s();
    int32_t go = 1;
    if (lead) {
        l3d_calib_all_cores(c, report, arg);
        for (int r = 1; r < world->size; r++)
            l3d_comm_send(world, &go, 1, L3D_I32, r, L3D_TAG_CALIBRATE_GO, NULL);
    } else {
        /* wait without taking a core: MPI's blocking wait would spin on it. Every 50 ms: polled
         * each millisecond, the wake-ups cost rank 0's threads 10% of their CPU time and a
         * quarter of the triad's bandwidth */
        l3d_req req = {0};
        l3d_comm_recv(world, &go, 1, L3D_I32, 0, L3D_TAG_CALIBRATE_GO, &req);
        const struct timespec nap = {0, 50000000};
        while (!l3d_comm_test(world, &req)) nanosleep(&nap, NULL);
    }
    l3d_comm_barrier(world);
    struct l3d_calib_phase_mark ph = l3d_calib_phase_start(c);
    l3d_calib_one_core(c);
    for (;;) { /* collective: every rank measures again, or none */
        int32_t again = lead && !l3d_calib_thread_in_range(c) &&
                        c->thread_rounds < L3D_CALIB_MAX_ROUNDS;
        l3d_comm_all_reduce(world, &again, 1, L3D_I32, L3D_MAX, NULL);
        if (!again) break;
        l3d_calib_thread_again(c);
    }
    l3d_calib_fractions(c);
    l3d_comm_barrier(world);
    c->others[1] = phase_end(world, c, &ph);
    c->secs[0] = l3d_time_s() - t0;
    if (lead && report) report(L3D_CALIB_COMPUTE, c, arg);
    ph = l3d_calib_phase_start(c);
    l3d_calib_links(world, c, node_of);
    l3d_free(node_of);
    c->others[2] = phase_end(world, c, &ph);
    c->secs[1] = l3d_time_s() - t0 - c->secs[0];
    c->secs[2] = l3d_time_s() - t0;
    if (lead && report) report(L3D_CALIB_LINKS, c, arg);
    return L3D_OK;
}

/* Without /proc/stat, whether the measurements got less than 90% of the CPU time they asked
 * for */
bool l3d_calib_busy(const struct l3d_calib *c) {
    for (int i = 0; i < 3; i++)
        if (c->others[i] >= 0.0 ? c->others[i] > 0.1 : c->share[i] < 0.9) return true;
    return false;
}

void l3d_calib_print_others(FILE *f, const struct l3d_calib *c) {
    static const char *what[3] = {"on all cores", "on one core each", "during the all-reduces"};
    fprintf(f, "other processes took");
    for (int i = 0; i < 3; i++) {
        if (c->others[i] >= 0.0) fprintf(f, " %.0f%%", 100.0 * c->others[i]);
        else fprintf(f, " ?");
        fprintf(f, " %s%s", what[i], i < 2 ? "," : "");
    }
    fprintf(f, " (of the %d cores' time)", CPU_COUNT(&c->cpus));
}
