#!/usr/bin/env bash
# Weak and strong scaling of data parallelism from 1 to 2 ranks on this machine (one OpenMP thread
# per rank, so ranks x threads = cores), and all-reduce bus bandwidth of llm3d's buckets against a
# plain MPI loop of the same sizes.
#   weak:   per-rank batch fixed (B=4 per rank): efficiency = tokens/s(2) / (2 x tokens/s(1))
#   strong: global batch fixed (B=8): efficiency = time(1) / (2 x time(2))
# Usage: bench/scaling.sh [BUILD_DIR] [MODEL] [STEPS]      (defaults: build d6 12)
set -eu
build=${1:-build}
model=${2:-d6}
steps=${3:-12}
bin=$build/llm3d
mpiexec=$(grep -E '^MPIEXEC_EXECUTABLE' "$build/CMakeCache.txt" | cut -d= -f2)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# data: the fortunes corpus as byte tokens (the step time does not depend on the data)
"$bin" prepare --tokenizer bytes --out "$dir/d" /usr/share/games/fortunes/fortunes \
    /usr/share/games/fortunes/literature /usr/share/games/fortunes/science > /dev/null
data="$dir/d/train_*.bin"
med() { # FIELD FILE: median of a numeric metrics field over the steps after the first two
    grep -o "\"$1\":[0-9.e+-]*" "$2" | tail -n +3 | cut -d: -f2 | sort -g |
        awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}
run() { # NP B ZERO -> prints median ms, comm ms, optimizer ms
    local np=$1 b=$2 zero=$3 out="$dir/run_$1_$2_$3"
    "$mpiexec" -n "$np" "$bin" train --model "$model" --vocab 256 --context 256 --seq-len 256 \
        --batch "$b" --steps "$steps" --warmup 2 --val-every 0 --zero "$zero" --quiet \
        --peak-gflops 208 --train "$data" --out "$out" > /dev/null
    echo "$(med ms "$out/metrics.jsonl") $(med comm_wait_ms "$out/metrics.jsonl") $(med optimizer_ms "$out/metrics.jsonl")"
}
echo "model $model, T=256, $steps steps, 1 thread per rank, launcher $mpiexec"
for zero in 0 1; do
    read -r t1 c1 o1 <<< "$(run 1 4 $zero)"
    read -r t2w c2w o2w <<< "$(run 2 4 $zero)"
    read -r t1s c1s o1s <<< "$(run 1 8 $zero)"
    read -r t2s c2s o2s <<< "$(run 2 4 $zero)"
    awk -v z=$zero -v t1=$t1 -v t2=$t2w -v c2=$c2w -v o2=$o2w -v t1s=$t1s -v t2s=$t2s -v c2s=$c2s 'BEGIN {
        printf "ZeRO-%d weak   (B=4 per rank): 1 rank %.1f ms, 2 ranks %.1f ms (exposed comm %.1f, optimizer %.1f): efficiency %.1f%%\n", z, t1, t2, c2, o2, 100*t1/t2;
        printf "ZeRO-%d strong (B=8 global):   1 rank %.1f ms, 2 ranks %.1f ms (exposed comm %.1f): efficiency %.1f%%\n", z, t1s, t2s, c2s, 100*t1s/(2*t2s) }'
done
