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
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../scripts/cluster.sh
bin=$build/llm3d
links=${NET_LINKS:-none;10gbit;10gbit/50us;1gbit;1gbit/200us}
modes=${NET_MODES:-blocking overlap:none overlap:poll overlap:thread}
zero=${NET_ZERO:-1}
layouts=${NET_LAYOUTS:-dp2 tp2dp2}
name=l3dn$$
dir=$(mktemp -d)
if [ "$(id -u)" -ne 0 ] || ! command -v tc > /dev/null || ! command -v ip > /dev/null; then
    echo "cluster_net: cannot run here: needs root and iproute2's ip and tc (scripts/setup.sh)"
    exit 0
fi
trap '"$cluster" down "$name"; rm -rf "$dir"' EXIT
if ! why=$("$cluster" up "$name" 2 2>&1); then
    echo "cluster_net: cannot run here: no network namespaces ($(echo "$why" | head -n 1))"
    exit 0
fi
netem=yes
if ! ip netns exec "$name-h0" tc qdisc add dev eth0 root netem delay 50us 2> /dev/null; then
    netem=no
    echo "cluster_net: tc netem is not available in this kernel ($(uname -r)): rates are" \
         "applied with tbf, the delays are not"
fi
ip netns exec "$name-h0" tc qdisc del dev eth0 root 2> /dev/null
export OMP_NUM_THREADS=1
"$bin" prepare --tokenizer bytes --out "$dir/d" /usr/share/games/fortunes/fortunes \
    /usr/share/games/fortunes/literature /usr/share/games/fortunes/science > /dev/null || exit 1
"$cluster" hostfile 2 1 > "$dir/hosts1"
"$cluster" hostfile 2 2 > "$dir/hosts2"

shape() { # shape SETTING: the same qdisc on both hosts' eth0 (each shapes what it sends)
    local s=$1 rate=${1%%/*} delay= h burst
    [[ $s == */* ]] && delay=${s#*/}
    for h in 0 1; do
        ip netns exec "$name-h$h" tc qdisc del dev eth0 root 2> /dev/null
        [ "$s" = none ] && continue
        # a burst of at least rate x 1 ms (the timer tick tbf refills on)
        case "$rate" in 10gbit) burst=2mb ;; *) burst=256kb ;; esac
        if [ -n "$delay" ] && [ "$netem" = yes ]; then
            ip netns exec "$name-h$h" tc qdisc add dev eth0 root handle 1: netem delay "$delay"
            ip netns exec "$name-h$h" tc qdisc add dev eth0 parent 1: handle 2: tbf rate "$rate" \
                burst "$burst" latency 20ms
        else
            ip netns exec "$name-h$h" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" \
                latency 20ms
        fi
    done
}
med() { # FIELD FILE: median over the steps after the first two
    grep -o "\"$1\":[0-9.e+-]*" "$2" | tail -n +3 | cut -d: -f2 | sort -g |
        awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}
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
