#!/usr/bin/env bash
# The planner against the trainer on this machine: for layouts the trainer runs here (1-8 ranks,
# tp, pp, dp, ZeRO, micro-batches, recomputation), `llm3d plan --profile local` predicts the step
# time and the fullest rank's peak memory; the trainer measures them (median step after the first
# two; the accounted peak). Goals (issue "Planner"): time within 10%, memory within 5%. Each
# layout runs in fp32 and in bf16 (`--precision bf16`: 16-bit parameters and activations, fp32
# gradients and master weights; the planner with the profile's bf16 figures, issue 18 item 5:
# time within 10%, memory within 1%).
# Usage: bench/plan_local.sh [BUILD_DIR] [PROFILE] [STEPS] [REPS] [PRECISIONS]
#   (defaults: build profiles/local.prof 6 3 "fp32 bf16"; PRECISIONS picks the cases run;
#   CASES=REGEX in the environment runs only the layouts whose name matches it; ALT_PROFILE=FILE
#   adds the prediction from a second profile for the same measured runs, with its error)
# The profile is measured first when missing (`llm3d bench --calibrate` on 2 ranks).
set -eu
build=${1:-build}
prof=${2:-profiles/local.prof}
steps=${3:-6}
reps=${4:-3}
precs=${5:-fp32 bf16}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_mpi
export OMPI_MCA_rmaps_base_oversubscribe=1
if [ ! -f "$prof" ]; then
    echo "no $prof: measuring this machine first"
    OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" bench --calibrate --out "$prof"
fi
fortunes "$dir/d"
# GPT-2 124M's layers on byte tokens, sequences of 128
model=(--model d12 --vocab 256)
echo "model d12 (V=256, T=128), $steps steps, median after the first two, fastest of $reps runs (slowest in brackets); profile $prof; launcher $mpiexec"
echo
alt_head="" alt_rule=""
[ -n "${ALT_PROFILE:-}" ] && alt_head=" predicted with $ALT_PROFILE | error |" alt_rule="---|---|"
echo "| layout | precision | ranks x threads | micro-batch x m | predicted step | measured step | error | predicted memory | measured memory | error |$alt_head"
echo "|---|---|---|---|---|---|---|---|---|---|$alt_rule"
# case NAME NP THREADS B ACCUM PLAN_FLAGS -- TRAIN_FLAGS: one run in each precision of $precs
case_() {
    local p
    [[ $1 =~ ${CASES:-.} ]] || return 0
    for p in $precs; do run "$p" "$@"; done
}
# run PRECISION NAME NP THREADS B ACCUM PLAN_FLAGS -- TRAIN_FLAGS
run() {
    local prec=$1 name=$2 np=$3 th=$4 b=$5 accum=$6
    shift 6
    local pf=() tf=()
    while [ "$1" != "--" ]; do pf+=("$1"); shift; done
    shift
    tf=("$@")
    local launch=()
    [ "$np" -gt 1 ] && launch=("$mpiexec" -n "$np")
    local ms="" slow="" mem json pms pmem dp r t out="$dir/run"
    for r in $(seq 1 "$reps"); do
        OMP_NUM_THREADS=$th "${launch[@]}" "$bin" train "${model[@]}" --context 128 --seq-len 128 \
            --batch "$b" --grad-accum "$accum" --steps "$steps" --warmup 2 --val-every 0 \
            --train "$dir/d/train_*.bin" --out "$out" --overwrite --precision "$prec" \
            "${tf[@]}" > "$out.log" 2>&1 ||
            { echo "| $name | $prec | the trainer failed: $(tail -1 "$out.log") |"; return; }
        t=$(med ms "$out/metrics.jsonl")
        ms=$(awk -v a="$ms" -v b="$t" 'BEGIN { print (a == "" || b < a) ? b : a }')
        slow=$(awk -v a="$slow" -v b="$t" 'BEGIN { print (a == "" || b > a) ? b : a }')
    done
    mem=$(sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$out.log")
    dp=$(sed -n 's/^layout: .* x dp \([0-9]*\),.*/\1/p' "$out.log" | head -1)
    local trainer=()
    [ "$prec" != fp32 ] && trainer=(--trainer llm3d)
    plan_of() { # PROFILE: the plan's JSON line for this layout
        "$bin" plan "${model[@]}" --channels 768 --heads 12 --layers 12 --seq-len 128 \
            --profile "$1" --precision "$prec" "${trainer[@]}" --devices $((np * th)) --threads "$th" \
            --global-batch $((b * accum * ${dp:-1})) --batch "$b" "${pf[@]}" --json 2>&1 | head -1
    }
    json=$(plan_of "$prof")
    pms=$(echo "$json" | sed -n 's/.*"step_s":\([^,]*\),.*/\1/p')
    pmem=$(echo "$json" | sed -n 's/.*"mem_total":\([^,]*\),.*/\1/p')
    if [ -z "$pms" ]; then echo "| $name | $prec | plan failed: $json |"; return; fi
    local alt=""
    [ -n "${ALT_PROFILE:-}" ] && alt=$(plan_of "$ALT_PROFILE" | sed -n 's/.*"step_s":\([^,]*\),.*/\1/p')
    awk -v n="$name" -v pr="$prec" -v np="$np" -v th="$th" -v b="$b" -v a="$accum" -v ps="$pms" -v ms="$ms" \
        -v pm="$pmem" -v mm="$mem" -v sl="$slow" -v alt="$alt" 'BEGIN {
        printf "| %s | %s | %d x %d | %d x %d | %.0f ms | %.0f ms (%.0f) | %+.1f%% | %.1f MiB | %.1f MiB | %+.2f%% |",
            n, pr, np, th, b, a, ps * 1e3, ms, sl, 100 * (ps * 1e3 - ms) / ms, pm / 1048576, mm / 1048576,
            100 * (pm - mm) / mm
        if (alt != "") printf " %.0f ms | %+.1f%% |", alt * 1e3, 100 * (alt * 1e3 - ms) / ms
        printf "\n" }'
}
case_ "1 process"              1 2 4 1 --tp 1 --pp 1 --zero 0 --recompute none --
case_ "1 process, full recompute" 1 2 2 4 --tp 1 --pp 1 --zero 0 --recompute full -- --recompute full
case_ "dp2, ZeRO-1"            2 1 2 2 --tp 1 --pp 1 --zero 1 --recompute none -- --zero 1
case_ "tp2"                    2 1 4 1 --tp 2 --pp 1 --zero 0 --recompute none --no-sequence-parallel -- --tp 2
case_ "tp2 + SP, selective"    2 1 4 1 --tp 2 --pp 1 --zero 0 --recompute selective --sequence-parallel -- --tp 2 --sequence-parallel --recompute selective
case_ "pp2 1F1B, m=4"          2 1 2 4 --tp 1 --pp 2 --zero 0 --recompute none --pp-virtual 1 -- --pp 2
case_ "pp2 1F1B, m=8, selective" 2 1 1 8 --tp 1 --pp 2 --zero 0 --recompute selective --pp-virtual 1 -- --pp 2 --recompute selective
case_ "tp2 x dp2, ZeRO-1 (4 ranks on 2 cores)" 4 1 2 2 --tp 2 --pp 1 --zero 1 --recompute none --no-sequence-parallel -- --tp 2 --zero 1
case_ "tp2 x pp2 x dp2, ZeRO-1 (8 ranks on 2 cores)" 8 1 2 4 --tp 2 --pp 2 --zero 1 --recompute none --no-sequence-parallel --pp-virtual 1 -- --tp 2 --pp 2 --zero 1
