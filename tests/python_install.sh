#!/bin/sh
# pip installs the Python package from the source tree, offline, with the
# built library inside it, and imports it from outside the tree.
# usage: python_install.sh PYTHON SOURCE_DIR LIBRARY
set -eu
py="$1"; src="$2"; lib="$3"
if ! "$py" -m pip --version >/dev/null 2>&1; then echo "notice: pip is not installed (apt-get install python3-pip): skipped"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/python" "$tmp/src"
rm -rf "$tmp/src/moe8/_lib"
MOE8_LIBRARY="$lib" "$py" -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$tmp/site" "$tmp/src" 2>&1 | grep -v "Running pip as the 'root'" || true
cd "$tmp"
out=$(env -u MOE8_LIBRARY PYTHONPATH="$tmp/site" "$py" -c "import moe8, numpy as np
L = moe8.Layer(num_experts=4, top_k=2, hidden=16, ffn=8)
L.init_random(1)
y, _ = L.forward(np.ones((2, 16), np.float32))
assert moe8.library_path.startswith('$tmp/site'), moe8.library_path
print(moe8.version(), y.shape)")
echo "pip install: ok ($out)"
# An unbuilt tree: the install stops with a message instead of "succeeding".
cp -r "$src/python" "$tmp/bare"
rm -rf "$tmp/bare/moe8/_lib"
if env -u MOE8_LIBRARY "$py" -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$tmp/site2" "$tmp/bare" >"$tmp/err" 2>&1 &&
   [ ! -e "$tmp/bare/../build" ]; then
  # (the copy has no ../build: the only way to succeed would be to package nothing)
  cat "$tmp/err"; echo "FAIL: pip install of an unbuilt tree succeeded"; exit 1
fi
grep -q "no libmoe8.so to package" "$tmp/err" || { cat "$tmp/err"; echo "FAIL: no message naming the missing library"; exit 1; }
echo "pip install of an unbuilt tree: refused with a message"
