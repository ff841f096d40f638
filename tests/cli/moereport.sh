#!/usr/bin/env bash
# A mixture of experts' reporting (README "Mixture of experts"): the run record's total and active
# parameters against counts written here from the sizes alone (python3), model FLOPs a token from
# the active ones (MFU's count), the start-up line's expert memory on the fullest rank on one process and
# under --ep 2 (half the experts) with ZeRO-1 over the ranks holding the same experts; each step's
# auxiliary losses and per-layer loads in metrics.jsonl (and TensorBoard's moe/ tags, the same
# values); llm3d plot's load and auxiliary-loss
# charts holding those values, none for a dense run; hostile loads refused naming file, line and
# key. Usage: moereport.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"
chk="python3 $(dirname "$0")/lib/svgcheck.py"
LOAD="Expert load (busiest expert / mean; solid: the busiest layer)"
AUX="Router auxiliary losses (unweighted)"

byte_corpus moereport
TRAIN_FLAGS=("${TINY[@]}" --model moe-tiny --steps 5 --warmup 1)
TRAIN_LOG=check
train one 0 2 --quiet --tensorboard "$dir/tb" || exit 1
m=$dir/one/metrics.jsonl
check "TensorBoard's moe/aux_loss, moe/z_loss and moe/load_max are metrics.jsonl's" \
    python3 "$(dirname "$0")/tfevents_read.py" compare "$dir/tb" "$m"
check "  ... three tags a step" test "$(python3 "$(dirname "$0")/tfevents_read.py" dump "$dir"/tb/* | grep -c "moe/")" -eq 15

# moe-tiny: GPT-2's tiny (L 2, C 64, V 256, context 32) with 4 GELU experts of width 128, top-2,
# biases; the count of each tensor (wte, wpe; ln_1, c_attn, c_proj, ln_2; router, experts; ln_f)
read -r total active expert <<< "$(python3 -c "
L, C, V, T, F, E, K = 2, 64, 256, 32, 128, 4, 2
expert = 2 * C * F + F + C
layer = lambda k: 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + E * C + k * expert
print(V * C + T * C + L * layer(E) + 2 * C, V * C + T * C + L * layer(K) + 2 * C, L * E * expert)")"
rec=$(head -1 "$m")
check "run record: $total parameters, $active active (written here from the sizes)" \
    grep -q "\"params\":$total,\"active_params\":$active,\"experts\":4" <<< "$rec"
# negative: the check tells the two counts apart
! grep -q "\"params\":$active," <<< "$rec" && ok "  (negative: the total is not the active count)" ||
    bad "  the record's total equals the active count"
fpt=$(grep -o '"flops_per_token":[0-9.e+]*' "$m" | tail -1 | cut -d: -f2)
want=$(python3 -c "print(6 * ($active - 32 * 64) + 12 * 2 * 64 * 32)")  # llm3d's 6N + 12 L C T, wpe a lookup
check "model FLOPs a token from the active parameters: $fpt = 6 ($active - wpe) + 12 L C T" \
    python3 -c "import sys; sys.exit(abs($fpt - $want) > 1e-6 * $want)"
check "  (negative: not from the total)" python3 -c "import sys; sys.exit(abs($fpt - (6 * ($total - 2048) + 49152)) < 1)"
check "the start-up line names the active count and says MFU counts it" \
    grep -q "$(python3 -c "print('%.2fM parameters, %.2fM active a token (model FLOPs and MFU count the active ones)' % ($total / 1e6, $active / 1e6))")" "$dir/one.log"
mem=$(python3 -c "print('4 of the 4 experts x 2 layer(s) = %.2fM parameters, %.1f MiB (16N' % ($expert / 1e6, 16 * $expert / 1048576))")
check "expert memory on the fullest rank: $mem" grep -q "expert memory on the fullest rank: $mem" "$dir/one.log"

# each step: the auxiliary losses, the busiest layer's load and each layer's, a load >= 1 (the
# busiest expert over the mean) and the largest equal to the layers' maximum
check "every step line has moe_aux_loss, moe_z_loss and 2 layers' loads" python3 -c "
import json, sys
steps = [json.loads(l) for l in open('$m')][1:]
assert len(steps) == 5, len(steps)
for s in steps:
    assert s['moe_aux_loss'] > 0 and s['moe_z_loss'] > 0, s
    assert len(s['moe_load']) == 2 and min(s['moe_load']) >= 1, s
    assert s['moe_load_max'] == max(s['moe_load']), s"

# --ep 2 on 2 ranks: each holds half the experts; ZeRO-1 over the 2 ranks of 4 holding the same
if train ep2 2 2 --ep 2 && train ep2z 4 2 --ep 2 --zero 1; then
    half=$(python3 -c "print('2 of the 4 experts x 2 layer(s) = %.2fM parameters, %.1f MiB (16N' % ($expert / 2e6, 16 * $expert / 2 / 1048576))")
    check "--ep 2: $half" grep -q "expert memory on the fullest rank: $half" "$dir/ep2.log"
    z=$(python3 -c "print('= %.2fM parameters, %.1f MiB (12N of weights, gradients and AdamW; ZeRO-1 over the 2 rank(s)' % ($expert / 2e6, 12 * $expert / 2 / 1048576))")
    check "--ep 2 --zero 1 on 4 ranks: $z" grep -q -- "$z" "$dir/ep2z.log"
fi
# --pp 2 of 4 layers, the first 2 dense: rank 0 holds no expert, rank 1 the 2 MoE layers' (the
# line once counted rank 0's chunks alone, "x 0 layer(s)")
if train pp2 2 2 --pp 2 --layers 4 --moe-dense-layers 2 --steps 1; then
    check "--pp 2, 2 dense layers first: $mem" grep -q "expert memory on the fullest rank: $mem" "$dir/pp2.log"
fi

# llm3d plot: the load chart holds the steps and the loads, the auxiliary one the losses
check "plot of the MoE run" "$bin" plot "$dir/one" --out "$dir/one.svg"
check "  ... parses as XML" xmllint --noout "$dir/one.svg"
read -r lo hi alo ahi zlo zhi <<< "$(python3 -c "
import json
s = [json.loads(l) for l in open('$m')][1:]
loads = [x for t in s for x in t['moe_load']]
a = [t['moe_aux_loss'] for t in s]; z = [t['moe_z_loss'] for t in s]
print(min(loads), max(loads), min(a), max(a), min(z), max(z))")"
check "  ... load chart: steps 1..5" $chk axis "$dir/one.svg" "$LOAD" x 1 5
check "  ... load chart: the loads $lo..$hi" $chk axis "$dir/one.svg" "$LOAD" y "$lo" "$hi"
check "  ... the busiest layer's line and each of the 2 layers'" \
    sh -c "test \$(grep -c 'data-kind=\"load\"' '$dir/one.svg') -eq 2 && $chk runs '$dir/one.svg' '$LOAD' load-max 1"
check "  ... auxiliary chart: $alo..$zhi" $chk axis "$dir/one.svg" "$AUX" y "$alo" "$zhi"
! $chk axis "$dir/one.svg" "$LOAD" y 1 "$(python3 -c "print($hi + 0.01)")" 2> /dev/null &&
    ok "  (negative: a wrong load range is refused)" || bad "  the range check passed a wrong load"
train dense 0 2 --quiet --model tiny > /dev/null
check "a dense run's plot has no load chart" sh -c "'$bin' plot '$dir/dense' --out '$dir/dense.svg' > /dev/null && ! grep -q 'Expert load' '$dir/dense.svg'"
check "  (negative: the MoE one has)" grep -q "Expert load" "$dir/one.svg"

# many MoE layers: every layer's load on the step's line, beyond the 4 KiB the scalars take
# (2100 layers of 2 experts, top-2: each load exactly 1, "1," a layer; the line once aborted)
train many 0 1 --quiet --layers 2100 --channels 8 --heads 1 --moe-experts 2 --moe-ffn 8 \
    --context 4 --seq-len 4 --steps 1 > /dev/null &&
    n=$(grep -o '"moe_load":\[[^]]*\]' "$dir/many/metrics.jsonl" | tr ',' '\n' | grep -c .) &&
    [ "$n" = 2100 ] && ok "2100 MoE layers: the step's line holds 2100 loads" ||
    bad "2100 MoE layers: the step's line holds ${n:-no} loads"
check "  and llm3d plot reads it" "$bin" plot "$dir/many" --out "$dir/many.svg"

# hostile loads: one line naming the file, the line and the key
mkdir -p "$dir/h1" "$dir/h2"
{ head -2 "$m"; sed -n 3p "$m" | sed 's/"moe_load":\[[^]]*\]/"moe_load":[1.5]/'; } > "$dir/h1/metrics.jsonl"
expect_error "a load array of another length" "h1/metrics.jsonl: line 3: \"moe_load\" holds 1 layers, the lines before 2" \
    "$bin" plot "$dir/h1" --out "$dir/h1.svg"
{ head -2 "$m"; sed -n 3p "$m" | sed 's/"moe_load":\[[0-9.]*,/"moe_load":["x",/'; } > "$dir/h2/metrics.jsonl"
expect_error "a load that is not a number" "h2/metrics.jsonl: line 3, column [0-9]*: \"moe_load\": expected a number, found a string" \
    "$bin" plot "$dir/h2" --out "$dir/h2.svg"
# more loads than a model has layers: refused before the columns are sized by it (the reader
# keeps every line's loads: an array of millions sized them at gigabytes)
mkdir -p "$dir/h3"
l2=$(sed -n 2p "$m"); post=${l2#*\"moe_load\":\[}
{ head -1 "$m"; printf '%s"moe_load":[%s]%s\n' "${l2%%\"moe_load\":*}" "$(yes 1 | head -65537 | paste -sd,)" "${post#*]}"; } > "$dir/h3/metrics.jsonl"
expect_error "a load array longer than a model" "h3/metrics.jsonl: line 2: \"moe_load\" holds 65537 layers, more than a model has (65536" \
    "$bin" plot "$dir/h3" --out "$dir/h3.svg"
exit $fail
