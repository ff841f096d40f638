/* Model presets: GPT-2's sizes and the published runs' models, one table for every command
 * (include/llm3d/spec.h, l3d_model_preset). */
#include <stdio.h>
#include <string.h>

#include "llm3d/spec.h"

static const struct preset {
    const char *name, *alias, *note;
    int L, C, NH, V, maxT;
} presets[] = {
    /* GPT-2 (Radford et al. 2019) and llm3d's test size */
    {"tiny", NULL, NULL, 2, 64, 4, 256, 64},
    {"d6", NULL, NULL, 6, 384, 6, 50257, 1024},
    {"d12", "gpt2", "124M", 12, 768, 12, 50257, 1024},
    {"d24", "gpt2-medium", "350M", 24, 1024, 16, 50257, 1024},
    {"d36", "gpt2-large", "774M", 36, 1280, 20, 50257, 1024},
    {"d48", "gpt2-xl", "1.5B", 48, 1600, 25, 50257, 1024},
    /* Dash et al. 2023, "Optimizing Distributed Training on Frontier for Large Language Models"
     * (arXiv 2312.12705): the configurations of the authors' scripts */
    {"frontier-22b", NULL, NULL, 48, 6144, 48, 50257, 2048},
    {"frontier-175b", NULL, NULL, 96, 12288, 96, 50257, 2048},
    {"frontier-1t", NULL, NULL, 128, 25600, 128, 50257, 2048},
    /* Brown et al. 2020, Table 2.1 */
    {"gpt3-175b", NULL, NULL, 96, 12288, 96, 50257, 2048},
    /* Narayanan et al. 2021 (Megatron-LM on A100), Table 1: V = 51200, s = 2048 */
    {"megatron-1.7b", NULL, NULL, 24, 2304, 24, 51200, 2048},
    {"megatron-3.6b", NULL, NULL, 30, 3072, 32, 51200, 2048},
    {"megatron-7.5b", NULL, NULL, 36, 4096, 32, 51200, 2048},
    {"megatron-18b", NULL, NULL, 40, 6144, 48, 51200, 2048},
    {"megatron-39b", NULL, NULL, 48, 8192, 64, 51200, 2048},
    {"megatron-76b", NULL, NULL, 60, 10240, 80, 51200, 2048},
    {"megatron-145b", NULL, NULL, 80, 12288, 96, 51200, 2048},
    {"megatron-310b", NULL, NULL, 96, 16384, 128, 51200, 2048},
    {"megatron-530b", NULL, NULL, 105, 20480, 128, 51200, 2048},
    {"megatron-1t", NULL, NULL, 128, 25600, 160, 51200, 2048},
};

/* Llama-family blocks (l3d_model_set_arch) at llm3d's test and demo sizes: NKV key/value heads,
 * a SwiGLU of ffn (8C/3 as Touvron et al. 2023 choose it, rounded), RoPE theta 10000. */
static const struct llama_preset {
    const char *name;
    int L, C, NH, NKV, V, maxT, ffn;
} llama_presets[] = {
    {"llama-tiny", 2, 64, 4, 2, 256, 64, 192},
    {"llama-d6", 6, 384, 6, 2, 50257, 1024, 1024},
};

const char *l3d_model_preset_names(void) {
    static char names[1024];
    if (names[0]) return names;
    size_t k = 0;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0] && k < sizeof names; i++) {
        const struct preset *p = &presets[i];
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", p->name);
        if (p->alias && k < sizeof names)
            k += (size_t)snprintf(names + k, sizeof names - k, " (%s, %s)", p->alias, p->note);
    }
    for (size_t i = 0; i < sizeof llama_presets / sizeof llama_presets[0] && k < sizeof names; i++)
        k += (size_t)snprintf(names + k, sizeof names - k, ", %s", llama_presets[i].name);
    return names;
}

l3d_status l3d_model_preset(struct l3d_model_spec *m, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const struct preset *p = &presets[i];
        if (strcmp(name, p->name) != 0 && !(p->alias && strcmp(name, p->alias) == 0)) continue;
        memset(m, 0, sizeof *m);
        snprintf(m->name, sizeof m->name, "%s", p->name);
        m->L = p->L;
        m->C = p->C;
        m->NH = p->NH;
        m->V = p->V;
        m->maxT = p->maxT;
        return l3d_gpt_config_finish(m);
    }
    for (size_t i = 0; i < sizeof llama_presets / sizeof llama_presets[0]; i++) {
        const struct llama_preset *p = &llama_presets[i];
        if (strcmp(name, p->name) != 0) continue;
        *m = (struct l3d_model_spec){.L = p->L, .C = p->C, .NH = p->NH, .NKV = p->NKV, .V = p->V,
                                     .maxT = p->maxT, .ffn = p->ffn};
        snprintf(m->name, sizeof m->name, "%s", p->name);
        l3d_model_set_arch(m, L3D_ARCH_LLAMA);
        return l3d_gpt_config_finish(m);
    }
    return l3d_error(L3D_ERR_ARG, "--model '%s' is not a preset: choose one of %s, or give "
                     "--layers, --channels, --heads, --vocab, --context", name,
                     l3d_model_preset_names());
}
