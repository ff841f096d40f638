/*
 * The block attention kernels of context parallelism (l3d_be_attention_block_forward, _merge,
 * _block_backward) against a double-precision causal attention with grouped-query heads: the
 * sequence is cut into 2 cp chunks as the ring cuts it, each query chunk's output built from its
 * diagonal block merged with every key chunk before it, and the backward's dq, dk, dv summed over
 * the same blocks with the final out and lse. fp32, bf16 and fp16 tensors, on $L3D_BACKEND.
 *
 * Tolerances: |got - want| <= rtol (|want| + max|want|) over a tensor, as tests/test_kernels.c.
 * fp32 rtol 1e-5 (a few ulp times the depth of the sums). 16-bit: the inputs are rounded to the
 * type before the reference sees them, so the error is the kernels' rounding of their outputs:
 * each merge and each block's += rounds once (unit roundoff u: bf16 2^-8, fp16 2^-11), 2 cp
 * times for a chunk at most (4 with cp 2), hence rtol 8 u.
 *
 * Negative cases: a diagonal block given a query position one too far (each row sees the next
 * token) must fail the same comparison; a key chunk that starts after its query chunk must be
 * refused (the process dies with a message).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"
#include "test.h"

typedef long long ll;

struct shape {
    int64_t B, T, NH, NKV, HS, cp;
};

static double rnd(uint64_t *s) { /* uniform (-1, 1) from a 64-bit LCG, then a sum of 3: ~bell */
    double x = 0.0;
    for (int i = 0; i < 3; i++) {
        *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
        x += (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    }
    return x;
}

static float round_to(enum l3d_dtype dt, float x) {
    if (dt == L3D_BF16) return l3d_bf16_to_f32(l3d_f32_to_bf16(x));
    if (dt == L3D_F16) return l3d_f16_to_f32(l3d_f32_to_f16(x));
    return x;
}

/* host floats <-> device tensors of type dt */
static void *upload(struct l3d_backend *be, enum l3d_dtype dt, const float *h, int64_t n) {
    size_t e = l3d_dtype_size(dt);
    void *d = l3d_be_alloc(be, (size_t)n * e, "test tensor");
    void *tmp = malloc((size_t)n * e);
    L3D_ASSERT(d && tmp);
    for (int64_t i = 0; i < n; i++) {
        if (dt == L3D_F32) ((float *)tmp)[i] = h[i];
        else if (dt == L3D_BF16) ((uint16_t *)tmp)[i] = l3d_f32_to_bf16(h[i]);
        else ((uint16_t *)tmp)[i] = l3d_f32_to_f16(h[i]);
    }
    l3d_be_copy_h2d(be, d, tmp, (size_t)n * e);
    free(tmp);
    return d;
}
static void download(struct l3d_backend *be, enum l3d_dtype dt, float *h, const void *d,
                     int64_t n) {
    size_t e = l3d_dtype_size(dt);
    void *tmp = malloc((size_t)n * e);
    L3D_ASSERT(tmp);
    l3d_be_copy_d2h(be, tmp, d, (size_t)n * e);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == L3D_F32 ? ((float *)tmp)[i]
               : dt == L3D_BF16 ? l3d_bf16_to_f32(((uint16_t *)tmp)[i])
                                : l3d_f16_to_f32(((uint16_t *)tmp)[i]);
    free(tmp);
}

/* Causal attention in double over rows of W = (NH + 2 NKV) HS: out (B,T,NH HS), lse (B,NH,T), and
 * the gradients dqkv (B,T,W) of sum(out * dout). */
static void reference(const struct shape *s, const float *qkv, const float *dout, double *out,
                      double *lse, double *dqkv) {
    int64_t B = s->B, T = s->T, NH = s->NH, HS = s->HS, grp = NH / s->NKV;
    int64_t W = (NH + 2 * s->NKV) * HS, C = NH * HS;
    double scale = 1.0 / sqrt((double)HS), *p = malloc((size_t)T * sizeof(double));
    double *dp = malloc((size_t)T * sizeof(double));
    memset(dqkv, 0, (size_t)(B * T * W) * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *q = qkv + (b * T + i) * W + h * HS;
                int64_t ko = C + h / grp * HS, vo = ko + s->NKV * HS;
                double mx = -INFINITY, sum = 0.0, D = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    const float *k = qkv + (b * T + j) * W + ko;
                    double d = 0.0;
                    for (int64_t c = 0; c < HS; c++) d += (double)q[c] * k[c];
                    p[j] = d * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = 0; j <= i; j++) sum += exp(p[j] - mx);
                lse[(b * NH + h) * T + i] = mx + log(sum);
                double *o = out + (b * T + i) * C + h * HS;
                const float *g = dout + (b * T + i) * C + h * HS;
                for (int64_t c = 0; c < HS; c++) o[c] = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    p[j] = exp(p[j] - mx) / sum;
                    const float *v = qkv + (b * T + j) * W + vo;
                    dp[j] = 0.0;
                    for (int64_t c = 0; c < HS; c++) {
                        o[c] += p[j] * v[c];
                        dp[j] += (double)g[c] * v[c];
                    }
                }
                for (int64_t c = 0; c < HS; c++) D += o[c] * g[c];
                for (int64_t j = 0; j <= i; j++) {
                    double ds = p[j] * (dp[j] - D) * scale;
                    const float *k = qkv + (b * T + j) * W + ko;
                    double *dq = dqkv + (b * T + i) * W + h * HS;
                    double *dk = dqkv + (b * T + j) * W + ko, *dv = dqkv + (b * T + j) * W + vo;
                    for (int64_t c = 0; c < HS; c++) {
                        dq[c] += ds * k[c];
                        dk[c] += ds * q[c];
                        dv[c] += p[j] * g[c];
                    }
                }
            }
    free(p);
    free(dp);
}

/* how many of got's n entries are out of rtol (|want| + max|want|); NaN counts */
static int64_t count_bad(const float *got, const double *want, int64_t n, double rtol,
                         double *worst) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
    int64_t bad = 0;
    *worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double tol = rtol * (fabs(want[i]) + m), err = fabs((double)got[i] - want[i]);
        if (!(err <= tol)) bad++;
        *worst = test_max(*worst, err / tol);
    }
    return bad;
}

/* the geometry of (query chunk qi, key chunk ki) of chunk length c in the full (B,T,W) tensor */
static struct l3d_attn_block geom(const struct shape *s, int64_t c, int64_t qi, int64_t ki,
                                  int64_t shift) {
    int64_t W = (s->NH + 2 * s->NKV) * s->HS, C = s->NH * s->HS;
    return (struct l3d_attn_block){.B = s->B, .NH = s->NH, .NKV = s->NKV, .HS = s->HS, .nq = c,
                                   .nk = c, .q_pos = qi * c + shift, .k_pos = ki * c,
                                   .q_rs = W, .q_bs = s->T * W, .kv_rs = W, .kv_bs = s->T * W,
                                   .o_rs = C, .o_bs = s->T * C, .lse_hs = s->T,
                                   .lse_bs = s->NH * s->T};
}

/* One shape in one type; shift != 0 perturbs the diagonal blocks' query position (the negative
 * case): then the forward must fail. */
static void run_case(struct l3d_backend *be, enum l3d_dtype dt, const struct shape *s,
                     int64_t shift) {
    int64_t B = s->B, T = s->T, NH = s->NH, HS = s->HS, W = (NH + 2 * s->NKV) * HS, C = NH * HS;
    int64_t nc = 2 * s->cp, c = T / nc, nqkv = B * T * W, nout = B * T * C, nlse = B * NH * T;
    size_t e = l3d_dtype_size(dt);
    double u = dt == L3D_F32 ? 0.0 : dt == L3D_BF16 ? 1.0 / 256 : 1.0 / 2048;
    double rtol = dt == L3D_F32 ? 1e-5 : 8 * u;
    char tag[160];
    snprintf(tag, sizeof tag, "%s B=%lld T=%lld NH=%lld NKV=%lld HS=%lld cp=%lld%s",
             l3d_dtype_name(dt), (ll)B, (ll)T, (ll)NH, (ll)s->NKV, (ll)HS, (ll)s->cp,
             shift ? " (diagonal shifted: must fail)" : "");
    uint64_t seed = 12345u + (uint64_t)(T * 131 + NH * 7 + s->NKV);
    float *qkv = malloc((size_t)nqkv * sizeof(float)), *dout = malloc((size_t)nout * 4);
    float *pre = malloc((size_t)nqkv * 4), *got = malloc((size_t)nqkv * 4);
    float *lse_got = malloc((size_t)nlse * 4);
    double *out_ref = malloc((size_t)nout * 8), *lse_ref = malloc((size_t)nlse * 8);
    double *dqkv_ref = malloc((size_t)nqkv * 8), *dgot = malloc((size_t)nqkv * 8);
    for (int64_t i = 0; i < nqkv; i++) qkv[i] = round_to(dt, (float)rnd(&seed));
    for (int64_t i = 0; i < nout; i++) dout[i] = round_to(dt, (float)rnd(&seed));
    for (int64_t i = 0; i < nqkv; i++) pre[i] = round_to(dt, (float)rnd(&seed));
    reference(s, qkv, dout, out_ref, lse_ref, dqkv_ref);

    void *dqkv_d = upload(be, dt, qkv, nqkv), *ddout = upload(be, dt, dout, nout);
    void *dgrad = upload(be, dt, pre, nqkv);
    void *dout_d = l3d_be_alloc(be, (size_t)nout * e, "out"), *part = l3d_be_alloc(be, (size_t)nout * e, "part");
    float *lse_d = l3d_be_alloc(be, (size_t)nlse * 4, "lse"), *lse2 = l3d_be_alloc(be, (size_t)nlse * 4, "lse2");
    l3d_be_memset(be, dout_d, 0xff, (size_t)nout * e); /* NaN: every entry must be written */
    const char *q = dqkv_d;
    /* forward: each query chunk's diagonal block, then every earlier key chunk merged in */
    for (int64_t qi = 0; qi < nc; qi++)
        for (int64_t ki = qi; ki >= 0; ki--) {
            struct l3d_attn_block g = geom(s, c, qi, ki, ki == qi ? shift : 0);
            int64_t oo = qi * c * C, lo = qi * c, qo = qi * c * W, ko = ki * c * W;
            void *o = ki == qi ? (char *)dout_d + oo * (int64_t)e : (char *)part + oo * (int64_t)e;
            float *l = (ki == qi ? lse_d : lse2) + lo;
            l3d_be_attention_block_forward(be, dt, o, l, q + qo * (int64_t)e,
                                           q + (ko + C) * (int64_t)e,
                                           q + (ko + C + s->NKV * HS) * (int64_t)e, &g);
            if (ki != qi)
                l3d_be_attention_merge(be, dt, (char *)dout_d + oo * (int64_t)e, lse_d + lo,
                                       (char *)part + oo * (int64_t)e, lse2 + lo, &g);
        }
    double worst;
    download(be, dt, got, dout_d, nout);
    int64_t bad = count_bad(got, out_ref, nout, rtol, &worst);
    l3d_be_copy_d2h(be, lse_got, lse_d, (size_t)nlse * 4);
    int64_t bad_lse = count_bad(lse_got, lse_ref, nlse, rtol, &worst);
    test_checks++;
    if (shift) { /* the negative case: the leak of the next token must show */
        if (bad == 0) {
            test_failures++;
            fprintf(stderr, "FAIL %s: the output matched the reference\n", tag);
        }
    } else if (bad || bad_lse) {
        test_failures++;
        fprintf(stderr, "FAIL %s forward: %lld of %lld out, %lld of %lld lse out of rtol %.1e\n",
                tag, (ll)bad, (ll)nout, (ll)bad_lse, (ll)nlse, rtol);
    }
    if (!shift) { /* backward over the same blocks with the final out and lse */
        for (int64_t qi = 0; qi < nc; qi++)
            for (int64_t ki = 0; ki <= qi; ki++) {
                struct l3d_attn_block g = geom(s, c, qi, ki, 0);
                int64_t oo = qi * c * C, qo = qi * c * W, ko = ki * c * W;
                char *dg = dgrad;
                l3d_be_attention_block_backward(
                    be, dt, dg + qo * (int64_t)e, dg + (ko + C) * (int64_t)e,
                    dg + (ko + C + s->NKV * HS) * (int64_t)e, (char *)ddout + oo * (int64_t)e,
                    q + qo * (int64_t)e, q + (ko + C) * (int64_t)e,
                    q + (ko + C + s->NKV * HS) * (int64_t)e, (char *)dout_d + oo * (int64_t)e,
                    lse_d + qi * c, &g);
            }
        download(be, dt, got, dgrad, nqkv);
        for (int64_t i = 0; i < nqkv; i++) got[i] -= pre[i]; /* the += contract */
        bad = count_bad(got, dqkv_ref, nqkv, rtol, &worst);
        test_checks++;
        if (bad) {
            test_failures++;
            fprintf(stderr, "FAIL %s backward: %lld of %lld dqkv out of rtol %.1e (worst %.2f)\n",
                    tag, (ll)bad, (ll)nqkv, rtol, worst);
        } else {
            printf("ok %s: worst gradient error %.2f of the tolerance\n", tag, worst);
        }
    }
    l3d_be_free(be, dqkv_d);
    l3d_be_free(be, ddout);
    l3d_be_free(be, dgrad);
    l3d_be_free(be, dout_d);
    l3d_be_free(be, part);
    l3d_be_free(be, lse_d);
    l3d_be_free(be, lse2);
    free(qkv), free(dout), free(pre), free(got), free(lse_got);
    free(out_ref), free(lse_ref), free(dqkv_ref), free(dgot);
}

/* A key chunk after its query chunk must be refused: the child process dies. */
static void refuses_key_chunk_after(struct l3d_backend *be) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct shape s = {1, 8, 1, 1, 4, 2};
        struct l3d_attn_block g = geom(&s, 2, 0, 1, 0); /* keys at 2.., queries at 0.. */
        float *x = l3d_be_alloc(be, 8 * 12 * sizeof(float), "x");
        l3d_be_attention_block_forward(be, L3D_F32, x, x, x, x, x, &g);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

int main(void) {
    /* the flash kernels' block paths (fp32, widened, dot products); oneDNN's numerics on the
     * blocks (the default on AMX): tests/test_attn_split.c */
    setenv("L3D_ATTN_DNNL", "0", 1);
    struct l3d_backend *be = test_backend_init();
    const struct shape shapes[] = {
        {2, 64, 2, 2, 16, 2},   /* GPT-2's heads, one block per chunk */
        {1, 320, 4, 2, 8, 2},   /* grouped-query heads, chunks of 80: partial 64-row blocks */
        {2, 96, 4, 1, 16, 4},   /* one key/value head, cp 4: chunks of 12 */
        {1, 512, 2, 2, 32, 1},  /* cp 1: two chunks of 256, several blocks each */
    };
    const enum l3d_dtype types[] = {L3D_F32, L3D_BF16, L3D_F16};
    setenv("L3D_ATTN_DOT", "1", 1); /* bf16 in dot products where the CPU has them */
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int t = 0; t < 3; t++) run_case(be, types[t], &shapes[i], 0);
    for (int t = 0; t < 3; t++) run_case(be, types[t], &shapes[0], 1);
    /* bf16 ran its products in bf16 dot products above where the CPU has AVX512-BF16 (P and dS
     * rounded to bf16 before their products: within the same 8 u); now the widened fallback
     * (L3D_ATTN_DOT=0), the default and what AVX2 machines run */
    setenv("L3D_ATTN_DOT", "0", 1);
    for (size_t i = 0; i < 2; i++) run_case(be, L3D_BF16, &shapes[i], 0);
    run_case(be, L3D_BF16, &shapes[0], 1);
    unsetenv("L3D_ATTN_DOT");
    refuses_key_chunk_after(be);
    l3d_backend_free(be);
    return TEST_REPORT();
}
