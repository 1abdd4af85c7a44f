"""(c) A snapshot of a training run with graphalloc as PyTorch's allocator opens with the CLI (summary,
segments, check, plot) and converts to PyTorch's memory_viz pickle, which PyTorch's viewer reads."""
import json
import sys
import unittest
import xml.etree.ElementTree as ET

import _common


class SnapshotTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import graphalloc.torch as gat
        gat.install(config="record_history:True,history_max_entries:100000,history_stacks:False")
        import torch
        import torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(3):
            loss = model(torch.randn(256, 512, device="cuda")).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        cls.keep = (model, opt)
        torch.cuda.synchronize()
        cls.dir = _common.out_dir("snapshot_test")
        cls.path = cls.dir / "train_snapshot.json"
        gat.dump_snapshot(str(cls.path))
        cls.gat, cls.torch = gat, torch

    def test_snapshot_content(self):
        s = json.loads(self.path.read_text())
        self.assertEqual(s["format"], "graphalloc-snapshot")
        self.assertGreater(len(s["segments"]), 0)
        allocated = sum(b["size"] for seg in s["segments"] for b in seg["blocks"] if b["state"] == "allocated")
        # The blocks agree with the statistics recorded at the same moment (the live figure has moved on:
        # setUpClass's temporaries were freed after the dump).
        self.assertEqual(allocated, s["stats"]["allocated_bytes"]["all"]["current"])
        # Reserved memory is what is mapped: whole regular segments, the mapped ranges of expandable ones.
        def reserved(seg):
            if not seg.get("expandable"):
                return seg["total_size"]
            return sum(r["size"] for r in seg.get("mapped", []))
        self.assertEqual(sum(reserved(seg) for seg in s["segments"]), s["stats"]["reserved_bytes"]["all"]["current"])
        self.assertGreater(allocated, 3 * (512 * 2048 + 2048 * 512) * 4)  # weights + 2 AdamW states
        self.assertGreater(len(s["history"]["events"]), 0)
        self.assertIn("record_history", self.gat.config())

    def test_cli_opens_it(self):
        cli = _common.cli()
        r = _common.run([cli, "snapshot", "summary", self.path])
        self.assertIn("segment", r.stdout.lower())
        r = _common.run([cli, "snapshot", "summary", "--json", self.path])
        summary = json.loads(r.stdout)
        s = json.loads(self.path.read_text())
        self.assertEqual(summary["allocated_bytes"], s["stats"]["allocated_bytes"]["all"]["current"])
        self.assertEqual(summary["reserved_bytes"], s["stats"]["reserved_bytes"]["all"]["current"])
        self.assertTrue(summary["stats_consistent"])
        _common.run([cli, "snapshot", "segments", self.path])
        _common.run([cli, "snapshot", "check", self.path])
        svg = self.dir / "train_snapshot.svg"
        _common.run([cli, "snapshot", "plot", self.path, "-o", svg])
        ET.parse(svg)
        _common.run([cli, "snapshot", "plot", self.path, "-o", self.dir / "train_snapshot.html"])

    def test_export_torch_opens_in_memory_viz(self):
        pickle_path = self.dir / "train_snapshot.pickle"
        self.gat.export_torch(str(pickle_path))
        _common.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", pickle_path])
        _common.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", pickle_path,
                     "-o", self.dir / "train_trace.html"])


if __name__ == "__main__":
    _common.require_torch()
    import graphalloc
    if not graphalloc.has_function("graphalloc_snapshot_json"):
        _common.skip(f"{graphalloc.library_path()} has no graphalloc_snapshot_json yet")
    unittest.main(verbosity=2)
