#!/usr/bin/env bash
# Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
# generation_config.json) written by llm3d: tokenizer export and tokenizer train, prepare's record
# beside the shards, train --out's and convert's folders. Read back by llm3d they give the same
# ids; the configs name the tokenizer's special tokens; the npm Hugging Face tokenizers
# (@huggingface/tokenizers, which scripts/setup.sh --tokenizers unpacks into llm3d's cache; the
# oracle is skipped, in one line, only where node or the package is missing) encode the held-out
# texts of the tokenizer tests to llm3d's ids with them, for GPT-2's BPE, a trained BPE,
# cl100k_base and Llama 3, and one merge removed or two ids swapped gives other ids; Llama 3's
# vocabulary and merges recovered from its rank file are those of Meta's tokenizer.json.
# Usage: hftok.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"
here=$(dirname "$0")
compare_ids="$(dirname "$bin")/test_hftok" # test_hftok SPEC TSV: SPEC's ids are the file's
cache=${L3D_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llm3d}
pkg="$cache/npm/huggingface-tokenizers-0.2.0/package"

# 300 documents separated by "%" lines, with accents (bytes above 0x7F merged by the BPE)
doc='fortune %d: the quick brown fox jumps over the lazy dog %d times. \303\207a va, na\303\257ve caf\303\251?'
awk -v doc="$doc" 'BEGIN { for (i = 1; i <= 300; i++) printf doc "\n  -- someone'"'"'s proverb, number %d\n%%\n", i, i * 7, i % 13 }' \
    > "$dir/corpus.txt"
check "tokenizer train" "$bin" tokenizer train --vocab-size 400 --out "$dir/tok" "$dir/corpus.txt"
check "  ... writes the Hugging Face files beside encoder.json and vocab.bpe" sh -c "cd '$dir/tok' && \
    test -s encoder.json -a -s vocab.bpe -a -s tokenizer.json -a -s tokenizer_config.json -a \
    -s special_tokens_map.json -a -s generation_config.json"
mkdir -p "$dir/tok_gpt2" && cp "$dir/tok/encoder.json" "$dir/tok/vocab.bpe" "$dir/tok_gpt2/"

# name, the tokenizer llm3d reads, its end-of-text and begin-of-text ids (-: none)
toks="gpt2 $here/../data/gpt2 50256 -
trained $dir/tok_gpt2 399 -
cl100k_base cl100k_base 100257 -
llama3 llama3 128001 128000"
texts=("Hello, world! It's 2024." $'caf\xc3\xa9 na\xc3\xafve  \n\n  x' "<|endoftext|> and <|end_of_text|> as text" \
       $'\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e 12345 \xf0\x9f\x99\x82')
num() { sed -n "s/.*\"$2\": \([0-9-]*\).*/\1/p" "$1"; }
while read -r name spec eot bot; do
    check "tokenizer export --tokenizer $name: Hugging Face's files" "$bin" tokenizer export \
        --tokenizer "$spec" --out "$dir/hf_$name"
    same=1
    for t in "${texts[@]}"; do
        a=$("$bin" tokenizer encode --tokenizer "$spec" --text "$t")
        b=$("$bin" tokenizer encode --tokenizer "$dir/hf_$name/tokenizer.json" --text "$t")
        [ -n "$a" ] && [ "$a" = "$b" ] || same=0
    done
    check "  ... its tokenizer.json read back by llm3d: the same ids" test $same = 1
    want_bos=$([ "$bot" = - ] && echo "$eot" || echo "$bot")
    check "  ... generation_config.json: bos_token_id $want_bos, eos_token_id $eot" test \
        "$(num "$dir/hf_$name/generation_config.json" bos_token_id) $(num "$dir/hf_$name/generation_config.json" eos_token_id)" = "$want_bos $eot"
    check "  ... tokenizer_config.json: eos_token the end-of-text token, add_bos_token $([ "$bot" = - ] && echo false || echo true)" \
        sh -c "grep -q '\"eos_token\": \"<|end.*of.*text|>\"' '$dir/hf_$name/tokenizer_config.json' && \
        grep -q '\"add_bos_token\": $([ "$bot" = - ] && echo false || echo true)' '$dir/hf_$name/tokenizer_config.json'"
done <<< "$toks"
check "  ... the trained one's files equal tokenizer train's own" cmp -s "$dir/hf_trained/tokenizer.json" "$dir/tok/tokenizer.json"
expect_error "tokenizer export of llm.c's decode-only file" "holds no merges" sh -c "'$bin' tokenizer export \
    --tokenizer '$dir/tok' --out '$dir/tok.bin' && '$bin' tokenizer export --tokenizer '$dir/tok.bin' --out '$dir/hf_llmc'"
check "  ... nothing written" test ! -e "$dir/hf_llmc"

# prepare records the tokenizer; train --out and convert put it in the model's folder
check "prepare records the tokenizer beside the shards" sh -c "'$bin' prepare --tokenizer '$dir/tok' \
    --doc-separator % --val-fraction 0.1 --out '$dir/data' '$dir/corpus.txt' > /dev/null && \
    cmp -s '$dir/data/tokenizer.json' '$dir/tok/tokenizer.json'"
tiny() { OMP_NUM_THREADS=2 "$bin" train --model tiny --vocab 400 --context 32 --seq-len 32 --batch 2 --steps 2 \
    --val-every 0 --peak-gflops 100 "$@"; }
check "train --out: the folder gets the tokenizer prepare recorded" sh -c "$(declare -f tiny); bin='$bin'; \
    tiny --train '$dir/data/train_*.bin' --out '$dir/run' | grep -q 'tokenizer.json, tokenizer_config.json' && \
    cmp -s '$dir/run/tokenizer.json' '$dir/tok/tokenizer.json'"
check "  ... tokenizer_config.json's model_max_length is the context" test "$(num "$dir/run/tokenizer_config.json" model_max_length)" = 32
mkdir -p "$dir/bare" && cp "$dir/data/train_000000.bin" "$dir/bare/"
check "train --out without a known tokenizer: one line, the model only" sh -c "$(declare -f tiny); bin='$bin'; \
    tiny --train '$dir/bare/train_*.bin' --out '$dir/run_bare' | grep -c '^--out: no tokenizer known' | grep -qx 1 && \
    test -s '$dir/run_bare/model.safetensors' -a ! -e '$dir/run_bare/tokenizer.json'"
check "train --tokenizer: that one" sh -c "$(declare -f tiny); bin='$bin'; tiny --train '$dir/bare/train_*.bin' \
    --tokenizer bytes --out '$dir/run_bytes' > /dev/null && grep -q '\"ignore_merges\": false' '$dir/run_bytes/tokenizer.json' && \
    ! grep -q '\"eos_token\"' '$dir/run_bytes/tokenizer_config.json'"
expect_error "train --tokenizer llama3 for a model of 400 tokens: refused at start-up" \
    "^llm3d train: --tokenizer: llama3: the tokenizer has 128256 tokens but the model's vocabulary is 400" \
    sh -c "$(declare -f tiny); bin='$bin'; tiny --train '$dir/bare/train_*.bin' --tokenizer llama3 --out '$dir/run_l3'"
check "  ... nothing trained" test ! -e "$dir/run_l3/model.bin"
mkdir -p "$dir/bytes_rec" && "$bin" prepare --tokenizer bytes --val-fraction 0 --out "$dir/bytes_rec" "$dir/corpus.txt" > /dev/null &&
    cp "$dir/tok/tokenizer.json" "$dir/bytes_rec/"
check "a recorded tokenizer larger than the model: the run goes on, the model only, said in one line" sh -c "
    OMP_NUM_THREADS=2 '$bin' train --model tiny --vocab 256 --context 32 --seq-len 32 --batch 2 --steps 2 --val-every 0 \
    --peak-gflops 100 --quiet --train '$dir/bytes_rec/train_*.bin' --out '$dir/run_rec' 2>&1 >/dev/null | \
    grep -c \"^llm3d train: --out's tokenizer: .*the tokenizer has 400 tokens but the model's vocabulary is 256.*gets the model only\$\" | grep -qx 1 &&
    test -s '$dir/run_rec/model.safetensors' -a ! -e '$dir/run_rec/tokenizer.json'"
check "train --init-from a folder: --out gets its tokenizer where prepare recorded none" sh -c "$(declare -f tiny); \
    bin='$bin'; tiny --train '$dir/bare/train_*.bin' --init-from '$dir/run' --out '$dir/run_init' > /dev/null && \
    cmp -s '$dir/run_init/tokenizer.json' '$dir/tok/tokenizer.json'"
check "convert a folder: DEST gets SOURCE's tokenizer" sh -c "'$bin' convert '$dir/run' '$dir/conv' > /dev/null && \
    cmp -s '$dir/conv/tokenizer.json' '$dir/tok/tokenizer.json' && cmp -s '$dir/conv/generation_config.json' '$dir/run/generation_config.json'"
check "convert an llm.c file: no tokenizer known, said in one line" sh -c "'$bin' convert '$dir/run/model.bin' '$dir/conv2' | \
    grep -c 'no tokenizer known' | grep -qx 1 && test ! -e '$dir/conv2/tokenizer.json'"
check "convert --tokenizer: that one" sh -c "'$bin' convert --overwrite --tokenizer '$dir/tok_gpt2' '$dir/run/model.bin' '$dir/conv2' > /dev/null && \
    cmp -s '$dir/conv2/tokenizer.json' '$dir/tok/tokenizer.json'"
expect_error "convert --tokenizer to an llm.c file" "an llm.c file DEST.*holds no tokenizer" \
    "$bin" convert --tokenizer "$dir/tok" "$dir/run" "$dir/conv.bin"
expect_error "convert --tokenizer llama3 for a model of 400 tokens" "the tokenizer has 128256 tokens but the model's vocabulary is 400" \
    "$bin" convert --tokenizer llama3 "$dir/run/model.bin" "$dir/conv3"
check "  ... the folder not even begun" test ! -e "$dir/conv3"

# the npm Hugging Face tokenizers on llm3d's tokenizer.json files
if ! command -v node > /dev/null || [ ! -f "$pkg/dist/tokenizers.cjs" ]; then
    echo "skip: the npm Hugging Face tokenizers oracle: no node or no $pkg (bash scripts/setup.sh --tokenizers)"
    exit $fail
fi
while read -r name spec eot bot; do
    out=$(node "$here/hftok_oracle.js" "$pkg" "$dir/hf_$name" "$dir/$name.tsv")
    check "npm tokenizers with llm3d's $name tokenizer.json: every text decoded back ($out)" \
        grep -q '; 0 not decoded back;' <<< "$out"
    check "  ... the held-out texts' ids are llm3d's with $spec" "$compare_ids" "$spec" "$dir/$name.tsv"
    check "  ... and with the special tokens, llm3d's with the tokenizer.json" "$compare_ids" "$dir/hf_$name" "$dir/$name.tsv"
    h=$("$bin" tokenizer encode --tokenizer "$spec" --text Hello)
    check "  ... \"Hello\" with the special tokens: $([ "$bot" = - ] && echo "none added" || echo "$bot first")" \
        grep -q "\"Hello\" with special tokens: $([ "$bot" = - ] || echo "$bot ")$h\$" <<< "$out"
done <<< "$toks"
perturb() { # perturb NAME WHAT: hf_NAME with its first merge removed (merge) or "e" and "t" swapped (swap)
    mkdir -p "$dir/bad_$1_$2" && cp "$dir/hf_$1/tokenizer_config.json" "$dir/bad_$1_$2/" &&
    node -e "const fs = require('fs'), j = JSON.parse(fs.readFileSync('$dir/hf_$1/tokenizer.json')), v = j.model.vocab;
        if ('$2' === 'merge') j.model.merges.shift(); else [v.e, v.t] = [v.t, v.e];
        fs.writeFileSync('$dir/bad_$1_$2/tokenizer.json', JSON.stringify(j));" &&
    node "$here/hftok_oracle.js" "$pkg" "$dir/bad_$1_$2" "$dir/bad_$1_$2.tsv" > /dev/null
}
for name in gpt2 llama3; do
    spec=$(awk -v n=$name '$1 == n { print $2 }' <<< "$toks")
    for what in merge swap; do
        check "$name's tokenizer.json with $([ $what = merge ] && echo "its first merge removed" || echo '"e" and "t" swapped'): other ids" \
            sh -c "$(declare -f perturb); dir='$dir' here='$here' pkg='$pkg'; perturb $name $what && \
            ! '$compare_ids' '$spec' '$dir/bad_${name}_$what.tsv' > /dev/null 2>&1"
    done
done
check "Llama 3's vocabulary and merges from its rank file: Meta's tokenizer.json's" \
    node "$here/hftok_oracle.js" --same "$dir/hf_llama3/tokenizer.json" "$cache/hf/llama3/tokenizer.json"
check "  ... one merge removed: not the same" sh -c "! node '$here/hftok_oracle.js' --same \
    '$dir/bad_llama3_merge/tokenizer.json' '$cache/hf/llama3/tokenizer.json' > /dev/null"
exit $fail
