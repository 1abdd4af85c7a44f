// Cross-stream reuse: a block recorded on another stream is reused only after that stream's work up to
// the Free() has completed.
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/stream_gate.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;
using testing::StreamGate;

class StreamEventsTest : public AllocatorFixture {
 protected:
  void SetUpAllocator() {
    SimDriverOptions sim;
    sim.manual_completion = true;
    MakeAllocator(Config{}, sim);
  }
};

TEST_F(StreamEventsTest, BlockUsedOnAnotherStreamWaitsForThatStream) {
  SetUpAllocator();
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  Stream side = NewStream();
  DevicePtr a = Alloc(4096);
  StreamGate gate(*driver_, side);
  ASSERT_TRUE(allocator_->RecordStream(a, side).ok());
  FreeOk(a);
  // The side stream has not reached the free yet: the block is still active and not reusable.
  EXPECT_EQ(Stats().active.all().current, 1);
  EXPECT_EQ(Stats().allocation.all().current, 0);
  DevicePtr b = Alloc(4096);
  EXPECT_NE(b, a);
  gate.Open();
  DevicePtr c = Alloc(4096);  // events are processed at the next allocation
  EXPECT_EQ(c, a);
  EXPECT_EQ(Stats().active.all().current, 2);
  FreeOk(b);
  FreeOk(c);
}

TEST_F(StreamEventsTest, RecordingTheAllocationStreamItselfIsANoOp) {
  SetUpAllocator();
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  DevicePtr a = Alloc(4096);
  ASSERT_TRUE(allocator_->RecordStream(a, kDefaultStream).ok());
  FreeOk(a);
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_EQ(Alloc(4096), a);
  FreeOk(a);
}

TEST_F(StreamEventsTest, EmptyCacheWaitsForEventsAndReleasesTheBlock) {
  SetUpAllocator();
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  Stream side = NewStream();
  DevicePtr a = Alloc(30 * kMiB);
  ASSERT_TRUE(driver_->LaunchHostFunction(side, [] {}).ok());  // work the free's event must wait for
  ASSERT_TRUE(allocator_->RecordStream(a, side).ok());
  ASSERT_TRUE(allocator_->RecordStream(a, side).ok());  // recorded twice: still one event
  FreeOk(a);
  EXPECT_EQ(Stats().active.all().current, 1);
  if (SimDriver* sim = testing::AsSim(driver_.get())) {
    // EventSynchronize drives the simulated stream, as a GPU would make progress.
    EXPECT_GE(sim->Counters().pending_work, 1u);  // the closure is still queued
  }
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  ExpectInvariants();
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(Stats().num_sync_all_streams, 1);
}

TEST_F(StreamEventsTest, BlockUsedOnTwoStreamsWaitsForBoth) {
  SetUpAllocator();
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  Stream s1 = NewStream();
  Stream s2 = NewStream();
  DevicePtr a = Alloc(4096);
  StreamGate gate1(*driver_, s1);
  ASSERT_TRUE(allocator_->RecordStream(a, s1).ok());
  ASSERT_TRUE(allocator_->RecordStream(a, s2).ok());
  FreeOk(a);
  if (testing::AsSim(driver_.get()) != nullptr) {
    // Only s2 completes; on the simulated device the gate holds every stream, so run s2 alone.
    testing::AsSim(driver_.get())->RunPendingWork(s2);
  } else {
    ASSERT_TRUE(driver_->StreamSynchronize(s2).ok());
  }
  DevicePtr b = Alloc(4096);
  EXPECT_NE(b, a);
  gate1.Open();
  DevicePtr c = Alloc(4096);
  EXPECT_EQ(c, a);
  FreeOk(b);
  FreeOk(c);
}

TEST_F(StreamEventsTest, RecordStreamOnAStreamTheDeviceDoesNotKnowIsRefused) {
  SetUpAllocator();
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  // A made-up handle is undefined behaviour for the real driver; the simulated one reports it.
  if (testing::AsSim(driver_.get()) == nullptr) GTEST_SKIP() << "needs the simulated device";
  DevicePtr a = Alloc(4096);
  const Stream unknown{0x7e57};
  absl::Status s = allocator_->RecordStream(a, unknown);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr(absl::StrFormat(
                               "RecordStream(0x%x): stream 0x7e57 is not a stream of device 0", a)));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("CUDA_ERROR_INVALID_HANDLE"));
  ExpectInvariants();
  // Nothing was recorded: the free needs no event, and the block is reusable at once.
  FreeOk(a);
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_EQ(Alloc(4096), a);
  FreeOk(a);
}

TEST_F(StreamEventsTest, FreeAfterTheRecordedStreamWasDestroyedSynchronizesAndFreesTheBlock) {
  SetUpAllocator();
  if (driver_ == nullptr) GTEST_SKIP() << skip_reason_;
  // Recording an event on a destroyed stream is undefined behaviour for the real driver.
  if (testing::AsSim(driver_.get()) == nullptr) GTEST_SKIP() << "needs the simulated device";
  absl::StatusOr<Stream> side = driver_->StreamCreate();  // not NewStream(): this test destroys it
  ASSERT_TRUE(side.ok()) << side.status();
  DevicePtr a = Alloc(4096);
  bool side_work_done = false;
  ASSERT_TRUE(driver_->LaunchHostFunction(*side, [&] { side_work_done = true; }).ok());
  ASSERT_TRUE(allocator_->RecordStream(a, *side).ok());
  ASSERT_TRUE(driver_->StreamDestroy(*side).ok());  // its queued work still runs, as on a GPU
  // The free cannot record an event on the destroyed stream: it waits for the device instead (so the
  // work still queued there finishes first), and the block is freed, not left allocated for good.
  FreeOk(a);
  EXPECT_TRUE(side_work_done);
  EXPECT_EQ(Stats().allocation.all().current, 0);
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_EQ(Alloc(4096), a);
  FreeOk(a);
}

}  // namespace
}  // namespace graphalloc
