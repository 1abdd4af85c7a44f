#!/usr/bin/env bash
# Replays the shipped traces (traces/*.csv.gz) through graphalloc and through PyTorch's c10 allocator, with
# and without c10's expandable segments, and prints the comparison (issue 4: graphalloc at most 1/3 of
# c10's replay time). On the GPU machine, after building replay_bench and peers_c10 in BUILD_DIR:
#
#   bench/run_replay_bench.sh BUILD_DIR OUT_DIR [extra Google Benchmark flags...]
#
# Runs, each with JSON output into OUT_DIR:
#   replay_bench                                      graphalloc on the simulated device and on GPU 0
#   peers_c10, PYTORCH_CUDA_ALLOC_CONF unset          graphalloc-cuda and c10_native in one process
#   peers_c10, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#                                                     graphalloc-cuda and c10_expandable in one process
# (c10 reads its configuration once per process, hence two runs; PYTORCH_ALLOC_CONF, which c10 reads
# first, is unset for both.) Defaults: 3 repetitions, aggregates only; the table reads the medians.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR [benchmark flags...]" >&2
  exit 2
fi
build_dir=$1
out_dir=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out_dir"

flags=(--benchmark_filter='^replay' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
       --benchmark_out_format=json "$@")
jsons=()

run() {  # run NAME EXE [env assignments...]
  local name=$1 exe=$2
  shift 2
  if [[ ! -x "$exe" ]]; then
    echo "$0: $exe not built, skipped" >&2
    return
  fi
  echo "$0: running $name" >&2
  env -u PYTORCH_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF "$@" \
    "$exe" "${flags[@]}" --benchmark_out="$out_dir/$name.json" >"$out_dir/$name.txt"
  jsons+=("$out_dir/$name.json")
}

run replay_bench "$build_dir/bench/replay_bench"
run peers_c10_native "$build_dir/bench/peers_c10"
run peers_c10_expandable "$build_dir/bench/peers_c10" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

if [[ ${#jsons[@]} -eq 0 ]]; then
  echo "$0: nothing ran (build replay_bench and peers_c10 first)" >&2
  exit 1
fi
python3 "$here/replay_bench_table.py" "${jsons[@]}" | tee "$out_dir/summary.md"
