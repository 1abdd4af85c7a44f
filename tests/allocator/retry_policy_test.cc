// The retry ladder (allocator/core/retry_policy.h) as the driver sees it, on the simulated device: the
// driver calls a request makes after the fast path failed, in order. The oversize cache goes before
// everything cached, and everything cached only after waiting for the outstanding events; a refused handle
// gets the handle cache back and one more try; the expandable growth gives up after its passes; the
// out-of-memory report comes after every step and leaves nothing idle.

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/forwarding_driver.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::int64_t MiB = static_cast<std::int64_t>(kMiB);

// Logs the calls that take memory from the device or give it back, the waits for events and the memory
// query of the out-of-memory report, failed ones included. The first `aborted_creates` handle creations
// fail as a growth undone by a capture that began meanwhile does: Aborted, to be planned again.
class CallLogDriver : public ForwardingDriver {
 public:
  using ForwardingDriver::ForwardingDriver;

  absl::StatusOr<DevicePtr> MemAlloc(std::size_t size) override {
    log.push_back("MemAlloc");
    return ForwardingDriver::MemAlloc(size);
  }
  absl::Status MemFree(DevicePtr ptr) override {
    log.push_back("MemFree");
    return ForwardingDriver::MemFree(ptr);
  }
  absl::StatusOr<PhysicalHandle> MemCreate(std::size_t size) override {
    log.push_back("MemCreate");
    if (aborted_creates > 0) {
      --aborted_creates;
      return absl::AbortedError("a capture began during the growth");
    }
    return ForwardingDriver::MemCreate(size);
  }
  absl::Status MemRelease(PhysicalHandle handle) override {
    log.push_back("MemRelease");
    return ForwardingDriver::MemRelease(handle);
  }
  absl::Status MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) override {
    log.push_back("MemMap");
    return ForwardingDriver::MemMap(ptr, size, handle);
  }
  absl::Status MemUnmap(DevicePtr ptr, std::size_t size) override {
    log.push_back("MemUnmap");
    return ForwardingDriver::MemUnmap(ptr, size);
  }
  absl::Status MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers = {}) override {
    log.push_back("MemSetAccess");
    return ForwardingDriver::MemSetAccess(ptr, size, peers);
  }
  absl::StatusOr<DevicePtr> AddressReserve(std::size_t size, std::size_t alignment = 0) override {
    log.push_back("AddressReserve");
    return ForwardingDriver::AddressReserve(size, alignment);
  }
  absl::Status EventSynchronize(Event event) override {
    log.push_back("EventSynchronize");
    return ForwardingDriver::EventSynchronize(event);
  }
  absl::StatusOr<MemoryInfo> GetMemoryInfo() override {
    log.push_back("GetMemoryInfo");
    return ForwardingDriver::GetMemoryInfo();
  }

  std::vector<std::string> log;
  int aborted_creates = 0;
};

Config RegularSegments() {
  Config config;
  config.expandable_segments = false;
  return config;
}

class RetryPolicyTest : public ::testing::Test {
 protected:
  // Streams run only when told (RunPendingWork, or a synchronizing call): events can stay outstanding.
  void MakeAllocator(const Config& config) {
    SimDriverOptions options;
    options.manual_completion = true;
    absl::StatusOr<std::unique_ptr<SimDriver>> made = SimDriver::Create(options);
    ASSERT_TRUE(made.ok()) << made.status();
    sim_ = std::move(*made);
    driver_ = std::make_shared<CallLogDriver>(sim_);
    absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(driver_, config);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = std::move(*allocator);
    absl::StatusOr<Stream> side = driver_->StreamCreate();
    ASSERT_TRUE(side.ok()) << side.status();
    side_ = *side;
  }
  // Regular segments, blocks of 20 MiB and more oversize, capped at 100 MiB; a 12 MiB segment kept.
  void MakeCappedAllocatorWithOversizeBlocks() {
    Config config = RegularSegments();
    config.max_split_size = 20 * kMiB;
    MakeAllocator(config);
    allocator_->SetMemoryLimit(100 * kMiB);
    Keep(12 * kMiB);
  }
  // What a served request of MakeCappedAllocatorWithOversizeBlocks leaves: no out-of-memory error.
  void ExpectRegularSegmentFigures(std::int64_t reserved, std::int64_t device_frees, std::int64_t retries) {
    const DeviceStats s = Stats();
    EXPECT_EQ(s.reserved_bytes.all().current, reserved);
    EXPECT_EQ(s.num_device_free, device_frees);
    EXPECT_EQ(s.num_alloc_retries, retries);
    EXPECT_EQ(s.num_ooms, 0);
  }
  void TearDown() override {
    if (allocator_ != nullptr) {
      for (DevicePtr p : live_) EXPECT_TRUE(allocator_->Free(p).ok());
      EXPECT_TRUE(allocator_->EmptyCache().ok());
      ExpectInvariants();
      EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
    }
    allocator_.reset();
    if (driver_ != nullptr) {
      EXPECT_TRUE(driver_->StreamDestroy(side_).ok());
    }
    if (sim_ != nullptr) {
      const SimCounters c = sim_->Counters();
      EXPECT_EQ(c.allocations, 0u);
      EXPECT_EQ(c.handles, 0u);
      EXPECT_EQ(c.mappings, 0u);
      EXPECT_EQ(c.reservations, 0u);
      EXPECT_EQ(c.illegal_accesses, 0u);
    }
  }

  // Allocated and kept until the teardown.
  DevicePtr Keep(std::size_t bytes) {
    const DevicePtr p = Alloc(bytes);
    live_.push_back(p);
    return p;
  }
  DevicePtr Alloc(std::size_t bytes) {
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << "Allocate(" << bytes << "): " << p.status();
    ExpectInvariants();
    return p.ok() ? *p : 0;
  }
  void FreeOk(DevicePtr p) {
    EXPECT_TRUE(allocator_->Free(p).ok());
    ExpectInvariants();
  }
  // A block freed while work queued on the side stream before the free has not run: it waits for an event.
  void FreeAfterSideStreamWork(DevicePtr p) {
    ASSERT_TRUE(driver_->LaunchHostFunction(side_, [] {}).ok());
    ASSERT_TRUE(allocator_->RecordStream(p, side_).ok());
    FreeOk(p);
  }
  // The calls the next request makes, from here on.
  void StartLog() { driver_->log.clear(); }
  void ExpectInvariants() {
    const absl::Status s = allocator_->CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }
  DeviceStats Stats() const { return allocator_->GetStats(); }

  std::shared_ptr<SimDriver> sim_;
  std::shared_ptr<CallLogDriver> driver_;
  std::unique_ptr<CachingAllocator> allocator_;
  Stream side_ = kDefaultStream;
  std::vector<DevicePtr> live_;
};

TEST_F(RetryPolicyTest, TheOversizeCacheGoesBeforeEverythingCachedAndItsRetryIsNotCounted) {
  MakeCappedAllocatorWithOversizeBlocks();
  FreeOk(Alloc(12 * kMiB));  // a cached 12 MiB segment, not oversize
  FreeOk(Alloc(60 * kMiB));  // a cached oversize one
  ASSERT_EQ(Stats().reserved_bytes.all().current, 84 * MiB);
  StartLog();
  // 84 + 30 passes the limit: only the oversize segment goes, and the retry fits.
  live_.push_back(Alloc(30 * kMiB));
  EXPECT_THAT(driver_->log, ElementsAre("MemFree", "MemAlloc"));
  ExpectRegularSegmentFigures(/*reserved=*/54 * MiB, /*device_frees=*/1, /*retries=*/0);
}

TEST_F(RetryPolicyTest, WhenTheOversizeCacheIsNotEnoughEventsAreWaitedForThenEverythingCachedGoes) {
  MakeCappedAllocatorWithOversizeBlocks();
  FreeAfterSideStreamWork(Alloc(12 * kMiB));  // its segment comes back only once the event is waited for
  FreeOk(Alloc(40 * kMiB));                   // oversize, but less than the request needs
  ASSERT_EQ(Stats().reserved_bytes.all().current, 64 * MiB);
  StartLog();
  live_.push_back(Alloc(50 * kMiB));
  EXPECT_THAT(driver_->log, ElementsAre("EventSynchronize", "MemFree", "MemFree", "MemAlloc"));
  ExpectRegularSegmentFigures(/*reserved=*/62 * MiB, /*device_frees=*/2, /*retries=*/1);
}

TEST_F(RetryPolicyTest, ARefusedHandleGetsTheHandleCacheBackAndOneMoreTry) {
  MakeAllocator(Config{});
  const DevicePtr a = Alloc(48 * kMiB);  // one chunk
  Keep(4 * kMiB);                        // the next chunk
  FreeOk(a);
  // The device refuses to release a's handle: it stays in the handle cache, larger than what comes next.
  sim_->InjectFault(SimCall::kMemRelease, 1, DriverResult::kInvalidValue);
  EXPECT_FALSE(allocator_->EmptyCache().ok());
  ExpectInvariants();
  ASSERT_EQ(sim_->Counters().handles, 2u);
  sim_->InjectFault(SimCall::kMemCreate, 1, DriverResult::kOutOfMemory);
  StartLog();
  live_.push_back(Alloc(6 * kMiB));
  EXPECT_THAT(driver_->log, ElementsAre("MemCreate", "MemRelease", "MemCreate", "MemMap", "MemSetAccess"));
  EXPECT_EQ(sim_->InjectedFaultCount(), 2u);
  EXPECT_EQ(sim_->Counters().handles, 2u);
  EXPECT_EQ(Stats().num_alloc_retries, 0);  // served without the slow path's releases
}

TEST_F(RetryPolicyTest, AHandleIsRetriedOncePerGrowthThenTheSlowPathReleasesAndRetries) {
  MakeAllocator(Config{});
  Keep(2 * kMiB);
  sim_->InjectFault(SimCall::kMemCreate, 1, DriverResult::kOutOfMemory);
  sim_->InjectFault(SimCall::kMemCreate, 2, DriverResult::kOutOfMemory);
  StartLog();
  live_.push_back(Alloc(6 * kMiB));
  // Two refusals end the first growth; the second growth comes after everything cached was released.
  EXPECT_THAT(driver_->log, ElementsAre("MemCreate", "MemCreate", "MemCreate", "MemMap", "MemSetAccess"));
  EXPECT_EQ(sim_->InjectedFaultCount(), 2u);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_EQ(Stats().num_ooms, 0);
}

TEST_F(RetryPolicyTest, TheExpandableGrowthGivesUpAfterEightPasses) {
  MakeAllocator(Config{});
  Keep(2 * kMiB);
  FreeAfterSideStreamWork(Alloc(512));  // an outstanding event: marks in the log where the slow path releases
  driver_->aborted_creates = 8;         // every pass of the first growth is undone
  StartLog();
  live_.push_back(Alloc(6 * kMiB));
  std::vector<std::string> expected(8, "MemCreate");
  // Then everything cached: the event waited for, the freed block's chunk unmapped and its handle released;
  // then the second growth.
  for (const char* call :
       {"EventSynchronize", "MemUnmap", "MemRelease", "MemCreate", "MemMap", "MemSetAccess"}) {
    expected.push_back(call);
  }
  EXPECT_EQ(driver_->log, expected);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_EQ(Stats().num_ooms, 0);
}

TEST_F(RetryPolicyTest, OutOfMemoryIsReportedOnlyAfterEveryStepAndLeavesNoHandleIdle) {
  Config config;
  config.max_split_size = 20 * kMiB;
  MakeAllocator(config);
  Keep(2 * kMiB);
  // Both growths fail to map: each leaves its new handle in the cache.
  sim_->InjectFault(SimCall::kMemMap, 1, DriverResult::kOutOfMemory);
  sim_->InjectFault(SimCall::kMemMap, 2, DriverResult::kOutOfMemory);
  StartLog();
  const absl::StatusOr<DevicePtr> p = allocator_->Allocate(6 * kMiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("out of memory: tried to allocate 6.00 MiB"));
  // The growth; everything cached (the first growth's handle); the growth again; the handle cache (the
  // second growth's handle); then the report.
  EXPECT_THAT(driver_->log, ElementsAre("MemCreate", "MemMap", "MemRelease", "MemCreate", "MemMap",
                                        "MemRelease", "GetMemoryInfo"));
  ExpectInvariants();
  EXPECT_EQ(sim_->Counters().handles, 1u);  // the kept block's
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_EQ(Stats().num_ooms, 1);
}

TEST_F(RetryPolicyTest, AFailingStepEndsTheRequestWithItsError) {
  MakeAllocator(RegularSegments());
  Keep(12 * kMiB);
  FreeAfterSideStreamWork(Alloc(12 * kMiB));
  allocator_->SetMemoryLimit(30 * kMiB);
  sim_->InjectFault(SimCall::kEventSynchronize, 1, DriverResult::kInvalidValue);
  StartLog();
  const absl::StatusOr<DevicePtr> p = allocator_->Allocate(12 * kMiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  // No release, no retry and no report after the failed wait.
  EXPECT_THAT(driver_->log, ElementsAre("EventSynchronize"));
  ExpectInvariants();
  EXPECT_EQ(Stats().num_alloc_retries, 0);
  EXPECT_EQ(Stats().num_ooms, 0);
}

}  // namespace
}  // namespace graphalloc
