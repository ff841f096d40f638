# Helpers of the Hugging Face folder tests (hfmoe.sh, hfqwen3.sh), sourced after checks.sh.
# oracle ARGS: the stdlib safetensors oracle (lib/st_oracle.py)
oracle() { python3 "$(dirname "$0")/lib/st_oracle.py" "$@"; }
# config.json of folder $1 with key $2 set to the JSON value $3, into folder $4 (the weights linked)
edit_config() {
    mkdir -p "$4" && ln -sf "$1/model.safetensors" "$4/model.safetensors" &&
        python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c[sys.argv[2]]=json.loads(sys.argv[3]); json.dump(c, open(sys.argv[4], 'w'))" \
            "$1/config.json" "$2" "$3" "$4/config.json"
}
# gen_greedy PATH [flags]: 24 greedy tokens after "row" generated from the model at PATH
gen_greedy() {
    local p=$1; shift
    "$bin" generate --checkpoint "$p" --tokenizer bytes --prompt row --max-tokens 24 \
        --temperature 0 "$@" 2> "$dir/gen.log"
}
# gen_same DESCRIPTION PATH [flags]: the KV cache's greedy tokens (the MoE block over each step's
# new rows) are the full forward's (--no-kv-cache: the argmax of its logits at each position)
gen_same() {
    local what=$1 p=$2 a b
    shift 2
    a=$(gen_greedy "$p" "$@") && b=$(gen_greedy "$p" --no-kv-cache "$@") && [ "$a" = "$b" ] &&
        [ ${#a} -gt 3 ] && { ok "$what: KV cache = full forward: $(echo "$a" | head -c 30 | tr -c '[:print:]' ' ')"; return 0; }
    bad "$what: KV cache '$a', full forward '$b'"; cat "$dir/gen.log"; return 1
}
