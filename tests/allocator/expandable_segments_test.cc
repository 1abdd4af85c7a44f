// Expandable segments (CUDA VMM), on the simulated device and (label `gpu`) on the real one: growth in
// chunks sized to the need, shrinking, idle chunks moved where a request needs them, blocks spanning
// chunks, pages freed from the middle of a segment under a limit, and every VMM failure during a grow or a
// shrink (simulated device only) leaving the allocator consistent and the device with nothing leaked.
#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/device_memory.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;
using testing::AsSim;

constexpr std::int64_t MiB = static_cast<std::int64_t>(kMiB);

class ExpandableSegmentsTest : public AllocatorFixture {
 protected:
  std::int64_t Reserved() const { return Stats().reserved_bytes.all().current; }
  std::size_t Reservation() const {
    const std::size_t g = driver_->Info().granularity;
    return (driver_->Info().total_memory + g - 1) / g * g;
  }
  std::vector<MappedRange> Mapped() const {
    MemorySnapshot snap = allocator_->TakeSnapshot();
    EXPECT_EQ(snap.segments.size(), 1u);
    return snap.segments.empty() ? std::vector<MappedRange>{} : snap.segments[0].mapped;
  }
  // Frees everything given, empties the cache, destroys the allocator: the device must hold nothing.
  void ExpectNothingLeftAfter(std::vector<DevicePtr> live) {
    for (DevicePtr p : live) FreeOk(p);
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    ExpectInvariants();
    EXPECT_EQ(Reserved(), 0);
    EXPECT_TRUE(allocator_->TakeSnapshot().segments.empty());
    SimDriver* sim = AsSim(driver_.get());
    if (sim == nullptr) return;
    SimCounters c = sim->Counters();
    EXPECT_EQ(c.reservations, 0u);
    EXPECT_EQ(c.handles, 0u);
    EXPECT_EQ(c.mappings, 0u);
    EXPECT_EQ(c.handle_bytes, 0u);
  }
};

TEST_F(ExpandableSegmentsTest, GrowsByMappingOnlyTheMissingPages) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_TRUE(allocator_->config().expandable_segments);
  const DevicePtr a = Alloc(5 * kMiB);
  EXPECT_EQ(Reserved(), 6 * MiB);
  // The 1 MiB tail of the first chunk serves the next request's start; only 4 MiB more are mapped.
  const DevicePtr b = Alloc(5 * kMiB);
  EXPECT_EQ(b, a + 5 * kMiB);
  EXPECT_EQ(Reserved(), 10 * MiB);
  const DeviceStats s = Stats();
  EXPECT_EQ(s.num_device_alloc, 2);
  EXPECT_EQ(s.segment.all().current, 0);  // expandable segments are not counted as segments
  MemorySnapshot snap = allocator_->TakeSnapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_TRUE(snap.segments[0].expandable);
  EXPECT_EQ(snap.segments[0].address, a);
  EXPECT_EQ(snap.segments[0].total_size, Reservation());
  EXPECT_EQ(snap.segments[0].mapped, (std::vector<MappedRange>{{0, 10 * kMiB}}));
  EXPECT_EQ(snap.segments[0].ReservedBytes(), 10 * kMiB);
  ExpectNothingLeftAfter({a, b});
}

TEST_F(ExpandableSegmentsTest, SmallRequestsGetTheirOwnSegmentInTwoMiBPages) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const DevicePtr a = Alloc(1000);
  const DevicePtr b = Alloc(512 * 1024);
  EXPECT_EQ(b, a + 1024);
  EXPECT_EQ(Reserved(), 2 * MiB);
  EXPECT_EQ(Stats().reserved_bytes.by_type[1].current, 2 * MiB);
  const DevicePtr c = Alloc(3 * kMiB);  // large pool: another reservation
  EXPECT_EQ(Stats().reserved_bytes.by_type[2].current, 4 * MiB);
  EXPECT_EQ(allocator_->TakeSnapshot().segments.size(), 2u);
  ExpectNothingLeftAfter({a, b, c});
}

TEST_F(ExpandableSegmentsTest, ShrinkThenGrowAgainReusesTheAddressRange) {
  GRAPHALLOC_ALLOCATOR_SETUP(Config{}, SimDriverOptions{});
  const DevicePtr a = Alloc(6 * kMiB);
  const DevicePtr b = Alloc(6 * kMiB);
  FreeOk(b);
  EXPECT_EQ(Reserved(), 12 * MiB);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  ExpectInvariants();
  EXPECT_EQ(Reserved(), 6 * MiB);  // b's pages went back; a's stay
  EXPECT_EQ(Mapped(), (std::vector<MappedRange>{{0, 6 * kMiB}}));
  EXPECT_EQ(Stats().num_device_free, 1);
  const DevicePtr c = Alloc(8 * kMiB);
  EXPECT_EQ(c, a + 6 * kMiB);
  EXPECT_EQ(Reserved(), 14 * MiB);
  ASSERT_TRUE(testing::FillPattern(*driver_, c, 8 * kMiB, 3).ok());
  ASSERT_TRUE(testing::CheckPattern(*driver_, c, 8 * kMiB, 3).ok());
  ExpectNothingLeftAfter({a, c});
}

TEST_F(ExpandableSegmentsTest, ABlockSpanningSeveralChunksKeepsItsContents) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const DevicePtr a = Alloc(3 * kMiB);  // chunk [0, 4 MiB)
  const DevicePtr b = Alloc(3 * kMiB);  // [3, 6): the tail of chunk 1 and a new chunk [4, 6)
  EXPECT_EQ(b, a + 3 * kMiB);
  // 200 MiB: nothing free is mapped, so five new chunks (new chunks are at most 48 MiB: 4x48+8).
  const DevicePtr c = Alloc(200 * kMiB);
  EXPECT_EQ(c, a + 6 * kMiB);
  EXPECT_EQ(Reserved(), 206 * MiB);
  EXPECT_EQ(Stats().num_device_alloc, 7);
  ASSERT_TRUE(testing::FillPattern(*driver_, b, 3 * kMiB, 11).ok());
  ASSERT_TRUE(testing::FillPattern(*driver_, c, 200 * kMiB, 12).ok());
  ASSERT_TRUE(testing::CheckPattern(*driver_, b, 3 * kMiB, 11).ok());
  ASSERT_TRUE(testing::CheckPattern(*driver_, c, 200 * kMiB, 12).ok());
  ExpectNothingLeftAfter({a, b, c});
}

TEST_F(ExpandableSegmentsTest, IdleChunksMoveWhereTheRequestNeedsThemInsteadOfNewMemory) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  const DevicePtr a = Alloc(48 * kMiB);  // one chunk
  const DevicePtr b = Alloc(4 * kMiB);
  FreeOk(a);
  const std::uint64_t creates = sim != nullptr ? sim->CallCount(SimCall::kMemCreate) : 0;
  // 90 MiB do not fit a's 48 MiB: a's idle chunk is unmapped and mapped after b, plus 42 MiB new.
  const DevicePtr c = Alloc(90 * kMiB);
  EXPECT_EQ(c, b + 4 * kMiB);
  EXPECT_EQ(Reserved(), 94 * MiB);
  EXPECT_EQ(Mapped(), (std::vector<MappedRange>{{48 * kMiB, 94 * kMiB}}));
  const DeviceStats s = Stats();
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_device_alloc, 4);  // a, b, then the moved chunk and the new one
  if (sim != nullptr) {
    EXPECT_EQ(sim->CallCount(SimCall::kMemCreate), creates + 1);
  }
  ASSERT_TRUE(testing::FillPattern(*driver_, c, 90 * kMiB, 5).ok());
  ASSERT_TRUE(testing::CheckPattern(*driver_, c, 90 * kMiB, 5).ok());
  ExpectNothingLeftAfter({b, c});
}

TEST_F(ExpandableSegmentsTest, LargeRequestsGrowingAnUnfragmentedPoolTakeOneHandleEach) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  const std::uint64_t creates = sim != nullptr ? sim->CallCount(SimCall::kMemCreate) : 0;
  // 1 GiB of growth in 512 MiB requests: two handles, not sixteen of 64 MiB (the driver's cost is per
  // handle; bench/expandable_bench measures it).
  const DevicePtr a = Alloc(512 * kMiB);
  const DevicePtr b = Alloc(512 * kMiB);
  EXPECT_EQ(b, a + 512 * kMiB);
  EXPECT_EQ(Reserved(), 1024 * MiB);
  EXPECT_EQ(Stats().num_device_alloc, 2);
  if (sim != nullptr) {
    EXPECT_EQ(sim->CallCount(SimCall::kMemCreate), creates + 2);
    EXPECT_EQ(sim->Counters().handles, 2u);
  }
  ExpectNothingLeftAfter({a, b});
}

TEST_F(ExpandableSegmentsTest, EachGiBOfHalfGiBGrowthMakesOnlyItsSevenVmmCallsAndNoSynchronization) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "call counts need the simulated device";
  // What one iteration of bench/expandable_bench's grow/<device>/512 asks of the driver (its GPU wall
  // time is several times the sum of these calls' costs): one reservation, one create, map and access
  // per handle, nothing that waits for the device; and the teardown gives everything back, so the next
  // round makes the same calls again (no reservation or handle kept, none created twice).
  const SimCall kinds[] = {
      SimCall::kAddressReserve, SimCall::kAddressFree, SimCall::kMemCreate,       SimCall::kMemRelease,
      SimCall::kMemMap,         SimCall::kMemUnmap,    SimCall::kMemSetAccess,    SimCall::kStreamSynchronize,
      SimCall::kEventRecord,    SimCall::kEventQuery,  SimCall::kEventSynchronize};
  auto counts = [&] {
    std::vector<std::uint64_t> c;
    for (SimCall kind : kinds) c.push_back(sim->CallCount(kind));
    return c;
  };
  auto since = [&](const std::vector<std::uint64_t>& before) {
    std::vector<std::uint64_t> d = counts();
    for (std::size_t i = 0; i < d.size(); ++i) d[i] -= before[i];
    return d;
  };
  // In the order of `kinds`: reserve, free, create, release, map, unmap, access, then the four waits.
  const std::vector<std::uint64_t> growth = {1, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0};
  const std::vector<std::uint64_t> teardown = {0, 1, 0, 2, 0, 2, 0, 0, 0, 0, 0};
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    std::vector<std::uint64_t> before = counts();
    const DevicePtr a = Alloc(512 * kMiB);
    const DevicePtr b = Alloc(512 * kMiB);
    EXPECT_EQ(since(before), growth);
    EXPECT_EQ(Stats().num_device_alloc, 2 * (round + 1));
    before = counts();
    FreeOk(a);
    FreeOk(b);
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    EXPECT_EQ(since(before), teardown);
    EXPECT_EQ(Reserved(), 0);
  }
  ExpectNothingLeftAfter({});
}

TEST_F(ExpandableSegmentsTest, LargeRequestsNextToStrandedFreeMemoryKeepBoundedChunks) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const DevicePtr a = Alloc(40 * kMiB);  // one 40 MiB chunk
  const DevicePtr b = Alloc(2 * kMiB);
  FreeOk(a);
  // 6 MiB of a's chunk are live again: its other 34 MiB are stranded (free, but pinned by c), more
  // than 1/16 of the next request. A pool that frees and reuses in part gets 48 MiB handles (10 x 48 + 32).
  const DevicePtr c = Alloc(6 * kMiB);
  EXPECT_EQ(c, a);
  const std::int64_t before = Stats().num_device_alloc;
  const DevicePtr d = Alloc(512 * kMiB);
  EXPECT_EQ(d, b + 2 * kMiB);
  EXPECT_EQ(Stats().num_device_alloc, before + 11);
  ExpectNothingLeftAfter({b, c, d});
}

TEST_F(ExpandableSegmentsTest, NearTheLimitNewChunksAreSinglePagesThatMoveOnTheirOwn) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  allocator_->SetMemoryLimit(24 * kMiB);
  const DevicePtr a = Alloc(4 * kMiB);  // far from the limit: one chunk
  EXPECT_EQ(Stats().num_device_alloc, 1);
  const DevicePtr b = Alloc(10 * kMiB);  // past 30% of the limit: five 2 MiB pages
  EXPECT_EQ(Stats().num_device_alloc, 6);
  const DevicePtr c = Alloc(2 * kMiB);
  FreeOk(b);
  const DevicePtr d = Alloc(4 * kMiB);  // best fit: b's start; b's last three pages stay idle
  EXPECT_EQ(d, a + 4 * kMiB);
  // 14 MiB fit under the limit only because those three pages move on their own; one 10 MiB chunk
  // would stay pinned by d.
  const DevicePtr e = Alloc(14 * kMiB);
  EXPECT_EQ(e, c + 2 * kMiB);
  EXPECT_EQ(Reserved(), 24 * MiB);
  EXPECT_EQ(Mapped(), (std::vector<MappedRange>{{0, 8 * kMiB}, {14 * kMiB, 16 * kMiB}}));  // offset, size
  ASSERT_TRUE(testing::FillPattern(*driver_, e, 14 * kMiB, 6).ok());
  ASSERT_TRUE(testing::CheckPattern(*driver_, e, 14 * kMiB, 6).ok());
  ExpectNothingLeftAfter({a, c, d, e});
}

TEST_F(ExpandableSegmentsTest, PagesInTheMiddleOfASegmentAreFreedUnderAMemoryLimit) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  allocator_->SetMemoryLimit(16 * kMiB);
  const DevicePtr a = Alloc(4 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);
  const DevicePtr c = Alloc(4 * kMiB);
  FreeOk(b);
  // 8 MiB: b's 4 MiB between two live blocks are unmapped and mapped after c, with 4 MiB new.
  const DevicePtr d = Alloc(8 * kMiB);
  EXPECT_EQ(d, c + 4 * kMiB);
  EXPECT_EQ(Reserved(), 16 * MiB);
  EXPECT_EQ(Mapped(), (std::vector<MappedRange>{{0, 4 * kMiB}, {8 * kMiB, 12 * kMiB}}));
  // Nothing idle is left and the limit is reached: out of memory, and everything is intact.
  absl::StatusOr<DevicePtr> e = allocator_->Allocate(2 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(e.status())) << e.status();
  ExpectInvariants();
  EXPECT_EQ(Reserved(), 16 * MiB);
  ExpectNothingLeftAfter({a, c, d});
}

TEST_F(ExpandableSegmentsTest, ReleaseBeforeOutOfMemoryUnmapsFreePagesOfOtherShards) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  allocator_->SetMemoryLimit(16 * kMiB);
  const Stream other = NewStream();
  const DevicePtr a = Alloc(10 * kMiB, other);
  FreeOk(a);                             // 10 MiB idle on the other stream
  const DevicePtr b = Alloc(12 * kMiB);  // needs the other stream's pages released first
  EXPECT_EQ(Reserved(), 12 * MiB);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  ExpectNothingLeftAfter({b});
}

// ---- VMM failures (simulated device). ----

class ExpandableFaultTest : public ExpandableSegmentsTest, public ::testing::WithParamInterface<SimCall> {};

TEST_P(ExpandableFaultTest, AFailureDuringGrowthIsUndoneAndTheRequestRetried) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "fault injection needs the simulated device";
  if (GetParam() == SimCall::kMemUnmap || GetParam() == SimCall::kMemRelease) {
    GTEST_SKIP() << "a growth with nothing idle makes no such call (see the moving tests)";
  }
  const DevicePtr keep = Alloc(2 * kMiB);
  sim->InjectFault(GetParam(), 1, DriverResult::kOutOfMemory);
  const DevicePtr p = Alloc(6 * kMiB);  // the slow path releases what it can and retries
  EXPECT_EQ(sim->InjectedFaultCount(), 1u);
  EXPECT_EQ(Reserved(), 8 * MiB);
  EXPECT_EQ(sim->Counters().mapped_bytes, 8 * kMiB);
  ASSERT_TRUE(testing::FillPattern(*driver_, p, 6 * kMiB, 9).ok());
  ASSERT_TRUE(testing::CheckPattern(*driver_, p, 6 * kMiB, 9).ok());
  ExpectNothingLeftAfter({keep, p});
}

TEST_P(ExpandableFaultTest, AFailureWhileMovingAnIdleChunkIsUndone) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "fault injection needs the simulated device";
  if (GetParam() == SimCall::kMemRelease) GTEST_SKIP() << "a growth releases nothing";
  const DevicePtr a = Alloc(8 * kMiB);
  const DevicePtr b = Alloc(2 * kMiB);
  FreeOk(a);
  sim->InjectFault(GetParam(), 1, DriverResult::kOutOfMemory);
  const DevicePtr c = Alloc(12 * kMiB);
  EXPECT_EQ(c, b + 2 * kMiB);
  EXPECT_EQ(Reserved(), 14 * MiB);
  EXPECT_EQ(sim->Counters().mapped_bytes, 14 * kMiB);
  ASSERT_TRUE(testing::FillPattern(*driver_, c, 12 * kMiB, 4).ok());
  ASSERT_TRUE(testing::CheckPattern(*driver_, c, 12 * kMiB, 4).ok());
  ExpectNothingLeftAfter({b, c});
}

TEST_P(ExpandableFaultTest, EveryCallFailingGivesOutOfMemoryAndLeaksNothing) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "fault injection needs the simulated device";
  if (GetParam() == SimCall::kMemRelease) GTEST_SKIP() << "a growth releases nothing";
  const DevicePtr keep = Alloc(2 * kMiB);
  const DevicePtr idle = Alloc(4 * kMiB);  // between two live blocks: it can only move
  const DevicePtr keep2 = Alloc(2 * kMiB);
  FreeOk(idle);
  const SimCall calls[] = {GetParam()};
  sim->SetRandomFaults(1.0, 1, calls, DriverResult::kOutOfMemory);
  absl::StatusOr<DevicePtr> p = allocator_->Allocate(64 * kMiB);
  EXPECT_FALSE(p.ok());
  ExpectInvariants();
  const SimCounters c = sim->Counters();
  // Whatever stayed mapped is exactly what the allocator accounts as reserved.
  EXPECT_EQ(static_cast<std::int64_t>(c.mapped_bytes), Reserved());
  EXPECT_EQ(c.handle_bytes, c.mapped_bytes);  // nothing cached is left behind an out-of-memory
  EXPECT_EQ(Reserved(), GetParam() == SimCall::kMemUnmap ? 8 * MiB : 4 * MiB);
  sim->ClearFaults();
  ExpectNothingLeftAfter({keep, keep2});
}

TEST_P(ExpandableFaultTest, AFailureDuringEmptyCacheKeepsEverythingAccounted) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "fault injection needs the simulated device";
  if (GetParam() != SimCall::kMemUnmap && GetParam() != SimCall::kMemRelease) {
    GTEST_SKIP() << "a shrink makes no such call";
  }
  const DevicePtr a = Alloc(6 * kMiB);
  const DevicePtr b = Alloc(6 * kMiB);
  FreeOk(a);
  sim->InjectFault(GetParam(), 1, DriverResult::kOutOfMemory);
  absl::Status s = allocator_->EmptyCache();
  ExpectInvariants();
  const std::int64_t want = GetParam() == SimCall::kMemUnmap ? 12 * MiB : 6 * MiB;
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(Reserved(), want);
  EXPECT_EQ(static_cast<std::int64_t>(sim->Counters().mapped_bytes), want);
  ExpectNothingLeftAfter({b});
}

INSTANTIATE_TEST_SUITE_P(VmmCalls, ExpandableFaultTest,
                         ::testing::Values(SimCall::kMemCreate, SimCall::kMemMap, SimCall::kMemSetAccess,
                                           SimCall::kMemUnmap, SimCall::kMemRelease),
                         [](const ::testing::TestParamInfo<SimCall>& info) {
                           switch (info.param) {
                             case SimCall::kMemCreate:
                               return std::string("MemCreate");
                             case SimCall::kMemMap:
                               return std::string("MemMap");
                             case SimCall::kMemSetAccess:
                               return std::string("MemSetAccess");
                             case SimCall::kMemUnmap:
                               return std::string("MemUnmap");
                             default:
                               return std::string("MemRelease");
                           }
                         });

TEST_F(ExpandableSegmentsTest, HandlesLeftByAFailedMapAreReusedWithoutANewCreate) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "call counts need the simulated device";
  const DevicePtr keep = Alloc(2 * kMiB);
  // The access call fails: the new 4 MiB handle is unmapped again and cached, not released...
  sim->InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kInvalidValue);
  absl::StatusOr<DevicePtr> failed = allocator_->Allocate(4 * kMiB);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  ExpectInvariants();
  EXPECT_EQ(sim->Counters().handles, 2u);
  const std::uint64_t creates = sim->CallCount(SimCall::kMemCreate);
  // ...and the next growth maps it without creating anything.
  const DevicePtr p = Alloc(4 * kMiB);
  EXPECT_EQ(sim->CallCount(SimCall::kMemCreate), creates);
  EXPECT_EQ(p, keep + 2 * kMiB);
  ExpectNothingLeftAfter({keep, p});
}

TEST_F(ExpandableSegmentsTest, PeersGetAccessToExistingAndNewMappings) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "a peer device needs the simulated device";
  const DevicePtr a = Alloc(4 * kMiB);
  const std::uint64_t before = sim->CallCount(SimCall::kMemSetAccess);
  ASSERT_TRUE(allocator_->EnablePeerAccess(1).ok());
  EXPECT_EQ(sim->CallCount(SimCall::kMemSetAccess), before + 1);  // a's chunk
  const DevicePtr b = Alloc(4 * kMiB);
  EXPECT_EQ(sim->CallCount(SimCall::kMemSetAccess), before + 2);
  ExpectNothingLeftAfter({a, b});
}

TEST_F(ExpandableSegmentsTest, HistoryRecordsMapsAndUnmaps) {
  GRAPHALLOC_ALLOCATOR_SETUP(*Config::Parse("record_history:True"));
  const DevicePtr a = Alloc(4 * kMiB);
  FreeOk(a);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  MemorySnapshot snap = allocator_->TakeSnapshot();
  std::vector<std::pair<HistoryAction, std::uint64_t>> got;
  for (const HistoryEvent& e : snap.history) {
    if (e.action == HistoryAction::kSegmentMap || e.action == HistoryAction::kSegmentUnmap) {
      got.emplace_back(e.action, e.size);
    }
  }
  EXPECT_EQ(got, (std::vector<std::pair<HistoryAction, std::uint64_t>>{
                     {HistoryAction::kSegmentMap, 4 * kMiB}, {HistoryAction::kSegmentUnmap, 4 * kMiB}}));
  ExpectNothingLeftAfter({});
}

}  // namespace
}  // namespace graphalloc
