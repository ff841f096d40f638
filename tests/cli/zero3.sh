#!/usr/bin/env bash
# ZeRO-3 (parameters sharded over the data-parallel ranks, gathered layer by layer): the same
# model as one process on the same global batch and seed, as equiv.sh holds every layout to
# (losses, gradient norms and final weights within 1e-5; its AdamW eps of 1e-6 for the reason it
# gives), over dp 2 and 4, with TP and PP, gradient accumulation, recomputation, prefetch depths
# and blocking gathers; a checkpoint that moves ZeRO-3 dp4 -> ZeRO-1 dp2 -> one process; a
# perturbed gather (L3D_TEST_ZERO3_PERTURB) that the comparison must reject; bad flags refused.
# Usage: zero3.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC.
source "$(dirname "$0")/lib/checks.sh" # fail, full, train, expect_error
start_test "$@"

byte_corpus zero3
fail=0
steps=6
TRAIN_FLAGS=("${TINY[@]}" --steps $steps --warmup 2 --lr 1e-3 --eps 1e-6)

# same NAME REF [RTOL or "compare's tolerance flags"]: the run NAME trained the model of REF
# (llm3d compare; --rtol 1e-5 by default)
same() {
    local tol=(${3:-1e-5})
    [ "${#tol[@]}" = 1 ] && tol=(--rtol "${tol[0]}")
    if "$bin" compare "${tol[@]}" "$dir/$1" "$dir/$2" > "$dir/$1.cmp" 2>&1; then
        ok "$1 = $2 ($(tr '\n' ' ' < "$dir/$1.cmp"))"
    else
        bad "$1 differs from $2:"; cat "$dir/$1.cmp"
    fi
}
# run NAME NP B ACCUM [flags]: a run that must train (its log in $dir/NAME.log)
run() {
    local name=$1 np=$2 b=$3 accum=$4
    shift 4
    TRAIN_LOG=check train "$name" "$np" "$b" --grad-accum "$accum" "$@"
}

# one-process references: 4 sequences a step, in one micro-batch or in 2 (accumulation), 2 and 4
# layers (the pipeline's)
run ref 0 4 1 --layers 2
run ref_a2 0 2 2 --layers 2
run ref_l4_a4 0 2 4 --layers 4
run dp2 2 2 1 --layers 2 --zero 3 && same dp2 ref
run dp2_accum 2 1 2 --layers 2 --zero 3 && same dp2_accum ref_a2
run dp2_recompute_full 2 2 1 --layers 2 --zero 3 --recompute full && same dp2_recompute_full ref
run dp2_prefetch0_blocking 2 2 1 --layers 2 --zero 3 --zero3-prefetch 0 --comm blocking &&
    same dp2_prefetch0_blocking ref
run dp2_prefetch3_poll 2 2 1 --layers 2 --zero 3 --zero3-prefetch 3 --progress poll &&
    same dp2_prefetch3_poll ref
run dp4 4 1 1 --layers 2 --zero 3 && same dp4 ref
run ref_b4_a2 0 4 2 --layers 2
run dp4_accum_recompute 4 1 2 --layers 2 --zero 3 --recompute full &&
    same dp4_accum_recompute ref_b4_a2
# TP: each TP rank's slice sharded over its DP group; 3e-5 for TP's other product shapes
# (equiv.sh, pp2_tp2)
run tp2_dp2 4 2 1 --layers 2 --zero 3 --tp 2 && same tp2_dp2 ref 3e-5
run tp2_sp_dp2_accum 4 1 2 --layers 2 --zero 3 --tp 2 --sequence-parallel &&
    same tp2_sp_dp2_accum ref_a2 3e-5
# PP: every stage's forward and backward of every micro-batch gathers its layers
# 2e-5: since GELU's SIMD form (2026-12-07) the key run's fcb is 1.1e-5 off at this seed (3.8e-6
# with the old form), round-off that AdamW's eps turns into steps: at seeds 7 and 11 the same runs
# are 1.3e-6 and 2.5e-6 off with the new form, 1.4e-6 and 1.6e-6 with the old; losses 1e-8
run pp2_dp2 4 1 4 --layers 4 --zero 3 --pp 2 && same pp2_dp2 ref_l4_a4 2e-5
run pp2_dp2_recompute_v2 4 1 4 --layers 4 --zero 3 --pp 2 --pp-virtual 2 --recompute full &&
    same pp2_dp2_recompute_v2 ref_l4_a4 2e-5
# mixed precision: the gathers move bf16; the one-process bf16 run trains the same model up to
# the order of the gradient sums: mixed.sh's bounds for 16-bit layouts (losses 4.9e-4, norms
# 2e-3, weights 0.031; a single 2e-3 until an AMD EPYC machine (AVX512-BF16, no AMX), 2026-12-07,
# measured the weights 4.6e-3 off, qkvb, the key bias that is round-off only; losses 3.4e-5,
# norms 2.1e-5)
run ref_bf16 0 4 1 --layers 2 --precision bf16
run dp2_bf16 2 2 1 --layers 2 --zero 3 --precision bf16 &&
    same dp2_bf16 ref_bf16 "--loss-rtol 4.9e-4 --norm-rtol 2e-3 --weights-rtol 0.031"

# the negative case: layer 0's first LayerNorm weights zeroed in one rank's gathered buffer must
# show, by far (measured: losses 2.7e-3 apart, norms 3.9e-2, weights 0.75, against 1e-5; one
# element of the slice moved the losses by 2.4e-5 only)
if L3D_TEST_ZERO3_PERTURB=1 train dp2_perturbed 2 2 --layers 2 --zero 3 > "$dir/dp2_perturbed.log" 2>&1; then
    if "$bin" compare --rtol 1e-5 "$dir/dp2_perturbed" "$dir/ref" > "$dir/dp2_perturbed.cmp" 2>&1; then
        bad "a perturbed gather trained the reference's model:"; cat "$dir/dp2_perturbed.cmp"
    else
        ok "a perturbed gather differs ($(grep -m1 -i differ "$dir/dp2_perturbed.cmp"))"
    fi
else
    bad "the perturbed run did not train:"; cat "$dir/dp2_perturbed.log"
fi

# checkpoints: ZeRO-3 dp4 saves at step 3; ZeRO-1 dp2 resumes it and saves at step 5; one
# process resumes that and finishes: the same model as the reference's 6 steps (re-sliced
# weights and AdamW moments, within 1e-5 as ckpt.sh's other layouts)
step_dir() { printf '%s/%s/checkpoints/step_%08d' "$dir" "$1" "$2"; }
# resumed NAME FROM NP B STEP [flags]: run FROM's checkpoint of STEP continued in NAME's own
# directory, which holds FROM's metrics (trimmed to the checkpoint's step by the resume)
resumed() {
    local name=$1 from=$2 np=$3 b=$4 step=$5
    shift 5
    rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name"
    cp "$dir/$from/metrics.jsonl" "$dir/$name/"
    TRAIN_LOG=check train "$name" "$np" "$b" --resume "$(step_dir "$from" "$step")" "$@"
}
# (every run takes all the steps, as the learning-rate schedule depends on them: the saver's
# later steps are not compared)
run ck_z3 4 1 1 --layers 2 --zero 3 --save-every 3 &&
    resumed ck_z1 ck_z3 2 2 3 --layers 2 --zero 1 --save-every 5 &&
    resumed ck_one ck_z1 0 4 5 --layers 2 && same ck_one ref
# and into ZeRO-3: a one-process checkpoint resumed as dp2 ZeRO-3
run ck1 0 4 1 --layers 2 --save-every 4 &&
    resumed ck1_z3 ck1 2 2 4 --layers 2 --zero 3 && same ck1_z3 ref
# ZeRO-3 to ZeRO-3 on the same layout resumes bit for bit
run ck3 2 2 1 --layers 2 --zero 3 --save-every 3 &&
    resumed ck3_resumed ck3 2 2 3 --layers 2 --zero 3 && same ck3_resumed dp2 0

# the memory check: 8 layers on 2 ranks need 7.0 MiB a rank under ZeRO-2, 6.7 under ZeRO-3
# (16N/dp with two gather buffers; both with --out's writers on rank 0: 0.2 MiB since they take
# the model a unit of rows at a time, 1.6 MiB more when they gathered it whole). A node of
# 13.7 MiB refuses ZeRO-2 and names --zero 3, which trains there (the plan used to count a whole
# fp32 copy always, and so never offered ZeRO-3 in place of ZeRO-2)
node=14365491
L3D_TEST_MEM_AVAILABLE=$node expect_error --once "a node of 16.5 MiB: ZeRO-2 refused, ZeRO-3 named" \
    "ZeRO-2, .* needs 7\.[0-1] MiB on rank 0 .*that fit: --zero 3 (6\.[6-8] MiB)" \
    train mem_z2 2 2 --layers 8 --zero 2
if L3D_TEST_MEM_AVAILABLE=$node train mem_z3 2 2 --layers 8 --zero 3 > "$dir/mem_z3.log" 2>&1; then
    ok "... and ZeRO-3 trains on it"
else
    bad "... ZeRO-3 did not train on it:"; cat "$dir/mem_z3.log"
fi
# saving, ZeRO-3 moves the fp32 parameters a piece at a time (at most the checkpoint's staging,
# 64 MiB): a device piece on DP rank 0 and the writer's host piece, both the whole model here
# (1.6 MiB each: 9.9 MiB, refused), or 16 KiB each with 16 KiB pieces: it trains on that node
L3D_TEST_MEM_AVAILABLE=$node expect_error --once "... saving with pieces of the whole model: refused" \
    "ZeRO-3, .* needs 9\.[0-9] MiB on rank 0" train mem_z3_save 2 2 --layers 8 --zero 3 --save-every 1
if L3D_CKPT_TEST_STAGE=16384 L3D_TEST_MEM_AVAILABLE=$node train mem_z3_save16k 2 2 --layers 8 \
    --zero 3 --save-every 1 > "$dir/mem_z3_save16k.log" 2>&1; then
    ok "... with 16 KiB pieces it saves on that node: $(grep '^memory check' "$dir/mem_z3_save16k.log")"
else
    bad "... with 16 KiB pieces it did not train there:"; cat "$dir/mem_z3_save16k.log"
fi
# ... and what it allocates: a ZeRO-3 dp4 run saving every step (4 KiB pieces) peaks where the
# same run without saves does (within 64 KiB; a whole fp32 copy on DP rank 0 and the writer's
# staging, the previous save, added 3.3 MiB here), and its checkpoint holds the bytes of the
# same state saved by one process (whole parameters, no pieces): the parameters of rank 0's file
# and each rank's AdamW range
peak() { sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$dir/$1.log"; }
run pk_nosave 4 1 1 --layers 8 --zero 3 &&
    L3D_CKPT_TEST_STAGE=4096 run pk_save 4 1 1 --layers 8 --zero 3 --save-every 1 &&
    if less_than "$(peak pk_save)" "$(($(peak pk_nosave) + 65536))"; then
        ok "ZeRO-3 dp4 saving in 4 KiB pieces peaks at $(peak pk_save) bytes, without saves $(peak pk_nosave)"
    else
        bad "ZeRO-3 dp4 saving peaks at $(peak pk_save) bytes, without saves $(peak pk_nosave)"
    fi
# the memory check bounds the accounted peak (issue 51), fp32 and bf16, dp 2 and 4, with wpe
# longer than the sequence (--context 256 at --seq-len 64): the plan used to count its extra
# rows as under ZeRO-1 (no parameter or gradient shard: 8/dp bytes a row element short in fp32),
# and to leave out the initialisation's 64 KiB host block and the gathers' request lists, 58 KiB
# under the peak at dp4 here (no --out: model.bin's copy would hide it). Still left out: ~30 KiB
# of bookkeeping (DP's pending lists, the backend's and the model's structs), above the check on
# --model tiny; here the plan's other slack covers it
bound() {
    local name=$1 np=$2
    shift 2
    if ! bounded env OMP_NUM_THREADS=1 "$mpiexec" -n "$np" "$bin" train --layers 4 --heads 4 --channels 128 \
        --vocab 256 --context 256 --seq-len 64 --val-every 0 --peak-gflops 100 --train "$dir/data/train_*.bin" \
        --batch 1 --steps 2 --zero 3 "$@" > "$dir/$name.log" 2>&1; then
        bad "$name did not train:"; cat "$dir/$name.log"; return
    fi
    local plan
    plan=$(sed -n 's/^memory check: .* MiB (\([0-9]*\) bytes) planned.*/\1/p' "$dir/$name.log")
    if [ -n "$plan" ] && ! less_than "$plan" "$(peak "$name")"; then
        ok "$name: peak $(peak "$name") bytes, the memory check's $plan"
    else
        bad "$name: peak $(peak "$name") bytes above the memory check's '$plan'"
    fi
}
bound bound_dp4 4
bound bound_dp2 2
bound bound_dp4_bf16 4 --precision bf16
bound bound_dp2_p2 2 --zero3-prefetch 2
# fields FILE_LINE_FIELD...: from a manifest's `file` lines, rank, params, opt_start, opt_count
fields() {
    awk '$1 == "file" { for (i = 2; i < NF; i++) v[$i] = $(i + 1);
                        print v["rank"], v["params"], v["opt_start"], v["opt_count"] }' "$1/manifest"
}
# (the last step's: the one process resumes with no step left and saves it again)
z3ck=$(step_dir pk_save $steps)
if [ -d "$z3ck" ] && resumed pk_one pk_save 0 4 $steps --layers 8 --save-every 1; then
    one=$(step_dir pk_one $steps) same_bytes=1
    read -r _ n _ _ < <(fields "$one")
    cmp -s -i 128:128 -n $((4 * n)) "$z3ck/rank_00000.bin" "$one/rank_00000.bin" || same_bytes=0
    while read -r r p s c; do
        [ "$c" -gt 0 ] || continue
        for k in 0 1; do # m, then v
            cmp -s -i $((128 + 4 * p + 4 * c * k)):$((128 + 4 * n + 4 * n * k + 4 * s)) -n $((4 * c)) \
                "$z3ck/rank_0000$r.bin" "$one/rank_00000.bin" || same_bytes=0
        done
    done < <(fields "$z3ck")
    if [ $same_bytes = 1 ] && [ "$n" -gt 0 ]; then
        ok "the dp4 pieces' checkpoint holds the one-process save's bytes ($n parameters)"
    else
        bad "the dp4 pieces' checkpoint differs from the one-process save of its state"
    fi
else
    bad "no ZeRO-3 checkpoint to compare, or it did not resume on one process"
fi

# --out under ZeRO-3: rank 0 writes model.bin and the folder a unit of rows at a time, never the
# whole model (it gathered the model whole: 0.83M parameters, 3.2 MiB, and the largest tensor);
# what it writes is the model its checkpoint holds (another path: the checkpoint's pieces)
loud=()
for f in "${TRAIN_FLAGS[@]}"; do [ "$f" = --quiet ] || loud+=("$f"); done
OMP_NUM_THREADS=1 bounded "$mpiexec" -n 2 "$bin" train "${loud[@]}" --batch 2 --zero 3 --layers 4 \
    --channels 128 --steps 1 --save-every 1 --out "$dir/outw" > "$dir/outw.log" 2>&1
took=$(sed -n 's/.*the writers took \([0-9.]*\) MiB.*/\1/p' "$dir/outw.log")
check "--out under ZeRO-3: the writers took ${took:-?} MiB, under half the model's 3.2 MiB" \
    less_than "${took:-x}" 1.6
check "  ... its model.bin is its checkpoint's model" \
    sh -c "'$bin' convert '$dir/outw/checkpoints' '$dir/outw-ck.bin' > /dev/null && cmp '$dir/outw/model.bin' '$dir/outw-ck.bin'"

# bad input: one message each
expect_error --once "prefetch without ZeRO-3" "\-\-zero3-prefetch 2" train bad 2 2 --zero 1 --zero3-prefetch 2
expect_error --once "prefetch too deep" "\-\-zero3-prefetch 100" train bad 2 2 --zero 3 --zero3-prefetch 100
expect_error --once "zero 4" "\-\-zero" train bad 2 2 --zero 4
exit $fail
