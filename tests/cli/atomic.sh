#!/usr/bin/env bash
# Files never half-written, never the wrong file (issue 51; docs/DESIGN.md "Writing files"):
# a sharded Hugging Face folder overwritten by `convert` and by `train --resume auto --out`,
# the writer SIGKILLed at steps of the overwrite (L3D_FILE_TEST_KILL=N: every step of convert's,
# 41 of train's last 80): the folder loads as the old model or the new one every time, the user's
# files in it kept, and no temporary is left after the next write; a model already there needs
# --overwrite; output paths that are not regular files (a FIFO, a link, a device) are refused
# by name and left as they were. Usage: atomic.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus atomic
TRAIN_FLAGS=("${TINY[@]}" --steps 2 --warmup 1)
TRAIN_LOG=check
train gpt 0 2 || exit 1
train llama 0 2 --model llama-tiny || exit 1
old=$dir/gpt/model.bin new=$dir/llama/model.bin
temps() { find "$dir" -name '*.l3d-tmp.*' | wc -l; }
# quiet COMMAND...: its status, with no "Killed" line from this shell when a signal ends it
quiet() { bash -c '"$@"; exit $?' _ "$@" > /dev/null 2>&1; }

# the folder's model: "old", "new", or what else it is
loads_as() {
    rm -f "$dir/back.bin"
    "$bin" convert "$1" "$dir/back.bin" > /dev/null 2>&1 || { echo unreadable; return; }
    if cmp -s "$dir/back.bin" "$old"; then echo old
    elif cmp -s "$dir/back.bin" "$new"; then echo new
    else echo mixed; fi
}

# ---- a model already there needs --overwrite ----------------------------------------------
check "convert: a GPT-2 folder in 3 shards" "$bin" convert "$old" "$dir/f" --save-shard-mb 0.02
echo '{"user": "tokenizer"}' > "$dir/f/tokenizer.json"
before=$(ls -l --time-style=full-iso "$dir/f")
expect_error "convert over a folder's model without --overwrite" \
    "$dir/f already holds a model: give --overwrite" "$bin" convert "$new" "$dir/f"
expect_error "convert over an llm.c file without --overwrite" \
    "$dir/gpt/model.bin already holds a model" "$bin" convert "$new" "$old"
check "  ... both left as they were" test "$(loads_as "$dir/f")" = old
expect_error "train --out over a Hugging Face folder without --overwrite" \
    "holds an earlier run (a Hugging Face model's files)" \
    "$bin" train "${TRAIN_FLAGS[@]}" --batch 2 --out "$dir/f"
expect_error "  ... nor with --resume auto (no run of llm3d there)" \
    "holds a Hugging Face model but no run of llm3d" \
    "$bin" train "${TRAIN_FLAGS[@]}" --batch 2 --out "$dir/f" --resume auto
check "  ... the folder left as it was" test "$(ls -l --time-style=full-iso "$dir/f")" = "$before"

# ---- convert killed at each step of the overwrite -------------------------------------------
reset_f() { "$bin" convert "$old" "$dir/f" --overwrite --save-shard-mb 0.02 > /dev/null; }
n=$(L3D_FILE_TEST_KILL=count "$bin" convert "$new" "$dir/f" --overwrite --save-shard-mb 0.015 \
    2>&1 > /dev/null | sed -n 's/^file points: //p')
check "the overwrite's steps counted ($n)" test "${n:-0}" -gt 20
seen=" "
# every step in the normal build; every 9th (and the last 9) where each run costs 5x
# (sanitized, checking backend): the same code paths, fewer stopping points
stride=1
full || stride=9
for k in $( (seq 1 "$stride" "${n:-0}"; seq $(( ${n:-0} - 8 )) "${n:-0}") | sort -nu); do
    reset_f
    L3D_FILE_TEST_KILL=$k quiet "$bin" convert "$new" "$dir/f" --overwrite --save-shard-mb 0.015
    rc=$?
    got=$(loads_as "$dir/f")
    [ -s "$dir/f/tokenizer.json" ] || got="$got-without-tokenizer"
    [ $rc -eq 137 ] || got="$got-exit-$rc"
    seen="$seen$k:$got "
done
check "killed at its steps (1 in $stride of $n, and the last 9): the folder is the old model or the new one" \
    sh -c "! echo '$seen' | grep -qE ':(mixed|unreadable|[a-z]+-)'"
check "  ... both seen (the old before the exchange, the new after)" \
    sh -c "echo '$seen' | grep -q ':old ' && echo '$seen' | grep -q ':new '"
"$bin" convert "$old" "$dir/b16" --precision bf16 > /dev/null
check "  ... (negative: loads_as tells the models from a third, the old one rounded to bf16)" \
    test "$(loads_as "$dir/b16")" = mixed -a "$(loads_as "$dir/llama")" = new
reset_f
check "no temporary left after the next write" test "$(temps)" -eq 0

# ---- train --resume auto --out killed while it replaces its folder ------------------------
TRAIN_FLAGS=("${TINY[@]}" --warmup 1 --save-every 2 --save-shard-mb 0.02)
train r 0 2 --steps 2 || exit 1
cp -a "$dir/r" "$dir/r0"
train done 0 2 --steps 4 || exit 1
ref=$dir/done/model.bin
rm -rf "$dir/done" && cp -a "$dir/r0" "$dir/done"
train done 0 2 --steps 4 --resume auto || exit 1
check "a resumed run's folder = the uninterrupted one's (the reference)" \
    sh -c "'$bin' convert '$dir/done' '$dir/ref.bin' > /dev/null && cmp '$dir/ref.bin' '$ref'"
train_cmd r 0 2 --steps 4 --resume auto
m=$(L3D_FILE_TEST_KILL=count "${CMD[@]}" 2>&1 > /dev/null | sed -n 's/^file points: //p')
rm -rf "$dir/r" && cp -a "$dir/r0" "$dir/r"
check "train's steps counted ($m)" test "${m:-0}" -gt 80
bad_runs="" seen=" "
step=2
full || step=8
# the last 80 steps (41 of them; 11 where runs cost 5x): the last checkpoint, model.bin, the folder
for k in $(seq $((m - 80)) "$step" "$m"); do
    rm -rf "$dir/r" && cp -a "$dir/r0" "$dir/r"
    L3D_FILE_TEST_KILL=$k quiet "${CMD[@]}"
    rc=$?
    "$bin" convert "$dir/r" "$dir/rb.bin" --overwrite > /dev/null 2>&1 || { bad_runs+=" $k:unreadable"; continue; }
    if cmp -s "$dir/rb.bin" "$ref"; then seen+="new "
    elif cmp -s "$dir/rb.bin" "$dir/r0/model.bin"; then seen+="old "
    else bad_runs+=" $k:mixed"; fi
    [ $rc -eq 137 ] || bad_runs+=" $k:exit-$rc"
    [ -s "$dir/r/metrics.jsonl" ] && [ -s "$dir/r/checkpoints/latest" ] || bad_runs+=" $k:lost-files"
done
check "train killed at its last steps (1 in $step of 80): its folder the old model or the new, its run's files kept${bad_runs}" \
    test -z "$bad_runs"
check "  ... both seen:$seen" sh -c "echo '$seen' | grep -q ' old ' && echo '$seen' | grep -q ' new '"
train r 0 2 --steps 4 --resume auto
check "  ... and no temporary left after the next run" test "$(temps)" -eq 0

# ---- output paths that are not regular files ------------------------------------------------
mkfifo "$dir/fifo"
echo keep > "$dir/target"
ln -s "$dir/target" "$dir/link"
ln -s "$dir/target" "$dir/link.bin"
expect_error "plot --out a FIFO" "will not write the picture to $dir/fifo: it is a FIFO" \
    "$bin" plot "$dir/gpt" --out "$dir/fifo"
expect_error "plot --out a link" "it is a symbolic link" "$bin" plot "$dir/gpt" --out "$dir/link"
expect_error "plan --svg a link" "will not write the picture to $dir/link" \
    "$bin" plan --model d12 --profile dgx-a100 --devices 8 --svg "$dir/link"
expect_error "plot --out /dev/null" "it is a character device" \
    "$bin" plot "$dir/gpt" --out /dev/null
expect_error "train --trace a FIFO, before training" "will not write the --trace file to" \
    "$bin" train "${TRAIN_FLAGS[@]}" --steps 1 --batch 2 --out "$dir/t" --trace "$dir/fifo"
expect_error "convert --overwrite to a link" "it is a symbolic link" \
    "$bin" convert "$old" "$dir/link.bin" --overwrite
check "  ... the FIFO, the link, its target and /dev/null as they were" \
    sh -c "[ -p '$dir/fifo' ] && [ -L '$dir/link' ] && [ \"\$(cat '$dir/target')\" = keep ] && [ -c /dev/null ]"
exit $fail
