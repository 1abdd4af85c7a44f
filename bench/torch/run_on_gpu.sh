#!/usr/bin/env bash
# On the GPU machine (README, "Testing"), from the project root: builds libgraphalloc.so and the
# CLI, runs the PyTorch tests (ctest -L torch) and/or the allocator comparison. Results under ${OUT:-out}.
#   bench/torch/run_on_gpu.sh [tests] [bench] [probe]
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
B=${BUILD_DIR:-/tmp/b}
t0=$(date +%s)
if [[ ! -f $B/libgraphalloc.so || ! -x $B/tools/graphalloc ]]; then
  cmake -S . -B "$B" -G Ninja $(.gpu/setup.sh) -DCMAKE_BUILD_TYPE=Release -DGRAPHALLOC_BUILD_BENCHMARKS=OFF \
      > "$OUT/build.log" 2>&1 &&
    cmake --build "$B" -j16 --target graphalloc_shared graphalloc_cli >> "$OUT/build.log" 2>&1 ||
    { tail -50 "$OUT/build.log"; exit 1; }
fi
echo "build done in $(( $(date +%s) - t0 )) s"
export GRAPHALLOC_LIBRARY=$B/libgraphalloc.so GRAPHALLOC_CLI=$B/tools/graphalloc PYTHONPATH=$PWD/python
export PYTHONUNBUFFERED=1
for what in "${@:-tests}"; do
  case $what in
    tests)
      GRAPHALLOC_TEST_OUT=/tmp/torch_test_out ctest --test-dir "$B" -L torch --output-on-failure \
          --timeout 300 -V > "$OUT/ctest_torch.log" 2>&1
      grep -E "Test +#|tests passed|OUTCOME|losses identical|SKIP" "$OUT/ctest_torch.log"
      for f in snapshot_test/train_snapshot.svg interop_import/torch_training.svg; do
        [[ -f /tmp/torch_test_out/$f ]] && cp "/tmp/torch_test_out/$f" "$OUT/"
      done ;;
    diag)
      # libgraphalloc.so's dlopen mode against a cuDNN training step (RTLD_GLOBAL segfaulted in cuDNN).
      for mode in global local deepbind; do
        echo "== GRAPHALLOC_DLOPEN=$mode" | tee -a "$OUT/diag.log"
        GRAPHALLOC_DLOPEN=$mode timeout 120 python3 -X faulthandler tests/torch/train_worker.py \
            --allocator graphalloc --steps 2 >> "$OUT/diag.log" 2>&1
        echo "exit $?" | tee -a "$OUT/diag.log"
      done ;;
    probe)
      python3 tests/torch/graph_probe.py 2>&1 | tee "$OUT/graph_probe.log" ;;
    bench)
      python3 bench/torch/compare_allocators.py -o "$OUT/results.md" --json "$OUT/results.json" \
          --min-capacity ${BENCH_ARGS:-} 2> "$OUT/bench.log"; tail -30 "$OUT/bench.log" ;;
  esac
  echo "[$what] done at $(( $(date +%s) - t0 )) s"
done
