"""graphalloc's private pools from Python (ctypes over the C ABI), on the simulated device: references, a
thread route, per-pool statistics and cache, and errors as GraphallocError with the C ABI's code."""
import unittest

import graphalloc as ga

MiB = 1 << 20


class PoolApiTest(unittest.TestCase):
    def test_thread_route_fills_the_pool_and_release_ends_it(self):
        pool = ga.pool_create(0)
        self.assertEqual(ga.pool_stats(pool)["use_count"], 1)
        with ga.allocate_to_pool(pool, 0):
            self.assertEqual(ga.pool_stats(pool)["use_count"], 2)  # the route is a user
            p = ga.malloc(3 * MiB, 0)
        q = ga.malloc(3 * MiB, 0)  # after the block: the default pool
        stats = ga.pool_stats(pool)
        self.assertEqual(stats["live_blocks"], 1)
        self.assertEqual(stats["allocated_bytes"], 3 * MiB)
        self.assertGreaterEqual(stats["reserved_bytes"], 3 * MiB)
        self.assertEqual(stats["use_count"], 1)
        ga.free(p, 0)
        ga.free(q, 0)
        ga.pool_empty_cache(pool, 0)
        self.assertEqual(ga.pool_stats(pool)["reserved_bytes"], 0)
        self.assertEqual(ga.pool_stats(pool)["peak_allocated_bytes"], 3 * MiB)
        ga.pool_retain(pool, 0)
        ga.pool_release(pool, 0)
        ga.pool_release(pool, 0)
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.pool_stats(pool)
        self.assertEqual(cm.exception.code, ga.INVALID_ARGUMENT)
        self.assertIn("does not exist", str(cm.exception))

    def test_no_split_pool_gives_each_allocation_a_segment(self):
        pool = ga.pool_create(0, no_split=True)
        with ga.allocate_to_pool(pool, 0):
            blocks = [ga.malloc(512, 0) for _ in range(3)]
        self.assertEqual(ga.pool_stats(pool)["segments"], 3)
        for b in blocks:
            ga.free(b, 0)
        ga.pool_release(pool, 0)

    def test_handle_aligned_pool_serves_and_frees(self):
        pool = ga.pool_create(0, handle_aligned=True)
        with ga.allocate_to_pool(pool, 0):
            blocks = [ga.malloc(64 << 20, 0) for _ in range(2)]
        self.assertEqual(ga.pool_stats(pool)["live_blocks"], 2)
        self.assertEqual(ga.pool_stats(pool)["allocated_bytes"], 128 << 20)
        for b in blocks:
            ga.free(b, 0)
        ga.pool_empty_cache(pool, 0)
        self.assertEqual(ga.pool_stats(pool)["reserved_bytes"], 0)
        ga.pool_release(pool, 0)

    def test_errors_carry_the_code_and_message(self):
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.pool_release(123456, 0)
        self.assertEqual(cm.exception.code, ga.INVALID_ARGUMENT)
        self.assertIn("no reference to pool", str(cm.exception))
        with self.assertRaises(ga.GraphallocError):
            with ga.allocate_to_pool(123456, 0):
                pass
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.malloc(1 << 50, 0)  # 1 PiB: more than the simulated device has
        self.assertEqual(cm.exception.code, ga.OUT_OF_MEMORY)


if __name__ == "__main__":
    unittest.main(verbosity=2)
