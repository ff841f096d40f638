#!/usr/bin/env bash
# Progress of overlapped gradient pieces (--progress none|poll|thread, docs/DESIGN.md "Progress of
# non-blocking operations"): the mechanism changes when MPI moves data, never what is summed.
# - dp2, ZeRO 0, 1 and 2, 2 micro-batches, small buckets (many pieces in flight): each mode's
#   model.bin (and the default's) is bit for bit the one --comm blocking writes, and that one
#   matches one process (llm3d compare --rtol 1e-5); the layout line names the mechanism, polling
#   between kernels by default.
# - a wrong --progress is refused in one line.
# - the watchdog with the progress thread: rank 1 of dp2 stopped with SIGSTOP, the job ends
#   within --timeout + 10 s naming rank 1 (the thread never waits, so every wait stays bounded).
# Usage: progress.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC to the binary's MPI launcher.
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, expect_error, bounded, train, fail
start_test "$@"

byte_corpus progress
# train OUT NP B [flags]: tiny model, B sequences per rank and micro-batch, 8 steps; a run that
# fails is a failed check
TRAIN_FLAGS=("${TINY[@]}" --steps 8 --warmup 3 --lr 1e-3 --eps 1e-6)
TRAIN_LOG=check

train ref 0 4 --grad-accum 2 || bad "the one-process reference ran"
for zero in 0 1 2; do
    common=(--grad-accum 2 --zero "$zero" --bucket-mb 0.01)
    if ! train "z${zero}_blocking" 2 2 "${common[@]}" --comm blocking; then
        bad "ZeRO-$zero, --comm blocking ran"
        continue
    fi
    check "ZeRO-$zero, --comm blocking: the same model as one process" \
        "$bin" compare --rtol 1e-5 "$dir/z${zero}_blocking" "$dir/ref"
    for mode in none poll thread default; do
        # under the sanitizers and on the checking backend: every mode with ZeRO-1, the thread
        # (the mechanism that differs most) with ZeRO-0 and 2; the modes' code is the same for
        # every stage, whose pieces the blocking runs take
        [ "$zero" -eq 1 ] || [ "$mode" = thread ] || full || continue
        name="z${zero}_$mode"
        flags=(--progress "$mode")
        [ "$mode" = default ] && flags=()
        train "$name" 2 2 "${common[@]}" --comm overlap "${flags[@]}" || {
            bad "ZeRO-$zero, --progress $mode ran"; continue; }
        check "ZeRO-$zero, --progress $mode: model.bin bit for bit that of --comm blocking" \
            cmp -s "$dir/$name/model.bin" "$dir/z${zero}_blocking/model.bin"
    done
done
# the layout line says which mechanism ran
check "the layout line names the poll mechanism" \
    grep -q "overlapped gradient pieces (polled between kernels)" "$dir/z1_poll.log"
check "the layout line names the progress thread" \
    grep -q "overlapped gradient pieces (progress thread)" "$dir/z1_thread.log"
check "polling between kernels is the default" \
    grep -q "ZeRO-1, overlapped gradient pieces (polled between kernels)" "$dir/z1_default.log"
check "--comm blocking names no progress mechanism" \
    grep -q "ZeRO-1, blocking gradient pieces in fp32, " "$dir/z1_blocking.log"

expect_error "--progress sometimes is refused" \
    "--progress 'sometimes': choose none, poll or thread" \
    "$bin" train --model tiny --progress sometimes --train "$dir/data/train_*.bin"

# the watchdog beside the progress thread: rank 1 stopped while the job trains
out=$dir/stop
OMP_NUM_THREADS=1 bounded "$mpiexec" -n 2 "$bin" train --model tiny --vocab 256 --context 32 \
    --seq-len 32 --batch 2 --steps 1000000 --warmup 3 --val-every 0 --quiet --peak-gflops 100 \
    --comm overlap --progress thread --bucket-mb 0.01 --timeout 3 \
    --train "$dir/data/train_*.bin" --out "$out" > "$out.log" 2>&1 &
job=$!
pid=
for k in $(seq 1 300); do # rank 1's process, once the run has done a few steps
    if [ "$(cat "$out/metrics.jsonl" 2> /dev/null | wc -l)" -ge 3 ]; then
        for d in /proc/[0-9]*; do
            tr '\0' ' ' 2> /dev/null < "$d/cmdline" | grep -q -- "llm3d.* --out $out " || continue
            tr '\0' '\n' 2> /dev/null < "$d/environ" |
                grep -qx "OMPI_COMM_WORLD_RANK=1\|PMI_RANK=1" && pid=${d#/proc/}
        done
        [ -n "$pid" ] && break
    fi
    sleep 0.1
done
if [ -z "$pid" ]; then
    bad "the progress-thread run to stop started"; kill "$job" 2> /dev/null
else
    kill -STOP "$pid"
    t0=$(date +%s)
    for k in $(seq 1 130); do kill -0 "$job" 2> /dev/null || break; sleep 0.1; done
    t1=$(date +%s)
    if kill -0 "$job" 2> /dev/null; then
        kill -KILL "$pid" "$job" 2> /dev/null
        bad "progress thread: the job ended within --timeout 3 + 10 s of SIGSTOP (still running)"
    else
        wait "$job"
        rc=$?
        kill -KILL "$pid" 2> /dev/null
        echo "  rank 1 stopped: the job ended after $((t1 - t0)) s, exit $rc"
        check "progress thread: SIGSTOP of rank 1 ends the job, rank 1 named" \
            grep -q "^llm3d: .*no progress for .*; rank 1 (tp 0, pp 0, dp 1) did not respond" \
            "$out.log"
        [ "$rc" -ne 0 ] || bad "progress thread: the stopped job's exit status is not 0"
    fi
fi
exit $fail
