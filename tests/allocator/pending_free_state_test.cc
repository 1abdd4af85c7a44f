// A block freed while other streams still use it (RecordStream) is not allocated from the moment it is
// freed, as in PyTorch's allocator: the statistics count it freed and still active, snapshots show it
// pending free, and PyTorch's checkPoolLiveAllocations (which reads the same state) does not find it. That
// holds while its stream events are being recorded (a window that other threads see: NCCL's watchdog frees
// tensors recorded on its stream while graph trees check their pools) and all the while a capture defers its
// events; a second Free is still refused, and the block is reused only once those streams are done.
#include <functional>

#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/forwarding_driver.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

// Calls `on_record` before each event record: the moment a free of a block used elsewhere has let go of
// the shard's lock and records its events.
class RecordHookDriver : public ForwardingDriver {
 public:
  using ForwardingDriver::ForwardingDriver;
  absl::Status EventRecord(Event event, Stream stream) override {
    if (on_record) on_record();
    return ForwardingDriver::EventRecord(event, stream);
  }
  std::function<void()> on_record;
};

class PendingFreeStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SimDriverOptions sim;
    sim.manual_completion = true;  // streams run only when told: the side stream's work stays queued
    absl::StatusOr<std::unique_ptr<SimDriver>> made = SimDriver::Create(sim);
    ASSERT_TRUE(made.ok());
    sim_ = std::move(*made);
    driver_ = std::make_shared<RecordHookDriver>(sim_);
    absl::StatusOr<std::unique_ptr<CachingAllocator>> a = CachingAllocator::Create(driver_, Config{});
    ASSERT_TRUE(a.ok());
    allocator_ = std::move(*a);
    absl::StatusOr<Stream> side = driver_->StreamCreate();
    ASSERT_TRUE(side.ok());
    side_ = *side;
  }
  void TearDown() override {
    if (allocator_ != nullptr) {
      ASSERT_TRUE(allocator_->EmptyCache().ok());
      ASSERT_TRUE(allocator_->CheckInvariants().ok());
    }
    allocator_.reset();
    if (driver_ != nullptr) (void)driver_->StreamDestroy(side_);
  }
  // The state a snapshot shows for the block at `ptr` (its requested size into `requested`).
  BlockState StateOf(DevicePtr ptr, std::uint64_t* requested = nullptr) {
    for (const SegmentSnapshot& seg : allocator_->StateSnapshot().segments) {
      for (const BlockSnapshot& b : seg.blocks) {
        if (b.address != ptr) continue;
        if (requested != nullptr) *requested = b.requested_size;
        return b.state;
      }
    }
    ADD_FAILURE() << "no block at 0x" << std::hex << ptr;
    return BlockState::kFree;
  }

  std::shared_ptr<SimDriver> sim_;
  std::shared_ptr<RecordHookDriver> driver_;
  std::unique_ptr<CachingAllocator> allocator_;
  Stream side_ = kDefaultStream;
};

TEST_F(PendingFreeStateTest, WhileItsEventsAreRecordedTheBlockIsFreedAndActive) {
  const DevicePtr x = *allocator_->Allocate(4 * kMiB);
  ASSERT_TRUE(driver_->LaunchHostFunction(side_, [] {}).ok());  // work the free's event waits for
  ASSERT_TRUE(allocator_->RecordStream(x, side_).ok());
  int seen = 0;
  driver_->on_record = [&] {
    // What another thread would see now: freed, still active, pending free.
    const DeviceStats s = allocator_->GetStats();
    EXPECT_EQ(s.allocation.all().current, 0);
    EXPECT_EQ(s.allocated_bytes.all().current, 0);
    EXPECT_EQ(s.requested_bytes.all().current, 0);
    EXPECT_EQ(s.active.all().current, 1);
    EXPECT_EQ(s.active_bytes.all().current, 4 * kMiB);
    std::uint64_t requested = 1;
    EXPECT_EQ(StateOf(x, &requested), BlockState::kPendingFree);
    EXPECT_EQ(requested, 0u);
    EXPECT_TRUE(allocator_->CheckInvariants().ok()) << allocator_->CheckInvariants();
    ++seen;
  };
  ASSERT_TRUE(allocator_->Free(x).ok());
  driver_->on_record = nullptr;
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(StateOf(x), BlockState::kPendingFree);
  EXPECT_NE(*allocator_->Allocate(4 * kMiB), x);  // not reused while the side stream has not passed it
  ASSERT_TRUE(allocator_->CheckInvariants().ok());
}

TEST_F(PendingFreeStateTest, AFreeACaptureDefersIsFreedAtOnceAndReusedOnlyAfterItsStreams) {
  absl::StatusOr<PrivatePool> pool = allocator_->CreatePool();
  ASSERT_TRUE(pool.ok());
  absl::StatusOr<Stream> capture = driver_->StreamCreate();
  ASSERT_TRUE(capture.ok());
  ASSERT_TRUE(driver_->BeginCapture(*capture, CaptureMode::kThreadLocal).ok());
  DevicePtr x = 0;
  {
    absl::StatusOr<PoolRoute> route =
        allocator_->BeginAllocateToPool(*pool, PoolRouteFilter::ForCaptureOf(*capture));
    ASSERT_TRUE(route.ok()) << route.status();
    x = *allocator_->Allocate(2 * kMiB, *capture);
    ASSERT_TRUE(allocator_->RecordStream(x, side_).ok());
    const DeviceStats before = allocator_->GetStats();
    ASSERT_TRUE(allocator_->Free(x).ok());  // deferred: no event may be recorded into the capture
    const DeviceStats after = allocator_->GetStats();
    EXPECT_EQ(after.allocation.all().current, before.allocation.all().current - 1);
    EXPECT_EQ(after.allocated_bytes.all().current, before.allocated_bytes.all().current - 2 * kMiB);
    EXPECT_EQ(after.active.all().current, before.active.all().current);
    EXPECT_EQ(StateOf(x), BlockState::kPendingFree);
    absl::StatusOr<PoolStats> stats = allocator_->GetPoolStats(pool->id());
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->allocated_bytes, 0u);
    EXPECT_EQ(stats->live_blocks, 1u);                          // still the pool's until its free completes
    EXPECT_TRUE(absl::IsInvalidArgument(allocator_->Free(x)));  // a second free is still a double free
    EXPECT_TRUE(allocator_->CheckInvariants().ok()) << allocator_->CheckInvariants();
    absl::StatusOr<Graph> graph = driver_->EndCapture(*capture);
    ASSERT_TRUE(graph.ok());
    ASSERT_TRUE(driver_->GraphDestroy(*graph).ok());
  }  // the route ends: the deferred free records its event now
  EXPECT_EQ(StateOf(x), BlockState::kPendingFree);
  ASSERT_TRUE(allocator_->CheckInvariants().ok()) << allocator_->CheckInvariants();
  ASSERT_TRUE(sim_->DeviceSynchronize().ok());  // the side stream passes the free
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(allocator_->GetStats().active.all().current, 0);
  (void)driver_->StreamDestroy(*capture);
}

}  // namespace
}  // namespace graphalloc
