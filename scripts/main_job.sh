#!/usr/bin/env bash
# The main job: builds the graphalloc CLI, checks the default device (the real GPU where there is one, the
# simulated device otherwise), replays the GPT-2 training trace through graphalloc on it (peak live vs peak
# reserved bytes, whether it completed, time per operation), and writes a snapshot of the allocator at the
# trace's peak with its picture. Exits non-zero when the replay does not complete.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PATH:/usr/local/cuda/bin"
build=${GRAPHALLOC_BUILD_DIR:-build}
out=${GRAPHALLOC_OUT_DIR:-out}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRAPHALLOC_BUILD_TESTS=OFF \
      -DGRAPHALLOC_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" --target graphalloc_cli -j "$(nproc)"
mkdir -p "$out"
"$build/tools/graphalloc" device
"$build/tools/graphalloc" replay traces/gpt2_train.csv.gz --snapshot "$out/gpt2_train.json"
"$build/tools/graphalloc" snapshot plot "$out/gpt2_train.json" -o "$out/gpt2_train.html"
"$build/tools/graphalloc" snapshot summary "$out/gpt2_train.json" --top 5
echo
echo "Snapshot at the peak: $out/gpt2_train.json (at the end: $out/gpt2_train.end.json)"
echo "Its picture (open in a browser, no network needed): $out/gpt2_train.html"
