#!/usr/bin/env bash
# The test command (README, command 2; CI runs it). Builds graphalloc and runs the whole test suite on the
# simulated device three ways, then the fuzzers; any failure or sanitizer report fails the script:
#   normal  warnings as errors, CUDA kernels and benchmarks included, the install/consumer test too;
#   asan    AddressSanitizer + UndefinedBehaviorSanitizer (gcc; a UBSan report aborts the test);
#   tsan    ThreadSanitizer (gcc);
#   fuzz    the libFuzzer targets for a bounded time each (clang; scripts/fuzz.sh).
# The sanitizer builds skip benchmarks and CUDA kernels (which need a GPU to run). The `gpu`-labelled
# entries, which need a real GPU, are excluded (see README "Testing on a GPU").
#
#   GRAPHALLOC_TEST_STAGES  which stages, in order (default "normal asan tsan fuzz")
#   GRAPHALLOC_BUILD_DIR    the normal build directory (default build-test; the others get -asan, -tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PATH:/usr/local/cuda/bin"
jobs=$(nproc)
build=${GRAPHALLOC_BUILD_DIR:-build-test}
stages=(${GRAPHALLOC_TEST_STAGES:-normal asan tsan fuzz})

# Stop at the first report, with a failing exit code. No suppressions: every report is ours to fix.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"

configure_and_test() {  # name build_dir ctest_exclude_regex cmake_args...
  local name=$1 dir=$2 exclude=$3
  shift 3
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHALLOC_WERROR=ON "$@" >/dev/null &&
    cmake --build "$dir" -j "$jobs" &&
    ctest --test-dir "$dir" -LE "$exclude" --output-on-failure -j "$jobs"
}

# Sanitizer builds: -O1 with line tables only (enough for symbolized reports, and much faster to build on
# CI's two cores), assertions on; no benchmarks, no CUDA kernels; the install test runs in the normal build.
sanitizer_build=(-DGRAPHALLOC_BUILD_BENCHMARKS=OFF -DGRAPHALLOC_ENABLE_CUDA=OFF
                 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1")

# Every stage runs even when an earlier one failed, so that one CI log shows every failure.
times=()
failed=()
for stage in "${stages[@]}"; do
  start=$SECONDS
  echo "==== test stage: $stage"
  rc=0
  case "$stage" in
    normal)
      configure_and_test normal "$build" gpu || rc=$? ;;
    asan)
      configure_and_test asan "$build-asan" "gpu|install" -DGRAPHALLOC_SANITIZE=address,undefined \
        "${sanitizer_build[@]}" || rc=$? ;;
    tsan)
      configure_and_test tsan "$build-tsan" "gpu|install" -DGRAPHALLOC_SANITIZE=thread \
        "${sanitizer_build[@]}" || rc=$? ;;
    fuzz)
      GRAPHALLOC_FUZZ_BUILD_DIR="$build-fuzz" scripts/fuzz.sh || rc=$? ;;
    *)
      echo "unknown stage '$stage' (normal, asan, tsan, fuzz)" >&2
      exit 2 ;;
  esac
  [ "$rc" -eq 0 ] || failed+=("$stage")
  times+=("$stage $((SECONDS - start))s$([ "$rc" -eq 0 ] || echo ' FAILED')")
done
echo "==== test stages: ${times[*]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "==== FAILED: ${failed[*]}"
  exit 1
fi
echo "==== all stages passed"
