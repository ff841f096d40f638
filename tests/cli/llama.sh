#!/usr/bin/env bash
# Llama-family models (RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head) beyond the
# fp32 layouts of equiv.sh: sharded checkpoints that resume bit-identically and re-slice across
# layouts, the architecture kept in checkpoints and model.bin (a GPT-2 run of the same sizes is
# refused), 16-bit layouts against one 16-bit process (mixed.sh's bounds), fp16 with loss
# scaling against fp32, and generation from the run's model.bin.
# Usage: llama.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus llama

# the tiny model with Llama's blocks: 4 query heads over 2 key/value heads, SwiGLU of 192
LLAMA=(--arch llama --kv-heads 2 --ffn 192)
TRAIN_FLAGS=("${TINY[@]}" "${LLAMA[@]}" --steps 10 --warmup 3 --lr 1e-3 --eps 1e-6)
TRAIN_LOG=check
step_dir() { printf '%s/%s/checkpoints/step_%08d' "$dir" "$1" "$2"; }
# from NAME STEP_DIR NP B [flags]: continues a run from a checkpoint in its own output directory,
# starting from the uninterrupted run's metrics (the resume trims them to the checkpoint's step)
from() {
    local name=$1 ckpt=$2
    rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name" && cp "$dir/ref/metrics.jsonl" "$dir/$name/"
    shift 2
    train "$name" "$@" --resume "$ckpt"
}

# ---- checkpoints -------------------------------------------------------------------------------
train ref 0 4 || exit 1
train A 2 4 --tp 2 --save-every 5 || exit 1
check "the manifest records the architecture" grep -q "^arch family llama kv_heads 2 rmsnorm 1" \
    "$(step_dir A 5)/manifest"
if from exactA "$(step_dir A 5)" 2 4 --tp 2 --save-every 5 &&
   cmp -s "$dir/exactA/model.bin" "$dir/A/model.bin" &&
   cmp -s "$(step_dir exactA 10)/rank_00001.bin" "$(step_dir A 10)/rank_00001.bin"; then
    ok "exact resume tp2: identical step-10 checkpoint and weights"
else
    bad "exact resume tp2"
fi
# re-sliced: tp 2's step 5 continued by one process and by a two-stage pipeline (2 x 2
# micro-batches: the same global batch), against the uninterrupted run (TP's other product
# shapes: 3e-5, as equiv.sh's pp2_tp2)
from one "$(step_dir A 5)" 0 4 && cmp_same "tp2 resumed by one process" one ref --rtol 3e-5
from pp2 "$(step_dir A 5)" 2 2 --grad-accum 2 --pp 2 && cmp_same "tp2 resumed as pp2" pp2 ref --rtol 3e-5
# the architecture is part of the model: GPT-2's blocks of the same sizes are refused
TRAIN_LOG= expect_error "a Llama checkpoint resumed as GPT-2" "holds a model .*(llama, 2 key/value heads of 16, MLP 192), not the configured .*(gpt2" \
    train gpt 0 4 --resume "$(step_dir A 5)" --arch gpt2 --kv-heads 4 --ffn 256
TRAIN_LOG= expect_error "a Llama model.bin loaded as GPT-2" "disagree with --init-from .*model.bin, whose model is llama with 2 key/value heads and an MLP of 192" \
    train gpt 0 4 --init-from "$dir/ref/model.bin" --arch gpt2 --kv-heads 4 --ffn 256

# ---- 16 bits -----------------------------------------------------------------------------------
# a layout against one process, both bf16: per-step loss u/4, fp32 master weights 16u, gradient
# norms 2e-3 (mixed.sh's three bounds; the norms were held to the losses' 4.9e-4 until an AMD EPYC
# machine's bf16 kernels (AVX512-BF16, no AMX) measured 5.2e-4 for qknorm.sh's tp2 SP pair)
B16=(--precision bf16 --eps 1e-4)
train b1 0 4 "${B16[@]}" || exit 1
train b_tp2 2 4 --tp 2 --sequence-parallel "${B16[@]}" &&
    cmp_same "bf16 tp2 SP against one bf16 process" b_tp2 b1 --loss-rtol 4.9e-4 --norm-rtol 2e-3 --weights-rtol 0.031
train b_pp2 2 2 --grad-accum 2 --pp 2 --recompute full "${B16[@]}" &&
    cmp_same "bf16 pp2 recompute full against one bf16 process" b_pp2 b1 --loss-rtol 4.9e-4 --norm-rtol 2e-3 --weights-rtol 0.031
train b_dp2 2 2 --zero 2 "${B16[@]}" &&
    cmp_same "bf16 dp2 ZeRO-2 against one bf16 process" b_dp2 b1 --loss-rtol 4.9e-4 --norm-rtol 2e-3 --weights-rtol 0.031
# fp16 with dynamic loss scaling against fp32: every step's loss within 4u = 2.0e-3 (mixed.sh)
train h1 0 4 --precision fp16 --initial-loss-scale 1024 &&
    cmp_same "fp16 (loss scaling) against fp32" h1 ref --loss-rtol 2e-3 --norm-rtol 2e-3 --weights-rtol 1

# ---- generation ------------------------------------------------------------------------------
# the run's model.bin (the architecture in its header) generates through the KV cache
if "$bin" generate --checkpoint "$dir/ref/model.bin" --tokenizer bytes --prompt "row 1" \
       --max-tokens 20 --temperature 0 > "$dir/gen.txt" 2> "$dir/gen.log" &&
   [ "$(wc -c < "$dir/gen.txt")" -ge 20 ]; then
    ok "generate from a Llama model.bin: $(head -c 60 "$dir/gen.txt" | tr '\n' ' ')"
else
    bad "generate from a Llama model.bin"; cat "$dir/gen.log"
fi
exit $fail
