// The C ABI of sleep and wake, through the process-wide allocators: pools by tag and by id, the default
// pool, contents kept or discarded at unchanged addresses, allocations refused while asleep, and bad
// arguments reported as codes.
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/device/driver.h"
#include "gtest/gtest.h"
#include "tests/testing/c_api_pool_malloc.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

class CApiSleepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip;
    driver_ = testing::DefaultAllocatorDriver(&skip);
    if (driver_ == nullptr) GTEST_SKIP() << skip;
  }
  void TearDown() override { testing::ExpectDefaultAllocatorsHoldNothing(); }

  uint64_t NewPool(const char* tag) {
    uint64_t pool = 0;
    EXPECT_EQ(graphalloc_pool_create_with_tag(0, nullptr, tag, &pool), GRAPHALLOC_OK)
        << graphalloc_last_error();
    return pool;
  }
  // Allocates `size` bytes in `pool` (0: the default pool) through a route of the calling thread.
  void* MallocIn(uint64_t pool, size_t size) { return testing::MallocInPool(pool, size); }
  void Fill(void* p, std::size_t n, std::uint8_t byte) {
    const std::vector<std::uint8_t> data(n, byte);
    EXPECT_OK(driver_->CopyHostToDevice(reinterpret_cast<DevicePtr>(p), data.data(), n));
  }
  std::vector<std::uint8_t> Read(void* p, std::size_t n) {
    std::vector<std::uint8_t> out(n);
    EXPECT_OK(driver_->CopyDeviceToHost(out.data(), reinterpret_cast<DevicePtr>(p), n));
    return out;
  }
  int Asleep(uint64_t pool, size_t* sleeping = nullptr, size_t* backup = nullptr) {
    int asleep = -1;
    EXPECT_EQ(graphalloc_pool_sleep_state(0, pool, &asleep, sleeping, backup), GRAPHALLOC_OK)
        << graphalloc_last_error();
    return asleep;
  }

  Driver* driver_ = nullptr;
};

TEST_F(CApiSleepTest, ATagSleepsItsPoolsWithBackupAndWakesThemAtTheSameAddresses) {
  const uint64_t weights = NewPool("weights");
  const uint64_t kv = NewPool("kv");
  void* w = MallocIn(weights, 4 * kMiB);
  void* k = MallocIn(kv, 2 * kMiB);
  Fill(w, 4 * kMiB, 0x3c);
  ASSERT_EQ(graphalloc_sleep(0, "weights", /*backup=*/1), GRAPHALLOC_OK) << graphalloc_last_error();
  size_t sleeping = 0;
  size_t backup = 0;
  EXPECT_EQ(Asleep(weights, &sleeping, &backup), 1);
  EXPECT_EQ(sleeping, 4 * kMiB);
  EXPECT_EQ(backup, 4 * kMiB);
  EXPECT_EQ(Asleep(kv), 0);
  // Allocations routed to the sleeping pool are refused; frees into it are not.
  uint64_t route = 0;
  ASSERT_EQ(graphalloc_begin_allocate_to_pool_for_thread(0, weights, &route), GRAPHALLOC_OK);
  void* refused = nullptr;
  EXPECT_EQ(graphalloc_malloc(&refused, kMiB, 0, nullptr), GRAPHALLOC_FAILED_PRECONDITION);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("(tag 'weights') is asleep"));
  EXPECT_EQ(graphalloc_end_route(route), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_wake(0, "weights"), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(Asleep(weights, &sleeping, &backup), 0);
  EXPECT_EQ(sleeping, 0u);
  EXPECT_EQ(backup, 4 * kMiB);  // the pinned buffer, kept for the next backed-up sleep
  EXPECT_EQ(Read(w, 4 * kMiB), std::vector<std::uint8_t>(4 * kMiB, 0x3c));
  ASSERT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
  EXPECT_EQ(Asleep(weights, &sleeping, &backup), 0);
  EXPECT_EQ(backup, 0u);
  EXPECT_EQ(graphalloc_free(w, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_free(k, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_release(0, weights), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_release(0, kv), GRAPHALLOC_OK);
}

TEST_F(CApiSleepTest, OnePoolAndTheDefaultPoolSleepAndWakeByIdAndTheWholeAllocatorByNullTag) {
  const uint64_t pool = NewPool(nullptr);
  void* p = MallocIn(pool, 2 * kMiB);
  void* d = MallocIn(0, 2 * kMiB);
  Fill(d, 2 * kMiB, 0x77);
  ASSERT_EQ(graphalloc_pool_sleep(0, pool, /*backup=*/0), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(Asleep(pool), 1);
  EXPECT_EQ(Asleep(0), 0);
  ASSERT_EQ(graphalloc_pool_wake(0, pool), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(Asleep(pool), 0);
  ASSERT_EQ(graphalloc_pool_sleep(0, 0, /*backup=*/1), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(Asleep(0), 1);
  void* refused = nullptr;
  EXPECT_EQ(graphalloc_malloc(&refused, kMiB, 0, nullptr), GRAPHALLOC_FAILED_PRECONDITION);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("the default pool is asleep"));
  ASSERT_EQ(graphalloc_sleep(0, nullptr, /*backup=*/0), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(Asleep(pool), 1);
  ASSERT_EQ(graphalloc_wake(0, nullptr), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(Asleep(0), 0);
  EXPECT_EQ(Asleep(pool), 0);
  EXPECT_EQ(Read(d, 2 * kMiB), std::vector<std::uint8_t>(2 * kMiB, 0x77));  // the default pool's backup
  EXPECT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_free(d, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
}

TEST_F(CApiSleepTest, UnknownTagsAndPoolsAreInvalidArguments) {
  EXPECT_EQ(graphalloc_sleep(0, "no-such-tag", 0), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(graphalloc_last_error()), "graphalloc_sleep: no pool has the tag 'no-such-tag'");
  EXPECT_EQ(graphalloc_wake(0, "no-such-tag"), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_pool_sleep(0, 999999, 1), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(graphalloc_last_error()),
            "graphalloc_pool_sleep: private pool 999999 does not exist");
  EXPECT_EQ(graphalloc_pool_wake(0, 999999), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_pool_sleep_state(0, 999999, nullptr, nullptr, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  uint64_t pool = 0;
  EXPECT_EQ(graphalloc_pool_create_with_tag(0, nullptr, "t", nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(pool, 0u);
}

}  // namespace
}  // namespace graphalloc
