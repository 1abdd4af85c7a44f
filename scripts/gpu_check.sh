#!/usr/bin/env bash
# What a change that touches real CUDA behaviour must pass on a GPU machine, in one command: a Release build
# with warnings as errors, then every `gpu` test of one device (the device tests, the soak, PyTorch's
# backend and graphed-callables tests), each label's log and summary in OUT_DIR.
#
#   scripts/gpu_check.sh BUILD_DIR OUT_DIR [PYTORCH_TESTS_DIR]
#
# PYTORCH_TESTS_DIR holds PyTorch's own test files (test_cuda.py, test_cudagraph_trees.py; not part of
# this repository): the tests that run PyTorch's make_graphed_callables tests against ours read them, and
# skip without them. Dependencies: scripts/gpu_deps.sh on a machine without a package registry, else the
# system's. Two-GPU tests (label multigpu, tests/multigpu) are not run here: `ctest -L multigpu` on two GPUs.
set -uo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR [PYTORCH_TESTS_DIR]" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
build=$1 out=$2
mkdir -p "$out"
[[ $# -ge 3 ]] && export PYTORCH_TESTS_DIR=$3
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared machines
deps=()
[[ -d .gpu/deps ]] && read -r -a deps <<< "$(scripts/gpu_deps.sh .gpu/deps)"
start=$SECONDS
if ! { cmake -S . -B "$build" -G Ninja "${deps[@]}" -DCMAKE_BUILD_TYPE=Release -DGRAPHALLOC_WERROR=ON \
         > "$out/configure.log" 2>&1 &&
       cmake --build "$build" -j "$(nproc)" -- -k 0 > "$out/build.log" 2>&1; }; then
  grep -E "error|FAILED" -A5 "$out/configure.log" "$out/build.log" | head -60
  exit 1
fi
echo "build: $((SECONDS - start)) s"
rc=0
for label in device torch; do
  if [[ $label == device ]]; then selection=(-L gpu -LE "multigpu|torch"); else selection=(-L torch -LE multigpu); fi
  ctest --test-dir "$build" "${selection[@]}" -j 8 --output-on-failure > "$out/ctest_$label.log" 2>&1 || rc=1
  echo "$label: $(grep -E 'tests passed' "$out/ctest_$label.log") ($((SECONDS - start)) s)"
  grep -E "\((Failed|Timeout)\)|Not Run" "$out/ctest_$label.log"
done
exit "$rc"
