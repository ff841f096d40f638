#!/usr/bin/env bash
# Run directories and data safety (issue 16, items 2-4; docs/DESIGN.md "Run directories"):
# a run's identity (out/run, metrics' first record, each manifest); a new run refused in a
# directory holding an earlier one, --overwrite removing only llm3d's files, --resume auto refusing
# another model, pruning only this run's exact step directories, --init-from never overwritten;
# every write checked (a file-size limit: one error naming the file and errno, no partial or
# temporary file left, `latest` kept, the run resumable); the memory check before allocation
# (refused with figures and layouts that fit; a suggested layout really runs in that memory;
# more micro-batches than fit refused by it, naming the flag, before the schedule is built).
# Usage: runs.sh LLM3D SCRATCH_DIR.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus run
flags=("${TINY[@]}" --batch 4 --warmup 2)
run() { OMP_NUM_THREADS=1 bounded "$bin" train "${flags[@]}" "$@"; }

# ---- run identity -------------------------------------------------------------------------
o=$dir/a
check "a first run saves" run --steps 4 --save-every 2 --out "$o" > /dev/null
id=$(sed -n 's/^id //p' "$o/run")
check "out/run holds a 64-bit hex id" test "${#id}" -eq 16
check "metrics.jsonl's first record is the run" \
    grep -q "^{\"run\":\"$id\"" <(head -1 "$o/metrics.jsonl")
check "each manifest names the run" grep -qx "run $id" "$o/checkpoints/step_00000004/manifest"
sum_before=$(cat "$o/model.bin" "$o/metrics.jsonl" "$o/checkpoints/latest" | md5sum)
expect_error "a new run into it is refused, naming the directory and both ways out" \
    "$o holds an earlier run.*--resume auto.*--overwrite" run --steps 4 --out "$o"
check "... and nothing of the earlier run changed" \
    test "$(cat "$o/model.bin" "$o/metrics.jsonl" "$o/checkpoints/latest" | md5sum)" = "$sum_before"
expect_error "--resume auto with another model says what differs" \
    "another model: --layers 3 (the run's: 2)" run --layers 3 --steps 6 --resume auto --out "$o"
expect_error "--resume of a directory without checkpoints: its message whole (not garbled)" \
    "^llm3d train: --resume: $dir/nowhere: no checkpoint there ($dir/nowhere/latest" \
    run --steps 2 --resume "$dir/nowhere"
expect_error "--init-from OUT/model.bin --out OUT is refused" \
    "would overwrite the model it starts from" run --steps 2 --init-from "$o/model.bin" --out "$o"
check "... and the starting model is untouched" \
    test "$(cat "$o/model.bin" "$o/metrics.jsonl" "$o/checkpoints/latest" | md5sum)" = "$sum_before"
check "--resume auto continues the run" \
    run --steps 6 --save-every 2 --resume auto --out "$o" > /dev/null
check "... keeping its id" grep -qx "id $id" "$o/run"
check "... and its run record" test "$(grep -c '"run":' "$o/metrics.jsonl")" -eq 1

# pruning: exact step names of this run only. A user's step_00000003.bak and a checkpoint of
# another run (copied in under a step name) survive --keep 1.
mkdir -p "$o/checkpoints/step_00000003.bak" && echo mine > "$o/checkpoints/step_00000003.bak/notes"
check "a second run for a foreign checkpoint" \
    run --steps 2 --save-every 2 --out "$dir/b" > /dev/null
cp -r "$dir/b/checkpoints/step_00000002" "$o/checkpoints/step_00000005"
check "--keep 1 prunes" run --steps 10 --save-every 2 --keep 1 --resume auto --out "$o" > /dev/null
kept=$(cd "$o/checkpoints" && echo step_*)
check "... only this run's exact step directories (left: $kept)" \
    test "$kept" = "step_00000003.bak step_00000005 step_00000010"

# --overwrite: llm3d's files go, the user's stay
echo "my notes" > "$o/notes.txt"
check "--overwrite starts a new run" run --steps 2 --out "$o" --overwrite > /dev/null
check "... with a new id" test "$(sed -n 's/^id //p' "$o/run")" != "$id"
left=$(cd "$o" && echo * checkpoints/*)
check "... the user's files kept, the earlier checkpoints gone (left: $left)" \
    test "$left" = "checkpoints config.json generation_config.json metrics.jsonl model.bin model.safetensors notes.txt run run.yaml special_tokens_map.json tokenizer.json tokenizer_config.json checkpoints/step_00000003.bak"
check "... its metrics start over" test "$(wc -l < "$o/metrics.jsonl")" -eq 3

# ---- every write checked (a file-size limit: EFBIG) ---------------------------------------
# (--backend cpu: the checking backend's device arena is a file, which the limit would stop first;
# 4 KiB: run.yaml, every flag's line, is past 2 KiB since the MoE and QK-norm flags, and the 30
# steps' metrics.jsonl about 7 KiB)
o=$dir/w
(ulimit -f 4; run --backend cpu --steps 30 --out "$o" > /dev/null 2> "$dir/err1")
rc=$?
check "metrics.jsonl past the file-size limit: non-zero exit (got $rc)" test "$rc" -ne 0
check "... one error naming the file and errno" sh -c "one() { [ \"\$(wc -l < \"\$1\")\" -eq 1 ]; };
    one '$dir/err1' && grep -q 'cannot write $o/metrics.jsonl: File too large' '$dir/err1'"
check "... the file ends with the last complete line" \
    sh -c "tail -c 2 '$o/metrics.jsonl' | od -c | grep -q '}  *\\\\n'"
check "... every line complete" sh -c "! grep -v '^{.*}\$' '$o/metrics.jsonl'"

o=$dir/c
check "a run with a checkpoint at step 4" run --steps 4 --save-every 2 --out "$o" > /dev/null
(ulimit -f 1000
 run --backend cpu --steps 8 --save-every 2 --resume auto --out "$o" > /dev/null 2> "$dir/err2")
rc=$?
check "a checkpoint past the file-size limit: non-zero exit (got $rc)" test "$rc" -ne 0
check "... one error naming the rank file and errno" sh -c "[ \$(wc -l < '$dir/err2') -eq 1 ] &&
    grep -q 'cannot write $o/checkpoints/.tmp_step_00000006/rank_00000.bin: File too large' \
    '$dir/err2'"
check "... no temporary directory left" test -z "$(ls -a "$o/checkpoints" | grep tmp)"
check "... latest still the step before" grep -qx step_00000004 "$o/checkpoints/latest"
check "... and --resume auto continues from it" \
    sh -c "OMP_NUM_THREADS=1 '$bin' train ${flags[*]} --steps 8 --save-every 2 --resume auto \
           --out '$o' 2>&1 | grep -q 'resumed $o/checkpoints/step_00000004'"

o=$dir/m
(ulimit -f 100; run --backend cpu --steps 2 --out "$o" > /dev/null 2> "$dir/err3")
rc=$?
check "model.bin past the file-size limit: non-zero exit (got $rc)" test "$rc" -ne 0
check "... one error naming the file and errno" sh -c "[ \$(wc -l < '$dir/err3') -eq 1 ] &&
    grep -q 'cannot write the llm.c checkpoint $o/model.bin: File too large' '$dir/err3'"
check "... no model.bin nor its temporary file" test ! -e "$o/model.bin" -a -z "$(ls -a "$o" | grep l3d-tmp)"

# a full file system where one can be mounted (root, CI); a file-size limit above covers the rest
mnt=$dir/tmpfs
mkdir -p "$mnt"
if mount -t tmpfs -o size=1200k tmpfs "$mnt" 2> /dev/null; then
    run --steps 4 --save-every 2 --out "$mnt/o" > /dev/null 2> "$dir/err4"
    rc=$?
    check "a full tmpfs: non-zero exit (got $rc), one error naming the file and ENOSPC" \
        sh -c "[ $rc -ne 0 ] && [ \$(wc -l < '$dir/err4') -eq 1 ] &&
        grep -q 'cannot write $mnt/o/.*No space left on device' '$dir/err4'"
    check "... no temporary file or directory left" \
        test -z "$(find "$mnt" -mindepth 1 -name '*tmp*')"
    umount "$mnt"
else
    echo "skip: a full file system (cannot mount a tmpfs here: not root?); the file-size" \
         "limit covers the checks"
fi

# ---- memory check before allocation --------------------------------------------------------
start=$(date +%s)
expect_error "a model too big for any machine is refused before allocating" \
    "not enough memory: this layout.*needs [0-9.]* GiB on rank 0.*no layout of 1 rank(s) fits" \
    run --channels 16384 --layers 96 --heads 128 --context 1024 --steps 1
check "... at once ($(( $(date +%s) - start )) s)" test $(( $(date +%s) - start )) -lt 60
# d24-sized on a 24 GiB machine (the issue's: OOM-killed after 74 s of first touch)
expect_error "--channels 4096 --layers 24 on a 24 GiB machine is refused with its figures" \
    "needs 73.6[0-9] GiB on rank 0 (parameters 18.0[0-9] GiB.*but has 24.00 GiB" \
    env L3D_TEST_MEM_AVAILABLE=25769803776 OMP_NUM_THREADS=1 "$bin" train "${flags[@]}" \
    --channels 4096 --layers 24 --heads 32 --context 1024 --seq-len 64 --steps 1
L3D_TEST_MEM_AVAILABLE=3000000 run --steps 2 > /dev/null 2> "$dir/err5"
check "a 3 MB machine refuses batch 4 with the figures and layouts that fit" sh -c \
    "[ \$(wc -l < '$dir/err5') -eq 1 ] && grep -q 'needs 3.5 MiB on rank 0 (parameters 0.5 MiB' \
     '$dir/err5' && grep -q 'but has 2.9 MiB.*fit: --batch 2 --grad-accum 2' '$dir/err5'"
peak=$(L3D_TEST_MEM_AVAILABLE=3000000 run --steps 2 --batch 2 --grad-accum 2 |
       sed -n 's/.*peak host memory.*(\([0-9]*\) bytes.*/\1/p')
check "... the suggested layout runs within 3 MB (measured peak ${peak:-none} bytes)" \
    test "${peak:-3000001}" -le 3000000
check "--ignore-memory-check runs it anyway" \
    env L3D_TEST_MEM_AVAILABLE=3000000 OMP_NUM_THREADS=1 "$bin" train "${flags[@]}" --steps 1 \
    --ignore-memory-check > /dev/null
# micro-batches a step beyond the memory: the buffers that grow with them (token ids, the pipeline
# schedules of l3d_train_layout_build) are counted by the check, before anything is allocated.
# --grad-accum 1073741824 aborted (exit 134, "out of memory allocating 77309411328 bytes for
# schedule") before the check ran; under --pp 2 on every rank, with an MPI unpack error after.
big=1073741824
mem24=(env L3D_TEST_MEM_AVAILABLE=25769803776 OMP_NUM_THREADS=1) # a 24 GiB machine
expect_error "--grad-accum $big: refused by the memory check with the flag, the bytes, the fix" \
    "^llm3d train: not enough memory for --grad-accum $big: $big micro-batches a step need [0-9.]* GiB on rank 0.*pipeline schedules 84.00 GiB.*has 24.00 GiB.*give at most --grad-accum [1-9][0-9]*, or --ignore-memory-check" \
    bounded "${mem24[@]}" "$bin" train "${flags[@]}" --steps 1 --grad-accum $big
expect_error "--global-batch $big: the same, naming --global-batch" \
    "^llm3d train: not enough memory for --global-batch $big: 268435456 micro-batches.*give at most --global-batch [1-9][0-9]* (" \
    bounded "${mem24[@]}" "$bin" train "${flags[@]}" --steps 1 --global-batch $big
if full; then # the message once, the same status on both ranks (the launcher's is theirs)
    bounded "${mem24[@]}" "$mpiexec" -n 2 "$bin" train "${flags[@]}" --steps 1 --pp 2 \
        --grad-accum $big > /dev/null 2> "$dir/out7"
    rc=$?
    check "--pp 2: --grad-accum $big refused with status 1 (got $rc)" test $rc -eq 1
    check "... said once" test "$(grep -c "not enough memory for --grad-accum $big" "$dir/out7")" -eq 1
    check "... with no fatal line, abort or MPI error" \
        sh -c "! grep -E 'fatal|MPI_ABORT|unpack|out of memory allocating' '$dir/out7'"
fi
if full; then
    L3D_TEST_MEM_AVAILABLE=7000000 OMP_NUM_THREADS=1 bounded "$mpiexec" -n 2 "$bin" train \
        "${flags[@]}" --steps 1 --out "$dir/mpi" > "$dir/out6" 2>&1
    check "2 ranks: one message" test "$(grep -c 'not enough memory' "$dir/out6")" -eq 1
    check "... the node's memory shared by its ranks, and --tp 2 suggested" grep -q \
        "has 3.3 MiB (L3D_TEST_MEM_AVAILABLE 6.7 MiB shared by 2 rank(s).*fit: .*--tp 2" "$dir/out6"
fi
exit $fail
