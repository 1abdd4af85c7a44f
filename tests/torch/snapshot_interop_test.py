"""Issue 6, PyTorch interop, against a real PyTorch:
  * a graphalloc snapshot exported with `graphalloc snapshot export-torch` loads in PyTorch's memory viewer
    (`python -m torch.cuda._memory_viz stats FILE` and `trace_plot FILE -o OUT.html`);
  * a snapshot PyTorch dumps from real training steps (native allocator, _record_memory_history +
    _dump_snapshot) imports with `graphalloc snapshot import-torch` and plots with `graphalloc snapshot plot`.
The export half needs PyTorch only; the import half needs a GPU too."""
import json
import os
import pickle
import sys
import textwrap
import unittest
import xml.etree.ElementTree as ET

import _common

MiB = 1 << 20


def handmade_snapshot() -> dict:
    """A small snapshot in docs/snapshot_format.md's format, written by hand: one 2 MiB segment with an
    allocated, a pending-free and a free block, and the history that led there."""
    base = 0x7F0000000000
    t = 1_700_000_000_000_000
    blocks = [
        {"address": base, "size": MiB, "requested_size": MiB - 100, "state": "allocated", "stream": 0},
        {"address": base + MiB, "size": 512 * 1024, "requested_size": 500_000, "state": "pending_free",
         "stream": 0},
        {"address": base + MiB + 512 * 1024, "size": 512 * 1024, "requested_size": 0, "state": "free",
         "stream": 0},
    ]
    events = [
        {"action": "segment_alloc", "address": base, "size": 2 * MiB, "stream": 0, "time_us": t},
        {"action": "alloc", "address": base, "size": MiB, "stream": 0, "time_us": t + 1},
        {"action": "alloc", "address": base + MiB, "size": 512 * 1024, "stream": 0, "time_us": t + 2},
        {"action": "alloc", "address": base + MiB + 512 * 1024, "size": 512 * 1024, "stream": 0,
         "time_us": t + 3},
        {"action": "free_requested", "address": base + MiB + 512 * 1024, "size": 512 * 1024, "stream": 0,
         "time_us": t + 4},
        {"action": "free_completed", "address": base + MiB + 512 * 1024, "size": 512 * 1024, "stream": 0,
         "time_us": t + 5},
        {"action": "free_requested", "address": base + MiB, "size": 512 * 1024, "stream": 0, "time_us": t + 6},
    ]
    return {"format": "graphalloc-snapshot", "version": 1, "label": "handmade", "source": "graphalloc",
            "device": {"ordinal": 0, "name": "handmade", "total_memory": 80 << 30, "granularity": 2 * MiB},
            "segments": [{"address": base, "total_size": 2 * MiB, "stream": 0, "pool_id": 0, "kind": "large",
                          "expandable": False, "blocks": blocks}],
            "history": {"max_entries": 100, "overflowed": False, "events": events}}


SIM_SNAPSHOT = textwrap.dedent("""
    import os, sys, random
    os.environ["GRAPHALLOC_DEVICE"] = "sim"
    os.environ["GRAPHALLOC_CONF"] = "record_history:True,history_max_entries:100000"
    import graphalloc
    rng = random.Random(0)
    live = []
    for i in range(2000):
        if live and rng.random() < 0.45:
            graphalloc.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(graphalloc.malloc(rng.choice([512, 4096, 1 << 20, 3 << 20, 25 << 20])))
    open(sys.argv[1], "w").write(graphalloc.snapshot_json(0))
""")


class ExportToTorchTest(unittest.TestCase):
    """graphalloc JSON -> export-torch -> PyTorch's _memory_viz."""

    @classmethod
    def setUpClass(cls):
        import graphalloc
        cls.dir = _common.out_dir("interop_export")
        cls.cli = _common.cli()
        cls.sources = {}
        p = cls.dir / "handmade.json"
        p.write_text(json.dumps(handmade_snapshot()))
        cls.sources["handmade"] = p
        # A replayed trace, when `graphalloc replay` has --snapshot.
        help_text = _common.run([cls.cli, "replay", "--help"], check=False).stdout
        trace = _common.REPO / "traces" / "resnet50_train.csv.gz"
        if "--snapshot" in help_text and trace.is_file():
            out = cls.dir / "replay_resnet50.json"
            r = _common.run([cls.cli, "replay", trace, "--device", "sim", "--snapshot", out], check=False)
            if r.returncode == 0:
                made = sorted(cls.dir.glob("replay_resnet50*.json"))
                for m in made:
                    cls.sources[m.stem] = m
            else:
                print("replay --snapshot failed; not used", flush=True)
        else:
            print("graphalloc replay has no --snapshot yet: not used", flush=True)
        # The library's own snapshot on the simulated device, when it has graphalloc_snapshot_json.
        if graphalloc.has_function("graphalloc_snapshot_json"):
            out = cls.dir / "sim_churn.json"
            _common.run([sys.executable, "-c", SIM_SNAPSHOT, out])
            cls.sources["sim_churn"] = out
        print("sources:", {k: str(v) for k, v in cls.sources.items()}, flush=True)

    def test_memory_viz_reads_export(self):
        for name, src in self.sources.items():
            with self.subTest(source=name):
                _common.run([self.cli, "snapshot", "summary", src])
                out = self.dir / f"{name}.pickle"
                _common.run([self.cli, "snapshot", "export-torch", src, "-o", out])
                with open(out, "rb") as f:
                    data = pickle.load(f)
                self.assertIn("segments", data)
                self.assertIn("device_traces", data)
                graph = json.loads(src.read_text())
                self.assertEqual(sum(s["total_size"] for s in data["segments"]),
                                 sum(s["total_size"] for s in graph["segments"]
                                     if not s.get("expandable")) +
                                 sum(m["size"] for s in graph["segments"] if s.get("expandable")
                                     for m in s.get("mapped", [])))
                r = _common.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", out])
                self.assertTrue(r.stdout.strip())
                html = self.dir / f"{name}_trace.html"
                _common.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", out, "-o", html])
                self.assertGreater(html.stat().st_size, 1000)
                _common.run([sys.executable, "-m", "torch.cuda._memory_viz", "segment_plot", out,
                             "-o", self.dir / f"{name}_segments.html"])


DUMP_FROM_TRAINING = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=100000)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(1024, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        x = torch.randn(32, 3, 64, 64, device="cuda"); y = torch.randint(0, 10, (32,), device="cuda")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(sys.argv[1])
    s = torch.cuda.memory._snapshot()
    print("torch segments", len(s["segments"]), "reserved", sum(g["total_size"] for g in s["segments"]))
""")


class ImportFromTorchTest(unittest.TestCase):
    """torch.cuda.memory._dump_snapshot() from real training steps -> import-torch -> plot."""

    def test_import_and_plot(self):
        import torch
        if not torch.cuda.is_available():
            self.skipTest("no GPU: cannot dump a snapshot from a training step")
        d = _common.out_dir("interop_import")
        cli = _common.cli()
        pk = d / "torch_training.pickle"
        env = {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": ""}
        _common.run([sys.executable, "-c", DUMP_FROM_TRAINING, pk], env=env)
        with open(pk, "rb") as f:
            torch_snap = pickle.load(f)
        segs = [s for s in torch_snap["segments"] if s["device"] == 0]
        self.assertGreater(len(segs), 0)
        self.assertGreater(len(torch_snap["device_traces"][0]), 0)
        out = d / "torch_training.json"
        _common.run([cli, "snapshot", "import-torch", pk, "-o", out])
        imported = json.loads(out.read_text())
        self.assertEqual(imported["format"], "graphalloc-snapshot")
        self.assertEqual(sum(s["total_size"] for s in imported["segments"]), sum(s["total_size"] for s in segs))
        self.assertGreater(len(imported["history"]["events"]), 0)
        r = _common.run([cli, "snapshot", "summary", "--json", out])
        summary = json.loads(r.stdout)
        self.assertEqual(summary["segments"], len(segs))
        allocated = sum(b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated")
        self.assertEqual(summary["allocated_bytes"], allocated)
        svg = d / "torch_training.svg"
        _common.run([cli, "snapshot", "plot", out, "-o", svg])
        root = ET.parse(svg).getroot()
        rects = [e for e in root.iter() if e.tag.endswith("rect") and e.get("class") == "block"]
        self.assertEqual(len(rects), sum(len(s["blocks"]) for s in segs))
        _common.run([cli, "snapshot", "plot", pk, "-o", d / "torch_training_direct.html"])  # pickle directly
        _common.run([cli, "snapshot", "check", out])


if __name__ == "__main__":
    _common.require_torch(gpu=False)
    unittest.main(verbosity=2)
