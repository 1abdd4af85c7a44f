#!/usr/bin/env python3
"""A Markdown table of an expandable_bench JSON run (standard library only).

Usage: expandable_bench --benchmark_format=json > grow.json; expandable_bench_table.py grow.json [DEVICE]

One row per benchmark (of DEVICE, "cuda" by default; "all" for every device): time per GiB of growth
(wall and CPU), handles, and per driver call kind of the timed part "wall us / CPU us" per iteration
(x calls when more than one), then what is left outside the driver (rest) and the untimed teardown's
release, unmap and address-free time. Wall far above CPU in a call means the thread waited there (for the GPU or the
kernel driver). The header comment of bench/expandable_bench.cc says how to read the variants.
"""
import json
import re
import sys

TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
KINDS = ["reserve", "create", "map", "access", "sync", "other"]


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    device = argv[2] if len(argv) > 2 else "cuda"
    with open(argv[1]) as f:
        data = json.load(f)
    ctx = data.get("context", {})
    print(f"device: {ctx.get('cuda_device', '?')} (sim: {ctx.get('sim_device', '?')})\n")
    header = ["benchmark", "wall us", "CPU us", "handles"] + KINDS + ["rest", "td release", "td unmap", "td addr_free"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for b in data.get("benchmarks", []):
        name = b.get("run_name", b["name"])
        m = re.match(r"^([a-z_]+)/([^/]+)/(\d+)", name)
        if not m or (device != "all" and m.group(2) != device):
            continue
        if b.get("error_occurred"):
            print(f"| {name} | error: {b.get('error_message', '?')} |")
            continue
        unit = TO_US.get(b.get("time_unit", "us"), 1.0)
        cells = [name.replace("/real_time", ""), f"{b['real_time'] * unit:,.1f}", f"{b['cpu_time'] * unit:,.1f}",
                 f"{b.get('handles_per_GiB', 0):g}"]
        for kind in KINDS:
            if f"{kind}_us" not in b:
                cells.append("-")
                continue
            n = b.get(f"{kind}_n", 1)
            calls = f" x{n:g}" if n != 1 else ""
            cells.append(f"{b[f'{kind}_us']:,.1f} / {b[f'{kind}_cpu_us']:,.1f}{calls}")
        cells.append("-" if "rest_us" not in b else f"{b['rest_us']:,.1f} / {b['rest_cpu_us']:,.1f}")
        for kind in ("release", "unmap", "addr_free"):
            cells.append("-" if f"td_{kind}_us" not in b else f"{b[f'td_{kind}_us']:,.1f}")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
