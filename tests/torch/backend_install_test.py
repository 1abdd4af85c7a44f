"""graphalloc.torch.install() with the C++ backend: PyTorch's own entry points are graphalloc's.

Each check drives PyTorch's public API only and compares with graphalloc's own view (its C ABI, through
graphalloc.stats()), so a result PyTorch computed itself, or a hook left to the pluggable path, fails:
  * the allocator is "graphalloc" and every tensor's memory comes from graphalloc (exact byte counts);
  * raw caching_allocator_alloc/delete, record_stream, empty_cache, memory fraction + OutOfMemoryError;
  * a CUDA graph and a MemPool allocate from graphalloc private pools, and their use counts are PyTorch's;
  * getCheckpointState / setCheckpointPoolState round trip with a live tensor (what graph trees do).
Exit 77 (skipped) without PyTorch, a GPU, or the backend."""
import gc
import os
import sys
import unittest

try:
    import graphalloc
    import graphalloc.torch as gat

    gat.install(backend=os.environ.get("GRAPHALLOC_TORCH_BACKEND", "allocator"))
    import torch
except Exception as e:  # noqa: BLE001 - no PyTorch, no GPU or no backend: skipped, with why
    print(f"SKIP: {type(e).__name__}: {e}")
    sys.exit(77)

MiB = 1 << 20


def ga_stat(key):
    return graphalloc.stats(0)[key]


class BackendInstallTest(unittest.TestCase):
    def test_pytorchs_allocator_is_graphalloc(self):
        self.assertEqual(gat.backend(), "allocator")
        self.assertEqual(torch.cuda.get_allocator_backend(), "graphalloc")
        self.assertTrue(gat.hooks()["backend"].startswith("allocator"))

    def test_tensor_memory_is_graphallocs_byte_for_byte(self):
        gc.collect()  # a failed test's traceback may hold tensors that a later collection would free
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        self.assertEqual(before, ga_stat("allocated_bytes.all.current"))
        x = torch.empty(3 * MiB + 5, dtype=torch.uint8, device="cuda")
        after = torch.cuda.memory_allocated()
        self.assertEqual(after, ga_stat("allocated_bytes.all.current"))
        self.assertEqual(after - before, 3 * MiB + 512)  # rounded to 512 bytes, as PyTorch does
        stats = torch.cuda.memory_stats()
        self.assertEqual(stats["requested_bytes.all.current"], ga_stat("requested_bytes.all.current"))
        del x
        self.assertEqual(torch.cuda.memory_allocated(), before)

    def test_raw_alloc_and_delete(self):
        before = ga_stat("allocated_bytes.all.current")
        ptr = torch.cuda.caching_allocator_alloc(MiB)
        self.assertEqual(ga_stat("allocated_bytes.all.current"), before + MiB)
        torch.cuda.caching_allocator_delete(ptr)
        self.assertEqual(ga_stat("allocated_bytes.all.current"), before)

    def test_record_stream_delays_reuse(self):
        torch.cuda._sleep(1)  # the first launch loads the kernel and may not sleep at all
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        ptr = x.data_ptr()
        with torch.cuda.stream(side):
            # Keeps the side stream busy for about a second (the H100 clocks ~2e9 cycles a second): the
            # checks below take milliseconds, but a first memory_stats() call may take tens of them.
            torch.cuda._sleep(2_000_000_000)
            x.add_(1)
        x.record_stream(side)
        active = torch.cuda.memory_stats()["active_bytes.all.current"]
        del x
        # Freed, but waiting for the side stream's work: still active, as PyTorch counts it.
        self.assertEqual(torch.cuda.memory_stats()["active_bytes.all.current"], active)
        y = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        busy = not side.query()
        reused = y.data_ptr() == ptr
        torch.cuda.synchronize()
        if not busy:  # backend_api_test's record_stream test checks the same with an event it controls
            self.skipTest("the side stream finished before the reuse check; nothing can be concluded")
        self.assertFalse(reused, "a block was reused while a stream recorded on it may still use it")

    def test_empty_cache_returns_cached_memory(self):
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del x
        self.assertGreater(torch.cuda.memory_reserved(), 0)
        torch.cuda.empty_cache()
        self.assertEqual(torch.cuda.memory_reserved(), ga_stat("reserved_bytes.all.current"))
        self.assertEqual(ga_stat("reserved_bytes.all.current") - ga_stat("allocated_bytes.all.current"),
                         torch.cuda.memory_reserved() - torch.cuda.memory_allocated())

    def test_out_of_memory_is_pytorchs_error_with_graphallocs_figures(self):
        ooms = torch.cuda.memory_stats()["num_ooms"]
        with self.assertRaisesRegex(torch.cuda.OutOfMemoryError, "Tried to allocate 800000000.00 GiB"):
            torch.empty(800000000 * (1 << 30) // 4, dtype=torch.float32, device="cuda")
        self.assertEqual(torch.cuda.memory_stats()["num_ooms"], ooms + 1)

    def test_memory_fraction_is_graphallocs(self):
        torch.cuda.set_per_process_memory_fraction(0.5)
        try:
            total = torch.cuda.get_device_properties(0).total_memory
            with self.assertRaises(torch.cuda.OutOfMemoryError) as cm:
                torch.empty(int(total * 0.6), dtype=torch.uint8, device="cuda")
            self.assertIn("graphalloc", str(cm.exception))
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)

    def test_cuda_graph_allocates_from_a_private_pool(self):
        static_in = torch.ones(MiB, device="cuda")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            static_in * 2  # warm up
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            out = static_in * 3
        stats = gat.graph_pool_stats(g.pool())
        self.assertIsNotNone(stats)
        self.assertEqual(stats["allocated_bytes"], 4 * MiB)
        static_in.fill_(2)
        g.replay()
        torch.cuda.synchronize()
        self.assertEqual(out.sum().item(), 6 * MiB)
        self.assertEqual(gat.open_capture_routes(), 0)

    def test_mempool_routes_allocations_and_counts_uses(self):
        pool = torch.cuda.MemPool()
        self.assertEqual(pool.use_count(), 1)
        with torch.cuda.use_mem_pool(pool):
            self.assertEqual(pool.use_count(), 2)
            x = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
        self.assertEqual(pool.use_count(), 1)
        self.assertEqual(gat.graph_pool_stats(pool.id)["allocated_bytes"], 2 * MiB)
        y = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")  # outside: the default pool
        self.assertEqual(gat.graph_pool_stats(pool.id)["allocated_bytes"], 2 * MiB)
        del x, y

    def test_checkpoint_and_restore_of_a_pool(self):
        pool = torch.cuda.graph_pool_handle()
        device = torch.cuda.current_device()
        torch._C._cuda_beginAllocateCurrentThreadToPool(device, pool)
        try:
            a = torch.full((MiB,), 7.0, device="cuda")
            b = torch.empty(MiB, device="cuda")
        finally:
            torch._C._cuda_endAllocateToPool(device, pool)
        a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
        state = torch._C._cuda_getCheckpointState(device, pool)
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(device, pool, {a_ptr, b_ptr}))
        self.assertFalse(torch._C._cuda_checkPoolLiveAllocations(device, pool, {a_ptr}))
        del b  # dies after the checkpoint: restoring brings its block back, and PyTorch frees it then
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(device, pool, {a_ptr}))
        # As graph trees do: `a` is stale (its deleter goes), the restored blocks are freed by raw_delete.
        torch._C._cuda_setCheckpointPoolState(device, state, [a.untyped_storage()._cdata], [])
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(device, pool, {a_ptr, b_ptr}))
        self.assertEqual(a[0].item(), 7.0)  # restoring moves no memory
        del a  # no longer owns its block
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(device, pool, {a_ptr, b_ptr}))
        torch._C._cuda_cudaCachingAllocator_raw_delete(a_ptr)
        torch._C._cuda_cudaCachingAllocator_raw_delete(b_ptr)
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(device, pool, set()))
        torch._C._cuda_releasePool(device, pool)


if __name__ == "__main__":
    unittest.main(verbosity=2)
