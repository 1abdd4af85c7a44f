#!/usr/bin/env python3
"""Markdown tables of the medians in allocator_bench / peers_c10 JSON files (standard library only).

Usage: allocator_bench_table.py FILE.json [FILE.json ...]

Reads the aggregate rows named "<run_name>_median" (from --benchmark_repetitions=N
--benchmark_report_aggregates_only=true) and prints, in ns per pair or per operation:
  - the hit path by size, with graphalloc/c10 (both from the peers_c10 binary, so measured in one process)
    and graphalloc/cudaMallocAsync (both from allocator_bench);
  - churn by live-set size, with the 100k/64 ratio per implementation (target: graphalloc <= 2);
  - threads: total pairs/s by thread count, with the speed-up over 1 thread (target: 8 threads >= 4x).
"""
import json
import os
import re
import sys

SIZE_NAMES = {512: "512 B", 4096: "4 KiB", 1 << 20: "1 MiB", 20 << 20: "20 MiB", 256 << 20: "256 MiB"}
TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def load(paths):
    """{binary: {(workload, impl, param, threads): row}} of the median aggregates."""
    out = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        binary = os.path.basename(data.get("context", {}).get("executable", path))
        rows = out.setdefault(binary, {})
        for b in data.get("benchmarks", []):
            if b.get("run_type") != "aggregate" or b.get("aggregate_name") != "median":
                continue
            if b.get("error_occurred") or b.get("skipped"):
                continue
            m = re.match(r"^(hit|churn|threads)/([^/]+)/(\d+)", b.get("run_name", b["name"]))
            if not m:
                continue
            key = (m.group(1), m.group(2), int(m.group(3)), int(b.get("threads", 1)))
            rows[key] = b
    return out


def ns(row):
    return row["real_time"] * TO_NS.get(row.get("time_unit", "ns"), 1.0)


def fmt(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def get(data, binary, workload, impl, param, threads=1):
    row = data.get(binary, {}).get((workload, impl, param, threads))
    return None if row is None else ns(row)


def hit_table(data):
    gpu = "graphalloc-cuda"
    print("### Hit path: allocate + free of one size on one stream (median ns per pair)\n")
    print("| size | graphalloc-sim | graphalloc-cuda | cudaMallocAsync | cudaMalloc | graphalloc-cuda (peers_c10) "
          "| c10 | graphalloc/cudaMallocAsync | graphalloc/c10 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size, label in SIZE_NAMES.items():
        sim = get(data, "allocator_bench", "hit", "graphalloc-sim", size)
        ours = get(data, "allocator_bench", "hit", gpu, size)
        mallocasync = get(data, "allocator_bench", "hit", "cudaMallocAsync", size)
        cudamalloc = get(data, "allocator_bench", "hit", "cudaMalloc", size)
        ours_c10bin = get(data, "peers_c10", "hit", gpu, size)
        c10 = get(data, "peers_c10", "hit", "c10", size)
        print(f"| {label} | {fmt(sim)} | {fmt(ours)} | {fmt(mallocasync)} | {fmt(cudamalloc)} | {fmt(ours_c10bin)} "
              f"| {fmt(c10)} | {fmt(ratio(ours, mallocasync), 3)} | {fmt(ratio(ours_c10bin, c10), 3)} |")
    print("\nTarget: both ratios <= 0.2 (1/5). Each ratio compares two rows of the same binary.\n")


def churn_table(data):
    impls = []
    for binary in ("allocator_bench", "peers_c10"):
        for (workload, impl, _, _) in sorted(data.get(binary, {})):
            if workload == "churn" and (binary, impl) not in impls:
                impls.append((binary, impl))
    if not impls:
        return
    lives = sorted({k[2] for rows in data.values() for k in rows if k[0] == "churn"})
    print("### Churn: free a random live block, allocate a random size (median ns per operation)\n")
    print("| implementation (binary) | " + " | ".join(f"{n:,} live" for n in lives) + " | 100k / 64 |")
    print("|---|" + "---|" * (len(lives) + 1))
    for binary, impl in impls:
        vals = [get(data, binary, "churn", impl, n) for n in lives]
        scale = ratio(get(data, binary, "churn", impl, 100000), get(data, binary, "churn", impl, 64))
        print(f"| {impl} ({binary}) | " + " | ".join(fmt(v) for v in vals) + f" | {fmt(scale, 2)} |")
    print("\nTarget: graphalloc's 100k / 64 <= 2. `none` is the harness alone (no allocator).\n")


def threads_table(data):
    rows = data.get("allocator_bench", {})
    impls = sorted({k[1] for k in rows if k[0] == "threads"})
    if not impls:
        return
    counts = sorted({k[3] for k in rows if k[0] == "threads"})
    print("### Threads: each on its own stream, 4 KiB hit pairs (median total pairs per second)\n")
    print("| implementation | " + " | ".join(f"{n} thr" for n in counts) + " | 8 thr / 1 thr |")
    print("|---|" + "---|" * (len(counts) + 1))
    for impl in impls:
        rate = {}
        for n in counts:
            row = rows.get(("threads", impl, 4096, n))
            rate[n] = None if row is None else row.get("items_per_second")
        cells = " | ".join("-" if rate[n] is None else f"{rate[n] / 1e6:.2f} M/s" for n in counts)
        print(f"| {impl} | {cells} | {fmt(ratio(rate.get(8), rate.get(1)), 2)} |")
    print("\nTarget: 8 threads >= 4x the throughput of 1 (on the GPU machine's 16 cores).\n")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    data = load(argv[1:])
    hit_table(data)
    churn_table(data)
    threads_table(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
