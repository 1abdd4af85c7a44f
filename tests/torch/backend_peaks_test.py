"""Peaks under CUDA graph trees: torch.compile(mode="reduce-overhead") allocates on a side stream and in its
graph pools, so graphalloc's per-(pool, stream) shards all hold memory at different times. Peaks summed over
the shards read high (GPT-2 small: 4,017 MiB against PyTorch's 3,560 on an H200); the escrow ledger makes
them exact. The same model in two processes, PyTorch's own allocator (expandable segments) and graphalloc's
backend: max_memory_allocated() and the requested, active and allocation-count peaks must be equal."""
import sys
import unittest

import _backend_common as bc
import _common


class BackendPeaksTest(unittest.TestCase):
    def peaks(self, allocator):
        r = _common.run([sys.executable, _common.HERE / "peaks_worker.py", "--allocator", allocator])
        print(r.stdout, flush=True)
        line = [l for l in r.stdout.splitlines() if l.startswith("peaks ")]
        self.assertEqual(len(line), 1, r.stdout + r.stderr)
        words = line[0].split()[1:]
        losses = [l for l in r.stdout.splitlines() if l.startswith("loss ")]
        return dict(zip(words[::2], map(int, words[1::2]))), losses, r.stdout

    def test_reduce_overhead_peaks_equal_pytorchs(self):
        native, native_losses, _ = self.peaks("native")
        ga, ga_losses, out = self.peaks("graphalloc")
        self.assertIn("allocator graphalloc", out)
        self.assertEqual(len(native_losses), len(ga_losses))  # the same program ran
        print("native:", native, "graphalloc:", ga, flush=True)
        self.assertEqual(ga, native)


if __name__ == "__main__":
    bc.run_main()
