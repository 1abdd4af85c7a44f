// The history's length is checked at every edge it enters by, with one limit (kMaxHistoryEntries, 2^28) and
// an error that names it: GRAPHALLOC_CONF's history_max_entries, a Config built in code
// (CachingAllocator::Create), the C ABI (graphalloc_record_history) and the CLI (replay --history-max).
// Before, above 2^28 the allocator recorded nothing and said nothing (Create dropped the error). Python's
// record_history checks it too (tests/python, ArgumentChecksTest). And asking for the largest ring costs
// nothing until events fill it (history_ring_test).
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/cli_run.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kTooMany = kMaxHistoryEntries + 1;

TEST(HistoryLimitsTest, ConfigRefusesMoreThanTheLargestRingNamingIt) {
  absl::StatusOr<Config> c =
      Config::Parse(absl::StrCat("record_history:True,history_max_entries:", kTooMany));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("bad value '268435457' for key 'history_max_entries'"));
  EXPECT_THAT(c.status().message(), HasSubstr("from 1 to 268435456 (2^28, the largest history ring)"));
  // 2^32, which used to pass and record nothing.
  EXPECT_FALSE(Config::Parse("history_max_entries:4294967296").ok());
  absl::StatusOr<Config> largest = Config::Parse("history_max_entries:268435456");
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ(largest->history_max_entries, kMaxHistoryEntries);
}

TEST(HistoryLimitsTest, CreateRefusesAConfigBuiltInCodeInsteadOfRecordingNothing) {
  absl::StatusOr<std::unique_ptr<SimDriver>> driver = SimDriver::Create({});
  ASSERT_TRUE(driver.ok());
  Config config;
  config.record_history = true;
  config.history_max_entries = kTooMany;
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator =
      CachingAllocator::Create(std::shared_ptr<Driver>(std::move(*driver)), config);
  ASSERT_FALSE(allocator.ok());
  EXPECT_EQ(allocator.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(allocator.status().message(),
              HasSubstr("CachingAllocator::Create: history max_entries 268435457 exceeds the largest ring, "
                        "268435456 events"));
}

TEST(HistoryLimitsTest, TheCApiRefusesWithACodeAndTheLimit) {
  EXPECT_EQ(graphalloc_record_history(0, 1, kTooMany, 0), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("exceeds the largest ring, 268435456 events"));
  EXPECT_EQ(graphalloc_record_history(0, 1, 0, 0), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("at least 1"));
  EXPECT_EQ(graphalloc_record_history(0, 1, kMaxHistoryEntries, 0), GRAPHALLOC_OK);  // nothing allocated yet
  EXPECT_EQ(graphalloc_record_history(0, 0, 1, 0), GRAPHALLOC_OK);
}

TEST(HistoryLimitsTest, TheCliRefusesAHistoryMaxOutOfRange) {
  const testing::CliRun r = testing::Cli(
      absl::StrCat("replay --device sim --snapshot /tmp/unused.json --history-max ", kTooMany, " /dev/null"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--history-max"));
  EXPECT_THAT(r.output, HasSubstr("268435456"));
}

}  // namespace
}  // namespace graphalloc
