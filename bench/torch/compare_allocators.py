#!/usr/bin/env python3
"""Compares graphalloc as PyTorch's allocator with PyTorch's native caching allocator (default and
expandable_segments:True) and cudaMallocAsync (backend:cudaMallocAsync), each in its own process, and writes
one Markdown table.

    GRAPHALLOC_LIBRARY=build/libgraphalloc.so GRAPHALLOC_CLI=build/tools/graphalloc PYTHONPATH=python \
        python3 bench/torch/compare_allocators.py -o bench/torch/results.md

Workloads (all through PyTorch, random weights, nothing downloaded):
  * hit path: `torch.empty(n)` + drop in a loop, one size (median ns per pair, Python overhead included:
    it is the same for every allocator);
  * churn: 64 live tensors, each op replaces one with a new tensor of a random size 512 B..4 MiB (ns/op);
  * GPT-2-small-like training step (12 blocks, d 768, 12 heads, vocab 50257, batch 8 x 512, bf16 autocast,
    AdamW) and ResNet-50 (torchvision, weights=None; batch 64, 224x224, bf16 autocast, SGD): median step
    time and peak reserved / peak allocated memory;
  * the shipped traces: `graphalloc replay --device cuda --json` (and --find-min-capacity on the simulated
    device); PyTorch's own figures for them are quoted from traces/README.md (recorded by PyTorch 2.11).
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
    "graphalloc": None,
    "native": "",
    "native_expandable": "expandable_segments:True",
    "cudaMallocAsync": "backend:cudaMallocAsync",
}
WORKLOADS = ["micro", "gpt2", "resnet50"]
# PyTorch's figures for the shipped traces (traces/README.md): peak reserved / peak allocated (MiB) with the
# default allocator, and the peak reserved / peak allocated ratio with expandable_segments:True.
TRACE_README = {
    "gpt2_train": {"native": (7708, 7365), "expandable_ratio": 1.074},
    "resnet50_train": {"native": (3622, 3067), "expandable_ratio": 1.017},
    "gpt2_generate_varying": {"native": (636, 550), "expandable_ratio": 1.080},
}


# ----------------------------------------------------------------------------------------------- worker

def worker(workload: str, allocator: str, args) -> dict:
    if allocator == "graphalloc":
        import graphalloc.torch as gat
        gat.install()
    import torch
    torch.backends.cudnn.benchmark = False  # cuDNN's benchmark mode needs cacheInfo, which no pluggable
    #                                         allocator provides (rapidsai/rmm#1362): off for every allocator
    dev = torch.device("cuda")
    torch.cuda.init()
    out = {"allocator": allocator, "workload": workload}
    if workload == "micro":
        out.update(micro(torch, dev, args))
    elif workload == "gpt2":
        out.update(train(torch, dev, gpt2_step(torch, dev, args), args))
    elif workload == "resnet50":
        out.update(train(torch, dev, resnet_step(torch, dev, args), args))
    return out


def micro(torch, dev, args) -> dict:
    res = {}
    for size in (512, MiB):
        for _ in range(2000):
            torch.empty(size, dtype=torch.uint8, device=dev)
        reps = []
        for _ in range(7):
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


def gpt2_step(torch, dev, args):
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

    def step():
        idx = torch.randint(0, vocab, (batch, seq), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, vocab), idx.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def resnet_step(torch, dev, args):
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

    def step():
        x = torch.randn(batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def train(torch, dev, step, args) -> dict:
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    res = {"step_ms": statistics.median(times), "step_ms_all": times}
    try:
        res["peak_reserved"] = torch.cuda.max_memory_reserved()
        res["peak_allocated"] = torch.cuda.max_memory_allocated()
    except Exception as e:  # noqa: BLE001
        res["stats_error"] = str(e)[:200]
    return res


# ----------------------------------------------------------------------------------------------- parent

def run_worker(workload: str, allocator: str, args) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    conf = ALLOCATORS[allocator]
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env["PYTHONPATH"] = str(REPO / "python") + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--worker", workload, "--allocator", allocator,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--gpt2-batch", str(args.gpt2_batch),
           "--resnet-batch", str(args.resnet_batch), "--hit-iters", str(args.hit_iters),
           "--churn-ops", str(args.churn_ops)]
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.worker_timeout)
    if r.returncode != 0:
        print(f"[{allocator}/{workload}] failed ({r.returncode}):\n{r.stderr[-3000:]}", file=sys.stderr)
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"[{allocator}/{workload}] {time.time() - t0:.1f} s: "
          f"{ {k: v for k, v in res.items() if k != 'step_ms_all'} }", file=sys.stderr, flush=True)
    return res


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
    if "error" in res:
        return "failed"
    v = res.get(key)
    return fmt(v) if v is not None else "–"


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


def render(env, results, traces, args) -> str:
    names = list(ALLOCATORS)
    head = "| workload | metric | graphalloc | PyTorch native | native, expandable_segments | cudaMallocAsync |"
    lines = [
        "# graphalloc vs PyTorch's allocators, through PyTorch",
        "",
        f"{env['date']}; {env.get('device', '?')}, driver {env.get('driver', '?')}; PyTorch {env['torch']} "
        f"(CUDA {env['cuda']}), Python {env['python']}; graphalloc {env['commit']}. "
        f"Produced by `bench/torch/compare_allocators.py` (each allocator in its own process; "
        f"{args.warmup} warm-up + {args.steps} timed steps, medians).",
        "",
        head,
        "|---|---|---:|---:|---:|---:|",
    ]

    def row(workload, metric, key, fmt):
        lines.append(f"| {workload} | {metric} | " +
                     " | ".join(cell(results[a].get(wl_of[workload], {}), key, fmt) for a in names) + " |")

    wl_of = {"hit path 512 B": "micro", "hit path 1 MiB": "micro", "churn": "micro",
             f"GPT-2 small, batch {args.gpt2_batch}x512": "gpt2", f"ResNet-50, batch {args.resnet_batch}": "resnet50"}
    ns = lambda v: f"{v:,.0f}"  # noqa: E731
    ms = lambda v: f"{v:.1f}"  # noqa: E731
    row("hit path 512 B", "torch.empty + free, ns", "hit_512", ns)
    row("hit path 1 MiB", "torch.empty + free, ns", f"hit_{MiB}", ns)
    row("churn", "ns / op (64 live, 512 B..4 MiB)", "churn", ns)
    for wl in (f"GPT-2 small, batch {args.gpt2_batch}x512", f"ResNet-50, batch {args.resnet_batch}"):
        row(wl, "step time, ms", "step_ms", ms)
        row(wl, "peak reserved, MiB", "peak_reserved", fmt_mib)
        row(wl, "peak allocated, MiB", "peak_allocated", fmt_mib)
    for name, row_t in traces.items():
        ref = TRACE_README.get(name)
        cuda = row_t.get("cuda", {})
        sim = row_t.get("sim", {})
        if cuda:
            g = f"{fmt_mib(cuda.get('peak_reserved_bytes'))} / {fmt_mib(cuda.get('peak_live_bytes'))} = " \
                f"{cuda.get('ratio', 0):.3f}"
        else:
            g = "failed: " + row_t.get("cuda_error", row_t.get("error", "?"))[:60]
        n = e = "–"
        if ref:
            r, a = ref["native"]
            n = f"{r:,} / {a:,} = {r / a:.3f}"
            e = f"≈{ref['expandable_ratio'] * a:,.0f} / {a:,} = {ref['expandable_ratio']:.3f}"
        lines.append(f"| trace {name} | peak reserved / peak live, MiB | {g} | {n} | {e} | – |")
        if cuda:
            lines.append(f"| trace {name} | replay time per op, ns | {cuda.get('ns_per_op', 0):,.0f} | – | – | – |")
        mc = sim.get("min_capacity") if sim else None
        if mc:
            lines.append(f"| trace {name} | smallest capacity that completes (sim), MiB | "
                         f"{fmt_mib(mc.get('bytes'))} = {mc.get('ratio', 0):.3f} x live | – | – | – |")
    lines += [
        "",
        "Notes. Hit path and churn include PyTorch's Python and dispatcher overhead (identical for all columns) "
        "and, for graphalloc, the pluggable-allocator layer (a std::function call and a mutex-guarded "
        "pointer map in PyTorch). Trace rows: graphalloc's numbers from `graphalloc replay --device cuda` "
        "(and `--device sim --find-min-capacity`); PyTorch's from traces/README.md (recorded with PyTorch "
        "2.11 on an H100; the expandable column's reserved MiB is ratio x peak allocated); cudaMallocAsync "
        "was not recorded for them. cuDNN benchmark mode is off for every column (it needs cacheInfo, which "
        "no pluggable allocator provides).",
    ]
    for a in names:
        for wl in WORKLOADS:
            r = results[a].get(wl, {})
            if "error" in r:
                lines.append(f"- {a} / {wl} failed: `{r['error']}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", help="write the Markdown table here")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gpt2-batch", type=int, default=8)
    ap.add_argument("--resnet-batch", type=int, default=64)
    ap.add_argument("--hit-iters", type=int, default=20000)
    ap.add_argument("--churn-ops", type=int, default=20000)
    ap.add_argument("--no-traces", action="store_true")
    ap.add_argument("--min-capacity", action="store_true", help="also --find-min-capacity per trace (sim)")
    ap.add_argument("--commit", default="auto")
    ap.add_argument("--worker-timeout", type=int, default=300)
    ap.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    ap.add_argument("--allocator", choices=list(ALLOCATORS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.allocator, args)), flush=True)
        return
    allocators = [a for a in args.allocators.split(",") if a]
    workloads = [w for w in args.workloads.split(",") if w]
    results = {a: {} for a in ALLOCATORS}
    for wl in workloads:
        for a in allocators:
            results[a][wl] = run_worker(wl, a, args)
    traces = {} if args.no_traces else run_traces(args)
    env = environment(args)
    md = render(env, results, traces, args)
    print(md)
    if args.output:
        Path(args.output).write_text(md)
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "results": results, "traces": traces}, indent=1))


if __name__ == "__main__":
    main()
