/* One optimizer step and the validation loss (src/train/train-impl.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"

static void load_batches(struct l3d_loader *ld, int n, int64_t BT, int32_t *inp, int32_t *tgt) {
    for (int i = 0; i < n; i++) l3d_loader_next(ld, inp + i * BT, tgt + i * BT);
}

/* Context parallelism: every rank of a ring loads the same sequences (the loader's place is the
 * data-parallel rank's) and keeps its two chunks of each (l3d_cp_chunk_start), in order, into
 * the (n B, T / cp) arrays the model runs on; the inputs and targets as they are with cp 1. */
static void take_chunks(const struct l3d_trainer *t, int n, const int32_t **inp,
                        const int32_t **tgt, int *T) {
    const struct l3d_topo *topo = t->topo;
    int64_t seq = t->tc->layout.seq, Tl = seq / topo->layout->cp, half = Tl / 2;
    int64_t rows = (int64_t)n * t->tc->layout.micro_batch;
    *T = (int)Tl;
    *inp = t->inp;
    *tgt = t->tgt;
    if (topo->layout->cp <= 1) return;
    for (int64_t b = 0; b < rows; b++)
        for (int k = 0; k < 2; k++) {
            /* l3d_cp_chunk_start's split, without its test hook (which moves the model's
             * positions, not the data) */
            int64_t from = b * seq + (k == 0 ? topo->cp_rank : 2 * topo->layout->cp - 1 - topo->cp_rank) *
                                         half;
            memcpy(t->cinp + b * Tl + k * half, t->inp + from, (size_t)half * sizeof(int32_t));
            memcpy(t->ctgt + b * Tl + k * half, t->tgt + from, (size_t)half * sizeof(int32_t));
        }
    *inp = t->cinp;
    *tgt = t->ctgt;
}

/* Sum over a communicator of size > 1 (else nothing). */
static void sum_f64(struct l3d_comm *c, double *v, int n) {
    if (c && c->size > 1) l3d_comm_all_reduce(c, v, n, L3D_F64, L3D_SUM, NULL);
}

/* Test hook: L3D_TEST_ZERO_GRADS=1 checks after every optimizer step (taken or skipped) that the
 * gradient buffers the next step accumulates into are zero, and stops the run naming the rank
 * and the buffer where one is not; =poison makes one nonzero first (the check's negative case). */
static void test_zero_grads(struct l3d_trainer *t, int step) {
    const char *e = getenv("L3D_TEST_ZERO_GRADS");
    if (!e || !*e) return;
    for (int c = 0; c < t->tc->layout.v; c++) {
        const char *bad = l3d_dp_test_grads_nonzero(&t->dps[c], strcmp(e, "poison") == 0);
        if (bad)
            l3d_fatal(__FILE__, __LINE__, "L3D_TEST_ZERO_GRADS: rank %d, model chunk %d: the %s "
                      "are not zero after the optimizer of step %d", t->world->rank, c, bad,
                      step + 1);
    }
}

/* Test hook: L3D_TEST_NAN_AT_STEP=S:R (or S1-S2:R) poisons world rank R's gradients after their
 * reduction at step S (1-based; every step from S1 to S2), where only R sees the NaN: the skip
 * decision must still be the same on every rank. */
static bool test_nan_due(int step, int world_rank) {
    const char *e = getenv("L3D_TEST_NAN_AT_STEP");
    int s1, s2, r;
    if (!e) return false;
    if (sscanf(e, "%d-%d:%d", &s1, &s2, &r) != 3) {
        if (sscanf(e, "%d:%d", &s1, &r) != 2) return false;
        s2 = s1;
    }
    return world_rank == r && step + 1 >= s1 && step + 1 <= s2;
}

bool l3d_loss_scaler_update(struct l3d_loss_scaler *ls, const struct l3d_train_config *tc,
                            bool overflow) {
    if (!ls->on || !ls->dynamic) return false;
    double was = ls->scale;
    if (overflow) { /* Megatron-LM's DynamicGradScaler.update */
        ls->good_steps = 0;
        if (ls->hyst_left > 0) ls->hyst_left--;
        if (ls->hyst_left == 0) {
            ls->scale = fmax(ls->scale * tc->precision.ls.backoff, tc->precision.ls.min);
        } /* and again at each overflow until a growth resets the count */
    } else if (++ls->good_steps >= tc->precision.ls.window) {
        ls->good_steps = 0;
        ls->hyst_left = tc->precision.ls.hysteresis;
        ls->scale *= tc->precision.ls.growth;
    }
    return ls->scale != was;
}

int l3d_trainer_agree_skip(struct l3d_trainer *t, bool bad, double *stall_s) {
    struct l3d_watch *w = t->world->watch;
    double now = l3d_time_s(), since = now - t->agreed_at, stall = 0.0;
    /* a stall: a wait of a second or more that took half the time since the last agreement */
    if (w && w->longest_s >= 1.0 && w->longest_s >= 0.5 * since) {
        stall = w->longest_s;
        char self[96];
        if (w->name)
            w->name(w->name_ctx, t->world->rank, self, sizeof self);
        else
            snprintf(self, sizeof self, "rank %d", t->world->rank);
        fprintf(stderr, "llm3d: %s: stalled %.1f s at %s\n", self, stall, w->longest_what);
        fflush(stderr);
    }
    if (w) w->longest_s = 0.0;
    int size = t->world->size;
    double v[2] = {bad ? (double)(size - t->world->rank) : 0.0, stall}; /* MAX: the lowest */
    if (size > 1) l3d_comm_all_reduce(t->world, v, 2, L3D_F64, L3D_MAX, NULL);
    t->agreed_at = l3d_time_s();
    *stall_s = v[1];
    return v[0] > 0.0 ? size - (int)v[0] : -1;
}

/* The MoE layers' statistics of the step, every chunk's layers in the model's rows, summed over
 * the pipeline's stages and the dp x cp ranks (collective over them), into s. */
static void moe_step_stats(struct l3d_trainer *t, struct l3d_step_stats *s) {
    const struct l3d_model_spec *cfg = &t->tc->model;
    int64_t n = l3d_model_moe_stats_len(cfg);
    if (n == 0) return;
    s->moe_layers = cfg->L - cfg->moe.dense_layers;
    memset(t->moe_stats, 0, (size_t)n * sizeof(double));
    for (int c = 0; c < t->tc->layout.v; c++) l3d_gpt_moe_stats_take(t->chunks[c], t->moe_stats);
    sum_f64(t->topo->pp_comm, t->moe_stats, (int)n);
    sum_f64(t->topo->dpcp_comm, t->moe_stats, (int)n);
    struct l3d_moe_summary sum;
    l3d_moe_summarize(t->moe_stats, s->moe_layers, cfg->moe.experts, t->moe_load, &sum);
    s->moe_aux = sum.aux;
    s->moe_z = sum.z;
    s->moe_dropped = sum.dropped;
    s->moe_load_max = sum.load_max;
    s->moe_load = t->moe_load;
}

/* With the kernel split on: this step's share of the running totals into ring slot k, its
 * communication, and one trace row per family (its time, drawn from the step's start). */
static void kernel_split_take(struct l3d_trainer *t, const struct l3d_ksplit *before, int step,
                              int k, double t0, double comm_s) {
    if (!t->kp) return;
    struct l3d_ksplit *d = &t->kp[k];
    const struct l3d_ksplit *now = &t->kp_total.fam;
    if (t->kp_first_step < 0) { /* the first step (start-up effects) stays out of the totals */
        t->kp_first = t->kp_total;
        t->kp_first_step = step;
    }
    for (int f = 0; f < L3D_KF_N; f++) {
        d->s[f] = now->s[f] - before->s[f];
        d->bytes[f] = now->bytes[f] - before->bytes[f];
        d->calls[f] = now->calls[f] - before->calls[f];
        if (d->calls[f] > 0) l3d_pp_trace_add(&t->px, L3D_EV_KFAM, f, step + 1, t0, t0 + d->s[f]);
    }
    t->kp_comm_s[k] = comm_s;
}

void l3d_trainer_step(struct l3d_trainer *t, int step, struct l3d_step_stats *s) {
    const struct l3d_train_config *tc = t->tc;
    const struct l3d_topo *topo = t->topo;
    const struct l3d_pp_schedule *sched = &t->lay.sched;
    int v = t->tc->layout.v, pp = t->tc->layout.pp, r = topo->pp_rank;
    double t0 = l3d_time_s();
    const struct l3d_ksplit kp_before = t->kp_total.fam;
    for (int c = 0; c < v; c++) t->dps[c].comm_wait_s = t->dps[c].gather_wait_s = 0.0;
    t->tpc.comm_s = 0.0;
    t->tpc.bytes = 0;
    t->epc.comm_s = 0.0;
    t->epc.bytes = 0;
    for (int c = 0; c < v && topo->layout->cp > 1; c++) t->cps[c].comm_s = 0.0, t->cps[c].bytes = 0;
    /* the MoE statistics count this step's forwards only (not validation's) */
    int64_t nmoe = l3d_model_moe_stats_len(&tc->model);
    if (nmoe > 0 && !t->moe_stats) {
        t->moe_stats = l3d_calloc((size_t)nmoe * sizeof(double), "MoE statistics");
        t->moe_load = l3d_calloc((size_t)nmoe * sizeof(double), "MoE statistics");
        t->mline_cap = 4096 + 16 * (size_t)tc->model.L;
        t->mline = l3d_alloc(t->mline_cap, "metrics line");
    }
    for (int c = 0; c < v && nmoe > 0; c++) l3d_gpt_moe_stats_take(t->chunks[c], t->moe_stats);
    load_batches(t->ld, tc->layout.accum, t->BT, t->inp, t->tgt);
    const int32_t *inp, *tgt;
    int T;
    take_chunks(t, tc->layout.accum, &inp, &tgt, &T);
    /* fp16: the loss scaled before backward, so that small gradients stay above fp16's
     * subnormals; the gradients are divided by it again in the optimizer */
    const double scale = t->ls.on ? t->ls.scale : 1.0;
    double loss = l3d_pp_exec_run(&t->px, sched->acts[r], sched->n[r], tc->layout.accum, inp, tgt,
                                  tc->layout.micro_batch, T, (float)(t->dloss * scale));
    double pipe_s = t->px.span_s, idle = t->px.span_s - t->px.busy_s;
    l3d_pp_exec_finish_grads(&t->px);
    double t1 = l3d_time_s();
    if (test_nan_due(step, t->world->rank)) l3d_dp_test_poison(&t->dps[0]);
    l3d_comm_doing(t->world, "loss and gradient-norm sums", -1, -1);
    sum_f64(topo->pp_comm, &loss, 1); /* only the last stage has it */
    sum_f64(topo->dpcp_comm, &loss, 1); /* each ring rank's mean over its equal share */
    loss /= (double)tc->layout.accum * topo->layout->dp * topo->layout->cp;
    /* the global gradient norm: split tensors over TP, every stage, the tied wte once */
    double sq[3];
    for (int c = 0; c < v; c++)
        l3d_dp_grad_sumsq_add(&t->dps[c], &t->gsq, pp > 1 && !t->chunks[c]->shard.has_embedding);
    l3d_sumsq_take(&t->gsq, sq); /* the one copy of the sums to the host */
    if (tc->layout.zero > 0) sum_f64(t->dps[0].comm, sq, 3); /* the ranges' group (ZeRO's) */
    sum_f64(topo->tp_comm, sq, 1);
    sum_f64(topo->ep_comm, sq + 2, 1); /* the experts split over the EP group */
    sum_f64(topo->pp_comm, sq, 3);
    double norm = sqrt(sq[0] + sq[1] + sq[2]) / scale;
    float clip = l3d_clip_factor(norm, tc->adamw.grad_clip);
    float lr = l3d_lr_at(&t->lrs, step);
    /* a non-finite loss or norm on any rank: no update anywhere (agreed: the norm's sums do not
     * reach every rank, e.g. replicated tensors over TP, or DP without ZeRO) */
    l3d_comm_doing(t->world, "skip agreement", -1, -1);
    double stall_s;
    int bad_rank = l3d_trainer_agree_skip(t, !isfinite(loss) || !isfinite(norm), &stall_s);
    bool skip = bad_rank >= 0;
    l3d_comm_doing(t->world, "optimizer step", -1, -1);
    for (int c = 0; c < v; c++)
        if (skip)
            l3d_dp_skip_step(&t->dps[c]);
        else
            l3d_dp_step(&t->dps[c], &t->opts[c], t->be, lr, (float)(clip / scale));
    test_zero_grads(t, step);
    /* an fp16 overflow: the loss is finite (the same on every rank: summed) but a gradient is
     * not on some rank; every rank updates its scaler from the same agreed facts */
    bool overflow = t->ls.on && skip && isfinite(loss);
    if (t->ls.on) l3d_loss_scaler_update(&t->ls, tc, overflow);
    double t2 = l3d_time_s(), dt = t2 - t0, dt_opt = t2 - t1;
    l3d_pp_trace_add(&t->px, L3D_EV_OPTIMIZER, 0, step + 1, t1, t2);
    l3d_pp_trace_add(&t->px, L3D_EV_STEP, 0, step + 1, t0, t2);
    /* the pipeline's idle fraction, averaged over the ranks */
    double b[2] = {idle, pipe_s};
    l3d_comm_doing(t->world, "pipeline bubble sum", -1, -1);
    if (pp > 1) sum_f64(t->world, b, 2);
    double cw = 0.0, gw = 0.0;
    for (int c = 0; c < v; c++) {
        cw += t->dps[c].comm_wait_s;
        gw += t->dps[c].gather_wait_s;
    }
    *s = (struct l3d_step_stats){.loss = loss, .norm = norm, .seconds = dt, .optimizer_s = dt_opt,
                                 .comm_wait_s = cw, .gather_wait_s = gw, .lr = lr, .val_loss = NAN,
                                 .bubble = pp > 1 && b[1] > 0 ? b[0] / b[1] : 0.0,
                                 .skipped = skip, .skip_rank = bad_rank, .stall_s = stall_s,
                                 .overflow = overflow, .loss_scale = t->ls.on ? scale : 0.0};
    l3d_comm_doing(t->world, "MoE statistics sum", -1, -1);
    moe_step_stats(t, s);
    s->tokens_per_s = (double)t->tokens_step / dt;
    s->mfu = s->tokens_per_s * t->flops_tok / t->peak;
    int k = step % t->n_times; /* the rings of the last steps (train-impl.h) */
    t->bub[k] = s->bubble;
    t->step_s[k] = dt;
    t->opt_s[k] = dt_opt;
    t->comm_s[k] = cw;
    double tpcp = t->tpc.comm_s;
    for (int c = 0; c < v && topo->layout->cp > 1; c++) tpcp += t->cps[c].comm_s;
    kernel_split_take(t, &kp_before, step, k, t0, cw + gw + tpcp);
}

void l3d_trainer_validate(struct l3d_trainer *t, int step, struct l3d_step_stats *s) {
    const struct l3d_train_config *tc = t->tc;
    s->val_loss = NAN;
    if (!t->vld || tc->val_every <= 0 || ((step + 1) % tc->val_every != 0 && step + 1 != tc->steps))
        return;
    const struct l3d_pp_schedule *vs = &t->lay.vsched;
    int r = t->topo->pp_rank;
    l3d_comm_doing(t->world, "validation", -1, -1);
    l3d_loader_set_pos(t->vld, (struct l3d_loader_pos){0, 0});
    load_batches(t->vld, tc->val_batches, t->BT, t->inp, t->tgt);
    const int32_t *inp, *tgt;
    int T;
    take_chunks(t, tc->val_batches, &inp, &tgt, &T);
    double sum = l3d_pp_exec_run(&t->px, vs->acts[r], vs->n[r], tc->val_batches, inp, tgt,
                                 tc->layout.micro_batch, T, 0.0f);
    sum_f64(t->topo->pp_comm, &sum, 1);
    sum_f64(t->topo->dpcp_comm, &sum, 1);
    s->val_loss = (float)(sum / tc->val_batches / t->topo->layout->dp / t->topo->layout->cp);
}
