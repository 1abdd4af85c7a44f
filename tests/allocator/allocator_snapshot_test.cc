// TakeSnapshot() and the allocation history, against a known allocator state.
#include <algorithm>

#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;

class AllocatorSnapshotTest : public AllocatorFixture {};

std::vector<HistoryAction> Actions(const MemorySnapshot& s) {
  std::vector<HistoryAction> out;
  for (const HistoryEvent& e : s.history) out.push_back(e.action);
  return out;
}

TEST_F(AllocatorSnapshotTest, SnapshotListsEverySegmentAndBlockWithExactFields) {
  GRAPHALLOC_ALLOCATOR_SETUP(*Config::Parse("expandable_segments:False"));  // regular segments
  DevicePtr a = Alloc(1000);
  DevicePtr b = Alloc(3000);
  DevicePtr big = Alloc(30 * kMiB);
  FreeOk(a);
  MemorySnapshot s = allocator_->TakeSnapshot("now");
  ASSERT_TRUE(ValidateSnapshot(s).ok()) << ValidateSnapshot(s);
  ASSERT_TRUE(CheckStatsConsistency(s).ok()) << CheckStatsConsistency(s);
  EXPECT_EQ(s.label, "now");
  EXPECT_EQ(s.source, "graphalloc");
  EXPECT_EQ(s.device.total_memory, driver_->Info().total_memory);
  EXPECT_EQ(s.config, allocator_->config().ToString());
  EXPECT_EQ(s.stats, Stats());
  ASSERT_EQ(s.segments.size(), 2u);
  const SegmentSnapshot* small = &s.segments[0];
  const SegmentSnapshot* large = &s.segments[1];
  if (small->kind != SegmentKind::kSmall) std::swap(small, large);
  EXPECT_EQ(small->total_size, 2 * kMiB);
  EXPECT_EQ(large->total_size, 30 * kMiB);
  EXPECT_EQ(large->kind, SegmentKind::kLarge);
  // a (freed) merged back? No: its neighbour b is allocated, so a stays a 1 KiB free block.
  ASSERT_EQ(small->blocks.size(), 3u);
  EXPECT_EQ(small->blocks[0].address, a);
  EXPECT_EQ(small->blocks[0].size, 1024u);
  EXPECT_EQ(small->blocks[0].state, BlockState::kFree);
  EXPECT_EQ(small->blocks[1].address, b);
  EXPECT_EQ(small->blocks[1].size, 3072u);
  EXPECT_EQ(small->blocks[1].requested_size, 3000u);
  EXPECT_EQ(small->blocks[1].state, BlockState::kAllocated);
  EXPECT_EQ(small->blocks[2].state, BlockState::kFree);
  EXPECT_EQ(small->blocks[2].size, 2 * kMiB - 4096);
  ASSERT_EQ(large->blocks.size(), 1u);
  EXPECT_EQ(large->blocks[0].address, big);
  EXPECT_EQ(large->blocks[0].state, BlockState::kAllocated);
  ASSERT_EQ(s.pools.size(), 1u);
  EXPECT_EQ(s.pools[0].reserved_bytes, 32 * kMiB);
  EXPECT_EQ(s.pools[0].allocated_bytes, 3072 + 30 * kMiB);
  EXPECT_TRUE(s.history.empty());  // history was not turned on
  EXPECT_EQ(s.history_max_entries, 0u);
  ExpectInvariants();
  FreeOk(b);
  FreeOk(big);
}

TEST_F(AllocatorSnapshotTest, JsonRoundTripOfATakenSnapshotIsExact) {
  GRAPHALLOC_ALLOCATOR_SETUP(*Config::Parse("record_history:True,history_max_entries:64"));
  DevicePtr a = Alloc(5000);
  DevicePtr c = Alloc(12 * kMiB);
  FreeOk(a);
  MemorySnapshot s = allocator_->TakeSnapshot("end");
  absl::StatusOr<MemorySnapshot> back = SnapshotFromJson(SnapshotToJson(s), "test");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
  FreeOk(c);
}

TEST_F(AllocatorSnapshotTest, HistoryRecordsAllocatorEventsInOrder) {
  GRAPHALLOC_ALLOCATOR_SETUP(
      *Config::Parse("record_history:True,history_max_entries:1000,expandable_segments:False"));
  DevicePtr a = Alloc(4096);
  FreeOk(a);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  MemorySnapshot s = allocator_->TakeSnapshot();
  EXPECT_THAT(Actions(s), ::testing::ElementsAre(HistoryAction::kSegmentAlloc, HistoryAction::kAlloc,
                                                 HistoryAction::kFreeRequested, HistoryAction::kFreeCompleted,
                                                 HistoryAction::kSegmentFree));
  ASSERT_EQ(s.history.size(), 5u);
  EXPECT_EQ(s.history[1].address, a);
  EXPECT_EQ(s.history[1].size, 4096u);
  EXPECT_EQ(s.history[0].size, 2 * kMiB);
  EXPECT_TRUE(s.history[1].frames.empty());  // stacks were not asked for
  EXPECT_LE(s.history[0].time_us, s.history[4].time_us);
  EXPECT_EQ(s.history_max_entries, 1000u);
  EXPECT_FALSE(s.history_overflowed);
}

TEST_F(AllocatorSnapshotTest, HistoryKeepsOnlyTheNewestMaxEntries) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_TRUE(allocator_->RecordHistory(HistoryOptions{true, 4, false}).ok());
  for (int i = 0; i < 5; ++i) FreeOk(Alloc(4096));
  MemorySnapshot s = allocator_->TakeSnapshot();
  ASSERT_EQ(s.history.size(), 4u);
  EXPECT_TRUE(s.history_overflowed);
  EXPECT_EQ(s.history.back().action, HistoryAction::kFreeCompleted);
}

TEST_F(AllocatorSnapshotTest, StacksAreRecordedOnlyWhenAskedAndAttachedToLiveBlocks) {
  GRAPHALLOC_ALLOCATOR_SETUP(*Config::Parse("record_history:True,history_stacks:True"));
  DevicePtr a = Alloc(4096);
  MemorySnapshot s = allocator_->TakeSnapshot();
  ASSERT_FALSE(s.history.empty());
  EXPECT_FALSE(s.history.front().frames.empty());
  const BlockSnapshot& live = s.segments.at(0).blocks.at(0);
  EXPECT_EQ(live.address, a);
  EXPECT_FALSE(live.frames.empty());
  FreeOk(a);
}

TEST_F(AllocatorSnapshotTest, SegmentFramesAreFilledWhenStacksAreRecorded) {
  GRAPHALLOC_ALLOCATOR_SETUP(
      *Config::Parse("record_history:True,history_stacks:True,expandable_segments:False"));
  DevicePtr a = Alloc(4096);
  MemorySnapshot s = allocator_->TakeSnapshot();
  ASSERT_EQ(s.segments.size(), 1u);
  const auto segment_alloc = std::find_if(s.history.begin(), s.history.end(), [](const HistoryEvent& e) {
    return e.action == HistoryAction::kSegmentAlloc;
  });
  ASSERT_NE(segment_alloc, s.history.end());
  EXPECT_EQ(segment_alloc->address, s.segments[0].address);
  EXPECT_FALSE(s.segments[0].frames.empty());
  EXPECT_EQ(s.segments[0].frames, segment_alloc->frames);
  FreeOk(a);
}

TEST_F(AllocatorSnapshotTest, ExpandableSegmentFramesAreThoseOfItsFirstMapping) {
  GRAPHALLOC_ALLOCATOR_SETUP(*Config::Parse("record_history:True,history_stacks:True"));
  DevicePtr a = Alloc(4096);
  MemorySnapshot s = allocator_->TakeSnapshot();
  ASSERT_EQ(s.segments.size(), 1u);
  ASSERT_TRUE(s.segments[0].expandable);
  const auto mapped = std::find_if(s.history.begin(), s.history.end(), [](const HistoryEvent& e) {
    return e.action == HistoryAction::kSegmentMap;
  });
  ASSERT_NE(mapped, s.history.end());
  EXPECT_FALSE(s.segments[0].frames.empty());
  EXPECT_EQ(s.segments[0].frames, mapped->frames);
  FreeOk(a);
}

TEST_F(AllocatorSnapshotTest, AllocAndFreeEventsRecordTheRequestedSizeAsPyTorchDoes) {
  GRAPHALLOC_ALLOCATOR_SETUP(*Config::Parse("record_history:True,expandable_segments:False"));
  DevicePtr a = Alloc(1000);  // a 1024-byte block
  FreeOk(a);
  MemorySnapshot s = allocator_->TakeSnapshot();
  EXPECT_THAT(Actions(s),
              ::testing::ElementsAre(HistoryAction::kSegmentAlloc, HistoryAction::kAlloc,
                                     HistoryAction::kFreeRequested, HistoryAction::kFreeCompleted));
  for (std::size_t i = 1; i <= 3; ++i) {
    EXPECT_EQ(s.history[i].address, a);
    EXPECT_EQ(s.history[i].size, 1000u) << HistoryActionName(s.history[i].action);
  }
  // The same sizes go into PyTorch's pickle (its trace entries carry the requested size).
  absl::StatusOr<MemorySnapshot> back = SnapshotFromTorchPickle(SnapshotToTorchPickle(s), "test");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->history.size(), s.history.size());
  EXPECT_EQ(back->history[1].size, 1000u);
}

TEST_F(AllocatorSnapshotTest, SnapshotEndsWithTheLastActionAndItsOwnEventShowsInTheNext) {
  GRAPHALLOC_ALLOCATOR_SETUP(*Config::Parse("record_history:True,expandable_segments:False"));
  DevicePtr a = Alloc(1000);
  DevicePtr b = Alloc(3000);
  FreeOk(a);
  MemorySnapshot first = allocator_->TakeSnapshot();
  ASSERT_GE(first.history.size(), 2u);
  EXPECT_EQ(first.history.back().action, HistoryAction::kFreeCompleted);  // as in PyTorch's snapshots
  EXPECT_EQ(first.history.back().address, a);
  EXPECT_EQ(LastAction(first), &first.history.back());
  MemorySnapshot second = allocator_->TakeSnapshot();
  ASSERT_EQ(second.history.size(), first.history.size() + 1);
  EXPECT_EQ(second.history.back().action, HistoryAction::kSnapshot);
  EXPECT_EQ(second.history.back().size, 3072u);  // the active bytes the first snapshot saw
  const HistoryEvent* last = LastAction(second);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->action, HistoryAction::kFreeCompleted);
  FreeOk(b);
}

TEST_F(AllocatorSnapshotTest, OutOfMemoryIsRecordedWithTheRequestedSize) {
  GRAPHALLOC_ALLOCATOR_SETUP(*Config::Parse("record_history:True"));
  allocator_->SetMemoryLimit(8 * kMiB);
  EXPECT_FALSE(allocator_->Allocate(20 * kMiB).ok());
  MemorySnapshot s = allocator_->TakeSnapshot();
  ASSERT_FALSE(s.history.empty());
  const HistoryEvent& oom = s.history.back();
  EXPECT_EQ(oom.action, HistoryAction::kOom);
  EXPECT_EQ(oom.size, 20 * kMiB);
}

}  // namespace
}  // namespace graphalloc
