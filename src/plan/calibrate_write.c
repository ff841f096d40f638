/* Calibration's profile file (include/llm3d/calibrate.h): the measurements as profile keys, each
 * with a comment saying how it was measured. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "plan/calibrate-impl.h"

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

/* The four kernels above one by one (their order is enum l3d_kern's), for the planner, which
 * times each element-wise pass at its own kernel's figure: LayerNorm and GELU are bound by their
 * arithmetic, a residual add and AdamW by memory, so the median fits none of them */
static void write_kern(FILE *f, const char *key, const double *k_bw, double bw_all) {
    fprintf(f, "%s =", key);
    for (int i = 0; i < L3D_KERN_N; i++)
        fprintf(f, " %s:%.3f", l3d_kern_name((enum l3d_kern)i), k_bw[i] / bw_all);
    fprintf(f, "\n");
}

/* The header, the device and its peaks */
static void write_head(FILE *f, const struct l3d_calib *c, const char *by, const char *date) {
    char model[160];
    cpu_model(model, sizeof model);
    fprintf(f, "# This machine, written by llm3d bench --calibrate%s on %s (%.0f s); format: "
               "profiles/README.md.\n# A device is one CPU core: a rank with k OpenMP threads uses "
               "k devices (llm3d plan --threads k).\n",
            c->quick ? " --quick" : "", date, c->secs[2]);
    if (l3d_calib_busy(c)) {
        fprintf(f, "# WARNING: ");
        l3d_calib_print_others(f, c);
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
                    by, l3d_calib_names16[t], l3d_calib_names16[t], l3d_calib_names16[t], l3d_calib_names16[t], c->peak16[t] / 1e12);
        else
            fprintf(f, "# not measured: the backend's %s products are fp32 products here\n"
                       "peak_tflops_%s = 0\n", l3d_calib_names16[t], l3d_calib_names16[t]);
    }
}

/* Memory, and the links inside a node and between nodes */
static void write_links(FILE *f, const struct l3d_calib *c, const char *by) {
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
}

/* The compute figures of one core, fp32 */
static void write_compute(FILE *f, const struct l3d_calib *c, const char *by) {
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
        fprintf(f, " %lldx%lldx%lld %.2f%s", (long long)l3d_calib_thread_shapes[i][0],
                (long long)l3d_calib_thread_shapes[i][1], (long long)l3d_calib_thread_shapes[i][2],
                c->thr_all[i] / (c->cores * c->thr_one[i]), i < 3 ? "," : "");
    fprintf(f, "; the median\ngemm_thread_eff = %.3f\n", c->thread_eff);
    fprintf(f, "%s: the backend's element-wise kernels on all %d cores over %lld-element arrays, "
               "bytes read + written once / best time / triad bandwidth of all cores, interleaved:",
            by, c->cores, (long long)c->k_n);
    for (int i = 0; i < 4; i++)
        fprintf(f, " %s %.2f%s", l3d_calib_kern_names[i], c->k_bw[i] / c->bw_all, i < 3 ? "," : "");
    fprintf(f, "; the median\nkernel_bw_eff = %.3f\n", c->kernel_bw_eff);
    write_kern(f, "kernel_bw_effs", c->k_bw, c->bw_all);
}

/* llm3d's 16-bit kernels: the compute figures of type t (bf16, fp16) */
static void write_16(FILE *f, const struct l3d_calib *c, const char *by, int t) {
    {
        const char *n = l3d_calib_names16[t];
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
            fprintf(f, " %s %.2f%s", l3d_calib_kern_names16[i], c->k_bw16[t][i] / c->bw_all, i < 3 ? "," : "");
        fprintf(f, "; the median\nkernel_bw_eff_%s = %.3f\n", n, c->kernel_bw_eff16[t]);
        char key[32];
        snprintf(key, sizeof key, "kernel_bw_effs_%s", n);
        write_kern(f, key, c->k_bw16[t], c->bw_all);
    }
}

/* The DP gradient stream's overlap with backward products */
static void write_overlap(FILE *f, const struct l3d_calib *c, const char *by) {
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

void l3d_calib_write(FILE *f, const struct l3d_calib *c) {
    char date[32], by[96];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    snprintf(by, sizeof by, "# measured by llm3d bench --calibrate%s on %s",
             c->quick ? " --quick" : "", date);
    write_head(f, c, by, date);
    write_links(f, c, by);
    write_compute(f, c, by);
    for (int t = 0; t < 2; t++) write_16(f, c, by, t);
    write_overlap(f, c, by);
}
