#!/usr/bin/env bash
# llm3d prepare on generated JSON Lines compressed with zstd, at two sizes: throughput (MB/s of
# decompressed input, tokens/s) and the peak resident memory (getrusage's maximum RSS, which
# prepare prints). The JSON Lines path streams, so the peak should not grow with the input (the
# tokens wait on disk in an unnamed file in --out, 4 bytes each). Documents: 1 to 8 KB of words
# drawn from a fixed list (Python's random, seeded), a few non-ASCII ones escaped by json.dumps.
# Not a test. Usage: bench/prepare.sh [BUILD_DIR] [MB] [TOKENIZER] [THREADS]
#   MB (default 1000): the larger input's decompressed size; the smaller is a quarter of it
#   TOKENIZER (default tests/data/gpt2, GPT-2's vocabulary)
set -eu
build=${1:-build}
mb=${2:-1000}
tok=${3:-$(dirname "$0")/../tests/data/gpt2}
threads=${4:-2}
bin=$build/llm3d
work=$(mktemp -d "${TMPDIR:-/tmp}/l3d-prepare-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
gen() { # MB SEED: JSON Lines on stdout
    python3 - "$1" "$2" <<'PY'
import json, random, sys
mb, seed = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
words = ("the of and to in is was for on that with as by at from his her it an were are which "
         "this be or has had not but first one their its new after who they have also two "
         "training model data token shard layer tensor gradient café naïve 東京 😀").split()
out, total, i = sys.stdout, 0, 0
while total < mb * 1000000:
    n = rng.randint(200, 1600)
    text = " ".join(rng.choices(words, k=n)) + "\n"
    line = json.dumps({"id": i, "text": text, "source": "bench"}) + "\n"
    out.write(line)
    total += len(line.encode())
    i += 1
PY
}
printf '%-10s %12s %12s %10s %12s %14s\n' "input" "MB (text)" "MB on disk" "MB/s" "tokens/s" "peak RSS"
for size in $((mb / 4)) "$mb"; do
    f=$work/docs_$size.jsonl.zst
    gen "$size" 1 | zstd -q -3 -T"$threads" -o "$f"
    out=$("$bin" prepare --tokenizer "$tok" --threads "$threads" --out "$work/out_$size" "$f" 2>/dev/null)
    text=$(echo "$out" | sed -n 's/.* document(s), \([0-9.]*\) MB (\([0-9.]*\) MB on disk).*/\1/p')
    disk=$(echo "$out" | sed -n 's/.* MB (\([0-9.]*\) MB on disk).*/\1/p')
    mbs=$(echo "$out" | sed -n 's/.*, \([0-9.]*\) MB\/s.*/\1/p')
    tps=$(echo "$out" | sed -n 's/.* \([0-9]*\) tokens\/s.*/\1/p')
    rss=$(echo "$out" | sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p')
    printf '%-10s %12s %12s %10s %12s %14s\n' "${size}MB" "$text" "$disk" "$mbs" "$tps" "$rss MiB"
    rm -rf "$work/out_$size" "$f"
done
