#!/usr/bin/env bash
# The test command (README, command 2; CI runs it). Builds graphalloc and runs the whole test suite on the
# simulated device three ways, then the fuzzers; any failure or sanitizer report fails the script:
#   normal  warnings as errors, CUDA kernels and benchmarks included, the install/consumer test too;
#   asan    AddressSanitizer + UndefinedBehaviorSanitizer (clang; a UBSan report aborts the test), with
#           the libFuzzer targets built in the same tree;
#   tsan    ThreadSanitizer (gcc), on the test binaries that start threads (label `threads`): only they
#           can race. The thread census (tests/testing/thread_census.cc) fails a normal-stage test whose
#           threads contradict its label, so a test that begins to start threads joins this stage. What
#           is given up: TSan's lock-order (potential deadlock) reports on paths that only single-threaded
#           tests take (the RNG, the CLI); the threaded tests take the allocator's locks from many
#           threads (allocate, free, stream events, empty cache, snapshots, capture into pools, expandable
#           growth, sleep and wake, checkpoint and restore, the graph tree's recordings, branches and
#           replays, IPC export, the history ring);
#   fuzz    the libFuzzer targets for a bounded time each (scripts/fuzz.sh), as the asan stage built them.
# The sanitizer builds skip benchmarks and CUDA kernels (which need a GPU to run). The `gpu`-labelled
# entries, which need a real GPU, are excluded (see README "Testing on a GPU").
#
# CI has two cores and compiling is most of the time, so every build keeps only line tables for its debug
# information (-g1: symbolized stack traces and sanitizer reports with file:line, at about a quarter less
# compile time than -g). Under the sanitizers, which run the same code 5-50x slower to check memory and
# races rather than more states, randomized tests run GRAPHALLOC_TEST_SCALE of their operations (the
# stress, randomized allocator, shipped-trace and RNG tests read it through tests/testing/test_scale.h; the
# normal build keeps every count an issue asks for). Each stage prints its wall
# and CPU time and its slowest tests.
#
#   GRAPHALLOC_TEST_STAGES  which stages, in order (default "normal asan tsan fuzz")
#   GRAPHALLOC_BUILD_DIR    the normal build directory (default build-test; the others get -asan, -tsan)
#   GRAPHALLOC_SANITIZER_TEST_SCALE  GRAPHALLOC_TEST_SCALE for the sanitizer stages (default 0.25)
#   GRAPHALLOC_TORCH_HEADERS  PyTorch's include folder: without a PyTorch that python3 imports, the normal
#                           stage still compiles the PyTorch backend against these headers (.ci/run sets it)
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

# Configures and builds `target` (all: everything) in build_dir, then runs the tests CTest selects with
# `label` (a label regex; "" for every test) less those matching `exclude`.
configure_and_test() {  # name build_dir target label exclude cmake_args...
  local name=$1 dir=$2 target=$3 label=$4 exclude=$5 rc=0
  shift 5
  local select=(-LE "$exclude")
  [ -z "$label" ] || select+=(-L "$label")
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHALLOC_WERROR=ON "$@" >/dev/null &&
    cmake --build "$dir" -j "$jobs" --target "$target" || return
  ctest --test-dir "$dir" "${select[@]}" --output-on-failure -j "$jobs" | tee "$dir/ctest.log" || rc=$?
  echo "== $name: slowest tests"
  sed -nE 's/^.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 s  \1/p' "$dir/ctest.log" | sort -rn | head -n 5
  return "$rc"
}

# Sets `cpu` to the CPU seconds (user + system) this script's finished children have used so far. `times`
# must run in this shell, not in a $(...) subshell, which has no children of its own.
times_file=$(mktemp)
trap 'rm -f "$times_file"' EXIT
cpu_now() {
  times >"$times_file"  # last line "XmY.YYYs XmY.YYYs": the children's user and system time
  cpu=$(tail -n 1 "$times_file" | awk '{ s = 0; for (i = 1; i <= 2; ++i) { split($i, a, "m"); s += a[1] * 60 + a[2] }
                                         printf "%d", s }')
}

# The normal build: -O2 as released, with line tables only.
normal_build=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
# Sanitizer builds: -O1 with line tables only (enough for symbolized reports, and much faster to build on
# CI's two cores), assertions on; no benchmarks, no CUDA kernels; the install test runs in the normal build.
# They are unity builds (each target's sources compiled a few at a time as one translation unit), which
# cuts the ASan build's CPU time by about a third (1,025 CPU-seconds on 2026-11-27). The normal build is
# not: it compiles every file on its own, so a missing #include, which a unity build hides, fails there.
# The programs the tests run briefly (the CLI, the example MLP's driver) compile at -O0 there
# (GRAPHALLOC_PROGRAM_COMPILE_OPTIONS, CMakeLists.txt): every access is still checked.
sanitizer_build=(-DCMAKE_UNITY_BUILD=ON
                 -DGRAPHALLOC_BUILD_BENCHMARKS=OFF -DGRAPHALLOC_ENABLE_CUDA=OFF -DGRAPHALLOC_BUILD_TORCH_SHIM=OFF
                 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1"
                 -DGRAPHALLOC_PROGRAM_COMPILE_OPTIONS=-O0)
sanitizer_scale=${GRAPHALLOC_SANITIZER_TEST_SCALE:-0.25}
# The ASan+UBSan stage is built by clang with libFuzzer's coverage instrumentation (fuzzer-no-link), so
# that the fuzz stage runs the fuzzers this tree builds beside the tests instead of compiling the library
# a fourth time (scripts/fuzz.sh; about 260 compile-seconds, a tenth of the command on two cores). The
# instrumentation only counts edges; every test still runs under both sanitizers. gcc keeps the normal and
# TSan stages, so each compiler's warnings still fail the build.
# It links with lld: GNU ld took 1.3 s per ASan test binary and lld 0.45 (about 90 links).
asan_build=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DGRAPHALLOC_BUILD_FUZZERS=ON
            -DGRAPHALLOC_SANITIZE=fuzzer-no-link,address,undefined
            -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld
            -DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=lld)
# Every stage compiles the test code itself (test files, tests/testing) with less optimization than the
# library under test, which keeps its stage's level (-O2 as released, -O1 under the sanitizers;
# tests/CMakeLists.txt, GRAPHALLOC_TEST_COMPILE_OPTIONS): nearly every test spends its time in the
# library, and no test times anything. gcc at -Og: under TSan it cuts about a fifth of a test file's
# compile (caching_allocator_test 15.9 s against 20.1 at -O1), in the normal stage 30% (5.3 s against
# 7.7); gcc at -O0 saves nothing more (its time is in the front end). clang at -O0 in the ASan+UBSan stage:
# there an -O1 compile is mostly instrumented optimization and code generation (caching_allocator_test
# 10.3-10.8 s at -O1, 5.5-6.1 at -O0, 4.4-5.6 parsing alone; without the precompiled header), and the
# stage's test files took 299 compile-seconds against 737 (clean clones, 2026-11-29). The tests whose own
# code does the work (HOT in tests/*/CMakeLists.txt: reference models, a CPU reference of the RNG
# kernels) keep -Og there: at -O0 they ran up to 15x longer. Every check still runs: each sanitizer
# instruments every access the compiler keeps, and at -O0 it keeps them all.
test_code=(-DGRAPHALLOC_TEST_COMPILE_OPTIONS=-Og)
asan_test_code=(-DGRAPHALLOC_TEST_COMPILE_OPTIONS=-O0 -DGRAPHALLOC_HOT_TEST_COMPILE_OPTIONS=-Og)
# The HTML viewer's browser test spends its time in Chromium, which no sanitizer instruments; the CLI that
# writes the page runs under both sanitizers in snapshot_cli_test. It runs in the normal stage only. So do
# the export checks (label exports): the exported symbols are the released library's, which the normal
# stage builds as released (gcc, -O2); clang at -O1 emits a few libstdc++ template instances (a vector's
# emplace_back returning one of our types) whose demangled name begins with that type, which the version
# script's C++ patterns then match.
sanitizer_skip="gpu|install|browser|exports"

# Every stage runs even when an earlier one failed, so that one CI log shows every failure.
summary=()
failed=()
for stage in "${stages[@]}"; do
  start=$SECONDS
  cpu_now
  cpu_start=$cpu
  echo "==== test stage: $stage"
  rc=0
  case "$stage" in
    normal)
      configure_and_test normal "$build" all "" gpu "${normal_build[@]}" "${test_code[@]}" || rc=$? ;;
    asan)
      GRAPHALLOC_TEST_SCALE=$sanitizer_scale configure_and_test asan "$build-asan" all "" "$sanitizer_skip" \
        "${asan_build[@]}" "${sanitizer_build[@]}" "${asan_test_code[@]}" || rc=$? ;;
    tsan)
      GRAPHALLOC_TEST_SCALE=$sanitizer_scale configure_and_test tsan "$build-tsan" graphalloc_threads_tests \
        threads "$sanitizer_skip" -DGRAPHALLOC_SANITIZE=thread "${sanitizer_build[@]}" "${test_code[@]}" ||
        rc=$? ;;
    fuzz)
      if [[ " ${stages[*]} " == *" asan "* && -f "$build-asan/CMakeCache.txt" ]]; then
        GRAPHALLOC_FUZZ_BUILD_DIR="$build-asan" GRAPHALLOC_FUZZ_CONFIGURED=1 scripts/fuzz.sh || rc=$?
      else
        GRAPHALLOC_FUZZ_BUILD_DIR="$build-fuzz" scripts/fuzz.sh || rc=$?
      fi ;;
    *)
      echo "unknown stage '$stage' (normal, asan, tsan, fuzz)" >&2
      exit 2 ;;
  esac
  [ "$rc" -eq 0 ] || failed+=("$stage")
  cpu_now
  summary+=("$stage $((SECONDS - start))s (cpu $((cpu - cpu_start))s)$([ "$rc" -eq 0 ] || echo ' FAILED')")
done
echo "==== test stages: ${summary[*]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "==== FAILED: ${failed[*]}"
  exit 1
fi
echo "==== all stages passed"
