#!/usr/bin/env bash
# --moe-force-balance (README "Mixture of experts"; docs/DESIGN.md "Forced balanced routing"): the
# router's selection replaced by a fixed one by position, (layer + (b T + t) K + j) mod E, for
# benchmarks. moe-tiny (E 4, K 2, T 32: T K a multiple of E) reports a load of 1 in every layer and
# step, says the routing is forced (start-up line, run record, step records, step line), in fp32
# and bf16; and the routing is the same in every layout: ep 2, tp 2 with SP, cp 2 (a ring rank's
# two chunks), pp 2, ZeRO-3 and full recomputation each match one process on the same
# micro-batches (ep_layouts.sh's tolerances); generation with the KV cache routes position t as
# the full window does. Negative cases: the trained router's run (load above 1) is told apart, and
# the flag on a dense model is refused naming it. Usage: moeforce.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus moeforce
TRAIN_FLAGS=("${TINY[@]}" --model moe-tiny --moe-force-balance --moe-aux-loss-coef 1 --steps 3
             --warmup 1 --lr 1e-3 --eps 1e-6)
TRAIN_LOG=check
# same NAME REF: ep_layouts.sh's tolerances under cp and tp (losses and norms 1e-5, weights 6e-5:
# a ring's and tp's bias sums in another order)
same() { L3D_COMPARE="--loss-rtol 1e-5 --norm-rtol 1e-5 --weights-rtol 6e-5" same_run "$@"; }
# balanced RUN: every step's every layer's load is 1 and each record says forced
balanced() {
    python3 - "$dir/$1/metrics.jsonl" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step" in r]
ok = recs[0]["model"].get("moe_routing") == "forced" and len(steps) > 0
for r in steps:
    ok &= r.get("moe_routing") == "forced" and len(r["moe_load"]) == 2
    ok &= all(x == 1 for x in r["moe_load"]) and r["moe_load_max"] == 1
sys.exit(0 if ok else 1)
EOF
}

train ref1 0 2 && train ref2 0 2 --grad-accum 2
check "one process: load 1 in every layer and step, records marked forced" balanced ref1
check "the start-up line says the routing is forced, for benchmarking only" \
    grep -q "routing: FORCED balanced (--moe-force-balance, benchmarking only)" "$dir/ref1.log"
loud=()
for f in "${TRAIN_FLAGS[@]}"; do [ "$f" = --quiet ] || loud+=("$f"); done # the step lines shown
bounded "$bin" train "${loud[@]}" --steps 1 --batch 2 > "$dir/loud.log" 2>&1
check "each step line says its load is forced" grep -q "| load 1.00 (forced)" "$dir/loud.log"
# negative: the trained router's routing (the same run without the flag) is not balanced, and
# compare tells the two runs apart
TRAIN_FLAGS=("${TINY[@]}" --model moe-tiny --moe-aux-loss-coef 1 --steps 3 --warmup 1 --lr 1e-3
             --eps 1e-6)
train natural 0 2
TRAIN_FLAGS=("${TINY[@]}" --model moe-tiny --moe-force-balance --moe-aux-loss-coef 1 --steps 3
             --warmup 1 --lr 1e-3 --eps 1e-6)
loads=$(grep -o '"moe_load_max":[0-9.e+-]*' "$dir/natural/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
! balanced natural && awk -v l="$loads" 'BEGIN { n = split(l, a, " "); for (i = 1; i <= n; i++)
    if (a[i] > 1) exit 0; exit 1 }' &&
    ok "  (negative: the router's own routing is not balanced: loads $loads)" ||
    bad "the run without --moe-force-balance reads as balanced (loads $loads)"
"$bin" compare --rtol 1e-5 "$dir/natural" "$dir/ref1" > /dev/null 2>&1 &&
    bad "compare took the router's routing for the forced one" ||
    ok "  (negative: compare tells the forced run from the router's)"

# every layout routes each row by its position as one process does
train ep2 2 2 --ep 2 && same_run ep2 ref2
train tp2_sp 2 2 --tp 2 --sequence-parallel && same tp2_sp ref1
train tp2 2 2 --tp 2 && same tp2 ref1
train cp2 2 2 --cp 2 && same cp2 ref1 && check "cp 2: load 1, marked forced" balanced cp2
train ep2_cp2_cf 2 2 --cp 2 --ep 2 --moe-capacity-factor 0.75 &&
    train ref1_cf 0 2 --moe-capacity-factor 0.75 && same ep2_cp2_cf ref1_cf
# (the capacity, ceil(0.75 N K / E) = 24 of each expert's 32 forced rows, still drops)
check "  ... with the capacity's drops" grep -q '"moe_dropped":[1-9]' "$dir/ep2_cp2_cf/metrics.jsonl"
train ep2_zero3_rc 2 2 --ep 2 --zero 3 --recompute full && same_run ep2_zero3_rc ref2
P=(--layers 4)
train ref4_l4 0 2 --grad-accum 4 "${P[@]}" &&
    train ep2_pp2 4 2 --pp 2 --ep 2 --grad-accum 2 "${P[@]}" && same_run ep2_pp2 ref4_l4
train bf16 0 2 --precision bf16 && check "bf16: load 1, marked forced" balanced bf16

# generation: position t of the sequence, the KV cache's one row a step as the full window's
gen() { "$bin" generate --checkpoint "$dir/ref1/model.bin" --tokenizer bytes --prompt "row 1" \
            --max-tokens 24 --temperature 0 --moe-force-balance "$@" 2>/dev/null; }
a=$(gen) && b=$(gen --no-kv-cache) && [ -n "$a" ] && [ "$a" = "$b" ] &&
    ok "generation with the KV cache routes as the full window (\"$a\")" ||
    bad "generation forced: cache \"$a\", full window \"$b\""

# bad input: the flag on a dense model, and generate's on a dense checkpoint
TRAIN_FLAGS=("${TINY[@]}" --steps 1)
train dense 0 2
train_cmd dense_forced 0 2 --moe-force-balance
expect_error "--moe-force-balance on a dense model" "llm3d train: --moe-force-balance on a dense model" \
    "${CMD[@]}"
train_cmd dense_forced_np2 2 2 --moe-force-balance --tp 2
expect_error --once "  ... under mpiexec, said once" "--moe-force-balance on a dense model" "${CMD[@]}"
expect_error "generate --moe-force-balance on a dense checkpoint" \
    "llm3d generate: --moe-force-balance: .* is a dense model" \
    "$bin" generate --checkpoint "$dir/dense/model.bin" --tokenizer bytes --moe-force-balance
exit $fail
