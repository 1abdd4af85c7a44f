// `graphalloc oom-report SNAPSHOT` on the built binary: the snapshot a replay writes at its out-of-memory
// stop (X.oom.json) is explained exactly as the replay's own error explained it, from a file or from stdin;
// a snapshot without an out-of-memory event is refused, saying how to get one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "tests/testing/cli_run.h"

namespace graphalloc {
namespace {

using testing::Cli;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A 1 KiB block stays live while a 3 MiB request needs a 20 MiB segment (regular segments): out of memory
// under 4 MiB.
constexpr char kTrace[] =
    "action,addr,size,stream,time_us\n"
    "alloc,1,1024,0,1\n"
    "alloc,2,3145728,0,3\n"
    "free_completed,2,3145728,0,4\n"
    "free_completed,1,1024,0,5\n";

class OomReportCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshDir("oom_report_cli");
    trace_ = dir_ + "/trace.csv";
    ASSERT_TRUE(WriteFileBytes(trace_, kTrace).ok());
  }
  // Replays the trace on a 4 MiB device, writing snapshots to dir_/x*.json; returns the replay's error.
  std::string ReplayOutOfMemory() {
    const testing::CliRun r =
        Cli(absl::StrCat("replay --device sim --capacity 4MiB --config expandable_segments:False --json "
                         "--snapshot ",
                         dir_, "/x.json ", trace_));
    EXPECT_EQ(r.code, 1) << r.output;
    // The JSON object, then (stderr) the snapshots written.
    const std::string json = r.output.substr(0, r.output.find("\n}\n") + 2);
    return nlohmann::json::parse(json)["error"]["message"].get<std::string>();
  }
  std::string dir_;
  std::string trace_;
};

TEST_F(OomReportCliTest, TheReplaysOutOfMemorySnapshotIsExplainedAsTheReplayExplainedIt) {
  const std::string message = ReplayOutOfMemory();
  ASSERT_THAT(message, StartsWith("out of memory: tried to allocate 3.00 MiB"));
  const std::string explanation = message.substr(message.find('\n') + 1);
  EXPECT_THAT(explanation, HasSubstr("Request: 3.00 MiB on stream 0x0 for the default pool\n"));
  const testing::CliRun r = Cli(absl::StrCat("oom-report ", dir_, "/x.oom.json"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, explanation);
  // The same from stdin.
  const testing::CliRun piped = Cli(absl::StrCat("oom-report - < ", dir_, "/x.oom.json"));
  EXPECT_EQ(piped.code, 0) << piped.output;
  EXPECT_EQ(piped.output, explanation);
}

TEST_F(OomReportCliTest, ASnapshotWithoutAnOutOfMemoryEventIsRefusedSayingHowToGetOne) {
  // A replay that completes: its end snapshot has a history, but no out-of-memory event.
  const testing::CliRun replay =
      Cli(absl::StrCat("replay --device sim --snapshot ", dir_, "/y.json ", trace_));
  ASSERT_EQ(replay.code, 0) << replay.output;
  const testing::CliRun r = Cli(absl::StrCat("oom-report ", dir_, "/y.end.json"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("graphalloc oom-report: "));
  EXPECT_THAT(r.output, HasSubstr("y.end.json: the snapshot's history has no out-of-memory event: take the "
                                  "snapshot after the failure"));
}

TEST_F(OomReportCliTest, AMissingFileIsBadInput) {
  const testing::CliRun r = Cli(absl::StrCat("oom-report ", dir_, "/none.json"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("none.json"));
}

}  // namespace
}  // namespace graphalloc
