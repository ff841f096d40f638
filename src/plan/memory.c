/* Memory of a pipeline rank: its chunks' shards and sizes (l3d_plan_rank_chunks), their bytes in
 * llm3d's trainer or in Megatron-LM's mixed precision (l3d_plan_rank_memory), and the fullest
 * rank of a layout alone (l3d_plan_memory). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/cp.h"
#include "llm3d/dp.h"
#include "llm3d/layout.h"
#include "plan-impl.h"

/* Activation bytes a layer keeps per micro-batch in 16-bit training, Korthikanti et al. 2022,
 * Table 2 (dropout included; 34 s b h and 5 a s^2 b per layer without parallelism). Their 34 is
 * 10 s b h not split by TP (LayerNorm inputs, the attention and MLP inputs' halves kept by both,
 * dropout masks), 8 s b h of attention split by TP and 16 s b h of the 4h MLP (its two 4h-wide
 * inputs), i.e. 4 s b f for an MLP of width f. A fused (flash) attention keeps no s^2 scores, so
 * the 5 a s^2 b term goes; full recomputation keeps the layer's 2 s b h input. */
static double layer_act_16(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                           enum l3d_recompute rc, bool flash, bool moe) {
    double s = m->maxT, b = lay->micro_batch, h = m->C, a = m->NH, t = lay->tp, f = (double)m->ffn;
    double sbh = s * b * h, att = flash ? 0.0 : 5.0 * a * s * s * b;
    if (rc == L3D_RECOMPUTE_FULL) return lay->sp ? 2 * sbh / t : 2 * sbh;
    if (rc == L3D_RECOMPUTE_SELECTIVE) att = 0.0;
    /* their 8 s b h of attention is Q, K, V and the projection's input, 2 s b h each: with
     * grouped-query attention K and V are kv/h of it; SwiGLU keeps its two f-wide inputs and the
     * f-wide product (6 s b f) where GELU keeps input and output (4 s b f) */
    double hd = l3d_model_head_dim(m), q = m->NH * hd, kv = l3d_model_kv_heads(m) * hd;
    double mlp = (m->mlp == L3D_MLP_SWIGLU ? 6 : 4) * s * b * f, whole = 0.0;
    if (moe) { /* the MLP's tensors for each of the K routed and the shared experts' rows
                * (width moe.ffn), the K permuted input rows and the experts' outputs (2 s b h
                * each), and the router's fp32 probabilities (4 s b E): whole on every TP rank,
                * whose experts are whole over the same tokens */
        const struct l3d_moe_spec *mo = &m->moe;
        double Fe = (double)(mo->ffn > 0 ? mo->ffn : m->ffn), K = mo->top_k;
        whole = (m->mlp == L3D_MLP_SWIGLU ? 6 : 4) * s * b * Fe * (K + mo->shared) +
                4 * K * sbh + 4 * s * b * mo->experts;
        mlp = 0.0;
    }
    double split = (4 * q + 4 * kv) * s * b + mlp + att; /* q = kv = h: Megatron-LM's 8 s b h */
    return whole + (lay->sp ? (10 * sbh + split) / t : 10 * sbh + split / t);
}

/* The shard and sizes of chunk ch, virtual stage vs of S. */
static void chunk_size(const struct l3d_model_spec *c, const struct l3d_model_spec *m,
                       const struct l3d_layout *lay, const int *layers, const int64_t *start,
                       int S, int vs, struct l3d_plan_chunk *ch) {
    struct l3d_shard sh;
    /* sizes only: the trainer's shard when it splits this way, the even split else; the
     * shard of stage 0 with the layer range and the ends of stage vs set as
     * l3d_layout_stage_shard sets them, from the prefix sums (it sums the layers before vs,
     * which over every chunk of a layout is O(stages^2)) */
    if (l3d_layout_stage_shard(c, layers, S, 0, lay->tp, 0, lay->sp, &sh) != L3D_OK) {
        sh.head_count = m->NH / lay->tp;
        sh.ffn_count = c->ffn / lay->tp;
        sh.vocab_count = ((int64_t)c->Vp + lay->tp - 1) / lay->tp;
    }
    sh.layer_start = (int)start[vs];
    sh.layer_count = layers[vs];
    sh.has_embedding = vs == 0;
    sh.has_head = vs == S - 1;
    sh.xent_rows = lay->xent_chunk;
    /* expert parallelism: E / ep of the experts (EP rank 0's; every rank holds as many) */
    l3d_shard_set_experts(c, &sh, lay->ep, 0);
    struct l3d_tensor_info ti[L3D_NUM_TENSORS];
    ch->sh = sh;
    ch->n_gpt = l3d_gpt_plan_tensors(c, &sh, ti);
    ch->slot = ch->nonlayer = ch->n_exp = 0;
    for (int t = 0; t < L3D_NUM_TENSORS; t++) {
        if (l3d_gpt_is_layer_tensor(t)) ch->slot += ti[t].rows * ti[t].cols;
        else ch->nonlayer += ti[t].count;
        if (l3d_gpt_expert_tensor(t)) ch->n_exp += ti[t].count;
    }
    ch->n = ch->n_gpt;
    /* other blocks in Megatron-LM: its split of them, which replicates a KV head on the ranks of
     * its query heads where tp exceeds the KV heads (llm3d's trainer refuses that layout) */
    if (!l3d_model_gpt2_blocks(m)) {
        struct l3d_plan_counts pc;
        l3d_plan_param_counts(m, lay->tp, lay->ep, &pc);
        double Lm = l3d_shard_moe_layers(m, &sh), Ld = sh.layer_count - Lm;
        ch->n = (int64_t)(Ld * pc.layer + Lm * pc.moe_layer + (sh.has_embedding ? pc.embed : 0) +
                          (sh.has_head ? pc.head : 0));
        ch->n_exp = (int64_t)(Lm * pc.experts);
    }
}

/* ch's sizes from the memo's entry of its shape (layers, first, last), if there is one */
static void shape_find(const struct l3d_plan_shapes *memo, int layers, int64_t layer_start,
                       struct l3d_plan_chunk *ch) {
    ch->shape = -1;
    for (int i = 0; i < memo->n; i++)
        if (memo->e[i].layers == layers && memo->e[i].first == ch->first &&
            memo->e[i].last == ch->last) {
            ch->shape = i;
            ch->sh = memo->e[i].sh;
            ch->sh.layer_start = (int)layer_start;
            ch->n = memo->e[i].n;
            ch->n_gpt = memo->e[i].n_gpt;
            ch->n_exp = memo->e[i].n_exp;
            ch->slot = memo->e[i].slot;
            ch->nonlayer = memo->e[i].nonlayer;
        }
}

/* a new shape, ch's, into the memo while it has room */
static void shape_keep(struct l3d_plan_shapes *memo, int layers, struct l3d_plan_chunk *ch) {
    if (memo->n >= L3D_PLAN_SHAPES) return;
    int i = memo->n++;
    memo->e[i].layers = layers;
    memo->e[i].first = ch->first;
    memo->e[i].last = ch->last;
    memo->e[i].timed = false;
    memo->e[i].sh = ch->sh;
    memo->e[i].n = ch->n;
    memo->e[i].n_gpt = ch->n_gpt;
    memo->e[i].n_exp = ch->n_exp;
    memo->e[i].slot = ch->slot;
    memo->e[i].nonlayer = ch->nonlayer;
    ch->shape = i;
}

void l3d_plan_rank_chunks(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                          const int *layers, const int64_t *start, int r,
                          const struct l3d_pp_schedule *sched,
                          int64_t mm, bool fp32, struct l3d_plan_shapes *memo,
                          struct l3d_plan_chunk *out) {
    struct l3d_model_spec c = l3d_plan_model_gpt(m);
    int S = lay->pp * lay->v;
    for (int k = 0; k < lay->v; k++) {
        int vs = l3d_pp_vstage(lay->schedule, lay->pp, r, k);
        out[k].first = vs == 0;
        out[k].last = vs == S - 1;
        if (fp32 && sched) {
            out[k].slots = sched->slots[r * lay->v + k];
            out[k].wslots = sched->wslots[r * lay->v + k];
            out[k].head_once = l3d_pp_fb_slots(sched, r, k) == 1;
        } else {
            int f = (int)l3d_pp_in_flight(lay->schedule, lay->pp, r, lay->v, mm);
            out[k].slots = out[k].wslots = (f + lay->v - 1) / lay->v;
            out[k].head_once = lay->schedule == L3D_PP_ZBH1; /* 1F1B's order of F and B */
        }
        shape_find(memo, layers[vs], start[vs], &out[k]);
        if (out[k].shape >= 0) continue;
        chunk_size(&c, m, lay, layers, start, S, vs, &out[k]);
        shape_keep(memo, layers[vs], &out[k]);
    }
}

/* The linear layers' products of a chunk, (in, out, rows) each, for micro-batches of N tokens
 * a rank (after the context-parallel split): on the last stage the vocabulary-parallel head, a
 * chunk of rows at a time (l3d_gpt_xent_rows); with layers q|k|v (grouped-query: Ca + 2 kv rows
 * of weights) and the attention's output, the dense layers' MLP (SwiGLU's gate and up in one
 * product of 2 F), the MoE layers' experts (whole on every TP rank; an expert's rows at most
 * one per token of each of its ep ranks: the most one product can take) and shared experts.
 * Returns the count (at most 9). */
static int chunk_products(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                          const struct l3d_plan_chunk *ch, double prod[9][3]) {
    const struct l3d_shard *sh = &ch->sh;
    const struct l3d_moe_spec *mo = &m->moe;
    double C = (double)m->C, hd = l3d_model_head_dim(m), Ca = (double)sh->head_count * hd;
    double kv = Ca * l3d_model_kv_heads(m) / m->NH, g = m->mlp == L3D_MLP_SWIGLU ? 2 : 1;
    double F = (double)sh->ffn_count, Fe = (double)(mo->ffn > 0 ? mo->ffn : m->ffn);
    double Fs = Fe * mo->shared, Lm = (double)l3d_shard_moe_layers(m, sh);
    double N = (double)lay->micro_batch * m->maxT / lay->cp, Ne = N * (lay->ep > 1 ? lay->ep : 1);
    int n = 0;
#define PUT(i, o, r) (prod[n][0] = (i), prod[n][1] = (o), prod[n][2] = (r), n++)
    if (ch->last) PUT(C, (double)sh->vocab_count, (double)l3d_gpt_xent_rows(sh, (int64_t)N));
    if (sh->layer_count > 0) {
        PUT(C, Ca + 2 * kv, N);
        PUT(Ca, C, N);
        if (Lm < sh->layer_count) PUT(C, g * F, N), PUT(F, C, N);
        if (Lm > 0 && mo->experts > 0) PUT(C, g * Fe, Ne), PUT(Fe, C, Ne);
        if (Lm > 0 && Fs > 0) PUT(C, g * Fs, N), PUT(Fs, C, N);
    }
#undef PUT
    return n;
}

/* The fp32 operands of a chunk's largest 16-bit product where the products widen (the CPU
 * backend's matmul_forward and matmul_backward on fp32 copies, scratch SCR_MM16): forward
 * input, weight, bias and output; backward output gradient, weight, input gradient and input */
static double mixed_matmul_scratch(const struct l3d_model_spec *m,
                                   const struct l3d_layout *lay,
                                   const struct l3d_plan_chunk *ch) {
    double prod[9][3], best = 0;
    int n = chunk_products(m, lay, ch, prod);
    for (int i = 0; i < n; i++) {
        double cin = prod[i][0], oc = prod[i][1], N = prod[i][2];
        if (cin < 1 || oc < 1) continue;
        double fwd = N * cin + oc * cin + oc + N * oc, bwd = N * oc + oc * cin + 2 * N * cin;
        best = fmax(best, fmax(fwd, bwd));
    }
    return 4.0 * best;
}

/* The CPU backend's bf16 weight gradients in oneDNN's gemm kernels (src/backend/cpu.c,
 * dweight_gemm): a block of fp32 rows of the largest of a chunk's weight gradients (OC, C), kept
 * for the run (l3d_wgrad_block_rows: block bytes of rows, at least 64, at most OC). */
static double wgrad_block_scratch(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                                  const struct l3d_plan_chunk *ch, double block) {
    double prod[9][3], most = 0;
    int n = chunk_products(m, lay, ch, prod);
    for (int i = 0; i < n; i++) {
        double cin = prod[i][0], oc = prod[i][1];
        if (cin < 1 || oc < 1) continue;
        most = fmax(most, (double)l3d_wgrad_block_rows((int64_t)block, (int64_t)cin,
                                                        (int64_t)oc) * cin * 4);
    }
    return most;
}

/* The CPU backend's bf16 attention as batched oneDNN matmuls (src/backend/cpu_attnd.c, its
 * fwd_layout and bwd_layout): one scratch kept for the run, the larger of the two sets, every
 * piece rounded up to 64 bytes. G groups a call (512 / M of the B NKV, at least 1), M = rep 64
 * rows of a query block, nb key blocks of 64: keys and values (nb, G, 64, HS) in bf16, and in fp32 for the backward's dK, dV
 * sums; a query block (G, M, HS); a block of probabilities (G, M, 64); the forward's scores of a
 * whole row (nb blocks of them). */
static double attnd_scratch(double B, double T, double NH, double NKV, double HS) {
    double M = NH / NKV * 64, G = fmin(fmax(1, floor(512 / M)), B * NKV);
    double nb = ceil(T / 64), kv = nb * G * 64 * HS;
    double q = G * M * HS, blk = G * M * 64;
#define R64(x) (ceil((x) / 64) * 64)
    double fwd = 2 * R64(2 * kv) + R64(2 * q) + R64(2 * blk) + R64(4 * nb * blk) + R64(4 * q);
    double bwd = 2 * R64(2 * kv) + 2 * R64(2 * q) + 2 * R64(2 * blk) + 2 * R64(4 * blk) +
                 R64(4 * q) + R64(4 * G * M) + 2 * R64(4 * kv);
#undef R64
    return fwd > bwd ? fwd : bwd;
}

/* The 16-bit products' and attention's kept scratch: the fp32 operands of the largest 16-bit
 * product, once (freed after each product), unless the profile says the products run in 16-bit
 * kernels (gemm_native_T); and bf16 attention through oneDNN (attn_native_bf16): its scratch, for
 * the chunk with the most heads, made in the first step (beside the products' copies; not with
 * the initialisation's staging); the context-parallel ring's block kernels keep their own. */
static double products16_scratch(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                                 const struct l3d_layout *lay, const struct l3d_plan_chunk *ch) {
    double scratch16 = 0, most_block = 0;
    if (run->precision.param != L3D_F32 && !run->native16)
        for (int k = 0; k < lay->v; k++)
            scratch16 = fmax(scratch16, mixed_matmul_scratch(m, lay, &ch[k]));
    if (run->precision.param == L3D_BF16 && run->native16 && run->wgrad_block16 > 0 &&
        (double)lay->micro_batch * m->maxT / lay->cp >= L3D_WGRAD_BLOCK_MIN_ROWS)
        for (int k = 0; k < lay->v; k++)
            most_block = fmax(most_block, wgrad_block_scratch(m, lay, &ch[k], run->wgrad_block16));
    scratch16 += most_block; /* kept beside the products' copies and attention's scratch */
    if (run->attn_native16) {
        double most = 0, rep = m->NH / l3d_model_kv_heads(m);
        for (int k = 0; k < lay->v; k++)
            if (ch[k].sh.layer_count > 0)
                most = fmax(most, attnd_scratch(lay->micro_batch, (double)m->maxT,
                                                ch[k].sh.head_count, ch[k].sh.head_count / rep,
                                                l3d_model_head_dim(m)));
        scratch16 += most;
    }
    return scratch16;
}

/* llm3d's trainer: exactly what it allocates (l3d_gpt_init_dt, l3d_dp_init, l3d_adamw_init_dt); in
 * mixed precision 16-bit parameters and activations, fp32 gradients, and the fp32 master weights
 * with the moments. Returns the bytes of its transients (not at once: the larger). */
static double trainer_memory(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                             const struct l3d_layout *lay, const struct l3d_plan_chunk *ch,
                             int64_t mm, struct l3d_plan_mem *mem) {
    struct l3d_model_spec c = l3d_plan_model_gpt(m);
    double f32 = l3d_plan_bytes(L3D_F32), w = l3d_plan_bytes(run->precision.param);
    double scratch16 = 0, staging = 0, piece_host = 0, reqs = 0;
    const enum l3d_dtype dt = run->precision.param;
    const double k_opt = run->precision.param == L3D_F32 ? 2 : 3;
    const int64_t g = l3d_plan_zero_group(lay);
    for (int k = 0; k < lay->v; k++) {
        int64_t n = ch[k].n_gpt;
        int64_t shard = ((n + g - 1) / g + 15) / 16 * 16;
        int64_t own = lay->zero > 0 ? (n < shard ? n : shard) : n;
        if (lay->zero == 3) { /* the shard, the non-layer and prefetch + 1 layer gather buffers */
            double bufs = lay->zero3_prefetch > 0 ? lay->zero3_prefetch + 1 : 1;
            mem->params += w * (own + 1) + (w * (double)ch[k].nonlayer + 64) +
                           bufs * (w * (double)ch[k].slot + 64);
            /* each buffer's receive and send requests, a tensor from each other rank
             * (src/parallel/zero3.c, gbuf_reqs) */
            reqs += (bufs + 1) * 2.0 * L3D_NUM_TENSORS * (g > 1 ? g - 1 : 1) *
                    (double)sizeof(l3d_req);
        } else {
            mem->params += w * n;
        }
        if (lay->zero >= 2) {
            double slot = (double)ch[k].slot, nonlayer = (double)ch[k].nonlayer;
            mem->grads += (f32 * nonlayer + 64) + 2 * (f32 * slot + 64) + f32 * (own + 1);
        } else {
            mem->grads += f32 * n;
        }
        mem->optimizer += k_opt * f32 * own; /* AdamW m and v (and the master weights) */
        struct l3d_shard sh = ch[k].sh; /* with the trainer's fp32 TP sums (src/model/tpsum.c) */
        sh.tp_reduce_f32 = run->precision.tp_reduce_fp32 && lay->tp > 1;
        mem->activations += (double)l3d_gpt_act_bytes_dt(&c, &sh, lay->micro_batch, m->maxT,
                                                         ch[k].slots, lay->recompute,
                                                         run->flash, dt);
        if (l3d_pp_split(lay->schedule) && lay->pp > 1) { /* W's inputs, B to W */
            mem->activations += (double)l3d_gpt_wstash_bytes(&c, &ch[k].sh, lay->micro_batch,
                                                             m->maxT, ch[k].wslots,
                                                             lay->recompute, lay->zero >= 2, dt);
            if (ch[k].head_once) /* l3d_gpt_split_init: the head's activations once */
                mem->activations -= (double)(ch[k].slots - 1) *
                                    (double)l3d_gpt_head_act_bytes(&c, &ch[k].sh,
                                                                   lay->micro_batch, m->maxT, dt);
        }
        /* ZeRO-2 in mixed precision moves the chunk's fp32 parameters a piece at a time at
         * initialisation and for each save or load, ZeRO-3 when it resumes or saves (run->files;
         * from the seed each rank fills its own range): a device piece per chunk and, with files,
         * a host one (l3d_dp_fp32_stream_begin; the checkpoint's staging); allocated then freed,
         * at the peak (they replace a whole fp32 copy: f32 * n). ZeRO-2 over a group of one
         * (ep ranks each alone with their experts) keeps the whole range: no pieces */
        if ((lay->zero == 2 && dt != L3D_F32 && g > 1) || (lay->zero == 3 && run->files)) {
            double piece = f32 * (double)l3d_dp_fp32_piece(n, run->piece_bytes);
            staging += piece;
            if (run->files && piece > piece_host) piece_host = piece;
        }
    }
    scratch16 = products16_scratch(m, run, lay, ch);
    /* the 16-bit DP reduction's staging (l3d_dp_reduce_in): two layers' gradients and the
     * non-layer tensors', in 2 bytes, per chunk; none in a group of one (with expert parallelism
     * under ZeRO the group is the dp / ep ranks holding the same experts) */
    if ((run->precision.reduce != L3D_F32) && g > 1)
        for (int k = 0; k < lay->v; k++)
            mem->other += 2.0 * (2.0 * (double)ch[k].slot + (double)ch[k].nonlayer) + 3 * 64;
    /* the token ids (inputs and targets) of a step's micro-batches, or of the validation
     * batches (--val-batches, 8 by default) when more */
    mem->other +=
        2.0 * l3d_plan_bytes(L3D_I32) * lay->micro_batch * m->maxT * (double)(mm > 8 ? mm : 8);
    /* the pipeline executor's received stage-output gradient (src/parallel/pipe_exec.c), the
     * rows of this rank under sequence parallelism; once small beside the s^2 attention
     * probabilities, now 1% of the small layouts tests/cli/plan.sh runs */
    mem->other += w * lay->micro_batch * m->maxT * m->C / (lay->sp ? lay->tp : 1);
    mem->other += reqs;
    staging += piece_host;
    /* the initialisation's host block (l3d_gpt_init_weights_range), at the peak where the
     * weights are drawn after everything else is allocated: ZeRO-3's range, and the fp32 view of
     * mixed precision (fp32 ZeRO-0 to 2 draw theirs before the activations) */
    double init = lay->zero == 3 || dt != L3D_F32 ? (double)L3D_GPT_INIT_BLOCK_BYTES : 0;
    double most = staging > scratch16 ? staging : scratch16;
    return most > init ? most : init;
}

/* Megatron-LM's mixed precision, ZeRO paper sec. 3.1 (K = 12): 2-byte weights and gradients, fp32
 * master weights, Adam m and v: 12 bytes, divided by d from ZeRO-1, gradients from ZeRO-2; the
 * activations of Korthikanti et al. 2022. */
static void megatron_memory(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                            const struct l3d_layout *lay, const struct l3d_plan_chunk *ch,
                            int r, int64_t mm, struct l3d_plan_mem *mem) {
    struct l3d_model_spec c = l3d_plan_model_gpt(m);
    double f32 = l3d_plan_bytes(L3D_F32);
    double n = 0, n_exp = 0, acts = 0, moe_layers = 0;
    int f = (int)l3d_pp_in_flight(lay->schedule, lay->pp, r, lay->v, mm);
    double per_chunk_layers = 0;
    for (int k = 0; k < lay->v; k++) {
        n += (double)ch[k].n;
        n_exp += (double)ch[k].n_exp;
        per_chunk_layers += ch[k].sh.layer_count;
        moe_layers += l3d_shard_moe_layers(m, &ch[k].sh);
    }
    per_chunk_layers /= lay->v;
    /* the ZeRO paper's 2 + 2 + 12, sharded by the stage: Megatron-LM's gradients are of the
     * parameters' type */
    struct l3d_precision mp = run->precision;
    mp.grad = mp.param;
    struct l3d_param_bytes pb, pe; /* the experts' state sharded over the dp / ep ranks
                                    * holding them (Megatron-Core's expert data parallelism) */
    l3d_param_bytes(&mp, lay->zero, lay->dp, &pb);
    l3d_param_bytes(&mp, lay->zero, lay->dp / (lay->ep > 1 ? lay->ep : 1), &pe);
    mem->params = pb.params * (n - n_exp) + pe.params * n_exp;
    mem->grads = pb.grads * (n - n_exp) + pe.grads * n_exp;
    mem->optimizer = pb.optimizer * (n - n_exp) + pe.optimizer * n_exp;
    /* the chunks' MoE layers keep the experts' tensors instead of the MLP's */
    double moe_frac = per_chunk_layers > 0 ? moe_layers / lay->v / per_chunk_layers : 0.0;
    double per_layer = (1 - moe_frac) * layer_act_16(m, lay, lay->recompute, run->flash, false) +
                       moe_frac * layer_act_16(m, lay, lay->recompute, run->flash, true);
    acts = f * per_chunk_layers * per_layer;
    /* the layer being recomputed in backward holds its full set once */
    if (lay->recompute != L3D_RECOMPUTE_NONE)
        acts += layer_act_16(m, lay, L3D_RECOMPUTE_NONE, run->flash, moe_layers > 0);
    /* Korthikanti et al. 2022, sec. 4.3, beyond the layers: the embedding's dropout mask,
     * s b h bytes a micro-batch (one byte an element, as the 34 of Table 2 counts masks),
     * split along the sequence under SP; the first chunk keeps it for each of its micro-batches
     * in flight: p of them under 1F1B, p (1 + (p - 1)/(p v)) with interleaving (sec. 4.2.3),
     * i.e. this chunk's own share, not every chunk's of the rank. Its output is the first
     * layer's input, counted there. */
    double s = m->maxT, b = lay->micro_batch, h = m->C, t = lay->tp, spd = lay->sp ? t : 1.0;
    if (ch[0].first) acts += ch[0].slots * s * b * h / spd;
    /* the output layer, sec. 4.3: the final LayerNorm's input 2 s b h and the projection's
     * input 2 s b h (sequence-split under SP), and the fp32 logits the cross-entropy keeps,
     * 4 s b V / t: 4 s b h / t (1 + V/h) with SP, for each micro-batch the last chunk keeps
     * (1 under 1F1B, where the last stage's backward follows its forward) */
    if (ch[lay->v - 1].last)
        acts += ch[lay->v - 1].slots * (4 * s * b * h / spd + f32 * s * b * c.Vp / t);
    mem->activations = acts;
    mem->other = 2.0 * (double)lay->bucket_bytes; /* DP buckets: one reducing, one filling */
}

void l3d_plan_rank_memory(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                          const struct l3d_layout *lay, const struct l3d_plan_chunk *ch,
                          int r, int64_t mm, struct l3d_plan_mem *mem) {
    memset(mem, 0, sizeof *mem);
    double transient = 0;
    if (l3d_plan_trainer(run)) transient = trainer_memory(m, run, lay, ch, mm, mem);
    else megatron_memory(m, run, lay, ch, r, mm, mem);
    /* transients, not at once: the larger adds to the peak */
    mem->other += transient;
    mem->total = mem->params + mem->grads + mem->optimizer + mem->activations + mem->other;
    mem->stage = r;
    mem->in_flight = (int)l3d_pp_in_flight(lay->schedule, lay->pp, r, lay->v, mm);
}

void l3d_plan_cp_ring_memory(const struct l3d_model_spec *mc, const struct l3d_plan_run *run,
                             const struct l3d_layout *lay, const struct l3d_plan_chunk *ch,
                             int cp, struct l3d_plan_mem *mem) {
    for (int k = 0; k < lay->v && cp > 1; k++) { /* each chunk's ring (l3d_cp_attach) */
        int64_t heads = ch[k].sh.head_count, HS = l3d_model_head_dim(mc);
        double ring = (double)l3d_cp_bytes(lay->micro_batch, mc->maxT, heads, heads, HS,
                                           run->precision.param, run->precision.cp_fp32);
        mem->other += ring;
        mem->total += ring;
    }
}

l3d_status l3d_plan_memory(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                           const struct l3d_layout *lay_in, struct l3d_plan_mem *worst) {
    memset(worst, 0, sizeof *worst);
    struct l3d_layout lay;
    struct l3d_model_spec ms;
    l3d_plan_view(m, lay_in, &ms, &lay);
    l3d_status st = l3d_plan_check(m, NULL, run, &lay);
    if (st != L3D_OK) return st;
    int p = lay.pp, v = lay.v, S = p * v;
    int64_t mm = lay.global_batch / ((int64_t)lay.micro_batch * lay.dp);
    /* context parallelism: a rank holds T / cp rows of each sequence (activations and tokens
     * divided by cp), the weights replicated over the ring, ZeRO sharded over dp x cp (the
     * trainer's DP group); the ring's buffers below. The stages are balanced at the full T. */
    struct l3d_model_spec mc;
    struct l3d_layout checked = lay;
    int cp = l3d_plan_cp_local(&ms, &checked, &mc, &lay);
    /* under cp the ring's block kernels (cpu.c's flash kernels, their scratch the ring's) replace
     * the whole sequence's attention: no oneDNN attention scratch (lay is the local, cp 1, one) */
    struct l3d_plan_run rl = *run;
    if (cp > 1) rl.attn_native16 = false;
    int *layers = malloc(sizeof(int) * (size_t)S);
    int64_t *start = malloc(sizeof(int64_t) * (size_t)(S + 1));
    struct l3d_plan_chunk *ch = malloc(sizeof(struct l3d_plan_chunk) * (size_t)v);
    if (!layers || !start || !ch)
        st = l3d_error(L3D_ERR_OOM, "out of memory planning %d stages", S);
    if (st == L3D_OK) st = l3d_plan_stage_layers(&ms, run, &lay, S, layers);
    if (st == L3D_OK) {
        start[0] = 0;
        for (int i = 0; i < S; i++) start[i + 1] = start[i] + layers[i];
    }
    struct l3d_plan_shapes memo = {0};
    struct l3d_pp_schedule sched = {0};
    bool have_sched = false, fp32 = l3d_plan_trainer(run);
    if (st == L3D_OK && fp32 && (int64_t)S * mm <= (1 << 20)) {
        st = l3d_pp_schedule_build(&sched, p > 1 ? lay.schedule : L3D_PP_1F1B, p, v, (int)mm);
        have_sched = st == L3D_OK;
    }
    /* the tensors of the run's model: wpe has the model's context rows when more than the
     * sequence (the trainer's --context; the activations stay at mc's maxT) */
    struct l3d_model_spec mt = mc;
    if (m->maxT > mt.maxT) mt.maxT = m->maxT;
    for (int r = 0; st == L3D_OK && r < p; r++) {
        struct l3d_plan_mem mem;
        l3d_plan_rank_chunks(&mt, &lay, layers, start, r, have_sched ? &sched : NULL, mm,
                             fp32, &memo, ch);
        l3d_plan_rank_memory(&mc, &rl, &lay, ch, r, mm, &mem);
        l3d_plan_cp_ring_memory(&mc, run, &lay, ch, cp, &mem);
        if (mem.total > worst->total) *worst = mem;
    }
    if (have_sched) l3d_pp_schedule_free(&sched);
    free(layers);
    free(start);
    free(ch);
    return st;
}
