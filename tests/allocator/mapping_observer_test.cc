// Mapping observers and pins (CachingAllocator::AddMappingObserver / PinMapping, mapping_observer.h) on the
// simulated device: a recording observer sees every map and unmap exactly once, in order, through growth,
// moving idle chunks, EmptyCache, the release before out-of-memory, sleep and wake and pool destruction,
// checked against the device's own counts (SimCounters, call counts); pinned chunks and communication
// pools stay mapped through every release path until unpinned or destroyed; observer misuse is contained.
#include "graphalloc/allocator/core/mapping_observer.h"

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Records every call, and what is mapped by its account; a map of what is mapped already, or an unmap of
// what is not, is a violation.
class RecordingObserver : public MappingObserver {
 public:
  void OnMap(const MappingEvent& e) override {
    absl::MutexLock lock(&mu_);
    ++maps_;
    if (!live_.emplace(e.ptr, e).second) violations_.push_back("mapped twice: " + std::to_string(e.ptr));
  }
  void OnUnmap(const MappingEvent& e) override {
    absl::MutexLock lock(&mu_);
    ++unmaps_;
    auto it = live_.find(e.ptr);
    if (it == live_.end() || it->second.size != e.size) {
      violations_.push_back("unmap of what is not mapped: " + std::to_string(e.ptr));
      return;
    }
    live_.erase(it);
  }
  std::size_t maps() const {
    absl::MutexLock lock(&mu_);
    return maps_;
  }
  std::size_t unmaps() const {
    absl::MutexLock lock(&mu_);
    return unmaps_;
  }
  std::map<DevicePtr, MappingEvent> live() const {
    absl::MutexLock lock(&mu_);
    return live_;
  }
  std::size_t live_bytes() const {
    std::size_t total = 0;
    for (const auto& [ptr, e] : live()) total += e.size;
    return total;
  }
  std::vector<std::string> violations() const {
    absl::MutexLock lock(&mu_);
    return violations_;
  }

 private:
  mutable absl::Mutex mu_;
  std::size_t maps_ = 0;
  std::size_t unmaps_ = 0;
  std::map<DevicePtr, MappingEvent> live_;
  std::vector<std::string> violations_;
};

class MappingObserverTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(/*expandable=*/true); }
  void TearDown() override {
    pools_.clear();
    allocator_.reset();
    if (observer_ != nullptr) {
      // The allocator's end unmaps everything: every map was matched by one unmap.
      EXPECT_TRUE(observer_->live().empty());
      EXPECT_TRUE(observer_->violations().empty());
    }
  }

  void Make(bool expandable, SimDriverOptions options = {}) {
    pools_.clear();
    allocator_.reset();
    absl::StatusOr<std::unique_ptr<SimDriver>> sim = SimDriver::Create(options);
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = std::shared_ptr<SimDriver>(std::move(*sim));
    Config config;
    config.expandable_segments = expandable;
    absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(sim_, config);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = std::move(*allocator);
    observer_ = std::make_shared<RecordingObserver>();
    ASSERT_OK(allocator_->AddMappingObserver(observer_));
  }

  DevicePtr Alloc(std::size_t bytes) {
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    ExpectConsistent();
    return p.ok() ? *p : 0;
  }
  void Free(DevicePtr p) {
    EXPECT_OK(allocator_->Free(p));
    ExpectConsistent();
  }
  void EmptyCache() {
    EXPECT_OK(allocator_->EmptyCache());
    ExpectConsistent();
  }
  std::size_t Reserved() const {
    return static_cast<std::size_t>(allocator_->GetStats().reserved_bytes.all().current);
  }

  // The observer's account equals the device's: every mapping and plain allocation the device holds, and
  // one map call per driver map (or allocation) that succeeded, one unmap per driver unmap (or free) tried,
  // and a map again for each unmap the device refused.
  void ExpectConsistent() {
    EXPECT_OK(allocator_->CheckInvariants());
    const SimCounters c = sim_->Counters();
    EXPECT_EQ(observer_->live().size(), c.mappings + c.allocations);
    EXPECT_EQ(observer_->live_bytes(), c.mapped_bytes + c.allocated_bytes);
    EXPECT_EQ(observer_->maps(), sim_->CallCount(SimCall::kMemMap) + sim_->CallCount(SimCall::kMemAlloc) -
                                     refused_maps_ + refused_unmaps_);
    EXPECT_EQ(observer_->unmaps(), sim_->CallCount(SimCall::kMemUnmap) + sim_->CallCount(SimCall::kMemFree));
    EXPECT_EQ(observer_->maps() - observer_->unmaps(), observer_->live().size());
    EXPECT_TRUE(observer_->violations().empty()) << observer_->violations().front();
  }

  PrivatePool& NewPool(PoolOptions options = {}) {
    absl::StatusOr<PrivatePool> pool = allocator_->CreatePool(std::move(options));
    EXPECT_TRUE(pool.ok()) << pool.status();
    pools_.push_back(*std::move(pool));
    return pools_.back();
  }
  DevicePtr AllocIn(const PrivatePool& pool, std::size_t bytes) {
    absl::StatusOr<PoolRoute> route =
        allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread());
    EXPECT_TRUE(route.ok()) << route.status();
    return Alloc(bytes);
  }
  // The observer's live mappings of `pool`.
  std::size_t LiveOf(PoolId pool) const {
    std::size_t n = 0;
    for (const auto& [ptr, e] : observer_->live()) n += e.pool == pool ? 1 : 0;
    return n;
  }
  PoolStats StatsOf(PoolId id) {
    absl::StatusOr<PoolStats> stats = allocator_->GetPoolStats(id);
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? *stats : PoolStats{};
  }

  std::shared_ptr<SimDriver> sim_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::shared_ptr<RecordingObserver> observer_;
  std::uint64_t refused_maps_ = 0;  // driver maps (or allocations) the device refused, which map nothing
  // Driver unmaps the device refused: each was reported, and then reported mapped again.
  std::uint64_t refused_unmaps_ = 0;
  std::vector<PrivatePool> pools_;
};

TEST_F(MappingObserverTest, EveryMapAndUnmapOfExpandableSegmentsIsReportedOnce) {
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(6 * kMiB);
  const DevicePtr c = Alloc(1000);
  ASSERT_EQ(observer_->maps(), sim_->CallCount(SimCall::kMemMap));
  ASSERT_GE(observer_->maps(), 3u);
  // Reported before the block was handed out: the mapping holds it.
  for (DevicePtr p : {a, b, c}) {
    auto live = observer_->live();
    auto it = live.upper_bound(p);
    ASSERT_NE(it, live.begin());
    --it;
    EXPECT_LT(p - it->first, it->second.size);
    EXPECT_TRUE(it->second.expandable);
    EXPECT_EQ(it->second.pool, kDefaultPool);
    EXPECT_EQ(it->second.device, 0);
    EXPECT_NE(static_cast<std::uint64_t>(it->second.handle), 0u);
  }
  Free(a);
  Free(b);
  EmptyCache();
  EXPECT_EQ(observer_->live_bytes(), Reserved());
  Free(c);
  EmptyCache();
  EXPECT_EQ(observer_->live().size(), 0u);
  EXPECT_EQ(observer_->maps(), observer_->unmaps());
}

TEST_F(MappingObserverTest, RegularSegmentsAreReportedWithoutHandle) {
  Make(/*expandable=*/false);
  const DevicePtr a = Alloc(3 * kMiB);
  ASSERT_EQ(observer_->live().size(), 1u);
  const MappingEvent e = observer_->live().begin()->second;
  EXPECT_FALSE(e.expandable);
  EXPECT_EQ(static_cast<std::uint64_t>(e.handle), 0u);
  EXPECT_EQ(e.ptr, a);
  EXPECT_EQ(e.size, Reserved());
  Free(a);
  EmptyCache();
  EXPECT_EQ(observer_->unmaps(), 1u);
  EXPECT_EQ(observer_->live().size(), 0u);
}

TEST_F(MappingObserverTest, GrowthMovingIdleChunksReportsTheirUnmapAndNewMap) {
  // Under a limit of 8 MiB a growth of 6 MiB past 6 MiB in use must move the idle chunks.
  allocator_->SetMemoryLimit(8 * kMiB);
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(2 * kMiB);
  const DevicePtr c = Alloc(2 * kMiB);
  Free(a);
  Free(b);
  const std::uint64_t unmaps_before = sim_->CallCount(SimCall::kMemUnmap);
  const DevicePtr d = Alloc(6 * kMiB);
  EXPECT_GT(sim_->CallCount(SimCall::kMemUnmap), unmaps_before);  // idle chunks moved
  EXPECT_EQ(observer_->live_bytes(), Reserved());
  Free(c);
  Free(d);
  EmptyCache();
  EXPECT_EQ(observer_->live().size(), 0u);
}

TEST_F(MappingObserverTest, ReleaseBeforeOutOfMemoryReportsTheUnmapsItMakes) {
  SimDriverOptions options;
  options.capacity = 48 * kMiB;
  Make(/*expandable=*/false, options);
  const DevicePtr a = Alloc(12 * kMiB);
  const DevicePtr b = Alloc(12 * kMiB);
  Free(a);
  Free(b);
  // 30 MiB does not fit beside the cached 24: the device refuses, both go back, reported, and the retry
  // succeeds.
  absl::StatusOr<DevicePtr> c = allocator_->Allocate(30 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(sim_->CallCount(SimCall::kMemAlloc), 4u);
  refused_maps_ = 1;
  ExpectConsistent();
  EXPECT_EQ(observer_->unmaps(), 2u);
  EXPECT_EQ(observer_->live().size(), 1u);
  Free(*c);
}

TEST_F(MappingObserverTest, AnUnmapTheDeviceRefusesIsReportedMappedAgain) {
  const DevicePtr a = Alloc(2 * kMiB);
  Free(a);
  sim_->InjectFault(SimCall::kMemUnmap, 1, DriverResult::kInvalidValue);
  EXPECT_FALSE(allocator_->EmptyCache().ok());
  refused_unmaps_ = 1;
  ExpectConsistent();
  EXPECT_EQ(observer_->unmaps(), 1u);
  EXPECT_EQ(observer_->maps(), 2u);
  EXPECT_EQ(observer_->live().count(a), 1u);  // still mapped, and told so
  EXPECT_EQ(Reserved(), 2 * kMiB);
  EmptyCache();  // the device unmaps it now
  EXPECT_EQ(observer_->live().size(), 0u);
}

TEST_F(MappingObserverTest, SleepAndWakeReportEveryChunk) {
  PoolOptions options;
  options.tag = "weights";
  PrivatePool& pool = NewPool(options);
  const DevicePtr p = AllocIn(pool, 4 * kMiB);
  const DevicePtr q = Alloc(2 * kMiB);  // the default pool's, awake throughout
  const std::size_t mapped = LiveOf(pool.id());
  ASSERT_GE(mapped, 1u);
  SleepRequest sleep;
  sleep.scope = SleepScope::Tag("weights");
  ASSERT_OK(allocator_->Sleep(sleep).status());
  ExpectConsistent();
  EXPECT_EQ(LiveOf(pool.id()), 0u);
  EXPECT_EQ(LiveOf(kDefaultPool), 1u);
  WakeRequest wake;
  wake.scope = SleepScope::Tag("weights");
  ASSERT_OK(allocator_->Wake(wake).status());
  ExpectConsistent();
  EXPECT_EQ(LiveOf(pool.id()), mapped);
  Free(q);
  EXPECT_EQ(observer_->live().count(p), 1u);
  EXPECT_EQ(observer_->live().at(p).pool, pool.id());
  Free(p);
}

TEST_F(MappingObserverTest, DestroyingAPoolReportsItsUnmaps) {
  PrivatePool& pool = NewPool();
  const PoolId id = pool.id();
  const DevicePtr p = AllocIn(pool, 2 * kMiB);
  EXPECT_EQ(observer_->live().at(p).pool, id);
  Free(p);
  pools_.clear();  // the last user goes: the pool returns its memory
  ExpectConsistent();
  EXPECT_EQ(observer_->live().size(), 0u);
}

TEST_F(MappingObserverTest, ALateObserverIsToldWhatIsMappedAlready) {
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);
  auto late = std::make_shared<RecordingObserver>();
  ASSERT_OK(allocator_->AddMappingObserver(late, /*replay_existing=*/true));
  EXPECT_EQ(late->live().size(), observer_->live().size());
  EXPECT_EQ(late->live_bytes(), Reserved());
  auto quiet = std::make_shared<RecordingObserver>();
  ASSERT_OK(allocator_->AddMappingObserver(quiet, /*replay_existing=*/false));
  EXPECT_EQ(quiet->maps(), 0u);
  EXPECT_TRUE(absl::IsAlreadyExists(allocator_->AddMappingObserver(late)));
  Free(a);
  Free(b);
  EmptyCache();
  EXPECT_EQ(late->live().size(), 0u);
  EXPECT_TRUE(late->violations().empty());
  ASSERT_OK(allocator_->RemoveMappingObserver(late.get()));
  ASSERT_OK(allocator_->RemoveMappingObserver(quiet.get()));
  EXPECT_TRUE(absl::IsNotFound(allocator_->RemoveMappingObserver(late.get())));
  const std::size_t late_maps = late->maps();
  Free(Alloc(2 * kMiB));
  EXPECT_EQ(late->maps(), late_maps);  // removed: told nothing more
}

class ThrowingObserver : public MappingObserver {
 public:
  void OnMap(const MappingEvent&) override { throw std::runtime_error("registration refused"); }
  void OnUnmap(const MappingEvent&) override { throw 7; }
};

TEST_F(MappingObserverTest, AnObserverThatThrowsLeavesTheAllocatorIntact) {
  auto bad = std::make_shared<ThrowingObserver>();
  ASSERT_OK(allocator_->AddMappingObserver(bad));
  const DevicePtr a = Alloc(2 * kMiB);
  Free(a);
  EmptyCache();
  const MappingObserverErrors errors = allocator_->GetMappingObserverErrors();
  EXPECT_EQ(errors.count, 2u);
  EXPECT_NE(errors.last.find("OnUnmap threw"), std::string::npos) << errors.last;
  EXPECT_NE(errors.last.find("observers must not throw"), std::string::npos) << errors.last;
  // The other observer was told of both.
  EXPECT_EQ(observer_->maps(), 1u);
  EXPECT_EQ(observer_->unmaps(), 1u);
  ASSERT_OK(allocator_->RemoveMappingObserver(bad.get()));
}

TEST_F(MappingObserverTest, APinnedChunkSurvivesEmptyCacheUntilUnpinned) {
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(2 * kMiB);
  ASSERT_OK(allocator_->PinMapping(a + 4096, 512));  // one byte pins the whole chunk
  ASSERT_OK(allocator_->PinMapping(a + 4096, 512));  // counted
  Free(a);
  Free(b);
  EmptyCache();
  EXPECT_EQ(Reserved(), 2 * kMiB);
  ASSERT_EQ(observer_->live().size(), 1u);
  EXPECT_EQ(observer_->live().begin()->first, a);
  ASSERT_OK(allocator_->UnpinMapping(a + 4096, 512));
  EmptyCache();
  EXPECT_EQ(Reserved(), 2 * kMiB);  // pinned once more
  ASSERT_OK(allocator_->UnpinMapping(a + 4096, 512));
  EXPECT_TRUE(absl::IsNotFound(allocator_->UnpinMapping(a + 4096, 512)));
  EmptyCache();
  EXPECT_EQ(Reserved(), 0u);
  EXPECT_EQ(observer_->live().size(), 0u);
}

TEST_F(MappingObserverTest, APinnedChunkSurvivesTheReleaseBeforeOutOfMemory) {
  SimDriverOptions options;
  options.capacity = 8 * kMiB;
  Make(/*expandable=*/true, options);
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(2 * kMiB);
  ASSERT_OK(allocator_->PinMapping(a, 2 * kMiB));
  Free(a);
  // 6 MiB fits only once a's chunk goes (unmapped, or moved under the request), which the pin forbids.
  absl::StatusOr<DevicePtr> big = allocator_->Allocate(6 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  ExpectConsistent();
  EXPECT_EQ(Reserved(), 4 * kMiB);
  EXPECT_EQ(observer_->live().count(a), 1u);
  ASSERT_OK(allocator_->UnpinMapping(a, 2 * kMiB));
  Free(Alloc(6 * kMiB));
  Free(b);
}

TEST_F(MappingObserverTest, APinnedRegularSegmentSurvivesEmptyCache) {
  Make(/*expandable=*/false);
  const DevicePtr a = Alloc(3 * kMiB);
  const std::size_t segment = Reserved();
  ASSERT_GT(segment, 0u);
  ASSERT_OK(allocator_->PinMapping(a, 1));
  Free(a);
  EmptyCache();
  EXPECT_EQ(Reserved(), segment);
  ASSERT_OK(allocator_->UnpinMapping(a, 1));
  EmptyCache();
  EXPECT_EQ(Reserved(), 0u);
}

TEST_F(MappingObserverTest, PinningMemoryOfNoSegmentIsAnError) {
  const DevicePtr a = Alloc(2 * kMiB);
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->PinMapping(a, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->PinMapping(4096, 4096)));
  Free(a);
}

TEST_F(MappingObserverTest, APoolHoldingAPinnedChunkCannotSleep) {
  PoolOptions options;
  options.tag = "kv";
  PrivatePool& pool = NewPool(options);
  const DevicePtr p = AllocIn(pool, 2 * kMiB);
  ASSERT_OK(allocator_->PinMapping(p, 2 * kMiB));
  EXPECT_EQ(StatsOf(pool.id()).pinned_bytes, 2 * kMiB);
  SleepRequest sleep;
  sleep.scope = SleepScope::Pool(pool.id());
  absl::Status s = allocator_->Sleep(sleep).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("pinned by PinMapping"), std::string::npos) << s;
  EXPECT_NE(s.message().find(absl::StrFormat("0x%x", p)), std::string::npos) << s;
  ExpectConsistent();
  EXPECT_FALSE(StatsOf(pool.id()).asleep);
  ASSERT_OK(allocator_->UnpinMapping(p, 2 * kMiB));
  ASSERT_OK(allocator_->Sleep(sleep).status());
  WakeRequest wake;
  wake.scope = SleepScope::Pool(pool.id());
  ASSERT_OK(allocator_->Wake(wake).status());
  Free(p);
}

TEST_F(MappingObserverTest, ACommunicationPoolStaysMappedUntilItIsDestroyed) {
  PoolOptions options;
  options.communication = true;
  PrivatePool& pool = NewPool(options);
  const PoolId id = pool.id();
  const DevicePtr a = AllocIn(pool, 2 * kMiB);
  const DevicePtr b = AllocIn(pool, 4 * kMiB);
  Free(a);
  Free(b);
  const std::size_t maps = observer_->maps();
  EmptyCache();
  ASSERT_OK(allocator_->EmptyPoolCache(id));
  ExpectConsistent();
  EXPECT_EQ(observer_->unmaps(), 0u);
  EXPECT_EQ(StatsOf(id).reserved_bytes, 6 * kMiB);
  EXPECT_EQ(StatsOf(id).pinned_bytes, 6 * kMiB);
  // Reused in place: registered once.
  const DevicePtr c = AllocIn(pool, 6 * kMiB);
  EXPECT_EQ(observer_->maps(), maps);
  Free(c);
  SleepRequest sleep;
  sleep.scope = SleepScope::Pool(id);
  absl::Status s = allocator_->Sleep(sleep).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("communication pools do not sleep"), std::string::npos) << s;
  pools_.clear();  // destroyed: now it goes
  ExpectConsistent();
  EXPECT_EQ(observer_->live().size(), 0u);
  EXPECT_EQ(Reserved(), 0u);
}

}  // namespace
}  // namespace graphalloc
