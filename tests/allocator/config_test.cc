#include "graphalloc/allocator/core/config.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, EmptyStringGivesDefaults) {
  absl::StatusOr<Config> config = Config::Parse("");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, Config{});
  EXPECT_EQ(config->max_split_size, std::numeric_limits<std::size_t>::max());
  EXPECT_TRUE(config->expandable_segments);  // on by default
  EXPECT_FALSE(config->handle_aligned);
}

TEST(ConfigTest, HandleAlignedParsesRoundTripsAndDiffers) {
  absl::StatusOr<Config> config = Config::Parse("handle_aligned:True");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->handle_aligned);
  EXPECT_EQ(config->DiffFromDefaults(), "handle_aligned:True");
  absl::StatusOr<Config> again = Config::Parse(config->ToString());
  ASSERT_TRUE(again.ok()) << again.status() << " for " << config->ToString();
  EXPECT_EQ(*again, *config);
  // Off, the key is left out of ToString (as the defaults of other optional keys are).
  EXPECT_THAT(Config{}.ToString(), ::testing::Not(HasSubstr("handle_aligned")));
  EXPECT_THAT(Config::Parse("handle_aligned:maybe").status().message(),
              HasSubstr("bad value 'maybe' for key 'handle_aligned'; accepted: True or False"));
}

TEST(ConfigTest, ParsesEveryKey) {
  absl::StatusOr<Config> config = Config::Parse(
      "expandable_segments:False, "
      "max_split_size_mb:256,max_non_split_rounding_mb:40,large_segment_size_mb:64,"
      "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5,release_lock_on_cudamalloc:True");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->expandable_segments);
  EXPECT_EQ(config->max_split_size, 256 * kMiB);
  EXPECT_EQ(config->max_non_split_rounding_size, 40 * kMiB);
  EXPECT_EQ(config->large_segment_size, 64 * kMiB);
  EXPECT_DOUBLE_EQ(config->garbage_collection_threshold, 0.6);
  EXPECT_DOUBLE_EQ(config->per_process_memory_fraction, 0.5);
}

TEST(ConfigTest, ParsesHistoryKeys) {
  absl::StatusOr<Config> config =
      Config::Parse("record_history:True,history_max_entries:500,history_stacks:True");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->record_history);
  EXPECT_EQ(config->history_max_entries, 500u);
  EXPECT_TRUE(config->history_stacks);
  EXPECT_THAT(Config::Parse("history_max_entries:0").status().message(),
              HasSubstr("accepted: an integer number of events from 1 to 268435456"));
}

TEST(ConfigTest, ParsesShareableHandlesAndNamesItOnlyWhenOn) {
  absl::StatusOr<Config> config = Config::Parse("shareable_handles:True");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->shareable_handles);
  EXPECT_FALSE(Config{}.shareable_handles);
  EXPECT_EQ(config->DiffFromDefaults(), "shareable_handles:True");
  EXPECT_THAT(config->ToString(), HasSubstr(",shareable_handles:True"));
  absl::StatusOr<Config> again = Config::Parse(config->ToString());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *config);
  EXPECT_FALSE(Config::Parse("shareable_handles:maybe").ok());
}

TEST(ConfigTest, RoundupDivisionsSingleValueFillsEveryInterval) {
  absl::StatusOr<Config> config = Config::Parse("roundup_power2_divisions:4");
  ASSERT_TRUE(config.ok()) << config.status();
  for (std::size_t d : config->roundup_power2_divisions) EXPECT_EQ(d, 4u);
}

TEST(ConfigTest, RoundupDivisionsListFollowsPyTorchRules) {
  absl::StatusOr<Config> config =
      Config::Parse("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]");
  ASSERT_TRUE(config.ok()) << config.status();
  const auto& d = config->roundup_power2_divisions;
  // The first key (64 MiB = interval 6) also fills every lower interval.
  for (int i = 0; i <= 6; ++i) EXPECT_EQ(d[i], 8u) << i;
  EXPECT_EQ(d[7], 2u);
  EXPECT_EQ(d[8], 2u);
  EXPECT_EQ(d[9], 2u);
  EXPECT_EQ(d[10], 1u);
  for (int i = 11; i < kRoundUpPowerOfTwoIntervals; ++i) EXPECT_EQ(d[i], 1u) << i;
}

TEST(ConfigTest, UnknownKeyIsAnErrorNamingTheKeyAndTheKnownKeys) {
  absl::StatusOr<Config> config = Config::Parse("expandable_segment:True");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("unknown key 'expandable_segment'"));
  EXPECT_THAT(config.status().message(), HasSubstr("expandable_segments"));
}

TEST(ConfigTest, BadValuesAreErrorsNamingKeyAndAcceptedValues) {
  struct Case {
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"expandable_segments:yes", "bad value 'yes' for key 'expandable_segments'; accepted: True or False"},
      {"max_split_size_mb:10",
       "bad value '10' for key 'max_split_size_mb'; accepted: an integer number of MiB >= 20"},
      {"max_split_size_mb:abc", "key 'max_split_size_mb'"},
      {"garbage_collection_threshold:1.0", "accepted: a number in (0, 1)"},
      {"per_process_memory_fraction:1.5", "accepted: a number in [0, 1]"},
      {"roundup_power2_divisions:3", "accepted: 0 or a power of two up to 1024"},
      {"roundup_power2_divisions:[64:8,32:2]", "interval keys in increasing order"},
      {"roundup_power2_divisions:[64:8", "a list closed by ']'"},
      {"large_segment_size_mb:10", "key 'large_segment_size_mb'"},
      {"expandable_segments", "expected 'expandable_segments:<value>'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Config> config = Config::Parse(c.text);
    ASSERT_FALSE(config.ok()) << c.text;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(config.status().message(), HasSubstr(c.expected)) << c.text;
  }
}

TEST(ConfigTest, ToStringRoundTrips) {
  absl::StatusOr<Config> config = Config::Parse(
      "expandable_segments:True,max_split_size_mb:256,roundup_power2_divisions:[64:8,>:2],"
      "garbage_collection_threshold:0.25,per_process_memory_fraction:0.75,record_history:True,"
      "history_max_entries:77");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Config> again = Config::Parse(config->ToString());
  ASSERT_TRUE(again.ok()) << again.status() << " for " << config->ToString();
  EXPECT_EQ(*again, *config);
}

TEST(ConfigTest, FractionsRoundTripExactly) {
  absl::StatusOr<Config> config =
      Config::Parse("garbage_collection_threshold:0.9999999,per_process_memory_fraction:0.1234567");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Config> again = Config::Parse(config->ToString());
  ASSERT_TRUE(again.ok()) << again.status() << " for " << config->ToString();
  EXPECT_EQ(again->garbage_collection_threshold, 0.9999999);
  EXPECT_EQ(again->per_process_memory_fraction, 0.1234567);
}

TEST(ConfigTest, PyTorchOnlyKeysAreAcceptedAndReportedAsIgnored) {
  std::vector<std::string> ignored;
  absl::StatusOr<Config> config = Config::Parse(
      "backend:native,expandable_segments:False,pinned_use_cuda_host_register:True,"
      "pinned_num_register_threads:8,pinned_use_background_threads:True,pinned_reserve_segment_size_mb:64,"
      "graph_capture_record_stream_reuse:True",
      &ignored);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->expandable_segments);
  EXPECT_THAT(ignored,
              ::testing::ElementsAre("backend", "pinned_use_cuda_host_register",
                                     "pinned_num_register_threads", "pinned_use_background_threads",
                                     "pinned_reserve_segment_size_mb", "graph_capture_record_stream_reuse"));
}

TEST(ConfigTest, PyTorchOnlyKeyWarnsOnceOnStderr) {
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(Config::Parse("backend:cudaMallocAsync").ok());
  ASSERT_TRUE(Config::Parse("backend:native").ok());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err,
            "graphalloc: config key 'backend' is PyTorch's allocator's only; it has no effect here and is "
            "ignored\n");
}

TEST(ConfigTest, PyTorchOnlyKeysStillCheckTheirValues) {
  absl::StatusOr<Config> config = Config::Parse("backend:fast");
  EXPECT_THAT(config.status().message(), HasSubstr("bad value 'fast' for key 'backend'"));
  config = Config::Parse("pinned_use_background_threads:maybe");
  EXPECT_THAT(config.status().message(), HasSubstr("key 'pinned_use_background_threads'"));
}

TEST(ConfigTest, DiffFromDefaultsNamesOnlyChangedKeys) {
  EXPECT_EQ(Config{}.DiffFromDefaults(), "");
  absl::StatusOr<Config> config =
      Config::Parse("expandable_segments:False,record_history:True,max_split_size_mb:256");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->DiffFromDefaults(),
            "max_split_size_mb:256,expandable_segments:False,record_history:True");
}

TEST(ConfigTest, FromEnvironmentReadsGraphallocConf) {
  ::setenv("GRAPHALLOC_CONF", "max_split_size_mb:64", 1);
  absl::StatusOr<Config> config = Config::FromEnvironment();
  ::unsetenv("GRAPHALLOC_CONF");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->max_split_size, 64 * kMiB);
}

}  // namespace
}  // namespace graphalloc
