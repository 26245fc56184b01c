#!/bin/sh
# The collective deadline: under mpirun -n 2 with MOE8_EP_TIMEOUT=3, rank 1
# stops (SIGSTOP) before a collective; the job must end non-zero within the
# deadline + 10 s, with a message naming the rank that did not arrive.
set -u
prog="$1"; mpiexec="$2"; moe8="${3:-}"
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
echo "ep timeout (library): ok (exit $rc after $el s)"

# The command: rank 1 of 'moe8 run' stops a moment after it starts (in MPI's
# start-up or while loading); the job must still end within the deadline + 10 s.
if [ -n "$moe8" ]; then
  d=$(mktemp -d)
  trap 'rm -rf "$d"; rm -f "$out"' EXIT
  printf '{"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "hidden_size": 64, "moe_intermediate_size": 32, "num_hidden_layers": 1}' >"$d/c.json"
  "$moe8" init --config "$d/c.json" --out "$d/m" >/dev/null || { echo "FAIL: init"; exit 1; }
  cp "$(dirname "$0")/data/x_2x64.npy" "$d/x.npy"
  for delay in 0.02 0.2; do
    t0=$(date +%s)
    MOE8_EP_TIMEOUT=$deadline timeout 60 "$mpiexec" -n 2 --oversubscribe sh -c "if [ \$OMPI_COMM_WORLD_RANK = 1 ]; then '$moe8' run --model '$d/m' --input '$d/x.npy' --output '$d/y.npy' & p=\$!; sleep $delay; kill -STOP \$p; wait \$p; else exec '$moe8' run --model '$d/m' --input '$d/x.npy' --output '$d/y.npy'; fi" >"$out" 2>&1
    rc=$?
    el=$(( $(date +%s) - t0 ))
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$out"; echo "FAIL: moe8 run with a stopped rank (delay $delay): exit $rc"; exit 1; }
    [ "$el" -le $((deadline + 10)) ] || { echo "FAIL: moe8 run with a stopped rank took $el s"; exit 1; }
    grep -q "did not arrive\|did not send" "$out" || { cat "$out"; echo "FAIL: moe8 run: no message naming the missing rank"; exit 1; }
    echo "ep timeout (moe8 run, rank 1 stopped after $delay s): ok (exit $rc after $el s)"
  done
fi
