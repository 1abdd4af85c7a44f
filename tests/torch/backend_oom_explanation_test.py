"""A real PyTorch out-of-memory error under torch.compile(mode="reduce-overhead") with graphalloc as the
allocator explains itself: PyTorch's first sentence ("CUDA out of memory. Tried to allocate ..."), which
programs match, then graphalloc's report: the request, the device's memory, why reserved memory could not
serve it (largest cause first; the graph trees' pool named) and what to try. The message is printed whole,
to be quoted. The cap comes from set_per_process_memory_fraction, so the device itself is never filled."""
import unittest

import _backend_common as bc

MiB = bc.MiB


class BackendOomExplanationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gat, cls.torch = bc.install_backend()

    def test_reduce_overhead_out_of_memory_explains_itself(self):
        torch = self.torch
        nn = torch.nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
        compiled = torch.compile(model, mode="reduce-overhead")
        x = torch.randn(256, 1024, device="cuda")
        for _ in range(4):  # warmup, record, replays: the graph trees' pool now holds memory
            out = compiled(x)
        torch.cuda.synchronize()
        total = torch.cuda.get_device_properties(0).total_memory
        reserved = torch.cuda.memory_reserved()
        torch.cuda.set_per_process_memory_fraction((reserved + 64 * MiB) / total)
        try:
            with self.assertRaises(torch.cuda.OutOfMemoryError) as cm:
                torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        message = str(cm.exception)
        print("---- the OutOfMemoryError ----\n" + message + "\n----", flush=True)
        self.assertTrue(message.startswith("CUDA out of memory. Tried to allocate 512.00 MiB"), message[:200])
        self.assertIn("Why it could not be served, largest first:\n", message)
        self.assertIn("held by private pool", message)  # the graph trees' pool, named
        self.assertIn("PyTorch pool (", message)
        self.assertIn("What to try:\n  - raise the allocator's cap", message)
        self.assertNotIn("expandable_segments:True", message)  # on by default: never suggested
        del out
        self.assertEqual(float(compiled(x).float().isfinite().all()), 1.0)  # graphalloc still serves


if __name__ == "__main__":
    bc.run_main()
