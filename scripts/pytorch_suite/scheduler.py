"""Runs chunks of test ids in worker processes within the budget: starts them, reads their events, kills
those past a timeout, requeues what a crashed worker left and records every test's outcome."""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from pytorch_suite import REPO, SPEC_ENV
from pytorch_suite.report import first_lines

# A worker is the command line with --worker, started through run_with.py, which installs graphalloc first.
ENTRY = REPO / "scripts" / "pytorch_suite.py"
RUN_WITH = Path(__file__).resolve().parent / "run_with.py"
# A stand-in for the expecttest package, which the test files import and the GPU machine lacks.
STUBS = Path(__file__).resolve().parent / "stubs"


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
        paths = [str(REPO / "python"), str(STUBS), tests_dir]
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
            cmd = [sys.executable, str(ENTRY), "--worker"]
        else:
            cmd = [sys.executable, str(RUN_WITH), chunk.allocator, str(ENTRY), "--worker"]
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


