/*
 * llm3d bench --calibrate [--out FILE] [--quick]: measures this machine and writes its system
 * profile (format: profiles/README.md) with `name = local`, where a device is one CPU core.
 *
 *   OMP_NUM_THREADS=1 mpiexec -n 2 llm3d bench --calibrate          # writes ./local.prof
 *
 * It needs two or more ranks on this machine: the MPI figures (intra_bw_gbs, intra_lat_us) are an
 * all-reduce between them. Launched on several nodes with as many ranks each (one thread a rank),
 * it writes a two-level profile: devices_per_node is the ranks of a node, intra_* an all-reduce
 * inside each node (none with one rank a node), inter_* one between the nodes, a rank of each
 * (run once on the namespace cluster of scripts/cluster.sh, one rank a host). The order:
 *   1. rank 0 on all cores (its CPU affinity widened to every core the launcher's binding left
 *      out), the others asleep in a polled receive so that they take no core: STREAM triad
 *      bandwidth, the backend's element-wise kernels at the same thread count, the triad on one
 *      thread (printed);
 *   2. every rank on its own core, one thread each, at once (each core measured with its
 *      neighbours busy, as in a run that uses every core): the FMA peak, the trainer's linear layer
 *      (forward + backward) on a ladder of GPT shapes, the backend's attention forward + backward at a GPT-2 small shape;
 *      rank 0's figures are written;
 *   3. the all-reduces; rank 0 writes the file (FILE.tmp, fsync, rename).
 * During each phase rank 0 reads the busy time of its cores from /proc/stat (steal included) and
 * takes away the ranks' own CPU time: when other processes took over a tenth of the cores' time,
 * the file and the output say that the figures are low. (The CPU time a phase got against what it
 * asked for is printed too, but it is no test: rank 0's threads idle in the kernels' serial parts
 * and got 85-97% of the cores on an idle machine.)
 * --quick (used by tests/cli/calibrate.sh) measures fewer products for shorter times and fewer
 * all-reduces: the same figures, noisier.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "llm3d/backend.h"
#include "llm3d/comm.h"
#include "llm3d/core.h"
#include "llm3d/plan.h"

#define CMD "bench"
#define MAX_POINTS 16

struct calib {
    bool quick;
    int cores;                       /* devices: cores this process may run on */
    double fma;                      /* fp32 FMA peak of one thread, FLOP/s */
    double fma_loop;                 /* the FMA loop's own rate when a product beat it, else 0 */
    double thr_all[4], thr_one[4];   /* linear-layer FLOP/s of thread_shapes: all cores, one */
    double thread_eff;               /* all cores' rate / (cores x one core's), median */
    double bw_one, bw_all;           /* triad, bytes/s: one thread; all cores together */
    size_t triad_bytes;
    int n_eff;                       /* gemm ladder: flops, fraction of fma, shapes per point */
    double eff_flops[MAX_POINTS], eff[MAX_POINTS];
    int eff_shapes;
    int n_wg;                        /* weight-gradient product: tokens, fraction of fma */
    double wg_tok[MAX_POINTS], wg_eff[MAX_POINTS];
    double k_bw[4];                  /* element-wise kernels, bytes/s on all cores */
    int64_t k_n;                     /* elements per kernel array */
    double kernel_bw_eff;
    double attn_fwd_s, attn_bwd_s, attn_eff;
    double mem_bytes;
    int ranks;
    int nodes, per_node;             /* the launch: nodes (l3d_comm_nodes), ranks on each */
    double intra_bw, intra_lat;      /* bytes/s, seconds; 0: not measured (one rank a node) */
    double inter_bw, inter_lat;      /* between nodes (several nodes); 0: one node */
    double secs[3];                  /* time taken: compute, comm, total */
    double share[3];                 /* CPU time got / asked for: all cores, one, all-reduce */
    double others[3];                /* other processes' share of the cores then; -1: unknown */
    cpu_set_t cpus;                  /* the cores rank 0 may use */
    /* llm3d's 16-bit kernels, [0] bf16 and [1] fp16, measured as their fp32 counterparts */
    int n_eff16[2];
    double eff16_flops[2][MAX_POINTS], eff16[2][MAX_POINTS];
    int n_wg16[2];
    double wg16_tok[2][MAX_POINTS], wg16_eff[2][MAX_POINTS];
    double attn16_s[2][2], attn_eff16[2];            /* forward, backward; fraction */
    double thr_all16[2][4], thr_one16[2][4], thread_eff16[2];
    double k_bw16[2][4], kernel_bw_eff16[2];
    /* the type's products run in its own kernels (l3d_be_matmul_native: oneDNN's bf16 matmul on
     * an AVX512-BF16 CPU), and then their peak (the backend's, one core, every core busy), of
     * which the type's fractions are; else 0 and fractions of the fp32 FMA peak */
    bool native16[2];
    double peak16[2];
    /* the links' all-reduce stream (measure_stream): its bytes and rounds; on the DP link, the
     * fraction hidden behind the products, its round's times (s) and the products' count */
    int64_t stream_bytes;
    int stream_rounds;
    double ov_frac, ov_x, ov_c, ov_t;
    int ov_kernels;
    bool thread; /* the world has the progress thread (launched across nodes): the pieces
                  * progress by it, else by tests between the products (the trainer's defaults) */
};

static const enum l3d_dtype types16[2] = {L3D_BF16, L3D_F16};
static const char *const names16[2] = {"bf16", "fp16"};

static const char *k_names[4] = {"layernorm_forward", "gelu_forward", "residual_forward", "adamw"};
static const char *k_names16[4] = {"layernorm_forward", "gelu_forward", "residual_forward",
                                   "adamw_mixed"};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- compute, on rank 0 ------------------------------------------------------------------ */

/* Under mpiexec each rank is bound to one core (Open MPI binds to cores for 2 ranks), so its
 * OpenMP threads would share that core. Asks for every CPU (the kernel keeps those the cpuset
 * allows) and pins the OpenMP pool's threads one to each, returns their number; *was
 * is this thread's mask before, which measure_compute restores for the all-reduces. */
static int widen_affinity(cpu_set_t *was, cpu_set_t *cpus) {
    if (sched_getaffinity(0, sizeof *was, was) != 0) CPU_ZERO(was);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int i = 0; i < CPU_SETSIZE; i++) CPU_SET(i, &all);
    sched_setaffinity(0, sizeof all, &all);
    cpu_set_t got;
    if (sched_getaffinity(0, sizeof got, &got) != 0) return omp_get_num_procs();
    *cpus = got;
    int n = CPU_COUNT(&got);
    omp_set_num_threads(n);
#pragma omp parallel
    {
        /* one thread per core, pinned: threads left free to migrate shared a core for whole
         * milliseconds whenever a sleeping rank woke up on the other's, 5-15% of the CPU time */
        cpu_set_t one;
        CPU_ZERO(&one);
        for (int i = 0, k = 0; i < CPU_SETSIZE; i++)
            if (CPU_ISSET(i, &got) && k++ == omp_get_thread_num()) CPU_SET(i, &one);
        sched_setaffinity(0, sizeof one, &one);
    }
    return n;
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
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A phase's start, to tell how much of the cores' time processes other than the calibration's
 * ranks took meanwhile (rank 0 reads /proc/stat; `own` is the ranks' CPU time, summed) */
struct phase {
    double wall, busy, cpu;
};

static struct phase phase_start(const struct calib *c) {
    struct phase p = {l3d_time_s(), cpus_busy_s(&c->cpus), cpu_s()};
    return p;
}

static double phase_others(const struct calib *c, const struct phase *p, double own) {
    double busy = cpus_busy_s(&c->cpus), wall = l3d_time_s() - p->wall;
    int n = CPU_COUNT(&c->cpus);
    if (busy < 0.0 || p->busy < 0.0 || n < 1 || wall <= 0.0) return -1.0;
    /* the tick counters are read to a tick (1/CLK_TCK s) at each end: two ticks a CPU may be
     * nobody's (a 30 ms phase on 2 cores read 18% without this) */
    return fmax(0.0, busy - p->busy - own - 2.0 * n / (double)sysconf(_SC_CLK_TCK)) / (wall * n);
}

/* Ends a phase that every rank ran (collective): the ranks' CPU time summed, rank 0's estimate of
 * the other processes' share, -1 elsewhere */
static double phase_end(struct l3d_comm *w, const struct calib *c, const struct phase *p,
                        bool lead) {
    double own = cpu_s() - p->cpu;
    l3d_comm_all_reduce(w, &own, 1, L3D_F64, L3D_SUM, NULL);
    return lead ? phase_others(c, p, own) : -1.0;
}

static float *filled(int64_t n, float lo, float hi, uint64_t stream) {
    float *p = l3d_alloc((size_t)n * sizeof(float), "calibrate");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * l3d_rng_uniform(1, stream, (uint64_t)i);
    return p;
}

/* n elements of type dt (fp32, bf16, fp16) uniform in [lo, hi), rounded to dt */
static void *filled_dt(enum l3d_dtype dt, int64_t n, float lo, float hi, uint64_t stream) {
    if (dt == L3D_F32) return filled(n, lo, hi, stream);
    uint16_t *p = l3d_alloc((size_t)n * sizeof(uint16_t), "calibrate");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float f = lo + (hi - lo) * l3d_rng_uniform(1, stream, (uint64_t)i);
        p[i] = dt == L3D_BF16 ? l3d_f32_to_bf16(f) : l3d_f32_to_f16(f);
    }
    return p;
}

/* Best of the passes run in about `seconds` (at least 3, after one warm-up), in seconds. */
#define TIME_BEST(best, seconds, call)                                                             \
    do {                                                                                           \
        call;                                                                                      \
        double start_ = l3d_time_s();                                                              \
        (best) = INFINITY;                                                                         \
        for (int r_ = 0; r_ < 3 || l3d_time_s() - start_ < (seconds); r_++) {                      \
            double t0_ = l3d_time_s();                                                             \
            call;                                                                                  \
            double dt_ = l3d_time_s() - t0_;                                                       \
            if (dt_ < (best)) (best) = dt_;                                                        \
        }                                                                                          \
    } while (0)

#define TIME_ONE(best, call)                                                                       \
    do {                                                                                           \
        double t0_ = l3d_time_s();                                                                 \
        call;                                                                                      \
        (best) = fmin((best), l3d_time_s() - t0_);                                                 \
    } while (0)

/* With all cores: STREAM's triad and four element-wise kernels of the backend, interleaved pass
 * by pass for about `secs` (the memory bandwidth of a shared machine swings by 2x from one second
 * to the next: interleaved, the triad and the kernels see the same spells), the best pass of each.
 * A kernel's bytes are its arrays read and written once (layernorm's rows stay in cache between
 * its passes), counted as the triad is counted, without write-allocate traffic: adamw, which
 * updates in place, can pass the triad. Then the triad on one thread (printed only). */
static void measure_memory(struct l3d_backend *be, struct calib *c) {
    const int64_t n = c->k_n, C = 768, N = n / C;
    const double secs = c->quick ? 0.5 : 3.0;
    float *a = filled(n, -2.0f, 2.0f, 1), *b = filled(n, -2.0f, 2.0f, 2);
    float *m = filled(n, -0.01f, 0.01f, 3), *v = filled(n, 0.0f, 0.01f, 4);
    float *w = filled(C, 0.5f, 1.5f, 5), *bias = filled(C, -0.1f, 0.1f, 6);
    float *mean = filled(N, 0.0f, 0.0f, 7), *rstd = filled(N, 0.0f, 0.0f, 8);
    /* the 16-bit kernels' arrays, shared by bf16 and fp16: bf16 roundings of values in [-2, 2],
     * which read as fp16 are finite values of the same range (no Inf or NaN slows a kernel) */
    void *a16 = filled_dt(L3D_BF16, n, -2.0f, 2.0f, 9);
    void *b16 = filled_dt(L3D_BF16, n, -2.0f, 2.0f, 10);
    void *p16 = filled_dt(L3D_BF16, n, -2.0f, 2.0f, 16);
    void *w16 = filled_dt(L3D_BF16, C, 0.5f, 1.5f, 17);
    void *bias16 = filled_dt(L3D_BF16, C, -0.1f, 0.1f, 18);
    double t[5] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY};
    double t16[2][4] = {{INFINITY, INFINITY, INFINITY, INFINITY},
                        {INFINITY, INFINITY, INFINITY, INFINITY}};
    double start = l3d_time_s(), cpu0 = cpu_s();
    for (int r = 0; r < 5 || l3d_time_s() - start < secs; r++) {
        t[4] = fmin(t[4], l3d_cpu_triad_pass(m, a, b, n)); /* m = a + b / 2 */
        TIME_ONE(t[0], l3d_be_layernorm_forward(be, L3D_F32, b, mean, rstd, a, w, bias, N, C));
        TIME_ONE(t[1], l3d_be_gelu_forward(be, L3D_F32, b, a, n));
        TIME_ONE(t[2], l3d_be_residual_forward(be, L3D_F32, m, a, b, n));
        /* a tiny learning rate: the parameters stay put however often it runs */
        TIME_ONE(t[3], l3d_be_adamw(be, L3D_F32, a, m, v, b, 1.0f, n, 1e-12f, 0.9f, 0.95f, 1e-8f, 0.0f,
                                 0.1f, 0.05f));
        /* the same kernels in 16 bits, as the trainer's --precision bf16|fp16 calls them:
         * 16-bit activations and weights, fp32 statistics; AdamW on fp32 master weights (a),
         * moments and main_grad (b), writing the 16-bit copy */
        for (int i = 0; i < 2; i++) {
            enum l3d_dtype dt = types16[i];
            TIME_ONE(t16[i][0], l3d_be_layernorm_forward(be, dt, b16, mean, rstd, a16, w16, bias16,
                                                         N, C));
            TIME_ONE(t16[i][1], l3d_be_gelu_forward(be, dt, b16, a16, n));
            TIME_ONE(t16[i][2], l3d_be_residual_forward(be, dt, p16, a16, b16, n));
            TIME_ONE(t16[i][3], l3d_be_adamw_mixed(be, dt, L3D_F32, p16, a, m, v, b, 1.0f, n,
                                                   1e-12f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.05f));
        }
    }
    c->share[0] = (cpu_s() - cpu0) / ((l3d_time_s() - start) * omp_get_max_threads());
    c->triad_bytes = 12 * (size_t)n;
    c->bw_all = 12.0 * (double)n / t[4];
    const double bytes[4] = {(2.0 * N * C + 2.0 * N) * 4, 8.0 * n, 12.0 * n, 28.0 * n};
    double frac[4];
    for (int i = 0; i < 4; i++) {
        c->k_bw[i] = bytes[i] / t[i];
        frac[i] = c->k_bw[i] / c->bw_all;
    }
    c->kernel_bw_eff = median(frac, 4);
    /* 16-bit: the 2-byte arrays, fp32 statistics; adamw_mixed reads and writes the fp32 master
     * and moments, reads the fp32 gradient and writes the 16-bit copy (4 x 7 + 2 bytes) */
    const double bytes16[4] = {(2.0 * N * C) * 2 + 2.0 * N * 4, 4.0 * n, 6.0 * n, 30.0 * n};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 4; k++) {
            c->k_bw16[i][k] = bytes16[k] / t16[i][k];
            frac[k] = c->k_bw16[i][k] / c->bw_all;
        }
        c->kernel_bw_eff16[i] = median(frac, 4);
    }
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    double t1 = INFINITY;
    start = l3d_time_s();
    for (int r = 0; r < 3 || l3d_time_s() - start < secs / 4; r++)
        t1 = fmin(t1, l3d_cpu_triad_pass(m, a, b, n));
    c->bw_one = 12.0 * (double)n / t1;
    omp_set_num_threads(threads);
    void *bufs[] = {a, b, m, v, w, bias, mean, rstd, a16, b16, p16, w16, bias16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) l3d_free(bufs[i]);
}

/* The fewest timed passes of a product: 5 (a median of at least 5), 2 under --quick, whose
 * largest products (up to 1e11 FLOPs a pass, a second or more on a core) took most of its time */
static int passes(const struct calib *c) { return c->quick ? 2 : 5; }

/* A linear layer as the trainer runs it, through the backend: the forward product (M x K input,
 * N x K weight, no bias) and the backward's two (input and weight gradients, accumulated), 6 M N K
 * FLOPs. The buffers rotate through sets filling at least 64 MiB, so that each pass finds its
 * weight and activations out of cache, as a layer does after the other layers ran; each product's
 * median pass time (a training step sustains the typical pass, not the best), as FLOP/s: of the
 * layer (.all), of the forward and input-gradient products (.fwd_dx), of the weight gradient
 * (.wgrad). In 16 bits (dt bf16 or fp16) as --precision bf16|fp16 runs it: 16-bit input, weight,
 * output and activation gradients, the weight gradient accumulated into the fp32 main_grad
 * (l3d_be_matmul_backward_mixed); on a CPU without 16-bit products that is the operands widened
 * to fp32 around the fp32 product, the conversions and their fp32 copies' allocation included. */
struct layer_rate {
    double all, fwd_dx, wgrad;
};
static struct layer_rate layer_rates(struct l3d_backend *be, enum l3d_dtype dt, int64_t M,
                                     int64_t N, int64_t K, double secs, int min_n,
                                     bool wgrad_only) {
    /* elements of dt: x, dx (M K), w (N K), y, dy (M N); dw (N K) fp32, counted as 2 of dt */
    const int64_t es = (int64_t)l3d_dtype_size(dt), gw = dt == L3D_F32 ? 1 : 2;
    const int64_t set = 2 * M * K + (1 + gw) * N * K + 2 * M * N; /* elements of dt */
    const int64_t arena = ((int64_t)64 << 20) / es;
    const int64_t sets = set >= arena ? 1 : arena / set;
    /* one set drawn, copied to the others (drawing 64 MiB took longer than the products); the
     * fp32 dw of a 16-bit set holds pairs of 16-bit values: finite fp32 numbers */
    char *buf = l3d_alloc((size_t)(sets * set * es), "calibrate");
    void *first = filled_dt(dt, set, -1e-3f, 1e-3f, 21);
    for (int64_t i = 0; i < sets; i++) memcpy(buf + i * set * es, first, (size_t)(set * es));
    l3d_free(first);
    static double sec[3][512];
    int n = 0;
    const double start = l3d_time_s();
    for (int64_t r = -1; n < min_n || (l3d_time_s() - start < secs && n < 512); r++) {
        char *x = buf + ((r + 1) % sets) * set * es, *w = x + M * K * es, *y = w + N * K * es;
        char *dy = y + M * N * es, *dx = dy + M * N * es, *dw = dx + M * K * es;
        double t0 = l3d_time_s();
        if (!wgrad_only) l3d_be_matmul_forward(be, dt, y, x, w, NULL, M, K, N);
        double t1 = l3d_time_s();
        if (wgrad_only)
            ;
        else if (dt == L3D_F32)
            l3d_be_matmul_backward(be, L3D_F32, dx, NULL, NULL, dy, x, w, M, K, N);
        else
            l3d_be_matmul_backward_mixed(be, dt, L3D_F32, dx, NULL, NULL, dy, x, w, M, K, N);
        double t2 = l3d_time_s();
        if (dt == L3D_F32)
            l3d_be_matmul_backward(be, L3D_F32, NULL, dw, NULL, dy, x, w, M, K, N);
        else
            l3d_be_matmul_backward_mixed(be, dt, L3D_F32, NULL, dw, NULL, dy, x, w, M, K, N);
        double t3 = l3d_time_s();
        if (r >= 0) { /* pass -1: primitives, warm-up */
            sec[0][n] = t1 - t0, sec[1][n] = t2 - t1, sec[2][n] = t3 - t2;
            n++;
        }
    }
    l3d_free(buf);
    const double f = 2.0 * (double)M * N * K;
    double tf = median(sec[0], n), tdx = median(sec[1], n), tw = median(sec[2], n);
    return (struct layer_rate){3 * f / (tf + tdx + tw), 2 * f / (tf + tdx), f / tw};
}
static double layer_flops(struct l3d_backend *be, enum l3d_dtype dt, int64_t M, int64_t N,
                          int64_t K, double secs, int min_n) {
    return layer_rates(be, dt, M, N, K, secs, min_n, false).all;
}

/* Linear layers (layer_rates) on one thread at GPT shapes: rows M of a micro-batch (B*T), N x K
 * from the layers' weights (C, 3C, 4C for C up to 768) and the head dimension, bucketed by the
 * FLOPs of one product (2 M N K) in half decades from 1e6 to 1e11; a point of eff is the
 * geometric mean of its bucket's FLOPs and the median of its layers' forward and input-gradient
 * FLOP/s. The weight gradient has a curve of its own, by tokens: its reduction runs over the M
 * rows, and a backend that accumulates it into an fp32 main_grad may depend on M alone (oneDNN's
 * bf16 product here: 0.39-0.43 of the peak at M = 128 for every weight out of cache,
 * docs/BENCHMARKS.md), so a point of wg is M and the median FLOP/s of the weight-gradient product
 * alone at GPT-2 small's two weights, 768 x 768 and 3072 x 768 (out of every core's cache, as a
 * model's weights are; the ladder's small weights stay in cache). Fractions of the peak: the
 * caller's. */
static void measure_gemm(struct l3d_backend *be, struct calib *c, enum l3d_dtype dt, int *n_eff,
                         double *eff_flops, double *eff, int *n_wg, double *wg_tok,
                         double *wg_eff) {
    static const int64_t Ms[] = {64, 256, 1024, 2048};
    static const int64_t NKs[] = {64, 192, 256, 768, 1024, 2304, 3072};
    const int per_bucket = c->quick ? 1 : 3;
    const double secs = c->quick ? 0.02 : 0.3;
    *n_eff = 0;
    c->eff_shapes = 0;
    for (int k = 12; k < 22; k++) { /* bucket [10^(k/2), 10^((k+1)/2)) */
        double lo = pow(10.0, k / 2.0), hi = pow(10.0, (k + 1) / 2.0);
        int64_t shape[128][3];
        int n = 0;
        for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++)
            for (size_t j = 0; j < sizeof NKs / sizeof NKs[0]; j++)
                for (size_t l = 0; l < sizeof NKs / sizeof NKs[0]; l++) {
                    double f = 2.0 * Ms[i] * NKs[j] * NKs[l];
                    if (f >= lo && f < hi && n < 128)
                        shape[n][0] = Ms[i], shape[n][1] = NKs[j], shape[n][2] = NKs[l], n++;
                }
        if (n == 0) continue;
        int take = n < per_bucket ? n : per_bucket;
        double frac[8], logf = 0.0;
        for (int s = 0; s < take; s++) {
            /* spread over the bucket's list (M slowest): different aspect ratios */
            int idx = take == 1 ? n / 2 : s * (n - 1) / (take - 1);
            const int64_t *sh = shape[idx];
            double f = 2.0 * sh[0] * sh[1] * sh[2];
            frac[s] = layer_rates(be, dt, sh[0], sh[1], sh[2], secs, passes(c), false).fwd_dx;
            logf += log(f);
        }
        eff_flops[*n_eff] = exp(logf / take);
        eff[*n_eff] = median(frac, take);
        (*n_eff)++;
        c->eff_shapes += take;
    }
    static const int64_t toks[] = {64, 128, 256, 512, 1024, 2048};
    static const int64_t weights[2][2] = {{768, 768}, {3072, 768}}; /* N outputs x K inputs */
    *n_wg = 0;
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        double r[2];
        for (int w = 0; w < 2; w++)
            r[w] = layer_rates(be, dt, toks[i], weights[w][0], weights[w][1], secs, passes(c),
                               true).wgrad;
        wg_tok[*n_wg] = (double)toks[i];
        wg_eff[(*n_wg)++] = median(r, 2);
    }
}

/* Attention core at GPT-2 small's shape with one thread: best forward and backward times. The
 * caller divides model FLOPs 12 B T^2 C (Narayanan et al. 2021, sec. 5.1: 4 B s^2 h for Q K^T
 * and P V forward, twice that backward) by them: the full T^2, the masked causal half counted,
 * as Megatron counts it (the tiled kernel skips the blocks above the diagonal, about half). */
static void measure_attention(struct l3d_backend *be, const struct calib *c, enum l3d_dtype dt,
                              double *fwd_s, double *bwd_s) {
    const int64_t B = 4, T = 256, NH = 12, HS = 64, C = NH * HS;
    void *qkv = filled_dt(dt, B * T * 3 * C, -1.0f, 1.0f, 11);
    void *dout = filled_dt(dt, B * T * C, -1.0f, 1.0f, 12);
    void *out = filled_dt(dt, B * T * C, 0.0f, 0.0f, 13);
    void *dqkv = filled_dt(dt, B * T * 3 * C, 0.0f, 0.0f, 14);
    float *lse = filled(B * NH * T, 0.0f, 0.0f, 15);
    const double secs = c->quick ? 0.1 : 1.0;
    TIME_BEST(*fwd_s, secs, l3d_be_attention_forward(be, dt, out, lse, qkv, B, T, NH, HS));
    TIME_BEST(*bwd_s, secs, l3d_be_attention_backward(be, dt, dqkv, dout, qkv, out, lse, B, T, NH,
                                                      HS));
    void *bufs[] = {qkv, dout, out, dqkv, lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) l3d_free(bufs[i]);
}

/* GPT-2 124M's products at 512 and 2048 rows: one product on every thread of a rank against the
 * same on one core (gemm_thread_eff) */
static const int64_t thread_shapes[4][3] = {
    {512, 2304, 768}, {512, 768, 3072}, {2048, 3072, 768}, {2048, 768, 768}};

/* Rank 0, every core: triad bandwidth and the element-wise kernels; then back on its binding. */
static void measure_all_cores(struct calib *c) {
    struct l3d_backend *be = l3d_backend_cpu_init();
    cpu_set_t bound;
    c->cores = widen_affinity(&bound, &c->cpus);
    const struct phase ph = phase_start(c); /* the other ranks sleep meanwhile */
    c->k_n = (int64_t)(c->quick ? 16 : 32) << 20;
    printf("calibrating on %d cores%s\n", c->cores, c->quick ? " (--quick)" : "");
    fflush(stdout);
    omp_set_num_threads(c->cores);
    measure_memory(be, c);
    printf("memory bandwidth (triad): %.1f GB/s on %d cores (%.1f a core), %.1f GB/s on one\n",
           c->bw_all / 1e9, c->cores, c->bw_all / 1e9 / c->cores, c->bw_one / 1e9);
    for (int i = 0; i < 4; i++)
        printf("  %-18s %6.1f GB/s on %d cores (%.0f%%)\n", k_names[i], c->k_bw[i] / 1e9,
               c->cores, 100.0 * c->k_bw[i] / c->bw_all);
    for (int i = 0; i < 4; i++)
        c->thr_all[i] = layer_flops(be, L3D_F32, thread_shapes[i][0], thread_shapes[i][1],
                                    thread_shapes[i][2], c->quick ? 0.05 : 0.3, passes(c));
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 4; i++)
            c->thr_all16[t][i] = layer_flops(be, types16[t], thread_shapes[i][0],
                                             thread_shapes[i][1], thread_shapes[i][2],
                                             c->quick ? 0.05 : 0.3, passes(c));
    fflush(stdout);
    c->others[0] = phase_others(c, &ph, cpu_s() - ph.cpu);
    if (CPU_COUNT(&bound) > 0) sched_setaffinity(0, sizeof bound, &bound);
    l3d_backend_free(be);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    c->mem_bytes = pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

/* Every rank at once, one thread each on its own core, so that each core is measured with its
 * neighbours busy, as in a run that uses every core (a core alone clocks higher and has the
 * memory to itself): the FMA peak before, between and after the products (the highest: the
 * clock and the neighbours vary), the linear layers of the ladder, the attention kernels. */
static void measure_one_core(struct calib *c, bool lead) {
    struct l3d_backend *be = l3d_backend_cpu_init();
    omp_set_num_threads(1);
    double wall0 = l3d_time_s(), cpu0 = cpu_s();
    c->fma = l3d_cpu_fma_peak(1.0);
    measure_gemm(be, c, L3D_F32, &c->n_eff, c->eff_flops, c->eff, &c->n_wg, c->wg_tok,
                 c->wg_eff);
    c->fma = fmax(c->fma, l3d_cpu_fma_peak(1.0));
    measure_attention(be, c, L3D_F32, &c->attn_fwd_s, &c->attn_bwd_s);
    for (int i = 0; i < 4; i++)
        c->thr_one[i] = layer_flops(be, L3D_F32, thread_shapes[i][0], thread_shapes[i][1],
                                    thread_shapes[i][2], c->quick ? 0.05 : 0.3, passes(c));
    c->fma = fmax(c->fma, l3d_cpu_fma_peak(1.0));
    /* the 16-bit kernels (llm3d's --precision bf16|fp16), after the fp32 ones */
    for (int t = 0; t < 2; t++) {
        c->native16[t] = l3d_be_matmul_native(be, types16[t]);
        c->peak16[t] = c->native16[t] ? l3d_be_peak_flops(be, types16[t]) : 0.0;
        int shapes = c->eff_shapes;
        measure_gemm(be, c, types16[t], &c->n_eff16[t], c->eff16_flops[t], c->eff16[t],
                     &c->n_wg16[t], c->wg16_tok[t], c->wg16_eff[t]);
        c->eff_shapes = shapes;
        measure_attention(be, c, types16[t], &c->attn16_s[t][0], &c->attn16_s[t][1]);
        for (int i = 0; i < 4; i++)
            c->thr_one16[t][i] = layer_flops(be, types16[t], thread_shapes[i][0],
                                             thread_shapes[i][1], thread_shapes[i][2],
                                             c->quick ? 0.05 : 0.3, passes(c));
    }
    c->fma = fmax(c->fma, l3d_cpu_fma_peak(1.0));
    c->share[1] = (cpu_s() - cpu0) / (l3d_time_s() - wall0);
    double ratio[4];
    for (int i = 0; i < 4; i++) ratio[i] = c->thr_all[i] / (c->cores * c->thr_one[i]);
    c->thread_eff = median(ratio, 4);
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 4; i++) ratio[i] = c->thr_all16[t][i] / (c->cores * c->thr_one16[t][i]);
        c->thread_eff16[t] = median(ratio, 4);
    }
    /* The peak is at least the fastest rate measured: a slowed FMA loop (a sanitizer build, a
     * core taken away during its rounds) must not give fractions above 1, which plan rejects. */
    const double attn_flops = 12.0 * 4 * 256 * 256 * 768;
    const double attn_rate = attn_flops / (c->attn_fwd_s + c->attn_bwd_s);
    /* A type whose products run natively has a peak of its own, raised the same way. */
    double top = attn_rate, top16[2] = {0, 0};
    for (int i = 0; i < c->n_eff; i++) top = fmax(top, c->eff[i]);
    for (int i = 0; i < c->n_wg; i++) top = fmax(top, c->wg_eff[i]);
    for (int i = 0; i < 4; i++) top = fmax(top, c->thr_one[i]);
    for (int t = 0; t < 2; t++) {
        double *tp = c->native16[t] ? &top16[t] : &top;
        *tp = fmax(*tp, attn_flops / (c->attn16_s[t][0] + c->attn16_s[t][1]));
        for (int i = 0; i < c->n_eff16[t]; i++) *tp = fmax(*tp, c->eff16[t][i]);
        for (int i = 0; i < c->n_wg16[t]; i++) *tp = fmax(*tp, c->wg16_eff[t][i]);
        for (int i = 0; i < 4; i++) *tp = fmax(*tp, c->thr_one16[t][i]);
    }
    c->fma_loop = 0.0;
    if (top > c->fma) c->fma_loop = c->fma, c->fma = top;
    for (int i = 0; i < c->n_eff; i++) c->eff[i] /= c->fma;
    for (int i = 0; i < c->n_wg; i++) c->wg_eff[i] /= c->fma;
    c->attn_eff = attn_rate / c->fma;
    for (int t = 0; t < 2; t++) {
        if (c->native16[t]) c->peak16[t] = fmax(c->peak16[t], top16[t]);
        double peak = c->native16[t] ? c->peak16[t] : c->fma;
        for (int i = 0; i < c->n_eff16[t]; i++) c->eff16[t][i] /= peak;
        for (int i = 0; i < c->n_wg16[t]; i++) c->wg16_eff[t][i] /= peak;
        c->attn_eff16[t] = attn_flops / (c->attn16_s[t][0] + c->attn16_s[t][1]) / peak;
    }
    l3d_backend_free(be);
    if (!lead) return;
    printf("fp32 FMA peak of one core, every core busy: %.1f GFLOP/s\n", c->fma / 1e9);
    if (c->fma_loop > 0.0)
        printf("warning: the FMA loop ran at %.1f GFLOP/s, below a measured product; the peak is "
               "the fastest product's rate (a sanitizer build, or a busy machine: calibrate again "
               "on an idle machine with a release build)\n", c->fma_loop / 1e9);
    printf("linear layer forward + input gradient, one core (fraction of the FMA peak):");
    for (int i = 0; i < c->n_eff; i++) printf(" %.2g:%.2f", c->eff_flops[i], c->eff[i]);
    printf("\nweight gradient by tokens:");
    for (int i = 0; i < c->n_wg; i++) printf(" %.0f:%.2f", c->wg_tok[i], c->wg_eff[i]);
    printf("\n");
    printf("attention B=4 T=256 NH=12 HS=64, one core: forward %.1f ms, backward %.1f ms, "
           "%.0f%% of the FMA peak\n", c->attn_fwd_s * 1e3, c->attn_bwd_s * 1e3, 100.0 * c->attn_eff);
    printf("linear layers on all %d cores of one rank against %d single cores: %.2f\n", c->cores, c->cores,
           c->thread_eff);
    for (int t = 0; t < 2; t++) {
        printf("%s (llm3d's 16-bit kernels): linear layer", names16[t]);
        for (int i = 0; i < c->n_eff16[t]; i++)
            printf(" %.2g:%.2f", c->eff16_flops[t][i], c->eff16[t][i]);
        printf("; weight gradient");
        for (int i = 0; i < c->n_wg16[t]; i++)
            printf(" %.0f:%.2f", c->wg16_tok[t][i], c->wg16_eff[t][i]);
        printf("; attention %.0f%%; %d cores %.2f; element-wise %.0f%% of the triad\n",
               100.0 * c->attn_eff16[t], c->cores, c->thread_eff16[t],
               100.0 * c->kernel_bw_eff16[t]);
    }
    fflush(stdout);
}

/* ---- all-reduce, on every rank ----------------------------------------------------------- */

/* Latency: the median of back-to-back 8-byte all-reduces over g (every rank; *lat in seconds on
 * each). */
static void all_reduce_latency(struct l3d_comm *g, bool quick, double *lat) {
    const int lat_reps = quick ? 300 : 5000;
    float buf[2] = {1e-6f, 1e-6f};
    double *t = l3d_alloc((size_t)lat_reps * sizeof(double), "calibrate");
    for (int r = 0; r < 20; r++) l3d_comm_all_reduce(g, buf, 2, L3D_F32, L3D_SUM, NULL);
    l3d_comm_barrier(g);
    for (int r = 0; r < lat_reps; r++) {
        double t0 = l3d_time_s();
        l3d_comm_all_reduce(g, buf, 2, L3D_F32, L3D_SUM, NULL);
        t[r] = l3d_time_s() - t0;
    }
    *lat = median(t, lat_reps);
    l3d_free(t);
}

/* DP overlap, the profile's dp_overlap: how much of a gradient reduction hides behind backward
 * when it runs as the trainer runs it. The reduction: 32 MiB (16 with --quick) of fp32 zeros
 * all-reduced in the trainer's 4 MiB non-blocking pieces, all posted at once (src/parallel/dp.c).
 * The backward: the input and weight gradients of a linear layer of 256 x 768 x 768 (d12's
 * attention projection on 2 x 128 tokens, a few ms on a core), one thread a rank, repeated for
 * about twice the reduction's time so that the reduction could hide entirely; polled between the
 * products
 * (l3d_comm_test of every piece, the trainer's --progress poll) unless the world has the progress
 * thread (--progress thread, the default across nodes). Each round times, after a barrier, the
 * reduction alone posted and waited (X), the products alone (C) and both (T); hidden = (C + X -
 * T) / X, clamped to 0..1 (the products slowed by as much as the reduction took: 0), the median
 * of the rounds. The link's bandwidth is the same stream's: bus bandwidth (nccl-tests: bytes /
 * time x 2 (p - 1) / p) of each round's X, the median; a sustained rate, as the gradients move
 * (isolated 1-4 MiB all-reduces, measured until 2026-12-04, gave twice the rate a 1 Gbit/s
 * token-bucket link sustains: bench/allreduce.c across two namespace hosts, 0.13 against 0.06
 * GB/s). Every rank of g; figures on each; the products and the overlap only with dp (the DP
 * link), else the stream alone. */
#define OV_PIECE ((int64_t)1 << 20) /* fp32 elements: the trainer's 4 MiB bucket */
struct ov_work {
    struct l3d_backend *be;
    float *x, *w, *dy, *dx, *dw, *grad;
    l3d_req *reqs;
    int64_t n;
};

static double ov_time(struct l3d_comm *g, struct ov_work *k, int kernels, bool comm, bool poll) {
    int np = 0;
    l3d_comm_barrier(g);
    double t0 = l3d_time_s();
    for (int64_t o = 0; comm && o < k->n; o += OV_PIECE, np++)
        l3d_comm_all_reduce(g, k->grad + o, k->n - o < OV_PIECE ? k->n - o : OV_PIECE, L3D_F32,
                            L3D_SUM, &k->reqs[np]);
    for (int i = 0; i < kernels; i++) {
        l3d_be_matmul_backward(k->be, L3D_F32, k->dx, k->dw, NULL, k->dy, k->x, k->w, 256, 768,
                               768);
        for (int j = 0; poll && j < np; j++)
            if (k->reqs[j].active) l3d_comm_test(g, &k->reqs[j]);
    }
    for (int j = 0; j < np; j++)
        if (k->reqs[j].active) l3d_comm_wait(g, &k->reqs[j]);
    return l3d_time_s() - t0;
}

static void measure_stream(struct l3d_comm *g, struct calib *c, bool dp, double *bw) {
    struct l3d_backend *be = l3d_backend_cpu_init();
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    struct ov_work k = {.be = be, .n = (c->quick ? 16 : 32) * OV_PIECE / 4};
    k.x = filled(256 * 768, -1.0f, 1.0f, 31);
    k.w = filled(768 * 768, -0.03f, 0.03f, 32);
    k.dy = filled(256 * 768, -1.0f, 1.0f, 33);
    k.dx = filled(256 * 768, 0.0f, 0.0f, 34);
    k.dw = filled(768 * 768, 0.0f, 0.0f, 35);
    k.grad = filled(k.n, 0.0f, 0.0f, 36); /* zeros: the sums stay zeros, round after round */
    k.reqs = l3d_calloc((size_t)(k.n / OV_PIECE + 1) * sizeof(l3d_req), "calibrate");
    const bool poll = !c->thread;
    ov_time(g, &k, dp ? 2 : 0, true, poll); /* warm-up: primitives, MPI's buffers */
    /* the products' count: twice the reduction's time, the same on every rank (the largest) */
    double kernels = 0;
    if (dp) {
        double x0 = ov_time(g, &k, 0, true, poll), k1 = ov_time(g, &k, 4, false, poll) / 4;
        kernels = fmin(fmax(ceil(2.0 * x0 / k1), 4.0), 4000.0);
        l3d_comm_all_reduce(g, &kernels, 1, L3D_F64, L3D_MAX, NULL);
    }
    const int rounds = c->quick ? 3 : 7;
    double f[7] = {0}, xs[7], cs[7], ts[7], rate[7];
    const double p = g->size;
    for (int r = 0; r < rounds; r++) {
        xs[r] = ov_time(g, &k, 0, true, poll);
        rate[r] = 4.0 * (double)k.n / xs[r] * 2.0 * (p - 1) / p;
        if (!dp) continue;
        cs[r] = ov_time(g, &k, (int)kernels, false, poll);
        ts[r] = ov_time(g, &k, (int)kernels, true, poll);
        f[r] = fmin(1.0, fmax(0.0, (cs[r] + xs[r] - ts[r]) / xs[r]));
    }
    *bw = median(rate, rounds);
    c->stream_bytes = k.n * 4;
    c->stream_rounds = rounds;
    if (dp) { /* the DP link's: the figure and the times of the round that gave it */
        double sorted[7];
        memcpy(sorted, f, sizeof f);
        c->ov_frac = median(sorted, rounds);
        for (int r = 0; r < rounds; r++)
            if (f[r] == c->ov_frac) c->ov_x = xs[r], c->ov_c = cs[r], c->ov_t = ts[r];
        c->ov_kernels = (int)kernels;
    }
    float *bufs[] = {k.x, k.w, k.dy, k.dx, k.dw, k.grad};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) l3d_free(bufs[i]);
    l3d_free(k.reqs);
    omp_set_num_threads(threads);
    l3d_backend_free(be);
}

/* The links, on every rank; results on rank 0. One node: the all-reduce among all ranks (intra).
 * Several (a two-level profile): inside each node among its ranks, every node at once (intra;
 * none with one rank a node), then between nodes among one rank of each, the lowest (inter: the
 * network, what the planner divides among a node's ranks that send at once). */
static void measure_comm(struct l3d_comm *w, struct calib *c, const int *node_of) {
    const double wall0 = l3d_time_s(), cpu0 = cpu_s();
    if (c->nodes == 1) {
        all_reduce_latency(w, c->quick, &c->intra_lat);
        measure_stream(w, c, true, &c->intra_bw);
    } else {
        struct l3d_comm *node = NULL, *leads = NULL;
        int first = w->rank; /* the lowest rank of this rank's node */
        for (int r = 0; r < w->rank; r++)
            if (node_of[r] == node_of[w->rank]) { first = r; break; }
        if (l3d_comm_split(w, node_of[w->rank], w->rank, &node) != L3D_OK ||
            l3d_comm_split(w, first == w->rank ? 0 : 1, w->rank, &leads) != L3D_OK)
            l3d_fatal(__FILE__, __LINE__, "calibrate: cannot split the world by node: %s",
                      l3d_error_message());
        if (c->per_node > 1) {
            all_reduce_latency(node, c->quick, &c->intra_lat);
            measure_stream(node, c, false, &c->intra_bw);
        }
        l3d_comm_barrier(w);
        if (first == w->rank) {
            all_reduce_latency(leads, c->quick, &c->inter_lat);
            measure_stream(leads, c, true, &c->inter_bw);
        }
        l3d_comm_barrier(w);
        l3d_comm_free(leads);
        l3d_comm_free(node);
    }
    c->share[2] = (cpu_s() - cpu0) / (l3d_time_s() - wall0);
}

/* ---- the file ---------------------------------------------------------------------------- */

static void cpu_model(char *out, size_t n) {
    snprintf(out, n, "x86-64 CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            colon += 1 + strspn(colon + 1, " \t");
            colon[strcspn(colon, "\n")] = '\0';
            if (*colon) snprintf(out, n, "%s", colon);
            break;
        }
    }
    fclose(f);
}

/* Did other processes take more than a tenth of the cores' time during a phase? Without
 * /proc/stat, whether the measurements got less than 90% of the CPU time they asked for. */
static bool busy(const struct calib *c) {
    for (int i = 0; i < 3; i++)
        if (c->others[i] >= 0.0 ? c->others[i] > 0.1 : c->share[i] < 0.9) return true;
    return false;
}

static void print_others(FILE *f, const struct calib *c) {
    static const char *what[3] = {"on all cores", "on one core each", "during the all-reduces"};
    fprintf(f, "other processes took");
    for (int i = 0; i < 3; i++) {
        if (c->others[i] >= 0.0) fprintf(f, " %.0f%%", 100.0 * c->others[i]);
        else fprintf(f, " ?");
        fprintf(f, " %s%s", what[i], i < 2 ? "," : "");
    }
    fprintf(f, " (of the %d cores' time)", CPU_COUNT(&c->cpus));
}

/* The four kernels above one by one (their order is enum l3d_kern's), for the planner, which
 * times each element-wise pass at its own kernel's figure: LayerNorm and GELU are bound by their
 * arithmetic, a residual add and AdamW by memory, so the median fits none of them */
static void write_kern(FILE *f, const char *key, const double *k_bw, double bw_all) {
    fprintf(f, "%s =", key);
    for (int i = 0; i < L3D_KERN_N; i++)
        fprintf(f, " %s:%.3f", l3d_kern_name((enum l3d_kern)i), k_bw[i] / bw_all);
    fprintf(f, "\n");
}

static void write_profile(FILE *f, const struct calib *c) {
    char date[32], model[160];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    cpu_model(model, sizeof model);
    char by[96];
    snprintf(by, sizeof by, "# measured by llm3d bench --calibrate%s on %s", c->quick ? " --quick" : "",
             date);
    fprintf(f, "# This machine, written by llm3d bench --calibrate%s on %s (%.0f s); format: "
               "profiles/README.md.\n# A device is one CPU core: a rank with k OpenMP threads uses "
               "k devices (llm3d plan --threads k).\n",
            c->quick ? " --quick" : "", date, c->secs[2]);
    if (busy(c)) {
        fprintf(f, "# WARNING: ");
        print_others(f, c);
        fprintf(f, "; the measurements got %.0f%% of the %d cores, %.0f%% of one, %.0f%% during the "
                   "all-reduces: these figures are low\n",
                100.0 * c->share[0], c->cores, 100.0 * c->share[1], 100.0 * c->share[2]);
    }
    fprintf(f, "name = local\n");
    fprintf(f, "device = one core of %s (%d cores%s)\n", model, c->cores,
            __builtin_cpu_supports("avx512f") ? ", AVX-512" : ", AVX2");
    if (c->fma_loop > 0.0)
        fprintf(f, "\n# warning: the FMA loop ran at %.4g TFLOP/s, below a measured product: the peak "
                   "below is the fastest product's rate", c->fma_loop / 1e12);
    fprintf(f, "\n%s: fp32 fused multiply-adds of one thread, every core running the same at once, "
               "independent %s chains, the best of 5 rounds before, between and after the products "
               "below%s\n",
            by, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2",
            c->fma_loop > 0.0 ? ", or the fastest product's rate where that was higher" : "");
    fprintf(f, "peak_tflops_fp32 = %.4g\n", c->fma / 1e12);
    for (int t = 0; t < 2; t++) {
        if (c->native16[t])
            fprintf(f, "%s: %s dot products (the backend's peak of its %s products) of one "
                       "thread, every core running the same at once, or the fastest %s product's "
                       "rate where that was higher\npeak_tflops_%s = %.4g\n",
                    by, names16[t], names16[t], names16[t], names16[t], c->peak16[t] / 1e12);
        else
            fprintf(f, "# not measured: the backend's %s products are fp32 products here\n"
                       "peak_tflops_%s = 0\n", names16[t], names16[t]);
    }
    fprintf(f, "\n%s: physical memory (sysconf, %.1f GB) / %d cores\n", by, c->mem_bytes / 1e9,
            c->cores);
    fprintf(f, "mem_gb = %.4g\n", c->mem_bytes / 1e9 / c->cores);
    fprintf(f, "%s: STREAM triad (12 bytes an element) on all %d cores at once over 3 arrays of "
               "%zu MiB in all, best pass, interleaved with the kernels below: %.1f GB/s / %d cores (one core alone: %.1f GB/s)\n",
            by, c->cores, c->triad_bytes >> 20, c->bw_all / 1e9, c->cores, c->bw_one / 1e9);
    fprintf(f, "mem_bw_gbs = %.4g\n", c->bw_all / 1e9 / c->cores);
    const int n_lat = c->quick ? 300 : 5000;
    char stream[160];
    snprintf(stream, sizeof stream, "bus bandwidth 2(p-1)/p bytes/time of %.0f MiB in 4 MiB "
             "non-blocking pieces posted together (the trainer's gradient stream), median of %d",
             (double)c->stream_bytes / 1048576.0, c->stream_rounds);
    if (c->nodes == 1) {
        fprintf(f, "\n%s: cores (logical CPUs this process may use)\n", by);
        fprintf(f, "devices_per_node = %d\n", c->cores);
    } else {
        fprintf(f, "\n%s: the ranks launched on each of %d nodes (a device is a rank's core: "
                   "launch one OpenMP thread a rank)\n", by, c->nodes);
        fprintf(f, "devices_per_node = %d\n", c->per_node);
    }
    fprintf(f, "# cores share no faster link than memory\npair_size = 1\npair_bw_gbs = 0\n");
    if (c->nodes > 1 && c->per_node == 1) {
        fprintf(f, "# one rank a node: no link inside a node measured (the planner uses mem_bw)\n"
                   "intra_bw_gbs = 0\nintra_lat_us = 0\n");
    } else {
        fprintf(f, "%s: all-reduce between %d ranks of %s through the communicator (%s): %s\n",
                by, c->nodes == 1 ? c->ranks : c->per_node,
                c->nodes == 1 ? "this machine" : "each node, every node at once",
                l3d_comm_mpi_library(), stream);
        fprintf(f, "intra_bw_gbs = %.4g\n", c->intra_bw / 1e9);
        fprintf(f, "%s: median of %d back-to-back 8-byte all-reduces\n", by, n_lat);
        fprintf(f, "intra_lat_us = %.4g\n", c->intra_lat * 1e6);
    }
    if (c->nodes == 1) {
        fprintf(f, "# one node: no network\ninter_bw_gbs = 0\ninter_lat_us = 0\n");
    } else {
        fprintf(f, "%s: all-reduce between the %d nodes, one rank each (the lowest), through the "
                   "communicator (%s): %s\n", by, c->nodes, l3d_comm_mpi_library(), stream);
        fprintf(f, "inter_bw_gbs = %.4g\n", c->inter_bw / 1e9);
        fprintf(f, "%s: median of %d back-to-back 8-byte all-reduces between the nodes\n", by,
                n_lat);
        fprintf(f, "inter_lat_us = %.4g\n", c->inter_lat * 1e6);
    }
    fprintf(f, "\n%s: the backend's linear layer, its forward and input-gradient products (4 M N K FLOPs), on one core (every core busy with the same), "
               "%d GPT shapes (M in 64..2048, N and K in 64..3072), buffers rotating over 64 MiB, median pass each, "
               "bucketed by the FLOPs of one product (2 M N K) in half decades: geometric-mean FLOPs, "
               "median fraction of the FMA peak\n",
            by, c->eff_shapes);
    fprintf(f, "gemm_eff =");
    for (int i = 0; i < c->n_eff; i++) fprintf(f, " %.3g:%.3f", c->eff_flops[i], c->eff[i]);
    fprintf(f, "\n%s: the linear layer's weight-gradient product alone (2 M N K FLOPs, accumulated into the "
               "gradient), by the tokens M it reduces over, at GPT-2 small's weights 768x768 and 3072x768 (out of "
               "cache), buffers rotating over 64 MiB, median pass: the mean of the two, fraction of the FMA peak\n", by);
    fprintf(f, "gemm_eff_wgrad =");
    for (int i = 0; i < c->n_wg; i++) fprintf(f, " %.0f:%.3f", c->wg_tok[i], c->wg_eff[i]);
    fprintf(f, "\n%s: the backend's attention forward + backward on one core (every core busy) at B=4 T=256 NH=12 "
               "HS=64 (%.1f + %.1f ms, best passes); model FLOPs 12 B T^2 C (forward 4 B T^2 C, "
               "backward twice that; the full T^2, causal half not removed, as Narayanan et al. "
               "2021 count) / time / FMA peak\n",
            by, c->attn_fwd_s * 1e3, c->attn_bwd_s * 1e3);
    fprintf(f, "attn_eff = %.3f\n", c->attn_eff);
    fprintf(f, "%s: the linear layer on all %d cores of one process against %d single cores (every core "
               "busy), GPT-2 124M's shapes:", by, c->cores, c->cores);
    for (int i = 0; i < 4; i++)
        fprintf(f, " %lldx%lldx%lld %.2f%s", (long long)thread_shapes[i][0],
                (long long)thread_shapes[i][1], (long long)thread_shapes[i][2],
                c->thr_all[i] / (c->cores * c->thr_one[i]), i < 3 ? "," : "");
    fprintf(f, "; the median\ngemm_thread_eff = %.3f\n", c->thread_eff);
    fprintf(f, "%s: the backend's element-wise kernels on all %d cores over %lld-element arrays, "
               "bytes read + written once / best time / triad bandwidth of all cores, interleaved:",
            by, c->cores, (long long)c->k_n);
    for (int i = 0; i < 4; i++)
        fprintf(f, " %s %.2f%s", k_names[i], c->k_bw[i] / c->bw_all, i < 3 ? "," : "");
    fprintf(f, "; the median\nkernel_bw_eff = %.3f\n", c->kernel_bw_eff);
    write_kern(f, "kernel_bw_effs", c->k_bw, c->bw_all);
    for (int t = 0; t < 2; t++) {
        const char *n = names16[t];
        fprintf(f, "\n# llm3d's %s kernels (--precision %s: 16-bit activations and weights, fp32 "
                   "main_grad), %s\n", n, n,
                c->native16[t] ? "products in oneDNN's own 16-bit kernels (fp32 sums)"
                : "products widened to fp32 around the fp32 product on this CPU, conversions "
                  "included");
        fprintf(f, "%s: whether the products run in 16-bit kernels (no fp32 copies of their "
                   "operands: the planner's memory leaves those out)\ngemm_native_%s = %s\n", by,
                n, c->native16[t] ? "yes" : "no");
        fprintf(f, "%s: the linear layer as gemm_eff, in %s through the backend (forward and input "
                   "gradient), the same shapes and buckets; fraction of %s%s\n",
                by, n, c->native16[t] ? "peak_tflops_" : "the fp32 FMA peak",
                c->native16[t] ? n : "");
        fprintf(f, "gemm_eff_%s =", n);
        for (int i = 0; i < c->n_eff16[t]; i++)
            fprintf(f, " %.3g:%.3f", c->eff16_flops[t][i], c->eff16[t][i]);
        fprintf(f, "\n%s: the weight gradient as gemm_eff_wgrad, in %s (into the fp32 main_grad)\n",
                by, n);
        fprintf(f, "gemm_eff_wgrad_%s =", n);
        for (int i = 0; i < c->n_wg16[t]; i++)
            fprintf(f, " %.0f:%.3f", c->wg16_tok[t][i], c->wg16_eff[t][i]);
        fprintf(f, "\n%s: the attention as attn_eff, in %s (%.1f + %.1f ms)\n", by, n,
                c->attn16_s[t][0] * 1e3, c->attn16_s[t][1] * 1e3);
        fprintf(f, "attn_eff_%s = %.3f\n", n, c->attn_eff16[t]);
        fprintf(f, "%s: as gemm_thread_eff, in %s:", by, n);
        for (int i = 0; i < 4; i++)
            fprintf(f, " %.2f", c->thr_all16[t][i] / (c->cores * c->thr_one16[t][i]));
        fprintf(f, "; the median\ngemm_thread_eff_%s = %.3f\n", n, c->thread_eff16[t]);
        fprintf(f, "%s: as kernel_bw_eff, in %s, bytes at 2 an element (fp32 statistics; "
                   "adamw_mixed 30 bytes: fp32 master, moments, gradient and the 16-bit copy):", by,
                n);
        for (int i = 0; i < 4; i++)
            fprintf(f, " %s %.2f%s", k_names16[i], c->k_bw16[t][i] / c->bw_all, i < 3 ? "," : "");
        fprintf(f, "; the median\nkernel_bw_eff_%s = %.3f\n", n, c->kernel_bw_eff16[t]);
        char key[32];
        snprintf(key, sizeof key, "kernel_bw_effs_%s", n);
        write_kern(f, key, c->k_bw16[t], c->bw_all);
    }
    fprintf(f, "%s: %.0f MiB of gradients all-reduced %s in 4 MiB non-blocking pieces, all posted "
               "before %d linear-layer backward products (256x768x768, one thread a rank, every "
               "rank at once), progressed %s: the reduction alone %.1f ms, the products alone "
               "%.1f ms, both %.1f ms; hidden (products + reduction - both) / reduction, 0 to 1, "
               "the median of %d rounds\n",
            by, (double)c->stream_bytes / 1048576.0,
            c->nodes > 1 ? "between the nodes (a rank of each)" : "among the ranks",
            c->ov_kernels, c->thread ? "by the progress thread (the trainer's default across "
                                          "nodes)" : "by tests between the products (the "
                                          "trainer's default within a node)",
            c->ov_x * 1e3, c->ov_c * 1e3, c->ov_t * 1e3, c->stream_rounds);
    fprintf(f, "dp_overlap = %.3f\n", c->ov_frac);
}

/* Can `path` be written? Creates and removes path.tmp, as write_file will. */
static l3d_status check_out(const char *path) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return l3d_error(L3D_ERR_ARG, "--out %s is a directory; give a file name", path);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return l3d_error(L3D_ERR_ARG, "--out path is too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return l3d_error(L3D_ERR_IO, "cannot write %s: %s (give a writable --out FILE)", tmp,
                         strerror(errno));
    close(fd);
    unlink(tmp);
    return L3D_OK;
}

static l3d_status write_file(const char *path, const struct calib *c) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return l3d_error(L3D_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    write_profile(f, c);
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return l3d_error(L3D_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return L3D_OK;
}

/* ---- the command ------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: OMP_NUM_THREADS=1 mpiexec -n 2 llm3d bench --calibrate [--out FILE] [--quick]\n\n"
            "Measures this machine (a device is one core) and writes its system profile for llm3d "
            "plan\n(profiles/README.md): FMA peak, linear-layer efficiency against size, memory and "
            "element-wise\nkernel bandwidth, attention efficiency, MPI all-reduce bandwidth and "
            "latency between the ranks;\nlaunched on several nodes with as many ranks each, "
            "also between the nodes (a two-level profile).\n"
            "  --out FILE   where to write it (default: local.prof in this directory)\n"
            "  --quick      shorter measurements (about a fifth of the time; noisier figures)\n");
}

int l3d_cli_calibrate(int argc, char **argv) {
    static const struct option opts[] = {
        {"calibrate", no_argument, NULL, 'c'}, {"out", required_argument, NULL, 'o'},
        {"quick", no_argument, NULL, 'q'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct calib c = {0};
    const char *out = "local.prof";
    int o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (o) {
        case 'c': break;
        case 'o': out = optarg; break;
        case 'q': c.quick = true; break;
        case 'h': usage(stdout); return 0;
        case ':':
            fprintf(stderr, "llm3d " CMD ": %s needs a value (see llm3d bench --calibrate --help)\n",
                    argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "llm3d " CMD ": --calibrate takes only --out FILE and --quick, not '%s'"
                    " (it measures the machine, not a model)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "llm3d " CMD ": unexpected argument '%s' (flags only; see llm3d bench "
                "--calibrate --help)\n", argv[optind]);
        return 2;
    }
    if (!*out) {
        fprintf(stderr, "llm3d " CMD ": --out is empty; give a file name\n");
        return 2;
    }

    /* across nodes with the progress thread, as the trainer's default there (dp_overlap is
     * measured with it) */
    struct l3d_comm *world;
    c.thread = l3d_cli_launcher_spans_nodes();
    if (l3d_comm_mpi_init_progress(&argc, &argv, c.thread, &world) != L3D_OK) {
        fprintf(stderr, "llm3d " CMD ": %s\n", l3d_error_message());
        return 1;
    }
    bool lead = world->rank == 0, report = false;
    l3d_status st = lead ? check_out(out) : L3D_OK;
    st = l3d_comm_agree(world, st, &report);
    if (st != L3D_OK) {
        if (report) fprintf(stderr, "llm3d " CMD ": %s\n", l3d_error_message());
        l3d_comm_mpi_finalize(world);
        return st == L3D_ERR_ARG ? 2 : 1;
    }
    if (world->size < 2) {
        fprintf(stderr, "llm3d " CMD ": --calibrate measures MPI between ranks too, so it needs 2 "
                "ranks on this machine: OMP_NUM_THREADS=1 mpiexec -n 2 llm3d bench --calibrate\n");
        l3d_comm_mpi_finalize(world);
        return 2;
    }
    c.ranks = world->size;
    /* the nodes of the launch: one, or several with as many ranks each (a two-level profile) */
    int *node_of = l3d_alloc((size_t)world->size * sizeof(int), "calibrate");
    c.nodes = l3d_comm_nodes(world, node_of);
    c.per_node = 0;
    for (int r = 0; r < world->size; r++) c.per_node += node_of[r] == 0;
    for (int n = 1; n < c.nodes && st == L3D_OK; n++) {
        int k = 0;
        for (int r = 0; r < world->size; r++) k += node_of[r] == n;
        if (k != c.per_node)
            st = l3d_error(L3D_ERR_ARG, "--calibrate across nodes needs as many ranks on each node "
                           "(node 0 has %d, node %d has %d): launch the same number per host "
                           "(e.g. mpiexec --map-by ppr:1:node)", c.per_node, n, k);
    }
    if (st != L3D_OK) {
        if (lead) fprintf(stderr, "llm3d " CMD ": %s\n", l3d_error_message());
        l3d_free(node_of);
        l3d_comm_mpi_finalize(world);
        return 2;
    }
    double t0 = l3d_time_s();
    int32_t go = 1;
    if (lead) {
        measure_all_cores(&c);
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
    struct phase ph = phase_start(&c);
    measure_one_core(&c, lead);
    l3d_comm_barrier(world);
    c.others[1] = phase_end(world, &c, &ph, lead);
    c.secs[0] = l3d_time_s() - t0;
    ph = phase_start(&c);
    measure_comm(world, &c, node_of);
    l3d_free(node_of);
    c.others[2] = phase_end(world, &c, &ph, lead);
    c.secs[1] = l3d_time_s() - t0 - c.secs[0];
    c.secs[2] = l3d_time_s() - t0;
    st = L3D_OK;
    if (lead) {
        if (c.nodes == 1)
            printf("all-reduce between %d ranks: %.2f GB/s bus bandwidth (a stream), %.1f us (8 "
                   "bytes)\n", world->size, c.intra_bw / 1e9, c.intra_lat * 1e6);
        else
            printf("%d nodes x %d ranks; all-reduce inside a node: %.2f GB/s, %.1f us%s; between "
                   "nodes (one rank each): %.2f GB/s bus bandwidth (a stream), %.1f us (8 bytes)\n",
                   c.nodes, c.per_node, c.intra_bw / 1e9, c.intra_lat * 1e6,
                   c.per_node > 1 ? "" : " (one rank a node: not measured)", c.inter_bw / 1e9,
                   c.inter_lat * 1e6);
        printf("DP overlap: %.0f%% of a %.0f MiB reduction hidden behind backward products "
               "(%s; alone %.1f ms, products %.1f ms, both %.1f ms)\n", 100.0 * c.ov_frac,
               (double)c.stream_bytes / 1048576.0, c.thread ? "progress thread" : "polled",
               c.ov_x * 1e3, c.ov_c * 1e3, c.ov_t * 1e3);
        printf("CPU time got: %.0f%% of the %d cores, %.0f%% of one core, %.0f%% during the "
               "all-reduces; ", 100.0 * c.share[0], c.cores, 100.0 * c.share[1], 100.0 * c.share[2]);
        print_others(stdout, &c);
        printf("\n");
        if (busy(&c))
            fprintf(stderr, "llm3d " CMD ": warning: other processes were running, so the figures "
                    "are low (the file says so); calibrate on an idle machine\n");
        st = write_file(out, &c);
        if (st == L3D_OK)
            printf("wrote %s (measured in %.0f s: compute %.0f s, all-reduce %.0f s)\n", out,
                   c.secs[2], c.secs[0], c.secs[1]);
        else
            fprintf(stderr, "llm3d " CMD ": %s\n", l3d_error_message());
    }
    l3d_comm_mpi_finalize(world);
    return st == L3D_OK ? 0 : 1;
}
