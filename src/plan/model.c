/* The planner's model (include/llm3d/plan.h): the checks of explicit sizes, the trainer's model
 * of the same sizes and the parameter count (the presets are src/spec/presets.c). */
#include <stdio.h>
#include <string.h>

#include "llm3d/plan.h"
#include "llm3d/spec.h"

l3d_status l3d_plan_model_check(const struct l3d_model_spec *m) {
    if (m->L < 1 || m->C < 1 || m->NH < 1 || m->V < 1 || m->maxT < 1)
        return l3d_error(L3D_ERR_ARG, "model sizes must be positive (--layers %d, --channels %d, "
                         "--heads %d, --vocab %d, --seq-len %d)", m->L, m->C, m->NH, m->V, m->maxT);
    if (m->ffn < 1 || m->ffn > (int64_t)1 << 24)
        return l3d_error(L3D_ERR_ARG, "--ffn %lld must be from 1 to 2^24", (long long)m->ffn);
    if (m->C % m->NH != 0)
        return l3d_error(L3D_ERR_ARG, "--channels %d must be divisible by --heads %d", m->C,
                         m->NH);
    if (m->V > 1 << 30 || m->C > 1 << 20 || m->L > 1 << 16 || m->maxT > 1 << 22)
        return l3d_error(L3D_ERR_ARG, "model sizes out of range (vocabulary <= 2^30, channels <= "
                         "2^20, layers <= 65536, sequence <= 2^22)");
    /* weights and a layer's products alone, in double: a model beyond 10^15 parameters (500x
     * the largest trained) would overflow the planner's 64-bit element counts long before
     * anything could hold it */
    double h = m->C;
    double params = (double)m->L * (4 * h * h + 2 * h * (double)m->ffn) + (double)m->V * h;
    if (params > 1e15)
        return l3d_error(L3D_ERR_ARG, "a model of %.3g parameters (--layers %d, --channels %d, "
                         "--ffn %lld, --vocab %d): the planner sizes models up to 10^15 "
                         "parameters; lower --layers or --channels", params, m->L, m->C,
                         (long long)m->ffn, m->V);
    return L3D_OK;
}

struct l3d_model_spec l3d_plan_model_gpt(const struct l3d_model_spec *m) {
    struct l3d_model_spec c = {.L = m->L, .C = m->C, .NH = m->NH, .V = m->V, .maxT = m->maxT};
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    return c;
}

int64_t l3d_plan_model_params(const struct l3d_model_spec *m) {
    struct l3d_model_spec c = l3d_plan_model_gpt(m);
    /* fcw, fcb and fcprojw of an MLP of width ffn instead of 4h */
    return l3d_gpt_param_count(&c) + (int64_t)m->L * (m->ffn - 4LL * m->C) * (2LL * m->C + 1);
}
