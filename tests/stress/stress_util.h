// Helpers shared by the stress tests: their operation counts (tests/testing/test_scale.h has the seed and
// the scale), and the checks that nothing leaked.
#ifndef GRAPHALLOC_TESTS_STRESS_STRESS_UTIL_H_
#define GRAPHALLOC_TESTS_STRESS_STRESS_UTIL_H_

#include <cstddef>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "graphalloc/allocator/stats/stats.h"
#include "gtest/gtest.h"
#include "tests/testing/test_scale.h"

namespace graphalloc::testing {

// `base` operations (at least one), times GRAPHALLOC_TEST_SCALE (scripts/test.sh sets it below 1 for the
// sanitizer builds, where every operation costs several times more) and times GRAPHALLOC_STRESS_SCALE (a
// soak: GRAPHALLOC_STRESS_SCALE=100).
inline int StressOps(int base) { return ScaledCount(base, ScaleFromEnvironment("GRAPHALLOC_STRESS_SCALE")); }

// The allocator holds no block and no device memory: allocations, active blocks, allocated and reserved
// bytes and segments are all zero.
inline ::testing::AssertionResult AllocatorIsEmpty(const DeviceStats& s) {
  if (s.allocation.all().current == 0 && s.active.all().current == 0 &&
      s.allocated_bytes.all().current == 0 && s.reserved_bytes.all().current == 0 &&
      s.segment.all().current == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "allocations " << s.allocation.all().current << ", active " << s.active.all().current
         << ", allocated bytes " << s.allocated_bytes.all().current << ", reserved bytes "
         << s.reserved_bytes.all().current << ", segments " << s.segment.all().current;
}

// The simulated device holds no reservation, handle, mapping, plain allocation or queued work, and, with
// `all`, no event, stream, graph or graph exec either (what an allocator may keep until it is destroyed).
inline ::testing::AssertionResult DeviceHoldsNothing(const SimDriver& sim, bool all) {
  const SimCounters c = sim.Counters();
  const bool memory = c.reservations == 0 && c.reserved_bytes == 0 && c.handles == 0 && c.handle_bytes == 0 &&
                      c.mappings == 0 && c.mapped_bytes == 0 && c.allocations == 0 &&
                      c.allocated_bytes == 0 && c.pending_work == 0 && sim.UsedBytes() == 0;
  const bool rest = c.events == 0 && c.streams == 0 && c.graphs == 0 && c.graph_execs == 0;
  if (memory && (!all || rest)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "the device still holds: reservations " << c.reservations << " (" << c.reserved_bytes
         << " bytes), handles " << c.handles << " (" << c.handle_bytes << " bytes), mappings " << c.mappings
         << " (" << c.mapped_bytes << " bytes), allocations " << c.allocations << " (" << c.allocated_bytes
         << " bytes), used bytes " << sim.UsedBytes() << ", pending work " << c.pending_work << ", events "
         << c.events << ", streams " << c.streams << ", graphs " << c.graphs << ", graph execs "
         << c.graph_execs;
}

// Every byte is accounted for: the allocator's reserved bytes are exactly the device memory mapped or
// allocated for it, mappings come from handles, and regular segments (not `expandable`) hold no VMM
// resource.
inline ::testing::AssertionResult DeviceAccountsForReserved(const SimDriver& sim,
                                                            const CachingAllocator& allocator,
                                                            bool expandable) {
  const SimCounters c = sim.Counters();
  const auto reserved = static_cast<std::size_t>(allocator.GetStats().reserved_bytes.all().current);
  if (reserved != c.mapped_bytes + c.allocated_bytes) {
    return ::testing::AssertionFailure()
           << "the allocator reserves " << reserved << " bytes; the device has " << c.mapped_bytes
           << " mapped and " << c.allocated_bytes << " allocated";
  }
  if (c.handle_bytes < c.mapped_bytes) {
    return ::testing::AssertionFailure()
           << c.mapped_bytes << " bytes mapped from handles of " << c.handle_bytes;
  }
  if (sim.UsedBytes() != c.handle_bytes + c.allocated_bytes) {
    return ::testing::AssertionFailure() << "device uses " << sim.UsedBytes() << " bytes; handles "
                                         << c.handle_bytes << ", allocations " << c.allocated_bytes;
  }
  if (!expandable && (c.reservations != 0 || c.handles != 0 || c.mappings != 0)) {
    return ::testing::AssertionFailure()
           << "regular segments hold VMM resources: " << c.reservations << " reservations, " << c.handles
           << " handles, " << c.mappings << " mappings";
  }
  return ::testing::AssertionSuccess();
}

// Once every block is freed: lets the device finish its work, empties the cache, and checks that the
// invariants hold, the allocator is empty and the device holds none of its memory. Run before the
// allocator is destroyed, whose destructor would hide a leak.
inline ::testing::AssertionResult DrainAndCheckNothingLeaked(SimDriver& sim, CachingAllocator& allocator) {
  sim.RunAllPendingWork();
  if (absl::Status s = allocator.EmptyCache(); !s.ok())
    return ::testing::AssertionFailure() << "EmptyCache: " << s;
  if (absl::Status s = allocator.CheckInvariants(); !s.ok()) return ::testing::AssertionFailure() << s;
  if (::testing::AssertionResult r = AllocatorIsEmpty(allocator.GetStats()); !r) return r;
  return DeviceHoldsNothing(sim, /*all=*/false);
}

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_STRESS_STRESS_UTIL_H_
