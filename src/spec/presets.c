/* Model presets: GPT-2's sizes and the published runs' models, one table for every command
 * (include/llm3d/spec.h, l3d_model_preset). */
#include <stdio.h>
#include <string.h>

#include "llm3d/arch.h"
#include "llm3d/spec.h"

/* A family's blocks (Llama's: RMSNorm, SwiGLU, RoPE, no biases, untied head; its row in
 * include/llm3d/arch.h) with these KV heads, MLP width and RoPE theta; a GPT-2 preset leaves them
 * zero. */
struct llama {
    const char *family; /* the row's name */
    int NKV;
    int64_t ffn;
    double theta;
    struct l3d_rope scaling; /* Llama 3.1's frequency scaling, where its release has it */
    bool qk_norm, tied;      /* Qwen3: QK-norm; its small models tie the head to wte */
    float eps;               /* the norms' epsilon; 0: the default (1e-5) */
    int head_dim;            /* a head's size; 0: hidden / heads */
};

#define LLAMA(kv_heads, mlp_width, rope_theta) \
    {.family = "llama", .NKV = kv_heads, .ffn = mlp_width, .theta = rope_theta}
/* Qwen3's: Llama's blocks with QK-norm, RoPE theta 1e6, epsilon 1e-6, heads of 128 whatever the
 * hidden size */
#define QWEN3(kv_heads, mlp_width, tie)                                                        \
    {.family = "llama", .NKV = kv_heads, .ffn = mlp_width, .theta = 1e6, .qk_norm = true,      \
     .tied = tie, .eps = 1e-6f, .head_dim = 128}
/* Qwen3-MoE's: Qwen3's blocks, untied */
#define QWEN3_MOE(kv_heads, mlp_width) QWEN3(kv_heads, mlp_width, false)

static const struct preset {
    const char *name, *alias, *note;
    int L, C, NH, V, maxT;
    struct llama llama;
} presets[] = {
    /* GPT-2 (Radford et al. 2019) and llm3d's test size */
    {"tiny", NULL, NULL, 2, 64, 4, 256, 64, {0}},
    {"d6", NULL, NULL, 6, 384, 6, 50257, 1024, {0}},
    {"d12", "gpt2", "124M", 12, 768, 12, 50257, 1024, {0}},
    {"d24", "gpt2-medium", "350M", 24, 1024, 16, 50257, 1024, {0}},
    {"d36", "gpt2-large", "774M", 36, 1280, 20, 50257, 1024, {0}},
    {"d48", "gpt2-xl", "1.5B", 48, 1600, 25, 50257, 1024, {0}},
    /* Dash et al. 2023, "Optimizing Distributed Training on Frontier for Large Language Models"
     * (arXiv 2312.12705): the configurations of the authors' scripts */
    {"frontier-22b", NULL, NULL, 48, 6144, 48, 50257, 2048, {0}},
    {"frontier-175b", NULL, NULL, 96, 12288, 96, 50257, 2048, {0}},
    {"frontier-1t", NULL, NULL, 128, 25600, 128, 50257, 2048, {0}},
    /* Brown et al. 2020, Table 2.1 */
    {"gpt3-175b", NULL, NULL, 96, 12288, 96, 50257, 2048, {0}},
    /* Narayanan et al. 2021 (Megatron-LM on A100), Table 1: V = 51200, s = 2048 */
    {"megatron-1.7b", NULL, NULL, 24, 2304, 24, 51200, 2048, {0}},
    {"megatron-3.6b", NULL, NULL, 30, 3072, 32, 51200, 2048, {0}},
    {"megatron-7.5b", NULL, NULL, 36, 4096, 32, 51200, 2048, {0}},
    {"megatron-18b", NULL, NULL, 40, 6144, 48, 51200, 2048, {0}},
    {"megatron-39b", NULL, NULL, 48, 8192, 64, 51200, 2048, {0}},
    {"megatron-76b", NULL, NULL, 60, 10240, 80, 51200, 2048, {0}},
    {"megatron-145b", NULL, NULL, 80, 12288, 96, 51200, 2048, {0}},
    {"megatron-310b", NULL, NULL, 96, 16384, 128, 51200, 2048, {0}},
    {"megatron-530b", NULL, NULL, 105, 20480, 128, 51200, 2048, {0}},
    {"megatron-1t", NULL, NULL, 128, 25600, 160, 51200, 2048, {0}},
    /* llm3d's small Llama models, for tests and examples: GPT-2's d6 and tiny with Llama's
     * blocks, grouped-query attention (2 and 3 query heads a KV head) and a SwiGLU width of
     * about 8C/3 rounded up to a multiple of 64, as Llama sizes its MLPs */
    {"llama-tiny", NULL, NULL, 2, 64, 4, 256, 64, LLAMA(2, 192, 10000.0)},
    {"llama-d6", NULL, NULL, 6, 384, 6, 50257, 1024, LLAMA(2, 1024, 10000.0)},
    /* Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models", Table 1 and
     * sec. 2.2 (context 4096, GQA with 8 KV heads for 70B) and the released models' config.json
     * (MLP widths, vocabulary 32000, RoPE theta 10000) */
    {"llama2-7b", NULL, NULL, 32, 4096, 32, 32000, 4096, LLAMA(32, 11008, 10000.0)},
    {"llama2-13b", NULL, NULL, 40, 5120, 40, 32000, 4096, LLAMA(40, 13824, 10000.0)},
    {"llama2-70b", NULL, NULL, 80, 8192, 64, 32000, 4096, LLAMA(8, 28672, 10000.0)},
    /* Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (layers, model and FFN dimensions,
     * heads, 8 KV heads, vocabulary 128K = 128,256 in the released tokenizer, RoPE theta 500,000)
     * at the 8,192-token sequence of their initial pre-training (sec. 3.4.1); 405B as released
     * (Llama 3.1), with the frequency scaling of its config.json for the 128K context */
    {"llama3-8b", NULL, NULL, 32, 4096, 32, 128256, 8192, LLAMA(8, 14336, 500000.0)},
    {"llama3-70b", NULL, NULL, 80, 8192, 64, 128256, 8192, LLAMA(8, 28672, 500000.0)},
    {"llama3-405b", NULL, NULL, 126, 16384, 128, 128256, 8192,
     {.family = "llama", .NKV = 8, .ffn = 53248, .theta = 500000.0,
      .scaling = {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                  .original_context = 8192}}},
    /* Qwen team 2025, "Qwen3 Technical Report" (arXiv 2505.09388), Table 1, and the released
     * models' config.json (MLP widths, vocabulary 151,936, context 40,960, head_dim 128: hidden /
     * heads for 1.7B, 8B and 14B, apart from it for 0.6B, 4B and 32B). 0.6B parameters, 0.44B
     * without the embedding (tied head); 1.7B, 1.4B (tied); 4.0B, 3.6B (tied); 8.2B, 6.95B;
     * 14.8B, 13.2B; 32.8B, 31.2B (the model cards) */
    {"qwen3-0.6b", NULL, NULL, 28, 1024, 16, 151936, 40960, QWEN3(8, 3072, true)},
    {"qwen3-1.7b", NULL, NULL, 28, 2048, 16, 151936, 40960, QWEN3(8, 6144, true)},
    {"qwen3-4b", NULL, NULL, 36, 2560, 32, 151936, 40960, QWEN3(8, 9728, true)},
    {"qwen3-8b", NULL, NULL, 36, 4096, 32, 151936, 40960, QWEN3(8, 12288, false)},
    {"qwen3-14b", NULL, NULL, 40, 5120, 40, 151936, 40960, QWEN3(8, 17408, false)},
    {"qwen3-32b", NULL, NULL, 64, 5120, 64, 151936, 40960, QWEN3(8, 25600, false)},
};

/* llm3d's mixtures of experts (include/llm3d/model.h, struct l3d_moe_spec), each a preset above
 * with experts: for tests, GPT-2's tiny with 4 experts, top-2, renormalised (Mixtral's router)
 * and small auxiliary losses; GPT-2 small with 8 experts, top-2, each of half the dense MLP's
 * width (2C), so that a token's two experts cost what the dense MLP does (the benchmark
 * model). */
static const struct moe_preset {
    const char *name, *base; /* base NULL: the sizes of own */
    struct preset own;
    struct l3d_moe_spec moe;
} moe_presets[] = {
    {"moe-tiny", "tiny", {0}, {.experts = 4, .top_k = 2, .ffn = 128, .norm_topk = true,
                               .aux_coef = 0.01, .z_coef = 0.001}},
    {"gpt2-moe", "d12", {0}, {.experts = 8, .top_k = 2, .ffn = 1536, .norm_topk = true,
                              .aux_coef = 0.01}},
    /* Jiang et al. 2024, "Mixtral of Experts" (arXiv 2401.04088), Table 1, and the released
     * models' config.json (vocabulary, context, RoPE theta 1e6, router_aux_loss_coef): Llama's
     * blocks with 8 experts of the MLP's width, top-2 renormalised, in every layer. 46.7B
     * parameters, 12.9B active (8x7B); 141B, 39B (8x22B; Mistral AI's release notes) */
    {"mixtral-8x7b", NULL, {"mixtral-8x7b", NULL, NULL, 32, 4096, 32, 32000, 32768,
                            LLAMA(8, 14336, 1e6)},
     {.experts = 8, .top_k = 2, .ffn = 14336, .norm_topk = true, .aux_coef = 0.02}},
    {"mixtral-8x22b", NULL, {"mixtral-8x22b", NULL, NULL, 56, 6144, 48, 32768, 65536,
                             LLAMA(8, 16384, 1e6)},
     {.experts = 8, .top_k = 2, .ffn = 16384, .norm_topk = true, .aux_coef = 0.001}},
    /* Qwen team 2025, "Qwen3 Technical Report" (arXiv 2505.09388), Table 2, and the released
     * models' config.json (head_dim 128 apart from hidden / heads, moe_intermediate_size,
     * intermediate_size, vocabulary 151,936, context 40,960, norm_topk_prob true,
     * router_aux_loss_coef 0.001): 128 experts, top-8 renormalised, in every layer. 30.5B
     * parameters, 3.3B active (30B-A3B); 235B, 22B (235B-A22B) */
    {"qwen3-30b-a3b", NULL, {"qwen3-30b-a3b", NULL, NULL, 48, 2048, 32, 151936, 40960,
                             QWEN3_MOE(4, 6144)},
     {.experts = 128, .top_k = 8, .ffn = 768, .norm_topk = true, .aux_coef = 0.001}},
    {"qwen3-235b-a22b", NULL, {"qwen3-235b-a22b", NULL, NULL, 94, 4096, 64, 151936, 40960,
                               QWEN3_MOE(4, 12288)},
     {.experts = 128, .top_k = 8, .ffn = 1536, .norm_topk = true, .aux_coef = 0.001}},
};

static l3d_status preset_sizes(struct l3d_model_spec *m, const struct preset *p);

const char *l3d_model_preset_names(void) {
    static char names[2048];
    if (names[0]) return names;
    size_t k = 0;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0] && k < sizeof names; i++) {
        const struct preset *p = &presets[i];
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", p->name);
        if (p->alias && k < sizeof names)
            k += (size_t)snprintf(names + k, sizeof names - k, " (%s, %s)", p->alias, p->note);
    }
    for (size_t i = 0; i < sizeof moe_presets / sizeof moe_presets[0] && k < sizeof names; i++)
        k += (size_t)snprintf(names + k, sizeof names - k, ", %s", moe_presets[i].name);
    return names;
}

l3d_status l3d_model_preset(struct l3d_model_spec *m, const char *name) {
    for (size_t i = 0; i < sizeof moe_presets / sizeof moe_presets[0]; i++) {
        const struct moe_preset *p = &moe_presets[i];
        if (strcmp(name, p->name) != 0) continue;
        l3d_status st = p->base ? l3d_model_preset(m, p->base) : preset_sizes(m, &p->own);
        L3D_ASSERT(st == L3D_OK);
        snprintf(m->name, sizeof m->name, "%s", p->name);
        m->moe = p->moe;
        return l3d_gpt_config_finish(m);
    }
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const struct preset *p = &presets[i];
        if (strcmp(name, p->name) == 0 || (p->alias && strcmp(name, p->alias) == 0))
            return preset_sizes(m, p);
    }
    return l3d_error(L3D_ERR_ARG, "--model '%s' is not a preset: choose one of %s, or give "
                     "--layers, --channels, --heads, --vocab, --context", name,
                     l3d_model_preset_names());
}

/* A preset's sizes and family into m, finished. */
static l3d_status preset_sizes(struct l3d_model_spec *m, const struct preset *p) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", p->name);
    m->L = p->L;
    m->C = p->C;
    m->NH = p->NH;
    m->V = p->V;
    m->maxT = p->maxT;
    if (p->llama.family) {
        const struct l3d_arch_info *a = l3d_arch_by_name(p->llama.family);
        L3D_ASSERT(a);
        l3d_model_set_arch(m, a->arch);
        m->NKV = p->llama.NKV;
        m->ffn = p->llama.ffn;
        m->rope = p->llama.scaling;
        m->rope.theta = p->llama.theta;
        m->qk_norm = p->llama.qk_norm;
        if (p->llama.tied) m->untied = false;
        m->norm_eps = p->llama.eps;
        m->head_dim = p->llama.head_dim;
    }
    return l3d_gpt_config_finish(m);
}
