#!/usr/bin/env bash
# Qwen3 and Qwen3-MoE Hugging Face folders (include/llm3d/arch.h's qwen3 and qwen3_moe rows): a
# Llama model with QK-norm is written as Qwen3ForCausalLM (self_attn.q_norm, k_norm), with experts
# too as Qwen3MoeForCausalLM (mlp.gate, mlp.experts.M.gate_proj | up_proj | down_proj), by --out
# and convert, and read back bit-identically; the oracle that shares no code with llm3d
# (lib/st_oracle.py) maps names and shapes to config.json and finds the llm.c file's values;
# --init-from reads the folder; a head size apart from hidden / heads (head_dim, --head-dim)
# written and read back bit-identically; what llm3d cannot honour (a sparse step, MLP-only layers),
# a head_dim the tensors disagree with and a model no folder holds are refused in one line.
# Usage: hfqwen3.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, expect_error, train
start_test "$@"
source "$(dirname "$0")/lib/hfedit.sh" # oracle, edit_config
# roundtrip NAME: the run's folder <-> its model.bin, both ways, bit for bit
roundtrip() {
    local r=$dir/$1
    check "$1: convert folder -> llm.c: bit-identical to --out's model.bin" sh -c "'$bin' convert '$r' '$r.back.bin' > /dev/null && cmp '$r.back.bin' '$r/model.bin'"
    check "$1: convert llm.c -> folder: the same safetensors bytes and config as --out's" sh -c "'$bin' convert '$r/model.bin' '$r.hf' > /dev/null && cmp '$r.hf/model.safetensors' '$r/model.safetensors' && cmp '$r.hf/config.json' '$r/config.json'"
    check "$1: the oracle maps its tensor names and shapes to config.json" oracle names "$r"
    check "$1: ... and finds the llm.c file's weights in it" oracle check "$r" "$r/model.bin"
    check "$1: the oracle's folder (2 shards) -> llm.c: bit-identical" sh -c "python3 '$(dirname "$0")/lib/st_oracle.py' write '$r/model.bin' '$r.py' --shards 2 && '$bin' convert '$r.py' '$r.py.bin' > /dev/null && cmp '$r.py.bin' '$r/model.bin'"
}

byte_corpus hfqwen3
TRAIN_FLAGS=("${TINY[@]}" --model llama-tiny --qk-norm --steps 3 --warmup 1)
TRAIN_LOG=check
train dense 0 2 || exit 1
check "--out writes a Qwen3 folder" grep -q '"model_type": "qwen3"' "$dir/dense/config.json"
roundtrip dense
check "bf16 folder, rounded as the oracle rounds" sh -c "'$bin' convert '$dir/dense/model.bin' '$dir/hfb' --precision bf16 > /dev/null && python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/hfb' '$dir/dense/model.bin' --dtype BF16"
check "inspect names QK-norm" sh -c "'$bin' inspect '$dir/dense.hf' | grep -q 'untied head, QK-norm'"
oracle hostile "$dir/dense.hf" swap_qk_norm "$dir/swap" > /dev/null
check "  (negative: the oracle finds q_norm and k_norm exchanged)" sh -c "! python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/swap' '$dir/dense/model.bin' > /dev/null"
check "  (negative: ... and llm3d reads them as another model)" sh -c "'$bin' convert '$dir/swap' '$dir/swap.bin' > /dev/null && ! cmp -s '$dir/swap.bin' '$dir/dense/model.bin'"
if train init 0 2 --init-from "$dir/dense.hf" --steps 2 && train init_bin 0 2 --init-from "$dir/dense/model.bin" --steps 2 &&
   cmp -s "$dir/init/model.bin" "$dir/init_bin/model.bin"; then
    ok "--init-from the Qwen3 folder trains as from model.bin (model.bin identical after 2 steps)"
else
    bad "--init-from the Qwen3 folder"
fi
edit_config "$dir/dense.hf" head_dim 32 "$dir/hd"
expect_error "head_dim 32 over a folder of heads of 16" 'hd/model.safetensors: tensor model.layers.0.self_attn.q_proj.weight has shape \[64, 64\], but .*hd/config.json needs \[128, 64\]' \
    "$bin" convert "$dir/hd" "$dir/hd.bin"
edit_config "$dir/dense.hf" use_sliding_window true "$dir/sw"
expect_error "a sliding window" '"use_sliding_window" is true: llm3d cannot honour it' \
    "$bin" convert "$dir/sw" "$dir/sw.bin"

# Qwen3-MoE: 4 experts of 96, top-2, unnormalised (norm_topk_prob false, its default)
train moe 0 2 --moe-experts 4 --moe-top-k 2 --moe-ffn 96 || exit 1
check "--out writes a Qwen3-MoE folder" grep -q '"model_type": "qwen3_moe"' "$dir/moe/config.json"
roundtrip moe
check "  norm_topk_prob false as trained" grep -q '"norm_topk_prob": false' "$dir/moe/config.json"
gen_same "generate from the Qwen3-MoE folder (QK-norm, top-2 unnormalised)" "$dir/moe"
edit_config "$dir/moe.hf" num_experts_per_tok 5 "$dir/k5"
expect_error "num_experts_per_tok 5 of 4 experts" \
    'k5/config.json: "num_experts_per_tok" is 5 but "num_experts" is 4: .*give "num_experts_per_tok" at most 4 in the file' \
    "$bin" convert "$dir/k5" "$dir/k5.bin"
edit_config "$dir/moe.hf" norm_topk_prob true "$dir/nt"
check "norm_topk_prob true reads as a renormalised top-k" sh -c "'$bin' inspect '$dir/nt' | grep -q 'top-2 renormalised'"
edit_config "$dir/moe.hf" num_experts 3 "$dir/e3"
expect_error "a config of 3 experts over a folder of 4" \
    'layer 0 holds 4 experts (its last: tensor model.layers.0.mlp.experts.3.gate_proj.weight) but .*e3/config.json says "num_experts": 3' \
    "$bin" convert "$dir/e3" "$dir/e3.bin"
edit_config "$dir/moe.hf" decoder_sparse_step 2 "$dir/step2"
expect_error "decoder_sparse_step 2" '"decoder_sparse_step" is 2: llm3d cannot honour it .*give 1' \
    "$bin" convert "$dir/step2" "$dir/step2.bin"
edit_config "$dir/moe.hf" mlp_only_layers '[0]' "$dir/mlponly"
expect_error "mlp_only_layers [0]" '"mlp_only_layers" is a list of 1: llm3d cannot honour it .*give \[\]' \
    "$bin" convert "$dir/mlponly" "$dir/mlponly.bin"

# Qwen3-MoE with heads of 24 over 64 channels and 4 heads (head_dim apart from hidden / heads, as
# Qwen3-30B-A3B's 128 over 2048 / 32): q_proj (96, 64), k_proj and v_proj (48, 64), o_proj
# (64, 96), q_norm and k_norm of 24; renormalised top-2
train hdmoe 0 2 --moe-experts 4 --moe-top-k 2 --moe-ffn 96 --moe-norm-topk --head-dim 24 || exit 1
check "--head-dim 24: config.json's head_dim" grep -q '"head_dim": 24,' "$dir/hdmoe/config.json"
roundtrip hdmoe
check "  q_proj (96, 64) and o_proj (64, 96) in the folder" sh -c "python3 -c \"import json,struct,sys; f=open(sys.argv[1],'rb'); h=json.loads(f.read(struct.unpack('<Q', f.read(8))[0])); sys.exit(not (h['model.layers.0.self_attn.q_proj.weight']['shape'] == [96, 64] and h['model.layers.0.self_attn.o_proj.weight']['shape'] == [64, 96]))\" '$dir/hdmoe/model.safetensors'"
check "inspect names the head size" sh -c "'$bin' inspect '$dir/hdmoe.hf' | grep -q 'KV heads 2, heads of 24,'"
edit_config "$dir/hdmoe.hf" head_dim 16 "$dir/hd16"
expect_error "head_dim 16 over a folder of heads of 24" 'hd16/model.safetensors: tensor model.layers.0.self_attn.q_proj.weight has shape \[96, 64\], but .*hd16/config.json needs \[64, 64\]' \
    "$bin" convert "$dir/hd16" "$dir/hd16.bin"
check "  (negative: the oracle finds those names' shapes wrong too)" sh -c "! python3 '$(dirname "$0")/lib/st_oracle.py' names '$dir/hd16' > /dev/null"
if train hdinit 0 2 --init-from "$dir/hdmoe.hf" --steps 2 && train hdinit_bin 0 2 --init-from "$dir/hdmoe/model.bin" --steps 2 &&
   cmp -s "$dir/hdinit/model.bin" "$dir/hdinit_bin/model.bin"; then
    ok "--init-from the head_dim 24 folder trains as from model.bin"
else
    bad "--init-from the head_dim 24 folder"
fi

# GPT-2's blocks with QK-norm: no folder holds them
TRAIN_FLAGS=("${TINY[@]}" --qk-norm --steps 1 --warmup 1 --quiet)
train g 0 2 > /dev/null
expect_error "GPT-2 blocks with QK-norm" "a GPT-2 model with QK-norm (--qk-norm) has no Hugging Face folder" \
    "$bin" convert "$dir/g/model.bin" "$dir/g_hf"
check "  ... --out wrote model.bin only" sh -c "test -s '$dir/g/model.bin' && test ! -e '$dir/g/config.json'"
# ... nor with a head size apart from n_embd / n_head: GPT-2's config has no head_dim
train ghd 0 2 --no-qk-norm --head-dim 24 > /dev/null
expect_error "GPT-2 blocks with --head-dim" "\-\-head-dim 24: a GPT-2 folder's head size is the channels / heads (64 / 4)" \
    "$bin" convert "$dir/ghd/model.bin" "$dir/ghd_hf"
check "  ... --out wrote model.bin only" sh -c "test -s '$dir/ghd/model.bin' && test ! -e '$dir/ghd/config.json'"
exit $fail
