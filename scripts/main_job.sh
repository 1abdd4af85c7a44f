#!/usr/bin/env bash
# The main job: builds the graphalloc CLI, checks the default device (the real GPU where there is one, the
# simulated device otherwise) and replays the GPT-2 training trace through graphalloc on it: peak live vs peak
# reserved bytes, whether it completed, time per operation. Exits non-zero when the replay does not complete.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PATH:/usr/local/cuda/bin"
build=${GRAPHALLOC_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRAPHALLOC_BUILD_TESTS=OFF \
      -DGRAPHALLOC_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" --target graphalloc_cli -j "$(nproc)"
"$build/tools/graphalloc" device
"$build/tools/graphalloc" replay traces/gpt2_train.csv.gz
