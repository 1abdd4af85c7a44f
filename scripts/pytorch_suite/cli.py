"""The command line: parses the arguments and runs the suite (list, select, schedule, rerun the differing
tests, report), or re-renders a report, or starts the self-test or a worker."""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import pytorch_suite
from pytorch_suite import ALLOCATORS
from pytorch_suite.report import build_report, compare, environment_meta, render_markdown, write_outputs
from pytorch_suite.scheduler import Chunk, Suite
from pytorch_suite.selection import (DEFAULT_EXCLUSIVE_REGEX, DEFAULT_TESTCUDA_REGEX, TEST_FILES, TESTS_DIR_PLACES,
                                     build_queue, find_tests_dir, make_runs, select_ids)

def main_suite(args) -> int:
    t0 = time.time()
    if args.fake:
        args.tests_dir = Path(tempfile.mkdtemp(prefix="suite_fake_"))
        from pytorch_suite.self_test import FAKE_TEST_FILE  # here: self_test imports this module
        (args.tests_dir / "test_fake_suite.py").write_text(FAKE_TEST_FILE)
    else:
        found = find_tests_dir(args.tests_dir)
        if found is None:
            print(f"pytorch_suite: no folder with PyTorch's {' or '.join(TEST_FILES)} in {TESTS_DIR_PLACES}: "
                  "pass --tests-dir", file=sys.stderr)
            return 2
        args.tests_dir = found
    runs = make_runs(args)
    meta = environment_meta(args, runs)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="pytorch_suite_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"pytorch_suite: tests from {args.tests_dir}, worker files in {work}", flush=True)
    suite = Suite(args, runs, work)

    listed = suite.list_ids(list(runs))
    t_list = time.time() - t0
    selected = {r: select_ids(listed.get(str(spec["file"]), []), spec, args, r) for r, spec in runs.items()}
    for r in runs:
        print(f"pytorch_suite: {r}: {len(listed.get(str(runs[r]['file']), []))} tests listed, "
              f"{len(selected[r])} selected", flush=True)
    meta["torch"] = "?"
    for i in suite.worker_info.get("listing", {}).values():  # the parent never imports torch
        meta["torch"] = i.get("torch", meta["torch"])
    for r, ids in selected.items():
        for alloc in ALLOCATORS:
            table = suite.res("main", r, alloc)
            for tid in ids:
                table.setdefault(tid, {"outcome": "not_run"})
    exclusive_rx = re.compile(args.exclusive_regex) if args.exclusive_regex else None
    queue = build_queue(runs, selected, exclusive_rx)
    t1 = time.time()
    suite.schedule(queue, args.jobs, args.min_start_s)
    t2 = time.time()
    for ch in queue:
        for tid in ch.ids:
            suite.set_outcome(ch, tid, "not_run")
    # Reruns of the differing tests, few workers at a time, while budget is left.
    diffs, _ = compare(suite.results["main"], {})
    rerun_sel: Dict[str, List[str]] = collections.defaultdict(list)
    for d in diffs[: args.rerun_max]:
        if d["kind"] in ("graphalloc fails", "graphalloc passes"):
            rerun_sel[d["run"]].append(d["test"])
    if rerun_sel and args.rerun_jobs > 0 and suite.deadline - time.time() > 2 * args.min_start_s:
        mem_rx = re.compile(r"out of memory|OutOfMemory|mem_get_info|memory_reserved", re.I)
        q2 = collections.deque()
        for run, ids in rerun_sel.items():
            ex = [t for t in ids if (exclusive_rx and exclusive_rx.search(t)) or
                  mem_rx.search(suite.results["main"][run]["graphalloc"].get(t, {}).get("msg", "") +
                                suite.results["main"][run]["native"].get(t, {}).get("msg", ""))]
            rest = [t for t in ids if t not in ex]
            for alloc in ALLOCATORS:
                if ex:
                    q2.append(Chunk(run, alloc, ex, exclusive=True, phase="rerun"))
            for i in range(0, len(rest), args.rerun_chunk):
                for alloc in ALLOCATORS:
                    q2.append(Chunk(run, alloc, rest[i:i + args.rerun_chunk], phase="rerun"))
        suite.schedule(q2, args.rerun_jobs, args.min_start_s)
    t3 = time.time()
    meta["jobs"] = args.jobs
    rep = build_report(meta, runs, selected, suite.results["main"], suite.results["rerun"], suite.worker_info,
                       suite.notes, {"listing": t_list, "main": t2 - t1, "rerun": t3 - t2, "total": t3 - t0})
    write_outputs(Path(args.out), rep, suite.logs)
    print(render_markdown(rep)[:6000], flush=True)
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    if args.fake:
        shutil.rmtree(args.tests_dir, ignore_errors=True)
    return 1 if any(not listed.get(str(spec["file"])) for spec in runs.values()) else 0



def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=pytorch_suite.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/pytorch_suite", help="output folder (3 files)")
    ap.add_argument("--budget-s", type=float, default=420, help="wall-clock budget for everything")
    ap.add_argument("--jobs", type=int, default=10, help="worker processes at once on the GPU")
    ap.add_argument("--test-timeout-s", type=float, default=180, help="per test (the worker is killed)")
    ap.add_argument("--startup-timeout-s", type=float, default=240, help="worker start (imports) limit")
    ap.add_argument("--list-timeout-s", type=float, default=240)
    ap.add_argument("--min-start-s", type=float, default=25,
                    help="start no worker with less budget left than this (it could not import and run a test)")
    ap.add_argument("--runs", default="trees,cuda,cuda_expandable")
    ap.add_argument("--select", action="append", default=[],
                    help="keep tests matching: a class name, a substring of Class.test (unittest -k), or a glob")
    ap.add_argument("--exclude", action="append", default=[], help="drop tests matching (same forms)")
    ap.add_argument("--no-default-filter", action="store_true",
                    help="ignore the runs' class lists and the TestCuda regex")
    ap.add_argument("--limit-per-run", type=int, default=0, help="at most N tests per run, evenly spread")
    ap.add_argument("--resume", metavar="JSON",
                    help="a previous run's pytorch_suite.json: run only the tests it did not run with every "
                         "allocator (the rest of a file that did not fit one budget)")
    ap.add_argument("--cuda-testcuda-regex", default=DEFAULT_TESTCUDA_REGEX)
    ap.add_argument("--exclusive-regex", default=DEFAULT_EXCLUSIVE_REGEX, help="'' turns exclusive runs off")
    ap.add_argument("--trees-graphalloc-conf", default="", help="GRAPHALLOC_CONF for the trees run")
    ap.add_argument("--expandable-graphalloc-conf", default="", help="GRAPHALLOC_CONF for cuda_expandable")
    ap.add_argument("--trees-chunk", type=int, default=6, help="tests per worker start (each compiles)")
    ap.add_argument("--cuda-chunk", type=int, default=25)
    ap.add_argument("--rerun-max", type=int, default=40)
    ap.add_argument("--rerun-jobs", type=int, default=4)
    ap.add_argument("--rerun-chunk", type=int, default=4)
    ap.add_argument("--tests-dir", default=None, help="the folder of PyTorch's test files")
    ap.add_argument("--work-dir", default=None, help="worker logs and events (default: a temporary folder)")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--no-patch", action="store_true", help="do not define names missing in torch.testing")
    ap.add_argument("--render", metavar="JSON", help="write the Markdown of a pytorch_suite.json to stdout")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.resume_report = json.loads(Path(args.resume).read_text()) if args.resume else None
    return args


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        if os.environ.get("GRAPHALLOC_SUITE_FAKE") == "1":
            from pytorch_suite.self_test import fake_worker_env_hook
            fake_worker_env_hook()
        from pytorch_suite.worker import worker_main
        return worker_main()
    args = parse_args()
    if args.render:
        print(render_markdown(json.loads(Path(args.render).read_text())))
        return 0
    if args.self_test:
        os.environ["GRAPHALLOC_SUITE_FAKE"] = "1"
        from pytorch_suite.self_test import self_test
        return self_test()
    if args.fake:
        os.environ["GRAPHALLOC_SUITE_FAKE"] = "1"
    return main_suite(args)


if __name__ == "__main__":
    sys.exit(main())
