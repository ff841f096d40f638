#!/usr/bin/env bash
# Pipeline schedules on this machine (issue 47, "Done when"): pp = 2 ranks (one OpenMP thread each,
# so ranks x threads = cores), 1F1B and zb-h1 in the same run on the same model, batch and
# micro-batches, for each m of $MS; per schedule:
#   - the step (median after the first) and the measured bubble (idle share of each rank's
#     pipeline time, averaged over the ranks, median step) against the schedule's ideal of equal
#     stages and free transfers, as the trainer's start-up line gives it ((p - 1) / (m + p - 1) for
#     1F1B, zb-h1's from its timeline with F = B = W: (p - 1) / (3m + p - 1));
#   - the fullest rank's activations (the trainer's memory report, bytes);
#   - `llm3d plan --profile PROFILE` for the same layout and schedule: its step and its bubble.
# Then one verdict line per m: zb-h1's bubble below 1F1B's, within 2 points of its ideal; its
# activations within 2% of 1F1B's; the planner's step within 10% of each measured one.
# Usage: bench/pipeline.sh [BUILD_DIR] [MODEL] [STEPS] [PROFILE]
#   (defaults: build d6 6 profiles/local.prof; MS="4 8" in the environment picks the m, ZBV=1
#   adds a zbv line (--pp-virtual 2: two chunks a rank in a V) after each verdict; the
#   profile is measured first when missing: `llm3d bench --calibrate` on 2 ranks with the
#   model's flags, which measures its linear layers' own shapes too). Timing is
#   noisy on a shared machine: rerun it quietly for the figures.
set -eu
build=${1:-build}
model=${2:-d6}
steps=${3:-6}
prof=${4:-profiles/local.prof}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_mpi
B=2 T=128
common=(--model "$model" --vocab 256 --context "$T" --seq-len "$T" --batch "$B")
if [ ! -f "$prof" ]; then
    # with the model's flags: its own linear layers measured too (gemm_exact), as plan times them
    echo "no $prof: measuring this machine first, with $model's linear layers"
    OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" bench --calibrate "${common[@]}" --out "$prof" \
        > /dev/null
fi
fortunes "$dir/d"
echo "model $model (V=256), B=$B x T=$T per micro-batch, pp=2 on 2 ranks x 1 thread, $steps steps (median after the first), profile $prof, launcher $mpiexec"
# run SCHED M: sets ms, bubble, ideal, act, layers, pms (planned step), pbub (planned bubble)
run() {
    local s=$1 m=$2 out="$dir/$1_$2" v=1
    [ "$s" = zbv ] && v=2
    OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" train "${common[@]}" --grad-accum "$m" --pp 2 \
        --pp-virtual "$v" --pp-schedule "$s" --steps "$steps" --warmup 2 --val-every 0 --peak-gflops 208 \
        --train "$dir/d/train_*.bin" --out "$out" > "$out.log" 2>&1 ||
        { echo "$s m=$m: the trainer failed: $(tail -1 "$out.log")"; exit 1; }
    ms=$(med ms "$out/metrics.jsonl" 1)
    bubble=$(med bubble "$out/metrics.jsonl" 1)
    ideal=$(sed -n 's/^pipeline: .*ideal bubble .* = \([0-9.]*\)%$/\1/p' "$out.log" | head -1)
    act=$(sed -n 's/^activations: .* (\([0-9]*\) bytes;.*/\1/p' "$out.log")
    layers=$(grep -o 'layers [0-9,]*' "$out.log" | head -1)
    local json
    json=$("$bin" plan --model "$model" --vocab 256 --seq-len "$T" --profile "$prof" --precision fp32 \
        --devices 2 --threads 1 --global-batch $((B * m)) --batch "$B" --tp 1 --pp 2 --zero 0 \
        --recompute none --pp-virtual "$v" --pp-schedule "$s" --json 2>&1 | head -1)
    pms=$(echo "$json" | sed -n 's/.*"step_s":\([^,]*\),.*/\1/p')
    pbub=$(echo "$json" | sed -n 's/.*"bubble_fraction":\([0-9.e+-]*\).*/\1/p')
    [ -n "$pms" ] || { echo "$s m=$m: plan failed: $json"; exit 1; }
}
for m in ${MS:-4 8}; do
    run 1f1b "$m"
    f=("$ms" "$bubble" "$ideal" "$act" "$pms" "$pbub")
    run zb-h1 "$m"
    z=("$ms" "$bubble" "$ideal" "$act" "$pms" "$pbub")
    awk -v m="$m" -v l="$layers" -v f="${f[*]}" -v z="${z[*]}" 'BEGIN {
        split(f, F, " "); split(z, Z, " "); n[1] = "1f1b "; n[2] = "zb-h1"
        for (k = 1; k <= 2; k++) {
            if (k == 1) for (i in F) X[i] = F[i]; else for (i in Z) X[i] = Z[i]
            printf "m=%2d %s (%s): step %.0f ms, planned %.0f ms (%+.1f%%); bubble measured %.1f%%, ideal %.1f%%, planned %.1f%%; activations %d bytes\n",
                m, n[k], l, X[1], 1e3 * X[5], 100 * (1e3 * X[5] - X[1]) / X[1], 100 * X[2], X[3], 100 * X[6], X[4]
            err[k] = (1e3 * X[5] - X[1]) / X[1]
        }
        below = Z[2] < F[2]; near = 100 * Z[2] - Z[3]; ratio = Z[4] / F[4]
        printf "m=%2d verdict: zb-h1 bubble below 1F1B'"'"'s: %s (%.1f%% vs %.1f%%); within 2 points of its ideal: %s (%+.1f); activations zb-h1 / 1F1B %.4f (within 2%%: %s); planner step within 10%%: 1F1B %s, zb-h1 %s\n",
            m, below ? "yes" : "NO", 100 * Z[2], 100 * F[2], (near <= 2 && near >= -2) ? "yes" : "NO", near,
            ratio, (ratio <= 1.02 && ratio >= 0.98) ? "yes" : "NO",
            (err[1] <= 0.1 && err[1] >= -0.1) ? "yes" : "NO", (err[2] <= 0.1 && err[2] >= -0.1) ? "yes" : "NO" }'
    [ "${ZBV:-0}" = 1 ] || continue
    run zbv "$m"
    awk -v m="$m" -v l="$layers" -v ms="$ms" -v b="$bubble" -v i="$ideal" -v a="$act" -v p="$pms" -v pb="$pbub" 'BEGIN {
        printf "m=%2d zbv   (%s): step %.0f ms, planned %.0f ms (%+.1f%%); bubble measured %.1f%%, ideal %.1f%%, planned %.1f%%; activations %d bytes\n",
            m, l, ms, 1e3 * p, 100 * (1e3 * p - ms) / ms, 100 * b, i, 100 * pb, a }'
done
