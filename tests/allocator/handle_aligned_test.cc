// Handle-aligned expandable segments (Config::handle_aligned, PoolOptions::handle_aligned), on the simulated
// device and (label `gpu`) on the real one: a block larger than a chunk maps one handle of its own, frees
// never merge blocks across a chunk's edge, cached handles are reused only at their exact size, a restore
// that would put a block across two handles is refused, and EmptyCache gives everything back. Every step
// checks the invariants, which include that no mapped block spans two chunks.
#include <cstdint>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/device_memory.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;
using testing::AsSim;

constexpr std::int64_t MiB = static_cast<std::int64_t>(kMiB);

Config HandleAligned() { return *Config::Parse("handle_aligned:True"); }

class HandleAlignedTest : public AllocatorFixture {
 protected:
  std::int64_t Reserved() const { return Stats().reserved_bytes.all().current; }
  // Handles created so far (simulated device only; -1 on the real one).
  std::int64_t Created() const {
    SimDriver* sim = AsSim(driver_.get());
    return sim == nullptr ? -1 : static_cast<std::int64_t>(sim->CallCount(SimCall::kMemCreate));
  }
  // Handles alive now (simulated device only; -1 on the real one).
  std::int64_t LiveHandles() const {
    SimDriver* sim = AsSim(driver_.get());
    return sim == nullptr ? -1 : static_cast<std::int64_t>(sim->Counters().handles);
  }
  // The sizes of the blocks below `end` of the one segment, in address order.
  std::vector<std::uint64_t> BlockSizesBelow(DevicePtr end) const {
    const MemorySnapshot snap = allocator_->TakeSnapshot();
    std::vector<std::uint64_t> sizes;
    EXPECT_EQ(snap.segments.size(), 1u);
    for (const SegmentSnapshot& segment : snap.segments) {
      for (const BlockSnapshot& block : segment.blocks) {
        if (block.address < end) sizes.push_back(block.size);
      }
    }
    return sizes;
  }
  // A private pool with handle_aligned, which this thread's allocations go to.
  void UseHandleAlignedPool() {
    PoolOptions options;
    options.handle_aligned = true;
    ASSERT_OK_AND_ASSIGN(pool_, allocator_->CreatePool(options));
    ASSERT_OK_AND_ASSIGN(route_, allocator_->BeginAllocateToPool(pool_, PoolRouteFilter::ForCallingThread()));
  }
  // Frees everything given, ends the pool, empties the cache: the device must hold nothing.
  void ExpectNothingLeftAfter(const std::vector<DevicePtr>& live) {
    for (DevicePtr p : live) FreeOk(p);
    (void)route_.End();
    pool_.Reset();
    ASSERT_OK(allocator_->EmptyCache());
    ExpectInvariants();
    EXPECT_EQ(Reserved(), 0);
    EXPECT_TRUE(allocator_->TakeSnapshot().segments.empty());
    SimDriver* sim = AsSim(driver_.get());
    if (sim == nullptr) return;
    const SimCounters c = sim->Counters();
    EXPECT_EQ(c.reservations, 0u);
    EXPECT_EQ(c.handles, 0u);
    EXPECT_EQ(c.mappings, 0u);
    EXPECT_EQ(c.illegal_accesses, 0u);
  }
  void TearDown() override {
    (void)route_.End();
    pool_.Reset();
    AllocatorFixture::TearDown();
  }

  PrivatePool pool_;
  PoolRoute route_;
};

TEST_F(HandleAlignedTest, ABlockLargerThanAChunkMapsOneHandleOfItsOwn) {
  GRAPHALLOC_ALLOCATOR_SETUP(HandleAligned());
  // Without the option, 100 MiB comes in handles of at most 48 MiB (growth_plan.cc): three of them.
  const DevicePtr a = Alloc(100 * kMiB);
  EXPECT_EQ(Reserved(), 100 * MiB);
  if (AsSim(driver_.get()) != nullptr) {
    EXPECT_EQ(Created(), 1);
    EXPECT_EQ(LiveHandles(), 1);
    EXPECT_EQ(AsSim(driver_.get())->Counters().handle_bytes, 100 * kMiB);
  }
  const DevicePtr b = Alloc(300 * kMiB);
  EXPECT_EQ(b, a + 100 * kMiB);
  EXPECT_EQ(Reserved(), 400 * MiB);
  if (AsSim(driver_.get()) != nullptr) {
    EXPECT_EQ(Created(), 2);
  }
  ASSERT_OK(testing::FillPattern(*driver_, a, 100 * kMiB, 1));
  ASSERT_OK(testing::FillPattern(*driver_, b, 300 * kMiB, 2));
  ASSERT_OK(testing::CheckPattern(*driver_, a, 100 * kMiB, 1));
  ASSERT_OK(testing::CheckPattern(*driver_, b, 300 * kMiB, 2));
  ExpectNothingLeftAfter({a, b});
}

TEST_F(HandleAlignedTest, AGrowthTakesNoFreeRunAcrossAChunkEdge) {
  GRAPHALLOC_ALLOCATOR_SETUP(HandleAligned());
  const DevicePtr a = Alloc(5 * kMiB / 2);  // a 4 MiB chunk; its last 1.5 MiB stay free
  EXPECT_EQ(Reserved(), 4 * MiB);
  // Without the option `b` would start in that free tail (a + 2.5 MiB) and span two chunks.
  const DevicePtr b = Alloc(3 * kMiB);
  EXPECT_EQ(b, a + 4 * kMiB);
  EXPECT_EQ(Reserved(), 8 * MiB);
  // What fits a chunk's free tail is served there and maps nothing.
  const DevicePtr d = Alloc(3 * kMiB / 2);
  EXPECT_EQ(d, a + 5 * kMiB / 2);
  EXPECT_EQ(Reserved(), 8 * MiB);
  if (AsSim(driver_.get()) != nullptr) {
    EXPECT_EQ(Created(), 2);
  }
  ExpectNothingLeftAfter({a, b, d});
}

TEST_F(HandleAlignedTest, FreedNeighboursInTwoChunksStayTwoBlocksAndAGrowthReleasesOneOfThem) {
  GRAPHALLOC_ALLOCATOR_SETUP(HandleAligned());
  const DevicePtr a = Alloc(4 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);
  ASSERT_EQ(b, a + 4 * kMiB);
  FreeOk(a);
  FreeOk(b);
  // 8 MiB are free and contiguous, but in two handles, so two blocks: a 6 MiB request maps a handle of
  // its own, and the lower idle 4 MiB chunk is released for it (the largest no larger than the request).
  const DevicePtr c = Alloc(6 * kMiB);
  EXPECT_EQ(c, a + 8 * kMiB);
  EXPECT_EQ(Reserved(), 10 * MiB);
  // The other free chunk still serves what fits in it; the released range is mapped again when needed.
  const DevicePtr d = Alloc(4 * kMiB);
  EXPECT_EQ(d, a + 4 * kMiB);
  const DevicePtr e = Alloc(3 * kMiB);
  EXPECT_EQ(e, a);
  EXPECT_EQ(Reserved(), 14 * MiB);
  if (AsSim(driver_.get()) != nullptr) {
    EXPECT_EQ(Created(), 4);
    EXPECT_EQ(LiveHandles(), 3);
  }
  EXPECT_EQ(BlockSizesBelow(a + 14 * kMiB), (std::vector<std::uint64_t>{3 * kMiB, kMiB, 4 * kMiB, 6 * kMiB}));
  ExpectNothingLeftAfter({c, d, e});
}

TEST_F(HandleAlignedTest, EmptyCacheUnmapsWholeChunksAndTheRangeIsMappedAgainInOneHandle) {
  GRAPHALLOC_ALLOCATOR_SETUP(HandleAligned());
  const DevicePtr a = Alloc(4 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);
  const DevicePtr c = Alloc(6 * kMiB);
  FreeOk(a);
  FreeOk(b);
  ASSERT_OK(allocator_->EmptyCache());
  ExpectInvariants();
  EXPECT_EQ(Reserved(), 6 * MiB);
  if (AsSim(driver_.get()) != nullptr) {
    EXPECT_EQ(LiveHandles(), 1);
  }
  // The two unmapped chunks' range is one unmapped block again: 8 MiB map as one handle.
  const DevicePtr d = Alloc(8 * kMiB);
  EXPECT_EQ(d, a);
  EXPECT_EQ(Reserved(), 14 * MiB);
  if (AsSim(driver_.get()) != nullptr) {
    EXPECT_EQ(Created(), 4);
    EXPECT_EQ(LiveHandles(), 2);
  }
  ASSERT_OK(testing::FillPattern(*driver_, d, 8 * kMiB, 3));
  ASSERT_OK(testing::CheckPattern(*driver_, d, 8 * kMiB, 3));
  ExpectNothingLeftAfter({c, d});
}

TEST_F(HandleAlignedTest, CachedHandlesAreReusedOnlyAtTheirExactSize) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  UseHandleAlignedPool();
  const DevicePtr x = Alloc(2 * kMiB);
  ASSERT_OK_AND_ASSIGN(const PoolCheckpoint cp, allocator_->Checkpoint(pool_));
  const DevicePtr y = Alloc(8 * kMiB);
  const DevicePtr z = Alloc(4 * kMiB);
  EXPECT_EQ(y, x + 2 * kMiB);
  EXPECT_EQ(z, x + 10 * kMiB);
  FreeOk(y);
  FreeOk(z);
  // The restore unmaps the chunks of the range the checkpoint had unmapped; their handles are cached.
  ASSERT_OK_AND_ASSIGN(const RestoreResult r, allocator_->Restore(pool_, cp));
  EXPECT_EQ(r.bytes_left_mapped, 0u);
  ExpectInvariants();
  EXPECT_EQ(Reserved(), 2 * MiB);
  const std::int64_t created = Created();
  // 6 MiB: neither cached handle has that size, so a new one is made.
  const DevicePtr w = Alloc(6 * kMiB);
  EXPECT_EQ(w, x + 2 * kMiB);
  // 8 MiB and 4 MiB (3 MiB rounded to the granularity) take the cached handles.
  const DevicePtr v = Alloc(8 * kMiB);
  EXPECT_EQ(v, x + 8 * kMiB);
  const DevicePtr u = Alloc(3 * kMiB);
  EXPECT_EQ(u, x + 16 * kMiB);
  EXPECT_EQ(Reserved(), 20 * MiB);
  if (AsSim(driver_.get()) != nullptr) {
    EXPECT_EQ(Created(), created + 1);
    EXPECT_EQ(LiveHandles(), 4);
  }
  ExpectNothingLeftAfter({x, w, v, u});
}

TEST_F(HandleAlignedTest, ARestoreThatWouldPutABlockAcrossTwoHandlesIsRefused) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  UseHandleAlignedPool();
  const DevicePtr keeper = Alloc(2 * kMiB);  // keeps the segment reserved through the release below
  const DevicePtr x = Alloc(8 * kMiB);
  ASSERT_OK_AND_ASSIGN(const PoolCheckpoint cp, allocator_->Checkpoint(pool_));
  FreeOk(x);
  ASSERT_OK(allocator_->EmptyPoolCache(pool_.id()));
  // x's range is mapped again in another piece: a 2 MiB chunk where x began.
  const DevicePtr a = Alloc(2 * kMiB);
  ASSERT_EQ(a, x);
  FreeOk(a);
  const DeviceStats before = Stats();
  absl::StatusOr<RestoreResult> r = allocator_->Restore(pool_, cp);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("would span more than one physical handle"), std::string::npos)
      << r.status();
  EXPECT_EQ(Stats(), before);
  ExpectInvariants();
  ExpectNothingLeftAfter({keeper});
}

}  // namespace
}  // namespace graphalloc
