#!/usr/bin/env bash
# Expert parallelism end to end (include/llm3d/ep.h; README "Mixture of experts"): --ep 2 on 2
# ranks (each rank 2 of moe-tiny's 4 experts) and on 4 ranks (dp 4: two expert-data-parallel
# replicas of each expert half) train the same model as one process on the same micro-batches
# (llm3d compare --rtol 1e-5, as tests/cli/moe.sh), dropless, with a capacity that drops and in
# bf16, under ZeRO-0, 1 and 2; a checkpoint saved under ep 2 resumes bit-identically, and under
# another ep (1, 4) or from one process's checkpoint the same training; the refusals give one
# clear line each.
# Usage: ep.sh LLM3D SCRATCH_DIR.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"
# bf16 attention on the widened fp32 path on every CPU (the default of Intel's and AVX2 ones):
# the bf16 pairs below compare a mixture of experts at one seed, where a token near a tie between
# two experts goes to either one by the last bits of its activations; the dot products, the
# default on AMD CPUs (cpu_attn16.h), move those bits, and the sanitized build on the checking
# backend then sent one token of ep2_zero2_bf16 to the other expert (expfcb 0.098 of its size off,
# losses 7.7e-5, norms 9.7e-5; the CPU build passed). What the pairs test, the experts' exchange
# and shards, does not depend on attention's path; the dot products' layouts are cp.sh's,
# mixed.sh's and ep_layouts.sh's (its MoE bf16 layouts pass with them in both builds).
export L3D_ATTN_DOT=0

byte_corpus ep
TRAIN_FLAGS=("${TINY[@]}" --model moe-tiny --steps 6 --warmup 3 --lr 1e-3 --eps 1e-6)
TRAIN_LOG=check

# one process on the micro-batches of 2 and of 4 ranks (--grad-accum: the router's auxiliary
# losses and capacity are per micro-batch, as on each rank); a capacity that drops, a leading
# dense layer and a shared expert in the second case
for cf in 0 0.5; do
    moe=(--moe-capacity-factor "$cf")
    [ "$cf" = 0 ] || moe+=(--moe-dense-layers 1 --moe-shared-experts 1)
    for np in 2 4; do
        train "ref${np}_cf$cf" 0 2 --grad-accum "$np" "${moe[@]}" || continue
        name="ep2_np${np}_cf$cf"
        train "$name" "$np" 2 --ep 2 "${moe[@]}" || continue
        same_run "$name" "ref${np}_cf$cf"
    done
done
# same16 NAME REF: a 16-bit run against its one-process reference within mixed.sh's layout
# tolerances (bf16 sums in another order: loss 4.9e-4, gradient norms 2e-3, weights 0.031; the
# sanitized build on the checking backend measured 1.0e-5 and 8.5e-4 where the CPU build matched
# to 1e-5)
same16() {
    if "$bin" compare --loss-rtol 4.9e-4 --norm-rtol 2e-3 --weights-rtol 0.031 "$dir/$1" \
        "$dir/$2" > "$dir/$1.cmp" 2>&1; then
        ok "$1 matches $2 within the 16-bit tolerances ($(tr '\n' ' ' < "$dir/$1.cmp"))"
    else
        bad "$1 against $2"; cat "$dir/$1.cmp"; return 1
    fi
}
# ZeRO-1/2 shard over the ranks holding the same experts (the other slices summed over the EP
# group first): on 2 ranks (a group of one) and on 4 (two), and in bf16 (master weights)
for run in "2 1" "2 2" "4 1" "4 2"; do
    read -r np zero <<< "$run"
    train "ep2_np${np}_zero$zero" "$np" 2 --ep 2 --zero "$zero" && same_run "ep2_np${np}_zero$zero" "ref${np}_cf0"
done
train ref4_bf16 0 2 --grad-accum 4 --precision bf16 &&
    train ep2_zero2_bf16 4 2 --ep 2 --zero 2 --precision bf16 && same16 ep2_zero2_bf16 ref4_bf16
# full recomputation re-runs the block's exchange inside backward: bit-identical to none
if train ep2_rc 2 2 --ep 2 --recompute full &&
   cmp -s "$dir/ep2_rc/model.bin" "$dir/ep2_np2_cf0/model.bin"; then
    ok "--ep 2 --recompute full: model.bin identical to no recomputation"
else
    bad "--ep 2 --recompute full differs"
fi
# mixed precision: the rows travel in bf16 (the router fp32, as in moe.sh)
train ref2_bf16 0 2 --grad-accum 2 --precision bf16 && train ep2_bf16 2 2 --ep 2 --precision bf16 &&
    same16 ep2_bf16 ref2_bf16
grep -q "expert parallelism: ep 2, 2 of the 4 experts a rank, 2 replica(s) of each" \
    "$dir/ep2_np4_cf0.log" && ok "the start-up report says the split" || bad "no expert split reported"
grep -q '"moe_dropped":[1-9]' "$dir/ep2_np2_cf0.5/metrics.jsonl" &&
    ok "capacity factor 0.5 drops assignments under --ep 2" || bad "capacity factor 0.5 dropped nothing"
# the negative case of the comparison: ep 2 against the one-process run of other micro-batches
if "$bin" compare --rtol 1e-5 "$dir/ep2_np2_cf0" "$dir/ref4_cf0" > /dev/null 2>&1; then
    bad "compare took ep2 on 2 ranks for the 4-micro-batch run"
else
    ok "compare tells ep2 on 2 ranks from the 4-micro-batch run"
fi

# checkpoint at step 3 under ep 2, resumed to step 6: bit-identical weights and checkpoint files
# (each EP rank writes its experts); resuming it under another ep is refused by name
if train ck 2 2 --ep 2 --save-every 3 && mkdir -p "$dir/ck2" && cp "$dir/ck/metrics.jsonl" "$dir/ck2/" &&
   train ck2 2 2 --ep 2 --save-every 3 --resume "$dir/ck/checkpoints/step_00000003" &&
   cmp -s "$dir/ck/model.bin" "$dir/ck2/model.bin" &&
   cmp -s "$dir/ck/checkpoints/step_00000006/rank_00000.bin" "$dir/ck2/checkpoints/step_00000006/rank_00000.bin" &&
   cmp -s "$dir/ck/checkpoints/step_00000006/rank_00001.bin" "$dir/ck2/checkpoints/step_00000006/rank_00001.bin"; then
    ok "--ep 2 checkpoint save and resume: bit-identical model.bin and step-6 rank files"
else
    bad "--ep 2 checkpoint resume"; cat "$dir/ck2.log" 2>/dev/null
fi
same_run ck ref2_cf0 # the run that saved, against one process
# re-slicing: a checkpoint saved under one ep resumes under another (the experts' rows placed by
# their global index, src/ckpt/load.c), the same training as the run that saved it
resumed() { # NAME NP B SAVED [flags]: resumes SAVED's step-3 checkpoint, compared with SAVED
    local name=$1 np=$2 b=$3 saved=$4
    shift 4
    mkdir -p "$dir/$name" && cp "$dir/$saved/metrics.jsonl" "$dir/$name/" &&
        train "$name" "$np" "$b" --resume "$dir/$saved/checkpoints/step_00000003" "$@" &&
        same_run "$name" "$saved"
}
resumed ck_ep1 2 2 ck                        # ep 2 -> ep 1, two ranks
resumed ck_one 0 2 ck --grad-accum 2         # ep 2 -> one process
train ck1 0 2 --grad-accum 2 --save-every 3 &&
    resumed ck1_ep2 2 2 ck1 --ep 2           # one process -> ep 2
train ck4 4 1 --ep 2 --zero 1 --save-every 3 &&
    resumed ck4_ep4 4 1 ck4 --ep 4           # ep 2 ZeRO-1 on 4 ranks (2 replicas) -> ep 4
# ZeRO-1 under ep 2 on 4 ranks resumed as it was: bit-identical (each rank's moment range)
if mkdir -p "$dir/ck4b" && cp "$dir/ck4/metrics.jsonl" "$dir/ck4b/" &&
   train ck4b 4 1 --ep 2 --zero 1 --save-every 3 --resume "$dir/ck4/checkpoints/step_00000003" &&
   cmp -s "$dir/ck4/model.bin" "$dir/ck4b/model.bin" &&
   cmp -s "$dir/ck4/checkpoints/step_00000006/rank_00003.bin" "$dir/ck4b/checkpoints/step_00000006/rank_00003.bin"; then
    ok "--ep 2 --zero 1 on 4 ranks: resume bit-identical"
else
    bad "--ep 2 --zero 1 resume"; cat "$dir/ck4b.log" 2>/dev/null
fi

# refusals, one clear line each
train_cmd bad_e 4 2 --ep 4 --moe-experts 6
expect_error --once "ep not dividing the experts" "--ep 4 does not divide --moe-experts 6" "${CMD[@]}"
train_cmd bad_dp 4 2 --ep 3 --moe-experts 6
expect_error --once "ep not dividing dp" "--ep 3 does not divide the 4 data-parallel replicas" \
    "${CMD[@]}"
train_cmd bad_moe 2 2 --ep 2 --model tiny
expect_error --once "ep without MoE" "--ep 2 without --moe-experts" "${CMD[@]}"
exit $fail
