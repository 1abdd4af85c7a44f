"""(d) Multi-stream use: a tensor used on a side stream, freed on the main stream with record_stream, is not
reused until the side stream's work is done; tensors allocated on a side stream work too."""
import unittest

import _common

N = 1 << 24  # 16 Mi floats, 64 MiB
SLEEP_CYCLES = 200_000_000  # ~0.1 s on an H100: the side stream is still busy when the main stream goes on


class MultiStreamTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import graphalloc.torch as gat
        gat.install()
        import torch
        torch.cuda.init()
        cls.gat, cls.torch = gat, torch

    def scenario(self, record: str):
        """x (main stream) is read on `side` after a long kernel; x is freed on main, then a new tensor of
        the same size is allocated and overwritten on main. Returns (reused_x_block, side_result_ok)."""
        torch = self.torch
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        x = torch.full((N,), 3.0, device="cuda")
        out = torch.empty(N, device="cuda")
        x_ptr = x.data_ptr()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            torch.mul(x, 2.0, out=out)  # reads x long after the main stream moved on
        if record == "hook":
            x.record_stream(side)  # PyTorch -> set_record_stream_fn hook -> graphalloc
        elif record == "module":
            self.gat.record_stream(x, side)  # graphalloc directly (for PyTorch builds without the hook)
        del x  # freed on main while side still needs it
        z = torch.empty(N, device="cuda")
        z.fill_(-1.0)  # on main: would clobber x if its block were handed out again
        reused = z.data_ptr() == x_ptr
        main.wait_stream(side)
        torch.cuda.synchronize()
        ok = bool((out == 6.0).all())
        del z, out
        return reused, ok

    def test_record_stream_hook(self):
        reused, ok = self.scenario("hook")
        self.assertFalse(reused, "x's block was handed out while the side stream still used it")
        self.assertTrue(ok, "side stream's result corrupted")

    def test_record_stream_through_module(self):
        reused, ok = self.scenario("module")
        self.assertFalse(reused)
        self.assertTrue(ok)

    def test_control_without_record_stream(self):
        # Without record_stream the allocator cannot know: the block may be reused at once (as with
        # PyTorch's own allocator). Not an assertion about graphalloc: it shows the scenario is sensitive.
        reused, ok = self.scenario("none")
        print(f"without record_stream: block reused={reused}, side result intact={ok}")

    def test_side_stream_allocations(self):
        torch = self.torch
        side = torch.cuda.Stream()
        before = self.gat.memory_stats()["allocation.all.current"]
        with torch.cuda.stream(side):
            tensors = [torch.full((1 << 18,), float(i), device="cuda") for i in range(32)]
            total = sum(float(t.sum()) for t in tensors)
        self.assertEqual(total, float(sum(range(32)) * (1 << 18)))
        self.assertEqual(self.gat.memory_stats()["allocation.all.current"], before + 32)
        del tensors
        side.synchronize()
        self.assertEqual(self.gat.memory_stats()["allocation.all.current"], before)


if __name__ == "__main__":
    _common.require_torch()
    unittest.main(verbosity=2)
