/*
 * The training layout's checks without MPI (l3d_train_layout_init): every rank reaches the same
 * verdict from the flags and the world size alone, so layouts of thousands of ranks are checked
 * here instead of launched. Also: the shared stage shards (include/llm3d/layout.h) tile the model.
 */
#include <string.h>

#include "llm3d/layout.h"
#include "llm3d/train.h"
#include "test.h"

static struct l3d_train_config config(void) {
    struct l3d_train_config tc;
    l3d_train_config_defaults(&tc);
    l3d_model_preset(&tc.model, "tiny");
    tc.train_pattern = "unused";
    return tc;
}

/* the layout fails with a message containing each of the words */
static void check_error(struct l3d_train_config *tc, int world, const char *a,
                        const char *b) {
    struct l3d_train_layout lay;
    const struct l3d_layout given = tc->layout;
    l3d_status st = l3d_train_layout_init(&lay, tc, world);
    CHECK(st != L3D_OK);
    CHECK(memcmp(&given, &tc->layout, sizeof given) == 0); /* left as it was */
    const char *msg = l3d_error_message();
    bool found = strstr(msg, a) && (!b || strstr(msg, b));
    if (!found) fprintf(stderr, "message: %s\n", msg);
    CHECK(found);
    CHECK(lay.layers == NULL && lay.sched.n == NULL);
}

int main(void) {
    struct l3d_train_config tc = config();
    struct l3d_train_layout lay;

    /* a good layout: 4 ranks as tp 1 x pp 2 x dp 2, micro-batches from the global batch */
    tc.layout.pp = 2;
    tc.layout.global_batch = 16; /* B 4 x dp 2 x 2 micro-batches */
    CHECK(l3d_train_layout_init(&lay, &tc, 4) == L3D_OK);
    /* resolved in the spec itself: dp from the world, accum from the global batch */
    CHECK(tc.layout.tp == 1 && tc.layout.pp == 2 && tc.layout.dp == 2 && tc.layout.v == 1 &&
          tc.layout.cp == 1 && lay.stages == 2);
    CHECK(tc.layout.accum == 2);
    CHECK(lay.layers[0] + lay.layers[1] == tc.model.L);
    CHECK(lay.sched.n == NULL); /* built after the memory check */
    CHECK(l3d_train_layout_build(&lay, &tc) == L3D_OK);
    CHECK(lay.sched.pp == 2 && lay.sched.m == 2 && lay.sched.n[1] > 0);
    struct l3d_shard s0 = l3d_train_layout_shard(&lay, &tc, 0, 0);
    struct l3d_shard s1 = l3d_train_layout_shard(&lay, &tc, 1, 0);
    CHECK(s0.layer_start == 0 && s0.layer_count == lay.layers[0] && s0.has_embedding);
    CHECK(!s0.has_head && !s1.has_embedding && s1.has_head);
    CHECK(s1.layer_start == lay.layers[0] && s1.layer_count == lay.layers[1]);
    l3d_train_layout_free(&lay);

    /* ZeRO over more than 256 data-parallel replicas: a checked error naming --zero and the count */
    tc = config();
    tc.layout.zero = 1;
    check_error(&tc, 512, "--zero 1", "512 data-parallel");
    tc.layout.zero = 0; /* replicated optimizer: no limit */
    CHECK(l3d_train_layout_init(&lay, &tc, 512) == L3D_OK && tc.layout.dp == 512);
    l3d_train_layout_free(&lay);
    tc.layout.dp = 0;
    tc.layout.zero = 2;
    tc.layout.tp = 2; /* 512 ranks as tp 2 x dp 256: allowed */
    CHECK(l3d_train_layout_init(&lay, &tc, 512) == L3D_OK);
    CHECK(tc.layout.dp == 256);
    l3d_train_layout_free(&lay);

    /* more stages than layers, at any size (no fixed-size table) */
    tc = config();
    tc.layout.pp = 5000;
    check_error(&tc, 5000, "--pp 5000", "layers");
    tc.layout.pp = 2;
    tc.layout.v = 200;
    tc.layout.schedule = L3D_PP_INTERLEAVED;
    check_error(&tc, 2, "--pp-virtual 200", NULL);
    /* a model with more layers than the old 4096-entry table: one layer a stage */
    tc = config();
    tc.model.L = 4097;
    tc.layout.pp = 4097;
    static char ones[2 * 4097]; /* "1,1,...,1": one layer a stage */
    for (int i = 0; i < 4097; i++) {
        ones[2 * i] = '1';
        ones[2 * i + 1] = ',';
    }
    ones[2 * 4097 - 1] = '\0';
    tc.layout.pp_layers = ones;
    CHECK(l3d_train_layout_init(&lay, &tc, 4097) == L3D_OK);
    CHECK(lay.stages == 4097 && lay.layers[4096] == 1);
    l3d_train_layout_free(&lay);

    /* 2^30 micro-batches (the largest --grad-accum): the checks allocate nothing that grows with
     * them (the schedule alone would be 72 GiB a stage: this aborted, out of memory, before the
     * memory check could refuse it), and the build refuses them with --grad-accum named */
    tc = config();
    tc.layout.pp = 2;
    tc.layout.accum = 1 << 30;
    size_t before = l3d_mem_used();
    CHECK(l3d_train_layout_init(&lay, &tc, 2) == L3D_OK);
    CHECK(tc.layout.accum == 1 << 30 && l3d_mem_used() - before < 4096);
    CHECK(l3d_train_layout_build(&lay, &tc) != L3D_OK && lay.sched.n == NULL);
    CHECK(strstr(l3d_error_message(), "--grad-accum") != NULL);
    l3d_train_layout_free(&lay);
    CHECK(l3d_mem_used() == before);
    tc.layout.accum = 1;
    tc.layout.global_batch = (int64_t)4 << 30; /* 2^30 micro-batches of --batch 4 */
    CHECK(l3d_train_layout_init(&lay, &tc, 2) == L3D_OK && tc.layout.accum == 1 << 30);
    l3d_train_layout_free(&lay);
    tc.layout.global_batch = (int64_t)4 << 32; /* 2^32 micro-batches: more than an int counts */
    check_error(&tc, 2, "--global-batch 17179869184", "at most 2147483647");

    /* context parallelism: the message names the whole product and the real world size (it
     * said "world size is 1": the world divided by --cp, with --cp left out) */
    tc = config();
    tc.layout.cp = 2;
    tc.layout.dp = 2;
    check_error(&tc, 2, "--tp 1 x --cp 2 x --pp 1 x --dp 2 = 4 ranks", "world size is 2");
    tc.layout.dp = 0;
    tc.layout.tp = 2;
    check_error(&tc, 2, "--tp 2 x --cp 2 x --pp 1 = 4 does not divide the world size 2",
                "launch a multiple of 4 ranks");
    tc.layout.tp = 1;
    check_error(&tc, 3, "--cp 2 does not divide the 3 ranks", NULL);
    CHECK(l3d_train_layout_init(&lay, &tc, 4) == L3D_OK && tc.layout.cp == 2 &&
          tc.layout.dp == 2);
    l3d_train_layout_free(&lay);

    /* the others keep their messages */
    tc = config();
    tc.layout.dp = 3;
    check_error(&tc, 2, "--dp 3", NULL);
    tc = config();
    tc.layout.sp = true;
    check_error(&tc, 1, "--sequence-parallel", NULL);
    tc = config();
    tc.layout.zero = 4;
    check_error(&tc, 1, "--zero 4", NULL);

    /* the planner's stage layers are the trainer's */
    tc = config();
    int a[2], b[2];
    tc.layout.pp = 2;
    CHECK(l3d_layout_stage_layers(&tc.model, &tc.layout, a) == L3D_OK);
    CHECK(l3d_pp_partition(&tc.model, tc.layout.seq, 2, b) == L3D_OK);
    CHECK(memcmp(a, b, sizeof a) == 0);

    /* uneven ends (Megatron-Core's first / last stage layers): Llama 3 405B's 126 layers on 16
     * stages as 7 + 14 x 8 + 7, a 6-layer model on 4 as 1, 2, 2, 1, one end given */
    int s16[16], s4[4], s2[2];
    CHECK(l3d_layout_split_ends(126, 16, 7, 7, s16) == L3D_OK);
    CHECK(s16[0] == 7 && s16[15] == 7);
    for (int i = 1; i < 15; i++) CHECK(s16[i] == 8);
    CHECK(l3d_layout_split_ends(6, 4, 1, 1, s4) == L3D_OK);
    CHECK(s4[0] == 1 && s4[1] == 2 && s4[2] == 2 && s4[3] == 1);
    CHECK(l3d_layout_split_ends(7, 4, 1, 0, s4) == L3D_OK); /* 6 over 3: 2, 2, 2 */
    CHECK(s4[0] == 1 && s4[1] == 2 && s4[2] == 2 && s4[3] == 2);
    CHECK(l3d_layout_split_ends(8, 4, 0, 1, s4) == L3D_OK); /* 7 over 3: 3, 2, 2 */
    CHECK(s4[0] == 3 && s4[1] == 2 && s4[2] == 2 && s4[3] == 1);
    CHECK(l3d_layout_split_ends(4, 2, 1, 0, s2) == L3D_OK && s2[0] == 1 && s2[1] == 3);
    /* negative: a middle stage with no layer, ends that do not add up, one stage */
    CHECK(l3d_layout_split_ends(4, 4, 1, 2, s4) == L3D_ERR_LAYOUT);
    CHECK(strstr(l3d_error_message(), "--pp-first-layers 1 and --pp-last-layers 2") != NULL);
    CHECK(l3d_layout_split_ends(4, 2, 1, 2, s2) == L3D_ERR_LAYOUT);
    CHECK(l3d_layout_split_ends(4, 1, 1, 0, s2) == L3D_ERR_LAYOUT);
    /* the trainer takes them from the layout, and its validator refuses what does not fit */
    tc = config();
    tc.model.L = 4;
    tc.layout.pp = 2;
    tc.layout.pp_first = 1;
    struct l3d_train_layout ul;
    CHECK(l3d_train_layout_init(&ul, &tc, 2) == L3D_OK && ul.layers[0] == 1 && ul.layers[1] == 3);
    l3d_train_layout_free(&ul);
    tc.layout.dp = 0;
    tc.layout.pp_first = 0;
    tc.layout.pp_last = 1;
    CHECK(l3d_train_layout_init(&ul, &tc, 2) == L3D_OK && ul.layers[0] == 3 && ul.layers[1] == 1);
    l3d_train_layout_free(&ul);
    tc.layout.dp = 0;
    tc.layout.pp_first = 2;
    tc.layout.pp_last = 3;
    check_error(&tc, 2, "--pp-first-layers 2 and --pp-last-layers 3 leave -1", NULL);
    tc.layout.pp_last = 0;
    tc.layout.pp_layers = "1,3";
    check_error(&tc, 2, "not both", NULL);
    tc.layout.pp_layers = NULL;
    tc.layout.pp = 1;
    check_error(&tc, 1, "give --pp 2 or more", NULL);
    return TEST_REPORT();
}
