/* Generation speed with the KV cache against recomputation: a GPT with random weights generates
 * `tokens` tokens greedily after one start token, (a) through l3d_infer_step, one position per
 * token, (b) by re-running l3d_gpt_forward over the whole sequence for each token (what generation
 * did before the cache). Both must produce the same tokens.
 *   l3d_bench_generate LAYERS CHANNELS HEADS VOCAB TOKENS   (make bench-text) */
#include <stdio.h>
#include <stdlib.h>

#include "llm3d/infer.h"

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: l3d_bench_generate LAYERS CHANNELS HEADS VOCAB TOKENS\n");
        return 2;
    }
    int ntok = atoi(argv[5]);
    struct l3d_model_spec cfg = {.L = atoi(argv[1]), .C = atoi(argv[2]), .NH = atoi(argv[3]),
                                 .V = atoi(argv[4]), .maxT = ntok + 1};
    if (ntok < 1 || l3d_gpt_config_finish(&cfg) != L3D_OK) {
        fprintf(stderr, "l3d_bench_generate: %s\n", ntok < 1 ? "TOKENS must be >= 1" : l3d_error_message());
        return 2;
    }
    struct l3d_backend *be;
    if (l3d_backend_init(NULL, &be) != L3D_OK) {
        fprintf(stderr, "l3d_bench_generate: %s\n", l3d_error_message());
        return 2;
    }
    struct l3d_shard sh = l3d_shard_full(&cfg);
    struct l3d_gpt *m;
    if (l3d_gpt_init(&m, &cfg, &sh, be, 1, cfg.maxT, L3D_GRADS_NONE) != L3D_OK) {
        fprintf(stderr, "l3d_bench_generate: %s\n", l3d_error_message());
        return 1;
    }
    l3d_gpt_init_weights(m, 1);
    struct l3d_infer *inf;
    if (l3d_infer_init(&inf, m) != L3D_OK) return 1;
    int32_t *a = calloc((size_t)ntok + 1, sizeof *a), *b = calloc((size_t)ntok + 1, sizeof *b);
    double t0 = l3d_time_s();
    for (int i = 0; i < ntok; i++) a[i + 1] = argmax(l3d_infer_step(inf, &a[i], 1), cfg.V);
    double t1 = l3d_time_s();
    float *row = malloc((size_t)cfg.Vp * sizeof *row); /* the last row, copied to the host */
    for (int i = 0; i < ntok; i++) {
        l3d_gpt_forward(m, b, NULL, 1, i + 1);
        const float *lg = m->logits; /* an fp32 model */
        l3d_be_copy_d2h(be, row, lg + (int64_t)i * cfg.Vp, (size_t)cfg.Vp * sizeof *row);
        b[i + 1] = argmax(row, cfg.V);
    }
    free(row);
    double t2 = l3d_time_s();
    int same = 1;
    for (int i = 0; i <= ntok; i++) same &= a[i] == b[i];
    printf("generate %d tokens, L=%d C=%d NH=%d V=%d (%.1fM parameters): KV cache %.3f s "
           "(%.0f tokens/s), recomputation %.3f s (%.0f tokens/s): speed-up %.1fx; same tokens: %s\n",
           ntok, cfg.L, cfg.C, cfg.NH, cfg.V, l3d_gpt_param_count(&cfg) / 1e6, t1 - t0,
           ntok / (t1 - t0), t2 - t1, ntok / (t2 - t1), (t2 - t1) / (t1 - t0), same ? "yes" : "NO");
    free(a);
    free(b);
    l3d_infer_free(inf);
    l3d_gpt_free(m);
    l3d_backend_free(be);
    return same ? 0 : 1;
}
