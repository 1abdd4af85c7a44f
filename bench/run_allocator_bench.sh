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
source "$(dirname "${BASH_SOURCE[0]}")/bench_runner.sh" "$@"

flags=(--benchmark_filter=-^replay --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
       --benchmark_out_format=json "${extra_flags[@]}")
run_bench allocator_bench "$build_dir/bench/allocator_bench"
run_bench peers_c10 "$build_dir/bench/peers_c10"
print_table allocator_bench_table.py
