// Sleep and wake on either device (the simulated one in every run, the GPU with `ctest -L gpu`): a
// weights-like pool backed up and a cache-like pool discarded, twenty cycles at unchanged addresses, and a
// graph captured before the first sleep replaying after every wake. What only the simulated device can show
// (outstanding driver objects, injected failures) is in sleep_wake_test.cc.
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/device_memory.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr int kCycles = 20;

class SleepWakeDeviceTest : public testing::AllocatorFixture {
 protected:
  void SetUp() override {
    Config config;
    config.expandable_segments = true;
    GRAPHALLOC_ALLOCATOR_SETUP(config);
  }
  void TearDown() override {
    pools_.clear();
    AllocatorFixture::TearDown();
  }

  PrivatePool& NewPool(std::string tag) {
    PoolOptions options;
    options.tag = std::move(tag);
    absl::StatusOr<PrivatePool> pool = allocator_->CreatePool(options);
    EXPECT_TRUE(pool.ok()) << pool.status();
    pools_.push_back(*std::move(pool));
    return pools_.back();
  }
  // `bytes` from `pool`, on `stream`, through the calling thread's route.
  DevicePtr AllocIn(const PrivatePool& pool, std::size_t bytes, Stream stream = kDefaultStream) {
    absl::StatusOr<PoolRoute> route =
        allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread());
    EXPECT_TRUE(route.ok()) << route.status();
    if (!route.ok()) return 0;
    const DevicePtr ptr = Alloc(bytes, stream);
    EXPECT_TRUE(route->End().ok());
    return ptr;
  }
  std::uint64_t ReservedOf(const PrivatePool& pool) {
    absl::StatusOr<PoolStats> stats = allocator_->GetPoolStats(pool.id());
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? stats->reserved_bytes : 0;
  }
  std::int64_t Reserved() const { return Stats().reserved_bytes.all().current; }
  static SleepRequest Sleep(SleepScope scope, SleepMode mode) {
    SleepRequest request;
    request.scope = std::move(scope);
    request.mode = mode;
    return request;
  }

  std::deque<PrivatePool> pools_;  // NewPool returns references into it
};

TEST_F(SleepWakeDeviceTest, WeightsBackedUpAndACacheDiscardedKeepTheirAddressesOverTwentyCycles) {
  const PrivatePool& weights = NewPool("weights");
  const PrivatePool& cache = NewPool("kv-cache");
  const std::size_t w1_size = 2 * kMiB, w2_size = 6 * kMiB + 4096, cache_size = 8 * kMiB;
  const DevicePtr w1 = AllocIn(weights, w1_size);
  const DevicePtr w2 = AllocIn(weights, w2_size);
  const DevicePtr kv = AllocIn(cache, cache_size);
  ASSERT_OK(testing::FillPattern(*driver_, w1, w1_size, 1));
  ASSERT_OK(testing::FillPattern(*driver_, w2, w2_size, 2));
  ASSERT_OK(testing::FillPattern(*driver_, kv, cache_size, 3));
  const std::uint64_t weights_reserved = ReservedOf(weights);
  const std::uint64_t cache_reserved = ReservedOf(cache);
  ASSERT_GE(weights_reserved, w1_size + w2_size);
  ASSERT_GE(cache_reserved, cache_size);
  const std::int64_t reserved = Reserved();

  for (int cycle = 1; cycle <= kCycles; ++cycle) {
    SCOPED_TRACE(cycle);
    ASSERT_OK_AND_ASSIGN(const SleepResult backed,
                         allocator_->Sleep(Sleep(SleepScope::Tag("weights"), SleepMode::kBackup)));
    EXPECT_EQ(backed.bytes_released, weights_reserved);
    EXPECT_EQ(backed.pools, std::vector<PoolId>{weights.id()});
    ASSERT_OK_AND_ASSIGN(const SleepResult discarded,
                         allocator_->Sleep(Sleep(SleepScope::Pool(cache.id()), SleepMode::kDiscard)));
    EXPECT_EQ(discarded.bytes_released, cache_reserved);
    EXPECT_EQ(discarded.bytes_backed_up, 0u);
    ExpectInvariants();
    EXPECT_EQ(Reserved(), reserved - static_cast<std::int64_t>(weights_reserved + cache_reserved));
    EXPECT_EQ(ReservedOf(weights), 0u);

    ASSERT_OK(allocator_->Wake(WakeRequest{.scope = SleepScope::Tag("weights")}).status());
    ASSERT_OK(allocator_->Wake(WakeRequest{.scope = SleepScope::Pool(cache.id())}).status());
    ExpectInvariants();
    EXPECT_EQ(Reserved(), reserved);
    ASSERT_OK(testing::CheckPattern(*driver_, w1, w1_size, 1));
    ASSERT_OK(testing::CheckPattern(*driver_, w2, w2_size, 2));
    // The cache's contents are gone; its blocks are usable at the same addresses.
    ASSERT_OK(testing::FillPattern(*driver_, kv, cache_size, 100 + cycle));
    ASSERT_OK(testing::CheckPattern(*driver_, kv, cache_size, 100 + cycle));
  }
  FreeOk(w1);
  FreeOk(w2);
  FreeOk(kv);
}

TEST_F(SleepWakeDeviceTest, AGraphCapturedBeforeTheFirstSleepReplaysAfterEveryWake) {
  const PrivatePool& pool = NewPool("graph");
  const Stream s = NewStream();
  const std::size_t size = 2 * kMiB;
  const DevicePtr input = AllocIn(pool, size, s);  // a static input, backed up across each sleep
  ASSERT_OK(testing::FillPattern(*driver_, input, size, 11));

  ASSERT_OK(driver_->BeginCapture(s, CaptureMode::kGlobal));
  DevicePtr output = 0;
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute capture,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCaptureOf(s)));
    ASSERT_OK_AND_ASSIGN(output, allocator_->Allocate(size, s));
    ASSERT_OK(driver_->CopyAsync(output, input, size, s));
    ASSERT_OK(capture.End());
  }
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver_->EndCapture(s));
  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pool));
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver_->GraphInstantiate(graph));

  for (int cycle = 1; cycle <= kCycles; ++cycle) {
    SCOPED_TRACE(cycle);
    ASSERT_OK(allocator_->Sleep(Sleep(SleepScope::Pool(pool.id()), SleepMode::kBackup)).status());
    ExpectInvariants();
    ASSERT_OK(allocator_->Wake(WakeRequest{.scope = SleepScope::Pool(pool.id())}).status());
    ExpectInvariants();
    // Clear the output first, so that only the replay's copy can put the pattern there.
    ASSERT_OK(driver_->MemsetAsync(output, 0, size, s));
    ASSERT_OK(driver_->GraphLaunch(exec, s));
    ASSERT_OK(driver_->StreamSynchronize(s));
    ASSERT_OK(testing::CheckPattern(*driver_, output, size, 11));
  }
  ASSERT_OK(driver_->GraphExecDestroy(exec));
  ASSERT_OK(driver_->GraphDestroy(graph));
  pin.Reset();
  FreeOk(output);
  FreeOk(input);
}

}  // namespace
}  // namespace graphalloc
