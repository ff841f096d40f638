#!/usr/bin/env bash
# llm3d prepare's inputs (issue 48): JSON Lines, gzip and zstd files and directories of them give
# the same shards as the same documents in text files; each malformed record, cut-short stream or
# unusable input one clear message. Usage: prepare.sh LLM3D SCRATCH_DIR
# check, expect_error, fail
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

for i in $(seq 1 200); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7))."; done \
    > "$dir/train.txt"
"$bin" tokenizer train --vocab-size 300 --out "$dir/tok" "$dir/train.txt" > /dev/null
tok=(--tokenizer "$dir/tok" --val-fraction 0.2 --shard-tokens 700)

# 40 documents: several lines each, quotes, backslashes, tabs and non-ASCII text (escaped by
# json.dumps as \uXXXX, surrogate pairs included), one file per document for the text path
mkdir -p "$dir/txt"
python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
with open(d + "/docs.jsonl", "w") as f:
    for i in range(40):
        text = f"document {i}: \"quoted\" back\\slash\ttab, caf\u00e9 \U0001F600 {i * 13}\n" * (1 + i % 4)
        if i % 5 == 0:
            text = text.rstrip("\n")  # no final newline
        with open(f"{d}/txt/doc{i:03d}.txt", "w", encoding="utf-8", newline="") as t:
            t.write(text)
        f.write(json.dumps({"id": i, "text": text, "meta": {"n": [1, 2]}}) + "\n")
EOF
same_shards() { # A B: the same shard files, byte for byte
    [ "$(ls "$1")" = "$(ls "$2")" ] || return 1
    for f in "$1"/*.bin; do cmp -s "$f" "$2/$(basename "$f")" || return 1; done
}
check "prepare a directory of text files (one document each)" "$bin" prepare "${tok[@]}" \
    --out "$dir/s_txt" "$dir/txt"
check "  ... several shards per split" test "$(ls "$dir/s_txt" | wc -l)" -ge 3
out=$("$bin" prepare "${tok[@]}" --out "$dir/s_jsonl" "$dir/docs.jsonl")
check "prepare docs.jsonl" test -n "$out"
check "  ... the same shards as the text files" same_shards "$dir/s_txt" "$dir/s_jsonl"
check "  ... its summary gives MB/s, tokens/s and the peak RSS" sh -c "echo '$out' | grep -q 'MB/s, [0-9]* tokens/s, peak RSS [0-9.]* MiB)'"
gzip -9 -c "$dir/docs.jsonl" > "$dir/docs.jsonl.gz"
zstd -q -19 -c "$dir/docs.jsonl" > "$dir/docs.jsonl.zst"
for ext in gz zst; do
    check "prepare docs.jsonl.$ext" "$bin" prepare "${tok[@]}" --out "$dir/s_$ext" "$dir/docs.jsonl.$ext"
    check "  ... the same shards as the text files" same_shards "$dir/s_txt" "$dir/s_$ext"
done
# several gzip members and zstd frames one after another are one stream
head -n 17 "$dir/docs.jsonl" > "$dir/a.jsonl"
tail -n +18 "$dir/docs.jsonl" > "$dir/b.jsonl"
cat <(gzip -c "$dir/a.jsonl") <(gzip -c "$dir/b.jsonl") > "$dir/two.jsonl.gz"
cat <(zstd -q -c "$dir/a.jsonl") <(zstd -q -c "$dir/b.jsonl") > "$dir/two.jsonl.zst"
for ext in gz zst; do
    check "a .$ext of two members / frames" "$bin" prepare "${tok[@]}" --out "$dir/s2_$ext" "$dir/two.jsonl.$ext"
    check "  ... the same shards" same_shards "$dir/s_txt" "$dir/s2_$ext"
done
# compressed text files in a directory (sorted by name; other names left out), and two JSON Lines
# files given in order
mkdir -p "$dir/txtz"
for f in "$dir"/txt/*.txt; do
    n=$(basename "$f")
    case $n in *[02468].txt) gzip -c "$f" > "$dir/txtz/$n.gz" ;; *) zstd -q -c "$f" > "$dir/txtz/$n.zst" ;; esac
done
echo "not an input" > "$dir/txtz/README.md"
check "a directory of .txt.gz and .txt.zst files" "$bin" prepare "${tok[@]}" --out "$dir/s_txtz" "$dir/txtz"
check "  ... the same shards" same_shards "$dir/s_txt" "$dir/s_txtz"
check "two JSON Lines files" "$bin" prepare "${tok[@]}" --out "$dir/s_ab" "$dir/a.jsonl" "$dir/b.jsonl"
check "  ... the same shards" same_shards "$dir/s_txt" "$dir/s_ab"
: > "$dir/empty.jsonl"
check "an empty file beside others adds nothing" "$bin" prepare "${tok[@]}" --out "$dir/s_e" \
    "$dir/empty.jsonl" "$dir/docs.jsonl" "$dir/empty.jsonl"
check "  ... the same shards" same_shards "$dir/s_txt" "$dir/s_e"
check "--jsonl-key names another member" sh -c "sed 's/\"text\"/\"body\"/' '$dir/docs.jsonl' > '$dir/body.jsonl' && \
    '$bin' prepare --tokenizer '$dir/tok' --val-fraction 0.2 --shard-tokens 700 --jsonl-key body \
    --out '$dir/s_body' '$dir/body.jsonl' > /dev/null"
check "  ... the same shards" same_shards "$dir/s_txt" "$dir/s_body"

# malformed records: skipped and counted (the shards those of the good ones), or --strict's error
{
    head -n 3 "$dir/docs.jsonl"
    echo '{"text": "unterminated'
    echo '["text", "an array"]'
    echo '{"id": 7}'
    echo '{"text": 42}'
    printf '{"text": "bad \xff byte"}\n'
    echo '{"text": "lone \ud800 surrogate"}'
    echo '{"text": "a NUL \u0000 here"}'
    echo '{"text": "bad \q escape"}'
    echo '   '
    tail -n +4 "$dir/docs.jsonl"
} > "$dir/bad.jsonl"
err=$("$bin" prepare "${tok[@]}" --out "$dir/s_bad" "$dir/bad.jsonl" 2>&1 >"$dir/bad.out")
check "malformed records skipped" same_shards "$dir/s_txt" "$dir/s_bad"
check "  ... the first 5 listed by file:line" test "$(echo "$err" | grep -c 'warning: .*bad.jsonl:[0-9]*: ')" -eq 5
said() { echo "$err" | grep -q -- "$1"; }
check "  ... line 4: malformed JSON" said 'bad.jsonl:4: malformed JSON'
check "  ... line 5: not an object" said 'bad.jsonl:5: an array, not a JSON object'
check "  ... line 6: no key" said 'bad.jsonl:6: no "text" member'
check "  ... line 7: not a string" said 'bad.jsonl:7: "text" is a number, not a string'
check "  ... line 8: invalid UTF-8" said 'bad.jsonl:8: "text" is not valid UTF-8 (byte 4 of the value)'
check "  ... line 9 not listed (past the first 5)" sh -c "! echo \"\$0\" | grep -q 'bad.jsonl:9'" "$err"
check "  ... all 8 counted in the summary" grep -q '8 malformed record(s) skipped' "$dir/bad.out"
expect_error "--strict: the first malformed record is the error" "bad.jsonl:4: malformed JSON.*--strict" \
    "$bin" prepare "${tok[@]}" --strict --out "$dir/s_strict" "$dir/bad.jsonl"
check "  ... nothing written, no --out made" test ! -e "$dir/s_strict"
for n in "9:lone surrogate:malformed JSON.*surrogate" "10:NUL:\"text\" holds a NUL character" \
         "11:bad escape:malformed JSON.*an escape"; do
    IFS=: read -r line what pat <<< "$n"
    sed -n "${line}p" "$dir/bad.jsonl" > "$dir/one.jsonl"
    expect_error "--strict on a record with a $what" "one.jsonl:1: $pat" \
        "$bin" prepare "${tok[@]}" --strict --out "$dir/x" "$dir/one.jsonl"
done
expect_error "a line over --max-line" "docs.jsonl:1: a line longer than 100 bytes" \
    "$bin" prepare "${tok[@]}" --max-line 100 --out "$dir/x" "$dir/docs.jsonl"

# cut-short and corrupt streams, empty inputs, a directory without inputs
size=$(stat -c %s "$dir/docs.jsonl.gz")
head -c $((size - 20)) "$dir/docs.jsonl.gz" > "$dir/cut.jsonl.gz"
expect_error "a truncated .gz" "cut.jsonl.gz is truncated: its gzip stream ends" \
    "$bin" prepare "${tok[@]}" --out "$dir/x" "$dir/cut.jsonl.gz"
size=$(stat -c %s "$dir/docs.jsonl.zst")
head -c $((size - 20)) "$dir/docs.jsonl.zst" > "$dir/cut.jsonl.zst"
expect_error "a truncated .zst" "cut.jsonl.zst is truncated: its zstd stream ends" \
    "$bin" prepare "${tok[@]}" --out "$dir/x" "$dir/cut.jsonl.zst"
cp "$dir/docs.jsonl" "$dir/plain.jsonl.zst"
expect_error "a .zst that is not zstd" "plain.jsonl.zst is not a valid zstd file" \
    "$bin" prepare "${tok[@]}" --out "$dir/x" "$dir/plain.jsonl.zst"
cp "$dir/docs.jsonl" "$dir/plain.txt.gz"
expect_error "a .gz that is not gzip" "plain.txt.gz is not a valid gzip file" \
    "$bin" prepare "${tok[@]}" --out "$dir/x" "$dir/plain.txt.gz"
check "  ... no --out left behind by any of them" test ! -e "$dir/x"
expect_error "an empty .jsonl alone" "hold no text (0 bytes)" \
    "$bin" prepare "${tok[@]}" --out "$dir/x" "$dir/empty.jsonl"
printf '\n{"text": ""}\n' > "$dir/nodoc.jsonl"
expect_error "records with empty texts only" "hold no document" \
    "$bin" prepare "${tok[@]}" --out "$dir/x" "$dir/nodoc.jsonl"
mkdir -p "$dir/noinputs/sub.txt"
cp "$dir/docs.jsonl" "$dir/noinputs/docs.json"
expect_error "a directory with no usable file" "noinputs holds no file prepare takes" \
    "$bin" prepare "${tok[@]}" --out "$dir/x" "$dir/noinputs"
expect_error "--tokenizer bytes refuses JSON Lines" "docs.jsonl is JSON Lines: --tokenizer bytes" \
    "$bin" prepare --tokenizer bytes --out "$dir/x" "$dir/docs.jsonl"
expect_error "--tokenizer bytes refuses --strict" "apply to BPE tokenizers" \
    "$bin" prepare --tokenizer bytes --strict --out "$dir/x" "$dir/txt"
check "--tokenizer bytes reads a .txt.zst as its text" sh -c "zstd -q -c '$dir/train.txt' > '$dir/train.txt.zst' && \
    '$bin' prepare --tokenizer bytes --out '$dir/b1' '$dir/train.txt' > /dev/null && \
    '$bin' prepare --tokenizer bytes --out '$dir/b2' '$dir/train.txt.zst' > /dev/null"
check "  ... the same shards" same_shards "$dir/b1" "$dir/b2"
check "--help states the memory bound and the progress bar's bytes" sh -c "'$bin' prepare --help | grep -q 'Memory: JSON Lines stream' && \
    '$bin' prepare --help | grep -q 'bar counts the bytes read from disk (compressed)'"
exit $fail
