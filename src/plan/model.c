/* The planner's model (include/llm3d/plan.h): the presets of published runs, the checks of
 * explicit sizes, the trainer's config of the same sizes and the parameter count. */
#include <stdio.h>
#include <string.h>

#include "llm3d/plan.h"
#include "llm3d/spec.h"

static const struct {
    const char *name;
    int L, h, heads, V, s;
} presets[] = {
    /* Dash et al. 2023, "Optimizing Distributed Training on Frontier for Large Language Models"
     * (arXiv 2312.12705): the configurations of the authors' scripts */
    {"frontier-22b", 48, 6144, 48, 50257, 2048},
    {"frontier-175b", 96, 12288, 96, 50257, 2048},
    {"frontier-1t", 128, 25600, 128, 50257, 2048},
    /* Brown et al. 2020, Table 2.1 */
    {"gpt3-175b", 96, 12288, 96, 50257, 2048},
    /* Narayanan et al. 2021 (Megatron-LM on A100), Table 1: V = 51200, s = 2048 */
    {"megatron-1.7b", 24, 2304, 24, 51200, 2048},
    {"megatron-3.6b", 30, 3072, 32, 51200, 2048},
    {"megatron-7.5b", 36, 4096, 32, 51200, 2048},
    {"megatron-18b", 40, 6144, 48, 51200, 2048},
    {"megatron-39b", 48, 8192, 64, 51200, 2048},
    {"megatron-76b", 60, 10240, 80, 51200, 2048},
    {"megatron-145b", 80, 12288, 96, 51200, 2048},
    {"megatron-310b", 96, 16384, 128, 51200, 2048},
    {"megatron-530b", 105, 20480, 128, 51200, 2048},
    {"megatron-1t", 128, 25600, 160, 51200, 2048},
};

const char *l3d_plan_model_names(void) {
    return "GPT-2 sizes (tiny, d6, d12 = gpt2, d24, d36, d48 = gpt2-xl; s = 1024), frontier-22b, "
           "frontier-175b, frontier-1t, gpt3-175b, megatron-1.7b, -3.6b, -7.5b, -18b, -39b, -76b, "
           "-145b, -310b, -530b, -1t";
}

l3d_status l3d_plan_model_preset(struct l3d_plan_model *m, const char *name) {
    memset(m, 0, sizeof *m);
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) {
            snprintf(m->name, sizeof m->name, "%s", name);
            m->L = presets[i].L;
            m->h = presets[i].h;
            m->heads = presets[i].heads;
            m->V = presets[i].V;
            m->s = presets[i].s;
            m->ffn = 4LL * m->h;
            return L3D_OK;
        }
    struct l3d_model_spec cfg;
    if (l3d_model_preset(&cfg, name) != L3D_OK)
        return l3d_error(L3D_ERR_ARG, "--model '%s' is not a preset: choose one of %s, or give "
                         "--layers, --hidden, --heads, --vocab, --seq-len", name,
                         l3d_plan_model_names());
    snprintf(m->name, sizeof m->name, "%s", name);
    m->L = cfg.L;
    m->h = cfg.C;
    m->heads = cfg.NH;
    m->V = cfg.V;
    m->s = cfg.maxT;
    m->ffn = 4LL * m->h;
    return L3D_OK;
}

l3d_status l3d_plan_model_check(const struct l3d_plan_model *m) {
    if (m->L < 1 || m->h < 1 || m->heads < 1 || m->V < 1 || m->s < 1)
        return l3d_error(L3D_ERR_ARG, "model sizes must be positive (--layers %d, --hidden %d, "
                         "--heads %d, --vocab %d, --seq-len %d)", m->L, m->h, m->heads, m->V, m->s);
    if (m->ffn < 1 || m->ffn > (int64_t)1 << 24)
        return l3d_error(L3D_ERR_ARG, "--ffn %lld must be from 1 to 2^24", (long long)m->ffn);
    if (m->h % m->heads != 0)
        return l3d_error(L3D_ERR_ARG, "--hidden %d must be divisible by --heads %d", m->h,
                         m->heads);
    if (m->V > 1 << 30 || m->h > 1 << 20 || m->L > 1 << 16 || m->s > 1 << 22)
        return l3d_error(L3D_ERR_ARG, "model sizes out of range (vocabulary <= 2^30, hidden <= "
                         "2^20, layers <= 65536, sequence <= 2^22)");
    /* weights and a layer's products alone, in double: a model beyond 10^15 parameters (500x
     * the largest trained) would overflow the planner's 64-bit element counts long before
     * anything could hold it */
    double h = m->h;
    double params = (double)m->L * (4 * h * h + 2 * h * (double)m->ffn) + (double)m->V * h;
    if (params > 1e15)
        return l3d_error(L3D_ERR_ARG, "a model of %.3g parameters (--layers %d, --hidden %d, "
                         "--ffn %lld, --vocab %d): the planner sizes models up to 10^15 "
                         "parameters; lower --layers or --hidden", params, m->L, m->h,
                         (long long)m->ffn, m->V);
    return L3D_OK;
}

struct l3d_model_spec l3d_plan_model_gpt(const struct l3d_plan_model *m) {
    struct l3d_model_spec c = {.L = m->L, .C = m->h, .NH = m->heads, .V = m->V, .maxT = m->s};
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    return c;
}

int64_t l3d_plan_model_params(const struct l3d_plan_model *m) {
    struct l3d_model_spec c = l3d_plan_model_gpt(m);
    /* fcw, fcb and fcprojw of an MLP of width ffn instead of 4h */
    return l3d_gpt_param_count(&c) + (int64_t)m->L * (m->ffn - 4LL * m->h) * (2LL * m->h + 1);
}
