#!/usr/bin/env bash
# Checkpoints end to end (include/llm3d/ckpt.h): exact resume on the same layout (bit for bit),
# resume on other layouts (re-sliced weights and AdamW moments; the continued losses and final
# weights match the uninterrupted single-process run within fp32 round-off), both with several
# model chunks per rank (interleaved pipelines) and without, save-load-save round trip,
# keep-last-K, resume auto, bad files (one clear error, nothing overwritten), checkpoints of the
# older formats 1 and 2 (tests/data/ckpt_v1, ckpt_v2), a dtype this build cannot load, a writer
# killed mid-save, preemption signals, llm3d convert. Usage: ckpt.sh LLM3D SCRATCH_DIR; ctest sets
# L3D_MPIEXEC to the launcher of the MPI the binary was built with.
# ok, bad, check, full, fail; `full &&` runs repeat a code path of another run (another layout
# through the same re-slicing code, another crash point, another signal)
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus checkpoint

# train OUT NP B [flags], train_cmd (sets CMD): NP ranks (0 = no launcher), B sequences per rank,
# 10 steps (the equivalence settings of equiv.sh, which explains eps 1e-6)
TRAIN_FLAGS=("${TINY[@]}" --steps 10 --warmup 3 --lr 1e-3 --eps 1e-6)
step_dir() { printf '%s/%s/checkpoints/step_%08d' "$dir" "$1" "$2"; }
# same_files A B: every rank file of step directory A equals B's, byte for byte
same_files() {
    local f n=0
    for f in "$1"/rank_*.bin; do cmp -s "$f" "$2/$(basename "$f")" || return 1; n=$((n + 1)); done
    [ "$n" -gt 0 ] && [ "$n" -eq "$(ls "$2"/rank_*.bin | wc -l)" ]
}
# resumed NAME FROM_STEP_DIR NP B [flags]: a run continued from a checkpoint in its own output
# directory, holding the saver's metrics (trimmed to the checkpoint's step by the resume)
resumed() {
    local name=$1 from=$2 np=$3 b=$4
    shift 4
    rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name"
    cp "$dir/ref/metrics.jsonl" "$dir/$name/"
    train "$name" "$np" "$b" --resume "$from" "$@" > "$dir/$name.log" 2>&1
}
compare() { # compare NAME RTOL: against the uninterrupted single-process run
    "$bin" compare --rtol "$2" "$dir/$1" "$dir/ref" > "$dir/$1.cmp" 2>&1
}

# the uninterrupted single-process run, checkpoints at steps 5 and 10
train ref 0 4 --save-every 5 > "$dir/ref.log" 2>&1 || { cat "$dir/ref.log"; exit 1; }

# exact resume on the same layout: bit-identical losses, weights and step-10 checkpoint
if resumed exact1 "$(step_dir ref 5)" 0 4 --save-every 5 && compare exact1 0 &&
   same_files "$(step_dir exact1 10)" "$(step_dir ref 10)" && cmp -s "$dir/exact1/model.bin" "$dir/ref/model.bin"; then
    ok "exact resume 1x1x1 ($(tr '\n' ' ' < "$dir/exact1.cmp"))"
else
    bad "exact resume 1x1x1"; cat "$dir/exact1.log" "$dir/exact1.cmp"
fi

# host staging of device memory in 1000-byte transfers (L3D_CKPT_TEST_STAGE; 64 MiB otherwise),
# so that every tensor takes many: the exact resume is bit-identical again, a rank reading its
# shard from another rank's file (dp2 ZeRO-1 from 1x1x1) continues like the reference, and an
# llm.c file loads (--init-from) as it does through one transfer
if L3D_CKPT_TEST_STAGE=1000 resumed stage1 "$(step_dir ref 5)" 0 4 --save-every 5 && compare stage1 0 &&
   same_files "$(step_dir stage1 10)" "$(step_dir ref 10)"; then
    ok "exact resume 1x1x1 through 1000-byte staging: identical losses, weights and checkpoint"
else
    bad "exact resume through 1000-byte staging"; cat "$dir/stage1.log" "$dir/stage1.cmp"
fi
if L3D_CKPT_TEST_STAGE=1000 resumed stage2 "$(step_dir ref 5)" 2 2 --zero 1 && compare stage2 1e-5; then
    ok "1x1x1 resumed as dp2 ZeRO-1 through 1000-byte staging ($(tr '\n' ' ' < "$dir/stage2.cmp"))"
else
    bad "resume as dp2 ZeRO-1 through 1000-byte staging"; cat "$dir/stage2.log" "$dir/stage2.cmp"
fi
train init1 0 4 --steps 2 --init-from "$dir/ref/model.bin" > "$dir/init1.log" 2>&1
L3D_CKPT_TEST_STAGE=1000 train init2 0 4 --steps 2 --init-from "$dir/ref/model.bin" > "$dir/init2.log" 2>&1
check "--init-from through 1000-byte staging: the same run" cmp -s "$dir/init1/model.bin" "$dir/init2/model.bin"

# saved under tp 2 x dp 2 with ZeRO-1
train A 4 2 --tp 2 --zero 1 --save-every 5 > "$dir/A.log" 2>&1 || { cat "$dir/A.log"; exit 1; }
if resumed exactA "$(step_dir A 5)" 4 2 --tp 2 --zero 1 --save-every 5 &&
   same_files "$(step_dir exactA 10)" "$(step_dir A 10)" && cmp -s "$dir/exactA/model.bin" "$dir/A/model.bin"; then
    ok "exact resume tp2 x dp2 ZeRO-1: identical step-10 checkpoint and weights"
else
    bad "exact resume tp2 x dp2 ZeRO-1"; cat "$dir/exactA.log"
fi

# reshard NAME NP B [flags]: resume A's step 5 under another layout; matches the reference run
# within 3e-5, equiv.sh's bound for TP layouts: A's first five steps ran under tp 2, whose other
# product shapes round otherwise (an AMD EPYC machine, 2026-12-07: ln2b 1.22e-5 after every
# resume here; A's layout for all ten steps against one process at seeds 1-7: 3e-6 to 2.2e-5,
# losses 5e-8; a layout that lost a shard or a moment differs by 1e-3 or more)
reshard() {
    local name=$1 np=$2 b=$3
    shift 3
    if resumed "$name" "$(step_dir A 5)" "$np" "$b" "$@" && compare "$name" 3e-5; then
        ok "resume tp2 x dp2 ZeRO-1 as $name ($(tr '\n' ' ' < "$dir/$name.cmp"))"
    else
        bad "resume as $name"; cat "$dir/$name.log" "$dir/$name.cmp" 2>/dev/null
    fi
}
# other shards: full tensors assembled and cut (1x1x1, 4x1x1, 1x1x4, 1x1x2 ZeRO-2); the same
# shards with other optimizer ranges (2x1x1: each rank gathers the ranges of two saved files); the
# same shards and ranges under another ZeRO stage (2x1x2 ZeRO-2: each rank reads its own file)
reshard 1x1x1 0 4
full && reshard 4x1x1 4 4 --tp 4
full && reshard 1x1x4 4 1
reshard 1x1x2_zero2 2 2 --zero 2
reshard 2x1x1 2 4 --tp 2
full && reshard 2x1x2_zero2 4 2 --tp 2 --zero 2
reshard 1x2x1 2 4 --pp 2
full && reshard 2x2x1_selective 4 4 --tp 2 --pp 2 --recompute selective

# the 3D case: saved under tp 2 x pp 2 x dp 2 with ZeRO-1 (8 ranks; 4 layers, so that 4 pipeline
# stages fit), resumed as 1x1x1, 4x1x2, 1x4x1 and 2x1x4; each continues like one process
train ref4 0 4 --layers 4 > "$dir/ref4.log" 2>&1 || { cat "$dir/ref4.log"; exit 1; }
train P 8 2 --layers 4 --tp 2 --pp 2 --zero 1 --save-every 5 > "$dir/P.log" 2>&1 || { cat "$dir/P.log"; exit 1; }
# resume_as WHAT FROM REF NAME NP B [flags]: FROM's step 5 resumed under another layout (4 layers);
# matches the uninterrupted single-process run REF within RTOL (1e-5)
resume_as() {
    local what=$1 from=$2 ref=$3 name=$4 np=$5 b=$6
    shift 6
    rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name"
    cp "$dir/$ref/metrics.jsonl" "$dir/$name/"
    if train "$name" "$np" "$b" --layers 4 --resume "$(step_dir "$from" 5)" "$@" > "$dir/$name.log" 2>&1 &&
       "$bin" compare --rtol "${RTOL:-1e-5}" "$dir/$name" "$dir/$ref" > "$dir/$name.cmp" 2>&1; then
        ok "resume $what as $name ($(tr '\n' ' ' < "$dir/$name.cmp"))"
    else
        bad "resume $what as $name"; cat "$dir/$name.log" "$dir/$name.cmp" 2>/dev/null
    fi
}
# NAME NP B [flags]; 4e-5 as for pp2 x tp2 x zbv in equiv.sh: the first 5 steps ran under tp x pp
# (qkvb, the key bias whose gradient is round-off alone, measured 1.58e-5 of its scale, then
# 3.22e-5 after the vectorised GELU and the 4-stream gradient norm moved the trajectory; losses
# identical, norms within 8e-8)
reshard3d() { RTOL=4e-5 resume_as "tp2 x pp2 x dp2 ZeRO-1" P ref4 "$@"; }
reshard3d 1x1x1_from_3d 0 4
full && reshard3d 4x1x2_from_3d 8 2 --tp 4 --dp 2 --zero 1
reshard3d 1x4x1_from_3d 4 4 --pp 4
full && reshard3d 2x1x4_from_3d 8 1 --tp 2 --zero 1
# into an interleaved layout: 2 chunks per rank, each cut from the assembled model
reshard3d pp2_v2_from_3d 2 2 --pp 2 --pp-virtual 2 --grad-accum 2

# saved under an interleaved schedule, pp 2 with 2 chunks per rank (format 2: a file per rank and
# chunk), 2 micro-batches; the reference run has the same global batch and accumulation
interleaved=(--layers 4 --pp 2 --pp-virtual 2 --grad-accum 2)
train refV 0 4 --layers 4 --grad-accum 2 > "$dir/refV.log" 2>&1 || { cat "$dir/refV.log"; exit 1; }
train V 2 4 "${interleaved[@]}" --save-every 5 > "$dir/V.log" 2>&1 || { cat "$dir/V.log"; exit 1; }
rm -rf "$dir/exactV" && mkdir -p "$dir/exactV" && cp "$dir/V/metrics.jsonl" "$dir/exactV/"
if grep -q "^layout world 2 tp 1 pp 2 dp 1 zero 0 sp 0 virtual 2$" "$(step_dir V 5)/manifest" &&
   [ "$(ls "$(step_dir V 5)"/rank_*_c*.bin | wc -l)" -eq 4 ] &&
   train exactV 2 4 "${interleaved[@]}" --save-every 5 --resume "$(step_dir V 5)" > "$dir/exactV.log" 2>&1 &&
   "$bin" compare --rtol 0 "$dir/exactV" "$dir/V" > "$dir/exactV.cmp" 2>&1 &&
   same_files "$(step_dir exactV 10)" "$(step_dir V 10)" && cmp -s "$dir/exactV/model.bin" "$dir/V/model.bin"; then
    ok "exact resume pp2 x 2 chunks: identical losses, step-10 checkpoint (4 files) and weights"
else
    bad "exact resume pp2 x 2 chunks"; cat "$dir/exactV.log" "$dir/exactV.cmp" 2>/dev/null
fi
resume_as "pp2 x 2 chunks" V refV 1x1x1_from_v2 0 4 --grad-accum 2
# into zbv's V: the same 4 stages, rank 0 now holding the first and the last (its chunk 1 cut
# from the interleaved run's rank 1 chunk 1): it continues as the reference
resume_as "pp2 x 2 chunks" V refV zbv_from_v2 2 4 --pp 2 --pp-virtual 2 --pp-schedule zbv --grad-accum 2
full && resume_as "pp2 x 2 chunks" V refV 2x2x2_v2_from_v2 8 2 --tp 2 --pp 2 --pp-virtual 2 --dp 2 --zero 1 --grad-accum 2

# save-load-save: A's step 5 re-saved as 1x1x1 (no step left to run), then back as tp2 x dp2
# ZeRO-1: the same rank files, byte for byte; and the 1x1x1 copy continues like the reference
if resumed rt1 "$(step_dir A 5)" 0 4 --steps 5 --save-every 5 &&
   resumed rt2 "$(step_dir rt1 5)" 4 2 --tp 2 --zero 1 --steps 5 --save-every 5 &&
   same_files "$(step_dir rt2 5)" "$(step_dir A 5)"; then
    ok "save-load-save tp2 x dp2 -> 1x1x1 -> tp2 x dp2: identical rank files"
else
    bad "save-load-save round trip"; cat "$dir/rt1.log" "$dir/rt2.log"
fi
if resumed rt3 "$(step_dir rt1 5)" 2 2 --zero 1 && compare rt3 3e-5; then # A's tp 2 (reshard)
    ok "re-saved 1x1x1 copy resumes as dp2 ZeRO-1 ($(tr '\n' ' ' < "$dir/rt3.cmp"))"
else
    bad "re-saved copy resumes"; cat "$dir/rt3.log" "$dir/rt3.cmp"
fi

# keep the newest K; resume auto: fresh without a checkpoint, then from `latest`
train keep 0 4 --save-every 2 --keep 2 --resume auto > "$dir/keep.log" 2>&1
check "keep 2: only steps 8 and 10 left" test "$(cd "$dir/keep/checkpoints" && echo step_*)" = "step_00000008 step_00000010"
check "latest names step 10" test "$(cat "$dir/keep/checkpoints/latest")" = step_00000010
check "resume auto without a checkpoint starts fresh" grep -q "starting fresh" "$dir/keep.log"
train keep 0 4 --save-every 2 --keep 2 --resume auto > "$dir/keep2.log" 2>&1
check "resume auto at the end: nothing to run, re-saved" grep -q "resumed .*step_00000010: step 10" "$dir/keep2.log"
check "  ... metrics kept, same model" compare keep 0

# bad files: one message naming the file, exit 1, the checkpoint and the run's files unchanged
# resume_refused DESCRIPTION PATTERN STEP_DIR NP B [flags]: resuming STEP_DIR fails with one
# message (expect_error --once: mpiexec adds its own lines about the exit status); STEP_DIR's files,
# the run's metrics unchanged, no checkpoint written
resume_refused() {
    local what=$1 pat=$2 from=$3 np=$4 b=$5
    shift 5
    local out="bad_$((++nbad))"
    rm -rf "${dir:?}/$out" && mkdir -p "$dir/$out" && cp "$dir/ref/metrics.jsonl" "$dir/$out/"
    local before after
    before=$(cd "$from" 2>/dev/null && md5sum ./*)
    expect_error --once "$what" "$pat" train "$out" "$np" "$b" --resume "$from" "$@"
    after=$(cd "$from" 2>/dev/null && md5sum ./*)
    if [ "$before" = "$after" ] && cmp -s "$dir/$out/metrics.jsonl" "$dir/ref/metrics.jsonl" &&
       [ ! -e "$dir/$out/checkpoints" ]; then
        ok "  ... its files and the run's unchanged, no checkpoint written"
    else
        bad "  ... $what: the checkpoint's files or the run's changed:"; ls -l "$from" "$dir/$out"
    fi
}
nbad=0
convert_err() { "$bin" convert "$1" "$dir/none.bin" 2>&1 >/dev/null && echo "(exit 0)"; }
copy() { rm -rf "${dir:?}/$1" && cp -r "$(step_dir A 5)" "$dir/$1"; }
copy trunc && truncate -s -100 "$dir/trunc/rank_00001.bin"
resume_refused "truncated shard" "rank_00001.bin.*truncated" "$dir/trunc" 0 4
copy flip && printf '\x5a' | dd of="$dir/flip/rank_00002.bin" bs=1 seek=1000 conv=notrunc status=none
resume_refused "checksum mismatch" "rank_00002.bin: checksum" "$dir/flip" 0 4
copy flip3 && printf '\x5a' | dd of="$dir/flip3/rank_00003.bin" bs=1 seek=1000 conv=notrunc status=none
resume_refused "checksum mismatch, found by rank 1 of 2" "rank_00003.bin: checksum" "$dir/flip3" 2 4 --tp 2
resume_refused "incompatible model" "holds a model L=2.*configured L=3" "$(step_dir A 5)" 0 4 --layers 3
copy missing && rm "$dir/missing/rank_00003.bin"
resume_refused "missing rank file" "rank_00003.bin.*missing" "$dir/missing" 0 4
# unseal M: make M a format-3 manifest (no checksum line), so that the check an edit meets is the
# one under test, not the manifest's checksum (format 4); the rank files still say format 4, so
# such a manifest never loads: each edit below is refused before any rank file is read
unseal() { sed -i -e '1s/^llm3d-checkpoint format 4$/llm3d-checkpoint format 3/' -e '/^checksum /d' "$1"; }
copy layout && sed -i 's/^layout world 4 tp 2 pp 1 dp 2/layout world 4 tp 1 pp 4 dp 1/' "$dir/layout/manifest"
unseal "$dir/layout/manifest"
resume_refused "layout impossible for the model" "pp 4 is impossible for the model" "$dir/layout" 0 4
# the manifest's own checksum (format 4): an edited layout index or AdamW t, a dropped checksum
# line, a downgrade to format 3 (the rank files' headers still say 4)
copy edit_t && sed -i 's/ t 5$/ t 6/' "$dir/edit_t/manifest"
check "  ... (the edit applies)" grep -q " t 6$" "$dir/edit_t/manifest"
resume_refused "manifest edited: AdamW t" "edit_t/manifest: its checksum is .* the manifest was edited" "$dir/edit_t" 0 4
copy edit_idx && sed -i 's/^data epoch 0 index \([0-9]*\)/data epoch 0 index 1\1/' "$dir/edit_idx/manifest"
check "  ... (the edit applies)" sh -c "! cmp -s '$dir/edit_idx/manifest' '$(step_dir A 5)/manifest'"
resume_refused "manifest edited: data index" "edit_idx/manifest: its checksum is" "$dir/edit_idx" 0 4
copy nosum && sed -i '/^checksum /d' "$dir/nosum/manifest"
resume_refused "manifest without its checksum line" "nosum/manifest: no 'checksum' line" "$dir/nosum" 0 4
copy down && sed -i 's/ t 5$/ t 6/' "$dir/down/manifest" && unseal "$dir/down/manifest"
resume_refused "manifest edited and downgraded to format 3" "rank_0000[0-3].bin: its header does not match" "$dir/down" 0 4
err=$(convert_err "$dir/edit_t")
check "convert: an edited manifest: $err" sh -c "echo '$err' | grep -q 'edit_t/manifest: its checksum'"
copy cut && head -n 5 "$(step_dir A 5)/manifest" > "$dir/cut/manifest"
resume_refused "truncated manifest" "manifest.*truncated\|manifest: no" "$dir/cut" 0 4
resume_refused "resume layout impossible for the model" "\-\-tp 3" "$(step_dir A 5)" 0 4 --tp 3 --dp 1
resume_refused "no checkpoint there" "no checkpoint there" "$dir/nonexistent" 0 4
# convert's errors speak of convert's arguments, not of --resume
err=$(convert_err "$dir/nonexistent")
check "convert: no checkpoint there: $err" sh -c "echo '$err' | grep -q 'nonexistent: no checkpoint there' && ! echo '$err' | grep -q resume"
err=$(convert_err "$dir/missing")
check "convert: a missing rank file: $err" sh -c "echo '$err' | grep -q 'rank_00003.bin.*missing' && ! echo '$err' | grep -q resume"
copyV() { rm -rf "${dir:?}/$1" && cp -r "$(step_dir V 5)" "$dir/$1"; }
copyV missingV && rm "$dir/missingV/rank_00001_c1.bin"
resume_refused "missing chunk file" "rank_00001_c1.bin.*missing" "$dir/missingV" 0 4 --layers 4 --grad-accum 2
copyV swapV && mv "$dir/swapV/rank_00000_c1.bin" "$dir/swapV/x" &&
    mv "$dir/swapV/rank_00001_c0.bin" "$dir/swapV/rank_00000_c1.bin" && mv "$dir/swapV/x" "$dir/swapV/rank_00001_c0.bin"
resume_refused "chunk files swapped (same size)" "rank_00000_c1.bin: its header does not match" "$dir/swapV" 0 4 --layers 4 --grad-accum 2
# dtypes (format 3): the manifest names the stored types; another one than the run's is refused
# before any rank file is read (the edited manifest needs no other change)
check "format 3 manifest records the dtypes" grep -qx "dtype params fp32 moments fp32" "$(step_dir A 5)/manifest"
check "  ... and the rank-file header (bytes 64..79)" \
    test "$(dd if="$(step_dir A 5)/rank_00000.bin" bs=1 skip=64 count=16 status=none | tr '\0' .)" = "fp32....fp32...."
copy bf16 && sed -i 's/^dtype params fp32/dtype params bf16/' "$dir/bf16/manifest" && unseal "$dir/bf16/manifest"
resume_refused "bf16 parameters into an fp32 run" "bf16/manifest stores the parameters as bf16.*fp32.*resume it with" "$dir/bf16" 0 4
copy bf16m && sed -i 's/^dtype params fp32 moments fp32/dtype params fp32 moments bf16/' "$dir/bf16m/manifest" && unseal "$dir/bf16m/manifest"
resume_refused "bf16 moments into an fp32 run" "bf16m/manifest stores the AdamW moments as bf16" "$dir/bf16m" 0 4
copy fp8 && sed -i 's/^dtype params fp32/dtype params fp8/' "$dir/fp8/manifest"
resume_refused "unknown dtype" "params dtype 'fp8' is not one of" "$dir/fp8" 0 4
copy nodtype && sed -i '/^dtype /d' "$dir/nodtype/manifest" && unseal "$dir/nodtype/manifest"
resume_refused "format 3 without its dtype record" "no 'dtype' record" "$dir/nodtype" 0 4
copy fmt5 && sed -i '1s/format 4/format 5/' "$dir/fmt5/manifest"
resume_refused "a newer format" "format version 5; this llm3d reads versions 1 to 4" "$dir/fmt5" 0 4
# the checksum guards against damage, not against an edit that recomputes it: the values meet
# their ranges too (every field: tests/test_manifest.c). reseal DIR: DIR's manifest with the
# checksum of its text recomputed by the documented hash (src/ckpt: four lanes of xxHash64's
# round over 32-byte little-endian blocks, the tail zero-padded to one more block, the length and
# the lanes folded by SplitMix64's finaliser), written here again so that the test does not take
# llm3d's word for it
reseal() {
    python3 - "$1/manifest" <<'PY'
import struct, sys
M = (1 << 64) - 1
P1, P2 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F
def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)
def block(lanes, b):
    for i, w in enumerate(struct.unpack("<4Q", b)):
        x = (lanes[i] + w * P2) & M
        lanes[i] = ((((x << 31) | (x >> 33)) & M) * P1) & M
def digest(data):
    lanes = [(P1 * (i + 1)) & M for i in range(4)]
    full = len(data) // 32 * 32
    for k in range(0, full, 32):
        block(lanes, data[k:k + 32])
    block(lanes, data[full:].ljust(32, b"\0"))
    r = mix(len(data))
    for x in lanes:
        r = mix(r ^ x)
    return r
text = open(sys.argv[1], "rb").read()
at = text.index(b"\nchecksum ") + 1
rest = text[text.index(b"\n", at):]
open(sys.argv[1], "wb").write(text[:at] + b"checksum %016x" % digest(text[:at]) + rest)
PY
}
resealed() { # resealed NAME SED: a copy of A's step 5, edited by SED, its checksum recomputed
    copy "$1" && sed -i "$2" "$dir/$1/manifest" && ! cmp -s "$dir/$1/manifest" "$(step_dir A 5)/manifest" &&
        reseal "$dir/$1"
}
check "  ... the test's checksum of an unedited manifest is llm3d's" \
    eval "copy reseal_same && reseal '$dir/reseal_same' && cmp -s '$dir/reseal_same/manifest' '$(step_dir A 5)/manifest'"
check "  ... a resealed manifest passes its checksum (t 6)" \
    eval "resealed reseal_ok 's/ t 5\$/ t 6/' && '$bin' inspect '$dir/reseal_ok' > /dev/null"
resealed neg_t 's/ t 5$/ t -4/'
resume_refused "resealed manifest: AdamW t -4" "neg_t/manifest line [0-9]*: adamw t '-4' is not a whole number in \[0, " "$dir/neg_t" 0 4
resealed seed 's/ seed [0-9]*$/ seed abc/'
resume_refused "resealed manifest: seed abc" "seed/manifest line [0-9]*: data seed 'abc' is not a whole number" "$dir/seed" 0 4
resealed b0 's/ B [0-9]* / B 0 /'
resume_refused "resealed manifest: B 0" "b0/manifest line [0-9]*: data B '0' is not a whole number in \[1, " "$dir/b0" 0 4
resealed lrnan 's/ max_lr [^ ]* / max_lr nan /'
resume_refused "resealed manifest: max_lr nan" "lrnan/manifest line [0-9]*: schedule max_lr 'nan' is not a finite number" "$dir/lrnan" 0 4
err=$("$bin" convert "$dir/bf16" "$dir/bf16.bin" 2>&1 >/dev/null)
check "convert refuses bf16 parameters: $err" test -n "$(echo "$err" | grep "stores the parameters as bf16")" -a ! -e "$dir/bf16.bin"

# checkpoints of formats 1 and 2 (fp32, no dtype record, 64-byte headers), written by d270d36
# (tests/data/ckpt_v*/README): resumed on their layout, step 3 has the old binary's loss and
# gradient norm to the last digit (on the attention kernel that binary had, L3D_ATTENTION=naive:
# the tiled kernel sums in another order), and the re-save is format 4
fixtures=$(cd "$(dirname "$0")/../data" && pwd)
old_format() { # old_format N NAME NP [flags]: resume tests/data/ckpt_vN as NAME
    local v=$1 name=$2 np=$3
    shift 3
    rm -rf "${dir:?}/$name"
    local cmd=(env OMP_NUM_THREADS=1 L3D_ATTENTION=naive)
    [ "$np" -gt 0 ] && cmd+=("$mpiexec" -n "$np")
    bounded "${cmd[@]}" "$bin" train --channels 4 --heads 2 --vocab 128 --context 16 --seq-len 16 \
        --warmup 1 --lr 1e-3 --steps 3 --val-every 0 --quiet --peak-gflops 100 \
        --train "$dir/data/train_*.bin" --out "$dir/$name" --save-every 3 \
        --resume "$fixtures/ckpt_v$v/step_00000002" "$@" > "$dir/$name.log" 2>&1
}
step3() { grep -o '"step":3,"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$1"; }
# The gradient norm within 5e-7 relative (about 4 ulp): the build is -march=native, and the norm
# recorded on AVX2 (1.26082486) reads 1.26082484 on an AVX-512 machine; loss and lr stay exact.
# (is_number first: this awk takes "nan" as within any tolerance)
same_step3() { # same_step3 N NAME: NAME's step 3 equals the old binary's resumed from ckpt_vN
    local want got
    want=$(step3 "$fixtures/ckpt_v$1/resumed.jsonl") got=$(step3 "$dir/$2/metrics.jsonl")
    [ -n "$want" ] && [ "${want%,\"grad_norm\"*}" = "${got%,\"grad_norm\"*}" ] &&
        is_number "${got##*:}" && awk -v a="${want##*:}" -v b="${got##*:}" 'BEGIN { d = a - b
            if (d < 0) d = -d; exit !(a > 0 && d <= 5e-7 * a) }' && head -n 1 "$(step_dir "$2" 3)/manifest" | grep -qx "llm3d-checkpoint format 4" ||
        { echo "want $want, got $got"; cat "$dir/$2.log"; return 1; }
}
if old_format 1 old_v1 2 --layers 2 --batch 1 --zero 1 && same_step3 1 old_v1; then
    ok "format 1 (d270d36, dp2 ZeRO-1) resumes: $(step3 "$dir/old_v1/metrics.jsonl")"
else
    bad "format 1 (d270d36) resumes"
fi
if old_format 2 old_v2 2 --layers 4 --batch 2 --pp 2 --pp-virtual 2 --grad-accum 2 && same_step3 2 old_v2; then
    ok "format 2 (d270d36, pp2 x 2 chunks) resumes: $(step3 "$dir/old_v2/metrics.jsonl")"
else
    bad "format 2 (d270d36) resumes"
fi
# re-sliced into one process: the same loss within fp32 round-off (summed in another order)
loss3() { step3 "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
if old_format 2 old_v2_1x1x1 0 --layers 4 --batch 4 --grad-accum 1 &&
   awk -v a="$(loss3 "$dir/old_v2_1x1x1/metrics.jsonl")" -v b="$(loss3 "$fixtures/ckpt_v2/resumed.jsonl")" \
       'BEGIN { d = a - b; exit !(a != "" && b > 0 && (d < 0 ? -d : d) <= 1e-5 * b) }'; then
    ok "format 2 re-sliced as 1x1x1: loss $(loss3 "$dir/old_v2_1x1x1/metrics.jsonl") (d270d36 on pp2 x 2 chunks: $(loss3 "$fixtures/ckpt_v2/resumed.jsonl"))"
else
    bad "format 2 re-sliced as 1x1x1"; cat "$dir/old_v2_1x1x1.log"; step3 "$dir/old_v2_1x1x1/metrics.jsonl"
fi

# a writer killed mid-save (L3D_CKPT_TEST_KILL: that rank SIGKILLs itself at that point), then
# resumed with --resume auto: the previous checkpoint loads and the run ends bit-identical
crash() { # crash NAME STEP:PHASE[:RANK] NP B [flags]
    local name=$1 kill=$2 np=$3 b=$4
    shift 4
    rm -rf "${dir:?}/$name"
    L3D_CKPT_TEST_KILL=$kill train "$name" "$np" "$b" --save-every 2 "$@" > "$dir/$name.log" 2>&1
    local rc=$? latest
    latest=$(cat "$dir/$name/checkpoints/latest" 2>/dev/null)
    if [ $rc -ne 0 ] && [ "$latest" = step_00000004 ] &&
       train "$name" "$np" "$b" --save-every 2 --resume auto "$@" > "$dir/$name.resume.log" 2>&1 &&
       grep -q "step_00000004: step 4" "$dir/$name.resume.log" &&
       [ -z "$(ls -A "$dir/$name/checkpoints" | grep tmp)" ] &&
       [ "$(cat "$dir/$name/checkpoints/latest")" = step_00000010 ]; then
        return 0
    fi
    echo "exit $rc, latest '$latest'"; cat "$dir/$name.log" "$dir/$name.resume.log" 2>/dev/null
    return 1
}
check "killed writing its rank file, resumed: bit-identical to the uninterrupted run" \
    crash kill_shard 6:shard 0 4
check "  ... losses and weights" compare kill_shard 0
full && check "killed before the rename, resumed" \
    crash kill_rename 6:rename 0 4
full && check "  ... losses and weights" compare kill_rename 0
full && check "killed before updating latest, resumed (step 6 replaced)" \
    crash kill_latest 6:latest 0 4
full && check "  ... losses and weights" compare kill_latest 0
check "rank 1 of 2 killed writing its rank file, resumed" \
    crash kill_dp2 6:shard:1 2 2 --zero 1
check "  ... losses and weights" compare kill_dp2 1e-5

# preemption: SIGTERM (one process) or SIGUSR1 (to one rank of two, as a scheduler signals every
# task) saves at the next step boundary and exits 0; resumed, the run goes on from there
preempt() { # preempt NAME SIGNAL NP B [flags]
    local name=$1 sig=$2 np=$3 b=$4
    shift 4
    rm -rf "${dir:?}/$name"
    train_cmd "$name" "$np" "$b" --steps 100000 "$@"
    "${CMD[@]}" > "$dir/$name.log" 2>&1 &
    local pid=$! i target
    for i in $(seq 1 600); do
        [ "$(cat "$dir/$name/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
        sleep 0.05
    done
    target=$pid
    # the env process execs the launcher or llm3d; a rank is an llm3d process of this run, a child
    # of the launcher (Open MPI) or of its proxy (MPICH's hydra_pmi_proxy): the last one found
    if [ "$np" -gt 0 ]; then
        local p
        for p in $(pgrep -x llm3d); do
            tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- "--out $dir/$name " && target=$p
        done
    fi
    kill "-$sig" "$target"
    wait "$pid"
    local rc=$? steps
    steps=$(grep -c '"step":' "$dir/$name/metrics.jsonl") # the first line is the run's record
    [ $rc -eq 0 ] && [ "$(cat "$dir/$name/checkpoints/latest")" = "$(printf 'step_%08d' "$steps")" ] &&
        grep -q "signal" "$dir/$name.log" && [ ! -e "$dir/$name/model.bin" ] || {
        echo "exit $rc after $steps steps"; cat "$dir/$name.log"; return 1; }
    train "$name" "$np" "$b" --steps $((steps + 2)) --resume auto "$@" > "$dir/$name.resume.log" 2>&1 &&
        grep -q "step $steps," "$dir/$name.resume.log" &&
        [ "$(grep -c '"step":' "$dir/$name/metrics.jsonl")" -eq $((steps + 2)) ]
}
check "SIGTERM: saved at a step boundary, exit 0, resumed" \
    preempt sigterm TERM 0 4
full && check "SIGUSR1 to one of 2 ranks: both saved, exit 0, resumed" \
    preempt sigusr1 USR1 2 2 --zero 1
full && check "SIGTERM to one rank of pp2 x 2 chunks: saved, exit 0, resumed" \
    preempt sigterm_v2 TERM 2 4 "${interleaved[@]}"
# SIGTERM lands mid-step, on whatever the process runs: when it was delivered to the thread in a
# oneDNN product, it corrupted the heap: 10 of 15 runs of this size died (a thread of its own takes
# it now)
many_preempts() {
    local k
    for k in $(seq 1 10); do preempt many TERM 0 4 --channels 128 || { echo "run $k"; return 1; }; done
}
full && check "SIGTERM mid-step, 10 runs: each saved, exit 0, resumed" many_preempts
# a second signal exits at once (128 + the signal), before the step boundary. Two different
# signals sent back to back, so that they cannot merge into one pending signal (as two SIGTERMs
# would) and need no timing: SIGUSR1 then SIGTERM, within one step of ~0.3 s; Linux delivers
# pending signals lowest number first, so the second is SIGTERM (143), else SIGUSR1 (138)
second_signal() {
    rm -rf "$dir/twice"
    train_cmd twice 0 32 --channels 512 --steps 100000
    "${CMD[@]}" > "$dir/twice.log" 2>&1 &
    pid=$!
    for i in $(seq 1 600); do [ "$(cat "$dir/twice/metrics.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.05; done
    kill -USR1 $pid
    kill -TERM $pid
    wait $pid
    local rc=$?
    { [ $rc -eq 143 ] || [ $rc -eq 138 ]; } && [ ! -e "$dir/twice/checkpoints" ] || { echo "exit $rc"; cat "$dir/twice.log"; return 1; }
}
full && check "a second signal exits at once (143), nothing saved" second_signal

# llm.c export: the weights of any layout's checkpoint as one llm.c file
check "convert tp2 x dp2 checkpoint to llm.c" "$bin" convert "$dir/A/checkpoints" "$dir/A.bin"
check "  ... identical to the run's gathered model.bin" cmp -s "$dir/A.bin" "$dir/A/model.bin"
exit $fail
