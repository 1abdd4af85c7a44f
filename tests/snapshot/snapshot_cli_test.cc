// `graphalloc snapshot ...` end to end: each subcommand on a fixture file written here, with its output
// and exit code checked; corrupt, truncated, wrong-version and missing files exit 2 with the location;
// a snapshot whose statistics disagree with its blocks fails `check` with exit 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"
#include "tests/snapshot/snapshot_fixture.h"
#include "tests/testing/cli_run.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using testing::MakeFixtureSnapshot;
using ::testing::Not;

using testing::Cli;

class SnapshotCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestDir();
    fixture_ = dir_ + "/fixture.json";
    ASSERT_TRUE(WriteSnapshotFile(MakeFixtureSnapshot(), fixture_).ok());
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    EXPECT_TRUE(WriteFileBytes(path, bytes).ok());
    return path;
  }
  std::string dir_;
  std::string fixture_;
};

TEST_F(SnapshotCliTest, Summary) {
  testing::CliRun r = Cli("snapshot summary " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("reserved          10.00 MiB (10485760 bytes)"));
  EXPECT_THAT(r.output, HasSubstr("statistics match the segments"));
  EXPECT_THAT(r.output, HasSubstr("Top call sites by allocated bytes"));
  r = Cli("snapshot summary --json --top 1 " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"allocated_bytes\": 3146240"));
  EXPECT_THAT(r.output, HasSubstr("\"fragmentation_bytes\": 7339520"));
}

TEST_F(SnapshotCliTest, Segments) {
  const testing::CliRun r = Cli("snapshot segments " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("segment 0: [0x7f0000000000, 0x7f0000400000) 4.00 MiB"));
  EXPECT_THAT(r.output, HasSubstr("pending_free"));
}

TEST_F(SnapshotCliTest, PlotSvgAndHtml) {
  testing::CliRun r = Cli(absl::StrCat("snapshot plot ", fixture_, " -o ", dir_, "/out.svg"));
  EXPECT_EQ(r.code, 0) << r.output;
  absl::StatusOr<std::string> svg = ReadFileBytes(dir_ + "/out.svg");
  ASSERT_TRUE(svg.ok());
  std::size_t rects = 0;
  for (std::size_t at = svg->find("<rect class=\"block\""); at != std::string::npos;
       at = svg->find("<rect class=\"block\"", at + 1)) {
    ++rects;
  }
  EXPECT_EQ(rects, static_cast<std::size_t>(testing::kFixtureBlocks));
  r = Cli(absl::StrCat("snapshot plot ", fixture_, " -o ", dir_, "/out.html"));
  EXPECT_EQ(r.code, 0) << r.output;
  absl::StatusOr<std::string> html = ReadFileBytes(dir_ + "/out.html");
  ASSERT_TRUE(html.ok());
  EXPECT_THAT(*html, HasSubstr("<!DOCTYPE html>"));
  r = Cli(absl::StrCat("snapshot plot ", fixture_, " -o ", dir_, "/out.png"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.output, HasSubstr("must end in .svg or .html"));
  r = Cli(absl::StrCat("snapshot plot ", fixture_, " -o ", dir_, "/no/such/dir/out.svg"));
  EXPECT_EQ(r.code, 2) << r.output;  // an output that cannot be written is bad input, as everywhere
  EXPECT_THAT(r.output, HasSubstr("out.svg: cannot open for writing"));
}

TEST_F(SnapshotCliTest, UnwritableExportOutputExitsTwo) {
  const testing::CliRun r =
      Cli(absl::StrCat("snapshot export-torch ", fixture_, " -o ", dir_, "/no/such/dir/x.pickle"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("graphalloc snapshot export-torch: "));
  EXPECT_THAT(r.output, HasSubstr("x.pickle: cannot open for writing"));
}

TEST_F(SnapshotCliTest, DashReadsStdinAndWritesStdout) {
  testing::CliRun r = Cli("snapshot summary - < " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("reserved          10.00 MiB (10485760 bytes)"));
  r = Cli("snapshot segments - < " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("segment 0: [0x7f0000000000, 0x7f0000400000) 4.00 MiB"));
  r = Cli("snapshot check - < " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  r = Cli(absl::StrCat("snapshot diff - ", fixture_, " < ", fixture_));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Segments added: 0, removed: 0"));
  r = Cli("snapshot diff - - < " + fixture_);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("only one of the two snapshots can be read from stdin"));
  // export-torch to stdout, then import-torch from stdin: the pipe carries the pickle alone.
  r = Cli(absl::StrCat("snapshot export-torch ", fixture_, " -o - 2>/dev/null | ", GRAPHALLOC_CLI_PATH,
                       " snapshot import-torch - -o - 2>/dev/null | ", GRAPHALLOC_CLI_PATH,
                       " snapshot check -"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("-: ok (4 segments, 15 history events)"));
}

TEST_F(SnapshotCliTest, EveryReadOnlySubcommandPrintsJson) {
  testing::CliRun r = Cli("snapshot segments --json " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"address\": 139637976727552"));
  EXPECT_THAT(r.output, HasSubstr("\"state\": \"pending_free\""));
  r = Cli(absl::StrCat("snapshot diff --json ", fixture_, " ", fixture_));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"segments_removed\": 0"));
  EXPECT_THAT(r.output, HasSubstr("\"reserved_bytes\": 10485760"));
  r = Cli("snapshot check --json " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"ok\": true"));
}

TEST_F(SnapshotCliTest, NegativeCountsAreRefused) {
  testing::CliRun r = Cli("snapshot summary --top -3 " + fixture_);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--top: must be 0 or more, not -3"));
  r = Cli(absl::StrCat("snapshot import-torch --device -1 x.pickle -o ", dir_, "/x.json"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--device: must be 0 or more, not -1"));
}

TEST_F(SnapshotCliTest, ImportOfAMissingDeviceListsTheDevicesPresent) {
  const std::string pickle = dir_ + "/device0.pickle";
  ASSERT_EQ(Cli(absl::StrCat("snapshot export-torch ", fixture_, " -o ", pickle)).code, 0);
  const testing::CliRun r =
      Cli(absl::StrCat("snapshot import-torch --device 3 ", pickle, " -o ", dir_, "/d3.json"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("device 3 has no segments or trace entries in this snapshot; devices present: 0"));
}

TEST_F(SnapshotCliTest, Diff) {
  MemorySnapshot after = MakeFixtureSnapshot();
  after.segments.pop_back();
  const std::string b = dir_ + "/after.json";
  ASSERT_TRUE(WriteSnapshotFile(after, b).ok());
  const testing::CliRun r = Cli(absl::StrCat("snapshot diff ", fixture_, " ", b));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Segments added: 0, removed: 1"));
  EXPECT_THAT(r.output, HasSubstr("-1.00 MiB  attention (model.cc:40)"));
}

TEST_F(SnapshotCliTest, CheckPassesAndFails) {
  testing::CliRun r = Cli("snapshot check " + fixture_);
  EXPECT_EQ(r.code, 0) << r.output;
  MemorySnapshot bad = MakeFixtureSnapshot();
  bad.stats.allocated_bytes[StatType::kAggregate].current = 1;
  const std::string path = dir_ + "/inconsistent.json";
  ASSERT_TRUE(WriteSnapshotFile(bad, path).ok());
  r = Cli("snapshot check " + path);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("allocated_bytes.all.current is 1 but the segments add up to 3146240"));
}

TEST_F(SnapshotCliTest, ExportThenImportTorch) {
  const std::string pickle = dir_ + "/fixture.pickle", json = dir_ + "/imported.json";
  testing::CliRun r = Cli(absl::StrCat("snapshot export-torch ", fixture_, " -o ", pickle));
  ASSERT_EQ(r.code, 0) << r.output;
  r = Cli(absl::StrCat("snapshot import-torch ", pickle, " -o ", json));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(4 segments, 15 history events)"));
  absl::StatusOr<MemorySnapshot> imported = ReadSnapshotFile(json);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->history, MakeFixtureSnapshot().history);
  // The other subcommands read a PyTorch pickle directly too.
  r = Cli("snapshot summary " + pickle);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("from pytorch"));
  r = Cli("snapshot check " + pickle);
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(SnapshotCliTest, BadInputExitsTwoWithTheLocation) {
  const std::string json = SnapshotToJson(MakeFixtureSnapshot());
  struct Case {
    std::string name, bytes, message;
  };
  const std::vector<Case> cases = {
      {"truncated.json", json.substr(0, json.size() / 2), "not valid JSON at byte "},
      {"corrupt.json", absl::StrReplaceAll(json, {{"\"segments\":[", "\"segments\":[}"}}),
       "not valid JSON at byte "},
      {"version.json", absl::StrReplaceAll(json, {{"\"version\":1", "\"version\":3"}}),
       "version: snapshot format version 3 is not supported"},
      {"field.json", absl::StrReplaceAll(json, {{"\"size\":3145728", "\"size\":null"}}),
       "segments[2].blocks[1].size: expected a non-negative integer, found null"},
      {"empty.json", "", "not valid JSON at byte "},
      {"truncated.pickle", SnapshotToTorchPickle(MakeFixtureSnapshot()).substr(0, 300),
       "bad pickle at byte "},
  };
  for (const Case& c : cases) {
    const std::string path = Write(c.name, c.bytes);
    for (const char* command : {"summary", "segments", "check", "export-torch -o /dev/null"}) {
      const testing::CliRun r = Cli(absl::StrCat("snapshot ", command, " ", path));
      EXPECT_EQ(r.code, 2) << c.name << " " << command << ": " << r.output;
      EXPECT_THAT(r.output, HasSubstr(c.message)) << c.name << " " << command;
      EXPECT_THAT(r.output, HasSubstr(path)) << c.name;
      EXPECT_THAT(r.output, Not(HasSubstr("terminate"))) << c.name;
    }
  }
  testing::CliRun r = Cli(absl::StrCat("snapshot summary ", dir_, "/missing.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.output, HasSubstr("missing.json: cannot open"));
  r = Cli(absl::StrCat("snapshot import-torch ", fixture_, " -o ", dir_, "/x.json"));  // JSON is not a pickle
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.output, HasSubstr("bad pickle at byte 0"));
  r = Cli(absl::StrCat("snapshot diff ", fixture_, " ", dir_, "/missing.json"));
  EXPECT_EQ(r.code, 2);
  r = Cli("snapshot summary");  // missing argument
  EXPECT_EQ(r.code, 2);
  r = Cli("snapshot");  // no subcommand
  EXPECT_EQ(r.code, 2);
}

TEST_F(SnapshotCliTest, HelpListsTheSubcommands) {
  const testing::CliRun r = Cli("snapshot --help");
  EXPECT_EQ(r.code, 0);
  for (const char* sub : {"summary", "segments", "plot", "diff", "check", "export-torch", "import-torch"}) {
    EXPECT_THAT(r.output, HasSubstr(sub));
  }
}

}  // namespace
}  // namespace graphalloc
