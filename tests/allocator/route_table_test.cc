// The route table and the capture tracker on their own: which pool an allocation is routed to (innermost
// matching route, by stream, thread, capture or predicate), what closing a route reports, that a predicate
// is never called after its route closed, and frees deferred while a capture is underway.
#include "graphalloc/allocator/core/route_table.h"

#include <atomic>
#include <memory>
#include <thread>

#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

class RouteTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SimDriver>> driver = SimDriver::Create();
    ASSERT_TRUE(driver.ok()) << driver.status();
    driver_ = std::move(*driver);
    captures_ = std::make_unique<CaptureTracker>(*driver_);
  }
  Stream NewStream() {
    absl::StatusOr<Stream> s = driver_->StreamCreate();
    EXPECT_TRUE(s.ok());
    return *s;
  }

  std::unique_ptr<SimDriver> driver_;
  std::unique_ptr<CaptureTracker> captures_;
  RouteTable routes_;
};

TEST_F(RouteTableTest, InnermostMatchingRouteWins) {
  const Stream a = NewStream();
  const Stream b = NewStream();
  EXPECT_FALSE(routes_.any_open());
  EXPECT_EQ(routes_.Route(a, *driver_), kDefaultPool);
  const std::uint64_t outer = routes_.Open(1, PoolRouteFilter::ForCallingThread());
  const std::uint64_t inner = routes_.Open(2, PoolRouteFilter::ForStream(a));
  EXPECT_TRUE(routes_.any_open());
  EXPECT_EQ(routes_.Route(a, *driver_), 2u);
  EXPECT_EQ(routes_.Route(b, *driver_), 1u);
  // Another thread matches only the stream route.
  PoolId elsewhere_a = 0, elsewhere_b = 0;
  std::thread([&] {
    elsewhere_a = routes_.Route(a, *driver_);
    elsewhere_b = routes_.Route(b, *driver_);
  }).join();
  EXPECT_EQ(elsewhere_a, 2u);
  EXPECT_EQ(elsewhere_b, kDefaultPool);
  std::optional<RouteTable::Closed> closed = routes_.Close(inner, *captures_);
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->pool, 2u);
  EXPECT_FALSE(closed->captures_over);
  EXPECT_EQ(routes_.Route(a, *driver_), 1u);
  EXPECT_FALSE(routes_.Close(inner, *captures_).has_value());  // closed already
  ASSERT_TRUE(routes_.Close(outer, *captures_).has_value());
  EXPECT_FALSE(routes_.any_open());
}

TEST_F(RouteTableTest, CaptureRoutesMatchEveryStreamOfTheCaptureAndEndIt) {
  const Stream s = NewStream();
  ASSERT_TRUE(driver_->BeginCapture(s, CaptureMode::kRelaxed).ok());
  absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(s);
  ASSERT_TRUE(info.ok());
  PoolRouteFilter filter = PoolRouteFilter::ForCaptureOf(s);
  filter.capture_id = info->id;
  captures_->Begin();
  const std::uint64_t id = routes_.Open(7, filter);
  EXPECT_TRUE(captures_->underway());
  EXPECT_EQ(routes_.Route(s, *driver_), 7u);
  EXPECT_EQ(routes_.Route(NewStream(), *driver_), kDefaultPool);  // not capturing
  std::optional<RouteTable::Closed> closed = routes_.Close(id, *captures_);
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(closed->captures_over);
  EXPECT_FALSE(captures_->underway());
  ASSERT_TRUE(driver_->EndCapture(s).ok());
}

TEST_F(RouteTableTest, PredicatesAreAskedUnlockedAndNeverAfterClose) {
  const Stream s = NewStream();
  std::atomic<int> calls{0};
  auto alive = std::make_shared<bool>(true);
  const std::uint64_t id = routes_.Open(3, PoolRouteFilter::ForPredicate(
                                               [&calls, alive, s](Stream stream) {
                                                 EXPECT_TRUE(*alive);
                                                 ++calls;
                                                 return stream == s;
                                               },
                                               /*capture_mode=*/false));
  EXPECT_EQ(routes_.Route(s, *driver_), 3u);
  EXPECT_EQ(routes_.Route(NewStream(), *driver_), kDefaultPool);
  EXPECT_EQ(calls.load(), 2);
  ASSERT_TRUE(routes_.Close(id, *captures_).has_value());
  *alive = false;
  EXPECT_EQ(routes_.Route(s, *driver_), kDefaultPool);
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(RouteTableTest, AThrowingPredicateDoesNotMatch) {
  const Stream s = NewStream();
  routes_.Open(4, PoolRouteFilter::ForPredicate([](Stream) -> bool { throw 1; }, false));
  EXPECT_EQ(routes_.Route(s, *driver_), kDefaultPool);
}

TEST_F(RouteTableTest, FreesAreDeferredOnlyWhileACaptureIsUnderway) {
  auto* shard = reinterpret_cast<StreamShard*>(0x1000);
  Block block;
  EXPECT_FALSE(routes_.DeferWhileCapturing(shard, &block, *captures_));
  captures_->Begin();
  EXPECT_TRUE(routes_.DeferWhileCapturing(shard, &block, *captures_));
  EXPECT_TRUE(routes_.TakeDeferredFrees(*captures_).empty());  // still capturing: kept
  EXPECT_TRUE(captures_->End());
  std::vector<RouteTable::DeferredFree> frees = routes_.TakeDeferredFrees(*captures_);
  ASSERT_EQ(frees.size(), 1u);
  EXPECT_EQ(frees[0].first, shard);
  EXPECT_EQ(frees[0].second, &block);
  EXPECT_TRUE(routes_.TakeDeferredFrees(*captures_).empty());
  routes_.Defer(shard, &block);
  EXPECT_EQ(routes_.TakeDeferredFrees(*captures_).size(), 1u);
}

TEST_F(RouteTableTest, NoSynchronizationWhileACaptureIsUnderway) {
  const Stream s = NewStream();
  {
    MutexLock gate(&captures_->gate());
    EXPECT_TRUE(captures_->WaitForWorkBeforeUnmap(s).ok());
    EXPECT_TRUE(captures_->WaitForWorkBeforeUnmap(std::nullopt).ok());
  }
  captures_->Begin();
  {
    MutexLock gate(&captures_->gate());
    EXPECT_TRUE(absl::IsAborted(captures_->WaitForWorkBeforeUnmap(s)));
  }
  EXPECT_TRUE(captures_->End());
}

}  // namespace
}  // namespace graphalloc
