// Trace replay on small synthetic traces: exact peak live and peak reserved bytes, ignored rows, streams,
// the out-of-memory path under a capacity, and bad traces. The same tests run on the real GPU (label `gpu`),
// except those that need the simulated device's capacity.
#include "graphalloc/allocator/trace/trace_replay.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "gtest/gtest.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::uint64_t MiB = kMiB;

Trace Parse(absl::string_view rows) {
  absl::StatusOr<Trace> trace = ParseTrace(absl::StrCat(kTraceHeader, "\n", rows), "t.csv");
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *trace : Trace{};
}

class TraceReplayTest : public ::testing::Test {
 protected:
  // A fresh allocator on the selected device; false (and a skip reason) when there is none.
  bool MakeAllocator(SimDriverOptions sim = {}) {
    driver_ = testing::MakeTestDriver(&skip_reason_, sim);
    if (driver_ == nullptr) return false;
    // These tests check PyTorch's regular segment sizes: expandable segments are pinned off
    // (tests/allocator/expandable_segments_test.cc and shipped_traces_test cover them).
    absl::StatusOr<std::unique_ptr<CachingAllocator>> a =
        CachingAllocator::Create(driver_, *Config::Parse("expandable_segments:False"));
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return false;
    allocator_ = std::move(*a);
    return true;
  }

  ReplayResult ReplayOk(const Trace& trace, ReplayOptions options = {.check_invariants_every = 1}) {
    absl::StatusOr<ReplayResult> r = ReplayTrace(trace, *allocator_, options);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(allocator_->CheckInvariants().ok());
    return r.ok() ? *r : ReplayResult{};
  }

  std::shared_ptr<Driver> driver_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::string skip_reason_;
};

#define REQUIRE_ALLOCATOR(...) \
  if (!MakeAllocator(__VA_ARGS__)) GTEST_SKIP() << skip_reason_

TEST_F(TraceReplayTest, TwoSmallAllocsReserveOneTwoMiBSegment) {
  REQUIRE_ALLOCATOR();
  ReplayResult r =
      ReplayOk(Parse("segment_alloc,1000000,2097152,0,1\n"
                     "alloc,1000000,1024,0,2\n"
                     "alloc,1001024,1024,0,3\n"
                     "free_requested,1000000,1024,0,4\n"
                     "free_completed,1000000,1024,0,5\n"
                     "free_requested,1001024,1024,0,6\n"
                     "free_completed,1001024,1024,0,7\n"));
  EXPECT_TRUE(r.completed);
  EXPECT_FALSE(r.failure.has_value());
  EXPECT_EQ(r.events, 7u);
  EXPECT_EQ(r.allocs, 2u);
  EXPECT_EQ(r.frees, 2u);
  EXPECT_EQ(r.peak_live_bytes, 2048u);
  EXPECT_EQ(r.peak_reserved_bytes, 2 * MiB);
  EXPECT_DOUBLE_EQ(r.ratio, 1024.0);
  EXPECT_GT(r.ns_per_op, 0.0);
  EXPECT_GT(r.wall_seconds, 0.0);
}

TEST_F(TraceReplayTest, LargeAllocsFollowTheSegmentSizeRules) {
  REQUIRE_ALLOCATOR();
  // 12 MiB gets a segment of its own size; then 3 MiB (under 10 MiB) finds no free block and gets a 20 MiB
  // segment. In the other order the 12 MiB would be split off the 20 MiB segment's free 17 MiB.
  ReplayResult r =
      ReplayOk(Parse("alloc,2,12582912,0,1\n"
                     "alloc,1,3145728,0,2\n"
                     "free_completed,1,3145728,0,3\n"
                     "free_completed,2,12582912,0,4\n"));
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(r.peak_live_bytes, 15 * MiB);
  EXPECT_EQ(r.peak_reserved_bytes, 32 * MiB);
  EXPECT_DOUBLE_EQ(r.ratio, 32.0 / 15.0);
}

TEST_F(TraceReplayTest, PeakLiveComesFromTheTraceAndCachedBlocksAreReused) {
  REQUIRE_ALLOCATOR();
  // Live bytes: 4 MiB, 0, 6 MiB, 4 MiB+6 MiB = 10 MiB at the peak; the second 4 MiB reuses the cached one.
  ReplayResult r =
      ReplayOk(Parse("alloc,1,4194304,0,1\n"
                     "free_requested,1,4194304,0,2\n"
                     "free_completed,1,4194304,0,3\n"
                     "alloc,1,6291456,0,4\n"
                     "alloc,2,4194304,0,5\n"
                     "free_completed,2,4194304,0,6\n"
                     "free_completed,1,6291456,0,7\n"));
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(r.peak_live_bytes, 10 * MiB);
  EXPECT_EQ(r.peak_reserved_bytes, 20 * MiB);  // one 20 MiB segment holds both
  EXPECT_DOUBLE_EQ(r.ratio, 2.0);
}

TEST_F(TraceReplayTest, OtherStreamsGetTheirOwnStreamsAndBlocks) {
  REQUIRE_ALLOCATOR();
  // A freed block is reused only by its own stream: stream 7's allocation needs a segment of its own.
  ReplayResult r =
      ReplayOk(Parse("alloc,1,1024,0,1\n"
                     "free_completed,1,1024,0,2\n"
                     "alloc,2,1024,7,3\n"
                     "alloc,3,1024,7,4\n"
                     "free_completed,2,1024,7,5\n"
                     "free_completed,3,1024,7,6\n"));
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(r.peak_live_bytes, 2048u);
  EXPECT_EQ(r.peak_reserved_bytes, 4 * MiB);
  if (SimDriver* sim = testing::AsSim(driver_.get())) {
    EXPECT_EQ(sim->CallCount(SimCall::kStreamCreate), 1u);
    EXPECT_EQ(sim->Counters().streams, 0u);  // destroyed at the end
  }
}

TEST_F(TraceReplayTest, BlocksTheTraceNeverFreesAreFreedAtTheEnd) {
  REQUIRE_ALLOCATOR();
  ReplayResult r =
      ReplayOk(Parse("alloc,1,1024,0,1\n"
                     "alloc,2,30000000,0,2\n"));
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(r.frees, 0u);
  EXPECT_EQ(r.peak_live_bytes, 30001024u);
  const DeviceStats stats = allocator_->GetStats();
  EXPECT_EQ(stats.allocated_bytes.all().current, 0);
  EXPECT_EQ(stats.reserved_bytes.all().peak, static_cast<std::int64_t>(r.peak_reserved_bytes));
}

TEST_F(TraceReplayTest, EmptyTraceCompletesWithRatioZero) {
  REQUIRE_ALLOCATOR();
  ReplayResult r = ReplayOk(Parse(""));
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(r.events, 0u);
  EXPECT_EQ(r.peak_live_bytes, 0u);
  EXPECT_EQ(r.peak_reserved_bytes, 0u);
  EXPECT_EQ(r.ratio, 0.0);
  EXPECT_EQ(r.ns_per_op, 0.0);
}

TEST_F(TraceReplayTest, TouchMemoryWritesEveryBlock) {
  REQUIRE_ALLOCATOR();
  ReplayResult r = ReplayOk(Parse("alloc,1,512,0,1\n"
                                  "alloc,2,5000,0,2\n"
                                  "alloc,3,25165824,0,3\n"
                                  "free_completed,2,5000,0,4\n"),
                            ReplayOptions{.check_invariants_every = 1, .touch_memory = true});
  EXPECT_TRUE(r.completed);
  ASSERT_TRUE(driver_->DeviceSynchronize().ok());
}

TEST_F(TraceReplayTest, CapacityTooSmallStopsWithTheOutOfMemoryMessage) {
  if (!testing::OnSimulatedDevice()) GTEST_SKIP() << "needs the simulated device's capacity";
  REQUIRE_ALLOCATOR(SimDriverOptions{.capacity = 4 * MiB});
  // The small segment (2 MiB) fits; the 3 MiB request needs a 20 MiB segment, which does not.
  absl::StatusOr<ReplayResult> r = ReplayTrace(Parse("alloc,1,1024,0,1\n"
                                                     "free_requested,1,1024,0,2\n"
                                                     "alloc,2,3145728,0,3\n"
                                                     "free_completed,2,3145728,0,4\n"
                                                     "free_completed,1,1024,0,5\n"),
                                               *allocator_, {.check_invariants_every = 1});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->completed);
  ASSERT_TRUE(r->failure.has_value());
  EXPECT_EQ(r->failure->event_index, 2u);
  EXPECT_EQ(r->failure->where, "t.csv:4");
  EXPECT_THAT(r->failure->message, StartsWith("out of memory: tried to allocate 3.00 MiB"));
  EXPECT_THAT(r->failure->message, HasSubstr("\nWhy it could not be served, largest first:\n"));
  EXPECT_EQ(r->events, 3u);
  EXPECT_EQ(r->allocs, 2u);
  EXPECT_EQ(r->frees, 0u);
  // Up to the stop only the 1 KiB block was live, so the ratio compares what the allocator served.
  EXPECT_EQ(r->peak_live_bytes, 1024u);
  EXPECT_EQ(r->trace_peak_live_bytes, 3 * MiB + 1024);
  EXPECT_EQ(r->peak_reserved_bytes, 2 * MiB);
  EXPECT_DOUBLE_EQ(r->ratio, 2048.0);
  EXPECT_EQ(allocator_->GetStats().num_ooms, 1);
  EXPECT_EQ(allocator_->GetStats().allocated_bytes.all().current, 0);  // the live block was freed
  EXPECT_TRUE(allocator_->CheckInvariants().ok());
}

TEST_F(TraceReplayTest, FreeOfAnUnknownAddressIsABadTrace) {
  REQUIRE_ALLOCATOR();
  absl::StatusOr<ReplayResult> r = ReplayTrace(Parse("alloc,1,1024,0,1\n"
                                                     "free_completed,999,1024,0,2\n"),
                                               *allocator_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      r.status().message(),
      "t.csv:3: bad trace: free_completed of address 999 which is not allocated (never, or freed already)");
  EXPECT_EQ(allocator_->GetStats().num_device_alloc, 0);  // nothing was replayed
}

TEST_F(TraceReplayTest, DoubleFreeIsABadTrace) {
  REQUIRE_ALLOCATOR();
  absl::StatusOr<ReplayResult> r = ReplayTrace(Parse("alloc,1,1024,0,1\n"
                                                     "free_completed,1,1024,0,2\n"
                                                     "free_completed,1,1024,0,3\n"),
                                               *allocator_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(
      r.status().message(),
      "t.csv:4: bad trace: free_completed of address 1 which is not allocated (never, or freed already)");
}

TEST_F(TraceReplayTest, AllocAtALiveAddressIsABadTrace) {
  REQUIRE_ALLOCATOR();
  absl::StatusOr<ReplayResult> r = ReplayTrace(Parse("alloc,1,1024,0,1\n"
                                                     "alloc,1,2048,0,2\n"),
                                               *allocator_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "t.csv:3: bad trace: alloc at address 1 which is still live (allocated and not freed)");
}

TEST_F(TraceReplayTest, BadTraceBuiltInCodeNamesTheEventIndex) {
  REQUIRE_ALLOCATOR();
  Trace trace;
  trace.name = "mine";
  trace.events.push_back(TraceEvent{.addr = 5, .size = 512, .action = TraceAction::kFreeCompleted});
  absl::StatusOr<ReplayResult> r = ReplayTrace(trace, *allocator_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("mine, event 0: bad trace: free_completed of address 5"));
}

TEST_F(TraceReplayTest, SummaryCountsAllocsFreesAndPeakLive) {
  absl::StatusOr<TraceSummary> s =
      SummarizeTrace(Parse("alloc,1,100,0,1\n"
                           "alloc,2,300,0,2\n"
                           "free_requested,1,100,0,3\n"
                           "free_completed,1,100,0,4\n"
                           "alloc,3,50,0,5\n"
                           "segment_free,9,2097152,0,6\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->allocs, 3u);
  EXPECT_EQ(s->frees, 1u);
  EXPECT_EQ(s->peak_live_bytes, 400u);
}

TEST_F(TraceReplayTest, SameTraceTwiceGivesTheSameNumbers) {
  REQUIRE_ALLOCATOR();
  std::string rows;
  for (int i = 0; i < 200; ++i) {
    absl::StrAppend(&rows, "alloc,", i, ",", (i * 7919) % (3 << 20) + 1, ",", i % 3, ",", i, "\n");
    if (i % 4 == 3) absl::StrAppend(&rows, "free_completed,", i - 2, ",0,0,", i, "\n");
  }
  const Trace trace = Parse(rows);
  ReplayResult a = ReplayOk(trace);
  ASSERT_TRUE(MakeAllocator());
  ReplayResult b = ReplayOk(trace);
  EXPECT_TRUE(a.completed);
  EXPECT_EQ(a.peak_live_bytes, b.peak_live_bytes);
  EXPECT_EQ(a.peak_reserved_bytes, b.peak_reserved_bytes);
  EXPECT_EQ(a.allocs, 200u);
  EXPECT_EQ(a.frees, 50u);
}

TEST_F(TraceReplayTest, SnapshotHookSeesThePeakAndTheEnd) {
  if (!MakeAllocator()) GTEST_SKIP() << skip_reason_;
  std::vector<std::pair<std::string, std::uint64_t>> seen;  // label, allocated bytes then
  ReplayOptions options;
  options.snapshot_hook = [&](absl::string_view label, CachingAllocator& allocator) {
    MemorySnapshot s = allocator.TakeSnapshot(label);
    seen.emplace_back(std::string(label), ComputeTotals(s).allocated_bytes);
  };
  ReplayOk(Parse("alloc,1,4096,0,1\n"
                 "alloc,2,8192,0,2\n"
                 "free_completed,1,4096,0,3\n"
                 "alloc,3,1024,0,4\n"),
           options);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], (std::pair<std::string, std::uint64_t>{"peak", 4096 + 8192}));
  EXPECT_EQ(seen[1], (std::pair<std::string, std::uint64_t>{"end", 8192 + 1024}));
}

TEST_F(TraceReplayTest, HistoryOfASnapshotReplaysAsATrace) {
  if (!MakeAllocator()) GTEST_SKIP() << skip_reason_;
  ASSERT_TRUE(allocator_->RecordHistory(HistoryOptions{true, 1000, false}).ok());
  ReplayOk(
      Parse("alloc,1,4096,0,1\n"
            "alloc,2,8192,0,2\n"
            "free_completed,1,4096,0,3\n"));
  absl::StatusOr<Trace> trace = TraceFromHistory(allocator_->TakeSnapshot("end"), "history");
  ASSERT_TRUE(trace.ok()) << trace.status();
  absl::StatusOr<TraceSummary> summary = SummarizeTrace(*trace);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->allocs, 2u);
  EXPECT_EQ(summary->frees, 2u);  // the replay freed the block left live at its end
  EXPECT_EQ(summary->peak_live_bytes, 4096u + 8192u);
  MemorySnapshot empty;
  EXPECT_EQ(TraceFromHistory(empty, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace graphalloc
