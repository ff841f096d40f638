#!/usr/bin/env bash
# QK-norm (Qwen3's per-head RMSNorm of the queries and keys, --qk-norm) on the layouts: tensor
# parallelism (its two weights replicated, their gradients summed over the group) with and without
# sequence parallelism, a two-stage pipeline with 1F1B and with zb-h1 (the norms' gradients come
# with B), context parallelism, ZeRO-3 and, with experts (Qwen3-MoE's blocks), expert, tensor and
# pipeline parallelism, each against one process within 1e-5 (TP's other product shapes: 3e-5, as equiv.sh),
# and bf16 tp2 SP against one bf16 process (mixed.sh's bounds);
# the flag changes the run (a model without it is DIFFERENT); the manifest keeps it and a resume
# without it is refused; generation through the KV cache and through the whole forward agree.
# Usage: qknorm.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus qknorm

QWEN=(--arch llama --kv-heads 2 --ffn 192 --qk-norm --layers 4)
TRAIN_FLAGS=("${TINY[@]}" "${QWEN[@]}" --steps 6 --warmup 2 --lr 1e-3 --eps 1e-6)
TRAIN_LOG=check

train ref 0 4 --save-every 3 || exit 1
train tp2 2 4 --tp 2 && cmp_same "qk-norm tp2 against one process" tp2 ref --rtol 3e-5
train tp2sp 2 4 --tp 2 --sequence-parallel &&
    cmp_same "qk-norm tp2 SP against one process" tp2sp ref --rtol 3e-5
train pp2 2 2 --grad-accum 2 --pp 2 && cmp_same "qk-norm pp2 1F1B against one process" pp2 ref --rtol 1e-5
train cp2 2 4 --cp 2 && cmp_same "qk-norm cp2 against one process" cp2 ref --rtol 3e-5
train z3 2 2 --zero 3 && cmp_same "qk-norm dp2 ZeRO-3 against one process" z3 ref --rtol 3e-5
train zb 2 2 --grad-accum 2 --pp 2 --pp-schedule zb-h1 --recompute full &&
    cmp_same "qk-norm pp2 zb-h1 recompute full against one process" zb ref --rtol 1e-5
# Qwen3-MoE's blocks (QK-norm and 4 experts, top-2 unnormalised): ep2 on 2 ranks against one
# process on their two micro-batches (the router's losses are per micro-batch, as ep.sh)
QMOE=(--moe-experts 4 --moe-top-k 2 --moe-ffn 96)
train qmoe_ref 0 2 --grad-accum 2 "${QMOE[@]}" && train qmoe_ep2 2 2 --ep 2 "${QMOE[@]}" &&
    cmp_same "qk-norm with experts: ep2 against one process" qmoe_ep2 qmoe_ref --rtol 1e-5
train qmoe_one 0 2 "${QMOE[@]}" && train qmoe_tp2 2 2 --tp 2 "${QMOE[@]}" &&
    cmp_same "qk-norm with experts: tp2 against one process" qmoe_tp2 qmoe_one --rtol 3e-5
train qmoe_pp2 2 2 --pp 2 "${QMOE[@]}" &&
    cmp_same "qk-norm with experts: pp2 against one process" qmoe_pp2 qmoe_one --rtol 1e-5
# 16 bits: tp2 SP against one bf16 process within mixed.sh's bounds (llama.sh's; the gradient
# norm measured 3.7e-4 off, 3.4e-4 with L3D_ATTN_DNNL=1, whose attention rounds P to bf16, on an
# Intel AMX machine; 5.2e-4 on an AMD EPYC one (AVX512-BF16, no AMX: oneDNN's other bf16
# kernels), 2026-12-07, weights 7.0e-3: so the norms at mixed.sh's 2e-3, not the losses' bound)
B16=(--precision bf16 --eps 1e-4)
train b1 0 4 "${B16[@]}" && train b_tp2 2 4 --tp 2 --sequence-parallel "${B16[@]}" &&
    if "$bin" compare --loss-rtol 4.9e-4 --norm-rtol 2e-3 --weights-rtol 0.031 "$dir/b_tp2" "$dir/b1" > "$dir/b.cmp" 2>&1
    then ok "qk-norm bf16 tp2 SP against one bf16 process"; else bad "qk-norm bf16 tp2 SP"; cat "$dir/b.cmp"; fi
# negative: the same model without QK-norm trains differently
train plain 0 4 --no-qk-norm
if "$bin" compare --rtol 1e-5 "$dir/plain" "$dir/ref" > "$dir/plain.cmp" 2>&1
then bad "a run without --qk-norm compares SAME"; else ok "a run without --qk-norm differs"; fi

ck=$(printf '%s/ref/checkpoints/step_%08d' "$dir" 3)
check "the manifest records qk_norm" grep -q "^arch family llama .* qk_norm 1$" "$ck/manifest"
TRAIN_LOG= expect_error "a qk-norm checkpoint resumed without it" "MLP 192, qk-norm), not the configured .*(llama, 2 of 16, 192): give" \
    train again 0 4 --resume "$ck" --no-qk-norm

# generation: the KV cache's incremental path against the whole forward, greedy
kv_cache_agrees "$dir/ref/model.bin"
exit $fail
