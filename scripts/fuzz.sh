#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, AddressSanitizer and UndefinedBehaviorSanitizer,
# and runs each one for a bounded time on a copy of its checked-in seed corpus (tests/fuzz/corpus/<name>/),
# printing its exec count. Any crash, sanitizer report, leak, timeout or out-of-memory fails the script;
# the input that caused it is kept in the work directory and its path printed.
#
# Each fuzzer gets GRAPHALLOC_FUZZ_SECONDS of one core: all of them run at once, for that time times the
# number of fuzzers over the number of cores (45 s each, 5 fuzzers, 2 cores: 113 s), which keeps every
# core busy to the end (rounds of two would leave one idle while the fifth runs alone).
#
#   GRAPHALLOC_FUZZ_SECONDS   core-seconds per fuzzer (default 45)
#   GRAPHALLOC_FUZZ_BUILD_DIR build directory (default build-fuzz)
#   GRAPHALLOC_FUZZ_CONFIGURED 1: the build directory is configured already, with clang, fuzzer-no-link,
#                             ASan and UBSan and GRAPHALLOC_BUILD_FUZZERS=ON (the test command's asan
#                             stage, scripts/test.sh): only the fuzzers are built there, if they are not yet
#   GRAPHALLOC_FUZZERS        which fuzzers (default: all five)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${GRAPHALLOC_FUZZ_SECONDS:-45}
build=${GRAPHALLOC_FUZZ_BUILD_DIR:-build-fuzz}
fuzzers=(${GRAPHALLOC_FUZZERS:-config_fuzzer trace_fuzzer c_api_fuzzer snapshot_json_fuzzer torch_pickle_fuzzer})
jobs=$(nproc)
wall=$(((seconds * ${#fuzzers[@]} + jobs - 1) / jobs))
[ "$wall" -ge "$seconds" ] || wall=$seconds

# Debian's Abseil and GoogleTest are built by gcc against libstdc++, which clang uses too on Debian.
# CUDA kernels, benchmarks and the CLI are not needed; GRAPHALLOC_BUILD_TESTS only provides tests/fuzz. A
# unity build, as the other sanitizer stages (scripts/test.sh): building is most of this stage on two cores.
if [ "${GRAPHALLOC_FUZZ_CONFIGURED:-0}" != 1 ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DGRAPHALLOC_ENABLE_CUDA=OFF -DGRAPHALLOC_BUILD_BENCHMARKS=OFF -DGRAPHALLOC_BUILD_TOOLS=OFF \
    -DGRAPHALLOC_BUILD_TESTS=ON -DGRAPHALLOC_BUILD_FUZZERS=ON \
    -DGRAPHALLOC_SANITIZE=fuzzer-no-link,address,undefined >/dev/null
elif ! grep -q "^GRAPHALLOC_SANITIZE:STRING=fuzzer-no-link,address,undefined$" "$build/CMakeCache.txt" ||
     ! grep -q "^GRAPHALLOC_BUILD_FUZZERS:BOOL=ON$" "$build/CMakeCache.txt"; then
  echo "fuzz: $build is not configured for the fuzzers (GRAPHALLOC_FUZZ_CONFIGURED=1 needs clang," \
       "GRAPHALLOC_SANITIZE=fuzzer-no-link,address,undefined and GRAPHALLOC_BUILD_FUZZERS=ON)" >&2
  exit 2
fi
cmake --build "$build" -j "$jobs" --target "${fuzzers[@]}"

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
corpus_of() {
  case "$1" in
    config_fuzzer) echo tests/fuzz/corpus/config ;;
    trace_fuzzer) echo tests/fuzz/corpus/trace ;;
    c_api_fuzzer) echo tests/fuzz/corpus/c_api ;;
    snapshot_json_fuzzer) echo tests/fuzz/corpus/snapshot_json ;;
    torch_pickle_fuzzer) echo tests/fuzz/corpus/torch_pickle ;;
    *) echo "unknown fuzzer $1" >&2; return 1 ;;
  esac
}

# One fuzzer: runs it, then writes its summary line (and on failure the log's tail) to $work/result.
run_one() {
  local fuzzer=$1 work="$build/fuzz-work/$1" seeds rc=0 execs units rate
  seeds=$(corpus_of "$fuzzer")
  rm -rf "$work"
  mkdir -p "$work/corpus"
  # New inputs go to the first directory (the work copy), never into the checked-in seeds.
  "$build/tests/fuzz/$fuzzer" "$work/corpus" "$seeds" -max_total_time="$wall" -timeout=25 \
    -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 -artifact_prefix="$work/" >"$work/log.txt" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log.txt" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log.txt" | tail -1)
  units=$(find "$work/corpus" -type f | wc -l)
  printf '%-21s execs=%-9s execs/s=%-6s new_units=%-5s exit=%s\n' "$fuzzer" "${execs:-?}" "${rate:-?}" "$units" \
    "$rc" >"$work/result"
  return "$rc"
}

# The fuzzers are single-threaded: all at once, sharing the cores (see above).
echo "== fuzzing ${#fuzzers[@]} targets at once for ${wall}s (${seconds} core-seconds each on $jobs cores)"
for fuzzer in "${fuzzers[@]}"; do
  run_one "$fuzzer" &
done
wait || true

failed=()
echo "== fuzz summary (${wall}s each, ${#fuzzers[@]} at once on $jobs cores)"
for fuzzer in "${fuzzers[@]}"; do
  work="$build/fuzz-work/$fuzzer"
  cat "$work/result" 2>/dev/null || echo "$fuzzer: no result"
  if ! grep -q "exit=0$" "$work/result" 2>/dev/null; then failed+=("$fuzzer"); fi
done
for fuzzer in "${failed[@]}"; do
  work="$build/fuzz-work/$fuzzer"
  echo "!! $fuzzer failed; last lines of $work/log.txt:"
  tail -n 60 "$work/log.txt" || true
  ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null | sed 's/^/   reproducer: /' || true
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
