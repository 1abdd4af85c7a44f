#!/usr/bin/env python3
"""The rows of docs/benchmarks.md for issue 33, from the JSON files of bench/run_issue33_bench.sh (standard
library only).

Usage: issue33_table.py OUT_DIR

Reads OUT_DIR/graphalloc.json, c10_native.json and c10_expandable.json (whichever exist) and prints, as
Markdown: the hit path by size against c10 and cudaMallocAsync; churn by live-set size with each
allocator's 100k / 64; the trace replays (from an empty allocator right after the release, the same once the
device settled, and with the cache kept) against c10 default and c10 expandable; what a replay from an
empty allocator spends in each driver call; peak reserved / peak live. Each figure is the median over
repetitions, with the coefficient of variation over repetitions in brackets where the run had one; each
ratio compares two rows of one process. Targets (issue 33): hit <= 0.2 of c10 at every size; churn 100k /
64 <= 2.0; cold replays <= 0.5 of both c10 configurations; replays with the cache kept <= 1/3.
"""
import json
import os
import re
import sys

TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
SIZES = {512: "512 B", 4096: "4 KiB", 1 << 20: "1 MiB", 20 << 20: "20 MiB", 256 << 20: "256 MiB"}
MODES = [("replay", "from an empty allocator, right after the release", 0.5),
         ("replay_settled", "from an empty allocator, device settled", 0.5),
         ("replay_warm", "cache kept (steady state)", 1 / 3)]
CALLS = ["create", "map", "access", "unmap", "release", "reserve", "addr_free", "sync"]


def load(path):
    """{run_name: {"median": row, "cv": row}} of one file; {} when it is missing."""
    if not os.path.exists(path):
        return {}
    rows = {}
    for b in json.load(open(path)).get("benchmarks", []):
        if b.get("error_occurred") or b.get("skipped"):
            continue
        # UseRealTime's and Iterations' suffixes (the settled replays run a fixed number of iterations)
        name = re.sub(r"/iterations:\d+", "", b.get("run_name", b["name"]).replace("/real_time", ""))
        if b.get("run_type") == "aggregate":
            rows.setdefault(name, {})[b.get("aggregate_name")] = b
        else:
            rows.setdefault(name, {}).setdefault("median", b)
    return rows


def value(rows, name, cpu=False):
    """(median ns, coefficient of variation or None) of one benchmark, or (None, None)."""
    r = rows.get(name)
    if not r or "median" not in r:
        return None, None
    m = r["median"]
    unit = TO_NS.get(m.get("time_unit", "ns"), 1.0)
    t = (m["cpu_time"] if cpu else m["real_time"]) * unit
    cv = r.get("cv")
    return t, None if cv is None else (cv["cpu_time"] if cpu else cv["real_time"])


def counter(rows, name, key):
    r = rows.get(name, {}).get("median")
    return None if r is None else r.get(key)


def cell(t, cv, scale=1.0, digits=0):
    if t is None:
        return "-"
    s = f"{t / scale:,.{digits}f}"
    return s if cv is None else f"{s} [{100 * cv:.0f}%]"


def ratio(a, b, target=None):
    if a is None or b is None or b == 0:
        return "-"
    r = a / b
    return f"{r:.3f}" if target is None else f"{r:.3f} ({'meets' if r <= target else 'misses'} <= {target:.2g})"


def run_names(rows, workload, impl):
    return sorted({n for n in rows if re.match(rf"^{workload}/{re.escape(impl)}/", n)})


def hit(ga, c10):
    print("### Hit path: allocate + free of one size on one stream (median ns per pair [cv])\n")
    print("| size | graphalloc-cuda | c10 | graphalloc / c10 | graphalloc-cuda (allocator_bench) "
          "| cudaMallocAsync | graphalloc / cudaMallocAsync | graphalloc-sim |")
    print("|---|---:|---:|---|---:|---:|---|---:|")
    for size, label in SIZES.items():
        ours, ours_cv = value(c10, f"hit/graphalloc-cuda/{size}")
        theirs, theirs_cv = value(c10, f"hit/c10/{size}")
        ours2, ours2_cv = value(ga, f"hit/graphalloc-cuda/{size}")
        asyn, asyn_cv = value(ga, f"hit/cudaMallocAsync/{size}")
        sim, sim_cv = value(ga, f"hit/graphalloc-sim/{size}")
        print(f"| {label} | {cell(ours, ours_cv, digits=1)} | {cell(theirs, theirs_cv)} "
              f"| {ratio(ours, theirs, 0.2)} "
              f"| {cell(ours2, ours2_cv, digits=1)} | {cell(asyn, asyn_cv)} | {ratio(ours2, asyn)} "
              f"| {cell(sim, sim_cv, digits=1)} |")
    print()


def churn(ga, c10):
    impls = [("graphalloc-cuda", c10, "peers_c10"), ("c10", c10, "peers_c10"),
             ("graphalloc-cuda", ga, "allocator_bench"), ("cudaMallocAsync", ga, "allocator_bench"),
             ("graphalloc-sim", ga, "allocator_bench"), ("none", ga, "allocator_bench")]
    lives = [64, 1000, 10000, 100000]
    print("### Churn: free a random live block, allocate a random size (median CPU ns per operation [cv])\n")
    print("| allocator (binary) | " + " | ".join(f"{n:,} live" for n in lives) + " | 100k / 64 |")
    print("|---|" + "---:|" * len(lives) + "---|")
    for impl, rows, binary in impls:
        vals = [value(rows, f"churn/{impl}/{n}", cpu=True) for n in lives]
        if all(v[0] is None for v in vals):
            continue
        target = 2.0 if impl.startswith("graphalloc") else None
        print(f"| {impl} ({binary}) | " + " | ".join(cell(t, cv) for t, cv in vals)
              + f" | {ratio(vals[-1][0], vals[0][0], target)} |")
    print("\n`none` is the churn harness alone. Churn reports CPU time, as bench/before_after_table.py does.\n")


def replays(ga, c10, c10x):
    traces = sorted({n.split("/")[2] for rows in (ga, c10, c10x) for n in rows if n.startswith("replay")})
    for mode, title, target in MODES:
        if not any(n.startswith(mode + "/") for rows in (ga, c10, c10x) for n in rows):
            continue
        print(f"### Trace replays, {title} (median ms per replay [cv])\n")
        print("| trace | graphalloc-cuda | c10 default | graphalloc / c10 default "
              "| graphalloc-cuda | c10 expandable | graphalloc / c10 expandable | graphalloc-sim |")
        print("|---|---:|---:|---|---:|---:|---|---:|")
        for trace in traces:
            a, a_cv = value(c10, f"{mode}/graphalloc-cuda/{trace}")
            b, b_cv = value(c10, f"{mode}/c10_native/{trace}")
            x, x_cv = value(c10x, f"{mode}/graphalloc-cuda/{trace}")
            y, y_cv = value(c10x, f"{mode}/c10_expandable/{trace}")
            sim, sim_cv = value(ga, f"{mode}/graphalloc-sim/{trace}")
            ms = 1e6
            print(f"| {trace} | {cell(a, a_cv, ms, 2)} | {cell(b, b_cv, ms, 2)} | {ratio(a, b, target)} "
                  f"| {cell(x, x_cv, ms, 2)} | {cell(y, y_cv, ms, 2)} | {ratio(x, y, target)} "
                  f"| {cell(sim, sim_cv, ms, 2)} |")
        print()


def driver_calls(ga):
    names = [n for n in ga if re.match(r"^replay(_settled)?/graphalloc-(cuda|sim)/", n)]
    if not names:
        return
    print("### Driver calls of one replay from an empty allocator (replay_bench; calls, and us of wall time)\n")
    print("| replay | ms | " + " | ".join(CALLS) + " | driver share |")
    print("|---|---:|" + "---|" * (len(CALLS) + 1))
    for name in sorted(names):
        t, _ = value(ga, name)
        cells = []
        for c in CALLS:
            n, us = counter(ga, name, c + "_n"), counter(ga, name, c + "_us")
            cells.append("-" if n is None else f"{n:,.0f} / {us:,.0f}")
        drv = counter(ga, name, "driver_us")
        share = "-" if drv is None or not t else f"{drv * 1e3 / t:.2f}"
        print(f"| {name} | {t / 1e6:,.2f} | " + " | ".join(cells) + f" | {share} |")
    print("\nPer-handle cost on the device: the `_us` over `_n` of create, map and access.\n")


def fragmentation(ga):
    names = [n for n in ga if re.match(r"^replay/graphalloc-(cuda|sim)/", n)]
    if not names:
        return
    print("### Peak reserved / peak live of a replay from an empty allocator\n")
    print("| replay | peak reserved (MiB) | peak live (MiB) | ratio |")
    print("|---|---:|---:|---:|")
    for name in sorted(names):
        res, live = counter(ga, name, "peak_reserved_bytes"), counter(ga, name, "peak_live_bytes")
        if res is None or not live:
            continue
        print(f"| {name} | {res / 2**20:,.0f} | {live / 2**20:,.0f} | {res / live:.4f} |")
    print()


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    ga = load(os.path.join(argv[1], "graphalloc.json"))
    c10 = load(os.path.join(argv[1], "c10_native.json"))
    c10x = load(os.path.join(argv[1], "c10_expandable.json"))
    if not (ga or c10 or c10x):
        print(f"{argv[1]}: no graphalloc.json, c10_native.json or c10_expandable.json", file=sys.stderr)
        return 1
    hit(ga, c10)
    churn(ga, c10)
    replays(ga, c10, c10x)
    driver_calls(ga)
    fragmentation(ga)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
