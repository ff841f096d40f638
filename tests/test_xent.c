/*
 * The chunked cross-entropy head (l3d_gpt_xent_rows): the loss, the per-token losses, every
 * parameter gradient and the stage's input gradient a chunk of rows at a time equal the unchunked
 * head's (one chunk of all rows: the logits kept from forward to backward), up to fp32 round-off,
 * for chunk sizes that divide the rows and that do not, over two accumulated micro-batches the
 * second shorter than the planned rows, GPT-2's tied head and Llama's untied one, fp32 and bf16.
 * The comparison rejects a wrong target and a dropped chunk. The activations hold one chunk of
 * logits (their closed form follows), and a forward without targets leaves the last rows'
 * logits, the unchunked head's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/model.h"
#include "support/ref.h"
#include "test.h"

enum { B = 3, T = 7, N = B * T, T2 = 5 }; /* 21 rows; the second micro-batch 15 */

struct run {
    float loss;
    float *losses; /* N per-token losses of the first micro-batch */
    float *grads;  /* every parameter's gradient (fp32), over both micro-batches */
    float *dinput; /* the stage input's gradient of the last micro-batch (a shard without the
                    * embedding: the layers and head only) */
};

static void run_free(struct run *r) {
    free(r->losses), free(r->grads), free(r->dinput);
}

/* The model of cfg and shard sh (xent_rows set) in precision dt, its weights from seed 7 in fp32
 * rounded to dt. */
static struct l3d_gpt *model(struct l3d_backend *be, const struct l3d_model_spec *cfg,
                             struct l3d_shard sh, int64_t xent_rows, enum l3d_dtype dt) {
    sh.xent_rows = xent_rows;
    struct l3d_gpt *m;
    CHECK(l3d_gpt_init_dt(&m, cfg, &sh, be, B, T, L3D_GRADS_FLAT, 1, L3D_RECOMPUTE_NONE, dt) ==
          L3D_OK);
    float *p = malloc((size_t)m->num_params * sizeof(float));
    ref_fill_normal(p, m->num_params, 0.0f, 0.3f, 7, 1);
    float *dev = l3d_be_alloc(be, (size_t)m->num_params * sizeof(float), "test");
    l3d_be_copy_h2d(be, dev, p, (size_t)m->num_params * sizeof(float));
    l3d_be_convert(be, dt, m->params, L3D_F32, dev, m->num_params);
    l3d_be_free(be, dev);
    free(p);
    return m;
}

/* Two micro-batches (B x T, then B x T2) forward and backward, gradients accumulated; tgt_bad:
 * a row of the first micro-batch whose target is changed (-1: none). */
static struct run train2(struct l3d_gpt *m, int tgt_bad) {
    struct run r = {0};
    int32_t inp[N], tgt[N], inp2[N], tgt2[N];
    ref_fill_tokens(inp, N, 0, m->cfg.V, 3, 1);
    ref_fill_tokens(tgt, N, 0, m->cfg.V, 3, 2);
    ref_fill_tokens(inp2, N, 0, m->cfg.V, 4, 1);
    ref_fill_tokens(tgt2, N, 0, m->cfg.V, 4, 2);
    if (tgt_bad >= 0) tgt[tgt_bad] = (tgt[tgt_bad] + 1) % m->cfg.V;
    bool emb = m->shard.has_embedding;
    int64_t C = m->cfg.C, n = m->num_params;
    void *x = NULL;
    if (!emb) { /* a stage input: the same values in every run */
        float *h = malloc((size_t)N * C * sizeof(float));
        ref_fill_normal(h, N * C, 0.0f, 1.0f, 9, 1);
        x = l3d_be_alloc(m->be, (size_t)N * C * sizeof(float), "test");
        l3d_be_copy_h2d(m->be, x, h, (size_t)N * C * sizeof(float));
        free(h);
    }
    l3d_gpt_zero_grad(m);
    float dloss = 1.0f / (float)(N + B * T2);
    for (int k = 0; k < 2; k++) {
        int t = k ? T2 : T;
        if (x) l3d_be_convert(m->be, m->dt, m->input_act, L3D_F32, x, (int64_t)B * t * C);
        float loss = l3d_gpt_forward(m, emb ? (k ? inp2 : inp) : NULL, k ? tgt2 : tgt, B, t);
        if (!k) {
            r.loss = loss;
            r.losses = test_to_host(m->be, m->losses, N);
        }
        l3d_gpt_backward(m, dloss, NULL);
    }
    r.grads = test_to_host(m->be, m->grads, n);
    if (x) {
        float *d = l3d_be_alloc(m->be, (size_t)N * C * sizeof(float), "test");
        l3d_be_convert(m->be, L3D_F32, d, m->dt, m->dinput_act, (int64_t)B * T2 * C);
        r.dinput = test_to_host(m->be, d, (int64_t)B * T2 * C);
        l3d_be_free(m->be, d);
        l3d_be_free(m->be, x);
    }
    return r;
}

/* Whether run a equals the oracle o within tol (relative to each array's largest value; NaN and
 * Inf fail), and says what differs. */
static bool same(const char *tag, const struct run *a, const struct run *o, int64_t n,
                 int64_t ndin, double tol) {
    double dl = fabs((double)a->loss - o->loss) / fabs((double)o->loss);
    double dls = test_rel_diff(a->losses, o->losses, N);
    double dg = test_rel_diff(a->grads, o->grads, n);
    double dd = ndin ? test_rel_diff(a->dinput, o->dinput, ndin) : 0.0;
    bool ok = dl <= tol && dls <= tol && dg <= tol && dd <= tol;
    printf("%s: loss %.2g losses %.2g grads %.2g dinput %.2g (tol %.0e) %s\n", tag, dl, dls, dg,
           dd, tol, ok ? "same" : "differ");
    return ok;
}

/* Chunked runs of cfg's shard sh in dt against the unchunked one: rows that divide N (1, 7) and
 * that do not (4, 5, 20), N itself; a wrong target and a dropped chunk rejected. */
static void check_chunks(struct l3d_backend *be, const struct l3d_model_spec *cfg,
                         struct l3d_shard sh, enum l3d_dtype dt, double tol) {
    struct l3d_gpt *m0 = model(be, cfg, sh, N, dt);
    CHECK(m0->xent_rows == N);
    struct run o = train2(m0, -1);
    int64_t n = m0->num_params, ndin = sh.has_embedding ? 0 : (int64_t)B * T2 * cfg->C;
    const int64_t rows[] = {1, 4, 5, 7, 20, N};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct l3d_gpt *m = model(be, cfg, sh, rows[i], dt);
        CHECK(m->xent_rows == rows[i]);
        /* one chunk of logits in the activations: the unchunked head's less (N - rows) Vl, the
         * closed form within the buffers' alignment */
        int64_t less = (N - rows[i]) * sh.vocab_count * (int64_t)m->es;
        CHECK((int64_t)m0->act_bytes - (int64_t)m->act_bytes >= less - 128 &&
              (int64_t)m0->act_bytes - (int64_t)m->act_bytes <= less + 128);
        struct l3d_shard s2 = sh;
        s2.xent_rows = rows[i];
        size_t want = l3d_gpt_act_bytes_dt(cfg, &s2, B, T, 1, L3D_RECOMPUTE_NONE, true, dt);
        CHECK(m->act_bytes >= want && m->act_bytes <= want + 64 * (size_t)(cfg->L * 13 + 40));
        struct run r = train2(m, -1);
        char tag[96];
        snprintf(tag, sizeof tag, "%s %s rows %lld", cfg->name[0] ? cfg->name : "custom",
                 l3d_dtype_name(dt), (long long)rows[i]);
        CHECK(same(tag, &r, &o, n, ndin, tol));
        if (rows[i] == 5) { /* negative cases: the comparison sees them */
            struct run w = train2(m, 12); /* a wrong target in the third chunk */
            CHECK(!same("  a wrong target", &w, &o, n, ndin, tol));
            run_free(&w);
            w = train2(m, -1); /* the loss without the last chunk's row (its term zeroed) */
            w.losses[N - 1] = 0.0f;
            w.loss = w.loss - o.losses[N - 1] / (float)N;
            CHECK(!same("  a dropped chunk", &w, &o, n, ndin, tol));
            run_free(&w);
        }
        run_free(&r);
        l3d_gpt_free(m);
    }
    run_free(&o);
    l3d_gpt_free(m0);
}

/* A forward without targets: the chunked head leaves the last rows' logits, the unchunked's. */
static void check_no_targets(struct l3d_backend *be, const struct l3d_model_spec *cfg) {
    struct l3d_shard sh = l3d_shard_full(cfg);
    struct l3d_gpt *m0 = model(be, cfg, sh, N, L3D_F32), *m = model(be, cfg, sh, 4, L3D_F32);
    int32_t inp[N];
    ref_fill_tokens(inp, N, 0, cfg->V, 5, 1);
    l3d_gpt_forward(m0, inp, NULL, B, T);
    l3d_gpt_forward(m, inp, NULL, B, T);
    CHECK(m0->logits_row0 == 0 && m->logits_row0 == N - 4);
    int64_t Vp = cfg->Vp;
    float *all = test_to_host(be, m0->logits, N * Vp), *last = test_to_host(be, m->logits, 4 * Vp);
    double d = test_rel_diff(last, all + (N - 4) * Vp, 4 * Vp);
    printf("no targets: the last 4 rows' logits differ by %.2g\n", d);
    CHECK(d <= 1e-6);
    CHECK(!(test_rel_diff(last, all + (N - 5) * Vp, 4 * Vp) <= 1e-6)); /* other rows differ */
    free(all), free(last);
    l3d_gpt_free(m);
    l3d_gpt_free(m0);
}

/* The chunk's rows: the shard's, within 1 .. BT; 0 (the default) all BT rows, unchunked. */
static void check_rows(const struct l3d_model_spec *cfg) {
    struct l3d_shard sh = l3d_shard_full(cfg);
    sh.vocab_count = 50304;
    CHECK(l3d_gpt_xent_rows(&sh, 2048) == 2048);
    CHECK(l3d_gpt_xent_rows(&sh, 2047) == 2047);
    CHECK(l3d_gpt_xent_rows(&sh, 8) == 8);
    sh.xent_rows = 1;
    CHECK(l3d_gpt_xent_rows(&sh, 2048) == 1);
    sh.xent_rows = 100;
    CHECK(l3d_gpt_xent_rows(&sh, 2048) == 100 && l3d_gpt_xent_rows(&sh, 64) == 64);
}

int main(void) {
    struct l3d_backend *be = test_backend_init();
    struct l3d_model_spec g = {.L = 2, .C = 16, .NH = 2, .V = 50, .maxT = 8}; /* Vp 128, tied */
    L3D_ASSERT(l3d_gpt_config_finish(&g) == L3D_OK);
    check_rows(&g);
    check_chunks(be, &g, l3d_shard_full(&g), L3D_F32, 1e-5);
    check_no_targets(be, &g);
    /* Llama: RMSNorm, SwiGLU, the untied head; a last pipeline stage (no embedding: the stage
     * input's gradient compared too; the tp statistics' collectives are tests/cli/xent.sh's) */
    struct l3d_model_spec c = {.L = 2, .C = 16, .NH = 4, .NKV = 2, .V = 50, .maxT = 8, .ffn = 24,
                               .norm_eps = 1e-6f};
    l3d_model_set_arch(&c, L3D_ARCH_LLAMA);
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    struct l3d_shard last = l3d_shard_full(&c);
    last.has_embedding = false;
    last.layer_start = 1;
    last.layer_count = 1;
    check_chunks(be, &c, last, L3D_F32, 1e-5);
    /* bf16: the logits rounded to 16 bits either way, the statistics fp32 (measured: 8e-8; a
     * product blocked otherwise for fewer rows may move a logit's rounding by a unit) */
    check_chunks(be, &c, l3d_shard_full(&c), L3D_BF16, 1e-3);
    l3d_backend_free(be);
    return TEST_REPORT();
}
