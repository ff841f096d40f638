/*
 * Mixture-of-experts layers (include/llm3d/model.h, struct l3d_moe_spec): the spec's rules, the
 * parameter counts, and the block's forward and backward over a shard's MoE layers.
 *
 * Data flow of one layer (docs/DESIGN.md "Mixture of experts"): the router (l3d_be_moe_route)
 * gives each token its K experts and weights and every assignment its row in expert order; the
 * token rows are gathered in that order (l3d_be_moe_permute), each expert's rows go through its
 * MLP by the backend's matmul, one product per expert and projection, and the rows come back to
 * their tokens weighted (l3d_be_moe_combine), onto the shared MLP's output. The buffers in expert
 * order hold N K rows, the most a micro-batch can route: dropless, any expert may take up to N of
 * them (all the tokens, each picking an expert once) and together they take N K; a capacity only
 * lowers the rows used. Sizing each expert's rows for its worst case would take E N rows.
 */
#include <math.h>
#include <string.h>

#include "moe.h"

/* ---- the spec ---------------------------------------------------------------------------- */

bool l3d_model_moe_layer(const struct l3d_model_spec *m, int l) {
    return m->moe.experts > 0 && l >= m->moe.dense_layers;
}

int l3d_shard_moe_layers(const struct l3d_model_spec *cfg, const struct l3d_shard *sh) {
    int n = 0;
    for (int l = sh->layer_start; l < sh->layer_start + sh->layer_count; l++)
        n += l3d_model_moe_layer(cfg, l);
    return n;
}

void l3d_shard_set_experts(const struct l3d_model_spec *cfg, struct l3d_shard *sh, int ep,
                           int ep_rank) {
    if (cfg->moe.experts == 0) return;
    if (ep < 1) ep = 1; /* a layout left unresolved */
    L3D_ASSERT(cfg->moe.experts % ep == 0 && ep_rank >= 0 && ep_rank < ep);
    sh->expert_count = cfg->moe.experts / ep;
    sh->expert_start = ep_rank * sh->expert_count;
}

static bool finite_nonneg(double x) { return isfinite(x) && x >= 0.0; }

l3d_status l3d_moe_spec_check(const struct l3d_model_spec *m) {
    const struct l3d_moe_spec *e = &m->moe;
    if (e->experts < 0)
        return l3d_error(L3D_ERR_ARG, "--moe-experts %d: give 0 (a dense model) or more experts",
                         e->experts);
    if (e->experts == 0 && e->force_balance)
        return l3d_error(L3D_ERR_ARG, "--moe-force-balance on a dense model (--moe-experts 0): "
                         "it forces a router's selection and a dense model has none; drop "
                         "the flag or give --moe-experts E");
    if (e->experts == 0) {
        if (e->top_k || e->ffn || e->shared || e->dense_layers || e->aux_coef != 0.0 ||
            e->z_coef != 0.0 || e->capacity_factor != 0.0)
            return l3d_error(L3D_ERR_ARG, "--moe-top-k %d (or another --moe-* flag) without "
                             "--moe-experts: a dense model has no router; give --moe-experts E "
                             "or drop the --moe-* flags", e->top_k);
        return L3D_OK;
    }
    if (e->top_k < 1 || e->top_k > e->experts)
        return l3d_error(L3D_ERR_ARG, "--moe-top-k %d with --moe-experts %d: each token picks "
                         "1 to %d experts; give a top-k in that range", e->top_k, e->experts,
                         e->experts);
    if (e->ffn < 0 || e->shared < 0 || e->dense_layers < 0)
        return l3d_error(L3D_ERR_ARG, "--moe-ffn %lld, --moe-shared-experts %d, "
                         "--moe-dense-layers %d: none may be negative (--moe-ffn 0: the model's "
                         "MLP width)", (long long)e->ffn, e->shared, e->dense_layers);
    if (e->dense_layers > m->L)
        return l3d_error(L3D_ERR_ARG, "--moe-dense-layers %d exceeds the model's %d layers: give "
                         "at most %d", e->dense_layers, m->L, m->L);
    if (!finite_nonneg(e->aux_coef) || !finite_nonneg(e->z_coef))
        return l3d_error(L3D_ERR_ARG, "--moe-aux-loss-coef %g, --moe-z-loss-coef %g: give "
                         "finite coefficients >= 0 (0: no such loss)", e->aux_coef, e->z_coef);
    if (!finite_nonneg(e->capacity_factor) || e->capacity_factor > 1e6)
        return l3d_error(L3D_ERR_ARG, "--moe-capacity-factor %g: give 0 (dropless) or a finite "
                         "factor > 0, e.g. 1.25", e->capacity_factor);
    return L3D_OK;
}

/* One expert MLP's parameters (width F; SwiGLU: gate, up and down; biases as the model). */
static double expert_params(const struct l3d_model_spec *m, double F) {
    double C = m->C, bias = m->no_bias ? 0.0 : 1.0;
    return m->mlp == L3D_MLP_SWIGLU ? 3 * C * F + bias * (2 * F + C) : 2 * C * F + bias * (F + C);
}

/* The expert width: moe.ffn, or the model's MLP width. */
static double moe_width(const struct l3d_model_spec *m) {
    return m->moe.ffn > 0 ? (double)m->moe.ffn : m->ffn > 0 ? (double)m->ffn : 4.0 * m->C;
}

double l3d_moe_layer_param_delta(const struct l3d_model_spec *m, int experts) {
    const struct l3d_moe_spec *e = &m->moe;
    if (e->experts == 0) return 0.0;
    double F = moe_width(m), dense = expert_params(m, m->ffn > 0 ? (double)m->ffn : 4.0 * m->C);
    double shared = e->shared > 0 ? expert_params(m, e->shared * F) : 0.0;
    double per = (double)e->experts * m->C + experts * expert_params(m, F) + shared;
    return (m->L - e->dense_layers) * (per - dense);
}

double l3d_model_active_param_count(const struct l3d_model_spec *m) {
    return l3d_model_param_count(m) + l3d_moe_layer_param_delta(m, m->moe.top_k) -
           l3d_moe_layer_param_delta(m, m->moe.experts);
}

/* ---- activations ------------------------------------------------------------------------- */

/* A MoE layer's rows of type dt (device memory), or their gradients: x, y (NK,C) this rank's
 * tokens' rows in expert order (the gathered input, the experts' output); xe, h, ha, ye (Re,C),
 * (Re,Fm), (Re,F), (Re,C) the rows this rank's experts take (the input, the first product, its
 * activation, the second product): x and y themselves on one rank (Re = NK), the rows every EP
 * rank dispatched here otherwise; sh, sha (N,S Fm), (N,S F) the shared MLP's. */
struct moe_rows {
    void *x, *y, *xe, *h, *ha, *ye, *sh, *sha;
};

/* One MoE layer's saved activations (device memory; fp32 router, int32 routing, rows of dt). */
struct moe_acts {
    float *probs, *lse, *wts, *stats;  /* (N,E), (N), (N,K), (2E+2): l3d_be_moe_route's */
    int32_t *idx, *pos, *offsets;      /* (N,K), (N,K), (E+1) */
    struct moe_rows r;
    int32_t *hoff;                     /* host copy of offsets */
    /* host: the products' row segments of this rank's experts (3 E: first row, rows, local
     * expert), and with expert parallelism the exchange's rows per EP rank (4 ep: sent, their
     * offsets, received, their offsets) */
    int64_t *seg, *a2a;
    int nseg;
};

struct l3d_moe_state {
    int Lm;                 /* MoE layers of the shard */
    struct moe_acts *set;   /* Lm of them, or one (full recomputation) */
    int nsets;
    void *base;
    size_t bytes;
    /* one layer's backward scratch */
    struct moe_rows d;
    float *dwts, *dlogits;
    int32_t *work;          /* the router's counting sort's counts, running and kept (3E, int32) */
    int32_t *forced, *hforced; /* --moe-force-balance: the assignments (N,K), device and host */
    double *acc;            /* l3d_gpt_moe_stats_len doubles (host) */
    int64_t *xcnt;          /* expert parallelism: 4 ep counts and displacements (host) */
    float *hstats;          /* host copy of a layer's stats */
    float *lcnt;            /* split tokens (hooks.tok_split > 1): this rank's counts (E, host) */
    int32_t *ring_idx, *ring_fill; /* a capacity on a ring (ring_fills): host buffers at Bmax, */
    float *ring_cnt;               /* made at its first use (the ring is attached after init) */
};

/* The sizes of the block: experts (all, the shard's, its first), choices, widths (expert, its
 * first product's rows, shared), EP ranks. */
struct moe_dims {
    int64_t E, El, e0, K, F, Fm, SF, SFm, ep;
};

static struct moe_dims moe_dims(const struct l3d_model_spec *cfg, const struct l3d_shard *sh) {
    struct moe_dims d = {.E = cfg->moe.experts, .El = sh->expert_count, .e0 = sh->expert_start,
                         .K = cfg->moe.top_k, .F = (int64_t)moe_width(cfg)};
    int64_t mul = cfg->mlp == L3D_MLP_SWIGLU ? 2 : 1;
    d.Fm = mul * d.F;
    d.SF = cfg->moe.shared * d.F;
    d.SFm = mul * d.SF;
    d.ep = d.El > 0 ? d.E / d.El : 1;
    return d;
}

/* The most rows this rank's experts take from a micro-batch of N tokens on each EP rank: N K on
 * one rank; with expert parallelism each of the ep ranks' tokens sends at most one row to each
 * of its K experts, so at most min(K, El) here. */
static int64_t expert_rows(const struct moe_dims *d, int64_t N) {
    return d->ep == 1 ? N * d->K : d->ep * N * (d->K < d->El ? d->K : d->El);
}

/* A set of rows from offset off of base (NULL: only counted); the offset after them. On one
 * rank xe and ye are x and y. */
static int64_t point_rows(struct moe_rows *r, const struct moe_dims *d, int64_t C, int64_t N,
                          int64_t es, char *base, int64_t off) {
    void **f[8] = {&r->x, &r->y, &r->xe, &r->h, &r->ha, &r->ye, &r->sh, &r->sha};
    const int64_t R = N * d->K, Re = expert_rows(d, N), own = d->ep > 1 ? Re * C : 0;
    const int64_t n[8] = {R * C, R * C, own, Re * d->Fm, Re * d->F, own, N * d->SFm, N * d->SF};
    for (int i = 0; i < 8; i++) {
        if (base) *f[i] = base + off;
        off += (n[i] * es + 63) / 64 * 64;
    }
    if (base && d->ep == 1) r->xe = r->x, r->ye = r->y;
    return off;
}

#define TAKE(ptr, n, esz)                                           \
    do {                                                            \
        if (base) (ptr) = (void *)(base + off);                     \
        off += ((int64_t)(n) * (esz) + 63) / 64 * 64;               \
    } while (0)

/* One saved set of N tokens at offset off of base (NULL: only counted): the routing, then the
 * rows. The offset after it. */
static int64_t point_set(struct moe_acts *a, const struct moe_dims *d, int64_t C, int64_t N,
                         int64_t es, char *base, int64_t off) {
    int64_t R = N * d->K;
    TAKE(a->probs, N * d->E, 4);
    TAKE(a->lse, N, 4);
    TAKE(a->wts, R, 4);
    TAKE(a->stats, 2 * d->E + 2, 4);
    TAKE(a->idx, R, 4);
    TAKE(a->pos, R, 4);
    TAKE(a->offsets, d->E + 1, 4);
    return point_rows(&a->r, d, C, N, es, base, off);
}

/* Walks the buffers (base NULL: only counts), as gpt.c's point_acts does: the sets, then the
 * backward scratch. Returns the bytes. */
static int64_t point_moe(struct l3d_moe_state *s, const struct l3d_model_spec *cfg,
                         const struct l3d_shard *sh, int64_t N, int nsets, int64_t es, char *base) {
    struct moe_dims d = moe_dims(cfg, sh);
    int64_t C = cfg->C, R = N * d.K, off = 0;
    for (int i = 0; i < nsets; i++) {
        struct moe_acts tmp;
        off = point_set(base ? &s->set[i] : &tmp, &d, C, N, es, base, off);
    }
    struct l3d_moe_state tmp, *b = base ? s : &tmp;
    off = point_rows(&b->d, &d, C, N, es, base, off);
    TAKE(b->dwts, R, 4);
    TAKE(b->dlogits, N * d.E, 4);
    TAKE(b->work, 3 * d.E, 4);
    TAKE(b->forced, cfg->moe.force_balance ? R : 0, 4);
    return off;
}

/* Generation's workspace (l3d_moe_infer_init): one set of N tokens and the sort's counts. */
static int64_t point_infer(struct moe_acts *a, int32_t **work, int32_t **forced,
                           const struct l3d_model_spec *cfg, const struct l3d_shard *sh,
                           int64_t N, int64_t es, char *base) {
    struct moe_dims d = moe_dims(cfg, sh);
    int64_t off = point_set(a, &d, cfg->C, N, es, base, 0);
    TAKE(*work, 3 * d.E, 4);
    TAKE(*forced, cfg->moe.force_balance ? N * d.K : 0, 4);
    return off;
}
#undef TAKE

/* Saved sets: one per MoE layer and activation slot (a pipeline stage keeps act_slots
 * micro-batches between their forward and backward), or one under full recomputation (backward
 * re-runs the block, routing included, just before it needs them). */
static int moe_sets(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int act_slots,
                    enum l3d_recompute recompute) {
    int Lm = l3d_shard_moe_layers(cfg, sh);
    return Lm == 0 ? 0 : recompute == L3D_RECOMPUTE_FULL ? 1 : Lm * act_slots;
}

size_t l3d_moe_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                         int T, int act_slots, enum l3d_recompute recompute, enum l3d_dtype dt) {
    int n = moe_sets(cfg, sh, act_slots, recompute);
    if (n == 0) return 0;
    return (size_t)point_moe(NULL, cfg, sh, (int64_t)B * T, n, (int64_t)l3d_dtype_size(dt),
                             NULL);
}

/* The shard's own statistics: its MoE layers' counts, then the tail. */
static int64_t shard_stats_len(const struct l3d_gpt *m) {
    int Lm = l3d_shard_moe_layers(&m->cfg, &m->shard);
    return Lm == 0 ? 0 : (int64_t)Lm * m->cfg.moe.experts + 4;
}

l3d_status l3d_moe_init(struct l3d_gpt *m) {
    int Lm = l3d_shard_moe_layers(&m->cfg, &m->shard);
    if (Lm == 0) return L3D_OK;
    if (!l3d_be_has_moe(m->be))
        return l3d_error(L3D_ERR_ARG, "backend %s has no MoE kernels (--moe-experts %d): "
                         "the cpu, check and CUDA backends have them; use L3D_BACKEND=cpu", l3d_backend_name(m->be), m->cfg.moe.experts);
    const struct l3d_shard *sh = &m->shard;
    struct l3d_moe_state *s = l3d_calloc(sizeof *s, "MoE state");
    m->moe = s;
    s->Lm = Lm;
    s->nsets = moe_sets(&m->cfg, &m->shard, m->act_slots, m->recompute);
    s->set = l3d_calloc(sizeof *s->set * (size_t)s->nsets, "MoE activation table");
    int64_t N = (int64_t)m->Bmax * m->Tmax, E = m->cfg.moe.experts;
    s->bytes = (size_t)point_moe(s, &m->cfg, sh, N, s->nsets, (int64_t)m->es, NULL);
    s->base = l3d_be_alloc(m->be, s->bytes, "MoE activations");
    if (!s->base)
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB for the MoE layers' activations "
                         "(B x T = %lld tokens, %d layers): lower --batch or --seq-len",
                         (double)s->bytes / 1073741824.0, (long long)N, Lm);
    l3d_be_memset(m->be, s->base, 0, s->bytes);
    point_moe(s, &m->cfg, sh, N, s->nsets, (int64_t)m->es, s->base);
    int64_t ep = moe_dims(&m->cfg, sh).ep;
    for (int i = 0; i < s->nsets; i++) {
        s->set[i].hoff = l3d_calloc((size_t)(E + 1) * sizeof(int32_t), "MoE offsets");
        s->set[i].seg = l3d_calloc((size_t)(3 * E) * sizeof(int64_t), "MoE segments");
        s->set[i].a2a = l3d_calloc((size_t)(4 * ep + 2 * E) * sizeof(int64_t), "MoE exchange");
    }
    s->acc = l3d_calloc((size_t)shard_stats_len(m) * sizeof(double), "MoE statistics");
    s->xcnt = l3d_calloc((size_t)(4 * ep) * sizeof(int64_t), "MoE exchange");
    s->hstats = l3d_calloc((size_t)(2 * E + 2) * sizeof(float), "MoE statistics");
    s->lcnt = l3d_calloc((size_t)E * sizeof(float), "MoE statistics");
    if (m->cfg.moe.force_balance)
        s->hforced = l3d_alloc((size_t)(N * m->cfg.moe.top_k) * sizeof(int32_t),
                               "MoE forced routing");
    return L3D_OK;
}

void l3d_moe_free(struct l3d_gpt *m) {
    struct l3d_moe_state *s = m->moe;
    if (!s) return;
    l3d_be_free(m->be, s->base);
    for (int i = 0; s->set && i < s->nsets; i++) {
        l3d_free(s->set[i].hoff);
        l3d_free(s->set[i].seg);
        l3d_free(s->set[i].a2a);
    }
    l3d_free(s->set);
    l3d_free(s->acc);
    l3d_free(s->xcnt);
    l3d_free(s->hstats);
    l3d_free(s->lcnt);
    l3d_free(s->hforced);
    l3d_free(s->ring_idx), l3d_free(s->ring_fill), l3d_free(s->ring_cnt);
    l3d_free(s);
    m->moe = NULL;
}

/* ---- statistics -------------------------------------------------------------------------- */

int64_t l3d_model_moe_stats_len(const struct l3d_model_spec *cfg) {
    int Lm = cfg->moe.experts > 0 ? cfg->L - cfg->moe.dense_layers : 0;
    return Lm == 0 ? 0 : (int64_t)Lm * cfg->moe.experts + 4;
}

void l3d_gpt_moe_stats_take(struct l3d_gpt *m, double *out) {
    int64_t n = shard_stats_len(m), E = m->cfg.moe.experts, Lm = n ? (n - 4) / E : 0;
    if (n == 0) return;
    const double *acc = m->moe->acc, *tail = acc + Lm * E;
    /* the shard's first MoE layer's index among the model's */
    int first = m->shard.layer_start - m->cfg.moe.dense_layers;
    if (first < 0) first = 0;
    double *all = out + (int64_t)first * E, *otail = out + (l3d_model_moe_stats_len(&m->cfg) - 4);
    for (int64_t i = 0; i < Lm * E; i++) all[i] += acc[i];
    for (int k = 0; k < 3; k++) otail[k] += tail[k];
    if (first == 0) otail[3] += tail[3]; /* the forwards, counted by the model's first MoE layer */
    memset(m->moe->acc, 0, (size_t)n * sizeof(double));
}

void l3d_moe_summarize(const double *stats, int layers, int experts, double *load,
                       struct l3d_moe_summary *out) {
    const double *tail = stats + (int64_t)layers * experts;
    double f = tail[3] > 0 ? tail[3] * layers : 1.0;
    *out = (struct l3d_moe_summary){.aux = tail[0] / f, .z = tail[1] / f, .dropped = tail[2]};
    for (int j = 0; j < layers; j++) {
        double mx = 0.0, sum = 0.0;
        for (int e = 0; e < experts; e++) {
            double c = stats[(int64_t)j * experts + e];
            sum += c;
            if (c > mx) mx = c;
        }
        double r = sum > 0 ? mx / (sum / experts) : 0.0;
        if (load) load[j] = r;
        if (r > out->load_max) out->load_max = r;
    }
}

/* The tokens of the micro-batch the routing's statistics count: N here, times the ranks that
 * split them (hooks.tok_split: the context-parallel ring). */
static int64_t split_tokens(const struct l3d_gpt *m, int64_t N) {
    return m->hooks.tok_split > 1 ? N * m->hooks.tok_split : N;
}

/* Split tokens: the counts per expert (a->stats' first E, device) summed over the ranks that
 * split the micro-batch, in place, where the router's backward reads them for Switch's f_i; this
 * rank's own kept in s->lcnt for the load report. Collective over those ranks, each forward
 * (a recomputation's too). */
static void share_counts(struct l3d_gpt *m, struct moe_acts *a) {
    struct l3d_moe_state *s = m->moe;
    int64_t E = m->cfg.moe.experts;
    if (m->hooks.tok_split <= 1) return;
    l3d_be_copy_d2h(m->be, s->lcnt, a->stats, (size_t)E * sizeof(float));
    memcpy(s->hstats, s->lcnt, (size_t)E * sizeof(float));
    m->hooks.tok_sum(m->hooks.tok_ctx, s->hstats, E); /* integers below 2^24: exact in fp32 */
    l3d_be_copy_h2d(m->be, a->stats, s->hstats, (size_t)E * sizeof(float));
}

/* A layer's stats (device) into the accumulators: its experts' assignments, its Switch loss
 * E sum_i f_i P_i, its z-loss and its drops. Split tokens: f_i is the micro-batch's (the shared
 * counts), P_i and the z-loss this rank's sums over the micro-batch's tokens, the assignments its
 * own, and the micro-batch counted 1 / tok_split here, so that the trainer's sum over the ranks
 * gives each once. */
static void count_stats(struct l3d_gpt *m, int j, const struct moe_acts *a, int64_t N) {
    struct l3d_moe_state *s = m->moe;
    int64_t E = m->cfg.moe.experts, K = m->cfg.moe.top_k, Ng = split_tokens(m, N);
    l3d_be_copy_d2h(m->be, s->hstats, a->stats, (size_t)(2 * E + 2) * sizeof(float));
    const float *own = m->hooks.tok_split > 1 ? s->lcnt : s->hstats;
    double *tail = s->acc + (int64_t)s->Lm * E, aux = 0.0;
    for (int64_t e = 0; e < E; e++) {
        s->acc[j * E + e] += own[e];
        aux += (s->hstats[e] / ((double)Ng * K)) * (s->hstats[E + e] / (double)Ng);
    }
    tail[0] += (double)E * aux;
    tail[1] += s->hstats[2 * E] / (double)Ng;
    tail[2] += s->hstats[2 * E + 1];
    if (j == 0) tail[3] += 1.0 / (double)(m->hooks.tok_split > 1 ? m->hooks.tok_split : 1);
}

/* ---- forward and backward ---------------------------------------------------------------- */

static inline void *elp(const void *p, int64_t i, size_t es) {
    return p ? (char *)p + i * (int64_t)es : NULL;
}

/* The saved set of local layer l, and its index among the shard's MoE layers. */
static struct moe_acts *layer_set(struct l3d_gpt *m, int l, int *j) {
    *j = (int)l3d_gpt_tensor_layer(&m->cfg, &m->shard, L3D_T_ROUTER, l);
    L3D_ASSERT(*j >= 0 && m->slot >= 0 && m->slot < m->act_slots);
    const struct l3d_moe_state *s = m->moe;
    return &s->set[s->nsets == 1 ? 0 : m->slot * s->Lm + *j];
}

static void *param(const struct l3d_gpt *m, int t, int l) {
    return l3d_gpt_tensor_used(&m->cfg, t) ? l3d_gpt_param_ptr(m, t, l) : NULL;
}

static float *grad(const struct l3d_gpt *m, int t, int l) {
    return l3d_gpt_tensor_used(&m->cfg, t) ? l3d_gpt_grad_ptr(m, t, l) : NULL;
}

/* The MLP's activation over n rows: SwiGLU from [gate | up] (width 2F), or GELU. */
static void act_forward(const struct l3d_gpt *m, void *out, const void *in, int64_t n, int64_t F) {
    if (m->cfg.mlp == L3D_MLP_SWIGLU)
        l3d_be_swiglu_forward(m->be, m->dt, out, in, n, F);
    else
        l3d_be_gelu_forward(m->be, m->dt, out, in, n * F);
}

static void act_backward(struct l3d_gpt *m, void *din, const void *dout, const void *in,
                         int64_t n, int64_t F) {
    if (m->cfg.mlp == L3D_MLP_SWIGLU)
        l3d_be_swiglu_backward(m->be, m->dt, din, dout, in, n, F);
    else
        l3d_be_gelu_backward(m->be, m->dt, din, dout, in, n * F);
}

/* Assignments an expert keeps: ceil(capacity_factor N K / E), or 0 (dropless); N the
 * micro-batch's tokens, all the ring's under context parallelism. */
static int64_t capacity(const struct l3d_model_spec *cfg, int64_t N) {
    const struct l3d_moe_spec *e = &cfg->moe;
    if (e->capacity_factor <= 0.0) return 0;
    double c = ceil(e->capacity_factor * (double)N * e->top_k / e->experts);
    return c < 1.0 ? 1 : (int64_t)c;
}

/* The row segments this rank's experts multiply (a->seg: first row, rows, local expert), from
 * the routing's offsets a->hoff. One rank: expert e's rows, in expert order. Expert parallelism:
 * every EP rank sends this one the counts of its rows for each of this rank's experts (one
 * all-to-all of E integers); the rows arrive grouped by the rank that sent them, each group in
 * expert order, so a segment is (sending rank, expert), and a->a2a records the rows sent to and
 * received from each rank for the dispatch and the combine. */
static void plan_segments(const struct l3d_gpt *m, struct moe_acts *a, const struct moe_dims *d) {
    a->nseg = 0;
    if (d->ep == 1) {
        for (int64_t e = 0; e < d->E; e++) {
            int64_t *g = a->seg + 3 * a->nseg++;
            g[0] = a->hoff[e], g[1] = a->hoff[e + 1] - a->hoff[e], g[2] = e;
        }
        return;
    }
    int64_t ep = d->ep, El = d->El, *sc = a->a2a, *sd = sc + ep, *rc = sd + ep, *rd = rc + ep;
    int64_t *cs = rd + ep, *cr = cs + d->E, *cnt = m->moe->xcnt, *dis = cnt + ep;
    L3D_ASSERT(m->hooks.ep_all_to_allv);
    for (int64_t e = 0; e < d->E; e++) cs[e] = a->hoff[e + 1] - a->hoff[e];
    for (int64_t q = 0; q < ep; q++) cnt[q] = El, dis[q] = q * El;
    m->hooks.ep_all_to_allv(m->hooks.ep_ctx, cs, cnt, dis, cr, cnt, dis, L3D_I64);
    int64_t row = 0;
    for (int64_t q = 0; q < ep; q++) {
        sd[q] = a->hoff[q * El];
        sc[q] = a->hoff[(q + 1) * El] - sd[q];
        rd[q] = row;
        for (int64_t le = 0; le < El; le++) {
            int64_t *g = a->seg + 3 * a->nseg++;
            g[0] = row, g[1] = cr[q * El + le], g[2] = le;
            row += g[1];
        }
        rc[q] = row - rd[q];
    }
}

/* The EP all-to-all of rows of C elements: the dispatch (forward true: this rank's rows in expert
 * order out to their experts' ranks, from x to xe) or the combine (from ye back to y). */
static void exchange(const struct l3d_gpt *m, const struct moe_acts *a, const struct moe_dims *d,
                     void *to, const void *from, bool dispatch) {
    int64_t ep = d->ep, C = m->cfg.C, *n = m->moe->xcnt;
    const int64_t *v = a->a2a; /* sc, sd, rc, rd in rows: in elements */
    for (int64_t k = 0; k < 4 * ep; k++) n[k] = v[k] * C;
    int64_t s = dispatch ? 0 : 2 * ep, r = dispatch ? 2 * ep : 0;
    m->hooks.ep_all_to_allv(m->hooks.ep_ctx, from, n + s, n + s + ep, to, n + r, n + r + ep,
                            m->dt);
}

/* The rows this rank's experts take (the segments' total). */
static int64_t seg_rows(const struct moe_acts *a) {
    int64_t n = 0;
    for (int i = 0; i < a->nseg; i++) n += a->seg[3 * i + 1];
    return n;
}

void l3d_moe_chunk_counts(float *cnt, const int32_t *idx, int64_t N, int64_t K, int64_t E,
                          int B, int cp, int cp_rank) {
    int64_t per = N / (2 * B) * K, G = 2 * cp;
    memset(cnt, 0, (size_t)(B * G * E) * sizeof(float));
    for (int64_t i = 0; i < N * K; i++) {
        int64_t s = i / per, b = s / 2;
        /* the chunk's index among the row's 2 cp: its start in a row of 2 (T / 2 = 1) */
        int64_t c = l3d_cp_chunk_start(cp, cp_rank, (int)(s % 2), 2);
        cnt[(b * G + c) * E + idx[i]] += 1.0f;
    }
}

void l3d_moe_chunk_fills(int32_t *fill, float *cnt, int64_t E, int B, int cp, int cp_rank) {
    int64_t G = 2 * cp;
    for (int64_t e = 0; e < E; e++) { /* exclusive prefix over (row, chunk), the token order */
        float run = 0.0f;
        for (int64_t g = 0; g < B * G; g++) {
            float c = cnt[g * E + e];
            cnt[g * E + e] = run;
            run += c;
        }
    }
    for (int64_t s = 0; s < 2 * B; s++) {
        int64_t c = l3d_cp_chunk_start(cp, cp_rank, (int)(s % 2), 2);
        for (int64_t e = 0; e < E; e++) fill[s * E + e] = (int32_t)cnt[((s / 2) * G + c) * E + e];
    }
}

void l3d_moe_force_rows(int32_t *idx, int64_t E, int64_t K, int layer, int B, int64_t T,
                        int cp, int cp_rank, int64_t pos0) {
    L3D_ASSERT(K >= 1 && K <= E && (cp <= 1 || T % 2 == 0));
    int64_t seq = cp > 1 ? T * cp : T, half = T / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            /* the row's position in its sequence: the ring's two chunks (l3d_cp_chunk_start, as
             * the embedding's positions), or pos0 on */
            int64_t p = cp > 1 ? l3d_cp_chunk_start(cp, cp_rank, (int)(t / half), T) + t % half
                               : pos0 + t;
            int64_t g = (b * seq + p) * K + layer;
            for (int64_t j = 0; j < K; j++) idx[(b * T + t) * K + j] = (int32_t)((g + j) % E);
        }
}

/* --moe-force-balance: local layer l's forced assignments of the micro-batch's N = B T rows
 * (device, s->forced), or NULL when the router picks. Copied each forward: a layer's differ. */
static const int32_t *forced_rows(struct l3d_gpt *m, int l, int64_t N) {
    struct l3d_moe_state *s = m->moe;
    if (!m->cfg.moe.force_balance) return NULL;
    L3D_ASSERT(N == (int64_t)m->B * m->T);
    int cp = m->hooks.cp_size > 1 ? m->hooks.cp_size : 1;
    l3d_moe_force_rows(s->hforced, m->cfg.moe.experts, m->cfg.moe.top_k,
                       m->shard.layer_start + l, m->B, m->T, cp, m->hooks.cp_rank, 0);
    l3d_be_copy_h2d(m->be, s->forced, s->hforced,
                    (size_t)(N * m->cfg.moe.top_k) * sizeof(int32_t));
    l3d_be_sync(m->be); /* before the host buffer is written again */
    return s->forced;
}

/* The capacity's starting fills of this ring rank's 2 B chunks (device, in s->dlogits, the
 * backward's scratch, free during a forward; 2 B E int32 fit its N E floats) from the routing in
 * a->idx: every rank's per-chunk counts summed over the ring (the model's tok_sum hook, exact:
 * integers below 2^24), then their exclusive prefix in the micro-batch's token order. */
static const int32_t *ring_fills(struct l3d_gpt *m, const struct moe_acts *a, int64_t N) {
    int64_t E = m->cfg.moe.experts, K = m->cfg.moe.top_k;
    int B = m->B, cp = m->hooks.tok_split, r = m->hooks.cp_rank;
    L3D_ASSERT(N == (int64_t)B * m->T && m->T % 2 == 0 && cp == m->hooks.cp_size);
    struct l3d_moe_state *s = m->moe;
    if (!s->ring_idx) { /* once, at the largest micro-batch: not in every layer's forward */
        int64_t Bm = m->Bmax;
        s->ring_idx = l3d_alloc((size_t)(Bm * m->Tmax * K) * sizeof(int32_t), "MoE ring routing");
        s->ring_fill = l3d_alloc((size_t)(2 * Bm * E) * sizeof(int32_t), "MoE ring fills");
        s->ring_cnt = l3d_alloc((size_t)(2 * cp * Bm * E) * sizeof(float), "MoE ring counts");
    }
    int32_t *idx = s->ring_idx, *fill = s->ring_fill;
    float *cnt = s->ring_cnt;
    l3d_be_copy_d2h(m->be, idx, a->idx, (size_t)(N * K) * sizeof(int32_t));
    l3d_moe_chunk_counts(cnt, idx, N, K, E, B, cp, r);
    m->hooks.tok_sum(m->hooks.tok_ctx, cnt, 2 * cp * B * E);
    l3d_moe_chunk_fills(fill, cnt, E, B, cp, r);
    l3d_be_copy_h2d(m->be, m->moe->dlogits, fill, (size_t)(2 * B * E) * sizeof(int32_t));
    l3d_be_sync(m->be); /* before the host buffer is written again */
    return (const int32_t *)m->moe->dlogits;
}

/* The router and the counting sort. With a capacity on a context-parallel ring the drop decision
 * needs the assignments of the micro-batch's tokens before each of this rank's chunks: a first
 * dropless routing gives this rank's, ring_fills the others', and the routing runs again with
 * those starting fills (the router's product twice, E C a token: small beside the experts'). */
static void route(struct l3d_gpt *m, struct moe_acts *a, const void *ln, int l, int64_t N) {
    int64_t C = m->cfg.C, E = m->cfg.moe.experts, K = m->cfg.moe.top_k;
    int64_t cap = capacity(&m->cfg, split_tokens(m, N)), segs = 1;
    const int32_t *fill = NULL, *forced = forced_rows(m, l, N);
    const void *w = param(m, L3D_T_ROUTER, l);
    if (cap > 0 && m->hooks.tok_split > 1) {
        l3d_be_moe_route(m->be, m->dt, a->probs, a->lse, a->idx, a->wts, a->pos, a->offsets,
                         a->stats, m->moe->work, ln, w, N, C, E, K, m->cfg.moe.norm_topk, 0, NULL,
                         1, forced);
        fill = ring_fills(m, a, N);
        segs = 2 * m->B;
    }
    l3d_be_moe_route(m->be, m->dt, a->probs, a->lse, a->idx, a->wts, a->pos, a->offsets, a->stats,
                     m->moe->work, ln, w, N, C, E, K, m->cfg.moe.norm_topk, cap, fill, segs,
                     forced);
}

/* The block after the routing in a (its offsets, positions and weights): the rows gathered in
 * expert order (sent to their experts' ranks with expert parallelism), each expert's MLP over its
 * rows, and out (N,C) = the shared MLP's output (or zeros) plus the rows' weighted sum. */
static void experts_forward(const struct l3d_gpt *m, int l, struct moe_acts *a, void *out,
                            const void *ln, int64_t N) {
    struct moe_dims d = moe_dims(&m->cfg, &m->shard);
    const enum l3d_dtype dt = m->dt;
    const size_t es = m->es;
    int64_t C = m->cfg.C;
    /* each expert's row count decides its product's shape: on the host */
    l3d_be_copy_d2h(m->be, a->hoff, a->offsets, (size_t)(d.E + 1) * sizeof(int32_t));
    l3d_be_moe_permute(m->be, dt, a->r.x, ln, a->pos, N, d.K, C);
    plan_segments(m, a, &d);
    if (d.ep > 1) exchange(m, a, &d, a->r.xe, a->r.x, true);
    const void *fcw = param(m, L3D_T_EXPFCW, l), *fcb = param(m, L3D_T_EXPFCB, l);
    const void *pw = param(m, L3D_T_EXPPROJW, l), *pb = param(m, L3D_T_EXPPROJB, l);
    for (int i = 0; i < a->nseg; i++) {
        int64_t r0 = a->seg[3 * i], n = a->seg[3 * i + 1], e = a->seg[3 * i + 2];
        if (n > 0)
            l3d_be_matmul_forward(m->be, dt, elp(a->r.h, r0 * d.Fm, es), elp(a->r.xe, r0 * C, es),
                                  elp(fcw, e * d.Fm * C, es), elp(fcb, e * d.Fm, es), n, C, d.Fm);
    }
    int64_t rows = seg_rows(a);
    if (rows > 0) act_forward(m, a->r.ha, a->r.h, rows, d.F);
    for (int i = 0; i < a->nseg; i++) {
        int64_t r0 = a->seg[3 * i], n = a->seg[3 * i + 1], e = a->seg[3 * i + 2];
        if (n > 0)
            l3d_be_matmul_forward(m->be, dt, elp(a->r.ye, r0 * C, es), elp(a->r.ha, r0 * d.F, es),
                                  elp(pw, e * C * d.F, es), elp(pb, e * C, es), n, d.F, C);
    }
    if (d.ep > 1) exchange(m, a, &d, a->r.y, a->r.ye, false);
    if (d.SF > 0) { /* the shared MLP: every token, weight 1, under the routed sum */
        l3d_be_matmul_forward(m->be, dt, a->r.sh, ln, param(m, L3D_T_SHFCW, l),
                              param(m, L3D_T_SHFCB, l), N, C, d.SFm);
        act_forward(m, a->r.sha, a->r.sh, N, d.SF);
        l3d_be_matmul_forward(m->be, dt, out, a->r.sha, param(m, L3D_T_SHPROJW, l),
                              param(m, L3D_T_SHPROJB, l), N, d.SF, C);
    } else {
        l3d_be_memset(m->be, out, 0, (size_t)(N * C) * es);
    }
    l3d_be_moe_combine(m->be, dt, out, a->r.y, a->pos, a->wts, N, d.K, C);
}

void l3d_moe_forward(struct l3d_gpt *m, int l, void *out, const void *ln, int64_t N, bool count) {
    int j;
    struct moe_acts *a = layer_set(m, l, &j);
    route(m, a, ln, l, N);
    share_counts(m, a);
    experts_forward(m, l, a, out, ln, N);
    if (count) count_stats(m, j, a, N);
}

/* The routed experts' backward: d(rows) from the combine (in y's order, sent back to the experts'
 * ranks with expert parallelism), through each expert's MLP, into d.x (rows in expert order,
 * back from the experts' ranks) and the experts' weight gradients; dwts the top-k weights'
 * gradient. */
static void experts_backward(struct l3d_gpt *m, int l, const struct moe_acts *a,
                             const void *dout, int64_t N) {
    struct l3d_moe_state *s = m->moe;
    struct moe_dims d = moe_dims(&m->cfg, &m->shard);
    const enum l3d_dtype dt = m->dt;
    const size_t es = m->es;
    int64_t C = m->cfg.C, rows = seg_rows(a);
    l3d_be_moe_combine_backward(m->be, dt, s->d.y, s->dwts, dout, a->r.y, a->pos, a->wts, N, d.K,
                                C);
    if (d.ep > 1) exchange(m, a, &d, s->d.ye, s->d.y, true);
    const void *fcw = param(m, L3D_T_EXPFCW, l), *pw = param(m, L3D_T_EXPPROJW, l);
    float *gfcw = grad(m, L3D_T_EXPFCW, l), *gfcb = grad(m, L3D_T_EXPFCB, l);
    float *gpw = grad(m, L3D_T_EXPPROJW, l), *gpb = grad(m, L3D_T_EXPPROJB, l);
    l3d_be_memset(m->be, s->d.ha, 0, (size_t)(rows * d.F) * es);
    l3d_be_memset(m->be, s->d.h, 0, (size_t)(rows * d.Fm) * es);
    l3d_be_memset(m->be, s->d.xe, 0, (size_t)(rows * C) * es);
    for (int i = 0; i < a->nseg; i++) {
        int64_t r0 = a->seg[3 * i], n = a->seg[3 * i + 1], e = a->seg[3 * i + 2];
        if (n > 0)
            l3d_be_matmul_backward_mixed(m->be, dt, L3D_F32, elp(s->d.ha, r0 * d.F, es),
                                         gpw + e * C * d.F, gpb ? gpb + e * C : NULL,
                                         elp(s->d.ye, r0 * C, es), elp(a->r.ha, r0 * d.F, es),
                                         elp(pw, e * C * d.F, es), n, d.F, C);
    }
    if (rows > 0) act_backward(m, s->d.h, s->d.ha, a->r.h, rows, d.F);
    for (int i = 0; i < a->nseg; i++) {
        int64_t r0 = a->seg[3 * i], n = a->seg[3 * i + 1], e = a->seg[3 * i + 2];
        if (n > 0)
            l3d_be_matmul_backward_mixed(m->be, dt, L3D_F32, elp(s->d.xe, r0 * C, es),
                                         gfcw + e * d.Fm * C, gfcb ? gfcb + e * d.Fm : NULL,
                                         elp(s->d.h, r0 * d.Fm, es), elp(a->r.xe, r0 * C, es),
                                         elp(fcw, e * d.Fm * C, es), n, C, d.Fm);
    }
    if (d.ep > 1) exchange(m, a, &d, s->d.x, s->d.xe, false);
}

void l3d_moe_backward(struct l3d_gpt *m, int l, void *dln, const void *dout, const void *ln,
                      int64_t N, float dloss) {
    int j;
    struct moe_acts *a = layer_set(m, l, &j);
    struct l3d_moe_state *s = m->moe;
    struct moe_dims d = moe_dims(&m->cfg, &m->shard);
    const enum l3d_dtype dt = m->dt;
    int64_t C = m->cfg.C;
    experts_backward(m, l, a, dout, N);
    l3d_be_memset(m->be, dln, 0, (size_t)(N * C) * m->es);
    if (d.SF > 0) {
        l3d_be_memset(m->be, s->d.sha, 0, (size_t)(N * d.SF) * m->es);
        l3d_be_matmul_backward_mixed(m->be, dt, L3D_F32, s->d.sha, grad(m, L3D_T_SHPROJW, l),
                                     grad(m, L3D_T_SHPROJB, l), dout, a->r.sha,
                                     param(m, L3D_T_SHPROJW, l), N, d.SF, C);
        l3d_be_memset(m->be, s->d.sh, 0, (size_t)(N * d.SFm) * m->es);
        act_backward(m, s->d.sh, s->d.sha, a->r.sh, N, d.SF);
        l3d_be_matmul_backward_mixed(m->be, dt, L3D_F32, dln, grad(m, L3D_T_SHFCW, l),
                                     grad(m, L3D_T_SHFCB, l), s->d.sh, ln,
                                     param(m, L3D_T_SHFCW, l), N, C, d.SFm);
    }
    l3d_be_moe_combine(m->be, dt, dln, s->d.x, a->pos, NULL, N, d.K, C); /* the gather's backward */
    /* the auxiliary losses weigh as this micro-batch's mean loss does in the objective: dloss N
     * (dloss is one token's weight); Switch's d/dp[n,e] = coef E f_e / N with f_e = count_e /
     * (N K), and the z-loss's d/dlogit[n,e] = coef 2 lse_n p[n,e] / N */
    const struct l3d_moe_spec *ms = &m->cfg.moe;
    float aux_scale = (float)((double)dloss * ms->aux_coef * (double)d.E /
                              ((double)split_tokens(m, N) * d.K));
    float z_scale = (float)(2.0 * dloss * ms->z_coef);
    l3d_be_moe_router_backward(m->be, dt, L3D_F32, dln, grad(m, L3D_T_ROUTER, l), s->dlogits,
                               s->dwts, ln, param(m, L3D_T_ROUTER, l), a->probs, a->lse, a->idx,
                               a->wts, a->stats, N, C, d.E, d.K, ms->norm_topk, aux_scale,
                               z_scale);
}

/* ---- generation (src/model/infer.c) ------------------------------------------------------ */

struct l3d_moe_infer {
    struct l3d_backend *be;
    int64_t Nmax;
    void *base;      /* device: the set's routing and rows, then work */
    struct moe_acts a;
    int32_t *work;   /* the router's counting sort's counts (3E) */
    int32_t *forced, *hforced; /* --moe-force-balance: the assignments (Nmax,K), device, host */
};

l3d_status l3d_moe_infer_init(struct l3d_moe_infer **out, const struct l3d_gpt *m, int64_t Nmax) {
    *out = NULL;
    const struct l3d_model_spec *c = &m->cfg;
    if (l3d_shard_moe_layers(c, &m->shard) == 0) return L3D_OK;
    if (!l3d_be_has_moe(m->be))
        return l3d_error(L3D_ERR_ARG, "backend %s has no MoE kernels (--moe-experts %d): "
                         "the cpu, check and CUDA backends have them; use L3D_BACKEND=cpu",
                         l3d_backend_name(m->be), c->moe.experts);
    L3D_ASSERT(m->shard.expert_start == 0 && m->shard.expert_count == c->moe.experts);
    struct l3d_moe_infer *w = l3d_calloc(sizeof *w, "MoE generation state");
    w->be = m->be;
    w->Nmax = Nmax;
    int64_t E = c->moe.experts;
    size_t bytes = (size_t)point_infer(&w->a, &w->work, &w->forced, c, &m->shard, Nmax,
                                       (int64_t)m->es, NULL);
    w->base = l3d_be_alloc(m->be, bytes, "MoE generation buffers");
    w->a.hoff = l3d_try_alloc((size_t)(E + 1) * sizeof(int32_t), "MoE offsets");
    w->a.seg = l3d_try_alloc((size_t)(3 * E) * sizeof(int64_t), "MoE segments");
    if (c->moe.force_balance)
        w->hforced = l3d_try_alloc((size_t)(Nmax * c->moe.top_k) * sizeof(int32_t),
                                   "MoE forced routing");
    if (!w->base || !w->a.hoff || !w->a.seg || (c->moe.force_balance && !w->hforced)) {
        l3d_moe_infer_free(w);
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB for the MoE layers' generation "
                         "buffers (%lld tokens a step, %lld experts): use a model with a shorter "
                         "context", (double)bytes / 1073741824.0, (long long)Nmax, (long long)E);
    }
    l3d_be_memset(m->be, w->base, 0, bytes); /* first touch */
    point_infer(&w->a, &w->work, &w->forced, c, &m->shard, Nmax, (int64_t)m->es, w->base);
    *out = w;
    return L3D_OK;
}

void l3d_moe_infer_free(struct l3d_moe_infer *w) {
    if (!w) return;
    l3d_be_free(w->be, w->base);
    l3d_free(w->a.hoff);
    l3d_free(w->a.seg);
    l3d_free(w->hforced);
    l3d_free(w);
}

void l3d_moe_infer_forward(struct l3d_moe_infer *w, const struct l3d_gpt *m, int l, void *out,
                           const void *ln, int64_t N, int64_t pos0) {
    const struct l3d_model_spec *c = &m->cfg;
    struct moe_acts *a = &w->a;
    L3D_ASSERT(N >= 1 && N <= w->Nmax && l3d_model_moe_layer(c, m->shard.layer_start + l));
    const int32_t *forced = NULL;
    if (c->moe.force_balance) { /* the rows are positions pos0.. of the one sequence */
        l3d_moe_force_rows(w->hforced, c->moe.experts, c->moe.top_k, m->shard.layer_start + l, 1,
                           N, 1, 0, pos0);
        l3d_be_copy_h2d(m->be, w->forced, w->hforced, (size_t)(N * c->moe.top_k) * 4);
        l3d_be_sync(m->be);
        forced = w->forced;
    }
    /* dropless (capacity 0) whatever the training's capacity factor: every assignment kept */
    l3d_be_moe_route(m->be, m->dt, a->probs, a->lse, a->idx, a->wts, a->pos, a->offsets,
                     a->stats, w->work, ln, param(m, L3D_T_ROUTER, l), N, c->C, c->moe.experts,
                     c->moe.top_k, c->moe.norm_topk, 0, NULL, 1, forced);
    experts_forward(m, l, a, out, ln, N);
}
