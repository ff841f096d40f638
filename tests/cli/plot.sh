#!/usr/bin/env bash
# llm3d plot and plan --svg: every kind of picture parses as XML (xmllint, Debian's libxml2-utils),
# its axes hold the data of a run with known losses, a skipped step is a gap with a mark, large
# series are thinned with their extremes kept, hostile metrics and traces give one error naming
# file, line and key; and a headless Chromium (Debian's chromium) renders each kind to a PNG of the
# stored size with the expected colours in it (decoded by tests/cli/lib/svgcheck.py, python3's zlib).
source "$(dirname "$0")/lib/checks.sh"
start_test "$@"
chk="python3 $(dirname "$0")/lib/svgcheck.py"
for tool in python3 xmllint; do
    command -v $tool > /dev/null || { bad "$tool missing: scripts/setup.sh installs it"; exit 1; }
done
xml() { xmllint --noout "$1" 2>&1; }

# ---- a run with known losses: step 5 skipped (null loss), validation at 4 and 8, loss scale
# changed at step 7
m="$dir/known"
mkdir -p "$m"
{
    echo '{"run":"0123456789abcdef","model":{"L":2,"C":64,"NH":4,"V":256,"maxT":32},"seq_len":32}'
    losses=(5.5 5.0 4.25 4.0 null 3.5 3.25 3.0 2.875 2.75)
    for i in $(seq 1 10); do
        l=${losses[$((i - 1))]}
        extra=""
        [ "$i" = 5 ] && extra=',"skipped":true'
        [ "$i" = 4 ] && extra=',"val_loss":4.5'
        [ "$i" = 8 ] && extra=',"val_loss":3.25'
        scale=65536; [ "$i" -ge 7 ] && scale=32768
        echo "{\"step\":$i,\"loss\":$l,\"lr\":$i.0e-4,\"grad_norm\":$((i + 1)).5,\"tokens\":$((i * 256)),\"loss_scale\":$scale$extra}"
    done
} > "$m/metrics.jsonl"
out=$("$bin" plot "$m" --out "$dir/loss.svg" 2>&1)
check "plot of a run: $out" grep -q "1 skipped" <<< "$out"
check "loss.svg parses as XML" xml "$dir/loss.svg"
check "loss axis: the losses 2.75..5.5 (the null left out)" \
    $chk axis "$dir/loss.svg" "Loss by step" y 2.75 5.5
check "step axis: 1..10" $chk axis "$dir/loss.svg" "Loss by step" x 1 10
check "tokens axis: 256..2560" $chk axis "$dir/loss.svg" "Loss by tokens" x 256 2560
check "the skipped step is a gap: two lines" $chk runs "$dir/loss.svg" "Loss by step" train 2
check "the skipped step is marked once" $chk marks "$dir/loss.svg" "Loss by step" skipped 1
check "the loss-scale change is marked once" $chk marks "$dir/loss.svg" "Loss by step" loss-scale 1
check "validation: two points" $chk marks "$dir/loss.svg" "Loss by step" validation-points 2
check "no line leaves its frame (no line to infinity)" $chk inside "$dir/loss.svg"
# negative: the checks reject a picture that differs
! $chk runs "$dir/loss.svg" "Loss by step" train 1 2> /dev/null &&
    ok "negative: one line where the gap makes two is refused" ||
    bad "negative: the gap check passed a wrong count"
! $chk axis "$dir/loss.svg" "Loss by step" y 2.75 5.4 2> /dev/null &&
    ok "negative: a wrong loss range is refused" || bad "negative: the range check passed 5.4"
# two runs overlaid, log axes
cp -r "$m" "$dir/known2"
check "two runs, log axes" "$bin" plot "$m" "$dir/known2" --log-x --log-y --out "$dir/two.svg"
check "two runs: XML" xml "$dir/two.svg"
check "two runs: two legend entries" test "$(grep -c 'data-kind="train"' "$dir/two.svg")" -eq 8

# ---- values at the ends of a double: widened to whole ticks the axis would end at 1e309 (inf),
# or span 3.6e308, or reach 1e-324 (0) on a log scale; every coordinate must stay finite
big="$dir/big"
mkdir -p "$big"
{
    head -1 "$m/metrics.jsonl"
    echo '{"step":1,"loss":1e308,"lr":1e-4,"grad_norm":1.5e308,"tokens":256}'
    echo '{"step":2,"loss":1.7e308,"lr":1e-4,"grad_norm":1.0,"tokens":512}'
} > "$big/metrics.jsonl"
finite_svg() { ! grep -qiE 'nan|inf' "$1" && $chk inside "$1"; }
check "losses near 1e308, --log-y: finite coordinates" \
    "$bin" plot "$big" --log-y --out "$dir/big.svg"
check "  ... no nan or inf in the SVG, nothing outside its frame" finite_svg "$dir/big.svg"
printf '# title: ends\n# log-y\na\t1\t4.9e-324\na\t2\t1.7e308\n# panel: span\nb\t-1.79e308\t-1.79e308\nb\t1.79e308\t1.79e308\n# panel: one value\nc\t1\t1.79e308\nc\t2\t1.79e308\n# panel: one subnormal\n# log-y\nd\t1\t4.9e-324\nd\t2\t4.9e-324\n' \
    > "$dir/ends.tsv"
check "--xy at the ends of a double" "$bin" plot --xy "$dir/ends.tsv" --out "$dir/ends.svg"
check "  ... no nan or inf in the SVG, nothing outside its frame" finite_svg "$dir/ends.svg"

# ---- hostile metrics: one error naming file, line and key
h="$dir/hostile"
mkdir -p "$h"
hostile() { # WHAT LINE3 EXPECT...: the third line replaced, the error must hold each EXPECT
    local what=$1 line=$2; shift 2
    { head -2 "$m/metrics.jsonl"; echo "$line"; } > "$h/metrics.jsonl"
    local err rc=0
    err=$("$bin" plot "$h" --out "$dir/h.svg" 2>&1) || rc=$?
    local e missing=""
    for e in "$@"; do grep -qF -- "$e" <<< "$err" || missing+=" '$e'"; done
    if [ $rc -eq 1 ] && [ -z "$missing" ] && [ "$(wc -l <<< "$err")" -eq 1 ] && [ ! -e "$dir/h.svg" ]; then
        ok "hostile $what: $err"
    else
        bad "hostile $what: exit $rc, missing$missing: $err"
    fi
}
hostile "truncated line" '{"step":2,"loss":5.0,"lr":2e-4,"grad_n' "$h/metrics.jsonl: line 3, column"
hostile "a string for the loss" '{"step":2,"loss":"5.0","lr":2e-4}' "line 3" '"loss"' 'string ("5.0")'
hostile "a string for lr" '{"step":2,"loss":5.0,"lr":"fast"}' "line 3" '"lr"' "string"
hostile "no step" '{"loss":5.0}' "line 3" '"step"'
hostile "a step going back" '{"step":1,"loss":5.0}' "line 3" "step 1 after step 1"
hostile "an array" '[1,2]' "line 3" "expected an object"
"$bin" plot "$dir/nowhere" --out "$dir/h.svg" > /dev/null 2>&1
check "a missing run: exit 1" test $? -eq 1

# ---- thinning: 200,000 steps with a spike of one step, drawn with the spike and few points
awk 'BEGIN { for (i = 1; i <= 200000; i++) printf "{\"step\":%d,\"loss\":%.6f,\"lr\":1e-4}\n", i, (i == 123457 ? 9.5 : 3 + 1 / i) }' \
    > "$dir/big.jsonl"
check "200,000 steps" "$bin" plot "$dir/big.jsonl" --out "$dir/big.svg"
check "big: the spike kept, the line thinned to the pixels" \
    $chk spike "$dir/big.svg" "Loss by step" train 9.5
check "big: under 400 kB" test "$(stat -c %s "$dir/big.svg")" -lt 400000

# ---- timeline: a trace of two ranks, GPipe with 2 micro-batches, each pass 1 ms: each rank is
# busy 4 of its 5 ms between its first and last pipeline event -> bubble 20%
trace="$dir/trace.json"
{
    echo '{"traceEvents":['
    echo '{"name":"process_name","ph":"M","pid":0,"args":{"name":"rank 0 (tp 0, pp 0, dp 0)"}},'
    echo '{"name":"process_name","ph":"M","pid":1,"args":{"name":"rank 1 (tp 0, pp 1, dp 0)"}},'
    ev() { echo "{\"name\":\"$1\",\"cat\":\"$1\",\"ph\":\"X\",\"pid\":$2,\"tid\":0,\"ts\":$3,\"dur\":$4,\"args\":{\"micro\":$5,\"chunk\":0}},"; }
    ev forward 0 0 1000 0; ev forward 0 1000 1000 1; ev backward 0 3000 1000 1; ev backward 0 4000 1000 0
    ev "recv activation" 1 0 1000 0; ev forward 1 1000 1000 0; ev forward 1 2000 1000 1
    ev backward 1 3000 1000 1; ev backward 1 4000 1000 0
    ev optimizer 0 5000 300 1; ev optimizer 1 5000 300 1
    echo '{"name":"step 1","cat":"step","ph":"X","pid":0,"tid":1,"ts":0,"dur":5300,"args":{"micro":1,"chunk":0}},'
    echo '{"name":"step 1","cat":"step","ph":"X","pid":1,"tid":1,"ts":0,"dur":5300,"args":{"micro":1,"chunk":0}}'
    echo ']}'
} > "$trace"
out=$("$bin" plot --trace "$trace" --out "$dir/timeline.svg" 2>&1)
check "timeline: bubble 20.0%: $out" grep -q "bubble 20.0%" <<< "$out"
check "timeline: XML" xml "$dir/timeline.svg"
check "timeline: 2 rows, 8 passes numbered" test "$(grep -c '<g class="row"' "$dir/timeline.svg")" -eq 2 \
    -a "$(grep -o 'data-kind="\(forward\|backward\)"' "$dir/timeline.svg" | wc -l)" -eq 8
sed 's/"ts":1000,/"ts":"soon",/' "$trace" > "$dir/bad_trace.json"
err=$("$bin" plot --trace "$dir/bad_trace.json" --out "$dir/t.svg" 2>&1)
check "hostile trace: $err" grep -q 'bad_trace.json: line [0-9]*, column [0-9]*: event [0-9]*: "ts": expected a number, found a string' <<< "$err"
err=$("$bin" plot --trace "$trace" --step 9 --out "$dir/t.svg" 2>&1)
check "timeline --step 9: $err" grep -q "traces steps 1 to 1" <<< "$err"

# ---- a real trace: pp 2 on 2 ranks, 3 steps
byte_corpus plot
if "$mpiexec" -n 2 "$bin" train "${TINY[@]}" --pp 2 --grad-accum 4 --batch 2 --steps 3 \
        --out "$dir/pp2" --trace "$dir/pp2.json" > /dev/null 2>&1; then
    out=$("$bin" plot --trace "$dir/pp2.json" --out "$dir/pp2.svg" 2>&1)
    check "trainer's trace: $out" grep -q "step 3, pipeline bubble" <<< "$out"
    check "trainer's trace: XML" xml "$dir/pp2.svg"
    check "trainer's run: loss curve" "$bin" plot "$dir/pp2" --out "$dir/pp2_loss.svg"
else
    bad "pp 2 training run with --trace"
fi

# ---- --xy, the benchmark scripts' files
printf '# title: scaling\n# x: ranks\n# y: efficiency (%%)\n# ideal: 100\n# panel: weak\nZeRO-0\t1\t100\nZeRO-0\t2\t93.5\n# panel: strong\nZeRO-0\t1\t100\nZeRO-0\t2\tnan\n' > "$dir/xy.tsv"
check "xy" "$bin" plot --xy "$dir/xy.tsv" --out "$dir/xy.svg"
check "xy: XML" xml "$dir/xy.svg"
check "xy: the weak panel's y 93.5..100" $chk axis "$dir/xy.svg" weak y 93.5 100
# groups: series k takes colour k mod N and dash pattern k / N (a colour per mode, a dash per ZeRO
# stage in bench/scaling.sh): the third of "# groups: 2" is blue again, dashed; the fifth dotted
{ printf '# groups: 2\n'; for n in a b c d e; do printf '%s\t1\t1\n%s\t2\t2\n' $n $n; done; } > "$dir/groups.tsv"
check "xy, groups" "$bin" plot --xy "$dir/groups.tsv" --out "$dir/groups.svg"
series_line() { grep -A1 "data-name=\"$1\"" "$dir/groups.svg" | tail -1; }
check "  ... series c: blue, dashed" sh -c "$(declare -f series_line); dir='$dir' series_line c | \
    grep -q 'stroke=\"#0072B2\".*stroke-dasharray=\"6 4\"'"
check "  ... series b: vermillion, solid" sh -c "$(declare -f series_line); dir='$dir' series_line b | \
    grep 'stroke=\"#D55E00\"' | grep -vq dasharray"
check "  ... series e: blue, dotted" sh -c "$(declare -f series_line); dir='$dir' series_line e | \
    grep -q 'stroke=\"#0072B2\".*stroke-dasharray=\"1.5 3\"'"
printf '# groups: 9\na\t1\t1\n' > "$dir/groups9.tsv"
err=$("$bin" plot --xy "$dir/groups9.tsv" --out "$dir/b.svg" 2>&1)
check "xy, groups 9 refused: $err" grep -q "groups9.tsv: line 1: groups '9': give a whole number from 1 to 8" <<< "$err"
printf 'ZeRO-0\t1\tfast\n' > "$dir/bad.tsv"
err=$("$bin" plot --xy "$dir/bad.tsv" --out "$dir/b.svg" 2>&1)
check "xy, a word for a number: $err" grep -q "bad.tsv: line 1: expected NAME<tab>X<tab>Y" <<< "$err"

# ---- plan --svg
check "plan --svg" "$bin" plan --model d12 --profile dgx-a100 --devices 16 --global-batch 64 \
    --svg "$dir/plan.svg" --svg-color recompute > /dev/null
check "plan: XML" xml "$dir/plan.svg"
check "plan: the chosen layout marked" $chk marks "$dir/plan.svg" \
    "$(sed -n 's/.*<title>\(.*\)<\/title>.*/\1/p' "$dir/plan.svg")" chosen 1
check "plan --published --svg" "$bin" plan --published --svg "$dir/published.svg" > /dev/null
check "published: XML" xml "$dir/published.svg"
err=$("$bin" plan --svg "$dir/x.svg" --svg-color colour 2>&1)
check "plan --svg-color colour: $err" grep -q "choose tp, pp, dp, zero or recompute" <<< "$err"

# ---- Chromium: each kind rendered in one page, one screenshot; the PNG's size, white corners and
# the colours of each kind (Okabe-Ito blue lines and forward passes, orange backward passes,
# vermillion and green layouts)
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    bad "chromium missing: scripts/setup.sh installs Debian's chromium (CI must render)"
    exit $fail
fi
page() { # OUT.html SVG...: the pictures in a 2 x 2 grid of 400 x 300 cells
    { echo '<html><body style="margin:0;background:#fff"><div style="display:grid;grid-template-columns:400px 400px">'
      for f in "$@"; do echo "<img src=\"file://$f\" style=\"width:400px;height:300px;object-fit:contain\">"; done
      echo '</div></body></html>'; } > "$1.html"
}
render() { # NAME SVG...: $dir/NAME.png
    local name=$1; shift
    page "$dir/$name" "$@"
    timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --user-data-dir="$dir/chromium" --window-size=800,600 \
        --screenshot="$dir/$name.png" "file://$dir/$name.html" > "$dir/$name.log" 2>&1
}
render all "$dir/loss.svg" "$dir/timeline.svg" "$dir/plan.svg" "$dir/xy.svg"
check "Chromium: a PNG of the four kinds" test -s "$dir/all.png"
check "the PNG: 800 x 600, white corners, the kinds' colours" $chk png "$dir/all.png" 800 600 \
    "#0072B2:200" "#E69F00:200" "#D55E00:20" "#009E73:20"
# negative: a colour no picture uses (pure red) must be refused, as must the wrong size
! $chk png "$dir/all.png" 800 600 "#FF0000:20" 2> /dev/null &&
    ok "negative: a colour that is not drawn is refused" || bad "negative: pure red was found"
! $chk png "$dir/all.png" 800 601 2> /dev/null &&
    ok "negative: a wrong size is refused" || bad "negative: 800 x 601 passed"
exit $fail
