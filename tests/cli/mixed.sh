#!/usr/bin/env bash
# Mixed precision (--precision bf16|fp16; docs/DESIGN.md, "Mixed precision"): 16-bit training
# against fp32, every layout in 16 bits against one 16-bit process, fp16 loss scaling with an
# overflow on one rank, checkpoints that resume bit-identically and across precisions.
# Usage: mixed.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC.
#
# Tolerances, from the formats' unit round-off u (bf16: 2^-9, 8 significant bits; fp16: 2^-11):
#  - 16 bits against fp32, per-step loss: 4u (7.8e-3 bf16, 2.0e-3 fp16): the logits are a product
#    of two rounded operands, itself rounded, and the residual stream it reads is rounded once
#    more: four roundings of relative size u to first order (the loss, log-sum-exp minus the
#    target logit, moves by at most the largest logit change). Measured: bf16 2.6e-4, fp16 2e-6
#    over 30 steps. The validation loss after the run: within 1% (the issue's bound).
#  - a layout against one process, both in bf16: per-step loss u/4 (4.9e-4), final fp32 master
#    weights 16u (0.031) of each tensor's largest value. A TP layout rounds each rank's partial
#    row-parallel product to bf16 before their sum (as Megatron-LM does), one process rounds the
#    whole sum: their activations differ by about u, their gradients too, and AdamW turns a
#    gradient difference of a fraction u into an update difference of the same fraction, summed
#    over the steps. With AdamW eps 1e-4 (not 1e-8) a gradient that is zero in exact arithmetic
#    (the key bias) and only round-off in bf16 makes no full-size step of random sign (see
#    equiv.sh for the fp32 form of that argument). Measured (10 steps, tiny model): loss 4.5e-5,
#    weights 7.4e-3 (tp2); dp and pp layouts agree to 1e-7 on AVX2 (their reductions are in fp32),
#    2.2e-3 (bf16 dp2 ZeRO-2) on an AVX-512 machine (-march=native), still inside these bounds.
#    Negative case: data parallelism without its gradient reduction must fail these bounds.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus mixed-precision

# train OUT NP B [flags]: the tiny model (TINY) on NP ranks (0: no launcher), B sequences per
# rank; a run that fails is a failed check
TRAIN_FLAGS=("${TINY[@]}" --warmup 3 --lr 1e-3)
TRAIN_LOG=check

# same NAME RUN REF LOSS_RTOL WEIGHTS_RTOL [NORM_RTOL]: llm3d compare says SAME; the gradient
# norms held to NORM_RTOL, by default the losses' bound (16-bit against fp32: norms within
# 2.9e-3 at most, under 4u = 7.8e-3)
same() {
    if "$bin" compare --loss-rtol "$4" --norm-rtol "${6:-$4}" --weights-rtol "$5" "$dir/$2" "$dir/$3" > "$dir/$1.cmp" 2>&1
    then echo "ok: $1 ($(tr '\n' ' ' < "$dir/$1.cmp"))"
    else echo "FAIL: $1"; cat "$dir/$1.cmp"; fail=1; fi
}
differ() { # differ NAME RUN REF LOSS_RTOL WEIGHTS_RTOL: llm3d compare says DIFFERENT
    "$bin" compare --loss-rtol "$4" --norm-rtol "$4" --weights-rtol "$5" "$dir/$2" "$dir/$3" > "$dir/$1.cmp" 2>&1
    if [ $? -eq 1 ]; then ok "$1 (rejected: $(tail -1 "$dir/$1.cmp"))"
    else echo "FAIL: $1 was not rejected"; cat "$dir/$1.cmp"; fail=1; fi
}
last_val() { grep -o '"val_loss":[^,}]*' "$dir/$1/metrics.jsonl" | tail -1 | cut -d: -f2; }

# ---- 16 bits against fp32, one process ------------------------------------------------------
# (under the sanitizers, 12 steps: the same code, fewer times)
n=40
full || n=12
val=(--steps $n --val-every $n --val "$dir/data/val_*.bin")
train p_fp32 0 4 "${val[@]}" --precision fp32
train p_bf16 0 4 "${val[@]}" --precision bf16
train p_fp16 0 4 "${val[@]}" --precision fp16 --initial-loss-scale 1024
# the losses must differ at all (16-bit arithmetic really ran) and stay within 4u
differ "bf16 is not bit-identical to fp32" p_bf16 p_fp32 0 0
same "bf16 against fp32: every step's loss within 4u = 7.8e-3" p_bf16 p_fp32 7.8e-3 1
same "fp16 against fp32: every step's loss within 4u = 2.0e-3" p_fp16 p_fp32 2.0e-3 1
for p in bf16 fp16; do
    a=$(last_val "p_$p") b=$(last_val p_fp32)
    if is_number "$a" && is_number "$b" && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01 * b) }'
    then ok "$p validation loss $a within 1% of fp32's $b"
    else bad "$p validation loss $a not within 1% of fp32's $b"; fi
done
grep -q '"loss_scale":1024' "$dir/p_fp16/metrics.jsonl" && ok "fp16 metrics carry the loss scale" ||
    bad "fp16 metrics carry the loss scale"
grep -q loss_scale "$dir/p_bf16/metrics.jsonl" && bad "bf16 has no loss scale" || ok "bf16 has no loss scale"

# ---- layouts in 16 bits against one 16-bit process ------------------------------------------
# equiv NAME NP B PRECISION [flags]: against one process with B*DP sequences (L3D_DP replicas;
# L3D_MODEL: model flags for both runs)
# Gradient norms: nt. 16-bit sums and products move the norm more than the loss (measured up
# to 4.2e-4 where the losses agree to 1e-6: fp32_dp2_r16's bf16 gradient sums, bf16_tp2 3e-4)
lt=4.9e-4 wt=0.031 nt=2e-3
equiv() {
    local name=$1 np=$2 b=$3 prec=$4
    shift 4
    local model=(${L3D_MODEL:-})
    local ref="ref_${prec}_b$((b * ${L3D_DP:-1}))$(echo "${L3D_MODEL:-}${L3D_REF_FLAGS:-}" | tr -d ' -')"
    [ -f "$dir/$ref/model.bin" ] || train "$ref" 0 $((b * ${L3D_DP:-1})) --steps 10 --eps 1e-4 \
        --precision "$prec" "${model[@]}" ${L3D_REF_FLAGS:-} || return
    train "$name" "$np" "$b" --steps 10 --eps 1e-4 --precision "$prec" "${model[@]}" "$@" &&
        same "$name" "$name" "$ref" "$lt" "$wt" "$nt"
}
ls16=(--initial-loss-scale 1024)
equiv bf16_tp2 2 4 bf16 --tp 2
full && equiv bf16_tp2_sp 2 4 bf16 --tp 2 --sequence-parallel
L3D_REF_FLAGS="--grad-accum 2" equiv bf16_pp2 2 2 bf16 --pp 2 --grad-accum 2
full && L3D_DP=2 equiv bf16_dp2_zero0 2 2 bf16 --zero 0
full && L3D_DP=2 equiv bf16_dp2_zero1 2 2 bf16 --zero 1
L3D_DP=2 equiv bf16_dp2_zero2 2 2 bf16 --zero 2
full && equiv bf16_recompute_full 0 4 bf16 --recompute full
full && L3D_REF_FLAGS="--grad-accum 2" equiv bf16_pp2_gpipe 2 2 bf16 --pp 2 \
    --pp-schedule gpipe --grad-accum 2
full && L3D_MODEL="--layers 4" L3D_REF_FLAGS="--grad-accum 2" equiv bf16_pp2_interleaved 2 2 \
    bf16 --pp 2 --pp-virtual 2 --grad-accum 2
full && L3D_REF_FLAGS="--grad-accum 2" equiv bf16_pp2_zbh1 2 2 bf16 --pp 2 --pp-schedule zb-h1 \
    --grad-accum 2
L3D_MODEL="--layers 4" L3D_REF_FLAGS="--grad-accum 2" equiv bf16_pp2_zbv 2 2 bf16 --pp 2 \
    --pp-virtual 2 --pp-schedule zbv --grad-accum 2
full && L3D_DP=2 equiv bf16_tp2_dp2_zero1_sp 4 2 bf16 --tp 2 --dp 2 --zero 1 --sequence-parallel
L3D_REF_FLAGS="${ls16[*]}" equiv fp16_tp2 2 4 fp16 --tp 2 "${ls16[@]}"
L3D_REF_FLAGS="${ls16[*]}" L3D_DP=2 equiv fp16_dp2_zero2 2 2 fp16 --zero 2 "${ls16[@]}"
full && L3D_REF_FLAGS="${ls16[*]} --grad-accum 2" equiv fp16_pp2 2 2 fp16 --pp 2 --grad-accum 2 \
    "${ls16[@]}"
# 16-bit gradient sums over DP (--grad-reduce-dtype): each rank's fp32 gradients rounded to 16 bits,
# then their sum rounded: a relative error of about u on each gradient, the TP layouts' argument
# and bounds. Measured (10 steps): bf16 loss 6.8e-5, weights 5.8e-3; fp16 5.4e-6, 7.9e-4; fp32
# training with bf16 sums 3.0e-6, 2.3e-3
r16=(--grad-reduce-dtype bf16)
L3D_DP=2 equiv bf16_dp2_zero0_r16 2 2 bf16 --zero 0 "${r16[@]}"
full && L3D_DP=2 equiv bf16_dp2_zero2_r16 2 2 bf16 --zero 2 "${r16[@]}"
full && L3D_REF_FLAGS="${ls16[*]}" L3D_DP=2 equiv fp16_dp2_zero1_r16 2 2 fp16 --zero 1 \
    --grad-reduce-dtype fp16 "${ls16[@]}"
full && L3D_DP=2 L3D_REF_FLAGS="--grad-accum 2" equiv bf16_pp2_dp2_zero2_r16 4 2 bf16 --pp 2 \
    --dp 2 --zero 2 --grad-accum 2 "${r16[@]}"
L3D_DP=2 equiv fp32_dp2_r16 2 2 fp32 --zero 1 "${r16[@]}"
# tensor parallelism's partial sums in fp32 (--tp-reduce-dtype fp32, src/model/tpsum.c): each
# row-parallel output and column-parallel input gradient made, summed and rounded once, as one
# process rounds it, where the default rounds each rank's partial and then their sum (the bounds
# above). What stays is the order of the fp32 sums (a product's columns split over the ranks, the
# vocabulary's softmax sums), which flips a bf16 rounding now and then. Measured (10 steps), fp32
# sums against bf16 sums (bf16_tp2): on an AVX512-BF16 CPU (oneDNN's bf16 products) loss 1.2e-5
# against 3.3e-5, norms 4.8e-5 against 2.7e-4, weights 3.0e-4 against 1.1e-2; with the widened
# fp32 products (L3D_DNNL_16BIT=0, as on AVX2) 1.9e-5 against 4.4e-5, 8.8e-5 against 3.1e-4,
# 3.3e-3 against 1.5e-2; on the checking backend (the sanitized build's oracles) loss 3.0e-5
# against 2.6e-5, norms 6.1e-5 against 1.9e-4, weights 5.6e-4 against 1.8e-2. So: the norms and
# weights closer (the losses of both are at the noise of a 10-step run's last digits), and
# within a fifth of the loss and weight bounds and 2.5e-4 for the norms, which reject the
# default (its weights, 1.8x over). The norms alone are at the noise of one flipped bf16 rounding
# of a softmax sum: fp32 sums against bf16 sums at seeds 1337, 7, 11 measured 4.8e-5 against
# 2.7e-4, 1.8e-4 against 3.6e-4, 3.7e-5 against 1.7e-4 on main; after the cross-entropy's sums
# moved to 32 fixed SIMD lanes (cpu_xent.c) 1.8e-4 against 1.4e-4 at seed 1337, the two others
# as before (chunked head at 1337: 1.9e-4). So the closer check asks it of the weights only.
t32=(--tp-reduce-dtype fp32)
equiv bf16_tp2_t32 2 4 bf16 --tp 2 "${t32[@]}"
full && equiv bf16_tp2_sp_t32 2 4 bf16 --tp 2 --sequence-parallel "${t32[@]}"
full && L3D_REF_FLAGS="${ls16[*]}" equiv fp16_tp2_t32 2 4 fp16 --tp 2 "${ls16[@]}" "${t32[@]}"
# the chunked head (--xent-chunk: the head's input gradient summed a chunk of rows at a time, its
# weight widened with the first), held to the same fifth as the unchunked head below
full && equiv bf16_tp2_t32_xent 2 4 bf16 --tp 2 --xent-chunk 40 "${t32[@]}" &&
    same "bf16 tp2 with fp32 sums, the head in chunks of 40 rows" bf16_tp2_t32_xent ref_bf16_b4 \
        9.8e-5 3.1e-2 2.5e-4
same "bf16 tp2 with fp32 sums: losses within a fifth of the bound, norms 2.5e-4" bf16_tp2_t32 \
    ref_bf16_b4 9.8e-5 3.1e-2 2.5e-4
differ "bf16 tp2 with bf16 sums (the default) is not" bf16_tp2 ref_bf16_b4 1.5e-4 6.2e-3
# worst NAME: the worst relative differences of NAME.cmp: losses, norms, weights
worst() {
    sed -n 's/.*worst relative difference \([^ ]*\) .*/\1/p; s/.*max|a-b|\/max|b| = \(.*\)/\1/p' \
        "$dir/$1.cmp" | tr '\n' ' '
}
# The weights after 10 bf16 steps are chaotic at the level of one flipped bf16 rounding, so one
# seed does not tell the two sums apart: measured (weights, fp32 sums against bf16 sums) at
# seeds 1337, 7, 11, 3: 7.3e-3 / 1.3e-2, 9.9e-3 / 7.7e-3, 2.2e-3 / 1.8e-2, 1.1e-3 / 9.8e-3 (L3D_SIMD
# =avx2: 5.4e-3 / 1.1e-2, 9.8e-3 / 7.6e-3, 6.7e-4 / 1.8e-2, 1.1e-3 / 1.0e-2): at seed 7 the fp32
# sums are the farther. Over the four seeds together they are 2.3-2.8x closer; the check asks
# 1.5x of the sum over the seeds run (the test's own under the sanitizers: 1337 alone).
seeds_t32=$(worst bf16_tp2_t32 | awk '{ print $3 }') seeds_t16=$(worst bf16_tp2 | awk '{ print $3 }')
for seed in 7 11 3; do
    full || break
    train "ref_bf16_b4_s$seed" 0 4 --steps 10 --eps 1e-4 --precision bf16 --seed $seed &&
        train "bf16_tp2_t32_s$seed" 2 4 --steps 10 --eps 1e-4 --precision bf16 --seed $seed \
            --tp 2 "${t32[@]}" &&
        train "bf16_tp2_s$seed" 2 4 --steps 10 --eps 1e-4 --precision bf16 --seed $seed --tp 2 ||
        { bad "the seed-$seed runs did not train"; continue; }
    for v in t32 t16; do
        run=bf16_tp2_s$seed
        [ $v = t32 ] && run=bf16_tp2_t32_s$seed
        "$bin" compare --rtol 1 "$dir/$run" "$dir/ref_bf16_b4_s$seed" > "$dir/$run.cmp" 2>&1
        eval "seeds_$v=\"\$seeds_$v $(worst $run | awk '{ print $3 }')\""
    done
done
if awk -v a="$seeds_t32" -v b="$seeds_t16" 'BEGIN { n = split(a, x); m = split(b, y)
    if (n < 1 || n != m) exit 1; for (i = 1; i <= n; i++) { if (x[i] == "" || y[i] == "") exit 1
    sa += x[i]; sb += y[i] }; exit !(sa * 1.5 < sb) }'
then ok "fp32 TP sums: weights closer to one process over the seeds (${seeds_t32} against ${seeds_t16})"
else bad "fp32 TP sums: weights not 1.5x closer over the seeds: ${seeds_t32} against ${seeds_t16}"; fi
grep -q "tp 2 (sums in fp32) x pp 1" "$dir/bf16_tp2_t32.log" && ! grep -q "sums in fp32" \
    "$dir/bf16_tp2.log" && ok "the layout line names the fp32 TP sums, only where they run" ||
    bad "the layout line names the fp32 TP sums, only where they run"
# the sums really are 16-bit: in fp32 training, 1e-4 of the weights tells them from fp32 sums
# (fp32 sums: fp32 round-off, measured 7.5e-7; bf16 sums 2e-3 to 3e-3). Not in bf16 training: on
# AVX-512 (-march=native) bf16 dp2 with fp32 sums measured 2.2e-3 against 8.5e-8 on AVX2, most
# likely a round-off difference of the products that flips 16-bit roundings and grows.
L3D_DP=2 equiv fp32_dp2_zero1 2 2 fp32 --zero 1
same "fp32 gradient sums over dp2 agree with one process to 1e-4" fp32_dp2_zero1 ref_fp32_b4 1 1e-4
differ "bf16 gradient sums over dp2 do not (16-bit sums ran)" fp32_dp2_r16 ref_fp32_b4 1 1e-4
grep -q "overlapped gradient pieces (polled between kernels) in bf16" "$dir/bf16_dp2_zero0_r16.log" &&
    ok "the layout line names the bf16 sums" || bad "the layout line names the bf16 sums"
# negative case: data parallelism that never reduces its gradients trains another model
L3D_TEST_SKIP_DP_REDUCE=1 train bf16_dp2_broken 2 2 --steps 10 --eps 1e-4 --precision bf16 \
    --zero 1 && differ "bf16 dp2 without gradient reduction is rejected" bf16_dp2_broken \
    ref_bf16_b4 "$lt" "$wt"

# ---- fp16 overflow on one rank of tp2 x pp2 x dp2 ---------------------------------------------
# world rank 3's (1's) gradients hold a NaN at step 5 (after their reduction: only it sees it); with
# --hysteresis 1 the scale halves at the first overflow
# (under the sanitizers tp2 alone: the same code on 2 ranks instead of 8)
ovf=(--tp 2 --pp 2 --dp 2 --zero 1 --steps 8 --precision fp16 --initial-loss-scale 1024
     --hysteresis 1)
np_ovf=8 bad_rank=3
full || { ovf=(--tp 2 --steps 8 --precision fp16 --initial-loss-scale 1024 --hysteresis 1); np_ovf=2 bad_rank=1; }
if L3D_TEST_NAN_AT_STEP=5:$bad_rank train f16_overflow $np_ovf 2 "${ovf[@]}" --quiet; then
    ok "fp16 ${ovf[*]:0:6} with an overflow on rank $bad_rank at step 5 runs to the end"
    m="$dir/f16_overflow/metrics.jsonl"
    [ "$(grep -c '"skipped":true' "$m")" = 1 ] && grep -q '"step":5,.*"skipped":true,"overflow":true' "$m" &&
        ok "exactly step 5 skipped, as an overflow" || bad "exactly step 5 skipped: $(grep -c skipped "$m") lines"
    grep -q '"step":5,.*"loss_scale":1024[,}]' "$m" && grep -q '"step":6,.*"loss_scale":512[,}]' "$m" &&
        grep -q '"step":8,.*"loss_scale":512[,}]' "$m" &&
        ok "the loss scale backs off 1024 -> 512 after step 5 and stays" || bad "loss scale 1024 -> 512"
    # (the lowest rank whose gradient norm is not finite: the norm's sums carry rank 3's NaN)
    [ "$(grep -c 'gradient overflow' "$dir/f16_overflow.log")" = 1 ] &&
        grep -q "step 5: gradient overflow at loss scale 1024 (rank [0-7]): update skipped on every rank; loss scale now 512" \
        "$dir/f16_overflow.log" && ok "the overflow is reported once" ||
        { bad "overflow line"; cat "$dir/f16_overflow.log"; }
fi

# ---- checkpoints: the fp32 master weights and moments, and the loss scale --------------------
ck=(--steps 10 --save-every 5)
for p in bf16 fp16; do
    lsf=()
    [ $p = fp16 ] && lsf=(--initial-loss-scale 65536 --loss-scale-window 3) # it grows at step 3
    train "ck_$p" 0 4 "${ck[@]}" --precision "$p" "${lsf[@]}" &&
        train "ck_${p}_resumed" 0 4 "${ck[@]}" --precision "$p" "${lsf[@]}" \
            --resume "$dir/ck_$p/checkpoints/step_00000005" &&
        same "$p resumed at step 5 is bit-identical" "ck_${p}_resumed" "ck_$p" 0 0
done
grep -q '^lossscale scale ' "$dir/ck_fp16/checkpoints/step_00000005/manifest" &&
    ok "fp16 checkpoints hold the loss scale" || bad "fp16 checkpoints hold the loss scale"
# the scale grew after step 3 and grows again after step 6: the resumed run's scales, step by step,
# are the original's (scaling by a power of two is exact, so the losses alone would not show it)
scales() { grep -o '"step":\([6-9]\|10\),.*"loss_scale":[0-9]*' "$dir/$1/metrics.jsonl" |
    sed 's/"step":\([0-9]*\),.*"loss_scale":\([0-9]*\)/\1:\2/' | tr '\n' ' '; }
[ -n "$(scales ck_fp16)" ] && [ "$(scales ck_fp16)" = "$(scales ck_fp16_resumed)" ] &&
    [ "$(scales ck_fp16 | grep -c 262144)" = 1 ] &&
    ok "fp16 resumed: the loss scale, its growth count and hysteresis carry over ($(scales ck_fp16))" ||
    bad "fp16 resumed loss scales: $(scales ck_fp16) against $(scales ck_fp16_resumed)"
grep -q '^dtype params fp32 moments fp32' "$dir/ck_bf16/checkpoints/step_00000005/manifest" &&
    ok "bf16 checkpoints hold the fp32 master weights" || bad "bf16 checkpoints: fp32 params"
# across precisions: within the 16-bit-against-fp32 bound of the runs they continue
full && train ck_fp32 0 4 "${ck[@]}" --precision fp32 &&
    train ck_fp32_to_bf16 0 4 "${ck[@]}" --precision bf16 \
        --resume "$dir/ck_fp32/checkpoints/step_00000005" &&
    same "bf16 resumed from an fp32 checkpoint continues the fp32 run" ck_fp32_to_bf16 ck_fp32 7.8e-3 1 &&
    train ck_bf16_to_fp32 0 4 "${ck[@]}" --precision fp32 \
        --resume "$dir/ck_bf16/checkpoints/step_00000005" &&
    same "fp32 resumed from a bf16 checkpoint continues the bf16 run" ck_bf16_to_fp32 ck_bf16 7.8e-3 1
# ZeRO-2 stages its fp32 master weights for the save; resharded onto one process
train ck_z2 2 2 "${ck[@]}" --precision bf16 --zero 2 &&
    train ck_z2_on1 0 4 "${ck[@]}" --precision bf16 --resume "$dir/ck_z2/checkpoints/step_00000005" &&
    same "bf16 ZeRO-2 dp2 checkpoint resumed on one process" ck_z2_on1 ck_z2 "$lt" "$wt" "$nt"

# ---- llm.c's bf16 file (version 5): written by convert, read by --init-from and generate --------
ckp="$dir/ck_bf16/checkpoints/step_00000005"
check "convert --precision bf16 writes llm.c version 5" sh -c "'$bin' convert '$ckp' \
    '$dir/v5.bin' --precision bf16 > /dev/null"
check "convert writes llm.c version 3 by default" sh -c "'$bin' convert '$ckp' '$dir/v3.bin' \
    > /dev/null"
expect_error "convert --precision fp16: llm.c has no fp16 file" \
    "^llm3d convert: --precision fp16: .*give --precision fp32 or bf16, or a folder .* for safetensors F16$" \
    "$bin" convert "$ckp" "$dir/v16.bin" --precision fp16
check "  ... nothing written" test ! -e "$dir/v16.bin"
expect_error "convert --precision fp8: train's message" \
    "^llm3d convert: --precision 'fp8': choose fp32 (the default), bf16 or fp16" \
    "$bin" convert "$ckp" "$dir/v8.bin" --precision fp8
[ "$(od -A n -t d4 -j 4 -N 4 "$dir/v5.bin" | tr -d ' ')" = 5 ] &&
    [ "$(od -A n -t d4 -j 4 -N 4 "$dir/v3.bin" | tr -d ' ')" = 3 ] &&
    [ $(($(stat -c %s "$dir/v3.bin") - 1024)) = $((2 * ($(stat -c %s "$dir/v5.bin") - 1024))) ] &&
    ok "version 5 holds 2 bytes a parameter, version 3 four" || bad "llm.c versions and sizes"
# a bf16 run's 16-bit weights are the rounding of its fp32 ones: from either file, the same loss
train init_v5 0 4 --steps 1 --precision bf16 --init-from "$dir/v5.bin" &&
    train init_v3 0 4 --steps 1 --precision bf16 --init-from "$dir/v3.bin" &&
    [ -n "$(grep -o '"loss":[^,]*' "$dir/init_v5/metrics.jsonl")" ] &&
    [ "$(grep -o '"loss":[^,]*' "$dir/init_v5/metrics.jsonl")" = \
      "$(grep -o '"loss":[^,]*' "$dir/init_v3/metrics.jsonl")" ] &&
    ok "--init-from version 5 and version 3 give a bf16 run the same first loss" ||
    bad "--init-from version 5 against version 3"
# an fp32 run on version 5's weights: close to the bf16 run on the same rounded weights (a file
# read as the wrong width would give garbage)
train init_v5_fp32 0 4 --steps 1 --precision fp32 --init-from "$dir/v5.bin" &&
    same "an fp32 run from version 5 is within bf16's bound of one from version 3" init_v5_fp32 \
        init_v3 7.8e-3 1
check "generate reads version 5" sh -c "'$bin' generate --checkpoint '$dir/v5.bin' --tokenizer \
    bytes --prompt row --max-tokens 8 --temperature 0 > '$dir/gen5.txt' 2> '$dir/gen5.err'"
head -c 1024 "$dir/v5.bin" > "$dir/v4.bin" && printf '\004' | dd of="$dir/v4.bin" bs=1 seek=4 \
    conv=notrunc 2> /dev/null && cat "$dir/v5.bin" | tail -c +1025 >> "$dir/v4.bin"
expect_error "llm.c version 4 is refused" "version 4; llm3d reads version 3 (fp32) and 5" \
    "$bin" train --model tiny --vocab 256 --context 32 --seq-len 32 --steps 1 \
    --train "$dir/data/train_*.bin" --init-from "$dir/v4.bin"
head -c 2000 "$dir/v5.bin" > "$dir/v5_short.bin"
expect_error "a truncated version 5 file is refused" "needs .*truncated or damaged" \
    "$bin" train --model tiny --vocab 256 --context 32 --seq-len 32 --steps 1 \
    --train "$dir/data/train_*.bin" --init-from "$dir/v5_short.bin"

# ---- bad flags: one line each, also from two ranks ----------------------------------------------
expect_error "--precision int8" "--precision 'int8': choose fp32 (the default), bf16 or fp16" \
    "$bin" train --model tiny --precision int8 --train "$dir/data/train_*.bin"
# a probe trained with scale 0 and zero gradients, silently: the dynamic scale starts at or
# above its floor (the run spec's validator, src/spec/spec.c)
expect_error "initial loss scale below the floor" \
    "--initial-loss-scale 1e-30 is below --min-loss-scale 1" \
    "$bin" train --model tiny --precision fp16 --initial-loss-scale 1e-30 --train "$dir/data/train_*.bin"
expect_error "loss scaling without fp16" "--hysteresis: loss scaling is for --precision fp16" \
    "$bin" train --model tiny --precision bf16 --hysteresis 3 --train "$dir/data/train_*.bin"
err=$("$mpiexec" -n 2 "$bin" train --model tiny --precision bf16 --hysteresis 3 \
    --train "$dir/data/train_*.bin" 2>&1 > /dev/null)
[ $? -ne 0 ] && [ "$(echo "$err" | grep -c '^llm3d train: ')" = 1 ] &&
    ok "  ... said once by 2 ranks" || bad "  ... said once by 2 ranks: $err"
expect_error "--loss-scale-backoff 1.5" "--loss-scale-backoff 1.5 is out of range" \
    "$bin" train --model tiny --precision fp16 --loss-scale-backoff 1.5 --train "$dir/data/train_*.bin"
expect_error "--grad-reduce-dtype int8" "--grad-reduce-dtype 'int8': choose fp32 (the default), bf16" \
    "$bin" train --model tiny --grad-reduce-dtype int8 --train "$dir/data/train_*.bin"
expect_error "fp16 gradient sums without fp16" "--grad-reduce-dtype fp16: fp16 sums need fp16's loss" \
    "$bin" train --model tiny --precision bf16 --grad-reduce-dtype fp16 --train "$dir/data/train_*.bin"
expect_error "plan: 16-bit sums are llm3d's option" "--grad-reduce-dtype bf16: for llm3d's trainer" \
    "$bin" plan --profile dgx-a100 --trainer megatron --precision bf16 --grad-reduce-dtype bf16
expect_error "plan: fp32 TP sums are llm3d's option" "--tp-reduce-dtype fp32: for llm3d's trainer" \
    "$bin" plan --profile dgx-a100 --trainer megatron --precision bf16 --tp-reduce-dtype fp32
expect_error "--tp-reduce-dtype bf16" "--tp-reduce-dtype 'bf16': choose model (the default: the" \
    "$bin" train --model tiny --tp-reduce-dtype bf16 --train "$dir/data/train_*.bin"
expect_error "plan: the fp32 ring is llm3d's option" "--cp-reduce-dtype fp32: for llm3d's trainer" \
    "$bin" plan --profile dgx-a100 --trainer megatron --precision bf16 --cp-reduce-dtype fp32
expect_error "generate --precision fp8" "--precision 'fp8': choose fp32 (the default), bf16 or fp16" \
    "$bin" generate --checkpoint "$dir/v5.bin" --tokenizer bytes --precision fp8

# ---- memory: llm3d plan --precision bf16 (this trainer's plan) against the accounted peak -------
prof=$(cd "$(dirname "$0")/../.." && pwd)/tests/data/plan/cpu.prof
# A run whose 16-bit products run in the backend's own kernels (its start-up line says so: oneDNN's
# bf16 matmul on an AVX512-BF16 CPU) holds no fp32 copies of their operands: its plan takes the
# profile with gemm_native_T = yes, as calibrate writes it on such a machine
for t in bf16 fp16; do { cat "$prof"; echo "gemm_native_$t = yes"; } > "$dir/native_$t.prof"; done
native() { grep -q "^products: 16-bit operands into fp32 sums, in the backend's own" "$1"; }
# a run whose bf16 weight gradients run in blocks of fp32 rows (its start-up line, AMX) keeps that
# scratch: gemm_wgrad_block_bf16 = its MiB, in each native_bf16 profile (mem adds it)
wgrad_block() { sed -n 's/^weight gradients: blocks of rows into \([0-9.]*\) MiB.*/\1/p' "$1"; }
# and a run whose bf16 attention runs as oneDNN matmuls (AMX; its start-up line) keeps their
# scratch: attn_native_bf16 = yes
{ cat "$dir/native_bf16.prof"; echo "attn_native_bf16 = yes"; } > "$dir/native_attn_bf16.prof"
{ cat "$prof"; echo "attn_native_bf16 = yes"; } > "$dir/attn_bf16.prof"
attn_native() { grep -q "^attention products: 16-bit matmuls" "$1"; }
# mem NAME NP B ACCUM DP PRECISION PLAN_FLAGS -- TRAIN_FLAGS: within 1%
mem() {
    local name=$1 np=$2 b=$3 accum=$4 dp=$5 prec=$6
    shift 6
    local pflags=() launch=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do pflags+=("$1"); shift; done
    shift
    [ "$np" -gt 1 ] && launch=("$mpiexec" -n "$np")
    local mdl=(--layers 4 --heads 4 --vocab 256)
    bounded env OMP_NUM_THREADS=1 "${launch[@]}" "$bin" train "${mdl[@]}" --channels 128 \
        --context 64 --seq-len 64 --batch "$b" --grad-accum "$accum" --steps 2 --val-every 0 \
        --precision "$prec" --train "$dir/data/train_*.bin" "$@" > "$dir/$name.log" 2>&1 ||
        { bad "$name: the trainer failed"; cat "$dir/$name.log"; return; }
    local measured predicted p=$prof
    native "$dir/$name.log" && p=$dir/native_$prec.prof
    attn_native "$dir/$name.log" && p=$dir/native_attn_$prec.prof
    local wb
    wb=$(wgrad_block "$dir/$name.log")
    if [ -n "$wb" ]; then
        { cat "$p"; echo "gemm_wgrad_block_$prec = $wb"; } > "$dir/$name.prof"
        p=$dir/$name.prof
    fi
    measured=$(sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$dir/$name.log")
    predicted=$("$bin" plan "${mdl[@]}" --channels 128 --seq-len 64 --profile "$p" \
        --precision "$prec" --devices "$np" --batch "$b" \
        --global-batch $((b * accum * dp)) "${pflags[@]}" --json 2> "$dir/$name.plan" |
        head -1 | sed -n 's/.*"mem_total":\([0-9]*\).*/\1/p')
    if is_number "$measured" && is_number "$predicted" &&
        awk -v a="$predicted" -v b="$measured" 'BEGIN { r = (a - b) / b; exit !(r < 0.01 && r > -0.01) }'
    then ok "$name: plan --precision $prec predicts $predicted bytes, measured $measured"
    else bad "$name: plan --precision $prec predicts '$predicted' bytes, measured '$measured' $(cat "$dir/$name.plan")"; fi
}
base=(--recompute none)
mem mem_bf16_one 1 2 1 1 bf16 --tp 1 --pp 1 --zero 0 "${base[@]}" --
full && mem mem_bf16_dp2_zero1 2 2 1 2 bf16 --tp 1 --pp 1 --zero 1 "${base[@]}" -- --zero 1
mem mem_bf16_dp2_zero2 2 1 3 2 bf16 --tp 1 --pp 1 --zero 2 "${base[@]}" -- --zero 2
# a mixture of experts over ep 2 of 2 ranks: ZeRO-2 over the one rank holding each half of the
# experts keeps its whole fp32 range (no pieces) and reduces nothing in 16 bits
moe=(--moe-experts 4 --moe-top-k 2 --moe-ffn 256 --ep 2)
mem mem_bf16_moe_ep2_zero2 2 1 2 2 bf16 --tp 1 --pp 1 --zero 2 "${base[@]}" "${moe[@]}" -- --zero 2 "${moe[@]}"
full && mem mem_bf16_tp2_sp 2 2 1 1 bf16 --tp 2 --pp 1 --zero 0 --sequence-parallel \
    "${base[@]}" -- --tp 2 --sequence-parallel
# the fp32 TP sums' buffers (src/model/tpsum.c: widened operands, the sum, its local rows; 4% here)
mem mem_bf16_tp2_sp_t32 2 2 1 1 bf16 --tp 2 --pp 1 --zero 0 --sequence-parallel \
    --tp-reduce-dtype fp32 "${base[@]}" -- --tp 2 --sequence-parallel --tp-reduce-dtype fp32
# (the trainer's default schedule named: the search would take zb-h1, faster, with more memory)
full && mem mem_fp16_pp2 2 2 4 1 fp16 --tp 1 --pp 2 --zero 0 --pp-virtual 1 --pp-schedule 1f1b \
    "${base[@]}" -- --pp 2
# a Llama's widened products on a stage without the head: SwiGLU's gate and up (C -> 2 F) are
# the largest, q|k|v of grouped-query attention smaller (Ca + 2 kv); the plan that counted 3 Ca
# and F measured 3.0% low here
llama=(--arch llama --ffn 1024 --kv-heads 2)
full && mem mem_fp16_llama_pp2 2 2 4 1 fp16 --tp 1 --pp 2 --zero 0 --pp-virtual 1 \
    --pp-schedule 1f1b "${base[@]}" "${llama[@]}" -- --pp 2 "${llama[@]}"
# the 16-bit sums' staging (two layers' and the non-layer gradients in 2 bytes: 5% here)
mem mem_bf16_dp2_zero1_r16 2 2 1 2 bf16 --tp 1 --pp 1 --zero 1 --grad-reduce-dtype bf16 \
    "${base[@]}" -- --zero 1 --grad-reduce-dtype bf16
# the context-parallel ring in fp32 (--cp-reduce-dtype fp32): its buffers in 4 bytes and q|k|v,
# their gradients and the output widened (0.4 MiB here, 2.5% of the peak)
mem mem_bf16_cp2_f32 2 2 1 1 bf16 --tp 1 --pp 1 --cp 2 --zero 0 --cp-reduce-dtype fp32 \
    "${base[@]}" -- --cp 2 --cp-reduce-dtype fp32
# negative cases: a plan of another run misses the measured one by more than 1%
# miss DESCRIPTION LOG NP PLAN_FLAGS: the plan of the model of mem() on NP ranks, micro-batch 2
miss() {
    local what=$1 log=$2 np=$3 predicted measured p=$prof
    shift 3
    case $1 in --profile) p=$2; shift 2 ;; esac
    predicted=$("$bin" plan --layers 4 --heads 4 --vocab 256 --channels 128 --seq-len 64 \
        --profile "$p" --devices "$np" --batch 2 --global-batch $((2 * np)) --tp 1 \
        --pp 1 "${base[@]}" "$@" --json 2> /dev/null | head -1 |
        sed -n 's/.*"mem_total":\([0-9]*\).*/\1/p')
    measured=$(sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$dir/$log.log")
    if is_number "$measured" && is_number "$predicted" &&
        awk -v a="$predicted" -v b="$measured" 'BEGIN { r = (a - b) / b; exit (r < 0.01 && r > -0.01) }'
    then ok "$what ($predicted) misses the run ($measured) by more than 1%"
    else bad "$what '$predicted' against the run '$measured'"; fi
}
# (where the products widen, the bf16 run's fp32 copies bring it within 0.9% of the fp32 plan,
# measured with L3D_DNNL_16BIT=0: there the plan of 16-bit kernels below is the negative case)
native "$dir/mem_bf16_one.log" && miss "the fp32 plan of the bf16 run" mem_bf16_one 1 --precision fp32 --zero 0
miss "the plan without the fp32 TP sums' buffers" mem_bf16_tp2_sp_t32 2 --profile \
    "$(native "$dir/mem_bf16_tp2_sp_t32.log" && echo "$dir/native_bf16.prof" || echo "$prof")" \
    --precision bf16 --tp 2 --sequence-parallel --global-batch 2 --zero 0
miss "the plan without the 16-bit sums' staging" mem_bf16_dp2_zero1_r16 2 --precision bf16 \
    --zero 1 --profile "$(native "$dir/mem_bf16_dp2_zero1_r16.log" && echo "$dir/native_bf16.prof" || echo "$prof")"
miss "the plan of the ring in bf16" mem_bf16_cp2_f32 2 \
    --profile "$(native "$dir/mem_bf16_cp2_f32.log" && echo "$dir/native_bf16.prof" || echo "$prof")" \
    --precision bf16 --cp 2 --zero 0 --global-batch 2
# the other product path's plan: fp32 copies of the operands (4% here) where there are none, or none
# where there are
# the attention's scratch (oneDNN path) left out where the run keeps it
if attn_native "$dir/mem_bf16_one.log"; then
    miss "the plan without the oneDNN attention's scratch" mem_bf16_one 1 \
        --profile "$dir/native_bf16.prof" --precision bf16 --zero 0
fi
# the weight gradients' blocks (products of at least 2048 tokens: a micro-batch of 32 x 64): the
# run within 1% of its plan (mem), and the plan without them smaller by up to the largest block,
# fc's 512 x 128 fp32 rows (256 KiB: 0.4% of this run, under the 1% that miss() can tell)
if [ -n "$(wgrad_block "$dir/mem_bf16_one.log")" ]; then
    mem mem_bf16_wgrad 1 32 1 1 bf16 --tp 1 --pp 1 --zero 0 "${base[@]}" --
    wplan() {
        "$bin" plan --layers 4 --heads 4 --vocab 256 --channels 128 --seq-len 64 --profile "$1" \
            --devices 1 --batch 32 --global-batch 32 --tp 1 --pp 1 "${base[@]}" --precision bf16 \
            --zero 0 --json 2> /dev/null | head -1 | sed -n 's/.*"mem_total":\([0-9]*\).*/\1/p'
    }
    wp=$(attn_native "$dir/mem_bf16_wgrad.log" && echo "$dir/native_attn_bf16.prof" || echo "$dir/native_bf16.prof")
    with=$(wplan "$dir/mem_bf16_wgrad.prof") without=$(wplan "$wp")
    check "the plan with the weight gradients' blocks is above the plan without by at most 262144 bytes ($with, $without: the transients' peak is the larger of the kept scratch and the initialisation's staging)" \
        test "$((with - without))" -gt 0 -a "$((with - without))" -le 262144
    # negative case: a run of 2047 tokens has none
    check "no blocks in the plan of a 2047-token micro-batch" test "$("$bin" plan --layers 4 --heads 4 \
        --vocab 256 --channels 128 --seq-len 89 --profile "$dir/mem_bf16_wgrad.prof" --devices 1 \
        --batch 23 --global-batch 23 --tp 1 --pp 1 "${base[@]}" --precision bf16 --zero 0 --json \
        2> /dev/null | head -1 | sed -n 's/.*"mem_total":\([0-9]*\).*/\1/p')" = "$("$bin" plan \
        --layers 4 --heads 4 --vocab 256 --channels 128 --seq-len 89 --profile "$wp" --devices 1 \
        --batch 23 --global-batch 23 --tp 1 --pp 1 "${base[@]}" --precision bf16 --zero 0 --json \
        2> /dev/null | head -1 | sed -n 's/.*"mem_total":\([0-9]*\).*/\1/p')"
fi
if native "$dir/mem_bf16_one.log"; then
    miss "the plan with the widened products' fp32 copies" mem_bf16_one 1 --precision bf16 \
        --zero 0 --profile "$(attn_native "$dir/mem_bf16_one.log" && echo "$dir/attn_bf16.prof" || echo "$prof")"
else
    miss "the plan of 16-bit kernels (gemm_native_bf16 = yes)" mem_bf16_one 1 \
        --profile "$dir/native_bf16.prof" --precision bf16 --zero 0
fi

# bf16 attention's path by default, as the start-up line says: the flash kernels in AVX512-BF16
# dot products on an AMD CPU that has them, the widened fp32 products elsewhere
# (cpu_attn16.h, l3d_fa16_default), unless oneDNN's attention runs; L3D_ATTN_DOT=0 widens
path_line() { sed -n 's/^attention products: //p' "$dir/$1.log"; }
path_run() { # NAME [VAR=VALUE]: one bf16 step of the tiny model
    env -u L3D_ATTN_DOT ${2:+"$2"} OMP_NUM_THREADS=1 "$bin" train "${TINY[@]}" --steps 1 \
        --precision bf16 --out "$dir/$1" > "$dir/$1.log" 2>&1
}
path_run path_default
path_run path_0 L3D_ATTN_DOT=0
if ! attn_native "$dir/path_default.log"; then
    if grep -q "^vendor_id.*AuthenticAMD" /proc/cpuinfo && grep -qw avx512_bf16 /proc/cpuinfo; then
        want="the flash kernels in bf16 dot products"
    else
        want="the flash kernels' fp32 products"
    fi
    check "bf16 attention by default: $want ($(path_line path_default))" \
        sh -c "grep -q \"^attention products: $want\" '$dir/path_default.log'"
    check "  ... and with L3D_ATTN_DOT=0 the widened fp32 products ($(path_line path_0))" \
        grep -q "^attention products: the flash kernels' fp32 products" "$dir/path_0.log"
fi

exit $fail
