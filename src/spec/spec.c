/* The run spec: defaults, the precision's names and bytes, and the one validator of model,
 * layout and precision (include/llm3d/spec.h). */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "llm3d/spec.h"

/* The most data-parallel ranks ZeRO shards over in llm3d's trainer: l3d_dp_step all-gathers
 * from a table of that many ranks (src/parallel/dp.c). */
#define ZERO_MAX_DP 256
/* Micro-batches a step at most: the schedule holds a few actions for each (src/parallel/pipeline.c)
 * and the planner times each on a timeline; 2^24 is a global batch no run has used. */
#define MAX_MICRO (1LL << 24)

void l3d_run_spec_defaults(struct l3d_run_spec *s) {
    memset(s, 0, sizeof *s);
    s->layout = (struct l3d_layout){.tp = 1, .cp = 1, .pp = 1, .dp = 0, .ep = 1, .v = 1,
                                    .schedule = L3D_PP_1F1B, .micro_batch = 4, .seq = 64,
                                    .accum = 1, .zero = 0, .zero3_prefetch = 1,
                                    .recompute = L3D_RECOMPUTE_NONE, .bucket_bytes = 4u << 20};
    /* Megatron-LM's: --initial-loss-scale 2^32, --min-loss-scale 1, --loss-scale-window 1000,
     * --hysteresis 2, and DynamicGradScaler's growth 2 and back-off 0.5 */
    s->precision = (struct l3d_precision){
        .param = L3D_F32, .act = L3D_F32, .grad = L3D_F32, .reduce = L3D_F32,
        .ls = {.fixed = 0.0, .init = 4294967296.0, .min = 1.0, .backoff = 0.5, .growth = 2.0,
               .window = 1000, .hysteresis = 2}};
}

int64_t l3d_layout_accum(const struct l3d_layout *l) {
    if (l->global_batch <= 0) return l->accum;
    int64_t per = (int64_t)l->micro_batch * (l->dp > 0 ? l->dp : 1);
    return per > 0 && l->global_batch % per == 0 ? l->global_batch / per : 0;
}

/* ---- precision ------------------------------------------------------------------------------ */

static bool float_type(enum l3d_dtype t) {
    return t == L3D_F32 || t == L3D_BF16 || t == L3D_F16;
}

const char *l3d_precision_name(const struct l3d_precision *p) {
    return l3d_dtype_name(p->param);
}

l3d_status l3d_precision_parse(const char *name, struct l3d_precision *p) {
    enum l3d_dtype t;
    if (l3d_dtype_parse(name, &t) != L3D_OK || !float_type(t))
        return l3d_error(L3D_ERR_ARG,
                         "--precision '%s': choose fp32 (the default), bf16 or fp16 (mixed "
                         "precision: 16-bit weights and activations, fp32 gradients, master "
                         "weights and optimizer)",
                         name);
    p->param = p->act = t;
    p->grad = L3D_F32;
    return L3D_OK;
}

l3d_status l3d_precision_param_parse(const char *name, enum l3d_dtype *param) {
    struct l3d_precision p = {0};
    l3d_status st = l3d_precision_parse(name, &p);
    if (st == L3D_OK) *param = p.param;
    return st;
}

bool l3d_precision_llm3d(const struct l3d_precision *p) {
    return p->grad == L3D_F32;
}

void l3d_param_bytes(const struct l3d_precision *p, int zero, int dp, struct l3d_param_bytes *b) {
    double w = (double)l3d_dtype_size(p->param), g = (double)l3d_dtype_size(p->grad);
    /* AdamW m and v in fp32; fp32 master weights when the working copy is not fp32 */
    double opt = 8.0 + (p->param != L3D_F32 ? 4.0 : 0.0);
    double d = dp > 0 ? dp : 1;
    b->params_full = w;
    b->grads_full = g;
    b->optimizer_full = opt;
    b->params = zero >= 3 ? w / d : w;
    b->grads = zero >= 2 ? g / d : g;
    b->optimizer = zero >= 1 ? opt / d : opt;
    b->total = b->params + b->grads + b->optimizer;
}

/* ---- the validator -------------------------------------------------------------------------- */

static void add(struct l3d_spec_errors *e, l3d_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add(struct l3d_spec_errors *e, l3d_status st, const char *fmt, ...) {
    if (e->n < L3D_SPEC_MAX_ERRORS) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg[e->n], sizeof e->msg[e->n], fmt, ap);
        va_end(ap);
        e->status[e->n] = st;
    }
    e->n++;
}

/* The sizes (the architecture's rules are l3d_gpt_config_finish's; the trainer builds any MLP
 * width, GELU or SwiGLU). */
/* Expert parallelism: ep ranks of a DP x CP group split the experts (docs/DESIGN.md "Expert
 * parallelism"); dp 0 when the grid did not resolve. */
static void check_ep(const struct l3d_model_spec *m, const struct l3d_layout *l, int dp,
                     struct l3d_spec_errors *e) {
    if (l->ep < 0) {
        add(e, L3D_ERR_ARG, "--ep %d: give 1 (every rank holds all experts) or more", l->ep);
        return;
    }
    if (l->ep <= 1) return; /* 0: a layout built without it (the planner's), read as 1 */
    if (m->moe.experts == 0) {
        add(e, L3D_ERR_ARG, "--ep %d without --moe-experts: expert parallelism splits a mixture "
            "of experts; give --moe-experts E (a multiple of %d) or drop --ep", l->ep, l->ep);
        return;
    }
    if (m->moe.experts % l->ep != 0)
        add(e, L3D_ERR_ARG, "--ep %d does not divide --moe-experts %d: each expert-parallel rank "
            "holds E / ep experts; give an ep that divides %d", l->ep, m->moe.experts,
            m->moe.experts);
    int cp = l->cp > 1 ? l->cp : 1;
    if (dp > 0 && cp == 1 && dp % l->ep != 0)
        add(e, L3D_ERR_LAYOUT, "--ep %d does not divide the %d data-parallel replicas: expert "
            "parallelism splits each DP group; give an ep that divides %d (or more ranks)",
            l->ep, dp, dp);
    else if (dp > 0 && (int64_t)dp * cp % l->ep != 0)
        add(e, L3D_ERR_LAYOUT, "--ep %d does not divide the %d ranks of data x context "
            "parallelism (dp %d x --cp %d): expert parallelism splits that group; give an ep "
            "that divides %lld", l->ep, dp * cp, dp, cp, (long long)dp * cp);
}

/* Mixture of experts: its model rules (l3d_moe_spec_check), then expert parallelism's. Every
 * layout runs MoE layers (tp: the experts whole on each tp rank; cp: the EP group inside dp x cp;
 * pp: a stage's own; ZeRO-3: over the expert-DP group), so no layout rule beyond ep's. */
static void check_moe(const struct l3d_model_spec *m, const struct l3d_layout *l, int dp,
                      struct l3d_spec_errors *e) {
    if (l3d_moe_spec_check(m) != L3D_OK) {
        add(e, L3D_ERR_ARG, "%s", l3d_error_message());
        return;
    }
    check_ep(m, l, dp, e);
}

static void check_model(const struct l3d_model_spec *m, struct l3d_spec_errors *e) {
    if (m->L < 1 || m->C < 1 || m->NH < 1 || m->V < 2 || m->maxT < 1) {
        add(e, L3D_ERR_ARG, "model sizes --layers %d --channels %d --heads %d --vocab %d "
            "--context %d: each must be at least 1 (the vocabulary at least 2)", m->L, m->C,
            m->NH, m->V, m->maxT);
        return;
    }
    if (m->head_dim == 0 && m->C % m->NH != 0)
        add(e, L3D_ERR_ARG, "--channels %d does not divide into --heads %d: choose heads that "
            "divide the channels, or give the head size (--head-dim)", m->C, m->NH);
}

/* tp x cp x pp x dp (x threads) against the world; dp resolved into *dp (0 when it cannot be). */
static void check_grid(const struct l3d_layout *l, const struct l3d_spec_ctx *ctx, int *dp,
                       struct l3d_spec_errors *e) {
    *dp = l->dp;
    if (l->tp < 1 || l->pp < 1 || l->cp < 1 || l->dp < 0) {
        add(e, L3D_ERR_LAYOUT, "--tp %d --cp %d --pp %d --dp %d: each must be at least 1 (--dp 0: "
            "inferred from the ranks)", l->tp, l->cp, l->pp, l->dp);
        *dp = 0;
        return;
    }
    int64_t th = ctx->threads_in_world && l->threads > 0 ? l->threads : 1;
    int64_t per = (int64_t)l->tp * l->cp * l->pp * th;
    if (ctx->world <= 0) {
        if (l->dp == 0 && !ctx->world_unknown)
            add(e, L3D_ERR_LAYOUT, "--dp: give the data-parallel size");
        return;
    }
    const char *unit = ctx->threads_in_world ? " x --threads" : "";
    if (l->dp == 0) {
        if (ctx->world % per != 0)
            add(e, L3D_ERR_LAYOUT, "--tp %d x --cp %d x --pp %d%s = %lld does not divide the %lld "
                "%s: choose sizes whose product divides it", l->tp, l->cp, l->pp, unit,
                (long long)per, (long long)ctx->world, ctx->threads_in_world ? "devices" : "ranks");
        else
            *dp = (int)(ctx->world / per);
    } else if (per * l->dp != ctx->world) {
        add(e, L3D_ERR_LAYOUT, "--tp %d x --cp %d x --pp %d x --dp %d%s = %lld, but there are %lld "
            "%s: give sizes whose product is the %s, or leave --dp out", l->tp, l->cp, l->pp,
            l->dp, unit, (long long)(per * l->dp), (long long)ctx->world,
            ctx->threads_in_world ? "devices" : "ranks",
            ctx->threads_in_world ? "devices" : "number of ranks");
        *dp = 0;
    }
}

static void check_tp(const struct l3d_model_spec *m, const struct l3d_layout *l,
                     const struct l3d_spec_ctx *ctx, struct l3d_spec_errors *e) {
    int64_t ffn = m->ffn > 0 ? m->ffn : 4LL * m->C;
    if (l->tp < 1 || m->NH < 1) return;
    if (m->NH % l->tp != 0)
        add(e, L3D_ERR_LAYOUT, "--tp %d does not divide the model's %d attention heads: choose a "
            "divisor of %d", l->tp, m->NH, m->NH);
    if (ffn % l->tp != 0)
        add(e, L3D_ERR_LAYOUT, "--tp %d does not divide the MLP width %lld", l->tp,
            (long long)ffn);
    int kv = l3d_model_kv_heads(m);
    if (ctx->train && m->NH % l->tp == 0 && kv % l->tp != 0) /* whole KV heads a rank */
        add(e, L3D_ERR_LAYOUT, "--tp %d does not divide the model's %d key/value heads "
            "(grouped-query attention; %d query heads): choose a divisor of %d (the trainer "
            "does not replicate key/value heads across ranks)", l->tp, kv, m->NH, kv);
    else if (m->NH % l->tp == 0 && kv % l->tp != 0 && l->tp % kv != 0)
        add(e, L3D_ERR_LAYOUT, "--tp %d and the model's %d key/value heads: the heads must divide "
            "by it, or it by them (each KV head then replicated on tp / kv-heads ranks, as "
            "Megatron-LM does); choose a divisor or a multiple of %d", l->tp, kv, kv);
    int Vp = (m->V + L3D_VOCAB_ALIGN - 1) / L3D_VOCAB_ALIGN * L3D_VOCAB_ALIGN;
    if (ctx->train && Vp % l->tp != 0)
        add(e, L3D_ERR_LAYOUT, "--tp %d does not divide the padded vocabulary %d (the vocabulary "
            "%d rounded up to a multiple of %d)", l->tp, Vp, m->V, L3D_VOCAB_ALIGN);
    if (l->sp && l->tp < 2)
        add(e, L3D_ERR_LAYOUT, "--sequence-parallel splits the tensor-parallel group's sequence; "
            "it needs --tp 2 or more");
    else if (l->sp && l->cp <= 1 && ((int64_t)l->micro_batch * l->seq) % l->tp != 0)
        add(e, L3D_ERR_LAYOUT, "--sequence-parallel with --tp %d needs --batch x --seq-len (%d x "
            "%d) to divide by %d", l->tp, l->micro_batch, l->seq, l->tp);
    else if (l->sp && l->cp > 1 && l->seq % l->cp == 0 &&
             ((int64_t)l->micro_batch * (l->seq / l->cp)) % l->tp != 0)
        add(e, L3D_ERR_LAYOUT, "--sequence-parallel with --tp %d and --cp %d needs --batch x "
            "--seq-len / --cp (%d x %d) to divide by %d", l->tp, l->cp, l->micro_batch,
            l->seq / l->cp, l->tp);
}

/* Context parallelism: each sequence cut into 2 cp chunks of whole tokens (Megatron-LM's
 * load-balanced causal split), and what the ring does not run. */
static void check_cp(const struct l3d_model_spec *m, const struct l3d_layout *l,
                     struct l3d_spec_errors *e) {
    (void)m;
    if (l->cp <= 1 || l->seq < 1) return;
    if (l->seq % (2 * l->cp) != 0)
        add(e, L3D_ERR_LAYOUT, "--cp %d cuts each sequence into 2 x %d = %d chunks, but --seq-len "
            "%d is not a multiple of %d: choose a sequence length divisible by %d (e.g. %d) or "
            "another --cp", l->cp, l->cp, 2 * l->cp, l->seq, 2 * l->cp, 2 * l->cp,
            (l->seq / (2 * l->cp) + 1) * 2 * l->cp);
}

/* --pp-first-layers / --pp-last-layers: the ends given, the stages between split evenly
 * (l3d_layout_split_ends); Megatron-Core needs that split exact. */
static void check_ends(const struct l3d_model_spec *m, const struct l3d_layout *l,
                       const struct l3d_spec_ctx *ctx, int64_t stages,
                       struct l3d_spec_errors *e) {
    int64_t first = l->pp_first, last = l->pp_last;
    int64_t free = stages - (first > 0) - (last > 0), rest = m->L - first - last;
    if (first < 0 || last < 0)
        add(e, L3D_ERR_ARG, "--pp-first-layers %lld and --pp-last-layers %lld: give at least 1 "
            "(or leave one out)", (long long)first, (long long)last);
    else if (l->pp_layers)
        add(e, L3D_ERR_ARG, "--pp-layers lists every stage: give it or --pp-first-layers / "
            "--pp-last-layers, not both");
    else if (stages < 2)
        add(e, L3D_ERR_LAYOUT, "--pp-first-layers / --pp-last-layers set the end stages of a "
            "pipeline: give --pp 2 or more");
    else if (rest < free || (free == 0 && rest != 0))
        add(e, L3D_ERR_LAYOUT, "--pp-first-layers %lld and --pp-last-layers %lld leave %lld of the "
            "%d layers to the %lld other stage(s) of --pp %d x --pp-virtual %d: each stage needs a "
            "layer, and with both ends of two stages they must add up to the layers",
            (long long)first, (long long)last, (long long)rest, m->L, (long long)free, l->pp,
            l->v);
    else if (!ctx->train && free > 0 && rest % free != 0)
        add(e, L3D_ERR_LAYOUT, "--pp-first-layers %lld and --pp-last-layers %lld leave %lld layers, "
            "which do not split evenly into the %lld other stages (Megatron-Core's rule)",
            (long long)first, (long long)last, (long long)rest, (long long)free);
}

/* The schedules that split each backward into B and W (pipeline.h's l3d_pp_split). */
static bool zero_bubble(enum l3d_pp_kind k) { return k == L3D_PP_ZBH1 || k == L3D_PP_ZBV; }

static void check_pipeline(const struct l3d_model_spec *m, const struct l3d_layout *l,
                           const struct l3d_spec_ctx *ctx, int64_t micro,
                           struct l3d_spec_errors *e) {
    if (l->v < 1 || l->v > 256)
        add(e, L3D_ERR_ARG, "--pp-virtual %d: give 1 to 256 model chunks per pipeline rank",
            l->v);
    if (l->schedule == L3D_PP_INTERLEAVED && (l->pp < 2 || l->v < 2))
        add(e, L3D_ERR_LAYOUT, "the interleaved schedule needs --pp 2 or more (got %d) and "
            "--pp-virtual 2 or more (got %d)", l->pp, l->v);
    else if (l->schedule == L3D_PP_ZBV && l->v != 2)
        add(e, L3D_ERR_LAYOUT, "--pp-schedule zbv places two model chunks on each rank, in a V: "
            "give --pp-virtual 2 (got %d)", l->v);
    else if (l->schedule == L3D_PP_ZBV && l->pp < 2) /* else reset to 1f1b, v 2 then refused */
        add(e, L3D_ERR_LAYOUT, "--pp-schedule zbv places each rank's two model chunks in a V "
            "over the pipeline's ranks: give --pp 2 or more (got %d)", l->pp);
    else if (l->v > 1 && l->schedule != L3D_PP_INTERLEAVED && l->schedule != L3D_PP_ZBV)
        add(e, L3D_ERR_LAYOUT, "--pp-virtual %d needs --pp-schedule interleaved or zbv", l->v);
    else if (zero_bubble(l->schedule) && l->pp > 1 && l->zero >= 2 && m->moe.experts > 0)
        add(e, L3D_ERR_LAYOUT, "--pp-schedule zb-h1 or zbv on a MoE model computes the experts' "
            "weight gradients with B, which the gradient slots of --zero %d cannot hold until W: use "
            "--zero 0 or 1, or --pp-schedule 1f1b", l->zero);
    else if (l->schedule == L3D_PP_INTERLEAVED && micro > 0 && micro % l->pp != 0)
        add(e, L3D_ERR_LAYOUT, "the interleaved schedule needs the micro-batches (%lld a step) to "
            "be a multiple of --pp %d", (long long)micro, l->pp);
    int64_t stages = (int64_t)l->pp * (l->v > 0 ? l->v : 1);
    if (l->pp >= 1 && m->L >= 1 && stages > m->L)
        add(e, L3D_ERR_LAYOUT, "--pp %d x --pp-virtual %d = %lld pipeline stages but the model has "
            "%d layers: each stage needs at least one layer; lower --pp or --pp-virtual", l->pp,
            l->v, (long long)stages, m->L);
    else if (l->pp_first || l->pp_last)
        check_ends(m, l, ctx, stages, e);
    else if (!ctx->train && !l->pp_layers && m->L >= 1 && stages > 0 && m->L % stages != 0)
        add(e, L3D_ERR_LAYOUT, "%d layers do not split evenly into --pp %d x --pp-virtual %d "
            "stages (Megatron-LM's rule; Megatron-Core's uneven ends: --pp-first-layers, "
            "--pp-last-layers)", m->L, l->pp, l->v);
}

/* micro-batch, sequence and micro-batches a step; returns the micro-batches (0: unknown) */
static int64_t check_batch(const struct l3d_model_spec *m, const struct l3d_layout *l, int dp,
                           const struct l3d_spec_ctx *ctx, struct l3d_spec_errors *e) {
    /* the trainer's memory check sizes what grows with the micro-batches and says how many fit
     * (src/train/memory.c); a step's count is an int */
    const int64_t most = ctx->train ? INT_MAX : MAX_MICRO;
    if (l->micro_batch < 1 || l->seq < 1) {
        add(e, L3D_ERR_ARG, "--batch %d and --seq-len %d must be at least 1", l->micro_batch,
            l->seq);
        return 0;
    }
    if (m->maxT >= 1 && l->seq > m->maxT)
        add(e, L3D_ERR_ARG, "--seq-len %d exceeds the model's context %d: raise --context or "
            "lower --seq-len", l->seq, m->maxT);
    if (l->global_batch <= 0) {
        if (l->accum < 1)
            add(e, L3D_ERR_ARG, "--grad-accum %d must be at least 1", l->accum);
        else if (l->accum > most)
            add(e, L3D_ERR_ARG, "--grad-accum %d: at most %lld micro-batches a step; give a "
                "larger --batch", l->accum, (long long)most);
        return l->accum > 0 ? l->accum : 0;
    }
    if (dp < 1) return 0;
    int64_t per = (int64_t)l->micro_batch * dp;
    if (l->global_batch % per != 0) {
        add(e, L3D_ERR_ARG, "--global-batch %lld does not split into micro-batches: it must be a "
            "multiple of --batch %d x %d data-parallel replicas = %lld sequences",
            (long long)l->global_batch, l->micro_batch, dp, (long long)per);
        return 0;
    }
    int64_t micro = l->global_batch / per;
    if (micro > most)
        add(e, L3D_ERR_ARG, "--global-batch %lld is %lld micro-batches of --batch %d x %d "
            "data-parallel replicas a step: at most %lld; give a smaller --global-batch",
            (long long)l->global_batch, (long long)micro, l->micro_batch, dp, (long long)most);
    return micro;
}

static void check_zero(const struct l3d_layout *l, const struct l3d_spec_ctx *ctx, int dp,
                       struct l3d_spec_errors *e) {
    if (l->zero < 0 || l->zero > 3)
        add(e, L3D_ERR_ARG, "--zero %d: choose 0, 1 (sharded optimizer state), 2 (also sharded "
            "gradients) or 3 (also sharded parameters)", l->zero);
    else if (ctx->train && l->zero > 0 && dp > ZERO_MAX_DP)
        add(e, L3D_ERR_LAYOUT, "--zero %d over %d data-parallel replicas: ZeRO shards over at "
            "most %d; give --zero 0, or fewer replicas (a larger --tp or --pp)", l->zero, dp,
            ZERO_MAX_DP);
    if (l->zero3_prefetch_set && l->zero != 3)
        add(e, L3D_ERR_ARG, "--zero3-prefetch %d: prefetching gathers parameters ahead under "
            "--zero 3 only (here --zero %d): drop it or give --zero 3", l->zero3_prefetch,
            l->zero);
    else if (l->zero3_prefetch < 0 || l->zero3_prefetch > L3D_ZERO3_MAX_PREFETCH)
        add(e, L3D_ERR_ARG, "--zero3-prefetch %d: at most %d layers ahead (each holds one more "
            "layer's parameters)", l->zero3_prefetch, L3D_ZERO3_MAX_PREFETCH);
    if (l->recompute < L3D_RECOMPUTE_NONE || l->recompute > L3D_RECOMPUTE_FULL)
        add(e, L3D_ERR_ARG, "--recompute: mode %d is not none, selective or full",
            (int)l->recompute);
    if (l->threads < 0)
        add(e, L3D_ERR_ARG, "--threads %d must be at least 1", l->threads);
    if (l->bucket_bytes == 0)
        add(e, L3D_ERR_ARG, "--bucket-mb: the gradient pieces must hold at least one byte");
}

static void check_loss_scaling(const struct l3d_precision *p, struct l3d_spec_errors *e) {
    const struct l3d_loss_scaling *s = &p->ls;
    if (s->given && p->param != L3D_F16) {
        add(e, L3D_ERR_ARG, "--%s: loss scaling is for --precision fp16 (bf16 and fp32 have "
            "fp32's exponent range and need none): drop it or train in fp16", s->given);
        return;
    }
    if (!(s->fixed >= 0 && s->fixed <= 1e30))
        add(e, L3D_ERR_ARG, "--loss-scale %g: give a scale in (0, 1e30], or 0 for the dynamic one",
            s->fixed);
    if (!(s->min > 0 && s->min <= 1e30))
        add(e, L3D_ERR_ARG, "--min-loss-scale %g: give a scale in (0, 1e30]", s->min);
    if (!(s->init > 0 && s->init <= 1e30))
        add(e, L3D_ERR_ARG, "--initial-loss-scale %g: give a scale in (0, 1e30]", s->init);
    else if (s->fixed == 0 && s->min > 0 && s->init < s->min)
        add(e, L3D_ERR_ARG, "--initial-loss-scale %g is below --min-loss-scale %g: the dynamic "
            "scale starts at or above its floor; raise the one or lower the other", s->init,
            s->min);
    if (!(s->backoff > 0 && s->backoff < 1))
        add(e, L3D_ERR_ARG, "--loss-scale-backoff %g: give a factor between 0 and 1", s->backoff);
    if (!(s->growth > 1 && s->growth <= 1e6))
        add(e, L3D_ERR_ARG, "loss-scale growth %g: give a factor above 1", s->growth);
    if (s->window < 1 || s->hysteresis < 1)
        add(e, L3D_ERR_ARG, "--loss-scale-window %d and --hysteresis %d must be at least 1",
            s->window, s->hysteresis);
}

static void check_precision(const struct l3d_precision *p, const struct l3d_spec_ctx *ctx,
                            struct l3d_spec_errors *e) {
    if (!float_type(p->param) || p->act != p->param) {
        add(e, L3D_ERR_ARG, "--precision: parameters in %s and activations in %s; llm3d runs "
            "both in one of fp32, bf16 or fp16", l3d_dtype_name(p->param),
            l3d_dtype_name(p->act));
        return;
    }
    if (p->grad != L3D_F32 && (ctx->train || p->grad != p->param))
        add(e, L3D_ERR_ARG, "gradients in %s: llm3d's trainer accumulates them in fp32 (the "
            "planner's --trainer megatron: in the parameters' type)", l3d_dtype_name(p->grad));
    if (!float_type(p->reduce))
        add(e, L3D_ERR_ARG, "--grad-reduce-dtype %s: choose fp32, bf16 or fp16",
            l3d_dtype_name(p->reduce));
    else if (p->reduce == L3D_F16 && p->param != L3D_F16)
        add(e, L3D_ERR_ARG, "--grad-reduce-dtype fp16: fp16 sums need fp16's loss scaling to keep "
            "small gradients from underflowing, so only with --precision fp16; reduce in bf16 "
            "(fp32's exponent range) or fp32 instead");
    else if (p->reduce != L3D_F32 && p->grad != L3D_F32)
        add(e, L3D_ERR_ARG, "--grad-reduce-dtype %s: for llm3d's trainer (--trainer llm3d); "
            "Megatron-LM's %s gradients are reduced in %s already", l3d_dtype_name(p->reduce),
            l3d_dtype_name(p->grad), l3d_dtype_name(p->grad));
    if (p->tp_reduce_fp32 && p->grad != L3D_F32)
        add(e, L3D_ERR_ARG, "--tp-reduce-dtype fp32: for llm3d's trainer (--trainer llm3d); "
            "Megatron-LM sums its tensor-parallel partials in its %s activations; drop the flag",
            l3d_dtype_name(p->act));
    if (p->cp_fp32 && p->grad != L3D_F32)
        add(e, L3D_ERR_ARG, "--cp-reduce-dtype fp32: for llm3d's trainer (--trainer llm3d); the "
            "planner models Megatron-LM's context-parallel ring in %s, as it runs it; drop the "
            "flag", l3d_dtype_name(p->param));
    check_loss_scaling(p, e);
}

l3d_status l3d_spec_check_parts(const struct l3d_run_spec *s, const struct l3d_spec_ctx *ctx,
                                unsigned parts, struct l3d_spec_errors *out) {
    struct l3d_spec_errors local, *e = out ? out : &local;
    e->n = 0;
    const struct l3d_layout *l = &s->layout;
    if (parts & L3D_SPEC_MODEL) check_model(&s->model, e);
    if (parts & L3D_SPEC_LAYOUT) {
        int dp = 0;
        check_grid(l, ctx, &dp, e);
        check_tp(&s->model, l, ctx, e);
        check_cp(&s->model, l, e);
        int64_t micro = check_batch(&s->model, l, dp, ctx, e);
        check_pipeline(&s->model, l, ctx, micro, e);
        check_zero(l, ctx, dp, e);
        check_moe(&s->model, l, dp, e);
    }
    if (parts & L3D_SPEC_PRECISION) check_precision(&s->precision, ctx, e);
    if (e->n == 0) return L3D_OK;
    /* every message in the thread's error, the first one's status */
    char all[L3D_SPEC_MAX_ERRORS * 330];
    size_t k = 0;
    int kept = e->n < L3D_SPEC_MAX_ERRORS ? e->n : L3D_SPEC_MAX_ERRORS;
    for (int i = 0; i < kept && k < sizeof all; i++)
        k += (size_t)snprintf(all + k, sizeof all - k, "%s%s", i ? "; " : "", e->msg[i]);
    if (e->n > kept && k < sizeof all)
        snprintf(all + k, sizeof all - k, "; and %d more", e->n - kept);
    if (e->n > kept) e->n = kept;
    return l3d_error(e->status[0], "%s", all);
}

l3d_status l3d_spec_check(const struct l3d_run_spec *s, const struct l3d_spec_ctx *ctx,
                          struct l3d_spec_errors *e) {
    return l3d_spec_check_parts(s, ctx, L3D_SPEC_ALL, e);
}

/* ---- resolving ------------------------------------------------------------------------------ */

/* "1, 2, 4" : the divisors of n, for messages (a few; n is a world size). */
static void divisors(int64_t n, char *out, size_t cap) {
    size_t w = 0;
    out[0] = '\0';
    for (int64_t d = 1; d <= n && w + 24 < cap; d++)
        if (n % d == 0) w += (size_t)snprintf(out + w, cap - w, "%s%lld", w ? ", " : "", (long long)d);
}

/* tp x cp x pp x dp against the world, dp 0 filled; the messages say which flags to change. */
static l3d_status resolve_grid(struct l3d_layout *l, int64_t world) {
    L3D_ASSERT(world >= 1);
    if (l->cp < 1) l->cp = 1;
    if (l->ep < 1) l->ep = 1;
    int cp = l->cp;
    if (world % cp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "--cp %d does not divide the %lld ranks: launch a "
                         "multiple of %d ranks", cp, (long long)world, cp);
    char divs[256], grid[96]; /* grid: "--tp 2 x --cp 2 x --pp 1", --cp only with a ring */
    divisors(world, divs, sizeof divs);
    if (cp > 1) snprintf(grid, sizeof grid, "--tp %d x --cp %d x --pp %d", l->tp, cp, l->pp);
    else snprintf(grid, sizeof grid, "--tp %d x --pp %d", l->tp, l->pp);
    const char *them = cp > 1 ? "--tp, --cp and --pp" : "--tp and --pp";
    const char *prod = cp > 1 ? "--tp x --cp x --pp" : "--tp x --pp";
    if (l->tp < 1 || l->pp < 1)
        return l3d_error(L3D_ERR_LAYOUT,
                         "%s %d is invalid: the %s degree must be at least 1; with %lld ranks, "
                         "%s must divide %lld (divisors: %s)", l->tp < 1 ? "--tp" : "--pp",
                         l->tp < 1 ? l->tp : l->pp,
                         l->tp < 1 ? "tensor-parallel" : "pipeline-parallel", (long long)world,
                         prod, (long long)world, divs);
    if (l->dp < 0)
        return l3d_error(L3D_ERR_LAYOUT,
                         "--dp %d is invalid: give the data-parallel degree (at least 1), or 0 to "
                         "infer it as world size / (%s)", l->dp, cp > 1 ? "tp x cp x pp" : "tp x pp");
    int64_t tpp = (int64_t)l->tp * cp * l->pp;
    if (l->dp == 0) {
        if (world % tpp != 0)
            return l3d_error(L3D_ERR_LAYOUT,
                             "%s = %lld does not divide the world size %lld: choose %s whose "
                             "product divides %lld (divisors: %s), or launch a multiple of %lld "
                             "ranks", grid, (long long)tpp, (long long)world, them,
                             (long long)world, divs, (long long)tpp);
        l->dp = (int)(world / tpp);
        return L3D_OK;
    }
    int64_t total = tpp * l->dp;
    if (total != world)
        return l3d_error(L3D_ERR_LAYOUT,
                         "%s x --dp %d = %lld ranks, but the world size is %lld: launch %lld ranks "
                         "(mpiexec -n %lld), or change the flags so that their product is %lld "
                         "(leave out --dp to infer the data-parallel degree)",
                         grid, l->dp, (long long)total, (long long)world, (long long)total,
                         (long long)total, (long long)world);
    return L3D_OK;
}

l3d_status l3d_layout_resolve(struct l3d_layout *l, int64_t world) {
    l3d_status st = resolve_grid(l, world);
    if (st != L3D_OK) return st;
    if (l->v < 1) l->v = 1;
    int64_t accum = l3d_layout_accum(l);
    if (accum < 1 || accum > INT_MAX)
        return l3d_error(L3D_ERR_ARG, "--global-batch %lld does not split into 1 to %d "
                         "micro-batches of --batch %d x %d data-parallel replicas",
                         (long long)l->global_batch, INT_MAX, l->micro_batch, l->dp);
    l->accum = (int)accum;
    if (l->pp == 1) l->schedule = L3D_PP_1F1B;
    return L3D_OK;
}

l3d_status l3d_spec_resolve(struct l3d_run_spec *s, const struct l3d_spec_ctx *ctx,
                            struct l3d_spec_errors *e) {
    struct l3d_layout r = s->layout;
    l3d_status st = resolve_grid(&r, ctx->world);
    if (st != L3D_OK) {
        if (e) {
            e->n = 1;
            e->status[0] = st;
            snprintf(e->msg[0], sizeof e->msg[0], "%s", l3d_error_message());
        }
        return st;
    }
    if ((st = l3d_spec_check(s, ctx, e)) != L3D_OK) return st;
    if ((st = l3d_layout_resolve(&r, ctx->world)) == L3D_OK) s->layout = r;
    return st;
}
