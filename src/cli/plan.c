/* llm3d plan: predicted memory and step time of layouts, the best ones first (include/llm3d/plan.h). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/plan.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d plan [flags]\n"
        "\n"
        "Predicts memory per device and time per step of training layouts on a system and prints\n"
        "the fastest that fit. Fix any part of the layout with its flag; the rest is searched.\n"
        "\n"
        "model:\n"
        "  --model NAME        %s (d12)\n"
        "  --layers L --hidden H --heads A --vocab V --seq-len S --ffn F   explicit sizes\n"
        "                      (override the preset; the MLP width F is 4H unless given)\n"
        "system and run:\n"
        "  --profile P         a shipped profile (frontier, dgx-a100, dgx-h100, h200), local\n"
        "                      (written by `llm3d bench --calibrate`), or a file (local)\n"
        "  --devices N         GPUs, or CPU cores: ranks x threads (the profile's node)\n"
        "  --threads K         CPU: OpenMP threads per rank (1)\n"
        "  --global-batch G    sequences per step (8)\n"
        "  --precision P       fp32 (llm3d's trainer: its own memory plan), bf16 or fp16 (mixed\n"
        "                      precision, Megatron-LM style); default fp32 for llm3d's trainer\n"
        "                      and on a profile without 16-bit peak, else bf16 (fp16 if the\n"
        "                      profile has no bf16)\n"
        "  --trainer T         whose mixed precision: llm3d (fp32 gradients and master weights:\n"
        "                      its allocation plan; default on a CPU profile) or megatron\n"
        "                      (2-byte gradients; default on a GPU profile)\n"
        "  --grad-reduce-dtype T  llm3d's trainer: fp32 (default), bf16 or fp16 DP gradient\n"
        "                      sums (2 bytes an element on the wire, 16-bit staging buffers)\n"
        "  --flash / --no-flash  fused attention (default: on; fp32 --no-flash is the trainer\n"
        "                      under L3D_ATTENTION=naive)\n"
        "layout (fixed when given):\n"
        "  --tp N --pp N --dp N --micro-batch B --pp-virtual V --zero 0|1|2\n"
        "  --recompute none|selective|full --sequence-parallel yes|no\n"
        "  --pp-schedule 1f1b|gpipe|interleaved   (with every other part fixed)\n"
        "  --calibrated        apply the profile's gemm_calibration, a factor fitted on a\n"
        "                      published run (off: from measured and assumed figures only)\n"
        "output:\n"
        "  --top N             layouts to list (10)\n"
        "  --json              one JSON object per layout instead of the table\n"
        "  --published         the published runs (Frontier, Megatron-LM on A100) beside the\n"
        "                      prediction, as markdown (docs/frontier.md)\n",
        l3d_plan_model_names());
}

static const char *rc_name(enum l3d_recompute r) {
    return r == L3D_RECOMPUTE_FULL ? "full" : r == L3D_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

static int parse_rc(const char *v, int *out) {
    if (strcmp(v, "none") == 0) *out = L3D_RECOMPUTE_NONE;
    else if (strcmp(v, "selective") == 0) *out = L3D_RECOMPUTE_SELECTIVE;
    else if (strcmp(v, "full") == 0) *out = L3D_RECOMPUTE_FULL;
    else {
        fprintf(stderr, "llm3d plan: --recompute '%s': choose none, selective or full\n", v);
        return 0;
    }
    return 1;
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

static void print_json(const struct l3d_plan_model *m, const struct l3d_profile *prof,
                       const struct l3d_plan_run *run, const struct l3d_plan_result *r) {
    const struct l3d_plan_layout *l = &r->layout;
    const struct l3d_plan_time *t = &r->time;
    const struct l3d_plan_mem *mm = &r->mem;
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
           "\"mfu\":%.5f,\"hfu\":%.5f,\"mem_reserve\":%.0f}\n",
           (long long)run->devices, (long long)run->global_batch,
           l3d_prec_name(run->precision), l->tp, l->pp, l->dp, l->mb, l->v, l->zero,
           rc_name(l->recompute), l->sp ? "true" : "false", l3d_pp_kind_name(l->schedule),
           l->threads, r->m, mm->params, mm->grads, mm->optimizer, mm->activations, mm->other,
           mm->total, mm->stage, r->fits ? "true" : "false", t->gemm, t->attention,
           t->elementwise, t->recompute, t->tp_comm, t->pp_p2p, t->bubble, t->dp_comm,
           t->embed_sync, t->optimizer, t->step, r->tokens_per_s, r->mfu, r->hfu,
           prof->reserve_bytes);
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
    printf("  # tp  pp   dp  mb  v Z recompute SP     m | memory %s: params grads optim  acts other "
           " total | step s: compute recomp     TP    p2p bubble     DP  optim   step | tok/s  MFU  "
           "HFU\n", u);
    for (int i = 0; i < n; i++) {
        const struct l3d_plan_layout *l = &r[i].layout;
        const struct l3d_plan_time *t = &r[i].time;
        const struct l3d_plan_mem *m = &r[i].mem;
        double compute = t->gemm + t->attention + t->elementwise;
        printf("%3d %2d %3d %4d %3d %2d %d %-9s %-2s %5d | %14.2f %5.2f %5.2f %5.2f %5.2f %6.2f "
               "| %15.4g %6.3g %6.3g %6.3g %6.3g %6.3g %6.3g %6.4g | %5.3g %4.1f%% %4.1f%%\n",
               i + 1, l->tp, l->pp, l->dp, l->mb, l->v, l->zero, rc_name(l->recompute),
               l->sp ? "y" : "n", r[i].m, m->params / sc, m->grads / sc, m->optimizer / sc,
               m->activations / sc, m->other / sc, m->total / sc, compute, t->recompute,
               t->tp_comm, t->pp_p2p, t->bubble, t->dp_comm + t->embed_sync, t->optimizer,
               t->step, r[i].tokens_per_s, 100 * r[i].mfu, 100 * r[i].hfu);
    }
}

/* ---- published runs --------------------------------------------------------------------- */

static const struct published {
    const char *what, *model, *profile;
    int64_t devices, batch;
    enum l3d_prec prec;
    bool flash;
    int tp, pp, dp, mb, v, zero;
    enum l3d_recompute rc;
    double pct;      /* published % of the peak, the run's own FLOP counter */
    const char *source;
    bool fit;        /* the run the profile's gemm_calibration was fitted on */
    bool sp;         /* sequence parallelism */
    bool mfu;        /* the published figure counts model FLOPs only (no recomputation) */
} published[] = {
    {"Frontier 22B", "frontier-22b", "frontier", 16, 640, L3D_PREC_FP16, true, 1, 8, 2, 1, 1, 0,
     L3D_RECOMPUTE_FULL, 38.38, "Dash et al. 2023, abstract", true, false, false},
    {"Frontier 175B", "frontier-175b", "frontier", 128, 640, L3D_PREC_FP16, true, 4, 16, 2, 1, 1, 1,
     L3D_RECOMPUTE_FULL, 36.14, "Dash et al. 2023, abstract", false, false, false},
    {"Frontier 1T", "frontier-1t", "frontier", 1024, 1024, L3D_PREC_FP16, true, 4, 128, 2, 1, 1,
     1, L3D_RECOMPUTE_FULL, 31.96, "Dash et al. 2023, abstract", false, false, false},
    {"Megatron 1.7B", "megatron-1.7b", "dgx-a100", 32, 512, L3D_PREC_FP16, false, 1, 1, 32, 16,
     1, 0, L3D_RECOMPUTE_FULL, 44, "Narayanan et al. 2021, Table 1", false, false, false},
    {"Megatron 145.6B", "megatron-145b", "dgx-a100", 1536, 2304, L3D_PREC_FP16, false, 8, 8, 24,
     1, 1, 0, L3D_RECOMPUTE_FULL, 47, "Narayanan et al. 2021, Table 1", false, false, false},
    {"Megatron 529.6B", "megatron-530b", "dgx-a100", 2520, 2520, L3D_PREC_FP16, false, 8, 35, 9,
     1, 1, 0, L3D_RECOMPUTE_FULL, 52, "Narayanan et al. 2021, Table 1", false, false, false},
    {"Megatron 1T", "megatron-1t", "dgx-a100", 3072, 3072, L3D_PREC_FP16, false, 8, 64, 6, 1, 1,
     0, L3D_RECOMPUTE_FULL, 52, "Narayanan et al. 2021, Table 1", true, false, false},
    /* Korthikanti et al. 2022, abstract: the 530B model on 2240 A100s, model FLOPs utilisation
     * with full recomputation and with selective recomputation and sequence parallelism. Not in
     * the abstract, assumed: tp 8 x pp 35 (Narayanan et al.'s 530B layout) x dp 8, micro-batch
     * 1, global batch 2240 */
    {"Megatron 2022 530B, full", "megatron-530b", "dgx-a100", 2240, 2240, L3D_PREC_FP16, false,
     8, 35, 8, 1, 1, 0, L3D_RECOMPUTE_FULL, 42.1, "Korthikanti et al. 2022, abstract (MFU)",
     false, false, true},
    {"Megatron 2022 530B, selective + SP", "megatron-530b", "dgx-a100", 2240, 2240,
     L3D_PREC_FP16, false, 8, 35, 8, 1, 1, 0, L3D_RECOMPUTE_SELECTIVE, 54.2,
     "Korthikanti et al. 2022, abstract (MFU)", false, true, true},
};

static l3d_status eval_published(const struct published *p, int64_t devices, int dp,
                                 int64_t batch, bool calibrated, struct l3d_plan_result *r) {
    struct l3d_plan_model m;
    struct l3d_profile prof;
    struct l3d_plan_run run = l3d_plan_run_default();
    run.devices = devices;
    run.global_batch = batch;
    run.precision = p->prec;
    run.flash = p->flash;
    run.calibrated = calibrated;
    struct l3d_plan_layout lay = {.tp = p->tp, .pp = p->pp, .dp = dp, .mb = p->mb, .v = p->v,
                                  .zero = p->zero, .recompute = p->rc, .sp = p->sp,
                                  .schedule = p->v > 1 ? L3D_PP_INTERLEAVED : L3D_PP_1F1B,
                                  .threads = 1};
    l3d_status st = l3d_plan_model_preset(&m, p->model);
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

static int run_published(void) {
    printf("Predictions without any fit (the profiles' measured and assumed figures only):\n\n"
           "| run | devices | layout (tp x pp x dp, micro-batch, global batch) | published %% of "
           "peak | predicted %% of peak | difference (points) | relative error | predicted "
           "memory / device | source | the figure's role |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    double sum = 0, worst = 0, sum_c = 0, worst_c = 0, sum_f = 0, worst_f = 0;
    int n = 0, n_c = 0, n_f = 0;
    for (size_t i = 0; i < sizeof published / sizeof published[0]; i++) {
        const struct published *p = &published[i];
        struct l3d_plan_result r;
        if (eval_published(p, p->devices, p->dp, p->batch, false, &r) != L3D_OK) {
            fprintf(stderr, "llm3d plan: %s: %s\n", p->what, l3d_error_message());
            rc = 1;
            continue;
        }
        /* the published counters count the recomputed forward (Narayanan et al. 2021, eq. 3),
         * but for the model FLOPs utilisation of Korthikanti et al. 2022 */
        double pred = 100 * (p->mfu ? r.mfu : r.hfu);
        /* no constant of a shipped profile comes from a published run but gemm_calibration,
         * which this table leaves out */
        printf("| %s | %lld | %d x %d x %d, %d, %lld | %.2f | %.2f | %+.2f | %+.1f%% | %.1f GB%s | "
               "%s | never used to set a constant |\n", p->what, (long long)p->devices, p->tp,
               p->pp, p->dp, p->mb, (long long)p->batch, p->pct, pred, pred - p->pct,
               100 * (pred - p->pct) / p->pct, r.mem.total / 1e9,
               r.fits ? "" : " (does not fit)", p->source);
        double e = fabs(pred - p->pct) / p->pct;
        sum += e;
        worst = e > worst ? e : worst;
        n++;
    }
    printf("\nRelative error without a fit: %.1f%% mean, %.1f%% worst over the %d runs.\n",
           100 * sum / (n ? n : 1), 100 * worst, n);
    printf("\nWith the optional calibration (`llm3d plan --calibrated`: each profile's "
           "gemm_calibration, one factor on its GEMM curve fitted on one run):\n\n"
           "| run | gemm_calibration | predicted %% of peak | difference (points) | relative error "
           "| the run's role |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof published / sizeof published[0]; i++) {
        const struct published *p = &published[i];
        struct l3d_plan_result r;
        struct l3d_profile prof;
        if (eval_published(p, p->devices, p->dp, p->batch, true, &r) != L3D_OK ||
            l3d_profile_find(&prof, p->profile) != L3D_OK) {
            fprintf(stderr, "llm3d plan: %s: %s\n", p->what, l3d_error_message());
            rc = 1;
            continue;
        }
        double pred = 100 * (p->mfu ? r.mfu : r.hfu);
        printf("| %s | %.3f | %.2f | %+.2f | %+.1f%% | %s |\n", p->what, prof.gemm_calibration,
               pred, pred - p->pct, 100 * (pred - p->pct) / p->pct,
               p->fit ? "set the calibration" : "never used to set a constant");
        double e = fabs(pred - p->pct) / p->pct;
        if (!p->fit) {
            sum_c += e;
            worst_c = e > worst_c ? e : worst_c;
            n_c++;
        } else {
            sum_f += e;
            worst_f = e > worst_f ? e : worst_f;
            n_f++;
        }
    }
    printf("\nRelative error with the calibration, on the %d runs not used to set it: %.1f%% "
           "mean, %.1f%% worst; on the %d that set it: %.1f%% mean, %.1f%% worst.\n", n_c,
           100 * sum_c / (n_c ? n_c : 1), 100 * worst_c, n_f, 100 * sum_f / (n_f ? n_f : 1),
           100 * worst_f);
    printf("\n| scaling | GCDs | global batch | published efficiency | predicted efficiency (no "
           "fit) | predicted efficiency (calibrated) | batch chosen | the figure's role |\n"
           "|---|---|---|---|---|---|---|---|\n");
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

int l3d_cli_plan(int argc, char **argv) {
    enum { O_FFN = 250, O_LAYERS = 256, O_HIDDEN, O_HEADS, O_VOCAB, O_SEQ, O_PROFILE, O_DEVICES, O_THREADS,
           O_GLOBAL, O_PREC, O_FLASH, O_NOFLASH, O_TP, O_PP, O_DP, O_MB, O_V, O_ZERO, O_RC, O_SP,
           O_SCHED, O_TOP, O_JSON, O_PUB, O_CAL, O_TRAINER, O_GRAD_REDUCE };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'}, {"layers", required_argument, NULL, O_LAYERS},
        {"hidden", required_argument, NULL, O_HIDDEN}, {"heads", required_argument, NULL, O_HEADS},
        {"vocab", required_argument, NULL, O_VOCAB}, {"seq-len", required_argument, NULL, O_SEQ},
        {"ffn", required_argument, NULL, O_FFN},
        {"profile", required_argument, NULL, O_PROFILE},
        {"devices", required_argument, NULL, O_DEVICES},
        {"threads", required_argument, NULL, O_THREADS},
        {"global-batch", required_argument, NULL, O_GLOBAL},
        {"precision", required_argument, NULL, O_PREC}, {"flash", no_argument, NULL, O_FLASH},
        {"trainer", required_argument, NULL, O_TRAINER},
        {"grad-reduce-dtype", required_argument, NULL, O_GRAD_REDUCE},
        {"no-flash", no_argument, NULL, O_NOFLASH}, {"tp", required_argument, NULL, O_TP},
        {"pp", required_argument, NULL, O_PP}, {"dp", required_argument, NULL, O_DP},
        {"micro-batch", required_argument, NULL, O_MB},
        {"pp-virtual", required_argument, NULL, O_V}, {"zero", required_argument, NULL, O_ZERO},
        {"recompute", required_argument, NULL, O_RC},
        {"sequence-parallel", required_argument, NULL, O_SP},
        {"pp-schedule", required_argument, NULL, O_SCHED}, {"top", required_argument, NULL, O_TOP},
        {"json", no_argument, NULL, O_JSON}, {"published", no_argument, NULL, O_PUB},
        {"calibrated", no_argument, NULL, O_CAL},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    const char *model = "d12", *profile = "local", *prec = NULL, *sched = NULL, *trainer_name = NULL;
    const char *grad_reduce = NULL; /* --grad-reduce-dtype */
    int L = 0, H = 0, A = 0, V = 0, S = 0, F = 0, devices = 1, threads = 1, global = 8, top = 10;
    int flash = -1, json = 0, pub = 0, rc_fixed = -1, model_given = 0, calibrated = 0;
    struct l3d_plan_fixed fx = l3d_plan_fixed_none();
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        int ok = 1;
        switch (c) {
        case 'm': model = optarg; model_given = 1; break;
        case O_LAYERS: ok = l3d_arg_int("plan", "layers", optarg, 1, 65536, &L); break;
        case O_HIDDEN: ok = l3d_arg_int("plan", "hidden", optarg, 1, 1 << 20, &H); break;
        case O_HEADS: ok = l3d_arg_int("plan", "heads", optarg, 1, 1 << 16, &A); break;
        case O_VOCAB: ok = l3d_arg_int("plan", "vocab", optarg, 1, 1 << 30, &V); break;
        case O_SEQ: ok = l3d_arg_int("plan", "seq-len", optarg, 1, 1 << 22, &S); break;
        case O_FFN: ok = l3d_arg_int("plan", "ffn", optarg, 1, 1 << 24, &F); break;
        case O_PROFILE: profile = optarg; break;
        case O_DEVICES: ok = l3d_arg_int("plan", "devices", optarg, 1, 1 << 24, &devices); break;
        case O_THREADS: ok = l3d_arg_int("plan", "threads", optarg, 1, 4096, &threads); break;
        case O_GLOBAL: ok = l3d_arg_int("plan", "global-batch", optarg, 1, 1 << 26, &global); break;
        case O_PREC: prec = optarg; break;
        case O_TRAINER:
            if (strcmp(optarg, "llm3d") == 0 || strcmp(optarg, "megatron") == 0) {
                trainer_name = optarg;
            } else {
                fprintf(stderr, "llm3d plan: --trainer '%s': choose llm3d (this project's "
                        "trainer: fp32 gradients and master weights in mixed precision) or "
                        "megatron (Megatron-LM: 2-byte gradients)\n", optarg);
                ok = 0;
            }
            break;
        case O_GRAD_REDUCE:
            if (strcmp(optarg, "fp32") == 0 || strcmp(optarg, "bf16") == 0 ||
                strcmp(optarg, "fp16") == 0) {
                grad_reduce = optarg;
            } else {
                fprintf(stderr, "llm3d plan: --grad-reduce-dtype '%s': choose fp32, bf16 or "
                        "fp16\n", optarg);
                ok = 0;
            }
            break;
        case O_FLASH: flash = 1; break;
        case O_NOFLASH: flash = 0; break;
        case O_TP: ok = l3d_arg_int("plan", "tp", optarg, 1, 1 << 20, &fx.tp); break;
        case O_PP: ok = l3d_arg_int("plan", "pp", optarg, 1, 1 << 16, &fx.pp); break;
        case O_DP: ok = l3d_arg_int("plan", "dp", optarg, 1, 1 << 24, &fx.dp); break;
        case O_MB: ok = l3d_arg_int("plan", "micro-batch", optarg, 1, 1 << 20, &fx.mb); break;
        case O_V: ok = l3d_arg_int("plan", "pp-virtual", optarg, 1, 4096, &fx.v); break;
        case O_ZERO: ok = l3d_arg_int("plan", "zero", optarg, 0, 2, &fx.zero); break;
        case O_RC: ok = parse_rc(optarg, &rc_fixed); fx.recompute = rc_fixed; break;
        case O_SP:
            if (strcmp(optarg, "yes") == 0) fx.sp = 1;
            else if (strcmp(optarg, "no") == 0) fx.sp = 0;
            else {
                fprintf(stderr, "llm3d plan: --sequence-parallel '%s': give yes or no\n", optarg);
                ok = 0;
            }
            break;
        case O_SCHED: sched = optarg; break;
        case O_TOP: ok = l3d_arg_int("plan", "top", optarg, 1, 1000, &top); break;
        case O_JSON: json = 1; break;
        case O_PUB: pub = 1; break;
        case O_CAL: calibrated = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "llm3d plan: unknown or incomplete flag '%s' (llm3d plan --help)\n",
                    argv[optind - 1]);
            return 2;
        }
        if (!ok) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "llm3d plan: unexpected argument '%s' (llm3d plan --help)\n", argv[optind]);
        return 2;
    }
    if (pub) return run_published();

    struct l3d_plan_model m;
    struct l3d_profile prof;
    l3d_status st = l3d_plan_model_preset(&m, model);
    if (st == L3D_OK) {
        if (L) m.L = L;
        if (H) m.h = H;
        if (A) m.heads = A;
        if (V) m.V = V;
        if (S) m.s = S;
        m.ffn = F ? F : 4LL * m.h;
        if (L || H || A || V || S || F) {
            /* explicit sizes without --model: say what the rest came from */
            char kept[160] = "";
            const struct { int given; const char *what; } part[] = {
                {L, "--layers"}, {H, "--hidden"}, {A, "--heads"}, {V, "--vocab"}, {S, "--seq-len"}};
            const int d12[] = {m.L, m.h, m.heads, m.V, m.s};
            for (int i = 0; i < 5; i++)
                if (!part[i].given)
                    snprintf(kept + strlen(kept), sizeof kept - strlen(kept), "%s%s %d",
                             *kept ? ", " : "", part[i].what, d12[i]);
            if (!model_given && *kept)
                fprintf(stderr, "llm3d plan: no --model: the sizes not given are d12's (GPT-2 "
                        "124M): %s; give them, or --model, to change them\n", kept);
            snprintf(m.name, sizeof m.name, "custom");
        }
        st = l3d_plan_model_check(&m);
    }
    if (st == L3D_OK) st = l3d_profile_find(&prof, profile);
    struct l3d_plan_run run = l3d_plan_run_default();
    run.devices = devices;
    run.global_batch = global;
    run.threads = threads;
    run.calibrated = calibrated;
    /* whose mixed precision: llm3d's on a CPU profile (no compute units: where it runs), else
     * Megatron-LM's (the GPU clusters' published runs) */
    run.llm3d_mixed = trainer_name ? strcmp(trainer_name, "llm3d") == 0 : prof.compute_units == 0;
    if (st == L3D_OK) {
        /* without --precision: llm3d's trainer's own default (fp32), else the profile's 16-bit
         * peak (a CPU profile may have one: oneDNN's bf16 products, gemm_native_bf16) */
        if (prec) st = l3d_prec_parse(prec, &run.precision);
        else run.precision = run.llm3d_mixed                      ? L3D_PREC_FP32
                             : prof.peak_flops[L3D_PREC_BF16] > 0 ? L3D_PREC_BF16
                             : prof.peak_flops[L3D_PREC_FP16] > 0 ? L3D_PREC_FP16
                                                                  : L3D_PREC_FP32;
    }
    run.flash = flash >= 0 ? flash : true; /* the trainer's kernel, and every 16-bit trainer's */
    run.grad_reduce_16 = grad_reduce && strcmp(grad_reduce, "fp32") != 0;
    if (st == L3D_OK && grad_reduce && !run.llm3d_mixed && run.precision != L3D_PREC_FP32)
        st = l3d_error(L3D_ERR_ARG, "--grad-reduce-dtype %s: for llm3d's trainer (--trainer "
                       "llm3d); Megatron-LM's %s gradients are reduced in %s already",
                       grad_reduce, l3d_prec_name(run.precision), l3d_prec_name(run.precision));
    if (st == L3D_OK && grad_reduce && strcmp(grad_reduce, "fp16") == 0 &&
        run.precision != L3D_PREC_FP16)
        st = l3d_error(L3D_ERR_ARG, "--grad-reduce-dtype fp16: only with --precision fp16 (its "
                       "loss scaling keeps small gradients from underflowing), as the trainer");
    if (st != L3D_OK) {
        fprintf(stderr, "llm3d plan: %s\n", l3d_error_message());
        if (json) print_json_error(l3d_error_message());
        return st == L3D_ERR_ARG ? 2 : 1;
    }
    int n = 0;
    struct l3d_plan_result *res = calloc((size_t)top, sizeof *res);
    struct l3d_plan_search_stats stats = {0};
    if (sched) {
        /* a schedule other than the search's own: every part of the layout must be given */
        enum l3d_pp_kind kind;
        st = l3d_pp_kind_parse(sched, &kind);
        if (st == L3D_OK && (!fx.tp || !fx.pp || !fx.mb || fx.zero < 0 || fx.recompute < 0))
            st = l3d_error(L3D_ERR_ARG, "--pp-schedule evaluates one layout: also give --tp, --pp, "
                           "--micro-batch, --zero and --recompute");
        if (st == L3D_OK) {
            struct l3d_plan_layout lay = {
                .tp = fx.tp, .pp = fx.pp, .dp = fx.dp ? fx.dp
                                                      : (int)(devices / threads / fx.tp / fx.pp),
                .mb = fx.mb, .v = fx.v ? fx.v : 1, .zero = fx.zero,
                .recompute = (enum l3d_recompute)fx.recompute, .sp = fx.sp > 0, .schedule = kind,
                .threads = threads};
            st = l3d_plan_evaluate(&m, &prof, &run, &lay, &res[0]);
            n = st == L3D_OK ? 1 : 0;
            stats.evaluated = stats.valid = 1;
            stats.fit = n && res[0].fits;
        }
    } else {
        st = l3d_plan_search(&m, &prof, &run, &fx, res, top, &n, &stats);
    }
    if (st != L3D_OK) {
        fprintf(stderr, "llm3d plan: %s\n", l3d_error_message());
        if (json) print_json_error(l3d_error_message());
        free(res);
        return st == L3D_ERR_ARG ? 2 : 1;
    }
    double sc;
    const char *u = mem_unit(&prof, &sc);
    if (sched && n == 1 && !res[0].fits) {
        /* one layout, given whole: it is not a "best" when it does not fit */
        char why[512];
        snprintf(why, sizeof why, "the layout does not fit: %.2f %s on the fullest device (stage "
                 "%d) and a runtime reserve of %.2f %s, but the device has %.2f %s; add devices, "
                 "lower --micro-batch, or give --recompute full or --zero 1/2",
                 res[0].mem.total / sc, u, res[0].mem.stage, prof.reserve_bytes / sc, u,
                 prof.mem_bytes * res[0].layout.threads / sc, u);
        fprintf(stderr, "llm3d plan: %s\n", why);
        if (json) print_json_error(why);
        free(res);
        return 1;
    }
    if (json) {
        for (int i = 0; i < n; i++) print_json(&m, &prof, &run, &res[i]);
        if (n == 0)
            print_json_error("no layout fits in memory: add devices, lower the micro-batch or "
                             "sequence, or recompute activations");
        free(res);
        return n > 0 ? 0 : 1;
    }
    printf("model %s: L=%d h=%d heads=%d ffn=%lld V=%d s=%d, %.3g parameters; profile %s (%s), %lld devices"
           ", global batch %lld, %s%s\n", m.name, m.L, m.h, m.heads, (long long)m.ffn, m.V, m.s,
           (double)l3d_plan_model_params(&m), prof.name, prof.device, (long long)run.devices,
           (long long)run.global_batch, l3d_prec_name(run.precision),
           run.flash ? ", fused attention" : "");
    if (run.grad_reduce_16)
        printf("data-parallel gradient sums in %s (2 bytes an element; 16-bit staging)\n",
               grad_reduce);
    if (run.llm3d_mixed && run.precision != L3D_PREC_FP32) {
        struct l3d_profile p16;
        const char *t = l3d_prec_name(run.precision);
        if (l3d_profile_mixed(&prof, run.precision, &p16))
            printf("llm3d's %s kernels timed at the profile's %s figures (gemm_eff_%s: %d "
                   "points, gemm_eff_wgrad_%s: %d, attn_eff_%s %.3g, kernel_bw_eff_%s %.3g)\n", t,
                   t, t, p16.n_eff, t, p16.wgrad.n, t, p16.attn_eff, t, p16.kernel_bw_eff);
        else
            printf("this profile has no gemm_eff_%s: llm3d's %s kernels timed at the fp32 figures "
                   "(llm3d bench --calibrate measures them)\n", t, t);
    }
    if (run.calibrated)
        printf("calibrated: the GEMM curve times %g, a factor fitted on a published run "
               "(profile key gemm_calibration; docs/frontier.md)%s\n", prof.gemm_calibration,
               prof.gemm_calibration > 0 ? "" : " -- this profile has none, so none applied");
    printf("searched %lld layouts in %.3f s: %lld valid, %lld fit in %.1f %s (%.1f %s kept by "
           "the runtime)\n", (long long)stats.evaluated, stats.seconds, (long long)stats.valid,
           (long long)stats.fit, prof.mem_bytes / sc, u, prof.reserve_bytes / sc, u);
    if (n == 0) {
        printf("no layout fits in memory: add devices, lower the micro-batch or sequence, or "
               "recompute activations\n");
        free(res);
        return 1;
    }
    print_table(&prof, res, n);
    const struct l3d_plan_result *b = &res[0];
    printf("\nbest: tp %d, pp %d, dp %d, micro-batch %d, %d micro-batches, v %d, ZeRO-%d, %s%s"
           "%s: %.4g s a step, %.4g tokens/s, MFU %.1f%% (model FLOPs, Narayanan eq. 3), "
           "HFU %.1f%% (recomputation counted), %.2f %s on the fullest device (stage %d)\n",
           b->layout.tp, b->layout.pp, b->layout.dp, b->layout.mb, b->m, b->layout.v,
           b->layout.zero,
           b->layout.recompute == L3D_RECOMPUTE_NONE ? "no" : rc_name(b->layout.recompute),
           " recomputation", b->layout.sp ? ", sequence parallel" : "",
           b->time.step, b->tokens_per_s, 100 * b->mfu, 100 * b->hfu, b->mem.total / sc, u,
           b->mem.stage);
    /* why: against the best layout of another shape (tp, pp, dp, micro-batch, v), so that the
     * answer is not a variant of the same layout */
    const struct l3d_plan_result *other = NULL;
    for (int i = 1; i < n && !other; i++) {
        const struct l3d_plan_layout *x = &res[i].layout, *y = &b->layout;
        if (x->tp != y->tp || x->pp != y->pp || x->dp != y->dp || x->mb != y->mb || x->v != y->v)
            other = &res[i];
    }
    if (!other && n > 1) other = &res[1];
    if (other) {
        char why[512];
        l3d_plan_explain(b, other, why, sizeof why);
        printf("why: %s\n", why);
    }
    free(res);
    return 0;
}
