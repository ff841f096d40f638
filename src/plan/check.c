/* The planner's view of a layout (l3d_plan_view: what it left open filled) and whether it suits
 * the model, the run and the profile (l3d_plan_check): the run spec's rules (the trainer's or
 * Megatron-LM's) and the profile's, each a sentence naming the value. */
#include "llm3d/spec.h"
#include "plan-impl.h"

void l3d_plan_view(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                   struct l3d_model_spec *ms, struct l3d_layout *lo) {
    *lo = *lay;
    if (lo->seq == 0) lo->seq = m->maxT;
    if (lo->threads == 0) lo->threads = 1;
    if (lo->global_batch == 0)
        lo->global_batch = (int64_t)lo->micro_batch * lo->dp * (lo->accum > 0 ? lo->accum : 1);
    if (lo->bucket_bytes == 0) lo->bucket_bytes = L3D_PLAN_BUCKET_BYTES;
    *ms = *m;
    ms->maxT = lo->seq;
}

l3d_status l3d_plan_zero_check(const struct l3d_profile *prof, const struct l3d_plan_run *run,
                               int zero) {
    if (zero != 3 || l3d_plan_trainer(run)) return L3D_OK;
    return l3d_error(L3D_ERR_LAYOUT, "--zero 3: the plan follows Megatron-LM's %s mixed precision "
                     "here (--trainer megatron%s), whose distributed optimizer shards the "
                     "optimizer state and gradients (ZeRO-1/2), never the parameters: give "
                     "--trainer llm3d to plan this project's ZeRO-3, or --zero 1 or 2",
                     l3d_dtype_name(run->precision.param),
                     prof && prof->compute_units > 0 ? ", the default on a GPU profile" : "");
}

l3d_status l3d_plan_check(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                          const struct l3d_plan_run *run, const struct l3d_layout *lay_in) {
    struct l3d_model_spec ms;
    struct l3d_layout viewed, *lay = &viewed;
    l3d_plan_view(m, lay_in, &ms, &viewed);
    l3d_status st = l3d_plan_model_check(&ms);
    if (st != L3D_OK) return st;
    if ((st = l3d_plan_zero_check(prof, run, lay->zero)) != L3D_OK) return st;
    if (l3d_pp_split(lay->schedule) && lay->pp > 1 && !l3d_plan_trainer(run))
        return l3d_error(L3D_ERR_LAYOUT, "--pp-schedule %s: the plan follows Megatron-LM here "
                         "(--trainer megatron), which has no zero-bubble schedule: give --trainer "
                         "llm3d to plan this project's, or --pp-schedule 1f1b",
                         l3d_pp_kind_name(lay->schedule));
    int th = lay->threads;
    if (th < 1)
        return l3d_error(L3D_ERR_LAYOUT, "--threads %d must be at least 1", th);
    /* the run spec's rules (src/spec/spec.c) for this layout, and llm3d's trainer adds its own
     * limits */
    struct l3d_run_spec s = {.model = *m, .layout = *lay, .precision = run->precision};
    s.layout.cp = lay->cp > 0 ? lay->cp : 1;
    struct l3d_spec_ctx ctx = {.world = run->devices, .threads_in_world = true,
                               .train = l3d_plan_trainer(run)};
    if ((st = l3d_spec_check_parts(&s, &ctx, L3D_SPEC_MODEL, NULL)) != L3D_OK) return st;
    /* to the planner, a layout rule broken is a layout that does not suit the run */
    if (l3d_spec_check_parts(&s, &ctx, L3D_SPEC_LAYOUT, NULL) != L3D_OK)
        return L3D_ERR_LAYOUT; /* the message is the validator's */
    if (prof && th > 1 && prof->devices_per_node > 1 && th > prof->devices_per_node)
        return l3d_error(L3D_ERR_LAYOUT, "%d threads a rank but %d cores a node", th,
                         prof->devices_per_node);
    if (prof && l3d_plan_peak(prof, run) <= 0)
        return l3d_error(L3D_ERR_ARG, "profile %s has no %s peak (peak_tflops_%s = 0)", prof->name,
                         l3d_dtype_name(run->precision.param),
                         l3d_dtype_name(run->precision.param));
    /* the planner times every micro-batch on a timeline: at most 2^24 of them, also for llm3d's
     * trainer (whose memory check extends the plan beyond, src/train/memory.c) */
    int64_t mm = lay->global_batch / ((int64_t)lay->micro_batch * lay->dp);
    if (mm > 1 << 24)
        return l3d_error(L3D_ERR_LAYOUT, "%lld micro-batches a step is too many", (long long)mm);
    return L3D_OK;
}
