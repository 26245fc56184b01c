#!/usr/bin/env bash
# Builds moe8 and runs every test: the full suite (warnings as errors), then
# the suite again under AddressSanitizer + UndefinedBehaviorSanitizer with
# the exhaustive 2^32 sweeps sampled (MOE8_TEST_EXHAUSTIVE=0).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE8_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure

if [ "${MOE8_SKIP_SANITIZE:-0}" != "1" ]; then
  # ThreadSanitizer on the library's thread test (two layers in two threads,
  # two backwards sharing a layer's buffer pool,
  # parsers in parallel); OpenMP off, since libgomp is not instrumented.
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS=-fsanitize=thread \
    -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DMOE8_OPENMP=OFF -DMOE8_MPI=OFF -DMOE8_BLAS=OFF
  cmake --build build-tsan -j "$jobs" --target test_threads
  TSAN_OPTIONS=halt_on_error=1 ./build-tsan/test_threads

  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE8_WERROR=ON -DMOE8_SANITIZE=ON
  cmake --build build-asan -j "$jobs"
  MOE8_TEST_EXHAUSTIVE=0 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure
fi
