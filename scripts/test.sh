#!/usr/bin/env bash
# Builds graphalloc with warnings as errors and runs the whole test suite on the simulated device
# (the `gpu`-labelled entries, which need a real GPU, are excluded; see README "Testing on a GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PATH:/usr/local/cuda/bin"
jobs=$(nproc)
build=${GRAPHALLOC_BUILD_DIR:-build-test}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHALLOC_WERROR=ON
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" -LE gpu --output-on-failure -j "$jobs"
