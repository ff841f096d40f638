#!/usr/bin/env bash
# llm3d inspect on each kind of path (token shard, llm.c checkpoint, training checkpoint, run
# directory), text and --json; one clear error for a bad path and for each damaged file.
# Usage: inspect.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, expect_error, fail
start_test "$@"

for i in $(seq 1 200); do echo "line $i: the quick brown fox"; done > "$dir/a.txt"
check "prepare" "$bin" prepare --tokenizer bytes --out "$dir/data" --val-fraction 0.1 "$dir/a.txt" > /dev/null
check "train with checkpoints" sh -c "OMP_NUM_THREADS=2 '$bin' train --model tiny --vocab 256 --context 32 \
    --seq-len 32 --batch 2 --steps 4 --warmup 1 --val-every 2 --val-batches 1 --save-every 2 --quiet \
    --train '$dir/data/train_*.bin' --val '$dir/data/val_*.bin' --out '$dir/run' > /dev/null"
shard=$dir/data/train_000000.bin
insp() { "$bin" inspect "$@" > "$dir/out.txt" 2> "$dir/err.txt"; }
has() { grep -q -- "$1" "$dir/out.txt"; }
json() { python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$dir/out.txt"; }
jfield() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d = d[k]
print(d)' "$dir/out.txt" "$1"; }

check "token shard" insp "$shard" --tokenizer bytes
check "  ... its count and range" has "tokens:     [0-9]*, ids 10\.\.120"
check "  ... its first tokens decoded" has 'decoded:    "line 1: the quick brown " (--tokenizer bytes)'
check "  ... --json" sh -c "$(declare -f insp); bin='$bin' dir='$dir' insp '$shard' --json --tokenizer bytes"
check "  ... is JSON: a token shard" test "$(jfield kind)" = token_shard
check "  ... with the decoded text" test "$(jfield first_text)" = "line 1: the quick brown "

check "llm.c checkpoint" insp "$dir/run/model.bin"
check "  ... its shape and dtype" has "L=2 C=64 NH=4 V=256 (padded 256) context 32, 0.12M parameters"
check "  ... fp32, finite" sh -c "grep -q 'fp32' '$dir/out.txt' && grep -q 'all finite' '$dir/out.txt'"
check "  ... --json" sh -c "$(declare -f insp); bin='$bin' dir='$dir' insp '$dir/run/model.bin' --json"
check "  ... parameters 118528, fp32" test "$(jfield parameters) $(jfield dtype)" = "118528 fp32"

check "training checkpoint (the checkpoint directory)" insp "$dir/run/checkpoints"
check "  ... step 4 (latest)" has "training checkpoint, format 4, step 4"
check "  ... layout, precision" sh -c "grep -q 'tp 1 x pp 1 x dp 1, ZeRO-0' '$dir/out.txt' && grep -q 'parameters fp32, AdamW moments fp32' '$dir/out.txt'"
check "  ... checksums verified" has "checksums verified"
check "  ... a step directory" sh -c "'$bin' inspect '$dir/run/checkpoints/step_00000002' | grep -q 'step 2$'"
check "  ... --json" sh -c "$(declare -f insp); bin='$bin' dir='$dir' insp '$dir/run/checkpoints' --json"
check "  ... step, dtype, files" test "$(jfield step) $(jfield params_dtype) $(jfield files)" = "4 fp32 1"

check "run directory" insp "$dir/run"
check "  ... its steps and losses" has "4 step line(s), steps 1\.\.4, loss"
check "  ... its validation loss" has "validation: loss [0-9.]* at step 4"
check "  ... its model and latest checkpoint" sh -c "grep -q 'model.bin:  llm.c fp32' '$dir/out.txt' && grep -q 'checkpoint: .*step_00000004, step 4' '$dir/out.txt'"
check "  ... one screen" test "$(wc -l < "$dir/out.txt")" -le 24
check "  ... --json" sh -c "$(declare -f insp); bin='$bin' dir='$dir' insp '$dir/run' --json"
check "  ... run id, last step, nested model and checkpoint" \
    test "$(jfield run_id) $(jfield last_step) $(jfield model.V) $(jfield checkpoint.step)" = "run 4 256 4"

# bad paths and damaged files: exit 1, one line naming the problem
expect_error "a missing path" "nope.bin: No such file" "$bin" inspect "$dir/nope.bin"
head -c 3000 /dev/urandom > "$dir/garbage.bin"
expect_error "a file of another kind" "garbage.bin: not a token shard.*or an llm.c checkpoint" "$bin" inspect "$dir/garbage.bin"
mkdir -p "$dir/empty"
expect_error "a directory of another kind" "empty: a directory that is neither" "$bin" inspect "$dir/empty"
head -c 1500 "$shard" > "$dir/trunc_shard.bin"
expect_error "a truncated shard" "trunc_shard.bin" "$bin" inspect "$dir/trunc_shard.bin"
head -c 100000 "$dir/run/model.bin" > "$dir/trunc_model.bin"
expect_error "a truncated llm.c checkpoint" "trunc_model.bin: 100000 bytes, expected 475136" "$bin" inspect "$dir/trunc_model.bin"
cp "$dir/run/model.bin" "$dir/nan.bin"
printf '\x00\x00\xc0\x7f' | dd of="$dir/nan.bin" bs=1 seek=2000 conv=notrunc status=none
expect_error "llm.c weights that are not finite" "nan.bin: 1 of its weights are not finite" "$bin" inspect "$dir/nan.bin"
cp -r "$dir/run/checkpoints/step_00000004" "$dir/flip"
printf '\x5a' | dd of="$dir/flip/rank_00000.bin" bs=1 seek=1000 conv=notrunc status=none
expect_error "a damaged rank file (checksum)" "rank_00000.bin: checksum" "$bin" inspect "$dir/flip"
cp -r "$dir/run/checkpoints/step_00000004" "$dir/missing" && rm "$dir/missing/rank_00000.bin"
expect_error "a missing rank file" "rank_00000.bin.*missing" "$bin" inspect "$dir/missing"
gpt2=$(dirname "$0")/../data/gpt2
check "a GPT-2 shard" "$bin" prepare --tokenizer "$gpt2" --out "$dir/gpt2" --val-fraction 0 "$dir/a.txt" > /dev/null
check "  ... decoded with --tokenizer DIR" sh -c "'$bin' inspect '$dir/gpt2/train_000000.bin' --tokenizer '$gpt2' | grep -q 'decoded:    \"<|endoftext|>line 1: the quick brown fox'"
expect_error "  ... a shard beyond the tokenizer's vocabulary" "holds token 50256, beyond the 256" "$bin" inspect \
    "$dir/gpt2/train_000000.bin" --tokenizer bytes
# a FIFO in place of a run's metrics.jsonl: refused at once (a plain fopen waited for a writer
# for ever; the time limit makes that a failure, not a hang)
mkdir -p "$dir/fiforun" && mkfifo "$dir/fiforun/metrics.jsonl"
expect_error "a FIFO as a run's metrics.jsonl: refused, not waited on" \
    "metrics file .*fiforun/metrics.jsonl is not a regular file (a FIFO)" \
    timeout -s KILL 10 "$bin" inspect "$dir/fiforun"
# flags: from the one table (src/cli/flags.c's parser), one line each
check "--help lists the flags" sh -c "'$bin' inspect --help | grep -q '^  --tokenizer SPEC' && \
    '$bin' inspect --help | grep -q '^  --json '"
expect_error "no PATH" "^llm3d inspect: give one PATH" "$bin" inspect --json
expect_error "an unknown flag" "^llm3d inspect: unknown flag.*'--jsn'" "$bin" inspect "$shard" --jsn
exit $fail
