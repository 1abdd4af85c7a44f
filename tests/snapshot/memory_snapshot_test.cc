// The data model's invariant checks, totals and statistics consistency.
#include "graphalloc/allocator/snapshot/memory_snapshot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/snapshot/snapshot_fixture.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using testing::MakeFixtureSnapshot;
using testing::MakeSleepingSnapshot;

constexpr std::uint64_t kMiB = 1 << 20;

TEST(MemorySnapshotTest, FixtureIsValidAndConsistent) {
  const MemorySnapshot s = MakeFixtureSnapshot();
  EXPECT_TRUE(ValidateSnapshot(s).ok()) << ValidateSnapshot(s);
  EXPECT_TRUE(CheckStatsConsistency(s).ok()) << CheckStatsConsistency(s);
}

TEST(MemorySnapshotTest, TotalsCountMappedBytesOfExpandableSegments) {
  const SnapshotTotals t = ComputeTotals(MakeFixtureSnapshot());
  EXPECT_EQ(t.segments, 3);
  EXPECT_EQ(t.reserved_bytes, 10 * kMiB);
  EXPECT_EQ(t.allocated_bytes, 3 * kMiB + 512);
  EXPECT_EQ(t.active_bytes, 3 * kMiB + kMiB / 2 + 512);
  EXPECT_EQ(t.requested_bytes, 3 * kMiB + kMiB / 2 - 100 + 500);
  EXPECT_EQ(t.free_bytes, 6 * kMiB + kMiB / 2 - 512);
  EXPECT_EQ(t.largest_free_block, 2 * kMiB);
  EXPECT_EQ(t.allocations, 4);
  EXPECT_EQ(t.active_blocks, 5);
  EXPECT_EQ(t.reserved_bytes, t.active_bytes + t.free_bytes);
}

TEST(MemorySnapshotTest, NamesRoundTrip) {
  for (int i = 0; i < kNumHistoryActions; ++i) {
    const auto action = static_cast<HistoryAction>(i);
    EXPECT_EQ(ParseHistoryAction(HistoryActionName(action)), action);
  }
  EXPECT_EQ(ParseBlockState("pending_free"), BlockState::kPendingFree);
  EXPECT_EQ(ParseSegmentKind("small"), SegmentKind::kSmall);
  EXPECT_FALSE(ParseBlockState("active_allocated").has_value());
}

// graphalloc's own actions come after PyTorch's, whose values (kept in history rings, and in the numbers
// the HTML viewer reads) stay as they were.
TEST(MemorySnapshotTest, SleepAndWakeFollowPytorchsActionsUnderTheirOwnNames) {
  EXPECT_EQ(kNumHistoryActions, 11);
  EXPECT_EQ(static_cast<int>(HistoryAction::kSegmentUnmap), 6);
  EXPECT_EQ(static_cast<int>(HistoryAction::kSnapshot), 8);
  EXPECT_EQ(static_cast<int>(HistoryAction::kSleep), 9);
  EXPECT_EQ(static_cast<int>(HistoryAction::kWake), 10);
  EXPECT_EQ(HistoryActionName(HistoryAction::kSleep), "sleep");
  EXPECT_EQ(HistoryActionName(HistoryAction::kWake), "wake");
  EXPECT_EQ(ParseHistoryAction("sleep"), HistoryAction::kSleep);
  EXPECT_EQ(ParseHistoryAction("wake"), HistoryAction::kWake);
  EXPECT_FALSE(ParseHistoryAction("asleep").has_value());
}

TEST(MemorySnapshotTest, SleepingFixtureIsValidAndConsistent) {
  const MemorySnapshot s = MakeSleepingSnapshot();
  EXPECT_TRUE(ValidateSnapshot(s).ok()) << ValidateSnapshot(s);
  EXPECT_TRUE(CheckStatsConsistency(s).ok()) << CheckStatsConsistency(s);
  const SnapshotTotals t = ComputeTotals(s);
  EXPECT_EQ(t.reserved_bytes, 0u);  // the sleeping 6 MiB hold no memory
  EXPECT_EQ(t.allocated_bytes, 2 * kMiB);
  EXPECT_EQ(t.free_bytes, 0u);
}

void ExpectInvalid(const MemorySnapshot& s, const std::string& path, const std::string& what) {
  const absl::Status status = ValidateSnapshot(s);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_THAT(std::string(status.message()), HasSubstr(what));
}

TEST(MemorySnapshotTest, BlocksMustBeContiguous) {
  MemorySnapshot s = MakeFixtureSnapshot();
  s.segments[0].blocks[3].address += 16;
  ExpectInvalid(s, "segments[0].blocks[3].address", "contiguous");
}

TEST(MemorySnapshotTest, BlocksMustCoverTheSegment) {
  MemorySnapshot s = MakeFixtureSnapshot();
  s.segments[1].blocks.pop_back();
  ExpectInvalid(s, "segments[1].blocks", "cover 512 of the segment's 2097152 bytes");
  s = MakeFixtureSnapshot();
  s.segments[1].blocks.back().size += 1;
  ExpectInvalid(s, "segments[1].blocks[1].size", "runs past the segment's end");
}

TEST(MemorySnapshotTest, SegmentsMustBeSortedAndDisjoint) {
  MemorySnapshot s = MakeFixtureSnapshot();
  std::swap(s.segments[0], s.segments[1]);
  ExpectInvalid(s, "segments[1].address", "sorted by address and disjoint");
}

TEST(MemorySnapshotTest, ExpandableInvariants) {
  MemorySnapshot s = MakeFixtureSnapshot();
  s.segments[0].mapped = {{0, kMiB}};
  ExpectInvalid(s, "segments[0].mapped", "only expandable segments");
  s = MakeFixtureSnapshot();
  s.segments[2].blocks[2].state = BlockState::kAllocated;  // spans the unmapped [6 MiB, 8 MiB)
  ExpectInvalid(s, "segments[2].blocks[2]", "must be mapped");
  s = MakeFixtureSnapshot();
  s.segments[2].mapped = {{4 * kMiB, 2 * kMiB}, {0, 2 * kMiB}};
  ExpectInvalid(s, "segments[2].mapped[1].offset", "sorted and disjoint");
  s = MakeFixtureSnapshot();
  s.segments[2].mapped.push_back({7 * kMiB, 2 * kMiB});
  ExpectInvalid(s, "segments[2].mapped[2]", "outside the segment");
}

TEST(MemorySnapshotTest, OtherViolations) {
  MemorySnapshot s = MakeFixtureSnapshot();
  s.segments[0].blocks[0].requested_size = 2 * kMiB;
  ExpectInvalid(s, "segments[0].blocks[0].requested_size", "more than the block's");
  s = MakeFixtureSnapshot();
  s.segments[1].blocks.clear();
  ExpectInvalid(s, "segments[1].blocks", "at least one block");
  s = MakeFixtureSnapshot();
  s.pools[2].id = 5;
  ExpectInvalid(s, "pools[2].id", "listed twice");
}

TEST(MemorySnapshotTest, StatsConsistencyNamesEachMismatch) {
  MemorySnapshot s = MakeFixtureSnapshot();
  s.stats.allocated_bytes[StatType::kAggregate].current += 1;
  s.stats.active[StatType::kAggregate].current -= 1;
  const absl::Status status = CheckStatsConsistency(s);
  EXPECT_TRUE(absl::IsFailedPrecondition(status));
  EXPECT_THAT(std::string(status.message()), HasSubstr("allocated_bytes.all.current is 3146241"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("active.all.current is 4 but the segments add up to 5"));
}

}  // namespace
}  // namespace graphalloc
