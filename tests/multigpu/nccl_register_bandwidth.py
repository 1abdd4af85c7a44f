"""All-reduce bus bandwidth, NCCL-registered graphalloc buffers against unregistered ones (issue 21, item 2).

One process per GPU (NCCL backend, graphalloc as PyTorch's allocator). "registered": the tensors live in a
torch.cuda.MemPool that graphalloc.torch.register_nccl() made a communication pool of the group's NCCL
communicator (every chunk registered with ncclCommRegister once, when mapped, and kept mapped);
"unregistered": the same sizes in the ordinary cache. For each size, REPS timed all-reduces after WARMUP,
repeated ROUNDS times with the two kinds interleaved; prints one table (median and spread of the rounds) and
a JSON line ("RESULT {...}") from rank 0.

    python nccl_register_bandwidth.py [--min-mib 1] [--max-mib 1024] [--rounds 5]

Exits 77 (skip) without PyTorch, NCCL or a GPU; one GPU runs one rank (no traffic, registration still
exercised)."""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from ranks import SKIP, join_group, run_ranks, world_or_skip  # noqa: E402


def worker(rank: int, world: int, args, port: int) -> None:
    import graphalloc.torch as gat
    gat.install(config=args.config)
    import torch
    import torch.distributed as dist

    join_group(rank, world, port)
    group = dist.group.WORLD
    dist.barrier()

    pool = torch.cuda.MemPool()
    registration = gat.register_nccl(pool, group)
    sizes = []
    mib = args.min_mib
    while mib <= args.max_mib:
        sizes.append(mib)
        mib *= 4
    tensors = {}
    for mib in sizes:
        n = mib * (1 << 20) // 4
        with torch.cuda.use_mem_pool(pool):
            reg = torch.full((n,), float(rank + 1), device="cuda")
        tensors[mib] = {"registered": reg, "unregistered": torch.full((n,), float(rank + 1), device="cuda")}
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    factor = 2.0 * (world - 1) / world if world > 1 else 1.0
    times = {mib: {"registered": [], "unregistered": []} for mib in sizes}
    for _ in range(args.rounds):
        for mib in sizes:
            for kind in ("unregistered", "registered"):
                t = tensors[mib][kind]
                for _ in range(args.warmup):
                    dist.all_reduce(t)
                torch.cuda.synchronize()
                dist.barrier()
                start.record()
                for _ in range(args.reps):
                    dist.all_reduce(t)
                stop.record()
                torch.cuda.synchronize()
                times[mib][kind].append(start.elapsed_time(stop) / 1e3 / args.reps)
    # Correctness after timing: one all-reduce of rank+1 everywhere gives world*(world+1)/2 everywhere.
    failures = []
    for mib in sizes:
        for kind in ("unregistered", "registered"):
            t = tensors[mib][kind]
            t.fill_(float(rank + 1))
            dist.all_reduce(t)
            want = world * (world + 1) / 2
            if not bool((t == want).all()):
                failures.append(f"{kind} {mib} MiB: all_reduce gave {t.unique()[:4].tolist()}, not {want}")
    ok = not failures
    rows = []
    for mib in sizes:
        row = {"size_mib": mib}
        for kind in ("unregistered", "registered"):
            ts = times[mib][kind]
            busbw = [mib * (1 << 20) * factor / t / 1e9 for t in ts]
            row[kind] = {"busbw_gbs_median": statistics.median(busbw), "busbw_gbs_min": min(busbw),
                         "busbw_gbs_max": max(busbw), "time_us_median": statistics.median(ts) * 1e6}
        row["ratio_registered_over_unregistered"] = (row["registered"]["busbw_gbs_median"] /
                                                     row["unregistered"]["busbw_gbs_median"])
        rows.append(row)
    stats = gat.pool_stats(pool) if hasattr(gat, "pool_stats") else {}
    result = {"rank": rank, "world": world, "device": torch.cuda.get_device_name(rank),
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch": torch.__version__,
              "config": args.config, "rounds": args.rounds, "reps": args.reps, "rows": rows,
              "registration": registration.stats() if hasattr(registration, "stats") else str(registration),
              "pool_stats": stats, "failures": failures, "ok": ok}
    if rank == 0:
        print(f"{'size':>8} | {'unregistered GB/s':>24} | {'registered GB/s':>24} | ratio")
        for r in rows:
            u, g = r["unregistered"], r["registered"]
            print(f"{r['size_mib']:>5} MiB | {u['busbw_gbs_median']:8.1f} [{u['busbw_gbs_min']:6.1f},"
                  f"{u['busbw_gbs_max']:6.1f}] | {g['busbw_gbs_median']:8.1f} [{g['busbw_gbs_min']:6.1f},"
                  f"{g['busbw_gbs_max']:6.1f}] | {r['ratio_registered_over_unregistered']:.3f}")
        print("RESULT " + json.dumps(result), flush=True)
    del tensors
    registration.close()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="expandable_segments:True,handle_aligned:True")
    p.add_argument("--min-mib", type=int, default=1)
    p.add_argument("--max-mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--world", type=int, default=0)
    args = p.parse_args()
    world = world_or_skip(args.world)
    if world is None:
        return SKIP
    return run_ranks(worker, world, args, port_salt=7)

if __name__ == "__main__":
    sys.exit(main())
