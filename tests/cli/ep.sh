#!/usr/bin/env bash
# Expert parallelism end to end (include/llm3d/ep.h; README "Mixture of experts"): --ep 2 on 2
# ranks (each rank 2 of moe-tiny's 4 experts) and on 4 ranks (dp 4: two expert-data-parallel
# replicas of each expert half) train the same model as one process on the same micro-batches
# (llm3d compare --rtol 1e-5, as tests/cli/moe.sh), dropless and with a capacity that drops; a
# checkpoint saved under ep 2 resumes bit-identically; the refusals give one clear line each.
# Usage: ep.sh LLM3D SCRATCH_DIR.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

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
        if "$bin" compare --rtol 1e-5 "$dir/$name" "$dir/ref${np}_cf$cf" > "$dir/$name.cmp" 2>&1; then
            ok "$name matches one process ($(tr '\n' ' ' < "$dir/$name.cmp"))"
        else
            bad "$name"; cat "$dir/$name.cmp"
        fi
    done
done
grep -q '"moe_dropped":[1-9]' "$dir/ep2_np2_cf0.5/metrics.jsonl" &&
    ok "capacity factor 0.5 drops assignments under --ep 2" || bad "capacity factor 0.5 dropped nothing"
# the negative case of the comparison: ep 2 against the one-process run of other micro-batches
if "$bin" compare --rtol 1e-5 "$dir/ep2_np2_cf0" "$dir/ref4_cf0" > /dev/null 2>&1; then
    bad "compare took ep2 on 2 ranks for the 4-micro-batch run"
else
    ok "compare tells ep2 on 2 ranks from the 4-micro-batch run"
fi
exit $fail
