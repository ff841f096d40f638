#!/usr/bin/env bash
# A head's size apart from channels / heads (--head-dim, Qwen3's head_dim; the layouts' equivalence
# is in equiv.sh and cp.sh, the planner's memory in plan.sh): the flag changes the run (a model
# without it is DIFFERENT); the manifest and run.yaml keep it; a checkpoint saved under tp2 resumes
# on one process and one saved by one process under pp2 x tp2 (resharded), each continuing as its
# uninterrupted run; bf16 tp2 SP as one bf16 process; a resume with another head size is refused
# naming both; generation through the KV cache and through the whole forward agree; the presets
# qwen3-30b-a3b and qwen3-235b-a22b are planned with their published counts; what cannot be is
# refused in one line.
# Usage: headdim.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus headdim

# 4 heads of 24 over 64 channels (C / NH would be 16) over 2 key/value heads, QK-norm
HD=(--arch llama --kv-heads 2 --ffn 192 --qk-norm --layers 4 --head-dim 24)
TRAIN_FLAGS=("${TINY[@]}" "${HD[@]}" --steps 6 --warmup 2 --lr 1e-3 --eps 1e-6)
TRAIN_LOG=check
step_dir() { printf '%s/%s/checkpoints/step_%08d' "$dir" "$1" "$2"; }

train ref 0 4 --save-every 3 || exit 1
ck=$(step_dir ref 3)
check "the manifest records head_dim" grep -q "^arch family llama .* qk_norm 1 head_dim 24$" "$ck/manifest"
check "run.yaml keeps it" grep -q "^  head-dim: 24$" "$dir/ref/run.yaml"
check "inspect: 2 key/value heads of 24" sh -c "'$bin' inspect '$dir/ref/model.bin' | grep -q '2 key/value heads of 24'"
# negative: the heads of C / NH train another model
TRAIN_LOG= train plain 0 4 --head-dim 16 > /dev/null 2>&1
if "$bin" compare --rtol 1e-5 "$dir/plain" "$dir/ref" > "$dir/plain.cmp" 2>&1
then bad "a run with heads of 16 compares SAME"; else ok "a run with heads of 16 differs"; fi

# checkpoints: saved under tp2, resumed on one process as the tp2 run goes on; saved by one
# process, resumed resharded over pp2 x tp2 as it goes on (TP's other summation order: 3e-5, as
# equiv.sh; the tp2 run's first steps against one process's: AdamW's steps on near-zero gradients
# measured 3.4e-5 of attprojw's size after 6, so the tp2 run is its own reference)
train ck_tp2 2 4 --tp 2 --save-every 3 &&
    train tp2_on_one 0 4 --resume "$(step_dir ck_tp2 3)" &&
    cmp_same "a tp2 checkpoint resumed on one process" tp2_on_one ck_tp2 --rtol 3e-5
train one_on_pp2_tp2 4 2 --grad-accum 2 --resume "$ck" --pp 2 --tp 2 &&
    cmp_same "one process's checkpoint resumed over pp2 x tp2" one_on_pp2_tp2 ref --rtol 3e-5
TRAIN_LOG= expect_error "a head_dim 24 checkpoint resumed with heads of 32" \
    "2 key/value heads of 24, MLP 192, qk-norm), not the configured .*(llama, 2 of 32, 192, qk-norm): give" \
    train again 0 4 --resume "$ck" --head-dim 32

# 16 bits (the tiled bf16 attention on heads of 24): tp2 SP against one bf16 process within
# mixed.sh's bounds (qknorm.sh's), the gradient norm within u/2 = 2e-3 (the checking backend
# measured 1.29e-3 at step 3, its losses 1.1e-4: each rank's bf16-rounded partial sums)
B16=(--precision bf16 --eps 1e-4)
train b1 0 4 "${B16[@]}" && train b_tp2 2 4 --tp 2 --sequence-parallel "${B16[@]}" &&
    cmp_same "bf16 tp2 SP against one bf16 process" b_tp2 b1 --loss-rtol 4.9e-4 --norm-rtol 2e-3 --weights-rtol 0.031

# generation: the KV cache's incremental path against the whole forward, greedy
kv_cache_agrees "$dir/ref/model.bin"

# the presets: planned with their published counts and head size
for p in "qwen3-30b-a3b 3.05e+10 3.35e+09" "qwen3-235b-a22b 2.35e+11 2.22e+10"; do
    set -- $p
    check "plan --model $1: $2 parameters, $3 active, heads of 128" sh -c "'$bin' plan --model $1 --profile dgx-h100 --devices 64 --global-batch 64 --top 1 | grep -q 'head-dim=128 .* $2 parameters' && '$bin' plan --model $1 --profile dgx-h100 --devices 64 --global-batch 64 --top 1 | grep -q '$3 parameters active'"
done

# refused in one line, naming the flag and the value
TRAIN_LOG= expect_error "an odd head size with RoPE" "rotary positions need an even head size, not 23 (--head-dim): give an even --head-dim" \
    train odd 0 2 --head-dim 23
TRAIN_LOG= expect_error "tp that splits the key/value heads" "\-\-tp 4 does not divide the model's 2 key/value heads" \
    train tp4 0 2 --tp 4 --dp 1
expect_error "plan: an odd head size" "rotary positions need an even head size, not 23: give an even --head-dim" \
    "$bin" plan --arch llama --kv-heads 2 --ffn 192 --head-dim 23 --layers 2 --channels 64 --heads 4 \
    --vocab 256 --seq-len 32 --profile dgx-h100 --devices 1 --global-batch 1
expect_error "a head size of 0" "\-\-head-dim" "$bin" train "${TINY[@]}" --head-dim 0 --out "$dir/zero"
exit $fail
