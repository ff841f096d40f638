#!/usr/bin/env bash
# run.sh [--check] [LIST]: the mutation run (tests/mutants/README.md). Copies the tree (tracked files and
# untracked ones git does not ignore) into a scratch directory, configures and builds it once
# (Release), then for each mutant of LIST (tests/mutants/list): checks that its line occurs exactly
# once in its file (else the entry is stale), puts the replacement in, rebuilds the targets its
# tests need, runs `ctest -R REGEX` under a time limit and puts the file back. Prints a table and
# the kill rate. Exit status 0 with survivors (the run is a report); 1 when the harness itself
# cannot run: a bad list, a build or configure that fails without any mutant, tests that fail
# before any mutant is applied (the baseline).
# --check: only checks the list against the source tree (each line found once, each replacement
# different), building nothing; exit 1 if an entry is stale.
# Environment: MUTANTS=id,id (a subset), MUTANTS_DIR (scratch directory, build-mutants: kept, so a
# second run rebuilds incrementally), MUTANT_TIMEOUT (seconds a mutant's tests may take, 300),
# JOBS (build jobs, 2), TEST_JOBS (ctest -j, 2), MUTANTS_BASELINE=0 (skip the unmutated run),
# MUTANTS_WERROR (ON, as CI: a mutant the compiler warns about is a build failure).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
check_only=0
[ "${1:-}" = --check ] && { check_only=1; shift; }
list=${1:-$here/list}
work=${MUTANTS_DIR:-$root/build-mutants}
case $work in /*) ;; *) work=$root/$work ;; esac
tree=$work/tree bld=$work/build logs=$work/logs
timeout_s=${MUTANT_TIMEOUT:-300}
jobs=${JOBS:-2} test_jobs=${TEST_JOBS:-2}
die() { echo "mutants: $*" >&2; exit 1; }
[ -f "$list" ] || die "no list of mutants at $list"
command -v timeout > /dev/null || die "needs timeout (coreutils)"

# ---- the list: blocks of "key: value" lines, a blank line between blocks, '#' comments --------
# Each block: id, file, line (the line's text without its indentation), with (its replacement),
# tests (the ctest regex) and, optionally, equivalent (why no test can tell it apart). Parsed into
# one record a mutant, fields separated by \x1f (no source line holds one).
US=$'\x1f'
mapfile -t records < <(awk -v us="$US" '
    function flush() {
        if (n == 0) return
        for (k in need) if (!(k in f)) { printf "ERROR %s: entry %s has no %s:\n", FILENAME, f["id"], k; bad = 1 }
        print f["id"] us f["file"] us f["line"] us f["with"] us f["tests"] us f["equivalent"]
        delete f; n = 0
    }
    BEGIN { need["id"]; need["file"]; need["line"]; need["with"]; need["tests"] }
    /^[ \t]*#/ { next }
    /^[ \t]*$/ { flush(); next }
    {
        i = index($0, ":")
        if (i == 0) { printf "ERROR %s:%d: not a key: value line: %s\n", FILENAME, FNR, $0; bad = 1; next }
        k = substr($0, 1, i - 1); v = substr($0, i + 1)
        sub(/^[ \t]+/, "", v); sub(/[ \t\r]+$/, "", v)
        if (!(k in need) && k != "equivalent") { printf "ERROR %s:%d: unknown key %s\n", FILENAME, FNR, k; bad = 1 }
        if (k in f) { printf "ERROR %s:%d: %s given twice in one entry\n", FILENAME, FNR, k; bad = 1 }
        f[k] = v; n++
    }
    END { flush(); if (bad) exit 1 }' "$list") || die "cannot parse $list"
for r in "${records[@]}"; do [[ $r == ERROR* ]] && die "${r#ERROR }"; done
declare -A seen
ids=()
for r in "${records[@]}"; do
    IFS=$US read -r id _ <<< "$r"
    [ -n "${seen[$id]:-}" ] && die "mutant id $id is given twice in $list"
    seen[$id]=1
    ids+=("$id")
done
# the subset asked for
want=()
if [ -n "${MUTANTS:-}" ]; then
    IFS=, read -r -a want <<< "$MUTANTS"
    for id in "${want[@]}"; do [ -n "${seen[$id]:-}" ] || die "MUTANTS: no mutant $id in $list"; done
fi
chosen() {
    [ ${#want[@]} -eq 0 ] && return 0
    local w
    for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done
    return 1
}

# count_line FILE TEXT: lines of FILE equal to TEXT once the indentation and trailing blanks go
count_line() {
    awk -v want="$2" '{ s = $0; sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); if (s == want) n++ }
        END { print n + 0 }' "$1"
}
if [ $check_only = 1 ]; then
    bad=0
    for r in "${records[@]}"; do
        IFS=$US read -r id file line with regex equiv <<< "$r"
        chosen "$id" || continue
        n=0
        [ -f "$root/$file" ] && n=$(count_line "$root/$file" "$line")
        if [ "$n" -ne 1 ] || [ "$line" = "$with" ]; then
            echo "mutants: $id: stale: line found $n times in $file" >&2
            [ "$line" = "$with" ] && echo "mutants: $id: the replacement is the line itself" >&2
            bad=1
        fi
    done
    [ $bad = 0 ] && echo "mutants: ${#ids[@]} entries, every line found once"
    exit $bad
fi

# ---- the scratch tree: a copy of the sources, updated file by file -----------------------------
# Files whose content is unchanged keep their time stamps, so a second run rebuilds only what
# changed since; a file left mutated by an interrupted run differs and is copied again.
mkdir -p "$tree" "$logs" || die "cannot create $work"
cd "$root" || die "no $root"
git rev-parse --git-dir > /dev/null 2>&1 || die "$root is not a git checkout"
mapfile -t files < <(git ls-files --cached --others --exclude-standard | grep -v '^build')
copied=0
for f in "${files[@]}"; do
    [ -f "$f" ] || continue # deleted in the work tree, not yet in the index
    if ! cmp -s "$f" "$tree/$f"; then
        mkdir -p "$tree/$(dirname "$f")" && cp "$f" "$tree/$f" || die "cannot copy $f"
        copied=$((copied + 1))
    fi
done
# files gone from the tree (a removed test would still be globbed by CMakeLists.txt)
declare -A keep
for f in "${files[@]}"; do keep[$f]=1; done
while IFS= read -r -d '' f; do
    f=${f#"$tree"/}
    [ -n "${keep[$f]:-}" ] || rm -f "$tree/$f"
done < <(find "$tree" -type f -print0)
echo "mutants: $copied file(s) copied into $tree"

# the CUDA build (its host tests, tests/cuda) when a chosen mutant is in the CUDA backend's or the
# NCCL communicator's files and nvcc is there (else their tests are not found: stale)
cuda=OFF
for r in "${records[@]}"; do
    IFS=$US read -r id file _ <<< "$r"
    if chosen "$id" && [[ $file == src/backend/cuda* || $file == src/comm/nccl* ]] &&
       [ -x "${NVCC:-/usr/local/cuda/bin/nvcc}" ]; then cuda=ON; fi
done
echo "mutants: configuring $bld (Release, CUDA $cuda)"
cmake -S "$tree" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DL3D_WERROR="${MUTANTS_WERROR:-ON}" \
    -DL3D_CUDA=$cuda > "$logs/configure.log" 2>&1 || { tail -20 "$logs/configure.log"; die "configure failed ($logs/configure.log)"; }

# tests_of REGEX: the names of the tests it selects; targets_of NAME...: the targets they run
tests_of() { (cd "$bld" && ctest -N -R "$1") | sed -n 's/^ *Test *#[0-9]*: //p'; }
targets_of() {
    local t
    for t in "$@"; do
        case $t in
        cli_hftok) printf 'llm3d\ntest_hftok\n' ;; # it compares ids with test_hftok SPEC TSV
        cli_*) echo llm3d ;;                 # the scripts drive the command-line tool
        test_kernels_widened) echo test_kernels ;;
        *_np[0-9]*) echo "${t%_np*}" ;;      # tests/mpi: one executable, 2 and 4 ranks
        *) echo "$t" ;;
        esac
    done | sort -u
}

# ---- the mutants chosen, checked before anything is built --------------------------------------
# apply FILE TEXT REPLACEMENT: the line replaced, its indentation kept
apply() {
    awk -v want="$2" -v with="$3" '{
            s = $0; sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s)
            if (s == want) { match($0, /^[ \t]*/); print substr($0, 1, RLENGTH) with } else print
        }' "$1" > "$1.mutant" && mv "$1.mutant" "$1"
}
run_ids=() all_targets=() all_tests=()
declare -A stale targets tests_n
for r in "${records[@]}"; do
    IFS=$US read -r id file line with regex equiv <<< "$r"
    chosen "$id" || continue
    run_ids+=("$id")
    if [ ! -f "$tree/$file" ]; then
        stale[$id]="no file $file"
        continue
    fi
    n=$(count_line "$tree/$file" "$line")
    if [ "$n" -ne 1 ]; then
        stale[$id]="line found $n times in $file"
        continue
    fi
    [ "$line" = "$with" ] && die "mutant $id replaces its line by itself"
    mapfile -t names < <(tests_of "$regex")
    if [ ${#names[@]} -eq 0 ]; then
        stale[$id]="no test matches $regex"
        continue
    fi
    tests_n[$id]=${#names[@]}
    t=$(targets_of "${names[@]}" | tr '\n' ' ')
    targets[$id]=$t
    all_targets+=($t)
    all_tests+=("${names[@]}")
done
[ ${#run_ids[@]} -gt 0 ] || die "no mutants chosen"
mapfile -t all_targets < <(printf '%s\n' "${all_targets[@]}" | sort -u)
mapfile -t all_tests < <(printf '%s\n' "${all_tests[@]}" | sort -u)

if [ ${#all_targets[@]} -gt 0 ]; then
    echo "mutants: building ${all_targets[*]}"
    cmake --build "$bld" -j"$jobs" --target "${all_targets[@]}" > "$logs/build.log" 2>&1 ||
        { tail -30 "$logs/build.log"; die "the unmutated tree does not build ($logs/build.log)"; }
fi
# the baseline: every test a mutant names passes before any mutant, or a kill would mean nothing
# (by name, one group: CMake's regular expressions take at most 9 groups)
if [ "${MUTANTS_BASELINE:-1}" != 0 ] && [ ${#all_tests[@]} -gt 0 ]; then
    echo "mutants: baseline: the ${#all_tests[@]} tests the mutants name, unmutated"
    t0=$SECONDS
    names=$(IFS='|'; echo "${all_tests[*]}")
    if ! (cd "$bld" && ctest -R "^($names)\$" -j"$test_jobs") > "$logs/baseline.log" 2>&1 ||
        ! grep -q "100% tests passed, 0 tests failed out of ${#all_tests[@]}\$" "$logs/baseline.log"; then
        tail -5 "$logs/baseline.log" >&2
        sed -n '/tests FAILED:/,$p' "$logs/baseline.log" >&2
        die "tests fail before any mutant ($logs/baseline.log): fix them, or leave their mutants out (MUTANTS=...)"
    fi
    echo "mutants: baseline passed in $((SECONDS - t0)) s"
fi

# ---- one mutant at a time ----------------------------------------------------------------------
saved="" saved_file=""
restore() {
    # the original content with a new time stamp: the next build compiles the file again
    if [ -n "$saved_file" ]; then cp "$saved" "$saved_file" && rm -f "$saved"; fi
    saved_file=""
}
trap 'restore' EXIT
trap 'restore; exit 130' INT TERM
declare -A result detail secs
for id in "${run_ids[@]}"; do
    [ -n "${stale[$id]:-}" ] && { result[$id]=stale; detail[$id]=${stale[$id]}; continue; }
    for r in "${records[@]}"; do [[ $r == "$id$US"* ]] && break; done
    IFS=$US read -r _ file line with regex equiv <<< "$r"
    t0=$SECONDS
    saved=$work/saved.tmp saved_file=$tree/$file
    cp "$saved_file" "$saved" || die "cannot save $file"
    apply "$saved_file" "$line" "$with" || die "cannot apply mutant $id to $file"
    [ "$(count_line "$saved_file" "$with")" -ge 1 ] || die "mutant $id did not apply to $file"
    printf 'mutants: %-34s %s ... ' "$id" "$file"
    read -r -a tg <<< "${targets[$id]}"
    if ! cmake --build "$bld" -j"$jobs" --target "${tg[@]}" > "$logs/$id.build.log" 2>&1; then
        result[$id]=build-failed
        detail[$id]="does not compile (a bad mutant): $logs/$id.build.log"
    else
        (cd "$bld" && timeout -k 10 "$timeout_s" ctest -R "$regex" -j"$test_jobs" --output-on-failure) \
            > "$logs/$id.test.log" 2>&1
        rc=$?
        if [ $rc -eq 0 ]; then
            if [ -n "$equiv" ]; then result[$id]=equivalent; detail[$id]=$equiv
            else result[$id]=survived; detail[$id]="${tests_n[$id]} test(s) passed: $regex"; fi
        elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            result[$id]=killed; detail[$id]="timed out after $timeout_s s"
        else
            result[$id]=killed
            by=$(sed -n '/tests FAILED:/,$p' "$logs/$id.test.log" | sed -n 's/^[ \t]*[0-9]* - \([^ ]*\).*/\1/p' | tr '\n' ' ')
            detail[$id]=${by:-"ctest status $rc (see $logs/$id.test.log)"}
        fi
    fi
    restore
    secs[$id]=$((SECONDS - t0))
    echo "${result[$id]} (${secs[$id]} s)"
done

# ---- the report --------------------------------------------------------------------------------
echo
printf '%-34s %-28s %-12s %5s  %s\n' mutant file result secs "killed by / note"
killed=0 survived=0 equivalent=0 badbuild=0 nstale=0
for id in "${run_ids[@]}"; do
    for r in "${records[@]}"; do [[ $r == "$id$US"* ]] && break; done
    IFS=$US read -r _ file _ <<< "$r"
    printf '%-34s %-28s %-12s %5s  %s\n' "$id" "$file" "${result[$id]}" "${secs[$id]:--}" "${detail[$id]}"
    case ${result[$id]} in
    killed) killed=$((killed + 1)) ;;
    survived) survived=$((survived + 1)) ;;
    equivalent) equivalent=$((equivalent + 1)) ;;
    build-failed) badbuild=$((badbuild + 1)) ;;
    stale) nstale=$((nstale + 1)) ;;
    esac
done
echo
scored=$((killed + survived))
rate=$(awk -v k=$killed -v n=$scored 'BEGIN { if (n) printf "%.1f%%", 100 * k / n; else print "n/a" }')
echo "mutants: $killed killed, $survived survived, $equivalent equivalent, $badbuild do not build, $nstale stale (of ${#run_ids[@]})"
echo "mutants: kill rate $rate (killed / (killed + survived); equivalent, unbuildable and stale ones left out)"
echo "mutants: logs in $logs"
exit 0
