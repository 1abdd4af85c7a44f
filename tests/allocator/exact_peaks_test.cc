// Peaks of the block statistics are exact device-wide: the highest value the device's sum reached, not the
// sum of each stream's (or pool's) own peak. Each stream shard counts its own blocks; the PeakLedger folds
// them (allocator/core/peak_ledger.h). A randomized run over several streams and a private pool compares
// every peak with the one the test tracks itself, after every step.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/test_scale.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;

class ExactPeaksTest : public AllocatorFixture {};

// The peaks the allocator reports for the figures a PyTorch user reads.
struct Peaks {
  std::int64_t allocated, active, requested, allocations;
  friend bool operator==(const Peaks&, const Peaks&) = default;
};
Peaks PeaksOf(const DeviceStats& s) {
  return {s.allocated_bytes.all().peak, s.active_bytes.all().peak, s.requested_bytes.all().peak,
          s.allocation.all().peak};
}

TEST_F(ExactPeaksTest, TwoStreamsThatPeakAtDifferentTimesPeakAtTheLargerNotTheSum) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream side = NewStream();
  DevicePtr a = Alloc(3 * kMiB);
  FreeOk(a);
  DevicePtr b = Alloc(2 * kMiB, side);
  FreeOk(b);
  // Never more than 3 MiB live at once (the sum of the two streams' own peaks would say 5 MiB).
  EXPECT_EQ(PeaksOf(Stats()), (Peaks{3 * kMiB, 3 * kMiB, 3 * kMiB, 1}));
  EXPECT_EQ(Stats().allocated_bytes[StatType::kLargePool].peak, 3 * kMiB);
  EXPECT_EQ(allocator_->TakeSnapshot().pools[0].peak_allocated_bytes, 3 * kMiB);
  // Both live together: a new peak, exactly their sum.
  a = Alloc(3 * kMiB);
  b = Alloc(2 * kMiB, side);
  EXPECT_EQ(PeaksOf(Stats()), (Peaks{5 * kMiB, 5 * kMiB, 5 * kMiB, 2}));
  FreeOk(a);
  FreeOk(b);
  ExpectInvariants();
}

TEST_F(ExactPeaksTest, SmallAndLargePoolsHaveTheirOwnExactPeaks) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream side = NewStream();
  DevicePtr small = Alloc(512 * 1024);      // small pool, default stream
  DevicePtr large = Alloc(4 * kMiB, side);  // large pool, side stream
  FreeOk(small);
  FreeOk(large);
  small = Alloc(256 * 1024, side);
  FreeOk(small);
  const DeviceStats s = Stats();
  EXPECT_EQ(s.allocated_bytes[StatType::kSmallPool].peak, 512 * 1024);
  EXPECT_EQ(s.allocated_bytes[StatType::kLargePool].peak, 4 * kMiB);
  EXPECT_EQ(s.allocated_bytes.all().peak, 512 * 1024 + 4 * kMiB);
  EXPECT_EQ(s.allocation[StatType::kSmallPool].peak, 1);
  EXPECT_EQ(s.allocation.all().peak, 2);
  ExpectInvariants();
}

TEST_F(ExactPeaksTest, PrivatePoolAndDefaultPoolTakeTurnsWithoutAddingUp) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  absl::StatusOr<PrivatePool> pool = allocator_->CreatePool();
  ASSERT_TRUE(pool.ok()) << pool.status();
  for (int round = 0; round < 3; ++round) {
    DevicePtr p = 0;
    {
      absl::StatusOr<PoolRoute> route =
          allocator_->BeginAllocateToPool(*pool, PoolRouteFilter::ForCallingThread());
      ASSERT_TRUE(route.ok()) << route.status();
      p = Alloc(6 * kMiB);
    }
    FreeOk(p);
    DevicePtr q = Alloc(4 * kMiB);
    FreeOk(q);
  }
  EXPECT_EQ(PeaksOf(Stats()), (Peaks{6 * kMiB, 6 * kMiB, 6 * kMiB, 1}));
  absl::StatusOr<PoolStats> pool_stats = allocator_->GetPoolStats(pool->id());
  ASSERT_TRUE(pool_stats.ok());
  EXPECT_EQ(pool_stats->peak_allocated_bytes, 6 * kMiB);
  ExpectInvariants();
}

TEST_F(ExactPeaksTest, ResetPeakStatsStartsFromTheCurrentSumAndStaysExact) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream side = NewStream();
  DevicePtr keep = Alloc(8 * kMiB);
  DevicePtr gone = Alloc(8 * kMiB, side);
  FreeOk(gone);
  allocator_->ResetPeakStats();
  EXPECT_EQ(PeaksOf(Stats()), (Peaks{8 * kMiB, 8 * kMiB, 8 * kMiB, 1}));
  // Each stream grows in turn, one block at a time; never more than 8 + 2 MiB live.
  for (int i = 0; i < 4; ++i) {
    DevicePtr p = Alloc(2 * kMiB, i % 2 == 0 ? side : kDefaultStream);
    FreeOk(p);
  }
  EXPECT_EQ(PeaksOf(Stats()), (Peaks{10 * kMiB, 10 * kMiB, 10 * kMiB, 2}));
  FreeOk(keep);
  ExpectInvariants();
}

TEST_F(ExactPeaksTest, BlockWaitingForAnotherStreamCountsActiveUntilReleased) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream side = NewStream();
  DevicePtr a = Alloc(1 * kMiB);
  ASSERT_TRUE(allocator_->RecordStream(a, side).ok());
  FreeOk(a);  // active until the side stream passes the free
  DevicePtr b = Alloc(1 * kMiB, side);
  FreeOk(b);
  ASSERT_TRUE(allocator_->EmptyCache().ok());  // completes the event
  const DeviceStats s = Stats();
  EXPECT_EQ(s.allocated_bytes.all().peak, 1 * kMiB);  // never two allocated at once
  EXPECT_EQ(s.active_bytes.all().peak, 2 * kMiB);     // but two active
  ExpectInvariants();
}

// Several streams and a private pool, random sizes, allocations and frees: every peak the allocator reports
// equals the highest sum the test saw, after every step.
TEST_F(ExactPeaksTest, RandomizedStreamsAndPoolReportExactlyTheHighestSum) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const std::uint64_t seed = testing::TestSeed(20261128);
  std::printf("seed %llu (GRAPHALLOC_TEST_SEED replays it)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::vector<Stream> streams = {kDefaultStream, NewStream(), NewStream(), NewStream()};
  absl::StatusOr<PrivatePool> pool = allocator_->CreatePool();
  ASSERT_TRUE(pool.ok());
  struct Live {
    DevicePtr ptr;
    std::int64_t bytes;  // the block's (rounded) size
    std::int64_t requested;
  };
  std::vector<Live> live;
  std::int64_t allocated = 0, requested = 0, peak_allocated = 0, peak_requested = 0, peak_count = 0;
  const int steps = testing::ScaledCount(3000);
  for (int step = 0; step < steps; ++step) {
    const bool alloc = live.empty() || (live.size() < 40 && rng() % 100 < 55);
    if (alloc) {
      const std::size_t bytes = 1 + rng() % (rng() % 4 == 0 ? 8 * kMiB : 64 * 1024);
      const Stream stream = streams[rng() % streams.size()];
      std::optional<PoolRoute> route;
      if (rng() % 4 == 0) {
        absl::StatusOr<PoolRoute> r =
            allocator_->BeginAllocateToPool(*pool, PoolRouteFilter::ForCallingThread());
        ASSERT_TRUE(r.ok());
        route = std::move(*r);
      }
      absl::StatusOr<DevicePtr> p = allocator_->Allocate(bytes, stream);
      ASSERT_TRUE(p.ok()) << p.status();
      route.reset();
      // The block's size is what the snapshot says (the allocator may keep a rest inside).
      std::int64_t block = 0;
      for (const SegmentSnapshot& seg : allocator_->TakeSnapshot("", false).segments) {
        for (const BlockSnapshot& b : seg.blocks) {
          if (b.address == *p) block = static_cast<std::int64_t>(b.size);
        }
      }
      ASSERT_GT(block, 0);
      live.push_back({*p, block, static_cast<std::int64_t>(bytes)});
      allocated += block;
      requested += static_cast<std::int64_t>(bytes);
    } else {
      const std::size_t i = rng() % live.size();
      ASSERT_TRUE(allocator_->Free(live[i].ptr).ok());
      allocated -= live[i].bytes;
      requested -= live[i].requested;
      live[i] = live.back();
      live.pop_back();
    }
    peak_allocated = std::max(peak_allocated, allocated);
    peak_requested = std::max(peak_requested, requested);
    peak_count = std::max(peak_count, static_cast<std::int64_t>(live.size()));
    if (step % 97 == 0) {  // PyTorch users reset the peaks once per step
      allocator_->ResetPeakStats();
      peak_allocated = allocated;
      peak_requested = requested;
      peak_count = static_cast<std::int64_t>(live.size());
    }
    const DeviceStats s = Stats();
    ASSERT_EQ(s.allocated_bytes.all().current, allocated) << "step " << step;
    ASSERT_EQ(s.allocated_bytes.all().peak, peak_allocated) << "step " << step;
    ASSERT_EQ(s.active_bytes.all().peak, peak_allocated) << "step " << step;
    ASSERT_EQ(s.requested_bytes.all().peak, peak_requested) << "step " << step;
    ASSERT_EQ(s.allocation.all().peak, peak_count) << "step " << step;
    if (step % 50 == 0) {
      const absl::Status invariants = allocator_->CheckInvariants();
      ASSERT_TRUE(invariants.ok()) << invariants;
    }
  }
  for (const Live& l : live) FreeOk(l.ptr);
  ExpectInvariants();
}

}  // namespace
}  // namespace graphalloc
