#!/usr/bin/env bash
# Weak and strong scaling of data parallelism from 1 to 2 ranks on this machine (one OpenMP thread
# per rank, so ranks x threads = cores), and all-reduce bus bandwidth of llm3d's buckets against a
# plain MPI loop of the same sizes.
#   weak:   per-rank batch fixed (B=4 per rank): efficiency = tokens/s(2) / (2 x tokens/s(1))
#   strong: global batch fixed (B=8): efficiency = time(1) / (2 x time(2))
# Usage: bench/scaling.sh [BUILD_DIR] [MODEL] [STEPS]      (defaults: build d6 12)
# Modes (SCALING_MODES, default "blocking overlap:none overlap:poll overlap:thread"): --comm
# blocking, or --comm overlap with --progress none|poll|thread (a bare "overlap" passes no
# --progress: the binary's default, for builds before the flag). SCALING_ZERO: stages (0 1 2).
set -eu
build=${1:-build}
model=${2:-d6}
steps=${3:-12}
bin=$build/llm3d
mpiexec=$(grep -E '^MPIEXEC_EXECUTABLE:' "$build/CMakeCache.txt" | cut -d= -f2)
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
modes=${SCALING_MODES:-blocking overlap:none overlap:poll overlap:thread}
stages=${SCALING_ZERO:-0 1 2}
run() { # NP B ZERO MODE -> prints median ms, comm ms, optimizer ms
    local np=$1 b=$2 zero=$3 mode=$4 out="$dir/run_$1_$2_$3_${4/:/_}"
    local flags=(--comm "${mode%%:*}")
    [[ $mode == *:* ]] && flags+=(--progress "${mode#*:}")
    "$mpiexec" -n "$np" "$bin" train --model "$model" --vocab 256 --context 256 --seq-len 256 \
        --batch "$b" --steps "$steps" --warmup 2 --val-every 0 --zero "$zero" "${flags[@]}" \
        --quiet --peak-gflops 208 --train "$data" --out "$out" --overwrite > /dev/null
    echo "$(med ms "$out/metrics.jsonl") $(med comm_wait_ms "$out/metrics.jsonl") $(med optimizer_ms "$out/metrics.jsonl")"
}
echo "model $model, T=256, $steps steps, 1 thread per rank, launcher $mpiexec"
# Control: two independent one-rank runs at once show what sharing the machine costs (memory
# bandwidth, clock) with no communication at all.
"$bin" train --model "$model" --vocab 256 --context 256 --seq-len 256 --batch 4 --steps "$steps" \
    --warmup 2 --val-every 0 --quiet --peak-gflops 208 --train "$data" --out "$dir/ctl_a" > /dev/null &
"$bin" train --model "$model" --vocab 256 --context 256 --seq-len 256 --batch 4 --steps "$steps" \
    --warmup 2 --val-every 0 --quiet --peak-gflops 208 --train "$data" --out "$dir/ctl_b" > /dev/null
wait
read -r t1 c1 o1 <<< "$(run 1 4 0 blocking)"
ctl=$(med ms "$dir/ctl_a/metrics.jsonl")
awk -v t1="$t1" -v c="$ctl" 'BEGIN { printf "control: 1 rank alone %.1f ms/step, two independent 1-rank runs at once %.1f ms/step (%.1f%%)\n", t1, c, 100 * t1 / c }'
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
for zero in $stages; do
    # one rank communicates nothing: its time is the same in every mode
    read -r t1 c1 o1 <<< "$(run 1 4 $zero blocking)"
    read -r t1s c1s o1s <<< "$(run 1 8 $zero blocking)"
    for mode in $modes; do
        read -r t2 c2 o2 <<< "$(run 2 4 $zero $mode)"
        awk -v z=$zero -v m=$mode -v t1=$t1 -v t2=$t2 -v c2=$c2 -v o2=$o2 -v t1s=$t1s -v ctl=$ctl 'BEGIN {
            printf "ZeRO-%d %-15s weak (B=4/rank): 1 rank %.1f ms, 2 ranks %.1f ms (comm %.1f, " \
                "optimizer %.1f): %.1f%% (%.1f%% of the control)\n",
                z, m, t1, t2, c2, o2, 100*t1/t2, 100*ctl/t2;
            printf "ZeRO-%d %-15s strong (B=8):    1 rank %.1f ms, 2 ranks %.1f ms: %.1f%%\n",
                z, m, t1s, t2, 100*t1s/(2*t2) }'
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
