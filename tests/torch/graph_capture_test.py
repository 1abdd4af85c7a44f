"""(e) CUDA graph capture with graphalloc as PyTorch's allocator: NOT supported yet.

PyTorch routes a capture's allocations to a private pool through the pluggable allocator's pool hooks
(set_begin_allocate_to_pool / set_end_allocate_to_pool_fn / set_release_pool); they take C++ types and need
graphalloc's private pools (issue 5), so graphalloc.torch does not wire them. This test records what happens
today, so that a change in behaviour (for better or worse) is noticed. See EXPECTED below."""
import sys
import unittest

import _common

# What happens on the H100 (PyTorch 2.11, CUDA 13.0, driver 580), with graphalloc installed and no pool
# routing (PyTorch's pool hooks are unset, so beginAllocateToPool is a no-op):
#  - expandable_segments:False: the first allocation inside the capture needs a new segment (cuMemAlloc),
#    which a global-mode capture forbids; CUDA invalidates the capture and torch.cuda.graph raises
#    torch.AcceleratorError with cudaErrorStreamCaptureInvalidated. The process stays usable.
#  - expandable_segments:True (the default): growing a segment maps physical memory (cuMemCreate/cuMemMap),
#    which captures allow, so the capture succeeds and replays correctly here. It is NOT safe in general:
#    without a private pool, memory the graph uses can be handed to later eager allocations once freed.
#    Private pools (issue 5) are what makes it safe; until then, do not capture with graphalloc installed.

def probe(conf):
    r = _common.run([sys.executable, _common.HERE / "graph_probe.py"], env={"GRAPHALLOC_CONF": conf},
                    check=False, timeout=300)
    outcomes = [l[len("OUTCOME "):] for l in r.stdout.splitlines() if l.startswith("OUTCOME ")]
    print(conf, "outcomes:", outcomes, "exit", r.returncode)
    return r, outcomes


class GraphCaptureTest(unittest.TestCase):
    def test_regular_segments_refuse_the_capture_cleanly(self):
        r, outcomes = probe("expandable_segments:False")
        self.assertIn("warmup ok", r.stdout)
        self.assertEqual(len(outcomes), 2, outcomes)
        self.assertTrue(outcomes[0].startswith("capture raised AcceleratorError"), outcomes[0])
        self.assertIn("cudaErrorStreamCaptureInvalidated", outcomes[0])
        self.assertEqual(outcomes[1], "usable-after True")
        self.assertEqual(r.returncode, 0)

    def test_expandable_segments_capture_without_pool_protection(self):
        r, outcomes = probe("expandable_segments:True")
        self.assertIn("warmup ok", r.stdout)
        self.assertEqual(outcomes, ["capture ok", "replay correct", "replay-after-allocs correct",
                                    "usable-after True"])
        self.assertEqual(r.returncode, 0)


if __name__ == "__main__":
    _common.require_torch()
    unittest.main(verbosity=2)
