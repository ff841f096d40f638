#!/usr/bin/env bash
# Pipeline parallelism on this machine: pp = 2 ranks (one OpenMP thread each, so ranks x threads =
# cores) against one process with 2 threads, on the same global batch of m micro-batches, for
# m = 4, 8, 16; and the measured bubble (idle share of each rank's pipeline time, averaged over the
# ranks, median step) against the schedule's ideal of equal stages and free transfers, as the
# trainer's start-up line gives it ((p - 1) / (m + p - 1) for 1F1B; zb-h1's from its timeline with
# F = B = W, (p - 1) / (3m + p - 1)).
# Usage: bench/pipeline.sh [BUILD_DIR] [MODEL] [STEPS] [SCHEDULE]  (defaults: build d12 5 1f1b;
# SCHEDULE gpipe, 1f1b or zb-h1)
set -eu
build=${1:-build}
model=${2:-d12}
steps=${3:-5}
sched=${4:-1f1b}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_mpi
fortunes "$dir/d"
data="$dir/d/train_*.bin"
common=(train --model "$model" --batch 2 --seq-len 64 --steps "$steps" --warmup 2 --val-every 0
        --peak-gflops 208 --train "$data")
echo "model $model, B=2 x T=64 per micro-batch, $steps steps (median after the first), launcher $mpiexec"
for m in 4 8 16; do
    OMP_NUM_THREADS=2 "$bin" "${common[@]}" --grad-accum "$m" --out "$dir/one_$m" > /dev/null
    OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" "${common[@]}" --grad-accum "$m" --pp 2 \
        --pp-schedule "$sched" --out "$dir/pp_$m" > "$dir/pp_$m.log"
    t1=$(med ms "$dir/one_$m/metrics.jsonl" 1)
    t2=$(med ms "$dir/pp_$m/metrics.jsonl" 1)
    b=$(med bubble "$dir/pp_$m/metrics.jsonl" 1)
    layers=$(grep -o 'layers [0-9,]*' "$dir/pp_$m.log" | head -1 | tr -d '\n')
    ideal=$(sed -n 's/^pipeline: .*ideal bubble .* = \([0-9.]*\)%$/\1/p' "$dir/pp_$m.log" | head -1)
    awk -v m="$m" -v t1="$t1" -v t2="$t2" -v b="$b" -v l="$layers" -v s="$sched" -v i="$ideal" 'BEGIN {
        ideal = i / 100;
        printf "m=%2d: 1 process x 2 threads %.0f ms/step, pp=2 (%s, %s) %.0f ms/step: %.2fx; bubble measured %.1f%%, ideal %.1f%% (difference %+.1f points)\n",
            m, t1, s, l, t2, t1 / t2, 100 * b, 100 * ideal, 100 * (b - ideal) }'
done
