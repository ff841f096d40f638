/* llm3d plan: predicted memory and step time of layouts, the best ones first (include/llm3d/plan.h). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/arch.h"
#include "llm3d/plan.h"
#include "llm3d/spec.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d plan [flags]\n"
        "\n"
        "Predicts memory per device and time per step of training layouts on a system and prints\n"
        "the fastest that fit. Fix any part of the layout with its flag (the same flags as llm3d\n"
        "train); the rest is searched. Defaults: --model d12, --seq-len the model's context,\n"
        "--global-batch 8 (or --batch x --grad-accum x --dp when all three are given), --threads\n"
        "1; --precision fp32 for llm3d's trainer and on a profile without 16-bit peak, else bf16\n"
        "(fp16 if the profile has no bf16).\n"
        "\n");
}

static const char *rc_name(enum l3d_recompute r) {
    return r == L3D_RECOMPUTE_FULL ? "full" : r == L3D_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

/* s as a JSON string, quotes included (RFC 8259 sec. 7: '"', '\\' and control characters
 * escaped) */
static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c == '\n') fputs("\\n", f);
        else if (*c == '\t') fputs("\\t", f);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

/* --json: a failure is one object too, {"error": reason}, so that a reader of the output sees
 * why there is no layout */
static void print_json_error(const char *reason) {
    printf("{\"error\":");
    json_string(stdout, reason);
    printf("}\n");
}

static void print_json(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                       const struct l3d_plan_run *run, const struct l3d_plan_result *r) {
    const struct l3d_layout *l = &r->layout;
    const struct l3d_plan_time *t = &r->time;
    const struct l3d_plan_mem *mm = &r->mem;
    char ends[64] = ""; /* uneven end stages, when a layout has them */
    if (l->pp_first || l->pp_last)
        snprintf(ends, sizeof ends, ",\"pp_first\":%d,\"pp_last\":%d", l->pp_first, l->pp_last);
    printf("{\"model\":");
    json_string(stdout, m->name);
    printf(",\"profile\":");
    json_string(stdout, prof->name);
    printf(",\"devices\":%lld,\"global_batch\":%lld,"
           "\"precision\":\"%s\",\"tp\":%d,\"pp\":%d,\"dp\":%d,\"mb\":%d,\"v\":%d,\"zero\":%d,"
           "\"recompute\":\"%s\",\"sp\":%s,\"schedule\":\"%s\",\"threads\":%d,\"m\":%d,"
           "\"mem_params\":%.0f,\"mem_grads\":%.0f,\"mem_optimizer\":%.0f,"
           "\"mem_activations\":%.0f,\"mem_other\":%.0f,\"mem_total\":%.0f,\"mem_stage\":%d,"
           "\"fits\":%s,\"t_gemm\":%.6g,\"t_attention\":%.6g,\"t_elementwise\":%.6g,"
           "\"t_recompute\":%.6g,\"t_tp\":%.6g,\"t_p2p\":%.6g,\"t_bubble\":%.6g,\"t_dp\":%.6g,"
           "\"t_embed\":%.6g,\"t_optimizer\":%.6g,\"step_s\":%.6g,\"tokens_per_s\":%.6g,"
           "\"mfu\":%.5f,\"hfu\":%.5f,\"mem_reserve\":%.0f,\"cp\":%d,\"t_cp\":%.6g,"
           "\"bubble_fraction\":%.5f,\"ep\":%d,\"t_ep\":%.6g%s}\n",
           (long long)run->devices, (long long)l->global_batch,
           l3d_precision_name(&run->precision), l->tp, l->pp, l->dp, l->micro_batch, l->v, l->zero,
           rc_name(l->recompute), l->sp ? "true" : "false", l3d_pp_kind_name(l->schedule),
           l->threads, r->m, mm->params, mm->grads, mm->optimizer, mm->activations, mm->other,
           mm->total, mm->stage, r->fits ? "true" : "false", t->gemm, t->attention,
           t->elementwise, t->recompute, t->tp_comm, t->pp_p2p, t->bubble, t->dp_comm,
           t->embed_sync, t->optimizer, t->step, r->tokens_per_s, r->mfu, r->hfu,
           prof->reserve_bytes, l->cp > 1 ? l->cp : 1, t->cp_comm, t->bubble_frac,
           l->ep > 1 ? l->ep : 1, t->ep_comm, ends);
}

static const char *mem_unit(const struct l3d_profile *prof, double *scale) {
    if (prof->mem_bytes >= 4e9) {
        *scale = 1e9;
        return "GB";
    }
    *scale = 1048576.0;
    return "MiB";
}

static void print_table(const struct l3d_profile *prof, const struct l3d_plan_result *r, int n) {
    double sc;
    const char *u = mem_unit(prof, &sc);
    printf("  # tp  pp   dp  mb  v Z recompute SP sched          m | memory %s: params grads optim  acts "
           "other  total | step s: compute recomp     TP    p2p bubble (%%)    DP  optim   step | "
           "tok/s  MFU  HFU\n", u);
    for (int i = 0; i < n; i++) {
        const struct l3d_layout *l = &r[i].layout;
        const struct l3d_plan_time *t = &r[i].time;
        const struct l3d_plan_mem *m = &r[i].mem;
        double compute = t->gemm + t->attention + t->elementwise;
        /* p2p: the pipeline's and the context-parallel ring's; a ring named after the row */
        char cp[96] = "";
        size_t k = 0;
        if (l->cp > 1)
            k = (size_t)snprintf(cp, sizeof cp, " (cp %d: ring %.3g s in p2p)", l->cp, t->cp_comm);
        if (l->ep > 1 && k < sizeof cp) /* the experts' exchanges, with the TP column's */
            snprintf(cp + k, sizeof cp - k, " (ep %d: all-to-all %.3g s in TP)", l->ep, t->ep_comm);
        printf("%3d %2d %3d %4d %3d %2d %d %-9s %-2s %-11s %5d | %14.2f %5.2f %5.2f %5.2f %5.2f "
               "%6.2f | %15.4g %6.3g %6.3g %6.3g %6.3g (%4.1f) %6.3g %6.3g %6.4g | %5.3g %4.1f%% "
               "%4.1f%%%s\n",
               i + 1, l->tp, l->pp, l->dp, l->micro_batch, l->v, l->zero, rc_name(l->recompute),
               l->sp ? "y" : "n", l->pp > 1 ? l3d_pp_kind_name(l->schedule) : "-", r[i].m, m->params / sc, m->grads / sc, m->optimizer / sc,
               m->activations / sc, m->other / sc, m->total / sc, compute, t->recompute,
               t->tp_comm + t->ep_comm, t->pp_p2p + t->cp_comm, t->bubble, 100 * t->bubble_frac,
               t->dp_comm + t->embed_sync,
               t->optimizer, t->step, r[i].tokens_per_s, 100 * r[i].mfu, 100 * r[i].hfu, cp);
    }
}

/* ---- published runs --------------------------------------------------------------------- */

static const struct published {
    const char *what, *model, *profile;
    int64_t devices, batch;
    enum l3d_dtype prec;
    bool flash;
    int tp, pp, dp, mb, v, zero;
    enum l3d_recompute rc;
    double pct;      /* published % of the peak, the run's own FLOP counter */
    const char *source;
    bool fit;        /* the run the profile's gemm_calibration was fitted on */
    bool sp;         /* sequence parallelism */
    bool mfu;        /* the published figure counts model FLOPs only (no recomputation) */
} published[] = {
    {"Frontier 22B", "frontier-22b", "frontier", 16, 640, L3D_F16, true, 1, 8, 2, 1, 1, 0,
     L3D_RECOMPUTE_FULL, 38.38, "Dash et al. 2023, abstract", true, false, false},
    {"Frontier 175B", "frontier-175b", "frontier", 128, 640, L3D_F16, true, 4, 16, 2, 1, 1, 1,
     L3D_RECOMPUTE_FULL, 36.14, "Dash et al. 2023, abstract", false, false, false},
    {"Frontier 1T", "frontier-1t", "frontier", 1024, 1024, L3D_F16, true, 4, 128, 2, 1, 1,
     1, L3D_RECOMPUTE_FULL, 31.96, "Dash et al. 2023, abstract", false, false, false},
    {"Megatron 1.7B", "megatron-1.7b", "dgx-a100", 32, 512, L3D_F16, false, 1, 1, 32, 16,
     1, 0, L3D_RECOMPUTE_FULL, 44, "Narayanan et al. 2021, Table 1", false, false, false},
    {"Megatron 145.6B", "megatron-145b", "dgx-a100", 1536, 2304, L3D_F16, false, 8, 8, 24,
     1, 1, 0, L3D_RECOMPUTE_FULL, 47, "Narayanan et al. 2021, Table 1", false, false, false},
    {"Megatron 529.6B", "megatron-530b", "dgx-a100", 2520, 2520, L3D_F16, false, 8, 35, 9,
     1, 1, 0, L3D_RECOMPUTE_FULL, 52, "Narayanan et al. 2021, Table 1", false, false, false},
    {"Megatron 1T", "megatron-1t", "dgx-a100", 3072, 3072, L3D_F16, false, 8, 64, 6, 1, 1,
     0, L3D_RECOMPUTE_FULL, 52, "Narayanan et al. 2021, Table 1", true, false, false},
    /* Korthikanti et al. 2022, abstract: the 530B model on 2240 A100s, model FLOPs utilisation
     * with full recomputation and with selective recomputation and sequence parallelism. Not in
     * the abstract, assumed: tp 8 x pp 35 (Narayanan et al.'s 530B layout) x dp 8, micro-batch
     * 1, global batch 2240 */
    {"Megatron 2022 530B, full", "megatron-530b", "dgx-a100", 2240, 2240, L3D_F16, false,
     8, 35, 8, 1, 1, 0, L3D_RECOMPUTE_FULL, 42.1, "Korthikanti et al. 2022, abstract (MFU)",
     false, false, true},
    {"Megatron 2022 530B, selective + SP", "megatron-530b", "dgx-a100", 2240, 2240,
     L3D_F16, false, 8, 35, 8, 1, 1, 0, L3D_RECOMPUTE_SELECTIVE, 54.2,
     "Korthikanti et al. 2022, abstract (MFU)", false, true, true},
};

static l3d_status eval_published(const struct published *p, int64_t devices, int dp,
                                 int64_t batch, bool calibrated, struct l3d_plan_result *r) {
    struct l3d_model_spec m;
    struct l3d_profile prof;
    struct l3d_plan_run run = l3d_plan_run_default();
    run.devices = devices;
    l3d_precision_parse(l3d_dtype_name(p->prec), &run.precision);
    run.precision.grad = p->prec; /* Megatron-LM's 2-byte gradients */
    run.flash = p->flash;
    run.calibrated = calibrated;
    struct l3d_layout lay = {.tp = p->tp, .pp = p->pp, .dp = dp, .micro_batch = p->mb, .v = p->v,
                                  .zero = p->zero, .recompute = p->rc, .sp = p->sp,
                                  .schedule = p->v > 1 ? L3D_PP_INTERLEAVED : L3D_PP_1F1B,
                                  .threads = 1, .global_batch = batch};
    l3d_status st = l3d_model_preset(&m, p->model);
    if (st == L3D_OK) st = l3d_profile_find(&prof, p->profile);
    if (st == L3D_OK) st = l3d_plan_evaluate(&m, &prof, &run, &lay, r);
    return st;
}

/* Scaling of the Frontier runs (Dash et al. 2023, abstract): weak scaling keeps the sequences per
 * replica, strong scaling the global batch, from `devices` to `devices2` GCDs. */
static const struct scaling {
    int run;            /* index into published[] */
    bool strong;
    int64_t devices, batch, devices2, batch2;
    double pct;
    const char *note;
    bool chosen;        /* a free input (the batch) was chosen with this figure in view */
} scalings[] = {
    {1, false, 128, 640, 1024, 5120, 100.0, "320 sequences a replica, dp 2 -> 16", false},
    {2, false, 1024, 1024, 3072, 3072, 100.0, "512 sequences a replica, dp 2 -> 6", false},
    {1, true, 1024, 5184, 3072, 5184, 89.93,
     "batch of the 1024-GCD weak-scaling run (5120) rounded to a multiple of dp 48", false},
    {2, true, 1024, 1026, 3072, 1026, 87.05,
     "batch of the 1024-GCD run (1024) rounded to a multiple of dp 6", false},
    {2, true, 1024, 3072, 3072, 3072, 87.05, "batch of the 3072-GCD weak-scaling run", true},
};

#define N_PUBLISHED (sizeof published / sizeof published[0])

/* Relative errors of predictions against published figures: their mean and worst. */
struct rel_err {
    double sum, worst;
    int n;
};

static void rel_err_add(struct rel_err *e, double pred, double pub) {
    double x = fabs(pred - pub) / pub;
    e->sum += x;
    e->worst = x > e->worst ? x : e->worst;
    e->n++;
}

/* the mean in per cent */
static double rel_err_mean_pct(const struct rel_err *e) {
    return 100 * e->sum / (e->n ? e->n : 1);
}

/* Published run p evaluated as published (calibrated: with its profile's gemm_calibration, and
 * the profile in *prof unless NULL): the predicted % of peak in *pred, true; else NAN and false
 * after one line. */
static bool predicted(const struct published *p, bool calibrated, struct l3d_plan_result *r,
                      struct l3d_profile *prof, double *pred) {
    *pred = NAN;
    if (eval_published(p, p->devices, p->dp, p->batch, calibrated, r) != L3D_OK ||
        (prof && l3d_profile_find(prof, p->profile) != L3D_OK)) {
        fprintf(stderr, "llm3d plan: %s: %s\n", p->what, l3d_error_message());
        return false;
    }
    /* the published counters count the recomputed forward (Narayanan et al. 2021, eq. 3),
     * but for the model FLOPs utilisation of Korthikanti et al. 2022 */
    *pred = 100 * (p->mfu ? r->mfu : r->hfu);
    return true;
}

/* The published runs predicted without any fit: pred_out[i] of published[i] (NAN where it failed);
 * 0, or 1 after a line for each run that could not be evaluated. */
static int published_nofit(double *pred_out) {
    printf("Predictions without any fit (the profiles' measured and assumed figures only):\n\n"
           "| run | devices | layout (tp x pp x dp, micro-batch, global batch) | published %% of "
           "peak | predicted %% of peak | difference (points) | relative error | predicted "
           "memory / device | source | the figure's role |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    struct rel_err err = {0};
    for (size_t i = 0; i < N_PUBLISHED; i++) {
        const struct published *p = &published[i];
        struct l3d_plan_result r;
        if (!predicted(p, false, &r, NULL, &pred_out[i])) {
            rc = 1;
            continue;
        }
        double pred = pred_out[i];
        /* no constant of a shipped profile comes from a published run but gemm_calibration,
         * which this table leaves out */
        printf("| %s | %lld | %d x %d x %d, %d, %lld | %.2f | %.2f | %+.2f | %+.1f%% | %.1f GB%s | "
               "%s | never used to set a constant |\n", p->what, (long long)p->devices, p->tp,
               p->pp, p->dp, p->mb, (long long)p->batch, p->pct, pred, pred - p->pct,
               100 * (pred - p->pct) / p->pct, r.mem.total / 1e9,
               r.fits ? "" : " (does not fit)", p->source);
        rel_err_add(&err, pred, p->pct);
    }
    printf("\nRelative error without a fit: %.1f%% mean, %.1f%% worst over the %d runs.\n",
           rel_err_mean_pct(&err), 100 * err.worst, err.n);
    return rc;
}

/* The same with each profile's gemm_calibration (`llm3d plan --calibrated`). */
static int published_calibrated(double *pred_out) {
    printf("\nWith the optional calibration (`llm3d plan --calibrated`: each profile's "
           "gemm_calibration, one factor on its GEMM curve fitted on one run):\n\n"
           "| run | gemm_calibration | predicted %% of peak | difference (points) | relative error "
           "| the run's role |\n|---|---|---|---|---|---|\n");
    int rc = 0;
    struct rel_err held_out = {0}, fit = {0};
    for (size_t i = 0; i < N_PUBLISHED; i++) {
        const struct published *p = &published[i];
        struct l3d_plan_result r;
        struct l3d_profile prof;
        if (!predicted(p, true, &r, &prof, &pred_out[i])) {
            rc = 1;
            continue;
        }
        double pred = pred_out[i];
        printf("| %s | %.3f | %.2f | %+.2f | %+.1f%% | %s |\n", p->what, prof.gemm_calibration,
               pred, pred - p->pct, 100 * (pred - p->pct) / p->pct,
               p->fit ? "set the calibration" : "never used to set a constant");
        rel_err_add(p->fit ? &fit : &held_out, pred, p->pct);
    }
    printf("\nRelative error with the calibration, on the %d runs not used to set it: %.1f%% "
           "mean, %.1f%% worst; on the %d that set it: %.1f%% mean, %.1f%% worst.\n", held_out.n,
           rel_err_mean_pct(&held_out), 100 * held_out.worst, fit.n, rel_err_mean_pct(&fit),
           100 * fit.worst);
    return rc;
}

/* The Frontier runs' scaling efficiencies (scalings[]), without a fit and calibrated. */
static int published_scaling(void) {
    printf("\n| scaling | GCDs | global batch | published efficiency | predicted efficiency (no "
           "fit) | predicted efficiency (calibrated) | batch chosen | the figure's role |\n"
           "|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    for (size_t i = 0; i < sizeof scalings / sizeof scalings[0]; i++) {
        const struct scaling *sc = &scalings[i];
        const struct published *p = &published[sc->run];
        int64_t per_dp = (int64_t)p->tp * p->pp;
        double eff[2];
        bool ok = true;
        for (int cal = 0; cal < 2 && ok; cal++) {
            struct l3d_plan_result a, b;
            ok = eval_published(p, sc->devices, (int)(sc->devices / per_dp), sc->batch, cal,
                                &a) == L3D_OK &&
                 eval_published(p, sc->devices2, (int)(sc->devices2 / per_dp), sc->batch2, cal,
                                &b) == L3D_OK;
            /* throughput per device at the larger scale over that at the smaller */
            if (ok)
                eff[cal] = (b.tokens_per_s / (double)sc->devices2) /
                           (a.tokens_per_s / (double)sc->devices);
        }
        if (!ok) {
            fprintf(stderr, "llm3d plan: %s scaling: %s\n", p->what, l3d_error_message());
            rc = 1;
            continue;
        }
        printf("| %s, %s | %lld -> %lld | %lld -> %lld | %.2f%% | %.2f%% | %.2f%% | %s | %s |\n",
               p->what, sc->strong ? "strong" : "weak", (long long)sc->devices,
               (long long)sc->devices2, (long long)sc->batch, (long long)sc->batch2, sc->pct,
               100 * eff[0], 100 * eff[1], sc->note,
               sc->chosen ? "set the batch (chosen after the fact, this figure in view)"
                          : "never used to set a constant");
    }
    return rc;
}

/* llm3d plan --published: the three tables, and with --svg the predictions drawn. */
static int run_published(const char *svg) {
    const char *names[N_PUBLISHED];
    double pub[N_PUBLISHED], pred_nofit[N_PUBLISHED], pred_cal[N_PUBLISHED];
    for (size_t i = 0; i < N_PUBLISHED; i++) {
        names[i] = published[i].what;
        pub[i] = published[i].pct;
    }
    int rc = published_nofit(pred_nofit);
    rc |= published_calibrated(pred_cal);
    rc |= published_scaling();
    if (svg && l3d_plan_svg_published(svg, (int)N_PUBLISHED, names, pub, pred_nofit, pred_cal))
        rc = 1;
    return rc;
}

/* ---- flags ------------------------------------------------------------------------------ */

enum { P_PROFILE, P_DEVICES, P_TRAINER, P_FLASH, P_NOFLASH, P_CALIBRATED, P_TOP, P_JSON, P_PUB,
       P_SVG, P_SVG_COLOR };

static const struct l3d_flag system_flags[] = {
    {"profile", "P", P_PROFILE, "a shipped profile (frontier, dgx-a100, dgx-h100, h200), local "
                                "(written by `llm3d bench --calibrate`), or a file (local)"},
    {"devices", "N", P_DEVICES, "GPUs, or CPU cores: ranks x threads (default: tp x pp x dp x "
                                "threads when all are given, else 1)"},
    {"trainer", "T", P_TRAINER, "whose mixed precision: llm3d (fp32 gradients and master "
                                "weights: its allocation plan; default on a CPU profile) or "
                                "megatron (2-byte gradients; default on a GPU profile)"},
    {"flash", NULL, P_FLASH, "fused attention (the default)"},
    {"no-flash", NULL, P_NOFLASH, "unfused attention (fp32 --no-flash is the trainer under "
                                  "L3D_ATTENTION=naive)"},
    {"calibrated", NULL, P_CALIBRATED, "apply the profile's gemm_calibration, a factor fitted on "
                                       "a published run (off: from measured and assumed figures "
                                       "only)"},
    {NULL, NULL, 0, NULL},
};
static const struct l3d_flag output_flags[] = {
    {"top", "N", P_TOP, "layouts to list (10)"},
    {"json", NULL, P_JSON, "one JSON object per layout instead of the table"},
    {"published", NULL, P_PUB, "the published runs (Frontier, Megatron-LM on A100) beside the "
                               "prediction, as markdown (docs/frontier.md)"},
    {"svg", "FILE", P_SVG, "also draw every layout evaluated (step time against memory per "
                           "device) or, with --published, predicted against published"},
    {"svg-color", "D", P_SVG_COLOR, "--svg's colours by tp (default), pp, dp, zero or recompute"},
    {NULL, NULL, 0, NULL},
};

struct plan_opts {
    const char *profile;
    int trainer; /* -1: the profile's (llm3d on a CPU), 0: llm3d, 1: megatron */
    int devices, top, flash;
    bool json, published, calibrated;
    const char *svg;
    int svg_color; /* index into l3d_plan_svg_dims */
};

static int set_plan(void *ctx, const char *cmd, int id, const char *v) {
    struct plan_opts *o = ctx;
    switch (id) {
    case P_PROFILE: o->profile = v; return 1;
    case P_DEVICES: return l3d_arg_int(cmd, "devices", v, 1, 1 << 24, &o->devices);
    case P_TRAINER: {
        static const char *const names[] = {"llm3d", "megatron"};
        return l3d_arg_choice(cmd, "trainer", v, names, 2, &o->trainer,
                              "llm3d (this project's trainer: fp32 gradients and master weights "
                              "in mixed precision) or megatron (Megatron-LM: 2-byte gradients)");
    }
    case P_FLASH: o->flash = 1; return 1;
    case P_NOFLASH: o->flash = 0; return 1;
    case P_CALIBRATED: o->calibrated = true; return 1;
    case P_TOP: return l3d_arg_int(cmd, "top", v, 1, 1000, &o->top);
    case P_JSON: o->json = true; return 1;
    case P_PUB: o->published = true; return 1;
    case P_SVG: o->svg = v; return 1;
    case P_SVG_COLOR:
        return l3d_arg_choice(cmd, "svg-color", v, l3d_plan_svg_dims, L3D_PLAN_SVG_NDIMS,
                              &o->svg_color, "tp, pp, dp, zero or recompute");
    }
    return 0;
}

l3d_status l3d_cli_plan_model(const struct l3d_cli_spec *cs, struct l3d_model_spec *m) {
    l3d_status st = l3d_model_preset(m, cs->preset ? cs->preset : "d12");
    if (st != L3D_OK) return st;
    const struct l3d_layout *l = &cs->spec->layout;
    bool seq = l3d_cli_spec_given(cs, "seq-len");
    if (cs->L) m->L = cs->L;
    if (cs->C) m->C = cs->C;
    if (cs->NH) m->NH = cs->NH;
    if (cs->V) m->V = cs->V;
    if (cs->maxT) m->maxT = cs->maxT;
    if (cs->maxT && seq && l->seq > cs->maxT)
        return l3d_error(L3D_ERR_ARG, "--seq-len %d exceeds --context %d: raise --context or lower "
                         "--seq-len", l->seq, cs->maxT);
    if (seq) m->maxT = l->seq;
    l3d_cli_spec_arch(cs, m); /* --arch, --kv-heads, --ffn, ... as train reads them */
    if (m->ffn == 0 && m->mlp == L3D_MLP_GELU) m->ffn = 4LL * m->C;
    if (cs->L || cs->C || cs->NH || cs->V || seq || cs->maxT || cs->ffn) {
        /* explicit sizes without --model: say what the rest came from */
        char kept[160] = "";
        const struct { int given; const char *what; } part[] = {
            {cs->L, "--layers"}, {cs->C, "--channels"}, {cs->NH, "--heads"}, {cs->V, "--vocab"},
            {seq || cs->maxT, "--seq-len"}};
        const int d12[] = {m->L, m->C, m->NH, m->V, m->maxT};
        for (int i = 0; i < 5; i++)
            if (!part[i].given)
                snprintf(kept + strlen(kept), sizeof kept - strlen(kept), "%s%s %d",
                         *kept ? ", " : "", part[i].what, d12[i]);
        if (!cs->preset && *kept)
            fprintf(stderr, "llm3d plan: no --model: the sizes not given are d12's (GPT-2 124M): "
                    "%s; give them, or --model, to change them\n", kept);
        snprintf(m->name, sizeof m->name, "custom");
    }
    return l3d_plan_model_check(m);
}

/* The run: devices, batch, precision (the spec's, or the profile's default), and what the
 * layout flags fix for the search. */
static l3d_status plan_run(const struct l3d_cli_spec *cs, const struct plan_opts *o,
                           const struct l3d_profile *prof, struct l3d_plan_run *run,
                           struct l3d_plan_fixed *fx) {
    const struct l3d_layout *l = &cs->spec->layout;
    const struct l3d_precision *p = &cs->spec->precision;
    bool all = l3d_cli_spec_given(cs, "tp") && l3d_cli_spec_given(cs, "pp") &&
               l3d_cli_spec_given(cs, "dp");
    *run = l3d_plan_run_default();
    int threads = l->threads > 0 ? l->threads : 1;
    run->devices = o->devices ? o->devices
                   : all ? (int64_t)l->tp * l->cp * l->pp * l->dp * threads : 1;
    run->calibrated = o->calibrated;
    /* whose mixed precision: llm3d's on a CPU profile (no compute units: where it runs), else
     * Megatron-LM's (the GPU clusters' published runs) */
    run->llm3d = o->trainer >= 0 ? o->trainer == 0 : prof->compute_units == 0;
    /* without --precision: llm3d's trainer's own default (fp32), else the profile's 16-bit peak
     * (a CPU profile may have one: oneDNN's bf16 products, gemm_native_bf16) */
    enum l3d_dtype t = l3d_cli_spec_given(cs, "precision") ? p->param
                       : run->llm3d                               ? L3D_F32
                       : prof->peak_bf16 > 0      ? L3D_BF16
                       : prof->peak_fp16 > 0      ? L3D_F16
                                                                  : L3D_F32;
    run->precision = *p;
    run->precision.param = run->precision.act = t;
    run->precision.grad = run->llm3d ? L3D_F32 : t; /* Megatron-LM's gradients in its type */
    run->flash = o->flash >= 0 ? o->flash : true; /* the trainer's kernel, every 16-bit one's */
    l3d_status st = l3d_spec_check_parts(&(struct l3d_run_spec){.precision = run->precision},
                                         &(struct l3d_spec_ctx){.world_unknown = true},
                                         L3D_SPEC_PRECISION, NULL);
    if (st != L3D_OK) return st;
    /* what the flags fixed: a mask beside the spec's layout, which holds their values */
    static const struct { const char *flag; unsigned bit; } fixes[] = {
        {"tp", L3D_FIX_TP}, {"pp", L3D_FIX_PP}, {"dp", L3D_FIX_DP}, {"cp", L3D_FIX_CP},
        {"batch", L3D_FIX_MB}, {"pp-virtual", L3D_FIX_V}, {"zero", L3D_FIX_ZERO},
        {"recompute", L3D_FIX_RECOMPUTE}, {"ep", L3D_FIX_EP}, {"sequence-parallel", L3D_FIX_SP},
        {"no-sequence-parallel", L3D_FIX_SP}};
    *fx = l3d_plan_fixed_none();
    fx->layout = *l; /* zero3_prefetch: the trainer's default (1) when not given */
    for (size_t i = 0; i < sizeof fixes / sizeof fixes[0]; i++)
        if (l3d_cli_spec_given(cs, fixes[i].flag)) fx->mask |= fixes[i].bit;
    fx->layout.threads = threads;
    fx->layout.seq = 0; /* the model's maxT, which l3d_cli_plan_model made the sequence planned */
    /* the planner's bucket (PyTorch DDP's 25 MB) unless --bucket-mb gives the trainer's */
    if (!l3d_cli_spec_given(cs, "bucket-mb")) fx->layout.bucket_bytes = 0;
    fx->layout.global_batch = l->global_batch > 0 ? l->global_batch : 8;
    if (l3d_cli_spec_given(cs, "grad-accum")) {
        if (!(fx->mask & L3D_FIX_MB) || !(fx->mask & L3D_FIX_DP))
            return l3d_error(L3D_ERR_ARG, "--grad-accum %d: the planner takes the micro-batches "
                             "as --global-batch / (--batch x --dp); give --batch and --dp with it, "
                             "or --global-batch instead", l->accum);
        fx->layout.global_batch = (int64_t)l->micro_batch * l->accum * l->dp;
    }
    return L3D_OK;
}

static int plan_flags(int argc, char **argv, struct l3d_cli_spec *cs, struct plan_opts *o) {
    struct l3d_flag_group g[6];
    int n = l3d_cli_spec_groups(cs, g);
    g[n++] = (struct l3d_flag_group){"system and run", system_flags, set_plan, o};
    g[n++] = (struct l3d_flag_group){"output", output_flags, set_plan, o};
    int rc = l3d_flags_parse("plan", argc, argv, g, n, usage, NULL);
    if (rc >= 0) return rc;
    return l3d_cli_spec_flags_done("plan", cs);
}

/* One layout, given whole with --pp-schedule: evaluated, not searched. */
static l3d_status plan_one(const struct l3d_model_spec *m,
                           const struct l3d_profile *prof, const struct l3d_plan_run *run,
                           const struct l3d_plan_fixed *fx, struct l3d_plan_result *r) {
    const unsigned need = L3D_FIX_TP | L3D_FIX_PP | L3D_FIX_MB | L3D_FIX_ZERO | L3D_FIX_RECOMPUTE;
    if ((fx->mask & need) != need)
        return l3d_error(L3D_ERR_ARG, "--pp-schedule evaluates one layout: also give --tp, --pp, "
                         "--batch, --zero and --recompute");
    const struct l3d_layout *f = &fx->layout;
    int cp = fx->mask & L3D_FIX_CP ? f->cp : 1;
    struct l3d_layout lay = {
        .tp = f->tp, .pp = f->pp, .cp = cp,
        .dp = fx->mask & L3D_FIX_DP ? f->dp : (int)(run->devices / f->threads / f->tp / f->pp / cp),
        .ep = fx->mask & L3D_FIX_EP ? f->ep : 1,
        .micro_batch = f->micro_batch, .v = fx->mask & L3D_FIX_V ? f->v : 1, .zero = f->zero,
        .zero3_prefetch = f->zero3_prefetch, .recompute = f->recompute,
        .xent_chunk = f->xent_chunk, .sp = fx->mask & L3D_FIX_SP ? f->sp : false, .schedule = f->schedule,
        .threads = f->threads, .seq = f->seq, .global_batch = f->global_batch,
        .bucket_bytes = f->bucket_bytes};
    return l3d_plan_evaluate(m, prof, run, &lay, r);
}

static void print_header(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                         const struct l3d_plan_run *run, int64_t global_batch, enum l3d_dtype reduce,
                         const struct l3d_plan_search_stats *stats) {
    double sc;
    const char *u = mem_unit(prof, &sc);
    char kv[48] = "";
    if (l3d_model_kv_heads(m) != m->NH) snprintf(kv, sizeof kv, " kv-heads=%d", m->NKV);
    if (m->head_dim > 0) /* set apart from h / heads (Qwen3) */
        snprintf(kv + strlen(kv), sizeof kv - strlen(kv), " head-dim=%d", m->head_dim);
    printf("model %s: %s blocks, L=%d h=%d heads=%d%s ffn=%lld V=%d s=%d, %.3g parameters; "
           "profile %s (%s), %lld devices, global batch %lld, %s%s\n", m->name,
           l3d_arch_info(m->arch)->title, m->L, m->C, m->NH, kv,
           (long long)m->ffn, m->V, m->maxT, (double)l3d_plan_model_params(m), prof->name,
           prof->device, (long long)run->devices, (long long)global_batch,
           l3d_precision_name(&run->precision), run->flash ? ", fused attention" : "");
    if (m->moe.experts > 0) { /* the model FLOPs and MFU count the active parameters */
        struct l3d_model_spec c = l3d_plan_model_gpt(m);
        printf("mixture of experts: %d experts of width %lld, top-%d, %d shared, layers %d-%d; "
               "%.3g parameters active a token (model FLOPs and MFU count those)\n",
               m->moe.experts, (long long)c.moe.ffn, m->moe.top_k, m->moe.shared,
               m->moe.dense_layers, m->L - 1, l3d_model_active_param_count(&c));
    }
    if (run->precision.reduce != L3D_F32)
        printf("data-parallel gradient sums in %s (2 bytes an element; 16-bit staging)\n",
               l3d_dtype_name(reduce));
    if (run->precision.tp_reduce_fp32 && run->precision.param != L3D_F32)
        printf("tensor-parallel partial sums in fp32 (--tp-reduce-dtype fp32: twice the bytes; "
               "their fp32 buffers in the activations)\n");
    if (run->llm3d && run->precision.param != L3D_F32) {
        struct l3d_profile p16;
        const char *t = l3d_precision_name(&run->precision);
        enum l3d_dtype k = run->precision.param == L3D_BF16 ? L3D_BF16 : L3D_F16;
        if (l3d_profile_mixed(prof, k, &p16))
            printf("llm3d's %s kernels timed at the profile's %s figures (gemm_eff_%s: %d "
                   "points, gemm_eff_wgrad_%s: %d, attn_eff_%s %.3g, kernel_bw_eff_%s %.3g)\n", t,
                   t, t, p16.n_eff, t, p16.wgrad.n, t, p16.attn_eff, t, p16.kernel_bw_eff);
        else
            printf("this profile has no gemm_eff_%s: llm3d's %s kernels timed at the fp32 figures "
                   "(llm3d bench --calibrate measures them)\n", t, t);
    }
    if (run->calibrated)
        printf("calibrated: the GEMM curve times %g, a factor fitted on a published run "
               "(profile key gemm_calibration; docs/frontier.md)%s\n", prof->gemm_calibration,
               prof->gemm_calibration > 0 ? "" : " -- this profile has none, so none applied");
    printf("searched %lld layouts in %.3f s: %lld valid, %lld fit in %.1f %s (%.1f %s kept by "
           "the runtime)\n", (long long)stats->evaluated, stats->seconds,
           (long long)stats->valid, (long long)stats->fit, prof->mem_bytes / sc, u,
           prof->reserve_bytes / sc, u);
}

/* ", first stage 7 layers, last stage 7 layers" for uneven end stages, else "" (static). */
static const char *ends_words(const struct l3d_layout *l) {
    static char buf[96];
    buf[0] = '\0';
    if (l->pp_first || l->pp_last)
        snprintf(buf, sizeof buf, ", end stages of %d and %d layers (the others even)",
                 l->pp_first, l->pp_last);
    return buf;
}

static void print_best(const struct l3d_profile *prof, const struct l3d_plan_result *res, int n) {
    double sc;
    const char *u = mem_unit(prof, &sc);
    print_table(prof, res, n);
    const struct l3d_plan_result *b = &res[0];
    char sched[64] = ""; /* the schedule when the search chose it (--pp-schedule for train) */
    if (b->layout.pp > 1)
        snprintf(sched, sizeof sched, ", --pp-schedule %s (bubble %.1f%% of the pipeline)",
                 l3d_pp_kind_name(b->layout.schedule), 100 * b->time.bubble_frac);
    char ep[48] = ""; /* the experts' split, for a mixture of experts */
    if (b->layout.ep > 1)
        snprintf(ep, sizeof ep, ", ep %d (all-to-all %.3g s)", b->layout.ep, b->time.ep_comm);
    printf("\nbest: tp %d, cp %d, pp %d, dp %d%s, micro-batch %d, %d micro-batches, v %d%s, ZeRO-%d, "
           "%s%s%s%s%s: %.4g s a step, %.4g tokens/s, MFU %.1f%% (model FLOPs, Narayanan eq. 3), "
           "HFU %.1f%% (recomputation counted), %.2f %s on the fullest device (stage %d)\n",
           b->layout.tp, b->layout.cp > 1 ? b->layout.cp : 1, b->layout.pp, b->layout.dp, ep,
           b->layout.micro_batch, b->m, b->layout.v, sched, b->layout.zero,
           b->layout.recompute == L3D_RECOMPUTE_NONE ? "no" : rc_name(b->layout.recompute),
           " recomputation", b->layout.sp ? ", sequence parallel" : "",
           b->layout.cp > 1 ? ", context parallel (each sequence over the --cp ring)" : "",
           ends_words(&b->layout), b->time.step, b->tokens_per_s, 100 * b->mfu, 100 * b->hfu, b->mem.total / sc, u,
           b->mem.stage);
    /* why: against the best layout of another shape (tp, pp, dp, micro-batch, v), so that the
     * answer is not a variant of the same layout */
    const struct l3d_plan_result *other = NULL;
    for (int i = 1; i < n && !other; i++) {
        const struct l3d_layout *x = &res[i].layout, *y = &b->layout;
        if (x->tp != y->tp || x->pp != y->pp || x->dp != y->dp || x->ep != y->ep ||
            x->micro_batch != y->micro_batch || x->v != y->v)
            other = &res[i];
    }
    if (!other && n > 1) other = &res[1];
    if (other) {
        char why[512];
        l3d_plan_explain(b, other, why, sizeof why);
        printf("why: %s\n", why);
    }
}

/* The failure of a plan as the exit status, said on stderr (and as JSON with --json). */
static int plan_fail(l3d_status st, const char *why, bool json) {
    fprintf(stderr, "llm3d plan: %s\n", why);
    if (json) print_json_error(why);
    return st == L3D_ERR_ARG ? 2 : 1;
}

/* The results: the table and the best, or the JSON objects. 0, or 1 when nothing fits. */
static int plan_print(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                      const struct l3d_plan_run *run, int64_t global_batch,
                      const struct l3d_plan_result *res, int n, bool one, bool json,
                      enum l3d_dtype reduce,
                      const struct l3d_plan_search_stats *stats) {
    double sc;
    const char *u = mem_unit(prof, &sc);
    if (one && n == 1 && !res[0].fits) {
        /* one layout, given whole: it is not a "best" when it does not fit */
        char why[512];
        snprintf(why, sizeof why, "the layout does not fit: %.2f %s on the fullest device (stage "
                 "%d) and a runtime reserve of %.2f %s, but the device has %.2f %s; add devices, "
                 "lower --batch, or give --recompute full or --zero 1/2",
                 res[0].mem.total / sc, u, res[0].mem.stage, prof->reserve_bytes / sc, u,
                 prof->mem_bytes * res[0].layout.threads / sc, u);
        return plan_fail(L3D_ERR_LAYOUT, why, json);
    }
    if (json) {
        for (int i = 0; i < n; i++) print_json(m, prof, run, &res[i]);
        if (n == 0)
            print_json_error("no layout fits in memory: add devices, lower the micro-batch or "
                             "sequence, or recompute activations");
        return n > 0 ? 0 : 1;
    }
    print_header(m, prof, run, global_batch, reduce, stats);
    if (n == 0) {
        printf("no layout fits in memory: add devices, lower the micro-batch or sequence, or "
               "recompute activations\n");
        return 1;
    }
    print_best(prof, res, n);
    return 0;
}

int l3d_cli_plan(int argc, char **argv) {
    struct l3d_run_spec spec;
    l3d_run_spec_defaults(&spec);
    struct l3d_cli_spec cs;
    l3d_cli_spec_init(&cs, &spec);
    struct plan_opts o = {.profile = "local", .top = 10, .flash = -1, .trainer = -1};
    int rc = plan_flags(argc, argv, &cs, &o);
    if (rc >= 0) return rc;
    if (o.published) return run_published(o.svg);
    struct l3d_model_spec m;
    struct l3d_profile prof;
    struct l3d_plan_run run;
    struct l3d_plan_fixed fx;
    l3d_status st = l3d_cli_plan_model(&cs, &m);
    if (st == L3D_OK) st = l3d_profile_find(&prof, o.profile);
    if (st == L3D_OK) st = plan_run(&cs, &o, &prof, &run, &fx);
    if (st != L3D_OK) return plan_fail(st, l3d_error_message(), o.json);
    int n = 0;
    struct l3d_plan_result *res = calloc((size_t)o.top, sizeof *res);
    struct l3d_plan_search_stats stats = {0};
    struct l3d_plan_svg all = {0};
    bool one = l3d_cli_spec_given(&cs, "pp-schedule");
    if (one) {
        st = plan_one(&m, &prof, &run, &fx, &res[0]);
        n = st == L3D_OK ? 1 : 0;
        stats.evaluated = stats.valid = 1;
        stats.fit = n && res[0].fits;
    } else {
        st = l3d_plan_search_each(&m, &prof, &run, &fx, res, o.top, &n, &stats,
                                  o.svg ? l3d_plan_svg_keep : NULL, &all);
    }
    rc = st != L3D_OK ? plan_fail(st, l3d_error_message(), o.json)
                      : plan_print(&m, &prof, &run, fx.layout.global_batch, res, n, one, o.json,
                                   spec.precision.reduce,
                                   &stats);
    if (o.svg && st == L3D_OK) {
        char title[200];
        snprintf(title, sizeof title, "%s on %lld devices (%s): %lld layouts", m.name,
                 (long long)run.devices, prof.name, (long long)all.n);
        if (one) l3d_plan_svg_keep(&all, &res[0]);
        int r2 = l3d_plan_svg_write(o.svg, &all, n > 0 && res[0].fits ? &res[0] : NULL, &prof,
                                    o.svg_color, title);
        rc = rc ? rc : r2;
    }
    free(all.r);
    free(res);
    return rc;
}
