// Private pools on the simulated device and (label `gpu`) the real one: use counts, routing by stream,
// capture and thread, nesting, per-pool statistics and cache release, graph pins, use_on_oom, no_split,
// and the capture rules (allocations and frees inside a capture, cross-stream frees deferred, no event
// queries, a failed capture releasing its route).
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using testing::AllocatorFixture;
using testing::AsSim;

Config RegularSegments() {
  Config c;
  c.expandable_segments = false;
  return c;
}

class PrivatePoolTest : public AllocatorFixture {
 protected:
  PoolStats PoolStatsOf(const PrivatePool& pool) {
    absl::StatusOr<PoolStats> s = allocator_->GetPoolStats(pool.id());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : PoolStats{};
  }
  std::int64_t Reserved() const { return Stats().reserved_bytes.all().current; }
  // `bytes` allocated in `pool` (through a route of the calling thread, open for this allocation only).
  DevicePtr AllocInPool(const PrivatePool& pool, std::size_t bytes) {
    absl::StatusOr<PoolRoute> route =
        allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread());
    EXPECT_TRUE(route.ok()) << route.status();
    return route.ok() ? Alloc(bytes) : 0;
  }
  std::vector<std::uint8_t> Read(DevicePtr p, std::size_t n) {
    std::vector<std::uint8_t> out(n);
    EXPECT_TRUE(driver_->CopyDeviceToHost(out.data(), p, n).ok());
    return out;
  }
};

TEST_F(PrivatePoolTest, UseCountFollowsHandlesExactly) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  EXPECT_EQ(PoolStatsOf(pool).use_count, 1);
  {
    PrivatePool copy = pool;
    EXPECT_EQ(PoolStatsOf(pool).use_count, 2);
    ASSERT_OK_AND_ASSIGN(PrivatePool by_id, allocator_->AcquirePool(pool.id()));
    EXPECT_EQ(PoolStatsOf(pool).use_count, 3);
    PrivatePool moved = std::move(by_id);
    EXPECT_EQ(PoolStatsOf(pool).use_count, 3);
  }
  EXPECT_EQ(PoolStatsOf(pool).use_count, 1);
  const PoolId id = pool.id();
  pool.Reset();
  EXPECT_TRUE(absl::IsNotFound(allocator_->GetPoolStats(id).status()));
  EXPECT_TRUE(absl::IsNotFound(allocator_->AcquirePool(id).status()));
}

TEST_F(PrivatePoolTest, PoolOfAllocationNamesTheLiveAllocationsPoolAndNothingElse) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  const DevicePtr in_pool = AllocInPool(pool, 4096);
  const DevicePtr outside = Alloc(4096);
  ASSERT_OK_AND_ASSIGN(const PoolId owner, allocator_->PoolOfAllocation(in_pool));
  EXPECT_EQ(owner, pool.id());
  ASSERT_OK_AND_ASSIGN(const PoolId default_owner, allocator_->PoolOfAllocation(outside));
  EXPECT_EQ(default_owner, kDefaultPool);
  EXPECT_TRUE(absl::IsNotFound(allocator_->PoolOfAllocation(in_pool + 512).status()))
      << "not a block's start";
  EXPECT_TRUE(absl::IsNotFound(allocator_->PoolOfAllocation(0).status()));
  ASSERT_OK(allocator_->Free(in_pool));
  EXPECT_TRUE(absl::IsNotFound(allocator_->PoolOfAllocation(in_pool).status())) << "freed";
  ASSERT_OK(allocator_->Free(outside));
  ASSERT_OK(allocator_->CheckInvariants());
}

TEST_F(PrivatePoolTest, StreamRouteSendsOnlyThatStreamToThePool) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s1 = NewStream();
  const Stream s2 = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  DevicePtr in_pool = 0, outside = 0;
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForStream(s1)));
    EXPECT_EQ(PoolStatsOf(pool).use_count, 2);  // the route is a user
    in_pool = Alloc(3 * kMiB, s1);
    outside = Alloc(3 * kMiB, s2);
  }
  EXPECT_EQ(PoolStatsOf(pool).use_count, 1);
  const PoolStats ps = PoolStatsOf(pool);
  EXPECT_EQ(ps.allocated_bytes, 3 * kMiB);
  EXPECT_EQ(ps.live_blocks, 1u);
  EXPECT_EQ(Stats().allocated_bytes.all().current, static_cast<std::int64_t>(6 * kMiB));
  // Outside the route the same stream allocates from the default pool again.
  const DevicePtr after = Alloc(3 * kMiB, s1);
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 1u);
  for (DevicePtr p : {in_pool, outside, after}) FreeOk(p);
  EXPECT_EQ(PoolStatsOf(pool).allocated_bytes, 0u);
  EXPECT_EQ(PoolStatsOf(pool).peak_allocated_bytes, 3 * kMiB);
}

TEST_F(PrivatePoolTest, ThreadRouteSendsOnlyTheCallingThreadToThePool) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
  const DevicePtr mine = Alloc(4096);
  DevicePtr theirs = 0;
  std::thread other([&] {
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(4096);
    if (p.ok()) theirs = *p;
  });
  other.join();
  ASSERT_NE(theirs, 0u);
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 1u);
  EXPECT_EQ(PoolStatsOf(pool).allocated_bytes, 4096u);
  FreeOk(mine);
  FreeOk(theirs);
  ASSERT_OK(route.End());
  ExpectInvariants();
}

TEST_F(PrivatePoolTest, RoutesNestAndTheInnermostWins) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool outer, allocator_->CreatePool());
  ASSERT_OK_AND_ASSIGN(PrivatePool inner, allocator_->CreatePool());
  ASSERT_OK_AND_ASSIGN(PoolRoute r1,
                       allocator_->BeginAllocateToPool(outer, PoolRouteFilter::ForCallingThread()));
  const DevicePtr a = Alloc(1024, s);
  ASSERT_OK_AND_ASSIGN(PoolRoute r2, allocator_->BeginAllocateToPool(inner, PoolRouteFilter::ForStream(s)));
  const DevicePtr b = Alloc(1024, s);
  const DevicePtr c = Alloc(1024, kDefaultStream);  // the inner route does not match: the outer does
  ASSERT_OK(r2.End());
  const DevicePtr d = Alloc(1024, s);
  ASSERT_OK(r1.End());
  const DevicePtr e = Alloc(1024, s);
  EXPECT_EQ(PoolStatsOf(outer).live_blocks, 3u);  // a, c, d
  EXPECT_EQ(PoolStatsOf(inner).live_blocks, 1u);  // b
  EXPECT_EQ(Stats().allocation.all().current, 5);
  for (DevicePtr p : {a, b, c, d, e}) FreeOk(p);
}

TEST_F(PrivatePoolTest, MemoryGoesBackOnlyWithNoUsersAndNoLiveBlocks) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  const PoolId id = pool.id();
  const DevicePtr p = AllocInPool(pool, 12 * kMiB);
  EXPECT_EQ(Reserved(), static_cast<std::int64_t>(12 * kMiB));
  // The default pool's EmptyCache leaves a pool with users alone.
  ASSERT_OK(allocator_->EmptyCache());
  EXPECT_EQ(Reserved(), static_cast<std::int64_t>(12 * kMiB));
  pool.Reset();  // no users, one live block: the pool waits for it
  ASSERT_OK_AND_ASSIGN(PoolStats waiting, allocator_->GetPoolStats(id));
  EXPECT_EQ(waiting.use_count, 0);
  EXPECT_EQ(waiting.reserved_bytes, 12 * kMiB);
  ExpectInvariants();
  FreeOk(p);  // the last block: the pool's memory goes back and the pool with it
  EXPECT_EQ(Reserved(), 0);
  EXPECT_TRUE(absl::IsNotFound(allocator_->GetPoolStats(id).status()));
  EXPECT_EQ(Stats().num_device_free, 1);
  ExpectInvariants();
}

// The free of an orphaned pool's last block succeeds even when the device then refuses to take the pool's
// memory back: the block is gone (a second free is a double free), and EmptyCache returns the memory later.
// (Free used to return the release's error after freeing the block, telling its caller it was still theirs.)
TEST_F(PrivatePoolTest, LastFreeOfAnOrphanedPoolSucceedsWhenItsMemoryCannotGoBackYet) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "fault injection needs the simulated device";
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  const PoolId id = pool.id();
  const DevicePtr p = AllocInPool(pool, 12 * kMiB);
  pool.Reset();  // no users, one live block
  sim->InjectFault(SimCall::kMemFree, 1, DriverResult::kUnknown);
  ASSERT_OK(allocator_->Free(p));
  EXPECT_EQ(sim->InjectedFaultCount(), 1u);
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->Free(p)));
  EXPECT_EQ(Stats().allocation.all().current, 0);
  EXPECT_EQ(Reserved(), static_cast<std::int64_t>(12 * kMiB));  // still cached for the orphaned pool
  ExpectInvariants();
  ASSERT_OK(allocator_->EmptyCache());
  EXPECT_EQ(Reserved(), 0);
  EXPECT_TRUE(absl::IsNotFound(allocator_->GetPoolStats(id).status()));
  ExpectInvariants();
}

TEST_F(PrivatePoolTest, PerPoolStatsAndEmptyPoolCacheTouchOnlyThatPool) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  const DevicePtr d = Alloc(12 * kMiB);  // the default pool's
  FreeOk(d);
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
    const DevicePtr a = Alloc(12 * kMiB);
    const DevicePtr b = Alloc(14 * kMiB);
    const PoolStats ps = PoolStatsOf(pool);
    EXPECT_EQ(ps.reserved_bytes, 26 * kMiB);
    EXPECT_EQ(ps.allocated_bytes, 26 * kMiB);
    EXPECT_EQ(ps.segments, 2u);
    FreeOk(a);
    FreeOk(b);
  }
  const MemorySnapshot snap = allocator_->TakeSnapshot();
  ASSERT_EQ(snap.pools.size(), 2u);
  EXPECT_EQ(snap.pools[1].id, pool.id());
  EXPECT_EQ(snap.pools[1].reserved_bytes, 26 * kMiB);
  EXPECT_EQ(snap.pools[1].use_count, 1);
  std::size_t in_pool = 0;
  for (const SegmentSnapshot& seg : snap.segments) in_pool += seg.pool_id == pool.id() ? 1 : 0;
  EXPECT_EQ(in_pool, 2u);
  ASSERT_OK(allocator_->EmptyPoolCache(pool.id()));
  const PoolStats ps = PoolStatsOf(pool);
  EXPECT_EQ(ps.reserved_bytes, 0u);
  EXPECT_EQ(ps.peak_reserved_bytes, 26 * kMiB);
  EXPECT_EQ(ps.peak_allocated_bytes, 26 * kMiB);
  EXPECT_EQ(ps.segments, 0u);
  EXPECT_EQ(Reserved(), static_cast<std::int64_t>(12 * kMiB));  // the default pool's cache stays
  ExpectInvariants();
}

TEST_F(PrivatePoolTest, GraphPinKeepsThePoolsMemoryThroughEveryRelease) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
    FreeOk(Alloc(6 * kMiB));
  }
  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pool));
  const PoolId id = pool.id();
  pool.Reset();  // only the pin is left
  ASSERT_OK(allocator_->EmptyPoolCache(id));
  ASSERT_OK(allocator_->EmptyCache());
  ASSERT_OK_AND_ASSIGN(PoolStats ps, allocator_->GetPoolStats(id));
  EXPECT_EQ(ps.reserved_bytes, 6 * kMiB);
  EXPECT_EQ(ps.graph_pins, 1);
  pin.Reset();  // the graph is gone: so is the pool
  EXPECT_TRUE(absl::IsNotFound(allocator_->GetPoolStats(id).status()));
  EXPECT_EQ(Reserved(), 0);
  ExpectInvariants();
}

TEST_F(PrivatePoolTest, UseOnOomLetsTheDefaultPoolTakeCachedBlocks) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  ASSERT_OK_AND_ASSIGN(PrivatePool lender, allocator_->CreatePool({.use_on_oom = true}));
  ASSERT_OK_AND_ASSIGN(PrivatePool keeper, allocator_->CreatePool());
  for (PrivatePool* pool : {&lender, &keeper}) {
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(*pool, PoolRouteFilter::ForCallingThread()));
    FreeOk(Alloc(20 * kMiB));
  }
  allocator_->SetMemoryLimit(40 * kMiB);  // both pools hold it all: the default pool cannot grow
  const DevicePtr borrowed = Alloc(20 * kMiB);
  ASSERT_NE(borrowed, 0u);
  EXPECT_EQ(PoolStatsOf(lender).live_blocks, 1u);
  EXPECT_EQ(PoolStatsOf(keeper).live_blocks, 0u);
  EXPECT_TRUE(absl::IsResourceExhausted(allocator_->Allocate(20 * kMiB).status()));  // keeper does not lend
  FreeOk(borrowed);  // back into the lender's cache
  EXPECT_EQ(PoolStatsOf(lender).reserved_bytes, 20 * kMiB);
  EXPECT_EQ(PoolStatsOf(lender).live_blocks, 0u);
  ExpectInvariants();
}

TEST_F(PrivatePoolTest, UseOnOomTurnedOffStopsTheLending) {
  GRAPHALLOC_ALLOCATOR_SETUP(RegularSegments());
  ASSERT_OK_AND_ASSIGN(PrivatePool lender, allocator_->CreatePool({.use_on_oom = true}));
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(lender, PoolRouteFilter::ForCallingThread()));
    FreeOk(Alloc(20 * kMiB));
  }
  allocator_->SetMemoryLimit(20 * kMiB);  // the lender holds it all
  ASSERT_OK(allocator_->SetPoolUseOnOom(lender.id(), false));
  EXPECT_TRUE(absl::IsResourceExhausted(allocator_->Allocate(20 * kMiB).status()));
  EXPECT_EQ(PoolStatsOf(lender).live_blocks, 0u);
  ASSERT_OK(allocator_->SetPoolUseOnOom(lender.id(), true));
  const DevicePtr borrowed = Alloc(20 * kMiB);
  EXPECT_EQ(PoolStatsOf(lender).live_blocks, 1u);
  FreeOk(borrowed);
  EXPECT_TRUE(absl::IsNotFound(allocator_->SetPoolUseOnOom(lender.id() + 100, true)));
  ExpectInvariants();
}

// A segment source over the device's own allocations, counting what it hands out and gets back.
class CountingSource : public SegmentSource {
 public:
  explicit CountingSource(Driver& driver) : driver_(driver) {}
  absl::StatusOr<DevicePtr> Allocate(std::size_t bytes, Stream) override {
    if (refuse) return absl::ResourceExhaustedError("source is full");
    absl::StatusOr<DevicePtr> p = driver_.MemAlloc(bytes);
    if (p.ok()) allocated.push_back({*p, bytes});
    return p;
  }
  absl::Status Free(DevicePtr ptr, std::size_t bytes, Stream) override {
    freed.push_back({ptr, bytes});
    return driver_.MemFree(ptr);
  }
  std::string Name() const override { return "counting"; }

  bool refuse = false;
  std::vector<std::pair<DevicePtr, std::size_t>> allocated, freed;

 private:
  Driver& driver_;
};

TEST_F(PrivatePoolTest, SegmentSourceServesThePoolsSegmentsAndGetsThemBack) {
  GRAPHALLOC_ALLOCATOR_SETUP();  // expandable segments on: the sourced pool still uses regular segments
  auto source = std::make_shared<CountingSource>(allocator_->driver());
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool({}, source));
  DevicePtr a = 0, b = 0;
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
    a = Alloc(kMiB);
    b = Alloc(kMiB);  // the same 2 MiB segment, split
  }
  const DevicePtr outside = Alloc(kMiB);  // the default pool: not from the source
  ASSERT_EQ(source->allocated.size(), 1u);
  EXPECT_EQ(source->allocated[0].second, 2 * kMiB);
  EXPECT_EQ(a, source->allocated[0].first);
  EXPECT_EQ(b, a + kMiB);
  for (const SegmentSnapshot& seg : allocator_->TakeSnapshot().segments) {
    if (seg.pool_id == pool.id()) {
      EXPECT_FALSE(seg.expandable);
    }
  }
  FreeOk(a);
  FreeOk(b);
  ExpectInvariants();
  EXPECT_TRUE(source->freed.empty());  // cached until emptied, as any pool's memory
  ASSERT_OK(allocator_->EmptyPoolCache(pool.id()));
  ASSERT_EQ(source->freed.size(), 1u);
  EXPECT_EQ(source->freed[0], source->allocated[0]);
  source->refuse = true;
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
    EXPECT_TRUE(absl::IsResourceExhausted(allocator_->Allocate(kMiB).status()));
  }
  FreeOk(outside);
  ExpectInvariants();
}

TEST_F(PrivatePoolTest, NoSplitGivesEveryBlockASegmentOfItsOwn) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool({.no_split = true}));
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
  const DevicePtr a = Alloc(3 * kMiB);
  const DevicePtr b = Alloc(512);
  MemorySnapshot snap = allocator_->TakeSnapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  for (const SegmentSnapshot& seg : snap.segments) {
    EXPECT_EQ(seg.blocks.size(), 1u) << "a block was split";
    EXPECT_FALSE(seg.expandable);
  }
  EXPECT_EQ(PoolStatsOf(pool).reserved_bytes, 4 * kMiB + 2 * kMiB);
  FreeOk(a);
  FreeOk(b);
}

TEST_F(PrivatePoolTest, PoolsCreatedAndReleasedOnManyThreadsReuseShardsSafely) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  constexpr int kThreads = 4;
  constexpr int kRounds = 150;
  std::vector<Stream> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(NewStream());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        absl::StatusOr<PrivatePool> pool = allocator_->CreatePool();
        if (!pool.ok()) {
          ++failures;
          return;
        }
        absl::StatusOr<PoolRoute> route =
            allocator_->BeginAllocateToPool(*pool, PoolRouteFilter::ForCallingThread());
        std::vector<DevicePtr> live;
        for (int i = 0; route.ok() && i < 4; ++i) {
          absl::StatusOr<DevicePtr> p = allocator_->Allocate(static_cast<std::size_t>(4096 << i), streams[t]);
          if (!p.ok()) break;
          live.push_back(*p);
        }
        if (live.size() != 4) ++failures;
        absl::StatusOr<PoolStats> stats = allocator_->GetPoolStats(pool->id());
        if (!stats.ok() || stats->live_blocks != 4) ++failures;
        if (route.ok() && !route->End().ok()) ++failures;
        pool->Reset();  // the pool waits for its blocks, then goes with the last one
        for (DevicePtr p : live) {
          if (!allocator_->Free(p).ok()) ++failures;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ExpectInvariants();
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);  // every pool gone, with its memory
  EXPECT_EQ(allocator_->TakeSnapshot().pools.size(), 1u);
}

// ---- Captures. ----

class PoolCaptureTest : public PrivatePoolTest {};

TEST_F(PoolCaptureTest, CaptureAllocatesFreesAndReusesInThePoolAndReplays) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  const Stream joined = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  ASSERT_OK_AND_ASSIGN(Event fork, driver_->EventCreate());
  ASSERT_OK_AND_ASSIGN(Event join, driver_->EventCreate());
  constexpr std::size_t kBytes = 1 << 20;
  const DevicePtr outside_before = Alloc(kBytes, joined);
  ASSERT_OK(driver_->BeginCapture(s, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCaptureOf(s)));
  // A fresh pool: its first segment is allocated during the (global-mode) capture.
  ASSERT_OK_AND_ASSIGN(const DevicePtr out, allocator_->Allocate(kBytes, s));
  ASSERT_OK_AND_ASSIGN(const DevicePtr scratch, allocator_->Allocate(kBytes, s));
  ASSERT_OK(driver_->MemsetAsync(scratch, 0x5a, kBytes, s));
  ASSERT_OK(driver_->CopyAsync(out, scratch, kBytes, s));
  ASSERT_OK(allocator_->Free(scratch));  // freed inside the capture, reused inside it
  ASSERT_OK_AND_ASSIGN(const DevicePtr again, allocator_->Allocate(kBytes, s));
  EXPECT_EQ(again, scratch);
  // A stream joined into the capture allocates from the pool too.
  ASSERT_OK(driver_->EventRecord(fork, s));
  ASSERT_OK(driver_->StreamWaitEvent(joined, fork));
  ASSERT_OK_AND_ASSIGN(const DevicePtr side, allocator_->Allocate(kBytes, joined));
  ASSERT_OK(driver_->MemsetAsync(side, 0x11, kBytes, joined));
  ASSERT_OK(driver_->EventRecord(join, joined));
  ASSERT_OK(driver_->StreamWaitEvent(s, join));
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver_->EndCapture(s));
  ASSERT_OK(route.End());
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 3u);  // out, again, side
  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pool));
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, driver_->GraphInstantiate(graph));
  ASSERT_OK(driver_->GraphLaunch(exec, s));
  ASSERT_OK(driver_->StreamSynchronize(s));
  EXPECT_EQ(Read(out, kBytes), std::vector<std::uint8_t>(kBytes, 0x5a));
  EXPECT_EQ(Read(side, kBytes), std::vector<std::uint8_t>(kBytes, 0x11));
  // An allocation on a stream outside the capture never went to the pool.
  EXPECT_EQ(PoolStatsOf(pool).allocated_bytes, 3 * kBytes);
  ASSERT_OK(driver_->GraphExecDestroy(exec));
  ASSERT_OK(driver_->GraphDestroy(graph));
  for (DevicePtr p : {out, again, side, outside_before}) FreeOk(p);
  ASSERT_OK(driver_->EventDestroy(fork));
  ASSERT_OK(driver_->EventDestroy(join));
}

TEST_F(PoolCaptureTest, CrossStreamFreeDuringCaptureWaitsForTheRouteToEnd) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  const Stream other = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  // Made before the capture: a pool block also used on `other`.
  DevicePtr shared = 0;
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute warm,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForStream(s)));
    shared = Alloc(kMiB, s);
  }
  ASSERT_OK(allocator_->RecordStream(shared, other));
  ASSERT_OK(driver_->BeginCapture(s, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCaptureOf(s)));
  ASSERT_OK(allocator_->Free(shared));
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 1u);  // deferred: no event recorded into the capture
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->Free(shared)));  // still refused twice
  ASSERT_OK_AND_ASSIGN(const DevicePtr fresh, allocator_->Allocate(kMiB, s));
  EXPECT_NE(fresh, shared);                                         // not reusable yet
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver_->EndCapture(s));  // the capture stayed valid
  ASSERT_OK(route.End());                                           // the free records its event now
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 1u);                     // only `fresh`
  ASSERT_OK(driver_->StreamSynchronize(other));
  ASSERT_OK(allocator_->EmptyCache());  // completes the event; the pool (with users) keeps its memory
  ASSERT_OK_AND_ASSIGN(PoolRoute again, allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForStream(s)));
  ASSERT_OK_AND_ASSIGN(const DevicePtr reused, allocator_->Allocate(kMiB, s));
  EXPECT_EQ(reused, shared);
  ASSERT_OK(again.End());
  FreeOk(fresh);
  FreeOk(reused);
  ASSERT_OK(driver_->GraphDestroy(graph));
}

TEST_F(PoolCaptureTest, NoEventIsQueriedWhileACaptureIsRouted) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  const Stream other = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  // A default-pool block of `s` waiting on an event: the next allocation on `s` would query it.
  const DevicePtr waiting = Alloc(kMiB, s);
  ASSERT_OK(allocator_->RecordStream(waiting, other));
  FreeOk(waiting);
  ASSERT_OK(driver_->BeginCapture(s, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCaptureOf(s)));
  ASSERT_OK_AND_ASSIGN(const DevicePtr p, allocator_->Allocate(kMiB, s));
  ASSERT_OK_AND_ASSIGN(const DevicePtr q, allocator_->Allocate(kMiB, other));  // default pool, same rule
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->EmptyCache()));
  ASSERT_OK_AND_ASSIGN(const Graph graph, driver_->EndCapture(s));  // a query would have invalidated it
  ASSERT_OK(route.End());
  ASSERT_OK(driver_->GraphDestroy(graph));
  FreeOk(p);
  FreeOk(q);
}

TEST_F(PoolCaptureTest, FailedCaptureReleasesRouteAndUseCount) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  DevicePtr p = 0;
  {
    ASSERT_OK(driver_->BeginCapture(s, CaptureMode::kGlobal));
    ASSERT_OK_AND_ASSIGN(PoolRoute route,
                         allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCaptureOf(s)));
    ASSERT_OK_AND_ASSIGN(p, allocator_->Allocate(kMiB, s));
    EXPECT_EQ(PoolStatsOf(pool).use_count, 2);
    // Synchronizing a capturing stream is illegal: CUDA invalidates the capture.
    EXPECT_FALSE(driver_->StreamSynchronize(s).ok());
    EXPECT_FALSE(driver_->EndCapture(s).ok());
  }  // the route ends with the failed capture's scope
  EXPECT_EQ(PoolStatsOf(pool).use_count, 1);
  const Stream t = NewStream();
  const DevicePtr d = Alloc(kMiB, t);  // not routed any more
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 1u);
  FreeOk(d);
  FreeOk(p);
  ExpectInvariants();
}

TEST_F(PoolCaptureTest, RouteForAStreamThatIsNotCapturingIsRefused) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCaptureOf(s)).status()));
  EXPECT_EQ(PoolStatsOf(pool).use_count, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(
      allocator_->BeginAllocateToPool(PrivatePool(), PoolRouteFilter::ForStream(s)).status()));
}

// Captures `fill` of `value` into a fresh allocation of the pool; returns the graph and the output.
struct Captured {
  Graph graph{};
  GraphExec exec{};
  DevicePtr out = 0;
  DevicePtr scratch = 0;
};

class PoolGraphTest : public PrivatePoolTest {
 protected:
  // Captures: scratch = value; out = scratch; scratch freed inside the capture (the pool reuses it later).
  Captured CaptureCopy(const PrivatePool& pool, Stream s, std::uint8_t value, std::size_t bytes) {
    Captured c;
    EXPECT_OK(driver_->BeginCapture(s, CaptureMode::kGlobal));
    absl::StatusOr<PoolRoute> route = allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCaptureOf(s));
    EXPECT_TRUE(route.ok()) << route.status();
    absl::StatusOr<DevicePtr> out = allocator_->Allocate(bytes, s);
    absl::StatusOr<DevicePtr> scratch = allocator_->Allocate(bytes, s);
    EXPECT_TRUE(out.ok() && scratch.ok());
    c.out = *out;
    c.scratch = *scratch;
    EXPECT_OK(driver_->MemsetAsync(c.scratch, value, bytes, s));
    EXPECT_OK(driver_->CopyAsync(c.out, c.scratch, bytes, s));
    EXPECT_OK(allocator_->Free(c.scratch));
    absl::StatusOr<Graph> graph = driver_->EndCapture(s);
    EXPECT_TRUE(graph.ok()) << graph.status();
    EXPECT_OK(route->End());
    c.graph = *graph;
    absl::StatusOr<GraphExec> exec = driver_->GraphInstantiate(c.graph);
    EXPECT_TRUE(exec.ok()) << exec.status();
    c.exec = *exec;
    return c;
  }
  void Destroy(const Captured& c) {
    EXPECT_OK(driver_->GraphExecDestroy(c.exec));
    EXPECT_OK(driver_->GraphDestroy(c.graph));
  }
};

TEST_F(PoolGraphTest, TwoGraphsSharingAPoolReplayInCaptureOrder) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  constexpr std::size_t kBytes = 2 << 20;
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pool));
  const Captured g1 = CaptureCopy(pool, s, 0x21, kBytes);
  const Captured g2 = CaptureCopy(pool, s, 0x42, kBytes);
  // g2 reused the scratch block g1 freed during its capture: sharing saves memory, and is why graphs
  // sharing a pool must replay in capture order.
  EXPECT_EQ(g2.out, g1.scratch);
  EXPECT_EQ(PoolStatsOf(pool).live_blocks, 2u);
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_OK(driver_->GraphLaunch(g1.exec, s));
    ASSERT_OK(driver_->GraphLaunch(g2.exec, s));
    ASSERT_OK(driver_->StreamSynchronize(s));
    EXPECT_EQ(Read(g1.out, kBytes), std::vector<std::uint8_t>(kBytes, 0x21));
    EXPECT_EQ(Read(g2.out, kBytes), std::vector<std::uint8_t>(kBytes, 0x42));
  }
  Destroy(g1);
  Destroy(g2);
  FreeOk(g1.out);
  FreeOk(g2.out);
}

TEST_F(PoolGraphTest, RestoreThenNewCaptureReusesTheRestoredFreeBlocks) {
  GRAPHALLOC_ALLOCATOR_SETUP();
  const Stream s = NewStream();
  constexpr std::size_t kBytes = 2 << 20;
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pool));
  const Captured a = CaptureCopy(pool, s, 0x0a, kBytes);
  ASSERT_OK_AND_ASSIGN(const PoolCheckpoint after_a, allocator_->Checkpoint(pool));
  const Captured b = CaptureCopy(pool, s, 0x0b, kBytes);  // a branch: A then B
  ASSERT_OK_AND_ASSIGN(const RestoreResult r, allocator_->Restore(pool, after_a));
  EXPECT_EQ(r.freed, std::vector<DevicePtr>{b.out});  // B's output is not part of A's state
  EXPECT_TRUE(r.created.empty());
  const Captured c = CaptureCopy(pool, s, 0x0c, kBytes);  // the other branch: A then C
  EXPECT_EQ(c.out, b.out);                                // the restored free blocks serve the new capture
  EXPECT_EQ(c.scratch, b.scratch);
  ASSERT_OK(driver_->GraphLaunch(a.exec, s));
  ASSERT_OK(driver_->GraphLaunch(c.exec, s));
  ASSERT_OK(driver_->StreamSynchronize(s));
  EXPECT_EQ(Read(a.out, kBytes), std::vector<std::uint8_t>(kBytes, 0x0a));
  EXPECT_EQ(Read(c.out, kBytes), std::vector<std::uint8_t>(kBytes, 0x0c));
  for (const Captured* g : {&a, &b, &c}) Destroy(*g);
  FreeOk(a.out);
  FreeOk(c.out);
  ExpectInvariants();
}

}  // namespace
}  // namespace graphalloc
