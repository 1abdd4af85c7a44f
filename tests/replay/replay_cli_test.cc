// `graphalloc replay` end to end on the built binary: its bad inputs (a directory, a capacity out of range,
// a bad GRAPHALLOC_CONF, an unwritable --snapshot) exit 2 with a message, --config overrides
// GRAPHALLOC_CONF, --history-max caps the history a snapshot keeps, and after an out-of-memory stop the
// peak live and the ratio are those of the part replayed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "tests/testing/cli_run.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using testing::Cli;

// A 1 KiB block stays live while a 3 MiB request needs a 20 MiB segment: out of memory under 4 MiB.
constexpr char kTrace[] =
    "action,addr,size,stream,time_us\n"
    "alloc,1,1024,0,1\n"
    "free_requested,1,1024,0,2\n"
    "alloc,2,3145728,0,3\n"
    "free_completed,2,3145728,0,4\n"
    "free_completed,1,1024,0,5\n";

class ReplayCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir();
    trace_ = dir_ + "/replay_cli_trace.csv";
    ASSERT_TRUE(WriteFileBytes(trace_, kTrace).ok());
  }
  std::string dir_;
  std::string trace_;
};

TEST_F(ReplayCliTest, ADirectoryIsBadInputNotACrash) {
  const testing::CliRun r = Cli("replay --device sim " + dir_);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(": is a directory; give a trace file"));
  EXPECT_THAT(r.output, Not(HasSubstr("ios_failure")));
}

TEST_F(ReplayCliTest, CapacityOutOfRangeSaysSo) {
  const testing::CliRun r = Cli("replay --device sim --capacity 99999999999999999999 " + trace_);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--capacity: '99999999999999999999' is out of range (at most 8 EiB"));
  EXPECT_THAT(r.output, Not(HasSubstr("must be > 0")));
}

TEST_F(ReplayCliTest, BadGraphallocConfExitsTwoNamingTheKey) {
  const testing::CliRun r = Cli("replay --device sim " + trace_, "GRAPHALLOC_CONF=bogus:1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("graphalloc replay: GRAPHALLOC_CONF: unknown key 'bogus'"));
}

TEST_F(ReplayCliTest, GraphallocConfAppliesAndConfigOverridesIt) {
  testing::CliRun r = Cli("replay --device sim " + trace_, "GRAPHALLOC_CONF=expandable_segments:False");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("Config:        defaults but expandable_segments:False (from GRAPHALLOC_CONF)"));
  r = Cli("replay --device sim --config max_split_size_mb:256 " + trace_, "GRAPHALLOC_CONF=bogus:1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Config:        defaults but max_split_size_mb:256 (from --config)"));
}

TEST_F(ReplayCliTest, DefaultsAreShownAsDefaults) {
  const testing::CliRun r = Cli("replay --device sim " + trace_, "GRAPHALLOC_CONF=");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Config:        defaults\n"));
}

TEST_F(ReplayCliTest, UnwritableSnapshotExitsTwo) {
  const testing::CliRun r =
      Cli(absl::StrCat("replay --device sim --snapshot ", dir_, "/no/such/dir/x.json ", trace_));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--snapshot: "));
  EXPECT_THAT(r.output, HasSubstr("x.json: cannot open for writing"));
}

TEST_F(ReplayCliTest, HistoryMaxCapsTheSnapshotsHistory) {
  const std::string snap = dir_ + "/replay_cli_capped.json";
  const testing::CliRun r =
      Cli(absl::StrCat("replay --device sim --history-max 2 --snapshot ", snap, " ", trace_));
  ASSERT_EQ(r.code, 0) << r.output;
  absl::StatusOr<MemorySnapshot> end = ReadSnapshotFile(dir_ + "/replay_cli_capped.end.json");
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->history_max_entries, 2u);
  EXPECT_EQ(end->history.size(), 2u);
  EXPECT_TRUE(end->history_overflowed);
  EXPECT_EQ(Cli(absl::StrCat("replay --device sim --history-max 0 --snapshot ", snap, " ", trace_)).code, 2);
}

TEST_F(ReplayCliTest, HelpStatesTheHistoryDefault) {
  const testing::CliRun r = Cli("replay --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.output, HasSubstr("--history-max"));
  EXPECT_THAT(r.output, HasSubstr("100000"));
}

TEST_F(ReplayCliTest, OutOfMemoryReportsThePeakLiveUpToTheStop) {
  const testing::CliRun r =
      Cli("replay --device sim --capacity 4MiB --config expandable_segments:False " + trace_);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Peak live:     1024 bytes up to the stop; the whole trace's: 3.00 MiB"));
  EXPECT_THAT(r.output, HasSubstr("Ratio:         2048.000"));
  EXPECT_THAT(r.output, HasSubstr("Completed:     no: at replay_cli_trace.csv:4"));
}

}  // namespace
}  // namespace graphalloc
