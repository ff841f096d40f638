#!/usr/bin/env bash
# The tiled attention kernel (FlashAttention, the default) against the materialising one
# (L3D_ATTENTION=naive, the benchmark's and tests' oracle) in whole GPT-2 training steps: llm3d bench
# (random tokens) at B=1 and T = 1024, 2048, 4096 on 2 threads, step time (the median of STEPS)
# and the accounted peak memory (parameters, gradients, AdamW, activations). The naive kernel
# only up to NAIVE_MAX (its T^2 probabilities: 12 layers x 12 heads x 4096^2 x 4 bytes x 2 is
# 19 GiB at 4096). Usage: bench/attention.sh [BUILD_DIR] [MODEL] [STEPS] [NAIVE_MAX]
# ATTENTION_SVG (default BUILD_DIR/attention.svg): step time and peak memory against T, drawn by
# `llm3d plot --xy`.
set -eu
build=${1:-build}
model=${2:-d12}
steps=${3:-2}
naive_max=${4:-2048}
bin=$build/llm3d
export OMP_NUM_THREADS=2
printf '%-6s %-6s %12s %14s %14s\n' kernel T "step (ms)" "peak (MiB)" "activations"
xy=$(mktemp)
trap 'rm -f "$xy"' EXIT
ms_rows="" peak_rows=""
for T in 1024 2048 4096; do
    for kernel in flash naive; do
        [ "$kernel" = naive ] && [ "$T" -gt "$naive_max" ] && continue
        out=$(L3D_ATTENTION=$kernel "$bin" bench --model "$model" --context "$T" --seq-len "$T" \
            --batch 1 --steps "$steps" 2>&1) || { echo "$kernel T=$T failed"; continue; }
        ms=$(echo "$out" | sed -n 's/^result: \([0-9.]*\) ms.*/\1/p')
        peak=$(echo "$out" | sed -n 's/.*peak host memory \([0-9.]*\) MiB.*/\1/p')
        act=$(echo "$out" | sed -n 's/^activations: \([0-9.]*\) MiB.*/\1/p')
        printf '%-6s %-6s %12s %14s %14s\n' "$kernel" "$T" "$ms" "$peak" "$act MiB"
        ms_rows+=$(printf '%s\t%s\t%s\\n' "$kernel" "$T" "${ms:-nan}")
        peak_rows+=$(printf '%s\t%s\t%s\\n' "$kernel" "$T" "${peak:-nan}")
    done
done
printf "# title: Attention: tiled (flash) against materialising (naive), %s, B=1\n# x: sequence length T\n# log-x\n# log-y\n# panel: step time\n# y: ms a step\n${ms_rows}# panel: peak memory\n# y: MiB\n${peak_rows}" "$model" > "$xy"
"$bin" plot --xy "$xy" --out "${ATTENTION_SVG:-$build/attention.svg}"
