"""graphalloc as PyTorch's CUDA allocator through the C++ backend (CUDAAllocator "graphalloc"): PyTorch's own
APIs are served by graphalloc. name() / get_allocator_backend(); torch.cuda.memory_stats() equal to graphalloc's
own statistics (its C ABI) key by key, with exact deltas; reset of peak and accumulated statistics; empty_cache;
memory fraction + out of memory as torch.cuda.OutOfMemoryError naming graphalloc, with the OOM observer called;
caching_allocator_alloc/delete (raw_alloc/raw_delete); record_stream; cuDNN benchmark mode (cacheInfo), also
training torchvision's ResNet-50; cacheInfo's largest block equal to the largest contiguous free run;
IPC of an expandable segment without shareable handles refused with an error naming the key (sharing itself:
backend_ipc_test.py); torch.cuda.MemPool + use_mem_pool (allocations land in the pool, use count,
memory released after del)."""
import gc
import os
import unittest

import _backend_common as bc

MiB = bc.MiB
# Keys graphalloc and PyTorch must both report (the rest are compared where both have them).
CORE_KEYS = [f"{stat}.{pool}.{kind}"
             for stat in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
                          "requested_bytes", "allocation", "segment", "active", "inactive_split")
             for pool in ("all", "small_pool", "large_pool")
             for kind in ("current", "peak", "allocated", "freed")] + ["num_ooms", "num_alloc_retries"]


class BackendApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gat, cls.torch = bc.install_backend()

    def setUp(self):
        self.torch.cuda.synchronize()

    def both_stats(self):
        torch = self.torch
        torch.cuda.synchronize()
        t = torch.cuda.memory_stats()
        g = bc.ga_stats(0)
        return t, g

    def test_backend_name(self):
        torch, gat = self.torch, self.gat
        self.assertEqual(gat.backend(), "allocator")
        self.assertTrue(gat.hooks()["backend"].startswith("allocator"), gat.hooks()["backend"])
        self.assertEqual(torch.cuda.get_allocator_backend(), "graphalloc")

    def test_memory_stats_equal_graphalloc_stats(self):
        torch = self.torch
        keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1000, 4097, 3 * MiB + 5, 25 * MiB)]
        t, g = self.both_stats()
        missing_t = [k for k in CORE_KEYS if k not in t]
        missing_g = [k for k in CORE_KEYS if k not in g]
        self.assertEqual(missing_t, [], "keys missing from torch.cuda.memory_stats()")
        self.assertEqual(missing_g, [], "keys missing from graphalloc's statistics")
        differ = {k: (t[k], g[k]) for k in sorted(set(t) & set(g)) if t[k] != g[k]}
        print("only in torch:", sorted(set(t) - set(g)), "only in graphalloc:", sorted(set(g) - set(t)), flush=True)
        self.assertEqual(differ, {}, "torch.cuda.memory_stats() vs graphalloc (torch, graphalloc)")
        # PyTorch's convenience functions read the same numbers.
        self.assertEqual(torch.cuda.memory_allocated(), g["allocated_bytes.all.current"])
        self.assertEqual(torch.cuda.memory_reserved(), g["reserved_bytes.all.current"])
        self.assertEqual(torch.cuda.max_memory_allocated(), g["allocated_bytes.all.peak"])
        nested = torch.cuda.memory_stats_as_nested_dict()
        self.assertEqual(nested["allocation"]["all"]["current"], g["allocation.all.current"])
        del keep

    def test_exact_deltas(self):
        torch = self.torch
        before, _ = self.both_stats()
        x = torch.empty(1000, dtype=torch.uint8, device="cuda")  # small pool, rounded to 1024
        y = torch.empty(10 * MiB + 3, dtype=torch.uint8, device="cuda")  # large pool, rounded to 512 B
        after, g = self.both_stats()

        def d(key):
            return after[key] - before[key]
        self.assertEqual(d("allocated_bytes.all.current"), 1024 + 10 * MiB + 512)
        self.assertEqual(d("requested_bytes.all.current"), 1000 + 10 * MiB + 3)
        self.assertEqual(d("allocation.all.current"), 2)
        self.assertEqual(d("allocation.small_pool.current"), 1)
        self.assertEqual(d("allocation.large_pool.current"), 1)
        self.assertEqual(d("allocated_bytes.small_pool.allocated"), 1024)
        self.assertEqual(after["allocated_bytes.all.current"], g["allocated_bytes.all.current"])
        del x, y
        end, _ = self.both_stats()
        self.assertEqual(end["allocated_bytes.all.current"], before["allocated_bytes.all.current"])
        self.assertEqual(end["allocation.all.freed"] - before["allocation.all.freed"], 2)

    def test_reset_peak_and_accumulated(self):
        torch = self.torch
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.assertEqual(torch.cuda.max_memory_allocated(), base)
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del x
        t, g = self.both_stats()
        self.assertEqual(t["allocated_bytes.all.peak"], base + 64 * MiB)
        self.assertEqual(g["allocated_bytes.all.peak"], base + 64 * MiB)
        torch.cuda.reset_peak_memory_stats()
        t, g = self.both_stats()
        self.assertEqual(t["allocated_bytes.all.peak"], base)
        self.assertEqual(g["allocated_bytes.all.peak"], base)
        self.assertEqual(g["reserved_bytes.all.peak"], g["reserved_bytes.all.current"])
        torch.cuda.reset_accumulated_memory_stats()
        t, g = self.both_stats()
        for key in ("allocation.all.allocated", "allocation.all.freed", "allocated_bytes.all.allocated",
                    "segment.all.allocated", "num_alloc_retries", "num_ooms"):
            self.assertEqual(t[key], 0, key)
            self.assertEqual(g[key], 0, key)
        y = torch.empty(1 * MiB, dtype=torch.uint8, device="cuda")
        t, _ = self.both_stats()
        self.assertEqual(t["allocation.all.allocated"], 1)
        del y

    def test_empty_cache(self):
        # Expandable segments map and unmap whole chunks (up to 48 MiB), so a chunk that also holds a live
        # block (an earlier test's cuBLAS workspace, say) stays, and a new block may begin in its free tail.
        # What empty_cache must do is give back everything the block added: back to the level before it. The
        # block is larger than any chunk, so it cannot fit in such a tail and must grow the reservation.
        torch = self.torch
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        x = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        del x
        t, _ = self.both_stats()
        held = t["reserved_bytes.all.current"]
        self.assertGreater(held, before)
        torch.cuda.empty_cache()
        t, g = self.both_stats()
        self.assertEqual(t["reserved_bytes.all.current"], before)
        self.assertEqual(t["reserved_bytes.all.current"], g["reserved_bytes.all.current"])
        self.assertEqual(t["reserved_bytes.all.current"], torch.cuda.memory_reserved())

    def test_memory_fraction_oom_error_and_observer(self):
        torch = self.torch
        calls = []

        def observer(device, alloc, device_alloc, device_free):
            calls.append((device, alloc, device_alloc, device_free))

        torch._C._cuda_attach_out_of_memory_observer(observer)
        total = torch.cuda.get_device_properties(0).total_memory
        before = bc.ga_stats(0)["num_ooms"]
        torch.cuda.set_per_process_memory_fraction(0.05)
        try:
            self.assertAlmostEqual(torch.cuda.get_per_process_memory_fraction(0), 0.05)
            request = int(total * 0.10)
            with self.assertRaises(torch.cuda.OutOfMemoryError) as cm:
                torch.empty(request, dtype=torch.uint8, device="cuda")
            message = str(cm.exception)
            print("OOM message:", message, flush=True)
            self.assertIn("graphalloc", message)
            self.assertEqual(len(calls), 1, calls)
            device, alloc, _, _ = calls[0]
            self.assertEqual(device, 0)
            self.assertGreaterEqual(alloc, request)
            self.assertLess(alloc, request + 2 * MiB + 1)  # the request, rounded
            t, g = self.both_stats()
            self.assertEqual(g["num_ooms"], before + 1)
            self.assertEqual(t["num_ooms"], g["num_ooms"])
            y = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")  # the retry fits
            y.fill_(1)
            self.assertEqual(int(y[-1]), 1)
            del y
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        # An impossible request: OutOfMemoryError too, the observer called again.
        with self.assertRaises(torch.cuda.OutOfMemoryError):
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        self.assertEqual(len(calls), 2)
        x = torch.ones(1000, device="cuda")
        self.assertEqual(float(x.sum()), 1000.0)

    def test_caching_allocator_alloc_delete(self):
        torch = self.torch
        before, _ = self.both_stats()
        s = torch.cuda.Stream()
        p = torch.cuda.caching_allocator_alloc(3 * MiB + 1)
        q = torch.cuda.caching_allocator_alloc(1000, device=0, stream=s)
        self.assertNotEqual(p, 0)
        self.assertNotEqual(q, 0)
        mid, g = self.both_stats()
        self.assertEqual(mid["allocation.all.current"] - before["allocation.all.current"], 2)
        self.assertEqual(mid["requested_bytes.all.current"] - before["requested_bytes.all.current"], 3 * MiB + 1001)
        self.assertEqual(mid["allocated_bytes.all.current"], g["allocated_bytes.all.current"])
        torch.cuda.caching_allocator_delete(p)
        torch.cuda.caching_allocator_delete(q)
        end, _ = self.both_stats()
        self.assertEqual(end["allocation.all.current"], before["allocation.all.current"])
        self.assertEqual(end["allocated_bytes.all.current"], before["allocated_bytes.all.current"])

    def test_record_stream_keeps_memory_until_the_stream_passes(self):
        torch = self.torch
        side = torch.cuda.Stream()
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        ptr = x.data_ptr()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on the side stream
            x.fill_(7)
        x.record_stream(side)
        del x
        y = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        self.assertNotEqual(y.data_ptr(), ptr, "memory used by a pending kernel on another stream was reused")
        side.synchronize()
        del y
        torch.cuda.synchronize()
        # Once the side stream has passed, the block is free again: the same size is served from the cache.
        t, _ = self.both_stats()
        reserved = t["reserved_bytes.all.current"]
        z = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        t, _ = self.both_stats()
        self.assertEqual(t["reserved_bytes.all.current"], reserved)
        del z

    def test_get_base_allocation_if_exposed(self):
        torch = self.torch
        fn = getattr(torch._C, "_cuda_getBaseAllocation", None)
        if fn is None:
            self.skipTest("this PyTorch exposes no getBaseAllocation to Python (used only by IPC)")
        x = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
        view = x[MiB:]
        base = fn(view.data_ptr())
        print("getBaseAllocation:", base, flush=True)
        self.assertIn(x.data_ptr(), base if isinstance(base, (tuple, list)) else (base,))

    def train_under_cudnn_benchmark(self, model, x, y, opt, steps=6):
        """Losses of `steps` SGD steps on one batch with cuDNN's benchmark mode on (each algorithm trial asks
        cacheInfo how much workspace it may take)."""
        torch = self.torch
        old = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            losses = []
            for _ in range(steps):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss))
            return losses
        finally:
            torch.backends.cudnn.benchmark = old

    def test_cudnn_benchmark_training(self):
        torch = self.torch
        nn = torch.nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                              nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x = torch.randn(32, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (32,), device="cuda")
        losses = self.train_under_cudnn_benchmark(model, x, y, opt)
        print("cudnn.benchmark losses:", losses, flush=True)
        self.assertTrue(all(l == l and l < 100 for l in losses), losses)
        self.assertLess(losses[-1], losses[0])

    def test_cudnn_benchmark_trains_resnet50(self):
        # The model: torchvision's ResNet-50. Training must run and learn.
        torch = self.torch
        try:
            import torchvision
        except ImportError:
            self.skipTest("torchvision is not installed")
        torch.manual_seed(0)
        model = torchvision.models.resnet50(weights=None).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(16, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (16,), device="cuda")
        try:
            losses = self.train_under_cudnn_benchmark(model, x, y, opt)
        finally:
            del model, opt, x, y
            torch.cuda.empty_cache()
        print("ResNet-50 cudnn.benchmark losses:", losses, flush=True)
        self.assertTrue(all(l == l and l < 100 for l in losses), losses)
        self.assertLess(losses[-1], losses[0])
        self.assertEqual(torch.cuda.get_allocator_backend(), "graphalloc")

    def test_cache_info_is_the_largest_run(self):
        # PyTorch's cacheInfo (cuDNN sizes its workspace from it) gives the largest contiguous free run,
        # the largest inactive block of torch.cuda.memory_snapshot() (expandable segments are shown one
        # segment per mapped range), never a sum of pieces across unmapped holes.
        import ctypes
        torch, gat = self.torch, self.gat
        from graphalloc import _torch_state
        shim = _torch_state.shim
        shim.graphalloc_torch_backend_cache_info.restype = ctypes.c_size_t
        shim.graphalloc_torch_backend_cache_info.argtypes = [ctypes.c_int, ctypes.c_size_t]
        torch.cuda.empty_cache()
        keep, gone = [], []
        for i in range(12):  # live and free blocks interleaved: several free runs of different sizes
            (keep if i % 3 == 0 else gone).append(torch.empty((i + 1) * MiB, dtype=torch.uint8, device="cuda"))
        del gone
        torch.cuda.synchronize()
        largest_inactive = max((b["size"] for seg in torch.cuda.memory_snapshot() for b in seg["blocks"]
                                if b["state"] == "inactive"), default=0)
        print("largest inactive block:", largest_inactive, flush=True)
        self.assertGreater(largest_inactive, 0)
        self.assertEqual(shim.graphalloc_torch_backend_cache_info(0, 1), largest_inactive)
        free, _ = torch.cuda.mem_get_info()
        self.assertGreaterEqual(shim.graphalloc_torch_backend_cache_info(0, 0), max(largest_inactive, free) - 64 * MiB)
        del keep

    def test_ipc_share_without_shareable_handles_is_refused_clearly(self):
        torch = self.torch
        x = torch.ones(1024, device="cuda")
        with self.assertRaises(Exception) as cm:
            x.untyped_storage()._share_cuda_()
        message = str(cm.exception)
        print("IPC:", type(cm.exception).__name__, message, flush=True)
        self.assertIn("graphalloc", message)
        self.assertRegex(message.lower(), r"ipc|shar")
        if "expandable_segments:False" not in os.environ.get("GRAPHALLOC_CONF", ""):
            self.assertIn("shareable_handles", message)
        from torch.multiprocessing.reductions import reduce_tensor
        with self.assertRaises(Exception) as cm2:
            reduce_tensor(x)
        self.assertIn("graphalloc", str(cm2.exception))
        self.assertEqual(float(x.sum()), 1024.0)  # the tensor is untouched

    def test_mem_pool(self):
        torch = self.torch
        torch.cuda.empty_cache()
        outside = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
        pool = torch.cuda.MemPool()
        self.assertEqual(pool.use_count(), 1)
        with torch.cuda.use_mem_pool(pool):
            self.assertEqual(pool.use_count(), 2)
            a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
            b = torch.empty(1000, dtype=torch.uint8, device="cuda")
        self.assertEqual(pool.use_count(), 1)
        c = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # after the context: not in the pool

        def blocks_by_pool():
            out = {}
            for seg in torch.cuda.memory._snapshot()["segments"]:
                addr = seg["address"]
                for blk in seg["blocks"]:
                    if blk["state"] == "active_allocated":
                        out[addr] = tuple(seg["segment_pool_id"])
                    addr += blk["size"]
            return out
        owners = blocks_by_pool()
        pid = tuple(pool.id)
        self.assertEqual(owners.get(a.data_ptr()), pid)
        self.assertEqual(owners.get(b.data_ptr()), pid)
        self.assertNotEqual(owners.get(c.data_ptr()), pid)
        self.assertNotEqual(owners.get(outside.data_ptr()), pid)
        pool_segments = pool.snapshot()
        self.assertTrue(pool_segments, "pool.snapshot() is empty")
        self.assertTrue(all(tuple(s["segment_pool_id"]) == pid for s in pool_segments))
        in_pool = sum(s["allocated_size"] for s in pool_segments)
        self.assertEqual(in_pool, 3 * MiB + 1024)
        # Memory of the pool goes back once the pool and its tensors are gone.
        del a, b, pool
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        left = [s for s in torch.cuda.memory._snapshot()["segments"] if tuple(s["segment_pool_id"]) == pid]
        self.assertEqual(left, [], "the pool's segments outlived the pool and its tensors")
        del c, outside

    def test_mem_pool_use_on_oom_is_accepted(self):
        torch = self.torch
        pool = torch.cuda.MemPool(use_on_oom=True)
        with torch.cuda.use_mem_pool(pool):
            x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        del x
        x = torch.ones(10, device="cuda")  # the default pool still works
        self.assertEqual(float(x.sum()), 10.0)
        del pool


if __name__ == "__main__":
    bc.run_main()
