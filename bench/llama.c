/* The Llama blocks' kernels through the backend ($L3D_BACKEND, default cpu), on the current
 * OpenMP thread count, next to the GPT-2 kernels they replace, at the shapes of the issue's
 * benchmark model (GPT-2 124M's size: C 768, 12 query heads of 64, 4 KV heads, SwiGLU hidden
 * 2048) and N = B*T rows:
 *   - RMSNorm vs LayerNorm, SwiGLU vs GELU (4C), RoPE: forward and backward, in ms and in GB/s of
 *     the bytes each must move at least (inputs read once, outputs written once), against STREAM's
 *     triad bandwidth measured here (these kernels are memory-bound);
 *   - the tiled attention forward + backward with 12 KV heads (multi-head) and with 4 (GQA): the
 *     time per query head should not grow.
 * Each figure is the median of the passes run in about SECONDS.
 *   l3d_bench_llama [B] [T] [SECONDS] [fp32|bf16|fp16]     (defaults 8 256 0.5 fp32) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"

enum op { LN_F, LN_B, RMS_F, RMS_B, GELU_F, GELU_B, SWI_F, SWI_B, ROPE_F, ROPE_B, ATT_MHA, ATT_GQA,
          NOPS };
static const char *const op_name[NOPS] = {
    "layernorm fwd", "layernorm bwd", "rmsnorm fwd", "rmsnorm bwd", "gelu fwd (4C)",
    "gelu bwd (4C)", "swiglu fwd", "swiglu bwd", "rope fwd", "rope bwd",
    "attention f+b, 12 KV heads", "attention f+b, 4 KV heads"};

struct bufs {
    void *a, *b, *c, *d; /* large activations, 2 * 2048 columns or qkv of 12+2*12 heads */
    float *mean, *rstd, *inv_freq, *lse;
    int32_t *pos;
};

static void *zeros(struct l3d_backend *be, size_t bytes) {
    void *p = l3d_be_alloc(be, bytes, "bench");
    if (!p) {
        fprintf(stderr, "l3d_bench_llama: out of memory\n");
        exit(1);
    }
    l3d_be_memset(be, p, 0, bytes);
    return p;
}

/* one call of op; returns the minimum bytes it moves */
static double run(struct l3d_backend *be, enum l3d_dtype t, struct bufs *x, enum op o, int64_t B,
                  int64_t T) {
    const int64_t N = B * T, C = 768, H = 2048, F = 4 * C, NH = 12, HS = 64;
    const double e = (double)l3d_dtype_size(t);
    switch (o) {
    case LN_F: l3d_be_layernorm_forward(be, t, x->b, x->mean, x->rstd, x->a, x->c, x->d, N, C);
        return 2 * N * C * e;
    case LN_B: l3d_be_layernorm_backward(be, t, x->b, x->c, x->d, x->a, x->a, x->c, x->mean,
                                         x->rstd, N, C);
        return 4 * N * C * e;
    case RMS_F: l3d_be_rmsnorm_forward(be, t, x->b, x->rstd, x->a, x->c, N, C, 1e-5f);
        return 2 * N * C * e;
    case RMS_B: l3d_be_rmsnorm_backward(be, t, t, x->b, x->c, x->a, x->a, x->c, x->rstd, N, C);
        return 4 * N * C * e;
    case GELU_F: l3d_be_gelu_forward(be, t, x->b, x->a, N * F); return 2 * N * F * e;
    case GELU_B: l3d_be_gelu_backward(be, t, x->b, x->a, x->a, N * F); return 4 * N * F * e;
    case SWI_F: l3d_be_swiglu_forward(be, t, x->b, x->a, N, H); return 3 * N * H * e;
    case SWI_B: l3d_be_swiglu_backward(be, t, x->b, x->c, x->a, N, H); return 7 * N * H * e;
    case ROPE_F: l3d_be_rope_forward(be, t, x->a, x->inv_freq, x->pos, B, T, NH, 4, HS);
        return 2 * N * 16 * HS * e;
    case ROPE_B: l3d_be_rope_backward(be, t, x->a, x->inv_freq, x->pos, B, T, NH, 4, HS);
        return 2 * N * 16 * HS * e;
    case ATT_MHA:
    case ATT_GQA: {
        int64_t NKV = o == ATT_MHA ? NH : 4;
        l3d_be_attention_forward(be, t, x->b, x->lse, x->a, B, T, NH, NKV, HS);
        l3d_be_attention_backward(be, t, x->d, x->c, x->a, x->b, x->lse, B, T, NH, NKV, HS);
        return 0;
    }
    default: return 0;
    }
}

int main(int argc, char **argv) {
    int64_t B = argc > 1 ? atoll(argv[1]) : 8, T = argc > 2 ? atoll(argv[2]) : 256;
    double secs = argc > 3 ? atof(argv[3]) : 0.5;
    enum l3d_dtype t = argc > 4 && strcmp(argv[4], "bf16") == 0   ? L3D_BF16
                       : argc > 4 && strcmp(argv[4], "fp16") == 0 ? L3D_F16
                                                                  : L3D_F32;
    struct l3d_backend *be;
    if (B < 1 || T < 1 || l3d_backend_init(NULL, &be) != L3D_OK) {
        fprintf(stderr, "usage: l3d_bench_llama [B] [T] [SECONDS] [fp32|bf16|fp16]\n");
        return 1;
    }
    const int64_t N = B * T, big = N * 36 * 64 > N * 2 * 4 * 768 ? N * 36 * 64 : N * 2 * 4 * 768;
    const size_t e = l3d_dtype_size(t);
    struct bufs x = {zeros(be, big * e), zeros(be, big * e), zeros(be, big * e),
                     zeros(be, big * e), zeros(be, N * 4), zeros(be, N * 4), zeros(be, 32 * 4),
                     zeros(be, 12 * N * 4), zeros(be, T * 4)};
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    float f[32];
    for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)i;
    for (int i = 0; i < 32; i++) f[i] = 1.0f / (float)(i + 1);
    l3d_be_copy_h2d(be, x.pos, pos, (size_t)T * sizeof *pos);
    l3d_be_copy_h2d(be, x.inv_freq, f, sizeof f);
    double bw = l3d_cpu_triad_bw((size_t)3 << 26, 1.0);
    printf("backend %s, %s, B %lld T %lld, %d thread(s); STREAM triad %.1f GB/s\n",
           l3d_backend_name(be), l3d_dtype_name(t), (long long)B, (long long)T,
           omp_get_max_threads(), bw / 1e9);
    for (int o = 0; o < NOPS; o++) {
        double ts[256], bytes = 0;
        int n = 0;
        double t0 = l3d_time_s();
        while (n < 256 && (n < 3 || l3d_time_s() - t0 < secs)) {
            double a = l3d_time_s();
            bytes = run(be, t, &x, (enum op)o, B, T);
            l3d_be_sync(be);
            ts[n++] = l3d_time_s() - a;
        }
        for (int i = 1; i < n; i++) /* insertion sort: the median */
            for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
                double s = ts[j];
                ts[j] = ts[j - 1], ts[j - 1] = s;
            }
        double m = ts[n / 2];
        if (bytes > 0)
            printf("  %-28s %8.3f ms  %6.1f GB/s\n", op_name[o], m * 1e3, bytes / m / 1e9);
        else
            printf("  %-28s %8.3f ms  %6.3f ms per query head\n", op_name[o], m * 1e3,
                   m * 1e3 / 12);
    }
    free(pos);
    l3d_backend_free(be);
    return 0;
}
