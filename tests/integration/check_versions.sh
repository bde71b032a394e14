#!/bin/bash
# Every program answers --version with one line, "NAME VERSION", VERSION being
# meson.build's project version (passed as $1); the other arguments are the
# programs (an executable, or a script run with the system python).
set -u
want="$1"; shift
fail=0; n=0
for exe in "$@"; do
    name=$(basename "$exe")
    case "$exe" in
        *.py) out=$("${PYTHON:-python3}" "$exe" --version 2>&1); rc=$? ;;
        *) out=$("$exe" --version 2>&1); rc=$? ;;
    esac
    n=$((n + 1))
    if [ "$rc" -ne 0 ] || [ "$out" != "$name $want" ]; then
        echo "FAIL $name: rc=$rc output '$out' (want '$name $want')"
        fail=$((fail + 1))
    fi
done
echo "$((n - fail)) passed, $fail failed"
[ "$fail" -eq 0 ]
