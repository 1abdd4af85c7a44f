"""(f) Out of memory through PyTorch with graphalloc as its allocator raises torch.cuda.OutOfMemoryError
(from libgraphalloc_torch.so's malloc: PyTorch's pluggable allocator never checks for a null pointer), with
graphalloc's message, counted in num_ooms; the process goes on allocating afterwards. Needs the shim: skipped
when CTest did not build it (GRAPHALLOC_TORCH_SHIM unset)."""
import os
import unittest

import _common

MiB = 1 << 20


class OomTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gat, cls.torch = _common.install_graphalloc()

    def setUp(self):
        if not os.environ.get("GRAPHALLOC_TORCH_SHIM"):
            self.skipTest("libgraphalloc_torch.so was not built (python3 imports no PyTorch with headers)")

    def test_shim_serves_allocations(self):
        self.assertTrue(self.gat.hooks()["oom"].startswith("raises torch.cuda.OutOfMemoryError"),
                        self.gat.hooks()["oom"])

    def test_impossible_request_raises_out_of_memory_error(self):
        torch, gat = self.torch, self.gat
        before = gat.memory_stats()["num_ooms"]
        with self.assertRaises(torch.cuda.OutOfMemoryError) as cm:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
        message = str(cm.exception)
        print("message:", message, flush=True)
        self.assertIn("CUDA out of memory", message)
        self.assertIn("graphalloc", message)
        self.assertIn("tried to allocate", message)
        self.assertEqual(gat.memory_stats()["num_ooms"], before + 1)
        x = torch.ones(1000, device="cuda")
        self.assertEqual(float(x.sum()), 1000.0)

    def test_more_than_an_exabyte_is_refused_in_pytorchs_words(self):
        torch, gat = self.torch, self.gat
        before = gat.memory_stats()["num_ooms"]
        with self.assertRaisesRegex(torch.cuda.OutOfMemoryError, "Tried to allocate more than 1EB memory"):
            torch.empty(1024 * 1024 * 1024 * 8000000000, dtype=torch.int8, device="cuda")
        if gat.backend() == "allocator":  # refused before graphalloc is asked, as PyTorch does
            self.assertEqual(gat.memory_stats()["num_ooms"], before)

    def test_memory_fraction_cap_raises_and_the_retry_fits(self):
        torch = self.torch
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(0.05)
        try:
            with self.assertRaises(torch.cuda.OutOfMemoryError):
                torch.empty(int(total * 0.10), dtype=torch.uint8, device="cuda")
            # What the caller of an OOM typically does: retry smaller; it must fit under the cap.
            y = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
            y.fill_(1)
            torch.cuda.synchronize()
            self.assertEqual(int(y[-1]), 1)
            del y
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)

    def test_out_of_memory_inside_a_graph_capture_raises_and_ends_the_capture(self):
        torch, gat = self.torch, self.gat
        if not gat.hooks().get("graph_pools", "").startswith("wired"):
            self.skipTest(gat.hooks().get("graph_pools"))
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with self.assertRaises(torch.cuda.OutOfMemoryError):
            with torch.cuda.graph(g, stream=s):
                torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        del g
        self.assertEqual(gat.open_capture_routes(), 0)
        gat.empty_cache()  # not stuck in capture mode
        x = torch.ones(1000, device="cuda")
        self.assertEqual(float(x.sum()), 1000.0)


if __name__ == "__main__":
    _common.require_torch()
    unittest.main(verbosity=2)
