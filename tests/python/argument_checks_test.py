"""Every graphalloc function that takes a size, a count, a device, a pool id or an address checks it before
ctypes converts it: TypeError for what is not an integer (1.5, "4096", True), ValueError for what is out of
range (-1, 2**64, a device of 2**31), each naming the function and the argument, and nothing allocated. Runs
on the simulated device, without PyTorch."""
import unittest

import graphalloc as ga

MiB = 1 << 20


class ArgumentChecksTest(unittest.TestCase):
    def assert_value_error(self, call, *words):
        with self.assertRaises(ValueError) as cm:
            call()
        for w in words:
            self.assertIn(w, str(cm.exception))

    def assert_type_error(self, call, *words):
        with self.assertRaises(TypeError) as cm:
            call()
        for w in words:
            self.assertIn(w, str(cm.exception))

    def test_malloc_refuses_sizes_ctypes_would_wrap(self):
        before = ga.stats(0)["allocation.all.current"]
        self.assert_value_error(lambda: ga.malloc(2**64), "graphalloc.malloc: size", "below 2**64", str(2**64))
        self.assert_value_error(lambda: ga.malloc(2**64 + 4096), "graphalloc.malloc: size")
        self.assert_value_error(lambda: ga.malloc(-1), "graphalloc.malloc: size", "at least 0", "not -1")
        self.assert_type_error(lambda: ga.malloc(1.5), "graphalloc.malloc: size must be an int, not float (1.5)")
        self.assert_type_error(lambda: ga.malloc("4096"), "size must be an int, not str")
        self.assert_type_error(lambda: ga.malloc(True), "size must be an int, not bool")
        self.assertEqual(ga.stats(0)["allocation.all.current"], before)  # nothing was allocated

    def test_malloc_accepts_the_edges_of_the_range(self):
        self.assertEqual(ga.malloc(0), 0)  # the null address, as the C ABI gives it
        ga.free(0)
        p = ga.malloc(MiB)
        ga.free(p)
        # The largest size passes the check and reaches the allocator, which refuses it as out of memory.
        with self.assertRaises(ga.GraphallocError) as cm:
            ga.malloc(2**64 - 1)
        self.assertEqual(cm.exception.code, ga.OUT_OF_MEMORY)

    def test_devices_must_be_non_negative_c_ints(self):
        for call, name in ((lambda d: ga.malloc(16, device=d), "malloc"), (lambda d: ga.stats(d), "stats_json"),
                           (lambda d: ga.empty_cache(d), "empty_cache"), (lambda d: ga.free(0, d), "free"),
                           (lambda d: ga.reset_peak_stats(d), "reset_peak_stats"),
                           (lambda d: ga.pool_create(d), "pool_create"), (lambda d: ga.sleep(device=d), "sleep"),
                           (lambda d: ga.record_history(d), "record_history")):
            self.assert_value_error(lambda: call(-1), f"graphalloc.{name}: device", "not -1")
            self.assert_value_error(lambda: call(2**31), f"graphalloc.{name}: device", "below 2**31")
            self.assert_type_error(lambda: call(0.0), f"graphalloc.{name}: device must be an int, not float")

    def test_pointers_streams_and_pools_are_unsigned_64_bit(self):
        self.assert_value_error(lambda: ga.free(-8), "graphalloc.free: ptr")
        self.assert_value_error(lambda: ga.malloc(16, stream=2**64), "graphalloc.malloc: stream")
        self.assert_value_error(lambda: ga.record_stream(0, -1), "graphalloc.record_stream: stream")
        self.assert_value_error(lambda: ga.pool_stats(-1), "graphalloc.pool_stats: pool")
        self.assert_type_error(lambda: ga.pool_release("1"), "graphalloc.pool_release: pool must be an int")
        self.assert_value_error(lambda: ga.allocate_to_pool(2**64), "graphalloc.allocate_to_pool: pool")
        self.assert_value_error(lambda: ga.pool_sleep(1, device=-2), "graphalloc.pool_sleep: device")

    def test_history_length_is_a_count_within_the_ring(self):
        self.assert_value_error(lambda: ga.record_history(0, True, 0), "graphalloc.record_history: max_entries",
                                "at least 1")
        self.assert_value_error(lambda: ga.record_history(0, True, 2**63 - 1), "max_entries", "at most 2**28")
        self.assert_type_error(lambda: ga.record_history(0, True, 1e5), "max_entries must be an int, not float")
        ga.record_history(0, True, ga.MAX_HISTORY_ENTRIES)  # the largest is accepted, and costs nothing yet
        ga.record_history(0, False)

    def test_memory_fraction_is_a_number_between_0_and_1(self):
        self.assert_value_error(lambda: ga.set_memory_fraction(1.5), "graphalloc.set_memory_fraction: fraction",
                                "between 0 and 1")
        self.assert_value_error(lambda: ga.set_memory_fraction(float("nan")), "fraction")
        self.assert_type_error(lambda: ga.set_memory_fraction("0.5"), "fraction must be a number, not str")
        ga.set_memory_fraction(1)  # an int is a number

    def test_numpy_style_integers_are_accepted(self):
        class Index:  # what numpy integers look like to Python: __index__, not int
            def __index__(self):
                return 4096

        p = ga.malloc(Index())
        self.assertNotEqual(p, 0)
        ga.free(p)


if __name__ == "__main__":
    unittest.main()
