#!/usr/bin/env bash
# llm3d plan against the trainer: for layouts the trainer runs here (1-8 ranks mixing tp, pp, dp,
# ZeRO, micro-batches, recomputation, schedules), the planner's predicted peak memory of the
# fullest rank must equal the trainer's accounted peak (llm3d's allocator: parameters, gradients,
# AdamW moments, activations, token buffers) within 1%; then the planner's own checks: bad
# profiles and layouts give one clear error, the search returns valid fitting layouts, and
# docs/frontier.md is what `llm3d plan --published` prints. Usage: plan.sh LLM3D SCRATCH_DIR.
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"
prof=$src/tests/data/plan/cpu.prof

for i in $(seq 1 300); do echo "line $i of the planner's corpus: $((i * 53 % 97)) apples"; done > "$dir/corpus.txt"
"$bin" prepare --tokenizer bytes --out "$dir/data" --val-fraction 0.1 "$dir/corpus.txt" > /dev/null || exit 1

model=(--layers 4 --heads 4 --vocab 256)
# mem NAME NP B ACCUM PLAN_FLAGS -- TRAIN_FLAGS: run the trainer, compare its peak with the plan
mem() {
    local name=$1 np=$2 b=$3 accum=$4
    shift 4
    local pflags=() tflags=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do pflags+=("$1"); shift; done
    shift
    tflags=("$@")
    local launch=()
    [ "$np" -gt 1 ] && launch=("$mpiexec" -n "$np")
    if ! bounded env OMP_NUM_THREADS=1 "${launch[@]}" "$bin" train "${model[@]}" --channels 128 --context 64 \
        --seq-len 64 --batch "$b" --grad-accum "$accum" --steps 2 --val-every 0 \
        --train "$dir/data/train_*.bin" "${tflags[@]}" > "$dir/$name.log" 2>&1; then
        bad "$name: the trainer failed"; cat "$dir/$name.log"; return
    fi
    local measured
    measured=$(sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$dir/$name.log")
    local json
    if ! json=$("$bin" plan "${model[@]}" --channels 128 --seq-len 64 --profile "$prof" \
        --precision fp32 --devices "$np" --batch "$b" "${pflags[@]}" --json 2> "$dir/$name.plan"); then
        bad "$name: llm3d plan failed: $(cat "$dir/$name.plan")"; return
    fi
    local predicted
    predicted=$(echo "$json" | head -1 | sed -n 's/.*"mem_total":\([0-9]*\).*/\1/p')
    if [ -z "$measured" ] || [ -z "$predicted" ]; then
        bad "$name: no figures (measured '$measured', predicted '$predicted')"; return
    fi
    local rel
    rel=$(awk -v a="$predicted" -v b="$measured" 'BEGIN { printf "%.4f", (a - b) / b }')
    if awk -v r="$rel" 'BEGIN { exit !(r < 0.01 && r > -0.01) }'; then
        ok "$name: predicted $predicted bytes, measured $measured ($rel)"
    else
        bad "$name: predicted $predicted bytes, measured $measured ($rel)"
    fi
}

# NAME NP B ACCUM   plan flags (global batch = B x ACCUM x dp)   --   train flags. The `full &&`
# layouts are left out under the sanitizers and on the checking backend: the trainer's code for
# each runs there in tests/cli/equiv.sh (dp2_zero1, tp2, pp2_1f1b; pp2_gpipe's selective
# recomputation in pp2_tp2_dp2_zero1_recompute, its schedule's order is data) and the planner's
# in test_plan (GPipe's and ZeRO-1's memory) and the searches below; the layouts kept measure
# ZeRO-2, ZeRO-3 (its default prefetch: two layer buffers), TP with SP, each recomputation and an
# interleaved pipeline.
mem one        1 2 1  --global-batch 2  --tp 1 --pp 1 --zero 0 --recompute none -- 
mem accum_full 1 2 4  --global-batch 8  --tp 1 --pp 1 --zero 0 --recompute full -- --recompute full
full && mem dp2_zero1  2 2 1  --global-batch 4  --tp 1 --pp 1 --zero 1 --recompute none -- --zero 1
mem dp2_zero2  2 1 3  --global-batch 6  --tp 1 --pp 1 --zero 2 --recompute none -- --zero 2
mem dp2_zero3  2 1 3  --global-batch 6  --tp 1 --pp 1 --zero 3 --recompute none -- --zero 3
full && mem tp2_dp2_zero3_p2 4 1 2 --global-batch 4 --tp 2 --pp 1 --zero 3 --zero3-prefetch 2 --recompute full --no-sequence-parallel -- --tp 2 --zero 3 --zero3-prefetch 2 --recompute full
full && mem tp2        2 2 1  --global-batch 2  --tp 2 --pp 1 --zero 0 --recompute none --no-sequence-parallel -- --tp 2
mem tp2_sp_sel 2 2 2  --global-batch 4  --tp 2 --pp 1 --zero 0 --recompute selective --sequence-parallel -- --tp 2 --sequence-parallel --recompute selective
full && mem pp2_1f1b   2 2 4  --global-batch 8  --tp 1 --pp 2 --zero 0 --recompute none --pp-virtual 1 --pp-schedule 1f1b -- --pp 2
# zb-h1: 1F1B's slots plus the stash of W's inputs (the search would pick it for the layout above)
mem pp2_zbh1   2 2 4  --global-batch 8  --tp 1 --pp 2 --zero 0 --recompute none --pp-virtual 1 --pp-schedule zb-h1 -- --pp 2 --pp-schedule zb-h1
# zbv: two chunks a rank in a V (rank 0 the embedding's and the head's)
mem pp2_zbv    2 2 4  --global-batch 8  --tp 1 --pp 2 --zero 0 --recompute none --pp-virtual 2 --pp-schedule zbv -- --pp 2 --pp-virtual 2 --pp-schedule zbv
full && mem pp2_zbv_zero2_full 2 2 4 --global-batch 8 --tp 1 --pp 2 --zero 2 --recompute full --pp-virtual 2 --pp-schedule zbv -- --pp 2 --pp-virtual 2 --zero 2 --recompute full --pp-schedule zbv
full && mem pp2_gpipe  2 1 4  --global-batch 4  --tp 1 --pp 2 --zero 0 --recompute selective --pp-schedule gpipe -- --pp 2 --pp-schedule gpipe --recompute selective
mem pp2_v2     2 1 4  --global-batch 4  --tp 1 --pp 2 --zero 0 --recompute none --pp-virtual 2 -- --pp 2 --pp-virtual 2 --pp-schedule interleaved
full && mem tp2_dp2_zero2 4 1 2 --global-batch 4 --tp 2 --pp 1 --zero 2 --recompute full --no-sequence-parallel -- --tp 2 --zero 2 --recompute full
full && mem tp2_pp2_dp2 8 1 4 --global-batch 8 --tp 2 --pp 2 --zero 1 --recompute selective --no-sequence-parallel --pp-virtual 1 -- --tp 2 --pp 2 --zero 1 --recompute selective
# the chunked cross-entropy (--xent-chunk): one chunk of 9 rows' logits in the shared region, not
# every row's in each slot (a vocabulary of 8192: the logits 4 MiB of a micro-batch unchunked);
# on one rank, a tp slice of the vocabulary with SP, and zb-h1's head once
xv=(--vocab 8192 --xent-chunk 9)
mem xent_one   1 2 1  --global-batch 2  --tp 1 --pp 1 --zero 0 --recompute none "${xv[@]}" -- "${xv[@]}"
mem xent_tp2_sp 2 2 1 --global-batch 2  --tp 2 --pp 1 --zero 0 --recompute none --sequence-parallel "${xv[@]}" -- --tp 2 --sequence-parallel "${xv[@]}"
mem xent_pp2_zbh1 2 2 4 --global-batch 8 --tp 1 --pp 2 --zero 0 --recompute none --pp-virtual 1 --pp-schedule zb-h1 "${xv[@]}" -- --pp 2 --pp-schedule zb-h1 "${xv[@]}"
# Llama blocks (RMSNorm, RoPE, grouped-query attention with 2 KV heads, SwiGLU, untied head)
llama=(--arch llama --kv-heads 2 --ffn 320)
mem llama_one  1 2 1  --global-batch 2  --tp 1 --pp 1 --zero 0 --recompute none "${llama[@]}" -- "${llama[@]}"
mem llama_tp2_sp_pp2 4 1 2 --global-batch 2 --tp 2 --pp 2 --zero 0 --recompute selective --sequence-parallel --pp-virtual 1 "${llama[@]}" -- --tp 2 --pp 2 --sequence-parallel --recompute selective "${llama[@]}"
# heads of 48 over 128 channels and 4 heads (--head-dim, Qwen3's head_dim apart from h / heads:
# q|k|v of (4 + 2 x 2) x 48 rows, the projection's 192 columns) with QK-norm; TP + SP + PP, and CP
hd=(--arch llama --kv-heads 2 --ffn 320 --head-dim 48 --qk-norm)
mem hd_one     1 2 1  --global-batch 2  --tp 1 --pp 1 --zero 0 --recompute none "${hd[@]}" -- "${hd[@]}"
mem hd_tp2_sp_pp2 4 1 2 --global-batch 2 --tp 2 --pp 2 --zero 0 --recompute selective --sequence-parallel --pp-virtual 1 "${hd[@]}" -- --tp 2 --pp 2 --sequence-parallel --recompute selective "${hd[@]}"
mem hd_cp2_zero1 2 2 1 --global-batch 2 --tp 1 --pp 1 --cp 2 --zero 1 --recompute none "${hd[@]}" -- --cp 2 --zero 1 "${hd[@]}"
# Mixtures of experts (issue 46 item 6): 4 experts of width 256, top-2; one process, expert
# parallelism over 2 ranks (half the experts a rank; ZeRO-1 over the dp / ep = 1 ranks holding
# them: nothing sharded) and over 4 (ZeRO-2 over 2, full recomputation)
moe=(--moe-experts 4 --moe-top-k 2 --moe-ffn 256)
mem moe_one    1 2 1  --global-batch 2  --tp 1 --pp 1 --ep 1 --zero 0 --recompute none "${moe[@]}" -- "${moe[@]}"
mem moe_ep2_zero1 2 2 1 --global-batch 4 --tp 1 --pp 1 --ep 2 --zero 1 --recompute none "${moe[@]}" -- --ep 2 --zero 1 "${moe[@]}"
full && mem moe_ep2_dp4_zero2 4 1 2 --global-batch 8 --tp 1 --pp 1 --ep 2 --zero 2 --recompute full "${moe[@]}" -- --ep 2 --zero 2 --recompute full "${moe[@]}"
# and on the other layouts (experts whole on each TP rank; a pipeline stage's MoE layers; the EP
# group over dp x cp)
full && mem moe_tp2 2 2 1 --global-batch 2 --tp 2 --pp 1 --ep 1 --zero 0 --recompute none --no-sequence-parallel "${moe[@]}" -- --tp 2 "${moe[@]}"
full && mem moe_pp2 2 1 4 --global-batch 4 --tp 1 --pp 2 --ep 1 --zero 0 --recompute none --pp-virtual 1 --pp-schedule 1f1b "${moe[@]}" -- --pp 2 "${moe[@]}"
mem moe_cp2_ep2_zero1 4 2 1 --global-batch 4 --tp 1 --pp 1 --cp 2 --ep 2 --zero 1 --recompute none "${moe[@]}" -- --cp 2 --ep 2 --zero 1 "${moe[@]}"
# the search splits the experts (an ep column in --json, its all-to-all time); --ep that does
# not divide the experts is the validator's sentence
json=$("$bin" plan "${model[@]}" --channels 128 --seq-len 64 --profile "$prof" --precision fp32 \
    --devices 2 --global-batch 4 "${moe[@]}" --top 40 --json)
check "the search tries ep 2 of a mixture of experts (all-to-all time > 0)" \
    grep -q '"ep":2,"t_ep":0\.0*[1-9]' <<< "$json"
check "  ... and ep 1 (no all-to-all)" grep -q '"ep":1,"t_ep":0[,}]' <<< "$json"
expect_error "--ep 3 of 4 experts" "--ep 3 does not divide --moe-experts 4" \
    "$bin" plan "${model[@]}" --channels 128 --seq-len 64 --profile "$prof" --precision fp32 \
    --devices 3 --global-batch 3 "${moe[@]}" --ep 3
expect_error "--ep of a dense model" "--ep 2 without --moe-experts" \
    "$bin" plan "${model[@]}" --channels 128 --seq-len 64 --profile "$prof" --precision fp32 \
    --devices 2 --global-batch 4 --ep 2
# the trainer's memory check proposes the experts' split: 2 ranks whose room holds ep 2 (each
# rank half of the wide experts' state) but not every expert on each rank
wide=(--moe-experts 4 --moe-top-k 1 --moe-ffn 2048)
out=$(L3D_TEST_MEM_AVAILABLE=180000000 bounded env OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" train \
    "${model[@]}" --channels 128 --context 64 --seq-len 64 --batch 1 --steps 1 --val-every 0 \
    --train "$dir/data/train_*.bin" "${wide[@]}" 2>&1 < /dev/null)
check "the memory check's alternatives split the experts (--ep 2)" \
    grep -q "not enough memory: .*layouts of 2 rank(s) that fit: --ep 2 (" <<< "$out"

# One set of flags, three commands (the run spec's flag table, src/cli/flags.c): a 3-D layout
# (tp 2 x pp 2 x dp 2) with sequence parallelism, the interleaved schedule and ZeRO-2. train runs
# it and says its layout at start-up; plan, given the very same flags, evaluates that one layout
# and predicts the trainer's accounted peak within 1%; bench parses them alike and refuses the 8
# ranks it does not have (it runs as one process).
same=("${model[@]}" --channels 128 --context 64 --seq-len 64 --batch 2 --grad-accum 2 --tp 2 --pp 2
      --dp 2 --pp-virtual 2 --zero 2 --sequence-parallel --recompute selective)
if full; then
    if bounded env OMP_NUM_THREADS=1 "$mpiexec" -n 8 "$bin" train "${same[@]}" --steps 2 \
        --val-every 0 --train "$dir/data/train_*.bin" > "$dir/same.log" 2>&1; then
        check "same flags: train's start-up line says tp 2 x pp 2 x dp 2, ZeRO-2" \
            grep -q "^layout: 8 rank(s) = tp 2 x pp 2 x dp 2, ZeRO-2" "$dir/same.log"
        check "  ... and the interleaved schedule of 2 chunks, 2 micro-batches" \
            grep -q "^pipeline: interleaved schedule (chosen for --pp-virtual > 1.*2 micro-batches, 2 stage(s) x 2 chunk(s)" "$dir/same.log"
        measured=$(sed -n 's/.*peak host memory .* MiB (\([0-9]*\) bytes.*/\1/p' "$dir/same.log")
        json=$("$bin" plan "${same[@]}" --profile "$prof" --json 2>&1 | head -1)
        get() { echo "$json" | sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"]*\)\"\{0,1\},.*/\1/p"; }
        check "same flags: plan evaluates tp 2, pp 2, dp 2, batch 2, v 2, ZeRO-2, SP, selective" \
            test "$(get tp) $(get pp) $(get dp) $(get mb) $(get v) $(get zero) $(get sp) $(get recompute) $(get schedule) $(get m)" = \
                 "2 2 2 2 2 2 true selective interleaved 2"
        predicted=$(get mem_total)
        rel=$(awk -v a="$predicted" -v b="$measured" 'BEGIN { if (b > 0 && a > 0) printf "%.4f", (a - b) / b; else print "nan" }')
        check "same flags: plan's memory $predicted bytes, the trainer's peak $measured ($rel)" \
            awk -v r="$rel" 'BEGIN { exit !(r + 0 == r && r < 0.01 && r > -0.01) }'
    else
        bad "same flags: the trainer failed: $(tail -3 "$dir/same.log")"
    fi
    expect_error "same flags: bench reads the same layout (8 ranks) and has one" \
        "--tp 2 x --pp 2 x --dp 2 = 8 ranks, but the world size is 1" \
        "$bin" bench "${same[@]}" --steps 1
fi

# ---- the planner's own checks --------------------------------------------------------------
# bad profiles: one line naming the file, line and key
sed 's/^attn_eff/attn_efff/' "$prof" > "$dir/typo.prof"
expect_error "profile with an unknown key" "typo.prof line .*unknown key 'attn_efff'" \
    "$bin" plan --profile "$dir/typo.prof" --precision fp32
grep -v '^kernel_bw_eff' "$prof" > "$dir/missing.prof"
expect_error "profile with a missing key" "missing.prof: key 'kernel_bw_eff' is missing" \
    "$bin" plan --profile "$dir/missing.prof" --precision fp32
sed 's/^gemm_eff = .*/gemm_eff = 1e8:0.5 1e6:0.6/' "$prof" > "$dir/order.prof"
expect_error "efficiency points out of order" "increasing flops" \
    "$bin" plan --profile "$dir/order.prof" --precision fp32
expect_error "no such profile" "no profile 'nosuch'" "$bin" plan --profile nosuch
expect_error "unknown model" "--model 'd13' is not a preset" "$bin" plan --model d13 --profile frontier
# (Megatron-LM's bf16 needs bf16 products; llm3d's runs them as fp32 products on such a CPU)
expect_error "precision without a peak" "no bf16 peak" \
    "$bin" plan --profile "$prof" --precision bf16 --trainer megatron
expect_error "tp that does not divide the ranks" "--tp 3 does not divide the 4 ranks" \
    "$bin" plan --model d12 --profile frontier --devices 4 --tp 3
expect_error "ZeRO-3 on a GPU profile: the trainer's rule named" \
    "--zero 3: the plan follows Megatron-LM's bf16 mixed precision .*give --trainer llm3d" \
    "$bin" plan --zero 3 --profile dgx-h100
check "  ... --trainer llm3d plans it there" "$bin" plan --zero 3 --profile dgx-h100 --trainer llm3d
expect_error "zb-h1 in Megatron-LM's mode" "--pp-schedule zb-h1: the plan follows Megatron-LM" \
    "$bin" plan --model d12 --profile dgx-h100 --devices 8 --global-batch 32 --tp 1 --pp 4 --dp 2 \
    --batch 1 --zero 1 --recompute none --pp-virtual 1 --pp-schedule zb-h1
json=$("$bin" plan --model d12 --profile dgx-h100 --trainer llm3d --devices 8 --global-batch 32 \
    --pp 4 --pp-virtual 1 --top 40 --json)
zb=$(echo "$json" | grep -c '"schedule":"zb-h1"')
one=$(echo "$json" | grep -c '"schedule":"1f1b"')
check "the trainer's search tries zb-h1 beside 1F1B ($zb, $one)" test "$zb" -gt 0 -a "$one" -gt 0
json=$("$bin" plan --model d12 --profile dgx-h100 --trainer llm3d --devices 8 --global-batch 32 \
    --pp 2 --pp-virtual 2 --top 400 --json)
zbv=$(echo "$json" | grep -c '"schedule":"zbv"')
il=$(echo "$json" | grep -c '"schedule":"interleaved"')
check "  ... and zbv beside interleaved 1F1B at two chunks a rank ($zbv, $il)" test "$zbv" -gt 0 -a "$il" -gt 0
check "  ... each with its bubble" test "$(echo "$json" | grep '"schedule":"zbv"' | grep -c '"bubble_fraction":0\.[0-9]')" -gt 0
expect_error "zbv with one chunk a rank" "--pp-schedule zbv places two model chunks on each rank" \
    "$bin" plan --model d12 --profile dgx-h100 --trainer llm3d --devices 8 --global-batch 32 --tp 1 \
    --pp 2 --dp 4 --batch 1 --zero 1 --recompute none --pp-virtual 1 --pp-schedule zbv
expect_error "a schedule needs the whole layout" "--pp-schedule evaluates one layout" \
    "$bin" plan --profile frontier --devices 8 --pp-schedule gpipe
expect_error "interleaving needs m divisible by pp" "multiple of --pp 4" \
    "$bin" plan --model d12 --profile frontier --devices 4 --global-batch 6 --tp 1 --pp 4 \
    --batch 1 --zero 0 --recompute none --pp-virtual 3 --pp-schedule interleaved

# the search: every layout listed is valid, fits, and comes out sorted by step time; the same
# layout evaluated alone gives the same figures
json=$("$bin" plan --model frontier-175b --profile frontier --devices 3072 --global-batch 1536 \
    --top 20 --json)
n=$(echo "$json" | grep -c '"fits":true')
check "3072-GCD search lists 20 fitting layouts ($n)" test "$n" -eq 20
sorted=$(echo "$json" | sed -n 's/.*"step_s":\([0-9.e+-]*\).*/\1/p' | sort -g -c && echo yes)
check "search results sorted by step time" test "$sorted" = yes
prod=$(echo "$json" |
    sed -n 's/.*"tp":\([0-9]*\),"pp":\([0-9]*\),"dp":\([0-9]*\),.*"cp":\([0-9]*\),.*/\1 \2 \3 \4/p' |
    awk '$1 * $2 * $3 * $4 != 3072 { bad = 1 } END { print bad || NR != 20 ? "no" : "yes" }')
check "tp x cp x pp x dp = 3072 for every layout" test "$prod" = yes
first=$(echo "$json" | head -1)
get() { echo "$first" | sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"]*\)\"\{0,1\},.*/\1/p"; }
sp=$(get sp); [ "$sp" = true ] && sp=--sequence-parallel || sp=--no-sequence-parallel
again=$("$bin" plan --model frontier-175b --profile frontier --devices 3072 --global-batch 1536 \
    --tp "$(get tp)" --cp "$(get cp)" --pp "$(get pp)" --batch "$(get mb)" --pp-virtual "$(get v)" \
    --zero "$(get zero)" --recompute "$(get recompute)" "$sp" --json)
check "the best layout evaluated alone: same step time" \
    test "$(echo "$again" | sed -n 's/.*"step_s":\([^,]*\),.*/\1/p')" = "$(get step_s)"
out=$("$bin" plan --model frontier-1t --profile frontier --devices 3072 --global-batch 3072)
check "the table names why the best wins" grep -q '^why: .*faster than the best layout of another shape' <<< "$out"
check "a 1T model does not fit on 8 GCDs" \
    bash -c "! '$bin' plan --model frontier-1t --profile frontier --devices 8 --global-batch 8 > /dev/null"

# ---- robustness (issue 18): each of these failed on 072c816 ----------------------------------
# the search is fast for any input: 8192 layers took minutes (an O(stages L^2) partition a
# layout); absurd sizes are one clear error
check "8192 layers on 64 devices: searched within a minute" \
    timeout 60 "$bin" plan --layers 8192 --channels 256 --heads 4 --vocab 256 --seq-len 64 \
    --profile frontier --precision fp32 --devices 64 --top 1
expect_error "a model beyond 10^15 parameters" "the planner sizes models up to 10^15 parameters" \
    "$bin" plan --layers 65536 --channels 1048576 --heads 16 --vocab 256 --seq-len 64 \
    --profile frontier
# --json: a failed search prints a JSON error object, and exits non-zero
out=$("$bin" plan --model frontier-1t --profile frontier --devices 8 --global-batch 8 --json \
    2> /dev/null)
rc=$?
check "--json with nothing fitting: an error object ($out), exit $rc" \
    bash -c "[ $rc -ne 0 ] && grep -q '^{\"error\":\"no layout fits' <<< '$out'"
out=$("$bin" plan --model d12 --profile frontier --devices 4 --tp 3 --json 2> /dev/null)
check "--json with a bad layout: an error object naming it" \
    grep -q '^{"error":"--tp 3 does not' <<< "$out"
# JSON strings are escaped
sed 's/^name = .*/name = my "quoted\\" profile/' "$prof" > "$dir/quote.prof"
out=$("$bin" plan "${model[@]}" --channels 128 --seq-len 64 --profile "$dir/quote.prof" \
    --precision fp32 --devices 1 --global-batch 2 --top 1 --json)
check "a quote in the profile name is escaped" \
    grep -qF '"profile":"my \"quoted\\\" profile",' <<< "$out"
# profile values have ranges
sed 's/^mem_gb = .*/mem_gb = 1e308/' "$prof" > "$dir/huge.prof"
expect_error "a 1e308 memory" \
    "huge.prof line .*mem_gb = 1e308 is out of range: allowed above 0 to 100000" \
    "$bin" plan --profile "$dir/huge.prof" --precision fp32
sed 's/^intra_lat_us = .*/intra_lat_us = 1e308/' "$prof" > "$dir/slow.prof"
expect_error "a 1e308 latency" "slow.prof line .*intra_lat_us = 1e308 is out of range" \
    "$bin" plan --profile "$dir/slow.prof" --precision fp32
# a whole layout that does not fit is not "best": an error, non-zero exit
expect_error "a fixed layout that does not fit" \
    "the layout does not fit: .* GB on the fullest device" \
    "$bin" plan --model frontier-175b --profile frontier --devices 128 --global-batch 640 --tp 4 \
    --pp 16 --batch 4 --zero 0 --recompute none --pp-schedule 1f1b
# the runtime's reserve counts against "fits" (not the predicted bytes): the 0.2 GB of the test
# profile's reserve, printed with the search
out=$("$bin" plan "${model[@]}" --channels 128 --seq-len 64 --profile "$prof" --precision fp32 \
    --devices 1 --global-batch 2)
check "the search names the runtime's reserve" \
    grep -q 'fit in 12.0 GB (0.2 GB kept by the runtime)' <<< "$out"
# a directory is not "empty"
expect_error "--profile DIR/" "is a directory: give a profile file" \
    "$bin" plan --profile "$src/profiles/"
# --layers without --model says what it assumed
err=$("$bin" plan --layers 4 --profile frontier --devices 8 --top 1 2>&1 > /dev/null)
check "--layers alone names the sizes assumed" \
    grep -q "sizes not given are d12's (GPT-2 124M): --channels 768, --heads 12, --vocab 50257" \
    <<< "$err"

# the fitted GEMM factor applies only when asked for, and says so
out=$("$bin" plan --model frontier-175b --profile frontier --devices 128 --global-batch 640 --tp 4 \
    --pp 16 --batch 1 --zero 1 --recompute full --no-sequence-parallel --pp-virtual 1 --json)
cal=$("$bin" plan --model frontier-175b --profile frontier --devices 128 --global-batch 640 --tp 4 \
    --pp 16 --batch 1 --zero 1 --recompute full --no-sequence-parallel --pp-virtual 1 --json \
    --calibrated)
s0=$(sed -n 's/.*"step_s":\([^,]*\),.*/\1/p' <<< "$out")
s1=$(sed -n 's/.*"step_s":\([^,]*\),.*/\1/p' <<< "$cal")
check "--calibrated slows the GEMMs of the fit-free prediction ($s0 s -> $s1 s)" \
    less_than "$s0" "$s1"
check "--calibrated is named in the table" bash -c "'$bin' plan --model d12 --profile frontier \
    --devices 8 --calibrated | grep -q '^calibrated: the GEMM curve times 0.825'"

# one spelling in every command: the planner's old ones name the new (src/cli/flags.c)
expect_error "plan --trainer: its two choices" "--trainer 'x': choose llm3d .* or megatron" \
    "$bin" plan --trainer x --profile "$prof"
expect_error "plan --hidden names --channels" "--hidden is now --channels" \
    "$bin" plan --hidden 128 --profile "$prof"
expect_error "plan --micro-batch names --batch" "--micro-batch is now --batch" \
    "$bin" plan --micro-batch 2 --profile "$prof"
expect_error "plan --sequence-parallel yes: a switch now" "switches take no value now" \
    "$bin" plan --tp 2 --sequence-parallel yes --profile "$prof"
expect_error "  ... and so in train" "switches take no value now" \
    "$bin" train --model tiny --train "$dir/data/train_*.bin" --sequence-parallel yes

# docs/frontier.md is what the planner prints
check "docs/frontier.md is current" bash "$src/scripts/plan_published.sh" "$bin" --check

exit $fail
