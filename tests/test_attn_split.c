/*
 * bf16 attention's numerics on every CPU path (src/backend/cpu_attn16.h, l3d_attn_p): the whole
 * sequence's attention (cpu_attnd.c, oneDNN's matmuls on AMX, the default there), the context-
 * parallel ring's block kernels (the sequence cut into nc chunks as tests/test_attn_block.c cuts
 * it: each query chunk's diagonal block merged with every key chunk before it, the backward over
 * the same blocks with the final out and lse) in bf16 and in fp32 on the widened values with
 * p16 (cp.c's --cp-reduce-dtype fp32), and the KV cache (l3d_be_attention_cached, one row at a
 * time), all through the CPU backend ($L3D_BACKEND: also under the checking one) with L3D_ATTN_DNNL=1 (the flash kernels everywhere where
 * oneDNN has no bf16 matmul: then the same comparisons hold, without the negative case's premise).
 *
 * Every path rounds each probability P to the same bf16 value (2^(s log2 e - m) for any integer
 * offset m: l3d_attn_p), so they differ only by the order of their fp32 sums and by where they
 * round their outputs:
 *   - the fp32 ring's output (rounded once, as the whole sequence's) and the KV cache's equal
 *     the whole sequence's output in all but a few elements (a sum within fp32 round-off of a
 *     bf16 rounding boundary, or a score whose P rounds the other way): at most 1% of them, and
 *     every element within one bf16 unit (2^-7 |y|, plus 2^-12 of the tensor's largest);
 *   - the bf16 ring rounds each block's output and each merge (as before): within 8 u of the
 *     whole sequence's output (u = 2^-8; test_attn_block's bound against float64);
 *   - the backward (P and dS rounded for their products) of the fp32 ring, given the output
 *     rounded to bf16 as cp.c gives it: at most 1% of the elements other than the whole
 *     sequence's, every one within 2^-7 of the tensor's largest.
 * Against float64 (ref_attention_forward): every path's output within 8 u (|want| + max|want|).
 * Negative cases: the fp32 ring WITHOUT p16 (the fp32 kernels' unrounded P, what cp.c ran before)
 * differs from the whole sequence's output and gradients in more than 2% of the elements where
 * oneDNN runs the whole sequence (measured 33-51%); and the cache given one key perturbed must
 * fail the 1% count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/backend.h"
#include "support/ref.h"
#include "test.h"

typedef long long ll;

struct shape {
    int64_t B, T, NH, NKV, HS, nc;
};

struct run {
    float *out, *lse, *dqkv; /* out and dqkv read back as fp32 (from bf16 or fp32) */
};

static int64_t n_qkv(const struct shape *s) { return s->B * s->T * (s->NH + 2 * s->NKV) * s->HS; }
static int64_t n_out(const struct shape *s) { return s->B * s->T * s->NH * s->HS; }
static int64_t n_lse(const struct shape *s) { return s->B * s->NH * s->T; }

static float r16(float x) { return l3d_bf16_widen(l3d_bf16_narrow(x)); }

/* a device tensor of type dt from host floats (bf16: the values are bf16's), or host floats from
 * one, through host staging (the checking backend's device memory is not the host's) */
static void *up(struct l3d_backend *be, enum l3d_dtype dt, const float *h, int64_t n) {
    size_t e = l3d_dtype_size(dt);
    void *d = l3d_be_alloc(be, (size_t)n * e, "test tensor"), *tmp = malloc((size_t)n * e);
    for (int64_t i = 0; i < n; i++)
        if (dt == L3D_F32) ((float *)tmp)[i] = h[i];
        else ((uint16_t *)tmp)[i] = l3d_bf16_narrow(h[i]);
    l3d_be_copy_h2d(be, d, tmp, (size_t)n * e);
    free(tmp);
    return d;
}
static void down(struct l3d_backend *be, enum l3d_dtype dt, float *h, const void *d, int64_t n) {
    size_t e = l3d_dtype_size(dt);
    void *tmp = malloc((size_t)n * e);
    l3d_be_copy_d2h(be, tmp, d, (size_t)n * e);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == L3D_F32 ? ((float *)tmp)[i] : l3d_bf16_widen(((uint16_t *)tmp)[i]);
    free(tmp);
}

static void run_alloc(struct run *r, const struct shape *s) {
    r->out = malloc((size_t)n_out(s) * sizeof(float));
    r->lse = calloc((size_t)n_lse(s), sizeof(float));
    r->dqkv = malloc((size_t)n_qkv(s) * sizeof(float));
}
static void run_free(struct run *r) { free(r->out), free(r->lse), free(r->dqkv); }

/* the whole sequence in bf16 (l3d_be_attention_forward / _backward): dqkv = pre + gradients */
static void whole(struct l3d_backend *be, struct run *r, const struct shape *s, const float *qkv,
                  const float *dout, const float *pre) {
    const int64_t nq = n_qkv(s), no = n_out(s);
    void *x = up(be, L3D_BF16, qkv, nq), *g = up(be, L3D_BF16, dout, no);
    void *d = up(be, L3D_BF16, pre, nq), *o = up(be, L3D_BF16, dout, no);
    float *L = up(be, L3D_F32, r->lse, n_lse(s)); /* (its values overwritten) */
    l3d_be_attention_forward(be, L3D_BF16, o, L, x, s->B, s->T, s->NH, s->NKV, s->HS);
    l3d_be_attention_backward(be, L3D_BF16, d, g, x, o, L, s->B, s->T, s->NH, s->NKV, s->HS);
    down(be, L3D_BF16, r->out, o, no);
    down(be, L3D_BF16, r->dqkv, d, nq);
    down(be, L3D_F32, r->lse, L, n_lse(s));
    l3d_be_free(be, x), l3d_be_free(be, g), l3d_be_free(be, d), l3d_be_free(be, o);
    l3d_be_free(be, L);
}

/* (query chunk qi, key chunk ki) of chunk length c, q|k|v in one (B, T, W) tensor */
static struct l3d_attn_block geom(const struct shape *s, int64_t c, int64_t qi, int64_t ki,
                                  bool p16) {
    int64_t W = (s->NH + 2 * s->NKV) * s->HS, C = s->NH * s->HS;
    return (struct l3d_attn_block){.B = s->B, .NH = s->NH, .NKV = s->NKV, .HS = s->HS, .nq = c,
                                   .nk = c, .q_pos = qi * c, .k_pos = ki * c, .q_rs = W,
                                   .q_bs = s->T * W, .kv_rs = W, .kv_bs = s->T * W, .o_rs = C,
                                   .o_bs = s->T * C, .lse_hs = s->T, .lse_bs = s->NH * s->T,
                                   .p16 = p16};
}

/* the element offset of a block's q, k or v (which 0, 1, 2) in the (B, T, W) tensor */
static int64_t qkv_at(const struct shape *s, int64_t c, int64_t chunk, int which) {
    int64_t W = (s->NH + 2 * s->NKV) * s->HS, C = s->NH * s->HS;
    return chunk * c * W + (which == 0 ? 0 : C + (which - 1) * s->NKV * s->HS);
}

/* The ring's forward in type dt: every query chunk's diagonal block, then the key chunks before
 * it merged in */
static void ring_forward(struct l3d_backend *be, enum l3d_dtype dt, bool p16, const struct shape *s,
                         char *x, char *o, float *lse, char *part, float *lse2) {
    const int64_t c = s->T / s->nc, C = s->NH * s->HS, e = (int64_t)l3d_dtype_size(dt);
    for (int64_t qi = 0; qi < s->nc; qi++)
        for (int64_t ki = qi; ki >= 0; ki--) {
            struct l3d_attn_block g = geom(s, c, qi, ki, p16);
            int64_t oo = qi * c * C * e;
            l3d_be_attention_block_forward(be, dt, (ki == qi ? o : part) + oo,
                                           (ki == qi ? lse : lse2) + qi * c,
                                           x + qkv_at(s, c, qi, 0) * e,
                                           x + qkv_at(s, c, ki, 1) * e,
                                           x + qkv_at(s, c, ki, 2) * e, &g);
            if (ki != qi)
                l3d_be_attention_merge(be, dt, o + oo, lse + qi * c, part + oo, lse2 + qi * c, &g);
        }
}

/* The ring in type dt (fp32: the bf16 values widened), p16 as cp.c sets it: out, lse and
 * dqkv = pre + the gradients over the same blocks */
static void ring(struct l3d_backend *be, enum l3d_dtype dt, bool p16, struct run *r,
                 const struct shape *s, const float *qkv, const float *dout, const float *pre) {
    const int64_t nq = n_qkv(s), no = n_out(s), c = s->T / s->nc, e = (int64_t)l3d_dtype_size(dt);
    const int64_t C = s->NH * s->HS;
    char *x = up(be, dt, qkv, nq), *g = up(be, dt, dout, no), *d = up(be, dt, pre, nq);
    char *o = up(be, dt, dout, no), *part = up(be, dt, dout, no);
    float *L = up(be, L3D_F32, r->lse, n_lse(s)), *L2 = up(be, L3D_F32, r->lse, n_lse(s));
    ring_forward(be, dt, p16, s, x, o, L, part, L2);
    down(be, dt, r->out, o, no);
    if (dt == L3D_F32) { /* the backward reads the output in the model's type, as cp.c's */
        float *o16 = malloc((size_t)no * sizeof(float));
        for (int64_t i = 0; i < no; i++) o16[i] = r16(r->out[i]);
        l3d_be_free(be, o);
        o = up(be, dt, o16, no);
        free(o16);
    }
    for (int64_t qi = 0; qi < s->nc; qi++)
        for (int64_t ki = 0; ki <= qi; ki++) {
            struct l3d_attn_block b = geom(s, c, qi, ki, p16);
            int64_t oo = qi * c * C * e;
            l3d_be_attention_block_backward(
                be, dt, d + qkv_at(s, c, qi, 0) * e, d + qkv_at(s, c, ki, 1) * e,
                d + qkv_at(s, c, ki, 2) * e, g + oo, x + qkv_at(s, c, qi, 0) * e,
                x + qkv_at(s, c, ki, 1) * e, x + qkv_at(s, c, ki, 2) * e, o + oo,
                L + qi * c, &b);
        }
    down(be, dt, r->dqkv, d, nq);
    down(be, L3D_F32, r->lse, L, n_lse(s));
    l3d_be_free(be, x), l3d_be_free(be, g), l3d_be_free(be, d), l3d_be_free(be, o);
    l3d_be_free(be, part), l3d_be_free(be, L), l3d_be_free(be, L2);
}

/* the KV cache's forward, one row at a time per sequence (generation's steps) */
static void cached(struct l3d_backend *be, float *out, const struct shape *s, const float *qkv) {
    const int64_t W = (s->NH + 2 * s->NKV) * s->HS, C = s->NH * s->HS, T = s->T;
    uint16_t *x = up(be, L3D_BF16, qkv, n_qkv(s)), *o = up(be, L3D_BF16, out, n_out(s));
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t i = 0; i < T; i++) {
            const uint16_t *row = x + b * T * W;
            l3d_be_attention_cached(be, L3D_BF16, o + (b * T + i) * C, row + i * W, row + C,
                                    row + C + s->NKV * s->HS, i, 1, s->NH, s->NKV, s->HS, W, W);
        }
    down(be, L3D_BF16, out, o, n_out(s));
    l3d_be_free(be, x), l3d_be_free(be, o);
}

/* the fraction of got's n elements that differ from want as bf16 (got rounded), and whether all
 * lie within one bf16 unit (2^-7 |want| + 2^-12 max |want|); NaN fails */
static double differ(const float *got, const float *want, int64_t n, bool *within) {
    double mx = 0.0;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) mx = fabs(want[i]) > mx ? fabs(want[i]) : mx;
    *within = true;
    for (int64_t i = 0; i < n; i++) {
        float g = r16(got[i]);
        if (!(g == want[i])) k++;
        if (!(fabs((double)got[i] - want[i]) <= 0x1p-7 * fabs(want[i]) + 0x1p-12 * mx))
            *within = false;
    }
    return (double)k / (double)n;
}

/* whether every |got - want| <= tol (|want| + max |want|) (0: relative to the largest only) */
static bool close_to(const float *got, const double *want, int64_t n, double tol, bool rel) {
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fabs(want[i]) > mx ? fabs(want[i]) : mx;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * ((rel ? fabs(want[i]) : 0.0) + mx)))
            return false;
    return true;
}

/* the float64 forward of the bf16 values (ref_attention_forward on the expanded heads) */
static double *reference(const struct shape *s, const float *qkv) {
    const int64_t nq = n_qkv(s), B = s->B, T = s->T, NH = s->NH;
    double *x = malloc((size_t)nq * sizeof(double)), *full = malloc((size_t)(B * T * 3 * NH * s->HS) * sizeof(double));
    double *out = malloc((size_t)n_out(s) * sizeof(double));
    ref_to_double(x, qkv, nq);
    ref_gqa_expand(full, x, B, T, NH, s->NKV, s->HS);
    ref_attention_forward(out, NULL, full, B, T, NH, s->HS);
    free(x), free(full);
    return out;
}

static double *widen(const float *f, int64_t n) {
    double *d = malloc((size_t)n * sizeof(double));
    ref_to_double(d, f, n);
    return d;
}

/* bf16 values: qkv and dout of standard deviation 1 (qkv's scaled 2x: peaked rows), pre 0.5 */
static float *bf16_values(int64_t n, float stdv, uint64_t seed) {
    float *f = malloc((size_t)n * sizeof(float));
    ref_fill_normal(f, n, 0.0f, stdv, seed, 1);
    for (int64_t i = 0; i < n; i++) f[i] = r16(f[i]);
    return f;
}

/* One shape: every path against the whole sequence's and float64; amx: the whole sequence runs
 * oneDNN's matmuls (the negative case's premise) */
static void test_shape(struct l3d_backend *be, bool amx, const struct shape *s, uint64_t seed) {
    const int64_t nq = n_qkv(s), no = n_out(s);
    float *qkv = bf16_values(nq, 2.0f, seed), *dout = bf16_values(no, 1.0f, seed + 1);
    float *pre = bf16_values(nq, 0.5f, seed + 2), *kv = malloc((size_t)no * sizeof(float));
    double *ref = reference(s, qkv);
    struct run w, r32, r16b, raw;
    run_alloc(&w, s), run_alloc(&r32, s), run_alloc(&r16b, s), run_alloc(&raw, s);
    whole(be, &w, s, qkv, dout, pre);
    ring(be, L3D_F32, amx, &r32, s, qkv, dout, pre);
    ring(be, L3D_BF16, false, &r16b, s, qkv, dout, pre);
    ring(be, L3D_F32, false, &raw, s, qkv, dout, pre);
    cached(be, kv, s, qkv);
    bool in32, inkv, inraw;
    double f32 = differ(r32.out, w.out, no, &in32), fkv = differ(kv, w.out, no, &inkv);
    double fraw = differ(raw.out, w.out, no, &inraw);
    printf("B=%lld T=%lld NH=%lld NKV=%lld HS=%lld cp chunks %lld: outputs other than the whole "
           "sequence's: fp32 ring %.4f, KV cache %.4f, fp32 ring without p16 %.4f\n", (ll)s->B,
           (ll)s->T, (ll)s->NH, (ll)s->NKV, (ll)s->HS, (ll)s->nc, f32, fkv, fraw);
    bool ing;
    double g32 = differ(r32.dqkv, w.dqkv, nq, &ing), graw = differ(raw.dqkv, w.dqkv, nq, &inraw);
    printf("  gradients other than the whole sequence's: fp32 ring %.4f, without p16 %.4f\n", g32,
           graw);
    CHECK(g32 <= 0.01); /* (ing: a gradient's cancellations make a unit of it too tight) */
    if (amx) CHECK(graw > 0.02);
    CHECK(f32 <= 0.01 && in32);
    CHECK(fkv <= 0.01 && inkv);
    if (amx) CHECK(fraw > 0.02); /* negative: the unrounded P is told apart */
    double *wo = widen(w.out, no), *wd = widen(w.dqkv, nq);
    CHECK(close_to(r16b.out, wo, no, 8.0 / 256, true));
    CHECK(close_to(r32.dqkv, wd, nq, 1.0 / 128, false));
    CHECK(close_to(r16b.dqkv, wd, nq, 8.0 / 256, false));
    const float *paths[] = {w.out, r32.out, r16b.out, kv};
    for (int k = 0; k < 4; k++) CHECK(close_to(paths[k], ref, no, 8.0 / 256, true));
    /* negative: one key perturbed, the cache's output no longer the whole sequence's */
    qkv[s->NH * s->HS + 3] += 0.5f;
    cached(be, kv, s, qkv);
    CHECK(differ(kv, w.out, no, &inkv) > 0.01 || !inkv);
    run_free(&w), run_free(&r32), run_free(&r16b), run_free(&raw);
    free(qkv), free(dout), free(pre), free(kv), free(ref), free(wo), free(wd);
}

int main(void) {
    setenv("L3D_ATTN_DOT", "0", 1); /* the flash kernels' widened path where oneDNN is absent */
    setenv("L3D_ATTN_DNNL", "1", 1); /* oneDNN's matmuls for the whole sequence where it has them */
    struct l3d_backend *be = test_backend_init();
    bool amx = l3d_be_attention_native(be, L3D_BF16);
    printf("bf16 attention through oneDNN's matmuls: %s\n", amx ? "yes" : "no (flash kernels)");
    /* B, T, NH, NKV, HS, chunks: GPT-2's heads over 4 chunks of 64; grouped heads, chunks of 100
     * (partial 64-row blocks); multi-query, chunks of 24 */
    const struct shape sh[] = {{2, 256, 4, 4, 64, 4}, {1, 200, 6, 2, 32, 2}, {2, 96, 4, 1, 16, 4}};
    for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++) test_shape(be, amx, &sh[k], 100 + 10 * k);
    l3d_backend_free(be);
    return TEST_REPORT();
}
