/*
 * llm3d bench --calibrate [--out FILE] [--quick]: measures this machine and writes its system
 * profile (format: profiles/README.md) with `name = local`, where a device is one CPU core.
 *
 *   OMP_NUM_THREADS=1 mpiexec -n 2 llm3d bench --calibrate          # writes ./local.prof
 *
 * The command's flags and what it prints; the measurements and the file are the library's
 * (include/llm3d/calibrate.h, src/plan/calibrate*.c).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/calibrate.h"
#include "llm3d/comm.h"
#include "llm3d/plan.h"
#include "llm3d/spec.h"

#define CMD "bench"

static void usage(FILE *f) {
    fprintf(f,
            "usage: OMP_NUM_THREADS=1 mpiexec -n 2 llm3d bench --calibrate [--out FILE] [--quick]\n"
            "       [--model NAME [model flags] [--batch B] [--seq-len T] [--tp N] [--cp N] "
            "[--ep N]]\n\n"
            "Measures this machine (a device is one core) and writes its system profile for llm3d "
            "plan\n(profiles/README.md): FMA peak, linear-layer efficiency by shape, memory and "
            "element-wise\nkernel bandwidth, attention efficiency, MPI all-reduce bandwidth and "
            "latency between the ranks;\nlaunched on several nodes with as many ranks each, "
            "also between the nodes (a two-level profile).\nWith a model (--model or its size "
            "flags), also that model's own linear layers as llm3d plan\nplans them for the "
            "layout's --batch, --seq-len, --tp, --cp and --ep (gemm_exact: the planner takes\n"
            "them first for products of those shapes). The other layout and precision flags are "
            "read and\nchange nothing: every precision is measured.\n");
}

enum { C_CALIBRATE, C_OUT, C_QUICK };
static const struct l3d_flag calib_flags[] = {
    {"calibrate", NULL, C_CALIBRATE, "measure this machine and write its profile"},
    {"out", "FILE", C_OUT, "where to write it (default: local.prof in this directory)"},
    {"quick", NULL, C_QUICK, "shorter measurements (about a fifth of the time; noisier figures)"},
    {NULL, NULL, 0, NULL},
};
struct calib_opts {
    const char *out;
    struct l3d_calib *c;
};
static int set_calib(void *ctx, const char *cmd, int id, const char *v) {
    struct calib_opts *o = ctx;
    (void)cmd;
    if (id == C_OUT) o->out = v;
    if (id == C_QUICK) o->c->quick = true;
    return 1;
}

/* --model and the layout's flags: the model's linear shapes as the planner plans them
 * (l3d_plan_linear_shapes) into c, and what they are of; none without a model flag */
static int model_shapes(struct l3d_cli_spec *cs, struct l3d_calib *c) {
    bool model = cs->preset || cs->L || cs->C || cs->NH || cs->V || cs->maxT || cs->ffn;
    if (!model && cs->given != 0) {
        fprintf(stderr, "llm3d " CMD ": the layout and precision flags pick a model's linear "
                "layers to measure: give --model NAME with them, or leave them out\n");
        return 2;
    }
    if (!model) return -1;
    struct l3d_model_spec m;
    if (l3d_cli_plan_model(cs, &m) != L3D_OK) {
        fprintf(stderr, "llm3d " CMD ": %s\n", l3d_error_message());
        return 2;
    }
    struct l3d_layout lay = cs->spec->layout;
    if (lay.tp < 1 || lay.cp < 1 || lay.ep < 1 || lay.micro_batch < 1 || m.C % lay.tp != 0 ||
        m.maxT % lay.cp != 0 || (m.moe.experts > 0 && m.moe.experts % lay.ep != 0)) {
        fprintf(stderr, "llm3d " CMD ": --tp %d, --cp %d, --ep %d, --batch %d do not split model "
                "%s (channels %d, sequence %d, experts %d): give divisors of them\n", lay.tp,
                lay.cp, lay.ep, lay.micro_batch, m.name, m.C, m.maxT, m.moe.experts);
        return 2;
    }
    c->n_exact = l3d_plan_linear_shapes(&m, &lay, c->exact_shape, L3D_PROFILE_MAX_EXACT);
    snprintf(c->model, sizeof c->model, "model %s (L=%d C=%d NH=%d V=%d), batch %d, sequence %d, "
             "tp %d, cp %d, ep %d", cs->preset ? cs->preset : m.name, m.L, m.C, m.NH, m.V,
             lay.micro_batch, m.maxT, lay.tp, lay.cp, lay.ep);
    return -1;
}

/* The flags into *out and c; -1 to go on, else the exit status */
static int parse_flags(int argc, char **argv, const char **out, struct l3d_calib *c) {
    struct l3d_run_spec spec;
    l3d_run_spec_defaults(&spec);
    struct l3d_cli_spec cs;
    l3d_cli_spec_init(&cs, &spec);
    struct calib_opts o = {.out = *out, .c = c};
    struct l3d_flag_group g[4];
    g[0] = (struct l3d_flag_group){"calibration", calib_flags, set_calib, &o};
    int n = 1 + l3d_cli_spec_groups(&cs, g + 1);
    int rc = l3d_flags_parse(CMD, argc, argv, g, n, usage, NULL);
    if (rc < 0) rc = l3d_cli_spec_flags_done(CMD, &cs);
    if (rc >= 0) return rc;
    *out = o.out;
    if (!**out) {
        fprintf(stderr, "llm3d " CMD ": --out is empty; give a file name\n");
        return 2;
    }
    return model_shapes(&cs, c);
}

static void print_compute(const struct l3d_calib *c) {
    printf("fp32 FMA peak of one core, every core busy: %.1f GFLOP/s\n", c->fma / 1e9);
    if (c->fma_loop > 0.0)
        printf("warning: the FMA loop ran at %.1f GFLOP/s, below a measured product; the peak is "
               "the fastest product's rate (a sanitizer build, or a busy machine: calibrate again "
               "on an idle machine with a release build)\n", c->fma_loop / 1e9);
    printf("linear layer forward + input gradient, one core (fraction of the FMA peak):");
    for (int i = 0; i < c->n_eff; i++) printf(" %.2g:%.2f", c->eff_flops[i], c->eff[i]);
    printf("\nby shape (M x N x K:fraction):");
    for (int i = 0; i < L3D_CALIB_GRID; i++)
        if (c->grid_eff[i] > 0)
            printf(" %lldx%lldx%lld:%.2f", (long long)l3d_calib_grid[i][0],
                   (long long)l3d_calib_grid[i][1], (long long)l3d_calib_grid[i][2],
                   c->grid_eff[i]);
    if (c->n_exact > 0) printf("\n%s (forward and input gradient / weight gradient):", c->model);
    for (int i = 0; i < c->n_exact; i++)
        printf(" %lldx%lldx%lld:%.2f/%.2f", (long long)c->exact_shape[i][0],
               (long long)c->exact_shape[i][1], (long long)c->exact_shape[i][2], c->exact_eff[i],
               c->exact_wg[i]);
    printf("\nweight gradient by tokens:");
    for (int i = 0; i < c->n_wg; i++) printf(" %.0f:%.2f", c->wg_tok[i], c->wg_eff[i]);
    printf("\n");
    printf("attention B=4 T=256 NH=12 HS=64, one core: forward %.1f ms, backward %.1f ms, "
           "%.0f%% of the FMA peak\n", c->attn_fwd_s * 1e3, c->attn_bwd_s * 1e3,
           100.0 * c->attn_eff);
    printf("linear layers on all %d cores of one rank against %d single cores: %.2f\n", c->cores,
           c->cores, c->thread_eff);
    static const char *const names16[2] = {"bf16", "fp16"};
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
}

static void print_links(const struct l3d_calib *c) {
    if (c->nodes == 1)
        printf("all-reduce between %d ranks: %.2f GB/s bus bandwidth (a stream), %.1f us (8 "
               "bytes)\n", c->ranks, c->intra_bw / 1e9, c->intra_lat * 1e6);
    else
        printf("%d nodes x %d ranks; all-reduce inside a node: %.2f GB/s, %.1f us%s; between "
               "nodes (one rank each): %.2f GB/s bus bandwidth (a stream), %.1f us (8 bytes)\n",
               c->nodes, c->per_node, c->intra_bw / 1e9, c->intra_lat * 1e6,
               c->per_node > 1 ? "" : " (one rank a node: not measured)", c->inter_bw / 1e9,
               c->inter_lat * 1e6);
    printf("DP overlap: %.0f%% of a %.0f MiB reduction hidden behind backward products "
           "(%s; alone %.1f ms, products %.1f ms, both %.1f ms)\n", 100.0 * c->ov_frac,
           (double)c->stream_bytes / 1048576.0, c->thread ? "progress thread" : "polled",
           c->ov_x * 1e3, c->ov_c * 1e3, c->ov_t * 1e3);
    printf("CPU time got: %.0f%% of the %d cores, %.0f%% of one core, %.0f%% during the "
           "all-reduces; ", 100.0 * c->share[0], c->cores, 100.0 * c->share[1],
           100.0 * c->share[2]);
    l3d_calib_print_others(stdout, c);
    printf("\n");
}

/* The progress lines, on rank 0 after each phase of l3d_calib_measure */
static void report(enum l3d_calib_phase phase, const struct l3d_calib *c, void *arg) {
    (void)arg;
    switch (phase) {
    case L3D_CALIB_START:
        printf("calibrating on %d cores%s\n", c->cores, c->quick ? " (--quick)" : "");
        break;
    case L3D_CALIB_MEMORY:
        printf("memory bandwidth (triad): %.1f GB/s on %d cores (%.1f a core), %.1f GB/s on one\n",
               c->bw_all / 1e9, c->cores, c->bw_all / 1e9 / c->cores, c->bw_one / 1e9);
        for (int i = 0; i < L3D_KERN_N; i++)
            printf("  %-18s %6.1f GB/s on %d cores (%.0f%%)\n", l3d_calib_kern_names[i],
                   c->k_bw[i] / 1e9, c->cores, 100.0 * c->k_bw[i] / c->bw_all);
        break;
    case L3D_CALIB_COMPUTE: print_compute(c); break;
    case L3D_CALIB_LINKS: print_links(c); break;
    }
    fflush(stdout);
}

int l3d_cli_calibrate(int argc, char **argv) {
    struct l3d_calib c = {0};
    const char *out = "local.prof";
    int rc = parse_flags(argc, argv, &out, &c);
    if (rc >= 0) return rc;
    /* across nodes with the progress thread, as the trainer's default there (dp_overlap is
     * measured with it) */
    struct l3d_comm *world;
    c.thread = l3d_cli_launcher_spans_nodes();
    if (l3d_comm_mpi_init_progress(&argc, &argv, c.thread, &world) != L3D_OK) {
        fprintf(stderr, "llm3d " CMD ": %s\n", l3d_error_message());
        return 1;
    }
    bool lead = world->rank == 0, said = false;
    l3d_status st = lead ? l3d_calib_check_out(out) : L3D_OK;
    st = l3d_comm_agree(world, st, &said);
    if (st == L3D_OK) { /* every rank finds the same launch error: rank 0 says it */
        st = l3d_calib_measure(world, &c, report, NULL);
        said = lead;
    }
    if (st != L3D_OK) {
        if (said) fprintf(stderr, "llm3d " CMD ": %s\n", l3d_error_message());
        l3d_comm_mpi_finalize(world);
        return st == L3D_ERR_ARG ? 2 : 1;
    }
    if (lead) {
        if (l3d_calib_busy(&c))
            fprintf(stderr, "llm3d " CMD ": warning: other processes were running, so the figures "
                    "are low (the file says so); calibrate on an idle machine\n");
        st = l3d_calib_save(out, &c);
        if (st == L3D_OK)
            printf("wrote %s (measured in %.0f s: compute %.0f s, all-reduce %.0f s)\n", out,
                   c.secs[2], c.secs[0], c.secs[1]);
        else
            fprintf(stderr, "llm3d " CMD ": %s\n", l3d_error_message());
    }
    l3d_comm_mpi_finalize(world);
    return st == L3D_OK ? 0 : 1;
}
