#!/usr/bin/env bash
# The chunked cross-entropy (--xent-chunk ROWS, l3d_gpt_xent_rows): the head's logits, loss and
# gradients a chunk of rows at a time must train the same model as the unchunked head (the tiny
# model's default: its 256-token vocabulary fills 8 MiB with no fewer rows than it has) on one
# process and on the layouts that touch the head: the vocabulary-parallel statistics over tp
# (the max all-reduced per chunk), sequence parallelism (the input gradient reduce-scattered),
# the pipeline's last stage under 1F1B and zb-h1 (the head's activations once), context
# parallelism, ZeRO-3 with full recomputation, a mixture of experts over ep and bf16; chunks of
# 7 rows, which divide none of the runs' B x 32 rows. same_layout (lib/checks.sh): losses and
# gradient norms within 1e-5, final weights 3e-5, llm3d compare. The negative case: a run of
# another seed (other weights and batches) must not compare equal.
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

same_layout one_chunk7 4 0 4 1 "${X[@]}"
same_layout one_chunk1_accum 2 0 2 2 --xent-chunk 1 # a row a chunk, two micro-batches
same_layout tp2_chunk7 4 2 4 1 --tp 2 "${X[@]}"
same_layout tp2_sp_chunk7 4 2 4 1 --tp 2 --sequence-parallel "${X[@]}"
same_layout pp2_1f1b_chunk7 2 2 2 4 --pp 2 "${X[@]}"
same_layout pp2_zbh1_chunk7 2 2 2 4 --pp 2 --pp-schedule zb-h1 "${X[@]}"
full && same_layout cp2_chunk7 4 2 4 1 --cp 2 "${X[@]}"
full && same_layout dp2_zero3_full_chunk7 4 2 2 1 --zero 3 --recompute full "${X[@]}"
moe=(--moe-experts 4 --moe-top-k 2 --moe-ffn 128)
L3D_REF_FLAGS="${moe[*]}" same_layout moe_ep2_chunk7 4 2 2 1 --ep 2 "${X[@]}"
# bf16 against bf16: the chunk changes no rounding (the logits' rows are the same products)
L3D_REF_FLAGS="--precision bf16" same_layout bf16_chunk7 4 0 4 1 "${X[@]}"

# the negative case: compare tells a run of another seed apart
train other_data 0 4 "${X[@]}" --seed 2 > "$dir/other_data.log" 2>&1 || bad "other_data did not run"
if "$bin" compare --rtol 1e-5 "$dir/other_data" "$dir/ref_b4_a1" > "$dir/other_data.cmp" 2>&1; then
    bad "a run of another seed compared equal: $(cat "$dir/other_data.cmp")"
else
    ok "a run of another seed differs"
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
