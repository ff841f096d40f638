/* Planner: the memory and time model of one layout, and the layout search (include/llm3d/plan.h).
 *
 * Notation as in Korthikanti et al. 2022 and Narayanan et al. 2021: s sequence length, b
 * micro-batch, h hidden size, a heads, L layers, V vocabulary, t TP size, p PP size, d DP size,
 * v model chunks per pipeline rank, m micro-batches per step, e bytes per activation element. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/layout.h"
#include "llm3d/pipeline.h"
#include "llm3d/plan.h"
#include "llm3d/tp.h"

/* ---- models ----------------------------------------------------------------------------- */

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
    struct l3d_gpt_config cfg;
    if (l3d_gpt_config_preset(&cfg, name) != L3D_OK)
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

struct l3d_gpt_config l3d_plan_model_gpt(const struct l3d_plan_model *m) {
    struct l3d_gpt_config c = {.L = m->L, .C = m->h, .NH = m->heads, .V = m->V, .maxT = m->s};
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    return c;
}

int64_t l3d_plan_model_params(const struct l3d_plan_model *m) {
    struct l3d_gpt_config c = l3d_plan_model_gpt(m);
    /* fcw, fcb and fcprojw of an MLP of width ffn instead of 4h */
    return l3d_gpt_param_count(&c) + (int64_t)m->L * (m->ffn - 4LL * m->h) * (2LL * m->h + 1);
}

/* ---- runs and layouts ------------------------------------------------------------------- */

struct l3d_plan_run l3d_plan_run_default(void) {
    return (struct l3d_plan_run){.devices = 1, .global_batch = 1, .precision = L3D_PREC_FP32,
                                 .flash = true, .threads = 1, .bucket_bytes = 25000000};
}

struct l3d_plan_fixed l3d_plan_fixed_none(void) {
    return (struct l3d_plan_fixed){.zero = -1, .recompute = -1, .sp = -1, .v = 0};
}

static bool trainer(const struct l3d_plan_run *run) {
    return run->precision == L3D_PREC_FP32 || run->llm3d_mixed;
}

/* The peak of the run's products: llm3d's mixed precision on a CPU without 16-bit products runs
 * them as fp32 products of widened operands (docs/DESIGN.md), at the fp32 peak. */
static double run_peak(const struct l3d_profile *prof, const struct l3d_plan_run *run) {
    double p = prof->peak_flops[run->precision];
    return p <= 0 && run->llm3d_mixed ? prof->peak_flops[L3D_PREC_FP32] : p;
}

/* Bytes per element come from l3d_dtype_size, the function the trainer sizes its buffers with. */
static double bytes_of(enum l3d_dtype t) { return (double)l3d_dtype_size(t); }
/* the element type of the run's weights, gradients and activations */
static enum l3d_dtype prec_dtype(enum l3d_prec p) {
    return p == L3D_PREC_FP32 ? L3D_F32 : p == L3D_PREC_BF16 ? L3D_BF16 : L3D_F16;
}

/* ---- the trainer's stage partition, fast ------------------------------------------------
 *
 * l3d_pp_partition (src/parallel/pipeline.c) finds by dynamic programming, in O(stages L^2), the
 * split of L layers of cost lc into stages that minimises the largest stage cost, the first stage
 * also paying the embedding, the last the head; ties keep the earliest cut. Every layer costs the
 * same, so the planner gets the same split in O(stages log L): best(k, j), the smallest largest
 * cost of the first j layers on k stages, is the smallest stage cost (a whole number of layers
 * plus one of the four extras) under which the k stages' capacities hold j layers; the cut
 * before stage k is then the earliest one whose stage fits under best(k, j), as the dynamic
 * programme's backtracking picks it. tests/test_plan.c checks the two agree on every (L, stages)
 * up to 48 layers for several models. */
struct part {
    double lc, emb, head;
    int stages;
};

/* a stage of n layers, with the dynamic programme's own floating-point expression */
static double stage_cost(const struct part *P, int64_t n, bool first, bool last) {
    return (double)n * P->lc + (first ? P->emb : 0.0) + (last ? P->head : 0.0);
}

/* the most layers a stage holds under cost C (0 if none), at most `most` */
static int64_t capacity(const struct part *P, double C, bool first, bool last, int64_t most) {
    double x = (C - (first ? P->emb : 0.0) - (last ? P->head : 0.0)) / P->lc;
    int64_t n = x < 0 ? 0 : x > (double)most ? most : (int64_t)x;
    while (n < most && stage_cost(P, n + 1, first, last) <= C) n++;
    while (n > 0 && stage_cost(P, n, first, last) > C) n--;
    return n;
}

/* can stages 1..k (stage k the last of all when k == stages) hold j layers under cost C? */
static bool holds(const struct part *P, double C, int k, int64_t j) {
    bool last_k = k == P->stages;
    if (k == 1) return capacity(P, C, true, last_k, j) >= j;
    int64_t c1 = capacity(P, C, true, false, j), ck = capacity(P, C, false, last_k, j);
    int64_t cm = k > 2 ? capacity(P, C, false, false, j) : 0;
    if (c1 < 1 || ck < 1 || (k > 2 && cm < 1)) return false;
    return c1 + ck + (int64_t)(k - 2) * cm >= j;
}

/* best(k, j): the smallest feasible cost among n lc + extra, n = 1..j, for each of the extras */
static double best_cost(const struct part *P, int k, int64_t j) {
    double best = INFINITY;
    for (int e = 0; e < 4; e++) {
        bool first = e & 1, last = e & 2;
        if (!holds(P, stage_cost(P, j, first, last), k, j)) continue;
        int64_t lo = 1, hi = j; /* the smallest n whose cost holds the layers */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (holds(P, stage_cost(P, mid, first, last), k, j)) hi = mid;
            else lo = mid + 1;
        }
        double c = stage_cost(P, lo, first, last);
        if (c < best) best = c;
    }
    return best;
}

static void fast_partition(const struct l3d_gpt_config *cfg, int T, int stages, int *layers) {
    struct part P = {.lc = l3d_pp_layer_cost(cfg, T), .emb = 2.0 * cfg->C,
                     .head = l3d_pp_head_cost(cfg), .stages = stages};
    int64_t j = cfg->L;
    for (int k = stages; k >= 1; k--) {
        if (k == 1) {
            layers[0] = (int)j;
            break;
        }
        double B = best_cost(&P, k, j);
        int64_t i = j - capacity(&P, B, false, k == stages, j);
        if (i < k - 1) i = k - 1;
        layers[k - 1] = (int)(j - i);
        j = i;
    }
}

l3d_status l3d_plan_stage_layers(const struct l3d_plan_model *m, const struct l3d_plan_run *run,
                                 int stages, int *layers) {
    if (stages > m->L)
        return l3d_error(L3D_ERR_LAYOUT, "%d pipeline stages (pp x v) for %d layers: each stage "
                         "needs a layer", stages, m->L);
    if (trainer(run)) {
        struct l3d_gpt_config c = l3d_plan_model_gpt(m);
        fast_partition(&c, m->s, stages, layers);
        return L3D_OK;
    }
    if (m->L % stages != 0)
        return l3d_error(L3D_ERR_LAYOUT, "%d layers do not split evenly into pp x v = %d stages "
                         "(Megatron-LM needs L divisible by pp v)", m->L, stages);
    for (int i = 0; i < stages; i++) layers[i] = m->L / stages;
    return L3D_OK;
}

l3d_status l3d_plan_check(const struct l3d_plan_model *m, const struct l3d_profile *prof,
                          const struct l3d_plan_run *run, const struct l3d_plan_layout *lay) {
    l3d_status st = l3d_plan_model_check(m);
    if (st != L3D_OK) return st;
    int th = lay->threads > 0 ? lay->threads : run->threads;
    if (lay->tp < 1 || lay->pp < 1 || lay->dp < 1 || lay->mb < 1 || lay->v < 1 || th < 1)
        return l3d_error(L3D_ERR_LAYOUT, "tp %d, pp %d, dp %d, micro-batch %d, v %d and threads %d "
                         "must be at least 1", lay->tp, lay->pp, lay->dp, lay->mb, lay->v, th);
    if ((int64_t)lay->tp * lay->pp * lay->dp * th != run->devices)
        return l3d_error(L3D_ERR_LAYOUT, "tp %d x pp %d x dp %d x threads %d = %lld, not the %lld "
                         "devices", lay->tp, lay->pp, lay->dp, th,
                         (long long)lay->tp * lay->pp * lay->dp * th, (long long)run->devices);
    if (prof && th > 1 && prof->devices_per_node > 1 && th > prof->devices_per_node)
        return l3d_error(L3D_ERR_LAYOUT, "%d threads a rank but %d cores a node", th,
                         prof->devices_per_node);
    if (prof && run_peak(prof, run) <= 0)
        return l3d_error(L3D_ERR_ARG, "profile %s has no %s peak (peak_tflops_%s = 0)", prof->name,
                         l3d_prec_name(run->precision), l3d_prec_name(run->precision));
    if (m->heads % lay->tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "tp %d does not divide the %d attention heads", lay->tp,
                         m->heads);
    if (m->ffn % lay->tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "tp %d does not divide the MLP width %lld", lay->tp,
                         (long long)m->ffn);
    if (trainer(run) && m->ffn != 4LL * m->h)
        return l3d_error(L3D_ERR_ARG, "llm3d's trainer (precision fp32) has a 4h MLP: --ffn %lld "
                         "needs --precision bf16 or fp16", (long long)m->ffn);
    if (trainer(run) && lay->tp > 1) {
        struct l3d_gpt_config c = l3d_plan_model_gpt(m);
        struct l3d_shard sh;
        if ((st = l3d_tp_shard(&c, lay->tp, 0, lay->sp, &sh)) != L3D_OK) return st;
    }
    if (run->global_batch % ((int64_t)lay->mb * lay->dp) != 0)
        return l3d_error(L3D_ERR_LAYOUT, "global batch %lld is not a multiple of micro-batch %d x "
                         "dp %d", (long long)run->global_batch, lay->mb, lay->dp);
    int64_t mm = run->global_batch / ((int64_t)lay->mb * lay->dp);
    if (mm > 1 << 24)
        return l3d_error(L3D_ERR_LAYOUT, "%lld micro-batches a step is too many", (long long)mm);
    if ((int64_t)lay->pp * lay->v > m->L)
        return l3d_error(L3D_ERR_LAYOUT, "pp %d x v %d stages for %d layers", lay->pp, lay->v,
                         m->L);
    if (!trainer(run) && m->L % (lay->pp * lay->v) != 0)
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
    if (trainer(run) && lay->zero > 0 && lay->dp > 256)
        return l3d_error(L3D_ERR_LAYOUT, "ZeRO-%d over dp %d: llm3d's trainer shards over at most "
                         "256 replicas; ZeRO-0, or a larger tp or pp", lay->zero, lay->dp);
    if (lay->sp && (lay->tp < 2 || ((int64_t)lay->mb * m->s) % lay->tp != 0))
        return l3d_error(L3D_ERR_LAYOUT, "sequence parallelism needs tp >= 2 dividing micro-batch "
                         "x sequence (%d x %d)", lay->mb, m->s);
    if (lay->recompute < L3D_RECOMPUTE_NONE || lay->recompute > L3D_RECOMPUTE_FULL)
        return l3d_error(L3D_ERR_LAYOUT, "recompute mode %d", (int)lay->recompute);
    return L3D_OK;
}

/* ---- memory ----------------------------------------------------------------------------- */

/* One chunk of a pipeline rank: its shard (TP rank 0, the one adding row biases) and how many
 * micro-batches' activations it keeps. */
struct chunk {
    struct l3d_shard sh;
    int64_t n;        /* parameters */
    int64_t n_gpt;    /* of them the trainer's tensors (l3d_gpt_plan_tensors, a 4h MLP) */
    int64_t slot, nonlayer; /* one layer's matrices, the tensors outside the layers */
    int slots;
    bool first, last; /* first / last virtual stage */
    int shape;        /* its entry in the evaluation's shape memo, -1 if none */
};

/* Chunks of the same shape (layers, first, last) have the same sizes and time: a layout's
 * thousands of chunks come in a few shapes (the partition differs by at most a layer or so
 * between stages), so each shape is sized and timed once. */
#define PLAN_SHAPES 8
struct parts {
    double gemm, attn, elem, tp, p2p, rec, total;
    double bwd; /* backward part (what DP communication can hide behind) */
};
/* to += w from, every part */
static void parts_add(struct parts *to, const struct parts *from, double w) {
    to->gemm += w * from->gemm;
    to->attn += w * from->attn;
    to->elem += w * from->elem;
    to->tp += w * from->tp;
    to->p2p += w * from->p2p;
    to->rec += w * from->rec;
    to->total += w * from->total;
    to->bwd += w * from->bwd;
}
struct shape_memo {
    int n;
    struct {
        int layers;
        bool first, last, timed;
        struct l3d_shard sh;
        int64_t n, n_gpt, slot, nonlayer;
        struct parts t; /* without p2p */
    } e[PLAN_SHAPES];
};

/* Micro-batches in flight on rank r (all its chunks together), Megatron-LM's schedules:
 * GPipe keeps all m; 1F1B min(p - r, m) (Narayanan et al. 2021, sec. 2.2.1); interleaved
 * 1F1B runs 2 (p - r - 1) + (v - 1) p warm-up forwards of chunks, then one more before its first
 * backward. */
static int in_flight(enum l3d_pp_kind k, int p, int v, int64_t m, int r) {
    if (p == 1) return 1;
    if (k == L3D_PP_GPIPE) return (int)m;
    if (k == L3D_PP_1F1B) return (int)(m < p - r ? m : p - r);
    int64_t w = 2LL * (p - r - 1) + (int64_t)(v - 1) * p + 1;
    return (int)(w < m * v ? w : m * v);
}

/* Activation bytes a layer keeps per micro-batch in 16-bit training, Korthikanti et al. 2022,
 * Table 2 (dropout included; 34 s b h and 5 a s^2 b per layer without parallelism). Their 34 is
 * 10 s b h not split by TP (LayerNorm inputs, the attention and MLP inputs' halves kept by both,
 * dropout masks), 8 s b h of attention split by TP and 16 s b h of the 4h MLP (its two 4h-wide
 * inputs), i.e. 4 s b f for an MLP of width f. A fused (flash) attention keeps no s^2 scores, so
 * the 5 a s^2 b term goes; full recomputation keeps the layer's 2 s b h input. */
static double layer_act_16(const struct l3d_plan_model *m, const struct l3d_plan_layout *lay,
                           enum l3d_recompute rc, bool flash) {
    double s = m->s, b = lay->mb, h = m->h, a = m->heads, t = lay->tp, f = (double)m->ffn;
    double sbh = s * b * h, att = flash ? 0.0 : 5.0 * a * s * s * b;
    if (rc == L3D_RECOMPUTE_FULL) return lay->sp ? 2 * sbh / t : 2 * sbh;
    if (rc == L3D_RECOMPUTE_SELECTIVE) att = 0.0;
    double split = 8 * sbh + 4 * s * b * f + att;
    return lay->sp ? (10 * sbh + split) / t : 10 * sbh + split / t;
}

/* start[vs]: the first layer of virtual stage vs (prefix sums of layers) */
static void rank_chunks(const struct l3d_plan_model *m, const struct l3d_plan_layout *lay,
                        const int *layers, const int64_t *start, int r, const int *slots,
                        int64_t mm, bool fp32, struct shape_memo *memo, struct chunk *out) {
    struct l3d_gpt_config c = l3d_plan_model_gpt(m);
    int S = lay->pp * lay->v;
    for (int k = 0; k < lay->v; k++) {
        int vs = k * lay->pp + r;
        out[k].first = vs == 0;
        out[k].last = vs == S - 1;
        if (fp32 && slots)
            out[k].slots = slots[r * lay->v + k];
        else {
            int f = in_flight(lay->schedule, lay->pp, lay->v, mm, r);
            out[k].slots = (f + lay->v - 1) / lay->v;
        }
        out[k].shape = -1;
        for (int i = 0; i < memo->n; i++)
            if (memo->e[i].layers == layers[vs] && memo->e[i].first == out[k].first &&
                memo->e[i].last == out[k].last) {
                out[k].shape = i;
                out[k].sh = memo->e[i].sh;
                out[k].sh.layer_start = (int)start[vs];
                out[k].n = memo->e[i].n;
                out[k].n_gpt = memo->e[i].n_gpt;
                out[k].slot = memo->e[i].slot;
                out[k].nonlayer = memo->e[i].nonlayer;
            }
        if (out[k].shape >= 0) continue;
        struct l3d_shard sh;
        /* sizes only: the trainer's shard when it splits this way, the even split else; the
         * shard of stage 0 with the layer range and the ends of stage vs set as
         * l3d_layout_stage_shard sets them, from the prefix sums (it sums the layers before vs,
         * which over every chunk of a layout is O(stages^2)) */
        if (l3d_layout_stage_shard(&c, layers, S, 0, lay->tp, 0, lay->sp, &sh) != L3D_OK) {
            sh.head_count = m->heads / lay->tp;
            sh.ffn_count = 4LL * m->h / lay->tp;
            sh.vocab_count = ((int64_t)c.Vp + lay->tp - 1) / lay->tp;
        }
        sh.layer_start = (int)start[vs];
        sh.layer_count = layers[vs];
        sh.has_embedding = vs == 0;
        sh.has_head = vs == S - 1;
        struct l3d_tensor_info ti[L3D_NUM_TENSORS];
        out[k].sh = sh;
        out[k].n_gpt = l3d_gpt_plan_tensors(&c, &sh, ti);
        out[k].slot = out[k].nonlayer = 0;
        for (int t = 0; t < L3D_NUM_TENSORS; t++)
            if (l3d_gpt_is_layer_tensor(t)) out[k].slot += ti[t].rows * ti[t].cols;
            else out[k].nonlayer += ti[t].count;
        /* an MLP of width f instead of 4h: fcw, fcb and fcprojw change by (f - 4h)/t (2h + 1) */
        out[k].n = out[k].n_gpt + (int64_t)sh.layer_count * ((m->ffn - 4LL * m->h) / lay->tp) *
                                      (2LL * m->h + 1);
        if (memo->n < PLAN_SHAPES) {
            int i = memo->n++;
            memo->e[i].layers = layers[vs];
            memo->e[i].first = out[k].first;
            memo->e[i].last = out[k].last;
            memo->e[i].timed = false;
            memo->e[i].sh = sh;
            memo->e[i].n = out[k].n;
            memo->e[i].n_gpt = out[k].n_gpt;
            memo->e[i].slot = out[k].slot;
            memo->e[i].nonlayer = out[k].nonlayer;
            out[k].shape = i;
        }
    }
}

/* The CPU backend's 16-bit matrix products without oneDNN's 16-bit kernels (the default on every
 * CPU, docs/DESIGN.md) run as fp32 products on fp32 copies of their operands, allocated for the
 * call: the largest such set of a chunk's products, forward (input, weight, bias, output) or
 * backward (output gradient, weight, input gradient, input; the fp32 main_grad is used as is). */
static double mixed_matmul_scratch(const struct l3d_plan_model *m, const struct l3d_plan_layout *lay,
                                   const struct chunk *ch) {
    const struct l3d_shard *sh = &ch->sh;
    double N = (double)lay->mb * m->s, C = (double)m->h;
    double Ca = (double)sh->head_count * (m->h / m->heads), F = (double)sh->ffn_count;
    double prod[5][2] = {{C, 3 * Ca}, {Ca, C}, {C, F}, {F, C}, {C, (double)sh->vocab_count}};
    double best = 0;
    for (int i = sh->layer_count > 0 ? 0 : 4; i < (ch->last ? 5 : 4); i++) {
        double cin = prod[i][0], oc = prod[i][1];
        double fwd = N * cin + oc * cin + oc + N * oc, bwd = N * oc + oc * cin + 2 * N * cin;
        best = fmax(best, fmax(fwd, bwd));
    }
    return 4.0 * best;
}

static void rank_memory(const struct l3d_plan_model *m, const struct l3d_plan_run *run,
                        const struct l3d_plan_layout *lay, const struct chunk *ch, int r,
                        int64_t mm, struct l3d_plan_mem *mem) {
    memset(mem, 0, sizeof *mem);
    struct l3d_gpt_config c = l3d_plan_model_gpt(m);
    double d = lay->dp, f32 = bytes_of(L3D_F32), w = bytes_of(prec_dtype(run->precision));
    double scratch16 = 0, staging = 0;
    if (trainer(run)) {
        /* exactly what the trainer allocates: l3d_gpt_init_dt, l3d_dp_init, l3d_adamw_init_dt;
         * in mixed precision (w = 2) 16-bit parameters and activations, fp32 gradients, and the
         * fp32 master weights with the moments */
        const enum l3d_dtype dt = prec_dtype(run->precision);
        const double k_opt = run->precision == L3D_PREC_FP32 ? 2 : 3;
        for (int k = 0; k < lay->v; k++) {
            int64_t n = ch[k].n_gpt;
            int64_t shard = ((n + lay->dp - 1) / lay->dp + 15) / 16 * 16;
            int64_t own = lay->zero > 0 ? (n < shard ? n : shard) : n;
            mem->params += w * n;
            if (lay->zero == 2) {
                double slot = (double)ch[k].slot, nonlayer = (double)ch[k].nonlayer;
                mem->grads += (f32 * nonlayer + 64) + 2 * (f32 * slot + 64) + f32 * (own + 1);
            } else {
                mem->grads += f32 * n;
            }
            mem->optimizer += k_opt * f32 * own; /* AdamW m and v (and the master weights) */
            mem->activations += (double)l3d_gpt_act_bytes_dt(&c, &ch[k].sh, lay->mb, m->s,
                                                             ch[k].slots, lay->recompute,
                                                             run->flash, dt);
            /* ZeRO-2 in mixed precision stages the chunk's fp32 parameters at initialisation
             * and for each save (l3d_dp_fp32_params): allocated then freed, at the peak */
            if (lay->zero == 2 && dt != L3D_F32) staging += f32 * n;
        }
        /* the fp32 operands of the largest 16-bit product, once (freed after each product),
         * unless the profile says the products run in 16-bit kernels (gemm_native_T) */
        if (dt != L3D_F32 && !run->native16) {
            double most = 0;
            for (int k = 0; k < lay->v; k++) {
                double x = mixed_matmul_scratch(m, lay, &ch[k]);
                most = x > most ? x : most;
            }
            scratch16 = most;
        }
        /* the 16-bit DP reduction's staging (l3d_dp_reduce_in): two layers' gradients and the
         * non-layer tensors', in 2 bytes, per chunk; none in a group of one */
        if (run->grad_reduce_16 && lay->dp > 1)
            for (int k = 0; k < lay->v; k++)
                mem->other += 2.0 * (2.0 * (double)ch[k].slot + (double)ch[k].nonlayer) + 3 * 64;
        /* the token ids (inputs and targets) of a step's micro-batches, or of the validation
         * batches (--val-batches, 8 by default) when more */
        mem->other += 2.0 * bytes_of(L3D_I32) * lay->mb * m->s * (double)(mm > 8 ? mm : 8);
        /* the pipeline executor's received stage-output gradient (src/parallel/pipe_exec.c), the
         * rows of this rank under sequence parallelism; once small beside the s^2 attention
         * probabilities, now 1% of the small layouts tests/cli/plan.sh runs */
        mem->other += w * lay->mb * m->s * m->h / (lay->sp ? lay->tp : 1);
    } else {
        /* mixed precision, ZeRO paper sec. 3.1 (K = 12): 2-byte weights and gradients, fp32
         * master weights, Adam m and v: 12 bytes, divided by d from ZeRO-1, gradients from ZeRO-2 */
        double n = 0, acts = 0;
        int f = in_flight(lay->schedule, lay->pp, lay->v, mm, r);
        double per_chunk_layers = 0;
        for (int k = 0; k < lay->v; k++) {
            n += (double)ch[k].n;
            per_chunk_layers += ch[k].sh.layer_count;
        }
        per_chunk_layers /= lay->v;
        mem->params = w * n;
        mem->grads = lay->zero >= 2 ? w * n / d : w * n;
        mem->optimizer = lay->zero >= 1 ? 3 * f32 * n / d : 3 * f32 * n;
        acts = f * per_chunk_layers * layer_act_16(m, lay, lay->recompute, run->flash);
        /* the layer being recomputed in backward holds its full set once */
        if (lay->recompute != L3D_RECOMPUTE_NONE)
            acts += layer_act_16(m, lay, L3D_RECOMPUTE_NONE, run->flash);
        /* Korthikanti et al. 2022, sec. 4.3, beyond the layers: the embedding's dropout mask,
         * s b h bytes a micro-batch (one byte an element, as the 34 of Table 2 counts masks),
         * split along the sequence under SP; the first chunk keeps it for each of its micro-batches
         * in flight: p of them under 1F1B, p (1 + (p - 1)/(p v)) with interleaving (sec. 4.2.3),
         * i.e. this chunk's own share, not every chunk's of the rank. Its output is the first
         * layer's input, counted there. */
        double s = m->s, b = lay->mb, h = m->h, t = lay->tp, spd = lay->sp ? t : 1.0;
        if (ch[0].first) acts += ch[0].slots * s * b * h / spd;
        /* the output layer, sec. 4.3: the final LayerNorm's input 2 s b h and the projection's
         * input 2 s b h (sequence-split under SP), and the fp32 logits the cross-entropy keeps,
         * 4 s b V / t: 4 s b h / t (1 + V/h) with SP, for each micro-batch the last chunk keeps
         * (1 under 1F1B, where the last stage's backward follows its forward) */
        if (ch[lay->v - 1].last)
            acts += ch[lay->v - 1].slots * (4 * s * b * h / spd + f32 * s * b * c.Vp / t);
        mem->activations = acts;
        mem->other = 2.0 * (double)run->bucket_bytes; /* DP buckets: one reducing, one filling */
    }
    /* transients, not at once: the larger adds to the peak */
    mem->other += staging > scratch16 ? staging : scratch16;
    mem->total = mem->params + mem->grads + mem->optimizer + mem->activations + mem->other;
    mem->stage = r;
    mem->in_flight = in_flight(lay->schedule, lay->pp, lay->v, mm, r);
}

l3d_status l3d_plan_memory(const struct l3d_plan_model *m, const struct l3d_plan_run *run,
                           const struct l3d_plan_layout *lay_in, struct l3d_plan_mem *worst) {
    memset(worst, 0, sizeof *worst);
    struct l3d_plan_layout lay = *lay_in;
    if (lay.threads <= 0) lay.threads = run->threads > 0 ? run->threads : 1;
    l3d_status st = l3d_plan_check(m, NULL, run, &lay);
    if (st != L3D_OK) return st;
    int p = lay.pp, v = lay.v, S = p * v;
    int64_t mm = run->global_batch / ((int64_t)lay.mb * lay.dp);
    int *layers = malloc(sizeof(int) * (size_t)S);
    int64_t *start = malloc(sizeof(int64_t) * (size_t)(S + 1));
    struct chunk *ch = malloc(sizeof(struct chunk) * (size_t)v);
    if (!layers || !start || !ch)
        st = l3d_error(L3D_ERR_OOM, "out of memory planning %d stages", S);
    if (st == L3D_OK) st = l3d_plan_stage_layers(m, run, S, layers);
    if (st == L3D_OK) {
        start[0] = 0;
        for (int i = 0; i < S; i++) start[i + 1] = start[i] + layers[i];
    }
    struct shape_memo memo = {0};
    struct l3d_pp_schedule sched = {0};
    bool have_sched = false, fp32 = trainer(run);
    if (st == L3D_OK && fp32 && (int64_t)S * mm <= (1 << 20)) {
        st = l3d_pp_schedule_build(&sched, p > 1 ? lay.schedule : L3D_PP_1F1B, p, v, (int)mm);
        have_sched = st == L3D_OK;
    }
    for (int r = 0; st == L3D_OK && r < p; r++) {
        struct l3d_plan_mem mem;
        rank_chunks(m, &lay, layers, start, r, have_sched ? sched.slots : NULL, mm, fp32, &memo,
                    ch);
        rank_memory(m, run, &lay, ch, r, mm, &mem);
        if (mem.total > worst->total) *worst = mem;
    }
    if (have_sched) l3d_pp_schedule_free(&sched);
    free(layers);
    free(start);
    free(ch);
    return st;
}

/* ---- time ------------------------------------------------------------------------------- */

struct tctx {
    const struct l3d_plan_model *m;
    const struct l3d_profile *prof;
    const struct l3d_plan_layout *lay;
    double rate;    /* peak FLOP/s of one rank (its threads, shared when oversubscribed) */
    double threads; /* devices per rank for the GEMM efficiency */
    double bw;      /* element-wise bytes/s of one rank (the median kernel: products' operands,
                     * the head's loss, the embedding) */
    double bw_k[L3D_KERN_N]; /* bytes/s of one rank in each measured element-wise kernel */
    double e;       /* bytes per activation element */
    double ntok;    /* tokens in a micro-batch, b s */
    double cal;     /* the profile's gemm_calibration when the run asks for it, else 1 */
    bool fp32;
    bool flash;     /* fused attention */
    bool dropout;   /* attention dropout (Megatron-LM's core attention; not llm3d's trainer) */
};

/* One M x N x K product of a rank (M x K times K x N) at compute efficiency e: gemm() gives it
 * the product's own shape's (l3d_profile_gemm_eff_shape: the curve at its FLOPs, with the wave
 * quantization of its M x N output tiles), so a small micro-batch (small M) or a thin TP shard (small N or K) is slower
 * per FLOP than the cubes the curve was measured on. A rank's k threads share the product at that
 * one-core efficiency times gemm_thread_eff, which calibrate measures as the same product on k
 * threads against k single cores (not at the curve's 1/k of the FLOPs too: that counted the
 * smaller size twice; 1 on GPUs).
 * Roofline (Williams et al. 2009): never faster than moving its operands and result once through
 * memory, e (M K + K N + M N) bytes at the element-wise kernels' bandwidth. */
static double gemm_at(const struct tctx *x, double M, double N, double K, double e) {
    double f = 2 * M * N * K;
    if (x->threads > 1) e *= x->prof->gemm_thread_eff;
    double compute = f / (x->rate * e * x->cal);
    double memory = x->e * (M * K + K * N + M * N) / x->bw;
    return compute > memory ? compute : memory;
}
static double gemm(const struct tctx *x, double M, double N, double K) {
    return gemm_at(x, M, N, K, l3d_profile_gemm_eff_shape(x->prof, M, N, K));
}
/* c products of one M x N x K shape in one batched call (the attention's heads): each at the
 * efficiency of their stacked shape (c M x N x K: the same FLOPs and output tiles), each moving
 * its own operands. */
static double gemm_batched(const struct tctx *x, double c, double M, double N, double K) {
    return c * gemm_at(x, M, N, K, l3d_profile_gemm_eff_shape(x->prof, c * M, N, K));
}

/* Forward and backward of a linear layer on M tokens, K inputs, N outputs: y = x W (M x N x K);
 * backward dx = dy W^T (M x K x N) and dW = x^T dy (K x N x M), the reduction over the tokens,
 * at the profile's weight-gradient efficiency by tokens where it has one (gemm_eff_wgrad: on this
 * CPU the bf16 weight gradient into the fp32 main_grad runs at half the forward's rate at 128
 * tokens, whatever the weight's shape). */
static void linear(const struct tctx *x, double M, double N, double K, double *fwd, double *bwd) {
    *fwd += gemm(x, M, N, K);
    *bwd += gemm(x, M, K, N) + gemm_at(x, K, N, M, l3d_profile_wgrad_eff(x->prof, M, N, K));
}

/* The attention core of one layer on one micro-batch and rank (a/t heads): forward *f, backward
 * *bw. Fused (flash): 4 b s^2 h / t FLOPs forward, twice that backward (its recomputed scores
 * included), at the profile's attn_eff. Unfused, as Megatron-LM's core attention, which writes
 * the b (a/t) s^2 scores to memory and reads them back: its batched products, b (a/t) of them, at
 * the GEMM curve of their stacked shapes (forward QK^T, M = s, N = s, K = h/a, and P V, N = h/a,
 * K = s; backward dP like QK^T, dV, dQ and dK like P V), each head's bounded by moving its own
 * operands (the scores written or read), then the element-wise passes over the scores at
 * the kernels' bandwidth: softmax forward reads and writes them, backward reads probabilities
 * and gradient and writes one; attention dropout (Megatron-LM's, not llm3d's trainer) reads and
 * writes them and a byte of mask each way. The tensors are Korthikanti et al. 2022's (sec. 4.1:
 * 2as^2b of QK^T output and of softmax output, as^2b of mask, 2as^2b of dropout output). Where
 * the scores' size s^2 rivals the layer's h^2, at small h, these passes, not the FLOPs, set the
 * attention's time. */
static void attention(const struct tctx *x, double *f, double *bw) {
    const struct l3d_plan_model *m = x->m;
    double b = x->lay->mb, s = m->s, h = m->h, t = x->lay->tp;
    if (x->flash) {
        *f = 4 * b * s * s * h / t / (x->rate * x->prof->attn_eff);
        *bw = 2 * *f;
        return;
    }
    double heads = b * m->heads / t, d = h / m->heads, sc = heads * s * s;
    double qk = gemm_batched(x, heads, s, s, d), pv = gemm_batched(x, heads, s, d, s), e = x->e;
    double pf = sc * 2 * e, pb = sc * 3 * e; /* softmax */
    if (x->dropout) {
        pf += sc * (2 * e + 1);
        pb += sc * (2 * e + 1);
    }
    *f = qk + pv + pf / x->bw;
    *bw = qk + 3 * pv + pb / x->bw;
}

/* Ring all-reduce of n bytes over g ranks with bus bandwidth bw and per-message latency lat:
 * 2 (g - 1) / g n / bw + 2 (g - 1) lat (Patarasuk & Yuan 2009; NCCL's "bus bandwidth"). */
static double all_reduce(double n, int g, double bw, double lat) {
    if (g <= 1) return 0.0;
    return 2.0 * (g - 1) / g * n / bw + 2.0 * (g - 1) * lat;
}

/* The link between ranks lo and hi, the ends of a group on the rank grid: the node's NICs shared by
 * the `senders` devices that use them at once when the group crosses nodes, else the pair link
 * when both lie in one pair, else the node's links. */
static void link_of(const struct l3d_profile *p, int64_t lo, int64_t hi, int senders, double *bw,
                    double *lat) {
    int64_t dpn = p->devices_per_node;
    /* a machine without a network (inter_bw 0, the local profile) runs every rank on its one node,
     * oversubscribed when ranks x threads exceed its devices */
    if (lo / dpn != hi / dpn && p->inter_bw > 0) {
        /* the node's NICs, shared by the devices that send at once */
        *bw = p->inter_bw / (senders < dpn ? senders : dpn);
        *lat = p->inter_lat;
    } else if (p->pair_size > 1 && lo / p->pair_size == hi / p->pair_size) {
        *bw = p->pair_bw;
        *lat = p->intra_lat;
    } else {
        *bw = p->intra_bw > 0 ? p->intra_bw : p->mem_bw;
        *lat = p->intra_lat;
    }
}

/* Seconds of one micro-batch through one chunk, forward + backward (+ recomputation), split
 * (struct parts). */

static void chunk_time(const struct tctx *x, const struct chunk *ch, double tp_bw, double tp_lat,
                       double p2p_prev, double p2p_next, struct parts *o) {
    const struct l3d_plan_model *m = x->m;
    const struct l3d_plan_layout *lay = x->lay;
    double t = lay->tp, h = m->h, N = x->ntok, e = x->e;
    double spdiv = lay->sp ? t : 1.0;
    double Ll = ch->sh.layer_count;
    memset(o, 0, sizeof *o);
    /* per layer: QKV, attention projection, MLP up and down (column / row parallel), each on the
     * micro-batch's b s tokens (all of them under SP too: the all-gather comes first), forward
     * and its two backward products */
    double f = (double)m->ffn, g = 0, gb = 0;
    linear(x, N, 3 * h / t, h, &g, &gb);
    linear(x, N, h, h / t, &g, &gb);
    linear(x, N, f / t, h, &g, &gb);
    linear(x, N, h, f / t, &g, &gb);
    /* the attention core (attention(): fused at attn_eff, or its products and score passes) */
    double at, atb;
    attention(x, &at, &atb);
    /* element-wise passes, read + write: 2 LayerNorms (2 h each), 2 residual adds (3 h), GELU on
     * the f/t hidden (2 f/t), each at its own kernel's bandwidth; backward about twice the
     * traffic of the same kernels */
    double el = N * e * (4 * h / spdiv / x->bw_k[L3D_KERN_LAYERNORM] +
                         6 * h / spdiv / x->bw_k[L3D_KERN_RESIDUAL] +
                         2 * f / t / x->bw_k[L3D_KERN_GELU]);
    /* two all-reduces forward (with SP an all-gather and a reduce-scatter each, the same bus
     * volume), two backward; the profile's tp_overlap of it hidden behind compute */
    double ar = lay->tp > 1 ? (1 - x->prof->tp_overlap) *
                                  all_reduce(N * h * e, lay->tp, tp_bw, tp_lat) : 0.0;
    o->gemm = Ll * (g + gb);
    o->attn = Ll * (at + atb);
    o->elem = Ll * 3 * el;
    o->tp = Ll * 4 * ar;
    o->bwd = Ll * (gb + atb + 2 * el + 2 * ar);
    /* what is recomputed before each layer's backward: full, the whole forward from the layer's
     * input (its products, attention, element-wise passes and its two TP collectives: Korthikanti
     * et al. 2022, sec. 5, "full activation recomputation"); selective, the attention core from
     * QK^T through softmax and dropout to the product with V (their sec. 5, Figure 3), i.e. its
     * forward, and nothing with a fused attention, which keeps no scores to drop and whose
     * backward already recomputes them (counted in attn_eff): Megatron-LM checkpoints the core
     * attention only without flash attention */
    if (lay->recompute == L3D_RECOMPUTE_FULL) {
        o->rec = Ll * (g + at + el + 2 * ar);
        o->gemm += Ll * g;
        o->attn += Ll * at;
        o->elem += Ll * el;
        o->tp += Ll * 2 * ar;
    } else if (lay->recompute == L3D_RECOMPUTE_SELECTIVE && !x->flash) {
        o->rec = Ll * at;
        o->attn += Ll * at;
    }
    if (ch->last) {
        /* LM head (vocabulary-parallel) and cross-entropy on fp32 logits: max, sum-exp, gradient */
        struct l3d_gpt_config c = l3d_plan_model_gpt(m);
        double Vl = (double)c.Vp / t;
        double hg = 0, hgb = 0;
        linear(x, N, Vl, h, &hg, &hgb);
        /* the trainer keeps the logits in its own type (16 bits in mixed precision); Megatron-LM
         * casts them to fp32 for the loss (Korthikanti et al. 2022, sec. 4.3: 4 s b v bytes) */
        double le = x->fp32 ? e : bytes_of(L3D_F32);
        double hel = N * Vl * le * 5 / x->bw + N * h * e * 2 * 3 / x->bw_k[L3D_KERN_LAYERNORM];
        o->gemm += hg + hgb;
        o->elem += hel;
        o->bwd += hgb;
        if (lay->tp > 1) o->tp += (1 - x->prof->tp_overlap) *
                                  (all_reduce(N * h * e, lay->tp, tp_bw, tp_lat) +
                                   3 * all_reduce(N * bytes_of(L3D_F32), lay->tp, tp_bw, tp_lat));
    }
    if (ch->first) {
        /* gather + position add, and its backward: streaming passes, as a residual add */
        o->elem += N * h * e * 3 * 3 / x->bw_k[L3D_KERN_RESIDUAL];
        if (lay->tp > 1)
            o->tp += (1 - x->prof->tp_overlap) * all_reduce(N * h * e, lay->tp, tp_bw, tp_lat);
    }
    o->p2p = p2p_prev + p2p_next;
    o->total = o->gemm + o->attn + o->elem + o->tp + o->p2p;
}

/* The step's pipeline phase, by running the schedule's actions (the trainer's own, as
 * l3d_pp_schedule_build lists them: Megatron-LM's 1F1B, interleaved 1F1B or GPipe) on a timeline
 * with each virtual stage's own times: fwd[vs] a forward of one micro-batch, bwd[vs] its backward
 * with any recomputation, rin_act[vs] / rin_grad[vs] the receive of its input activation / output
 * gradient (the link between the two ranks). A rank runs its list in order; a receive waits for
 * the matching send, then takes its transfer time; sends do not block (the trainer and Megatron
 * post them non-blocking). So the bubble and the p2p are those of the real stage imbalance: the
 * first stage's embedding, the last one's head and loss, uneven partitions, links that differ
 * between ranks. Returns the time of the last action; -1 when out of memory or the schedule
 * waits for a send never made (l3d_pp_simulate checks that never happens). */
double l3d_plan_pipe_time(const struct l3d_pp_schedule *sc, const double *fwd, const double *bwd,
                          const double *rin_act, const double *rin_grad) {
    int p = sc->pp, v = sc->v, S = p * v;
    int64_t m = sc->m;
    double *ready = malloc(sizeof(double) * 2 * (size_t)S * (size_t)m);
    double *clock = calloc((size_t)p, sizeof(double));
    int *at = calloc((size_t)p, sizeof(int));
    double end = -1;
    if (ready && clock && at) {
        for (int64_t i = 0; i < 2 * (int64_t)S * m; i++) ready[i] = -1;
        double *act = ready, *grad = ready + (size_t)S * (size_t)m; /* [vs * m + micro] */
        bool moved = true;
        while (moved) {
            moved = false;
            for (int r = 0; r < p; r++) {
                while (at[r] < sc->n[r]) {
                    const struct l3d_pp_action *a = &sc->acts[r][at[r]];
                    int vs = a->chunk * p + r;
                    int64_t i = (int64_t)vs * m + a->micro;
                    bool to_next = a->op == L3D_PP_SEND_ACT, to_prev = a->op == L3D_PP_SEND_GRAD;
                    if (a->chunk < 0 || a->chunk >= v || a->micro < 0 || a->micro >= m ||
                        (to_next && vs + 1 >= S) || (to_prev && vs == 0))
                        break; /* not a schedule this timeline knows: reported as unmatched */
                    if (a->op == L3D_PP_FWD) clock[r] += fwd[vs];
                    else if (a->op == L3D_PP_BWD) clock[r] += bwd[vs];
                    else if (a->op == L3D_PP_SEND_ACT) act[i + m] = clock[r];      /* to vs + 1 */
                    else if (a->op == L3D_PP_SEND_GRAD) grad[i - m] = clock[r];    /* to vs - 1 */
                    else {
                        double t = a->op == L3D_PP_RECV_ACT ? act[i] : grad[i];
                        if (t < 0) break; /* not sent yet: another rank first */
                        clock[r] = (clock[r] > t ? clock[r] : t) +
                                   (a->op == L3D_PP_RECV_ACT ? rin_act[vs] : rin_grad[vs]);
                    }
                    at[r]++;
                    moved = true;
                }
            }
        }
        end = 0;
        for (int r = 0; r < p; r++) {
            if (at[r] < sc->n[r]) end = -1;
            if (end >= 0 && clock[r] > end) end = clock[r];
        }
    }
    free(ready);
    free(clock);
    free(at);
    return end;
}

/* Schedules of a few (kind, p, v, m), kept across the layouts of a search. */
#define PIPE_CACHE 4
#define PIPE_FULL (1 << 11) /* chunk-micro-batches a layout's timeline runs in full */
struct pipe_cache {
    bool have[PIPE_CACHE];
    enum l3d_pp_kind kind[PIPE_CACHE];
    int p[PIPE_CACHE], v[PIPE_CACHE], m[PIPE_CACHE];
    struct l3d_pp_schedule s[PIPE_CACHE];
    int next;
};

static void pipe_cache_free(struct pipe_cache *pc) {
    for (int i = 0; i < PIPE_CACHE; i++)
        if (pc->have[i]) l3d_pp_schedule_free(&pc->s[i]);
    memset(pc, 0, sizeof *pc);
}

static const struct l3d_pp_schedule *pipe_schedule(struct pipe_cache *pc, enum l3d_pp_kind kind,
                                                   int p, int v, int m) {
    for (int i = 0; i < PIPE_CACHE; i++)
        if (pc->have[i] && pc->kind[i] == kind && pc->p[i] == p && pc->v[i] == v && pc->m[i] == m)
            return &pc->s[i];
    int i = pc->next;
    pc->next = (pc->next + 1) % PIPE_CACHE;
    if (pc->have[i]) l3d_pp_schedule_free(&pc->s[i]);
    pc->have[i] = l3d_pp_schedule_build(&pc->s[i], kind, p, v, m) == L3D_OK;
    if (!pc->have[i]) return NULL;
    pc->kind[i] = kind;
    pc->p[i] = p;
    pc->v[i] = v;
    pc->m[i] = m;
    return &pc->s[i];
}

/* The pipeline phase of m micro-batches: the timeline of the schedule itself when p v m is at
 * most `full` chunk-micro-batches; else the timelines of 4p and 5p micro-batches, extended
 * linearly: past its warm-up (at most 2 (p - 1) + (v - 1) p chunk-forwards, under 2p
 * micro-batches) a schedule repeats with a fixed period per micro-batch, so each p more add the
 * same time (test_pipe_time checks the two agree). -1 when neither is possible (more than 2^20
 * chunk-micro-batches even so, out of memory). */
static double pipe_phase(struct pipe_cache *pc, enum l3d_pp_kind kind, int p, int v, int64_t m,
                         const double *fwd, const double *bwd, const double *rin_act,
                         const double *rin_grad, int64_t full) {
    if ((int64_t)p * v * m <= full && m <= 1 << 24) {
        const struct l3d_pp_schedule *sc = pipe_schedule(pc, kind, p, v, (int)m);
        return sc ? l3d_plan_pipe_time(sc, fwd, bwd, rin_act, rin_grad) : -1;
    }
    int64_t m1 = 2LL * p, m2 = 3LL * p;
    if (m <= m2 || (int64_t)p * v * m2 > 1 << 20) return -1;
    const struct l3d_pp_schedule *s1 = pipe_schedule(pc, kind, p, v, (int)m1);
    double t1 = s1 ? l3d_plan_pipe_time(s1, fwd, bwd, rin_act, rin_grad) : -1;
    const struct l3d_pp_schedule *s2 = pipe_schedule(pc, kind, p, v, (int)m2);
    double t2 = s2 ? l3d_plan_pipe_time(s2, fwd, bwd, rin_act, rin_grad) : -1;
    if (t1 < 0 || t2 < 0) return -1;
    return t2 + (double)(m - m2) * (t2 - t1) / (double)p;
}

double l3d_plan_pipe_phase(enum l3d_pp_kind kind, int p, int v, int64_t m, const double *fwd,
                           const double *bwd, const double *rin_act, const double *rin_grad,
                           int64_t full) {
    struct pipe_cache pc = {0};
    double t = pipe_phase(&pc, kind, p, v, m, fwd, bwd, rin_act, rin_grad, full);
    pipe_cache_free(&pc);
    return t;
}

/* What the layouts of one search share: the stage partitions by stage count and the last
 * schedule, so that a search computes each once rather than once a layout. */
#define PLAN_CACHE 32
#define PIPE_MEMO 8
struct plan_cache {
    int S[PLAN_CACHE];
    int *layers[PLAN_CACHE];
    int next;
    bool have_sched;
    enum l3d_pp_kind kind;
    int p, v;
    int64_t mm;
    struct l3d_pp_schedule sched;
    struct pipe_cache pc; /* the short schedules the timeline runs */
    /* the last timelines' stage times (4 S) and results: layouts that differ in the ZeRO stage
     * alone (the search tries the recomputation and SP variants in between) share them */
    struct {
        double *vt;
        int S, v;
        enum l3d_pp_kind kind;
        int64_t mm;
        double pipe;
    } tl[PIPE_MEMO];
    int tl_next;
};

static void cache_free(struct plan_cache *cc) {
    for (int i = 0; i < PLAN_CACHE; i++) free(cc->layers[i]);
    if (cc->have_sched) l3d_pp_schedule_free(&cc->sched);
    pipe_cache_free(&cc->pc);
    for (int i = 0; i < PIPE_MEMO; i++) free(cc->tl[i].vt);
    memset(cc, 0, sizeof *cc);
}

/* the layers of each of S stages: from the cache, else computed (and kept there when cc) */
static l3d_status stage_layers_cached(const struct l3d_plan_model *m,
                                      const struct l3d_plan_run *run, int S,
                                      struct plan_cache *cc, int **owned, const int **layers) {
    *owned = NULL;
    if (cc)
        for (int i = 0; i < PLAN_CACHE; i++)
            if (cc->layers[i] && cc->S[i] == S) {
                *layers = cc->layers[i];
                return L3D_OK;
            }
    int *buf = malloc(sizeof(int) * (size_t)S);
    if (!buf) return l3d_error(L3D_ERR_OOM, "out of memory planning %d stages", S);
    l3d_status st = l3d_plan_stage_layers(m, run, S, buf);
    if (st != L3D_OK) {
        free(buf);
        return st;
    }
    if (cc) {
        free(cc->layers[cc->next]);
        cc->layers[cc->next] = buf;
        cc->S[cc->next] = S;
        cc->next = (cc->next + 1) % PLAN_CACHE;
    } else {
        *owned = buf;
    }
    *layers = buf;
    return L3D_OK;
}

static l3d_status evaluate(const struct l3d_plan_model *m, const struct l3d_profile *prof,
                           const struct l3d_plan_run *run, const struct l3d_plan_layout *lay_in,
                           struct l3d_plan_result *r, struct plan_cache *cc) {
    memset(r, 0, sizeof *r);
    struct l3d_plan_run rn = *run; /* the profile's word on llm3d's 16-bit products */
    if (run->llm3d_mixed && run->precision != L3D_PREC_FP32 &&
        prof->mixed[run->precision == L3D_PREC_BF16 ? 0 : 1].native)
        rn.native16 = true;
    run = &rn;
    struct l3d_plan_layout lay = *lay_in;
    if (lay.threads <= 0) lay.threads = run->threads > 0 ? run->threads : 1;
    l3d_status st = l3d_plan_check(m, prof, run, &lay);
    if (st != L3D_OK) return st;
    r->layout = lay;
    bool fp32 = trainer(run);
    int p = lay.pp, v = lay.v, t = lay.tp;
    int64_t mm = run->global_batch / ((int64_t)lay.mb * lay.dp);
    r->m = (int)mm;
    int S = p * v;
    int *owned = NULL;
    const int *layers = NULL;
    st = stage_layers_cached(m, run, S, cc, &owned, &layers);
    if (st != L3D_OK) return st;
    int64_t *start = malloc(sizeof(int64_t) * (size_t)(S + 1));
    struct chunk *ch = malloc(sizeof(struct chunk) * (size_t)v);
    if (!start || !ch) {
        free(owned);
        free(start);
        free(ch);
        return l3d_error(L3D_ERR_OOM, "out of memory planning %d stages", S);
    }
    start[0] = 0;
    for (int i = 0; i < S; i++) start[i + 1] = start[i] + layers[i];
    /* the trainer's own schedule says how many micro-batches each chunk keeps */
    struct l3d_pp_schedule own_sched = {0};
    const struct l3d_pp_schedule *sched = NULL;
    enum l3d_pp_kind kind = p > 1 ? lay.schedule : L3D_PP_1F1B;
    if (fp32 && (int64_t)p * v * mm <= (1 << 20)) {
        if (cc && cc->have_sched && cc->kind == kind && cc->p == p && cc->v == v && cc->mm == mm) {
            sched = &cc->sched;
        } else if (cc) {
            if (cc->have_sched) l3d_pp_schedule_free(&cc->sched);
            cc->have_sched = false;
            st = l3d_pp_schedule_build(&cc->sched, kind, p, v, (int)mm);
            if (st == L3D_OK) {
                cc->have_sched = true;
                cc->kind = kind;
                cc->p = p;
                cc->v = v;
                cc->mm = mm;
                sched = &cc->sched;
            }
        } else {
            st = l3d_pp_schedule_build(&own_sched, kind, p, v, (int)mm);
            if (st == L3D_OK) sched = &own_sched;
        }
    }
    bool have_sched = sched != NULL;
    if (st != L3D_OK) {
        free(owned);
        free(start);
        free(ch);
        return st;
    }

    /* rates: a rank is `threads` devices; ranks x threads beyond a node's devices share them */
    struct tctx x = {.m = m, .prof = prof, .lay = &lay, .fp32 = fp32, .cal = 1.0,
                     .flash = run->flash, .dropout = !fp32}; /* fp32: llm3d's trainer */
    if (run->calibrated && prof->gemm_calibration > 0) x.cal = prof->gemm_calibration;
    double share = 1.0;
    if (fp32 && run->devices > prof->devices_per_node && prof->inter_bw <= 0)
        share = (double)prof->devices_per_node / (double)run->devices; /* one oversubscribed node */
    x.threads = lay.threads;
    x.rate = run_peak(prof, run) * lay.threads * share;
    x.bw = prof->mem_bw * prof->kernel_bw_eff * lay.threads * share;
    for (int k = 0; k < L3D_KERN_N; k++)
        x.bw_k[k] = prof->mem_bw * l3d_profile_kern_eff(prof, (enum l3d_kern)k) * lay.threads *
                    share;
    x.e = bytes_of(prec_dtype(run->precision));
    x.ntok = (double)lay.mb * m->s;

    double tp_bw = 0, tp_lat = 0;
    if (t > 1) link_of(prof, 0, t - 1, t, &tp_bw, &tp_lat);
    /* per pipeline rank: chunk times and memory */
    double t_max = 0, t_sum = 0, bwd_of_max = 0;
    struct parts worst = {0}, all = {0}; /* the slowest rank's parts; every rank's summed */
    double n_max = 0;
    struct l3d_plan_mem mem_worst = {0};
    struct shape_memo memo = {0};
    /* per virtual stage, for the schedule's timeline: forward, backward (+ recomputation), and the
     * receives of its input and of its output's gradient */
    double *vt = p > 1 ? malloc(sizeof(double) * 4 * (size_t)S) : NULL;
    for (int rr = 0; rr < p; rr++) {
        rank_chunks(m, &lay, layers, start, rr, have_sched && fp32 ? sched->slots : NULL, mm,
                    fp32, &memo, ch);
        struct l3d_plan_mem mem;
        rank_memory(m, run, &lay, ch, rr, mm, &mem);
        if (mem.total > mem_worst.total) mem_worst = mem;
        struct parts sum = {0};
        double n_rank = 0;
        for (int k = 0; k < v; k++) {
            /* p2p: the rank receives an activation from the previous virtual stage and a gradient
             * from the next one per micro-batch; Megatron's scatter/gather sends 1/t of it per TP
             * rank in mixed precision, the trainer the whole (B,T,C) */
            double msg = x.ntok * m->h * x.e / (fp32 ? 1.0 : t);
            double pp_prev = 0, pp_next = 0, bw, lat;
            int64_t me = (int64_t)rr * t;
            if (!ch[k].first) {
                int64_t peer = (int64_t)((rr - 1 + p) % p) * t;
                link_of(prof, me < peer ? me : peer, me < peer ? peer + t - 1 : me + t - 1, t, &bw,
                        &lat);
                pp_prev = msg / bw + lat;
            }
            if (!ch[k].last) {
                int64_t peer = (int64_t)((rr + 1) % p) * t;
                link_of(prof, me < peer ? me : peer, me < peer ? peer + t - 1 : me + t - 1, t, &bw,
                        &lat);
                pp_next = msg / bw + lat;
            }
            struct parts cp;
            if (ch[k].shape >= 0 && memo.e[ch[k].shape].timed) {
                cp = memo.e[ch[k].shape].t;
            } else {
                chunk_time(&x, &ch[k], tp_bw, tp_lat, 0.0, 0.0, &cp);
                if (ch[k].shape >= 0) {
                    memo.e[ch[k].shape].t = cp;
                    memo.e[ch[k].shape].timed = true;
                }
            }
            if (vt) {
                int vs = k * p + rr;
                vt[vs] = cp.total - cp.bwd - cp.rec;
                vt[S + vs] = cp.bwd + cp.rec;
                vt[2 * S + vs] = pp_prev;
                vt[3 * S + vs] = pp_next;
            }
            cp.p2p = pp_prev + pp_next;
            cp.total += cp.p2p;
            parts_add(&sum, &cp, 1.0);
            n_rank += (double)ch[k].n;
        }
        t_sum += sum.total;
        parts_add(&all, &sum, 1.0);
        if (sum.total > t_max) {
            t_max = sum.total;
            worst = sum;
            bwd_of_max = sum.bwd;
        }
        if (n_rank > n_max) n_max = n_rank;
    }
    /* the pipeline: the schedule run with each stage's own times (pipe_phase); beyond 2^20
     * chunk-micro-batches, or out of memory, the closed form (m - 1/v) t_max + sum_r t_r / v,
     * which for equal stages is (m + (p - 1)/v) t, the bubble (p - 1)/(v m) of Narayanan et al.
     * 2021, sec. 2.2 */
    double pipe = (mm - 1.0 / v) * t_max + t_sum / v;
    if (vt) {
        size_t n = sizeof(double) * 4 * (size_t)S;
        double sim = -1;
        int hit = -1;
        for (int i = 0; cc && i < PIPE_MEMO && hit < 0; i++)
            if (cc->tl[i].vt && cc->tl[i].S == S && cc->tl[i].kind == kind && cc->tl[i].v == v &&
                cc->tl[i].mm == mm && memcmp(cc->tl[i].vt, vt, n) == 0)
                hit = i;
        if (hit >= 0) {
            sim = cc->tl[hit].pipe;
        } else {
            struct pipe_cache own_pc = {0};
            sim = pipe_phase(cc ? &cc->pc : &own_pc, kind, p, v, mm, vt, vt + S, vt + 2 * S,
                             vt + 3 * S, PIPE_FULL);
            pipe_cache_free(&own_pc);
            if (cc) {
                int i = cc->tl_next;
                cc->tl_next = (i + 1) % PIPE_MEMO;
                free(cc->tl[i].vt);
                cc->tl[i].vt = vt;
                vt = NULL;
                cc->tl[i].S = S;
                cc->tl[i].kind = kind;
                cc->tl[i].v = v;
                cc->tl[i].mm = mm;
                cc->tl[i].pipe = sim;
            }
        }
        if (sim >= 0) pipe = sim;
    }
    free(vt);
    if (sched == &own_sched) l3d_pp_schedule_free(&own_sched);
    /* An oversubscribed node (share < 1: more ranks x threads than cores, as 8 ranks on the local
     * profile's 2): a rank that waits gives its core up (Open MPI yields when oversubscribed;
     * measured in the brief), so the cores serve whichever ranks have work and the pipeline's
     * bubble holds the other stages' work. The pipeline phase is then the work of all ranks over
     * the cores, i.e. the average rank's busy time at its share (t_sum / p a micro-batch), no
     * shorter than the schedule at a whole core's speed (its time at the share, times the
     * share). Its parts are the average rank's. */
    if (share < 1) {
        double work = mm * t_sum / p, crit = pipe * share;
        pipe = work > crit ? work : crit;
        worst = (struct parts){0};
        parts_add(&worst, &all, 1.0 / p);
        t_max = t_sum / p;
    }
    struct l3d_plan_time *T = &r->time;
    T->gemm = mm * worst.gemm;
    T->attention = mm * worst.attn;
    T->elementwise = mm * worst.elem;
    T->recompute = mm * worst.rec;
    T->tp_comm = mm * worst.tp;
    T->pp_p2p = mm * worst.p2p;
    T->bubble = pipe - mm * t_max;

    /* DP: gradients reduced over d replicas (all-reduce; ZeRO-1 reduce-scatter + all-gather of the
     * parameters, the same bus volume; ZeRO-2 reduce-scatters every micro-batch) */
    /* gradients and parameters: the run's element type; llm3d's mixed precision reduces its fp32
     * main_grad (all-reduce, or ZeRO's reduce to the owner) and all-gathers the 16-bit
     * parameters under ZeRO (src/parallel/dp.c); with --grad-reduce-dtype bf16|fp16, 2 bytes an
     * element (l3d_dp_reduce_in). The fp32 main_grad is what the tied embedding's sum and the
     * optimizer read. */
    double eb = run->llm3d_mixed ? bytes_of(L3D_F32) : x.e;
    double gb = run->grad_reduce_16 ? bytes_of(L3D_BF16) : eb, pb = lay.zero >= 1 ? x.e : gb;
    if (lay.dp > 1) {
        /* A DP group's members are t p ranks apart, so a node holds members of t p groups (of
         * all of them when t p >= devices_per_node), which reduce at once. Each group's ring
         * enters and leaves a node once per channel, over that channel's NIC (NCCL's rings, one
         * NIC a channel on rail-aligned nodes: Jeaugey, "NCCL 2.0", GTC 2017), so the node's
         * NICs are shared by those t p groups, not by the group's members on the node: a group
         * that fills its nodes (t p = 1) has the node's whole inter_bw, a group of one member a
         * node its device's share. Members on one node also pass the ring inside it, which
         * inter_bw may not outrun. */
        double bw, lat;
        int64_t span = (int64_t)t * p * lay.dp, tpn = (int64_t)t * p;
        int64_t dpn = prof->devices_per_node;
        link_of(prof, 0, span - 1, (int)(tpn < dpn ? tpn : dpn), &bw, &lat);
        if (tpn < dpn && span > dpn && prof->inter_bw > 0 && prof->intra_bw > 0 &&
            bw > prof->intra_bw)
            bw = prof->intra_bw;
        double d = lay.dp;
        double rs = (d - 1) / d * n_max * gb / bw + (d - 1) * lat;
        double ag = (d - 1) / d * n_max * pb / bw + (d - 1) * lat;
        double comm = lay.zero == 2 ? mm * rs + ag : rs + ag;
        /* What runs during backward can hide behind it: ZeRO-0's whole all-reduce, ZeRO-1's
         * reduction (its parameter all-gather follows the optimizer step), ZeRO-2's reduction of
         * every micro-batch; of that, the profile's dp_overlap fraction while there is backward
         * left to hide behind, never the last bucket (at least a tenth stays exposed). */
        double during = lay.zero == 0 ? comm : lay.zero == 2 ? mm * rs : rs;
        double window = lay.zero == 2 ? mm * bwd_of_max : bwd_of_max;
        double hide = fmin(window, 0.9 * during);
        T->dp_comm = comm - prof->dp_overlap * hide;
    }
    if (p > 1) {
        /* the tied embedding's gradient summed between the first and the last stage */
        struct l3d_gpt_config c = l3d_plan_model_gpt(m);
        double bw, lat;
        link_of(prof, 0, (int64_t)(p - 1) * t + t - 1, t, &bw, &lat);
        T->embed_sync = all_reduce((double)c.Vp / t * m->h * eb, 2, bw, lat);
    }
    /* AdamW over the rank's optimizer shard: fp32 reads parameter, gradient, m, v and writes
     * parameter, m, v (28 bytes); llm3d's mixed precision also writes the 16-bit copy (28 + 2,
     * l3d_be_adamw_mixed), Megatron-LM's (32, as counted before). Two streaming passes over the
     * gradients, timed as a residual add is: the global norm reads the shard's (the rank's
     * range under ZeRO, l3d_dp_grad_sumsq_add), and the gradient buffer is zeroed for the next
     * step (the whole buffer; ZeRO-2's shard: l3d_dp_step, Megatron-LM's zero_grad_buffer) */
    double n_opt = lay.zero >= 1 ? n_max / lay.dp : n_max;
    double n_zero = lay.zero == 2 ? n_opt : n_max;
    double opt_bytes = !fp32 ? 32.0 : run->llm3d_mixed ? 28.0 + x.e : 28.0;
    T->optimizer = n_opt * opt_bytes / x.bw_k[L3D_KERN_ADAMW] +
                   (n_opt + n_zero) * eb / x.bw_k[L3D_KERN_RESIDUAL];
    T->step = pipe + T->dp_comm + T->embed_sync + T->optimizer;

    r->mem = mem_worst;
    /* a CPU rank: its cores' share; less what the runtime keeps (the profile's reserve_gb: the
     * device context, library workspaces, communication buffers, the allocator's fragmentation),
     * which the predicted bytes do not include */
    r->fits = mem_worst.total + prof->reserve_bytes <= prof->mem_bytes * lay.threads;
    double G = (double)run->global_batch, s = m->s, h = m->h, L = m->L;
    struct l3d_gpt_config c = l3d_plan_model_gpt(m);
    /* Narayanan et al. 2021, eq. 3: 72 B s L h^2 (1 + s/6h) + 6 B s h V per step without
     * recomputation (3 passes); the full recomputation's extra forward makes it 96. A layer's
     * forward per token: 24 h^2 = 2 (3h^2 + h^2 + 2 h f) with f = 4h, plus attention's 4 s h */
    double f = (double)m->ffn;
    double layer_f = 8 * h * h + 4 * h * f + 4 * s * h, head = 6 * h * c.Vp;
    r->model_flops = G * s * (3 * L * layer_f + head);
    /* the recomputed forward (chunk_time): full, a layer's; selective, the attention core's 4 s h
     * a token, none with a fused attention */
    double extra = lay.recompute == L3D_RECOMPUTE_FULL ? L * layer_f
                   : lay.recompute == L3D_RECOMPUTE_SELECTIVE && !run->flash ? L * 4 * s * h
                                                                             : 0.0;
    r->hw_flops = r->model_flops + G * s * extra;
    r->tokens_per_s = G * s / T->step;
    double peak_all = run_peak(prof, run) * (double)run->devices;
    r->mfu = r->model_flops / T->step / peak_all;
    r->hfu = r->hw_flops / T->step / peak_all;
    free(owned);
    free(start);
    free(ch);
    return L3D_OK;
}

/* The figures a run's kernels reach: llm3d's bf16 / fp16 on a profile with that type's 16-bit
 * keys (measured by llm3d bench --calibrate through the backend's 16-bit kernels: on a CPU
 * without 16-bit products, widened operands around the fp32 product, conversions included) take
 * them in place of gemm_eff, attn_eff, gemm_thread_eff and kernel_bw_eff; every other run, and a
 * profile without them (older local profiles; the GPU profiles, Megatron-style), its own. */
static const struct l3d_profile *run_profile(const struct l3d_profile *prof,
                                             const struct l3d_plan_run *run,
                                             struct l3d_profile *tmp) {
    return run->llm3d_mixed && l3d_profile_mixed(prof, run->precision, tmp) ? tmp : prof;
}

l3d_status l3d_plan_evaluate(const struct l3d_plan_model *m, const struct l3d_profile *prof,
                             const struct l3d_plan_run *run, const struct l3d_plan_layout *lay,
                             struct l3d_plan_result *r) {
    struct l3d_profile tmp;
    prof = run_profile(prof, run, &tmp);
    return evaluate(m, prof, run, lay, r, NULL);
}

/* ---- search ----------------------------------------------------------------------------- */

static bool better(const struct l3d_plan_result *a, const struct l3d_plan_result *b) {
    if (a->time.step != b->time.step) return a->time.step < b->time.step;
    return a->mem.total < b->mem.total;
}

static void keep(struct l3d_plan_result *out, int top, int *n, const struct l3d_plan_result *r) {
    int i = *n < top ? (*n)++ : top;
    if (i == top) {
        if (!better(r, &out[top - 1])) return;
        i = top - 1;
    }
    while (i > 0 && better(r, &out[i - 1])) {
        out[i] = out[i - 1];
        i--;
    }
    out[i] = *r;
}

l3d_status l3d_plan_search(const struct l3d_plan_model *m, const struct l3d_profile *prof,
                           const struct l3d_plan_run *run, const struct l3d_plan_fixed *fx,
                           struct l3d_plan_result *out, int top, int *n_out,
                           struct l3d_plan_search_stats *stats) {
    double t0 = l3d_time_s();
    struct l3d_profile tmp;
    prof = run_profile(prof, run, &tmp);
    memset(stats, 0, sizeof *stats);
    *n_out = 0;
    l3d_status st = l3d_plan_model_check(m);
    if (st != L3D_OK) return st;
    if (top < 1) return l3d_error(L3D_ERR_ARG, "--top %d must be at least 1", top);
    int th = run->threads > 0 ? run->threads : 1;
    if (run->devices % th != 0)
        return l3d_error(L3D_ERR_ARG, "%lld devices do not split into ranks of %d threads",
                         (long long)run->devices, th);
    int64_t ranks = run->devices / th;
    const char *part[] = {"--tp", "--pp", "--dp"};
    const int val[] = {fx->tp, fx->pp, fx->dp};
    for (int i = 0; i < 3; i++)
        if (val[i] && ranks % val[i] != 0)
            return l3d_error(L3D_ERR_LAYOUT, "%s %d does not divide the %lld ranks (%lld devices%s)",
                             part[i], val[i], (long long)ranks, (long long)run->devices,
                             th > 1 ? " / threads" : "");
    if (fx->tp && m->heads % fx->tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "--tp %d does not divide the model's %d heads", fx->tp,
                         m->heads);
    if ((int64_t)(fx->tp ? fx->tp : 1) * (fx->pp ? fx->pp : 1) * (fx->dp ? fx->dp : 1) > ranks ||
        (fx->tp && fx->pp && fx->dp && (int64_t)fx->tp * fx->pp * fx->dp != ranks))
        return l3d_error(L3D_ERR_LAYOUT, "--tp x --pp x --dp must equal the %lld ranks",
                         (long long)ranks);
    static const int mbs[] = {1, 2, 4, 8, 16, 32, 64};
    l3d_status first_err = L3D_OK;
    char first_msg[512] = "";
    struct plan_cache cache = {0};
    for (int64_t tp = 1; tp <= ranks; tp++) {
        if (ranks % tp || (fx->tp && tp != fx->tp)) continue;
        if (!fx->tp && (tp > m->heads || (tp > prof->devices_per_node && prof->devices_per_node > 1)))
            continue;
        for (int64_t pp = 1; pp <= ranks / tp; pp++) {
            if ((ranks / tp) % pp || (fx->pp && pp != fx->pp) || pp > m->L) continue;
            int64_t dp = ranks / tp / pp;
            if (fx->dp && dp != fx->dp) continue;
            size_t n_mb = fx->mb ? 1 : sizeof mbs / sizeof mbs[0];
            for (size_t bi = 0; bi < n_mb; bi++) {
                int mb = fx->mb ? fx->mb : mbs[bi];
                if (run->global_batch % ((int64_t)mb * dp)) continue;
                /* every v that divides the layers a pipeline rank holds (Megatron-LM needs it;
                 * the trainer splits unevenly, so there the rank's whole layers, L / pp rounded
                 * down, which keeps the choice to the divisors) */
                int per_rank = (int)(m->L / pp);
                for (int v = 1; v <= per_rank; v++) {
                    if (per_rank % v || (fx->v && v != fx->v)) continue;
                    if (v > 1 && pp < 2) continue;
                    for (int z = 0; z <= 2; z++) {
                        if (fx->zero >= 0 ? z != fx->zero : (z > 0 && dp == 1)) continue;
                        for (int rc = 0; rc <= 2; rc++) {
                            if (fx->recompute >= 0 && rc != fx->recompute) continue;
                            for (int sp = 0; sp <= 1; sp++) {
                                if (fx->sp >= 0 ? sp != fx->sp : (sp && tp == 1)) continue;
                                struct l3d_plan_layout lay = {
                                    .tp = (int)tp, .pp = (int)pp, .dp = (int)dp, .mb = mb, .v = v,
                                    .zero = z, .recompute = (enum l3d_recompute)rc, .sp = sp,
                                    .schedule = v > 1 ? L3D_PP_INTERLEAVED : L3D_PP_1F1B,
                                    .threads = th};
                                struct l3d_plan_result res;
                                stats->evaluated++;
                                l3d_status e = evaluate(m, prof, run, &lay, &res, &cache);
                                if (e != L3D_OK) {
                                    if (first_err == L3D_OK) {
                                        first_err = e;
                                        snprintf(first_msg, sizeof first_msg, "%s",
                                                 l3d_error_message());
                                    }
                                    continue;
                                }
                                stats->valid++;
                                if (!res.fits) continue;
                                stats->fit++;
                                keep(out, top, n_out, &res);
                            }
                        }
                    }
                }
            }
        }
    }
    cache_free(&cache);
    stats->seconds = l3d_time_s() - t0;
    if (stats->valid == 0 && first_err != L3D_OK)
        return l3d_error(first_err, "no valid layout; the first tried: %s", first_msg);
    if (stats->valid == 0)
        return l3d_error(L3D_ERR_LAYOUT, "no layout of %lld devices (ranks of %d threads) suits "
                         "this model and batch: check --devices, --global-batch and the fixed "
                         "parts", (long long)run->devices, th);
    return L3D_OK;
}

static const char *rc_words(enum l3d_recompute r) {
    return r == L3D_RECOMPUTE_FULL        ? "full recomputation"
           : r == L3D_RECOMPUTE_SELECTIVE ? "selective recomputation"
                                          : "no recomputation";
}

void l3d_plan_explain(const struct l3d_plan_result *a, const struct l3d_plan_result *b, char *buf,
                      size_t len) {
    if (!b) {
        snprintf(buf, len, "the only layout that fits");
        return;
    }
    const char *names[] = {"matrix products", "attention", "element-wise kernels", "recomputation",
                           "TP communication", "pipeline p2p", "pipeline bubble",
                           "DP communication", "embedding sync", "optimizer"};
    const struct l3d_plan_time *x = &a->time, *y = &b->time;
    const double va[] = {x->gemm - x->recompute, x->attention, x->elementwise, x->recompute,
                         x->tp_comm, x->pp_p2p, x->bubble, x->dp_comm, x->embed_sync,
                         x->optimizer};
    const double vb[] = {y->gemm - y->recompute, y->attention, y->elementwise, y->recompute,
                         y->tp_comm, y->pp_p2p, y->bubble, y->dp_comm, y->embed_sync,
                         y->optimizer};
    int best = 0;
    for (int i = 1; i < 10; i++)
        if (vb[i] - va[i] > vb[best] - va[best]) best = i;
    snprintf(buf, len, "%.1f%% faster than the best layout of another shape (tp %d pp %d dp %d "
             "micro-batch %d v %d, ZeRO-%d, %s%s): %s %.3g s instead of %.3g s a step",
             100.0 * (b->time.step / a->time.step - 1), b->layout.tp, b->layout.pp, b->layout.dp,
             b->layout.mb, b->layout.v, b->layout.zero, rc_words(b->layout.recompute),
             b->layout.sp ? ", SP" : "", names[best], va[best], vb[best]);
}
