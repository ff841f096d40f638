/* Calibration's profile file (include/llm3d/calibrate.h): the measurements as a struct
 * l3d_profile, written key by key through the profile's key table (src/plan/profile_keys.c), each
 * with a comment saying how it was measured, and parsed back before it is saved. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "llm3d/file.h"
#include "plan/calibrate-impl.h"
#include "plan/profile-impl.h"

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

/* The measured grid (fractions fr, of l3d_calib_grid) into g, and the model's shapes (fwd, wg)
 * into x */
static void shape_entries(const struct l3d_calib *c, const double *fr, const double *fwd,
                          const double *wg, struct l3d_profile_grid *g,
                          struct l3d_profile_exact *x) {
    g->n = 0;
    for (int i = 0; i < L3D_CALIB_GRID && g->n < L3D_PROFILE_MAX_GRID; i++) {
        if (!l3d_calib_grid_measured(c, i)) continue;
        const int64_t *s = l3d_calib_grid[i];
        g->M[g->n] = (double)s[0], g->N[g->n] = (double)s[1], g->K[g->n] = (double)s[2];
        g->eff[g->n++] = fr[i];
    }
    x->n = c->n_exact;
    for (int i = 0; i < c->n_exact; i++) {
        const int64_t *s = c->exact_shape[i];
        x->M[i] = (double)s[0], x->N[i] = (double)s[1], x->K[i] = (double)s[2];
        x->eff[i] = fwd[i], x->wgrad[i] = wg[i];
    }
}

void l3d_calib_profile(const struct l3d_calib *c, struct l3d_profile *p) {
    memset(p, 0, sizeof *p);
    char model[160];
    cpu_model(model, sizeof model);
    snprintf(p->name, sizeof p->name, "local");
    snprintf(p->device, sizeof p->device, "one core of %.96s (%d cores%s)", model, c->cores,
             __builtin_cpu_supports("avx512f") ? ", AVX-512" : ", AVX2");
    p->peak_fp32 = c->fma;
    p->peak_bf16 = c->native16[0] ? c->peak16[0] : 0.0;
    p->peak_fp16 = c->native16[1] ? c->peak16[1] : 0.0;
    p->mem_bytes = c->mem_bytes / c->cores;
    p->mem_bw = c->bw_all / c->cores;
    p->devices_per_node = c->nodes == 1 ? c->cores : c->per_node;
    p->pair_size = 1; /* cores share no faster link than memory */
    p->intra_bw = c->intra_bw, p->intra_lat = c->intra_lat;
    p->inter_bw = c->inter_bw, p->inter_lat = c->inter_lat;
    p->n_eff = c->n_eff;
    memcpy(p->eff_flops, c->eff_flops, sizeof c->eff_flops);
    memcpy(p->eff, c->eff, sizeof c->eff);
    shape_entries(c, c->grid_eff, c->exact_eff, c->exact_wg, &p->grid, &p->exact);
    p->wgrad.n = c->n_wg;
    memcpy(p->wgrad.tokens, c->wg_tok, sizeof c->wg_tok);
    memcpy(p->wgrad.eff, c->wg_eff, sizeof c->wg_eff);
    p->attn_eff = c->attn_eff;
    p->gemm_thread_eff = c->thread_eff;
    p->kernel_bw_eff = c->kernel_bw_eff;
    for (int i = 0; i < L3D_KERN_N; i++) p->kern_eff[i] = c->k_bw[i] / c->bw_all;
    p->dp_overlap = c->ov_frac;
    for (int t = 0; t < 2; t++) {
        struct l3d_profile_16 *m = &p->mixed[t];
        m->n_eff = c->n_eff16[t];
        memcpy(m->eff_flops, c->eff16_flops[t], sizeof c->eff16_flops[t]);
        memcpy(m->eff, c->eff16[t], sizeof c->eff16[t]);
        shape_entries(c, c->grid16_eff[t], c->exact16_eff[t], c->exact16_wg[t], &m->grid,
                      &m->exact);
        m->wgrad.n = c->n_wg16[t];
        memcpy(m->wgrad.tokens, c->wg16_tok[t], sizeof c->wg16_tok[t]);
        memcpy(m->wgrad.eff, c->wg16_eff[t], sizeof c->wg16_eff[t]);
        m->attn_eff = c->attn_eff16[t];
        m->gemm_thread_eff = c->thread_eff16[t];
        m->kernel_bw_eff = c->kernel_bw_eff16[t];
        for (int i = 0; i < L3D_KERN_N; i++) m->kern_eff[i] = c->k_bw16[t][i] / c->bw_all;
        m->native = c->native16[t];
        m->attn_native = c->attn_native16[t];
        m->wgrad_block = (double)c->wgrad_block16[t];
    }
}

/* One key of p: a line saying what was measured where the figure had to be brought into the
 * planner's range, the comment (a printf format, NULL: none) on how it was measured, then the key
 * as the parser reads it. measured: a zero or negative figure is a failed measurement (a rate or
 * a time), not the "none" a 0 means in a profile. */
static void put(FILE *f, const struct l3d_profile *p, const char *key, bool measured,
                const char *comment, ...) __attribute__((format(printf, 5, 6)));
static void put(FILE *f, const struct l3d_profile *p, const char *key, bool measured,
                const char *comment, ...) {
    const struct l3d_profile_key *k = l3d_profile_key_find(key);
    L3D_ASSERT(k != NULL);
    /* gemm_thread_eff[_T] above L3D_CALIB_THREAD_EFF_MAX after its rounds is the load, not the
     * machine: written as that bound */
    struct l3d_profile_measured m = {
        .positive = measured,
        .hi = strncmp(key, "gemm_thread_eff", 15) == 0 ? L3D_CALIB_THREAD_EFF_MAX : 0.0};
    char val[1024], note[2048];
    if (comment && comment[0] == '\n') { /* a blank line opens a section: above the note */
        fputc('\n', f);
        comment++;
    }
    if (l3d_profile_key_format(p, k, &m, val, sizeof val, note, sizeof note))
        fprintf(f, "# not as measured: %s (outside what the planner accepts: calibrate again on an "
                   "idle machine)\n", note);
    if (comment) {
        va_list ap;
        va_start(ap, comment);
        vfprintf(f, comment, ap);
        va_end(ap);
        fputc('\n', f);
    }
    fprintf(f, "%s = %s\n", key, val);
}

/* A comment built piece by piece (the per-shape and per-kernel figures) */
struct text {
    char s[1024];
    size_t len;
};
static void cat(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cat(struct text *t, const char *fmt, ...) {
    if (t->len + 1 >= sizeof t->s) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(t->s + t->len, sizeof t->s - t->len, fmt, ap);
    va_end(ap);
    if (w > 0) t->len = t->len + (size_t)w < sizeof t->s ? t->len + (size_t)w : sizeof t->s - 1;
}

/* The header, the device and its peaks */
static void write_head(FILE *f, const struct l3d_calib *c, const struct l3d_profile *p,
                       const char *by, const char *date) {
    fprintf(f, "# This machine, written by llm3d bench --calibrate%s on %s (%.0f s); format: "
               "profiles/README.md.\n# A device is one CPU core: a rank with k OpenMP threads uses "
               "k devices (llm3d plan --threads k).\n",
            c->quick ? " --quick" : "", date, c->secs[2]);
    if (l3d_calib_busy(c)) {
        fprintf(f, "# WARNING: ");
        l3d_calib_print_others(f, c);
        fprintf(f,
                "; the measurements got %.0f%% of the %d cores, %.0f%% of one, %.0f%% during the "
                "all-reduces: these figures are low\n",
                100.0 * c->share[0], c->cores, 100.0 * c->share[1], 100.0 * c->share[2]);
    }
    put(f, p, "name", false, NULL);
    put(f, p, "device", false, NULL);
    if (c->fma_loop > 0.0)
        fprintf(f, "\n# warning: the FMA loop ran at %.4g TFLOP/s, below a measured product: the "
                   "peak below is the fastest product's rate", c->fma_loop / 1e12);
    const char *isa = __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2";
    put(f, p, "peak_tflops_fp32", true, "\n%s: fp32 fused multiply-adds of one thread, every core "
        "running the same at once, independent %s chains, the best of 5 rounds before, between "
        "and after the products below%s", by, isa,
        c->fma_loop > 0.0 ? ", or the fastest product's rate where that was higher" : "");
    for (int t = 0; t < 2; t++) {
        const char *n = l3d_calib_names16[t];
        char key[32];
        snprintf(key, sizeof key, "peak_tflops_%s", n);
        if (c->native16[t])
            put(f, p, key, true, "%s: %s dot products (the backend's peak of its %s products) of "
                "one thread, every core running the same at once, or the fastest %s product's "
                "rate where that was higher", by, n, n, n);
        else
            put(f, p, key, false, "# not measured: the backend's %s products are fp32 products "
                "here", n);
    }
}

/* Memory, and the links inside a node and between nodes */
static void write_links(FILE *f, const struct l3d_calib *c, const struct l3d_profile *p,
                        const char *by) {
    put(f, p, "mem_gb", true, "\n%s: physical memory (sysconf, %.1f GB) / %d cores", by,
        c->mem_bytes / 1e9, c->cores);
    put(f, p, "mem_bw_gbs", true, "%s: STREAM triad (12 bytes an element) on all %d cores at once "
        "over 3 arrays of %zu MiB in all, best pass, interleaved with the kernels below: %.1f GB/s "
        "/ %d cores (one core alone: %.1f GB/s)", by, c->cores, c->triad_bytes >> 20,
        c->bw_all / 1e9, c->cores, c->bw_one / 1e9);
    if (c->nodes == 1)
        put(f, p, "devices_per_node", false, "\n%s: cores (logical CPUs this process may use)", by);
    else
        put(f, p, "devices_per_node", false, "\n%s: the ranks launched on each of %d nodes (a "
            "device is a rank's core: launch one OpenMP thread a rank)", by, c->nodes);
    put(f, p, "pair_size", false, "# cores share no faster link than memory");
    put(f, p, "pair_bw_gbs", false, NULL);
    const int n_lat = c->quick ? 300 : 5000;
    char stream[160];
    snprintf(stream, sizeof stream, "bus bandwidth 2(p-1)/p bytes/time of %.0f MiB in 4 MiB "
             "non-blocking pieces posted together (the trainer's gradient stream), median of %d",
             (double)c->stream_bytes / 1048576.0, c->stream_rounds);
    if (c->nodes > 1 && c->per_node == 1) {
        put(f, p, "intra_bw_gbs", false, "# one rank a node: no link inside a node measured (the "
            "planner uses mem_bw)");
        put(f, p, "intra_lat_us", false, NULL);
    } else {
        put(f, p, "intra_bw_gbs", true, "%s: all-reduce between %d ranks of %s through the "
            "communicator (%s): %s", by, c->nodes == 1 ? c->ranks : c->per_node,
            c->nodes == 1 ? "this machine" : "each node, every node at once",
            l3d_comm_mpi_library(), stream);
        put(f, p, "intra_lat_us", true, "%s: median of %d back-to-back 8-byte all-reduces", by,
            n_lat);
    }
    if (c->nodes == 1) {
        put(f, p, "inter_bw_gbs", false, "# one node: no network");
        put(f, p, "inter_lat_us", false, NULL);
    } else {
        put(f, p, "inter_bw_gbs", true, "%s: all-reduce between the %d nodes, one rank each (the "
            "lowest), through the communicator (%s): %s", by, c->nodes, l3d_comm_mpi_library(),
            stream);
        put(f, p, "inter_lat_us", true, "%s: median of %d back-to-back 8-byte all-reduces between "
            "the nodes", by, n_lat);
    }
}

/* The four element-wise kernels' figures against the triad, for a comment */
static void kern_figures(struct text *t, const char *const *names, const double *k_bw,
                         double bw_all) {
    for (int i = 0; i < L3D_KERN_N; i++)
        cat(t, " %s %.2f%s", names[i], k_bw[i] / bw_all, i < L3D_KERN_N - 1 ? "," : "");
}

/* The compute figures of one core, fp32 */
static void write_compute(FILE *f, const struct l3d_calib *c, const struct l3d_profile *p,
                          const char *by) {
    put(f, p, "gemm_eff_grid", false, "\n%s: the backend's linear layer of M tokens, K inputs, "
        "N outputs, its forward and input-gradient products (4 M N K FLOPs), on one core (every "
        "core busy with the same), %d shapes in rows of one smallest side (M 64..2048, N = K up "
        "to 3072), buffers rotating over 64 MiB, median pass each: fraction of the FMA peak. "
        "The planner reads it by a product's smallest side and FLOPs", by, c->eff_shapes);
    put(f, p, "gemm_eff", false, "%s: gemm_eff_grid's shapes bucketed by the FLOPs of one "
        "product (2 M N K) in half decades: geometric-mean FLOPs, median fraction (for planners "
        "that read no grid)", by);
    if (c->n_exact > 0)
        put(f, p, "gemm_exact", false, "%s: with --model, %s: its linear layers M x N x K as the "
            "trainer runs them: F the forward and input-gradient products, W the weight "
            "gradient, each as gemm_eff_grid measures a shape; the planner takes them first for "
            "products of exactly these shapes", by, c->model);
    put(f, p, "gemm_eff_wgrad", false, "%s: the linear layer's weight-gradient product alone (2 M "
        "N K FLOPs, accumulated into the gradient), by the tokens M it reduces over, at GPT-2 "
        "small's weights 768x768 and 3072x768 (out of cache), buffers rotating over 64 MiB, "
        "median pass: the mean of the two, fraction of the FMA peak", by);
    put(f, p, "attn_eff", false, "%s: the backend's attention forward + backward on one core "
        "(every core busy) at B=4 T=256 NH=12 HS=64 (%.1f + %.1f ms, best passes); model FLOPs 12 "
        "B T^2 C (forward 4 B T^2 C, backward twice that; the full T^2, causal half not removed, "
        "as Narayanan et al. 2021 count) / time / FMA peak", by, c->attn_fwd_s * 1e3,
        c->attn_bwd_s * 1e3);
    struct text t = {.len = 0};
    for (int i = 0; i < L3D_CALIB_THREAD_SHAPES; i++)
        cat(&t, " %lldx%lldx%lld %.2f%s", (long long)l3d_calib_thread_shapes[i][0],
            (long long)l3d_calib_thread_shapes[i][1], (long long)l3d_calib_thread_shapes[i][2],
            c->thr_all[i] / (c->cores * c->thr_one[i]), i < 3 ? "," : "");
    char again[160] = "";
    if (c->thread_rounds > 1)
        snprintf(again, sizeof again, " (the one-core rates the median of %d rounds: measured "
                 "again while a median was above %g)", c->thread_rounds, L3D_CALIB_THREAD_EFF_MAX);
    put(f, p, "gemm_thread_eff", false, "%s: the linear layer on all %d cores of one process "
        "against %d single cores (every core busy), GPT-2 124M's shapes:%s; the median%s", by,
        c->cores, c->cores, t.s, again);
    t.len = 0;
    kern_figures(&t, l3d_calib_kern_names, c->k_bw, c->bw_all);
    snprintf(again, sizeof again, c->memory_rounds > 1 ? " (the best passes of %d rounds: "
             "measured again while a kernel was above %g of the triad)" : "", c->memory_rounds,
             l3d_calib_kernel_eff_max());
    put(f, p, "kernel_bw_eff", false, "%s: the backend's element-wise kernels on all %d cores over "
        "%lld-element arrays, bytes read + written once / best time / triad bandwidth of all "
        "cores, interleaved:%s; the median%s", by, c->cores, (long long)c->k_n, t.s, again);
    /* the four one by one (in enum l3d_kern's order), for the planner, which times each
     * element-wise pass at its own kernel's figure: LayerNorm and GELU are bound by their
     * arithmetic, a residual add and AdamW by memory, so the median fits none of them */
    put(f, p, "kernel_bw_effs", false, NULL);
}

/* llm3d's 16-bit kernels: the compute figures of type t (bf16, fp16) */
static void write_16(FILE *f, const struct l3d_calib *c, const struct l3d_profile *p,
                     const char *by, int t) {
    const char *n = l3d_calib_names16[t];
    char key[7][32];
    static const char *const stem[7] = {"gemm_native", "gemm_eff", "gemm_eff_wgrad", "attn_eff",
                                        "gemm_thread_eff", "kernel_bw_eff", "kernel_bw_effs"};
    for (int i = 0; i < 7; i++) snprintf(key[i], sizeof key[i], "%s_%s", stem[i], n);
    char grid[32], exact[32];
    snprintf(grid, sizeof grid, "gemm_eff_grid_%s", n);
    snprintf(exact, sizeof exact, "gemm_exact_%s", n);
    fprintf(f, "\n# llm3d's %s kernels (--precision %s: 16-bit activations and weights, fp32 "
               "main_grad), %s\n", n, n,
            c->native16[t] ? "products in oneDNN's own 16-bit kernels (fp32 sums)"
                           : "products widened to fp32 around the fp32 product on this CPU, "
                             "conversions included");
    put(f, p, key[0], false, "%s: whether the products run in 16-bit kernels (no fp32 copies of "
        "their operands: the planner's memory leaves those out)", by);
    char attn[32];
    snprintf(attn, sizeof attn, "attn_native_%s", n);
    put(f, p, attn, false, "%s: whether attention's products run as batched 16-bit matmuls "
        "(oneDNN, AMX), with a scratch the planner's memory counts", by);
    char wblk[40];
    snprintf(wblk, sizeof wblk, "gemm_wgrad_block_%s", n);
    put(f, p, wblk, false, "%s: MiB of fp32 scratch in which the weight gradients' products run a "
        "block of rows at a time before their sum into the gradient (oneDNN's gemm kernels, "
        "AMX), which the planner's memory counts; 0: none", by);
    put(f, p, key[1], false, "%s: the linear layer as gemm_eff, in %s through the backend "
        "(forward and input gradient), the same shapes and buckets; fraction of %s%s", by, n,
        c->native16[t] ? "peak_tflops_" : "the fp32 FMA peak", c->native16[t] ? n : "");
    put(f, p, grid, false, "%s: as gemm_eff_grid, in %s", by, n);
    if (c->n_exact > 0) put(f, p, exact, false, "%s: as gemm_exact, in %s", by, n);
    put(f, p, key[2], false, "%s: the weight gradient as gemm_eff_wgrad, in %s (into the fp32 "
        "main_grad)", by, n);
    put(f, p, key[3], false, "%s: the attention as attn_eff, in %s (%.1f + %.1f ms)", by, n,
        c->attn16_s[t][0] * 1e3, c->attn16_s[t][1] * 1e3);
    struct text r = {.len = 0};
    for (int i = 0; i < L3D_CALIB_THREAD_SHAPES; i++)
        cat(&r, " %.2f", c->thr_all16[t][i] / (c->cores * c->thr_one16[t][i]));
    put(f, p, key[4], false, "%s: as gemm_thread_eff, in %s:%s; the median%s", by, n, r.s,
        c->thread_rounds > 1 ? " (the one-core rates as gemm_thread_eff's)" : "");
    r.len = 0;
    kern_figures(&r, l3d_calib_kern_names16, c->k_bw16[t], c->bw_all);
    put(f, p, key[5], false, "%s: as kernel_bw_eff, in %s, bytes at 2 an element (fp32 "
        "statistics; adamw_mixed 30 bytes: fp32 master, moments, gradient and the 16-bit "
        "copy):%s; the median", by, n, r.s);
    put(f, p, key[6], false, NULL);
}

void l3d_calib_write(FILE *f, const struct l3d_calib *c, const struct l3d_profile *p) {
    char date[32], by[96];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    snprintf(by, sizeof by, "# measured by llm3d bench --calibrate%s on %s",
             c->quick ? " --quick" : "", date);
    write_head(f, c, p, by, date);
    write_links(f, c, p, by);
    write_compute(f, c, p, by);
    for (int t = 0; t < 2; t++) write_16(f, c, p, by, t);
    put(f, p, "dp_overlap", false, "%s: %.0f MiB of gradients all-reduced %s in 4 MiB non-blocking "
        "pieces, all posted before %d linear-layer backward products (256x768x768, one thread a "
        "rank, every rank at once), progressed %s: the reduction alone %.1f ms, the products "
        "alone %.1f ms, both %.1f ms; hidden (products + reduction - both) / reduction, 0 to 1, "
        "the median of %d rounds", by, (double)c->stream_bytes / 1048576.0,
        c->nodes > 1 ? "between the nodes (a rank of each)" : "among the ranks", c->ov_kernels,
        c->thread ? "by the progress thread (the trainer's default across nodes)"
                  : "by tests between the products (the trainer's default within a node)",
        c->ov_x * 1e3, c->ov_c * 1e3, c->ov_t * 1e3, c->stream_rounds);
}

/* The file's text (malloc'd), parsed back: a profile the planner would refuse is never saved */
static l3d_status calib_text(const struct l3d_calib *c, const char *path, char **text) {
    struct l3d_profile p, back;
    l3d_calib_profile(c, &p);
    size_t len = 0;
    FILE *m = open_memstream(text, &len);
    if (!m) return l3d_error(L3D_ERR_OOM, "out of memory writing %s", path);
    l3d_calib_write(m, c, &p);
    if (fclose(m) != 0) {
        free(*text);
        return l3d_error(L3D_ERR_OOM, "out of memory writing %s", path);
    }
    if (l3d_profile_parse(&back, *text, path) != L3D_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", l3d_error_message());
        free(*text);
        return l3d_error(L3D_ERR_INTERNAL, "the profile for %s would not parse, so it is not "
                         "written (a bug in llm3d's writer: please report it): %s", path, why);
    }
    return L3D_OK;
}

l3d_status l3d_calib_check_out(const char *path) {
    struct l3d_out o; /* a temporary made and removed: the folder is writable, path replaceable */
    if (l3d_out_open(&o, path, "--out profile") != L3D_OK) return o.st;
    l3d_out_abort(&o);
    return L3D_OK;
}

l3d_status l3d_calib_save(const char *path, const struct l3d_calib *c) {
    char *text = NULL;
    l3d_status st = calib_text(c, path, &text);
    if (st != L3D_OK) return st;
    st = l3d_write_file(path, "profile", text, strlen(text));
    free(text);
    return st;
}
