/*
 * Tensor-parallel layers against the unsharded model, on every world size ctest runs (tp = world):
 * after one forward and backward of the same batch, the sharded model's loss, its slice of the
 * logits, the gradient of its input and every parameter gradient (gathered into the full layout)
 * equal the single-rank model's. Models of one and two layers separate the parallel layers: the
 * vocabulary-parallel embedding and cross-entropy, the column/row-parallel attention block and
 * the column/row-parallel MLP, and the replicated LayerNorms and row-parallel biases.
 * The models' buffers are device memory of the backend ($L3D_BACKEND, default cpu): the checks
 * read host copies of them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/comm.h"
#include "llm3d/model.h"
#include "llm3d/tp.h"
#include "mpi/mpi_test.h"

/* max|a - b| / max|b|, infinite on a NaN or Inf (test.h) */
static double rel_diff(const float *a, const float *b, int64_t n) { return test_rel_diff(a, b, n); }

static void check_layout(struct l3d_comm *world, struct l3d_backend *be, int L, bool overlap,
                         bool sp) {
    int tp = world->size;
    struct l3d_model_spec cfg = {.L = L, .C = 32, .NH = 4, .V = 200, .maxT = 16};
    L3D_ASSERT(l3d_gpt_config_finish(&cfg) == L3D_OK); /* Vp = 256 */
    int B = 2, T = 8; /* B*T divisible by tp for sequence parallelism */
    struct l3d_shard full = l3d_shard_full(&cfg), sh;
    CHECK(l3d_tp_shard(&cfg, tp, world->rank, sp, &sh) == L3D_OK);
    struct l3d_gpt *mf, *ms;
    CHECK(l3d_gpt_init(&mf, &cfg, &full, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    CHECK(l3d_gpt_init(&ms, &cfg, &sh, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    l3d_gpt_init_weights(mf, 99);
    l3d_gpt_init_weights(ms, 99);
    struct l3d_tp tpc;
    l3d_tp_attach(&tpc, ms, world, overlap);
    int32_t inp[16], tgt[16];
    for (int i = 0; i < B * T; i++) {
        inp[i] = (int32_t)(l3d_rng_u64(5, 1, (uint64_t)i) % (uint64_t)cfg.V);
        tgt[i] = (int32_t)(l3d_rng_u64(5, 2, (uint64_t)i) % (uint64_t)cfg.V);
    }
    l3d_gpt_zero_grad(mf);
    l3d_gpt_zero_grad(ms);
    float lf = l3d_gpt_forward(mf, inp, tgt, B, T);
    /* the forward logits (this rank's vocabulary slice), before backward overwrites them */
    float *logits = test_to_host(be, mf->logits, (int64_t)B * T * cfg.Vp);
    float ls = l3d_gpt_forward(ms, inp, tgt, B, T);
    float *slice = test_to_host(be, ms->logits, (int64_t)B * T * sh.vocab_count);
    double dl = 0.0;
    for (int64_t n = 0; n < (int64_t)B * T; n++)
        dl = test_max(dl, rel_diff(slice + n * sh.vocab_count,
                                   logits + n * cfg.Vp + sh.vocab_start, sh.vocab_count));
    CHECK(dl < 1e-5);
    CHECK_NEAR(ls, lf, 1e-6 * fabs(lf));
    l3d_gpt_backward(mf, 1.0f / (float)(B * T), NULL);
    l3d_gpt_backward(ms, 1.0f / (float)(B * T), NULL);
    /* the input gradient: this rank's rows of it with sequence parallelism */
    int64_t rows = (int64_t)B * T / sh.sp_size, r0 = sh.sp_rank * rows;
    float *dxs = test_to_host(be, ms->dinput_act, rows * cfg.C);
    float *dxf = test_to_host(be, mf->dinput_act, (int64_t)B * T * cfg.C);
    CHECK(rel_diff(dxs, dxf + r0 * cfg.C, rows * cfg.C) < 1e-5);
    float *g = world->rank == 0 ? calloc((size_t)mf->num_params, sizeof(float)) : NULL;
    float *gf = test_to_host(be, mf->grads, mf->num_params);
    CHECK(l3d_tp_gather(ms, world, ms->grads, g) == L3D_OK); /* device in, host out */
    if (world->rank == 0) {
        for (int t = 0; t < L3D_NUM_TENSORS; t++) {
            const struct l3d_tensor_info *ti = &mf->tensors[t];
            double r = rel_diff(g + ti->offset, gf + ti->offset, ti->count);
            if (r >= 1e-5)
                fprintf(stderr, "tp %d, L %d, overlap %d, sp %d: gradient of %s differs by %.3g\n", tp,
                        L, overlap, sp, ti->name, r);
            CHECK(r < 1e-5);
        }
    }
    free(g), free(gf), free(dxs), free(dxf);
    free(slice), free(logits);
    l3d_gpt_free(mf);
    l3d_gpt_free(ms);
}

int main(int argc, char **argv) {
    struct l3d_backend *be;
    struct l3d_comm *world = test_mpi_init(&argc, &argv, &be);
    if (!world) return 1;
    check_layout(world, be, 1, false, false);
    check_layout(world, be, 2, false, false);
    check_layout(world, be, 2, true, false); /* input-gradient sums overlapped with weight grads */
    check_layout(world, be, 1, false, true);  /* sequence parallel */
    check_layout(world, be, 2, false, true);
    /* layouts the model cannot be split into */
    struct l3d_model_spec cfg = {.L = 1, .C = 30, .NH = 6, .V = 100, .maxT = 8};
    L3D_ASSERT(l3d_gpt_config_finish(&cfg) == L3D_OK);
    struct l3d_shard sh;
    CHECK(l3d_tp_shard(&cfg, 4, 0, false, &sh) == L3D_ERR_LAYOUT);
    CHECK(strstr(l3d_error_message(), "--tp 4") != NULL);
    CHECK(l3d_tp_shard(&cfg, 8, 0, false, &sh) == L3D_ERR_LAYOUT);
    CHECK(strstr(l3d_error_message(), "larger") != NULL);
    CHECK(l3d_tp_shard(&cfg, 3, 0, false, &sh) == L3D_ERR_LAYOUT); /* padded vocabulary 128 */
    CHECK(strstr(l3d_error_message(), "vocabulary") != NULL);
    CHECK(l3d_tp_shard(&cfg, 2, 1, false, &sh) == L3D_OK && sh.head_start == 3 && sh.ffn_start == 60);
    return test_mpi_end(world, be);
}
