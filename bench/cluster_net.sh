#!/usr/bin/env bash
# Data parallelism across two hosts of the namespace cluster (scripts/cluster.sh) with shaped links
# (issue 17 item 5): each host's eth0 gets a token bucket (tc tbf: 10 and 1 Gbit/s) and, where the
# kernel has netem, a delay (50 and 200 us); then
#   - the all-reduce bus bandwidth between the hosts (l3d_bench_allreduce, 1 rank per host);
#   - a d6 step (T=256, B=4 per replica, ZeRO-1 by default), dp2 across the hosts (1 rank per
#     host) and tp2 inside each host x dp2 across (2 per host), in every DP mode: --comm
#     blocking and --comm overlap with --progress none|poll|thread; median step and exposed
#     communication over the steps after the first two.
# Needs root (network namespaces, tc) and iproute2's ip and tc; says so in one line otherwise.
# Usage: bench/cluster_net.sh [BUILD_DIR] [STEPS]      (defaults: build 8)
#   NET_LINKS: link settings, ';'-separated, each "none" or "RATE[/DELAY]" (default
#   "none;10gbit;10gbit/50us;1gbit;1gbit/200us"); NET_MODES, NET_ZERO, NET_LAYOUTS ("dp2 tp2dp2").
set -u
build=${1:-build}
steps=${2:-8}
. "$(dirname "${BASH_SOURCE[0]}")/cluster_lib.sh"
bin=$build/llm3d
links=${NET_LINKS:-none;10gbit;10gbit/50us;1gbit;1gbit/200us}
modes=${NET_MODES:-blocking overlap:none overlap:poll overlap:thread}
zero=${NET_ZERO:-1}
layouts=${NET_LAYOUTS:-dp2 tp2dp2}
dir=$(mktemp -d)
cluster_start l3dn$$ cluster_net
export OMP_NUM_THREADS=1
fortunes "$dir/d" || exit 1
"$cluster" hostfile 2 1 > "$dir/hosts1"
"$cluster" hostfile 2 2 > "$dir/hosts2"

step() { # LAYOUT MODE -> "median ms, comm ms"
    local lay=$1 mode=$2 out="$dir/run" per np flags=(--comm "${2%%:*}")
    [[ $mode == *:* ]] && flags+=(--progress "${mode#*:}")
    case "$lay" in dp2) per=1 np=2 ;; tp2dp2) per=2 np=4 flags+=(--tp 2) ;; esac
    rm -rf "$out"
    "$cluster" mpirun "$name" --hostfile "$dir/hosts$per" -n "$np" -x OMP_NUM_THREADS=1 \
        "$(realpath "$bin")" train --model d6 --vocab 256 --context 256 --seq-len 256 --batch 4 \
        --steps "$steps" --warmup 2 --val-every 0 --zero "$zero" "${flags[@]}" --quiet \
        --peak-gflops 208 --train "$dir/d/train_*.bin" --out "$out" > "$dir/log" 2>&1 ||
        { echo "failed: $(tail -n 3 "$dir/log")" >&2; echo "- -"; return; }
    echo "$(med ms "$out/metrics.jsonl") $(med comm_wait_ms "$out/metrics.jsonl")"
}

echo "d6, T=256, B=4 per replica, ZeRO-$zero, $steps steps, 2 hosts (namespaces) sharing" \
     "$(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
IFS=';' read -r -a settings <<< "$links"
for s in "${settings[@]}"; do
    shape "$s"
    [ "$netem" = no ] && [[ $s == */* ]] && s="$s (delay not applied)"
    echo "== link $s"
    "$cluster" mpirun "$name" --hostfile "$dir/hosts1" -n 2 \
        "$(realpath "$build/l3d_bench_allreduce")" 2>&1 | grep -E "^ *[0-9.]+ (KiB|MiB)|^size" |
        sed 's/^/  /'
    for lay in $layouts; do
        for mode in $modes; do
            read -r ms comm <<< "$(step "$lay" "$mode")"
            printf "  %-7s %-15s step %8s ms, exposed DP communication %8s ms\n" "$lay" "$mode" \
                "$ms" "$comm"
        done
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
