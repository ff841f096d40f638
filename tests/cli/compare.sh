#!/usr/bin/env bash
# The oracle can fail (llm3d compare, the check behind tests/cli/equiv.sh and tests/cli/ckpt.sh):
# an identical run and an equivalent layout are SAME (exit 0) with the default tolerances; a
# perturbed weight, a NaN or Inf weight, a perturbed or NaN loss, a perturbed, doubled or null
# gradient norm, a data-parallel run whose gradient reduction is skipped, and runs that end at
# other steps are DIFFERENT (exit 1); a step skipped in both runs (norm null) agrees; a run
# resumed from a checkpoint into a new --out matches the original on the steps they share; runs
# that share no step cannot be compared (exit 2). Usage: compare.sh LLM3D SCRATCH_DIR; ctest sets
# L3D_MPIEXEC to the launcher of the MPI the binary was built with.
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, full, train, fail
start_test "$@"
check "compare --help says what tolerance equivalent runs need and why" sh -c "'$bin' compare --help | grep -q '^Tolerances. Equivalent layouts (tp, pp, dp, ZeRO) add in other orders'"
check "  ... and lists its flags, with the defaults" sh -c "'$bin' compare --help | grep -q '^  --loss-rtol R .*(default 1e-5)' && \
    '$bin' compare --help | grep -q '^  --norm-rtol R .*(default 1e-5)' && \
    '$bin' compare --help | grep -q '^  --verbose '"
# usage errors: exit 2 (nothing compared), one line naming the flag and the value
expect_error "--rtol abc" "^llm3d compare: --rtol 'abc' is not a number$" "$bin" compare --rtol abc "$dir/a" "$dir/b"
expect_error "one directory" "^llm3d compare: give two run directories" "$bin" compare "$dir/a"
"$bin" compare --weights-rtol 2 "$dir/a" "$dir/b" 2> /dev/null
[ $? = 2 ] && ok "  ... exit 2" || bad "  ... exit 2"

byte_corpus comparison 300

# train OUT NP B [flags]: a tiny model, 8 steps, train's default AdamW eps (1e-8, the case the
# default tolerances are chosen for); NP ranks (0 = no launcher) of B sequences each; a run that
# fails is a failed check
TRAIN_FLAGS=(--model tiny --layers 2 --channels 32 --heads 2 --vocab 256 --context 16 --seq-len 16
             --steps 8 --warmup 2 --lr 1e-3 --val-every 0 --quiet --train "$dir/data/train_*.bin")
TRAIN_LOG=check
# expect WHAT STATUS PATTERN RUN REF [flags]: llm3d compare RUN REF exits with STATUS and prints
# a line matching PATTERN (grep -E; stdout and stderr)
expect() {
    local what=$1 want=$2 pat=$3 run=$4 ref=$5
    shift 5
    "$bin" compare "$@" "$dir/$run" "$dir/$ref" > "$dir/$run.cmp" 2>&1
    local rc=$?
    if [ $rc -eq "$want" ] && grep -Eq -- "$pat" "$dir/$run.cmp"; then
        ok "$what (exit $rc: $(grep -E -- "$pat" "$dir/$run.cmp" | head -1))"
    else
        bad "$what: exit $rc, want $want and a line matching '$pat':"; cat "$dir/$run.cmp"
    fi
}
# copy NAME FROM: a copy of run FROM's metrics and weights to edit
copy() {
    rm -rf "${dir:?}/$1" && mkdir -p "$dir/$1" &&
        cp "$dir/$2/metrics.jsonl" "$dir/$2/model.bin" "$dir/$1/"
}
# poke NAME INDEX BYTES: float INDEX of NAME's weights (after llm.c's 1024-byte header; wte first)
# becomes BYTES, little-endian in printf escapes
poke() {
    printf "$3" | dd of="$dir/$1/model.bin" bs=1 seek=$((1024 + 4 * $2)) conv=notrunc status=none
}
# set_loss NAME STEP VALUE: the loss of STEP in NAME's metrics.jsonl becomes VALUE (a number, nan)
set_loss() {
    sed -i "s/^{\"step\":$2,\"loss\":[^,]*,/{\"step\":$2,\"loss\":$3,/" "$dir/$1/metrics.jsonl"
    grep -q "^{\"step\":$2,\"loss\":$3," "$dir/$1/metrics.jsonl" ||
        bad "set_loss $1 $2 $3: no such line"
}
loss_of() { sed -n "s/^{\"step\":$2,\"loss\":\([^,]*\),.*/\1/p" "$dir/$1/metrics.jsonl"; }
# set_norm NAME STEP VALUE: the gradient norm of STEP becomes VALUE (a number, null); norm_of
set_norm() {
    sed -i "s/^\({\"step\":$2,.*\"grad_norm\":\)[^,]*,/\1$3,/" "$dir/$1/metrics.jsonl"
    grep -q "^{\"step\":$2,.*\"grad_norm\":$3," "$dir/$1/metrics.jsonl" ||
        bad "set_norm $1 $2 $3: no such line"
}
norm_of() { sed -n "s/^{\"step\":$2,.*\"grad_norm\":\([^,]*\),.*/\1/p" "$dir/$1/metrics.jsonl"; }

train ref 0 4 --save-every 4
train again 0 4
expect "the same run again: SAME" 0 "^SAME" again ref
expect "  ... the losses of all 8 steps compared" 0 "8 steps compared \(1-8\)" again ref
# a MoE model of the same sizes (L C NH V context) is another model: its weights are not compared
# tensor by tensor (they were, over the MoE model's tensors: the dense run's read past their end)
train moe 0 4 --moe-experts 2 --moe-top-k 1
expect "a MoE model of the dense one's sizes: different models" 1 \
    "^weights: different models: .*, 2 experts, [0-9]+ parameters; .*, 0 experts" moe ref

# weights: element 5 of wte (whose largest |w| is below 0.1) made 0.5; then multiplied by 1 + 1e-6
# (about 10 ulps: within the default tolerance, not within 0)
copy w_far ref
poke w_far 5 '\x00\x00\x00\x3f'
expect "a perturbed weight: DIFFERENT" 1 "worst tensor wte" w_far ref
copy w_near ref
perl -e 'open(my $f, "+<", $ARGV[0]) or die "$ARGV[0]: $!"; binmode $f;
         seek($f, 1024 + 20, 0); read($f, my $b, 4);
         seek($f, 1024 + 20, 0); print $f pack("f<", unpack("f<", $b) * (1 + 1e-6))' \
    "$dir/w_near/model.bin"
cmp -s "$dir/w_near/model.bin" "$dir/ref/model.bin" && bad "w_near: the weight did not change"
expect "  ... a change of 1e-6 of a weight passes the default tolerance" 0 "^SAME" w_near ref
expect "  ... and fails --weights-rtol 0" 1 "^DIFFERENT" w_near ref --weights-rtol 0
copy w_nan ref
poke w_nan 100 '\x00\x00\xc0\x7f'
expect "a NaN weight: DIFFERENT, by name" 1 "wte not finite: 1 elements in .*w_nan, 0 in" w_nan ref
expect "  ... also under the loosest tolerance" 1 "^DIFFERENT" w_nan ref --rtol 1
expect "  ... and against itself (NaN on both sides)" 1 "wte not finite: 1 elements in .*, 1 in" \
    w_nan w_nan
copy w_inf ref
poke w_inf 100 '\x00\x00\x80\x7f'
expect "an infinite weight: DIFFERENT" 1 "wte not finite.*inf" w_inf ref

# losses: step 5's loss 1e-4 relative off, then NaN
copy l_far ref
set_loss l_far 5 "$(awk -v l="$(loss_of ref 5)" 'BEGIN { printf "%.9g", l * (1 + 1e-4) }')"
expect "a perturbed loss: DIFFERENT" 1 "worst relative difference [0-9.e-]* at step 5" l_far ref
copy l_nan ref
set_loss l_nan 3 nan
expect "a NaN loss: DIFFERENT, by step" 1 "step 3: loss not finite: nan in" l_nan ref
expect "  ... also under the loosest tolerance" 1 "^DIFFERENT" l_nan ref --rtol 1
# gradient norms: step 5's 1e-4 relative off; every step's doubled (a loss gradient not divided
# by the data-parallel replicas: with clipping off or always on, AdamW's scale invariance keeps
# losses and weights); null (a skipped step) in one run, in both; metrics without norms
copy n_far ref
set_norm n_far 5 "$(awk -v l="$(norm_of ref 5)" 'BEGIN { printf "%.9g", l * (1 + 1e-4) }')"
expect "a perturbed gradient norm: DIFFERENT" 1 "gradient norms: 8 steps .* at step 5" n_far ref
copy n_double ref
for s in 1 2 3 4 5 6 7 8; do
    set_norm n_double $s "$(awk -v l="$(norm_of ref $s)" 'BEGIN { printf "%.9g", 2 * l }')"
done
expect "every gradient norm doubled: DIFFERENT, by its norms alone" 1 \
    "gradient norms: .*worst relative difference 1 " n_double ref --loss-rtol 1 --weights-rtol 1
copy n_null ref
set_norm n_null 3 null
expect "a null gradient norm in one run: DIFFERENT" 1 "step 3: gradient norm not finite: nan in" \
    n_null ref
copy n_null2 n_null
expect "  ... in both (the same step skipped): SAME" 0 "1 steps skipped in both runs" n_null2 n_null
copy n_none ref
sed -i 's/"grad_norm":[^,]*,//' "$dir/n_none/metrics.jsonl"
expect "metrics without gradient norms: the losses and weights compared" 0 \
    "gradient norms: not compared \(8 lines of .*n_none" n_none ref

copy l_short ref
sed -i '$d' "$dir/l_short/metrics.jsonl"
expect "a run that ends a step earlier: DIFFERENT" 1 "ends at step 7, .* at step 8" l_short ref
copy l_gap ref
sed -i '/^{"step":4,/d' "$dir/l_gap/metrics.jsonl"
expect "a step missing in the middle: DIFFERENT" 1 "step 4 is in .*ref but not in .*l_gap" l_gap ref

# equivalent layouts: SAME with the default tolerances; data parallelism without its gradient
# reduction (a test hook of src/parallel/dp.c): DIFFERENT
train dp2 2 2
expect "dp2 against one process: SAME with the default tolerances" 0 "worst tensor" dp2 ref
train tp2 2 4 --tp 2
expect "tp2 against one process: SAME with the default tolerances" 0 "worst tensor" tp2 ref
L3D_TEST_SKIP_DP_REDUCE=1 train dp2_skip 2 2
expect "dp2 with its gradient reduction skipped: DIFFERENT" 1 "^DIFFERENT" dp2_skip ref
expect "  ... in its losses alone" 1 "^DIFFERENT" dp2_skip ref --weights-rtol 1
full && L3D_TEST_SKIP_DP_REDUCE=1 train dp2_zero1_skip 2 2 --zero 1 &&
    expect "dp2 ZeRO-1 with its gradient reduction skipped: DIFFERENT" 1 "^DIFFERENT" \
        dp2_zero1_skip ref

# resumed from ref's step-4 checkpoint into a new --out: metrics of steps 5-8 only
train resumed 0 4 --resume "$(printf '%s/ref/checkpoints/step_%08d' "$dir" 4)"
check "the resumed run's metrics start at step 5" \
    grep -q '^{"step":5,' <(head -1 "$dir/resumed/metrics.jsonl")
expect "resumed in a new directory: SAME as the original" 0 "^SAME" resumed ref
expect "  ... on the 4 steps they share" 0 "4 steps compared \(5-8\)" resumed ref
expect "  ... steps 1-4 noted as the original's only" 0 "steps: 1-4 only in .*ref" resumed ref
expect "  ... in either order" 0 "^SAME" ref resumed
copy r_bad resumed
set_loss r_bad 6 "$(awk -v l="$(loss_of resumed 6)" 'BEGIN { printf "%.9g", l * (1 + 1e-3) }')"
expect "  ... a perturbed loss there: DIFFERENT" 1 "at step 6" r_bad ref
copy early ref
sed -i '/^{"step":[1-4],/!d' "$dir/early/metrics.jsonl"
expect "no step in common: exit 2, not a pass" 2 "share no step" early resumed
expect "a missing directory: exit 2" 2 "cannot open" nothing_here ref
exit $fail
