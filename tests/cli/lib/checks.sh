# Shared by the CLI test scripts (sourced): each check prints "ok: ..." or "FAIL: ..." and a
# failure sets fail=1, the script's exit status. A script starts with
#     source "$(dirname "$0")/lib/checks.sh"
#     start_test "$@"
# and ends with `exit $fail`.
fail=0
# start_test LLM3D SCRATCH_DIR: the arguments ctest gives every script (CMakeLists.txt). Sets bin
# (the llm3d binary), dir (the scratch directory, emptied) and mpiexec (the launcher of the MPI the
# binary was built with: ctest sets L3D_MPIEXEC), and makes an unset variable an error (set -u).
# The scratch directory is removed when the script exits 0 (scratch_done) and kept when it fails,
# for a look at what it wrote, or always with L3D_KEEP_SCRATCH=1: the scripts write 1.5 GB in all,
# and a CI machine once ran out of disk with them kept (`make test` builds five trees).
start_test() {
    set -u
    bin=${1:?usage: $0 LLM3D SCRATCH_DIR}
    dir=${2:?usage: $0 LLM3D SCRATCH_DIR}
    mpiexec=${L3D_MPIEXEC:-mpiexec}
    rm -rf "$dir" && mkdir -p "$dir" || exit 1
    trap scratch_done EXIT
}
# scratch_done [STATUS]: the EXIT trap (a script with a trap of its own calls it from there with
# the status the trap began with): the scratch directory removed where the script's status is 0
# and L3D_KEEP_SCRATCH is not 1
scratch_done() {
    local rc=${1:-$?}
    if [ "$rc" = 0 ] && [ "${L3D_KEEP_SCRATCH:-0}" != 1 ]; then rm -rf "$dir"; fi
    return "$rc"
}
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    local what=$1; shift
    if "$@"; then ok "$what"; else bad "$what"; fi
}
# Stages that run the suite again to look for other defects need each code path once, not every
# layout at every size. The runs marked `full &&` are left out under the sanitizers (L3D_SANITIZED,
# set by CMake, ~5x slower: `make test-asan`) and on the checking backend (L3D_BACKEND=check:
# `make test-check`): each takes a code path that a run kept in those stages takes too (the
# comment at each says which). The runs marked `cpu_backend &&` are left out on the checking
# backend only: nothing in them reaches device memory on a path that the kept runs do not take
# (errors found before any allocation, the watchdog's clock), while the sanitizers still look at
# them (error paths are where leaks hide): `make test` runs the sanitized build on the checking
# backend, so those scripts run such checks when sanitized too (`cpu_backend || sanitized`), or
# run again there on the CPU backend (cli_faults; the Makefile's test-asan).
full() { [ -z "${L3D_SANITIZED:-}" ] && cpu_backend; }
cpu_backend() { [ "${L3D_BACKEND:-cpu}" != check ]; }
sanitized() { [ -n "${L3D_SANITIZED:-}" ]; }
# byte_corpus NAME [ROWS]: ROWS (400) numbered lines of "the NAME corpus" in $dir/corpus.txt,
# prepared as byte tokens into $dir/data (a tenth for validation; the script ends if that fails);
# sets TINY, the flags of the tiny model (2 layers, 64 channels) on them: context and sequence
# 32, no validation, quiet, and --peak-gflops 100 (MFU against a given peak: no 0.3 s measurement
# of the FMA peak in every run; train.sh and the MFU check of faults.sh measure it)
byte_corpus() {
    local i
    for i in $(seq 1 "${2:-400}"); do
        echo "row $i of the $1 corpus: $((i * 37 % 101)) bottles"
    done > "$dir/corpus.txt"
    "$bin" prepare --tokenizer bytes --out "$dir/data" --val-fraction 0.1 "$dir/corpus.txt" \
        > /dev/null || exit 1
    TINY=(--model tiny --vocab 256 --context 32 --seq-len 32 --val-every 0 --quiet
          --peak-gflops 100 --train "$dir/data/train_*.bin")
}
# train_cmd OUT NP B [flags]: sets CMD to `llm3d train` with the script's TRAIN_FLAGS (an array it
# sets once: the model, the data and what its runs share), then --batch B --out $dir/OUT and the
# flags (of a flag given twice the later counts), with TRAIN_THREADS OpenMP threads (1). NP: 0
# runs one process without a launcher, a number NP ranks under $mpiexec, anything else is a
# launcher command in words (cluster.sh: "launch 4 2"), which may be a shell function: env, which
# sets the threads, cannot run one, so there it runs on the ranks, after the launcher.
train_cmd() {
    local out=$1 np=$2 b=$3
    shift 3
    local run=("$bin" train "${TRAIN_FLAGS[@]}" --batch "$b" --out "$dir/$out" "$@")
    local env=(env OMP_NUM_THREADS="${TRAIN_THREADS:-1}") launcher
    case $np in
        0) CMD=("${env[@]}" "${run[@]}") ;;
        *[!0-9]*) read -r -a launcher <<< "$np"; CMD=("${launcher[@]}" "${env[@]}" "${run[@]}") ;;
        *) CMD=("${env[@]}" "$mpiexec" -n "$np" "${run[@]}") ;;
    esac
}
# train OUT NP B [flags]: runs train_cmd's command under bounded; its status is the run's. The
# output goes where the caller sends it, or with TRAIN_LOG set (by the script for all its runs, or
# for one call) to $dir/OUT.log; with TRAIN_LOG=check a run that fails is also a failed check:
# "FAIL: OUT did not train:", then its log.
train() {
    train_cmd "$@"
    [ -z "${TRAIN_LOG:-}" ] && { bounded "${CMD[@]}"; return; }
    bounded "${CMD[@]}" > "$dir/$1.log" 2>&1 && return
    local rc=$?
    [ "$TRAIN_LOG" = check ] && { bad "$1 did not train:"; cat "$dir/$1.log"; }
    return $rc
}
# expect_error [--once] DESCRIPTION PATTERN COMMAND...: the command fails and all it writes to
# stderr is one line, matching PATTERN (grep). With --once, for commands under an MPI launcher
# (which adds lines of its own about the exit status): exactly one line matches and exactly one
# line is llm3d's (starts "llm3d"). Returns the check's status.
expect_error() {
    local once=0
    [ "$1" = --once ] && { once=1; shift; }
    local what=$1 pat=$2
    shift 2
    local err rc lines
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    if [ $once = 1 ]; then
        lines=$(echo "$err" | grep -c "^llm3d")
    else
        lines=$(echo "$err" | wc -l)
    fi
    if [ $rc -ne 0 ] && [ "$(echo "$err" | grep -c -- "$pat")" -eq 1 ] && [ "$lines" -eq 1 ]; then
        ok "$what: $(echo "$err" | grep -- "$pat")"
    else
        bad "$what (exit $rc): $err"
        return 1
    fi
}
# same_run NAME REF: run NAME trains the same model as run REF (llm3d compare --rtol 1e-5:
# losses, gradient norms and model.bin; L3D_COMPARE: compare's tolerances instead); the
# comparison's lines in the ok or bad line.
same_run() {
    local tol=(${L3D_COMPARE:---rtol 1e-5})
    if "$bin" compare "${tol[@]}" "$dir/$1" "$dir/$2" > "$dir/$1.cmp" 2>&1; then
        ok "$1 matches $2 ($(tr '\n' ' ' < "$dir/$1.cmp"))"
    else
        bad "$1 against $2"; cat "$dir/$1.cmp"; return 1
    fi
}
# same_layout NAME REF_B NP B ACCUM [flags]: the layout (NP ranks, B sequences a rank) against one
# process with REF_B sequences (REF named ref_bREF_B_aACCUM[_extra]; L3D_REF_FLAGS: flags for both,
# e.g. the precision); L3D_RTOL overrides 1e-5, L3D_COMPARE the whole of compare's tolerances.
# (cp.sh, xent.sh)
same_layout() {
    local name=$1 refb=$2 np=$3 b=$4 accum=$5
    shift 5
    local both=(${L3D_REF_FLAGS:-})
    local ref="ref_b${refb}_a${accum}$(echo "${L3D_REF_FLAGS:-}" | tr -d ' -')"
    if [ ! -f "$dir/$ref/model.bin" ]; then
        train "$ref" 0 "$refb" --grad-accum "$accum" "${both[@]}" > "$dir/$ref.log" 2>&1 ||
            { bad "reference $ref"; cat "$dir/$ref.log"; return; }
    fi
    train "$name" "$np" "$b" --grad-accum "$accum" "${both[@]}" "$@" > "$dir/$name.log" 2>&1 ||
        { bad "$name did not run:"; cat "$dir/$name.log"; return; }
    # losses and norms 1e-5; the final weights 3e-5 unless L3D_RTOL says otherwise: the sanitized
    # build (other vectorisation) measured bias tensors at 1.06-1.17e-5 of their size for cp2 with
    # accumulation, cp4 and cp2 x tp2 SP (losses and norms 1e-8 there), as equiv.sh's TP cases
    local tol=(${L3D_COMPARE:---loss-rtol ${L3D_RTOL:-1e-5} --norm-rtol ${L3D_RTOL:-1e-5} --weights-rtol ${L3D_RTOL:-3e-5}})
    if "$bin" compare "${tol[@]}" "$dir/$name" "$dir/$ref" > "$dir/$name.cmp" 2>&1
    then ok "$name ($(tr '\n' ' ' < "$dir/$name.cmp"))"
    else bad "$name"; cat "$dir/$name.cmp"
    fi
}
# cmp_same NAME RUN REF [compare flags]: llm3d compare says runs RUN and REF are the SAME
cmp_same() {
    local name=$1 run=$2 ref=$3
    shift 3
    if "$bin" compare "$@" "$dir/$run" "$dir/$ref" > "$dir/$name.cmp" 2>&1
    then ok "$name ($(tr '\n' ' ' < "$dir/$name.cmp"))"
    else bad "$name"; cat "$dir/$name.cmp"; fi
}
# kv_cache_agrees MODEL: greedy generation from MODEL (byte tokens) through the KV cache's
# incremental path gives the text the whole forward gives (--no-kv-cache), 16 bytes or more.
kv_cache_agrees() {
    local a b g=("$bin" generate --checkpoint "$1" --tokenizer bytes --prompt "row 1"
                 --max-tokens 16 --temperature 0)
    if a=$("${g[@]}" 2> "$dir/gen.log") && b=$("${g[@]}" --no-kv-cache 2>> "$dir/gen.log") &&
       [ "$a" = "$b" ] && [ ${#a} -ge 16 ]; then
        ok "generate with the KV cache = without it: $(echo "$a" | head -c 40 | tr '\n' ' ')"
    else
        bad "generate with and without the KV cache: '$a' vs '$b'"; cat "$dir/gen.log"
    fi
}
# is_number X: X is a finite decimal number. less_than A B: A < B, both finite. awk alone passes
# what is not a number: mawk compares a loss printed as "-nan" with another as strings, and
# "-nan" < "5.4" holds; "-inf" is less than anything.
is_number() { [[ $1 =~ ^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]]; }
less_than() {
    is_number "$1" && is_number "$2" && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'
}
# bounded COMMAND...: runs the command with a time limit (L3D_TEST_RUN_LIMIT seconds, 300 by
# default: the slowest run of these scripts takes ~10 s here). A run that outlives it has hung:
# the stacks of every process it started (gdb, where installed; else each thread's kernel wait
# channel) and one "HUNG" line go to stderr, the processes are ended and the status is 124, so
# that a hang fails its check with a diagnosis instead of stalling the whole test until ctest's
# own limit kills it silently.
descendants() { # PID: the processes below PID, from /proc (ps may not be installed). Each
    # stat file is read on its own: a process that ends between the glob and the read is skipped
    # (awk over the whole glob stops at the first file that has vanished)
    local parent=$1 f line k kids=()
    for f in /proc/[0-9]*/stat; do
        read -r line 2> /dev/null < "$f" || continue
        line=${line##*) } # after "PID (COMM) ": state, ppid, ...
        line=${line#* }
        [ "${line%% *}" = "$parent" ] && kids+=("$(basename "$(dirname "$f")")")
    done
    for k in "${kids[@]}"; do echo "$k"; descendants "$k"; done
}
hang_report() { # PID LIMIT COMMAND...
    local pid=$1 limit=$2; shift 2
    local procs p
    procs="$pid $(descendants "$pid")"
    echo "HUNG: still running after $limit s: $*" >&2
    for p in $procs; do
        [ -r "/proc/$p/cmdline" ] || continue
        echo "--- process $p: $(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-200)" >&2
        if command -v gdb > /dev/null; then
            timeout 60 gdb -batch -nx -p "$p" -ex "thread apply all bt" 2>&1 |
                grep -E '^(Thread|#)' >&2
        else
            for t in /proc/"$p"/task/*; do echo "thread ${t##*/}: $(cat "$t/wchan" 2>/dev/null)" >&2; done
        fi
    done
    kill -TERM $procs 2>/dev/null
    sleep 2
    kill -KILL $procs 2>/dev/null
}
bounded() {
    local limit=${L3D_TEST_RUN_LIMIT:-300} pid watcher rc
    "$@" &
    pid=$!
    ( for ((i = 0; i < limit * 10; i++)); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done
      hang_report "$pid" "$limit" "$@"; exit 1 ) &
    watcher=$!
    wait "$pid"
    rc=$?
    wait "$watcher" || return 124
    return $rc
}
