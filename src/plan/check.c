/* Whether a layout suits the model, the run and the profile (l3d_plan_check): every rule the
 * trainer or Megatron-LM enforces, as one sentence naming the value. */
#include "llm3d/tp.h"
#include "plan-impl.h"

l3d_status l3d_plan_check(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                          const struct l3d_plan_run *run, const struct l3d_layout *lay) {
    l3d_status st = l3d_plan_model_check(m);
    if (st != L3D_OK) return st;
    int th = lay->threads > 0 ? lay->threads : run->threads;
    if (lay->tp < 1 || lay->pp < 1 || lay->dp < 1 || lay->micro_batch < 1 || lay->v < 1 || th < 1)
        return l3d_error(L3D_ERR_LAYOUT, "tp %d, pp %d, dp %d, micro-batch %d, v %d and threads %d "
                         "must be at least 1", lay->tp, lay->pp, lay->dp, lay->micro_batch, lay->v, th);
    if ((int64_t)lay->tp * lay->pp * lay->dp * th != run->devices)
        return l3d_error(L3D_ERR_LAYOUT, "tp %d x pp %d x dp %d x threads %d = %lld, not the %lld "
                         "devices", lay->tp, lay->pp, lay->dp, th,
                         (long long)lay->tp * lay->pp * lay->dp * th, (long long)run->devices);
    if (prof && th > 1 && prof->devices_per_node > 1 && th > prof->devices_per_node)
        return l3d_error(L3D_ERR_LAYOUT, "%d threads a rank but %d cores a node", th,
                         prof->devices_per_node);
    if (prof && l3d_plan_peak(prof, run) <= 0)
        return l3d_error(L3D_ERR_ARG, "profile %s has no %s peak (peak_tflops_%s = 0)", prof->name,
                         l3d_dtype_name(run->precision.param), l3d_dtype_name(run->precision.param));
    if (m->NH % lay->tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "tp %d does not divide the %d attention heads", lay->tp,
                         m->NH);
    if (m->ffn % lay->tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "tp %d does not divide the MLP width %lld", lay->tp,
                         (long long)m->ffn);
    if (l3d_plan_trainer(run) && m->ffn != 4LL * m->C)
        return l3d_error(L3D_ERR_ARG, "llm3d's trainer (precision fp32) has a 4h MLP: --ffn %lld "
                         "needs --precision bf16 or fp16", (long long)m->ffn);
    if (l3d_plan_trainer(run) && lay->tp > 1) {
        struct l3d_model_spec c = l3d_plan_model_gpt(m);
        struct l3d_shard sh;
        if ((st = l3d_tp_shard(&c, lay->tp, 0, lay->sp, &sh)) != L3D_OK) return st;
    }
    if (run->global_batch % ((int64_t)lay->micro_batch * lay->dp) != 0)
        return l3d_error(L3D_ERR_LAYOUT, "global batch %lld is not a multiple of micro-batch %d x "
                         "dp %d", (long long)run->global_batch, lay->micro_batch, lay->dp);
    int64_t mm = run->global_batch / ((int64_t)lay->micro_batch * lay->dp);
    if (mm > 1 << 24)
        return l3d_error(L3D_ERR_LAYOUT, "%lld micro-batches a step is too many", (long long)mm);
    if ((int64_t)lay->pp * lay->v > m->L)
        return l3d_error(L3D_ERR_LAYOUT, "pp %d x v %d stages for %d layers", lay->pp, lay->v,
                         m->L);
    if (!l3d_plan_trainer(run) && m->L % (lay->pp * lay->v) != 0)
        return l3d_error(L3D_ERR_LAYOUT, "%d layers do not split evenly into pp %d x v %d stages",
                         m->L, lay->pp, lay->v);
    if (lay->v > 1 && (lay->pp < 2 || mm % lay->pp != 0 || lay->schedule != L3D_PP_INTERLEAVED))
        return l3d_error(L3D_ERR_LAYOUT, "v %d chunks a rank needs the interleaved schedule, pp >= "
                         "2 and micro-batches (%lld) divisible by pp %d", lay->v, (long long)mm,
                         lay->pp);
    if (lay->v == 1 && lay->schedule == L3D_PP_INTERLEAVED)
        return l3d_error(L3D_ERR_LAYOUT, "the interleaved schedule needs v >= 2");
    if (lay->zero < 0 || lay->zero > 2)
        return l3d_error(L3D_ERR_LAYOUT, "ZeRO stage %d: 0, 1 or 2", lay->zero);
    /* llm3d's trainer refuses ZeRO over more than 256 replicas (ZERO_MAX_DP, src/train/layout.c:
     * its all-gather keeps per-rank counts on the stack, src/parallel/dp.c): propose only what
     * it runs */
    if (l3d_plan_trainer(run) && lay->zero > 0 && lay->dp > 256)
        return l3d_error(L3D_ERR_LAYOUT, "ZeRO-%d over dp %d: llm3d's trainer shards over at most "
                         "256 replicas; ZeRO-0, or a larger tp or pp", lay->zero, lay->dp);
    if (lay->sp && (lay->tp < 2 || ((int64_t)lay->micro_batch * m->maxT) % lay->tp != 0))
        return l3d_error(L3D_ERR_LAYOUT, "sequence parallelism needs tp >= 2 dividing micro-batch "
                         "x sequence (%d x %d)", lay->micro_batch, m->maxT);
    if (lay->recompute < L3D_RECOMPUTE_NONE || lay->recompute > L3D_RECOMPUTE_FULL)
        return l3d_error(L3D_ERR_LAYOUT, "recompute mode %d", (int)lay->recompute);
    return L3D_OK;
}
