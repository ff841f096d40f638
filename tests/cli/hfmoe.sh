#!/usr/bin/env bash
# Mixtral Hugging Face folders (include/llm3d/hf.h; README "Mixture of experts"): a Llama model with
# experts is written as MixtralForCausalLM by --out and convert and read back bit-identically;
# an oracle that shares no code with llm3d (lib/st_oracle.py: Python's standard library only) maps
# the folder's tensor names and shapes to its config.json, finds the llm.c file's values in it and
# writes a folder llm3d must read; --init-from reads it; a folder whose expert count disagrees with
# its config, a config llm3d cannot honour and a model no folder holds are refused in one line.
# Usage: hfmoe.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, expect_error, train
start_test "$@"
source "$(dirname "$0")/lib/hfedit.sh" # oracle, edit_config

byte_corpus hfmoe
# llama-tiny with 4 experts of the MLP's width (192)
TRAIN_FLAGS=("${TINY[@]}" --model llama-tiny --moe-experts 4 --moe-top-k 2 --moe-norm-topk
             --steps 3 --warmup 1)
TRAIN_LOG=check
train run 0 2 || exit 1
model=$dir/run/model.bin

check "--out writes a Mixtral folder" grep -q '"model_type": "mixtral"' "$dir/run/config.json"
check "  ... the oracle maps its tensor names and shapes to config.json" oracle names "$dir/run"
check "  ... and finds the llm.c file's weights in it" oracle check "$dir/run" "$model"
check "convert folder -> llm.c: bit-identical to --out's model.bin" sh -c "'$bin' convert '$dir/run' '$dir/back.bin' > /dev/null && cmp '$dir/back.bin' '$model'"
check "convert llm.c -> folder: the same safetensors bytes as --out's" sh -c "'$bin' convert '$model' '$dir/hf1' > /dev/null && cmp '$dir/hf1/model.safetensors' '$dir/run/model.safetensors'"
check "  ... folder -> folder: the same bytes again" sh -c "'$bin' convert '$dir/hf1' '$dir/hf2' > /dev/null && cmp '$dir/hf2/model.safetensors' '$dir/hf1/model.safetensors' && cmp '$dir/hf2/config.json' '$dir/hf1/config.json'"
check "sharded folder (3 files) -> llm.c: bit-identical" sh -c "'$bin' convert '$model' '$dir/hfs' --save-shard-mb 0.3 > /dev/null && test -s '$dir/hfs/model.safetensors.index.json' && '$bin' convert '$dir/hfs' '$dir/hfs.bin' > /dev/null && cmp '$dir/hfs.bin' '$model'"
check "the oracle's folder -> llm.c: bit-identical" sh -c "python3 '$(dirname "$0")/lib/st_oracle.py' write '$model' '$dir/py' --shards 2 && '$bin' convert '$dir/py' '$dir/py.bin' > /dev/null && cmp '$dir/py.bin' '$model'"
check "bf16 folder, rounded as the oracle rounds" sh -c "'$bin' convert '$model' '$dir/hfb' --precision bf16 > /dev/null && python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/hfb' '$model' --dtype BF16"
check "inspect names the experts" sh -c "'$bin' inspect '$dir/hf1' | grep -q 'experts: 4 a layer, top-2 renormalised'"
# generation from the folder through the KV cache, in fp32 and bf16: the full forward's greedy
# tokens, and model.bin's; two experts exchanged (below) generate another text
for prec in fp32 bf16; do gen_same "generate --precision $prec from the Mixtral folder" "$dir/hf1" --precision $prec; done
check "  ... the same tokens as from model.bin" sh -c "$(declare -f gen_greedy); bin='$bin' dir='$dir'; [ \"\$(gen_greedy '$dir/hf1')\" = \"\$(gen_greedy '$model')\" ]"
# negative cases of the oracle: two experts exchanged is a well-formed, different model
oracle hostile "$dir/hf1" swap_experts "$dir/swap" > /dev/null
check "  (negative: the oracle finds two experts exchanged)" sh -c "! python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/swap' '$model' > /dev/null"
check "  (negative: ... and llm3d reads them as another model)" sh -c "'$bin' convert '$dir/swap' '$dir/swap.bin' > /dev/null && ! cmp -s '$dir/swap.bin' '$model'"
check "  (negative: ... which generates another text)" sh -c "$(declare -f gen_greedy); bin='$bin' dir='$dir'; [ \"\$(gen_greedy '$dir/swap')\" != \"\$(gen_greedy '$dir/hf1')\" ]"

# --ep 2 on 2 ranks: --out gathers each rank's experts into the folder; the same weights as its
# model.bin, and the folder reads back as that file
if train ep2 2 2 --ep 2 --save-every 3 && oracle check "$dir/ep2" "$dir/ep2/model.bin" > /dev/null &&
   "$bin" convert "$dir/ep2" "$dir/ep2.bin" > /dev/null && cmp -s "$dir/ep2.bin" "$dir/ep2/model.bin"; then
    ok "--ep 2: --out's Mixtral folder holds every rank's experts (the oracle and a round trip agree)"
else
    bad "--ep 2's Mixtral folder"
fi
# trained with --ep 2, generated in one process (the experts gathered whole); its checkpoint,
# resharded to one process by convert, generates the same tokens
if gen_same "generate from the --ep 2 run's folder" "$dir/ep2/model.bin" &&
   "$bin" convert "$dir/ep2/checkpoints/step_00000003" "$dir/ep2ck.bin" > /dev/null; then
    check "  ... and from its --ep 2 checkpoint (convert): the same tokens" sh -c "$(declare -f gen_greedy); bin='$bin' dir='$dir'; [ \"\$(gen_greedy '$dir/ep2ck.bin')\" = \"\$(gen_greedy '$dir/ep2')\" ]"
fi
# --init-from the folder trains as from model.bin: the same weights after 2 steps
if train init 0 2 --init-from "$dir/hf1" --steps 2 && train init_bin 0 2 --init-from "$model" --steps 2 &&
   cmp -s "$dir/init/model.bin" "$dir/init_bin/model.bin"; then
    ok "--init-from the Mixtral folder trains as from model.bin (model.bin identical after 2 steps)"
else
    bad "--init-from the Mixtral folder"
fi
# the routing's training settings are the run's, not the weights': a capacity factor (not in the
# format) over the folder's weights drops assignments, as over model.bin's (both were refused as
# architecture flags that disagree, naming no expert); another expert count is refused, naming
# the file's
dropped() { grep -o '"moe_dropped":[0-9]*' "$dir/$1/metrics.jsonl" | head -1 | cut -d: -f2; }
if train init_cf 0 2 --init-from "$dir/hf1" --steps 1 --moe-capacity-factor 0.5 &&
   train init_bin_cf 0 2 --init-from "$model" --steps 1 --moe-capacity-factor 0.5; then
    d=$(dropped init_cf)
    [ "${d:-0}" -gt 0 ] && [ "$d" = "$(dropped init_bin_cf)" ] && [ "$(dropped init)" = 0 ] &&
        ok "--init-from with --moe-capacity-factor 0.5: $d assignments dropped (folder and model.bin; 0 without)" ||
        bad "--init-from with --moe-capacity-factor 0.5: dropped '$d', '$(dropped init_bin_cf)', without '$(dropped init)'"
fi
expect_error "--moe-experts 8 over a folder of 4" "whose model is llama with .*, 4 experts a layer (top-2, 0 shared, 0 dense layers first): drop them" \
    "$bin" train "${TRAIN_FLAGS[@]}" --init-from "$dir/hf1" --moe-experts 8 --out "$dir/init8"
# experts narrower than the MLP: the weights go through whole; the header's MLP width, which
# shapes no tensor of a model with experts in every layer, comes back as the experts' (96)
if train narrow 0 2 --moe-ffn 96 && "$bin" convert "$dir/narrow/model.bin" "$dir/narrow_hf" > /dev/null &&
   "$bin" convert "$dir/narrow_hf" "$dir/narrow.bin" > /dev/null &&
   oracle check "$dir/narrow_hf" "$dir/narrow.bin" > /dev/null && oracle check "$dir/narrow_hf" "$dir/narrow/model.bin" > /dev/null &&
   cmp -s <(tail -c +1025 "$dir/narrow.bin") <(tail -c +1025 "$dir/narrow/model.bin"); then
    ok "--moe-ffn 96 under a 192-wide MLP: folder round trip keeps every weight bit for bit"
else
    bad "--moe-ffn 96 round trip"
fi

# bad input, one line each naming the file, the tensor and the numbers
edit_config "$dir/hf1" num_local_experts 3 "$dir/e3"
expect_error "a config of 3 experts over a folder of 4" \
    'model.safetensors: layer 0 holds 4 experts (its last: tensor model.layers.0.block_sparse_moe.experts.3.w1.weight) but .*e3/config.json says "num_local_experts": 3' \
    "$bin" convert "$dir/e3" "$dir/e3.bin"
check "  (the oracle refuses it too)" sh -c "! python3 '$(dirname "$0")/lib/st_oracle.py' names '$dir/e3' > /dev/null"
edit_config "$dir/hf1" num_local_experts 5 "$dir/e5"
expect_error "a config of 5 experts over a folder of 4" \
    'layer 0 holds 4 experts .* says "num_local_experts": 5' "$bin" inspect "$dir/e5"
edit_config "$dir/hf1" num_experts_per_tok 5 "$dir/k5"
expect_error "num_experts_per_tok 5 of 4 experts, named as the file names them" \
    'k5/config.json: "num_experts_per_tok" is 5 but "num_local_experts" is 4: .*give "num_experts_per_tok" at most 4 in the file' \
    "$bin" generate --checkpoint "$dir/k5" --tokenizer bytes
edit_config "$dir/hf1" router_jitter_noise 0.1 "$dir/jit"
expect_error "router_jitter_noise" '"router_jitter_noise" is 0.1: llm3d cannot honour it' \
    "$bin" convert "$dir/jit" "$dir/jit.bin"
edit_config "$dir/hf1" sliding_window 16 "$dir/sw"
expect_error "a sliding window" '"sliding_window" is 16: llm3d cannot honour it' \
    "$bin" convert "$dir/sw" "$dir/sw.bin"
# router_aux_loss_coef counts only with output_router_logits (MixtralForCausalLM's forward): the
# llm3d file's header (words 32-33, a double) holds 0.02 from one, 0 from the other
aux_word() { python3 -c "import struct,sys; print(struct.unpack_from('<d', open(sys.argv[1],'rb').read(), 32*4)[0])" "$1"; }
edit_config "$dir/hf1" router_aux_loss_coef 0.02 "$dir/aux0"
edit_config "$dir/aux0" output_router_logits true "$dir/aux1"
if "$bin" convert "$dir/aux0" "$dir/aux0.bin" > /dev/null && "$bin" convert "$dir/aux1" "$dir/aux1.bin" > /dev/null &&
   [ "$(aux_word "$dir/aux0.bin")" = 0.0 ] && [ "$(aux_word "$dir/aux1.bin")" = 0.02 ]; then
    ok "router_aux_loss_coef 0.02 read as 0.02 with output_router_logits, 0 without"
else
    bad "router_aux_loss_coef: $(aux_word "$dir/aux0.bin") $(aux_word "$dir/aux1.bin")"
fi

# models no Mixtral folder holds: GPT-2's blocks, shared experts, an unnormalised top-k
train gmoe 0 2 --model moe-tiny --moe-ffn 128
expect_error "GPT-2 blocks with experts" "a GPT-2 model with experts (--moe-experts 4) has no Hugging Face folder" \
    "$bin" convert "$dir/gmoe/model.bin" "$dir/gmoe_hf"
check "  ... --out wrote model.bin only" sh -c "test -s '$dir/gmoe/model.bin' && test ! -e '$dir/gmoe/config.json'"
TRAIN_FLAGS+=(--quiet)
train shared 0 2 --moe-shared-experts 1 > /dev/null
expect_error "shared experts" "--moe-shared-experts 1, --moe-dense-layers 0: a Mixtral folder has neither" \
    "$bin" convert "$dir/shared/model.bin" "$dir/shared_hf"
train nonorm 0 2 --no-moe-norm-topk > /dev/null
expect_error "an unnormalised top-k" "Mixtral's router always renormalises its top-2 weights" \
    "$bin" convert "$dir/nonorm/model.bin" "$dir/nonorm_hf"
exit $fail
