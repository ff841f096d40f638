/* Time of a training step (l3d_plan_step_time): the pipeline phase's parts, then the DP gradient
 * communication, the tied embedding's gradient sum and the optimizer. */
#include <math.h>

#include "plan-impl.h"

/* DP: gradients reduced over d replicas (all-reduce; ZeRO-1 reduce-scatter + all-gather of the
 * parameters, the same bus volume; ZeRO-2 reduce-scatters every micro-batch; ZeRO-3 also
 * all-gathers the parameters twice a micro-batch, 1.5x ZeRO-2's volume) of the largest rank's
 * n_max parameters, gb bytes a gradient, what the backward (bwd_of_max a micro-batch) hides of it
 * left out. */
static double dp_time(const struct l3d_plan_tctx *x, double gb, double n_max, double bwd_of_max,
                      int64_t mm, double d) {
    const struct l3d_layout *lay = x->lay;
    if (d <= 1) return 0.0;
    const struct l3d_profile *prof = x->prof;
    int t = lay->tp, p = lay->pp;
    double pb = lay->zero >= 1 ? x->e : gb;
    /* A DP group's members are t p ranks apart, so a node holds members of t p groups (of
     * all of them when t p >= devices_per_node), which reduce at once. Each group's ring
     * enters and leaves a node once per channel, over that channel's NIC (NCCL's rings, one
     * NIC a channel on rail-aligned nodes: Jeaugey, "NCCL 2.0", GTC 2017), so the node's
     * NICs are shared by those t p groups, not by the group's members on the node: a group
     * that fills its nodes (t p = 1) has the node's whole inter_bw, a group of one member a
     * node its device's share. Members on one node also pass the ring inside it, which
     * inter_bw may not outrun. */
    double bw, lat;
    int64_t span = (int64_t)t * p * lay->dp, tpn = (int64_t)t * p;
    int64_t dpn = prof->devices_per_node;
    l3d_plan_link(prof, 0, span - 1, (int)(tpn < dpn ? tpn : dpn), &bw, &lat);
    if (tpn < dpn && span > dpn && prof->inter_bw > 0 && prof->intra_bw > 0 &&
        bw > prof->intra_bw)
        bw = prof->intra_bw;
    double rs = (d - 1) / d * n_max * gb / bw + (d - 1) * lat;
    double ag = (d - 1) / d * n_max * pb / bw + (d - 1) * lat;
    double comm = lay->zero == 3   ? mm * (rs + 2 * ag)
                  : lay->zero == 2 ? mm * rs + ag
                                   : rs + ag;
    /* What runs during backward can hide behind it: ZeRO-0's whole all-reduce, ZeRO-1's
     * reduction (its parameter all-gather follows the optimizer step), ZeRO-2's reduction of
     * every micro-batch; of that, the profile's dp_overlap fraction while there is backward
     * left to hide behind, never the last bucket (at least a tenth stays exposed). ZeRO-3
     * gathers every layer's parameters in each micro-batch's forward and again in its backward,
     * behind both when prefetching (the forward taken as half the backward: 2 of the 6 N
     * FLOPs a token), else only its reductions hide. */
    double during = lay->zero == 0   ? comm
                    : lay->zero == 3 ? (lay->zero3_prefetch > 0 ? comm : mm * rs)
                    : lay->zero == 2 ? mm * rs
                                     : rs;
    double window = lay->zero == 3   ? mm * 1.5 * bwd_of_max
                    : lay->zero == 2 ? mm * bwd_of_max
                                     : bwd_of_max;
    double hide = fmin(window, 0.9 * during);
    return comm - prof->dp_overlap * hide;
}

/* DP communication of the step. With expert parallelism (src/parallel/dp.c): under ZeRO-0 the
 * experts' gradients are summed over the dp / ep ranks holding the same experts and the rest over
 * the whole group; under ZeRO-1/2 ZeRO runs over those dp / ep ranks for every tensor, the
 * other tensors' slices first all-reduced over the EP group (blocking: not hidden), once a step
 * (ZeRO-1) or every micro-batch (ZeRO-2). */
static double dp_comm(const struct l3d_plan_tctx *x, double gb, const struct l3d_plan_ranks *rk,
                      int64_t mm) {
    const struct l3d_layout *lay = x->lay;
    int ep = lay->ep > 1 ? lay->ep : 1;
    if (ep == 1) return dp_time(x, gb, rk->n_max, rk->bwd_of_max, mm, lay->dp);
    double dense = rk->n_max - rk->n_exp, edp = (double)lay->dp / ep;
    if (lay->zero == 0)
        return dp_time(x, gb, dense, rk->bwd_of_max, mm, lay->dp) +
               dp_time(x, gb, rk->n_exp, rk->bwd_of_max, mm, edp);
    double bw, lat;
    int64_t stride = (int64_t)lay->tp * x->cp * lay->pp;
    l3d_plan_link(x->prof, 0, (ep - 1) * stride, (int)x->prof->devices_per_node, &bw, &lat);
    double pre = l3d_plan_all_reduce(dense * gb, ep, bw, lat);
    return dp_time(x, gb, rk->n_max, rk->bwd_of_max, mm, edp) +
           (lay->zero >= 2 ? (double)mm : 1.0) * pre;
}

/* The tied embedding's gradient (eb bytes an element) summed between the first and the last
 * stage. */
static double embed_sync_time(const struct l3d_plan_tctx *x, double eb) {
    const struct l3d_model_spec *m = x->m;
    int t = x->lay->tp, p = x->lay->pp;
    struct l3d_model_spec c = l3d_plan_model_gpt(m);
    double bw, lat;
    l3d_plan_link(x->prof, 0, (int64_t)(p - 1) * t + t - 1, t, &bw, &lat);
    return l3d_plan_all_reduce((double)c.Vp / t * m->C * eb, 2, bw, lat);
}

/* AdamW over the rank's optimizer shard: fp32 reads parameter, gradient, m, v and writes
 * parameter, m, v (28 bytes); llm3d's mixed precision also writes the 16-bit copy (28 + 2,
 * l3d_be_adamw_mixed), Megatron-LM's (32, as counted before). Two streaming passes over the
 * gradients (eb bytes an element), timed as a residual add is: the global norm reads the shard's
 * (the rank's range under ZeRO, l3d_dp_grad_sumsq_add), and the gradient buffer is zeroed for the
 * next step (the whole buffer; ZeRO-2's shard: l3d_dp_step, Megatron-LM's zero_grad_buffer);
 * llm3d zeroes the optimizer's range inside its AdamW pass (l3d_be_adamw_zero) */
static double optimizer_time(const struct l3d_plan_tctx *x, const struct l3d_plan_run *run,
                             double eb, double n_max) {
    const struct l3d_layout *lay = x->lay;
    double n_opt = lay->zero >= 1 ? n_max / l3d_plan_zero_group(lay) : n_max;
    double n_zero = lay->zero >= 2 ? n_opt : n_max;
    /* llm3d: the 16-bit copy only where the weights are 16-bit (fp32 weights are the master) */
    double opt_bytes = !x->fp32 ? 32.0 : run->llm3d && x->e < 4 ? 28.0 + x->e : 28.0;
    if (run->llm3d) /* l3d_be_adamw_zero: the range's gradients zeroed in the AdamW pass (written
                     * once more there), the memset only for the rest of the buffer */
        return n_opt * (opt_bytes + eb) / x->bw_k[L3D_KERN_ADAMW] +
               (n_opt + fmax(n_zero - n_opt, 0.0)) * eb / x->bw_k[L3D_KERN_RESIDUAL];
    return n_opt * opt_bytes / x->bw_k[L3D_KERN_ADAMW] +
           (n_opt + n_zero) * eb / x->bw_k[L3D_KERN_RESIDUAL];
}

void l3d_plan_step_time(const struct l3d_plan_tctx *x, const struct l3d_plan_run *run,
                        const struct l3d_plan_ranks *rk, double pipe, int64_t mm,
                        struct l3d_plan_time *T) {
    int p = x->lay->pp;
    struct l3d_plan_parts worst = rk->worst;
    double t_max = rk->t_max;
    /* An oversubscribed node (share < 1: more ranks x threads than cores, as 8 ranks on the local
     * profile's 2): a rank that waits gives its core up (Open MPI yields when oversubscribed;
     * measured in the brief), so the cores serve whichever ranks have work and the pipeline's
     * bubble holds the other stages' work. The pipeline phase is then the work of all ranks over
     * the cores, i.e. the average rank's busy time at its share (t_sum / p a micro-batch), no
     * shorter than the schedule at a whole core's speed (its time at the share, times the
     * share). Its parts are the average rank's. */
    if (x->share < 1) {
        double work = mm * rk->t_sum / p, crit = pipe * x->share;
        pipe = work > crit ? work : crit;
        worst = (struct l3d_plan_parts){0};
        l3d_plan_parts_add(&worst, &rk->all, 1.0 / p);
        t_max = rk->t_sum / p;
    }
    T->gemm = mm * worst.gemm;
    T->attention = mm * worst.attn;
    T->elementwise = mm * worst.elem;
    T->recompute = mm * worst.rec;
    T->tp_comm = mm * worst.tp;
    T->cp_comm = mm * worst.cp;
    T->ep_comm = mm * worst.a2a;
    T->pp_p2p = mm * worst.p2p;
    T->bubble = pipe - mm * t_max;
    T->bubble_frac = p > 1 && pipe > 0 ? T->bubble / pipe : 0.0;
    /* gradients and parameters: the run's element type; llm3d's mixed precision reduces its fp32
     * main_grad (all-reduce, or ZeRO's reduce to the owner) and all-gathers the 16-bit
     * parameters under ZeRO (src/parallel/dp.c); with --grad-reduce-dtype bf16|fp16, 2 bytes an
     * element (l3d_dp_reduce_in). The fp32 main_grad is what the tied embedding's sum and the
     * optimizer read. */
    double eb = run->llm3d ? l3d_plan_bytes(L3D_F32) : x->e;
    double gb = (run->precision.reduce != L3D_F32) ? l3d_plan_bytes(L3D_BF16) : eb;
    T->dp_comm = dp_comm(x, gb, rk, mm);
    T->embed_sync = p > 1 ? embed_sync_time(x, eb) : 0.0;
    T->optimizer = optimizer_time(x, run, eb, rk->n_max);
    T->step = pipe + T->dp_comm + T->embed_sync + T->optimizer;
}
