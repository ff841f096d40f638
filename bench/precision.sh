#!/usr/bin/env bash
# Mixed precision against fp32 (issues 14 and 49): GPT-2 124M (d12) and a Llama of its size
# (12 x 768, 12 heads, 4 KV heads, SwiGLU 2048, untied) on 2 threads at B=4 T=64 and B=8 T=256,
# the precisions interleaved run by run (the VM's speed drifts: compare within a run, never
# across days); d24 (350M) in bf16 at B=8 T=256 (tokens/s and peak memory); bf16 against fp32 on
# tp2 and pp2 (2 ranks x 1 thread). Usage: bench/precision.sh BUILD_DIR [ROUNDS]
# Prints one line per run and a summary of medians: bf16 / fp32 per shape, the MFU of each
# precision against the peaks each bench run measured (fp32 FMA, bf16 dot products), issue 49's
# targets, and the kernel-family time split of the last round's B=8 T=256 runs. PRECISION_EXTRA=0
# leaves out fp16, tp2, pp2 and d24. Not a test: nothing here can fail but a run.
# PRECISION_SVG (default BUILD_DIR/precision.svg): the medians' speed-up over fp32 per shape and
# precision, and peak memory, drawn by `llm3d plot --xy` (x: the shape's number in the list).
set -u
build=${1:-build}
rounds=${2:-3}
bin=$build/llm3d
mpiexec=$(grep -E '^MPIEXEC_EXECUTABLE:' "$build/CMakeCache.txt" 2>/dev/null | cut -d= -f2)
mpiexec=${mpiexec:-mpiexec}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# one NAME [launcher...] -- [bench flags]: the bench's tokens/s and peak memory into $out/NAME
one() {
    local name=$1
    shift
    local launch=()
    while [ "$1" != "--" ]; do launch+=("$1"); shift; done
    shift
    local log
    log=$("${launch[@]}" "$bin" "${cmd[@]}" --peak-gflops 100 "$@" 2>&1) || {
        echo "$name: failed: $(echo "$log" | tail -3)"; return; }
    local tps mem mfu32 mfu16
    tps=$(echo "$log" | sed -n 's/^median step .*), \([0-9.]*\) tokens\/s.*/\1/p' | tail -1)
    mem=$(echo "$log" | sed -n 's/.*peak host memory \([0-9.]*\) MiB.*/\1/p' | tail -1)
    # bench's "model FLOP/s X G: A% of the fp32 FMA peak, B% of the bf16 peak" (train: none)
    mfu32=$(echo "$log" | sed -n 's/^model FLOP\/s.*: \([0-9.]*\)% of the fp32.*/\1/p')
    mfu16=$(echo "$log" | sed -n 's/^model FLOP\/s.*, \([0-9.na]*\)% of the bf16.*/\1/p')
    echo "$name: $tps tokens/s, peak memory $mem MiB${mfu32:+, MFU $mfu32% of the FMA peak, $mfu16% of the bf16 peak}"
    echo "$tps $mem ${mfu32:-nan} ${mfu16:-nan}" >> "$out/$name"
    echo "$log" | sed -n '/^fp32 FMA peak/p; /^bf16 dot-product loop/p; /^the bf16 peak/p; /^triad/p' >> "$out/peaks"
    echo "$log" | sed -n '/^time split/,/^  idle/p; /^  floor (roofline)/p' > "$out/$name.split"
}
# bench (one process) by default; the 2-rank runs train on a byte corpus (llm3d bench is one process)
cmd=(bench)
for i in $(seq 1 3000); do echo "line $i of the precision benchmark's corpus, $((i * 7919 % 104729))"; done > "$out/corpus.txt"
"$bin" prepare --tokenizer bytes --out "$out/data" "$out/corpus.txt" > /dev/null || exit 1
train2=(--train "$out/data/train_*.bin" --val-every 0 --quiet)
med() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "nan" }'; }

extra=${PRECISION_EXTRA:-1}
llama=(--model d12 --arch llama --kv-heads 4 --ffn 2048)
for r in $(seq 1 "$rounds"); do
    precs="fp32 bf16"
    [ "$extra" = 1 ] && precs="fp32 bf16 fp16"
    for p in $precs; do
        one "d12_b4_t64_$p" env OMP_NUM_THREADS=2 -- --model d12 --batch 4 --seq-len 64 \
            --steps 6 --precision "$p"
        one "d12_b8_t256_$p" env OMP_NUM_THREADS=2 -- --model d12 --batch 8 --seq-len 256 \
            --steps 4 --precision "$p"
    done
    for p in fp32 bf16; do
        one "llama_b4_t64_$p" env OMP_NUM_THREADS=2 -- "${llama[@]}" --batch 4 --seq-len 64 \
            --steps 6 --precision "$p"
        one "llama_b8_t256_$p" env OMP_NUM_THREADS=2 -- "${llama[@]}" --batch 8 --seq-len 256 \
            --steps 4 --precision "$p"
    done
    [ "$extra" = 1 ] || continue
    cmd=(train)
    for p in fp32 bf16; do
        one "d12_tp2_$p" env OMP_NUM_THREADS=1 "$mpiexec" -n 2 -- --model d12 --batch 4 \
            --seq-len 64 --steps 6 --tp 2 --precision "$p" "${train2[@]}"
        one "d12_pp2_$p" env OMP_NUM_THREADS=1 "$mpiexec" -n 2 -- --model d12 --batch 4 \
            --seq-len 64 --steps 6 --pp 2 --grad-accum 4 --precision "$p" "${train2[@]}"
    done
    cmd=(bench)
done
[ "$extra" = 1 ] && one d24_b8_t256_bf16 env OMP_NUM_THREADS=2 -- --model d24 --batch 8 --seq-len 256 --steps 3 \
    --precision bf16
[ "$extra" = 1 ] && one d24_b8_t256_fp32 env OMP_NUM_THREADS=2 -- --model d24 --batch 8 --seq-len 256 --steps 3 \
    --precision fp32

echo "medians (tokens/s; peak MiB) and 16-bit / fp32:"
xy="$out/precision.tsv"
printf '# title: Mixed precision against fp32 (1 d12 B4 T64, 2 d12 B8 T256, 3 tp2, 4 pp2, 5 d24 B8 T256, 6 Llama B4 T64, 7 Llama B8 T256)\n# style: points\n# x: shape\n# panel: throughput over fp32\n# y: tokens/s over fp32\n# ideal: 1\n' > "$xy"
mem_rows=""
k=0
for base in d12_b4_t64 d12_b8_t256 d12_tp2 d12_pp2 d24_b8_t256 llama_b4_t64 llama_b8_t256; do
    k=$((k + 1))
    f32=$(cut -d' ' -f1 "$out/${base}_fp32" 2>/dev/null | med)
    for p in fp32 bf16 fp16; do
        [ -f "$out/${base}_$p" ] || continue
        t=$(cut -d' ' -f1 "$out/${base}_$p" | med)
        m=$(cut -d' ' -f2 "$out/${base}_$p" | med)
        r=$(awk -v a="$t" -v b="$f32" 'BEGIN { printf "%.2f", a / b }')
        # the MFU against the precision's own measured peak (bench runs only)
        col=3
        [ "$p" = fp32 ] || col=4
        u=$(cut -d' ' -f$col "$out/${base}_$p" | grep -v nan | med)
        echo "  $base $p: $t tokens/s, $m MiB, x$r${u:+, MFU $u% of the measured $([ $col = 3 ] && echo fp32 FMA || echo bf16) peak}"
        echo "$base $p $r ${u:-nan}" >> "$out/summary"
        printf '%s\t%d\t%s\t%s\n' "$p" "$k" "$r" "$base" >> "$xy"
        mem_rows+="$p	$k	$m
"
    done
done
printf '# panel: peak memory\n# y: MiB\n# ideal:\n%s' "$mem_rows" >> "$xy"
"$bin" plot --xy "$xy" --out "${PRECISION_SVG:-$build/precision.svg}"

echo "peaks the bench runs measured (min / median / max, GFLOP/s; GB/s):"
# "the bf16 peak" is bench's MFU denominator: the dot-product loop or the fastest bf16 product
for what in "fp32 FMA peak" "bf16 dot-product loop" "the bf16 peak" "triad bandwidth"; do
    grep "^$what" "$out/peaks" | grep -o '[0-9.]* G[BF]' | cut -d' ' -f1 | sort -n |
        awk -v w="$what" '{ a[NR] = $1 } END { if (NR) printf "  %s: %s / %s / %s\n", w, a[1], a[int((NR + 1) / 2)], a[NR] }'
done
# issue 49's targets: bf16 / fp32 >= 1.85 at B8 T256 (GPT-2, Llama), >= 1.75 at B4 T64; bf16 MFU
# >= 80% of the bf16 peak at B8 T256
echo "issue 49's targets (same-run medians):"
awk '$2 == "bf16" {
    need = ($1 ~ /b8_t256/) ? 1.85 : ($1 ~ /b4_t64/ ? 1.75 : 0)
    if (need > 0) printf "  %s bf16/fp32 x%s (target x%.2f): %s\n", $1, $3, need, ($3 >= need ? "met" : "not met")
    if ($1 ~ /b8_t256/ && $1 !~ /d24/ && $4 != "nan")
        printf "  %s bf16 MFU %s%% of the bf16 peak (target 80%%): %s\n", $1, $4, ($4 >= 80 ? "met" : "not met")
}' "$out/summary"
for f in d12_b8_t256_fp32 d12_b8_t256_bf16 llama_b8_t256_bf16; do
    [ -s "$out/$f.split" ] && { echo "$f, the last round's run:"; cat "$out/$f.split"; }
done
