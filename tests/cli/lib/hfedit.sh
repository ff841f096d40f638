# Helpers of the Hugging Face folder tests (hfmoe.sh, hfqwen3.sh), sourced after checks.sh.
# oracle ARGS: the stdlib safetensors oracle (lib/st_oracle.py)
oracle() { python3 "$(dirname "$0")/lib/st_oracle.py" "$@"; }
# config.json of folder $1 with key $2 set to the JSON value $3, into folder $4 (the weights linked)
edit_config() {
    mkdir -p "$4" && ln -sf "$1/model.safetensors" "$4/model.safetensors" &&
        python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c[sys.argv[2]]=json.loads(sys.argv[3]); json.dump(c, open(sys.argv[4], 'w'))" \
            "$1/config.json" "$2" "$3" "$4/config.json"
}
