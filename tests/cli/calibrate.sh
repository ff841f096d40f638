#!/usr/bin/env bash
# llm3d bench --calibrate: on 2 ranks it writes a profile with every key of profiles/README.md's
# table, once each and no other, each measured figure with its comment, in range, and a gemm_eff
# curve of increasing sizes; on one rank, or with a bad flag or path, one clear error.
# Usage: calibrate.sh LLM3D SCRATCH_DIR; ctest sets L3D_MPIEXEC to the launcher of the MPI the
# binary was built with.
readme="$(dirname "$0")/../../profiles/README.md"
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, expect_error, fail
start_test "$@"

# errors: one line each, before any measurement
expect_error "one rank: names the mpiexec command" "mpiexec -n 2 llm3d bench --calibrate" \
    "$bin" bench --calibrate --out "$dir/one.prof"
"$bin" bench --calibrate --out "$dir/one.prof" > /dev/null 2>&1
check "  ... with exit status 2" test $? -eq 2
check "  ... and writes nothing" test ! -e "$dir/one.prof" -a -z "$(ls -a "$dir" | grep l3d-tmp)"
expect_error "unknown flag" "unknown flag, or a flag without its value: '--frobnicate'" \
    "$bin" bench --calibrate --frobnicate
expect_error "--out without a value" "a flag without its value: '--out'" "$bin" bench --calibrate --out
expect_error "a model that --tp does not split" "--tp 5, --cp 1, --ep 1, --batch 4 do not split model" \
    "$bin" bench --calibrate --model d6 --tp 5 --out "$dir/tp5.prof"
expect_error "layout flags without a model" "give --model NAME with them" \
    "$bin" bench --calibrate --tp 2 --out "$dir/m.prof"
expect_error "an unknown --model" "--model" "$bin" bench --calibrate --model d999 --out "$dir/m.prof"
expect_error "unwritable --out" "cannot create the --out profile $dir/nowhere/x.prof (a temporary file in $dir/nowhere): No such file" \
    "$bin" bench --calibrate --out "$dir/nowhere/x.prof"
expect_error "--out a directory" "is a directory" "$bin" bench --calibrate --out "$dir"

# the measurement, on 2 ranks of one OpenMP thread
prof="$dir/local.prof"
echo "stale" > "$prof"
# with a model: d6 on byte tokens, 2 x 128 tokens a micro-batch, its linear layers measured too
d6=(--model d6 --vocab 256 --context 128 --seq-len 128 --batch 2)
OMP_NUM_THREADS=1 "$mpiexec" -n 2 "$bin" bench --calibrate --quick "${d6[@]}" --out "$prof" > "$dir/log" 2>&1
rc=$?
check "mpiexec -n 2 bench --calibrate --quick" test $rc -eq 0
[ $rc -eq 0 ] || cat "$dir/log"
check "  ... says where it wrote" grep -q "^wrote $prof " "$dir/log"
check "  ... replaced the old file, no temporary left" test -z "$(ls -a "$(dirname "$prof")" | grep l3d-tmp)" -a "$(head -c 5 "$prof")" != stale

# keys: the first column of the README's table (some cells name several keys); those whose
# description starts with "optional" may be left out (at most once), the others appear once
keys=$(grep '^| `' "$readme" | cut -d'|' -f2 | grep -o '`[a-z0-9_]*`' | tr -d '`')
optional=$(grep '^| `[^|]*` | optional' "$readme" | cut -d'|' -f2 | grep -o '`[a-z0-9_]*`' |
    tr -d '`')
check "the README's table names 50 keys, 31 of them optional" \
    test "$(echo "$keys" | wc -l)" -eq 50 -a "$(echo "$optional" | wc -l)" -eq 31
for k in $keys; do
    n=$(grep -c "^$k = " "$prof")
    if echo "$optional" | grep -qx "$k"; then
        [ "$n" -le 1 ] || bad "optional key $k appears $n times"
    else
        [ "$n" -eq 1 ] || bad "key $k appears $n times"
    fi
done
grep -v '^#' "$prof" | grep -v '^$' | cut -d' ' -f1 | while read -r k; do
    echo "$keys" | grep -qx "$k" || echo "$k"
done > "$dir/unknown"
check "every line is a key of the table or a comment" test ! -s "$dir/unknown"
check "name = local" grep -qx "name = local" "$prof"

val() { sed -n "s/^$1 = //p" "$prof"; }
# between KEY LO HI: LO < value <= HI
between() { awk -v x="$(val "$1")" -v lo="$2" -v hi="$3" 'BEGIN { exit !(x + 0 == x && x > lo && x <= hi) }'; }
for k in peak_tflops_fp32 mem_gb mem_bw_gbs intra_bw_gbs intra_lat_us; do
    check "$k = $(val $k) is positive" between $k 0 1e9
done
# fractions of the FMA peak are at most 1: the peak is raised to the fastest product measured
# (under the sanitizers the instrumented FMA loop is slower than oneDNN's uninstrumented sgemm).
# The triad loop is instrumented too, so there only the sign of the other ratios is checked.
max=1.2
sanitized && max=1e9
check "attn_eff = $(val attn_eff) in (0, 1]" between attn_eff 0 1
check "kernel_bw_eff = $(val kernel_bw_eff) in (0, $max x 2]" between kernel_bw_eff 0 "$(awk -v m=$max 'BEGIN { print 2 * m }')"
# gemm_thread_eff: its one-core rates are measured again while it is above 1.25 (a busy machine
# halves them: 1.822 was written once, which plan refused), and a figure still above 1.25 after
# that is written as 1.25 under a comment that says what was measured
tmax=1.25
sanitized && tmax=1e9
check "gemm_thread_eff = $(val gemm_thread_eff) in (0, $tmax]" between gemm_thread_eff 0 $tmax
for t in "" _bf16 _fp16; do
    note="^# not as measured: gemm_thread_eff$t: measured [0-9.]* (above 1.25), written as 1.250"
    if grep -q "$note" "$prof"; then
        check "  ... gemm_thread_eff$t measured above 1.25: written as 1.250" \
            test "$(val gemm_thread_eff$t)" = 1.250
    fi
done
# dp_overlap: a fraction in [0, 1], the clamped (products + reduction - both) / reduction of the
# times its comment gives (to their 0.1 ms), polled on one node
ov_ok() { # FILE: its dp_overlap agrees with its comment's times
    local f c
    f=$(sed -n 's/^dp_overlap = //p' "$1")
    c=$(grep -B1 '^dp_overlap = ' "$1" | head -n 1)
    awk -v f="$f" -v c="$c" 'BEGIN {
        if (!match(c, /alone [0-9.]+ ms, the products alone [0-9.]+ ms, both [0-9.]+ ms/)) exit 1
        split(substr(c, RSTART, RLENGTH), w, " ")
        x = w[2]; p = w[7]; b = w[10]; h = (p + x - b) / x; h = h < 0 ? 0 : h > 1 ? 1 : h
        tol = 0.15 / x + 1e-3
        exit !(f + 0 == f && f >= 0 && f <= 1 && f - h < tol && h - f < tol) }'
}
ov_rejects() { ! ov_ok "$1"; }
ov=$(grep -B1 '^dp_overlap = ' "$prof" | head -n 1)
check "dp_overlap = $(val dp_overlap) from the times in its comment (${ov##*: the reduction alone })" \
    ov_ok "$prof"
awk '/^dp_overlap = / { print "dp_overlap = " ($3 > 0.5 ? 0 : 1); next } { print }' "$prof" \
    > "$dir/ov.prof"
check "  ... and the check rejects a dp_overlap of $(sed -n 's/^dp_overlap = //p' "$dir/ov.prof")" \
    ov_rejects "$dir/ov.prof"
check "  ... progressed by tests between the products (one node)" grep -q \
    "progressed by tests between the products" <<< "$ov"
check "llm3d plan reads the profile" "$bin" plan --profile "$prof" --model tiny --devices 2 --global-batch 4 --top 1 --json
check "devices_per_node = $(val devices_per_node): 1 to the online CPUs" \
    between devices_per_node 0 "$(getconf _NPROCESSORS_ONLN)"
check "pair_size = 1, pair_bw 0, no network" test "$(val pair_size) $(val pair_bw_gbs) \
$(val inter_bw_gbs) $(val inter_lat_us)" = "1 0 0 0"
# a 16-bit peak only where that type's products run in 16-bit kernels (gemm_native_T = yes, what
# the trainer's start-up line says too); else its products are fp32 ones, at the fp32 peak
for t in bf16 fp16; do
    case $(val gemm_native_$t) in
    yes) check "gemm_native_$t = yes: peak_tflops_$t = $(val peak_tflops_$t) is positive" \
        between peak_tflops_$t 0 1e9 ;;
    no) check "gemm_native_$t = no: peak_tflops_$t = 0" test "$(val peak_tflops_$t)" = 0 ;;
    *) bad "gemm_native_$t = '$(val gemm_native_$t)': yes or no" ;;
    esac
done
mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
check "mem_gb x devices is the machine's memory (within 5%)" awk -v g="$(val mem_gb)" \
    -v d="$(val devices_per_node)" -v kb="$mem_kb" 'BEGIN { r = g * d * 1e9 / (kb * 1024); exit !(r > 0.95 && r < 1.05) }'
for g in gemm_eff gemm_eff_bf16 gemm_eff_fp16; do
check "$g: 6+ points, strictly increasing FLOPs from <= 3e6 to >= 1e10, fractions in (0, 1]" \
    awk -v pts="$(val $g)" -v max=1 'BEGIN {
        n = split(pts, p, " "); if (n < 6) exit 1
        for (i = 1; i <= n; i++) {
            if (split(p[i], fe, ":") != 2) exit 1
            f = fe[1] + 0; e = fe[2] + 0
            if (!(e > 0 && e <= max) || (i > 1 && f <= prev)) exit 1
            if (i == 1) first = f
            prev = f
        }
        exit !(first <= 3e6 && prev >= 1e10) }'
done
# the weight-gradient products by tokens: the micro-batch rows measured (64..2048; --quick
# runs one shape a bucket, which leaves out some)
for g in gemm_eff_wgrad gemm_eff_wgrad_bf16 gemm_eff_wgrad_fp16; do
check "$g: 4+ points, strictly increasing tokens within 64..2048, fractions in (0, 1]" \
    awk -v pts="$(val $g)" 'BEGIN {
        n = split(pts, p, " "); if (n < 4) exit 1
        for (i = 1; i <= n; i++) {
            if (split(p[i], te, ":") != 2) exit 1
            t = te[1] + 0; e = te[2] + 0
            if (!(e > 0 && e <= 1) || t < 64 || t > 2048 || (i > 1 && t <= prev)) exit 1
            prev = t
        }
        exit 0 }'
done
# the products by shape: the grid (--quick: each row's first and last, 12 shapes) and d6's five
# linear layers (QKV 256x1152x384, projection 256x384x384, the MLP's 256x1536x384 and 256x384x1536,
# the head 256x256x384), each entry MxNxK:F (the grid) or MxNxK:F/W, fractions in (0, 1]
shapes_ok() { # KEY WANT N: N entries of the key's form, in range; WANT (if not "") the shapes
    awk -v pts="$(val "$1")" -v want="$2" -v n="$3" -v exact="$4" 'BEGIN {
        if (split(pts, p, " ") != n) exit 1
        for (i = 1; i <= n; i++) {
            if (split(p[i], se, ":") != 2 || split(se[1], s, "x") != 3) exit 1
            k = split(se[2], fw, "/"); if (k != (exact ? 2 : 1)) exit 1
            for (j = 1; j <= k; j++) if (!(fw[j] + 0 > 0 && fw[j] + 0 <= 1)) exit 1
            got = got (i > 1 ? " " : "") se[1]
        }
        exit !(want == "" || got == want) }'
}
d6_shapes="256x1152x384 256x384x384 256x1536x384 256x384x1536 256x256x384"
for t in "" _bf16 _fp16; do
    check "gemm_eff_grid$t: 12 shapes MxNxK:F in (0, 1]" shapes_ok gemm_eff_grid$t "" 12 0
    check "gemm_exact$t: d6's five linear layers MxNxK:F/W in (0, 1]" \
        shapes_ok gemm_exact$t "$d6_shapes" 5 1
done
shapes_reject() { ! shapes_ok "$@"; }
check "  ... and the check rejects another model's shapes" shapes_reject gemm_exact \
    "256x1152x384 256x384x384 256x1536x384 256x384x1536 256x512x384" 5 1
check "gemm_exact's comment names the model" grep -q \
    "^# measured by .*: with --model, model d6 (L=6 C=384 NH=6 V=256), batch 2, sequence 128, tp 1" "$prof"
# the planner takes the exact entries: d6's plan with them against without (the line removed)
plan_d6() {
    "$bin" plan "${d6[@]}" --grad-accum 1 --dp 1 --tp 1 --pp 1 --threads 1 --recompute none --profile "$1" --json | head -1 |
        sed -n 's/.*"t_gemm":\([^,]*\),.*/\1/p'
}
grep -v '^gemm_exact = ' "$prof" > "$dir/noexact.prof"
with=$(plan_d6 "$prof") without=$(plan_d6 "$dir/noexact.prof")
check "plan's products with gemm_exact ($with s) differ from without ($without s)" \
    awk -v a="$with" -v b="$without" 'BEGIN { exit !(a + 0 > 0 && b + 0 > 0 && a != b) }'
# the element-wise kernels one by one: all four named, in the order calibrate measures them, and
# their median is the file's kernel_bw_eff (to the 3 decimals written)
for t in "" _bf16 _fp16; do
check "kernel_bw_effs$t: layernorm, gelu, residual, adamw; their median is kernel_bw_eff$t" \
    awk -v pts="$(val kernel_bw_effs$t)" -v med="$(val kernel_bw_eff$t)" 'BEGIN {
        if (split(pts, p, " ") != 4 || med + 0 != med) exit 1
        split("layernorm gelu residual adamw", want, " ")
        for (i = 1; i <= 4; i++) {
            if (split(p[i], kv, ":") != 2 || kv[1] != want[i] || !(kv[2] + 0 > 0)) exit 1
            e[i] = kv[2] + 0
        }
        for (i = 1; i <= 4; i++) for (j = i + 1; j <= 4; j++) if (e[j] < e[i]) { x = e[i]; e[i] = e[j]; e[j] = x }
        m = (e[2] + e[3]) / 2
        exit !(m - med < 0.002 && med - m < 0.002) }'
done
for k in peak_tflops_fp32 mem_gb mem_bw_gbs devices_per_node intra_bw_gbs intra_lat_us gemm_eff \
    gemm_eff_wgrad attn_eff gemm_thread_eff kernel_bw_eff gemm_eff_bf16 gemm_eff_wgrad_bf16 \
    attn_eff_bf16 gemm_thread_eff_bf16 kernel_bw_eff_bf16 gemm_eff_fp16 gemm_eff_wgrad_fp16 \
    attn_eff_fp16 gemm_thread_eff_fp16 kernel_bw_eff_fp16; do
    grep -B1 "^$k = " "$prof" | head -1 | grep -Eq "^# measured by llm3d bench --calibrate --quick on [0-9]{4}-[0-9]{2}-[0-9]{2}: " ||
        bad "$k has no '# measured by ... on DATE:' comment above it"
done
exit $fail
