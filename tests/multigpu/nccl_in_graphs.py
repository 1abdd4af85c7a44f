"""NCCL collectives inside CUDA graphs on expandable segments: the torchtitan case (issue 21, item 1).

One process per GPU (torch.multiprocessing, NCCL backend), NCCL's graph registration left on
(NCCL_GRAPH_REGISTER unset: NCCL registers the buffers a captured collective uses, resolving each pointer to
the physical handle under it). Each rank captures an all-reduce and an all-gather in `torch.cuda.graph`, and
the same step under `torch.compile(mode="reduce-overhead")`, replays each REPLAYS times with fresh inputs
copied into the static inputs, and compares every replay with the same collectives run eagerly.

    python nccl_in_graphs.py --allocator graphalloc --config expandable_segments:True,handle_aligned:True
    python nccl_in_graphs.py --allocator native --config expandable_segments:True

`--allocator native` runs PyTorch's own allocator with PYTORCH_CUDA_ALLOC_CONF=<config>, for comparison.
Prints one JSON line per rank ("RESULT {...}") and exits 0 when every rank matched eager, 1 otherwise, 77
(skip) without PyTorch, NCCL or a GPU. World size: --world, default min(2, GPUs); one rank still runs every
collective through NCCL."""
import argparse
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from ranks import SKIP, join_group, run_ranks, world_or_skip  # noqa: E402

# Sizes: small enough that 100 replays are quick, large enough that the buffers span several 2 MiB pages and,
# in expandable segments, can straddle a physical handle's end (the case NCCL's registration gets wrong).
ELEMENTS = (3 << 20) + 12345  # floats: ~12 MiB, not a multiple of any page size


def setup_allocator(args) -> None:
    """Before CUDA starts in this process: graphalloc as PyTorch's allocator, or PyTorch's own configured."""
    if args.allocator == "graphalloc":
        import graphalloc.torch as gat
        gat.install(config=args.config or None)
    else:
        if args.config:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.config


def worker(rank: int, world: int, args, port: int) -> None:
    if args.hang_timeout > 0:  # a rank stuck in a collective prints where, instead of hanging silently
        import faulthandler
        faulthandler.dump_traceback_later(args.hang_timeout, exit=True)
    setup_allocator(args)
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    join_group(rank, world, port)
    group = dist.group.WORLD
    result = {"rank": rank, "world": world, "allocator": args.allocator, "config": args.config,
              "nccl_graph_register": os.environ.get("NCCL_GRAPH_REGISTER", "(unset)"),
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(rank), "failures": []}
    if args.allocator == "graphalloc":
        import graphalloc.torch as gat
        result["backend"] = gat.backend()

    def inputs(step: int):
        # Different on every rank and every step; exact in float32 (small integers).
        base = torch.arange(ELEMENTS, device="cuda", dtype=torch.float32) % 251
        return base + float(rank * 1000 + step)

    def eager(x):
        y = x * 2
        dist.all_reduce(y)
        g = torch.empty(world * x.numel(), device="cuda", dtype=x.dtype)
        dist.all_gather_into_tensor(g, x)
        return y + 1, g

    def check(kind: str, step: int, got, want) -> None:
        for name, a, b in zip(("all_reduce", "all_gather"), got, want):
            if not torch.equal(a, b):
                bad = (a != b).nonzero()
                result["failures"].append(f"{kind} replay {step}: {name} differs from eager at "
                                          f"{bad.numel()} elements, first {bad[:1].tolist()}")

    def progress(what: str) -> None:
        print(f"rank {rank}: {what}", flush=True)

    try:
        # Warm up NCCL and the allocator on a side stream, as torch.cuda.graph's docs ask.
        static_x = inputs(0)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                eager(static_x)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()

        progress("warm")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = eager(static_x)
        progress("captured")
        for step in range(1, args.replays + 1):
            static_x.copy_(inputs(step))
            graph.replay()
            want = eager(inputs(step))
            check("torch.cuda.graph", step, static_out, want)
        result["cuda_graph_replays"] = args.replays
        progress(f"{args.replays} torch.cuda.graph replays checked")
        del graph, static_out

        def compiled_step(x):
            y = funcol.all_reduce(x * 2, "sum", group)
            g = funcol.all_gather_tensor(x, 0, group)
            return y + 1, g

        compiled = torch.compile(compiled_step, mode="reduce-overhead")
        for step in range(1, args.replays + 1):
            if step == 4:
                progress("compiled and recorded")
            x = inputs(step)
            got = compiled(x)
            got = tuple(t.clone() for t in got)  # the next replay overwrites cudagraph outputs
            want = eager(x)
            check("reduce-overhead", step, got, want)
        torch.cuda.synchronize()
        result["compiled_replays"] = args.replays
        try:
            from torch._inductor import metrics  # noqa: F401
            from torch._dynamo.utils import counters
            result["cudagraph_skips"] = dict(counters["inductor"]).get("cudagraph_skips", 0)
        except Exception as e:  # the counters' names move between versions: report, do not fail
            result["cudagraph_skips"] = f"unknown ({e})"
        if args.allocator == "graphalloc":
            import graphalloc.torch as gat
            result["graphalloc_config"] = gat.config(rank)
    except Exception as e:
        result["failures"].append(f"exception: {type(e).__name__}: {e}")
        traceback.print_exc()
    result["ok"] = not result["failures"]
    print("RESULT " + json.dumps(result), flush=True)
    # Not dist.destroy_process_group(): with CUDA graphs that captured NCCL collectives still alive (the
    # compiled step's), it waits forever, with either allocator (seen on two H200s, PyTorch 2.11, NCCL
    # 2.28.9). The process ends, and NCCL's resources with it.
    sys.stdout.flush()
    os._exit(0 if result["ok"] else 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--allocator", choices=("graphalloc", "native"), default="graphalloc")
    p.add_argument("--config", default="expandable_segments:True")
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--world", type=int, default=0)
    p.add_argument("--hang-timeout", type=float, default=0,
                   help="seconds after which a rank prints its Python stack and exits (0: never)")
    args = p.parse_args()
    world = world_or_skip(args.world)
    if world is None:
        return SKIP
    return run_ranks(worker, world, args)

if __name__ == "__main__":
    sys.exit(main())
