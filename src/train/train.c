/* The training loop (include/llm3d/train.h). */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llm3d/ckpt.h"
#include "llm3d/data.h"
#include "llm3d/train.h"

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
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Mean loss over n batches of the validation loader (forward only). */
static float eval_loss(struct l3d_gpt *m, struct l3d_loader *ld, int n, int32_t *inp, int32_t *tgt,
                       int B, int T) {
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        l3d_loader_next(ld, inp, tgt);
        s += l3d_gpt_forward(m, inp, tgt, B, T);
    }
    return (float)(s / n);
}

l3d_status l3d_train_run(const struct l3d_train_config *tc, struct l3d_train_result *res) {
    memset(res, 0, sizeof *res);
    if (tc->steps < 1 || tc->accum < 1)
        return l3d_error(L3D_ERR_ARG, "--steps (%d) and --grad-accum (%d) must be at least 1",
                         tc->steps, tc->accum);
    if (!tc->train_pattern)
        return l3d_error(L3D_ERR_ARG, "no training data: give --train with a token shard or glob");
    if (tc->lr <= 0.0f || tc->min_lr < 0.0f || tc->min_lr > tc->lr)
        return l3d_error(L3D_ERR_ARG, "learning rates must satisfy 0 <= --min-lr (%g) <= --lr (%g), "
                         "--lr > 0", tc->min_lr, tc->lr);

    /* Everything that can fail on bad input is checked before the large allocations. */
    struct l3d_data *train = NULL, *val = NULL;
    struct l3d_loader *ld = NULL, *vld = NULL;
    struct l3d_gpt *m = NULL;
    struct l3d_backend *be = NULL;
    FILE *metrics = NULL;
    int32_t *inp = NULL, *tgt = NULL;
    double *step_s = NULL, *opt_s = NULL;
    struct l3d_adamw opt = {0};
    l3d_status st = l3d_data_open(&train, tc->train_pattern, tc->model.V);
    if (st != L3D_OK) goto done;
    struct l3d_loader_config lc = {.B = tc->B, .T = tc->T, .random = tc->random_batches,
                                   .seed = tc->seed, .dp_rank = 0, .dp_size = 1};
    if ((st = l3d_loader_init(&ld, train, &lc)) != L3D_OK) goto done;
    if (tc->val_pattern) {
        if ((st = l3d_data_open(&val, tc->val_pattern, tc->model.V)) != L3D_OK) goto done;
        struct l3d_loader_config vc = lc;
        vc.random = false;
        if ((st = l3d_loader_init(&vld, val, &vc)) != L3D_OK) goto done;
    }
    if (tc->out_dir) {
        if ((st = l3d_mkdir_p(tc->out_dir)) != L3D_OK) goto done;
        char path[4096];
        snprintf(path, sizeof path, "%s/metrics.jsonl", tc->out_dir);
        metrics = fopen(path, "w");
        if (!metrics) {
            st = l3d_error(L3D_ERR_IO, "cannot create %s: %s", path, strerror(errno));
            goto done;
        }
    }

    be = l3d_backend_cpu_init();
    struct l3d_shard sh = l3d_shard_full(&tc->model);
    if ((st = l3d_gpt_init(&m, &tc->model, &sh, be, tc->B, tc->T)) != L3D_OK) goto done;
    if (tc->init_from) {
        if ((st = l3d_ckpt_load_llmc(tc->init_from, m)) != L3D_OK) goto done;
    } else {
        l3d_gpt_init_weights(m, tc->seed);
    }
    l3d_adamw_init(&opt, &tc->adamw, m->num_params);
    int64_t BT = (int64_t)tc->B * tc->T;
    inp = l3d_alloc((size_t)BT * sizeof(int32_t), "batch");
    tgt = l3d_alloc((size_t)BT * sizeof(int32_t), "batch");
    step_s = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");
    opt_s = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");

    double peak = tc->peak_flops > 0 ? tc->peak_flops : l3d_cpu_fma_peak(0.3);
    double flops_tok = l3d_gpt_flops_per_token(&tc->model, tc->T);
    int64_t tokens_step = BT * tc->accum;
    struct l3d_lr_schedule sched = {.max_lr = tc->lr, .min_lr = tc->min_lr,
                                    .warmup_steps = tc->warmup_steps, .total_steps = tc->steps};
    if (!tc->quiet) {
        printf("model: L=%d C=%d NH=%d V=%d (padded %d) T=%d, %.2fM parameters\n", tc->model.L,
               tc->model.C, tc->model.NH, tc->model.V, tc->model.Vp, tc->T,
               (double)m->num_params / 1e6);
        printf("batch: %d x %d tokens x %d micro-batches = %lld tokens per step; %d threads\n", tc->B,
               tc->T, tc->accum, (long long)tokens_step, omp_get_max_threads());
        printf("data: %lld training tokens in %d file(s)%s\n", (long long)l3d_data_num_tokens(train),
               l3d_data_num_files(train), val ? ", validation on" : "");
        printf("memory: parameters %.1f MiB, gradients %.1f MiB, AdamW %.1f MiB, activations "
               "%.1f MiB; model FLOPs/token %.3g, peak %.1f GFLOP/s (%s)\n",
               m->num_params * 4 / 1048576.0, m->num_params * 4 / 1048576.0,
               m->num_params * 8 / 1048576.0, m->act_bytes / 1048576.0, flops_tok, peak / 1e9,
               tc->peak_flops > 0 ? "given" : "measured FMA peak");
        fflush(stdout);
    }

    for (int step = 0; step < tc->steps; step++) {
        double t0 = l3d_time_s();
        l3d_gpt_zero_grad(m);
        double loss = 0.0;
        for (int micro = 0; micro < tc->accum; micro++) {
            l3d_loader_next(ld, inp, tgt);
            loss += l3d_gpt_forward(m, inp, tgt, tc->B, tc->T);
            l3d_gpt_backward(m, 1.0f / (float)(BT * tc->accum), NULL);
        }
        loss /= tc->accum;
        double t1 = l3d_time_s();
        double norm = sqrt(l3d_grad_sumsq(be, m->grads, m->num_params));
        float clip = l3d_clip_factor(norm, tc->adamw.grad_clip);
        float lr = l3d_lr_at(&sched, step);
        l3d_adamw_step(&opt, be, m->params, m->grads, clip, m->tensors, L3D_NUM_TENSORS, lr);
        double dt = l3d_time_s() - t0, dt_opt = l3d_time_s() - t1;
        step_s[step] = dt;
        opt_s[step] = dt_opt;
        double tps = (double)tokens_step / dt, mfu = tps * flops_tok / peak;
        if (!isfinite(loss)) {
            st = l3d_error(L3D_ERR_INTERNAL, "loss is %g at step %d: training diverged (lower --lr "
                           "or raise --warmup)", loss, step + 1);
            goto done;
        }
        if (step == 0) res->first_loss = (float)loss;
        res->last_loss = (float)loss;
        float vloss = NAN;
        if (vld && tc->val_every > 0 && ((step + 1) % tc->val_every == 0 || step + 1 == tc->steps)) {
            l3d_loader_set_pos(vld, (struct l3d_loader_pos){0, 0});
            vloss = eval_loss(m, vld, tc->val_batches, inp, tgt, tc->B, tc->T);
            res->last_val_loss = vloss;
        }
        if (!tc->quiet) {
            printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %8.1f ms | %9.0f tok/s | MFU "
                   "%5.1f%%", step + 1, tc->steps, loss, lr, norm, dt * 1e3, tps, 100.0 * mfu);
            if (!isnan(vloss)) printf(" | val %.4f", vloss);
            printf("\n");
            fflush(stdout);
        }
        if (metrics) {
            fprintf(metrics, "{\"step\":%d,\"loss\":%.7g,\"lr\":%.6g,\"grad_norm\":%.6g,\"ms\":%.3f,"
                    "\"optimizer_ms\":%.3f,\"tokens_per_s\":%.1f,\"mfu\":%.5f,\"tokens\":%lld,\"flops_per_token\":%.6g,"
                    "\"peak_flops\":%.6g,\"mem_peak_bytes\":%zu", step + 1, loss, lr, norm, dt * 1e3,
                    dt_opt * 1e3, tps, mfu, (long long)tokens_step * (step + 1), flops_tok, peak, l3d_mem_peak());
            if (!isnan(vloss)) fprintf(metrics, ",\"val_loss\":%.7g", vloss);
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
    }
    res->steps = tc->steps;
    qsort(step_s, (size_t)tc->steps, sizeof(double), cmp_double);
    res->median_step_s = step_s[tc->steps / 2];
    qsort(opt_s, (size_t)tc->steps, sizeof(double), cmp_double);
    res->median_optimizer_s = opt_s[tc->steps / 2];
    res->tokens_per_s = (double)tokens_step / res->median_step_s;
    res->mfu = res->tokens_per_s * flops_tok / peak;
    if (tc->out_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.bin", tc->out_dir);
        if ((st = l3d_ckpt_save_llmc(path, m)) != L3D_OK) goto done;
        if (!tc->quiet) printf("saved %s\n", path);
    }
    if (!tc->quiet)
        printf("median step %.1f ms (forward+backward %.1f, optimizer %.1f), %.0f tokens/s, MFU "
               "%.1f%%, peak host memory %.1f MiB\n", res->median_step_s * 1e3,
               (res->median_step_s - res->median_optimizer_s) * 1e3, res->median_optimizer_s * 1e3,
               res->tokens_per_s, 100.0 * res->mfu,
               l3d_mem_peak() / 1048576.0);
done:
    if (metrics) fclose(metrics);
    l3d_free(inp);
    l3d_free(tgt);
    l3d_free(step_s);
    l3d_free(opt_s);
    if (opt.m) l3d_adamw_free(&opt);
    l3d_gpt_free(m);
    l3d_backend_free(be);
    l3d_loader_free(vld);
    l3d_loader_free(ld);
    l3d_data_free(val);
    l3d_data_free(train);
    return st;
}
