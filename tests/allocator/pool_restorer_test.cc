// The pool restorer's phases seen from outside: a pool already at its checkpoint is left alone, phase 2
// writes the history events of what it freed and created, and phase 3 keeps the mappings of a pool a
// graph pins (reported as left mapped). The full property test is pool_checkpoint_test.
#include <algorithm>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/size_policy.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

class PoolRestorerTest : public testing::AllocatorFixture {
 protected:
  void SetUpPool(bool expandable) {
    Config config;
    config.expandable_segments = expandable;
    MakeAllocator(config);
    if (driver_ == nullptr) return;
    ASSERT_OK_AND_ASSIGN(pool_, allocator_->CreatePool());
    stream_ = NewStream();
    ASSERT_OK_AND_ASSIGN(route_, allocator_->BeginAllocateToPool(pool_, PoolRouteFilter::ForStream(stream_)));
  }
  void TearDown() override {
    (void)route_.End();
    pool_.Reset();
    AllocatorFixture::TearDown();
  }

  PrivatePool pool_;
  PoolRoute route_;
  Stream stream_{};
};

TEST_F(PoolRestorerTest, APoolAtItsCheckpointIsLeftAlone) {
  SetUpPool(/*expandable=*/false);
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  const DevicePtr a = Alloc(4096, stream_);
  const DevicePtr b = Alloc(3 * kMiB, stream_);
  ASSERT_OK_AND_ASSIGN(const PoolCheckpoint cp, allocator_->Checkpoint(pool_));
  const DeviceStats before = Stats();
  ASSERT_OK_AND_ASSIGN(const RestoreResult r, allocator_->Restore(pool_, cp));
  EXPECT_TRUE(r.freed.empty());
  EXPECT_TRUE(r.created.empty());
  EXPECT_EQ(r.bytes_left_mapped, 0u);
  EXPECT_EQ(Stats(), before);
  ExpectInvariants();
  FreeOk(a);
  FreeOk(b);
}

TEST_F(PoolRestorerTest, TheHistorySaysWhatTheRestoreFreedAndCreated) {
  SetUpPool(/*expandable=*/false);
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  ASSERT_OK(allocator_->RecordHistory(HistoryOptions{.enabled = true}));
  const DevicePtr a = Alloc(8192, stream_);
  const DevicePtr keeper = Alloc(4096, stream_);  // keeps the segment split where `a` was
  ASSERT_OK_AND_ASSIGN(const PoolCheckpoint cp, allocator_->Checkpoint(pool_));
  const DevicePtr b = Alloc(16384, stream_);
  FreeOk(a);
  ASSERT_OK_AND_ASSIGN(const RestoreResult r, allocator_->Restore(pool_, cp));
  EXPECT_EQ(r.freed, std::vector<DevicePtr>{b});
  ASSERT_EQ(r.created.size(), 1u);
  EXPECT_EQ(r.created[0].ptr, a);
  const MemorySnapshot snapshot = allocator_->TakeSnapshot("", /*record_event=*/false);
  ASSERT_GE(snapshot.history.size(), 2u);
  // In address order: `a` (created) is below `b` (freed).
  const HistoryEvent& created = snapshot.history[snapshot.history.size() - 2];
  const HistoryEvent& freed = snapshot.history.back();
  EXPECT_EQ(created.action, HistoryAction::kAlloc);
  EXPECT_EQ(created.address, a);
  EXPECT_EQ(created.size, 8192u);  // the requested size, as every block event
  EXPECT_EQ(freed.action, HistoryAction::kFreeCompleted);
  EXPECT_EQ(freed.address, b);
  EXPECT_EQ(freed.size, 16384u);
  ExpectInvariants();
  FreeOk(a);
  FreeOk(keeper);
}

TEST_F(PoolRestorerTest, APinnedPoolKeepsItsMappings) {
  SetUpPool(/*expandable=*/true);
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  const DevicePtr keeper = Alloc(2 * kMiB, stream_);
  ASSERT_OK_AND_ASSIGN(const PoolCheckpoint cp, allocator_->Checkpoint(pool_));
  const DevicePtr big = Alloc(100 * kMiB, stream_);
  const std::size_t reserved = allocator_->GetPoolStats(pool_.id())->reserved_bytes;
  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pool_));
  ASSERT_OK_AND_ASSIGN(const RestoreResult r, allocator_->Restore(pool_, cp));
  EXPECT_EQ(r.freed, std::vector<DevicePtr>{big});
  // Every chunk mapped since the checkpoint stays: a graph may still replay into it.
  EXPECT_GE(r.bytes_left_mapped, 100 * kMiB);
  EXPECT_EQ(allocator_->GetPoolStats(pool_.id())->reserved_bytes, reserved);
  ExpectInvariants();
  pin.Reset();
  FreeOk(keeper);
}

}  // namespace
}  // namespace graphalloc
