#!/usr/bin/env bash
# An AVX2-only machine on an AVX-512 one (issue 49: "on an AVX2-only machine nothing is slower than
# before"): this tree and REF (default 0be8198, the last commit before issue 49's kernels) built
# for x86-64-v3 (AVX2, FMA, F16C: -DL3D_NATIVE=OFF -march=x86-64-v3), run with what such a machine
# would pick: oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2), no 16-bit oneDNN products
# (L3D_DNNL_16BIT=0: they need AVX512-BF16), llm3d's element-wise paths capped at AVX2
# (L3D_SIMD=avx2) and no bf16 dot-product or AMX attention (L3D_ATTN_DOT=0, L3D_ATTN_DNNL=0). It emulates the instruction
# set, not the other machine's cores, caches or memory: a regression in what the code does shows,
# a microarchitecture's taste does not.
# GPT-2 124M (d12) and a Llama of its size at B=4 T=64 (and B=8 T=256 with LARGE=1), fp32 and
# bf16, on 2 threads, the two builds interleaved run by run, ROUNDS rounds; prints each run's
# median step and, per case, the median over rounds and new / ref.
# Usage: bench/avx2.sh [REF] [ROUNDS] [WORK_DIR]   (defaults: 0be8198 3 a temporary directory)
set -u
ref=${1:-0be8198}
rounds=${2:-3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${3:-$(mktemp -d)}
mkdir -p "$work"
flags=(-DCMAKE_BUILD_TYPE=Release -DL3D_NATIVE=OFF -DCMAKE_C_FLAGS=-march=x86-64-v3)

build() { # build SRC DIR: the x86-64-v3 build of SRC's llm3d in DIR
    cmake -S "$1" -B "$2" "${flags[@]}" > "$2.cmake.log" 2>&1 &&
        cmake --build "$2" -j2 --target llm3d > "$2.build.log" 2>&1 ||
        { echo "building $1 failed: see $2.build.log"; exit 1; }
}
if [ ! -x "$work/ref/llm3d" ]; then
    rm -rf "$work/ref-src" && git -C "$root" worktree add -q --detach "$work/ref-src" "$ref" ||
        { echo "no commit $ref"; exit 1; }
    build "$work/ref-src" "$work/ref"
    git -C "$root" worktree remove --force "$work/ref-src"
fi
build "$root" "$work/new"

rm -f "$work"/*.fp32.ref "$work"/*.fp32.new "$work"/*.bf16.ref "$work"/*.bf16.new # this run's alone
export ONEDNN_MAX_CPU_ISA=AVX2 L3D_DNNL_16BIT=0 L3D_SIMD=avx2 L3D_ATTN_DOT=0 L3D_ATTN_DNNL=0
export OMP_NUM_THREADS=2
llama=(--arch llama --kv-heads 4 --ffn 2048)
cases=("gpt2_b4_t64|--batch 4 --seq-len 64 --steps 6" "llama_b4_t64|${llama[*]} --batch 4 --seq-len 64 --steps 6")
[ "${LARGE:-0}" = 1 ] && cases+=("gpt2_b8_t256|--batch 8 --seq-len 256 --steps 3")
for r in $(seq 1 "$rounds"); do
    for c in "${cases[@]}"; do
        name=${c%%|*} args=(${c#*|})
        for p in fp32 bf16; do
            for b in ref new; do
                ms=$("$work/$b/llm3d" bench --model d12 "${args[@]}" --precision "$p" \
                    --peak-gflops 100 2>&1 | sed -n 's/^result: \([0-9.]*\) ms\/step.*/\1/p')
                echo "round $r $name $p $b: ${ms:-failed} ms"
                echo "${ms:-nan}" >> "$work/$name.$p.$b"
            done
        done
    done
done
med() { sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "nan" }'; }
echo
echo "| case | precision | $ref (ms) | this tree (ms) | this / $ref |"
echo "|---|---|---|---|---|"
for c in "${cases[@]}"; do
    name=${c%%|*}
    for p in fp32 bf16; do
        a=$(med < "$work/$name.$p.ref") b=$(med < "$work/$name.$p.new")
        awk -v n="$name" -v p="$p" -v a="$a" -v b="$b" \
            'BEGIN { printf "| %s | %s | %.1f | %.1f | %.3f |\n", n, p, a, b, b / a }'
    done
done
