"""Runs PyTorch's own allocator / CUDA graph / graph-tree test files with PyTorch's native allocator and with
graphalloc side by side, many worker processes at once on one GPU, within a wall-clock budget, and writes
per file and per allocator passed / failed / errors / skipped / timeout / crashed / not run, plus every test
whose outcome differs between the two (with the first lines of graphalloc's error), as JSON and Markdown.

    PYTHONPATH=python GRAPHALLOC_LIBRARY=/tmp/b/libgraphalloc.so \\
        python3 scripts/pytorch_suite.py --out OUT --budget-s 420 [--jobs 10] [--runs trees,cuda,cuda_expandable]
        [--select CudaGraphTreeTests --select 'TestMemPool.*' --exclude 'test_*large*'] [--limit-per-run 40]
        [--resume PREVIOUS/pytorch_suite.json]   # only what that run had no time for, with either allocator

    python3 scripts/pytorch_suite.py --self-test      # no GPU, no PyTorch: the scheduler and writers on fakes
    python3 scripts/pytorch_suite.py --render OUT/pytorch_suite.json   # Markdown again from the JSON

Runs (--runs):
  trees            test_cudagraph_trees.py, every test class; native default vs graphalloc's default
                   (expandable segments; --trees-graphalloc-conf to change)
  cuda             test_cuda.py: TestCuda's allocator / CUDA graph / stream tests (--cuda-testcuda-regex),
                   TestCudaMallocAsync (snapshots, settings, OOM, raw alloc), TestBlockStateAbsorption,
                   TestMemPool; native default vs graphalloc with GRAPHALLOC_CONF=expandable_segments:False
  cuda_expandable  the same tests with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for both (native uses
                   it; for graphalloc it only sets common_utils.EXPANDABLE_SEGMENTS, which un-skips the
                   expandable-only tests) and graphalloc's default configuration (expandable)

Each worker goes through scripts/pytorch_suite/run_with.py (which calls graphalloc.torch.install() before the
test file imports torch; stubs/ beside it stands in for the expecttest package), loads the test file as a
module (after defining the names this PyTorch's torch.testing._internal modules lack, e.g.
TEST_CUDAMALLOCASYNC on 2.11: listed in the report), and runs its shard of test ids with unittest, one JSON
line per test event into a file the scheduler reads. The scheduler kills a worker whose test runs past
--test-timeout-s (the test: "timeout"), restarts the rest of its shard, marks the test a crashed worker was in
as "crashed", and at the end of the budget kills what runs and reports every test not run as "not run". Tests
whose names match --exclusive-regex (out of memory, memory fraction, mem_get_info users: they measure device
memory other processes would disturb) run first, one worker at a time. Tests whose outcome differs are run
again, alone-ish (--rerun-jobs workers), while budget is left. pytest is not needed (its presence is reported
only).

Output (--out): pytorch_suite.json, pytorch_suite.md, pytorch_suite_logs.txt (tails of crashed / timed-out /
failed-to-start workers). PyTorch's test files are not part of the repository: the folder that holds them
(test_cudagraph_trees.py, test_cuda.py; nothing else is needed there) is looked up in --tests-dir,
$PYTORCH_TESTS_DIR, ./.pytorch-tests, ./shared/pytorch-tests, ../shared/pytorch-tests (on the GPU machine only
the checkout travels: copy the test files of ../shared/pytorch-tests into an ignored folder of the checkout
and carry it).
"""
# The code: worker.py runs inside a test process, scheduler.py starts and watches those processes,
# selection.py says which tests run, report.py compares and writes, cli.py ties them together,
# self_test.py checks them on a fake test file; run_with.py is the launcher every worker starts with.
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
ALLOCATORS = ("native", "graphalloc")
# The worker's instructions (test file, ids, events file) travel in a JSON file this variable names.
SPEC_ENV = "GRAPHALLOC_SUITE_WORKER_SPEC"
