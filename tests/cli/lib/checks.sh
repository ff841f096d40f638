# Shared by the CLI test scripts (sourced): each check prints "ok: ..." or "FAIL: ..." and a
# failure sets fail=1, the script's exit status.
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    local what=$1; shift
    if "$@"; then ok "$what"; else bad "$what"; fi
}
# Under the sanitizers (L3D_SANITIZED, set by CMake, ~5x slower) the runs marked `full &&` are
# left out: each takes a code path that another run takes too.
full() { [ -z "${L3D_SANITIZED:-}" ]; }
expect_error() { # expect_error DESCRIPTION PATTERN COMMAND...: fails with one message matching
    local what=$1 pat=$2; shift 2
    local err
    err=$("$@" 2>&1 >/dev/null)
    local rc=$?
    if [ $rc -ne 0 ] && echo "$err" | grep -q -- "$pat" && [ "$(echo "$err" | wc -l)" -eq 1 ]; then
        echo "ok: $what"
    else
        echo "FAIL: $what (exit $rc): $err"
        fail=1
    fi
}
# is_number X: X is a finite decimal number. less_than A B: A < B, both finite. awk alone passes
# what is not a number: mawk compares a loss printed as "-nan" with another as strings, and
# "-nan" < "5.4" holds; "-inf" is less than anything.
is_number() { [[ $1 =~ ^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]]; }
less_than() {
    is_number "$1" && is_number "$2" && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'
}
