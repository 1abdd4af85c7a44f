// The command line's inputs and outputs: output that cannot be written (a full disk, a closed pipe) exits 2
// with the reason instead of 0 with the output lost; `-` is stdin or stdout wherever a file is read or
// written, or refused with a message where it cannot be; a PyTorch pickle of several devices says which one
// it shows, and --device shows another.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/pickle.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "tests/testing/cli_run.h"

namespace graphalloc {
namespace {

using testing::Cli;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;

constexpr char kTrace[] =
    "action,addr,size,stream,time_us\n"
    "alloc,1,1024,0,1\n"
    "alloc,2,3145728,0,2\n"
    "free_completed,2,3145728,0,3\n"
    "free_completed,1,1024,0,4\n";

// A PyTorch memory snapshot of devices 0 and 2, one segment each (a 2 MiB one on device 0, a 4 MiB one on
// device 2), as torch.cuda.memory._dump_snapshot() writes them on a machine with several GPUs.
std::string TwoDevicePickle() {
  PickleWriter w;
  w.BeginDict();
  w.String("segments");
  w.BeginList();
  const std::pair<int, std::uint64_t> segments[] = {{0, 2 << 20}, {2, 4 << 20}};
  for (const auto& [device, size] : segments) {
    const std::uint64_t address = 0x7f0000000000 + (static_cast<std::uint64_t>(device) << 32);
    w.BeginDict();
    w.String("device");
    w.Int(device);
    w.String("address");
    w.UInt(address);
    w.String("total_size");
    w.UInt(size);
    w.String("stream");
    w.Int(0);
    w.String("segment_type");
    w.String("large");
    w.String("blocks");
    w.BeginList();
    w.BeginDict();
    w.String("address");
    w.UInt(address);
    w.String("size");
    w.UInt(size);
    w.String("requested_size");
    w.UInt(size);
    w.String("state");
    w.String("active_allocated");
    w.EndDict();
    w.EndList();
    w.EndDict();
  }
  w.EndList();
  w.String("device_traces");
  w.BeginList();
  for (int d = 0; d < 3; ++d) {
    w.BeginList();
    w.EndList();
  }
  w.EndList();
  w.EndDict();
  return w.Finish();
}

class CliStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshDir("cli_streams");
    trace_ = dir_ + "/trace.csv";
    ASSERT_TRUE(WriteFileBytes(trace_, kTrace).ok());
    snapshot_ = dir_ + "/s.json";
    ASSERT_EQ(Cli(absl::StrCat("replay --device sim --snapshot ", snapshot_, " ", trace_)).code, 0);
    pickle_ = dir_ + "/two.pickle";
    ASSERT_TRUE(WriteFileBytes(pickle_, TwoDevicePickle()).ok());
  }
  std::string dir_, trace_, snapshot_, pickle_;
};

TEST_F(CliStreamsTest, OutputToAFullDiskExitsTwoWithTheReason) {
  for (const std::string& args :
       {absl::StrCat("snapshot summary ", snapshot_), absl::StrCat("snapshot summary --json ", snapshot_),
        absl::StrCat("replay --device sim --json ", trace_), absl::StrCat("oom-report --help"),
        absl::StrCat("snapshot plot ", snapshot_, " -o -")}) {
    const testing::CliRun r = RunCommand(absl::StrCat(GRAPHALLOC_CLI_PATH, " ", args, " 2>&1 >/dev/full"));
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("No space left on device")) << args;
  }
}

TEST_F(CliStreamsTest, AFileOutputToAFullDiskExitsTwoWithTheReason) {
  const testing::CliRun r = Cli(absl::StrCat("snapshot export-torch ", snapshot_, " -o /dev/full"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("/dev/full: write failed: No space left on device"));
}

TEST_F(CliStreamsTest, OutputToAClosedPipeExitsTwoWithTheReason) {
  // The reader is gone before the first write: every write fails with EPIPE.
  const testing::CliRun r = RunCommand(
      absl::StrCat("(sleep 0.3; ", GRAPHALLOC_CLI_PATH, " snapshot summary ", snapshot_, " 2>", dir_,
                   "/err.txt; echo $? >", dir_, "/rc.txt) | true; cat ", dir_, "/rc.txt ", dir_, "/err.txt"));
  EXPECT_THAT(r.output, HasSubstr("2\ngraphalloc: cannot write the output to stdout: Broken pipe"));
}

TEST_F(CliStreamsTest, ReplayReadsATraceFromStdin) {
  const testing::CliRun r = Cli(absl::StrCat("replay --device sim - < ", trace_));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Trace:         (stdin) (-)"));
  EXPECT_THAT(r.output, HasSubstr("Events:        4 of 4"));
}

TEST_F(CliStreamsTest, ReplaySnapshotToStdoutIsRefused) {
  const testing::CliRun r = Cli(absl::StrCat("replay --device sim --snapshot - ", trace_));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--snapshot -: a replay writes two snapshots"));
  EXPECT_THAT(r.output, Not(HasSubstr("Completed")));
}

TEST_F(CliStreamsTest, EverySubcommandReadsASnapshotFromStdin) {
  for (const char* sub : {"snapshot summary -", "snapshot segments -", "snapshot check -",
                          "snapshot plot - -o -", "snapshot export-torch - -o -"}) {
    const testing::CliRun r = Cli(absl::StrCat(sub, " < ", snapshot_, " > /dev/null"));
    EXPECT_EQ(r.code, 0) << sub << "\n" << r.output;
  }
}

TEST_F(CliStreamsTest, APickleOfSeveralDevicesSaysWhichOneItShows) {
  const testing::CliRun r = Cli("snapshot summary " + pickle_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr(absl::StrCat("graphalloc snapshot summary: ", pickle_,
                                     " holds devices 0, 2; this is device 0 (--device N shows another)")));
  EXPECT_THAT(r.output, HasSubstr("2.00 MiB"));
  const testing::CliRun two = Cli("snapshot summary --json --device 2 " + pickle_);
  EXPECT_EQ(two.code, 0) << two.output;
  EXPECT_THAT(two.output, Not(HasSubstr("holds devices")));
  EXPECT_THAT(two.output, HasSubstr(absl::StrCat("\"reserved_bytes\": ", 4 << 20)));
  for (const std::string& sub : {"snapshot plot " + pickle_ + " -o " + dir_ + "/p.html",
                                 "snapshot import-torch " + pickle_ + " -o " + dir_ + "/p.json"}) {
    const testing::CliRun each = Cli(sub);
    EXPECT_EQ(each.code, 0) << each.output;
    EXPECT_THAT(each.output, HasSubstr("holds devices 0, 2; this is device 0")) << sub;
  }
  const testing::CliRun absent = Cli("snapshot summary --device 1 " + pickle_);
  EXPECT_EQ(absent.code, 2) << absent.output;
  EXPECT_THAT(absent.output, HasSubstr("devices present: 0, 2"));
  const testing::CliRun json = Cli("snapshot summary --device 1 " + snapshot_);
  EXPECT_EQ(json.code, 2) << json.output;
  EXPECT_THAT(json.output, HasSubstr("a graphalloc snapshot of device 0 alone; --device 1 names another"));
}

}  // namespace
}  // namespace graphalloc
