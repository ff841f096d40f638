#!/usr/bin/env bash
# End to end through the command line with a trained BPE vocabulary: tokenizer train -> prepare ->
# train -> generate (KV cache and --no-kv-cache give the same greedy text); one clear error for
# each bad tokenizer or corpus. Usage: tokenizer.sh LLM3D SCRATCH_DIR
# check, expect_error, fail
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

# a corpus of documents separated by "%" lines, as fortune files are
for i in $(seq 1 400); do
    echo "fortune $i: the quick brown fox jumps over the lazy dog $((i * 7)) times."
    echo "  -- someone's proverb, number $((i % 13))"
    echo "%"
done > "$dir/corpus.txt"
check "tokenizer train" "$bin" tokenizer train --vocab-size 400 --out "$dir/tok" "$dir/corpus.txt"
check "  ... writes GPT-2's two files" test -s "$dir/tok/encoder.json" -a -s "$dir/tok/vocab.bpe"
check "prepare with it" "$bin" prepare --tokenizer "$dir/tok" --doc-separator % --val-fraction 0.1 \
    --out "$dir/data" "$dir/corpus.txt"
check "  ... decodes back to the documents" sh -c "'$bin' tokenizer decode --tokenizer '$dir/tok' \
    '$dir/data/train_000000.bin' | grep -c 'fortune 1: the quick' | grep -qx 1"
check "  ... every document starts with end-of-text" test "$("$bin" tokenizer decode --tokenizer "$dir/tok" \
    "$dir/data/train_000000.bin" | grep -c '^<|endoftext|>fortune')" -eq 360
check "encode" test "$("$bin" tokenizer encode --tokenizer "$dir/tok" --text 'the quick brown fox' | wc -w)" -le 6
check "encode - reads standard input" test "$(printf 'the quick brown fox' | "$bin" tokenizer encode \
    --tokenizer "$dir/tok" -)" = "$("$bin" tokenizer encode --tokenizer "$dir/tok" --text 'the quick brown fox')"
check "encode with no text and no FILE reads standard input (a pipe)" test "$(printf 'the quick brown fox' | \
    "$bin" tokenizer encode --tokenizer "$dir/tok")" = "$("$bin" tokenizer encode --tokenizer "$dir/tok" --text 'the quick brown fox')"
check "  ... an empty pipe gives an empty line" test "$(printf '' | "$bin" tokenizer encode --tokenizer "$dir/tok")" = ""
expect_error "encode with two FILEs" "2 FILEs given" "$bin" tokenizer encode --tokenizer "$dir/tok" \
    "$dir/corpus.txt" "$dir/corpus.txt"
check "prepare --threads 1" "$bin" prepare --tokenizer "$dir/tok" --doc-separator % --val-fraction 0.1 \
    --threads 1 --out "$dir/data1" "$dir/corpus.txt"
check "  ... the same shards as with 2 threads" sh -c "cmp -s '$dir/data/train_000000.bin' \
    '$dir/data1/train_000000.bin' && cmp -s '$dir/data/val_000000.bin' '$dir/data1/val_000000.bin'"
expect_error "prepare --threads 0" "\-\-threads 0 is out of range" "$bin" prepare --tokenizer bytes \
    --threads 0 --out "$dir/data0" "$dir/corpus.txt"
# 60 steps; 20 under the sanitizers and on the checking backend (`full`: the same code, and the
# checks of the generated text below ask nothing of its quality)
steps=60
full || steps=20
OMP_NUM_THREADS=2 "$bin" train --model tiny --vocab 400 --context 32 --seq-len 32 --batch 4 \
    --steps $steps --lr 3e-3 --warmup 2 --val-every $((steps / 2)) --quiet \
    --train "$dir/data/train_*.bin" --val "$dir/data/val_*.bin" --out "$dir/run" > /dev/null
check "train on BPE shards" test -s "$dir/run/model.bin"
gen() { OMP_NUM_THREADS=2 "$bin" generate --checkpoint "$dir/run/model.bin" --tokenizer "$dir/tok" \
    --prompt "fortune" --max-tokens 25 --temperature 0 "$@" 2>/dev/null; }
check "generate with the KV cache" sh -c "$(declare -f gen); bin='$bin' dir='$dir' gen > '$dir/kv.txt'"
check "generate by recomputation" sh -c "$(declare -f gen); bin='$bin' dir='$dir' gen --no-kv-cache > '$dir/re.txt'"
check "  ... the same greedy text" cmp -s "$dir/kv.txt" "$dir/re.txt"
check "  ... continues the prompt" grep -q '^fortune' "$dir/kv.txt"
# train's and plan's --recompute MODE is activation recomputation: generate's old switch of that
# name is refused, naming the new one
expect_error "generate --recompute: renamed" "^llm3d generate: --recompute is now --no-kv-cache.*give --no-kv-cache$" \
    "$bin" generate --checkpoint "$dir/run/model.bin" --tokenizer "$dir/tok" --recompute
check "sampling with top-k, top-p and a seed is reproducible" sh -c "$(declare -f gen); bin='$bin' dir='$dir'; \
    a=\$(gen --temperature 1 --top-k 20 --top-p 0.9 --seed 3); b=\$(gen --temperature 1 --top-k 20 --top-p 0.9 --seed 3); \
    test \"\$a\" = \"\$b\""

# errors
expect_error "tokenizer directory missing" "nowhere" "$bin" prepare --tokenizer "$dir/nowhere" --out "$dir/x" "$dir/corpus.txt"
mkdir -p "$dir/badtok" && echo '{"a": 0' > "$dir/badtok/encoder.json" && cp "$dir/tok/vocab.bpe" "$dir/badtok/"
expect_error "malformed encoder.json" "badtok/encoder.json: malformed JSON" "$bin" prepare --tokenizer "$dir/badtok" --out "$dir/x" "$dir/corpus.txt"
cp "$dir/tok/encoder.json" "$dir/badtok/" && rm "$dir/badtok/vocab.bpe"
expect_error "vocab.bpe missing" "badtok/vocab.bpe" "$bin" prepare --tokenizer "$dir/badtok" --out "$dir/x" "$dir/corpus.txt"
expect_error "gpt2 not fetched" "setup.sh --gpt2" env L3D_CACHE_DIR="$dir/nocache" "$bin" prepare --tokenizer gpt2 --out "$dir/x" "$dir/corpus.txt"
head -c 3000 /dev/urandom > "$dir/binary.dat"; printf 'ab\0cd' >> "$dir/binary.dat"
expect_error "non-text input" "binary.dat holds a NUL byte" "$bin" prepare --tokenizer "$dir/tok" --out "$dir/x" "$dir/binary.dat"
: > "$dir/empty.txt"
expect_error "empty corpus (prepare)" "hold no text" "$bin" prepare --tokenizer "$dir/tok" --out "$dir/x" "$dir/empty.txt"
expect_error "empty corpus (tokenizer train)" "hold no text" "$bin" tokenizer train --vocab-size 300 --out "$dir/x" "$dir/empty.txt"
expect_error "vocabulary too large for uint16" "vocab-size 70000 is out of range" "$bin" tokenizer train --vocab-size 70000 --out "$dir/x" "$dir/corpus.txt"
expect_error "one document cannot be split" "val-fraction 0" "$bin" prepare --tokenizer "$dir/tok" --out "$dir/x" "$dir/corpus.txt"
expect_error "tokenizer and checkpoint differ" "has 50257 tokens but" "$bin" generate --checkpoint "$dir/run/model.bin" --tokenizer "$(dirname "$0")/../data/gpt2"
check "export llm.c's tokenizer file" "$bin" tokenizer export --tokenizer "$dir/tok" --out "$dir/tok.bin"
check "generate decodes with it" sh -c "OMP_NUM_THREADS=2 '$bin' generate --checkpoint '$dir/run/model.bin' --tokenizer '$dir/tok.bin' --max-tokens 5 > /dev/null 2>&1"
expect_error "decode-only tokenizer with a prompt" "decodes only" sh -c "'$bin' generate --checkpoint '$dir/run/model.bin' --tokenizer '$dir/tok.bin' --prompt hi" 
# --tokenizer bytes (the byte values as token ids, as prepare, inspect and generate take it) in
# every subcommand that reads a tokenizer; train learns a vocabulary and refuses one
check "prepare --tokenizer bytes" "$bin" prepare --tokenizer bytes --val-fraction 0 --out "$dir/bytes" \
    "$dir/corpus.txt"
check "tokenizer decode --tokenizer bytes: the corpus again" \
    cmp -s "$dir/corpus.txt" <("$bin" tokenizer decode --tokenizer bytes "$dir/bytes/train_000000.bin")
check "tokenizer encode --tokenizer bytes: the bytes' values" \
    test "$("$bin" tokenizer encode --tokenizer bytes --text $'h\xc3\xa9\xff')" = "104 195 169 255"
check "tokenizer export --tokenizer bytes" "$bin" tokenizer export --tokenizer bytes --out "$dir/bytes.bin"
check "  ... llm.c's file decodes the shard alike" \
    cmp -s "$dir/corpus.txt" <("$bin" tokenizer decode --tokenizer "$dir/bytes.bin" "$dir/bytes/train_000000.bin")
expect_error "tokenizer decode --tokenizer bytes: a BPE shard's ids beyond 255" "train_000000.bin.*256" \
    "$bin" tokenizer decode --tokenizer bytes "$dir/data/train_000000.bin"
# flags: from one table each (src/cli/flags.c's parser, train's names), --help generated from it
check "--help of tokenizer, prepare and generate lists their flags" sh -c "
    '$bin' tokenizer --help | grep -q '^  --vocab-size N' &&
    '$bin' tokenizer encode --help | grep -q '^  --text TEXT' &&
    '$bin' prepare --help | grep -q '^  --shard-tokens N' &&
    '$bin' generate --help | grep -q '^  --no-kv-cache ' &&
    ! '$bin' generate --help | grep -q -- '--recompute'"
expect_error "prepare --val-fraction 1" "^llm3d prepare: --val-fraction 1 is not a number in \[0, 1)$" \
    "$bin" prepare --tokenizer bytes --val-fraction 1 --out "$dir/x" "$dir/corpus.txt"
expect_error "prepare --out without its value" "^llm3d prepare: .*flag without its value: '--out'" \
    "$bin" prepare --tokenizer bytes "$dir/corpus.txt" --out
expect_error "generate --threads 0: train's range" "^llm3d generate: --threads 0 is out of range: give a value from 1 to 4096$" \
    "$bin" generate --checkpoint "$dir/run/model.bin" --threads 0
expect_error "tokenizer encode --text without its value" "^llm3d tokenizer: .*flag without its value: '--text'" \
    "$bin" tokenizer encode --tokenizer bytes --text
expect_error "tokenizer train --tokenizer: refused" "tokenizer train learns a vocabulary.*--tokenizer" \
    "$bin" tokenizer train --tokenizer bytes --vocab-size 300 --out "$dir/x" "$dir/corpus.txt"
check "  ... nothing written" test ! -e "$dir/x"

# llama3 (installed by scripts/setup.sh --tokenizers, as make test does): documents start with
# <|begin_of_text|>, 32-bit shards (llm.c's Llama 3 format) that inspect, decode and train read
check "prepare --tokenizer llama3 --doc-token bot" "$bin" prepare --tokenizer llama3 --doc-token bot \
    --doc-separator % --val-fraction 0.1 --out "$dir/l3" "$dir/corpus.txt"
check "  ... llm.c's Llama 3 header (20240801, version 7)" test "$(od -A n -t d4 -N 8 "$dir/l3/train_000000.bin" | tr -s ' ')" = " 20240801 7"
check "  ... inspect says uint32 and decodes" sh -c "'$bin' inspect --tokenizer llama3 '$dir/l3/train_000000.bin' | \
    grep -q 'uint32 tokens' && '$bin' inspect --tokenizer llama3 '$dir/l3/train_000000.bin' | grep -q '<|begin_of_text|>fortune'"
check "  ... every document starts with begin-of-text" test "$("$bin" tokenizer decode --tokenizer llama3 \
    "$dir/l3/train_000000.bin" | grep -c '^<|begin_of_text|>fortune')" -eq 360
check "  ... train reads them (a tiny model of 128,256 tokens)" "$bin" train --train "$dir/l3/train_*.bin" \
    --layers 1 --channels 16 --heads 2 --vocab 128256 --steps 1 --batch 1 --seq-len 16 --quiet \
    --out "$dir/l3run"
check "prepare --tokenizer llama3: begin-of-text by default (--doc-token auto)" sh -c "'$bin' prepare \
    --tokenizer llama3 --doc-separator % --val-fraction 0.1 --out '$dir/l3auto' '$dir/corpus.txt' > /dev/null && \
    cmp -s '$dir/l3/train_000000.bin' '$dir/l3auto/train_000000.bin'"
check "  ... --doc-token eot: end-of-text instead" test "$("$bin" prepare --tokenizer llama3 --doc-token eot \
    --doc-separator % --val-fraction 0.1 --out "$dir/l3eot" "$dir/corpus.txt" > /dev/null && "$bin" tokenizer \
    decode --tokenizer llama3 "$dir/l3eot/train_000000.bin" | grep -c '^<|end_of_text|>fortune')" -eq 360
# generate starts the prompt with the token prepare started the documents with (its summary says which)
l3gen() { OMP_NUM_THREADS=1 "$bin" generate --checkpoint "$dir/l3run/model.bin" --tokenizer llama3 \
    --prompt fortune --max-tokens 2 --temperature 0 "$@" 2>&1 > /dev/null; }
check "generate --tokenizer llama3: the prompt starts with begin-of-text" sh -c "$(declare -f l3gen); \
    bin='$bin' dir='$dir' l3gen | grep -q 'after a prompt of 2 tokens starting with <|begin_of_text|>$'"
check "  ... --doc-token eot: with end-of-text" sh -c "$(declare -f l3gen); bin='$bin' dir='$dir' \
    l3gen --doc-token eot | grep -q 'after a prompt of 2 tokens starting with <|end_of_text|>$'"
expect_error "  ... a model of 50,257 tokens refuses them" "holds token 128000.*outside the vocabulary" \
    "$bin" train --train "$dir/l3/train_*.bin" --layers 1 --channels 16 --heads 2 --vocab 50257 --steps 1 --batch 1 --seq-len 16
expect_error "prepare --doc-token bot without a begin-of-text token" "no begin-of-text token" \
    "$bin" prepare --tokenizer "$dir/tok" --doc-token bot --out "$dir/x" "$dir/corpus.txt"
check "generate with GPT-2-style vocabulary: the prompt starts with end-of-text" sh -c "OMP_NUM_THREADS=1 \
    '$bin' generate --checkpoint '$dir/run/model.bin' --tokenizer '$dir/tok' --prompt fortune --max-tokens 2 \
    2>&1 > /dev/null | grep -q 'starting with <|endoftext|>$'"
expect_error "generate --doc-token bot without a begin-of-text token" "^llm3d generate: --doc-token bot: tokenizer .* has no begin-of-text token" \
    "$bin" generate --checkpoint "$dir/run/model.bin" --tokenizer "$dir/tok" --doc-token bot
expect_error "generate --doc-token other" "^llm3d generate: --doc-token 'bos': choose auto, eot or bot$" \
    "$bin" generate --checkpoint "$dir/run/model.bin" --doc-token bos
check "tokenizer decode --tokenizer bytes" sh -c "'$bin' prepare --tokenizer bytes --out '$dir/by' '$dir/corpus.txt' >/dev/null && \
    '$bin' tokenizer decode --tokenizer bytes '$dir/by/train_000000.bin' | head -1 | grep -qx 'fortune 1: the quick brown fox jumps over the lazy dog 7 times.'"
"$bin" train --model tiny --vocab 256 --context 32 --seq-len 32 --batch 1 --steps 1 --quiet \
    --train "$dir/by/train_*.bin" --out "$dir/byrun" > /dev/null 2>&1
expect_error "generate --doc-token with bytes" "^llm3d generate: --doc-token applies to BPE tokenizers, not bytes$" \
    "$bin" generate --checkpoint "$dir/byrun/model.bin" --doc-token eot

# every command that takes --tokenizer lists every form of SPEC in its --help
for cmd in tokenizer prepare generate inspect; do
    check "$cmd --help lists every tokenizer form" sh -c "'$bin' $cmd --help | tr -s ' \n' ' ' > '$dir/help.txt' && \
        for w in bytes gpt2 cl100k_base o200k_base llama3 tokenizer.json encoder.json vocab.bpe '.json file' \
            'tiktoken rank file' gpt2_tokenizer.bin; do grep -qF \"\$w\" '$dir/help.txt' || exit 1; done"
done
# Qwen3's tokenizer.json (Qwen2's NFC normalizer; installed by setup.sh --tokenizers), as a
# directory and as a .json file: a decomposed e + U+0301 encodes as the composed é
hf="${L3D_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llm3d}/hf/qwen3"
check "tokenizer.json with NFC: decomposed and composed text, the same ids" test \
    "$("$bin" tokenizer encode --tokenizer "$hf" --text $'caf\x65\xcc\x81 cr\xc3\xa8me')" = \
    "$("$bin" tokenizer encode --tokenizer "$hf/tokenizer.json" --text $'caf\xc3\xa9 cr\x65\xcc\x80me')"
exit $fail
