#!/usr/bin/env bash
# Weak and strong scaling of data parallelism from 1 to 2 ranks on this machine (one OpenMP thread
# per rank, so ranks x threads = cores), and all-reduce bus bandwidth of llm3d's buckets against a
# plain MPI loop of the same sizes.
#   weak:   per-rank batch fixed (B=4 per rank): efficiency = tokens/s(2) / (2 x tokens/s(1))
#   strong: global batch fixed (B=8): efficiency = time(1) / (2 x time(2))
# SCALING_ACCUM=a (default 1): each rank accumulates a micro-batches of B=4 per step (--grad-accum);
# then weak compares 1 and 2 ranks at a x 4 sequences a rank, and strong keeps the micro-batch and
# the global batch (8a) fixed, as Megatron-LM's and Frontier's strong scaling do: 1 rank runs 2a
# micro-batches a step, each of 2 ranks a. (a = 1 keeps the B=8 one-rank baseline above.)
# Usage: bench/scaling.sh [BUILD_DIR] [MODEL] [STEPS]      (defaults: build d6 12)
# Modes (SCALING_MODES, default "blocking overlap:none overlap:poll overlap:thread"): --comm
# blocking, or --comm overlap with --progress none|poll|thread (a bare "overlap" passes no
# --progress: the binary's default, for builds before the flag). SCALING_ZERO: stages (0 1 2).
# SCALING_ROUNDS (default 1): rounds of every configuration, interleaved; medians over rounds.
# SCALING_SVG (default BUILD_DIR/scaling.svg): the efficiencies drawn by `llm3d plot --xy`, weak and
# strong, one line per ZeRO stage and mode (a colour per mode, a dash pattern per stage), with the
# ideal (100%).
# ZeRO-3 (SCALING_ZERO3=0 skips it; SCALING_ZERO3=only runs nothing else): 2 ranks at B=4 in the
# trainer's default progress, ZeRO-1, ZeRO-3 and ZeRO-3 without prefetch in each round: ZeRO-3's
# step time against ZeRO-1's, and the fraction of the parameter all-gathers' time hidden,
# 1 - wait(prefetch 1) / wait(prefetch 0) (without prefetch each layer's gather is posted and
# waited for where the layer needs it).
set -eu
build=${1:-build}
model=${2:-d6}
steps=${3:-12}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_mpi
export OMP_NUM_THREADS=1
fortunes "$dir/d"
data="$dir/d/train_*.bin"
modes=${SCALING_MODES:-blocking overlap:none overlap:poll overlap:thread}
stages=${SCALING_ZERO:-0 1 2}
accum=${SCALING_ACCUM:-1}
[[ $accum =~ ^[1-9][0-9]*$ ]] || { echo "SCALING_ACCUM=$accum: expected a positive integer" >&2; exit 2; }
run() { # NP B ZERO MODE [ACCUM] -> prints median ms, comm ms, optimizer ms (EXTRA: more flags)
    local np=$1 b=$2 zero=$3 mode=$4 acc=${5:-$accum} out="$dir/run_$1_$2_$3_${4/:/_}"
    local flags=(--comm "${mode%%:*}" --grad-accum "$acc" ${EXTRA:-})
    [[ $mode == *:* ]] && flags+=(--progress "${mode#*:}")
    "$mpiexec" -n "$np" "$bin" train --model "$model" --vocab 256 --context 256 --seq-len 256 \
        --batch "$b" --steps "$steps" --warmup 2 --val-every 0 --zero "$zero" "${flags[@]}" \
        --quiet --peak-gflops 208 --train "$data" --out "$out" --overwrite > /dev/null
    echo "$(med ms "$out/metrics.jsonl") $(med comm_wait_ms "$out/metrics.jsonl") $(med optimizer_ms "$out/metrics.jsonl")"
}
rounds=${SCALING_ROUNDS:-1}
echo "model $model, T=256, $steps steps, 1 thread per rank, launcher $mpiexec, $rounds round(s), $accum micro-batch(es) of 4 a rank a step"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
# Every figure is the median over the rounds of one step-time median per run. Each round runs every
# configuration once, in the same order, so a slow minute of the VM falls on all of them alike. One
# rank communicates nothing, so its baselines (B=4 weak, B=8 strong) are run once per round, with
# --zero 0: at one rank every stage shards over one rank and runs the same optimizer.
declare -A val
add() { val[$1]+="$2 "; }
mid() { tr ' ' '\n' <<< "${val[$1]}" | grep . | median; }
z3=${SCALING_ZERO3:-1}
[[ $z3 =~ ^(0|1|only)$ ]] || { echo "SCALING_ZERO3=$z3: expected 0, 1 or only" >&2; exit 2; }
for ((r = 0; r < rounds; r++)); do
    if [ "$z3" != only ]; then
    # Control: two independent one-rank runs at once show what sharing the machine costs (memory
    # bandwidth, clock) with no communication at all.
    "$bin" train --model "$model" --vocab 256 --context 256 --seq-len 256 --batch 4 --steps "$steps" \
        --warmup 2 --val-every 0 --grad-accum "$accum" --quiet --peak-gflops 208 --train "$data" --out "$dir/ctl_a" --overwrite > /dev/null &
    "$bin" train --model "$model" --vocab 256 --context 256 --seq-len 256 --batch 4 --steps "$steps" \
        --warmup 2 --val-every 0 --grad-accum "$accum" --quiet --peak-gflops 208 --train "$data" --out "$dir/ctl_b" --overwrite > /dev/null
    wait
    add ctl "$(med ms "$dir/ctl_a/metrics.jsonl")"
    add ctl "$(med ms "$dir/ctl_b/metrics.jsonl")"
    read -r t c o <<< "$(run 1 4 0 blocking)"; add t1 "$t"
    if ((accum == 1)); then read -r t c o <<< "$(run 1 8 0 blocking)"
    else read -r t c o <<< "$(run 1 4 0 blocking $((2 * accum)))"; fi
    add t1s "$t"
    for zero in $stages; do
        for mode in $modes; do
            read -r t c o <<< "$(run 2 4 $zero $mode)"
            add "t2_${zero}_$mode" "$t"; add "c2_${zero}_$mode" "$c"; add "o2_${zero}_$mode" "$o"
        done
    done
    fi
    if [ "$z3" != 0 ]; then
        read -r t c o <<< "$(run 2 4 1 overlap)"; add z3_t1 "$t"
        read -r t c o <<< "$(run 2 4 3 overlap)"; add z3_t3 "$t"
        add z3_w1 "$(med zero3_gather_wait_ms "$dir/run_2_4_3_overlap/metrics.jsonl")"
        read -r t c o <<< "$(EXTRA="--zero3-prefetch 0" run 2 4 3 overlap)"; add z3_t0 "$t"
        add z3_w0 "$(med zero3_gather_wait_ms "$dir/run_2_4_3_overlap/metrics.jsonl")"
    fi
done
if [ "$z3" != only ]; then
t1=$(mid t1) t1s=$(mid t1s) ctl=$(mid ctl)
xy="$dir/scaling.tsv"
# a colour per mode, a dash pattern per ZeRO stage
printf '# title: Data parallelism, 1 -> 2 ranks (%s, %s steps, %s round(s))\n# x: ranks\n# y: efficiency (%%)\n# ideal: 100\n# groups: %d\n' "$model" "$steps" "$rounds" "$(wc -w <<< "$modes")" > "$xy"
awk -v t1="$t1" -v c="$ctl" 'BEGIN { printf "control: 1 rank alone %.1f ms/step, two independent 1-rank runs at once %.1f ms/step (%.1f%%)\n", t1, c, 100 * t1 / c }'
for zero in $stages; do
    for mode in $modes; do
        t2=$(mid "t2_${zero}_$mode") c2=$(mid "c2_${zero}_$mode") o2=$(mid "o2_${zero}_$mode")
        awk -v z=$zero -v m=$mode -v t1=$t1 -v t2=$t2 -v c2=$c2 -v o2=$o2 -v t1s=$t1s -v ctl=$ctl -v a=$accum -v all="${val[t2_${zero}_$mode]% }" 'BEGIN {
            printf "ZeRO-%d %-15s weak (%d/rank): 1 rank %.1f ms, 2 ranks %.1f ms (comm %.1f, " \
                "optimizer %.1f): %.1f%% (%.1f%% of the control)\n",
                z, m, 4*a, t1, t2, c2, o2, 100*t1/t2, 100*ctl/t2;
            printf "ZeRO-%d %-15s strong (%d in all): 1 rank %.1f ms, 2 ranks %.1f ms: %.1f%% (%.1f%% of the control)" \
                "; 2-rank runs: %s ms\n",
                z, m, 8*a, t1s, t2, 100*t1s/(2*t2), 100*(t1s/(2*t2))/(t1/ctl), all }'
    done
done
for kind in weak strong; do
    echo "# panel: $kind scaling" >> "$xy"
    for zero in $stages; do
        for mode in $modes; do
            awk -v k=$kind -v z=$zero -v m=$mode -v t1=$t1 -v t1s=$t1s -v t2="$(mid "t2_${zero}_$mode")" 'BEGIN {
                printf "ZeRO-%d %s\t1\t100\nZeRO-%d %s\t2\t%.2f\n", z, m, z, m,
                    k == "weak" ? 100*t1/t2 : 100*t1s/(2*t2) }' >> "$xy"
        done
    done
done
"$bin" plot --xy "$xy" --out "${SCALING_SVG:-$build/scaling.svg}"
fi
if [ "$z3" != 0 ]; then
    awk -v a="$(mid z3_t1)" -v b="$(mid z3_t3)" -v c="$(mid z3_t0)" -v w1="$(mid z3_w1)" \
        -v w0="$(mid z3_w0)" 'BEGIN {
        printf "ZeRO-3 (2 ranks, B=4): ZeRO-1 %.1f ms/step, ZeRO-3 %.1f ms/step (%.3fx ZeRO-1), " \
            "without prefetch %.1f ms (%.3fx); all-gather wait %.1f ms/step with prefetch 1, " \
            "%.1f ms without: %.0f%% of it hidden\n", a, b, b / a, c, c / a, w1, w0,
            (w0 > 0 ? 100 * (1 - w1 / w0) : 0) }'  # parenthesised: a bare > redirects
    echo "ZeRO-3 rounds (ms/step): ZeRO-1 ${val[z3_t1]% }; ZeRO-3 ${val[z3_t3]% }; without prefetch ${val[z3_t0]% }"
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
