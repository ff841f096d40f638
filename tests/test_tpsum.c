/*
 * The fp32 tensor-parallel sums (--tp-reduce-dtype fp32, src/model/tpsum.c) against an exact
 * oracle: bf16 operands that are multiples of 1/8 below 1 in size, so that every product and
 * every sum of this size is exact in fp32, and the other ranks' partial sums (which the fake TP
 * hooks add) multiples of 1/256: the fp32 path must give the exact sum rounded to bf16 once, bit
 * for bit. Forward the row-parallel product with its bias (on the rank that adds it; under
 * sequence parallelism on this rank's rows), backward the column-parallel input gradient in two
 * chunks of rows (the head's way). The hooks must see fp32 buffers.
 * Negative cases: the default's rounding (each partial to bf16, then the sum) gives other bits
 * for some elements, which the same comparison rejects; the buffers' bytes are 0 in fp32 or with
 * the flag off, and the model's closed form counts them.
 */
#include <stdlib.h>
#include <string.h>

#include "llm3d/backend.h"
#include "llm3d/model.h"
#include "model/tpsum.h"
#include "test.h"

enum { B = 2, T = 8, N = B * T };

/* The fake TP group: adds the other ranks' partial `other` (fp32) to what this rank sums. */
struct fake_tp {
    struct l3d_backend *be;
    const float *other;
    int sp_rank, calls, open; /* open: begun and not yet ended */
    enum l3d_dtype seen;
};

static void fake_add(struct fake_tp *f, void *dev, const float *add, int64_t n) {
    float *h = malloc((size_t)n * sizeof(float));
    l3d_be_copy_d2h(f->be, h, dev, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] += add[i];
    l3d_be_copy_h2d(f->be, dev, h, (size_t)n * sizeof(float));
    l3d_be_sync(f->be);
    free(h);
}

static void fake_sum(void *ctx, void *buf, int64_t n, enum l3d_dtype dt) {
    struct fake_tp *f = ctx;
    f->seen = dt;
    f->calls++;
    if (dt == L3D_F32) fake_add(f, buf, f->other, n);
}

/* The non-blocking form: the sum at begin, nothing left for end (which must come once). */
static void fake_begin(void *ctx, void *buf, int64_t n, enum l3d_dtype dt) {
    fake_sum(ctx, buf, n, dt);
    ((struct fake_tp *)ctx)->open++;
}

static void fake_end(void *ctx) { ((struct fake_tp *)ctx)->open--; }

static void fake_scatter(void *ctx, const void *full, void *local, int64_t n, enum l3d_dtype dt) {
    struct fake_tp *f = ctx;
    f->seen = dt;
    f->calls++;
    if (dt != L3D_F32) return;
    l3d_be_copy_d2d(f->be, local, (const float *)full + f->sp_rank * n,
                    (size_t)n * sizeof(float));
    fake_add(f, local, f->other, n);
}

/* n bf16 multiples of 1/8 in [-1, 1] (exact), from a fixed sequence. */
static void fill8(uint16_t *x, int64_t n, unsigned seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = l3d_f32_to_bf16((float)((int)((seed >> 16) % 17) - 8) / 8.0f);
    }
}

static void *dev16(struct l3d_backend *be, const uint16_t *h, int64_t n) {
    void *d = l3d_be_alloc(be, (size_t)n * 2, "test");
    l3d_be_copy_h2d(be, d, h, (size_t)n * 2);
    return d;
}

/* A model shell holding only what the fp32 sums read: the spec, the shard, the backend, the
 * batch shape and the type. */
static struct l3d_gpt *shell(struct l3d_backend *be, const struct l3d_model_spec *cfg, int sp,
                             int sp_rank, bool adds_bias, struct fake_tp *f) {
    struct l3d_gpt *m = calloc(1, sizeof *m);
    m->cfg = *cfg;
    m->shard = l3d_shard_full(cfg);
    m->shard.sp_size = sp;
    m->shard.sp_rank = sp_rank;
    m->shard.adds_row_bias = adds_bias;
    m->shard.tp_reduce_f32 = true;
    m->be = be;
    m->Bmax = B;
    m->Tmax = T;
    m->dt = L3D_BF16;
    m->es = 2;
    m->hooks = (struct l3d_gpt_hooks){.ctx = f, .tp_all_reduce = fake_sum,
                                      .tp_all_reduce_begin = fake_begin,
                                      .tp_all_reduce_end = fake_end,
                                      .tp_reduce_scatter = fake_scatter};
    L3D_ASSERT(l3d_tpsum_init(m) == L3D_OK && l3d_tpsum_on(m));
    return m;
}

/* part (rows, C) = b + sum_k a[r0 + r, k] w(c, k) in double, the operands bf16 with K columns
 * of a; w(c, k) at w[c sc + k sk]; b may be NULL. */
static void ref_sum(double *part, const uint16_t *a, const uint16_t *w, const uint16_t *b,
                    int64_t r0, int64_t rows, int64_t C, int64_t K, int64_t sc, int64_t sk) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < C; c++) {
            double s = b ? l3d_bf16_to_f32(b[c]) : 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (double)l3d_bf16_to_f32(a[(r0 + r) * K + k]) *
                     l3d_bf16_to_f32(w[c * sc + k * sk]);
            part[r * C + c] = s;
        }
}

/* The other ranks' partial: n multiples of 1/256 in [-off/256, off/256]. */
static void fill_other(float *x, int64_t n, int mul, int off) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(i * mul % (2 * off + 1)) - off) / 256.0f;
}

/* Counts of the rows (this rank's) where got differs from round(exact) and where the default's
 * two roundings round(round(part) + round(other)) do; part and other fp32 (exact), n elements. */
static void compare(const uint16_t *got, const double *part, const float *other, int64_t n,
                    int *fp32_bad, int *default_bad) {
    *fp32_bad = *default_bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t want = l3d_f32_to_bf16((float)(part[i] + other[i]));
        float p16 = l3d_bf16_to_f32(l3d_f32_to_bf16((float)part[i]));
        float o16 = l3d_bf16_to_f32(l3d_f32_to_bf16(other[i]));
        *fp32_bad += got[i] != want;
        *default_bad += l3d_f32_to_bf16(p16 + o16) != want;
    }
}

/* The n bf16 results at dev against round(part + other), bit for bit, and the default's rounding
 * against the same (it must differ: the comparison can fail). */
static void check_out(struct l3d_backend *be, const void *dev, const double *part,
                      const float *other, int64_t n, const char *what) {
    uint16_t *out = malloc((size_t)n * 2);
    l3d_be_copy_d2h(be, out, dev, (size_t)n * 2);
    l3d_be_sync(be);
    int bad, dflt;
    compare(out, part, other, n, &bad, &dflt);
    fprintf(stderr, "%s: %d of %lld elements off; the default's rounding: %d\n", what, bad,
            (long long)n, dflt);
    CHECK(bad == 0);
    CHECK(dflt > 0); /* negative: the comparison tells the two roundings apart */
    free(out);
}

/* Row-parallel: out = round(inp w^T + b + other), N or (SP) N / 2 rows; without SP the bias
 * only where the rank adds the row biases (under SP each rank on its own rows). */
static void test_row(struct l3d_backend *be, const struct l3d_model_spec *cfg, int sp,
                     bool adds_bias) {
    const int64_t C = cfg->C, Cin = cfg->ffn, rows = N / sp, r0 = (sp - 1) * rows;
    uint16_t *inp = malloc(N * Cin * 2), *w = malloc(C * Cin * 2);
    uint16_t b[64];
    float *other = malloc(rows * C * sizeof(float));
    double *part = malloc(rows * C * sizeof(double));
    fill8(inp, N * Cin, 1);
    fill8(w, C * Cin, 2);
    fill8(b, C, 3);
    fill_other(other, rows * C, 37, 20);
    ref_sum(part, inp, w, adds_bias || sp > 1 ? b : NULL, r0, rows, C, Cin, Cin, 1);
    struct fake_tp f = {.be = be, .other = other, .sp_rank = sp - 1};
    struct l3d_gpt *m = shell(be, cfg, sp, sp - 1, adds_bias, &f);
    void *di = dev16(be, inp, N * Cin), *dw = dev16(be, w, C * Cin), *db = dev16(be, b, C);
    void *dout = l3d_be_alloc(be, (size_t)(rows * C) * 2, "test");
    l3d_be_memset(be, dout, 0xff, (size_t)(rows * C) * 2); /* NaN: what is not written */
    l3d_tpsum_row_forward(m, dout, di, dw, db, N, Cin);
    char what[64];
    snprintf(what, sizeof what, "row-parallel, sp %d, bias %d", sp, adds_bias);
    check_out(be, dout, part, other, rows * C, what);
    CHECK(f.calls == 1 && f.seen == L3D_F32);
    void *bufs[4] = {di, dw, db, dout};
    for (int i = 0; i < 4; i++) l3d_be_free(be, bufs[i]);
    l3d_tpsum_free(m);
    free(m);
    free(inp), free(w), free(other), free(part);
}

/* Column-parallel: dinp = round(dout w + other), in two chunks of rows; twice, the second pass
 * on the first's buffers (it starts from a zeroed sum), its sum begun and ended (without SP).
 * OC: q|k|v's 3 C, or the head's vocabulary, wider than the widened operand's N rows hold
 * (blocks of a few rows). */
static void test_col(struct l3d_backend *be, const struct l3d_model_spec *cfg, int sp,
                     int64_t OC) {
    const int64_t C = cfg->C, rows = N / sp, r0 = (sp - 1) * rows, n1 = 6;
    uint16_t *dout = malloc(N * OC * 2), *w = malloc(OC * C * 2);
    float *other = malloc(rows * C * sizeof(float));
    double *part = malloc(rows * C * sizeof(double));
    fill8(dout, N * OC, 4);
    fill8(w, OC * C, 5);
    fill_other(other, rows * C, 29, 21);
    ref_sum(part, dout, w, NULL, r0, rows, C, OC, 1, C);
    struct fake_tp f = {.be = be, .other = other, .sp_rank = sp - 1};
    struct l3d_gpt *m = shell(be, cfg, sp, sp - 1, false, &f);
    void *dd = dev16(be, dout, N * OC), *dw = dev16(be, w, OC * C);
    void *dinp = l3d_be_alloc(be, (size_t)(rows * C) * 2, "test");
    for (int pass = 0; pass < 2; pass++) {
        l3d_be_memset(be, dinp, 0xff, (size_t)(rows * C) * 2); /* NaN: what is not written */
        l3d_tpsum_zero(m, N);
        l3d_tpsum_dinp(m, 0, n1, dd, dw, C, OC, true);
        l3d_tpsum_dinp(m, n1, N - n1, (const uint16_t *)dd + n1 * OC, dw, C, OC, false);
        if (pass == 0 || !l3d_tpsum_reduce_begin(m, N)) /* pass 1: the non-blocking form */
            l3d_tpsum_reduce(m, dinp, N);
        else
            l3d_tpsum_reduce_end(m, dinp, N);
        CHECK(f.open == 0);
        char what[64];
        snprintf(what, sizeof what, "column-parallel, OC %lld, sp %d, pass %d", (long long)OC,
                 sp, pass);
        check_out(be, dinp, part, other, rows * C, what);
        CHECK(f.calls == pass + 1 && f.seen == L3D_F32);
    }
    l3d_be_free(be, dd);
    l3d_be_free(be, dw);
    l3d_be_free(be, dinp);
    l3d_tpsum_free(m);
    free(m);
    free(dout), free(w), free(other), free(part);
}

/* The buffers' bytes: none in fp32 or without the flag; in the model's closed form. */
static void test_bytes(const struct l3d_model_spec *cfg) {
    struct l3d_shard sh = l3d_shard_full(cfg);
    CHECK(l3d_tpsum_act_bytes(cfg, &sh, B, T, L3D_BF16) == 0);
    sh.tp_reduce_f32 = true;
    size_t b16 = l3d_tpsum_act_bytes(cfg, &sh, B, T, L3D_BF16);
    CHECK(b16 > (size_t)N * cfg->C * 4);
    CHECK(l3d_tpsum_act_bytes(cfg, &sh, B, T, L3D_F32) == 0);
    struct l3d_shard off = sh;
    off.tp_reduce_f32 = false;
    size_t with = l3d_gpt_act_bytes_dt(cfg, &sh, B, T, 1, L3D_RECOMPUTE_NONE, true, L3D_BF16);
    size_t without = l3d_gpt_act_bytes_dt(cfg, &off, B, T, 1, L3D_RECOMPUTE_NONE, true, L3D_BF16);
    CHECK(with - without == b16);
}

int main(void) {
    struct l3d_backend *be = test_backend_init();
    /* a vocabulary of 1000: the head's gradient passes the widened operand in blocks of 2 rows */
    struct l3d_model_spec cfg = {.L = 1, .C = 32, .NH = 4, .V = 1000, .maxT = T};
    L3D_ASSERT(l3d_gpt_config_finish(&cfg) == L3D_OK);
    test_bytes(&cfg);
    for (int sp = 1; sp <= 2; sp++) {
        test_row(be, &cfg, sp, true);
        if (sp == 1) test_row(be, &cfg, sp, false);
        test_col(be, &cfg, sp, 3 * cfg.C);
        test_col(be, &cfg, sp, cfg.Vp);
    }
    l3d_backend_free(be);
    return TEST_REPORT();
}
