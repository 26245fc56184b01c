#!/bin/sh
# pip installs the Python package from the source tree, offline, with the
# built library inside it, and imports it from outside the tree; then, from
# a copy of the tracked files only (a fresh clone, nothing built), into a
# new virtual environment, where pip builds the library itself; and an
# unbuilt package without its source tree is refused with a message.
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
# A fresh clone: the tracked files, nothing built.  pip builds the library.
if command -v git >/dev/null 2>&1 && git -C "$src" rev-parse --git-dir >/dev/null 2>&1 && "$py" -m venv --help >/dev/null 2>&1; then
  mkdir "$tmp/clone"
  git -C "$src" ls-files -z | (cd "$src" && xargs -0 cp --parents -t "$tmp/clone")
  "$py" -m venv --system-site-packages "$tmp/venv"   # numpy from the system: the install itself is offline
  t0=$(date +%s)
  # As on a machine without MPI: the library and the package need none.
  env -u MOE8_LIBRARY MOE8_CMAKE_ARGS=-DMOE8_MPI=OFF "$tmp/venv/bin/pip" install --verbose --no-build-isolation --no-deps --no-index "$tmp/clone/python" >"$tmp/build.log" 2>&1 ||
    { tail -30 "$tmp/build.log"; echo "FAIL: pip install from a fresh clone"; exit 1; }
  grep -q "moe8: building libmoe8 from" "$tmp/build.log" || { tail -30 "$tmp/build.log"; echo "FAIL: pip did not build the library"; exit 1; }
  out=$("$tmp/venv/bin/python" -c "import moe8, moe8.torch, os
assert moe8.library_path.startswith('$tmp/venv'), moe8.library_path
assert os.path.exists(os.path.join(os.path.dirname(moe8.library_path), '..', 'LICENSE'))
assert not os.path.exists(os.path.join(os.path.dirname(moe8.library_path), 'libmoe8_mpi.so'))
print(moe8.__version__)")
  echo "pip install from a fresh clone into a venv, built without MPI (library built by pip in $(( $(date +%s) - t0 )) s): ok, moe8 $out"
  # Without PyTorch, moe8.torch imports and says what it needs when used.
  "$tmp/venv/bin/python" -c "import sys; sys.modules['torch'] = None
import moe8, moe8.torch
try:
    moe8.torch.MoE8Block
except ImportError as e:
    assert 'needs PyTorch' in str(e), e
else:
    raise SystemExit('no error without torch')
print('moe8.torch without PyTorch: imports, names what it needs')"
else
  echo "notice: no git checkout or no python3-venv: the fresh-clone install is skipped"
fi
# The package alone, without its source tree or a built library: the
# install stops with a message instead of "succeeding".
cp -r "$src/python" "$tmp/bare"
rm -rf "$tmp/bare/moe8/_lib"
if env -u MOE8_LIBRARY "$py" -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$tmp/site2" "$tmp/bare" >"$tmp/err" 2>&1 &&
   [ ! -e "$tmp/bare/../build" ]; then
  # (the copy has no ../build: the only way to succeed would be to package nothing)
  cat "$tmp/err"; echo "FAIL: pip install of an unbuilt tree succeeded"; exit 1
fi
grep -q "no libmoe8.so to package and no source tree" "$tmp/err" || { cat "$tmp/err"; echo "FAIL: no message naming the missing library"; exit 1; }
echo "pip install of an unbuilt tree: refused with a message"
