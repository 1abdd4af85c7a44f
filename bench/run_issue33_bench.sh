#!/usr/bin/env bash
# Every benchmark issue 33 sets a target for, on the GPU machine, each beside its peer in one process, then
# the table of bench/issue33_table.py. Builds nothing: build allocator_bench, replay_bench and peers_c10 in
# BUILD_DIR first (peers_c10 needs python3 to import torch at configure time).
#
#   bench/run_issue33_bench.sh BUILD_DIR OUT_DIR
#
# Writes three JSON files into OUT_DIR (and the table into OUT_DIR/summary.md):
#   graphalloc.json      allocator_bench (hit path and churn: graphalloc on the simulated device and on
#                        GPU 0, cudaMallocAsync and cudaMalloc beside it) and replay_bench (the shipped
#                        traces, graphalloc alone, with each replay's driver calls counted by kind)
#   c10_native.json      peers_c10 with PyTorch's default configuration: hit path, churn, and the replays,
#                        graphalloc-cuda and c10_native in one process
#   c10_expandable.json  peers_c10 with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the replays
# Replays run three ways (bench/trace_replay_support.h): from an empty allocator right after the release
# (replay/), the same once the device has settled (replay_settled/), and with the cache kept (replay_warm/).
#
# Takes about 3 minutes on an H200 (the settled replays wait ~0.3 s per iteration; 3 repetitions of 3
# iterations per trace and allocator). PIN=N runs every binary on CPU N (taskset), for steadier hit-path
# figures. Medians and their spread: the table reads the median and coefficient-of-variation aggregates.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build=$1
out=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pin=()
[[ -n "${PIN:-}" ]] && pin=(taskset -c "$PIN")

common=(--benchmark_report_aggregates_only=true --benchmark_out_format=json)
# Hit path and churn: 5 repetitions of 0.1 s each; replays: 3 repetitions.
micro=(--benchmark_filter='^(hit|churn)/' --benchmark_repetitions=5 --benchmark_min_time=0.1 "${common[@]}")
replays=(--benchmark_filter='^replay' --benchmark_repetitions=3 --benchmark_min_time=0.2 "${common[@]}")
no_conf=(-u PYTORCH_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF)

run() {  # NAME EXE [env arguments...] -- [flags...]: JSON into $tmp/NAME.json
  local name=$1 exe=$2
  shift 2
  local envs=()
  while [[ $1 != -- ]]; do
    envs+=("$1")
    shift
  done
  shift
  if [[ ! -x "$exe" ]]; then
    echo "$0: $exe not built, skipped" >&2
    return
  fi
  echo "$0: running $name" >&2
  env "${envs[@]}" "${pin[@]}" "$exe" "$@" --benchmark_out="$tmp/$name.json" >"$tmp/$name.txt"
}

run allocator "$build/bench/allocator_bench" "${no_conf[@]}" -- "${micro[@]}"
run replay "$build/bench/replay_bench" "${no_conf[@]}" -- "${replays[@]}"
run c10_micro "$build/bench/peers_c10" "${no_conf[@]}" -- "${micro[@]}"
run c10_replay "$build/bench/peers_c10" "${no_conf[@]}" -- "${replays[@]}"
run c10_expandable "$build/bench/peers_c10" "${no_conf[@]}" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  -- "${replays[@]}"

# One JSON per file named above: the runs' benchmark lists joined, the first run's context kept.
merge() {  # OUT_NAME RUN_NAME...
  python3 - "$out/$1.json" "$tmp" "${@:2}" <<'EOF'
import json, os, sys
target, tmp, names = sys.argv[1], sys.argv[2], sys.argv[3:]
merged = None
for name in names:
    path = os.path.join(tmp, name + ".json")
    if not os.path.exists(path):
        continue
    data = json.load(open(path))
    if merged is None:
        merged = {"context": data.get("context", {}), "benchmarks": []}
        merged["context"]["runs"] = []
    merged["context"]["runs"].append({"name": name, "executable": data.get("context", {}).get("executable")})
    merged["benchmarks"] += data.get("benchmarks", [])
if merged is not None:
    with open(target, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")
EOF
}
merge graphalloc allocator replay
merge c10_native c10_micro c10_replay
merge c10_expandable c10_expandable
python3 "$here/issue33_table.py" "$out" | tee "$out/summary.md"
