/* Page faults and time of each training step (zero_grad, forward, backward, gradient norm,
 * AdamW) of a Llama of GPT-2 124M's size (12 layers, C 768, 12 heads, 4 KV heads, SwiGLU 2048)
 * through the library, on the current OpenMP thread count. A fresh page's first touch costs
 * ~12 us per 4 KiB here, so a step after the first should fault in no page: any minor fault in
 * steps 2.. is memory allocated inside the step loop. With `keep`, glibc keeps freed memory in
 * the heap as the trainer's MPI start-up makes it (src/comm/mpi.c, mallopt), which hides such
 * allocations after the heap has grown to them.
 *   l3d_bench_step_faults [fp32|bf16|fp16] [B] [T] [steps] [keep]     (defaults fp16 4 64 4) */
#include <malloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "llm3d/backend.h"
#include "llm3d/model.h"
#include "llm3d/optim.h"
#include "llm3d/spec.h"

static long minor_faults(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

/* The model, or NULL with a message. */
static struct l3d_gpt *llama(struct l3d_backend *be, int B, int T, enum l3d_dtype dt) {
    struct l3d_model_spec c;
    if (l3d_model_preset(&c, "d12") != L3D_OK) return NULL;
    l3d_model_set_arch(&c, L3D_ARCH_LLAMA);
    c.NKV = 4;
    c.ffn = 2048;
    struct l3d_gpt *m;
    struct l3d_shard sh;
    if (l3d_gpt_config_finish(&c) != L3D_OK ||
        (sh = l3d_shard_full(&c), l3d_gpt_init_dt(&m, &c, &sh, be, B, T, L3D_GRADS_FLAT, 1,
                                                  L3D_RECOMPUTE_NONE, dt)) != L3D_OK) {
        fprintf(stderr, "step_faults: %s\n", l3d_error_message());
        return NULL;
    }
    if (dt == L3D_F32) /* 16-bit weights zeroed: the work and the memory are the same */
        l3d_gpt_init_weights(m, 1);
    else
        l3d_be_memset(be, m->params, 0, (size_t)m->num_params * m->es);
    return m;
}

int main(int argc, char **argv) {
    enum l3d_dtype dt = L3D_F16;
    if (argc > 1 && l3d_dtype_parse(argv[1], &dt) != L3D_OK) {
        fprintf(stderr, "step_faults: %s\n", l3d_error_message());
        return 2;
    }
    int B = argc > 2 ? atoi(argv[2]) : 4, T = argc > 3 ? atoi(argv[3]) : 64;
    int steps = argc > 4 ? atoi(argv[4]) : 4;
    if (argc > 5 && strcmp(argv[5], "keep") == 0) {
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 0x7fffffff);
        mallopt(M_TOP_PAD, 64 << 20);
    }
    struct l3d_backend *be;
    if (l3d_backend_init(NULL, &be) != L3D_OK) return 1;
    struct l3d_gpt *m = llama(be, B, T, dt);
    struct l3d_adamw_hparams hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.1f, .grad_clip = 1.0f};
    struct l3d_adamw opt;
    struct l3d_sumsq gsq;
    if (!m || l3d_adamw_init_dt(&opt, be, &hp, 0, m->num_params, dt) != L3D_OK ||
        l3d_sumsq_init(&gsq, be, 1) != L3D_OK)
        return 1;
    int32_t *tok = malloc((size_t)(2 * B * T) * sizeof *tok);
    for (int i = 0; i < 2 * B * T; i++) tok[i] = (int32_t)(((int64_t)i * 7919) % m->cfg.V);
    printf("%s, B %d, T %d, %d threads%s\n", l3d_dtype_name(dt), B, T, omp_get_max_threads(),
           argc > 5 ? ", freed memory kept" : "");
    for (int s = 0; s < steps; s++) {
        long f0 = minor_faults();
        double t0 = l3d_time_s(), sq;
        l3d_gpt_zero_grad(m);
        l3d_gpt_forward(m, tok, tok + B * T, B, T);
        l3d_gpt_backward(m, 1.0f / (float)(B * T), NULL);
        l3d_grad_sumsq(&gsq, 0, m->grads, m->num_params);
        l3d_sumsq_take(&gsq, &sq);
        l3d_adamw_step(&opt, be, m->params, m->grads, 1.0f, m->tensors, L3D_NUM_TENSORS, 1e-4f);
        l3d_be_sync(be);
        long f = minor_faults() - f0;
        printf("step %d: %7ld minor faults (%.1f MiB), %8.1f ms\n", s + 1, f,
               (double)f * 4096.0 / 1048576.0, (l3d_time_s() - t0) * 1e3);
    }
    free(tok);
    l3d_sumsq_free(&gsq);
    l3d_adamw_free(&opt);
    l3d_gpt_free(m);
    l3d_backend_free(be);
    return 0;
}
