#!/usr/bin/env bash
# Checkpoints written in the background (--async-save; src/ckpt/save.c, l3d_ckpt_save_begin): the
# same rank files as synchronous saves, a resume from them bit-identical to the uninterrupted run,
# a writer killed at any point while training goes on (20 kills) leaves the last published
# checkpoint loadable and the resumed run bit-identical, a save due while one is in flight waits
# for it (and says so), SIGTERM during a background write exits after the write with the stop's
# checkpoint, the staging counted by the memory check, ZeRO-3's saves synchronous (said). Usage:
# async.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus async

TRAIN_FLAGS=("${TINY[@]}" --steps 10 --warmup 3 --lr 1e-3 --eps 1e-6 --save-every 2 --keep 10)
step_dir() { printf '%s/%s/checkpoints/step_%08d' "$dir" "$1" "$2"; }
same_files() { # same_files A B: every rank file of step directory A equals B's
    local f n=0
    for f in "$1"/rank_*.bin; do cmp -s "$f" "$2/$(basename "$f")" || return 1; n=$((n + 1)); done
    [ "$n" -gt 0 ] && [ "$n" -eq "$(ls "$2"/rank_*.bin | wc -l)" ]
}

# synchronous and background saves of the same run: the same files at every step
TRAIN_LOG=check train sync 2 2 --zero 1
TRAIN_LOG=check train bg 2 2 --zero 1 --async-save
same_steps() {
    local s
    for s in 2 4 6 8 10; do same_files "$(step_dir sync $s)" "$(step_dir bg $s)" || return 1; done
    cmp -s "$dir/sync/model.bin" "$dir/bg/model.bin" &&
        grep -q "written in the background (--async-save) from .* MiB of host staging" "$dir/bg.log" &&
        [ -z "$(ls -A "$dir/bg/checkpoints" | grep tmp)" ]
}
check "background saves write the synchronous saves' files (dp2 ZeRO-1, 5 steps)" same_steps
# negative: the comparison tells two different runs apart
negative() { TRAIN_LOG=check train other 2 2 --zero 1 --async-save --seed 7; ! same_steps_of other; }
same_steps_of() { same_files "$(step_dir sync 4)" "$(step_dir "$1" 4)"; }
check "  ... and a run of another seed differs (negative)" negative

# resumed from a background save: bit-identical to the uninterrupted run
resume_bg() {
    rm -rf "${dir:?}/half" && mkdir -p "$dir/half"
    TRAIN_LOG=check train half 2 2 --zero 1 --async-save --steps 10 --save-every 4 \
        --resume "$(step_dir bg 4)" &&
        cmp -s "$dir/sync/model.bin" "$dir/half/model.bin"
}
check "resumed from a background checkpoint (step 4): model.bin bit-identical" resume_bg

# a writer killed while training goes on: the writer thread SIGKILLs the process half-way through
# its rank file (L3D_CKPT_TEST_KILL=STEP:shard), or the process is killed from outside while a
# slowed writer (L3D_CKPT_TEST_SLOW_MS) is in flight; --resume auto then loads the last
# published checkpoint and the run ends bit-identical to the uninterrupted one (sync's)
killed() { # killed NAME STEP [slow-kill]
    local name=$1 step=$2 rc latest
    rm -rf "${dir:?}/$name"
    if [ "${3:-}" = outside ]; then
        train_cmd "$name" 0 4 --async-save
        L3D_CKPT_TEST_SLOW_MS=400 "${CMD[@]}" > "$dir/$name.log" 2>&1 &
        local pid=$! i
        for i in $(seq 1 400); do
            grep -q '"step": *'"$step"',' "$dir/$name/metrics.jsonl" 2>/dev/null && break
            sleep 0.01
        done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid"
    else
        L3D_CKPT_TEST_KILL=$step:shard train "$name" 0 4 --async-save > "$dir/$name.log" 2>&1
    fi
    rc=$?
    latest=$(cat "$dir/$name/checkpoints/latest" 2>/dev/null)
    [ $rc -ne 0 ] || { echo "$name: not killed"; cat "$dir/$name.log"; return 1; }
    train "$name" 0 4 --async-save --resume auto > "$dir/$name.resume.log" 2>&1 &&
        cmp -s "$dir/one/model.bin" "$dir/$name/model.bin" &&
        [ -z "$(ls -A "$dir/$name/checkpoints" | grep tmp)" ] || {
        echo "$name: exit $rc, latest '$latest'"; cat "$dir/$name.log" "$dir/$name.resume.log"
        return 1; }
}
TRAIN_LOG=check train one 0 4
many_kills() {
    local s k=0
    for s in 2 4 6 8 10; do killed "kill_$s" $s || return 1; k=$((k + 1)); done
    # from outside, at a step while a slowed background write runs (15 more)
    for s in 3 3 3 4 5 5 5 6 7 7 7 8 9 9 9; do
        killed "kill_out_$k" $s outside || return 1
        k=$((k + 1))
    done
    echo "$k kills, each resumed bit-identically"
}
if full; then
    check "20 writers killed in the background, each resumed bit-identically" many_kills
else
    check "a writer killed in the background, resumed bit-identically" killed kill_6 6
fi

# a save due while one is in flight waits for it, and says so
wait_line() {
    L3D_CKPT_TEST_SLOW_MS=300 train slow 0 4 --async-save --save-every 1 --steps 3 \
        > "$dir/slow.log" 2>&1 &&
        grep -q "checkpoint of step 2: waiting for the one still being written" "$dir/slow.log" &&
        [ "$(cat "$dir/slow/checkpoints/latest")" = step_00000003 ] &&
        [ "$(ls -d "$dir"/slow/checkpoints/step_* | wc -l)" -eq 3 ]
}
check "a save due while one is written waits for it (and says so)" wait_line

# SIGTERM while a background write is in flight: the write finishes, the stop's checkpoint is
# written, exit 0; resumed, the run goes on
term() {
    rm -rf "${dir:?}/term"
    train_cmd term 0 4 --async-save --save-every 1 --steps 100000
    L3D_CKPT_TEST_SLOW_MS=500 "${CMD[@]}" > "$dir/term.log" 2>&1 &
    local pid=$! i
    for i in $(seq 1 600); do
        grep -q "checkpoint of step\|written in the background" "$dir/term.log" 2>/dev/null && break
        [ "$(cat "$dir/term/metrics.jsonl" 2>/dev/null | grep -c '"step":')" -ge 2 ] && break
        sleep 0.02
    done
    kill -TERM "$pid"
    wait "$pid"
    local rc=$? steps
    steps=$(grep -c '"step":' "$dir/term/metrics.jsonl")
    [ $rc -eq 0 ] && [ "$(cat "$dir/term/checkpoints/latest")" = "$(printf 'step_%08d' "$steps")" ] &&
        [ -z "$(ls -A "$dir/term/checkpoints" | grep tmp)" ] &&
        train term 0 4 --steps $((steps + 1)) --resume auto > "$dir/term.resume.log" 2>&1 &&
        grep -q "step $steps," "$dir/term.resume.log" || {
        echo "exit $rc after $steps steps"; cat "$dir/term.log" "$dir/term.resume.log"; return 1; }
}
check "SIGTERM during a background write: written, stopped with its checkpoint, exit 0, resumed" term

# the staging is in the memory check: the planned bytes cover the peak
peak() { sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$dir/$1.log"; }
planned() { sed -n 's/^memory check: .* MiB (\([0-9]*\) bytes) planned.*/\1/p' "$dir/$1.log"; }
counted() {
    TRAIN_LOG=check train mem_sync 0 4 --steps 2 --layers 4 --channels 128 &&
        TRAIN_LOG=check train mem_bg 0 4 --steps 2 --layers 4 --channels 128 --async-save &&
        less_than "$(peak mem_bg)" "$(planned mem_bg)" &&
        # the staging: 4 + 8 bytes a parameter more than the synchronous run plans
        less_than "$(($(planned mem_sync) + 1000000))" "$(planned mem_bg)" || {
        echo "sync planned $(planned mem_sync) peak $(peak mem_sync); background planned" \
             "$(planned mem_bg) peak $(peak mem_bg)"; return 1; }
}
check "the staging is planned: background peak within the memory check, above the synchronous plan" counted

# ZeRO-3 keeps its saves synchronous, and says so
zero3() {
    TRAIN_LOG=check train z3 2 2 --zero 3 --async-save --steps 4 &&
        grep -q "checkpoints: synchronous (--async-save" "$dir/z3.log" &&
        ! grep -q "host staging" "$dir/z3.log" &&
        [ "$(cat "$dir/z3/checkpoints/latest")" = step_00000004 ]
}
check "ZeRO-3 with --async-save: synchronous saves, said at start-up" zero3

exit $fail
