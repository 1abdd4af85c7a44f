#!/usr/bin/env bash
# The same allocator benchmarks from two builds (say, before and after a change), alternated round by round
# on one machine so that both see the same drift, then the table of bench/before_after_table.py:
#
#   bench/run_before_after.sh BEFORE_BUILD AFTER_BUILD OUT_DIR [ROUNDS] [extra Google Benchmark flags...]
#
# Default: 3 rounds of 5 repetitions each, the hit path and churn of graphalloc (simulated device and GPU)
# and cudaMallocAsync (a peer whose code does not change: how far it moves between the two sides' turns is
# the machine's noise), and, where both builds have replay_bench, 3 repetitions of the shipped traces'
# replays from an empty allocator and with the cache kept (replay/, replay_warm/; each replay's driver calls
# are in its JSON rows). OUT_DIR gets before_R.json, after_R.json (and before_R_replay.json,
# after_R_replay.json), summary.md and before_after.json.
# To build an older commit beside the current one: `git worktree add /tmp/before REV` and build its
# allocator_bench target.
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 BEFORE_BUILD AFTER_BUILD OUT_DIR [ROUNDS] [benchmark flags...]" >&2
  exit 2
fi
before=$1 after=$2 out=$3
rounds=${4:-3}
extra=("${@:5}")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
flags=(--benchmark_filter='^(hit|churn)/(graphalloc-sim|graphalloc-cuda|cudaMallocAsync)/'
       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_out_format=json "${extra[@]}")
replay_flags=(--benchmark_filter='^replay(_warm)?/' --benchmark_repetitions=3
              --benchmark_report_aggregates_only=true --benchmark_out_format=json "${extra[@]}")
for ((r = 1; r <= rounds; ++r)); do
  for side in before after; do
    build=$before
    [[ $side == after ]] && build=$after
    "$build/bench/allocator_bench" "${flags[@]}" --benchmark_out="$out/${side}_$r.json" > /dev/null
    if [[ -x "$before/bench/replay_bench" && -x "$after/bench/replay_bench" ]]; then
      "$build/bench/replay_bench" "${replay_flags[@]}" --benchmark_out="$out/${side}_${r}_replay.json" \
        > /dev/null
    fi
  done
  echo "$0: round $r of $rounds done" >&2
done
python3 "$here/before_after_table.py" "$out" --json "$out/before_after.json" | tee "$out/summary.md"
