"""(a) A small model trains with graphalloc as PyTorch's allocator and gives losses bit-identical to
PyTorch's native allocator (same seeds, deterministic algorithms); each allocator in its own process."""
import sys
import unittest

import _common


class TrainParityTest(unittest.TestCase):
    def losses(self, allocator):
        r = _common.run([sys.executable, _common.HERE / "train_worker.py", "--allocator", allocator])
        lines = [l for l in r.stdout.splitlines() if l.startswith("loss ")]
        self.assertEqual(len(lines), 8, r.stdout)
        return lines, r.stdout

    def test_losses_bit_identical(self):
        native, _ = self.losses("native")
        ga, out = self.losses("graphalloc")
        self.assertIn("graphalloc allocations", out)  # the graphalloc run did go through graphalloc
        alloc_count = int(out.split("graphalloc allocations ")[1].split()[0])
        self.assertGreater(alloc_count, 50)
        self.assertEqual(native, ga)
        print("losses identical:", *[l.split()[-1] for l in ga])


if __name__ == "__main__":
    _common.require_torch()
    unittest.main()
