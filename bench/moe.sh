#!/usr/bin/env bash
# Mixture of experts against the dense model of the same active parameters (issue 46): GPT-2
# small's layers (d12: 12 layers, 768 channels, 12 heads) with 8 experts, top-2, each half the
# dense MLP's width (the gpt2-moe preset: a token's two experts cost what the dense MLP does)
# against d12 itself, in fp32 and bf16, one process of 2 threads: the step time ratio. Then
# --ep 2 on 2 ranks (one thread each, 4 of the 8 experts a rank) against one process on the same
# global batch (--grad-accum 2), with the share of the step the all-to-alls took (the trainer's
# ep_comm_ms, rank 0). Each case also gives the planner's prediction of its step time and memory
# from PROFILE (measured first when missing, with gpt2-moe's shapes; CALIBRATE=0: no plan then),
# and the dense fp32 case runs twice: the spread of the two is the machine's noise, to read the
# ratios against. Every MoE case runs twice: with the router's own routing ("natural": a trained
# router sends most of a layer's tokens to a few experts, load up to E / K, and the trainer runs
# fewer, larger expert products than the planner's balanced ones) and with --moe-force-balance
# ("balanced": each expert exactly B T K / E rows, the planner's assumption, benchmarking only),
# each with its load (busiest expert over the mean, the median step's largest layer) and the
# planner's error; the summary gives the worst error of each routing.
# Byte tokens (V = 256), B=2 x T=64 a micro-batch, STEPS steps, the median after the first two.
# Usage: bench/moe.sh [BUILD_DIR] [STEPS] [PROFILE]  (defaults: build 4 profiles/local.prof)
set -eu
build=${1:-build}
steps=${2:-4}
prof=${3:-profiles/local.prof}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_mpi
export OMPI_MCA_rmaps_base_oversubscribe=1
if [ ! -f "$prof" ] && [ "${CALIBRATE:-1}" = 1 ]; then
    # with gpt2-moe's flags: its own linear layers measured too (gemm_exact: the experts' thin
    # products of B T top_k / E = 32 rows, which the grid reads at a side of 32), as plan times
    # them; d12's dense MLP is read from the grid
    echo "no $prof: measuring this machine first, with gpt2-moe's linear layers (CALIBRATE=0: none)"
    OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" bench --calibrate --model gpt2-moe --vocab 256 \
        --context 64 --seq-len 64 --batch 2 --out "$prof" > /dev/null
fi
fortunes "$dir/d"
common=(--vocab 256 --context 64 --seq-len 64 --batch 2 --steps "$steps" --warmup 2
        --val-every 0 --train "$dir/d/train_*.bin")
echo "gpt2-moe (d12, 8 experts of width 1536, top-2) against d12 (MLP width 3072), V=256,"
echo "B=2 x T=64, $steps steps (median after the first two), launcher $mpiexec"
echo
echo "| case | routing | load | precision | ranks x threads | step | planned step (error) | memory | planned memory (error) |"
echo "|---|---|---|---|---|---|---|---|---|"

# run NAME MODEL PRECISION NP [TRAIN FLAGS]: one run; sets ms (median step), ep (all-to-all) and
# err (the planner's step time error, %; empty without a plan)
run() {
    local name=$1 model=$2 prec=$3 np=$4
    shift 4
    err=""
    local launch=() th=2 out="$dir/$name"
    [ "$np" -gt 1 ] && launch=("$mpiexec" -n "$np") && th=1
    OMP_NUM_THREADS=$th "${launch[@]}" "$bin" train --model "$model" "${common[@]}" \
        --precision "$prec" --out "$out" "$@" > "$out.log" 2>&1 < /dev/null ||
        { echo "| $name | the trainer failed: $(tail -1 "$out.log") |"; ms=""; return; }
    ms=$(med ms "$out/metrics.jsonl")
    ep=$(med ep_comm_ms "$out/metrics.jsonl")
    local mem pms="-" pmem="-" json accum=1 ep_flag=(--ep 1) routing=- load=- force=()
    if [ "$model" != d12 ]; then
        routing=natural
        [[ " $* " == *" --moe-force-balance "* ]] && routing=balanced &&
            force=(--moe-force-balance) # its index buffer in the planned memory
        load=$(med moe_load_max "$out/metrics.jsonl")
    fi
    mem=$(sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$out.log")
    [[ " $* " == *" --grad-accum 2 "* ]] && accum=2
    [[ " $* " == *" --ep 2 "* ]] && ep_flag=(--ep 2)
    if [ -f "$prof" ]; then
        json=$("$bin" plan --model "$model" --vocab 256 --seq-len 64 --profile "$prof" \
            --precision "$prec" --trainer llm3d --devices 2 --threads "$th" --batch 2 \
            --global-batch $((2 * accum * np)) --tp 1 --pp 1 --zero 0 --recompute none \
            "${ep_flag[@]}" ${force[@]+"${force[@]}"} --json 2>&1 | head -1)
        pms=$(echo "$json" | sed -n 's/.*"step_s":\([^,]*\),.*/\1/p')
        pmem=$(echo "$json" | sed -n 's/.*"mem_total":\([^,]*\),.*/\1/p')
    fi
    err=""
    [ -n "$pms" ] && [ "$pms" != - ] && err=$(awk -v ps="$pms" -v ms="$ms" \
        'BEGIN { printf "%+.1f", 100 * (ps * 1e3 - ms) / ms }')
    awk -v n="$name" -v r="$routing" -v l="$load" -v p="$prec" -v np="$np" -v th="$th" \
        -v ms="$ms" -v ps="$pms" -v e="$err" -v m="$mem" -v pm="$pmem" 'BEGIN {
        printf "| %s | %s | %s | %s | %d x %d | %.0f ms | ", n, r, l == "-" ? l : sprintf("%.2f", l), p, np, th, ms
        if (e != "") printf "%.0f ms (%s%%) | ", ps * 1e3, e
        else printf "- | "
        printf "%.1f MiB | ", m / 1048576
        if (pm != "" && pm != "-") printf "%.1f MiB (%+.2f%%) |\n", pm / 1048576, 100 * (pm - m) / m
        else printf "- |\n" }'
}
# worst ROUTING ERR: keeps the largest |error| of each routing's MoE cases in worst[ROUTING]
declare -A worst
note() {
    [ -n "$2" ] || return 0
    worst[$1]=$(awk -v w="${worst[$1]:-0}" -v e="$2" 'BEGIN { a = e < 0 ? -e : e
        print (a > (w < 0 ? -w : w)) ? e : w }')
}

declare -A t
F=(--moe-force-balance)
for prec in fp32 bf16; do
    run "dense_$prec" d12 "$prec" 1 && t[dense_$prec]=$ms
    run "moe_$prec" gpt2-moe "$prec" 1 && t[moe_$prec]=$ms && note natural "$err"
    run "moe_${prec}_bal" gpt2-moe "$prec" 1 "${F[@]}" && t[bal_$prec]=$ms && note balanced "$err"
done
run dense_fp32_again d12 fp32 1 && t[again]=$ms
run moe_one_accum2 gpt2-moe fp32 1 --grad-accum 2 && t[one]=$ms && note natural "$err"
run moe_one_accum2_bal gpt2-moe fp32 1 --grad-accum 2 "${F[@]}" && t[bone]=$ms && note balanced "$err"
run moe_ep2 gpt2-moe fp32 2 --ep 2 && t[ep2]=$ms && t[a2a]=$ep && note natural "$err"
run moe_ep2_bal gpt2-moe fp32 2 --ep 2 "${F[@]}" && t[bep2]=$ms && t[ba2a]=$ep &&
    note balanced "$err"
echo
echo "the planner's step time, worst error over the MoE cases: router's routing" \
    "${worst[natural]:-?}%, balanced (--moe-force-balance) ${worst[balanced]:-?}% (criterion: 10%)"
awk -v d="${t[dense_fp32]}" -v a="${t[again]}" -v m="${t[moe_fp32]}" -v db="${t[dense_bf16]}" \
    -v mb="${t[moe_bf16]}" -v one="${t[one]}" -v e="${t[ep2]}" -v x="${t[a2a]}" \
    -v bm="${t[bal_fp32]}" -v bmb="${t[bal_bf16]}" -v bone="${t[bone]}" -v be="${t[bep2]}" \
    -v bx="${t[ba2a]}" 'BEGIN {
    printf "noise: the dense fp32 case twice, %.0f and %.0f ms (%.0f%% apart)\n", d, a,
        100 * (a > d ? a - d : d - a) / (a < d ? a : d)
    printf "MoE / dense step time: fp32 %.2fx, bf16 %.2fx; balanced routing: fp32 %.2fx, bf16 %.2fx\n",
        m / d, mb / db, bm / d, bmb / db
    printf "ep2 on 2 ranks against one process (same global batch): %.0f ms against %.0f ms, %.2fx faster; all-to-all %.0f ms a step, %.1f%% of it\n",
        e, one, one / e, x, 100 * x / e
    printf "  balanced routing: %.0f ms against %.0f ms, %.2fx faster; all-to-all %.0f ms a step, %.1f%% of it\n",
        be, bone, bone / be, bx, 100 * bx / be }'
