#!/usr/bin/env bash
# Hugging Face folders: round trips bit-identical (llm.c file -> folder -> llm.c file; a run's
# --out folder -> --init-from, on one process and on tp 2), each checked against an oracle that
# shares no code with llm3d (lib/st_oracle.py: Python's standard library only), which also writes
# folders llm3d must read (sharded, BF16); inspect; and hostile folders, each refused in one line
# naming the file, the tensor and the value. Usage: hf.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, expect_error, train
start_test "$@"
oracle() { python3 "$(dirname "$0")/lib/st_oracle.py" "$@"; }

byte_corpus hf
TRAIN_FLAGS=("${TINY[@]}" --steps 3 --warmup 1)
TRAIN_LOG=check
train run 0 2 || exit 1
model=$dir/run/model.bin

# --out: model.bin and the folder hold the same weights (the oracle reads the folder)
check "--out writes config.json and model.safetensors" test -s "$dir/run/config.json" -a -s "$dir/run/model.safetensors"
check "  ... the oracle reads the llm.c file's weights in it" oracle check "$dir/run" "$model"
cp "$dir/run/model.safetensors" "$dir/flip.safetensors"
printf '\x01' | dd of="$dir/flip.safetensors" bs=1 seek=5000 conv=notrunc 2> /dev/null
mkdir -p "$dir/flip" && cp "$dir/run/config.json" "$dir/flip/" && mv "$dir/flip.safetensors" "$dir/flip/model.safetensors"
check "  (negative: the oracle finds one changed byte)" sh -c "! python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/flip' '$model' > /dev/null"

# llm.c file -> folder -> llm.c file, fp32: bit-identical; sharded; bf16 as the oracle rounds it
check "convert llm.c -> folder" "$bin" convert "$model" "$dir/hf1" > /dev/null
check "  ... the oracle agrees" oracle check "$dir/hf1" "$model"
check "  ... folder -> llm.c: bit-identical" sh -c "'$bin' convert '$dir/hf1' '$dir/back.bin' > /dev/null && cmp '$dir/back.bin' '$model'"
check "convert sharded (--save-shard-mb 0.1)" "$bin" convert "$model" "$dir/hfs" --save-shard-mb 0.1 > /dev/null
check "  ... an index and shards" sh -c "test -s '$dir/hfs/model.safetensors.index.json' && ls '$dir/hfs'/model-0000*-of-*.safetensors | wc -l | grep -qv '^1$' && test ! -e '$dir/hfs/model.safetensors'"
check "  ... the oracle reads them" oracle check "$dir/hfs" "$model"
check "  ... back: bit-identical" sh -c "'$bin' convert '$dir/hfs' '$dir/backs.bin' > /dev/null && cmp '$dir/backs.bin' '$model'"
check "convert --precision bf16" "$bin" convert "$model" "$dir/hfb" --precision bf16 > /dev/null
check "  ... BF16, rounded as the oracle rounds" oracle check "$dir/hfb" "$model" --dtype BF16
check "  (negative: not fp32)" sh -c "! python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/hfb' '$model' > /dev/null"

# folders the oracle writes: llm3d reads them to the llm.c file's bits
check "oracle's folder, 3 shards -> llm.c: bit-identical" sh -c "python3 '$(dirname "$0")/lib/st_oracle.py' write '$model' '$dir/py3' --shards 3 && '$bin' convert '$dir/py3' '$dir/py3.bin' > /dev/null && cmp '$dir/py3.bin' '$model'"
check "oracle's F16 folder -> llm.c" sh -c "python3 '$(dirname "$0")/lib/st_oracle.py' write '$model' '$dir/py16' --dtype F16 && '$bin' convert '$dir/py16' '$dir/py16.bin' > /dev/null"
check "  ... widened exactly (the oracle's F16 of them: its folder)" oracle check "$dir/py16" "$dir/py16.bin" --dtype F16
check "  ... llm3d's F16 folder of them: the same values" sh -c "'$bin' convert '$dir/py16.bin' '$dir/re16' --precision fp16 > /dev/null && python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/re16' '$dir/py16.bin' --dtype F16"

# a run started from the folder trains exactly as one started from the llm.c file
train initbin 0 2 --init-from "$model" --steps 2 && train inithf 0 2 --init-from "$dir/run" --steps 2
check "--init-from FOLDER = --init-from model.bin (2 steps on)" cmp "$dir/initbin/model.bin" "$dir/inithf/model.bin"
train inittpbin 2 2 --init-from "$model" --steps 2 --tp 2 && train inittp 2 2 --init-from "$dir/hfs" --steps 2 --tp 2
check "  ... on tp 2 (each rank its slice), from the sharded folder" cmp "$dir/inittpbin/model.bin" "$dir/inittp/model.bin"
check "  ... and its folder (gathered) = its model.bin" oracle check "$dir/inittp" "$dir/inittp/model.bin"
# ... and no rank holds the whole model on the host: a tp 2 run from a folder (256 channels, 4
# layers: 12.9 MB of fp32) peaks where the same run from the seed does (it read the folder whole
# on every rank and cut its slice: 7.5 MB more); its weights those of the llm.c file's
peak() { sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$dir/$1.log"; }
BIG=(--channels 256 --layers 4 --steps 1)
if train bigsrc 0 1 "${BIG[@]}" > "$dir/bigsrc.log" 2>&1 &&
    train bigseed 2 1 "${BIG[@]}" --tp 2 > "$dir/bigseed.log" 2>&1 &&
    train bigfold 2 1 "${BIG[@]}" --tp 2 --init-from "$dir/bigsrc" > "$dir/bigfold.log" 2>&1 &&
    train bigbin 2 1 "${BIG[@]}" --tp 2 --init-from "$dir/bigsrc/model.bin" > "$dir/bigbin.log" 2>&1 &&
    cmp "$dir/bigfold/model.bin" "$dir/bigbin/model.bin" &&
    [ "$(peak bigfold)" -le "$(($(peak bigseed) + 65536))" ]; then
    ok "tp 2 --init-from a folder peaks at $(peak bigfold) bytes, from the seed $(peak bigseed)"
else
    bad "tp 2 --init-from a folder peaks at $(peak bigfold) bytes, from the seed $(peak bigseed)"
fi
train savebf 0 2 --init-from "$model" --steps 2 --save-dtype bf16
check "--save-dtype bf16: the run's weights rounded" oracle check "$dir/savebf" "$dir/savebf/model.bin" --dtype BF16
expect_error "--init-from the folder --out writes into" "--init-from .*/inithf is the folder --out writes" \
    "$bin" train "${TINY[@]}" --steps 1 --batch 2 --init-from "$dir/inithf" --out "$dir/inithf" --overwrite
check "generate from the folder = from model.bin" sh -c "OMP_NUM_THREADS=2 '$bin' generate --init-from '$dir/run' --prompt 'row ' --max-tokens 16 --temperature 0 > '$dir/g1.txt' 2>/dev/null && OMP_NUM_THREADS=2 '$bin' generate --checkpoint '$model' --prompt 'row ' --max-tokens 16 --temperature 0 > '$dir/g2.txt' 2>/dev/null && cmp '$dir/g1.txt' '$dir/g2.txt'"

# Llama (LlamaForCausalLM's names; q|k|v and gate|up row blocks; untied head), once the model
# has Llama's blocks (issue 34's model part: train's --kv-heads)
if "$bin" train --help | grep -q -- '--kv-heads'; then
    train lrun 0 2 --model llama-tiny --steps 3
    lmodel=$dir/lrun/model.bin
    check "Llama: --out's folder holds model.bin's weights (the oracle)" oracle check "$dir/lrun" "$lmodel"
    check "  ... folder -> model.bin: bit-identical" sh -c "'$bin' convert '$dir/lrun' '$dir/lback.bin' > /dev/null && cmp '$dir/lback.bin' '$lmodel'"
    check "  ... the oracle's 2-shard folder -> model.bin: bit-identical" sh -c "python3 '$(dirname "$0")/lib/st_oracle.py' write '$lmodel' '$dir/lpy' --shards 2 && '$bin' convert '$dir/lpy' '$dir/lpy.bin' > /dev/null && cmp '$dir/lpy.bin' '$lmodel'"
    oracle hostile "$dir/lrun" swap_kv "$dir/lswap"
    check "  (negative: k_proj and v_proj swapped: the oracle finds it, llm3d reads other weights)" \
        sh -c "! python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/lswap' '$lmodel' > /dev/null && '$bin' convert '$dir/lswap' '$dir/lswap.bin' > /dev/null && ! cmp -s '$dir/lswap.bin' '$lmodel'"
    train lbin 2 2 --init-from "$lmodel" --steps 2 --tp 2 && train lhf 2 2 --init-from "$dir/lpy" --steps 2 --tp 2
    check "  ... --init-from the folder = model.bin on tp 2 (KV heads split)" cmp "$dir/lbin/model.bin" "$dir/lhf/model.bin"
    check "  ... bf16 folder, rounded as the oracle rounds" sh -c "'$bin' convert '$lmodel' '$dir/lbf' --precision bf16 > /dev/null && python3 '$(dirname "$0")/lib/st_oracle.py' check '$dir/lbf' '$lmodel' --dtype BF16"
else
    echo "skip: Llama folders end to end (train has no --kv-heads yet; test_hf checks the names and shapes)"
fi

# inspect
check "inspect a folder" sh -c "'$bin' inspect '$dir/hfs' > '$dir/insp.txt'"
check "  ... its model and tensors" sh -c "grep -q 'Hugging Face folder, gpt2, [0-9]* safetensors file' '$dir/insp.txt' && grep -q 'transformer.h.1.attn.c_attn.weight *F32  \[64, 192\]' '$dir/insp.txt'"
check "  ... --json" sh -c "'$bin' inspect '$dir/hf1' --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[\"kind\"]==\"hf_folder\" and d[\"L\"]==2 and len(d[\"tensors\"])==28, d'"

# hostile folders: one line each, naming the file, the tensor and the value
hostile() { # KIND PATTERN [SOURCE]
    oracle hostile "$dir/${3:-hf1}" "$1" "$dir/bad_$1"
    expect_error "hostile: $1" "$2" "$bin" convert "$dir/bad_$1" "$dir/out.bin"
}
hostile header_past_end "bad_header_past_end/model.safetensors: header length [0-9]* past the file's end"
hostile overlap "tensors transformer.wte.weight and transformer.wpe.weight overlap"
hostile out_of_range "tensor transformer.ln_f.bias: data_offsets \[[0-9]*, [0-9]*\] out of range"
hostile shape "tensor transformer.wpe.weight has shape \[64, 32\], but .*bad_shape/config.json needs \[32, 64\]"
hostile dtype "tensor transformer.ln_f.bias has dtype I64; llm3d reads F32, BF16 and F16"
hostile nan "tensor transformer.ln_f.bias: element 3 of 64 is NaN"
hostile missing_shard "names shard model-0000[0-9]-of-0000[0-9].safetensors (for tensor .*), which is missing" hfs
# one .safetensors file without its folder (issue 48): the folder's tensor table, and the file's
# own checks (header, byte ranges, overlaps, finite weights) refusing each damaged copy
check "inspect one .safetensors file" sh -c "'$bin' inspect '$dir/hf1/model.safetensors' > '$dir/insp1.txt'"
check "  ... the folder's tensor table, line for line" bash -c "diff <(grep '^    ' '$dir/insp1.txt') \
    <('$bin' inspect '$dir/hf1' | grep '^    ')"
check "  ... --json: the folder's tensors" bash -c "python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); \
    b=json.load(open(sys.argv[2])); assert a[\"kind\"]==\"safetensors\" and a[\"tensors\"]==b[\"tensors\"] \
    and len(a[\"tensors\"])==28, a' <('$bin' inspect '$dir/hf1/model.safetensors' --json) <('$bin' inspect '$dir/hf1' --json)"
for k in "header_past_end:header length [0-9]* past the file's end" \
         "overlap:tensors transformer.wte.weight and transformer.wpe.weight overlap" \
         "out_of_range:tensor transformer.ln_f.bias: data_offsets \[[0-9]*, [0-9]*\] out of range" \
         "nan:tensor transformer.ln_f.bias: element 3 of 64 is NaN"; do
    expect_error "inspect one damaged .safetensors file: ${k%%:*}" "bad_${k%%:*}/model.safetensors: .*${k#*:}" \
        "$bin" inspect "$dir/bad_${k%%:*}/model.safetensors"
done
check "  ... an I64 tensor is listed, said unchecked" sh -c "'$bin' inspect '$dir/bad_dtype/model.safetensors' | \
    grep -q '1 of a dtype llm3d does not read left unchecked' && '$bin' inspect '$dir/bad_dtype/model.safetensors' | \
    grep -q 'transformer.ln_f.bias *I64  \[32\]'"
expect_error "hostile: a folder as --init-from, its NaN named" "bad_nan/model.safetensors: tensor transformer.ln_f.bias: element 3" \
    "$bin" train "${TINY[@]}" --steps 1 --batch 2 --init-from "$dir/bad_nan"
# configs the code cannot honour: refused naming the key
cfgbad() { # NAME SED PATTERN
    cp -r "$dir/hf1" "$dir/cfg_$1" && sed -i "$2" "$dir/cfg_$1/config.json"
    expect_error "config: $1" "$3" "$bin" inspect "$dir/cfg_$1"
}
cfgbad model_type 's/"gpt2"/"bert"/' "\"model_type\" is \"bert\": llm3d reads gpt2, llama, mixtral, qwen3 and qwen3_moe"
cfgbad activation 's/"gelu_new"/"relu"/' "\"activation_function\" is \"relu\": llm3d cannot honour it"
cfgbad layers 's/"n_layer": 2/"n_layer": 3/' "no tensor transformer.h.2.ln_1.weight"
cfgbad rope 's/"model_type": "gpt2"/"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96, "max_position_embeddings": 32, "rope_scaling": {"rope_type": "yarn", "factor": 4}/' \
    "\"rope_scaling\" of type yarn: llm3d implements Llama 3.1's"
cfgbad bias 's/"model_type": "gpt2"/"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96, "max_position_embeddings": 32, "attention_bias": true/' \
    "\"attention_bias\" is true: llm3d cannot honour it"
exit $fail
