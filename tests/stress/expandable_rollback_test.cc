// Expandable segments when the device refuses to undo a mapping: a growth maps a chunk, the access call
// fails, and the rollback's unmap is refused too, so the chunk stays mapped without access. Part of the
// fault-injection stress binary (which finds such cases at random); these are the deterministic cases.
#include <cstdint>
#include <memory>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "gtest/gtest.h"
#include "tests/stress/sim_mappings.h"
#include "tests/stress/stress_util.h"
#include "tests/testing/device_memory.h"

namespace graphalloc {
namespace {

using testing::Accessible;
using ::testing::AssertionFailure;
using ::testing::AssertionSuccess;
using testing::CheckPattern;
using testing::FillPattern;
using testing::Range;
using testing::SimDeviceMappings;

// A growth maps a chunk, the access call fails, and the device refuses the rollback's unmap: the chunk
// stays mapped without access. It used to be settled as an ordinary free block and handed out by the next
// allocation, whose first touch faulted (SIGSEGV here, an illegal address on a GPU). Now it is quarantined
// (mapped, counted as reserved, never handed out, shown without access in snapshots) until access is
// granted or it is unmapped: here the next growth grants access and serves the request from it.
class ExpandableSegmentRollbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SimDriverOptions options;
    options.capacity = std::size_t{64} << 20;
    absl::StatusOr<std::unique_ptr<SimDriver>> created_driver = SimDriver::Create(options);
    ASSERT_TRUE(created_driver.ok()) << created_driver.status();
    sim_ = std::move(*created_driver);
    absl::StatusOr<Config> config = Config::Parse("expandable_segments:True");
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(sim_, *config);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = std::move(*allocator);
  }

  // A growth that maps a chunk whose access call fails and whose rollback unmap the device refuses.
  void RefusedGrowth() {
    sim_->InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kUnknown);
    sim_->InjectFault(SimCall::kMemUnmap, 1, DriverResult::kUnknown);
    absl::StatusOr<DevicePtr> refused = allocator_->Allocate(1 << 20);
    ASSERT_FALSE(refused.ok());
    ASSERT_TRUE(allocator_->CheckInvariants().ok()) << allocator_->CheckInvariants();
    // The chunk is reserved (the device holds it) and shown without access.
    const SimCounters c = sim_->Counters();
    ASSERT_EQ(c.mapped_bytes, std::size_t{2} << 20);
    ASSERT_EQ(allocator_->GetStats().reserved_bytes.all().current, std::int64_t{2} << 20);
    const MemorySnapshot snapshot = allocator_->TakeSnapshot();
    ASSERT_EQ(snapshot.segments.size(), 1u);
    ASSERT_EQ(snapshot.segments[0].mapped.size(), 1u);
    EXPECT_FALSE(snapshot.segments[0].mapped[0].accessible);
    chunk_ =
        Range{snapshot.segments[0].address, snapshot.segments[0].address + (std::size_t{2} << 20), false};
    EXPECT_EQ(SimDeviceMappings(), (std::vector<Range>{chunk_}));
    EXPECT_TRUE(ValidateSnapshot(snapshot).ok()) << ValidateSnapshot(snapshot);
    EXPECT_TRUE(CheckStatsConsistency(snapshot).ok()) << CheckStatsConsistency(snapshot);
  }

  // `ptr` lies in memory the device has mapped with access (read from /proc/self/maps rather than by
  // touching the block, which would crash the test), and holds what is written there.
  ::testing::AssertionResult Usable(DevicePtr ptr, std::size_t size) {
    if (!Accessible(SimDeviceMappings(), ptr, size)) {
      return AssertionFailure() << "the block at " << Range{ptr, ptr + size, true}
                                << " is not accessible device memory";
    }
    if (absl::Status s = FillPattern(*sim_, ptr, size, 1); !s.ok()) return AssertionFailure() << s;
    if (absl::Status s = CheckPattern(*sim_, ptr, size, 1); !s.ok()) return AssertionFailure() << s;
    return AssertionSuccess();
  }

  std::shared_ptr<SimDriver> sim_;
  std::unique_ptr<CachingAllocator> allocator_;
  Range chunk_;
};

TEST_F(ExpandableSegmentRollbackTest, ChunkLeftMappedByARefusedRollbackUnmapIsNotHandedOutWithoutAccess) {
  RefusedGrowth();
  if (HasFatalFailure()) return;

  absl::StatusOr<DevicePtr> ptr = allocator_->Allocate(1 << 20);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  EXPECT_TRUE(Usable(*ptr, 1 << 20));
  ASSERT_TRUE(allocator_->CheckInvariants().ok()) << allocator_->CheckInvariants();
  // The growth granted the quarantined chunk its access and served the request from it: nothing more
  // was mapped.
  EXPECT_EQ(sim_->Counters().mapped_bytes, std::size_t{2} << 20);
  EXPECT_EQ(SimDeviceMappings(), (std::vector<Range>{Range{chunk_.begin, chunk_.end, true}}));
  ASSERT_TRUE(allocator_->Free(*ptr).ok());
  EXPECT_TRUE(testing::DrainAndCheckNothingLeaked(*sim_, *allocator_));
}

// The device keeps refusing: the growth's repair (access, then unmap) fails too, so the chunk stays
// quarantined and the request is served from a new chunk; EmptyCache, once the device behaves, unmaps it.
TEST_F(ExpandableSegmentRollbackTest, ChunkThatStaysWithoutAccessIsNeverHandedOutAndEmptyCacheReclaimsIt) {
  RefusedGrowth();
  if (HasFatalFailure()) return;

  sim_->InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kUnknown);
  sim_->InjectFault(SimCall::kMemUnmap, 1, DriverResult::kUnknown);
  absl::StatusOr<DevicePtr> ptr = allocator_->Allocate(1 << 20);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  EXPECT_EQ(sim_->InjectedFaultCount(), 4u);
  EXPECT_TRUE(*ptr >= chunk_.end || *ptr + (1 << 20) <= chunk_.begin) << "served from the quarantined chunk";
  EXPECT_TRUE(Usable(*ptr, 1 << 20));
  ASSERT_TRUE(allocator_->CheckInvariants().ok()) << allocator_->CheckInvariants();
  EXPECT_EQ(sim_->Counters().mapped_bytes, std::size_t{4} << 20);
  const MemorySnapshot snapshot = allocator_->TakeSnapshot();
  EXPECT_TRUE(ValidateSnapshot(snapshot).ok()) << ValidateSnapshot(snapshot);
  EXPECT_TRUE(CheckStatsConsistency(snapshot).ok()) << CheckStatsConsistency(snapshot);

  // EmptyCache retries it: with the device healthy again, nothing is left.
  ASSERT_TRUE(allocator_->Free(*ptr).ok());
  EXPECT_TRUE(testing::DrainAndCheckNothingLeaked(*sim_, *allocator_));
}

}  // namespace
}  // namespace graphalloc
