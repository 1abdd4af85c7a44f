#!/usr/bin/env python3
"""Markdown tables of the trace-replay benchmarks (replay_bench / peers_c10 JSON files; standard library only).

Usage: replay_bench_table.py FILE.json [FILE.json ...]

Reads rows named "replay/<impl>/<trace>", "replay_settled/<impl>/<trace>" and "replay_warm/<impl>/<trace>"
(the "_median" aggregates when the run had repetitions, else the plain rows) and prints, per mode and trace,
the time per replay (ms) and per operation (ns) of each implementation, and graphalloc-cuda / c10_<config>
where both ran in one process (one peers_c10 run per c10 configuration). Target (issue 4): graphalloc at most
1/3 of c10's time.
"""
import json
import os
import re
import sys

TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
MODES = {
    "replay": "Replay from an empty allocator (cache emptied between replays, untimed)",
    "replay_settled": "Replay from an empty allocator, the device settled after each release (untimed pause)",
    "replay_warm": "Replay with the cache the previous replay left (steady state)",
}


def load(paths):
    """[(label, {(mode, impl, trace): row})], one entry per file, in order."""
    out = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        label = os.path.splitext(os.path.basename(path))[0]
        rows, plain = {}, {}
        for b in data.get("benchmarks", []):
            if b.get("error_occurred") or b.get("skipped"):
                continue
            m = re.match(r"^(replay|replay_settled|replay_warm)/([^/]+)/([^/]+)", b.get("run_name", b["name"]))
            if not m:
                continue
            key = m.groups()
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    rows[key] = b
            else:
                plain.setdefault(key, b)
        for key, b in plain.items():
            rows.setdefault(key, b)
        out.append((label, rows))
    return out


def ms(row):
    return None if row is None else row["real_time"] * TO_MS.get(row.get("time_unit", "ms"), 1.0)


def cell(row):
    if row is None:
        return "-"
    ns_op = row.get("ns_per_op")
    return f"{ms(row):,.2f} ms ({ns_op:,.0f} ns/op)" if ns_op is not None else f"{ms(row):,.2f} ms"


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    files = load(argv[1:])
    traces = sorted({k[2] for _, rows in files for k in rows})
    for mode, title in MODES.items():
        if not any(k[0] == mode for _, rows in files for k in rows):
            continue
        # graphalloc rows of binaries without c10 (replay_bench), then one column pair per c10 run.
        solo = [(label, impl) for label, rows in files if not any(k[1].startswith("c10") for k in rows)
                for impl in sorted({k[1] for k in rows if k[0] == mode})]
        pairs = []
        for label, rows in files:
            for impl in sorted({k[1] for k in rows if k[0] == mode and k[1].startswith("c10")}):
                pairs.append((label, impl))
        header = ["trace", "ops"] + [f"{impl} ({label})" for label, impl in solo]
        for label, impl in pairs:
            header += [f"graphalloc-cuda ({label})", impl, f"graphalloc / {impl}"]
        print(f"### {title}: median time per replay\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        by_label = dict(files)
        for trace in traces:
            ops = None
            cells = []
            for label, impl in solo:
                row = by_label[label].get((mode, impl, trace))
                ops = ops or (row or {}).get("ops")
                cells.append(cell(row))
            for label, impl in pairs:
                ours = by_label[label].get((mode, "graphalloc-cuda", trace))
                theirs = by_label[label].get((mode, impl, trace))
                ops = ops or (theirs or {}).get("ops")
                r = None if ours is None or theirs is None or ms(theirs) == 0 else ms(ours) / ms(theirs)
                verdict = "-" if r is None else f"{r:.3f} ({'meets' if r <= 1 / 3 else 'misses'} <= 0.333)"
                cells += [cell(ours), cell(theirs), verdict]
            print(f"| {trace} | {'-' if ops is None else f'{ops:,.0f}'} | " + " | ".join(cells) + " |")
        print("\nEach ratio compares two rows of one process (the same peers_c10 run).\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
