#!/usr/bin/env bash
# run.sh TARGET SEEDS OUT SECONDS: runs one libFuzzer target for SECONDS over the committed seed
# corpus SEEDS; new inputs and any crash go to OUT (never into the source tree). Prints the
# executions and the crashes; fails on a crash, a sanitizer report, a leak or a time-out.
set -u
bin=$1 seeds=$2 out=$3 secs=$4
name=$(basename "$bin")
rm -rf "$out/crashes" # the findings of an earlier run (fixed, or copied into the seeds)
mkdir -p "$out/corpus" "$out/crashes"
# the targets that take a path write each input to a scratch file: in memory where possible
tmp=$(mktemp -d "$( [ -w /dev/shm ] && echo /dev/shm || echo "$out")/l3d-fuzz.XXXXXX")
log=$out/log.txt
# -close_fd_mask=3: the parsers' own error messages are not findings; libFuzzer's report is kept
# in the log (its stderr is duplicated before the mask)
TMPDIR=$tmp "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=4096 \
    -max_len=65536 -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$out/crashes/" \
    "$out/corpus" "$seeds" > "$log" 2>&1
rc=$?
rm -rf "$tmp"
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
crashes=$(ls "$out/crashes" | wc -l)
echo "$name: ${runs:-?} executions in $secs s, $crashes crash(es), exit $rc (log: $log)"
if [ $rc -ne 0 ] || [ "$crashes" -ne 0 ]; then
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written|==[0-9]+==' "$log" | head -20
    exit 1
fi
