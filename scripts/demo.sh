#!/usr/bin/env bash
# Builds moe8 and runs its main job, 'moe8 demo'.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
./build/moe8 demo "$@"
