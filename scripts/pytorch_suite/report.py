"""The report: outcomes compared between the allocators, graphalloc's errors grouped, the environment, and
the JSON, Markdown and log files written from them."""
from __future__ import annotations

import collections
import datetime
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from pytorch_suite import ALLOCATORS, REPO

OUTCOMES = ("passed", "failed", "error", "skipped", "timeout", "crashed", "not_run")
BAD = ("failed", "error", "timeout", "crashed")


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


