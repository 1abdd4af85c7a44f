"""PyTorch's allocation history and snapshots served by graphalloc's C++ backend: _record_memory_history(),
_snapshot() (segments with blocks, exact requested sizes for odd sizes, Python frames naming the allocating
function), trace entries alloc / free_requested / free_completed, max_entries, _dump_snapshot() to a pickle that
torch.cuda._memory_viz renders (trace_plot, segment_plot and its command line), and user metadata."""
import inspect
import os
import pickle
import subprocess
import sys
import unittest

import _backend_common as bc
import _common

MiB = bc.MiB
ODD = 3 * MiB + 5        # large pool: rounded to 512 B
ODD_SMALL = 1001         # small pool: rounded to 1024


def allocate_for_history_test(torch):
    """The function whose name the recorded Python frames must show."""
    big = torch.empty(ODD, dtype=torch.uint8, device="cuda")
    small = torch.empty(ODD_SMALL, dtype=torch.uint8, device="cuda")
    return big, small


def round512(n):
    return (n + 511) // 512 * 512


def frame_names(entry):
    return [f.get("name", "") for f in entry.get("frames", [])]


class BackendHistoryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gat, cls.torch = bc.install_backend()

    def tearDown(self):
        self.torch.cuda.memory._record_memory_history(enabled=None)

    def record(self, **kw):
        torch = self.torch
        torch.cuda.synchronize()
        fn = torch.cuda.memory._record_memory_history
        fn(enabled=None)
        args = dict(enabled="all", context="all", stacks="python", max_entries=100000)
        if "clear_history" in inspect.signature(fn).parameters:
            args["clear_history"] = True  # earlier tests' entries at the same addresses would confuse these
        args.update(kw)
        fn(**args)

    def test_snapshot_blocks_and_frames(self):
        torch = self.torch
        self.record()
        big, small = allocate_for_history_test(torch)
        snap = torch.cuda.memory._snapshot()
        self.assertIn("segments", snap)
        self.assertIn("device_traces", snap)
        found = {}
        for seg in snap["segments"]:
            for key in ("address", "total_size", "stream", "segment_type", "allocated_size", "active_size",
                        "blocks", "segment_pool_id"):
                self.assertIn(key, seg)
            self.assertEqual(sum(b["size"] for b in seg["blocks"]), seg["total_size"])
            addr = seg["address"]
            for blk in seg["blocks"]:
                if addr in (big.data_ptr(), small.data_ptr()) and blk["state"] == "active_allocated":
                    found[addr] = (seg, blk)
                addr += blk["size"]
        self.assertIn(big.data_ptr(), found, "the odd-sized large block is not in any segment")
        self.assertIn(small.data_ptr(), found, "the odd-sized small block is not in any segment")
        seg, blk = found[big.data_ptr()]
        self.assertEqual(blk["requested_size"], ODD)
        self.assertEqual(blk["size"], round512(ODD))
        self.assertEqual(seg["segment_type"], "large")
        self.assertIn("allocate_for_history_test", frame_names(blk), blk.get("frames"))
        self.assertTrue(any(f.get("filename", "").endswith("backend_history_test.py") for f in blk["frames"]))
        seg, blk = found[small.data_ptr()]
        self.assertEqual(blk["requested_size"], ODD_SMALL)
        self.assertEqual(blk["size"], 1024)
        self.assertEqual(seg["segment_type"], "small")
        # The snapshot agrees with the statistics.
        stats = torch.cuda.memory_stats()
        self.assertEqual(sum(s["total_size"] for s in snap["segments"]), stats["reserved_bytes.all.current"])
        self.assertEqual(sum(s["allocated_size"] for s in snap["segments"]), stats["allocated_bytes.all.current"])
        del big, small

    def test_trace_alloc_free_requested_free_completed(self):
        torch = self.torch
        self.record()
        big, small = allocate_for_history_test(torch)
        ptr = big.data_ptr()
        del big
        torch.cuda.synchronize()
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        at = [i for i, e in enumerate(trace) if e.get("addr") == ptr and e["action"] == "alloc"]
        self.assertTrue(at, "no alloc entry at the block's address")
        mine = [e for e in trace[at[-1]:] if e.get("addr") == ptr]
        actions = [e["action"] for e in mine]
        print("actions at the block:", actions, flush=True)
        self.assertEqual(actions[0], "alloc")
        self.assertIn("free_requested", actions)
        self.assertIn("free_completed", actions)
        self.assertLess(actions.index("free_requested"), actions.index("free_completed"))
        alloc = mine[0]
        self.assertEqual(alloc["size"], ODD)  # PyTorch records the requested size in alloc entries
        self.assertIn("allocate_for_history_test", frame_names(alloc))
        free = mine[actions.index("free_requested")]
        self.assertIn("test_trace_alloc_free_requested_free_completed", frame_names(free))
        for e in trace:
            for key in ("action", "addr", "size", "stream"):
                self.assertIn(key, e)
            if e["action"] in ("alloc", "free_requested") and e.get("addr") == ptr:
                self.assertIn("frames", e)  # entries without a context (snapshot, segment_*) have none
        del small

    def test_max_entries_keeps_the_last(self):
        torch = self.torch
        self.record(max_entries=7)
        ts = []
        for i in range(20):
            ts.append(torch.empty(512 * (i + 1), dtype=torch.uint8, device="cuda"))
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        self.assertEqual(len(trace), 7)
        # _snapshot() records its own "snapshot" entry, as PyTorch's allocator does: the last before it is ours.
        last = [e for e in trace if e["action"] != "snapshot"][-1]
        self.assertEqual(last["action"], "alloc")
        self.assertEqual(last["addr"], ts[-1].data_ptr())
        sizes = [e["size"] for e in trace if e["action"] == "alloc"]  # (a segment_alloc may be among them)
        self.assertEqual(sizes, [512 * (i + 1) for i in range(20 - len(sizes), 20)])
        del ts

    def test_default_max_entries_records(self):
        # PyTorch's default max_entries is sys.maxsize: its trace grows, graphalloc's segment ring is capped.
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(enabled=None)
        torch.cuda.memory._record_memory_history()
        x = torch.empty(3 * 1024 * 1024 + 5, dtype=torch.uint8, device="cuda")
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == x.data_ptr()]
        self.assertEqual(len(allocs), 1)
        self.assertEqual(allocs[0]["size"], 3 * 1024 * 1024 + 5)  # the requested size, as PyTorch records
        del x

    def test_dump_snapshot_renders_with_memory_viz(self):
        torch = self.torch
        from torch.cuda import _memory_viz
        self.record()
        big, small = allocate_for_history_test(torch)
        del small
        out = _common.out_dir("backend_history")
        path = os.path.join(str(out), "snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        self.assertTrue(snap["segments"])
        self.assertTrue(snap["device_traces"][0])
        html = _memory_viz.trace_plot(snap)
        self.assertIn("<html", html[:3000].lower())
        self.assertGreater(len(html), 1000)
        seg_html = _memory_viz.segment_plot(snap)
        self.assertGreater(len(seg_html), 1000)
        for cmd in ("trace_plot", "segment_plot"):
            target = os.path.join(str(out), f"{cmd}.html")
            r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, path, "-o", target],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertGreater(os.path.getsize(target), 1000)
        stats = _memory_viz.segsum(snap) if hasattr(_memory_viz, "segsum") else ""
        print(str(stats)[:800], flush=True)
        del big

    def test_free_block_shows_last_freed_requested_size(self):
        # PyTorch's free Block keeps the requested size of the allocation whose free merged into it; tools
        # (and PyTorch's own test_memory_plots) read it after trace_plot(filter_freed=True) has pruned the trace.
        torch = self.torch
        torch.cuda.memory.empty_cache()
        self.record()
        x = torch.empty(ODD_SMALL, dtype=torch.uint8, device="cuda")
        addr = x.data_ptr()
        del x
        snap = torch.cuda.memory._snapshot()
        blocks = [b for seg in snap["segments"] for b in seg["blocks"]
                  if b["address"] <= addr < b["address"] + b["size"]]
        self.assertEqual(len(blocks), 1)
        self.assertEqual(blocks[0]["state"], "inactive")
        self.assertEqual(blocks[0]["requested_size"], ODD_SMALL)
        torch.cuda.memory._record_memory_history(enabled=None)
        snap = torch.cuda.memory._snapshot()
        blocks = [b for seg in snap["segments"] for b in seg["blocks"]
                  if b["address"] <= addr < b["address"] + b["size"]]
        self.assertEqual(blocks[0]["requested_size"], 0)  # without history graphalloc has no record of it

    def test_user_metadata(self):
        torch = self.torch
        setter = getattr(torch.cuda.memory, "_set_memory_metadata", None)
        if setter is None:
            self.skipTest("this PyTorch has no torch.cuda.memory._set_memory_metadata")
        self.record()
        setter("graphalloc metadata")
        try:
            x = torch.empty(5000, dtype=torch.uint8, device="cuda")
            ptr = x.data_ptr()
            del x
        finally:
            setter("")
        y = torch.empty(7000, dtype=torch.uint8, device="cuda")
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        # y may reuse x's address: x's entry is the alloc of 5000 bytes there.
        tagged = [e for e in trace if e.get("addr") == ptr and e["action"] == "alloc" and e["size"] == 5000]
        self.assertTrue(tagged)
        self.assertEqual(tagged[-1].get("user_metadata"), "graphalloc metadata")
        later = [e for e in trace if e.get("addr") == y.data_ptr() and e["action"] == "alloc" and e["size"] == 7000]
        self.assertEqual(later[-1].get("user_metadata", ""), "")
        del y

    def test_user_metadata_on_every_entry_segments_included(self):
        # PyTorch's test_memory_plots_metadata: segment events and free_completed, which graphalloc records
        # itself, carry the thread's metadata too.
        torch = self.torch
        setter = getattr(torch.cuda.memory, "_set_memory_metadata", None)
        if setter is None:
            self.skipTest("this PyTorch has no torch.cuda.memory._set_memory_metadata")
        torch.cuda.memory.empty_cache()
        setter("metadata test")
        try:
            self.record(context="alloc")
            x = torch.empty(ODD, dtype=torch.uint8, device="cuda")
            del x
            torch.cuda.memory.empty_cache()
        finally:
            setter("")
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        actions = {e["action"] for e in trace}
        self.assertTrue(actions & {"segment_alloc", "segment_map"}, actions)
        self.assertTrue(actions & {"segment_free", "segment_unmap"}, actions)
        self.assertEqual([e for e in trace if e.get("user_metadata") != "metadata test"], [])

    def test_empty_cache_context_on_segment_free_at_all_only(self):
        # PyTorch's test_memory_plots_free_segment_stack: the segments an empty_cache releases carry its
        # context when history records contexts of frees ("all"), and no other level.
        torch = self.torch
        for context in ("alloc", "all", "state"):
            torch.cuda.memory.empty_cache()
            self.record(context=context)
            x = torch.empty(ODD, dtype=torch.uint8, device="cuda")
            del x
            torch.cuda.memory.empty_cache()
            trace = torch.cuda.memory._snapshot()["device_traces"][0]
            released = [e for e in trace if e["action"] in ("segment_free", "segment_unmap")]
            self.assertTrue(released, context)
            with_caller = [e for e in released if "empty_cache" in frame_names(e)]
            self.assertEqual(bool(with_caller), context == "all", (context, [frame_names(e) for e in released]))
            made = [e for e in trace if e["action"] in ("segment_alloc", "segment_map")]
            self.assertTrue(made, context)
            # A segment made for an allocation has that allocation's context (alloc and all).
            self.assertEqual(any("test_empty_cache_context_on_segment_free_at_all_only" in frame_names(e)
                                 for e in made), context != "state", context)

    def test_history_off_records_nothing(self):
        torch = self.torch
        self.record()
        torch.cuda.memory._record_memory_history(enabled=None)
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        snap = torch.cuda.memory._snapshot()
        self.assertFalse(any(e.get("addr") == x.data_ptr() for t in snap["device_traces"] for e in t))
        del x


if __name__ == "__main__":
    bc.run_main()
