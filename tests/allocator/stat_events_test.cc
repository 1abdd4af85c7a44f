// Statistics events against PyTorch's counters: each event moves exactly the counters it names, by the
// amounts given, and inactive split blocks follow the run-of-free-blocks rule.
#include "graphalloc/allocator/stats/stat_events.h"

#include "gtest/gtest.h"

namespace graphalloc {
namespace {

using stat_events::BlockFigures;

const Stat& Small(const StatArray& a) { return a[StatType::kSmallPool]; }
const Stat& Large(const StatArray& a) { return a[StatType::kLargePool]; }

TEST(StatEventsTest, AllocatedFreedReleased) {
  DeviceStats s;
  const BlockFigures block{.small = true, .bytes = 1024, .requested = 1000, .oversize = false};
  stat_events::BlockAllocated(s, block);
  EXPECT_EQ(s.allocation.all().current, 1);
  EXPECT_EQ(Small(s.allocated_bytes).current, 1024);
  EXPECT_EQ(Large(s.allocated_bytes).current, 0);
  EXPECT_EQ(s.requested_bytes.all().current, 1000);
  EXPECT_EQ(s.active.all().current, 1);
  EXPECT_EQ(s.active_bytes.all().current, 1024);
  EXPECT_EQ(s.oversize_allocations.all().current, 0);
  stat_events::BlockFreed(s, block);
  EXPECT_EQ(s.allocation.all().current, 0);
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.requested_bytes.all().current, 0);
  EXPECT_EQ(s.active.all().current, 1);  // active until released (stream events may hold it)
  stat_events::BlockReleased(s, true, 1024);
  EXPECT_EQ(s.active.all().current, 0);
  EXPECT_EQ(s.active_bytes.all().peak, 1024);
  EXPECT_EQ(s.allocated_bytes.all().allocated, 1024);
  EXPECT_EQ(s.allocated_bytes.all().freed, 1024);
}

TEST(StatEventsTest, OversizeAllocationsCountOnlyOversizeBlocks) {
  DeviceStats s;
  stat_events::BlockAllocated(s,
                              {.small = false, .bytes = 64 << 20, .requested = 60 << 20, .oversize = true});
  EXPECT_EQ(Large(s.oversize_allocations).current, 1);
  stat_events::BlockFreed(s, {.small = false, .bytes = 64 << 20, .requested = 60 << 20, .oversize = true});
  EXPECT_EQ(s.oversize_allocations.all().current, 0);
  EXPECT_EQ(s.oversize_allocations.all().peak, 1);
}

TEST(StatEventsTest, TakingAFreeBlock) {
  DeviceStats s;
  // A whole segment's block, split: its rest becomes an inactive split block.
  stat_events::FreeBlockTaken(s, false, /*was_split=*/false, /*taken=*/1 << 20, /*rest=*/3 << 20);
  EXPECT_EQ(s.inactive_split.all().current, 1);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 3 << 20);
  // An inactive split block, split again: one block still, smaller by what was taken.
  stat_events::FreeBlockTaken(s, false, /*was_split=*/true, 1 << 20, 2 << 20);
  EXPECT_EQ(s.inactive_split.all().current, 1);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 2 << 20);
  // Taken whole: no longer inactive.
  stat_events::FreeBlockTaken(s, false, /*was_split=*/true, 2 << 20, 0);
  EXPECT_EQ(s.inactive_split.all().current, 0);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 0);
  // A whole segment's block taken whole: nothing was or is split.
  stat_events::FreeBlockTaken(s, false, /*was_split=*/false, 2 << 20, 0);
  EXPECT_EQ(s.inactive_split.all().allocated, 1);
  EXPECT_EQ(s.inactive_split.all().freed, 1);
}

TEST(StatEventsTest, CoalescingMovesByTheNetAmount) {
  DeviceStats s;
  stat_events::FreeBlockTaken(s, true, false, 512, 1536);
  stat_events::FreeBlockTaken(s, true, true, 512, 1024);
  // A freed block absorbs its one free neighbour (counted as inactive split) and is still part of a split
  // segment: still one inactive split block, of the merged size, and the block count never moved.
  stat_events::FreeBlockCoalesced(s, true, /*merged=*/1, /*merged_bytes=*/1024, /*now_split=*/true, 1536);
  EXPECT_EQ(s.inactive_split.all().current, 1);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 1536);
  EXPECT_EQ(s.inactive_split.all().allocated, 1);  // net 0: untouched
  EXPECT_EQ(s.inactive_split_bytes.all().allocated, 1536 + 512);
  // Merged into the whole segment: nothing split any more.
  stat_events::FreeBlockCoalesced(s, true, 1, 1536, /*now_split=*/false, 2048);
  EXPECT_EQ(s.inactive_split.all().current, 0);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 0);
}

TEST(StatEventsTest, JoiningARunCountsAsMerging) {
  DeviceStats s;
  const stat_events::FreeRunFigures run{.left_bytes = 1024, .block_bytes = 512, .right_bytes = 2048};
  // Two runs (counted before) become one of 3.5 KiB.
  stat_events::Move(s.inactive_split, false, 2);
  stat_events::Move(s.inactive_split_bytes, false, 3072);
  stat_events::FreeRunChanged(s, false, run, /*joining=*/true);
  EXPECT_EQ(s.inactive_split.all().current, 1);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 3584);
  stat_events::FreeRunChanged(s, false, run, /*joining=*/false);
  EXPECT_EQ(s.inactive_split.all().current, 2);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 3072);
  // A run that covers its whole segment is not split.
  stat_events::FreeRunChanged(
      s, false, {.left_bytes = 1024, .block_bytes = 512, .right_bytes = 2048, .whole_segment = true}, true);
  EXPECT_EQ(s.inactive_split.all().current, 0);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 0);
}

TEST(StatEventsTest, BlocksReplacedDecreasesThenIncreases) {
  DeviceStats s;
  stat_events::BlockTotals out, in;
  out.AddAllocated({.small = false, .bytes = 4096, .requested = 4000, .oversize = false});
  in.AddAllocated({.small = false, .bytes = 8192, .requested = 8000, .oversize = true});
  in.AddInactiveSplit(2048);
  stat_events::BlockAllocated(s, {.small = false, .bytes = 4096, .requested = 4000, .oversize = false});
  stat_events::BlocksReplaced(s, false, out, in);
  EXPECT_EQ(s.allocation.all().current, 1);
  EXPECT_EQ(s.allocation.all().freed, 1);
  EXPECT_EQ(s.allocation.all().allocated, 2);
  EXPECT_EQ(s.allocated_bytes.all().current, 8192);
  EXPECT_EQ(s.requested_bytes.all().current, 8000);
  EXPECT_EQ(s.oversize_allocations.all().current, 1);
  EXPECT_EQ(s.active_bytes.all().current, 8192);
  EXPECT_EQ(s.inactive_split.all().current, 1);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 2048);
}

TEST(StatEventsTest, SegmentsAndChunks) {
  DeviceStats s;
  stat_events::SegmentLinked(s, true, 2 << 20, false);
  stat_events::SegmentLinked(s, false, 1 << 30, true);
  EXPECT_EQ(s.segment.all().current, 2);
  EXPECT_EQ(s.reserved_bytes.all().current, (2 << 20) + (1 << 30));
  EXPECT_EQ(Large(s.oversize_segments).current, 1);
  stat_events::SegmentUnlinked(s, false, 1 << 30, true);
  EXPECT_EQ(s.oversize_segments.all().current, 0);
  stat_events::ChunkMapped(s, false, 48 << 20);
  EXPECT_EQ(s.segment.all().current, 1);  // chunks are not segments
  EXPECT_EQ(s.reserved_bytes.all().current, (2 << 20) + (48 << 20));
  EXPECT_EQ(s.num_device_alloc, 1);
  stat_events::ChunkUnmapped(s, false, 48 << 20);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.reserved_bytes.all().current, 2 << 20);
}

}  // namespace
}  // namespace graphalloc
