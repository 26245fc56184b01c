#!/bin/sh
# The moe8 command: help and exit codes of every subcommand, and a demo run
# whose table has every format and granularity.
set -u
moe8="$1"
fail() { echo "FAIL: $*"; exit 1; }
"$moe8" --help >/dev/null || fail "--help exits non-zero"
"$moe8" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no command must exit 2"
"$moe8" frobnicate >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command must exit 2"
for c in demo bench train init quantize run info check; do
  "$moe8" $c --help >/dev/null || fail "$c --help exits non-zero"
done
"$moe8" demo --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "demo --bogus must exit 2"
"$moe8" bench nope >/dev/null 2>&1; [ $? -eq 2 ] || fail "bench nope must exit 2"
out=$("$moe8" demo) || fail "demo exits non-zero"
n=$(printf '%s\n' "$out" | grep -cE '^(f8e4m3|f8e5m2|i8) ')
[ "$n" -eq 18 ] || fail "demo printed $n result rows, want 18"
printf '%s\n' "$out" | grep -qi nan && fail "demo printed NaN"
# moe8 train: 200 steps take the loss below 25% (f32) and 35% (FP8) of the first.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in f32 fp8; do
  flag=""; limit=25
  [ "$mode" = fp8 ] && { flag="--fp8"; limit=35; }
  line=$("$moe8" train --steps 200 --quiet $flag --csv "$tmp/$mode.csv") || fail "train $mode exits non-zero"
  pct=$(printf '%s\n' "$line" | sed -n 's/.*(\([0-9.]*\)% of first).*/\1/p')
  [ -n "$pct" ] || fail "train $mode: no summary line: $line"
  awk -v p="$pct" -v l="$limit" 'BEGIN { exit !(p < l) }' || fail "train $mode: loss at $pct% of first, want < $limit%"
  [ "$(wc -l < "$tmp/$mode.csv")" -eq 201 ] || fail "train $mode: CSV does not have 200 rows"
  echo "train $mode: loss at $pct% of first"
done
"$moe8" train --steps 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "train --steps 0 must exit 2"
echo "cli smoke: ok"
