#!/usr/bin/env bash
# Context parallelism's strong scaling on this machine: one sequence of T tokens a step (B = 1) on
# one rank against the same sequence split over a ring of CP ranks (--cp, one OpenMP thread per
# rank, so ranks x threads = cores), and how much of the ring's transfer time is hidden behind the
# attention blocks.
#   strong:   efficiency = time(1) / (CP x time(CP)), and against the control: two independent
#             one-rank runs at once (as bench/scaling.sh), what sharing the machine costs with no
#             communication at all: time(control) / (CP x time(CP))
#   hidden:   1 - exposed ring wait (cp_wait_ms of metrics.jsonl, overlapped as the trainer runs)
#             / the whole transfer time (the same run with L3D_CP_SERIAL=1: each transfer waited
#             for before its block computes)
# Usage: bench/cp.sh [BUILD_DIR] [MODEL] [T] [STEPS] [CP]     (defaults: build d6 4096 5 2)
# The step time is the median over the steps after the first two.
set -eu
build=${1:-build}
model=${2:-d6}
T=${3:-4096}
steps=${4:-5}
cp=${5:-2}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_mpi
export OMP_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1
fortunes "$dir/d"
flags=(train --model "$model" --vocab 256 --context "$T" --seq-len "$T" --batch 1 --steps "$steps"
       --warmup 2 --val-every 0 --quiet --peak-gflops 100 --train "$dir/d/train_*.bin" --overwrite)
echo "model $model, T=$T, B=1, $steps steps, 1 thread per rank, cp $cp, launcher $mpiexec"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" "${flags[@]}" --out "$dir/one" > /dev/null
t1=$(med ms "$dir/one/metrics.jsonl")
for ((i = 0; i < cp; i++)); do "$bin" "${flags[@]}" --out "$dir/ctl_$i" > /dev/null & done
wait
ctl=$(for ((i = 0; i < cp; i++)); do med ms "$dir/ctl_$i/metrics.jsonl"; done | median)
"$mpiexec" -n "$cp" "$bin" "${flags[@]}" --cp "$cp" --out "$dir/cp" > /dev/null
tc=$(med ms "$dir/cp/metrics.jsonl") wc=$(med cp_wait_ms "$dir/cp/metrics.jsonl")
L3D_CP_SERIAL=1 "$mpiexec" -n "$cp" "$bin" "${flags[@]}" --cp "$cp" \
    --out "$dir/serial" > /dev/null
ts=$(med ms "$dir/serial/metrics.jsonl") ws=$(med cp_wait_ms "$dir/serial/metrics.jsonl")
mb=$(grep -o '"cp_bytes":[0-9]*' "$dir/cp/metrics.jsonl" | tail -1 | cut -d: -f2)
awk -v t1="$t1" -v ctl="$ctl" -v tc="$tc" -v wc="$wc" -v ts="$ts" -v ws="$ws" -v cp="$cp" \
    -v mb="$mb" 'BEGIN {
    printf "one rank %.0f ms/step; %d independent one-rank runs at once %.0f ms/step (%.1f%%)\n",
        t1, cp, ctl, 100 * t1 / ctl;
    printf "cp %d: %.0f ms/step: strong-scaling efficiency %.1f%% (%.1f%% of the control)\n",
        cp, tc, 100 * t1 / (cp * tc), 100 * ctl / (cp * tc);
    hidden = 0
    if (ws > 0) hidden = 100 * (1 - wc / ws)  # a statement: in the printf list ">" would redirect
    printf "ring: %.1f MiB sent a step by rank 0; exposed wait %.1f ms a step, serial transfers " \
        "%.1f ms a step (that run %.0f ms/step): %.1f%% of the transfer time hidden\n",
        mb / 1048576, wc, ws, ts, hidden }'
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
