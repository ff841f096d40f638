/* bf16 attention with its products as batched oneDNN matmuls (src/backend/cpu_attnd.h).
 *
 * cpu.c's flash kernels multiply 64 x 64 blocks one task at a time (fp32 sgemm around widened
 * operands, or cpu_attn16.c's vdpbf16ps); a oneDNN call per such block would cost more in its
 * overhead (a few us) than the block's product (0.5 MFLOP). Here every product is one call over
 * G (batch, key/value head) groups at once, G matrices of one shape, so the call is large (4
 * MFLOP and more) and oneDNN's brgemm runs it on AMX tiles. Its kernels take only dense
 * tensors (a row stride past the row, as a view into qkv is, sends oneDNN 2.6 to its slower
 * gemm:jit or reference code, measured), so the operands are gathered into dense blocks:
 *
 *   Kb, Vb (nb, G, BQ, HS) bf16    every key block of every group, once per call (zero padded)
 *   Qb, dOb (G, M, HS) bf16        one query block of the rep = NH / NKV query heads of each
 *                                  group stacked as M = rep BQ rows (grouped-query attention
 *                                  shares the group's K and V; nothing is repeated)
 *
 * Query blocks outer (BQ = 64 rows), the key blocks kb <= qb of the causal triangle inner, three
 * product shapes (three cached primitives per shape of G, M, HS):
 *   QK  S (G, M, BQ) fp32 = Qb Kb^T        (and dP = dOb Vb^T)
 *   PV  O (G, M, HS) fp32 += P Vb          (and dQ += dS Kb)
 *   TN  dK (G, BQ, HS) fp32 += dS^T Qb     (and dV += P^T dOb; the transpose is a stride)
 * Forward: S of the whole visible row (nb key blocks) in fp32, its integer offset
 * m = ceil(max s log2 e) and sum l = sum 2^(s log2 e - m) in fp32, lse = m ln 2 + log(l),
 * P = 2^(s log2 e - m) rounded to bf16 for P V (l3d_attn_p: the same bf16 values for any integer
 * offset, so the flash kernels' online rows, the cp ring's blocks and the KV cache round every
 * probability as this path does); out = O / l rounded once.
 * Backward (FlashAttention-2 eq. 4): P = exp(scale s - lse) recomputed, D = rowsum(dO * O),
 * dS = P (dP - D) scale; P and dS rounded to bf16 for their products (as FlashAttention-2 on
 * GPUs); dQ summed over its key blocks in fp32 and added to dqkv once per query block, dK and dV
 * summed over the query blocks in fp32 scratch and added to dqkv once at the end (old + new,
 * rounded once).
 *
 * The groups run G at a time (512 rows of query blocks a call), so that the blocks between a
 * product and the row pass reading it stay in L2. Memory (one scratch, grown to the largest call
 * and kept; nothing is allocated in a step), for a chunk of G groups: forward 2 G Tp HS bf16
 * (keys, values) + G M Tp fp32 (a query block's scores over all keys) + (G, M, 64 or HS) blocks;
 * backward 2 G Tp HS (bf16 + fp32 sums) + the blocks, Tp = T rounded up to 64: GPT-2 124M at
 * B 8 x T 256 (G = 8 of 96) 1.3 MB forward, 2.2 MB backward; independent of B.
 */
#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu_attn16.h"
#include "backend/cpu_attnd.h"

typedef uint16_t bf16;

#define BQ 64
#define AD_CACHE 12

#define AD_CHECK L3D_DNNL_CHECK

/* QK: dst (G,M,N) = src (G,M,K) x wei^T with wei stored (G,N,K);
 * PV: dst (G,M,N) += src (G,M,K) x wei (G,K,N);
 * TN: dst (G,M,N) += src^T x wei (G,K,N) with src stored (G,K,M). dst fp32, src and wei bf16. */
enum ad_kind { AD_QK, AD_PV, AD_TN };

struct ad_prim {
    enum ad_kind kind;
    int64_t G, M, K, N;
    bool ok;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst, pad; /* pad: the primitive's scratchpad, in l3d_attnd's */
    size_t pad_bytes;
};

struct l3d_attnd {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct ad_prim p[AD_CACHE];
    int count, next;
    void *scr, *pad; /* the kernels' scratch; the primitives' scratchpad (one at a time) */
    size_t bytes, pad_bytes;
    bool on;
    char rule[96];
};

static void ad_prim_destroy(struct ad_prim *e) {
    if (e->ok) {
        dnnl_primitive_destroy(e->prim);
        dnnl_memory_destroy(e->src);
        dnnl_memory_destroy(e->wei);
        dnnl_memory_destroy(e->dst);
        dnnl_memory_destroy(e->pad);
    }
    memset(e, 0, sizeof *e);
}

/* e's primitive; impl (if not NULL) gets oneDNN's implementation name. e->ok false when oneDNN
 * has no bf16 matmul here or only its reference loops. */
static void ad_prim_create(struct l3d_attnd *ad, struct ad_prim *e, const char **impl) {
    const int64_t G = e->G, M = e->M, K = e->K, N = e->N;
    dnnl_dims_t sd = {G, M, K}, wd = {G, K, N}, dd = {G, M, N};
    dnnl_dims_t ss = {M * K, K, 1}, ws = {K * N, N, 1}, ds = {M * N, N, 1};
    if (e->kind == AD_QK) ws[1] = 1, ws[2] = K;
    if (e->kind == AD_TN) ss[1] = 1, ss[2] = M;
    dnnl_memory_desc_t src, wei, dst;
    AD_CHECK(dnnl_memory_desc_init_by_strides(&src, 3, sd, dnnl_bf16, ss));
    AD_CHECK(dnnl_memory_desc_init_by_strides(&wei, 3, wd, dnnl_bf16, ws));
    AD_CHECK(dnnl_memory_desc_init_by_strides(&dst, 3, dd, dnnl_f32, ds));
    dnnl_matmul_desc_t md;
    AD_CHECK(dnnl_matmul_desc_init(&md, &src, &wei, NULL, &dst));
    /* the scratchpad is ours (allocated once): oneDNN's own would be allocated at each call */
    dnnl_primitive_attr_t attr;
    AD_CHECK(dnnl_primitive_attr_create(&attr));
    AD_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (e->kind != AD_QK) { /* += : oneDNN's sum post-op, the old dst read in fp32 */
        dnnl_post_ops_t po;
        AD_CHECK(dnnl_post_ops_create(&po));
        AD_CHECK(dnnl_post_ops_append_sum(po, 1.0f));
        AD_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &md, attr, ad->engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    e->ok = false;
    if (st == dnnl_unimplemented) return;
    AD_CHECK(st);
    const char *name = "";
    AD_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name));
    if (impl) *impl = name;
    if (strncmp(name, "ref", 3) != 0) {
        AD_CHECK(dnnl_primitive_create(&e->prim, pd));
        AD_CHECK(dnnl_memory_create(&e->src, &src, ad->engine, DNNL_MEMORY_NONE));
        AD_CHECK(dnnl_memory_create(&e->wei, &wei, ad->engine, DNNL_MEMORY_NONE));
        AD_CHECK(dnnl_memory_create(&e->dst, &dst, ad->engine, DNNL_MEMORY_NONE));
        const dnnl_memory_desc_t *pad = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->pad_bytes = dnnl_memory_desc_get_size(pad);
        AD_CHECK(dnnl_memory_create(&e->pad, pad, ad->engine, DNNL_MEMORY_NONE));
        e->ok = true;
    }
    dnnl_primitive_desc_destroy(pd);
}

/* The cached primitive of this kind and shape, created on first use (a training run asks for
 * three shapes per (B, T, NH, NKV, HS); the cache holds four such runs' worth). */
static struct ad_prim *ad_get(struct l3d_attnd *ad, enum ad_kind kind, int64_t G, int64_t M,
                              int64_t K, int64_t N) {
    for (int i = 0; i < ad->count; i++) {
        struct ad_prim *e = &ad->p[i];
        if (e->kind == kind && e->G == G && e->M == M && e->K == K && e->N == N) return e;
    }
    struct ad_prim *e;
    if (ad->count < AD_CACHE) {
        e = &ad->p[ad->count++];
    } else {
        e = &ad->p[ad->next];
        ad->next = (ad->next + 1) % AD_CACHE;
        ad_prim_destroy(e);
    }
    *e = (struct ad_prim){.kind = kind, .G = G, .M = M, .K = K, .N = N};
    ad_prim_create(ad, e, NULL);
    if (e->ok && e->pad_bytes > ad->pad_bytes) { /* grown with a new shape, then kept */
        l3d_free(ad->pad);
        ad->pad = l3d_alloc(e->pad_bytes, "attention oneDNN scratchpad");
        memset(ad->pad, 0, e->pad_bytes);
        ad->pad_bytes = e->pad_bytes;
    }
    if (!e->ok)
        l3d_fatal(__FILE__, __LINE__, "backend cpu: oneDNN has no bf16 matmul for attention's "
                  "(%lld x %lld x %lld) x %lld products on this CPU; run with L3D_ATTN_DNNL=0",
                  (long long)M, (long long)K, (long long)N, (long long)G);
    return e;
}

static void ad_run(struct l3d_attnd *ad, struct ad_prim *e, float *dst, const bf16 *src,
                   const bf16 *wei) {
    AD_CHECK(dnnl_memory_set_data_handle(e->src, (void *)src));
    AD_CHECK(dnnl_memory_set_data_handle(e->wei, (void *)wei));
    AD_CHECK(dnnl_memory_set_data_handle(e->dst, dst));
    AD_CHECK(dnnl_memory_set_data_handle(e->pad, ad->pad));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->src},
                               {DNNL_ARG_WEIGHTS, e->wei},
                               {DNNL_ARG_DST, e->dst},
                               {DNNL_ARG_SCRATCHPAD, e->pad}};
    AD_CHECK(dnnl_primitive_execute(e->prim, ad->stream, 4, args));
    AD_CHECK(dnnl_stream_wait(ad->stream));
}

struct l3d_attnd *l3d_attnd_init(void) {
    struct l3d_attnd *ad = l3d_calloc(sizeof *ad, "attention oneDNN context");
    AD_CHECK(dnnl_engine_create(&ad->engine, dnnl_cpu, 0));
    AD_CHECK(dnnl_stream_create(&ad->stream, ad->engine, dnnl_stream_default_flags));
    /* Opt-in (L3D_ATTN_DNNL=1; 1.13-1.65x the flash kernels on AMX, docs/BENCHMARKS.md). Every
     * other bf16 attention of this backend (the cp ring's blocks, the KV cache) then takes this
     * path's numerics (cpu.c, block_p16; l3d_attn_p), so cached generation chooses the full
     * forward's tokens and the layout suites pass in the Release build; not the default because
     * the sanitized build on the checking backend (CI's second pass) then fails two MoE
     * comparisons of tests/cli/ep_layouts.sh (ep 2 x cp 2 with the fp32 ring: gradient norm
     * 0.48% off, bound 0.2%; tp 2 with fp32 sums: 1.42%), where a token near a tie between two
     * bf16 router logits goes to another expert: AMX's sums differ in their last bits between
     * layouts (and from sgemm's), the flash kernels' do not (docs/DESIGN.md) */
    const char *e = getenv("L3D_ATTN_DNNL");
    if (e && !*e) e = NULL; /* empty: unset */
    if (e && strcmp(e, "0") != 0 && strcmp(e, "1") != 0)
        l3d_fatal(__FILE__, __LINE__, "backend cpu: L3D_ATTN_DNNL is \"%s\"; set it to 1 (bf16 "
                  "attention as oneDNN matmuls wherever oneDNN has them) or 0 (the flash "
                  "kernels, as unset)", e);
    if (!e || e[0] == '0') {
        snprintf(ad->rule, sizeof ad->rule, "off (%s; L3D_ATTN_DNNL=1 for oneDNN's matmuls)",
                 e ? "L3D_ATTN_DNNL=0" : "the default");
        return ad;
    }
    /* asked for: wherever oneDNN has a bf16 matmul for the score product (AMX or not) */
    struct ad_prim probe = {.kind = AD_QK, .G = 1, .M = BQ, .K = 64, .N = BQ};
    const char *impl = "none";
    ad_prim_create(ad, &probe, &impl);
    bool amx = probe.ok && strstr(impl, "amx") != NULL;
    ad->on = probe.ok;
    snprintf(ad->rule, sizeof ad->rule, "%s %s (L3D_ATTN_DNNL=1%s)",
             ad->on ? "oneDNN" : "off: oneDNN", impl, amx ? ", AMX" : ", no AMX");
    ad_prim_destroy(&probe);
    return ad;
}

void l3d_attnd_free(struct l3d_attnd *ad) {
    if (!ad) return;
    for (int i = 0; i < ad->count; i++) ad_prim_destroy(&ad->p[i]);
    l3d_free(ad->scr);
    l3d_free(ad->pad);
    dnnl_stream_destroy(ad->stream);
    dnnl_engine_destroy(ad->engine);
    l3d_free(ad);
}

bool l3d_attnd_on(const struct l3d_attnd *ad, enum l3d_dtype dt) {
    return ad && ad->on && dt == L3D_BF16;
}

const char *l3d_attnd_rule(const struct l3d_attnd *ad) { return ad->rule; }

/* ---- the call's geometry and scratch ------------------------------------------------------ */

/* A call's shape; the groups run in chunks of G (those from g0), Gall in all */
struct ad_geo {
    int64_t B, T, NH, NKV, HS, rep, Gall, g0, G, M, nb, CQ, C;
    float scale;
};

static struct ad_geo ad_geo(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    if (NKV <= 0 || NH % NKV != 0)
        l3d_fatal(__FILE__, __LINE__, "backend cpu: attention: %lld query heads are not a "
                  "multiple of %lld key/value heads", (long long)NH, (long long)NKV);
    struct ad_geo g = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .rep = NH / NKV};
    g.Gall = B * NKV;
    g.M = g.rep * BQ;
    /* groups a call: 512 rows, so that a key block's scores (128 KiB) and a query block's
     * output stay in L2 between the products and the row passes (all groups at once streamed
     * them through memory: the products ran at a fifth of their speed), while a call stays large
     * (4 MFLOP at HS 64) beside oneDNN's overhead (1024 and 2048 rows measured 5-10% slower) */
    g.G = 512 / g.M > 0 ? 512 / g.M : 1;
    g.G = g.G < g.Gall ? g.G : g.Gall;
    g.nb = (T + BQ - 1) / BQ;
    g.CQ = (NH + 2 * NKV) * HS;
    g.C = NH * HS;
    g.scale = 1.0f / sqrtf((float)HS);
    return g;
}

/* Pieces of the scratch, each 64-byte aligned: n bytes at *at, *at advanced */
static void *carve(char *base, size_t *at, size_t n) {
    void *p = base ? base + *at : NULL;
    *at += (n + 63) & ~(size_t)63;
    return p;
}

/* the kept scratch, at least `bytes` (grown and touched on the first, largest call) */
static char *ad_scratch(struct l3d_attnd *ad, size_t bytes) {
    if (bytes > ad->bytes) {
        l3d_free(ad->scr);
        ad->scr = l3d_alloc(bytes, "attention oneDNN scratch");
        memset(ad->scr, 0, bytes);
        ad->bytes = bytes;
    }
    return ad->scr;
}

/* d = s (n elements), or zeros for s NULL: a loop, inlined (memcpy's call on 128-byte rows
 * measured slower than the copy) */
static inline void copy_row(bf16 *restrict d, const bf16 *restrict s, int64_t n) {
    if (!s) {
        memset(d, 0, (size_t)n * sizeof *d);
        return;
    }
#pragma omp simd
    for (int64_t c = 0; c < n; c++) d[c] = s[c];
}

/* The chunk's batches b0.. b0 + nbat - 1 and, of batch b, its key/value heads [*k0, *k1): the
 * row loops below walk qkv's rows in memory order (by head, a row 3C apart, every read missed the
 * cache: the gathers took longer than the products) */
static int64_t chunk_b0(const struct ad_geo *g) { return g->g0 / g->NKV; }
static int64_t chunk_nbat(const struct ad_geo *g) {
    return (g->g0 + g->G - 1) / g->NKV - g->g0 / g->NKV + 1;
}
static void chunk_heads(const struct ad_geo *g, int64_t b, int64_t *k0, int64_t *k1) {
    int64_t lo = g->g0 - b * g->NKV, hi = g->g0 + g->G - b * g->NKV;
    *k0 = lo > 0 ? lo : 0;
    *k1 = hi < g->NKV ? hi : g->NKV;
}
/* the row of a query block (G, M, HS) of query head kvh rep + r of batch b, query row i */
static int64_t q_row(const struct ad_geo *g, int64_t b, int64_t kvh, int64_t r, int64_t i) {
    return (b * g->NKV + kvh - g->g0) * g->M + r * BQ + i;
}

/* Kb and Vb (nb, G, BQ, HS) from the chunk's key and value heads of qkv, zero past T */
static void gather_kv(bf16 *Kb, bf16 *Vb, const bf16 *qkv, const struct ad_geo *g) {
    const int64_t b0 = chunk_b0(g), Tp = g->nb * BQ, HS = g->HS;
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < chunk_nbat(g) * Tp; task++) {
        int64_t b = b0 + task / Tp, t = task % Tp, k0, k1;
        chunk_heads(g, b, &k0, &k1);
        const bf16 *row = t < g->T ? qkv + (b * g->T + t) * g->CQ : NULL;
        for (int64_t kvh = k0; kvh < k1; kvh++) {
            int64_t at = ((t / BQ * g->G + b * g->NKV + kvh - g->g0) * BQ + t % BQ) * HS;
            copy_row(Kb + at, row ? row + (g->NH + kvh) * HS : NULL, HS);
            copy_row(Vb + at, row ? row + (g->NH + g->NKV + kvh) * HS : NULL, HS);
        }
    }
}

/* What a pass over a query block's rows does with each row of x (a (B, T, heads, HS) tensor of
 * row stride rs, the query heads first) and its row of the block (G, M, HS) */
enum q_op {
    Q_GATHER, /* b16 row = x row, zero past T */
    Q_STORE,  /* x row = b32 row times w[row], rounded once */
    Q_ADD,    /* x row += b32 row, rounded once */
    Q_DOT,    /* b32[row] = rowsum(x row * y row) in fp32, zero past T */
};
struct q_pass {
    enum q_op op;
    bf16 *x;
    const bf16 *y;
    bf16 *b16;
    float *b32;
    const float *w;
    int64_t rs;
};

static void q_row_op(const struct q_pass *a, int64_t o, int64_t row, int64_t HS) {
    bf16 *x = o < 0 ? NULL : a->x + o;
    const float *f = a->b32 ? a->b32 + row * HS : NULL;
    if (a->op == Q_GATHER) {
        copy_row(a->b16 + row * HS, x, HS);
    } else if (a->op == Q_DOT) {
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int64_t c = 0; c < (x ? HS : 0); c++)
            d += l3d_bf16_widen(x[c]) * l3d_bf16_widen(a->y[o + c]);
        a->b32[row] = d;
    } else if (x && a->op == Q_STORE) {
        const float w = a->w[row];
#pragma omp simd
        for (int64_t c = 0; c < HS; c++) x[c] = l3d_bf16_narrow(f[c] * w);
    } else if (x) {
#pragma omp simd
        for (int64_t c = 0; c < HS; c++) x[c] = l3d_bf16_narrow(l3d_bf16_widen(x[c]) + f[c]);
    }
}

/* a->op on every row of query block qb of the chunk, in x's memory order */
static void q_pass(const struct q_pass *a, int64_t qb, const struct ad_geo *g) {
    const int64_t b0 = chunk_b0(g), HS = g->HS;
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < chunk_nbat(g) * BQ; task++) {
        int64_t b = b0 + task / BQ, i = task % BQ, t = qb * BQ + i, k0, k1;
        chunk_heads(g, b, &k0, &k1);
        for (int64_t kvh = k0; kvh < k1; kvh++)
            for (int64_t r = 0; r < g->rep; r++) {
                int64_t o = t < g->T ? (b * g->T + t) * a->rs + (kvh * g->rep + r) * HS : -1;
                q_row_op(a, o, q_row(g, b, kvh, r, i), HS);
            }
    }
}

/* keys of block kb that query row i of block qb sees: all before the diagonal block, i + 1 on
 * it; none for a row past T */
static int64_t visible(int64_t qb, int64_t kb, int64_t i, int64_t T) {
    if (qb * BQ + i >= T) return 0;
    return kb < qb ? BQ : i + 1;
}

/* the lse index (b, h, t) of row `row` of query block qb, -1 past T */
static int64_t lse_at(int64_t row, int64_t qb, const struct ad_geo *g) {
    int64_t grp = g->g0 + row / g->M, r = row % g->M / BQ, t = qb * BQ + row % BQ;
    if (t >= g->T) return -1;
    int64_t b = grp / g->NKV, h = grp % g->NKV * g->rep + r;
    return (b * g->NH + h) * g->T + t;
}

/* The scratch of a chunk: keys, values and a query block in bf16 (both passes); the forward's
 * scores of a whole row and output block, or the backward's dO block, score and dP blocks, dQ,
 * D and the dK, dV sums */
struct ad_buf {
    bf16 *Kb, *Vb, *Qb, *P, *dOb, *dS;
    float *S, *O, *dP, *dQ, *D, *dK, *dV;
    float *m, *w; /* the forward's rows: integer offset, 1 / sum */
};

static size_t ad_layout(struct ad_buf *w, char *base, const struct ad_geo *g, bool bwd) {
    const size_t kv = (size_t)(g->nb * g->G * BQ * g->HS), q = (size_t)(g->G * g->M * g->HS);
    const size_t blk = (size_t)(g->G * g->M * BQ);
    size_t at = 0;
    memset(w, 0, sizeof *w);
    w->Kb = carve(base, &at, kv * sizeof(bf16));
    w->Vb = carve(base, &at, kv * sizeof(bf16));
    w->Qb = carve(base, &at, q * sizeof(bf16));
    w->P = carve(base, &at, blk * sizeof(bf16));
    if (!bwd) {
        w->S = carve(base, &at, (size_t)g->nb * blk * sizeof(float));
        w->O = carve(base, &at, q * sizeof(float));
        w->m = carve(base, &at, (size_t)(g->G * g->M) * sizeof(float));
        w->w = carve(base, &at, (size_t)(g->G * g->M) * sizeof(float));
        return at;
    }
    w->dOb = carve(base, &at, q * sizeof(bf16));
    w->dS = carve(base, &at, blk * sizeof(bf16));
    w->S = carve(base, &at, blk * sizeof(float));
    w->dP = carve(base, &at, blk * sizeof(float));
    w->dQ = carve(base, &at, q * sizeof(float));
    w->D = carve(base, &at, (size_t)(g->G * g->M) * sizeof(float));
    w->dK = carve(base, &at, kv * sizeof(float));
    w->dV = carve(base, &at, kv * sizeof(float));
    return at;
}

/* a call's tensors: the forward's out and lse from qkv, or the backward's dqkv += from dout,
 * qkv, out and lse */
struct ad_args {
    bf16 *y; /* out, or dqkv */
    float *lse;
    const float *lse_in;
    const bf16 *qkv, *dout, *out;
};

/* ---- forward ------------------------------------------------------------------------------ */

/* Each row of query block qb: its scores (S: key blocks 0..qb of (G, M, BQ)) scaled in place,
 * their offset m[row] = ceil(max s log2 e) and sum l = sum 2^(s log2 e - m) in fp32,
 * lse = m ln 2 + log(l), w[row] = 1 / l */
static void fwd_stats(float *S, float *lse, float *mr, float *wr, int64_t qb,
                      const struct ad_geo *g) {
    const int64_t rows = g->G * g->M, blk = rows * BQ;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        int64_t li = lse_at(row, qb, g), i = row % BQ;
        if (li < 0) continue;
        float mx = -INFINITY, l = 0.0f;
        for (int64_t kb = 0; kb <= qb; kb++) {
            float *s = S + kb * blk + row * BQ;
            int64_t n = visible(qb, kb, i, g->T);
            const float scale = g->scale;
#pragma omp simd reduction(max : mx)
            for (int64_t j = 0; j < n; j++) {
                s[j] *= scale;
                mx = s[j] > mx ? s[j] : mx;
            }
        }
        const float m = l3d_attn_m(mx);
        for (int64_t kb = 0; kb <= qb; kb++) {
            const float *s = S + kb * blk + row * BQ;
            int64_t n = visible(qb, kb, i, g->T);
#pragma omp simd reduction(+ : l)
            for (int64_t j = 0; j < n; j++) l += l3d_attn_p(s[j] * L3D_LOG2E, m);
        }
        lse[li] = m * L3D_LN2 + logf(l);
        mr[row] = m;
        wr[row] = 1.0f / l;
    }
}

/* P (G, M, BQ) bf16 of key block kb: 2^(s log2 e - m) rounded, zero where masked */
static void fwd_probs(bf16 *P, const float *S, const float *mr, int64_t qb, int64_t kb,
                      const struct ad_geo *g) {
    const int64_t rows = g->G * g->M;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        int64_t li = lse_at(row, qb, g), n = li < 0 ? 0 : visible(qb, kb, row % BQ, g->T);
        const float m = li < 0 ? 0.0f : mr[row];
        const float *s = S + row * BQ;
        bf16 *p = P + row * BQ;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) p[j] = l3d_bf16_narrow(l3d_attn_p(s[j] * L3D_LOG2E, m));
        for (int64_t j = n; j < BQ; j++) p[j] = 0;
    }
}



/* the groups g0.. g0 + G - 1 */
static void fwd_chunk(struct l3d_attnd *ad, const struct ad_buf *fb, const struct ad_args *a,
                      const struct ad_geo *gp) {
    const struct ad_geo g = *gp;
    const struct ad_buf f = *fb;
    bf16 *out = a->y;
    float *lse = a->lse;
    const bf16 *qkv = a->qkv;
    const int64_t HS = g.HS;
    struct ad_prim *qk = ad_get(ad, AD_QK, g.G, g.M, HS, BQ);
    struct ad_prim *pv = ad_get(ad, AD_PV, g.G, g.M, BQ, HS);
    const int64_t kvblk = g.G * BQ * HS, blk = g.G * g.M * BQ;
    gather_kv(f.Kb, f.Vb, qkv, &g);
    for (int64_t qb = 0; qb < g.nb; qb++) {
        q_pass(&(struct q_pass){.op = Q_GATHER, .x = (bf16 *)qkv, .b16 = f.Qb, .rs = g.CQ}, qb,
               &g);
        for (int64_t kb = 0; kb <= qb; kb++) ad_run(ad, qk, f.S + kb * blk, f.Qb, f.Kb + kb * kvblk);
        fwd_stats(f.S, lse, f.m, f.w, qb, &g);
        memset(f.O, 0, (size_t)(g.G * g.M * HS) * sizeof(float));
        for (int64_t kb = 0; kb <= qb; kb++) {
            fwd_probs(f.P, f.S + kb * blk, f.m, qb, kb, &g);
            ad_run(ad, pv, f.O, f.P, f.Vb + kb * kvblk);
        }
        q_pass(&(struct q_pass){.op = Q_STORE, .x = out, .b32 = f.O, .w = f.w, .rs = g.C}, qb,
               &g);
    }
}


/* ---- backward ----------------------------------------------------------------------------- */


/* P = exp(scale s - lse) and dS = P (dP - D) scale of key block kb, rounded to bf16 (zero where
 * masked) */
static void bwd_probs(bf16 *P, bf16 *dS, const float *S, const float *dP, const float *D,
                      const float *lse, int64_t qb, int64_t kb, const struct ad_geo *g) {
    const int64_t rows = g->G * g->M;
    const float scale = g->scale;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        int64_t li = lse_at(row, qb, g), n = li < 0 ? 0 : visible(qb, kb, row % BQ, g->T);
        float L = li < 0 ? 0.0f : lse[li], Di = D[row];
        const float *s = S + row * BQ, *dp = dP + row * BQ;
        bf16 *p = P + row * BQ, *ds = dS + row * BQ;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float pj = fast_expf(s[j] * scale - L);
            p[j] = l3d_bf16_narrow(pj);
            ds[j] = l3d_bf16_narrow(pj * (dp[j] - Di) * scale);
        }
        for (int64_t j = n; j < BQ; j++) p[j] = ds[j] = 0;
    }
}


/* dqkv's key and value heads += dK and dV (nb, G, BQ, HS), rounded once */
static void bwd_add_kv(bf16 *dqkv, const float *dK, const float *dV, const struct ad_geo *g) {
    const int64_t b0 = chunk_b0(g), HS = g->HS, T = g->T;
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < chunk_nbat(g) * T; task++) {
        int64_t b = b0 + task / T, t = task % T, k0, k1;
        chunk_heads(g, b, &k0, &k1);
        bf16 *row = dqkv + (b * T + t) * g->CQ;
        for (int64_t kvh = k0; kvh < k1; kvh++) {
            int64_t at = ((t / BQ * g->G + b * g->NKV + kvh - g->g0) * BQ + t % BQ) * HS;
            bf16 *dk = row + (g->NH + kvh) * HS, *dv = row + (g->NH + g->NKV + kvh) * HS;
#pragma omp simd
            for (int64_t c = 0; c < HS; c++) {
                dk[c] = l3d_bf16_narrow(l3d_bf16_widen(dk[c]) + dK[at + c]);
                dv[c] = l3d_bf16_narrow(l3d_bf16_widen(dv[c]) + dV[at + c]);
            }
        }
    }
}


/* the groups g0.. g0 + G - 1 */
static void bwd_chunk(struct l3d_attnd *ad, const struct ad_buf *wb, const struct ad_args *a,
                      const struct ad_geo *gp) {
    const struct ad_geo g = *gp;
    const struct ad_buf w = *wb;
    bf16 *dqkv = a->y;
    const bf16 *dout = a->dout, *qkv = a->qkv, *out = a->out;
    const float *lse = a->lse_in;
    const int64_t HS = g.HS;
    struct ad_prim *qk = ad_get(ad, AD_QK, g.G, g.M, HS, BQ);
    struct ad_prim *pv = ad_get(ad, AD_PV, g.G, g.M, BQ, HS);
    struct ad_prim *tn = ad_get(ad, AD_TN, g.G, BQ, g.M, HS);
    const int64_t kvblk = g.G * BQ * HS, kv = g.nb * kvblk;
    gather_kv(w.Kb, w.Vb, qkv, &g);
    memset(w.dK, 0, (size_t)kv * sizeof(float));
    memset(w.dV, 0, (size_t)kv * sizeof(float));
    for (int64_t qb = 0; qb < g.nb; qb++) {
        q_pass(&(struct q_pass){.op = Q_GATHER, .x = (bf16 *)qkv, .b16 = w.Qb, .rs = g.CQ}, qb,
               &g);
        q_pass(&(struct q_pass){.op = Q_GATHER, .x = (bf16 *)dout, .b16 = w.dOb, .rs = g.C}, qb,
               &g);
        q_pass(&(struct q_pass){.op = Q_DOT, .x = (bf16 *)dout, .y = out, .b32 = w.D, .rs = g.C},
               qb, &g);
        memset(w.dQ, 0, (size_t)(g.G * g.M * HS) * sizeof(float));
        for (int64_t kb = 0; kb <= qb; kb++) {
            const bf16 *K = w.Kb + kb * kvblk, *V = w.Vb + kb * kvblk;
            ad_run(ad, qk, w.S, w.Qb, K);
            ad_run(ad, qk, w.dP, w.dOb, V);
            bwd_probs(w.P, w.dS, w.S, w.dP, w.D, lse, qb, kb, &g);
            ad_run(ad, pv, w.dQ, w.dS, K);
            ad_run(ad, tn, w.dK + kb * kvblk, w.dS, w.Qb);
            ad_run(ad, tn, w.dV + kb * kvblk, w.P, w.dOb);
        }
        q_pass(&(struct q_pass){.op = Q_ADD, .x = dqkv, .b32 = w.dQ, .rs = g.CQ}, qb, &g);
    }
    bwd_add_kv(dqkv, w.dK, w.dV, &g);
}

/* the call, chunk by chunk, in one scratch */
static void ad_call(struct l3d_attnd *ad, const struct ad_args *a, struct ad_geo g, bool bwd) {
    struct ad_buf w;
    ad_layout(&w, ad_scratch(ad, ad_layout(&w, NULL, &g, bwd)), &g, bwd);
    const int64_t Gc = g.G;
    for (g.g0 = 0; g.g0 < g.Gall; g.g0 += Gc) {
        g.G = g.Gall - g.g0 < Gc ? g.Gall - g.g0 : Gc;
        (bwd ? bwd_chunk : fwd_chunk)(ad, &w, a, &g);
    }
}

void l3d_attnd_forward(struct l3d_attnd *ad, bf16 *out, float *lse, const bf16 *qkv, int64_t B,
                       int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    const struct ad_args a = {.y = out, .lse = lse, .qkv = qkv};
    ad_call(ad, &a, ad_geo(B, T, NH, NKV, HS), false);
}

void l3d_attnd_backward(struct l3d_attnd *ad, bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                        const bf16 *out, const float *lse, int64_t B, int64_t T, int64_t NH,
                        int64_t NKV, int64_t HS) {
    const struct ad_args a = {.y = dqkv, .lse_in = lse, .qkv = qkv, .dout = dout, .out = out};
    ad_call(ad, &a, ad_geo(B, T, NH, NKV, HS), true);
}
