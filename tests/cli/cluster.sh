#!/usr/bin/env bash
# Several hosts: a cluster of network namespaces on this machine (scripts/cluster.sh), the real
# trainer across it over TCP, 2 hosts x 2 ranks: tp2 inside each host x dp2 across the hosts, and
# pp2 across x tp2 inside, each equivalent to one process (llm3d compare, as tests/cli/equiv.sh);
# the traffic crosses the hosts' links and nothing of the cluster shows in the root namespace; a TP
# group that would span hosts is refused (or run with --allow-cross-node-tp); a checkpoint saved
# on the 2-host layout resumes on one host; a link taken down mid-run ends the job with the
# watchdog's line within its --timeout, the last checkpoint intact.
# Needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN (namespaces, veths); where they are missing the
# script says so in one line and passes: whether they work is found by trying.
# Usage: cluster.sh LLM3D SCRATCH_DIR (L3D_MPI: openmpi or mpich, the MPI the binary was built
# with: the cluster runs need Open MPI; L3D_MPIEXEC: its launcher, for the one-host runs).
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/../../scripts/cluster.sh
source "$here/lib/checks.sh"
start_test "$@"

# Every name this run creates starts with l3dc<pid>-: two runs never collide, and the namespaces
# of a run that was killed before its trap ran (its pid gone) are removed here.
name=l3dc$$
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^l3dc[0-9]+-(sw|h[0-9])$'); do
    pid=${ns#l3dc}
    pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null || ip netns delete "$ns" 2>/dev/null
done
cleanup() { # the processes left in this run's namespaces (a failed launch), then the namespaces
    local rc=$? ns p
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$name-"); do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    done
    "$cluster" down "$name" 2>/dev/null
    scratch_done "$rc" # (checks.sh: the scratch directory, where the status is 0)
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

if ! why=$("$cluster" up "$name" 2 2>&1 && ip netns exec "$name-h0" unshare --uts true 2>&1); then
    echo "skip: no cluster of network namespaces here (needs root with CAP_SYS_ADMIN and" \
         "CAP_NET_ADMIN, and iproute2): $(echo "$why" | grep . | head -n 1)"
    exit 0
fi

# MPICH (Debian's 4.0.2, ch4:ucx) under hydra trains across the hosts and equals one process,
# but in about 1 run of 3 a rank stays in MPI_Finalize (hydra's PMI barrier) after the last step:
# a hang CI cannot afford. Its run of this script is left out, saying so; README "Several
# machines" gives the command line.
if [ "${L3D_MPI:-openmpi}" = mpich ]; then
    echo "skip: the cluster runs use Open MPI's mpirun; with MPICH's hydra a rank hangs in" \
         "MPI_Finalize in about 1 run of 3 across the namespace hosts (README, Several machines)"
    exit 0
fi

# launch NP PER_HOST COMMAND...: NP ranks, PER_HOST on each host in rank order
launch() {
    local np=$1 per=$2
    shift 2
    "$cluster" hostfile 2 "$per" > "$dir/hosts$per"
    "$cluster" mpirun "$name" --hostfile "$dir/hosts$per" -n "$np" -x OMP_NUM_THREADS=1 "$@"
}

byte_corpus cluster

# train OUT NP B [flags] (lib/checks.sh): NP is 0 (one process), a number of ranks on this machine
# (the usual launcher) or "launch NP PER_HOST" (the cluster); the output in $dir/OUT.log. The
# flags of tests/cli/equiv.sh.
TRAIN_FLAGS=("${TINY[@]}" --steps 10 --warmup 3 --lr 1e-3 --eps 1e-6)
TRAIN_LOG=file
# same RUN REF RTOL: llm3d compare says SAME
same() {
    "$bin" compare --rtol "$3" "$dir/$1" "$dir/$2" > "$dir/$1.cmp" 2>&1
}
has() { grep -q -- "$2" "$dir/$1.log"; } # has RUN PATTERN: the run's output holds the line
# compared STATUS RUN OK_TEXT BAD_TEXT: after RUN and its comparison (their status, 0 when both
# went well): ok with the comparison's words, else bad with the run's output and the comparison
compared() {
    if [ "$1" -eq 0 ]; then
        ok "$3 ($(tr '\n' ' ' < "$dir/$2.cmp"))"
    else
        bad "$4"; cat "$dir/$2.log" "$dir/$2.cmp" 2>/dev/null
    fi
}
rx_bytes() { ip -n "$name-h1" -s -j link show eth0 | sed 's/.*"rx":{"bytes":\([0-9]*\).*/\1/'; }

# references: one process, the same global batch
train ref_b4 0 4 --grad-accum 1 || { bad "reference b4"; cat "$dir/ref_b4.log"; }
train ref_pp 0 2 --grad-accum 2 --layers 4 || { bad "reference layers 4"; cat "$dir/ref_pp.log"; }

# tp2 inside each host x dp2 across: the DP gradient all-reduce crosses the link (at least half
# of each of the 10 steps' 2 x 59264 x 4 gradient bytes reaches host 1: > 2 MB received); across
# hosts the progress thread is the default (polling on one host: the resumed run below)
rx0=$(rx_bytes)
train tp2_dp2 "launch 4 2" 2 --grad-accum 1 --tp 2 --save-every 5 && same tp2_dp2 ref_b4 1e-5 &&
   has tp2_dp2 "^nodes: 2 .* rank:node 0:0 1:0 2:1 3:1$" &&
   has tp2_dp2 "^TP groups: 2, 0 of them across nodes: {0,1} on node 0; {2,3} on node 1$" &&
   has tp2_dp2 "^DP groups: 2, 2 of them across nodes: {0,2} on nodes 0,1; {1,3} on nodes 0,1$" &&
   has tp2_dp2 "^layout: .* overlapped gradient pieces (progress thread) in fp32"
compared $? tp2_dp2 "2 hosts: tp2 inside x dp2 across = one process" \
    "2 hosts: tp2 inside x dp2 across"
rx1=$(rx_bytes)
if is_number "$rx0" && is_number "$rx1" && [ $((rx1 - rx0)) -gt 2000000 ] &&
   [ -z "$(ip -4 addr show | grep '10\.77\.0\.')" ] &&
   [ -z "$(ip -4 route show | grep '10\.77\.0\.')" ] &&
   [ -z "$(ip link show | grep -E "$name|br0")" ]; then
    ok "the DP traffic crossed host 1's link ($(((rx1 - rx0) / 1000)) kB received); the root\
 namespace has no address, route or link of the cluster"
else
    bad "traffic over the cluster's links (host 1 received $rx0 -> $rx1 bytes)"
    ip -4 addr show | grep '10\.77\.0\.'; ip link show | grep -E "$name|br0"
fi

# pp2 across the hosts x tp2 inside (stage 0 on host 0, stage 1 on host 1): 3e-5 as equiv.sh's
# pp2_tp2 (TP's other matrix shapes, lifted by AdamW where gradients are near eps)
train pp2_tp2 "launch 4 2" 2 --grad-accum 2 --layers 4 --pp 2 --tp 2 && same pp2_tp2 ref_pp 3e-5 &&
   has pp2_tp2 "^TP groups: 2, 0 of them across nodes: {0,1} on node 0; {2,3} on node 1$" &&
   has pp2_tp2 "^PP groups: 2, 2 of them across nodes: {0,2} on nodes 0,1; {1,3} on nodes 0,1$"
compared $? pp2_tp2 "2 hosts: pp2 across x tp2 inside = one process" \
    "2 hosts: pp2 across x tp2 inside"

# a TP group across the hosts (one rank on each): refused with one message, before any step;
# --allow-cross-node-tp runs it with one warning, and it still trains the same model
if ! train tp2_across "launch 2 1" 4 --grad-accum 1 --tp 2 &&
   [ "$(grep -c -- "--tp 2: the TP group {0,1} on nodes 0,1 spans nodes" \
        "$dir/tp2_across.log")" -eq 1 ] &&
   ! has tp2_across "^step\|^median"; then
    ok "a TP group across hosts is refused:\
 $(grep -o -- '--tp 2: the TP group.*spans nodes' "$dir/tp2_across.log")"
else
    bad "a TP group across hosts is refused"; cat "$dir/tp2_across.log"
fi
train tp2_allowed "launch 2 1" 4 --grad-accum 1 --tp 2 --allow-cross-node-tp && same tp2_allowed ref_b4 1e-5 &&
   [ "$(grep -c "warning: --tp 2: the TP group {0,1} on nodes 0,1 spans nodes" \
        "$dir/tp2_allowed.log")" -eq 1 ]
compared $? tp2_allowed "--allow-cross-node-tp: one warning, the same model" "--allow-cross-node-tp"

# the 2-host layout's step-5 checkpoint, resumed on one host as dp2 ZeRO-1 (the rank files that
# each host wrote into the shared directory, re-sliced), ends where one process does
step5=$dir/tp2_dp2/checkpoints/step_00000005
if [ -f "$step5/manifest" ] || [ -d "$step5" ]; then
    train resumed 2 2 --grad-accum 1 --zero 1 --resume "$step5" && same resumed ref_b4 1e-5 &&
       has resumed "^layout: .* overlapped gradient pieces (polled between kernels) in fp32"
    compared $? resumed "the 2-host checkpoint resumed on one host as dp2" \
        "the 2-host checkpoint resumed on one host"
else
    bad "the 2-host run saved no step-5 checkpoint ($step5)"
fi

# bench --calibrate across the hosts, one rank each (issue 17 item 5): a two-level profile, a
# device a node, the all-reduce between the hosts measured over their link (inter_*) and none
# inside a node (one rank there); plan reads it and times a DP group across the hosts by
# inter_bw (half the bandwidth: about twice the DP time). Unequal ranks on the hosts (2 and 1):
# refused in one line, nothing written. Not under the sanitizers (`full`): its measurements are
# cli_calibrate's, which they run; the node split is the start-up lines' above.
prof=$dir/two.prof
pv() { sed -n "s/^$1 = //p" "$2"; }
dp_s() { # PROFILE: plan's DP seconds of tiny, dp2 across the hosts
    "$bin" plan --model tiny --vocab 256 --seq-len 32 --profile "$1" --devices 2 --threads 1 \
        --global-batch 8 --batch 4 --tp 1 --pp 1 --zero 0 --recompute none --json |
        head -n 1 | sed -n 's/.*"t_dp":\([^,]*\),.*/\1/p'
}
if ! full; then
    echo "(calibrate across the hosts: not under the sanitizers)"
elif bounded launch 2 1 "$bin" bench --calibrate --quick --out "$prof" > "$dir/cal.log" 2>&1 &&
   grep -q "^2 nodes x 1 ranks; .* between nodes (one rank each): [0-9.]* GB/s" "$dir/cal.log" &&
   [ "$(pv devices_per_node "$prof")" = 1 ] && [ "$(pv intra_bw_gbs "$prof")" = 0 ] &&
   awk -v b="$(pv inter_bw_gbs "$prof")" -v l="$(pv inter_lat_us "$prof")" \
       'BEGIN { exit !(b + 0 == b && b > 0 && b < 1000 && l + 0 == l && l > 0) }'; then
    ok "calibrate across 2 hosts: devices_per_node 1, inter_bw_gbs $(pv inter_bw_gbs "$prof"),\
 inter_lat_us $(pv inter_lat_us "$prof")"
    # dp_overlap measured between the hosts with the trainer's default there, the progress thread
    grep -B1 '^dp_overlap = ' "$prof" | head -n 1 | grep -q "between the nodes .* progressed by the progress thread" &&
        awk -v f="$(pv dp_overlap "$prof")" 'BEGIN { exit !(f + 0 == f && f >= 0 && f <= 1) }' &&
        ok "  ... dp_overlap $(pv dp_overlap "$prof"), measured between the hosts with the progress thread" ||
        bad "  ... dp_overlap: $(grep -B1 '^dp_overlap = ' "$prof")"
    # the DP time against the link's bandwidth, nothing hidden (dp_overlap 0 in both)
    sed "s/^dp_overlap = .*/dp_overlap = 0/" "$prof" > "$dir/exposed.prof"
    sed "s/^inter_bw_gbs = .*/inter_bw_gbs = $(awk -v b="$(pv inter_bw_gbs "$prof")" \
        'BEGIN { print b / 2 }')/" "$dir/exposed.prof" > "$dir/half.prof"
    a=$(dp_s "$dir/exposed.prof") h=$(dp_s "$dir/half.prof")
    is_number "$a" && is_number "$h" && awk -v a="$a" -v h="$h" 'BEGIN { exit !(a > 0 && h > 1.5 * a && h <= 2 * a) }' &&
        ok "plan on it: dp2 across the hosts ${a} s of DP, ${h} s at half inter_bw" ||
        bad "plan on the 2-host profile: DP $a s, at half inter_bw $h s"
else
    bad "calibrate across 2 hosts"; cat "$dir/cal.log"; cat "$prof" 2>/dev/null
fi
if ! bounded launch 3 2 "$bin" bench --calibrate --quick --out "$dir/uneven.prof" \
       > "$dir/uneven.log" 2>&1 &&
   [ "$(grep -c "needs as many ranks on each node (node 0 has 2, node 1 has 1)" \
        "$dir/uneven.log")" -eq 1 ] && [ ! -e "$dir/uneven.prof" ]; then
    ok "calibrate with 2 ranks on one host and 1 on the other is refused once"
else
    bad "calibrate on uneven hosts"; cat "$dir/uneven.log"
fi

# a link taken down mid-run: host 1's eth0 goes down after the first checkpoint. The ranks of
# host 0 wait on the DP all-reduce (or the step's agreement) with host 1; the watchdog names a
# rank of host 1 (dp 1) in its line and aborts the job, which ends (mpirun gives up on host 1's
# daemon once its connection fails) with the checkpoint `latest` named before untouched and
# loadable. (Host 1's own lines cannot cross the dead link.)
link_down() {
    local out=$dir/linkdown to=3 job latest t0 t1 rc silent
    OMP_NUM_THREADS=1 bounded launch 4 2 "$bin" train "${TINY[@]}" --batch 2 --warmup 3 --tp 2 \
        --steps 1000000 --save-every 5 --timeout $to --out "$out" > "$out.log" 2>&1 &
    job=$!
    for ((i = 0; i < 1200; i++)); do
        [ -s "$out/checkpoints/latest" ] || ! kill -0 $job 2>/dev/null && break
        sleep 0.1
    done
    [ -s "$out/checkpoints/latest" ] || { echo "no checkpoint"; cat "$out.log"; return 1; }
    ip -n "$name-h1" link set eth0 down
    t0=$(date +%s%N)
    sleep 0.5 # a save agreed on before the link went down may still be committed
    latest=$(cat "$out/checkpoints/latest")
    for ((i = 0; i < (to + 20) * 10; i++)); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
    t1=$(date +%s%N)
    if kill -0 $job 2>/dev/null; then
        echo "still running $(((t1 - t0) / 1000000)) ms after the link went down"
        cleanup # ends the ranks and launchers in the namespaces (the last check: removes them)
        wait $job
        cat "$out.log"
        return 1
    fi
    wait $job
    rc=$?
    echo "  host 1's link down: the job ended after $(((t1 - t0) / 1000000)) ms, exit $rc"
    grep "^llm3d: .*no progress" "$out.log" | sed 's/^/  /'
    silent=$(grep "^llm3d: .*no progress for" "$out.log" | sed 's/.*; \(.*\) did not respond.*/\1/')
    [ "$rc" -ne 0 ] && [ -n "$silent" ] && echo "$silent" | grep -q "dp 1)" &&
        ! echo "$silent" | grep -q "dp 0)" &&
        [ "$(cat "$out/checkpoints/latest")" = "$latest" ] &&
        "$bin" inspect "$out/checkpoints/$latest" > "$out.inspect" 2>&1 || {
        echo "exit $rc, latest $(cat "$out/checkpoints/latest") (was $latest), silent: $silent"
        cat "$out.log" "$out.inspect" 2>/dev/null
        return 1
    }
}
check "a link down mid-run: the watchdog names a rank of host 1, the job ends within\
 --timeout + 20 s, the last checkpoint intact" link_down

exit $fail
