#!/bin/sh
# The collective deadline: under mpirun -n 2 with MOE8_EP_TIMEOUT=3, rank 1
# stops (SIGSTOP) before a collective; the job must end non-zero within the
# deadline + 10 s, with a message naming the rank that did not arrive.
set -u
prog="$1"; mpiexec="$2"
deadline=3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
t0=$(date +%s)
MOE8_EP_TIMEOUT=$deadline timeout 60 "$mpiexec" -n 2 --oversubscribe "$prog" >"$out" 2>&1
rc=$?
t1=$(date +%s)
cat "$out"
el=$((t1 - t0))
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung until the outer timeout"; exit 1; }
[ "$el" -le $((deadline + 10)) ] || { echo "FAIL: the job took $el s, more than the deadline + 10 s"; exit 1; }
grep -q "rank 1 did not arrive within $deadline s" "$out" || { echo "FAIL: no message naming rank 1"; exit 1; }
echo "ep timeout: ok (exit $rc after $el s)"
