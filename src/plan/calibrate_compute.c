/* Calibration's compute figures (include/llm3d/calibrate.h): phase 1 on all cores of rank 0,
 * phase 2 on every rank's own core. */
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "plan/calibrate-impl.h"

const enum l3d_dtype l3d_calib_types16[2] = {L3D_BF16, L3D_F16};
const char *const l3d_calib_names16[2] = {"bf16", "fp16"};
const char *const l3d_calib_kern_names[L3D_KERN_N] = {"layernorm_forward", "gelu_forward",
                                                      "residual_forward", "adamw"};
const char *const l3d_calib_kern_names16[L3D_KERN_N] = {"layernorm_forward", "gelu_forward",
                                                        "residual_forward", "adamw_mixed"};

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

/* n elements of type dt (fp32, bf16, fp16) uniform in [lo, hi), rounded to dt */
static void *filled_dt(enum l3d_dtype dt, int64_t n, float lo, float hi, uint64_t stream) {
    if (dt == L3D_F32) return l3d_calib_filled(n, lo, hi, stream);
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
 * updates in place, can pass the triad. Then the triad on one thread (printed only). Called again,
 * each figure is the best of all its passes (memory_fractions turns them into fractions). */
static void measure_memory(struct l3d_backend *be, struct l3d_calib *c) {
    const int64_t n = c->k_n, C = 768, N = n / C;
    const double secs = c->quick ? 0.5 : 3.0;
    float *a = l3d_calib_filled(n, -2.0f, 2.0f, 1), *b = l3d_calib_filled(n, -2.0f, 2.0f, 2);
    float *m = l3d_calib_filled(n, -0.01f, 0.01f, 3), *v = l3d_calib_filled(n, 0.0f, 0.01f, 4);
    float *w = l3d_calib_filled(C, 0.5f, 1.5f, 5), *bias = l3d_calib_filled(C, -0.1f, 0.1f, 6);
    float *mean = l3d_calib_filled(N, 0.0f, 0.0f, 7), *rstd = l3d_calib_filled(N, 0.0f, 0.0f, 8);
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
    double start = l3d_time_s(), cpu0 = l3d_calib_cpu_s();
    for (int r = 0; r < 5 || l3d_time_s() - start < secs; r++) {
        t[4] = fmin(t[4], l3d_cpu_triad_pass(m, a, b, n)); /* m = a + b / 2 */
        TIME_ONE(t[0], l3d_be_layernorm_forward(be, L3D_F32, b, mean, rstd, a, w, bias, N, C));
        TIME_ONE(t[1], l3d_be_gelu_forward(be, L3D_F32, b, a, n));
        TIME_ONE(t[2], l3d_be_residual_forward(be, L3D_F32, m, a, b, n));
        /* a tiny learning rate: the parameters stay put however often it runs */
        TIME_ONE(t[3], l3d_be_adamw(be, L3D_F32, a, m, v, b, 1.0f, n, 1e-12f, 0.9f, 0.95f, 1e-8f,
                                    0.0f, 0.1f, 0.05f));
        /* the same kernels in 16 bits, as the trainer's --precision bf16|fp16 calls them:
         * 16-bit activations and weights, fp32 statistics; AdamW on fp32 master weights (a),
         * moments and main_grad (b), writing the 16-bit copy */
        for (int i = 0; i < 2; i++) {
            enum l3d_dtype dt = l3d_calib_types16[i];
            TIME_ONE(t16[i][0], l3d_be_layernorm_forward(be, dt, b16, mean, rstd, a16, w16, bias16,
                                                         N, C));
            TIME_ONE(t16[i][1], l3d_be_gelu_forward(be, dt, b16, a16, n));
            TIME_ONE(t16[i][2], l3d_be_residual_forward(be, dt, p16, a16, b16, n));
            TIME_ONE(t16[i][3], l3d_be_adamw_mixed(be, dt, L3D_F32, p16, a, m, v, b, 1.0f, n,
                                                   1e-12f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.05f));
        }
    }
    c->share[0] = (l3d_calib_cpu_s() - cpu0) / ((l3d_time_s() - start) * omp_get_max_threads());
    c->triad_bytes = 12 * (size_t)n;
    c->bw_all = fmax(c->bw_all, 12.0 * (double)n / t[4]);
    const double bytes[4] = {(2.0 * N * C + 2.0 * N) * 4, 8.0 * n, 12.0 * n, 28.0 * n};
    for (int i = 0; i < 4; i++) c->k_bw[i] = fmax(c->k_bw[i], bytes[i] / t[i]);
    /* 16-bit: the 2-byte arrays, fp32 statistics; adamw_mixed reads and writes the fp32 master
     * and moments, reads the fp32 gradient and writes the 16-bit copy (4 x 7 + 2 bytes) */
    const double bytes16[4] = {(2.0 * N * C) * 2 + 2.0 * N * 4, 4.0 * n, 6.0 * n, 30.0 * n};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) c->k_bw16[i][k] = fmax(c->k_bw16[i][k], bytes16[k] / t16[i][k]);
    c->memory_rounds++;
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    double t1 = INFINITY;
    start = l3d_time_s();
    for (int r = 0; r < 3 || l3d_time_s() - start < secs / 4; r++)
        t1 = fmin(t1, l3d_cpu_triad_pass(m, a, b, n));
    c->bw_one = fmax(c->bw_one, 12.0 * (double)n / t1);
    omp_set_num_threads(threads);
    void *bufs[] = {a, b, m, v, w, bias, mean, rstd, a16, b16, p16, w16, bias16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) l3d_free(bufs[i]);
}

/* The element-wise kernels' bandwidths as fractions of the triad's, and their medians */
static void memory_fractions(struct l3d_calib *c) {
    double frac[4];
    for (int i = 0; i < 4; i++) frac[i] = c->k_bw[i] / c->bw_all;
    c->kernel_bw_eff = l3d_calib_median(frac, 4);
    for (int t = 0; t < 2; t++) {
        for (int k = 0; k < 4; k++) frac[k] = c->k_bw16[t][k] / c->bw_all;
        c->kernel_bw_eff16[t] = l3d_calib_median(frac, 4);
    }
}

/* Are the kernels' fractions of the triad within what the planner accepts (kernel_bw_eff's
 * range)? A fraction above it is a triad slowed by other processes, not the kernels' speed. */
static bool memory_in_range(const struct l3d_calib *c) {
    const double hi = l3d_calib_kernel_eff_max();
    bool ok = true;
    for (int i = 0; i < 4; i++) {
        double f = c->k_bw[i] / c->bw_all, f16[2] = {c->k_bw16[0][i] / c->bw_all,
                                                     c->k_bw16[1][i] / c->bw_all};
        ok = ok && f > 0 && f <= hi && f16[0] > 0 && f16[0] <= hi && f16[1] > 0 && f16[1] <= hi;
    }
    return ok;
}

/* The fewest timed passes of a product: 5 (a median of at least 5), 2 under --quick, whose
 * largest products (up to 1e11 FLOPs a pass, a second or more on a core) took most of its time */
static int passes(const struct l3d_calib *c) { return c->quick ? 2 : 5; }

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
    double tf = l3d_calib_median(sec[0], n), tdx = l3d_calib_median(sec[1], n);
    double tw = l3d_calib_median(sec[2], n);
    return (struct layer_rate){3 * f / (tf + tdx + tw), 2 * f / (tf + tdx), f / tw};
}
static double layer_flops(struct l3d_backend *be, enum l3d_dtype dt, int64_t M, int64_t N,
                          int64_t K, double secs, int min_n) {
    return layer_rates(be, dt, M, N, K, secs, min_n, false).all;
}

double l3d_calib_product_rate(struct l3d_backend *be, enum l3d_dtype dt, int64_t M, int64_t N,
                              int64_t K, double secs) {
    struct layer_rate r = layer_rates(be, dt, M, N, K, secs, 3, false);
    return fmax(r.fwd_dx, r.wgrad);
}

const int64_t l3d_calib_grid[L3D_CALIB_GRID][3] = {
    {64, 64, 64},       {64, 256, 256},     {64, 768, 768},     {64, 3072, 3072},
    {128, 128, 128},    {128, 768, 768},    {128, 3072, 3072},  {256, 256, 256},
    {256, 768, 768},    {256, 1536, 1536},  {256, 3072, 3072},  {512, 512, 512},
    {512, 1536, 1536},  {1024, 1024, 1024}, {1024, 2048, 2048}, {1024, 3072, 3072},
    {2048, 2048, 2048}, {2048, 3072, 3072}};

bool l3d_calib_grid_measured(const struct l3d_calib *c, int i) {
    const int64_t(*g)[3] = l3d_calib_grid;
    bool first = i == 0 || g[i - 1][0] != g[i][0];
    bool last = i == L3D_CALIB_GRID - 1 || g[i + 1][0] != g[i][0];
    return !c->quick || first || last;
}

/* gemm_eff from the grid's rates (for planners that read no grid): the shapes bucketed by the
 * FLOPs of one product (2 M N K) in half decades from 1e5 to 1e11, a point the geometric mean of
 * its bucket's FLOPs and the median of its rates */
static void grid_curve(const struct l3d_calib *c, const double *rate, int *n_eff,
                       double *eff_flops, double *eff) {
    *n_eff = 0;
    for (int k = 10; k < 22; k++) { /* bucket [10^(k/2), 10^((k+1)/2)) */
        double lo = pow(10.0, k / 2.0), hi = pow(10.0, (k + 1) / 2.0), v[L3D_CALIB_GRID];
        double logf = 0.0;
        int n = 0;
        for (int i = 0; i < L3D_CALIB_GRID; i++) {
            const int64_t *g = l3d_calib_grid[i];
            double f = 2.0 * g[0] * g[1] * g[2];
            if (!l3d_calib_grid_measured(c, i) || f < lo || f >= hi) continue;
            v[n++] = rate[i];
            logf += log(f);
        }
        if (n == 0) continue;
        eff_flops[*n_eff] = exp(logf / n);
        eff[(*n_eff)++] = l3d_calib_median(v, n);
    }
}

/* Linear layers (layer_rates) on one thread by shape: the grid l3d_calib_grid (rows of one
 * smallest side, M the tokens, from 64 to 2048; N = K from the side to 3072), its forward and
 * input-gradient FLOP/s into rate[], and gemm_eff's curve from them (grid_curve). Bucketed by
 * FLOPs alone, as the ladder before it was, a bucket mixed thin products (a side of 64) with
 * square ones: d6's products (M 256, N and K 384..1536) ran at about 0.65 of the FMA peak on the
 * quiet machine, their buckets said 0.46-0.53, and the plan's products came out 15% slow. The
 * weight gradient has a curve of its own, by tokens: its reduction runs over the M rows, and a
 * backend that accumulates it into an fp32 main_grad may depend on M alone (oneDNN's bf16
 * product here: 0.39-0.43 of the peak at M = 128 for every weight out of cache,
 * docs/BENCHMARKS.md), so a point of wg is M and the median FLOP/s of the weight-gradient product
 * alone at GPT-2 small's two weights, 768 x 768 and 3072 x 768 (out of every core's cache, as a
 * model's weights are; the grid's small weights stay in cache). Fractions of the peak: the
 * caller's. */
static void measure_gemm(struct l3d_backend *be, struct l3d_calib *c, enum l3d_dtype dt,
                         double *rate, int *n_eff, double *eff_flops, double *eff, int *n_wg,
                         double *wg_tok, double *wg_eff) {
    const double secs = c->quick ? 0.02 : 0.3;
    c->eff_shapes = 0;
    for (int i = 0; i < L3D_CALIB_GRID; i++) {
        const int64_t *g = l3d_calib_grid[i];
        rate[i] = 0.0;
        if (!l3d_calib_grid_measured(c, i)) continue;
        rate[i] = layer_rates(be, dt, g[0], g[1], g[2], secs, passes(c), false).fwd_dx;
        c->eff_shapes++;
    }
    grid_curve(c, rate, n_eff, eff_flops, eff);
    static const int64_t toks[] = {64, 128, 256, 512, 1024, 2048};
    static const int64_t weights[2][2] = {{768, 768}, {3072, 768}}; /* N outputs x K inputs */
    *n_wg = 0;
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        double r[2];
        for (int w = 0; w < 2; w++)
            r[w] = layer_rates(be, dt, toks[i], weights[w][0], weights[w][1], secs, passes(c),
                               true).wgrad;
        wg_tok[*n_wg] = (double)toks[i];
        wg_eff[(*n_wg)++] = l3d_calib_median(r, 2);
    }
}

/* --model: the model's own linear layers (c->exact_shape), each as the trainer runs it: the
 * forward and input-gradient FLOP/s into fwd[], the weight gradient's into wg[] */
static void measure_exact(struct l3d_backend *be, const struct l3d_calib *c, enum l3d_dtype dt,
                          double *fwd, double *wg) {
    for (int i = 0; i < c->n_exact; i++) {
        const int64_t *s = c->exact_shape[i];
        struct layer_rate r = layer_rates(be, dt, s[0], s[1], s[2], c->quick ? 0.02 : 0.3,
                                          passes(c), false);
        fwd[i] = r.fwd_dx;
        wg[i] = r.wgrad;
    }
}

/* Attention core at GPT-2 small's shape with one thread: best forward and backward times. The
 * caller divides model FLOPs 12 B T^2 C (Narayanan et al. 2021, sec. 5.1: 4 B s^2 h for Q K^T
 * and P V forward, twice that backward) by them: the full T^2, the masked causal half counted,
 * as Megatron counts it (the tiled kernel skips the blocks above the diagonal, about half). */
static void measure_attention(struct l3d_backend *be, const struct l3d_calib *c, enum l3d_dtype dt,
                              double *fwd_s, double *bwd_s) {
    const int64_t B = 4, T = 256, NH = 12, HS = 64, C = NH * HS;
    void *qkv = filled_dt(dt, B * T * 3 * C, -1.0f, 1.0f, 11);
    void *dout = filled_dt(dt, B * T * C, -1.0f, 1.0f, 12);
    void *out = filled_dt(dt, B * T * C, 0.0f, 0.0f, 13);
    void *dqkv = filled_dt(dt, B * T * 3 * C, 0.0f, 0.0f, 14);
    float *lse = l3d_calib_filled(B * NH * T, 0.0f, 0.0f, 15);
    const double secs = c->quick ? 0.1 : 1.0;
    TIME_BEST(*fwd_s, secs, l3d_be_attention_forward(be, dt, out, lse, qkv, B, T, NH, NH, HS));
    TIME_BEST(*bwd_s, secs, l3d_be_attention_backward(be, dt, dqkv, dout, qkv, out, lse, B, T, NH,
                                                      NH, HS));
    void *bufs[] = {qkv, dout, out, dqkv, lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) l3d_free(bufs[i]);
}

/* GPT-2 124M's products at 512 and 2048 rows: one product on every thread of a rank against the
 * same on one core (gemm_thread_eff) */
const int64_t l3d_calib_thread_shapes[L3D_CALIB_THREAD_SHAPES][3] = {
    {512, 2304, 768}, {512, 768, 3072}, {2048, 3072, 768}, {2048, 768, 768}};

/* The thread shapes' linear layers in type dt on the threads this process runs now */
static void thread_rates(struct l3d_backend *be, const struct l3d_calib *c, enum l3d_dtype dt,
                         double *rate) {
    for (int i = 0; i < L3D_CALIB_THREAD_SHAPES; i++)
        rate[i] = layer_flops(be, dt, l3d_calib_thread_shapes[i][0], l3d_calib_thread_shapes[i][1],
                              l3d_calib_thread_shapes[i][2], c->quick ? 0.05 : 0.3, passes(c));
}

/* Rank 0, every core: triad bandwidth and the element-wise kernels, one product on all cores;
 * then back on its binding. */
void l3d_calib_all_cores(struct l3d_calib *c, l3d_calib_report_fn report, void *arg) {
    struct l3d_backend *be = l3d_backend_cpu_init();
    cpu_set_t bound;
    c->cores = widen_affinity(&bound, &c->cpus);
    /* the other ranks sleep meanwhile */
    const struct l3d_calib_phase_mark ph = l3d_calib_phase_start(c);
    c->k_n = (int64_t)(c->quick ? 16 : 32) << 20;
    if (report) report(L3D_CALIB_START, c, arg);
    omp_set_num_threads(c->cores);
    /* measured again while a kernel's fraction of the triad is out of range: each figure the
     * best pass of all rounds, three at most */
    measure_memory(be, c);
    while (!memory_in_range(c) && c->memory_rounds < 3) measure_memory(be, c);
    memory_fractions(c);
    if (report) report(L3D_CALIB_MEMORY, c, arg);
    thread_rates(be, c, L3D_F32, c->thr_all);
    for (int t = 0; t < 2; t++) thread_rates(be, c, l3d_calib_types16[t], c->thr_all16[t]);
    c->others[0] = l3d_calib_phase_others(c, &ph, l3d_calib_cpu_s() - ph.cpu);
    if (CPU_COUNT(&bound) > 0) sched_setaffinity(0, sizeof bound, &bound);
    l3d_backend_free(be);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    c->mem_bytes = pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

/* The peak is at least the fastest rate measured: a slowed FMA loop (a sanitizer build, a core
 * taken away during its rounds) must not give fractions above 1, which plan rejects. A type whose
 * products run natively has a peak of its own, raised the same way. Then every rate of the
 * grid, the model's shapes, the weight gradient and attention becomes a fraction of its peak. */
void l3d_calib_fractions(struct l3d_calib *c) {
    const double attn_flops = 12.0 * 4 * 256 * 256 * 768;
    const double attn_rate = attn_flops / (c->attn_fwd_s + c->attn_bwd_s);
    double top = attn_rate, top16[2] = {0, 0};
    for (int i = 0; i < L3D_CALIB_GRID; i++) top = fmax(top, c->grid_eff[i]);
    for (int i = 0; i < c->n_exact; i++) top = fmax(top, fmax(c->exact_eff[i], c->exact_wg[i]));
    for (int i = 0; i < c->n_wg; i++) top = fmax(top, c->wg_eff[i]);
    for (int i = 0; i < 4; i++) top = fmax(top, c->thr_one[i]);
    for (int t = 0; t < 2; t++) {
        double *tp = c->native16[t] ? &top16[t] : &top;
        *tp = fmax(*tp, attn_flops / (c->attn16_s[t][0] + c->attn16_s[t][1]));
        for (int i = 0; i < L3D_CALIB_GRID; i++) *tp = fmax(*tp, c->grid16_eff[t][i]);
        for (int i = 0; i < c->n_exact; i++)
            *tp = fmax(*tp, fmax(c->exact16_eff[t][i], c->exact16_wg[t][i]));
        for (int i = 0; i < c->n_wg16[t]; i++) *tp = fmax(*tp, c->wg16_eff[t][i]);
        for (int i = 0; i < 4; i++) *tp = fmax(*tp, c->thr_one16[t][i]);
    }
    c->fma_loop = 0.0;
    if (top > c->fma) c->fma_loop = c->fma, c->fma = top;
    for (int i = 0; i < c->n_eff; i++) c->eff[i] /= c->fma;
    for (int i = 0; i < L3D_CALIB_GRID; i++) c->grid_eff[i] /= c->fma;
    for (int i = 0; i < c->n_exact; i++) c->exact_eff[i] /= c->fma, c->exact_wg[i] /= c->fma;
    for (int i = 0; i < c->n_wg; i++) c->wg_eff[i] /= c->fma;
    c->attn_eff = attn_rate / c->fma;
    for (int t = 0; t < 2; t++) {
        if (c->native16[t]) c->peak16[t] = fmax(c->peak16[t], top16[t]);
        double peak = c->native16[t] ? c->peak16[t] : c->fma;
        for (int i = 0; i < c->n_eff16[t]; i++) c->eff16[t][i] /= peak;
        for (int i = 0; i < L3D_CALIB_GRID; i++) c->grid16_eff[t][i] /= peak;
        for (int i = 0; i < c->n_exact; i++)
            c->exact16_eff[t][i] /= peak, c->exact16_wg[t][i] /= peak;
        for (int i = 0; i < c->n_wg16[t]; i++) c->wg16_eff[t][i] /= peak;
        c->attn_eff16[t] = attn_flops / (c->attn16_s[t][0] + c->attn16_s[t][1]) / peak;
    }
}

/* Keeps this round's one-core rates (thr_one, thr_one16) as round c->thread_rounds; each
 * one-core rate becomes the median of its rounds, gemm_thread_eff[_T] the median over the shapes
 * of all cores' rate / (cores x one core's) */
static void thread_round(struct l3d_calib *c) {
    const int r = c->thread_rounds++;
    double v[L3D_CALIB_MAX_ROUNDS], ratio[L3D_CALIB_THREAD_SHAPES];
    for (int i = 0; i < L3D_CALIB_THREAD_SHAPES; i++) {
        c->thr_one_r[r][i] = c->thr_one[i];
        for (int t = 0; t < 2; t++) c->thr_one16_r[t][r][i] = c->thr_one16[t][i];
    }
    for (int i = 0; i < L3D_CALIB_THREAD_SHAPES; i++) {
        for (int k = 0; k <= r; k++) v[k] = c->thr_one_r[k][i];
        c->thr_one[i] = l3d_calib_median(v, r + 1);
        for (int t = 0; t < 2; t++) {
            for (int k = 0; k <= r; k++) v[k] = c->thr_one16_r[t][k][i];
            c->thr_one16[t][i] = l3d_calib_median(v, r + 1);
        }
    }
    for (int i = 0; i < 4; i++) ratio[i] = c->thr_all[i] / (c->cores * c->thr_one[i]);
    c->thread_eff = l3d_calib_median(ratio, 4);
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 4; i++) ratio[i] = c->thr_all16[t][i] / (c->cores * c->thr_one16[t][i]);
        c->thread_eff16[t] = l3d_calib_median(ratio, 4);
    }
}

bool l3d_calib_thread_in_range(const struct l3d_calib *c) {
    const double x[3] = {c->thread_eff, c->thread_eff16[0], c->thread_eff16[1]};
    for (int i = 0; i < 3; i++)
        if (!(x[i] > 0 && x[i] <= L3D_CALIB_THREAD_EFF_MAX)) return false;
    return true;
}

void l3d_calib_thread_again(struct l3d_calib *c) {
    if (c->thread_rounds >= L3D_CALIB_MAX_ROUNDS) return;
    struct l3d_backend *be = l3d_backend_cpu_init();
    omp_set_num_threads(1);
    thread_rates(be, c, L3D_F32, c->thr_one);
    for (int t = 0; t < 2; t++) thread_rates(be, c, l3d_calib_types16[t], c->thr_one16[t]);
    l3d_backend_free(be);
    thread_round(c);
}

/* Every rank at once, one thread each on its own core, so that each core is measured with its
 * neighbours busy, as in a run that uses every core (a core alone clocks higher and has the
 * memory to itself): the FMA peak before, between and after the products (the highest: the
 * clock and the neighbours vary), the linear layers of the grid (and the model's), the
 * attention kernels. */
void l3d_calib_one_core(struct l3d_calib *c) {
    struct l3d_backend *be = l3d_backend_cpu_init();
    omp_set_num_threads(1);
    double wall0 = l3d_time_s(), cpu0 = l3d_calib_cpu_s();
    c->fma = l3d_cpu_fma_peak(1.0);
    measure_gemm(be, c, L3D_F32, c->grid_eff, &c->n_eff, c->eff_flops, c->eff, &c->n_wg,
                 c->wg_tok, c->wg_eff);
    measure_exact(be, c, L3D_F32, c->exact_eff, c->exact_wg);
    c->fma = fmax(c->fma, l3d_cpu_fma_peak(1.0));
    measure_attention(be, c, L3D_F32, &c->attn_fwd_s, &c->attn_bwd_s);
    thread_rates(be, c, L3D_F32, c->thr_one);
    c->fma = fmax(c->fma, l3d_cpu_fma_peak(1.0));
    /* the 16-bit kernels (llm3d's --precision bf16|fp16), after the fp32 ones */
    for (int t = 0; t < 2; t++) {
        c->native16[t] = l3d_be_matmul_native(be, l3d_calib_types16[t]);
        c->attn_native16[t] = l3d_be_attention_native(be, l3d_calib_types16[t]);
        c->wgrad_block16[t] = l3d_be_matmul_wgrad_block(be, l3d_calib_types16[t]);
        c->peak16[t] = c->native16[t] ? l3d_be_peak_flops(be, l3d_calib_types16[t]) : 0.0;
        int shapes = c->eff_shapes;
        measure_gemm(be, c, l3d_calib_types16[t], c->grid16_eff[t], &c->n_eff16[t],
                     c->eff16_flops[t], c->eff16[t], &c->n_wg16[t], c->wg16_tok[t],
                     c->wg16_eff[t]);
        c->eff_shapes = shapes;
        measure_exact(be, c, l3d_calib_types16[t], c->exact16_eff[t], c->exact16_wg[t]);
        measure_attention(be, c, l3d_calib_types16[t], &c->attn16_s[t][0], &c->attn16_s[t][1]);
        thread_rates(be, c, l3d_calib_types16[t], c->thr_one16[t]);
    }
    c->fma = fmax(c->fma, l3d_cpu_fma_peak(1.0));
    c->share[1] = (l3d_calib_cpu_s() - cpu0) / (l3d_time_s() - wall0);
    c->thread_rounds = 0;
    thread_round(c);
    l3d_backend_free(be);
}
