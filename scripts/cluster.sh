#!/usr/bin/env bash
# A small cluster on one machine: N "hosts" that are Linux network namespaces joined by veth pairs
# to a bridge that lives in a namespace of its own, so every address and every byte of traffic
# exists only inside the namespaces (the root namespace gains no interface, route or address).
# Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2 (scripts/setup.sh installs it).
#
#   scripts/cluster.sh up NAME [N]     creates hosts NAME-h0 .. NAME-h<N-1> (N = 2 by default, up
#                                      to 4) with addresses 10.77.0.1 .. 10.77.0.N on their eth0,
#                                      and the switch NAME-sw (bridge br0, one port per host)
#   scripts/cluster.sh down NAME       removes everything that `up NAME` created (idempotent)
#   scripts/cluster.sh hostfile N [S]  prints an Open MPI hostfile: N hosts, S slots each
#   scripts/cluster.sh agent ADDR CMD  the launch agent (Open MPI's plm_rsh_agent, MPICH's
#                                      -launcher-exec): runs CMD through sh in the namespace of
#                                      the host with address ADDR, in place of ssh; the cluster's
#                                      NAME comes from L3D_CLUSTER
#   scripts/cluster.sh mpirun NAME ARGS...
#                                      Open MPI's mpirun, started in NAME-h0, with the agent, the
#                                      TCP transport between hosts (shared memory within one) and
#                                      its traffic kept on the cluster's network; the hosts
#                                      share this machine's cores, so waiting ranks yield
#                                      (mpi_yield_when_idle) and no rank is bound to a core
#                                      (--bind-to none: each host's daemon would bind its first
#                                      rank to core 0, the same core on every host); the btl
#                                      list is L3D_CLUSTER_BTL, tcp,vader,self by default
#   scripts/cluster.sh hydra NAME ARGS...
#                                      MPICH's mpiexec (hydra), started in NAME-h0 with the agent
#                                      (scripts/cluster-agent) and eth0 for its own connections;
#                                      give the hosts as -hosts 10.77.0.1:2,10.77.0.2:2. Debian's
#                                      MPICH is ch4:ucx, and UCX takes the namespaces (one boot
#                                      id) for one machine and would join them by shared memory:
#                                      UCX_TLS=tcp,self (L3D_CLUSTER_UCX_TLS) keeps it on TCP,
#                                      within a host too
#
# Choose a NAME of your own for each cluster (the tests use l3dc<pid>): two clusters of different
# names never collide, since every address lives inside its own namespaces. Interface names are
# per namespace, so each host's port is eth0 and the switch's are h0, h1, ...
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
net=10.77.0 # the hosts' /24; only inside the namespaces

die() { echo "cluster.sh: $*" >&2; exit 1; }
check_name() {
    [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$ ]] ||
        die "cluster name '$1' is not usable as a namespace name (letters, digits, _ . -; up to 40)"
}

down() {
    local name=$1 ns
    check_name "$name"
    # deleting a namespace deletes the interfaces inside it, and with them their veth peers
    for ns in $(ip netns list | awk '{print $1}'); do
        case "$ns" in "$name"-sw|"$name"-h[0-9]) ip netns delete "$ns" 2>/dev/null || true ;; esac
    done
}

up() {
    local name=$1 n=${2:-2} i
    check_name "$name"
    [[ $n =~ ^[1-4]$ ]] || die "the number of hosts is $n; give 1 to 4"
    command -v ip > /dev/null || die "iproute2's ip is not installed (run scripts/setup.sh)"
    trap 'down "$name"' ERR # a half-built cluster is removed
    ip netns add "$name-sw"
    ip -n "$name-sw" link set lo up
    ip -n "$name-sw" link add br0 type bridge
    ip -n "$name-sw" link set br0 up
    for ((i = 0; i < n; i++)); do
        ip netns add "$name-h$i"
        ip -n "$name-h$i" link set lo up
        # the pair is created inside the host's namespace with its peer in the switch's: neither
        # end ever appears in the root namespace
        ip -n "$name-h$i" link add eth0 type veth peer name "h$i" netns "$name-sw"
        ip -n "$name-sw" link set "h$i" master br0
        ip -n "$name-sw" link set "h$i" up
        ip -n "$name-h$i" addr add "$net.$((i + 1))/24" dev eth0
        ip -n "$name-h$i" link set eth0 up
        # a connection whose packets go unanswered fails after ~3 s instead of Linux's ~15 min
        # (tcp_retries2 15), as a fabric reports a dead link: mpirun then gives up on the daemon
        # behind a link that went down instead of waiting on it (a per-namespace setting)
        ip netns exec "$name-h$i" sysctl -q -w net.ipv4.tcp_retries2=3
    done
    trap - ERR
}

# enter NS CMD...: runs CMD in host namespace NS, under a UTS namespace whose host name is NS, as
# on a real host: Open MPI takes ranks with the same host name for ranks of one node (and would
# join them by shared memory)
enter() {
    local ns=$1
    shift
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

agent() {
    while [[ ${1:-} == -* ]]; do shift; done # ssh's flags that launchers add (hydra: -x)
    local addr=$1 name=${L3D_CLUSTER:-}
    shift
    [ -n "$name" ] || die "agent: L3D_CLUSTER (the cluster's name) is not set"
    [[ $addr =~ ^${net//./\\.}\.([1-4])$ ]] || die "agent: '$addr' is not a host of the cluster ($net.1-4)"
    enter "$name-h$((BASH_REMATCH[1] - 1))" sh -c "$*"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) shift; down "$@" ;;
    hostfile)
        for ((i = 1; i <= $2; i++)); do echo "$net.$i slots=${3:-2}"; done ;;
    agent) shift; agent "$@" ;;
    mpirun)
        name=$2; shift 2
        check_name "$name"
        export L3D_CLUSTER=$name OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        enter "$name-h0" "${L3D_CLUSTER_MPIRUN:-mpirun}" \
            --mca plm_rsh_agent "$here/cluster.sh agent" \
            --mca btl "${L3D_CLUSTER_BTL:-tcp,vader,self}" --mca btl_tcp_if_include "$net.0/24" \
            --mca oob_tcp_if_include "$net.0/24" --mca mpi_yield_when_idle 1 --bind-to none "$@" ;;
    hydra)
        name=$2; shift 2
        check_name "$name"
        export L3D_CLUSTER=$name
        enter "$name-h0" "${L3D_CLUSTER_MPIEXEC:-mpiexec.hydra}" -launcher ssh \
            -launcher-exec "$here/cluster-agent" -iface eth0 \
            -genv UCX_TLS "${L3D_CLUSTER_UCX_TLS:-tcp,self}" -genv UCX_NET_DEVICES eth0 "$@" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
