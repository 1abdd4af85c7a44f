"""Sleep and wake from Python (ctypes over the C ABI), on the simulated device: pools by tag, by id and the
whole allocator; addresses kept, contents kept with a backup (the simulated device's addresses are host
addresses, so the test writes and reads them with ctypes), allocations from a sleeping pool refused with the
pool named, and errors as GraphallocError with the C ABI's code and message."""
import ctypes
import os
import unittest

import graphalloc as ga

MiB = 1 << 20
ON_SIM = os.environ.get("GRAPHALLOC_DEVICE") == "sim"


def malloc_in(pool, size):
    """`size` bytes from `pool` (0: the default pool) through a route of the calling thread."""
    if pool == 0:
        return ga.malloc(size, 0)
    with ga.allocate_to_pool(pool, 0):
        return ga.malloc(size, 0)


def fill(ptr, size, byte):
    if ON_SIM:
        ctypes.memset(ptr, byte, size)


def holds(ptr, size, byte):
    return not ON_SIM or ctypes.string_at(ptr, size) == bytes([byte]) * size


class SleepWakeTest(unittest.TestCase):
    def tearDown(self):
        ga.wake()  # whatever a failed test left asleep
        self.assertFalse(ga.pool_sleep_state(0)["asleep"])

    def test_a_tag_sleeps_its_pools_with_backup_and_wakes_them_at_the_same_addresses(self):
        weights = ga.pool_create(0, tag="weights")
        kv = ga.pool_create(0, tag="kv")
        w = malloc_in(weights, 4 * MiB)
        k = malloc_in(kv, 2 * MiB)
        fill(w, 4 * MiB, 0x3C)
        ga.sleep("weights", backup=True)
        self.assertEqual(ga.pool_sleep_state(weights),
                         {"asleep": True, "sleeping_bytes": 4 * MiB, "backup_bytes": 4 * MiB})
        self.assertFalse(ga.pool_sleep_state(kv)["asleep"])
        self.assertFalse(ga.pool_sleep_state(0)["asleep"])
        ga.wake("weights")
        # Awake, the pinned buffer kept for the next backed-up sleep until empty_cache.
        self.assertEqual(ga.pool_sleep_state(weights),
                         {"asleep": False, "sleeping_bytes": 0, "backup_bytes": 4 * MiB})
        self.assertTrue(holds(w, 4 * MiB, 0x3C))
        ga.empty_cache(0)
        self.assertEqual(ga.pool_sleep_state(weights), {"asleep": False, "sleeping_bytes": 0, "backup_bytes": 0})
        # The pool goes on serving at the addresses it had: a freed block comes back at the same place.
        ga.free(w, 0)
        self.assertEqual(malloc_in(weights, 4 * MiB), w)
        ga.free(w, 0)
        ga.free(k, 0)
        ga.pool_release(weights, 0)
        ga.pool_release(kv, 0)

    def test_a_list_of_tags_and_discard(self):
        a = ga.pool_create(0, tag="a")
        b = ga.pool_create(0, tag="b")
        c = ga.pool_create(0, tag="c")
        ptrs = [malloc_in(p, 2 * MiB) for p in (a, b, c)]
        ga.sleep(["a", "b", "a"])  # duplicates count once; no backup: contents discarded
        self.assertEqual([ga.pool_sleep_state(p)["asleep"] for p in (a, b, c)], [True, True, False])
        self.assertEqual(ga.pool_sleep_state(a)["backup_bytes"], 0)
        self.assertEqual(ga.pool_sleep_state(a)["sleeping_bytes"], 2 * MiB)
        ga.wake(["b"])
        self.assertEqual([ga.pool_sleep_state(p)["asleep"] for p in (a, b, c)], [True, False, False])
        ga.wake(("a", "b"))  # b is awake already: left as it is
        self.assertEqual([ga.pool_sleep_state(p)["asleep"] for p in (a, b, c)], [False, False, False])
        fill(ptrs[0], 2 * MiB, 0x11)  # fresh memory at the same address, usable
        self.assertTrue(holds(ptrs[0], 2 * MiB, 0x11))
        for p in ptrs:
            ga.free(p, 0)
        for p in (a, b, c):
            ga.pool_release(p, 0)

    def test_allocation_from_a_sleeping_pool_raises_with_the_pool_named_and_frees_are_allowed(self):
        pool = ga.pool_create(0, tag="cache")
        p = malloc_in(pool, MiB)
        q = malloc_in(pool, MiB)
        ga.pool_sleep(pool)
        self.assertTrue(ga.pool_sleep_state(pool)["asleep"])
        with self.assertRaises(ga.GraphallocError) as cm:
            malloc_in(pool, MiB)
        self.assertEqual(cm.exception.code, ga.FAILED_PRECONDITION)
        self.assertEqual(cm.exception.function, "graphalloc_malloc")
        self.assertIn(f"pool {pool} (tag 'cache') is asleep", str(cm.exception))
        ga.free(q, 0)  # frees into a sleeping pool are allowed
        self.assertEqual(ga.pool_stats(pool)["live_blocks"], 1)
        ga.pool_wake(pool)
        self.assertFalse(ga.pool_sleep_state(pool)["asleep"])
        r = malloc_in(pool, MiB)
        ga.free(r, 0)
        ga.free(p, 0)
        ga.pool_release(pool, 0)

    def test_the_whole_allocator_sleeps_and_wakes_the_default_pool_too(self):
        pool = ga.pool_create(0)  # no tag: only the whole allocator or its id reaches it
        p = malloc_in(pool, 2 * MiB)
        d = malloc_in(0, 2 * MiB)
        fill(p, 2 * MiB, 0x5A)
        fill(d, 2 * MiB, 0x77)
        ga.sleep(backup=True)
        self.assertTrue(ga.pool_sleep_state(pool)["asleep"])
        default = ga.pool_sleep_state(0)
        self.assertTrue(default["asleep"])
        self.assertGreaterEqual(default["backup_bytes"], 2 * MiB)
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.malloc(MiB, 0)
        self.assertEqual(cm.exception.code, ga.FAILED_PRECONDITION)
        self.assertIn("the default pool is asleep", str(cm.exception))
        ga.wake()
        self.assertFalse(ga.pool_sleep_state(pool)["asleep"])
        self.assertFalse(ga.pool_sleep_state(0)["asleep"])
        self.assertTrue(holds(p, 2 * MiB, 0x5A))
        self.assertTrue(holds(d, 2 * MiB, 0x77))
        # The default pool alone, by id 0.
        ga.pool_sleep(0, backup=True)
        self.assertTrue(ga.pool_sleep_state(0)["asleep"])
        self.assertFalse(ga.pool_sleep_state(pool)["asleep"])
        ga.pool_wake(0)
        self.assertTrue(holds(d, 2 * MiB, 0x77))
        ga.free(p, 0)
        ga.free(d, 0)
        ga.pool_release(pool, 0)
        ga.empty_cache(0)

    def test_errors_carry_the_code_and_message(self):
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.sleep("no-such-tag")
        self.assertEqual(cm.exception.code, ga.INVALID_ARGUMENT)
        self.assertIn("no pool has the tag 'no-such-tag'", str(cm.exception))
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.wake(["no-such-tag"])
        self.assertEqual(cm.exception.code, ga.INVALID_ARGUMENT)
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.pool_sleep(999999)
        self.assertEqual(cm.exception.code, ga.INVALID_ARGUMENT)
        self.assertIn("private pool 999999 does not exist", str(cm.exception))
        with self.assertRaises(ga.GraphallocError):
            ga.pool_wake(999999)
        with self.assertRaises(ga.GraphallocError):
            ga.pool_sleep_state(999999)
        # Several tags: the error names those already asleep (they stay asleep).
        pool = ga.pool_create(0, tag="first")
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.sleep(["first", "no-such-tag"])
        self.assertIn("no pool has the tag 'no-such-tag'", str(cm.exception))
        self.assertIn("asleep now: 'first'", str(cm.exception))
        self.assertTrue(ga.pool_sleep_state(pool)["asleep"])
        ga.wake("first")
        ga.pool_release(pool, 0)
        with self.assertRaises(ValueError):
            ga.sleep([])
        with self.assertRaises(ValueError):
            ga.wake("")
        with self.assertRaises(TypeError):
            ga.sleep([3])


if __name__ == "__main__":
    unittest.main(verbosity=2)
