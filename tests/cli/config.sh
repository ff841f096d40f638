#!/usr/bin/env bash
# --config FILE (src/cli/config.c): a tiny run writes the flags it was given to OUT/run.yaml, and
# `llm3d train --config OUT/run.yaml` into another --out trains the same losses, bit for bit
# (metrics.jsonl's text), while a flag given beside the file (--seed) changes them; the run.yaml
# files differ only in --out. plan takes a file as it takes its flags, and bad files are refused
# in one line naming the file and line, once under mpiexec. Usage: config.sh LLM3D SCRATCH_DIR.
# (Every flag of train round-trips through the file in tests/test_config.c.)
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"
src=$(cd "$(dirname "$0")/../.." && pwd)
byte_corpus config

losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }
run=(env OMP_NUM_THREADS=1 "$bin" train)
check "a tiny run with a few flags writes run.yaml" \
    bounded "${run[@]}" "${TINY[@]}" --steps 6 --lr 2e-3 --warmup 2 --batch 2 --seed 5 \
    --recompute selective --out "$dir/a"
check "run.yaml holds the flags given, in their sections" \
    grep -qx '  lr: 2e-3' "$dir/a/run.yaml"
check "run.yaml lists the flags not given, commented out" \
    grep -qx '  # grad-clip: G' "$dir/a/run.yaml"
check "the run from run.yaml trains" \
    bounded "${run[@]}" --config "$dir/a/run.yaml" --out "$dir/b"
if [ "$(losses "$dir/a" | wc -l)" -eq 6 ] && [ "$(losses "$dir/a")" = "$(losses "$dir/b")" ]; then
    ok "the run from run.yaml has the same losses, bit for bit: $(losses "$dir/b" | tail -1)"
else
    bad "the run from run.yaml has other losses: $(losses "$dir/a" | tr '\n' ' ') / $(losses "$dir/b" | tr '\n' ' ')"
fi
if diff <(grep -v '^  out: ' "$dir/a/run.yaml") <(grep -v '^  out: ' "$dir/b/run.yaml") > /dev/null &&
   grep -qx "  out: $dir/b" "$dir/b/run.yaml"; then
    ok "the second run's run.yaml is the first's but for --out"
else
    bad "the second run's run.yaml differs: $(diff "$dir/a/run.yaml" "$dir/b/run.yaml")"
fi
# the comparison can fail: a flag beside the file overrides it (wherever it stands)
bounded "${run[@]}" --seed 6 --config "$dir/a/run.yaml" --out "$dir/c" || bad "the --seed 6 run failed"
if [ -s "$dir/c/metrics.jsonl" ] && [ "$(losses "$dir/a")" != "$(losses "$dir/c")" ] &&
   grep -qx '  seed: 6' "$dir/c/run.yaml"; then
    ok "--seed 6 beside the file overrides its seed 5: other losses"
else
    bad "--seed 6 beside the file did not change the run"
fi

# plan: the same plan from a file as from the flags (a section of each kind, and the top level)
pflags=(--profile "$src/tests/data/plan/cpu.prof" --layers 4 --heads 4 --vocab 256 --channels 128
        --seq-len 64 --devices 4 --zero 1 --top 3)
cat > "$dir/plan.yaml" << EOF
model: {layers: 4, heads: 4, vocab: 256, channels: 128}
layout:
  seq-len: 64
  zero: 1
system:
  profile: $src/tests/data/plan/cpu.prof
  devices: 4
top: 3
EOF
untimed() { sed -E 's/ in [0-9.]+ s:/ in (time) s:/'; } # the search's own time differs
if "$bin" plan "${pflags[@]}" 2>&1 | untimed > "$dir/plan.flags" &&
   "$bin" plan --config "$dir/plan.yaml" 2>&1 | untimed > "$dir/plan.file" &&
   cmp -s "$dir/plan.flags" "$dir/plan.file" && grep -q '^best: ' "$dir/plan.file"; then
    ok "plan --config prints what the same flags print"
else
    bad "plan --config differs from the flags: $(diff "$dir/plan.flags" "$dir/plan.file" | head -5)"
fi

"$bin" plan --zero 2 --config "$dir/plan.yaml" 2>&1 | untimed > "$dir/plan.zero2"
if grep -q '^best: ' "$dir/plan.zero2" && ! cmp -s "$dir/plan.flags" "$dir/plan.zero2"; then
    ok "plan --zero 2 beside the file overrides its --zero 1: another plan"
else
    bad "plan --zero 2 beside the file printed the same plan"
fi

printf 'optimizer:\n  steps: 2\n  lerning-rate: 1e-3\n' > "$dir/typo.yaml"
expect_error "an unknown key, with the nearest flag" \
    "unknown key 'lerning-rate' in $dir/typo.yaml line 3: did you mean 'lr'?" \
    "$bin" train "${TINY[@]}" --config "$dir/typo.yaml"
printf 'layout:\n  lr: 1e-3\n' > "$dir/group.yaml"
expect_error "a key in another section" "line 2: 'lr' belongs in section 'optimizer:'" \
    "$bin" bench --config "$dir/group.yaml"
printf 'model:\n  layers: two\n' > "$dir/value.yaml"
expect_error "a bad value, in its flag's words with the file's line" \
    "llm3d plan: $dir/value.yaml line 2: --layers 'two' is not a whole number" \
    "$bin" plan --config "$dir/value.yaml"
printf 'data:\n  sequential: true\n  sequential: false\n' > "$dir/twice.yaml"
expect_error "a key given twice" "'sequential' is given twice, on lines 2 and 3" \
    "$bin" train "${TINY[@]}" --config "$dir/twice.yaml"
printf 'model:\n  layers: 2\n heads: 4\n' > "$dir/syntax.yaml"
expect_error "a YAML syntax error, at libyaml's line and column" \
    "syntax.yaml line 3 column 2: YAML syntax: " "$bin" train --config "$dir/syntax.yaml"
printf -- '- steps\n- 3\n' > "$dir/list.yaml"
expect_error "a document that is not a mapping" "the file is a list, not a mapping of flags" \
    "$bin" train --config "$dir/list.yaml"
expect_error --once "under mpiexec, rank 0 says it" "did you mean 'lr'?" \
    bounded env OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" train "${TINY[@]}" --config "$dir/typo.yaml"
exit $fail
