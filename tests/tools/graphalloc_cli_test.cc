// The graphalloc command line's shared conventions, end to end on the built binary: the version (the same
// string as the C ABI's), unknown subcommands, the allocator configuration of the device check (--config
// over GRAPHALLOC_CONF, a bad one exiting 2 with the key named). Exit codes: tools/cli_common.h.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "graphalloc/allocator/c_api/graphalloc.h"
#include "tests/testing/cli_run.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using testing::Cli;

TEST(GraphallocCliTest, VersionFlagsAndSubcommandPrintTheLibraryVersion) {
  const std::string expected = std::string(graphalloc_version()) + "\n";
  EXPECT_EQ(expected, "graphalloc " GRAPHALLOC_PROJECT_VERSION "\n");
  for (const char* args : {"--version", "-V", "version"}) {
    const testing::CliRun r = Cli(args);
    EXPECT_EQ(r.code, 0) << args;
    EXPECT_EQ(r.output, expected) << args;
  }
}

TEST(GraphallocCliTest, UnknownSubcommandExitsTwoPointingToHelp) {
  testing::CliRun r = Cli("help");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.output, "graphalloc: unknown subcommand 'help'; run graphalloc --help\n");
  r = Cli("frobnicate --json");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown subcommand 'frobnicate'"));
  r = Cli("snapshot sumary x.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.output, "graphalloc snapshot: unknown subcommand 'sumary'; run graphalloc snapshot --help\n");
  EXPECT_THAT(r.output, Not(HasSubstr("A subcommand is required")));
}

TEST(GraphallocCliTest, NoSubcommandStillExitsTwo) {
  const testing::CliRun r = Cli("");
  EXPECT_EQ(r.code, 2);
}

TEST(GraphallocCliTest, HelpStatesTheExitCodes) {
  const testing::CliRun r = Cli("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.output, HasSubstr("Exit codes: 0 ok, 1 a failed check"));
  EXPECT_THAT(r.output, HasSubstr("version"));
}

TEST(GraphallocCliTest, DeviceRejectsABadGraphallocConfNamingTheKey) {
  const testing::CliRun r = Cli("device --device sim", "GRAPHALLOC_CONF=bogus:1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("graphalloc device: GRAPHALLOC_CONF: unknown key 'bogus'"));
}

TEST(GraphallocCliTest, DeviceConfigFlagOverridesGraphallocConf) {
  const testing::CliRun r =
      Cli("device --device sim --config expandable_segments:False", "GRAPHALLOC_CONF=bogus:1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Config: defaults but expandable_segments:False (from --config)"));
}

TEST(GraphallocCliTest, DeviceAcceptsACopiedPyTorchConf) {
  const testing::CliRun r =
      Cli("device --device sim", "GRAPHALLOC_CONF=backend:native,expandable_segments:True");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("config key 'backend' is PyTorch's allocator's only"));
}

}  // namespace
}  // namespace graphalloc
