#!/usr/bin/env python3
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

Each worker goes through ../shared/pytorch-tests/run_with.py (which calls graphalloc.torch.install() before
the test file imports torch), loads the test file as a module (after defining the names this PyTorch's
torch.testing._internal modules lack, e.g. TEST_CUDAMALLOCASYNC on 2.11: listed in the report), and runs
its shard of test ids with unittest, one JSON line per test event into a file the scheduler reads. The
scheduler kills a worker whose test runs past --test-timeout-s (the test: "timeout"), restarts the rest of
its shard, marks the test a crashed worker was in as "crashed", and at the end of the budget kills what runs
and reports every test not run as "not run". Tests whose names match --exclusive-regex (out of memory,
memory fraction, mem_get_info users: they measure device memory other processes would disturb) run first,
one worker at a time. Tests whose outcome differs are run again, alone-ish (--rerun-jobs workers), while
budget is left. pytest is not needed (its presence is reported only).

Output (--out): pytorch_suite.json, pytorch_suite.md, pytorch_suite_logs.txt (tails of crashed / timed-out /
failed-to-start workers). The pytorch-tests folder is looked up in --tests-dir, $PYTORCH_TESTS_DIR,
./.pytorch-tests, ./shared/pytorch-tests, ../shared/pytorch-tests (on the GPU machine only the checkout
travels: copy ../shared/pytorch-tests into an ignored folder of the checkout and carry it).
"""
from __future__ import annotations

import argparse
import ast
import collections
import datetime
import fnmatch
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SPEC_ENV = "GRAPHALLOC_SUITE_WORKER_SPEC"
ALLOCATORS = ("native", "graphalloc")

# TestCuda is mostly not about memory: by default only its allocator / graph / stream tests.
DEFAULT_TESTCUDA_REGEX = (r"memory|alloc|graph|record_stream|oom|caching|fraction|empty_cache|snapshot|mempool|"
                          r"workspace|streaming_backwards|lazy_init")
# Tests that measure device memory (other workers would disturb them): run first, one worker at a time.
DEFAULT_EXCLUSIVE_REGEX = (r"out_of_memory|oom|memory_fraction|per_process_memory|limited_memory|large_tensor|"
                           r"huge|cublas_workspace_memory|max_split_expandable|garbage_collect_expandable|"
                           r"allocator_fuzz|mem_get_info|device_memory_used")

OUTCOMES = ("passed", "failed", "error", "skipped", "timeout", "crashed", "not_run")
BAD = ("failed", "error", "timeout", "crashed")


# ==================================================================================================== worker

def _emit(fh, **event) -> None:
    event.setdefault("t", time.time())
    fh.write(json.dumps(event, default=str) + "\n")
    fh.flush()


def _passthrough(*args, **kwargs):
    """Stands for a missing decorator or decorator factory: returns the function unchanged."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


def _default_for(name: str):
    if name == "TEST_CUDAMALLOCASYNC":
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
        return "backend:cudaMallocAsync" in conf
    if name.isupper() or name.startswith(("TEST_", "IS_", "PLATFORM_", "SM")):
        return False  # a capability flag: off
    if name[:1].islower():
        return _passthrough  # a function: most likely a decorator (factory)
    return None


def patch_missing_imports(path: str) -> List[str]:
    """Defines, in torch.testing._internal.* modules, the names that `path` imports from them and this
    PyTorch lacks (the test files are newer or older than the installed PyTorch). Returns what was defined."""
    import importlib
    patched = []
    tree = ast.parse(Path(path).read_text(), filename=path)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and
                node.module.startswith("torch.testing._internal")):
            continue
        try:
            mod = importlib.import_module(node.module)
        except Exception as e:  # noqa: BLE001 - the file's own import will report it
            patched.append(f"{node.module}: cannot import ({type(e).__name__}: {e})")
            continue
        for alias in node.names:
            if alias.name != "*" and not hasattr(mod, alias.name):
                value = _default_for(alias.name)
                setattr(mod, alias.name, value)
                shown = "passthrough decorator" if value is _passthrough else repr(value)
                patched.append(f"{node.module}.{alias.name} = {shown}")
    return patched


def _flatten(suite) -> list:
    out = []
    for t in suite:
        if hasattr(t, "__iter__") and not hasattr(t, "_testMethodName"):
            out.extend(_flatten(t))
        else:
            out.append(t)
    return out


def _short_id(test) -> str:
    parts = test.id().split(".")
    return ".".join(parts[-2:])


def _fmt_err(err) -> str:
    return "".join(traceback.format_exception(*err))[-8000:]


def worker_main() -> int:
    """Runs inside run_with.py (graphalloc installed already, or not): spec from $GRAPHALLOC_SUITE_WORKER_SPEC."""
    import importlib.util
    import unittest

    spec = json.loads(Path(os.environ[SPEC_ENV]).read_text())
    fh = open(spec["events"], "a", buffering=1)
    info: Dict[str, Any] = {"pid": os.getpid(), "allocator": spec.get("allocator")}
    try:
        if spec.get("allocator") == "graphalloc":
            import graphalloc.torch as gat
        if spec.get("allocator") == "graphalloc" and gat.is_installed():
            h = gat.hooks()
            info["backend"] = h.get("backend", "(no 'backend' in hooks(): the pluggable glue)")
            if hasattr(gat, "backend"):
                info["backend_kind"] = gat.backend()
    except Exception as e:  # noqa: BLE001 - native runs may not find graphalloc at all
        info["graphalloc_import"] = f"{type(e).__name__}: {e}"[:200]
    test_file = spec["file"]
    sys.argv = [test_file]  # PyTorch's common_utils parses sys.argv at import
    sys.path.insert(0, str(Path(test_file).parent))
    try:
        info["patched"] = patch_missing_imports(test_file) if spec.get("patch", True) else []
        mod_spec = importlib.util.spec_from_file_location(spec["module"], test_file)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[spec["module"]] = module
        mod_spec.loader.exec_module(module)
    except unittest.SkipTest as e:
        _emit(fh, ev="import_skip", msg=str(e), info=info)
        return 0
    except BaseException:  # noqa: BLE001
        _emit(fh, ev="import_error", msg=traceback.format_exc()[-6000:], info=info)
        return 3
    try:
        import torch
        info["torch"] = torch.__version__
        if spec.get("allocator") and torch.cuda.is_available():
            try:
                info["allocator_backend"] = torch.cuda.get_allocator_backend()
            except Exception as e:  # noqa: BLE001
                info["allocator_backend"] = f"({type(e).__name__}: {e})"[:200]
    except Exception:  # noqa: BLE001
        pass
    _emit(fh, ev="info", info=info)
    loader = unittest.TestLoader()
    if spec.get("list"):
        ids = sorted({_short_id(t) for t in _flatten(loader.loadTestsFromModule(module))
                      if hasattr(t, "_testMethodName") and type(t).__name__ != "_FailedTest"})
        _emit(fh, ev="list", ids=ids)
        return 0

    tests = []
    for tid in spec["ids"]:
        try:
            tests.extend(_flatten(loader.loadTestsFromName(tid, module)))
        except Exception:  # noqa: BLE001
            _emit(fh, ev="start", id=tid)
            _emit(fh, ev="outcome", id=tid, outcome="error", msg="cannot load: " + traceback.format_exc()[-3000:])
            _emit(fh, ev="stop", id=tid)

    class EventResult(unittest.TestResult):
        def startTest(self, test):
            super().startTest(test)
            _emit(fh, ev="start", id=_short_id(test))

        def stopTest(self, test):
            super().stopTest(test)
            _emit(fh, ev="stop", id=_short_id(test))

        def _out(self, test, outcome, msg=""):
            if hasattr(test, "_testMethodName") and test.id() != "unittest.case._SubTest":
                _emit(fh, ev="outcome", id=_short_id(test), outcome=outcome, msg=msg)
            else:  # setUpClass / tearDownClass / module fixtures: an _ErrorHolder
                _emit(fh, ev="fixture_error", desc=str(getattr(test, "description", test)), outcome=outcome,
                      msg=msg)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._out(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._out(test, "failed", _fmt_err(err))

        def addError(self, test, err):
            super().addError(test, err)
            self._out(test, "error", _fmt_err(err))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._out(test, "skipped", str(reason))

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._out(test, "passed", "expected failure")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._out(test, "failed", "unexpected success (the test is marked expectedFailure)")

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                failed = issubclass(err[0], test.failureException)
                _emit(fh, ev="outcome", id=_short_id(test), outcome="failed" if failed else "error",
                      msg=f"subtest {subtest._subDescription()}: " + _fmt_err(err))

    result = EventResult()
    unittest.TestSuite(tests).run(result)
    _emit(fh, ev="done", stopped=bool(result.shouldStop))
    fh.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (CUDA / inductor atexit work can hang or crash)


# ================================================================================================= scheduler

class Chunk:
    def __init__(self, run: str, allocator: str, ids: List[str], exclusive: bool = False, phase: str = "main",
                 attempt: int = 0):
        self.run, self.allocator, self.ids = run, allocator, list(ids)
        self.exclusive, self.phase, self.attempt = exclusive, phase, attempt


class Job:
    def __init__(self, chunk: Chunk, proc, events: Path, log: Path, spec_path: Path):
        self.chunk, self.proc, self.events, self.log, self.spec_path = chunk, proc, events, log, spec_path
        self.offset = 0
        self.buffer = ""
        self.started_at = time.time()
        self.current: Optional[str] = None
        self.current_since = 0.0
        self.seen_start: set = set()
        self.stopped: set = set()
        self.last_event = time.time()
        self.got_info = False


class Suite:
    """Schedules chunks of test ids onto worker processes and collects their events."""

    def __init__(self, args, runs: Dict[str, dict], work: Path):
        self.args, self.runs, self.work = args, runs, work
        self.deadline = time.time() + args.budget_s
        self.t0 = time.time()
        # results[phase][run][allocator][test id] = {"outcome":..., "msg":..., "secs":...}
        self.results: Dict[str, Dict[str, Dict[str, Dict[str, dict]]]] = {"main": {}, "rerun": {}}
        self.worker_info: Dict[str, Dict[str, dict]] = {}
        self.logs: List[str] = []
        self.serial = 0
        self.notes: List[str] = []

    # ---- results
    def res(self, phase: str, run: str, alloc: str) -> Dict[str, dict]:
        return self.results[phase].setdefault(run, {}).setdefault(alloc, {})

    def set_outcome(self, chunk: Chunk, tid: str, outcome: str, msg: str = "", secs: Optional[float] = None):
        table = self.res(chunk.phase, chunk.run, chunk.allocator)
        prev = table.get(tid)
        rank = {o: i for i, o in enumerate(("not_run", "skipped", "passed", "failed", "error", "timeout", "crashed"))}
        if prev is not None and prev["outcome"] != "not_run" and rank[prev["outcome"]] >= rank[outcome]:
            if secs is not None:
                prev["secs"] = secs
            return
        entry = {"outcome": outcome}
        if msg:
            entry["msg"] = msg[-6000:]
        if secs is not None:
            entry["secs"] = round(secs, 2)
        elif prev and "secs" in prev:
            entry["secs"] = prev["secs"]
        table[tid] = entry

    # ---- processes
    def env_for(self, run: str, alloc: str) -> Dict[str, str]:
        env = dict(os.environ)
        for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "GRAPHALLOC_CONF"):
            env.pop(k, None)
        spec = self.runs[run]
        env.update(spec.get("env", {}))
        if alloc == "native":
            env.update(spec.get("native_env", {}))
        else:
            env.update(spec.get("graphalloc_env", {}))
        tests_dir = str(self.args.tests_dir)
        paths = [str(REPO / "python"), os.path.join(tests_dir, "stubs"), tests_dir]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # 10 workers x a pool of 16 would thrash
        env.setdefault("OMP_NUM_THREADS", "2")
        # common_utils.load_tests asserts every listed test is defined in sys.argv[0]'s file; the listing
        # loads the file as a module, where imported base classes would trip it.
        env["PYTORCH_DISABLE_RUNNING_SCRIPT_CHK"] = "1"
        return {k: v for k, v in env.items() if v is not None}

    def start(self, chunk: Chunk, listing: bool = False) -> Job:
        self.serial += 1
        name = f"{self.serial:04d}_{chunk.run}_{chunk.allocator}_{chunk.phase}"
        events, log, spec_path = (self.work / f"{name}.events", self.work / f"{name}.log",
                                  self.work / f"{name}.json")
        spec = {"file": str(self.runs[chunk.run]["file"]), "module": Path(self.runs[chunk.run]["file"]).stem,
                "ids": chunk.ids, "events": str(events), "allocator": chunk.allocator, "list": listing,
                "patch": not self.args.no_patch}
        spec_path.write_text(json.dumps(spec))
        events.touch()
        env = self.env_for(chunk.run, chunk.allocator)
        env[SPEC_ENV] = str(spec_path)
        if self.args.fake:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"]
        else:
            cmd = [sys.executable, str(self.args.tests_dir / "run_with.py"), chunk.allocator,
                   str(Path(__file__).resolve()), "--worker"]
        with open(log, "wb") as lf:
            proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    cwd=str(self.args.tests_dir), start_new_session=True)
        return Job(chunk, proc, events, log, spec_path)

    @staticmethod
    def kill(job: Job) -> None:
        if job.proc.poll() is None:
            try:
                os.killpg(job.proc.pid, signal.SIGKILL)  # the worker's own session: it and its children only
            except (ProcessLookupError, PermissionError):
                job.proc.kill()
        try:
            job.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, job: Job, lines: int = 40) -> str:
        try:
            text = job.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def read_events(self, job: Job) -> List[dict]:
        try:
            with open(job.events, "r", errors="replace") as f:
                f.seek(job.offset)
                data = f.read()
                job.offset = f.tell()
        except OSError:
            return []
        data = job.buffer + data
        lines = data.split("\n")
        job.buffer = lines.pop()  # an incomplete last line waits for the next read
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        if out:
            job.last_event = time.time()
        return out

    def apply(self, job: Job, events: List[dict]) -> None:
        ch = job.chunk
        for ev in events:
            kind = ev.get("ev")
            if kind == "info" or (kind in ("import_error", "import_skip") and "info" in ev):
                job.got_info = True
                self.worker_info.setdefault(ch.run, {})[ch.allocator] = ev.get("info", {})
            if kind == "start":
                job.current, job.current_since = ev["id"], ev.get("t", time.time())
                job.seen_start.add(ev["id"])
            elif kind == "outcome":
                self.set_outcome(ch, ev["id"], ev["outcome"], ev.get("msg", ""))
            elif kind == "stop":
                tid = ev["id"]
                job.stopped.add(tid)
                table = self.res(ch.phase, ch.run, ch.allocator)
                if tid not in table:
                    self.set_outcome(ch, tid, "error", "no outcome reported")
                table[tid]["secs"] = round(ev.get("t", time.time()) - job.current_since, 2)
                job.current = None
            elif kind == "fixture_error":
                # setUpClass failed: the class's tests in this chunk that never started get its error.
                m = re.search(r"\(([\w.]+)\)", ev.get("desc", ""))
                cls = m.group(1).split(".")[-1] if m else None
                hit = False
                for tid in ch.ids:
                    if tid not in job.seen_start and (cls is None or tid.split(".")[0] == cls):
                        self.set_outcome(ch, tid, "error", f"{ev.get('desc')}: {ev.get('msg', '')}")
                        job.seen_start.add(tid)
                        job.stopped.add(tid)
                        hit = True
                if not hit:
                    self.notes.append(f"{ch.run}/{ch.allocator}: {ev.get('desc')} {ev.get('outcome')}: "
                                      f"{first_lines(ev.get('msg', ''), 3)}")
            elif kind == "import_error":
                for tid in ch.ids:
                    self.set_outcome(ch, tid, "error", "test file failed to import: " + ev.get("msg", ""))
                    job.seen_start.add(tid)
                    job.stopped.add(tid)
            elif kind == "import_skip":
                for tid in ch.ids:
                    self.set_outcome(ch, tid, "skipped", "module skipped at import: " + ev.get("msg", ""))
                    job.seen_start.add(tid)
                    job.stopped.add(tid)
            elif kind == "list":
                job.listing = ev.get("ids", [])

    def finish(self, job: Job, queue: collections.deque, why: str = "") -> None:
        """After the worker ended (or was killed): outcome for the test it was in, requeue the rest."""
        self.apply(job, self.read_events(job))
        ch = job.chunk
        rc = job.proc.returncode
        tail = self.log_tail(job)
        if job.current is not None and job.current not in job.stopped:
            if why == "timeout":
                outcome, msg = "timeout", f"still running after {self.args.test_timeout_s} s (worker killed)"
            elif why == "budget":
                outcome, msg = "not_run", "was running when the budget ran out (worker killed)"
            else:
                outcome, msg = "crashed", f"worker exited with {rc} during this test; its output ended:\n{tail}"
            self.set_outcome(ch, job.current, outcome, msg,
                             secs=time.time() - job.current_since if outcome != "not_run" else None)
            job.stopped.add(job.current)
            job.seen_start.add(job.current)
            if outcome in ("timeout", "crashed"):
                self.logs.append(f"==== {ch.run}/{ch.allocator} [{ch.phase}] {job.current}: {outcome} "
                                 f"(exit {rc})\n{tail}\n")
        rest = [t for t in ch.ids if t not in job.seen_start]
        if not rest:
            return
        if why == "budget":
            return  # reported as not run
        if job.seen_start:
            queue.appendleft(Chunk(ch.run, ch.allocator, rest, ch.exclusive, ch.phase, ch.attempt + 1))
        else:
            msg = (f"worker exited with {rc} before its first test"
                   f"{' (' + why + ')' if why else ''}; its output ended:\n{tail}")
            for tid in rest:
                self.set_outcome(ch, tid, "error", msg)
            self.logs.append(f"==== {ch.run}/{ch.allocator} [{ch.phase}] worker failed before its first test "
                             f"({len(rest)} tests, exit {rc} {why})\n{tail}\n")

    def schedule(self, queue: collections.deque, jobs: int, min_left_s: float) -> None:
        running: List[Job] = []
        while True:
            now = time.time()
            for job in list(running):
                self.apply(job, self.read_events(job))
                why = ""
                if job.proc.poll() is None:
                    if job.current is not None and now - job.current_since > self.args.test_timeout_s:
                        why = "timeout"
                    elif not job.got_info and now - job.started_at > self.args.startup_timeout_s:
                        why = "startup timeout"
                    elif job.current is None and job.got_info and now - job.last_event > self.args.test_timeout_s:
                        why = "idle timeout"  # hangs between tests (class fixtures, teardown)
                    if not why:
                        continue
                    self.kill(job)
                self.finish(job, queue, why)
                running.remove(job)
            if now >= self.deadline:
                for job in running:
                    self.kill(job)
                    self.finish(job, queue, "budget")
                return
            exclusive_running = any(j.chunk.exclusive for j in running)
            while queue and len(running) < jobs and not exclusive_running and self.deadline - now > min_left_s:
                if queue[0].exclusive and running:
                    break  # drain first
                chunk = queue.popleft()
                running.append(self.start(chunk))
                exclusive_running = chunk.exclusive
            if not queue and not running:
                return
            time.sleep(0.25)

    def list_ids(self, run_names: List[str]) -> Dict[str, List[str]]:
        """Test ids per test file, listed by native workers in parallel (one per file)."""
        files: Dict[str, str] = {}
        for r in run_names:
            files.setdefault(str(self.runs[r]["file"]), r)
        jobs = {f: self.start(Chunk(r, "native", [], phase="list"), listing=True) for f, r in files.items()}
        out: Dict[str, List[str]] = {}
        end = time.time() + self.args.list_timeout_s
        for f, job in jobs.items():
            try:
                job.proc.wait(timeout=max(1.0, end - time.time()))
            except subprocess.TimeoutExpired:
                self.kill(job)
            job.listing = None
            for ev in self.read_events(job):
                if ev.get("ev") == "list":
                    job.listing = ev.get("ids", [])
                elif ev.get("ev") == "info":
                    self.worker_info.setdefault("listing", {})[Path(f).name] = ev.get("info", {})
                elif ev.get("ev") in ("import_error", "import_skip"):
                    self.notes.append(f"listing {Path(f).name}: {ev['ev']}: {first_lines(ev.get('msg', ''), 8)}")
            if job.listing is None:
                tail = self.log_tail(job, 30)
                self.notes.append(f"listing {Path(f).name} failed (exit {job.proc.returncode}): {tail[-1500:]}")
                self.logs.append(f"==== listing {f} failed\n{tail}\n")
            out[f] = job.listing or []
        return out


# =================================================================================================== reporting

def first_lines(msg: str, n: int = 6) -> str:
    """The useful head of an error: what precedes a traceback (e.g. "setUpClass (...)"), the exception line(s)
    at its end and the innermost frame; for a crashed worker, the last lines it printed."""
    if not msg:
        return ""
    lines = msg.rstrip().splitlines()
    if msg.startswith("worker exited"):
        tail = [ln for ln in lines[1:] if ln.strip()]
        return "\n".join([lines[0]] + tail[-(n - 1):])[:1200]
    tb = next((i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln), None)
    if tb is not None:
        prefix = lines[tb].split("Traceback (most recent call last)")[0].strip()
        last_frame = max((i for i, ln in enumerate(lines) if ln.startswith('  File "')), default=-1)
        exc = [ln for ln in lines[last_frame + 1:] if ln.strip() and not ln.startswith((" ", "\t"))]
        where = lines[last_frame].strip() if last_frame >= 0 else ""
        picked = ([prefix] if prefix else []) + exc[:n - 2] + ([f"(at {where})"] if where else [])
        return "\n".join(picked)[:1200]
    return "\n".join(lines[:n])[:1200]


def signature(msg: str) -> str:
    """An error's kind, for grouping: its exception line with numbers and addresses blanked."""
    if msg.startswith("worker exited"):
        tail = [ln for ln in msg.rstrip().splitlines()[1:] if ln.strip()]
        return ("crashed: " + re.sub(r"\d+", "N", tail[-1] if tail else msg.splitlines()[0]))[:160]
    head = [ln for ln in first_lines(msg, 3).splitlines() if not ln.startswith("(at ")]
    if len(head) > 1 and (head[0].endswith(":") or head[0].startswith(("setUpClass", "tearDownClass", "subtest"))):
        head = head[1:]  # "subtest (i=2):" / "setUpClass (...)": the exception says more
    s = head[0] if head else ""
    s = re.sub(r"0x[0-9a-fA-F]+", "0x…", s)
    s = re.sub(r"\d+(\.\d+)?", "N", s)
    return s[:160]


def classify(native: str, ga: str) -> str:
    if native == "passed" and ga in BAD:
        return "graphalloc fails"
    if native in BAD and ga == "passed":
        return "graphalloc passes"
    if "skipped" in (native, ga):
        return "skip differs"
    return "both fail differently"


def compare(results: Dict[str, Dict[str, Dict[str, dict]]], rerun: Dict[str, Dict[str, Dict[str, dict]]]):
    diffs, one_sided = [], collections.Counter()
    for run, per_alloc in results.items():
        nat, ga = per_alloc.get("native", {}), per_alloc.get("graphalloc", {})
        for tid in sorted(set(nat) | set(ga)):
            a, b = nat.get(tid, {}).get("outcome", "not_run"), ga.get(tid, {}).get("outcome", "not_run")
            if "not_run" in (a, b):
                if a != b:
                    one_sided[run] += 1
                continue
            if a == b:
                continue
            d = {"run": run, "test": tid, "native": a, "graphalloc": b, "kind": classify(a, b),
                 "graphalloc_error": first_lines(ga[tid].get("msg", "")) if b != "passed" else "",
                 "native_error": first_lines(nat[tid].get("msg", "")) if a != "passed" else ""}
            rr = rerun.get(run, {})
            ra, rb = rr.get("native", {}).get(tid), rr.get("graphalloc", {}).get(tid)
            if ra or rb:
                d["rerun"] = {"native": (ra or {}).get("outcome", "not_run"),
                              "graphalloc": (rb or {}).get("outcome", "not_run")}
                if ra and rb and "not_run" not in (ra["outcome"], rb["outcome"]):
                    d["rerun"]["confirmed"] = ra["outcome"] != rb["outcome"]
            diffs.append(d)
    order = {"graphalloc fails": 0, "both fail differently": 1, "skip differs": 2, "graphalloc passes": 3}
    diffs.sort(key=lambda d: (order[d["kind"]], d["run"], d["test"]))
    return diffs, dict(one_sided)


def counts(table: Dict[str, dict], selected: List[str]) -> Dict[str, int]:
    c = collections.Counter()
    for tid in selected:
        c[table.get(tid, {}).get("outcome", "not_run")] += 1
    return {o: c.get(o, 0) for o in OUTCOMES}


def build_report(meta: dict, runs: Dict[str, dict], selected: Dict[str, List[str]], results, rerun,
                 worker_info, notes, wall: Dict[str, float]) -> dict:
    diffs, one_sided = compare(results, rerun)
    summary = []
    for run in runs:
        for alloc in ALLOCATORS:
            table = results.get(run, {}).get(alloc, {})
            row = {"run": run, "file": Path(runs[run]["file"]).name, "allocator": alloc,
                   "selected": len(selected.get(run, []))}
            row.update(counts(table, selected.get(run, [])))
            row["test_s"] = round(sum(e.get("secs", 0) or 0 for e in table.values()), 1)
            summary.append(row)
    sigs = collections.Counter()
    examples: Dict[str, str] = {}
    for d in diffs:
        if d["graphalloc"] in BAD:
            s = signature(results[d["run"]]["graphalloc"][d["test"]].get("msg", ""))
            sigs[s] += 1
            examples.setdefault(s, f"{d['run']}: {d['test']}")
    return {"meta": meta, "runs": {r: {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.items()}
                                   for r, spec in runs.items()},
            "summary": summary, "differences": diffs, "one_sided_not_run": one_sided,
            "graphalloc_error_signatures": [{"count": n, "signature": s, "example": examples[s]}
                                            for s, n in sigs.most_common()],
            "worker_info": worker_info, "notes": notes, "wall_s": wall, "results": results, "rerun": rerun}


def _md_cell(s: str, limit: int = 400) -> str:
    s = (s or "").strip()
    if len(s) > limit:
        s = s[:limit] + "…"
    return s.replace("|", "\\|").replace("\n", "<br>")


def render_markdown(rep: dict) -> str:
    m = rep["meta"]
    L = ["# PyTorch's own tests: native allocator vs graphalloc", "",
         f"{m.get('date', '?')}; {m.get('device', '?')}; PyTorch {m.get('torch', '?')}, Python {m.get('python', '?')}; "
         f"graphalloc {m.get('commit', '?')}. `scripts/pytorch_suite.py` {m.get('argv', '')}", "",
         f"Budget {m.get('budget_s')} s, {m.get('jobs')} workers, per-test timeout {m.get('test_timeout_s')} s; "
         f"wall {rep['wall_s'].get('total', 0):.0f} s (listing {rep['wall_s'].get('listing', 0):.0f} s, "
         f"main {rep['wall_s'].get('main', 0):.0f} s, reruns {rep['wall_s'].get('rerun', 0):.0f} s). "
         f"pytest: {m.get('pytest', '?')} (not needed: the workers drive unittest).", ""]
    L.append("Test files: " + "; ".join(f"`{f['name']}` ({f['origin']}, sha256 {f['sha256']})"
                                        for f in m.get("files", [])) + ".")
    info = rep.get("worker_info", {})
    patched = sorted({p for per in info.values() for i in per.values() for p in i.get("patched", [])})
    if patched:
        L.append(f"Names this PyTorch lacks, defined before the test file was loaded: {', '.join(f'`{p}`' for p in patched)}.")
    backends = sorted({f"{run}: {i.get('backend', '?')} (get_allocator_backend: {i.get('allocator_backend', '?')})"
                       for run, per in info.items() if run != "listing"
                       for a, i in per.items() if a == "graphalloc"})
    if backends:
        L.append("graphalloc backend as the workers saw it: " + "; ".join(_md_cell(b, 300) for b in backends) + ".")
    L += ["", "## Outcomes", "",
          "| run | file | allocator | selected | passed | failed | errors | skipped | timeout | crashed | not run | test s |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["summary"]:
        L.append(f"| {r['run']} | {r['file']} | {r['allocator']} | {r['selected']} | {r['passed']} | {r['failed']} | "
                 f"{r['error']} | {r['skipped']} | {r['timeout']} | {r['crashed']} | {r['not_run']} | {r['test_s']} |")
    L.append("")
    for name, spec in rep["runs"].items():
        L.append(f"- {name}: native env {spec.get('native_env') or '{}'}; graphalloc env {spec.get('graphalloc_env') or '{}'}"
                 f"{'; both ' + str(spec.get('env')) if spec.get('env') else ''}; selection: {spec.get('selection', 'all')}")
    if rep.get("one_sided_not_run"):
        L.append(f"- tests run with one allocator only (budget): {rep['one_sided_not_run']} (not compared)")
    diffs = rep["differences"]
    kinds = collections.Counter(d["kind"] for d in diffs)
    L += ["", f"## Tests whose outcome differs ({len(diffs)}: " +
          (", ".join(f"{n} {k}" for k, n in kinds.most_common()) or "none") + ")", ""]
    if rep["graphalloc_error_signatures"]:
        L += ["graphalloc's errors among them, grouped:", "", "| count | error | e.g. |", "|---:|---|---|"]
        for s in rep["graphalloc_error_signatures"][:25]:
            L.append(f"| {s['count']} | {_md_cell(s['signature'], 200)} | {_md_cell(s['example'], 120)} |")
        L.append("")
    if diffs:
        L += ["| run | test | native | graphalloc | rerun (native / graphalloc) | graphalloc's error (first lines) |",
              "|---|---|---|---|---|---|"]
        for d in diffs:
            rr = d.get("rerun")
            rtxt = "–"
            if rr:
                rtxt = f"{rr['native']} / {rr['graphalloc']}"
                if "confirmed" in rr:
                    rtxt += " (confirmed)" if rr["confirmed"] else " (same: parallel-run artefact?)"
            err = d["graphalloc_error"] or ("native: " + d["native_error"] if d["native_error"] else "")
            L.append(f"| {d['run']} | `{d['test']}` | {d['native']} | {d['graphalloc']} | {rtxt} | {_md_cell(err)} |")
    if rep.get("notes"):
        L += ["", "## Notes", ""] + [f"- {_md_cell(n, 800)}" for n in rep["notes"]]
    return "\n".join(L) + "\n"


# ======================================================================================================= main

def find_tests_dir(explicit: Optional[str]) -> Optional[Path]:
    cands = [explicit, os.environ.get("PYTORCH_TESTS_DIR"), REPO / ".pytorch-tests", REPO / "shared" / "pytorch-tests",
             REPO.parent / "shared" / "pytorch-tests"]
    for c in cands:
        if c and (Path(c) / "run_with.py").is_file():
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


def environment_meta(args, runs) -> dict:
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version(), "argv": " ".join(sys.argv[1:]), "budget_s": args.budget_s,
            "jobs": args.jobs, "test_timeout_s": args.test_timeout_s,
            "pytest": "installed" if shutil.which("pytest") or _has_module("pytest") else "absent",
            "tests_dir": str(args.tests_dir),
            "env": {k: os.environ.get(k) for k in ("GRAPHALLOC_LIBRARY", "GRAPHALLOC_TORCH_BACKEND",
                                                   "GRAPHALLOC_TORCH_SHIM", "GRAPHALLOC_CONF") if os.environ.get(k)}}
    files = []
    origins = {"test_cuda.py": "PyTorch's test/test_cuda.py, late-2025 copy (not the 2.11.0 release file)",
               "test_cudagraph_trees.py": "PyTorch's test/inductor/test_cudagraph_trees.py, early-2026 copy",
               "test_fake_suite.py": "self-test fake"}
    for f in sorted({str(s["file"]) for s in runs.values()}):
        p = Path(f)
        if p.is_file():
            files.append({"name": p.name, "origin": origins.get(p.name, "?"),
                          "sha256": hashlib.sha256(p.read_bytes()).hexdigest()[:12]})
    meta["files"] = files
    g = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    meta["commit"] = (g.stdout.strip() or "unknown") + (" (+ uncommitted changes)" if subprocess.run(
        ["git", "-C", str(REPO), "diff", "--quiet", "HEAD"], capture_output=True).returncode else "")
    if not args.fake:
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            meta["device"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 else "?"
        except Exception:  # noqa: BLE001
            meta["device"] = "?"
    else:
        meta["device"] = "none (self-test)"
    return meta


def _has_module(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def write_outputs(out: Path, rep: dict, logs: List[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "pytorch_suite.json").write_text(json.dumps(rep, indent=1, default=str))
    (out / "pytorch_suite.md").write_text(render_markdown(rep))
    text = "\n".join(logs) if logs else "(no crashed, timed-out or failed-to-start worker)\n"
    (out / "pytorch_suite_logs.txt").write_text(text[-4_000_000:])


def main_suite(args) -> int:
    t0 = time.time()
    if args.fake:
        args.tests_dir = Path(tempfile.mkdtemp(prefix="suite_fake_"))
        (args.tests_dir / "run_with.py").write_text("# fake\n")
        (args.tests_dir / "test_fake_suite.py").write_text(FAKE_TEST_FILE)
    else:
        found = find_tests_dir(args.tests_dir)
        if found is None:
            print("pytorch_suite: no pytorch-tests folder (with run_with.py) found: pass --tests-dir",
                  file=sys.stderr)
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


# ================================================================================================== self-test

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
    if ok:  # a failed self-test keeps its output folders, to look at
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
    return 0 if ok else 1


def fake_worker_env_hook() -> None:
    os.environ["GRAPHALLOC_SUITE_FAKE_ALLOC"] = json.loads(Path(os.environ[SPEC_ENV]).read_text())["allocator"]


# ========================================================================================================= cli

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--tests-dir", default=None)
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
            fake_worker_env_hook()
        return worker_main()
    args = parse_args()
    if args.render:
        print(render_markdown(json.loads(Path(args.render).read_text())))
        return 0
    if args.self_test:
        os.environ["GRAPHALLOC_SUITE_FAKE"] = "1"
        return self_test()
    if args.fake:
        os.environ["GRAPHALLOC_SUITE_FAKE"] = "1"
    return main_suite(args)


if __name__ == "__main__":
    sys.exit(main())
