#!/usr/bin/env python3
"""Compares graphalloc as PyTorch's allocator (its C++ CUDAAllocator backend, and the older pluggable path) with
PyTorch's native caching allocator (default and expandable_segments:True) and cudaMallocAsync
(backend:cudaMallocAsync), each in its own process, and writes one Markdown table.

    GRAPHALLOC_LIBRARY=build/libgraphalloc.so GRAPHALLOC_CLI=build/tools/graphalloc PYTHONPATH=python \
        python3 bench/torch/compare_allocators.py -o bench/torch/results.md

Workloads (all through PyTorch, random weights, nothing downloaded):
  * hit path: `torch.empty(n)` + drop in a loop, one size (median ns per pair, Python overhead included:
    it is the same for every allocator);
  * churn: 64 live tensors, each op replaces one with a new tensor of a random size 512 B..4 MiB (ns/op);
  * GPT-2-small-like training step (12 blocks, d 768, 12 heads, vocab 50257, batch 8 x 512, bf16 autocast,
    AdamW) and ResNet-50 (torchvision, weights=None; batch 64, 224x224, bf16 autocast, SGD): median step
    time and peak reserved / peak allocated memory;
  * the same two models under torch.compile(mode="reduce-overhead") (CUDA graph trees): compile + warm-up
    time, step time, peak memory, and whether the losses equal native's bit for bit (eager rows too);
  * the shipped traces: `graphalloc replay --device cuda --json` (and --find-min-capacity on the simulated
    device); PyTorch's own figures for them are quoted from traces/README.md (recorded by PyTorch 2.11).

Micro rows run --micro-reps processes per allocator, repetitions interleaved (rep 1 of every allocator, then
rep 2, ...); each cell is the median over repetitions with the min-max spread. --budget-s bounds the whole run:
workers are started in the order micro, eager models, compiled models, traces, and what does not fit is
reported as "not run". A 6-minute run on an H100:
    python3 bench/torch/compare_allocators.py -o OUT/results.md --json OUT/results.json --budget-s 360 --no-traces
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "python"))

MiB = 1 << 20
ALLOCATORS = {
    "graphalloc": None,              # graphalloc.torch.install(): the C++ backend when built for this PyTorch
    "graphalloc_pluggable": None,    # GRAPHALLOC_TORCH_BACKEND=pluggable: the CUDAPluggableAllocator path
    "native": "",
    "native_expandable": "expandable_segments:True",
    "cudaMallocAsync": "backend:cudaMallocAsync",
}
COLUMNS = {"graphalloc": "graphalloc (backend)", "graphalloc_pluggable": "graphalloc (pluggable)",
           "native": "PyTorch native", "native_expandable": "native, expandable_segments",
           "cudaMallocAsync": "cudaMallocAsync"}
WORKLOADS = ["micro", "gpt2", "resnet50", "gpt2_compiled", "resnet50_compiled"]
# Which allocators run which workload by default (--allocators narrows it).
DEFAULT_FOR = {"micro": list(ALLOCATORS),
               "gpt2": ["graphalloc", "native", "native_expandable", "cudaMallocAsync"],
               "resnet50": ["graphalloc", "native", "native_expandable", "cudaMallocAsync"],
               "gpt2_compiled": ["native", "graphalloc", "native_expandable", "cudaMallocAsync"],
               "resnet50_compiled": ["native", "graphalloc", "native_expandable", "cudaMallocAsync"]}
HIT_SIZES = (512, MiB, 20 * MiB)
# PyTorch's figures for the shipped traces (traces/README.md): peak reserved / peak allocated (MiB) with the
# default allocator, and the peak reserved / peak allocated ratio with expandable_segments:True.
TRACE_README = {
    "gpt2_train": {"native": (7708, 7365), "expandable_ratio": 1.074},
    "resnet50_train": {"native": (3622, 3067), "expandable_ratio": 1.017},
    "gpt2_generate_varying": {"native": (636, 550), "expandable_ratio": 1.080},
}


# ----------------------------------------------------------------------------------------------- worker

def worker(workload: str, allocator: str, args) -> dict:
    out = {"allocator": allocator, "workload": workload}
    if allocator.startswith("graphalloc"):
        import graphalloc.torch as gat
        gat.install()
        out["backend"] = gat.backend() if hasattr(gat, "backend") else "pluggable (no graphalloc.torch.backend())"
        out["backend_reason"] = str(gat.hooks().get("backend", ""))[:300]
    import torch
    # cuDNN's benchmark mode needs cacheInfo, which no pluggable allocator provides (rapidsai/rmm#1362): off
    # for every allocator unless --cudnn-benchmark (then the pluggable column cannot run the models).
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    # Deterministic convolution algorithms (the default): otherwise cuDNN may pick algorithms whose results
    # differ from run to run with any allocator (PyTorch's own two configurations disagree then), and the
    # bit-for-bit loss comparison says nothing about the allocator.
    torch.backends.cudnn.deterministic = bool(args.deterministic)
    if args.deterministic and workload != "micro":
        # cuDNN's choice alone is not enough: ResNet-50's losses still differed between PyTorch's own two
        # configurations (H200, 2026-11-27); other kernels (atomics in backward passes, cuBLAS split-K
        # without a fixed workspace) vary too. warn_only: an op with no deterministic kernel warns, not
        # fails; uninitialized memory is not filled, so that step times stay comparable.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
    dev = torch.device("cuda")
    torch.cuda.init()
    try:
        out["allocator_backend"] = torch.cuda.get_allocator_backend()
    except Exception as e:  # noqa: BLE001
        out["allocator_backend"] = f"? ({e})"[:100]
    compiled = workload.endswith("_compiled")
    model = workload[: -len("_compiled")] if compiled else workload
    if workload == "micro":
        out.update(micro(torch, dev, args))
    elif model == "gpt2":
        out.update(train(torch, dev, gpt2_step(torch, dev, args, compiled), args, compiled))
    elif model == "resnet50":
        out.update(train(torch, dev, resnet_step(torch, dev, args, compiled), args, compiled))
    return out


def micro(torch, dev, args) -> dict:
    res = {}
    for size in HIT_SIZES:
        for _ in range(2000):
            torch.empty(size, dtype=torch.uint8, device=dev)
        reps = []
        for _ in range(5):
            n = args.hit_iters
            t0 = time.perf_counter_ns()
            for _ in range(n):
                torch.empty(size, dtype=torch.uint8, device=dev)
            reps.append((time.perf_counter_ns() - t0) / n)
        res[f"hit_{size}"] = statistics.median(reps)
    rng = random.Random(42)
    ops = [(rng.randrange(64), int(2 ** rng.uniform(9, 22)) // 512 * 512 or 512) for _ in range(args.churn_ops)]
    slots = [None] * 64
    for i, s in ops[:2000]:
        slots[i] = torch.empty(s, dtype=torch.uint8, device=dev)
    reps = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for i, s in ops:
            slots[i] = torch.empty(s, dtype=torch.uint8, device=dev)
        reps.append((time.perf_counter_ns() - t0) / len(ops))
    res["churn"] = statistics.median(reps)
    torch.cuda.synchronize()
    return res


def compile_fn(torch, fn, compiled: bool):
    if not compiled:
        return fn
    return torch.compile(fn, mode="reduce-overhead")


def gpt2_step(torch, dev, args, compiled=False):
    import torch.nn as nn
    import torch.nn.functional as F

    d, heads, layers, vocab, seq, batch = 768, 12, 12, 50257, 512, args.gpt2_batch

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
            x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
            return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def forward_loss(idx):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
            return F.cross_entropy(logits.float().view(-1, vocab), idx.view(-1))
    fwd = compile_fn(torch, forward_loss, compiled)

    def step():
        idx = torch.randint(0, vocab, (batch, seq), device=dev)
        if compiled:
            torch.compiler.cudagraph_mark_step_begin()
        loss = fwd(idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def resnet_step(torch, dev, args, compiled=False):
    import torch.nn.functional as F
    try:
        import torchvision
        model = torchvision.models.resnet50(weights=None)
    except ImportError:  # pragma: no cover - torchvision is on the GPU machines
        raise SystemExit("torchvision is needed for the ResNet-50 workload")
    torch.manual_seed(0)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batch = args.resnet_batch

    def forward_loss(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.cross_entropy(model(x), y)
    fwd = compile_fn(torch, forward_loss, compiled)

    def step():
        x = torch.randn(batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        if compiled:
            torch.compiler.cudagraph_mark_step_begin()
        loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def train(torch, dev, step, args, compiled=False) -> dict:
    losses = []
    t_warm = time.perf_counter()
    # CUDA graph trees warm up once, record on the next call, replay after: at least 3 warm-up steps.
    for _ in range(max(args.warmup, 3) if compiled else args.warmup):
        losses.append(float(step()))
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t_warm
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss))
    res = {"step_ms": statistics.median(times), "step_ms_all": times, "losses": losses, "warmup_s": warmup_s}
    if compiled:
        try:
            from torch._dynamo.utils import counters
            res["cudagraph_skips"] = int(counters["inductor"].get("cudagraph_skips", 0))
            from torch._inductor import cudagraph_trees
            res["graph_tree"] = cudagraph_trees.get_manager(torch.cuda.current_device(), False) is not None
        except Exception as e:  # noqa: BLE001
            res["graph_tree"] = f"? ({e})"[:100]
    try:
        res["peak_reserved"] = torch.cuda.max_memory_reserved()
        res["peak_allocated"] = torch.cuda.max_memory_allocated()
    except Exception as e:  # noqa: BLE001
        res["stats_error"] = str(e)[:200]
    return res


# ----------------------------------------------------------------------------------------------- parent

def run_worker(workload: str, allocator: str, args, timeout: float) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    conf = ALLOCATORS[allocator]
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if allocator == "graphalloc":
        env["GRAPHALLOC_TORCH_BACKEND"] = "auto"
    elif allocator == "graphalloc_pluggable":
        env["GRAPHALLOC_TORCH_BACKEND"] = "pluggable"
    env["PYTHONPATH"] = str(REPO / "python") + os.pathsep + env.get("PYTHONPATH", "")
    if args.deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS requires
    cmd = [sys.executable, __file__, "--worker", workload, "--allocator", allocator,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--gpt2-batch", str(args.gpt2_batch),
           "--resnet-batch", str(args.resnet_batch), "--hit-iters", str(args.hit_iters),
           "--churn-ops", str(args.churn_ops)] + (["--cudnn-benchmark"] if args.cudnn_benchmark else []) + \
          (["--deterministic"] if args.deterministic else ["--no-deterministic"])
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        print(f"[{allocator}/{workload}] timed out after {timeout:.0f} s:\n{tail[-2000:]}", file=sys.stderr)
        return {"error": f"timed out after {timeout:.0f} s"}
    if r.returncode != 0:
        print(f"[{allocator}/{workload}] failed ({r.returncode}):\n{r.stderr[-3000:]}", file=sys.stderr)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        # The exception line (the last one that does not start with whitespace), not a trailing note.
        msg = next((ln for ln in reversed(lines) if not ln.startswith((" ", "\t"))), lines[-1] if lines else "?")
        return {"error": msg[:300]}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["wall_s"] = round(time.time() - t0, 1)
    print(f"[{allocator}/{workload}] {time.time() - t0:.1f} s: "
          f"{ {k: v for k, v in res.items() if k not in ('step_ms_all', 'losses')} }", file=sys.stderr, flush=True)
    return res


MICRO_KEYS = [f"hit_{n}" for n in HIT_SIZES] + ["churn"]


def aggregate_micro(reps: list) -> dict:
    """Median over repetitions of each micro metric, with its min and max."""
    ok = [r for r in reps if "error" not in r]
    out = {"reps": reps, "n": len(ok)}
    if not ok:
        out["error"] = reps[-1].get("error", "not run") if reps else "not run"
        return out
    for k in MICRO_KEYS:
        vals = [r[k] for r in ok if isinstance(r.get(k), (int, float))]
        if vals:
            out[k] = statistics.median(vals)
            out[k + "_min"], out[k + "_max"] = min(vals), max(vals)
    for k in ("backend", "backend_reason", "allocator_backend"):
        if k in ok[0]:
            out[k] = ok[0][k]
    return out


def loss_check(results: dict, workload: str, allocator: str) -> str:
    """Whether `allocator`'s losses on `workload` equal native's bit for bit."""
    mine = results.get(allocator, {}).get(workload, {}).get("losses")
    ref = results.get("native", {}).get(workload, {}).get("losses")
    if not mine or not ref:
        return "–"
    if allocator == "native":
        return "reference"
    n = min(len(mine), len(ref))
    if mine[:n] == ref[:n]:
        return f"identical ({n})"
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(mine[:n], ref[:n]))
    return f"differ (max rel {worst:.1e})"


def run_traces(args) -> dict:
    import graphalloc
    cli = graphalloc.cli_path()
    out = {}
    if cli is None:
        print("graphalloc CLI not found: no trace rows", file=sys.stderr)
        return out
    for trace in sorted((REPO / "traces").glob("*.csv.gz")):
        name = trace.name[: -len(".csv.gz")]
        row = {}
        try:
            r = subprocess.run([cli, "replay", str(trace), "--device", "cuda", "--json"], capture_output=True,
                               text=True, timeout=180)
            if r.returncode == 0:
                row["cuda"] = json.loads(r.stdout)
            else:
                row["cuda_error"] = r.stderr.strip()[-200:]
            if args.min_capacity:
                r = subprocess.run([cli, "replay", str(trace), "--device", "sim", "--find-min-capacity", "--json"],
                                   capture_output=True, text=True, timeout=240)
                if r.returncode == 0:
                    row["sim"] = json.loads(r.stdout)
                else:
                    row["sim_error"] = r.stderr.strip()[-200:]
        except subprocess.TimeoutExpired as e:
            row["error"] = f"timeout: {e}"
        print(f"[trace {name}] {json.dumps(row)[:400]}", file=sys.stderr, flush=True)
        out[name] = row
    return out


def fmt_mib(b) -> str:
    return f"{b / MiB:,.0f}" if isinstance(b, (int, float)) else "–"


def cell(res: dict, key: str, fmt) -> str:
    if not res:
        return "–"
    if "error" in res:
        return "not run" if res["error"] == "not run (budget)" else "failed"
    v = res.get(key)
    return fmt(v) if v is not None else "–"


def spread_cell(res: dict, key: str) -> str:
    c = cell(res, key, lambda v: f"{v:,.0f}")
    if key + "_min" in res and res.get("n", 0) > 1:
        c += f" ({res[key + '_min']:,.0f}–{res[key + '_max']:,.0f})"
    return c


def environment(args) -> dict:
    import torch
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "commit": args.commit}
    try:
        env["device"] = torch.cuda.get_device_name(0)
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        env["driver"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 else "?"
    except Exception:  # noqa: BLE001
        env.setdefault("device", "?")
    if env["commit"] == "auto":
        g = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True)
        env["commit"] = g.stdout.strip() if g.returncode == 0 else "unknown"
    return env


def render(env, results, traces, args, wall_s=0.0) -> str:
    names = [a for a in ALLOCATORS if any(results.get(a, {}).values())] or list(ALLOCATORS)
    lines = [
        "# graphalloc vs PyTorch's allocators, through PyTorch",
        "",
        f"{env['date']}; {env.get('device', '?')}, driver {env.get('driver', '?')}; PyTorch {env['torch']} "
        f"(CUDA {env['cuda']}), Python {env['python']}; graphalloc {env['commit']}. "
        f"Produced by `bench/torch/compare_allocators.py` (each allocator in its own process; micro rows: "
        f"{args.micro_reps} processes per allocator, repetitions interleaved, median (min–max) over them; "
        f"models: {args.warmup} warm-up (3 at least when compiled) + {args.steps} timed steps, medians; "
        f"{wall_s:.0f} s in all, budget {args.budget_s:.0f} s).",
        "",
        "| workload | metric | " + " | ".join(COLUMNS[a] for a in names) + " |",
        "|---|---|" + "---:|" * len(names),
    ]

    def row(workload, metric, fn):
        lines.append(f"| {workload} | {metric} | " + " | ".join(fn(a) for a in names) + " |")

    def res_of(a, wl):
        return results.get(a, {}).get(wl, {})

    ns = lambda v: f"{v:,.0f}"  # noqa: E731
    ms = lambda v: f"{v:.1f}"  # noqa: E731
    sec = lambda v: f"{v:.0f}"  # noqa: E731
    for n in HIT_SIZES:
        label = f"{n // MiB} MiB" if n >= MiB else f"{n} B"
        row(f"hit path {label}", "torch.empty + free, ns", lambda a, n=n: spread_cell(res_of(a, "micro"), f"hit_{n}"))
    row("churn", "ns / op (64 live, 512 B..4 MiB)", lambda a: spread_cell(res_of(a, "micro"), "churn"))
    models = {"gpt2": f"GPT-2 small, batch {args.gpt2_batch}x512", "resnet50": f"ResNet-50, batch {args.resnet_batch}"}
    for wl in ("gpt2", "resnet50", "gpt2_compiled", "resnet50_compiled"):
        base = wl.replace("_compiled", "")
        title = models[base] + (", reduce-overhead" if wl.endswith("_compiled") else "")
        if not any(res_of(a, wl) for a in names):
            continue
        row(title, "step time, ms", lambda a, wl=wl: cell(res_of(a, wl), "step_ms", ms))
        row(title, "peak reserved, MiB", lambda a, wl=wl: cell(res_of(a, wl), "peak_reserved", fmt_mib))
        row(title, "peak allocated, MiB", lambda a, wl=wl: cell(res_of(a, wl), "peak_allocated", fmt_mib))
        if wl.endswith("_compiled"):
            row(title, "compile + warm-up, s", lambda a, wl=wl: cell(res_of(a, wl), "warmup_s", sec))
        row(title, "losses vs native", lambda a, wl=wl: loss_check(results, wl, a) if "error" not in res_of(a, wl)
            else cell(res_of(a, wl), "losses", str))
    tcols = len(names) - 1
    for name, row_t in traces.items():
        ref = TRACE_README.get(name)
        cuda = row_t.get("cuda", {})
        sim = row_t.get("sim", {})
        if cuda:
            g = f"{fmt_mib(cuda.get('peak_reserved_bytes'))} / {fmt_mib(cuda.get('peak_live_bytes'))} = " \
                f"{cuda.get('ratio', 0):.3f}"
        else:
            g = "failed: " + row_t.get("cuda_error", row_t.get("error", "?"))[:60]
        by = {a: "–" for a in names}
        by["graphalloc"] = g
        if ref:
            r, al = ref["native"]
            by["native"] = f"{r:,} / {al:,} = {r / al:.3f}"
            by["native_expandable"] = f"≈{ref['expandable_ratio'] * al:,.0f} / {al:,} = {ref['expandable_ratio']:.3f}"
        row(f"trace {name}", "peak reserved / peak live, MiB", lambda a: by.get(a, "–"))
        if cuda:
            lines.append(f"| trace {name} | replay time per op, ns | " +
                         " | ".join(f"{cuda.get('ns_per_op', 0):,.0f}" if a == "graphalloc" else "–" for a in names) + " |")
        mc = sim.get("min_capacity") if sim else None
        if mc:
            lines.append(f"| trace {name} | smallest capacity that completes (sim), MiB | " +
                         " | ".join(f"{fmt_mib(mc.get('bytes'))} = {mc.get('ratio', 0):.3f} x live" if a == "graphalloc"
                                    else "–" for a in names) + " |")
    del tcols
    lines += [
        "",
        "Notes. Hit path and churn include PyTorch's Python and dispatcher overhead (identical for all columns); "
        "the pluggable column adds PyTorch's pluggable-allocator layer (a std::function call and a mutex-guarded "
        "pointer map). \"losses vs native\": every loss of the run (warm-up and timed steps, same seeds) "
        "compared bit for bit with the native column's of the same workload. Trace rows: graphalloc's numbers "
        "from `graphalloc replay --device cuda` (and `--device sim --find-min-capacity`); PyTorch's from "
        "traces/README.md (recorded with PyTorch 2.11 on an H100; the expandable column's reserved MiB is ratio x "
        f"peak allocated). cuDNN benchmark mode is {'on' if args.cudnn_benchmark else 'off'} and deterministic "
        f"algorithms are {'on' if args.deterministic else 'off'} for every column.",
    ]
    for a in names:
        for wl in WORKLOADS:
            r = results.get(a, {}).get(wl, {})
            if wl == "micro" and r.get("reps"):
                bad = [x["error"] for x in r["reps"] if "error" in x]
                if bad:
                    lines.append(f"- {a} / micro: {len(bad)} of {len(r['reps'])} repetitions failed: `{bad[-1]}`")
                if r.get("backend"):
                    lines.append(f"- {a}: graphalloc.torch.backend() = {r['backend']!r} "
                                 f"(get_allocator_backend() = {r.get('allocator_backend')!r}); {r.get('backend_reason', '')}")
            elif "error" in r:
                lines.append(f"- {a} / {wl}: `{r['error']}`")
            elif wl.endswith("_compiled") and r:
                lines.append(f"- {a} / {wl}: cudagraph skips {r.get('cudagraph_skips')}, graph tree manager: "
                             f"{r.get('graph_tree')}")
    return "\n".join(lines) + "\n"


def plan(args) -> list:
    """(workload, allocator) in the order they run: micro repetitions interleaved first, then the eager
    models, then the compiled ones (native first: it pays the cold compile, the others hit inductor's cache)."""
    allowed = [a for a in args.allocators.split(",") if a]
    workloads = [w for w in args.workloads.split(",") if w]
    for a in allowed:
        if a not in ALLOCATORS:
            raise SystemExit(f"unknown allocator {a!r}: {', '.join(ALLOCATORS)}")
    out = []
    if "micro" in workloads:
        for _ in range(args.micro_reps):
            out += [("micro", a) for a in DEFAULT_FOR["micro"] if a in allowed]
    for wl in workloads:
        if wl not in DEFAULT_FOR:
            raise SystemExit(f"unknown workload {wl!r}: {', '.join(WORKLOADS)}")
    for compiled in (False, True):
        # graphalloc and native of every model before the other columns: a budget cut loses those first.
        for tier in (("native", "graphalloc"), None):
            for wl in workloads:
                if wl == "micro" or wl.endswith("_compiled") != compiled:
                    continue
                out += [(wl, a) for a in DEFAULT_FOR[wl]
                        if a in allowed and ((a in tier) if tier else a not in ("native", "graphalloc"))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", help="write the Markdown table here")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--micro-reps", type=int, default=5)
    ap.add_argument("--gpt2-batch", type=int, default=8)
    ap.add_argument("--resnet-batch", type=int, default=64)
    ap.add_argument("--hit-iters", type=int, default=20000)
    ap.add_argument("--churn-ops", type=int, default=20000)
    ap.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN benchmark mode (needs cacheInfo)")
    ap.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                    help="deterministic algorithms (cuDNN, PyTorch ops, cuBLAS), so that losses compare bit for bit "
                         "(default on)")
    ap.add_argument("--no-traces", action="store_true")
    ap.add_argument("--min-capacity", action="store_true", help="also --find-min-capacity per trace (sim)")
    ap.add_argument("--commit", default="auto")
    ap.add_argument("--budget-s", type=float, default=1e9, help="wall-clock bound for the whole comparison")
    ap.add_argument("--worker-timeout", type=int, default=300)
    ap.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    ap.add_argument("--allocator", choices=list(ALLOCATORS), help=argparse.SUPPRESS)
    ap.add_argument("--render-json", help="Markdown again from a --json file (no GPU)")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.allocator, args)), flush=True)
        return
    if args.render_json:
        data = json.loads(Path(args.render_json).read_text())
        for k, v in data.get("args", {}).items():
            setattr(args, k, v)
        print(render(data["env"], data["results"], data["traces"], args, data.get("wall_s", 0)))
        return
    t0 = time.time()
    deadline = t0 + args.budget_s
    results = {a: {} for a in ALLOCATORS}
    micro_reps = {a: [] for a in ALLOCATORS}
    for wl, a in plan(args):
        left = deadline - time.time()
        if left < 15:
            res = {"error": "not run (budget)"}
        else:
            res = run_worker(wl, a, args, timeout=min(args.worker_timeout, left))
        if wl == "micro":
            micro_reps[a].append(res)
        else:
            results[a][wl] = res
    for a, reps in micro_reps.items():
        if reps:
            results[a]["micro"] = aggregate_micro(reps)
    traces = {}
    if not args.no_traces:
        if deadline - time.time() > 60:
            traces = run_traces(args)
        else:
            print("no time left for the trace rows (--budget-s)", file=sys.stderr)
    env = environment(args)
    wall = time.time() - t0
    md = render(env, results, traces, args, wall)
    print(md)
    if args.output:
        Path(args.output).write_text(md)
    if args.json:
        keep = ("steps", "warmup", "micro_reps", "gpt2_batch", "resnet_batch", "cudnn_benchmark", "deterministic",
                "budget_s")
        Path(args.json).write_text(json.dumps({"env": env, "results": results, "traces": traces, "wall_s": wall,
                                               "args": {k: getattr(args, k) for k in keep}}, indent=1))


if __name__ == "__main__":
    main()
