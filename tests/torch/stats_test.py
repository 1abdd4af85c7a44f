"""(b) With graphalloc installed, the memory figures come from graphalloc: graphalloc.torch.memory_stats() and
torch.cuda.memory_stats() (patched by install()) follow the allocations made; empty_cache,
reset_peak_memory_stats and set_per_process_memory_fraction reach graphalloc through PyTorch's API."""
import subprocess
import sys
import textwrap
import unittest

import _common

MiB = 1 << 20


class StatsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gat, cls.torch = _common.install_graphalloc()

    def test_hooks_wired(self):
        h = self.gat.hooks()
        self.assertNotIn("unavailable", h["record_stream"])
        self.assertNotIn("unavailable", h["empty_cache"])
        self.assertNotIn("unavailable", h["memory_fraction"])

    def test_allocation_moves_stats(self):
        gat, torch = self.gat, self.torch
        torch.cuda.synchronize()
        before = gat.memory_stats()
        x = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
        after = gat.memory_stats()
        self.assertEqual(after["allocated_bytes.all.current"] - before["allocated_bytes.all.current"], 10 * MiB)
        self.assertEqual(after["requested_bytes.all.current"] - before["requested_bytes.all.current"], 10 * MiB)
        self.assertEqual(after["allocation.all.current"] - before["allocation.all.current"], 1)
        self.assertEqual(after["allocation.large_pool.current"] - before["allocation.large_pool.current"], 1)
        self.assertGreaterEqual(after["reserved_bytes.all.current"], after["allocated_bytes.all.current"])
        # An odd size is rounded up (512 B, like PyTorch); the request is kept exactly.
        y = torch.empty(1000, dtype=torch.uint8, device="cuda")
        after_y = gat.memory_stats()
        self.assertEqual(after_y["allocated_bytes.all.current"] - after["allocated_bytes.all.current"], 1024)
        self.assertEqual(after_y["requested_bytes.all.current"] - after["requested_bytes.all.current"], 1000)
        self.assertEqual(after_y["allocation.small_pool.current"] - after["allocation.small_pool.current"], 1)
        # PyTorch's own entry points report the same numbers (install() patched them).
        self.assertEqual(torch.cuda.memory_allocated(), gat.memory_allocated())
        self.assertEqual(torch.cuda.memory_reserved(), gat.memory_reserved())
        self.assertEqual(torch.cuda.memory_stats()["allocation.all.current"], after_y["allocation.all.current"])
        nested = torch.cuda.memory_stats_as_nested_dict()
        self.assertEqual(nested["allocated_bytes"]["all"]["current"], after_y["allocated_bytes.all.current"])
        del x, y
        end = gat.memory_stats()
        self.assertEqual(end["allocated_bytes.all.current"], before["allocated_bytes.all.current"])
        self.assertEqual(end["allocation.all.current"], before["allocation.all.current"])

    def test_peak_and_reset(self):
        gat, torch = self.gat, self.torch
        torch.cuda.reset_peak_memory_stats()
        base = gat.memory_allocated()
        self.assertEqual(gat.max_memory_allocated(), base)
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del x
        self.assertEqual(torch.cuda.max_memory_allocated(), base + 64 * MiB)
        self.assertEqual(gat.max_memory_allocated(), base + 64 * MiB)
        gat.reset_peak_memory_stats()
        self.assertEqual(torch.cuda.max_memory_allocated(), base)

    def test_empty_cache_through_torch(self):
        gat, torch = self.gat, self.torch
        x = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        del x
        torch.cuda.synchronize()
        held = gat.memory_reserved()
        torch.cuda.empty_cache()  # PyTorch -> reset hook -> graphalloc_empty_cache
        self.assertLessEqual(gat.memory_reserved(), held - 40 * MiB)
        self.assertEqual(gat.memory_reserved(), torch.cuda.memory_reserved())

    FRACTION_CHILD = textwrap.dedent("""
        import graphalloc.torch as gat, torch
        gat.install()
        torch.cuda.init()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(0.05)  # PyTorch -> memory fraction hook -> graphalloc
        ok = torch.empty(int(total * 0.01), dtype=torch.uint8, device="cuda")
        print("small ok", flush=True)
        try:
            big = torch.empty(int(total * 0.2), dtype=torch.uint8, device="cuda")
            print("OUTCOME no-error ptr", hex(big.data_ptr()), flush=True)
            del big
        except Exception as e:  # torch.OutOfMemoryError or RuntimeError
            print("OUTCOME raised", type(e).__name__, str(e)[:300].replace(chr(10), " "), flush=True)
        print("num_ooms", gat.memory_stats()["num_ooms"], flush=True)
        after = torch.empty(1024, device="cuda"); after.fill_(1); torch.cuda.synchronize()
        print("usable after", float(after.sum()), flush=True)
    """)

    def fraction_child(self):
        if not hasattr(type(self), "_fraction_result"):
            type(self)._fraction_result = _common.run([sys.executable, "-c", self.FRACTION_CHILD], check=False)
        return type(self)._fraction_result

    def test_memory_fraction_reaches_graphalloc(self):
        # In a child process: the cap set through PyTorch holds in graphalloc (it refuses the request and
        # counts an OOM), and the process goes on.
        r = self.fraction_child()
        self.assertIn("small ok", r.stdout)
        self.assertIn("num_ooms 1", r.stdout)
        self.assertIn("usable after 1024.0", r.stdout)
        self.assertEqual(r.returncode, 0)

    def test_oom_raises_in_python(self):
        # PyTorch's CUDAPluggableAllocator does not check the pointer its alloc function returns, so the
        # C++ shim (libgraphalloc_torch.so, python/csrc/torch_shim.cc) throws torch.cuda.OutOfMemoryError
        # itself; graphalloc.torch.install() uses it whenever it was built.
        r = self.fraction_child()
        self.assertIn("OUTCOME raised", r.stdout)

if __name__ == "__main__":
    _common.require_torch()
    unittest.main(verbosity=2)
