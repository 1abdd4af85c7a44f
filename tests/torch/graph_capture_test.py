"""(e) CUDA graph capture with graphalloc as PyTorch's allocator.

With libgraphalloc_torch.so built against this PyTorch (GRAPHALLOC_EXPECT_GRAPH_POOLS=1, set by CTest when the
shim was built with its pool hooks), torch.cuda.graph captures into graphalloc private pools: replays equal
eager, eager allocations stay out of the graph's pool, pools are shared and released as PyTorch's are,
make_graphed_callables trains like eager, and a capture that CUDA invalidates leaves graphalloc usable.
Without the shim or the hooks, every capture raises GraphCaptureUnsupported, never runs unprotected. Each
scenario runs in its own process (graph_probe.py)."""
import os
import sys
import unittest

import _common

EXPECT_POOLS = os.environ.get("GRAPHALLOC_EXPECT_GRAPH_POOLS") == "1"


def probe(scenario, conf="", shim=None):
    env = {"GRAPHALLOC_CONF": conf}
    if shim is not None:
        env["GRAPHALLOC_TORCH_SHIM"] = shim
    r = _common.run([sys.executable, _common.HERE / "graph_probe.py", scenario], env=env, check=False,
                    timeout=300)
    outcomes = [line[len("OUTCOME "):] for line in r.stdout.splitlines() if line.startswith("OUTCOME ")]
    print(scenario, conf, "outcomes:", outcomes, "exit", r.returncode, flush=True)
    return r, outcomes


class GraphPoolsTest(unittest.TestCase):
    def assert_matches(self, name, outcomes):
        # The same kernels on the same inputs are expected to agree bit for bit ("equal"); "close" (within
        # rtol 1e-5) is accepted too, as a library may pick another algorithm inside a capture.
        found = [o for o in outcomes if o.startswith(name + " ")]
        self.assertTrue(found, f"no outcome for {name}: {outcomes}")
        self.assertTrue(found[0] == f"{name} equal" or found[0].startswith(f"{name} close"), found[0])

    def check_model(self, conf):
        r, outcomes = probe("model", conf)
        self.assertEqual(r.returncode, 0)
        self.assertIn("capture ok", outcomes)
        self.assertIn("open-routes-after-capture 0", outcomes)
        self.assertIn("pool has-live-blocks True", outcomes)
        self.assert_matches("replay", outcomes)
        self.assertIn("eager-outside-pool True", outcomes)
        self.assertIn("replay-after-allocs correct", outcomes)
        self.assertIn("shared-pool same True", outcomes)
        self.assert_matches("shared-pool replay", outcomes)
        self.assertIn("pool-released True", outcomes)
        self.assertIn("graphed-callables correct", outcomes)
        self.assertEqual(outcomes[-1], "usable-after True")

    @unittest.skipUnless(EXPECT_POOLS, "libgraphalloc_torch.so was not built with PyTorch's pool hooks")
    def test_capture_with_expandable_segments(self):
        self.check_model("expandable_segments:True")

    @unittest.skipUnless(EXPECT_POOLS, "libgraphalloc_torch.so was not built with PyTorch's pool hooks")
    def test_capture_with_regular_segments(self):
        # A fresh pool's first segment is a cuMemAlloc inside the capture (relaxed capture mode).
        self.check_model("expandable_segments:False")

    @unittest.skipUnless(EXPECT_POOLS, "libgraphalloc_torch.so was not built with PyTorch's pool hooks")
    def test_invalidated_capture_leaves_graphalloc_usable(self):
        r, outcomes = probe("failed")
        self.assertEqual(r.returncode, 0)
        self.assertTrue(outcomes[0].startswith("failed-capture raised"), outcomes)
        self.assertIn("open-routes-after-failure 0", outcomes)
        self.assertIn("empty-cache-after-failure ok", outcomes)
        self.assert_matches("capture-after-failure", outcomes)
        self.assertEqual(outcomes[-1], "usable-after True")

    def test_capture_without_pools_is_refused_clearly(self):
        # The shim switched off (or, without EXPECT_POOLS, whatever this build has): never an unprotected capture.
        r, outcomes = probe("refused", shim="off" if EXPECT_POOLS else None)
        self.assertEqual(r.returncode, 0)
        self.assertTrue(outcomes[0].startswith("refused-capture raised GraphCaptureUnsupported"), outcomes)
        self.assertIn("cannot give this CUDA graph capture a private pool", outcomes[0])
        self.assertIn("stream-unchanged True", outcomes)
        self.assertIn("refused-capture-begin raised GraphCaptureUnsupported", outcomes)
        self.assertEqual(outcomes[-1], "usable-after True")


if __name__ == "__main__":
    _common.require_torch()
    unittest.main(verbosity=2)
