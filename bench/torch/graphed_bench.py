"""Training step time and peak reserved memory of graphed PyTorch models: eager, torch.cuda.make_graphed_callables
and graphalloc's (make_graphed_callables, and graphed() over the whole forward, loss and backward).

    python3 bench/torch/graphed_bench.py --reps 5 --out OUT/graphed_bench.json
    python3 bench/torch/graphed_bench.py --same-process --model launch --reps 20 --steps 50   # the two in one process

runs every (model, variant) in its own process, repetitions interleaved (variant order rotated each
round), and prints per model the median step time with its spread (min..max over repetitions), the
speed-up over eager, the ratio to torch.cuda.make_graphed_callables, the host time of the graphed calls
(what the CPU spends per step in the forward and backward calls: where graphalloc's extra work per replay
shows) and the peak reserved memory. Variants "eager" and "torch" run on PyTorch's own allocator; the
graphalloc ones with graphalloc installed. Models: "launch" (32 small layers: launch-bound) and "gpt2"
(GPT-2 small, examples/torch/gpt.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("eager", "torch", "graphalloc", "graphalloc_step")
MODELS = ("launch", "gpt2")


def build(model_name, torch):
    sys.path.insert(0, str(REPO / "examples" / "torch"))
    if model_name == "launch":
        layers = []
        for _ in range(32):
            layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers).cuda()
        x = torch.randn(8, 256, device="cuda")
        target = torch.randn(8, 256, device="cuda")

        def loss_of(out):
            return (out - target).square().mean()
        return model, (x,), loss_of
    from gpt import GPT, GPTConfig, batches
    config = GPTConfig(seq=256)
    model = GPT(config).cuda()
    idx, targets = batches(config, 1, batch=8)[0]
    return model, (idx, targets), lambda out: out


def timed_steps(torch, opt, fwd_bwd, steps):
    """`steps` training steps (zero_grad, fwd_bwd(), opt.step(), synchronized): their medians, the step time in
    ms and the host time of fwd_bwd() in us."""
    times, host = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        h0 = time.perf_counter()
        fwd_bwd()
        h1 = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        host.append((h1 - h0) * 1e6)
    return statistics.median(times), statistics.median(host)


def worker(args):
    if args.variant.startswith("graphalloc"):
        sys.path.insert(0, str(REPO / "python"))
        import graphalloc.torch as gat
        gat.install()
    import torch
    torch.manual_seed(0)
    model, sample, loss_of = build(args.model, torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if args.variant == "torch":
        run = torch.cuda.make_graphed_callables(model, sample)
    elif args.variant == "graphalloc":
        import graphalloc.torch as gat
        run = gat.make_graphed_callables(model, sample)
    else:
        run = model

    def fwd_bwd(*inputs):
        loss = loss_of(run(*inputs))
        loss.backward()
        return loss

    if args.variant == "graphalloc_step":
        import graphalloc.torch as gat
        fwd_bwd = gat.graphed(fwd_bwd, modules=[model])
    timed_steps(torch, opt, lambda: fwd_bwd(*sample), args.warmup)
    step_ms, host_us = timed_steps(torch, opt, lambda: fwd_bwd(*sample), args.steps)
    print(json.dumps({"model": args.model, "variant": args.variant, "step_ms": step_ms,
                      "host_us": host_us, "peak_reserved": torch.cuda.max_memory_reserved(),
                      "allocator": torch.cuda.get_allocator_backend(), "device": torch.cuda.get_device_name()}))


def same_process(args):
    """torch.cuda.make_graphed_callables and graphalloc's in one process (graphalloc installed, so PyTorch's
    graphs draw from graphalloc's graph pools too), on two copies of the model, in alternating blocks of
    steps: the ratio of their step times without the noise between processes (CPU placement, clocks), which
    on a launch-bound model is larger than the difference measured."""
    sys.path.insert(0, str(REPO / "python"))
    import graphalloc.torch as gat
    gat.install()
    import torch
    runs = {}
    for variant in ("torch", "graphalloc"):
        torch.manual_seed(0)
        model, sample, loss_of = build(args.model, torch)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        graphed = (torch.cuda.make_graphed_callables if variant == "torch" else gat.make_graphed_callables)(model, sample)
        runs[variant] = (graphed, sample, loss_of, opt)

    def block(variant, steps):
        graphed, sample, loss_of, opt = runs[variant]
        return timed_steps(torch, opt, lambda: loss_of(graphed(*sample)).backward(), steps)

    for variant in runs:
        block(variant, args.warmup)
    rounds = []
    for r in range(args.reps):
        order = ("torch", "graphalloc") if r % 2 == 0 else ("graphalloc", "torch")
        rounds.append({v: block(v, args.steps) for v in order})
    ratios = sorted(x["graphalloc"][0] / x["torch"][0] for x in rounds)
    host_delta = sorted(x["graphalloc"][1] - x["torch"][1] for x in rounds)
    result = {"model": args.model, "mode": "same_process", "rounds": args.reps, "steps_per_round": args.steps,
              "torch_step_ms": statistics.median(x["torch"][0] for x in rounds),
              "graphalloc_step_ms": statistics.median(x["graphalloc"][0] for x in rounds),
              "ratio_median": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1],
              "host_us_delta_median": statistics.median(host_delta),
              "host_us_delta_min": host_delta[0], "host_us_delta_max": host_delta[-1],
              "device": torch.cuda.get_device_name()}
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def driver(args):
    results = []
    variants = list(args.variants)
    for rep in range(args.reps):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for model in args.models:
            for variant in order:
                cmd = [sys.executable, __file__, "--worker", "--model", model, "--variant", variant,
                       "--steps", str(args.steps), "--warmup", str(args.warmup)]
                env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
                r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
                line = [x for x in r.stdout.splitlines() if x.startswith("{")]
                if r.returncode != 0 or not line:
                    print(f"{model}/{variant} failed ({r.returncode}): {r.stderr[-2000:]}", file=sys.stderr)
                    continue
                results.append(dict(json.loads(line[-1]), rep=rep))
                print(json.dumps(results[-1]), flush=True)  # a run cut short still leaves its figures
                if args.out:
                    Path(args.out).write_text(json.dumps(results, indent=1))
    table(results)


def table(results):
    print("| model | variant | step ms (median, min..max) | vs eager | vs torch | host us per step | peak reserved MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for model in MODELS:
        med = {}
        for variant in VARIANTS:
            rows = [r for r in results if r["model"] == model and r["variant"] == variant]
            if rows:
                med[variant] = (statistics.median(r["step_ms"] for r in rows), rows)
        for variant, (m, rows) in med.items():
            lo, hi = min(r["step_ms"] for r in rows), max(r["step_ms"] for r in rows)
            vs_eager = med["eager"][0] / m if "eager" in med else float("nan")
            vs_torch = m / med["torch"][0] if "torch" in med else float("nan")
            host = statistics.median(r["host_us"] for r in rows)
            peak = statistics.median(r["peak_reserved"] for r in rows) / 2**20
            print(f"| {model} | {variant} | {m:.3f} ({lo:.3f}..{hi:.3f}) | {vs_eager:.2f}x | {vs_torch:.3f} | "
                  f"{host:.1f} | {peak:,.0f} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--model", choices=MODELS, default="launch")
    p.add_argument("--variant", choices=VARIANTS, default="eager")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out")
    p.add_argument("--same-process", action="store_true",
                   help="torch.cuda's and graphalloc's make_graphed_callables in one process, alternating blocks "
                        "of --steps steps for --reps rounds (--model): their step-time ratio per round")
    args = p.parse_args()
    if args.same_process:
        same_process(args)
    else:
        worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
