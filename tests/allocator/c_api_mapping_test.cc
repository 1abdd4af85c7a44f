// The C ABI of mapping observers and pins, through the process-wide allocators: a callback pair sees each
// map and unmap once with its user data, a late one is told what exists, pinned ranges and communication
// pools stay mapped through graphalloc_empty_cache, and bad arguments come back as codes.
#include <cstdint>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/device/driver.h"
#include "gtest/gtest.h"
#include "tests/testing/c_api_pool_malloc.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// What the callbacks saw: live mappings by address, and the calls.
struct Seen {
  std::map<void*, graphalloc_mapping_event> live;
  int maps = 0;
  int unmaps = 0;
  int bad = 0;  // a map of what was mapped, or an unmap of what was not
};

void OnMap(void* user_data, const graphalloc_mapping_event* e) {
  auto* seen = static_cast<Seen*>(user_data);
  ++seen->maps;
  if (!seen->live.emplace(e->ptr, *e).second) ++seen->bad;
}

void OnUnmap(void* user_data, const graphalloc_mapping_event* e) {
  auto* seen = static_cast<Seen*>(user_data);
  ++seen->unmaps;
  if (seen->live.erase(e->ptr) != 1) ++seen->bad;
}

class CApiMappingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip;
    driver_ = testing::DefaultAllocatorDriver(&skip);
    if (driver_ == nullptr) GTEST_SKIP() << skip;
  }
  void TearDown() override { testing::ExpectDefaultAllocatorsHoldNothing(); }

  void* Malloc(size_t size, uint64_t pool = 0) { return testing::MallocInPool(pool, size); }
  // The bytes of `seen`'s live mappings.
  static size_t LiveBytes(const Seen& seen) {
    size_t total = 0;
    for (const auto& [ptr, e] : seen.live) total += e.size;
    return total;
  }

  Driver* driver_ = nullptr;
};

TEST_F(CApiMappingTest, CallbacksSeeEachMapAndUnmapOnceWithTheirUserData) {
  Seen seen;
  uint64_t observer = 0;
  ASSERT_EQ(graphalloc_add_mapping_observer(0, OnMap, OnUnmap, &seen, 0, &observer), GRAPHALLOC_OK)
      << graphalloc_last_error();
  EXPECT_NE(observer, 0u);
  void* p = Malloc(2 * kMiB);
  ASSERT_EQ(seen.live.size(), 1u);
  const graphalloc_mapping_event e = seen.live.begin()->second;
  EXPECT_EQ(e.device, 0);
  EXPECT_EQ(e.pool, 0u);
  EXPECT_LE(e.ptr, p);
  EXPECT_GE(static_cast<char*>(e.ptr) + e.size, static_cast<char*>(p) + 2 * kMiB);
  ASSERT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
  EXPECT_EQ(seen.maps, 1);
  EXPECT_EQ(seen.unmaps, 1);
  EXPECT_EQ(seen.bad, 0);
  ASSERT_EQ(graphalloc_remove_mapping_observer(observer), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_free(Malloc(2 * kMiB), 0), GRAPHALLOC_OK);
  EXPECT_EQ(seen.maps, 1);  // removed: no more calls
  EXPECT_EQ(graphalloc_remove_mapping_observer(observer), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("not a registered mapping observer"));
}

TEST_F(CApiMappingTest, ALateObserverIsToldWhatIsMapped) {
  void* p = Malloc(4 * kMiB);
  Seen seen;
  uint64_t observer = 0;
  ASSERT_EQ(graphalloc_add_mapping_observer(0, OnMap, nullptr, &seen, 1, &observer), GRAPHALLOC_OK)
      << graphalloc_last_error();
  EXPECT_GE(seen.maps, 1);
  EXPECT_GE(LiveBytes(seen), 4 * kMiB);
  ASSERT_EQ(graphalloc_remove_mapping_observer(observer), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
}

TEST_F(CApiMappingTest, APinnedRangeStaysMappedUntilUnpinned) {
  Seen seen;
  uint64_t observer = 0;
  ASSERT_EQ(graphalloc_add_mapping_observer(0, OnMap, OnUnmap, &seen, 0, &observer), GRAPHALLOC_OK);
  void* p = Malloc(2 * kMiB);
  ASSERT_EQ(graphalloc_pin_mapping(0, p, 2 * kMiB), GRAPHALLOC_OK) << graphalloc_last_error();
  ASSERT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
  EXPECT_EQ(seen.unmaps, 0);
  EXPECT_EQ(seen.live.size(), 1u);
  ASSERT_EQ(graphalloc_unpin_mapping(0, p, 2 * kMiB), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(graphalloc_unpin_mapping(0, p, 2 * kMiB), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("is not pinned"));
  ASSERT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
  EXPECT_EQ(seen.unmaps, 1);
  EXPECT_EQ(seen.live.size(), 0u);
  EXPECT_EQ(seen.bad, 0);
  ASSERT_EQ(graphalloc_remove_mapping_observer(observer), GRAPHALLOC_OK);
}

TEST_F(CApiMappingTest, ACommunicationPoolKeepsItsMappingsUntilReleased) {
  Seen seen;
  uint64_t observer = 0;
  ASSERT_EQ(graphalloc_add_mapping_observer(0, OnMap, OnUnmap, &seen, 0, &observer), GRAPHALLOC_OK);
  uint64_t pool = 0;
  ASSERT_EQ(graphalloc_pool_create_for_communication(0, nullptr, &pool), GRAPHALLOC_OK)
      << graphalloc_last_error();
  void* p = Malloc(2 * kMiB, pool);
  ASSERT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_pool_empty_cache(0, pool), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
  size_t pinned = 0;
  ASSERT_EQ(graphalloc_pool_pinned_bytes(0, pool, &pinned), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(pinned, 2 * kMiB);
  EXPECT_EQ(seen.unmaps, 0);
  EXPECT_EQ(graphalloc_pool_sleep(0, pool, 0), GRAPHALLOC_FAILED_PRECONDITION);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("communication pools do not sleep"));
  ASSERT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
  EXPECT_EQ(seen.unmaps, 1);
  EXPECT_EQ(seen.live.size(), 0u);
  ASSERT_EQ(graphalloc_remove_mapping_observer(observer), GRAPHALLOC_OK);
}

TEST_F(CApiMappingTest, BadArgumentsAreReportedAsCodes) {
  EXPECT_EQ(graphalloc_add_mapping_observer(0, OnMap, OnUnmap, nullptr, 0, nullptr),
            GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("observer (the output) is NULL"));
  EXPECT_EQ(graphalloc_pin_mapping(0, reinterpret_cast<void*>(4096), 4096), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("does not lie inside one segment"));
  EXPECT_EQ(graphalloc_pool_pinned_bytes(0, 12345, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  size_t pinned = 1;
  EXPECT_EQ(graphalloc_pool_pinned_bytes(0, 12345, &pinned), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(pinned, 0u);
}

}  // namespace
}  // namespace graphalloc
