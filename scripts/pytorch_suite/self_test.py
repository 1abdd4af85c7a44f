"""The self-test: the scheduler, the worker's event lines and the writers on a fake test file whose tests pass,
fail, crash or hang depending on the allocator; no GPU, no PyTorch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pytorch_suite import SPEC_ENV
from pytorch_suite.cli import main_suite, parse_args
from pytorch_suite.report import OUTCOMES, first_lines
from pytorch_suite.scheduler import RUN_WITH
from pytorch_suite.selection import not_yet_compared


FAKE_TEST_FILE = r'''
import os, time, unittest
GA = "graphalloc" in os.environ.get("GRAPHALLOC_SUITE_FAKE_ALLOC", "")

class TestA(unittest.TestCase):
    def test_pass(self): pass
    def test_fail_on_graphalloc(self):
        if GA: raise RuntimeError("CUDAPluggableAllocator does not yet support snapshot")
    def test_skip(self): self.skipTest("no reason")
    def test_crash_on_graphalloc(self):
        if GA: os._exit(139)
    def test_after_crash(self): pass
    def test_hang_on_native(self):
        if not GA: time.sleep(60)
    def test_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(i, 2 if GA else 5)

class TestBadFixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if GA: raise ValueError("setUpClass broke")
    def test_one(self): pass
    def test_two(self): pass

class TestSlow(unittest.TestCase):
    def test_oom_exclusive(self): pass

if os.environ.get("GRAPHALLOC_SUITE_FAKE_SLOW") == "1":
    for _i in range(10):
        setattr(TestSlow, f"test_slow_{_i}", lambda self: time.sleep(1.5))
'''


def self_test() -> int:
    """Scheduler, parser and writers on a fake test file: no GPU, no PyTorch. Three runs: one with time to spare
    (reruns happen), one whose budget runs out (tests reported as not run), and one that resumes it."""
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        ok = ok and bool(cond)

    outs = []

    def suite_run(extra, slow):
        out = Path(tempfile.mkdtemp(prefix="suite_selftest_out_"))
        outs.append(out)
        os.environ["GRAPHALLOC_SUITE_FAKE_SLOW"] = "1" if slow else "0"
        args = parse_args(["--fake", "--out", str(out), "--jobs", "3", "--test-timeout-s", "3",
                           "--exclusive-regex", "oom", "--rerun-jobs", "2", "--min-start-s", "1"] + extra)
        rc = main_suite(args)
        check(rc == 0, "exit 0")
        return out, json.loads((out / "pytorch_suite.json").read_text())

    out, rep = suite_run(["--runs", "trees,cuda", "--budget-s", "40"], slow=False)
    res = rep["results"]
    for run in ("trees", "cuda"):
        n, g = res[run]["native"], res[run]["graphalloc"]
        check(n["TestA.test_pass"]["outcome"] == "passed" and g["TestA.test_pass"]["outcome"] == "passed",
              f"{run}: pass")
        check(g["TestA.test_fail_on_graphalloc"]["outcome"] == "error", f"{run}: graphalloc error")
        check(g["TestA.test_crash_on_graphalloc"]["outcome"] == "crashed", f"{run}: crash detected")
        check(g["TestA.test_after_crash"]["outcome"] == "passed", f"{run}: rest of the shard requeued after crash")
        check(n["TestA.test_hang_on_native"]["outcome"] == "timeout", f"{run}: timeout")
        check(g["TestA.test_subtests"]["outcome"] == "failed" and n["TestA.test_subtests"]["outcome"] == "passed",
              f"{run}: subtests")
        check(g["TestBadFixture.test_one"]["outcome"] == "error" and "setUpClass broke" in
              g["TestBadFixture.test_one"]["msg"], f"{run}: setUpClass error")
        check(n["TestA.test_skip"]["outcome"] == "skipped", f"{run}: skip")
        check(n["TestSlow.test_oom_exclusive"]["outcome"] == "passed", f"{run}: exclusive test ran")
    kinds = {(d["run"], d["test"]): d for d in rep["differences"]}
    d = kinds.get(("trees", "TestA.test_fail_on_graphalloc"))
    check(d and d["kind"] == "graphalloc fails", "difference listed")
    check(d and d.get("rerun", {}).get("confirmed") is True, "difference rerun and confirmed")
    sigs = {s["signature"]: s["count"] for s in rep["graphalloc_error_signatures"]}
    check(sigs.get("RuntimeError: CUDAPluggableAllocator does not yet support snapshot") == 2, f"signatures {sigs}")
    check(sigs.get("ValueError: setUpClass broke") == 4, "setUpClass signature")
    md = (out / "pytorch_suite.md").read_text()
    check("| trees | test_fake_suite.py | graphalloc |" in md, "markdown table")
    check((out / "pytorch_suite_logs.txt").read_text().count("crashed") >= 2, "crash logs kept")
    print("self-test output (1) in", out, flush=True)

    out, rep = suite_run(["--runs", "trees,cuda", "--budget-s", "12"], slow=True)
    rows = {(r["run"], r["allocator"]): r for r in rep["summary"]}
    check(all(r["selected"] == 20 for r in rows.values()), "20 tests selected per run")
    check(sum(r["not_run"] for r in rows.values()) > 0, "budget ran out: tests reported as not run")
    check(all(sum(r[o] for o in OUTCOMES) == r["selected"] for r in rows.values()), "every test accounted for")
    print("self-test output (2) in", out, flush=True)

    todo = {r: not_yet_compared(rep, r) for r in ("trees", "cuda")}
    out3, rep3 = suite_run(["--runs", "trees,cuda", "--budget-s", "60", "--resume", str(out / "pytorch_suite.json")],
                           slow=True)
    rows3 = {(r["run"], r["allocator"]): r for r in rep3["summary"]}
    check(all(rows3[(r, a)]["selected"] == len(todo[r]) for r in todo for a in ("native", "graphalloc")),
          f"--resume selects only the tests not run with both allocators ({ {r: len(t) for r, t in todo.items()} })")
    check(all(set(rep3["results"][r]["native"]) == todo[r] for r in todo), "--resume: the same tests")
    print("self-test output (3) in", out3, flush=True)

    check(first_lines('Traceback (most recent call last):\n  File "x.py", line 3, in f\n    g()\n'
                      'RuntimeError: boom\nmore text\n') ==
          'RuntimeError: boom\nmore text\n(at File "x.py", line 3, in f)', "first_lines")
    check(first_lines("worker exited with -11 during this test; its output ended:\na\nb\nSegmentation fault")
          .endswith("Segmentation fault"), "first_lines of a crash")
    probe = Path(tempfile.mkdtemp(prefix="suite_selftest_run_with_"))
    outs.append(probe)
    (probe / "probe.py").write_text("import json, sys; print(json.dumps([sys.argv, sys.path[0]]))\n")
    ran = subprocess.run([sys.executable, str(RUN_WITH), "native", str(probe / "probe.py"), "-k", "x"],
                         capture_output=True, text=True, cwd=tempfile.gettempdir())
    expected = json.dumps([[str(probe / "probe.py"), "-k", "x"], str(probe)])
    ran_ok = ran.returncode == 0 and ran.stdout.strip() == expected
    check(ran_ok, "run_with.py native: the file runs with its arguments, its folder first on sys.path" +
          ("" if ran_ok else f" (got {ran.stdout!r} {ran.stderr[-2000:]!r})"))
    if ok:  # a failed self-test keeps its output folders, to look at
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
    return 0 if ok else 1


def fake_worker_env_hook() -> None:
    os.environ["GRAPHALLOC_SUITE_FAKE_ALLOC"] = json.loads(Path(os.environ[SPEC_ENV]).read_text())["allocator"]


