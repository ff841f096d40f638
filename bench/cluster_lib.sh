# Shared by the benchmarks on the namespace cluster (bench/cluster_net.sh, bench/cluster_plan.sh;
# sourced): cluster_start NAME TAG brings up 2 hosts (scripts/cluster.sh) and removes them and
# $dir on exit, or says in one line why it cannot run here and exits 0; shape SETTING puts one
# link setting on both hosts' eth0; med FIELD FILE is the median of a metrics field over the
# steps after the first two (bench/lib.sh, with fortunes). Sets cluster (the script) and netem
# (yes when tc netem exists).
cluster=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../scripts/cluster.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cluster_start() { # cluster_start NAME TAG
    local why
    name=$1
    if [ "$(id -u)" -ne 0 ] || ! command -v tc > /dev/null || ! command -v ip > /dev/null; then
        echo "$2: cannot run here: needs root and iproute2's ip and tc (scripts/setup.sh)"
        exit 0
    fi
    trap '"$cluster" down "$name"; rm -rf "$dir"' EXIT
    if ! why=$("$cluster" up "$name" 2 2>&1); then
        echo "$2: cannot run here: no network namespaces ($(echo "$why" | head -n 1))"
        exit 0
    fi
    netem=yes
    if ! ip netns exec "$name-h0" tc qdisc add dev eth0 root netem delay 50us 2> /dev/null; then
        netem=no
        echo "$2: tc netem is not available in this kernel ($(uname -r)): rates are applied" \
             "with tbf, the delays are not"
    fi
    ip netns exec "$name-h0" tc qdisc del dev eth0 root 2> /dev/null
    return 0
}

# shape SETTING: "none" or "RATE[/DELAY]" (tc tbf, and netem's delay where the kernel has it),
# the same qdisc on both hosts' eth0 (each shapes what it sends)
shape() {
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

