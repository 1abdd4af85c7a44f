// Predicate routes (PoolRouteFilter::ForPredicate), on the simulated device and (label `gpu`) the real one:
// the rule a caller such as PyTorch hands over as an opaque function, capture mode from before the capture
// begins (PyTorch opens its route, then begins the capture), and the guarantee that the predicate is never
// called once its route's End() has returned.
#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;

class PoolPredicateRouteTest : public AllocatorFixture {
 protected:
  PoolStats PoolStatsOf(const PrivatePool& pool) {
    absl::StatusOr<PoolStats> s = allocator_->GetPoolStats(pool.id());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : PoolStats{};
  }
};

TEST_F(PoolPredicateRouteTest, SendsTheStreamsThePredicateAccepts) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s1 = NewStream();
  const Stream s2 = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  std::atomic<int> calls{0};
  ASSERT_OK_AND_ASSIGN(PoolRoute route, allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForPredicate(
                                                                                  [&](Stream s) {
                                                                                    ++calls;
                                                                                    return s == s1;
                                                                                  },
                                                                                  /*capture_mode=*/false)));
  const DevicePtr in_pool = Alloc(kMiB, s1);
  const DevicePtr outside = Alloc(kMiB, s2);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 1u);
  EXPECT_EQ(PoolStatsOf(pool).use_count, 2);  // the route is a user
  // Not in capture mode: the default pool's cache can still be emptied.
  ASSERT_OK(allocator_->EmptyCache());
  ASSERT_OK(route.End());
  const DevicePtr after = Alloc(kMiB, s1);
  EXPECT_EQ(calls.load(), 2);  // no route, no call
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 1u);
  for (DevicePtr p : {in_pool, outside, after}) FreeOk(p);
}

TEST_F(PoolPredicateRouteTest, EmptyPredicateIsRefused) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  EXPECT_TRUE(absl::IsInvalidArgument(
      allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForPredicate(nullptr, false)).status()));
  EXPECT_EQ(PoolStatsOf(pool).use_count, 1);
}

TEST_F(PoolPredicateRouteTest, ThrowingPredicateCountsAsNoMatch) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(
                           pool, PoolRouteFilter::ForPredicate(
                                     [](Stream) -> bool { throw std::runtime_error("no"); }, false)));
  const DevicePtr p = Alloc(4096);
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 0u);
  FreeOk(p);
}

// PyTorch's order: the route opens (in capture mode) before the capture begins, with a predicate that
// compares a stream's capture id with the one the capture gets once it has begun.
TEST_F(PoolPredicateRouteTest, CaptureModeRouteOpenedBeforeTheCaptureBegins) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  const Stream other = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  // A default-pool block used on `other` too: freeing it during the capture must not record an event.
  const DevicePtr shared = Alloc(kMiB, other);
  ASSERT_OK(allocator_->RecordStream(shared, s));
  std::atomic<std::uint64_t> capture_id{0};
  auto same_capture = [&](Stream stream) {
    absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(stream);
    return info.ok() && info->status == CaptureStatus::kActive && capture_id.load() != 0 &&
           info->id == capture_id.load();
  };
  ASSERT_OK_AND_ASSIGN(PoolRoute route, allocator_->BeginAllocateToPool(
                                            pool, PoolRouteFilter::ForPredicate(same_capture, true)));
  // Capture mode from now on, although nothing captures yet.
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->EmptyCache()));
  ASSERT_OK(driver_->BeginCapture(s, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(const CaptureInfo info, driver_->GetCaptureInfo(s));
  capture_id = info.id;
  ASSERT_OK_AND_ASSIGN(const DevicePtr out, allocator_->Allocate(kMiB, s));
  ASSERT_OK(driver_->MemsetAsync(out, 0x3c, kMiB, s));
  ASSERT_OK(allocator_->Free(shared));  // deferred, not an event recorded into the capture
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver_->EndCapture(s));
  ASSERT_OK(route.End());
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 1u);
  EXPECT_EQ(PoolStatsOf(pool).allocated_bytes, kMiB);
  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pool));
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver_->GraphInstantiate(graph));
  ASSERT_OK(driver_->MemsetAsync(out, 0, kMiB, s));
  ASSERT_OK(driver_->GraphLaunch(exec, s));
  ASSERT_OK(driver_->StreamSynchronize(s));
  std::vector<std::uint8_t> host(kMiB);
  ASSERT_OK(driver_->CopyDeviceToHost(host.data(), out, kMiB));
  EXPECT_EQ(host, std::vector<std::uint8_t>(kMiB, 0x3c));
  ASSERT_OK(driver_->GraphExecDestroy(exec));
  ASSERT_OK(driver_->GraphDestroy(graph));
  ASSERT_OK(allocator_->EmptyCache());  // capture mode is over
  FreeOk(out);
}

// The predicate may refer to objects its owner destroys right after End() returns: no call may follow.
TEST_F(PoolPredicateRouteTest, PredicateIsNeverCalledAfterEndReturns) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::atomic<bool> stop{false};
  std::atomic<int> late_calls{0};
  std::vector<std::thread> threads;
  std::vector<Stream> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(NewStream());
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, stream = streams[t]] {
      while (!stop.load()) {
        absl::StatusOr<DevicePtr> p = allocator_->Allocate(4096, stream);
        if (p.ok()) (void)allocator_->Free(*p);
      }
    });
  }
  for (int round = 0; round < kRounds; ++round) {
    std::atomic<bool> ended{false};
    // A call that starts, or is still running, once End() has returned is late: the yield widens the window.
    auto predicate = [&](Stream) {
      if (ended.load()) ++late_calls;
      std::this_thread::yield();
      if (ended.load()) ++late_calls;
      return round % 2 == 0;
    };
    absl::StatusOr<PoolRoute> route =
        allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForPredicate(predicate, false));
    ASSERT_TRUE(route.ok()) << route.status();
    std::this_thread::yield();
    ASSERT_OK(route->End());
    ended = true;
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(late_calls.load(), 0);
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 0u);
  ExpectInvariants();
}

}  // namespace
}  // namespace graphalloc
