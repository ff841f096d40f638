/* Planner: the memory and time of one layout (l3d_plan_evaluate, include/llm3d/plan.h), put
 * together from its parts (src/plan/plan-impl.h): each pipeline rank's chunks, their memory and
 * time, the schedule's timeline, and the step's DP, embedding and optimizer times. */
#include <stdlib.h>
#include <string.h>

#include "llm3d/ckpt.h"
#include "plan-impl.h"

struct l3d_plan_run l3d_plan_run_default(void) {
    struct l3d_run_spec s;
    l3d_run_spec_defaults(&s); /* fp32 */
    return (struct l3d_plan_run){.devices = 1, .precision = s.precision, .flash = true,
                                 .piece_bytes = L3D_CKPT_STAGE_BYTES};
}

/* The figures a run's kernels reach: llm3d's bf16 / fp16 on a profile with that type's 16-bit
 * keys (measured by llm3d bench --calibrate through the backend's 16-bit kernels: on a CPU
 * without 16-bit products, widened operands around the fp32 product, conversions included) take
 * them in place of gemm_eff, attn_eff, gemm_thread_eff and kernel_bw_eff; every other run, and a
 * profile without them (older local profiles; the GPU profiles, Megatron-style), its own. */
const struct l3d_profile *l3d_plan_run_profile(const struct l3d_profile *prof,
                                               const struct l3d_plan_run *run,
                                               struct l3d_profile *tmp) {
    return run->llm3d && l3d_profile_mixed(prof, run->precision.param, tmp) ? tmp : prof;
}

/* A layout under evaluation: its stages and the buffers it owns (eval_end frees them). */
struct eval {
    struct l3d_plan_run run;      /* with the profile's word on llm3d's 16-bit products */
    struct l3d_layout lay;   /* threads resolved */
    int64_t mm;                   /* micro-batches a step */
    int S;                        /* virtual stages, pp v */
    enum l3d_pp_kind kind;        /* the schedule (1F1B without a pipeline) */
    const int *layers;            /* of each virtual stage */
    int *owned;                   /* layers, when no cache keeps them */
    int64_t *start;               /* the first layer of each virtual stage (start[S] = L) */
    struct l3d_plan_chunk *ch;    /* one pipeline rank's v chunks */
    const struct l3d_pp_schedule *sched; /* the trainer's schedule (slots), NULL if none */
    struct l3d_pp_schedule own_sched;    /* sched, when no cache keeps it */
    struct l3d_model_spec ms;     /* the model planned at the layout's sequence (l3d_plan_view) */
    struct l3d_model_spec mc;     /* a ring rank's model (l3d_plan_cp_local; ms when cp 1) */
    struct l3d_model_spec mt;     /* mc with the position table's rows: the model's context */
    int cp;
};

static void eval_end(struct eval *ev) {
    if (ev->sched == &ev->own_sched) l3d_pp_schedule_free(&ev->own_sched);
    free(ev->owned);
    free(ev->start);
    free(ev->ch);
}

/* Checks the layout and sets up its stages; r->layout and r->m once it is valid. */
static l3d_status eval_begin(struct eval *ev, const struct l3d_model_spec *m,
                             const struct l3d_profile *prof, const struct l3d_plan_run *run,
                             const struct l3d_layout *lay_in, struct l3d_plan_cache *cc,
                             struct l3d_plan_result *r) {
    memset(ev, 0, sizeof *ev);
    ev->run = *run; /* the profile's word on llm3d's 16-bit products */
    if (run->llm3d && run->precision.param != L3D_F32 &&
        prof->mixed[run->precision.param == L3D_BF16 ? 0 : 1].native)
        ev->run.native16 = true;
    if (run->llm3d && run->precision.param == L3D_BF16 && prof->mixed[0].attn_native)
        ev->run.attn_native16 = true;
    if (run->llm3d && run->precision.param == L3D_BF16 && prof->mixed[0].wgrad_block > 0)
        ev->run.wgrad_block16 = prof->mixed[0].wgrad_block;
    l3d_plan_view(m, lay_in, &ev->ms, &ev->lay);
    l3d_status st = l3d_plan_check(m, prof, &ev->run, &ev->lay);
    if (st != L3D_OK) return st;
    r->layout = ev->lay;
    int p = ev->lay.pp, v = ev->lay.v;
    ev->mm = ev->lay.global_batch / ((int64_t)ev->lay.micro_batch * ev->lay.dp);
    r->m = (int)ev->mm;
    struct l3d_layout checked = ev->lay;
    ev->cp = l3d_plan_cp_local(&ev->ms, &checked, &ev->mc, &ev->lay);
    /* under cp the ring's block kernels replace the whole sequence's attention: no oneDNN
     * attention scratch (l3d_plan_memory's rule) */
    if (ev->cp > 1) ev->run.attn_native16 = false;
    /* a ring rank holds the whole position table, of the model's context rows (as
     * l3d_plan_memory counts it; this counted T / cp rows) */
    ev->mt = ev->mc;
    if (m->maxT > ev->mt.maxT) ev->mt.maxT = m->maxT;
    ev->S = p * v;
    ev->kind = p > 1 ? ev->lay.schedule : L3D_PP_1F1B;
    st = l3d_plan_cache_layers(cc, &ev->ms, &ev->run, &ev->lay, ev->S, &ev->owned, &ev->layers);
    if (st != L3D_OK) return st;
    ev->start = malloc(sizeof(int64_t) * (size_t)(ev->S + 1));
    ev->ch = malloc(sizeof(struct l3d_plan_chunk) * (size_t)v);
    if (!ev->start || !ev->ch)
        return l3d_error(L3D_ERR_OOM, "out of memory planning %d stages", ev->S);
    ev->start[0] = 0;
    for (int i = 0; i < ev->S; i++) ev->start[i + 1] = ev->start[i] + ev->layers[i];
    /* the trainer's own schedule says how many micro-batches each chunk keeps */
    if (l3d_plan_trainer(&ev->run) && (int64_t)p * v * ev->mm <= (1 << 20))
        st = l3d_plan_cache_schedule(cc, ev->kind, p, v, ev->mm, &ev->own_sched, &ev->sched);
    return st;
}

/* Each pipeline rank's chunks: the fullest rank's memory, the slowest rank's time of a
 * micro-batch and every rank's summed, and, when vt, each virtual stage's times for the
 * timeline. */
static void eval_ranks(const struct eval *ev, const struct l3d_model_spec *m,
                       const struct l3d_plan_tctx *x, double *vt, struct l3d_plan_ranks *o) {
    memset(o, 0, sizeof *o);
    struct l3d_plan_shapes memo = {0};
    for (int rr = 0; rr < ev->lay.pp; rr++) {
        l3d_plan_rank_chunks(&ev->mt, &ev->lay, ev->layers, ev->start, rr,
                             ev->sched, ev->mm, x->fp32, &memo, ev->ch);
        struct l3d_plan_mem mem;
        l3d_plan_rank_memory(m, &ev->run, &ev->lay, ev->ch, rr, ev->mm, &mem);
        l3d_plan_cp_ring_memory(m, &ev->run, &ev->lay, ev->ch, ev->cp, &mem);
        if (mem.total > o->mem.total) o->mem = mem;
        struct l3d_plan_parts sum;
        l3d_plan_rank_time(x, ev->ch, rr, &memo, vt, &sum);
        double n_rank = 0, n_exp = 0;
        for (int k = 0; k < ev->lay.v; k++) {
            n_rank += (double)ev->ch[k].n;
            n_exp += (double)ev->ch[k].n_exp;
        }
        o->t_sum += sum.total;
        l3d_plan_parts_add(&o->all, &sum, 1.0);
        if (sum.total > o->t_max) {
            o->t_max = sum.total;
            o->worst = sum;
            o->bwd_of_max = sum.bwd;
        }
        if (n_rank > o->n_max) {
            o->n_max = n_rank;
            o->n_exp = n_exp;
        }
    }
}

double l3d_plan_moe_flops(const struct l3d_model_spec *m) {
    const struct l3d_moe_spec *q = &m->moe;
    double h = m->C, F = (double)(q->ffn > 0 ? q->ffn : m->ffn);
    double expert = (m->mlp == L3D_MLP_SWIGLU ? 6 : 4) * h * F; /* 2 FLOPs a weight */
    return 2 * h * q->experts + (q->top_k + q->shared) * expert;
}

/* The step's FLOPs, throughput and utilisation, from r->time.step. */
static void eval_flops(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                       const struct l3d_plan_run *run, const struct l3d_layout *lay,
                       struct l3d_plan_result *r) {
    const struct l3d_plan_time *T = &r->time;
    double G = (double)lay->global_batch, s = lay->seq, h = m->C, L = m->L;
    struct l3d_model_spec c = l3d_plan_model_gpt(m);
    /* Narayanan et al. 2021, eq. 3: 72 B s L h^2 (1 + s/6h) + 6 B s h V per step without
     * recomputation (3 passes); the full recomputation's extra forward makes it 96. A layer's
     * forward per token: 24 h^2 = 2 (3h^2 + h^2 + 2 h f) with f = 4h, plus attention's 4 s h */
    double f = (double)m->ffn, hd = l3d_model_head_dim(m), q = m->NH * hd;
    double kv = l3d_model_kv_heads(m) * hd; /* q = kv = h: GPT-2's */
    /* grouped-query attention's K and V products are kv/h of Q's; SwiGLU has three f x h
     * matrices where GELU has two (so Llama's 8h^2 + 6hf + 4sh with kv = h) */
    double mlp = (m->mlp == L3D_MLP_SWIGLU ? 6 : 4) * h * f;
    /* a mixture of experts: its MoE layers' active FLOPs (router, K experts, shared experts)
     * in place of the MLP's, the leading dense layers as they are */
    double Lm = m->moe.experts > 0 ? L - m->moe.dense_layers : 0;
    double att_f = 2 * (2 * h * q + 2 * h * kv) + 4 * s * q, head = 6 * h * c.Vp;
    double layers_f = L * att_f + (L - Lm) * mlp + Lm * l3d_plan_moe_flops(m);
    r->model_flops = G * s * (3 * layers_f + head);
    /* the recomputed forward (chunk_time, time.c): full, a layer's; selective, the attention
     * core's 4 s h a token, none with a fused attention */
    double extra = lay->recompute == L3D_RECOMPUTE_FULL ? layers_f
                   : lay->recompute == L3D_RECOMPUTE_SELECTIVE && !run->flash ? L * 4 * s * h
                                                                              : 0.0;
    r->hw_flops = r->model_flops + G * s * extra;
    r->tokens_per_s = G * s / T->step;
    double peak_all = l3d_plan_peak(prof, run) * (double)run->devices;
    r->mfu = r->model_flops / T->step / peak_all;
    r->hfu = r->hw_flops / T->step / peak_all;
}

l3d_status l3d_plan_evaluate_in(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                                const struct l3d_plan_run *run, const struct l3d_layout *lay,
                                struct l3d_plan_result *r, struct l3d_plan_cache *cc) {
    memset(r, 0, sizeof *r);
    struct eval ev;
    l3d_status st = eval_begin(&ev, m, prof, run, lay, cc, r);
    if (st != L3D_OK) {
        eval_end(&ev);
        return st;
    }
    int p = ev.lay.pp, v = ev.lay.v;
    struct l3d_plan_tctx x;
    l3d_plan_tctx_init(&x, &ev.mc, prof, &ev.run, &ev.lay);
    l3d_plan_tctx_cp(&x, ev.cp, ev.lay.tp);
    /* per virtual stage, for the schedule's timeline: forward, backward (+ recomputation), the
     * receives of its input and of its output's gradient, and W of a split backward */
    double *vt = p > 1 ? malloc(sizeof(double) * 5 * (size_t)ev.S) : NULL;
    struct l3d_plan_ranks rk;
    eval_ranks(&ev, &ev.mc, &x, vt, &rk);
    /* the pipeline: the schedule run with each stage's own times (l3d_plan_timeline); beyond 2^20
     * chunk-micro-batches, or out of memory, the closed form (m - 1/v) t_max + sum_r t_r / v,
     * which for equal stages is (m + (p - 1)/v) t, the bubble (p - 1)/(v m) of Narayanan et al.
     * 2021, sec. 2.2 */
    double pipe = (ev.mm - 1.0 / v) * rk.t_max + rk.t_sum / v;
    if (vt) {
        double sim = l3d_plan_timeline(cc ? &cc->tl : NULL, ev.kind, p, v, ev.mm, vt);
        if (sim >= 0) pipe = sim;
    }
    l3d_plan_step_time(&x, &ev.run, &rk, pipe, ev.mm, &r->time);
    r->mem = rk.mem;
    /* a CPU rank: its cores' share; less what the runtime keeps (the profile's reserve_gb: the
     * device context, library workspaces, communication buffers, the allocator's fragmentation),
     * which the predicted bytes do not include */
    r->fits = rk.mem.total + prof->reserve_bytes <= prof->mem_bytes * ev.lay.threads;
    eval_flops(&ev.ms, prof, &ev.run, &r->layout, r);
    eval_end(&ev);
    return L3D_OK;
}

l3d_status l3d_plan_evaluate(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                             const struct l3d_plan_run *run, const struct l3d_layout *lay,
                             struct l3d_plan_result *r) {
    struct l3d_profile tmp;
    prof = l3d_plan_run_profile(prof, run, &tmp);
    return l3d_plan_evaluate_in(m, prof, run, lay, r, NULL);
}
