// The caching allocator's rules, on the simulated device and (label `gpu`) on the real one: exact sizes,
// addresses, statistics and error messages, with the invariant checker after every step.
#include "graphalloc/allocator/core/caching_allocator.h"

#include "gmock/gmock.h"
#include "graphalloc/allocator/core/size_policy.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/device_memory.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;
using ::testing::HasSubstr;

constexpr std::int64_t MiB = static_cast<std::int64_t>(kMiB);

// These tests check PyTorch's regular-segment rules, so they pin expandable_segments:False (expandable
// segments have their own suite, expandable_segments_test.cc).
Config RegularSegments() {
  Config config;
  config.expandable_segments = false;
  return config;
}

class CachingAllocatorTest : public AllocatorFixture {};

TEST_F(CachingAllocatorTest, SmallAllocationsShareOneTwoMiBSegment) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(1000);
  DevicePtr b = Alloc(1000);
  EXPECT_EQ(b, a + 1024);
  DeviceStats s = Stats();
  EXPECT_EQ(s.allocated_bytes.all().current, 2048);
  EXPECT_EQ(s.requested_bytes.all().current, 2000);
  EXPECT_EQ(s.reserved_bytes.all().current, 2 * MiB);
  EXPECT_EQ(s.reserved_bytes[StatType::kSmallPool].current, 2 * MiB);
  EXPECT_EQ(s.reserved_bytes[StatType::kLargePool].current, 0);
  EXPECT_EQ(s.segment.all().current, 1);
  EXPECT_EQ(s.allocation.all().current, 2);
  EXPECT_EQ(s.num_device_alloc, 1);
  FreeOk(a);
  FreeOk(b);
}

TEST_F(CachingAllocatorTest, FreedBlockIsReusedAtTheSameAddress) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(4096);
  FreeOk(a);
  DevicePtr b = Alloc(4000);
  EXPECT_EQ(b, a);
  EXPECT_EQ(Stats().num_device_alloc, 1);
  FreeOk(b);
}

TEST_F(CachingAllocatorTest, BestFitTakesTheSmallestFreeBlockThatFits) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr x = Alloc(2048);
  DevicePtr sep1 = Alloc(512);
  DevicePtr y = Alloc(8192);
  DevicePtr sep2 = Alloc(512);
  DevicePtr z = Alloc(4096);
  DevicePtr sep3 = Alloc(512);
  FreeOk(x);
  FreeOk(y);
  FreeOk(z);
  EXPECT_EQ(Alloc(4096), z);
  EXPECT_EQ(Alloc(3000), y);
  EXPECT_EQ(Alloc(2048), x);
  for (DevicePtr p : {x, y, z, sep1, sep2, sep3}) FreeOk(p);
}

TEST_F(CachingAllocatorTest, CoalescingMergesNeighboursAndTracksInactiveSplit) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(1024);
  DevicePtr b = Alloc(1024);
  DevicePtr c = Alloc(1024);
  EXPECT_EQ(Stats().inactive_split.all().current, 1);  // the rest of the segment
  EXPECT_EQ(Stats().inactive_split_bytes.all().current, 2 * MiB - 3072);
  FreeOk(a);
  EXPECT_EQ(Stats().inactive_split.all().current, 2);
  EXPECT_EQ(Stats().inactive_split_bytes.all().current, 2 * MiB - 2048);
  FreeOk(c);  // merges with the rest
  EXPECT_EQ(Stats().inactive_split.all().current, 2);
  EXPECT_EQ(Stats().inactive_split_bytes.all().current, 2 * MiB - 1024);
  FreeOk(b);  // everything merges: the segment is whole again
  EXPECT_EQ(Stats().inactive_split.all().current, 0);
  EXPECT_EQ(Stats().inactive_split_bytes.all().current, 0);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  ExpectInvariants();
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(Stats().num_device_free, 1);
}

TEST_F(CachingAllocatorTest, AnotherStreamDoesNotReuseAFreedBlock) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  Stream other = NewStream();
  DevicePtr a = Alloc(4096);
  FreeOk(a);
  DevicePtr b = Alloc(4096, other);
  EXPECT_NE(b, a);
  EXPECT_EQ(Stats().segment.all().current, 2);
  DevicePtr c = Alloc(4096);
  EXPECT_EQ(c, a);
  FreeOk(b);
  FreeOk(c);
}

TEST_F(CachingAllocatorTest, LargeRequestsGetSegmentsByPyTorchSizeRules) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(kMiB + 1);  // below 10 MiB: a whole 20 MiB segment
  EXPECT_EQ(Stats().allocated_bytes.all().current, MiB + 512);
  EXPECT_EQ(Stats().reserved_bytes[StatType::kLargePool].current, 20 * MiB);
  EXPECT_EQ(Stats().inactive_split[StatType::kLargePool].current, 1);
  DevicePtr b = Alloc(19 * kMiB + 1);  // the 19 MiB - 512 B rest is too small: a new segment rounded to 2 MiB
  EXPECT_EQ(Stats().reserved_bytes.all().current, 40 * MiB);
  EXPECT_EQ(Stats().segment.all().current, 2);
  DevicePtr c = Alloc(10 * kMiB + 1);  // fits the rest of a's segment, which splits again
  EXPECT_EQ(c, a + kMiB + 512);
  EXPECT_EQ(Stats().reserved_bytes.all().current, 40 * MiB);
  EXPECT_EQ(Stats().inactive_split[StatType::kLargePool].current, 1);
  EXPECT_EQ(Stats().inactive_split_bytes[StatType::kLargePool].current, 9 * MiB - 1024);
  FreeOk(a);
  FreeOk(b);
  FreeOk(c);
}

TEST_F(CachingAllocatorTest, LargeRemainderOfAtMostOneMiBStaysInsideTheBlock) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(19 * kMiB + kMiB / 2);
  DeviceStats s = Stats();
  EXPECT_EQ(s.reserved_bytes.all().current, 20 * MiB);
  EXPECT_EQ(s.allocated_bytes.all().current, 20 * MiB);
  EXPECT_EQ(s.requested_bytes.all().current, 19 * MiB + MiB / 2);
  EXPECT_EQ(s.inactive_split.all().current, 0);
  FreeOk(a);
}

TEST_F(CachingAllocatorTest, OversizeBlocksAreNeitherSplitNorTakenBySmallRequests) {
  Config config = RegularSegments();
  config.max_split_size = 20 * kMiB;
  GRAPHALLOC_ALLOCATOR_SETUP(config);
  DevicePtr big = Alloc(40 * kMiB);
  EXPECT_EQ(Stats().oversize_allocations.all().current, 1);
  EXPECT_EQ(Stats().oversize_segments.all().current, 1);
  FreeOk(big);
  DevicePtr small_request = Alloc(4 * kMiB);  // may not take the 40 MiB block
  EXPECT_NE(small_request, big);
  EXPECT_EQ(Stats().reserved_bytes.all().current, 60 * MiB);
  DevicePtr oversize = Alloc(30 * kMiB);  // 40 < 30 + 20: takes the cached block whole
  EXPECT_EQ(oversize, big);
  EXPECT_EQ(Stats().allocated_bytes.all().current, 4 * MiB + 40 * MiB);
  FreeOk(oversize);
  DevicePtr too_loose = Alloc(20 * kMiB);  // 40 >= 20 + 20: would waste too much, gets its own segment
  EXPECT_NE(too_loose, big);
  FreeOk(too_loose);
  FreeOk(small_request);
}

TEST_F(CachingAllocatorTest, OutOfMemoryReportsSizesAndHintAndKeepsOtherAllocations) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  allocator_->SetMemoryLimit(64 * kMiB);
  DevicePtr a = Alloc(40 * kMiB);
  ASSERT_TRUE(testing::FillPattern(*driver_, a, 40 * kMiB, 7).ok());
  absl::StatusOr<DevicePtr> b = allocator_->Allocate(40 * kMiB);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("out of memory: tried to allocate 40.00 MiB"));
  EXPECT_THAT(b.status().message(), HasSubstr("capped at 64.00 MiB"));
  EXPECT_THAT(b.status().message(), HasSubstr("40.00 MiB allocated by graphalloc"));
  EXPECT_THAT(b.status().message(), HasSubstr("0 bytes reserved but unallocated"));
  // Only what applies: the cap, not expandable segments (nothing is fragmented; oom_explanation_test).
  EXPECT_THAT(b.status().message(), HasSubstr("raise the allocator's cap"));
  EXPECT_THAT(b.status().message(), HasSubstr("total"));
  ExpectInvariants();
  EXPECT_EQ(Stats().num_ooms, 1);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_TRUE(testing::CheckPattern(*driver_, a, 40 * kMiB, 7).ok());
  FreeOk(a);
}

TEST_F(CachingAllocatorTest, AllocationRetriesAfterReleasingTheCache) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  allocator_->SetMemoryLimit(40 * kMiB);
  DevicePtr a = Alloc(5 * kMiB);  // a 20 MiB segment
  FreeOk(a);
  DevicePtr b = Alloc(30 * kMiB);  // 20 cached + 30 > 40: the cache goes first
  DeviceStats s = Stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.reserved_bytes.all().current, 30 * MiB);
  FreeOk(b);
}

TEST_F(CachingAllocatorTest, EmptyCacheReturnsOnlyUnusedSegments) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr small1 = Alloc(1024);
  DevicePtr small2 = Alloc(1024);
  DevicePtr large = Alloc(30 * kMiB);
  FreeOk(small1);
  FreeOk(large);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  ExpectInvariants();
  EXPECT_EQ(Stats().reserved_bytes.all().current, 2 * MiB);  // small2 keeps its segment
  EXPECT_EQ(Stats().segment.all().current, 1);
  FreeOk(small2);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(Stats().num_device_free, 2);
}

TEST_F(CachingAllocatorTest, MemoryFractionCapsReservedMemory) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  const double total = static_cast<double>(driver_->Info().total_memory);
  ASSERT_TRUE(allocator_->SetMemoryFraction(100.0 * static_cast<double>(kMiB) / total).ok());
  DevicePtr a = Alloc(80 * kMiB);
  absl::StatusOr<DevicePtr> b = allocator_->Allocate(40 * kMiB);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  ExpectInvariants();
  ASSERT_TRUE(allocator_->SetMemoryFraction(1.0).ok());
  DevicePtr c = Alloc(40 * kMiB);
  EXPECT_EQ(allocator_->SetMemoryFraction(1.5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_DOUBLE_EQ(allocator_->GetMemoryFraction(), 1.0);
  FreeOk(a);
  FreeOk(c);
}

TEST_F(CachingAllocatorTest, GarbageCollectionFreesOldCachedSegmentsAboveTheThreshold) {
  Config config = RegularSegments();
  config.garbage_collection_threshold = 0.5;
  GRAPHALLOC_ALLOCATOR_SETUP(config);
  allocator_->SetMemoryLimit(100 * kMiB);
  DevicePtr a = Alloc(30 * kMiB);
  DevicePtr b = Alloc(24 * kMiB);
  FreeOk(a);
  FreeOk(b);
  EXPECT_EQ(Stats().reserved_bytes.all().current, 54 * MiB);
  DevicePtr c = Alloc(40 * kMiB);  // 54 MiB cached > 50 MiB threshold: old blocks go first
  DeviceStats s = Stats();
  EXPECT_GE(s.num_device_free, 1);
  EXPECT_LE(s.reserved_bytes.all().current, 70 * MiB);
  EXPECT_EQ(s.num_alloc_retries, 0);
  FreeOk(c);
}

TEST_F(CachingAllocatorTest, FreeOfUnknownPointerIsAnError) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(4096);
  ASSERT_TRUE(testing::FillPattern(*driver_, a, 4096, 1).ok());
  absl::Status s = allocator_->Free(0x1234500);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unknown pointer: it was not returned by this allocator"));
  ExpectInvariants();
  EXPECT_TRUE(testing::CheckPattern(*driver_, a, 4096, 1).ok());
  EXPECT_EQ(Stats().allocation.all().current, 1);
  FreeOk(a);
}

TEST_F(CachingAllocatorTest, DoubleFreeIsAnError) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(4096);
  DevicePtr b = Alloc(4096);
  ASSERT_TRUE(testing::FillPattern(*driver_, b, 4096, 2).ok());
  FreeOk(a);
  absl::Status s = allocator_->Free(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("double free"));
  ExpectInvariants();
  EXPECT_TRUE(testing::CheckPattern(*driver_, b, 4096, 2).ok());
  FreeOk(b);
}

TEST_F(CachingAllocatorTest, AFreedBlockWaitingInTheQuickCacheIsNotLive) {
  // A block freed into the quick cache keeps its pointer-map entry until it leaves the cache
  // (stream_shard.h): its pointer must still read as freed, and the next request of its size takes it back.
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  Stream other = NewStream();
  DevicePtr a = Alloc(4096);
  DevicePtr b = Alloc(4096);
  FreeOk(a);
  ExpectInvariants();
  absl::Status s = allocator_->RecordStream(a, other);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the block at this address is not allocated (it was freed already)"));
  s = allocator_->Free(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("double free"));
  EXPECT_EQ(Alloc(4096), a);
  EXPECT_EQ(Stats().allocation.all().current, 2);
  ExpectInvariants();
  FreeOk(b);  // not parked (a is): merges with the free rest of the segment, and takes a's entry out too
  ExpectInvariants();
  FreeOk(a);
  ExpectInvariants();
  EXPECT_EQ(Stats().allocation.all().current, 0);
}

TEST_F(CachingAllocatorTest, FreeOfAnInteriorPointerIsAnError) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(4096);
  absl::Status s = allocator_->Free(a + 512);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("inside the allocated block"));
  ExpectInvariants();
  FreeOk(a);
}

TEST_F(CachingAllocatorTest, RecordStreamOnUnknownPointerIsAnError) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  Stream other = NewStream();
  absl::Status s = allocator_->RecordStream(0x4000, other);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("RecordStream(0x4000): unknown pointer"));
  ExpectInvariants();
}

TEST_F(CachingAllocatorTest, AllocationOfMoreThanOneEiBIsRefused) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  absl::StatusOr<DevicePtr> p = allocator_->Allocate((std::size_t{1} << 60) + 1);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("more than 1 EiB"));
  ExpectInvariants();
  EXPECT_EQ(Stats().num_device_alloc, 0);
}

TEST_F(CachingAllocatorTest, ZeroByteAllocationReturnsNullAndFreeingNullIsANoOp) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  absl::StatusOr<DevicePtr> p = allocator_->Allocate(0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, 0u);
  EXPECT_TRUE(allocator_->Free(0).ok());
  EXPECT_EQ(Stats().allocation.all().allocated, 0);
  ExpectInvariants();
}

TEST_F(CachingAllocatorTest, ResetPeakAndAccumulatedStats) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(8192);
  DevicePtr b = Alloc(8192);
  FreeOk(b);
  DeviceStats s = Stats();
  EXPECT_EQ(s.allocated_bytes.all().peak, 16384);
  EXPECT_EQ(s.allocated_bytes.all().allocated, 16384);
  EXPECT_EQ(s.allocated_bytes.all().freed, 8192);
  allocator_->ResetPeakStats();
  EXPECT_EQ(Stats().allocated_bytes.all().peak, 8192);
  allocator_->ResetAccumulatedStats();
  s = Stats();
  EXPECT_EQ(s.allocated_bytes.all().allocated, 0);
  EXPECT_EQ(s.allocated_bytes.all().freed, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  EXPECT_EQ(s.allocated_bytes.all().current, 8192);
  FreeOk(a);
}

TEST_F(CachingAllocatorTest, StatsJsonUsesPyTorchKeys) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  DevicePtr a = Alloc(1000);
  const std::string json = Stats().ToJson();
  EXPECT_THAT(json, HasSubstr("\"allocated_bytes.all.current\": 1024"));
  EXPECT_THAT(json, HasSubstr("\"reserved_bytes.small_pool.current\": 2097152"));
  EXPECT_THAT(json, HasSubstr("\"num_device_alloc\": 1"));
  FreeOk(a);
}

}  // namespace
}  // namespace graphalloc
