// A snapshot's history that is not the whole run (its ring overflowed, it began after blocks were
// allocated, or it holds none of the allocator's events) is not replayed as if it were: `graphalloc replay`
// refuses it, saying what is missing and how to get all of it, and with --allow-partial-history replays it
// saying it is partial. Before, such a replay printed "Completed: yes" with a partial ratio, or "Events: 0
// of 0".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/trace/trace_reader.h"
#include "tests/testing/cli_run.h"

namespace graphalloc {
namespace {

using testing::Cli;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTrace[] =
    "action,addr,size,stream,time_us\n"
    "alloc,1,1024,0,1\n"
    "alloc,2,3145728,0,2\n"
    "free_completed,2,3145728,0,3\n"
    "alloc,3,4096,0,4\n"
    "free_completed,1,1024,0,5\n"
    "free_completed,3,4096,0,6\n";

class PartialHistoryReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshDir("partial_history");
    trace_ = dir_ + "/trace.csv";
    ASSERT_TRUE(WriteFileBytes(trace_, kTrace).ok());
  }
  // Replays the trace keeping `history` events; returns the end snapshot's path.
  std::string EndSnapshot(int history) {
    const testing::CliRun r = Cli(absl::StrCat("replay --device sim --history-max ", history, " --snapshot ",
                                               dir_, "/h", history, ".json ", trace_));
    EXPECT_EQ(r.code, 0) << r.output;
    return absl::StrCat(dir_, "/h", history, ".end.json");
  }
  std::string dir_;
  std::string trace_;
};

TEST_F(PartialHistoryReplayTest, AnOverflowedHistoryIsRefusedSayingWhatIsMissing) {
  const std::string end = EndSnapshot(6);
  const testing::CliRun r = Cli("replay --device sim " + end);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("the snapshot's history is not the whole run: its history overflowed: it kept "
                        "the newest 6 events (history_max_entries 6)"));
  EXPECT_THAT(r.output, HasSubstr("pass --allow-partial-history"));
  EXPECT_THAT(r.output, Not(HasSubstr("Completed:")));
}

TEST_F(PartialHistoryReplayTest, AllowedAPartialReplaySaysItIsPartial) {
  const std::string end = EndSnapshot(6);
  const testing::CliRun r = Cli("replay --device sim --allow-partial-history " + end);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Partial:       its history overflowed"));
  EXPECT_THAT(r.output, HasSubstr("Completed:     yes, of a partial history (not the whole run)"));
  const testing::CliRun json = Cli("replay --device sim --allow-partial-history --json " + end);
  EXPECT_EQ(json.code, 0) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\"partial_history\": \"its history overflowed"));
}

TEST_F(PartialHistoryReplayTest, AWholeHistoryReplaysAsBefore) {
  const std::string end = EndSnapshot(1000);
  const testing::CliRun r = Cli("replay --device sim " + end);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Completed:     yes\n"));
  EXPECT_THAT(r.output, Not(HasSubstr("Partial:")));
  const testing::CliRun json = Cli("replay --device sim --json " + end);
  EXPECT_THAT(json.output, HasSubstr("\"partial_history\": null"));
}

// History turned on after blocks were allocated: no overflow, but frees of unseen blocks and live blocks
// allocated before it.
TEST(PartialHistoryTraceTest, AHistoryThatBeganLateIsPartial) {
  MemorySnapshot s;
  s.history_max_entries = 100;
  s.history = {{HistoryAction::kAlloc, 0x2000, 512, 0, 0, 1, {}, ""},
               {HistoryAction::kFreeCompleted, 0x1000, 512, 0, 0, 2, {}, ""}};
  SegmentSnapshot seg;
  seg.address = 0x1000;
  seg.total_size = 0x2000;
  seg.blocks = {{0x1000, 512, 0, BlockState::kFree, 0, {}, ""},
                {0x1200, 512, 512, BlockState::kAllocated, 0, {}, ""},
                {0x1400, 0xc00, 0, BlockState::kFree, 0, {}, ""},
                {0x2000, 0x1000, 512, BlockState::kAllocated, 0, {}, ""}};
  s.segments.push_back(seg);
  absl::StatusOr<Trace> refused = TraceFromHistory(s, "late.json");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      refused.status().message(),
      HasSubstr("late.json: the snapshot's history is not the whole run: 1 frees are of blocks allocated "
                "before its first event; 1 blocks live in the snapshot were allocated before its first "
                "event"));
  absl::StatusOr<Trace> allowed = TraceFromHistory(s, "late.json", {.allow_partial_history = true});
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(allowed->events.size(), 1u);  // the unseen block's free is dropped
  EXPECT_THAT(allowed->partial, HasSubstr("1 frees are of blocks allocated before its first event"));
}

TEST(PartialHistoryTraceTest, AHistoryWithoutAllocatorEventsHasNothingToReplay) {
  MemorySnapshot s;
  s.history_max_entries = 100;
  s.history = {{HistoryAction::kSnapshot, 0, 0, 0, 0, 1, {}, ""}};
  absl::StatusOr<Trace> t = TraceFromHistory(s, "empty.json", {.allow_partial_history = true});
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      t.status().message(),
      HasSubstr("empty.json: the snapshot's history holds none of the allocator's events (1 events of other "
                "kinds): nothing to replay"));
}

}  // namespace
}  // namespace graphalloc
