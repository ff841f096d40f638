/* The planner's model (include/llm3d/plan.h): the checks of explicit sizes, the trainer's model
 * of the same sizes and the parameter count (the presets are src/spec/presets.c). */
#include <stdio.h>
#include <string.h>

#include "llm3d/plan.h"
#include "llm3d/spec.h"
#include "plan-impl.h"

l3d_status l3d_plan_model_check(const struct l3d_model_spec *m) {
    if (m->L < 1 || m->C < 1 || m->NH < 1 || m->V < 1 || m->maxT < 1)
        return l3d_error(L3D_ERR_ARG, "model sizes must be positive (--layers %d, --channels %d, "
                         "--heads %d, --vocab %d, --seq-len %d)", m->L, m->C, m->NH, m->V, m->maxT);
    if (m->ffn < 1 || m->ffn > (int64_t)1 << 24)
        return l3d_error(L3D_ERR_ARG, "--ffn %lld must be from 1 to 2^24", (long long)m->ffn);
    if (m->head_dim < 0 || m->head_dim > 1 << 20)
        return l3d_error(L3D_ERR_ARG, "--head-dim %d: give 1 to 2^20 (0: channels / heads)",
                         m->head_dim);
    if (m->head_dim == 0 && m->C % m->NH != 0)
        return l3d_error(L3D_ERR_ARG, "--channels %d must be divisible by --heads %d, or give "
                         "--head-dim", m->C, m->NH);
    if (m->pos == L3D_POS_ROPE && l3d_model_head_dim(m) % 2 != 0)
        return l3d_error(L3D_ERR_ARG, "rotary positions need an even head size, not %d: give an "
                         "even --head-dim", l3d_model_head_dim(m));
    if (m->V > 1 << 30 || m->C > 1 << 20 || m->L > 1 << 16 || m->maxT > 1 << 22)
        return l3d_error(L3D_ERR_ARG, "model sizes out of range (vocabulary <= 2^30, channels <= "
                         "2^20, layers <= 65536, sequence <= 2^22)");
    /* weights and a layer's products alone, in double: a model beyond 10^15 parameters (500x
     * the largest trained) would overflow the planner's 64-bit element counts long before
     * anything could hold it */
    if (m->NKV < 0 || (m->NKV > 0 && m->NH % m->NKV != 0))
        return l3d_error(L3D_ERR_ARG, "--kv-heads %d must divide --heads %d", m->NKV, m->NH);
    /* a mixture of experts: its own rules (top-k within the experts, dense layers within L) */
    l3d_status st = l3d_moe_spec_check(m);
    if (st != L3D_OK) return st;
    double params = l3d_model_param_count(m);
    if (params > 1e15)
        return l3d_error(L3D_ERR_ARG, "a model of %.3g parameters (--layers %d, --channels %d, "
                         "--ffn %lld, --vocab %d): the planner sizes models up to 10^15 "
                         "parameters; lower --layers or --channels", params, m->L, m->C,
                         (long long)m->ffn, m->V);
    return L3D_OK;
}

struct l3d_model_spec l3d_plan_model_gpt(const struct l3d_model_spec *m) {
    struct l3d_model_spec c = *m;
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    return c;
}

int64_t l3d_plan_model_params(const struct l3d_model_spec *m) {
    struct l3d_model_spec c = *m;
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    return (int64_t)l3d_model_param_count(&c);
}

/* Megatron-LM's split of a layer over t ranks: column-parallel QKV (each rank its query heads and
 * KV heads, a KV head replicated on the ranks of its query heads when t exceeds the KV heads, as
 * Megatron-LM does) and MLP input(s), row-parallel projections; norms and row-parallel biases
 * whole on every rank. */
void l3d_plan_param_counts(const struct l3d_model_spec *m, int t, int ep,
                           struct l3d_plan_counts *o) {
    /* the padded vocabulary of the model's V (a --vocab given after a preset leaves its Vp) */
    double C = m->C, hd = l3d_model_head_dim(m), F = (double)m->ffn;
    double Vp = (double)l3d_plan_model_gpt(m).Vp;
    int kv = l3d_model_kv_heads(m);
    double kv_local = kv >= t ? (double)kv / t : 1.0, q_local = (double)m->NH / t;
    double bias = m->no_bias ? 0.0 : 1.0, norm = m->norm == L3D_NORM_LAYERNORM ? 2 * C : C;
    double qkv_rows = (q_local + 2 * kv_local) * hd;
    double up = m->mlp == L3D_MLP_SWIGLU ? 2 * F / t : F / t;
    double attn = 2 * norm + qkv_rows * (C + bias) + q_local * hd * C + bias * C +
                  (m->qk_norm ? 2 * hd : 0.0); /* QK-norm's two vectors, whole on every rank */
    o->layer = attn + up * (C + bias) + F / t * C + bias * C;
    /* a MoE layer: the router (E rows) and the rank's E / ep experts and the shared ones, each
     * an MLP of width moe.ffn, whole on every TP rank (Megatron-Core's
     * --expert-tensor-parallel-size 1, as llm3d's trainer: docs/DESIGN.md "MoE on every
     * layout") */
    const struct l3d_moe_spec *q = &m->moe;
    double Fe = (double)(q->ffn > 0 ? q->ffn : m->ffn), mul = m->mlp == L3D_MLP_SWIGLU ? 2 : 1;
    double expert = mul * Fe * (C + bias) + Fe * C + bias * C;
    o->experts = q->experts > 0 ? (double)q->experts / (ep > 1 ? ep : 1) * expert : 0.0;
    double shared = q->shared > 0 ? mul * q->shared * Fe * (C + bias) + q->shared * Fe * C +
                                        bias * C
                                  : 0.0; /* one MLP of width S F */
    o->moe_layer = attn + q->experts * C + o->experts + shared;
    o->embed = Vp / t * C + (m->pos == L3D_POS_LEARNED ? (double)m->maxT * C : 0.0);
    o->head = norm + (m->untied ? Vp / t * C : 0.0);
}
