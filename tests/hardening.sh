#!/bin/sh
# Hostile and careless input to the moe8 command, one case per class of
# docs/testing.md ("Bad input"): each must end with the stated exit code and
# message, and never replace, truncate or half-write a file it should not.
# usage: hardening.sh MOE8 PYTHON [MPIEXEC]
set -u
moe8="$1"; py="$2"; mpiexec="${3:-}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# expect CODE PATTERN CMD...: exit code and a message matching PATTERN on stderr
expect() {
  code=$1; pat=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?
  [ "$rc" -eq "$code" ] || { cat "$tmp/err"; fail "$* exited $rc, want $code"; }
  [ -z "$pat" ] || grep -q -- "$pat" "$tmp/err" || { cat "$tmp/err"; fail "$*: no message matching '$pat'"; }
}
cat >"$tmp/cfg.json" <<'J'
{"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 256, "moe_intermediate_size": 128, "num_hidden_layers": 1}
J
cat >"$tmp/rules.json" <<'J'
{"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 128}]}
J
"$moe8" init --config "$tmp/cfg.json" --out "$tmp/m" >/dev/null || fail "init"
"$py" - "$tmp" <<'P' || fail "python setup"
import sys, numpy as np
t = sys.argv[1]
np.save(t + "/x.npy", np.random.default_rng(1).standard_normal((6, 256)).astype(np.float32))
np.save(t + "/x2.npy", np.random.default_rng(2).standard_normal((9, 256)).astype(np.float32))
np.save(t + "/huge.npy", (np.random.default_rng(1).standard_normal((6, 256)) * 1e20).astype(np.float32))
np.save(t + "/flat.npy", np.zeros(200, dtype=np.float32))
P
run() { "$moe8" run --model "$tmp/m" --input "$tmp/x.npy" "$@"; }

# 1. output files
expect 0 "" run --output "$tmp/y.npy"
cp "$tmp/y.npy" "$tmp/want.npy"
if mknod "$tmp/null" c 1 3 2>/dev/null; then
  expect 0 "" run --output "$tmp/null"
  [ -c "$tmp/null" ] || fail "a character device output was replaced by a regular file"
else
  echo "notice: cannot make a device node here (not root): the device case is skipped"
fi
echo precious >"$tmp/victim"
ln -s "$tmp/victim" "$tmp/y2.npy.tmp"
expect 0 "" run --output "$tmp/y2.npy"
[ "$(cat "$tmp/victim")" = precious ] || fail "a symlink planted at the temporary name was followed"
cmp -s "$tmp/y2.npy" "$tmp/want.npy" || fail "output beside a planted symlink differs"
: >"$tmp/real.npy"
ln -s "$tmp/real.npy" "$tmp/link.npy"
expect 0 "" run --output "$tmp/link.npy"
[ -L "$tmp/link.npy" ] || fail "a symlink output was replaced instead of followed"
cmp -s "$tmp/real.npy" "$tmp/want.npy" || fail "the symlink's target does not hold the output"
mkdir "$tmp/adir"
expect 1 "is a directory" run --output "$tmp/adir"
( run --output "$tmp/race.npy" >/dev/null 2>"$tmp/e1" & run --output "$tmp/race.npy" >/dev/null 2>"$tmp/e2" & wait ) || true
cmp -s "$tmp/race.npy" "$tmp/want.npy" || { cat "$tmp/e1" "$tmp/e2"; fail "two concurrent writers: the output is wrong"; }
[ -z "$(ls -A "$tmp" | grep '^\.race')" ] || fail "two concurrent writers left a temporary file"
expect 1 "is the input" run --output "$tmp/x.npy"
expect 1 "a file of the model" run --output "$tmp/m/model.safetensors"
sum0=$(cksum <"$tmp/m/model.safetensors")
expect 1 "is the input model" "$moe8" quantize "$tmp/m" "$tmp/m" --rules "$tmp/rules.json"
expect 0 "" "$moe8" quantize "$tmp/m" "$tmp/q" --rules "$tmp/rules.json"
expect 1 "already holds a model" "$moe8" quantize "$tmp/m" "$tmp/q" --rules "$tmp/rules.json"
expect 0 "" "$moe8" quantize "$tmp/m" "$tmp/q" --rules "$tmp/rules.json" --force
[ "$(cksum <"$tmp/m/model.safetensors")" = "$sum0" ] || fail "the input model changed"
# 13. a quantize --force that fails leaves the old model whole (the new one
# is written beside it and swapped in only when complete)
echo keep >"$tmp/q/README.md"
qsum=$(cat "$tmp/q/config.json" "$tmp/q/model.safetensors" | cksum)
MOE8_TEST_QUANTIZE_FAIL=1 expect 1 "failing on purpose" "$moe8" quantize "$tmp/m" "$tmp/q" --rules "$tmp/rules.json" --force
[ "$(cat "$tmp/q/config.json" "$tmp/q/model.safetensors" | cksum)" = "$qsum" ] || fail "a failed quantize --force changed the old model"
[ -z "$(ls -A "$tmp" | grep 'moe8-new')" ] || fail "a failed quantize left its temporary directory"
(trap '' XFSZ; ulimit -f 64; "$moe8" quantize "$tmp/m" "$tmp/q" --rules "$tmp/rules.json" --force >/dev/null 2>"$tmp/err"); rc=$?
[ "$rc" -ne 0 ] || fail "quantize under a 64 KiB file-size limit succeeded"
[ "$(cat "$tmp/q/config.json" "$tmp/q/model.safetensors" | cksum)" = "$qsum" ] || fail "a quantize that ran out of space changed the old model"
[ -z "$(ls -A "$tmp" | grep 'moe8-new')" ] || fail "a quantize that ran out of space left its temporary directory"
# 14. quantize --force over a sharded model: the old shards and index go
mkdir "$tmp/sh"
cp "$tmp/m/config.json" "$tmp/sh/"
cp "$tmp/m/model.safetensors" "$tmp/sh/model-00001-of-00001.safetensors"
"$py" - "$tmp/sh" <<'P' || fail "index"
import sys, json, struct
d = sys.argv[1]
b = open(d + "/model-00001-of-00001.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
names = [k for k in json.loads(b[8:8 + n]) if k != "__metadata__"]
json.dump({"weight_map": {k: "model-00001-of-00001.safetensors" for k in names}}, open(d + "/model.safetensors.index.json", "w"))
P
expect 0 "" "$moe8" run --model "$tmp/sh" --input "$tmp/x.npy" --output "$tmp/ysh.npy"
expect 1 "already holds a" "$moe8" quantize "$tmp/m" "$tmp/sh" --rules "$tmp/rules.json"
expect 0 "" "$moe8" quantize "$tmp/m" "$tmp/sh" --rules "$tmp/rules.json" --force
[ ! -e "$tmp/sh/model.safetensors.index.json" ] && [ ! -e "$tmp/sh/model-00001-of-00001.safetensors" ] || fail "the old shards survived quantize --force"
expect 0 "" "$moe8" run --model "$tmp/sh" --input "$tmp/x.npy" --output "$tmp/ysh2.npy"
[ "$(cat "$tmp/q/README.md")" = keep ] || fail "a file that is not the model's was lost"

# 2. non-finite results and bad weights
expect 1 "not finite\|non-finite" run --input "$tmp/huge.npy" --output "$tmp/h.npy"
[ ! -e "$tmp/h.npy" ] || fail "a non-finite run left an output"
expect 0 "" "$moe8" quantize "$tmp/m" "$tmp/ds" --rules "$tmp/rules.json" --format deepseek
cp -r "$tmp/ds" "$tmp/dsnan"
"$py" - "$tmp/dsnan/model.safetensors" 0x7F <<'P' || fail "patch"
import sys, json, struct
p, code = sys.argv[1], int(sys.argv[2], 16)
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
o = h["model.layers.0.mlp.experts.3.up_proj.weight"]["data_offsets"][0]
b[8 + n + o + 5] = code
open(p, "wb").write(b)
P
expect 1 "experts.3.up_proj.weight' holds the NaN code 0x7F at element 5" "$moe8" run --model "$tmp/dsnan" --input "$tmp/x.npy" --output "$tmp/n.npy"
for bad in 0 -1 nan inf; do
  rm -rf "$tmp/dss"; cp -r "$tmp/ds" "$tmp/dss"
  "$py" - "$tmp/dss/model.safetensors" "$bad" <<'P' || fail "patch"
import sys, json, struct
p, v = sys.argv[1], float(sys.argv[2])
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
o = h["model.layers.0.mlp.experts.1.down_proj.weight_scale_inv"]["data_offsets"][0]
b[8 + n + o:8 + n + o + 4] = struct.pack("<f", v)
open(p, "wb").write(b)
P
  expect 1 "experts.1.down_proj.weight_scale_inv' element 0 is" "$moe8" run --model "$tmp/dss" --input "$tmp/x.npy" --output "$tmp/n.npy"
done

# 3. config values that are not the integers they must be
for kv in '"weight_block_size": [1e300, 1e300]:weight_block_size' '"num_experts": 8.5:num_experts' '"hidden_size": -256:hidden_size' \
          '"moe_intermediate_size": 1e300:moe_intermediate_size'; do
  key=${kv##*:}; val=${kv%:*}
  rm -rf "$tmp/c"; cp -r "$tmp/m" "$tmp/c"
  if [ "$key" = weight_block_size ]; then
    printf '{"model_type": "deepseek_v3", "n_routed_experts": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "quantization_config": {"quant_method": "fp8", %s}}' "$val" >"$tmp/c/config.json"
  else
    printf '{"model_type": "qwen3_moe", %s}' "$val" >"$tmp/c/config.json"
  fi
  expect 1 "$key" "$moe8" info "$tmp/c"
done
# setkey KEY JSON: the model's config.json with KEY set, into $tmp/c
setkey() {
  rm -rf "$tmp/c"; cp -r "$tmp/m" "$tmp/c"
  "$py" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c[sys.argv[2]]=json.loads(sys.argv[3]); json.dump(c, open(p,'w'))" \
    "$tmp/c/config.json" "$1" "$2" || fail "setkey"
}
setkey hidden_act '"gelu"'
expect 1 "hidden_act" "$moe8" run --model "$tmp/c" --input "$tmp/x.npy" --output "$tmp/n.npy"
setkey model_type '"arctic"'
expect 1 "model_type" "$moe8" info "$tmp/c"
expect 0 "" "$moe8" info "$tmp/c" --arch qwen3_moe
setkey mlp_only_layers '[0]'
expect 1 "mlp_only_layers" "$moe8" run --model "$tmp/c" --input "$tmp/x.npy" --output "$tmp/n.npy" --layer 0

# 4. files that are not files
mkdir "$tmp/fifo"; cp "$tmp/m/model.safetensors" "$tmp/fifo/"; mkfifo "$tmp/fifo/config.json"
expect 1 "is a FIFO" timeout 20 "$moe8" run --model "$tmp/fifo" --input "$tmp/x.npy" --output "$tmp/n.npy"
rm "$tmp/fifo/config.json" "$tmp/fifo/model.safetensors"; cp "$tmp/m/config.json" "$tmp/fifo/"; mkfifo "$tmp/fifo/model.safetensors"
expect 1 "is a FIFO" timeout 20 "$moe8" run --model "$tmp/fifo" --input "$tmp/x.npy" --output "$tmp/n.npy"
expect 1 "is a directory" run --input "$tmp" --output "$tmp/n.npy"
expect 1 "got 1-D F32 \[200\]" run --input "$tmp/flat.npy" --output "$tmp/n.npy"

# 5. resources: a header of a million empty tensors
mkdir "$tmp/big"; cp "$tmp/m/config.json" "$tmp/big/"
"$py" - "$tmp/big/model.safetensors" <<'P' || fail "python"
import sys, json, struct
h = "{" + ",".join('"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i for i in range(1000000)) + "}"
h = h.encode(); h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h)
P
expect 1 "more than the 200000" "$moe8" info "$tmp/big"

# 6. smaller
expect 2 "--lr" "$moe8" train --lr nan --steps 2
expect 2 "--lr" "$moe8" train --lr 5 --steps 2

# small ones of round 3: an empty model path, a huge --layer, a checkpoint
# holding its experts twice (fused and per expert)
expect 1 "empty path" "$moe8" run --model "" --input "$tmp/x.npy" --output "$tmp/ye.npy"
expect 2 "is not a layer number" run --output "$tmp/ye.npy" --layer 99999999999999999999999
mkdir "$tmp/both"; cp "$tmp/m/config.json" "$tmp/both/"
"$py" - "$tmp/m/model.safetensors" "$tmp/both/model.safetensors" <<'P' || fail "both"
import sys, json, struct
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); data = b[8 + n:]
E, D, F = 8, 256, 128
extra = {"model.layers.0.mlp.experts.gate_up_proj": ("F32", [E, 2 * F, D]), "model.layers.0.mlp.experts.down_proj": ("F32", [E, D, F])}
end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
for k, (dt, shape) in extra.items():
    size = 4 * shape[0] * shape[1] * shape[2]
    h[k] = {"dtype": dt, "shape": shape, "data_offsets": [end, end + size]}
    end += size
data = data + bytes(end - len(data))
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + data)
P
expect 1 "holds its experts twice" "$moe8" run --model "$tmp/both" --input "$tmp/x.npy" --output "$tmp/ye.npy"
[ ! -e "$tmp/ye.npy" ] || fail "an ambiguous checkpoint wrote an output"

# 9. a mapped model file truncated while a run uses it: one message naming
# the file, exit 1, no output (not a bare SIGBUS)
cat >"$tmp/cfg9.json" <<'J'
{"model_type": "qwen3_moe", "num_experts": 16, "num_experts_per_tok": 2, "hidden_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 1}
J
"$moe8" init --config "$tmp/cfg9.json" --out "$tmp/m9" >/dev/null || fail "init m9"
"$moe8" quantize "$tmp/m9" "$tmp/q9" --rules "$tmp/rules.json" >/dev/null || fail "quantize m9"
"$py" -c "import numpy as np; np.save('$tmp/x9.npy', np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32))"
"$moe8" run --model "$tmp/q9" --input "$tmp/x9.npy" --output "$tmp/y9.npy" --repeat 1000 >/dev/null 2>"$tmp/err" &
pid=$!
sleep 0.3
truncate -s 4096 "$tmp/q9/model.safetensors"
wait $pid; rc=$?
if [ "$rc" -ne 0 ]; then  # (a fast machine may finish first: then there is nothing to see)
  [ "$rc" -eq 1 ] || { cat "$tmp/err"; fail "a truncated mapped model: exit $rc, want 1"; }
  grep -q "q9/model.safetensors was truncated or removed while in use" "$tmp/err" || { cat "$tmp/err"; fail "a truncated mapped model: no message naming the file"; }
  [ ! -e "$tmp/y9.npy" ] || fail "a truncated mapped model: an output was written"
fi

# 12. a virtual-memory limit: the command links no BLAS or oneDNN (the
# bench opens them as a module), so nothing keeps it from exiting
# (AddressSanitizer reserves terabytes of address space: not under it)
vlimits="100000 200000"
if ldd "$moe8" 2>/dev/null | grep -q libasan || nm "$moe8" 2>/dev/null | grep -q __asan_init; then
  echo "notice: the command is built with AddressSanitizer, which cannot run under ulimit -v: class 12 skipped"
  vlimits=""
fi
for v in $vlimits; do
  (ulimit -v $v; timeout 60 "$moe8" --help >/dev/null 2>&1); rc=$?
  [ "$rc" -eq 0 ] || fail "moe8 --help under ulimit -v $v: exit $rc (124: it hung)"
  (ulimit -v $v; timeout 60 "$moe8" run --model "$tmp/m" --input "$tmp/x.npy" --output "$tmp/yv.npy" >/dev/null 2>"$tmp/err"); rc=$?
  [ "$rc" -ne 124 ] || fail "moe8 run under ulimit -v $v hung"
  [ "$rc" -eq 0 ] || grep -q "moe8" "$tmp/err" || fail "moe8 run under ulimit -v $v failed without a message"
done

# 7. ranks that disagree on the input (9 and 6 rows)
if [ -n "$mpiexec" ]; then
  cp "$tmp/x.npy" "$tmp/xr0.npy"; cp "$tmp/x2.npy" "$tmp/xr1.npy"
  "$mpiexec" -n 2 --oversubscribe sh -c "exec '$moe8' run --model '$tmp/m' --input '$tmp/xr'\$OMPI_COMM_WORLD_RANK'.npy' --output '$tmp/r.npy'" \
    >"$tmp/out" 2>"$tmp/err"; rc=$?
  [ "$rc" -ne 0 ] || fail "ranks with different inputs: exit 0"
  [ "$(grep -c 'different token counts (from 6 to 9 rows' "$tmp/err")" -eq 2 ] || { cat "$tmp/err"; fail "ranks with different inputs: not the same message on both ranks"; }
  [ ! -e "$tmp/r.npy" ] || fail "ranks with different inputs: an output was written"
  # 11. the same shape, different values: refused on every rank, both modes
  "$py" -c "import numpy as np; x = np.load('$tmp/x.npy'); x[5, 3] += 1; np.save('$tmp/xr1.npy', x)"
  for mode in ring alltoall; do
    "$mpiexec" -n 2 --oversubscribe sh -c "exec '$moe8' run --model '$tmp/m' --input '$tmp/xr'\$OMPI_COMM_WORLD_RANK'.npy' --output '$tmp/r.npy' --ep-mode $mode" \
      >"$tmp/out" 2>"$tmp/err"; rc=$?
    [ "$rc" -ne 0 ] || fail "ranks with same-shape different inputs ($mode): exit 0"
    [ "$(grep -c 'different inputs of the same shape \[6, 256\]' "$tmp/err")" -eq 2 ] || { cat "$tmp/err"; fail "same-shape different inputs ($mode): not the message on both ranks"; }
    [ ! -e "$tmp/r.npy" ] || fail "same-shape different inputs ($mode): an output was written"
  done
  cp "$tmp/x.npy" "$tmp/xr1.npy"
  "$mpiexec" -n 2 --oversubscribe sh -c "exec '$moe8' run --model '$tmp/m' --input '$tmp/xr'\$OMPI_COMM_WORLD_RANK'.npy' --output '$tmp/r.npy'" \
    >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; fail "ranks with the same input copied twice failed"; }
  cmp -s "$tmp/r.npy" "$tmp/want.npy" || fail "two ranks on copies of one input: not the single-process bytes"
fi
# bench --plot without matplotlib: refused before anything runs (exit 2),
# not a traceback after the runs.
if ! "$py" -c "import matplotlib" >/dev/null 2>&1; then
  expect 2 "needs python3 with matplotlib" "$moe8" bench --plot "$tmp/chart.png" gmm
  [ ! -e "$tmp/chart.png" ] || fail "bench --plot without matplotlib wrote a chart"
fi
echo "hardening: ok"
