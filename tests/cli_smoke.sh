#!/bin/sh
# The moe8 command: help and exit codes of every subcommand, and a demo run
# whose table has every format and granularity.
set -u
moe8="$1"
fail() { echo "FAIL: $*"; exit 1; }
"$moe8" --help >/dev/null || fail "--help exits non-zero"
"$moe8" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no command must exit 2"
"$moe8" frobnicate >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command must exit 2"
for c in demo bench; do
  "$moe8" $c --help >/dev/null || fail "$c --help exits non-zero"
done
"$moe8" demo --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "demo --bogus must exit 2"
"$moe8" bench nope >/dev/null 2>&1; [ $? -eq 2 ] || fail "bench nope must exit 2"
out=$("$moe8" demo) || fail "demo exits non-zero"
n=$(printf '%s\n' "$out" | grep -cE '^(f8e4m3|f8e5m2|i8) ')
[ "$n" -eq 18 ] || fail "demo printed $n result rows, want 18"
printf '%s\n' "$out" | grep -qi nan && fail "demo printed NaN"
echo "cli smoke: ok"
