#!/usr/bin/env bash
# The training stall of a checkpoint: written synchronously (every rank waits for its files and
# fsync) against --async-save (every rank stands still only while it copies its state into host
# staging; a thread writes). GPT-2 d12 and d24, 1 process and 4 ranks (ZeRO-1), a save every 8
# steps; prints the median save time of each and the ratio. The stall counts the copies and any
# wait for the save before (a save due while one is written waits for it). Usage: bench/async_save.sh
# [BUILD_DIR] [MODELS] [RANKS] (build, "d12 d24", "1 4"). Memory: d24 on 4 ranks needs ~20 GB.
set -euo pipefail
build=${1:-build}
models=${2:-d12 d24}
ranks=${3:-1 4}
source "$(dirname "$0")/lib.sh"
bench_mpi
fortunes "$dir/data"

run() { # run MODEL NP OUT [flags]: its log in $dir/OUT.log
    local model=$1 np=$2 out=$3
    shift 3
    local cmd=("$bin" train --model "$model" --train "$dir/data/train_*.bin" --batch 4 --seq-len 64
               --steps 24 --save-every 8 --keep 1 --val-every 0 --out "$dir/$out" "$@")
    if [ "$np" -gt 1 ]; then
        OMP_NUM_THREADS=1 "$mpiexec" -n "$np" --oversubscribe "${cmd[@]}" --zero 1 > "$dir/$out.log" 2>&1
    else
        OMP_NUM_THREADS=2 "${cmd[@]}" > "$dir/$out.log" 2>&1
    fi
}
for model in $models; do
    for np in $ranks; do
        run "$model" "$np" "sync_${model}_$np"
        run "$model" "$np" "async_${model}_$np" --async-save
        sync=$(sed -n 's/^checkpoint .*: [0-9.]* MB in \([0-9.]*\) s .*/\1/p' "$dir/sync_${model}_$np.log" | median)
        stall=$(sed -n 's/.*training stood still \([0-9.]*\) s.*/\1/p' "$dir/async_${model}_$np.log" | median)
        bg=$(sed -n 's/.*written in the background in \([0-9.]*\) s.*/\1/p' "$dir/async_${model}_$np.log" | median)
        awk -v m="$model" -v n="$np" -v s="$sync" -v a="$stall" -v b="$bg" 'BEGIN {
            printf "%s, %d rank(s): synchronous save %.3f s; --async-save: training stands still %.3f s (%.1f%% of it), the write %.3f s in the background\n", m, n, s, a, 100 * a / s, b }'
    done
done
