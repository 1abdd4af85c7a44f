// The C ABI of private pools, through the process-wide allocators: references, routes by stream, thread,
// capture and predicate, per-pool statistics and cache, graph pins, and a whole capture and replay driven
// through the C functions (on the simulated device, and on the real one under the `gpu` label).
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/device/driver.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kBytes = std::size_t{1} << 20;

class CApiPoolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip;
    driver_ = testing::DefaultAllocatorDriver(&skip);
    if (driver_ == nullptr) GTEST_SKIP() << skip;
  }
  void TearDown() override {
    for (Stream s : streams_) EXPECT_OK(driver_->StreamDestroy(s));
    testing::ExpectDefaultAllocatorsHoldNothing();
  }

  graphalloc_stream NewStream() {
    absl::StatusOr<Stream> s = driver_->StreamCreate();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    streams_.push_back(*s);
    return Native(*s);
  }
  static graphalloc_stream Native(Stream s) { return static_cast<graphalloc_stream>(NativeFromStream(s)); }

  graphalloc_pool_stats PoolStats(uint64_t pool) {
    graphalloc_pool_stats stats{};
    EXPECT_EQ(graphalloc_pool_get_stats(0, pool, &stats), GRAPHALLOC_OK) << graphalloc_last_error();
    return stats;
  }
  uint64_t NewPool(graphalloc_pool_options options = {}) {
    uint64_t pool = 0;
    EXPECT_EQ(graphalloc_pool_create(0, &options, &pool), GRAPHALLOC_OK) << graphalloc_last_error();
    return pool;
  }
  void* Malloc(size_t size, graphalloc_stream stream) {
    void* p = nullptr;
    EXPECT_EQ(graphalloc_malloc(&p, size, 0, stream), GRAPHALLOC_OK) << graphalloc_last_error();
    return p;
  }
  std::vector<std::uint8_t> Read(void* p, std::size_t n) {
    std::vector<std::uint8_t> out(n);
    EXPECT_OK(driver_->CopyDeviceToHost(out.data(), reinterpret_cast<DevicePtr>(p), n));
    return out;
  }

  Driver* driver_ = nullptr;
  std::vector<Stream> streams_;
};

TEST_F(CApiPoolsTest, ReferencesCountUsersAndTheLastReleaseEndsThePool) {
  uint64_t pool = 0;
  ASSERT_EQ(graphalloc_pool_create(0, nullptr, &pool), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_NE(pool, 0u);
  EXPECT_EQ(PoolStats(pool).use_count, 1);
  ASSERT_EQ(graphalloc_pool_retain(0, pool), GRAPHALLOC_OK) << graphalloc_last_error();
  EXPECT_EQ(PoolStats(pool).use_count, 2);
  ASSERT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
  EXPECT_EQ(PoolStats(pool).use_count, 1);
  ASSERT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
  graphalloc_pool_stats stats{};
  EXPECT_EQ(graphalloc_pool_get_stats(0, pool, &stats), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("does not exist"));
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("no reference to pool"));
  EXPECT_EQ(graphalloc_pool_retain(0, pool), GRAPHALLOC_INVALID_ARGUMENT);
}

TEST_F(CApiPoolsTest, StreamRouteSendsOnlyThatStreamToThePool) {
  const graphalloc_stream s1 = NewStream();
  const graphalloc_stream s2 = NewStream();
  const uint64_t pool = NewPool();
  uint64_t route = 0;
  ASSERT_EQ(graphalloc_begin_allocate_to_pool_for_stream(0, pool, s1, &route), GRAPHALLOC_OK)
      << graphalloc_last_error();
  EXPECT_EQ(PoolStats(pool).use_count, 2);  // the route is a user
  void* in_pool = Malloc(3 * kBytes, s1);
  void* outside = Malloc(3 * kBytes, s2);
  ASSERT_EQ(graphalloc_end_route(route), GRAPHALLOC_OK);
  void* after = Malloc(3 * kBytes, s1);
  const graphalloc_pool_stats stats = PoolStats(pool);
  EXPECT_EQ(stats.live_blocks, 1u);
  EXPECT_EQ(stats.allocated_bytes, 3 * kBytes);
  EXPECT_EQ(stats.use_count, 1);
  EXPECT_EQ(graphalloc_end_route(route), GRAPHALLOC_INVALID_ARGUMENT);  // ended once already
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("is not open"));
  for (void* p : {in_pool, outside, after}) EXPECT_EQ(graphalloc_free(p, 0), GRAPHALLOC_OK);
  EXPECT_EQ(PoolStats(pool).peak_allocated_bytes, 3 * kBytes);
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
}

TEST_F(CApiPoolsTest, ThreadRouteSendsOnlyTheCallingThread) {
  const uint64_t pool = NewPool();
  uint64_t route = 0;
  ASSERT_EQ(graphalloc_begin_allocate_to_pool_for_thread(0, pool, &route), GRAPHALLOC_OK);
  void* mine = Malloc(4096, nullptr);
  void* theirs = nullptr;
  std::thread other([&] { theirs = graphalloc_torch_malloc(4096, 0, nullptr); });
  other.join();
  ASSERT_NE(theirs, nullptr);
  EXPECT_EQ(PoolStats(pool).live_blocks, 1u);
  ASSERT_EQ(graphalloc_end_route(route), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_free(mine, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_free(theirs, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
}

// A capture and its replay, every allocator call through the C ABI; the driver only captures and launches.
TEST_F(CApiPoolsTest, CaptureRoutesToThePoolAndReplays) {
  const graphalloc_stream s = NewStream();
  const uint64_t pool = NewPool();
  uint64_t route = 0;
  EXPECT_EQ(graphalloc_begin_allocate_to_pool_for_capture(0, pool, s, &route),
            GRAPHALLOC_FAILED_PRECONDITION);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("is not capturing"));
  const Stream stream = StreamFromNative(s);
  ASSERT_OK(driver_->BeginCapture(stream, CaptureMode::kGlobal));
  ASSERT_EQ(graphalloc_begin_allocate_to_pool_for_capture(0, pool, s, &route), GRAPHALLOC_OK)
      << graphalloc_last_error();
  void* out = Malloc(kBytes, s);
  void* scratch = Malloc(kBytes, s);
  ASSERT_NE(out, nullptr);
  ASSERT_NE(scratch, nullptr);
  ASSERT_OK(driver_->MemsetAsync(reinterpret_cast<DevicePtr>(scratch), 0x6b, kBytes, stream));
  ASSERT_OK(driver_->CopyAsync(reinterpret_cast<DevicePtr>(out), reinterpret_cast<DevicePtr>(scratch), kBytes,
                               stream));
  EXPECT_EQ(graphalloc_free(scratch, 0), GRAPHALLOC_OK);  // freed inside the capture, into the pool
  EXPECT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_FAILED_PRECONDITION);  // capture mode
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver_->EndCapture(stream));
  ASSERT_EQ(graphalloc_end_route(route), GRAPHALLOC_OK) << graphalloc_last_error();
  uint64_t pin = 0;
  ASSERT_EQ(graphalloc_pool_pin_for_graph(0, pool, &pin), GRAPHALLOC_OK) << graphalloc_last_error();
  graphalloc_pool_stats stats = PoolStats(pool);
  EXPECT_EQ(stats.live_blocks, 1u);
  EXPECT_EQ(stats.graph_pins, 1);
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver_->GraphInstantiate(graph));
  ASSERT_OK(driver_->GraphLaunch(exec, stream));
  ASSERT_OK(driver_->StreamSynchronize(stream));
  EXPECT_EQ(Read(out, kBytes), std::vector<std::uint8_t>(kBytes, 0x6b));
  // The graph's memory stays while the pin does, even with no reference and no live block left.
  EXPECT_EQ(graphalloc_free(out, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
  ASSERT_EQ(graphalloc_pool_empty_cache(0, pool), GRAPHALLOC_OK);
  stats = PoolStats(pool);
  EXPECT_EQ(stats.use_count, 0);
  EXPECT_GE(stats.reserved_bytes, 2 * kBytes);
  ASSERT_OK(driver_->GraphLaunch(exec, stream));  // replays into memory that is still the pool's
  ASSERT_OK(driver_->StreamSynchronize(stream));
  ASSERT_OK(driver_->GraphExecDestroy(exec));
  ASSERT_OK(driver_->GraphDestroy(graph));
  ASSERT_EQ(graphalloc_pool_unpin(pin), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_get_stats(0, pool, &stats), GRAPHALLOC_INVALID_ARGUMENT);  // gone with its pin
  EXPECT_EQ(graphalloc_pool_unpin(pin), GRAPHALLOC_INVALID_ARGUMENT);
}

struct CaptureOf {
  Driver* driver;
  std::uint64_t capture_id = 0;  // set once the capture has begun
};

int SameCapture(void* context, graphalloc_stream stream) {
  auto* c = static_cast<CaptureOf*>(context);
  absl::StatusOr<CaptureInfo> info = c->driver->GetCaptureInfo(StreamFromNative(stream));
  return info.ok() && info->status == CaptureStatus::kActive && c->capture_id != 0 &&
         info->id == c->capture_id;
}

// PyTorch's order (the route before the capture), through graphalloc_begin_allocate_to_pool_if.
TEST_F(CApiPoolsTest, PredicateRouteInCaptureModeOpenedBeforeTheCapture) {
  const graphalloc_stream s = NewStream();
  const graphalloc_stream bystander = NewStream();
  const uint64_t pool = NewPool();
  CaptureOf context{driver_};
  uint64_t route = 0;
  ASSERT_EQ(graphalloc_begin_allocate_to_pool_if(0, pool, &SameCapture, &context, /*capture_mode=*/1, &route),
            GRAPHALLOC_OK)
      << graphalloc_last_error();
  EXPECT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_FAILED_PRECONDITION);  // capture mode before the capture
  const Stream stream = StreamFromNative(s);
  ASSERT_OK(driver_->BeginCapture(stream, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(const CaptureInfo info, driver_->GetCaptureInfo(stream));
  context.capture_id = info.id;
  void* in_pool = Malloc(kBytes, s);
  void* outside = Malloc(kBytes, bystander);
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver_->EndCapture(stream));
  ASSERT_EQ(graphalloc_end_route(route), GRAPHALLOC_OK);
  EXPECT_EQ(PoolStats(pool).live_blocks, 1u);
  EXPECT_EQ(graphalloc_empty_cache(0), GRAPHALLOC_OK);
  ASSERT_OK(driver_->GraphDestroy(graph));
  EXPECT_EQ(graphalloc_free(in_pool, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_free(outside, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
}

TEST_F(CApiPoolsTest, NoSplitAndUseOnOomOptionsReachThePool) {
  graphalloc_pool_options options{};
  options.no_split = 1;
  const uint64_t pool = NewPool(options);
  uint64_t route = 0;
  ASSERT_EQ(graphalloc_begin_allocate_to_pool_for_thread(0, pool, &route), GRAPHALLOC_OK);
  void* a = Malloc(512, nullptr);
  void* b = Malloc(512, nullptr);
  ASSERT_EQ(graphalloc_end_route(route), GRAPHALLOC_OK);
  EXPECT_EQ(PoolStats(pool).segments, 2u);  // one each: never split
  EXPECT_EQ(graphalloc_free(a, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_free(b, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
  options = {.use_on_oom = 1, .no_split = 0, .handle_aligned = 0};
  const uint64_t lender = NewPool(options);
  EXPECT_EQ(PoolStats(lender).use_count, 1);
  EXPECT_EQ(graphalloc_pool_release(0, lender), GRAPHALLOC_OK);
}

TEST_F(CApiPoolsTest, HandleAlignedOptionReachesThePool) {
  graphalloc_pool_options options{};
  options.handle_aligned = 1;
  const uint64_t pool = NewPool(options);
  uint64_t route = 0;
  ASSERT_EQ(graphalloc_begin_allocate_to_pool_for_thread(0, pool, &route), GRAPHALLOC_OK);
  // Each 3 MiB block maps a 4 MiB handle of its own; without the option the second would begin in the
  // first one's free 1 MiB and 6 MiB would be reserved.
  void* a = Malloc(3 * kBytes, nullptr);
  void* b = Malloc(3 * kBytes, nullptr);
  ASSERT_EQ(graphalloc_end_route(route), GRAPHALLOC_OK);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b), reinterpret_cast<std::uintptr_t>(a) + 4 * kBytes);
  EXPECT_EQ(PoolStats(pool).reserved_bytes, 8 * kBytes);
  EXPECT_EQ(graphalloc_free(a, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_free(b, 0), GRAPHALLOC_OK);
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
}

TEST_F(CApiPoolsTest, BadArgumentsGetCodesNotCrashes) {
  uint64_t out = 7;
  EXPECT_EQ(graphalloc_pool_create(0, nullptr, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("NULL"));
  EXPECT_EQ(graphalloc_pool_create(-1, nullptr, &out), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(out, 0u);
  EXPECT_EQ(graphalloc_pool_retain(0, 0), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("default pool"));
  EXPECT_EQ(graphalloc_pool_retain(0, ~uint64_t{0}), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_begin_allocate_to_pool_for_thread(0, ~uint64_t{0}, &out), GRAPHALLOC_INVALID_ARGUMENT);
  const uint64_t pool = NewPool();
  EXPECT_EQ(graphalloc_begin_allocate_to_pool_for_thread(0, pool, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_begin_allocate_to_pool_if(0, pool, nullptr, nullptr, 0, &out),
            GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_THAT(graphalloc_last_error(), HasSubstr("predicate is NULL"));
  EXPECT_EQ(graphalloc_end_route(0), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_pool_get_stats(0, pool, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_pool_pin_for_graph(0, pool, nullptr), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_pool_unpin(12345), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(graphalloc_pool_empty_cache(0, ~uint64_t{0}), GRAPHALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(PoolStats(pool).use_count, 1);  // nothing above took or dropped a user
  EXPECT_EQ(graphalloc_pool_release(0, pool), GRAPHALLOC_OK);
}

}  // namespace
}  // namespace graphalloc
