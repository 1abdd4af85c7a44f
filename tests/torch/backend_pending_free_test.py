"""A block freed while another stream still uses it (record_stream) is not a live allocation from the moment
it is freed, in PyTorch's allocator: memory_allocated() drops at once, its snapshot state is
active_pending_free, and checkPoolLiveAllocations does not count it, also inside a capture, whose frees
wait for it to end. PyTorch's graph trees check their pools that way; graphalloc counted such a block as
allocated while its events were recorded, or deferred by a capture, and the trees raised "Detected 1
tensor(s) in the cudagraph pool not tracked as outputs" (nccl_in_graphs under compute-sanitizer: NCCL's
watchdog frees tensors recorded on its stream). Both allocators run the same worker in their own process
(pending_free_worker.py); graphalloc must report what PyTorch's allocator reports."""
import json
import sys
import unittest

import _backend_common as bc
import _common


class BackendPendingFreeTest(unittest.TestCase):
    def result(self, allocator):
        r = _common.run([sys.executable, _common.HERE / "pending_free_worker.py", "--allocator", allocator])
        lines = [l for l in r.stdout.splitlines() if l.startswith("result ")]
        self.assertEqual(len(lines), 1, r.stdout + r.stderr)
        return json.loads(lines[0][len("result "):])

    def test_a_block_freed_with_pending_stream_uses_is_not_live(self):
        native = self.result("native")
        ga = self.result("graphalloc")
        print("native:", native, "\ngraphalloc:", ga, flush=True)
        self.assertEqual(ga.pop("allocator"), "graphalloc")
        native.pop("allocator")
        self.assertEqual(native["eager_state"], "active_pending_free")  # what PyTorch's allocator says
        self.assertTrue(native["capture_pool_has_no_live_allocation"])
        self.assertEqual(ga, native)


if __name__ == "__main__":
    bc.run_main()
