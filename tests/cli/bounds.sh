#!/usr/bin/env bash
# The bounds of every numeric flag (the flag tables of src/cli/flags.c and of each command): both
# bounds are accepted and one past each is refused with one line naming the flag; where --help
# states the range, it states these bounds. The table below is the documented contract, written
# out rather than read from the sources, so that a bound changed in the code (or in --help) fails
# here. Every flag of every command whose value must be a number is in it: a flag that refuses
# "x" as not a number and is missing from the table fails too. Validation only: the parser reads
# the flags in order and --help, given last, ends the command before anything runs (4 ms a call).
# Usage: bounds.sh LLM3D SCRATCH_DIR
source "$(dirname "$0")/lib/checks.sh" # ok, bad, check, fail
start_test "$@"

# COMMANDS FLAG LO HI BELOW ABOVE [HELP]: the commands (comma-separated; tokenizer:train is
# `tokenizer train`) whose --FLAG takes LO..HI, a value BELOW LO and one ABOVE HI, and the words
# the flag's --help entry states the range in (LO and HI replaced by the bounds, _ by a space)
spec=train,bench,plan
table="
$spec layers 1 65536 0 65537
$spec channels 1 1048576 0 1048577
$spec heads 1 65536 0 65537
$spec vocab 2 1073741824 1 1073741825
$spec context 1 16777216 0 16777217
$spec ffn 1 67108864 0 67108865
$spec kv-heads 1 65536 0 65537
$spec head-dim 1 1048576 0 1048577
$spec xent-chunk 0 1073741824 -1 1073741825
$spec rope-theta 1 1e12 0.999999 1.000001e12
$spec norm-eps 1e-12 0.5 9.99999e-13 0.500001
$spec tp 1 1048576 0 1048577
$spec cp 1 1048576 0 1048577
$spec pp 1 1048576 0 1048577
$spec dp 1 16777216 0 16777217
$spec ep 1 65536 0 65537
$spec pp-virtual 1 256 0 257
$spec moe-experts 0 65536 -1 65537
$spec moe-top-k 0 65536 -1 65537
$spec moe-ffn 1 67108864 0 67108865
$spec moe-shared-experts 0 65536 -1 65537
$spec moe-dense-layers 0 65536 -1 65537
$spec moe-aux-loss-coef 0 1e6 -0.001 1.01e6
$spec moe-z-loss-coef 0 1e6 -0.001 1.01e6
$spec moe-capacity-factor 0 1e6 -0.001 1.01e6
$spec pp-first-layers 1 65536 0 65537
$spec pp-last-layers 1 65536 0 65537
$spec batch 1 1073741824 0 1073741825
$spec seq-len 1 16777216 0 16777217
$spec grad-accum 1 1073741824 0 1073741825
$spec global-batch 1 1099511627776 0 1099511627777
$spec zero 0 3 -1 4
$spec zero3-prefetch 0 64 -1 65 (1;_LO_to_HI)
$spec threads 1 4096 0 4097
$spec bucket-mb 0.004 4096 0.0039 4096.01
$spec initial-loss-scale 1e-30 1e30 9.9e-31 1.01e30
$spec min-loss-scale 1e-30 1e30 9.9e-31 1.01e30
$spec loss-scale-window 1 1073741824 0 1073741825
$spec hysteresis 1 1073741824 0 1073741825
$spec loss-scale-backoff 1e-6 0.999999 9.9e-7 0.9999991
$spec loss-scale 0 1e30 -1e-30 1.01e30
train,bench steps 1 1073741824 0 1073741825
train,bench lr 1e-12 10 9.9e-13 10.001
train,bench min-lr 0 10 -1e-9 10.001
train,bench warmup 0 1073741824 -1 1073741825
train,bench weight-decay 0 10 -1e-9 10.001
train,bench beta1 0 0.999999 -1e-9 0.9999991
train,bench beta2 0 0.999999999 -1e-9 0.9999999991
train,bench eps 1e-30 1 9.9e-31 1.001
train,bench grad-clip 0 1e30 -1e-9 1.01e30
train,bench val-every 0 1073741824 -1 1073741825
train,bench val-batches 1 1073741824 0 1073741825
train,bench seed 0 18446744073709551615 -1 18446744073709551616
train,bench peak-gflops 1e-3 1e12 9.9e-4 1.01e12
train,bench save-every 0 1073741824 -1 1073741825
train,bench keep 1 1048576 0 1048577
train,bench timeout 0 1e7 -1e-9 10000001
train,bench max-skipped-steps 1 1048576 0 1048577
train,bench save-shard-mb 1e-6 1073741824 9.9e-7 1073741825
plan devices 1 16777216 0 16777217
plan top 1 1000 0 1001
prepare threads 1 4096 0 4097
prepare val-fraction 0 0.999999 -1e-9 1
prepare shard-tokens 4 2147483647 3 2147483648 LO_<=_N_<=_HI
prepare max-line 1 1099511627776 0 1099511627777 LO_<=_BYTES_<=_HI
generate max-tokens 1 1048576 0 1048577
generate temperature 0 100 -1e-9 100.001
generate top-k 0 1073741824 -1 1073741825
generate top-p 1e-6 1 9.9e-7 1.001
generate seed 0 18446744073709551615 -1 18446744073709551616
generate threads 1 4096 0 4097
compare rtol 0 1 -1e-9 1.001
compare loss-rtol 0 1 -1e-9 1.001
compare norm-rtol 0 1 -1e-9 1.001
compare weights-rtol 0 1 -1e-9 1.001
plot step 1 1073741824 0 1073741825
convert save-shard-mb 1e-6 1073741824 9.9e-7 1073741825
tokenizer:train vocab-size 258 65536 257 65537 LO..HI
"
commands="train bench plan prepare generate compare plot convert tokenizer:train"

# takes CMD FLAG VALUE: the parser accepts the value (--help then exits 0)
takes() { "$bin" ${1//:/ } "--$2" "$3" --help > /dev/null 2>&1; }
# refuses CMD FLAG VALUE: exit 2 and one line on stderr naming --FLAG and the value
refuses() {
    local err rc
    err=$("$bin" ${1//:/ } "--$2" "$3" --help 2>&1 > /dev/null)
    rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l <<< "$err")" -eq 1 ] && grep -qF -- "--$2" <<< "$err" &&
        grep -qF -- "$3" <<< "$err" && return 0
    echo "    $1 --$2 $3: exit $rc: $err"
    return 1
}

# flag_help CMD FLAG: the flag's entry in --help (its line and the continuation lines indented
# 22 columns below it) as one line
flag_help() {
    "$bin" ${1//:/ } --help | awk -v f="  --$2" '
        index($0, f " ") == 1 || $0 == f { on = 1; print; next }
        on && substr($0, 1, 22) == sprintf("%22s", "") { print; next }
        { on = 0 }' | tr -s ' \n' ' '
}

declare -A listed
n=0
while read -r cmds flag lo hi below above doc; do
    [ -n "$cmds" ] || continue
    for cmd in ${cmds//,/ }; do
        listed[$cmd/$flag]=1
        what="${cmd//:/ } --$flag $lo..$hi"
        takes "$cmd" "$flag" "$lo" && takes "$cmd" "$flag" "$hi" || {
            bad "$what: a bound refused"; continue; }
        refuses "$cmd" "$flag" "$below" && refuses "$cmd" "$flag" "$above" || {
            bad "$what: $below or $above accepted (or refused without naming them)"; continue; }
        refuses "$cmd" "$flag" nan || { bad "$what: nan accepted"; continue; }
        if [ -n "$doc" ]; then
            doc=${doc//_/ }
            doc=${doc//LO/$lo}
            doc=${doc//HI/$hi}
            flag_help "$cmd" "$flag" | grep -qF -- "$doc" || {
                bad "$what: --help does not state '$doc' for it"; continue; }
        fi
        n=$((n + 1))
    done
done <<< "$table"
check "$n flag bounds: both accepted, one past each (and nan) refused naming flag and value" test $fail -eq 0

# every flag that wants a number is in the table
missing=""
for cmd in $commands; do
    for flag in $("$bin" ${cmd//:/ } --help | sed -n 's/^  --\([a-z0-9-]*\).*/\1/p'); do
        err=$("$bin" ${cmd//:/ } "--$flag" x --help 2>&1 > /dev/null)
        grep -qE "is not a (non-negative )?(whole )?number" <<< "$err" &&
            [ -z "${listed[$cmd/$flag]:-}" ] && missing+=" ${cmd//:/ } --$flag"
    done
done
check "every numeric flag has its bounds in the table${missing:+ (missing:$missing)}" test -z "$missing"
# the negative case: the completeness check finds a numeric flag (--steps)
check "  ... (it sees --steps as numeric)" sh -c "'$bin' train --steps x --help 2>&1 | grep -qE 'is not a (whole )?number'"
exit $fail
