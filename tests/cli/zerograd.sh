#!/usr/bin/env bash
# The gradients are zero after every optimizer step wherever the next step accumulates into them
# (docs/DESIGN.md, "The optimizer's pass over the flat buffers"): the fused AdamW zeroes the range
# it reads, memsets the rest (ZeRO-1's other ranks' ranges, ZeRO-2's model buffers), and a skipped
# step zeroes everything. L3D_TEST_ZERO_GRADS=1 makes the trainer look after each step
# (src/train/step.c) and stop, naming the rank and the buffer, where one is not zero; negative
# case: =poison writes a nonzero gradient first, which must be reported.
# Usage: zerograd.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus zerograd
TRAIN_FLAGS=("${TINY[@]}" --steps 3 --warmup 1 --lr 1e-3)
TRAIN_LOG=check
export L3D_TEST_ZERO_GRADS=1
fail=0
train z_fp32 0 2 --grad-accum 2 --precision fp32 && ok "fp32, two micro-batches a step"
train z_bf16 0 2 --grad-accum 1 --precision bf16 && ok "bf16 mixed precision"
# an fp16 step skipped for a NaN gradient (step 2 on rank 0) must still zero the gradients
L3D_TEST_NAN_AT_STEP=2:0 train z_fp16_skip 0 2 --grad-accum 1 --precision fp16 \
    --initial-loss-scale 1024 && grep -q '"skipped":true' "$dir/z_fp16_skip/metrics.jsonl" &&
    ok "fp16 with a skipped step"
train z_zero1 2 2 --grad-accum 1 --zero 1 && ok "ZeRO-1 on 2 ranks: each rank's range and the rest"
train z_zero2 2 2 --grad-accum 2 --zero 2 --precision bf16 && ok "ZeRO-2 on 2 ranks, bf16"
train z_zbh1 2 2 --grad-accum 4 --layers 4 --pp 2 --pp-schedule zb-h1 &&
    ok "zero-bubble pipeline (zb-h1) on 2 ranks"
expect_error --once "a nonzero gradient after the step is reported" \
    "L3D_TEST_ZERO_GRADS: rank 0, model chunk 0: the gradients are not zero" \
    env L3D_TEST_ZERO_GRADS=poison OMP_NUM_THREADS=1 "$bin" train "${TRAIN_FLAGS[@]}" --batch 2 \
    --grad-accum 1 --out "$dir/z_poison"
exit $fail
