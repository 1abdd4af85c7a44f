#!/usr/bin/env bash
# The main job: builds the graphalloc CLI and libgraphalloc.so (for Python and C), checks the default device (the real GPU where there is one, the
# simulated device otherwise), replays the GPT-2 training trace through graphalloc on it (peak live vs peak
# reserved bytes, whether it completed, time per operation), and writes a snapshot of the allocator at the
# trace's peak with its picture. Exits non-zero when the replay does not complete. Its output is meant to be
# read: under 40 lines, each notice once (the replay runs on the device the check found).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PATH:/usr/local/cuda/bin"
build=${GRAPHALLOC_BUILD_DIR:-build}
out=${GRAPHALLOC_OUT_DIR:-out}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRAPHALLOC_BUILD_TESTS=OFF \
      -DGRAPHALLOC_BUILD_BENCHMARKS=OFF >/dev/null
# The build's own lines go to a log, shown only when it fails.
mkdir -p "$build"
if ! cmake --build "$build" --target graphalloc_cli graphalloc_shared -j "$(nproc)" >"$build/main_job_build.log" 2>&1; then
  cat "$build/main_job_build.log" >&2
  exit 1
fi
echo "Built $build/tools/graphalloc and $build/libgraphalloc.so"
ga="$build/tools/graphalloc"
mkdir -p "$out"
device_report=$("$ga" device)
echo "$device_report"
# The device check has said whether a GPU is used and why not: the replay need not say it again.
device=auto
if grep -q '(simulated device)' <<<"$device_report"; then device=sim; fi
echo
"$ga" replay traces/gpt2_train.csv.gz --device "$device" --snapshot "$out/gpt2_train.json"
"$ga" snapshot plot "$out/gpt2_train.json" -o "$out/gpt2_train.html"
echo
"$ga" snapshot summary "$out/gpt2_train.json" --brief --top 3
echo "Open $out/gpt2_train.html in a browser (no network needed)."
