#!/usr/bin/env python3
"""The before/after table of bench/run_before_after.sh: reads DIR/before_R.json and DIR/after_R.json (Google
Benchmark JSON with aggregates), and prints, per benchmark both sides ran, the median over rounds of each
round's median, the range over rounds, and after / before (in each benchmark's own unit: ns for the hit
path and churn, ms for trace replays). With --json FILE, also writes those figures and
the benchmark context as one compact JSON file. A round whose JSON is incomplete (a killed run) is skipped
and named.

    python3 bench/before_after_table.py DIR [--json FILE]
"""
import argparse
import glob
import json
import os
import statistics
import sys


def load(directory, side):
    rows, context, skipped = {}, None, []
    for path in sorted(glob.glob(os.path.join(directory, f"{side}_[0-9]*.json"))):
        try:
            data = json.load(open(path))
        except json.JSONDecodeError:
            skipped.append(os.path.basename(path))
            continue
        context = context or data.get("context")
        for b in data["benchmarks"]:
            if b.get("aggregate_name") != "median":
                continue
            # Churn reports CPU time (its harness pauses timing); the rest wall time.
            t = b["cpu_time"] if b["run_name"].startswith("churn") else b["real_time"]
            rows.setdefault(b["run_name"].replace("/real_time", ""), []).append((t, b.get("time_unit", "ns")))
    return rows, context, skipped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--json")
    args = ap.parse_args()
    before, _, skipped_b = load(args.dir, "before")
    after, context, skipped_a = load(args.dir, "after")
    if not before or not after:
        sys.exit(f"{args.dir}: no complete before_*.json and after_*.json")
    out = []
    for name, a in after.items():
        b = before.get(name)
        if not b:
            continue
        unit = a[0][1]
        b, a = [t for t, _ in b], [t for t, _ in a]
        mb, ma = statistics.median(b), statistics.median(a)
        out.append({"benchmark": name, "unit": unit, "before": mb, "before_range": [min(b), max(b)],
                    "after": ma, "after_range": [min(a), max(a)], "after_over_before": ma / mb,
                    "rounds": [len(b), len(a)]})
    ctx = context or {}
    print(f"host {ctx.get('host_name')}, {ctx.get('num_cpus')} CPUs, {ctx.get('date')}"
          + (f"; incomplete, skipped: {', '.join(skipped_b + skipped_a)}" if skipped_b + skipped_a else ""))
    print("| benchmark | unit | before (range) | after (range) | after / before | rounds |")
    print("|---|---|---:|---:|---:|---:|")
    for r in out:
        d = 2 if r["unit"] == "ms" else 1
        lo_b, hi_b = r["before_range"]
        lo_a, hi_a = r["after_range"]
        print(f"| {r['benchmark']} | {r['unit']} | {r['before']:.{d}f} ({lo_b:.{d}f}-{hi_b:.{d}f}) "
              f"| {r['after']:.{d}f} ({lo_a:.{d}f}-{hi_a:.{d}f}) "
              f"| {r['after_over_before']:.3f} | {r['rounds'][0]} / {r['rounds'][1]} |")
    if args.json:
        keep = {k: ctx.get(k) for k in ("date", "host_name", "num_cpus", "mhz_per_cpu", "library_build_type",
                                        "cuda_device", "sim_device")}
        with open(args.json, "w") as f:
            json.dump({"context": keep, "skipped": skipped_b + skipped_a, "rows": out}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
