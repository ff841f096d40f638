/* llm3d bench: this machine's measured peaks and a model's training throughput; with --calibrate,
 * its system profile (src/cli/calibrate.c). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "llm3d/calibrate.h"
#include "llm3d/data.h"
#include "llm3d/runtime.h"
#include "llm3d/train.h"

/* The step's floor on this machine, a roofline: the model's FLOPs (flops) at the precision's
 * measured peak, plus the bytes the memory-bound kernel families moved at the triad bandwidth bw
 * (as this implementation moves them: fusing kernels lowers it), and the MFU that floor allows.
 * Products and attention count as compute, communication and idle as nothing. */
static void print_floor(const struct l3d_ksplit *k, double flops, double peak, double bw) {
    double bytes = 0.0;
    for (int f = 0; f < L3D_KF_N; f++) bytes += k->bytes[f];
    if (!(flops > 0 && peak > 0 && bw > 0)) return;
    double tc = flops / peak, tm = bytes / bw;
    printf("  floor (roofline): the model's FLOPs at the peak %.3f ms + the memory-bound "
           "families' %.0f MB at the triad %.3f ms = %.3f ms: MFU at most %.1f%% of that peak\n",
           tc * 1e3,
           bytes / 1e6, tm * 1e3, (tc + tm) * 1e3, 100.0 * tc / (tc + tm));
}

/* Where the median step went, per kernel family (the trainer's kernel split), with the
 * memory-bound families' bytes per second against the measured triad bandwidth bw; then the
 * floor (print_floor) of a step of the model's flops at the precision's measured peak. */
static void print_split(const struct l3d_train_result *res, const char *prec, double bw,
                        double flops, double peak) {
    const struct l3d_ksplit *k = &res->split;
    double step = res->split_step_s, kern = 0.0;
    if (step <= 0) return;
    printf("\ntime split of the median step (%s, %.1f ms): ms, share, calls; bytes/s of the "
           "memory-bound families against the triad bandwidth %.1f GB/s\n", prec, step * 1e3,
           bw / 1e9);
    for (int f = 0; f < L3D_KF_N; f++) {
        kern += k->s[f];
        printf("  %-14s %9.1f ms %5.1f%% %6lld", l3d_kfam_name(f), k->s[f] * 1e3,
               100.0 * k->s[f] / step, (long long)k->calls[f]);
        if (k->bytes[f] > 0 && k->s[f] > 0)
            printf("  %6.1f GB/s (%3.0f%% of triad)", k->bytes[f] / k->s[f] / 1e9,
                   100.0 * k->bytes[f] / k->s[f] / bw);
        printf("\n");
    }
    double rest = step - kern - res->split_comm_s;
    printf("  %-14s %9.1f ms %5.1f%%\n", "communication", res->split_comm_s * 1e3,
           100.0 * res->split_comm_s / step);
    printf("  %-14s %9.1f ms %5.1f%% (host work between kernels, waits)\n", "idle", rest * 1e3,
           100.0 * rest / step);
    print_floor(k, flops, peak, bw);
}

static int by_time(const void *a, const void *b) {
    double x = ((const struct l3d_kstat *)a)->s, y = ((const struct l3d_kstat *)b)->s;
    return (x < y) - (x > y);
}

/* Every kernel's time a step over the steps after the first, slowest first; the memory-bound
 * ones' bytes per second against the triad bandwidth bw. */
static void print_kernels(const struct l3d_train_result *res, double bw) {
    int n = res->kernels.nk, steps = res->kernel_steps;
    if (steps <= 0 || n == 0) return;
    struct l3d_kstat k[L3D_KPROF_KERNELS];
    memcpy(k, res->kernels.k, (size_t)n * sizeof *k);
    qsort(k, (size_t)n, sizeof *k, by_time);
    printf("kernels, a step (mean of the %d steps after the first): ms, calls, family\n", steps);
    for (int i = 0; i < n; i++) {
        printf("  %-26s %9.2f ms %6.1f  %-13s", k[i].name, k[i].s * 1e3 / steps,
               (double)k[i].calls / steps, l3d_kfam_name(k[i].fam));
        if (k[i].bytes > 0 && k[i].s > 0)
            printf(" %6.1f GB/s (%3.0f%% of triad)", k[i].bytes / k[i].s / 1e9,
                   100.0 * k[i].bytes / k[i].s / bw);
        printf("\n");
    }
}

/* The GPT-2 124M shapes of a (B*T = 2048)-row micro-batch, and a large square (sgemm only) */
static const struct {
    const char *what;
    int64_t M, N, K;
} shapes[] = {
    {"qkv    2048x2304x768 ", 2048, 2304, 768},   {"fc     2048x3072x768 ", 2048, 3072, 768},
    {"fcproj 2048x768x3072 ", 2048, 768, 3072},   {"head   2048x50304x768", 2048, 50304, 768},
    {"square 4096x4096x4096", 4096, 4096, 4096},
};

/* The bf16 peak by the rule llm3d bench --calibrate sets peak_tflops_bf16 with
 * (l3d_calib_fractions): the dot-product loop dot, or the fastest bf16 product measured where that
 * is higher (oneDNN's bf16 products on AMX tiles run far above the loop's vdpbf16ps, and an MFU
 * against the loop read over 100%). The products are the trainer's linear layer at the first
 * three shapes, on a CPU backend of bench's own; *what says which set the peak. 0 without bf16
 * dot products. */
static double bf16_peak(double dot, const char **what) {
    *what = "the dot-product loop";
    if (dot <= 0) return 0.0;
    struct l3d_backend *be = l3d_backend_cpu_init();
    double best = dot;
    for (int i = 0; i < 3 && l3d_be_matmul_native(be, L3D_BF16); i++) {
        double f = l3d_calib_product_rate(be, L3D_BF16, shapes[i].M, shapes[i].N, shapes[i].K, 0.3);
        printf("bf16 product %s %7.1f GFLOP/s (%.2fx the dot-product loop)\n", shapes[i].what,
               f / 1e9, f / dot);
        if (f > best) best = f, *what = "the fastest bf16 product, above the dot-product loop";
    }
    l3d_backend_free(be);
    return best;
}

/* This machine's measured peaks: the fp32 FMA loop, sgemm on the shapes above, the bf16 peak
 * (bf16_peak), the triad bandwidth; returns the best sgemm's FLOP/s. */
static double print_peaks(double *fma_out, double *bf16_out, const char **what, double *bw_out) {
    int threads = omp_get_max_threads();
    printf("threads: %d\n", threads);
    double fma = l3d_cpu_fma_peak(1.0), best_gemm = 0.0;
    printf("fp32 FMA peak:  %7.1f GFLOP/s (%.1f per thread)\n", fma / 1e9, fma / 1e9 / threads);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double f = l3d_cpu_sgemm_flops(shapes[i].M, shapes[i].N, shapes[i].K, 0.5);
        if (f > best_gemm) best_gemm = f;
        printf("sgemm %s %7.1f GFLOP/s (%4.1f%% of FMA peak)\n", shapes[i].what, f / 1e9,
               100.0 * f / fma);
    }
    double dot = l3d_cpu_bf16_peak(1.0);
    if (dot > 0)
        printf("bf16 dot-product loop: %7.1f GFLOP/s (%.2fx the FMA peak)\n", dot / 1e9,
               dot / fma);
    double bf16 = bf16_peak(dot, what), bw = l3d_cpu_triad_bw((size_t)256 << 20, 0.5);
    if (bf16 > 0)
        printf("the bf16 peak (bench --calibrate's rule for peak_tflops_bf16): %7.1f GFLOP/s, "
               "%s\n", bf16 / 1e9, *what);
    printf("triad bandwidth: %7.1f GB/s\n", bw / 1e9);
    fflush(stdout);
    *fma_out = fma;
    *bf16_out = bf16;
    *bw_out = bw;
    return best_gemm;
}

/* Whether the run's backend (the --backend flag, else $L3D_BACKEND, else cpu) computes on this
 * CPU, so that the peaks measured here are its own. */
static bool host_backend(const char *flag) {
    const char *b = flag && *flag ? flag : getenv("L3D_BACKEND");
    return !b || !*b || strcmp(b, "cpu") == 0 || strcmp(b, "check") == 0;
}

int l3d_cli_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--calibrate") == 0) return l3d_cli_calibrate(argc, argv);
    struct l3d_train_config tc;
    l3d_train_config_defaults(&tc);
    l3d_model_preset(&tc.model, "d12");
    tc.steps = 10;
    tc.warmup_steps = 2;
    /* l3d_train_run takes SIGTERM/SIGUSR1 on a thread of its own */
    struct l3d_runtime_opts ro = {.cmd = "bench", .stop_signals = true};
    int rc = l3d_cli_train_flags("bench", argc, argv, &tc, &ro.backend);
    if (rc >= 0) return rc;
    free((char *)tc.config_yaml); /* bench writes no run directory */
    tc.config_yaml = NULL;
    ro.progress_thread = !tc.dp_blocking && tc.progress == L3D_PROGRESS_THREAD; /* as train */
    struct l3d_runtime *rt;
    if (l3d_runtime_init(&argc, &argv, &ro, &rt) != L3D_OK) return 1;
    if (rt->world->size > 1) {
        fprintf(stderr, "llm3d bench: runs as one process; for several ranks use llm3d train under "
                "mpiexec (bench/scaling.sh)\n");
        l3d_runtime_free(rt);
        return 2;
    }
    const char *bf16_what;
    double fma, bf16, bw, best_gemm = print_peaks(&fma, &bf16, &bf16_what, &bw);

    /* training throughput on random tokens, through the real training loop */
    char dir[] = "/tmp/llm3d-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("llm3d bench: mkdtemp");
        l3d_runtime_free(rt);
        return 1;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    int64_t n = (int64_t)tc.layout.micro_batch * tc.layout.accum * (tc.layout.seq + 1) * 4 + 1;
    uint16_t *tok = malloc((size_t)n * sizeof(uint16_t));
    l3d_rng rng;
    l3d_rng_seed(&rng, tc.seed);
    for (int64_t i = 0; i < n; i++) tok[i] = (uint16_t)(l3d_rng_next(&rng) % (uint64_t)tc.model.V);
    l3d_status st = l3d_shard_write(path, tok, n);
    free(tok);
    if (st == L3D_OK) {
        tc.train_pattern = path;
        tc.kernel_split = true;
        tc.val_pattern = NULL;
        tc.out_dir = NULL;
        /* MFU against the peak of the precision the products run in (bf16 dot products where the
         * CPU has them: the fp32 FMA peak would give bf16 runs an MFU over 100%) */
        if (tc.peak_flops <= 0 && tc.precision.param == L3D_F32) tc.peak_flops = fma;
        if (tc.peak_flops <= 0 && tc.precision.param == L3D_BF16 && bf16 > 0 &&
            host_backend(ro.backend)) {
            tc.peak_flops = bf16;
            printf("bf16 peak:  %7.1f GFLOP/s (the MFU's denominator: %s, as bench --calibrate "
                   "sets peak_tflops_bf16)\n", bf16 / 1e9, bf16_what);
        }
        if (tc.peak_flops <= 0) {
            tc.peak_flops = l3d_be_peak_flops(rt->be, tc.precision.param);
            printf("%s peak:  %7.1f GFLOP/s (the MFU's denominator)\n",
                   l3d_dtype_name(tc.precision.param), tc.peak_flops / 1e9);
        }
        struct l3d_train_result res;
        printf("\ntraining step, model L=%d C=%d NH=%d V=%d, B=%d T=%d x %d micro-batches:\n",
               tc.model.L, tc.model.C, tc.model.NH, tc.model.V, tc.layout.micro_batch,
               tc.layout.seq, tc.layout.accum);
        st = l3d_train_run(&tc, rt, &res);
        if (st == L3D_OK)
            printf("\nresult: %.1f ms/step (median of %d), %.0f tokens/s, MFU %.1f%% of %.1f GFLOP/s"
                   " (%.1f%% of the best sgemm, %.1f GFLOP/s)\n",
                   res.median_step_s * 1e3, res.steps, res.tokens_per_s, 100.0 * res.mfu,
                   tc.peak_flops / 1e9, 100.0 * res.mfu * tc.peak_flops / best_gemm,
                   best_gemm / 1e9);
        double achieved = res.mfu * tc.peak_flops; /* model FLOP/s */
        if (st == L3D_OK)
            printf("model FLOP/s %.1f G: %.1f%% of the fp32 FMA peak, %.1f%% of the bf16 peak\n",
                   achieved / 1e9, 100.0 * achieved / fma,
                   bf16 > 0 ? 100.0 * achieved / bf16 : NAN);
        /* the floor at the precision's measured peak (the FMA loop for fp32, the bf16 peak for
         * bf16), whatever --peak-gflops gave the MFU */
        double floor_peak = tc.precision.param == L3D_F32                   ? fma
                            : tc.precision.param == L3D_BF16 && bf16 > 0 ? bf16
                                                                         : tc.peak_flops;
        if (st == L3D_OK) /* the model's FLOPs of the split's step */
            print_split(&res, l3d_dtype_name(tc.precision.param), bw,
                        achieved * res.median_step_s, floor_peak);
        if (st == L3D_OK) print_kernels(&res, bw);
    }
    unlink(path);
    rmdir(dir);
    l3d_runtime_free(rt);
    if (st != L3D_OK) return l3d_cli_failed("bench");
    return 0;
}
