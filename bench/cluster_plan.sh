#!/usr/bin/env bash
# The planner against the trainer across two hosts of the namespace cluster (issue 17 item 5:
# within 15%). For each link setting (tc on both hosts' eth0, as bench/cluster_net.sh):
#   1. `llm3d bench --calibrate` on the two hosts, one rank each, writes a two-level profile
#      (devices_per_node 1; inter_* the all-reduce between the hosts over the shaped link);
#   2. four layouts of d6 (byte tokens, T=256), one rank a host, are trained (median step after
#      the first two, the fastest of REPS runs) with --comm blocking and with the default
#      (overlap; across hosts the progress thread) and planned with that profile (`llm3d plan
#      --profile`, its dp_overlap):
#      dp2 ZeRO-0, ZeRO-1 and ZeRO-2 (B=4 a replica) and pp2 (1F1B, 4 micro-batches of 2).
# The hosts share this machine's cores, one each. Needs root and iproute2's ip and tc; says so
# in one line otherwise.
# Usage: bench/cluster_plan.sh [BUILD_DIR] [STEPS] [REPS]     (defaults: build 8 2)
#   CPLAN_LINKS: link settings, ';'-separated, each "none" or "RATE[/DELAY]"
#   (default "none;1gbit": this kernel has no netem for delays); CPLAN_QUICK=1: --quick calibration
set -u
build=${1:-build}
steps=${2:-8}
reps=${3:-2}
. "$(dirname "${BASH_SOURCE[0]}")/cluster_lib.sh"
bin=$(realpath "$build/llm3d")
links=${CPLAN_LINKS:-none;1gbit}
quick=()
[ "${CPLAN_QUICK:-0}" = 1 ] && quick=(--quick)
dir=$(mktemp -d)
cluster_start l3dp$$ cluster_plan
export OMP_NUM_THREADS=1
fortunes "$dir/d" || exit 1
"$cluster" hostfile 2 1 > "$dir/hosts"
model=(--model d6 --vocab 256 --seq-len 256)

# measure COMM TRAIN_FLAGS...: the fastest of $reps runs' median step, ms ("-" when one failed)
measure() {
    local comm=$1 r t best= out="$dir/run"
    shift
    for r in $(seq 1 "$reps"); do
        rm -rf "$out"
        "$cluster" mpirun "$name" --hostfile "$dir/hosts" -n 2 -x OMP_NUM_THREADS=1 "$bin" train \
            "${model[@]}" --context 256 --steps "$steps" --warmup 2 --val-every 0 --quiet \
            --comm "$comm" --peak-gflops 208 --train "$dir/d/train_*.bin" --out "$out" "$@" \
            > "$dir/log" 2>&1 || { echo "failed: $(tail -n 3 "$dir/log")" >&2; echo -; return; }
        t=$(med ms "$out/metrics.jsonl")
        best=$(awk -v a="$best" -v b="$t" 'BEGIN { print (a == "" || b < a) ? b : a }')
    done
    echo "$best"
}

# layout NAME "PLAN_FLAGS" TRAIN_FLAGS...: one row
layout() {
    local lname=$1 pf=($2) json ps b o
    shift 2
    json=$("$bin" plan "${model[@]}" --profile "$prof" --devices 2 --threads 1 --recompute none \
        "${pf[@]}" --json 2>&1 | head -n 1)
    ps=$(echo "$json" | sed -n 's/.*"step_s":\([^,]*\),.*/\1/p')
    [ -n "$ps" ] || { echo "| $lname | plan failed: $json |"; return; }
    b=$(measure blocking "$@")
    o=$(measure overlap "$@")
    awk -v n="$lname" -v l="$s" -v ps="$ps" -v b="$b" -v o="$o" 'BEGIN {
        printf "| %s | %s | %.0f ms | %s ms | %s | %s ms | %s |\n", n, l, ps * 1e3, b,
            (b == "-" ? "-" : sprintf("%+.1f%%", 100 * (ps * 1e3 - b) / b)), o,
            (o == "-" ? "-" : sprintf("%+.1f%%", 100 * (ps * 1e3 - o) / o)) }'
}

echo "d6 (V=256, T=256), 2 hosts (namespaces) of one rank sharing $(getconf _NPROCESSORS_ONLN)" \
     "cores, $steps steps, median after the first two, fastest of $reps runs; load average" \
     "$(cut -d' ' -f1-3 /proc/loadavg)"
IFS=';' read -r -a settings <<< "$links"
for s in "${settings[@]}"; do
    shape "$s"
    [ "$netem" = no ] && [[ $s == */* ]] && s="$s (delay not applied)"
    prof="$dir/two.prof"
    "$cluster" mpirun "$name" --hostfile "$dir/hosts" -n 2 -x OMP_NUM_THREADS=1 "$bin" bench \
        --calibrate "${quick[@]}" --out "$prof" > "$dir/cal.log" 2>&1 ||
        { echo "link $s: calibration failed: $(tail -n 3 "$dir/cal.log")"; continue; }
    echo
    echo "link $s: $(grep -E '^[0-9]+ nodes x' "$dir/cal.log")"
    grep -E '^(peak_tflops_fp32|inter_bw_gbs|inter_lat_us|dp_overlap) ' "$prof" | tr '\n' ' '
    echo
    echo
    echo "| layout | link | predicted step | measured, blocking | error | measured, overlap | error |"
    echo "|---|---|---|---|---|---|---|"
    for z in 0 1 2; do
        layout "dp2 ZeRO-$z" "--global-batch 8 --batch 4 --tp 1 --pp 1 --zero $z" \
            --batch 4 --zero "$z"
    done
    layout "pp2 1F1B, m=4" "--global-batch 8 --batch 2 --tp 1 --pp 2 --zero 0 --pp-virtual 1" \
        --batch 2 --grad-accum 4 --pp 2
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
