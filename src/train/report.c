/* What the training loop says: the run's description, a line a step, metrics.jsonl, the summary
 * (src/train/train-impl.h). */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/train-impl.h"

/* The start-up lines of the fp32 parameters' pieces and of what the memory check counted beside
 * training. */
/* How the ideal bubble was found: the textbook formula, or zb-h1's simulated timeline. */
static const char *bubble_formula(enum l3d_pp_kind kind) {
    return l3d_pp_split(kind) ? "(timeline with F = B = W)" : "(p-1)/(v m+p-1)";
}

/* which path the 16-bit products of type dt take: the linear layers', then attention's */
static void report_paths(const struct l3d_trainer *t, enum l3d_dtype dt) {
    static const char *const path[2][3] = {
        {"products", "16-bit operands into fp32 sums, in the backend's own 16-bit kernels",
         "16-bit operands widened into fp32 copies around fp32 products (the device has no "
         "16-bit products, or L3D_DNNL_16BIT=0)"},
        {"attention products", "16-bit matmuls in the backend's own kernels (oneDNN, "
                               "L3D_ATTN_DNNL=1)",
         "the flash kernels' fp32 products of widened operands (L3D_ATTN_DOT=1: bf16 dot "
         "products where the CPU has AVX512-BF16; L3D_ATTN_DNNL=1: oneDNN's)"}};
    bool native[2] = {l3d_be_matmul_native(t->be, dt), l3d_be_attention_native(t->be, dt)};
    for (int k = 0; k < 2; k++) {
        bool dot = k == 1 && !native[1] &&
                   l3d_be_attention_p16(t->be, dt, l3d_model_head_dim(&t->tc->model));
        printf("%s: %s\n", path[k][0],
               dot ? "the flash kernels in bf16 dot products, P rounded to bf16 (AVX512-BF16: "
                     "by default on AMD CPUs; L3D_ATTN_DOT=0 for fp32 products)"
                   : path[k][native[k] ? 1 : 2]);
    }
    int64_t blk = native[0] ? l3d_be_matmul_wgrad_block(t->be, dt) : 0;
    if (blk > 0) /* the planner's memory counts it (gemm_wgrad_block_T) */
        printf("weight gradients: blocks of rows into %.6g MiB of fp32 scratch in oneDNN's gemm "
               "kernels, each added to the gradient, for products of at least %d tokens "
               "(L3D_MM_GEMM=0: one brgemm product)\n", blk / 1048576.0,
               L3D_WGRAD_BLOCK_MIN_ROWS);
}

static void report_transfers(const struct l3d_trainer *t, int v) {
    const struct l3d_train_config *tc = t->tc;
    const double MiB = 1048576.0;
    if (l3d_dp_fp32_streamed(&t->dps[0], &t->opts[0])) { /* ZeRO-3, ZeRO-2 in mixed precision */
        size_t piece = l3d_ckpt_stage_bytes(), most = 0;
        for (int c = 0; c < v; c++)
            most += (size_t)l3d_dp_fp32_piece(t->chunks[c]->num_params, piece) * sizeof(float);
        printf("fp32 parameters: no whole copy on any rank; saves, resumes, --init-from%s move "
               "them in pieces of at most %.1f MiB: %.1f MiB on the device (a piece per chunk) "
               "and on the host one piece (three strips of rows for a re-sliced resume or a "
               "Hugging Face folder)\n",
               tc->layout.zero == 2 ? " and the initialisation" : "", piece / MiB, most / MiB);
    }
    if (t->mem_figure >= 0) { /* what the check counted beside training (train/memory.c) */
        bool files = tc->resume || tc->init_from || tc->save_every > 0;
        printf("memory check: %.1f MiB (%.0f bytes) planned on rank 0%s%s%s\n",
               t->mem_figure / MiB, t->mem_figure,
               files || tc->out_dir ? " (" : "", files ? "the files' transfers" : "",
               tc->out_dir ? (files ? " and --out's writers)" : "--out's writers)")
                           : files ? ")" : "");
    }
}

/* Routed experts' parameters and MoE layers pipeline rank r holds (its chunks; every tp rank and
 * every ep rank of a stage holds as many: E / ep experts of each MoE layer). */
static double stage_experts(const struct l3d_trainer *t, int r, int *layers) {
    const struct l3d_train_config *tc = t->tc;
    double n = 0;
    *layers = 0;
    for (int c = 0; c < tc->layout.v; c++) {
        int vs = l3d_pp_vstage(tc->layout.schedule, t->topo->layout->pp, r, c);
        struct l3d_shard sh = l3d_train_layout_shard(&t->lay, tc, vs, 0);
        l3d_shard_set_experts(&tc->model, &sh, tc->layout.ep > 1 ? tc->layout.ep : 1, 0);
        struct l3d_tensor_info ti[L3D_NUM_TENSORS];
        l3d_gpt_plan_tensors(&tc->model, &sh, ti);
        *layers += l3d_shard_moe_layers(&tc->model, &sh);
        for (int i = 0; i < L3D_NUM_TENSORS; i++)
            if (l3d_gpt_expert_tensor(i)) n += (double)ti[i].count;
    }
    return n;
}

/* A mixture of experts' memory on the fullest rank: the routed experts' parameters of the
 * pipeline stage that holds the most (the stages' MoE layers differ: dense leading layers, uneven
 * splits) at the memory line's bytes a parameter (l3d_param_bytes), ZeRO sharding their state
 * over the dp cp / ep ranks that hold the same experts. */
static void report_expert_memory(const struct l3d_trainer *t) {
    const struct l3d_train_config *tc = t->tc;
    const struct l3d_moe_spec *moe = &tc->model.moe;
    if (moe->experts == 0) return;
    int ep = tc->layout.ep > 1 ? tc->layout.ep : 1, layers = 0;
    int group = t->topo->layout->dp * t->topo->layout->cp / ep; /* those holding the same experts */
    double n = -1;
    for (int r = 0; r < t->topo->layout->pp; r++) {
        int lr;
        double nr = stage_experts(t, r, &lr);
        if (nr > n) n = nr, layers = lr;
    }
    struct l3d_param_bytes pb;
    l3d_param_bytes(&tc->precision, tc->layout.zero, group, &pb);
    printf("expert memory on the fullest rank: %d of the %d experts x %d layer(s) = %.2fM "
           "parameters, %.1f MiB (%.0fN of weights, gradients and AdamW; ZeRO-%d over the %d "
           "rank(s) holding the same experts)\n", moe->experts / ep, moe->experts, layers,
           n / 1e6, pb.total * n / 1048576.0, pb.total, tc->layout.zero, group);
}

/* A mixture of experts' start-up line: its blocks, total and active parameters; with --ep a
 * second one, the split (E / ep experts a rank, dp cp / ep replicas of each); then their memory. */
static void report_experts(const struct l3d_trainer *t, double N) {
    const struct l3d_model_spec *m = &t->tc->model;
    const struct l3d_moe_spec *moe = &m->moe;
    int ep = t->tc->layout.ep, dp = t->topo->layout->dp * t->topo->layout->cp;
    if (moe->experts == 0) return;
    char cap[48] = "dropless";
    if (moe->capacity_factor > 0)
        snprintf(cap, sizeof cap, "capacity factor %g", moe->capacity_factor);
    printf("experts: layers %d-%d of %d experts (width %lld), top-%d%s, %d shared, %s; %.2fM "
           "parameters, %.2fM active a token (model FLOPs and MFU count the active ones)\n",
           moe->dense_layers, m->L - 1, moe->experts, (long long)moe->ffn, moe->top_k,
           moe->norm_topk ? " renormalised" : "", moe->shared, cap, N / 1e6,
           l3d_model_active_param_count(m) / 1e6);
    if (moe->force_balance) /* nobody should take a benchmark's routing for a trained one */
        printf("routing: FORCED balanced (--moe-force-balance, benchmarking only): each row's %d "
               "experts are fixed by its position, (layer + (b T + t) K + j) mod E, not the "
               "router's top-%d; the router's softmax still weighs them and trains\n",
               moe->top_k, moe->top_k);
    if (ep > 1)
        printf("expert parallelism: ep %d, %d of the %d experts a rank, %d replica(s) of each; "
               "token rows exchanged by all-to-all\n", ep, moe->experts / ep, moe->experts,
               dp / ep);
    report_expert_memory(t);
}

/* the layout line's ring: " x cp N (each sequence in 2N chunks, the ring in T)", T the type of
 * its partial sums (--cp-reduce-dtype, src/parallel/cp.c); nothing for cp 1 */
static void ring_words(char *buf, size_t cap, int cp, const struct l3d_precision *p) {
    if (cp > 1)
        snprintf(buf, cap, " x cp %d (each sequence in %d chunks, the ring in %s)", cp, 2 * cp,
                 l3d_dtype_name(p->cp_fp32 ? L3D_F32 : p->param));
}

/* The data-parallel state's bytes over the rank's chunks. */
static struct l3d_dp_memory dp_memory_sum(const struct l3d_trainer *t) {
    struct l3d_dp_memory mem = {0};
    for (int c = 0; c < t->tc->layout.v; c++) {
        struct l3d_dp_memory mc = l3d_dp_memory(&t->dps[c], &t->opts[c]);
        mem.params += mc.params;
        mem.grads += mc.grads;
        mem.optimizer += mc.optimizer;
        mem.grad_scratch += mc.grad_scratch;
        mem.reduce_staging += mc.reduce_staging;
        mem.gather += mc.gather;
    }
    return mem;
}

void l3d_train_report_start(const struct l3d_trainer *t, const struct l3d_train_result *res) {
    const struct l3d_train_config *tc = t->tc;
    const struct l3d_train_layout *lay = &t->lay;
    int v = tc->layout.v, tp = tc->layout.tp, pp = tc->layout.pp;
    if (!t->lead) return; /* also with --quiet: the start-up summary and the final line stay */
    struct l3d_dp_memory mem = dp_memory_sum(t);
    double N = (double)l3d_gpt_param_count(&tc->model), Nl = (double)t->n_local;
    double d = t->topo->layout->dp, MiB = 1048576.0;
    printf("model: L=%d C=%d NH=%d V=%d (padded %d) T=%d, %.2fM parameters\n", tc->model.L,
           tc->model.C, tc->model.NH, tc->model.V, tc->model.Vp, tc->layout.seq, N / 1e6);
    report_experts(t, N);
    static const char *const progress[] = {"", " (polled between kernels)",
                                           " (progress thread)"};
    char cp[96] = "";
    ring_words(cp, sizeof cp, t->topo->layout->cp, &tc->precision);
    /* --tp-reduce-dtype fp32 where it acts: tp > 1 in 16-bit precision (src/model/tpsum.c) */
    bool tp32 = tp > 1 && tc->precision.tp_reduce_fp32 && tc->precision.param != L3D_F32;
    printf("layout: %d rank(s) = tp %d%s%s x pp %d x dp %d, ZeRO-%d, %s gradient pieces%s in %s, "
           "%s, %d thread(s) per rank\n", t->world->size, tp, tp32 ? " (sums in fp32)" : "", cp,
           pp, t->topo->layout->dp, tc->layout.zero, tc->dp_blocking ? "blocking" : "overlapped",
           tc->dp_blocking ? "" : progress[tc->progress], l3d_dtype_name(tc->precision.reduce),
           t->comm_name, omp_get_max_threads());
    if (pp > 1) {
        printf("pipeline: %s schedule%s, %d micro-batches, %d stage(s) x %d chunk(s), layers",
               l3d_pp_kind_name(lay->sched.kind),
               tc->layout.schedule_implied
                   ? " (chosen for --pp-virtual > 1; --pp-schedule to choose)"
                   : "",
               tc->layout.accum, pp, v);
        for (int i = 0; i < lay->stages; i++) printf("%s%d", i ? "," : " ", lay->layers[i]);
        printf(" (%s), ideal bubble %s = %.1f%%\n",
               tc->layout.pp_layers                              ? "given"
               : tc->layout.pp_first || tc->layout.pp_last ? "end stages given, the others even"
                                                           : "balanced",
               bubble_formula(lay->sched.kind), 100.0 * res->bubble_theory);
    }
    printf("batch: %d x %d tokens x %d micro-batches x %d replicas = %lld tokens per step\n",
           tc->layout.micro_batch, tc->layout.seq, tc->layout.accum, t->topo->layout->dp,
           (long long)t->tokens_step);
    printf("data: %lld training tokens in %d file(s)%s\n", (long long)l3d_data_num_tokens(t->train),
           l3d_data_num_files(t->train), t->val ? ", validation on" : "");
    /* mixed precision: 16-bit parameters, fp32 gradients (main_grad), and AdamW's m and v with
     * the fp32 master weights: 2 + 4 + 12 bytes a parameter without ZeRO (the ZeRO paper's
     * K = 12 optimizer bytes, with fp32 gradients instead of its 2-byte ones): l3d_param_bytes */
    const bool mixed = tc->precision.param != L3D_F32;
    struct l3d_param_bytes pb;
    l3d_param_bytes(&tc->precision, tc->layout.zero, (int)d, &pb);
    char fpar[16], fgrad[16], fopt[16];
    snprintf(fpar, sizeof fpar, "%.0fN%s", pb.params_full, tc->layout.zero >= 3 ? "/dp" : "");
    snprintf(fgrad, sizeof fgrad, "%.0fN%s", pb.grads_full, tc->layout.zero >= 2 ? "/dp" : "");
    snprintf(fopt, sizeof fopt, "%.0fN%s", pb.optimizer_full, tc->layout.zero >= 1 ? "/dp" : "");
    double want = pb.total * Nl;
    printf("memory on rank 0 (N = its %.2fM parameters, %s): parameters %.1f MiB (%s), gradients "
           "%.1f MiB (%s), AdamW %.1f MiB (%s%s); total %.1f MiB, formula %.1f MiB; gradient "
           "slots %.1f MiB", Nl / 1e6, mixed ? (tc->precision.param == L3D_BF16 ? "bf16 mixed "
           "precision" : "fp16 mixed precision") : "fp32", mem.params / MiB, fpar,
           mem.grads / MiB, fgrad, mem.optimizer / MiB, fopt,
           mixed ? ": m, v, fp32 master weights" : "", (mem.params + mem.grads + mem.optimizer) /
           MiB, want / MiB, mem.grad_scratch / MiB);
    if (mem.reduce_staging > 0)
        printf(", %s reduction staging %.1f MiB", l3d_dtype_name(tc->precision.reduce),
               mem.reduce_staging / MiB);
    if (tc->layout.zero == 3) /* ZeRO-3: what the gathers hold beside the shard */
        printf(", ZeRO-3 gather buffers %.1f MiB (%d layers in flight: 1 + --zero3-prefetch %d, "
               "and the non-layer tensors)", mem.gather / MiB, tc->layout.zero3_prefetch + 1,
               tc->layout.zero3_prefetch);
    printf("\n");
    report_transfers(t, v);
    if (mixed) report_paths(t, tc->precision.param);
    printf("activations: %.1f MiB on the fullest rank (%.0f bytes; closed form %.1f MiB; "
           "recompute %s; micro-batches kept per chunk on rank 0:", res->act_bytes / MiB,
           (double)res->act_bytes, res->act_bytes_formula / MiB,
           tc->layout.recompute == L3D_RECOMPUTE_NONE ? "none"
           : tc->layout.recompute == L3D_RECOMPUTE_SELECTIVE ? "selective" : "full");
    for (int c = 0; c < v; c++) printf(" %d", lay->sched.slots[c]);
    printf(")\n");
    if (tp > 1)
        printf("tensor parallelism: %.2f MB all-reduced per micro-batch per rank (4 (4L + 2) B T C "
               "+ 12 B T bytes)\n",
               l3d_tp_bytes_per_micro(&tc->model, tc->layout.micro_batch, tc->layout.seq) / 1e6);
    printf("model FLOPs/token %.3g, peak %.1f GFLOP/s (%s)\n", t->flops_tok, t->peak / 1e9,
           tc->peak_flops > 0   ? "given, times ranks"
           : tc->precision.param == L3D_F32 ? "measured fp32 FMA peak, times ranks"
                                      : "measured peak of the 16-bit products, times ranks");
    fflush(stdout);
}

static void json_number(char *buf, size_t n, double v) {
    if (isfinite(v))
        snprintf(buf, n, "%.9g", v);
    else
        snprintf(buf, n, "null");
}

/* v as a float32 in the fewest digits (6 to 9) that read back as that float: the value the
 * TensorBoard event file holds, in as short a number as it can be ("6e-05", not
 * "6.00000021e-05"). */
static void json_float(char *buf, size_t n, double v) {
    float f = (float)v;
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, n, "%.*g", digits, (double)f);
        if (strtof(buf, NULL) == f) return;
    }
}

/* A mixture of experts' part of a metrics.jsonl line, appended at line + n (cap bytes in all):
 * the auxiliary losses, the drops, whether the routing was forced (--moe-force-balance: a
 * benchmark's, not the router's) and every layer's load; the new length. */
static int moe_metrics(char *line, int n, size_t cap, const struct l3d_step_stats *s,
                       bool forced) {
    if (s->moe_layers > 0 && n > 0 && n < (int)cap)
        n += snprintf(line + n, cap - (size_t)n, ",\"moe_aux_loss\":%.9g,"
                      "\"moe_z_loss\":%.9g,\"moe_dropped\":%.0f,\"moe_load_max\":%.6g,%s"
                      "\"moe_load\":[", s->moe_aux, s->moe_z, s->moe_dropped, s->moe_load_max,
                      forced ? "\"moe_routing\":\"forced\"," : "");
    for (int j = 0; j < s->moe_layers && n > 0 && n < (int)cap; j++)
        n += snprintf(line + n, cap - (size_t)n, "%s%.6g", j ? "," : "", s->moe_load[j]);
    if (s->moe_layers > 0 && n > 0 && n < (int)cap) n += snprintf(line + n, cap - (size_t)n, "]");
    return n;
}

/* The step's line in metrics.jsonl. */
static l3d_status metrics_line(const struct l3d_trainer *t, int step,
                               const struct l3d_step_stats *s) {
    /* the whole line, then one checked write and flush: a failure (a full disk, a file-size
     * limit) is reported with the path and errno, and the line cut short is taken back, so the
     * file ends with the last complete step */
    char own[4096], loss[32], norm[32]; /* JSON has no NaN: a skipped step's may be null */
    char *line = t->mline ? t->mline : own; /* a MoE model's: its loads too */
    size_t cap = t->mline ? t->mline_cap : sizeof own;
    char lr[32], tps[32], mfu[32]; /* as float32s: the TensorBoard values (tensorboard_step) */
    json_number(loss, sizeof loss, s->loss);
    json_number(norm, sizeof norm, s->norm);
    json_float(lr, sizeof lr, s->lr);
    json_float(tps, sizeof tps, s->tokens_per_s);
    json_float(mfu, sizeof mfu, s->mfu);
    int n = snprintf(line, cap, "{\"step\":%d,\"loss\":%s,\"lr\":%s,\"grad_norm\":%s,"
                     "\"ms\":%.3f,\"optimizer_ms\":%.3f,\"comm_wait_ms\":%.3f,\"tp_comm_ms\":%.3f,"
                     "\"tp_bytes\":%lld,\"tokens_per_s\":%s,"
                     "\"mfu\":%s,\"tokens\":%lld,\"flops_per_token\":%.6g,\"peak_flops\":%.6g,"
                     "\"ranks\":%d,\"mem_peak_bytes\":%zu,\"bubble\":%.5f", step + 1, loss,
                     lr, norm, s->seconds * 1e3, s->optimizer_s * 1e3, s->comm_wait_s * 1e3,
                     t->tpc.comm_s * 1e3, (long long)t->tpc.bytes, tps, mfu,
                     (long long)t->tokens_step * (step + 1), t->flops_tok, t->peak,
                     t->world->size, l3d_mem_peak(), s->bubble);
    if (t->tc->layout.zero == 3 && n > 0 && n < (int)cap)
        n += snprintf(line + n, cap - (size_t)n, ",\"zero3_gather_wait_ms\":%.3f",
                      s->gather_wait_s * 1e3);
    if (!isnan(s->val_loss) && n > 0 && n < (int)cap)
        n += snprintf(line + n, cap - (size_t)n, ",\"val_loss\":%.9g", s->val_loss);
    if (t->topo->layout->cp > 1 && n > 0 && n < (int)cap) { /* the ring's (this rank's) */
        double w = 0;
        int64_t b = 0;
        for (int c = 0; c < t->tc->layout.v; c++) w += t->cps[c].comm_s, b += t->cps[c].bytes;
        n += snprintf(line + n, cap - (size_t)n, ",\"cp_wait_ms\":%.3f,\"cp_bytes\":%lld",
                      w * 1e3, (long long)b);
    }
    if (t->epc.comm && n > 0 && n < (int)cap) /* the experts' all-to-alls (this rank's) */
        n += snprintf(line + n, cap - (size_t)n, ",\"ep_comm_ms\":%.3f,\"ep_bytes\":%lld",
                      t->epc.comm_s * 1e3, (long long)t->epc.bytes);
    if (s->loss_scale > 0 && n > 0 && n < (int)cap)
        n += snprintf(line + n, cap - (size_t)n, ",\"loss_scale\":%.17g",
                      s->loss_scale);
    if (s->skipped && n > 0 && n < (int)cap)
        n += snprintf(line + n, cap - (size_t)n, ",\"skipped\":true%s",
                      s->overflow ? ",\"overflow\":true" : "");
    if (s->stall_s > 0 && n > 0 && n < (int)cap)
        n += snprintf(line + n, cap - (size_t)n, ",\"stall_s\":%.3f", s->stall_s);
    n = moe_metrics(line, n, cap, s, t->tc->model.moe.force_balance);
    if (n > 0 && n < (int)cap) n += snprintf(line + n, cap - (size_t)n, "}\n");
    L3D_ASSERT(n > 0 && n < (int)cap);
    return l3d_train_metrics_write(t->metrics, t->metrics_path, line);
}

/* The step's scalars in the TensorBoard event file: those of metrics.jsonl, as float32. */
static l3d_status tensorboard_step(const struct l3d_trainer *t, int step,
                                   const struct l3d_step_stats *s) {
    struct l3d_tfevents_scalar v[L3D_TFEVENTS_MAX_SCALARS];
    int n = 0;
    v[n++] = (struct l3d_tfevents_scalar){"train/loss", (float)s->loss};
    v[n++] = (struct l3d_tfevents_scalar){"train/lr", s->lr};
    v[n++] = (struct l3d_tfevents_scalar){"train/grad_norm", (float)s->norm};
    v[n++] = (struct l3d_tfevents_scalar){"train/skipped", s->skipped ? 1.0f : 0.0f};
    v[n++] = (struct l3d_tfevents_scalar){"perf/tokens_per_s", (float)s->tokens_per_s};
    v[n++] = (struct l3d_tfevents_scalar){"perf/mfu", (float)s->mfu};
    v[n++] = (struct l3d_tfevents_scalar){"perf/step_ms", (float)(s->seconds * 1e3)};
    if (!isnan(s->val_loss)) v[n++] = (struct l3d_tfevents_scalar){"val/loss", s->val_loss};
    if (s->loss_scale > 0)
        v[n++] = (struct l3d_tfevents_scalar){"train/loss_scale", (float)s->loss_scale};
    if (s->moe_layers > 0) { /* a mixture of experts: the auxiliary losses, the busiest layer */
        v[n++] = (struct l3d_tfevents_scalar){"moe/aux_loss", (float)s->moe_aux};
        v[n++] = (struct l3d_tfevents_scalar){"moe/z_loss", (float)s->moe_z};
        v[n++] = (struct l3d_tfevents_scalar){"moe/load_max", (float)s->moe_load_max};
    }
    return l3d_tfevents_write(&t->tb, step + 1, v, n);
}

l3d_status l3d_train_report_step(const struct l3d_trainer *t, int step,
                                 const struct l3d_step_stats *s) {
    const struct l3d_train_config *tc = t->tc;
    int pp = t->tc->layout.pp;
    if (t->lead && !tc->quiet) {
        printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %8.1f ms | %9.0f tok/s | MFU "
               "%5.1f%%", step + 1, tc->steps, s->loss, s->lr, s->norm, s->seconds * 1e3,
               s->tokens_per_s, 100.0 * s->mfu);
        if (pp > 1) printf(" | bubble %4.1f%%", 100.0 * s->bubble);
        if (s->moe_layers > 0) /* the largest layer's load; per layer in metrics.jsonl */
            printf(" | aux %.4f | load %.2f%s", s->moe_aux, s->moe_load_max,
                   tc->model.moe.force_balance ? " (forced)" : "");
        if (s->moe_layers > 0 && tc->model.moe.capacity_factor > 0)
            printf(" | dropped %.0f", s->moe_dropped);
        if (!isnan(s->val_loss)) printf(" | val %.4f", s->val_loss);
        if (s->loss_scale > 0) printf(" | scale %.0f", s->loss_scale);
        if (s->skipped) printf(" | skipped");
        if (s->stall_s > 0) printf(" | stalled %.1f s", s->stall_s);
        printf("\n");
        fflush(stdout);
    }
    l3d_status st = t->metrics ? metrics_line(t, step, s) : L3D_OK;
    if (st == L3D_OK && t->tb.f) st = tensorboard_step(t, step, s);
    return st;
}

l3d_status l3d_train_metrics_write(FILE *f, const char *path, const char *line) {
    return l3d_log_append(f, path, line, strlen(line), "line");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of steps start..end-1 of a ring of the last t->n_times steps (the last n_times of
 * them when there are more), sorted in a copy: the ring keeps its order. */
static double median(const struct l3d_trainer *t, const double *ring, int start, int end) {
    int n = end - start < t->n_times ? end - start : t->n_times;
    double v[L3D_TRAIN_TIMES_KEPT];
    for (int i = 0; i < n; i++) v[i] = ring[(end - n + i) % t->n_times];
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

/* The kernel split of the median step itself (the step whose time is the median): the
 * families' own medians would not add up to one step. */
static void median_split(const struct l3d_trainer *t, int start, int end,
                         struct l3d_train_result *res) {
    if (!t->kp) return;
    int n = end - start < t->n_times ? end - start : t->n_times;
    double med = median(t, t->step_s, start, end);
    for (int i = 0; i < n; i++) {
        int k = (end - n + i) % t->n_times;
        if (t->step_s[k] != med) continue;
        res->split = t->kp[k];
        res->split_comm_s = t->kp_comm_s[k];
        res->split_step_s = t->step_s[k];
        break;
    }
    /* every kernel over the steps after the first */
    res->kernels = t->kp_total;
    res->kernel_steps = end - 1 - t->kp_first_step;
    const struct l3d_kprof *f0 = &t->kp_first;
    for (int i = 0; i < f0->nk && res->kernel_steps > 0; i++) {
        res->kernels.k[i].s -= f0->k[i].s;
        res->kernels.k[i].bytes -= f0->k[i].bytes;
        res->kernels.k[i].calls -= f0->k[i].calls;
    }
}

void l3d_train_report_result(struct l3d_trainer *t, int start, int end,
                             struct l3d_train_result *res) {
    const struct l3d_train_config *tc = t->tc;
    int ran = end - start;
    if (ran <= 0) return;
    res->median_step_s = median(t, t->step_s, start, end);
    res->median_optimizer_s = median(t, t->opt_s, start, end);
    res->median_comm_s = median(t, t->comm_s, start, end);
    res->bubble = median(t, t->bub, start, end);
    median_split(t, start, end, res);
    res->tokens_per_s = (double)t->tokens_step / res->median_step_s;
    res->mfu = res->tokens_per_s * t->flops_tok / t->peak;
    /* The model ran faster than the measured peak: other work held the cores while it was
     * measured; measure again (rank 0, shared) and keep the larger. Each rank's median step time
     * is its own, so the ranks decide together (one MAX): a rank that measured again alone would
     * wait in a broadcast that its peers never join (the hang of cli_equiv in CI). Test hook:
     * L3D_TEST_MFU_OVER_ONE_RANK=R makes rank R alone find an MFU above 1. */
    struct l3d_comm *world = t->world;
    const char *hook = getenv("L3D_TEST_MFU_OVER_ONE_RANK");
    int32_t redo = (res->mfu > 1.0 || (hook && atoi(hook) == world->rank)) && tc->peak_flops <= 0;
    if (world->size > 1) l3d_comm_all_reduce(world, &redo, 1, L3D_I32, L3D_MAX, NULL);
    if (redo) {
        double again = t->lead ? l3d_be_peak_flops(t->be, tc->precision.param) * world->size : 0.0;
        if (world->size > 1) l3d_comm_broadcast(world, &again, 1, L3D_F64, 0, NULL);
        if (t->lead && !tc->quiet)
            printf("note: the start-up peak (%.1f GFLOP/s) was below the model's own rate "
                   "(busy machine); measured again: %.1f GFLOP/s%s\n", t->peak / 1e9, again / 1e9,
                   again * 0.99 < res->tokens_per_s * t->flops_tok
                       ? " (still low: give --peak-gflops)" : "");
        if (again > t->peak) t->peak = again;
        res->mfu = res->tokens_per_s * t->flops_tok / t->peak;
    }
}

void l3d_train_report_end(const struct l3d_trainer *t, const struct l3d_train_result *res) {
    if (!t->lead || res->steps - res->start_step <= 0) return; /* also with --quiet */
    printf("median step %.1f ms (forward+backward %.1f, optimizer %.1f, exposed DP communication "
           "%.1f), %.0f tokens/s, MFU %.1f%%, peak host memory %.1f MiB (%zu bytes, the "
           "fullest rank)\n",
           res->median_step_s * 1e3,
           (res->median_step_s - res->median_optimizer_s) * 1e3, res->median_optimizer_s * 1e3,
           res->median_comm_s * 1e3, res->tokens_per_s, 100.0 * res->mfu,
           res->mem_peak / 1048576.0, res->mem_peak);
    if (t->tc->layout.pp > 1)
        printf("pipeline bubble: measured %.1f%% of the pipeline's time (median step), ideal "
               "%s = %.1f%%\n", 100.0 * res->bubble, bubble_formula(t->lay.sched.kind),
               100.0 * res->bubble_theory);
}
