#!/usr/bin/env bash
# One bounded GPU batch, after building (README, "Testing": the GPU machine), from the project root:
#
#   bash bench/torch/gpu_batch.sh BUILD_DIR OUT_DIR
#
# Stages, each bounded by `timeout` and a share of BATCH_BUDGET_S (default 540 s: one device call is at most
# 600 s), in this order:
#   ctest  ctest -L gpu -LE torch (graphalloc's own tests on the GPU, 4 at a time; the soak alone after)
#   torch  ctest -L torch (the PyTorch tests, tests/torch, incl. backend_*_test.py; 4 at a time)
#   suite  scripts/pytorch_suite.py: PyTorch's own test files, native vs graphalloc (needs the pytorch-tests
#          folder inside the checkout: .pytorch-tests/ or shared/pytorch-tests/, or PYTORCH_TESTS_DIR)
#   bench  bench/torch/compare_allocators.py (micro rows backend / pluggable / native, eager and
#          reduce-overhead training rows)
#   ab     bench/run_before_after.sh BEFORE_BUILD BUILD_DIR (3 rounds; BEFORE_BUILD: another build's
#          directory with bench/allocator_bench, e.g. of the commit before a change); its JSON as ab.tgz
# Environment: STAGES="ctest torch suite bench" (any subset, in any order: they run in the order above),
# BATCH_BUDGET_S, SUITE_ARGS / BENCH_ARGS (extra arguments), SUITE_JOBS (10).
# Stage shares of the budget (of the stages selected): ctest 75, torch 165, suite 180, bench 150, ab 90.
# Two calls give each stage more room: STAGES="ctest torch suite" then STAGES=bench (each call 540 s).
#
# Files in OUT_DIR (8 at most): batch_summary.md, ctest.log, pytorch_suite.{json,md}, pytorch_suite_logs.txt,
# results.{md,json}, batch.log (everything the stages printed, the comparison's stderr included); with ab,
# ab.tgz and ab_summary.md instead of pytorch_suite_logs.txt's place in the count (run ab with few others).
set -uo pipefail
B=${1:?usage: gpu_batch.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: gpu_batch.sh BUILD_DIR OUT_DIR}
B=$(cd "$B" && pwd) || { echo "no build dir $1"; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
STAGES=${STAGES:-ctest torch suite bench}
BUDGET=${BATCH_BUDGET_S:-540}
T0=$(date +%s)
LOG=$OUT/batch.log
SUMMARY=$OUT/batch_summary.md
: > "$LOG"
: > "$OUT/ctest.log"

declare -A WEIGHT=([ctest]=75 [torch]=165 [suite]=180 [bench]=150 [ab]=90)
total_w=0
for s in $STAGES; do total_w=$(( total_w + ${WEIGHT[$s]:-0} )); done
(( total_w > 0 )) || { echo "STAGES=$STAGES names no stage"; exit 2; }

say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
# A stage's budget: its share of what is left, computed when it starts, so that an early finish helps later stages.
left_w=$total_w
stage_budget() {
  local w=${WEIGHT[$1]} left=$(( BUDGET - ($(date +%s) - T0) ))
  local b=$(( left * w / left_w ))
  left_w=$(( left_w - w ))
  (( b < 10 )) && b=10
  echo "$b"
}
has() { [[ " $STAGES " == *" $1 "* ]]; }

export GRAPHALLOC_LIBRARY=$B/libgraphalloc.so
export GRAPHALLOC_CLI=$B/tools/graphalloc
SHIM=$(find "$B" -name libgraphalloc_torch.so -print -quit 2>/dev/null)
[[ -n $SHIM ]] && export GRAPHALLOC_TORCH_SHIM=$SHIM
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export GRAPHALLOC_TEST_OUT=${GRAPHALLOC_TEST_OUT:-/tmp/gpu_batch_test_out}

{
  echo "# GPU batch $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes'); build $B; stages: $STAGES; budget ${BUDGET} s"
  echo "- $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  echo "- $(python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
  echo "- libgraphalloc_torch.so: ${SHIM:-not built}"
  echo "- backend: $(timeout 120 python3 -c '
import graphalloc.torch as gat
gat.install()
import torch
torch.cuda.init()
print(getattr(gat, "backend", lambda: "pluggable (no backend())")(), "|", gat.hooks().get("backend", "(no backend entry)"), "| get_allocator_backend:", torch.cuda.get_allocator_backend())
' 2>&1 | tail -1)"
  echo
} > "$SUMMARY"

# ctest_summary LOG LABEL: passed / failed / not run from a ctest -V log; the failed tests by name.
ctest_summary() {
  local log=$1 label=$2
  python3 - "$log" "$label" <<'EOF' >> "$SUMMARY"
import re, sys
log, label = sys.argv[1], sys.argv[2]
text = open(log, errors="replace").read()
# Only the part of the log for this label: it starts at a line "=== <label>".
part = text.split(f"=== {label}\n", 1)[-1].split("\n=== ", 1)[0]
res = re.findall(r"Test +#\d+: (\S+) \.+\**\s*(Passed|\*\*\*Failed|Failed|\*\*\*Skipped|Skipped|\*\*\*Timeout|Timeout|\*\*\*Exception[^\n]*|Not Run[^\n]*)", part)
listed = re.findall(r"^\s*Test +#\d+: (\S+)$", part, re.M)
done = {n for n, _ in res}
out = {}
for n, st in res:
    st = st.strip("*")
    out.setdefault(st.split(":")[0].split()[0], []).append(n)
not_run = [n for n in listed if n not in done]
print(f"## {label}\n")
print(", ".join(f"{k}: {len(v)}" for k, v in sorted(out.items())) + (f", not run (time): {len(not_run)}" if not_run else ""))
for k, v in sorted(out.items()):
    if k not in ("Passed", "Skipped"):
        print(f"- {k}: {', '.join(v)}")
    if k == "Skipped":
        print(f"- skipped: {', '.join(v)}")
if not_run:
    print(f"- not run: {', '.join(not_run[:40])}")
if not res:
    print("(no test result in the log: see ctest.log)")
print()
EOF
}

# run_ctest LABEL BUDGET ARGS...: one ctest run under `timeout`, its output appended to ctest.log.
run_ctest() {
  local label=$1 budget=$2; shift 2
  {
    echo "=== $label"
    echo "--- listing"
    ctest --test-dir "$B" -N "$@" | sed -n 's/^ *Test *#[0-9]*: /  Test #0: /p'
    echo "--- run (budget ${budget} s)"
  } >> "$OUT/ctest.log"
  timeout -k 10 "$budget" ctest --test-dir "$B" --output-on-failure -V "$@" >> "$OUT/ctest.log" 2>&1
  local rc=$?
  (( rc == 124 || rc == 137 )) && echo "(ctest stopped by the stage budget of ${budget} s)" >> "$OUT/ctest.log"
  return $rc
}

if has ctest; then
  b=$(stage_budget ctest)
  say "ctest -L gpu -LE torch (budget ${b} s)"
  soak=$(ctest --test-dir "$B" -N -L gpu -LE torch | grep -o 'trace_soak[A-Za-z0-9_]*' | sort -u | paste -sd'|')
  run_ctest gpu "$(( b * 2 / 3 ))" -L gpu -LE torch ${soak:+-E "$soak"} -j4 --timeout 120
  say "ctest gpu rc=$?"
  if [[ -n $soak ]]; then
    run_ctest soak "$(( b / 3 ))" -L gpu -R "$soak" --timeout "$(( b / 3 ))"
    say "ctest soak rc=$?"
    ctest_summary "$OUT/ctest.log" soak
  fi
  ctest_summary "$OUT/ctest.log" gpu
fi

if has torch; then
  b=$(stage_budget torch)
  say "ctest -L torch (budget ${b} s)"
  run_ctest torch "$b" -L torch -j4 --timeout "$b"
  say "ctest torch rc=$?"
  ctest_summary "$OUT/ctest.log" torch
  grep -E "OUTCOME|losses identical|SKIP:|OOM message|IPC:|backend:|bit for bit" "$OUT/ctest.log" | head -60 >> "$LOG"
fi

if has suite; then
  b=$(stage_budget suite)
  say "scripts/pytorch_suite.py (budget ${b} s)"
  timeout -k 15 "$(( b + 30 ))" python3 scripts/pytorch_suite.py --out "$OUT" --budget-s "$b" \
      --jobs "${SUITE_JOBS:-10}" --test-timeout-s 150 --startup-timeout-s 150 ${SUITE_ARGS:-} >> "$LOG" 2>&1
  rc=$?
  say "pytorch_suite rc=$rc"
  if [[ -f $OUT/pytorch_suite.md ]]; then
    { sed -n '/^## Outcomes/,/^## Tests whose/p' "$OUT/pytorch_suite.md" | head -20; echo; } >> "$SUMMARY"
    grep -m1 "^## Tests whose" "$OUT/pytorch_suite.md" >> "$SUMMARY"
    echo >> "$SUMMARY"
  else
    echo "## pytorch_suite: no output (rc $rc; see batch.log)" >> "$SUMMARY"
  fi
fi

if has bench; then
  b=$(stage_budget bench)
  say "bench/torch/compare_allocators.py (budget ${b} s)"
  timeout -k 15 "$(( b + 60 ))" python3 bench/torch/compare_allocators.py -o "$OUT/results.md" \
      --json "$OUT/results.json" --budget-s "$b" --no-traces --micro-reps 5 --hit-iters 5000 \
      --churn-ops 5000 --steps 5 --warmup 2 ${BENCH_ARGS:-} >> "$LOG" 2>&1
  say "compare_allocators rc=$?"
  [[ -f $OUT/results.md ]] && { echo "## compare_allocators"; echo; grep '^|' "$OUT/results.md"; echo; } >> "$SUMMARY"
fi

if has ab; then
  b=$(stage_budget ab)
  if [[ -z ${BEFORE_BUILD:-} || ! -x ${BEFORE_BUILD}/bench/allocator_bench ]]; then
    say "ab: BEFORE_BUILD (a build with bench/allocator_bench) not set or not built; skipped"
  else
    say "bench/run_before_after.sh (budget ${b} s)"
    timeout -k 10 "$b" bash bench/run_before_after.sh "$BEFORE_BUILD" "$B" "$OUT/ab" 3 >> "$LOG" 2>&1
    say "before/after rc=$?"
    # A round cut by the budget leaves a partial JSON: the table skips it and says so.
    python3 bench/before_after_table.py "$OUT/ab" --json "$OUT/ab/before_after.json" > "$OUT/ab_summary.md" 2>> "$LOG"
    { echo "## before / after"; echo; cat "$OUT/ab_summary.md"; echo; } >> "$SUMMARY"
    (cd "$OUT" && tar czf ab.tgz ab && rm -rf ab)
  fi
fi

say "done in $(( $(date +%s) - T0 )) s"
echo "- wall: $(( $(date +%s) - T0 )) s" >> "$SUMMARY"
cat "$SUMMARY"
