/* The training loop (include/llm3d/train.h). */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/ckpt.h"
#include "llm3d/comm.h"
#include "llm3d/data.h"
#include "llm3d/dp.h"
#include "llm3d/topo.h"
#include "llm3d/tp.h"
#include "llm3d/train.h"
#include "train/resume.h"

void l3d_train_config_defaults(struct l3d_train_config *tc) {
    memset(tc, 0, sizeof *tc);
    l3d_gpt_config_preset(&tc->model, "d6");
    tc->B = 4;
    tc->T = 64;
    tc->accum = 1;
    tc->steps = 100;
    tc->adamw = (struct l3d_adamw_hparams){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                           .weight_decay = 0.1f, .grad_clip = 1.0f};
    tc->lr = 6e-4f;
    tc->min_lr = 6e-5f;
    tc->warmup_steps = 10;
    tc->val_every = 50;
    tc->val_batches = 8;
    tc->random_batches = true;
    tc->seed = 1337;
    tc->tp = 1;
    tc->pp = 1;
    tc->dp = 0;
    tc->bucket_bytes = 4u << 20;
    tc->keep = 3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

/* Every rank learns whether any rank failed, before the next collective or large allocation, so a
 * rank never waits in a collective for one that gave up. The lowest failing rank reports. */
static l3d_status agree(struct l3d_comm *world, l3d_status st, struct l3d_train_result *res) {
    return l3d_comm_agree(world, st, &res->report_error);
}

/* Mean loss over n batches of the validation loader, averaged over the data-parallel group. */
static float eval_loss(struct l3d_gpt *m, struct l3d_loader *ld, int n, int32_t *inp, int32_t *tgt,
                       int B, int T, struct l3d_comm *dp) {
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        l3d_loader_next(ld, inp, tgt);
        s += l3d_gpt_forward(m, inp, tgt, B, T);
    }
    if (dp->size > 1) l3d_comm_all_reduce(dp, &s, 1, L3D_F64, L3D_SUM, NULL);
    return (float)(s / n / dp->size);
}

l3d_status l3d_train_run(const struct l3d_train_config *tc, struct l3d_comm *world,
                         struct l3d_train_result *res) {
    memset(res, 0, sizeof *res);
    struct l3d_data *train = NULL, *val = NULL;
    struct l3d_loader *ld = NULL, *vld = NULL;
    struct l3d_gpt *m = NULL;
    struct l3d_backend *be = NULL;
    FILE *metrics = NULL;
    int32_t *inp = NULL, *tgt = NULL;
    double *step_s = NULL, *opt_s = NULL, *comm_s = NULL;
    struct l3d_adamw opt = {0};
    struct l3d_topo topo = {0};
    struct l3d_dp dp = {0};
    struct l3d_tp tpc = {0};
    struct l3d_train_ckpt ck;
    bool topo_up = false, dp_up = false, ck_up = false;
    int tp = tc->tp, pp = tc->pp, dps = tc->dp;
    const bool lead = world->rank == 0; /* prints and writes files */

    /* Checks that need no communication: every rank reaches the same verdict. */
    l3d_status st = L3D_OK;
    if (tc->steps < 1 || tc->accum < 1)
        st = l3d_error(L3D_ERR_ARG, "--steps (%d) and --grad-accum (%d) must be at least 1",
                       tc->steps, tc->accum);
    else if (!tc->train_pattern)
        st = l3d_error(L3D_ERR_ARG, "no training data: give --train with a token shard or glob");
    else if (tc->lr <= 0.0f || tc->min_lr < 0.0f || tc->min_lr > tc->lr)
        st = l3d_error(L3D_ERR_ARG, "learning rates must satisfy 0 <= --min-lr (%g) <= --lr (%g), "
                       "--lr > 0", tc->min_lr, tc->lr);
    else if ((st = l3d_topo_resolve(world->size, &tp, &pp, &dps)) != L3D_OK)
        ;
    else if (pp > 1)
        st = l3d_error(L3D_ERR_LAYOUT, "--pp %d: pipeline parallelism is not implemented yet; use "
                       "--pp 1 (tensor and data parallelism over the %d ranks)", pp, world->size);
    else if (tp > 1 && (st = l3d_tp_shard(&tc->model, tp, 0, tc->sequence_parallel,
                                            &(struct l3d_shard){0})) != L3D_OK)
        ;
    else if (tc->sequence_parallel && tp == 1)
        st = l3d_error(L3D_ERR_LAYOUT, "--sequence-parallel splits the tensor-parallel group's "
                       "sequence; it needs --tp 2 or more");
    else if (tc->sequence_parallel && ((int64_t)tc->B * tc->T) % tp != 0)
        st = l3d_error(L3D_ERR_LAYOUT, "--sequence-parallel with --tp %d needs --batch x --seq-len "
                       "(%d x %d) to divide by %d", tp, tc->B, tc->T, tp);
    else if (tc->zero < 0 || tc->zero > 2)
        st = l3d_error(L3D_ERR_ARG, "--zero %d: choose 0, 1 (sharded optimizer state) or 2 (also "
                       "sharded gradients)", tc->zero);
    if ((st = agree(world, st, res)) != L3D_OK) return st;
    if ((st = l3d_topo_init(&topo, world, tp, pp, dps)) != L3D_OK) goto fail;
    topo_up = true;

    /* Data and output: files may differ between nodes, so agree again. */
    st = l3d_data_open(&train, tc->train_pattern, tc->model.V);
    struct l3d_loader_config lc = {.B = tc->B, .T = tc->T, .random = tc->random_batches,
                                   .seed = tc->seed, .dp_rank = topo.dp_rank, .dp_size = topo.dp};
    if (st == L3D_OK) st = l3d_loader_init(&ld, train, &lc);
    if (st == L3D_OK && tc->val_pattern) {
        st = l3d_data_open(&val, tc->val_pattern, tc->model.V);
        struct l3d_loader_config vc = lc;
        vc.random = false;
        if (st == L3D_OK) st = l3d_loader_init(&vld, val, &vc);
    }
    if (st == L3D_OK && tc->out_dir && lead) st = l3d_mkdir_p(tc->out_dir);
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;

    be = l3d_backend_cpu_init();
    struct l3d_shard sh = l3d_shard_full(&tc->model);
    if (tp > 1)
        L3D_ASSERT(l3d_tp_shard(&tc->model, tp, topo.tp_rank, tc->sequence_parallel, &sh) == L3D_OK);
    st = l3d_gpt_init(&m, &tc->model, &sh, be, tc->B, tc->T,
                      tc->zero == 2 ? L3D_GRADS_SLOTS : L3D_GRADS_FLAT);
    if (st == L3D_OK) {
        if (tc->init_from)
            st = l3d_ckpt_load_llmc(tc->init_from, m);
        else
            l3d_gpt_init_weights(m, tc->seed);
    }
    if (st == L3D_OK) l3d_tp_attach(&tpc, m, topo.tp_comm, !tc->dp_blocking);
    if (st == L3D_OK) st = l3d_dp_init(&dp, m, topo.dp_comm, tc->zero, tc->bucket_bytes, !tc->dp_blocking);
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;
    dp_up = true;
    int64_t own_start, own_count;
    l3d_dp_opt_range(&dp, &own_start, &own_count);
    l3d_adamw_init(&opt, &tc->adamw, own_start, own_count);
    /* checkpoints: resume (any layout), then the metrics file (a resumed run keeps its lines) */
    l3d_train_ckpt_init(&ck, tc, &topo, world);
    ck_up = true;
    int start_step = 0;
    st = l3d_train_ckpt_resume(&ck, tc, world, m, &opt, ld, &start_step, &res->report_error);
    if (st != L3D_OK) goto fail;
    res->start_step = start_step;
    if (lead) st = l3d_train_ckpt_open_metrics(tc, start_step, &metrics);
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;
    int64_t BT = (int64_t)tc->B * tc->T;
    inp = l3d_alloc((size_t)BT * sizeof(int32_t), "batch");
    tgt = l3d_alloc((size_t)BT * sizeof(int32_t), "batch");
    step_s = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");
    opt_s = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");
    comm_s = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");

    /* the peak of one rank's cores, times the ranks: measured on rank 0, shared */
    double peak = tc->peak_flops;
    if (peak <= 0) {
        peak = lead ? l3d_cpu_fma_peak(0.3) : 0.0;
        if (world->size > 1) l3d_comm_broadcast(world, &peak, 1, L3D_F64, 0, NULL);
    }
    peak *= world->size;
    double flops_tok = l3d_gpt_flops_per_token(&tc->model, tc->T);
    int64_t tokens_step = BT * tc->accum * topo.dp;
    float dloss = 1.0f / (float)tokens_step; /* each token's weight in the global mean loss */
    struct l3d_lr_schedule sched = {.max_lr = tc->lr, .min_lr = tc->min_lr,
                                    .warmup_steps = tc->warmup_steps, .total_steps = tc->steps};
    if (lead && !tc->quiet) {
        struct l3d_dp_memory mem = l3d_dp_memory(&dp, &opt);
        double N = (double)m->num_params, d = topo.dp, MiB = 1048576.0;
        printf("model: L=%d C=%d NH=%d V=%d (padded %d) T=%d, %.2fM parameters\n", tc->model.L,
               tc->model.C, tc->model.NH, tc->model.V, tc->model.Vp, tc->T, N / 1e6);
        printf("layout: %d rank(s) = tp %d x pp %d x dp %d, ZeRO-%d, %s gradient pieces, %s, %d "
               "thread(s) per rank\n", world->size, tp, pp, topo.dp, tc->zero,
               tc->dp_blocking ? "blocking" : "overlapped", l3d_comm_mpi_library(),
               omp_get_max_threads());
        printf("batch: %d x %d tokens x %d micro-batches x %d replicas = %lld tokens per step\n",
               tc->B, tc->T, tc->accum, topo.dp, (long long)tokens_step);
        printf("data: %lld training tokens in %d file(s)%s\n", (long long)l3d_data_num_tokens(train),
               l3d_data_num_files(train), val ? ", validation on" : "");
        const char *fgrad = tc->zero == 2 ? "4N/dp" : "4N", *fopt = tc->zero >= 1 ? "8N/dp" : "8N";
        double want = 4 * N + (tc->zero == 2 ? 4 * N / d : 4 * N) + (tc->zero >= 1 ? 8 * N / d : 8 * N);
        printf("memory per rank: parameters %.1f MiB (4N), gradients %.1f MiB (%s), AdamW %.1f MiB "
               "(%s); total %.1f MiB, formula %.1f MiB; gradient slots %.1f MiB, activations "
               "%.1f MiB\n", mem.params / MiB, mem.grads / MiB, fgrad, mem.optimizer / MiB, fopt,
               (mem.params + mem.grads + mem.optimizer) / MiB, want / MiB, mem.grad_scratch / MiB,
               m->act_bytes / MiB);
        if (tp > 1)
            printf("tensor parallelism: %.2f MB all-reduced per micro-batch per rank (4 (4L + 2) B T C "
                   "+ 12 B T bytes)\n", l3d_tp_bytes_per_micro(&tc->model, tc->B, tc->T) / 1e6);
        printf("model FLOPs/token %.3g, peak %.1f GFLOP/s (%s)\n", flops_tok, peak / 1e9,
               tc->peak_flops > 0 ? "given, times ranks" : "measured FMA peak, times ranks");
        fflush(stdout);
    }

    l3d_gpt_zero_grad(m);
    int end_step = tc->steps;
    for (int step = start_step; step < tc->steps; step++) {
        double t0 = l3d_time_s();
        dp.comm_wait_s = 0.0;
        tpc.comm_s = 0.0;
        tpc.bytes = 0;
        double loss = 0.0;
        for (int micro = 0; micro < tc->accum; micro++) {
            l3d_loader_next(ld, inp, tgt);
            l3d_dp_begin_micro(&dp, micro == tc->accum - 1);
            loss += l3d_gpt_forward(m, inp, tgt, tc->B, tc->T);
            l3d_gpt_backward(m, dloss, NULL);
        }
        l3d_dp_finish(&dp);
        double t1 = l3d_time_s();
        if (topo.dp > 1) l3d_comm_all_reduce(topo.dp_comm, &loss, 1, L3D_F64, L3D_SUM, NULL);
        loss /= (double)tc->accum * topo.dp;
        double norm = sqrt(l3d_dp_grad_sumsq(&dp, be, topo.tp_comm));
        float clip = l3d_clip_factor(norm, tc->adamw.grad_clip);
        float lr = l3d_lr_at(&sched, step);
        l3d_dp_step(&dp, &opt, be, lr, clip);
        double dt = l3d_time_s() - t0, dt_opt = l3d_time_s() - t1;
        step_s[step] = dt;
        opt_s[step] = dt_opt;
        comm_s[step] = dp.comm_wait_s;
        double tps = (double)tokens_step / dt, mfu = tps * flops_tok / peak;
        if (!isfinite(loss)) {
            st = l3d_error(L3D_ERR_INTERNAL, "loss is %g at step %d: training diverged (lower --lr "
                           "or raise --warmup)", loss, step + 1);
            res->report_error = lead;
            goto fail;
        }
        if (step == start_step) res->first_loss = (float)loss;
        res->last_loss = (float)loss;
        float vloss = NAN;
        if (vld && tc->val_every > 0 && ((step + 1) % tc->val_every == 0 || step + 1 == tc->steps)) {
            l3d_loader_set_pos(vld, (struct l3d_loader_pos){0, 0});
            vloss = eval_loss(m, vld, tc->val_batches, inp, tgt, tc->B, tc->T, topo.dp_comm);
            res->last_val_loss = vloss;
        }
        if (lead && !tc->quiet) {
            printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %8.1f ms | %9.0f tok/s | MFU "
                   "%5.1f%%", step + 1, tc->steps, loss, lr, norm, dt * 1e3, tps, 100.0 * mfu);
            if (!isnan(vloss)) printf(" | val %.4f", vloss);
            printf("\n");
            fflush(stdout);
        }
        if (metrics) {
            fprintf(metrics, "{\"step\":%d,\"loss\":%.9g,\"lr\":%.6g,\"grad_norm\":%.9g,\"ms\":%.3f,"
                    "\"optimizer_ms\":%.3f,\"comm_wait_ms\":%.3f,\"tp_comm_ms\":%.3f,"
                    "\"tp_bytes\":%lld,\"tokens_per_s\":%.1f,"
                    "\"mfu\":%.5f,\"tokens\":%lld,\"flops_per_token\":%.6g,\"peak_flops\":%.6g,"
                    "\"ranks\":%d,\"mem_peak_bytes\":%zu", step + 1, loss, lr, norm, dt * 1e3,
                    dt_opt * 1e3, dp.comm_wait_s * 1e3, tpc.comm_s * 1e3, (long long)tpc.bytes,
                    tps, mfu,
                    (long long)tokens_step * (step + 1), flops_tok, peak, world->size,
                    l3d_mem_peak());
            if (!isnan(vloss)) fprintf(metrics, ",\"val_loss\":%.9g", vloss);
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
        /* checkpoint: periodic, or a preemption signal on any rank (then stop, exit status 0) */
        res->stopped_by = l3d_ckpt_stop_requested(world);
        if (res->stopped_by || l3d_train_ckpt_due(&ck, tc, step + 1))
            if ((st = l3d_train_ckpt_save(&ck, tc, world, m, &opt, ld, step + 1,
                                           &res->report_error)) != L3D_OK)
                goto fail;
        if (res->stopped_by) {
            end_step = step + 1;
            if (lead)
                printf("signal %d: stopped after step %d%s\n", res->stopped_by, end_step,
                       ck.root[0] ? "; continue with --resume auto" : " (no --out: nothing saved)");
            break;
        }
    }
    /* the last step's checkpoint (also when a resumed run had no step left: a re-sliced copy) */
    if (!res->stopped_by && tc->save_every > 0 &&
        (st = l3d_train_ckpt_save(&ck, tc, world, m, &opt, ld, end_step, &res->report_error)) !=
            L3D_OK)
        goto fail;
    int ran = end_step - start_step;
    res->steps = end_step;
    if (ran > 0) {
        res->median_step_s = median(step_s + start_step, ran);
        res->median_optimizer_s = median(opt_s + start_step, ran);
        res->median_comm_s = median(comm_s + start_step, ran);
        res->tokens_per_s = (double)tokens_step / res->median_step_s;
        res->mfu = res->tokens_per_s * flops_tok / peak;
    }
    st = L3D_OK;
    if (tc->out_dir && topo.dp_rank == 0 && !res->stopped_by) {
        /* the first replica's TP shards, gathered into one llm.c model on rank 0 */
        int64_t n_full = l3d_gpt_param_count(&tc->model);
        float *full = NULL;
        if (lead) full = tp > 1 ? l3d_alloc((size_t)n_full * sizeof(float), "gathered model") : m->params;
        if (tp > 1) l3d_tp_gather(m, topo.tp_comm, m->params, full);
        if (lead) {
            char path[4096];
            snprintf(path, sizeof path, "%s/model.bin", tc->out_dir);
            st = l3d_ckpt_save_llmc_params(path, &tc->model, full, n_full);
            if (st == L3D_OK && !tc->quiet) printf("saved %s\n", path);
            if (tp > 1) l3d_free(full);
        }
    }
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;
    if (lead && !tc->quiet && ran > 0)
        printf("median step %.1f ms (forward+backward %.1f, optimizer %.1f, exposed DP communication "
               "%.1f), %.0f tokens/s, MFU %.1f%%, peak host memory %.1f MiB per rank\n",
               res->median_step_s * 1e3,
               (res->median_step_s - res->median_optimizer_s) * 1e3, res->median_optimizer_s * 1e3,
               res->median_comm_s * 1e3, res->tokens_per_s, 100.0 * res->mfu,
               l3d_mem_peak() / 1048576.0);
fail:
    if (ck_up) l3d_train_ckpt_free(&ck);
    if (metrics) fclose(metrics);
    l3d_free(inp);
    l3d_free(tgt);
    l3d_free(step_s);
    l3d_free(opt_s);
    l3d_free(comm_s);
    if (opt.m) l3d_adamw_free(&opt);
    if (dp_up) l3d_dp_free(&dp);
    l3d_gpt_free(m);
    l3d_backend_free(be);
    l3d_loader_free(vld);
    l3d_loader_free(ld);
    l3d_data_free(val);
    l3d_data_free(train);
    if (topo_up) l3d_topo_free(&topo);
    return st;
}
