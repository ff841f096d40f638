#!/usr/bin/env bash
# The chunked cross-entropy (--xent-chunk ROWS, l3d_gpt_xent_rows): the head's logits, loss and
# gradients a chunk of rows at a time must train the same model as the unchunked head (the tiny
# model's default: its 256-token vocabulary fills 8 MiB with no fewer rows than it has) on one
# process and on the layouts that touch the head: the vocabulary-parallel statistics over tp
# (the max all-reduced per chunk), sequence parallelism (the input gradient reduce-scattered),
# the pipeline's last stage under 1F1B and zb-h1 (the head's activations once), context
# parallelism, ZeRO-3 with full recomputation, a mixture of experts over ep and bf16; chunks of
# 7 rows, which divide none of the 32 T B rows. llm3d compare as equiv.sh: losses, gradient norms
# and final weights within 1e-5 (3e-5 where a tp slice sums otherwise, equiv.sh's). The
# negative case: a run whose targets differ (another seed's batch order) must not compare equal.
# Then the activation memory the trainer reports: one chunk of logits instead of all of them, and
# --xent-chunk's bad values. Usage: xent.sh LLM3D SCRATCH_DIR.
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"

byte_corpus xent # TINY: T = 32, vocabulary 256
steps=6
sanitized && steps=4
# AdamW eps 1e-6 for the reason equiv.sh gives (round-off in gradients zero in exact arithmetic)
TRAIN_FLAGS=("${TINY[@]}" --steps $steps --warmup 3 --lr 1e-3 --eps 1e-6)
X=(--xent-chunk 7)

# same NAME REF_B NP B ACCUM [flags]: the chunked layout against one unchunked process with REF_B
# sequences (L3D_REF_FLAGS: flags for both; L3D_RTOL: the weights' tolerance, 1e-5)
same() {
    local name=$1 refb=$2 np=$3 b=$4 accum=$5
    shift 5
    local both=(${L3D_REF_FLAGS:-})
    local ref="ref_b${refb}_a${accum}$(echo "${L3D_REF_FLAGS:-}" | tr -d ' -')"
    if [ ! -f "$dir/$ref/model.bin" ]; then
        train "$ref" 0 "$refb" --grad-accum "$accum" "${both[@]}" > "$dir/$ref.log" 2>&1 ||
            { bad "reference $ref"; cat "$dir/$ref.log"; return; }
    fi
    train "$name" "$np" "$b" --grad-accum "$accum" "${both[@]}" "$@" > "$dir/$name.log" 2>&1 ||
        { bad "$name did not run:"; cat "$dir/$name.log"; return; }
    if "$bin" compare --loss-rtol 1e-5 --norm-rtol 1e-5 --weights-rtol "${L3D_RTOL:-1e-5}" \
        "$dir/$name" "$dir/$ref" > "$dir/$name.cmp" 2>&1
    then ok "$name ($(tr '\n' ' ' < "$dir/$name.cmp"))"
    else bad "$name"; cat "$dir/$name.cmp"
    fi
}

same one_chunk7 4 0 4 1 "${X[@]}"
same one_chunk1_accum 2 0 2 2 --xent-chunk 1 # a row a chunk, two micro-batches
L3D_RTOL=3e-5 same tp2_chunk7 4 2 4 1 --tp 2 "${X[@]}"
L3D_RTOL=3e-5 same tp2_sp_chunk7 4 2 4 1 --tp 2 --sequence-parallel "${X[@]}"
same pp2_1f1b_chunk7 2 2 2 4 --pp 2 "${X[@]}"
same pp2_zbh1_chunk7 2 2 2 4 --pp 2 --pp-schedule zb-h1 "${X[@]}"
full && same cp2_chunk7 4 2 4 1 --cp 2 "${X[@]}"
full && same dp2_zero3_full_chunk7 4 2 2 1 --zero 3 --recompute full "${X[@]}"
moe=(--moe-experts 4 --moe-top-k 2 --moe-ffn 128)
L3D_REF_FLAGS="${moe[*]}" same moe_ep2_chunk7 4 2 2 1 --ep 2 "${X[@]}"
# bf16 against bf16: the chunk changes no rounding (the logits' rows are the same products)
L3D_REF_FLAGS="--precision bf16" same bf16_chunk7 4 0 4 1 "${X[@]}"

# the negative case: compare tells a run on other targets apart
train other_data 0 4 "${X[@]}" --seed 2 > "$dir/other_data.log" 2>&1 || bad "other_data did not run"
if "$bin" compare --rtol 1e-5 "$dir/other_data" "$dir/ref_b4_a1" > "$dir/other_data.cmp" 2>&1; then
    bad "a run on other targets compared equal: $(cat "$dir/other_data.cmp")"
else
    ok "a run on other targets differs"
fi

# the activations the trainer accounts (its start-up line, which --quiet leaves out): one chunk
# of 7 rows' logits (7 x 256 x 4 bytes) instead of 4 x 32 rows' (131072 bytes)
acts() {
    local f TRAIN_FLAGS=()
    for f in "${TINY[@]}"; do [ "$f" = --quiet ] || TRAIN_FLAGS+=("$f"); done
    TRAIN_FLAGS+=(--steps 1)
    train "$1" 0 4 "${@:2}" 2>&1 | sed -n 's/^activations: .* (\([0-9]*\) bytes.*/\1/p' | head -1
}
a0=$(acts mem_unchunked)
a7=$(acts mem_chunk7 "${X[@]}")
if [ -n "$a0" ] && [ -n "$a7" ] && [ $((a0 - a7)) -eq $((131072 - 7 * 256 * 4)) ]; then
    ok "the activations drop from $a0 to $a7 bytes (the logits of 128 rows -> 7)"
else
    bad "activations unchunked '$a0' bytes, chunked '$a7': not 123904 bytes less"
fi

expect_error "--xent-chunk -1" "--xent-chunk" "$bin" train "${TRAIN_FLAGS[@]}" --xent-chunk -1
expect_error "--xent-chunk x" "--xent-chunk" "$bin" train "${TRAIN_FLAGS[@]}" --xent-chunk x
exit $fail
