#!/usr/bin/env bash
# Faults: the watchdog (--timeout) and non-finite steps (--max-skipped-steps).
# - A rank stopped with SIGSTOP (of 2 ranks, dp2; of 4, tp2 x dp2 and pp2 x dp2): the job ends
#   within --timeout + 10 s with a non-zero status, the stopped rank named by its coordinates in
#   the waiting ranks' one line each, and the last checkpoint whole (`latest` unchanged or a later
#   save every rank had finished, its files verified by llm3d inspect).
# - A rank stopped for ~2.5 s and continued, under a larger --timeout: the run goes on and the
#   stall is reported (the waiting rank's line, the step line, metrics.jsonl).
# - A NaN gradient on one rank at one step (test hook L3D_TEST_NAN_AT_STEP=STEP:RANK): that step
#   is skipped on every rank (the weights after it equal those before), training goes on; NaNs in
#   N steps in a row stop the run with one message and the last checkpoint kept.
# Usage: faults.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC to the launcher of the MPI the
# binary was built with, and L3D_MPI (openmpi or mpich).
# ok, bad, check, full, bounded, byte_corpus, train_cmd, fail
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"
byte_corpus fault

TRAIN_FLAGS=("${TINY[@]}" --warmup 3) # train_cmd OUT NP B [flags]: sets CMD

# rank_pid OUT RANK: the llm3d process of world rank RANK of the run writing OUT (each test run
# has its own OUT), by its launcher's variable: OMPI_COMM_WORLD_RANK for Open MPI, PMI_RANK for
# MPICH's Hydra. (/proc is read one process at a time: others come and go meanwhile.)
rank_pid() {
    local d k
    for k in $(seq 1 50); do
        for d in /proc/[0-9]*; do
            tr '\0' ' ' 2> /dev/null < "$d/cmdline" | grep -q -- "llm3d.* --out $1 " || continue
            tr '\0' '\n' 2> /dev/null < "$d/environ" |
                grep -qx "OMPI_COMM_WORLD_RANK=$2\|PMI_RANK=$2" && { echo "${d#/proc/}"; return 0; }
        done
        sleep 0.1
    done
    return 1
}
# wait_for N SECONDS COMMAND...: polls the command every 0.1 s until it succeeds (status 0) or the
# time is up (status 1)
wait_for() {
    local i n=$(($1 * 10))
    shift
    for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.1; done
    return 1
}
# end_job OUT JOB: kills what is left of the run writing OUT (launcher and ranks, stopped ones
# too) and reaps JOB, so that no run outlives a failed check
end_job() {
    local d
    for d in /proc/[0-9]*; do
        tr '\0' ' ' 2> /dev/null < "$d/cmdline" | grep -q -- "llm3d.* --out $1 " &&
            kill -KILL "${d#/proc/}" 2> /dev/null
    done
    wait "$2" 2> /dev/null
}
has_latest() { [ -s "$1/checkpoints/latest" ]; }
metrics_lines() { [ "$(cat "$1/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$2" ]; }

# names_rank LOG NAME: the log has at least one watchdog line, and each names NAME (e.g.
# "rank 1 (tp 0, pp 0, dp 1)") as the rank that did not respond
names_rank() {
    local n good
    n=$(grep -c "^llm3d: .*no progress for" "$1")
    good=$(grep -c "^llm3d: .*no progress for .*; $2 did not respond" "$1")
    [ "$n" -ge 1 ] && [ "$n" -eq "$good" ]
}

# reported_wait LOG: the log has at least one watchdog line, and each says it fired on time: "no
# progress for X s (--timeout T)" with T <= X <= T + grace + 0.5 s, the grace being the watchdog's
# T/4 within [1, 30] s (src/comm/watchdog.c: X is the wait when it asked the ranks it waits on
# whether they are alive, and the job ends after the grace). The end of the job alone is allowed
# T + 10 s: a watchdog firing at 2 T would pass that at --timeout 3.
reported_wait() {
    local n
    n=$(grep -c "^llm3d: .*no progress for" "$1")
    [ "$n" -ge 1 ] || return 1
    grep "^llm3d: .*no progress for" "$1" |
        sed -n 's/.* no progress for \([0-9.]*\) s (--timeout \([0-9.e+-]*\)).*/\1 \2/p' |
        awk -v n="$n" '{ g = $2 / 4; g = g < 1 ? 1 : g > 30 ? 30 : g
                         if (!($1 >= $2 && $1 <= $2 + g + 0.5)) {
                             print "  fired after " $1 " s at --timeout " $2 " (grace " g " s)"; bad = 1 }
                         k++ }
                       END { exit bad || k != n }'
}

# stop_rank NAME NP RANK EXPECTED_NAME TIMEOUT [flags]: trains until the first checkpoint, stops
# world rank RANK with SIGSTOP; the job must end by itself within TIMEOUT + 10 s, non-zero, the
# rank named, the watchdog on time (reported_wait), the checkpoint untouched and still loadable.
stop_rank() {
    local name=$1 np=$2 rank=$3 who=$4 to=$5
    shift 5
    local out=$dir/$name
    rm -rf "$out"
    train_cmd "$name" "$np" 2 --steps 1000000 --save-every 5 --timeout "$to" "$@"
    bounded "${CMD[@]}" > "$out.log" 2>&1 &
    local job=$! pid latest t0 t1 rc
    wait_for 120 eval "has_latest '$out' || ! kill -0 $job 2> /dev/null"
    has_latest "$out" || { echo "no checkpoint"; end_job "$out" $job; cat "$out.log"; return 1; }
    pid=$(rank_pid "$out" "$rank") || {
        echo "rank $rank not found"; end_job "$out" $job; return 1; }
    kill -STOP "$pid"
    t0=$(date +%s%N)
    # a save the ranks had agreed on before the stop may still be committed: `latest` is read
    # once that is done (a tiny model's save takes ~30 ms)
    sleep 0.5
    latest=$(cat "$out/checkpoints/latest")
    # the job must end within the timeout + 10 s; a job still running then has failed (the
    # stopped rank is continued, the job ended with its stacks by bounded's limit)
    wait_for $((${to%.*} + 10)) eval "! kill -0 $job 2>/dev/null"
    t1=$(date +%s%N)
    if kill -0 "$job" 2>/dev/null; then
        echo "still running $(((t1 - t0) / 1000000)) ms after SIGSTOP of rank $rank"
        end_job "$out" $job
        cat "$out.log"
        return 1
    fi
    wait "$job"
    rc=$?
    kill -KILL "$pid" 2>/dev/null # in case the launcher left it stopped
    echo "  rank $rank stopped: the job ended after $(((t1 - t0) / 1000000)) ms, exit $rc"
    grep "^llm3d: .*no progress" "$out.log" | sed 's/^/  /'
    # `latest` is the step read after the stop, or a later one whose save every rank had finished
    # before: Open MPI's abort sends the stopped rank SIGCONT, then SIGTERM (a stop request to the
    # trainer) and only later SIGKILL, so a rank 0 stopped inside a save may still commit it
    # (seen once in CI: 25 read, 30 committed). Either way it must be whole (inspect checks every
    # rank file's size, header and checksum) and not older.
    local now
    now=$(cat "$out/checkpoints/latest")
    [ "$rc" -ne 0 ] && names_rank "$out.log" "$who" && reported_wait "$out.log" &&
        [[ ! "$now" < "$latest" ]] &&
        "$bin" inspect "$out/checkpoints/$now" > "$out.inspect" 2>&1 || {
        echo "exit $rc, latest $(cat "$out/checkpoints/latest") (was $latest)"
        cat "$out.log" "$out.inspect" 2>/dev/null
        return 1
    }
}
# The watchdog's checks (the SIGSTOPs, the stall) and the MFU check at the end are host code on
# host figures: not again on the checking backend (cpu_backend), whose NaN runs below take the
# device paths of this script (the gradient norm read back, an update skipped)
cpu_backend && check "SIGSTOP rank 1 of dp2: the job ends within --timeout + 10 s, the watchdog \
fired at --timeout, rank 1 named, checkpoint kept" stop_rank dp2 2 1 "rank 1 (tp 0, pp 0, dp 1)" 3 --dp 2
# the oracle's negative case: the same log does not name another rank
cpu_backend && check "  ... the check tells another rank apart" \
    eval "! names_rank '$dir/dp2.log' 'rank 0 (tp 0, pp 0, dp 0)'"
# the oracle's negative cases: the same line with the wait at twice the timeout, or below it
cpu_backend && check "  ... and a watchdog firing at 2 x --timeout, or before it" eval "
    sed 's/no progress for [0-9.]* s/no progress for 6.0 s/' '$dir/dp2.log' > '$dir/dp2_late.log' &&
    sed 's/no progress for [0-9.]* s/no progress for 2.9 s/' '$dir/dp2.log' > '$dir/dp2_early.log' &&
    reported_wait '$dir/dp2.log' && ! reported_wait '$dir/dp2_late.log' > /dev/null &&
    ! reported_wait '$dir/dp2_early.log' > /dev/null"
if [ "${L3D_MPI:-openmpi}" != mpich ] && cpu_backend; then # the MPICH suite runs 2 ranks
    check "SIGSTOP rank 0 of tp2 x dp2: rank 0 named, checkpoint kept" \
        stop_rank tp2dp2 4 0 "rank 0 (tp 0, pp 0, dp 0)" 3 --tp 2 --dp 2
    check "SIGSTOP rank 2 of pp2 x dp2: rank 2 named, checkpoint kept" \
        stop_rank pp2dp2 4 2 "rank 2 (tp 0, pp 0, dp 1)" 3 --pp 2 --dp 2 --grad-accum 2
fi

# a stall: rank 1 of dp2 stopped for 2.5 s and continued, --timeout 60; then SIGUSR1 ends the
# run at a step boundary (exit 0). Rank 0 reports it, once; rank 1 does not (when it was stopped
# inside a wait, the gap between its polls tells that it was itself away)
stall() {
    local out=$dir/stall job pid
    rm -rf "$out"
    train_cmd stall 2 2 --dp 2 --steps 1000000 --timeout 60
    bounded "${CMD[@]}" > "$out.log" 2>&1 &
    job=$!
    wait_for 120 eval "metrics_lines '$out' 5 || ! kill -0 $job 2> /dev/null"
    metrics_lines "$out" 5 || { echo "no steps"; end_job "$out" $job; cat "$out.log"; return 1; }
    pid=$(rank_pid "$out" 1) || { echo "rank 1 not found"; end_job "$out" $job; return 1; }
    kill -STOP "$pid"
    sleep 2.5
    kill -CONT "$pid"
    wait_for 60 grep -q '"stall_s"' "$out/metrics.jsonl"
    kill -USR1 "$pid"
    wait_for 60 eval "! kill -0 $job 2> /dev/null"
    end_job "$out" $job
    local rc=$?
    grep "stalled" "$out.log" | sed 's/^/  /'
    [ $rc -eq 0 ] &&
        grep -q "^llm3d: rank 0 (tp 0, pp 0, dp 0): stalled [2-9]\.[0-9] s at step" "$out.log" &&
        grep -q '"stall_s":[2-9]\.' "$out/metrics.jsonl" &&
        [ "$(grep -c '"stall_s"' "$out/metrics.jsonl")" -eq 1 ] &&
        ! grep -q "^llm3d: rank 1 .*stalled" "$out.log" || { echo "exit $rc"; cat "$out.log"; return 1; }
}
cpu_backend && check "SIGSTOP of rank 1 for 2.5 s under --timeout 60: the run goes on, the stall \
reported once, by rank 0" stall

# NaN gradients: rank 1 of dp2 at step 4 (after the reduction, so rank 0's own norm is finite)
weights() { "$bin" convert "$dir/$1/checkpoints/$(printf 'step_%08d' "$2")" "$dir/$1.w$2.bin" > /dev/null; }
skip_one() {
    local out=$dir/nan1
    rm -rf "$out"
    train_cmd nan1 2 2 --dp 2 --steps 8 --save-every 1 --keep 20
    L3D_TEST_NAN_AT_STEP=4:1 bounded "${CMD[@]}" > "$out.log" 2>&1 || { cat "$out.log"; return 1; }
    local k
    for k in 2 3 4 5; do weights nan1 $k || return 1; done
    grep -q "^step 4: rank 1's loss or gradient norm is not finite: update skipped on every rank" "$out.log" &&
        [ "$(grep -c "update skipped" "$out.log")" -eq 1 ] &&
        [ "$(grep -c '"skipped":true' "$out/metrics.jsonl")" -eq 1 ] &&
        grep -q '"step":4,.*"skipped":true' "$out/metrics.jsonl" &&
        [ "$(grep -c '"loss":[0-9]' "$out/metrics.jsonl")" -eq 8 ] &&
        cmp -s "$dir/nan1.w3.bin" "$dir/nan1.w4.bin" &&
        ! cmp -s "$dir/nan1.w4.bin" "$dir/nan1.w5.bin" &&
        ! cmp -s "$dir/nan1.w2.bin" "$dir/nan1.w3.bin" &&
        "$bin" inspect "$out/model.bin" > /dev/null 2>&1 || { cat "$out.log"; return 1; }
}
check "NaN gradient on rank 1 of 2 at step 4: skipped on both ranks (weights of step 4 = step 3; \
steps 2->3 and 4->5 update), the run completes" skip_one

# tp2 x dp2, NaN on rank 3 only: the norm's sums reach its TP partner (rank 2), not the other
# replica (ranks 0, 1): the skip is agreed over the world
skip_tp() {
    local out=$dir/nan_tp
    rm -rf "$out"
    train_cmd nan_tp 4 2 --tp 2 --dp 2 --steps 6 --save-every 1 --keep 20
    L3D_TEST_NAN_AT_STEP=3:3 bounded "${CMD[@]}" > "$out.log" 2>&1 || { cat "$out.log"; return 1; }
    weights nan_tp 2 && weights nan_tp 3 && weights nan_tp 4 &&
        grep -q "^step 3: rank [23]'s loss .* skipped on every rank" "$out.log" &&
        cmp -s "$dir/nan_tp.w2.bin" "$dir/nan_tp.w3.bin" && ! cmp -s "$dir/nan_tp.w3.bin" "$dir/nan_tp.w4.bin" ||
        { cat "$out.log"; return 1; }
}
[ "${L3D_MPI:-openmpi}" != mpich ] && full &&
    check "NaN gradient on rank 3 of tp2 x dp2 at step 3: skipped on every rank" skip_tp

# pp2, NaN on the last stage (rank 1) at step 3: skipped on both stages
skip_pp() {
    local out=$dir/nan_pp
    rm -rf "$out"
    train_cmd nan_pp 2 2 --pp 2 --grad-accum 2 --steps 5 --save-every 1 --keep 20
    L3D_TEST_NAN_AT_STEP=3:1 bounded "${CMD[@]}" > "$out.log" 2>&1 || { cat "$out.log"; return 1; }
    weights nan_pp 2 && weights nan_pp 3 && weights nan_pp 4 &&
        [ "$(grep -c "update skipped" "$out.log")" -eq 1 ] &&
        grep -q "^step 3: rank [01]'s loss .* skipped on every rank" "$out.log" &&
        cmp -s "$dir/nan_pp.w2.bin" "$dir/nan_pp.w3.bin" &&
        ! cmp -s "$dir/nan_pp.w3.bin" "$dir/nan_pp.w4.bin" || { cat "$out.log"; return 1; }
}
check "NaN gradient on the last stage of pp2 at step 3: skipped on both stages" skip_pp

# NaN in every step from 3 on, --max-skipped-steps 3: the run stops at step 5 with one message,
# which names the last checkpoint (step 4, not the last good step 2); the checkpoints hold the
# weights of step 2 (step 4's is a skipped step: the same weights), no model.bin
skip_many() {
    local out=$dir/nan3 err rc
    rm -rf "$out"
    train_cmd nan3 2 2 --dp 2 --steps 20 --save-every 2 --max-skipped-steps 3
    L3D_TEST_NAN_AT_STEP=3-100:0 bounded "${CMD[@]}" > "$out.log" 2> "$out.err"
    rc=$?
    weights nan3 2 && weights nan3 4 || return 1
    # mpiexec adds its own lines about the exit status: llm3d's are counted
    [ $rc -ne 0 ] && [ "$(grep -c "llm3d" "$out.err")" -eq 1 ] &&
        grep -q "steps 3 to 5: the loss or gradient norm was not finite 3 times in a row (--max-skipped-steps 3)" "$out.err" &&
        grep -q "training diverged; the last checkpoint saved is step 4 " "$out.err" &&
        [ "$(cat "$out/checkpoints/latest")" = step_00000004 ] &&
        cmp -s "$dir/nan3.w2.bin" "$dir/nan3.w4.bin" && "$bin" inspect "$dir/nan3.w4.bin" > /dev/null &&
        [ ! -e "$out/model.bin" ] || { echo "exit $rc"; cat "$out.log" "$out.err"; return 1; }
}
check "NaN gradients 3 steps in a row (--max-skipped-steps 3): one error, last checkpoint kept" skip_many

# The end-of-run MFU check is decided by every rank together: rank 1 alone finding an MFU above
# 1 (its own median step time; test hook L3D_TEST_MFU_OVER_ONE_RANK) used to enter a broadcast
# that rank 0 never joined, and the job hung (cli_equiv's timeout in CI). No --peak-gflops here:
# a given peak is never measured again.
mfu_one_rank() {
    local out=$dir/mfu_one_rank rc
    bounded env L3D_TEST_MFU_OVER_ONE_RANK=1 OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" train \
        --model tiny --vocab 256 --context 32 --seq-len 32 --batch 2 --steps 3 --warmup 1 \
        --val-every 0 --timeout 20 --train "$dir/data/train_*.bin" --out "$out" > "$out.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q "measured again" "$out.log" ||
        { echo "exit $rc"; cat "$out.log"; return 1; }
}
cpu_backend &&
    check "rank 1 alone over an MFU of 1: every rank measures again and the job ends" mfu_one_rank

exit $fail
