// DeviceStats::ToJson (graphalloc_stats_json, graphalloc.stats() in Python) against PyTorch's names: a
// script written for torch.cuda.memory_stats() must find every key under the same name.
#include "graphalloc/allocator/stats/stats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

// The keys torch.cuda.memory_stats() returns in PyTorch 2.11, written out.
std::set<std::string> TorchMemoryStatsKeys() {
  std::set<std::string> keys;
  for (const char* array : {"allocation", "segment", "active", "inactive_split", "allocated_bytes",
                            "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"}) {
    for (const char* pool : {"all", "small_pool", "large_pool"}) {
      for (const char* field : {"current", "peak", "allocated", "freed"}) {
        keys.insert(std::string(array) + "." + pool + "." + field);
      }
    }
  }
  for (const char* array : {"oversize_allocations", "oversize_segments"}) {
    for (const char* field : {"current", "peak", "allocated", "freed"}) {
      keys.insert(std::string(array) + "." + field);
    }
  }
  for (const char* counter : {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                              "num_device_free", "max_split_size"}) {
    keys.insert(counter);
  }
  return keys;
}

// The keys of a flat JSON object of numbers: each "name" followed by a colon. (No std::regex: GCC 12's
// <regex> trips -Wmaybe-uninitialized under the sanitizer builds' -O1.)
std::set<std::string> JsonKeys(const std::string& json) {
  std::set<std::string> keys;
  for (std::size_t open = json.find('"'); open != std::string::npos; open = json.find('"', open)) {
    const std::size_t close = json.find('"', open + 1);
    if (close == std::string::npos) break;
    if (json.compare(close + 1, 1, ":") == 0) keys.insert(json.substr(open + 1, close - open - 1));
    open = close + 1;
  }
  return keys;
}

TEST(StatsJsonTest, KeysAreExactlyPyTorchMemoryStatsKeys) {
  const std::set<std::string> expected = TorchMemoryStatsKeys();
  EXPECT_EQ(expected.size(), 9u * 3 * 4 + 2 * 4 + 6);
  EXPECT_EQ(JsonKeys(DeviceStats().ToJson()), expected);
}

TEST(StatsJsonTest, OversizeCountersHaveNoPoolLevel) {
  DeviceStats stats;
  stats.oversize_allocations.Increase(/*small=*/false, 2);
  stats.oversize_segments.Increase(/*small=*/false, 1);
  const std::string json = stats.ToJson();
  EXPECT_THAT(json, HasSubstr("\"oversize_allocations.current\": 2"));
  EXPECT_THAT(json, HasSubstr("\"oversize_allocations.peak\": 2"));
  EXPECT_THAT(json, HasSubstr("\"oversize_segments.allocated\": 1"));
}

}  // namespace
}  // namespace graphalloc
