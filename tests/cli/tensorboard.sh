#!/usr/bin/env bash
# llm3d train --tensorboard DIR: the event files, decoded by an independent reader
# (tests/cli/tfevents_read.py: TFRecord framing and masked CRC-32C checked, Event and Summary
# decoded by hand, python3's standard library only), hold every step's values of metrics.jsonl to
# float32 precision: one process with validation; two ranks in fp16 with a skipped step (the loss
# scale backing off), one file (rank 0's); a resumed run's second file, merged as TensorBoard
# merges them. Negative cases: the reader refuses a flipped byte and a record cut short, and its
# comparison a changed value; --tensorboard over a file is a flag error; a write that fails (a
# file-size limit) names the file and leaves it ending with its last complete record.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"
command -v python3 > /dev/null || { bad "python3 missing: scripts/setup.sh installs it"; exit 1; }
rd="python3 $(dirname "$0")/tfevents_read.py"
byte_corpus tensorboard
TRAIN_FLAGS=("${TINY[@]}" --val "$dir/data/val_*.bin")
TRAIN_LOG=check

check "the reader's CRC-32C: 0xE3069283 for \"123456789\"" $rd selftest

# ---- one process, validation at steps 3 and 6; the directory made (two levels)
train one 0 2 --steps 6 --val-every 3 --tensorboard "$dir/tb/one"
files=("$dir"/tb/one/events.out.tfevents.*)
check "one event file, named events.out.tfevents.<seconds>.<host>.<pid>.llm3d" \
    sh -c "[ ${#files[@]} -eq 1 ] && echo '${files[0]##*/}' | grep -qE '^events\.out\.tfevents\.[0-9]{10}\..+\.[0-9]+\.llm3d$'"
out=$($rd compare "$dir/tb/one" "$dir/one/metrics.jsonl" 2>&1)
check "every step's values equal metrics.jsonl's: $out" test $? -eq 0
check "... validation at steps 3 and 6" \
    test "$($rd dump "${files[0]}" | grep -c 'val/loss')" -eq 2

# negative: the reader and the comparison must refuse what differs
cp "${files[0]}" "$dir/flipped"
size=$(stat -c %s "$dir/flipped")
python3 -c "
import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[int(sys.argv[2])] ^= 0x10
open(p, 'wb').write(b)" "$dir/flipped" $((size - 10))
expect_error "negative: a flipped byte in the last record's data" "data CRC mismatch" \
    $rd dump "$dir/flipped"
head -c $((size - 3)) "${files[0]}" > "$dir/cut"
expect_error "negative: the last record cut short" "data bytes announced" $rd dump "$dir/cut"
head -c $((size - 20)) "${files[0]}" > "$dir/cut2"
expect_error "negative: a record cut in its data" "data bytes announced" $rd dump "$dir/cut2"
sed 's/"step":4,"loss":[0-9.]*/"step":4,"loss":1.5/' "$dir/one/metrics.jsonl" > "$dir/changed.jsonl"
expect_error "negative: metrics.jsonl with step 4's loss changed" "step 4: train/loss 1.5" \
    $rd compare "$dir/tb/one" "$dir/changed.jsonl"
grep -v '"step":6' "$dir/one/metrics.jsonl" > "$dir/short.jsonl"
expect_error "negative: metrics.jsonl without step 6" "steps differ" \
    $rd compare "$dir/tb/one" "$dir/short.jsonl"

# ---- two ranks, fp16: a NaN gradient on rank 1 at step 3 (an overflow: skipped, the scale
# backs off); only rank 0 writes
L3D_TEST_NAN_AT_STEP=3:1 train two 2 2 --dp 2 --steps 5 --precision fp16 \
    --initial-loss-scale 1024 --hysteresis 1 --tensorboard "$dir/tb/two"
out=$($rd compare "$dir/tb/two" "$dir/two/metrics.jsonl" 2>&1)
check "2 ranks, fp16, step 3 skipped: the values equal metrics.jsonl's: $out" test $? -eq 0
check "... one event file (rank 0's)" test "$(ls "$dir/tb/two" | wc -l)" -eq 1
$rd dump "$dir"/tb/two/* > "$dir/two.tsv"
check "... step 3 alone skipped, the loss scale 1024 until then, 512 after" sh -c "
    [ \"\$(grep -P '\ttrain/skipped\t1$' '$dir/two.tsv' | cut -f1)\" = 3 ] &&
    [ \"\$(grep -P '\ttrain/loss_scale\t' '$dir/two.tsv' | cut -f3 | tr '\n' ' ')\" = '1024 1024 1024 512 512 ' ]"

# ---- a resumed run: from step 2 of a run that went to 4; its second file replaces steps 3-4
train res 0 2 --steps 4 --save-every 2 --keep 5 --tensorboard "$dir/tb/res"
train res 0 2 --steps 6 --resume "$dir/res/checkpoints/step_00000002" --tensorboard "$dir/tb/res"
check "resumed: two event files" test "$(ls "$dir/tb/res" | wc -l)" -eq 2
out=$($rd compare "$dir/tb/res" "$dir/res/metrics.jsonl" 2>&1)
check "resumed: the merged files equal metrics.jsonl (steps 1-2 of the first, 3-6 of the \
second): $out" test $? -eq 0

# ---- flags and writes
touch "$dir/plain"
expect_error "--tensorboard over a file" "tensorboard $dir/plain exists and is not a directory" \
    "$bin" train "${TRAIN_FLAGS[@]}" --steps 1 --tensorboard "$dir/plain"
expect_error "--tensorboard where no directory can be made (under a file)" \
    "tensorboard: cannot create the output directory $dir/plain/tb" \
    "$bin" train "${TRAIN_FLAGS[@]}" --steps 1 --tensorboard "$dir/plain/tb"
# a file-size limit of 1 KiB: the event file (no --out) fills it within a few steps
# (--backend cpu: the checking backend's device arena is a file, which the limit would stop first)
(ulimit -f 1; OMP_NUM_THREADS=1 bounded "$bin" train "${TRAIN_FLAGS[@]}" --batch 2 --backend cpu \
    --steps 40 --tensorboard "$dir/tb/lim" > /dev/null 2> "$dir/lim.err")
rc=$?
check "an event file past the file-size limit: non-zero exit (got $rc), one error naming it" \
    sh -c "[ $rc -ne 0 ] && [ \$(wc -l < '$dir/lim.err') -eq 1 ] &&
           grep -q 'cannot write $dir/tb/lim/events.out.tfevents.*: File too large' '$dir/lim.err'"
check "... the file ends with its last complete record" sh -c "$rd dump '$dir'/tb/lim/* > /dev/null"
exit $fail
