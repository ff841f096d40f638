/* The training loop (include/llm3d/train.h): builds the trainer on the runtime, runs the steps
 * (step.c), reports (report.c), saves. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/ckpt.h"
#include "llm3d/cp.h"
#include "llm3d/ep.h"
#include "llm3d/hf.h"
#include "train/resume.h"
#include "train/signals.h"
#include "train/trace.h"
#include "train/train-impl.h"

void l3d_train_config_defaults(struct l3d_train_config *tc) {
    memset(tc, 0, sizeof *tc);
    l3d_run_spec_defaults(&tc->spec);
    l3d_model_preset(&tc->model, "d6");
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
    tc->progress = L3D_PROGRESS_POLL; /* measured fastest here: docs/DESIGN.md, "Progress" */
    tc->keep = 3;
    tc->timeout_s = 600;
    tc->max_skipped = 10;
}

/* Every rank learns whether any rank failed, before the next collective or large allocation, so a
 * rank never waits in a collective for one that gave up. The lowest failing rank reports. */
static l3d_status agree(struct l3d_comm *world, l3d_status st, struct l3d_train_result *res) {
    return l3d_comm_agree(world, st, &res->report_error);
}

/* Ends the fp32 views; loaded: they were filled with new parameters, which become the master
 * weights and the model's 16-bit ones (l3d_dp_fp32_params_done; a chunk streamed a piece at a
 * time took each piece as it came). */
static void views_end(struct l3d_trainer *t, bool loaded) {
    for (int c = 0; c < t->tc->layout.v && t->p32; c++) {
        if (t->dps[c].stream) l3d_dp_fp32_stream_end(&t->dps[c]);
        if (t->p32[c]) l3d_dp_fp32_params_done(&t->dps[c], &t->opts[c], t->p32[c], loaded);
        t->p32[c] = NULL;
        t->pieces[c] = (struct l3d_ckpt_pieces){0};
    }
}

static const float *piece_get(void *ctx, int64_t off, int64_t n) {
    return l3d_dp_fp32_stream_get(ctx, off, n);
}
static void piece_put(void *ctx, int64_t off, int64_t n, const float *host) {
    l3d_dp_fp32_stream_put(ctx, off, n, host);
}

/* fp32 views of every chunk's parameters in t->vptr (collective: the ranks agree that each has
 * its buffer); gather: for saving, filled with the master weights of every DP rank's range. In
 * fp32 the views are the chunks' own parameters. Where no rank holds them whole (ZeRO-3, ZeRO-2
 * in mixed precision: l3d_dp_fp32_streamed) a view has none: its parameters go a piece at a time
 * (t->pieces[c]; saving: DP rank 0 pulls them, the other ranks' sends posted here). */
static l3d_status views_begin(struct l3d_trainer *t, bool gather, bool rows,
                              struct l3d_train_result *res) {
    int v = t->tc->layout.v;
    l3d_status st = L3D_OK;
    size_t bytes = l3d_ckpt_stage_bytes(); /* a piece: the checkpoint's staging */
    for (int c = 0; c < v; c++) {
        if (!l3d_dp_fp32_streamed(&t->dps[c], &t->opts[c])) {
            t->p32[c] = l3d_dp_fp32_params(&t->dps[c], &t->opts[c]);
            continue;
        }
        if (rows) continue; /* --out pulls rows itself (out.c) */
        l3d_status sc = l3d_dp_fp32_stream_begin(&t->dps[c], &t->opts[c], bytes, gather);
        if (st == L3D_OK) st = sc;
    }
    if ((st = agree(t->world, st, res)) != L3D_OK) {
        views_end(t, false);
        return st;
    }
    for (int c = 0; c < v; c++) {
        struct l3d_dp *dp = &t->dps[c];
        if (dp->stream) {
            l3d_dp_fp32_stream_send(dp);
            struct l3d_ckpt_pieces *q = &t->pieces[c];
            *q = (struct l3d_ckpt_pieces){.piece = l3d_dp_fp32_piece(dp->m->num_params, bytes),
                                          .get = piece_get, .put = piece_put, .ctx = dp};
            l3d_dp_fp32_stream_want(dp, &q->lo, &q->hi);
        } else if (gather && t->p32[c]) { /* not a chunk whose rows --out pulls */
            l3d_dp_fp32_gather(dp, &t->opts[c], t->p32[c]);
        }
        l3d_gpt_fp32_view(t->chunks[c], t->p32[c], &t->views[c]);
        t->vptr[c] = &t->views[c];
    }
    return L3D_OK;
}

/* A checkpoint of step (when due and not saved yet) from the fp32 views. */
static l3d_status save_ckpt(struct l3d_trainer *t, struct l3d_train_ckpt *ck, int step,
                            struct l3d_train_result *res) {
    if (!ck->root[0] || ck->last_saved == step) return L3D_OK;
    ck->ls_scale = t->ls.on && t->ls.dynamic ? t->ls.scale : 0.0;
    ck->ls_good = t->ls.good_steps;
    ck->ls_hyst = t->ls.hyst_left;
    l3d_status st = views_begin(t, true, false, res);
    if (st != L3D_OK) return st;
    st = l3d_train_ckpt_save(ck, t->tc, t->world, t->vptr, t->opts, t->pieces, t->tc->layout.v, t->ld,
                             step, &res->report_error);
    views_end(t, false);
    return st;
}

/* The error of --max-skipped-steps, reached at step (0-based) after n non-finite steps in a row.
 * It names the checkpoint a resume takes: skipped steps are saved like any other (same weights,
 * the data position moved on), so that is not the last good step's. */
static l3d_status diverged(const struct l3d_train_config *tc, const struct l3d_train_ckpt *ck,
                           int step, int n) {
    char saved[128];
    if (!ck->root[0])
        snprintf(saved, sizeof saved, "nothing was saved (no --out or --ckpt-dir)");
    else if (ck->last_saved < 0)
        snprintf(saved, sizeof saved, "this run saved no checkpoint");
    else
        snprintf(saved, sizeof saved, "the last checkpoint saved is step %lld (skipped steps "
                 "leave the weights as they were)", (long long)ck->last_saved);
    return l3d_error(L3D_ERR_INTERNAL, "steps %d to %d: the loss or gradient norm was not finite "
                     "%d times in a row (--max-skipped-steps %d): training diverged; %s: lower "
                     "--lr or raise --warmup, and resume", step + 2 - n, step + 1, n,
                     tc->max_skipped, saved);
}

/* Data and output: files may differ between nodes, so the caller agrees after. */
static l3d_status open_data(struct l3d_trainer *t) {
    const struct l3d_train_config *tc = t->tc;
    l3d_status st = l3d_data_open(&t->train, tc->train_pattern, tc->model.V);
    struct l3d_loader_config lc = {.B = tc->layout.micro_batch,
                                   .T = tc->layout.seq,
                                   .random = tc->random_batches,
                                   .seed = tc->seed,
                                   .dp_rank = t->topo->dp_rank,
                                   .dp_size = t->topo->layout->dp};
    if (st == L3D_OK) st = l3d_loader_init(&t->ld, t->train, &lc);
    if (st == L3D_OK && tc->val_pattern) {
        st = l3d_data_open(&t->val, tc->val_pattern, tc->model.V);
        struct l3d_loader_config vc = lc;
        vc.random = false;
        if (st == L3D_OK) st = l3d_loader_init(&t->vld, t->val, &vc);
    }
    if (st == L3D_OK && tc->out_dir && t->lead) st = l3d_mkdir_p(tc->out_dir);
    return st;
}

/* The initial weights of an fp32 model or view: --init-from, else the seed's; a view without
 * parameters (views_begin) takes them a piece at a time through chunk c's stream. */
static l3d_status init_one(struct l3d_trainer *t, int c, struct l3d_gpt *m) {
    if (!m->params && t->tc->init_from)
        return l3d_model_file_load_pieces(t->tc->init_from, m, &t->pieces[c]);
    if (!m->params) {
        l3d_dp_fp32_stream_seed(&t->dps[c], t->tc->seed);
        return L3D_OK;
    }
    if (t->tc->init_from) return l3d_model_file_load(t->tc->init_from, m);
    l3d_gpt_init_weights(m, t->tc->seed);
    return L3D_OK;
}

/* Where the chunks' gradients live: ZeRO-2's slots, ZeRO-3's slots without resident parameters. */
static enum l3d_grad_mode grad_mode(int zero) {
    return zero == 3 ? L3D_GRADS_SHARDED : zero == 2 ? L3D_GRADS_SLOTS : L3D_GRADS_FLAT;
}

/* Whether the initial weights go through the fp32 views (init_weights) rather than straight into
 * the chunks: mixed precision (master weights) and ZeRO-3 (no whole parameter buffer). */
static bool through_views(const struct l3d_train_config *tc) {
    return tc->precision.param != L3D_F32 || tc->layout.zero == 3;
}

/* This rank's model chunks (chunk c is virtual stage c pp + pp_rank), their weights, TP hooks and
 * data-parallel states; the caller agrees after. */
static l3d_status build_chunks(struct l3d_trainer *t) {
    const struct l3d_train_config *tc = t->tc;
    const struct l3d_topo *topo = t->topo;
    int v = t->tc->layout.v, pp = t->tc->layout.pp;
    l3d_status st = L3D_OK;
    t->chunks = l3d_calloc((size_t)v * sizeof *t->chunks, "model chunks");
    t->dps = l3d_calloc((size_t)v * sizeof *t->dps, "model chunks");
    t->opts = l3d_calloc((size_t)v * sizeof *t->opts, "model chunks");
    t->views = l3d_calloc((size_t)v * sizeof *t->views, "model chunks");
    t->vptr = l3d_calloc((size_t)v * sizeof *t->vptr, "model chunks");
    t->p32 = l3d_calloc((size_t)v * sizeof *t->p32, "model chunks");
    t->pieces = l3d_calloc((size_t)v * sizeof *t->pieces, "model chunks");
    t->cps = l3d_calloc((size_t)v * sizeof *t->cps, "model chunks");
    for (int c = 0; c < v && st == L3D_OK; c++) {
        struct l3d_shard sh = l3d_train_layout_shard(
            &t->lay, tc, l3d_pp_vstage(tc->layout.schedule, pp, topo->pp_rank, c), topo->tp_rank);
        l3d_shard_set_experts(&tc->model, &sh, tc->layout.ep, topo->ep_rank);
        int slots = t->lay.sched.slots[topo->pp_rank * v + c];
        int T = tc->layout.seq / t->tc->layout.cp; /* this rank's rows of each sequence */
        st = l3d_gpt_init_dt(&t->chunks[c], &tc->model, &sh, t->be, tc->layout.micro_batch, T,
                             grad_mode(tc->layout.zero), slots, tc->layout.recompute,
                             tc->precision.param);
        if (st == L3D_OK && l3d_pp_split(t->lay.sched.kind)) { /* W's inputs, B to W */
            int ws = t->lay.sched.wslots[topo->pp_rank * v + c];
            bool once = l3d_pp_fb_slots(&t->lay.sched, topo->pp_rank, c) == 1;
            st = l3d_gpt_split_init(t->chunks[c], ws, once);
            size_t b = l3d_gpt_wstash_bytes(&tc->model, &sh, tc->layout.micro_batch, T, ws,
                                            tc->layout.recompute, tc->layout.zero >= 2,
                                            tc->precision.param);
            t->act_formula += b; /* the allocation is in the chunk's act_bytes */
            if (once)
                t->act_formula -= (slots - 1) * l3d_gpt_head_act_bytes(
                    &tc->model, &sh, tc->layout.micro_batch, T, tc->precision.param);
        }
        if (st != L3D_OK) break;
        t->act_bytes += t->chunks[c]->act_bytes;
        t->act_formula += l3d_gpt_act_bytes_dt(&tc->model, &sh, tc->layout.micro_batch, T, slots,
                                               tc->layout.recompute, !t->chunks[c]->attn_naive,
                                               tc->precision.param);
        t->n_local += t->chunks[c]->num_params;
        /* fp32: the weights now, into the parameters, while the host staging of the initial
         * values is the largest thing allocated (before the optimizer state, as the memory plan
         * has it); mixed precision: through the fp32 views once the master weights exist */
        if (!through_views(tc)) st = init_one(t, c, t->chunks[c]);
        if (st != L3D_OK) break;
        l3d_tp_attach(&t->tpc, t->chunks[c], topo->tp_comm, !tc->dp_blocking);
        if (topo->layout->cp > 1 && (st = l3d_cp_attach(&t->cps[c], t->chunks[c], topo->cp_comm,
                                                             tc->precision.cp_fp32)))
            break;
        l3d_ep_attach(&t->epc, t->chunks[c], topo->ep_comm, topo->cp_comm);
        /* the gradients are summed over the replicas and the ring (the weights are the same on
         * both, each rank's gradient a part of the sequences'): ZeRO shards over dp x cp, or
         * with expert parallelism over the ranks holding the same experts (l3d_dp_expert_groups) */
        struct l3d_comm *dpc = topo->ep_comm && tc->layout.zero > 0 ? topo->edp_comm
                                                                    : topo->dpcp_comm;
        st = l3d_dp_init(&t->dps[c], t->chunks[c], dpc, tc->layout.zero, tc->layout.bucket_bytes,
                         !tc->dp_blocking);
        if (st != L3D_OK) break;
        t->ndp++;
        if (topo->ep_comm) l3d_dp_expert_groups(&t->dps[c], topo->ep_comm, topo->edp_comm);
        st = l3d_dp_reduce_in(&t->dps[c], tc->precision.reduce);
        if (st == L3D_OK && tc->layout.zero == 3)
            st = l3d_dp_zero3_prefetch(&t->dps[c], tc->layout.zero3_prefetch);
        if (st != L3D_OK) break;
        if (!tc->dp_blocking && tc->progress == L3D_PROGRESS_POLL)
            l3d_dp_poll_kernels(&t->dps[c]);
        int64_t own_start, own_count;
        l3d_dp_opt_range(&t->dps[c], &own_start, &own_count);
        st = l3d_adamw_init_dt(&t->opts[c], t->be, &tc->adamw, own_start, own_count,
                               tc->precision.param);
    }
    return st;
}

/* The fp32 views (views_begin) the caller resumes into, then ends (views_end with loaded); in
 * mixed precision, with the initial weights in them. */
static l3d_status init_weights(struct l3d_trainer *t, struct l3d_train_result *res) {
    if (l3d_train_zero3_from_seed(t->tc)) { /* each rank its range: no views, nothing to resume */
        for (int c = 0; c < t->tc->layout.v; c++)
            l3d_dp_zero3_init_weights(&t->dps[c], &t->opts[c], t->tc->seed);
        return L3D_OK;
    }
    l3d_status st = views_begin(t, false, false, res);
    for (int c = 0; c < t->tc->layout.v && st == L3D_OK && through_views(t->tc); c++)
        st = init_one(t, c, t->vptr[c]);
    return agree(t->world, st, res);
}

static void trainer_free(struct l3d_trainer *t) {
    int v = t->tc->layout.v;
    views_end(t, false);
    if (t->metrics) fclose(t->metrics);
    l3d_tfevents_close(&t->tb);
    l3d_free(t->inp);
    l3d_free(t->tgt);
    l3d_free(t->cinp);
    l3d_free(t->ctgt);
    l3d_free(t->step_s);
    l3d_free(t->opt_s);
    l3d_free(t->comm_s);
    l3d_free(t->bub);
    if (t->kp) l3d_be_profile(t->be, NULL);
    l3d_free(t->kp);
    l3d_free(t->kp_comm_s);
    l3d_free(t->moe_stats);
    l3d_free(t->moe_load);
    l3d_free(t->mline);
    if (t->px_up) l3d_pp_exec_free(&t->px);
    for (int c = 0; c < v && t->opts; c++)
        if (t->opts[c].m) l3d_adamw_free(&t->opts[c]);
    l3d_sumsq_free(&t->gsq);
    for (int c = 0; c < t->ndp; c++) l3d_dp_free(&t->dps[c]);
    for (int c = 0; c < v && t->cps; c++) l3d_cp_detach(&t->cps[c]);
    l3d_free(t->cps);
    for (int c = 0; c < v && t->chunks; c++) l3d_gpt_free(t->chunks[c]);
    l3d_free(t->chunks);
    l3d_free(t->dps);
    l3d_free(t->opts);
    l3d_free(t->views);
    l3d_free(t->vptr);
    l3d_free(t->p32);
    l3d_free(t->pieces);
    l3d_train_layout_free(&t->lay);
    l3d_loader_free(t->vld);
    l3d_loader_free(t->ld);
    l3d_data_free(t->val);
    l3d_data_free(t->train);
}

/* The layout (checked, its memory counted, its schedules built), where the ranks lie, the run
 * directory, the runtime's communicators and the data. tcv is t->tc, writable: its layout is
 * resolved here (l3d_train_layout_init), once, and read as it is from then on. Collective; every failure is agreed (or reported by the
 * lead, placement), so every rank returns the same status. */
static l3d_status trainer_setup(struct l3d_trainer *t, struct l3d_train_config *tcv,
                                struct l3d_runtime *rt, struct l3d_train_result *res) {
    const struct l3d_train_config *tc = tcv;
    struct l3d_comm *world = t->world;
    if (world->watch) world->watch->timeout_s = tc->timeout_s; /* every wait bounded from here */
    /* Checks that need no communication: every rank reaches the same verdict. */
    l3d_status st = l3d_train_layout_init(&t->lay, tcv, world->size); /* tcv's layout resolved */
    if ((st = agree(world, st, res)) != L3D_OK) return st;
    if ((st = l3d_train_memory_check(tc, world, &t->mem_figure,
                                     &res->report_error)) != L3D_OK) return st;
    st = l3d_train_layout_build(&t->lay, tc); /* the schedules, whose bytes the check counted */
    if ((st = agree(world, st, res)) != L3D_OK) return st;
    if ((st = l3d_train_placement(tc, world, t->lead)) != L3D_OK) {
        res->report_error = t->lead;
        return st;
    }
    if ((st = l3d_train_run_claim(tc, world, &t->run_id, &res->report_error)) != L3D_OK) return st;
    st = l3d_runtime_layout(rt, &tc->layout);
    if (st != L3D_OK) return st;
    t->topo = &rt->topo;
    st = open_data(t);
    return agree(world, st, res);
}

/* The model chunks, the gradient norm's buffer and the initial weights, left in the fp32 views
 * (views_begin) for the resume; the loss scaler's start. Collective, agreed. */
static l3d_status trainer_build(struct l3d_trainer *t, struct l3d_train_result *res) {
    const struct l3d_train_config *tc = t->tc;
    l3d_status st = build_chunks(t);
    if (st == L3D_OK) st = l3d_sumsq_init(&t->gsq, t->be, 3); /* split, replicated, experts */
    if ((st = agree(t->world, st, res)) != L3D_OK) return st;
    if ((st = init_weights(t, res)) != L3D_OK) return st;
    t->ls = (struct l3d_loss_scaler){
        .on = tc->precision.param == L3D_F16, .dynamic = tc->precision.ls.fixed <= 0,
        .scale = tc->precision.ls.fixed > 0 ? tc->precision.ls.fixed : tc->precision.ls.init,
        .hyst_left = tc->precision.ls.hysteresis};
    return L3D_OK;
}

/* Checkpoints: ck set up (*ck_up: the caller frees it, also on failure), resume (any layout) into
 * the fp32 views, which end here, the resumed loss scale, then the metrics file (a resumed run
 * keeps its lines). *start_step: the steps already done. Collective, agreed. */
static l3d_status trainer_resume(struct l3d_trainer *t, struct l3d_train_ckpt *ck, bool *ck_up,
                                 int *start_step, struct l3d_train_result *res) {
    const struct l3d_train_config *tc = t->tc;
    struct l3d_comm *world = t->world;
    l3d_train_ckpt_init(ck, tc, t->topo, world);
    ck->run_id = t->run_id;
    *ck_up = true;
    *start_step = 0;
    l3d_status st = l3d_train_ckpt_resume(ck, tc, world, t->vptr, t->opts, t->pieces, t->tc->layout.v,
                                          t->ld, start_step, &res->report_error);
    if (st != L3D_OK) return st;
    /* --async-save's staging, sized by the views (allocated here, once) */
    st = l3d_train_ckpt_async_init(ck, tc, t->vptr, t->opts,
                                   l3d_dp_fp32_streamed(&t->dps[0], &t->opts[0]));
    if ((st = agree(world, st, res)) != L3D_OK) return st;
    views_end(t, true); /* the weights, loaded or initialised: master and 16-bit copies */
    if (t->ls.on && t->ls.dynamic && ck->ls_scale > 0) { /* the resumed run's loss scale */
        t->ls.scale = ck->ls_scale;
        t->ls.good_steps = ck->ls_good;
        t->ls.hyst_left = ck->ls_hyst;
    }
    res->start_step = *start_step;
    if (t->lead)
        st = l3d_train_ckpt_open_metrics(tc, *start_step, t->run_id, &t->metrics,
                                         t->metrics_path, sizeof t->metrics_path);
    if (t->lead && tc->tensorboard && st == L3D_OK) /* a resumed run: a new file beside */
        st = l3d_tfevents_open(&t->tb, tc->tensorboard);
    return agree(world, st, res);
}

/* The pipeline executor (with room for the trace), the step's buffers, the peak FLOP/s, the
 * schedule and the run's description (report_start). Collective, agreed. */
static l3d_status trainer_prepare(struct l3d_trainer *t, struct l3d_train_result *res) {
    const struct l3d_train_config *tc = t->tc;
    const struct l3d_topo *topo = t->topo;
    struct l3d_comm *world = t->world;
    int v = t->tc->layout.v, pp = t->tc->layout.pp;
    int64_t trace_cap = 0;
    if (tc->trace_path) {
        trace_cap = ((int64_t)t->lay.sched.n[topo->pp_rank] + 4) * tc->steps + 64;
        if (t->lay.vsched.n) trace_cap += (int64_t)t->lay.vsched.n[topo->pp_rank] * tc->steps;
        trace_cap += (int64_t)L3D_KF_N * tc->steps; /* the kernel families' rows */
        if (trace_cap > (1 << 22)) trace_cap = 1 << 22; /* 128 MiB of events at most */
    }
    l3d_status st = l3d_pp_exec_init(&t->px, t->chunks, v, t->dps, topo->pp_comm,
                                     topo->embed_comm, trace_cap);
    t->px.kind = t->lay.sched.kind;
    t->px_up = true;
    if ((st = agree(world, st, res)) != L3D_OK) return st;
    t->BT = (int64_t)tc->layout.micro_batch * tc->layout.seq;
    int nbatch = tc->layout.accum > tc->val_batches ? tc->layout.accum : tc->val_batches;
    t->inp = l3d_alloc((size_t)(t->BT * nbatch) * sizeof(int32_t), "batch");
    t->tgt = l3d_alloc((size_t)(t->BT * nbatch) * sizeof(int32_t), "batch");
    if (topo->layout->cp > 1) { /* this ring rank's two chunks of every sequence */
        t->cinp = l3d_alloc((size_t)(t->BT / topo->layout->cp * nbatch) * sizeof(int32_t), "batch");
        t->ctgt = l3d_alloc((size_t)(t->BT / topo->layout->cp * nbatch) * sizeof(int32_t), "batch");
    }
    t->n_times = tc->steps < L3D_TRAIN_TIMES_KEPT ? tc->steps : L3D_TRAIN_TIMES_KEPT;
    t->step_s = l3d_calloc((size_t)t->n_times * sizeof(double), "step times");
    t->opt_s = l3d_calloc((size_t)t->n_times * sizeof(double), "step times");
    t->comm_s = l3d_calloc((size_t)t->n_times * sizeof(double), "step times");
    t->bub = l3d_calloc((size_t)t->n_times * sizeof(double), "step times");
    if (tc->kernel_split || tc->trace_path) {
        t->kp = l3d_calloc((size_t)t->n_times * sizeof *t->kp, "step times");
        t->kp_comm_s = l3d_calloc((size_t)t->n_times * sizeof(double), "step times");
        l3d_be_profile(t->be, &t->kp_total);
        t->kp_first_step = -1;
    }

    /* the peak of one rank's cores, times the ranks: measured on rank 0, shared */
    double peak = tc->peak_flops;
    if (peak <= 0) {
        peak = t->lead ? l3d_be_peak_flops(t->be, tc->precision.param) : 0.0;
        if (world->size > 1) l3d_comm_broadcast(world, &peak, 1, L3D_F64, 0, NULL);
    }
    t->peak = peak * world->size;
    t->flops_tok = l3d_gpt_flops_per_token(&tc->model, tc->layout.seq);
    t->tokens_step = t->BT * tc->layout.accum * topo->layout->dp; /* BT: whole sequences, over the ring */
    t->dloss = 1.0f / (float)t->tokens_step;
    t->lrs = (struct l3d_lr_schedule){.max_lr = tc->lr, .min_lr = tc->min_lr,
                                      .warmup_steps = tc->warmup_steps, .total_steps = tc->steps};
    /* the schedule's own: zb-h1's from its simulated timeline (unit F, B and W) */
    res->bubble_theory = pp > 1 ? l3d_pp_schedule_bubble(t->lay.sched.kind, pp, v,
                                                         tc->layout.accum) : 0.0;
    /* the largest activation memory of any rank, and its closed form */
    double act_max[2] = {(double)t->act_bytes, (double)t->act_formula};
    if (world->size > 1) l3d_comm_all_reduce(world, act_max, 2, L3D_F64, L3D_MAX, NULL);
    res->act_bytes = (size_t)act_max[0];
    res->act_bytes_formula = (size_t)act_max[1];
    l3d_train_report_start(t, res);
    return L3D_OK;
}

/* One step's outcome into res: an fp16 overflow (the scale backs off), a skipped update (counted
 * in *skipped_run; --max-skipped-steps in a row is a divergence, reported by the lead, the same
 * verdict on every rank since the skip was agreed), or the loss. */
static l3d_status count_step(struct l3d_trainer *t, const struct l3d_train_ckpt *ck, int step,
                             int start_step, const struct l3d_step_stats *s, int *skipped_run,
                             struct l3d_train_result *res) {
    const struct l3d_train_config *tc = t->tc;
    if (s->overflow && s->loss_scale > tc->precision.ls.min && t->ls.dynamic) {
        /* fp16: the scale was too large; it backs off (not a divergence) */
        res->skipped++;
        res->overflows++;
        if (t->lead)
            printf("step %d: gradient overflow at loss scale %.0f (rank %d): update skipped "
                   "on every rank; loss scale now %.0f\n", step + 1, s->loss_scale,
                   s->skip_rank, t->ls.scale);
    } else if (s->skipped) { /* agreed by every rank: no update was made */
        res->skipped++;
        (*skipped_run)++;
        if (t->lead)
            printf("step %d: rank %d's loss or gradient norm is not finite: update skipped "
                   "on every rank (%d in a row, %d in all; --max-skipped-steps %d)\n",
                   step + 1, s->skip_rank, *skipped_run, res->skipped, tc->max_skipped);
        if (*skipped_run >= tc->max_skipped) {
            res->report_error = t->lead;
            return diverged(tc, ck, step, *skipped_run);
        }
    } else {
        *skipped_run = 0;
        if (step == start_step || !isfinite(res->first_loss)) res->first_loss = (float)s->loss;
        res->last_loss = (float)s->loss;
    }
    return L3D_OK;
}

/* The steps from start_step: each one trained, validated when due, reported, checkpointed when
 * due; a preemption signal on any rank saves and stops (exit status 0). *end_step: the step
 * after the last one done. Collective; a failure is agreed. */
static l3d_status train_steps(struct l3d_trainer *t, struct l3d_train_ckpt *ck, int start_step,
                              int *end_step, struct l3d_train_result *res) {
    const struct l3d_train_config *tc = t->tc;
    struct l3d_comm *world = t->world;
    for (int c = 0; c < t->tc->layout.v; c++) l3d_gpt_zero_grad(t->chunks[c]);
    if (world->size > 1) l3d_comm_barrier(world);
    t->px.origin = l3d_time_s(); /* the trace's zero, right after a barrier on every rank */
    t->agreed_at = t->px.origin;
    *end_step = tc->steps;
    int skipped_run = 0;
    l3d_status st;
    for (int step = start_step; step < tc->steps; step++) {
        struct l3d_step_stats s;
        if (world->watch) world->watch->step = step + 1;
        l3d_trainer_step(t, step, &s);
        if ((st = count_step(t, ck, step, start_step, &s, &skipped_run, res)) != L3D_OK)
            return st;
        l3d_trainer_validate(t, step, &s);
        if (!isnan(s.val_loss)) res->last_val_loss = s.val_loss;
        st = l3d_train_report_step(t, step, &s);
        if ((st = agree(world, st, res)) != L3D_OK) return st;
        /* checkpoint: periodic, or a preemption signal on any rank (then stop, exit status 0,
         * once the checkpoint is written); a background save closed when every rank wrote it */
        l3d_comm_doing(world, "end-of-step signal check and checkpoint", -1, -1);
        if ((st = l3d_train_ckpt_poll(ck, world, false, &res->report_error)) != L3D_OK) return st;
        res->stopped_by = l3d_train_stop_requested(world);
        if (res->stopped_by || l3d_train_ckpt_due(ck, tc, step + 1))
            if ((st = save_ckpt(t, ck, step + 1, res)) != L3D_OK) return st;
        if (res->stopped_by &&
            (st = l3d_train_ckpt_poll(ck, world, true, &res->report_error)) != L3D_OK)
            return st;
        if (res->stopped_by) {
            *end_step = step + 1;
            if (t->lead)
                printf("signal %d: stopped after step %d%s\n", res->stopped_by, *end_step,
                       ck->root[0] ? "; continue with --resume auto"
                                   : " (no --out: nothing saved)");
            break;
        }
    }
    return L3D_OK;
}

/* After the steps: the memory peak, the last checkpoint, the medians, the trace, model.bin (not
 * after a signal) and the summary. Collective, agreed. */
static l3d_status train_finish(struct l3d_trainer *t, struct l3d_train_ckpt *ck, int start_step,
                               int end_step, struct l3d_train_result *res) {
    const struct l3d_train_config *tc = t->tc;
    const struct l3d_topo *topo = t->topo;
    struct l3d_comm *world = t->world;
    /* the fullest rank's accounted peak while training (before model.bin's gather; what llm3d
     * plan predicts) */
    if (world->watch) world->watch->step = 0;
    l3d_comm_doing(world, "end of training (checkpoint, model.bin, trace)", -1, -1);
    double mem_peak = (double)l3d_mem_peak();
    if (world->size > 1) l3d_comm_all_reduce(world, &mem_peak, 1, L3D_F64, L3D_MAX, NULL);
    res->mem_peak = (size_t)mem_peak;
    /* the last step's checkpoint (also when a resumed run had no step left: a re-sliced copy) */
    l3d_status st;
    if (!res->stopped_by && tc->save_every > 0 && (st = save_ckpt(t, ck, end_step, res)) != L3D_OK)
        return st;
    if ((st = l3d_train_ckpt_poll(ck, world, true, &res->report_error)) != L3D_OK) return st;
    res->steps = end_step;
    l3d_train_report_result(t, start_step, end_step, res);
    st = L3D_OK;
    if (tc->trace_path) {
        st = l3d_train_trace_write(&t->px, world, tc->trace_path, topo->tp_rank, topo->pp_rank,
                                   topo->dp_rank);
        if (st == L3D_OK && t->lead && !tc->quiet) printf("trace: %s\n", tc->trace_path);
    }
    if ((st = agree(world, st, res)) != L3D_OK) return st;
    if (tc->out_dir && !res->stopped_by) {
        if ((st = views_begin(t, true, true, res)) != L3D_OK) return st;
        st = l3d_train_save_out(t);
        views_end(t, false);
    }
    if ((st = agree(world, st, res)) != L3D_OK) return st;
    l3d_train_report_end(t, res);
    return L3D_OK;
}

/* Each part returns the same status on every rank (agreed), so all ranks leave at the same
 * point, and whatever was built is freed in one place: the checkpoint state, then the trainer. */
l3d_status l3d_train_run(const struct l3d_train_config *tc_in, struct l3d_runtime *rt,
                         struct l3d_train_result *res) {
    memset(res, 0, sizeof *res);
    /* a file-size limit (ulimit -f) makes write fail with EFBIG, reported like any write error,
     * instead of killing the process (SIGXFSZ's default) */
    signal(SIGXFSZ, SIG_IGN);
    struct l3d_train_config tcv = *tc_in; /* its layout resolved by trainer_setup */
    struct l3d_trainer tr = {.tc = &tcv, .world = rt->world, .be = rt->be,
                             .comm_name = rt->comm_name, .lead = rt->world->rank == 0};
    struct l3d_train_ckpt ck;
    bool ck_up = false;
    int start_step = 0, end_step = 0;
    l3d_status st = trainer_setup(&tr, &tcv, rt, res);
    if (st == L3D_OK) st = trainer_build(&tr, res);
    if (st == L3D_OK) st = trainer_resume(&tr, &ck, &ck_up, &start_step, res);
    if (st == L3D_OK) st = trainer_prepare(&tr, res);
    if (st == L3D_OK) st = train_steps(&tr, &ck, start_step, &end_step, res);
    if (st == L3D_OK) st = train_finish(&tr, &ck, start_step, end_step, res);
    if (ck_up) l3d_train_ckpt_free(&ck);
    trainer_free(&tr);
    return st;
}
