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
#include "llm3d/pipeline.h"
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
    tc->pp_schedule = L3D_PP_1F1B;
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

/* The shard of virtual stage vs (of S), on TP rank tp_rank: its layers, TP slice, ends. */
static struct l3d_shard stage_shard(const struct l3d_train_config *tc, const int *layers, int S,
                                    int vs, int tp, int tp_rank) {
    struct l3d_shard sh = l3d_shard_full(&tc->model);
    if (tp > 1)
        L3D_ASSERT(l3d_tp_shard(&tc->model, tp, tp_rank, tc->sequence_parallel, &sh) == L3D_OK);
    sh.layer_start = 0;
    for (int i = 0; i < vs; i++) sh.layer_start += layers[i];
    sh.layer_count = layers[vs];
    sh.has_embedding = vs == 0;
    sh.has_head = vs == S - 1;
    return sh;
}

static void load_batches(struct l3d_loader *ld, int n, int64_t BT, int32_t *inp, int32_t *tgt) {
    for (int i = 0; i < n; i++) l3d_loader_next(ld, inp + i * BT, tgt + i * BT);
}

/* Sum over a communicator of size > 1 (else nothing). */
static void sum_f64(struct l3d_comm *c, double *v, int n) {
    if (c && c->size > 1) l3d_comm_all_reduce(c, v, n, L3D_F64, L3D_SUM, NULL);
}

/* The first replica's weights, gathered from every (tp, pp) rank and chunk into one llm.c model
 * on rank 0: each rank sends its chunks' parameters, rank 0 places them by their shard. */
static l3d_status save_model(const struct l3d_train_config *tc, struct l3d_comm *world,
                             const struct l3d_topo *topo, struct l3d_gpt **chunks, int v,
                             const int *layers) {
    if (topo->dp_rank != 0) return L3D_OK;
    const bool lead = world->rank == 0;
    int S = topo->pp * v, group = topo->tp * topo->pp; /* replica 0: world ranks [0, group) */
    if (!lead) {
        for (int c = 0; c < v; c++)
            l3d_comm_send(world, chunks[c]->params, chunks[c]->num_params, L3D_F32, 0,
                          L3D_TAG_MODEL_GATHER + c, NULL);
        return L3D_OK;
    }
    int64_t n_full = l3d_gpt_param_count(&tc->model);
    float *full = l3d_alloc((size_t)n_full * sizeof(float), "gathered model");
    float *tmp = NULL;
    for (int r = 0; r < group; r++) {
        int tp_rank, pp_rank, dp_rank;
        l3d_topo_coords(topo->tp, topo->pp, r, &tp_rank, &pp_rank, &dp_rank);
        for (int c = 0; c < v; c++) {
            struct l3d_shard sh = stage_shard(tc, layers, S, c * topo->pp + pp_rank, topo->tp,
                                              tp_rank);
            const float *src = chunks[c]->params;
            if (r != 0) {
                struct l3d_tensor_info ti[L3D_NUM_TENSORS];
                int64_t n = l3d_gpt_plan_tensors(&tc->model, &sh, ti);
                l3d_free(tmp);
                tmp = l3d_alloc((size_t)n * sizeof(float), "gathered model");
                l3d_comm_recv(world, tmp, n, L3D_F32, r, L3D_TAG_MODEL_GATHER + c, NULL);
                src = tmp;
            }
            l3d_gpt_shard_to_full(&tc->model, &sh, src, full);
        }
    }
    l3d_free(tmp);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.bin", tc->out_dir);
    l3d_status st = l3d_ckpt_save_llmc_params(path, &tc->model, full, n_full);
    if (st == L3D_OK && !tc->quiet) printf("saved %s\n", path);
    l3d_free(full);
    return st;
}

l3d_status l3d_train_run(const struct l3d_train_config *tc_in, struct l3d_comm *world,
                         struct l3d_train_result *res) {
    memset(res, 0, sizeof *res);
    struct l3d_train_config tcv = *tc_in; /* accum follows from --global-batch once dp is known */
    const struct l3d_train_config *tc = &tcv;
    struct l3d_data *train = NULL, *val = NULL;
    struct l3d_loader *ld = NULL, *vld = NULL;
    struct l3d_gpt **chunks = NULL;
    struct l3d_dp *dps = NULL;
    struct l3d_adamw *opts = NULL;
    struct l3d_backend *be = NULL;
    FILE *metrics = NULL;
    int32_t *inp = NULL, *tgt = NULL;
    double *step_s = NULL, *opt_s = NULL, *comm_s = NULL, *bub = NULL;
    struct l3d_topo topo = {0};
    struct l3d_tp tpc = {0};
    struct l3d_pp_schedule sched = {0}, vsched = {0};
    struct l3d_pp_exec px = {0};
    struct l3d_train_ckpt ck;
    bool topo_up = false, px_up = false, ck_up = false;
    int ndp = 0; /* data-parallel states initialised */
    int tp = tc->tp, pp = tc->pp, dps_n = tc->dp, v = tc->pp_virtual > 1 ? tc->pp_virtual : 1;
    int layers[4096];
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
    else if ((st = l3d_topo_resolve(world->size, &tp, &pp, &dps_n)) != L3D_OK)
        ;
    else if (tc->global_batch > 0 && tc->global_batch % ((int64_t)tc->B * dps_n) != 0)
        st = l3d_error(L3D_ERR_ARG, "--global-batch %lld does not split into micro-batches: it must "
                       "be a multiple of --batch %d x %d data-parallel replicas = %lld sequences",
                       (long long)tc->global_batch, tc->B, dps_n, (long long)tc->B * dps_n);
    else if (tc->global_batch > 0 && (tcv.accum = (int)(tc->global_batch /
                                                          ((int64_t)tc->B * dps_n))) < 1)
        ;
    else if (tc->pp_schedule == L3D_PP_INTERLEAVED && v < 2)
        st = l3d_error(L3D_ERR_LAYOUT, "--pp-schedule interleaved needs --pp-virtual 2 or more "
                       "model chunks per pipeline rank");
    else if ((int64_t)pp * v > tc->model.L || (int64_t)pp * v > 4096)
        st = l3d_error(L3D_ERR_LAYOUT, "--pp %d x --pp-virtual %d = %lld pipeline stages but the "
                       "model has %d layers: each stage needs at least one layer; lower --pp or "
                       "--pp-virtual", pp, v, (long long)pp * v, tc->model.L);
    else if (tc->pp_layers && (st = l3d_pp_parse_layers(tc->pp_layers, &tc->model, pp * v,
                                                        layers)) != L3D_OK)
        ;
    else if (!tc->pp_layers &&
             (st = l3d_pp_partition(&tc->model, tc->T, pp * v, layers)) != L3D_OK)
        ;
    else if ((st = l3d_pp_schedule_build(&sched, pp > 1 ? tc->pp_schedule : L3D_PP_1F1B, pp, v,
                                         tc->accum)) != L3D_OK)
        ;
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
    if (st == L3D_OK && tc->val_pattern)
        st = l3d_pp_schedule_build_forward(&vsched, pp, v, tc->val_batches);
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;
    if ((st = l3d_topo_init(&topo, world, tp, pp, dps_n)) != L3D_OK) goto fail;
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

    /* This rank's model chunks: chunk c is virtual stage c pp + pp_rank. */
    be = l3d_backend_cpu_init();
    int S = pp * v;
    chunks = l3d_calloc((size_t)v * sizeof *chunks, "model chunks");
    dps = l3d_calloc((size_t)v * sizeof *dps, "model chunks");
    opts = l3d_calloc((size_t)v * sizeof *opts, "model chunks");
    size_t act_formula = 0, act_bytes = 0;
    int64_t n_local = 0;
    for (int c = 0; c < v && st == L3D_OK; c++) {
        struct l3d_shard sh = stage_shard(tc, layers, S, c * pp + topo.pp_rank, tp, topo.tp_rank);
        int slots = sched.slots[topo.pp_rank * v + c];
        st = l3d_gpt_init_ex(&chunks[c], &tc->model, &sh, be, tc->B, tc->T,
                             tc->zero == 2 ? L3D_GRADS_SLOTS : L3D_GRADS_FLAT, slots, tc->recompute);
        if (st != L3D_OK) break;
        act_bytes += chunks[c]->act_bytes;
        act_formula += l3d_gpt_act_bytes(&tc->model, &sh, tc->B, tc->T, slots, tc->recompute);
        n_local += chunks[c]->num_params;
        if (tc->init_from)
            st = l3d_ckpt_load_llmc(tc->init_from, chunks[c]);
        else
            l3d_gpt_init_weights(chunks[c], tc->seed);
        if (st == L3D_OK) l3d_tp_attach(&tpc, chunks[c], topo.tp_comm, !tc->dp_blocking);
        if (st == L3D_OK)
            st = l3d_dp_init(&dps[c], chunks[c], topo.dp_comm, tc->zero, tc->bucket_bytes,
                             !tc->dp_blocking);
        if (st == L3D_OK) ndp++;
    }
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;
    for (int c = 0; c < v; c++) {
        int64_t own_start, own_count;
        l3d_dp_opt_range(&dps[c], &own_start, &own_count);
        l3d_adamw_init(&opts[c], &tc->adamw, own_start, own_count);
    }
    /* checkpoints: resume (any layout), then the metrics file (a resumed run keeps its lines) */
    l3d_train_ckpt_init(&ck, tc, &topo, world);
    ck_up = true;
    int start_step = 0;
    st = l3d_train_ckpt_resume(&ck, tc, world, chunks, opts, v, ld, &start_step,
                               &res->report_error);
    if (st != L3D_OK) goto fail;
    res->start_step = start_step;
    if (lead) st = l3d_train_ckpt_open_metrics(tc, start_step, &metrics);
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;
    int64_t trace_cap = 0;
    if (tc->trace_path) {
        trace_cap = ((int64_t)sched.n[topo.pp_rank] + 4) * tc->steps + 64;
        if (vsched.n) trace_cap += (int64_t)vsched.n[topo.pp_rank] * tc->steps;
        if (trace_cap > (1 << 22)) trace_cap = 1 << 22; /* 128 MiB of events at most */
    }
    l3d_pp_exec_init(&px, chunks, v, dps, topo.pp_comm, topo.embed_comm, trace_cap);
    px_up = true;
    int64_t BT = (int64_t)tc->B * tc->T;
    int nbatch = tc->accum > tc->val_batches ? tc->accum : tc->val_batches;
    inp = l3d_alloc((size_t)(BT * nbatch) * sizeof(int32_t), "batch");
    tgt = l3d_alloc((size_t)(BT * nbatch) * sizeof(int32_t), "batch");
    step_s = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");
    opt_s = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");
    comm_s = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");
    bub = l3d_calloc((size_t)tc->steps * sizeof(double), "step times");

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
    struct l3d_lr_schedule lrs = {.max_lr = tc->lr, .min_lr = tc->min_lr,
                                  .warmup_steps = tc->warmup_steps, .total_steps = tc->steps};
    res->bubble_theory = pp > 1 ? l3d_pp_bubble(pp, v, tc->accum) : 0.0;
    /* the largest activation memory of any rank, and its closed form */
    double act_max[2] = {(double)act_bytes, (double)act_formula};
    if (world->size > 1) l3d_comm_all_reduce(world, act_max, 2, L3D_F64, L3D_MAX, NULL);
    res->act_bytes = (size_t)act_max[0];
    res->act_bytes_formula = (size_t)act_max[1];
    if (lead && !tc->quiet) {
        struct l3d_dp_memory mem = {0};
        for (int c = 0; c < v; c++) {
            struct l3d_dp_memory mc = l3d_dp_memory(&dps[c], &opts[c]);
            mem.params += mc.params;
            mem.grads += mc.grads;
            mem.optimizer += mc.optimizer;
            mem.grad_scratch += mc.grad_scratch;
        }
        double N = (double)l3d_gpt_param_count(&tc->model), Nl = (double)n_local;
        double d = topo.dp, MiB = 1048576.0;
        printf("model: L=%d C=%d NH=%d V=%d (padded %d) T=%d, %.2fM parameters\n", tc->model.L,
               tc->model.C, tc->model.NH, tc->model.V, tc->model.Vp, tc->T, N / 1e6);
        printf("layout: %d rank(s) = tp %d x pp %d x dp %d, ZeRO-%d, %s gradient pieces, %s, %d "
               "thread(s) per rank\n", world->size, tp, pp, topo.dp, tc->zero,
               tc->dp_blocking ? "blocking" : "overlapped", l3d_comm_mpi_library(),
               omp_get_max_threads());
        if (pp > 1) {
            printf("pipeline: %s schedule, %d micro-batches, %d stage(s) x %d chunk(s), layers",
                   l3d_pp_kind_name(sched.kind), tc->accum, pp, v);
            for (int i = 0; i < S; i++) printf("%s%d", i ? "," : " ", layers[i]);
            printf(" (%s), ideal bubble (p-1)/(v m+p-1) = %.1f%%\n",
                   tc->pp_layers ? "given" : "balanced", 100.0 * res->bubble_theory);
        }
        printf("batch: %d x %d tokens x %d micro-batches x %d replicas = %lld tokens per step\n",
               tc->B, tc->T, tc->accum, topo.dp, (long long)tokens_step);
        printf("data: %lld training tokens in %d file(s)%s\n", (long long)l3d_data_num_tokens(train),
               l3d_data_num_files(train), val ? ", validation on" : "");
        const char *fgrad = tc->zero == 2 ? "4N/dp" : "4N", *fopt = tc->zero >= 1 ? "8N/dp" : "8N";
        double want = 4 * Nl + (tc->zero == 2 ? 4 * Nl / d : 4 * Nl) +
                      (tc->zero >= 1 ? 8 * Nl / d : 8 * Nl);
        printf("memory on rank 0 (N = its %.2fM parameters): parameters %.1f MiB (4N), gradients "
               "%.1f MiB (%s), AdamW %.1f MiB (%s); total %.1f MiB, formula %.1f MiB; gradient "
               "slots %.1f MiB\n", Nl / 1e6, mem.params / MiB, mem.grads / MiB, fgrad,
               mem.optimizer / MiB, fopt, (mem.params + mem.grads + mem.optimizer) / MiB,
               want / MiB, mem.grad_scratch / MiB);
        printf("activations: %.1f MiB on the fullest rank (closed form %.1f MiB; recompute %s; "
               "micro-batches kept per chunk on rank 0:", res->act_bytes / MiB,
               res->act_bytes_formula / MiB,
               tc->recompute == L3D_RECOMPUTE_NONE ? "none"
               : tc->recompute == L3D_RECOMPUTE_SELECTIVE ? "selective" : "full");
        for (int c = 0; c < v; c++) printf(" %d", sched.slots[c]);
        printf(")\n");
        if (tp > 1)
            printf("tensor parallelism: %.2f MB all-reduced per micro-batch per rank (4 (4L + 2) B T C "
                   "+ 12 B T bytes)\n", l3d_tp_bytes_per_micro(&tc->model, tc->B, tc->T) / 1e6);
        printf("model FLOPs/token %.3g, peak %.1f GFLOP/s (%s)\n", flops_tok, peak / 1e9,
               tc->peak_flops > 0 ? "given, times ranks" : "measured FMA peak, times ranks");
        fflush(stdout);
    }

    for (int c = 0; c < v; c++) l3d_gpt_zero_grad(chunks[c]);
    if (world->size > 1) l3d_comm_barrier(world);
    px.origin = l3d_time_s(); /* the trace's zero, right after a barrier on every rank */
    int end_step = tc->steps;
    for (int step = start_step; step < tc->steps; step++) {
        double t0 = l3d_time_s();
        for (int c = 0; c < v; c++) dps[c].comm_wait_s = 0.0;
        tpc.comm_s = 0.0;
        tpc.bytes = 0;
        load_batches(ld, tc->accum, BT, inp, tgt);
        double loss = l3d_pp_exec_run(&px, sched.acts[topo.pp_rank], sched.n[topo.pp_rank],
                                      tc->accum, inp, tgt, tc->B, tc->T, dloss);
        double pipe_s = px.span_s, idle = px.span_s - px.busy_s;
        l3d_pp_exec_finish_grads(&px);
        double t1 = l3d_time_s();
        sum_f64(topo.pp_comm, &loss, 1); /* only the last stage has it */
        sum_f64(topo.dp_comm, &loss, 1);
        loss /= (double)tc->accum * topo.dp;
        /* the global gradient norm: split tensors over TP, every stage, the tied wte once */
        double sq[2] = {0.0, 0.0};
        for (int c = 0; c < v; c++)
            l3d_dp_grad_sumsq_add(&dps[c], be, pp > 1 && !chunks[c]->shard.has_embedding, sq);
        if (tc->zero > 0) sum_f64(topo.dp_comm, sq, 2);
        sum_f64(topo.tp_comm, sq, 1);
        sum_f64(topo.pp_comm, sq, 2);
        double norm = sqrt(sq[0] + sq[1]);
        float clip = l3d_clip_factor(norm, tc->adamw.grad_clip);
        float lr = l3d_lr_at(&lrs, step);
        for (int c = 0; c < v; c++) l3d_dp_step(&dps[c], &opts[c], be, lr, clip);
        double t2 = l3d_time_s(), dt = t2 - t0, dt_opt = t2 - t1;
        l3d_pp_trace_add(&px, L3D_EV_OPTIMIZER, 0, step + 1, t1, t2);
        l3d_pp_trace_add(&px, L3D_EV_STEP, 0, step + 1, t0, t2);
        /* the pipeline's idle fraction, averaged over the ranks */
        double b[2] = {idle, pipe_s};
        if (pp > 1) sum_f64(world, b, 2);
        bub[step] = pp > 1 && b[1] > 0 ? b[0] / b[1] : 0.0;
        step_s[step] = dt;
        opt_s[step] = dt_opt;
        double cw = 0.0;
        for (int c = 0; c < v; c++) cw += dps[c].comm_wait_s;
        comm_s[step] = cw;
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
            load_batches(vld, tc->val_batches, BT, inp, tgt);
            double vs = l3d_pp_exec_run(&px, vsched.acts[topo.pp_rank], vsched.n[topo.pp_rank],
                                        tc->val_batches, inp, tgt, tc->B, tc->T, 0.0f);
            sum_f64(topo.pp_comm, &vs, 1);
            sum_f64(topo.dp_comm, &vs, 1);
            vloss = (float)(vs / tc->val_batches / topo.dp);
            res->last_val_loss = vloss;
        }
        if (lead && !tc->quiet) {
            printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %8.1f ms | %9.0f tok/s | MFU "
                   "%5.1f%%", step + 1, tc->steps, loss, lr, norm, dt * 1e3, tps, 100.0 * mfu);
            if (pp > 1) printf(" | bubble %4.1f%%", 100.0 * bub[step]);
            if (!isnan(vloss)) printf(" | val %.4f", vloss);
            printf("\n");
            fflush(stdout);
        }
        if (metrics) {
            fprintf(metrics, "{\"step\":%d,\"loss\":%.9g,\"lr\":%.6g,\"grad_norm\":%.9g,\"ms\":%.3f,"
                    "\"optimizer_ms\":%.3f,\"comm_wait_ms\":%.3f,\"tp_comm_ms\":%.3f,"
                    "\"tp_bytes\":%lld,\"tokens_per_s\":%.1f,"
                    "\"mfu\":%.5f,\"tokens\":%lld,\"flops_per_token\":%.6g,\"peak_flops\":%.6g,"
                    "\"ranks\":%d,\"mem_peak_bytes\":%zu,\"bubble\":%.5f", step + 1, loss, lr,
                    norm, dt * 1e3, dt_opt * 1e3, cw * 1e3, tpc.comm_s * 1e3,
                    (long long)tpc.bytes, tps, mfu,
                    (long long)tokens_step * (step + 1), flops_tok, peak, world->size,
                    l3d_mem_peak(), bub[step]);
            if (!isnan(vloss)) fprintf(metrics, ",\"val_loss\":%.9g", vloss);
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
        /* checkpoint: periodic, or a preemption signal on any rank (then stop, exit status 0) */
        res->stopped_by = l3d_ckpt_stop_requested(world);
        if (res->stopped_by || l3d_train_ckpt_due(&ck, tc, step + 1))
            if ((st = l3d_train_ckpt_save(&ck, tc, world, chunks, opts, v, ld, step + 1,
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
    /* the fullest rank's accounted peak while training (before model.bin's gather; what llm3d
     * plan predicts) */
    double mem_peak = (double)l3d_mem_peak();
    if (world->size > 1) l3d_comm_all_reduce(world, &mem_peak, 1, L3D_F64, L3D_MAX, NULL);
    res->mem_peak = (size_t)mem_peak;
    /* the last step's checkpoint (also when a resumed run had no step left: a re-sliced copy) */
    if (!res->stopped_by && tc->save_every > 0 &&
        (st = l3d_train_ckpt_save(&ck, tc, world, chunks, opts, v, ld, end_step,
                                  &res->report_error)) != L3D_OK)
        goto fail;
    int ran = end_step - start_step;
    res->steps = end_step;
    if (ran > 0) {
        res->median_step_s = median(step_s + start_step, ran);
        res->median_optimizer_s = median(opt_s + start_step, ran);
        res->median_comm_s = median(comm_s + start_step, ran);
        res->bubble = median(bub + start_step, ran);
        res->tokens_per_s = (double)tokens_step / res->median_step_s;
        res->mfu = res->tokens_per_s * flops_tok / peak;
        if (res->mfu > 1.0 && tc->peak_flops <= 0) {
            /* the model ran faster than the measured peak: other work held the cores while it
             * was measured; measure again (rank 0, shared) and keep the larger */
            double again = lead ? l3d_cpu_fma_peak(0.5) * world->size : 0.0;
            if (world->size > 1) l3d_comm_broadcast(world, &again, 1, L3D_F64, 0, NULL);
            if (lead && !tc->quiet)
                printf("note: the start-up peak (%.1f GFLOP/s) was below the model's own rate "
                       "(busy machine); measured again: %.1f GFLOP/s%s\n", peak / 1e9, again / 1e9,
                       again * 0.99 < res->tokens_per_s * flops_tok
                           ? " (still low: give --peak-gflops)" : "");
            if (again > peak) peak = again;
            res->mfu = res->tokens_per_s * flops_tok / peak;
        }
    }
    st = L3D_OK;
    if (tc->trace_path) {
        st = l3d_pp_trace_write(&px, world, tc->trace_path, topo.tp_rank, topo.pp_rank,
                                topo.dp_rank);
        if (st == L3D_OK && lead && !tc->quiet) printf("trace: %s\n", tc->trace_path);
    }
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;
    if (tc->out_dir && !res->stopped_by) st = save_model(tc, world, &topo, chunks, v, layers);
    if ((st = agree(world, st, res)) != L3D_OK) goto fail;
    if (lead && !tc->quiet && ran > 0) {
        printf("median step %.1f ms (forward+backward %.1f, optimizer %.1f, exposed DP communication "
               "%.1f), %.0f tokens/s, MFU %.1f%%, peak host memory %.1f MiB (%zu bytes, the "
               "fullest rank)\n",
               res->median_step_s * 1e3,
               (res->median_step_s - res->median_optimizer_s) * 1e3, res->median_optimizer_s * 1e3,
               res->median_comm_s * 1e3, res->tokens_per_s, 100.0 * res->mfu,
               res->mem_peak / 1048576.0, res->mem_peak);
        if (pp > 1)
            printf("pipeline bubble: measured %.1f%% of the pipeline's time (median step), ideal "
                   "(p-1)/(v m+p-1) = %.1f%%\n", 100.0 * res->bubble, 100.0 * res->bubble_theory);
    }
fail:
    if (ck_up) l3d_train_ckpt_free(&ck);
    if (metrics) fclose(metrics);
    l3d_free(inp);
    l3d_free(tgt);
    l3d_free(step_s);
    l3d_free(opt_s);
    l3d_free(comm_s);
    l3d_free(bub);
    if (px_up) l3d_pp_exec_free(&px);
    for (int c = 0; c < v && opts; c++)
        if (opts[c].m) l3d_adamw_free(&opts[c]);
    for (int c = 0; c < ndp; c++) l3d_dp_free(&dps[c]);
    for (int c = 0; c < v && chunks; c++) l3d_gpt_free(chunks[c]);
    l3d_free(chunks);
    l3d_free(dps);
    l3d_free(opts);
    l3d_pp_schedule_free(&sched);
    l3d_pp_schedule_free(&vsched);
    l3d_backend_free(be);
    l3d_loader_free(vld);
    l3d_loader_free(ld);
    l3d_data_free(val);
    l3d_data_free(train);
    if (topo_up) l3d_topo_free(&topo);
    return st;
}
