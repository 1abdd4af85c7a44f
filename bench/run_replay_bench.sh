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
source "$(dirname "${BASH_SOURCE[0]}")/bench_runner.sh" "$@"

flags=(--benchmark_filter='^replay' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
       --benchmark_out_format=json "${extra_flags[@]}")
no_conf=(-u PYTORCH_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF)
run_bench replay_bench "$build_dir/bench/replay_bench" "${no_conf[@]}"
run_bench peers_c10_native "$build_dir/bench/peers_c10" "${no_conf[@]}"
run_bench peers_c10_expandable "$build_dir/bench/peers_c10" "${no_conf[@]}" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
print_table replay_bench_table.py
