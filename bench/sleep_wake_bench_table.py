#!/usr/bin/env python3
"""A Markdown table of issue 22's ratios from sleep_wake_bench JSON runs (standard library only).

Usage: sleep_wake_bench --benchmark_out=sleep.json [--benchmark_repetitions=N]
       sleep_wake_bench_table.py sleep.json [more.json ...] [--device DEVICE]

One row per device, size and comparison (DEVICE: "cuda", "sim" or "all", the default):
  sleep, discard   sleep/<device>/<GiB>/discard time over bare_unmap_release time     target <= 1.10
  wake, discard    wake/<device>/<GiB>/discard time over bare_create_map time          target <= 1.10
  sleep, backup    sleep/.../backup bytes/s over pinned_copy_d2h bytes/s               target >= 0.90
  wake, backup, settled   wake/.../backup_settled bytes/s over pinned_copy_h2d bytes/s   target >= 0.90
  wake, backup     wake/.../backup bytes/s (right after its sleep) over pinned_copy_h2d bytes/s, and over
                   bare_wake_backup bytes/s (the bare calls, also right after a release); no target
and, for the backups, the same against a copy that also pins (d2h + cuMemHostAlloc) or unpins (h2d +
cuMemFreeHost) its host buffer once, as every backed-up sleep and wake does; no target. Each figure is the
median over the runs found (repetitions, several files); "n" says how many. The discard rows also give the
handles each side unmapped or created per iteration, which should be equal. The header comment of
bench/sleep_wake_bench.cc says what each benchmark does.
"""
import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
NAME = re.compile(
    r"^(sleep|wake|bare_unmap_release|bare_create_map|bare_wake_backup|pinned_copy_d2h|pinned_copy_h2d)"
    r"/([^/]+)/(\d+)(?:/(discard|backup_settled|backup))?(?:/iterations:\d+)?(?:/manual_time)?$")


def load(paths):
    """{(kind, device, gib, mode): {"ms": [...], "bps": [...], counter: [...]}}, errors, contexts."""
    runs = defaultdict(lambda: defaultdict(list))
    medians = defaultdict(lambda: defaultdict(list))  # from aggregate-only output
    errors = {}
    contexts = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        contexts.append(data.get("context", {}))
        for b in data.get("benchmarks", []):
            m = NAME.match(b.get("run_name", b["name"]))
            if not m:
                continue
            key = (m.group(1), m.group(2), int(m.group(3)), m.group(4) or "")
            if b.get("error_occurred"):
                errors[key] = b.get("error_message", "?")
                continue
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") != "median":
                    continue
                target = medians[key]
            else:
                target = runs[key]
            target["ms"].append(b["real_time"] * TO_MS.get(b.get("time_unit", "ms"), 1.0))
            for field, value in b.items():
                if isinstance(value, (int, float)) and field not in ("real_time", "cpu_time"):
                    target[field].append(value)
    for key, values in medians.items():
        runs.setdefault(key, values)
    return runs, errors, contexts


def median(runs, key, field):
    values = runs.get(key, {}).get(field)
    return statistics.median(values) if values else None


def count(runs, key):
    return len(runs.get(key, {}).get("ms", []))


def fmt(value, digits=None):
    """Three significant digits (or `digits` decimals), thousands separated."""
    if value is None:
        return "-"
    if digits is not None:
        return f"{value:,.{digits}f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", help="sleep_wake_bench JSON output files")
    parser.add_argument("--device", default="all", help='"cuda", "sim" or "all"')
    args = parser.parse_args(argv[1:])
    device_filter = args.device
    paths = args.json
    runs, errors, contexts = load(paths)
    for ctx in contexts[:1]:
        print(f"device: {ctx.get('cuda_device', '?')} (sim: {ctx.get('sim_device', '?')}); "
              f"host: {ctx.get('host_name', '?')}, {ctx.get('date', '?')}\n")
    print("| device | GiB | comparison | graphalloc | baseline | ratio | target | handles | n |")
    print("|---|---:|---|---:|---:|---:|---|---:|---:|")
    sizes = sorted({(k[1], k[2]) for k in list(runs) + list(errors)})
    for device, gib in sizes:
        if device_filter != "all" and device != device_filter:
            continue
        rows = [
            ("sleep, discard (ms)", ("sleep", "discard"), ("bare_unmap_release", ""), "time", "unmap_n", "<= 1.10"),
            ("wake, discard (ms)", ("wake", "discard"), ("bare_create_map", ""), "time", "create_n", "<= 1.10"),
            ("sleep, backup (GB/s)", ("sleep", "backup"), ("pinned_copy_d2h", ""), "rate", None, ">= 0.90"),
            ("wake, backup, settled (GB/s)", ("wake", "backup_settled"), ("pinned_copy_h2d", ""), "rate", None,
             ">= 0.90"),
            ("wake, backup, right after its sleep (GB/s)", ("wake", "backup"), ("pinned_copy_h2d", ""), "rate",
             None, ""),
            ("wake, backup, right after its sleep, vs the bare calls (GB/s)", ("wake", "backup"),
             ("bare_wake_backup", ""), "rate", None, ""),
            ("sleep, backup vs copy + cuMemHostAlloc (GB/s)", ("sleep", "backup"), ("pinned_copy_d2h", ""),
             "rate+host_alloc_once_us", None, ""),
            ("wake, backup vs copy + cuMemFreeHost (GB/s)", ("wake", "backup"), ("pinned_copy_h2d", ""),
             "rate+host_free_once_us", None, ""),
        ]
        for label, (kind, mode), (base_kind, base_mode), how, handles, target in rows:
            ours = (kind, device, gib, mode)
            base = (base_kind, device, gib, base_mode)
            problems = [f"{k[0]}: {errors[k]}" for k in (ours, base) if k in errors]
            if problems:
                print(f"| {device} | {gib} | {label} | error: {'; '.join(problems)} | | | | | |")
                continue
            if ours not in runs or base not in runs:
                continue
            if how == "time":
                a, b = median(runs, ours, "ms"), median(runs, base, "ms")
                ratio = a / b if a and b else None
            else:
                a = median(runs, ours, "bytes_per_second")
                b = median(runs, base, "bytes_per_second")
                if a is not None:
                    a /= 1e9
                if b is not None:
                    b /= 1e9
                if "+" in how and b:
                    # The copy's time per iteration plus its one pinning or unpinning.
                    extra_s = (median(runs, base, how.split("+", 1)[1]) or 0) / 1e6
                    copy_s = gib * (1 << 30) / (b * 1e9)
                    b = gib * (1 << 30) / (copy_s + extra_s) / 1e9
                ratio = a / b if a and b else None
            met = ""
            if ratio is not None and target:
                ok = ratio <= 1.10 if target.startswith("<=") else ratio >= 0.90
                met = " (met)" if ok else " (missed)"
            hs = "-"
            if handles:
                ha, hb = median(runs, ours, handles), median(runs, base, handles)
                hs = f"{fmt(ha, 0)} / {fmt(hb, 0)}"
            print(f"| {device} | {gib} | {label} | {fmt(a)} | {fmt(b)} | {fmt(ratio)} | {target}{met} | {hs} | "
                  f"{count(runs, ours)} / {count(runs, base)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
