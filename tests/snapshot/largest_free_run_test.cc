// The largest free block is the largest contiguous run of free memory usable as it is (mapped, with
// access), never the sum of a free block's mapped pieces across unmapped holes: that is what one request,
// or cuDNN sizing a workspace from PyTorch's cacheInfo, could get. The snapshot's totals and the summary
// (text and JSON) say it; the viewer computes the same run (viewer_browser_test) and the PyTorch backend's
// cacheInfo takes it from the same totals (tests/torch, BackendApiTest.test_cache_info_is_the_largest_run).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

constexpr std::uint64_t kBase = 0x7f0000000000;

// One expandable segment of 16 MiB: an allocated 1 MiB block, then a free block over the rest, mapped as
// `mapped` says.
MemorySnapshot OneFreeBlock(std::vector<MappedRange> mapped) {
  MemorySnapshot s;
  s.source = "test";
  SegmentSnapshot seg;
  seg.address = kBase;
  seg.total_size = 16 * kMiB;
  seg.expandable = true;
  seg.mapped = std::move(mapped);
  seg.blocks.push_back({kBase, kMiB, kMiB, BlockState::kAllocated, 0, {}, ""});
  seg.blocks.push_back({kBase + kMiB, 15 * kMiB, 0, BlockState::kFree, 0, {}, ""});
  s.segments.push_back(seg);
  for (const MappedRange& r : s.segments[0].mapped) s.stats.reserved_bytes.Increase(false, r.size);
  s.stats.allocated_bytes.Increase(false, kMiB);
  s.stats.active_bytes.Increase(false, kMiB);
  s.stats.requested_bytes.Increase(false, kMiB);
  s.stats.allocation.Increase(false, 1);
  s.stats.active.Increase(false, 1);
  return s;
}

TEST(LargestFreeRunTest, AFreeBlockAcrossAnUnmappedHoleCountsItsLargestMappedPieceNotTheSum) {
  // Mapped [0, 4) and [6, 12) MiB: the free block [1, 16) has 3 + 6 MiB usable, in two runs.
  const MemorySnapshot s = OneFreeBlock({{0, 4 * kMiB, true}, {6 * kMiB, 6 * kMiB, true}});
  ASSERT_TRUE(ValidateSnapshot(s).ok()) << ValidateSnapshot(s);
  const SnapshotTotals t = ComputeTotals(s);
  EXPECT_EQ(t.free_bytes, 9 * kMiB);
  EXPECT_EQ(t.largest_free_block, 6 * kMiB);
  EXPECT_EQ(LargestUsableRun(s.segments[0], s.segments[0].blocks[1]), 6 * kMiB);
}

TEST(LargestFreeRunTest, AdjacentAccessibleRangesMakeOneRunAndARangeWithoutAccessBreaksIt) {
  const MemorySnapshot joined = OneFreeBlock({{0, 4 * kMiB, true}, {4 * kMiB, 2 * kMiB, true}});
  EXPECT_EQ(ComputeTotals(joined).largest_free_block, 5 * kMiB);
  const MemorySnapshot broken =
      OneFreeBlock({{0, 4 * kMiB, true}, {4 * kMiB, 2 * kMiB, false}, {6 * kMiB, 2 * kMiB, true}});
  EXPECT_EQ(ComputeTotals(broken).largest_free_block, 3 * kMiB);
  EXPECT_EQ(ComputeTotals(broken).free_bytes, 5 * kMiB);
}

TEST(LargestFreeRunTest, TheSummaryShowsTheRunInTextAndJson) {
  const MemorySnapshot s = OneFreeBlock({{0, 4 * kMiB, true}, {6 * kMiB, 6 * kMiB, true}});
  EXPECT_THAT(tools::RenderSummaryText(s, "s.json"), HasSubstr("largest free      6.00 MiB (6291456 bytes)"));
  EXPECT_EQ(nlohmann::json::parse(tools::RenderSummaryJson(s))["largest_free_block"], 6 * kMiB);
}

}  // namespace
}  // namespace graphalloc
