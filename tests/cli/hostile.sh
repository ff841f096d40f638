#!/usr/bin/env bash
# Hostile files and flags (issue 16, item 5): each one gets one clear error naming the file, in
# bounded time, never a crash, a hang or a garbled message. FIFOs given as inputs are refused
# without blocking; headers claiming huge models are checked against the file's size before any
# allocation; a flag error under mpiexec is said once.
# Usage: hostile.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, expect_error, bounded, fail
start_test "$@"
export OMP_NUM_THREADS=2
# lim COMMAND...: at most 20 s (a blocked open would otherwise hang the script); 124 on time-out
lim() { timeout -s KILL 20 "$@"; }
# refused DESCRIPTION PATTERN COMMAND...: exit 1 or 2 within the limit, one stderr line matching
refused() {
    local what=$1 pat=$2; shift 2
    local err rc
    err=$(lim "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ $rc -ne 124 ] && echo "$err" | grep -q -- "$pat" &&
       [ "$(echo "$err" | wc -l)" -eq 1 ]; then
        ok "$what: $err"
    else
        bad "$what (exit $rc): $err"
    fi
}

for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog"; done > "$dir/a.txt"
check "prepare" "$bin" prepare --tokenizer bytes --out "$dir/data" --val-fraction 0.1 "$dir/a.txt" > /dev/null
tiny=(--model tiny --vocab 256 --context 32 --seq-len 32 --batch 2 --warmup 1 --val-every 0 --quiet)
check "train with a checkpoint" bounded "$bin" train "${tiny[@]}" --steps 2 --save-every 2 \
    --train "$dir/data/train_*.bin" --out "$dir/run" > /dev/null

# FIFOs (no writer: open(2) without O_NONBLOCK waits for one forever)
mkfifo "$dir/fifo"
refused "--train FIFO" "token shard .*fifo is not a regular file (a FIFO)" \
    "$bin" train "${tiny[@]}" --steps 1 --train "$dir/fifo"
refused "--val FIFO" "token shard .*fifo is not a regular file (a FIFO)" \
    "$bin" train "${tiny[@]}" --steps 1 --train "$dir/data/train_*.bin" --val "$dir/fifo"
refused "--init-from FIFO" "init-from: checkpoint .*fifo is not a regular file (a FIFO)" \
    "$bin" train --steps 1 --train "$dir/data/train_*.bin" --init-from "$dir/fifo"
refused "prepare FIFO" "text file .*fifo is not a regular file (a FIFO)" \
    "$bin" prepare --tokenizer bytes --out "$dir/data2" "$dir/fifo"
gpt2=$(cd "$(dirname "$0")/../data/gpt2" && pwd)
refused "tokenizer encode FIFO" "input .*fifo is not a regular file (a FIFO)" \
    "$bin" tokenizer encode --tokenizer "$gpt2" "$dir/fifo"
check "tokenizer encode - still reads stdin" \
    sh -c "echo hi | timeout 20 '$bin' tokenizer encode --tokenizer '$gpt2' - | grep -qx '5303 198'"
refused "generate --checkpoint FIFO" "checkpoint .*fifo is not a regular file (a FIFO)" \
    "$bin" generate --checkpoint "$dir/fifo" --tokenizer bytes --prompt hi
mkdir -p "$dir/tokfifo" && mkfifo "$dir/tokfifo/encoder.json" && touch "$dir/tokfifo/vocab.bpe"
refused "tokenizer directory with a FIFO encoder.json" "encoder.json is not a regular file" \
    "$bin" tokenizer encode --tokenizer "$dir/tokfifo" --text hi
refused "inspect FIFO" "file .*fifo is not a regular file (a FIFO)" "$bin" inspect "$dir/fifo"
refused "plan --profile FIFO" "profile .*fifo is not a regular file (a FIFO)" \
    "$bin" plan --model d6 --devices 2 --profile "$dir/fifo"
mkdir -p "$dir/cmpfifo" && mkfifo "$dir/cmpfifo/metrics.jsonl"
check "compare with a FIFO metrics.jsonl: exit 2 in bounded time" \
    sh -c "lim() { timeout -s KILL 20 \"\$@\"; }; lim '$bin' compare '$dir/cmpfifo' '$dir/cmpfifo' > /dev/null 2>&1; test \$? -eq 2"
refused "a directory as --init-from" "is not a regular file (a directory)" \
    "$bin" train --steps 1 --train "$dir/data/train_*.bin" --init-from "$dir"

# llm.c checkpoints whose header claims another model than the file holds
llmc() { # llmc FILE maxT V L NH C Vp [NFLOATS [VALUE]]: an llm.c header and NFLOATS floats
    python3 - "$@" <<'EOF'
import struct, sys
a = sys.argv[1:]
hdr = [20240326, 3] + [int(x) for x in a[1:7]] + [0] * 248
n = int(a[7]) if len(a) > 7 else 0
v = float(a[8]) if len(a) > 8 else 0.0
with open(a[0], "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%df" % n, *([v] * n)))
EOF
}
llmc "$dir/huge.bin" 1024 256 2147483647 12 768 256 1000
refused "generate: model.bin claiming L=2147483647" "huge.bin: model too large: layers 2147483647" \
    "$bin" generate --checkpoint "$dir/huge.bin" --tokenizer bytes --prompt hi
llmc "$dir/short.bin" 32 256 2 4 64 256 1000
refused "generate: a header larger than the file" "short.bin: 5024 bytes, but its header .* needs" \
    "$bin" generate --checkpoint "$dir/short.bin" --tokenizer bytes --prompt hi
# a message that wraps another (l3d_error around l3d_error_message) is not garbled
llmc "$dir/odd.bin" 32 256 2 2 9 256
refused "generate: channels not divisible by heads, message intact" \
    "^llm3d generate: .*odd.bin: channels (9) must be divisible by heads (2), or give the head size (--head-dim)$" \
    "$bin" generate --checkpoint "$dir/odd.bin" --tokenizer bytes --prompt hi
# all-NaN weights: refused, not sampled from
n=$(python3 -c "import os; print((os.path.getsize('$dir/run/model.bin') - 1024) // 4)")
llmc "$dir/nan.bin" 32 256 2 4 64 256 "$n" nan
refused "generate: a model whose weights are NaN" "nan.bin: $n of its $n parameters are not finite" \
    "$bin" generate --checkpoint "$dir/nan.bin" --tokenizer bytes --prompt hi

# llm.c tokenizer file claiming 2^24 tokens in 1 KiB
python3 -c "import struct; open('$dir/tok.bin','wb').write(struct.pack('<256I', 20240328, 2, 1 << 24, 0, *([0] * 252)))"
refused "llm.c tokenizer claiming 2^24 tokens" "tok.bin is 1024 bytes, too short for the 16777216 tokens" \
    "$bin" tokenizer decode --tokenizer "$dir/tok.bin" "$dir/data/train_000000.bin"

# training-checkpoint manifests (format 3 without the checksum line, so that the edit itself is
# what is checked: the format-4 checksum is tested in ckpt.sh)
step=$dir/run/checkpoints/step_00000002
mf() { # mf NAME SED: a copy of the checkpoint with its manifest edited
    rm -rf "${dir:?}/$1" && cp -r "$step" "$dir/$1" &&
        sed -i -e '1s/^llm3d-checkpoint format 4$/llm3d-checkpoint format 3/' -e '/^checksum /d' \
            -e "$2" "$dir/$1/manifest"
}
mf bigL 's/^model L 2 /model L 2097152 /'
refused "convert: manifest claiming L=2097152" "bigL/manifest line [0-9]*: model L=2097152 .*model too large" \
    "$bin" convert "$dir/bigL" "$dir/out.bin"
mf world 's/^layout world 1 /layout world 1048576 /'
refused "convert: manifest claiming a world of 2^20 ranks" "world/manifest: a world of 1048576 ranks" \
    "$bin" convert "$dir/world" "$dir/out.bin"
mf layers 's/ layers 0+2 / layers 0+5 /'
refused "convert: a shard outside the model, message intact" \
    "^llm3d convert: .*layers/manifest: rank_00000.bin: shard layers \[0, 5) outside the model's 2 layers$" \
    "$bin" convert "$dir/layers" "$dir/out.bin"
mf twice '/^model /p'
refused "convert: a record twice" "twice/manifest line [0-9]*: a second 'model' record" \
    "$bin" convert "$dir/twice" "$dir/out.bin"
mf runid 's/^run \([0-9a-f]*\)$/run \1x/'
refused "convert: a run id that is not 16 hex digits" \
    "runid/manifest line [0-9]*: run '[0-9a-f]*x' is not a 16-digit hex" \
    "$bin" convert "$dir/runid" "$dir/out.bin"
rm -rf "$dir/mfifo" && cp -r "$step" "$dir/mfifo" && rm "$dir/mfifo/manifest" && mkfifo "$dir/mfifo/manifest"
refused "convert: a FIFO manifest" "manifest .*is not a regular file (a FIFO)" \
    "$bin" convert "$dir/mfifo" "$dir/out.bin"
check "  ... nothing written" test ! -e "$dir/out.bin"
# --resume DIR reads the run id of DIR's manifest before anything else (out/run): a manifest
# that is a link to /dev/zero (endless, no newline) or a FIFO (no writer) is refused unread, and
# so are a checkpoint directory's `latest` and a run's metrics.jsonl that a resume would read
rm -rf "$dir/mzero" && cp -r "$step" "$dir/mzero" && rm "$dir/mzero/manifest" && ln -s /dev/zero "$dir/mzero/manifest"
refused "train --resume: a manifest linked to /dev/zero" \
    "^llm3d train: --resume: checkpoint manifest .*mzero/manifest is not a regular file (a device)" \
    "$bin" train "${tiny[@]}" --steps 4 --train "$dir/data/train_*.bin" --out "$dir/rz" --resume "$dir/mzero"
refused "train --resume: a FIFO manifest" \
    "^llm3d train: --resume: checkpoint manifest .*mfifo/manifest is not a regular file (a FIFO)" \
    "$bin" train "${tiny[@]}" --steps 4 --train "$dir/data/train_*.bin" --out "$dir/rf" --resume "$dir/mfifo"
rm -rf "$dir/lfifo" && cp -r "$dir/run" "$dir/lfifo" && rm "$dir/lfifo/checkpoints/latest" && mkfifo "$dir/lfifo/checkpoints/latest"
refused "train --resume auto: a FIFO latest" "^llm3d train: --resume: .*latest is not a regular file (a FIFO)" \
    "$bin" train "${tiny[@]}" --steps 4 --train "$dir/data/train_*.bin" --out "$dir/lfifo" --resume auto
refused "inspect: a FIFO latest" "^llm3d inspect: .*latest is not a regular file (a FIFO)" \
    "$bin" inspect "$dir/lfifo/checkpoints"
rm -rf "$dir/metfifo" && cp -r "$dir/run" "$dir/metfifo" && rm "$dir/metfifo/metrics.jsonl" && mkfifo "$dir/metfifo/metrics.jsonl"
refused "train --resume auto: a FIFO metrics.jsonl" "^llm3d train: .*metrics.jsonl is not a regular file (a FIFO)" \
    "$bin" train "${tiny[@]}" --steps 4 --train "$dir/data/train_*.bin" --out "$dir/metfifo" --resume auto

# Hugging Face folders (a hostile-input probe): an index of no tensor crashed all four readers
# (segfault); a 0.5 MB folder whose config.json claims a 4M-token vocabulary allocated 1 GiB
# before its shape error (under this limit: "no memory for its weights"); a temporary name taken
# by a directory aborted convert and train --out ("free(): invalid pointer")
mkdir -p "$dir/hfempty" && cp "$dir/run/config.json" "$dir/hfempty/" &&
    echo '{"weight_map": {}}' > "$dir/hfempty/model.safetensors.index.json"
empty='hfempty/model.safetensors.index.json: "weight_map" is empty'
refused "inspect: an empty weight_map" "^llm3d inspect: .*$empty" "$bin" inspect "$dir/hfempty"
refused "convert: an empty weight_map" "^llm3d convert: .*$empty" \
    "$bin" convert "$dir/hfempty" "$dir/hfempty.bin"
refused "generate: an empty weight_map" "^llm3d generate: .*$empty" \
    "$bin" generate --init-from "$dir/hfempty" --tokenizer bytes --prompt hi
refused "train --init-from: an empty weight_map" "^llm3d train: --init-from: .*$empty" \
    "$bin" train --steps 1 --train "$dir/data/train_*.bin" --init-from "$dir/hfempty"
mkdir -p "$dir/hfbig" && cp "$dir/run/config.json" "$dir/run/model.safetensors" "$dir/hfbig/" &&
    sed -i 's/"vocab_size": 256,/"vocab_size": 4194304,/' "$dir/hfbig/config.json"
big='hfbig/model.safetensors: tensor transformer.wte.weight has shape \[256, 64\], but .*hfbig/config.json needs \[4194304, 64\]'
# under 1 GB of address space (not sanitized: AddressSanitizer reserves terabytes of shadow)
vlim=1000000
sanitized && vlim=unlimited
refused "inspect: config.json claims 4M tokens (address space: $vlim KiB)" "^llm3d inspect: .*$big" \
    sh -c "ulimit -v $vlim && exec '$bin' inspect '$dir/hfbig'"
refused "train --init-from: config.json claims 4M tokens" "^llm3d train: --init-from: .*$big" \
    sh -c "ulimit -v $vlim && exec '$bin' train --steps 1 --train '$dir/data/train_*.bin' --init-from '$dir/hfbig'"
# a directory at the writer's old fixed temporary name aborted the save (a double free): names
# are new each time now, so the save goes on and leaves the directory; a folder that cannot be
# made is one line
mkdir -p "$dir/taken/.model.safetensors"
check "convert: a directory at the old temporary's name: saved, the directory kept" \
    sh -c "'$bin' convert '$dir/run/model.bin' '$dir/taken' > /dev/null && [ -s '$dir/taken/model.safetensors' ] && [ -d '$dir/taken/.model.safetensors' ]"
check "train --out: the same" \
    sh -c "'$bin' train ${tiny[*]} --steps 1 --train '$dir/data/train_*.bin' --out '$dir/taken' --overwrite > /dev/null && [ -d '$dir/taken/.model.safetensors' ]"
echo x > "$dir/afile"
refused "convert into a folder under a file" "^llm3d convert: cannot use .*/afile as the output directory: it exists and is not a directory" \
    "$bin" convert "$dir/run/model.bin" "$dir/afile/sub"

# a flag error under mpiexec: said once, by rank 0
err=$(lim "$mpiexec" -n 2 "$bin" train --batch 0 --train "$dir/data/train_*.bin" 2>&1 >/dev/null)
check "a flag error under mpiexec -n 2 is printed once: $(echo "$err" | grep '^llm3d' | head -1)" \
    test "$(echo "$err" | grep -c '^llm3d train: --batch 0 is out of range')" -eq 1
err=$(lim "$mpiexec" -n 2 "$bin" train --steps 1 --train "$dir/fifo" 2>&1 >/dev/null)
check "a FIFO under mpiexec -n 2: refused once, in bounded time: $(echo "$err" | grep '^llm3d' | head -1)" \
    test "$(echo "$err" | grep -c '^llm3d train: token shard .* is not a regular file (a FIFO)')" -eq 1
err=$(lim "$mpiexec" -n 2 "$bin" train --steps 1 --train "$dir/data/train_*.bin" --init-from "$dir/fifo" 2>&1 >/dev/null)
check "--init-from FIFO under mpiexec -n 2: refused once: $(echo "$err" | grep '^llm3d' | head -1)" \
    test "$(echo "$err" | grep -c '^llm3d train: --init-from: checkpoint .* is not a regular file')" -eq 1
exit $fail
