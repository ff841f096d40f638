/* Mixtral and Qwen3-MoE as data (src/model/arch.c's flavour rows, src/ckpt/hf.c,
 * src/spec/presets.c): the published parameter counts of the Mixtral, dense Qwen3 and Qwen3-MoE
 * (30B-A3B, 235B-A22B: heads of 128 apart from hidden / heads) presets derived from their sizes
 * by exact formulas written here (not llm3d's), against llm3d's counts and the published figures
 * within their rounding; Qwen3-MoE's config.json read with its head_dim; the rows Qwen3's
 * QK-norm selects; the row a model is written as, and the models no row holds; MixtralConfig's
 * keys to a spec and back (router_aux_loss_coef counted only with output_router_logits) and the values
 * refused; the tensor map of a tiny Mixtral (names, shapes, each expert's rows); a folder written
 * and read back bit for bit, and refused by the loader when its config counts other experts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/arch.h"
#include "llm3d/file.h"
#include "llm3d/hf.h"
#include "llm3d/spec.h"
#include "test.h"

/* A Llama-blocks model with experts in every layer and an untied head: the count of Jiang et al.
 * 2024's Table 1 sizes, every tensor named. `active`: K of the E experts. */
static double mixtral_count(double L, double C, double NH, double KV, double V, double F,
                            double E, double K, bool active) {
    double hd = C / NH, embed = 2 * V * C; /* embed_tokens and lm_head */
    double attn = C * NH * hd + 2 * C * KV * hd + NH * hd * C, norms = 2 * C;
    double experts = (active ? K : E) * 3 * C * F, router = E * C;
    return embed + C + L * (norms + attn + router + experts);
}

/* |x - published| within half the unit of the published figure's last digit. */
static bool within_rounding(double x, double published, double unit) {
    return fabs(x - published) <= unit / 2;
}

/* x truncated to the unit of the published figure's last digit is that figure (the Qwen3 report
 * truncates: 3.35B activated is its "3.3B"). */
static bool within_truncation(double x, double published, double unit) {
    return x >= published && x < published + unit;
}

static void test_presets(void) {
    static const struct {
        const char *name;
        double L, C, NH, KV, V, F, E, K, total, active, unit;
    } p[] = {
        {"mixtral-8x7b", 32, 4096, 32, 8, 32000, 14336, 8, 2, 46.7e9, 12.9e9, 0.1e9},
        {"mixtral-8x22b", 56, 6144, 48, 8, 32768, 16384, 8, 2, 141e9, 39e9, 1e9},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        struct l3d_model_spec m;
        CHECK(l3d_model_preset(&m, p[i].name) == L3D_OK);
        CHECK(m.L == p[i].L && m.C == p[i].C && m.NH == p[i].NH && m.NKV == p[i].KV &&
              m.V == p[i].V && m.moe.ffn == p[i].F && m.moe.experts == p[i].E &&
              m.moe.top_k == p[i].K && m.moe.norm_topk && m.moe.dense_layers == 0 &&
              m.arch == L3D_ARCH_LLAMA && m.untied && m.Vp == m.V);
        double total = mixtral_count(p[i].L, p[i].C, p[i].NH, p[i].KV, p[i].V, p[i].F, p[i].E,
                                     p[i].K, false);
        double active = mixtral_count(p[i].L, p[i].C, p[i].NH, p[i].KV, p[i].V, p[i].F, p[i].E,
                                      p[i].K, true);
        CHECK_NEAR(l3d_model_param_count(&m), total, 0.0);
        CHECK_NEAR(l3d_model_active_param_count(&m), active, 0.0);
        CHECK(within_rounding(total, p[i].total, p[i].unit));
        CHECK(within_rounding(active, p[i].active, p[i].unit));
        printf("%s: %.0f parameters (published %.3g), %.0f active (%.3g)\n", p[i].name, total,
               p[i].total, active, p[i].active);
    }
    /* negative: the formula tells the presets apart, and a count off by one expert fails */
    CHECK(!within_rounding(mixtral_count(32, 4096, 32, 8, 32000, 14336, 7, 2, false), 46.7e9,
                           0.1e9));
    CHECK(!within_rounding(mixtral_count(32, 4096, 32, 8, 32000, 14336, 8, 3, true), 12.9e9,
                           0.1e9));
}

/* Qwen3-MoE (Qwen3MoeForCausalLM): attention of NH query heads of hd (q dim NH hd, which the
 * published models make 2 C: hd is decoupled from C / NH), QK-norm's two hd vectors a layer,
 * experts in every layer, untied head. `active`: K of the E experts. */
static double qwen3_moe_count(double L, double C, double NH, double KV, double hd, double V,
                              double F, double E, double K, bool active) {
    double embed = 2 * V * C, attn = C * NH * hd + 2 * C * KV * hd + NH * hd * C;
    double norms = 2 * C + 2 * hd, experts = (active ? K : E) * 3 * C * F, router = E * C;
    return embed + C + L * (norms + attn + router + experts);
}

/* The Qwen3-MoE presets (Qwen3 technical report, Table 2; their config.json sizes, checked
 * here field by field) counted by qwen3_moe_count from the preset's own fields: 30.5B total,
 * 3.3B active; 235B, 22B; llm3d's counts of the preset the same. Their head size (128) is set
 * apart from hidden / heads (2048 / 32, 4096 / 64). Negative: the coupled head size's count
 * misses the published figure. */
static void test_qwen3_counts(void) {
    static const struct {
        const char *name;
        int L, C, NH, KV, hd, V, F, E, K;
        double total, active, unit;
    } p[] = {
        {"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 151936, 768, 128, 8, 30.5e9, 3.3e9, 0.1e9},
        {"qwen3-235b-a22b", 94, 4096, 64, 4, 128, 151936, 1536, 128, 8, 235e9, 22e9, 1e9},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        struct l3d_model_spec m;
        CHECK(l3d_model_preset(&m, p[i].name) == L3D_OK);
        CHECK(m.L == p[i].L && m.C == p[i].C && m.NH == p[i].NH && m.NKV == p[i].KV &&
              l3d_model_head_dim(&m) == p[i].hd && m.V == p[i].V && m.Vp == p[i].V &&
              m.moe.ffn == p[i].F && m.moe.experts == p[i].E && m.moe.top_k == p[i].K &&
              m.moe.norm_topk && m.qk_norm && m.untied && m.rope.theta == 1e6);
        double hd = l3d_model_head_dim(&m), total, active;
        total = qwen3_moe_count(m.L, m.C, m.NH, m.NKV, hd, m.Vp, (double)m.moe.ffn,
                                m.moe.experts, m.moe.top_k, false);
        active = qwen3_moe_count(m.L, m.C, m.NH, m.NKV, hd, m.Vp, (double)m.moe.ffn,
                                 m.moe.experts, m.moe.top_k, true);
        CHECK(within_truncation(total, p[i].total, p[i].unit));
        CHECK(within_truncation(active, p[i].active, p[i].unit));
        CHECK_NEAR(l3d_model_param_count(&m), total, 0.0);
        CHECK_NEAR(l3d_model_active_param_count(&m), active, 0.0);
        CHECK((double)l3d_gpt_param_count(&m) == total);
        printf("%s: %.0f parameters (published %.3g), %.0f active (%.3g)\n", p[i].name, total,
               p[i].total, active, p[i].active);
        double coupled = qwen3_moe_count(m.L, m.C, m.NH, m.NKV, (double)m.C / m.NH, m.Vp,
                                         (double)m.moe.ffn, m.moe.experts, m.moe.top_k, false);
        CHECK(!within_truncation(coupled, p[i].total, p[i].unit));
    }
    struct l3d_model_spec m;
    L3D_ASSERT(l3d_model_preset(&m, "llama-tiny") == L3D_OK);
    m.qk_norm = true;
    m.moe = (struct l3d_moe_spec){.experts = 4, .top_k = 2, .ffn = 40};
    L3D_ASSERT(l3d_gpt_config_finish(&m) == L3D_OK);
    /* the 30B's config.json: read with its head size, the preset's shapes */
    static const char cfg[] =
        "{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 48, \"hidden_size\": 2048, "
        "\"num_attention_heads\": 32, \"num_key_value_heads\": 4, \"head_dim\": 128, "
        "\"intermediate_size\": 6144, \"moe_intermediate_size\": 768, \"num_experts\": 128, "
        "\"num_experts_per_tok\": 8, \"norm_topk_prob\": true, \"vocab_size\": 151936, "
        "\"max_position_embeddings\": 40960}";
    struct l3d_model_spec q = m, pre; /* QK-norm with experts: Qwen3-MoE's row; without: Qwen3's */
    const struct l3d_arch_info *a = l3d_arch_hf_row(&q);
    CHECK(a && a->moe && a->qk_norm && strcmp(a->hf_model_type, "qwen3_moe") == 0 &&
          l3d_arch_hf_check(a, &q) == L3D_OK); /* an unnormalised top-k: norm_topk_prob false */
    q.moe = (struct l3d_moe_spec){0};
    a = l3d_arch_hf_row(&q);
    CHECK(a && !a->moe && strcmp(a->hf_architecture, "Qwen3ForCausalLM") == 0);
    q.qk_norm = false;
    CHECK(l3d_arch_hf_row(&q) == l3d_arch_info(L3D_ARCH_LLAMA));
    CHECK(l3d_hf_config_parse(cfg, strlen(cfg), "c", &q) == L3D_OK);
    CHECK(l3d_model_preset(&pre, "qwen3-30b-a3b") == L3D_OK && l3d_model_same_shapes(&q, &pre) &&
          q.head_dim == 128);
    /* negative: without head_dim the 2048 channels make heads of 64, another model */
    static const char coupled[] =
        "{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 48, \"hidden_size\": 2048, "
        "\"num_attention_heads\": 32, \"num_key_value_heads\": 4, "
        "\"intermediate_size\": 6144, \"moe_intermediate_size\": 768, \"num_experts\": 128, "
        "\"num_experts_per_tok\": 8, \"norm_topk_prob\": true, \"vocab_size\": 151936, "
        "\"max_position_embeddings\": 40960}";
    CHECK(l3d_hf_config_parse(coupled, strlen(coupled), "c", &q) == L3D_OK &&
          l3d_model_head_dim(&q) == 64 && !l3d_model_same_shapes(&q, &pre));
    /* channels that do not split into the heads need head_dim; an odd one cannot rotate */
    static const char uneven[] =
        "{\"model_type\": \"qwen3\", \"num_hidden_layers\": 2, \"hidden_size\": 100, "
        "\"num_attention_heads\": 8, \"intermediate_size\": 64, \"vocab_size\": 300, "
        "\"max_position_embeddings\": 64%s}";
    char text[512];
    snprintf(text, sizeof text, uneven, "");
    CHECK(l3d_hf_config_parse(text, strlen(text), "c", &q) == L3D_ERR_FORMAT &&
          strstr(l3d_error_message(), "\"head_dim\" missing, and 100 channels do not split "
                                      "into 8 heads"));
    snprintf(text, sizeof text, uneven, ", \"head_dim\": 16");
    CHECK(l3d_hf_config_parse(text, strlen(text), "c", &q) == L3D_OK && q.head_dim == 16 &&
          l3d_gpt_param_count(&q) == (int64_t)l3d_model_param_count(&q));
    snprintf(text, sizeof text, uneven, ", \"head_dim\": 15");
    CHECK(l3d_hf_config_parse(text, strlen(text), "c", &q) == L3D_ERR_FORMAT &&
          strstr(l3d_error_message(), "even head size, not 15"));
}

/* Dense Qwen3 (Qwen3ForCausalLM): Llama's blocks, QK-norm's two hd vectors a layer, a head tied
 * to the embedding or not; `embed` false: without the embedding and head (the model cards'
 * "non-embedding" count). */
static double qwen3_count(double L, double C, double NH, double KV, double hd, double V, double F,
                          bool tied, bool embed) {
    double attn = C * NH * hd + 2 * C * KV * hd + NH * hd * C;
    double layer = attn + 3 * C * F + 2 * C + 2 * hd;
    return (embed ? (tied ? 1 : 2) * V * C : 0.0) + C + L * layer;
}

/* The dense Qwen3 presets against their model cards' counts, rounded (0.6B / 0.44B without the
 * embedding, 1.7B / 1.4B, 4.0B / 3.6B, 8.2B / 6.95B, 14.8B / 13.2B, 32.8B / 31.2B; heads of 128,
 * apart from hidden / heads in 0.6B, 4B and 32B); their blocks (QK-norm, RoPE theta 1e6, eps 1e-6,
 * the small models' tied head). Negative: the 1.7B with an untied head, the 8B with a KV head per
 * query head, the 32B with heads of hidden / heads: the formula tells them from the cards. */
static void test_qwen3_presets(void) {
    static const struct {
        const char *name;
        double L, C, NH, KV, hd, V, F;
        bool tied;
        double total, body, unit, body_unit;
    } p[] = {
        {"qwen3-0.6b", 28, 1024, 16, 8, 128, 151936, 3072, true, 0.6e9, 0.44e9, 0.1e9, 0.01e9},
        {"qwen3-1.7b", 28, 2048, 16, 8, 128, 151936, 6144, true, 1.7e9, 1.4e9, 0.1e9, 0.1e9},
        {"qwen3-4b", 36, 2560, 32, 8, 128, 151936, 9728, true, 4.0e9, 3.6e9, 0.1e9, 0.1e9},
        {"qwen3-8b", 36, 4096, 32, 8, 128, 151936, 12288, false, 8.2e9, 6.95e9, 0.1e9, 0.01e9},
        {"qwen3-14b", 40, 5120, 40, 8, 128, 151936, 17408, false, 14.8e9, 13.2e9, 0.1e9, 0.1e9},
        {"qwen3-32b", 64, 5120, 64, 8, 128, 151936, 25600, false, 32.8e9, 31.2e9, 0.1e9, 0.1e9},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        struct l3d_model_spec m;
        CHECK(l3d_model_preset(&m, p[i].name) == L3D_OK);
        CHECK(m.L == p[i].L && m.C == p[i].C && m.NH == p[i].NH && m.NKV == p[i].KV &&
              l3d_model_head_dim(&m) == p[i].hd && m.V == p[i].V && m.ffn == p[i].F && m.qk_norm && m.untied == !p[i].tied &&
              m.rope.theta == 1e6 && m.norm_eps == 1e-6f && m.Vp == m.V);
        CHECK(l3d_arch_hf_row(&m) == l3d_arch_by_hf_type("qwen3"));
        double total = qwen3_count(p[i].L, p[i].C, p[i].NH, p[i].KV, p[i].hd, p[i].V, p[i].F,
                                   p[i].tied, true);
        double body = qwen3_count(p[i].L, p[i].C, p[i].NH, p[i].KV, p[i].hd, p[i].V, p[i].F,
                                  p[i].tied, false);
        CHECK_NEAR(l3d_model_param_count(&m), total, 0.0);
        CHECK(within_rounding(total, p[i].total, p[i].unit));
        CHECK(within_rounding(body, p[i].body, p[i].body_unit));
        printf("%s: %.0f parameters (published %.3g), %.0f without the embedding (%.3g)\n",
               p[i].name, total, p[i].total, body, p[i].body);
    }
    CHECK(!within_rounding(qwen3_count(28, 2048, 16, 8, 128, 151936, 6144, false, true), 1.7e9,
                           0.1e9));
    CHECK(!within_rounding(qwen3_count(36, 4096, 32, 32, 128, 151936, 12288, false, false), 6.95e9,
                           0.01e9)); /* a KV head per query head */
    CHECK(!within_rounding(qwen3_count(64, 5120, 64, 8, 80, 151936, 25600, false, false), 31.2e9,
                           0.1e9)); /* the 32B's heads of hidden / heads (80), not 128 */
}

/* llama-tiny with E experts in every layer, top-2 renormalised. */
static struct l3d_model_spec tiny_mixtral(int E) {
    struct l3d_model_spec m;
    L3D_ASSERT(l3d_model_preset(&m, "llama-tiny") == L3D_OK);
    m.moe = (struct l3d_moe_spec){.experts = E, .top_k = 2, .norm_topk = true};
    L3D_ASSERT(l3d_gpt_config_finish(&m) == L3D_OK);
    return m;
}

static void test_rows(void) {
    struct l3d_model_spec m = tiny_mixtral(4), d, g;
    const struct l3d_arch_info *a = l3d_arch_hf_row(&m);
    CHECK(a && a->moe && strcmp(a->hf_model_type, "mixtral") == 0 && a->arch == L3D_ARCH_LLAMA);
    CHECK(l3d_arch_by_hf_type("mixtral") == a &&
          l3d_arch_by_hf_architecture("MixtralForCausalLM") == a);
    CHECK(!l3d_arch_by_name("mixtral")); /* a flavour, not a family: no --arch mixtral */
    CHECK(l3d_model_preset(&d, "llama-tiny") == L3D_OK && l3d_arch_hf_row(&d) ==
          l3d_arch_info(L3D_ARCH_LLAMA));
    CHECK(l3d_arch_hf_check(a, &m) == L3D_OK);
    CHECK(l3d_model_preset(&g, "moe-tiny") == L3D_OK && !l3d_arch_hf_row(&g));
    struct l3d_hf_tensor *t = NULL;
    int n = 0;
    CHECK(l3d_hf_tensors_ex(&g, false, &t, &n) == L3D_ERR_ARG && !t &&
          strstr(l3d_error_message(), "a GPT-2 model with experts"));
    struct l3d_model_spec s = m;
    s.moe.shared = 1;
    CHECK(l3d_arch_hf_check(a, &s) == L3D_ERR_ARG &&
          strstr(l3d_error_message(), "--moe-shared-experts 1"));
    s = m;
    s.moe.dense_layers = 1;
    CHECK(l3d_hf_tensors(&s, &t, &n) == L3D_ERR_ARG &&
          strstr(l3d_error_message(), "--moe-dense-layers 1"));
    s = m;
    s.moe.norm_topk = false;
    CHECK(l3d_arch_hf_check(a, &s) == L3D_ERR_ARG &&
          strstr(l3d_error_message(), "always renormalises its top-2"));
}

static const struct l3d_hf_tensor *find(const struct l3d_hf_tensor *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].e.name, name) == 0) return &t[i];
    return NULL;
}

static void test_map(void) {
    struct l3d_model_spec m = tiny_mixtral(3);
    m.moe.ffn = 40; /* an expert narrower than the MLP (192): the experts' rows by their width */
    L3D_ASSERT(l3d_gpt_config_finish(&m) == L3D_OK);
    struct l3d_hf_tensor *t;
    int n;
    CHECK(l3d_hf_tensors(&m, &t, &n) == L3D_OK);
    /* embed, norm, lm_head; a layer: 2 norms, q k v o, the gate, 3 experts x w1 w2 w3 */
    CHECK(n == 3 + m.L * (2 + 4 + 1 + 3 * 3));
    const struct l3d_hf_tensor *g = find(t, n, "model.layers.1.block_sparse_moe.gate.weight");
    const struct l3d_hf_tensor *w3 = find(t, n, "model.layers.1.block_sparse_moe.experts.2.w3.weight");
    const struct l3d_hf_tensor *w1 = find(t, n, "model.layers.0.block_sparse_moe.experts.1.w1.weight");
    const struct l3d_hf_tensor *w2 = find(t, n, "model.layers.0.block_sparse_moe.experts.2.w2.weight");
    CHECK(g && strcmp(g->table, "router") == 0 && g->layer == 1 && g->e.shape[0] == 3 &&
          g->e.shape[1] == 64);
    /* w3: the up rows of expert 2: rows 2 (2 F) + F of expfcw (3 x 2F, C) */
    CHECK(w3 && strcmp(w3->table, "expfcw") == 0 && w3->layer == 1 && w3->row0 == 2 * 80 + 40 &&
          w3->rows == 40 && w3->table_rows == 3 * 80 && w3->cols == 64 && !w3->transposed);
    CHECK(w1 && w1->layer == 0 && w1->row0 == 80 && w1->rows == 40);
    CHECK(w2 && strcmp(w2->table, "expprojw") == 0 && w2->row0 == 2 * 64 && w2->rows == 64 &&
          w2->cols == 40 && w2->e.shape[0] == 64 && w2->e.shape[1] == 40);
    CHECK(!find(t, n, "model.layers.0.mlp.gate_proj.weight")); /* no dense MLP */
    CHECK(!find(t, n, "model.layers.0.block_sparse_moe.experts.3.w1.weight"));
    /* each expert's three in turn: experts.0.w1, w2, w3, experts.1.w1 */
    const struct l3d_hf_tensor *e0 = find(t, n, "model.layers.0.block_sparse_moe.experts.0.w3.weight");
    CHECK(e0 && strcmp(e0[1].e.name, "model.layers.0.block_sparse_moe.experts.1.w1.weight") == 0);
    l3d_free(t);
}

/* config.json of a tiny Mixtral with `extra` keys inserted after the first brace. */
static l3d_status parse(const char *extra, struct l3d_model_spec *m) {
    char text[2048];
    snprintf(text, sizeof text, "{%s\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, "
             "\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
             "\"intermediate_size\": 96, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, "
             "\"vocab_size\": 256, \"max_position_embeddings\": 32}", extra);
    return l3d_hf_config_parse(text, strlen(text), "x/config.json", m);
}

static void test_config(void) {
    struct l3d_model_spec m, back;
    CHECK(parse("", &m) == L3D_OK);
    CHECK(m.arch == L3D_ARCH_LLAMA && m.moe.experts == 4 && m.moe.top_k == 2 &&
          m.moe.ffn == 96 && m.ffn == 96 && m.moe.norm_topk && m.moe.aux_coef == 0 &&
          m.untied && m.rope.theta == 1e6 && m.norm_eps == 1e-5f);
    CHECK(parse("\"router_aux_loss_coef\": 0.02, ", &m) == L3D_OK && m.moe.aux_coef == 0);
    CHECK(parse("\"router_aux_loss_coef\": 0.02, \"output_router_logits\": true, ", &m) ==
          L3D_OK && m.moe.aux_coef == 0.02);
    char *text = l3d_hf_config_text(&m, L3D_BF16);
    CHECK(strstr(text, "\"MixtralForCausalLM\"") && strstr(text, "\"num_local_experts\": 4") &&
          strstr(text, "\"output_router_logits\": true") &&
          strstr(text, "\"router_aux_loss_coef\": 0.02"));
    CHECK(l3d_hf_config_parse(text, strlen(text), "back", &back) == L3D_OK &&
          l3d_model_same(&back, &m));
    l3d_free(text);
    /* refused, naming the key and the value */
    CHECK(parse("\"router_jitter_noise\": 0.01, ", &m) == L3D_ERR_FORMAT &&
          strstr(l3d_error_message(), "\"router_jitter_noise\" is 0.01"));
    CHECK(parse("\"sliding_window\": 4096, ", &m) == L3D_ERR_FORMAT &&
          strstr(l3d_error_message(), "\"sliding_window\" is 4096"));
    CHECK(parse("\"sliding_window\": null, \"router_jitter_noise\": 0.0, ", &m) == L3D_OK);
    CHECK(parse("\"router_aux_loss_coef\": -1, ", &m) == L3D_ERR_FORMAT &&
          strstr(l3d_error_message(), "\"router_aux_loss_coef\" is -1"));
    char text2[512];
    snprintf(text2, sizeof text2, "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, "
             "\"hidden_size\": 64, \"num_attention_heads\": 4, \"intermediate_size\": 96, "
             "\"num_local_experts\": 4, \"num_experts_per_tok\": 5, \"vocab_size\": 256, "
             "\"max_position_embeddings\": 32}");
    /* named as the file names them, not as train's flags (--moe-top-k: issue 46) */
    CHECK(l3d_hf_config_parse(text2, strlen(text2), "y", &m) == L3D_ERR_FORMAT &&
          strstr(l3d_error_message(), "y: \"num_experts_per_tok\" is 5 but \"num_local_experts\" "
                 "is 4: each token picks 1 to 4") && !strstr(l3d_error_message(), "--moe"));
    snprintf(text2, sizeof text2, "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, "
             "\"hidden_size\": 64, \"num_attention_heads\": 4, \"intermediate_size\": 96, "
             "\"num_experts_per_tok\": 2, \"vocab_size\": 256, \"max_position_embeddings\": 32}");
    CHECK(l3d_hf_config_parse(text2, strlen(text2), "z", &m) == L3D_ERR_FORMAT &&
          strstr(l3d_error_message(), "\"num_local_experts\" is missing"));
}

static void test_folder(void) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/l3d-test-moe-hf-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR")
                                                                              : "/tmp");
    L3D_ASSERT(mkdtemp(dir));
    struct l3d_model_spec m = tiny_mixtral(4), back;
    int64_t n = l3d_gpt_param_count(&m);
    float *w = l3d_alloc((size_t)n * sizeof(float), "weights");
    float *r = l3d_alloc((size_t)n * sizeof(float), "weights");
    for (int64_t i = 0; i < n; i++) w[i] = (float)((i * 7919) % 1000 - 500) / 997.0f;
    snprintf(path, sizeof path, "%s/mx", dir);
    CHECK(l3d_hf_save(path, &m, w, L3D_F32, L3D_HF_SHARD_BYTES) == L3D_OK);
    CHECK(l3d_hf_config_read(path, &back) == L3D_OK && l3d_model_same_shapes(&back, &m));
    CHECK(l3d_hf_load(path, &m, r) == L3D_OK && memcmp(r, w, (size_t)n * sizeof(float)) == 0);
    /* the same weights under a config of 3 experts: the loader names the counts */
    struct l3d_model_spec three = m;
    three.moe.experts = 3;
    L3D_ASSERT(l3d_gpt_config_finish(&three) == L3D_OK);
    char *text = l3d_hf_config_text(&three, L3D_F32), cfg[320];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    L3D_ASSERT(l3d_write_file(cfg, "config.json", text, strlen(text)) == L3D_OK);
    l3d_free(text);
    CHECK(l3d_hf_load(path, &three, r) == L3D_ERR_FORMAT &&
          strstr(l3d_error_message(), "layer 0 holds 4 experts (its last: tensor "
                 "model.layers.0.block_sparse_moe.experts.3.w1.weight)") &&
          strstr(l3d_error_message(), "\"num_local_experts\": 3"));
    CHECK(l3d_hf_config_read(path, &back) == L3D_ERR_FORMAT); /* and before any allocation */
    l3d_free(w);
    l3d_free(r);
    CHECK(test_rm_rf(dir));
}

int main(void) {
    test_presets();
    test_qwen3_counts();
    test_qwen3_presets();
    test_rows();
    test_map();
    test_config();
    test_folder();
    return TEST_REPORT();
}
