#!/usr/bin/env bash
# End to end through the command line: prepare -> train -> generate; determinism of two runs;
# one clear error for bad data and bad flags. Usage: train.sh LLM3D SCRATCH_DIR
# check, expect_error, train, fail
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

# a small text corpus
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7))"; done > "$dir/a.txt"
check "prepare" "$bin" prepare --tokenizer bytes --out "$dir/data" --val-fraction 0.1 "$dir/a.txt"

# train OUT 0 4 [flags]: one process, 2 OpenMP threads, 4 sequences; no --peak-gflops: the
# runs measure the FMA peak their MFU is against
TRAIN_FLAGS=(--model tiny --vocab 256 --context 32 --seq-len 32 --grad-accum 2 --steps 12
             --warmup 2 --val-every 6 --val-batches 2 --quiet
             --train "$dir/data/train_*.bin" --val "$dir/data/val_*.bin")
TRAIN_THREADS=2
check "train run 1" train run1 0 4
check "train run 2" train run2 0 4
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl"; }
check "12 metrics lines with MFU" test "$(grep -c '"mfu"' "$dir/run1/metrics.jsonl")" -eq 12
check "validation loss logged" grep -q '"val_loss"' "$dir/run1/metrics.jsonl"
check "identical losses for identical seeds" test "$(losses "$dir/run1")" = "$(losses "$dir/run2")"
check "identical weights for identical seeds" cmp -s "$dir/run1/model.bin" "$dir/run2/model.bin"
first=$(losses "$dir/run1" | head -1 | cut -d: -f2)
last=$(losses "$dir/run1" | tail -1 | cut -d: -f2)
check "loss decreases ($first -> $last)" less_than "$last" "$first"
if less_than -nan "$first" || less_than nan "$first" || less_than -inf "$first" || less_than "" "$first"; then
    bad "  ... the check passes a loss that is not a finite number"
else
    ok "  ... a NaN or infinite last loss would fail it"
fi
check "another seed differs" train run3 0 4 --seed 7
check "  ... in its losses" test "$(losses "$dir/run1")" != "$(losses "$dir/run3")"
check "generate" sh -c "OMP_NUM_THREADS=2 '$bin' generate --checkpoint '$dir/run1/model.bin' --prompt 'the ' --max-tokens 20 > '$dir/gen.txt'"
check "  ... prints prompt and 20 bytes" test "$(head -c 24 "$dir/gen.txt" | wc -c)" -eq 24

# past the context: greedy tokens through the KV cache equal --no-kv-cache's (both slide the same
# window), for 3 prompts (one longer than the 64-token context) and 300 tokens each
check "train a 64-token context" train ctx64 0 4 --context 64 --seq-len 64 --steps 4 --val-every 0
long=$(printf 'line %d: the quick brown fox ' 1 2 3)
n=0
for p in "the " "line 12: the quick" "$long"; do
    n=$((n + 1))
    gen() { OMP_NUM_THREADS=2 "$bin" generate --checkpoint "$dir/ctx64/model.bin" --prompt "$p" \
        --temperature 0 --max-tokens 300 "$@"; }
    gen > "$dir/kv$n.txt" 2> /dev/null
    gen --no-kv-cache > "$dir/re$n.txt" 2> /dev/null
    check "generate past the context, prompt $n: KV cache = --no-kv-cache" cmp -s "$dir/kv$n.txt" "$dir/re$n.txt"
    check "  ... 300 bytes after the prompt" test "$(wc -c < "$dir/kv$n.txt")" -eq $((${#p} + 301))
done
# the comparison's negative case: a different text (sampled at temperature 1) is told apart
check "  ... a different text at temperature 1" sh -c "! OMP_NUM_THREADS=2 '$bin' generate \
    --checkpoint '$dir/ctx64/model.bin' --prompt 'the ' --temperature 1 --max-tokens 300 2>/dev/null \
    | cmp -s - '$dir/kv1.txt'"

# --init-from: the model's sizes come from the file's header; flags given must agree
init() { OMP_NUM_THREADS=2 "$bin" train --steps 2 --batch 2 --quiet --init-from "$dir/run1/model.bin" \
    --train "$dir/data/train_*.bin" "$@"; }
check "--init-from without size flags" sh -c "$(declare -f init); bin='$bin' dir='$dir' init --out '$dir/init' > '$dir/init.log'"
check "  ... trains the file's model (L=2 C=64 V=256 context 32)" grep -q "L=2 C=64 NH=4 V=256" "$dir/init.log"
check "--quiet keeps the start-up summary" grep -q "^model: .*parameters" "$dir/init.log"
check "  ... and the final line" grep -q "^median step" "$dir/init.log"
check "  ... and drops the step lines" sh -c "! grep -q '^step ' '$dir/init.log'"
check "  ... with agreeing flags" sh -c "$(declare -f init); bin='$bin' dir='$dir' init --model tiny --vocab 256 --context 32 > /dev/null"
expect_error "--init-from: a disagreeing size flag names it and both values" \
    "\-\-layers 3 disagrees.*layers 2" init --layers 3
expect_error "--init-from: a disagreeing --context" "\-\-context 64 disagrees.*context 32" init --context 64
expect_error "--init-from: a disagreeing --model" "\-\-model d6 has layers 6.*has 2" init --model d6
expect_error "--init-from: a missing file" "init-from.*nope.bin" init --init-from "$dir/nope.bin"

# generate: a prompt of exactly the context (32 bytes) is accepted, one more is not; weights that
# are not all finite are refused (the parameter at offset 10 set to NaN)
gen() { OMP_NUM_THREADS=2 "$bin" generate --max-tokens 4 "$@"; }
check "generate: a prompt of exactly the context length" \
    sh -c "$(declare -f gen); bin='$bin' gen --checkpoint '$dir/run1/model.bin' --prompt \"\$(printf 'x%.0s' \$(seq 32))\" > /dev/null 2>&1"
check "generate: a prompt longer than the context (the window slides)" \
    sh -c "$(declare -f gen); bin='$bin' gen --checkpoint '$dir/run1/model.bin' --prompt \"\$(printf 'x%.0s' \$(seq 33))\" > /dev/null 2>&1"
cp "$dir/run1/model.bin" "$dir/nan.bin"
printf '\x00\x00\xc0\x7f' | dd of="$dir/nan.bin" bs=1 seek=$((1024 + 4 * 10)) conv=notrunc status=none
expect_error "generate refuses weights that are not finite" "nan.bin: 1 of its .* not finite.*parameter 10" \
    gen --checkpoint "$dir/nan.bin"
expect_error "  ... and so does --init-from" "nan.bin: 1 of its .* not finite" \
    init --init-from "$dir/nan.bin"

# help texts and conventions
check "bench --help prints bench's usage" sh -c "'$bin' bench --help | head -1 | grep -q '^usage: llm3d bench'"
# bench's MFU is against the peak of the precision that runs: for --precision bf16 the bf16 peak
# by bench --calibrate's rule (the dot-product loop, or the fastest bf16 product where higher: it
# was the fp32 FMA peak, then the loop alone, each an MFU over 100% on an AMX CPU), fp32's FMA
# peak for fp32. The result line's denominator is the peak bench printed for that precision.
bench_peak() { # bench_peak PRECISION LABEL: the printed peak labelled LABEL = the result's denominator
    local log="$dir/bench-$1.log"
    OMP_NUM_THREADS=2 "$bin" bench --model tiny --vocab 256 --seq-len 32 --batch 2 --steps 2 \
        --precision "$1" > "$log" 2>&1 || return 1
    local printed used
    printed=$(sed -n "s/^$2 peak: *\([0-9.]*\) GFLOP.*/\1/p" "$log")
    used=$(sed -n 's/^result: .*MFU [0-9.]*% of \([0-9.]*\) GFLOP.*/\1/p' "$log")
    is_number "$printed" && [ "$printed" = "$used" ]
}
full && check "bench --precision bf16: the MFU is against the bf16 peak it prints" bench_peak bf16 bf16
full && check "bench --precision fp32: the MFU is against the FMA peak" bench_peak fp32 "fp32 FMA"
full && check "  (negative: the fp32 run has no bf16 peak)" sh -c "! grep -q '^bf16 peak' '$dir/bench-fp32.log'"
# the bf16 peak is the largest of the dot-product loop and the bf16 products printed (where the
# CPU has bf16 dot products); negative: the same log with the peak lowered below the loop
not() { ! "$@"; }
rule_peak() { # rule_peak LOG: the MFU's bf16 denominator = max(loop, products)
    awk '/^bf16 dot-product loop:/ { m = $4 } /^bf16 product / { if ($(NF-5) + 0 > m) m = $(NF-5) + 0 }
         /^bf16 peak:/ { p = $3 } END { exit !(m == "" || p + 0 == m + 0) }' "$1"
}
full && check "bench bf16: the peak is the dot-product loop or the fastest product, as calibrate's" \
    rule_peak "$dir/bench-bf16.log"
sed 's/^bf16 peak: *[0-9.]*/bf16 peak: 0.5/' "$dir/bench-bf16.log" > "$dir/bench-bf16-low.log"
full && grep -q '^bf16 dot-product loop:' "$dir/bench-bf16.log" &&
    check "  (negative: a peak below the loop is rejected)" not rule_peak "$dir/bench-bf16-low.log"
# bench's time split of the median step: the seven kernel families, communication and idle
# adding up to the step (to the 0.1 ms printed), the families within it, products and attention
# called; negative: the same log with the products' time past the step
split_ok() {
    awk '/^time split of the median step/ {
             match($0, /, [0-9.]+ ms\)/); step = substr($0, RSTART + 2, RLENGTH - 6) + 0
             in_split = 1; next }
         in_split && /^  [a-z-]+ +-?[0-9.]+ ms/ {
             n++; sum += $2; if ($1 != "communication" && $1 != "idle") { kern += $2; if ($2 < 0) bad = 1 }
             if (($1 == "products" || $1 == "attention") && $5 + 0 < 1) bad = 1
             if ($1 == "idle") in_split = 0 }
         END { d = sum - step; if (d < 0) d = -d
               exit !(n == 9 && step > 0 && !bad && kern <= step * 1.001 + 0.1 && d <= 0.5) }' "$1"
}
full && check "bench: the median step's split adds up, products and attention timed" split_ok "$dir/bench-bf16.log"
split_bad() { # the bf16 log with the products' time past the step
    sed 's/^\(  products *\)[0-9.]*/\19999999.0/' "$dir/bench-bf16.log" > "$dir/bench-bad.log"
    ! split_ok "$dir/bench-bad.log"
}
full && check "  (negative: products past the step fail it)" split_bad
# the floor line: its two parts add up to it and its MFU is the compute part's share of it
floor_ok() {
    awk '/^  floor \(roofline\)/ { n++
             match($0, /peak [0-9.]+ ms/); c = substr($0, RSTART + 5, RLENGTH - 8) + 0
             match($0, /triad [0-9.]+ ms/); m = substr($0, RSTART + 6, RLENGTH - 9) + 0
             match($0, /= [0-9.]+ ms/); f = substr($0, RSTART + 2, RLENGTH - 5) + 0
             match($0, /at most [0-9.]+%/); u = substr($0, RSTART + 8, RLENGTH - 9) + 0
             d = c + m - f; if (d < 0) d = -d; e = 100 * c / f - u; if (e < 0) e = -e
             if (!(c > 0 && m > 0 && d <= 0.15 && e <= 0.15)) bad = 1 }
         END { exit !(n == 1 && !bad) }' "$1"
}
full && check "bench: the roofline floor adds up" floor_ok "$dir/bench-bf16.log"
floor_bad() { # the floor's MFU moved by 5 points
    awk '/^  floor/ { match($0, /at most [0-9.]+%/); u = substr($0, RSTART + 8, RLENGTH - 9) + 5
                      sub(/at most [0-9.]+%/, "at most " u "%") } { print }' \
        "$dir/bench-bf16.log" > "$dir/bench-floor.log"
    ! floor_ok "$dir/bench-floor.log"
}
full && check "  (negative: a floor whose MFU does not follow fails it)" floor_bad
check "train --help: step k's loss is measured before update k" sh -c "'$bin' train --help | grep -q \"Step k's loss is measured before update k\""
check "  ... and so does the README" grep -q "Step k's loss is measured before update k" "$(dirname "$0")/../../README.md"
expect_error "a layout that does not fit the world: no --dp 0 advice" "leave out --dp" train bad 0 4 --dp 2
check "  ... (0 is rejected)" sh -c "! '$bin' train --model tiny --train '$dir/data/train_*.bin' --dp 2 2>&1 | grep -q -- '--dp 0'"
full && check "--pp-virtual 2 says it chose the interleaved schedule" sh -c "OMP_NUM_THREADS=1 '$mpiexec' -n 2 '$bin' \
    train --model tiny --vocab 256 --context 32 --seq-len 32 --layers 4 --batch 2 --grad-accum 2 --steps 1 --quiet \
    --pp 2 --pp-virtual 2 --train '$dir/data/train_*.bin' 2>&1 | grep -q 'interleaved schedule (chosen for --pp-virtual'"

# out of memory (3 GB of address space): the message names what does not fit. Not under the
# sanitizers: ASan reserves terabytes of shadow address space at start-up, which no `ulimit -v`
# leaves room for (the normal and the checking-backend passes of make test run these).
# --ignore-memory-check: the allocation itself must fail here, on a machine of any size (the
# check before allocation refused d48 instead wherever under 22.2 GiB was free; runs.sh tests it)
oom() { (ulimit -v 3000000; OMP_NUM_THREADS=1 "$bin" train --vocab 256 --steps 1 \
    --ignore-memory-check --train "$dir/data/train_*.bin" "$@"); }
if [ -z "${L3D_SANITIZED:-}" ]; then
expect_error "out of memory: parameters too large names the parameters" \
    "for the parameters and gradients (1477609600 parameters.*smaller model" oom --model d48 --batch 1 --seq-len 32
expect_error "out of memory: activations too large names the batch" \
    "parameters, gradients and activations (B=15, T=1024): lower --batch" oom --model tiny --context 1024 \
    --channels 2048 --heads 16 --batch 15 --seq-len 1024
else
    echo "note: the two out-of-memory cases need ulimit -v, which a sanitized binary cannot run under"
fi

# --steps 1073741824 (its largest): the medians' step times are rings of the last 4096 steps, not
# four arrays of 8 GiB allocated and zeroed at start-up (under 3 GB of address space that aborted,
# out of memory, and anywhere it took 32 GiB); SIGTERM after 3 steps ends the run (exit 0)
huge_steps() {
    rm -rf "$dir/huge"
    ( sanitized || ulimit -v 3000000
      OMP_NUM_THREADS=1 exec "$bin" train --model tiny --vocab 256 --context 32 --seq-len 32 \
          --batch 2 --val-every 0 --quiet --peak-gflops 100 --train "$dir/data/train_*.bin" \
          --steps 1073741824 --out "$dir/huge" ) > "$dir/huge.log" 2>&1 &
    local pid=$! i
    for i in $(seq 1 600); do
        [ "$(cat "$dir/huge/metrics.jsonl" 2>/dev/null | wc -l)" -ge 4 ] && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.05
    done
    kill -TERM $pid 2>/dev/null
    wait $pid || { cat "$dir/huge.log"; return 1; }
    local peak
    peak=$(sed -n 's/.*peak host memory .*(\([0-9]*\) bytes.*/\1/p' "$dir/huge.log")
    grep -q "^signal 15: stopped after step" "$dir/huge.log" && is_number "$peak" &&
        [ "$peak" -lt 67108864 ] || { cat "$dir/huge.log"; return 1; }
}
check "--steps 1073741824: step times in fixed rings (host memory under 64 MiB), stopped by SIGTERM" \
    huge_steps

head -c 2000 /dev/urandom > "$dir/garbage.bin"
expect_error "wrong magic" "garbage.bin.*magic" train bad 0 4 --train "$dir/garbage.bin"
head -c 1500 "$dir/data/train_000000.bin" > "$dir/trunc.bin"
expect_error "truncated shard" "trunc.bin" train bad 0 4 --train "$dir/trunc.bin"
expect_error "token beyond the vocabulary" "offset" train bad 0 4 --vocab 100
expect_error "no file matches" "nothing_here" train bad 0 4 --train "$dir/nothing_here_*.bin"
expect_error "bad flag value" "\-\-batch" train bad 0 4 --batch 0
expect_error "seq-len beyond context" "context" train bad 0 4 --seq-len 64
expect_error "heads do not divide channels" "divisible" train bad 0 4 --heads 5
expect_error "unknown preset" "preset" train bad 0 4 --model gpt5
expect_error "missing checkpoint" "nope.bin" "$bin" generate --checkpoint "$dir/nope.bin"
expect_error "unknown --backend" "backend 'nope'.*use cpu" train bad 0 4 --backend nope
expect_error "unknown \$L3D_BACKEND" "backend 'nope'" env L3D_BACKEND=nope "$bin" train --model tiny \
    --vocab 256 --train "$dir/data/train_*.bin"
expect_error "generate: unknown --backend" "backend 'nope'" "$bin" generate \
    --checkpoint "$dir/run1/model.bin" --backend nope
exit $fail
