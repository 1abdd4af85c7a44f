"""(e) CUDA graph capture with graphalloc as PyTorch's allocator: NOT supported yet.

PyTorch routes a capture's allocations to a private pool through the pluggable allocator's pool hooks
(set_begin_allocate_to_pool / set_end_allocate_to_pool_fn / set_release_pool); they take C++ types and need
graphalloc's private pools (issue 5), so graphalloc.torch does not wire them. This test records what happens
today, so that a change in behaviour (for better or worse) is noticed. See EXPECTED below."""
import sys
import unittest

import _common

# What happens on the H100 (PyTorch 2.11, CUDA 13.0, driver 580), with graphalloc installed and no pool
# routing: PyTorch starts the capture (the pool hooks are unset, so beginAllocateToPool is a no-op); the first
# allocation inside the capture reaches graphalloc on the capturing stream; graphalloc's allocation path does
# work a capture forbids (device allocation or event/stream queries outside the stream's graph), CUDA
# invalidates the capture, the next captured kernel (a cuBLAS matmul) fails and torch.cuda.graph raises
# torch.AcceleratorError with cudaErrorStreamCaptureInvalidated. The process stays usable afterwards.
# So: torch.cuda.graph with graphalloc fails cleanly, it never captures a graph that replays wrong.

class GraphCaptureTest(unittest.TestCase):
    def test_current_behaviour(self):
        r = _common.run([sys.executable, _common.HERE / "graph_probe.py"], check=False, timeout=300)
        outcomes = [l[len("OUTCOME "):] for l in r.stdout.splitlines() if l.startswith("OUTCOME ")]
        print("outcomes:", outcomes, "exit", r.returncode)
        self.assertIn("warmup ok", r.stdout)
        self.assertEqual(len(outcomes), 2, outcomes)
        self.assertTrue(outcomes[0].startswith("capture raised AcceleratorError"), outcomes[0])
        self.assertIn("cudaErrorStreamCaptureInvalidated", outcomes[0])
        self.assertEqual(outcomes[1], "usable-after True")
        self.assertEqual(r.returncode, 0)


if __name__ == "__main__":
    _common.require_torch()
    unittest.main(verbosity=2)
