"""Which tests run: the runs (test file, classes, environment per allocator), the tests selected from each
file's listing, their chunks in the order the scheduler takes them, and where the test files are."""
from __future__ import annotations

import collections
import fnmatch
import os
import re
from pathlib import Path
from typing import Dict, List, Optional

from pytorch_suite import ALLOCATORS, REPO
from pytorch_suite.scheduler import Chunk

# TestCuda is mostly not about memory: by default only its allocator / graph / stream tests.
DEFAULT_TESTCUDA_REGEX = (r"memory|alloc|graph|record_stream|oom|caching|fraction|empty_cache|snapshot|mempool|"
                          r"workspace|streaming_backwards|lazy_init")
# Tests that measure device memory (other workers would disturb them): run first, one worker at a time.
DEFAULT_EXCLUSIVE_REGEX = (r"out_of_memory|oom|memory_fraction|per_process_memory|limited_memory|large_tensor|"
                           r"huge|cublas_workspace_memory|max_split_expandable|garbage_collect_expandable|"
                           r"allocator_fuzz|mem_get_info|device_memory_used")

# A folder holding one of them is taken for the folder of PyTorch's test files.
TEST_FILES = ("test_cudagraph_trees.py", "test_cuda.py")
TESTS_DIR_PLACES = "--tests-dir, $PYTORCH_TESTS_DIR, ./.pytorch-tests, ./shared/pytorch-tests, ../shared/pytorch-tests"


def find_tests_dir(explicit: Optional[str]) -> Optional[Path]:
    """The first of TESTS_DIR_PLACES that holds one of TEST_FILES."""
    cands = [explicit, os.environ.get("PYTORCH_TESTS_DIR"), REPO / ".pytorch-tests", REPO / "shared" / "pytorch-tests",
             REPO.parent / "shared" / "pytorch-tests"]
    for c in cands:
        if c and any((Path(c) / name).is_file() for name in TEST_FILES):
            return Path(c).resolve()
    return None


def not_yet_compared(previous: dict, run: str) -> Optional[set]:
    """The tests of `run` that some allocator did not run in a previous report (its pytorch_suite.json), or
    None when that report has no such run (then every test is still to be compared)."""
    per_allocator = previous.get("results", {}).get(run)
    if not per_allocator:
        return None
    ran = [{t for t, r in tests.items() if r.get("outcome") != "not_run"} for tests in per_allocator.values()]
    listed = set().union(*(tests.keys() for tests in per_allocator.values()))
    return listed - set.intersection(*ran) if ran else listed


def select_ids(ids: List[str], run_spec: dict, args, run: str = "") -> List[str]:
    def match(tid: str, pat: str) -> bool:
        cls = tid.split(".")[0]
        if pat == cls:
            return True
        if any(ch in pat for ch in "*?["):
            return fnmatch.fnmatchcase(tid, pat) or fnmatch.fnmatchcase(tid, f"*{pat}*")
        return pat in tid

    out = []
    for tid in ids:
        cls = tid.split(".")[0]
        if not args.no_default_filter:
            classes = run_spec.get("classes")
            if classes is not None and cls not in classes:
                continue
            rx = run_spec.get("class_regex", {}).get(cls)
            if rx and not re.search(rx, tid.split(".", 1)[1]):
                continue
        if args.select and not any(match(tid, p) for p in args.select):
            continue
        if args.exclude and any(match(tid, p) for p in args.exclude):
            continue
        if args.resume_report is not None:
            todo = not_yet_compared(args.resume_report, run)
            if todo is not None and tid not in todo:
                continue
        out.append(tid)
    if args.limit_per_run and len(out) > args.limit_per_run:
        step = len(out) / args.limit_per_run  # evenly spread, deterministic
        out = [out[int(i * step)] for i in range(args.limit_per_run)]
    return out


def make_runs(args) -> Dict[str, dict]:
    td = args.tests_dir
    cuda_classes = ["TestCuda", "TestCudaMallocAsync", "TestBlockStateAbsorption", "TestMemPool"]
    cuda_sel = (f"classes {', '.join(cuda_classes)}; TestCuda tests matching /{args.cuda_testcuda_regex}/")
    all_runs = {
        "trees": {"file": td / "test_cudagraph_trees.py", "classes": None, "chunk": args.trees_chunk,
                  "native_env": {}, "graphalloc_env": {"GRAPHALLOC_CONF": args.trees_graphalloc_conf},
                  "selection": "every class"},
        "cuda": {"file": td / "test_cuda.py", "classes": cuda_classes, "chunk": args.cuda_chunk,
                 "class_regex": {"TestCuda": args.cuda_testcuda_regex},
                 "native_env": {}, "graphalloc_env": {"GRAPHALLOC_CONF": "expandable_segments:False"},
                 "selection": cuda_sel},
        "cuda_expandable": {"file": td / "test_cuda.py", "classes": cuda_classes, "chunk": args.cuda_chunk,
                            "class_regex": {"TestCuda": args.cuda_testcuda_regex},
                            "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                            "native_env": {}, "graphalloc_env": {"GRAPHALLOC_CONF": args.expandable_graphalloc_conf},
                            "selection": cuda_sel},
    }
    if args.fake:
        for spec in all_runs.values():
            spec.update({"file": td / "test_fake_suite.py", "classes": None, "class_regex": {}, "chunk": 3})
    runs = {}
    for name in [r for r in args.runs.split(",") if r]:
        if name not in all_runs:
            raise SystemExit(f"unknown run {name!r}: choose from {', '.join(all_runs)}")
        runs[name] = all_runs[name]
    for spec in runs.values():
        for k in ("graphalloc_env", "native_env", "env"):
            if k in spec:
                spec[k] = {kk: vv for kk, vv in spec[k].items() if vv not in (None, "")}
    return runs


def build_queue(runs, selected: Dict[str, List[str]], exclusive_rx: Optional[re.Pattern], phase="main",
                chunk_override: Optional[int] = None) -> collections.deque:
    excl: List[Chunk] = []
    per_run: Dict[str, List[List[str]]] = {}
    for run, ids in selected.items():
        normal = [t for t in ids if not (exclusive_rx and exclusive_rx.search(t))]
        special = [t for t in ids if exclusive_rx and exclusive_rx.search(t)]
        for alloc in ALLOCATORS:
            if special:
                excl.append(Chunk(run, alloc, special, exclusive=True, phase=phase))
        size = max(1, chunk_override or runs[run]["chunk"])
        per_run[run] = [normal[i:i + size] for i in range(0, len(normal), size)]
    q = collections.deque(excl)
    i = 0
    while any(i < len(c) for c in per_run.values()):
        for run, chunks in per_run.items():  # round robin over runs, native and graphalloc side by side
            if i < len(chunks):
                for alloc in ALLOCATORS:
                    q.append(Chunk(run, alloc, chunks[i], phase=phase))
        i += 1
    return q


