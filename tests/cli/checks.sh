#!/usr/bin/env bash
# The library of the CLI tests (lib/checks.sh) can fail: expect_error fails a command that
# succeeds, one whose message is absent or another, one that says more than its one line (with
# --once: a second matching line or a second line of llm3d's; a launcher's own lines pass); check
# fails a command that fails; less_than refuses what is not a finite number; train reports a run
# that fails; train_cmd puts the launcher where it belongs. Runs no llm3d.
# Usage: checks.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

# say STATUS LINE...: writes each LINE to stderr, returns STATUS
say() {
    local rc=$1
    shift
    printf '%s\n' "$@" >&2
    return "$rc"
}
# verdict COMMAND...: runs a check in a subshell with fail=0 and prints what it reported: "pass"
# (an ok line, fail still 0) or "fail" (a FAIL line, fail=1, and a non-zero status for the checks
# that return one: expect_error, train), else "confused: ..." with its output
verdict() {
    local out
    out=$(fail=0; "$@"; echo "status $? fail $fail")
    local tail=${out##*$'\n'}
    if [ "$tail" = "status 0 fail 0" ] && echo "$out" | grep -q "^ok: " && ! echo "$out" | grep -q "^FAIL"; then
        echo pass
    elif [[ $tail == "status "[0-9]*" fail 1" ]] && echo "$out" | grep -q "^FAIL: " &&
         { [ "$1" = check ] || [ "$tail" != "status 0 fail 1" ]; }; then
        echo fail
    else
        echo "confused: $(echo "$out" | tr '\n' '|')"
    fi
}
passes() { local what=$1; shift; check "$what" test "$(verdict "$@")" = pass; }
fails() { local what=$1; shift; check "$what" test "$(verdict "$@")" = fail; }

msg="llm3d: --batch 0 is out of range"
passes "expect_error: a failure with the one message passes" expect_error x "--batch 0" say 1 "$msg"
fails "  ... a command that succeeds fails it" expect_error x "--batch 0" say 0 "$msg"
fails "  ... another message fails it" expect_error x "--batch 0" say 1 "llm3d: --steps 0 is out of range"
fails "  ... no message fails it" expect_error x "--batch 0" say 2
fails "  ... a second line fails it" expect_error x "--batch 0" say 1 "$msg" "mpiexec: rank 1 exited"
fails "  ... the message twice fails it" expect_error x "--batch 0" say 1 "$msg" "$msg"
passes "expect_error --once: the message beside the launcher's lines passes" \
    expect_error --once x "--batch 0" say 1 "$msg" "mpiexec: rank 1 exited with status 1"
fails "  ... a command that succeeds fails it" expect_error --once x "--batch 0" say 0 "$msg"
fails "  ... another message fails it" expect_error --once x "--batch 0" say 1 "llm3d: --steps 0 is out of range"
fails "  ... the message twice (two ranks) fails it" expect_error --once x "--batch 0" say 1 "$msg" "$msg"
fails "  ... a second message of llm3d's fails it" \
    expect_error --once x "--batch 0" say 1 "$msg" "llm3d: and something else"
fails "  ... the pattern in the launcher's line alone fails it" \
    expect_error --once x "--batch 0" say 1 "mpiexec: llm3d --batch 0 exited with status 1"

passes "check: a command that succeeds passes" check x true
fails "  ... one that fails fails it" check x false
check "less_than: 1 < 2" less_than 1 2
incomparable() { ! less_than "$1" 5 && ! less_than 5 "$1"; }
for x in nan -nan inf -inf "" "1 2" 0x10; do
    check "  ... '$x' is no number it takes" incomparable "$x"
done

# train: the status of the run; TRAIN_LOG=check reports a failed run (bin=false: a run that
# fails at once)
TRAIN_FLAGS=(--model tiny)
passes "train, TRAIN_LOG=check: a run that succeeds passes" eval 'bin=true TRAIN_LOG=check; train t 0 4 && ok ran'
fails "  ... one that fails fails it" eval 'bin=false TRAIN_LOG=check; train t 0 4'
check "  ... without TRAIN_LOG its status is the run's" eval '! (bin=false; train t 0 4)'
want="env OMP_NUM_THREADS=1 $bin train --model tiny --batch 4 --out $dir/t --steps 2"
train_cmd t 0 4 --steps 2
check "train_cmd, one process: ${CMD[*]}" test "${CMD[*]}" = "$want"
train_cmd t 2 4 --steps 2
check "  ... 2 ranks: the launcher after env" \
    test "${CMD[*]}" = "env OMP_NUM_THREADS=1 $mpiexec -n 2 $bin train --model tiny --batch 4 --out $dir/t --steps 2"
train_cmd t "launch 4 2" 4 --steps 2
check "  ... a launcher in words (a shell function): env after it" test "${CMD[*]}" = "launch 4 2 $want"
TRAIN_THREADS=2 train_cmd t 0 4
check "  ... TRAIN_THREADS" test "${CMD[1]}" = OMP_NUM_THREADS=2
exit $fail
