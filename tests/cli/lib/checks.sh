# Shared by the CLI test scripts (sourced): each check prints "ok: ..." or "FAIL: ..." and a
# failure sets fail=1, the script's exit status.
fail=0
check() { # check DESCRIPTION COMMAND...: the command must succeed
    local what=$1; shift
    if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
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
