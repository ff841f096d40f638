/* What every phase of calibration uses (src/plan/calibrate-impl.h): the median, filled buffers,
 * the process's CPU time, a phase's share of the cores that other processes took, and the
 * kernel-fraction bound. calibrate.c, calibrate_compute.c, calibrate_comm.c and calibrate_write.c
 * call these; this file calls none of them. */
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plan/calibrate-impl.h"
#include "plan/profile-impl.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double l3d_calib_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

float *l3d_calib_filled(int64_t n, float lo, float hi, uint64_t stream) {
    float *p = l3d_alloc((size_t)n * sizeof(float), "calibrate");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * l3d_rng_uniform(1, stream, (uint64_t)i);
    return p;
}

/* Busy time of the CPUs in `set`, summed, in seconds: the user, nice, system, irq, softirq and
 * steal ticks of their cpuN lines in /proc/stat (steal: the hypervisor gave the core to another
 * machine); -1 when unreadable. */
static double cpus_busy_s(const cpu_set_t *set) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1.0;
    char line[512];
    double ticks = 0.0;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long u, n, sy, idle, io, irq, sirq, steal;
        int cpu;
        if (strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9') continue;
        if (sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &u, &n, &sy, &idle,
                   &io, &irq, &sirq, &steal) == 9 &&
            cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, set)) {
            ticks += (double)(u + n + sy + irq + sirq + steal);
            found++;
        }
    }
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    return found > 0 && hz > 0 ? ticks / (double)hz : -1.0;
}

/* CPU time of this process, all its threads, in seconds */
double l3d_calib_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct l3d_calib_phase_mark l3d_calib_phase_start(const struct l3d_calib *c) {
    struct l3d_calib_phase_mark p = {l3d_time_s(), cpus_busy_s(&c->cpus), l3d_calib_cpu_s()};
    return p;
}

double l3d_calib_phase_others(const struct l3d_calib *c, const struct l3d_calib_phase_mark *p,
                              double own) {
    double busy = cpus_busy_s(&c->cpus), wall = l3d_time_s() - p->wall;
    int n = CPU_COUNT(&c->cpus);
    if (busy < 0.0 || p->busy < 0.0 || n < 1 || wall <= 0.0) return -1.0;
    /* the tick counters are read to a tick (1/CLK_TCK s) at each end: two ticks a CPU may be
     * nobody's (a 30 ms phase on 2 cores read 18% without this) */
    return fmax(0.0, busy - p->busy - own - 2.0 * n / (double)sysconf(_SC_CLK_TCK)) / (wall * n);
}

double l3d_calib_kernel_eff_max(void) {
    const struct l3d_profile_key *k = l3d_profile_key_find("kernel_bw_eff");
    L3D_ASSERT(k != NULL);
    return k->hi;
}
