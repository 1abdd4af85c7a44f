#!/usr/bin/env bash
# Runs allocator_bench and (when built) peers_c10 with JSON output into OUT_DIR, then prints a Markdown
# table of the medians with graphalloc/c10 and graphalloc/cudaMallocAsync for the hit path.
#
#   bench/run_allocator_bench.sh BUILD_DIR OUT_DIR [extra Google Benchmark flags...]
#
# Defaults: 5 repetitions, aggregates only (the table reads the _median rows), and not peers_c10's trace
# replays (bench/run_replay_bench.sh runs those). Extra flags are passed to both binaries and override the
# defaults, e.g. --benchmark_filter=hit or --benchmark_min_time=0.1s.
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

flags=(--benchmark_filter=-^replay --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
       --benchmark_out_format=json "$@")
jsons=()
for bin in allocator_bench peers_c10; do
  exe="$build_dir/bench/$bin"
  if [[ ! -x "$exe" ]]; then
    echo "$0: $exe not built, skipped" >&2
    continue
  fi
  echo "$0: running $bin" >&2
  "$exe" "${flags[@]}" --benchmark_out="$out_dir/$bin.json" >"$out_dir/$bin.txt"
  jsons+=("$out_dir/$bin.json")
done
if [[ ${#jsons[@]} -eq 0 ]]; then
  echo "$0: nothing ran (build allocator_bench first)" >&2
  exit 1
fi
python3 "$here/allocator_bench_table.py" "${jsons[@]}" | tee "$out_dir/summary.md"
