/*
 * The run spec (include/llm3d/spec.h): the validator names every violated rule once, in one
 * message each, and passes a spec that breaks none; each rule has a spec that breaks it alone (its
 * negative case) and a neighbour that passes; the bytes per parameter are the closed forms they
 * cite (ZeRO paper's 2 + 2 + 12, llm3d's 2 + 4 + 12 and 4 + 4 + 8) per ZeRO stage; the presets
 * come from one table.
 */
#include <math.h>
#include <string.h>

#include "llm3d/spec.h"
#include "test.h"

static struct l3d_run_spec base(void) {
    struct l3d_run_spec s;
    l3d_run_spec_defaults(&s);
    CHECK(l3d_model_preset(&s.model, "tiny") == L3D_OK);
    s.layout.seq = 64;
    return s;
}

static const struct l3d_spec_ctx train8 = {.world = 8, .train = true};

/* the spec breaks exactly one rule, whose message holds `what` */
static void one(const struct l3d_run_spec *s, const struct l3d_spec_ctx *ctx, const char *what) {
    struct l3d_spec_errors e;
    l3d_status st = l3d_spec_check(s, ctx, &e);
    bool ok = st != L3D_OK && e.n == 1 && strstr(e.msg[0], what) &&
              strstr(l3d_error_message(), what);
    if (!ok) {
        fprintf(stderr, "expected one error with '%s', got %d:\n", what, e.n);
        for (int i = 0; i < e.n; i++) fprintf(stderr, "  %s\n", e.msg[i]);
    }
    CHECK(ok);
}

static void passes(const struct l3d_run_spec *s, const struct l3d_spec_ctx *ctx) {
    struct l3d_spec_errors e;
    l3d_status st = l3d_spec_check(s, ctx, &e);
    if (st != L3D_OK)
        for (int i = 0; i < e.n; i++) fprintf(stderr, "unexpected: %s\n", e.msg[i]);
    CHECK(st == L3D_OK && e.n == 0);
}

static void test_layout_rules(void) {
    struct l3d_run_spec s = base();
    s.layout.tp = 2;
    s.layout.pp = 2;
    passes(&s, &train8); /* dp 0: 8 / 4 = 2 */
    s.layout.dp = 2;
    passes(&s, &train8);
    s.layout.dp = 3;
    one(&s, &train8, "--dp 3");
    s = base();
    s.model.C = 96; /* MLP 384 and padded vocabulary 384 split by 3, the 4 heads do not */
    s.model.ffn = 0;
    s.model.V = 300;
    s.layout.tp = 3;
    s.layout.dp = 1;
    one(&s, &(struct l3d_spec_ctx){.world = 3, .train = true}, "--tp 3 does not divide the model's 4");
    s.model.NH = 3;
    passes(&s, &(struct l3d_spec_ctx){.world = 3, .train = true});
    s = base();
    s.layout.cp = 2; /* T 64 in 4 chunks of 16 */
    passes(&s, &(struct l3d_spec_ctx){.world = 2, .train = true});
    s.layout.seq = 60; /* 60 = 4 x 15 */
    passes(&s, &(struct l3d_spec_ctx){.world = 2, .train = true});
    s.layout.seq = 62;
    one(&s, &(struct l3d_spec_ctx){.world = 2, .train = true},
        "--seq-len 62 is not a multiple of 4");
    s.layout.seq = 64;
    s.layout.cp = 3;
    one(&s, &(struct l3d_spec_ctx){.world = 3, .train = true}, "not a multiple of 6");
    s = base();
    s.layout.cp = 2; /* SP over the ring rank's T / cp rows: 1 x 12 / 2 = 6 rows over tp 4 */
    s.layout.tp = 4;
    s.layout.sp = true;
    s.layout.micro_batch = 1;
    s.layout.seq = 12;
    one(&s, &(struct l3d_spec_ctx){.world = 8, .train = true}, "--seq-len / --cp (1 x 6)");
    s.layout.micro_batch = 2;
    passes(&s, &(struct l3d_spec_ctx){.world = 8, .train = true});
    s = base();
    s.layout.tp = 2;
    s.layout.sp = true;
    passes(&s, &(struct l3d_spec_ctx){.world = 2, .train = true});
    s.layout.tp = 1;
    one(&s, &(struct l3d_spec_ctx){.world = 1, .train = true}, "needs --tp 2");
    s = base();
    s.model.L = 4;
    s.layout.pp = 2;
    s.layout.v = 2;
    s.layout.schedule = L3D_PP_INTERLEAVED;
    s.layout.accum = 4;
    passes(&s, &(struct l3d_spec_ctx){.world = 2, .train = true});
    s.model.L = 3; /* 4 stages for 3 layers */
    one(&s, &(struct l3d_spec_ctx){.world = 2, .train = true}, "pipeline stages but the model has 3");
    s.model.L = 4;
    s.layout.accum = 3; /* not a multiple of pp */
    one(&s, &(struct l3d_spec_ctx){.world = 2, .train = true}, "multiple of --pp 2");
    s.layout.accum = 4;
    s.layout.schedule = L3D_PP_1F1B;
    one(&s, &(struct l3d_spec_ctx){.world = 2, .train = true}, "needs --pp-schedule interleaved");
    /* Megatron-LM's even split is the planner's rule, not the trainer's */
    s = base();
    s.model.L = 3;
    s.layout.pp = 2;
    passes(&s, &(struct l3d_spec_ctx){.world = 2, .train = true});
    one(&s, &(struct l3d_spec_ctx){.world = 2}, "split evenly");
}

/* Expert parallelism: ep divides the experts and the DP size and needs experts; ZeRO-1/2 are
 * allowed with it; each rule alone says its numbers. */
static void test_ep_rules(void) {
    struct l3d_run_spec s = base();
    CHECK(l3d_model_preset(&s.model, "moe-tiny") == L3D_OK); /* 4 experts */
    s.layout.ep = 2;
    passes(&s, &(struct l3d_spec_ctx){.world = 2, .train = true});
    passes(&s, &(struct l3d_spec_ctx){.world = 4, .train = true}); /* two replicas of each half */
    s.layout.ep = 4;
    passes(&s, &(struct l3d_spec_ctx){.world = 4, .train = true});
    one(&s, &(struct l3d_spec_ctx){.world = 2, .train = true},
        "--ep 4 does not divide the 2 data-parallel replicas");
    s.model.moe.experts = 6;
    s.layout.ep = 4;
    one(&s, &(struct l3d_spec_ctx){.world = 4, .train = true},
        "--ep 4 does not divide --moe-experts 6");
    s.model.moe.experts = 4;
    s.layout.ep = 2;
    s.layout.zero = 2; /* ZeRO over the ranks holding the same experts */
    passes(&s, &(struct l3d_spec_ctx){.world = 4, .train = true});
    s = base(); /* a dense model */
    s.layout.ep = 2;
    one(&s, &(struct l3d_spec_ctx){.world = 2, .train = true}, "--ep 2 without --moe-experts");
    s.layout.ep = 1;
    passes(&s, &(struct l3d_spec_ctx){.world = 2, .train = true});
}

static void test_batch_rules(void) {
    struct l3d_run_spec s = base();
    s.layout.global_batch = 16;
    s.layout.micro_batch = 4;
    passes(&s, &(struct l3d_spec_ctx){.world = 2, .train = true}); /* 16 / (4 x 2) = 2 */
    CHECK(l3d_layout_accum(&(struct l3d_layout){.global_batch = 16, .micro_batch = 4, .dp = 2}) ==
          2);
    s.layout.global_batch = 12;
    one(&s, &(struct l3d_spec_ctx){.world = 2, .train = true}, "--global-batch 12");
    /* before the ranks are known, the rules that need them wait */
    passes(&s, &(struct l3d_spec_ctx){.world_unknown = true, .train = true});
    s = base();
    s.layout.seq = 65;
    one(&s, &train8, "--seq-len 65 exceeds the model's context 64");
    s = base();
    s.layout.accum = 0;
    one(&s, &train8, "--grad-accum 0");
    /* the planner's bound on micro-batches; the trainer's memory check sizes them instead */
    s = base();
    s.layout.accum = (1 << 24) + 1;
    one(&s, &(struct l3d_spec_ctx){.world = 8}, "at most 16777216 micro-batches");
    passes(&s, &train8);
    s = base();
    s.layout.zero = 3; /* ZeRO-3 passes; 4 is no stage; prefetch asked without ZeRO-3 or deeper
                        * than the bound is refused */
    passes(&s, &train8);
    s.layout.zero = 4;
    one(&s, &train8, "--zero 4");
    s = base();
    s.layout.zero = 2;
    s.layout.zero3_prefetch_set = true;
    one(&s, &train8, "--zero3-prefetch 1: prefetching gathers parameters ahead under --zero 3");
    s.layout.zero = 3;
    passes(&s, &train8);
    s.layout.zero3_prefetch = 65;
    one(&s, &train8, "at most 64 layers ahead");
    s = base();
    s.layout.zero = 1;
    s.layout.dp = 512;
    one(&s, &(struct l3d_spec_ctx){.world = 512, .train = true}, "at most 256");
    passes(&s, &(struct l3d_spec_ctx){.world = 512});
}

/* --precision of generate and convert: the parameter type of what l3d_precision_parse accepts */
static void test_precision_param(void) {
    static const char *const names[] = {"fp32", "bf16", "fp16"};
    static const enum l3d_dtype types[] = {L3D_F32, L3D_BF16, L3D_F16};
    for (int i = 0; i < 3; i++) {
        enum l3d_dtype dt = L3D_I32;
        CHECK(l3d_precision_param_parse(names[i], &dt) == L3D_OK);
        CHECK(dt == types[i]);
    }
    enum l3d_dtype dt = L3D_BF16;
    CHECK(l3d_precision_param_parse("int8", &dt) == L3D_ERR_ARG);
    CHECK(dt == L3D_BF16); /* left as it was */
    CHECK(strstr(l3d_error_message(), "--precision 'int8': choose fp32 (the default), bf16 or fp16"));
}

static void test_precision_rules(void) {
    struct l3d_run_spec s = base();
    CHECK(l3d_precision_parse("bf16", &s.precision) == L3D_OK);
    CHECK(s.precision.param == L3D_BF16 && s.precision.act == L3D_BF16 &&
          s.precision.grad == L3D_F32);
    CHECK(strcmp(l3d_precision_name(&s.precision), "bf16") == 0);
    CHECK(l3d_precision_parse("int8", &s.precision) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "--precision 'int8'"));
    passes(&s, &train8);
    s.precision.reduce = L3D_F16;
    one(&s, &train8, "--grad-reduce-dtype fp16");
    s.precision.reduce = L3D_F32;
    s.precision.ls.given = "hysteresis";
    one(&s, &train8, "--hysteresis: loss scaling is for --precision fp16");
    CHECK(l3d_precision_parse("fp16", &s.precision) == L3D_OK);
    passes(&s, &train8);
    /* the dynamic scale starts at or above its floor (a probe trained with scale 0 silently) */
    s.precision.ls.init = 1e-30;
    one(&s, &train8, "--initial-loss-scale 1e-30 is below --min-loss-scale 1");
    s.precision.ls.fixed = 8; /* a static scale: the floor does not apply */
    passes(&s, &train8);
    s.precision.ls.fixed = NAN;
    one(&s, &train8, "--loss-scale nan");
    s = base();
    s.precision.ls.backoff = 1.0;
    one(&s, &train8, "--loss-scale-backoff 1");
    s.precision.ls.backoff = 0.5;
    /* Megatron-LM's 16-bit gradients: the planner's, never the trainer's */
    CHECK(l3d_precision_parse("fp16", &s.precision) == L3D_OK);
    s.precision.grad = L3D_F16;
    passes(&s, &(struct l3d_spec_ctx){.world = 8});
    one(&s, &train8, "accumulates them in fp32");
    CHECK(!l3d_precision_llm3d(&s.precision));
    /* fp32 TP sums: llm3d's trainer's (passes with its fp32 gradients), not Megatron-LM's */
    s.precision.tp_reduce_fp32 = true;
    one(&s, &(struct l3d_spec_ctx){.world = 8}, "--tp-reduce-dtype fp32: for llm3d's trainer");
    s.precision.tp_reduce_fp32 = false;
    /* the ring's fp32 partial sums (--cp-reduce-dtype fp32) are llm3d's option too */
    s.precision.cp_fp32 = true;
    one(&s, &(struct l3d_spec_ctx){.world = 8}, "--cp-reduce-dtype fp32: for llm3d's trainer");
    s.precision.tp_reduce_fp32 = true;
    CHECK(l3d_precision_parse("bf16", &s.precision) == L3D_OK && s.precision.cp_fp32 &&
          s.precision.tp_reduce_fp32 && s.precision.grad == L3D_F32);
    passes(&s, &train8);
}

/* several rules broken at once: each said, in one message each */
static void test_every_rule_said(void) {
    struct l3d_run_spec s = base();
    s.model.NH = 2; /* 2 heads, tp 4: the heads' rule alone of the tensor-parallel ones */
    s.layout.tp = 4;
    s.layout.zero = 7;
    s.layout.seq = 1000;
    s.precision.reduce = L3D_F16;
    struct l3d_spec_errors e;
    CHECK(l3d_spec_check(&s, &(struct l3d_spec_ctx){.world = 4, .train = true}, &e) != L3D_OK);
    CHECK(e.n == 4);
    const char *want[4] = {"--tp 4", "--seq-len 1000", "--zero 7", "--grad-reduce-dtype fp16"};
    for (int i = 0; i < 4; i++) {
        bool found = false;
        for (int j = 0; j < e.n; j++) found = found || strstr(e.msg[j], want[i]);
        CHECK(found);
        CHECK(strstr(l3d_error_message(), want[i]));
    }
    /* the model's own rules */
    s = base();
    s.model.C = 65;
    s.model.ffn = 0;
    one(&s, &(struct l3d_spec_ctx){.world = 1, .train = true}, "--channels 65");
    s = base();
    s.model.ffn = 100; /* any MLP width trains (GELU or SwiGLU) */
    passes(&s, &(struct l3d_spec_ctx){.world = 1, .train = true});
    /* 4 heads over 2 key/value heads: tp 2 splits them, tp 4 would need them replicated */
    s = base();
    s.model.NKV = 2;
    s.layout.tp = 2;
    passes(&s, &train8);
    s.layout.tp = 4;
    one(&s, &train8, "--tp 4 does not divide the model's 2 key/value heads");
}

static void test_param_bytes(void) {
    struct l3d_run_spec s = base();
    struct l3d_param_bytes b;
    l3d_param_bytes(&s.precision, 0, 4, &b); /* fp32: 4 + 4 + 8 */
    CHECK(b.params == 4 && b.grads == 4 && b.optimizer == 8 && b.total == 16);
    l3d_param_bytes(&s.precision, 1, 4, &b);
    CHECK(b.grads == 4 && b.optimizer == 2 && b.total == 10);
    l3d_param_bytes(&s.precision, 2, 4, &b);
    CHECK(b.grads == 1 && b.optimizer == 2 && b.total == 7 && b.grads_full == 4);
    l3d_param_bytes(&s.precision, 3, 4, &b); /* ZeRO-3: 16N/dp */
    CHECK(b.params == 1 && b.grads == 1 && b.optimizer == 2 && b.total == 4 && b.params_full == 4);
    CHECK(l3d_precision_parse("bf16", &s.precision) == L3D_OK); /* llm3d: 2 + 4 + 12 */
    l3d_param_bytes(&s.precision, 0, 2, &b);
    CHECK(b.params == 2 && b.grads == 4 && b.optimizer == 12 && b.total == 18);
    s.precision.grad = L3D_BF16; /* Megatron-LM: the ZeRO paper's 2 + 2 + 12 = 16 */
    l3d_param_bytes(&s.precision, 0, 8, &b);
    CHECK(b.total == 16);
    l3d_param_bytes(&s.precision, 2, 8, &b); /* ZeRO-2: 2 + (2 + 12) / 8 */
    CHECK_NEAR(b.total, 2 + 14.0 / 8, 1e-12);
    l3d_param_bytes(&s.precision, 3, 8, &b); /* ZeRO-3: the paper's 16N / 8 */
    CHECK_NEAR(b.total, 16.0 / 8, 1e-12);
    /* negative case: a stage beyond the ones sharded is not sharded further here */
    l3d_param_bytes(&s.precision, 0, 8, &b);
    CHECK(!(b.total == 2 + 14.0 / 8));
}

static void test_presets(void) {
    struct l3d_model_spec m;
    CHECK(l3d_model_preset(&m, "gpt2") == L3D_OK && m.L == 12 && m.C == 768 && m.NH == 12 &&
          m.V == 50257 && m.Vp == 50304 && m.maxT == 1024 && m.ffn == 3072 &&
          strcmp(m.name, "d12") == 0);
    CHECK(l3d_model_preset(&m, "megatron-530b") == L3D_OK && m.L == 105 && m.C == 20480 &&
          m.NH == 128 && m.V == 51200 && m.maxT == 2048);
    CHECK(l3d_model_preset(&m, "d13") == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "frontier-175b"));
    CHECK(strstr(l3d_model_preset_names(), "d12 (gpt2, 124M)"));
}

/* The architecture's rules and its parameter count (Llama 2 7B: 6.74B, Touvron et al. 2023). */
static void test_architecture(void) {
    struct l3d_model_spec m = {.L = 32, .C = 4096, .NH = 32, .V = 32000, .maxT = 4096,
                               .ffn = 11008, .arch = L3D_ARCH_LLAMA, .norm = L3D_NORM_RMSNORM,
                               .mlp = L3D_MLP_SWIGLU, .pos = L3D_POS_ROPE, .no_bias = true,
                               .untied = true};
    CHECK(l3d_gpt_config_finish(&m) == L3D_OK);
    CHECK_NEAR(l3d_model_param_count(&m), 6738415616.0, 0.5);
    CHECK(m.rope.theta == 10000.0 && m.norm_eps == 1e-5f && l3d_model_kv_heads(&m) == 32);
    /* GPT-2 124M: 124,475,904 parameters with the padded vocabulary (llm.c's count) */
    struct l3d_model_spec g;
    CHECK(l3d_model_preset(&g, "gpt2") == L3D_OK);
    CHECK_NEAR(l3d_model_param_count(&g), 124475904.0, 0.5);
    struct l3d_model_spec bad = m;
    bad.NKV = 5;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG &&
          strstr(l3d_error_message(), "key/value heads (5) must divide the 32") != NULL);
    bad = m;
    bad.ffn = 0;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && strstr(l3d_error_message(), "SwiGLU"));
    bad = m;
    bad.C = 4064; /* 127 per head */
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && strstr(l3d_error_message(), "even head"));
    bad = m;
    bad.rope.factor = 8.0; /* Llama 3.1's scaling without its other keys */
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && strstr(l3d_error_message(), "scaling"));
    bad.rope = (struct l3d_rope){.theta = 500000, .factor = 8, .low_freq_factor = 1,
                                 .high_freq_factor = 4, .original_context = 8192};
    CHECK(l3d_gpt_config_finish(&bad) == L3D_OK);
}

/* Each field l3d_model_same compares makes two specs differ, alone; l3d_model_same_shapes
 * leaves out the padded vocabulary, the epsilon and RoPE's scaling. */
static void test_model_same(void) {
    struct l3d_model_spec a = {.L = 2, .C = 64, .NH = 4, .V = 250, .Vp = 256, .maxT = 32,
                               .ffn = 128, .arch = L3D_ARCH_LLAMA, .NKV = 2,
                               .norm = L3D_NORM_RMSNORM, .norm_eps = 1e-5f,
                               .mlp = L3D_MLP_SWIGLU, .pos = L3D_POS_ROPE, .no_bias = true,
                               .untied = true};
    a.rope = (struct l3d_rope){.theta = 500000, .factor = 8, .low_freq_factor = 1,
                               .high_freq_factor = 4, .original_context = 8192};
    struct l3d_model_spec b = a;
    strcpy(b.name, "other"); /* the name is no part of the model */
    CHECK(l3d_model_same(&a, &b) && l3d_model_same_shapes(&a, &b));
#define DIFFERS(field, value, shapes)                                                           \
    do {                                                                                        \
        struct l3d_model_spec c = a;                                                            \
        c.field = value;                                                                        \
        CHECK(!l3d_model_same(&a, &c) && !l3d_model_same(&c, &a));                              \
        CHECK(l3d_model_same_shapes(&a, &c) == !(shapes));                                      \
    } while (0)
    DIFFERS(L, 3, true);
    DIFFERS(C, 128, true);
    DIFFERS(NH, 8, true);
    DIFFERS(V, 251, true);
    DIFFERS(maxT, 64, true);
    DIFFERS(ffn, 192, true);
    DIFFERS(arch, L3D_ARCH_GPT2, true);
    DIFFERS(NKV, 4, true);
    DIFFERS(norm, L3D_NORM_LAYERNORM, true);
    DIFFERS(mlp, L3D_MLP_GELU, true);
    DIFFERS(pos, L3D_POS_LEARNED, true);
    DIFFERS(no_bias, false, true);
    DIFFERS(untied, false, true);
    DIFFERS(Vp, 320, false);
    DIFFERS(norm_eps, 1e-6f, false);
    DIFFERS(rope.theta, 10000, false);
    DIFFERS(rope.factor, 4, false);
    DIFFERS(rope.low_freq_factor, 2, false);
    DIFFERS(rope.high_freq_factor, 8, false);
    DIFFERS(rope.original_context, 4096, false);
#undef DIFFERS
    /* RoPE's fields count only with RoPE; ffn 0 is 4 C; NKV 0 is NH */
    struct l3d_model_spec c = a, d;
    c.pos = L3D_POS_LEARNED;
    d = c;
    d.rope.theta = 10000;
    CHECK(l3d_model_same(&c, &d));
    c = a, c.mlp = L3D_MLP_GELU, c.ffn = 256, d = c, d.ffn = 0;
    CHECK(l3d_model_same(&c, &d));
    c = a, c.NKV = 4, d = c, d.NKV = 0;
    CHECK(l3d_model_same(&c, &d));
}

/* GPT-2's blocks whatever the MLP's width and epsilon; plain GPT-2 only with 4 C and 1e-5 (or 0,
 * unfinished); each architecture field away from GPT-2's breaks both. */
static void test_is_gpt2(void) {
    struct l3d_model_spec g;
    CHECK(l3d_model_preset(&g, "gpt2") == L3D_OK);
    CHECK(l3d_model_gpt2_blocks(&g) && l3d_model_is_gpt2(&g));
    struct l3d_model_spec c = g;
    c.ffn = 2LL * g.C;
    CHECK(l3d_model_gpt2_blocks(&c) && !l3d_model_is_gpt2(&c));
    c = g, c.ffn = 0;
    CHECK(l3d_model_is_gpt2(&c));
    c = g, c.norm_eps = 1e-6f;
    CHECK(l3d_model_gpt2_blocks(&c) && !l3d_model_is_gpt2(&c));
    c = g, c.norm_eps = 0.0f;
    CHECK(l3d_model_is_gpt2(&c));
#define BREAKS(field, value)                                                                    \
    do {                                                                                        \
        c = g;                                                                                  \
        c.field = value;                                                                        \
        CHECK(!l3d_model_gpt2_blocks(&c) && !l3d_model_is_gpt2(&c));                            \
    } while (0)
    BREAKS(arch, L3D_ARCH_LLAMA);
    BREAKS(NKV, g.NH / 2);
    BREAKS(norm, L3D_NORM_RMSNORM);
    BREAKS(mlp, L3D_MLP_SWIGLU);
    BREAKS(pos, L3D_POS_ROPE);
    BREAKS(no_bias, true);
    BREAKS(untied, true);
#undef BREAKS
    c = g, c.NKV = g.NH; /* as many KV heads as heads: multi-head attention still */
    CHECK(l3d_model_is_gpt2(&c));
}

int main(void) {
    test_layout_rules();
    test_ep_rules();
    test_batch_rules();
    test_precision_rules();
    test_precision_param();
    test_every_rule_said();
    test_param_bytes();
    test_presets();
    test_architecture();
    test_model_same();
    test_is_gpt2();
    return TEST_REPORT();
}
