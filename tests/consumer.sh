#!/bin/sh
# Install moe8 into a temporary prefix, then build a program outside the
# tree four ways — pkg-config shared and static, find_package shared and
# static — and run each; and check that the shared library exports only
# moe8_ symbols.  usage: consumer.sh BUILD_DIR SOURCE_DIR
set -eu
build="$1"; src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
lib="$tmp/prefix/lib"
[ -d "$lib" ] || lib=$(dirname "$(find "$tmp/prefix" -name libmoe8.a | head -1)")
so=$(find "$lib" -name 'libmoe8.so.*.*' | head -1)
[ -n "$so" ] || fail "no shared library installed"
objdump -p "$so" | grep -q 'SONAME *libmoe8.so.0' || fail "SONAME is not libmoe8.so.0"
bad=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^moe8_' || true)
[ -z "$bad" ] || fail "the shared library exports non-public symbols: $(echo $bad | head -c 300)"
echo "exported: $(nm -D --defined-only "$so" | wc -l) symbols, all moe8_"
[ -x "$tmp/prefix/bin/moe8" ] || fail "the moe8 command is not installed"
# MPI is a module of its own: neither the library nor its CMake package or
# pkg-config file asks a user for MPI.
readelf -d "$so" | grep NEEDED | grep -qi mpi && fail "libmoe8.so links MPI: $(readelf -d "$so" | grep NEEDED | grep -i mpi)"
grep -rqi 'MPI' "$lib/cmake/moe8/moe8Config.cmake" && fail "the CMake package asks for MPI"
grep -qi 'mpi' "$lib/pkgconfig/moe8.pc" && fail "moe8.pc names MPI"
if [ -e "$build/libmoe8_mpi.so" ]; then
  [ -e "$lib/moe8/libmoe8_mpi.so" ] || fail "the MPI module is not installed in lib/moe8"
  echo "MPI: the module lib/moe8/libmoe8_mpi.so; libmoe8.so needs $(readelf -d "$so" | grep NEEDED | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
fi
export PKG_CONFIG_PATH="$lib/pkgconfig"
cc=${CC:-cc}
$cc -o "$tmp/pc_shared" "$src/tests/consumer/consumer.c" $(pkg-config --cflags --libs moe8) -lm -Wl,-rpath,"$lib"
$cc -o "$tmp/pc_static" "$src/tests/consumer/consumer.c" $(pkg-config --cflags moe8) -Wl,-Bstatic $(pkg-config --libs-only-L moe8) -lmoe8 \
  -Wl,-Bdynamic $(pkg-config --static --libs moe8 | sed 's/-lmoe8//')
ldd "$tmp/pc_static" | grep -q libmoe8 && fail "the static build needs libmoe8.so"
ldd "$tmp/pc_shared" | grep -q libmoe8.so.0 || fail "the shared build does not use libmoe8.so.0"
cmake -S "$src/tests/consumer" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_RPATH="$lib" >/dev/null
cmake --build "$tmp/cm" >/dev/null
for p in "$tmp/pc_shared" "$tmp/pc_static" "$tmp/cm/consumer_shared" "$tmp/cm/consumer_static"; do
  out=$("$p") || fail "$p failed"
  echo "$(basename "$p"): $out"
done
echo "consumer: ok"
