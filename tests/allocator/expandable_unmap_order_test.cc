// Unmapping is not stream-ordered: a block freed on the host may still be used by work queued before the
// free, and the GPU faults on an address unmapped under it (found through PyTorch: ResNet-50's first
// convolution hit an illegal address in cuDNN's layout kernel after a growth had moved a just-freed
// chunk). Every path that unmaps memory of freed blocks - a growth moving idle chunks, the release of
// free pages (EmptyCache, before out-of-memory), a pool restore - must let that work finish first.
//
// Simulated device only: its manual completion holds queued work back until something synchronizes, and
// it counts queued work that found its memory unmapped (SimCounters::illegal_accesses) instead of faulting.
#include <cstdint>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;
using testing::AsSim;

constexpr std::uint8_t kQueuedByte = 0xAB;

class ExpandableUnmapOrderTest : public AllocatorFixture {
 protected:
  // An allocator on a simulated device whose queued work runs only when something waits for it.
  bool SetUpManualDevice() {
    if (!testing::OnSimulatedDevice()) return false;
    SimDriverOptions sim;
    sim.manual_completion = true;
    MakeAllocator(Config{}, sim);
    sim_ = AsSim(driver_.get());
    return sim_ != nullptr;
  }
  // Queues a write of all of [ptr, ptr + bytes) on `stream`; it stays queued (manual completion).
  void QueueWrite(DevicePtr ptr, std::size_t bytes, Stream stream = kDefaultStream) {
    ASSERT_TRUE(driver_->MemsetAsync(ptr, kQueuedByte, bytes, stream).ok());
    ASSERT_EQ(sim_->Counters().pending_work, 1u);
  }
  std::uint8_t ByteAt(DevicePtr ptr) {
    std::uint8_t byte = 0;
    EXPECT_TRUE(driver_->CopyDeviceToHost(&byte, ptr, 1).ok());
    return byte;
  }

  SimDriver* sim_ = nullptr;
};

TEST_F(ExpandableUnmapOrderTest, AMovedChunkIsUnmappedOnlyAfterTheWorkQueuedOnItsBlocks) {
  if (!SetUpManualDevice()) GTEST_SKIP() << "needs the simulated device (manual completion)";
  const DevicePtr a = Alloc(48 * kMiB);  // one 48 MiB chunk
  const DevicePtr b = Alloc(4 * kMiB);
  QueueWrite(a, 48 * kMiB);
  FreeOk(a);  // stream-ordered: the write still runs on a's memory
  // 90 MiB do not fit a's 48 MiB: a's chunk moves after b (plus 42 MiB new), as in
  // ExpandableSegmentsTest.IdleChunksMoveWhereTheRequestNeedsThemInsteadOfNewMemory.
  const DevicePtr c = Alloc(90 * kMiB);
  EXPECT_EQ(c, b + 4 * kMiB);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(94 * kMiB));
  // The growth waited for the write, which landed in the chunk before it moved: c starts with it.
  EXPECT_EQ(sim_->Counters().pending_work, 0u);
  EXPECT_EQ(sim_->Counters().illegal_accesses, 0u);
  EXPECT_EQ(ByteAt(c), kQueuedByte);
  EXPECT_EQ(ByteAt(c + 48 * kMiB - 1), kQueuedByte);
  FreeOk(b);
  FreeOk(c);
}

TEST_F(ExpandableUnmapOrderTest, EmptyCacheUnmapsFreePagesOnlyAfterTheWorkQueuedOnThem) {
  if (!SetUpManualDevice()) GTEST_SKIP() << "needs the simulated device (manual completion)";
  const DevicePtr a = Alloc(64 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);  // keeps the segment: a's pages go from between live memory
  QueueWrite(a, 64 * kMiB);
  FreeOk(a);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  ExpectInvariants();
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(4 * kMiB));
  EXPECT_EQ(sim_->Counters().pending_work, 0u);
  EXPECT_EQ(sim_->Counters().illegal_accesses, 0u);
  FreeOk(b);
}

TEST_F(ExpandableUnmapOrderTest, ReleaseBeforeOutOfMemoryUnmapsOnlyAfterTheQueuedWork) {
  if (!SetUpManualDevice()) GTEST_SKIP() << "needs the simulated device (manual completion)";
  allocator_->SetMemoryLimit(16 * kMiB);
  // A block on another stream: its shard's free chunk can only be given back, not moved.
  const Stream side = NewStream();
  const DevicePtr a = Alloc(10 * kMiB, side);
  QueueWrite(a, 10 * kMiB, side);
  FreeOk(a);
  // Past the limit unless a's pages go back to the device first.
  const DevicePtr b = Alloc(12 * kMiB);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(12 * kMiB));
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_EQ(sim_->Counters().pending_work, 0u);
  EXPECT_EQ(sim_->Counters().illegal_accesses, 0u);
  FreeOk(b);
}

TEST_F(ExpandableUnmapOrderTest, RestoreUnmapsFreedBlocksOnlyAfterTheWorkQueuedOnThem) {
  if (!SetUpManualDevice()) GTEST_SKIP() << "needs the simulated device (manual completion)";
  const Stream stream = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForStream(stream)));
  const DevicePtr x = Alloc(2 * kMiB, stream);  // the pool's segment, in the checkpoint
  ASSERT_OK_AND_ASSIGN(const PoolCheckpoint before, allocator_->Checkpoint(pool));
  const DevicePtr a = Alloc(64 * kMiB, stream);
  EXPECT_EQ(a, x + 2 * kMiB);
  QueueWrite(a, 64 * kMiB, stream);
  // The restore frees a (live since the checkpoint) and unmaps its chunk, which the checkpoint had not.
  ASSERT_OK_AND_ASSIGN(const RestoreResult r, allocator_->Restore(pool, before));
  ExpectInvariants();
  EXPECT_EQ(r.freed, std::vector<DevicePtr>{a});
  EXPECT_EQ(r.bytes_left_mapped, 0u);
  EXPECT_EQ(allocator_->GetStats().reserved_bytes.all().current, static_cast<std::int64_t>(2 * kMiB));
  EXPECT_EQ(sim_->Counters().pending_work, 0u);
  EXPECT_EQ(sim_->Counters().illegal_accesses, 0u);
  FreeOk(x);
  ASSERT_TRUE(route.End().ok());
}

}  // namespace
}  // namespace graphalloc
